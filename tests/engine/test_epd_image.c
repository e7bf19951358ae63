/*
 * test_epd_image.c — engine/epd_image.c: real PNG and JPEG files made here
 * (stb_image_write; libjpeg for progressive and CMYK files) decode back
 * (PNG exactly, JPEG closely), grey, grey+alpha, RGBA and CMYK become RGB,
 * headers are probed without decoding, and hostile input is refused
 * without a crash, a leak or a large allocation: truncated files, random
 * bytes, other formats, a 60000 x 60000 PNG of a hundred bytes (the pixel
 * guard), a side over EPD_IMAGE_MAX_SIDE, a PNG whose zlib stream inflates
 * to a gigabyte, bad Huffman tables, a JPEG without quantization tables
 * (the same refusal every time, whatever memory holds), a progressive JPEG
 * of too many scans, more bytes than the decoder reads (a size error, not
 * a format one), allocation failures at every step, and concurrent decodes
 * in several threads.  The pixel limit is inclusive.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdint.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>

#include <stdio.h> /* jpeglib.h needs FILE */

#include <jpeglib.h>

#include "epd_alloc.h"
#include "epd_image.h"
#include "epd_rng.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#define STBI_WRITE_NO_STDIO
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop

/* ---- making files ---------------------------------------------------------- */

typedef struct {
    unsigned char *data;
    size_t len;
    size_t cap;
} buf_t;

static void buf_put(buf_t *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->data = realloc(b->data, b->cap);
        assert_non_null(b->data);
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

static void buf_write_cb(void *ctx, void *data, int size)
{
    buf_put(ctx, data, (size_t)size);
}

/* A w x h image of `comp` channels: smooth gradients plus a few edges. */
static unsigned char *make_pixels(int w, int h, int comp)
{
    unsigned char *px = malloc((size_t)w * h * comp);

    assert_non_null(px);
    for (int y = 0; y < h; y++) {
        for (int x = 0; x < w; x++) {
            for (int c = 0; c < comp; c++) {
                int v = (x * 255 / (w > 1 ? w - 1 : 1) * (c + 1) + y * 255 / (h > 1 ? h - 1 : 1) *
                         (3 - c)) / 4;

                if (c == comp - 1 && (comp == 2 || comp == 4)) {
                    v = (x + y) * 7 % 256; /* alpha */
                }
                px[((size_t)y * w + x) * comp + c] = (unsigned char)(v & 0xff);
            }
        }
    }
    return px;
}

static buf_t make_png(const unsigned char *px, int w, int h, int comp)
{
    buf_t b = {0};

    assert_true(stbi_write_png_to_func(buf_write_cb, &b, w, h, comp, px, w * comp) != 0);
    return b;
}

static buf_t make_jpeg(const unsigned char *px, int w, int h, int comp, int quality)
{
    buf_t b = {0};

    assert_true(stbi_write_jpg_to_func(buf_write_cb, &b, w, h, comp, px, quality) != 0);
    return b;
}

/* The RGB that a comp-channel pixel becomes: grey replicated, alpha dropped. */
static void expect_rgb(const unsigned char *px, int comp, unsigned char rgb[3])
{
    for (int c = 0; c < 3; c++) {
        rgb[c] = comp <= 2 ? px[0] : px[c];
    }
}

static uint32_t crc32_of(const unsigned char *p, size_t n)
{
    uint32_t c = 0xffffffffu;

    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) {
            c = c & 1 ? (c >> 1) ^ 0xedb88320u : c >> 1;
        }
    }
    return c ^ 0xffffffffu;
}

static void put_be32(buf_t *b, uint32_t v)
{
    unsigned char x[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 8), (unsigned char)v};

    buf_put(b, x, 4);
}

static void png_chunk(buf_t *b, const char *type, const unsigned char *data, size_t n)
{
    size_t at;

    put_be32(b, (uint32_t)n);
    at = b->len;
    buf_put(b, type, 4);
    if (n > 0) {
        buf_put(b, data, n);
    }
    put_be32(b, crc32_of(b->data + at, n + 4));
}

/* A PNG of w x h 8-bit RGB pixels declared in IHDR, with `idat` as its data. */
static buf_t crafted_png(uint32_t w, uint32_t h, const unsigned char *idat, size_t idat_len)
{
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
    unsigned char ihdr[13] = {(unsigned char)(w >> 24), (unsigned char)(w >> 16),
                              (unsigned char)(w >> 8),  (unsigned char)w,
                              (unsigned char)(h >> 24), (unsigned char)(h >> 16),
                              (unsigned char)(h >> 8),  (unsigned char)h,
                              8, 2, 0, 0, 0};
    buf_t b = {0};

    buf_put(&b, sig, 8);
    png_chunk(&b, "IHDR", ihdr, sizeof(ihdr));
    png_chunk(&b, "IDAT", idat, idat_len);
    png_chunk(&b, "IEND", NULL, 0);
    return b;
}

