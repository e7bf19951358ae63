/*
 * epd_daemon.c — the daemon runtime: create, serve and its stop order, the
 * loop's handles, the transport's callbacks (see epd_daemon.h).
 *
 * The loop's handles and what each is for:
 *   tick    (uv_timer, tick_ms)   the role's periodic work, outbox retries;
 *   pump    (uv_idle, on demand)  deferred work at the top of the loop:
 *                                 links that went down are reported, dead
 *                                 peers closed, unreferenced records freed,
 *                                 then the role's own (ops->on_pump);
 *   flush   (uv_check, while any outbox holds a message) after each loop
 *                                 iteration — i.e. after the transport made
 *                                 progress — the outboxes are retried;
 *   signals SIGTERM / SIGINT start the stop order once; SIGUSR1 writes the
 *           trace;
 * plus the transport driver (epd_xport_uv) and the gRPC server's async.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "epd_alloc.h"
#include "epd_daemon_int.h"
#include "epd_fault.h"
#include "epd_metrics_http.h"
#include "epd_rng.h"
#include "epd_time.h"

#define EPD_DAEMON_TICK_MS 20
#define EPD_DAEMON_MSG_DEFAULT (64u * 1024u)
/* how long the role may take to let go after a signal (step 3) */
#define EPD_DAEMON_STOP_GRACE_MS 10000

/* UCX and libfabric keep process-wide allocations until exit (not epd's):
 * LeakSanitizer must not fail a clean sanitizer-build shutdown on them.
 * Defined here, in the object every daemon links, so each has it. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libucs.so\nleak:libucp.so\nleak:libuct.so\nleak:libucm.so\n"
           "leak:libfabric.so\nleak:librdmacm.so\nleak:libibverbs.so\n";
}

/* ------------------------------------------------------------------- stubs */

int epd_daemon_op_msg_none(void *arg, epd_link_t *from, Epd__Envelope *env)
{
    (void)arg;
    (void)from;
    (void)env;
    return 0;
}

void epd_daemon_op_link_down_none(void *arg, epd_link_t *link, epd_status_t status)
{
    (void)arg;
    (void)link;
    (void)status;
}

void epd_daemon_op_peer_dead_none(void *arg, epd_peer_t *peer, epd_status_t status, const char *why)
{
    (void)arg;
    (void)peer;
    (void)status;
    (void)why;
}

void epd_daemon_op_peer_closed_none(void *arg, epd_peer_t *peer)
{
    (void)arg;
    (void)peer;
}

int epd_daemon_op_pump_none(void *arg)
{
    (void)arg;
    return 0;
}

void epd_daemon_op_tick_none(void *arg, uint64_t now_ns)
{
    (void)arg;
    (void)now_ns;
}

void epd_daemon_op_load_none(void *arg, epd_daemon_load_t *load_p)
{
    (void)arg;
    (void)load_p;
}

void epd_daemon_op_none(void *arg)
{
    (void)arg;
}

int epd_daemon_op_rpc_pass(void *arg, const char *method, const void *req, size_t req_len,
                           void **resp_p, size_t *resp_len_p, char *err, size_t err_cap)
{
    (void)arg;
    (void)method;
    (void)req;
    (void)req_len;
    (void)resp_p;
    (void)resp_len_p;
    (void)err;
    (void)err_cap;
    return EPD_DAEMON_RPC_PASS;
}

int epd_daemon_op_stopped_now(void *arg)
{
    (void)arg;
    return 1;
}

epd_status_t epd_daemon_op_setup_none(void *arg, epd_daemon_t *d)
{
    (void)arg;
    (void)d;
    return EPD_OK;
}

/* ------------------------------------------------------- transport upcalls */

/* With a cluster secret every endpoint is authenticated and names its
 * peer (worker id, epoch): an envelope must be sent as that peer — a member
 * may not speak for another (abort its requests, quiesce its writes, inject
 * tokens into its streams).  Refused ones are counted and logged (limited). */
