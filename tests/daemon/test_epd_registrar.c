/*
 * Tests of daemon/epd_registrar.c against a fake router: an epd_rpc server
 * on its own thread and loop answering RegisterWorker and Heartbeat, while
 * the registrar's loop (this thread) plays the daemon.  The fake router
 * checks every field, refuses the first registration, answers known=false
 * once (the registrar must register again) and drain=true (the daemon's
 * drain callback must run once, on its loop thread); the load in every
 * heartbeat must be one consistent snapshot the loop published; stopping
 * is prompt.  Also: a router that comes up late is reached within about
 * one retry, and the seqlock never tears under a hammering writer.
 * With a cluster secret on the fake router: a registrar with the same
 * secret registers and heartbeats; one with another secret, or none, never
 * reaches the router's handler (refused UNAUTHENTICATED, counted by the
 * server) and keeps trying.
 */
#include "epd_test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_msg.h"
#include "epd_registrar.h"
#include "epd_rpc.h"
#include "epd_time.h"

#define WORKER "prefill-t"
#define EPOCH_START 111u
#define EPOCH_NONCE 222u
#define ROUTER_START 333u /* the router's epoch (RegisterResponse.router_epoch) */
#define ROUTER_NONCE 444u
#define SECRET "registrar-test-cluster-secret"
#define OTHER_SECRET "registrar-test-another-secret"

/* ------------------------------------------------------------ fake router */

typedef struct {
    uv_loop_t loop;
    uv_async_t stop;
    epd_rpc_server_t *server;
    pthread_t thread;
    char bind[64];
    int port;
    atomic_int ready;
    const char *secret;                /* required of callers (NULL: none) */
    atomic_uint_fast64_t auth_refused; /* the server's count, at stop */
    /* behaviour */
    int refuse_first;
    int unknown_at_hb; /* answer known=false to this heartbeat (1-based; 0 never) */
    int drain_from_hb; /* answer drain=true from this heartbeat on (0 never) */
    /* what it saw (router thread writes; read after ready/atomics) */
    atomic_int n_register, n_hb, n_bad;
    atomic_int drain_hb; /* heartbeat number of the first drain answer */
    char events[256];    /* 'R' register, 'r' refused, 'H' heartbeat, 'U' unknown, 'D' drain */
    atomic_int n_events;
    uint32_t loads_seen[64];
    atomic_int n_loads;
    /* KV hints: every event is (counter << 1) | added, counters 1, 2, ...
     * in publish order; a gap is allowed only where the heartbeat says
     * prefix_reset */
    uint64_t hint_last;
    atomic_int n_hint_events, n_hint_resets, n_hint_gaps;
    /* hint events newer than the load snapshot beside them (the load's
     * recomputed_tokens carries the count of hints pushed when it was
     * taken): a router would read blocks cached after the queue it sees */
    atomic_int n_hint_ahead;
} router_t;

static void router_event(router_t *r, char c)
{
    int i = atomic_fetch_add(&r->n_events, 1);

    if (i < (int)sizeof(r->events) - 1) {
        r->events[i] = c;
    }
}

static void router_bad(router_t *r, const char *what)
{
    fprintf(stderr, "fake router: bad field: %s\n", what);
    atomic_fetch_add(&r->n_bad, 1);
}

static int router_pack(const ProtobufCMessage *m, void **resp_p, size_t *resp_len_p)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    void *buf = epd_malloc(n > 0 ? n : 1);

    protobuf_c_message_pack(m, buf);
    *resp_p = buf;
    *resp_len_p = n;
    return EPD_RPC_OK;
}

static void router_check_register(router_t *r, const Epd__RegisterRequest *q)
{
    if (q->worker == NULL || q->worker->worker_id == NULL ||
        strcmp(q->worker->worker_id, WORKER) != 0) {
        router_bad(r, "worker id");
        return;
    }
    if (q->worker->role != EPD__ROLE__ROLE_PREFILL || q->worker->model == NULL ||
        strcmp(q->worker->model, "tiny") != 0) {
        router_bad(r, "role/model");
    }
    if (q->worker->epoch == NULL || q->worker->epoch->start_time_ns != EPOCH_START ||
        q->worker->epoch->nonce != EPOCH_NONCE) {
        router_bad(r, "epoch");
    }
    if (q->transport == NULL || strcmp(q->transport, "ucx") != 0) {
        router_bad(r, "transport");
    }
    if (q->data_plane_address.len != 5 || memcmp(q->data_plane_address.data, "ADDR!", 5) != 0) {
        router_bad(r, "data_plane_address");
    }
    if (q->control_address == NULL || strcmp(q->control_address, "127.0.0.1:4242") != 0) {
        router_bad(r, "control_address");
    }
    if (q->capacity == NULL || q->capacity->kv_blocks_total != 2048 ||
        q->capacity->block_tokens != 16 || q->capacity->max_context != 1024) {
        router_bad(r, "capacity");
    }
    if (q->kv_layout == NULL || q->kv_layout->n_layers != 2 ||
        q->kv_layout->layer_pattern == NULL || strcmp(q->kv_layout->layer_pattern, "AL") != 0 ||
        q->kv_layout->block_bytes != 4096) {
        router_bad(r, "kv_layout");
    }
}

