/*
 * test_epd_hf.c — the Hugging Face engine (engine/epd_hf*.c) on every
 * architecture (llama with llama3 RoPE scaling, tied llama, qwen2 with
 * biases, qwen3 with q/k norms and head_dim != hidden/heads, qwen3_moe),
 * on folders written here by epd_hf_mkmodel_write (BF16, no tokenizer):
 *  - the logits of every position against a naive double-precision forward
 *    pass written in this file from the architectures' published math
 *    (per-position loops, explicit RoPE angles, the MoE router by sorting);
 *  - split invariance (prefill cut anywhere = whole, KV and logits bit for
 *    bit) and batch invariance (a decode batch = each request alone);
 *  - a sharded folder = the single-file one, bit for bit;
 *  - the sink once per layer, the digest, the allocation-failure sweep.
 * The numpy oracle (tests/oracle, another helper's) checks the same math
 * with the real vocabularies; this one needs nothing outside the build.
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
#include "epd_hf_model.h"
#include "epd_safetensors.h"
#include "epd_test_engine_util.h"

#define TOL 1e-5
#define N_MODELS 5

static const char *tmpdir;
static const char *dirs[N_MODELS];
static epd_hf_mkmodel_params_t params[N_MODELS];
static const char *sharded_dir; /* models[0] in 3 shards */

/* ---- the double-precision reference -------------------------------------- */

typedef struct {
    epd_hf_hparams_t hp;
    size_t n;
    double **w; /* [spec index] */
    epd_hf_tensor_spec_t *spec;
} ref_t;

static void ref_load(ref_t *m, const char *dir, const epd_hf_hparams_t *hp)
{
    epd_st_file_t *f;

    m->hp = *hp;
    m->n = epd_hf_tensor_count(hp);
    m->w = calloc(m->n, sizeof(*m->w));
    m->spec = calloc(m->n, sizeof(*m->spec));
    assert_non_null(m->w);
    assert_non_null(m->spec);
    assert_int_equal(epd_st_open(epd_test_path(dir, "model.safetensors"), &f), EPD_OK);
    for (size_t i = 0; i < m->n; i++) {
        epd_hf_tensor_spec_t *s = &m->spec[i];
        float *tmp;

        epd_hf_tensor_spec(hp, i, s);
        tmp = malloc(s->n_elems * sizeof(float));
        m->w[i] = malloc(s->n_elems * sizeof(double));
        assert_non_null(tmp);
        assert_non_null(m->w[i]);
        assert_int_equal(epd_st_read_f32(f, s->name, s->ndim, s->shape, tmp), EPD_OK);
        for (uint64_t j = 0; j < s->n_elems; j++) {
            m->w[i][j] = tmp[j];
        }
        free(tmp);
    }
    epd_st_close(f);
}

static void ref_free(ref_t *m)
{
    for (size_t i = 0; i < m->n; i++) {
        free(m->w[i]);
    }
    free(m->w);
    free(m->spec);
}

/* The weights of (role, layer, expert). */
static const double *ref_get(const ref_t *m, epd_hf_role_t role, uint32_t layer, uint32_t expert)
{
    for (size_t i = 0; i < m->n; i++) {
        const epd_hf_tensor_spec_t *s = &m->spec[i];

        if (s->role == role &&
            (role == EPD_HF_T_EMBED || role == EPD_HF_T_FINAL_NORM || role == EPD_HF_T_LM_HEAD ||
             s->layer == layer) &&
            s->expert == expert) {
            return m->w[i];
        }
    }
    return NULL;
}

/* y[out] = W[out][in] x */
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

static void ref_rmsnorm(const double *x, const double *w, size_t n, double eps, double *y)
{
    double ss = 0.0;

    for (size_t i = 0; i < n; i++) {
        ss += x[i] * x[i];
    }
    ss = 1.0 / sqrt(ss / n + eps);
    for (size_t i = 0; i < n; i++) {
        y[i] = x[i] * ss * w[i];
    }
}

