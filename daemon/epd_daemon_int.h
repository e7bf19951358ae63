/*
 * epd_daemon_int.h — the daemon runtime's internals, shared by its files:
 *
 *   epd_daemon.c        create, serve (start-up and the stop order), the
 *                       loop's handles (signals, tick, pump), the transport
 *                       callbacks, accessors
 *   epd_daemon_rpc.c    the control plane: Health / Status / Drain, drain,
 *                       the RegisterRequest and the registrar's callbacks
 *   epd_daemon_flags.c  the common flags and epd_daemon_main
 *   epd_daemon_addr.c   addresses (bind, advertise, data) resolved once, the
 *                       cluster secret or the loopback-only rule
 *   epd_daemon_log.c    rate-limited refusal lines
 *   epd_link.c          links and their outboxes
 *   epd_peer.c          peers by incarnation, the epoch rule
 *   epd_daemon_bench.c  a benchmark's clock probes and trace fetches
 *
 * Calls between them go one way (the file first named calls the others):
 *   epd_daemon.c -> epd_daemon_rpc.c, epd_daemon_addr.c, epd_peer.c, epd_link.c,
 *                   epd_daemon_log.c, epd_daemon_bench.c
 *   epd_peer.c -> epd_link.c -> epd_daemon_log.c
 * Lower files reach the loop's handles only through the fields below
 * (epd__daemon_pump_kick starts the pump handle with the callback
 * epd_daemon.c stored in it), never by calling up.
 */
#ifndef EPD_DAEMON_INT_H
#define EPD_DAEMON_INT_H

#include <stdint.h>

#include <uv.h>

#include "epd_addr.h"
#include "epd_daemon.h"
#include "epd_layout.h"
#include "epd_link.h"
#include "epd_log.h"
#include "epd_peer.h"
#include "epd_registrar.h"
#include "epd_secret.h"
#include "epd_rpc.h"
#include "epd_xport_uv.h"

typedef struct epd_outmsg {
    struct epd_outmsg *next;
    size_t len;
    unsigned flags;
    unsigned char data[];
} epd_outmsg_t;

struct epd_link {
    epd_daemon_t *d;
    epd_link_kind_t kind;
    epd_xport_ep_t *ep; /* NULL once closed */
    uint32_t refs;      /* the daemon's list holds one while not freed */
    int down;           /* failed or closed by its peer's death: on_link_down owed/ran */
    int closed;         /* closed by its owner (no upcall) */
    int down_reported;  /* on_link_down ran */
    int connected;      /* handshake done (IN: always) */
    epd_status_t status;
    epd_outmsg_t *out_head, *out_tail;
    uint32_t n_out;
    int on_flush;          /* in d->flush list */
    epd_link_t *flush_next;
    epd_peer_t *peer; /* the incarnation it belongs to (not counted) */
    epd_link_t *peer_next; /* peer->in_links */
    void *user;
    epd_link_t *prev, *next; /* d->links */
};

struct epd_peer {
    epd_daemon_t *d;
    char worker_id[EPD_WORKER_ID_MAX];
    epd_msg_epoch_t epoch;
    int role;
    epd_peer_state_t state;
    epd_status_t dead_status;
    uint32_t refs;       /* role references */
    int listed;          /* the live incarnation of its id */
    int closed;          /* its links are closed (on_peer_closed ran) */
    epd_link_t *link;    /* ours; a counted reference, NULL once closed */
    epd_link_t *in_links; /* its own to us (peer_next chain), not counted */
    uint64_t heard_ns;
    epd_xport_rkey_t *rkey; /* unpacked on link->ep; dies with it */
    unsigned char rkey_blob[EPD_XPORT_RKEY_MAX];
    size_t rkey_len;
    /* the fence: this incarnation's grant on the daemon's receive region
     * (NULL: none yet), its packed key, and whose process it is */
    epd_xport_grant_t *grant;
    unsigned char gkey[EPD_XPORT_RKEY_MAX];
    size_t gkey_len;
    uint64_t xid;       /* the peer's transport id (limbo of our writes to it) */
    epd_proc_id_t proc; /* its process (from a handshake), when proc_known */
    int proc_known;
    unsigned char *addr; /* its data-plane address (a new link after its death) */
    size_t addr_len;
    void *user;
    epd_peer_t *next; /* d->peers */
};

