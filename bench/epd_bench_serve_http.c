/*
 * epd_bench_serve_http.c — `epd-bench serve`'s router path: streaming
 * POST /v1/completions (or chat) on plain libuv TCP sockets, HTTP/1.1
 * keep-alive (an idle connection is reused, else a new one is opened:
 * the connect is then part of the request's latency), the answer parsed
 * as it comes (Content-Length, chunked, or to the close) and its SSE
 * events as they complete: TTFT = the first event carrying text, ITL =
 * the gaps between text events, E2E = `data: [DONE]`.  One thread (the
 * phase's loop).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "epd_alloc.h"
#include "epd_bench_serve_int.h"

static void sv_conn_on_close(uv_handle_t *h)
{
    sv_conn_t *c = h->data;

    epd_free(c->in);
    epd_free(c->sse);
    epd_free(c->wbuf);
    c->b->n_conns--;
    epd_free(c);
}

void epd__sv_conn_close(sv_conn_t *c)
{
    sv_t *b = c->b;

    if (c->closing) {
        return;
    }
    c->closing = 1;
    if (c->idx >= 0) {
        sv_res_t *r = &c->ph->res[c->idx];

        if (!r->done) {
            epd__sv_err(c->ph, r, "connection lost");
            epd__sv_finish(b, r, sv_now());
        }
        c->idx = -1;
    }
    /* out of the idle list */
    for (sv_conn_t **p = &b->idle; *p != NULL; p = &(*p)->next_idle) {
        if (*p == c) {
            *p = c->next_idle;
            break;
        }
    }
    uv_close((uv_handle_t *)&c->tcp, sv_conn_on_close);
}

/* One SSE event's data payload (NUL-terminated in place). */
static void sv_sse_data(sv_conn_t *c, char *data, uint64_t now)
{
    sv_t *b = c->b;
    sv_res_t *r = &c->ph->res[c->idx];
    const char *key = b->chat || b->n_images > 0 ? "\"content\":\"" : "\"text\":\"";
    char *p;

    if (strcmp(data, "[DONE]") == 0) {
        c->saw_done = 1;
        return;
    }
    if (strncmp(data, "{\"error\"", 8) == 0) {
        c->saw_error = 1;
        snprintf(c->errmsg, sizeof(c->errmsg), "%s", data);
        return;
    }
    p = strstr(data, key);
    if (p != NULL && p[strlen(key)] != '"') {
        epd__sv_token_event(c->ph, r, now);
    }
    p = strstr(data, "\"completion_tokens\":");
    if (p != NULL) {
        r->n_tokens = (uint32_t)strtoul(p + 20, NULL, 10);
    }
}

static int sv_sse_feed(sv_conn_t *c, const char *data, size_t len, uint64_t now)
{
    size_t start = 0;

    if (c->sse_len + len + 1 > c->sse_cap) {
        size_t cap = (c->sse_len + len + 1) * 2;
        char *p = epd_malloc(cap);

        if (p == NULL) {
            return -1;
        }
        if (c->sse_len > 0) {
            memcpy(p, c->sse, c->sse_len);
        }
        epd_free(c->sse);
        c->sse = p;
        c->sse_cap = cap;
    }
    memcpy(c->sse + c->sse_len, data, len);
    c->sse_len += len;
    c->sse[c->sse_len] = '\0';
    for (;;) {
        char *ev = c->sse + start;
        char *end = strstr(ev, "\n\n");
        char *line;

        if (end == NULL) {
            break;
        }
        *end = '\0';
        for (line = ev; line != NULL && *line != '\0';) {
            char *nl = strchr(line, '\n');

            if (nl != NULL) {
                *nl = '\0';
            }
            if (strncmp(line, "data: ", 6) == 0) {
                sv_sse_data(c, line + 6, now);
            }
            line = nl != NULL ? nl + 1 : NULL;
        }
        start = (size_t)(end - c->sse) + 2;
    }
    memmove(c->sse, c->sse + start, c->sse_len - start);
    c->sse_len -= start;
    return 0;
}

/* The response to c->idx is complete: record it and free the connection. */
static void sv_http_done(sv_conn_t *c, uint64_t now)
{
    sv_t *b = c->b;
    sv_res_t *r = &c->ph->res[c->idx];

    if (c->status != 200) {
        char kind[48];

        snprintf(kind, sizeof(kind), "HTTP %d", c->status);
        if (c->sse != NULL) {
            c->sse[c->sse_len] = '\0'; /* the error body (not SSE) */
        }
        epd__sv_err_ex(c->ph, r, kind, c->sse != NULL ? c->sse : NULL);
    } else if (c->saw_error) {
        epd__sv_err_ex(c->ph, r, "error event in stream", c->errmsg);
    } else if (!c->saw_done) {
        epd__sv_err(c->ph, r, "stream without [DONE]");
    } else if (r->t_first == 0) {
        epd__sv_err(c->ph, r, "no text generated");
    }
    epd__sv_finish(b, r, now);
    c->idx = -1;
    c->sse_len = 0;
    c->state = 0;
    if (c->keepalive) {
        c->next_idle = b->idle;
        b->idle = c;
    } else {
        epd__sv_conn_close(c);
    }
}

