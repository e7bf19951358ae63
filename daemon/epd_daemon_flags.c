/*
 * epd_daemon_flags.c — the flags every daemon shares and the start of every
 * daemon's main(): one table, one set of limits, one check, so that
 * --worker-id, --peer-timeout-ms or an address mean the same everywhere;
 * and what a role does alike at start-up (its engine, its KV pool's
 * --kv-prefault).
 */
#include <signal.h>
#include <string.h>

#include "epd_addr.h"
#include "epd_alloc.h"
#include "epd_daemon.h"
#include "epd_log.h"
#include "epd_time.h"

#define EPD_DAEMON_OPTS_MAX 96

void epd_daemon_flags_init(epd_daemon_flags_t *f)
{
    memset(f, 0, sizeof(*f));
    f->engine = "ref";
    f->transport = "ucx";
    f->expect = "any";
    f->control_addr = "127.0.0.1:0";
    f->trace_events = 1 << 20;
    f->log_level = "info";
    f->peer_timeout_ms = 3000;
    f->connect_timeout_ms = 3000;
    f->drain_grace_ms = 30000;
    f->control_max_conns = EPD_RPC_DEFAULT_MAX_CONNS;
    f->control_max_conns_per_addr = EPD_RPC_DEFAULT_MAX_CONNS_PER_ADDR;
    f->control_auth_timeout_ms = EPD_RPC_DEFAULT_AUTH_TIMEOUT_MS;
    f->control_max_streams = EPD_RPC_DEFAULT_MAX_STREAMS;
    f->control_max_resets = EPD_RPC_DEFAULT_MAX_RESETS;
}

void epd_daemon_flags_limits(const epd_daemon_flags_t *f, epd_rpc_limits_t *limits_p)
{
    memset(limits_p, 0, sizeof(*limits_p));
    limits_p->max_conns = (uint32_t)f->control_max_conns;
    limits_p->max_conns_per_addr =
        f->control_max_conns_per_addr == 0 ? UINT32_MAX : (uint32_t)f->control_max_conns_per_addr;
    limits_p->auth_timeout_ms = (uint32_t)f->control_auth_timeout_ms;
    limits_p->max_streams = (uint32_t)f->control_max_streams;
    limits_p->max_resets = (uint32_t)f->control_max_resets;
}

