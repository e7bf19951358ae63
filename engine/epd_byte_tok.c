/*
 * epd_byte_tok.c — the byte-level tokenizer of the built-in ref and sim
 * engines (one token per byte), below them and the engine registry.
 */
#include <stddef.h>
#include <stdint.h>

#include "epd_engine_int.h"

epd_status_t epd__byte_tokenize(int32_t bos, const char *text, size_t len, int add_bos,
                                int32_t *tokens, size_t cap, size_t *n_p)
{
    size_t n = len + (add_bos ? 1 : 0);
    size_t j = 0;

    if (n > cap) {
        return EPD_ERR_TOO_LONG;
    }
    if (add_bos) {
        tokens[j++] = bos;
    }
    for (size_t i = 0; i < len; i++) {
        tokens[j++] = (unsigned char)text[i];
    }
    *n_p = n;
    return EPD_OK;
}

epd_status_t epd__byte_detokenize(const int32_t *tokens, size_t n, char *buf, size_t cap,
                                  size_t *len_p)
{
    size_t len = 0;

    for (size_t i = 0; i < n; i++) {
        if (tokens[i] >= 0 && tokens[i] < 256) {
            if (len == cap) {
                return EPD_ERR_TOO_LONG;
            }
            buf[len++] = (char)tokens[i];
        }
    }
    *len_p = len;
    return EPD_OK;
}
