/*
 * epd_daemon.h — the runtime every epd daemon shares.
 *
 * epd-prefill, epd-decode, epd-encoder and epd-router each hold only their
 * role; everything they do the same way is here, once:
 *
 *   - flags: the common ones (worker id, model, engine, transport, control
 *     address, router, ready file, trace, log level, timeouts), one table,
 *     one set of limits, one check (epd_daemon_main);
 *   - the libuv loop and the daemon's identity (worker id, epoch);
 *   - the transport and its loop driver (epd_xport_uv), the decoding of
 *     every request-plane frame, the epoch rule (rule 10 of proto/README.md:
 *     a known worker's older epoch is refused, a newer one retires the
 *     older incarnation), links (epd_link.h) and peers (epd_peer.h);
 *   - the control plane: a gRPC server answering Health, Status and Drain
 *     from what the role reports (its load, capacity, KV layout), and
 *     registration + heartbeats with the router (epd_registrar.h);
 *   - SIGTERM (drain, then stop), SIGINT (stop) and SIGUSR1 (trace dump), the
 *     ready line and
 *     ready file, the trace recorder;
 *   - the tick (a timer calling the role every tick_ms), the pump
 *     (deferred work at the top of the loop, never nested inside a
 *     transport call), and one shutdown order.
 *
 * A daemon's main.c fills an epd_daemon_config_t and an epd_daemon_ops_t
 * (its role's callbacks: the only upward calls), creates the daemon, sets
 * its role up on the daemon's loop and transport, and calls
 * epd_daemon_serve, which runs until a signal and then stops in this order
 * (SIGTERM first drains — no new requests, Health NOT_SERVING, the router
 * told by the next heartbeat — until ops->idle or --drain-grace-ms, as a
 * kubelet expects; a second SIGTERM, SIGINT, or a grace of 0 stop at once):
 *
 *   1. ops->on_stop: the role takes no more work and cancels its compute;
 *   2. the registrar and the gRPC server stop;
 *   3. the loop keeps running (transport too) until ops->stopped says the
 *      role has let go (the router waits for its HTTP connections' close
 *      callbacks, which abort their requests upstream);
 *   4. the transport driver, timers and signals stop; the loop drains;
 *   5. ops->on_exit: the role joins its compute threads (they may write into
 *      registered memory) and deregisters what it wants deregistered;
 *   6. every link is closed and the transport destroyed: writes still
 *      posted complete with EPD_ERR_CANCELED into the role's callbacks, so
 *      the role frees its requests only after epd_daemon_serve returns;
 *   7. (after serve) the role frees its state, then epd_daemon_destroy
 *      writes the trace and frees the rest.
 *
 * Threads: everything here runs on the loop thread (the thread that called
 * epd_daemon_create), except epd_daemon_main (before) and what the
 * registrar and gRPC server do on their own threads (they post to the
 * loop).  Role callbacks run on the loop thread.
 */
#ifndef EPD_DAEMON_H
#define EPD_DAEMON_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "epd_config.h"
#include "epd_engine.h"
#include "epd_kvcache.h"
#include "epd_msg.h"
#include "epd_registrar.h"
#include "epd_rpc.h"
#include "epd_prom.h"
#include "epd_status.h"
#include "epd_trace.h"
#include "epd_xport.h"

typedef struct epd_daemon epd_daemon_t;
typedef struct epd_link epd_link_t; /* epd_link.h */
typedef struct epd_peer epd_peer_t; /* epd_peer.h */

/* Worker ids: 1..EPD_WORKER_ID_MAX-1 bytes everywhere (flags, messages,
 * the router's registry). */
#define EPD_WORKER_ID_MAX 128

/* ------------------------------------------------------------------ flags */

