/*
 * test_epd_ref.c — the `ref` engine against an independent double-precision
 * reference written here (naive attention with explicit RoPE, linear
 * attention in its parallel form sum_s g^(t-s) phi(q_t).phi(k_s) v_s rather
 * than the engine's recurrence, naive everything), reading the same
 * safetensors weights; plus chunked prefill, batched decode, the layer sink,
 * seeds, argument refusal and an allocation-failure sweep over open.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_engine.h"
#include "epd_mkmodel.h"
#include "epd_ref_model.h"
#include "epd_safetensors.h"
#include "epd_sample.h"
#include "epd_test_engine_util.h"

#define TOL 1e-5

static const char *tmpdir;
static const char *tiny_dir;
static epd_mkmodel_params_t tiny;

/* ---- the double-precision reference -------------------------------------- */

typedef struct {
    epd_ref_hparams_t hp;
    size_t n;
    double **w; /* [tensor spec index] */
} ref_model_t;

static void ref_load(ref_model_t *m, const char *dir, const epd_ref_hparams_t *hp)
{
    epd_st_file_t *f;

    m->hp = *hp;
    m->n = epd_ref_lm_tensor_count(hp); /* the language model (vision tensors follow) */
    m->w = calloc(m->n, sizeof(*m->w));
    assert_non_null(m->w);
    assert_int_equal(epd_st_open(epd_test_path(dir, "model.safetensors"), &f), EPD_OK);
    for (size_t i = 0; i < m->n; i++) {
        epd_ref_tensor_spec_t s;
        float *tmp;

        epd_ref_tensor_spec(hp, i, &s);
        tmp = malloc(s.n_elems * sizeof(float));
        m->w[i] = malloc(s.n_elems * sizeof(double));
        assert_non_null(tmp);
        assert_non_null(m->w[i]);
        assert_int_equal(epd_st_read_f32(f, s.name, s.ndim, s.shape, tmp), EPD_OK);
        for (uint64_t j = 0; j < s.n_elems; j++) {
            m->w[i][j] = tmp[j];
        }
        free(tmp);
    }
    epd_st_close(f);
}

static void ref_free(ref_model_t *m)
{
    for (size_t i = 0; i < m->n; i++) {
        free(m->w[i]);
    }
    free(m->w);
}

static const double *ref_w(const ref_model_t *m, uint32_t layer, uint32_t j)
{
    return m->w[1 + (size_t)layer * 9 + j];
}

/* y[out] = W[out][in] x[in] */
static void ref_mv(const double *w, const double *x, size_t out, size_t in, double *y)
{
    for (size_t o = 0; o < out; o++) {
        double acc = 0.0;

        for (size_t i = 0; i < in; i++) {
            acc += w[o * in + i] * x[i];
        }
        y[o] = acc;
    }
}

static void ref_rmsnorm(const double *x, const double *w, size_t dim, double eps, double *y)
{
    double ss = 0.0;

    for (size_t i = 0; i < dim; i++) {
        ss += x[i] * x[i];
    }
    for (size_t i = 0; i < dim; i++) {
        y[i] = x[i] / sqrt(ss / dim + eps) * w[i];
    }
}

static void ref_rope(double *v, size_t hd, size_t pos, double theta)
{
    for (size_t i = 0; i < hd / 2; i++) {
        double a = pos * pow(theta, -2.0 * i / hd);
        double x0 = v[i];
        double x1 = v[i + hd / 2];

        v[i] = x0 * cos(a) - x1 * sin(a);
        v[i + hd / 2] = x0 * sin(a) + x1 * cos(a);
    }
}

static double ref_phi(double u)
{
    return u > 0 ? u + 1 : exp(u);
}

