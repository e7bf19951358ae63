/*
 * epd_router_registry.c — workers, states and policies (see
 * epd_router_registry.h).  A linked list: clusters have tens of workers,
 * and a pick is a scan of them — cheaper than keeping an index in step.
 */
#include "epd_router_registry.h"

#include <string.h>

#include "epd_alloc.h"
#include "epd_hash.h"

#define EPD__DEAD_GRACE_NS (30ull * 1000000000ull)

epd_status_t epd_router_policy_parse(const char *name, epd_router_policy_t *policy_p)
{
    if (name == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (strcmp(name, "round-robin") == 0) {
        *policy_p = EPD_ROUTER_POLICY_ROUND_ROBIN;
    } else if (strcmp(name, "least-load") == 0) {
        *policy_p = EPD_ROUTER_POLICY_LEAST_LOAD;
    } else if (strcmp(name, "prefix-affinity") == 0) {
        *policy_p = EPD_ROUTER_POLICY_PREFIX_AFFINITY;
    } else {
        return EPD_ERR_INVALID_PARAM;
    }
    return EPD_OK;
}

const char *epd_router_policy_name(epd_router_policy_t policy)
{
    switch (policy) {
    case EPD_ROUTER_POLICY_ROUND_ROBIN:
        return "round-robin";
    case EPD_ROUTER_POLICY_LEAST_LOAD:
        return "least-load";
    case EPD_ROUTER_POLICY_PREFIX_AFFINITY:
        return "prefix-affinity";
    }
    return "?";
}

const char *epd_router_state_name(epd_router_state_t state)
{
    switch (state) {
    case EPD_ROUTER_READY:
        return "READY";
    case EPD_ROUTER_DRAINING:
        return "DRAINING";
    case EPD_ROUTER_SUSPECT:
        return "SUSPECT";
    case EPD_ROUTER_DEAD:
        return "DEAD";
    }
    return "?";
}

void epd_router_registry_init(epd_router_registry_t *reg, epd_router_policy_t policy,
                              uint32_t dead_after_ms)
{
    memset(reg, 0, sizeof(*reg));
    reg->policy = policy;
    reg->dead_after_ms = dead_after_ms;
}

static void epd_router_worker_free(epd_router_worker_t *w)
{
    epd_router_hints_destroy(w->hints);
    epd_free(w->cache);
    epd_free(w->cache_used);
    epd_free(w);
}

void epd_router_registry_cleanup(epd_router_registry_t *reg)
{
    while (reg->workers != NULL) {
        epd_router_worker_t *w = reg->workers;

        reg->workers = w->next;
        epd_router_worker_free(w);
    }
}

int epd_router_pool_of(int role)
{
    return role == EPD_CLIENT_ROLE_DECODE    ? EPD_ROUTER_POOL_DECODE
           : role == EPD_CLIENT_ROLE_ENCODER ? EPD_ROUTER_POOL_ENCODER
                                             : EPD_ROUTER_POOL_PREFILL;
}

const char *epd_router_pool_name(int pool)
{
    return pool == EPD_ROUTER_POOL_DECODE    ? "decode"
           : pool == EPD_ROUTER_POOL_ENCODER ? "encoder"
                                             : "prefill";
}

int epd_router_cache_has(epd_router_worker_t *w, const unsigned char *hash, uint64_t now_ns)
{
    for (uint32_t i = 0; w->cache != NULL && i < w->info.embed_slots; i++) {
        if (w->cache_used[i] != 0 && memcmp(w->cache[i], hash, 32) == 0) {
            w->cache_used[i] = now_ns;
            return 1;
        }
    }
    return 0;
}

void epd_router_cache_add(epd_router_worker_t *w, const unsigned char *hash, uint64_t now_ns)
{
    uint32_t victim = 0;

    if (w->cache == NULL || w->info.embed_slots == 0 || epd_router_cache_has(w, hash, now_ns)) {
        return;
    }
    for (uint32_t i = 0; i < w->info.embed_slots; i++) {
        if (w->cache_used[i] < w->cache_used[victim]) {
            victim = i;
        }
    }
    memcpy(w->cache[victim], hash, 32);
    w->cache_used[victim] = now_ns != 0 ? now_ns : 1;
}

void epd_router_cache_forget(epd_router_worker_t *w, const unsigned char *hash)
{
    for (uint32_t i = 0; w->cache != NULL && i < w->info.embed_slots; i++) {
        if (w->cache_used[i] != 0 && memcmp(w->cache[i], hash, 32) == 0) {
            w->cache_used[i] = 0;
        }
    }
}

epd_router_worker_t *epd_router_registry_find(epd_router_registry_t *reg, const char *worker_id)
{
    for (epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        if (w->state != EPD_ROUTER_DEAD && strcmp(w->info.worker_id, worker_id) == 0) {
            return w;
        }
    }
    return NULL;
}

int epd_router_registry_has(const epd_router_registry_t *reg, const epd_router_worker_t *w)
{
    for (const epd_router_worker_t *x = reg->workers; x != NULL; x = x->next) {
        if (x == w) {
            return 1;
        }
    }
    return 0;
}

epd_router_worker_t *epd_router_registry_add(epd_router_registry_t *reg,
                                             const epd_client_worker_info_t *info, uint64_t now_ns)
{
    epd_router_worker_t *w = epd_calloc(1, sizeof(*w));

    if (w == NULL) {
        return NULL;
    }
    memcpy(&w->info, info, sizeof(*info));
    if (info->role == EPD_CLIENT_ROLE_PREFILL && info->embed_slots > 0) {
        w->cache = epd_calloc(info->embed_slots, sizeof(*w->cache));
        w->cache_used = epd_calloc(info->embed_slots, sizeof(*w->cache_used));
        if (w->cache == NULL || w->cache_used == NULL) {
            epd_router_worker_free(w);
            return NULL;
        }
    }
    w->state = EPD_ROUTER_READY;
    w->registered_ns = now_ns;
    w->last_hb_ns = now_ns;
    w->hb_queue_depth = info->queue_depth;
    w->hb_queued_tokens = info->queued_tokens;
    w->hb_router_queued_tokens = info->router_queued_tokens;
    w->hb_kv_blocks_free = info->kv_blocks_free;
    w->hb_state_slots_free = info->state_slots_free;
    w->hb_running = info->running_requests;
    w->next = reg->workers;
    reg->workers = w;
    return w;
}

void epd_router_worker_kill(epd_router_worker_t *w, uint64_t now_ns)
{
    if (w->state != EPD_ROUTER_DEAD) {
        w->state = EPD_ROUTER_DEAD;
        w->dead_ns = now_ns;
    }
}

void epd_router_registry_tick(epd_router_registry_t *reg, uint64_t now_ns, uint32_t *n_died_p)
{
    uint64_t dead_after_ns = (uint64_t)reg->dead_after_ms * 1000000ull;
    uint32_t died = 0;

    for (epd_router_worker_t **pp = &reg->workers; *pp != NULL;) {
        epd_router_worker_t *w = *pp;

        if (w->state != EPD_ROUTER_DEAD && w->cw != NULL &&
            epd_client_worker_state(w->cw) != EPD_OK) {
            epd_router_worker_kill(w, now_ns);
            died++;
        }
        if (w->state == EPD_ROUTER_DEAD) {
            if (w->refs == 0 && now_ns - w->dead_ns > EPD__DEAD_GRACE_NS) {
                *pp = w->next;
                epd_router_worker_free(w);
                continue;
            }
        } else if (now_ns - w->last_hb_ns > dead_after_ns) {
            w->state = EPD_ROUTER_SUSPECT;
        } else if (w->state == EPD_ROUTER_SUSPECT) {
            w->state = w->drain_asked || w->self_draining ? EPD_ROUTER_DRAINING : EPD_ROUTER_READY;
        }
        pp = &w->next;
    }
    if (n_died_p != NULL) {
        *n_died_p = died;
    }
}

uint32_t epd_router_decode_blocks(const epd_router_worker_t *w, const epd_router_fit_t *fit)
{
    uint32_t bt = w->info.block_tokens > 0 ? w->info.block_tokens : 16;
    uint64_t end = (uint64_t)fit->n_prompt + fit->max_new;
    uint64_t hold = w->info.kv_headroom_tokens > 0 ? (uint64_t)fit->n_prompt + w->info.kv_headroom_tokens
                                                   : end;

    return (uint32_t)(((hold < end ? hold : end) + bt - 1) / bt);
}

/* Could `w`'s pool ever hold the request (decode: prompt + max_new)? */
static int epd_router_could_hold(const epd_router_worker_t *w, const epd_router_fit_t *fit)
{
    uint32_t bt = w->info.block_tokens > 0 ? w->info.block_tokens : 16;

    return w->info.role != EPD_CLIENT_ROLE_DECODE ||
           ((uint64_t)fit->n_prompt + fit->max_new + bt - 1) / bt <= w->info.kv_blocks_total;
}

int epd_router_has_room(const epd_router_worker_t *w, const epd_router_fit_t *fit)
{
    if (w->cap_refused || !epd_router_could_hold(w, fit)) {
        return 0;
    }
    if (w->info.role == EPD_CLIENT_ROLE_DECODE) {
        uint32_t free_now =
            w->hb_kv_blocks_free > w->kv_pending ? w->hb_kv_blocks_free - w->kv_pending : 0;

        return epd_router_decode_blocks(w, fit) <= free_now;
    }
    return 1;
}

/* READY with a usable endpoint, and no peer reported it unreachable since
 * its last heartbeat (a killed worker is known so within one request
 * rather than after --dead-after-ms); with `fit`, also room for the
 * request. */
static int epd_router_eligible_fit(const epd_router_worker_t *w, int role,
                                   const epd_router_fit_t *fit)
{
    return w->state == EPD_ROUTER_READY && w->info.role == role && w->cw != NULL &&
           w->unreachable_ns <= w->last_hb_ns && epd_client_worker_state(w->cw) == EPD_OK &&
           (fit == NULL || epd_router_has_room(w, fit));
}

static int epd_router_eligible(const epd_router_worker_t *w, int role)
{
    return epd_router_eligible_fit(w, role, NULL);
}

static int epd_router_avoided(const epd_router_worker_t *w, epd_router_worker_t *const *avoid,
                              size_t n_avoid)
{
    for (size_t i = 0; i < n_avoid; i++) {
        if (avoid[i] == w) {
            return 1;
        }
    }
    return 0;
}

/* A prefill worker's queued prompt tokens: what this router sent it and
 * has not seen leave its queue (exact, fresh), plus what its last
 * heartbeat reported of others' requests (other routers, epd-ctl: the
 * worker counts this router's apart, Load.router_queued_tokens).  The
 * heartbeat's own-request part is never used: its load is up to a publish
 * period old, and one read while a prompt was queued but arriving after
 * that prompt's first token kept the worker looking busy for a heartbeat
 * period — the next prompt sharing the prefix went to the other worker
 * (test_router_kv_aware in CI: 1 and 5; test_router_policies: 5 and 1). */
static uint64_t epd_router_backlog(const epd_router_worker_t *w)
{
    uint64_t others = w->hb_queued_tokens > w->hb_router_queued_tokens
                          ? w->hb_queued_tokens - w->hb_router_queued_tokens
                          : 0;

    return w->queued_tokens + others;
}

/* Lower is better.  Decode: in-flight per batch slot (scaled), then free
 * blocks; prefill: queued prompt tokens (epd_router_backlog). */
static uint64_t epd_router_load_score(const epd_router_worker_t *w)
{
    if (w->info.role == EPD_CLIENT_ROLE_ENCODER) {
        uint32_t slots = w->info.embed_slots > 0 ? w->info.embed_slots : 1;

        return (((uint64_t)w->inflight << 20) / slots << 8) + w->hb_queue_depth;
    }
    if (w->info.role == EPD_CLIENT_ROLE_DECODE) {
        uint32_t batch = w->info.max_batch > 0 ? w->info.max_batch : 1;
        uint64_t busy = ((uint64_t)w->inflight << 20) / batch;
        uint32_t total = w->info.kv_blocks_total > 0 ? w->info.kv_blocks_total : 1;
        uint64_t used =
            (uint64_t)(total - (w->hb_kv_blocks_free < total ? w->hb_kv_blocks_free : total)) *
            1024 / total;

        return (busy << 12) + used;
    }
    return (epd_router_backlog(w) << 8) + w->inflight;
}

static epd_router_worker_t *epd_router_least_load(epd_router_registry_t *reg, int role,
                                                  epd_router_worker_t *const *avoid, size_t n_avoid,
                                                  const epd_router_fit_t *fit)
{
    epd_router_worker_t *best = NULL;
    uint64_t best_score = 0;

    for (epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        uint64_t s;

        if (!epd_router_eligible_fit(w, role, fit) || epd_router_avoided(w, avoid, n_avoid)) {
            continue;
        }
        s = epd_router_load_score(w);
        /* ties go to the one that served fewer (spreads an idle cluster) */
        if (best == NULL || s < best_score || (s == best_score && w->served < best->served)) {
            best = w;
            best_score = s;
        }
    }
    return best;
}

static epd_router_worker_t *epd_router_round_robin(epd_router_registry_t *reg, int role,
                                                   epd_router_worker_t *const *avoid,
                                                   size_t n_avoid, const epd_router_fit_t *fit)
{
    uint32_t *cursor = &reg->rr[epd_router_pool_of(role)];
    uint32_t n = 0, k = 0;

    for (epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        n += epd_router_eligible_fit(w, role, fit) && !epd_router_avoided(w, avoid, n_avoid);
    }
    if (n == 0) {
        return NULL;
    }
    /* the list is newest first; walk it oldest-stable by index modulo n */
    k = (*cursor)++ % n;
    for (epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        if (epd_router_eligible_fit(w, role, fit) && !epd_router_avoided(w, avoid, n_avoid) &&
            k-- == 0) {
            return w;
        }
    }
    return NULL;
}

/* ---------------------------------------------------------- KV-aware */

uint64_t epd_router_probe_hint(epd_router_probe_t *pp, uint32_t i)
{
    uint32_t bt = pp->block_tokens;

    if (bt == 0 || i >= pp->cap || (uint64_t)(i + 1) * bt > pp->n_tokens) {
        return 0;
    }
    while (pp->n_hints <= i) {
        /* eight blocks at a time: most prompts stop matching early */
        epd_prefix_hash_t keys[8];
        epd_prefix_hash_t parent;
        uint32_t n;

        if (pp->n_hints == 0) {
            memcpy(parent.b, pp->root, sizeof(parent.b));
        } else {
            parent = pp->last;
        }
        n = epd_prefix_chain_from(&parent, bt, (const int32_t *)pp->tokens, pp->n_tokens,
                                  pp->media, pp->n_media, pp->n_hints, keys, 8);
        if (n == 0) {
            return 0;
        }
        for (uint32_t k = 0; k < n && pp->n_hints < pp->cap; k++) {
            pp->hints[pp->n_hints++] = epd_prefix_hint(&keys[k]);
            pp->last = keys[k];
        }
    }
    return pp->hints[i];
}

/* Does w speak the probe's namespace (its hints are comparable)? */
static int epd_router_same_space(const epd_router_worker_t *w, const epd_router_probe_t *pp)
{
    return pp != NULL && pp->plain != NULL && w->has_root && w->hints != NULL &&
           w->info.block_tokens == pp->block_tokens &&
           memcmp(w->prefix_root, pp->plain, sizeof(w->prefix_root)) == 0;
}

uint32_t epd_router_cached_blocks(const epd_router_worker_t *w, epd_router_probe_t *pp)
{
    uint32_t i = 0;
    uint64_t h;

    if (!epd_router_same_space(w, pp)) {
        return 0;
    }
    while ((h = epd_router_probe_hint(pp, i)) != 0 && epd_router_hints_has(w->hints, h)) {
        i++;
    }
    return i;
}

void epd_router_hints_expect(epd_router_worker_t *w, epd_router_probe_t *pp, uint32_t max_blocks)
{
    uint64_t h;

    if (!epd_router_same_space(w, pp)) {
        return;
    }
    for (uint32_t i = 0; i < max_blocks && (h = epd_router_probe_hint(pp, i)) != 0; i++) {
        epd_router_hints_add(w->hints, h);
    }
}

/* Rendezvous weight of w for the prompt's first KV block (the tie-break
 * of equal costs: a consistent hash). */
static uint64_t epd_router_rendezvous(const epd_router_worker_t *w, const uint32_t *prompt,
                                      uint32_t n_prompt)
{
    uint32_t bt = w->info.block_tokens > 0 ? w->info.block_tokens : 16;
    uint32_t n_key = n_prompt < bt ? n_prompt : bt;
    uint64_t key = epd_hash64(prompt, (size_t)n_key * sizeof(*prompt), 0);

    return epd_hash64(w->info.worker_id, strlen(w->info.worker_id), key);
}

/* Prefill: the least expected cost (queued tokens + tokens it would
 * compute), ties by rendezvous weight. */
static epd_router_worker_t *epd_router_kv_prefill(epd_router_registry_t *reg,
                                                  epd_router_probe_t *pp, const uint32_t *prompt,
                                                  uint32_t n_prompt,
                                                  const epd_router_fit_t *fit,
                                                  epd_router_worker_t *const *avoid,
                                                  size_t n_avoid)
{
    epd_router_worker_t *best = NULL;
    uint64_t best_cost = 0, best_w = 0;

    for (epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        uint64_t cached, cost, weight;

        if (!epd_router_eligible_fit(w, EPD_CLIENT_ROLE_PREFILL, fit) ||
            epd_router_avoided(w, avoid, n_avoid)) {
            continue;
        }
        cached = (uint64_t)epd_router_cached_blocks(w, pp) * w->info.block_tokens;
        cached = cached < n_prompt ? cached : (n_prompt > 0 ? n_prompt - 1 : 0);
        cost = epd_router_backlog(w) + n_prompt - cached;
        weight = epd_router_rendezvous(w, prompt, n_prompt);
        if (best == NULL || cost < best_cost || (cost == best_cost && weight > best_w)) {
            best = w;
            best_cost = cost;
            best_w = weight;
        }
    }
    return best;
}

/* Decode: least load, unless a worker holding blocks of the prompt is
 * within EPD_ROUTER_DECODE_SLACK of it (then the one holding the most). */
static epd_router_worker_t *epd_router_kv_decode(epd_router_registry_t *reg,
                                                 epd_router_probe_t *pp,
                                                 const epd_router_fit_t *fit,
                                                 epd_router_worker_t *const *avoid,
                                                 size_t n_avoid)
{
    epd_router_worker_t *least =
        epd_router_least_load(reg, EPD_CLIENT_ROLE_DECODE, avoid, n_avoid, fit);
    epd_router_worker_t *best = NULL;
    uint64_t limit;
    uint32_t most = 0;

    if (least == NULL || pp == NULL) {
        return least;
    }
    limit = (epd_router_load_score(least) >> 12) + EPD_ROUTER_DECODE_SLACK;
    for (epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        uint32_t c;

        if (!epd_router_eligible_fit(w, EPD_CLIENT_ROLE_DECODE, fit) ||
            epd_router_avoided(w, avoid, n_avoid) || (epd_router_load_score(w) >> 12) > limit) {
            continue;
        }
        c = epd_router_cached_blocks(w, pp);
        if (c > most) {
            most = c;
            best = w;
        }
    }
    return best != NULL ? best : least;
}

/* The policy's choice among the eligible workers (with room for `fit`
 * when given), skipping `avoid` unless nothing else is eligible. */
epd_router_worker_t *epd_router_registry_pick_kv(epd_router_registry_t *reg, int role,
                                                 epd_router_probe_t *pp, const uint32_t *prompt,
                                                 uint32_t n_prompt, const epd_router_fit_t *fit,
                                                 epd_router_worker_t *const *avoid,
                                                 size_t n_avoid)
{
    for (int pass = 0; pass < 2; pass++) {
        epd_router_worker_t *w;
        size_t na = pass == 0 ? n_avoid : 0;

        switch (role == EPD_CLIENT_ROLE_ENCODER ? EPD_ROUTER_POLICY_LEAST_LOAD : reg->policy) {
        case EPD_ROUTER_POLICY_ROUND_ROBIN:
            w = epd_router_round_robin(reg, role, avoid, na, fit);
            break;
        case EPD_ROUTER_POLICY_PREFIX_AFFINITY:
            w = role == EPD_CLIENT_ROLE_PREFILL
                    ? epd_router_kv_prefill(reg, pp, prompt, n_prompt, fit, avoid, na)
                    : epd_router_kv_decode(reg, pp, fit, avoid, na);
            break;
        default:
            w = epd_router_least_load(reg, role, avoid, na, fit);
            break;
        }
        if (w != NULL || n_avoid == 0) {
            return w;
        }
    }
    return NULL;
}

epd_router_worker_t *epd_router_registry_pinned(epd_router_registry_t *reg, int role,
                                                const char *worker_id,
                                                const epd_router_fit_t *fit,
                                                epd_router_worker_t *const *avoid,
                                                size_t n_avoid)
{
    epd_router_worker_t *w = epd_router_registry_find(reg, worker_id);

    if (w == NULL || !epd_router_eligible_fit(w, role, fit) ||
        epd_router_avoided(w, avoid, n_avoid)) {
        return NULL;
    }
    return w;
}

epd_router_worker_t *epd_router_registry_pick(epd_router_registry_t *reg, int role,
                                              const uint32_t *prompt, uint32_t n_prompt,
                                              epd_router_worker_t *const *avoid, size_t n_avoid)
{
    return epd_router_registry_pick_kv(reg, role, NULL, prompt, n_prompt, NULL, avoid, n_avoid);
}

epd_router_worker_t *epd_router_registry_pick_room(epd_router_registry_t *reg, int role,
                                                   const uint32_t *prompt,
                                                   const epd_router_fit_t *fit,
                                                   epd_router_worker_t *const *avoid,
                                                   size_t n_avoid, int *full_p)
{
    return epd_router_registry_pick_room_kv(reg, role, NULL, prompt, fit, avoid, n_avoid, full_p);
}

epd_router_worker_t *epd_router_registry_pick_room_kv(epd_router_registry_t *reg, int role,
                                                      epd_router_probe_t *pp,
                                                      const uint32_t *prompt,
                                                      const epd_router_fit_t *fit,
                                                      epd_router_worker_t *const *avoid,
                                                      size_t n_avoid, int *full_p)
{
    epd_router_worker_t *w =
        epd_router_registry_pick_kv(reg, role, pp, prompt, fit->n_prompt, fit, avoid, n_avoid);

    *full_p = 0;
    if (w == NULL) {
        for (epd_router_worker_t *c = reg->workers; c != NULL; c = c->next) {
            if (epd_router_eligible(c, role) && epd_router_could_hold(c, fit)) {
                *full_p = 1; /* there are workers: all of them full now */
                break;
            }
        }
    }
    return w;
}

int epd_router_registry_never_fits(const epd_router_registry_t *reg, int role,
                                   const epd_router_fit_t *fit, uint64_t *limit_p)
{
    uint64_t need = (uint64_t)fit->n_prompt + (role == EPD_CLIENT_ROLE_DECODE ? fit->max_new : 0);
    uint64_t limit = 0;
    int seen = 0;

    for (const epd_router_worker_t *c = reg->workers; c != NULL; c = c->next) {
        uint64_t bt = c->info.block_tokens > 0 ? c->info.block_tokens : 16;

        if (!epd_router_eligible(c, role)) {
            continue;
        }
        if (c->info.kv_blocks_total == 0 || (need + bt - 1) / bt <= c->info.kv_blocks_total) {
            return 0; /* this one could hold it (or says nothing of its pool) */
        }
        seen = 1;
        if ((uint64_t)c->info.kv_blocks_total * bt > limit) {
            limit = (uint64_t)c->info.kv_blocks_total * bt;
        }
    }
    *limit_p = limit;
    return seen;
}

/* Hints of `w` for the images, without touching their LRU order. */
static uint32_t epd_router_cache_hits(const epd_router_worker_t *w,
                                      const unsigned char (*hashes)[32], uint32_t n_images)
{
    uint32_t hits = 0;

    for (uint32_t k = 0; k < n_images; k++) {
        for (uint32_t i = 0; w->cache != NULL && i < w->info.embed_slots; i++) {
            if (w->cache_used[i] != 0 && memcmp(w->cache[i], hashes[k], 32) == 0) {
                hits++;
                break;
            }
        }
    }
    return hits;
}

epd_router_worker_t *epd_router_registry_pick_images(epd_router_registry_t *reg,
                                                     const uint32_t *prompt, uint32_t n_prompt,
                                                     const unsigned char (*hashes)[32],
                                                     uint32_t n_images,
                                                     epd_router_worker_t *const *avoid,
                                                     size_t n_avoid, uint64_t now_ns)
{
    epd_router_worker_t *w = epd_router_registry_pick(reg, EPD_CLIENT_ROLE_PREFILL, prompt,
                                                      n_prompt, avoid, n_avoid);
    epd_router_worker_t *best = w;
    uint32_t best_hits;

    (void)now_ns;
    if (w == NULL || n_images == 0) {
        return w;
    }
    best_hits = epd_router_cache_hits(w, hashes, n_images);
    for (epd_router_worker_t *c = reg->workers; c != NULL && best_hits < n_images; c = c->next) {
        uint32_t hits;

        if (c == w || !epd_router_eligible(c, EPD_CLIENT_ROLE_PREFILL) ||
            epd_router_avoided(c, avoid, n_avoid) ||
            c->queued_tokens > w->queued_tokens + EPD_ROUTER_AFFINITY_SLACK_TOKENS) {
            continue;
        }
        hits = epd_router_cache_hits(c, hashes, n_images);
        if (hits > best_hits) {
            best = c;
            best_hits = hits;
        }
    }
    return best;
}

void epd_router_registry_counts(const epd_router_registry_t *reg,
                                uint32_t counts_p[EPD_ROUTER_POOLS][5])
{
    memset(counts_p, 0, sizeof(uint32_t) * EPD_ROUTER_POOLS * 5);
    for (const epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        int r = epd_router_pool_of(w->info.role);

        if (w->state >= 1 && w->state <= 4) {
            counts_p[r][w->state]++;
        }
    }
}