/* The flags every daemon shares (what epd_daemon_main parses into). */
typedef struct {
    const char *model;          /* --model DIR (required) */
    const char *engine;         /* --engine (default "ref") */
    const char *kv_dtype;       /* --kv-dtype MAP (NULL: the engine's, f32) */
    const char *worker_id;      /* --worker-id (NULL: <role>-<pid>) */
    const char *transport;      /* --transport ucx|ofi */
    const char *expect;         /* --expect-transport any|shm|tcp|rdma */
    const char *provider;       /* --provider (ofi) */
    const char *control_addr;   /* --control-addr HOST:PORT (the control port's bind) */
    const char *advertise_addr; /* --advertise-addr HOST others reach us at (NULL: the
                                 * control host; required when that is a wildcard) */
    const char *data_addr;      /* --data-addr HOST: the data plane's local address
                                 * (NULL: the advertised host) */
    int64_t drain_grace_ms;     /* --drain-grace-ms: SIGTERM drains this long at most */
    const char *router;         /* --router HOST:PORT (workers only; NULL: none) */
    const char *ready_file;     /* --ready-file PATH */
    const char *trace;          /* --trace FILE */
    int64_t trace_events;       /* --trace-events */
    const char *log_level;      /* --log-level */
    int64_t peer_timeout_ms;    /* --peer-timeout-ms */
    int64_t connect_timeout_ms; /* --connect-timeout-ms */
    const char *cluster_secret_file; /* --cluster-secret-file (NULL: no secret: loopback only) */
    /* the control port's limits (epd_rpc_limits_t; proto/epd_rpc_guard.c) */
    int64_t control_max_conns;          /* --control-max-conns */
    int64_t control_max_conns_per_addr; /* --control-max-conns-per-addr (0: no cap) */
    int64_t control_auth_timeout_ms;    /* --control-auth-timeout-ms */
    int64_t control_max_streams;        /* --control-max-streams */
    int64_t control_max_resets;         /* --control-max-resets */
    /* workers: their own Prometheus /metrics (daemon/epd_metrics_http.h) */
    const char *metrics_addr;      /* --metrics-addr HOST:PORT (NULL: off) */
    const char *served_model_name; /* --served-model-name: the `model` label (NULL: the
                                    * --model folder's name) */
} epd_daemon_flags_t;

/* Which common flags a program takes (epd_daemon_main). */
#define EPD_DAEMON_FLAG_REGISTER 0x1u /* --router: a worker that registers */

/* Fills `f` with the common defaults (control 127.0.0.1:0, ucx, ref,
 * timeouts 3000 ms, drain grace 30000 ms, trace buffer 1M events, log
 * level info). */
void epd_daemon_flags_init(epd_daemon_flags_t *f);

/* The control port's limits the flags ask for (--control-*). */
void epd_daemon_flags_limits(const epd_daemon_flags_t *f, epd_rpc_limits_t *limits_p);

/* The role's start: runs with the parsed, checked flags; returns the
 * process exit code. */
typedef int (*epd_daemon_run_cb_t)(const epd_daemon_flags_t *flags, void *arg);

/*
 * The whole of a daemon's main(): the common flags (those of `which`, with
 * their defaults) followed by the role's own (role_opts[0..n_role_opts),
 * stored wherever they point) are parsed from argv and checked (log level,
 * transport, worker id length, --model present, every address flag a
 * HOST:PORT), the log level set, then run(flags, arg) starts the role.
 * Returns the exit code: run's, 0 after --help, 1 for a bad flag (after
 * one line saying which and why).  The parsed strings live until it
 * returns.
 */
int epd_daemon_main(const char *prog, const char *summary, unsigned which,
                    const epd_opt_t *role_opts, size_t n_role_opts, epd_daemon_run_cb_t run,
                    void *arg, int argc, char **argv);

/* Opens the model of --model with --engine (blocking: at start-up, before
 * the loop runs); logs why it cannot, under `log`.  *engine_p owned by the
 * caller (epd_engine_close). */
epd_status_t epd_daemon_engine_open(const epd_daemon_flags_t *flags, const char *log,
                                    uint32_t block_tokens, uint32_t max_batch,
                                    epd_engine_t **engine_p);

/* With `on` (a role's --kv-prefault), commits the KV pool [base, base +
 * bytes) now (epd_mem_prefault: blocking, at start-up before ready, as a
 * device allocates its KV cache up front) and says how long it took under
 * `log`; off: nothing. */
void epd_daemon_kv_prefault(int on, const char *log, void *base, uint64_t bytes);

/* ------------------------------------------------------------------ roles */

/* What the role reports to the control plane (Health, Status, heartbeats):
 * the fields of epd.Load; `draining` is filled in by the daemon. */
typedef epd_registrar_load_t epd_daemon_load_t;

/* epd.Capacity, set once by the role (epd_daemon_set_capacity). */
typedef struct {
    uint32_t kv_blocks_total;
    uint32_t block_tokens;
    uint32_t state_slots_total;
    uint32_t max_batch;
    uint32_t max_context;
    uint32_t embed_slots;
    uint32_t image_embeddings;
    uint32_t embed_dim;
    uint32_t kv_headroom_tokens; /* decode: KV on demand (0: up front) */
} epd_daemon_capacity_t;

