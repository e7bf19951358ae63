/*
 * Unit tests of decode/epd_decode_check.c: GenerateRequest validation
 * (every refusal named), whether a prefill worker is named, and KV
 * verification against per-layer checksums computed the way the prefill
 * side computes them — all at once, and as a request sees it (landed
 * layers first, the rest at completion).
 */
#include "epd_test.h"

#include <math.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_daemon.h"
#include "epd_decode_check.h"
#include "epd_kvq.h"
#include "epd_rng.h"
#include "epd_test_engine_util.h"

static uint32_t prompt[8] = {1, 2, 3, 4, 5, 6, 7, 8};

static void make_req(Epd__GenerateRequest *g, Epd__SamplingParams *s)
{
    epd__generate_request__init(g);
    epd__sampling_params__init(s);
    g->request_id = 9;
    g->prompt_tokens = prompt;
    g->n_prompt_tokens = 8;
    g->sampling = s;
    s->max_tokens = 4;
}

static void test_generate_checks(void **state)
{
    epd_decode_limits_t lim = {.vocab_size = 100, .max_context = 16};
    Epd__GenerateRequest g;
    Epd__SamplingParams s;
    epd_sample_params_t sp;
    uint32_t stops[EPD_DECODE_MAX_STOP_IDS + 1] = {0};
    uint32_t big[20] = {0};
    const char *why = NULL;

    (void)state;
    make_req(&g, &s);
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_OK);
    assert_true(sp.temperature == 0.0f);
    assert_true(sp.top_p == 1.0f); /* 0 on the wire means off */

    make_req(&g, &s);
    g.n_prompt_tokens = 0;
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_ERR_INVALID_PARAM);
    assert_string_equal(why, "empty prompt");

    make_req(&g, &s);
    prompt[3] = 100; /* == vocab */
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_ERR_INVALID_PARAM);
    assert_non_null(strstr(why, "vocabulary"));
    prompt[3] = 4;

    make_req(&g, &s);
    s.max_tokens = 0;
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_ERR_INVALID_PARAM);
    make_req(&g, &s);
    g.sampling = NULL;
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_ERR_INVALID_PARAM);

    make_req(&g, &s);
    s.max_tokens = 9; /* 8 + 9 > 16 */
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_ERR_TOO_LONG);
    s.max_tokens = 8; /* exactly the context */
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_OK);
    s.max_tokens = UINT32_MAX; /* no overflow */
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_ERR_TOO_LONG);

    make_req(&g, &s);
    g.prompt_tokens = big;
    g.n_prompt_tokens = 20;
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_ERR_TOO_LONG);

    make_req(&g, &s);
    s.temperature = -1.0f;
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_ERR_INVALID_PARAM);
    s.temperature = NAN;
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_ERR_INVALID_PARAM);
    s.temperature = 0.7f;
    s.top_p = 1.5f;
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_ERR_INVALID_PARAM);
    s.top_p = 0.9f;
    s.top_k = 5;
    s.seed = 77;
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_OK);
    assert_true(sp.top_p == 0.9f);
    assert_int_equal(sp.top_k, 5);
    assert_int_equal(sp.seed, 77);

    make_req(&g, &s);
    s.stop_token_ids = stops;
    s.n_stop_token_ids = EPD_DECODE_MAX_STOP_IDS + 1;
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_ERR_INVALID_PARAM);
    s.n_stop_token_ids = 2;
    stops[1] = 100;
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_ERR_INVALID_PARAM);
    stops[1] = 99;
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_OK);

    /* a migration (rule 37): the last k prompt tokens were generated */
    make_req(&g, &s);
    g.resume_generated = 3; /* prompt 5 + 3 generated, 1 of 4 to come */
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_OK);
    s.max_tokens = 11; /* 5 + 11 = 16: the context counts the generated ones once */
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_OK);
    s.max_tokens = 12;
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_ERR_TOO_LONG);
    s.max_tokens = 3; /* nothing left to generate */
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_ERR_INVALID_PARAM);
    assert_non_null(strstr(why, "resume_generated"));
    s.max_tokens = 4;
    g.resume_generated = 8; /* the whole prompt */
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_ERR_INVALID_PARAM);
    g.resume_generated = 3;
    g.protocol_only = 1;
    assert_int_equal(epd_decode_check_generate(&lim, &g, &sp, &why), EPD_ERR_INVALID_PARAM);
}

