/*
 * epd_router_registry.h — the router's view of the cluster: every worker
 * that registered (RegisterWorker), its state and load, and the policies
 * that pick a prefill and a decode worker for a request.
 *
 * A worker is one incarnation (worker id + epoch).  States:
 *   READY     registered, heartbeating, its endpoint healthy: takes work;
 *   DRAINING  Drain was asked (through the router, or of the worker itself,
 *             as its heartbeats then say): no new work, running requests
 *             finish;
 *   SUSPECT   no heartbeat for dead_after_ms: no new work until a
 *             heartbeat comes back;
 *   DEAD      its request-plane endpoint failed, or a newer incarnation
 *             of the same worker id registered: never used again.
 * Entries are owned by the registry; a request holds an entry with
 * epd_router_worker_ref/unref so an entry outlives every request sent to
 * it (DEAD entries without references are freed after a grace period).
 *
 * Load: the heartbeat's figures (queue depth, queued tokens, free KV
 * blocks, running requests) plus what the router itself has sent since
 * (in-flight requests, prompt tokens waiting for their first token, the
 * KV blocks decode workers take for what it sent), which is current
 * between heartbeats.
 *
 * Room (overload): a request goes to a decode worker only when that
 * worker's free blocks — its last heartbeat's, less the blocks of the
 * requests the router sent it since — cover what it takes at admission
 * (the prompt plus its headroom when its KV grows on demand, prompt +
 * max_tokens when reserved up front), and to no worker that refused one
 * for room (no capacity) since its last heartbeat.  When READY workers
 * exist but none has room, the request waits in the router's queue.
 *
 * Pools: prefill, decode and encoder workers; encoders are picked by
 * least load (in-flight images per slot) under every policy.
 *
 * Policies:
 *   round-robin      the next eligible worker of the pool after the last one;
 *   least-load       decode: fewest in-flight requests per batch slot, then
 *                    most free KV blocks; prefill: fewest queued prompt
 *                    tokens (router-side), then heartbeat queue;
 *   prefix-affinity  KV-aware (docs/prefix-cache.md): each worker's
 *                    KV hints (the blocks it holds, from its heartbeats,
 *                    plus the prompts the router sent it) give the tokens
 *                    of the prompt it would not compute, `cached`.
 *                    Prefill: the least expected cost, cost = queued
 *                    prompt tokens (router-side and heartbeat) + prompt
 *                    tokens - cached — the time a prefill worker needs
 *                    before this prompt's first token, in tokens; equal
 *                    costs (a cold prompt on an idle pool) go by
 *                    rendezvous hashing of the first KV block, a
 *                    consistent hash, so a prefix lands on one worker
 *                    before any hint exists.  Decode: the least loaded
 *                    (as least-load), unless a worker within
 *                    EPD_ROUTER_DECODE_SLACK of its in-flight share holds
 *                    blocks of the prompt (decode-side reuse): the one
 *                    holding the most.
 *
 * Threads: the router's loop thread only.  Pure data structure: no I/O.
 */
#ifndef EPD_ROUTER_REGISTRY_H
#define EPD_ROUTER_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "epd_client.h"
#include "epd_prefix.h"
#include "epd_router_hints.h"
#include "epd_registrar.h"
#include "epd_status.h"

#define EPD_ROUTER_AFFINITY_SLACK_TOKENS 4096 /* images: cache affinity vs load */
/* decode: in-flight requests per batch slot (scaled as the load score, 1 <<
 * 20 = a full batch) a worker holding the prompt's blocks may be above the
 * least loaded one and still get it */
#define EPD_ROUTER_DECODE_SLACK (1u << 18)
#define EPD_ROUTER_POOLS_MAX 3

typedef enum {
    EPD_ROUTER_READY = 1, /* values of epd.WorkerState */
    EPD_ROUTER_DRAINING = 2,
    EPD_ROUTER_SUSPECT = 3,
    EPD_ROUTER_DEAD = 4,
} epd_router_state_t;

typedef enum {
    EPD_ROUTER_POLICY_ROUND_ROBIN = 0,
    EPD_ROUTER_POLICY_LEAST_LOAD,
    EPD_ROUTER_POLICY_PREFIX_AFFINITY,
} epd_router_policy_t;