/* transformers' _compute_llama3_parameters, written again */
static double ref_freq(const epd_hf_hparams_t *hp, size_t i)
{
    double f = pow(hp->rope_theta, -(double)(2 * i) / hp->head_dim);
    double wl = 2.0 * 3.14159265358979323846 / f;
    double lo = hp->rs_orig_max / hp->rs_low_freq;
    double hi = hp->rs_orig_max / hp->rs_high_freq;

    if (!hp->rope_llama3 || wl < hi) {
        return f;
    }
    if (wl > lo) {
        return f / hp->rs_factor;
    }
    {
        double sm = (hp->rs_orig_max / wl - hp->rs_low_freq) / (hp->rs_high_freq - hp->rs_low_freq);

        return (1.0 - sm) * f / hp->rs_factor + sm * f;
    }
}

static void ref_rope(const epd_hf_hparams_t *hp, double *v, size_t pos)
{
    size_t half = hp->head_dim / 2;

    for (size_t i = 0; i < half; i++) {
        double a = pos * ref_freq(hp, i);
        double x0 = v[i];
        double x1 = v[i + half];

        v[i] = x0 * cos(a) - x1 * sin(a);
        v[i + half] = x1 * cos(a) + x0 * sin(a);
    }
}

static double ref_silu(double u)
{
    return u / (1.0 + exp(-u));
}

/* SwiGLU MLP of h into y (gate, up [ffn][dim], down [dim][ffn]). */
static void ref_mlp(const double *gate, const double *up, const double *down, const double *h,
                    size_t dim, size_t ffn, double *y)
{
    double *g = calloc(ffn, sizeof(double));
    double *u = calloc(ffn, sizeof(double));

    ref_mv(gate, h, ffn, dim, g);
    ref_mv(up, h, ffn, dim, u);
    for (size_t i = 0; i < ffn; i++) {
        g[i] = ref_silu(g[i]) * u[i];
    }
    ref_mv(down, g, dim, ffn, y);
    free(g);
    free(u);
}

