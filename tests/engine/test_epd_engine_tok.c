/* test_epd_engine_tok.c — a model folder's tokenizer.json through the
 * engine layer (epd_engine_open / epd_engine_tokenize / _detokenize /
 * _tokenize_images / epd_engine_tokenizer): a `ref` folder with one gets
 * the BPE ids (the post-processor for add_bos), without one the byte
 * tokenizer stays; special tokens and ids the tokenizer does not name
 * decode to nothing; a tokenizer with more ids than the model's
 * vocabulary is refused at open. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "epd_alloc.h"

#include "epd_engine.h"
#include "epd_test_engine_util.h"
#include "epd_tokenizer.h"

/* GPT-2's byte -> code point map, as UTF-8 into out (NUL-terminated) */
static void bl_char(uint8_t b, char out[4])
{
    uint32_t next = 256;
    uint32_t cp = 0;

    for (int x = 0; x < 256; x++) {
        int printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);

        if (x == b) {
            cp = printable ? (uint32_t)x : next;
            break;
        }
        next += printable ? 0 : 1;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = '\0';
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = '\0';
    }
}

/* A tokenizer.json: ids 0..255 the bytes, 256 "ab" (merge a b), 300 <s>
 * and 301 </s> (special), the post-processor puts <s> first.  Written into
 * dir. */
static void write_tokenizer(const char *dir)
{
    char *json = malloc(65536);
    size_t n = 0;

    assert_non_null(json);
    n += (size_t)sprintf(json + n, "{\"model\":{\"type\":\"BPE\",\"vocab\":{");
    for (int b = 0; b < 256; b++) {
        char c[4];

        bl_char((uint8_t)b, c);
        if (c[0] == '"' || c[0] == '\\') {
            n += (size_t)sprintf(json + n, "\"\\%s\":%d,", c, b);
        } else {
            n += (size_t)sprintf(json + n, "\"%s\":%d,", c, b);
        }
    }
    n += (size_t)sprintf(
        json + n,
        "\"ab\":256},\"merges\":[\"a b\"]},"
        "\"normalizer\":null,"
        "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false},"
        "\"decoder\":{\"type\":\"ByteLevel\"},"
        "\"added_tokens\":["
        "{\"id\":300,\"content\":\"<s>\",\"special\":true,\"normalized\":false,\"lstrip\":false,"
        "\"rstrip\":false,\"single_word\":false},"
        "{\"id\":301,\"content\":\"</s>\",\"special\":true,\"normalized\":false,\"lstrip\":false,"
        "\"rstrip\":false,\"single_word\":false}],"
        "\"post_processor\":{\"type\":\"TemplateProcessing\","
        "\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
        "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
        "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[300],\"tokens\":[\"<s>\"]}}}}");
    epd_test_write_file(epd_test_path(dir, "tokenizer.json"), json, n);
    free(json);
}

/* the scratch folder of the running test (epd_test_tmpdir makes a new one
 * at each call) */
static const char *tmp_root;

static const char *model_with_tokenizer(const char *name, uint32_t vocab, int vision)
{
    const char *root = tmp_root = epd_test_tmpdir();
    epd_mkmodel_params_t p;
    const char *dir;

    if (vision) {
        epd_test_tiny_vision_params(&p);
    } else {
        epd_test_tiny_params(&p);
    }
    p.hp.vocab = vocab;
    if (vision) {
        p.hp.image_token = (int32_t)vocab - 1;
    }
    dir = epd_test_write_model(root, name, &p);
    write_tokenizer(dir);
    return dir;
}

static epd_status_t open_dir(const char *dir, epd_engine_t **e_p)
{
    epd_engine_config_t cfg = {.model_dir = dir, .max_batch = 2};

    return epd_engine_open("ref", &cfg, e_p);
}