static int epd_daemon_sender_ok(epd_daemon_t *d, epd_xport_ep_t *ep, const Epd__Envelope *env)
{
    epd_xport_identity_t id;
    epd_msg_epoch_t e;
    int authenticated = 0;

    if (d->secret.len == 0) {
        return 1;
    }
    if (epd_xport_ep_identity(ep, &id, &authenticated) != EPD_OK || !authenticated) {
        d->forged++;
        epd_daemon_refuse_log(d, epd_msg_request_id(env), "%s on an endpoint not authenticated",
                              epd_msg_body_name(env));
        return 0;
    }
    e = epd_msg_epoch_of(env->sender->epoch);
    if (strcmp(env->sender->worker_id, id.worker_id) != 0 ||
        e.start_time_ns != id.epoch.start_time_ns || e.nonce != id.epoch.nonce) {
        d->forged++;
        epd_daemon_refuse_log(d, epd_msg_request_id(env),
                              "%s claims to come from '%s' but its endpoint is '%s''s (%llu so "
                              "far)",
                              epd_msg_body_name(env), env->sender->worker_id, id.worker_id,
                              (unsigned long long)d->forged);
        return 0;
    }
    return 1;
}

/* Fault point <role>.die_after_msgs=N (common/epd_fault.h): the process
 * ends (as SIGKILL would) right after handling its N-th request-plane
 * message — between two messages, whatever was in flight. */
static void epd_daemon_fault_after_msg(epd_daemon_t *d)
{
    char name[EPD_FAULT_NAME_MAX + 1];
    int64_t n;

    snprintf(name, sizeof(name), "%s.die_after_msgs", d->log);
    if (epd_fault_point(name, &n) && ++d->fault_msgs >= (uint64_t)n && n >= 0) {
        epd_fault_die(name);
    }
}

static void epd_daemon_on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    epd_daemon_t *d = arg;
    epd_link_t *from = epd_xport_ep_user(ep);
    Epd__Envelope *env = NULL;
    const char *why = NULL;

    if (from == NULL || !epd_link_usable(from) || d->stopping) {
        return;
    }
    if (epd_msg_decode(data, len, &env, &why) != EPD_OK) {
        d->bad_frames++;
        epd_daemon_refuse_log(d, 0,
                              "undecodable request-plane frame of %zu bytes: %s (%llu so far)", len,
                              why != NULL ? why : "?", (unsigned long long)d->bad_frames);
        return;
    }
    if (!epd_daemon_sender_ok(d, ep, env)) {
        epd_msg_free(env);
        return;
    }
    if (epd__peer_on_sender(d, from, env)) {
        epd_msg_free(env);
        return;
    }
    if (epd__daemon_bench_on_msg(d, from, env)) {
        epd_msg_free(env);
        return;
    }
    if (!d->ops.on_msg(d->cfg.arg, from, env)) {
        epd_msg_free(env);
    }
    if (epd_fault_any()) {
        epd_daemon_fault_after_msg(d);
    }
}

static void epd_daemon_on_accept(void *arg, epd_xport_ep_t *ep)
{
    epd_daemon_t *d = arg;

    if (epd__link_new(d, EPD_LINK_IN, ep) == NULL) {
        epd_log_error(d->log, 0, "out of memory for an incoming endpoint: closing it");
        epd_xport_ep_close(ep);
        return;
    }
    epd_log_debug(d->log, 0, "accepted an endpoint");
}

static void epd_daemon_on_ep_error(void *arg, epd_xport_ep_t *ep, epd_status_t status)
{
    epd_link_t *l = epd_xport_ep_user(ep);

    (void)arg;
    if (l != NULL) {
        epd__link_fail(l, status);
    }
}

/* --------------------------------------------------------------- the pump */

/* Links that went down since the last pass: the role hears of each once
 * (a peer's link kills the peer; its OUT link is reported as the peer's
 * death only). */
static int epd_daemon_report_links(epd_daemon_t *d)
{
    int did = 0;

    for (epd_link_t *l = d->links; l != NULL; l = l->next) {
        if (!l->down || l->closed || l->down_reported) {
            continue;
        }
        l->down_reported = 1;
        did = 1;
        if (l->peer != NULL) {
            epd_peer_t *p = l->peer;
            int ours = p->link == l;

            epd__peer_link_down(p, l->status);
            if (ours) {
                continue;
            }
        }
        d->ops.on_link_down(d->cfg.arg, l, l->status);
    }
    return did;
}

