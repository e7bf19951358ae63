/*
 * main.c — `epd-router`: the cluster's front door.
 *
 * Serves the OpenAI API over HTTP/1.1 (epd_http + epd_openai), keeps the
 * registry of prefill, decode and encoder workers (they register and
 * heartbeat over the epd.Control gRPC service, which the router serves),
 * and sends each request to workers chosen by the policy through the
 * request-plane client (epd_client), streaming the tokens back.
 *
 * What every daemon does the same way — loop, identity, control-plane
 * server, signals, ready file, trace, tick, the stop order — is daemon/'s;
 * this file turns flags into the role: the tokenizer, the registry, the
 * client (whose transport the runtime drives: the router makes no
 * transport of its own, its request plane is the client's), the HTTP
 * server, and the callbacks the runtime calls.  The router is what workers
 * register with, so it takes no --router and answers every control-plane
 * method itself (epd_router_rpc.c).
 *
 * The front door (flags here, enforced by the HTTP server and the intake):
 * --api-key-file makes every /v1 request carry one of its keys (/health
 * and /metrics stay open); without keys the router serves HTTP only on a
 * loopback address unless --allow-unauthenticated says otherwise.  The
 * file-descriptor limit is raised to its hard limit at start and
 * --max-connections clamped to what it allows; the per-address cap (429
 * past it, the client address taken from X-Forwarded-For only from
 * --trusted-proxies), the header deadline from accept, the body budget and
 * the JSON limits are flags too.
 *
 * Stop (SIGTERM/SIGINT, the runtime's order): on_stop stops listening and
 * closes every HTTP connection; their close callbacks abort what clients
 * still wait on upstream; `stopped` holds the runtime's loop (and the
 * client's transport) until the last of them ran; then the client is
 * closed (every endpoint) and the process exits 0.
 *
 * Threads: the runtime's loop thread owns everything (see
 * epd_router_int.h); gRPC's own threads and libuv's thread pool (Drain
 * forwarding) never touch the router's state.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "epd_addr.h"
#include "epd_alloc.h"
#include "epd_config.h"
#include "epd_log.h"
#include "epd_msg.h"
#include "epd_router_int.h"

typedef struct {
    const char *listen;
    const char *served_model_name;
    const char *chat_template;
    const char *policy;
    int64_t heartbeat_ms;
    int64_t dead_after_ms;
    int64_t max_retries;
    int64_t request_timeout_ms;
    int64_t max_queue;
    int64_t queue_timeout_ms;
    int64_t no_worker_wait_ms;
    int64_t max_images;
    int64_t max_image_bytes;
    int64_t max_image_pixels;
    int64_t max_connections;
    int64_t max_body_bytes;
    const char *api_key_file;
    const char *trusted_proxies;
    int allow_unauthenticated;
    int ready_without_encoder;
    int64_t header_timeout_ms;
    int64_t max_connections_per_addr;
    int64_t max_buffered_body_bytes;
    int64_t max_json_depth;
    int64_t max_json_elements;
    int64_t max_json_string_bytes;
} epd_router_flags_t;

/* ------------------------------------------------------------ the role */

static void epd_router_on_tick(void *arg, uint64_t now_ns)
{
    epd_router_t *rt = arg;

    epd_client_tick(rt->client);
    epd__router_tick(rt, now_ns);
}

/* Shutdown step 1: no more HTTP (nor requests); every connection closes,
 * and the close callbacks abort upstream what their clients waited on. */
static void epd_router_on_stop(void *arg)
{
    epd_router_t *rt = arg;

    rt->stopping = 1;
    epd_log_info(EPD_ROUTER_LOG, 0, "stopping: %u requests in flight", rt->n_reqs);
    epd_http_server_destroy(rt->http); /* rt->http stays until config.closed */
}

/* The HTTP server's last close callback ran (config.closed). */
static void epd_router_http_closed(void *arg)
{
    epd_router_t *rt = arg;

    rt->http = NULL;
}

/* Shutdown step 3: the aborts of every closed connection went out. */
static int epd_router_stopped(void *arg)
{
    epd_router_t *rt = arg;

    return rt->http == NULL;
}

