/*
 * epd_router_api.c — the router's HTTP side: routes, the OpenAI endpoints,
 * and each generation request from parse to its last token.
 *
 * A request: parse and validate (epd_openai), tokenize with the engine's
 * tokenizer (BOS added, as epd-generate does), check the length, pick a
 * prefill and a decode worker (the registry's policy) and submit through
 * the request-plane client.  Token chunks are detokenized as they come and
 * either streamed (SSE, started at the first token so that a failure
 * before it can still be an HTTP error status) or gathered for one JSON
 * answer.  Stop strings are matched on the raw bytes; a stream holds back
 * the last (longest stop - 1) bytes until they cannot start a match.
 *
 * Failures: an attempt that fails before any token (a refusal for
 * capacity, a draining or dead worker) is sent again to other workers, at
 * most --max-retries times, within the request's deadline; after tokens
 * went out, a failure ends the stream with an error event.  A client that
 * disconnects aborts the attempt on both workers.  The request's memory
 * lives until the client's terminal event for its attempt (or at once
 * when no attempt is in flight).
 *
 * Generated text equals epd-generate's for the same prompt and sampling
 * settings: an absent seed is 0 (epd-generate's default), so outputs are
 * reproducible.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "epd_alloc.h"
#include "epd_hash.h"
#include "epd_image.h"
#include "epd_log.h"
#include "epd_router_int.h"
#include "epd_time.h"

#define EPD__JSON "application/json"

/* ------------------------------------------------------------- helpers */

static void epd__respond_error(epd_router_t *rt, epd_http_req_t *http, const epd_oai_error_t *err)
{
    epd_oai_buf_reset(&rt->out);
    if (epd_oai_error_encode(err, &rt->out) != EPD_OK) {
        (void)epd_http_respond(http, 500, EPD__JSON, "{}", 2);
        return;
    }
    (void)epd_http_respond(http, err->http_status, EPD__JSON, rt->out.data, rt->out.len);
}

static void epd__respond_simple_error(epd_router_t *rt, epd_http_req_t *http, int status,
                                      const char *msg)
{
    epd_oai_error_t err;

    epd_oai_error_set(&err, status, NULL, NULL, "%s", msg);
    epd__respond_error(rt, http, &err);
}

static void epd__req_free(epd_router_t *rt, epd_router_req_t *r)
{
    if (r->prev != NULL) {
        r->prev->next = r->next;
    } else {
        rt->reqs = r->next;
    }
    if (r->next != NULL) {
        r->next->prev = r->prev;
    }
    rt->n_reqs--;
    epd_oai_request_destroy(r->oai);
    epd_oai_stream_cleanup(&r->stream);
    epd_free(r->img_hash);
    epd_free(r->img_pos);
    epd_free(r->prompt);
    epd_free(r->text);
    epd_free(r);
}

void epd__router_reqs_free_all(epd_router_t *rt)
{
    while (rt->reqs != NULL) {
        epd_router_req_t *r = rt->reqs;

        if (r->pw != NULL) {
            epd_router_worker_unref(r->pw);
        }
        if (r->dw != NULL) {
            epd_router_worker_unref(r->dw);
        }
        for (uint32_t k = 0; k < r->n_images; k++) {
            if (r->img_enc[k] != NULL) {
                epd_router_worker_unref(r->img_enc[k]);
            }
        }
        epd__req_free(rt, r);
    }
}

/* The attempt in flight ended (its terminal event came): give back the
 * workers' load and references. */
static void epd__attempt_end(epd_router_req_t *r)
{
    if (r->pw != NULL) {
        if (r->prefill_counted) {
            r->pw->queued_tokens -= r->n_prompt;
            r->prefill_counted = 0;
        }
        r->pw->inflight--;
        epd_router_worker_unref(r->pw);
        r->pw = NULL;
    }
    if (r->dw != NULL) {
        r->dw->inflight--;
        epd_router_worker_unref(r->dw);
        r->dw = NULL;
    }
    for (uint32_t k = 0; k < r->n_images; k++) {
        if (r->img_enc[k] != NULL) {
            r->img_enc[k]->inflight--;
            epd_router_worker_unref(r->img_enc[k]);
            r->img_enc[k] = NULL;
        }
    }
    r->client_id = 0;
    r->upstream_aborted = 0;
}

static void epd__abort_upstream(epd_router_t *rt, epd_router_req_t *r)
{
    if (r->client_id != 0 && !r->upstream_aborted) {
        r->upstream_aborted = 1;
        (void)epd_client_abort(rt->client, r->client_id);
    }
}

/* Submits an attempt to a prefill and a decode worker chosen by the
 * policy.  EPD_OK; EPD_ERR_UNREACHABLE (no eligible worker),
 * EPD_ERR_NO_RESOURCE (transport backpressure: the tick tries again),
 * EPD_ERR_TOO_LONG, other submit errors. */