/* Answer of ops->on_rpc meaning "not mine": the daemon answers it. */
#define EPD_DAEMON_RPC_PASS (-1)

/*
 * The role's callbacks, all on the loop thread with `arg` = config.arg.
 * Every slot must be set: roles point the ones they do not need at the
 * epd_daemon_op_* stubs below (no NULL checks on the way).
 */
typedef struct {
    /*
     * A decoded, validated request-plane message (epd_msg_decode's checks,
     * the epoch rule) arrived on `from` (borrowed; epd_link_ref to keep
     * it).  Returns nonzero when the role kept `env` (it frees it with
     * epd_msg_free later); 0 and the daemon frees it.
     */
    int (*on_msg)(void *arg, epd_link_t *from, Epd__Envelope *env);
    /* A link went down (its endpoint failed, or it was closed because its
     * peer incarnation died) other than by the role's own epd_link_close;
     * sends on it fail from now on.  Runs from the pump. */
    void (*on_link_down)(void *arg, epd_link_t *link, epd_status_t status);
    /* A peer incarnation was declared dead (its link failed, a newer epoch
     * spoke, or epd_peer_kill): fail what waits on it.  May run nested
     * inside a message handler: record facts, free nothing. */
    void (*on_peer_dead)(void *arg, epd_peer_t *peer, epd_status_t status, const char *why);
    /* Every endpoint of a dead peer incarnation is closed now: nothing it
     * sent (message or write) can land any more; memory it was allowed to
     * write may be reused.  Runs from the pump. */
    void (*on_peer_closed)(void *arg, epd_peer_t *peer);
    /* Deferred work (epd_daemon_kick), at the top of the loop, never nested
     * in a transport call.  Returns nonzero to be called again at the next
     * loop iteration without another kick. */
    int (*on_pump)(void *arg);
    /* Every tick_ms: leases, deadlines, retries. */
    void (*on_tick)(void *arg, uint64_t now_ns);
    /* The current load (Health, Status, heartbeats). */
    void (*load)(void *arg, epd_daemon_load_t *load_p);
    /* The worker was asked to drain (its Drain RPC or the router's): the
     * daemon's draining flag is already set and logged. */
    void (*on_drain)(void *arg);
    /*
     * A control-plane call (see epd_rpc.h for the arguments), before the
     * daemon's own handling: return EPD_DAEMON_RPC_PASS to let the daemon
     * answer Health, Status and Drain as a worker (and Register/Heartbeat
     * as UNIMPLEMENTED), or a gRPC status with the answer.
     */
    int (*on_rpc)(void *arg, const char *method, const void *req, size_t req_len, void **resp_p,
                  size_t *resp_len_p, char *err, size_t err_cap);
    /* Shutdown step 1: take no more work, cancel compute (see the top). */
    void (*on_stop)(void *arg);
    /* Shutdown step 3: nonzero once the role has let go. */
    int (*stopped)(void *arg);
    /* Nonzero when the role holds no request (none running, queued or
     * waiting on a peer): a drain started by SIGTERM stops the daemon then
     * (--drain-grace-ms bounds the wait). */
    int (*idle)(void *arg);
    /* Shutdown step 5: join compute threads (the loop no longer runs). */
    void (*on_exit)(void *arg);
    /* epd_daemon_run only: the role on the created daemon, before it serves
     * (regions on epd_daemon_xport, compute threads on epd_daemon_loop,
     * capacity and layout).  EPD_OK to serve; an error (logged) ends the
     * run. */
    epd_status_t (*setup)(void *arg, epd_daemon_t *d);
    /* epd_daemon_run only: after serving (or a failed create or setup):
     * free what the role holds.  Compute threads are joined and the
     * transport is gone; links and peers may still be unreferenced. */
    void (*cleanup)(void *arg);
} epd_daemon_ops_t;

/* Stubs for the slots a role does not need. */
int epd_daemon_op_msg_none(void *arg, epd_link_t *from, Epd__Envelope *env);
void epd_daemon_op_link_down_none(void *arg, epd_link_t *link, epd_status_t status);
void epd_daemon_op_peer_dead_none(void *arg, epd_peer_t *peer, epd_status_t status,
                                  const char *why);