/* LSB-first bit writer for a deflate stream. */
typedef struct {
    buf_t out;
    uint32_t acc;
    int n;
} bits_t;

static void bits_put(bits_t *w, uint32_t v, int n)
{
    w->acc |= v << w->n;
    w->n += n;
    while (w->n >= 8) {
        unsigned char c = (unsigned char)w->acc;

        buf_put(&w->out, &c, 1);
        w->acc >>= 8;
        w->n -= 8;
    }
}

/* Fixed-Huffman codes are written most significant bit first. */
static void bits_put_rev(bits_t *w, uint32_t code, int n)
{
    uint32_t r = 0;

    for (int i = 0; i < n; i++) {
        r |= ((code >> i) & 1u) << (n - 1 - i);
    }
    bits_put(w, r, n);
}

/* A zlib stream of one fixed-Huffman block inflating to about `total`
 * zero bytes: a literal 0, then matches of length 258 at distance 1. */
static buf_t zlib_bomb(uint64_t total)
{
    bits_t w = {0};
    unsigned char hdr[2] = {0x78, 0x01};

    buf_put(&w.out, hdr, 2);
    bits_put(&w, 1, 1);          /* BFINAL */
    bits_put(&w, 1, 2);          /* fixed Huffman */
    bits_put_rev(&w, 0x30, 8);   /* literal 0: codes 0..143 are 0x30 + v, 8 bits */
    for (uint64_t done = 1; done + 258 <= total; done += 258) {
        bits_put_rev(&w, 0xc5, 8); /* length code 285 = 258: 280..287 are 0xc0 + (v - 280) */
        bits_put_rev(&w, 0, 5);    /* distance code 0 = 1 */
    }
    bits_put_rev(&w, 0, 7); /* end of block: code 256, 7 bits of 0 */
    bits_put(&w, 0, 7);     /* flush; the adler32 is never reached */
    return w.out;
}

/* ---- tests ------------------------------------------------------------------ */

static void test_png_roundtrip_exact(void **state)
{
    static const int comps[4] = {1, 2, 3, 4};

    (void)state;
    for (int i = 0; i < 4; i++) {
        int w = 37;
        int h = 23;
        unsigned char *px = make_pixels(w, h, comps[i]);
        buf_t f = make_png(px, w, h, comps[i]);
        epd_image_info_t info;
        epd_image_t img;

        assert_int_equal(epd_image_probe(f.data, f.len, &info), EPD_OK);
        assert_int_equal(info.format, EPD_IMAGE_PNG);
        assert_int_equal(info.width, w);
        assert_int_equal(info.height, h);
        assert_int_equal(info.channels, comps[i]);
        assert_int_equal(epd_image_decode(f.data, f.len, 0, &img), EPD_OK);
        assert_int_equal(img.width, w);
        assert_int_equal(img.height, h);
        for (int p = 0; p < w * h; p++) {
            unsigned char want[3];

            expect_rgb(px + (size_t)p * comps[i], comps[i], want);
            if (memcmp(img.rgb + (size_t)p * 3, want, 3) != 0) {
                print_message("comp %d pixel %d: got %u %u %u want %u %u %u\n", comps[i], p,
                              img.rgb[p * 3], img.rgb[p * 3 + 1], img.rgb[p * 3 + 2], want[0],
                              want[1], want[2]);
                fail();
            }
        }
        epd_image_cleanup(&img);
        assert_null(img.rgb);
        epd_image_cleanup(&img); /* twice: a no-op */
        free(f.data);
        free(px);
    }
    epd_image_cleanup(NULL);
}

static void test_jpeg_close(void **state)
{
    static const int comps[3] = {1, 3, 4};

    (void)state;
    for (int i = 0; i < 3; i++) {
        int w = 64;
        int h = 48;
        unsigned char *px = make_pixels(w, h, comps[i]);
        buf_t f = make_jpeg(px, w, h, comps[i], 95);
        epd_image_info_t info;
        epd_image_t img;
        double sum = 0.0;
        int worst = 0;

        assert_int_equal(epd_image_probe(f.data, f.len, &info), EPD_OK);
        assert_int_equal(info.format, EPD_IMAGE_JPEG);
        assert_int_equal(info.width, w);
        assert_int_equal(info.height, h);
        assert_int_equal(epd_image_decode(f.data, f.len, 0, &img), EPD_OK);
        assert_int_equal(img.width, w);
        assert_int_equal(img.height, h);
        for (int p = 0; p < w * h; p++) {
            unsigned char want[3];

            expect_rgb(px + (size_t)p * comps[i], comps[i], want);
            for (int c = 0; c < 3; c++) {
                int d = abs((int)img.rgb[p * 3 + c] - want[c]);

                sum += d;
                worst = d > worst ? d : worst;
            }
        }
        print_message("JPEG of %d channels: mean error %.2f, worst %d\n", comps[i],
                      sum / (w * h * 3), worst);
        assert_true(sum / (w * h * 3) < 3.0);
        assert_true(worst < 48);
        epd_image_cleanup(&img);
        free(f.data);
        free(px);
    }
}