/* Logits of the last of tokens[0..n) into out[vocab]. */
static void ref_forward(const ref_model_t *m, const int32_t *tokens, size_t n, double *out)
{
    const epd_ref_hparams_t *hp = &m->hp;
    size_t dim = hp->dim;
    size_t hd = hp->head_dim;
    size_t nh = hp->n_heads;
    size_t qd = nh * hd;
    size_t group = hp->n_heads / hp->n_kv_heads;
    double *x = calloc(n * dim, sizeof(double));
    double *h = calloc(n * dim, sizeof(double));
    double *q = calloc(n * qd, sizeof(double));
    double *k = calloc(n * qd, sizeof(double));
    double *v = calloc(n * qd, sizeof(double));
    double *o = calloc(n * qd, sizeof(double));
    double *t1 = calloc(hp->ffn, sizeof(double));
    double *t2 = calloc(hp->ffn, sizeof(double));
    double *d = calloc(dim, sizeof(double));
    double *sc = calloc(n, sizeof(double));

    assert_true(x && h && q && k && v && o && t1 && t2 && d && sc);
    for (size_t t = 0; t < n; t++) {
        memcpy(x + t * dim, m->w[0] + (size_t)tokens[t] * dim, dim * sizeof(double));
    }
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        int lin = epd_ref_layer_kind(hp, l) == EPD_LAYER_LINEAR;
        size_t kvd = lin ? qd : hp->n_kv_heads * hd;

        for (size_t t = 0; t < n; t++) {
            ref_rmsnorm(x + t * dim, ref_w(m, l, 0), dim, hp->rms_eps, h + t * dim);
            ref_mv(ref_w(m, l, 1), h + t * dim, qd, dim, q + t * qd);
            ref_mv(ref_w(m, l, 2), h + t * dim, kvd, dim, k + t * qd);
            ref_mv(ref_w(m, l, 3), h + t * dim, kvd, dim, v + t * qd);
        }
        for (size_t t = 0; t < n; t++) {
            for (size_t hq = 0; hq < nh; hq++) {
                double *ot = o + t * qd + hq * hd;

                memset(ot, 0, hd * sizeof(double));
                if (!lin) {
                    size_t kvh = hq / group;
                    double qv[1024];
                    double mx = -INFINITY;
                    double sum = 0.0;

                    memcpy(qv, q + t * qd + hq * hd, hd * sizeof(double));
                    ref_rope(qv, hd, t, hp->rope_theta);
                    for (size_t s = 0; s <= t; s++) {
                        double kv[1024];
                        double dot = 0.0;

                        memcpy(kv, k + s * qd + kvh * hd, hd * sizeof(double));
                        ref_rope(kv, hd, s, hp->rope_theta);
                        for (size_t i = 0; i < hd; i++) {
                            dot += qv[i] * kv[i];
                        }
                        sc[s] = dot / sqrt((double)hd);
                        mx = fmax(mx, sc[s]);
                    }
                    for (size_t s = 0; s <= t; s++) {
                        sc[s] = exp(sc[s] - mx);
                        sum += sc[s];
                    }
                    for (size_t s = 0; s <= t; s++) {
                        for (size_t i = 0; i < hd; i++) {
                            ot[i] += sc[s] / sum * v[s * qd + kvh * hd + i];
                        }
                    }
                } else {
                    double g = 1.0 - pow(2.0, -(double)(5 + hq));
                    double den = 0.0;

                    for (size_t s = 0; s <= t; s++) {
                        double dot = 0.0;
                        double w;

                        for (size_t i = 0; i < hd; i++) {
                            dot +=
                                ref_phi(q[t * qd + hq * hd + i]) * ref_phi(k[s * qd + hq * hd + i]);
                        }
                        w = pow(g, (double)(t - s)) * dot;
                        den += w;
                        for (size_t i = 0; i < hd; i++) {
                            ot[i] += w * v[s * qd + hq * hd + i];
                        }
                    }
                    for (size_t i = 0; i < hd; i++) {
                        ot[i] /= den + EPD_REF_LINEAR_EPS;
                    }
                }
            }
        }
        for (size_t t = 0; t < n; t++) {
            double *xt = x + t * dim;

            ref_mv(ref_w(m, l, 4), o + t * qd, dim, qd, d);
            for (size_t i = 0; i < dim; i++) {
                xt[i] += d[i];
            }
            ref_rmsnorm(xt, ref_w(m, l, 5), dim, hp->rms_eps, h + t * dim);
            ref_mv(ref_w(m, l, 6), h + t * dim, hp->ffn, dim, t1);
            ref_mv(ref_w(m, l, 7), h + t * dim, hp->ffn, dim, t2);
            for (size_t i = 0; i < hp->ffn; i++) {
                t1[i] = t1[i] / (1.0 + exp(-t1[i])) * t2[i];
            }
            ref_mv(ref_w(m, l, 8), t1, dim, hp->ffn, d);
            for (size_t i = 0; i < dim; i++) {
                xt[i] += d[i];
            }
        }
    }
    ref_rmsnorm(x + (n - 1) * dim, m->w[m->n - 2], dim, hp->rms_eps, h);
    ref_mv(m->w[m->n - 1], h, hp->vocab, dim, out);
    free(x);
    free(h);
    free(q);
    free(k);
    free(v);
    free(o);
    free(t1);
    free(t2);
    free(d);
    free(sc);
}

/* ---- helpers ------------------------------------------------------------- */

static epd_engine_t *open_tiny(uint32_t block_tokens, uint32_t max_context)
{
    epd_engine_config_t cfg = {.model_dir = tiny_dir,
                               .block_tokens = block_tokens,
                               .max_batch = 8,
                               .max_context = max_context};
    epd_engine_t *e = NULL;

    assert_int_equal(epd_engine_open("ref", &cfg, &e), EPD_OK);
    return e;
}

static size_t make_prompt(const char *text, int32_t *toks)
{
    size_t n = 0;

    toks[n++] = EPD_REF_BOS;
    for (const char *p = text; *p; p++) {
        toks[n++] = (unsigned char)*p;
    }
    return n;
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

static epd_kv_seq_t seq_of(const uint32_t *table, uint32_t n, uint32_t slot, uint64_t id)
{
    epd_kv_seq_t s = {.req_id = id, .block_table = table, .n_blocks = n, .state_slot = slot};

    return s;
}

/* ---- tests --------------------------------------------------------------- */

static void test_matches_double_reference(void **state)
{
    epd_engine_t *e = open_tiny(4, 0);
    const epd_engine_info_t *info = epd_engine_info(e);
    ref_model_t m;
    epd_kv_pool_t pool;
    uint32_t table[16];
    int32_t toks[64];
    float logits[258];
    double want[258];
    size_t n = make_prompt("The quick brown fox.", toks);
    epd_prefill_args_t a;
    double err;

    (void)state;
    ref_load(&m, tiny_dir, &tiny.hp);
    epd_test_pool(e, 16, 3, &pool);
    for (uint32_t i = 0; i < 16; i++) {
        table[i] = 15 - i; /* reversed: pages are not in order */
    }
    a = (epd_prefill_args_t){
        .seq = seq_of(table, 16, 2, 1), .tokens = toks, .n_tokens = (uint32_t)n, .start = 0};
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_OK);
    ref_forward(&m, toks, n, want);
    err = epd_test_rel_err(logits, want, info->vocab_size);
    print_message("prefill of %zu tokens: relative error %.3g\n", n, err);
    assert_true(err < TOL);
    for (int step = 0; step < 8; step++) {
        epd_decode_req_t r = {.seq = a.seq, .pos = (uint32_t)n, .token = argmax(logits, 258)};

        toks[n++] = r.token;
        assert_int_equal(epd_engine_decode(e, &pool, &r, 1, logits), EPD_OK);
        ref_forward(&m, toks, n, want);
        err = epd_test_rel_err(logits, want, info->vocab_size);
        if (err >= TOL) {
            print_message("decode step %d: relative error %.3g\n", step, err);
        }
        assert_true(err < TOL);
    }
    ref_free(&m);
    epd_free(pool.base);
    epd_engine_close(e);
}