/* A pool for layout "LA..." with random contents and the checksums of
 * request blocks {5, 1, 3} + slot 2, hashed the way prefill does (blocks in
 * table order per attention layer, the slot per linear layer). */
typedef struct {
    const char *dir;
    epd_engine_t *engine;
    const epd_engine_info_t *info;
    epd_kv_pool_t pool;
    epd_hash_state_t *h;
    uint64_t sums[EPD_KV_MAX_LAYERS];
    uint32_t ids[3];
    uint32_t slot;
} kv_fix_t;

static void kv_fix_open(kv_fix_t *f)
{
    epd_mkmodel_params_t p;
    epd_engine_config_t cfg = {0};
    epd_rng_t rng;

    memset(f, 0, sizeof(*f));
    f->ids[0] = 5;
    f->ids[1] = 1;
    f->ids[2] = 3;
    f->slot = 2;
    f->dir = epd_test_tmpdir();
    epd_test_tiny_params(&p);
    cfg.model_dir = epd_test_write_model(f->dir, "tiny", &p);
    assert_int_equal(epd_engine_open("ref", &cfg, &f->engine), EPD_OK);
    f->info = epd_engine_info(f->engine);
    assert_true(f->info->kv.n_linear_layers > 0 && f->info->kv.n_attn_layers > 0);
    epd_test_pool(f->engine, 8, 4, &f->pool);
    epd_rng_seed(&rng, 3);
    epd_rng_fill(&rng, f->pool.base, f->pool.bytes);
    assert_int_equal(epd_hash_state_create(0, &f->h), EPD_OK);
    for (uint32_t l = 0; l < f->info->kv.n_layers; l++) {
        uint64_t off;

        if (f->info->kv.kind[l] == EPD_LAYER_LINEAR) {
            assert_int_equal(epd_kv_state_offset(&f->info->kv, 8, 4, l, f->slot, &off), EPD_OK);
            f->sums[l] =
                epd_hash64((unsigned char *)f->pool.base + off, f->info->kv.state_bytes, 0);
        } else {
            size_t n = 3 * f->info->kv.block_bytes;
            unsigned char *cat = epd_malloc(n);

            for (int i = 0; i < 3; i++) {
                assert_int_equal(epd_kv_block_offset(&f->info->kv, 8, l, f->ids[i], &off), EPD_OK);
                memcpy(cat + i * f->info->kv.block_bytes, (unsigned char *)f->pool.base + off,
                       f->info->kv.block_bytes);
            }
            f->sums[l] = epd_hash64(cat, n, 0);
            epd_free(cat);
        }
    }
}

static void kv_fix_close(kv_fix_t *f)
{
    epd_hash_state_destroy(f->h);
    epd_free(f->pool.base);
    epd_engine_close(f->engine);
    epd_test_rmtree(f->dir);
}

