/*
 * libFuzzer target for the tokenizer (engine/epd_tokenizer*.c): the input
 * is a tokenizer.json, a NUL byte, then a text.  Any tokenizer.json is
 * either refused with a status or loads; a loaded one encodes the text
 * (any bytes, with the flags its first byte picks) the same way twice,
 * every id decodes, and the streaming decoder's output is the one-shot
 * decode byte for byte.  `make fuzz`; the seeds in
 * tests/fuzz/corpus/fuzz_epd_tokenizer are small byte-level BPEs with
 * every part the loader reads.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t json_len = nul != NULL ? (size_t)(nul - data) : size;
    const char *text = nul != NULL ? (const char *)nul + 1 : "";
    size_t text_len = nul != NULL ? size - json_len - 1 : 0;
    unsigned flags = text_len > 0 ? (uint8_t)text[0] & 3u : 0;
    epd_tokenizer_t *tok = NULL;
    int32_t *ids = NULL, *ids2 = NULL;
    char *one = NULL, *streamed = NULL;
    size_t n = 0, n2 = 0, cap = 4 * text_len + 64, len = 0, slen = 0;
    epd_tokenizer_stream_t st;

    epd_log_set_level(EPD_LOG_ERROR);
    if (epd_tokenizer_create((const char *)data, json_len, NULL, 0, &tok) != EPD_OK) {
        return 0;
    }
    ids = epd_malloc(cap * sizeof(int32_t));
    ids2 = epd_malloc(cap * sizeof(int32_t));
    if (ids == NULL || ids2 == NULL ||
        epd_tokenizer_encode(tok, text, text_len, flags, ids, cap, &n) != EPD_OK) {
        goto out;
    }
    if (epd_tokenizer_encode(tok, text, text_len, flags, ids2, cap, &n2) != EPD_OK || n2 != n ||
        memcmp(ids, ids2, n * sizeof(int32_t)) != 0) {
        abort(); /* the same text, other ids */
    }
    if (epd_tokenizer_decode(tok, ids, n, 0, NULL, 0, &len) != EPD_ERR_TOO_LONG && len > 0) {
        abort();
    }
    one = epd_malloc(len + 1);
    streamed = epd_malloc(len + epd_tokenizer_max_token_bytes(tok) + 8);
    if (one == NULL || streamed == NULL ||
        epd_tokenizer_decode(tok, ids, n, 0, one, len, &len) != EPD_OK) {
        goto out;
    }
    epd_tokenizer_stream_init(&st, 0);
    for (size_t i = 0; i <= n; i++) {
        size_t got = 0;
        size_t room = epd_tokenizer_max_token_bytes(tok) + 4;
        epd_status_t status =
            i < n ? epd_tokenizer_stream_push(tok, &st, ids[i], streamed + slen, room, &got)
                  : epd_tokenizer_stream_finish(&st, streamed + slen, room, &got);

        if (status != EPD_OK || slen + got > len) {
            abort(); /* a buffer of max_token_bytes + 3 always suffices */
        }
        slen += got;
    }
    if (slen != len || memcmp(one, streamed, len) != 0) {
        abort(); /* the stream is not the one-shot decode */
    }
out:
    epd_free(streamed);
    epd_free(one);
    epd_free(ids2);
    epd_free(ids);
    epd_tokenizer_destroy(tok);
    return 0;
}
