/*
 * epd_router_answer.c — what a generation request answers its HTTP client
 * (see epd_router_int.h): an OpenAI error JSON, the full JSON answer, or
 * the SSE stream — started at the first text, so that a failure before it
 * can still be an HTTP error status — and the generated text itself:
 * detokenized as the chunks come, stop strings matched on the raw bytes
 * (a stream holds back the last longest-stop - 1 bytes until they cannot
 * start a match).
 *
 * The bottom of the request's layers: it knows the HTTP side of a request
 * (r->http, r->stream, r->text) and nothing of its attempts, workers or
 * state, and calls nothing of epd_router_req.c or epd_router_api.c.  It
 * only records facts the request's step reads: r->http NULL once the
 * request is answered (the HTTP request is finished then), and
 * r->stream_started once the SSE headers went out.
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_router_int.h"
#include "epd_time.h"

/* The header line telling how long `r` waited for a usable pair
 * (--no-worker-wait-ms), into buf; "" when it never had to. */
static const char *epd_router_wait_header(const epd_router_req_t *r, uint64_t wait_ns, char *buf,
                                          size_t cap)
{
    if (r->nw_start_ns == 0) {
        return "";
    }
    snprintf(buf, cap, "epd-no-worker-wait-ms: %llu\r\n",
             (unsigned long long)(wait_ns / 1000000ull));
    return buf;
}

void epd__router_respond_error(epd_router_t *rt, epd_http_req_t *http, const epd_oai_error_t *err)
{
    epd_oai_buf_reset(&rt->out);
    if (epd_oai_error_encode(err, &rt->out) != EPD_OK) {
        (void)epd_http_respond(http, 500, EPD_ROUTER_JSON, "{}", 2);
        return;
    }
    (void)epd_http_respond(http, err->http_status, EPD_ROUTER_JSON, rt->out.data, rt->out.len);
}

void epd__router_respond_simple_error(epd_router_t *rt, epd_http_req_t *http, int status,
                                      const char *msg)
{
    epd_oai_error_t err;

    epd_oai_error_set(&err, status, NULL, NULL, "%s", msg);
    epd__router_respond_error(rt, http, &err);
}

void epd__router_fail_no_workers(epd_router_t *rt, epd_router_req_t *r, uint64_t now_ns)
{
    epd_oai_error_t err;
    char headers[160], wait[64];
    uint32_t retry_s = 1;

    if (r->stream_started || r->http == NULL || r->group != NULL) {
        epd__router_fail_http(rt, r, EPD_ROUTER_ERR_NO_WORKERS, 503,
                              "no prefill or decode worker is available%s%s", "", "");
        return;
    }
    rt->m.errors[EPD_ROUTER_ERR_NO_WORKERS]++;
    epd_oai_error_set(&err, 503, NULL, NULL, "no prefill or decode worker is available");
    snprintf(err.type, sizeof(err.type), "server_error");
    /* a worker that restarts, or one stopped a while, is back within about
     * a second; the SDKs retry a 503 after Retry-After */
    snprintf(headers, sizeof(headers), "Retry-After: %u\r\n%s", retry_s,
             epd_router_wait_header(r, r->nw_start_ns != 0 ? now_ns - r->nw_start_ns : 0, wait,
                                    sizeof(wait)));
    epd_oai_buf_reset(&rt->out);
    if (epd_oai_error_encode(&err, &rt->out) == EPD_OK) {
        (void)epd_http_respond_ex(r->http, 503, EPD_ROUTER_JSON, headers, rt->out.data,
                                  rt->out.len);
    } else {
        (void)epd_http_respond_ex(r->http, 503, EPD_ROUTER_JSON, headers, "{}", 2);
    }
    epd_router_histo_observe(&rt->m.e2e, (double)(now_ns - r->t_arrival_ns) / 1e9);
    epd_trace_span(rt->trace, "request (no workers)", "router", r->trace_id, -1, r->t_arrival_ns,
                   now_ns);
    r->http = NULL; /* finished: the fact the request's step reads */
}

/* Ends the HTTP side with an error: an HTTP error answer before the
 * stream started, an error event after. */
