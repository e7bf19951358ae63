/*
 * epd_tokenizer.c — loading a Hugging Face tokenizer.json into the tables
 * of epd_tokenizer_int.h, and decoding.
 *
 * The vocabulary's keys are byte-level strings (GPT-2's map of the 256
 * bytes onto printable code points: ' ' is 'Ġ', '\n' is 'Ċ'); they are
 * turned back into bytes here, once, so that the encoder works on raw bytes
 * and never maps a character at run time.  A key with a character outside
 * the map (rare: a token a vocabulary added by hand) cannot come out of a
 * byte-level pre-token, so it is left out of the lookup table, and decodes
 * to its own UTF-8 as the Rust ByteLevel decoder does.
 *
 * The pipeline's parts (normalizer, pre-tokenizer, post-processor,
 * decoder) are read by epd_tokenizer_json.c; the string pool and the
 * vocabulary and merge tables are epd_tokenizer_tab.c's.
 *
 * Merges become a hash table from the pair of ids to (rank, merged id);
 * a merge whose parts or result are not in the vocabulary is an error, as
 * in the Rust crate; a pair listed twice keeps its later rank, as the Rust
 * crate's map does.
 */
#include "epd_tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_hash.h"
#include "epd_log.h"
#include "epd_tokenizer_int.h"

#define EPD_TOK_LOG "tokenizer"
/* tokenizer.json files beyond this are refused (the largest are ~30 MB) */
#define EPD_TOK_MAX_FILE (1ull << 30)

/* ---- the ByteLevel map ---------------------------------------------------- */

/* GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other
 * 68 are numbered from U+0100 in byte order. */
static void epd_tok_byte_map(uint32_t cp_of_byte[256], int16_t byte_of_cp[512])
{
    uint32_t next = 256;

    for (int i = 0; i < 512; i++) {
        byte_of_cp[i] = -1;
    }
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);

        cp_of_byte[b] = printable ? (uint32_t)b : next++;
        byte_of_cp[cp_of_byte[b]] = (int16_t)b;
    }
}

/* Decodes one UTF-8 code point from s[0..len) (which is valid: it came from
 * jansson); returns its length. */
static size_t epd_tok_utf8_cp(const uint8_t *s, size_t len, uint32_t *cp_p)
{
    if (s[0] < 0x80 || len < 2) {
        *cp_p = s[0];
        return 1;
    }
    if (s[0] < 0xE0 || len < 3) {
        *cp_p = ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
        return 2;
    }
    if (s[0] < 0xF0 || len < 4) {
        *cp_p = ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    *cp_p = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
            ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    return 4;
}

/* Byte-level text s[0..len) -> bytes in out[0..cap); returns the byte
 * count, or -1 when a character is outside the map or they do not fit. */
static long epd_tok_unbyte(const int16_t byte_of_cp[512], const char *s, size_t len, char *out,
                           size_t cap)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0;
    long n = 0;

    while (i < len) {
        uint32_t cp;

        i += epd_tok_utf8_cp(p + i, len - i, &cp);
        if (cp >= 512 || byte_of_cp[cp] < 0 || (size_t)n == cap) {
            return -1;
        }
        out[n++] = (char)byte_of_cp[cp];
    }
    return n;
}

static uint32_t epd_tok_pow2_at_least(size_t n)
{
    uint32_t p = 16;

    while (p < n) {
        p <<= 1;
    }
    return p;
}

/* ---- vocabulary, merges, added tokens ------------------------------------------ */

static epd_status_t epd_tok_get_id(const json_t *v, uint32_t *id_p)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) >= EPD_TOK_MAX_IDS) {
        return epd__tok_malformed("a token id is not an integer in [0, 2^24)");
    }
    *id_p = (uint32_t)json_integer_value(v);
    return EPD_OK;
}

/* HF's ByteLevel decoder: a token's characters through the map, or the
 * token's own UTF-8 when one of them is outside it. */
static epd_status_t epd_tok_set_decode(epd_tokenizer_t *tok, const int16_t byte_of_cp[512],
                                       uint32_t id, const char *text, size_t len, char *tmp,
                                       size_t tmp_cap)
{
    long n = epd_tok_unbyte(byte_of_cp, text, len, tmp, tmp_cap);

    if (n < 0) {
        return epd__tok_pool_add(tok, text, len, &tok->id_bytes[id]);
    }
    return epd__tok_pool_add(tok, tmp, (size_t)n, &tok->id_bytes[id]);
}

