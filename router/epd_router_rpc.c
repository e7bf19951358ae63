/*
 * epd_router_rpc.c — the router's side of epd.Control (handlers run on the
 * loop thread, see epd_rpc.h):
 *   RegisterWorker  validates the worker's identity, address and layout
 *                   (its layout must match the router's model), adds it to
 *                   the registry and connects the request-plane client to it
 *                   (epd_client_add_worker_info: non-blocking, the
 *                   registration already carries what Health would say).
 *                   A newer epoch of a known worker id replaces the older
 *                   incarnation (marked DEAD).  Answers heartbeat_interval_ms.
 *   Heartbeat       records the load; known=false for an unknown (id,
 *                   epoch) or a DEAD one (the worker registers again);
 *                   drain=true once a drain was asked.
 *   Drain           by worker id: DRAINING here at once, and forwarded to
 *                   the worker's own control address from libuv's thread
 *                   pool (a blocking gRPC call must not run on the loop),
 *                   signed with the cluster secret when there is one.
 *   Status          every worker with its state, load and capacity.
 *   Health          the router itself (role ROUTER), under the daemon's
 *                   identity (worker id, epoch).
 * The daemon runtime serves epd.Control and hands every call here first
 * (ops->on_rpc); the router answers all of them itself.  With a cluster
 * secret the runtime's server has already authenticated every call but
 * Health (epd_rpc.h) before it gets here: a RegisterWorker — a new epoch
 * under a live worker's id above all — a Heartbeat's load or a Drain comes
 * from a member, and an outsider's never reaches the registry.
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_kvq.h"
#include "epd_log.h"
#include "epd_msg.h"
#include "epd_router_int.h"
#include "epd_time.h"

#define EPD_ROUTER_DRAIN_FORWARD_TIMEOUT_MS 3000

static int epd_router_rpc_unpack(const ProtobufCMessageDescriptor *desc, const void *req,
                                 size_t len, ProtobufCMessage **msg_p)
{
    static const unsigned char empty = 0;

    return epd_proto_unpack(desc, len > 0 ? req : &empty, len, msg_p) == EPD_OK ? 0 : -1;
}

/* Worker ids go into logs and metric labels: a conservative alphabet. */
static int epd_router_id_ok(const char *id)
{
    size_t n = id != NULL ? strlen(id) : 0;

    if (n == 0 || n >= EPD_CLIENT_NAME_MAX) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        char c = id[i];

        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.' || c == ':' || c == '@')) {
            return 0;
        }
    }
    return 1;
}

static int epd_router_refuse_register(Epd__RegisterResponse *resp, const char *why, void **resp_p,
                                      size_t *resp_len_p, char *err, size_t err_cap)
{
    resp->accepted = 0;
    resp->reason = (char *)why;
    epd_log_warn(EPD_ROUTER_LOG, 0, "RegisterWorker refused: %s", why);
    return epd_proto_answer(&resp->base, resp_p, resp_len_p, err, err_cap);
}

