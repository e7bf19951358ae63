/*
 * main.c — `epd-router`: the cluster's front door.
 *
 * Serves the OpenAI API over HTTP/1.1 (epd_http + epd_openai), keeps the
 * registry of prefill and decode workers (they register and heartbeat over
 * the epd.Control gRPC service, which the router serves), and sends each
 * request to a prefill and a decode worker chosen by the policy through
 * the request-plane client (epd_client), streaming the tokens back.
 *
 * Threads: one libuv loop thread (this one) owns everything: HTTP
 * connections, requests, the registry, the client's transport (driven by
 * epd_xport_uv; epd_client_tick from a timer) and the gRPC handlers
 * (epd_rpc hands each call to this loop).  gRPC's own threads and libuv's
 * thread pool (Drain forwarding, a blocking gRPC call) are the only other
 * threads; they never touch the router's state.
 *
 * Shutdown (SIGTERM/SIGINT): stop listening (HTTP, gRPC), let the HTTP
 * server's close callbacks abort what clients still wait on, then close
 * the client (every endpoint) and exit 0.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "epd_alloc.h"
#include "epd_config.h"
#include "epd_log.h"
#include "epd_rng.h"
#include "epd_router_int.h"
#include "epd_time.h"

#define EPD_ROUTER_TICK_MS 20

typedef struct {
    const char *listen;
    const char *control_addr;
    const char *model;
    const char *engine;
    const char *served_model_name;
    const char *policy;
    const char *ready_file;
    const char *transport;
    const char *expect;
    const char *provider;
    const char *worker_id;
    const char *log_level;
    int64_t heartbeat_ms;
    int64_t dead_after_ms;
    int64_t max_retries;
    int64_t request_timeout_ms;
    int64_t max_images;
    int64_t max_image_bytes;
    int64_t max_image_pixels;
    int64_t max_connections;
    int64_t max_body_bytes;
    int64_t peer_timeout_ms;
    int64_t connect_timeout_ms;
    const char *trace;
    int64_t trace_events;
} epd_router_flags_t;

/* Consulted only by LeakSanitizer builds: UCX and libfabric keep some
 * process-wide allocations until exit; they are not epd's. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libucs.so\nleak:libucp.so\nleak:libuct.so\nleak:libucm.so\n"
           "leak:libfabric.so\nleak:librdmacm.so\nleak:libibverbs.so\n";
}

static int epd_router_fail(const char *fmt, const char *arg)
{
    epd_log_error(EPD_ROUTER_LOG, 0, fmt, arg);
    return 1;
}

static void epd_router_on_tick(uv_timer_t *timer)
{
    epd_router_t *rt = timer->data;

    epd_client_tick(rt->client);
    epd__router_tick(rt, epd_time_now_ns());
}

/* Writes the trace (--trace): blocking file I/O, so only at exit and on an
 * explicit SIGUSR1, never per request. */
static void epd_router_trace_write(epd_router_t *rt)
{
    uint64_t n, dropped;
    epd_status_t st;

    if (rt->trace == NULL) {
        return;
    }
    st = epd_trace_write_json(rt->trace, rt->trace_path, 0);
    epd_trace_counts(rt->trace, &n, &dropped);
    if (st != EPD_OK) {
        epd_log_error(EPD_ROUTER_LOG, 0, "cannot write the trace '%s': %s", rt->trace_path,
                      epd_status_string(st));
    } else {
        epd_log_info(EPD_ROUTER_LOG, 0, "trace: %llu events written to %s (%llu dropped: buffer full)",
                     (unsigned long long)n, rt->trace_path, (unsigned long long)dropped);
    }
}

static void epd_router_on_sigusr1(uv_signal_t *sig, int signum)
{
    (void)signum;
    epd_router_trace_write(sig->data);
}

static void epd_router_on_signal(uv_signal_t *sig, int signum)
{
    epd_router_t *rt = sig->data;

    if (rt->stopping) {
        return;
    }
    epd_log_info(EPD_ROUTER_LOG, 0, "signal %d: stopping (%u requests in flight)", signum,
                 rt->n_reqs);
    rt->stopping = 1;
    epd_http_server_destroy(rt->http);
    rt->http = NULL;
    epd_rpc_server_destroy(rt->rpc);
    rt->rpc = NULL;
    uv_signal_stop(&rt->sigterm);
    uv_signal_stop(&rt->sigint);
    /* the timer and the transport keep running until the HTTP server's
     * close callbacks have aborted the requests (see epd_router_run) */
}