void epd__router_fail_http(epd_router_t *rt, epd_router_req_t *r, epd_router_err_kind_t kind,
                           int http_status, const char *fmt, const char *a, const char *b)
{
    epd_oai_error_t err;

    rt->m.errors[kind]++;
    if (r->http == NULL) {
        return; /* answered already, or the client is gone */
    }
    epd_oai_error_set(&err, http_status, NULL, NULL, fmt, a, b);
    if (http_status >= 500) {
        snprintf(err.type, sizeof(err.type), "server_error");
    }
    if (r->group != NULL) {
        epd__router_group_fail(rt, r, &err); /* the whole answer */
    } else if (r->stream_started) {
        epd_oai_buf_reset(&rt->out);
        if (epd_oai_stream_error(&r->stream, &err, &rt->out) == EPD_OK) {
            (void)epd_http_stream_send(r->http, rt->out.data, rt->out.len);
        }
        (void)epd_http_stream_end(r->http);
    } else {
        epd__router_respond_error(rt, r->http, &err);
    }
    epd_router_histo_observe(&rt->m.e2e, (double)(epd_time_now_ns() - r->t_arrival_ns) / 1e9);
    epd_trace_span(rt->trace, "request (failed)", "router", r->trace_id, -1, r->t_arrival_ns,
                   epd_time_now_ns());
    r->http = NULL; /* finished: the fact the request's step reads */
}

void epd__router_fail_overloaded(epd_router_t *rt, epd_router_req_t *r, const char *why)
{
    epd_oai_error_t err;
    char headers[80];
    uint32_t retry_ms;

    if (r->stream_started) {
        /* cannot happen (room is refused before any token), but a stream
         * ends as streams end */
        epd__router_fail_http(rt, r, EPD_ROUTER_ERR_OVERLOADED, 503, "%s%s", why, "");
        return;
    }
    rt->m.errors[EPD_ROUTER_ERR_OVERLOADED]++;
    if (r->http == NULL) {
        return;
    }
    /* what OpenAI answers at its rate limits (the SDKs retry it, reading
     * Retry-After) */
    /* when the line ahead will have drained at the measured rate */
    retry_ms = epd_router_drain_retry_ms(&rt->drain, rt->n_waiting);
    epd_oai_error_set(&err, 429, NULL, "rate_limit_exceeded",
                      "The server is overloaded: %s. Please try again in %us.", why,
                      (retry_ms + 999) / 1000);
    snprintf(err.type, sizeof(err.type), "requests");
    if (r->group != NULL) {
        /* the whole answer (without Retry-After: the SDKs retry a 429
         * all the same) */
        epd__router_group_fail(rt, r, &err);
        epd_router_histo_observe(&rt->m.e2e,
                                 (double)(epd_time_now_ns() - r->t_arrival_ns) / 1e9);
        r->http = NULL;
        return;
    }
    epd_oai_buf_reset(&rt->out);
    snprintf(headers, sizeof(headers), "Retry-After: %u\r\nretry-after-ms: %u\r\n",
             (retry_ms + 999) / 1000, retry_ms);
    if (epd_oai_error_encode(&err, &rt->out) == EPD_OK) {
        (void)epd_http_respond_ex(r->http, 429, EPD_ROUTER_JSON, headers, rt->out.data,
                                  rt->out.len);
    } else {
        (void)epd_http_respond_ex(r->http, 429, EPD_ROUTER_JSON, headers, "{}", 2);
    }
    epd_router_histo_observe(&rt->m.e2e, (double)(epd_time_now_ns() - r->t_arrival_ns) / 1e9);
    epd_trace_span(rt->trace, "request (overloaded)", "router", r->trace_id, -1, r->t_arrival_ns,
                   epd_time_now_ns());
    r->http = NULL; /* finished: the fact the request's step reads */
}