static void epd_daemon_on_pump(uv_idle_t *idle)
{
    epd_daemon_t *d = idle->data;
    int again;

    /* a report may kill a peer, a peer's close may take links down: until
     * nothing moves (each pass ends at least one thing for good) */
    do {
        again = 0;
        if (d->links_dirty) {
            again |= epd_daemon_report_links(d);
        }
        if (d->peers_dirty) {
            again |= epd__peer_reap(d);
        }
        if (d->links_dirty) {
            again |= epd_daemon_report_links(d);
            epd__link_reap(d);
        }
    } while (again);
    /* the role's deferred work; it may kick again */
    d->pump_on = 0;
    if (!d->stopping && d->ops.on_pump(d->cfg.arg)) {
        d->pump_on = 1;
    }
    if (!d->pump_on && !d->links_dirty && !d->peers_dirty) {
        uv_idle_stop(&d->pump);
    } else {
        d->pump_on = 1;
    }
}

void epd_daemon_kick(epd_daemon_t *d)
{
    epd__daemon_pump_kick(d);
}

static void epd_daemon_on_tick(uv_timer_t *timer)
{
    epd_daemon_t *d = timer->data;

    if (d->flush_head != NULL) {
        epd__link_flush_all(d);
    }
    if (d->owed != NULL && !d->stopping) {
        epd__peer_owed_flush(d, epd_time_now_ns());
    }
    d->ops.on_tick(d->cfg.arg, epd_time_now_ns());
    if (d->term_drain && !d->stopping) {
        if (d->ops.idle(d->cfg.arg)) {
            epd_log_info(d->log, 0, "drained: nothing left running; stopping");
            epd_daemon_stop(d);
        } else if (epd_time_now_ns() >= d->term_deadline_ns) {
            epd_log_warn(d->log, 0, "drain grace (%lld ms) over with requests still running: "
                         "stopping anyway", (long long)d->fl->drain_grace_ms);
            epd_daemon_stop(d);
        }
    }
}

/* ------------------------------------------------------------------- trace */

/* Writes the trace (--trace): blocking file I/O, so only at exit and on an
 * explicit SIGUSR1, never per request. */
static void epd_daemon_trace_write(epd_daemon_t *d)
{
    uint64_t n, dropped;
    epd_status_t st;

    if (d->trace == NULL) {
        return;
    }
    st = epd_trace_write_json(d->trace, d->fl->trace, 0);
    epd_trace_counts(d->trace, &n, &dropped);
    if (st != EPD_OK) {
        epd_log_error(d->log, 0, "cannot write the trace '%s': %s", d->fl->trace,
                      epd_status_string(st));
    } else {
        epd_log_info(d->log, 0, "trace: %llu events written to %s (%llu dropped: buffer full)",
                     (unsigned long long)n, d->fl->trace, (unsigned long long)dropped);
    }
}

static void epd_daemon_on_sigusr1(uv_signal_t *sig, int signum)
{
    (void)signum;
    epd_daemon_trace_write(sig->data);
}

/* ---------------------------------------------------------------- stopping */

/* Steps 1 and 2 of the stop order. */
void epd_daemon_stop(epd_daemon_t *d)
{
    if (d->stopping) {
        return;
    }
    d->stopping = 1;
    {
        epd_daemon_load_t l;

        memset(&l, 0, sizeof(l));
        d->ops.load(d->cfg.arg, &l);
        epd_log_info(d->log, 0,
                     "stopping: %u running, %u queued; since start %llu received, %llu served, "
                     "%llu failed or aborted, %llu refused",
                     l.running_requests, l.queue_depth, (unsigned long long)d->counts.received,
                     (unsigned long long)d->counts.served, (unsigned long long)d->counts.failed,
                     (unsigned long long)d->counts.refused);
    }
    d->ops.on_stop(d->cfg.arg);
    epd_registrar_stop(d->registrar);
    d->registrar = NULL;
    epd_rpc_server_destroy(d->rpc);
    d->rpc = NULL;
    uv_signal_stop(&d->sigterm);
    uv_signal_stop(&d->sigint);
    /* step 3 happens in epd_daemon_serve's loop */
}