static void test_truncated(void **state)
{
    unsigned char *px = make_pixels(40, 30, 3);
    buf_t png = make_png(px, 40, 30, 3);
    buf_t jpg = make_jpeg(px, 40, 30, 3, 90);
    epd_alloc_stats_t before;
    epd_alloc_stats_t after;
    epd_image_t full;

    (void)state;
    assert_int_equal(epd_image_decode(png.data, png.len, 0, &full), EPD_OK);
    epd_alloc_stats(&before);
    for (size_t n = 0; n < png.len; n++) {
        epd_image_t img;
        epd_status_t st = epd_image_decode(png.data, n, 0, &img);

        if (n < 8) {
            assert_int_equal(st, EPD_ERR_UNSUPPORTED);
        } else if (st == EPD_OK) {
            /* only a cut after the last row's data (in the zlib checksum,
             * the CRC or IEND) may decode, and then to the whole image */
            assert_int_equal(img.width, 40);
            assert_int_equal(img.height, 30);
            assert_memory_equal(img.rgb, full.rgb, 40 * 30 * 3);
            assert_true(n >= png.len - 12 - 4 - 4);
            epd_image_cleanup(&img);
        } else {
            if (st != EPD_ERR_MALFORMED) {
                print_message("PNG cut at %zu of %zu bytes: %s\n", n, png.len,
                              epd_status_name(st));
            }
            assert_int_equal(st, EPD_ERR_MALFORMED);
        }
    }
    for (size_t n = 0; n < jpg.len; n++) {
        epd_image_t img;
        epd_status_t st = epd_image_decode(jpg.data, n, 0, &img);

        /* libjpeg pads a truncated scan with zeros (a warning): a cut
         * inside the pixel data may decode; a cut header never does. */
        if (n < 3) {
            assert_int_equal(st, EPD_ERR_UNSUPPORTED);
        } else if (st == EPD_OK) {
            assert_int_equal(img.width, 40);
            epd_image_cleanup(&img);
        } else {
            assert_int_equal(st, EPD_ERR_MALFORMED);
        }
    }
    epd_alloc_stats(&after);
    assert_int_equal(after.live_blocks, before.live_blocks);
    assert_int_equal(after.live_bytes, before.live_bytes);
    epd_image_cleanup(&full);
    free(png.data);
    free(jpg.data);
    free(px);
}

static void test_random_bytes(void **state)
{
    static const unsigned char png_sig[8] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
    unsigned char *buf = malloc(4096);
    epd_alloc_stats_t before;
    epd_alloc_stats_t after;
    epd_rng_t rng;

    (void)state;
    assert_non_null(buf);
    epd_rng_seed(&rng, 42);
    epd_alloc_stats(&before);
    for (int i = 0; i < 3000; i++) {
        size_t n = epd_rng_next(&rng) % 4096;
        epd_image_info_t info;
        epd_image_t img;
        epd_status_t st;

        for (size_t j = 0; j < n; j++) {
            buf[j] = (unsigned char)epd_rng_next(&rng);
        }
        if (i % 3 == 1 && n >= 8) {
            memcpy(buf, png_sig, 8);
        } else if (i % 3 == 2 && n >= 3) {
            memcpy(buf, "\xff\xd8\xff", 3);
        }
        st = epd_image_probe(buf, n, &info);
        assert_true(st == EPD_OK || st == EPD_ERR_MALFORMED || st == EPD_ERR_UNSUPPORTED);
        st = epd_image_decode(buf, n, 1u << 16, &img);
        assert_true(st == EPD_OK || st == EPD_ERR_MALFORMED || st == EPD_ERR_UNSUPPORTED ||
                    st == EPD_ERR_TOO_LONG);
        if (st == EPD_OK) {
            epd_image_cleanup(&img);
        }
    }
    epd_alloc_stats(&after);
    assert_int_equal(after.live_blocks, before.live_blocks);
    free(buf);
}

static void test_other_formats_unsupported(void **state)
{
    static const char gif[] = "GIF89a\x10\x00\x10\x00\x80\x00\x00\xff\xff\xff\x00\x00\x00!";
    static const char bmp[] = "BM\x46\x00\x00\x00\x00\x00\x00\x00\x36\x00\x00\x00\x28\x00\x00"
                              "\x00\x02\x00\x00\x00\x02\x00\x00\x00\x01\x00\x18\x00";
    static const char text[] = "<html>not an image</html>";
    const char *files[3] = {gif, bmp, text};
    size_t lens[3] = {sizeof(gif) - 1, sizeof(bmp) - 1, sizeof(text) - 1};
    epd_image_info_t info;
    epd_image_t img;

    (void)state;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(epd_image_probe(files[i], lens[i], &info), EPD_ERR_UNSUPPORTED);
        assert_int_equal(epd_image_decode(files[i], lens[i], 0, &img), EPD_ERR_UNSUPPORTED);
    }
    assert_int_equal(epd_image_probe("", 0, &info), EPD_ERR_UNSUPPORTED);
    assert_int_equal(epd_image_probe(NULL, 0, &info), EPD_ERR_UNSUPPORTED);
    assert_int_equal(epd_image_probe(NULL, 5, &info), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_image_probe(gif, 4, NULL), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_image_decode(gif, 4, 0, NULL), EPD_ERR_INVALID_PARAM);
    /* a JPEG kind we do not decode: lossless (SOF3) */
    {
        static const unsigned char sof3[] = {0xff, 0xd8, 0xff, 0xc3, 0x00, 0x0b, 0x08, 0x00,
                                             0x10, 0x00, 0x10, 0x01, 0x01, 0x11, 0x00};

        assert_int_equal(epd_image_probe(sof3, sizeof(sof3), &info), EPD_ERR_UNSUPPORTED);
    }
    assert_string_equal(epd_image_format_name(EPD_IMAGE_PNG), "PNG");
    assert_string_equal(epd_image_format_name(EPD_IMAGE_JPEG), "JPEG");
}

