/*
 * epd_registrar.h — a worker's membership in the router's registry
 * (proto/epd_control.proto: RegisterWorker, Heartbeat).
 *
 * A daemon that was given --router HOST:PORT starts one registrar once it
 * serves.  The registrar's own thread calls RegisterWorker with the
 * daemon's packed RegisterRequest, retrying every retry_ms until the router
 * accepts it, then calls Heartbeat every RegisterResponse.heartbeat_interval_ms
 * (500 ms when the router says 0) with the daemon's current Load.  An answer
 * `known == false` (the router restarted, or declared us dead) makes it
 * register again; `drain == true` is reported once to the daemon's loop
 * (uv_async), where drain_cb runs — the daemon then drains as if its own
 * Drain RPC had been called.  The first `accepted == true` is reported
 * once the same way (joined_cb): until then the worker is not ready.
 *
 * The load: the loop thread owns the daemon's state, so a loop timer of the
 * registrar (every publish_ms) calls load_cb on the loop thread and stores
 * the answer in a seqlock; the registrar thread reads the newest consistent
 * copy.  No lock is ever held across a gRPC call, and the loop thread never
 * waits for the registrar thread except in epd_registrar_stop (which joins
 * it: at most one call's deadline, call_timeout_ms).
 *
 * The thread waits on a condition variable between calls, so stopping is
 * prompt; a failing router is logged once per minute, not per attempt.
 * After a failed call the gRPC channel is made anew, so a router that comes
 * (back) up is reached on the next attempt rather than after gRPC's own
 * reconnect backoff (which grows to minutes).
 *
 * With a cluster secret every call is signed (epd_rpc_client_set_auth): a
 * router that requires the secret refuses calls from a worker without it,
 * or with another one (EPD_ERR_AUTH, logged once per minute like any
 * failure; the registrar keeps trying — the secrets may be fixed).
 */
#ifndef EPD_REGISTRAR_H
#define EPD_REGISTRAR_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "epd_status.h"

typedef struct epd_registrar epd_registrar_t;

/* epd.PrefixCacheStats (epd_common.proto): a prefix cache's counters and
 * size; every field a uint64_t (the registrar copies it word by word). */
typedef struct {
    uint64_t requests, prompt_tokens, hit_tokens, computed_tokens, replayed_tokens, replay_cut;
    uint64_t checkpoints_taken, checkpoints_restored, checkpoints_dropped, evictions;
    uint64_t cached_blocks, checkpoints_held;
    /* the host/disk tier (kv/epd_kvtier.h): counters, then two gauges */
    uint64_t tier_stored, tier_spilled, tier_restored_host, tier_restored_disk;
    uint64_t tier_restore_us, tier_checksum_failures, tier_refused_files, tier_dropped;
    uint64_t tier_host_bytes, tier_disk_bytes;
} epd_prefix_stats_t;

#define EPD_PREFIX_STATS_WORDS (sizeof(epd_prefix_stats_t) / sizeof(uint64_t))
/* Nonzero for the words of epd_prefix_stats_t that are gauges (sizes now),
 * zero for the monotonic counters. */
#define EPD_PREFIX_STATS_GAUGE(i) ((i) == 10 || (i) == 11 || (i) == 20 || (i) == 21)

struct Epd__PrefixCacheStats;
/* Fills the message's fields (the caller's, initialised) from `s`. */
void epd_prefix_stats_to_msg(const epd_prefix_stats_t *s, struct Epd__PrefixCacheStats *m);
/* The other way (m may be NULL: all zero). */
void epd_prefix_stats_from_msg(const struct Epd__PrefixCacheStats *m, epd_prefix_stats_t *s_p);

/* Classes of the lanes of a worker's links (epd.Load links_*). */
enum {
    EPD_REGISTRAR_LINK_SHM,
    EPD_REGISTRAR_LINK_TCP,
    EPD_REGISTRAR_LINK_RDMA,
    EPD_REGISTRAR_LINK_OTHER,
    EPD_REGISTRAR_LINK_CLASSES
};

/* The fields of epd.Load the daemon reports. */
typedef struct {
    uint32_t queue_depth;   /* requests waiting */
    uint64_t queued_tokens; /* prompt tokens waiting (prefill) */
    /* of those, the tokens of requests the router this worker registered
     * with sent (epd_registrar_is_router): it counts its own live */
    uint64_t router_queued_tokens;
    uint32_t kv_blocks_free;
    uint32_t state_slots_free;
    uint32_t running_requests;
    uint64_t kv_bytes_sent;     /* data plane, monotonic (prefill: written) */
    uint64_t kv_bytes_received; /* data plane, monotonic (decode: received and verified) */
    /* overload, monotonic (epd.Load 16-18): decode's preemptions and the
     * tokens recomputed to resume them; prefill's wasted prompt tokens */
    uint64_t preemptions;
    uint64_t recomputed_tokens;
    uint64_t wasted_prefill_tokens;
    int draining;               /* the worker takes no new work */
    epd_prefix_stats_t prefix;  /* all zero: no prefix cache */
    /* live endpoints this worker opened to other workers, by lane class
     * (filled by the daemon, not the role) */
    uint32_t links[EPD_REGISTRAR_LINK_CLASSES];
    /* the fence (proto/README.md rules 25-29): memory held for writers
     * that may still write (the role's), late writes refused and grants
     * held (the daemon's, from its transport) */
    uint32_t quarantined;
    uint64_t late_writes_refused;
    uint32_t grants_held;
} epd_registrar_load_t;

