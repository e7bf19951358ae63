/*
 * epd_tokenizer_int.h — the tokenizer's tables, shared by its loader
 * (epd_tokenizer.c) and its encoder (epd_tokenizer_encode.c).
 */
#ifndef EPD_TOKENIZER_INT_H
#define EPD_TOKENIZER_INT_H

/* oniguruma.h defines UChar, ICU's UTF-16 unit, unless told not to */
#define ONIG_ESCAPE_UCHAR_COLLISION 1
#include <jansson.h>
#include <oniguruma.h>
#include <stddef.h>
#include <stdint.h>

#include "epd_tokenizer.h"

#define EPD_TOK_NONE UINT32_MAX
/* ids beyond this are refused (the largest vocabularies are ~256 k) */
#define EPD_TOK_MAX_IDS (1u << 24)

/* a byte string in the tokenizer's pool */
typedef struct {
    uint32_t off;
    uint32_t len;
} epd_tok_str_t;

/* (left id, right id) -> (rank, merged id); key EPD_TOK_NONE<<32|.. = empty */
typedef struct {
    uint64_t key;
    uint32_t rank;
    uint32_t id;
} epd_tok_merge_t;

typedef struct {
    uint32_t id;
    epd_tok_str_t content; /* the raw UTF-8 text that is matched */
    uint8_t special;
    uint8_t normalized; /* matched on the normalized text */
    uint8_t lstrip;     /* takes the whitespace before it */
    uint8_t rstrip;     /* takes the whitespace after it */
} epd_tok_added_t;

/* One set of added tokens matched together: indices into tok->added,
 * bucketed by first byte, longest first within a bucket. */
typedef struct {
    uint32_t *order;     /* [n] */
    uint32_t start[257]; /* bucket b is order[start[b]..start[b+1]) */
} epd_tok_added_set_t;

typedef enum {
    EPD_TOK_NORM_NFC,
    EPD_TOK_NORM_NFD,
    EPD_TOK_NORM_NFKC,
    EPD_TOK_NORM_NFKD,
} epd_tok_norm_kind_t;

typedef enum {
    EPD_TOK_SPLIT_REMOVED,
    EPD_TOK_SPLIT_ISOLATED,
    EPD_TOK_SPLIT_MERGED_WITH_PREVIOUS,
    EPD_TOK_SPLIT_MERGED_WITH_NEXT,
    EPD_TOK_SPLIT_CONTIGUOUS,
} epd_tok_behavior_t;

typedef enum {
    EPD_TOK_PRE_SPLIT,     /* regex (re) or literal string (literal) */
    EPD_TOK_PRE_BYTELEVEL, /* prefix space; the GPT-2 regex when re != NULL */
} epd_tok_pre_kind_t;

typedef struct {
    epd_tok_pre_kind_t kind;
    OnigRegex re;          /* owned; NULL for a literal split / ByteLevel without regex */
    epd_tok_str_t literal; /* a Split's String pattern */
    epd_tok_behavior_t behavior;
    uint8_t invert;
    uint8_t add_prefix_space;
} epd_tok_pre_t;

#define EPD_TOK_MAX_NORM 8
#define EPD_TOK_MAX_PRE 8
#define EPD_TOK_MAX_POST_IDS 16

/* a piece of the text on its way through the pre-tokenizers: bytes
 * arena[off..off+len) of the encoder's scratch arena */
typedef struct {
    uint32_t off;
    uint32_t len;
} epd_tok_span_t;

/* BPE symbol: a run of bytes of the pre-token with its current id */
typedef struct {
    uint32_t id;
    int32_t prev;
    int32_t next;
    uint32_t len; /* 0: merged into its left neighbour */
} epd_tok_sym_t;

typedef struct {
    uint32_t rank;
    uint32_t pos; /* index of the left symbol */
    uint32_t left;
    uint32_t right; /* ids of the pair when pushed, to skip stale entries */
    uint32_t id;    /* the merged id */
} epd_tok_heap_t;