static epd_status_t epd_tok_load_vocab(epd_tokenizer_t *tok, const json_t *vocab,
                                       const json_t *added, const int16_t byte_of_cp[512],
                                       const uint32_t cp_of_byte[256])
{
    const char *key;
    const json_t *v;
    size_t i, n_vocab = 0;
    uint32_t max_id = 0, id;
    char *tmp = NULL;
    size_t tmp_cap = 64;
    epd_status_t status;

    if (!json_is_object(vocab)) {
        return epd__tok_malformed("model.vocab is not an object");
    }
    json_object_foreach((json_t *)vocab, key, v)
    {
        status = epd_tok_get_id(v, &id);
        if (status != EPD_OK) {
            return status;
        }
        max_id = id > max_id ? id : max_id;
        n_vocab++;
        tmp_cap = strlen(key) + 1 > tmp_cap ? strlen(key) + 1 : tmp_cap;
    }
    json_array_foreach(added, i, v)
    {
        const json_t *content = json_object_get(v, "content");

        status = epd_tok_get_id(json_object_get(v, "id"), &id);
        if (status != EPD_OK) {
            return status;
        }
        if (!json_is_string(content) || json_string_length(content) == 0) {
            return epd__tok_malformed("an added token without content");
        }
        max_id = id > max_id ? id : max_id;
        tmp_cap =
            json_string_length(content) + 1 > tmp_cap ? json_string_length(content) + 1 : tmp_cap;
    }
    if (n_vocab == 0) {
        return epd__tok_malformed("model.vocab is empty");
    }
    tok->n_ids = max_id + 1;
    tok->id_bytes = epd_malloc(tok->n_ids * sizeof(*tok->id_bytes));
    tok->vocab_bytes = epd_malloc(tok->n_ids * sizeof(*tok->vocab_bytes));
    tok->id_special = epd_calloc(tok->n_ids, 1);
    tok->vocab_mask = epd_tok_pow2_at_least(n_vocab * 2) - 1;
    tok->vocab_tab = epd_malloc(((size_t)tok->vocab_mask + 1) * sizeof(uint32_t));
    tmp = epd_malloc(tmp_cap);
    if (tok->id_bytes == NULL || tok->vocab_bytes == NULL || tok->id_special == NULL ||
        tok->vocab_tab == NULL || tmp == NULL) {
        status = EPD_ERR_NO_MEMORY;
        goto out;
    }
    for (i = 0; i < tok->n_ids; i++) {
        tok->id_bytes[i].off = EPD_TOK_NONE;
        tok->id_bytes[i].len = 0;
        tok->vocab_bytes[i].off = EPD_TOK_NONE;
        tok->vocab_bytes[i].len = 0;
    }
    memset(tok->vocab_tab, 0xFF, ((size_t)tok->vocab_mask + 1) * sizeof(uint32_t));
    json_object_foreach((json_t *)vocab, key, v)
    {
        size_t klen = strlen(key);
        long n;

        id = (uint32_t)json_integer_value(v);
        if (tok->id_bytes[id].off != EPD_TOK_NONE) {
            status = epd__tok_malformed("two vocabulary tokens have one id");
            goto out;
        }
        status = epd_tok_set_decode(tok, byte_of_cp, id, key, klen, tmp, tmp_cap);
        if (status != EPD_OK) {
            goto out;
        }
        n = epd_tok_unbyte(byte_of_cp, key, klen, tmp, tmp_cap);
        if (n > 0) {
            /* its bytes were just pooled by set_decode */
            tok->vocab_bytes[id] = tok->id_bytes[id];
            epd__tok_vocab_insert(tok, id);
        }
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;

        tok->byte_id[b] = epd__tok_vocab_find(tok, &c, 1);
        if (tok->byte_id[b] == EPD_TOK_NONE) {
            epd_log_error(EPD_TOK_LOG, 0,
                          "tokenizer.json: byte 0x%02X (U+%04X) is not in the vocabulary: "
                          "not a byte-level BPE",
                          b, cp_of_byte[b]);
            status = EPD_ERR_UNSUPPORTED;
            goto out;
        }
    }
    status = EPD_OK;
out:
    epd_free(tmp);
    return status;
}

