/*
 * test_epd_sim_kvq.c — the `sim` engine with a per-layer KV dtype map
 * (--kv-dtype, or sim.conf's kv_dtype_map): each attention layer's blocks
 * are exactly epd_kvq_block_bytes of its dtype (fp8 / int8 with their f32
 * scales per token and head), scaled layouts stay multiples of 64 bytes,
 * the modelled times count each layer's own bytes (the formula, and time
 * per byte written independent of the scale, per layer), and the stamps
 * of a mixed map check out layer by layer after a copy to another pool at
 * other block ids — where a checker that took every layer's blocks to be
 * the largest layer's would fail — and decode goes on from the copy as
 * from the original.  No test here depends on time.
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
#include "epd_hash.h"
#include "epd_kv_stamp.h"
#include "epd_kvq.h"
#include "epd_sim.h"
#include "epd_test_engine_util.h"

#ifndef EPD_TEST_PROFILES
#error "EPD_TEST_PROFILES must name engine/profiles"
#endif

#define VOCAB 300
#define BT 4
#define N_TOK 30 /* 8 blocks of 4, the last one partly filled */
#define N_BLK 8
#define POOL_BLK 32

/* layers 0 and 2 linear, 1 and 3 attention; f32 KV, 2 heads of 8 */
static const char TINY_MODEL[] = "name = tiny\n"
                                 "n_layers = 4\n"
                                 "layer_pattern = LA\n"
                                 "hidden = 64\n"
                                 "n_heads = 4\n"
                                 "n_kv_heads = 2\n"
                                 "head_dim = 8\n"
                                 "kv_dtype = F32\n"
                                 "state_bytes = 256\n"
                                 "active_params = 1e6\n"
                                 "total_params = 4e6\n"
                                 "weight_bytes = 1\n"
                                 "vocab = 300\n"
                                 "max_context = 512\n";
static const char FAST_ACCEL[] = "name = fast\nflops = 1e16\nmem_bw = 1e15\nhbm_bytes = 1e9\n";
/* memory-bound: every layer's time is its bytes over 1e9 B/s */
static const char SLOW_ACCEL[] = "name = slow\nflops = 1e20\nmem_bw = 1e9\nhbm_bytes = 1e9\n";

static const char *tmpdir;
static char tiny[1024];
static char fast[1024];
static char slow[1024];

/* A sim folder `name` (static path, 8 rotating buffers). */
static const char *sim_dir(const char *name, const char *model, const char *accel, double scale,
                           const char *map)
{
    static char bufs[8][1024];
    static int next;
    char *dir = bufs[next++ % 8];
    epd_sim_options_t o = {.model = model,
                           .accel = accel,
                           .scale = scale,
                           .mode = EPD_SIM_SPIN,
                           .seed = 3,
                           .vocab = VOCAB,
                           .kv_dtype_map = map};

    snprintf(dir, sizeof(bufs[0]), "%s/%s", tmpdir, name);
    assert_int_equal(epd_sim_conf_write(dir, &o), EPD_OK);
    return dir;
}

static epd_status_t open_sim(const char *dir, uint32_t bt, const char *kv_dtype, epd_engine_t **e)
{
    epd_engine_config_t cfg = {
        .model_dir = dir, .block_tokens = bt, .max_batch = 4, .kv_dtype = kv_dtype};

    *e = NULL;
    return epd_engine_open("sim", &cfg, e);
}

static const char *profile(const char *name)
{
    static char bufs[4][1024];
    static int next;
    char *p = bufs[next++ % 4];

    snprintf(p, sizeof(bufs[0]), "%s/%s", EPD_TEST_PROFILES, name);
    return p;
}

static int setup(void **state)
{
    (void)state;
    tmpdir = epd_test_tmpdir();
    snprintf(tiny, sizeof(tiny), "%s", epd_test_path(tmpdir, "tiny.profile"));
    snprintf(fast, sizeof(fast), "%s", epd_test_path(tmpdir, "fast.profile"));
    snprintf(slow, sizeof(slow), "%s", epd_test_path(tmpdir, "slow.profile"));
    epd_test_write_file(tiny, TINY_MODEL, strlen(TINY_MODEL));
    epd_test_write_file(fast, FAST_ACCEL, strlen(FAST_ACCEL));
    epd_test_write_file(slow, SLOW_ACCEL, strlen(SLOW_ACCEL));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    epd_test_rmtree(tmpdir);
    return 0;
}

