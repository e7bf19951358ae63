/*
 * test_epd_ref_vision.c — the `ref` engine's vision encoder and multimodal
 * prefill: the encoder against a double-precision re-implementation written
 * here from epd_ref_model.h (resize, patches, ViT blocks, merger, projector)
 * for tiny models with a 2 x 2 and a 3 x 3 merge; embedding spans in
 * prefill (a span of token embeddings equals the text, images change the
 * logits, a span straddling a chunk boundary equals one call), every span
 * refusal (nothing written), epd_engine_tokenize_images, the vision_config
 * checks, text-only model folders as before, allocation failures.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_engine.h"
#include "epd_image.h"
#include "epd_mkmodel.h"
#include "epd_ref_model.h"
#include "epd_safetensors.h"
#include "epd_test_engine_util.h"

#define TOL 1e-4
#define VOCAB 259

static const char *tmpdir;
static const char *vis_dir;  /* tiny + vision, 2 x 2 merge: 4 embeddings of 32 */
static const char *vis3_dir; /* 24-pixel images, 4-pixel patches, 3 x 3 merge: 4 embeddings */
static const char *text_dir; /* tiny text only (vocab 258) */
static epd_mkmodel_params_t vis_p;
static epd_mkmodel_params_t vis3_p;

/* ---- the double-precision reference ---------------------------------------- */

typedef struct {
    epd_ref_hparams_t hp;
    size_t n_lm;
    double **w; /* vision tensors, in spec order */
} ref_vision_t;

static void ref_load(ref_vision_t *m, const char *dir, const epd_ref_hparams_t *hp)
{
    size_t n = epd_ref_tensor_count(hp);
    epd_st_file_t *f;

    m->hp = *hp;
    m->n_lm = epd_ref_lm_tensor_count(hp);
    m->w = calloc(n - m->n_lm, sizeof(*m->w));
    assert_non_null(m->w);
    assert_int_equal(epd_st_open(epd_test_path(dir, "model.safetensors"), &f), EPD_OK);
    for (size_t i = m->n_lm; i < n; i++) {
        epd_ref_tensor_spec_t s;
        float *tmp;

        epd_ref_tensor_spec(hp, i, &s);
        tmp = malloc(s.n_elems * sizeof(float));
        m->w[i - m->n_lm] = malloc(s.n_elems * sizeof(double));
        assert_non_null(tmp);
        assert_non_null(m->w[i - m->n_lm]);
        assert_int_equal(epd_st_read_f32(f, s.name, s.ndim, s.shape, tmp), EPD_OK);
        for (uint64_t j = 0; j < s.n_elems; j++) {
            m->w[i - m->n_lm][j] = tmp[j];
        }
        free(tmp);
    }
    epd_st_close(f);
}

static void ref_free(ref_vision_t *m)
{
    for (size_t i = 0; i < epd_ref_tensor_count(&m->hp) - m->n_lm; i++) {
        free(m->w[i]);
    }
    free(m->w);
}

/* y[out] = W[out][in] x[in] + b */
static void ref_affine(const double *w, const double *b, const double *x, size_t out, size_t in,
                       double *y)
{
    for (size_t o = 0; o < out; o++) {
        double acc = b[o];

        for (size_t i = 0; i < in; i++) {
            acc += w[o * in + i] * x[i];
        }
        y[o] = acc;
    }
}

static void ref_layernorm(const double *x, const double *w, const double *b, size_t n, double eps,
                          double *y)
{
    double mean = 0.0;
    double var = 0.0;

    for (size_t i = 0; i < n; i++) {
        mean += x[i];
    }
    mean /= n;
    for (size_t i = 0; i < n; i++) {
        var += (x[i] - mean) * (x[i] - mean);
    }
    var /= n;
    for (size_t i = 0; i < n; i++) {
        y[i] = (x[i] - mean) / sqrt(var + eps) * w[i] + b[i];
    }
}

static double ref_gelu(double u)
{
    return 0.5 * u * (1.0 + erf(u / sqrt(2.0)));
}

/* Source sample and weight of output sample o (epd_ref_model.h). */
static void ref_tap(uint32_t o, uint32_t src, uint32_t S, uint32_t *x0, uint32_t *x1, double *fr)
{
    double sx = (o + 0.5) * src / S - 0.5;

    if (sx < 0) {
        sx = 0;
    }
    if (sx > src - 1.0) {
        sx = src - 1.0;
    }
    *x0 = (uint32_t)floor(sx);
    *x1 = *x0 + 1 < src ? *x0 + 1 : src - 1;
    *fr = sx - *x0;
}