static int router_handler(void *arg, const char *method, const void *req, size_t req_len,
                          void **resp_p, size_t *resp_len_p, char *err, size_t err_cap)
{
    router_t *r = arg;
    ProtobufCMessage *m = NULL;

    if (strcmp(method, EPD_RPC_REGISTER) == 0) {
        Epd__RegisterResponse a = EPD__REGISTER_RESPONSE__INIT;
        Epd__Epoch re = EPD__EPOCH__INIT;
        int n;

        if (epd_proto_unpack(&epd__register_request__descriptor, req, req_len, &m) != EPD_OK) {
            router_bad(r, "RegisterRequest does not unpack");
            snprintf(err, err_cap, "malformed");
            return EPD_RPC_INVALID_ARGUMENT;
        }
        router_check_register(r, (Epd__RegisterRequest *)m);
        epd_proto_free(m);
        n = atomic_fetch_add(&r->n_register, 1) + 1;
        if (r->refuse_first && n == 1) {
            router_event(r, 'r');
            a.accepted = 0;
            a.reason = "warming up";
        } else {
            router_event(r, 'R');
            a.accepted = 1;
            a.heartbeat_interval_ms = 20;
            re.start_time_ns = ROUTER_START;
            re.nonce = ROUTER_NONCE;
            a.router_epoch = &re;
        }
        return router_pack(&a.base, resp_p, resp_len_p);
    }
    if (strcmp(method, EPD_RPC_HEARTBEAT) == 0) {
        Epd__HeartbeatResponse a = EPD__HEARTBEAT_RESPONSE__INIT;
        Epd__HeartbeatRequest *h;
        int n;

        if (epd_proto_unpack(&epd__heartbeat_request__descriptor, req, req_len, &m) != EPD_OK) {
            router_bad(r, "HeartbeatRequest does not unpack");
            snprintf(err, err_cap, "malformed");
            return EPD_RPC_INVALID_ARGUMENT;
        }
        h = (Epd__HeartbeatRequest *)m;
        if (h->worker_id == NULL || strcmp(h->worker_id, WORKER) != 0) {
            router_bad(r, "heartbeat worker id");
        }
        if (h->epoch == NULL || h->epoch->start_time_ns != EPOCH_START ||
            h->epoch->nonce != EPOCH_NONCE) {
            router_bad(r, "heartbeat epoch");
        }
        if (h->load == NULL) {
            router_bad(r, "heartbeat without load");
        } else {
            /* the test's load_cb publishes v, 1000v, 100v, 5000-v, v%7, v+1, 3v, 7v, v&1 */
            uint32_t v = h->load->queue_depth;

            if (h->load->queued_tokens != 1000ull * v ||
                h->load->router_queued_tokens != 100ull * v ||
                h->load->kv_blocks_free != 5000 - v || h->load->state_slots_free != v % 7 ||
                h->load->running_requests != v + 1 || h->load->kv_bytes_sent != 3ull * v ||
                h->load->kv_bytes_received != 7ull * v ||
                h->load->draining != (protobuf_c_boolean)(v & 1)) {
                router_bad(r, "heartbeat load is not one snapshot");
            }
            n = atomic_fetch_add(&r->n_loads, 1);
            if (n < 64) {
                r->loads_seen[n] = v;
            }
        }
        if (h->prefix_reset) {
            atomic_fetch_add(&r->n_hint_resets, 1);
        }
        for (size_t i = 0; i < h->n_prefix_events; i++) {
            uint64_t c = h->prefix_events[i] >> 1;

            if (c != r->hint_last + 1 && !(i == 0 && h->prefix_reset && c > r->hint_last)) {
                atomic_fetch_add(&r->n_hint_gaps, 1);
            }
            if ((h->prefix_events[i] & 1u) != (c % 3 != 0)) {
                router_bad(r, "hint flag");
            }
            r->hint_last = c;
            atomic_fetch_add(&r->n_hint_events, 1);
            if (h->load != NULL && c > h->load->recomputed_tokens) {
                atomic_fetch_add(&r->n_hint_ahead, 1);
            }
        }
        epd_proto_free(m);
        n = atomic_fetch_add(&r->n_hb, 1) + 1;
        a.known = 1;
        if (n == r->unknown_at_hb) {
            a.known = 0;
            router_event(r, 'U');
        } else if (r->drain_from_hb != 0 && n >= r->drain_from_hb) {
            a.drain = 1;
            if (atomic_load(&r->drain_hb) == 0) {
                atomic_store(&r->drain_hb, n);
            }
            router_event(r, 'D');
        } else {
            router_event(r, 'H');
        }
        return router_pack(&a.base, resp_p, resp_len_p);
    }
    snprintf(err, err_cap, "unknown method %s", method);
    return EPD_RPC_UNIMPLEMENTED;
}

