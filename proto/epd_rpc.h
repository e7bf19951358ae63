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
 * Connections: the port is epd's own listener (epd_rpc_guard.c), which
 * bounds what a peer without the secret can hold (epd_rpc_limits_t) and
 * hands each HTTP/2 connection to gRPC core through a socketpair; gRPC
 * binds nothing itself.
 *
 * Client: a channel per target, blocking unary calls with a deadline; for
 * tools (epd-ctl) and for daemon threads that are not the loop thread.
 *
 * Authentication (a cluster secret set on the server: every call but
 * /epd.Control/Health and /grpc.health.v1.Health/ (orchestrators' probes)
 * must prove its sender a member of the cluster, and cannot be replayed).
 * The client sends one request metadata entry
 *
 *   x-epd-auth: v1:<unix time, ms, decimal>:<nonce, 16 random bytes, 32 hex>:<MAC, 64 hex>
 *
 * MAC = BLAKE2b-256 keyed with K over
 *   0x01 | le32 len(method) | method | le64 len(body) | body | le64 time | nonce
 * K = BLAKE2b-256(secret) personalised "epd-rpc-v1" (the transport's HELLO key
 * is the same construction personalised "epd-xport-v1": one secret, keys that
 * cannot stand in for each other).  The server accepts a call when the entry
 * is there once and well formed, time is within +-EPD_RPC_AUTH_WINDOW_MS of
 * its own clock, the MAC verifies (constant time), and the nonce was not seen
 * before: nonces are remembered until time + window, after which the same
 * value fails the clock check anyway.  Otherwise the call is answered
 * UNAUTHENTICATED with a short reason, counted, logged (rate limited), and
 * the handler never runs.
 *
 * Why a MAC in metadata rather than mutual TLS: Debian's grpc_unsecure has
 * no TLS at all, and gRPC with OpenSSL would pull OpenSSL and a certificate
 * authority, issuance and rotation into every deployment; the cluster
 * already shares one secret for the request plane's HELLO, and a keyed MAC
 * on the same secret gives the control plane the same trust with nothing
 * more to manage.  What it does not give: confidentiality (the control
 * plane carries no user data; docs/security.md says so), and a
 * captured call can be replayed to *another* member within the window:
 * the replay cache is per server, and the MAC cannot bind the target (the
 * :authority is the sender's to choose, and hosts have many names).  For
 * the methods here that repeats what the original call did (Drain of the
 * same worker id, reached through the router or the worker itself), reads
 * (Status), refreshes a load the other router holds for the same
 * incarnation (Heartbeat), or lists a genuine worker with another router
 * of the same cluster (RegisterWorker).
 */
#ifndef EPD_RPC_H
#define EPD_RPC_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "epd_status.h"

typedef struct epd_rpc_server epd_rpc_server_t;
typedef struct epd_rpc_client epd_rpc_client_t;
typedef struct epd_rpc_auth epd_rpc_auth_t;

/* gRPC status codes the handlers return (values of grpc_status_code). */
#define EPD_RPC_OK 0
#define EPD_RPC_INVALID_ARGUMENT 3
#define EPD_RPC_NOT_FOUND 5
#define EPD_RPC_FAILED_PRECONDITION 9
#define EPD_RPC_UNIMPLEMENTED 12
#define EPD_RPC_INTERNAL 13
#define EPD_RPC_UNAVAILABLE 14
#define EPD_RPC_UNAUTHENTICATED 16

/* Authentication (see the top of this file). */
#define EPD_RPC_AUTH_KEY "x-epd-auth" /* the request metadata key */
#define EPD_RPC_AUTH_WINDOW_MS 30000  /* a call's time may differ this much from ours */
/* Nonces a server remembers at most (each for up to two windows): 65536 is
 * ~1000 authenticated calls a second sustained, 5x a 100-worker cluster's
 * heartbeats at 500 ms.  Full, the server refuses new calls UNAVAILABLE
 * (retry) rather than forget a nonce that could still be replayed. */
#define EPD_RPC_AUTH_NONCES 65536
#define EPD_RPC_AUTH_VALUE_MAX 128 /* the metadata value and its NUL */
#define EPD_RPC_SECRET_MIN 16      /* bytes; as the transport's */
#define EPD_RPC_SECRET_MAX 1024

/*
 * What an unauthenticated peer may hold of the control port (the guard,
 * proto/epd_rpc_guard.c, enforces them; every daemon's --control-* flags).
 * A field of 0 takes the default beside it.
 */
typedef struct {
    uint32_t max_conns;          /* connections at once; full, the oldest one that has not
                                  * authenticated is closed for a new one (none: refused).
                                  * Clamped to a third of the descriptors left after a
                                  * reserve (each costs up to 3).  Default 1024 */
    uint32_t max_conns_per_addr; /* from one IPv4 address or IPv6 /64 (beyond: refused).
                                  * Default 64; UINT32_MAX: no cap */
    uint32_t auth_timeout_ms;    /* a connection must send the HTTP/2 preface and have a call
                                  * authenticated this long after the accept, else it is
                                  * closed.  Default 10000 */
    uint32_t max_streams;        /* concurrent streams per connection
                                  * (SETTINGS_MAX_CONCURRENT_STREAMS).  Default 64 */
    uint32_t max_resets;         /* RST_STREAM frames a connection may send in 10 s (beyond:
                                  * closed).  Default 200 */
} epd_rpc_limits_t;

#define EPD_RPC_DEFAULT_MAX_CONNS 1024
#define EPD_RPC_DEFAULT_MAX_CONNS_PER_ADDR 64
#define EPD_RPC_DEFAULT_AUTH_TIMEOUT_MS 10000
#define EPD_RPC_DEFAULT_MAX_STREAMS 64
#define EPD_RPC_DEFAULT_MAX_RESETS 200
/* Streams a connection may open before one of its calls authenticated
 * (a probe needs one): beyond, it is closed. */
#define EPD_RPC_GUARD_STRANGER_STREAMS 16
#define EPD_RPC_GUARD_RESET_WINDOW_MS 10000

/* The guard's counters since the server started. */
typedef struct {
    uint64_t accepted;      /* connections taken in */
    uint64_t refused_addr;  /* refused: --control-max-conns-per-addr */
    uint64_t refused_full;  /* refused: full of authenticated connections */
    uint64_t shed;          /* closed to make room for a newer one */
    uint64_t timed_out;     /* closed: no preface or no authenticated call in time */
    uint64_t bad_preface;   /* closed: not HTTP/2 */
    uint64_t reset_flood;   /* closed: over --control-max-resets */
    uint64_t stream_flood;  /* closed: over EPD_RPC_GUARD_STRANGER_STREAMS unauthenticated */
    uint64_t accept_errors; /* accept or socketpair failed (out of descriptors) */
    uint32_t live;          /* connections open now */
    uint32_t max_conns;     /* the cap in force (after clamping) */
} epd_rpc_guard_stats_t;

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
 * Starts a gRPC server on `bind_addr` (numeric; "127.0.0.1:0" picks a free
 * port) whose calls run `handler` on `loop`'s thread, under the default
 * limits (epd_rpc_limits_t).  Owned by the caller
 * (epd_rpc_server_destroy, on the loop thread).  EPD_ERR_UNREACHABLE when
 * the address cannot be bound.  Call from the loop thread.
 */
epd_status_t epd_rpc_server_create(uv_loop_t *loop, const char *bind_addr,
                                   epd_rpc_handler_cb_t handler, void *arg,
                                   epd_rpc_server_t **server_p);

/*
 * epd_rpc_server_create with the guard's limits (`limits` copied; NULL:
 * every default).  The control port is then epd's own listener (see
 * proto/epd_rpc_guard.c): gRPC core serves the connections it hands over.
 */
epd_status_t epd_rpc_server_create_limited(uv_loop_t *loop, const char *bind_addr,
                                           const epd_rpc_limits_t *limits,
                                           epd_rpc_handler_cb_t handler, void *arg,
                                           epd_rpc_server_t **server_p);

/* The guard's counters (any thread). */
void epd_rpc_server_guard_stats(const epd_rpc_server_t *server, epd_rpc_guard_stats_t *stats_p);

/* The port the server is bound to. */
int epd_rpc_server_port(const epd_rpc_server_t *server);

/*
 * Requires every later call but Health to authenticate under `secret`
 * (EPD_RPC_SECRET_MIN..MAX bytes, borrowed for this call only: the server
 * keeps a key derived from it, wiped at destroy).  Loop thread, once
 * (EPD_ERR_BUSY the second time); right after create — a call the server
 * thread took before it is refused when it reaches the loop, never run.
 * EPD_ERR_INVALID_PARAM for a bad length, EPD_ERR_NO_MEMORY.
 *
 * Where the check runs: on the server's own thread (the one blocking in
 * grpc_completion_queue_next), before a call is handed to the loop — calls
 * from outsiders never take a slot of the bounded queue to the loop nor a
 * moment of the loop thread (which carries the request plane), and the
 * replay cache has that thread as its only user (no lock).
 */
epd_status_t epd_rpc_server_set_auth(epd_rpc_server_t *server, const void *secret, size_t len);

/* Calls refused for authentication so far (any thread). */
uint64_t epd_rpc_server_auth_refused(const epd_rpc_server_t *server);

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

/* Signs every later call of `client` under `secret` (copied as a derived
 * key; NULL / 0 stops signing).  The client's thread.  EPD_ERR_INVALID_PARAM
 * for a length outside EPD_RPC_SECRET_MIN..MAX, EPD_ERR_NO_MEMORY. */
epd_status_t epd_rpc_client_set_auth(epd_rpc_client_t *client, const void *secret, size_t len);

/*
 * One unary call, blocking for at most timeout_ms.  On EPD_OK *resp_p is a
 * buffer from epd_malloc owned by the caller (NULL when the answer is an
 * empty message) and *resp_len_p its length.  Errors: EPD_ERR_TIMEOUT,
 * EPD_ERR_UNREACHABLE (server down), EPD_ERR_INVALID_PARAM,
 * EPD_ERR_NOT_FOUND, EPD_ERR_DRAINING (FAILED_PRECONDITION),
 * EPD_ERR_UNSUPPORTED (UNIMPLEMENTED), EPD_ERR_AUTH (UNAUTHENTICATED: the
 * server requires a cluster secret and this call did not prove it),
 * EPD_ERR_TRANSPORT (others); the server's message goes to err[0..err_cap)
 * when err is not NULL.  With a secret set (epd_rpc_client_set_auth) the
 * call is signed.
 */
epd_status_t epd_rpc_call(epd_rpc_client_t *client, const char *method, const void *req,
                          size_t req_len, int timeout_ms, void **resp_p, size_t *resp_len_p,
                          char *err, size_t err_cap);

/* epd_rpc_call, sending `auth_value` (NUL-terminated) as the x-epd-auth
 * metadata exactly as given — NULL: none — whatever the client's own
 * secret.  For tests and tools that must resend a call byte for byte
 * (a replay must be refused).  EPD_ERR_INVALID_PARAM when gRPC refuses
 * the value as metadata. */
epd_status_t epd_rpc_call_with_auth(epd_rpc_client_t *client, const char *method, const void *req,
                                    size_t req_len, const char *auth_value, int timeout_ms,
                                    void **resp_p, size_t *resp_len_p, char *err, size_t err_cap);

/* ------------------------------------------------------ authentication */

/*
 * A key derived from `secret` (EPD_RPC_SECRET_MIN..MAX bytes, borrowed for
 * the call) and, when max_nonces > 0, a replay cache of that many nonces
 * (a table of 2 x max_nonces slots, ~48 bytes a nonce).  Owned by the caller
 * (epd_rpc_auth_destroy wipes the key).  Any thread.
 * EPD_ERR_INVALID_PARAM, EPD_ERR_NO_MEMORY.
 */
epd_status_t epd_rpc_auth_create(const void *secret, size_t secret_len, uint32_t max_nonces,
                                 epd_rpc_auth_t **auth_p);
void epd_rpc_auth_destroy(epd_rpc_auth_t *auth);

/* Writes the x-epd-auth value of one call (method, body at now_ms, unix
 * time in ms) into value[0..cap), NUL-terminated, with a fresh random
 * nonce.  Any thread (reads `auth` only).  EPD_ERR_TOO_LONG when cap is
 * below EPD_RPC_AUTH_VALUE_MAX. */
epd_status_t epd_rpc_auth_sign(const epd_rpc_auth_t *auth, const char *method, const void *body,
                               size_t body_len, uint64_t now_ms, char *value, size_t cap);

/*
 * Checks value[0..value_len) (not NUL-terminated; NULL: absent) for a call
 * of `method` with body[0..body_len) received at now_ms, in the order:
 * present, well formed, within the window, MAC, nonce not seen before — and
 * remembers the nonce when all pass.  EPD_OK; EPD_ERR_AUTH with *why_p (a
 * static string) saying which check failed; EPD_ERR_NO_RESOURCE when the
 * replay cache is full (refused, nothing remembered: retry later).  An auth
 * made without a replay cache checks everything but replays.  One thread at
 * a time.
 */
epd_status_t epd_rpc_auth_check(epd_rpc_auth_t *auth, const char *method, const void *body,
                                size_t body_len, const char *value, size_t value_len,
                                uint64_t now_ms, const char **why_p);

/* Nonces remembered now (expired ones may still count until swept). */
uint32_t epd_rpc_auth_nonces(const epd_rpc_auth_t *auth);

#endif