static void test_kv_checksums(void **state)
{
    kv_fix_t F;
    const epd_engine_info_t *info;
    uint32_t bad = 99;

    (void)state;
    kv_fix_open(&F);
    info = F.info;
    assert_int_equal(epd_decode_check_kv(&info->kv, &F.pool, F.ids, 3, F.slot, F.sums,
                                         info->kv.n_layers, F.h, &bad),
                     EPD_OK);
    /* wrong number of checksums */
    assert_int_equal(epd_decode_check_kv(&info->kv, &F.pool, F.ids, 3, F.slot, F.sums,
                                         info->kv.n_layers - 1, F.h, &bad),
                     EPD_ERR_INVALID_PARAM);
    /* blocks in another order hash differently */
    {
        uint32_t swapped[3] = {1, 5, 3};

        assert_int_equal(epd_decode_check_kv(&info->kv, &F.pool, swapped, 3, F.slot, F.sums,
                                             info->kv.n_layers, F.h, &bad),
                         EPD_ERR_CORRUPT);
    }
    /* one flipped byte in the last attention layer's last block */
    for (uint32_t l = info->kv.n_layers; l-- > 0;) {
        if (info->kv.kind[l] == EPD_LAYER_ATTENTION) {
            uint64_t off;

            assert_int_equal(epd_kv_block_offset(&info->kv, 8, l, F.ids[2], &off), EPD_OK);
            ((unsigned char *)F.pool.base)[off + info->kv.block_bytes - 1] ^= 0x40;
            assert_int_equal(epd_decode_check_kv(&info->kv, &F.pool, F.ids, 3, F.slot, F.sums,
                                                 info->kv.n_layers, F.h, &bad),
                             EPD_ERR_CORRUPT);
            assert_int_equal(bad, l);
            ((unsigned char *)F.pool.base)[off + info->kv.block_bytes - 1] ^= 0x40;
            break;
        }
    }
    /* a flipped byte in the state slot */
    for (uint32_t l = 0; l < info->kv.n_layers; l++) {
        if (info->kv.kind[l] == EPD_LAYER_LINEAR) {
            uint64_t off;

            assert_int_equal(epd_kv_state_offset(&info->kv, 8, 4, l, F.slot, &off), EPD_OK);
            ((unsigned char *)F.pool.base)[off] ^= 1;
            assert_int_equal(epd_decode_check_kv(&info->kv, &F.pool, F.ids, 3, F.slot, F.sums,
                                                 info->kv.n_layers, F.h, &bad),
                             EPD_ERR_CORRUPT);
            assert_int_equal(bad, l);
            ((unsigned char *)F.pool.base)[off] ^= 1;
            break;
        }
    }
    /* a block outside the pool */
    {
        uint32_t outside[1] = {8};

        assert_int_equal(epd_decode_check_kv(&info->kv, &F.pool, outside, 1, F.slot, F.sums,
                                             info->kv.n_layers, F.h, &bad),
                         EPD_ERR_INVALID_PARAM);
    }
    kv_fix_close(&F);
}

/* Quantized KV (a mixed map: fp8 in layer 1, int8 in layer 3): the scales
 * live inside the blocks, so the per-layer checksum covers them and one
 * flipped bit of a scale is refused like any other corrupted byte. */
