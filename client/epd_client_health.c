/*
 * epd_client_health.c — what a worker says about itself: the blocking
 * Health call on its control address and the parsing of the answer into
 * an epd_client_worker_info_t (see epd_client.h).
 *
 * Kept apart from the request path because it is of another kind: pure
 * parsing plus one blocking gRPC call that tools and tests make off any
 * loop, while everything in epd_client_req.c runs on the owner thread and
 * never blocks.  It calls nothing else of the client.
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_client_int.h"
#include "epd_rpc.h"

static epd_status_t epd_client_health_refuse(const char **why_p, const char *why)
{
    if (why_p != NULL) {
        *why_p = why;
    }
    return EPD_ERR_MALFORMED;
}

epd_status_t epd_client_health_parse(const void *buf, size_t len, epd_client_worker_info_t *info_p,
                                     const char **why_p)
{
    static const unsigned char empty = 0;
    ProtobufCMessage *msg = NULL;
    Epd__HealthResponse *h;
    epd_client_worker_info_t *info;
    epd_status_t status;

    status = epd_proto_unpack(&epd__health_response__descriptor, len > 0 ? buf : &empty, len, &msg);
    if (status != EPD_OK) {
        return epd_client_health_refuse(why_p, "Health answer does not decode");
    }
    h = (Epd__HealthResponse *)msg;
    if (h->worker == NULL || h->worker->epoch == NULL) {
        status = epd_client_health_refuse(why_p, "Health answer without worker identity or epoch");
        goto out;
    }
    if (h->worker->worker_id == NULL || h->worker->worker_id[0] == '\0' ||
        strlen(h->worker->worker_id) >= EPD_CLIENT_NAME_MAX) {
        status =
            epd_client_health_refuse(why_p, "Health answer with an empty or oversized worker id");
        goto out;
    }
    if (h->worker->role != EPD__ROLE__ROLE_PREFILL && h->worker->role != EPD__ROLE__ROLE_DECODE &&
        h->worker->role != EPD__ROLE__ROLE_ENCODER) {
        status = epd_client_health_refuse(
            why_p, "Health answer with a role other than prefill/decode/encoder");
        goto out;
    }
    if (h->data_plane_address.len == 0 || h->data_plane_address.len > EPD_XPORT_ADDR_MAX) {
        status =
            epd_client_health_refuse(why_p, "Health answer with an empty or oversized address");
        goto out;
    }
    if ((h->kv_layout == NULL && h->worker->role != EPD__ROLE__ROLE_ENCODER) ||
        h->capacity == NULL) {
        status = epd_client_health_refuse(why_p, "Health answer without KV layout or capacity");
        goto out;
    }
    if (h->kv_layout != NULL && h->kv_layout->layer_pattern != NULL &&
        strlen(h->kv_layout->layer_pattern) >= EPD_CLIENT_PATTERN_MAX) {
        status = epd_client_health_refuse(why_p, "Health answer with an oversized layer pattern");
        goto out;
    }
    info = epd_calloc(1, sizeof(*info));
    if (info == NULL) {
        status = EPD_ERR_NO_MEMORY;
        goto out;
    }
    epd__client_copy_str(info->worker_id, sizeof(info->worker_id), h->worker->worker_id);
    info->role = h->worker->role;
    epd__client_copy_str(info->model, sizeof(info->model), h->worker->model);
    info->epoch_start_ns = h->worker->epoch->start_time_ns;
    info->epoch_nonce = h->worker->epoch->nonce;
    epd__client_copy_str(info->transport, sizeof(info->transport), h->transport);
    memcpy(info->address, h->data_plane_address.data, h->data_plane_address.len);
    info->address_len = h->data_plane_address.len;
    info->serving = h->serving;
    info->draining = h->draining;
    if (h->kv_layout != NULL) {
        info->n_layers = h->kv_layout->n_layers;
        epd__client_copy_str(info->layer_pattern, sizeof(info->layer_pattern),
                             h->kv_layout->layer_pattern);
        info->block_tokens = h->kv_layout->block_tokens;
        info->n_kv_heads = h->kv_layout->n_kv_heads;
        info->head_dim = h->kv_layout->head_dim;
        info->kv_dtype = h->kv_layout->dtype;
        epd__client_copy_str(info->kv_dtype_map, sizeof(info->kv_dtype_map),
                             h->kv_layout->kv_dtype_map != NULL ? h->kv_layout->kv_dtype_map : "");
        info->block_bytes = h->kv_layout->block_bytes;
        info->state_bytes = h->kv_layout->state_bytes;
    }
    info->kv_blocks_total = h->capacity->kv_blocks_total;
    info->state_slots_total = h->capacity->state_slots_total;
    info->max_batch = h->capacity->max_batch;
    info->max_context = h->capacity->max_context;
    info->embed_slots = h->capacity->embed_slots;
    info->image_embeddings = h->capacity->image_embeddings;
    info->embed_dim = h->capacity->embed_dim;
    info->kv_headroom_tokens = h->capacity->kv_headroom_tokens;
    if (h->load != NULL) {
        info->queue_depth = h->load->queue_depth;
        info->queued_tokens = h->load->queued_tokens;
        info->router_queued_tokens = h->load->router_queued_tokens;
        info->kv_blocks_free = h->load->kv_blocks_free;
        info->state_slots_free = h->load->state_slots_free;
        info->running_requests = h->load->running_requests;
    }
    memcpy(info_p, info, sizeof(*info));
    epd_free(info);
    status = EPD_OK;
out:
    epd_proto_free(msg);
    return status;
}

epd_status_t epd_client_health(const char *control_addr, int timeout_ms,
                               epd_client_worker_info_t *info_p, char *err, size_t err_cap)
{
    epd_rpc_client_t *rpc = NULL;
    void *resp = NULL;
    size_t resp_len = 0;
    const char *why = NULL;
    char rpc_err[256] = "";
    epd_status_t status;

    status = epd_rpc_client_create(control_addr, &rpc);
    if (status != EPD_OK) {
        if (err != NULL) {
            snprintf(err, err_cap, "cannot open a gRPC channel to %s: %s", control_addr,
                     epd_status_string(status));
        }
        return status;
    }
    status = epd_rpc_call(rpc, EPD_RPC_HEALTH, NULL, 0, timeout_ms, &resp, &resp_len, rpc_err,
                          sizeof(rpc_err));
    if (status != EPD_OK) {
        if (err != NULL) {
            snprintf(err, err_cap, "Health %s: %s%s%s", control_addr, epd_status_string(status),
                     rpc_err[0] ? ": " : "", rpc_err);
        }
        goto out;
    }
    status = epd_client_health_parse(resp, resp_len, info_p, &why);
    if (status != EPD_OK && err != NULL) {
        snprintf(err, err_cap, "Health %s: %s", control_addr,
                 why != NULL ? why : epd_status_string(status));
    }
out:
    epd_free(resp);
    epd_rpc_client_destroy(rpc);
    return status;
}