static epd_status_t epd__dispatch(epd_router_t *rt, epd_router_req_t *r, uint64_t now_ns)
{
    epd_client_request_t q;
    epd_status_t st = EPD_ERR_UNREACHABLE;

    for (int tries = 0; tries < 4; tries++) {
        epd_router_worker_t *pw, *dw;
        uint64_t left_ms;

        epd_client_media_t media[EPD_CLIENT_MEDIA_MAX];
        epd_router_worker_t *ew[EPD_CLIENT_MEDIA_MAX];

        pw = r->n_images > 0
                 ? epd_router_registry_pick_images(&rt->reg, r->prompt, r->n_prompt,
                                                   (const unsigned char(*)[32])r->img_hash,
                                                   r->n_images, r->avoid, r->n_avoid, now_ns)
                 : epd_router_registry_pick(&rt->reg, EPD_CLIENT_ROLE_PREFILL, r->prompt,
                                            r->n_prompt, r->avoid, r->n_avoid);
        dw = epd_router_registry_pick(&rt->reg, EPD_CLIENT_ROLE_DECODE, r->prompt, r->n_prompt,
                                      r->avoid, r->n_avoid);
        if (pw == NULL || dw == NULL) {
            return EPD_ERR_UNREACHABLE;
        }
        /* each image: the prefill worker's cache when we believe it holds
         * it, else the least loaded encoder, else the prefill worker itself */
        for (uint32_t k = 0; k < r->n_images; k++) {
            const epd_oai_image_t *im = &r->oai->images[k];

            memset(&media[k], 0, sizeof(media[k]));
            media[k].hash = r->img_hash[k];
            media[k].pos = r->img_pos[k];
            media[k].n = rt->info->image_embeddings;
            ew[k] = NULL;
            if (!r->no_hints && epd_router_cache_has(pw, r->img_hash[k], now_ns)) {
                r->img_src[k] = EPD_ROUTER_IMG_CACHE;
                continue;
            }
            media[k].image = im->data;
            media[k].image_len = im->len;
            ew[k] = r->oai->encode_local
                        ? NULL
                        : epd_router_registry_pick(&rt->reg, EPD_CLIENT_ROLE_ENCODER, NULL, 0,
                                                   r->avoid, r->n_avoid);
            if (ew[k] != NULL) {
                media[k].encoder = ew[k]->cw;
                r->img_src[k] = EPD_ROUTER_IMG_ENCODER;
            } else {
                media[k].inline_data = 1;
                r->img_src[k] = EPD_ROUTER_IMG_INLINE;
            }
        }
        left_ms = r->deadline_ns > now_ns ? (r->deadline_ns - now_ns) / 1000000ull : 0;
        if (left_ms == 0) {
            return EPD_ERR_TIMEOUT;
        }
        memset(&q, 0, sizeof(q));
        q.prompt = r->prompt;
        q.n_prompt = r->n_prompt;
        q.temperature = (float)r->oai->temperature;
        q.top_p = (float)r->oai->top_p;
        q.top_k = r->oai->top_k > 0 ? (uint32_t)r->oai->top_k : 0;
        q.seed = r->seed;
        q.max_tokens = r->max_new;
        q.prefill = pw->cw;
        q.decode = dw->cw;
        q.deadline_ms = (uint32_t)(left_ms > UINT32_MAX ? UINT32_MAX : left_ms);
        q.user = r;
        q.media = r->n_images > 0 ? media : NULL;
        q.n_media = r->n_images;
        st = epd_client_submit(rt->client, &q, &r->client_id);
        if (st == EPD_OK) {
            for (uint32_t k = 0; k < r->n_images; k++) {
                r->img_enc[k] = ew[k];
                if (ew[k] != NULL) {
                    epd_router_worker_ref(ew[k]);
                    ew[k]->inflight++;
                    ew[k]->served++;
                }
            }
            if (rt->trace != NULL) {
                uint64_t t = epd_time_now_ns();

                if (r->attempts == 0) {
                    epd_trace_span(rt->trace, "parse + tokenize", "router", r->client_id, -1,
                                   r->t_arrival_ns, r->t_parsed_ns);
                    epd_trace_span(rt->trace, "choose + submit", "router", r->client_id, -1,
                                   r->t_parsed_ns, t);
                } else {
                    epd_trace_instant(rt->trace, "resubmitted", "router", r->client_id,
                                      (int32_t)r->attempts, t);
                }
                r->t_submit_ns = t;
            }
            r->trace_id = r->client_id;
            r->pw = pw;
            r->dw = dw;
            epd_router_worker_ref(pw);
            epd_router_worker_ref(dw);
            pw->inflight++;
            dw->inflight++;
            pw->served++;
            dw->served++;
            pw->queued_tokens += r->n_prompt;
            r->prefill_counted = 1;
            if (r->attempts++ == 0) {
                epd_router_histo_observe(&rt->m.dispatch, (double)(now_ns - r->t_arrival_ns) / 1e9);
            }
            return EPD_OK;
        }
        if (st != EPD_ERR_PEER_DEAD) {
            return st;
        }
        /* an endpoint that failed since the pick: never pick it again */
        {
            int bad_p = epd_client_worker_state(pw->cw) != EPD_OK;
            int bad_d = epd_client_worker_state(dw->cw) != EPD_OK;
            int bad_e = 0;

            for (uint32_t k = 0; k < r->n_images; k++) {
                if (ew[k] != NULL && ew[k]->state != EPD_ROUTER_DEAD &&
                    epd_client_worker_state(ew[k]->cw) != EPD_OK) {
                    epd_router_worker_kill(ew[k], now_ns);
                    rt->m.workers_died++;
                    bad_e = 1;
                }
            }
            if (!bad_p && !bad_d) {
                if (bad_e) {
                    continue;
                }
                return st;
            }
            if (bad_p) {
                epd_router_worker_kill(pw, now_ns);
                rt->m.workers_died++;
            }
            if (bad_d) {
                epd_router_worker_kill(dw, now_ns);
                rt->m.workers_died++;
            }
        }
    }
    return st;
}

/* Ends the HTTP side with an error: an HTTP error answer before the
 * stream started, an error event after. */
