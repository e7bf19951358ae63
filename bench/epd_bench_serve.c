/*
 * epd_bench_serve.c — `epd-bench serve`: the serving benchmark.
 *
 * An open-loop load generator: requests arrive at a fixed mean rate
 * (Poisson: exponential gaps from a seeded generator), each with a prompt
 * and an output length drawn from a distribution ("N" or "A:B" uniform),
 * and are sent however many are still running (up to --max-inflight, past
 * which an arrival is counted as dropped, never delayed: delaying would
 * hide the queueing the benchmark exists to show).
 *
 * Two paths for the same workload (same arrivals, prompts, lengths,
 * seeds); by default (--phases ab) one run alternates arrivals between
 * them, so both see the same machine at the same time (this machine's
 * other load moves both alike), each at half the rate; --phases
 * router,direct runs them one after the other, each at the full rate:
 *   router  streaming POST /v1/completions to the router (plain sockets on
 *           libuv, HTTP/1.1 keep-alive, chunked SSE parsed as it comes):
 *           TTFT = first event carrying text, ITL = gaps between text
 *           events, E2E = `data: [DONE]`;
 *   direct  the same token ids (tokenized here with the same engine the
 *           router uses) straight to the prefill and decode workers with
 *           client/epd_client, driven from the same kind of loop:
 *           TTFT = first TokenChunk, ITL = gaps between chunks, E2E = the
 *           last chunk.
 * "What the router adds" is the difference of the two paths'
 * percentiles (TTFT and E2E, p50 and p99): the router's HTTP parsing,
 * tokenization, worker choice, SSE encoding and the extra loopback hop.
 * It is a difference of distributions, not a per-request span (the router
 * exports no per-request spans); the router's own TTFT histogram
 * (epd_router_ttft_seconds, read from /metrics before and after the run)
 * gives its mean, which splits the added time into the router's inside and
 * the HTTP/SSE hop.
 *
 * Long-mixed (--long-len L --long-every N): every N-th arrival's prompt is
 * L bytes instead (drawn after the others' values, so the short prompts
 * are those of the same run without it); the TTFT/ITL/E2E percentiles are
 * then the short prompts' alone — what the long ones cost them — and the
 * long ones get a line of their own.  With an own cluster, the sim model's
 * window and both pools grow to hold two long prompts, and
 * --prefill-chunk-tokens is given to the prefill worker (0: chunking off).
 *
 * Without --router the benchmark starts its own cluster from build/bin
 * (router + 1 prefill + 1 decode, engine sim with a small profile written
 * into a temp folder; --sim-model DIR to use another sim or ref model
 * folder), waits for the ready files and for both workers to be READY in
 * the router's Status, and stops every daemon at the end.  It prints a
 * table; it never judges.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sodium.h>
#include <uv.h>

#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop

#include "epd_alloc.h"
#include "epd_bench.h"
#include "epd_bench_http.h"
#include "epd_client.h"
#include "epd_config.h"
#include "epd_engine.h"
#include "epd_msg.h"
#include "epd_rng.h"
#include "epd_rpc.h"
#include "epd_secret.h"
#include "epd_sim.h"
#include "epd_time.h"
#include "epd_xport_uv.h"

#define SV_TEXT_BYTES (1u << 20)
#define SV_MAX_ERR_KINDS 16

/* ------------------------------------------------------------- workload */

typedef struct {
    uint64_t at_ns; /* arrival, from the phase's start */
    uint32_t text_off, text_len;
    uint32_t max_tokens;
    int32_t image; /* index into the image pool, -1: none */
    int is_long;   /* --long-every: one of the long prompts */
    uint64_t seed;
    int32_t *tokens; /* direct phase: BOS + bytes (tokenized here) */
    uint32_t n_tokens;
} sv_work_t;

typedef struct {
    uint64_t t_send, t_first, t_last, t_end; /* monotonic ns; 0 = not reached */
    uint32_t n_tokens;
    int err; /* index into the phase's error kinds + 1; 0 = ok */
    int done;
    int unused; /* interleaved: this arrival went the other path */
} sv_res_t;

typedef struct {
    char name[48];
    char example[160]; /* the first one's message, when known */
    uint64_t count;
} sv_errkind_t;

typedef struct {
    const char *name;
    sv_res_t *res;
    uint32_t n;
    double *itl_us;
    size_t n_itl, cap_itl;
    sv_errkind_t errs[SV_MAX_ERR_KINDS];
    int n_errs;
    uint64_t dropped;
    uint64_t t0, t_end;
} sv_phase_t;

/* ------------------------------------------------------------ the bench */

typedef struct sv sv_t;

typedef struct sv_conn {
    uv_tcp_t tcp;
    uv_connect_t connect;
    uv_write_t wr;
    sv_t *b;
    struct sv_conn *next_idle;
    int connected;
    int closing;
    int idx;         /* request in flight, -1 none */
    sv_phase_t *ph;  /* the phase that request belongs to */
    char *wbuf;
    /* response parsing */
    char *in;
    size_t in_len, in_cap;
    int state; /* 0 headers, 1 chunk size, 2 chunk data, 3 chunk crlf, 4 length, 5 to close */
    int status;
    int keepalive;
    uint64_t left;
    char *sse;
    size_t sse_len, sse_cap;
    int saw_done;
    int saw_error;
    char errmsg[160]; /* the error event's data */
} sv_conn_t;

struct sv {
    /* options */
    const char *router;     /* HTTP host:port */
    const char *router_ctl; /* gRPC host:port */
    const char *prefill_ctl, *decode_ctl;
    const char *model_dir;
    const char *engine_name;
    const char *model_name;
    const char *prompt_len, *output_len;
    const char *phases;
    const char *sim_model;
    double rate;
    double duration_s;
    int64_t max_inflight;
    int64_t seed;
    int64_t warmup;
    int chat;
    int keep;
    int64_t n_images;   /* --images: distinct images per path (0: text requests) */
    int64_t image_size; /* their width and height */
    int64_t long_len;   /* --long-len: bytes of every --long-every'th prompt */
    int64_t long_every; /* 0: no long prompts */
    int64_t chunk_tokens; /* own cluster: prefill's --prefill-chunk-tokens, -1 default */
    int no_prefix_cache;  /* own cluster: prefill's --no-prefix-cache */
    char **img_url;     /* [2 * n_images] data: URLs */
    size_t *img_url_len;
    double img0[6], img1[6]; /* the router's image counters before / after */
    char enc_ctl_buf[64];
    /* workload */
    char *text;
    sv_work_t *work;
    uint32_t n_work;
    /* running phase */
    uv_loop_t loop;
    uv_timer_t tick;
    sv_phase_t *hph, *dph; /* the router's and the direct path's results */
    uint64_t t0;
    int mode;           /* 0 router, 1 direct, 2 both interleaved (even: router) */
    uint32_t next;      /* next arrival to launch */
    uint32_t *deferred; /* [n_work] ring: direct submits refused by backpressure */
    uint32_t deferred_head, n_deferred;
    uint32_t inflight;
    uint64_t hard_end;
    struct sockaddr_in addr;
    sv_conn_t *idle;
    uint32_t n_conns;
    /* direct */
    epd_client_t *client;
    epd_client_worker_t *pw, *dw;
    epd_xport_uv_t *xuv;
    /* our cluster */
    char tmp[PATH_MAX];
    /* the cluster secret the bench makes for its own daemons (mode 0600 in
     * tmp): the figures are those of an authenticated cluster */
    char secret_file[PATH_MAX + 16];
    epd_secret_t secret;
    char bindir[PATH_MAX];
    pid_t pids[4];
    char router_buf[64], router_ctl_buf[64], p_ctl_buf[64], d_ctl_buf[64];
    char model_buf[PATH_MAX + 16];
    /* the router's epd_router_ttft_seconds over the run (/metrics deltas) */
    double m_sum;
    uint64_t m_count;
};

static uint64_t sv_now(void)
{
    return epd_time_now_ns();
}

/* Counts an error of `kind` for request `r`; `example` (may be NULL) is
 * kept for the first error of the kind. */