static void test_pixel_guard_allocates_nothing(void **state)
{
    static const unsigned char idat[] = {0x78, 0x01, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01};
    buf_t f = crafted_png(60000, 60000, idat, sizeof(idat));
    epd_alloc_stats_t before;
    epd_alloc_stats_t after;
    epd_image_info_t info;
    epd_image_t img;
    unsigned char *px = make_pixels(64, 64, 3);
    buf_t jpg = make_jpeg(px, 64, 64, 3, 90);

    (void)state;
    print_message("a PNG of %zu bytes declaring 60000 x 60000 pixels\n", f.len);
    assert_true(f.len < 100);
    assert_int_equal(epd_image_probe(f.data, f.len, &info), EPD_OK);
    assert_int_equal(info.width, 60000);
    assert_int_equal(info.height, 60000);
    /* every allocation would fail, and none is even tried */
    epd_alloc_stats(&before);
    epd_alloc_fail_after(0);
    assert_int_equal(epd_image_decode(f.data, f.len, 0, &img), EPD_ERR_TOO_LONG);
    assert_int_equal(epd_image_decode(f.data, f.len, EPD_IMAGE_MAX_PIXELS_DEFAULT, &img),
                     EPD_ERR_TOO_LONG);
    /* a side over EPD_IMAGE_MAX_SIDE (libjpeg's limit, PNG's too), under
     * any pixel limit */
    {
        buf_t wide = crafted_png(EPD_IMAGE_MAX_SIDE + 1, 1, idat, sizeof(idat));
        buf_t tall = crafted_png(1, EPD_IMAGE_MAX_SIDE + 1, idat, sizeof(idat));

        assert_int_equal(epd_image_decode(wide.data, wide.len, UINT64_MAX, &img), EPD_ERR_TOO_LONG);
        assert_int_equal(epd_image_decode(tall.data, tall.len, UINT64_MAX, &img), EPD_ERR_TOO_LONG);
        free(wide.data);
        free(tall.data);
    }
    /* a real JPEG just over a small limit */
    assert_int_equal(epd_image_decode(jpg.data, jpg.len, 64 * 64 - 1, &img), EPD_ERR_TOO_LONG);
    epd_alloc_fail_after(-1);
    epd_alloc_stats(&after);
    assert_int_equal(after.failed, before.failed);
    assert_int_equal(after.total_allocs, before.total_allocs);
    assert_int_equal(epd_image_decode(jpg.data, jpg.len, 64 * 64, &img), EPD_OK);
    epd_image_cleanup(&img);
    free(jpg.data);
    free(px);
    free(f.data);
}

static void test_zlib_bomb_bounded(void **state)
{
    buf_t z = zlib_bomb(1ull << 30);
    buf_t f = crafted_png(16, 16, z.data, z.len);
    epd_alloc_stats_t before;
    epd_alloc_stats_t after;
    struct rusage r0;
    struct rusage r1;
    epd_image_t img;

    (void)state;
    print_message("a 16 x 16 PNG of %zu bytes inflating to 1 GiB\n", f.len);
    epd_alloc_stats(&before);
    assert_int_equal(getrusage(RUSAGE_SELF, &r0), 0);
    /* libspng inflates into the image's own rows and stops when they are
     * full: the 16 rows of zeros are the image, the rest is never inflated
     * (stb_image, used before, grew a buffer for all of it) */
    assert_int_equal(epd_image_decode(f.data, f.len, 0, &img), EPD_OK);
    assert_int_equal(getrusage(RUSAGE_SELF, &r1), 0);
    assert_int_equal(img.width, 16);
    assert_int_equal(img.height, 16);
    for (size_t i = 0; i < 16 * 16 * 3; i++) {
        assert_int_equal(img.rgb[i], 0);
    }
    epd_image_cleanup(&img);
    epd_alloc_stats(&after);
    assert_int_equal(after.live_blocks, before.live_blocks);
    assert_int_equal(after.failed, before.failed);
    print_message("peak resident memory grew by %ld KiB\n", r1.ru_maxrss - r0.ru_maxrss);
    assert_true(r1.ru_maxrss - r0.ru_maxrss < 256 * 1024);
    free(f.data);
    free(z.data);
}