/* logits [n][vocab] of every position of tokens[0..n). */
static void ref_forward(const ref_t *m, const int32_t *tokens, size_t n, double *logits)
{
    const epd_hf_hparams_t *hp = &m->hp;
    size_t dim = hp->dim, hd = hp->head_dim, H = hp->n_heads, KV = hp->n_kv_heads;
    size_t qd = H * hd, kvd = KV * hd;
    double *x = calloc(n * dim, sizeof(double));
    double *h = calloc(dim, sizeof(double));
    double *q = calloc(n * qd, sizeof(double));
    double *k = calloc(n * kvd, sizeof(double));
    double *v = calloc(n * kvd, sizeof(double));
    double *o = calloc(qd, sizeof(double));
    double *y = calloc(dim, sizeof(double));
    double *sc = calloc(n, sizeof(double));
    const double *emb = ref_get(m, EPD_HF_T_EMBED, 0, 0);

    for (size_t t = 0; t < n; t++) {
        memcpy(x + t * dim, emb + (size_t)tokens[t] * dim, dim * sizeof(double));
    }
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const double *bq = ref_get(m, EPD_HF_T_Q_BIAS, l, 0);
        const double *bk = ref_get(m, EPD_HF_T_K_BIAS, l, 0);
        const double *bv = ref_get(m, EPD_HF_T_V_BIAS, l, 0);
        const double *qn = ref_get(m, EPD_HF_T_Q_NORM, l, 0);
        const double *kn = ref_get(m, EPD_HF_T_K_NORM, l, 0);

        for (size_t t = 0; t < n; t++) {
            ref_rmsnorm(x + t * dim, ref_get(m, EPD_HF_T_IN_NORM, l, 0), dim, hp->rms_eps, h);
            ref_mv(ref_get(m, EPD_HF_T_Q, l, 0), h, qd, dim, q + t * qd);
            ref_mv(ref_get(m, EPD_HF_T_K, l, 0), h, kvd, dim, k + t * kvd);
            ref_mv(ref_get(m, EPD_HF_T_V, l, 0), h, kvd, dim, v + t * kvd);
            for (size_t i = 0; bq != NULL && i < qd; i++) {
                q[t * qd + i] += bq[i];
            }
            for (size_t i = 0; bk != NULL && i < kvd; i++) {
                k[t * kvd + i] += bk[i];
                v[t * kvd + i] += bv[i];
            }
            for (size_t hh = 0; hh < H; hh++) {
                if (qn != NULL) {
                    ref_rmsnorm(q + t * qd + hh * hd, qn, hd, hp->rms_eps, q + t * qd + hh * hd);
                }
                ref_rope(hp, q + t * qd + hh * hd, t);
            }
            for (size_t hh = 0; hh < KV; hh++) {
                if (kn != NULL) {
                    ref_rmsnorm(k + t * kvd + hh * hd, kn, hd, hp->rms_eps, k + t * kvd + hh * hd);
                }
                ref_rope(hp, k + t * kvd + hh * hd, t);
            }
        }
        for (size_t t = 0; t < n; t++) {
            for (size_t hh = 0; hh < H; hh++) {
                size_t g = hh / (H / KV);
                double mx = -INFINITY, sum = 0.0;

                for (size_t s = 0; s <= t; s++) {
                    double d = 0.0;

                    for (size_t i = 0; i < hd; i++) {
                        d += q[t * qd + hh * hd + i] * k[s * kvd + g * hd + i];
                    }
                    sc[s] = d / sqrt((double)hd);
                    mx = sc[s] > mx ? sc[s] : mx;
                }
                for (size_t s = 0; s <= t; s++) {
                    sc[s] = exp(sc[s] - mx);
                    sum += sc[s];
                }
                for (size_t i = 0; i < hd; i++) {
                    double acc = 0.0;

                    for (size_t s = 0; s <= t; s++) {
                        acc += sc[s] / sum * v[s * kvd + g * hd + i];
                    }
                    o[hh * hd + i] = acc;
                }
            }
            ref_mv(ref_get(m, EPD_HF_T_O, l, 0), o, dim, qd, y);
            for (size_t i = 0; i < dim; i++) {
                x[t * dim + i] += y[i];
            }
        }
        for (size_t t = 0; t < n; t++) {
            ref_rmsnorm(x + t * dim, ref_get(m, EPD_HF_T_POST_NORM, l, 0), dim, hp->rms_eps, h);
            if (hp->arch != EPD_HF_QWEN3_MOE) {
                ref_mlp(ref_get(m, EPD_HF_T_GATE, l, 0), ref_get(m, EPD_HF_T_UP, l, 0),
                        ref_get(m, EPD_HF_T_DOWN, l, 0), h, dim, hp->ffn, y);
                for (size_t i = 0; i < dim; i++) {
                    x[t * dim + i] += y[i];
                }
                continue;
            }
            {
                size_t E = hp->n_experts;
                double *r = calloc(E, sizeof(double));
                size_t *order = calloc(E, sizeof(size_t));
                double sum = 0.0, ksum = 0.0;

                ref_mv(ref_get(m, EPD_HF_T_ROUTER, l, 0), h, E, dim, r);
                for (size_t e = 0; e < E; e++) {
                    sum += exp(r[e]);
                    order[e] = e;
                }
                /* stable sort by probability, descending */
                for (size_t a = 1; a < E; a++) {
                    for (size_t b = a; b > 0 && r[order[b]] > r[order[b - 1]]; b--) {
                        size_t tmp = order[b];

                        order[b] = order[b - 1];
                        order[b - 1] = tmp;
                    }
                }
                for (size_t kk = 0; kk < hp->top_k; kk++) {
                    ksum += exp(r[order[kk]]) / sum;
                }
                for (size_t kk = 0; kk < hp->top_k; kk++) {
                    size_t e = order[kk];
                    double w = exp(r[e]) / sum / (hp->norm_topk ? ksum : 1.0);

                    ref_mlp(ref_get(m, EPD_HF_T_X_GATE, l, (uint32_t)e),
                            ref_get(m, EPD_HF_T_X_UP, l, (uint32_t)e),
                            ref_get(m, EPD_HF_T_X_DOWN, l, (uint32_t)e), h, dim, hp->moe_ffn, y);
                    for (size_t i = 0; i < dim; i++) {
                        x[t * dim + i] += w * y[i];
                    }
                }
                free(r);
                free(order);
            }
        }
    }
    for (size_t t = 0; t < n; t++) {
        const double *head = hp->tied ? emb : ref_get(m, EPD_HF_T_LM_HEAD, 0, 0);

        ref_rmsnorm(x + t * dim, ref_get(m, EPD_HF_T_FINAL_NORM, 0, 0), dim, hp->rms_eps, h);
        ref_mv(head, h, hp->vocab, dim, logits + t * hp->vocab);
    }
    free(x);
    free(h);
    free(q);
    free(k);
    free(v);
    free(o);
    free(y);
    free(sc);
}