/* Loop thread: write the daemon's current load into *load_p. */
typedef void (*epd_registrar_load_cb_t)(void *arg, epd_registrar_load_t *load_p);
/* Loop thread: the router asked this worker to drain (called once). */
typedef void (*epd_registrar_drain_cb_t)(void *arg);
/* Loop thread: the router accepted this worker for the first time (called
 * once; a worker that has not joined is not ready). */
typedef void (*epd_registrar_joined_cb_t)(void *arg);
/* Loop thread: the router's KV hints of this worker were reset (a lost
 * heartbeat, a full ring, a new registration): push every block held now
 * again with epd_registrar_hint(..., added 1). */
typedef void (*epd_registrar_resync_cb_t)(void *arg);

typedef struct {
    const char *router;  /* "HOST:PORT" of the router's gRPC service (copied) */
    const void *request; /* packed epd.RegisterRequest (copied); its worker
                          * id and epoch name the heartbeats */
    size_t request_len;
    epd_registrar_load_cb_t load_cb;   /* required */
    epd_registrar_drain_cb_t drain_cb; /* NULL: drain requests are only logged */
    epd_registrar_joined_cb_t joined_cb; /* NULL: not told */
    epd_registrar_resync_cb_t resync_cb; /* NULL: after a reset the router
                                          * learns only later hints */
    void *cb_arg;
    const char *log_component; /* static string, e.g. "prefill"; NULL: "registrar" */
    uint32_t retry_ms;         /* between RegisterWorker attempts; 0: 1000 */
    uint32_t call_timeout_ms;  /* deadline of one call; 0: 300 */
    uint32_t publish_ms;       /* load snapshot period on the loop; 0: 100 */
    uint32_t hint_capacity;    /* KV-aware routing hints queued between
                                * heartbeats (epd_registrar_hint); 0: none */
    const void *secret;        /* the cluster secret (copied; wiped at stop); NULL: calls */
    size_t secret_len;         /* are not signed.  EPD_RPC_SECRET_MIN..MAX bytes */
} epd_registrar_config_t;

/* What the registrar did so far (any thread; for tests and logs). */
typedef struct {
    uint64_t register_attempts;
    uint64_t registrations; /* accepted RegisterWorker answers */
    uint64_t heartbeats_ok;
    uint64_t heartbeats_failed;
    uint64_t unknown; /* known == false answers */
    int drain_requested;
    uint32_t heartbeat_interval_ms; /* the router's, once registered */
} epd_registrar_counts_t;

/*
 * Starts the registrar: publishes the load once (load_cb, now), starts the
 * publish timer on `loop` and the thread, which registers at once.  Loop
 * thread.  On EPD_OK *reg_p is owned by the caller (epd_registrar_stop).
 * EPD_ERR_INVALID_PARAM when the request does not unpack or lacks a worker
 * id or epoch, `router` is empty, or the secret's length is out of range.
 */
epd_status_t epd_registrar_start(uv_loop_t *loop, const epd_registrar_config_t *config,
                                 epd_registrar_t **reg_p);

/* Publishes `load` now (on top of the timer's); loop thread. */
void epd_registrar_publish(epd_registrar_t *reg, const epd_registrar_load_t *load);

/*
 * A KV-aware routing hint (HeartbeatRequest.prefix_events): `hint`
 * (epd_prefix_hint of a block key) was cached (added) or evicted.  Queued
 * for the next heartbeats, in order (a lock-free ring: the loop thread
 * writes, the registrar's thread reads).  When the ring is full, or a
 * heartbeat carrying hints fails, or the router (re)accepts this worker,
 * the router is told to forget this worker's earlier hints (prefix_reset)
 * and resync_cb pushes every block held again: hints are only hints, a
 * lost one costs a worse choice, never a wrong answer.  Loop thread.
 */
void epd_registrar_hint(epd_registrar_t *reg, uint64_t hint, int added);

/* Nonzero when the epoch {start_time_ns, nonce} (a request's sender) is
 * the router's this worker last registered with (RegisterResponse.
 * router_epoch); 0 before any registration, for NULL, and for any other
 * sender.  Any thread. */
int epd_registrar_is_router(epd_registrar_t *reg, uint64_t start_time_ns, uint64_t nonce);

/* The newest published load, consistent (seqlock); any thread. */
void epd_registrar_load_read(epd_registrar_t *reg, epd_registrar_load_t *load_p);

void epd_registrar_counts(epd_registrar_t *reg, epd_registrar_counts_t *counts_p);

/*
 * Stops the thread (waits for a call in flight: at most call_timeout_ms),
 * stops the timer and closes the handles; the memory is freed by the last
 * close callback, so the loop must run once more (its normal shutdown).
 * No callback runs after this returns.  Loop thread.  NULL is a no-op.
 */
void epd_registrar_stop(epd_registrar_t *reg);

#endif
