/* test_epd_tokenizer.c — the byte-level BPE tokenizer (engine/
 * epd_tokenizer*.c) on small tokenizer.json files made here: both merges
 * formats, merge order, ignore_merges, every Split behavior, added and
 * special tokens (leftmost-longest, as text, normalized ones, the
 * post-processor), NFC, bytes that are not UTF-8, the streaming decoder,
 * what is refused, and allocation failures at every step of a load.  The
 * real vocabularies are tested against Hugging Face's own code in
 * tests/tokenizer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_tokenizer.h"

/* ---- making tokenizer.json files --------------------------------------------- */

/* GPT-2's byte -> code point map (as engine/epd_tokenizer.c; written again
 * here so that a mistake there is not copied into the expectations) */
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

/* raw bytes -> byte-level string (static buffer) */
static const char *bl(const char *raw, size_t len)
{
    static char out[4][256];
    static int k;
    char *o = out[k = (k + 1) % 4];
    size_t n = 0;

    for (size_t i = 0; i < len; i++) {
        uint32_t cp = bl_cp((uint8_t)raw[i]);

        if (cp < 0x80) {
            o[n++] = (char)cp;
        } else {
            o[n++] = (char)(0xC0 | (cp >> 6));
            o[n++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    o[n] = '\0';
    return o;
}
#define BL(s) bl((s), strlen(s))

/* ids: 0..255 the bytes, then `extra` (raw byte strings) from 256 */
static json_t *mk_vocab(const char *const *extra, size_t n_extra)
{
    json_t *v = json_object();

    for (int b = 0; b < 256; b++) {
        char c = (char)b;

        json_object_set_new(v, bl(&c, 1), json_integer(b));
    }
    for (size_t i = 0; i < n_extra; i++) {
        json_object_set_new(v, BL(extra[i]), json_integer((json_int_t)(256 + i)));
    }
    return v;
}

/* merges as "a b" strings (pairs = 0) or ["a", "b"] (pairs = 1); each
 * merge given as two raw strings */
static json_t *mk_merges(const char *const (*m)[2], size_t n, int pairs)
{
    json_t *list = json_array();

    for (size_t i = 0; i < n; i++) {
        if (pairs) {
            json_array_append_new(list, json_pack("[ss]", BL(m[i][0]), BL(m[i][1])));
        } else {
            char buf[512];

            snprintf(buf, sizeof(buf), "%s %s", BL(m[i][0]), BL(m[i][1]));
            json_array_append_new(list, json_string(buf));
        }
    }
    return list;
}

static json_t *mk_root(json_t *vocab, json_t *merges, json_t *pre, json_t *added)
{
    return json_pack("{s:{s:s, s:o, s:o}, s:o, s:{s:s}, s:o, s:n, s:n}", "model", "type", "BPE",
                     "vocab", vocab, "merges", merges, "pre_tokenizer", pre, "decoder", "type",
                     "ByteLevel", "added_tokens", added != NULL ? added : json_array(),
                     "normalizer", "post_processor");
}

static json_t *bytelevel_pre(int use_regex)
{
    return json_pack("{s:s, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "use_regex",
                     use_regex);
}

static epd_status_t load(json_t *root, epd_tokenizer_t **tok_p)
{
    char *text = json_dumps(root, JSON_COMPACT);
    epd_status_t status;

    assert_non_null(text);
    status = epd_tokenizer_create(text, strlen(text), NULL, 0, tok_p);
    free(text);
    json_decref(root);
    return status;
}

/* encodes and compares with want[0..n) */
static void expect_ids(epd_tokenizer_t *tok, const char *text, size_t len, unsigned flags,
                       const int32_t *want, size_t n)
{
    int32_t ids[256];
    size_t got = 0;

    assert_int_equal(epd_tokenizer_encode(tok, text, len, flags, ids, 256, &got), EPD_OK);
    if (got != n) {
        fprintf(stderr, "'%.*s': %zu ids, want %zu:", (int)len, text, got, n);
        for (size_t i = 0; i < got; i++) {
            fprintf(stderr, " %d", ids[i]);
        }
        fprintf(stderr, "\n");
    }
    assert_int_equal(got, n);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] != want[i]) {
            fprintf(stderr, "'%.*s': id %zu is %d, want %d\n", (int)len, text, i, ids[i], want[i]);
        }
        assert_int_equal(ids[i], want[i]);
    }
}
#define EXPECT(tok, s, flags, ...)                                                                 \
    do {                                                                                           \
        const int32_t want_[] = {__VA_ARGS__};                                                     \
        expect_ids(tok, s, strlen(s), flags, want_, sizeof(want_) / sizeof(want_[0]));             \
    } while (0)