/* Every attention layer of `kv` holds dtypes[l] in blocks of exactly
 * epd_kvq_block_bytes; the pool is their sum per block id plus the states. */
static void check_layout(const epd_kv_layout_t *kv, const uint8_t *dtypes)
{
    uint64_t set = 0;

    for (uint32_t l = 0; l < kv->n_layers; l++) {
        uint64_t want;

        if (kv->kind[l] != EPD_LAYER_ATTENTION) {
            assert_int_equal(epd_kv_layer_block_bytes(kv, l), 0);
            continue;
        }
        want = epd_kvq_block_bytes((epd_dtype_t)dtypes[l], kv->n_kv_heads, kv->block_tokens,
                                   kv->head_dim);
        if (epd_kv_layer_block_bytes(kv, l) != want) {
            fail_msg("layer %u (%s): %llu bytes per block, want %llu", l,
                     epd_kvq_dtype_short((epd_dtype_t)dtypes[l]),
                     (unsigned long long)epd_kv_layer_block_bytes(kv, l), (unsigned long long)want);
        }
        set += want;
    }
    assert_int_equal(epd_kv_block_set_bytes(kv), set);
    assert_int_equal(epd_kv_pool_bytes(kv, 10, 3),
                     10 * set + (uint64_t)kv->n_linear_layers * 3 * kv->state_bytes);
}

/* ---- the layout ---------------------------------------------------------------- */

static void test_layout_follows_map(void **state)
{
    static const struct {
        const char *map;   /* --kv-dtype */
        uint8_t l1, l3;    /* the two attention layers' dtypes */
        const char *canon; /* what workers register */
    } cases[] = {
        {"f32", EPD_DTYPE_F32, EPD_DTYPE_F32, "f32"},
        {"bf16", EPD_DTYPE_BF16, EPD_DTYPE_BF16, "bf16"},
        {"fp8", EPD_DTYPE_FP8_E4M3, EPD_DTYPE_FP8_E4M3, "fp8"},
        {"int8", EPD_DTYPE_INT8, EPD_DTYPE_INT8, "int8"},
        {"1:bf16,3:int8", EPD_DTYPE_BF16, EPD_DTYPE_INT8, "1-2:bf16,3-3:int8"},
        {"0-1:fp8", EPD_DTYPE_FP8_E4M3, EPD_DTYPE_F32, "1-2:fp8,3-3:f32"},
    };
    const char *dir = sim_dir("lay", tiny, fast, 1.0, NULL);
    uint64_t bb[4] = {0};
    epd_engine_t *e;

    (void)state;
    /* without a map: the profile's dtype, the uniform layout of before */
    assert_int_equal(open_sim(dir, BT, NULL, &e), EPD_OK);
    assert_int_equal(epd_engine_info(e)->kv.dtype, EPD_DTYPE_F32);
    assert_int_equal(epd_engine_info(e)->kv.attn_block_bytes, 0);
    assert_int_equal(epd_engine_info(e)->kv.block_bytes, 2 * 2 * BT * 8 * 4);
    epd_engine_close(e);
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        uint8_t dt[4] = {EPD_DTYPE_F32, cases[c].l1, EPD_DTYPE_F32, cases[c].l3};
        const epd_kv_layout_t *kv;
        char canon[EPD_KVQ_MAP_MAX];

        assert_int_equal(open_sim(dir, BT, cases[c].map, &e), EPD_OK);
        kv = &epd_engine_info(e)->kv;
        check_layout(kv, dt);
        epd_kvq_map_format(kv, canon, sizeof(canon));
        assert_string_equal(canon, cases[c].canon);
        if (c < 4) {
            bb[c] = epd_kv_layer_block_bytes(kv, 3);
        }
        epd_engine_close(e);
    }
    /* f32 > bf16 > fp8 = int8: codes of 4, 2, 1, 1 bytes, an f32 scale
     * per token and head for the last two (2*(2*4*8 + 2*4*4) = 192) */
    assert_int_equal(bb[0], 512);
    assert_int_equal(bb[1], 256);
    assert_int_equal(bb[2], 192);
    assert_int_equal(bb[3], 192);
}

