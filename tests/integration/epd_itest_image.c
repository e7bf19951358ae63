/*
 * epd_itest_image.c — `epd-itest-image KIND OUT [W H SEED]`: writes a test
 * image for the multimodal integration tests (stb_image_write).
 *
 *   png  OUT W H SEED   an RGB PNG of seeded noise (stripes of colour and
 *                       noise, so two seeds give two different images)
 *   jpeg OUT W H SEED   the same picture as a JPEG (quality 90)
 *   bomb OUT            a valid PNG signature and header declaring 60000 x
 *                       60000 pixels, and almost nothing after it: a
 *                       decompression bomb's header
 *   text OUT            bytes that are no image at all
 *
 * Exit 0, or 1 with a line on stderr.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop

#include "epd_rng.h"

static int itest_fail(const char *what)
{
    fprintf(stderr, "epd-itest-image: %s\n", what);
    return 1;
}

static void put32be(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static int itest_bomb(const char *out)
{
    /* signature, IHDR(60000 x 60000, 8-bit RGB), an empty IDAT, IEND; the
     * CRCs are left zero (a header probe refuses it by size first) */
    unsigned char b[8 + 25 + 12 + 12];
    FILE *f;

    memset(b, 0, sizeof(b));
    memcpy(b, "\x89PNG\r\n\x1a\n", 8);
    put32be(b + 8, 13);
    memcpy(b + 12, "IHDR", 4);
    put32be(b + 16, 60000);
    put32be(b + 20, 60000);
    b[24] = 8; /* bit depth */
    b[25] = 2; /* RGB */
    put32be(b + 33, 0);
    memcpy(b + 37, "IDAT", 4);
    put32be(b + 45, 0);
    memcpy(b + 49, "IEND", 4);
    f = fopen(out, "wb");
    if (f == NULL || fwrite(b, 1, sizeof(b), f) != sizeof(b) || fclose(f) != 0) {
        return itest_fail("cannot write the file");
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *kind, *out;
    unsigned char *px;
    epd_rng_t rng;
    int w, h, ok;

    if (argc < 3) {
        return itest_fail("usage: epd-itest-image png|jpeg|bomb|text OUT [W H SEED]");
    }
    kind = argv[1];
    out = argv[2];
    if (strcmp(kind, "bomb") == 0) {
        return itest_bomb(out);
    }
    if (strcmp(kind, "text") == 0) {
        FILE *f = fopen(out, "wb");

        if (f == NULL || fputs("this is not an image, only some text\n", f) == EOF ||
            fclose(f) != 0) {
            return itest_fail("cannot write the file");
        }
        return 0;
    }
    if (argc != 6) {
        return itest_fail("png/jpeg need OUT W H SEED");
    }
    w = atoi(argv[3]);
    h = atoi(argv[4]);
    if (w < 1 || h < 1 || w > 4096 || h > 4096) {
        return itest_fail("width and height must be 1..4096");
    }
    px = malloc((size_t)w * h * 3);
    if (px == NULL) {
        return itest_fail("out of memory");
    }
    epd_rng_seed(&rng, strtoull(argv[5], NULL, 10));
    {
        uint64_t base = epd_rng_next(&rng);

        for (int y = 0; y < h; y++) {
            for (int x = 0; x < w; x++) {
                unsigned char *p = px + ((size_t)y * w + x) * 3;
                uint64_t r = epd_rng_next(&rng);

                /* smooth colour bands from the seed, plus some noise */
                p[0] = (unsigned char)(((base >> 0) & 0xff) + x * 3 + (r & 0x1f));
                p[1] = (unsigned char)(((base >> 8) & 0xff) + y * 5 + ((r >> 8) & 0x1f));
                p[2] = (unsigned char)(((base >> 16) & 0xff) + (x ^ y) + ((r >> 16) & 0x1f));
            }
        }
    }
    if (strcmp(kind, "png") == 0) {
        ok = stbi_write_png(out, w, h, 3, px, w * 3);
    } else if (strcmp(kind, "jpeg") == 0) {
        ok = stbi_write_jpg(out, w, h, 3, px, 90);
    } else {
        free(px);
        return itest_fail("kind must be png, jpeg, bomb or text");
    }
    free(px);
    if (!ok) {
        return itest_fail("stb_image_write failed");
    }
    return 0;
}