static void test_reference_is_sensitive(void **state)
{
    /* The reference comparison must be able to fail: a model whose weights
     * differ by one seed gives logits far outside the tolerance. */
    epd_mkmodel_params_t p = tiny;
    ref_model_t m;
    epd_engine_t *e = open_tiny(4, 0);
    epd_kv_pool_t pool;
    uint32_t table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    int32_t toks[32];
    float logits[258];
    double want[258];
    size_t n = make_prompt("abc", toks);
    epd_prefill_args_t a = {.seq = seq_of(table, 8, 0, 1), .tokens = toks, .n_tokens = (uint32_t)n};

    (void)state;
    p.seed = 8;
    ref_load(&m, epd_test_write_model(tmpdir, "other", &p), &p.hp);
    epd_test_pool(e, 8, 1, &pool);
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_OK);
    ref_forward(&m, toks, n, want);
    assert_true(epd_test_rel_err(logits, want, 258) > 1e-2);
    ref_free(&m);
    epd_free(pool.base);
    epd_engine_close(e);
}

static void test_chunked_equals_whole(void **state)
{
    epd_engine_t *e = open_tiny(4, 0);
    epd_kv_pool_t pool;
    uint32_t ta[16];
    uint32_t tb[16];
    int32_t toks[64];
    float whole[258];
    float chunked[258];
    size_t n = make_prompt("Chunked prefill must equal whole!!", toks);
    uint32_t cuts[] = {0, 5, 6, 13, 16, (uint32_t)n};
    epd_prefill_args_t a;

    (void)state;
    epd_test_pool(e, 32, 2, &pool);
    for (uint32_t i = 0; i < 16; i++) {
        ta[i] = i;
        tb[i] = 31 - i;
    }
    a = (epd_prefill_args_t){.seq = seq_of(ta, 16, 0, 1), .tokens = toks, .n_tokens = (uint32_t)n};
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, whole), EPD_OK);
    for (size_t c = 0; c + 1 < sizeof(cuts) / sizeof(cuts[0]); c++) {
        a = (epd_prefill_args_t){.seq = seq_of(tb, 16, 1, 2),
                                 .tokens = toks + cuts[c],
                                 .n_tokens = cuts[c + 1] - cuts[c],
                                 .start = cuts[c]};
        assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, chunked), EPD_OK);
    }
    /* bit for bit: the engine is split-invariant (epd_engine_prefill) */
    assert_memory_equal(chunked, whole, sizeof(whole));
    /* and the caches continue identically */
    for (int step = 0; step < 10; step++) {
        epd_decode_req_t ra = {
            .seq = seq_of(ta, 16, 0, 1), .pos = (uint32_t)n + step, .token = argmax(whole, 258)};
        epd_decode_req_t rb = {
            .seq = seq_of(tb, 16, 1, 2), .pos = (uint32_t)n + step, .token = argmax(chunked, 258)};

        assert_int_equal(ra.token, rb.token);
        assert_int_equal(epd_engine_decode(e, &pool, &ra, 1, whole), EPD_OK);
        assert_int_equal(epd_engine_decode(e, &pool, &rb, 1, chunked), EPD_OK);
        assert_memory_equal(chunked, whole, sizeof(whole));
    }
    epd_free(pool.base);
    epd_engine_close(e);
}

static void test_batch_equals_single(void **state)
{
    const char *prompts[3] = {"a", "medium prompt", "a longer prompt than the others"};
    epd_engine_t *e = open_tiny(4, 0);
    epd_kv_pool_t pool;
    uint32_t tables[3][16];
    uint32_t stables[3][16];
    int32_t toks[3][64];
    size_t len[3];
    float blog[3 * 258];
    float slog[3][258];
    epd_decode_req_t reqs[3];

    (void)state;
    epd_test_pool(e, 96, 6, &pool);
    for (int r = 0; r < 3; r++) {
        epd_prefill_args_t a;

        for (uint32_t i = 0; i < 16; i++) {
            tables[r][i] = i * 3 + (uint32_t)r;        /* interleaved pages */
            stables[r][i] = 48 + (uint32_t)r * 16 + i; /* the single runs' own pages */
        }
        len[r] = make_prompt(prompts[r], toks[r]);
        a = (epd_prefill_args_t){.seq = seq_of(tables[r], 16, (uint32_t)r, 1 + r),
                                 .tokens = toks[r],
                                 .n_tokens = (uint32_t)len[r]};
        assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, blog + r * 258), EPD_OK);
        a.seq = seq_of(stables[r], 16, 3 + (uint32_t)r, 11 + r);
        assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, slog[r]), EPD_OK);
        reqs[r] = (epd_decode_req_t){.seq = seq_of(tables[r], 16, (uint32_t)r, 1 + r),
                                     .pos = (uint32_t)len[r],
                                     .token = argmax(blog + r * 258, 258)};
    }
    for (int step = 0; step < 8; step++) {
        assert_int_equal(epd_engine_decode(e, &pool, reqs, 3, blog), EPD_OK);
        for (int r = 0; r < 3; r++) {
            epd_decode_req_t one = {.seq = seq_of(stables[r], 16, 3 + (uint32_t)r, 11 + r),
                                    .pos = reqs[r].pos,
                                    .token = reqs[r].token};

            assert_int_equal(epd_engine_decode(e, &pool, &one, 1, slog[r]), EPD_OK);
            /* bit for bit: a seeded sample at a near-tie would follow any
             * difference, so a batch must not change a request's logits */
            assert_memory_equal(blog + r * 258, slog[r], sizeof(slog[r]));
            assert_int_equal(argmax(blog + r * 258, 258), argmax(slog[r], 258));
            reqs[r].pos++;
            reqs[r].token = argmax(blog + r * 258, 258);
        }
    }
    epd_free(pool.base);
    epd_engine_close(e);
}