static int epd_router_register(epd_router_t *rt, const void *req, size_t req_len, void **resp_p,
                               size_t *resp_len_p, char *err, size_t err_cap)
{
    Epd__RegisterResponse resp = EPD__REGISTER_RESPONSE__INIT;
    Epd__Epoch repoch = EPD__EPOCH__INIT;
    ProtobufCMessage *m = NULL;
    Epd__RegisterRequest *rr;
    epd_client_worker_info_t *info = NULL;
    epd_router_worker_t *old, *w;
    epd_client_worker_t *cw = NULL;
    const epd_kv_layout_t *kv = &rt->info->kv;
    char why[512];
    char map[256];
    uint64_t now = epd_time_now_ns();
    int rc;

    repoch.start_time_ns = rt->epoch.start_time_ns;
    repoch.nonce = rt->epoch.nonce;
    resp.router_epoch = &repoch;
    resp.heartbeat_interval_ms = rt->heartbeat_ms;
    if (epd_router_rpc_unpack(&epd__register_request__descriptor, req, req_len, &m) != 0) {
        snprintf(err, err_cap, "malformed RegisterRequest");
        return EPD_RPC_INVALID_ARGUMENT;
    }
    rr = (Epd__RegisterRequest *)m;
    why[0] = '\0';
    if (rr->worker == NULL || rr->worker->epoch == NULL ||
        !epd_router_id_ok(rr->worker->worker_id)) {
        snprintf(why, sizeof(why), "worker identity, epoch or id missing or malformed");
    } else if (rr->worker->role != EPD__ROLE__ROLE_PREFILL &&
               rr->worker->role != EPD__ROLE__ROLE_DECODE &&
               rr->worker->role != EPD__ROLE__ROLE_ENCODER) {
        snprintf(why, sizeof(why),
                 "worker '%.100s': only prefill, decode and encoder workers register",
                 rr->worker->worker_id);
    } else if (rr->data_plane_address.len == 0 || rr->data_plane_address.len > EPD_XPORT_ADDR_MAX) {
        snprintf(why, sizeof(why), "worker '%.100s': empty or oversized data-plane address",
                 rr->worker->worker_id);
    } else if (rr->transport == NULL || strlen(rr->transport) >= sizeof(info->transport)) {
        snprintf(why, sizeof(why), "worker '%.100s': bad transport", rr->worker->worker_id);
    } else if (rr->worker->role == EPD__ROLE__ROLE_ENCODER &&
               (rr->capacity == NULL || rr->capacity->image_embeddings == 0 ||
                rr->capacity->image_embeddings != rt->info->image_embeddings ||
                rr->capacity->embed_dim != rt->info->embed_dim || rr->capacity->embed_slots == 0)) {
        snprintf(why, sizeof(why),
                 "encoder '%.100s': its images (%u x %u floats, %u at once) do not match the "
                 "router's model (%u x %u)",
                 rr->worker->worker_id, rr->capacity != NULL ? rr->capacity->image_embeddings : 0,
                 rr->capacity != NULL ? rr->capacity->embed_dim : 0,
                 rr->capacity != NULL ? rr->capacity->embed_slots : 0,
                 rt->info->image_embeddings, rt->info->embed_dim);
    } else if (rr->worker->role == EPD__ROLE__ROLE_ENCODER) {
        /* no KV: nothing more to compare */
    } else if (rr->kv_layout == NULL || rr->capacity == NULL) {
        snprintf(why, sizeof(why), "worker '%.100s': no KV layout or capacity",
                 rr->worker->worker_id);
    } else if (rr->kv_layout->n_layers != kv->n_layers ||
               rr->kv_layout->block_tokens != kv->block_tokens ||
               rr->kv_layout->n_kv_heads != kv->n_kv_heads ||
               rr->kv_layout->head_dim != kv->head_dim) {
        snprintf(why, sizeof(why),
                 "worker '%.100s': KV layout (%u layers, %u heads x %u, %u tokens/block) differs "
                 "from the router's model (%u layers, %u heads x %u, %u tokens/block)",
                 rr->worker->worker_id, rr->kv_layout->n_layers, rr->kv_layout->n_kv_heads,
                 rr->kv_layout->head_dim, rr->kv_layout->block_tokens, kv->n_layers, kv->n_kv_heads,
                 kv->head_dim, kv->block_tokens);
    } else if (epd_kvq_map_format(kv, map, sizeof(map)),
               strcmp(rr->kv_layout->kv_dtype_map != NULL && rr->kv_layout->kv_dtype_map[0] != '\0'
                          ? rr->kv_layout->kv_dtype_map
                          : "f32",
                      map) != 0) {
        /* every prefill and decode the router pairs must quantize alike:
         * the router's own --kv-dtype is the cluster's */
        snprintf(why, sizeof(why),
                 "worker '%.100s': KV dtype map '%.100s' differs from the router's '%.100s' "
                 "(give every worker and the router the same --kv-dtype)",
                 rr->worker->worker_id,
                 rr->kv_layout->kv_dtype_map != NULL ? rr->kv_layout->kv_dtype_map : "",
                 map);
    } else if (rr->kv_layout->layer_pattern != NULL &&
               strlen(rr->kv_layout->layer_pattern) >= EPD_CLIENT_PATTERN_MAX) {
        snprintf(why, sizeof(why), "worker '%.100s': oversized layer pattern",
                 rr->worker->worker_id);
    } else if (rr->worker->role == EPD__ROLE__ROLE_PREFILL && rr->capacity->embed_slots > 0 &&
               (rr->capacity->image_embeddings != rt->info->image_embeddings ||
                rr->capacity->embed_dim != rt->info->embed_dim)) {
        snprintf(why, sizeof(why),
                 "worker '%.100s': its images (%u x %u floats) differ from the router's model "
                 "(%u x %u)",
                 rr->worker->worker_id, rr->capacity->image_embeddings, rr->capacity->embed_dim,
                 rt->info->image_embeddings, rt->info->embed_dim);
    }
    if (why[0] == '\0' && strcmp(rr->transport, rt->transport) != 0) {
        snprintf(why, sizeof(why), "worker '%.100s' serves transport '%s', the router '%s'",
                 rr->worker->worker_id, rr->transport, rt->transport);
    } else if (why[0] == '\0' && rr->worker->model != NULL && rr->worker->model[0] != '\0' &&
               strcmp(rr->worker->model, rt->model_name) != 0) {
        epd_log_warn(EPD_ROUTER_LOG, 0,
                     "worker '%s' serves model '%s', the router '%s' (same layout: accepted)",
                     rr->worker->worker_id, rr->worker->model, rt->model_name);
    }
    if (why[0] != '\0') {
        rc = epd_router_refuse_register(&resp, why, resp_p, resp_len_p, err, err_cap);
        epd_proto_free(m);
        return rc;
    }
    old = epd_router_registry_find(&rt->reg, rr->worker->worker_id);
    if (old != NULL && old->info.epoch_start_ns == rr->worker->epoch->start_time_ns &&
        old->info.epoch_nonce == rr->worker->epoch->nonce) {
        /* the same incarnation again (it missed our answer): accepted as is */
        old->last_hb_ns = now;
        resp.accepted = 1;
        rc = epd_proto_answer(&resp.base, resp_p, resp_len_p, err, err_cap);
        epd_proto_free(m);
        return rc;
    }
    info = epd_calloc(1, sizeof(*info));
    if (info == NULL) {
        epd_proto_free(m);
        snprintf(err, err_cap, "out of memory");
        return EPD_RPC_INTERNAL;
    }
    snprintf(info->worker_id, sizeof(info->worker_id), "%s", rr->worker->worker_id);
    info->role = rr->worker->role;
    snprintf(info->model, sizeof(info->model), "%s",
             rr->worker->model != NULL ? rr->worker->model : "");
    info->epoch_start_ns = rr->worker->epoch->start_time_ns;
    info->epoch_nonce = rr->worker->epoch->nonce;
    snprintf(info->transport, sizeof(info->transport), "%s", rr->transport);
    memcpy(info->address, rr->data_plane_address.data, rr->data_plane_address.len);
    info->address_len = rr->data_plane_address.len;
    info->serving = 1;
    if (rr->kv_layout != NULL) {
        info->n_layers = rr->kv_layout->n_layers;
        snprintf(info->layer_pattern, sizeof(info->layer_pattern), "%s",
                 rr->kv_layout->layer_pattern != NULL ? rr->kv_layout->layer_pattern : "");
        info->block_tokens = rr->kv_layout->block_tokens;
        info->n_kv_heads = rr->kv_layout->n_kv_heads;
        info->head_dim = rr->kv_layout->head_dim;
        info->kv_dtype = rr->kv_layout->dtype;
        snprintf(info->kv_dtype_map, sizeof(info->kv_dtype_map), "%s",
                 rr->kv_layout->kv_dtype_map != NULL ? rr->kv_layout->kv_dtype_map : "");
        info->block_bytes = rr->kv_layout->block_bytes;
        info->state_bytes = rr->kv_layout->state_bytes;
    }
    info->embed_slots = rr->capacity->embed_slots;
    info->image_embeddings = rr->capacity->image_embeddings;
    info->embed_dim = rr->capacity->embed_dim;
    info->kv_headroom_tokens = rr->capacity->kv_headroom_tokens;
    info->kv_blocks_total = rr->capacity->kv_blocks_total;
    info->state_slots_total = rr->capacity->state_slots_total;
    info->max_batch = rr->capacity->max_batch;
    info->max_context = rr->capacity->max_context;
    info->kv_blocks_free = rr->capacity->kv_blocks_total;
    info->state_slots_free = rr->capacity->state_slots_total;
    if (epd_client_add_worker_info(rt->client, info, &cw) != EPD_OK) {
        snprintf(why, sizeof(why), "worker '%.100s': cannot connect to its data-plane address",
                 info->worker_id);
        epd_free(info);
        rc = epd_router_refuse_register(&resp, why, resp_p, resp_len_p, err, err_cap);
        epd_proto_free(m);
        return rc;
    }
    w = epd_router_registry_add(&rt->reg, info, now);
    if (w == NULL) {
        /* cw stays with the client (freed with it); never used */
        epd_free(info);
        epd_proto_free(m);
        snprintf(err, err_cap, "out of memory");
        return EPD_RPC_INTERNAL;
    }
    if (old != NULL) {
        epd_log_info(EPD_ROUTER_LOG, 0,
                     "worker '%s' registered under a new epoch: the old incarnation is DEAD",
                     info->worker_id);
        epd_router_worker_kill(old, now);
    }
    w->cw = cw;
    snprintf(w->control_addr, sizeof(w->control_addr), "%s",
             rr->control_address != NULL ? rr->control_address : "");
    snprintf(w->data_addr, sizeof(w->data_addr), "%s",
             rr->data_address != NULL ? rr->data_address : "");
    if (rr->prefix_root.len == sizeof(w->prefix_root) && info->kv_blocks_total > 0 &&
        epd_router_hints_create(info->kv_blocks_total < EPD_ROUTER_HINTS_MAX
                                    ? info->kv_blocks_total
                                    : EPD_ROUTER_HINTS_MAX,
                                &w->hints) == EPD_OK) {
        /* its KV hints count only in the router's own namespace */
        memcpy(w->prefix_root, rr->prefix_root.data, sizeof(w->prefix_root));
        w->has_root = memcmp(w->prefix_root, rt->prefix_plain.b, sizeof(w->prefix_root)) == 0;
        if (!w->has_root) {
            epd_log_warn(EPD_ROUTER_LOG, 0,
                         "worker '%s' caches KV under another model digest or layout: its "
                         "KV hints are ignored",
                         info->worker_id);
        }
    }
    rt->m.registrations++;
    epd_log_info(EPD_ROUTER_LOG, 0,
                 "worker '%.100s' (%s) registered: control %s, %u KV blocks, max batch %u, epoch "
                 "%llu/%016llx",
                 info->worker_id, epd_router_pool_name(epd_router_pool_of(info->role)),
                 w->control_addr, info->kv_blocks_total, info->max_batch,
                 (unsigned long long)info->epoch_start_ns, (unsigned long long)info->epoch_nonce);
    epd_free(info);
    resp.accepted = 1;
    rc = epd_proto_answer(&resp.base, resp_p, resp_len_p, err, err_cap);
    epd_proto_free(m);
    return rc;
}


