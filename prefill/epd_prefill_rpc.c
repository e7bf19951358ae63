/*
 * epd_prefill_rpc.c — prefill's control plane (proto/epd_control.proto):
 * Health, Status, Drain; RegisterWorker and Heartbeat belong to the router
 * and are answered UNIMPLEMENTED.  Handlers run on the loop thread (see
 * epd_rpc.h), so they read the daemon's state without locks; the backlog
 * figures come from the compute thread's atomics.
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_layout.h"
#include "epd_log.h"
#include "epd_prefill_int.h"

/* Storage for the nested messages of one answer (caller's stack). */
typedef struct {
    Epd__WorkerIdentity ident;
    Epd__Epoch epoch;
    Epd__Load load;
    Epd__Capacity cap;
    Epd__KvLayout layout;
    char pattern[EPD_LAYOUT_PATTERN_MAX];
} epd_prefill_rpc_parts_t;

static void epd_prefill_rpc_fill(epd_prefill_srv_t *srv, epd_prefill_rpc_parts_t *p)
{
    uint32_t jobs;
    uint64_t tokens;

    epd__worker_identity__init(&p->ident);
    epd__epoch__init(&p->epoch);
    epd__load__init(&p->load);
    epd__capacity__init(&p->cap);
    p->epoch.start_time_ns = srv->epoch.start_time_ns;
    p->epoch.nonce = srv->epoch.nonce;
    p->ident.worker_id = srv->worker_id;
    p->ident.role = EPD__ROLE__ROLE_PREFILL;
    p->ident.model = srv->model_name;
    p->ident.epoch = &p->epoch;
    epd_prefill_compute_backlog(srv->compute, &jobs, &tokens);
    p->load.queue_depth = jobs;
    p->load.queued_tokens = tokens;
    p->load.kv_blocks_free = srv->n_free_blocks;
    p->load.state_slots_free = srv->n_free_slots;
    p->load.running_requests = srv->n_live;
    p->load.kv_bytes_sent = srv->kv_bytes_sent;
    p->load.draining = srv->draining != 0;
    p->cap.kv_blocks_total = srv->kv_blocks;
    p->cap.block_tokens = srv->info->kv.block_tokens;
    p->cap.state_slots_total = srv->state_slots;
    p->cap.max_batch = 1; /* one prefill at a time */
    p->cap.max_context = srv->info->max_context;
    p->cap.embed_slots = srv->embed_slots;
    p->cap.image_embeddings = srv->embed_slots > 0 ? srv->info->image_embeddings : 0;
    p->cap.embed_dim = srv->embed_slots > 0 ? srv->info->embed_dim : 0;
    epd_layout_to_msg(&srv->info->kv, &p->layout, p->pattern);
}

/* Packs `msg` into a buffer from epd_malloc (taken by the server). */
static int epd_prefill_rpc_pack(const ProtobufCMessage *msg, void **resp_p, size_t *resp_len_p,
                                char *err, size_t err_cap)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    void *buf = epd_malloc(n);

    if (buf == NULL) {
        snprintf(err, err_cap, "out of memory");
        return EPD_RPC_INTERNAL;
    }
    protobuf_c_message_pack(msg, buf);
    *resp_p = buf;
    *resp_len_p = n;
    return EPD_RPC_OK;
}

