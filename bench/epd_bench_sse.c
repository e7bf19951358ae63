/*
 * epd_bench_sse.c — streaming HTTP/1.1 requests on a libuv loop (see
 * epd_bench_http.h): the load generator's client for a router's
 * OpenAI-style SSE endpoints.
 *
 * Connections are plain libuv TCP sockets to one address, kept alive: a
 * request takes an idle connection, else opens a new one (no bound here:
 * the caller bounds what it has in flight).  The answer is parsed as it
 * comes — headers, then a chunked, Content-Length or close-delimited body
 * — and its SSE events as each completes (a blank line ends one), so a
 * `data:` payload reaches the caller at the time its bytes arrived.  An
 * answer that is not 200 keeps its body for the caller (no event ends in
 * it).  One thread: the loop's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "epd_alloc.h"
#include "epd_bench_http.h"
#include "epd_time.h"

/* The parser's state: where the bytes in `in` stand. */
enum {
    SSE_HEADERS = 0,
    SSE_CHUNK_SIZE = 1,
    SSE_CHUNK_DATA = 2,
    SSE_CHUNK_CRLF = 3,
    SSE_LENGTH = 4,   /* a Content-Length body */
    SSE_TO_CLOSE = 5, /* a body the close ends */
    SSE_LAST_CRLF = 6 /* after the last (0) chunk */
};

typedef struct sse_conn {
    uv_tcp_t tcp;
    uv_connect_t connect;
    uv_write_t wr;
    epd_bench_sse_t *s;
    struct sse_conn *next_idle;
    struct sse_conn *next; /* every connection (close_all) */
    int closing;
    int busy;   /* a request in flight */
    void *user; /* its caller's pointer */
    char *wbuf; /* its bytes until written (owned) */
    size_t wlen;
    /* the answer */
    char *in; /* bytes read and not parsed yet */
    size_t in_len, in_cap;
    int state;
    int status;
    int keepalive;
    uint64_t left; /* bytes of the chunk or body still to come */
    char *sse;     /* body bytes not yet ended by a blank line */
    size_t sse_len, sse_cap;
    int saw_done;
    int saw_error;
    char errmsg[160]; /* the error event's data */
} sse_conn_t;

struct epd_bench_sse {
    uv_loop_t *loop;
    struct sockaddr_storage addr;
    epd_bench_sse_cbs_t cbs;
    sse_conn_t *idle;
    sse_conn_t *all;
};

static uint64_t sse_now(void)
{
    return epd_time_now_ns();
}

/* Request of c ended: tells the caller once; c is free for another. */
static void sse_end(sse_conn_t *c, const epd_bench_sse_end_t *end, uint64_t now)
{
    void *user = c->user;

    c->busy = 0;
    c->user = NULL;
    c->s->cbs.on_end(c->s->cbs.arg, user, end, now);
}

static void sse_lost(sse_conn_t *c, const char *why, uint64_t now)
{
    epd_bench_sse_end_t end;

    memset(&end, 0, sizeof(end));
    end.lost = why;
    sse_end(c, &end, now);
}

static void sse_on_close(uv_handle_t *h)
{
    sse_conn_t *c = h->data;
    epd_bench_sse_t *s = c->s;

    for (sse_conn_t **p = &s->all; *p != NULL; p = &(*p)->next) {
        if (*p == c) {
            *p = c->next;
            break;
        }
    }
    epd_free(c->in);
    epd_free(c->sse);
    epd_free(c->wbuf);
    epd_free(c);
}

static void sse_close(sse_conn_t *c)
{
    epd_bench_sse_t *s = c->s;

    if (c->closing) {
        return;
    }
    c->closing = 1;
    if (c->busy) {
        sse_lost(c, "connection lost", sse_now());
    }
    /* out of the idle list */
    for (sse_conn_t **p = &s->idle; *p != NULL; p = &(*p)->next_idle) {
        if (*p == c) {
            *p = c->next_idle;
            break;
        }
    }
    uv_close((uv_handle_t *)&c->tcp, sse_on_close);
}