/* The common flags of `which` into opts[], returning how many. */
static size_t epd_daemon_common_opts(epd_daemon_flags_t *f, unsigned which, epd_opt_t *opts)
{
    size_t n = 0;

    opts[n++] = (epd_opt_t){
        "model", EPD_OPT_STRING, &f->model, 0, 0, "model folder (config.json + model.safetensors)"};
    opts[n++] = (epd_opt_t){"engine",   EPD_OPT_STRING,
                            &f->engine, 0,
                            0,          "engine: built-in name (ref, sim) or path to a .so"};
    opts[n++] = (epd_opt_t){"kv-dtype", EPD_OPT_STRING, &f->kv_dtype, 0, 0,
                            "KV cache dtype per layer: f32 (default), bf16, fp8, int8, or a map "
                            "such as \"0-3:bf16,4-:fp8\"; prefill and decode must agree"};
    opts[n++] = (epd_opt_t){"worker-id",
                            EPD_OPT_STRING,
                            &f->worker_id,
                            0,
                            0,
                            "this daemon's name in the cluster, 1-127 bytes (default ROLE-PID)"};
    opts[n++] = (epd_opt_t){"transport",
                            EPD_OPT_STRING,
                            &f->transport,
                            0,
                            0,
                            "request- and data-plane transport: ucx or ofi"};
    opts[n++] = (epd_opt_t){"expect-transport",
                            EPD_OPT_STRING,
                            &f->expect,
                            0,
                            0,
                            "refuse peers reached other than by: any, shm, tcp, rdma"};
    opts[n++] = (epd_opt_t){
        "provider", EPD_OPT_STRING, &f->provider, 0, 0, "libfabric provider hint (ofi)"};
    opts[n++] = (epd_opt_t){"control-addr",
                            EPD_OPT_STRING,
                            &f->control_addr,
                            0,
                            0,
                            "gRPC control address HOST:PORT or [HOST]:PORT (port 0: ephemeral)"};
    opts[n++] = (epd_opt_t){"advertise-addr",
                            EPD_OPT_STRING,
                            &f->advertise_addr,
                            0,
                            0,
                            "the host or IP other members reach this daemon's control port and "
                            "data plane at (default: the --control-addr host; required when that "
                            "is a wildcard like 0.0.0.0 or ::)"};
    opts[n++] = (epd_opt_t){"data-addr",
                            EPD_OPT_STRING,
                            &f->data_addr,
                            0,
                            0,
                            "the local IP (or name) the data plane binds: UCX runs on the "
                            "interface owning it unless UCX_NET_DEVICES is set, libfabric binds "
                            "it (default: the advertised host)"};
    opts[n++] = (epd_opt_t){"drain-grace-ms",
                            EPD_OPT_INT,
                            &f->drain_grace_ms,
                            0,
                            3600000,
                            "SIGTERM drains: no new requests, running ones get this long to "
                            "finish, then the daemon exits 0 (0: stop at once; a second SIGTERM "
                            "or SIGINT stops at once)"};
    if ((which & EPD_DAEMON_FLAG_REGISTER) != 0) {
        opts[n++] = (epd_opt_t){"router",
                                EPD_OPT_STRING,
                                &f->router,
                                0,
                                0,
                                "register with the router's control service HOST:PORT and "
                                "heartbeat the load (absent: no registration)"};
        opts[n++] = (epd_opt_t){"metrics-addr",
                                EPD_OPT_STRING,
                                &f->metrics_addr,
                                0,
                                0,
                                "serve Prometheus GET /metrics on HOST:PORT or [HOST]:PORT "
                                "(port 0: ephemeral; absent: off).  Bound like --control-addr: "
                                "without --cluster-secret-file only a loopback address"};
        opts[n++] = (epd_opt_t){"served-model-name",
                                EPD_OPT_STRING,
                                &f->served_model_name,
                                0,
                                0,
                                "the `model` label of /metrics (default: the --model folder's "
                                "name; give the router's --served-model-name)"};
    }
    opts[n++] = (epd_opt_t){"cluster-secret-file",
                            EPD_OPT_STRING,
                            &f->cluster_secret_file,
                            0,
                            0,
                            "the cluster's shared secret (mode 0600, 16-1024 bytes): members "
                            "prove it to each other on every endpoint and control call "
                            "(absent: this host only, over loopback)"};
    opts[n++] = (epd_opt_t){"ready-file",
                            EPD_OPT_STRING,
                            &f->ready_file,
                            0,
                            0,
                            "write 'control=... pid=... worker=... transport=...' here once "
                            "serving"};
    opts[n++] = (epd_opt_t){"control-max-conns",
                            EPD_OPT_INT,
                            &f->control_max_conns,
                            1,
                            1 << 20,
                            "connections to the control port at once; full, the oldest one with "
                            "no authenticated call is closed for a new one (clamped to a third "
                            "of the file descriptors left after a reserve)"};
    opts[n++] = (epd_opt_t){"control-max-conns-per-addr",
                            EPD_OPT_INT,
                            &f->control_max_conns_per_addr,
                            0,
                            1 << 20,
                            "control connections from one IPv4 address or IPv6 /64 (beyond: "
                            "closed at once; 0: no cap)"};
    opts[n++] = (epd_opt_t){"control-auth-timeout-ms",
                            EPD_OPT_INT,
                            &f->control_auth_timeout_ms,
                            100,
                            3600000,
                            "a control connection must send the HTTP/2 preface and have a call "
                            "authenticated by the cluster secret (any call, without a secret) "
                            "this long after connecting, else it is closed"};
    opts[n++] = (epd_opt_t){"control-max-streams",
                            EPD_OPT_INT,
                            &f->control_max_streams,
                            1,
                            1 << 20,
                            "concurrent HTTP/2 streams (calls) per control connection"};
    opts[n++] = (epd_opt_t){"control-max-resets",
                            EPD_OPT_INT,
                            &f->control_max_resets,
                            1,
                            1 << 30,
                            "HTTP/2 stream resets (RST_STREAM) a control connection may send "
                            "within 10 s; beyond, it is closed (rapid reset).  Before its first "
                            "authenticated call a connection may open 16 streams at most"};
    opts[n++] = (epd_opt_t){"peer-timeout-ms",
                            EPD_OPT_INT,
                            &f->peer_timeout_ms,
                            10,
                            3600000,
                            "silence after which a peer is declared dead"};
    opts[n++] = (epd_opt_t){"connect-timeout-ms",
                            EPD_OPT_INT,
                            &f->connect_timeout_ms,
                            10,
                            3600000,
                            "deadline of a transport handshake"};
    opts[n++] = (epd_opt_t){"trace",
                            EPD_OPT_STRING,
                            &f->trace,
                            0,
                            0,
                            "record a per-request trace; Chrome trace JSON written to FILE at "
                            "exit and on SIGUSR1"};
    opts[n++] = (epd_opt_t){"trace-events",
                            EPD_OPT_INT,
                            &f->trace_events,
                            1024,
                            1 << 26,
                            "trace buffer capacity in events (64 bytes each; later events are "
                            "dropped)"};
    opts[n++] = (epd_opt_t){
        "log-level", EPD_OPT_STRING, &f->log_level, 0, 0, "error, warn, info, debug or trace"};
    return n;
}