/* "a b" (the older format) or ["a", "b"] (tokenizers >= 0.20) -> the two
 * parts' ids */
static epd_status_t epd_tok_merge_parts(const epd_tokenizer_t *tok, const json_t *m,
                                        const int16_t byte_of_cp[512], char *tmp, size_t tmp_cap,
                                        uint32_t ids[2])
{
    const char *part[2];
    size_t len[2];

    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        const char *sp = memchr(s, ' ', json_string_length(m));

        if (sp == NULL) {
            return epd__tok_malformed("a merge \"a b\" without its space");
        }
        part[0] = s;
        len[0] = (size_t)(sp - s);
        part[1] = sp + 1;
        len[1] = json_string_length(m) - len[0] - 1;
    } else if (json_is_array(m) && json_array_size(m) == 2 &&
               json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
        for (int k = 0; k < 2; k++) {
            part[k] = json_string_value(json_array_get(m, k));
            len[k] = json_string_length(json_array_get(m, k));
        }
    } else {
        return epd__tok_malformed("a merge is neither \"a b\" nor [\"a\", \"b\"]");
    }
    for (int k = 0; k < 2; k++) {
        long n = epd_tok_unbyte(byte_of_cp, part[k], len[k], tmp, tmp_cap);

        ids[k] = n > 0 ? epd__tok_vocab_find(tok, tmp, (size_t)n) : EPD_TOK_NONE;
        if (ids[k] == EPD_TOK_NONE) {
            epd_log_error(EPD_TOK_LOG, 0,
                          "tokenizer.json: merge part '%.*s' is not in the vocabulary", (int)len[k],
                          part[k]);
            return EPD_ERR_MALFORMED;
        }
    }
    return EPD_OK;
}

static epd_status_t epd_tok_load_merges(epd_tokenizer_t *tok, const json_t *merges,
                                        const int16_t byte_of_cp[512])
{
    size_t n = json_array_size(merges);
    size_t i;
    const json_t *m;
    char *tmp = NULL;
    epd_status_t status = EPD_OK;

    if (merges != NULL && !json_is_array(merges)) {
        return epd__tok_malformed("model.merges is not a list");
    }
    if (n >= UINT32_MAX / 4) {
        return epd__tok_malformed("too many merges");
    }
    tok->merge_mask = epd_tok_pow2_at_least(n * 2 + 1) - 1;
    tok->merge_tab = epd_malloc(((size_t)tok->merge_mask + 1) * sizeof(*tok->merge_tab));
    tmp = epd_malloc(tok->max_token_bytes * 2 + 8);
    if (tok->merge_tab == NULL || tmp == NULL) {
        status = EPD_ERR_NO_MEMORY;
        goto out;
    }
    for (size_t k = 0; k <= tok->merge_mask; k++) {
        tok->merge_tab[k].key = UINT64_MAX;
        tok->merge_tab[k].rank = 0;
        tok->merge_tab[k].id = EPD_TOK_NONE;
    }
    json_array_foreach(merges, i, m)
    {
        uint32_t ids[2], merged;
        const epd_tok_str_t *a, *b;

        status = epd_tok_merge_parts(tok, m, byte_of_cp, tmp, tok->max_token_bytes + 1, ids);
        if (status != EPD_OK) {
            goto out;
        }
        a = &tok->vocab_bytes[ids[0]];
        b = &tok->vocab_bytes[ids[1]];
        memcpy(tmp, tok->pool + a->off, a->len);
        memcpy(tmp + a->len, tok->pool + b->off, b->len);
        merged = epd__tok_vocab_find(tok, tmp, (size_t)a->len + b->len);
        if (merged == EPD_TOK_NONE) {
            epd_log_error(EPD_TOK_LOG, 0,
                          "tokenizer.json: merge %zu's result is not in the vocabulary", i);
            status = EPD_ERR_MALFORMED;
            goto out;
        }
        epd__tok_merge_insert(tok, ids[0], ids[1], (uint32_t)i, merged);
    }
out:
    epd_free(tmp);
    return status;
}