static int epd_router_ready_file(const char *path, const char *line)
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

static void epd_router_close_walk(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h)) {
        uv_close(h, NULL);
    }
}

/* Splits "HOST:PORT" into host[] and *port_p. */
static int epd_router_split_addr(const char *addr, char *host, size_t host_cap, uint16_t *port_p)
{
    const char *colon = strrchr(addr, ':');
    char *end;
    long port;

    if (colon == NULL || colon == addr || (size_t)(colon - addr) >= host_cap) {
        return -1;
    }
    errno = 0;
    port = strtol(colon + 1, &end, 10);
    if (errno != 0 || *end != '\0' || end == colon + 1 || port < 0 || port > 65535) {
        return -1;
    }
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    if (host[0] == '[' && host[strlen(host) - 1] == ']') {
        memmove(host, host + 1, strlen(host) - 2);
        host[strlen(host) - 2] = '\0';
    }
    *port_p = (uint16_t)port;
    return 0;
}

static int epd_router_run(const epd_router_flags_t *fl)
{
    epd_engine_config_t ecfg;
    epd_client_config_t cc;
    epd_http_config_t hc;
    epd_router_policy_t policy;
    epd_router_t *rt;
    char http_host[256];
    char ctl_host[256];
    uint16_t http_port = 0, ctl_port = 0;
    char line[640];
    char client_id[EPD_CLIENT_NAME_MAX];
    epd_status_t st;
    int rc = 1;
    uv_loop_t loop;

    if (epd_router_policy_parse(fl->policy, &policy) != EPD_OK) {
        return epd_router_fail("--policy '%s': want round-robin, least-load or prefix-affinity",
                               fl->policy);
    }
    if (epd_router_split_addr(fl->listen, http_host, sizeof(http_host), &http_port) != 0) {
        return epd_router_fail("--listen '%s': want HOST:PORT", fl->listen);
    }
    if (epd_router_split_addr(fl->control_addr, ctl_host, sizeof(ctl_host), &ctl_port) != 0) {
        return epd_router_fail("--control-addr '%s': want HOST:PORT", fl->control_addr);
    }
    rt = epd_calloc(1, sizeof(*rt));
    if (rt == NULL) {
        return epd_router_fail("out of memory%s", "");
    }
    rt->loop = &loop;
    rt->model_dir = fl->model;
    rt->transport = fl->transport;
    rt->heartbeat_ms = (uint32_t)fl->heartbeat_ms;
    rt->dead_after_ms = (uint32_t)fl->dead_after_ms;
    rt->max_retries = (uint32_t)fl->max_retries;
    rt->request_timeout_ms = (uint32_t)fl->request_timeout_ms;
    rt->max_images = (uint32_t)fl->max_images;
    rt->max_image_bytes = (uint64_t)fl->max_image_bytes;
    rt->max_image_pixels = (uint64_t)fl->max_image_pixels;
    rt->epoch_start_ns = epd_time_wall_ns();
    rt->epoch_nonce = epd_rng_entropy();
    if (fl->served_model_name != NULL && fl->served_model_name[0] != '\0') {
        snprintf(rt->model_name, sizeof(rt->model_name), "%s", fl->served_model_name);
    } else {
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
        snprintf(rt->model_name, sizeof(rt->model_name), "%.*s", (int)(end - start), start);
    }
    epd_router_registry_init(&rt->reg, policy, rt->dead_after_ms);

    /* the tokenizer (blocking: before the loop runs) */
    memset(&ecfg, 0, sizeof(ecfg));
    ecfg.model_dir = fl->model;
    ecfg.max_batch = 1;
    st = epd_engine_open(fl->engine, &ecfg, &rt->engine);
    if (st != EPD_OK) {
        epd_log_error(EPD_ROUTER_LOG, 0, "cannot open model '%s' with engine '%s': %s", fl->model,
                      fl->engine, epd_status_string(st));
        epd_free(rt);
        return 1;
    }
    rt->info = epd_engine_info(rt->engine);

    if (uv_loop_init(&loop) != 0) {
        epd_engine_close(rt->engine);
        epd_free(rt);
        return epd_router_fail("cannot create the event loop%s", "");
    }
    uv_timer_init(&loop, &rt->timer);
    rt->timer.data = rt;
    uv_signal_init(&loop, &rt->sigterm);
    rt->sigterm.data = rt;
    uv_signal_init(&loop, &rt->sigint);
    rt->sigint.data = rt;
    uv_signal_init(&loop, &rt->sigusr1);
    rt->sigusr1.data = rt;
    if (fl->trace != NULL && fl->trace[0] != '\0') {
        char pname[64];

        snprintf(pname, sizeof(pname), "epd-router %d", (int)getpid());
        st = epd_trace_create((size_t)fl->trace_events, pname, &rt->trace);
        if (st != EPD_OK) {
            epd_log_error(EPD_ROUTER_LOG, 0, "cannot create the trace recorder: %s",
                          epd_status_string(st));
            goto out_handles;
        }
        rt->trace_path = fl->trace;
        epd_trace_thread_name(rt->trace, "router loop");
    }

    epd_client_config_init(&cc);
    cc.backend = fl->transport;
    cc.expect = fl->expect;
    cc.provider = fl->provider;
    cc.peer_timeout_ms = (uint32_t)fl->peer_timeout_ms;
    cc.connect_timeout_ms = (uint32_t)fl->connect_timeout_ms;
    if (rt->info->image_embeddings > 0) {
        /* an image travels in one message (to its encoder, or inline to a
         * prefill worker): room for the largest one */
        cc.max_msg_size = (size_t)16 << 20;
    }
    if (fl->worker_id != NULL && fl->worker_id[0] != '\0') {
        snprintf(client_id, sizeof(client_id), "%s", fl->worker_id);
    } else {
        snprintf(client_id, sizeof(client_id), "router-%d", (int)getpid());
    }
    cc.worker_id = client_id;
    cc.role = EPD_CLIENT_ROLE_ROUTER;
    cc.event_cb = epd__router_on_event;
    cc.cb_arg = rt;
    st = epd_client_create(&cc, &rt->client);
    if (st != EPD_OK) {
        epd_log_error(EPD_ROUTER_LOG, 0, "cannot start the '%s' transport: %s", fl->transport,
                      epd_status_string(st));
        goto out_handles;
    }
    {
        uint32_t tick = (uint32_t)fl->peer_timeout_ms / 8;

        tick = tick == 0 ? 1 : tick > 50 ? 50 : tick;
        st = epd_xport_uv_start(&loop, epd_client_xport(rt->client), tick, &rt->xuv);
    }
    if (st != EPD_OK) {
        epd_log_error(EPD_ROUTER_LOG, 0, "cannot drive the transport from the loop: %s",
                      epd_status_string(st));
        goto out_handles;
    }
    st = epd_rpc_server_create(&loop, fl->control_addr, epd__router_on_rpc, rt, &rt->rpc);
    if (st != EPD_OK) {
        epd_log_error(EPD_ROUTER_LOG, 0, "cannot serve the control plane on %s: %s",
                      fl->control_addr, epd_status_string(st));
        goto out_handles;
    }
    epd_http_config_init(&hc);
    hc.host = http_host;
    hc.port = http_port;
    hc.max_connections = (unsigned)fl->max_connections;
    hc.max_body_bytes = (size_t)fl->max_body_bytes;
    hc.handler = epd__router_on_http;
    hc.arg = rt;
    st = epd_http_server_create(&loop, &hc, &rt->http);
    if (st != EPD_OK) {
        epd_log_error(EPD_ROUTER_LOG, 0, "cannot serve HTTP on %s: %s", fl->listen,
                      epd_status_string(st));
        goto out_handles;
    }
    uv_timer_start(&rt->timer, epd_router_on_tick, EPD_ROUTER_TICK_MS, EPD_ROUTER_TICK_MS);
    uv_signal_start(&rt->sigterm, epd_router_on_signal, SIGTERM);
    uv_signal_start(&rt->sigint, epd_router_on_signal, SIGINT);
    if (rt->trace != NULL) {
        uv_signal_start(&rt->sigusr1, epd_router_on_sigusr1, SIGUSR1);
    }

    snprintf(line, sizeof(line), "http=%s:%u control=%s:%d pid=%d\n", http_host,
             (unsigned)epd_http_server_port(rt->http), ctl_host, epd_rpc_server_port(rt->rpc),
             (int)getpid());
    epd_log_info(EPD_ROUTER_LOG, 0,
                 "serving model '%s' (context %u, %u layers) as '%s': policy %s, heartbeat %u "
                 "ms, dead after %u ms, %u retries, transport %s",
                 fl->model, rt->info->max_context, rt->info->kv.n_layers, rt->model_name,
                 epd_router_policy_name(policy), rt->heartbeat_ms, rt->dead_after_ms,
                 rt->max_retries, fl->transport);
    if (fl->ready_file != NULL && fl->ready_file[0] != '\0' &&
        epd_router_ready_file(fl->ready_file, line) != 0) {
        epd_log_error(EPD_ROUTER_LOG, 0, "cannot write the ready file '%s': %s", fl->ready_file,
                      strerror(errno));
        epd_router_on_signal(&rt->sigterm, 0);
    } else {
        epd_log_info(EPD_ROUTER_LOG, 0, "ready: %.*s", (int)strlen(line) - 1, line);
        rc = 0;
    }

    /* runs until a signal; then until the HTTP server's close callbacks
     * have run (each aborts its request upstream) */
    while (uv_run(&loop, UV_RUN_ONCE) != 0) {
        if (rt->stopping && rt->http == NULL) {
            /* give aborts a moment to go out, then stop the rest */
            uv_run(&loop, UV_RUN_NOWAIT);
            break;
        }
    }

out_handles:
    epd_http_server_destroy(rt->http);
    rt->http = NULL;
    epd_rpc_server_destroy(rt->rpc);
    rt->rpc = NULL;
    uv_run(&loop, UV_RUN_NOWAIT);
    epd_xport_uv_stop(rt->xuv);
    rt->xuv = NULL;
    uv_timer_stop(&rt->timer);
    /* finish the thread pool's Drain forwards and every close callback */
    uv_walk(&loop, epd_router_close_walk, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    epd_client_destroy(rt->client);
    rt->client = NULL;
    epd__router_reqs_free_all(rt);
    uv_walk(&loop, epd_router_close_walk, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&loop) != 0) {
        epd_log_warn(EPD_ROUTER_LOG, 0, "event loop closed with handles still open");
    }
    epd_router_registry_cleanup(&rt->reg);
    epd_oai_buf_cleanup(&rt->out);
    epd_free(rt->tok_scratch);
    epd_free(rt->detok_scratch);
    epd_engine_close(rt->engine);
    epd_router_trace_write(rt);
    epd_trace_destroy(rt->trace);
    epd_free(rt);
    return rc;
}