static void router_on_stop(uv_async_t *a)
{
    router_t *r = a->data;

    atomic_store(&r->auth_refused, epd_rpc_server_auth_refused(r->server));
    epd_rpc_server_destroy(r->server);
    r->server = NULL;
    uv_close((uv_handle_t *)&r->stop, NULL);
}

static void *router_thread(void *arg)
{
    router_t *r = arg;

    if (uv_loop_init(&r->loop) != 0 || uv_async_init(&r->loop, &r->stop, router_on_stop) != 0) {
        atomic_store(&r->ready, -1);
        return NULL;
    }
    r->stop.data = r;
    if (epd_rpc_server_create(&r->loop, r->bind, router_handler, r, &r->server) != EPD_OK) {
        uv_close((uv_handle_t *)&r->stop, NULL);
        uv_run(&r->loop, UV_RUN_DEFAULT);
        uv_loop_close(&r->loop);
        atomic_store(&r->ready, -1);
        return NULL;
    }
    r->port = epd_rpc_server_port(r->server);
    if (r->secret != NULL &&
        epd_rpc_server_set_auth(r->server, r->secret, strlen(r->secret)) != EPD_OK) {
        atomic_store(&r->ready, -1);
        return NULL;
    }
    atomic_store(&r->ready, 1);
    uv_run(&r->loop, UV_RUN_DEFAULT);
    uv_loop_close(&r->loop);
    return NULL;
}

static void router_start(router_t *r, const char *bind)
{
    snprintf(r->bind, sizeof(r->bind), "%s", bind);
    assert_int_equal(pthread_create(&r->thread, NULL, router_thread, r), 0);
    while (atomic_load(&r->ready) == 0) {
        epd_time_sleep_ns(EPD_NSEC_PER_MSEC);
    }
    assert_int_equal(atomic_load(&r->ready), 1);
}

static void router_stop(router_t *r)
{
    uv_async_send(&r->stop);
    pthread_join(r->thread, NULL);
}

/* ------------------------------------------------------------ the daemon */

typedef struct {
    uv_loop_t loop;
    uv_timer_t poll;
    epd_registrar_t *reg;
    router_t *router;
    pthread_t loop_thread;
    atomic_uint v;
    int bad_thread;
    int n_drain;
    int stop_after_hb; /* stop once the router saw this many heartbeats past drain */
    int stop_when_registered;
    int stop_after_hb_ok; /* stop once this many heartbeats went through (0: no) */
    uint64_t run_ms;      /* stop (not a time-out) after this long (0: no) */
    uint64_t run_until_ns;
    const char *secret;            /* the registrar's (NULL: none) */
    epd_registrar_counts_t counts; /* at stop */
    /* at stop: epd_registrar_is_router of the router's epoch, of another
     * (its nonce + 1) and of the worker's own */
    int is_router[3];
    uint64_t deadline_ns;
    uint64_t stop_ns; /* how long epd_registrar_stop took */
    int timed_out;
    /* KV hints: published per poll (loop thread), up to hints_total */
    uint32_t hint_capacity, hints_per_poll;
    uint64_t hints_sent, hints_total;
    int hb_after_hints;
} daemon_t;

