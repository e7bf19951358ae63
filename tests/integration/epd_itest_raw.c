/*
 * epd_itest_raw.c — `epd-itest-raw CASE ...`: a raw request-plane peer
 * (an epd_xport endpoint and hand-made envelopes, no client library) that
 * sends the daemons what a well-behaved client never would, and checks
 * their answers.  Run by test_garbage.sh and test_kill_*.sh, which start
 * and stop the daemons and check the daemons' logs.
 *
 *   garbage --prefill ADDR --decode ADDR
 *       random bytes, a truncated frame, a frame with a bad checksum (no
 *       reply possible: only a log line); Abort / PrefillComplete /
 *       KvReservation for the unknown request id 999999; a GenerateRequest
 *       with max_tokens 2^31, one with token ids >= vocab, one naming the
 *       wrong epoch; a reservation for a live prefill request (this program
 *       posing as its decode worker) with block ids beyond the pool, and
 *       one with 20000 block ids.  Each identifiable message must get an
 *       Error reply naming its request id, and nothing may be written into
 *       the region this program offered.  A reservation with 10^6 block
 *       ids (~3 MB, over the daemons' 64 KiB message limit) must be
 *       dropped by their transport (no reply, a log line).
 *   stale --target ADDR --as-worker ID --epoch START:NONCE
 *       a WritesQuiesced and a LayerDone whose sender is worker ID with an
 *       older epoch (its previous incarnation): Error EPD_ERR_STALE_EPOCH.
 *   old-epoch --target ADDR --epoch START:NONCE
 *       a GenerateRequest naming the target worker with an old epoch of
 *       its own: Error EPD_ERR_STALE_EPOCH.
 * Prints one line per case; exit 0 when every expectation held.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_client.h"
#include "epd_log.h"
#include "epd_msg.h"
#include "epd_rng.h"
#include "epd_time.h"
#include "epd_xport.h"

/* UCX and libfabric keep process-wide allocations until exit (not epd's). */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libucs.so\nleak:libucp.so\nleak:libuct.so\nleak:libucm.so\n"
           "leak:libfabric.so\nleak:librdmacm.so\nleak:libibverbs.so\n";
}

#define MAX_RX 256
#define REGION_SIZE (1u << 20)
/* This peer may send far more than the daemons' 64 KiB message limit: the
 * absurd-size cases must reach the daemon's transport, which has to drop
 * them. */
#define RAW_MAX_MSG (8u << 20)

typedef struct {
    epd_xport_t *x;
    Epd__Envelope *rx[MAX_RX];
    int n_rx;
    uint64_t start_ns;
    uint64_t nonce;
    uint64_t seq;
    int bad;
    unsigned char *buf; /* [RAW_MAX_MSG] */
} raw_t;

static raw_t R;

static void on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    Epd__Envelope *env = NULL;
    const char *why = NULL;

    (void)arg;
    (void)ep;
    if (epd_msg_decode(data, len, &env, &why) != EPD_OK) {
        printf("  (a frame from a daemon did not decode: %s)\n", why);
        R.bad = 1;
        return;
    }
    if (R.n_rx < MAX_RX) {
        R.rx[R.n_rx++] = env;
    } else {
        epd_msg_free(env);
    }
}

static void poll_ms(int ms)
{
    uint64_t end = epd_time_now_ns() + (uint64_t)ms * EPD_NSEC_PER_MSEC;

    while (epd_time_now_ns() < end) {
        epd_xport_poll(R.x, 5);
    }
}

/* Waits for a message about `id` (any body); NULL after ms. */
static Epd__Envelope *wait_for(uint64_t id, int ms)
{
    uint64_t end = epd_time_now_ns() + (uint64_t)ms * EPD_NSEC_PER_MSEC;

    for (;;) {
        for (int i = 0; i < R.n_rx; i++) {
            if (R.rx[i] != NULL && epd_msg_request_id(R.rx[i]) == id) {
                Epd__Envelope *env = R.rx[i];
                R.rx[i] = NULL;
                return env;
            }
        }
        if (epd_time_now_ns() >= end) {
            return NULL;
        }
        epd_xport_poll(R.x, 5);
    }
}