/* The embeddings of one image: out[E][dim]. */
static void ref_encode(const ref_vision_t *m, const uint8_t *rgb, uint32_t W, uint32_t H,
                       double *out)
{
    const epd_ref_hparams_t *hp = &m->hp;
    const epd_ref_vision_hparams_t *v = &hp->vision;
    size_t S = v->image_size;
    size_t P = v->patch_size;
    size_t g = S / P;
    size_t N = g * g;
    size_t D = v->dim;
    size_t hd = D / v->n_heads;
    size_t pd = P * P * 3;
    size_t mg = v->merge;
    size_t gm = g / mg;
    size_t md = mg * mg * D;
    double *img = calloc(S * S * 3, sizeof(double));
    double *x = calloc(pd, sizeof(double));
    double *h = calloc(N * D, sizeof(double));
    double *u = calloc(N * D, sizeof(double));
    double *q = calloc(N * D, sizeof(double));
    double *k = calloc(N * D, sizeof(double));
    double *vv = calloc(N * D, sizeof(double));
    double *o = calloc(N * D, sizeof(double));
    double *t = calloc(v->ffn > D ? v->ffn : D, sizeof(double));
    double *t2 = calloc(D, sizeof(double));
    double *sc = calloc(N, sizeof(double));
    double *z = calloc(md, sizeof(double));
    double *zt = calloc(md, sizeof(double));

    assert_true(img && x && h && u && q && k && vv && o && t && t2 && sc && z && zt);
    /* resize and scale */
    for (size_t oy = 0; oy < S; oy++) {
        for (size_t ox = 0; ox < S; ox++) {
            uint32_t x0, x1, y0, y1;
            double fx, fy;

            ref_tap((uint32_t)ox, W, (uint32_t)S, &x0, &x1, &fx);
            ref_tap((uint32_t)oy, H, (uint32_t)S, &y0, &y1, &fy);
            for (size_t c = 0; c < 3; c++) {
                double p00 = rgb[((size_t)y0 * W + x0) * 3 + c];
                double p01 = rgb[((size_t)y0 * W + x1) * 3 + c];
                double p10 = rgb[((size_t)y1 * W + x0) * 3 + c];
                double p11 = rgb[((size_t)y1 * W + x1) * 3 + c];
                double val = (1 - fy) * ((1 - fx) * p00 + fx * p01) + fy * ((1 - fx) * p10 + fx * p11);

                img[(oy * S + ox) * 3 + c] = val / 127.5 - 1.0;
            }
        }
    }
    /* patches, embedding, positions */
    for (size_t n = 0; n < N; n++) {
        size_t py = n / g;
        size_t px = n % g;

        for (size_t r = 0; r < P; r++) {
            for (size_t c = 0; c < P; c++) {
                for (size_t ch = 0; ch < 3; ch++) {
                    x[(r * P + c) * 3 + ch] = img[((py * P + r) * S + px * P + c) * 3 + ch];
                }
            }
        }
        ref_affine(m->w[0], m->w[1], x, D, pd, h + n * D);
        for (size_t i = 0; i < D; i++) {
            h[n * D + i] += m->w[2][n * D + i];
        }
    }
    for (uint32_t l = 0; l < v->n_layers; l++) {
        double *const *B = m->w + 3 + (size_t)l * EPD_REF_VISION_PER_BLOCK;

        for (size_t n = 0; n < N; n++) {
            ref_layernorm(h + n * D, B[0], B[1], D, v->ln_eps, u + n * D);
            ref_affine(B[2], B[3], u + n * D, D, D, q + n * D);
            ref_affine(B[4], B[5], u + n * D, D, D, k + n * D);
            ref_affine(B[6], B[7], u + n * D, D, D, vv + n * D);
        }
        for (size_t n = 0; n < N; n++) {
            for (size_t hh = 0; hh < v->n_heads; hh++) {
                double mx = -INFINITY;
                double sum = 0.0;

                for (size_t j = 0; j < N; j++) {
                    double d = 0.0;

                    for (size_t i = 0; i < hd; i++) {
                        d += q[n * D + hh * hd + i] * k[j * D + hh * hd + i];
                    }
                    sc[j] = d / sqrt((double)hd);
                    mx = fmax(mx, sc[j]);
                }
                for (size_t j = 0; j < N; j++) {
                    sc[j] = exp(sc[j] - mx);
                    sum += sc[j];
                }
                for (size_t i = 0; i < hd; i++) {
                    double acc = 0.0;

                    for (size_t j = 0; j < N; j++) {
                        acc += sc[j] / sum * vv[j * D + hh * hd + i];
                    }
                    o[n * D + hh * hd + i] = acc;
                }
            }
        }
        for (size_t n = 0; n < N; n++) {
            ref_affine(B[8], B[9], o + n * D, D, D, t2);
            for (size_t i = 0; i < D; i++) {
                h[n * D + i] += t2[i];
            }
            ref_layernorm(h + n * D, B[10], B[11], D, v->ln_eps, u + n * D);
            ref_affine(B[12], B[13], u + n * D, v->ffn, D, t);
            for (size_t i = 0; i < v->ffn; i++) {
                t[i] = ref_gelu(t[i]);
            }
            ref_affine(B[14], B[15], t, D, v->ffn, t2);
            for (size_t i = 0; i < D; i++) {
                h[n * D + i] += t2[i];
            }
        }
    }
    {
        double *const *T = m->w + 3 + (size_t)v->n_layers * EPD_REF_VISION_PER_BLOCK;

        for (size_t n = 0; n < N; n++) {
            ref_layernorm(h + n * D, T[0], T[1], D, v->ln_eps, u + n * D);
        }
        for (size_t j = 0; j < gm * gm; j++) {
            size_t my = j / gm;
            size_t mx = j % gm;

            for (size_t dy = 0; dy < mg; dy++) {
                for (size_t dx = 0; dx < mg; dx++) {
                    memcpy(z + (dy * mg + dx) * D, u + ((my * mg + dy) * g + mx * mg + dx) * D,
                           D * sizeof(double));
                }
            }
            ref_affine(T[2], T[3], z, md, md, zt);
            for (size_t i = 0; i < md; i++) {
                zt[i] = ref_gelu(zt[i]);
            }
            ref_affine(T[4], T[5], zt, hp->dim, md, out + j * hp->dim);
        }
    }
    free(img);
    free(x);
    free(h);
    free(u);
    free(q);
    free(k);
    free(vv);
    free(o);
    free(t);
    free(t2);
    free(sc);
    free(z);
    free(zt);
}

/* ---- helpers ----------------------------------------------------------------- */