static void epd__fail_http(epd_router_t *rt, epd_router_req_t *r, epd_router_err_kind_t kind,
                           int http_status, const char *fmt, const char *a, const char *b)
{
    epd_oai_error_t err;

    rt->m.errors[kind]++;
    if (r->done) {
        return;
    }
    epd_oai_error_set(&err, http_status, NULL, NULL, fmt, a, b);
    if (http_status >= 500) {
        snprintf(err.type, sizeof(err.type), "server_error");
    }
    if (r->stream_started) {
        epd_oai_buf_reset(&rt->out);
        if (epd_oai_stream_error(&r->stream, &err, &rt->out) == EPD_OK) {
            (void)epd_http_stream_send(r->http, rt->out.data, rt->out.len);
        }
        (void)epd_http_stream_end(r->http);
    } else {
        epd__respond_error(rt, r->http, &err);
    }
    epd_router_histo_observe(&rt->m.e2e, (double)(epd_time_now_ns() - r->t_arrival_ns) / 1e9);
    epd_trace_span(rt->trace, "request (failed)", "router", r->trace_id, -1, r->t_arrival_ns,
                   epd_time_now_ns());
    r->http = NULL;
    r->done = 1;
}

static int epd__stream_start(epd_router_t *rt, epd_router_req_t *r)
{
    if (r->stream_started) {
        return 0;
    }
    if (epd_oai_stream_init(&r->stream, r->oai->kind, r->id, rt->model_name, r->created,
                            r->oai->include_usage) != EPD_OK) {
        return -1;
    }
    r->stream_started = 1;
    (void)epd_http_stream_start(r->http, 200);
    return 0;
}

/* Hands text[sent..upto) to the stream. */
static void epd__stream_emit(epd_router_t *rt, epd_router_req_t *r, size_t upto)
{
    if (upto <= r->sent) {
        return;
    }
    epd_oai_buf_reset(&rt->out);
    if (epd_oai_stream_text(&r->stream, r->text + r->sent, upto - r->sent, &rt->out) == EPD_OK) {
        r->sent = upto;
        if (rt->out.len > 0) {
            /* a failure here means the client is gone: its abort callback follows */
            (void)epd_http_stream_send(r->http, rt->out.data, rt->out.len);
        }
    }
}

/* The generation finished well (EOS, max_tokens or a stop string). */
static void epd__finish_ok(epd_router_t *rt, epd_router_req_t *r, epd_oai_finish_t finish)
{
    uint64_t now = epd_time_now_ns();

    if (r->done) {
        return;
    }
    rt->m.ok++;
    rt->m.completion_tokens += r->n_out;
    if (r->oai->stream) {
        if (epd__stream_start(rt, r) != 0) {
            epd__fail_http(rt, r, EPD_ROUTER_ERR_INTERNAL, 500, "out of memory%s%s", "", "");
            return;
        }
        epd__stream_emit(rt, r, r->text_len);
        epd_oai_buf_reset(&rt->out);
        if (epd_oai_stream_finish(&r->stream, finish, r->n_prompt, r->n_out, &rt->out) == EPD_OK) {
            (void)epd_http_stream_send(r->http, rt->out.data, rt->out.len);
        }
        (void)epd_http_stream_end(r->http);
    } else {
        epd_oai_buf_reset(&rt->out);
        if (epd_oai_response_encode(r->oai->kind, r->id, rt->model_name, r->created, r->text,
                                    r->text_len, finish, r->n_prompt, r->n_out,
                                    &rt->out) != EPD_OK) {
            epd__respond_simple_error(rt, r->http, 500, "out of memory");
        } else {
            (void)epd_http_respond(r->http, 200, EPD__JSON, rt->out.data, rt->out.len);
        }
    }
    epd_router_histo_observe(&rt->m.e2e, (double)(now - r->t_arrival_ns) / 1e9);
    epd_trace_span(rt->trace, "request", "router", r->trace_id, -1, r->t_arrival_ns,
                   epd_time_now_ns());
    r->http = NULL;
    r->done = 1;
}

static int epd__text_append(epd_router_t *rt, epd_router_req_t *r, const uint32_t *ids, uint32_t n)
{
    size_t len = 0;
    epd_status_t st;

    if (n == 0) {
        return 0;
    }
    if (rt->tok_scratch_cap < n) {
        int32_t *p = epd_realloc(rt->tok_scratch, (size_t)n * 2 * sizeof(*p));

        if (p == NULL) {
            return -1;
        }
        rt->tok_scratch = p;
        rt->tok_scratch_cap = (size_t)n * 2;
    }
    for (uint32_t i = 0; i < n; i++) {
        rt->tok_scratch[i] = (int32_t)ids[i];
    }
    for (;;) {
        st = epd_engine_detokenize(rt->engine, rt->tok_scratch, n, rt->detok_scratch,
                                   rt->detok_scratch_cap, &len);
        if (st != EPD_ERR_TOO_LONG) {
            break;
        }
        {
            size_t cap = rt->detok_scratch_cap * 2 + (size_t)n * 8 + 64;
            char *p = epd_realloc(rt->detok_scratch, cap);

            if (p == NULL) {
                return -1;
            }
            rt->detok_scratch = p;
            rt->detok_scratch_cap = cap;
        }
    }
    if (st != EPD_OK) {
        return -1;
    }
    if (r->text_len + len + 1 > r->text_cap) {
        size_t cap = (r->text_len + len + 1) * 2 + 64;
        char *p = epd_realloc(r->text, cap);

        if (p == NULL) {
            return -1;
        }
        r->text = p;
        r->text_cap = cap;
    }
    memcpy(r->text + r->text_len, rt->detok_scratch, len);
    r->text_len += len;
    return 0;
}

/* After new text: a stop string ends the generation (returns 1); else the
 * text that can no longer be part of a stop match is streamed. */