/* Waits for an Error about `id`, skipping other bodies; NULL after ms. */
static Epd__Envelope *wait_error(uint64_t id, int ms, char *seen, size_t seen_cap)
{
    uint64_t end = epd_time_now_ns() + (uint64_t)ms * EPD_NSEC_PER_MSEC;

    seen[0] = '\0';
    for (;;) {
        uint64_t now = epd_time_now_ns();
        Epd__Envelope *env = wait_for(id, now >= end ? 0 : (int)((end - now) / EPD_NSEC_PER_MSEC));

        if (env == NULL) {
            return NULL;
        }
        if (env->body_case == EPD__ENVELOPE__BODY_ERROR) {
            return env;
        }
        snprintf(seen + strlen(seen), seen_cap - strlen(seen), "%s%s", seen[0] ? "," : "",
                 epd_msg_body_name(env));
        epd_msg_free(env);
    }
}

static void send_env(epd_xport_ep_t *ep, const char *who, uint64_t start, uint64_t nonce,
                     Epd__Envelope *env, size_t cut)
{
    Epd__Epoch e = EPD__EPOCH__INIT;
    Epd__SenderRef s = EPD__SENDER_REF__INIT;
    size_t len;
    epd_status_t st;

    e.start_time_ns = start;
    e.nonce = nonce;
    s.worker_id = (char *)who;
    s.epoch = &e;
    env->sender = &s;
    env->seq = ++R.seq;
    st = epd_msg_encode(env, R.buf, RAW_MAX_MSG, &len);
    env->sender = NULL;
    if (st != EPD_OK) {
        printf("  cannot encode: %s\n", epd_status_string(st));
        R.bad = 1;
        return;
    }
    st = epd_xport_send(ep, R.buf, cut > 0 && cut < len ? cut : len, 0);
    if (st != EPD_OK) {
        printf("  send failed: %s\n", epd_status_string(st));
        R.bad = 1;
    }
}

static void send_mine(epd_xport_ep_t *ep, Epd__Envelope *env)
{
    send_env(ep, "itest-raw", R.start_ns, R.nonce, env, 0);
}

/* Expects an Error about `id` within ms; `want` 0 = any error status. */
static void expect_error(const char *what, uint64_t id, int want, int ms)
{
    char seen[256];
    Epd__Envelope *env = wait_error(id, ms, seen, sizeof(seen));

    if (env == NULL) {
        printf("FAIL %-48s no Error reply within %d ms%s%s\n", what, ms, seen[0] ? "; saw " : "",
               seen);
        R.bad = 1;
        return;
    }
    if (env->error->status >= 0 || (want != 0 && env->error->status != want)) {
        printf("FAIL %-48s Error %s (%d) from %s: %s; wanted %s\n", what,
               epd_status_name((epd_status_t)env->error->status), env->error->status,
               env->sender->worker_id, env->error->message,
               want ? epd_status_name((epd_status_t)want) : "a negative status");
        R.bad = 1;
    } else {
        printf("ok   %-48s Error %s from %s: %s\n", what,
               epd_status_name((epd_status_t)env->error->status), env->sender->worker_id,
               env->error->message);
    }
    epd_msg_free(env);
}

/* Expects nothing back about anything within ms (frames that cannot be
 * attributed get no reply). */
static void expect_silence(const char *what, int ms)
{
    int before = R.n_rx;

    poll_ms(ms);
    if (R.n_rx != before) {
        printf("note %-48s %d message(s) came back (%s)\n", what, R.n_rx - before,
               epd_msg_body_name(R.rx[R.n_rx - 1]));
    } else {
        printf("ok   %-48s no reply (cannot be attributed)\n", what);
    }
}

typedef struct {
    epd_client_worker_info_t *info;
    epd_xport_ep_t *ep;
} target_t;