typedef struct epd_router_worker {
    epd_client_worker_info_t info; /* identity, address, layout, capacity */
    char control_addr[256];        /* the worker's own gRPC address (advertised) */
    char data_addr[64];            /* its data plane's IP (RegisterRequest.data_address) */
    epd_client_worker_t *cw;       /* the request-plane client's handle (owned by the client) */
    epd_router_state_t state;
    int drain_asked;   /* Drain came through the router */
    int self_draining; /* the worker's heartbeat says it drains (its own Drain RPC) */
    uint64_t registered_ns; /* monotonic */
    uint64_t last_hb_ns;    /* monotonic */
    uint64_t dead_ns;       /* when it became DEAD */
    uint64_t unreachable_ns; /* a peer last reported it unreachable (monotonic): no new
                              * work until a heartbeat after that (it may be dead) */
    /* heartbeat load */
    uint32_t hb_queue_depth;
    uint64_t hb_queued_tokens;
    uint64_t hb_router_queued_tokens; /* of hb_queued_tokens, this router's (epd.Load 20) */
    uint32_t hb_kv_blocks_free;
    uint32_t hb_state_slots_free;
    uint32_t hb_running;
    uint64_t hb_kv_bytes_sent;     /* data-plane counters (monotonic per incarnation) */
    uint64_t hb_kv_bytes_received;
    epd_prefix_stats_t hb_prefix; /* its prefix cache (prefill; per incarnation) */
    uint64_t hb_preemptions;        /* overload counters (monotonic per incarnation) */
    uint64_t hb_recomputed_tokens;
    uint64_t hb_wasted_prefill_tokens;
    uint32_t hb_links[4]; /* its links to other workers by class: shm, tcp, rdma, other */
    /* the fence (proto/README.md "Late writes: the fence"): memory held
     * for writers that may still write, late writes refused, grants held */
    uint32_t hb_quarantined;
    uint64_t hb_late_writes_refused;
    uint32_t hb_grants_held;
    /* router-side load */
    uint32_t inflight;      /* requests sent here, not yet ended */
    uint64_t queued_tokens; /* prefill: prompt tokens not yet past their first token */
    uint64_t served;        /* requests sent here */
    uint32_t kv_pending;    /* decode: blocks of requests sent since the last heartbeat */
    int cap_refused;        /* refused a request for room since the last heartbeat */
    /* prefill: the images the router believes this worker has cached (an
     * LRU mirror of its embedding cache, as big as its embed_slots): a hint
     * only — a wrong one costs a retry with an encoder (EPD_ERR_NOT_FOUND) */
    unsigned char (*cache)[32]; /* [info.embed_slots] */
    uint64_t *cache_used;       /* [info.embed_slots] last use, 0 = empty */
    /* prefill, decode: the KV blocks it holds (hints), when its prefix
     * cache namespace is the router's (has_root, same block size) */
    int has_root;
    unsigned char prefix_root[32];
    epd_router_hints_t *hints;
    uint32_t refs;
    struct epd_router_worker *next;
} epd_router_worker_t;

typedef struct {
    epd_router_worker_t *workers; /* newest first */
    epd_router_policy_t policy;
    uint32_t dead_after_ms;
    uint32_t rr[EPD_ROUTER_POOLS_MAX]; /* round-robin cursors per pool */
} epd_router_registry_t;

/* "round-robin", "least-load", "prefix-affinity" → *policy_p;
 * EPD_ERR_INVALID_PARAM otherwise. */
epd_status_t epd_router_policy_parse(const char *name, epd_router_policy_t *policy_p);
const char *epd_router_policy_name(epd_router_policy_t policy);
const char *epd_router_state_name(epd_router_state_t state);

void epd_router_registry_init(epd_router_registry_t *reg, epd_router_policy_t policy,
                              uint32_t dead_after_ms);
/* Frees every entry (the client handles belong to the client). */
void epd_router_registry_cleanup(epd_router_registry_t *reg);

/* Is `w` (maybe a stale pointer, never dereferenced here) an entry of the
 * registry now? */
int epd_router_registry_has(const epd_router_registry_t *reg, const epd_router_worker_t *w);

/* The live (not DEAD) entry of `worker_id`, or NULL. */
epd_router_worker_t *epd_router_registry_find(epd_router_registry_t *reg, const char *worker_id);