static void test_kv_scale_corrupted(void **state)
{
    epd_mkmodel_params_t p;
    epd_engine_config_t cfg = {0};
    epd_engine_t *engine = NULL;
    const epd_engine_info_t *info;
    const epd_kv_layout_t *kv;
    epd_kv_pool_t pool;
    epd_hash_state_t *h = NULL;
    uint32_t ids[3] = {5, 1, 3};
    int32_t tokens[40];
    uint64_t sums[EPD_KV_MAX_LAYERS];
    float *logits;
    const char *dir = epd_test_tmpdir();
    uint32_t bad = 99;

    (void)state;
    epd_test_tiny_params(&p);
    cfg.model_dir = epd_test_write_model(dir, "tinyq", &p);
    cfg.kv_dtype = "1:fp8,3:int8";
    assert_int_equal(epd_engine_open("ref", &cfg, &engine), EPD_OK);
    info = epd_engine_info(engine);
    kv = &info->kv;
    assert_true(kv->mixed);
    assert_int_equal(kv->layer_dtype[1], EPD_DTYPE_FP8_E4M3);
    assert_int_equal(kv->layer_dtype[3], EPD_DTYPE_INT8);
    epd_test_pool(engine, 8, 4, &pool);
    logits = epd_calloc(info->vocab_size, sizeof(float));
    assert_non_null(logits);
    for (int i = 0; i < 40; i++) {
        tokens[i] = 1 + (i * 37) % 250;
    }
    {
        epd_prefill_args_t a = {.seq = {.req_id = 1, .block_table = ids, .n_blocks = 3,
                                        .state_slot = 2},
                                .tokens = tokens, .n_tokens = 40};

        assert_int_equal(epd_engine_prefill(engine, &pool, &a, NULL, logits), EPD_OK);
    }
    assert_int_equal(epd_hash_state_create(0, &h), EPD_OK);
    /* the sums as prefill computes them: each layer's blocks, its own size */
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        uint64_t off;

        epd_hash_state_reset(h, 0);
        if (kv->kind[l] == EPD_LAYER_LINEAR) {
            assert_int_equal(epd_kv_state_offset(kv, 8, 4, l, 2, &off), EPD_OK);
            epd_hash_state_update(h, (unsigned char *)pool.base + off, kv->state_bytes);
        } else {
            for (int i = 0; i < 3; i++) {
                assert_int_equal(epd_kv_block_offset(kv, 8, l, ids[i], &off), EPD_OK);
                epd_hash_state_update(h, (unsigned char *)pool.base + off,
                                      epd_kv_layer_block_bytes(kv, l));
            }
        }
        sums[l] = epd_hash_state_digest(h);
    }
    assert_int_equal(epd_decode_check_kv(kv, &pool, ids, 3, 2, sums, kv->n_layers, h, &bad),
                     EPD_OK);
    for (uint32_t l = 1; l < kv->n_layers; l += 2) {
        /* the scale of (V, kv head 1, token 2) of the prompt's second block */
        uint64_t off;
        uint64_t half = epd_kv_layer_block_bytes(kv, l) / 2;
        uint64_t rows = (uint64_t)kv->n_kv_heads * kv->block_tokens;
        uint64_t at = half + rows * kv->head_dim + (1ull * kv->block_tokens + 2) * sizeof(float);
        unsigned char *b;
        float before[EPD_KVQ_MAX_HEAD_DIM];
        float after[EPD_KVQ_MAX_HEAD_DIM];

        assert_int_equal(epd_kv_block_offset(kv, 8, l, ids[1], &off), EPD_OK);
        b = (unsigned char *)pool.base + off;
        epd_kvq_row_get(kv, l, b, 1, 1, 2, before);
        b[at + 1] ^= 0x10;
        epd_kvq_row_get(kv, l, b, 1, 1, 2, after);
        assert_memory_not_equal(before, after, kv->head_dim * sizeof(float)); /* a scale */
        assert_int_equal(epd_decode_check_kv(kv, &pool, ids, 3, 2, sums, kv->n_layers, h, &bad),
                         EPD_ERR_CORRUPT);
        assert_int_equal(bad, l);
        b[at + 1] ^= 0x10;
    }
    assert_int_equal(epd_decode_check_kv(kv, &pool, ids, 3, 2, sums, kv->n_layers, h, &bad),
                     EPD_OK);
    epd_hash_state_destroy(h);
    epd_free(logits);
    epd_free(pool.base);
    epd_engine_close(engine);
    epd_test_rmtree(dir);
}

/* Verification as a request sees it: landed LayerDones one by one, then
 * PrefillComplete for the rest, with what is being checked remembered (the
 * checks themselves run on the verifier thread: epd_decode_check_layer). */