static int epd_router_stream_start(epd_router_t *rt, epd_router_req_t *r)
{
    char hdr[64];

    if (r->group != NULL) {
        return epd__router_group_stream_start(rt, r);
    }
    if (r->stream_started) {
        return 0;
    }
    if (epd_oai_stream_init(&r->stream, r->oai->kind, r->id, rt->model_name, r->created,
                            r->oai->include_usage) != EPD_OK) {
        return -1;
    }
    r->stream_started = 1;
    (void)epd_http_stream_start_ex(r->http, 200,
                                   epd_router_wait_header(r, r->nw_wait_ns, hdr, sizeof(hdr)));
    if (r->echo_len > 0) {
        /* echo: the prompt is the choice's first text */
        epd_oai_buf_reset(&rt->out);
        if (epd_oai_stream_text(&r->stream, r->echo, r->echo_len, &rt->out) != EPD_OK) {
            return -1;
        }
        if (rt->out.len > 0) {
            (void)epd_http_stream_send(r->http, rt->out.data, rt->out.len);
        }
    }
    return 0;
}

/* Hands text[sent..upto) to the stream. */
static void epd_router_stream_emit(epd_router_t *rt, epd_router_req_t *r, size_t upto)
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

/* The logprobs object of tokens [from, to) of r (r->lps) into frag: each
 * id (the token's and its alternatives') detokenized alone into one arena,
 * then epd_oai_logprobs_encode.  0, or -1 (no memory; the arrays missing). */
static int epd_router_logprobs_frag(epd_router_t *rt, epd_router_req_t *r, uint32_t from,
                                    uint32_t to, epd_oai_buf_t *frag)
{
    uint32_t n = to > from ? to - from : 0;
    epd_oai_token_lp_t *toks = NULL;
    size_t *offs = NULL;
    char *arena = NULL;
    size_t cap = 0, len = 0;
    int rc = -1;

    if (r->lps == NULL || r->lp_ids == NULL) {
        return -1;
    }
    cap = 256;
    arena = epd_malloc(cap);
    toks = epd_calloc(n > 0 ? n : 1, sizeof(*toks));
    offs = epd_calloc((size_t)(n > 0 ? n : 1) * (1 + EPD_SAMPLE_MAX_LOGPROBS) * 2, sizeof(*offs));
    if (toks == NULL || offs == NULL || arena == NULL) {
        goto out;
    }
    for (uint32_t i = 0; i < n; i++) {
        const epd_sample_logprob_t *lp = &r->lps[from + i];

        for (uint32_t j = 0; j <= lp->n_top; j++) {
            int32_t id = (int32_t)(j == 0 ? r->lp_ids[from + i] : lp->top_ids[j - 1]);
            size_t blen = 0;
            size_t *o = &offs[((size_t)i * (1 + EPD_SAMPLE_MAX_LOGPROBS) + j) * 2];
            epd_status_t st;

            for (;;) {
                st = epd_engine_detokenize(rt->engine, &id, 1, arena + len, cap - len, &blen);
                if (st != EPD_ERR_TOO_LONG) {
                    break;
                }
                {
                    size_t ncap = cap * 2 + 256;
                    char *p = epd_realloc(arena, ncap);

                    if (p == NULL) {
                        goto out;
                    }
                    arena = p;
                    cap = ncap;
                }
            }
            if (st != EPD_OK) {
                blen = 0; /* an id outside the vocabulary: no text */
            }
            o[0] = len;
            o[1] = blen;
            len += blen;
        }
        toks[i].logprob = lp->logprob;
        toks[i].n_top = lp->n_top;
    }
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t j = 0; j <= toks[i].n_top; j++) {
            const size_t *o = &offs[((size_t)i * (1 + EPD_SAMPLE_MAX_LOGPROBS) + j) * 2];
            const char *b = arena + o[0];

            if (j == 0) {
                toks[i].bytes = b;
                toks[i].len = o[1];
            } else {
                toks[i].top_bytes[j - 1] = b;
                toks[i].top_len[j - 1] = o[1];
                toks[i].top_logprob[j - 1] = r->lps[from + i].top_logprobs[j - 1];
            }
        }
    }
    epd_oai_buf_reset(frag);
    rc = epd_oai_logprobs_encode(r->oai->kind, toks, n, frag) == EPD_OK ? 0 : -1;