typedef struct {
    const epd_engine_t *e;
    const epd_kv_pool_t *pool;
    uint32_t calls;
    uint32_t layers[16];
    unsigned char *snap[16];
    size_t snap_len[16];
    uint32_t abort_at;
} sink_rec_t;

/* Copies what the callback says is final: for attention, the reported token
 * rows of every reported block (K and V, every kv head); for linear, the slot. */
static size_t sink_bytes(const sink_rec_t *s, const epd_layer_done_t *d, unsigned char *out)
{
    const epd_kv_layout_t *kv = &epd_engine_info(s->e)->kv;
    size_t n = 0;
    uint64_t off;

    if (d->kind == EPD_LAYER_LINEAR) {
        assert_int_equal(epd_kv_state_offset(kv, s->pool->n_blocks, s->pool->n_state_slots,
                                             d->layer, d->state_slot, &off),
                         EPD_OK);
        if (out) {
            memcpy(out, (char *)s->pool->base + off, kv->state_bytes);
        }
        return kv->state_bytes;
    }
    for (uint32_t p = d->tok_start; p < d->tok_end; p++) {
        uint32_t bi = p / kv->block_tokens - d->first_block;
        size_t row = (size_t)kv->head_dim * sizeof(float);

        assert_true(bi < d->n_blocks);
        assert_int_equal(
            epd_kv_block_offset(kv, s->pool->n_blocks, d->layer, d->block_ids[bi], &off), EPD_OK);
        for (uint32_t kvv = 0; kvv < 2; kvv++) {
            for (uint32_t h = 0; h < kv->n_kv_heads; h++) {
                size_t o = off + ((size_t)kvv * kv->n_kv_heads + h) * kv->block_tokens * row +
                           (p % kv->block_tokens) * row;

                if (out) {
                    memcpy(out + n, (char *)s->pool->base + o, row);
                }
                n += row;
            }
        }
    }
    return n;
}

static epd_status_t sink_cb(void *ctx, uint32_t layer, const epd_layer_done_t *d)
{
    sink_rec_t *s = ctx;

    assert_int_equal(layer, d->layer);
    if (s->calls == s->abort_at) {
        return EPD_ERR_CANCELED;
    }
    s->layers[s->calls] = layer;
    s->snap_len[s->calls] = sink_bytes(s, d, NULL);
    s->snap[s->calls] = malloc(s->snap_len[s->calls]);
    assert_non_null(s->snap[s->calls]);
    sink_bytes(s, d, s->snap[s->calls]);
    s->calls++;
    return EPD_OK;
}

static void check_sink_run(epd_engine_t *e, epd_kv_pool_t *pool, const uint32_t *table,
                           const int32_t *toks, uint32_t start, uint32_t n)
{
    const epd_kv_layout_t *kv = &epd_engine_info(e)->kv;
    sink_rec_t rec = {.e = e, .pool = pool, .abort_at = UINT32_MAX};
    epd_engine_sink_t sink = {.cb = sink_cb, .ctx = &rec};
    epd_prefill_args_t a = {
        .seq = seq_of(table, 16, 1, 5), .tokens = toks + start, .n_tokens = n, .start = start};
    float logits[258];

    assert_int_equal(epd_engine_prefill(e, pool, &a, &sink, logits), EPD_OK);
    assert_int_equal(rec.calls, kv->n_layers);
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        epd_layer_done_t d = {.layer = l,
                              .kind = (epd_layer_kind_t)kv->kind[l],
                              .tok_start = start,
                              .tok_end = start + n,
                              .first_block = start / kv->block_tokens,
                              .state_slot = 1};
        unsigned char *now = malloc(rec.snap_len[l]);

        d.n_blocks = (start + n - 1) / kv->block_tokens - d.first_block + 1;
        d.block_ids = table + d.first_block;
        assert_int_equal(rec.layers[l], l);
        assert_non_null(now);
        assert_int_equal(sink_bytes(&rec, &d, now), rec.snap_len[l]);
        assert_memory_equal(now, rec.snap[l], rec.snap_len[l]);
        free(now);
        free(rec.snap[l]);
    }
}

static void test_sink_once_per_layer_with_final_bytes(void **state)
{
    epd_engine_t *e = open_tiny(4, 0);
    epd_kv_pool_t pool;
    uint32_t table[16];
    int32_t toks[64];
    size_t n = make_prompt("sink sees final bytes", toks);

    (void)state;
    epd_test_pool(e, 20, 2, &pool);
    for (uint32_t i = 0; i < 16; i++) {
        table[i] = (i * 7) % 20;
    }
    check_sink_run(e, &pool, table, toks, 0, 9);               /* first chunk */
    check_sink_run(e, &pool, table, toks, 9, (uint32_t)n - 9); /* second chunk */
    epd_free(pool.base);
    epd_engine_close(e);
}

static void test_sink_abort(void **state)
{
    epd_engine_t *e = open_tiny(4, 0);
    epd_kv_pool_t pool;
    uint32_t table[4] = {0, 1, 2, 3};
    int32_t toks[16];
    size_t n = make_prompt("abort", toks);
    sink_rec_t rec = {.e = e, .pool = &pool, .abort_at = 2};
    epd_engine_sink_t sink = {.cb = sink_cb, .ctx = &rec};
    epd_prefill_args_t a = {.seq = seq_of(table, 4, 0, 1), .tokens = toks, .n_tokens = (uint32_t)n};
    float logits[258];

    (void)state;
    epd_test_pool(e, 4, 1, &pool);
    assert_int_equal(epd_engine_prefill(e, &pool, &a, &sink, logits), EPD_ERR_CANCELED);
    assert_int_equal(rec.calls, 2);
    free(rec.snap[0]);
    free(rec.snap[1]);
    epd_free(pool.base);
    epd_engine_close(e);
}

