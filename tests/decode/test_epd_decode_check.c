/*
 * Unit tests of decode/epd_decode_check.c: GenerateRequest validation
 * (every refusal named) and KV verification against per-layer checksums
 * computed the way the prefill side computes them.
 */
#include "epd_test.h"

#include <math.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_decode_check.h"
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
}

/* A pool for layout "LA..." with random contents; checksums hashed the way
 * prefill does (blocks in table order per attention layer, the slot per
 * linear layer). */
static void test_kv_checksums(void **state)
{
    epd_mkmodel_params_t p;
    const char *dir = epd_test_tmpdir();
    const char *model;
    epd_engine_config_t cfg = {0};
    const epd_engine_info_t *info;
    epd_engine_t *engine;
    epd_kv_pool_t pool;
    epd_hash_state_t *h;
    uint64_t sums[EPD_KV_MAX_LAYERS];
    uint32_t ids[3] = {5, 1, 3};
    uint32_t slot = 2;
    uint32_t bad = 99;
    epd_rng_t rng;

    (void)state;
    epd_test_tiny_params(&p);
    model = epd_test_write_model(dir, "tiny", &p);
    cfg.model_dir = model;
    assert_int_equal(epd_engine_open("ref", &cfg, &engine), EPD_OK);
    info = epd_engine_info(engine);
    assert_true(info->kv.n_linear_layers > 0 && info->kv.n_attn_layers > 0);
    epd_test_pool(engine, 8, 4, &pool);
    epd_rng_seed(&rng, 3);
    epd_rng_fill(&rng, pool.base, pool.bytes);
    assert_int_equal(epd_hash_state_create(0, &h), EPD_OK);

    for (uint32_t l = 0; l < info->kv.n_layers; l++) {
        uint64_t off;

        if (info->kv.kind[l] == EPD_LAYER_LINEAR) {
            assert_int_equal(epd_kv_state_offset(&info->kv, 8, 4, l, slot, &off), EPD_OK);
            sums[l] = epd_hash64((unsigned char *)pool.base + off, info->kv.state_bytes, 0);
        } else {
            size_t n = 3 * info->kv.block_bytes;
            unsigned char *cat = epd_malloc(n);

            for (int i = 0; i < 3; i++) {
                assert_int_equal(epd_kv_block_offset(&info->kv, 8, l, ids[i], &off), EPD_OK);
                memcpy(cat + i * info->kv.block_bytes, (unsigned char *)pool.base + off,
                       info->kv.block_bytes);
            }
            sums[l] = epd_hash64(cat, n, 0);
            epd_free(cat);
        }
    }
    assert_int_equal(
        epd_decode_check_kv(&info->kv, &pool, ids, 3, slot, sums, info->kv.n_layers, h, &bad),
        EPD_OK);
    /* wrong number of checksums */
    assert_int_equal(
        epd_decode_check_kv(&info->kv, &pool, ids, 3, slot, sums, info->kv.n_layers - 1, h, &bad),
        EPD_ERR_INVALID_PARAM);
    /* blocks in another order hash differently */
    {
        uint32_t swapped[3] = {1, 5, 3};

        assert_int_equal(epd_decode_check_kv(&info->kv, &pool, swapped, 3, slot, sums,
                                             info->kv.n_layers, h, &bad),
                         EPD_ERR_CORRUPT);
    }
    /* one flipped byte in the last attention layer's last block */
    for (uint32_t l = info->kv.n_layers; l-- > 0;) {
        if (info->kv.kind[l] == EPD_LAYER_ATTENTION) {
            uint64_t off;

            assert_int_equal(epd_kv_block_offset(&info->kv, 8, l, ids[2], &off), EPD_OK);
            ((unsigned char *)pool.base)[off + info->kv.block_bytes - 1] ^= 0x40;
            assert_int_equal(epd_decode_check_kv(&info->kv, &pool, ids, 3, slot, sums,
                                                 info->kv.n_layers, h, &bad),
                             EPD_ERR_CORRUPT);
            assert_int_equal(bad, l);
            ((unsigned char *)pool.base)[off + info->kv.block_bytes - 1] ^= 0x40;
            break;
        }
    }
    /* a flipped byte in the state slot */
    for (uint32_t l = 0; l < info->kv.n_layers; l++) {
        if (info->kv.kind[l] == EPD_LAYER_LINEAR) {
            uint64_t off;

            assert_int_equal(epd_kv_state_offset(&info->kv, 8, 4, l, slot, &off), EPD_OK);
            ((unsigned char *)pool.base)[off] ^= 1;
            assert_int_equal(epd_decode_check_kv(&info->kv, &pool, ids, 3, slot, sums,
                                                 info->kv.n_layers, h, &bad),
                             EPD_ERR_CORRUPT);
            assert_int_equal(bad, l);
            ((unsigned char *)pool.base)[off] ^= 1;
            break;
        }
    }
    /* a block outside the pool */
    {
        uint32_t outside[1] = {8};

        assert_int_equal(epd_decode_check_kv(&info->kv, &pool, outside, 1, slot, sums,
                                             info->kv.n_layers, h, &bad),
                         EPD_ERR_INVALID_PARAM);
    }
    epd_hash_state_destroy(h);
    epd_free(pool.base);
    epd_engine_close(engine);
    epd_test_rmtree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_checks),
        cmocka_unit_test(test_kv_checksums),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
