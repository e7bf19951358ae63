/*
 * libFuzzer target for the image decoder (engine/epd_image.c): any bytes
 * are either refused or probe and decode to a consistent image — the
 * decoded size equals the probed one, every pixel byte is read (ASan checks
 * the buffer), and nothing leaks.  A small pixel guard keeps the fuzzer
 * fast and exercises the refusal.  Two thirds of the inputs (by their first
 * byte) get a PNG or JPEG signature in its place, so the fuzzer starts
 * inside the decoders.  `make fuzz`.
 *
 * The answer must depend on the bytes alone: every input is decoded twice,
 * once with fresh memory zeroed and once with it full of 0xA5 (both the
 * funnel's blocks, epd_alloc_fill_with, and the C heap the libraries'
 * own allocations reuse), and the two results must be equal — the same
 * refusal, or the same pixels.  A decoder that reads memory it never wrote
 * (stb_image on a JPEG without quantization tables did) fails here.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_image.h"
#include "epd_log.h"

#define FUZZ_MAX_PIXELS (512u * 512u)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Leaves `byte` in freed C-heap chunks of the sizes decoders allocate,
 * which the next mallocs of those sizes get back (outside ASan's
 * quarantine). */
static void fuzz_dirty_heap(int byte)
{
    static const size_t sizes[] = {64, 512, 4096, 20000, 70000, 300000};
    void *p[sizeof(sizes) / sizeof(sizes[0])];

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        p[i] = malloc(sizes[i]);
        if (p[i] != NULL) {
            memset(p[i], byte, sizes[i]);
        }
    }
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        free(p[i]);
    }
}

static epd_status_t fuzz_decode(const uint8_t *data, size_t size, int fill, epd_image_t *img)
{
    epd_status_t st;

    fuzz_dirty_heap(fill);
    epd_alloc_fill_with(fill);
    st = epd_image_decode(data, size, FUZZ_MAX_PIXELS, img);
    epd_alloc_fill_with(-1);
    return st;
}

static void fuzz_one(const uint8_t *data, size_t size)
{
    epd_image_info_t info;
    epd_image_t img;
    epd_image_t again;
    epd_status_t probed = epd_image_probe(data, size, &info);
    epd_status_t st = fuzz_decode(data, size, 0x00, &img);
    epd_status_t st2 = fuzz_decode(data, size, 0xa5, &again);

    if (st2 != st) {
        abort(); /* the answer depends on what memory held */
    }
    if (st == EPD_OK) {
        if (again.width != img.width || again.height != img.height ||
            memcmp(again.rgb, img.rgb, (size_t)img.width * img.height * 3) != 0) {
            abort(); /* the pixels depend on what memory held */
        }
        epd_image_cleanup(&again);
    }

    if (st == EPD_OK) {
        volatile uint8_t sink = 0;
        size_t n = (size_t)img.width * img.height * 3;

        if (probed != EPD_OK || img.width != info.width || img.height != info.height ||
            (uint64_t)img.width * img.height > FUZZ_MAX_PIXELS) {
            abort();
        }
        for (size_t i = 0; i < n; i++) {
            sink ^= img.rgb[i];
        }
        (void)sink;
        epd_image_cleanup(&img);
    } else if (probed != EPD_OK && st != probed) {
        abort(); /* decode refuses a bad header exactly as probe does */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
    static const uint8_t jpg_sig[3] = {0xff, 0xd8, 0xff};
    static int init;
    epd_alloc_stats_t before;
    epd_alloc_stats_t after;
    uint8_t *buf;

    if (!init) {
        epd_log_set_level(EPD_LOG_ERROR); /* refusals log at warn */
        init = 1;
    }
    epd_alloc_stats(&before);
    if (size == 0 || data[0] % 3 == 0 || size > (1u << 20)) {
        fuzz_one(data, size);
    } else {
        const uint8_t *sig = data[0] % 3 == 1 ? png_sig : jpg_sig;
        size_t sig_len = data[0] % 3 == 1 ? sizeof(png_sig) : sizeof(jpg_sig);

        buf = malloc(sig_len + size - 1);
        if (buf != NULL) {
            memcpy(buf, sig, sig_len);
            memcpy(buf + sig_len, data + 1, size - 1);
            fuzz_one(buf, sig_len + size - 1);
            free(buf);
        }
    }
    epd_alloc_stats(&after);
    if (after.live_blocks != before.live_blocks) {
        abort(); /* a leak through the funnel */
    }
    return 0;
}
