/*
 * epd_tokenizer_encode.c — text to ids (the pipeline of epd_tokenizer.h).
 *
 * The text moves through the steps as spans (offset, length) of one scratch
 * arena: the normalized text is written there once, the Split steps only
 * cut spans, and a ByteLevel prefix space makes a copy of its span.  BPE
 * runs per pre-token over an array of symbols (one per byte at first) with
 * a binary heap of candidate merges keyed by (rank, position), which is the
 * order the Rust crate merges in; a popped candidate whose two symbols
 * changed since it was pushed is stale and skipped.  Every array lives in
 * the tokenizer's scratch and grows to the largest input seen, so a warm
 * tokenizer allocates nothing per call.
 */
#include <string.h>
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_tokenizer.h"
#include "epd_tokenizer_int.h"
#include "epd_utf8.h"

/* texts beyond this are refused: spans are 32-bit and normalization may
 * grow a text a few times */
#define EPD_TOK_MAX_TEXT (256u << 20)

void epd__tok_scratch_cleanup(epd_tok_scratch_t *s)
{
    epd_free(s->arena);
    epd_free(s->spans[0]);
    epd_free(s->spans[1]);
    epd_free(s->u16_in);
    epd_free(s->u16_out);
    epd_free(s->syms);
    epd_free(s->heap);
    epd_free(s->ids);
    if (s->region != NULL) {
        onig_region_free(s->region, 1);
    }
    memset(s, 0, sizeof(*s));
}

/* Grows *p (elements of `elem` bytes, *cap of them) to hold `need`. */
static epd_status_t epd_tok_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    size_t n = *cap ? *cap : 64;
    void *q;

    if (need <= *cap) {
        return EPD_OK;
    }
    while (n < need) {
        n *= 2;
    }
    q = epd_realloc(*p, n * elem);
    if (q == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    *p = q;
    *cap = n;
    return EPD_OK;
}

static epd_status_t epd_tok_push_id(epd_tok_scratch_t *s, uint32_t id)
{
    if (s->n_ids == s->ids_cap &&
        epd_tok_grow((void **)&s->ids, &s->ids_cap, s->n_ids + 1, sizeof(int32_t)) != EPD_OK) {
        return EPD_ERR_NO_MEMORY;
    }
    s->ids[s->n_ids++] = (int32_t)id;
    return EPD_OK;
}

/* Appends bytes to the arena; *off_p = where they start. */
static epd_status_t epd_tok_arena_add(epd_tok_scratch_t *s, const char *bytes, size_t len,
                                      uint32_t *off_p)
{
    if (s->arena_len + len > UINT32_MAX) {
        return EPD_ERR_TOO_LONG;
    }
    if (epd_tok_grow((void **)&s->arena, &s->arena_cap, s->arena_len + len, 1) != EPD_OK) {
        return EPD_ERR_NO_MEMORY;
    }
    if (len > 0) {
        memcpy(s->arena + s->arena_len, bytes, len);
    }
    *off_p = (uint32_t)s->arena_len;
    s->arena_len += len;
    return EPD_OK;
}

static epd_status_t epd_tok_span_push(epd_tok_scratch_t *s, int k, uint32_t off, uint32_t len)
{
    if (s->n_spans[k] == s->spans_cap[k] &&
        epd_tok_grow((void **)&s->spans[k], &s->spans_cap[k], s->n_spans[k] + 1,
                     sizeof(epd_tok_span_t)) != EPD_OK) {
        return EPD_ERR_NO_MEMORY;
    }
    s->spans[k][s->n_spans[k]].off = off;
    s->spans[k][s->n_spans[k]].len = len;
    s->n_spans[k]++;
    return EPD_OK;
}

/* ---- added tokens --------------------------------------------------------------- */

/* The leftmost, then longest, added token of `set` in p[0..len): 1 with
 * *at_p and *a_p, or 0. */