/* Generates up to max tokens from text with the sampler, as a daemon would. */
static size_t generate(epd_engine_t *e, const char *text, const epd_sample_params_t *sp,
                       int32_t *out, size_t max)
{
    const epd_engine_info_t *info = epd_engine_info(e);
    epd_sample_scratch_t *scratch;
    epd_kv_pool_t pool;
    uint32_t table[64];
    int32_t toks[256];
    float logits[258];
    size_t n = make_prompt(text, toks);
    size_t k = 0;
    epd_prefill_args_t a = {
        .seq = seq_of(table, 64, 0, 1), .tokens = toks, .n_tokens = (uint32_t)n};

    for (uint32_t i = 0; i < 64; i++) {
        table[i] = i;
    }
    epd_test_pool(e, 64, 1, &pool);
    assert_int_equal(epd_sample_scratch_create(info->vocab_size, &scratch), EPD_OK);
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_OK);
    while (k < max) {
        epd_decode_req_t r = {.seq = a.seq, .pos = (uint32_t)(n + k)};

        assert_int_equal(epd_sample_token(sp, scratch, logits, 258, k, &out[k]), EPD_OK);
        r.token = out[k++];
        if (r.token == info->eos_token || k == max) {
            break;
        }
        assert_int_equal(epd_engine_decode(e, &pool, &r, 1, logits), EPD_OK);
    }
    epd_sample_scratch_destroy(scratch);
    epd_free(pool.base);
    return k;
}

static void test_seeds(void **state)
{
    epd_engine_t *e = open_tiny(16, 0);
    epd_sample_params_t sp = {.temperature = 1.0f, .top_p = 0.95f, .top_k = 50, .seed = 7};
    int32_t a[48], b[48], c[48];
    size_t na, nb, nc;

    (void)state;
    na = generate(e, "seeded", &sp, a, 48);
    nb = generate(e, "seeded", &sp, b, 48);
    sp.seed = 8;
    nc = generate(e, "seeded", &sp, c, 48);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * sizeof(int32_t));
    assert_true(na != nc || memcmp(a, c, na * sizeof(int32_t)) != 0);
    epd_engine_close(e);
}

static void test_greedy_not_degenerate(void **state)
{
    epd_engine_t *e = open_tiny(16, 0);
    epd_sample_params_t sp;
    int32_t out[64];
    int seen[258] = {0};
    size_t n;
    int distinct = 0;

    (void)state;
    epd_sample_params_default(&sp);
    n = generate(e, "Once upon a time", &sp, out, 64);
    for (size_t i = 0; i < n; i++) {
        distinct += !seen[out[i]]++;
    }
    print_message("greedy: %zu tokens, %d distinct\n", n, distinct);
    assert_true(n < 8 || distinct >= 4);
    epd_engine_close(e);
}

static void test_refuses_bad_requests(void **state)
{
    epd_engine_t *e = open_tiny(4, 24);
    const epd_engine_info_t *info = epd_engine_info(e);
    epd_kv_pool_t pool;
    epd_kv_pool_t small;
    uint32_t table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    uint32_t bad_table[8] = {0, 1, 99, 3, 4, 5, 6, 7};
    int32_t toks[32];
    float logits[2 * 258];
    epd_prefill_args_t a = {.seq = seq_of(table, 8, 0, 1), .tokens = toks, .n_tokens = 10};
    epd_decode_req_t r[2];

    (void)state;
    assert_int_equal(info->max_context, 24);
    for (int i = 0; i < 32; i++) {
        toks[i] = 'a' + i % 26;
    }
    epd_test_pool(e, 8, 2, &pool);
    a.n_tokens = 0;
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_ERR_INVALID_PARAM);
    a.n_tokens = 25; /* longer than the context */
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_ERR_TOO_LONG);
    a.n_tokens = 20;
    a.start = 5; /* chunk ends past the context */
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_ERR_TOO_LONG);
    a.start = 0;
    a.seq.n_blocks = 4; /* 16 tokens of room for 20 */
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_ERR_INVALID_PARAM);
    a.seq = seq_of(bad_table, 8, 0, 1);
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_ERR_INVALID_PARAM);
    a.seq = seq_of(table, 8, 2, 1); /* slot outside the pool */
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_ERR_INVALID_PARAM);
    a.seq = seq_of(table, 8, 0, 1);
    toks[3] = 258;
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_ERR_INVALID_PARAM);
    toks[3] = -1;
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_ERR_INVALID_PARAM);
    toks[3] = 'x';
    small = pool;
    small.bytes = pool.bytes - 1;
    assert_int_equal(epd_engine_prefill(e, &small, &a, NULL, logits), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_OK);
    /* decode */
    r[0] = (epd_decode_req_t){.seq = seq_of(table, 8, 0, 1), .pos = 24, .token = 'a'};
    assert_int_equal(epd_engine_decode(e, &pool, r, 1, logits), EPD_ERR_TOO_LONG);
    r[0].pos = 20;
    r[1] = r[0]; /* same slot and block twice in one batch */
    assert_int_equal(epd_engine_decode(e, &pool, r, 2, logits), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_engine_decode(e, &pool, r, 0, logits), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_engine_decode(e, &pool, r, 9, logits), EPD_ERR_INVALID_PARAM);
    r[0].token = 1000;
    assert_int_equal(epd_engine_decode(e, &pool, r, 1, logits), EPD_ERR_INVALID_PARAM);
    r[0].token = 'a';
    assert_int_equal(epd_engine_decode(e, &pool, r, 1, logits), EPD_OK);
    epd_free(pool.base);
    epd_engine_close(e);
}