/* The prefix-cache counters of worker w's heartbeat: the increments of its
 * incarnation's monotonic counters into the router's totals, its gauges
 * kept for the per-worker series. */
static void epd_router_prefix_heartbeat(epd_router_t *rt, epd_router_worker_t *w,
                                        const Epd__PrefixCacheStats *msg)
{
    epd_prefix_stats_t *total =
        w->info.role == EPD_CLIENT_ROLE_DECODE ? &rt->m.dprefix : &rt->m.prefix;
    epd_prefix_stats_t now;
    uint64_t cur[EPD_PREFIX_STATS_WORDS], old[EPD_PREFIX_STATS_WORDS], sum[EPD_PREFIX_STATS_WORDS];

    epd_prefix_stats_from_msg(msg, &now);
    memcpy(cur, &now, sizeof(cur));
    memcpy(old, &w->hb_prefix, sizeof(old));
    memcpy(sum, total, sizeof(sum));
    /* the counters: every word but the gauges */
    for (size_t i = 0; i < EPD_PREFIX_STATS_WORDS; i++) {
        if (!EPD_PREFIX_STATS_GAUGE(i) && cur[i] > old[i]) {
            sum[i] += cur[i] - old[i];
        }
    }
    memcpy(total, sum, sizeof(sum));
    w->hb_prefix = now;
}

