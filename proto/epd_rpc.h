/*
 * epd_rpc.h — the control plane's transport: unary gRPC calls over the gRPC
 * core C API, carrying packed protobuf-c messages of epd_control.proto.
 *
 * Server: gRPC's completion queue has no pollable fd, so one thread of ours
 * blocks in grpc_completion_queue_next; when a request has been received it
 * hands the call to the daemon's libuv loop (bounded queue + uv_async_send),
 * where the handler runs — the loop thread owns the daemon's state, so the
 * handler reads it without locks — and the answer is sent from there
 * (grpc_call_start_batch is thread-safe and never blocks).  A gRPC call
 * costs ~130 µs: the control plane never sits on a request's critical path.
 *
 * Client: a channel per target, blocking unary calls with a deadline; for
 * tools (epd-ctl) and for daemon threads that are not the loop thread.
 */
#ifndef EPD_RPC_H
#define EPD_RPC_H

#include <stddef.h>

#include <uv.h>

#include "epd_status.h"

typedef struct epd_rpc_server epd_rpc_server_t;
typedef struct epd_rpc_client epd_rpc_client_t;

/* gRPC status codes the handlers return (values of grpc_status_code). */
#define EPD_RPC_OK 0
#define EPD_RPC_INVALID_ARGUMENT 3
#define EPD_RPC_NOT_FOUND 5
#define EPD_RPC_FAILED_PRECONDITION 9
#define EPD_RPC_UNIMPLEMENTED 12
#define EPD_RPC_INTERNAL 13
#define EPD_RPC_UNAVAILABLE 14

/*
 * Handles one call on the loop thread.  `method` ("/epd.Control/Health")
 * and req[0..req_len) are borrowed for the call (req is NULL when req_len
 * is 0).  On EPD_RPC_OK the handler
 * sets *resp_p to a buffer from epd_malloc (taken by the server; NULL with
 * length 0 is an empty message) and *resp_len_p.  Otherwise it writes a
 * message into err[0..err_cap) and returns the gRPC status code.
 */
typedef int (*epd_rpc_handler_cb_t)(void *arg, const char *method, const void *req,
                                    size_t req_len, void **resp_p, size_t *resp_len_p,
                                    char *err, size_t err_cap);

/*
 * Starts a gRPC server on `bind_addr` ("127.0.0.1:0" picks a free port)
 * whose calls run `handler` on `loop`'s thread.  Owned by the caller
 * (epd_rpc_server_destroy, on the loop thread).  EPD_ERR_UNREACHABLE when
 * the address cannot be bound.  Call from the loop thread.
 */
epd_status_t epd_rpc_server_create(uv_loop_t *loop, const char *bind_addr,
                                   epd_rpc_handler_cb_t handler, void *arg,
                                   epd_rpc_server_t **server_p);

/* The port the server is bound to. */
int epd_rpc_server_port(const epd_rpc_server_t *server);

/* Stops accepting calls, cancels those in flight, joins the server thread
 * and frees everything.  Loop thread.  NULL is a no-op.  The loop must run
 * afterwards once more for libuv to close the async handle (uv_run with
 * UV_RUN_NOWAIT, or the loop's normal shutdown). */
void epd_rpc_server_destroy(epd_rpc_server_t *server);

/* Opens a channel to `target` ("127.0.0.1:50051"); no traffic until the
 * first call.  Owned by the caller (epd_rpc_client_destroy).  Any thread;
 * one client is used by one thread at a time. */
epd_status_t epd_rpc_client_create(const char *target, epd_rpc_client_t **client_p);
void epd_rpc_client_destroy(epd_rpc_client_t *client);

/*
 * One unary call, blocking for at most timeout_ms.  On EPD_OK *resp_p is a
 * buffer from epd_malloc owned by the caller (NULL when the answer is an
 * empty message) and *resp_len_p its length.  Errors: EPD_ERR_TIMEOUT,
 * EPD_ERR_UNREACHABLE (server down), EPD_ERR_INVALID_PARAM,
 * EPD_ERR_NOT_FOUND, EPD_ERR_DRAINING (FAILED_PRECONDITION),
 * EPD_ERR_UNSUPPORTED (UNIMPLEMENTED), EPD_ERR_TRANSPORT (others); the
 * server's message goes to err[0..err_cap) when err is not NULL.
 */
epd_status_t epd_rpc_call(epd_rpc_client_t *client, const char *method, const void *req,
                          size_t req_len, int timeout_ms, void **resp_p, size_t *resp_len_p,
                          char *err, size_t err_cap);

#endif