out:
    epd_free(arena);
    epd_free(offs);
    epd_free(toks);
    return rc;
}

/* A full answer in rt->out: its "logprobs": null replaced by all its
 * tokens' logprobs.  0, or -1. */
static int epd_router_splice_logprobs(epd_router_t *rt, epd_router_req_t *r)
{
    epd_oai_buf_t frag = EPD_OAI_BUF_INIT;
    int rc = epd_router_logprobs_frag(rt, r, 0, r->n_out, &frag);

    if (rc == 0 && epd_oai_splice_logprobs(&rt->out, 0, frag.data, frag.len) != EPD_OK) {
        rc = -1;
    }
    epd_oai_buf_cleanup(&frag);
    return rc;
}

/* The generation finished well (EOS, max_tokens or a stop string). */
void epd__router_finish_ok(epd_router_t *rt, epd_router_req_t *r, epd_oai_finish_t finish)
{
    uint64_t now = epd_time_now_ns();

    if (r->http == NULL) {
        return;
    }
    rt->m.ok++;
    rt->m.completion_tokens += r->n_out;
    if (r->oai->stream) {
        if (epd_router_stream_start(rt, r) != 0) {
            epd__router_fail_http(rt, r, EPD_ROUTER_ERR_INTERNAL, 500, "out of memory%s%s", "", "");
            return;
        }
        epd_router_stream_emit(rt, r, r->text_len);
        epd_oai_buf_reset(&rt->out);
        if (r->oai->want_logprobs) {
            /* the tokens' logprobs in one chunk of no text before the end */
            epd_oai_buf_t frag = EPD_OAI_BUF_INIT;

            if (epd_router_logprobs_frag(rt, r, r->lps_sent, r->n_out, &frag) == 0 &&
                epd_oai_stream_logprobs(&r->stream, frag.data, frag.len, &rt->out) == EPD_OK) {
                r->lps_sent = r->n_out;
            }
            epd_oai_buf_cleanup(&frag);
        }
        if (epd_oai_stream_finish(&r->stream, finish, r->n_prompt, r->n_out,
                                  (int64_t)r->cached_tokens, &rt->out) == EPD_OK) {
            (void)epd_http_stream_send(r->http, rt->out.data, rt->out.len);
        }
        if (r->group != NULL) {
            epd__router_group_finish(rt, r, finish, NULL, 0); /* the last ends the stream */
        } else {
            (void)epd_http_stream_end(r->http);
        }
    } else if (r->group != NULL) {
        /* the last answers; a member's logprobs go with its choice */
        epd_oai_buf_t frag = EPD_OAI_BUF_INIT;

        if (r->oai->want_logprobs && epd_router_logprobs_frag(rt, r, 0, r->n_out, &frag) != 0) {
            epd__router_fail_http(rt, r, EPD_ROUTER_ERR_INTERNAL, 500, "out of memory%s%s", "",
                                  "");
        } else {
            epd__router_group_finish(rt, r, finish, r->oai->want_logprobs ? frag.data : NULL,
                                     frag.len);
        }
        epd_oai_buf_cleanup(&frag);
    } else if (r->echo_len > 0) {
        epd_oai_choice_t c = {r->echo, r->echo_len, r->text != NULL ? r->text : "",
                              r->text_len, finish, NULL, 0};

        epd_oai_buf_reset(&rt->out);
        if (epd_oai_response_encode_choices(r->oai->kind, r->id, rt->model_name, r->created, &c,
                                            1, r->n_prompt, r->n_out, (int64_t)r->cached_tokens,
                                            &rt->out) != EPD_OK) {
            epd__router_respond_simple_error(rt, r->http, 500, "out of memory");
        } else {
            (void)epd_http_respond(r->http, 200, EPD_ROUTER_JSON, rt->out.data, rt->out.len);
        }
    } else {
        epd_oai_buf_reset(&rt->out);
        if (epd_oai_response_encode(r->oai->kind, r->id, rt->model_name, r->created, r->text,
                                    r->text_len, finish, r->n_prompt, r->n_out,
                                    (int64_t)r->cached_tokens, &rt->out) != EPD_OK ||
            (r->oai->want_logprobs && epd_router_splice_logprobs(rt, r) != 0)) {
            epd__router_respond_simple_error(rt, r->http, 500, "out of memory");
        } else {
            char hdr[64];

            (void)epd_http_respond_ex(r->http, 200, EPD_ROUTER_JSON,
                                      epd_router_wait_header(r, r->nw_wait_ns, hdr, sizeof(hdr)),
                                      rt->out.data, rt->out.len);
        }
    }
    epd_router_histo_observe(&rt->m.e2e, (double)(now - r->t_arrival_ns) / 1e9);
    epd_trace_span(rt->trace, "request", "router", r->trace_id, -1, r->t_arrival_ns,
                   epd_time_now_ns());
    r->http = NULL; /* finished: the fact the request's step reads */
}

