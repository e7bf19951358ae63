/*
 * epd_rpc.c — unary gRPC server and client over the gRPC core C API.
 *
 * Server call life (tag = the call struct, state says which batch ended):
 *   REQUESTED  grpc_server_request_call finished: a client called.  Post a
 *              replacement request, then a batch {send initial metadata,
 *              receive message}.
 *   RECEIVED   the request bytes are here: copy them out and hand the call
 *              to the loop thread (SPSC queue + uv_async_send).  The loop
 *              runs the handler and starts the batch {receive close, send
 *              message, send status}.
 *   SENT       the answer left: free the call.
 * Only the completion-queue thread frees calls, except calls still queued
 * for the loop at shutdown, which the loop frees after joining the thread.
 */
#include "epd_rpc.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_queue.h"

#define EPD_RPC_PENDING_REQUESTS 8
#define EPD_RPC_QUEUE_DEPTH 256
#define EPD_RPC_MAX_MESSAGE (16u << 20)

typedef enum {
    EPD_RPC_CALL_REQUESTED,
    EPD_RPC_CALL_RECEIVED,
    EPD_RPC_CALL_SENT,
} epd_rpc_call_state_t;

typedef struct epd__rpc_call {
    epd_rpc_call_state_t state;
    epd_rpc_server_t *server;
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array request_md;
    grpc_byte_buffer *request;
    grpc_byte_buffer *response;
    grpc_slice status_details;
    int status_details_set;
    int cancelled;
    void *req_buf; /* [req_len] bytes, epd_malloc */
    size_t req_len;
    char method[128];
} epd__rpc_call_t;

struct epd_rpc_server {
    uv_loop_t *loop;
    uv_async_t async;
    grpc_server *server;
    grpc_completion_queue *cq;
    pthread_t thread;
    int thread_started;
    epd_spsc_queue_t to_loop; /* epd__rpc_call_t*, cq thread -> loop */
    int port;
    epd_rpc_handler_cb_t handler;
    void *arg;
    atomic_int shutting_down;
    int shutdown_tag;
};

struct epd_rpc_client {
    grpc_channel *channel;
    grpc_completion_queue *cq;
};

static void epd_rpc_call_free(epd__rpc_call_t *c)
{
    if (c->call != NULL) {
        grpc_call_unref(c->call);
    }
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->request_md);
    if (c->request != NULL) {
        grpc_byte_buffer_destroy(c->request);
    }
    if (c->response != NULL) {
        grpc_byte_buffer_destroy(c->response);
    }
    if (c->status_details_set) {
        grpc_slice_unref(c->status_details);
    }
    epd_free(c->req_buf);
    epd_free(c);
}

/* Posts one grpc_server_request_call; the cq thread and create use it. */
static epd_status_t epd_rpc_request_one(epd_rpc_server_t *s)
{
    epd__rpc_call_t *c = epd_calloc(1, sizeof(*c));
    grpc_call_error err;

    if (c == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    c->server = s;
    c->state = EPD_RPC_CALL_REQUESTED;
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->request_md);
    err = grpc_server_request_call(s->server, &c->call, &c->details, &c->request_md, s->cq,
                                   s->cq, c);
    if (err != GRPC_CALL_OK) {
        epd_rpc_call_free(c);
        return EPD_ERR_TRANSPORT;
    }
    return EPD_OK;
}

/* Copies the bytes of a received message into an epd_malloc buffer. */
static epd_status_t epd_rpc_read_buffer(grpc_byte_buffer *bb, void **buf_p, size_t *len_p)
{
    grpc_byte_buffer_reader reader;
    grpc_slice all;
    size_t len;
    void *buf = NULL;

    if (!grpc_byte_buffer_reader_init(&reader, bb)) {
        return EPD_ERR_MALFORMED;
    }
    all = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    len = GRPC_SLICE_LENGTH(all);
    if (len > EPD_RPC_MAX_MESSAGE) {
        grpc_slice_unref(all);
        return EPD_ERR_TOO_LONG;
    }
    if (len > 0) {
        buf = epd_malloc(len);
        if (buf == NULL) {
            grpc_slice_unref(all);
            return EPD_ERR_NO_MEMORY;
        }
        memcpy(buf, GRPC_SLICE_START_PTR(all), len);
    }
    grpc_slice_unref(all);
    *buf_p = buf;
    *len_p = len;
    return EPD_OK;
}

/* Starts the final batch of a server call: close, message (if OK), status.
 * Any thread.  On failure the call is freed here. */