static void test_conf_map_and_refusals(void **state)
{
    const char *dir = sim_dir("conf", tiny, fast, 1.0, "int8");
    uint8_t i8[4] = {EPD_DTYPE_F32, EPD_DTYPE_INT8, EPD_DTYPE_F32, EPD_DTYPE_INT8};
    uint8_t b16[4] = {EPD_DTYPE_F32, EPD_DTYPE_BF16, EPD_DTYPE_F32, EPD_DTYPE_BF16};
    epd_sim_conf_t c;
    epd_engine_t *e;

    (void)state;
    assert_int_equal(epd_sim_conf_load(dir, &c), EPD_OK);
    assert_string_equal(c.kv_dtype_map, "int8");
    /* sim.conf's map, and --kv-dtype over it */
    assert_int_equal(open_sim(dir, BT, NULL, &e), EPD_OK);
    check_layout(&epd_engine_info(e)->kv, i8);
    epd_engine_close(e);
    assert_int_equal(open_sim(dir, BT, "bf16", &e), EPD_OK);
    check_layout(&epd_engine_info(e)->kv, b16);
    epd_engine_close(e);
    /* a range outside the model, an unknown dtype: refused at open */
    assert_int_equal(open_sim(dir, BT, "9-:int8", &e), EPD_ERR_INVALID_PARAM);
    assert_null(e);
    assert_int_equal(open_sim(dir, BT, "int4", &e), EPD_ERR_INVALID_PARAM);
    assert_null(e);
    assert_int_equal(open_sim(sim_dir("conf-bad", tiny, fast, 1.0, "0-2:q4"), BT, NULL, &e),
                     EPD_ERR_INVALID_PARAM);
    assert_null(e);
}

/* A shipped profile at the benchmarks' scale: every layer's block a
 * multiple of 64 bytes, exactly its dtype's bytes, int8 below bf16, and
 * each layer's time factor within 5% of the scale. */
static void test_scaled_shipped_profile(void **state)
{
    static const char *maps[] = {"bf16", "fp8", "int8", "0-3:bf16,4-:fp8", "f32"};
    const char *dir =
        sim_dir("d70", profile("dense-70b.profile"), profile("h200.profile"), 0.05, NULL);
    uint64_t per_map[5] = {0};

    (void)state;
    for (size_t m = 0; m < sizeof(maps) / sizeof(maps[0]); m++) {
        uint8_t dt[EPD_KV_MAX_LAYERS];
        const char *why = NULL;
        epd_sim_conf_t c;
        epd_sim_timing_t t;
        const epd_kv_layout_t *kv;
        epd_engine_t *e;

        assert_int_equal(open_sim(dir, 16, maps[m], &e), EPD_OK);
        kv = &epd_engine_info(e)->kv;
        assert_int_equal(epd_kvq_map_parse(maps[m], kv->n_layers, dt, &why), EPD_OK);
        check_layout(kv, dt);
        assert_int_equal(epd_sim_conf_load(dir, &c), EPD_OK);
        snprintf(c.kv_dtype_map, sizeof(c.kv_dtype_map), "%s", maps[m]);
        assert_int_equal(epd_sim_timing_init(&c, 16, &t), EPD_OK);
        assert_int_equal(kv->n_kv_heads, t.n_kv_heads_scaled);
        assert_int_equal(kv->head_dim, t.head_dim_scaled);
        for (uint32_t l = 0; l < kv->n_layers; l++) {
            assert_int_equal(epd_kv_layer_block_bytes(kv, l) % 64, 0);
            assert_true(kv->head_dim * epd_dtype_size((epd_dtype_t)dt[l]) >= 8);
            /* the full-size bytes of a token, and the exact scaled ratio */
            assert_true(t.kv_tok[l] == (double)epd_kvq_block_bytes((epd_dtype_t)dt[l],
                                                                   c.model.n_kv_heads, 1,
                                                                   c.model.head_dim));
            assert_true(t.factor[l] * t.kv_tok[l] * 16 == (double)epd_kv_layer_block_bytes(kv, l));
            if (fabs(t.factor[l] / 0.05 - 1.0) > 0.05) {
                fail_msg("%s layer %u: factor %g at scale 0.05", maps[m], l, t.factor[l]);
            }
        }
        per_map[m] = epd_kv_block_set_bytes(kv);
        epd_engine_close(e);
    }
    /* the bytes a block id costs: f32 > bf16 > mixed > fp8 = int8 */
    assert_true(per_map[4] > per_map[0]);
    assert_true(per_map[0] > per_map[3]);
    assert_true(per_map[3] > per_map[1]);
    assert_int_equal(per_map[1], per_map[2]);
}