static void test_kv_landed_then_completed(void **state)
{
    kv_fix_t F;
    uint64_t seen_sums[EPD_KV_MAX_LAYERS], sums[EPD_KV_MAX_LAYERS];
    uint8_t seen_state[EPD_KV_MAX_LAYERS], newly[EPD_KV_MAX_LAYERS];
    epd_decode_kv_seen_t seen;
    const epd_kv_layout_t *kv;
    const char *why = NULL;
    uint64_t bytes = 0;
    uint32_t n;
    int check = -1;

    (void)state;
    kv_fix_open(&F);
    kv = &F.info->kv;
    n = kv->n_layers;
    memset(seen_state, 0, sizeof(seen_state));
    seen = (epd_decode_kv_seen_t){.sums = seen_sums, .state = seen_state, .kind = -1};
    /* a layer outside the model */
    assert_int_equal(epd_decode_seen_landed(&seen, n, n, 0, EPD_KV_SUM_BYTES, &check, &why),
                     EPD_ERR_INVALID_PARAM);
    assert_non_null(strstr(why, "outside the model"));
    /* layer 0 lands: to be checked; again with the same sum: nothing new */
    assert_int_equal(
        epd_decode_seen_landed(&seen, n, 0, F.sums[0], EPD_KV_SUM_BYTES, &check, &why), EPD_OK);
    assert_int_equal(check, 1);
    assert_int_equal(seen.n_checking, 1);
    assert_int_equal(epd_decode_check_layer(kv, &F.pool, F.ids, 3, F.slot, 0, seen.sums[0],
                                            EPD_KV_SUM_BYTES, NULL, F.h, &bytes, &why),
                     EPD_OK);
    assert_int_equal(epd_decode_seen_result(&seen, 0, EPD_OK, bytes, &why), EPD_OK);
    assert_int_equal(seen.n_ok, 1);
    assert_true(seen.state[0] == EPD_DECODE_KV_OK && seen.bytes > 0);
    assert_int_equal(
        epd_decode_seen_landed(&seen, n, 0, F.sums[0], EPD_KV_SUM_BYTES, &check, &why), EPD_OK);
    assert_int_equal(check, 0);
    assert_int_equal(seen.n_ok, 1);
    /* ... and with another sum, or another kind: refused, not read as corruption */
    assert_int_equal(
        epd_decode_seen_landed(&seen, n, 0, F.sums[0] ^ 1, EPD_KV_SUM_BYTES, &check, &why),
        EPD_ERR_INVALID_PARAM);
    assert_non_null(strstr(why, "second"));
    assert_int_equal(
        epd_decode_seen_landed(&seen, n, 1, F.sums[1], EPD_KV_SUM_STAMPED, &check, &why),
        EPD_ERR_INVALID_PARAM);
    assert_non_null(strstr(why, "kind"));
    /* PrefillComplete disagreeing with the landed layer 0, or of another kind */
    memcpy(sums, F.sums, sizeof(sums));
    sums[0] ^= 1;
    assert_int_equal(
        epd_decode_seen_completed(&seen, n, sums, n, EPD_KV_SUM_BYTES, newly, &why),
        EPD_ERR_INVALID_PARAM);
    assert_non_null(strstr(why, "LayerDone"));
    assert_int_equal(
        epd_decode_seen_completed(&seen, n, F.sums, n, EPD_KV_SUM_STAMPED, newly, &why),
        EPD_ERR_INVALID_PARAM);
    /* a wrong number of sums */
    assert_int_equal(
        epd_decode_seen_completed(&seen, n, F.sums, n - 1, EPD_KV_SUM_BYTES, newly, &why),
        EPD_ERR_INVALID_PARAM);
    assert_int_equal(seen.n_checking, 0); /* nothing changed by the refusals */
    /* the rest is checked after completion: all but layer 0 */
    assert_int_equal(
        epd_decode_seen_completed(&seen, n, F.sums, n, EPD_KV_SUM_BYTES, newly, &why), EPD_OK);
    assert_false(newly[0]);
    for (uint32_t l = 1; l < n; l++) {
        assert_true(newly[l]);
        assert_int_equal(epd_decode_check_layer(kv, &F.pool, F.ids, 3, F.slot, l, seen.sums[l],
                                                EPD_KV_SUM_BYTES, NULL, F.h, &bytes, &why),
                         EPD_OK);
        assert_int_equal(epd_decode_seen_result(&seen, l, EPD_OK, bytes, &why), EPD_OK);
    }
    assert_int_equal(seen.n_ok, n);
    assert_int_equal(seen.n_checking, 0);
    /* corruption of a layer that never landed is found by its check */
    memset(seen_state, 0, sizeof(seen_state));
    seen = (epd_decode_kv_seen_t){.sums = seen_sums, .state = seen_state, .kind = -1};
    memcpy(sums, F.sums, sizeof(sums));
    sums[n - 1] ^= 1;
    assert_int_equal(epd_decode_seen_completed(&seen, n, sums, n, EPD_KV_SUM_BYTES, newly, &why),
                     EPD_OK);
    assert_int_equal(epd_decode_check_layer(kv, &F.pool, F.ids, 3, F.slot, n - 1, seen.sums[n - 1],
                                            EPD_KV_SUM_BYTES, NULL, F.h, &bytes, &why),
                     EPD_ERR_CORRUPT);
    assert_non_null(strstr(why, "corrupt"));
    assert_int_equal(epd_decode_seen_result(&seen, n - 1, EPD_ERR_CORRUPT, 0, &why),
                     EPD_ERR_CORRUPT);
    assert_int_equal(seen.state[n - 1], EPD_DECODE_KV_WAIT);
    /* PrefillComplete disagreeing with a layer whose check is still out: the
     * check decides — a LayerDone sum that matched the bytes makes
     * PrefillComplete the wrong one (invalid), a failed check is the
     * corruption */
    memset(seen_state, 0, sizeof(seen_state));
    seen = (epd_decode_kv_seen_t){.sums = seen_sums, .state = seen_state, .kind = -1};
    assert_int_equal(
        epd_decode_seen_landed(&seen, n, 0, F.sums[0], EPD_KV_SUM_BYTES, &check, &why), EPD_OK);
    assert_int_equal(
        epd_decode_seen_landed(&seen, n, 1, F.sums[1] ^ 1, EPD_KV_SUM_BYTES, &check, &why), EPD_OK);
    memcpy(sums, F.sums, sizeof(sums));
    sums[0] ^= 4;
    assert_int_equal(epd_decode_seen_completed(&seen, n, sums, n, EPD_KV_SUM_BYTES, newly, &why),
                     EPD_OK);
    assert_false(newly[0] || newly[1]);
    assert_int_equal(epd_decode_seen_result(&seen, 0, EPD_OK, bytes, &why), EPD_ERR_INVALID_PARAM);
    assert_non_null(strstr(why, "LayerDone"));
    assert_int_equal(epd_decode_seen_result(&seen, 1, EPD_ERR_CORRUPT, 0, &why), EPD_ERR_CORRUPT);
    kv_fix_close(&F);
}

