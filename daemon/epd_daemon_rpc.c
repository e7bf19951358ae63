/*
 * epd_daemon_rpc.c — a worker's control plane (proto/epd_control.proto):
 * Health, Status and Drain answered from what the role reports (its load
 * through ops->load, its capacity and KV layout set once), and the
 * RegisterRequest + registrar that make it a member of the router's
 * registry (--router).  RegisterWorker and Heartbeat are the router's: a
 * worker answers them UNIMPLEMENTED.  Handlers run on the loop thread (see
 * epd_rpc.h), so they read the daemon's state without locks.
 *
 * A role with a control plane of its own (the router) answers first
 * (ops->on_rpc); EPD_DAEMON_RPC_PASS hands the call to the code here.
 *
 * With a cluster secret (d->secret) the control server requires
 * every call but Health to be signed with it (epd_rpc.h: checked on the
 * server's thread, so the handlers below never see an unauthenticated
 * call), and the registrar signs its own.
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_daemon_int.h"
#include "epd_grpc_health.pb-c.h"
#include "epd_kvcache.h"
#include "epd_prefix.h"

/* Storage for the nested messages of one answer (caller's stack). */
typedef struct {
    Epd__WorkerIdentity ident;
    Epd__Epoch epoch;
    Epd__Load load;
    Epd__PrefixCacheStats prefix;
    Epd__Capacity cap;
} epd_daemon_rpc_parts_t;

/* What each link really uses: the live endpoints this worker opened to
 * other workers, by the class of the lanes the transport chose. */
static void epd_daemon_link_classes(epd_daemon_t *d, uint32_t *links)
{
    for (epd_link_t *k = d->links; k != NULL; k = k->next) {
        const char *cls;

        if (k->kind != EPD_LINK_OUT || k->peer == NULL || k->ep == NULL || k->down || k->closed ||
            !k->connected) {
            continue;
        }
        cls = epd_xport_ep_class(k->ep);
        if (strcmp(cls, "shm") == 0) {
            links[EPD_REGISTRAR_LINK_SHM]++;
        } else if (strcmp(cls, "tcp") == 0) {
            links[EPD_REGISTRAR_LINK_TCP]++;
        } else if (strcmp(cls, "rdma") == 0) {
            links[EPD_REGISTRAR_LINK_RDMA]++;
        } else {
            links[EPD_REGISTRAR_LINK_OTHER]++;
        }
    }
}

void epd__daemon_load_now(epd_daemon_t *d, epd_daemon_load_t *l)
{
    memset(l, 0, sizeof(*l));
    d->ops.load(d->cfg.arg, l);
    l->draining = d->draining != 0;
    memset(l->links, 0, sizeof(l->links));
    epd_daemon_link_classes(d, l->links);
    if (d->x != NULL) {
        epd_xport_stats_t xs;

        epd_xport_stats(d->x, &xs);
        l->late_writes_refused = xs.writes_refused_late + xs.writes_refused_range;
        l->grants_held = xs.grants_held;
    }
}