static int epd_router_heartbeat(epd_router_t *rt, const void *req, size_t req_len, void **resp_p,
                                size_t *resp_len_p, char *err, size_t err_cap)
{
    Epd__HeartbeatResponse resp = EPD__HEARTBEAT_RESPONSE__INIT;
    ProtobufCMessage *m = NULL;
    Epd__HeartbeatRequest *hb;
    epd_router_worker_t *w;
    int rc;

    if (epd_router_rpc_unpack(&epd__heartbeat_request__descriptor, req, req_len, &m) != 0) {
        snprintf(err, err_cap, "malformed HeartbeatRequest");
        return EPD_RPC_INVALID_ARGUMENT;
    }
    hb = (Epd__HeartbeatRequest *)m;
    rt->m.heartbeats++;
    w = hb->worker_id != NULL ? epd_router_registry_find(&rt->reg, hb->worker_id) : NULL;
    if (w != NULL && hb->epoch != NULL && w->info.epoch_start_ns == hb->epoch->start_time_ns &&
        w->info.epoch_nonce == hb->epoch->nonce) {
        w->last_hb_ns = epd_time_now_ns();
        if (hb->load != NULL) {
            w->hb_queue_depth = hb->load->queue_depth;
            w->hb_queued_tokens = hb->load->queued_tokens;
            w->hb_router_queued_tokens = hb->load->router_queued_tokens;
            w->hb_kv_blocks_free = hb->load->kv_blocks_free;
            w->hb_state_slots_free = hb->load->state_slots_free;
            w->hb_running = hb->load->running_requests;
            w->hb_links[0] = hb->load->links_shm;
            w->hb_links[1] = hb->load->links_tcp;
            w->hb_links[2] = hb->load->links_rdma;
            w->hb_links[3] = hb->load->links_other;
            w->hb_quarantined = hb->load->quarantined;
            w->hb_late_writes_refused = hb->load->late_writes_refused;
            w->hb_grants_held = hb->load->grants_held;
            if (hb->load->kv_bytes_sent > w->hb_kv_bytes_sent) {
                rt->m.kv_bytes_sent += hb->load->kv_bytes_sent - w->hb_kv_bytes_sent;
                w->hb_kv_bytes_sent = hb->load->kv_bytes_sent;
            }
            if (hb->load->kv_bytes_received > w->hb_kv_bytes_received) {
                rt->m.kv_bytes_received += hb->load->kv_bytes_received - w->hb_kv_bytes_received;
                w->hb_kv_bytes_received = hb->load->kv_bytes_received;
            }
            epd_router_prefix_heartbeat(rt, w, hb->load->prefix);
            if (w->hints != NULL) {
                if (hb->prefix_reset) {
                    epd_router_hints_clear(w->hints);
                }
                for (size_t i = 0; i < hb->n_prefix_events; i++) {
                    epd_router_hints_apply(w->hints, hb->prefix_events[i]);
                }
            }
            if (hb->load->preemptions > w->hb_preemptions) {
                rt->m.preemptions += hb->load->preemptions - w->hb_preemptions;
                w->hb_preemptions = hb->load->preemptions;
            }
            if (hb->load->recomputed_tokens > w->hb_recomputed_tokens) {
                rt->m.recomputed_tokens += hb->load->recomputed_tokens - w->hb_recomputed_tokens;
                w->hb_recomputed_tokens = hb->load->recomputed_tokens;
            }
            if (hb->load->wasted_prefill_tokens > w->hb_wasted_prefill_tokens) {
                rt->m.wasted_prefill_tokens +=
                    hb->load->wasted_prefill_tokens - w->hb_wasted_prefill_tokens;
                w->hb_wasted_prefill_tokens = hb->load->wasted_prefill_tokens;
            }
            /* its free blocks are current again: what we sent since the
             * last one is in them, and a refusal for room is history */
            w->kv_pending = 0;
            w->cap_refused = 0;
            if (hb->load->draining && !w->self_draining) {
                /* drained through its own Drain RPC (epd-ctl drain WORKER):
                 * no new work from now on, as if drained through us */
                w->self_draining = 1;
                epd_log_info(EPD_ROUTER_LOG, 0, "worker '%s' says it is draining",
                             w->info.worker_id);
            }
        }
        if (w->state == EPD_ROUTER_SUSPECT ||
            (w->state == EPD_ROUTER_READY && w->self_draining)) {
            w->state = w->drain_asked || w->self_draining ? EPD_ROUTER_DRAINING : EPD_ROUTER_READY;
        }
        resp.known = 1;
        resp.drain = w->drain_asked != 0;
    }
    rc = epd_proto_answer(&resp.base, resp_p, resp_len_p, err, err_cap);
    epd_proto_free(m);
    return rc;
}