static void epd_rpc_send_answer(epd__rpc_call_t *c, int code, const char *msg, void *resp,
                                size_t resp_len)
{
    grpc_op ops[3];
    size_t n = 0;

    memset(ops, 0, sizeof(ops));
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n].data.recv_close_on_server.cancelled = &c->cancelled;
    n++;
    if (code == EPD_RPC_OK) {
        grpc_slice slice = grpc_slice_from_copied_buffer(resp != NULL ? resp : "", resp_len);

        c->response = grpc_raw_byte_buffer_create(&slice, 1);
        grpc_slice_unref(slice);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = c->response;
        n++;
    }
    c->status_details = grpc_slice_from_copied_string(msg != NULL ? msg : "");
    c->status_details_set = 1;
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)code;
    ops[n].data.send_status_from_server.status_details = &c->status_details;
    n++;
    c->state = EPD_RPC_CALL_SENT;
    if (grpc_call_start_batch(c->call, ops, n, c, NULL) != GRPC_CALL_OK) {
        epd_log_error("rpc", 0, "cannot answer %s: grpc_call_start_batch failed", c->method);
        epd_rpc_call_free(c);
    }
}

static void epd_rpc_on_requested(epd_rpc_server_t *s, epd__rpc_call_t *c, int success)
{
    grpc_op ops[2];
    size_t mlen;

    if (!success) {
        epd_rpc_call_free(c); /* the server is shutting down */
        return;
    }
    if (!atomic_load(&s->shutting_down) && epd_rpc_request_one(s) != EPD_OK) {
        epd_log_error("rpc", 0, "cannot post a new request slot; serving with fewer");
    }
    mlen = GRPC_SLICE_LENGTH(c->details.method);
    if (mlen >= sizeof(c->method)) {
        mlen = sizeof(c->method) - 1;
    }
    memcpy(c->method, GRPC_SLICE_START_PTR(c->details.method), mlen);
    c->method[mlen] = '\0';
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_RECV_MESSAGE;
    ops[1].data.recv_message.recv_message = &c->request;
    c->state = EPD_RPC_CALL_RECEIVED;
    if (grpc_call_start_batch(c->call, ops, 2, c, NULL) != GRPC_CALL_OK) {
        epd_rpc_call_free(c);
    }
}

static void epd_rpc_on_received(epd_rpc_server_t *s, epd__rpc_call_t *c, int success)
{
    epd_status_t status;

    if (!success || c->request == NULL) {
        epd_rpc_call_free(c); /* cancelled, or the client sent no message */
        return;
    }
    status = epd_rpc_read_buffer(c->request, &c->req_buf, &c->req_len);
    if (status != EPD_OK) {
        epd_rpc_send_answer(c, EPD_RPC_INVALID_ARGUMENT, epd_status_string(status), NULL, 0);
        return;
    }
    if (epd_spsc_queue_push(&s->to_loop, c) != EPD_OK) {
        epd_rpc_send_answer(c, EPD_RPC_UNAVAILABLE, "control server busy", NULL, 0);
        return;
    }
    uv_async_send(&s->async);
}

static void *epd_rpc_server_thread(void *arg)
{
    epd_rpc_server_t *s = arg;

    for (;;) {
        grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC),
                                                   NULL);
        epd__rpc_call_t *c;

        if (ev.type == GRPC_QUEUE_SHUTDOWN) {
            break;
        }
        if (ev.type != GRPC_OP_COMPLETE) {
            continue;
        }
        if (ev.tag == &s->shutdown_tag) {
            grpc_completion_queue_shutdown(s->cq);
            continue;
        }
        c = ev.tag;
        switch (c->state) {
        case EPD_RPC_CALL_REQUESTED:
            epd_rpc_on_requested(s, c, ev.success);
            break;
        case EPD_RPC_CALL_RECEIVED:
            epd_rpc_on_received(s, c, ev.success);
            break;
        case EPD_RPC_CALL_SENT:
            epd_rpc_call_free(c);
            break;
        }
    }
    return NULL;
}

/* Loop thread: run the handler of every call the cq thread handed over. */
static void epd_rpc_on_async(uv_async_t *handle)
{
    epd_rpc_server_t *s = handle->data;
    epd__rpc_call_t *c;

    while ((c = epd_spsc_queue_pop(&s->to_loop)) != NULL) {
        void *resp = NULL;
        size_t resp_len = 0;
        char err[256] = "";
        int code = s->handler(s->arg, c->method, c->req_buf, c->req_len, &resp, &resp_len, err,
                              sizeof(err));

        if (code != EPD_RPC_OK && err[0] == '\0') {
            snprintf(err, sizeof(err), "%s failed", c->method);
        }
        epd_rpc_send_answer(c, code, code == EPD_RPC_OK ? "" : err, resp, resp_len);
        epd_free(resp);
    }
}