/* A new entry for `info` (copied), READY, inserted first; the caller sets
 * cw and control_addr.  An older live entry of the same worker id must be
 * marked DEAD by the caller first.  NULL when out of memory. */
epd_router_worker_t *epd_router_registry_add(epd_router_registry_t *reg,
                                             const epd_client_worker_info_t *info, uint64_t now_ns);

/* Marks `w` DEAD (idempotent). */
void epd_router_worker_kill(epd_router_worker_t *w, uint64_t now_ns);

/* Periodic upkeep: READY/DRAINING workers silent for dead_after_ms become
 * SUSPECT, SUSPECT ones heartbeating again become READY (DRAINING when a
 * drain was asked), workers whose endpoint failed become DEAD (*n_died_p
 * counts them), DEAD entries without references older than 30 s are
 * freed. */
void epd_router_registry_tick(epd_router_registry_t *reg, uint64_t now_ns, uint32_t *n_died_p);

/* Image-cache hints of a prefill worker (no-ops for others): does it hold
 * `hash`; remember it (evicting the least recently used); forget it. */
int epd_router_cache_has(epd_router_worker_t *w, const unsigned char *hash, uint64_t now_ns);
void epd_router_cache_add(epd_router_worker_t *w, const unsigned char *hash, uint64_t now_ns);
void epd_router_cache_forget(epd_router_worker_t *w, const unsigned char *hash);

/* What a request needs of a worker's room: its prompt and the most tokens
 * it may generate. */
typedef struct {
    uint32_t n_prompt;
    uint32_t max_new;
} epd_router_fit_t;

/* Blocks decode worker `w` takes when it admits such a request (rule 30:
 * prompt + its kv_headroom_tokens, at most prompt + max_new; up front when
 * it reports no headroom: prompt + max_new). */
uint32_t epd_router_decode_blocks(const epd_router_worker_t *w, const epd_router_fit_t *fit);

/* Does `w` have room for the request now (see "Room" above)?  Decode: its
 * pool can ever hold prompt + max_new and its free blocks cover what it
 * takes; every role: no refusal for room since its last heartbeat.  `fit`
 * is borrowed for the call. */
int epd_router_has_room(const epd_router_worker_t *w, const epd_router_fit_t *fit);

/* The live entry of `worker_id` when it is a `role` worker that could take
 * a request of `fit` now (READY, reachable, room) and is not in
 * avoid[0..n_avoid); else NULL.  A group's later choices are pinned so to
 * the prefill worker whose prefix cache holds their prompt. */
epd_router_worker_t *epd_router_registry_pinned(epd_router_registry_t *reg, int role,
                                                const char *worker_id,
                                                const epd_router_fit_t *fit,
                                                epd_router_worker_t *const *avoid,
                                                size_t n_avoid);

/* Nonzero when workers of `role` are eligible (READY, reachable) and not
 * one of their pools could ever hold the request, however long it waited:
 * decode prompt + max_new tokens, prefill the prompt (whole blocks, each
 * worker's block size; a worker reporting no pool size is assumed to fit).
 * *limit_p: the most tokens one of their pools holds.  `fit` borrowed. */
int epd_router_registry_never_fits(const epd_router_registry_t *reg, int role,
                                   const epd_router_fit_t *fit, uint64_t *limit_p);

/* As epd_router_registry_pick, among the workers with room for `fit`.
 * NULL with *full_p 1 when eligible workers exist that could hold it but
 * none has room now (the request waits), 0 when there is none at all. */
epd_router_worker_t *epd_router_registry_pick_room(epd_router_registry_t *reg, int role,
                                                   const uint32_t *prompt,
                                                   const epd_router_fit_t *fit,
                                                   epd_router_worker_t *const *avoid,
                                                   size_t n_avoid, int *full_p);

/*
 * A prompt as KV-aware routing sees it: its chain keys, computed as far as
 * some worker may hold them (lazily: the hashing stops at the first block
 * no eligible worker holds).  Caller's storage; `root` is the router's
 * namespace for this request (salted when it has a cache_salt), `plain`
 * the unsalted one workers publish (both 32 bytes, borrowed), `hints` a
 * caller's array of cap entries.
 */