/* ------------------------------------------------------------- Drain */

typedef struct {
    uv_work_t work;
    epd_router_t *rt;
    const void *secret; /* the daemon's (it outlives its loop's work); NULL: none */
    size_t secret_len;
    char addr[256];
    char worker_id[EPD_CLIENT_NAME_MAX];
    epd_status_t status;
    char err[256];
} epd_router_drain_fwd_t;

/* libuv thread pool: the blocking forward. */
static void epd_router_drain_fwd_work(uv_work_t *work)
{
    epd_router_drain_fwd_t *f = work->data;
    Epd__DrainRequest dr = EPD__DRAIN_REQUEST__INIT;
    epd_rpc_client_t *rpc = NULL;
    unsigned char buf[EPD_CLIENT_NAME_MAX + 16];
    void *resp = NULL;
    size_t resp_len = 0;
    size_t len;

    dr.worker_id = f->worker_id;
    len = epd__drain_request__get_packed_size(&dr);
    if (len > sizeof(buf)) {
        f->status = EPD_ERR_TOO_LONG;
        return;
    }
    epd__drain_request__pack(&dr, buf);
    f->status = epd_rpc_client_create(f->addr, &rpc);
    if (f->status != EPD_OK) {
        return;
    }
    if (f->secret != NULL) {
        f->status = epd_rpc_client_set_auth(rpc, f->secret, f->secret_len);
        if (f->status != EPD_OK) {
            epd_rpc_client_destroy(rpc);
            return;
        }
    }
    f->status = epd_rpc_call(rpc, EPD_RPC_DRAIN, buf, len, EPD_ROUTER_DRAIN_FORWARD_TIMEOUT_MS,
                             &resp, &resp_len, f->err, sizeof(f->err));
    epd_free(resp);
    epd_rpc_client_destroy(rpc);
}