static int epd_tok_added_cmp_ctx_sort(const epd_tokenizer_t *tok, uint32_t a, uint32_t b)
{
    const epd_tok_added_t *x = &tok->added[a], *y = &tok->added[b];
    uint8_t bx = (uint8_t)tok->pool[x->content.off], by = (uint8_t)tok->pool[y->content.off];

    if (bx != by) {
        return bx < by ? -1 : 1;
    }
    if (x->content.len != y->content.len) {
        return x->content.len > y->content.len ? -1 : 1; /* longest first */
    }
    return a < b ? -1 : (a > b);
}

/* Builds the bucketed index of the added tokens that pass `want` (an
 * insertion sort: a few hundred tokens, once). */
static epd_status_t epd_tok_added_set(epd_tokenizer_t *tok, epd_tok_added_set_t *set,
                                      int normalized, int with_special)
{
    size_t n = 0;

    set->order = epd_malloc((tok->n_added + 1) * sizeof(uint32_t));
    if (set->order == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < tok->n_added; i++) {
        const epd_tok_added_t *a = &tok->added[i];
        size_t j;

        if (a->normalized != normalized || (a->special && !with_special)) {
            continue;
        }
        for (j = n; j > 0 && epd_tok_added_cmp_ctx_sort(tok, (uint32_t)i, set->order[j - 1]) < 0;
             j--) {
            set->order[j] = set->order[j - 1];
        }
        set->order[j] = (uint32_t)i;
        n++;
    }
    memset(set->start, 0, sizeof(set->start));
    for (size_t i = 0; i < n; i++) {
        set->start[(uint8_t)tok->pool[tok->added[set->order[i]].content.off] + 1]++;
    }
    for (int b = 0; b < 256; b++) {
        set->start[b + 1] += set->start[b];
    }
    return EPD_OK;
}

static epd_status_t epd_tok_load_added(epd_tokenizer_t *tok, const json_t *added,
                                       const int16_t byte_of_cp[512])
{
    size_t i;
    const json_t *a;
    char *tmp = NULL;
    epd_status_t status = EPD_OK;

    if (added != NULL && !json_is_array(added)) {
        return epd__tok_malformed("added_tokens is not a list");
    }
    tok->n_added = json_array_size(added);
    tok->added = epd_calloc(tok->n_added + 1, sizeof(*tok->added));
    tmp = epd_malloc(tok->max_token_bytes + 1);
    if (tok->added == NULL || tmp == NULL) {
        status = EPD_ERR_NO_MEMORY;
        goto out;
    }
    json_array_foreach(added, i, a)
    {
        const json_t *content = json_object_get(a, "content");
        epd_tok_added_t *t = &tok->added[i];
        if (epd__tok_flag(a, "single_word")) {
            status = epd__tok_unsupported("added token option", "single_word");
            goto out;
        }
        t->lstrip = (uint8_t)epd__tok_flag(a, "lstrip");
        t->rstrip = (uint8_t)epd__tok_flag(a, "rstrip");
        t->id = (uint32_t)json_integer_value(json_object_get(a, "id"));
        t->special = (uint8_t)epd__tok_flag(a, "special");
        /* "normalized" defaults to the opposite of "special" in the crate */
        t->normalized = json_object_get(a, "normalized") != NULL
                            ? (uint8_t)epd__tok_flag(a, "normalized")
                            : (uint8_t)!t->special;
        status = epd__tok_pool_add(tok, json_string_value(content), json_string_length(content),
                                   &t->content);
        if (status != EPD_OK) {
            goto out;
        }
        /* decoding an added token: its content through the ByteLevel
         * decoder, as the Rust crate does */
        status = epd_tok_set_decode(tok, byte_of_cp, t->id, json_string_value(content),
                                    json_string_length(content), tmp, tok->max_token_bytes + 1);
        if (status != EPD_OK) {
            goto out;
        }
        tok->id_special[t->id] = t->special;
    }
    for (int k = 0; k < 4 && status == EPD_OK; k++) {
        status = epd_tok_added_set(tok, &tok->added_sets[k], k >= 2, (k & 1) == 0);
    }
out:
    epd_free(tmp);
    return status;
}

/* bos_token / eos_token of tokenizer_config.json: a string or
 * {"content": ...} */
static int32_t epd_tok_config_token(const epd_tokenizer_t *tok, const json_t *config,
                                    const char *key)
{
    const json_t *v = json_object_get(config, key);
    const char *name;

    if (json_is_object(v)) {
        v = json_object_get(v, "content");
    }
    name = json_string_value(v);
    return name != NULL ? epd_tokenizer_token_id(tok, name, json_string_length(v)) : -1;
}