/* ---- the timing ---------------------------------------------------------------- */

/* Memory-bound, scale 1: a layer's decode time is its weights plus the KV
 * it reads, at its own dtype's bytes (codes and scales), over the
 * bandwidth; prefill's readiness counts the bytes the layer writes. */
static void test_timing_counts_layer_bytes(void **state)
{
    const char *dir = sim_dir("t", tiny, slow, 1.0, "1:bf16,3:int8");
    epd_decode_req_t reqs[2] = {{.pos = 99}, {.pos = 9}};
    epd_sim_conf_t c;
    epd_sim_timing_t t;
    double want;

    (void)state;
    assert_int_equal(epd_sim_conf_load(dir, &c), EPD_OK);
    assert_int_equal(epd_sim_timing_init(&c, BT, &t), EPD_OK);
    assert_true(t.kv_mapped);
    assert_int_equal(t.kv_dtype[1], EPD_DTYPE_BF16);
    assert_int_equal(t.kv_dtype[3], EPD_DTYPE_INT8);
    /* one token: bf16 2 * 2 heads * 8 * 2 = 64 B; int8 2 * 2 * (8 + 4) = 48 B */
    assert_true(t.kv_tok[1] == 64.0 && t.kv_tok[3] == 48.0);
    assert_true(t.factor[1] == 1.0 && t.factor[3] == 1.0);
    /* decode of 2 requests: 2e6 of 4e6 parameters touched, / 4 layers, 1 B each */
    want = (2e6 / 4 + (100.0 + 10.0) * 64.0) / 1e9;
    assert_true(fabs(epd_sim_decode_seconds(&t, 1, reqs, 2) - want) < 1e-15);
    want = (2e6 / 4 + (100.0 + 10.0) * 48.0) / 1e9;
    assert_true(fabs(epd_sim_decode_seconds(&t, 3, reqs, 2) - want) < 1e-15);
    /* prefill of 32 tokens after 8: reads 40 tokens of KV */
    want = (4e6 / 4 + 40.0 * 48.0) / 1e9;
    assert_true(fabs(epd_sim_prefill_seconds(&t, 3, 8, 32) - want) < 1e-15);
    assert_true(epd_sim_prefill_seconds(&t, 3, 8, 32) < epd_sim_prefill_seconds(&t, 1, 8, 32));
}

/* time / bytes written of every layer, at scale s and at scale 1, with
 * each layer's own block bytes */
static void check_ratio(const epd_kv_layout_t *k1, const epd_sim_timing_t *t1,
                        const epd_kv_layout_t *ks, const epd_sim_timing_t *ts, const char *what)
{
    static const uint32_t chunks[][2] = {{0, 1}, {0, 100}, {100, 1000}, {0, 30000}};
    epd_decode_req_t reqs[3] = {{.pos = 5}, {.pos = 500}, {.pos = 50000}};

    for (uint32_t l = 0; l < k1->n_layers; l++) {
        int attn = k1->kind[l] == EPD_LAYER_ATTENTION;
        double b1 = attn ? (double)epd_kv_layer_block_bytes(k1, l) / k1->block_tokens
                         : (double)k1->state_bytes;
        double bs = attn ? (double)epd_kv_layer_block_bytes(ks, l) / ks->block_tokens
                         : (double)ks->state_bytes;

        for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
            double n = attn ? chunks[c][1] : 1.0;
            double r1 = epd_sim_prefill_seconds(t1, l, chunks[c][0], chunks[c][1]) / (n * b1);
            double rs = epd_sim_prefill_seconds(ts, l, chunks[c][0], chunks[c][1]) / (n * bs);

            if (fabs(r1 - rs) > 1e-12 * r1) {
                fail_msg("%s layer %u chunk %zu: %.17g s/B at scale 1, %.17g scaled", what, l, c,
                         r1, rs);
            }
        }
        {
            double r1 = epd_sim_decode_seconds(t1, l, reqs, 3) / b1;
            double rs = epd_sim_decode_seconds(ts, l, reqs, 3) / bs;

            assert_true(fabs(r1 - rs) <= 1e-12 * r1);
        }
    }
}