static int sv_hdr_has(const char *hdrs, const char *name, const char *value)
{
    size_t nl = strlen(name);

    for (const char *l = hdrs; l != NULL && *l != '\0';) {
        if (strncasecmp(l, name, nl) == 0 && l[nl] == ':') {
            const char *v = l + nl + 1;

            while (*v == ' ') {
                v++;
            }
            if (value == NULL || strncasecmp(v, value, strlen(value)) == 0) {
                return 1;
            }
        }
        l = strstr(l, "\r\n");
        l = l != NULL ? l + 2 : NULL;
    }
    return 0;
}

/* Parses what c->in holds; -1 on a protocol error (the connection closes). */
static int sv_http_parse(sv_conn_t *c, uint64_t now)
{
    size_t pos = 0;

    while (c->idx >= 0 && pos < c->in_len) {
        char *p = c->in + pos;
        size_t avail = c->in_len - pos;

        if (c->state == 0) {
            char *end = memmem(p, avail, "\r\n\r\n", 4);
            const char *cl;

            if (end == NULL) {
                if (avail > 16384) {
                    return -1;
                }
                break;
            }
            *end = '\0';
            if (sscanf(p, "HTTP/1.%*d %d", &c->status) != 1) {
                return -1;
            }
            c->keepalive = !sv_hdr_has(p, "connection", "close");
            if (sv_hdr_has(p, "transfer-encoding", "chunked")) {
                c->state = 1;
            } else if ((cl = strcasestr(p, "\r\ncontent-length:")) != NULL) {
                c->left = strtoull(cl + 17, NULL, 10);
                c->state = 4;
            } else {
                c->state = 5;
                c->keepalive = 0;
            }
            pos += (size_t)(end - p) + 4;
            if (c->state == 4 && c->left == 0) {
                sv_http_done(c, now);
            }
        } else if (c->state == 1) {
            char *end = memmem(p, avail, "\r\n", 2);

            if (end == NULL) {
                if (avail > 64) {
                    return -1;
                }
                break;
            }
            c->left = strtoull(p, NULL, 16);
            pos += (size_t)(end - p) + 2;
            c->state = c->left == 0 ? 6 : 2;
        } else if (c->state == 2 || c->state == 4 || c->state == 5) {
            size_t n = c->state == 5 || avail < c->left ? avail : (size_t)c->left;

            /* an error body is kept in the same buffer (no event ends in it) */
            if (sv_sse_feed(c, p, n, now) != 0) {
                return -1;
            }
            pos += n;
            if (c->state != 5) {
                c->left -= n;
                if (c->left == 0) {
                    if (c->state == 4) {
                        sv_http_done(c, now);
                    } else {
                        c->state = 3;
                    }
                }
            }
        } else if (c->state == 3 || c->state == 6) {
            if (avail < 2) {
                break;
            }
            if (p[0] != '\r' || p[1] != '\n') {
                return -1;
            }
            pos += 2;
            if (c->state == 3) {
                c->state = 1;
            } else {
                sv_http_done(c, now);
            }
        }
    }
    memmove(c->in, c->in + pos, c->in_len - pos);
    c->in_len -= pos;
    return 0;
}

static void sv_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    sv_conn_t *c = h->data;

    if (c->in_cap - c->in_len < 16384) {
        size_t cap = c->in_cap == 0 ? 65536 : c->in_cap * 2;
        char *p = epd_malloc(cap + 1);

        if (p == NULL) {
            buf->base = NULL;
            buf->len = 0;
            return;
        }
        if (c->in_len > 0) {
            memcpy(p, c->in, c->in_len);
        }
        epd_free(c->in);
        c->in = p;
        c->in_cap = cap;
    }
    (void)suggested;
    buf->base = c->in + c->in_len;
    buf->len = c->in_cap - c->in_len;
}

static void sv_on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    sv_conn_t *c = s->data;
    uint64_t now = sv_now();

    (void)buf;
    if (n < 0) {
        if (c->idx >= 0 && c->state == 5) {
            sv_http_done(c, now); /* a response delimited by the close */
        }
        epd__sv_conn_close(c);
        c->b->progress(c->b);
        return;
    }
    c->in_len += (size_t)n;
    if (c->idx < 0) {
        if (n > 0) {
            epd__sv_conn_close(c); /* bytes nobody asked for */
        }
        return;
    }
    if (sv_http_parse(c, now) != 0) {
        sv_res_t *r = &c->ph->res[c->idx];

        epd__sv_err(c->ph, r, "bad HTTP response");
        epd__sv_finish(c->b, r, now);
        c->idx = -1;
        epd__sv_conn_close(c);
    }
}