/* ---- merges ------------------------------------------------------------------------- */

static const char *const abc_vocab[] = {"ab", "bc", "abc", "cd"}; /* 256..259 */
static const char *const abc_merges[][2] = {{"b", "c"}, {"a", "b"}, {"a", "bc"}, {"c", "d"}};

static void test_merges_both_formats(void **state)
{
    (void)state;
    for (int pairs = 0; pairs < 2; pairs++) {
        epd_tokenizer_t *tok = NULL;

        assert_int_equal(load(mk_root(mk_vocab(abc_vocab, 4), mk_merges(abc_merges, 4, pairs),
                                      bytelevel_pre(0), NULL),
                              &tok),
                         EPD_OK);
        /* "bc" (rank 0) before "ab" (rank 1), then "a"+"bc" */
        EXPECT(tok, "abc", 0, 258);
        /* "abcd": bc first, then a+bc; "d" alone (cd never forms: c is taken) */
        EXPECT(tok, "abcd", 0, 258, 'd');
        EXPECT(tok, "cd", 0, 259);
        EXPECT(tok, "x", 0, 'x');
        epd_tokenizer_destroy(tok);
    }
}

static void test_merge_ties_leftmost(void **state)
{
    static const char *const v[] = {"aa"};
    static const char *const m[][2] = {{"a", "a"}};
    epd_tokenizer_t *tok = NULL;

    (void)state;
    assert_int_equal(
        load(mk_root(mk_vocab(v, 1), mk_merges(m, 1, 0), bytelevel_pre(0), NULL), &tok), EPD_OK);
    /* equal ranks merge left to right: aa a, not a aa */
    EXPECT(tok, "aaa", 0, 256, 'a');
    EXPECT(tok, "aaaa", 0, 256, 256);
    epd_tokenizer_destroy(tok);
}

static void test_merge_errors(void **state)
{
    static const char *const v[] = {"ab"};
    static const char *const bad_part[][2] = {{"a", "zz"}};
    static const char *const no_result[][2] = {{"b", "a"}};
    epd_tokenizer_t *tok = NULL;

    (void)state;
    assert_int_equal(
        load(mk_root(mk_vocab(v, 1), mk_merges(bad_part, 1, 0), bytelevel_pre(0), NULL), &tok),
        EPD_ERR_MALFORMED);
    assert_int_equal(
        load(mk_root(mk_vocab(v, 1), mk_merges(no_result, 1, 1), bytelevel_pre(0), NULL), &tok),
        EPD_ERR_MALFORMED);
    /* a string merge without its space */
    assert_int_equal(
        load(mk_root(mk_vocab(v, 1), json_pack("[s]", "ab"), bytelevel_pre(0), NULL), &tok),
        EPD_ERR_MALFORMED);
    assert_int_equal(
        load(mk_root(mk_vocab(v, 1), json_pack("[[s]]", "a"), bytelevel_pre(0), NULL), &tok),
        EPD_ERR_MALFORMED);
}

static void test_ignore_merges(void **state)
{
    /* "abc" is in the vocabulary but no merge makes it from a, b, c */
    static const char *const v[] = {"ab", "abc"};
    static const char *const m[][2] = {{"a", "b"}};

    (void)state;
    for (int ignore = 0; ignore < 2; ignore++) {
        json_t *root = mk_root(mk_vocab(v, 2), mk_merges(m, 1, 0), bytelevel_pre(0), NULL);
        epd_tokenizer_t *tok = NULL;

        json_object_set_new(json_object_get(root, "model"), "ignore_merges", json_boolean(ignore));
        assert_int_equal(load(root, &tok), EPD_OK);
        if (ignore) {
            EXPECT(tok, "abc", 0, 257);
        } else {
            EXPECT(tok, "abc", 0, 256, 'c');
        }
        epd_tokenizer_destroy(tok);
    }
}

/* ---- pre-tokenizers ------------------------------------------------------------------ */