static int epd__after_text(epd_router_t *rt, epd_router_req_t *r)
{
    size_t hold = r->max_stop_len > 0 ? r->max_stop_len - 1 : 0;
    size_t cut = SIZE_MAX;

    for (size_t i = 0; i < r->oai->n_stop; i++) {
        const char *s = r->oai->stop[i];
        size_t sl = strlen(s);
        const char *m;

        if (r->text_len < r->sent + sl) {
            continue;
        }
        m = memmem(r->text + r->sent, r->text_len - r->sent, s, sl);
        if (m != NULL && (size_t)(m - r->text) < cut) {
            cut = (size_t)(m - r->text);
        }
    }
    if (cut != SIZE_MAX) {
        r->text_len = cut;
        return 1;
    }
    if (r->text_len > hold) {
        size_t upto = r->text_len - hold;

        if (r->oai->stream) {
            if (upto > r->sent) {
                if (epd__stream_start(rt, r) != 0) {
                    return -1;
                }
                epd__stream_emit(rt, r, upto);
            }
        } else if (upto > r->sent) {
            r->sent = upto;
        }
    }
    return 0;
}

static int epd__retryable(const epd_client_event_t *ev)
{
    if (ev->kind == EPD_CLIENT_EV_REFUSED) {
        return 1;
    }
    if (ev->culprit != NULL && ev->culprit[0] != '\0' &&
        (ev->status == EPD_ERR_TIMEOUT || ev->status == EPD_ERR_CANCELED)) {
        return 1; /* another worker (an encoder) let it down: try another */
    }
    switch (ev->status) {
    case EPD_ERR_PEER_DEAD:
    case EPD_ERR_DRAINING:
    case EPD_ERR_NO_CAPACITY:
    case EPD_ERR_UNREACHABLE:
    case EPD_ERR_CONNECTION_RESET:
    case EPD_ERR_TRANSPORT:
    case EPD_ERR_STALE_EPOCH:
        return 1;
    default:
        return 0;
    }
}

/* Dispatch failed for good: answer with the reason. */
static void epd__dispatch_failed(epd_router_t *rt, epd_router_req_t *r, epd_status_t st)
{
    if (st == EPD_ERR_UNREACHABLE) {
        epd__fail_http(rt, r, EPD_ROUTER_ERR_NO_WORKERS, 503,
                       "no prefill or decode worker is available%s%s", "", "");
    } else if (st == EPD_ERR_TIMEOUT) {
        epd__fail_http(rt, r, EPD_ROUTER_ERR_TIMEOUT, 504, "request timed out%s%s", "", "");
    } else if (st == EPD_ERR_TOO_LONG) {
        epd__fail_http(rt, r, EPD_ROUTER_ERR_BAD_REQUEST, 400,
                       "the prompt does not fit in one request-plane message%s%s", "", "");
    } else {
        epd__fail_http(rt, r, EPD_ROUTER_ERR_UPSTREAM, 502, "cannot submit the request: %s%s",
                       epd_status_string(st), "");
    }
}

/* The worker of the failed attempt an event blames by name, or NULL. */
static epd_router_worker_t *epd__attempt_worker(epd_router_worker_t *pw, epd_router_worker_t *dw,
                                                epd_router_worker_t *const *ew, uint32_t n_images,
                                                const char *id)
{
    if (id == NULL || id[0] == '\0') {
        return NULL;
    }
    if (strcmp(id, pw->info.worker_id) == 0) {
        return pw;
    }
    if (strcmp(id, dw->info.worker_id) == 0) {
        return dw;
    }
    for (uint32_t k = 0; k < n_images; k++) {
        if (ew[k] != NULL && strcmp(id, ew[k]->info.worker_id) == 0) {
            return ew[k];
        }
    }
    return NULL;
}

static void epd__avoid(epd_router_req_t *r, epd_router_worker_t *w)
{
    for (uint32_t i = 0; i < r->n_avoid; i++) {
        if (r->avoid[i] == w) {
            return;
        }
    }
    if (r->n_avoid < EPD_ROUTER_MAX_AVOID) {
        r->avoid[r->n_avoid++] = w;
    }
}

