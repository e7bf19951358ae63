/*
 * epd_tokenizer_tab.c — a tokenizer's string pool and its two hash tables
 * (vocabulary bytes -> id, (id, id) -> merge), and the GPT-2 pre-tokenizer
 * pattern: what the loader (epd_tokenizer.c), the pipeline reader
 * (epd_tokenizer_json.c) and the encoder (epd_tokenizer_encode.c) share,
 * below all three.
 */
#include <stdint.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_hash.h"
#include "epd_tokenizer_int.h"

const char epd__tok_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- pool and tables -------------------------------------------------------- */

epd_status_t epd__tok_pool_add(epd_tokenizer_t *tok, const void *bytes, size_t len,
                               epd_tok_str_t *str_p)
{
    if (len > UINT32_MAX || tok->pool_len + len > UINT32_MAX) {
        return EPD_ERR_TOO_LONG;
    }
    if (tok->pool_len + len > tok->pool_cap) {
        size_t cap = tok->pool_cap ? tok->pool_cap * 2 : 1 << 16;
        char *p;

        while (cap < tok->pool_len + len) {
            cap *= 2;
        }
        p = epd_realloc(tok->pool, cap);
        if (p == NULL) {
            return EPD_ERR_NO_MEMORY;
        }
        tok->pool = p;
        tok->pool_cap = cap;
    }
    if (len > 0) {
        memcpy(tok->pool + tok->pool_len, bytes, len);
    }
    str_p->off = (uint32_t)tok->pool_len;
    str_p->len = (uint32_t)len;
    tok->pool_len += len;
    return EPD_OK;
}

static uint32_t epd_tok_bytes_hash(const char *bytes, size_t len)
{
    return (uint32_t)epd_hash64(bytes, len, 0x746f6b);
}

uint32_t epd__tok_vocab_find(const epd_tokenizer_t *tok, const char *bytes, size_t len)
{
    uint32_t i = epd_tok_bytes_hash(bytes, len) & tok->vocab_mask;

    for (;;) {
        uint32_t id = tok->vocab_tab[i];
        const epd_tok_str_t *s;

        if (id == EPD_TOK_NONE) {
            return EPD_TOK_NONE;
        }
        s = &tok->vocab_bytes[id];
        if (s->len == len && memcmp(tok->pool + s->off, bytes, len) == 0) {
            return id;
        }
        i = (i + 1) & tok->vocab_mask;
    }
}

/* Inserts id (whose bytes are vocab_bytes[id]); a second id with the same
 * bytes (impossible for a well-formed file) keeps the first. */
void epd__tok_vocab_insert(epd_tokenizer_t *tok, uint32_t id)
{
    const epd_tok_str_t *s = &tok->vocab_bytes[id];
    uint32_t i = epd_tok_bytes_hash(tok->pool + s->off, s->len) & tok->vocab_mask;

    while (tok->vocab_tab[i] != EPD_TOK_NONE) {
        const epd_tok_str_t *o = &tok->vocab_bytes[tok->vocab_tab[i]];

        if (o->len == s->len && memcmp(tok->pool + o->off, tok->pool + s->off, s->len) == 0) {
            return;
        }
        i = (i + 1) & tok->vocab_mask;
    }
    tok->vocab_tab[i] = id;
}

const epd_tok_merge_t *epd__tok_merge_find(const epd_tokenizer_t *tok, uint32_t a, uint32_t b)
{
    uint64_t key = epd__tok_pair_key(a, b);
    uint32_t i = epd__tok_mix64(key) & tok->merge_mask;

    for (;;) {
        const epd_tok_merge_t *m = &tok->merge_tab[i];

        if (m->key == key) {
            return m;
        }
        if (m->id == EPD_TOK_NONE) {
            return NULL;
        }
        i = (i + 1) & tok->merge_mask;
    }
}

void epd__tok_merge_insert(epd_tokenizer_t *tok, uint32_t a, uint32_t b, uint32_t rank,
                           uint32_t id)
{
    uint64_t key = epd__tok_pair_key(a, b);
    uint32_t i = epd__tok_mix64(key) & tok->merge_mask;

    while (tok->merge_tab[i].id != EPD_TOK_NONE && tok->merge_tab[i].key != key) {
        i = (i + 1) & tok->merge_mask;
    }
    tok->merge_tab[i].key = key;
    tok->merge_tab[i].rank = rank; /* a pair listed again: the later rank, as the Rust map */
    tok->merge_tab[i].id = id;
}