/* ---- create / destroy ------------------------------------------------------------ */

epd_status_t epd_tokenizer_create(const char *json, size_t len, const char *config,
                                  size_t config_len, epd_tokenizer_t **tok_p)
{
    static const OnigEncoding encs[] = {ONIG_ENCODING_UTF8};
    epd_tokenizer_t *tok;
    json_t *root = NULL, *conf = NULL;
    json_error_t jerr;
    const json_t *model, *added;
    uint32_t cp_of_byte[256];
    int16_t byte_of_cp[512];
    epd_status_t status;

    /* idempotent; the library's one global set-up */
    onig_initialize((OnigEncoding *)encs, 1);
    tok = epd_calloc(1, sizeof(*tok));
    if (tok == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    tok->bos = tok->eos = -1;
    root = json_loadb(json, len, JSON_ALLOW_NUL, &jerr);
    if (root == NULL) {
        epd_log_error(EPD_TOK_LOG, 0, "tokenizer.json: not JSON (line %d: %s)", jerr.line,
                      jerr.text);
        status = EPD_ERR_MALFORMED;
        goto err;
    }
    if (!json_is_object(root)) {
        status = epd__tok_malformed("the top level is not an object");
        goto err;
    }
    epd_tok_byte_map(cp_of_byte, byte_of_cp);
    model = json_object_get(root, "model");
    added = json_object_get(root, "added_tokens");
    status = epd__tok_parse_pipeline(tok, root);
    if (status != EPD_OK) {
        goto err;
    }
    if (added != NULL && !json_is_array(added)) {
        status = epd__tok_malformed("added_tokens is not a list");
        goto err;
    }
    status =
        epd_tok_load_vocab(tok, json_object_get(model, "vocab"), added, byte_of_cp, cp_of_byte);
    if (status != EPD_OK) {
        goto err;
    }
    for (uint32_t i = 0; i < tok->n_ids; i++) {
        if (tok->id_bytes[i].off != EPD_TOK_NONE && tok->id_bytes[i].len > tok->max_token_bytes) {
            tok->max_token_bytes = tok->id_bytes[i].len;
        }
    }
    for (size_t i = 0; i < json_array_size(added); i++) {
        size_t l = json_string_length(json_object_get(json_array_get(added, i), "content"));

        tok->max_token_bytes = l > tok->max_token_bytes ? l : tok->max_token_bytes;
    }
    status = epd_tok_load_merges(tok, json_object_get(model, "merges"), byte_of_cp);
    if (status != EPD_OK) {
        goto err;
    }
    status = epd_tok_load_added(tok, added, byte_of_cp);
    if (status != EPD_OK) {
        goto err;
    }
    for (size_t i = 0; i < tok->n_added; i++) {
        /* a decode of an added token may be longer than its content */
        tok->max_token_bytes = tok->id_bytes[tok->added[i].id].len > tok->max_token_bytes
                                   ? tok->id_bytes[tok->added[i].id].len
                                   : tok->max_token_bytes;
    }
    for (size_t i = 0; i < tok->n_post_prefix + tok->n_post_suffix; i++) {
        int32_t id =
            i < tok->n_post_prefix ? tok->post_prefix[i] : tok->post_suffix[i - tok->n_post_prefix];

        if ((uint32_t)id >= tok->n_ids || tok->id_bytes[id].off == EPD_TOK_NONE) {
            status = epd__tok_malformed("the post-processor names an id that is no token");
            goto err;
        }
    }
    tok->ignore_merges = (uint8_t)epd__tok_flag(model, "ignore_merges");
    tok->s.region = onig_region_new();
    if (tok->s.region == NULL) {
        status = EPD_ERR_NO_MEMORY;
        goto err;
    }
    if (config != NULL) {
        /* model_max_length is often 1e30 written as an integer */
        conf = json_loadb(config, config_len, JSON_DECODE_INT_AS_REAL, &jerr);
        if (!json_is_object(conf)) {
            epd_log_error(EPD_TOK_LOG, 0, "tokenizer_config.json: not a JSON object (line %d: %s)",
                          jerr.line, conf == NULL ? jerr.text : "");
            status = EPD_ERR_MALFORMED;
            goto err;
        }
        tok->bos = epd_tok_config_token(tok, conf, "bos_token");
        tok->eos = epd_tok_config_token(tok, conf, "eos_token");
        json_decref(conf);
    }
    json_decref(root);
    *tok_p = tok;
    return EPD_OK;

err:
    json_decref(conf);
    json_decref(root);
    epd_tokenizer_destroy(tok);
    return status;
}

void epd_tokenizer_destroy(epd_tokenizer_t *tok)
{
    if (tok == NULL) {
        return;
    }
    for (size_t i = 0; i < tok->n_pre; i++) {
        if (tok->pre[i].re != NULL) {
            onig_free(tok->pre[i].re);
        }
    }
    /* a Split that failed to compile is not counted in n_pre */
    if (tok->n_pre < EPD_TOK_MAX_PRE && tok->pre[tok->n_pre].re != NULL) {
        onig_free(tok->pre[tok->n_pre].re);
    }
    for (int k = 0; k < 4; k++) {
        epd_free(tok->added_sets[k].order);
    }
    epd__tok_scratch_cleanup(&tok->s);
    epd_free(tok->added);
    epd_free(tok->merge_tab);
    epd_free(tok->vocab_tab);
    epd_free(tok->vocab_bytes);
    epd_free(tok->id_special);
    epd_free(tok->id_bytes);
    epd_free(tok->pool);
    epd_free(tok);
}

/* Reads a whole file into a new buffer (the caller's). */
static epd_status_t epd_tok_read_file(const char *path, char **buf_p, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long size;

    if (f == NULL) {
        return EPD_ERR_IO;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0 ||
        (unsigned long long)size > EPD_TOK_MAX_FILE) {
        fclose(f);
        return EPD_ERR_IO;
    }
    buf = epd_malloc((size_t)size + 1);
    if (buf == NULL) {
        fclose(f);
        return EPD_ERR_NO_MEMORY;
    }
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        fclose(f);
        epd_free(buf);
        return EPD_ERR_IO;
    }
    fclose(f);
    *buf_p = buf;
    *len_p = (size_t)size;
    return EPD_OK;
}