static void sv_err_ex(sv_phase_t *ph, sv_res_t *r, const char *kind, const char *example)
{
    int i;

    for (i = 0; i < ph->n_errs; i++) {
        if (strncmp(ph->errs[i].name, kind, sizeof(ph->errs[i].name) - 1) == 0) {
            break;
        }
    }
    if (i == ph->n_errs) {
        if (ph->n_errs == SV_MAX_ERR_KINDS) {
            i = SV_MAX_ERR_KINDS - 1; /* the last kind collects the rest */
        } else {
            snprintf(ph->errs[i].name, sizeof(ph->errs[i].name), "%s", kind);
            snprintf(ph->errs[i].example, sizeof(ph->errs[i].example), "%s",
                     example != NULL ? example : "");
            ph->n_errs++;
        }
    }
    ph->errs[i].count++;
    r->err = i + 1;
}

static void sv_err(sv_phase_t *ph, sv_res_t *r, const char *kind)
{
    sv_err_ex(ph, r, kind, NULL);
}

static void sv_itl(sv_phase_t *ph, uint64_t gap_ns)
{
    if (ph->n_itl == ph->cap_itl) {
        size_t cap = ph->cap_itl ? ph->cap_itl * 2 : 65536;
        double *p = epd_malloc(cap * sizeof(*p));

        if (p == NULL) {
            return;
        }
        if (ph->n_itl > 0) {
            memcpy(p, ph->itl_us, ph->n_itl * sizeof(*p));
        }
        epd_free(ph->itl_us);
        ph->itl_us = p;
        ph->cap_itl = cap;
    }
    ph->itl_us[ph->n_itl++] = (double)gap_ns / 1e3;
}

/* A text event (or chunk) of request `r` arrived now. */
static void sv_token_event(sv_phase_t *ph, sv_res_t *r, uint64_t now)
{
    if (r->t_first == 0) {
        r->t_first = now;
    } else {
        sv_itl(ph, now - r->t_last);
    }
    r->t_last = now;
}

static void sv_finish(sv_t *b, sv_res_t *r, uint64_t now)
{
    if (r->done) {
        return;
    }
    r->done = 1;
    r->t_end = now;
    b->inflight--;
}

/* ------------------------------------------------------- distributions */

/* "N" or "A:B" (uniform, inclusive). */
static int sv_dist_parse(const char *s, uint32_t *lo_p, uint32_t *hi_p)
{
    char *end;
    unsigned long a, c;

    errno = 0;
    a = strtoul(s, &end, 10);
    if (errno != 0 || end == s || a == 0 || a > 1000000) {
        return -1;
    }
    if (*end == '\0') {
        *lo_p = *hi_p = (uint32_t)a;
        return 0;
    }
    if (*end != ':') {
        return -1;
    }
    s = end + 1;
    c = strtoul(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || c < a || c > 1000000) {
        return -1;
    }
    *lo_p = (uint32_t)a;
    *hi_p = (uint32_t)c;
    return 0;
}

static uint64_t sv_rand(uint64_t *s)
{
    /* splitmix64: the workload must be the same for every phase and run */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double sv_rand01(uint64_t *s)
{
    return ((double)(sv_rand(s) >> 11) + 0.5) / 9007199254740992.0;
}

static int sv_workload(sv_t *b)
{
    uint32_t plo, phi, olo, ohi;
    uint64_t s = (uint64_t)b->seed;
    double t = 0;
    static const char chars[] =
        "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ.,;0123456789 the and of ";

    if (sv_dist_parse(b->prompt_len, &plo, &phi) != 0 ||
        sv_dist_parse(b->output_len, &olo, &ohi) != 0) {
        fprintf(stderr, "serve: --prompt-len/--output-len: want N or A:B (1..1000000)\n");
        return -1;
    }
    if (phi >= SV_TEXT_BYTES / 2 || b->long_len >= SV_TEXT_BYTES / 2) {
        fprintf(stderr, "serve: prompts up to %u bytes\n", SV_TEXT_BYTES / 2);
        return -1;
    }
    if (b->long_every > 0 && b->long_len == 0) {
        fprintf(stderr, "serve: --long-every needs --long-len\n");
        return -1;
    }
    b->n_work = (uint32_t)ceil(b->rate * b->duration_s);
    if (b->n_work == 0) {
        b->n_work = 1;
    }
    b->text = epd_malloc(SV_TEXT_BYTES);
    b->work = epd_calloc(b->n_work, sizeof(*b->work));
    b->deferred = epd_calloc(b->n_work, sizeof(*b->deferred));
    if (b->text == NULL || b->work == NULL || b->deferred == NULL) {
        return -1;
    }
    for (uint32_t i = 0; i < SV_TEXT_BYTES; i++) {
        b->text[i] = chars[sv_rand(&s) % (sizeof(chars) - 1)];
    }
    for (uint32_t i = 0; i < b->n_work; i++) {
        sv_work_t *w = &b->work[i];

        t += -log(sv_rand01(&s)) / b->rate;
        w->at_ns = (uint64_t)(t * 1e9);
        w->text_len = plo + (uint32_t)(sv_rand(&s) % (phi - plo + 1));
        w->text_off = (uint32_t)(sv_rand(&s) % (SV_TEXT_BYTES - w->text_len));
        w->max_tokens = olo + (uint32_t)(sv_rand(&s) % (ohi - olo + 1));
        w->seed = sv_rand(&s);
        /* drawn like the others first, so the short prompts around it are
         * the same as in a run without long prompts */
        if (b->long_every > 0 && i % (uint32_t)b->long_every == (uint32_t)b->long_every - 1) {
            w->is_long = 1;
            w->text_len = (uint32_t)b->long_len;
            w->text_off = (uint32_t)(sv_rand(&s) % (SV_TEXT_BYTES - w->text_len));
        }
        w->image = -1;
        if (b->n_images > 0) {
            /* each path its own pool of --images distinct images (a cache
             * hit on one path is never a miss filled by the other) */
            w->image = (int32_t)((i & 1u) * (uint32_t)b->n_images +
                                 (uint32_t)(sv_rand(&s) % (uint64_t)b->n_images));
        }
    }
    return 0;
}

/* ------------------------------------------------------------ images */

typedef struct {
    unsigned char *data;
    size_t len, cap;
} sv_png_t;

static void sv_png_write(void *ctx, void *data, int size)
{
    sv_png_t *p = ctx;

    if (size <= 0 || p->data == NULL) {
        return;
    }
    if (p->len + (size_t)size > p->cap) {
        size_t cap = (p->len + (size_t)size) * 2;
        unsigned char *n = epd_realloc(p->data, cap);

        if (n == NULL) {
            epd_free(p->data);
            p->data = NULL;
            return;
        }
        p->data = n;
        p->cap = cap;
    }
    memcpy(p->data + p->len, data, (size_t)size);
    p->len += (size_t)size;
}

/* 2 x --images distinct PNGs (seeded noise over colour bands, one pool per
 * path), as data: URLs ready to go into a request body. */
static int sv_images_make(sv_t *b)
{
    uint32_t n = 2 * (uint32_t)b->n_images;
    int side = (int)b->image_size;
    unsigned char *px = epd_malloc((size_t)side * side * 3);

    b->img_url = epd_calloc(n, sizeof(*b->img_url));
    b->img_url_len = epd_calloc(n, sizeof(*b->img_url_len));
    if (px == NULL || b->img_url == NULL || b->img_url_len == NULL) {
        epd_free(px);
        return -1;
    }
    for (uint32_t k = 0; k < n; k++) {
        uint64_t s = (uint64_t)b->seed * 1000003u + k + 1;
        sv_png_t png = {epd_malloc(1 << 16), 0, 1 << 16};
        size_t b64;

        for (int i = 0; i < side * side; i++) {
            uint64_t r = sv_rand(&s);

            px[3 * i] = (unsigned char)((i % side) * 2 + (r & 0x3f));
            px[3 * i + 1] = (unsigned char)((i / side) * 3 + ((r >> 8) & 0x3f));
            px[3 * i + 2] = (unsigned char)(k * 37 + ((r >> 16) & 0x3f));
        }
        if (png.data == NULL || !stbi_write_png_to_func(sv_png_write, &png, side, side, 3, px,
                                                        side * 3) ||
            png.data == NULL) {
            epd_free(png.data);
            epd_free(px);
            return -1;
        }
        b64 = sodium_base64_encoded_len(png.len, sodium_base64_VARIANT_ORIGINAL);
        b->img_url[k] = epd_malloc(b64 + 32);
        if (b->img_url[k] == NULL) {
            epd_free(png.data);
            epd_free(px);
            return -1;
        }
        memcpy(b->img_url[k], "data:image/png;base64,", 22);
        sodium_bin2base64(b->img_url[k] + 22, b64, png.data, png.len,
                          sodium_base64_VARIANT_ORIGINAL);
        b->img_url_len[k] = strlen(b->img_url[k]);
        epd_free(png.data);
    }
    epd_free(px);
    return 0;
}

static void sv_images_free(sv_t *b)
{
    for (int64_t k = 0; b->img_url != NULL && k < 2 * b->n_images; k++) {
        epd_free(b->img_url[k]);
    }
    epd_free(b->img_url);
    epd_free(b->img_url_len);
}

/* -------------------------------------------------------- HTTP (router) */

static void sv_launch_due(sv_t *b);

static void sv_conn_on_close(uv_handle_t *h)
{
    sv_conn_t *c = h->data;

    epd_free(c->in);
    epd_free(c->sse);
    epd_free(c->wbuf);
    c->b->n_conns--;
    epd_free(c);
}

static void sv_conn_close(sv_conn_t *c)
{
    sv_t *b = c->b;

    if (c->closing) {
        return;
    }
    c->closing = 1;
    if (c->idx >= 0) {
        sv_res_t *r = &c->ph->res[c->idx];

        if (!r->done) {
            sv_err(c->ph, r, "connection lost");
            sv_finish(b, r, sv_now());
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
        sv_token_event(c->ph, r, now);
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
        sv_err_ex(c->ph, r, kind, c->sse != NULL ? c->sse : NULL);
    } else if (c->saw_error) {
        sv_err_ex(c->ph, r, "error event in stream", c->errmsg);
    } else if (!c->saw_done) {
        sv_err(c->ph, r, "stream without [DONE]");
    } else if (r->t_first == 0) {
        sv_err(c->ph, r, "no text generated");
    }
    sv_finish(b, r, now);
    c->idx = -1;
    c->sse_len = 0;
    c->state = 0;
    if (c->keepalive) {
        c->next_idle = b->idle;
        b->idle = c;
    } else {
        sv_conn_close(c);
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
        sv_conn_close(c);
        sv_launch_due(c->b);
        return;
    }
    c->in_len += (size_t)n;
    if (c->idx < 0) {
        if (n > 0) {
            sv_conn_close(c); /* bytes nobody asked for */
        }
        return;
    }
    if (sv_http_parse(c, now) != 0) {
        sv_res_t *r = &c->ph->res[c->idx];

        sv_err(c->ph, r, "bad HTTP response");
        sv_finish(c->b, r, now);
        c->idx = -1;
        sv_conn_close(c);
    }
}

static void sv_on_write(uv_write_t *w, int status)
{
    sv_conn_t *c = w->data;

    epd_free(c->wbuf);
    c->wbuf = NULL;
    if (status < 0) {
        sv_conn_close(c);
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
        sv_conn_close(c);
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
        sv_conn_close(c);
        return;
    }
    hl = snprintf(c->wbuf, 256,
                  "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                  "Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n",
                  b->chat || w->image >= 0 ? "/v1/chat/completions" : "/v1/completions",
                  b->router, bl);
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
        sv_conn_close(c);
    }
}

static void sv_on_connect(uv_connect_t *req, int status)
{
    sv_conn_t *c = req->data;

    if (status < 0 || c->closing) {
        sv_conn_close(c);
        return;
    }
    c->connected = 1;
    uv_tcp_nodelay(&c->tcp, 1);
    uv_read_start((uv_stream_t *)&c->tcp, sv_on_alloc, sv_on_read);
    sv_http_send(c);
}

static void sv_http_start(sv_t *b, uint32_t i, sv_phase_t *ph)
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
        sv_err(ph, &ph->res[i], "out of memory");
        sv_finish(b, &ph->res[i], sv_now());
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
        sv_conn_close(c);
    }
}