int epd__prefill_on_rpc(void *arg, const char *method, const void *req, size_t req_len,
                        void **resp_p, size_t *resp_len_p, char *err, size_t err_cap)
{
    epd_prefill_srv_t *srv = arg;
    epd_prefill_rpc_parts_t p;

    if (strcmp(method, EPD_RPC_HEALTH) == 0) {
        Epd__HealthResponse h = EPD__HEALTH_RESPONSE__INIT;

        epd_prefill_rpc_fill(srv, &p);
        h.serving = !srv->draining && !srv->stopping;
        h.worker = &p.ident;
        h.load = &p.load;
        h.transport = (char *)srv->transport;
        h.data_plane_address.data = (uint8_t *)srv->addr;
        h.data_plane_address.len = srv->addr_len;
        h.kv_layout = &p.layout;
        h.capacity = &p.cap;
        h.draining = srv->draining != 0;
        return epd_prefill_rpc_pack(&h.base, resp_p, resp_len_p, err, err_cap);
    }
    if (strcmp(method, EPD_RPC_STATUS) == 0) {
        Epd__StatusResponse s = EPD__STATUS_RESPONSE__INIT;
        Epd__WorkerStatus w = EPD__WORKER_STATUS__INIT;
        Epd__WorkerStatus *ws[1] = {&w};

        epd_prefill_rpc_fill(srv, &p);
        w.worker = &p.ident;
        w.state = srv->draining ? EPD__WORKER_STATE__WORKER_STATE_DRAINING
                                : EPD__WORKER_STATE__WORKER_STATE_READY;
        w.load = &p.load;
        w.capacity = &p.cap;
        w.last_heartbeat_age_ms = 0;
        s.n_workers = 1;
        s.workers = ws;
        return epd_prefill_rpc_pack(&s.base, resp_p, resp_len_p, err, err_cap);
    }
    if (strcmp(method, EPD_RPC_DRAIN) == 0) {
        Epd__DrainResponse d = EPD__DRAIN_RESPONSE__INIT;
        ProtobufCMessage *m = NULL;
        Epd__DrainRequest *dr;

        if (epd_proto_unpack(&epd__drain_request__descriptor, req, req_len, &m) != EPD_OK) {
            snprintf(err, err_cap, "malformed DrainRequest");
            return EPD_RPC_INVALID_ARGUMENT;
        }
        dr = (Epd__DrainRequest *)m;
        if (dr->worker_id == NULL || strcmp(dr->worker_id, srv->worker_id) != 0) {
            snprintf(err, err_cap, "no worker '%.100s' here (this is '%.100s')",
                     dr->worker_id != NULL ? dr->worker_id : "", srv->worker_id);
            epd_proto_free(m);
            return EPD_RPC_NOT_FOUND;
        }
        epd_proto_free(m);
        if (!srv->draining) {
            epd_log_info(EPD_PREFILL_LOG, 0,
                         "draining: new requests are refused, %u running finish", srv->n_live);
        }
        srv->draining = 1;
        d.ok = 1;
        return epd_prefill_rpc_pack(&d.base, resp_p, resp_len_p, err, err_cap);
    }
    if (strcmp(method, EPD_RPC_REGISTER) == 0 || strcmp(method, EPD_RPC_HEARTBEAT) == 0) {
        snprintf(err, err_cap, "%s is the router's, not a prefill worker's", method);
        return EPD_RPC_UNIMPLEMENTED;
    }
    snprintf(err, err_cap, "unknown method %s", method);
    return EPD_RPC_UNIMPLEMENTED;
}

/* ---- registration with the router (--router) ---- */

epd_status_t epd__prefill_register_pack(epd_prefill_srv_t *srv, const char *control_address,
                                        void **buf_p, size_t *len_p)
{
    Epd__RegisterRequest r = EPD__REGISTER_REQUEST__INIT;
    epd_prefill_rpc_parts_t p;
    size_t n;
    void *buf;

    epd_prefill_rpc_fill(srv, &p);
    r.worker = &p.ident;
    r.transport = (char *)srv->transport;
    r.data_plane_address.data = (uint8_t *)srv->addr;
    r.data_plane_address.len = srv->addr_len;
    r.control_address = (char *)control_address;
    r.capacity = &p.cap;
    r.kv_layout = &p.layout;
    n = protobuf_c_message_get_packed_size(&r.base);
    buf = epd_malloc(n);
    if (buf == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    protobuf_c_message_pack(&r.base, buf);
    *buf_p = buf;
    *len_p = n;
    return EPD_OK;
}

void epd__prefill_registrar_load(void *arg, epd_registrar_load_t *load_p)
{
    epd_prefill_srv_t *srv = arg;
    uint32_t jobs = 0;
    uint64_t tokens = 0;

    if (srv->compute != NULL) {
        epd_prefill_compute_backlog(srv->compute, &jobs, &tokens);
    }
    load_p->queue_depth = jobs;
    load_p->queued_tokens = tokens;
    load_p->kv_blocks_free = srv->n_free_blocks;
    load_p->state_slots_free = srv->n_free_slots;
    load_p->running_requests = srv->n_live;
    load_p->kv_bytes_sent = srv->kv_bytes_sent;
    load_p->draining = srv->draining;
}

void epd__prefill_registrar_drain(void *arg)
{
    epd_prefill_srv_t *srv = arg;

    if (!srv->draining) {
        epd_log_info(EPD_PREFILL_LOG, 0,
                     "draining (asked by the router): new requests are refused, %u running finish",
                     srv->n_live);
    }
    srv->draining = 1;
}