static void epd_daemon_rpc_fill(epd_daemon_t *d, epd_daemon_rpc_parts_t *p)
{
    epd_daemon_load_t l;

    epd__worker_identity__init(&p->ident);
    epd__epoch__init(&p->epoch);
    epd__load__init(&p->load);
    epd__capacity__init(&p->cap);
    p->epoch.start_time_ns = d->epoch.start_time_ns;
    p->epoch.nonce = d->epoch.nonce;
    p->ident.worker_id = d->worker_id;
    p->ident.role = (Epd__Role)d->cfg.role;
    p->ident.model = d->model_name;
    p->ident.epoch = &p->epoch;
    epd__daemon_load_now(d, &l);
    p->load.queue_depth = l.queue_depth;
    p->load.queued_tokens = l.queued_tokens;
    p->load.router_queued_tokens = l.router_queued_tokens;
    p->load.kv_blocks_free = l.kv_blocks_free;
    p->load.state_slots_free = l.state_slots_free;
    p->load.running_requests = l.running_requests;
    p->load.kv_bytes_sent = l.kv_bytes_sent;
    p->load.kv_bytes_received = l.kv_bytes_received;
    p->load.preemptions = l.preemptions;
    p->load.recomputed_tokens = l.recomputed_tokens;
    p->load.wasted_prefill_tokens = l.wasted_prefill_tokens;
    epd__prefix_cache_stats__init(&p->prefix);
    epd_prefix_stats_to_msg(&l.prefix, &p->prefix);
    p->load.prefix = &p->prefix;
    p->load.draining = l.draining != 0;
    p->load.links_shm = l.links[EPD_REGISTRAR_LINK_SHM];
    p->load.links_tcp = l.links[EPD_REGISTRAR_LINK_TCP];
    p->load.links_rdma = l.links[EPD_REGISTRAR_LINK_RDMA];
    p->load.links_other = l.links[EPD_REGISTRAR_LINK_OTHER];
    p->load.quarantined = l.quarantined;
    p->load.late_writes_refused = l.late_writes_refused;
    p->load.grants_held = l.grants_held;
    p->cap.kv_blocks_total = d->capacity.kv_blocks_total;
    p->cap.block_tokens = d->capacity.block_tokens;
    p->cap.state_slots_total = d->capacity.state_slots_total;
    p->cap.max_batch = d->capacity.max_batch;
    p->cap.max_context = d->capacity.max_context;
    p->cap.embed_slots = d->capacity.embed_slots;
    p->cap.image_embeddings = d->capacity.image_embeddings;
    p->cap.embed_dim = d->capacity.embed_dim;
    p->cap.kv_headroom_tokens = d->capacity.kv_headroom_tokens;
}

void epd_daemon_drain(epd_daemon_t *d, const char *who)
{
    if (d->draining) {
        return;
    }
    d->draining = 1;
    epd_log_info(d->log, 0, "draining (%s): new requests are refused, running ones finish", who);
    d->ops.on_drain(d->cfg.arg);
}

static int epd_daemon_on_drain_rpc(epd_daemon_t *d, const void *req, size_t req_len,
                                   void **resp_p, size_t *resp_len_p, char *err, size_t err_cap)
{
    Epd__DrainResponse r = EPD__DRAIN_RESPONSE__INIT;
    ProtobufCMessage *m = NULL;
    Epd__DrainRequest *dr;

    if (epd_proto_unpack(&epd__drain_request__descriptor, req, req_len, &m) != EPD_OK) {
        snprintf(err, err_cap, "malformed DrainRequest");
        return EPD_RPC_INVALID_ARGUMENT;
    }
    dr = (Epd__DrainRequest *)m;
    if (dr->worker_id == NULL || strcmp(dr->worker_id, d->worker_id) != 0) {
        snprintf(err, err_cap, "no worker '%.100s' here (this is '%.100s')",
                 dr->worker_id != NULL ? dr->worker_id : "", d->worker_id);
        epd_proto_free(m);
        return EPD_RPC_NOT_FOUND;
    }
    epd_proto_free(m);
    epd_daemon_drain(d, "Drain RPC");
    r.ok = 1;
    return epd_proto_answer(&r.base, resp_p, resp_len_p, err, err_cap);
}

/* grpc.health.v1.Health/Check, for orchestrators' probes (a kubelet's
 * `grpc:` probe, grpc_health_probe): SERVING while the daemon serves,
 * NOT_SERVING while it drains or stops, and while a worker given --router
 * has not been accepted by it (listed nowhere, it serves nobody).  The
 * service "" is the daemon, its role's name ("prefill") too; any other is
 * NOT_FOUND, as the protocol says.  Watch (a stream) is not served. */