/* ------------------------------------------------------- direct (client) */

static void sv_on_client_event(void *arg, const epd_client_event_t *ev)
{
    sv_t *b = arg;
    sv_res_t *r = &b->dph->res[(uintptr_t)ev->user];
    uint64_t now = sv_now();

    if (r->done) {
        return;
    }
    if (ev->kind == EPD_CLIENT_EV_TOKENS) {
        if (ev->n_tokens > 0) {
            sv_token_event(b->dph, r, now);
            r->n_tokens += ev->n_tokens;
        }
        if (ev->terminal) {
            if (ev->finish != EPD_CLIENT_FINISH_LENGTH && ev->finish != EPD_CLIENT_FINISH_STOP) {
                sv_err(b->dph, r, epd_client_finish_name(ev->finish));
            }
            sv_finish(b, r, now);
        }
        return;
    }
    if (ev->terminal) {
        char kind[48], ex[160];

        snprintf(kind, sizeof(kind), "%s", epd_status_string(ev->status));
        snprintf(ex, sizeof(ex), "%s: %s", ev->from, ev->message);
        sv_err_ex(b->dph, r, kind, ex);
        sv_finish(b, r, now);
    }
}

static void sv_direct_start(sv_t *b, uint32_t i)
{
    const sv_work_t *w = &b->work[i];
    sv_res_t *r = &b->dph->res[i];
    epd_client_request_t q;
    uint64_t t_send;
    epd_status_t st;

    memset(&q, 0, sizeof(q));
    q.prompt = (const uint32_t *)w->tokens;
    q.n_prompt = w->n_tokens;
    q.temperature = 0;
    q.top_p = 1;
    q.seed = w->seed >> 1;
    q.max_tokens = w->max_tokens;
    q.prefill = b->pw;
    q.decode = b->dw;
    q.deadline_ms = 60000;
    q.user = (void *)(uintptr_t)i;
    t_send = r->t_send != 0 ? r->t_send : sv_now();
    r->t_send = t_send;
    st = epd_client_submit(b->client, &q, NULL);
    if (st == EPD_ERR_NO_RESOURCE && b->n_deferred < b->n_work) {
        /* transport backpressure: retried after progress, the wait counts */
        r->t_send = t_send;
        b->deferred[(b->deferred_head + b->n_deferred) % b->n_work] = i;
        b->n_deferred++;
        return;
    }
    if (st != EPD_OK) {
        sv_err(b->dph, r, epd_status_string(st));
        sv_finish(b, r, sv_now());
    }
}

/* ------------------------------------------------------------ the phases */

static void sv_launch_due(sv_t *b)
{
    uint64_t now = sv_now();
    uint32_t n = b->n_deferred;

    /* backpressured submits first, in order (each goes back on the ring
     * if still refused) */
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = b->deferred[b->deferred_head];

        b->deferred_head = (b->deferred_head + 1) % b->n_work;
        b->n_deferred--;
        sv_direct_start(b, i);
    }
    while (b->next < b->n_work && b->t0 + b->work[b->next].at_ns <= now) {
        uint32_t i = b->next++;
        int direct = b->mode == 1 || (b->mode == 2 && (i & 1u));
        int second = (b->mode == 2 || b->mode == 3) && (i & 1u); /* odd arrivals: dph */
        sv_phase_t *ph = b->mode == 3 ? (second ? b->dph : b->hph) : direct ? b->dph : b->hph;

        if (b->mode == 2 || b->mode == 3) {
            (second ? b->hph : b->dph)->res[i].unused = 1;
        }
        b->inflight++;
        if (b->inflight > (uint32_t)b->max_inflight) {
            sv_res_t *r = &ph->res[i];

            ph->dropped++;
            sv_err(ph, r, "dropped (max in flight)");
            sv_finish(b, r, now);
            continue;
        }
        if (direct) {
            sv_direct_start(b, i);
        } else {
            sv_http_start(b, i, ph);
        }
    }
}

