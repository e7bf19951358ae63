/*
 * test_epd_generate.c — the epd-generate program (the colocated baseline):
 * its --tokens output equals a generation driven through the engine API in
 * this process, text output is valid UTF-8, seeds reproduce, and bad input
 * (missing model, empty prompt, max tokens 0 or beyond the context, prompt
 * longer than the context, bad sampling values) exits 1 with a clear error
 * and no crash.  --image: reproducible, different images give different
 * output, the output equals a chunked prefill of the same prompt through the
 * API (the image's span straddling the chunk boundary), and each bad image
 * argument (missing file, not an image, too large, too many, a text-only
 * model, markers that do not match) exits 1 with one clear line.
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
#include "epd_image.h"
#include "epd_sample.h"
#include "epd_test_engine_util.h"
#include "epd_utf8.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#define STBI_WRITE_NO_STDIO
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop

#ifndef EPD_TEST_BIN_DIR
#error "EPD_TEST_BIN_DIR must be defined by the build"
#endif

static const char *tmpdir;
static const char *model;
static const char *text_model;
static const char *vision_model;
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

/* ---- --image ----------------------------------------------------------------- */

typedef struct {
    unsigned char *data;
    size_t len;
} file_buf_t;

static void file_buf_cb(void *ctx, void *data, int size)
{
    file_buf_t *b = ctx;

    b->data = realloc(b->data, b->len + (size_t)size);
    assert_non_null(b->data);
    memcpy(b->data + b->len, data, (size_t)size);
    b->len += (size_t)size;
}

/* Writes a w x h picture (varied by seed) as PNG (jpeg 0) or JPEG into
 * tmpdir/name; returns the path (static storage, valid for 16 calls). */
static const char *write_image(const char *name, int w, int h, int seed, int jpeg)
{
    static char paths[16][1024];
    static int next;
    char *path = paths[next++ % 16];
    unsigned char *px = malloc((size_t)w * h * 3);
    file_buf_t b = {0};

    assert_non_null(px);
    for (int i = 0; i < w * h * 3; i++) {
        px[i] = (unsigned char)((i / 3 % w) * (5 + seed) + (i / 3 / w) * 3 + (i % 3) * 70 +
                                seed * 40);
    }
    if (jpeg) {
        assert_true(stbi_write_jpg_to_func(file_buf_cb, &b, w, h, 3, px, 90) != 0);
    } else {
        assert_true(stbi_write_png_to_func(file_buf_cb, &b, w, h, 3, px, w * 3) != 0);
    }
    snprintf(path, sizeof(paths[0]), "%s/%s", tmpdir, name);
    epd_test_write_file(path, b.data, b.len);
    free(b.data);
    free(px);
    return path;
}

/* As epd-generate --image FILE --prompt TEXT --tokens (greedy), through the
 * API, prefilling in two chunks cut at `cut` (inside the image's span). */
