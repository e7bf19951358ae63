/*
 * test_epd_router_registry.c — the router's registry and its policies
 * (router/epd_router_registry.c), as a pure data structure: states and
 * their transitions on heartbeats and silence, and which worker each
 * policy picks — round robin, least load, prefix affinity (KV-aware:
 * expected cached tokens against queued ones, rendezvous hashing for cold
 * prompts, decode-side reuse within a slack), the hint sets, the avoid
 * list of retries, and the free-block check before a decode worker is
 * chosen.
 *
 * The registry asks the request-plane client only whether a worker's
 * endpoint is healthy (epd_client_worker_state); this test links the
 * registry alone and answers that itself, so endpoints can fail on demand.
 */
#include <stdio.h>
#include <string.h>

#include "epd_test.h"

#include "epd_alloc.h"
#include "epd_client.h"
#include "epd_router_registry.h"

/* The client's worker handle, as far as the registry can see it. */
struct epd_client_worker {
    epd_status_t state;
};

epd_status_t epd_client_worker_state(const epd_client_worker_t *w)
{
    return w->state;
}

#define MS 1000000ull
#define MAX_W 8

typedef struct {
    epd_router_registry_t reg;
    struct epd_client_worker cw[MAX_W];
    epd_router_worker_t *w[MAX_W];
    int n;
} fx_t;

static epd_router_worker_t *fx_add(fx_t *f, const char *id, int role, uint64_t now)
{
    epd_client_worker_info_t info;
    epd_router_worker_t *w;

    assert_true(f->n < MAX_W);
    memset(&info, 0, sizeof(info));
    snprintf(info.worker_id, sizeof(info.worker_id), "%s", id);
    info.role = role;
    info.block_tokens = 16;
    info.kv_blocks_total = 1000;
    info.kv_blocks_free = 1000;
    info.max_batch = 8;
    w = epd_router_registry_add(&f->reg, &info, now);
    assert_non_null(w);
    f->cw[f->n].state = EPD_OK;
    w->cw = &f->cw[f->n];
    f->w[f->n++] = w;
    return w;
}

static void fx_init(fx_t *f, epd_router_policy_t policy)
{
    memset(f, 0, sizeof(*f));
    epd_router_registry_init(&f->reg, policy, 1000);
}

static epd_router_worker_t *pick(fx_t *f, int role, const uint32_t *prompt, uint32_t n)
{
    return epd_router_registry_pick(&f->reg, role, prompt, n, NULL, 0);
}

/* A prompt of n tokens made from seed. */
static void prompt_of(uint32_t seed, uint32_t *p, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        p[i] = (seed * 2654435761u + i * 40503u) % 256;
    }
}

static void test_policy_names(void **state)
{
    epd_router_policy_t p;

    (void)state;
    assert_int_equal(epd_router_policy_parse("round-robin", &p), EPD_OK);
    assert_int_equal(p, EPD_ROUTER_POLICY_ROUND_ROBIN);
    assert_int_equal(epd_router_policy_parse("least-load", &p), EPD_OK);
    assert_int_equal(p, EPD_ROUTER_POLICY_LEAST_LOAD);
    assert_int_equal(epd_router_policy_parse("prefix-affinity", &p), EPD_OK);
    assert_int_equal(p, EPD_ROUTER_POLICY_PREFIX_AFFINITY);
    assert_int_equal(epd_router_policy_parse("random", &p), EPD_ERR_INVALID_PARAM);
    assert_string_equal(epd_router_policy_name(EPD_ROUTER_POLICY_PREFIX_AFFINITY),
                        "prefix-affinity");
}