struct epd_daemon {
    epd_daemon_config_t cfg;
    epd_daemon_ops_t ops;
    const epd_daemon_flags_t *fl;
    const char *log; /* role name */
    char worker_id[EPD_WORKER_ID_MAX];
    char model_name[EPD_WORKER_ID_MAX];
    epd_msg_epoch_t epoch;
    uint64_t seq; /* envelope sequence */
    uv_loop_t loop;
    int loop_ready;
    uv_signal_t sigterm, sigint, sigusr1;
    uv_timer_t tick;
    uv_idle_t pump;
    uv_idle_cb pump_cb; /* epd_daemon.c's, for epd__daemon_pump_kick */
    uv_check_t flush;   /* retries outboxes after each loop iteration */
    int handles_ready;
    int pump_on, flush_on;
    int stopping;
    int stop_done; /* step 2 ran */
    int draining;
    /* the router accepted this worker (always 1 without --router): until
     * then no ready file, grpc.health.v1 NOT_SERVING */
    int joined;
    char ready_line[1024]; /* what the ready file gets, once joined */
    epd_trace_t *trace;
    char ready_prefix[EPD_ADDR_MAX + 16]; /* epd_daemon_run's ready line starts so */
    char trace_thread[64]; /* the loop thread's track name (the recorder borrows it) */
    /* transport */
    epd_xport_t *x;  /* ours (with_xport) */
    epd_xport_t *dx; /* the one driven: ours or the role's */
    epd_xport_uv_t *xuv;
    const void *addr;
    size_t addr_len;
    unsigned char *tx_buf; /* [tx_cap] frame scratch */
    size_t tx_cap;
    /* control plane */
    epd_rpc_server_t *rpc;
    int rpc_port;
    /* addresses, resolved once at create (epd_daemon_addr.c) */
    char control_bind[EPD_ADDR_MAX];        /* --control-addr, its host numeric */
    char advertise_host[EPD_ADDR_HOST_MAX]; /* numeric: what others reach us at */
    char data_host[EPD_ADDR_HOST_MAX];      /* numeric: the data plane's local address */
    char data_iface[64];                    /* the interface holding data_host */
    char router_addr[EPD_ADDR_MAX];         /* --router, its host numeric ("": none) */
    char control_advertised[EPD_ADDR_MAX];  /* advertise_host:bound port (serving) */
    char metrics_bind[EPD_ADDR_MAX];        /* --metrics-addr, its host numeric ("": off) */
    /* /metrics (epd_daemon_metrics.c) */
    struct epd_metrics_http *metrics;
    epd_daemon_metrics_cb_t metrics_cb; /* the role's part (NULL: none) */
    void *metrics_arg;
    /* SIGTERM drains (--drain-grace-ms): stop once the role is idle or at
     * the deadline */
    int term_drain;
    uint64_t term_deadline_ns;
    epd_registrar_t *registrar;
    epd_daemon_capacity_t capacity;
    int have_layout;
#define EPD_DAEMON_HINTS_MAX 65536 /* KV hints queued between two heartbeats */
    int have_prefix_root;
    unsigned char prefix_root[32];
    const epd_kvcache_t *prefix_cache; /* the role's (borrowed): resync of hints */
    Epd__KvLayout layout_msg;
    char pattern[EPD_LAYOUT_PATTERN_MAX];
    /* links and peers */
    epd_link_t *links;
    epd_link_t *flush_head; /* links with queued messages */
    uint32_t n_out;         /* queued messages, all links */
    size_t out_bytes;
    int links_dirty; /* a link went down or closed: the pump looks */
    epd_peer_t *peers;
    int peers_dirty; /* a peer died: the pump closes it */
    epd_daemon_counts_t counts;
    epd_secret_t secret; /* --cluster-secret-file (len 0: none) */
    struct epd_owed *owed; /* WritesQuiesced owed to dead incarnations (epd_peer.c) */
    uint32_t n_owed;
    uint64_t forged;     /* envelopes whose sender is not their link's identity */
    /* refusals */
    uint64_t refusals, bad_frames;
    uint64_t fault_msgs; /* messages handled, for <role>.die_after_msgs */
    epd_log_limit_t refuse_limit;
    uint64_t refuse_window_ns;
    uint64_t refuse_suppressed;
};

/* Starts the pump handle (deferred work at the top of the loop). */
static inline void epd__daemon_pump_kick(epd_daemon_t *d)
{
    if (!d->pump_on && d->handles_ready) {
        d->pump_on = 1;
        uv_idle_start(&d->pump, d->pump_cb);
    }
}

