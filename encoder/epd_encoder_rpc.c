/*
 * epd_encoder_rpc.c — the encoder's control plane (proto/epd_control.proto):
 * Health, Status, Drain; RegisterWorker and Heartbeat belong to the router
 * and are answered UNIMPLEMENTED.  Handlers run on the loop thread (see
 * epd_rpc.h), so they read the daemon's state without locks; the queue
 * depth comes from the compute thread's counter.
 *
 * What an encoder reports: role ENCODER; Capacity.embed_slots (--slots,
 * images in flight at once), image_embeddings and embed_dim (the engine's);
 * Load.queue_depth = images waiting for the compute thread,
 * running_requests = images admitted and not waiting (being encoded, or
 * waiting for their reservation or write), draining.  The model's KV layout
 * goes along too: an encoder computes no KV, but the layout is how the
 * router tells that every worker runs the same model.
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_encoder_int.h"
#include "epd_layout.h"
#include "epd_log.h"

/* Storage for the nested messages of one answer (caller's stack). */
typedef struct {
    Epd__WorkerIdentity ident;
    Epd__Epoch epoch;
    Epd__Load load;
    Epd__Capacity cap;
    Epd__KvLayout layout;
    char pattern[EPD_LAYOUT_PATTERN_MAX];
} epd_encoder_rpc_parts_t;

static void epd_encoder_load_now(epd_encoder_srv_t *srv, uint32_t *queued_p, uint32_t *running_p)
{
    uint32_t queued = srv->compute != NULL ? epd_encoder_compute_backlog(srv->compute) : 0;

    if (queued > srv->n_live) {
        queued = srv->n_live;
    }
    *queued_p = queued;
    *running_p = srv->n_live - queued;
}

static void epd_encoder_rpc_fill(epd_encoder_srv_t *srv, epd_encoder_rpc_parts_t *p)
{
    uint32_t queued, running;

    epd__worker_identity__init(&p->ident);
    epd__epoch__init(&p->epoch);
    epd__load__init(&p->load);
    epd__capacity__init(&p->cap);
    p->epoch.start_time_ns = srv->epoch.start_time_ns;
    p->epoch.nonce = srv->epoch.nonce;
    p->ident.worker_id = srv->worker_id;
    p->ident.role = EPD__ROLE__ROLE_ENCODER;
    p->ident.model = srv->model_name;
    p->ident.epoch = &p->epoch;
    epd_encoder_load_now(srv, &queued, &running);
    p->load.queue_depth = queued;
    p->load.running_requests = running;
    p->load.draining = srv->draining != 0;
    p->cap.embed_slots = srv->slots;
    p->cap.image_embeddings = srv->info->image_embeddings;
    p->cap.embed_dim = srv->info->embed_dim;
    p->cap.max_batch = 1; /* one image at a time on the compute thread */
    p->cap.max_context = srv->info->max_context;
    epd_layout_to_msg(&srv->info->kv, &p->layout, p->pattern);
}

/* Packs `msg` into a buffer from epd_malloc (taken by the server). */
static int epd_encoder_rpc_pack(const ProtobufCMessage *msg, void **resp_p, size_t *resp_len_p,
                                char *err, size_t err_cap)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    void *buf = epd_malloc(n > 0 ? n : 1);

    if (buf == NULL) {
        snprintf(err, err_cap, "out of memory");
        return EPD_RPC_INTERNAL;
    }
    protobuf_c_message_pack(msg, buf);
    *resp_p = buf;
    *resp_len_p = n;
    return EPD_RPC_OK;
}

static void epd_encoder_drain(epd_encoder_srv_t *srv, const char *who)
{
    if (!srv->draining) {
        epd_log_info(EPD_ENCODER_LOG, 0,
                     "draining (%s): new EncodeRequests are refused, %u images in flight finish",
                     who, srv->n_live);
    }
    srv->draining = 1;
}

int epd__encoder_on_rpc(void *arg, const char *method, const void *req, size_t req_len,
                        void **resp_p, size_t *resp_len_p, char *err, size_t err_cap)
{
    epd_encoder_srv_t *srv = arg;
    epd_encoder_rpc_parts_t p;

    if (strcmp(method, EPD_RPC_HEALTH) == 0) {
        Epd__HealthResponse h = EPD__HEALTH_RESPONSE__INIT;

        epd_encoder_rpc_fill(srv, &p);
        h.serving = !srv->draining && !srv->stopping;
        h.worker = &p.ident;
        h.load = &p.load;
        h.transport = (char *)srv->transport;
        h.data_plane_address.data = (uint8_t *)srv->addr;
        h.data_plane_address.len = srv->addr_len;
        h.kv_layout = &p.layout;
        h.capacity = &p.cap;
        h.draining = srv->draining != 0;
        return epd_encoder_rpc_pack(&h.base, resp_p, resp_len_p, err, err_cap);
    }
    if (strcmp(method, EPD_RPC_STATUS) == 0) {
        Epd__StatusResponse s = EPD__STATUS_RESPONSE__INIT;
        Epd__WorkerStatus w = EPD__WORKER_STATUS__INIT;
        Epd__WorkerStatus *ws[1] = {&w};

        epd_encoder_rpc_fill(srv, &p);
        w.worker = &p.ident;
        w.state = srv->draining ? EPD__WORKER_STATE__WORKER_STATE_DRAINING
                                : EPD__WORKER_STATE__WORKER_STATE_READY;
        w.load = &p.load;
        w.capacity = &p.cap;
        w.last_heartbeat_age_ms = 0;
        s.n_workers = 1;
        s.workers = ws;
        return epd_encoder_rpc_pack(&s.base, resp_p, resp_len_p, err, err_cap);
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
        epd_encoder_drain(srv, "Drain RPC");
        d.ok = 1;
        return epd_encoder_rpc_pack(&d.base, resp_p, resp_len_p, err, err_cap);
    }
    if (strcmp(method, EPD_RPC_REGISTER) == 0 || strcmp(method, EPD_RPC_HEARTBEAT) == 0) {
        snprintf(err, err_cap, "%s is the router's, not an encoder worker's", method);
        return EPD_RPC_UNIMPLEMENTED;
    }
    snprintf(err, err_cap, "unknown method %s", method);
    return EPD_RPC_UNIMPLEMENTED;
}

/* ---- registration with the router (--router) ---- */

epd_status_t epd__encoder_register_pack(epd_encoder_srv_t *srv, const char *control_address,
                                        void **buf_p, size_t *len_p)
{
    Epd__RegisterRequest r = EPD__REGISTER_REQUEST__INIT;
    epd_encoder_rpc_parts_t p;
    size_t n;
    void *buf;

    epd_encoder_rpc_fill(srv, &p);
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

void epd__encoder_registrar_load(void *arg, epd_registrar_load_t *load_p)
{
    epd_encoder_srv_t *srv = arg;
    uint32_t queued, running;

    epd_encoder_load_now(srv, &queued, &running);
    memset(load_p, 0, sizeof(*load_p));
    load_p->queue_depth = queued;
    load_p->running_requests = running;
    load_p->draining = srv->draining;
}

void epd__encoder_registrar_drain(void *arg)
{
    epd_encoder_drain(arg, "asked by the router");
}
