/*
 * epd_rpc_h2scan.c — the preface and frame headers of a client's HTTP/2
 * bytes, for the control port's guard (see epd_rpc_h2scan.h).  The state
 * survives any cut of the stream: a frame header gathered across reads,
 * a payload skipped across reads.
 */
#include "epd_rpc_h2scan.h"

#include <string.h>

epd_status_t epd_rpc_h2scan_feed(epd_rpc_h2scan_t *sc, const unsigned char *p, size_t n,
                                 epd_rpc_h2scan_cb_t cb, void *arg)
{
    if (sc->preface < EPD_RPC_H2_PREFACE_LEN) {
        size_t k = EPD_RPC_H2_PREFACE_LEN - sc->preface;

        k = n < k ? n : k;
        if (memcmp(p, &EPD_RPC_H2_PREFACE[sc->preface], k) != 0) {
            return EPD_ERR_MALFORMED;
        }
        sc->preface += (uint32_t)k;
        p += k;
        n -= k;
    }
    while (n > 0) {
        size_t k;

        if (sc->skip > 0) {
            k = n < sc->skip ? n : sc->skip;
            sc->skip -= (uint32_t)k;
            p += k;
            n -= k;
            continue;
        }
        k = sizeof(sc->hdr) - sc->hdr_len;
        k = n < k ? n : k;
        memcpy(sc->hdr + sc->hdr_len, p, k);
        sc->hdr_len += (uint32_t)k;
        p += k;
        n -= k;
        if (sc->hdr_len == sizeof(sc->hdr)) {
            uint32_t sid = (((uint32_t)sc->hdr[5] << 24) | ((uint32_t)sc->hdr[6] << 16) |
                            ((uint32_t)sc->hdr[7] << 8) | sc->hdr[8]) &
                           0x7fffffffu;
            int opens = sc->hdr[3] == EPD_RPC_H2_HEADERS && sid > sc->max_stream;

            sc->hdr_len = 0;
            sc->skip = ((uint32_t)sc->hdr[0] << 16) | ((uint32_t)sc->hdr[1] << 8) | sc->hdr[2];
            sc->frames++;
            if (opens) {
                sc->max_stream = sid;
            }
            if (cb(arg, sc->hdr[3], sid, opens) != 0) {
                return EPD_ERR_CANCELED;
            }
        }
    }
    return EPD_OK;
}