static void epd__on_error_event(epd_router_t *rt, epd_router_req_t *r, const epd_client_event_t *ev)
{
    epd_router_worker_t *pw = r->pw, *dw = r->dw;
    epd_router_worker_t *ew[EPD_CLIENT_MEDIA_MAX];
    epd_router_worker_t *culprit, *reporter;
    uint64_t now = epd_time_now_ns();
    int stale_hint;
    epd_status_t st;

    memcpy(ew, r->img_enc, sizeof(ew));
    culprit = epd__attempt_worker(pw, dw, ew, r->n_images, ev->culprit);
    reporter = epd__attempt_worker(pw, dw, ew, r->n_images, ev->from);
    /* a cache hint the prefill worker disproved: it did not hold an image
     * we sent without an encoder; forget the hints, go again with one */
    stale_hint = ev->kind == EPD_CLIENT_EV_ERROR && ev->status == EPD_ERR_NOT_FOUND &&
                 (reporter == pw || culprit == pw) && r->n_images > 0 && !r->no_hints;
    if (stale_hint) {
        r->no_hints = 1; /* at most once per request: the next attempt encodes */
        for (uint32_t k = 0; k < r->n_images; k++) {
            if (r->img_src[k] == EPD_ROUTER_IMG_CACHE) {
                epd_router_cache_forget(pw, r->img_hash[k]);
            }
        }
        rt->m.image_cache_stale++;
    }
    epd__attempt_end(r);
    if (r->done) {
        epd__req_free(rt, r);
        return;
    }
    if (r->n_images > 0 && ev->kind == EPD_CLIENT_EV_ERROR && r->n_out == 0 &&
        (ev->status == EPD_ERR_MALFORMED || ev->status == EPD_ERR_UNSUPPORTED ||
         ev->status == EPD_ERR_TOO_LONG) &&
        reporter != NULL && reporter != dw) {
        /* the image itself is bad (its encoder, or the prefill worker
         * encoding it, could not decode it): the client's fault */
        epd__fail_http(rt, r, EPD_ROUTER_ERR_BAD_REQUEST, 400, "an image of the request: %s%s",
                       ev->message, "");
        epd__req_free(rt, r);
        return;
    }
    /* a disproved hint is nobody's failure: it gets one attempt on top */
    if (r->n_out == 0 && (epd__retryable(ev) || stale_hint) &&
        r->attempts <= rt->max_retries + (uint32_t)r->no_hints && now < r->deadline_ns) {
        int enc_dead = 0;

        for (uint32_t k = 0; k < r->n_images; k++) {
            if (ew[k] != NULL && epd_client_worker_state(ew[k]->cw) != EPD_OK) {
                epd__avoid(r, ew[k]);
                enc_dead = 1;
            }
        }
        if (stale_hint) {
            /* nobody failed */
        } else if (culprit != NULL) {
            epd__avoid(r, culprit);
        } else if (!enc_dead) {
            /* avoid the worker that failed (both when it cannot be told) */
            int blame_p =
                ev->kind != EPD_CLIENT_EV_REFUSED &&
                (strcmp(ev->from, pw->info.worker_id) == 0 ||
                 epd_client_worker_state(pw->cw) != EPD_OK || strcmp(ev->from, "client") == 0);
            int blame_d = ev->kind == EPD_CLIENT_EV_REFUSED ||
                          strcmp(ev->from, dw->info.worker_id) == 0 ||
                          epd_client_worker_state(dw->cw) != EPD_OK;

            if (reporter != NULL && reporter != pw && reporter != dw) {
                epd__avoid(r, reporter); /* an encoder */
            } else {
                if (blame_p) {
                    epd__avoid(r, pw);
                }
                if (blame_d) {
                    epd__avoid(r, dw);
                }
            }
        }
        rt->m.retries++;
        epd_log_info(EPD_ROUTER_LOG, ev->request_id,
                     "attempt %u failed before its first token (%s from %s: %s): retrying",
                     r->attempts, epd_status_name(ev->status), ev->from, ev->message);
        st = epd__dispatch(rt, r, now);
        if (st == EPD_OK || st == EPD_ERR_NO_RESOURCE) {
            return;
        }
        epd__dispatch_failed(rt, r, st);
        epd__req_free(rt, r);
        return;
    }
    if (ev->status == EPD_ERR_TIMEOUT) {
        epd__fail_http(rt, r, EPD_ROUTER_ERR_TIMEOUT, 504, "request timed out (%s%s)", ev->from,
                       "");
    } else if (ev->kind == EPD_CLIENT_EV_REFUSED) {
        epd__fail_http(rt, r, EPD_ROUTER_ERR_UPSTREAM, 503, "no decode capacity: %s%s", ev->message,
                       "");
    } else {
        char why[300];

        snprintf(why, sizeof(why), "%s: %s", epd_status_name(ev->status), ev->message);
        epd__fail_http(rt, r, EPD_ROUTER_ERR_UPSTREAM, 502,
                       "the request failed (reported by %s): %s",
                       strcmp(ev->from, "client") == 0 ? "the router" : ev->from, why);
    }
    epd__req_free(rt, r);
}

void epd__router_on_event(void *arg, const epd_client_event_t *ev)
{
    epd_router_t *rt = arg;
    epd_router_req_t *r = ev->user;
    uint64_t now = epd_time_now_ns();

    if (ev->kind != EPD_CLIENT_EV_TOKENS) {
        epd__on_error_event(rt, r, ev);
        return;
    }
    if (ev->n_tokens > 0) {
        if (r->n_out == 0) {
            /* the prefill worker ran with every image's embeddings: it has
             * them cached now */
            for (uint32_t k = 0; k < r->n_images && r->pw != NULL; k++) {
                epd_router_cache_add(r->pw, r->img_hash[k], now);
                rt->m.images++;
                rt->m.image_cache_hits += r->img_src[k] == EPD_ROUTER_IMG_CACHE;
                rt->m.images_encoded += r->img_src[k] == EPD_ROUTER_IMG_ENCODER;
                rt->m.images_local += r->img_src[k] == EPD_ROUTER_IMG_INLINE;
            }
            epd_router_histo_observe(&rt->m.ttft, (double)(now - r->t_arrival_ns) / 1e9);
            epd_trace_span(rt->trace, "wait for first token", "router", ev->request_id, -1,
                           r->t_submit_ns, now);
            if (r->prefill_counted && r->pw != NULL) {
                r->pw->queued_tokens -= r->n_prompt;
                r->prefill_counted = 0;
            }
        } else {
            epd_router_histo_observe(&rt->m.itl, (double)(now - r->t_last_ns) / 1e9);
        }
        r->t_last_ns = now;
        epd_trace_instant(rt->trace, "TokenChunk received", "msg", ev->request_id, -1, now);
        r->n_out += ev->n_tokens;
        if (!r->done) {
            int stop;

            if (epd__text_append(rt, r, ev->tokens, ev->n_tokens) != 0) {
                epd__fail_http(rt, r, EPD_ROUTER_ERR_INTERNAL, 500,
                               "cannot detokenize the output%s%s", "", "");
                epd__abort_upstream(rt, r);
            } else if ((stop = epd__after_text(rt, r)) != 0) {
                if (stop > 0) {
                    epd__finish_ok(rt, r, EPD_OAI_FINISH_STOP);
                } else {
                    epd__fail_http(rt, r, EPD_ROUTER_ERR_INTERNAL, 500, "out of memory%s%s", "",
                                   "");
                }
                epd__abort_upstream(rt, r);
            }
        }
    }
    if (!ev->terminal) {
        return;
    }
    epd__attempt_end(r);
    if (!r->done) {
        if (ev->finish == EPD_CLIENT_FINISH_LENGTH || ev->finish == EPD_CLIENT_FINISH_STOP) {
            epd__finish_ok(rt, r,
                           ev->finish == EPD_CLIENT_FINISH_STOP ? EPD_OAI_FINISH_STOP
                                                                : EPD_OAI_FINISH_LENGTH);
        } else {
            epd__fail_http(rt, r, EPD_ROUTER_ERR_UPSTREAM, 502,
                           "the request ended with finish %s (from %s)",
                           epd_client_finish_name(ev->finish), ev->from);
        }
    }
    epd__req_free(rt, r);
}