static int target_open(const char *addr, target_t *t)
{
    char err[512];
    epd_status_t st;
    uint64_t end;
    int connected = 0;

    t->info = epd_calloc(1, sizeof(*t->info));
    if (t->info == NULL) {
        return -1;
    }
    st = epd_client_health(addr, 5000, t->info, err, sizeof(err));
    if (st != EPD_OK) {
        fprintf(stderr, "epd-itest-raw: %s\n", err);
        return -1;
    }
    st = epd_xport_connect(R.x, t->info->address, t->info->address_len, NULL, NULL, &t->ep);
    if (st != EPD_OK && st != EPD_INPROGRESS) {
        fprintf(stderr, "epd-itest-raw: connect to %s: %s\n", addr, epd_status_string(st));
        return -1;
    }
    end = epd_time_now_ns() + 5 * EPD_NSEC_PER_SEC;
    while (epd_time_now_ns() < end && !connected) {
        epd_xport_poll(R.x, 5);
        connected = epd_xport_ep_peer_id(t->ep) != 0;
    }
    if (!connected) {
        fprintf(stderr, "epd-itest-raw: no handshake from %s\n", addr);
        return -1;
    }
    return 0;
}

static void target_close(target_t *t)
{
    epd_xport_ep_close(t->ep);
    epd_free(t->info);
}

/* A GenerateRequest for `id` naming `p` and `d` (their Health identities). */
typedef struct {
    Epd__Envelope env;
    Epd__GenerateRequest g;
    Epd__SamplingParams sp;
    Epd__Epoch pe;
    Epd__Epoch de;
    uint32_t prompt[64];
} gen_t;

static void gen_fill(gen_t *g, uint64_t id, const epd_client_worker_info_t *p,
                     const epd_client_worker_info_t *d)
{
    memset(g, 0, sizeof(*g));
    epd__envelope__init(&g->env);
    epd__generate_request__init(&g->g);
    epd__sampling_params__init(&g->sp);
    epd__epoch__init(&g->pe);
    epd__epoch__init(&g->de);
    g->prompt[0] = 256; /* BOS of ref models */
    for (int i = 1; i < 40; i++) {
        g->prompt[i] = (uint32_t)('a' + i % 26);
    }
    g->sp.max_tokens = 4;
    g->sp.top_p = 1.0f;
    g->pe.start_time_ns = p->epoch_start_ns;
    g->pe.nonce = p->epoch_nonce;
    g->de.start_time_ns = d->epoch_start_ns;
    g->de.nonce = d->epoch_nonce;
    g->g.request_id = id;
    g->g.prompt_tokens = g->prompt;
    g->g.n_prompt_tokens = 40;
    g->g.sampling = &g->sp;
    g->g.prefill_worker_id = (char *)p->worker_id;
    g->g.decode_worker_id = (char *)d->worker_id;
    g->g.prefill_address.data = (uint8_t *)p->address;
    g->g.prefill_address.len = p->address_len;
    g->g.decode_address.data = (uint8_t *)d->address;
    g->g.decode_address.len = d->address_len;
    g->g.prefill_epoch = &g->pe;
    g->g.decode_epoch = &g->de;
    g->g.deadline_ms = 20000;
    g->env.body_case = EPD__ENVELOPE__BODY_GENERATE;
    g->env.generate = &g->g;
}

static int region_untouched(epd_xport_mr_t *mr)
{
    const unsigned char *p = epd_xport_mr_addr(mr);

    for (size_t i = 0; i < epd_xport_mr_size(mr); i++) {
        if (p[i] != 0) {
            return 0;
        }
    }
    return 1;
}