static void epd_daemon_on_signal(uv_signal_t *sig, int signum)
{
    epd_daemon_t *d = sig->data;

    if (signum == SIGTERM && !d->term_drain && d->fl->drain_grace_ms > 0) {
        /* as a kubelet expects: take no new work, let the running finish
         * (the tick stops the daemon once the role is idle) */
        d->term_drain = 1;
        d->term_deadline_ns =
            epd_time_now_ns() + (uint64_t)d->fl->drain_grace_ms * EPD_NSEC_PER_MSEC;
        epd_log_info(d->log, 0,
                     "SIGTERM: draining for at most %lld ms, then stopping (SIGTERM again or "
                     "SIGINT: stop now)",
                     (long long)d->fl->drain_grace_ms);
        epd_daemon_drain(d, "SIGTERM");
        return;
    }
    epd_log_info(d->log, 0,
                 "signal %d: stopping (%llu refusals, %llu undecodable frames since "
                 "start)",
                 signum, (unsigned long long)d->refusals, (unsigned long long)d->bad_frames);
    epd_daemon_stop(d);
}

static void epd_daemon_close_walk(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h)) {
        uv_close(h, NULL);
    }
}

/* ------------------------------------------------------------------ create */

static void epd_daemon_model_basename(epd_daemon_t *d, const char *model)
{
    size_t n = strlen(model);
    const char *end, *start;

    while (n > 1 && model[n - 1] == '/') {
        n--;
    }
    end = model + n;
    for (start = end; start > model && start[-1] != '/'; start--) {
    }
    snprintf(d->model_name, sizeof(d->model_name), "%.*s", (int)(end - start), start);
}

static epd_status_t epd_daemon_make_xport(epd_daemon_t *d)
{
    const epd_daemon_flags_t *fl = d->fl;
    epd_xport_config_t xc;
    epd_status_t st;

    epd_xport_config_init(&xc);
    xc.backend = fl->transport;
    xc.expect = fl->expect;
    xc.provider = fl->provider;
    xc.bind_host = d->data_host; /* ofi binds it; ucx runs on its interface */
    xc.max_msg_size = d->cfg.max_msg_size;
    if (d->cfg.max_inflight > 0) {
        xc.max_inflight = d->cfg.max_inflight;
    }
    xc.peer_timeout_ms = (uint32_t)fl->peer_timeout_ms;
    xc.connect_timeout_ms = (uint32_t)fl->connect_timeout_ms;
    if (d->secret.len > 0) {
        /* every endpoint proves both ends members and names them */
        xc.secret = d->secret.bytes;
        xc.secret_len = d->secret.len;
    }
    snprintf(xc.identity.worker_id, sizeof(xc.identity.worker_id), "%s", d->worker_id);
    xc.identity.role = d->cfg.role;
    xc.identity.epoch.start_time_ns = d->epoch.start_time_ns;
    xc.identity.epoch.nonce = d->epoch.nonce;
    xc.msg_cb = epd_daemon_on_msg;
    xc.accept_cb = epd_daemon_on_accept;
    xc.err_cb = epd_daemon_on_ep_error;
    xc.cb_arg = d;
    st = epd_xport_create(&xc, &d->x);
    if (st != EPD_OK) {
        epd_log_error(d->log, 0, "cannot start the '%s' transport: %s", fl->transport,
                      epd_status_string(st));
        return st;
    }
    st = epd_xport_address(d->x, &d->addr, &d->addr_len);
    if (st != EPD_OK) {
        epd_log_error(d->log, 0, "no transport address: %s", epd_status_string(st));
        return st;
    }
    d->dx = d->x;
    /* room for a frame's header and envelope around the largest body */
    d->tx_cap = d->cfg.max_msg_size;
    d->tx_buf = epd_malloc(d->tx_cap);
    return d->tx_buf != NULL ? EPD_OK : EPD_ERR_NO_MEMORY;
}