void epd_daemon_op_peer_closed_none(void *arg, epd_peer_t *peer);
int epd_daemon_op_pump_none(void *arg);
void epd_daemon_op_tick_none(void *arg, uint64_t now_ns);
void epd_daemon_op_load_none(void *arg, epd_daemon_load_t *load_p);
void epd_daemon_op_none(void *arg); /* on_drain, on_stop, on_exit */
int epd_daemon_op_rpc_pass(void *arg, const char *method, const void *req, size_t req_len,
                           void **resp_p, size_t *resp_len_p, char *err, size_t err_cap);
int epd_daemon_op_stopped_now(void *arg); /* stopped, idle: always 1 */
epd_status_t epd_daemon_op_setup_none(void *arg, epd_daemon_t *d);

typedef struct {
    const char *role_name;           /* "prefill": log component, default worker id prefix */
    int role;                        /* EPD__ROLE__ROLE_* (identity on the control plane) */
    const epd_daemon_flags_t *flags; /* borrowed for the daemon's life */
    /* the transport (0: this daemon makes none; a role that makes its own
     * hands it to epd_daemon_drive_xport) */
    int with_xport;
    size_t max_msg_size;         /* largest request-plane message (default 64 KiB) */
    uint32_t max_inflight;       /* writes posted at once (0: the transport's default) */
    uint32_t tick_ms;            /* period of ops->on_tick (0: 20 ms) */
    const epd_daemon_ops_t *ops; /* borrowed for the daemon's life */
    void *arg;
} epd_daemon_config_t;

/*
 * Creates the daemon: loop, identity (worker id from the flags or
 * "<role>-<pid>", a new epoch), the trace recorder (--trace), the
 * transport (with_xport) and its address, the signal, tick and pump
 * handles (not started).  Nothing serves yet: the role sets itself up on
 * epd_daemon_loop / epd_daemon_xport first.  Owned by the caller
 * (epd_daemon_destroy).  Logs the cause of a failure once.  Loop thread
 * (the calling thread becomes it).
 */
epd_status_t epd_daemon_create(const epd_daemon_config_t *config, epd_daemon_t **d_p);

/*
 * Serves until a signal, then stops (steps 1-6 at the top).  Starts the
 * transport driver, the gRPC server on --control-addr, the tick, the
 * signals; writes the ready line (log) and file: "[ready_prefix ]control=
 * HOST:PORT pid=N worker=ID transport=T"; registers with --router.
 * Returns EPD_OK after a signal-driven stop, or the start-up failure
 * (logged; the same stop order runs).
 */
epd_status_t epd_daemon_serve(epd_daemon_t *d, const char *ready_prefix);

/*
 * A daemon's life in one call: epd_daemon_create, ops->setup,
 * epd_daemon_serve, ops->cleanup, epd_daemon_destroy (cleanup runs whatever
 * failed, so the role frees in one place).  Returns the process exit code:
 * 0 after a signal-driven stop, 1 when anything failed (logged).
 */
int epd_daemon_run(const epd_daemon_config_t *config);

/* Writes the trace (--trace), frees links, peers and the loop.  After
 * epd_daemon_serve returned (or instead of it, after create).  NULL is a
 * no-op. */
void epd_daemon_destroy(epd_daemon_t *d);

/* ------------------------------------------------------------- accessors */

uv_loop_t *epd_daemon_loop(epd_daemon_t *d);
epd_xport_t *epd_daemon_xport(epd_daemon_t *d); /* NULL without one */
const char *epd_daemon_worker_id(const epd_daemon_t *d);
epd_msg_epoch_t epd_daemon_epoch(const epd_daemon_t *d);
const char *epd_daemon_model_name(const epd_daemon_t *d); /* basename of --model */
const char *epd_daemon_log(const epd_daemon_t *d);        /* the role name */
const epd_daemon_flags_t *epd_daemon_flags(const epd_daemon_t *d);
epd_trace_t *epd_daemon_trace(epd_daemon_t *d); /* NULL: tracing off */
int epd_daemon_stopping(const epd_daemon_t *d);
int epd_daemon_draining(const epd_daemon_t *d);
/* The data-plane address (borrowed from the transport). */
void epd_daemon_address(const epd_daemon_t *d, const void **addr_p, size_t *len_p);
/* The control port bound by epd_daemon_serve (0 before). */
int epd_daemon_control_port(const epd_daemon_t *d);
/* Addresses resolved once at create (numeric, borrowed): the host others
 * reach this daemon at (--advertise-addr, or the control host), and the
 * data plane's local address (--data-addr, or the advertised host). */