static void test_jpeg_bad_huffman_table(void **state)
{
    /* a DHT whose code counts add up to more than 256 (stb 2.27, used
     * before, overflowed its tables: found by fuzz_epd_image), a table
     * whose counts lie past its segment, a scan using an undefined table:
     * all refused by libjpeg. */
    unsigned char *px = make_pixels(32, 32, 3);
    buf_t f = make_jpeg(px, 32, 32, 3, 90);
    epd_image_t img;
    size_t i;

    (void)state;
    assert_int_equal(epd_image_decode(f.data, f.len, 0, &img), EPD_OK);
    epd_image_cleanup(&img);
    for (i = 2; i + 21 < f.len; i++) {
        if (f.data[i] == 0xff && f.data[i + 1] == 0xc4) {
            break;
        }
    }
    assert_true(i + 21 < f.len);
    memset(f.data + i + 5, 0xff, 16); /* 16 x 255 codes in the first table */
    assert_int_equal(epd_image_decode(f.data, f.len, 0, &img), EPD_ERR_MALFORMED);
    free(f.data);
    free(px);
    {
        /* a table whose header starts inside the DHT segment but whose
         * code counts lie past its end: here the 16 fill bytes before the
         * frame header. */
        static const unsigned char jpg[] = {
            0xff, 0xd8,                               /* SOI */
            0xff, 0xc4, 0x00, 0x15,                   /* DHT of 21 bytes */
            0x00, 1,    0,    0,    0,    0,    0,    0,    0, 0, 0, 0, 0, 0, 0, 0, 0,
            0x00,                                     /* table 1: one code */
            0x01,                                     /* table 2 starts... */
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* ...its counts: fill bytes */
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0xc0, 0x00, 0x0b, 0x08, 0x00, 0x10, 0x00, 0x10, 0x01, 0x01, 0x11, 0x00, /* SOF0 */
            0xff, 0xd9,                               /* EOI */
        };
        epd_image_info_t info;

        assert_int_equal(epd_image_probe(jpg, sizeof(jpg), &info), EPD_OK);
        assert_int_equal(info.width, 16);
        assert_int_equal(epd_image_decode(jpg, sizeof(jpg), 0, &img), EPD_ERR_MALFORMED);
    }
    /* a scan naming Huffman tables no DHT defined (stb decoded with
     * whatever its unzeroed tables held: found by fuzz_epd_image) */
    px = make_pixels(32, 32, 3);
    f = make_jpeg(px, 32, 32, 3, 90);
    for (i = 2; i + 6 < f.len; i++) {
        if (f.data[i] == 0xff && f.data[i + 1] == 0xda) {
            break;
        }
    }
    assert_true(i + 6 < f.len);
    f.data[i + 6] = 0x33; /* component 1: DC table 3, AC table 3 */
    assert_int_equal(epd_image_decode(f.data, f.len, 0, &img), EPD_ERR_MALFORMED);
    free(f.data);
    free(px);
}

static void check_alloc_failures(const buf_t *f, const char *what)
{
    long n;

    for (n = 0; n < 10000; n++) {
        epd_alloc_stats_t before;
        epd_alloc_stats_t after;
        epd_image_t img;
        epd_status_t st;

        epd_alloc_stats(&before);
        epd_alloc_fail_after(n);
        st = epd_image_decode(f->data, f->len, 0, &img);
        epd_alloc_fail_after(-1);
        epd_alloc_stats(&after);
        if (st == EPD_OK) {
            epd_image_cleanup(&img);
            break;
        }
        if (st != EPD_ERR_NO_MEMORY) {
            print_message("%s: allocation %ld failing gave %s\n", what, n, epd_status_name(st));
        }
        assert_int_equal(st, EPD_ERR_NO_MEMORY);
        assert_int_equal(after.live_blocks, before.live_blocks);
    }
    print_message("%s decoded after %ld failed allocations\n", what, n);
    assert_true(n > 0 && n < 10000);
}

static void test_allocation_failures(void **state)
{
    unsigned char *px3 = make_pixels(50, 40, 3);
    unsigned char *px1 = make_pixels(50, 40, 1);
    unsigned char *px4 = make_pixels(50, 40, 4);
    buf_t files[4] = {make_png(px3, 50, 40, 3), make_png(px1, 50, 40, 1),
                      make_png(px4, 50, 40, 4), make_jpeg(px3, 50, 40, 3, 80)};
    const char *names[4] = {"RGB PNG", "grey PNG", "RGBA PNG", "JPEG"};

    (void)state;
    for (int i = 0; i < 4; i++) {
        check_alloc_failures(&files[i], names[i]);
        free(files[i].data);
    }
    free(px1);
    free(px3);
    free(px4);
}

/* ---- libjpeg-made files --------------------------------------------------- */