static epd_engine_t *open_model(const char *dir)
{
    epd_engine_config_t cfg = {.model_dir = dir, .block_tokens = 4, .max_batch = 4};
    epd_engine_t *e = NULL;

    assert_int_equal(epd_engine_open("ref", &cfg, &e), EPD_OK);
    return e;
}

/* A w x h test image; `seed` varies the picture. */
static uint8_t *make_image(uint32_t w, uint32_t h, uint32_t seed)
{
    uint8_t *px = malloc((size_t)w * h * 3 + 1);

    assert_non_null(px);
    for (uint32_t y = 0; y < h; y++) {
        for (uint32_t x = 0; x < w; x++) {
            for (uint32_t c = 0; c < 3; c++) {
                uint32_t v = (x * 255 / (w > 1 ? w - 1 : 1) * (c + 1 + seed) +
                              y * 255 / (h > 1 ? h - 1 : 1) * (3 - c) + seed * 97 +
                              ((x / 3 + y / 5) % 2) * 60) % 256;

                px[((size_t)y * w + x) * 3 + c] = (uint8_t)v;
            }
        }
    }
    return px;
}

static void encode(epd_engine_t *e, const uint8_t *px, uint32_t w, uint32_t h, float *out)
{
    epd_image_view_t v = {.width = w, .height = h, .rgb = px};

    assert_int_equal(epd_engine_encode_image(e, &v, out), EPD_OK);
}

static int32_t argmax(const float *x, size_t n)
{
    size_t best = 0;

    for (size_t i = 1; i < n; i++) {
        if (x[i] > x[best]) {
            best = i;
        }
    }
    return (int32_t)best;
}

static epd_prefill_args_t args_of(const uint32_t *table, uint32_t n_blocks, const int32_t *toks,
                                  uint32_t start, uint32_t n, const epd_embed_span_t *spans,
                                  uint32_t n_spans)
{
    epd_prefill_args_t a = {.seq = {.req_id = 1, .block_table = table, .n_blocks = n_blocks},
                            .tokens = toks + start,
                            .n_tokens = n,
                            .start = start,
                            .embeds = spans,
                            .n_embeds = n_spans};

    return a;
}

/* ---- tests ------------------------------------------------------------------- */

static void check_encoder(const char *dir, const epd_mkmodel_params_t *p)
{
    static const uint32_t sizes[][2] = {{0, 0}, {45, 29}, {7, 5}, {1, 1}, {100, 100}};
    epd_engine_t *e = open_model(dir);
    const epd_engine_info_t *info = epd_engine_info(e);
    size_t n = (size_t)info->image_embeddings * info->embed_dim;
    float *got = malloc(n * sizeof(float));
    float *again = malloc(n * sizeof(float));
    double *want = malloc(n * sizeof(double));
    ref_vision_t m;

    assert_true(got && again && want);
    ref_load(&m, dir, &p->hp);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        uint32_t w = sizes[i][0] ? sizes[i][0] : info->image_size; /* 0: no resize */
        uint32_t h = sizes[i][1] ? sizes[i][1] : info->image_size;
        uint8_t *px = make_image(w, h, (uint32_t)i);
        double err;

        encode(e, px, w, h, got);
        ref_encode(&m, px, w, h, want);
        err = epd_test_rel_err(got, want, n);
        print_message("%u x %u image -> %u x %u embeddings: relative error %.3g\n", w, h,
                      info->image_embeddings, info->embed_dim, err);
        assert_true(err < TOL);
        encode(e, px, w, h, again); /* deterministic */
        assert_memory_equal(got, again, n * sizeof(float));
        free(px);
    }
    ref_free(&m);
    free(got);
    free(again);
    free(want);
    epd_engine_close(e);
}

static void test_encoder_matches_double_reference(void **state)
{
    (void)state;
    check_encoder(vis_dir, &vis_p);
    check_encoder(vis3_dir, &vis3_p);
}

static void test_reference_is_sensitive(void **state)
{
    /* The comparison must be able to fail: other weights, other embeddings;
     * and so must the image: another picture, other embeddings. */
    epd_mkmodel_params_t p = vis_p;
    epd_engine_t *e = open_model(vis_dir);
    const epd_engine_info_t *info = epd_engine_info(e);
    size_t n = (size_t)info->image_embeddings * info->embed_dim;
    uint8_t *px = make_image(32, 32, 1);
    uint8_t *py = make_image(32, 32, 2);
    float *got = malloc(n * sizeof(float));
    double *want = malloc(n * sizeof(double));
    ref_vision_t m;

    (void)state;
    p.seed = 99;
    ref_load(&m, epd_test_write_model(tmpdir, "vis-other", &p), &p.hp);
    encode(e, px, 32, 32, got);
    ref_encode(&m, px, 32, 32, want);
    assert_true(epd_test_rel_err(got, want, n) > 1e-2);
    ref_free(&m);
    ref_load(&m, vis_dir, &vis_p.hp);
    ref_encode(&m, py, 32, 32, want);
    assert_true(epd_test_rel_err(got, want, n) > 1e-2);
    ref_free(&m);
    free(got);
    free(want);
    free(px);
    free(py);
    epd_engine_close(e);
}

static void test_info(void **state)
{
    epd_engine_t *e = open_model(vis_dir);
    epd_engine_t *t = open_model(text_dir);
    const epd_engine_info_t *vi = epd_engine_info(e);
    const epd_engine_info_t *ti = epd_engine_info(t);

    (void)state;
    assert_int_equal(vi->vocab_size, VOCAB);
    assert_int_equal(vi->image_embeddings, 4);
    assert_int_equal(vi->embed_dim, 32);
    assert_int_equal(vi->image_token, 258);
    assert_int_equal(vi->image_size, 32);
    assert_int_equal(ti->vocab_size, 258);
    assert_int_equal(ti->image_embeddings, 0);
    assert_int_equal(ti->embed_dim, 0);
    assert_int_equal(ti->image_token, -1);
    assert_int_equal(ti->image_size, 0);
    epd_engine_close(t);
    epd_engine_close(e);
}

