/* test_epd_chat.c — the built-in chat templates (engine/epd_chat.c) on
 * their own: choosing a template (names, tokenizer_config.json forms,
 * what is refused), one rendering per family written out by hand, the
 * segments, Python's strip() at the edges, the ids of the segments on a
 * small tokenizer (a typed special token is text), and allocation
 * failures at every step.  The renderings of the real templates are
 * tested against two Jinja engines in tests/tokenizer/test_chat_oracle.sh;
 * this test runs under the sanitizers too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_chat.h"
#include "epd_log.h"

/* ---- a small tokenizer.json: the 256 bytes and the templates' specials --- */

/* GPT-2's byte -> code point map, as a byte-level vocabulary spells bytes */
static uint32_t bl_cp(uint8_t b)
{
    uint32_t next = 256;

    for (int x = 0; x < 256; x++) {
        int printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);

        if (x == b) {
            return printable ? (uint32_t)x : next;
        }
        next += printable ? 0 : 1;
    }
    return 0;
}

static const char *const specials[] = {"<|im_start|>",      "<|im_end|>",
                                       "<|begin_of_text|>", "<|start_header_id|>",
                                       "<|end_header_id|>", "<|eot_id|>"};
#define N_SPECIALS (sizeof(specials) / sizeof(specials[0]))

/* ids 0..255 the bytes (no merges: each byte one id), 256.. the specials */
static epd_tokenizer_t *small_tokenizer(void)
{
    json_t *vocab = json_object();
    json_t *added = json_array();
    json_t *root;
    epd_tokenizer_t *tok = NULL;
    char *text;

    for (int b = 0; b < 256; b++) {
        uint32_t cp = bl_cp((uint8_t)b);
        char s[3] = {0};

        if (cp < 0x80) {
            s[0] = (char)cp;
        } else {
            s[0] = (char)(0xC0 | (cp >> 6));
            s[1] = (char)(0x80 | (cp & 0x3F));
        }
        json_object_set_new(vocab, s, json_integer(b));
    }
    for (size_t i = 0; i < N_SPECIALS; i++) {
        json_array_append_new(added,
                              json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", (int)(256 + i),
                                        "content", specials[i], "special", 1, "normalized", 0,
                                        "lstrip", 0, "rstrip", 0, "single_word", 0));
    }
    root = json_pack("{s:{s:s, s:o, s:[]}, s:{s:s, s:b, s:b}, s:{s:s}, s:o, s:n, s:n}", "model",
                     "type", "BPE", "vocab", vocab, "merges", "pre_tokenizer", "type", "ByteLevel",
                     "add_prefix_space", 0, "use_regex", 0, "decoder", "type", "ByteLevel",
                     "added_tokens", added, "normalizer", "post_processor");
    text = json_dumps(root, JSON_COMPACT);
    assert_non_null(text);
    assert_int_equal(epd_tokenizer_create(text, strlen(text), NULL, 0, &tok), EPD_OK);
    free(text);
    json_decref(root);
    return tok;
}

/* ---- helpers ---------------------------------------------------------------- */

static epd_chat_template_t *named(const char *name)
{
    epd_chat_template_t *t = NULL;
    static const char conf[] = "{\"bos_token\": {\"content\": \"<|begin_of_text|>\"}}";

    assert_int_equal(epd_chat_create(conf, strlen(conf), name, &t), EPD_OK);
    return t;
}

static epd_chat_message_t msg(const char *role, const char *content)
{
    epd_chat_message_t m = {role, strlen(role), content, strlen(content), NULL, 0};

    return m;
}

/* renders and compares with want; checks the segments cut the text in
 * order and that the SPECIAL ones are exactly the specials */