/* ---- epd_link.c ---- */
/* An endpoint becomes a link (one reference: the daemon's list). */
epd_link_t *epd__link_new(epd_daemon_t *d, epd_link_kind_t kind, epd_xport_ep_t *ep);
/* The transport failed the link's endpoint, or its peer died: the link is
 * down (sends fail), reported and closed from the pump.  Nested-safe. */
void epd__link_fail(epd_link_t *link, epd_status_t status);
/* The same, and its endpoint closed now (pump context only: pending
 * writes complete into their owners' callbacks right here). */
void epd__link_shut(epd_link_t *link, epd_status_t status);
/* Retries every outbox (the flush handle's callback, the tick). */
void epd__link_flush_all(epd_daemon_t *d);
void epd__link_on_flush(uv_check_t *check);
/* Pump: closes the endpoints of links that went down (after the caller
 * reported them) and frees links nobody references. */
void epd__link_reap(epd_daemon_t *d);
/* Shutdown: closes every endpoint (no upcalls). */
void epd__link_close_all(epd_daemon_t *d);
/* Destroy: frees every link whatever its references. */
void epd__link_free_all(epd_daemon_t *d);

/* ---- epd_peer.c ---- */
/* The epoch rule for a message from `env`'s sender that came on `from`:
 * returns nonzero when it must be dropped (an older epoch of a live
 * incarnation: refused with an Error unless it is one); kills an older
 * incarnation when a newer epoch speaks; marks the live one heard and
 * adopts `from` as its IN link. */
int epd__peer_on_sender(epd_daemon_t *d, epd_link_t *from, const Epd__Envelope *env);
/* A link of `peer` went down: the peer dies with it. */
void epd__peer_link_down(epd_peer_t *peer, epd_status_t status);
/* Pump: closes the links of dead peers (ops->on_peer_closed), frees the
 * unreferenced.  Returns nonzero when it did anything. */
int epd__peer_reap(epd_daemon_t *d);
/* Destroy: frees every peer record. */
void epd__peer_free_all(epd_daemon_t *d);
/* Shutdown (before the role's regions go): closes every peer's grant. */
void epd__peer_close_grants(epd_daemon_t *d);
/* Tick: sends the WritesQuiesced owed to dead incarnations whose writes
 * are out of limbo (epd_peer_owe_quiesced). */
void epd__peer_owed_flush(epd_daemon_t *d, uint64_t now_ns);

/* ---- epd_daemon_addr.c ---- */
/* The cluster secret (or the loopback-only rule), every address resolved
 * once, UCX's devices for the data plane.  EPD_OK or the failure (logged). */
epd_status_t epd__daemon_addresses(epd_daemon_t *d);

/* ---- epd_daemon_metrics.c ---- */
/* Starts /metrics on metrics_bind (a no-op without --metrics-addr).
 * EPD_OK or the failure (logged). */
epd_status_t epd__daemon_metrics_start(epd_daemon_t *d);
/* Step 4 of the stop order: the listener and its connections close. */
void epd__daemon_metrics_stop(epd_daemon_t *d);
/* Load with the daemon's parts (epd_daemon_rpc.c): links, fence, draining. */
void epd__daemon_load_now(epd_daemon_t *d, epd_daemon_load_t *l);

/* ---- epd_daemon_bench.c ---- */
/* A benchmark's ClockProbe or TraceFetch (rule 39) that came on `from`:
 * answered at once; returns 1 when `env` was one of them (the caller still
 * frees it), 0 otherwise.  Loop thread. */
int epd__daemon_bench_on_msg(epd_daemon_t *d, epd_link_t *from, const Epd__Envelope *env);

/* ---- epd_daemon_rpc.c ---- */
int epd__daemon_on_rpc(void *arg, const char *method, const void *req, size_t req_len,
                       void **resp_p, size_t *resp_len_p, char *err, size_t err_cap);
/* Starts the registrar (--router); EPD_OK when not asked to register.
 * joined_cb(d) runs on the loop thread when the router accepted this
 * worker (epd_daemon.c's: the ready file is written, grpc.health.v1
 * answers SERVING). */
epd_status_t epd__daemon_register(epd_daemon_t *d, const char *control_address,
                                  void (*joined_cb)(void *d));

#endif