static int epd_daemon_grpc_health(epd_daemon_t *d, const char *method, const void *req,
                                  size_t req_len, void **resp_p, size_t *resp_len_p, char *err,
                                  size_t err_cap)
{
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    Grpc__Health__V1__HealthCheckRequest *q;
    ProtobufCMessage *m = NULL;
    int known;

    if (strcmp(method, EPD_RPC_GRPC_HEALTH_WATCH) == 0) {
        snprintf(err, err_cap, "Watch is not served: call Check");
        return EPD_RPC_UNIMPLEMENTED;
    }
    if (epd_proto_unpack(&grpc__health__v1__health_check_request__descriptor, req, req_len, &m) !=
        EPD_OK) {
        snprintf(err, err_cap, "malformed HealthCheckRequest");
        return EPD_RPC_INVALID_ARGUMENT;
    }
    q = (Grpc__Health__V1__HealthCheckRequest *)m;
    known = q->service == NULL || q->service[0] == '\0' || strcmp(q->service, d->log) == 0;
    if (!known) {
        snprintf(err, err_cap, "unknown service '%.64s' (this daemon answers '' and '%s')",
                 q->service, d->log);
        epd_proto_free(m);
        return EPD_RPC_NOT_FOUND;
    }
    epd_proto_free(m);
    r.status = d->draining || d->stopping || !d->joined
                   ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
                   : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    return epd_proto_answer(&r.base, resp_p, resp_len_p, err, err_cap);
}

int epd__daemon_on_rpc(void *arg, const char *method, const void *req, size_t req_len,
                       void **resp_p, size_t *resp_len_p, char *err, size_t err_cap)
{
    epd_daemon_t *d = arg;
    epd_daemon_rpc_parts_t p;
    int rc;

    if (strncmp(method, "/grpc.health.v1.Health/", 23) == 0) {
        /* the daemon's, whatever the role: every control port answers it */
        return epd_daemon_grpc_health(d, method, req, req_len, resp_p, resp_len_p, err, err_cap);
    }
    rc = d->ops.on_rpc(d->cfg.arg, method, req, req_len, resp_p, resp_len_p, err, err_cap);
    if (rc != EPD_DAEMON_RPC_PASS) {
        return rc;
    }
    if (strcmp(method, EPD_RPC_HEALTH) == 0) {
        Epd__HealthResponse h = EPD__HEALTH_RESPONSE__INIT;

        epd_daemon_rpc_fill(d, &p);
        h.serving = !d->draining && !d->stopping;
        h.worker = &p.ident;
        h.load = &p.load;
        h.transport = (char *)d->fl->transport;
        h.data_plane_address.data = (uint8_t *)(uintptr_t)d->addr;
        h.data_plane_address.len = d->addr_len;
        h.kv_layout = d->have_layout ? &d->layout_msg : NULL;
        h.capacity = &p.cap;
        h.draining = d->draining != 0;
        h.control_address = d->control_advertised;
        h.data_address = d->data_host;
        return epd_proto_answer(&h.base, resp_p, resp_len_p, err, err_cap);
    }
    if (strcmp(method, EPD_RPC_STATUS) == 0) {
        Epd__StatusResponse s = EPD__STATUS_RESPONSE__INIT;
        Epd__WorkerStatus w = EPD__WORKER_STATUS__INIT;
        Epd__WorkerStatus *ws[1] = {&w};

        epd_daemon_rpc_fill(d, &p);
        w.worker = &p.ident;
        w.state = d->draining ? EPD__WORKER_STATE__WORKER_STATE_DRAINING
                              : EPD__WORKER_STATE__WORKER_STATE_READY;
        w.load = &p.load;
        w.capacity = &p.cap;
        w.control_address = d->control_advertised;
        w.data_address = d->data_host;
        s.n_workers = 1;
        s.workers = ws;
        return epd_proto_answer(&s.base, resp_p, resp_len_p, err, err_cap);
    }
    if (strcmp(method, EPD_RPC_DRAIN) == 0) {
        return epd_daemon_on_drain_rpc(d, req, req_len, resp_p, resp_len_p, err, err_cap);
    }
    if (strcmp(method, EPD_RPC_REGISTER) == 0 || strcmp(method, EPD_RPC_HEARTBEAT) == 0) {
        snprintf(err, err_cap, "%s is served by the router, not by a %s worker", method, d->log);
        return EPD_RPC_UNIMPLEMENTED;
    }
    snprintf(err, err_cap, "unknown method %s", method);
    return EPD_RPC_UNIMPLEMENTED;
}

/* ------------------------------------------------------------ registration */

