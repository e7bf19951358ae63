/*
 * epd_rpc_client.c — the control plane's blocking gRPC client: a channel
 * per target, unary calls with a deadline, each signed (x-epd-auth,
 * epd_rpc_auth.c) when the client holds the cluster secret.  For tools
 * (epd-ctl) and for daemon threads that are not a loop thread.
 */
#include "epd_rpc.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_rpc_int.h"

struct epd_rpc_client {
    grpc_channel *channel;
    grpc_completion_queue *cq;
    epd_rpc_auth_t *auth; /* NULL: calls are not signed */
};

epd_status_t epd_rpc_client_create(const char *target, epd_rpc_client_t **client_p)
{
    epd_rpc_client_t *c = epd_calloc(1, sizeof(*c));
    grpc_channel_credentials *creds;

    if (c == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    grpc_init();
    creds = grpc_insecure_credentials_create();
    c->channel = grpc_channel_create(target, creds, NULL);
    grpc_channel_credentials_release(creds);
    c->cq = grpc_completion_queue_create_for_pluck(NULL);
    if (c->channel == NULL || c->cq == NULL) {
        epd_rpc_client_destroy(c);
        return EPD_ERR_FATAL;
    }
    *client_p = c;
    return EPD_OK;
}

void epd_rpc_client_destroy(epd_rpc_client_t *c)
{
    if (c == NULL) {
        return;
    }
    if (c->channel != NULL) {
        grpc_channel_destroy(c->channel);
    }
    if (c->cq != NULL) {
        grpc_completion_queue_shutdown(c->cq);
        while (grpc_completion_queue_pluck(c->cq, NULL, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL)
                   .type != GRPC_QUEUE_SHUTDOWN) {
        }
        grpc_completion_queue_destroy(c->cq);
    }
    grpc_shutdown();
    epd_rpc_auth_destroy(c->auth);
    epd_free(c);
}

epd_status_t epd_rpc_client_set_auth(epd_rpc_client_t *c, const void *secret, size_t len)
{
    epd_rpc_auth_t *auth = NULL;

    if (secret != NULL || len != 0) {
        /* signing only: a client keeps no replay cache */
        epd_status_t st = epd_rpc_auth_create(secret, len, 0, &auth);

        if (st != EPD_OK) {
            return st;
        }
    }
    epd_rpc_auth_destroy(c->auth);
    c->auth = auth;
    return EPD_OK;
}

static epd_status_t epd_rpc_map_status(grpc_status_code code)
{
    switch (code) {
    case GRPC_STATUS_OK:
        return EPD_OK;
    case GRPC_STATUS_DEADLINE_EXCEEDED:
        return EPD_ERR_TIMEOUT;
    case GRPC_STATUS_UNAVAILABLE:
        return EPD_ERR_UNREACHABLE;
    case GRPC_STATUS_INVALID_ARGUMENT:
        return EPD_ERR_INVALID_PARAM;
    case GRPC_STATUS_NOT_FOUND:
        return EPD_ERR_NOT_FOUND;
    case GRPC_STATUS_FAILED_PRECONDITION:
        return EPD_ERR_DRAINING;
    case GRPC_STATUS_UNIMPLEMENTED:
        return EPD_ERR_UNSUPPORTED;
    case GRPC_STATUS_UNAUTHENTICATED:
    case GRPC_STATUS_PERMISSION_DENIED:
        return EPD_ERR_AUTH;
    default:
        return EPD_ERR_TRANSPORT;
    }
}

epd_status_t epd_rpc_call(epd_rpc_client_t *client, const char *method, const void *req,
                          size_t req_len, int timeout_ms, void **resp_p, size_t *resp_len_p,
                          char *err, size_t err_cap)
{
    char value[EPD_RPC_AUTH_VALUE_MAX];

    if (client->auth == NULL) {
        return epd_rpc_call_with_auth(client, method, req, req_len, NULL, timeout_ms, resp_p,
                                      resp_len_p, err, err_cap);
    }
    (void)epd_rpc_auth_sign(client->auth, method, req, req_len, epd__rpc_now_ms(), value,
                            sizeof(value));
    return epd_rpc_call_with_auth(client, method, req, req_len, value, timeout_ms, resp_p,
                                  resp_len_p, err, err_cap);
}

epd_status_t epd_rpc_call_with_auth(epd_rpc_client_t *client, const char *method, const void *req,
                                    size_t req_len, const char *auth_value, int timeout_ms,
                                    void **resp_p, size_t *resp_len_p, char *err, size_t err_cap)
{
    gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                         gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
    grpc_slice method_slice = grpc_slice_from_copied_string(method);
    grpc_slice req_slice = grpc_slice_from_copied_buffer(req != NULL ? req : "", req_len);
    grpc_byte_buffer *request = grpc_raw_byte_buffer_create(&req_slice, 1);
    grpc_byte_buffer *response = NULL;
    grpc_metadata_array initial_md;
    grpc_metadata_array trailing_md;
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_call *call;
    grpc_op ops[6];
    grpc_metadata md;
    grpc_event ev;
    grpc_call_error ce;
    epd_status_t status;
    void *buf = NULL;
    size_t len = 0;

    grpc_slice_unref(req_slice);
    grpc_metadata_array_init(&initial_md);
    grpc_metadata_array_init(&trailing_md);
    call = grpc_channel_create_call(client->channel, NULL, GRPC_PROPAGATE_DEFAULTS, client->cq,
                                    method_slice, NULL, deadline, NULL);
    grpc_slice_unref(method_slice);
    memset(ops, 0, sizeof(ops));
    memset(&md, 0, sizeof(md));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (auth_value != NULL) {
        md.key = grpc_slice_from_static_string(EPD_RPC_AUTH_KEY);
        md.value = grpc_slice_from_copied_string(auth_value);
        ops[0].data.send_initial_metadata.count = 1;
        ops[0].data.send_initial_metadata.metadata = &md;
    }
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = request;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &response;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trailing_md;
    ops[5].data.recv_status_on_client.status = &code;
    ops[5].data.recv_status_on_client.status_details = &details;
    ce = grpc_call_start_batch(call, ops, 6, call, NULL);
    if (ce != GRPC_CALL_OK) {
        status = ce == GRPC_CALL_ERROR_INVALID_METADATA ? EPD_ERR_INVALID_PARAM : EPD_ERR_TRANSPORT;
        goto out_call;
    }
    /* The call carries the deadline; the extra second only guards against a
     * library that never reports it. */
    ev = grpc_completion_queue_pluck(client->cq, call,
                                     gpr_time_add(deadline, gpr_time_from_millis(1000, GPR_TIMESPAN)),
                                     NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
        grpc_call_cancel(call, NULL);
        grpc_completion_queue_pluck(client->cq, call, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        code = GRPC_STATUS_DEADLINE_EXCEEDED;
    }
    status = epd_rpc_map_status(code);
    if (err != NULL && err_cap > 0) {
        size_t n = GRPC_SLICE_LENGTH(details);

        if (n >= err_cap) {
            n = err_cap - 1;
        }
        memcpy(err, GRPC_SLICE_START_PTR(details), n);
        err[n] = '\0';
    }
    if (status == EPD_OK) {
        if (response == NULL) {
            status = EPD_ERR_MALFORMED;
        } else {
            status = epd__rpc_read_buffer(response, &buf, &len);
        }
    }

out_call:
    grpc_call_unref(call);
    if (auth_value != NULL) {
        grpc_slice_unref(md.key);
        grpc_slice_unref(md.value);
    }
    grpc_byte_buffer_destroy(request);
    if (response != NULL) {
        grpc_byte_buffer_destroy(response);
    }
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&initial_md);
    grpc_metadata_array_destroy(&trailing_md);
    if (status == EPD_OK) {
        *resp_p = buf;
        *resp_len_p = len;
    }
    return status;
}
