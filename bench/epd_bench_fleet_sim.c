/*
 * epd_bench_fleet_sim.c — `epd-bench fleet`'s simulated workers: each a
 * daemon/epd_registrar (RegisterWorker with the real prefill's KV layout,
 * then Heartbeats carrying a heavy but plausible load), all behind one
 * transport worker of this process (UCX, authenticated) whose address they
 * register, so the router opens and keeps one request-plane endpoint per
 * simulated worker as it does per real one.  They live on the fleet
 * thread's libuv loop; the main thread asks it to grow or stop (a mutex,
 * a condition variable and uv_async_send).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_bench_fleet_int.h"
#include "epd_msg.h"
#include "epd_rng.h"
#include "epd_time.h"

static void fl_on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    fl_t *b = arg;

    (void)ep;
    (void)data;
    (void)len;
    atomic_fetch_add(&b->strays, 1);
}

static void fl_on_accept(void *arg, epd_xport_ep_t *ep)
{
    fl_t *b = arg;

    (void)ep; /* the transport keeps it; closed at destroy */
    atomic_fetch_add(&b->accepted, 1);
}

/* Heavy but plausible loads (see the top of the file); loop thread. */
static void fl_load_prefill(void *arg, epd_registrar_load_t *load_p)
{
    const fl_t *b = arg;

    memset(load_p, 0, sizeof(*load_p));
    load_p->queue_depth = 8;
    load_p->queued_tokens = 65536;
    load_p->running_requests = 4;
    load_p->kv_blocks_free = b->layout.kv_blocks_total / 4;
    load_p->state_slots_free = b->layout.state_slots_total / 4;
    load_p->links[EPD_REGISTRAR_LINK_TCP] = 1;
}

static void fl_load_decode(void *arg, epd_registrar_load_t *load_p)
{
    const fl_t *b = arg;

    memset(load_p, 0, sizeof(*load_p));
    load_p->queue_depth = 2;
    load_p->running_requests = 256;
    load_p->kv_blocks_free = 16384 / 20;
    load_p->state_slots_free = b->layout.state_slots_total / 20;
}

/* Starts simulated worker `i` (even: prefill, odd: decode).  Loop thread. */
static epd_status_t fl_worker_start(fl_t *b, uint32_t i)
{
    Epd__RegisterRequest r = EPD__REGISTER_REQUEST__INIT;
    Epd__WorkerIdentity id = EPD__WORKER_IDENTITY__INIT;
    Epd__Epoch ep = EPD__EPOCH__INIT;
    Epd__Capacity cap = EPD__CAPACITY__INIT;
    Epd__KvLayout kv = EPD__KV_LAYOUT__INIT;
    epd_registrar_config_t cfg;
    char wid[64], ctl[64];
    int decode = (i & 1u) != 0;
    epd_status_t st;
    size_t n;
    void *buf;

    snprintf(wid, sizeof(wid), "sim-%s-%u", decode ? "decode" : "prefill", i);
    /* never called: the router reaches workers' control ports only for
     * operators' Drain and Status calls through it */
    snprintf(ctl, sizeof(ctl), "127.0.0.1:%u", 1u + i % 1000u);
    ep.start_time_ns = epd_time_wall_ns();
    ep.nonce = epd_rng_entropy();
    id.worker_id = wid;
    id.role = decode ? EPD__ROLE__ROLE_DECODE : EPD__ROLE__ROLE_PREFILL;
    id.model = b->layout.model;
    id.epoch = &ep;
    cap.kv_blocks_total = decode ? 16384 : b->layout.kv_blocks_total;
    cap.block_tokens = b->layout.block_tokens;
    cap.state_slots_total = b->layout.state_slots_total;
    cap.max_batch = decode ? 256 : b->layout.max_batch;
    cap.max_context = b->layout.max_context;
    kv.n_layers = b->layout.n_layers;
    kv.layer_pattern = b->layout.layer_pattern;
    kv.block_tokens = b->layout.block_tokens;
    kv.n_kv_heads = b->layout.n_kv_heads;
    kv.head_dim = b->layout.head_dim;
    kv.dtype = (Epd__KvDtype)b->layout.kv_dtype;
    /* the real prefill's KV dtype map: the router admits only workers whose
     * map is its own (without it a sim worker reads as f32 beside bf16) */
    kv.kv_dtype_map = b->layout.kv_dtype_map;
    kv.block_bytes = b->layout.block_bytes;
    kv.state_bytes = b->layout.state_bytes;
    r.worker = &id;
    r.transport = "ucx";
    r.data_plane_address.data = (uint8_t *)(uintptr_t)b->addr;
    r.data_plane_address.len = b->addr_len;
    r.control_address = ctl;
    r.data_address = "127.0.0.1";
    r.capacity = &cap;
    r.kv_layout = &kv;
    n = protobuf_c_message_get_packed_size(&r.base);
    buf = epd_malloc(n);
    if (buf == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    protobuf_c_message_pack(&r.base, buf);
    memset(&cfg, 0, sizeof(cfg));
    cfg.router = b->router_ctl;
    cfg.request = buf;
    cfg.request_len = n;
    cfg.load_cb = decode ? fl_load_decode : fl_load_prefill;
    cfg.cb_arg = b;
    cfg.log_component = "fleet";
    cfg.secret = b->secret.bytes;
    cfg.secret_len = b->secret.len;
    st = epd_registrar_start(&b->loop, &cfg, &b->regs[i]);
    epd_free(buf);
    return st;
}

static void fl_on_async(uv_async_t *h)
{
    fl_t *b = h->data;
    uint32_t want, have;
    int stop;

    pthread_mutex_lock(&b->mu);
    want = b->want;
    have = b->have;
    stop = b->stop;
    pthread_mutex_unlock(&b->mu);
    if (stop) {
        for (uint32_t i = 0; i < have; i++) {
            epd_registrar_stop(b->regs[i]);
            b->regs[i] = NULL;
        }
        epd_xport_uv_stop(b->xuv);
        b->xuv = NULL;
        uv_close((uv_handle_t *)&b->async, NULL);
        pthread_mutex_lock(&b->mu);
        b->have = 0;
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->mu);
        return;
    }
    while (have < want) {
        epd_status_t st = fl_worker_start(b, have);

        if (st != EPD_OK) {
            fprintf(stderr, "fleet: simulated worker %u did not start: %s\n", have,
                    epd_status_string(st));
            pthread_mutex_lock(&b->mu);
            b->failed = 1;
            pthread_mutex_unlock(&b->mu);
            break;
        }
        have++;
    }
    pthread_mutex_lock(&b->mu);
    b->have = have;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

static void *fl_thread(void *arg)
{
    fl_t *b = arg;
    epd_xport_config_t xc;
    epd_status_t st;
    int ok = 0;

    epd_xport_config_init(&xc);
    xc.backend = "ucx";
    xc.msg_cb = fl_on_msg;
    xc.accept_cb = fl_on_accept;
    xc.cb_arg = b;
    xc.peer_timeout_ms = 3000; /* the daemons' default */
    xc.connect_timeout_ms = 3000;
    xc.secret = b->secret.bytes;
    xc.secret_len = b->secret.len;
    snprintf(xc.identity.worker_id, sizeof(xc.identity.worker_id), "sim-fleet");
    xc.identity.role = EPD__ROLE__ROLE_DECODE;
    xc.identity.epoch.start_time_ns = epd_time_wall_ns();
    xc.identity.epoch.nonce = epd_rng_entropy();
    if (uv_loop_init(&b->loop) != 0) {
        pthread_mutex_lock(&b->mu);
        b->started = -1;
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->mu);
        return NULL;
    }
    st = epd_xport_create(&xc, &b->x);
    if (st == EPD_OK) {
        st = epd_xport_address(b->x, &b->addr, &b->addr_len);
    }
    if (st == EPD_OK) {
        st = epd_xport_uv_start(&b->loop, b->x, 50, &b->xuv);
    }
    if (st == EPD_OK && uv_async_init(&b->loop, &b->async, fl_on_async) == 0) {
        b->async.data = b;
        ok = 1;
    } else {
        fprintf(stderr, "fleet: the simulated workers' transport did not start: %s\n",
                epd_status_string(st));
        epd_xport_uv_stop(b->xuv);
        b->xuv = NULL;
    }
    pthread_mutex_lock(&b->mu);
    b->started = ok ? 1 : -1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    uv_run(&b->loop, UV_RUN_DEFAULT); /* until fl_on_async closed every handle */
    epd_xport_destroy(b->x);
    b->x = NULL;
    uv_loop_close(&b->loop);
    return NULL;
}