int main(int argc, char **argv)
{
    epd_router_flags_t fl = {
        .listen = "127.0.0.1:8000",
        .control_addr = "127.0.0.1:0",
        .model = NULL,
        .engine = "ref",
        .served_model_name = NULL,
        .policy = "least-load",
        .ready_file = NULL,
        .transport = "ucx",
        .expect = "any",
        .provider = NULL,
        .worker_id = NULL,
        .log_level = "info",
        .heartbeat_ms = 500,
        .dead_after_ms = 2000,
        .max_retries = 2,
        .request_timeout_ms = 300000,
        .max_images = 8,
        .max_image_bytes = 8 << 20,
        .max_image_pixels = (int64_t)(4096 * 4096),
        .max_connections = 4096,
        .max_body_bytes = 16 << 20,
        .peer_timeout_ms = 3000,
        .connect_timeout_ms = 3000,
        .trace = NULL,
        .trace_events = 1 << 20,
    };
    const epd_opt_t opts[] = {
        {"listen", EPD_OPT_STRING, &fl.listen, 0, 0, "HTTP address HOST:PORT (port 0: ephemeral)"},
        {"control-addr", EPD_OPT_STRING, &fl.control_addr, 0, 0,
         "gRPC control address HOST:PORT where workers register (port 0: ephemeral)"},
        {"model", EPD_OPT_STRING, &fl.model, 0, 0, "model folder (its tokenizer and context)"},
        {"engine", EPD_OPT_STRING, &fl.engine, 0, 0, "engine whose tokenizer to use: ref or sim"},
        {"served-model-name", EPD_OPT_STRING, &fl.served_model_name, 0, 0,
         "the model name clients send (default: the basename of --model)"},
        {"policy", EPD_OPT_STRING, &fl.policy, 0, 0,
         "worker choice: round-robin, least-load or prefix-affinity"},
        {"heartbeat-ms", EPD_OPT_INT, &fl.heartbeat_ms, 10, 600000,
         "heartbeat interval the workers are told"},
        {"dead-after-ms", EPD_OPT_INT, &fl.dead_after_ms, 10, 3600000,
         "a worker silent this long is SUSPECT (no new work)"},
        {"max-retries", EPD_OPT_INT, &fl.max_retries, 0, 16,
         "resubmissions of a request that failed before its first token"},
        {"request-timeout-ms", EPD_OPT_INT, &fl.request_timeout_ms, 1, 3600000,
         "deadline of each request"},
        {"max-images", EPD_OPT_INT, &fl.max_images, 0, 8,
         "images per chat request (beyond: 400; 8 at most)"},
        {"max-image-bytes", EPD_OPT_INT, &fl.max_image_bytes, 1, 15 << 20,
         "encoded size of one image, after base64 (beyond: 400)"},
        {"max-image-pixels", EPD_OPT_INT, &fl.max_image_pixels, 1, (int64_t)1 << 32,
         "width x height of one image, read from its header (beyond: 400)"},
        {"max-connections", EPD_OPT_INT, &fl.max_connections, 1, 1 << 20,
         "HTTP connections at once (beyond: 503)"},
        {"max-body-bytes", EPD_OPT_INT, &fl.max_body_bytes, 1024, 1 << 30,
         "largest request body (beyond: 413)"},
        {"ready-file", EPD_OPT_STRING, &fl.ready_file, 0, 0,
         "write 'http=... control=... pid=...' here once serving"},
        {"transport", EPD_OPT_STRING, &fl.transport, 0, 0, "request-plane transport: ucx or ofi"},
        {"expect-transport", EPD_OPT_STRING, &fl.expect, 0, 0, "any, shm, tcp or rdma"},
        {"provider", EPD_OPT_STRING, &fl.provider, 0, 0, "libfabric provider hint (ofi)"},
        {"worker-id", EPD_OPT_STRING, &fl.worker_id, 0, 0,
         "the router's name on the request plane (default router-<pid>)"},
        {"peer-timeout-ms", EPD_OPT_INT, &fl.peer_timeout_ms, 4, 3600000,
         "silence after which a worker's endpoint is declared dead"},
        {"connect-timeout-ms", EPD_OPT_INT, &fl.connect_timeout_ms, 1, 3600000,
         "deadline for connecting to a worker"},
        {"trace", EPD_OPT_STRING, &fl.trace, 0, 0,
         "record a per-request trace (ids as the workers see them); Chrome trace JSON written "
         "to FILE at exit and on SIGUSR1"},
        {"trace-events", EPD_OPT_INT, &fl.trace_events, 1024, 1 << 26,
         "trace buffer capacity in events (64 bytes each; later events are dropped)"},
        {"log-level", EPD_OPT_STRING, &fl.log_level, 0, 0, "error, warn, info, debug or trace"},
    };
    epd_opts_t o = {.prog = "epd-router",
                    .summary = "OpenAI-compatible HTTP front door of an epd cluster",
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
        rc = epd_router_fail("unexpected argument '%s' (flags are --name value)", argv[argi]);
    } else if (epd_log_level_parse(fl.log_level, &level) != EPD_OK) {
        rc = epd_router_fail("--log-level '%s': want error, warn, info, debug or trace",
                             fl.log_level);
    } else if (fl.model == NULL || fl.model[0] == '\0') {
        rc = epd_router_fail("--model DIR is required (its tokenizer)%s", "");
    } else if (strcmp(fl.transport, "ucx") != 0 && strcmp(fl.transport, "ofi") != 0) {
        rc = epd_router_fail("--transport '%s': want ucx or ofi", fl.transport);
    } else if (fl.served_model_name != NULL &&
               strlen(fl.served_model_name) >= EPD_CLIENT_NAME_MAX) {
        rc = epd_router_fail("--served-model-name '%s' is too long", fl.served_model_name);
    } else if (fl.worker_id != NULL && strlen(fl.worker_id) >= EPD_CLIENT_NAME_MAX) {
        rc = epd_router_fail("--worker-id '%s' is too long", fl.worker_id);
    } else {
        epd_log_set_level(level);
        rc = epd_router_run(&fl);
    }
    epd_opts_cleanup(&o);
    return rc;
}