/* BOS h i [4 x 258] t h e r e */
static size_t image_prompt(int32_t *toks, uint32_t *img_pos)
{
    size_t n = 0;

    toks[n++] = 256;
    toks[n++] = 'h';
    toks[n++] = 'i';
    *img_pos = (uint32_t)n;
    for (int i = 0; i < 4; i++) {
        toks[n++] = 258;
    }
    for (const char *p = "there"; *p; p++) {
        toks[n++] = (unsigned char)*p;
    }
    return n;
}

static void test_span_of_token_embeddings_equals_text(void **state)
{
    /* Rows equal to the embeddings of "abcd" at the placeholders give the
     * logits of the text prompt with "abcd" there: the span replaces
     * exactly the token embedding of its positions, nothing else. */
    epd_engine_t *e = open_model(vis_dir);
    epd_st_file_t *f;
    const epd_st_tensor_t *emb;
    float rows[4 * 32];
    int32_t toks[32];
    int32_t text[32];
    uint32_t pos;
    size_t n = image_prompt(toks, &pos);
    uint32_t table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    float a[VOCAB];
    float b[VOCAB];
    epd_kv_pool_t pool;
    epd_embed_span_t span = {.pos = pos, .n = 4, .data = rows};
    epd_prefill_args_t args;

    (void)state;
    assert_int_equal(epd_st_open(epd_test_path(vis_dir, "model.safetensors"), &f), EPD_OK);
    emb = epd_st_find(f, "model.embed_tokens.weight");
    assert_non_null(emb);
    for (int i = 0; i < 4; i++) {
        memcpy(rows + i * 32, (const float *)emb->data + (size_t)('a' + i) * 32,
               32 * sizeof(float));
    }
    epd_st_close(f);
    memcpy(text, toks, n * sizeof(int32_t));
    for (int i = 0; i < 4; i++) {
        text[pos + i] = 'a' + i;
    }
    epd_test_pool(e, 8, 1, &pool);
    args = args_of(table, 8, toks, 0, (uint32_t)n, &span, 1);
    assert_int_equal(epd_engine_prefill(e, &pool, &args, NULL, a), EPD_OK);
    args = args_of(table, 8, text, 0, (uint32_t)n, NULL, 0);
    assert_int_equal(epd_engine_prefill(e, &pool, &args, NULL, b), EPD_OK);
    assert_memory_equal(a, b, sizeof(a));
    epd_free(pool.base);
    epd_engine_close(e);
}

static void test_images_change_logits(void **state)
{
    epd_engine_t *e = open_model(vis_dir);
    uint8_t *p1 = make_image(50, 40, 1);
    uint8_t *p2 = make_image(50, 40, 5);
    float e1[4 * 32];
    float e2[4 * 32];
    int32_t toks[32];
    uint32_t pos;
    size_t n = image_prompt(toks, &pos);
    uint32_t table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    float a[VOCAB];
    float b[VOCAB];
    float c[VOCAB];
    epd_kv_pool_t pool;
    epd_embed_span_t span = {.pos = pos, .n = 4, .data = e1};
    epd_prefill_args_t args = args_of(table, 8, toks, 0, (uint32_t)n, &span, 1);

    (void)state;
    encode(e, p1, 50, 40, e1);
    encode(e, p2, 50, 40, e2);
    epd_test_pool(e, 8, 1, &pool);
    assert_int_equal(epd_engine_prefill(e, &pool, &args, NULL, a), EPD_OK);
    assert_int_equal(epd_engine_prefill(e, &pool, &args, NULL, c), EPD_OK);
    assert_memory_equal(a, c, sizeof(a)); /* reproducible */
    span.data = e2;
    assert_int_equal(epd_engine_prefill(e, &pool, &args, NULL, b), EPD_OK);
    print_message("two images: logits differ by %.3g (relative)\n",
                  epd_test_rel_err_f(a, b, VOCAB));
    assert_true(epd_test_rel_err_f(a, b, VOCAB) > 1e-3);
    epd_free(pool.base);
    free(p1);
    free(p2);
    epd_engine_close(e);
}

/* The spans a chunk ending at `end` passes: those that begin before it,
 * cut at it (what a chunked prefill does). */
static uint32_t clip_spans(const epd_embed_span_t *spans, uint32_t n, uint32_t end,
                           epd_embed_span_t *out)
{
    uint32_t k = 0;

    for (uint32_t i = 0; i < n && spans[i].pos < end; i++) {
        out[k] = spans[i];
        if (out[k].pos + out[k].n > end) {
            out[k].n = end - out[k].pos;
        }
        k++;
    }
    return k;
}