epd_status_t epd_tokenizer_load(const char *dir, epd_tokenizer_t **tok_p)
{
    size_t plen = strlen(dir) + sizeof("/tokenizer_config.json");
    char *path = epd_malloc(plen);
    char *json = NULL, *config = NULL;
    size_t len = 0, config_len = 0;
    epd_status_t status;

    if (path == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    snprintf(path, plen, "%s/tokenizer.json", dir);
    status = epd_tok_read_file(path, &json, &len);
    if (status != EPD_OK) {
        epd_log_error(EPD_TOK_LOG, 0, "%s: cannot read (%s)", path, epd_status_string(status));
        goto out;
    }
    snprintf(path, plen, "%s/tokenizer_config.json", dir);
    if (epd_tok_read_file(path, &config, &config_len) != EPD_OK) {
        config = NULL; /* optional */
    }
    status = epd_tokenizer_create(json, len, config, config_len, tok_p);
out:
    epd_free(config);
    epd_free(json);
    epd_free(path);
    return status;
}

/* ---- queries ------------------------------------------------------------------------ */

int32_t epd_tokenizer_token_id(const epd_tokenizer_t *tok, const char *token, size_t len)
{
    int16_t byte_of_cp[512];
    uint32_t cp_of_byte[256];
    char small[256];
    char *tmp;
    long n;
    uint32_t id = EPD_TOK_NONE;

    for (size_t i = 0; i < tok->n_added; i++) {
        const epd_tok_added_t *a = &tok->added[i];

        if (a->content.len == len && memcmp(tok->pool + a->content.off, token, len) == 0) {
            return (int32_t)a->id;
        }
    }
    tmp = len <= sizeof(small) ? small : epd_malloc(len);
    if (tmp == NULL) {
        return -1;
    }
    epd_tok_byte_map(cp_of_byte, byte_of_cp);
    n = epd_tok_unbyte(byte_of_cp, token, len, tmp, len);
    if (n > 0) {
        id = epd__tok_vocab_find(tok, tmp, (size_t)n);
    }
    if (tmp != small) {
        epd_free(tmp);
    }
    return id == EPD_TOK_NONE ? -1 : (int32_t)id;
}