/* Round robin cycles over the eligible workers of a role only. */
static void test_round_robin(void **state)
{
    fx_t f;
    int seen[3] = {0};

    (void)state;
    fx_init(&f, EPD_ROUTER_POLICY_ROUND_ROBIN);
    fx_add(&f, "p0", EPD_CLIENT_ROLE_PREFILL, 0);
    fx_add(&f, "p1", EPD_CLIENT_ROLE_PREFILL, 0);
    fx_add(&f, "p2", EPD_CLIENT_ROLE_PREFILL, 0);
    fx_add(&f, "d0", EPD_CLIENT_ROLE_DECODE, 0);
    for (int i = 0; i < 30; i++) {
        epd_router_worker_t *w = pick(&f, EPD_CLIENT_ROLE_PREFILL, NULL, 0);

        assert_non_null(w);
        assert_int_equal(w->info.role, EPD_CLIENT_ROLE_PREFILL);
        seen[w->info.worker_id[1] - '0']++;
    }
    assert_int_equal(seen[0], 10);
    assert_int_equal(seen[1], 10);
    assert_int_equal(seen[2], 10);
    /* a draining one and one whose endpoint failed get nothing */
    f.w[1]->state = EPD_ROUTER_DRAINING;
    f.cw[2].state = EPD_ERR_PEER_DEAD;
    for (int i = 0; i < 10; i++) {
        assert_ptr_equal(pick(&f, EPD_CLIENT_ROLE_PREFILL, NULL, 0), f.w[0]);
    }
    assert_ptr_equal(pick(&f, EPD_CLIENT_ROLE_DECODE, NULL, 0), f.w[3]);
    epd_router_registry_cleanup(&f.reg);
}

/* Least load: decode by in-flight requests per batch slot, then used KV
 * blocks; prefill by queued prompt tokens. */
static void test_least_load(void **state)
{
    fx_t f;
    epd_router_worker_t *d0, *d1, *p0, *p1;

    (void)state;
    fx_init(&f, EPD_ROUTER_POLICY_LEAST_LOAD);
    d0 = fx_add(&f, "d0", EPD_CLIENT_ROLE_DECODE, 0);
    d1 = fx_add(&f, "d1", EPD_CLIENT_ROLE_DECODE, 0);
    p0 = fx_add(&f, "p0", EPD_CLIENT_ROLE_PREFILL, 0);
    p1 = fx_add(&f, "p1", EPD_CLIENT_ROLE_PREFILL, 0);
    d0->inflight = 3;
    d1->inflight = 1;
    assert_ptr_equal(pick(&f, EPD_CLIENT_ROLE_DECODE, NULL, 0), d1);
    /* same batch use: the one with more free KV blocks */
    d0->inflight = 1;
    d0->hb_kv_blocks_free = 900;
    d1->hb_kv_blocks_free = 100;
    assert_ptr_equal(pick(&f, EPD_CLIENT_ROLE_DECODE, NULL, 0), d0);
    /* a bigger batch per request in flight weighs less */
    d0->inflight = 2;
    d0->info.max_batch = 64;
    d1->inflight = 1;
    d1->info.max_batch = 8;
    assert_ptr_equal(pick(&f, EPD_CLIENT_ROLE_DECODE, NULL, 0), d0);
    p0->queued_tokens = 5000;
    p1->queued_tokens = 100;
    assert_ptr_equal(pick(&f, EPD_CLIENT_ROLE_PREFILL, NULL, 0), p1);
    p1->hb_queued_tokens = 10000; /* its heartbeat says it is behind */
    assert_ptr_equal(pick(&f, EPD_CLIENT_ROLE_PREFILL, NULL, 0), p0);
    epd_router_registry_cleanup(&f.reg);
}

/* The free-block check (proto/README.md rule 30): a decode worker gets a
 * request only when its last reported free blocks, less those of requests
 * sent since, hold the request's admission — prompt + headroom when it
 * grows KV on demand, prompt + max_new up front — and never when its whole
 * pool could not hold prompt + max_new; "all full" (wait) is told apart
 * from "none could ever" (fail). */