static void test_split_behaviors(void **state)
{
    static const char *const v[] = {"a-", "-b", "--", "ab", "a--", "--b"};
    static const char *const m[][2] = {{"a", "-"}, {"-", "b"},  {"-", "-"},
                                       {"a", "b"}, {"a-", "-"}, {"--", "b"}};
    static const struct {
        const char *behavior;
        int invert;
        const char *text;
        int32_t want[4];
        size_t n;
    } cases[] = {
        {"Isolated", 0, "a-b", {'a', '-', 'b'}, 3},
        {"Removed", 0, "a-b", {'a', 'b'}, 2},
        {"MergedWithPrevious", 0, "a-b", {256, 'b'}, 2},
        {"MergedWithNext", 0, "a-b", {'a', 257}, 2},
        {"Contiguous", 0, "a--b", {'a', 258, 'b'}, 3},
        /* "--" is one match of "-+"... with a literal "-", two matches: */
        {"MergedWithPrevious", 0, "a--b", {256, '-', 'b'}, 3},
        {"MergedWithNext", 0, "a--b", {'a', '-', 257}, 3},
        /* invert: the letters are the matches */
        {"Removed", 1, "a-b", {'-'}, 1},
        /* a(match) -(gap) b(match): b joins the gap before it */
        {"MergedWithPrevious", 1, "a-b", {'a', 257}, 2},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *split = json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "String",
                                  "-", "behavior", cases[i].behavior, "invert", cases[i].invert);
        json_t *pre = json_pack("{s:s, s:[o,o]}", "type", "Sequence", "pretokenizers", split,
                                bytelevel_pre(0));
        epd_tokenizer_t *tok = NULL;

        fprintf(stderr, "case %zu: %s%s\n", i, cases[i].behavior,
                cases[i].invert ? " inverted" : "");
        assert_int_equal(load(mk_root(mk_vocab(v, 6), mk_merges(m, 6, 0), pre, NULL), &tok),
                         EPD_OK);
        expect_ids(tok, cases[i].text, strlen(cases[i].text), 0, cases[i].want, cases[i].n);
        epd_tokenizer_destroy(tok);
    }
}

static void test_split_regex_and_gpt2(void **state)
{
    static const char *const v[] = {" b", "ab"};
    static const char *const m[][2] = {{" ", "b"}, {"a", "b"}};
    epd_tokenizer_t *tok = NULL;
    json_t *split = json_pack("{s:s, s:{s:s}, s:s}", "type", "Split", "pattern", "Regex",
                              "\\p{L}+|\\s+", "behavior", "Isolated");
    json_t *pre =
        json_pack("{s:s, s:[o,o]}", "type", "Sequence", "pretokenizers", split, bytelevel_pre(0));

    (void)state;
    assert_int_equal(load(mk_root(mk_vocab(v, 2), mk_merges(m, 2, 0), pre, NULL), &tok), EPD_OK);
    /* "ab b": the regex cuts "ab", " ", "b": " b" never forms */
    EXPECT(tok, "ab b", 0, 257, ' ', 'b');
    epd_tokenizer_destroy(tok);

    /* ByteLevel's own GPT-2 regex keeps the space with the word */
    assert_int_equal(
        load(mk_root(mk_vocab(v, 2), mk_merges(m, 2, 0), bytelevel_pre(1), NULL), &tok), EPD_OK);
    EXPECT(tok, "ab b", 0, 257, 256);
    epd_tokenizer_destroy(tok);

    /* add_prefix_space: " " before a text that has none */
    {
        json_t *p = bytelevel_pre(1);

        json_object_set_new(p, "add_prefix_space", json_true());
        assert_int_equal(load(mk_root(mk_vocab(v, 2), mk_merges(m, 2, 0), p, NULL), &tok), EPD_OK);
        EXPECT(tok, "b", 0, 256);
        EXPECT(tok, " b", 0, 256);
        epd_tokenizer_destroy(tok);
    }
}

/* ---- added tokens ------------------------------------------------------------------- */

static json_t *added(int id, const char *content, int special, int normalized)
{
    return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content, "special",
                     special, "normalized", normalized, "lstrip", 0, "rstrip", 0, "single_word", 0);
}

