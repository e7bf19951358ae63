/*
 * epd_openai_int.h — the OpenAI layer's internals, shared by its files
 * (the API and its design are in epd_openai.h):
 *
 *   epd_openai_json.c    output buffers, the JSON writer every encoder
 *                        uses, error objects
 *   epd_openai_scan.c    the limits of a body's JSON, checked on its bytes
 *                        before it is parsed
 *   epd_openai_parse.c   request bodies: parsing and validation (jansson)
 *   epd_openai_fields.c  the table of top-level fields: implemented,
 *                        accepted without effect, or refused (400)
 *   epd_openai_encode.c  answers: full responses, /v1/models, and the SSE
 *                        stream encoder with its UTF-8 hold-back
 *
 * Calls go one way: the parser and the encoder stand on
 * epd_openai_json.c and never call each other; the parser calls the
 * scanner, which stands on epd_openai_json.c alone.
 *
 * The writer appends to a reusable buffer; its failure is sticky, so an
 * encoder checks once at the end (epd__oai_w_end) and the buffer is rolled
 * back to where it started: an encode either appends all of its output or
 * nothing.  Pure code: any thread, no globals.
 */
#ifndef EPD_OPENAI_INT_H
#define EPD_OPENAI_INT_H

#include <stddef.h>
#include <stdint.h>

#include "epd_openai.h"

typedef struct {
    epd_oai_buf_t *buf; /* borrowed for the encode */
    size_t start;       /* buf->len when it began: where a failure rolls back to */
    int failed;
} epd__oai_writer_t;

/* ---- epd_openai_json.c ---- */

/* Room for `n` more bytes plus a NUL in `buf`: 0, or -1 out of memory
 * (buf unchanged). */
int epd__oai_buf_reserve(epd_oai_buf_t *buf, size_t n);
void epd__oai_w_begin(epd__oai_writer_t *w, epd_oai_buf_t *buf);
void epd__oai_w_put(epd__oai_writer_t *w, const char *s, size_t n);
void epd__oai_w_puts(epd__oai_writer_t *w, const char *s);
void epd__oai_w_int(epd__oai_writer_t *w, int64_t v);
/* A JSON string of s[0..n), which must be valid UTF-8 (it comes from a
 * jansson string or from epd_utf8_repair). */
void epd__oai_w_str(epd__oai_writer_t *w, const char *s, size_t n);
/* A JSON string, or null for NULL or "". */
void epd__oai_w_cstr_or_null(epd__oai_writer_t *w, const char *s);
/* EPD_OK, or EPD_ERR_NO_MEMORY with the buffer rolled back. */
epd_status_t epd__oai_w_end(epd__oai_writer_t *w);
/* {"error": {"message", "type", "param", "code"}} */
void epd__oai_w_error_object(epd__oai_writer_t *w, const epd_oai_error_t *err);

/* ---- epd_openai_fields.c ---- */

struct json_t; /* jansson's */
/* Every top-level key of a request body `root` (borrowed) of `kind`
 * checked against the table of fields: EPD_OK, or EPD_ERR_INVALID_PARAM
 * with *err filled (400 naming the key). */
epd_status_t epd__oai_fields_check(epd_oai_kind_t kind, struct json_t *root, epd_oai_error_t *err);
/* The sampling fields (penalties, logit_bias, min_tokens, ignore_eos,
 * stop_token_ids) of `root` into req (its arrays owned by req): EPD_OK,
 * EPD_ERR_INVALID_PARAM or EPD_ERR_NO_MEMORY with *err filled. */
epd_status_t epd__oai_parse_sampling(struct json_t *root, epd_oai_request_t *req,
                                     epd_oai_error_t *err);

#endif