/* Kind STAMPED through decode's one-layer check: stamped units (as a
 * stamping engine leaves them) check out by their stamps, a misplaced
 * block fails it, the kind decides how the sum is read, and only a full
 * check sees a changed body. */
static void test_kv_stamped(void **state)
{
    const epd_kv_stamp_expect_t x = {.req_id = 9, .tag = 4, .n_tokens = 40};
    epd_kv_stamp_expect_t xf = x;
    uint32_t swapped[3];
    const epd_kv_layout_t *kv;
    uint64_t sums[EPD_KV_MAX_LAYERS];
    const char *why = NULL;
    uint64_t bytes = 0;
    kv_fix_t F;

    (void)state;
    kv_fix_open(&F);
    kv = &F.info->kv;
    xf.full = 1;
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        uint32_t n = kv->kind[l] == EPD_LAYER_LINEAR ? 1 : 3;

        epd_hash_state_reset(F.h, 0);
        for (uint32_t i = 0; i < n; i++) {
            uint64_t off, len;
            unsigned char *u;
            epd_kv_stamp_t st = {.req_id = 9, .tag = 4, .hk = 100 + l, .layer = l};

            if (n == 1) {
                assert_int_equal(epd_kv_state_offset(kv, 8, 4, l, F.slot, &off), EPD_OK);
                len = kv->state_bytes;
                st.count = 40;
            } else {
                assert_int_equal(epd_kv_block_offset(kv, 8, l, F.ids[i], &off), EPD_OK);
                len = kv->block_bytes;
                st.index = i;
                st.count = i < 2 ? 16 : 8;
            }
            u = (unsigned char *)F.pool.base + off;
            st.body = epd_kv_stamp_body(u, len);
            epd_kv_stamp_put(u, len, &st);
            epd_hash_state_update(F.h, u, EPD_KV_STAMP_HALF);
            epd_hash_state_update(F.h, u + len - EPD_KV_STAMP_HALF, EPD_KV_STAMP_HALF);
        }
        sums[l] = epd_hash_state_digest(F.h);
    }
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        assert_int_equal(epd_decode_check_layer(kv, &F.pool, F.ids, 3, F.slot, l, sums[l],
                                                EPD_KV_SUM_STAMPED, &xf, F.h, &bytes, &why),
                         EPD_OK);
        /* the same sum read as kind BYTES is another checksum */
        assert_int_equal(epd_decode_check_layer(kv, &F.pool, F.ids, 3, F.slot, l, sums[l],
                                                EPD_KV_SUM_BYTES, &x, F.h, &bytes, &why),
                         EPD_ERR_CORRUPT);
    }
    /* blocks 0 and 2 of the attention layers swapped: misplaced */
    swapped[0] = F.ids[2];
    swapped[1] = F.ids[1];
    swapped[2] = F.ids[0];
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        if (kv->kind[l] == EPD_LAYER_ATTENTION) {
            assert_int_equal(epd_decode_check_layer(kv, &F.pool, swapped, 3, F.slot, l, sums[l],
                                                    EPD_KV_SUM_STAMPED, &x, F.h, &bytes, &why),
                             EPD_ERR_CORRUPT);
            assert_non_null(strstr(why, "misplaced"));
            /* a changed body: stamps intact, only the full check sees it */
            {
                uint64_t off;

                assert_int_equal(epd_kv_block_offset(kv, 8, l, F.ids[1], &off), EPD_OK);
                ((unsigned char *)F.pool.base)[off + kv->block_bytes / 2] ^= 2;
                assert_int_equal(epd_decode_check_layer(kv, &F.pool, F.ids, 3, F.slot, l, sums[l],
                                                        EPD_KV_SUM_STAMPED, &x, F.h, &bytes,
                                                        &why),
                                 EPD_OK);
                assert_int_equal(epd_decode_check_layer(kv, &F.pool, F.ids, 3, F.slot, l, sums[l],
                                                        EPD_KV_SUM_STAMPED, &xf, F.h, &bytes,
                                                        &why),
                                 EPD_ERR_CORRUPT);
            }
            break;
        }
    }
    kv_fix_close(&F);
}

