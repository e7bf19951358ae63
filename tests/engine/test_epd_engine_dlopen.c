/*
 * test_epd_engine_dlopen.c — engines loaded from shared objects: the toy
 * engine (tests/engine/epd_engine_toy.c, built to a .so by the test module)
 * opens by path, prefills (sink per layer), decodes and writes exactly where
 * the layout says; bad shared objects are refused with a clear error.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_engine.h"

#ifndef EPD_TEST_TOY_SO
#error "EPD_TEST_TOY_SO (path of the toy engine) must be defined by the build"
#endif

static int sink_calls;

static epd_status_t count_sink(void *ctx, uint32_t layer, const epd_layer_done_t *d)
{
    (void)ctx;
    assert_int_equal(layer, (uint32_t)sink_calls);
    assert_int_equal(d->layer, layer);
    sink_calls++;
    return EPD_OK;
}

static void test_toy_engine_runs(void **state)
{
    epd_engine_config_t cfg = {.model_dir = "unused", .block_tokens = 2};
    epd_engine_sink_t sink = {.cb = count_sink};
    const epd_engine_info_t *info;
    epd_engine_t *e = NULL;
    epd_kv_pool_t pool;
    uint32_t table[4] = {3, 1, 0, 2};
    int32_t toks[8];
    size_t n;
    float logits[258];
    epd_prefill_args_t a;
    epd_decode_req_t r;
    uint64_t off;
    float *blk;

    (void)state;
    assert_int_equal(epd_engine_open(EPD_TEST_TOY_SO, &cfg, &e), EPD_OK);
    assert_string_equal(epd_engine_name(e), "toy");
    info = epd_engine_info(e);
    assert_int_equal(info->kv.n_layers, 2);
    pool.n_blocks = 4;
    pool.n_state_slots = 2;
    pool.bytes = epd_kv_pool_bytes(&info->kv, 4, 2);
    pool.base = epd_calloc(1, pool.bytes);
    assert_non_null(pool.base);
    assert_int_equal(epd_engine_tokenize(e, "abc", 3, 1, toks, 8, &n), EPD_OK);
    assert_int_equal(n, 4);
    a = (epd_prefill_args_t){.seq = {.block_table = table, .n_blocks = 4, .state_slot = 1},
                             .tokens = toks,
                             .n_tokens = 4};
    assert_int_equal(epd_engine_prefill(e, &pool, &a, &sink, logits), EPD_OK);
    assert_int_equal(sink_calls, 2);
    assert_true(logits['d'] == 1.0f);
    /* token 'b' at position 2 lives in block table[1] = 1, row 0 */
    assert_int_equal(epd_kv_block_offset(&info->kv, 4, 0, 1, &off), EPD_OK);
    blk = (float *)((char *)pool.base + off);
    assert_true(blk[0] == 'b' && blk[1] == 2.0f);
    r = (epd_decode_req_t){.seq = a.seq, .pos = 4, .token = 'x'};
    assert_int_equal(epd_engine_decode(e, &pool, &r, 1, logits), EPD_OK);
    assert_true(logits['y'] == 1.0f);
    assert_int_equal(epd_kv_state_offset(&info->kv, 4, 2, 1, 1, &off), EPD_OK);
    assert_true(*(float *)((char *)pool.base + off) == 5.0f);
    /* no vision encoder: images and embedding spans refused */
    assert_int_equal(info->image_embeddings, 0);
    assert_int_equal(info->embed_dim, 0);
    assert_int_equal(info->image_token, -1);
    {
        uint8_t px[3] = {0};
        epd_image_view_t img = {.width = 1, .height = 1, .rgb = px};
        float rows[2] = {0};
        epd_embed_span_t span = {.pos = 0, .n = 1, .data = rows};
        epd_prefill_args_t b = a;

        assert_int_equal(epd_engine_encode_image(e, &img, rows), EPD_ERR_UNSUPPORTED);
        b.embeds = &span;
        b.n_embeds = 1;
        assert_int_equal(epd_engine_prefill(e, &pool, &b, NULL, logits), EPD_ERR_UNSUPPORTED);
    }
    /* the host's checks still apply to a loaded engine */
    r.pos = 8;
    assert_int_equal(epd_engine_decode(e, &pool, &r, 1, logits), EPD_ERR_INVALID_PARAM);
    epd_engine_release(e, &pool, &a.seq);
    assert_true(*(float *)((char *)pool.base + off) == 0.0f);
    epd_free(pool.base);
    epd_engine_close(e);
}

static void test_bad_shared_objects(void **state)
{
    epd_engine_config_t cfg = {.model_dir = "unused"};
    epd_engine_t *e = NULL;

    (void)state;
    assert_int_equal(epd_engine_open("/nonexistent/libengine.so", &cfg, &e), EPD_ERR_NOT_FOUND);
    assert_int_equal(epd_engine_open("/etc/hostname", &cfg, &e), EPD_ERR_NOT_FOUND);
    /* a real shared object without the entry symbol */
    assert_int_equal(epd_engine_open("libm.so.6/", &cfg, &e), EPD_ERR_NOT_FOUND);
    setenv("EPD_TOY_BAD_OPS", "1", 1);
    assert_int_equal(epd_engine_open(EPD_TEST_TOY_SO, &cfg, &e), EPD_ERR_UNSUPPORTED);
    unsetenv("EPD_TOY_BAD_OPS");
    assert_null(e);
}

static void test_no_entry_symbol(void **state)
{
    static const char *const libs[] = {"/lib/x86_64-linux-gnu/libm.so.6",
                                       "/usr/lib/x86_64-linux-gnu/libm.so.6", "/lib64/libm.so.6"};
    epd_engine_config_t cfg = {.model_dir = "unused"};
    epd_engine_t *e = NULL;

    (void)state;
    for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]); i++) {
        epd_status_t st = epd_engine_open(libs[i], &cfg, &e);

        if (st != EPD_ERR_NOT_FOUND) {
            assert_int_equal(st, EPD_ERR_UNSUPPORTED);
            assert_null(e);
            return;
        }
    }
    skip();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_toy_engine_runs),
        cmocka_unit_test(test_bad_shared_objects),
        cmocka_unit_test(test_no_entry_symbol),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
