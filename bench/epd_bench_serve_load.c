/*
 * epd_bench_serve_load.c — `epd-bench serve`'s workload: Poisson arrivals,
 * prompt and output lengths ("N" or "A:B" uniform), the prompts' text, the
 * long prompts of the long-mixed workload, the multimodal mix's PNGs, and
 * the direct path's token ids.  Everything from one seed (splitmix64), so
 * every phase and every run with the same options sends the same work.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

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

#include "epd_alloc.h"
#include "epd_bench_serve_int.h"
#include "epd_engine.h"

/* ------------------------------------------------------- distributions */

/* "N" or "A:B" (uniform, inclusive). */
static int sv_dist_parse(const char *s, uint32_t *lo_p, uint32_t *hi_p)
{
    char *end;
    unsigned long a, c;

    errno = 0;
    a = strtoul(s, &end, 10);
    if (errno != 0 || end == s || a == 0 || a > 1000000) {
        return -1;
    }
    if (*end == '\0') {
        *lo_p = *hi_p = (uint32_t)a;
        return 0;
    }
    if (*end != ':') {
        return -1;
    }
    s = end + 1;
    c = strtoul(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || c < a || c > 1000000) {
        return -1;
    }
    *lo_p = (uint32_t)a;
    *hi_p = (uint32_t)c;
    return 0;
}

