/*
 * epd_registrar.c — RegisterWorker / Heartbeat towards the router, on a
 * thread of its own (see epd_registrar.h for the contract).
 *
 * Thread life:
 *   UNREGISTERED  RegisterWorker every retry_ms until accepted=true;
 *   REGISTERED    Heartbeat every interval (fixed rate from the previous
 *                 send); known=false -> UNREGISTERED at once; a failed
 *                 heartbeat is only counted (the router decides when we
 *                 are dead, and answers known=false when we come back).
 * Every wait is pthread_cond_timedwait on CLOCK_MONOTONIC, woken by stop.
 *
 * Load snapshot: a seqlock with one writer (the loop thread).  The fields
 * are atomics read and written relaxed, so the race the sequence counter
 * detects is not undefined behaviour; the reader retries while the counter
 * is odd or moved.
 */
#include "epd_registrar.h"

#include <pthread.h>
#include <sched.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "epd_alloc.h"
#include "epd_bytes.h"
#include "epd_hash.h"
#include "epd_log.h"
#include "epd_msg.h"
#include "epd_rpc.h"
#include "epd_time.h"

#define EPD_REG_FAIL_LOG_NS (60 * EPD_NSEC_PER_SEC)
#define EPD_REG_DEFAULT_INTERVAL_MS 500
#define EPD_REG_ERR_CAP 256
#define EPD_REG_HINTS_PER_BEAT 4096 /* KV hints one heartbeat carries at most */

struct epd_registrar {
    uv_loop_t *loop;
    uv_timer_t timer;
    uv_async_t async;
    int open_handles;
    /* configuration (copies) */
    char *router;
    void *request;
    size_t request_len;
    unsigned char *secret; /* [secret_len], wiped at free; NULL: unsigned calls */
    size_t secret_len;
    char worker_id[128];
    uint64_t epoch_start_ns, epoch_nonce;
    epd_registrar_load_cb_t load_cb;
    epd_registrar_drain_cb_t drain_cb;
    epd_registrar_joined_cb_t joined_cb;
    epd_registrar_resync_cb_t resync_cb;
    void *cb_arg;
    const char *comp;
    uint32_t retry_ms, call_timeout_ms, publish_ms;
    /* the thread */
    pthread_t thread;
    pthread_mutex_t mutex; /* guards `stop` for the condition variable only */
    pthread_cond_t cond;
    int stop;
    /* load seqlock: written by the loop thread, read by the registrar's */
    atomic_uint seq;
    atomic_uint_fast32_t l_queue_depth, l_kv_blocks_free, l_state_slots_free, l_running;
    atomic_uint_fast64_t l_queued_tokens, l_router_queued, l_bytes_sent, l_bytes_received;
    atomic_uint_fast64_t l_preemptions, l_recomputed, l_wasted;
    atomic_int l_draining;
    atomic_uint_fast64_t l_prefix[EPD_PREFIX_STATS_WORDS];
    /* KV hints: a ring of events (bit 0: added), loop -> thread */
    uint64_t *hints;
    size_t hint_mask;
    atomic_size_t hint_head, hint_tail; /* thread pops at head, loop pushes at tail */
    atomic_int hint_lost;               /* the ring overflowed: the router must reset */
    int hint_reset;                     /* thread: the next heartbeat resets */
    atomic_uint_fast32_t l_links[EPD_REGISTRAR_LINK_CLASSES];
    atomic_uint_fast32_t l_quarantined, l_grants_held;
    atomic_uint_fast64_t l_late_refused;
    /* hint_tail when the snapshot was taken: a heartbeat carries the KV
     * hints pushed up to there and no further, so the hints the router
     * reads are never newer than the load beside them (a block cached
     * after the snapshot would come with a queue that still counts the
     * prompt that made it) */
    atomic_size_t l_hint_tail;
    /* thread -> loop */
    atomic_int drain_posted; /* drain reported to the loop (once) */
    atomic_int drain_delivered;
    atomic_int joined_posted; /* the first acceptance reported to the loop (once) */
    int joined_delivered;     /* loop */
    atomic_int resync_posted; /* the router's hints were reset: resync_cb wanted */
    /* counters (thread writes, anyone reads) */
    atomic_uint_fast64_t n_attempts, n_registered, n_hb_ok, n_hb_failed, n_unknown;
    atomic_uint_fast32_t interval_ms;
    /* the router's epoch (RegisterResponse.router_epoch) as a tag
     * (epd_registrar_epoch_tag; 0: none yet): thread -> loop */
    atomic_uint_fast64_t router_tag;
};

/* ------------------------------------------------------------------ load */