static void test_scale_invariant_per_layer(void **state)
{
    static const char *models[] = {"dense-70b.profile", "hybrid-moe-320b.profile"};
    static const char *maps[] = {"int8", "fp8", "0-3:bf16,4-:fp8", "0-39:f32,40-:int8"};
    static const double scales[] = {0.1, 0.05, 0.01};

    (void)state;
    for (size_t m = 0; m < 2; m++) {
        const char *d1 = sim_dir("i1", profile(models[m]), profile("h200.profile"), 1.0, NULL);
        const char *ds[3];

        for (size_t s = 0; s < 3; s++) {
            char name[16];

            snprintf(name, sizeof(name), "is%zu", s);
            ds[s] = sim_dir(name, profile(models[m]), profile("h200.profile"), scales[s], NULL);
        }
        for (size_t k = 0; k < sizeof(maps) / sizeof(maps[0]); k++) {
            epd_engine_t *e1;
            epd_sim_conf_t c1;
            epd_sim_timing_t t1;

            assert_int_equal(open_sim(d1, 16, maps[k], &e1), EPD_OK);
            assert_int_equal(epd_sim_conf_load(d1, &c1), EPD_OK);
            snprintf(c1.kv_dtype_map, sizeof(c1.kv_dtype_map), "%s", maps[k]);
            assert_int_equal(epd_sim_timing_init(&c1, 16, &t1), EPD_OK);
            for (size_t s = 0; s < 3; s++) {
                epd_engine_t *es;
                epd_sim_conf_t cs;
                epd_sim_timing_t ts;
                char what[128];

                assert_int_equal(open_sim(ds[s], 16, maps[k], &es), EPD_OK);
                assert_int_equal(epd_sim_conf_load(ds[s], &cs), EPD_OK);
                snprintf(cs.kv_dtype_map, sizeof(cs.kv_dtype_map), "%s", maps[k]);
                assert_int_equal(epd_sim_timing_init(&cs, 16, &ts), EPD_OK);
                snprintf(what, sizeof(what), "%s %s scale %g", models[m], maps[k], scales[s]);
                check_ratio(&epd_engine_info(e1)->kv, &t1, &epd_engine_info(es)->kv, &ts, what);
                epd_engine_close(es);
            }
            epd_engine_close(e1);
        }
    }
}

/* ---- the bytes: stamps of a mixed map ---------------------------------------- */

typedef struct {
    uint64_t sums[EPD_KV_MAX_LAYERS];
} sums_t;

static epd_status_t sink(void *ctx, uint32_t layer, const epd_layer_done_t *d)
{
    sums_t *s = ctx;

    assert_true(d->has_sum);
    s->sums[layer] = d->sum;
    return EPD_OK;
}

/* Layer l of the request, prefill pool (ids tp, slot sp) -> decode pool
 * (ids td, slot sd), with the layer's own block size. */
static void copy_layer(const epd_kv_layout_t *kv, const epd_kv_pool_t *pp, const uint32_t *tp,
                       uint32_t sp, const epd_kv_pool_t *pd, const uint32_t *td, uint32_t sd,
                       uint32_t l)
{
    uint64_t so, dof;

    if (kv->kind[l] == EPD_LAYER_LINEAR) {
        assert_int_equal(epd_kv_state_offset(kv, POOL_BLK, 4, l, sp, &so), EPD_OK);
        assert_int_equal(epd_kv_state_offset(kv, POOL_BLK, 4, l, sd, &dof), EPD_OK);
        memcpy((char *)pd->base + dof, (char *)pp->base + so, kv->state_bytes);
        return;
    }
    for (uint32_t i = 0; i < N_BLK; i++) {
        assert_int_equal(epd_kv_block_offset(kv, POOL_BLK, l, tp[i], &so), EPD_OK);
        assert_int_equal(epd_kv_block_offset(kv, POOL_BLK, l, td[i], &dof), EPD_OK);
        memcpy((char *)pd->base + dof, (char *)pp->base + so, epd_kv_layer_block_bytes(kv, l));
    }
}