/* One SSE event's data payload (NUL-terminated in place). */
static void sse_data(sse_conn_t *c, char *data, uint64_t now)
{
    if (strcmp(data, "[DONE]") == 0) {
        c->saw_done = 1;
        return;
    }
    if (strncmp(data, "{\"error\"", 8) == 0) {
        c->saw_error = 1;
        snprintf(c->errmsg, sizeof(c->errmsg), "%s", data);
        return;
    }
    c->s->cbs.on_data(c->s->cbs.arg, c->user, data, now);
}

static int sse_feed(sse_conn_t *c, const char *data, size_t len, uint64_t now)
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
                sse_data(c, line + 6, now);
            }
            line = nl != NULL ? nl + 1 : NULL;
        }
        start = (size_t)(end - c->sse) + 2;
    }
    memmove(c->sse, c->sse + start, c->sse_len - start);
    c->sse_len -= start;
    return 0;
}

/* The answer on c is complete: tell the caller, keep c or close it. */
static void sse_done(sse_conn_t *c, uint64_t now)
{
    epd_bench_sse_t *s = c->s;
    epd_bench_sse_end_t end;

    memset(&end, 0, sizeof(end));
    end.status = c->status;
    end.saw_done = c->saw_done;
    if (c->status != 200 && c->sse != NULL) {
        c->sse[c->sse_len] = '\0'; /* the error body (not SSE) */
        end.body = c->sse;
    }
    end.error = c->saw_error ? c->errmsg : NULL;
    sse_end(c, &end, now);
    c->sse_len = 0;
    c->state = SSE_HEADERS;
    if (c->closing) {
        return; /* on_end closed it (epd_bench_sse_close_all) */
    }
    if (c->keepalive) {
        c->next_idle = s->idle;
        s->idle = c;
    } else {
        sse_close(c);
    }
}

static int sse_hdr_has(const char *hdrs, const char *name, const char *value)
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
static int sse_parse(sse_conn_t *c, uint64_t now)
{
    size_t pos = 0;

    while (c->busy && pos < c->in_len) {
        char *p = c->in + pos;
        size_t avail = c->in_len - pos;

        if (c->state == SSE_HEADERS) {
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
            c->keepalive = !sse_hdr_has(p, "connection", "close");
            if (sse_hdr_has(p, "transfer-encoding", "chunked")) {
                c->state = SSE_CHUNK_SIZE;
            } else if ((cl = strcasestr(p, "\r\ncontent-length:")) != NULL) {
                c->left = strtoull(cl + 17, NULL, 10);
                c->state = SSE_LENGTH;
            } else {
                c->state = SSE_TO_CLOSE;
                c->keepalive = 0;
            }
            pos += (size_t)(end - p) + 4;
            if (c->state == SSE_LENGTH && c->left == 0) {
                sse_done(c, now);
            }
        } else if (c->state == SSE_CHUNK_SIZE) {
            char *end = memmem(p, avail, "\r\n", 2);

            if (end == NULL) {
                if (avail > 64) {
                    return -1;
                }
                break;
            }
            c->left = strtoull(p, NULL, 16);
            pos += (size_t)(end - p) + 2;
            c->state = c->left == 0 ? SSE_LAST_CRLF : SSE_CHUNK_DATA;
        } else if (c->state == SSE_CHUNK_DATA || c->state == SSE_LENGTH ||
                   c->state == SSE_TO_CLOSE) {
            size_t n = c->state == SSE_TO_CLOSE || avail < c->left ? avail : (size_t)c->left;

            /* an error body is kept in the same buffer (no event ends in it) */
            if (sse_feed(c, p, n, now) != 0) {
                return -1;
            }
            pos += n;
            if (c->state != SSE_TO_CLOSE) {
                c->left -= n;
                if (c->left == 0) {
                    if (c->state == SSE_LENGTH) {
                        sse_done(c, now);
                    } else {
                        c->state = SSE_CHUNK_CRLF;
                    }
                }
            }
        } else if (c->state == SSE_CHUNK_CRLF || c->state == SSE_LAST_CRLF) {
            if (avail < 2) {
                break;
            }
            if (p[0] != '\r' || p[1] != '\n') {
                return -1;
            }
            pos += 2;
            if (c->state == SSE_CHUNK_CRLF) {
                c->state = SSE_CHUNK_SIZE;
            } else {
                sse_done(c, now);
            }
        }
    }
    memmove(c->in, c->in + pos, c->in_len - pos);
    c->in_len -= pos;
    return 0;
}