void epd_registrar_publish(epd_registrar_t *reg, const epd_registrar_load_t *load)
{
    unsigned s = atomic_load_explicit(&reg->seq, memory_order_relaxed);

    atomic_store_explicit(&reg->seq, s + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&reg->l_queue_depth, load->queue_depth, memory_order_relaxed);
    atomic_store_explicit(&reg->l_queued_tokens, load->queued_tokens, memory_order_relaxed);
    atomic_store_explicit(&reg->l_router_queued, load->router_queued_tokens, memory_order_relaxed);
    atomic_store_explicit(&reg->l_kv_blocks_free, load->kv_blocks_free, memory_order_relaxed);
    atomic_store_explicit(&reg->l_state_slots_free, load->state_slots_free, memory_order_relaxed);
    atomic_store_explicit(&reg->l_running, load->running_requests, memory_order_relaxed);
    atomic_store_explicit(&reg->l_bytes_sent, load->kv_bytes_sent, memory_order_relaxed);
    atomic_store_explicit(&reg->l_bytes_received, load->kv_bytes_received, memory_order_relaxed);
    atomic_store_explicit(&reg->l_preemptions, load->preemptions, memory_order_relaxed);
    atomic_store_explicit(&reg->l_recomputed, load->recomputed_tokens, memory_order_relaxed);
    atomic_store_explicit(&reg->l_wasted, load->wasted_prefill_tokens, memory_order_relaxed);
    atomic_store_explicit(&reg->l_draining, load->draining != 0, memory_order_relaxed);
    for (size_t i = 0; i < EPD_PREFIX_STATS_WORDS; i++) {
        uint64_t w;

        memcpy(&w, (const char *)&load->prefix + i * sizeof(w), sizeof(w));
        atomic_store_explicit(&reg->l_prefix[i], w, memory_order_relaxed);
    }
    for (int i = 0; i < EPD_REGISTRAR_LINK_CLASSES; i++) {
        atomic_store_explicit(&reg->l_links[i], load->links[i], memory_order_relaxed);
    }
    atomic_store_explicit(&reg->l_quarantined, load->quarantined, memory_order_relaxed);
    atomic_store_explicit(&reg->l_grants_held, load->grants_held, memory_order_relaxed);
    atomic_store_explicit(&reg->l_late_refused, load->late_writes_refused, memory_order_relaxed);
    /* the loop thread is the one that pushes hints: its own tail */
    atomic_store_explicit(&reg->l_hint_tail,
                          atomic_load_explicit(&reg->hint_tail, memory_order_relaxed),
                          memory_order_relaxed);
    atomic_store_explicit(&reg->seq, s + 2, memory_order_release);
}