static uint64_t sv_rand(uint64_t *s)
{
    /* splitmix64: the workload must be the same for every phase and run */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double sv_rand01(uint64_t *s)
{
    return ((double)(sv_rand(s) >> 11) + 0.5) / 9007199254740992.0;
}

int epd__sv_workload(sv_t *b)
{
    uint32_t plo, phi, olo, ohi;
    uint64_t s = (uint64_t)b->seed;
    double t = 0;
    static const char chars[] =
        "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ.,;0123456789 the and of ";

    if (sv_dist_parse(b->prompt_len, &plo, &phi) != 0 ||
        sv_dist_parse(b->output_len, &olo, &ohi) != 0) {
        fprintf(stderr, "serve: --prompt-len/--output-len: want N or A:B (1..1000000)\n");
        return -1;
    }
    if (phi >= SV_TEXT_BYTES / 2 || b->long_len >= SV_TEXT_BYTES / 2) {
        fprintf(stderr, "serve: prompts up to %u bytes\n", SV_TEXT_BYTES / 2);
        return -1;
    }
    if (b->long_every > 0 && b->long_len == 0) {
        fprintf(stderr, "serve: --long-every needs --long-len\n");
        return -1;
    }
    b->n_work = (uint32_t)ceil(b->rate * b->duration_s);
    if (b->n_work == 0) {
        b->n_work = 1;
    }
    b->text = epd_malloc(SV_TEXT_BYTES);
    b->work = epd_calloc(b->n_work, sizeof(*b->work));
    b->deferred = epd_calloc(b->n_work, sizeof(*b->deferred));
    if (b->text == NULL || b->work == NULL || b->deferred == NULL) {
        return -1;
    }
    for (uint32_t i = 0; i < SV_TEXT_BYTES; i++) {
        b->text[i] = chars[sv_rand(&s) % (sizeof(chars) - 1)];
    }
    for (uint32_t i = 0; i < b->n_work; i++) {
        sv_work_t *w = &b->work[i];

        t += -log(sv_rand01(&s)) / b->rate;
        w->at_ns = (uint64_t)(t * 1e9);
        w->text_len = plo + (uint32_t)(sv_rand(&s) % (phi - plo + 1));
        w->text_off = (uint32_t)(sv_rand(&s) % (SV_TEXT_BYTES - w->text_len));
        w->max_tokens = olo + (uint32_t)(sv_rand(&s) % (ohi - olo + 1));
        w->seed = sv_rand(&s);
        /* drawn like the others first, so the short prompts around it are
         * the same as in a run without long prompts */
        if (b->long_every > 0 && i % (uint32_t)b->long_every == (uint32_t)b->long_every - 1) {
            w->is_long = 1;
            w->text_len = (uint32_t)b->long_len;
            w->text_off = (uint32_t)(sv_rand(&s) % (SV_TEXT_BYTES - w->text_len));
        }
        w->image = -1;
        if (b->n_images > 0) {
            /* each path its own pool of --images distinct images (a cache
             * hit on one path is never a miss filled by the other) */
            w->image = (int32_t)((i & 1u) * (uint32_t)b->n_images +
                                 (uint32_t)(sv_rand(&s) % (uint64_t)b->n_images));
        }
    }
    return 0;
}

/* ------------------------------------------------------------ images */

typedef struct {
    unsigned char *data;
    size_t len, cap;
} sv_png_t;

static void sv_png_write(void *ctx, void *data, int size)
{
    sv_png_t *p = ctx;

    if (size <= 0 || p->data == NULL) {
        return;
    }
    if (p->len + (size_t)size > p->cap) {
        size_t cap = (p->len + (size_t)size) * 2;
        unsigned char *n = epd_realloc(p->data, cap);

        if (n == NULL) {
            epd_free(p->data);
            p->data = NULL;
            return;
        }
        p->data = n;
        p->cap = cap;
    }
    memcpy(p->data + p->len, data, (size_t)size);
    p->len += (size_t)size;
}

/* 2 x --images distinct PNGs (seeded noise over colour bands, one pool per
 * path), as data: URLs ready to go into a request body. */
int epd__sv_images_make(sv_t *b)
{
    uint32_t n = 2 * (uint32_t)b->n_images;
    int side = (int)b->image_size;
    unsigned char *px = epd_malloc((size_t)side * side * 3);

    b->img_url = epd_calloc(n, sizeof(*b->img_url));
    b->img_url_len = epd_calloc(n, sizeof(*b->img_url_len));
    if (px == NULL || b->img_url == NULL || b->img_url_len == NULL) {
        epd_free(px);
        return -1;
    }
    for (uint32_t k = 0; k < n; k++) {
        uint64_t s = (uint64_t)b->seed * 1000003u + k + 1;
        sv_png_t png = {epd_malloc(1 << 16), 0, 1 << 16};
        size_t b64;

        for (int i = 0; i < side * side; i++) {
            uint64_t r = sv_rand(&s);

            px[3 * i] = (unsigned char)((i % side) * 2 + (r & 0x3f));
            px[3 * i + 1] = (unsigned char)((i / side) * 3 + ((r >> 8) & 0x3f));
            px[3 * i + 2] = (unsigned char)(k * 37 + ((r >> 16) & 0x3f));
        }
        if (png.data == NULL ||
            !stbi_write_png_to_func(sv_png_write, &png, side, side, 3, px, side * 3) ||
            png.data == NULL) {
            epd_free(png.data);
            epd_free(px);
            return -1;
        }
        b64 = sodium_base64_encoded_len(png.len, sodium_base64_VARIANT_ORIGINAL);
        b->img_url[k] = epd_malloc(b64 + 32);
        if (b->img_url[k] == NULL) {
            epd_free(png.data);
            epd_free(px);
            return -1;
        }
        memcpy(b->img_url[k], "data:image/png;base64,", 22);
        sodium_bin2base64(b->img_url[k] + 22, b64, png.data, png.len,
                          sodium_base64_VARIANT_ORIGINAL);
        b->img_url_len[k] = strlen(b->img_url[k]);
        epd_free(png.data);
    }
    epd_free(px);
    return 0;
}

void epd__sv_images_free(sv_t *b)
{
    for (int64_t k = 0; b->img_url != NULL && k < 2 * b->n_images; k++) {
        epd_free(b->img_url[k]);
    }
    epd_free(b->img_url);
    epd_free(b->img_url_len);
}

int epd__sv_tokenize(sv_t *b)
{
    epd_engine_config_t ec;
    epd_engine_t *e = NULL;
    epd_status_t st;

    memset(&ec, 0, sizeof(ec));
    ec.model_dir = b->model_dir;
    ec.block_tokens = 16;
    ec.max_batch = 1;
    st = epd_engine_open(b->engine_name, &ec, &e);
    if (st != EPD_OK) {
        fprintf(stderr, "serve: cannot open the model %s (engine %s) to tokenize: %s\n",
                b->model_dir, b->engine_name, epd_status_string(st));
        return -1;
    }
    for (uint32_t i = 0; i < b->n_work; i++) {
        sv_work_t *w = &b->work[i];
        size_t cap = w->text_len * 4 + 64, n = 0;
        char *chat = NULL;
        const char *text = b->text + w->text_off;
        size_t len = w->text_len;

        if (b->chat) {
            /* the router's chat template (docs/api.md), one user message */
            chat = epd_malloc(w->text_len + 64);
            if (chat == NULL) {
                epd_engine_close(e);
                return -1;
            }
            len = (size_t)snprintf(chat, w->text_len + 64, "<|user|>\n%.*s\n<|assistant|>\n",
                                   (int)w->text_len, text);
            text = chat;
        }
        w->tokens = epd_malloc(cap * sizeof(int32_t));
        st = w->tokens != NULL ? epd_engine_tokenize(e, text, len, 1, w->tokens, cap, &n)
                               : EPD_ERR_NO_MEMORY;
        epd_free(chat);
        if (st != EPD_OK) {
            epd_engine_close(e);
            return -1;
        }
        w->n_tokens = (uint32_t)n;
    }
    epd_engine_close(e);
    return 0;
}