static void test_room_for_decode(void **state)
{
    fx_t f;
    epd_router_worker_t *d0, *d1, *got;
    epd_router_fit_t fit = {.n_prompt = 100, .max_new = 200};
    int full = -1;

    (void)state;
    fx_init(&f, EPD_ROUTER_POLICY_LEAST_LOAD);
    d0 = fx_add(&f, "d0", EPD_CLIENT_ROLE_DECODE, 0);
    d0->info.kv_headroom_tokens = 16; /* on demand: ceil(116 / 16) = 8 blocks */
    d0->hb_kv_blocks_free = 8;
    assert_int_equal(epd_router_decode_blocks(d0, &fit), 8);
    assert_true(epd_router_has_room(d0, &fit));
    d0->kv_pending = 1; /* a request sent since its heartbeat */
    assert_false(epd_router_has_room(d0, &fit));
    got = epd_router_registry_pick_room(&f.reg, EPD_CLIENT_ROLE_DECODE, NULL, &fit, NULL, 0,
                                        &full);
    assert_null(got);
    assert_int_equal(full, 1); /* a worker, full now: the request waits */
    /* up front: prompt + max_new = 300 tokens, 19 blocks */
    d1 = fx_add(&f, "d1", EPD_CLIENT_ROLE_DECODE, 0);
    d1->hb_kv_blocks_free = 18;
    assert_int_equal(epd_router_decode_blocks(d1, &fit), 19);
    assert_false(epd_router_has_room(d1, &fit));
    d1->hb_kv_blocks_free = 19;
    assert_ptr_equal(epd_router_registry_pick_room(&f.reg, EPD_CLIENT_ROLE_DECODE, NULL, &fit,
                                                   NULL, 0, &full),
                     d1);
    assert_int_equal(full, 0);
    /* refused for room: nothing more until its next heartbeat */
    d1->cap_refused = 1;
    assert_false(epd_router_has_room(d1, &fit));
    d1->cap_refused = 0;
    /* pools that could never hold 300 tokens (18 blocks) are not "full" */
    d0->info.kv_blocks_total = 18;
    d1->info.kv_blocks_total = 18;
    d0->kv_pending = 0;
    d0->hb_kv_blocks_free = 18;
    assert_false(epd_router_has_room(d0, &fit));
    assert_null(epd_router_registry_pick_room(&f.reg, EPD_CLIENT_ROLE_DECODE, NULL, &fit, NULL,
                                              0, &full));
    assert_int_equal(full, 0);
    epd_router_registry_cleanup(&f.reg);
}

/* Prefix affinity: a prompt always goes to the same prefill worker (its
 * first KV block decides), distinct prompts spread, and removing a worker
 * moves only the prompts that were on it (consistent hashing). */
static void test_prefix_affinity(void **state)
{
    fx_t f;
    uint32_t p[64];
    epd_router_worker_t *first[200];
    int per[3] = {0};

    (void)state;
    fx_init(&f, EPD_ROUTER_POLICY_PREFIX_AFFINITY);
    fx_add(&f, "prefill-a", EPD_CLIENT_ROLE_PREFILL, 0);
    fx_add(&f, "prefill-b", EPD_CLIENT_ROLE_PREFILL, 0);
    fx_add(&f, "prefill-c", EPD_CLIENT_ROLE_PREFILL, 0);
    for (uint32_t s = 0; s < 200; s++) {
        prompt_of(s, p, 64);
        first[s] = pick(&f, EPD_CLIENT_ROLE_PREFILL, p, 64);
        assert_non_null(first[s]);
        for (int i = 0; i < 3; i++) {
            per[i] += first[s] == f.w[i];
        }
        /* the same first block, another tail: the same worker */
        p[40] ^= 1;
        assert_ptr_equal(pick(&f, EPD_CLIENT_ROLE_PREFILL, p, 64), first[s]);
    }
    for (int i = 0; i < 3; i++) {
        assert_true(per[i] > 30); /* about 67 each */
    }
    /* a heartbeat's queued tokens count only where they are others' (the
     * worker reports this router's apart): a heartbeat read while one of
     * this router's prompts was queued but arriving after its first token
     * does not make the worker look busy, and the router's own count and
     * the heartbeat's are one backlog, not two */
    for (uint32_t s = 0; s < 200; s++) {
        epd_router_worker_t *w0 = first[s], *other = f.w[w0 == f.w[0] ? 1 : 0];

        prompt_of(s, p, 64);
        w0->hb_queued_tokens = 64; /* someone else's */
        assert_ptr_not_equal(pick(&f, EPD_CLIENT_ROLE_PREFILL, p, 64), w0);
        w0->hb_router_queued_tokens = 64; /* ours, seen leave since */
        assert_ptr_equal(pick(&f, EPD_CLIENT_ROLE_PREFILL, p, 64), w0);
        w0->queued_tokens = 64; /* ours, still queued: seen by both */
        for (int i = 0; i < 3; i++) {
            if (f.w[i] != w0) {
                f.w[i]->queued_tokens = 100;
            }
        }
        assert_ptr_equal(pick(&f, EPD_CLIENT_ROLE_PREFILL, p, 64), w0); /* 64 < 100 */
        other->queued_tokens = 0;
        for (int i = 0; i < 3; i++) {
            f.w[i]->queued_tokens = 0;
            f.w[i]->hb_queued_tokens = 0;
            f.w[i]->hb_router_queued_tokens = 0;
        }
    }
    /* prefill-b leaves: only its prompts move */
    f.w[1]->state = EPD_ROUTER_DEAD;
    for (uint32_t s = 0; s < 200; s++) {
        epd_router_worker_t *w;

        prompt_of(s, p, 64);
        w = pick(&f, EPD_CLIENT_ROLE_PREFILL, p, 64);
        if (first[s] != f.w[1]) {
            assert_ptr_equal(w, first[s]);
        } else {
            assert_true(w == f.w[0] || w == f.w[2]);
        }
    }
    /* decode under prefix affinity: least load */
    fx_add(&f, "decode-a", EPD_CLIENT_ROLE_DECODE, 0)->inflight = 4;
    fx_add(&f, "decode-b", EPD_CLIENT_ROLE_DECODE, 0);
    assert_ptr_equal(pick(&f, EPD_CLIENT_ROLE_DECODE, p, 64), f.w[4]);
    epd_router_registry_cleanup(&f.reg);
}