static epd_tokenizer_t *special_tokenizer(json_t *post)
{
    static const char *const v[] = {"ab"};
    static const char *const m[][2] = {{"a", "b"}};
    json_t *list = json_pack("[o,o,o,o]", added(300, "<s>", 1, 0), added(301, "<s>x", 1, 0),
                             added(302, "<t>", 0, 0), added(303, "ZZ", 0, 1));
    json_t *root = mk_root(mk_vocab(v, 1), mk_merges(m, 1, 0), bytelevel_pre(0), list);
    epd_tokenizer_t *tok = NULL;

    if (post != NULL) {
        json_object_set_new(root, "post_processor", post);
    }
    assert_int_equal(load(root, &tok), EPD_OK);
    return tok;
}

static void test_added_tokens(void **state)
{
    epd_tokenizer_t *tok = special_tokenizer(NULL);

    (void)state;
    /* leftmost, then longest; each one id; text between is BPE'd */
    EXPECT(tok, "ab<s>ab", 0, 256, 300, 256);
    EXPECT(tok, "<s>xab", 0, 301, 256);
    EXPECT(tok, "<s><t>", 0, 300, 302);
    EXPECT(tok, "a<s", 0, 'a', '<', 's');
    /* a normalized added token, matched in the normalized text */
    EXPECT(tok, "aZZb", 0, 'a', 303, 'b');
    /* typed special tokens as text: BPE'd; non-special ones still match */
    EXPECT(tok, "<s>ab<t>", EPD_TOKENIZE_SPECIAL_AS_TEXT, '<', 's', '>', 256, 302);
    assert_int_equal(epd_tokenizer_token_id(tok, "<s>x", 4), 301);
    assert_int_equal(epd_tokenizer_token_id(tok, BL("ab"), strlen(BL("ab"))), 256);
    assert_int_equal(epd_tokenizer_token_id(tok, "nope", 4), -1);
    /* no post-processor: --add-special adds nothing */
    EXPECT(tok, "ab", EPD_TOKENIZE_ADD_SPECIAL, 256);
    epd_tokenizer_destroy(tok);
}

static void test_config(void **state)
{
    static const char *const v[] = {"ab"};
    static const char *const m[][2] = {{"a", "b"}};
    /* a string, an object with content, and model_max_length as Llama-3's
     * config writes it (an integer jansson cannot hold) */
    static const char config[] = "{\"bos_token\": \"<s>\", \"eos_token\": {\"content\": "
                                 "\"<t>\"}, \"model_max_length\": "
                                 "1000000000000000019884624838656}";
    json_t *list = json_pack("[o,o]", added(300, "<s>", 1, 0), added(302, "<t>", 1, 0));
    json_t *root = mk_root(mk_vocab(v, 1), mk_merges(m, 1, 0), bytelevel_pre(0), list);
    char *text = json_dumps(root, JSON_COMPACT);
    epd_tokenizer_t *tok = NULL;

    (void)state;
    assert_int_equal(epd_tokenizer_create(text, strlen(text), config, strlen(config), &tok),
                     EPD_OK);
    assert_int_equal(epd_tokenizer_bos(tok), 300);
    assert_int_equal(epd_tokenizer_eos(tok), 302);
    assert_int_equal(epd_tokenizer_n_ids(tok), 303);
    epd_tokenizer_destroy(tok);
    assert_int_equal(epd_tokenizer_create(text, strlen(text), NULL, 0, &tok), EPD_OK);
    assert_int_equal(epd_tokenizer_bos(tok), -1);
    assert_int_equal(epd_tokenizer_eos(tok), -1);
    epd_tokenizer_destroy(tok);
    assert_int_equal(epd_tokenizer_create(text, strlen(text), "{", 1, &tok), EPD_ERR_MALFORMED);
    free(text);
    json_decref(root);
}

