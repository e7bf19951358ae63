/*
 * test_epd_generate.c — the epd-generate program (the colocated baseline):
 * its --tokens output equals a generation driven through the engine API in
 * this process, text output is valid UTF-8, seeds reproduce, and bad input
 * (missing model, empty prompt, max tokens 0 or beyond the context, prompt
 * longer than the context, bad sampling values) exits 1 with a clear error
 * and no crash.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "epd_alloc.h"
#include "epd_engine.h"
#include "epd_sample.h"
#include "epd_test_engine_util.h"
#include "epd_utf8.h"

#ifndef EPD_TEST_BIN_DIR
#error "EPD_TEST_BIN_DIR must be defined by the build"
#endif

static const char *tmpdir;
static const char *model;
static char out[65536];
static char err[65536];

/* Runs epd-generate with `args`; stdout and stderr land in out / err. */
static int run(const char *args)
{
    char cmd[4096];
    FILE *f;
    size_t n;
    int rc;

    snprintf(cmd, sizeof(cmd), "%s/epd-generate --model %s %s >%s 2>%s", EPD_TEST_BIN_DIR, model,
             args, epd_test_path(tmpdir, "out"), epd_test_path(tmpdir, "err"));
    rc = system(cmd);
    assert_true(WIFEXITED(rc)); /* never a signal: no crash */
    f = fopen(epd_test_path(tmpdir, "out"), "rb");
    n = fread(out, 1, sizeof(out) - 1, f);
    out[n] = '\0';
    fclose(f);
    f = fopen(epd_test_path(tmpdir, "err"), "rb");
    n = fread(err, 1, sizeof(err) - 1, f);
    err[n] = '\0';
    fclose(f);
    return WEXITSTATUS(rc);
}

static size_t api_generate(const char *text, const epd_sample_params_t *sp, int32_t *toks_out,
                           size_t max)
{
    epd_engine_config_t cfg = {.model_dir = model};
    epd_sample_scratch_t *scratch;
    epd_engine_t *e;
    epd_kv_pool_t pool;
    uint32_t table[64];
    int32_t toks[128];
    float logits[258];
    size_t n;
    size_t k = 0;
    epd_prefill_args_t a;

    assert_int_equal(epd_engine_open("ref", &cfg, &e), EPD_OK);
    assert_int_equal(epd_engine_tokenize(e, text, strlen(text), 1, toks, 128, &n), EPD_OK);
    for (uint32_t i = 0; i < 64; i++) {
        table[i] = 63 - i;
    }
    epd_test_pool(e, 64, 1, &pool);
    assert_int_equal(epd_sample_scratch_create(258, &scratch), EPD_OK);
    a = (epd_prefill_args_t){
        .seq = {.block_table = table, .n_blocks = 64}, .tokens = toks, .n_tokens = (uint32_t)n};
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_OK);
    for (;;) {
        epd_decode_req_t r = {.seq = a.seq, .pos = (uint32_t)(n + k)};

        assert_int_equal(epd_sample_token(sp, scratch, logits, 258, k, &toks_out[k]), EPD_OK);
        r.token = toks_out[k++];
        if (r.token == 257 || k == max) {
            break;
        }
        assert_int_equal(epd_engine_decode(e, &pool, &r, 1, logits), EPD_OK);
    }
    epd_sample_scratch_destroy(scratch);
    epd_free(pool.base);
    epd_engine_close(e);
    return k;
}

static void tokens_text(const int32_t *t, size_t n, char *buf, size_t cap)
{
    size_t len = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? " " : "", t[i]);
    }
    snprintf(buf + len, cap - len, "\n");
}