epd_status_t epd_rpc_server_create(uv_loop_t *loop, const char *bind_addr,
                                   epd_rpc_handler_cb_t handler, void *arg,
                                   epd_rpc_server_t **server_p)
{
    epd_rpc_server_t *s;
    grpc_server_credentials *creds;
    epd_status_t status;

    s = epd_calloc(1, sizeof(*s));
    if (s == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    s->loop = loop;
    s->handler = handler;
    s->arg = arg;
    atomic_init(&s->shutting_down, 0);
    status = epd_spsc_queue_init(&s->to_loop, EPD_RPC_QUEUE_DEPTH);
    if (status != EPD_OK) {
        goto err_free;
    }
    grpc_init();
    s->cq = grpc_completion_queue_create_for_next(NULL);
    {
        /* gRPC sets SO_REUSEPORT by default, which lets a second daemon bind
         * the same fixed port and silently share it: refuse that instead. */
        grpc_arg no_reuse = {.type = GRPC_ARG_INTEGER,
                             .key = (char *)GRPC_ARG_ALLOW_REUSEPORT,
                             .value.integer = 0};
        grpc_channel_args args = {.num_args = 1, .args = &no_reuse};

        s->server = grpc_server_create(&args, NULL);
    }
    grpc_server_register_completion_queue(s->server, s->cq, NULL);
    creds = grpc_insecure_server_credentials_create();
    s->port = grpc_server_add_http2_port(s->server, bind_addr, creds);
    grpc_server_credentials_release(creds);
    if (s->port == 0) {
        epd_log_error("rpc", 0, "cannot bind the control server to %s", bind_addr);
        status = EPD_ERR_UNREACHABLE;
        goto err_grpc;
    }
    grpc_server_start(s->server);
    for (int i = 0; i < EPD_RPC_PENDING_REQUESTS; i++) {
        status = epd_rpc_request_one(s);
        if (status != EPD_OK) {
            goto err_started;
        }
    }
    if (uv_async_init(loop, &s->async, epd_rpc_on_async) != 0) {
        status = EPD_ERR_FATAL;
        goto err_started;
    }
    s->async.data = s;
    if (pthread_create(&s->thread, NULL, epd_rpc_server_thread, s) != 0) {
        status = EPD_ERR_FATAL;
        goto err_async;
    }
    s->thread_started = 1;
    *server_p = s;
    return EPD_OK;

err_async:
    /* The handle must be closed through the loop; the close callback frees. */
    s->thread_started = 0;
    epd_rpc_server_destroy(s);
    return status;
err_started:
    grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
    grpc_server_cancel_all_calls(s->server);
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC),
                                                   NULL);

        if (ev.type == GRPC_QUEUE_SHUTDOWN) {
            break;
        }
        if (ev.tag == &s->shutdown_tag) {
            grpc_completion_queue_shutdown(s->cq);
        } else if (ev.tag != NULL) {
            epd_rpc_call_free(ev.tag);
        }
    }
err_grpc:
    grpc_server_destroy(s->server);
    grpc_completion_queue_destroy(s->cq);
    grpc_shutdown();
    epd_spsc_queue_cleanup(&s->to_loop);
err_free:
    epd_free(s);
    return status;
}

int epd_rpc_server_port(const epd_rpc_server_t *server)
{
    return server->port;
}

static void epd_rpc_on_async_closed(uv_handle_t *handle)
{
    epd_rpc_server_t *s = handle->data;

    epd_spsc_queue_cleanup(&s->to_loop);
    epd_free(s);
}

void epd_rpc_server_destroy(epd_rpc_server_t *s)
{
    epd__rpc_call_t *c;

    if (s == NULL) {
        return;
    }
    atomic_store(&s->shutting_down, 1);
    grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
    grpc_server_cancel_all_calls(s->server);
    if (s->thread_started) {
        pthread_join(s->thread, NULL);
    } else {
        /* No cq thread (creation failed after the server started): drain
         * the queue here. */
        for (;;) {
            grpc_event ev = grpc_completion_queue_next(
                s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);

            if (ev.type == GRPC_QUEUE_SHUTDOWN) {
                break;
            }
            if (ev.tag == &s->shutdown_tag) {
                grpc_completion_queue_shutdown(s->cq);
            } else if (ev.tag != NULL) {
                epd_rpc_call_free(ev.tag);
            }
        }
    }
    /* Calls handed to the loop but not yet answered have no batch pending. */
    while ((c = epd_spsc_queue_pop(&s->to_loop)) != NULL) {
        grpc_call_cancel(c->call, NULL);
        epd_rpc_call_free(c);
    }
    grpc_server_destroy(s->server);
    grpc_completion_queue_destroy(s->cq);
    grpc_shutdown();
    uv_close((uv_handle_t *)&s->async, epd_rpc_on_async_closed);
}

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
    epd_free(c);
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
    default:
        return EPD_ERR_TRANSPORT;
    }
}

epd_status_t epd_rpc_call(epd_rpc_client_t *client, const char *method, const void *req,
                          size_t req_len, int timeout_ms, void **resp_p, size_t *resp_len_p,
                          char *err, size_t err_cap)
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
    grpc_event ev;
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
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
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
    if (grpc_call_start_batch(call, ops, 6, call, NULL) != GRPC_CALL_OK) {
        status = EPD_ERR_TRANSPORT;
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
            status = epd_rpc_read_buffer(response, &buf, &len);
        }
    }

out_call:
    grpc_call_unref(call);
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