/* A worker speaking the router's namespace, with a hint set. */
static void kv_worker(epd_router_worker_t *w, const unsigned char *root)
{
    memcpy(w->prefix_root, root, 32);
    w->has_root = 1;
    assert_int_equal(epd_router_hints_create(w->info.kv_blocks_total, &w->hints), EPD_OK);
}

static void probe_of(epd_router_probe_t *pp, const unsigned char *root, const uint32_t *p,
                     uint32_t n, uint64_t *hints, uint32_t cap)
{
    memset(pp, 0, sizeof(*pp));
    pp->root = pp->plain = root;
    pp->block_tokens = 16;
    pp->tokens = p;
    pp->n_tokens = n;
    pp->hints = hints;
    pp->cap = cap;
}

/* KV-aware prefill: the least expected cost, queued tokens + the tokens a
 * worker would compute (prompt - cached); hints of another namespace count
 * for nothing; the router's own expectation after a dispatch counts. */
static void test_kv_aware_prefill(void **state)
{
    fx_t f;
    uint32_t p[64];
    uint64_t hints[4];
    unsigned char root[32], other[32];
    epd_router_probe_t pp;
    epd_router_worker_t *a, *b;

    (void)state;
    memset(root, 7, sizeof(root));
    memset(other, 8, sizeof(other));
    fx_init(&f, EPD_ROUTER_POLICY_PREFIX_AFFINITY);
    a = fx_add(&f, "prefill-a", EPD_CLIENT_ROLE_PREFILL, 0);
    b = fx_add(&f, "prefill-b", EPD_CLIENT_ROLE_PREFILL, 0);
    kv_worker(a, root);
    kv_worker(b, root);
    prompt_of(3, p, 64);
    probe_of(&pp, root, p, 64, hints, 4);
    /* a holds the first three blocks (48 tokens) */
    for (uint32_t i = 0; i < 3; i++) {
        epd_router_hints_apply(a->hints, epd_router_probe_hint(&pp, i) | 1);
    }
    assert_int_equal(epd_router_cached_blocks(a, &pp), 3);
    assert_int_equal(epd_router_cached_blocks(b, &pp), 0);
    a->queued_tokens = 40; /* cost 40 + 16 = 56 against 64 */
    assert_ptr_equal(epd_router_registry_pick_kv(&f.reg, EPD_CLIENT_ROLE_PREFILL, &pp, p, 64, NULL,
                                                 NULL, 0), a);
    a->queued_tokens = 49; /* 65 against 64: the saving no longer pays for the wait */
    assert_ptr_equal(epd_router_registry_pick_kv(&f.reg, EPD_CLIENT_ROLE_PREFILL, &pp, p, 64, NULL,
                                                 NULL, 0), b);
    /* its second block evicted: only one block counts */
    a->queued_tokens = 20;
    epd_router_hints_apply(a->hints, epd_router_probe_hint(&pp, 1) & ~1ull);
    assert_int_equal(epd_router_cached_blocks(a, &pp), 1);
    assert_ptr_equal(epd_router_registry_pick_kv(&f.reg, EPD_CLIENT_ROLE_PREFILL, &pp, p, 64, NULL,
                                                 NULL, 0), b); /* 20 + 48 > 64 */
    /* another namespace (model, layout): its hints are not ours */
    a->queued_tokens = 0;
    memcpy(a->prefix_root, other, 32);
    assert_int_equal(epd_router_cached_blocks(a, &pp), 0);
    memcpy(a->prefix_root, root, 32);
    /* the router sent b the whole prompt: b holds its four blocks now */
    epd_router_hints_expect(b, &pp, UINT32_MAX);
    assert_int_equal(epd_router_cached_blocks(b, &pp), 4);
    assert_ptr_equal(epd_router_registry_pick_kv(&f.reg, EPD_CLIENT_ROLE_PREFILL, &pp, p, 64, NULL,
                                                 NULL, 0), b);
    /* a worker's reset forgets them */
    epd_router_hints_clear(b->hints);
    assert_int_equal(epd_router_cached_blocks(b, &pp), 0);
    epd_router_registry_cleanup(&f.reg);
}

