/*
 * libFuzzer target for the control port guard's HTTP/2 scanner
 * (proto/epd_rpc_h2scan.c): any byte string, fed whole and fed again cut
 * at places the input itself chooses (its first two bytes), yields the
 * same frame headers in the same order and the same final state; a scan
 * stopped by its callback reports EPD_ERR_CANCELED and no frame after the
 * stop; never a crash or undefined behaviour.  `make fuzz`; the seeds in
 * tests/fuzz/corpus/fuzz_epd_rpc_h2scan/ are replayed by make check.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "epd_rpc_h2scan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FRAMES_MAX 4096

typedef struct {
    size_t n;
    size_t stop_after; /* 0: never stop */
    uint64_t ev[FRAMES_MAX];
} record_t;

static int on_frame(void *arg, uint8_t type, uint32_t sid, int opens)
{
    record_t *r = arg;

    if (r->n < FRAMES_MAX) {
        r->ev[r->n] = ((uint64_t)type << 40) | ((uint64_t)(opens != 0) << 32) | sid;
    }
    r->n++;
    return r->stop_after != 0 && r->n >= r->stop_after;
}

static record_t whole, cut, stopped;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    epd_rpc_h2scan_t a, b, c;
    epd_status_t sa, sb = EPD_OK, sc;
    size_t step, off = 0;

    if (size < 2) {
        return 0;
    }
    step = (size_t)data[0] % 17 + 1; /* cuts every `step` bytes, shifted by data[1] */
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    memset(&c, 0, sizeof(c));
    memset(&whole, 0, sizeof(whole));
    memset(&cut, 0, sizeof(cut));
    memset(&stopped, 0, sizeof(stopped));

    sa = epd_rpc_h2scan_feed(&a, data, size, on_frame, &whole);
    for (int first = 1; off < size && sb == EPD_OK; first = 0) {
        /* the first cut may be empty: a feed of nothing changes nothing */
        size_t k = first ? (size_t)data[1] % (size + 1) : step;

        k = k > size - off ? size - off : k;
        sb = epd_rpc_h2scan_feed(&b, data + off, k, on_frame, &cut);
        off += k;
    }
    /* (refused input leaves whatever part of the preface each feed had
     * matched: only the verdict and the frames must agree then) */
    if (sa != sb || whole.n != cut.n || a.frames != b.frames || a.max_stream != b.max_stream ||
        (sa == EPD_OK && (a.preface != b.preface || a.skip != b.skip || a.hdr_len != b.hdr_len))) {
        abort();
    }
    for (size_t i = 0; i < whole.n && i < FRAMES_MAX; i++) {
        if (whole.ev[i] != cut.ev[i]) {
            abort();
        }
    }
    /* every frame header takes 9 bytes after the 24 of the preface */
    if (sa == EPD_OK && a.frames * 9 > (size > 24 ? size - 24 : 0)) {
        abort();
    }
    if (whole.n >= 2) {
        stopped.stop_after = whole.n / 2;
        sc = epd_rpc_h2scan_feed(&c, data, size, on_frame, &stopped);
        if (sc != EPD_ERR_CANCELED || stopped.n != whole.n / 2) {
            abort();
        }
    }
    return 0;
}