epd_status_t epd_daemon_create(const epd_daemon_config_t *config, epd_daemon_t **d_p)
{
    const epd_daemon_flags_t *fl = config->flags;
    epd_daemon_t *d;
    epd_status_t st;

    d = epd_calloc(1, sizeof(*d));
    if (d == NULL) {
        epd_log_error(config->role_name, 0, "out of memory");
        return EPD_ERR_NO_MEMORY;
    }
    d->cfg = *config;
    d->ops = *config->ops;
    d->fl = fl;
    d->log = config->role_name;
    if (d->cfg.max_msg_size == 0) {
        d->cfg.max_msg_size = EPD_DAEMON_MSG_DEFAULT;
    }
    if (d->cfg.tick_ms == 0) {
        d->cfg.tick_ms = EPD_DAEMON_TICK_MS;
    }
    if (fl->worker_id != NULL && fl->worker_id[0] != '\0') {
        snprintf(d->worker_id, sizeof(d->worker_id), "%s", fl->worker_id);
    } else {
        snprintf(d->worker_id, sizeof(d->worker_id), "%s-%d", d->log, (int)getpid());
    }
    epd_daemon_model_basename(d, fl->model);
    d->epoch.start_time_ns = epd_time_wall_ns();
    d->epoch.nonce = epd_rng_entropy();
    if (uv_loop_init(&d->loop) != 0) {
        epd_log_error(d->log, 0, "cannot create the event loop");
        epd_free(d);
        return EPD_ERR_NO_MEMORY;
    }
    d->loop_ready = 1;
    uv_signal_init(&d->loop, &d->sigterm);
    uv_signal_init(&d->loop, &d->sigint);
    uv_signal_init(&d->loop, &d->sigusr1);
    uv_timer_init(&d->loop, &d->tick);
    uv_idle_init(&d->loop, &d->pump);
    uv_check_init(&d->loop, &d->flush);
    d->sigterm.data = d->sigint.data = d->sigusr1.data = d;
    d->tick.data = d;
    d->pump.data = d;
    d->flush.data = d;
    d->pump_cb = epd_daemon_on_pump;
    d->handles_ready = 1;
    if (fl->trace != NULL && fl->trace[0] != '\0') {
        char pname[EPD_WORKER_ID_MAX + 32];

        snprintf(pname, sizeof(pname), "epd-%s %s", d->log, d->worker_id);
        st = epd_trace_create((size_t)fl->trace_events, pname, &d->trace);
        if (st != EPD_OK) {
            epd_log_error(d->log, 0, "cannot create the trace recorder (%lld events): %s",
                          (long long)fl->trace_events, epd_status_string(st));
            goto err_destroy;
        }
        /* the recorder keeps the pointer until it writes (at destroy) */
        snprintf(d->trace_thread, sizeof(d->trace_thread), "%s loop", d->log);
        epd_trace_thread_name(d->trace, d->trace_thread);
    }
    st = epd__daemon_addresses(d);
    if (st != EPD_OK) {
        goto err_destroy;
    }
    if (config->with_xport) {
        st = epd_daemon_make_xport(d);
        if (st != EPD_OK) {
            goto err_destroy;
        }
    }
    *d_p = d;
    return EPD_OK;

err_destroy:
    epd_daemon_destroy(d);
    return st;
}

/* ------------------------------------------------------------------- serve */