static void sv_stop_loop(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h)) {
        if (h->type == UV_TCP) {
            sv_conn_close(h->data);
        } else if (h->type == UV_TIMER) {
            uv_close(h, NULL);
        }
    }
}

static void sv_on_tick(uv_timer_t *t)
{
    sv_t *b = t->data;
    uint64_t now = sv_now();

    sv_launch_due(b);
    if (b->client != NULL) {
        epd_client_tick(b->client);
    }
    if ((b->next == b->n_work && b->inflight == 0) || now > b->hard_end) {
        for (int k = 0; k < 2; k++) {
            sv_phase_t *ph = k == 0 ? b->hph : b->dph;

            for (uint32_t i = 0; ph != NULL && i < b->n_work; i++) {
                if (!ph->res[i].done && !ph->res[i].unused && ph->res[i].t_send != 0) {
                    sv_err(ph, &ph->res[i], "benchmark deadline");
                    sv_finish(b, &ph->res[i], now);
                }
            }
            if (ph != NULL) {
                ph->t_end = now;
            }
        }
        uv_timer_stop(t);
        if (b->xuv != NULL) {
            epd_xport_uv_stop(b->xuv);
            b->xuv = NULL;
        }
        uv_walk(&b->loop, sv_stop_loop, NULL);
    }
}

static int sv_phase_init(sv_t *b, sv_phase_t *ph, const char *name)
{
    memset(ph, 0, sizeof(*ph));
    ph->name = name;
    ph->n = b->n_work;
    ph->res = epd_calloc(b->n_work, sizeof(*ph->res));
    return ph->res != NULL ? 0 : -1;
}

/* Runs the workload once: mode 0 all through the router (hph), 1 all
 * direct (dph), 2 alternating (even arrivals router, odd direct), 3
 * alternating through the router (images: even arrivals with the encoder
 * pool, hph; odd ones encoded by prefill, dph). */
static int sv_run_phase(sv_t *b, int mode, sv_phase_t *hph, sv_phase_t *dph)
{
    int direct = mode == 1 || mode == 2;

    b->mode = mode;
    b->hph = hph;
    b->dph = dph;
    b->next = 0;
    b->deferred_head = 0;
    b->n_deferred = 0;
    b->inflight = 0;
    b->idle = NULL;
    if (uv_loop_init(&b->loop) != 0) {
        return -1;
    }
    if (direct) {
        epd_client_config_t cc;
        epd_status_t st;

        epd_client_config_init(&cc);
        /* the longest prompt travels whole (BOS + one token a byte at most) */
        cc.max_msg_size = epd_msg_cap_for_context(SV_TEXT_BYTES / 2 + 1);
        cc.event_cb = sv_on_client_event;
        cc.cb_arg = b;
        cc.worker_id = "bench-serve";
        cc.secret = b->secret.bytes;
        cc.secret_len = b->secret.len;
        st = epd_client_create(&cc, &b->client);
        if (st == EPD_OK) {
            st = epd_client_add_worker(b->client, b->prefill_ctl, &b->pw);
        }
        if (st == EPD_OK) {
            st = epd_client_add_worker(b->client, b->decode_ctl, &b->dw);
        }
        if (st == EPD_OK) {
            st = epd_xport_uv_start(&b->loop, epd_client_xport(b->client), 10, &b->xuv);
        }
        if (st != EPD_OK) {
            fprintf(stderr, "serve: direct phase: cannot reach the workers %s / %s: %s\n",
                    b->prefill_ctl, b->decode_ctl, epd_status_string(st));
            epd_client_destroy(b->client);
            b->client = NULL;
            uv_loop_close(&b->loop);
            return -1;
        }
    }
    uv_timer_init(&b->loop, &b->tick);
    b->tick.data = b;
    b->t0 = sv_now() + 20 * EPD_NSEC_PER_MSEC;
    if (hph != NULL) {
        hph->t0 = b->t0;
    }
    if (dph != NULL) {
        dph->t0 = b->t0;
    }
    b->hard_end = b->t0 + (uint64_t)(b->duration_s * 1e9) + 60 * EPD_NSEC_PER_SEC;
    uv_timer_start(&b->tick, sv_on_tick, 1, 1);
    uv_run(&b->loop, UV_RUN_DEFAULT);
    if (b->client != NULL) {
        epd_client_destroy(b->client);
        b->client = NULL;
    }
    uv_run(&b->loop, UV_RUN_DEFAULT);
    uv_loop_close(&b->loop);
    return 0;
}

/* ------------------------------------------------------------- the table */

typedef struct {
    double ttft[3], itl[3], e2e[3]; /* p50, p90, p99 in ms (long prompts apart) */
    double long_ttft[3];            /* --long-every's prompts: p50, max, mean in ms */
    uint64_t long_ok;
    uint64_t ok, err, tokens;
    double secs, rps, tps;
    double ttft_mean_all; /* ms, every ok request, warm-up included (vs /metrics) */
    uint64_t n_all;
} sv_stats_t;

static void sv_stats(sv_t *b, sv_phase_t *ph, sv_stats_t *s)
{
    double *ttft = epd_malloc((ph->n + 1) * sizeof(double));
    double *e2e = epd_malloc((ph->n + 1) * sizeof(double));
    double *long_ttft = epd_malloc((ph->n + 1) * sizeof(double));
    size_t n = 0;
    static const double ps[3] = {50, 90, 99};

    memset(s, 0, sizeof(*s));
    if (ttft == NULL || e2e == NULL || long_ttft == NULL) {
        epd_free(ttft);
        epd_free(e2e);
        epd_free(long_ttft);
        return;
    }
    /* the first --warmup requests are sent but not counted */
    for (uint32_t i = (uint32_t)b->warmup < ph->n ? (uint32_t)b->warmup : 0; i < ph->n; i++) {
        const sv_res_t *r = &ph->res[i];

        if (r->unused) {
            continue;
        }
        if (r->err != 0) {
            s->err++;
            continue;
        }
        s->ok++;
        s->tokens += r->n_tokens;
        if (b->work[i].is_long) {
            /* the percentiles are the short prompts' (what a long prompt
             * costs the others); the long ones get their own line */
            double t = (double)(r->t_first - r->t_send) / 1e6;

            long_ttft[s->long_ok++] = t;
            continue;
        }
        ttft[n] = (double)(r->t_first - r->t_send) / 1e6;
        e2e[n] = (double)(r->t_end - r->t_send) / 1e6;
        n++;
    }
    {
        double sum = 0;

        for (uint32_t i = 0; i < ph->n; i++) {
            const sv_res_t *r = &ph->res[i];

            if (!r->unused && r->err == 0 && r->t_first != 0) {
                sum += (double)(r->t_first - r->t_send) / 1e6;
                s->n_all++;
            }
        }
        s->ttft_mean_all = s->n_all > 0 ? sum / (double)s->n_all : NAN;
    }
    epd_bench_sort(ttft, n);
    epd_bench_sort(e2e, n);
    epd_bench_sort(long_ttft, s->long_ok);
    if (s->long_ok > 0) {
        double sum = 0;

        for (uint64_t i = 0; i < s->long_ok; i++) {
            sum += long_ttft[i];
        }
        s->long_ttft[0] = epd_bench_pct(long_ttft, s->long_ok, 50);
        s->long_ttft[1] = long_ttft[s->long_ok - 1];
        s->long_ttft[2] = sum / (double)s->long_ok;
    }
    epd_bench_sort(ph->itl_us, ph->n_itl);
    for (int k = 0; k < 3; k++) {
        s->ttft[k] = epd_bench_pct(ttft, n, ps[k]);
        s->e2e[k] = epd_bench_pct(e2e, n, ps[k]);
        s->itl[k] = epd_bench_pct(ph->itl_us, ph->n_itl, ps[k]) / 1e3;
    }
    /* the counted window: from the first counted arrival to the end */
    {
        uint32_t w0 = (uint32_t)b->warmup < ph->n ? (uint32_t)b->warmup : 0;
        uint64_t start = ph->t0 + b->work[w0].at_ns;

        s->secs = ph->t_end > start ? (double)(ph->t_end - start) / 1e9 : 0;
    }
    s->rps = s->secs > 0 ? (double)s->ok / s->secs : 0;
    s->tps = s->secs > 0 ? (double)s->tokens / s->secs : 0;
    epd_free(ttft);
    epd_free(e2e);
    epd_free(long_ttft);
}