static void test_matches_api_generation(void **state)
{
    epd_sample_params_t sp = {.temperature = 0.0f, .top_p = 1.0f};
    int32_t t[40];
    char want[1024];
    size_t n;

    (void)state;
    n = api_generate("Hello there", &sp, t, 40);
    tokens_text(t, n, want, sizeof(want));
    assert_int_equal(run("--prompt 'Hello there' --max-tokens 40 --tokens"), 0);
    assert_string_equal(out, want);
    sp = (epd_sample_params_t){.temperature = 0.8f, .top_p = 0.9f, .top_k = 40, .seed = 11};
    n = api_generate("Hello there", &sp, t, 40);
    tokens_text(t, n, want, sizeof(want));
    assert_int_equal(run("--prompt 'Hello there' --max-tokens 40 --tokens --temperature 0.8 "
                         "--top-p 0.9 --top-k 40 --seed 11 --block-tokens 3"),
                     0);
    assert_string_equal(out, want);
}

static void test_text_is_utf8_and_seeded(void **state)
{
    char first[65536];
    char fixed[3 * 65536];
    size_t len;

    (void)state;
    assert_int_equal(run("--prompt 'Once upon' --max-tokens 40 --temperature 1 --seed 3"), 0);
    assert_true(strlen(out) > 0 && out[strlen(out) - 1] == '\n');
    assert_int_equal(epd_utf8_repair(out, strlen(out), fixed, sizeof(fixed), &len), EPD_OK);
    assert_int_equal(len, strlen(out));
    assert_memory_equal(fixed, out, len);
    strcpy(first, out);
    assert_int_equal(run("--prompt 'Once upon' --max-tokens 40 --temperature 1 --seed 3"), 0);
    assert_string_equal(out, first);
    assert_int_equal(run("--prompt 'Once upon' --max-tokens 40 --temperature 1 --seed 4"), 0);
    assert_string_not_equal(out, first);
}

static void expect_failure(const char *args, const char *phrase)
{
    int rc = run(args);

    if (rc != 1 || strstr(err, phrase) == NULL) {
        print_message("args: %s\nexit %d, stderr:\n%s", args, rc, err);
    }
    assert_int_equal(rc, 1);
    assert_non_null(strstr(err, phrase));
    assert_string_equal(out, "");
}

static void test_bad_input(void **state)
{
    char long_prompt[200];
    char args[400];
    const char *saved = model;

    (void)state;
    expect_failure("--prompt '' --max-tokens 5", "--prompt must not be empty");
    expect_failure("--prompt hi --max-tokens 0", "max-tokens");
    expect_failure("--prompt hi --max-tokens 100000", "context limit");
    expect_failure("--prompt hi --max-tokens -3", "max-tokens");
    expect_failure("--prompt hi --max-tokens 5 --top-p 0", "top-p");
    expect_failure("--prompt hi --max-tokens 5 --temperature -1", "temperature");
    expect_failure("--prompt hi --max-tokens 5 --bogus 1", "bogus");
    memset(long_prompt, 'x', 100); /* the model's context is 64 tokens */
    long_prompt[100] = '\0';
    snprintf(args, sizeof(args), "--prompt %s --max-tokens 5", long_prompt);
    expect_failure(args, "longer than the context limit");
    model = epd_test_path(tmpdir, "no-such-model");
    expect_failure("--prompt hi --max-tokens 5", "cannot open model");
    model = saved;
}

static void test_stops_at_context(void **state)
{
    (void)state;
    /* 1 + 50 prompt tokens in a 64-token context: at most 14 generated */
    assert_int_equal(
        run("--prompt 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' --max-tokens 60 "
            "--tokens --temperature 1 --seed 1"),
        0);
    {
        int count = 0;

        for (char *p = strtok(out, " \n"); p != NULL; p = strtok(NULL, " \n")) {
            count++;
        }
        assert_true(count >= 1 && count <= 14);
    }
}

static int setup(void **state)
{
    epd_mkmodel_params_t p;

    (void)state;
    tmpdir = epd_test_tmpdir();
    epd_test_tiny_params(&p);
    p.hp.max_context = 64;
    model = epd_test_write_model(tmpdir, "model", &p);
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
        cmocka_unit_test(test_matches_api_generation),
        cmocka_unit_test(test_text_is_utf8_and_seeded),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_stops_at_context),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