static void test_strip(void **state)
{
    static const char *const v[] = {"ab"};
    static const char *const m[][2] = {{"a", "b"}};
    json_t *l = added(300, "<l>", 1, 0), *r = added(301, "<r>", 1, 0), *b = added(302, "<b>", 0, 1);
    json_t *root;
    epd_tokenizer_t *tok = NULL;

    (void)state;
    json_object_set_new(l, "lstrip", json_true());
    json_object_set_new(r, "rstrip", json_true());
    json_object_set_new(b, "lstrip", json_true());
    json_object_set_new(b, "rstrip", json_true());
    root = mk_root(mk_vocab(v, 1), mk_merges(m, 1, 0), bytelevel_pre(0),
                   json_pack("[o,o,o]", l, r, b));
    assert_int_equal(load(root, &tok), EPD_OK);
    /* spaces, a tab, a newline and U+3000 (White_Space) are taken */
    EXPECT(tok, "ab \t<l> ab", 0, 256, 300, ' ', 256);
    EXPECT(tok, "ab <r> \n\xE3\x80\x80" "ab", 0, 256, ' ', 301, 256);
    EXPECT(tok, "ab <b> ab", 0, 256, 302, 256);
    /* not past the previous token, not a non-space; a lone byte stops it */
    EXPECT(tok, "<r>  <l>", 0, 301, 300);
    EXPECT(tok, "a\x80 <l>", 0, 'a', 0x80, 300);
    EXPECT(tok, "<r>\xC2", 0, 301, 0xC2);
    epd_tokenizer_destroy(tok);
}

static void test_post_processor(void **state)
{
    json_t *tmpl = json_pack("{s:s, s:[{s:{s:s}}, {s:{s:s}}, {s:{s:s}}], s:{s:{s:[i]}, s:{s:[i]}}}",
                             "type", "TemplateProcessing", "single", "SpecialToken", "id", "<s>",
                             "Sequence", "id", "A", "SpecialToken", "id", "<t>", "special_tokens",
                             "<s>", "ids", 300, "<t>", "ids", 302);
    json_t *post = json_pack("{s:s, s:[{s:s}, o]}", "type", "Sequence", "processors", "type",
                             "ByteLevel", tmpl);
    epd_tokenizer_t *tok = special_tokenizer(post);

    (void)state;
    EXPECT(tok, "ab", EPD_TOKENIZE_ADD_SPECIAL, 300, 256, 302);
    EXPECT(tok, "", EPD_TOKENIZE_ADD_SPECIAL, 300, 302);
    EXPECT(tok, "ab", 0, 256);
    epd_tokenizer_destroy(tok);
}

static void test_capacity(void **state)
{
    epd_tokenizer_t *tok = special_tokenizer(NULL);
    int32_t ids[2];
    size_t n = 0;

    (void)state;
    assert_int_equal(epd_tokenizer_encode(tok, "xyz", 3, 0, ids, 2, &n), EPD_ERR_TOO_LONG);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 'x');
    assert_int_equal(ids[1], 'y');
    /* asking for the count with no buffer (UBSan found memcpy(NULL, ...)
     * here: epd-tokenize's first call has no buffer yet) */
    assert_int_equal(epd_tokenizer_encode(tok, "xyz", 3, 0, NULL, 0, &n), EPD_ERR_TOO_LONG);
    assert_int_equal(n, 3);
    assert_int_equal(epd_tokenizer_encode(tok, "", 0, 0, NULL, 0, &n), EPD_OK);
    assert_int_equal(n, 0);
    epd_tokenizer_destroy(tok);
}

/* ---- normalization and bytes --------------------------------------------------------- */

static void test_nfc(void **state)
{
    static const char *const v[] = {"\xC3\xA9"}; /* é, 256 */
    static const char *const m[][2] = {{"\xC3", "\xA9"}};
    json_t *root = mk_root(mk_vocab(v, 1), mk_merges(m, 1, 0), bytelevel_pre(0), NULL);
    epd_tokenizer_t *tok = NULL;

    (void)state;
    json_object_set_new(
        root, "normalizer",
        json_pack("{s:s, s:[{s:s}]}", "type", "Sequence", "normalizers", "type", "NFC"));
    assert_int_equal(load(root, &tok), EPD_OK);
    /* e + U+0301 composes to é */
    EXPECT(tok, "e\xCC\x81", 0, 256);
    EXPECT(tok, "\xC3\xA9", 0, 256);
    epd_tokenizer_destroy(tok);
}