static void sse_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    sse_conn_t *c = h->data;

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

static void sse_on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    sse_conn_t *c = st->data;
    epd_bench_sse_t *s = c->s;
    uint64_t now = sse_now();

    (void)buf;
    if (n < 0) {
        if (c->busy && c->state == SSE_TO_CLOSE) {
            sse_done(c, now); /* a response delimited by the close */
        }
        sse_close(c);
        if (s->cbs.on_close != NULL) {
            s->cbs.on_close(s->cbs.arg);
        }
        return;
    }
    c->in_len += (size_t)n;
    if (!c->busy) {
        if (n > 0) {
            sse_close(c); /* bytes nobody asked for */
        }
        return;
    }
    if (sse_parse(c, now) != 0) {
        sse_lost(c, "bad HTTP response", now);
        sse_close(c);
    }
}

static void sse_on_write(uv_write_t *w, int status)
{
    sse_conn_t *c = w->data;

    epd_free(c->wbuf);
    c->wbuf = NULL;
    if (status < 0) {
        sse_close(c);
    }
}

/* Writes c's request (c->wbuf). */
static void sse_send(sse_conn_t *c)
{
    uv_buf_t ub = uv_buf_init(c->wbuf, (unsigned)c->wlen);

    c->wr.data = c;
    c->saw_done = 0;
    c->saw_error = 0;
    c->status = 0;
    c->state = SSE_HEADERS;
    if (c->s->cbs.on_send != NULL) {
        c->s->cbs.on_send(c->s->cbs.arg, c->user, sse_now());
    }
    if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, &ub, 1, sse_on_write) != 0) {
        epd_free(c->wbuf);
        c->wbuf = NULL;
        sse_close(c);
    }
}

static void sse_on_connect(uv_connect_t *req, int status)
{
    sse_conn_t *c = req->data;

    if (status < 0 || c->closing) {
        sse_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    uv_read_start((uv_stream_t *)&c->tcp, sse_on_alloc, sse_on_read);
    sse_send(c);
}

epd_status_t epd_bench_sse_create(uv_loop_t *loop, const struct sockaddr *addr, size_t addr_len,
                                  const epd_bench_sse_cbs_t *cbs, epd_bench_sse_t **sse_p)
{
    epd_bench_sse_t *s;

    if (addr_len > sizeof(s->addr) || cbs->on_data == NULL || cbs->on_end == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    s = epd_calloc(1, sizeof(*s));
    if (s == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    s->loop = loop;
    memcpy(&s->addr, addr, addr_len);
    s->cbs = *cbs;
    *sse_p = s;
    return EPD_OK;
}

void epd_bench_sse_start(epd_bench_sse_t *s, char *req, size_t len, void *user)
{
    sse_conn_t *c = s->idle;

    if (c != NULL) {
        s->idle = c->next_idle;
        c->next_idle = NULL;
        c->busy = 1;
        c->user = user;
        c->wbuf = req;
        c->wlen = len;
        sse_send(c);
        return;
    }
    c = epd_calloc(1, sizeof(*c));
    if (c == NULL) {
        epd_bench_sse_end_t end;

        epd_free(req);
        memset(&end, 0, sizeof(end));
        end.lost = "out of memory";
        s->cbs.on_end(s->cbs.arg, user, &end, sse_now());
        return;
    }
    c->s = s;
    c->busy = 1;
    c->user = user;
    c->wbuf = req;
    c->wlen = len;
    c->tcp.data = c;
    c->connect.data = c;
    uv_tcp_init(s->loop, &c->tcp);
    c->next = s->all;
    s->all = c;
    if (uv_tcp_connect(&c->connect, &c->tcp, (const struct sockaddr *)&s->addr, sse_on_connect) !=
        0) {
        sse_close(c);
    }
}

void epd_bench_sse_close_all(epd_bench_sse_t *s)
{
    for (sse_conn_t *c = s->all; c != NULL; c = c->next) {
        sse_close(c);
    }
}

void epd_bench_sse_destroy(epd_bench_sse_t *s)
{
    epd_free(s);
}