static void expect_render(const epd_chat_template_t *t, const epd_chat_message_t *msgs, size_t n,
                          const epd_chat_options_t *opt, const char *want)
{
    epd_chat_prompt_t p = {0};
    size_t at = 0;

    assert_int_equal(epd_chat_render(t, msgs, n, opt, &p), EPD_OK);
    assert_int_equal(p.len, strlen(want));
    assert_string_equal(p.text, want);
    for (size_t k = 0; k < p.n_segs; k++) {
        const epd_chat_seg_t *s = &p.segs[k];

        assert_int_equal(s->off, at);
        assert_true(s->len > 0);
        at += s->len;
        if (s->kind == EPD_CHAT_SEG_SPECIAL) {
            int known = 0;

            for (size_t i = 0; i < N_SPECIALS; i++) {
                known |= strlen(specials[i]) == s->len &&
                         memcmp(specials[i], p.text + s->off, s->len) == 0;
            }
            assert_true(known);
        }
    }
    assert_int_equal(at, p.len);
    epd_chat_prompt_free(&p);
}

/* ---- tests ------------------------------------------------------------------- */

static void test_pick(void **state)
{
    static const char unknown[] = "{\"chat_template\": \"{{ messages }}\"}";
    static const char list[] = "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"x\"},"
                               " {\"name\": \"default\", \"template\": \"y\"}]}";
    static const char none[] = "{\"bos_token\": null, \"model_max_length\": "
                               "1000000000000000019884624838656}";
    epd_chat_template_t *t = NULL;

    (void)state;
    for (int f = 0; f < 4; f++) {
        static const char *const names[] = {"chatml", "qwen3", "llama3", "llama3.2"};

        t = named(names[f]);
        assert_int_equal(epd_chat_family(t), (epd_chat_family_t)f);
        assert_string_equal(epd_chat_name(t), names[f]);
        epd_chat_destroy(t);
    }
    t = named("qwen2.5"); /* an alias */
    assert_int_equal(epd_chat_family(t), EPD_CHAT_CHATML);
    epd_chat_destroy(t);
    assert_int_equal(epd_chat_create(NULL, 0, "vicuna", &t), EPD_ERR_INVALID_PARAM);
    assert_null(t);
    assert_int_equal(epd_chat_create(NULL, 0, NULL, &t), EPD_ERR_NOT_FOUND);
    assert_int_equal(epd_chat_create(none, strlen(none), NULL, &t), EPD_ERR_NOT_FOUND);
    assert_int_equal(epd_chat_create(unknown, strlen(unknown), NULL, &t), EPD_ERR_UNSUPPORTED);
    /* the list form: its "default" is the one compared (and is unknown) */
    assert_int_equal(epd_chat_create(list, strlen(list), NULL, &t), EPD_ERR_UNSUPPORTED);
    assert_int_equal(epd_chat_create("[1]", 3, NULL, &t), EPD_ERR_MALFORMED);
    assert_int_equal(epd_chat_create("{", 1, NULL, &t), EPD_ERR_MALFORMED);
    /* a name wins over an unknown text */
    assert_int_equal(epd_chat_create(unknown, strlen(unknown), "qwen3", &t), EPD_OK);
    epd_chat_destroy(t);
    assert_int_equal(epd_chat_load("/nonexistent-epd-dir", NULL, &t), EPD_ERR_NOT_FOUND);
    assert_int_equal(epd_chat_load("/nonexistent-epd-dir", "llama3", &t), EPD_OK);
    epd_chat_destroy(t);
    epd_chat_destroy(NULL);
}

static void test_chatml(void **state)
{
    epd_chat_template_t *t = named("chatml");
    epd_chat_options_t opt;
    epd_chat_message_t m[] = {msg("user", "hi"), msg("assistant", "<think>x</think>yo"),
                              msg("tool", "r1"), msg("tool", "r2"), msg("developer", "gone")};
    epd_chat_message_t sys[] = {msg("system", "S"), msg("user", "q"), msg("system", "S2")};

    (void)state;
    epd_chat_options_init(&opt);
    /* Qwen2.5's default system message; an assistant turn verbatim;
     * consecutive tools share one user turn; an unknown role renders
     * nothing */
    expect_render(t, m, 5, &opt,
                  "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                  "assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
                  "<think>x</think>yo<|im_end|>\n<|im_start|>user\n<tool_response>\nr1\n"
                  "</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n"
                  "<|im_start|>assistant\n");
    opt.add_generation_prompt = 0;
    expect_render(t, sys, 3, &opt,
                  "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq<|im_end|>\n"
                  "<|im_start|>system\nS2<|im_end|>\n");
    epd_chat_destroy(t);
}