/* SIGTERM (the runtime's drain): new generation requests get 503 and
 * /ready says so; those in flight finish. */
static void epd_router_on_drain(void *arg)
{
    epd_router_t *rt = arg;

    epd_log_info(EPD_ROUTER_LOG, 0, "draining: %u requests in flight finish, new ones get 503",
                 rt->n_reqs);
}

/* The drain is over when no request is left. */
static int epd_router_idle(void *arg)
{
    epd_router_t *rt = arg;

    return rt->n_reqs == 0;
}

/* What the start-up needs beyond the router's state: the parsed flags and
 * what main checked of them (the process holds one router). */
static struct {
    const epd_daemon_flags_t *dfl;
    const epd_router_flags_t *fl;
    epd_router_policy_t policy;
    char http_host[EPD_ADDR_HOST_MAX];
    uint16_t http_port;
    unsigned max_connections; /* --max-connections, clamped to the fd limit */
} epd_router_start;

static epd_status_t epd_router_setup(void *arg, epd_daemon_t *d);
static void epd_router_cleanup(void *arg);

static const epd_daemon_ops_t epd_router_ops = {
    .on_msg = epd_daemon_op_msg_none, /* the client's transport calls it back, not the runtime's */
    .on_link_down = epd_daemon_op_link_down_none,
    .on_peer_dead = epd_daemon_op_peer_dead_none,
    .on_peer_closed = epd_daemon_op_peer_closed_none,
    .on_pump = epd_daemon_op_pump_none,
    .on_tick = epd_router_on_tick,
    .load = epd_daemon_op_load_none, /* Health and Status are the router's own */
    .on_drain = epd_router_on_drain, /* SIGTERM (a Drain RPC names a worker: epd_router_rpc.c) */
    .on_rpc = epd__router_on_rpc,
    .on_stop = epd_router_on_stop,
    .stopped = epd_router_stopped,
    .idle = epd_router_idle,
    .on_exit = epd_daemon_op_none, /* no threads of its own */
    .setup = epd_router_setup,
    .cleanup = epd_router_cleanup,
};

/* ------------------------------------------------------------ start-up */

/* What a client reaches without a key when keys are set. */
static const char *const epd_router_open_paths[] = {"/health", "/ready", "/metrics", NULL};

/* The most bytes one token of the tokenizer spells (every id of the
 * vocabulary detokenized once, at start-up): a text of N bytes is then at
 * least N / that many tokens, so a prompt of more than max_context times
 * it cannot fit and is refused before it is tokenized.  0 when unknown (a
 * token longer than the probe's buffer): no bound. */
static uint64_t epd_router_max_token_bytes(const epd_router_t *rt)
{
    char buf[1024];
    size_t most = 0;

    for (uint32_t id = 0; id < rt->info->vocab_size; id++) {
        int32_t tok = (int32_t)id;
        size_t n = 0;
        epd_status_t st = epd_engine_detokenize(rt->engine, &tok, 1, buf, sizeof(buf), &n);

        if (st == EPD_ERR_TOO_LONG) {
            epd_log_warn(EPD_ROUTER_LOG, 0,
                         "token %u spells over %zu bytes: prompts are not bounded before "
                         "tokenizing",
                         id, sizeof(buf));
            return 0;
        }
        if (st == EPD_OK && n > most) {
            most = n;
        }
    }
    return most;
}

/* Raises the soft limit on open files to the hard one and clamps `want`
 * HTTP connections to what it leaves after room for the transport, gRPC,
 * the model and the log (a quarter of the limit, at most 1024
 * descriptors).  Says once what it did. */