static void daemon_load(void *arg, epd_registrar_load_t *l)
{
    daemon_t *d = arg;
    uint32_t v = atomic_fetch_add(&d->v, 1) + 1;

    if (!pthread_equal(pthread_self(), d->loop_thread)) {
        d->bad_thread = 1;
    }
    l->queue_depth = v;
    l->queued_tokens = 1000ull * v;
    l->router_queued_tokens = 100ull * v;
    l->kv_blocks_free = 5000 - v;
    l->state_slots_free = v % 7;
    l->running_requests = v + 1;
    l->kv_bytes_sent = 3ull * v;
    l->kv_bytes_received = 7ull * v;
    l->draining = (int)(v & 1);
    l->prefix.requests = v;
    l->prefix.checkpoints_held = 9ull * v;
    l->recomputed_tokens = d->hints_sent; /* hints pushed so far (test_hints) */
}

static void daemon_drain(void *arg)
{
    daemon_t *d = arg;

    if (!pthread_equal(pthread_self(), d->loop_thread)) {
        d->bad_thread = 1;
    }
    d->n_drain++;
}

static void daemon_stop(daemon_t *d)
{
    uint64_t t0 = epd_time_now_ns();

    epd_registrar_counts(d->reg, &d->counts);
    d->is_router[0] = epd_registrar_is_router(d->reg, ROUTER_START, ROUTER_NONCE);
    d->is_router[1] = epd_registrar_is_router(d->reg, ROUTER_START, ROUTER_NONCE + 1);
    d->is_router[2] = epd_registrar_is_router(d->reg, EPOCH_START, EPOCH_NONCE);
    epd_registrar_stop(d->reg);
    d->stop_ns = epd_time_now_ns() - t0;
    uv_timer_stop(&d->poll);
    uv_close((uv_handle_t *)&d->poll, NULL);
}

static void daemon_on_poll(uv_timer_t *t)
{
    daemon_t *d = t->data;
    epd_registrar_counts_t c;

    epd_registrar_counts(d->reg, &c);
    for (uint32_t i = 0; i < d->hints_per_poll && d->hints_sent < d->hints_total; i++) {
        d->hints_sent++;
        epd_registrar_hint(d->reg, d->hints_sent << 1, d->hints_sent % 3 != 0);
    }
    if (d->hints_total > 0 && d->hints_sent == d->hints_total && d->router != NULL) {
        /* every hint published: stop once three more heartbeats went
         * (the ring is drained by then; lost ones were reset) */
        if (d->hb_after_hints == 0) {
            d->hb_after_hints = atomic_load(&d->router->n_hb) + 3;
        } else if (atomic_load(&d->router->n_hb) >= d->hb_after_hints) {
            daemon_stop(d);
            return;
        }
    }
    if (d->run_until_ns != 0 && epd_time_now_ns() > d->run_until_ns) {
        daemon_stop(d);
        return;
    }
    if (epd_time_now_ns() > d->deadline_ns) {
        d->timed_out = 1;
        daemon_stop(d);
        return;
    }
    if (d->stop_when_registered && c.registrations >= 1) {
        daemon_stop(d);
        return;
    }
    if (d->stop_after_hb_ok > 0 && c.heartbeats_ok >= (uint64_t)d->stop_after_hb_ok) {
        daemon_stop(d);
        return;
    }
    if (d->stop_after_hb > 0 && d->router != NULL && d->n_drain > 0 &&
        atomic_load(&d->router->n_hb) >= atomic_load(&d->router->drain_hb) + d->stop_after_hb) {
        daemon_stop(d);
    }
}

static void request_build(unsigned char *buf, size_t cap, size_t *len_p, int with_epoch)
{
    Epd__RegisterRequest q = EPD__REGISTER_REQUEST__INIT;
    Epd__WorkerIdentity w = EPD__WORKER_IDENTITY__INIT;
    Epd__Epoch e = EPD__EPOCH__INIT;
    Epd__Capacity c = EPD__CAPACITY__INIT;
    Epd__KvLayout l = EPD__KV_LAYOUT__INIT;
    size_t n;

    e.start_time_ns = EPOCH_START;
    e.nonce = EPOCH_NONCE;
    w.worker_id = WORKER;
    w.role = EPD__ROLE__ROLE_PREFILL;
    w.model = "tiny";
    w.epoch = with_epoch ? &e : NULL;
    c.kv_blocks_total = 2048;
    c.block_tokens = 16;
    c.state_slots_total = 64;
    c.max_batch = 1;
    c.max_context = 1024;
    l.n_layers = 2;
    l.layer_pattern = "AL";
    l.block_tokens = 16;
    l.n_kv_heads = 2;
    l.head_dim = 16;
    l.dtype = EPD__KV_DTYPE__KV_DTYPE_F32;
    l.block_bytes = 4096;
    l.state_bytes = 1024;
    q.worker = &w;
    q.transport = "ucx";
    q.data_plane_address.data = (uint8_t *)"ADDR!";
    q.data_plane_address.len = 5;
    q.control_address = "127.0.0.1:4242";
    q.capacity = &c;
    q.kv_layout = &l;
    n = protobuf_c_message_get_packed_size(&q.base);
    assert_true(n <= cap);
    protobuf_c_message_pack(&q.base, buf);
    *len_p = n;
}