/* The HTTP client went away. */
static void epd__on_http_abort(epd_http_req_t *http, void *arg)
{
    epd_router_req_t *r = arg;
    epd_router_t *rt = r->rt;

    (void)http;
    r->http = NULL;
    if (!r->done) {
        r->done = 1;
        rt->m.errors[EPD_ROUTER_ERR_CLIENT_GONE]++;
    }
    if (r->client_id != 0) {
        epd__abort_upstream(rt, r);
    } else {
        epd__req_free(rt, r); /* no attempt in flight (waiting to dispatch) */
    }
}

void epd__router_tick(epd_router_t *rt, uint64_t now_ns)
{
    uint32_t died = 0;

    epd_router_registry_tick(&rt->reg, now_ns, &died);
    rt->m.workers_died += died;
    /* requests waiting for the transport to take their submit */
    for (epd_router_req_t *r = rt->reqs, *next; r != NULL; r = next) {
        epd_status_t st;

        next = r->next;
        if (r->client_id != 0 || r->done) {
            continue;
        }
        st = epd__dispatch(rt, r, now_ns);
        if (st == EPD_OK || (st == EPD_ERR_NO_RESOURCE && now_ns < r->deadline_ns)) {
            continue;
        }
        epd__dispatch_failed(rt, r, st == EPD_ERR_NO_RESOURCE ? EPD_ERR_TIMEOUT : st);
        epd__req_free(rt, r);
    }
}

/* ------------------------------------------------------------- routes */

static int epd__tokenize(epd_router_t *rt, const char *text, size_t len, size_t *n_p)
{
    size_t cap = len + 2;
    epd_status_t st;

    for (;;) {
        if (rt->tok_scratch_cap < cap) {
            int32_t *p = epd_realloc(rt->tok_scratch, cap * sizeof(*p));

            if (p == NULL) {
                return -1;
            }
            rt->tok_scratch = p;
            rt->tok_scratch_cap = cap;
        }
        st = epd_engine_tokenize(rt->engine, text, len, 1, rt->tok_scratch, rt->tok_scratch_cap,
                                 n_p);
        if (st != EPD_ERR_TOO_LONG) {
            return st == EPD_OK ? 0 : -1;
        }
        cap = rt->tok_scratch_cap * 2;
    }
}

/* The prompt of a request with images: BOS, the text before image 0, its
 * image_embeddings placeholder tokens, the text up to image 1, ... (as
 * epd_engine_tokenize_images does with "<|image|>" markers, so the tokens
 * equal epd-generate's for the same template text with a marker where
 * each image stands).  img_pos[k] gets image k's first placeholder.
 * 0, or -1 out of memory. */
static int epd__tokenize_images(epd_router_t *rt, const epd_oai_request_t *oai, uint32_t *img_pos,
                                size_t *n_p)
{
    size_t per = rt->info->image_embeddings;
    size_t cap = oai->prompt_len + 1 + oai->n_images * per;
    size_t n = 0, done = 0;

    if (rt->tok_scratch_cap < cap) {
        int32_t *p = epd_realloc(rt->tok_scratch, cap * sizeof(*p));

        if (p == NULL) {
            return -1;
        }
        rt->tok_scratch = p;
        rt->tok_scratch_cap = cap;
    }
    for (size_t k = 0; k <= oai->n_images; k++) {
        size_t end = k < oai->n_images ? oai->images[k].prompt_offset : oai->prompt_len;
        size_t got = 0;

        if (epd_engine_tokenize(rt->engine, oai->prompt + done, end - done, k == 0,
                                rt->tok_scratch + n, cap - n, &got) != EPD_OK) {
            return -1;
        }
        n += got;
        done = end;
        if (k < oai->n_images) {
            img_pos[k] = (uint32_t)n;
            for (size_t i = 0; i < per; i++) {
                rt->tok_scratch[n++] = rt->info->image_token;
            }
        }
    }
    *n_p = n;
    return 0;
}

/* The router's own checks of a request's images (rule 13): a model with a
 * vision encoder, the count, each image's size, format and pixels (its
 * header only: the decoding is the encoder's).  EPD_OK, or *err filled
 * (400). */
static epd_status_t epd__check_images(epd_router_t *rt, const epd_oai_request_t *oai,
                                      epd_oai_error_t *err)
{
    if (rt->info->image_embeddings == 0) {
        epd_oai_error_set(err, 400, "messages", NULL,
                          "Model '%s' has no vision encoder: image inputs are not supported.",
                          rt->model_name);
        return EPD_ERR_INVALID_PARAM;
    }
    if (oai->n_images > rt->max_images) {
        epd_oai_error_set(err, 400, "messages", NULL,
                          "%zu images in one request: at most %u are accepted.", oai->n_images,
                          rt->max_images);
        return EPD_ERR_INVALID_PARAM;
    }
    for (size_t k = 0; k < oai->n_images; k++) {
        const epd_oai_image_t *im = &oai->images[k];
        epd_image_info_t ii;
        char param[96];
        epd_status_t st;

        snprintf(param, sizeof(param), "messages[%u].content[%u].image_url", im->message,
                 im->part);
        if (im->len > rt->max_image_bytes) {
            epd_oai_error_set(err, 400, param, "image_too_large",
                              "The image in '%s' is %zu bytes: at most %llu are accepted.", param,
                              im->len, (unsigned long long)rt->max_image_bytes);
            return EPD_ERR_INVALID_PARAM;
        }
        st = epd_image_probe(im->data, im->len, &ii);
        if (st == EPD_ERR_UNSUPPORTED) {
            epd_oai_error_set(err, 400, param, "invalid_image_format",
                              "The data in '%s' is not a PNG or JPEG image.", param);
            return EPD_ERR_INVALID_PARAM;
        }
        if (st != EPD_OK) {
            epd_oai_error_set(err, 400, param, "invalid_image",
                              "The image in '%s' is corrupt (its header does not parse).", param);
            return EPD_ERR_INVALID_PARAM;
        }
        if (ii.width == 0 || ii.height == 0 ||
            (uint64_t)ii.width * ii.height > rt->max_image_pixels) {
            epd_oai_error_set(err, 400, param, "image_too_large",
                              "The image in '%s' is %u x %u pixels: at most %llu pixels are "
                              "accepted.",
                              param, ii.width, ii.height, (unsigned long long)rt->max_image_pixels);
            return EPD_ERR_INVALID_PARAM;
        }
    }
    return EPD_OK;
}