/* ---- helpers --------------------------------------------------------------- */

static epd_engine_t *open_dir(const char *dir, uint32_t block_tokens, uint32_t max_batch)
{
    epd_engine_config_t cfg = {.model_dir = dir,
                               .block_tokens = block_tokens,
                               .max_batch = max_batch,
                               .max_context = 1024};
    epd_engine_t *e = NULL;

    assert_int_equal(epd_engine_open("ref", &cfg, &e), EPD_OK);
    return e;
}

static epd_kv_seq_t seq_of(const uint32_t *table, uint32_t n, uint64_t id)
{
    epd_kv_seq_t s = {.req_id = id, .block_table = table, .n_blocks = n};

    return s;
}

static void random_prompt(int32_t *toks, uint32_t n, uint32_t seed, uint32_t vocab)
{
    for (uint32_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        toks[i] = (int32_t)((seed >> 8) % vocab);
    }
}

static int32_t argmax(const float *x, size_t n)
{
    size_t best = 0;

    for (size_t i = 1; i < n; i++) {
        best = x[i] > x[best] ? i : best;
    }
    return (int32_t)best;
}

/* ---- tests ------------------------------------------------------------------ */

/* Every position's logits, through the prefill path (a prefill of [0..t])
 * and the decode path (prefill of token 0, then decode steps), within TOL
 * of the double reference; and the argmax the same. */
static void test_matches_double_reference(void **state)
{
    (void)state;
    for (int mi = 0; mi < N_MODELS; mi++) {
        epd_engine_t *e = open_dir(dirs[mi], 16, 4);
        uint32_t vocab = epd_engine_info(e)->vocab_size;
        const uint32_t n = 70; /* past one 64-row tile */
        uint32_t table[8] = {7, 3, 5, 1, 0, 2, 4, 6};
        int32_t toks[70];
        double *want = calloc((size_t)n * vocab, sizeof(double));
        float *got = calloc(vocab, sizeof(float));
        epd_kv_pool_t pool;
        ref_t m;
        double worst = 0.0;

        assert_non_null(want);
        assert_non_null(got);
        random_prompt(toks, n, 11u + (uint32_t)mi, vocab);
        ref_load(&m, dirs[mi], &params[mi].hp);
        ref_forward(&m, toks, n, want);
        epd_test_pool(e, 8, 1, &pool);
        for (uint32_t t = 0; t < n; t += 23) {
            epd_prefill_args_t a = {.seq = seq_of(table, 8, 1), .tokens = toks, .n_tokens = t + 1};
            double err;

            assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, got), EPD_OK);
            err = epd_test_rel_err(got, want + (size_t)t * vocab, vocab);
            worst = err > worst ? err : worst;
            if (err > TOL) {
                fail_msg("%s prefill row %u: rel err %g", dirs[mi], t, err);
            }
        }
        {
            epd_prefill_args_t a = {.seq = seq_of(table, 8, 1), .tokens = toks, .n_tokens = 1};

            assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, got), EPD_OK);
        }
        for (uint32_t t = 1; t < n; t++) {
            epd_decode_req_t r = {.seq = seq_of(table, 8, 1), .pos = t, .token = toks[t]};
            double err;

            assert_int_equal(epd_engine_decode(e, &pool, &r, 1, got), EPD_OK);
            err = epd_test_rel_err(got, want + (size_t)t * vocab, vocab);
            worst = err > worst ? err : worst;
            if (err > TOL) {
                fail_msg("%s decode row %u: rel err %g", dirs[mi], t, err);
            }
        }
        print_message("%s: worst relative error %.3g\n", epd_hf_arch_class(params[mi].hp.arch),
                      worst);
        ref_free(&m);
        free(want);
        free(got);
        epd_free(pool.base);
        epd_engine_close(e);
    }
}