static void test_chunk_boundary_inside_span(void **state)
{
    /* Two images; the cuts fall inside both spans and between them.  Each
     * chunk passes the spans begun before its end, the straddling one cut
     * there; the engine takes the rows inside the chunk. */
    epd_engine_t *e = open_model(vis_dir);
    uint8_t *p1 = make_image(32, 32, 3);
    uint8_t *p2 = make_image(64, 16, 4);
    float rows[2][4 * 32];
    int32_t toks[64];
    uint32_t pos[2];
    size_t n;
    uint32_t ta[16];
    uint32_t tb[16];
    float whole[VOCAB];
    float chunked[VOCAB];
    epd_kv_pool_t pool;
    static const uint32_t cuts[] = {0, 4, 6, 9, 12};
    epd_embed_span_t spans[2];
    epd_prefill_args_t args;

    (void)state;
    assert_int_equal(epd_engine_tokenize_images(e, "A" EPD_IMAGE_MARKER "B" EPD_IMAGE_MARKER "C.",
                                                strlen("A" EPD_IMAGE_MARKER "B" EPD_IMAGE_MARKER
                                                       "C."),
                                                2, toks, 64, &n, pos),
                     EPD_OK);
    assert_int_equal(n, 13); /* BOS A [4] B [4] C . */
    assert_int_equal(pos[0], 2);
    assert_int_equal(pos[1], 7);
    encode(e, p1, 32, 32, rows[0]);
    encode(e, p2, 64, 16, rows[1]);
    for (int i = 0; i < 2; i++) {
        spans[i] = (epd_embed_span_t){.pos = pos[i], .n = 4, .data = rows[i]};
    }
    for (uint32_t i = 0; i < 16; i++) {
        ta[i] = i;
        tb[i] = 31 - i;
    }
    epd_test_pool(e, 32, 2, &pool);
    args = args_of(ta, 16, toks, 0, (uint32_t)n, spans, 2);
    assert_int_equal(epd_engine_prefill(e, &pool, &args, NULL, whole), EPD_OK);
    for (size_t c = 0; c < sizeof(cuts) / sizeof(cuts[0]); c++) {
        uint32_t end = c + 1 < sizeof(cuts) / sizeof(cuts[0]) ? cuts[c + 1] : (uint32_t)n;

        epd_embed_span_t cut[2];
        uint32_t n_cut = clip_spans(spans, 2, end, cut);

        args = args_of(tb, 16, toks, cuts[c], end - cuts[c], cut, n_cut);
        args.seq.state_slot = 1;
        assert_int_equal(epd_engine_prefill(e, &pool, &args, NULL, chunked), EPD_OK);
    }
    /* bit for bit: the engine is split-invariant (epd_engine_prefill) */
    assert_memory_equal(chunked, whole, sizeof(whole));
    for (int step = 0; step < 6; step++) {
        epd_decode_req_t ra = {.seq = {.block_table = ta, .n_blocks = 16, .state_slot = 0},
                               .pos = (uint32_t)n + step,
                               .token = argmax(whole, VOCAB)};
        epd_decode_req_t rb = {.seq = {.block_table = tb, .n_blocks = 16, .state_slot = 1},
                               .pos = (uint32_t)n + step,
                               .token = argmax(chunked, VOCAB)};

        assert_int_equal(ra.token, rb.token);
        assert_int_equal(epd_engine_decode(e, &pool, &ra, 1, whole), EPD_OK);
        assert_int_equal(epd_engine_decode(e, &pool, &rb, 1, chunked), EPD_OK);
        assert_memory_equal(chunked, whole, sizeof(whole));
    }
    epd_free(pool.base);
    free(p1);
    free(p2);
    epd_engine_close(e);
}

static void expect_refused(epd_engine_t *e, epd_kv_pool_t *pool, const epd_prefill_args_t *args,
                           epd_status_t want, const char *what)
{
    unsigned char *before = malloc(pool->bytes);
    float logits[VOCAB];
    epd_status_t st;

    assert_non_null(before);
    memcpy(before, pool->base, pool->bytes);
    for (int i = 0; i < VOCAB; i++) {
        logits[i] = -12345.0f;
    }
    st = epd_engine_prefill(e, pool, args, NULL, logits);
    if (st != want) {
        print_message("%s: %s, want %s\n", what, epd_status_name(st), epd_status_name(want));
    }
    assert_int_equal(st, want);
    for (int i = 0; i < VOCAB; i++) {
        assert_true(logits[i] == -12345.0f);
    }
    assert_memory_equal(pool->base, before, pool->bytes);
    free(before);
}