const char *epd_daemon_advertise_host(const epd_daemon_t *d);
const char *epd_daemon_data_host(const epd_daemon_t *d);

/* --------------------------------------------------------------- helpers */

/* What every role counts of its requests since start; the role increments
 * the fields (loop thread), the daemon reports them when it stops. */
typedef struct {
    uint64_t received; /* requests (or images) taken in */
    uint64_t served;   /* finished as asked */
    uint64_t failed;   /* failed or aborted */
    uint64_t refused;  /* refused at the door */
} epd_daemon_counts_t;

epd_daemon_counts_t *epd_daemon_counts(epd_daemon_t *d);

/* The cluster secret (--cluster-secret-file), borrowed for the daemon's
 * life; NULL / 0 without one.  Without a secret the daemon binds loopback
 * only (control port and data plane) and says so once. */
void epd_daemon_secret(const epd_daemon_t *d, const void **secret_p, size_t *len_p);

/* What the control plane says about this worker; call before serve. */
void epd_daemon_set_capacity(epd_daemon_t *d, const epd_daemon_capacity_t *cap);
void epd_daemon_set_kv_layout(epd_daemon_t *d, const epd_kv_layout_t *kv); /* copied */
/* The role keeps a prefix cache whose unsalted namespace is root[0..32)
 * (kv/epd_prefix.h; copied): RegisterRequest.prefix_root, and the
 * heartbeats carry its KV hints (epd_daemon_prefix_hint).  Before serve. */
void epd_daemon_set_prefix_root(epd_daemon_t *d, const unsigned char root[32]);
/* That cache (borrowed; loop thread only; outlives the daemon's serve):
 * when the router's hints of this worker start over (a lost heartbeat, a
 * new registration), every block it holds is hinted again, so the router's
 * view converges to it.  Before serve. */
void epd_daemon_set_prefix_cache(epd_daemon_t *d, const epd_kvcache_t *cache);
/* Block key hint `hint` (epd_prefix_hint) was cached (added) or evicted:
 * queued for the router's KV-aware routing (a no-op without --router or a
 * root).  Loop thread; never blocks. */
void epd_daemon_prefix_hint(epd_daemon_t *d, uint64_t hint, int added);

/* Nonzero when the message's sender (env->sender, validated) is the router
 * this worker registered with (--router): its queued prompts are reported
 * apart (epd_daemon_load_t.router_queued_tokens).  Loop thread. */
int epd_daemon_sent_by_router(epd_daemon_t *d, const Epd__Envelope *env);

/* What the ready line written by epd_daemon_run starts with (e.g. the
 * router's "http=HOST:PORT"), copied; call from ops->setup. */
void epd_daemon_set_ready_prefix(epd_daemon_t *d, const char *prefix);

/* The role's part of /metrics (--metrics-addr): appended after the
 * daemon's own families (requests, load, the fence) on every scrape, on
 * the loop thread; `model` is the label value to use (escaped by
 * epd_prom_*).  Call from ops->setup (or before serve). */
typedef void (*epd_daemon_metrics_cb_t)(void *arg, const char *model, epd_prom_text_t *out);
void epd_daemon_set_metrics(epd_daemon_t *d, epd_daemon_metrics_cb_t cb, void *arg);

/* The `model` label of this worker's metrics: --served-model-name, else
 * the --model folder's name. */
const char *epd_daemon_metrics_model(const epd_daemon_t *d);

/* Drives a transport the role made itself (the router's client) instead
 * of the daemon's own; borrowed until epd_daemon_serve returns, which
 * stops driving it before step 5. */
void epd_daemon_drive_xport(epd_daemon_t *d, epd_xport_t *x);

/* Asks for a pump pass (ops->on_pump) at the top of the loop. */
void epd_daemon_kick(epd_daemon_t *d);

/* Drains as if asked by the Drain RPC (logs once; ops->on_drain). */
void epd_daemon_drain(epd_daemon_t *d, const char *who);

/* Starts the stop order as a signal would (e.g. the role cannot go on). */
void epd_daemon_stop(epd_daemon_t *d);

/*
 * A warning a peer can trigger at will (garbage, stale or refused
 * messages): logged at most 20 times a second per daemon, the rest
 * counted and summarized.  Counts every call in epd_daemon_refusals.
 */
void epd_daemon_refuse_log(epd_daemon_t *d, uint64_t req_id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
uint64_t epd_daemon_refusals(const epd_daemon_t *d);
uint64_t epd_daemon_bad_frames(const epd_daemon_t *d);

#endif