static void epd_router_drain_fwd_done(uv_work_t *work, int status)
{
    epd_router_drain_fwd_t *f = work->data;

    (void)status;
    f->rt->drains_in_flight--;
    if (f->status != EPD_OK) {
        epd_log_warn(EPD_ROUTER_LOG, 0,
                     "forwarding Drain to worker '%s' at %s: %s%s%s (its next heartbeat answer "
                     "says drain)",
                     f->worker_id, f->addr, epd_status_name(f->status), f->err[0] ? ": " : "",
                     f->err);
    } else {
        epd_log_info(EPD_ROUTER_LOG, 0, "worker '%.100s' at %s is draining", f->worker_id, f->addr);
    }
    epd_free(f);
}

static int epd_router_drain(epd_router_t *rt, const void *req, size_t req_len, void **resp_p,
                            size_t *resp_len_p, char *err, size_t err_cap)
{
    Epd__DrainResponse resp = EPD__DRAIN_RESPONSE__INIT;
    ProtobufCMessage *m = NULL;
    Epd__DrainRequest *dr;
    epd_router_worker_t *w;
    epd_router_drain_fwd_t *f;
    int rc;

    if (epd_router_rpc_unpack(&epd__drain_request__descriptor, req, req_len, &m) != 0) {
        snprintf(err, err_cap, "malformed DrainRequest");
        return EPD_RPC_INVALID_ARGUMENT;
    }
    dr = (Epd__DrainRequest *)m;
    w = dr->worker_id != NULL ? epd_router_registry_find(&rt->reg, dr->worker_id) : NULL;
    if (w == NULL) {
        snprintf(err, err_cap, "no live worker '%.100s' is registered here",
                 dr->worker_id != NULL ? dr->worker_id : "");
        epd_proto_free(m);
        return EPD_RPC_NOT_FOUND;
    }
    epd_proto_free(m);
    if (!w->drain_asked) {
        epd_log_info(EPD_ROUTER_LOG, 0,
                     "draining worker '%s': no new requests; %u in flight here finish",
                     w->info.worker_id, w->inflight);
    }
    w->drain_asked = 1;
    if (w->state == EPD_ROUTER_READY) {
        w->state = EPD_ROUTER_DRAINING;
    }
    if (w->control_addr[0] != '\0') {
        f = epd_calloc(1, sizeof(*f));
        if (f != NULL) {
            f->rt = rt;
            f->work.data = f;
            epd_daemon_secret(rt->d, &f->secret, &f->secret_len);
            snprintf(f->addr, sizeof(f->addr), "%s", w->control_addr);
            snprintf(f->worker_id, sizeof(f->worker_id), "%s", w->info.worker_id);
            if (uv_queue_work(rt->loop, &f->work, epd_router_drain_fwd_work,
                              epd_router_drain_fwd_done) == 0) {
                rt->drains_in_flight++;
            } else {
                epd_free(f);
            }
        }
    }
    resp.ok = 1;
    rc = epd_proto_answer(&resp.base, resp_p, resp_len_p, err, err_cap);
    return rc;
}