/* Makes room for `more` bytes after r->text_len.  0, or -1 out of memory. */
static int epd_router_text_reserve(epd_router_req_t *r, size_t more)
{
    if (r->text_len + more + 1 > r->text_cap) {
        size_t cap = (r->text_len + more + 1) * 2 + 64;
        char *p = epd_realloc(r->text, cap);

        if (p == NULL) {
            return -1;
        }
        r->text = p;
        r->text_cap = cap;
    }
    return 0;
}

/* The model folder's tokenizer: each id through the request's stream
 * decoder (special tokens and the ids it names no token for give nothing,
 * as epd_engine_detokenize). */
static int epd_router_text_append_tok(epd_router_t *rt, epd_router_req_t *r,
                                      const epd_tokenizer_t *tok, const uint32_t *ids, uint32_t n)
{
    size_t step = epd_tokenizer_max_token_bytes(tok) + 4;

    for (uint32_t i = 0; i < n; i++) {
        size_t got = 0;

        if (ids[i] >= rt->info->vocab_size) {
            epd_log_error(EPD_ROUTER_LOG, 0, "token id %u outside the vocabulary of %u", ids[i],
                          rt->info->vocab_size);
            return -1;
        }
        if (epd_tokenizer_id_bytes(tok, (int32_t)ids[i], &got, NULL) == NULL) {
            continue;
        }
        if (epd_router_text_reserve(r, step) != 0 ||
            epd_tokenizer_stream_push(tok, &r->detok, (int32_t)ids[i], r->text + r->text_len,
                                      r->text_cap - r->text_len, &got) != EPD_OK) {
            return -1;
        }
        r->text_len += got;
    }
    return 0;
}

int epd__router_text_flush(epd_router_t *rt, epd_router_req_t *r)
{
    size_t got = 0;

    if (epd_engine_tokenizer(rt->engine) == NULL || r->detok.n_held == 0) {
        return 0;
    }
    if (epd_router_text_reserve(r, sizeof(r->detok.held)) != 0 ||
        epd_tokenizer_stream_finish(&r->detok, r->text + r->text_len, r->text_cap - r->text_len,
                                    &got) != EPD_OK) {
        return -1;
    }
    r->text_len += got;
    return 0;
}

int epd__router_text_append(epd_router_t *rt, epd_router_req_t *r, const uint32_t *ids, uint32_t n)
{
    const epd_tokenizer_t *tok = epd_engine_tokenizer(rt->engine);
    size_t len = 0;
    epd_status_t st;

    if (n == 0) {
        return 0;
    }
    if (tok != NULL) {
        return epd_router_text_append_tok(rt, r, tok, ids, n);
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
    if (st != EPD_OK || epd_router_text_reserve(r, len) != 0) {
        return -1;
    }
    memcpy(r->text + r->text_len, rt->detok_scratch, len);
    r->text_len += len;
    return 0;
}

/* After new text: a stop string ends the generation (returns 1); else the
 * text that can no longer be part of a stop match is streamed. */
int epd__router_after_text(epd_router_t *rt, epd_router_req_t *r)
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
                if (epd_router_stream_start(rt, r) != 0) {
                    return -1;
                }
                epd_router_stream_emit(rt, r, upto);
            }
        } else if (upto > r->sent) {
            r->sent = upto;
        }
    }
    return 0;
}