static void sv_print(sv_t *b, sv_phase_t *phs, int n_ph)
{
    sv_stats_t st[2];
    int ir = -1, id = -1;

    if (b->n_images > 0) {
        printf("\nepd-bench serve: %.0f req/s offered for %.1f s (%u requests, first %lld not "
               "counted), chat with one %lldx%lld PNG + %s bytes of text, output %s tokens; "
               "paths alternating (half the rate each): encoders = the encoder pool encodes "
               "the images, local = the prefill worker does (\"epd_encode\": \"local\"); each "
               "path draws from its own %lld images\n",
               b->rate, b->duration_s, b->n_work, (long long)b->warmup, (long long)b->image_size,
               (long long)b->image_size, b->prompt_len, b->output_len, (long long)b->n_images);
    } else {
        printf("\nepd-bench serve: %.0f req/s offered for %.1f s (%u requests, first %lld not "
               "counted), prompt %s bytes, output %s tokens, %s, paths: %s\n",
               b->rate, b->duration_s, b->n_work, (long long)b->warmup, b->prompt_len,
               b->output_len, b->chat ? "chat" : "completions",
               strcmp(b->phases, "ab") == 0 ? "alternating router/direct (half the rate each)"
                                            : b->phases);
    }
    if (b->long_every > 0) {
        char ct[32];

        snprintf(ct, sizeof(ct), "%lld", (long long)b->chunk_tokens);
        printf("long-mixed: arrival N*%lld-1 a %lld-byte prompt; the percentiles below are the "
               "other prompts'; prefill --prefill-chunk-tokens %s%s\n",
               (long long)b->long_every, (long long)b->long_len,
               b->chunk_tokens < 0 ? "(the engine's default)" : ct,
               b->no_prefix_cache ? ", --no-prefix-cache" : "");
    }
    printf("%-8s %7s %6s %8s %9s | %8s %8s %8s | %7s %7s %7s | %8s %8s %8s\n", "path", "ok",
           "errors", "req/s", "tok/s", "ttft_p50", "ttft_p90", "ttft_p99", "itl_p50", "itl_p90",
           "itl_p99", "e2e_p50", "e2e_p90", "e2e_p99");
    printf("%-8s %7s %6s %8s %9s | %8s %8s %8s | %7s %7s %7s | %8s %8s %8s\n", "", "", "", "", "",
           "ms", "ms", "ms", "ms", "ms", "ms", "ms", "ms", "ms");
    for (int k = 0; k < n_ph; k++) {
        sv_stats_t *s = &st[k];

        sv_stats(b, &phs[k], s);
        if (strcmp(phs[k].name, "router") == 0) {
            ir = k;
        } else {
            id = k;
        }
        printf("%-8s %7llu %6llu %8.1f %9.0f | %8.3f %8.3f %8.3f | %7.3f %7.3f %7.3f | %8.3f "
               "%8.3f %8.3f\n",
               phs[k].name, (unsigned long long)s->ok, (unsigned long long)s->err, s->rps, s->tps,
               s->ttft[0], s->ttft[1], s->ttft[2], s->itl[0], s->itl[1], s->itl[2], s->e2e[0],
               s->e2e[1], s->e2e[2]);
    }
    for (int k = 0; k < n_ph && b->long_every > 0; k++) {
        printf("  %s long prompts: %llu ok, TTFT p50 %.3f ms, max %.3f ms, mean %.3f ms\n",
               phs[k].name, (unsigned long long)st[k].long_ok, st[k].long_ttft[0],
               st[k].long_ttft[1], st[k].long_ttft[2]);
    }
    for (int k = 0; k < n_ph; k++) {
        for (int e = 0; e < phs[k].n_errs; e++) {
            printf("  %s errors: %llu x %s%s%s\n", phs[k].name,
                   (unsigned long long)phs[k].errs[e].count, phs[k].errs[e].name,
                   phs[k].errs[e].example[0] != '\0' ? "  e.g. " : "", phs[k].errs[e].example);
        }
    }
    if (b->n_images > 0) {
        double d[6];

        for (int k = 0; k < 6; k++) {
            d[k] = b->img1[k] - b->img0[k];
        }
        printf("images (the router's /metrics over the run): %.0f, cache hits %.0f (hit rate "
               "%.1f%%), encoded by the encoder pool %.0f, by prefill %.0f, stale hints %.0f, "
               "retries %.0f\n",
               d[0], d[1], d[0] > 0 ? 100.0 * d[1] / d[0] : 0.0, d[2], d[3], d[4], d[5]);
        if (n_ph == 2) {
            printf("encoder pool vs prefill encoding (encoders - local): TTFT p50 %+.3f ms, p99 "
                   "%+.3f ms; E2E p50 %+.3f ms\n",
                   st[0].ttft[0] - st[1].ttft[0], st[0].ttft[2] - st[1].ttft[2],
                   st[0].e2e[0] - st[1].e2e[0]);
        }
    } else if (ir >= 0 && id >= 0) {
        printf("router adds (router - direct): TTFT p50 %+.0f us, p99 %+.0f us; E2E p50 %+.0f us, "
               "p99 %+.0f us\n",
               (st[ir].ttft[0] - st[id].ttft[0]) * 1e3, (st[ir].ttft[2] - st[id].ttft[2]) * 1e3,
               (st[ir].e2e[0] - st[id].e2e[0]) * 1e3, (st[ir].e2e[2] - st[id].e2e[2]) * 1e3);
    }
    if (ir >= 0 && b->m_count > 0) {
        printf("TTFT means over every ok request (warm-up included): the router's own /metrics "
               "(request parsed -> first token at the router) %.3f ms over %llu; this client, "
               "router path %.3f ms over %llu",
               b->m_sum / (double)b->m_count * 1e3, (unsigned long long)b->m_count,
               st[ir].ttft_mean_all, (unsigned long long)st[ir].n_all);
        if (id >= 0) {
            printf(", direct %.3f ms over %llu", st[id].ttft_mean_all,
                   (unsigned long long)st[id].n_all);
        }
        printf("\n");
    }
    fflush(stdout);
}

/* The values of the router's `n` series `names` from GET /metrics
 * (5 s at most; before and after the run only): absent ones read 0, and
 * how many were there into *found_p.  0, or -1 when /metrics did not
 * answer. */
static int sv_metrics_get(const sv_t *b, const char *const *names, int n, double *out,
                          int *found_p)
{
    char *text = NULL;
    int found = 0;

    if (epd_bench_http_get(b->router, "/metrics", 5000, &text, NULL) != EPD_OK) {
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (epd_bench_metric(text, names[i], &out[i])) {
            found++;
        } else {
            out[i] = 0.0;
        }
    }
    epd_free(text);
    if (found_p != NULL) {
        *found_p = found;
    }
    return 0;
}

/* The router's epd_router_ttft_seconds _sum and _count.  0, or -1 when
 * /metrics did not answer or lacks them. */
static int sv_metrics_ttft(const sv_t *b, double *sum_p, uint64_t *count_p)
{
    static const char *const names[2] = {"epd_router_ttft_seconds_sum",
                                         "epd_router_ttft_seconds_count"};
    double v[2];
    int found = 0;

    if (sv_metrics_get(b, names, 2, v, &found) != 0 || found != 2) {
        return -1;
    }
    *sum_p = v[0];
    *count_p = (uint64_t)v[1];
    return 0;
}

