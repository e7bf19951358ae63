/*
 * main.c — `epd-prefill`: the prefill daemon.
 *
 * Runs prompts through the model and streams each finished layer's KV into
 * the blocks a decode worker reserved, so the transfer hides behind the
 * compute of the next layers (proto/README.md is the protocol; DESIGN.md
 * the why).
 *
 * Threads:
 *   - the loop thread (this one, after start-up): libuv loop owning every
 *     request, the transport (driven by epd_xport_uv: it keeps progressing
 *     whatever compute does), all posting of writes and sends, the gRPC
 *     handlers (epd_rpc), timers and signals;
 *   - the compute thread (epd_prefill_compute): owns the engine, runs one
 *     prefill at a time, hands "layer done" / "finished" / "released" back;
 *   - gRPC's own threads, hidden behind epd_rpc.
 * No lock is held across a compute call or a network call: the hand-offs
 * are two SPSC queues, a semaphore and a uv_async.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "epd_alloc.h"
#include "epd_config.h"
#include "epd_layout.h"
#include "epd_log.h"
#include "epd_image.h"
#include "epd_prefill_int.h"
#include "epd_rng.h"
#include "epd_time.h"

#define EPD_PREFILL_TICK_MS 20 /* leases, stash expiry, backpressure retries */

typedef struct {
    const char *model;
    const char *engine;
    const char *worker_id;
    const char *transport;
    const char *expect;
    const char *provider;
    const char *control_addr;
    const char *ready_file;
    const char *log_level;
    int64_t kv_blocks;
    int64_t state_slots;
    int64_t block_tokens;
    int64_t max_batch;
    int64_t lease_ms;
    int64_t peer_timeout_ms;
    int64_t connect_timeout_ms;
    int64_t max_inflight_writes;
    int64_t write_group_bytes;
    int layer_notify;
    int64_t embed_slots;
    int64_t max_image_pixels;
    const char *trace;
    int64_t trace_events;
    const char *router;
} epd_prefill_flags_t;

static void epd_prefill_on_tick(uv_timer_t *timer)
{
    epd_prefill_srv_t *srv = timer->data;

    epd__prefill_tick(srv, epd_time_now_ns());
}

/* Writes the trace (--trace): blocking file I/O, so only at exit and on an
 * explicit SIGUSR1, never per request. */
static void epd_prefill_trace_write(epd_prefill_srv_t *srv)
{
    uint64_t n, dropped;
    epd_status_t st;

    if (srv->trace == NULL) {
        return;
    }
    st = epd_trace_write_json(srv->trace, srv->trace_path, 0);
    epd_trace_counts(srv->trace, &n, &dropped);
    if (st != EPD_OK) {
        epd_log_error(EPD_PREFILL_LOG, 0, "cannot write the trace '%s': %s", srv->trace_path,
                      epd_status_string(st));
    } else {
        epd_log_info(EPD_PREFILL_LOG, 0,
                     "trace: %llu events written to %s (%llu dropped: buffer full)",
                     (unsigned long long)n, srv->trace_path, (unsigned long long)dropped);
    }
}

static void epd_prefill_on_sigusr1(uv_signal_t *sig, int signum)
{
    (void)signum;
    epd_prefill_trace_write(sig->data);
}

static void epd_prefill_on_signal(uv_signal_t *sig, int signum)
{
    epd_prefill_srv_t *srv = sig->data;

    if (srv->stopping) {
        return;
    }
    epd_log_info(EPD_PREFILL_LOG, 0,
                 "signal %d: stopping (%u requests live; %llu completed, %llu failed or aborted, "
                 "%llu undecodable frames since start)",
                 signum, srv->n_live, (unsigned long long)srv->served,
                 (unsigned long long)srv->failed_reqs, (unsigned long long)srv->bad_frames);
    srv->stopping = 1;
    for (epd_prefill_req_t *req = srv->all; req != NULL; req = req->all_next) {
        atomic_store(&req->cancel, 1);
    }
    epd_registrar_stop(srv->registrar);
    srv->registrar = NULL;
    epd_rpc_server_destroy(srv->rpc);
    srv->rpc = NULL;
    epd_xport_uv_stop(srv->xuv);
    srv->xuv = NULL;
    uv_timer_stop(&srv->timer);
    uv_idle_stop(&srv->pump);
    uv_signal_stop(&srv->sigterm);
    uv_signal_stop(&srv->sigint);
    uv_signal_stop(&srv->sigusr1);
    uv_stop(srv->loop);
}