static int case_garbage(const char *paddr, const char *daddr)
{
    target_t P = {0}, D = {0};
    epd_client_worker_info_t *me = NULL;
    epd_xport_mr_t *mr = NULL;
    unsigned char rkey[EPD_XPORT_RKEY_MAX];
    size_t rkey_len = 0;
    const void *my_addr;
    size_t my_addr_len;
    epd_rng_t rng;
    unsigned char junk[512];
    gen_t g;
    int rc = 1;

    if (target_open(paddr, &P) != 0 || target_open(daddr, &D) != 0) {
        goto out;
    }
    epd_rng_seed(&rng, 4242);

    /* frames that do not decode: nobody to answer */
    epd_rng_fill(&rng, junk, sizeof(junk));
    (void)epd_xport_send(D.ep, junk, sizeof(junk), 0);
    (void)epd_xport_send(P.ep, junk, sizeof(junk), 0);
    expect_silence("random bytes (decode, prefill)", 300);
    gen_fill(&g, 5001, P.info, D.info);
    send_env(D.ep, "itest-raw", R.start_ns, R.nonce, &g.env, 50);
    send_env(P.ep, "itest-raw", R.start_ns, R.nonce, &g.env, 50);
    expect_silence("truncated GenerateRequest frame", 300);
    {
        size_t len;
        Epd__Epoch e = EPD__EPOCH__INIT;
        Epd__SenderRef s = EPD__SENDER_REF__INIT;
        e.start_time_ns = R.start_ns;
        e.nonce = R.nonce;
        s.worker_id = "itest-raw";
        s.epoch = &e;
        g.env.sender = &s;
        if (epd_msg_encode(&g.env, R.buf, RAW_MAX_MSG, &len) == EPD_OK) {
            R.buf[len - 3] ^= 0x40; /* one bit of the body */
            (void)epd_xport_send(D.ep, R.buf, len, 0);
            (void)epd_xport_send(P.ep, R.buf, len, 0);
        }
        g.env.sender = NULL;
        memcpy(junk, "EPDM", 4); /* right magic, absurd length */
        junk[4] = 1;
        junk[5] = 0;
        junk[8] = 0xff;
        junk[9] = 0xff;
        junk[10] = 0xff;
        junk[11] = 0x7f;
        (void)epd_xport_send(D.ep, junk, 64, 0);
    }
    expect_silence("bad checksum, absurd frame length", 300);

    /* unknown request ids */
    {
        Epd__Envelope env = EPD__ENVELOPE__INIT;
        Epd__Abort ab = EPD__ABORT__INIT;
        Epd__PrefillComplete pc = EPD__PREFILL_COMPLETE__INIT;
        uint64_t sums[3] = {1, 2, 3};

        ab.request_id = 999999;
        ab.status = EPD_ERR_CANCELED;
        ab.reason = "itest";
        env.body_case = EPD__ENVELOPE__BODY_ABORT;
        env.abort = &ab;
        send_mine(D.ep, &env);
        expect_error("decode: Abort for unknown id 999999", 999999, 0, 2000);
        send_mine(P.ep, &env);
        {
            char seen[128];
            Epd__Envelope *e = wait_error(999999, 1000, seen, sizeof(seen));
            printf("%s %-48s %s%s%s\n", e != NULL ? "ok  " : "note",
                   "prefill: Abort for unknown id 999999",
                   e != NULL ? "Error "
                             : "no Error reply (protocol step 7: WritesQuiesced to "
                               "decode for unknown ids)",
                   e != NULL ? epd_status_name((epd_status_t)e->error->status) : "",
                   seen[0] ? seen : "");
            epd_msg_free(e);
        }
        pc.request_id = 999999;
        pc.first_token = 65;
        pc.n_prompt_tokens = 40;
        pc.layer_checksums = sums;
        pc.n_layer_checksums = 3;
        env.body_case = EPD__ENVELOPE__BODY_PREFILL_COMPLETE;
        env.prefill_complete = &pc;
        send_mine(D.ep, &env);
        expect_error("decode: PrefillComplete for unknown id 999999", 999999, 0, 2000);
    }

    /* absurd sizes and values in a GenerateRequest (decode validates) */
    gen_fill(&g, 6001, P.info, D.info);
    g.sp.max_tokens = 1u << 31;
    send_mine(D.ep, &g.env);
    expect_error("decode: GenerateRequest max_tokens 2^31", 6001, 0, 2000);
    gen_fill(&g, 6002, P.info, D.info);
    g.prompt[5] = 258 + 1000; /* >= vocab of every test model */
    send_mine(D.ep, &g.env);
    expect_error("decode: GenerateRequest token id >= vocab", 6002, 0, 2000);
    gen_fill(&g, 6003, P.info, D.info);
    g.prompt[7] = 0xffffffffu;
    g.de.nonce ^= 1; /* and another fault: validation must not crash on both */
    send_mine(D.ep, &g.env);
    expect_error("decode: bad token and wrong epoch", 6003, 0, 2000);
    gen_fill(&g, 6004, P.info, D.info);
    g.de.nonce ^= 0x5555;
    send_mine(D.ep, &g.env);
    expect_error("decode: GenerateRequest for another epoch", 6004, EPD_ERR_STALE_EPOCH, 2000);
    gen_fill(&g, 6005, P.info, D.info);
    g.pe.nonce ^= 0x5555;
    send_mine(P.ep, &g.env);
    expect_error("prefill: GenerateRequest for another epoch", 6005, EPD_ERR_STALE_EPOCH, 2000);
    gen_fill(&g, 6006, P.info, D.info);
    g.g.n_prompt_tokens = 0;
    send_mine(D.ep, &g.env);
    expect_error("decode: empty prompt", 6006, 0, 2000);
    gen_fill(&g, 6007, P.info, D.info);
    g.sp.temperature = -3.0f;
    send_mine(D.ep, &g.env);
    expect_error("decode: temperature -3", 6007, 0, 2000);
    /* the same request id twice while it is live: EXISTS (the first one
     * ends by decode's lease: its prefill never heard of it) */
    gen_fill(&g, 6100, P.info, D.info);
    send_mine(D.ep, &g.env);
    send_mine(D.ep, &g.env);
    expect_error("decode: a live request id again", 6100, EPD_ERR_EXISTS, 2000);
    gen_fill(&g, 6008, P.info, D.info);
    g.prompt[5] = 100000;
    send_mine(P.ep, &g.env);
    expect_error("prefill: GenerateRequest token id >= vocab", 6008, 0, 6000);

    /* reservations for a live prefill request, this program posing as
     * its decode worker */
    me = epd_calloc(1, sizeof(*me));
    if (me == NULL || epd_xport_address(R.x, &my_addr, &my_addr_len) != EPD_OK ||
        epd_xport_mr_alloc(R.x, REGION_SIZE, &mr) != EPD_OK ||
        epd_xport_mr_pack(mr, rkey, sizeof(rkey), &rkey_len) != EPD_OK) {
        fprintf(stderr, "epd-itest-raw: cannot set up the fake decode side\n");
        goto out;
    }
    snprintf(me->worker_id, sizeof(me->worker_id), "itest-fake-decode");
    me->role = EPD_CLIENT_ROLE_DECODE;
    me->epoch_start_ns = R.start_ns;
    me->epoch_nonce = R.nonce;
    memcpy(me->address, my_addr, my_addr_len);
    me->address_len = my_addr_len;
    for (int round = 0; round < 2; round++) {
        uint64_t id = 7001 + (uint64_t)round;
        Epd__Envelope env = EPD__ENVELOPE__INIT;
        Epd__KvReservation kr = EPD__KV_RESERVATION__INIT;
        Epd__KvLayout lay = EPD__KV_LAYOUT__INIT;
        uint32_t *ids = epd_calloc(20000, sizeof(uint32_t));

        gen_fill(&g, id, P.info, me);
        send_mine(P.ep, &g.env);
        poll_ms(50);
        lay.n_layers = P.info->n_layers;
        lay.layer_pattern = P.info->layer_pattern;
        lay.block_tokens = P.info->block_tokens;
        lay.n_kv_heads = P.info->n_kv_heads;
        lay.head_dim = P.info->head_dim;
        lay.dtype = P.info->kv_dtype;
        lay.block_bytes = P.info->block_bytes;
        lay.state_bytes = P.info->state_bytes;
        kr.request_id = id;
        kr.layout = &lay;
        kr.rkey.data = rkey;
        kr.rkey.len = rkey_len;
        kr.region_size = REGION_SIZE;
        kr.lease_ms = 5000;
        kr.pool_blocks = 8;
        kr.pool_state_slots = 1;
        kr.state_slot = 0;
        kr.block_ids = ids;
        if (round == 0) {
            /* 40 tokens: 3 blocks, all beyond a pool of 8 */
            ids[0] = 9;
            ids[1] = 1000000;
            ids[2] = 0xffffffffu;
            kr.n_block_ids = 3;
        } else {
            for (uint32_t i = 0; i < 20000; i++) {
                ids[i] = i % 8;
            }
            kr.n_block_ids = 20000;
        }
        env.body_case = EPD__ENVELOPE__BODY_RESERVATION;
        env.reservation = &kr;
        send_env(P.ep, me->worker_id, me->epoch_start_ns, me->epoch_nonce, &env, 0);
        expect_error(round == 0 ? "prefill: reservation with blocks beyond the pool"
                                : "prefill: reservation with 20000 block ids",
                     id, 0, 8000);
        epd_free(ids);
    }
    poll_ms(300);
    if (!region_untouched(mr)) {
        printf("FAIL %-48s bytes were written into the offered region\n",
               "prefill: refused reservations write nothing");
        R.bad = 1;
    } else {
        printf("ok   %-48s region untouched\n", "prefill: refused reservations write nothing");
    }
    {
        Epd__Envelope env = EPD__ENVELOPE__INIT;
        Epd__KvReservation kr = EPD__KV_RESERVATION__INIT;
        uint32_t ids[1] = {0};

        kr.request_id = 999999;
        kr.block_ids = ids;
        kr.n_block_ids = 1;
        kr.region_size = REGION_SIZE;
        env.body_case = EPD__ENVELOPE__BODY_RESERVATION;
        env.reservation = &kr;
        send_env(P.ep, me->worker_id, me->epoch_start_ns, me->epoch_nonce, &env, 0);
        expect_error("prefill: reservation for unknown id 999999", 999999, 0, 2000);
    }
    {
        /* 10^6 block ids: ~3 MB, far over the daemons' message limit; their
         * transport drops it (a log line), nothing to answer */
        Epd__Envelope env = EPD__ENVELOPE__INIT;
        Epd__KvReservation kr = EPD__KV_RESERVATION__INIT;
        uint32_t *ids = epd_calloc(1000000, sizeof(uint32_t));

        if (ids == NULL) {
            goto out;
        }
        for (uint32_t i = 0; i < 1000000; i++) {
            ids[i] = i;
        }
        kr.request_id = 999998;
        kr.block_ids = ids;
        kr.n_block_ids = 1000000;
        kr.region_size = REGION_SIZE;
        env.body_case = EPD__ENVELOPE__BODY_RESERVATION;
        env.reservation = &kr;
        send_env(P.ep, me->worker_id, me->epoch_start_ns, me->epoch_nonce, &env, 0);
        send_env(D.ep, me->worker_id, me->epoch_start_ns, me->epoch_nonce, &env, 0);
        epd_free(ids);
        expect_silence("reservation with 10^6 block ids (~3 MB)", 1000);
    }
    rc = 0;
out:
    epd_xport_mr_dereg(mr);
    epd_free(me);
    target_close(&P);
    target_close(&D);
    return rc;
}