/* Each architecture's tensor list has its own parts (biases only for
 * qwen2, q/k norms for qwen3 and qwen3_moe, a router for qwen3_moe, no
 * lm_head when tied): the reference above then exercises each of them. */
static void test_every_arch_has_its_parts(void **state)
{
    (void)state;
    for (int mi = 0; mi < N_MODELS; mi++) {
        epd_hf_hparams_t hp = params[mi].hp;
        size_t n = epd_hf_tensor_count(&hp);
        int has_bias = 0, has_qn = 0, has_router = 0, has_head = 0;

        for (size_t i = 0; i < n; i++) {
            epd_hf_tensor_spec_t s;

            epd_hf_tensor_spec(&hp, i, &s);
            has_bias |= s.role == EPD_HF_T_Q_BIAS;
            has_qn |= s.role == EPD_HF_T_Q_NORM;
            has_router |= s.role == EPD_HF_T_ROUTER;
            has_head |= s.role == EPD_HF_T_LM_HEAD;
        }
        assert_int_equal(has_bias, hp.arch == EPD_HF_QWEN2);
        assert_int_equal(has_qn, hp.arch == EPD_HF_QWEN3 || hp.arch == EPD_HF_QWEN3_MOE);
        assert_int_equal(has_router, hp.arch == EPD_HF_QWEN3_MOE);
        assert_int_equal(has_head, !hp.tied);
    }
}

/* A prefill cut anywhere (once) equals the whole prompt's, KV and logits
 * bit for bit, and decode continues identically. */
static void check_split(const char *dir, uint32_t n, uint32_t step)
{
    epd_engine_t *e = open_dir(dir, 16, 4);
    const epd_kv_layout_t *kv = &epd_engine_info(e)->kv;
    uint32_t vocab = epd_engine_info(e)->vocab_size;
    uint32_t nb = (n + 1 + 15) / 16;
    uint32_t *ta = calloc(nb, sizeof(uint32_t));
    uint32_t *tb = calloc(nb, sizeof(uint32_t));
    int32_t *toks = calloc(n, sizeof(int32_t));
    float *whole = calloc(vocab, sizeof(float));
    float *cut = calloc(vocab, sizeof(float));
    size_t row = (size_t)kv->head_dim * sizeof(float);
    epd_kv_pool_t pool;
    epd_prefill_args_t a;

    assert_non_null(ta);
    assert_non_null(tb);
    assert_non_null(toks);
    assert_non_null(whole);
    assert_non_null(cut);
    random_prompt(toks, n, n, vocab);
    epd_test_pool(e, 2 * nb, 1, &pool);
    for (uint32_t i = 0; i < nb; i++) {
        ta[i] = i;
        tb[i] = 2 * nb - 1 - i;
    }
    a = (epd_prefill_args_t){.seq = seq_of(ta, nb, 1), .tokens = toks, .n_tokens = n};
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, whole), EPD_OK);
    for (uint32_t c = 1; c < n; c += step) {
        a = (epd_prefill_args_t){.seq = seq_of(tb, nb, 2), .tokens = toks, .n_tokens = c};
        assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, cut), EPD_OK);
        a.tokens = toks + c;
        a.n_tokens = n - c;
        a.start = c;
        assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, cut), EPD_OK);
        if (memcmp(whole, cut, vocab * sizeof(float)) != 0) {
            fail_msg("%s: logits of %u tokens cut at %u differ from whole", dir, n, c);
        }
        for (uint32_t l = 0; l < kv->n_layers; l++) {
            for (uint32_t p = 0; p < n; p++) {
                uint64_t oa, ob;

                assert_int_equal(epd_kv_block_offset(kv, pool.n_blocks, l, ta[p / 16], &oa),
                                 EPD_OK);
                assert_int_equal(epd_kv_block_offset(kv, pool.n_blocks, l, tb[p / 16], &ob),
                                 EPD_OK);
                for (uint32_t r = 0; r < 2 * kv->n_kv_heads; r++) {
                    size_t off = ((size_t)r * 16 + p % 16) * row;

                    assert_memory_equal((char *)pool.base + oa + off, (char *)pool.base + ob + off,
                                        row);
                }
            }
        }
    }
    {
        epd_decode_req_t ra = {.seq = seq_of(ta, nb, 1), .pos = n, .token = argmax(whole, vocab)};
        epd_decode_req_t rb = {.seq = seq_of(tb, nb, 2), .pos = n, .token = argmax(cut, vocab)};

        assert_int_equal(epd_engine_decode(e, &pool, &ra, 1, whole), EPD_OK);
        assert_int_equal(epd_engine_decode(e, &pool, &rb, 1, cut), EPD_OK);
        assert_memory_equal(whole, cut, vocab * sizeof(float));
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
    for (int mi = 0; mi < N_MODELS; mi++) {
        check_split(dirs[mi], 140, mi == 0 ? 1 : 9); /* every cut once, then a sample */
    }
}