static void daemon_run(daemon_t *d, const char *router_addr, uint32_t retry_ms, uint64_t limit_ms)
{
    epd_registrar_config_t cfg;
    unsigned char req[512];
    size_t req_len;

    request_build(req, sizeof(req), &req_len, 1);
    d->loop_thread = pthread_self();
    assert_int_equal(uv_loop_init(&d->loop), 0);
    assert_int_equal(uv_timer_init(&d->loop, &d->poll), 0);
    d->poll.data = d;
    memset(&cfg, 0, sizeof(cfg));
    cfg.router = router_addr;
    cfg.request = req;
    cfg.request_len = req_len;
    cfg.load_cb = daemon_load;
    cfg.drain_cb = daemon_drain;
    cfg.cb_arg = d;
    cfg.log_component = "test";
    cfg.retry_ms = retry_ms;
    cfg.call_timeout_ms = 1000;
    cfg.publish_ms = 5;
    cfg.hint_capacity = d->hint_capacity;
    cfg.secret = d->secret;
    cfg.secret_len = d->secret != NULL ? strlen(d->secret) : 0;
    assert_int_equal(epd_registrar_start(&d->loop, &cfg, &d->reg), EPD_OK);
    d->deadline_ns = epd_time_now_ns() + limit_ms * EPD_NSEC_PER_MSEC;
    if (d->run_ms != 0) {
        d->run_until_ns = epd_time_now_ns() + d->run_ms * EPD_NSEC_PER_MSEC;
    }
    uv_timer_start(&d->poll, daemon_on_poll, 5, 5);
    uv_run(&d->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&d->loop), 0);
    assert_int_equal(d->bad_thread, 0);
}

/* ------------------------------------------------------------------ tests */

static void test_register_heartbeat_unknown_drain(void **state)
{
    static router_t r;
    static daemon_t d;
    char addr[64];
    int distinct = 0;

    (void)state;
    memset(&r, 0, sizeof(r));
    memset(&d, 0, sizeof(d));
    r.refuse_first = 1;
    r.unknown_at_hb = 3;
    r.drain_from_hb = 6;
    router_start(&r, "127.0.0.1:0");
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", r.port);
    d.router = &r;
    d.stop_after_hb = 3;
    daemon_run(&d, addr, 100, 10000);
    router_stop(&r);

    r.events[sizeof(r.events) - 1] = '\0';
    fprintf(stderr, "router saw: %.*s; stop took %.3f ms\n", atomic_load(&r.n_events), r.events,
            (double)d.stop_ns / 1e6);
    assert_int_equal(d.timed_out, 0);
    assert_int_equal(atomic_load(&r.n_bad), 0);
    /* refused, accepted, two heartbeats, unknown, registered again, ... drain */
    assert_memory_equal(r.events, "rRHHUR", 6);
    assert_int_equal(atomic_load(&r.n_register), 3);
    assert_int_equal(d.n_drain, 1); /* drain answered repeatedly, reported once */
    for (int i = 1; i < atomic_load(&r.n_loads) && i < 64; i++) {
        distinct += r.loads_seen[i] != r.loads_seen[i - 1];
    }
    assert_true(distinct >= 2); /* fresh snapshots, not one frozen value */
    /* the worker knows its router's requests by the epoch it was given */
    assert_int_equal(d.is_router[0], 1);
    assert_int_equal(d.is_router[1], 0);
    assert_int_equal(d.is_router[2], 0);
    assert_int_equal(epd_registrar_is_router(NULL, ROUTER_START, ROUTER_NONCE), 0);
    assert_true(d.stop_ns < 200 * EPD_NSEC_PER_MSEC);
}

static void *late_router(void *arg)
{
    router_t *r = arg;

    epd_time_sleep_ns(600 * EPD_NSEC_PER_MSEC);
    return router_thread(r);
}

/* KV hints reach the router in order; when more come between two
 * heartbeats than the ring holds, the router is told to reset (never a
 * silent gap). */