/* KV-aware decode: least load, unless a worker holding the prompt's blocks
 * is within EPD_ROUTER_DECODE_SLACK of it. */
static void test_kv_aware_decode(void **state)
{
    fx_t f;
    uint32_t p[48];
    uint64_t hints[3];
    unsigned char root[32];
    epd_router_probe_t pp;
    epd_router_worker_t *d0, *d1;

    (void)state;
    memset(root, 9, sizeof(root));
    fx_init(&f, EPD_ROUTER_POLICY_PREFIX_AFFINITY);
    d0 = fx_add(&f, "decode-0", EPD_CLIENT_ROLE_DECODE, 0);
    d1 = fx_add(&f, "decode-1", EPD_CLIENT_ROLE_DECODE, 0);
    kv_worker(d0, root);
    kv_worker(d1, root);
    prompt_of(5, p, 48);
    probe_of(&pp, root, p, 48, hints, 3);
    epd_router_hints_expect(d0, &pp, 2); /* decode: not the last position's block */
    assert_int_equal(epd_router_cached_blocks(d0, &pp), 2);
    d0->inflight = 2; /* a quarter of its batch of 8: at the slack */
    assert_ptr_equal(epd_router_registry_pick_kv(&f.reg, EPD_CLIENT_ROLE_DECODE, &pp, p, 48, NULL,
                                                 NULL, 0), d0);
    d0->inflight = 3; /* beyond it */
    assert_ptr_equal(epd_router_registry_pick_kv(&f.reg, EPD_CLIENT_ROLE_DECODE, &pp, p, 48, NULL,
                                                 NULL, 0), d1);
    /* room first (rule 30): a holder without room for the request loses it */
    {
        epd_router_fit_t fit = {.n_prompt = 48, .max_new = 100}; /* up front: 10 blocks */
        int full = -1;

        d0->inflight = 2;
        d0->hb_kv_blocks_free = 9;
        d1->hb_kv_blocks_free = 10;
        assert_ptr_equal(epd_router_registry_pick_kv(&f.reg, EPD_CLIENT_ROLE_DECODE, &pp, p, 48,
                                                     &fit, NULL, 0),
                         d1);
        assert_ptr_equal(epd_router_registry_pick_room_kv(&f.reg, EPD_CLIENT_ROLE_DECODE, &pp, p,
                                                          &fit, NULL, 0, &full),
                         d1);
        assert_int_equal(full, 0);
        d1->hb_kv_blocks_free = 9; /* nobody has room: the request waits */
        assert_null(epd_router_registry_pick_room_kv(&f.reg, EPD_CLIENT_ROLE_DECODE, &pp, p, &fit,
                                                     NULL, 0, &full));
        assert_int_equal(full, 1);
        d0->hb_kv_blocks_free = 10; /* room again: the holder */
        assert_ptr_equal(epd_router_registry_pick_kv(&f.reg, EPD_CLIENT_ROLE_DECODE, &pp, p, 48,
                                                     &fit, NULL, 0),
                         d0);
        d0->hb_kv_blocks_free = 1000;
        d1->hb_kv_blocks_free = 1000;
    }
    /* without a probe (other policies' callers): least load */
    d0->inflight = 0;
    d1->inflight = 0;
    assert_non_null(epd_router_registry_pick(&f.reg, EPD_CLIENT_ROLE_DECODE, p, 48, NULL, 0));
    epd_router_registry_cleanup(&f.reg);
}