static int epd_tok_find_added(const epd_tokenizer_t *tok, const epd_tok_added_set_t *set,
                              const char *p, size_t len, size_t *at_p, const epd_tok_added_t **a_p)
{
    if (set->start[256] == 0) {
        return 0;
    }
    for (size_t i = 0; i < len; i++) {
        uint8_t b = (uint8_t)p[i];

        for (uint32_t k = set->start[b]; k < set->start[b + 1]; k++) {
            const epd_tok_added_t *a = &tok->added[set->order[k]];

            if (a->content.len <= len - i &&
                memcmp(tok->pool + a->content.off, p + i, a->content.len) == 0) {
                *at_p = i;
                *a_p = a;
                return 1;
            }
        }
    }
    return 0;
}

/* The code point of the one valid UTF-8 character p[0..n), or -1. */
static int32_t epd_tok_char_at(const char *p, size_t n)
{
    const uint8_t *u = (const uint8_t *)p;

    if (n == 0 || epd_utf8_valid_prefix(p, n) != n) {
        return -1;
    }
    switch (n) {
    case 1:
        return u[0] < 0x80 ? u[0] : -1;
    case 2:
        return u[0] >= 0xC0 && u[0] < 0xE0 ? ((u[0] & 0x1F) << 6) | (u[1] & 0x3F) : -1;
    case 3:
        return u[0] >= 0xE0 && u[0] < 0xF0
                   ? ((u[0] & 0x0F) << 12) | ((u[1] & 0x3F) << 6) | (u[2] & 0x3F)
                   : -1;
    default:
        return u[0] >= 0xF0 ? ((u[0] & 0x07) << 18) | ((u[1] & 0x3F) << 12) | ((u[2] & 0x3F) << 6) |
                                  (u[3] & 0x3F)
                            : -1;
    }
}

/* The span an added token found at p[at..at+len of a) takes: with lstrip
 * the whitespace before it too (never before p[0], where the previous
 * token ended), with rstrip the whitespace after it (White_Space, as the
 * Rust crate's char::is_whitespace).  *start_p, *stop_p: offsets in p. */
static void epd_tok_strip(const epd_tok_added_t *a, const char *p, size_t len, size_t at,
                          size_t *start_p, size_t *stop_p)
{
    size_t start = at, stop = at + a->content.len;

    while (a->lstrip && start > 0) {
        size_t k = start - 1;
        int32_t cp;

        while (k > 0 && start - k < 4 && ((uint8_t)p[k] & 0xC0) == 0x80) {
            k--;
        }
        cp = epd_tok_char_at(p + k, start - k);
        if (cp < 0 || !u_isUWhiteSpace(cp)) {
            break;
        }
        start = k;
    }
    while (a->rstrip && stop < len) {
        uint8_t b = (uint8_t)p[stop];
        size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
        int32_t cp = n <= len - stop ? epd_tok_char_at(p + stop, n) : -1;

        if (cp < 0 || !u_isUWhiteSpace(cp)) {
            break;
        }
        stop += n;
    }
    *start_p = start;
    *stop_p = stop;
}

/* ---- normalization ----------------------------------------------------------------- */

static const UNormalizer2 *epd_tok_normalizer(epd_tok_norm_kind_t kind, UErrorCode *err)
{
    switch (kind) {
    case EPD_TOK_NORM_NFC:
        return unorm2_getNFCInstance(err);
    case EPD_TOK_NORM_NFD:
        return unorm2_getNFDInstance(err);
    case EPD_TOK_NORM_NFKC:
        return unorm2_getNFKCInstance(err);
    case EPD_TOK_NORM_NFKD:
        return unorm2_getNFKDInstance(err);
    }
    return NULL;
}

/* Grows both UTF-16 buffers (they swap roles) to `need` units. */
static epd_status_t epd_tok_grow_u16(epd_tok_scratch_t *s, size_t need)
{
    size_t cap_in = s->u16_cap, cap_out = s->u16_cap;

    if (need <= s->u16_cap) {
        return EPD_OK;
    }
    if (epd_tok_grow((void **)&s->u16_in, &cap_in, need, sizeof(uint16_t)) != EPD_OK ||
        epd_tok_grow((void **)&s->u16_out, &cap_out, cap_in, sizeof(uint16_t)) != EPD_OK) {
        /* the one that grew keeps its larger block; the capacity both have
         * is still the old one */
        return EPD_ERR_NO_MEMORY;
    }
    s->u16_cap = cap_in < cap_out ? cap_in : cap_out;
    return EPD_OK;
}