/* Writes the ready line atomically (tmp + rename). */
static int epd_daemon_ready_file(const char *path, const char *line)
{
    char tmp[4096];
    FILE *f;

    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof(tmp)) {
        errno = ENAMETOOLONG;
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

/* Ready: the ready file (when asked for), grpc.health.v1 SERVING.  EPD_OK
 * or EPD_ERR_CONFIG (logged). */
static epd_status_t epd_daemon_ready(epd_daemon_t *d)
{
    const char *path = d->fl->ready_file;

    if (path != NULL && path[0] != '\0' && epd_daemon_ready_file(path, d->ready_line) != 0) {
        epd_log_error(d->log, 0, "cannot write the ready file '%s': %s", path, strerror(errno));
        return EPD_ERR_CONFIG;
    }
    d->joined = 1;
    epd_log_info(d->log, 0, "ready: %.*s", (int)strlen(d->ready_line) - 1, d->ready_line);
    return EPD_OK;
}

static void epd_daemon_joined(void *arg);

/* Start-up after create: the driver, the control plane, the ready line,
 * registration.  EPD_OK, or the failure (logged). */
static epd_status_t epd_daemon_start(epd_daemon_t *d, const char *ready_prefix)
{
    const epd_daemon_flags_t *fl = d->fl;
    epd_rpc_limits_t limits;
    epd_rpc_guard_stats_t gs;
    char desc[512];
    epd_status_t st;

    if (d->dx != NULL) {
        uint32_t tick = (uint32_t)fl->peer_timeout_ms / 8;

        tick = tick == 0 ? 1 : tick > 50 ? 50 : tick;
        st = epd_xport_uv_start(&d->loop, d->dx, tick, &d->xuv);
        if (st != EPD_OK) {
            epd_log_error(d->log, 0, "cannot drive the transport from the loop: %s",
                          epd_status_string(st));
            return st;
        }
    }
    epd_daemon_flags_limits(fl, &limits);
    st = epd_rpc_server_create_limited(&d->loop, d->control_bind, &limits, epd__daemon_on_rpc, d,
                                       &d->rpc);
    if (st != EPD_OK) {
        epd_log_error(d->log, 0, "cannot serve the control plane on %s: %s", d->control_bind,
                      epd_status_string(st));
        return st;
    }
    d->rpc_port = epd_rpc_server_port(d->rpc);
    epd_rpc_server_guard_stats(d->rpc, &gs);
    epd_log_info(d->log, 0,
                 "control port: up to %u connections (%u from one address), %u ms to "
                 "authenticate, %u streams and %u resets per 10 s a connection",
                 gs.max_conns, limits.max_conns_per_addr, limits.auth_timeout_ms,
                 limits.max_streams, limits.max_resets);
    /* what the ready line, the registration and Health tell others */
    (void)epd_addr_join(d->advertise_host, (uint16_t)d->rpc_port, d->control_advertised,
                        sizeof(d->control_advertised));
    uv_timer_start(&d->tick, epd_daemon_on_tick, d->cfg.tick_ms, d->cfg.tick_ms);
    uv_signal_start(&d->sigterm, epd_daemon_on_signal, SIGTERM);
    uv_signal_start(&d->sigint, epd_daemon_on_signal, SIGINT);
    uv_signal_start(&d->sigusr1, epd_daemon_on_sigusr1, SIGUSR1);

    st = epd__daemon_metrics_start(d);
    if (st != EPD_OK) {
        return st;
    }
    snprintf(d->ready_line, sizeof(d->ready_line), "%s%scontrol=%s pid=%d worker=%s transport=%s",
             ready_prefix != NULL ? ready_prefix : "",
             ready_prefix != NULL && ready_prefix[0] != '\0' ? " " : "", d->control_advertised,
             (int)getpid(), d->worker_id, fl->transport);
    if (d->metrics != NULL) {
        /* last, so that readers matching `control=` and friends are unchanged */
        char host[EPD_ADDR_HOST_MAX], addr[EPD_ADDR_MAX];
        uint16_t port;

        (void)epd_addr_split(d->metrics_bind, host, sizeof(host), &port, NULL);
        (void)epd_addr_join(host, epd_metrics_http_port(d->metrics), addr, sizeof(addr));
        snprintf(d->ready_line + strlen(d->ready_line), sizeof(d->ready_line) - strlen(d->ready_line),
                 " metrics=%s", addr);
    }
    snprintf(d->ready_line + strlen(d->ready_line), sizeof(d->ready_line) - strlen(d->ready_line),
             "\n");
    if (d->dx != NULL) {
        epd_xport_describe(d->dx, desc, sizeof(desc));
        epd_log_info(d->log, 0, "transport %s", desc);
    }
    if (d->router_addr[0] == '\0') {
        st = epd_daemon_ready(d);
        if (st != EPD_OK) {
            return st;
        }
    } else {
        /* a worker the router has not listed serves nobody: an
         * orchestrator must not count it ready (epd_daemon_joined) */
        epd_log_info(d->log, 0,
                     "control plane at %s; not ready until the router %s accepts this worker "
                     "(no ready file, grpc.health.v1 NOT_SERVING until then)",
                     d->control_advertised, fl->router);
    }
    return epd__daemon_register(d, d->control_advertised, epd_daemon_joined);
}

/* The registrar's joined_cb (arg: the daemon): the router listed this
 * worker, so it is ready now. */
static void epd_daemon_joined(void *arg)
{
    epd_daemon_t *d = arg;

    if (d->joined || d->stopping) {
        return;
    }
    if (epd_daemon_ready(d) != EPD_OK) {
        epd_daemon_stop(d); /* as a start-up that could not write it */
    }
}

epd_status_t epd_daemon_serve(epd_daemon_t *d, const char *ready_prefix)
{
    uint64_t give_up_ns = 0;
    epd_status_t st;

    st = epd_daemon_start(d, ready_prefix);
    if (st != EPD_OK) {
        epd_daemon_stop(d);
    }
    /* serving; after a signal (steps 1-2) until the role let go (step 3),
     * at most EPD_DAEMON_STOP_GRACE_MS */
    for (;;) {
        int alive = uv_run(&d->loop, UV_RUN_ONCE);

        if (!d->stopping) {
            continue;
        }
        if (give_up_ns == 0) {
            give_up_ns = epd_time_now_ns() + EPD_DAEMON_STOP_GRACE_MS * EPD_NSEC_PER_MSEC;
        }
        if (d->ops.stopped(d->cfg.arg)) {
            /* what the role sent on its way out (aborts) gets a turn */
            uv_run(&d->loop, UV_RUN_NOWAIT);
            break;
        }
        if (!alive || epd_time_now_ns() > give_up_ns) {
            epd_log_warn(d->log, 0, "the %s role did not let go in time: stopping anyway", d->log);
            break;
        }
    }
    /* step 4: the driver, timers and signals stop (the role's own handles
     * stay until its threads are joined: they may still wake the loop) */
    epd_xport_uv_stop(d->xuv);
    d->xuv = NULL;
    epd__daemon_metrics_stop(d);
    d->handles_ready = 0;
    uv_close((uv_handle_t *)&d->tick, NULL);
    uv_close((uv_handle_t *)&d->pump, NULL);
    uv_close((uv_handle_t *)&d->flush, NULL);
    uv_close((uv_handle_t *)&d->sigterm, NULL);
    uv_close((uv_handle_t *)&d->sigint, NULL);
    uv_close((uv_handle_t *)&d->sigusr1, NULL);
    uv_run(&d->loop, UV_RUN_NOWAIT);
    /* step 5: the role's threads, then whatever handle is left (the
     * grants go first: the role may deregister its regions) */
    epd__peer_close_grants(d);
    d->ops.on_exit(d->cfg.arg);
    uv_walk(&d->loop, epd_daemon_close_walk, NULL);
    uv_run(&d->loop, UV_RUN_DEFAULT);
    /* step 6: every endpoint, then the transport (pending writes complete
     * into the role's callbacks) */
    epd__link_close_all(d);
    epd_xport_destroy(d->x);
    d->x = NULL;
    d->dx = NULL;
    return st;
}

int epd_daemon_run(const epd_daemon_config_t *config)
{
    epd_daemon_t *d = NULL;
    epd_status_t st;

    st = epd_daemon_create(config, &d);
    if (st == EPD_OK) {
        st = config->ops->setup(config->arg, d);
        if (st == EPD_OK) {
            st = epd_daemon_serve(d, d->ready_prefix[0] != '\0' ? d->ready_prefix : NULL);
        }
    }
    config->ops->cleanup(config->arg);
    epd_daemon_destroy(d);
    return st == EPD_OK ? 0 : 1;
}

void epd_daemon_destroy(epd_daemon_t *d)
{
    if (d == NULL) {
        return;
    }
    if (d->rpc != NULL || d->registrar != NULL) {
        epd_registrar_stop(d->registrar);
        epd_rpc_server_destroy(d->rpc);
    }
    epd_xport_uv_stop(d->xuv);
    epd__peer_free_all(d);
    epd__link_free_all(d);
    epd_xport_destroy(d->x);
    if (d->loop_ready) {
        d->handles_ready = 0;
        uv_walk(&d->loop, epd_daemon_close_walk, NULL);
        uv_run(&d->loop, UV_RUN_DEFAULT);
        if (uv_loop_close(&d->loop) != 0) {
            epd_log_warn(d->log, 0, "event loop closed with handles still open");
        }
    }
    epd_daemon_trace_write(d);
    epd_trace_destroy(d->trace);
    epd_free(d->tx_buf);
    epd_secret_wipe(&d->secret);
    epd_free(d);
}

/* --------------------------------------------------------------- accessors */

uv_loop_t *epd_daemon_loop(epd_daemon_t *d)
{
    return &d->loop;
}

epd_xport_t *epd_daemon_xport(epd_daemon_t *d)
{
    return d->x;
}

const char *epd_daemon_worker_id(const epd_daemon_t *d)
{
    return d->worker_id;
}

epd_msg_epoch_t epd_daemon_epoch(const epd_daemon_t *d)
{
    return d->epoch;
}

const char *epd_daemon_model_name(const epd_daemon_t *d)
{
    return d->model_name;
}

const char *epd_daemon_log(const epd_daemon_t *d)
{
    return d->log;
}

const epd_daemon_flags_t *epd_daemon_flags(const epd_daemon_t *d)
{
    return d->fl;
}

epd_trace_t *epd_daemon_trace(epd_daemon_t *d)
{
    return d->trace;
}

void epd_daemon_secret(const epd_daemon_t *d, const void **secret_p, size_t *len_p)
{
    *secret_p = d->secret.len > 0 ? d->secret.bytes : NULL;
    *len_p = d->secret.len;
}

epd_daemon_counts_t *epd_daemon_counts(epd_daemon_t *d)
{
    return &d->counts;
}

int epd_daemon_stopping(const epd_daemon_t *d)
{
    return d->stopping;
}

int epd_daemon_draining(const epd_daemon_t *d)
{
    return d->draining;
}

void epd_daemon_address(const epd_daemon_t *d, const void **addr_p, size_t *len_p)
{
    *addr_p = d->addr;
    *len_p = d->addr_len;
}

int epd_daemon_control_port(const epd_daemon_t *d)
{
    return d->rpc_port;
}

const char *epd_daemon_advertise_host(const epd_daemon_t *d)
{
    return d->advertise_host;
}

const char *epd_daemon_data_host(const epd_daemon_t *d)
{
    return d->data_host;
}

void epd_daemon_set_capacity(epd_daemon_t *d, const epd_daemon_capacity_t *cap)
{
    d->capacity = *cap;
}

void epd_daemon_set_kv_layout(epd_daemon_t *d, const epd_kv_layout_t *kv)
{
    epd_layout_to_msg(kv, &d->layout_msg, d->pattern);
    d->have_layout = 1;
}

void epd_daemon_set_prefix_root(epd_daemon_t *d, const unsigned char root[32])
{
    memcpy(d->prefix_root, root, sizeof(d->prefix_root));
    d->have_prefix_root = 1;
}

void epd_daemon_set_prefix_cache(epd_daemon_t *d, const epd_kvcache_t *cache)
{
    d->prefix_cache = cache;
}

void epd_daemon_prefix_hint(epd_daemon_t *d, uint64_t hint, int added)
{
    epd_registrar_hint(d->registrar, hint, added);
}

int epd_daemon_sent_by_router(epd_daemon_t *d, const Epd__Envelope *env)
{
    const Epd__Epoch *e = env->sender != NULL ? env->sender->epoch : NULL;

    return e != NULL && epd_registrar_is_router(d->registrar, e->start_time_ns, e->nonce);
}

void epd_daemon_set_ready_prefix(epd_daemon_t *d, const char *prefix)
{
    snprintf(d->ready_prefix, sizeof(d->ready_prefix), "%s", prefix != NULL ? prefix : "");
}

void epd_daemon_drive_xport(epd_daemon_t *d, epd_xport_t *x)
{
    d->dx = x;
}