/* The snapshot, and the hint ring's tail when it was taken. */
static void epd_registrar_snapshot(epd_registrar_t *reg, epd_registrar_load_t *load_p,
                                   size_t *hint_tail_p)
{
    epd_registrar_load_t l;
    size_t hint_tail;
    unsigned s1, s2;

    for (;;) {
        s1 = atomic_load_explicit(&reg->seq, memory_order_acquire);
        if (s1 & 1u) {
            /* the writer is mid-update (a few stores; it never blocks there,
             * but it may be preempted: let it run) */
            sched_yield();
            continue;
        }
        l.queue_depth = (uint32_t)atomic_load_explicit(&reg->l_queue_depth, memory_order_relaxed);
        l.queued_tokens =
            (uint64_t)atomic_load_explicit(&reg->l_queued_tokens, memory_order_relaxed);
        l.router_queued_tokens =
            (uint64_t)atomic_load_explicit(&reg->l_router_queued, memory_order_relaxed);
        l.kv_blocks_free =
            (uint32_t)atomic_load_explicit(&reg->l_kv_blocks_free, memory_order_relaxed);
        l.state_slots_free =
            (uint32_t)atomic_load_explicit(&reg->l_state_slots_free, memory_order_relaxed);
        l.running_requests = (uint32_t)atomic_load_explicit(&reg->l_running, memory_order_relaxed);
        l.kv_bytes_sent = (uint64_t)atomic_load_explicit(&reg->l_bytes_sent, memory_order_relaxed);
        l.kv_bytes_received =
            (uint64_t)atomic_load_explicit(&reg->l_bytes_received, memory_order_relaxed);
        l.preemptions = (uint64_t)atomic_load_explicit(&reg->l_preemptions, memory_order_relaxed);
        l.recomputed_tokens =
            (uint64_t)atomic_load_explicit(&reg->l_recomputed, memory_order_relaxed);
        l.wasted_prefill_tokens =
            (uint64_t)atomic_load_explicit(&reg->l_wasted, memory_order_relaxed);
        l.draining = atomic_load_explicit(&reg->l_draining, memory_order_relaxed);
        for (size_t i = 0; i < EPD_PREFIX_STATS_WORDS; i++) {
            uint64_t w = (uint64_t)atomic_load_explicit(&reg->l_prefix[i], memory_order_relaxed);

            memcpy((char *)&l.prefix + i * sizeof(w), &w, sizeof(w));
        }
        for (int i = 0; i < EPD_REGISTRAR_LINK_CLASSES; i++) {
            l.links[i] = (uint32_t)atomic_load_explicit(&reg->l_links[i], memory_order_relaxed);
        }
        l.quarantined = (uint32_t)atomic_load_explicit(&reg->l_quarantined, memory_order_relaxed);
        l.grants_held = (uint32_t)atomic_load_explicit(&reg->l_grants_held, memory_order_relaxed);
        l.late_writes_refused =
            (uint64_t)atomic_load_explicit(&reg->l_late_refused, memory_order_relaxed);
        hint_tail = atomic_load_explicit(&reg->l_hint_tail, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        s2 = atomic_load_explicit(&reg->seq, memory_order_relaxed);
        if (s1 == s2) {
            break;
        }
    }
    *load_p = l;
    *hint_tail_p = hint_tail;
}

void epd_registrar_load_read(epd_registrar_t *reg, epd_registrar_load_t *load_p)
{
    size_t hint_tail;

    epd_registrar_snapshot(reg, load_p, &hint_tail);
}

static void epd_registrar_on_timer(uv_timer_t *timer)
{
    epd_registrar_t *reg = timer->data;
    epd_registrar_load_t l;

    memset(&l, 0, sizeof(l));
    reg->load_cb(reg->cb_arg, &l);
    epd_registrar_publish(reg, &l);
}

static void epd_registrar_on_async(uv_async_t *async)
{
    epd_registrar_t *reg = async->data;

    if (atomic_load(&reg->joined_posted) && !reg->joined_delivered) {
        reg->joined_delivered = 1;
        if (reg->joined_cb != NULL) {
            reg->joined_cb(reg->cb_arg);
        }
    }
    if (atomic_load(&reg->drain_posted) && !atomic_exchange(&reg->drain_delivered, 1)) {
        if (reg->drain_cb != NULL) {
            reg->drain_cb(reg->cb_arg);
        }
    }
    if (atomic_exchange(&reg->resync_posted, 0) && reg->resync_cb != NULL) {
        reg->resync_cb(reg->cb_arg); /* pushes every hint it holds again */
    }
}

/* Registrar thread: the router's hints of this worker start over (the next
 * heartbeat says prefix_reset): the loop is asked to push every block it
 * holds as an added hint again, so that the router's view converges to the
 * cache instead of keeping only what happens next. */
static void epd_registrar_hints_restart(epd_registrar_t *reg)
{
    if (reg->hints == NULL) {
        return;
    }
    reg->hint_reset = 1;
    if (reg->resync_cb != NULL && !atomic_exchange(&reg->resync_posted, 1)) {
        uv_async_send(&reg->async);
    }
}

void epd_registrar_counts(epd_registrar_t *reg, epd_registrar_counts_t *counts_p)
{
    epd_registrar_counts_t c;

    c.register_attempts = atomic_load(&reg->n_attempts);
    c.registrations = atomic_load(&reg->n_registered);
    c.heartbeats_ok = atomic_load(&reg->n_hb_ok);
    c.heartbeats_failed = atomic_load(&reg->n_hb_failed);
    c.unknown = atomic_load(&reg->n_unknown);
    c.drain_requested = atomic_load(&reg->drain_posted);
    c.heartbeat_interval_ms = (uint32_t)atomic_load(&reg->interval_ms);
    *counts_p = c;
}

/* ---------------------------------------------------------------- thread */

/* Waits until `deadline_ns` (monotonic) or stop; nonzero when stopping. */
static int epd_registrar_wait_until(epd_registrar_t *reg, uint64_t deadline_ns)
{
    int stop;

    pthread_mutex_lock(&reg->mutex);
    while (!reg->stop && epd_time_now_ns() < deadline_ns) {
        struct timespec ts;

        ts.tv_sec = (time_t)(deadline_ns / EPD_NSEC_PER_SEC);
        ts.tv_nsec = (long)(deadline_ns % EPD_NSEC_PER_SEC);
        pthread_cond_timedwait(&reg->cond, &reg->mutex, &ts);
    }
    stop = reg->stop;
    pthread_mutex_unlock(&reg->mutex);
    return stop;
}

static int epd_registrar_stopping(epd_registrar_t *reg)
{
    int stop;

    pthread_mutex_lock(&reg->mutex);
    stop = reg->stop;
    pthread_mutex_unlock(&reg->mutex);
    return stop;
}

/* A channel to the router whose calls carry the secret, if any. */
static int epd_registrar_connect(epd_registrar_t *reg, epd_rpc_client_t **client)
{
    if (*client != NULL) {
        return 0;
    }
    if (epd_rpc_client_create(reg->router, client) != EPD_OK) {
        return -1;
    }
    if (reg->secret != NULL &&
        epd_rpc_client_set_auth(*client, reg->secret, reg->secret_len) != EPD_OK) {
        epd_rpc_client_destroy(*client);
        *client = NULL;
        return -1;
    }
    return 0;
}

/* A failed call: the channel is made anew before the next one (gRPC's
 * reconnect backoff would otherwise delay reaching a router that came up). */
static void epd_registrar_reset_channel(epd_rpc_client_t **client)
{
    epd_rpc_client_destroy(*client);
    *client = NULL;
}

/* An epoch as one word (0 only for none: {0, 0}). */
static uint64_t epd_registrar_epoch_tag(uint64_t start_time_ns, uint64_t nonce)
{
    unsigned char b[16];
    uint64_t t;

    if (start_time_ns == 0 && nonce == 0) {
        return 0;
    }
    epd_le_put(b, start_time_ns, 8);
    epd_le_put(b + 8, nonce, 8);
    t = epd_hash64(b, sizeof(b), 0);
    return t != 0 ? t : 1;
}

int epd_registrar_is_router(epd_registrar_t *reg, uint64_t start_time_ns, uint64_t nonce)
{
    uint64_t tag;

    if (reg == NULL) {
        return 0;
    }
    tag = atomic_load_explicit(&reg->router_tag, memory_order_relaxed);
    return tag != 0 && tag == epd_registrar_epoch_tag(start_time_ns, nonce);
}

/* One RegisterWorker.  1: accepted; 0: not (reason logged by the caller). */
static int epd_registrar_register(epd_registrar_t *reg, epd_rpc_client_t **client, char *why,
                                  size_t why_cap)
{
    void *resp = NULL;
    size_t len = 0;
    char err[EPD_REG_ERR_CAP] = "";
    ProtobufCMessage *m = NULL;
    Epd__RegisterResponse *r;
    epd_status_t st;
    int ok;

    atomic_fetch_add(&reg->n_attempts, 1);
    if (epd_registrar_connect(reg, client) != 0) {
        snprintf(why, why_cap, "cannot create a gRPC channel");
        return 0;
    }
    st = epd_rpc_call(*client, EPD_RPC_REGISTER, reg->request, reg->request_len,
                      (int)reg->call_timeout_ms, &resp, &len, err, sizeof(err));
    if (st != EPD_OK) {
        snprintf(why, why_cap, "%s%s%s%s", epd_status_string(st), err[0] != '\0' ? ": " : "", err,
                 st != EPD_ERR_AUTH ? ""
                 : reg->secret != NULL
                     ? " (is --cluster-secret-file the router's file, and the clocks within 30 s?)"
                     : " (the router requires --cluster-secret-file)");
        epd_registrar_reset_channel(client);
        return 0;
    }
    st = epd_proto_unpack(&epd__register_response__descriptor, resp, len, &m);
    epd_free(resp);
    if (st != EPD_OK) {
        snprintf(why, why_cap, "malformed RegisterResponse");
        return 0;
    }
    r = (Epd__RegisterResponse *)m;
    ok = r->accepted;
    if (ok) {
        uint32_t iv = r->heartbeat_interval_ms;

        iv = iv == 0 ? EPD_REG_DEFAULT_INTERVAL_MS : iv < 10 ? 10 : iv > 60000 ? 60000 : iv;
        atomic_store(&reg->interval_ms, iv);
        atomic_store(&reg->router_tag, r->router_epoch != NULL
                                           ? epd_registrar_epoch_tag(r->router_epoch->start_time_ns,
                                                                     r->router_epoch->nonce)
                                           : 0);
        atomic_fetch_add(&reg->n_registered, 1);
        /* a router that (re)accepts this worker knows none of its blocks */
        epd_registrar_hints_restart(reg);
        if (!atomic_exchange(&reg->joined_posted, 1)) {
            uv_async_send(&reg->async);
        }
    } else {
        snprintf(why, why_cap, "refused: %.200s",
                 r->reason != NULL && r->reason[0] != '\0' ? r->reason : "(no reason given)");
    }
    epd_proto_free(m);
    return ok;
}

void epd_registrar_hint(epd_registrar_t *reg, uint64_t hint, int added)
{
    size_t tail, head;

    if (reg == NULL || reg->hints == NULL) {
        return;
    }
    tail = atomic_load_explicit(&reg->hint_tail, memory_order_relaxed);
    head = atomic_load_explicit(&reg->hint_head, memory_order_acquire);
    if (tail - head > reg->hint_mask) {
        atomic_store_explicit(&reg->hint_lost, 1, memory_order_relaxed);
        return;
    }
    reg->hints[tail & reg->hint_mask] = (hint & ~1ull) | (added ? 1u : 0u);
    atomic_store_explicit(&reg->hint_tail, tail + 1, memory_order_release);
}

/* One Heartbeat.  1: the router knows us; 0: register again; -1: failed. */
static int epd_registrar_heartbeat(epd_registrar_t *reg, epd_rpc_client_t **client, char *why,
                                   size_t why_cap)
{
    Epd__HeartbeatRequest hb = EPD__HEARTBEAT_REQUEST__INIT;
    Epd__Epoch epoch = EPD__EPOCH__INIT;
    Epd__Load load = EPD__LOAD__INIT;
    Epd__PrefixCacheStats prefix = EPD__PREFIX_CACHE_STATS__INIT;
    epd_registrar_load_t l;
    unsigned char *buf;
    uint64_t events[EPD_REG_HINTS_PER_BEAT];
    size_t n_events = 0, head, tail, snap_tail;
    void *resp = NULL;
    size_t len = 0, n;
    char err[EPD_REG_ERR_CAP] = "";
    ProtobufCMessage *m = NULL;
    Epd__HeartbeatResponse *r;
    epd_status_t st;
    int known;

    epd_registrar_snapshot(reg, &l, &snap_tail);
    epoch.start_time_ns = reg->epoch_start_ns;
    epoch.nonce = reg->epoch_nonce;
    load.queue_depth = l.queue_depth;
    load.queued_tokens = l.queued_tokens;
    load.router_queued_tokens = l.router_queued_tokens;
    load.kv_blocks_free = l.kv_blocks_free;
    load.state_slots_free = l.state_slots_free;
    load.running_requests = l.running_requests;
    load.kv_bytes_sent = l.kv_bytes_sent;
    load.kv_bytes_received = l.kv_bytes_received;
    load.preemptions = l.preemptions;
    load.recomputed_tokens = l.recomputed_tokens;
    load.wasted_prefill_tokens = l.wasted_prefill_tokens;
    load.draining = l.draining != 0;
    epd_prefix_stats_to_msg(&l.prefix, &prefix);
    load.prefix = &prefix;
    load.links_shm = l.links[EPD_REGISTRAR_LINK_SHM];
    load.links_tcp = l.links[EPD_REGISTRAR_LINK_TCP];
    load.links_rdma = l.links[EPD_REGISTRAR_LINK_RDMA];
    load.links_other = l.links[EPD_REGISTRAR_LINK_OTHER];
    load.quarantined = l.quarantined;
    load.late_writes_refused = l.late_writes_refused;
    load.grants_held = l.grants_held;
    hb.worker_id = reg->worker_id;
    hb.epoch = &epoch;
    hb.load = &load;
    if (reg->hints != NULL) {
        /* a lost event (ring full, a failed heartbeat) resets the router's
         * view of this worker: what it believes then is only what follows */
        if (atomic_exchange_explicit(&reg->hint_lost, 0, memory_order_relaxed)) {
            epd_registrar_hints_restart(reg);
        }
        head = atomic_load_explicit(&reg->hint_head, memory_order_relaxed);
        tail = atomic_load_explicit(&reg->hint_tail, memory_order_acquire);
        /* only what the snapshot saw pushed (see l_hint_tail); the ring
         * only grows between, so snap_tail is at or behind tail */
        if (snap_tail - head <= tail - head) {
            tail = snap_tail;
        }
        while (head != tail && n_events < EPD_REG_HINTS_PER_BEAT) {
            events[n_events++] = reg->hints[head++ & reg->hint_mask];
        }
        atomic_store_explicit(&reg->hint_head, head, memory_order_release);
        hb.n_prefix_events = n_events;
        hb.prefix_events = events;
        hb.prefix_reset = reg->hint_reset != 0;
    }
    n = protobuf_c_message_get_packed_size(&hb.base);
    buf = epd_malloc(n > 0 ? n : 1);
    if (buf == NULL) {
        snprintf(why, why_cap, "out of memory");
        if (n_events > 0) {
            epd_registrar_hints_restart(reg); /* those are lost */
        }
        return -1;
    }
    protobuf_c_message_pack(&hb.base, buf);
    if (epd_registrar_connect(reg, client) != 0) {
        snprintf(why, why_cap, "cannot create a gRPC channel");
        epd_free(buf);
        if (n_events > 0) {
            epd_registrar_hints_restart(reg);
        }
        return -1;
    }
    st = epd_rpc_call(*client, EPD_RPC_HEARTBEAT, buf, n, (int)reg->call_timeout_ms, &resp, &len,
                      err, sizeof(err));
    epd_free(buf);
    if (st != EPD_OK) {
        if (n_events > 0) {
            epd_registrar_hints_restart(reg);
        }
        snprintf(why, why_cap, "%s%s%s", epd_status_string(st), err[0] != '\0' ? ": " : "", err);
        epd_registrar_reset_channel(client);
        return -1;
    }
    st = epd_proto_unpack(&epd__heartbeat_response__descriptor, resp, len, &m);
    epd_free(resp);
    if (st != EPD_OK) {
        snprintf(why, why_cap, "malformed HeartbeatResponse");
        return -1;
    }
    r = (Epd__HeartbeatResponse *)m;
    known = r->known ? 1 : 0;
    /* delivered (a router that does not know us starts from nothing anyway) */
    reg->hint_reset = 0;
    if (known && r->drain && !atomic_exchange(&reg->drain_posted, 1)) {
        epd_log_info(reg->comp, 0, "the router %s asks this worker to drain", reg->router);
        uv_async_send(&reg->async);
    }
    epd_proto_free(m);
    return known;
}

/* Logs a failure when it is the first of a run, or a minute after the last
 * line (a router that stays down must not flood the log). */
static void epd_registrar_fail_log(epd_registrar_t *reg, uint64_t *last_ns, uint64_t *suppressed,
                                   const char *what, const char *why)
{
    uint64_t now = epd_time_now_ns();

    if (*last_ns != 0 && now - *last_ns < EPD_REG_FAIL_LOG_NS) {
        (*suppressed)++;
        return;
    }
    epd_log_warn(reg->comp, 0,
                 "%s with the router %s failed: %s (%llu more failures since the "
                 "last line; retrying)",
                 what, reg->router, why, (unsigned long long)*suppressed);
    *last_ns = now;
    *suppressed = 0;
}

static void *epd_registrar_thread(void *arg)
{
    epd_registrar_t *reg = arg;
    epd_rpc_client_t *client = NULL;
    uint64_t reg_fail_ns = 0, reg_suppressed = 0, reg_failures = 0;
    uint64_t hb_fail_ns = 0, hb_suppressed = 0;
    char why[EPD_REG_ERR_CAP + 64];
    int registered = 0;
    uint64_t next_ns = epd_time_now_ns();

    while (!epd_registrar_stopping(reg)) {
        if (!registered) {
            if (epd_registrar_register(reg, &client, why, sizeof(why))) {
                char after[64] = "";

                registered = 1;
                if (reg_failures > 0) {
                    snprintf(after, sizeof(after), " after %llu failed attempts",
                             (unsigned long long)reg_failures);
                }
                epd_log_info(
                    reg->comp, 0, "registered with the router %s as '%s'%s; heartbeat every %u ms",
                    reg->router, reg->worker_id, after, (unsigned)atomic_load(&reg->interval_ms));
                /* a new registration starts a new run of heartbeats */
                hb_fail_ns = 0;
                hb_suppressed = 0;
                reg_fail_ns = 0;
                reg_suppressed = 0;
                reg_failures = 0;
                next_ns = epd_time_now_ns() +
                          (uint64_t)atomic_load(&reg->interval_ms) * EPD_NSEC_PER_MSEC;
            } else {
                reg_failures++;
                epd_registrar_fail_log(reg, &reg_fail_ns, &reg_suppressed, "registration", why);
                next_ns = epd_time_now_ns() + (uint64_t)reg->retry_ms * EPD_NSEC_PER_MSEC;
            }
        } else {
            int k = epd_registrar_heartbeat(reg, &client, why, sizeof(why));
            uint64_t iv_ns = (uint64_t)atomic_load(&reg->interval_ms) * EPD_NSEC_PER_MSEC;
            uint64_t now;

            if (k > 0) {
                atomic_fetch_add(&reg->n_hb_ok, 1);
                if (hb_fail_ns != 0) {
                    epd_log_info(reg->comp, 0, "heartbeats to the router %s go through again",
                                 reg->router);
                    hb_fail_ns = 0;
                    hb_suppressed = 0;
                }
            } else if (k == 0) {
                atomic_fetch_add(&reg->n_hb_ok, 1);
                atomic_fetch_add(&reg->n_unknown, 1);
                epd_log_info(reg->comp, 0,
                             "the router %s does not know this worker: registering "
                             "again",
                             reg->router);
                registered = 0;
                continue;
            } else {
                atomic_fetch_add(&reg->n_hb_failed, 1);
                epd_registrar_fail_log(reg, &hb_fail_ns, &hb_suppressed, "heartbeat", why);
            }
            /* fixed rate; after a stall (a slow call) start afresh from now */
            now = epd_time_now_ns();
            next_ns += iv_ns;
            if (next_ns < now) {
                next_ns = now + iv_ns;
            }
        }
        if (epd_registrar_wait_until(reg, next_ns)) {
            break;
        }
    }
    epd_rpc_client_destroy(client);
    return NULL;
}

/* ------------------------------------------------------------ life cycle */

static void epd_registrar_on_closed(uv_handle_t *h)
{
    epd_registrar_t *reg = h->data;

    if (--reg->open_handles > 0) {
        return;
    }
    pthread_cond_destroy(&reg->cond);
    pthread_mutex_destroy(&reg->mutex);
    epd_free(reg->router);
    epd_free(reg->request);
    epd_free(reg->hints);
    if (reg->secret != NULL) {
        sodium_memzero(reg->secret, reg->secret_len);
        epd_free(reg->secret);
    }
    epd_free(reg);
}

epd_status_t epd_registrar_start(uv_loop_t *loop, const epd_registrar_config_t *config,
                                 epd_registrar_t **reg_p)
{
    epd_registrar_t *reg;
    ProtobufCMessage *m = NULL;
    Epd__RegisterRequest *rr;
    pthread_condattr_t ca;
    size_t rlen;
    epd_status_t status;

    if (config->router == NULL || config->router[0] == '\0' || config->load_cb == NULL ||
        config->request == NULL || config->request_len == 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    if ((config->secret == NULL) != (config->secret_len == 0) ||
        (config->secret != NULL &&
         (config->secret_len < EPD_RPC_SECRET_MIN || config->secret_len > EPD_RPC_SECRET_MAX))) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (epd_proto_unpack(&epd__register_request__descriptor, config->request, config->request_len,
                         &m) != EPD_OK) {
        return EPD_ERR_INVALID_PARAM;
    }
    rr = (Epd__RegisterRequest *)m;
    if (rr->worker == NULL || rr->worker->worker_id == NULL || rr->worker->worker_id[0] == '\0' ||
        strlen(rr->worker->worker_id) >= 128 || rr->worker->epoch == NULL) {
        epd_proto_free(m);
        return EPD_ERR_INVALID_PARAM;
    }
    reg = epd_calloc(1, sizeof(*reg));
    if (reg == NULL) {
        epd_proto_free(m);
        return EPD_ERR_NO_MEMORY;
    }
    snprintf(reg->worker_id, sizeof(reg->worker_id), "%s", rr->worker->worker_id);
    reg->epoch_start_ns = rr->worker->epoch->start_time_ns;
    reg->epoch_nonce = rr->worker->epoch->nonce;
    epd_proto_free(m);

    reg->loop = loop;
    rlen = strlen(config->router) + 1;
    reg->router = epd_malloc(rlen);
    reg->request = epd_malloc(config->request_len);
    if (config->secret != NULL) {
        reg->secret = epd_malloc(config->secret_len);
        if (reg->secret != NULL) {
            memcpy(reg->secret, config->secret, config->secret_len);
            reg->secret_len = config->secret_len;
        }
    }
    if (reg->router == NULL || reg->request == NULL ||
        (config->secret != NULL && reg->secret == NULL)) {
        status = EPD_ERR_NO_MEMORY;
        goto err_free;
    }
    memcpy(reg->router, config->router, rlen);
    memcpy(reg->request, config->request, config->request_len);
    reg->request_len = config->request_len;
    reg->load_cb = config->load_cb;
    reg->drain_cb = config->drain_cb;
    reg->joined_cb = config->joined_cb;
    reg->resync_cb = config->resync_cb;
    reg->cb_arg = config->cb_arg;
    reg->comp = config->log_component != NULL ? config->log_component : "registrar";
    reg->retry_ms = config->retry_ms != 0 ? config->retry_ms : 1000;
    reg->call_timeout_ms = config->call_timeout_ms != 0 ? config->call_timeout_ms : 300;
    reg->publish_ms = config->publish_ms != 0 ? config->publish_ms : 100;
    if (config->hint_capacity > 0) {
        size_t cap = 2;

        while (cap < config->hint_capacity) {
            cap <<= 1;
        }
        reg->hints = epd_malloc(cap * sizeof(*reg->hints));
        if (reg->hints == NULL) {
            status = EPD_ERR_NO_MEMORY;
            goto err_free;
        }
        reg->hint_mask = cap - 1;
    }
    atomic_init(&reg->hint_head, 0);
    atomic_init(&reg->hint_tail, 0);
    atomic_init(&reg->hint_lost, 0);
    atomic_init(&reg->l_hint_tail, 0);
    atomic_init(&reg->router_tag, 0);
    atomic_init(&reg->seq, 0);
    atomic_init(&reg->interval_ms, EPD_REG_DEFAULT_INTERVAL_MS);

    if (pthread_condattr_init(&ca) != 0) {
        status = EPD_ERR_FATAL;
        goto err_free;
    }
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pthread_cond_init(&reg->cond, &ca) != 0) {
        pthread_condattr_destroy(&ca);
        status = EPD_ERR_FATAL;
        goto err_free;
    }
    pthread_condattr_destroy(&ca);
    if (pthread_mutex_init(&reg->mutex, NULL) != 0) {
        status = EPD_ERR_FATAL;
        goto err_cond;
    }
    if (uv_timer_init(loop, &reg->timer) != 0) {
        status = EPD_ERR_FATAL;
        goto err_mutex;
    }
    reg->timer.data = reg;
    reg->open_handles = 1;
    if (uv_async_init(loop, &reg->async, epd_registrar_on_async) != 0) {
        status = EPD_ERR_FATAL;
        goto err_handles;
    }
    reg->async.data = reg;
    reg->open_handles = 2;
    epd_registrar_on_timer(&reg->timer); /* the first heartbeat has a load */
    uv_timer_start(&reg->timer, epd_registrar_on_timer, reg->publish_ms, reg->publish_ms);
    if (pthread_create(&reg->thread, NULL, epd_registrar_thread, reg) != 0) {
        status = EPD_ERR_FATAL;
        goto err_handles;
    }
    *reg_p = reg;
    return EPD_OK;

err_handles:
    /* the close callbacks free everything (the loop runs them later) */
    uv_timer_stop(&reg->timer);
    uv_close((uv_handle_t *)&reg->timer, epd_registrar_on_closed);
    if (reg->open_handles == 2) {
        uv_close((uv_handle_t *)&reg->async, epd_registrar_on_closed);
    }
    return status;
err_mutex:
    pthread_mutex_destroy(&reg->mutex);
err_cond:
    pthread_cond_destroy(&reg->cond);
err_free:
    epd_free(reg->router);
    epd_free(reg->request);
    epd_free(reg->hints);
    if (reg->secret != NULL) {
        sodium_memzero(reg->secret, reg->secret_len);
        epd_free(reg->secret);
    }
    epd_free(reg);
    return status;
}

void epd_registrar_stop(epd_registrar_t *reg)
{
    if (reg == NULL) {
        return;
    }
    pthread_mutex_lock(&reg->mutex);
    reg->stop = 1;
    pthread_cond_signal(&reg->cond);
    pthread_mutex_unlock(&reg->mutex);
    pthread_join(reg->thread, NULL);
    uv_timer_stop(&reg->timer);
    uv_close((uv_handle_t *)&reg->timer, epd_registrar_on_closed);
    uv_close((uv_handle_t *)&reg->async, epd_registrar_on_closed);
}

/* the router tells counters from gauges by word index */
_Static_assert(offsetof(epd_prefix_stats_t, cached_blocks) == 10 * 8 &&
                   offsetof(epd_prefix_stats_t, tier_stored) == 12 * 8 &&
                   offsetof(epd_prefix_stats_t, tier_host_bytes) == 20 * 8 &&
                   sizeof(epd_prefix_stats_t) == 22 * 8,
               "EPD_PREFIX_STATS_GAUGE is out of date");

void epd_prefix_stats_to_msg(const epd_prefix_stats_t *s, Epd__PrefixCacheStats *m)
{
    m->requests = s->requests;
    m->prompt_tokens = s->prompt_tokens;
    m->hit_tokens = s->hit_tokens;
    m->computed_tokens = s->computed_tokens;
    m->replayed_tokens = s->replayed_tokens;
    m->replay_cut = s->replay_cut;
    m->checkpoints_taken = s->checkpoints_taken;
    m->checkpoints_restored = s->checkpoints_restored;
    m->checkpoints_dropped = s->checkpoints_dropped;
    m->evictions = s->evictions;
    m->cached_blocks = s->cached_blocks;
    m->checkpoints_held = s->checkpoints_held;
    m->tier_stored = s->tier_stored;
    m->tier_spilled = s->tier_spilled;
    m->tier_restored_host = s->tier_restored_host;
    m->tier_restored_disk = s->tier_restored_disk;
    m->tier_restore_us = s->tier_restore_us;
    m->tier_checksum_failures = s->tier_checksum_failures;
    m->tier_refused_files = s->tier_refused_files;
    m->tier_dropped = s->tier_dropped;
    m->tier_host_bytes = s->tier_host_bytes;
    m->tier_disk_bytes = s->tier_disk_bytes;
}

void epd_prefix_stats_from_msg(const Epd__PrefixCacheStats *m, epd_prefix_stats_t *s_p)
{
    memset(s_p, 0, sizeof(*s_p));
    if (m == NULL) {
        return;
    }
    s_p->requests = m->requests;
    s_p->prompt_tokens = m->prompt_tokens;
    s_p->hit_tokens = m->hit_tokens;
    s_p->computed_tokens = m->computed_tokens;
    s_p->replayed_tokens = m->replayed_tokens;
    s_p->replay_cut = m->replay_cut;
    s_p->checkpoints_taken = m->checkpoints_taken;
    s_p->checkpoints_restored = m->checkpoints_restored;
    s_p->checkpoints_dropped = m->checkpoints_dropped;
    s_p->evictions = m->evictions;
    s_p->cached_blocks = m->cached_blocks;
    s_p->checkpoints_held = m->checkpoints_held;
    s_p->tier_stored = m->tier_stored;
    s_p->tier_spilled = m->tier_spilled;
    s_p->tier_restored_host = m->tier_restored_host;
    s_p->tier_restored_disk = m->tier_restored_disk;
    s_p->tier_restore_us = m->tier_restore_us;
    s_p->tier_checksum_failures = m->tier_checksum_failures;
    s_p->tier_refused_files = m->tier_refused_files;
    s_p->tier_dropped = m->tier_dropped;
    s_p->tier_host_bytes = m->tier_host_bytes;
    s_p->tier_disk_bytes = m->tier_disk_bytes;
}