/* A decode batch gives each request the bits it gets alone. */
static void test_batch_equals_single(void **state)
{
    (void)state;
    for (int mi = 0; mi < N_MODELS; mi++) {
        epd_engine_t *e = open_dir(dirs[mi], 16, 4);
        uint32_t vocab = epd_engine_info(e)->vocab_size;
        const uint32_t lens[3] = {1, 17, 70};
        uint32_t tables[3][8];
        uint32_t stables[3][8];
        int32_t toks[3][70];
        float *blog = calloc(3 * (size_t)vocab, sizeof(float));
        float *slog = calloc(vocab, sizeof(float));
        epd_decode_req_t reqs[3];
        epd_kv_pool_t pool;

        assert_non_null(blog);
        assert_non_null(slog);
        epd_test_pool(e, 48, 1, &pool);
        for (int r = 0; r < 3; r++) {
            epd_prefill_args_t a;

            for (uint32_t i = 0; i < 8; i++) {
                tables[r][i] = i * 3 + (uint32_t)r;
                stables[r][i] = 24 + (uint32_t)r * 8 + i;
            }
            random_prompt(toks[r], lens[r], 100u + (uint32_t)r, vocab);
            a = (epd_prefill_args_t){
                .seq = seq_of(tables[r], 8, 1 + r), .tokens = toks[r], .n_tokens = lens[r]};
            assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, blog + r * vocab), EPD_OK);
            a.seq = seq_of(stables[r], 8, 11 + r);
            assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, slog), EPD_OK);
            reqs[r] = (epd_decode_req_t){.seq = seq_of(tables[r], 8, 1 + r),
                                         .pos = lens[r],
                                         .token = argmax(blog + r * vocab, vocab)};
        }
        for (int step = 0; step < 6; step++) {
            assert_int_equal(epd_engine_decode(e, &pool, reqs, 3, blog), EPD_OK);
            for (int r = 0; r < 3; r++) {
                epd_decode_req_t one = {.seq = seq_of(stables[r], 8, 11 + r),
                                        .pos = reqs[r].pos,
                                        .token = reqs[r].token};

                assert_int_equal(epd_engine_decode(e, &pool, &one, 1, slog), EPD_OK);
                assert_memory_equal(blog + r * vocab, slog, vocab * sizeof(float));
                reqs[r].pos++;
                reqs[r].token = argmax(slog, vocab);
            }
        }
        free(blog);
        free(slog);
        epd_free(pool.base);
        epd_engine_close(e);
    }
}

/* Three shards + index hold the single file's bytes: same logits bit for
 * bit, and both digests stable over opens, but distinct (the headers
 * differ, and a prefix cache must not mix two files' KV on a guess). */
