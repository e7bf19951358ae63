/*
 * epd_rpc.c — the control plane's unary gRPC server over the gRPC core C
 * API (the client: epd_rpc_client.c; the x-epd-auth check and its replay
 * cache: epd_rpc_auth.c; epd_rpc_int.h lists the files).
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
 *
 * Authentication (epd_rpc.h): with a secret set, RECEIVED checks the
 * x-epd-auth metadata on the cq thread before the call goes to the loop; a
 * refused call is answered there (UNAUTHENTICATED) and never queued.  The
 * auth object is published to the cq thread through an atomic pointer
 * (set once, freed after the thread is joined).  The loop keeps its own
 * flag: a call the cq thread passed before the secret was set is refused
 * when it reaches the loop, so no call runs unchecked after set_auth.
 */
#include "epd_rpc.h"

#include <grpc/grpc.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_msg.h" /* the method names (the open ones) */
#include "epd_queue.h"
#include "epd_rpc_guard.h"
#include "epd_rpc_int.h"

#define EPD_RPC_PENDING_REQUESTS 8
#define EPD_RPC_QUEUE_DEPTH 256

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
    int authenticated; /* the cq thread checked its x-epd-auth */
    void *req_buf;     /* [req_len] bytes, epd_malloc */
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
    /* the listener (epd_rpc_guard.c) and the credentials of the
     * connections it hands over (insecure: the secret is checked per call) */
    epd_rpc_guard_t *guard;
    grpc_server_credentials *fd_creds;
    epd_rpc_handler_cb_t handler;
    void *arg;
    atomic_int shutting_down;
    int shutdown_tag;
    /* authentication: `auth` is read by the cq thread (the replay cache is
     * its alone); auth_on_loop is the loop's view of it */
    _Atomic(epd_rpc_auth_t *) auth;
    int auth_on_loop;
    atomic_uint_fast64_t auth_refused;
    epd_log_limit_t auth_log_cq, auth_log_loop; /* one per thread */
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

/* Counts and logs (rate limited: an outsider triggers these at will) a
 * call refused for authentication, and answers it. */
static void epd_rpc_refuse_auth(epd_rpc_server_t *s, epd__rpc_call_t *c, epd_log_limit_t *limit,
                                int code, const char *why)
{
    uint64_t n = atomic_fetch_add(&s->auth_refused, 1) + 1;

    if (epd_log_enabled(EPD_LOG_WARN) && epd_log_limit_ok(limit, 5)) {
        char *peer = grpc_call_get_peer(c->call);
        char name[64];

        /* gRPC names the guard's connections "fd:N": the guard knows whose */
        epd_rpc_guard_peer_name(s->guard, peer, name, sizeof(name));
        epd_log_warn("rpc", 0, "refused %s from %s: %s (%llu refused so far)", c->method, name, why,
                     (unsigned long long)n);
        gpr_free(peer);
    }
    epd_rpc_send_answer(c, code, why, NULL, 0);
}

/* The methods anyone may call: whether a daemon serves is no secret, and
 * probes (a kubelet's) cannot sign. */
static int epd_rpc_method_open(const char *method)
{
    return strcmp(method, EPD_RPC_HEALTH) == 0 || strcmp(method, EPD_RPC_GRPC_HEALTH_CHECK) == 0 ||
           strcmp(method, EPD_RPC_GRPC_HEALTH_WATCH) == 0;
}

/* Tells the guard the call's connection is a member's (epd_rpc_guard_mark:
 * the call is alive, so its "fd:N" names that connection). */
static void epd_rpc_mark_member(epd_rpc_server_t *s, epd__rpc_call_t *c)
{
    char *peer;

    if (s->guard == NULL) {
        return;
    }
    peer = grpc_call_get_peer(c->call);
    epd_rpc_guard_mark(s->guard, peer);
    gpr_free(peer);
}

/* The cq thread: 0 when the call may go on (authenticated, or exempt);
 * otherwise it was answered. */