static void test_invalid_utf8(void **state)
{
    epd_tokenizer_t *tok = special_tokenizer(NULL);
    /* a lone continuation, a truncated 3-byte sequence, an overlong, 0xFF */
    static const char text[] = "ab\x80"
                               "ab\xE2\x82"
                               "<s>\xC0\xAF\xFF";
    int32_t ids[64];
    size_t n = 0, len = 0;
    char back[64];

    (void)state;
    expect_ids(tok, text, sizeof(text) - 1, 0,
               (const int32_t[]){256, 0x80, 256, 0xE2, 0x82, 300, 0xC0, 0xAF, 0xFF}, 9);
    assert_int_equal(epd_tokenizer_encode(tok, text, sizeof(text) - 1, 0, ids, 64, &n), EPD_OK);
    assert_int_equal(epd_tokenizer_decode(tok, ids, n, 0, back, sizeof(back), &len), EPD_OK);
    assert_int_equal(len, sizeof(text) - 1);
    assert_memory_equal(back, text, len);
    epd_tokenizer_destroy(tok);
}

/* ---- decoding ------------------------------------------------------------------------ */

static void test_stream_decode(void **state)
{
    /* 😀 is F0 9F 98 80: the tokens "\xF0\x9F" (256) then "\x98" "\x80" */
    static const char *const v[] = {"\xF0\x9F"};
    static const char *const m[][2] = {{"\xF0", "\x9F"}};
    json_t *list = json_pack("[o]", added(300, "<s>", 1, 0));
    epd_tokenizer_t *tok = NULL;
    epd_tokenizer_stream_t st;
    const int32_t ids[] = {'a', 256, 0x98, 300, 0x80, 0xFF, 0xC3};
    char buf[64], all[64];
    size_t len, n_all = 0, one = 0;

    (void)state;
    assert_int_equal(
        load(mk_root(mk_vocab(v, 1), mk_merges(m, 1, 0), bytelevel_pre(0), list), &tok), EPD_OK);
    epd_tokenizer_stream_init(&st, 0);
    assert_int_equal(epd_tokenizer_stream_push(tok, &st, ids[0], buf, sizeof(buf), &len), EPD_OK);
    assert_int_equal(len, 1);
    /* an unfinished character is held back */
    assert_int_equal(epd_tokenizer_stream_push(tok, &st, ids[1], buf, sizeof(buf), &len), EPD_OK);
    assert_int_equal(len, 0);
    assert_int_equal(epd_tokenizer_stream_push(tok, &st, ids[2], buf, sizeof(buf), &len), EPD_OK);
    assert_int_equal(len, 0);
    /* a special token cannot finish it: the held bytes go out as they are */
    assert_int_equal(epd_tokenizer_stream_push(tok, &st, ids[3], buf, sizeof(buf), &len), EPD_OK);
    assert_int_equal(len, 6);
    assert_memory_equal(buf, "\xF0\x9F\x98<s>", 6);
    /* a lone continuation, 0xFF: out at once; C3 waits, and finish hands it out */
    assert_int_equal(epd_tokenizer_stream_push(tok, &st, ids[4], buf, sizeof(buf), &len), EPD_OK);
    assert_int_equal(len, 1);
    assert_int_equal(epd_tokenizer_stream_push(tok, &st, ids[5], buf, sizeof(buf), &len), EPD_OK);
    assert_int_equal(len, 1);
    assert_int_equal(epd_tokenizer_stream_push(tok, &st, ids[6], buf, sizeof(buf), &len), EPD_OK);
    assert_int_equal(len, 0);
    assert_int_equal(epd_tokenizer_stream_finish(&st, buf, sizeof(buf), &len), EPD_OK);
    assert_int_equal(len, 1);
    assert_int_equal((uint8_t)buf[0], 0xC3);

    /* the concatenation of a stream equals the one-shot decode */
    epd_tokenizer_stream_init(&st, 0);
    for (size_t i = 0; i <= 7; i++) {
        len = 0;
        if (i < 7) {
            assert_int_equal(
                epd_tokenizer_stream_push(tok, &st, ids[i], all + n_all, sizeof(all) - n_all, &len),
                EPD_OK);
        } else {
            assert_int_equal(
                epd_tokenizer_stream_finish(&st, all + n_all, sizeof(all) - n_all, &len), EPD_OK);
        }
        n_all += len;
    }
    assert_int_equal(epd_tokenizer_decode(tok, ids, 7, 0, buf, sizeof(buf), &one), EPD_OK);
    assert_int_equal(one, n_all);
    assert_memory_equal(buf, all, one);

    /* a whole emoji across two ids comes out at the second */
    epd_tokenizer_stream_init(&st, 0);
    assert_int_equal(epd_tokenizer_stream_push(tok, &st, 256, buf, sizeof(buf), &len), EPD_OK);
    assert_int_equal(len, 0);
    assert_int_equal(epd_tokenizer_stream_push(tok, &st, 0x98, buf, sizeof(buf), &len), EPD_OK);
    assert_int_equal(len, 0);
    assert_int_equal(epd_tokenizer_stream_push(tok, &st, 0x80, buf, sizeof(buf), &len), EPD_OK);
    assert_int_equal(len, 4);
    assert_memory_equal(buf, "\xF0\x9F\x98\x80", 4);

    /* skip special; a bad id and a short buffer change nothing */
    epd_tokenizer_stream_init(&st, EPD_DETOKENIZE_SKIP_SPECIAL);
    assert_int_equal(epd_tokenizer_stream_push(tok, &st, 300, buf, sizeof(buf), &len), EPD_OK);
    assert_int_equal(len, 0);
    assert_int_equal(epd_tokenizer_stream_push(tok, &st, 256, buf, sizeof(buf), &len), EPD_OK);
    assert_int_equal(epd_tokenizer_stream_push(tok, &st, 999, buf, sizeof(buf), &len),
                     EPD_ERR_OUT_OF_RANGE);
    assert_int_equal(epd_tokenizer_stream_push(tok, &st, 'x', buf, 2, &len), EPD_ERR_TOO_LONG);
    assert_int_equal(epd_tokenizer_stream_push(tok, &st, 'x', buf, 3, &len), EPD_OK);
    assert_int_equal(len, 3);
    assert_memory_equal(buf, "\xF0\x9Fx", 3);
    assert_int_equal(epd_tokenizer_decode(tok, (const int32_t[]){300, 'a'}, 2,
                                          EPD_DETOKENIZE_SKIP_SPECIAL, buf, sizeof(buf), &len),
                     EPD_OK);
    assert_int_equal(len, 1);
    assert_int_equal(epd_tokenizer_decode(tok, (const int32_t[]){300, 'a'}, 2, 0, buf, 2, &len),
                     EPD_ERR_TOO_LONG);
    assert_int_equal(len, 4);
    assert_int_equal(epd_tokenizer_decode(tok, (const int32_t[]){-1}, 1, 0, buf, 2, &len),
                     EPD_ERR_OUT_OF_RANGE);
    epd_tokenizer_destroy(tok);
}