/* Writes the ready line atomically (tmp + rename). */
static int epd_prefill_ready_file(const char *path, const char *line)
{
    char tmp[4096];
    FILE *f;

    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof(tmp)) {
        return -1;
    }
    f = fopen(tmp, "w");
    if (f == NULL) {
        return -1;
    }
    if (fputs(line, f) == EOF || fclose(f) != 0) {
        unlink(tmp);
        return -1;
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* --router: register with the router and heartbeat (epd_registrar). */
static int epd_prefill_register(epd_prefill_srv_t *srv, const char *router, const char *host)
{
    epd_registrar_config_t cfg;
    char ctl[300];
    void *req = NULL;
    size_t len = 0;
    epd_status_t st;

    snprintf(ctl, sizeof(ctl), "%s:%d", host, epd_rpc_server_port(srv->rpc));
    st = epd__prefill_register_pack(srv, ctl, &req, &len);
    if (st == EPD_OK) {
        memset(&cfg, 0, sizeof(cfg));
        cfg.router = router;
        cfg.request = req;
        cfg.request_len = len;
        cfg.load_cb = epd__prefill_registrar_load;
        cfg.drain_cb = epd__prefill_registrar_drain;
        cfg.cb_arg = srv;
        cfg.log_component = EPD_PREFILL_LOG;
        st = epd_registrar_start(srv->loop, &cfg, &srv->registrar);
        epd_free(req);
    }
    if (st != EPD_OK) {
        epd_log_error(EPD_PREFILL_LOG, 0, "cannot register with the router '%s': %s", router,
                      epd_status_string(st));
        return -1;
    }
    return 0;
}

static int epd_prefill_fail(const char *fmt, const char *arg)
{
    epd_log_error(EPD_PREFILL_LOG, 0, fmt, arg);
    return 1;
}

static void epd_prefill_close_walk(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h)) {
        uv_close(h, NULL);
    }
}