static void test_span_refusals(void **state)
{
    epd_engine_t *e = open_model(vis_dir);
    epd_engine_t *t = open_model(text_dir);
    float rows[8 * 32] = {0};
    int32_t toks[64];
    uint32_t pos[2];
    size_t n;
    uint32_t table[16];
    epd_kv_pool_t pool;
    epd_kv_pool_t tpool;
    epd_embed_span_t sp[3];
    epd_prefill_args_t a;

    (void)state;
    for (uint32_t i = 0; i < 16; i++) {
        table[i] = i;
    }
    /* BOS x [4] y [4] z: images at 2 and 7 */
    assert_int_equal(epd_engine_tokenize_images(e, "x" EPD_IMAGE_MARKER "y" EPD_IMAGE_MARKER "z",
                                                strlen("x" EPD_IMAGE_MARKER "y" EPD_IMAGE_MARKER
                                                       "z"),
                                                2, toks, 64, &n, pos),
                     EPD_OK);
    assert_int_equal(n, 12);
    epd_test_pool(e, 16, 1, &pool);
    sp[0] = (epd_embed_span_t){.pos = 2, .n = 4, .data = rows};
    sp[1] = (epd_embed_span_t){.pos = 7, .n = 4, .data = rows + 4 * 32};
    a = args_of(table, 16, toks, 0, (uint32_t)n, sp, 2);
    {
        float logits[VOCAB];

        assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_OK); /* as given */
        memset(pool.base, 0, pool.bytes);
    }
    /* unsorted */
    sp[0].pos = 7;
    sp[1].pos = 2;
    expect_refused(e, &pool, &a, EPD_ERR_INVALID_PARAM, "unsorted");
    /* overlapping (and then covering y) */
    sp[0].pos = 2;
    sp[1].pos = 5;
    expect_refused(e, &pool, &a, EPD_ERR_INVALID_PARAM, "overlapping");
    /* an uncovered placeholder: only the first image given */
    sp[1].pos = 7;
    a.n_embeds = 1;
    expect_refused(e, &pool, &a, EPD_ERR_INVALID_PARAM, "second image uncovered");
    /* a placeholder at the end of a span left out */
    a.n_embeds = 2;
    sp[1].n = 3;
    expect_refused(e, &pool, &a, EPD_ERR_INVALID_PARAM, "one placeholder uncovered");
    /* a span over a text position (y at 6) */
    sp[1].n = 4;
    sp[0].n = 5;
    expect_refused(e, &pool, &a, EPD_ERR_INVALID_PARAM, "span over text");
    sp[0].n = 4;
    /* NULL data, empty span, no span array */
    sp[1].data = NULL;
    expect_refused(e, &pool, &a, EPD_ERR_INVALID_PARAM, "NULL data");
    sp[1].data = rows;
    sp[1].n = 0;
    expect_refused(e, &pool, &a, EPD_ERR_INVALID_PARAM, "empty span");
    sp[1].n = 4;
    a.embeds = NULL;
    expect_refused(e, &pool, &a, EPD_ERR_INVALID_PARAM, "NULL span array");
    a.embeds = sp;
    /* a span past the prompt seen so far: chunk [0, 9) with the second
     * image's span [7, 11) */
    a.n_tokens = 9;
    expect_refused(e, &pool, &a, EPD_ERR_INVALID_PARAM, "span past the chunk's end");
    a.n_tokens = (uint32_t)n;
    /* no spans at all with placeholders in the prompt */
    a.n_embeds = 0;
    expect_refused(e, &pool, &a, EPD_ERR_INVALID_PARAM, "no spans");
    /* an engine without vision */
    epd_test_pool(t, 16, 1, &tpool);
    toks[2] = 'q';
    a = args_of(table, 16, toks, 0, 2, sp, 1);
    sp[0] = (epd_embed_span_t){.pos = 1, .n = 1, .data = rows};
    expect_refused(t, &tpool, &a, EPD_ERR_UNSUPPORTED, "text-only engine");
    epd_free(tpool.base);
    epd_free(pool.base);
    epd_engine_close(t);
    epd_engine_close(e);
}

static void test_tokenize_images(void **state)
{
    epd_engine_t *e = open_model(vis_dir);
    epd_engine_t *t = open_model(text_dir);
    int32_t toks[64];
    int32_t plain[64];
    uint32_t pos[3] = {0};
    size_t n = 0;
    size_t np = 0;
    char bytes[64];
    size_t blen;
    const char *two = "<|image|>a<|image|>";

    (void)state;
    /* markers where they are */
    assert_int_equal(epd_engine_tokenize_images(e, two, strlen(two), 2, toks, 64, &n, pos),
                     EPD_OK);
    assert_int_equal(n, 1 + 4 + 1 + 4);
    assert_int_equal(toks[0], 256);
    assert_int_equal(pos[0], 1);
    assert_int_equal(pos[1], 6);
    assert_int_equal(toks[5], 'a');
    for (int i = 0; i < 4; i++) {
        assert_int_equal(toks[1 + i], 258);
        assert_int_equal(toks[6 + i], 258);
    }
    /* no marker: images right after BOS */
    assert_int_equal(epd_engine_tokenize_images(e, "hey", 3, 3, toks, 64, &n, pos), EPD_OK);
    assert_int_equal(n, 1 + 12 + 3);
    assert_int_equal(pos[0], 1);
    assert_int_equal(pos[1], 5);
    assert_int_equal(pos[2], 9);
    assert_int_equal(toks[13], 'h');
    /* no images, no marker: as epd_engine_tokenize with BOS */
    assert_int_equal(epd_engine_tokenize_images(e, "hey", 3, 0, toks, 64, &n, NULL), EPD_OK);
    assert_int_equal(epd_engine_tokenize(e, "hey", 3, 1, plain, 64, &np), EPD_OK);
    assert_int_equal(n, np);
    assert_memory_equal(toks, plain, n * sizeof(int32_t));
    /* a text engine too */
    assert_int_equal(epd_engine_tokenize_images(t, "hey", 3, 0, toks, 64, &n, NULL), EPD_OK);
    assert_int_equal(n, 4);
    /* a partial marker is text */
    assert_int_equal(epd_engine_tokenize_images(e, "<|image|", 8, 1, toks, 64, &n, pos), EPD_OK);
    assert_int_equal(n, 1 + 4 + 8);
    /* refusals */
    assert_int_equal(epd_engine_tokenize_images(e, two, strlen(two), 1, toks, 64, &n, pos),
                     EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_engine_tokenize_images(e, two, strlen(two), 3, toks, 64, &n, pos),
                     EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_engine_tokenize_images(e, two, strlen(two), 0, toks, 64, &n, NULL),
                     EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_engine_tokenize_images(e, two, strlen(two), 2, toks, 9, &n, pos),
                     EPD_ERR_TOO_LONG);
    assert_int_equal(epd_engine_tokenize_images(e, two, strlen(two), 2, toks, 10, &n, pos),
                     EPD_OK);
    assert_int_equal(epd_engine_tokenize_images(e, "hey", 3, 1, toks, 64, &n, NULL),
                     EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_engine_tokenize_images(t, "hey", 3, 1, toks, 64, &n, pos),
                     EPD_ERR_UNSUPPORTED);
    /* the placeholder is special: never from text, no bytes out */
    assert_int_equal(epd_engine_tokenize(e, "\xff\x02", 2, 0, toks, 64, &n), EPD_OK);
    assert_true(toks[0] == 255 && toks[1] == 2);
    toks[0] = 'o';
    toks[1] = 258;
    toks[2] = 'k';
    toks[3] = 256;
    assert_int_equal(epd_engine_detokenize(e, toks, 4, bytes, sizeof(bytes), &blen), EPD_OK);
    assert_int_equal(blen, 2);
    assert_memory_equal(bytes, "ok", 2);
    epd_engine_close(t);
    epd_engine_close(e);
}