/* Can the prefill worker a GenerateRequest names be told about it? */
static void test_prefill_named(void **state)
{
    Epd__GenerateRequest g;
    Epd__Epoch e = EPD__EPOCH__INIT;
    char long_id[EPD_WORKER_ID_MAX + 1];
    uint8_t addr[4] = {1, 2, 3, 4};

    (void)state;
    epd__generate_request__init(&g);
    g.prefill_worker_id = (char *)"prefill-0";
    g.prefill_epoch = &e;
    g.prefill_address.data = addr;
    g.prefill_address.len = sizeof(addr);
    assert_true(epd_decode_check_prefill_named(&g));
    memset(long_id, 'p', sizeof(long_id));
    long_id[EPD_WORKER_ID_MAX - 1] = '\0'; /* 127 bytes: the longest id */
    g.prefill_worker_id = long_id;
    assert_true(epd_decode_check_prefill_named(&g));
    long_id[EPD_WORKER_ID_MAX - 1] = 'p';
    long_id[EPD_WORKER_ID_MAX] = '\0'; /* 128 */
    assert_false(epd_decode_check_prefill_named(&g));
    g.prefill_worker_id = (char *)"";
    assert_false(epd_decode_check_prefill_named(&g));
    g.prefill_worker_id = (char *)"prefill-0";
    g.prefill_epoch = NULL;
    assert_false(epd_decode_check_prefill_named(&g));
    g.prefill_epoch = &e;
    g.prefill_address.len = 0;
    assert_false(epd_decode_check_prefill_named(&g));
    g.prefill_address.len = EPD_XPORT_ADDR_MAX + 1;
    assert_false(epd_decode_check_prefill_named(&g));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_checks),
        cmocka_unit_test(test_kv_checksums),
        cmocka_unit_test(test_kv_scale_corrupted),
        cmocka_unit_test(test_kv_landed_then_completed),
        cmocka_unit_test(test_kv_stamped),
        cmocka_unit_test(test_prefill_named),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