/* One line naming the flag and the problem; returns 0 (do not go on). */
static int epd_daemon_bad(const char *prog, int *exit_p, const char *flag, const char *value,
                          const char *why)
{
    epd_log_error(prog, 0, "--%s '%s': %s", flag, value != NULL ? value : "", why);
    *exit_p = 1;
    return 0;
}

static int epd_daemon_check_addr(const char *prog, int *exit_p, const char *flag, const char *value)
{
    char host[EPD_ADDR_HOST_MAX];
    const char *why = NULL;
    uint16_t port;

    if (value == NULL || value[0] == '\0') {
        return 1;
    }
    if (epd_addr_split(value, host, sizeof(host), &port, &why) != EPD_OK) {
        return epd_daemon_bad(prog, exit_p, flag, value, why);
    }
    return 1;
}

/* A bare host (name, IPv4, IPv6 with or without brackets), no port. */
static int epd_daemon_check_host(const char *prog, int *exit_p, const char *flag,
                                 const char *value)
{
    size_t n;

    if (value == NULL) {
        return 1;
    }
    n = strlen(value);
    if (n == 0 || n >= EPD_ADDR_HOST_MAX) {
        return epd_daemon_bad(prog, exit_p, flag, value, "want a host name or IP address");
    }
    if (value[0] == '[' ? value[n - 1] != ']' || n < 3 : strchr(value, ']') != NULL) {
        return epd_daemon_bad(prog, exit_p, flag, value, "unbalanced brackets");
    }
    /* an IPv6 literal has two colons at least: one is a port */
    if (value[0] != '[' && strchr(value, ':') != NULL && strchr(value, ':') == strrchr(value, ':')) {
        return epd_daemon_bad(prog, exit_p, flag, value,
                              "a host, not HOST:PORT (the ports are the daemon's own)");
    }
    return 1;
}