/* The hint set: collisions, backward-shift deletion, clearing when more
 * than the worker can hold arrive. */
static void test_hint_set(void **state)
{
    epd_router_hints_t *h;

    (void)state;
    assert_int_equal(epd_router_hints_create(8, &h), EPD_OK);
    /* four hints in one probe run (the same low bits), then remove the
     * first: the others must still be found */
    for (uint64_t i = 1; i <= 4; i++) {
        epd_router_hints_apply(h, (i << 40) | 0x10 | 1);
    }
    assert_int_equal(epd_router_hints_count(h), 4);
    epd_router_hints_apply(h, (1ull << 40) | 0x10);
    assert_false(epd_router_hints_has(h, (1ull << 40) | 0x10));
    for (uint64_t i = 2; i <= 4; i++) {
        assert_true(epd_router_hints_has(h, (i << 40) | 0x10));
    }
    epd_router_hints_apply(h, (9ull << 40) | 0x10); /* not there: nothing */
    assert_int_equal(epd_router_hints_count(h), 3);
    epd_router_hints_add(h, 0); /* 0 is stored too */
    assert_true(epd_router_hints_has(h, 0));
    for (uint64_t i = 0; i < 4; i++) {
        epd_router_hints_add(h, (100 + i) << 8);
    }
    assert_int_equal(epd_router_hints_count(h), 8);
    epd_router_hints_add(h, 7ull << 50); /* a ninth: stale ones, start afresh */
    assert_int_equal(epd_router_hints_count(h), 1);
    assert_true(epd_router_hints_has(h, 7ull << 50));
    epd_router_hints_destroy(h);
    epd_router_hints_destroy(NULL);
}

/* Retries avoid the workers already tried, unless nothing else is left. */
static void test_avoid_list(void **state)
{
    fx_t f;
    epd_router_worker_t *avoid[1];

    (void)state;
    fx_init(&f, EPD_ROUTER_POLICY_LEAST_LOAD);
    fx_add(&f, "d0", EPD_CLIENT_ROLE_DECODE, 0);
    fx_add(&f, "d1", EPD_CLIENT_ROLE_DECODE, 0)->inflight = 5;
    avoid[0] = f.w[0];
    assert_ptr_equal(epd_router_registry_pick(&f.reg, EPD_CLIENT_ROLE_DECODE, NULL, 0, avoid, 1),
                     f.w[1]);
    f.w[1]->state = EPD_ROUTER_DRAINING;
    assert_ptr_equal(epd_router_registry_pick(&f.reg, EPD_CLIENT_ROLE_DECODE, NULL, 0, avoid, 1),
                     f.w[0]);
    f.w[0]->state = EPD_ROUTER_SUSPECT;
    assert_null(epd_router_registry_pick(&f.reg, EPD_CLIENT_ROLE_DECODE, NULL, 0, avoid, 1));
    assert_null(pick(&f, EPD_CLIENT_ROLE_PREFILL, NULL, 0));
    epd_router_registry_cleanup(&f.reg);
}

/* A worker a peer reported unreachable (killed: its endpoints here not
 * failed yet) gets no new work until it heartbeats after the report; the
 * registry tells whether a (maybe stale) pointer is still one of its
 * entries. */