static void sv_on_write(uv_write_t *w, int status)
{
    sv_conn_t *c = w->data;

    epd_free(c->wbuf);
    c->wbuf = NULL;
    if (status < 0) {
        epd__sv_conn_close(c);
    }
}

static void sv_http_send(sv_conn_t *c)
{
    sv_t *b = c->b;
    const sv_work_t *w = &b->work[c->idx];
    size_t cap = SV_TEXT_BYTES / 2 + 512 + (w->image >= 0 ? b->img_url_len[w->image] + 128 : 0);
    char *body = epd_malloc(cap);
    int bl, hl;
    uv_buf_t ub;

    if (body == NULL) {
        epd__sv_conn_close(c);
        return;
    }
    if (w->image >= 0) {
        /* a chat message with one image; the second path's requests ask
         * the prefill worker to encode it itself (no encoder pool) */
        bl = snprintf(body, cap,
                      "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":["
                      "{\"type\":\"text\",\"text\":\"%.*s\"},{\"type\":\"image_url\",\"image_url\":"
                      "{\"url\":\"%s\"}}]}],\"max_tokens\":%u,\"temperature\":0,\"seed\":%llu,"
                      "\"stream\":true,\"stream_options\":{\"include_usage\":true}%s}",
                      b->model_name, (int)w->text_len, b->text + w->text_off, b->img_url[w->image],
                      w->max_tokens, (unsigned long long)(w->seed >> 1),
                      c->ph == b->dph ? ",\"epd_encode\":\"local\"" : "");
    } else if (b->chat) {
        bl = snprintf(body, cap,
                      "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"%.*s\"}],"
                      "\"max_tokens\":%u,\"temperature\":0,\"seed\":%llu,\"stream\":true,"
                      "\"stream_options\":{\"include_usage\":true}}",
                      b->model_name, (int)w->text_len, b->text + w->text_off, w->max_tokens,
                      (unsigned long long)(w->seed >> 1));
    } else {
        bl = snprintf(body, cap,
                      "{\"model\":\"%s\",\"prompt\":\"%.*s\",\"max_tokens\":%u,"
                      "\"temperature\":0,\"seed\":%llu,\"stream\":true,"
                      "\"stream_options\":{\"include_usage\":true}}",
                      b->model_name, (int)w->text_len, b->text + w->text_off, w->max_tokens,
                      (unsigned long long)(w->seed >> 1));
    }
    c->wbuf = epd_malloc((size_t)bl + 256);
    if (c->wbuf == NULL) {
        epd_free(body);
        epd__sv_conn_close(c);
        return;
    }
    hl = snprintf(c->wbuf, 256,
                  "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                  "Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n",
                  b->chat || w->image >= 0 ? "/v1/chat/completions" : "/v1/completions", b->router,
                  bl);
    memcpy(c->wbuf + hl, body, (size_t)bl);
    epd_free(body);
    ub = uv_buf_init(c->wbuf, (unsigned)(hl + bl));
    c->wr.data = c;
    c->saw_done = 0;
    c->saw_error = 0;
    c->status = 0;
    c->state = 0;
    c->ph->res[c->idx].t_send = sv_now();
    if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, &ub, 1, sv_on_write) != 0) {
        epd_free(c->wbuf);
        c->wbuf = NULL;
        epd__sv_conn_close(c);
    }
}

static void sv_on_connect(uv_connect_t *req, int status)
{
    sv_conn_t *c = req->data;

    if (status < 0 || c->closing) {
        epd__sv_conn_close(c);
        return;
    }
    c->connected = 1;
    uv_tcp_nodelay(&c->tcp, 1);
    uv_read_start((uv_stream_t *)&c->tcp, sv_on_alloc, sv_on_read);
    sv_http_send(c);
}

void epd__sv_http_start(sv_t *b, uint32_t i, sv_phase_t *ph)
{
    sv_conn_t *c = b->idle;

    if (c != NULL) {
        b->idle = c->next_idle;
        c->next_idle = NULL;
        c->idx = (int)i;
        c->ph = ph;
        sv_http_send(c);
        return;
    }
    c = epd_calloc(1, sizeof(*c));
    if (c == NULL) {
        epd__sv_err(ph, &ph->res[i], "out of memory");
        epd__sv_finish(b, &ph->res[i], sv_now());
        return;
    }
    c->b = b;
    c->idx = (int)i;
    c->ph = ph;
    c->tcp.data = c;
    c->connect.data = c;
    uv_tcp_init(&b->loop, &c->tcp);
    b->n_conns++;
    ph->res[i].t_send = sv_now(); /* the connect is part of the latency */
    if (uv_tcp_connect(&c->connect, &c->tcp, (const struct sockaddr *)&b->addr, sv_on_connect) !=
        0) {
        epd__sv_conn_close(c);
    }
}