static void test_hints(void **state)
{
    static router_t r;
    static daemon_t d;
    char addr[64];

    (void)state;
    for (int round = 0; round < 2; round++) {
        memset(&r, 0, sizeof(r));
        memset(&d, 0, sizeof(d));
        router_start(&r, "127.0.0.1:0");
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", r.port);
        d.router = &r;
        /* round 0: a roomy ring, a trickle; round 1: 64 per 5 ms into a
         * ring of 16 between heartbeats every 20 ms */
        d.hint_capacity = round == 0 ? 4096 : 16;
        d.hints_per_poll = round == 0 ? 1 : 64;
        d.hints_total = round == 0 ? 200 : 3000;
        daemon_run(&d, addr, 100, 20000);
        router_stop(&r);
        fprintf(stderr, "round %d: %d hint events, %d resets, %d gaps, %d ahead of their load\n",
                round, atomic_load(&r.n_hint_events), atomic_load(&r.n_hint_resets),
                atomic_load(&r.n_hint_gaps), atomic_load(&r.n_hint_ahead));
        assert_int_equal(d.timed_out, 0);
        assert_int_equal(atomic_load(&r.n_bad), 0);
        assert_int_equal(atomic_load(&r.n_hint_gaps), 0);
        assert_int_equal(atomic_load(&r.n_hint_ahead), 0);
        if (round == 0) {
            /* all of them, in order (a heartbeat that fails under load
             * would lose its batch, and say so with a reset) */
            assert_int_equal(r.hint_last, 200);
            if (atomic_load(&r.n_hint_resets) == 0) {
                assert_int_equal(atomic_load(&r.n_hint_events), 200);
            }
        } else {
            assert_true(atomic_load(&r.n_hint_resets) > 0);
        }
    }
}

static void test_router_late(void **state)
{
    static router_t r, probe;
    static daemon_t d;
    char addr[64];
    uint64_t t0, took;

    (void)state;
    memset(&probe, 0, sizeof(probe));
    router_start(&probe, "127.0.0.1:0");
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", probe.port);
    router_stop(&probe);

    memset(&r, 0, sizeof(r));
    memset(&d, 0, sizeof(d));
    snprintf(r.bind, sizeof(r.bind), "%s", addr);
    assert_int_equal(pthread_create(&r.thread, NULL, late_router, &r), 0);
    d.stop_when_registered = 1;
    t0 = epd_time_now_ns();
    daemon_run(&d, addr, 100, 10000);
    took = epd_time_now_ns() - t0;
    while (atomic_load(&r.ready) == 0) {
        epd_time_sleep_ns(EPD_NSEC_PER_MSEC);
    }
    assert_int_equal(atomic_load(&r.ready), 1);
    router_stop(&r);
    fprintf(stderr, "registered after %.0f ms; stop took %.3f ms\n", (double)took / 1e6,
            (double)d.stop_ns / 1e6);
    assert_int_equal(d.timed_out, 0);
    assert_int_equal(atomic_load(&r.n_register), 1);
    /* 600 ms of refused connections, then within about one retry */
    assert_true(took < 2000 * EPD_NSEC_PER_MSEC);
    assert_true(d.stop_ns < 200 * EPD_NSEC_PER_MSEC);
}

/* A router that never answers: stop is still prompt (no call in flight
 * outlives its deadline, and waits are woken). */
static void test_stop_while_failing(void **state)
{
    static daemon_t d;
    epd_registrar_config_t cfg;
    unsigned char req[512];
    size_t req_len;
    epd_registrar_counts_t c;
    uint64_t t0;

    (void)state;
    memset(&d, 0, sizeof(d));
    request_build(req, sizeof(req), &req_len, 1);
    d.loop_thread = pthread_self();
    assert_int_equal(uv_loop_init(&d.loop), 0);
    memset(&cfg, 0, sizeof(cfg));
    cfg.router = "127.0.0.1:1"; /* refused at once */
    cfg.request = req;
    cfg.request_len = req_len;
    cfg.load_cb = daemon_load;
    cfg.cb_arg = &d;
    assert_int_equal(epd_registrar_start(&d.loop, &cfg, &d.reg), EPD_OK);
    epd_time_sleep_ns(300 * EPD_NSEC_PER_MSEC);
    epd_registrar_counts(d.reg, &c);
    assert_true(c.register_attempts >= 1);
    assert_int_equal(c.registrations, 0);
    t0 = epd_time_now_ns();
    epd_registrar_stop(d.reg);
    assert_true(epd_time_now_ns() - t0 < 400 * EPD_NSEC_PER_MSEC);
    uv_run(&d.loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&d.loop), 0);
}

