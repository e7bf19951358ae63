/*
 * epd_rpc_int.h — internals shared by the files of the control plane's
 * gRPC glue (not an API: users include epd_rpc.h):
 *   epd_rpc.c         the server (completion-queue thread, loop hand-off)
 *   epd_rpc_client.c  the blocking client
 *   epd_rpc_auth.c    x-epd-auth: MAC, signing, the check, the replay cache
 *   epd_rpc_frame.c   a received message's bytes out of gRPC's buffer
 * Calls go one way: the server and the client use auth and frame, never
 * each other; auth and frame use nothing of theirs.
 */
#ifndef EPD_RPC_INT_H
#define EPD_RPC_INT_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>

#include "epd_status.h"

/* the largest message either side takes (a request, an answer) */
#define EPD_RPC_MAX_MESSAGE (16u << 20)

/* The wall clock in unix ms: the time an x-epd-auth value carries and the
 * one the server checks it against (epd_rpc_auth.c). */
uint64_t epd__rpc_now_ms(void);

/* Copies the bytes of a received message into an epd_malloc buffer
 * (*buf_p: the caller's, NULL when the message is empty; written only on
 * success).  EPD_ERR_TOO_LONG over EPD_RPC_MAX_MESSAGE, EPD_ERR_MALFORMED
 * when gRPC cannot read it, EPD_ERR_NO_MEMORY.  Any thread
 * (epd_rpc_frame.c). */
epd_status_t epd__rpc_read_buffer(grpc_byte_buffer *bb, void **buf_p, size_t *len_p);

#endif