static void test_stamps_of_a_mixed_map(void **state)
{
    const char *dir = sim_dir("st", tiny, fast, 1.0, NULL);
    uint32_t tp[N_BLK + 1], td[N_BLK + 1];
    int32_t toks[N_TOK];
    float lp[VOCAB], ld[VOCAB];
    epd_kv_pool_t pp, pd;
    epd_hash_state_t *h;
    const epd_kv_layout_t *kv;
    sums_t sums;
    epd_engine_t *e;
    epd_engine_sink_t sk = {.cb = sink, .ctx = &sums};
    epd_kv_stamp_expect_t x = {.req_id = 7, .tag = 0x7a67, .n_tokens = N_TOK};

    (void)state;
    /* layer 1 bf16 (256-byte blocks), layer 3 int8 (192): the largest is
     * layer 1's, which layer 3's blocks are not */
    assert_int_equal(open_sim(dir, BT, "1:bf16,3:int8", &e), EPD_OK);
    kv = &epd_engine_info(e)->kv;
    assert_int_equal(kv->block_bytes, 256);
    assert_int_equal(epd_kv_layer_block_bytes(kv, 3), 192);
    epd_test_pool(e, POOL_BLK, 4, &pp);
    epd_test_pool(e, POOL_BLK, 4, &pd);
    assert_int_equal(epd_hash_state_create(0, &h), EPD_OK);
    for (uint32_t i = 0; i <= N_BLK; i++) {
        tp[i] = 3 + i;
        td[i] = (i * 5 + 11) % POOL_BLK;
    }
    for (int i = 0; i < N_TOK; i++) {
        toks[i] = 32 + (i * 7) % 90;
    }
    {
        epd_prefill_args_t a = {.seq = {.req_id = 7,
                                        .block_table = tp,
                                        .n_blocks = N_BLK,
                                        .state_slot = 1,
                                        .stamp_tag = 0x7a67},
                                .tokens = toks,
                                .n_tokens = N_TOK,
                                .want_sums = 1};

        assert_int_equal(epd_engine_prefill(e, &pp, &a, &sk, lp), EPD_OK);
    }
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        copy_layer(kv, &pp, tp, 1, &pd, td, 3, l);
    }
    /* every layer checks out by its stamps and in full, and spans its own
     * bytes */
    for (int full = 0; full <= 1; full++) {
        for (uint32_t l = 0; l < kv->n_layers; l++) {
            const char *why = "";
            uint64_t bytes = 0;

            x.full = full;
            if (epd_kv_stamp_check_layer(kv, &pd, td, N_BLK, 3, l, &x, sums.sums[l], h, &bytes,
                                         &why) != EPD_OK) {
                fail_msg("layer %u (full %d): %s", l, full, why);
            }
            assert_int_equal(bytes, kv->kind[l] == EPD_LAYER_ATTENTION
                                        ? N_BLK * epd_kv_layer_block_bytes(kv, l)
                                        : kv->state_bytes);
        }
    }
    /* a flipped byte in an int8 block's body (the last before its tail
     * stamp) is caught by the full check, at the layer's own size */
    {
        uint64_t off;
        const char *why = "";

        assert_int_equal(epd_kv_block_offset(kv, POOL_BLK, 3, td[2], &off), EPD_OK);
        ((unsigned char *)pd.base)[off + 192 - 32 - 1] ^= 0x10;
        x.full = 1;
        assert_int_equal(
            epd_kv_stamp_check_layer(kv, &pd, td, N_BLK, 3, 3, &x, sums.sums[3], h, NULL, &why),
            EPD_ERR_CORRUPT);
        ((unsigned char *)pd.base)[off + 192 - 32 - 1] ^= 0x10;
    }
    /* decode continues from the copy exactly as from the original */
    {
        epd_decode_req_t rp = {
            .seq = {.req_id = 7, .block_table = tp, .n_blocks = N_BLK + 1, .state_slot = 1},
            .pos = N_TOK,
            .token = 65};
        epd_decode_req_t rd = {
            .seq = {.req_id = 7, .block_table = td, .n_blocks = N_BLK + 1, .state_slot = 3},
            .pos = N_TOK,
            .token = 65};

        assert_int_equal(epd_engine_decode(e, &pp, &rp, 1, lp), EPD_OK);
        assert_int_equal(epd_engine_decode(e, &pd, &rd, 1, ld), EPD_OK);
        assert_memory_equal(lp, ld, sizeof(lp));
    }
    epd_hash_state_destroy(h);
    epd_free(pp.base);
    epd_free(pd.base);
    epd_engine_close(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_follows_map),
        cmocka_unit_test(test_conf_map_and_refusals),
        cmocka_unit_test(test_scaled_shipped_profile),
        cmocka_unit_test(test_timing_counts_layer_bytes),
        cmocka_unit_test(test_scale_invariant_per_layer),
        cmocka_unit_test(test_stamps_of_a_mixed_map),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