static void test_sharded_equals_single(void **state)
{
    epd_engine_t *a = open_dir(dirs[0], 16, 4);
    epd_engine_t *b = open_dir(sharded_dir, 16, 4);
    epd_engine_t *a2 = open_dir(dirs[0], 16, 4);
    uint32_t vocab = epd_engine_info(a)->vocab_size;
    uint32_t table[4] = {0, 1, 2, 3};
    int32_t toks[40];
    float *la = calloc(vocab, sizeof(float));
    float *lb = calloc(vocab, sizeof(float));
    epd_kv_pool_t pa, pb;
    epd_prefill_args_t args = {.seq = seq_of(table, 4, 1), .tokens = toks, .n_tokens = 40};

    (void)state;
    assert_non_null(la);
    assert_non_null(lb);
    random_prompt(toks, 40, 5, vocab);
    epd_test_pool(a, 4, 1, &pa);
    epd_test_pool(b, 4, 1, &pb);
    assert_int_equal(epd_engine_prefill(a, &pa, &args, NULL, la), EPD_OK);
    assert_int_equal(epd_engine_prefill(b, &pb, &args, NULL, lb), EPD_OK);
    assert_memory_equal(la, lb, vocab * sizeof(float));
    assert_memory_equal(epd_engine_info(a)->model_digest, epd_engine_info(a2)->model_digest, 16);
    assert_memory_not_equal(epd_engine_info(a)->model_digest, epd_engine_info(b)->model_digest, 16);
    for (int mi = 1; mi < N_MODELS; mi++) {
        epd_engine_t *o = open_dir(dirs[mi], 16, 4);

        assert_memory_not_equal(epd_engine_info(a)->model_digest, epd_engine_info(o)->model_digest,
                                16);
        epd_engine_close(o);
    }
    free(la);
    free(lb);
    epd_free(pa.base);
    epd_free(pb.base);
    epd_engine_close(a);
    epd_engine_close(a2);
    epd_engine_close(b);
}

typedef struct {
    uint32_t calls;
    uint32_t next;
} sink_ctx_t;

static epd_status_t count_sink(void *ctx, uint32_t layer, const epd_layer_done_t *done)
{
    sink_ctx_t *c = ctx;

    assert_int_equal(layer, c->next);
    assert_int_equal(done->kind, EPD_LAYER_ATTENTION);
    c->next++;
    c->calls++;
    return EPD_OK;
}

/* The description: eos list from generation_config, every layer attention,
 * the sink once per layer in order. */
static void test_info_and_sink(void **state)
{
    (void)state;
    for (int mi = 0; mi < N_MODELS; mi++) {
        epd_engine_t *e = open_dir(dirs[mi], 16, 4);
        const epd_engine_info_t *info = epd_engine_info(e);
        uint32_t table[2] = {0, 1};
        int32_t toks[20];
        float *lg = calloc(info->vocab_size, sizeof(float));
        sink_ctx_t c = {0};
        epd_engine_sink_t sink = {.cb = count_sink, .ctx = &c};
        epd_prefill_args_t a = {.seq = seq_of(table, 2, 1), .tokens = toks, .n_tokens = 20};
        epd_kv_pool_t pool;

        assert_int_equal(info->vocab_size, params[mi].hp.vocab);
        assert_int_equal(info->n_eos, params[mi].hp.n_eos);
        assert_int_equal(info->eos_tokens[info->n_eos - 1],
                         params[mi].hp.eos[params[mi].hp.n_eos - 1]);
        assert_int_equal(info->kv.n_attn_layers, params[mi].hp.n_layers);
        assert_int_equal(info->kv.head_dim, params[mi].hp.head_dim);
        assert_int_equal(info->max_context, 1024);
        random_prompt(toks, 20, 3, info->vocab_size);
        epd_test_pool(e, 2, 1, &pool);
        assert_int_equal(epd_engine_prefill(e, &pool, &a, &sink, lg), EPD_OK);
        assert_int_equal(c.calls, params[mi].hp.n_layers);
        free(lg);
        epd_free(pool.base);
        epd_engine_close(e);
    }
}