static void epd__generate(epd_router_t *rt, epd_http_req_t *http, epd_oai_kind_t kind)
{
    const char *models[1] = {rt->model_name};
    epd_oai_request_t *oai = NULL;
    epd_oai_error_t err;
    epd_router_req_t *r;
    const char *body;
    size_t body_len = 0;
    size_t n_tok = 0;
    int64_t max_new = 0;
    uint64_t now = epd_time_now_ns();
    uint32_t *img_pos = NULL;
    unsigned char (*img_hash)[32] = NULL;
    epd_status_t st;

    body = epd_http_req_body(http, &body_len);
    st = epd_oai_request_parse(kind, body, body_len, models, 1, rt->info->max_context, &oai, &err);
    if (st != EPD_OK) {
        rt->m.errors[st == EPD_ERR_NO_MEMORY ? EPD_ROUTER_ERR_INTERNAL
                                             : EPD_ROUTER_ERR_BAD_REQUEST]++;
        epd__respond_error(rt, http, &err);
        return;
    }
    if (oai->n_images > 0 && epd__check_images(rt, oai, &err) != EPD_OK) {
        rt->m.errors[EPD_ROUTER_ERR_BAD_REQUEST]++;
        epd__respond_error(rt, http, &err);
        epd_oai_request_destroy(oai);
        return;
    }
    if (oai->n_images > 0) {
        img_pos = epd_calloc(oai->n_images, sizeof(*img_pos));
        img_hash = epd_calloc(oai->n_images, sizeof(*img_hash));
    }
    if ((oai->n_images > 0 && (img_pos == NULL || img_hash == NULL)) ||
        (oai->n_images > 0 ? epd__tokenize_images(rt, oai, img_pos, &n_tok)
                           : epd__tokenize(rt, oai->prompt, oai->prompt_len, &n_tok)) != 0) {
        rt->m.errors[EPD_ROUTER_ERR_INTERNAL]++;
        epd__respond_simple_error(rt, http, 500, "cannot tokenize the prompt");
        epd_free(img_pos);
        epd_free(img_hash);
        epd_oai_request_destroy(oai);
        return;
    }
    if (epd_oai_check_length(oai, (int64_t)n_tok, rt->info->max_context, &max_new, &err) !=
        EPD_OK) {
        rt->m.errors[EPD_ROUTER_ERR_BAD_REQUEST]++;
        epd__respond_error(rt, http, &err);
        epd_free(img_pos);
        epd_free(img_hash);
        epd_oai_request_destroy(oai);
        return;
    }
    r = epd_calloc(1, sizeof(*r));
    if (r != NULL) {
        r->prompt = epd_malloc(n_tok * sizeof(*r->prompt));
    }
    if (r == NULL || r->prompt == NULL) {
        if (r != NULL) {
            epd_free(r->prompt);
            epd_free(r);
        }
        epd_free(img_pos);
        epd_free(img_hash);
        rt->m.errors[EPD_ROUTER_ERR_INTERNAL]++;
        epd__respond_simple_error(rt, http, 500, "out of memory");
        epd_oai_request_destroy(oai);
        return;
    }
    for (size_t i = 0; i < n_tok; i++) {
        r->prompt[i] = (uint32_t)rt->tok_scratch[i];
    }
    r->rt = rt;
    r->http = http;
    r->oai = oai;
    r->n_prompt = (uint32_t)n_tok;
    /* images: their content hashes name them in every cache (rule 13) */
    r->n_images = (uint32_t)oai->n_images;
    r->img_pos = img_pos;
    r->img_hash = img_hash;
    for (uint32_t k = 0; k < r->n_images; k++) {
        epd_content_hash(oai->images[k].data, oai->images[k].len, r->img_hash[k]);
        rt->m.image_bytes += oai->images[k].len;
    }
    r->max_new = (uint32_t)max_new;
    r->seed = oai->has_seed ? (uint64_t)oai->seed : 0;
    for (size_t i = 0; i < oai->n_stop; i++) {
        size_t sl = strlen(oai->stop[i]);

        r->max_stop_len = sl > r->max_stop_len ? sl : r->max_stop_len;
    }
    r->t_arrival_ns = now;
    r->t_parsed_ns = epd_time_now_ns();
    r->deadline_ns = now + (uint64_t)rt->request_timeout_ms * 1000000ull;
    r->created = (int64_t)time(NULL);
    epd_oai_make_id(kind, (rt->epoch_nonce ^ (++rt->id_counter * 0x9e3779b97f4a7c15ull)), r->id);
    r->next = rt->reqs;
    if (rt->reqs != NULL) {
        rt->reqs->prev = r;
    }
    rt->reqs = r;
    rt->n_reqs++;
    rt->m.requests[kind == EPD_OAI_CHAT][oai->stream != 0]++;
    rt->m.prompt_tokens += n_tok;
    epd_http_req_set_abort(http, epd__on_http_abort, r);

    st = epd__dispatch(rt, r, now);
    if (st == EPD_OK || st == EPD_ERR_NO_RESOURCE) {
        return;
    }
    epd__dispatch_failed(rt, r, st);
    epd__req_free(rt, r);
}