/* A w x h JPEG of `comps` components (1 grey, 3 RGB, 4 CMYK) from libjpeg's
 * encoder: progressive with `script` (n_scans entries) when given, or
 * libjpeg's standard progression when n_scans < 0, else baseline.  The
 * bytes are malloc'ed (free). */
static buf_t libjpeg_make(const unsigned char *px, int w, int h, int comps,
                          const jpeg_scan_info *script, int n_scans)
{
    struct jpeg_compress_struct ci;
    struct jpeg_error_mgr jerr;
    unsigned char *out = NULL;
    unsigned long out_len = 0;
    buf_t b = {0};

    ci.err = jpeg_std_error(&jerr); /* errors exit: a test bug */
    jpeg_create_compress(&ci);
    jpeg_mem_dest(&ci, &out, &out_len);
    ci.image_width = (JDIMENSION)w;
    ci.image_height = (JDIMENSION)h;
    ci.input_components = comps;
    ci.in_color_space = comps == 1 ? JCS_GRAYSCALE : comps == 3 ? JCS_RGB : JCS_CMYK;
    jpeg_set_defaults(&ci);
    jpeg_set_quality(&ci, 95, TRUE);
    if (n_scans < 0) {
        jpeg_simple_progression(&ci);
    } else if (n_scans > 0) {
        ci.scan_info = script;
        ci.num_scans = n_scans;
    }
    jpeg_start_compress(&ci, TRUE);
    while (ci.next_scanline < ci.image_height) {
        JSAMPROW row = (JSAMPROW)(px + (size_t)ci.next_scanline * w * comps);

        jpeg_write_scanlines(&ci, &row, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    b.data = out;
    b.len = b.cap = out_len;
    return b;
}

/* Mean and worst difference of img from the RGB in want[w*h*3]. */
static void compare_rgb(const epd_image_t *img, const unsigned char *want, int w, int h,
                        const char *what, double mean_max, int worst_max)
{
    double sum = 0.0;
    int worst = 0;

    assert_int_equal(img->width, w);
    assert_int_equal(img->height, h);
    for (size_t i = 0; i < (size_t)w * h * 3; i++) {
        int d = abs((int)img->rgb[i] - want[i]);

        sum += d;
        worst = d > worst ? d : worst;
    }
    print_message("%s: mean error %.2f, worst %d\n", what, sum / (w * h * 3), worst);
    assert_true(sum / (w * h * 3) < mean_max);
    assert_true(worst <= worst_max);
}

static void test_jpeg_progressive_and_cmyk(void **state)
{
    int w = 48;
    int h = 40;
    unsigned char *px = make_pixels(w, h, 3);
    unsigned char *cmyk = malloc((size_t)w * h * 4);
    unsigned char *want = malloc((size_t)w * h * 3);
    buf_t f;
    epd_image_t img;

    (void)state;
    assert_non_null(cmyk);
    assert_non_null(want);
    /* progressive RGB */
    f = libjpeg_make(px, w, h, 3, NULL, -1);
    assert_int_equal(epd_image_decode(f.data, f.len, 0, &img), EPD_OK);
    compare_rgb(&img, px, w, h, "progressive JPEG", 3.0, 48);
    epd_image_cleanup(&img);
    free(f.data);
    /* CMYK (Adobe's inverted convention, as Photoshop writes it): each
     * channel times K */
    for (size_t p = 0; p < (size_t)w * h; p++) {
        unsigned char k = (unsigned char)(255 - (p % 64));

        for (int c = 0; c < 3; c++) {
            cmyk[p * 4 + c] = px[p * 3 + c];
            want[p * 3 + c] = (unsigned char)((px[p * 3 + c] * k + 127) / 255);
        }
        cmyk[p * 4 + 3] = k;
    }
    f = libjpeg_make(cmyk, w, h, 4, NULL, 0);
    assert_int_equal(epd_image_decode(f.data, f.len, 0, &img), EPD_OK);
    compare_rgb(&img, want, w, h, "CMYK JPEG", 4.0, 64);
    epd_image_cleanup(&img);
    free(f.data);
    free(want);
    free(cmyk);
    free(px);
}

/* A valid progressive script for one grey component: the DC scan, then
 * for each AC coefficient 1..n_coefs a first scan at Al 10 and its ten
 * refinements: 1 + 11 n_coefs scans. */
static int many_scans(jpeg_scan_info *s, int n_coefs)
{
    int n = 0;

    s[n++] = (jpeg_scan_info){
        .comps_in_scan = 1, .component_index = {0}, .Ss = 0, .Se = 0, .Ah = 0, .Al = 0};
    for (int k = 1; k <= n_coefs; k++) {
        s[n++] = (jpeg_scan_info){.comps_in_scan = 1, .Ss = k, .Se = k, .Ah = 0, .Al = 10};
        for (int al = 9; al >= 0; al--) {
            s[n++] = (jpeg_scan_info){.comps_in_scan = 1, .Ss = k, .Se = k, .Ah = al + 1, .Al = al};
        }
    }
    return n;
}

static void test_jpeg_scan_limit(void **state)
{
    static jpeg_scan_info script[1 + 63 * 11];
    unsigned char *px = make_pixels(16, 16, 1);
    epd_image_t img;
    buf_t f;
    int n;

    (void)state;
    /* 397 scans: a valid file, decoded */
    n = many_scans(script, 36);
    assert_int_equal(n, 397);
    f = libjpeg_make(px, 16, 16, 1, script, n);
    assert_int_equal(epd_image_decode(f.data, f.len, 0, &img), EPD_OK);
    epd_image_cleanup(&img);
    free(f.data);
    /* 694 scans: as valid, but over the limit of 500 (a CPU bomb at scale) */
    n = many_scans(script, 63);
    assert_int_equal(n, 694);
    f = libjpeg_make(px, 16, 16, 1, script, n);
    assert_int_equal(epd_image_decode(f.data, f.len, 0, &img), EPD_ERR_MALFORMED);
    free(f.data);
    free(px);
}

/* ---- the same answer for the same bytes ---------------------------------- */

/* Frees C-heap chunks full of `byte` of the sizes decoders ask for, so the
 * next mallocs of those sizes may get them back. */
static void dirty_heap(int byte)
{
    static const size_t sizes[] = {64, 512, 4096, 20000, 70000, 300000};
    void *p[sizeof(sizes) / sizeof(sizes[0])];

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        p[i] = malloc(sizes[i]);
        assert_non_null(p[i]);
        memset(p[i], byte, sizes[i]);
    }
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        free(p[i]);
    }
}