static unsigned epd_router_fd_budget(unsigned want)
{
    struct rlimit rl;
    rlim_t before;
    rlim_t reserve;
    rlim_t room;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        epd_log_warn(EPD_ROUTER_LOG, 0, "cannot read the file-descriptor limit: %s",
                     strerror(errno));
        return want;
    }
    before = rl.rlim_cur;
    if (rl.rlim_cur != RLIM_INFINITY &&
        (rl.rlim_max == RLIM_INFINITY || rl.rlim_cur < rl.rlim_max)) {
        struct rlimit raised = rl;

        /* an unlimited hard limit: the kernel's usual ceiling (fs.nr_open) */
        raised.rlim_cur = rl.rlim_max == RLIM_INFINITY ? (rlim_t)1 << 20 : rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &raised) == 0) {
            rl.rlim_cur = raised.rlim_cur;
        } else {
            epd_log_warn(EPD_ROUTER_LOG, 0, "cannot raise the file-descriptor limit to %llu: %s",
                         (unsigned long long)raised.rlim_cur, strerror(errno));
        }
    }
    if (rl.rlim_cur == RLIM_INFINITY) {
        epd_log_info(EPD_ROUTER_LOG, 0, "file descriptors: no limit; up to %u HTTP connections",
                     want);
        return want;
    }
    reserve = rl.rlim_cur / 4 < 1024 ? rl.rlim_cur / 4 : 1024;
    room = rl.rlim_cur - reserve;
    if (room < 1) {
        room = 1;
    }
    if ((rlim_t)want > room) {
        epd_log_warn(EPD_ROUTER_LOG, 0,
                     "file descriptors: limit %llu (raised from %llu): --max-connections %u "
                     "clamped to %llu",
                     (unsigned long long)rl.rlim_cur, (unsigned long long)before, want,
                     (unsigned long long)room);
        return (unsigned)room;
    }
    epd_log_info(EPD_ROUTER_LOG, 0,
                 "file descriptors: limit %llu (raised from %llu); up to %u HTTP connections",
                 (unsigned long long)rl.rlim_cur, (unsigned long long)before, want);
    return want;
}

/* The model's chat template: a folder with tokenizer.json renders chat
 * requests with the template its tokenizer_config.json names (or
 * --chat-template); one it does not recognise stops the start with one
 * line naming the built-in ones.  Without tokenizer.json, or without a
 * chat_template, chats keep the plain "<|role|>" rendering. */
static epd_status_t epd_router_chat_setup(epd_router_t *rt, const char *dir, const char *name)
{
    epd_status_t st;

    if (name != NULL && name[0] == '\0') {
        name = NULL;
    }
    if (epd_engine_tokenizer(rt->engine) == NULL) {
        if (name != NULL) {
            epd_log_error(EPD_ROUTER_LOG, 0,
                          "--chat-template %s: the model folder '%s' has no tokenizer.json (its "
                          "chats use the plain <|role|> format)",
                          name, dir);
            return EPD_ERR_CONFIG;
        }
        return EPD_OK;
    }
    st = epd_chat_load(dir, name, &rt->chat);
    if (st == EPD_ERR_NOT_FOUND) {
        epd_log_warn(EPD_ROUTER_LOG, 0,
                     "%s/tokenizer_config.json has no chat_template: /v1/chat/completions renders "
                     "the plain <|role|> format (--chat-template NAME: %s)",
                     dir, EPD_CHAT_NAMES);
        return EPD_OK;
    }
    if (st != EPD_OK) {
        return st == EPD_ERR_NO_MEMORY ? st : EPD_ERR_CONFIG; /* logged */
    }
    epd_log_info(EPD_ROUTER_LOG, 0, "chat template: %s", epd_chat_name(rt->chat));
    return EPD_OK;
}

/* The role on a created daemon: the tokenizer, the registry, the client on
 * the runtime's loop, the HTTP server.  EPD_OK or the failure (logged). */