/* Normalizes valid UTF-8 p[0..len) into the arena; *off_p, *len_p say
 * where.  ASCII is the same under every normalization form, so it is
 * copied as it is. */
static epd_status_t epd_tok_normalize(epd_tokenizer_t *tok, const char *p, size_t len,
                                      uint32_t *off_p, uint32_t *len_p)
{
    epd_tok_scratch_t *s = &tok->s;
    UErrorCode err = U_ZERO_ERROR;
    int32_t n16 = 0, n8 = 0;
    size_t i;
    epd_status_t status;

    for (i = 0; i < len && (uint8_t)p[i] < 0x80; i++) {
    }
    if (tok->n_norm == 0 || i == len) {
        *len_p = (uint32_t)len;
        return epd_tok_arena_add(s, p, len, off_p);
    }
    status = epd_tok_grow_u16(s, len + 1);
    if (status != EPD_OK) {
        return status;
    }
    u_strFromUTF8((UChar *)s->u16_in, (int32_t)s->u16_cap, &n16, p, (int32_t)len, &err);
    if (U_FAILURE(err)) {
        epd_log_error("tokenizer", 0, "UTF-8 to UTF-16: %s", u_errorName(err));
        return EPD_ERR_FATAL;
    }
    for (size_t k = 0; k < tok->n_norm; k++) {
        const UNormalizer2 *norm = epd_tok_normalizer(tok->norm[k], &err);
        int32_t n = 0;
        uint16_t *t;

        if (U_FAILURE(err)) {
            epd_log_error("tokenizer", 0, "ICU normalizer: %s", u_errorName(err));
            return EPD_ERR_FATAL;
        }
        n = unorm2_normalize(norm, (const UChar *)s->u16_in, n16, (UChar *)s->u16_out,
                             (int32_t)s->u16_cap, &err);
        if (err == U_BUFFER_OVERFLOW_ERROR) {
            err = U_ZERO_ERROR;
            status = epd_tok_grow_u16(s, (size_t)n + 1);
            if (status != EPD_OK) {
                return status;
            }
            n = unorm2_normalize(norm, (const UChar *)s->u16_in, n16, (UChar *)s->u16_out,
                                 (int32_t)s->u16_cap, &err);
        }
        if (U_FAILURE(err)) {
            epd_log_error("tokenizer", 0, "ICU normalize: %s", u_errorName(err));
            return EPD_ERR_FATAL;
        }
        t = s->u16_in;
        s->u16_in = s->u16_out;
        s->u16_out = t;
        n16 = n;
    }
    /* at most 3 UTF-8 bytes per UTF-16 unit */
    status = epd_tok_grow((void **)&s->arena, &s->arena_cap, s->arena_len + 3 * (size_t)n16 + 1, 1);
    if (status != EPD_OK) {
        return status;
    }
    if (s->arena_len + 3 * (size_t)n16 > UINT32_MAX) {
        return EPD_ERR_TOO_LONG;
    }
    u_strToUTF8(s->arena + s->arena_len, (int32_t)(s->arena_cap - s->arena_len), &n8,
                (const UChar *)s->u16_in, n16, &err);
    if (U_FAILURE(err)) {
        epd_log_error("tokenizer", 0, "UTF-16 to UTF-8: %s", u_errorName(err));
        return EPD_ERR_FATAL;
    }
    *off_p = (uint32_t)s->arena_len;
    *len_p = (uint32_t)n8;
    s->arena_len += (size_t)n8;
    return EPD_OK;
}

/* ---- pre-tokenizers ---------------------------------------------------------------- */

/* The pieces of one span under a Split behavior, folded as the Rust crate's
 * NormalizedString::split folds its (offsets, is_match) list. */
typedef struct {
    epd_tok_scratch_t *s;
    int out;      /* spans[out] receives */
    size_t first; /* the first piece of this span in spans[out] */
    epd_tok_behavior_t behavior;
    int prev_match;
    uint32_t pending; /* MergedWithNext: start of a match waiting for its next */
    int has_pending;
} epd_tok_fold_t;