static void test_layout_offsets(void **state)
{
    epd_engine_t *e = open_tiny(4, 0);
    const epd_kv_layout_t *kv = &epd_engine_info(e)->kv;
    uint64_t off;
    uint64_t total = epd_kv_pool_bytes(kv, 10, 3);

    (void)state;
    /* tiny is "LA" x2: layers 1 and 3 attention, 0 and 2 linear */
    assert_int_equal(kv->n_layers, 4);
    assert_int_equal(kv->n_attn_layers, 2);
    assert_int_equal(kv->n_linear_layers, 2);
    assert_int_equal(kv->kind[0], EPD_LAYER_LINEAR);
    assert_int_equal(kv->kind[1], EPD_LAYER_ATTENTION);
    assert_int_equal(kv->block_bytes, 2 * 2 * 4 * 8 * sizeof(float));
    assert_int_equal(kv->state_bytes, 4 * (8 * 8 + 8) * sizeof(float));
    assert_int_equal(total, 2 * 10 * kv->block_bytes + 2 * 3 * kv->state_bytes);
    assert_int_equal(epd_kv_block_offset(kv, 10, 1, 0, &off), EPD_OK);
    assert_int_equal(off, 0);
    assert_int_equal(epd_kv_block_offset(kv, 10, 3, 9, &off), EPD_OK);
    assert_int_equal(off, 19 * kv->block_bytes);
    assert_int_equal(epd_kv_state_offset(kv, 10, 3, 2, 2, &off), EPD_OK);
    assert_int_equal(off + kv->state_bytes, total);
    assert_int_equal(epd_kv_block_offset(kv, 10, 0, 0, &off), EPD_ERR_OUT_OF_RANGE);
    assert_int_equal(epd_kv_block_offset(kv, 10, 1, 10, &off), EPD_ERR_OUT_OF_RANGE);
    assert_int_equal(epd_kv_state_offset(kv, 10, 3, 1, 0, &off), EPD_ERR_OUT_OF_RANGE);
    assert_int_equal(epd_kv_state_offset(kv, 10, 3, 0, 3, &off), EPD_ERR_OUT_OF_RANGE);
    assert_int_equal(epd_kv_state_offset(kv, 10, 3, 7, 0, &off), EPD_ERR_OUT_OF_RANGE);
    epd_engine_close(e);
}

static void test_open_allocation_failures(void **state)
{
    epd_engine_config_t cfg = {.model_dir = tiny_dir};
    epd_alloc_stats_t before;
    epd_alloc_stats_t after;
    long n;

    (void)state;
    for (n = 0; n < 1000; n++) {
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
    print_message("open succeeded after %ld allocations\n", n);
    assert_true(n > 5 && n < 1000);
}

static void test_prefill_oom_and_decode_allocates_nothing(void **state)
{
    epd_engine_t *e = open_tiny(4, 0);
    epd_kv_pool_t pool;
    uint32_t table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    int32_t toks[32];
    float logits[258];
    size_t n = make_prompt("out of memory", toks);
    epd_prefill_args_t a = {.seq = seq_of(table, 8, 0, 1), .tokens = toks, .n_tokens = (uint32_t)n};
    epd_decode_req_t r = {.seq = a.seq, .pos = (uint32_t)n, .token = 'x'};
    epd_alloc_stats_t before;
    epd_alloc_stats_t after;

    (void)state;
    epd_test_pool(e, 8, 1, &pool);
    for (long k = 0; k < 4; k++) {
        epd_alloc_stats(&before);
        epd_alloc_fail_after(k);
        assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_ERR_NO_MEMORY);
        epd_alloc_fail_after(-1);
        epd_alloc_stats(&after);
        assert_int_equal(after.live_blocks, before.live_blocks);
    }
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_OK);
    /* decode runs on scratch sized at open: not one allocation per step */
    epd_alloc_stats(&before);
    for (int step = 0; step < 5; step++) {
        assert_int_equal(epd_engine_decode(e, &pool, &r, 1, logits), EPD_OK);
        r.pos++;
        r.token = argmax(logits, 258);
    }
    epd_alloc_stats(&after);
    assert_int_equal(after.total_allocs, before.total_allocs);
    epd_free(pool.base);
    epd_engine_close(e);
}

static void test_unknown_engine(void **state)
{
    epd_engine_config_t cfg = {.model_dir = tiny_dir};
    epd_engine_t *e = NULL;

    (void)state;
    assert_int_equal(epd_engine_open("nonesuch", &cfg, &e), EPD_ERR_NOT_FOUND);
    assert_null(e);
    assert_non_null(epd_engine_builtin("ref"));
    assert_null(epd_engine_builtin("sim2"));
}

/* ---- split invariance, replay, checkpoints (what a prefix cache needs) ---- */

static const char *small_dir; /* dim 128, "LLA": more than one OpenBLAS path */

static epd_engine_t *open_dir(const char *dir, uint32_t block_tokens)
{
    epd_engine_config_t cfg = {.model_dir = dir, .block_tokens = block_tokens, .max_batch = 4};
    epd_engine_t *e = NULL;

    assert_int_equal(epd_engine_open("ref", &cfg, &e), EPD_OK);
    return e;
}

/* A prompt of n tokens: BOS then seeded bytes. */
static void random_prompt(int32_t *toks, uint32_t n, uint32_t seed)
{
    toks[0] = EPD_REF_BOS;
    for (uint32_t i = 1; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        toks[i] = 32 + (int32_t)((seed >> 16) % 90);
    }
}

/* Bytes of the KV of positions [0, n) of every attention layer (full
 * blocks whole, the last one up to n) and every state slot, compared
 * between two block tables / slots of one pool. */
