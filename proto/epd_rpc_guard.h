/*
 * epd_rpc_guard.h — the control port's doorman: epd accepts the TCP
 * connections of its gRPC control server itself, bounds what a peer can
 * hold, and hands each connection's HTTP/2 bytes to gRPC core through a
 * socketpair (grpc_server_add_channel_from_fd).  Internal to proto/
 * (epd_rpc.c is its only user); the design is at the top of epd_rpc_guard.c.
 */
#ifndef EPD_RPC_GUARD_H
#define EPD_RPC_GUARD_H

#include <stddef.h>
#include <stdint.h>

#include "epd_rpc.h"
#include "epd_rpc_h2scan.h"
#include "epd_status.h"

typedef struct epd_rpc_guard epd_rpc_guard_t;

/* Hands gRPC's end of a new connection's socketpair to the gRPC server
 * (taken: gRPC closes it).  Called on the guard's thread. */
typedef void (*epd_rpc_guard_adopt_cb_t)(void *arg, int fd);

/*
 * Binds `bind_addr` (numeric "HOST:PORT", "[V6]:PORT"; port 0: ephemeral)
 * and starts the guard's thread, which accepts under `limits` (copied;
 * zero fields take the defaults of epd_rpc.h) and calls `adopt` for each
 * connection that sent the HTTP/2 client preface.  Owned by the caller:
 * epd_rpc_guard_stop, then epd_rpc_guard_destroy.  EPD_ERR_UNREACHABLE when
 * the address cannot be bound (logged), EPD_ERR_NO_MEMORY, EPD_ERR_FATAL.
 */
epd_status_t epd_rpc_guard_start(const char *bind_addr, const epd_rpc_limits_t *limits,
                                 epd_rpc_guard_adopt_cb_t adopt, void *arg,
                                 epd_rpc_guard_t **guard_p);

/* The bound port. */
int epd_rpc_guard_port(const epd_rpc_guard_t *guard);

/*
 * A call received on the connection gRPC names `peer` ("fd:N", the string
 * of grpc_call_get_peer) proved the cluster secret (or the server needs
 * none): that connection is a member's, no longer held to the deadline and
 * the stream budget of strangers.  Any thread, while the call is alive
 * (its reference keeps fd N open, so N names this connection).
 */
void epd_rpc_guard_mark(epd_rpc_guard_t *guard, const char *peer);

/* The peer's address ("127.0.0.1:5555") of the connection gRPC names
 * `peer` ("fd:N"), into out[0..cap); `peer` itself when unknown.  Any
 * thread, while a call on that connection is alive; it takes a lock and
 * walks every slot: for log lines only. */
void epd_rpc_guard_peer_name(epd_rpc_guard_t *guard, const char *peer, char *out, size_t cap);

/* What the guard did so far (any thread; for logs and tests). */
void epd_rpc_guard_stats(const epd_rpc_guard_t *guard, epd_rpc_guard_stats_t *stats_p);

/* Closes the listener and every connection and joins the thread: no adopt
 * call after it returns.  Marks may still come (they are ignored). */
void epd_rpc_guard_stop(epd_rpc_guard_t *guard);

/* Frees a stopped guard, once no thread can mark it.  NULL is a no-op. */
void epd_rpc_guard_destroy(epd_rpc_guard_t *guard);

#endif