static epd_status_t epd_tok_fold(epd_tok_fold_t *f, uint32_t start, uint32_t end, int is_match,
                                 int next_is_match, int has_next)
{
    epd_tok_scratch_t *s = f->s;
    size_t n = s->n_spans[f->out];
    epd_tok_span_t *last = n > f->first ? &s->spans[f->out][n - 1] : NULL;
    epd_status_t status = EPD_OK;

    switch (f->behavior) {
    case EPD_TOK_SPLIT_REMOVED:
        if (!is_match) {
            status = epd_tok_span_push(s, f->out, start, end - start);
        }
        break;
    case EPD_TOK_SPLIT_ISOLATED:
        status = epd_tok_span_push(s, f->out, start, end - start);
        break;
    case EPD_TOK_SPLIT_MERGED_WITH_PREVIOUS:
        if (is_match && !f->prev_match && last != NULL) {
            last->len = end - last->off;
        } else {
            status = epd_tok_span_push(s, f->out, start, end - start);
        }
        break;
    case EPD_TOK_SPLIT_CONTIGUOUS:
        if (is_match == f->prev_match && last != NULL) {
            last->len = end - last->off;
        } else {
            status = epd_tok_span_push(s, f->out, start, end - start);
        }
        break;
    case EPD_TOK_SPLIT_MERGED_WITH_NEXT:
        /* the crate folds from the right: a match joins the piece after it
         * when that piece is not a match itself */
        if (is_match && has_next && !next_is_match) {
            if (!f->has_pending) {
                f->pending = start;
                f->has_pending = 1;
            }
        } else {
            uint32_t from = f->has_pending ? f->pending : start;

            f->has_pending = 0;
            status = epd_tok_span_push(s, f->out, from, end - from);
        }
        break;
    }
    f->prev_match = is_match;
    return status;
}

/* The (start, end) matches of a step in arena[off..off+len), as the onig
 * crate's find_iter yields them (an empty match right at the end of the
 * previous one is skipped by one character); calls `emit` with the
 * alternating non-match / match segments of the Rust crate's find_matches. */
typedef struct {
    uint32_t start, end;
    int is_match;
} epd_tok_seg_t;

static long epd_tok_next_match(epd_tokenizer_t *tok, const epd_tok_pre_t *pre, uint32_t off,
                               uint32_t len, size_t from, uint32_t *ms_p, uint32_t *me_p)
{
    const char *base = tok->s.arena + off;

    if (pre->re != NULL) {
        OnigRegion *region = tok->s.region;
        int r;

        onig_region_clear(region);
        r = onig_search(pre->re, (const OnigUChar *)base, (const OnigUChar *)base + len,
                        (const OnigUChar *)base + from, (const OnigUChar *)base + len, region,
                        ONIG_OPTION_NONE);
        if (r == ONIG_MISMATCH) {
            return 0;
        }
        if (r < 0) {
            return -1;
        }
        *ms_p = (uint32_t)region->beg[0];
        *me_p = (uint32_t)region->end[0];
        return 1;
    }
    {
        const char *lit = tok->pool + pre->literal.off;
        size_t ll = pre->literal.len;

        if (ll == 0) {
            return 0; /* an empty pattern matches nothing, as in the crate */
        }
        for (size_t i = from; i + ll <= len; i++) {
            if (memcmp(base + i, lit, ll) == 0) {
                *ms_p = (uint32_t)i;
                *me_p = (uint32_t)(i + ll);
                return 1;
            }
        }
        return 0;
    }
}

