/*
 * test_epd_kvq.c — quantized KV (engine/epd_kvq.c): the codecs against an
 * independent numpy reference (tests/engine/kvq_ref.py: rounding ties,
 * saturation at ±448 and ±127, NaN and Inf, FP8 subnormals, every FP8
 * code decoded, whole rows with their scales), the dtype map parser and
 * its canonical form, and per-layer block offsets of a mixed map.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_engine.h"
#include "epd_kvq.h"
#include "epd_test_engine_util.h"

/* a small deterministic generator (xorshift64*) */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

/* log-uniform magnitude in [2^lo, 2^hi), random sign */
static float rng_value(int lo, int hi)
{
    double u = (double)(rng_next() >> 11) / 9007199254740992.0;
    double m = ldexp(1.0, lo) * pow(2.0, u * (hi - lo));

    return (float)((rng_next() & 1) ? -m : m);
}

static void one_layout(epd_kv_layout_t *kv, uint32_t n_layers, const char *pattern)
{
    memset(kv, 0, sizeof(*kv));
    kv->n_layers = n_layers;
    for (uint32_t l = 0; l < n_layers; l++) {
        kv->kind[l] = pattern[l % strlen(pattern)] == 'L' ? EPD_LAYER_LINEAR : EPD_LAYER_ATTENTION;
        kv->kind_index[l] = kv->kind[l] == EPD_LAYER_ATTENTION ? kv->n_attn_layers++
                                                                : kv->n_linear_layers++;
    }
    kv->block_tokens = 4;
    kv->n_kv_heads = 2;
    kv->head_dim = 64;
    kv->state_bytes = 1000;
}

/* rows of one dtype through epd_kvq_row_put / row_get, into the file */
static void dump_rows(FILE *f, epd_dtype_t dt)
{
    epd_kv_layout_t kv;
    uint8_t dtypes[1] = {(uint8_t)dt};
    uint32_t rows = 2 * 2 * 4 * 8; /* 8 blocks of [2][2 heads][4 toks] */
    uint32_t hd = 64;
    uint32_t hdr[3] = {rows, hd, (uint32_t)dt};
    float *x = calloc((size_t)rows * hd, sizeof(float));
    uint8_t *codes = calloc((size_t)rows * hd, 1);
    float *scales = calloc(rows, sizeof(float));
    float *out = calloc((size_t)rows * hd, sizeof(float));
    void *block;

    one_layout(&kv, 1, "A");
    epd_kvq_layout_apply(&kv, dtypes);
    assert_int_equal(kv.block_bytes, 2 * (2 * 4 * 64 + 2 * 4 * 4));
    block = calloc(1, kv.block_bytes);
    assert_non_null(x);
    assert_non_null(block);
    for (uint32_t r = 0; r < rows; r++) {
        uint32_t kind = r % 8;
        for (uint32_t i = 0; i < hd; i++) {
            float *v = &x[(size_t)r * hd + i];
            switch (kind) {
            case 0: /* all zero: scale 1 */
                *v = 0.0f;
                break;
            case 1: /* NaN and Inf among ordinary values */
                *v = i == 3 ? NAN : i == 5 ? INFINITY : i == 7 ? -INFINITY : rng_value(-4, 2);
                break;
            case 2: /* tiny: subnormal FP8 after scaling by a huge amax */
                *v = i == 0 ? 1.0e4f : rng_value(-20, -8);
                break;
            case 3: /* so small the scale underflows */
                *v = i == 0 ? 1.0e-42f : 0.0f;
                break;
            default:
                *v = rng_value(-12, 8);
                break;
            }
        }
    }
    for (uint32_t r = 0; r < rows; r++) {
        /* row r is (v, kvh, tok) of block r / 16 */
        uint32_t j = r % 16;
        int v = (int)(j / 8);
        uint32_t kvh = (j / 4) % 2;
        uint32_t tok = j % 4;
        uint64_t half = kv.block_bytes / 2;
        const char *h = (const char *)block + (v ? half : 0);
        uint32_t row = kvh * 4 + tok;

        epd_kvq_row_put(&kv, 0, block, v, kvh, tok, x + (size_t)r * hd);
        epd_kvq_row_get(&kv, 0, block, v, kvh, tok, out + (size_t)r * hd);
        memcpy(codes + (size_t)r * hd, h + (size_t)row * hd, hd);
        memcpy(&scales[r], h + (size_t)8 * hd + (size_t)row * 4, 4);
    }
    assert_int_equal(fwrite(hdr, sizeof(hdr), 1, f), 1);
    assert_int_equal(fwrite(x, sizeof(float) * hd, rows, f), rows);
    assert_int_equal(fwrite(codes, hd, rows, f), rows);
    assert_int_equal(fwrite(scales, sizeof(float), rows, f), rows);
    assert_int_equal(fwrite(out, sizeof(float) * hd, rows, f), rows);
    free(x);
    free(codes);
    free(scales);
    free(out);
    free(block);
}