/* ------------------------------------------------------------- Status */

static int epd_router_status(epd_router_t *rt, void **resp_p, size_t *resp_len_p, char *err,
                             size_t err_cap)
{
    Epd__StatusResponse s = EPD__STATUS_RESPONSE__INIT;
    uint64_t now = epd_time_now_ns();
    size_t n = 0, i = 0;
    int rc;
    struct parts {
        Epd__WorkerStatus ws;
        Epd__WorkerIdentity ident;
        Epd__Epoch epoch;
        Epd__Load load;
        Epd__Capacity cap;
        char link[256];
    } * p;
    Epd__WorkerStatus **list;

    for (epd_router_worker_t *w = rt->reg.workers; w != NULL; w = w->next) {
        n++;
    }
    p = epd_calloc(n > 0 ? n : 1, sizeof(*p));
    list = epd_calloc(n > 0 ? n : 1, sizeof(*list));
    if (p == NULL || list == NULL) {
        epd_free(p);
        epd_free(list);
        snprintf(err, err_cap, "out of memory");
        return EPD_RPC_INTERNAL;
    }
    /* oldest first: the list is newest first */
    i = n;
    for (epd_router_worker_t *w = rt->reg.workers; w != NULL; w = w->next) {
        struct parts *q = &p[--i];

        epd__worker_status__init(&q->ws);
        epd__worker_identity__init(&q->ident);
        epd__epoch__init(&q->epoch);
        epd__load__init(&q->load);
        epd__capacity__init(&q->cap);
        q->epoch.start_time_ns = w->info.epoch_start_ns;
        q->epoch.nonce = w->info.epoch_nonce;
        q->ident.worker_id = w->info.worker_id;
        q->ident.role = w->info.role;
        q->ident.model = w->info.model;
        q->ident.epoch = &q->epoch;
        q->load.queue_depth = w->hb_queue_depth;
        q->load.queued_tokens = w->hb_queued_tokens;
        q->load.router_queued_tokens = w->hb_router_queued_tokens;
        q->load.kv_blocks_free = w->hb_kv_blocks_free;
        q->load.state_slots_free = w->hb_state_slots_free;
        q->load.running_requests = w->hb_running;
        q->load.links_shm = w->hb_links[0];
        q->load.links_tcp = w->hb_links[1];
        q->load.links_rdma = w->hb_links[2];
        q->load.links_other = w->hb_links[3];
        q->load.quarantined = w->hb_quarantined;
        q->load.late_writes_refused = w->hb_late_writes_refused;
        q->load.grants_held = w->hb_grants_held;
        q->cap.kv_blocks_total = w->info.kv_blocks_total;
        q->cap.block_tokens = w->info.block_tokens;
        q->cap.state_slots_total = w->info.state_slots_total;
        q->cap.max_batch = w->info.max_batch;
        q->cap.max_context = w->info.max_context;
        q->ws.worker = &q->ident;
        q->ws.state = (Epd__WorkerState)w->state;
        q->ws.load = &q->load;
        q->ws.capacity = &q->cap;
        q->ws.last_heartbeat_age_ms = (now - w->last_hb_ns) / 1000000ull;
        q->ws.control_address = w->control_addr;
        q->ws.data_address = w->data_addr;
        q->ws.kv_dtype_map = w->info.kv_dtype_map;
        if (w->cw != NULL && w->state != EPD_ROUTER_DEAD) {
            epd_client_worker_link(w->cw, q->link, sizeof(q->link));
        } else {
            snprintf(q->link, sizeof(q->link), "down");
        }
        q->ws.link = q->link;
        list[i] = &q->ws;
    }
    s.n_workers = n;
    s.workers = list;
    rc = epd_proto_answer(&s.base, resp_p, resp_len_p, err, err_cap);
    epd_free(list);
    epd_free(p);
    return rc;
}

