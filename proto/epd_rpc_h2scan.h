/*
 * epd_rpc_h2scan.h — the few bytes of HTTP/2 the control port's guard
 * (epd_rpc_guard.c) reads before gRPC does: the client preface and each
 * frame's 9-byte header, never a payload (no HPACK, no state but the
 * frame boundaries).  Pure: no I/O, no allocation; tests/fuzz has a target.
 */
#ifndef EPD_RPC_H2SCAN_H
#define EPD_RPC_H2SCAN_H

#include <stddef.h>
#include <stdint.h>

#include "epd_status.h"

#define EPD_RPC_H2_PREFACE "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#define EPD_RPC_H2_PREFACE_LEN 24
#define EPD_RPC_H2_HEADERS 0x1
#define EPD_RPC_H2_RST_STREAM 0x3

/* What the guard reads of a client's bytes: the preface, then frame
 * headers (9 bytes: length 24, type 8, flags 8, R + stream id 31); the
 * payloads are skipped, never decoded.  Zero-initialised; caller's. */
typedef struct {
    uint32_t preface; /* bytes of the preface seen (EPD_RPC_H2_PREFACE_LEN: all) */
    unsigned char hdr[9];
    uint32_t hdr_len;    /* bytes of the current frame header gathered */
    uint32_t skip;       /* payload bytes left of the current frame */
    uint32_t max_stream; /* highest stream id a HEADERS frame opened */
    uint64_t frames;     /* frame headers seen */
} epd_rpc_h2scan_t;

/* One frame header: `opens` is nonzero for a HEADERS frame on a stream id
 * above every earlier one (a new stream).  Nonzero stops the scan. */
typedef int (*epd_rpc_h2scan_cb_t)(void *arg, uint8_t type, uint32_t stream_id, int opens);

/*
 * Feeds the client's next bytes p[0..n), however they were cut, calling
 * `cb` for each complete frame header in order.  EPD_OK;
 * EPD_ERR_MALFORMED when the bytes do not begin with the preface;
 * EPD_ERR_CANCELED when cb returned nonzero (the rest not scanned).
 */
epd_status_t epd_rpc_h2scan_feed(epd_rpc_h2scan_t *scan, const unsigned char *p, size_t n,
                                 epd_rpc_h2scan_cb_t cb, void *arg);

#endif