/* ---- refusals and allocation failures ------------------------------------------------ */

static void test_refused(void **state)
{
    static const char *const v[] = {"ab"};
    static const char *const m[][2] = {{"a", "b"}};
    epd_tokenizer_t *tok = NULL;
    json_t *root;

    (void)state;
    assert_int_equal(epd_tokenizer_create("{", 1, NULL, 0, &tok), EPD_ERR_MALFORMED);
    assert_int_equal(epd_tokenizer_create("[]", 2, NULL, 0, &tok), EPD_ERR_MALFORMED);
    /* not byte-level: no ByteLevel pre-tokenizer */
    assert_int_equal(load(mk_root(mk_vocab(v, 1), mk_merges(m, 1, 0), json_null(), NULL), &tok),
                     EPD_ERR_UNSUPPORTED);
    assert_int_equal(load(mk_root(mk_vocab(v, 1), mk_merges(m, 1, 0),
                                  json_pack("{s:s}", "type", "Metaspace"), NULL),
                          &tok),
                     EPD_ERR_UNSUPPORTED);
    /* another model */
    root = mk_root(mk_vocab(v, 1), mk_merges(m, 1, 0), bytelevel_pre(0), NULL);
    json_object_set_new(json_object_get(root, "model"), "type", json_string("WordPiece"));
    assert_int_equal(load(root, &tok), EPD_ERR_UNSUPPORTED);
    /* byte_fallback */
    root = mk_root(mk_vocab(v, 1), mk_merges(m, 1, 0), bytelevel_pre(0), NULL);
    json_object_set_new(json_object_get(root, "model"), "byte_fallback", json_true());
    assert_int_equal(load(root, &tok), EPD_ERR_UNSUPPORTED);
    /* an added token with single_word */
    {
        json_t *a = added(300, "<s>", 1, 0);

        json_object_set_new(a, "single_word", json_true());
        assert_int_equal(
            load(mk_root(mk_vocab(v, 1), mk_merges(m, 1, 0), bytelevel_pre(0), json_pack("[o]", a)),
                 &tok),
            EPD_ERR_UNSUPPORTED);
    }
    /* a regex that does not compile */
    assert_int_equal(load(mk_root(mk_vocab(v, 1), mk_merges(m, 1, 0),
                                  json_pack("{s:s, s:[{s:s, s:{s:s}, s:s}, o]}", "type", "Sequence",
                                            "pretokenizers", "type", "Split", "pattern", "Regex",
                                            "(unclosed", "behavior", "Isolated", bytelevel_pre(0)),
                                  NULL),
                          &tok),
                     EPD_ERR_MALFORMED);
    /* a byte missing from the vocabulary */
    root = mk_root(mk_vocab(v, 1), mk_merges(m, 1, 0), bytelevel_pre(0), NULL);
    json_object_del(json_object_get(json_object_get(root, "model"), "vocab"), bl("\n", 1));
    assert_int_equal(load(root, &tok), EPD_ERR_UNSUPPORTED);
    /* two tokens, one id */
    root = mk_root(mk_vocab(v, 1), mk_merges(m, 1, 0), bytelevel_pre(0), NULL);
    json_object_set_new(json_object_get(json_object_get(root, "model"), "vocab"), "zz",
                        json_integer(256));
    assert_int_equal(load(root, &tok), EPD_ERR_MALFORMED);
    /* an unsupported decoder */
    root = mk_root(mk_vocab(v, 1), mk_merges(m, 1, 0), bytelevel_pre(0), NULL);
    json_object_set_new(root, "decoder", json_pack("{s:s}", "type", "WordPiece"));
    assert_int_equal(load(root, &tok), EPD_ERR_UNSUPPORTED);
}