static const char *const sv_img_metrics[6] = {
    "epd_router_images_total",         "epd_router_image_cache_hits_total",
    "epd_router_images_encoded_total", "epd_router_images_local_total",
    "epd_router_image_cache_stale_total", "epd_router_retries_total",
};

/* ------------------------------------------------------------ the cluster */

static int sv_make_secret(sv_t *b)
{
    return epd_bench_make_secret(b->tmp, b->secret_file, sizeof(b->secret_file), &b->secret,
                                 "serve");
}

static int sv_wait_workers(const sv_t *b, const char *ctl, int want)
{
    return epd_bench_wait_workers(ctl, &b->secret, want);
}

static int sv_cluster_start(sv_t *b)
{
    char model[PATH_MAX + 16], rready[PATH_MAX + 16], pready[PATH_MAX + 16], dready[PATH_MAX + 16];
    char rlog[PATH_MAX + 16], plog[PATH_MAX + 16], dlog[PATH_MAX + 16];
    char exe[PATH_MAX + 32], pexe[PATH_MAX + 32], dexe[PATH_MAX + 32];
    char pblocks[24], dblocks[24], chunk[24];
    /* a long prompt's blocks on top of the short prompts' pools, twice (a
     * second one may arrive while the first's blocks are still held) */
    uint64_t extra = b->long_every > 0 ? 2 * ((uint64_t)b->long_len / 16 + 2) : 0;

    snprintf(pblocks, sizeof(pblocks), "%llu", (unsigned long long)(8192 + extra));
    snprintf(dblocks, sizeof(dblocks), "%llu", (unsigned long long)(16384 + extra));
    snprintf(chunk, sizeof(chunk), "%lld", (long long)b->chunk_tokens);
    snprintf(b->tmp, sizeof(b->tmp), "/tmp/epd-serve.XXXXXX");
    if (mkdtemp(b->tmp) == NULL) {
        return -1;
    }
    if (sv_make_secret(b) != 0) {
        return -1;
    }
    if (b->sim_model != NULL) {
        snprintf(model, sizeof(model), "%s", b->sim_model);
    } else if (b->n_images > 0) {
        /* images: epd-mkmodel's default model (ref, with its vision encoder) */
        char mk[PATH_MAX + 32], mklog[PATH_MAX + 16];
        int status = 0;
        pid_t pid;

        snprintf(model, sizeof(model), "%s/vlm", b->tmp);
        snprintf(mk, sizeof(mk), "%s/epd-mkmodel", b->bindir);
        snprintf(mklog, sizeof(mklog), "%s/mkmodel.log", b->tmp);
        {
            char *argv[] = {mk, "--out", model, NULL};

            pid = epd_bench_spawn(argv, mklog);
        }
        if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0) {
            fprintf(stderr, "serve: epd-mkmodel failed (log: %s)\n", mklog);
            return -1;
        }
    } else {
        snprintf(model, sizeof(model), "%s/sim", b->tmp);
        /* long prompts: a context that holds them and their output */
        if (epd_bench_write_sim_ctx(model, b->long_len + 4096 > 4096
                                               ? (uint32_t)(b->long_len + 4096)
                                               : 4096) != 0) {
            fprintf(stderr, "serve: cannot write the sim model into %s\n", model);
            return -1;
        }
    }
    snprintf(b->model_buf, sizeof(b->model_buf), "%s", model);
    b->model_dir = b->model_buf;
    snprintf(rready, sizeof(rready), "%s/router.ready", b->tmp);
    snprintf(pready, sizeof(pready), "%s/prefill.ready", b->tmp);
    snprintf(dready, sizeof(dready), "%s/decode.ready", b->tmp);
    snprintf(rlog, sizeof(rlog), "%s/router.log", b->tmp);
    snprintf(plog, sizeof(plog), "%s/prefill.log", b->tmp);
    snprintf(dlog, sizeof(dlog), "%s/decode.log", b->tmp);
    snprintf(exe, sizeof(exe), "%s/epd-router", b->bindir);
    snprintf(pexe, sizeof(pexe), "%s/epd-prefill", b->bindir);
    snprintf(dexe, sizeof(dexe), "%s/epd-decode", b->bindir);
    {
        char *argv[] = {exe,
                        "--listen",
                        "127.0.0.1:0",
                        "--control-addr",
                        "127.0.0.1:0",
                        "--model",
                        model,
                        "--engine",
                        (char *)b->engine_name,
                        "--served-model-name",
                        (char *)b->model_name,
                        "--ready-file",
                        rready,
                        "--cluster-secret-file",
                        b->secret_file,
                        /* every waiting request holds a connection from
                         * 127.0.0.1: no per-address cap */
                        "--max-connections-per-addr",
                        "0",
                        "--log-level",
                        "warn",
                        NULL};

        b->pids[0] = epd_bench_spawn(argv, rlog);
    }
    if (b->pids[0] < 0 ||
        epd_bench_wait_ready(rready, b->pids[0], "http", b->router_buf, sizeof(b->router_buf)) != 0 ||
        epd_bench_wait_ready(rready, b->pids[0], "control", b->router_ctl_buf,
                      sizeof(b->router_ctl_buf)) != 0) {
        fprintf(stderr, "serve: the router did not start (log: %s)\n", rlog);
        return -1;
    }
    b->router = b->router_buf;
    b->router_ctl = b->router_ctl_buf;
    {
        char *argv[] = {dexe,
                        "--model",
                        model,
                        "--engine",
                        (char *)b->engine_name,
                        "--worker-id",
                        "decode-0",
                        "--router",
                        b->router_ctl_buf,
                        "--ready-file",
                        dready,
                        "--kv-blocks",
                        dblocks,
                        "--max-batch",
                        "256",
                        "--state-slots",
                        "1024",
                        "--cluster-secret-file",
                        b->secret_file,
                        "--log-level",
                        "warn",
                        NULL};

        b->pids[1] = epd_bench_spawn(argv, dlog);
    }
    {
        char *argv[] = {
            pexe,          "--model",     model,      "--engine",        (char *)b->engine_name,
            "--worker-id", "prefill-0",   "--router", b->router_ctl_buf, "--ready-file",
            pready,        "--kv-blocks", pblocks,    "--state-slots",   "512",
            "--cluster-secret-file", b->secret_file,
            "--log-level", "warn",        NULL, NULL, NULL, NULL};
        int n = 19;

        if (b->chunk_tokens >= 0) {
            argv[n++] = "--prefill-chunk-tokens";
            argv[n++] = chunk;
        }
        if (b->no_prefix_cache) {
            argv[n++] = "--no-prefix-cache";
        }

        b->pids[2] = epd_bench_spawn(argv, plog);
    }
    if (b->pids[1] < 0 || b->pids[2] < 0 ||
        epd_bench_wait_ready(dready, b->pids[1], "control", b->d_ctl_buf, sizeof(b->d_ctl_buf)) != 0 ||
        epd_bench_wait_ready(pready, b->pids[2], "control", b->p_ctl_buf, sizeof(b->p_ctl_buf)) != 0) {
        fprintf(stderr, "serve: a worker did not start (logs: %s, %s)\n", plog, dlog);
        return -1;
    }
    b->prefill_ctl = b->p_ctl_buf;
    b->decode_ctl = b->d_ctl_buf;
    if (b->n_images > 0) {
        char eexe[PATH_MAX + 32], eready[PATH_MAX + 16], elog[PATH_MAX + 16];

        snprintf(eexe, sizeof(eexe), "%s/epd-encoder", b->bindir);
        snprintf(eready, sizeof(eready), "%s/encoder.ready", b->tmp);
        snprintf(elog, sizeof(elog), "%s/encoder.log", b->tmp);
        {
            char *argv[] = {eexe,        "--model",     model,      "--engine",
                            (char *)b->engine_name,     "--worker-id", "encoder-0",
                            "--router",  b->router_ctl_buf,         "--ready-file",
                            eready,      "--cluster-secret-file",   b->secret_file,
                            "--log-level", "warn",     NULL};

            b->pids[3] = epd_bench_spawn(argv, elog);
        }
        if (b->pids[3] < 0 ||
            epd_bench_wait_ready(eready, b->pids[3], "control", b->enc_ctl_buf,
                          sizeof(b->enc_ctl_buf)) != 0) {
            fprintf(stderr, "serve: the encoder did not start (log: %s)\n", elog);
            return -1;
        }
    }
    if (sv_wait_workers(b, b->router_ctl, b->n_images > 0 ? 3 : 2) != 0) {
        fprintf(stderr, "serve: the workers did not become READY at the router (logs in %s)\n",
                b->tmp);
        return -1;
    }
    fprintf(stderr, "serve: cluster up: router http=%s control=%s, prefill %s, decode %s (%s)\n",
            b->router, b->router_ctl, b->prefill_ctl, b->decode_ctl, b->tmp);
    return 0;
}