static int parse_epoch(const char *s, uint64_t *start_p, uint64_t *nonce_p)
{
    char *end;

    *start_p = strtoull(s, &end, 10);
    if (*end != ':' && *end != '/') {
        return -1;
    }
    *nonce_p = strtoull(end + 1, &end, 16);
    return *end == '\0' ? 0 : -1;
}

static int case_stale(const char *addr, const char *as, const char *epoch)
{
    target_t X = {0};
    uint64_t start, nonce;
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__WritesQuiesced wq = EPD__WRITES_QUIESCED__INIT;
    Epd__LayerDone ld = EPD__LAYER_DONE__INIT;

    if (parse_epoch(epoch, &start, &nonce) != 0) {
        fprintf(stderr, "epd-itest-raw: --epoch START:NONCE(hex)\n");
        return 1;
    }
    if (target_open(addr, &X) != 0) {
        return 1;
    }
    wq.request_id = 424242;
    env.body_case = EPD__ENVELOPE__BODY_QUIESCED;
    env.quiesced = &wq;
    send_env(X.ep, as, start, nonce, &env, 0);
    expect_error("WritesQuiesced from an old incarnation", 424242, EPD_ERR_STALE_EPOCH, 2000);
    ld.request_id = 424243;
    ld.layer = 0;
    env.body_case = EPD__ENVELOPE__BODY_LAYER_DONE;
    env.layer_done = &ld;
    send_env(X.ep, as, start, nonce, &env, 0);
    expect_error("LayerDone from an old incarnation", 424243, EPD_ERR_STALE_EPOCH, 2000);
    target_close(&X);
    return 0;
}