/* Decodes f `rounds` times, fresh memory alternately all 0x00 and all
 * 0xff (epd_alloc_fill_with, and the C heap): every decode must be refused
 * with `want`.  Returns nothing; fails the test otherwise. */
static void expect_same_refusal(const unsigned char *data, size_t len, epd_status_t want,
                                const char *what)
{
    for (int round = 0; round < 20; round++) {
        int fill = round % 2 ? 0xff : 0x00;
        epd_image_t img;
        epd_status_t st;

        dirty_heap(fill);
        epd_alloc_fill_with(fill);
        st = epd_image_decode(data, len, 0, &img);
        epd_alloc_fill_with(-1);
        if (st != want) {
            print_message("%s, round %d (fresh memory 0x%02x): %s, want %s\n", what, round, fill,
                          epd_status_name(st), epd_status_name(want));
            if (st == EPD_OK) {
                epd_image_cleanup(&img);
            }
            fail();
        }
    }
}

static void test_jpeg_without_quant_tables(void **state)
{
    unsigned char *px = make_pixels(32, 24, 3);
    buf_t f = make_jpeg(px, 32, 24, 3, 90);
    size_t out = 2;
    char path[4096];
    unsigned char repro[4096];
    size_t repro_len;
    FILE *fp;

    (void)state;
    /* a good JPEG with its DQT segments cut out: every component names a
     * quantization table that was never defined */
    for (size_t i = 2; i + 4 <= f.len;) {
        size_t seg = (size_t)f.data[i + 2] << 8 | f.data[i + 3];

        assert_int_equal(f.data[i], 0xff);
        if (f.data[i + 1] == 0xda) { /* the scan: the rest as it is */
            memmove(f.data + out, f.data + i, f.len - i);
            out += f.len - i;
            break;
        }
        if (f.data[i + 1] != 0xdb) {
            memmove(f.data + out, f.data + i, 2 + seg);
            out += 2 + seg;
        }
        i += 2 + seg;
    }
    assert_true(out < f.len);
    expect_same_refusal(f.data, out, EPD_ERR_MALFORMED, "JPEG without its DQT");
    /* fuzz_epd_image's finding: the same greedy request gave 4 different
     * answers in 6 runs of epd-generate with stb_image */
    snprintf(path, sizeof(path), "%s/fuzz_epd_image/noquant-uninit.jpg", EPD_TEST_FUZZ_CORPUS);
    fp = fopen(path, "rb");
    assert_non_null(fp);
    repro_len = fread(repro, 1, sizeof(repro), fp);
    fclose(fp);
    assert_int_equal(repro_len, 658);
    expect_same_refusal(repro, repro_len, EPD_ERR_MALFORMED, "fuzz reproducer");
    free(f.data);
    free(px);
}

/* ---- limits ---------------------------------------------------------------- */

static void test_pixel_limit_inclusive(void **state)
{
    unsigned char *px = make_pixels(37, 23, 3);
    buf_t files[2] = {make_png(px, 37, 23, 3), make_jpeg(px, 37, 23, 3, 90)};

    (void)state;
    for (int i = 0; i < 2; i++) {
        epd_image_t img;

        /* exactly at the limit: accepted */
        assert_int_equal(epd_image_decode(files[i].data, files[i].len, 37 * 23, &img), EPD_OK);
        assert_int_equal(img.width, 37);
        assert_int_equal(img.height, 23);
        epd_image_cleanup(&img);
        /* one pixel over it: refused for its size */
        assert_int_equal(epd_image_decode(files[i].data, files[i].len, 37 * 23 - 1, &img),
                         EPD_ERR_TOO_LONG);
        free(files[i].data);
    }
    free(px);
}