static int epd_rpc_authenticate(epd_rpc_server_t *s, epd__rpc_call_t *c)
{
    epd_rpc_auth_t *auth = atomic_load_explicit(&s->auth, memory_order_acquire);
    const char *value = NULL;
    size_t value_len = 0;
    const char *why = "?";
    epd_status_t st;

    if (auth == NULL) {
        epd_rpc_mark_member(s, c); /* no secret to prove: any call will do */
        return 0;
    }
    if (epd_rpc_method_open(c->method)) {
        return 0;
    }
    for (size_t i = 0; i < c->request_md.count; i++) {
        const grpc_metadata *md = &c->request_md.metadata[i];

        if (grpc_slice_str_cmp(md->key, EPD_RPC_AUTH_KEY) != 0) {
            continue;
        }
        if (value != NULL) {
            epd_rpc_refuse_auth(s, c, &s->auth_log_cq, EPD_RPC_UNAUTHENTICATED,
                                "more than one " EPD_RPC_AUTH_KEY " metadata entry");
            return -1;
        }
        value = (const char *)GRPC_SLICE_START_PTR(md->value);
        value_len = GRPC_SLICE_LENGTH(md->value);
    }
    if (GRPC_SLICE_LENGTH(c->details.method) >= sizeof(c->method)) {
        /* c->method was cut: it is not the name the client signed */
        epd_rpc_refuse_auth(s, c, &s->auth_log_cq, EPD_RPC_UNAUTHENTICATED, "method name too long");
        return -1;
    }
    st = epd_rpc_auth_check(auth, c->method, c->req_buf, c->req_len, value, value_len,
                            epd__rpc_now_ms(), &why);
    if (st != EPD_OK) {
        epd_rpc_refuse_auth(
            s, c, &s->auth_log_cq,
            st == EPD_ERR_NO_RESOURCE ? EPD_RPC_UNAVAILABLE : EPD_RPC_UNAUTHENTICATED, why);
        return -1;
    }
    c->authenticated = 1;
    epd_rpc_mark_member(s, c);
    return 0;
}

static void epd_rpc_on_received(epd_rpc_server_t *s, epd__rpc_call_t *c, int success)
{
    epd_status_t status;

    if (!success || c->request == NULL) {
        epd_rpc_call_free(c); /* cancelled, or the client sent no message */
        return;
    }
    status = epd__rpc_read_buffer(c->request, &c->req_buf, &c->req_len);
    if (status != EPD_OK) {
        epd_rpc_send_answer(c, EPD_RPC_INVALID_ARGUMENT, epd_status_string(status), NULL, 0);
        return;
    }
    if (epd_rpc_authenticate(s, c) != 0) {
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
        int code;

        if (s->auth_on_loop && !c->authenticated && !epd_rpc_method_open(c->method)) {
            /* taken by the cq thread before the secret was set */
            epd_rpc_refuse_auth(s, c, &s->auth_log_loop, EPD_RPC_UNAUTHENTICATED,
                                "arrived before the server required authentication: retry");
            continue;
        }
        code = s->handler(s->arg, c->method, c->req_buf, c->req_len, &resp, &resp_len, err,
                          sizeof(err));
        if (code != EPD_RPC_OK && err[0] == '\0') {
            snprintf(err, sizeof(err), "%s failed", c->method);
        }
        epd_rpc_send_answer(c, code, code == EPD_RPC_OK ? "" : err, resp, resp_len);
        epd_free(resp);
    }
}

/* The guard's thread: gRPC core serves one more connection. */
static void epd_rpc_adopt(void *arg, int fd)
{
    epd_rpc_server_t *s = arg;

    grpc_server_add_channel_from_fd(s->server, fd, s->fd_creds);
}

epd_status_t epd_rpc_server_create(uv_loop_t *loop, const char *bind_addr,
                                   epd_rpc_handler_cb_t handler, void *arg,
                                   epd_rpc_server_t **server_p)
{
    return epd_rpc_server_create_limited(loop, bind_addr, NULL, handler, arg, server_p);
}