static void sv_cluster_stop(sv_t *b)
{
    static const char *const names[4] = {"router", "decode", "prefill", "encoder"};

    for (int i = 3; i >= 0; i--) {
        epd_bench_kill(b->pids[i], "serve", names[i]);
        b->pids[i] = 0;
    }
}

/* ------------------------------------------------------------------ main */

static int sv_tokenize(sv_t *b)
{
    epd_engine_config_t ec;
    epd_engine_t *e = NULL;
    epd_status_t st;

    memset(&ec, 0, sizeof(ec));
    ec.model_dir = b->model_dir;
    ec.block_tokens = 16;
    ec.max_batch = 1;
    st = epd_engine_open(b->engine_name, &ec, &e);
    if (st != EPD_OK) {
        fprintf(stderr, "serve: cannot open the model %s (engine %s) to tokenize: %s\n",
                b->model_dir, b->engine_name, epd_status_string(st));
        return -1;
    }
    for (uint32_t i = 0; i < b->n_work; i++) {
        sv_work_t *w = &b->work[i];
        size_t cap = w->text_len * 4 + 64, n = 0;
        char *chat = NULL;
        const char *text = b->text + w->text_off;
        size_t len = w->text_len;

        if (b->chat) {
            /* the router's chat template (docs/api.md), one user message */
            chat = epd_malloc(w->text_len + 64);
            if (chat == NULL) {
                epd_engine_close(e);
                return -1;
            }
            len = (size_t)snprintf(chat, w->text_len + 64, "<|user|>\n%.*s\n<|assistant|>\n",
                                   (int)w->text_len, text);
            text = chat;
        }
        w->tokens = epd_malloc(cap * sizeof(int32_t));
        st = w->tokens != NULL ? epd_engine_tokenize(e, text, len, 1, w->tokens, cap, &n)
                               : EPD_ERR_NO_MEMORY;
        epd_free(chat);
        if (st != EPD_OK) {
            epd_engine_close(e);
            return -1;
        }
        w->n_tokens = (uint32_t)n;
    }
    epd_engine_close(e);
    return 0;
}