static void test_bpe_ids_and_bytes(void **state)
{
    const char *dir = model_with_tokenizer("tok", 320, 0);
    epd_engine_t *e = NULL;
    int32_t ids[16];
    char buf[32];
    size_t n = 0, len = 0;

    (void)state;
    assert_int_equal(open_dir(dir, &e), EPD_OK);
    assert_non_null(epd_engine_tokenizer(e));
    /* add_bos: the post-processor's <s>, then BPE: "ab" is one id */
    assert_int_equal(epd_engine_tokenize(e, "abc", 3, 1, ids, 16, &n), EPD_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 300);
    assert_int_equal(ids[1], 256);
    assert_int_equal(ids[2], 'c');
    assert_int_equal(epd_engine_tokenize(e, "abc", 3, 0, ids, 16, &n), EPD_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 256);
    /* a typed special token is one id */
    assert_int_equal(epd_engine_tokenize(e, "</s>", 4, 0, ids, 16, &n), EPD_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 301);
    /* too small: refused, *n_p untouched */
    n = 77;
    assert_int_equal(epd_engine_tokenize(e, "abc", 3, 1, ids, 2, &n), EPD_ERR_TOO_LONG);
    assert_int_equal(n, 77);
    /* specials and ids the tokenizer names no token for (302..319: rows
     * of the model's vocabulary past the tokenizer) give no bytes; a
     * character split across ids comes back byte for byte */
    {
        const int32_t out[] = {300, 256, 310, 0xC3, 0xA9, 301, 319};

        assert_int_equal(epd_engine_detokenize(e, out, 7, buf, sizeof(buf), &len), EPD_OK);
        assert_int_equal(len, 4);
        assert_memory_equal(buf, "ab\xC3\xA9", 4);
        assert_int_equal(epd_engine_detokenize(e, out, 7, buf, 3, &len), EPD_ERR_TOO_LONG);
    }
    {
        const int32_t bad = 320;

        assert_int_equal(epd_engine_detokenize(e, &bad, 1, buf, sizeof(buf), &len),
                         EPD_ERR_OUT_OF_RANGE);
    }
    epd_engine_close(e);
    epd_test_rmtree(tmp_root);
}

static void test_without_tokenizer_json(void **state)
{
    const char *root = epd_test_tmpdir();
    epd_mkmodel_params_t p;
    const char *dir;
    epd_engine_t *e = NULL;
    int32_t ids[8];
    size_t n = 0;

    (void)state;
    epd_test_tiny_params(&p);
    dir = epd_test_write_model(root, "bytes", &p);
    assert_int_equal(open_dir(dir, &e), EPD_OK);
    assert_null(epd_engine_tokenizer(e));
    assert_int_equal(epd_engine_tokenize(e, "ab", 2, 1, ids, 8, &n), EPD_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], epd_engine_info(e)->bos_token);
    assert_int_equal(ids[1], 'a');
    assert_int_equal(ids[2], 'b');
    epd_engine_close(e);
    epd_test_rmtree(root);
}

static void test_tokenizer_past_vocab_refused(void **state)
{
    /* the tokenizer names ids up to 301: a vocabulary of 301 has no row
     * for </s> */
    const char *dir = model_with_tokenizer("small", 301, 0);
    epd_engine_t *e = NULL;

    (void)state;
    assert_int_equal(open_dir(dir, &e), EPD_ERR_MALFORMED);
    assert_null(e);
    epd_test_rmtree(tmp_root);
}

static void test_broken_tokenizer_refused(void **state)
{
    const char *dir = model_with_tokenizer("broken", 320, 0);
    epd_engine_t *e = NULL;

    (void)state;
    epd_test_write_file(epd_test_path(dir, "tokenizer.json"), "{\"model\":", 9);
    assert_int_equal(open_dir(dir, &e), EPD_ERR_MALFORMED);
    assert_null(e);
    epd_test_rmtree(tmp_root);
}

static void test_images_use_the_tokenizer(void **state)
{
    const char *dir = model_with_tokenizer("vision", 320, 1);
    epd_engine_t *e = NULL;
    const char text[] = "ab" EPD_IMAGE_MARKER "abc";
    int32_t ids[32];
    uint32_t pos = 0;
    size_t n = 0;
    uint32_t per;

    (void)state;
    assert_int_equal(open_dir(dir, &e), EPD_OK);
    per = epd_engine_info(e)->image_embeddings;
    assert_true(per > 0 && per < 16);
    assert_int_equal(
        epd_engine_tokenize_images(e, text, sizeof(text) - 1, 1, ids, 32, &n, &pos), EPD_OK);
    /* <s> ab [image x per] ab c */
    assert_int_equal(n, 2 + per + 2);
    assert_int_equal(ids[0], 300);
    assert_int_equal(ids[1], 256);
    assert_int_equal(pos, 2);
    assert_int_equal(ids[2], 319);
    assert_int_equal(ids[2 + per], 256);
    assert_int_equal(ids[3 + per], 'c');
    epd_engine_close(e);
    epd_test_rmtree(tmp_root);
}

/* A Hugging Face folder of config files and tokenizer.json only, no
 * weight file at all: tokenizer_only opens it (nothing else could). */