static size_t epd_tok_char_len(uint8_t b)
{
    return b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

static epd_status_t epd_tok_split(epd_tokenizer_t *tok, const epd_tok_pre_t *pre,
                                  epd_tok_behavior_t behavior, int invert, uint32_t off,
                                  uint32_t len, int out)
{
    epd_tok_fold_t f = {
        .s = &tok->s, .out = out, .first = tok->s.n_spans[out], .behavior = behavior};
    /* segments are produced one ahead so that MergedWithNext sees the next */
    epd_tok_seg_t seg[3];
    int n_seg = 0;
    size_t last_end = 0, prev = 0;
    uint32_t last_match_end = 0;
    int have_last = 0, done = 0;
    epd_status_t status;

    while (!done || n_seg > 0) {
        /* refill: at most two segments (a gap and a match) per match */
        while (!done && n_seg < 2) {
            uint32_t ms, me;
            long r =
                last_end <= len ? epd_tok_next_match(tok, pre, off, len, last_end, &ms, &me) : 0;

            if (r < 0) {
                return EPD_ERR_FATAL;
            }
            if (r == 0) {
                if (prev != len || len == 0) {
                    seg[n_seg++] = (epd_tok_seg_t){(uint32_t)prev, len, 0};
                }
                prev = len;
                done = 1;
                break;
            }
            if (ms == me && have_last && last_match_end == me) {
                last_end +=
                    last_end < len ? epd_tok_char_len((uint8_t)tok->s.arena[off + last_end]) : 1;
                continue;
            }
            last_end = me;
            last_match_end = me;
            have_last = 1;
            if (prev != ms) {
                seg[n_seg++] = (epd_tok_seg_t){(uint32_t)prev, ms, 0};
            }
            seg[n_seg++] = (epd_tok_seg_t){ms, me, 1};
            prev = me;
        }
        if (n_seg == 0) {
            break;
        }
        /* the first one goes out when its successor is known (or none comes) */
        if (n_seg == 1 && !done) {
            continue;
        }
        {
            int m0 = seg[0].is_match != invert;
            int has_next = n_seg > 1;
            int m1 = has_next ? seg[1].is_match != invert : 0;

            status = epd_tok_fold(&f, off + seg[0].start, off + seg[0].end, m0, m1, has_next);
            if (status != EPD_OK) {
                return status;
            }
            memmove(&seg[0], &seg[1], (size_t)(n_seg - 1) * sizeof(seg[0]));
            n_seg--;
        }
    }
    /* pieces left empty are dropped, as the crate drops them */
    {
        epd_tok_scratch_t *s = &tok->s;
        size_t w = f.first;

        for (size_t r = f.first; r < s->n_spans[out]; r++) {
            if (s->spans[out][r].len > 0) {
                s->spans[out][w++] = s->spans[out][r];
            }
        }
        s->n_spans[out] = w;
    }
    return EPD_OK;
}

static epd_status_t epd_tok_pre_step(epd_tokenizer_t *tok, const epd_tok_pre_t *pre,
                                     epd_tok_span_t span, int out)
{
    epd_tok_scratch_t *s = &tok->s;
    epd_status_t status;

    if (pre->kind == EPD_TOK_PRE_SPLIT) {
        return epd_tok_split(tok, pre, pre->behavior, pre->invert, span.off, span.len, out);
    }
    if (pre->add_prefix_space && (span.len == 0 || s->arena[span.off] != ' ')) {
        uint32_t off;

        /* " " + the span, copied through its offset (the arena may move) */
        status = epd_tok_arena_add(s, " ", 1, &off);
        if (status == EPD_OK) {
            status = epd_tok_grow((void **)&s->arena, &s->arena_cap, s->arena_len + span.len, 1);
        }
        if (status != EPD_OK) {
            return status;
        }
        memcpy(s->arena + s->arena_len, s->arena + span.off, span.len);
        s->arena_len += span.len;
        span.off = off;
        span.len += 1;
    }
    if (pre->re != NULL) {
        return epd_tok_split(tok, pre, EPD_TOK_SPLIT_ISOLATED, 0, span.off, span.len, out);
    }
    return span.len > 0 ? epd_tok_span_push(s, out, span.off, span.len) : EPD_OK;
}

/* ---- BPE -------------------------------------------------------------------------- */

static void epd_tok_heap_push(epd_tok_heap_t *h, size_t *n, epd_tok_heap_t e)
{
    size_t i = (*n)++;

    while (i > 0) {
        size_t p = (i - 1) / 2;

        if (h[p].rank < e.rank || (h[p].rank == e.rank && h[p].pos < e.pos)) {
            break;
        }
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static epd_tok_heap_t epd_tok_heap_pop(epd_tok_heap_t *h, size_t *n)
{
    epd_tok_heap_t top = h[0], e = h[--(*n)];
    size_t i = 0;

    for (;;) {
        size_t c = 2 * i + 1;

        if (c >= *n) {
            break;
        }
        if (c + 1 < *n && (h[c + 1].rank < h[c].rank ||
                           (h[c + 1].rank == h[c].rank && h[c + 1].pos < h[c].pos))) {
            c++;
        }
        if (e.rank < h[c].rank || (e.rank == h[c].rank && e.pos <= h[c].pos)) {
            break;
        }
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) {
        h[i] = e;
    }
    return top;
}

static void epd_tok_pair(const epd_tokenizer_t *tok, epd_tok_heap_t *h, size_t *n, uint32_t pos,
                         uint32_t left, uint32_t right)
{
    const epd_tok_merge_t *m = epd__tok_merge_find(tok, left, right);

    if (m != NULL) {
        epd_tok_heap_push(h, n, (epd_tok_heap_t){m->rank, pos, left, right, m->id});
    }
}

static epd_status_t epd_tok_bpe(epd_tokenizer_t *tok, uint32_t off, uint32_t len)
{
    epd_tok_scratch_t *s = &tok->s;
    const uint8_t *p = (const uint8_t *)s->arena + off;
    size_t n_heap = 0;
    epd_status_t status;

    if (len == 1) {
        return epd_tok_push_id(s, tok->byte_id[p[0]]);
    }
    if (tok->ignore_merges) {
        uint32_t id = epd__tok_vocab_find(tok, (const char *)p, len);

        if (id != EPD_TOK_NONE) {
            return epd_tok_push_id(s, id);
        }
    }
    /* every merge adds at most two candidates to the len - 1 first ones */
    if (epd_tok_grow((void **)&s->syms, &s->syms_cap, len, sizeof(epd_tok_sym_t)) != EPD_OK ||
        epd_tok_grow((void **)&s->heap, &s->heap_cap, 3 * (size_t)len, sizeof(epd_tok_heap_t)) !=
            EPD_OK) {
        return EPD_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < len; i++) {
        s->syms[i].id = tok->byte_id[p[i]];
        s->syms[i].prev = (int32_t)i - 1;
        s->syms[i].next = i + 1 < len ? (int32_t)i + 1 : -1;
        s->syms[i].len = 1;
    }
    for (uint32_t i = 0; i + 1 < len; i++) {
        epd_tok_pair(tok, s->heap, &n_heap, i, s->syms[i].id, s->syms[i + 1].id);
    }
    while (n_heap > 0) {
        epd_tok_heap_t top = epd_tok_heap_pop(s->heap, &n_heap);
        epd_tok_sym_t *a = &s->syms[top.pos];
        epd_tok_sym_t *b;

        if (a->len == 0 || a->next < 0 || a->id != top.left) {
            continue;
        }
        b = &s->syms[a->next];
        if (b->id != top.right) {
            continue;
        }
        a->id = top.id;
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (a->next >= 0) {
            s->syms[a->next].prev = (int32_t)top.pos;
        }
        if (a->prev >= 0) {
            epd_tok_pair(tok, s->heap, &n_heap, (uint32_t)a->prev, s->syms[a->prev].id, a->id);
        }
        if (a->next >= 0) {
            epd_tok_pair(tok, s->heap, &n_heap, top.pos, a->id, s->syms[a->next].id);
        }
    }
    for (int32_t i = 0; i >= 0; i = s->syms[i].next) {
        status = epd_tok_push_id(s, s->syms[i].id);
        if (status != EPD_OK) {
            return status;
        }
    }
    return EPD_OK;
}

/* ---- the pipeline ------------------------------------------------------------------- */

/* Pre-tokenizes and BPE-encodes arena[off..off+len) (normalized text with
 * no added tokens in it). */
static epd_status_t epd_tok_encode_piece(epd_tokenizer_t *tok, uint32_t off, uint32_t len)
{
    epd_tok_scratch_t *s = &tok->s;
    int in = 0;
    epd_status_t status;

    s->n_spans[0] = 0;
    status = epd_tok_span_push(s, 0, off, len);
    for (size_t k = 0; k < tok->n_pre && status == EPD_OK; k++) {
        s->n_spans[1 - in] = 0;
        for (size_t i = 0; i < s->n_spans[in] && status == EPD_OK; i++) {
            status = epd_tok_pre_step(tok, &tok->pre[k], s->spans[in][i], 1 - in);
        }
        in = 1 - in;
    }
    for (size_t i = 0; i < s->n_spans[in] && status == EPD_OK; i++) {
        status = epd_tok_bpe(tok, s->spans[in][i].off, s->spans[in][i].len);
    }
    return status;
}

/* A valid UTF-8 run of the text between raw-text added tokens: normalize,
 * then cut out the added tokens matched on normalized text. */
static epd_status_t epd_tok_encode_valid(epd_tokenizer_t *tok, const char *p, size_t len,
                                         unsigned flags)
{
    const epd_tok_added_set_t *set =
        &tok->added_sets[(flags & EPD_TOKENIZE_SPECIAL_AS_TEXT) ? 3 : 2];
    uint32_t off, n, done = 0;
    epd_status_t status;

    status = epd_tok_normalize(tok, p, len, &off, &n);
    while (status == EPD_OK && done < n) {
        size_t at;
        const epd_tok_added_t *a;

        size_t start, stop;

        if (!epd_tok_find_added(tok, set, tok->s.arena + off + done, n - done, &at, &a)) {
            status = epd_tok_encode_piece(tok, off + done, n - done);
            break;
        }
        epd_tok_strip(a, tok->s.arena + off + done, n - done, at, &start, &stop);
        if (start > 0) {
            status = epd_tok_encode_piece(tok, off + done, (uint32_t)start);
        }
        if (status == EPD_OK) {
            status = epd_tok_push_id(&tok->s, a->id);
        }
        done += (uint32_t)stop;
    }
    return status;
}

/* Text between raw-text added tokens: valid runs go through the pipeline,
 * each invalid byte is its own ByteLevel token. */
static epd_status_t epd_tok_encode_raw(epd_tokenizer_t *tok, const char *p, size_t len,
                                       unsigned flags)
{
    size_t i = 0;
    epd_status_t status = EPD_OK;

    while (i < len && status == EPD_OK) {
        size_t v = epd_utf8_valid_prefix(p + i, len - i);

        if (v > 0) {
            status = epd_tok_encode_valid(tok, p + i, v, flags);
            i += v;
        } else {
            status = epd_tok_push_id(&tok->s, tok->byte_id[(uint8_t)p[i]]);
            i++;
        }
    }
    return status;
}

epd_status_t epd_tokenizer_encode(epd_tokenizer_t *tok, const char *text, size_t len,
                                  unsigned flags, int32_t *ids, size_t cap, size_t *n_p)
{
    epd_tok_scratch_t *s = &tok->s;
    const epd_tok_added_set_t *set =
        &tok->added_sets[(flags & EPD_TOKENIZE_SPECIAL_AS_TEXT) ? 1 : 0];
    size_t done = 0;
    epd_status_t status = EPD_OK;

    if (len > EPD_TOK_MAX_TEXT) {
        return EPD_ERR_INVALID_PARAM;
    }
    s->n_ids = 0;
    s->arena_len = 0;
    if (flags & EPD_TOKENIZE_ADD_SPECIAL) {
        for (size_t i = 0; i < tok->n_post_prefix && status == EPD_OK; i++) {
            status = epd_tok_push_id(s, (uint32_t)tok->post_prefix[i]);
        }
    }
    while (status == EPD_OK && done < len) {
        size_t at;
        const epd_tok_added_t *a;

        size_t start, stop;

        if (!epd_tok_find_added(tok, set, text + done, len - done, &at, &a)) {
            status = epd_tok_encode_raw(tok, text + done, len - done, flags);
            break;
        }
        epd_tok_strip(a, text + done, len - done, at, &start, &stop);
        status = epd_tok_encode_raw(tok, text + done, start, flags);
        if (status == EPD_OK) {
            status = epd_tok_push_id(s, a->id);
        }
        done += stop;
    }
    if (flags & EPD_TOKENIZE_ADD_SPECIAL) {
        for (size_t i = 0; i < tok->n_post_suffix && status == EPD_OK; i++) {
            status = epd_tok_push_id(s, (uint32_t)tok->post_suffix[i]);
        }
    }
    if (status != EPD_OK) {
        return status;
    }
    if (s->n_ids > 0 && cap > 0) {
        memcpy(ids, s->ids, (s->n_ids < cap ? s->n_ids : cap) * sizeof(int32_t));
    }
    *n_p = s->n_ids;
    return s->n_ids <= cap ? EPD_OK : EPD_ERR_TOO_LONG;
}