static void test_unreachable_until_heartbeat(void **state)
{
    fx_t f;
    epd_router_worker_t *d0, *d1, stranger;

    (void)state;
    fx_init(&f, EPD_ROUTER_POLICY_LEAST_LOAD);
    d0 = fx_add(&f, "d0", EPD_CLIENT_ROLE_DECODE, 10 * MS);
    d1 = fx_add(&f, "d1", EPD_CLIENT_ROLE_DECODE, 10 * MS);
    d1->inflight = 5; /* least-load prefers d0 */
    assert_ptr_equal(pick(&f, EPD_CLIENT_ROLE_DECODE, NULL, 0), d0);
    d0->unreachable_ns = 20 * MS;
    assert_ptr_equal(pick(&f, EPD_CLIENT_ROLE_DECODE, NULL, 0), d1);
    d1->unreachable_ns = 20 * MS;
    assert_null(pick(&f, EPD_CLIENT_ROLE_DECODE, NULL, 0));
    d0->last_hb_ns = 30 * MS; /* a heartbeat after the report: alive */
    assert_ptr_equal(pick(&f, EPD_CLIENT_ROLE_DECODE, NULL, 0), d0);
    assert_true(epd_router_registry_has(&f.reg, d0));
    assert_true(epd_router_registry_has(&f.reg, d1));
    assert_false(epd_router_registry_has(&f.reg, &stranger));
    epd_router_registry_cleanup(&f.reg);
}

/* States over time: silence makes a worker SUSPECT, a heartbeat brings it
 * back (DRAINING when it drains, asked by the router or by itself), a
 * failed endpoint makes it DEAD, and DEAD entries without references are
 * freed after the grace period. */
static void test_tick_states(void **state)
{
    fx_t f;
    uint32_t counts[EPD_ROUTER_POOLS][5];
    uint32_t died = 0;
    epd_router_worker_t *a, *b, *c;

    (void)state;
    fx_init(&f, EPD_ROUTER_POLICY_LEAST_LOAD);
    a = fx_add(&f, "a", EPD_CLIENT_ROLE_PREFILL, 0);
    b = fx_add(&f, "b", EPD_CLIENT_ROLE_PREFILL, 0);
    c = fx_add(&f, "c", EPD_CLIENT_ROLE_DECODE, 0);
    epd_router_registry_tick(&f.reg, 500 * MS, &died);
    assert_int_equal(a->state, EPD_ROUTER_READY);
    assert_int_equal(died, 0);
    /* a and b heartbeat, c goes silent */
    a->last_hb_ns = b->last_hb_ns = 1400 * MS;
    epd_router_registry_tick(&f.reg, 1500 * MS, &died);
    assert_int_equal(a->state, EPD_ROUTER_READY);
    assert_int_equal(c->state, EPD_ROUTER_SUSPECT);
    assert_null(pick(&f, EPD_CLIENT_ROLE_DECODE, NULL, 0));
    /* c comes back; b goes silent while it drains by itself */
    c->last_hb_ns = 2000 * MS;
    b->self_draining = 1;
    epd_router_registry_tick(&f.reg, 2500 * MS, &died);
    assert_int_equal(c->state, EPD_ROUTER_READY);
    assert_int_equal(b->state, EPD_ROUTER_SUSPECT);
    b->last_hb_ns = 2600 * MS;
    a->last_hb_ns = 2600 * MS;
    epd_router_registry_tick(&f.reg, 2700 * MS, &died);
    assert_int_equal(b->state, EPD_ROUTER_DRAINING);
    /* a's endpoint fails */
    f.cw[0].state = EPD_ERR_PEER_DEAD;
    epd_router_registry_tick(&f.reg, 2800 * MS, &died);
    assert_int_equal(died, 1);
    assert_int_equal(a->state, EPD_ROUTER_DEAD);
    assert_null(epd_router_registry_find(&f.reg, "a"));
    epd_router_registry_counts(&f.reg, counts);
    assert_int_equal(counts[0][EPD_ROUTER_DEAD], 1);
    assert_int_equal(counts[0][EPD_ROUTER_DRAINING], 1);
    assert_int_equal(counts[1][EPD_ROUTER_READY], 1);
    /* a referenced DEAD entry stays; unreferenced, it goes after 30 s */
    epd_router_worker_ref(a);
    epd_router_registry_tick(&f.reg, 60000 * MS, &died);
    epd_router_registry_counts(&f.reg, counts);
    assert_int_equal(counts[0][EPD_ROUTER_DEAD], 1);
    epd_router_worker_unref(a);
    epd_router_registry_tick(&f.reg, 60001 * MS, &died);
    epd_router_registry_counts(&f.reg, counts);
    assert_int_equal(counts[0][EPD_ROUTER_DEAD], 0);
    epd_router_registry_cleanup(&f.reg);
}