epd_status_t epd_rpc_server_create_limited(uv_loop_t *loop, const char *bind_addr,
                                           const epd_rpc_limits_t *limits,
                                           epd_rpc_handler_cb_t handler, void *arg,
                                           epd_rpc_server_t **server_p)
{
    epd_rpc_limits_t lim;
    epd_rpc_server_t *s;
    epd_status_t status;

    s = epd_calloc(1, sizeof(*s));
    if (s == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    s->loop = loop;
    s->handler = handler;
    s->arg = arg;
    atomic_init(&s->shutting_down, 0);
    atomic_init(&s->auth, NULL);
    atomic_init(&s->auth_refused, 0);
    status = epd_spsc_queue_init(&s->to_loop, EPD_RPC_QUEUE_DEPTH);
    if (status != EPD_OK) {
        goto err_free;
    }
    grpc_init();
    s->cq = grpc_completion_queue_create_for_next(NULL);
    memset(&lim, 0, sizeof(lim));
    if (limits != NULL) {
        lim = *limits;
    }
    if (lim.max_streams == 0) {
        lim.max_streams = EPD_RPC_DEFAULT_MAX_STREAMS;
    }
    {
        /* The transports of the connections the guard hands over take the
         * server's arguments.  (gRPC binds nothing itself: the guard's
         * listener sets no SO_REUSEPORT, so a second daemon cannot share a
         * fixed port.) */
        grpc_arg a[1] = {
            {.type = GRPC_ARG_INTEGER,
             .key = (char *)GRPC_ARG_MAX_CONCURRENT_STREAMS,
             .value.integer = (int)(lim.max_streams > INT32_MAX ? INT32_MAX : lim.max_streams)}};
        grpc_channel_args args = {.num_args = 1, .args = a};

        s->server = grpc_server_create(&args, NULL);
    }
    grpc_server_register_completion_queue(s->server, s->cq, NULL);
    s->fd_creds = grpc_insecure_server_credentials_create();
    grpc_server_start(s->server);
    for (int i = 0; i < EPD_RPC_PENDING_REQUESTS; i++) {
        status = epd_rpc_request_one(s);
        if (status != EPD_OK) {
            goto err_started;
        }
    }
    /* the listener last: a connection it hands over finds the server
     * started and its request slots posted */
    status = epd_rpc_guard_start(bind_addr, &lim, epd_rpc_adopt, s, &s->guard);
    if (status != EPD_OK) {
        epd_log_error("rpc", 0, "cannot bind the control server to %s", bind_addr);
        goto err_started;
    }
    s->port = epd_rpc_guard_port(s->guard);
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
    epd_rpc_guard_stop(s->guard);
    epd_rpc_guard_destroy(s->guard);
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
    grpc_server_destroy(s->server);
    grpc_server_credentials_release(s->fd_creds);
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

epd_status_t epd_rpc_server_set_auth(epd_rpc_server_t *s, const void *secret, size_t len)
{
    epd_rpc_auth_t *auth = NULL;
    epd_status_t st;

    if (s->auth_on_loop) {
        return EPD_ERR_BUSY;
    }
    st = epd_rpc_auth_create(secret, len, EPD_RPC_AUTH_NONCES, &auth);
    if (st != EPD_OK) {
        return st;
    }
    s->auth_on_loop = 1;
    atomic_store_explicit(&s->auth, auth, memory_order_release);
    return EPD_OK;
}

void epd_rpc_server_guard_stats(const epd_rpc_server_t *s, epd_rpc_guard_stats_t *stats_p)
{
    epd_rpc_guard_stats(s->guard, stats_p);
}

uint64_t epd_rpc_server_auth_refused(const epd_rpc_server_t *s)
{
    return atomic_load(&s->auth_refused);
}

static void epd_rpc_on_async_closed(uv_handle_t *handle)
{
    epd_rpc_server_t *s = handle->data;

    epd_spsc_queue_cleanup(&s->to_loop);
    epd_rpc_auth_destroy(atomic_load(&s->auth));
    epd_free(s);
}

void epd_rpc_server_destroy(epd_rpc_server_t *s)
{
    epd__rpc_call_t *c;

    if (s == NULL) {
        return;
    }
    atomic_store(&s->shutting_down, 1);
    /* no connection is handed over once gRPC shuts down */
    epd_rpc_guard_stop(s->guard);
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
    grpc_server_credentials_release(s->fd_creds);
    grpc_completion_queue_destroy(s->cq);
    grpc_shutdown();
    /* the cq thread, the guard's only marker, is joined */
    epd_rpc_guard_destroy(s->guard);
    s->guard = NULL;
    uv_close((uv_handle_t *)&s->async, epd_rpc_on_async_closed);
}