static void test_alloc_failures(void **state)
{
    static const char *const v[] = {"ab"};
    static const char *const m[][2] = {{"a", "b"}};
    json_t *list = json_pack("[o,o]", added(300, "<s>", 1, 0), added(301, "ZZ", 0, 1));
    json_t *root = mk_root(mk_vocab(v, 1), mk_merges(m, 1, 0), bytelevel_pre(1), list);
    char *text;
    int ok = 0;
    epd_alloc_stats_t before, after;

    (void)state;
    json_object_set_new(root, "normalizer", json_pack("{s:s}", "type", "NFC"));
    text = json_dumps(root, JSON_COMPACT);
    epd_alloc_stats(&before);
    /* fail the Nth allocation of a load and of a first encode, for every N */
    for (long n = 0; n < 200 && !ok; n++) {
        epd_tokenizer_t *tok = NULL;
        int32_t ids[32];
        size_t got = 0;
        epd_status_t status;

        epd_alloc_fail_after(n);
        status = epd_tokenizer_create(text, strlen(text), NULL, 0, &tok);
        if (status == EPD_OK) {
            status = epd_tokenizer_encode(tok, "ab <s> e\xCC\x81 ZZ", 13, 0, ids, 32, &got);
            if (status == EPD_OK) {
                ok = 1;
                epd_alloc_fail_after(-1);
                expect_ids(tok, "ab <s> e\xCC\x81 ZZ", 13, 0,
                           (const int32_t[]){256, ' ', 300, ' ', 0xC3, 0xA9, ' ', 301}, 8);
            }
            epd_tokenizer_destroy(tok);
        }
        if (!ok) {
            assert_int_equal(status, EPD_ERR_NO_MEMORY);
        }
    }
    epd_alloc_fail_after(-1);
    assert_true(ok);
    epd_alloc_stats(&after);
    assert_int_equal(after.live_blocks, before.live_blocks); /* every path freed its blocks */
    free(text);
    json_decref(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merges_both_formats),
        cmocka_unit_test(test_merge_ties_leftmost),
        cmocka_unit_test(test_merge_errors),
        cmocka_unit_test(test_ignore_merges),
        cmocka_unit_test(test_split_behaviors),
        cmocka_unit_test(test_split_regex_and_gpt2),
        cmocka_unit_test(test_added_tokens),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_strip),
        cmocka_unit_test(test_post_processor),
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_nfc),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_stream_decode),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_alloc_failures),
    };

    /* the refusals log their cause: keep them, they are the point */
    epd_log_set_level(EPD_LOG_ERROR);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