static epd_status_t epd_router_setup(void *arg, epd_daemon_t *d)
{
    const epd_daemon_flags_t *dfl = epd_router_start.dfl;
    const epd_router_flags_t *fl = epd_router_start.fl;
    epd_router_policy_t policy = epd_router_start.policy;
    const char *http_host = epd_router_start.http_host;
    uint16_t http_port = epd_router_start.http_port;
    char http_addr[EPD_ADDR_MAX];
    char prefix[EPD_ADDR_MAX + 8];
    epd_router_t *rt = arg;
    epd_client_config_t cc;
    epd_http_config_t hc;
    epd_status_t st;

    rt->d = d;
    rt->loop = epd_daemon_loop(d);
    rt->epoch = epd_daemon_epoch(d);
    rt->trace = epd_daemon_trace(d);
    snprintf(rt->model_name, sizeof(rt->model_name), "%s",
             fl->served_model_name != NULL && fl->served_model_name[0] != '\0'
                 ? fl->served_model_name
                 : epd_daemon_model_name(d));
    epd_router_metrics_init(&rt->m, rt->model_name);

    /* the tokenizer (blocking: before the loop runs).  A Hugging Face
     * folder opens from its config files without a weight read, except
     * under prefix-affinity, whose block hashes need the model digest the
     * engine computes from the weight files. */
    {
        epd_engine_config_t ecfg = {.model_dir = dfl->model,
                                    .max_batch = 1,
                                    /* the cluster's map: workers must equal it */
                                    .kv_dtype = dfl->kv_dtype,
                                    .tokenizer_only =
                                        policy != EPD_ROUTER_POLICY_PREFIX_AFFINITY};

        st = epd_engine_open(dfl->engine, &ecfg, &rt->engine);
        if (st != EPD_OK) {
            epd_log_error(EPD_ROUTER_LOG, 0, "cannot open model '%s' with engine '%s': %s",
                          dfl->model, dfl->engine, epd_status_string(st));
            return st;
        }
    }
    rt->info = epd_engine_info(rt->engine);
    st = epd_gen_defaults_load(dfl->model, &rt->gen_defaults);
    if (st != EPD_OK) {
        return st; /* logged, naming the key */
    }
    if (rt->gen_defaults.has_temperature || rt->gen_defaults.has_top_p ||
        rt->gen_defaults.has_top_k) {
        epd_log_info(EPD_ROUTER_LOG, 0,
                     "generation_config.json: a request without them samples with temperature "
                     "%g, top_p %g, top_k %lld",
                     rt->gen_defaults.has_temperature ? rt->gen_defaults.temperature : 1.0,
                     rt->gen_defaults.has_top_p ? rt->gen_defaults.top_p : 1.0,
                     (long long)rt->gen_defaults.top_k);
    }
    st = epd_router_chat_setup(rt, dfl->model, fl->chat_template);
    if (st != EPD_OK) {
        return st;
    }
    rt->max_prompt_bytes = (uint64_t)rt->info->max_context * epd_router_max_token_bytes(rt);
    epd_prefix_root(epd_engine_name(rt->engine), rt->info, NULL, 0, &rt->prefix_plain);
    rt->probe_hints = epd_calloc(rt->info->max_context / rt->info->kv.block_tokens + 1,
                                 sizeof(*rt->probe_hints));
    if (rt->probe_hints == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    epd_router_registry_init(&rt->reg, policy, rt->dead_after_ms);

    /* the request plane: the client's transport, driven by the runtime;
     * the router's identity on it is the daemon's */
    epd_client_config_init(&cc);
    cc.backend = dfl->transport;
    cc.expect = dfl->expect;
    cc.provider = dfl->provider;
    cc.bind_host = epd_daemon_data_host(d); /* --data-addr, resolved */
    cc.peer_timeout_ms = (uint32_t)dfl->peer_timeout_ms;
    cc.connect_timeout_ms = (uint32_t)dfl->connect_timeout_ms;
    if (rt->info->image_embeddings > 0) {
        /* an image travels in one message (to its encoder, or inline to a
         * prefill worker): room for the largest one */
        cc.max_msg_size = (size_t)16 << 20;
    }
    /* a prompt as long as the model's window fits one GenerateRequest */
    if (epd_msg_cap_for_context(rt->info->max_context) > cc.max_msg_size) {
        cc.max_msg_size = epd_msg_cap_for_context(rt->info->max_context);
    }
    epd_daemon_secret(d, &cc.secret, &cc.secret_len);
    cc.worker_id = epd_daemon_worker_id(rt->d);
    cc.epoch_start_ns = rt->epoch.start_time_ns;
    cc.epoch_nonce = rt->epoch.nonce;
    cc.role = EPD_CLIENT_ROLE_ROUTER;
    cc.event_cb = epd__router_on_event;
    cc.cb_arg = rt;
    st = epd_client_create(&cc, &rt->client);
    if (st != EPD_OK) {
        epd_log_error(EPD_ROUTER_LOG, 0, "cannot start the '%s' transport: %s", dfl->transport,
                      epd_status_string(st));
        return st;
    }
    epd_daemon_drive_xport(rt->d, epd_client_xport(rt->client));

    epd_http_config_init(&hc);
    hc.host = http_host;
    hc.port = http_port;
    hc.max_connections = epd_router_start.max_connections;
    hc.max_connections_per_addr = (unsigned)fl->max_connections_per_addr;
    hc.max_buffered_body_bytes = (size_t)fl->max_buffered_body_bytes;
    hc.header_timeout_ms = (uint64_t)fl->header_timeout_ms;
    hc.max_body_bytes = (size_t)fl->max_body_bytes;
    hc.keys = rt->keys;
    hc.trusted_proxies = rt->proxies;
    hc.open_paths = epd_router_open_paths;
    hc.handler = epd__router_on_http;
    hc.closed = epd_router_http_closed;
    hc.arg = rt;
    st = epd_http_server_create(rt->loop, &hc, &rt->http);
    if (st != EPD_OK) {
        epd_log_error(EPD_ROUTER_LOG, 0, "cannot serve HTTP on %s: %s", fl->listen,
                      epd_status_string(st));
        return st;
    }
    if (hc.max_buffered_body_bytes != 0 &&
        hc.max_buffered_body_bytes / EPD_HTTP_BODY_SHARES < hc.max_body_bytes) {
        /* a body may hold one connection's share of the budget at most */
        epd_log_warn(EPD_ROUTER_LOG, 0,
                     "--max-body-bytes %zu is more than 1/%d of --max-buffered-body-bytes %zu: "
                     "bodies over %zu bytes get 413",
                     hc.max_body_bytes, EPD_HTTP_BODY_SHARES, hc.max_buffered_body_bytes,
                     hc.max_buffered_body_bytes / EPD_HTTP_BODY_SHARES);
    }
    epd_log_info(EPD_ROUTER_LOG, 0,
                 "serving model '%s' (context %u, %u layers) as '%s': policy %s, heartbeat %u "
                 "ms, dead after %u ms, %u retries, queue %u (%u ms), no-worker wait %u ms, "
                 "transport %s",
                 dfl->model, rt->info->max_context, rt->info->kv.n_layers, rt->model_name,
                 epd_router_policy_name(policy), rt->heartbeat_ms, rt->dead_after_ms,
                 rt->max_retries, rt->max_queue, rt->queue_timeout_ms, rt->no_worker_wait_ms,
                 dfl->transport);
    /* the ready line: "http=HOST:PORT control=... pid=... worker=...
     * transport=..." (tests and scripts read http= and control=) */
    (void)epd_addr_join(epd_addr_is_wildcard(http_host) ? epd_daemon_advertise_host(d) : http_host,
                        epd_http_server_port(rt->http), http_addr, sizeof(http_addr));
    snprintf(prefix, sizeof(prefix), "http=%s", http_addr);
    epd_daemon_set_ready_prefix(d, prefix);
    return EPD_OK;
}

/* ops->cleanup: served (or never started): the HTTP server is gone and the
 * runtime no longer drives the client's transport; what is left is memory */
static void epd_router_cleanup(void *arg)
{
    epd_router_t *rt = arg;

    epd_client_destroy(rt->client);
    rt->client = NULL;
    epd__router_reqs_free_all(rt);
    epd_router_registry_cleanup(&rt->reg);
    epd_oai_buf_cleanup(&rt->out);
    epd_free(rt->tok_scratch);
    epd_free(rt->mig_prompt);
    epd_free(rt->detok_scratch);
    epd_free(rt->probe_hints);
    epd_chat_destroy(rt->chat);
    rt->chat = NULL;
    epd_chat_prompt_free(&rt->chat_prompt);
    epd_free(rt->chat_msgs);
    epd_engine_close(rt->engine);
}

static int epd_router_bad(const char *flag, const char *value, const char *why)
{
    epd_log_error("epd-router", 0, "--%s '%s': %s", flag, value != NULL ? value : "", why);
    return 1;
}

static int epd_router_run(const epd_daemon_flags_t *dfl, void *arg)
{
    const epd_router_flags_t *fl = arg;
    char http_host[EPD_ADDR_HOST_MAX];
    epd_http_keys_t *keys = NULL;
    epd_http_proxies_t *proxies = NULL;
    epd_router_policy_t policy;
    epd_daemon_config_t dc;
    const char *why = NULL;
    uint16_t http_port;
    epd_router_t *rt;
    int rc;

    if (epd_router_policy_parse(fl->policy, &policy) != EPD_OK) {
        return epd_router_bad("policy", fl->policy,
                              "want round-robin, least-load or "
                              "prefix-affinity");
    }
    if (epd_addr_split(fl->listen, http_host, sizeof(http_host), &http_port, &why) != EPD_OK) {
        return epd_router_bad("listen", fl->listen, why);
    }
    {
        /* resolved once: the HTTP server binds a numeric address */
        char num[EPD_ADDR_HOST_MAX];

        if (epd_addr_resolve(http_host, num, sizeof(num), &why) != EPD_OK) {
            return epd_router_bad("listen", fl->listen, why);
        }
        snprintf(http_host, sizeof(http_host), "%s", num);
    }
    if (fl->served_model_name != NULL && strlen(fl->served_model_name) >= EPD_CLIENT_NAME_MAX) {
        return epd_router_bad("served-model-name", fl->served_model_name, "too long");
    }
    if (fl->api_key_file == NULL && !fl->allow_unauthenticated &&
        !epd_addr_is_loopback(http_host)) {
        epd_log_error("epd-router", 0,
                      "refusing to serve HTTP on %s without API keys: give --api-key-file, "
                      "listen on a loopback address, or pass --allow-unauthenticated",
                      fl->listen);
        return 1;
    }
    {
        /* an image travels as a base64 data: URL, one JSON string */
        uint64_t url = ((uint64_t)fl->max_image_bytes + 2) / 3 * 4 + 64;

        if ((uint64_t)fl->max_json_string_bytes < url) {
            char small[160];
            char val[32];

            snprintf(small, sizeof(small),
                     "too small for --max-image-bytes %lld (its data: URL takes %llu bytes)",
                     (long long)fl->max_image_bytes, (unsigned long long)url);
            snprintf(val, sizeof(val), "%lld", (long long)fl->max_json_string_bytes);
            return epd_router_bad("max-json-string-bytes", val, small);
        }
    }
    if (fl->api_key_file != NULL) {
        char cause[256];
        epd_status_t st = epd_http_keys_load(fl->api_key_file, &keys, cause, sizeof(cause));

        if (st != EPD_OK) {
            return epd_router_bad("api-key-file", fl->api_key_file, cause);
        }
        epd_log_info(EPD_ROUTER_LOG, 0, "%zu API keys from %s: /v1 needs one",
                     epd_http_keys_count(keys), fl->api_key_file);
    } else if (fl->allow_unauthenticated && !epd_addr_is_loopback(http_host)) {
        epd_log_warn(EPD_ROUTER_LOG, 0,
                     "serving HTTP on %s without API keys (--allow-unauthenticated)", fl->listen);
    }
    if (fl->trusted_proxies != NULL) {
        char cause[256];

        if (epd_http_proxies_parse(fl->trusted_proxies, &proxies, cause, sizeof(cause)) != EPD_OK) {
            epd_http_keys_destroy(keys);
            return epd_router_bad("trusted-proxies", fl->trusted_proxies, cause);
        }
        epd_log_info(EPD_ROUTER_LOG, 0,
                     "X-Forwarded-For names the client of a connection from %s (%zu blocks)",
                     fl->trusted_proxies, epd_http_proxies_count(proxies));
    }
    rt = epd_calloc(1, sizeof(*rt));
    if (rt == NULL) {
        epd_log_error(EPD_ROUTER_LOG, 0, "out of memory");
        epd_http_keys_destroy(keys);
        epd_http_proxies_destroy(proxies);
        return 1;
    }
    rt->keys = keys;
    rt->proxies = proxies;
    epd_oai_limits_init(&rt->json_limits);
    rt->json_limits.max_depth = (uint32_t)fl->max_json_depth;
    rt->json_limits.max_elements = (uint64_t)fl->max_json_elements;
    rt->json_limits.max_string_bytes = (size_t)fl->max_json_string_bytes;
    rt->model_dir = dfl->model;
    rt->transport = dfl->transport;
    rt->heartbeat_ms = (uint32_t)fl->heartbeat_ms;
    rt->dead_after_ms = (uint32_t)fl->dead_after_ms;
    rt->max_retries = (uint32_t)fl->max_retries;
    rt->request_timeout_ms = (uint32_t)fl->request_timeout_ms;
    rt->max_queue = (uint32_t)fl->max_queue;
    rt->queue_timeout_ms = (uint32_t)fl->queue_timeout_ms;
    rt->no_worker_wait_ms = (uint32_t)fl->no_worker_wait_ms;
    epd_rng_seed(&rt->rng, epd_rng_entropy());
    rt->max_images = (uint32_t)fl->max_images;
    rt->ready_without_encoder = fl->ready_without_encoder;
    rt->max_image_bytes = (uint64_t)fl->max_image_bytes;
    rt->max_image_pixels = (uint64_t)fl->max_image_pixels;
    epd_router_start.dfl = dfl;
    epd_router_start.fl = fl;
    epd_router_start.policy = policy;
    snprintf(epd_router_start.http_host, sizeof(epd_router_start.http_host), "%s", http_host);
    epd_router_start.http_port = http_port;
    epd_router_start.max_connections = epd_router_fd_budget((unsigned)fl->max_connections);
    memset(&dc, 0, sizeof(dc));
    dc.role_name = EPD_ROUTER_LOG;
    dc.role = EPD__ROLE__ROLE_ROUTER;
    dc.flags = dfl;
    dc.with_xport = 0; /* the client's (epd_daemon_drive_xport) */
    dc.ops = &epd_router_ops;
    dc.arg = rt;
    rc = epd_daemon_run(&dc);
    epd_http_keys_destroy(rt->keys);
    epd_http_proxies_destroy(rt->proxies);
    epd_free(rt);
    return rc;
}

int main(int argc, char **argv)
{
    epd_router_flags_t fl = {
        .listen = "127.0.0.1:8000",
        .served_model_name = NULL,
        .policy = "least-load",
        .heartbeat_ms = 500,
        .dead_after_ms = 2000,
        .max_retries = 2,
        .request_timeout_ms = 300000,
        .max_queue = 1024,
        .queue_timeout_ms = 30000,
        .no_worker_wait_ms = 5000,
        .max_images = 8,
        .max_image_bytes = 8 << 20,
        .max_image_pixels = (int64_t)(4096 * 4096),
        .max_connections = 4096,
        .max_body_bytes = 16 << 20,
        .api_key_file = NULL,
        .trusted_proxies = NULL,
        .allow_unauthenticated = 0,
        .header_timeout_ms = 10000,
        /* above what one gateway sends at once (300 and more): a burst
         * from behind a proxy is queued like anyone's, beyond it 429 */
        .max_connections_per_addr = 1024,
        .max_buffered_body_bytes = (int64_t)256 << 20,
        .max_json_depth = EPD_OAI_MAX_DEPTH,
        .max_json_elements = EPD_OAI_MAX_ELEMENTS,
        .max_json_string_bytes = (int64_t)EPD_OAI_MAX_STRING_BYTES,
    };
    const epd_opt_t opts[] = {
        {"listen", EPD_OPT_STRING, &fl.listen, 0, 0,
         "HTTP address HOST:PORT or [HOST]:PORT (port 0: ephemeral)"},
        {"served-model-name", EPD_OPT_STRING, &fl.served_model_name, 0, 0,
         "the model name clients send (default: the basename of --model)"},
        {"chat-template", EPD_OPT_STRING, &fl.chat_template, 0, 0,
         "the built-in chat template to use: " EPD_CHAT_NAMES
         " (default: the one tokenizer_config.json's chat_template is)"},
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
        {"max-queue", EPD_OPT_INT, &fl.max_queue, 1, 1 << 20,
         "requests waiting for room in the prefill and decode pools at once, first come first "
         "served (beyond: 429 with Retry-After)"},
        {"queue-timeout-ms", EPD_OPT_INT, &fl.queue_timeout_ms, 1, 3600000,
         "a request that finds no room in the pools this long after its arrival is answered 429 "
         "with Retry-After"},
        {"no-worker-wait-ms", EPD_OPT_INT, &fl.no_worker_wait_ms, 0, 3600000,
         "a request that finds no usable prefill and decode worker (stopped, restarting, "
         "dead) waits in the queue this long for one to come back, then 503 with Retry-After "
         "(0: 503 at once)"},
        {"max-images", EPD_OPT_INT, &fl.max_images, 0, 8,
         "images per chat request (beyond: 400; 8 at most)"},
        {"max-image-bytes", EPD_OPT_INT, &fl.max_image_bytes, 1, 15 << 20,
         "encoded size of one image, after base64 (beyond: 400)"},
        {"max-image-pixels", EPD_OPT_INT, &fl.max_image_pixels, 1, (int64_t)1 << 32,
         "width x height of one image, read from its header (beyond: 400)"},
        {"max-connections", EPD_OPT_INT, &fl.max_connections, 1, 1 << 20,
         "HTTP connections at once (beyond: 503 with Retry-After; clamped to what the "
         "file-descriptor limit, raised to its hard limit, allows)"},
        {"max-connections-per-addr", EPD_OPT_INT, &fl.max_connections_per_addr, 0, 1 << 20,
         "HTTP connections from one client address, an IPv6 client's /64 counting as one "
         "(beyond: its request head is read, then 429 with Retry-After and close; 0: no cap)"},
        {"trusted-proxies", EPD_OPT_STRING, &fl.trusted_proxies, 0, 0,
         "CIDR[,CIDR...] (IPv4, IPv6): from these peers the client address (for the "
         "per-address cap) is the right-most X-Forwarded-For entry that is not itself a "
         "trusted proxy; from others the header is ignored"},
        {"header-timeout-ms", EPD_OPT_INT, &fl.header_timeout_ms, 1, 3600000,
         "a new connection's request headers must be complete this long after the accept "
         "(a later request's: after its first byte); else closed (408 once a byte came)"},
        {"max-body-bytes", EPD_OPT_INT, &fl.max_body_bytes, 1024, 1 << 30,
         "largest request body (beyond: 413; also at most 1/16 of --max-buffered-body-bytes)"},
        {"max-buffered-body-bytes", EPD_OPT_INT, &fl.max_buffered_body_bytes, 0,
         (double)((int64_t)1 << 40),
         "memory of request bodies buffered at once, all connections together, charged as "
         "their bytes arrive (beyond: 503 with Retry-After); one body holds at most 1/16 of it "
         "(beyond: 413); 0: no budget"},
        {"max-json-depth", EPD_OPT_INT, &fl.max_json_depth, 2, 10000,
         "nesting of arrays and objects in a request body (beyond: 400)"},
        {"max-json-elements", EPD_OPT_INT, &fl.max_json_elements, 16, (double)((int64_t)1 << 32),
         "array elements plus object members in a request body, all together (beyond: 400)"},
        {"max-json-string-bytes", EPD_OPT_INT, &fl.max_json_string_bytes, 1024, 1 << 30,
         "one JSON string of a request body as sent (beyond: 400; room for an image's data: "
         "URL of --max-image-bytes is required)"},
        {"api-key-file", EPD_OPT_STRING, &fl.api_key_file, 0, 0,
         "API keys, one a line ('#' comments): every /v1 request needs "
         "'Authorization: Bearer KEY' (else 401); /health and /metrics stay open"},
        {"allow-unauthenticated", EPD_OPT_BOOL, &fl.allow_unauthenticated, 0, 0,
         "serve HTTP on a non-loopback --listen address without --api-key-file"},
        {"ready-without-encoder", EPD_OPT_BOOL, &fl.ready_without_encoder, 0, 0,
         "GET /ready needs no READY encoder for a vision model (the prefill workers encode "
         "images themselves)"},
    };
    return epd_daemon_main("epd-router", "OpenAI-compatible HTTP front door of an epd cluster", 0,
                           opts, sizeof(opts) / sizeof(opts[0]), epd_router_run, &fl, argc, argv);
}
