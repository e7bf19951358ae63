/*
 * epd_openai_logprobs.c — the "logprobs" object of an answer, in OpenAI's
 * shapes (design: epd_openai.h, epd_oai_logprobs_encode):
 *
 *   completions  {"tokens": [T], "token_logprobs": [F], "top_logprobs":
 *                [{T: F, ...}], "text_offset": [N]}
 *   chat         {"content": [{"token": T, "logprob": F, "bytes": [B],
 *                "top_logprobs": [{"token": T, "logprob": F, "bytes":
 *                [B]}]}], "refusal": null}
 *
 * T is a token's bytes when they are UTF-8, else OpenAI's "bytes:\\xNN..."
 * notation (a byte-level token holding part of a character), B its raw
 * bytes, F a log-probability written with 17 significant digits (the
 * double round-trips), N the byte offset of the token's text in the
 * concatenated tokens.  Through the JSON writer of epd_openai_json.c.
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_openai_int.h"
#include "epd_utf8.h"

static void epd_oai_w_double(epd__oai_writer_t *w, double v)
{
    char num[40];
    int n;

    /* a JSON number: finite always (log-softmax of finite logits; a
     * -inf is written as the most negative double) */
    if (!(v >= -1.7976931348623157e308)) {
        v = -1.7976931348623157e308;
    }
    n = snprintf(num, sizeof(num), "%.17g", v);
    epd__oai_w_put(w, num, (size_t)n);
}

/* a token's bytes as a JSON string, repaired (scratch grows as needed) */
static void epd_oai_w_token(epd__oai_writer_t *w, const char *b, size_t len, epd_oai_buf_t *scr)
{
    size_t flen = 0;

    scr->len = 0;
    if (epd__oai_buf_reserve(scr, EPD_UTF8_REPAIR_MAX(len) + 1) != 0) {
        w->failed = 1;
        return;
    }
    if (len > 0 && epd_utf8_repair(b, len, scr->data, EPD_UTF8_REPAIR_MAX(len), &flen) != EPD_OK) {
        w->failed = 1;
        return;
    }
    if (flen != len || memcmp(scr->data, b, len) != 0) {
        /* not UTF-8 by itself (a piece of a character): OpenAI's notation,
         * "bytes:\\xNN...", so that no two such tokens read the same */
        char hex[5];

        scr->len = 0;
        if (epd__oai_buf_reserve(scr, 6 + 4 * len) != 0) {
            w->failed = 1;
            return;
        }
        memcpy(scr->data, "bytes:", 6);
        flen = 6;
        for (size_t i = 0; i < len; i++) {
            snprintf(hex, sizeof(hex), "\\x%02x", (unsigned char)b[i]);
            memcpy(scr->data + flen, hex, 4);
            flen += 4;
        }
    }
    epd__oai_w_str(w, scr->data, flen);
}

static void epd_oai_w_bytes(epd__oai_writer_t *w, const char *b, size_t len)
{
    epd__oai_w_puts(w, "[");
    for (size_t i = 0; i < len; i++) {
        if (i > 0) {
            epd__oai_w_puts(w, ",");
        }
        epd__oai_w_int(w, (unsigned char)b[i]);
    }
    epd__oai_w_puts(w, "]");
}