static int epd_prefill_run(const epd_prefill_flags_t *fl)
{
    epd_engine_config_t ecfg;
    epd_xport_config_t xcfg;
    epd_prefill_srv_t *srv;
    epd_engine_t *engine = NULL;
    char host[256];
    char line[512];
    const char *colon;
    uint64_t pool_bytes;
    epd_status_t st;
    int rc = 1;
    uv_loop_t loop;

    srv = epd_calloc(1, sizeof(*srv));
    if (srv == NULL) {
        return epd_prefill_fail("out of memory%s", "");
    }
    srv->model_dir = fl->model;
    srv->engine_name = fl->engine;
    if (fl->worker_id != NULL && fl->worker_id[0] != '\0') {
        snprintf(srv->worker_id, sizeof(srv->worker_id), "%s", fl->worker_id);
    } else {
        snprintf(srv->worker_id, sizeof(srv->worker_id), "prefill-%d", (int)getpid());
    }
    {
        size_t n = strlen(fl->model);
        const char *end, *start;

        while (n > 1 && fl->model[n - 1] == '/') {
            n--;
        }
        end = fl->model + n;
        start = end;
        while (start > fl->model && start[-1] != '/') {
            start--;
        }
        snprintf(srv->model_name, sizeof(srv->model_name), "%.*s", (int)(end - start), start);
    }
    srv->transport = fl->transport;
    srv->expect = fl->expect;
    srv->provider = fl->provider;
    srv->control_addr = fl->control_addr;
    srv->ready_file = fl->ready_file;
    srv->kv_blocks = (uint32_t)fl->kv_blocks;
    srv->state_slots = (uint32_t)fl->state_slots;
    srv->block_tokens = (uint32_t)fl->block_tokens;
    srv->lease_ms = (uint32_t)fl->lease_ms;
    srv->peer_timeout_ms = (uint32_t)fl->peer_timeout_ms;
    srv->connect_timeout_ms = (uint32_t)fl->connect_timeout_ms;
    srv->write_group_bytes = (uint64_t)fl->write_group_bytes;
    srv->layer_notify = fl->layer_notify;
    srv->embed_slots = (uint32_t)fl->embed_slots;
    srv->max_image_pixels = (uint64_t)fl->max_image_pixels;
    srv->trace_path = fl->trace;
    srv->epoch.start_time_ns = epd_time_wall_ns();
    srv->epoch.nonce = epd_rng_entropy();
    srv->loop = &loop;

    /* the model (blocking: before the loop runs) */
    memset(&ecfg, 0, sizeof(ecfg));
    ecfg.model_dir = fl->model;
    ecfg.block_tokens = srv->block_tokens;
    ecfg.max_batch = 1;
    st = epd_engine_open(fl->engine, &ecfg, &engine);
    if (st != EPD_OK) {
        epd_log_error(EPD_PREFILL_LOG, 0, "cannot open model '%s' with engine '%s': %s", fl->model,
                      fl->engine, epd_status_string(st));
        epd_free(srv);
        return 1;
    }
    srv->info = epd_engine_info(engine);

    if (uv_loop_init(&loop) != 0) {
        epd_engine_close(engine);
        epd_free(srv);
        return epd_prefill_fail("cannot create the event loop%s", "");
    }
    if (fl->trace != NULL && fl->trace[0] != '\0') {
        char pname[192];

        snprintf(pname, sizeof(pname), "epd-prefill %s", srv->worker_id);
        st = epd_trace_create((size_t)fl->trace_events, pname, &srv->trace);
        if (st != EPD_OK) {
            epd_log_error(EPD_PREFILL_LOG, 0, "cannot create the trace recorder: %s",
                          epd_status_string(st));
            goto out_engine;
        }
        epd_trace_thread_name(srv->trace, "prefill loop");
    }
    srv->tx_cap = 64 * 1024;
    srv->tx_buf = epd_malloc(srv->tx_cap);
    srv->table_size = 16;
    while (srv->table_size < 2 * srv->state_slots) {
        srv->table_size *= 2;
    }
    srv->table = epd_calloc(srv->table_size, sizeof(*srv->table));
    srv->free_blocks = epd_calloc(srv->kv_blocks, sizeof(*srv->free_blocks));
    srv->free_slots = epd_calloc(srv->state_slots, sizeof(*srv->free_slots));
    if (srv->tx_buf == NULL || srv->table == NULL || srv->free_blocks == NULL ||
        srv->free_slots == NULL) {
        epd_log_error(EPD_PREFILL_LOG, 0, "out of memory");
        goto out_engine;
    }
    /* lowest ids on top of the stacks */
    for (uint32_t i = 0; i < srv->kv_blocks; i++) {
        srv->free_blocks[i] = srv->kv_blocks - 1 - i;
    }
    srv->n_free_blocks = srv->kv_blocks;
    for (uint32_t i = 0; i < srv->state_slots; i++) {
        srv->free_slots[i] = srv->state_slots - 1 - i;
    }
    srv->n_free_slots = srv->state_slots;

    /* the transport, bound to this (the loop) thread */
    epd_xport_config_init(&xcfg);
    xcfg.backend = fl->transport;
    xcfg.expect = fl->expect;
    xcfg.provider = fl->provider;
    /* images may come inline (a cluster without encoders): room for them */
    xcfg.max_msg_size = srv->info->image_embeddings > 0 && srv->embed_slots > 0
                            ? (size_t)16 << 20
                            : (size_t)64 * 1024;
    xcfg.max_inflight = (uint32_t)fl->max_inflight_writes;
    xcfg.peer_timeout_ms = srv->peer_timeout_ms;
    xcfg.connect_timeout_ms = srv->connect_timeout_ms;
    xcfg.msg_cb = epd__prefill_on_msg;
    xcfg.accept_cb = epd__prefill_on_accept;
    xcfg.err_cb = epd__prefill_on_ep_error;
    xcfg.cb_arg = srv;
    st = epd_xport_create(&xcfg, &srv->x);
    if (st != EPD_OK) {
        epd_log_error(EPD_PREFILL_LOG, 0, "cannot start the '%s' transport: %s", fl->transport,
                      epd_status_string(st));
        goto out_engine;
    }
    st = epd_xport_address(srv->x, &srv->addr, &srv->addr_len);
    if (st != EPD_OK) {
        epd_log_error(EPD_PREFILL_LOG, 0, "no transport address: %s", epd_status_string(st));
        goto out_xport;
    }
    /* the local KV pool, registered so writes go out without bouncing */
    pool_bytes = epd_kv_pool_bytes(&srv->info->kv, srv->kv_blocks, srv->state_slots);
    if (pool_bytes == 0) {
        epd_log_error(EPD_PREFILL_LOG, 0, "KV pool of %u blocks and %u slots is empty or overflows",
                      srv->kv_blocks, srv->state_slots);
        goto out_xport;
    }
    st = epd_xport_mr_alloc(srv->x, (size_t)pool_bytes, &srv->pool_mr);
    if (st != EPD_OK) {
        epd_log_error(EPD_PREFILL_LOG, 0, "cannot allocate a %llu-byte KV pool: %s",
                      (unsigned long long)pool_bytes, epd_status_string(st));
        goto out_xport;
    }
    srv->pool.base = epd_xport_mr_addr(srv->pool_mr);
    srv->pool.bytes = pool_bytes;
    srv->pool.n_blocks = srv->kv_blocks;
    srv->pool.n_state_slots = srv->state_slots;
    st = epd_engine_check_pool(engine, &srv->pool);
    if (st != EPD_OK) {
        goto out_xport;
    }
    st = epd__prefill_media_init(srv);
    if (st != EPD_OK) {
        goto out_xport;
    }

    uv_idle_init(&loop, &srv->pump);
    srv->pump.data = srv;
    uv_timer_init(&loop, &srv->timer);
    srv->timer.data = srv;
    uv_signal_init(&loop, &srv->sigterm);
    srv->sigterm.data = srv;
    uv_signal_init(&loop, &srv->sigint);
    srv->sigint.data = srv;
    uv_signal_init(&loop, &srv->sigusr1);
    srv->sigusr1.data = srv;

    st = epd_prefill_compute_create(&loop, engine, &srv->pool, srv->state_slots,
                                    srv->embed_slots > 0 ? EPD_PREFILL_MEDIA_MAX : 0,
                                    epd__prefill_on_event, srv, &srv->compute);
    if (st != EPD_OK) {
        epd_log_error(EPD_PREFILL_LOG, 0, "cannot start the compute thread: %s",
                      epd_status_string(st));
        goto out_handles;
    }
    engine = NULL; /* the compute thread owns it now */
    {
        uint32_t tick = srv->peer_timeout_ms / 8;

        tick = tick == 0 ? 1 : tick > 50 ? 50 : tick;
        st = epd_xport_uv_start(&loop, srv->x, tick, &srv->xuv);
    }
    if (st != EPD_OK) {
        epd_log_error(EPD_PREFILL_LOG, 0, "cannot drive the transport from the loop: %s",
                      epd_status_string(st));
        goto out_handles;
    }
    st = epd_rpc_server_create(&loop, fl->control_addr, epd__prefill_on_rpc, srv, &srv->rpc);
    if (st != EPD_OK) {
        epd_log_error(EPD_PREFILL_LOG, 0, "cannot serve the control plane on %s: %s",
                      fl->control_addr, epd_status_string(st));
        goto out_handles;
    }
    uv_timer_start(&srv->timer, epd_prefill_on_tick, EPD_PREFILL_TICK_MS, EPD_PREFILL_TICK_MS);
    uv_signal_start(&srv->sigterm, epd_prefill_on_signal, SIGTERM);
    uv_signal_start(&srv->sigint, epd_prefill_on_signal, SIGINT);
    uv_signal_start(&srv->sigusr1, epd_prefill_on_sigusr1, SIGUSR1);

    colon = strrchr(fl->control_addr, ':');
    snprintf(host, sizeof(host), "%.*s",
             colon != NULL ? (int)(colon - fl->control_addr) : (int)strlen(fl->control_addr),
             fl->control_addr);
    snprintf(line, sizeof(line), "control=%s:%d pid=%d worker=%s transport=%s\n", host,
             epd_rpc_server_port(srv->rpc), (int)getpid(), srv->worker_id, fl->transport);
    {
        char desc[512];
        char pattern[EPD_LAYOUT_PATTERN_MAX];
        Epd__KvLayout lm;

        epd_layout_to_msg(&srv->info->kv, &lm, pattern);
        epd_xport_describe(srv->x, desc, sizeof(desc));
        epd_log_info(EPD_PREFILL_LOG, 0,
                     "serving model '%s' (%u layers '%.40s', vocab %u, context %u): pool %u blocks "
                     "x %u tokens + %u slots (%llu bytes), lease %u ms; transport %s",
                     srv->model_name, srv->info->kv.n_layers, pattern, srv->info->vocab_size,
                     srv->info->max_context, srv->kv_blocks, srv->info->kv.block_tokens,
                     srv->state_slots, (unsigned long long)pool_bytes, srv->lease_ms, desc);
    }
    if (fl->ready_file != NULL && fl->ready_file[0] != '\0' &&
        epd_prefill_ready_file(fl->ready_file, line) != 0) {
        epd_log_error(EPD_PREFILL_LOG, 0, "cannot write the ready file '%s': %s", fl->ready_file,
                      strerror(errno));
        epd_prefill_on_signal(&srv->sigterm, 0);
        uv_run(&loop, UV_RUN_DEFAULT);
        goto out_stop;
    }
    epd_log_info(EPD_PREFILL_LOG, 0, "ready: %.*s", (int)strlen(line) - 1, line);
    if (fl->router != NULL && fl->router[0] != '\0' &&
        epd_prefill_register(srv, fl->router, host) != 0) {
        epd_prefill_on_signal(&srv->sigterm, 0);
        uv_run(&loop, UV_RUN_DEFAULT);
        goto out_stop;
    }

    uv_run(&loop, UV_RUN_DEFAULT);
    rc = 0;

out_stop:
    /* stopped by a signal: the compute thread ends its job at the next
     * layer boundary (every request is canceled), then the transport goes */
    epd_prefill_compute_destroy(srv->compute);
    srv->compute = NULL;
    uv_run(&loop, UV_RUN_DEFAULT);
    goto out_xport;

out_handles:
    epd_rpc_server_destroy(srv->rpc);
    epd_xport_uv_stop(srv->xuv);
    epd_prefill_compute_destroy(srv->compute);
    uv_walk(&loop, epd_prefill_close_walk, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
out_xport:
    srv->stopping = 1;
    /* closes every endpoint (writes complete with EPD_ERR_CANCELED into
     * requests that still exist) and frees the pool */
    epd_xport_destroy(srv->x); /* the embedding region goes with it */
    srv->x = NULL;
    epd__prefill_media_cleanup(srv);
    {
        uv_walk(&loop, epd_prefill_close_walk, NULL);
        uv_run(&loop, UV_RUN_DEFAULT);
    }
out_engine:
    epd_engine_close(engine);
    epd_prefill_trace_write(srv);
    epd_trace_destroy(srv->trace);
    epd__prefill_reqs_free_all(srv);
    while (srv->peers != NULL) {
        epd_prefill_peer_t *p = srv->peers;
        srv->peers = p->next;
        epd_free(p);
    }
    for (uint32_t i = 0; i < srv->n_stash; i++) {
        epd_msg_free(srv->stash[i].env);
    }
    epd_free(srv->free_slots);
    epd_free(srv->free_blocks);
    epd_free(srv->table);
    epd_free(srv->tx_buf);
    if (uv_loop_close(&loop) != 0) {
        epd_log_warn(EPD_PREFILL_LOG, 0, "event loop closed with handles still open");
    }
    epd_free(srv);
    return rc;
}

int main(int argc, char **argv)
{
    epd_prefill_flags_t fl = {
        .model = NULL,
        .engine = "ref",
        .worker_id = NULL,
        .transport = "ucx",
        .expect = "any",
        .provider = NULL,
        .control_addr = "127.0.0.1:0",
        .ready_file = NULL,
        .log_level = "info",
        .kv_blocks = 2048,
        .state_slots = 64,
        .block_tokens = 16,
        .max_batch = 32,
        .lease_ms = 5000,
        .peer_timeout_ms = 3000,
        .connect_timeout_ms = 3000,
        .max_inflight_writes = 4096,
        .write_group_bytes = EPD_PREFILL_WRITE_GROUP_DEFAULT,
        .layer_notify = 1,
        .embed_slots = 64,
        .max_image_pixels = (int64_t)EPD_IMAGE_MAX_PIXELS_DEFAULT,
        .trace = NULL,
        .trace_events = 1 << 20,
        .router = NULL,
    };
    const epd_opt_t opts[] = {
        {"model", EPD_OPT_STRING, &fl.model, 0, 0,
         "model folder (config.json + model.safetensors)"},
        {"engine", EPD_OPT_STRING, &fl.engine, 0, 0, "engine: built-in name or path to a .so"},
        {"worker-id", EPD_OPT_STRING, &fl.worker_id, 0, 0, "worker name (default prefill-<pid>)"},
        {"transport", EPD_OPT_STRING, &fl.transport, 0, 0, "transport backend: ucx or ofi"},
        {"expect-transport", EPD_OPT_STRING, &fl.expect, 0, 0,
         "refuse peers reached other than by: any, shm, tcp, rdma"},
        {"provider", EPD_OPT_STRING, &fl.provider, 0, 0, "libfabric provider hint (ofi)"},
        {"control-addr", EPD_OPT_STRING, &fl.control_addr, 0, 0,
         "gRPC control address HOST:PORT (port 0: ephemeral)"},
        {"ready-file", EPD_OPT_STRING, &fl.ready_file, 0, 0,
         "write 'control=... pid=... worker=... transport=...' here once serving"},
        {"kv-blocks", EPD_OPT_INT, &fl.kv_blocks, 1, 1 << 24, "local KV blocks"},
        {"state-slots", EPD_OPT_INT, &fl.state_slots, 1, 1 << 16,
         "local recurrent-state slots = requests in flight at most"},
        {"block-tokens", EPD_OPT_INT, &fl.block_tokens, 1, 4096, "tokens per KV block"},
        {"max-batch", EPD_OPT_INT, &fl.max_batch, 1, 1 << 16,
         "decode batch size (a decode setting; prefill runs one prompt at a time)"},
        {"lease-ms", EPD_OPT_INT, &fl.lease_ms, 1, 3600000,
         "drop a request whose KV reservation has not come this long after its prefill"},
        {"peer-timeout-ms", EPD_OPT_INT, &fl.peer_timeout_ms, 4, 3600000,
         "silence after which a peer is declared dead"},
        {"connect-timeout-ms", EPD_OPT_INT, &fl.connect_timeout_ms, 1, 3600000,
         "deadline for connecting to a decode worker"},
        {"max-inflight-writes", EPD_OPT_INT, &fl.max_inflight_writes, 1, 1 << 24,
         "KV writes posted at once; more wait (backpressure) until earlier ones complete"},
        {"write-group-bytes", EPD_OPT_INT, &fl.write_group_bytes, 0, (int64_t)1 << 40,
         "while compute runs, post finished layers' writes once this many bytes wait "
         "(0: every layer as it finishes)"},
        {"layer-notify", EPD_OPT_BOOL, &fl.layer_notify, 0, 0,
         "after each layer's writes send decode a LayerDone fenced behind them, so it "
         "verifies that layer at once (--no-layer-notify: verification only after "
         "PrefillComplete)"},
        {"embed-slots", EPD_OPT_INT, &fl.embed_slots, 0, 1 << 16,
         "images whose embeddings this worker holds at once: the landing zone of the encoders' "
         "writes and the embedding cache (0: no images)"},
        {"max-image-pixels", EPD_OPT_INT, &fl.max_image_pixels, 1, (int64_t)1 << 40,
         "width x height limit of an image this worker decodes itself (no encoder pool)"},
        {"trace", EPD_OPT_STRING, &fl.trace, 0, 0,
         "record a per-request trace; Chrome trace JSON written to FILE at exit and on SIGUSR1"},
        {"trace-events", EPD_OPT_INT, &fl.trace_events, 1024, 1 << 26,
         "trace buffer capacity in events (64 bytes each; later events are dropped)"},
        {"router", EPD_OPT_STRING, &fl.router, 0, 0,
         "register with the router's control service HOST:PORT and heartbeat the load "
         "(absent: no registration)"},
        {"log-level", EPD_OPT_STRING, &fl.log_level, 0, 0, "error, warn, info, debug or trace"},
    };
    epd_opts_t o = {.prog = "epd-prefill",
                    .summary = "prefill worker: prompts in, KV streamed to decode per layer",
                    .opts = opts,
                    .n_opts = sizeof(opts) / sizeof(opts[0])};
    epd_log_level_t level;
    epd_status_t status;
    int argi;
    int rc;

    signal(SIGPIPE, SIG_IGN);
    status = epd_opts_parse(&o, argc, argv, &argi);
    if (status == EPD_ERR_CANCELED) {
        epd_opts_cleanup(&o);
        return 0;
    }
    if (status != EPD_OK) {
        epd_opts_cleanup(&o);
        return 1;
    }
    if (argi != argc) {
        rc = epd_prefill_fail("unexpected argument '%s' (flags are --name value)", argv[argi]);
    } else if (epd_log_level_parse(fl.log_level, &level) != EPD_OK) {
        rc = epd_prefill_fail("--log-level '%s': want error, warn, info, debug or trace",
                              fl.log_level);
    } else if (fl.model == NULL || fl.model[0] == '\0') {
        rc = epd_prefill_fail("--model DIR is required%s", "");
    } else if (strcmp(fl.transport, "ucx") != 0 && strcmp(fl.transport, "ofi") != 0) {
        rc = epd_prefill_fail("--transport '%s': want ucx or ofi", fl.transport);
    } else if (fl.worker_id != NULL && strlen(fl.worker_id) >= EPD_PREFILL_ID_MAX) {
        rc = epd_prefill_fail("--worker-id '%s' is too long", fl.worker_id);
    } else {
        epd_log_set_level(level);
        rc = epd_prefill_run(&fl);
    }
    epd_opts_cleanup(&o);
    return rc;
}