static void test_size_checked_before_format(void **state)
{
    /* more bytes than the decoder reads is a size error whatever they are:
     * random bytes, or a PNG signature.  The buffer is small: the length
     * alone must refuse it, nothing past it is read. */
    static const unsigned char png_sig[8] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
    unsigned char buf[64];
    epd_rng_t rng;
    epd_image_t img;

    (void)state;
    epd_rng_seed(&rng, 7);
    for (size_t i = 0; i < sizeof(buf); i++) {
        buf[i] = (unsigned char)epd_rng_next(&rng);
    }
    buf[0] = 'x'; /* neither PNG nor JPEG */
    assert_int_equal(epd_image_decode(buf, EPD_IMAGE_MAX_BYTES + 1, 0, &img), EPD_ERR_TOO_LONG);
    assert_int_equal(epd_image_decode(buf, SIZE_MAX, 0, &img), EPD_ERR_TOO_LONG);
    memcpy(buf, png_sig, sizeof(png_sig));
    assert_int_equal(epd_image_decode(buf, EPD_IMAGE_MAX_BYTES + 1, 0, &img), EPD_ERR_TOO_LONG);
    /* at the limit the format is looked at (and these bytes are not one) */
    buf[0] = 'x';
    assert_int_equal(epd_image_decode(buf, sizeof(buf), 0, &img), EPD_ERR_UNSUPPORTED);
}

typedef struct {
    const buf_t *files;
    const epd_image_t *want;
    int errors;
} thread_arg_t;

static void *decode_thread(void *p)
{
    thread_arg_t *a = p;

    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < 2; i++) {
            epd_image_t img;

            if (epd_image_decode(a->files[i].data, a->files[i].len, 0, &img) != EPD_OK) {
                a->errors++;
                continue;
            }
            if (img.width != a->want[i].width ||
                memcmp(img.rgb, a->want[i].rgb, (size_t)img.width * img.height * 3) != 0) {
                a->errors++;
            }
            epd_image_cleanup(&img);
        }
    }
    return NULL;
}

static void test_concurrent_decodes(void **state)
{
    unsigned char *px = make_pixels(96, 64, 3);
    buf_t files[2] = {make_png(px, 96, 64, 3), make_jpeg(px, 96, 64, 3, 85)};
    epd_image_t want[2];
    pthread_t th[4];
    thread_arg_t args[4];

    (void)state;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(epd_image_decode(files[i].data, files[i].len, 0, &want[i]), EPD_OK);
    }
    for (int t = 0; t < 4; t++) {
        args[t] = (thread_arg_t){.files = files, .want = want};
        assert_int_equal(pthread_create(&th[t], NULL, decode_thread, &args[t]), 0);
    }
    for (int t = 0; t < 4; t++) {
        assert_int_equal(pthread_join(th[t], NULL), 0);
        assert_int_equal(args[t].errors, 0);
    }
    for (int i = 0; i < 2; i++) {
        epd_image_cleanup(&want[i]);
        free(files[i].data);
    }
    free(px);
}

/* After each test, pass or fail: a failed assertion must not leave
 * allocation failures or fills on for the tests after it. */
static int reset_alloc(void **state)
{
    (void)state;
    epd_alloc_fail_after(-1);
    epd_alloc_fill_with(-1);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_png_roundtrip_exact, reset_alloc),
        cmocka_unit_test_teardown(test_jpeg_close, reset_alloc),
        cmocka_unit_test_teardown(test_truncated, reset_alloc),
        cmocka_unit_test_teardown(test_random_bytes, reset_alloc),
        cmocka_unit_test_teardown(test_other_formats_unsupported, reset_alloc),
        cmocka_unit_test_teardown(test_pixel_guard_allocates_nothing, reset_alloc),
        cmocka_unit_test_teardown(test_zlib_bomb_bounded, reset_alloc),
        cmocka_unit_test_teardown(test_jpeg_bad_huffman_table, reset_alloc),
        cmocka_unit_test_teardown(test_jpeg_progressive_and_cmyk, reset_alloc),
        cmocka_unit_test_teardown(test_jpeg_scan_limit, reset_alloc),
        cmocka_unit_test_teardown(test_jpeg_without_quant_tables, reset_alloc),
        cmocka_unit_test_teardown(test_pixel_limit_inclusive, reset_alloc),
        cmocka_unit_test_teardown(test_size_checked_before_format, reset_alloc),
        cmocka_unit_test_teardown(test_allocation_failures, reset_alloc),
        cmocka_unit_test_teardown(test_concurrent_decodes, reset_alloc),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* gcc checks for static functions declared but never defined (the HDR
 * writer, compiled out) at the end of the file. */
#pragma GCC diagnostic ignored "-Wunused-function"
