/*
 * main.c — `epd-encoder`: the encoder daemon.
 *
 * Turns images into embeddings with the engine's vision encoder and writes
 * them with one-sided writes into the slot a prefill worker reserved in its
 * registered embedding region, then tells it with a fenced EmbedComplete
 * (proto/README.md rules 13–20; DESIGN.md for the why).
 *
 * Threads:
 *   - the loop thread (this one, after start-up): libuv loop owning every
 *     image in flight, the transport (driven by epd_xport_uv: it keeps
 *     progressing whatever compute does), all posting of writes and sends,
 *     the gRPC handlers (epd_rpc), timers and signals;
 *   - the compute thread (epd_encoder_compute): owns the engine, decodes and
 *     encodes one image at a time (FIFO), straight into the image's slot of
 *     the registered region, and hands the finished job back;
 *   - gRPC's own threads, hidden behind epd_rpc, and the registrar's thread
 *     (--router).
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
#include "epd_encoder_int.h"
#include "epd_image.h"
#include "epd_log.h"
#include "epd_rng.h"
#include "epd_time.h"

/* UCX and libfabric keep process-wide allocations until exit (not epd's):
 * LeakSanitizer must not fail a clean sanitizer-build shutdown on them. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libucs.so\nleak:libucp.so\nleak:libuct.so\nleak:libucm.so\n"
           "leak:libfabric.so\nleak:librdmacm.so\nleak:libibverbs.so\n";
}

#define EPD_ENCODER_TICK_MS 20 /* leases, deadlines, stash expiry, backpressure retries */

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
    const char *router;
    int64_t slots;
    int64_t max_image_bytes;
    int64_t max_pixels;
    int64_t lease_ms;
    int64_t peer_timeout_ms;
    int64_t connect_timeout_ms;
    int64_t max_inflight_writes;
    const char *trace;
    int64_t trace_events;
} epd_encoder_flags_t;

static void epd_encoder_on_tick(uv_timer_t *timer)
{
    epd__encoder_tick(timer->data, epd_time_now_ns());
}

/* Writes the trace (--trace): blocking file I/O, so only at exit and on an
 * explicit SIGUSR1, never per request. */
static void epd_encoder_trace_write(epd_encoder_srv_t *srv)
{
    uint64_t n, dropped;
    epd_status_t st;

    if (srv->trace == NULL) {
        return;
    }
    st = epd_trace_write_json(srv->trace, srv->trace_path, 0);
    epd_trace_counts(srv->trace, &n, &dropped);
    if (st != EPD_OK) {
        epd_log_error(EPD_ENCODER_LOG, 0, "cannot write the trace '%s': %s", srv->trace_path,
                      epd_status_string(st));
    } else {
        epd_log_info(EPD_ENCODER_LOG, 0,
                     "trace: %llu events written to %s (%llu dropped: buffer full)",
                     (unsigned long long)n, srv->trace_path, (unsigned long long)dropped);
    }
}

static void epd_encoder_on_sigusr1(uv_signal_t *sig, int signum)
{
    (void)signum;
    epd_encoder_trace_write(sig->data);
}

static void epd_encoder_on_signal(uv_signal_t *sig, int signum)
{
    epd_encoder_srv_t *srv = sig->data;

    if (srv->stopping) {
        return;
    }
    epd_log_info(EPD_ENCODER_LOG, 0,
                 "signal %d: stopping (%u images in flight; %llu EncodeRequests received, %llu "
                 "images written, %llu failed or aborted, %llu messages refused, %llu "
                 "undecodable frames since start)",
                 signum, srv->n_live, (unsigned long long)srv->received,
                 (unsigned long long)srv->served, (unsigned long long)srv->failed_reqs,
                 (unsigned long long)srv->refused, (unsigned long long)srv->bad_frames);
    srv->stopping = 1;
    for (epd_encoder_req_t *req = srv->all; req != NULL; req = req->all_next) {
        atomic_store(&req->job.cancel, 1);
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
static int epd_encoder_ready_file(const char *path, const char *line)
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
static int epd_encoder_register(epd_encoder_srv_t *srv, const char *router, const char *host)
{
    epd_registrar_config_t cfg;
    char ctl[300];
    void *req = NULL;
    size_t len = 0;
    epd_status_t st;

    snprintf(ctl, sizeof(ctl), "%s:%d", host, epd_rpc_server_port(srv->rpc));
    st = epd__encoder_register_pack(srv, ctl, &req, &len);
    if (st == EPD_OK) {
        memset(&cfg, 0, sizeof(cfg));
        cfg.router = router;
        cfg.request = req;
        cfg.request_len = len;
        cfg.load_cb = epd__encoder_registrar_load;
        cfg.drain_cb = epd__encoder_registrar_drain;
        cfg.cb_arg = srv;
        cfg.log_component = EPD_ENCODER_LOG;
        st = epd_registrar_start(srv->loop, &cfg, &srv->registrar);
        epd_free(req);
    }
    if (st != EPD_OK) {
        epd_log_error(EPD_ENCODER_LOG, 0, "cannot register with the router '%s': %s", router,
                      epd_status_string(st));
        return -1;
    }
    return 0;
}

static int epd_encoder_fail(const char *fmt, const char *arg)
{
    epd_log_error(EPD_ENCODER_LOG, 0, fmt, arg);
    return 1;
}

static void epd_encoder_close_walk(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h)) {
        uv_close(h, NULL);
    }
}