static int epd_router_rpc_health(epd_router_t *rt, void **resp_p, size_t *resp_len_p, char *err,
                                 size_t err_cap)
{
    Epd__HealthResponse h = EPD__HEALTH_RESPONSE__INIT;
    Epd__WorkerIdentity ident = EPD__WORKER_IDENTITY__INIT;
    Epd__Epoch epoch = EPD__EPOCH__INIT;

    epoch.start_time_ns = rt->epoch.start_time_ns;
    epoch.nonce = rt->epoch.nonce;
    ident.worker_id = (char *)epd_daemon_worker_id(rt->d);
    ident.role = EPD__ROLE__ROLE_ROUTER;
    ident.model = rt->model_name;
    ident.epoch = &epoch;
    h.serving = !rt->stopping;
    h.worker = &ident;
    h.transport = "";
    return epd_proto_answer(&h.base, resp_p, resp_len_p, err, err_cap);
}

int epd__router_on_rpc(void *arg, const char *method, const void *req, size_t req_len,
                       void **resp_p, size_t *resp_len_p, char *err, size_t err_cap)
{
    epd_router_t *rt = arg;

    if (strcmp(method, EPD_RPC_REGISTER) == 0) {
        return epd_router_register(rt, req, req_len, resp_p, resp_len_p, err, err_cap);
    }
    if (strcmp(method, EPD_RPC_HEARTBEAT) == 0) {
        return epd_router_heartbeat(rt, req, req_len, resp_p, resp_len_p, err, err_cap);
    }
    if (strcmp(method, EPD_RPC_DRAIN) == 0) {
        return epd_router_drain(rt, req, req_len, resp_p, resp_len_p, err, err_cap);
    }
    if (strcmp(method, EPD_RPC_STATUS) == 0) {
        return epd_router_status(rt, resp_p, resp_len_p, err, err_cap);
    }
    if (strcmp(method, EPD_RPC_HEALTH) == 0) {
        return epd_router_rpc_health(rt, resp_p, resp_len_p, err, err_cap);
    }
    snprintf(err, err_cap, "unknown method %s", method);
    return EPD_RPC_UNIMPLEMENTED;
}