epd_status_t epd_oai_logprobs_encode(epd_oai_kind_t kind, const epd_oai_token_lp_t *toks, size_t n,
                                     epd_oai_buf_t *out)
{
    epd_oai_buf_t scr = EPD_OAI_BUF_INIT;
    epd__oai_writer_t w;
    size_t off = 0;
    epd_status_t st;

    if (toks == NULL && n > 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    epd__oai_w_begin(&w, out);
    if (kind == EPD_OAI_CHAT) {
        epd__oai_w_puts(&w, "{\"content\":[");
        for (size_t i = 0; i < n; i++) {
            const epd_oai_token_lp_t *t = &toks[i];

            epd__oai_w_puts(&w, i > 0 ? ",{\"token\":" : "{\"token\":");
            epd_oai_w_token(&w, t->bytes, t->len, &scr);
            epd__oai_w_puts(&w, ",\"logprob\":");
            epd_oai_w_double(&w, t->logprob);
            epd__oai_w_puts(&w, ",\"bytes\":");
            epd_oai_w_bytes(&w, t->bytes, t->len);
            epd__oai_w_puts(&w, ",\"top_logprobs\":[");
            for (uint32_t j = 0; j < t->n_top; j++) {
                epd__oai_w_puts(&w, j > 0 ? ",{\"token\":" : "{\"token\":");
                epd_oai_w_token(&w, t->top_bytes[j], t->top_len[j], &scr);
                epd__oai_w_puts(&w, ",\"logprob\":");
                epd_oai_w_double(&w, t->top_logprob[j]);
                epd__oai_w_puts(&w, ",\"bytes\":");
                epd_oai_w_bytes(&w, t->top_bytes[j], t->top_len[j]);
                epd__oai_w_puts(&w, "}");
            }
            epd__oai_w_puts(&w, "]}");
        }
        epd__oai_w_puts(&w, "],\"refusal\":null}");
    } else {
        epd__oai_w_puts(&w, "{\"tokens\":[");
        for (size_t i = 0; i < n; i++) {
            epd__oai_w_puts(&w, i > 0 ? "," : "");
            epd_oai_w_token(&w, toks[i].bytes, toks[i].len, &scr);
        }
        epd__oai_w_puts(&w, "],\"token_logprobs\":[");
        for (size_t i = 0; i < n; i++) {
            epd__oai_w_puts(&w, i > 0 ? "," : "");
            epd_oai_w_double(&w, toks[i].logprob);
        }
        epd__oai_w_puts(&w, "],\"top_logprobs\":[");
        for (size_t i = 0; i < n; i++) {
            epd__oai_w_puts(&w, i > 0 ? ",{" : "{");
            for (uint32_t j = 0; j < toks[i].n_top; j++) {
                epd__oai_w_puts(&w, j > 0 ? "," : "");
                epd_oai_w_token(&w, toks[i].top_bytes[j], toks[i].top_len[j], &scr);
                epd__oai_w_puts(&w, ":");
                epd_oai_w_double(&w, toks[i].top_logprob[j]);
            }
            epd__oai_w_puts(&w, "}");
        }
        epd__oai_w_puts(&w, "],\"text_offset\":[");
        for (size_t i = 0; i < n; i++) {
            epd__oai_w_puts(&w, i > 0 ? "," : "");
            epd__oai_w_int(&w, (int64_t)off);
            off += toks[i].len;
        }
        epd__oai_w_puts(&w, "]}");
    }
    st = epd__oai_w_end(&w);
    epd_oai_buf_cleanup(&scr);
    return st;
}

epd_status_t epd_oai_splice_logprobs(epd_oai_buf_t *buf, size_t from, const char *frag,
                                     size_t frag_len)
{
    static const char key[] = "\"logprobs\":null";
    char *at;
    size_t tail;

    if (buf == NULL || buf->data == NULL || from > buf->len || frag == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    /* the first occurrence is the structural one: text inside a JSON string
     * has its quotes escaped, so it cannot spell the key */
    if (strstr(buf->data + from, key) == NULL) {
        return EPD_ERR_NOT_FOUND;
    }
    if (epd__oai_buf_reserve(buf, frag_len) != 0) {
        return EPD_ERR_NO_MEMORY;
    }
    /* (after the reserve, which may move the data): at "null" */
    at = strstr(buf->data + from, key) + sizeof(key) - 1 - 4;
    tail = buf->len - (size_t)(at + 4 - buf->data);
    memmove(at + frag_len, at + 4, tail + 1);
    memcpy(at, frag, frag_len);
    buf->len = buf->len - 4 + frag_len;
    return EPD_OK;
}