static void assert_same_kv(epd_engine_t *e, const epd_kv_pool_t *pool, const uint32_t *ta,
                           uint32_t sa, const uint32_t *tb, uint32_t sb, uint32_t n)
{
    const epd_kv_layout_t *kv = &epd_engine_info(e)->kv;
    size_t row = (size_t)kv->head_dim * sizeof(float);

    for (uint32_t l = 0; l < kv->n_layers; l++) {
        uint64_t oa, ob;

        if (kv->kind[l] == EPD_LAYER_LINEAR) {
            assert_int_equal(epd_kv_state_offset(kv, pool->n_blocks, pool->n_state_slots, l, sa,
                                                 &oa), EPD_OK);
            assert_int_equal(epd_kv_state_offset(kv, pool->n_blocks, pool->n_state_slots, l, sb,
                                                 &ob), EPD_OK);
            assert_memory_equal((char *)pool->base + oa, (char *)pool->base + ob,
                                kv->state_bytes);
            continue;
        }
        for (uint32_t p = 0; p < n; p++) {
            uint32_t bt = kv->block_tokens;

            assert_int_equal(epd_kv_block_offset(kv, pool->n_blocks, l, ta[p / bt], &oa), EPD_OK);
            assert_int_equal(epd_kv_block_offset(kv, pool->n_blocks, l, tb[p / bt], &ob), EPD_OK);
            for (uint32_t r = 0; r < 2 * kv->n_kv_heads; r++) {
                size_t off = ((size_t)r * bt + p % bt) * row;

                assert_memory_equal((char *)pool->base + oa + off, (char *)pool->base + ob + off,
                                    row);
            }
        }
    }
}

/* Whole prefill vs the same prompt cut once at every cut point: the KV,
 * the state and the logits are the same bits (epd_engine.h's split
 * invariance). */
static void check_split_invariant(const char *dir, uint32_t n, uint32_t step)
{
    epd_engine_t *e = open_dir(dir, 16);
    uint32_t vocab = epd_engine_info(e)->vocab_size;
    uint32_t nb = (n + 15) / 16;
    uint32_t *ta = calloc(nb, sizeof(uint32_t));
    uint32_t *tb = calloc(nb, sizeof(uint32_t));
    int32_t *toks = calloc(n, sizeof(int32_t));
    float *whole = calloc(vocab, sizeof(float));
    float *cut = calloc(vocab, sizeof(float));
    epd_kv_pool_t pool;
    epd_prefill_args_t a;

    assert_non_null(ta);
    assert_non_null(tb);
    assert_non_null(toks);
    assert_non_null(whole);
    assert_non_null(cut);
    random_prompt(toks, n, n);
    epd_test_pool(e, 2 * nb, 2, &pool);
    for (uint32_t i = 0; i < nb; i++) {
        ta[i] = i;
        tb[i] = 2 * nb - 1 - i;
    }
    a = (epd_prefill_args_t){.seq = seq_of(ta, nb, 0, 1), .tokens = toks, .n_tokens = n};
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, whole), EPD_OK);
    for (uint32_t c = 1; c < n; c += step) {
        a = (epd_prefill_args_t){.seq = seq_of(tb, nb, 1, 2), .tokens = toks, .n_tokens = c};
        assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, cut), EPD_OK);
        a.tokens = toks + c;
        a.n_tokens = n - c;
        a.start = c;
        assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, cut), EPD_OK);
        if (memcmp(whole, cut, vocab * sizeof(float)) != 0) {
            fail_msg("%s: logits of %u tokens cut at %u differ from whole", dir, n, c);
        }
        assert_same_kv(e, &pool, ta, 0, tb, 1, n);
    }
    free(ta);
    free(tb);
    free(toks);
    free(whole);
    free(cut);
    epd_free(pool.base);
    epd_engine_close(e);
}

static void test_split_invariant_bitwise(void **state)
{
    (void)state;
    check_split_invariant(tiny_dir, 200, 1);  /* every cut, several tiles */
    check_split_invariant(small_dir, 300, 7); /* wider products */
}

/*
 * Checkpoints equal the state of a prefill that stops there; a replay from
 * a checkpoint over cached blocks (not written) ends exactly where the
 * whole prefill ends, with the cached blocks untouched.
 */