static size_t api_generate_image(const char *path, const char *text, uint32_t cut,
                                 int32_t *toks_out, size_t max)
{
    epd_engine_config_t cfg = {.model_dir = vision_model};
    epd_sample_params_t sp;
    epd_sample_scratch_t *scratch;
    epd_engine_t *e;
    const epd_engine_info_t *info;
    epd_kv_pool_t pool;
    epd_image_t img;
    epd_image_view_t view;
    uint32_t table[64];
    int32_t toks[256];
    uint32_t pos;
    float *rows;
    float *logits;
    unsigned char *data;
    size_t len;
    size_t n;
    size_t k = 0;
    epd_embed_span_t span;
    epd_prefill_args_t a;

    assert_int_equal(epd_engine_open("ref", &cfg, &e), EPD_OK);
    info = epd_engine_info(e);
    data = epd_test_read_file(path, &len);
    assert_int_equal(epd_image_decode(data, len, 0, &img), EPD_OK);
    rows = epd_calloc((size_t)info->image_embeddings * info->embed_dim, sizeof(float));
    logits = epd_calloc(info->vocab_size, sizeof(float));
    assert_true(rows != NULL && logits != NULL);
    view = epd_image_view(&img);
    assert_int_equal(epd_engine_encode_image(e, &view, rows), EPD_OK);
    assert_int_equal(
        epd_engine_tokenize_images(e, text, strlen(text), 1, toks, 256, &n, &pos), EPD_OK);
    assert_true(cut > pos && cut < pos + info->image_embeddings); /* straddles */
    for (uint32_t i = 0; i < 64; i++) {
        table[i] = (i * 5) % 64;
    }
    epd_test_pool(e, 64, 1, &pool);
    assert_int_equal(epd_sample_scratch_create(info->vocab_size, &scratch), EPD_OK);
    /* chunk 1: [0, cut), the span cut at its end */
    span = (epd_embed_span_t){.pos = pos, .n = cut - pos, .data = rows};
    a = (epd_prefill_args_t){.seq = {.block_table = table, .n_blocks = 64},
                             .tokens = toks,
                             .n_tokens = cut,
                             .embeds = &span,
                             .n_embeds = 1};
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_OK);
    /* chunk 2: [cut, n), the whole span */
    span.n = info->image_embeddings;
    a.tokens = toks + cut;
    a.n_tokens = (uint32_t)n - cut;
    a.start = cut;
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_OK);
    epd_sample_params_default(&sp);
    for (;;) {
        epd_decode_req_t r = {.seq = a.seq, .pos = (uint32_t)(n + k)};

        assert_int_equal(
            epd_sample_token(&sp, scratch, logits, info->vocab_size, k, &toks_out[k]), EPD_OK);
        r.token = toks_out[k++];
        if (r.token == info->eos_token || k == max) {
            break;
        }
        assert_int_equal(epd_engine_decode(e, &pool, &r, 1, logits), EPD_OK);
    }
    epd_sample_scratch_destroy(scratch);
    epd_free(pool.base);
    epd_free(logits);
    epd_free(rows);
    epd_free(data);
    epd_image_cleanup(&img);
    epd_engine_close(e);
    return k;
}

static void test_image_reproducible_and_matches_api(void **state)
{
    const char *a = write_image("a.png", 40, 30, 1, 0);
    char args[2048];
    char first[65536];
    char want[1024];
    int32_t t[24];
    size_t n;

    (void)state;
    model = vision_model;
    /* BOS l o o k : ' ' [4 placeholders at 7..10] ' ' o k: cut at 9 */
    n = api_generate_image(a, "look: " EPD_IMAGE_MARKER " ok", 9, t, 24);
    tokens_text(t, n, want, sizeof(want));
    snprintf(args, sizeof(args), "--prompt 'look: <|image|> ok' --image %s --max-tokens 24 --tokens",
             a);
    assert_int_equal(run(args), 0);
    assert_string_equal(out, want);
    strcpy(first, out);
    assert_int_equal(run(args), 0); /* reproducible */
    assert_string_equal(out, first);
    model = text_model;
}

static void test_images_differ(void **state)
{
    const char *paths[3];
    char outs[3][65536];
    char args[4096];

    (void)state;
    model = vision_model;
    paths[0] = write_image("d1.png", 40, 30, 2, 0);
    paths[1] = write_image("d2.png", 40, 30, 7, 0);
    paths[2] = write_image("d3.jpg", 70, 50, 3, 1);
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof(args), "--prompt 'What is it?' --image %s --max-tokens 24 --tokens",
                 paths[i]);
        assert_int_equal(run(args), 0);
        strcpy(outs[i], out);
    }
    assert_string_not_equal(outs[0], outs[1]);
    assert_string_not_equal(outs[0], outs[2]);
    /* two images, markers in the prompt, and the same two in the other order */
    snprintf(args, sizeof(args),
             "--prompt 'A <|image|> and B <|image|>' --image %s,%s --max-tokens 24 --tokens",
             paths[0], paths[2]);
    assert_int_equal(run(args), 0);
    strcpy(outs[0], out);
    snprintf(args, sizeof(args),
             "--prompt 'A <|image|> and B <|image|>' --image %s,%s --max-tokens 24 --tokens",
             paths[2], paths[0]);
    assert_int_equal(run(args), 0);
    assert_string_not_equal(out, outs[0]);
    /* text output and timing */
    snprintf(args, sizeof(args), "--prompt 'Hi' --image %s --max-tokens 8 --timing", paths[1]);
    assert_int_equal(run(args), 0);
    assert_non_null(strstr(err, "1 images encoded"));
    model = text_model;
}