static void test_codecs_match_numpy(void **state)
{
    static const float special[] = {
        0.0f, -0.0f, NAN, -NAN, INFINITY, -INFINITY, 448.0f, -448.0f, 449.0f, 463.9f, 464.0f,
        465.0f, 480.0f, 1.0e30f, -1.0e30f, 3.4e38f,
        0x1p-9f, 0x1p-10f, 0x3p-10f, 0x5p-10f, 0x1p-6f, 0x0.fp-6f, 0x1.ep-7f, 0x1.fp-7f,
        0x1p-12f, 1.0f, 1.0625f, 1.1875f, 0x1.08p0f, 0x1.18p0f, 240.0f, 248.0f, 232.0f,
        0x1.fffffep127f, 0x1.ff8p127f, 0x1.ff7fp127f, 1.00390625f, 1.01171875f, 1.0e-40f,
        126.5f, 127.5f, -127.5f, 128.0f, 500.0f, 0.5f, 1.5f, 2.5f,
    };
    size_t ns = sizeof(special) / sizeof(special[0]);
    uint32_t n = 200000;
    float inv = 0.37f;
    const char *dir = epd_test_tmpdir();
    char path[512];
    char cmd[1200];
    FILE *f;
    float *x = calloc(n, sizeof(float));
    uint8_t *fp8 = calloc(n, 1);
    uint16_t *bf = calloc(n, 2);
    int8_t *i8 = calloc(n, 1);
    float dec[256];

    (void)state;
    assert_non_null(x);
    for (uint32_t i = 0; i < n; i++) {
        x[i] = i < ns ? special[i] : i < n / 2 ? rng_value(-14, 10) : rng_value(-140, 128);
        if (i >= ns && i % 7 == 0) {
            /* exact ties of the FP8 grid: midpoints of neighbours */
            uint8_t c = (uint8_t)(rng_next() % 0x7e);
            x[i] = (epd_kvq_fp8_to_f32(c) + epd_kvq_fp8_to_f32((uint8_t)(c + 1))) / 2.0f;
        }
        fp8[i] = epd_kvq_fp8_from_f32(x[i]);
        bf[i] = epd_kvq_bf16_from_f32(x[i]);
        i8[i] = epd_kvq_int8_from_f32(x[i], inv);
    }
    for (int c = 0; c < 256; c++) {
        dec[c] = epd_kvq_fp8_to_f32((uint8_t)c);
    }
    /* spot checks the reference must agree with anyway */
    assert_int_equal(epd_kvq_fp8_from_f32(448.0f), 0x7e);
    assert_int_equal(epd_kvq_fp8_from_f32(1.0e9f), 0x7e);
    assert_int_equal(epd_kvq_fp8_from_f32(-INFINITY), 0xfe);
    assert_int_equal(epd_kvq_fp8_from_f32(NAN), 0x7f);
    assert_int_equal(epd_kvq_fp8_from_f32(0x1p-9f), 0x01);
    assert_int_equal(epd_kvq_fp8_from_f32(0x1p-10f), 0x00); /* tie to even: 0 */
    assert_int_equal(epd_kvq_fp8_from_f32(0x3p-10f), 0x02); /* tie to even: 2 */
    assert_true(isnan(epd_kvq_fp8_to_f32(0xff)));
    assert_int_equal(epd_kvq_int8_from_f32(NAN, 1.0f), -128);
    assert_true(isnan(epd_kvq_int8_to_f32(-128, 2.0f)));
    assert_int_equal(epd_kvq_int8_from_f32(INFINITY, 1.0f), 127);

    snprintf(path, sizeof(path), "%s/kvq.bin", dir);
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(&n, 4, 1, f), 1);
    assert_int_equal(fwrite(x, 4, n, f), n);
    assert_int_equal(fwrite(fp8, 1, n, f), n);
    assert_int_equal(fwrite(bf, 2, n, f), n);
    assert_int_equal(fwrite(&inv, 4, 1, f), 1);
    assert_int_equal(fwrite(i8, 1, n, f), n);
    assert_int_equal(fwrite(dec, 4, 256, f), 256);
    dump_rows(f, EPD_DTYPE_FP8_E4M3);
    dump_rows(f, EPD_DTYPE_INT8);
    assert_int_equal(fclose(f), 0);
    snprintf(cmd, sizeof(cmd), "%s %s %s", EPD_TEST_PYTHON, EPD_TEST_KVQ_REF, path);
    assert_int_equal(system(cmd), 0);
    epd_test_rmtree(dir);
    free(x);
    free(fp8);
    free(bf);
    free(i8);
}

