/*
 * epd_bench_serve_http.c — `epd-bench serve`'s router path, on the
 * streaming client of epd_bench_sse.c: each arrival's request (streaming
 * POST /v1/completions, a chat, or a chat with one image) and what its
 * stream says: TTFT = the first event carrying text, ITL = the gaps
 * between text events, E2E = the answer's end (`data: [DONE]`), the
 * completion tokens from the usage event, and how a request that did not
 * end well ended (its error kind).  One thread (the phase's loop).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_bench_serve_int.h"

/* The client's `user` of a request: its arrival and its phase (1: the
 * second path's, b->dph). */
static void *sv_user(const sv_t *b, uint32_t i, const sv_phase_t *ph)
{
    return (void *)(((uintptr_t)i << 1) | (ph == b->dph));
}

static sv_phase_t *sv_user_phase(const sv_t *b, void *user, sv_res_t **r_p)
{
    uintptr_t u = (uintptr_t)user;
    sv_phase_t *ph = (u & 1u) ? b->dph : b->hph;

    *r_p = &ph->res[u >> 1];
    return ph;
}

static void sv_on_send(void *arg, void *user, uint64_t now)
{
    sv_res_t *r;

    (void)sv_user_phase(arg, user, &r);
    r->t_send = now;
}

/* One SSE event's data payload, other than [DONE] and an error. */
static void sv_on_data(void *arg, void *user, const char *data, uint64_t now)
{
    sv_t *b = arg;
    sv_res_t *r;
    sv_phase_t *ph = sv_user_phase(b, user, &r);
    const char *key = b->chat || b->n_images > 0 ? "\"content\":\"" : "\"text\":\"";
    const char *p;

    p = strstr(data, key);
    if (p != NULL && p[strlen(key)] != '"') {
        epd__sv_token_event(ph, r, now);
    }
    p = strstr(data, "\"completion_tokens\":");
    if (p != NULL) {
        r->n_tokens = (uint32_t)strtoul(p + 20, NULL, 10);
    }
}

/* The request ended: recorded, with its error kind if it did not end well. */
static void sv_on_end(void *arg, void *user, const epd_bench_sse_end_t *end, uint64_t now)
{
    sv_t *b = arg;
    sv_res_t *r;
    sv_phase_t *ph = sv_user_phase(b, user, &r);

    if (r->done) {
        return; /* already ended (the benchmark's deadline) */
    }
    if (end->lost != NULL) {
        epd__sv_err(ph, r, end->lost);
    } else if (end->status != 200) {
        char kind[48];

        snprintf(kind, sizeof(kind), "HTTP %d", end->status);
        epd__sv_err_ex(ph, r, kind, end->body);
    } else if (end->error != NULL) {
        epd__sv_err_ex(ph, r, "error event in stream", end->error);
    } else if (!end->saw_done) {
        epd__sv_err(ph, r, "stream without [DONE]");
    } else if (r->t_first == 0) {
        epd__sv_err(ph, r, "no text generated");
    }
    epd__sv_finish(b, r, now);
}

void epd__sv_http_cbs(sv_t *b, epd_bench_sse_cbs_t *cbs_p)
{
    memset(cbs_p, 0, sizeof(*cbs_p));
    cbs_p->on_send = sv_on_send;
    cbs_p->on_data = sv_on_data;
    cbs_p->on_end = sv_on_end;
    cbs_p->arg = b;
}

void epd__sv_http_start(sv_t *b, uint32_t i, sv_phase_t *ph)
{
    const sv_work_t *w = &b->work[i];
    size_t cap = SV_TEXT_BYTES / 2 + 512 + (w->image >= 0 ? b->img_url_len[w->image] + 128 : 0);
    char *body = epd_malloc(cap), *req;
    int bl, hl;

    /* sent as far as the phase's deadline sweep is concerned; on_send sets
     * the time again when the bytes go (after the connect, for a new
     * connection): the latencies run from there, as they always did */
    ph->res[i].t_send = sv_now();
    if (body == NULL) {
        epd__sv_err(ph, &ph->res[i], "out of memory");
        epd__sv_finish(b, &ph->res[i], sv_now());
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
                      ph == b->dph ? ",\"epd_encode\":\"local\"" : "");
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
    req = epd_malloc((size_t)bl + 256);
    if (req == NULL) {
        epd_free(body);
        epd__sv_err(ph, &ph->res[i], "out of memory");
        epd__sv_finish(b, &ph->res[i], sv_now());
        return;
    }
    hl = snprintf(req, 256,
                  "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                  "Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n",
                  b->chat || w->image >= 0 ? "/v1/chat/completions" : "/v1/completions", b->router,
                  bl);
    memcpy(req + hl, body, (size_t)bl);
    epd_free(body);
    epd_bench_sse_start(b->sse, req, (size_t)(hl + bl), sv_user(b, i, ph));
}
