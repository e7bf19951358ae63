/*
 * epd_rpc_frame.c — the bytes of a received gRPC message (a request on the
 * server, an answer on the client) copied out of gRPC's byte buffer into
 * epd's allocator, bounded by EPD_RPC_MAX_MESSAGE.
 */
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_rpc_int.h"

/* Copies the bytes of a received message into an epd_malloc buffer
 * (epd_rpc_int.h). */
epd_status_t epd__rpc_read_buffer(grpc_byte_buffer *bb, void **buf_p, size_t *len_p)
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
