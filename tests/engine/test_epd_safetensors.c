/*
 * test_epd_safetensors.c — bad model files get a clear error and no crash:
 * missing or truncated files, header lengths and offsets outside the file,
 * malformed JSON, unknown dtypes, shapes that disagree with the bytes or the
 * config, broken configs, non-finite weights, random header corruption.
 * Also: F16/BF16 conversion and models stored in F16/BF16.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_engine.h"
#include "epd_mkmodel.h"
#include "epd_rng.h"
#include "epd_safetensors.h"
#include "epd_test_engine_util.h"

static const char *tmpdir;
static epd_mkmodel_params_t tiny;

static epd_status_t open_dir(const char *dir)
{
    epd_engine_config_t cfg = {.model_dir = dir};
    epd_engine_t *e = NULL;
    epd_status_t st = epd_engine_open("ref", &cfg, &e);

    if (st == EPD_OK) {
        assert_non_null(e);
        epd_engine_close(e);
    } else {
        assert_null(e);
    }
    return st;
}

/* Writes an 8-byte length, the header text and `data_len` zero bytes. */
static const char *write_st(const char *name, const char *header, size_t data_len)
{
    const char *path = epd_test_path(tmpdir, name);
    size_t hlen = strlen(header);
    unsigned char *buf = epd_calloc(1, 8 + hlen + data_len);

    assert_non_null(buf);
    for (int i = 0; i < 8; i++) {
        buf[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    }
    memcpy(buf + 8, header, hlen);
    epd_test_write_file(path, buf, 8 + hlen + data_len);
    epd_free(buf);
    return path;
}

static epd_status_t st_status(const char *path)
{
    epd_st_file_t *f = NULL;
    epd_status_t st = epd_st_open(path, &f);

    epd_st_close(f);
    return st;
}

static void test_header_validation(void **state)
{
    const char *p;

    (void)state;
    p = write_st("ok.st", "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    assert_int_equal(st_status(p), EPD_OK);
    p = write_st("outside.st", "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                 4);
    assert_int_equal(st_status(p), EPD_ERR_MALFORMED);
    p = write_st(
        "far.st",
        "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4000000000,4000000004]}}", 8);
    assert_int_equal(st_status(p), EPD_ERR_MALFORMED);
    p = write_st("backwards.st", "{\"x\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}",
                 8);
    assert_int_equal(st_status(p), EPD_ERR_MALFORMED);
    p = write_st("count.st", "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8);
    assert_int_equal(st_status(p), EPD_ERR_MALFORMED);
    p = write_st("dtype.st", "{\"x\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    assert_int_equal(st_status(p), EPD_ERR_MALFORMED);
    p = write_st("negdim.st", "{\"x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}",
                 8);
    assert_int_equal(st_status(p), EPD_ERR_MALFORMED);
    p = write_st("overflow.st",
                 "{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
                 "\"data_offsets\":[0,0]}}",
                 8);
    assert_int_equal(st_status(p), EPD_ERR_MALFORMED);
    p = write_st("nooffsets.st", "{\"x\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8);
    assert_int_equal(st_status(p), EPD_ERR_MALFORMED);
    p = write_st("json.st", "{\"x\": {\"dtype\": ", 8);
    assert_int_equal(st_status(p), EPD_ERR_MALFORMED);
    p = write_st("array.st", "[1, 2, 3]", 8);
    assert_int_equal(st_status(p), EPD_ERR_MALFORMED);
    p = write_st("dup.st",
                 "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                 8);
    assert_int_equal(st_status(p), EPD_ERR_MALFORMED);
    p = write_st("meta.st", "{\"__metadata__\":{\"format\":\"pt\"}}", 0);
    assert_int_equal(st_status(p), EPD_OK);
    assert_int_equal(st_status(epd_test_path(tmpdir, "missing.st")), EPD_ERR_NOT_FOUND);
    epd_test_write_file(epd_test_path(tmpdir, "empty.st"), "", 0);
    assert_int_equal(st_status(epd_test_path(tmpdir, "empty.st")), EPD_ERR_MALFORMED);
    epd_test_write_file(epd_test_path(tmpdir, "short.st"), "\x10\0\0", 3);
    assert_int_equal(st_status(epd_test_path(tmpdir, "short.st")), EPD_ERR_MALFORMED);
    /* a header length beyond the file (and beyond any sane size) */
    epd_test_write_file(epd_test_path(tmpdir, "huge.st"), "\0\0\0\0\0\1\0\0{}", 10);
    assert_int_equal(st_status(epd_test_path(tmpdir, "huge.st")), EPD_ERR_MALFORMED);
    epd_test_write_file(epd_test_path(tmpdir, "long.st"), "\x20\0\0\0\0\0\0\0{}", 10);
    assert_int_equal(st_status(epd_test_path(tmpdir, "long.st")), EPD_ERR_MALFORMED);
}

static void test_read_and_convert(void **state)
{
    /* x: F32 [2] = {1.5, -2}; h: F16 [3] = {1, -2, 2^-24}; b: BF16 [2] = {1, -0.5} */
    const char *hdr = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[8,14]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[14,18]}}";
    const char *p = write_st("conv.st", hdr, 18);
    size_t hlen = strlen(hdr);
    size_t len;
    unsigned char *buf = epd_test_read_file(p, &len);
    float f[2] = {1.5f, -2.0f};
    uint16_t h[3] = {0x3C00, 0xC000, 0x0001};
    uint16_t b[2] = {0x3F80, 0xBF00};
    uint64_t s2[1] = {2};
    uint64_t s3[1] = {3};
    uint64_t s12[2] = {1, 2};
    float out[3];
    epd_st_file_t *st;

    (void)state;
    memcpy(buf + 8 + hlen, f, 8);
    memcpy(buf + 8 + hlen + 8, h, 6);
    memcpy(buf + 8 + hlen + 14, b, 4);
    epd_test_write_file(p, buf, len);
    epd_free(buf);
    assert_int_equal(epd_st_open(p, &st), EPD_OK);
    assert_int_equal(epd_st_count(st), 3);
    assert_int_equal(epd_st_read_f32(st, "x", 1, s2, out), EPD_OK);
    assert_true(out[0] == 1.5f && out[1] == -2.0f);
    assert_int_equal(epd_st_read_f32(st, "h", 1, s3, out), EPD_OK);
    assert_true(out[0] == 1.0f && out[1] == -2.0f && out[2] == ldexpf(1.0f, -24));
    assert_int_equal(epd_st_read_f32(st, "b", 2, s12, out), EPD_OK);
    assert_true(out[0] == 1.0f && out[1] == -0.5f);
    assert_int_equal(epd_st_read_f32(st, "b", 1, s2, out), EPD_ERR_MALFORMED);
    assert_int_equal(epd_st_read_f32(st, "x", 1, s3, out), EPD_ERR_MALFORMED);
    assert_int_equal(epd_st_read_f32(st, "nope", 1, s2, out), EPD_ERR_NOT_FOUND);
    epd_st_close(st);
    assert_true(epd_f16_to_f32(0x7C00) == INFINITY);
    assert_true(epd_f16_to_f32(0x3555) > 0.333f && epd_f16_to_f32(0x3555) < 0.3334f);
}

static const char *fresh_model(const char *name)
{
    return epd_test_write_model(tmpdir, name, &tiny);
}

static void test_missing_and_truncated_files(void **state)
{
    const char *dir;
    const char *st;
    unsigned char *buf;
    size_t len;

    (void)state;
    assert_int_equal(open_dir(epd_test_path(tmpdir, "no-such-model")), EPD_ERR_NOT_FOUND);
    dir = fresh_model("trunc");
    assert_int_equal(open_dir(dir), EPD_OK);
    st = epd_test_path(dir, "model.safetensors");
    buf = epd_test_read_file(st, &len);
    epd_test_write_file(st, buf, len - 1);
    assert_int_equal(open_dir(dir), EPD_ERR_MALFORMED);
    epd_test_write_file(st, buf, len / 2);
    assert_int_equal(open_dir(dir), EPD_ERR_MALFORMED);
    epd_test_write_file(st, buf, 100);
    assert_int_equal(open_dir(dir), EPD_ERR_MALFORMED);
    epd_test_write_file(st, buf, 4);
    assert_int_equal(open_dir(dir), EPD_ERR_MALFORMED);
    remove(st);
    assert_int_equal(open_dir(dir), EPD_ERR_NOT_FOUND);
    epd_free(buf);
}

static void test_nonfinite_weight(void **state)
{
    const char *dir = fresh_model("nan");
    const char *st = epd_test_path(dir, "model.safetensors");
    uint32_t nan_bits = 0x7fc00000u;
    uint64_t hlen = 0;
    unsigned char *buf;
    size_t len;

    (void)state;
    buf = epd_test_read_file(st, &len);
    for (int i = 7; i >= 0; i--) {
        hlen = (hlen << 8) | buf[i];
    }
    memcpy(buf + 8 + hlen + 40, &nan_bits, 4); /* inside the embedding */
    epd_test_write_file(st, buf, len);
    epd_free(buf);
    assert_int_equal(open_dir(dir), EPD_ERR_MALFORMED);
}

static void write_config(const char *dir, const char *text)
{
    epd_test_write_file(epd_test_path(dir, "config.json"), text, strlen(text));
}

static void test_config_mismatch(void **state)
{
    const char *dir = fresh_model("cfg");
    epd_ref_hparams_t hp = tiny.hp;

    (void)state;
    hp.ffn = 64; /* tensors are [48, 32] */
    assert_int_equal(epd_ref_hparams_save(&hp, dir), EPD_OK);
    assert_int_equal(open_dir(dir), EPD_ERR_MALFORMED);
    hp = tiny.hp;
    hp.n_layers = 6; /* layers 4 and 5 have no tensors */
    assert_int_equal(epd_ref_hparams_save(&hp, dir), EPD_OK);
    assert_int_equal(open_dir(dir), EPD_ERR_MALFORMED);
    hp = tiny.hp;
    strcpy(hp.pattern, "AL"); /* linear k/v are [32, 32], attention wants [16, 32] */
    assert_int_equal(epd_ref_hparams_save(&hp, dir), EPD_OK);
    assert_int_equal(open_dir(dir), EPD_ERR_MALFORMED);
    hp = tiny.hp;
    hp.n_kv_heads = 3; /* 4 heads are not a multiple of 3 */
    assert_int_equal(epd_ref_hparams_save(&hp, dir), EPD_OK);
    assert_int_equal(open_dir(dir), EPD_ERR_MALFORMED);
    hp = tiny.hp;
    strcpy(hp.pattern, "LXA");
    assert_int_equal(epd_ref_hparams_save(&hp, dir), EPD_OK);
    assert_int_equal(open_dir(dir), EPD_ERR_MALFORMED);
    hp = tiny.hp;
    hp.vocab = 100;
    assert_int_equal(epd_ref_hparams_save(&hp, dir), EPD_OK);
    assert_int_equal(open_dir(dir), EPD_ERR_MALFORMED);
    write_config(dir, "{\"model_type\": \"epd-ref\", \"vocab_size\": ");
    assert_int_equal(open_dir(dir), EPD_ERR_MALFORMED);
    write_config(dir, "{\"model_type\": \"llama\"}");
    assert_int_equal(open_dir(dir), EPD_ERR_MALFORMED);
    write_config(dir, "{\"model_type\": \"epd-ref\", \"vocab_size\": \"258\"}");
    assert_int_equal(open_dir(dir), EPD_ERR_MALFORMED);
    write_config(dir, "[]");
    assert_int_equal(open_dir(dir), EPD_ERR_MALFORMED);
    assert_int_equal(epd_ref_hparams_save(&tiny.hp, dir), EPD_OK);
    assert_int_equal(open_dir(dir), EPD_OK); /* and back to a good one */
}

static void test_random_header_corruption(void **state)
{
    const char *dir = fresh_model("fuzz");
    const char *st = epd_test_path(dir, "model.safetensors");
    unsigned char *orig;
    unsigned char *buf;
    uint64_t hlen = 0;
    size_t len;
    epd_rng_t rng;
    int errors = 0;
    int loaded = 0;

    (void)state;
    orig = epd_test_read_file(st, &len);
    buf = epd_malloc(len);
    assert_non_null(buf);
    for (int i = 7; i >= 0; i--) {
        hlen = (hlen << 8) | orig[i];
    }
    epd_rng_seed(&rng, 5);
    for (int iter = 0; iter < 150; iter++) {
        epd_status_t s;

        memcpy(buf, orig, len);
        for (int k = 0; k < 3; k++) {
            size_t at = (size_t)(epd_rng_next(&rng) % (8 + hlen));

            /* mostly JSON-significant bytes, so the parse goes deep */
            static const char pick[] = "0123456789-[]{},:\"eE.FBI ";

            buf[at] = (unsigned char)pick[epd_rng_next(&rng) % (sizeof(pick) - 1)];
        }
        epd_test_write_file(st, buf, len);
        s = open_dir(dir);
        assert_true(s == EPD_OK || s == EPD_ERR_MALFORMED);
        errors += s != EPD_OK;
        loaded += s == EPD_OK;
    }
    print_message("%d of 150 corrupted headers refused, %d still loaded\n", errors, loaded);
    assert_true(errors > 0);
    epd_free(buf);
    epd_free(orig);
}

static void logits_of(const char *dir, float *logits)
{
    epd_engine_config_t cfg = {.model_dir = dir};
    epd_engine_t *e;
    epd_kv_pool_t pool;
    uint32_t table[4] = {0, 1, 2, 3};
    int32_t toks[5] = {256, 'h', 'e', 'y', '!'};
    epd_prefill_args_t a = {
        .seq = {.block_table = table, .n_blocks = 4}, .tokens = toks, .n_tokens = 5};

    assert_int_equal(epd_engine_open("ref", &cfg, &e), EPD_OK);
    epd_test_pool(e, 4, 1, &pool);
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_OK);
    epd_free(pool.base);
    epd_engine_close(e);
}

static void test_half_precision_models(void **state)
{
    epd_mkmodel_params_t p = tiny;
    float f32[258];
    float half[258];
    double err;

    (void)state;
    logits_of(fresh_model("f32"), f32);
    p.dtype = EPD_DTYPE_F16;
    logits_of(epd_test_write_model(tmpdir, "f16", &p), half);
    err = epd_test_rel_err_f(half, f32, 258);
    print_message("F16 weights: relative error %.3g\n", err);
    assert_true(err < 1e-2 && err > 0.0);
    p.dtype = EPD_DTYPE_BF16;
    logits_of(epd_test_write_model(tmpdir, "bf16", &p), half);
    err = epd_test_rel_err_f(half, f32, 258);
    print_message("BF16 weights: relative error %.3g\n", err);
    assert_true(err < 5e-2 && err > 0.0);
}

static int setup(void **state)
{
    (void)state;
    tmpdir = epd_test_tmpdir();
    epd_test_tiny_params(&tiny);
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
        cmocka_unit_test(test_header_validation),
        cmocka_unit_test(test_read_and_convert),
        cmocka_unit_test(test_missing_and_truncated_files),
        cmocka_unit_test(test_nonfinite_weight),
        cmocka_unit_test(test_config_mismatch),
        cmocka_unit_test(test_random_header_corruption),
        cmocka_unit_test(test_half_precision_models),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
