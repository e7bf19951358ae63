/*
 * epd_tokenizer_decode.c — ids back to bytes: one-shot and streaming, and
 * the small queries of a loaded tokenizer.
 *
 * Each id's bytes were made at load (epd_tokenizer.c: the ByteLevel map
 * applied once), so decoding is a copy per id.  The stream holds back the
 * bytes of a character that an id left unfinished (a 4-byte emoji is often
 * two or three byte-level tokens) so that what it hands out can be shown
 * at once; bytes that can never finish a character are not held.
 */
#include <string.h>

#include "epd_tokenizer.h"
#include "epd_tokenizer_int.h"
#include "epd_utf8.h"

uint32_t epd_tokenizer_n_ids(const epd_tokenizer_t *tok)
{
    return tok->n_ids;
}

size_t epd_tokenizer_max_token_bytes(const epd_tokenizer_t *tok)
{
    return tok->max_token_bytes;
}

int32_t epd_tokenizer_bos(const epd_tokenizer_t *tok)
{
    return tok->bos;
}

int32_t epd_tokenizer_eos(const epd_tokenizer_t *tok)
{
    return tok->eos;
}

const char *epd_tokenizer_id_bytes(const epd_tokenizer_t *tok, int32_t id, size_t *len_p,
                                   int *special_p)
{
    if (id < 0 || (uint32_t)id >= tok->n_ids || tok->id_bytes[id].off == EPD_TOK_NONE) {
        return NULL;
    }
    *len_p = tok->id_bytes[id].len;
    if (special_p != NULL) {
        *special_p = tok->id_special[id];
    }
    return tok->pool + tok->id_bytes[id].off;
}

epd_status_t epd_tokenizer_decode(const epd_tokenizer_t *tok, const int32_t *ids, size_t n,
                                  unsigned flags, char *buf, size_t cap, size_t *len_p)
{
    size_t len = 0;

    for (size_t i = 0; i < n; i++) {
        size_t l;
        int special;
        const char *b = epd_tokenizer_id_bytes(tok, ids[i], &l, &special);

        if (b == NULL) {
            return EPD_ERR_OUT_OF_RANGE;
        }
        if (special && (flags & EPD_DETOKENIZE_SKIP_SPECIAL)) {
            continue;
        }
        if (l > 0 && len + l <= cap) {
            memcpy(buf + len, b, l);
        }
        len += l;
    }
    *len_p = len;
    return len <= cap ? EPD_OK : EPD_ERR_TOO_LONG;
}

void epd_tokenizer_stream_init(epd_tokenizer_stream_t *st, unsigned flags)
{
    memset(st, 0, sizeof(*st));
    st->flags = flags;
}

epd_status_t epd_tokenizer_stream_push(const epd_tokenizer_t *tok, epd_tokenizer_stream_t *st,
                                       int32_t id, char *buf, size_t cap, size_t *len_p)
{
    size_t l, n, tail;
    int special;
    const char *b = epd_tokenizer_id_bytes(tok, id, &l, &special);

    if (b == NULL) {
        return EPD_ERR_OUT_OF_RANGE;
    }
    if (special && (st->flags & EPD_DETOKENIZE_SKIP_SPECIAL)) {
        l = 0;
    }
    n = st->n_held + l;
    if (n > cap) {
        return EPD_ERR_TOO_LONG;
    }
    memcpy(buf, st->held, st->n_held);
    memcpy(buf + st->n_held, b, l);
    /* the unfinished character at the end, if any, waits for the next id */
    tail = epd_utf8_incomplete_tail(buf, n);
    memcpy(st->held, buf + n - tail, tail);
    st->n_held = tail;
    *len_p = n - tail;
    return EPD_OK;
}

epd_status_t epd_tokenizer_stream_finish(epd_tokenizer_stream_t *st, char *buf, size_t cap,
                                         size_t *len_p)
{
    if (st->n_held > cap) {
        return EPD_ERR_TOO_LONG;
    }
    memcpy(buf, st->held, st->n_held);
    *len_p = st->n_held;
    st->n_held = 0;
    return EPD_OK;
}