/* Asks the fleet thread for `size` simulated workers and waits until they
 * were started (registration goes on in their threads).  0 or -1. */
int epd__fl_grow(fl_t *b, uint32_t size)
{
    int rc;

    pthread_mutex_lock(&b->mu);
    b->want = size;
    uv_async_send(&b->async);
    while (b->have < size && !b->failed) {
        pthread_cond_wait(&b->cv, &b->mu);
    }
    rc = b->failed ? -1 : 0;
    pthread_mutex_unlock(&b->mu);
    return rc;
}

int epd__fl_fleet_start(fl_t *b)
{
    int started;

    b->regs = epd_calloc(FL_FLEET_MAX, sizeof(*b->regs));
    if (b->regs == NULL || pthread_create(&b->thread, NULL, fl_thread, b) != 0) {
        return -1;
    }
    b->thread_started = 1;
    pthread_mutex_lock(&b->mu);
    while (b->started == 0) {
        pthread_cond_wait(&b->cv, &b->mu);
    }
    started = b->started;
    pthread_mutex_unlock(&b->mu);
    return started == 1 ? 0 : -1;
}

void epd__fl_fleet_stop(fl_t *b)
{
    if (b->thread_started) {
        pthread_mutex_lock(&b->mu);
        b->stop = 1;
        if (b->started == 1) {
            uv_async_send(&b->async);
        }
        pthread_mutex_unlock(&b->mu);
        pthread_join(b->thread, NULL);
        b->thread_started = 0;
    }
    epd_free(b->regs);
    b->regs = NULL;
}

/* Accepted heartbeats of the whole fleet so far; failed ones (refused or
 * timed out) into *failed_p. */
uint64_t epd__fl_heartbeats(fl_t *b, uint64_t *failed_p)
{
    uint64_t n = 0, failed = 0;
    uint32_t have;

    pthread_mutex_lock(&b->mu);
    have = b->have;
    for (uint32_t i = 0; i < have; i++) {
        epd_registrar_counts_t c;

        epd_registrar_counts(b->regs[i], &c);
        n += c.heartbeats_ok;
        failed += c.heartbeats_failed;
    }
    pthread_mutex_unlock(&b->mu);
    *failed_p = failed;
    return n;
}