/* Every allocation of open may fail: NO_MEMORY, nothing leaked. */
static void test_open_allocation_failures(void **state)
{
    epd_engine_config_t cfg = {.model_dir = dirs[4], .max_context = 256};
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

/* Refusals at open that need no shell: a config naming an unknown
 * architecture, llama with biases, and an lm_head under tied embeddings. */
static void test_open_refusals(void **state)
{
    epd_hf_mkmodel_params_t p;
    epd_engine_config_t cfg = {0};
    epd_engine_t *e = NULL;
    const char *d;
    char *cfgtext;
    size_t len;

    (void)state;
    /* a tied config over an untied folder: lm_head.weight is not consumed */
    d = epd_strdup(epd_test_path(tmpdir, "tied_mismatch"));
    assert_non_null(d);
    p = params[0];
    assert_int_equal(epd_hf_mkmodel_write(&p, NULL, d), EPD_OK);
    p.hp.tied = 1;
    assert_int_equal(epd_hf_hparams_save(&p.hp, d), EPD_OK);
    cfg.model_dir = d;
    assert_int_equal(epd_engine_open("ref", &cfg, &e), EPD_ERR_MALFORMED);
    /* rename the architecture */
    p.hp.tied = 0;
    assert_int_equal(epd_hf_hparams_save(&p.hp, d), EPD_OK);
    cfgtext = (char *)epd_test_read_file(epd_test_path(d, "config.json"), &len);
    {
        char *at = strstr(cfgtext, "LlamaForCausalLM");

        assert_non_null(at);
        memcpy(at, "MistForCausalLM ", 16);
        epd_test_write_file(epd_test_path(d, "config.json"), cfgtext, len);
    }
    epd_free(cfgtext);
    assert_int_equal(epd_engine_open("ref", &cfg, &e), EPD_ERR_UNSUPPORTED);
    assert_null(e);
    epd_free((char *)d);
}

static int setup(void **state)
{
    static const char *const names[N_MODELS] = {"llama", "llama_tied", "qwen2", "qwen3",
                                                "qwen3_moe"};
    static const epd_hf_arch_t archs[N_MODELS] = {EPD_HF_LLAMA, EPD_HF_LLAMA, EPD_HF_QWEN2,
                                                  EPD_HF_QWEN3, EPD_HF_QWEN3_MOE};

    (void)state;
    tmpdir = epd_test_tmpdir();
    for (int i = 0; i < N_MODELS; i++) {
        char *d = epd_strdup(epd_test_path(tmpdir, names[i]));

        epd_hf_mkmodel_defaults(archs[i], &params[i]);
        params[i].hp.vocab = 300;
        params[i].hp.n_eos = 2;
        params[i].hp.eos[0] = 2;
        params[i].hp.eos[1] = 3;
        params[i].hp.tied = i == 1 || i == 2;
        params[i].seed = 40u + (uint32_t)i;
        if (archs[i] == EPD_HF_QWEN3_MOE) {
            params[i].hp.norm_topk = 1;
        }
        assert_int_equal(epd_hf_mkmodel_write(&params[i], NULL, d), EPD_OK);
        dirs[i] = d;
    }
    {
        epd_hf_mkmodel_params_t p = params[0];
        char *d = epd_strdup(epd_test_path(tmpdir, "llama_sharded"));

        p.shards = 3;
        assert_int_equal(epd_hf_mkmodel_write(&p, NULL, d), EPD_OK);
        sharded_dir = d;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    epd_test_rmtree(tmpdir);
    for (int i = 0; i < N_MODELS; i++) {
        epd_free((char *)dirs[i]);
    }
    epd_free((char *)sharded_dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_double_reference),
        cmocka_unit_test(test_every_arch_has_its_parts),
        cmocka_unit_test(test_split_invariant_bitwise),
        cmocka_unit_test(test_batch_equals_single),
        cmocka_unit_test(test_sharded_equals_single),
        cmocka_unit_test(test_info_and_sink),
        cmocka_unit_test(test_open_allocation_failures),
        cmocka_unit_test(test_open_refusals),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