static void test_encode_refusals(void **state)
{
    epd_engine_t *e = open_model(vis_dir);
    epd_engine_t *t = open_model(text_dir);
    uint8_t px[12] = {0};
    float out[4 * 32];
    epd_image_view_t v = {.width = 2, .height = 2, .rgb = px};

    (void)state;
    assert_int_equal(epd_engine_encode_image(e, &v, out), EPD_OK);
    assert_int_equal(epd_engine_encode_image(e, NULL, out), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_engine_encode_image(e, &v, NULL), EPD_ERR_INVALID_PARAM);
    v.width = 0;
    assert_int_equal(epd_engine_encode_image(e, &v, out), EPD_ERR_INVALID_PARAM);
    v.width = 2;
    v.height = 0;
    assert_int_equal(epd_engine_encode_image(e, &v, out), EPD_ERR_INVALID_PARAM);
    v.height = 2;
    v.rgb = NULL;
    assert_int_equal(epd_engine_encode_image(e, &v, out), EPD_ERR_INVALID_PARAM);
    v.rgb = px;
    assert_int_equal(epd_engine_encode_image(t, &v, out), EPD_ERR_UNSUPPORTED);
    epd_engine_close(t);
    epd_engine_close(e);
}

static void test_encode_allocation_failures(void **state)
{
    epd_engine_t *e = open_model(vis_dir);
    uint8_t *px = make_image(20, 30, 1);
    float want[4 * 32];
    float got[4 * 32];
    epd_image_view_t v = {.width = 20, .height = 30, .rgb = px};
    long k;

    (void)state;
    encode(e, px, 20, 30, want);
    for (k = 0; k < 100; k++) {
        epd_alloc_stats_t before;
        epd_alloc_stats_t after;
        epd_status_t st;

        epd_alloc_stats(&before);
        epd_alloc_fail_after(k);
        st = epd_engine_encode_image(e, &v, got);
        epd_alloc_fail_after(-1);
        epd_alloc_stats(&after);
        assert_int_equal(after.live_blocks, before.live_blocks);
        if (st == EPD_OK) {
            break;
        }
        assert_int_equal(st, EPD_ERR_NO_MEMORY);
    }
    assert_true(k > 0 && k < 100);
    assert_memory_equal(got, want, sizeof(want));
    free(px);
    epd_engine_close(e);
}

static void test_open_allocation_failures(void **state)
{
    epd_engine_config_t cfg = {.model_dir = vis_dir};
    long n;

    (void)state;
    for (n = 0; n < 1000; n++) {
        epd_alloc_stats_t before;
        epd_alloc_stats_t after;
        epd_engine_t *e = NULL;
        epd_status_t st;

        epd_alloc_stats(&before);
        epd_alloc_fail_after(n);
        st = epd_engine_open("ref", &cfg, &e);
        epd_alloc_fail_after(-1);
        if (st == EPD_OK) {
            epd_engine_close(e);
            break;
        }
        assert_int_equal(st, EPD_ERR_NO_MEMORY);
        epd_alloc_stats(&after);
        assert_int_equal(after.live_blocks, before.live_blocks);
    }
    assert_true(n > 5 && n < 1000);
}

static void test_text_model_and_language_weights(void **state)
{
    /* A model without vision_config is the text model of before; with
     * vocab 259 and the same seed its language weights are those of the
     * vision model (vision tensors come last), so text prompts give the
     * same logits from both. */
    epd_mkmodel_params_t p = vis_p;
    epd_engine_t *v = open_model(vis_dir);
    epd_engine_t *t;
    json_t *cfg;
    json_error_t jerr;
    uint32_t table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    int32_t toks[16] = {256, 'c', 'a', 't', 's'};
    float a[VOCAB];
    float b[VOCAB];
    epd_kv_pool_t pa;
    epd_kv_pool_t pb;
    epd_prefill_args_t args = args_of(table, 8, toks, 0, 5, NULL, 0);

    (void)state;
    epd_mkmodel_text_only(&p);
    p.hp.vocab = VOCAB;
    t = open_model(epd_test_write_model(tmpdir, "text259", &p));
    cfg = json_load_file(epd_test_path(epd_test_path(tmpdir, "text259"), "config.json"), 0, &jerr);
    assert_non_null(cfg);
    assert_null(json_object_get(cfg, "vision_config"));
    assert_null(json_object_get(cfg, "image_token_id"));
    json_decref(cfg);
    assert_int_equal(epd_engine_info(t)->image_token, -1);
    epd_test_pool(v, 8, 1, &pa);
    epd_test_pool(t, 8, 1, &pb);
    assert_int_equal(epd_engine_prefill(v, &pa, &args, NULL, a), EPD_OK);
    assert_int_equal(epd_engine_prefill(t, &pb, &args, NULL, b), EPD_OK);
    assert_memory_equal(a, b, sizeof(a));
    /* a text-only model may hold token 258 as an ordinary token */
    toks[2] = 258;
    assert_int_equal(epd_engine_prefill(t, &pb, &args, NULL, b), EPD_OK);
    epd_free(pa.base);
    epd_free(pb.base);
    epd_engine_close(t);
    epd_engine_close(v);
}

/* Writes vis_dir's config.json with `key` of vision_config (or of the top
 * level when top) set to `value` (NULL: removed) into a copy of the model,
 * and returns the open status. */