static void test_map_parse(void **state)
{
    uint8_t d[8];
    const char *why = NULL;
    epd_kv_layout_t kv;
    char buf[128];

    (void)state;
    assert_int_equal(epd_kvq_map_parse("int8", 8, d, &why), EPD_OK);
    for (int l = 0; l < 8; l++) {
        assert_int_equal(d[l], EPD_DTYPE_INT8);
    }
    assert_int_equal(epd_kvq_map_parse("0-3:bf16,4-:fp8", 8, d, &why), EPD_OK);
    assert_int_equal(d[3], EPD_DTYPE_BF16);
    assert_int_equal(d[4], EPD_DTYPE_FP8_E4M3);
    assert_int_equal(d[7], EPD_DTYPE_FP8_E4M3);
    assert_int_equal(epd_kvq_map_parse("2:int8", 8, d, &why), EPD_OK);
    assert_int_equal(d[1], EPD_DTYPE_F32);
    assert_int_equal(d[2], EPD_DTYPE_INT8);
    assert_int_equal(epd_kvq_map_parse(NULL, 8, d, &why), EPD_OK);
    assert_int_equal(d[0], EPD_DTYPE_F32);
    static const char *bad[] = {"int4", "0-8:fp8", "3-1:fp8", "x:fp8", "0-3", "0-3:fp8,",
                                "-3:fp8", "0-3:", ",", "1:fp16"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        why = NULL;
        assert_int_equal(epd_kvq_map_parse(bad[i], 8, d, &why), EPD_ERR_INVALID_PARAM);
        assert_non_null(why);
    }
    /* canonical form: attention layers only, runs merged */
    one_layout(&kv, 8, "LAA");
    assert_int_equal(epd_kvq_map_parse("0-3:bf16,4-:fp8", 8, d, &why), EPD_OK);
    epd_kvq_layout_apply(&kv, d);
    epd_kvq_map_format(&kv, buf, sizeof(buf));
    assert_string_equal(buf, "1-3:bf16,4-7:fp8");
    assert_true(kv.mixed);
    assert_int_equal(kv.dtype, EPD_DTYPE_BF16);
    assert_int_equal(epd_kvq_map_parse("fp8", 8, d, &why), EPD_OK);
    epd_kvq_layout_apply(&kv, d);
    epd_kvq_map_format(&kv, buf, sizeof(buf));
    assert_string_equal(buf, "fp8");
}

/* Mixed map offsets: blocks of every layer tile the attention part without
 * overlap, the state part starts right after, and epd_kv_block_at inverts
 * epd_kv_block_offset. */
static void test_mixed_offsets(void **state)
{
    epd_kv_layout_t kv;
    uint8_t d[6];
    uint32_t nb = 5;
    uint64_t want = 0;
    uint64_t off;
    uint64_t st;

    (void)state;
    one_layout(&kv, 6, "AAL");
    assert_int_equal(epd_kvq_map_parse("0:f32,1:int8,3:bf16,4-:fp8", 6, d, NULL), EPD_OK);
    epd_kvq_layout_apply(&kv, d);
    assert_int_equal(epd_kv_layer_block_bytes(&kv, 0), 2 * 2 * 4 * 64 * 4);
    assert_int_equal(epd_kv_layer_block_bytes(&kv, 1), 2 * (2 * 4 * 64 + 2 * 4 * 4));
    assert_int_equal(epd_kv_layer_block_bytes(&kv, 2), 0);
    assert_int_equal(epd_kv_layer_block_bytes(&kv, 3), 2 * 2 * 4 * 64 * 2);
    for (uint32_t l = 0; l < 6; l++) {
        if (kv.kind[l] != EPD_LAYER_ATTENTION) {
            continue;
        }
        for (uint32_t b = 0; b < nb; b++) {
            uint32_t ll;
            uint32_t bb;

            assert_int_equal(epd_kv_block_offset(&kv, nb, l, b, &off), EPD_OK);
            assert_int_equal(off, want);
            assert_int_equal(epd_kv_block_at(&kv, nb, off + 1, &ll, &bb), EPD_OK);
            assert_int_equal(ll, l);
            assert_int_equal(bb, b);
            want += epd_kv_layer_block_bytes(&kv, l);
        }
    }
    assert_int_equal(epd_kv_block_set_bytes(&kv) * nb, want);
    assert_int_equal(epd_kv_state_offset(&kv, nb, 3, 2, 0, &st), EPD_OK);
    assert_int_equal(st, want);
    assert_int_equal(epd_kv_pool_bytes(&kv, nb, 3), want + 2 * 3 * 1000);
    assert_int_equal(epd_kv_block_at(&kv, nb, want, &(uint32_t){0}, &(uint32_t){0}),
                     EPD_ERR_OUT_OF_RANGE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codecs_match_numpy),
        cmocka_unit_test(test_map_parse),
        cmocka_unit_test(test_mixed_offsets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
