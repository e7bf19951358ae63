/*
 * epd_openai_json.c — what every OpenAI encoder writes with (see
 * epd_openai_int.h): the reusable output buffers, a JSON writer whose
 * failure is sticky (an encode appends all of its output or nothing), and
 * the error objects ({"error": {...}}, in the wording OpenAI uses).
 *
 * The bottom of the OpenAI layer: it calls nothing of the parser or the
 * encoders.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_openai_int.h"

/* ------------------------------------------------------------ buffers */

void epd_oai_buf_reset(epd_oai_buf_t *buf)
{
    buf->len = 0;
    if (buf->data != NULL) {
        buf->data[0] = '\0';
    }
}

void epd_oai_buf_cleanup(epd_oai_buf_t *buf)
{
    epd_free(buf->data);
    buf->data = NULL;
    buf->len = 0;
    buf->cap = 0;
}

int epd__oai_buf_reserve(epd_oai_buf_t *buf, size_t n)
{
    size_t need;
    size_t cap;
    char *data;

    if (n > SIZE_MAX / 2 - buf->len) {
        return -1;
    }
    need = buf->len + n + 1;
    if (need <= buf->cap) {
        return 0;
    }
    cap = buf->cap < 256 ? 256 : buf->cap;
    while (cap < need) {
        cap *= 2;
    }
    data = epd_realloc(buf->data, cap);
    if (data == NULL) {
        return -1;
    }
    buf->data = data;
    buf->cap = cap;
    return 0;
}

void epd__oai_w_begin(epd__oai_writer_t *w, epd_oai_buf_t *buf)
{
    w->buf = buf;
    w->start = buf->len;
    w->failed = 0;
}

void epd__oai_w_put(epd__oai_writer_t *w, const char *s, size_t n)
{
    if (w->failed) {
        return;
    }
    if (epd__oai_buf_reserve(w->buf, n) != 0) {
        w->failed = 1;
        return;
    }
    memcpy(w->buf->data + w->buf->len, s, n);
    w->buf->len += n;
    w->buf->data[w->buf->len] = '\0';
}

void epd__oai_w_puts(epd__oai_writer_t *w, const char *s)
{
    epd__oai_w_put(w, s, strlen(s));
}

void epd__oai_w_int(epd__oai_writer_t *w, int64_t v)
{
    char tmp[32];
    int n = snprintf(tmp, sizeof(tmp), "%" PRId64, v);

    epd__oai_w_put(w, tmp, (size_t)n);
}

void epd__oai_w_str(epd__oai_writer_t *w, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t i;
    size_t run = 0;

    epd__oai_w_put(w, "\"", 1);
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[6];
        size_t elen = 2;

        if (c >= 0x20 && c != '"' && c != '\\') {
            continue;
        }
        epd__oai_w_put(w, s + run, i - run);
        run = i + 1;
        esc[0] = '\\';
        switch (c) {
        case '"':
            esc[1] = '"';
            break;
        case '\\':
            esc[1] = '\\';
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
        case '\b':
            esc[1] = 'b';
            break;
        case '\f':
            esc[1] = 'f';
            break;
        default:
            esc[1] = 'u';
            esc[2] = '0';
            esc[3] = '0';
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            elen = 6;
            break;
        }
        epd__oai_w_put(w, esc, elen);
    }
    epd__oai_w_put(w, s + run, n - run);
    epd__oai_w_put(w, "\"", 1);
}

void epd__oai_w_cstr_or_null(epd__oai_writer_t *w, const char *s)
{
    if (s == NULL || s[0] == '\0') {
        epd__oai_w_puts(w, "null");
    } else {
        epd__oai_w_str(w, s, strlen(s));
    }
}

epd_status_t epd__oai_w_end(epd__oai_writer_t *w)
{
    if (w->failed) {
        w->buf->len = w->start;
        if (w->buf->data != NULL) {
            w->buf->data[w->start] = '\0';
        }
        return EPD_ERR_NO_MEMORY;
    }
    return EPD_OK;
}

/* ------------------------------------------------------------ errors */

static void epd_oai_copy_trunc(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src != NULL ? src : "");
}

void epd_oai_error_set(epd_oai_error_t *err, int http_status, const char *param, const char *code,
                       const char *fmt, ...)
{
    va_list ap;

    err->http_status = http_status;
    epd_oai_copy_trunc(err->type, sizeof(err->type),
                       http_status >= 500 ? "server_error" : "invalid_request_error");
    epd_oai_copy_trunc(err->param, sizeof(err->param), param);
    epd_oai_copy_trunc(err->code, sizeof(err->code), code);
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
}

void epd__oai_w_error_object(epd__oai_writer_t *w, const epd_oai_error_t *err)
{
    epd__oai_w_puts(w, "{\"error\":{\"message\":");
    epd__oai_w_str(w, err->message, strlen(err->message));
    epd__oai_w_puts(w, ",\"type\":");
    epd__oai_w_str(w, err->type, strlen(err->type));
    epd__oai_w_puts(w, ",\"param\":");
    epd__oai_w_cstr_or_null(w, err->param);
    epd__oai_w_puts(w, ",\"code\":");
    epd__oai_w_cstr_or_null(w, err->code);
    epd__oai_w_puts(w, "}}");
}

epd_status_t epd_oai_error_encode(const epd_oai_error_t *err, epd_oai_buf_t *out)
{
    epd__oai_writer_t w;

    epd__oai_w_begin(&w, out);
    epd__oai_w_error_object(&w, err);
    return epd__oai_w_end(&w);
}