static void epd_encoder_model_name(epd_encoder_srv_t *srv, const char *model)
{
    size_t n = strlen(model);
    const char *end, *start;

    while (n > 1 && model[n - 1] == '/') {
        n--;
    }
    end = model + n;
    start = end;
    while (start > model && start[-1] != '/') {
        start--;
    }
    snprintf(srv->model_name, sizeof(srv->model_name), "%.*s", (int)(end - start), start);
}

static int epd_encoder_run(const epd_encoder_flags_t *fl)
{
    epd_engine_config_t ecfg;
    epd_xport_config_t xcfg;
    epd_encoder_srv_t *srv;
    epd_engine_t *engine = NULL;
    char host[256];
    char line[512];
    const char *colon;
    uint64_t region_bytes;
    epd_status_t st;
    int rc = 1;
    uv_loop_t loop;

    srv = epd_calloc(1, sizeof(*srv));
    if (srv == NULL) {
        return epd_encoder_fail("out of memory%s", "");
    }
    srv->model_dir = fl->model;
    srv->engine_name = fl->engine;
    if (fl->worker_id != NULL && fl->worker_id[0] != '\0') {
        snprintf(srv->worker_id, sizeof(srv->worker_id), "%s", fl->worker_id);
    } else {
        snprintf(srv->worker_id, sizeof(srv->worker_id), "encoder-%d", (int)getpid());
    }
    epd_encoder_model_name(srv, fl->model);
    srv->transport = fl->transport;
    srv->slots = (uint32_t)fl->slots;
    srv->max_image_bytes = (uint64_t)fl->max_image_bytes;
    srv->max_pixels = (uint64_t)fl->max_pixels;
    srv->lease_ms = (uint32_t)fl->lease_ms;
    srv->peer_timeout_ms = (uint32_t)fl->peer_timeout_ms;
    srv->connect_timeout_ms = (uint32_t)fl->connect_timeout_ms;
    srv->trace_path = fl->trace;
    srv->epoch.start_time_ns = epd_time_wall_ns();
    srv->epoch.nonce = epd_rng_entropy();
    srv->loop = &loop;

    /* the model (blocking: before the loop runs) */
    memset(&ecfg, 0, sizeof(ecfg));
    ecfg.model_dir = fl->model;
    ecfg.max_batch = 1;
    st = epd_engine_open(fl->engine, &ecfg, &engine);
    if (st != EPD_OK) {
        epd_log_error(EPD_ENCODER_LOG, 0, "cannot open model '%s' with engine '%s': %s", fl->model,
                      fl->engine, epd_status_string(st));
        epd_free(srv);
        return 1;
    }
    srv->info = epd_engine_info(engine);
    if (srv->info->image_embeddings == 0 || srv->info->embed_dim == 0) {
        epd_log_error(EPD_ENCODER_LOG, 0,
                      "model '%s' (engine '%s') has no vision encoder: nothing to encode with",
                      fl->model, fl->engine);
        epd_engine_close(engine);
        epd_free(srv);
        return 1;
    }
    srv->slot_bytes = (size_t)srv->info->image_embeddings * srv->info->embed_dim * sizeof(float);
    srv->slot_stride = (srv->slot_bytes + 63) & ~(size_t)63;

    if (uv_loop_init(&loop) != 0) {
        epd_engine_close(engine);
        epd_free(srv);
        return epd_encoder_fail("cannot create the event loop%s", "");
    }
    if (fl->trace != NULL && fl->trace[0] != '\0') {
        char pname[192];

        snprintf(pname, sizeof(pname), "epd-encoder %s", srv->worker_id);
        st = epd_trace_create((size_t)fl->trace_events, pname, &srv->trace);
        if (st != EPD_OK) {
            epd_log_error(EPD_ENCODER_LOG, 0, "cannot create the trace recorder: %s",
                          epd_status_string(st));
            goto out_engine;
        }
        epd_trace_thread_name(srv->trace, "encoder loop");
    }
    srv->tx_cap = 64 * 1024; /* what the encoder sends is small: Error, EmbedComplete, ... */
    srv->tx_buf = epd_malloc(srv->tx_cap);
    srv->table_size = 16;
    while (srv->table_size < 2 * srv->slots) {
        srv->table_size *= 2;
    }
    srv->table = epd_calloc(srv->table_size, sizeof(*srv->table));
    srv->free_slots = epd_calloc(srv->slots, sizeof(*srv->free_slots));
    if (srv->tx_buf == NULL || srv->table == NULL || srv->free_slots == NULL) {
        epd_log_error(EPD_ENCODER_LOG, 0, "out of memory");
        goto out_engine;
    }
    for (uint32_t i = 0; i < srv->slots; i++) {
        srv->free_slots[i] = srv->slots - 1 - i; /* lowest on top */
    }
    srv->n_free_slots = srv->slots;

    /* the transport, bound to this (the loop) thread; an EncodeRequest
     * carries the image itself: messages up to the transport's own limit
     * arrive whole, so an image over --max-image-bytes is refused with a
     * clear EPD_ERR_TOO_LONG instead of being dropped by the transport
     * (held and send copies are sized to each message, so the large limit
     * costs nothing for small ones) */
    epd_xport_config_init(&xcfg);
    xcfg.backend = fl->transport;
    xcfg.expect = fl->expect;
    xcfg.provider = fl->provider;
    xcfg.max_msg_size = EPD_ENCODER_MSG_LIMIT;
    xcfg.max_inflight = (uint32_t)fl->max_inflight_writes;
    xcfg.peer_timeout_ms = srv->peer_timeout_ms;
    xcfg.connect_timeout_ms = srv->connect_timeout_ms;
    xcfg.msg_cb = epd__encoder_on_msg;
    xcfg.accept_cb = epd__encoder_on_accept;
    xcfg.err_cb = epd__encoder_on_ep_error;
    xcfg.cb_arg = srv;
    st = epd_xport_create(&xcfg, &srv->x);
    if (st != EPD_OK) {
        epd_log_error(EPD_ENCODER_LOG, 0, "cannot start the '%s' transport: %s", fl->transport,
                      epd_status_string(st));
        goto out_engine;
    }
    st = epd_xport_address(srv->x, &srv->addr, &srv->addr_len);
    if (st != EPD_OK) {
        epd_log_error(EPD_ENCODER_LOG, 0, "no transport address: %s", epd_status_string(st));
        goto out_xport;
    }
    /* the slots, registered: the source of the one-sided writes, and where
     * the compute thread encodes into */
    region_bytes = (uint64_t)srv->slots * srv->slot_stride;
    st = epd_xport_mr_alloc(srv->x, (size_t)region_bytes, &srv->region);
    if (st != EPD_OK) {
        epd_log_error(EPD_ENCODER_LOG, 0, "cannot allocate a %llu-byte embedding region: %s",
                      (unsigned long long)region_bytes, epd_status_string(st));
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

    st = epd_encoder_compute_create(&loop, engine, srv->slots, epd__encoder_on_job, srv,
                                    &srv->compute);
    if (st != EPD_OK) {
        epd_log_error(EPD_ENCODER_LOG, 0, "cannot start the compute thread: %s",
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
        epd_log_error(EPD_ENCODER_LOG, 0, "cannot drive the transport from the loop: %s",
                      epd_status_string(st));
        goto out_handles;
    }
    st = epd_rpc_server_create(&loop, fl->control_addr, epd__encoder_on_rpc, srv, &srv->rpc);
    if (st != EPD_OK) {
        epd_log_error(EPD_ENCODER_LOG, 0, "cannot serve the control plane on %s: %s",
                      fl->control_addr, epd_status_string(st));
        goto out_handles;
    }
    uv_timer_start(&srv->timer, epd_encoder_on_tick, EPD_ENCODER_TICK_MS, EPD_ENCODER_TICK_MS);
    uv_signal_start(&srv->sigterm, epd_encoder_on_signal, SIGTERM);
    uv_signal_start(&srv->sigint, epd_encoder_on_signal, SIGINT);
    uv_signal_start(&srv->sigusr1, epd_encoder_on_sigusr1, SIGUSR1);

    colon = strrchr(fl->control_addr, ':');
    snprintf(host, sizeof(host), "%.*s",
             colon != NULL ? (int)(colon - fl->control_addr) : (int)strlen(fl->control_addr),
             fl->control_addr);
    snprintf(line, sizeof(line), "control=%s:%d pid=%d worker=%s transport=%s\n", host,
             epd_rpc_server_port(srv->rpc), (int)getpid(), srv->worker_id, fl->transport);
    {
        char desc[512];

        epd_xport_describe(srv->x, desc, sizeof(desc));
        epd_log_info(EPD_ENCODER_LOG, 0,
                     "serving model '%s': %u embeddings x %u f32 per image (%zu bytes), %u "
                     "slots (%llu bytes registered), images up to %llu bytes and %llu pixels, "
                     "lease %u ms; transport %s",
                     srv->model_name, srv->info->image_embeddings, srv->info->embed_dim,
                     srv->slot_bytes, srv->slots, (unsigned long long)region_bytes,
                     (unsigned long long)srv->max_image_bytes, (unsigned long long)srv->max_pixels,
                     srv->lease_ms, desc);
    }
    if (fl->ready_file != NULL && fl->ready_file[0] != '\0' &&
        epd_encoder_ready_file(fl->ready_file, line) != 0) {
        epd_log_error(EPD_ENCODER_LOG, 0, "cannot write the ready file '%s': %s", fl->ready_file,
                      strerror(errno));
        epd_encoder_on_signal(&srv->sigterm, 0);
        uv_run(&loop, UV_RUN_DEFAULT);
        goto out_stop;
    }
    epd_log_info(EPD_ENCODER_LOG, 0, "ready: %.*s", (int)strlen(line) - 1, line);
    if (fl->router != NULL && fl->router[0] != '\0' &&
        epd_encoder_register(srv, fl->router, host) != 0) {
        epd_encoder_on_signal(&srv->sigterm, 0);
        uv_run(&loop, UV_RUN_DEFAULT);
        goto out_stop;
    }

    uv_run(&loop, UV_RUN_DEFAULT);
    rc = 0;

out_stop:
    /* stopped by a signal: the compute thread ends after the job it runs
     * (every job is canceled), then the transport goes */
    epd_encoder_compute_destroy(srv->compute);
    srv->compute = NULL;
    uv_run(&loop, UV_RUN_DEFAULT);
    goto out_xport;

out_handles:
    epd_rpc_server_destroy(srv->rpc);
    epd_xport_uv_stop(srv->xuv);
    epd_encoder_compute_destroy(srv->compute);
    srv->compute = NULL;
    uv_walk(&loop, epd_encoder_close_walk, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
out_xport:
    srv->stopping = 1;
    /* closes every endpoint (the write still posted completes with
     * EPD_ERR_CANCELED into its request, which still exists) and frees the
     * region */
    epd_xport_destroy(srv->x);
    srv->x = NULL;
    srv->region = NULL;
    uv_walk(&loop, epd_encoder_close_walk, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
out_engine:
    epd_engine_close(engine);
    epd_encoder_trace_write(srv);
    epd_trace_destroy(srv->trace);
    epd__encoder_reqs_free_all(srv);
    while (srv->peers != NULL) {
        epd_encoder_peer_t *p = srv->peers;

        srv->peers = p->next;
        epd_free(p);
    }
    for (uint32_t i = 0; i < srv->n_stash; i++) {
        epd_msg_free(srv->stash[i].env);
    }
    epd_free(srv->free_slots);
    epd_free(srv->table);
    epd_free(srv->tx_buf);
    if (uv_loop_close(&loop) != 0) {
        epd_log_warn(EPD_ENCODER_LOG, 0, "event loop closed with handles still open");
    }
    epd_free(srv);
    return rc;
}

int main(int argc, char **argv)
{
    epd_encoder_flags_t fl = {
        .model = NULL,
        .engine = "ref",
        .worker_id = NULL,
        .transport = "ucx",
        .expect = "any",
        .provider = NULL,
        .control_addr = "127.0.0.1:0",
        .ready_file = NULL,
        .log_level = "info",
        .router = NULL,
        .slots = 16,
        .max_image_bytes = 8 << 20,
        .max_pixels = (int64_t)EPD_IMAGE_MAX_PIXELS_DEFAULT,
        .lease_ms = 5000,
        .peer_timeout_ms = 3000,
        .connect_timeout_ms = 3000,
        .max_inflight_writes = 4096,
        .trace = NULL,
        .trace_events = 1 << 20,
    };
    const epd_opt_t opts[] = {
        {"model", EPD_OPT_STRING, &fl.model, 0, 0,
         "model folder (config.json + model.safetensors, with a vision encoder)"},
        {"engine", EPD_OPT_STRING, &fl.engine, 0, 0, "engine: built-in name or path to a .so"},
        {"worker-id", EPD_OPT_STRING, &fl.worker_id, 0, 0, "worker name (default encoder-<pid>)"},
        {"transport", EPD_OPT_STRING, &fl.transport, 0, 0, "transport backend: ucx or ofi"},
        {"expect-transport", EPD_OPT_STRING, &fl.expect, 0, 0,
         "refuse peers reached other than by: any, shm, tcp, rdma"},
        {"provider", EPD_OPT_STRING, &fl.provider, 0, 0, "libfabric provider hint (ofi)"},
        {"control-addr", EPD_OPT_STRING, &fl.control_addr, 0, 0,
         "gRPC control address HOST:PORT (port 0: ephemeral)"},
        {"ready-file", EPD_OPT_STRING, &fl.ready_file, 0, 0,
         "write 'control=... pid=... worker=... transport=...' here once serving"},
        {"router", EPD_OPT_STRING, &fl.router, 0, 0,
         "register with the router's control service HOST:PORT (role encoder) and heartbeat "
         "the load (absent: no registration)"},
        {"slots", EPD_OPT_INT, &fl.slots, 1, 4096,
         "images in flight at once: slots of the registered region the writes come from"},
        {"max-image-bytes", EPD_OPT_INT, &fl.max_image_bytes, 1,
         (double)(EPD_ENCODER_MSG_LIMIT - EPD_ENCODER_MSG_HEADROOM),
         "largest encoded image an EncodeRequest may carry (the transport's message limit "
         "is set to this plus 64 KiB)"},
        {"max-pixels", EPD_OPT_INT, &fl.max_pixels, 1, (double)(65536.0 * 65536.0),
         "largest width x height decoded (refused from the header, before any pixel memory)"},
        {"lease-ms", EPD_OPT_INT, &fl.lease_ms, 1, 3600000,
         "fail an image whose EmbedReservation has not come this long after its embeddings "
         "are ready (and drop an early reservation without a lease of its own after this)"},
        {"peer-timeout-ms", EPD_OPT_INT, &fl.peer_timeout_ms, 4, 3600000,
         "silence after which a peer is declared dead"},
        {"connect-timeout-ms", EPD_OPT_INT, &fl.connect_timeout_ms, 1, 3600000,
         "deadline for connecting to a prefill worker"},
        {"max-inflight-writes", EPD_OPT_INT, &fl.max_inflight_writes, 1, 1 << 24,
         "embedding writes posted at once; more wait (backpressure) until earlier ones complete"},
        {"trace", EPD_OPT_STRING, &fl.trace, 0, 0,
         "record a per-image trace; Chrome trace JSON written to FILE at exit and on SIGUSR1"},
        {"trace-events", EPD_OPT_INT, &fl.trace_events, 1024, 1 << 26,
         "trace buffer capacity in events (64 bytes each; later events are dropped)"},
        {"log-level", EPD_OPT_STRING, &fl.log_level, 0, 0, "error, warn, info, debug or trace"},
    };
    epd_opts_t o = {.prog = "epd-encoder",
                    .summary = "encoder worker: images in, embeddings written into prefill's slots",
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
        rc = epd_encoder_fail("unexpected argument '%s' (flags are --name value)", argv[argi]);
    } else if (epd_log_level_parse(fl.log_level, &level) != EPD_OK) {
        rc = epd_encoder_fail("--log-level '%s': want error, warn, info, debug or trace",
                              fl.log_level);
    } else if (fl.model == NULL || fl.model[0] == '\0') {
        rc = epd_encoder_fail("--model DIR is required%s", "");
    } else if (strcmp(fl.transport, "ucx") != 0 && strcmp(fl.transport, "ofi") != 0) {
        rc = epd_encoder_fail("--transport '%s': want ucx or ofi", fl.transport);
    } else if (fl.worker_id != NULL && strlen(fl.worker_id) >= EPD_ENCODER_ID_MAX) {
        rc = epd_encoder_fail("--worker-id '%s' is too long", fl.worker_id);
    } else {
        epd_log_set_level(level);
        rc = epd_encoder_run(&fl);
    }
    epd_opts_cleanup(&o);
    return rc;
}