/* A router that requires the cluster secret: the same secret registers
 * and heartbeats (every call signed, none refused). */
static void test_secret_registers(void **state)
{
    static router_t r;
    static daemon_t d;
    char addr[64];

    (void)state;
    memset(&r, 0, sizeof(r));
    memset(&d, 0, sizeof(d));
    r.secret = SECRET;
    router_start(&r, "127.0.0.1:0");
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", r.port);
    d.secret = SECRET;
    d.stop_after_hb_ok = 3;
    daemon_run(&d, addr, 100, 10000);
    router_stop(&r);
    assert_int_equal(d.timed_out, 0);
    assert_int_equal(atomic_load(&r.n_bad), 0);
    assert_int_equal(atomic_load(&r.n_register), 1);
    assert_true(atomic_load(&r.n_hb) >= 3);
    assert_int_equal(d.counts.registrations, 1);
    assert_int_equal(atomic_load(&r.auth_refused), 0);
}

/* Another secret, or none: the router's handler never sees a call (the
 * worker is never registered); the registrar keeps trying. */
static void run_refused(const char *registrar_secret)
{
    static router_t r;
    static daemon_t d;
    char addr[64];

    memset(&r, 0, sizeof(r));
    memset(&d, 0, sizeof(d));
    r.secret = SECRET;
    router_start(&r, "127.0.0.1:0");
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", r.port);
    d.secret = registrar_secret;
    d.run_ms = 800;
    daemon_run(&d, addr, 100, 10000);
    router_stop(&r);
    fprintf(stderr, "%s: %llu attempts, %llu refused by the router\n",
            registrar_secret != NULL ? "another secret" : "no secret",
            (unsigned long long)d.counts.register_attempts,
            (unsigned long long)atomic_load(&r.auth_refused));
    assert_int_equal(d.timed_out, 0);
    assert_int_equal(atomic_load(&r.n_register), 0);
    assert_int_equal(atomic_load(&r.n_hb), 0);
    assert_int_equal(d.counts.registrations, 0);
    assert_true(d.counts.register_attempts >= 3);
    assert_true(atomic_load(&r.auth_refused) >= 3);
    assert_true(atomic_load(&r.auth_refused) <= d.counts.register_attempts);
}

static void test_wrong_secret_refused(void **state)
{
    (void)state;
    run_refused(OTHER_SECRET);
}

static void test_no_secret_refused(void **state)
{
    (void)state;
    run_refused(NULL);
}

static void test_bad_config(void **state)
{
    uv_loop_t loop;
    epd_registrar_config_t cfg;
    epd_registrar_t *reg = NULL;
    unsigned char req[512];
    size_t req_len;

    (void)state;
    assert_int_equal(uv_loop_init(&loop), 0);
    memset(&cfg, 0, sizeof(cfg));
    cfg.router = "127.0.0.1:1";
    cfg.load_cb = daemon_load;
    cfg.request = "\xff\xff\xff";
    cfg.request_len = 3;
    assert_int_equal(epd_registrar_start(&loop, &cfg, &reg), EPD_ERR_INVALID_PARAM);
    request_build(req, sizeof(req), &req_len, 0); /* no epoch */
    cfg.request = req;
    cfg.request_len = req_len;
    assert_int_equal(epd_registrar_start(&loop, &cfg, &reg), EPD_ERR_INVALID_PARAM);
    request_build(req, sizeof(req), &req_len, 1);
    cfg.request_len = req_len;
    cfg.router = "";
    assert_int_equal(epd_registrar_start(&loop, &cfg, &reg), EPD_ERR_INVALID_PARAM);
    cfg.router = "127.0.0.1:1";
    cfg.secret = "short";
    cfg.secret_len = 5;
    assert_int_equal(epd_registrar_start(&loop, &cfg, &reg), EPD_ERR_INVALID_PARAM);
    cfg.secret = NULL;
    assert_int_equal(epd_registrar_start(&loop, &cfg, &reg), EPD_ERR_INVALID_PARAM);
    cfg.secret_len = 0;
    cfg.load_cb = NULL;
    assert_int_equal(epd_registrar_start(&loop, &cfg, &reg), EPD_ERR_INVALID_PARAM);
    assert_null(reg);
    assert_int_equal(uv_loop_close(&loop), 0);
}