/* growable scratch arrays, reused across calls */
typedef struct {
    char *arena;
    size_t arena_len, arena_cap;
    epd_tok_span_t *spans[2];
    size_t n_spans[2], spans_cap[2];
    uint16_t *u16_in, *u16_out; /* both of u16_cap units */
    size_t u16_cap;
    epd_tok_sym_t *syms;
    size_t syms_cap;
    epd_tok_heap_t *heap;
    size_t heap_cap;
    int32_t *ids;
    size_t n_ids, ids_cap;
    OnigRegion *region;
} epd_tok_scratch_t;

struct epd_tokenizer {
    /* all byte strings (token bytes, added contents, split literals) */
    char *pool;
    size_t pool_len, pool_cap;

    uint32_t n_ids;          /* one past the largest id */
    epd_tok_str_t *id_bytes; /* [n_ids] what decoding gives; off EPD_TOK_NONE: no token */
    uint8_t *id_special;     /* [n_ids] 1: a special added token */
    size_t max_token_bytes;

    /* model vocabulary: bytes -> id (open addressing, ids; EPD_TOK_NONE empty) */
    uint32_t *vocab_tab;
    epd_tok_str_t *vocab_bytes; /* [n_ids] the model's own bytes of each id (for lookups) */
    uint32_t vocab_mask;
    uint32_t byte_id[256]; /* the id of each single byte */
    uint8_t ignore_merges;

    epd_tok_merge_t *merge_tab;
    uint32_t merge_mask;

    epd_tok_added_t *added;
    size_t n_added;
    /* [0] raw-text tokens, all; [1] raw-text non-special; [2] normalized, all;
     * [3] normalized non-special */
    epd_tok_added_set_t added_sets[4];

    epd_tok_norm_kind_t norm[EPD_TOK_MAX_NORM];
    size_t n_norm;

    epd_tok_pre_t pre[EPD_TOK_MAX_PRE];
    size_t n_pre;

    int32_t post_prefix[EPD_TOK_MAX_POST_IDS];
    size_t n_post_prefix;
    int32_t post_suffix[EPD_TOK_MAX_POST_IDS];
    size_t n_post_suffix;

    int32_t bos, eos;

    epd_tok_scratch_t s;
};

/* the vocabulary lookup: id of bytes[0..len), or EPD_TOK_NONE */
uint32_t epd__tok_vocab_find(const epd_tokenizer_t *tok, const char *bytes, size_t len);

/* Inserts id (whose bytes are vocab_bytes[id]) into the vocabulary table;
 * a second id with the same bytes keeps the first. */
void epd__tok_vocab_insert(epd_tokenizer_t *tok, uint32_t id);

/* Inserts the merge (a, b) -> id at rank; a pair listed again takes the
 * later rank, as the Rust crate's map does. */
void epd__tok_merge_insert(epd_tokenizer_t *tok, uint32_t a, uint32_t b, uint32_t rank,
                           uint32_t id);

/* the merge of (a, b), or NULL */
const epd_tok_merge_t *epd__tok_merge_find(const epd_tokenizer_t *tok, uint32_t a, uint32_t b);

static inline uint64_t epd__tok_pair_key(uint32_t a, uint32_t b)
{
    return ((uint64_t)a << 32) | b;
}

static inline uint32_t epd__tok_mix64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return (uint32_t)k;
}

/* Appends bytes[0..len) to the tokenizer's pool; *str_p says where. */
epd_status_t epd__tok_pool_add(epd_tokenizer_t *tok, const void *bytes, size_t len,
                               epd_tok_str_t *str_p);

/* Reads the model's options, normalizer, pre_tokenizer, post_processor and
 * decoder of a tokenizer.json (root, borrowed) into tok
 * (epd_tokenizer_json.c). */
epd_status_t epd__tok_parse_pipeline(epd_tokenizer_t *tok, const json_t *root);

/* log and return: a part this tokenizer does not support / a broken file */
epd_status_t epd__tok_unsupported(const char *what, const char *name);
epd_status_t epd__tok_malformed(const char *what);
int epd__tok_flag(const json_t *obj, const char *key);

/* the encoder's scratch: cleanup frees it */
void epd__tok_scratch_cleanup(epd_tok_scratch_t *s);

/* The GPT-2 pattern of the ByteLevel pre-tokenizer (use_regex). */
extern const char epd__tok_gpt2_pattern[];

#endif