static void test_replay_from_checkpoint(void **state)
{
    epd_engine_t *e = open_dir(small_dir, 16);
    const epd_engine_info_t *info = epd_engine_info(e);
    const epd_kv_layout_t *kv = &info->kv;
    uint64_t ck_bytes = (uint64_t)kv->n_linear_layers * kv->state_bytes;
    uint32_t n = 150;
    uint32_t ta[10], tb[10], tc[10];
    int32_t toks[150];
    float whole[259], other[259];
    unsigned char *ck16 = malloc(ck_bytes), *ck48 = malloc(ck_bytes), *ck150 = malloc(ck_bytes);
    unsigned char *snap;
    epd_state_ckpt_t ckpts[3] = {{16, ck16}, {48, ck48}, {150, ck150}};
    epd_kv_pool_t pool;
    epd_prefill_args_t a;
    uint64_t off;

    (void)state;
    assert_non_null(ck16);
    assert_non_null(ck48);
    assert_non_null(ck150);
    random_prompt(toks, n, 99);
    epd_test_pool(e, 30, 3, &pool);
    for (uint32_t i = 0; i < 10; i++) {
        ta[i] = i;
        tb[i] = 10 + i;
        tc[i] = 20 + i;
    }
    a = (epd_prefill_args_t){.seq = seq_of(ta, 10, 0, 1), .tokens = toks, .n_tokens = n,
                             .ckpts = ckpts, .n_ckpts = 3};
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, whole), EPD_OK);
    /* a checkpoint at the end is the slot itself */
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        if (kv->kind[l] == EPD_LAYER_LINEAR) {
            assert_int_equal(epd_kv_state_offset(kv, 30, 3, l, 0, &off), EPD_OK);
            assert_memory_equal(ck150 + (size_t)kv->kind_index[l] * kv->state_bytes,
                                (char *)pool.base + off, kv->state_bytes);
        }
    }
    /* the checkpoint at 48 is the state of a 48-token prefill */
    a = (epd_prefill_args_t){.seq = seq_of(tb, 10, 1, 2), .tokens = toks, .n_tokens = 48};
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, other), EPD_OK);
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        if (kv->kind[l] == EPD_LAYER_LINEAR) {
            assert_int_equal(epd_kv_state_offset(kv, 30, 3, l, 1, &off), EPD_OK);
            assert_memory_equal(ck48 + (size_t)kv->kind_index[l] * kv->state_bytes,
                                (char *)pool.base + off, kv->state_bytes);
        }
    }
    /* replay: blocks 0..3 (positions < 64) are "cached" — ta's — the state
     * restored from the checkpoint at 16, positions [16, 64) replayed, the
     * rest computed into fresh blocks */
    memcpy(tc, ta, 4 * sizeof(uint32_t));
    snap = malloc(pool.bytes);
    assert_non_null(snap);
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        if (kv->kind[l] == EPD_LAYER_LINEAR) {
            assert_int_equal(epd_kv_state_offset(kv, 30, 3, l, 2, &off), EPD_OK);
            memcpy((char *)pool.base + off, ck16 + (size_t)kv->kind_index[l] * kv->state_bytes,
                   kv->state_bytes);
        }
    }
    memcpy(snap, pool.base, pool.bytes);
    a = (epd_prefill_args_t){.seq = seq_of(tc, 10, 2, 3), .tokens = toks + 16,
                             .n_tokens = n - 16, .start = 16, .replay_end = 64};
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, other), EPD_OK);
    assert_memory_equal(whole, other, sizeof(float) * info->vocab_size);
    assert_same_kv(e, &pool, ta, 0, tc, 2, n);
    /* the shared blocks were read, never written */
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        if (kv->kind[l] == EPD_LAYER_ATTENTION) {
            for (uint32_t b = 0; b < 4; b++) {
                assert_int_equal(epd_kv_block_offset(kv, 30, l, ta[b], &off), EPD_OK);
                assert_memory_equal(snap + off, (char *)pool.base + off, kv->block_bytes);
            }
        }
    }
    /* refusals */
    a.replay_end = 16; /* not after start */
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, other), EPD_ERR_INVALID_PARAM);
    a.replay_end = n + 1;
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, other), EPD_ERR_INVALID_PARAM);
    a.replay_end = 0;
    a.ckpts = ckpts;
    a.n_ckpts = 2; /* 16 is not inside (16, 150] */
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, other), EPD_ERR_INVALID_PARAM);
    ckpts[0] = (epd_state_ckpt_t){64, ck16};
    ckpts[1] = (epd_state_ckpt_t){48, ck48}; /* unsorted */
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, other), EPD_ERR_INVALID_PARAM);
    ckpts[1] = (epd_state_ckpt_t){80, NULL};
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, other), EPD_ERR_INVALID_PARAM);
    free(snap);
    free(ck16);
    free(ck48);
    free(ck150);
    epd_free(pool.base);
    epd_engine_close(e);
}

/* The digest names the model: equal for two opens of one folder, different
 * for another seed. */
static void test_model_digest(void **state)
{
    epd_mkmodel_params_t p = tiny;
    const char *other;
    epd_engine_t *a = open_tiny(4, 0);
    epd_engine_t *b = open_tiny(16, 0);
    epd_engine_t *c;
    static const uint8_t zero[16];

    (void)state;
    p.seed = 8;
    other = epd_test_write_model(tmpdir, "tiny8", &p);
    c = open_dir(other, 4);
    assert_memory_equal(epd_engine_info(a)->model_digest, epd_engine_info(b)->model_digest, 16);
    assert_memory_not_equal(epd_engine_info(a)->model_digest, zero, 16);
    assert_memory_not_equal(epd_engine_info(a)->model_digest, epd_engine_info(c)->model_digest,
                            16);
    epd_engine_close(a);
    epd_engine_close(b);
    epd_engine_close(c);
}

static int setup(void **state)
{
    (void)state;
    tmpdir = epd_test_tmpdir();
    epd_test_tiny_params(&tiny);
    tiny_dir = epd_test_write_model(tmpdir, "tiny", &tiny);
    {
        epd_mkmodel_params_t p;

        epd_mkmodel_defaults(&p);
        p.hp.dim = 128;
        p.hp.n_layers = 3;
        p.hp.n_heads = 4;
        p.hp.n_kv_heads = 2;
        p.hp.head_dim = 32;
        p.hp.ffn = 256;
        p.hp.max_context = 512;
        small_dir = epd_test_write_model(tmpdir, "small", &p);
    }
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
        cmocka_unit_test(test_matches_double_reference),
        cmocka_unit_test(test_reference_is_sensitive),
        cmocka_unit_test(test_chunked_equals_whole),
        cmocka_unit_test(test_batch_equals_single),
        cmocka_unit_test(test_sink_once_per_layer_with_final_bytes),
        cmocka_unit_test(test_sink_abort),
        cmocka_unit_test(test_seeds),
        cmocka_unit_test(test_greedy_not_degenerate),
        cmocka_unit_test(test_refuses_bad_requests),
        cmocka_unit_test(test_layout_offsets),
        cmocka_unit_test(test_open_allocation_failures),
        cmocka_unit_test(test_prefill_oom_and_decode_allocates_nothing),
        cmocka_unit_test(test_unknown_engine),
        cmocka_unit_test(test_split_invariant_bitwise),
        cmocka_unit_test(test_replay_from_checkpoint),
        cmocka_unit_test(test_model_digest),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