/* Encoders are a pool of their own, picked by least load (in-flight images
 * per slot) whatever the policy; prefill workers keep an LRU mirror of
 * their embedding cache as big as their embed_slots. */
static void test_encoders_and_cache_hints(void **state)
{
    fx_t f;
    epd_router_worker_t *e0, *e1, *p;
    unsigned char h[5][32];
    uint32_t counts[EPD_ROUTER_POOLS][5];

    (void)state;
    fx_init(&f, EPD_ROUTER_POLICY_ROUND_ROBIN);
    e0 = fx_add(&f, "enc-0", EPD_CLIENT_ROLE_ENCODER, 0);
    e1 = fx_add(&f, "enc-1", EPD_CLIENT_ROLE_ENCODER, 0);
    e0->info.embed_slots = e1->info.embed_slots = 4;
    e0->inflight = 2;
    for (int i = 0; i < 4; i++) {
        assert_ptr_equal(pick(&f, EPD_CLIENT_ROLE_ENCODER, NULL, 0), e1);
    }
    e1->inflight = 3;
    assert_ptr_equal(pick(&f, EPD_CLIENT_ROLE_ENCODER, NULL, 0), e0);
    assert_null(pick(&f, EPD_CLIENT_ROLE_PREFILL, NULL, 0));
    epd_router_registry_counts(&f.reg, counts);
    assert_int_equal(counts[EPD_ROUTER_POOL_ENCODER][EPD_ROUTER_READY], 2);
    assert_int_equal(counts[EPD_ROUTER_POOL_PREFILL][EPD_ROUTER_READY], 0);
    assert_string_equal(epd_router_pool_name(epd_router_pool_of(EPD_CLIENT_ROLE_ENCODER)),
                        "encoder");
    /* a prefill worker with 3 embedding slots: the mirror holds the 3 most
     * recently used images */
    {
        epd_client_worker_info_t info;

        memset(&info, 0, sizeof(info));
        snprintf(info.worker_id, sizeof(info.worker_id), "prefill-x");
        info.role = EPD_CLIENT_ROLE_PREFILL;
        info.embed_slots = 3;
        p = epd_router_registry_add(&f.reg, &info, 0);
        assert_non_null(p);
    }
    for (int i = 0; i < 5; i++) {
        memset(h[i], 'a' + i, 32);
    }
    for (int i = 0; i < 3; i++) {
        epd_router_cache_add(p, h[i], 10 + (uint64_t)i);
    }
    assert_true(epd_router_cache_has(p, h[0], 20)); /* 0 is now the newest */
    epd_router_cache_add(p, h[3], 21);              /* evicts 1, the oldest */
    assert_false(epd_router_cache_has(p, h[1], 22));
    assert_true(epd_router_cache_has(p, h[2], 23));
    assert_true(epd_router_cache_has(p, h[3], 24));
    epd_router_cache_forget(p, h[3]);
    assert_false(epd_router_cache_has(p, h[3], 25));
    epd_router_cache_add(p, h[4], 26); /* takes the forgotten entry */
    assert_true(epd_router_cache_has(p, h[0], 27));
    assert_true(epd_router_cache_has(p, h[2], 28));
    assert_true(epd_router_cache_has(p, h[4], 29));
    /* no hints on other workers */
    epd_router_cache_add(e0, h[0], 30);
    assert_false(epd_router_cache_has(e0, h[0], 31));
    epd_router_registry_cleanup(&f.reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_policy_names),
        cmocka_unit_test(test_round_robin),
        cmocka_unit_test(test_least_load),
        cmocka_unit_test(test_room_for_decode),
        cmocka_unit_test(test_prefix_affinity),
        cmocka_unit_test(test_kv_aware_prefill),
        cmocka_unit_test(test_kv_aware_decode),
        cmocka_unit_test(test_hint_set),
        cmocka_unit_test(test_avoid_list),
        cmocka_unit_test(test_unreachable_until_heartbeat),
        cmocka_unit_test(test_tick_states),
        cmocka_unit_test(test_encoders_and_cache_hints),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