static void epd__health(epd_router_t *rt, epd_http_req_t *http)
{
    uint32_t counts[EPD_ROUTER_POOLS][5];
    char body[256];
    int n;

    epd_router_registry_counts(&rt->reg, counts);
    n = snprintf(body, sizeof(body),
                 "{\"status\":\"ok\",\"model\":\"%s\",\"prefill_ready\":%u,\"decode_ready\":%u,"
                 "\"encoder_ready\":%u,\"requests_in_flight\":%u}",
                 rt->model_name, counts[EPD_ROUTER_POOL_PREFILL][EPD_ROUTER_READY],
                 counts[EPD_ROUTER_POOL_DECODE][EPD_ROUTER_READY],
                 counts[EPD_ROUTER_POOL_ENCODER][EPD_ROUTER_READY], rt->n_reqs);
    (void)epd_http_respond(http, 200, EPD__JSON, body, (size_t)n);
}

/* GET /v1/models/{id}: the model object, or 404 model_not_found. */
static void epd__model(epd_router_t *rt, epd_http_req_t *http, const char *id)
{
    epd_router_text_t t = {0};
    epd_oai_error_t err;

    if (strcmp(id, rt->model_name) != 0) {
        rt->m.errors[EPD_ROUTER_ERR_BAD_REQUEST]++;
        epd_oai_error_set(&err, 404, "model", "model_not_found",
                          "the model '%.100s' does not exist", id);
        epd__respond_error(rt, http, &err);
        return;
    }
    epd_router_text_printf(&t, "{\"id\":\"");
    for (const char *c = rt->model_name; *c != '\0'; c++) {
        if (*c == '"' || *c == '\\') {
            epd_router_text_printf(&t, "\\%c", *c);
        } else if ((unsigned char)*c < 0x20) {
            epd_router_text_printf(&t, "\\u%04x", (unsigned)(unsigned char)*c);
        } else {
            epd_router_text_printf(&t, "%c", *c);
        }
    }
    epd_router_text_printf(&t, "\",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"epd\"}",
                           (long long)(rt->epoch_start_ns / 1000000000ull));
    if (t.failed) {
        epd__respond_simple_error(rt, http, 500, "out of memory");
    } else {
        (void)epd_http_respond(http, 200, EPD__JSON, t.data, t.len);
    }
    epd_router_text_cleanup(&t);
}

void epd__router_on_http(epd_http_req_t *http, void *arg)
{
    epd_router_t *rt = arg;
    const char *method = epd_http_req_method(http);
    const char *target = epd_http_req_path(http);
    const char *q = strchr(target, '?');
    size_t plen = q != NULL ? (size_t)(q - target) : strlen(target);
    char path[320];
    int get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    int post = strcmp(method, "POST") == 0;

    rt->m.http_requests++;
    if (plen >= sizeof(path)) {
        plen = sizeof(path) - 1;
    }
    memcpy(path, target, plen);
    path[plen] = '\0';
    while (plen > 1 && path[plen - 1] == '/') {
        path[--plen] = '\0';
    }
    if (rt->stopping) {
        epd__respond_simple_error(rt, http, 503, "the router is shutting down");
        return;
    }
    if (strcmp(path, "/v1/completions") == 0 && post) {
        epd__generate(rt, http, EPD_OAI_COMPLETION);
    } else if (strcmp(path, "/v1/chat/completions") == 0 && post) {
        epd__generate(rt, http, EPD_OAI_CHAT);
    } else if (strcmp(path, "/v1/models") == 0 && get) {
        const char *models[1] = {rt->model_name};

        epd_oai_buf_reset(&rt->out);
        if (epd_oai_models_encode(models, 1, (int64_t)(rt->epoch_start_ns / 1000000000ull),
                                  &rt->out) != EPD_OK) {
            epd__respond_simple_error(rt, http, 500, "out of memory");
        } else {
            (void)epd_http_respond(http, 200, EPD__JSON, rt->out.data, rt->out.len);
        }
    } else if (strncmp(path, "/v1/models/", 11) == 0 && get) {
        epd__model(rt, http, path + 11);
    } else if (strcmp(path, "/health") == 0 && get) {
        epd__health(rt, http);
    } else if (strcmp(path, "/metrics") == 0 && get) {
        epd_router_text_t t = {0};

        if (epd_router_metrics_render(&rt->m, &rt->reg, rt->n_reqs, &t) != EPD_OK) {
            epd__respond_simple_error(rt, http, 500, "out of memory");
        } else {
            (void)epd_http_respond(http, 200, "text/plain; version=0.0.4; charset=utf-8", t.data,
                                   t.len);
        }
        epd_router_text_cleanup(&t);
    } else if (strcmp(path, "/v1/completions") == 0 || strcmp(path, "/v1/chat/completions") == 0 ||
               strcmp(path, "/v1/models") == 0 || strcmp(path, "/health") == 0 ||
               strcmp(path, "/metrics") == 0) {
        rt->m.errors[EPD_ROUTER_ERR_BAD_REQUEST]++;
        epd__respond_simple_error(rt, http, 405, "method not allowed on this path");
    } else {
        rt->m.errors[EPD_ROUTER_ERR_BAD_REQUEST]++;
        epd__respond_simple_error(rt, http, 404, "no such endpoint");
    }
}