int epd_bench_serve_main(int argc, char **argv)
{
    static sv_t b;
    static const char *workload_help = "default";
    const char *ext_secret = NULL;
    sv_phase_t phs[2];
    double m_sum0 = 0, m_sum1 = 0;
    uint64_t m_count0 = UINT64_MAX, m_count1 = 0;
    int n_ph = 0;
    int rc = 1;
    const epd_opt_t opts[] = {
        {"router", EPD_OPT_STRING, &b.router, 0, 0,
         "the router's HTTP address HOST:PORT (absent: start a cluster from build/bin)"},
        {"prefill", EPD_OPT_STRING, &b.prefill_ctl, 0, 0,
         "with --router: a prefill worker's control address, for the direct phase"},
        {"decode", EPD_OPT_STRING, &b.decode_ctl, 0, 0,
         "with --router: a decode worker's control address, for the direct phase"},
        {"model", EPD_OPT_STRING, &b.model_dir, 0, 0,
         "with --router: the model folder (tokenizer of the direct phase)"},
        {"sim-model", EPD_OPT_STRING, &b.sim_model, 0, 0,
         "own cluster: this model folder instead of the built-in small sim profile"},
        {"engine", EPD_OPT_STRING, &b.engine_name, 0, 0, "the workers' engine: sim or ref"},
        {"model-name", EPD_OPT_STRING, &b.model_name, 0, 0, "the served model name"},
        {"rate", EPD_OPT_DOUBLE, &b.rate, 0, 0, "requests per second (Poisson arrivals)"},
        {"duration", EPD_OPT_DOUBLE, &b.duration_s, 0, 0, "seconds of arrivals per phase"},
        {"prompt-len", EPD_OPT_STRING, &b.prompt_len, 0, 0,
         "prompt bytes (= tokens - 1, byte tokenizer): N or A:B uniform"},
        {"output-len", EPD_OPT_STRING, &b.output_len, 0, 0, "max_tokens: N or A:B uniform"},
        {"phases", EPD_OPT_STRING, &b.phases, 0, 0,
         "router, direct, router,direct (one after the other, each at --rate) or ab (one run, "
         "arrivals alternating between the two paths: each gets half the rate)"},
        {"max-inflight", EPD_OPT_INT, &b.max_inflight, 1, 1 << 20,
         "requests outstanding at most (later arrivals are dropped and counted)"},
        {"warmup", EPD_OPT_INT, &b.warmup, 0, 1 << 30, "first requests of a phase not counted"},
        {"seed", EPD_OPT_INT, &b.seed, 0, 1e15, "workload seed"},
        {"chat", EPD_OPT_BOOL, &b.chat, 0, 0, "POST /v1/chat/completions instead of completions"},
        {"keep", EPD_OPT_BOOL, &b.keep, 0, 0, "keep the cluster's temp folder (logs)"},
        {"images", EPD_OPT_INT, &b.n_images, 0, 100000,
         "multimodal mix: every request a chat with one PNG drawn from N distinct images per "
         "path; paths encoders vs local (prefill encodes) alternate; own cluster: ref with "
         "vision + 1 encoder (0: text requests)"},
        {"image-size", EPD_OPT_INT, &b.image_size, 8, 4096, "the images' width and height"},
        {"long-len", EPD_OPT_INT, &b.long_len, 0, SV_TEXT_BYTES / 2 - 1,
         "long-mixed workload: the long prompts' bytes (= tokens - 1); own cluster: the sim "
         "model's context and the pools grow to hold two"},
        {"long-every", EPD_OPT_INT, &b.long_every, 0, 1 << 30,
         "every N-th arrival is a --long-len prompt (0: none); TTFT/E2E percentiles are then "
         "the other prompts', the long ones get their own line"},
        {"prefill-chunk-tokens", EPD_OPT_INT, &b.chunk_tokens, -1, 1 << 24,
         "own cluster: prefill's --prefill-chunk-tokens (0: off; -1: the engine's default)"},
        {"no-prefix-cache", EPD_OPT_BOOL, &b.no_prefix_cache, 0, 0,
         "own cluster: prefill without its prefix cache (long prompts then evict nothing into "
         "its host tier)"},
        {"workload", EPD_OPT_STRING, &workload_help, 0, 0,
         "shared-prefix: the prefix cache off vs on, its own options (--workload shared-prefix "
         "--help)"},
        {"cluster-secret-file", EPD_OPT_STRING, &ext_secret, 0, 0,
         "with --router: the cluster's secret (Status calls and the direct phase); an own "
         "cluster gets a fresh one"},
    };
    epd_opts_t o = {.prog = "epd-bench serve",
                    .summary = "serving load (Poisson arrivals) through the router vs straight "
                               "to the workers: TTFT, ITL, E2E, throughput, errors",
                    .opts = opts,
                    .n_opts = sizeof(opts) / sizeof(opts[0])};
    epd_status_t status;
    int argi;

    memset(&b, 0, sizeof(b));
    memset(phs, 0, sizeof(phs));
    b.engine_name = "sim";
    b.model_name = "bench-sim";
    b.rate = 200;
    b.duration_s = 20;
    b.prompt_len = "16:128";
    b.output_len = "4:16";
    b.phases = "ab";
    b.max_inflight = 4096;
    b.warmup = 200;
    b.seed = 1;
    b.image_size = 224;
    b.chunk_tokens = -1;
    signal(SIGPIPE, SIG_IGN);
    for (int k = 1; k < argc; k++) {
        /* the prefix-cache workloads are their own benchmark */
        if (strncmp(argv[k], "--workload", 10) == 0) {
            return epd_bench_prefix_main(argc, argv);
        }
    }
    status = epd_opts_parse(&o, argc, argv, &argi);
    if (status != EPD_OK) {
        epd_opts_cleanup(&o);
        return status == EPD_ERR_CANCELED ? 0 : 2;
    }
    if (argi != argc || !(b.rate > 0) || !(b.duration_s > 0)) {
        fprintf(stderr, "serve: --rate and --duration must be > 0 (see --help)\n");
        goto out;
    }
    if (epd_bench_bindir(b.bindir, sizeof(b.bindir)) != 0) {
        goto out;
    }
    if (b.n_images > 0) {
        /* the multimodal mix: ref with its vision encoder, chat, both
         * router paths interleaved; a lighter default load */
        int rate_given = 0, dur_given = 0, warm_given = 0;

        for (int k = 1; k < argc; k++) {
            rate_given |= strncmp(argv[k], "--rate", 6) == 0;
            dur_given |= strncmp(argv[k], "--duration", 10) == 0;
            warm_given |= strncmp(argv[k], "--warmup", 8) == 0;
        }
        if (!rate_given) {
            b.rate = 8;
        }
        if (!dur_given) {
            b.duration_s = 30;
        }
        if (!warm_given) {
            b.warmup = 8;
        }
        if (strcmp(b.engine_name, "sim") == 0) {
            b.engine_name = "ref";
        }
        if (strcmp(b.model_name, "bench-sim") == 0) {
            b.model_name = "bench-vlm";
        }
        if (strcmp(b.prompt_len, "16:128") == 0) {
            b.prompt_len = "16:64";
        }
        b.phases = "ab";
        if (sv_images_make(&b) != 0) {
            fprintf(stderr, "serve: cannot make the images\n");
            goto out;
        }
    }
    if (sv_workload(&b) != 0) {
        goto out;
    }
    if (b.router == NULL) {
        if (sv_cluster_start(&b) != 0) {
            goto out_cluster;
        }
    } else if (ext_secret != NULL) {
        char why[256];

        if (epd_secret_load(ext_secret, &b.secret, why, sizeof(why)) != EPD_OK) {
            fprintf(stderr, "serve: --cluster-secret-file: %s\n", why);
            goto out;
        }
    }
    {
        const char *colon = strrchr(b.router, ':');
        char host[64];

        if (colon == NULL || (size_t)(colon - b.router) >= sizeof(host)) {
            fprintf(stderr, "serve: --router wants HOST:PORT\n");
            goto out_cluster;
        }
        snprintf(host, sizeof(host), "%.*s", (int)(colon - b.router), b.router);
        if (uv_ip4_addr(host, atoi(colon + 1), &b.addr) != 0) {
            fprintf(stderr, "serve: --router %s: not an IPv4 address\n", b.router);
            goto out_cluster;
        }
    }
    {
        int ab = strcmp(b.phases, "ab") == 0;
        int want_r = ab || strstr(b.phases, "router") != NULL;
        int want_d = ab || strstr(b.phases, "direct") != NULL;

        if (!want_r && !want_d) {
            fprintf(stderr, "serve: --phases wants router, direct, router,direct or ab\n");
            goto out_cluster;
        }
        if (b.n_images > 0) {
            (void)sv_metrics_get(&b, sv_img_metrics, 6, b.img0, NULL);
            fprintf(stderr, "serve: images: encoders and local interleaved, %u requests at "
                            "%.1f/s\n",
                    b.n_work, b.rate);
            if (sv_phase_init(&b, &phs[0], "encoders") == 0 &&
                sv_phase_init(&b, &phs[1], "local") == 0 &&
                sv_run_phase(&b, 3, &phs[0], &phs[1]) == 0) {
                n_ph = 2;
            }
            (void)sv_metrics_get(&b, sv_img_metrics, 6, b.img1, NULL);
            want_r = want_d = ab = 0;
        }
        if (want_d && (b.prefill_ctl == NULL || b.decode_ctl == NULL || b.model_dir == NULL)) {
            fprintf(stderr, "serve: the direct path needs --prefill, --decode and --model with "
                            "--router: skipped\n");
            want_d = 0;
            ab = 0;
        }
        if (want_d && sv_tokenize(&b) != 0) {
            goto out_cluster;
        }
        if (want_r && sv_metrics_ttft(&b, &m_sum0, &m_count0) != 0) {
            m_count0 = UINT64_MAX; /* no /metrics: the line is left out */
        }
        if (ab) {
            fprintf(stderr, "serve: router and direct interleaved: %u requests at %.0f/s\n",
                    b.n_work, b.rate);
            if (sv_phase_init(&b, &phs[0], "router") == 0 &&
                sv_phase_init(&b, &phs[1], "direct") == 0 &&
                sv_run_phase(&b, 2, &phs[0], &phs[1]) == 0) {
                n_ph = 2;
            }
        } else {
            if (want_r) {
                fprintf(stderr, "serve: router phase: %u requests at %.0f/s\n", b.n_work, b.rate);
                if (sv_phase_init(&b, &phs[n_ph], "router") == 0 &&
                    sv_run_phase(&b, 0, &phs[n_ph], NULL) == 0) {
                    n_ph++;
                }
            }
            if (want_d) {
                fprintf(stderr, "serve: direct phase: %u requests at %.0f/s\n", b.n_work, b.rate);
                if (sv_phase_init(&b, &phs[n_ph], "direct") == 0 &&
                    sv_run_phase(&b, 1, NULL, &phs[n_ph]) == 0) {
                    n_ph++;
                }
            }
        }
    }
    if (m_count0 != UINT64_MAX && sv_metrics_ttft(&b, &m_sum1, &m_count1) == 0 &&
        m_count1 > m_count0) {
        b.m_sum = m_sum1 - m_sum0;
        b.m_count = m_count1 - m_count0;
    }
    if (n_ph > 0) {
        sv_print(&b, phs, n_ph);
        rc = 0;
    }
    if (rc == 0 && b.n_images > 0 && b.enc_ctl_buf[0] != '\0') {
        /* the encoder alone, saturated: images/s at a few in flight */
        char exe[PATH_MAX + 32], w[16], cmd[4 * PATH_MAX + 256];

        snprintf(exe, sizeof(exe), "%s/epd-encoder-load", b.bindir);
        snprintf(w, sizeof(w), "%lld", (long long)b.image_size);
        snprintf(cmd, sizeof(cmd),
                 "'%s' --encoder %s --images 100 --inflight 4 --width %s --height %s --format png "
                 "--cluster-secret-file '%s' "
                 "2>&1 | sed 's/^/encoder alone (epd-encoder-load, 4 in flight): /'",
                 exe, b.enc_ctl_buf, w, w, b.secret_file);
        fflush(stdout);
        if (system(cmd) != 0) {
            fprintf(stderr, "serve: epd-encoder-load failed\n");
        }
    }
    for (int k = 0; k < 2; k++) {
        epd_free(phs[k].res);
        epd_free(phs[k].itl_us);
    }
out_cluster:
    sv_cluster_stop(&b);
    if (b.tmp[0] != '\0' && rc == 0 && !b.keep) {
        char cmd[PATH_MAX + 16];

        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", b.tmp);
        if (system(cmd) != 0) {
            fprintf(stderr, "serve: could not remove %s\n", b.tmp);
        }
    } else if (b.tmp[0] != '\0') {
        fprintf(stderr, "serve: logs kept in %s\n", b.tmp);
    }
out:
    if (b.work != NULL) {
        for (uint32_t i = 0; i < b.n_work; i++) {
            epd_free(b.work[i].tokens);
        }
    }
    epd_free(b.work);
    epd_free(b.deferred);
    epd_free(b.text);
    sv_images_free(&b);
    epd_secret_wipe(&b.secret);
    epd_opts_cleanup(&o);
    return rc;
}