static void epd_daemon_registrar_load(void *arg, epd_registrar_load_t *load_p)
{
    epd__daemon_load_now(arg, load_p);
}

static void epd_daemon_registrar_drain(void *arg)
{
    epd_daemon_drain(arg, "asked by the router");
}

/* The router's hints of this worker start over: every block the role's
 * cache holds, hinted again (loop thread, through the registrar's async). */
static void epd_daemon_registrar_resync(void *arg)
{
    epd_daemon_t *d = arg;
    uint32_t n = epd_kvcache_capacity(d->prefix_cache);

    for (uint32_t b = 0; b < n; b++) {
        const epd_prefix_hash_t *key = epd_kvcache_key(d->prefix_cache, b);

        if (key != NULL) {
            epd_registrar_hint(d->registrar, epd_prefix_hint(key), 1);
        }
    }
}

/* Called by epd__daemon_register right after the control server started,
 * before the loop first runs: no call can have reached a handler yet. */
static epd_status_t epd_daemon_rpc_secure(epd_daemon_t *d)
{
    epd_status_t st;

    if (d->secret.len == 0) {
        return EPD_OK;
    }
    st = epd_rpc_server_set_auth(d->rpc, d->secret.bytes, d->secret.len);
    if (st != EPD_OK) {
        epd_log_error(d->log, 0, "cannot require the cluster secret on the control plane: %s",
                      epd_status_string(st));
        return st;
    }
    epd_log_info(d->log, 0, "control plane: every call but Health must carry the cluster secret");
    return EPD_OK;
}

epd_status_t epd__daemon_register(epd_daemon_t *d, const char *control_address,
                                  void (*joined_cb)(void *d))
{
    Epd__RegisterRequest r = EPD__REGISTER_REQUEST__INIT;
    epd_registrar_config_t cfg;
    epd_daemon_rpc_parts_t p;
    epd_status_t st;
    size_t n;
    void *buf;

    st = epd_daemon_rpc_secure(d);
    if (st != EPD_OK) {
        return st;
    }
    if (d->router_addr[0] == '\0') {
        return EPD_OK;
    }
    epd_daemon_rpc_fill(d, &p);
    r.worker = &p.ident;
    r.transport = (char *)d->fl->transport;
    r.data_plane_address.data = (uint8_t *)(uintptr_t)d->addr;
    r.data_plane_address.len = d->addr_len;
    r.control_address = (char *)control_address;
    r.data_address = d->data_host;
    r.capacity = &p.cap;
    r.kv_layout = d->have_layout ? &d->layout_msg : NULL;
    if (d->have_prefix_root) {
        r.prefix_root.data = d->prefix_root;
        r.prefix_root.len = sizeof(d->prefix_root);
    }
    n = protobuf_c_message_get_packed_size(&r.base);
    buf = epd_malloc(n);
    if (buf == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    protobuf_c_message_pack(&r.base, buf);
    memset(&cfg, 0, sizeof(cfg));
    cfg.router = d->router_addr; /* resolved once, at create */
    cfg.request = buf;
    cfg.request_len = n;
    cfg.load_cb = epd_daemon_registrar_load;
    cfg.drain_cb = epd_daemon_registrar_drain;
    cfg.joined_cb = joined_cb;
    cfg.resync_cb = d->prefix_cache != NULL ? epd_daemon_registrar_resync : NULL;
    cfg.cb_arg = d;
    cfg.log_component = d->log;
    cfg.secret = d->secret.len > 0 ? d->secret.bytes : NULL;
    cfg.secret_len = d->secret.len;
    /* KV hints between two heartbeats: a pool's worth of evictions and
     * insertions is plenty; more, and the router is told to reset */
    cfg.hint_capacity = d->have_prefix_root ? EPD_DAEMON_HINTS_MAX : 0;
    st = epd_registrar_start(&d->loop, &cfg, &d->registrar);
    epd_free(buf);
    if (st != EPD_OK) {
        epd_log_error(d->log, 0, "cannot register with the router '%s': %s", d->fl->router,
                      epd_status_string(st));
    }
    return st;
}