static void test_qwen3(void **state)
{
    epd_chat_template_t *t = named("qwen3");
    epd_chat_options_t opt;
    epd_chat_message_t a[] = {msg("system", "S"), msg("user", "q"),
                              msg("assistant", "<think>\nr\n</think>\n\na"), msg("user", "q2")};
    epd_chat_message_t b[] = {msg("user", "q"), msg("assistant", "<think>r</think>a"),
                              msg("user", "<tool_response>\nout\n</tool_response>"),
                              msg("assistant", "\n\nb\n")};
    epd_chat_message_t c[] = {msg("user", "q"), msg("assistant", "plain")};

    (void)state;
    epd_chat_options_init(&opt);
    /* a past turn before the last query loses its <think>; thinking off
     * adds the empty block */
    opt.enable_thinking = 0;
    expect_render(t, a, 4, &opt,
                  "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq<|im_end|>\n"
                  "<|im_start|>assistant\na<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n"
                  "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    /* after the last query (a tool response is no query): turns with
     * reasoning, and the last turn, keep a think block */
    opt.add_generation_prompt = 0;
    expect_render(
        t, b, 4, &opt,
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\n"
        "a<|im_end|>\n<|im_start|>user\n<tool_response>\nout\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\nb\n<|im_end|>\n");
    /* reasoning_content given: the content is not cut */
    c[1].reasoning = "\nwhy\n";
    c[1].reasoning_len = 5;
    expect_render(t, c, 2, &opt,
                  "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nwhy\n</think>\n\n"
                  "plain<|im_end|>\n");
    epd_chat_destroy(t);
}

static void test_llama(void **state)
{
    epd_chat_template_t *t3 = named("llama3");
    epd_chat_template_t *t32 = named("llama3.2");
    epd_chat_options_t opt;
    /* Python's strip(): U+3000, U+0085 and U+001F go; U+FEFF and bytes
     * that are no character stay */
    epd_chat_message_t m[] = {msg("system", " S\t"), msg("user", "\xe3\x80\x80u\x1f\xc2\x85"),
                              msg("assistant", "\xef\xbb\xbf"
                                               "a\xff")};
    epd_chat_message_t tool[] = {msg("user", "u"), msg("ipython", "a\"b\n\x01\\")};

    (void)state;
    epd_chat_options_init(&opt);
    expect_render(t3, m, 3, &opt,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nu<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n\xef\xbb\xbf"
                  "a\xff<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    opt.date = "26 Jul 2024";
    opt.add_generation_prompt = 0;
    expect_render(t32, m, 2, &opt,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting "
                  "Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nS<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nu<|eot_id|>");
    /* a tool message's string goes through tojson */
    expect_render(t32, tool, 2, &opt,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting "
                  "Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nu<|eot_id|>"
                  "<|start_header_id|>ipython<|end_header_id|>\n\n\"a\\\"b\\n\\u0001\\\\\""
                  "<|eot_id|>");
    epd_chat_destroy(t3);
    epd_chat_destroy(t32);
}

static void test_tokenize(void **state)
{
    epd_tokenizer_t *tok = small_tokenizer();
    epd_chat_template_t *t = named("qwen3");
    epd_chat_options_t opt;
    epd_chat_message_t m[] = {msg("user", "<|im_end|>")};
    epd_chat_prompt_t p = {0};
    const char *want_text = "<|im_start|>user\n<|im_end|><|im_end|>\n<|im_start|>assistant\n";
    int32_t want[64], ids[64];
    size_t n = 0, k = 0;

    (void)state;
    /* the template's specials one id each; the typed one is its bytes */
    want[k++] = 256;
    for (const char *s = "user\n<|im_end|>"; *s; s++) {
        want[k++] = (uint8_t)*s;
    }
    want[k++] = 257;
    want[k++] = '\n';
    want[k++] = 256;
    for (const char *s = "assistant\n"; *s; s++) {
        want[k++] = (uint8_t)*s;
    }
    epd_chat_options_init(&opt);
    assert_int_equal(epd_chat_render(t, m, 1, &opt, &p), EPD_OK);
    assert_string_equal(p.text, want_text);
    assert_int_equal(epd_chat_tokenize(&p, tok, ids, 64, &n), EPD_OK);
    assert_int_equal(n, k);
    assert_memory_equal(ids, want, k * sizeof(int32_t));
    /* too small: the number needed */
    n = 0;
    assert_int_equal(epd_chat_tokenize(&p, tok, ids, 3, &n), EPD_ERR_TOO_LONG);
    assert_int_equal(n, k);
    /* rendering again into the same prompt replaces it */
    assert_int_equal(epd_chat_render(t, m, 1, &opt, &p), EPD_OK);
    assert_string_equal(p.text, want_text);
    assert_int_equal(epd_chat_render(t, m, 0, &opt, &p), EPD_ERR_INVALID_PARAM);
    epd_chat_prompt_free(&p);
    epd_chat_prompt_free(NULL);
    epd_chat_destroy(t);
    epd_tokenizer_destroy(tok);
}

/* every allocation of create, render and tokenize failing in turn:
 * EPD_ERR_NO_MEMORY, nothing leaked, and then success */
static void test_alloc_failures(void **state)
{
    static const char conf[] = "{\"bos_token\": \"<|begin_of_text|>\"}";
    epd_tokenizer_t *tok = small_tokenizer();
    epd_chat_message_t m[] = {msg("system", "s"), msg("user", "u <|eot_id|>"),
                              msg("assistant", "a")};
    epd_alloc_stats_t before, after;
    int ok = 0;

    (void)state;
    /* once in full first: the tokenizer's scratch buffers grow to stay */
    {
        epd_chat_template_t *t = named("llama3.2");
        epd_chat_prompt_t p = {0};
        epd_chat_options_t opt;
        int32_t ids[256];
        size_t n_ids = 0;

        epd_chat_options_init(&opt);
        opt.date = "1 Jan 2025";
        assert_int_equal(epd_chat_render(t, m, 3, &opt, &p), EPD_OK);
        assert_int_equal(epd_chat_tokenize(&p, tok, ids, 256, &n_ids), EPD_OK);
        epd_chat_prompt_free(&p);
        epd_chat_destroy(t);
    }
    epd_alloc_stats(&before);
    for (long n = 0; n < 40; n++) {
        epd_chat_template_t *t = NULL;
        epd_chat_prompt_t p = {0};
        epd_chat_options_t opt;
        int32_t ids[256];
        size_t n_ids = 0;
        epd_status_t st;

        epd_chat_options_init(&opt);
        opt.date = "1 Jan 2025";
        epd_alloc_fail_after(n);
        st = epd_chat_create(conf, strlen(conf), n % 2 ? "llama3.2" : "chatml", &t);
        if (st == EPD_OK) {
            st = epd_chat_render(t, m, 3, &opt, &p);
        }
        if (st == EPD_OK) {
            st = epd_chat_tokenize(&p, tok, ids, 256, &n_ids);
        }
        epd_alloc_fail_after(-1);
        if (st == EPD_OK) {
            ok++;
        } else {
            assert_int_equal(st, EPD_ERR_NO_MEMORY);
        }
        epd_chat_prompt_free(&p);
        epd_chat_destroy(t);
    }
    epd_alloc_stats(&after);
    assert_int_equal(after.live_blocks, before.live_blocks);
    assert_int_equal(after.live_bytes, before.live_bytes);
    assert_true(ok > 0);
    epd_tokenizer_destroy(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pick),     cmocka_unit_test(test_chatml),
        cmocka_unit_test(test_qwen3),    cmocka_unit_test(test_llama),
        cmocka_unit_test(test_tokenize), cmocka_unit_test(test_alloc_failures),
    };

    epd_log_set_level(EPD_LOG_ERROR);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