/* Parses and checks; 1 to go on, 0 with *exit_p set to stop. */
static int epd_daemon_parse(const char *prog, const char *summary, unsigned which,
                            epd_daemon_flags_t *flags, const epd_opt_t *role_opts,
                            size_t n_role_opts, int argc, char **argv, epd_opts_t *opts_p,
                            int *exit_p)
{
    static epd_opt_t table[EPD_DAEMON_OPTS_MAX];
    epd_log_level_t level;
    epd_status_t st;
    size_t n;
    int argi;

    signal(SIGPIPE, SIG_IGN);
    n = epd_daemon_common_opts(flags, which, table);
    if (n + n_role_opts > EPD_DAEMON_OPTS_MAX) {
        epd_log_error(prog, 0, "too many flags (%zu)", n + n_role_opts);
        *exit_p = 1;
        return 0;
    }
    if (n_role_opts > 0) {
        memcpy(table + n, role_opts, n_role_opts * sizeof(*role_opts));
    }
    memset(opts_p, 0, sizeof(*opts_p));
    opts_p->prog = prog;
    opts_p->summary = summary;
    opts_p->opts = table;
    opts_p->n_opts = n + n_role_opts;
    st = epd_opts_parse(opts_p, argc, argv, &argi);
    if (st == EPD_ERR_CANCELED) {
        *exit_p = 0; /* --help */
        return 0;
    }
    if (st != EPD_OK) {
        *exit_p = 1;
        return 0;
    }
    if (argi != argc) {
        epd_log_error(prog, 0, "unexpected argument '%s' (flags are --name value)", argv[argi]);
        *exit_p = 1;
        return 0;
    }
    if (epd_log_level_parse(flags->log_level, &level) != EPD_OK) {
        return epd_daemon_bad(prog, exit_p, "log-level", flags->log_level,
                              "want error, warn, info, debug or trace");
    }
    if (flags->model == NULL || flags->model[0] == '\0') {
        return epd_daemon_bad(prog, exit_p, "model", "", "a model folder is required");
    }
    if (strcmp(flags->transport, "ucx") != 0 && strcmp(flags->transport, "ofi") != 0) {
        return epd_daemon_bad(prog, exit_p, "transport", flags->transport, "want ucx or ofi");
    }
    if (flags->worker_id != NULL &&
        (flags->worker_id[0] == '\0' || strlen(flags->worker_id) >= EPD_WORKER_ID_MAX)) {
        return epd_daemon_bad(prog, exit_p, "worker-id", flags->worker_id, "want 1 to 127 bytes");
    }
    for (const char *c = flags->worker_id; c != NULL && *c != '\0'; c++) {
        if (*c < 0x21 || *c > 0x7e) {
            return epd_daemon_bad(prog, exit_p, "worker-id", flags->worker_id,
                                  "want printable ASCII without spaces");
        }
    }
    if (!epd_daemon_check_addr(prog, exit_p, "control-addr", flags->control_addr) ||
        !epd_daemon_check_addr(prog, exit_p, "router", flags->router) ||
        !epd_daemon_check_addr(prog, exit_p, "metrics-addr", flags->metrics_addr) ||
        !epd_daemon_check_host(prog, exit_p, "advertise-addr", flags->advertise_addr) ||
        !epd_daemon_check_host(prog, exit_p, "data-addr", flags->data_addr)) {
        return 0;
    }
    if (flags->served_model_name != NULL &&
        (flags->served_model_name[0] == '\0' ||
         strlen(flags->served_model_name) >= EPD_WORKER_ID_MAX)) {
        return epd_daemon_bad(prog, exit_p, "served-model-name", flags->served_model_name,
                              "want 1 to 127 bytes");
    }
    epd_log_set_level(level);
    return 1;
}

int epd_daemon_main(const char *prog, const char *summary, unsigned which,
                    const epd_opt_t *role_opts, size_t n_role_opts, epd_daemon_run_cb_t run,
                    void *arg, int argc, char **argv)
{
    epd_daemon_flags_t flags;
    epd_opts_t opts;
    int rc = 1;

    epd_daemon_flags_init(&flags);
    if (epd_daemon_parse(prog, summary, which, &flags, role_opts, n_role_opts, argc, argv, &opts,
                         &rc)) {
        rc = run(&flags, arg);
    }
    epd_opts_cleanup(&opts);
    return rc;
}

epd_status_t epd_daemon_engine_open(const epd_daemon_flags_t *flags, const char *log,
                                    uint32_t block_tokens, uint32_t max_batch,
                                    epd_engine_t **engine_p)
{
    epd_engine_config_t ecfg;
    epd_status_t st;

    memset(&ecfg, 0, sizeof(ecfg));
    ecfg.model_dir = flags->model;
    ecfg.block_tokens = block_tokens;
    ecfg.max_batch = max_batch;
    ecfg.kv_dtype = flags->kv_dtype;
    st = epd_engine_open(flags->engine, &ecfg, engine_p);
    if (st != EPD_OK) {
        epd_log_error(log, 0, "cannot open model '%s' with engine '%s': %s", flags->model,
                      flags->engine, epd_status_string(st));
    }
    return st;
}

void epd_daemon_kv_prefault(int on, const char *log, void *base, uint64_t bytes)
{
    uint64_t t0 = epd_time_now_ns();

    if (!on) {
        return;
    }
    epd_mem_prefault(base, (size_t)bytes);
    epd_log_info(log, 0, "KV pool: %llu MiB committed in %.0f ms",
                 (unsigned long long)(bytes >> 20), (double)(epd_time_now_ns() - t0) / 1e6);
}