static int case_old_epoch(const char *addr, const char *epoch)
{
    target_t X = {0};
    epd_client_worker_info_t *old = NULL;
    uint64_t start, nonce;
    gen_t g;

    if (parse_epoch(epoch, &start, &nonce) != 0) {
        fprintf(stderr, "epd-itest-raw: --epoch START:NONCE(hex)\n");
        return 1;
    }
    if (target_open(addr, &X) != 0) {
        return 1;
    }
    old = epd_calloc(1, sizeof(*old));
    *old = *X.info;
    old->epoch_start_ns = start;
    old->epoch_nonce = nonce;
    if (X.info->role == EPD_CLIENT_ROLE_DECODE) {
        gen_fill(&g, 8001, X.info, old); /* prefill side: any (not contacted) */
    } else {
        gen_fill(&g, 8001, old, X.info);
    }
    send_mine(X.ep, &g.env);
    expect_error("GenerateRequest naming the worker's old epoch", 8001, EPD_ERR_STALE_EPOCH, 2000);
    epd_free(old);
    target_close(&X);
    return 0;
}

static const char *opt(int argc, char **argv, const char *name)
{
    for (int i = 2; i + 1 < argc; i++) {
        if (strcmp(argv[i], name) == 0) {
            return argv[i + 1];
        }
    }
    return NULL;
}