static void test_image_errors(void **state)
{
    const char *good;
    char args[8192];
    char list[4096];
    size_t len = 0;
    static const unsigned char huge[] = {
        0x89, 'P',  'N',  'G',  0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 'I',
        'H',  'D',  'R',  0x00, 0x00, 0x13, 0x88, 0x00, 0x00, 0x13, 0x88, 0x08, 0x02,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* 5000 x 5000 RGB, no CRC check */
    };

    (void)state;
    model = vision_model;
    good = write_image("good.png", 16, 16, 1, 0);
    len += (size_t)snprintf(list + len, sizeof(list) - len, "%s", good);
    for (int i = 0; i < 8; i++) {
        len += (size_t)snprintf(list + len, sizeof(list) - len, ",%s", good);
    }
    snprintf(args, sizeof(args), "--prompt hi --max-tokens 4 --image %s", list);
    expect_failure(args, "at most 8 images");
    expect_failure("--prompt hi --max-tokens 4 --image /no/such/file.png", "cannot read image");
    epd_test_write_file(epd_test_path(tmpdir, "notes.txt"), "just some text\n", 15);
    snprintf(args, sizeof(args), "--prompt hi --max-tokens 4 --image %s",
             epd_test_path(tmpdir, "notes.txt"));
    expect_failure(args, "is not a PNG or JPEG image");
    epd_test_write_file(epd_test_path(tmpdir, "huge.png"), huge, sizeof(huge));
    snprintf(args, sizeof(args), "--prompt hi --max-tokens 4 --image %s",
             epd_test_path(tmpdir, "huge.png"));
    expect_failure(args, "is too large: 5000 x 5000 pixels");
    {
        unsigned char *data = epd_test_read_file(good, &len);

        epd_test_write_file(epd_test_path(tmpdir, "cut.png"), data, len / 2);
        epd_free(data);
    }
    snprintf(args, sizeof(args), "--prompt hi --max-tokens 4 --image %s",
             epd_test_path(tmpdir, "cut.png"));
    expect_failure(args, "corrupt or truncated");
    /* fuzz_epd_image's JPEG without quantization tables: with stb_image
     * the same greedy request gave 4 different answers in 6 runs (it
     * decoded with whatever the heap held); now the same refusal each time */
    snprintf(args, sizeof(args), "--prompt hi --max-tokens 4 --tokens --image %s",
             EPD_TEST_FUZZ_CORPUS "/fuzz_epd_image/noquant-uninit.jpg");
    for (int i = 0; i < 6; i++) {
        static char first[sizeof(err)];
        const char *why;

        expect_failure(args, "corrupt or truncated");
        why = strstr(err, "epd-generate: "); /* after the timestamped log line */
        assert_non_null(why);
        if (i == 0) {
            snprintf(first, sizeof(first), "%s", why);
        } else {
            assert_string_equal(why, first);
        }
    }
    snprintf(args, sizeof(args), "--prompt 'one <|image|> two <|image|>' --max-tokens 4 --image %s",
             good);
    expect_failure(args, "markers do not match");
    snprintf(args, sizeof(args), "--prompt hi --max-tokens 4 --image %s,", good);
    expect_failure(args, "empty");
    model = text_model;
    snprintf(args, sizeof(args), "--prompt hi --max-tokens 4 --image %s", good);
    expect_failure(args, "no vision encoder");
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
    text_model = model = epd_test_write_model(tmpdir, "model", &p);
    epd_test_tiny_vision_params(&p);
    p.hp.max_context = 128;
    vision_model = epd_test_write_model(tmpdir, "vision", &p);
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
        cmocka_unit_test(test_image_reproducible_and_matches_api),
        cmocka_unit_test(test_images_differ),
        cmocka_unit_test(test_image_errors),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}

/* gcc checks for static functions declared but never defined (the HDR
 * writer, compiled out) at the end of the file. */
#pragma GCC diagnostic ignored "-Wunused-function"