static void test_tokenizer_only(void **state)
{
    const char *root = tmp_root = epd_test_tmpdir();
    const char cfg[] =
        "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", "
        "\"vocab_size\": 320, \"hidden_size\": 64, \"intermediate_size\": 128, "
        "\"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
        "\"head_dim\": 32, \"max_position_embeddings\": 4096, \"rope_theta\": 1000000.0, "
        "\"rms_norm_eps\": 1e-06, \"tie_word_embeddings\": false, \"bos_token_id\": 300, "
        "\"eos_token_id\": 301, \"torch_dtype\": \"bfloat16\"}";
    const char gen[] = "{\"eos_token_id\": [301, 300], \"temperature\": 0.6}";
    epd_engine_config_t c = {.model_dir = root, .max_context = 1000, .tokenizer_only = 1};
    const epd_engine_info_t *info;
    epd_engine_t *e = NULL;
    int32_t ids[8];
    size_t n = 0;
    float logits[320];
    epd_prefill_args_t args = {.tokens = ids, .n_tokens = 1};

    (void)state;
    epd_test_write_file(epd_test_path(root, "config.json"), cfg, sizeof(cfg) - 1);
    epd_test_write_file(epd_test_path(root, "generation_config.json"), gen, sizeof(gen) - 1);
    write_tokenizer(root);
    assert_int_equal(epd_engine_open("ref", &c, &e), EPD_OK);
    info = epd_engine_info(e);
    assert_int_equal(info->vocab_size, 320);
    assert_int_equal(info->max_context, 1000);
    assert_int_equal(info->n_eos, 2);
    assert_int_equal(info->eos_tokens[0], 301);
    assert_int_equal(info->eos_tokens[1], 300);
    assert_int_equal(info->kv.n_layers, 3);
    assert_int_equal(info->kv.n_attn_layers, 3);
    assert_int_equal(info->kv.n_kv_heads, 2);
    assert_int_equal(info->kv.head_dim, 32);
    assert_int_equal(info->kv.block_tokens, 16);
    assert_int_equal(info->image_embeddings, 0);
    assert_int_equal(info->image_token, -1);
    assert_non_null(epd_engine_tokenizer(e));
    assert_int_equal(epd_engine_tokenize(e, "ab", 2, 1, ids, 8, &n), EPD_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 300);
    assert_int_equal(ids[1], 256);
    /* no model behind it */
    assert_int_equal(epd_engine_prefill(e, NULL, &args, NULL, logits), EPD_ERR_UNSUPPORTED);
    epd_engine_close(e);
    /* in full, the missing weights are refused */
    c.tokenizer_only = 0;
    e = NULL;
    assert_int_not_equal(epd_engine_open("ref", &c, &e), EPD_OK);
    assert_null(e);
    /* without tokenizer.json, tokenizer_only opens in full too (the engine
     * would tokenize): refused the same way */
    unlink(epd_test_path(root, "tokenizer.json"));
    c.tokenizer_only = 1;
    assert_int_not_equal(epd_engine_open("ref", &c, &e), EPD_OK);
    epd_test_rmtree(root);
}

/* tokenizer_only on a folder that is not a Hugging Face one (epd-ref):
 * opened in full, prefill works */
static void test_tokenizer_only_ref_folder(void **state)
{
    const char *dir = model_with_tokenizer("reftok", 320, 0);
    epd_engine_config_t c = {.model_dir = dir, .max_batch = 2, .tokenizer_only = 1};
    epd_engine_t *e = NULL;

    (void)state;
    assert_int_equal(epd_engine_open("ref", &c, &e), EPD_OK);
    assert_int_equal(epd_engine_info(e)->kv.n_layers, 4);
    assert_non_null(epd_engine_tokenizer(e));
    {
        epd_kv_pool_t pool;
        uint32_t table[1] = {0};
        int32_t ids[2] = {300, 256};
        float *logits = calloc(320, sizeof(float));
        epd_prefill_args_t args = {
            .seq = {.block_table = table, .n_blocks = 1}, .tokens = ids, .n_tokens = 2};

        assert_non_null(logits);
        epd_test_pool(e, 1, 1, &pool);
        assert_int_equal(epd_engine_prefill(e, &pool, &args, NULL, logits), EPD_OK);
        epd_free(pool.base);
        free(logits);
    }
    epd_engine_close(e);
    epd_test_rmtree(tmp_root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bpe_ids_and_bytes),
        cmocka_unit_test(test_without_tokenizer_json),
        cmocka_unit_test(test_tokenizer_past_vocab_refused),
        cmocka_unit_test(test_broken_tokenizer_refused),
        cmocka_unit_test(test_images_use_the_tokenizer),
        cmocka_unit_test(test_tokenizer_only),
        cmocka_unit_test(test_tokenizer_only_ref_folder),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