typedef struct {
    const unsigned char *root, *plain;
    uint32_t block_tokens;
    const uint32_t *tokens; /* borrowed */
    uint32_t n_tokens;
    const epd_prefix_media_t *media; /* borrowed, sorted */
    uint32_t n_media;
    uint64_t *hints; /* [cap]: hints of blocks [0, n_hints) */
    uint32_t n_hints, cap;
    epd_prefix_hash_t last; /* the key of block n_hints - 1 */
} epd_router_probe_t;

/* Hint i of the probe (computing up to it; 0 past the prompt's full
 * blocks or the cap). */
uint64_t epd_router_probe_hint(epd_router_probe_t *pp, uint32_t i);
/* Blocks of the probe's prompt worker w holds (by its hints); 0 for a
 * worker of another namespace. */
uint32_t epd_router_cached_blocks(const epd_router_worker_t *w, epd_router_probe_t *pp);
/* The router sent the probe's prompt to w: it will hold the prompt's
 * first max_blocks full blocks (hints added now; the worker's own events
 * correct them).  Prefill keeps every full block (UINT32_MAX); decode only
 * those before the block of the prompt's last position. */
void epd_router_hints_expect(epd_router_worker_t *w, epd_router_probe_t *pp, uint32_t max_blocks);

/* epd_router_registry_pick with the prompt's probe (KV-aware under
 * prefix-affinity; pp may be NULL: no hints), among the workers with room
 * for `fit` (NULL: any). */
epd_router_worker_t *epd_router_registry_pick_kv(epd_router_registry_t *reg, int role,
                                                 epd_router_probe_t *pp, const uint32_t *prompt,
                                                 uint32_t n_prompt, const epd_router_fit_t *fit,
                                                 epd_router_worker_t *const *avoid,
                                                 size_t n_avoid);

/* epd_router_registry_pick_room with the prompt's probe (pp may be NULL). */
epd_router_worker_t *epd_router_registry_pick_room_kv(epd_router_registry_t *reg, int role,
                                                      epd_router_probe_t *pp,
                                                      const uint32_t *prompt,
                                                      const epd_router_fit_t *fit,
                                                      epd_router_worker_t *const *avoid,
                                                      size_t n_avoid, int *full_p);

/* Picks a worker of `role` (EPD_CLIENT_ROLE_PREFILL, _DECODE or _ENCODER) for a
 * prompt of n_prompt tokens, skipping the entries in avoid[0..n_avoid)
 * unless nothing else is eligible.  NULL when no worker of that role is
 * READY (with a usable endpoint). */
epd_router_worker_t *epd_router_registry_pick(epd_router_registry_t *reg, int role,
                                              const uint32_t *prompt, uint32_t n_prompt,
                                              epd_router_worker_t *const *avoid, size_t n_avoid);

/* The pools, as indexes of epd_router_registry_counts. */
#define EPD_ROUTER_POOL_PREFILL 0
#define EPD_ROUTER_POOL_DECODE 1
#define EPD_ROUTER_POOL_ENCODER 2
#define EPD_ROUTER_POOLS 3

/* The pool index of a role (EPD_CLIENT_ROLE_*), and its name ("prefill",
 * "decode", "encoder"). */
int epd_router_pool_of(int role);
const char *epd_router_pool_name(int pool);

/* Picks a prefill worker for a prompt with images: the policy's choice,
 * unless an eligible worker (not in avoid) holds more of the images in its
 * cache (by the hints) and is not overloaded (queued tokens within
 * EPD_ROUTER_AFFINITY_SLACK_TOKENS of the policy's choice).  NULL as
 * epd_router_registry_pick. */
epd_router_worker_t *epd_router_registry_pick_images(epd_router_registry_t *reg,
                                                     const uint32_t *prompt, uint32_t n_prompt,
                                                     const unsigned char (*hashes)[32],
                                                     uint32_t n_images,
                                                     epd_router_worker_t *const *avoid,
                                                     size_t n_avoid, uint64_t now_ns);

/* Counts of entries by pool (EPD_ROUTER_POOL_*) and state (index = state,
 * 1..4). */
void epd_router_registry_counts(const epd_router_registry_t *reg,
                                uint32_t counts_p[EPD_ROUTER_POOLS][5]);

static inline void epd_router_worker_ref(epd_router_worker_t *w)
{
    w->refs++;
}

static inline void epd_router_worker_unref(epd_router_worker_t *w)
{
    w->refs--;
}

#endif