int main(int argc, char **argv)
{
    epd_xport_config_t xc;
    const char *transport;
    int rc = 1;

    if (argc < 2) {
        fprintf(stderr, "usage: epd-itest-raw garbage|stale|old-epoch ...\n");
        return 1;
    }
    transport = opt(argc, argv, "--transport");
    R.start_ns = epd_time_wall_ns();
    R.nonce = epd_rng_entropy();
    epd_xport_config_init(&xc);
    xc.backend = transport != NULL ? transport : "ucx";
    xc.peer_timeout_ms = 10000;
    xc.max_msg_size = RAW_MAX_MSG;
    xc.msg_cb = on_msg;
    R.buf = epd_malloc(RAW_MAX_MSG);
    if (R.buf == NULL) {
        return 1;
    }
    if (epd_xport_create(&xc, &R.x) != EPD_OK) {
        fprintf(stderr, "epd-itest-raw: cannot start the transport\n");
        return 1;
    }
    if (strcmp(argv[1], "garbage") == 0 && opt(argc, argv, "--prefill") &&
        opt(argc, argv, "--decode")) {
        rc = case_garbage(opt(argc, argv, "--prefill"), opt(argc, argv, "--decode"));
    } else if (strcmp(argv[1], "stale") == 0 && opt(argc, argv, "--target") &&
               opt(argc, argv, "--as-worker") && opt(argc, argv, "--epoch")) {
        rc = case_stale(opt(argc, argv, "--target"), opt(argc, argv, "--as-worker"),
                        opt(argc, argv, "--epoch"));
    } else if (strcmp(argv[1], "old-epoch") == 0 && opt(argc, argv, "--target") &&
               opt(argc, argv, "--epoch")) {
        rc = case_old_epoch(opt(argc, argv, "--target"), opt(argc, argv, "--epoch"));
    } else {
        fprintf(stderr, "epd-itest-raw: bad arguments\n");
    }
    for (int i = 0; i < R.n_rx; i++) {
        epd_msg_free(R.rx[i]);
    }
    epd_xport_destroy(R.x);
    epd_free(R.buf);
    if (rc == 0 && R.bad) {
        rc = 1;
    }
    return rc;
}