/* The seqlock never hands out a torn load while the loop publishes. */
typedef struct {
    epd_registrar_t *reg;
    atomic_int done;
    int torn;
    atomic_ullong reads;
} hammer_t;

static void *hammer_reader(void *arg)
{
    hammer_t *h = arg;
    epd_registrar_load_t l;

    while (!atomic_load(&h->done)) {
        epd_registrar_load_read(h->reg, &l);
        atomic_fetch_add(&h->reads, 1);
        if (l.queued_tokens != 1000ull * l.queue_depth ||
            l.kv_blocks_free != 5000 - l.queue_depth || l.state_slots_free != l.queue_depth % 7 ||
            l.running_requests != l.queue_depth + 1 || l.kv_bytes_sent != 3ull * l.queue_depth ||
            l.kv_bytes_received != 7ull * l.queue_depth || l.preemptions != 11ull * l.queue_depth ||
            l.recomputed_tokens != 13ull * l.queue_depth ||
            l.wasted_prefill_tokens != 17ull * l.queue_depth ||
            l.draining != (int)(l.queue_depth & 1) || l.prefix.requests != l.queue_depth ||
            l.prefix.checkpoints_held != 9ull * l.queue_depth || l.links[0] != l.queue_depth ||
            l.links[3] != l.queue_depth + 3 || l.quarantined != l.queue_depth % 5 ||
            l.late_writes_refused != 19ull * l.queue_depth || l.grants_held != l.queue_depth % 3) {
            h->torn++;
        }
    }
    return NULL;
}

static void test_seqlock(void **state)
{
    static daemon_t d;
    static hammer_t h;
    epd_registrar_config_t cfg;
    unsigned char req[512];
    size_t req_len;
    pthread_t t;

    (void)state;
    memset(&d, 0, sizeof(d));
    memset(&h, 0, sizeof(h));
    request_build(req, sizeof(req), &req_len, 1);
    d.loop_thread = pthread_self();
    assert_int_equal(uv_loop_init(&d.loop), 0);
    memset(&cfg, 0, sizeof(cfg));
    cfg.router = "127.0.0.1:1";
    cfg.request = req;
    cfg.request_len = req_len;
    cfg.load_cb = daemon_load;
    cfg.cb_arg = &d;
    assert_int_equal(epd_registrar_start(&d.loop, &cfg, &d.reg), EPD_OK);
    h.reg = d.reg;
    /* v = 0 published before the reader starts: before any publish the
     * snapshot is all zero, which the reader's formulas call torn (a
     * descheduled writer let it read that state 20,543 times once) */
    for (uint32_t v = 0; v <= 20000000 && atomic_load(&h.reads) < 200000; v++) {
        epd_registrar_load_t l = {.queue_depth = v,
                                  .queued_tokens = 1000ull * v,
                                  .kv_blocks_free = 5000 - v,
                                  .state_slots_free = v % 7,
                                  .running_requests = v + 1,
                                  .kv_bytes_sent = 3ull * v,
                                  .kv_bytes_received = 7ull * v,
                                  .preemptions = 11ull * v,
                                  .recomputed_tokens = 13ull * v,
                                  .wasted_prefill_tokens = 17ull * v,
                                  .draining = (int)(v & 1),
                                  .links = {v, v + 1, v + 2, v + 3},
                                  .quarantined = v % 5,
                                  .late_writes_refused = 19ull * v,
                                  .grants_held = v % 3};

        l.prefix.requests = v;
        l.prefix.checkpoints_held = 9ull * v;

        epd_registrar_publish(d.reg, &l);
        if (v == 0) {
            assert_int_equal(pthread_create(&t, NULL, hammer_reader, &h), 0);
        }
    }
    atomic_store(&h.done, 1);
    pthread_join(t, NULL);
    fprintf(stderr, "%llu reads, %d torn\n", (unsigned long long)atomic_load(&h.reads), h.torn);
    assert_int_equal(h.torn, 0);
    assert_true(atomic_load(&h.reads) > 0);
    epd_registrar_stop(d.reg);
    uv_run(&d.loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&d.loop), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_register_heartbeat_unknown_drain),
        cmocka_unit_test(test_hints),
        cmocka_unit_test(test_router_late),
        cmocka_unit_test(test_stop_while_failing),
        cmocka_unit_test(test_secret_registers),
        cmocka_unit_test(test_wrong_secret_refused),
        cmocka_unit_test(test_no_secret_refused),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_seqlock),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