static epd_status_t open_with(int top, const char *key, json_t *value)
{
    char dir[1024];
    char cmd[2200];
    json_error_t jerr;
    json_t *cfg;
    json_t *obj;
    epd_engine_config_t ec;
    epd_engine_t *e = NULL;
    epd_status_t st;

    snprintf(dir, sizeof(dir), "%s/edited", tmpdir);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -r '%s' '%s'", dir, vis_dir, dir);
    assert_int_equal(system(cmd), 0);
    cfg = json_load_file(epd_test_path(vis_dir, "config.json"), 0, &jerr);
    assert_non_null(cfg);
    obj = top ? cfg : json_object_get(cfg, "vision_config");
    if (value == NULL) {
        json_object_del(obj, key);
    } else {
        json_object_set_new(obj, key, value);
    }
    assert_int_equal(json_dump_file(cfg, epd_test_path(dir, "config.json"), 0), 0);
    json_decref(cfg);
    ec = (epd_engine_config_t){.model_dir = dir};
    st = epd_engine_open("ref", &ec, &e);
    epd_engine_close(e);
    return st;
}

static void test_vision_config_checks(void **state)
{
    (void)state;
    assert_int_equal(open_with(0, "layer_norm_eps", json_real(1e-6)), EPD_OK);
    assert_int_equal(open_with(0, "layer_norm_eps", NULL), EPD_OK);    /* default 1e-6 */
    assert_int_equal(open_with(0, "out_hidden_size", NULL), EPD_OK);   /* default: hidden */
    assert_int_equal(open_with(0, "image_size", json_integer(24)), EPD_ERR_MALFORMED); /* 3x3 grid, 2x2 merge */
    assert_int_equal(open_with(0, "image_size", json_integer(36)), EPD_ERR_MALFORMED); /* 8 does not divide */
    assert_int_equal(open_with(0, "image_size", json_integer(0)), EPD_ERR_MALFORMED);
    assert_int_equal(open_with(0, "patch_size", json_integer(0)), EPD_ERR_MALFORMED);
    assert_int_equal(open_with(0, "spatial_merge_size", json_integer(0)), EPD_ERR_MALFORMED);
    assert_int_equal(open_with(0, "spatial_merge_size", json_integer(3)), EPD_ERR_MALFORMED);
    assert_int_equal(open_with(0, "num_attention_heads", json_integer(3)), EPD_ERR_MALFORMED);
    assert_int_equal(open_with(0, "num_hidden_layers", json_integer(0)), EPD_ERR_MALFORMED);
    assert_int_equal(open_with(0, "hidden_size", json_integer(-1)), EPD_ERR_MALFORMED);
    assert_int_equal(open_with(0, "intermediate_size", json_string("24")), EPD_ERR_MALFORMED);
    assert_int_equal(open_with(0, "out_hidden_size", json_integer(64)), EPD_ERR_MALFORMED);
    assert_int_equal(open_with(0, "layer_norm_eps", json_real(0.0)), EPD_ERR_MALFORMED);
    assert_int_equal(open_with(0, "patch_size", NULL), EPD_ERR_MALFORMED); /* required */
    assert_int_equal(open_with(1, "image_token_id", NULL), EPD_ERR_MALFORMED);
    assert_int_equal(open_with(1, "image_token_id", json_integer(256)), EPD_ERR_MALFORMED);
    assert_int_equal(open_with(1, "image_token_id", json_integer(259)), EPD_ERR_MALFORMED);
    assert_int_equal(open_with(1, "image_token_id", json_integer(65)), EPD_ERR_MALFORMED);
    assert_int_equal(open_with(1, "vision_config", json_string("yes")), EPD_ERR_MALFORMED);
    assert_int_equal(open_with(1, "vision_config", json_null()), EPD_ERR_MALFORMED); /* stray id */
    /* weights that do not match the config */
    assert_int_equal(open_with(0, "num_hidden_layers", json_integer(3)), EPD_ERR_MALFORMED);
    assert_int_equal(open_with(0, "intermediate_size", json_integer(32)), EPD_ERR_MALFORMED);
}

static int setup(void **state)
{
    epd_mkmodel_params_t text;

    (void)state;
    tmpdir = epd_test_tmpdir();
    epd_test_tiny_vision_params(&vis_p);
    vis_dir = epd_test_write_model(tmpdir, "vis", &vis_p);
    vis3_p = vis_p;
    vis3_p.hp.vision.image_size = 24;
    vis3_p.hp.vision.patch_size = 4;
    vis3_p.hp.vision.merge = 3;
    vis3_p.hp.vision.dim = 12;
    vis3_p.hp.vision.n_heads = 3;
    vis3_p.seed = 11;
    vis3_dir = epd_test_write_model(tmpdir, "vis3", &vis3_p);
    epd_test_tiny_params(&text);
    text_dir = epd_test_write_model(tmpdir, "text", &text);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    epd_test_rmtree(tmpdir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encoder_matches_double_reference),
        cmocka_unit_test(test_reference_is_sensitive),
        cmocka_unit_test(test_info),
        cmocka_unit_test(test_span_of_token_embeddings_equals_text),
        cmocka_unit_test(test_images_change_logits),
        cmocka_unit_test(test_chunk_boundary_inside_span),
        cmocka_unit_test(test_span_refusals),
        cmocka_unit_test(test_tokenize_images),
        cmocka_unit_test(test_encode_refusals),
        cmocka_unit_test(test_encode_allocation_failures),
        cmocka_unit_test(test_open_allocation_failures),
        cmocka_unit_test(test_text_model_and_language_weights),
        cmocka_unit_test(test_vision_config_checks),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
