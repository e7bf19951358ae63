/*
 * epd_router_group.c — one answer of several choices (design:
 * epd_router_int.h, epd_router_group_t): "n" > 1 and a completions batch
 * of prompts.  Each choice is a request of its own (epd_router_req_t with
 * r->group) that goes through the normal path; here is only what their
 * HTTP client sees: the choices gathered into one JSON answer (index i
 * for choice i, usage summed: each prompt's tokens once, every choice's
 * completion), or one SSE stream whose chunks carry their choice's
 * index, ended by the last member with the usage chunk and [DONE].  Any
 * member's failure fails the whole answer (OpenAI answers all or
 * nothing).
 *
 * Below epd_router_answer.c (which calls it for a member's answers) and
 * the intake (epd_router_api.c builds and starts a group), it calls
 * neither: it records facts — every member's r->http NULL once the
 * group's HTTP side is finished — and never changes a request's state.
 * Loop thread only.
 */
#include <string.h>

#include "epd_alloc.h"
#include "epd_router_int.h"

epd_router_group_t *epd__router_group_new(epd_http_req_t *http, epd_oai_request_t *oai,
                                          uint32_t n_members)
{
    epd_router_group_t *g = epd_calloc(1, sizeof(*g));

    if (g != NULL) {
        g->members = epd_calloc(n_members, sizeof(*g->members));
        g->started = epd_calloc(n_members, sizeof(*g->started));
        g->res = epd_calloc(n_members, sizeof(*g->res));
    }
    if (g == NULL || g->members == NULL || g->started == NULL || g->res == NULL) {
        if (g != NULL) {
            epd_free(g->members);
            epd_free(g->started);
            epd_free(g->res);
            epd_free(g);
        }
        epd_oai_request_destroy(oai);
        return NULL;
    }
    g->http = http;
    g->oai = oai;
    g->n_members = n_members;
    g->n_choices = oai->n > 0 ? oai->n : 1;
    g->refs = 1; /* the HTTP side; each member adds its own */
    return g;
}

void epd__router_req_discard(epd_router_req_t *r)
{
    if (r == NULL) {
        return;
    }
    epd_free(r->img_hash);
    epd_free(r->img_pos);
    epd_free(r->prompt);
    epd_free(r->out);
    epd_free(r->echo);
    epd_free(r);
}

void epd__router_group_unref(epd_router_group_t *g)
{
    if (g == NULL || --g->refs > 0) {
        return;
    }
    for (uint32_t i = 0; i < g->n_members; i++) {
        if (!g->started[i]) {
            epd__router_req_discard(g->members[i]);
        }
        epd_free(g->res[i].text);
        epd_free(g->res[i].echo);
        epd_free(g->res[i].lp);
    }
    epd_free(g->members);
    epd_free(g->started);
    epd_free(g->res);
    epd_oai_request_destroy(g->oai);
    epd_free(g);
}

/* An OpenAI error answer on the group's HTTP request (rt->out as scratch). */
static void epd_router_group_respond_error(epd_router_t *rt, epd_router_group_t *g,
                                           const epd_oai_error_t *err)
{
    epd_oai_buf_reset(&rt->out);
    if (epd_oai_error_encode(err, &rt->out) != EPD_OK) {
        (void)epd_http_respond(g->http, 500, EPD_ROUTER_JSON, "{}", 2);
        return;
    }
    (void)epd_http_respond(g->http, err->http_status, EPD_ROUTER_JSON, rt->out.data, rt->out.len);
}

/* The group's HTTP side is finished: no member answers any more (each
 * stops at its next step), and the group drops its HTTP reference. */
static void epd_router_group_closed(epd_router_group_t *g)
{
    g->http = NULL;
    for (uint32_t i = 0; i < g->n_members; i++) {
        if (g->started[i] && g->members[i] != NULL) {
            g->members[i]->http = NULL;
        }
    }
    epd__router_group_unref(g);
}

int epd__router_group_stream_start(epd_router_t *rt, epd_router_req_t *r)
{
    epd_router_group_t *g = r->group;

    if (r->stream_started) {
        return 0;
    }
    if (epd_oai_stream_init(&r->stream, g->oai->kind, r->id, rt->model_name, r->created,
                            g->oai->include_usage) != EPD_OK) {
        return -1;
    }
    r->stream.index = r->choice;
    r->stream.member = 1;
    r->stream_started = 1;
    if (!g->stream_started) {
        g->stream_started = 1;
        (void)epd_http_stream_start_ex(g->http, 200, "");
    }
    if (r->echo_len > 0) {
        /* echo: the prompt is the choice's first text */
        epd_oai_buf_reset(&rt->out);
        if (epd_oai_stream_text(&r->stream, r->echo, r->echo_len, &rt->out) != EPD_OK) {
            return -1;
        }
        if (rt->out.len > 0) {
            (void)epd_http_stream_send(g->http, rt->out.data, rt->out.len);
        }
    }
    return 0;
}

void epd__router_group_fail(epd_router_t *rt, epd_router_req_t *r, const epd_oai_error_t *err)
{
    epd_router_group_t *g = r->group;

    if (g->http == NULL) {
        r->http = NULL;
        return;
    }
    if (g->stream_started) {
        epd_oai_buf_reset(&rt->out);
        if (epd_oai_stream_error(&r->stream, err, &rt->out) == EPD_OK) {
            (void)epd_http_stream_send(g->http, rt->out.data, rt->out.len);
        }
        (void)epd_http_stream_end(g->http);
    } else {
        epd_router_group_respond_error(rt, g, err);
    }
    epd_router_group_closed(g);
}

/* Every choice finished: the full answer (not streaming). */
static void epd_router_group_answer(epd_router_t *rt, epd_router_group_t *g, const char *id,
                                    int64_t created)
{
    epd_oai_choice_t *c = epd_calloc(g->n_members, sizeof(*c));

    epd_oai_buf_reset(&rt->out);
    if (c != NULL) {
        for (uint32_t i = 0; i < g->n_members; i++) {
            c[i].prefix = g->res[i].echo;
            c[i].prefix_len = g->res[i].echo_len;
            c[i].text = g->res[i].text;
            c[i].len = g->res[i].len;
            c[i].finish = g->res[i].finish;
            c[i].logprobs = g->res[i].lp;
            c[i].logprobs_len = g->res[i].lp_len;
        }
    }
    if (c == NULL || epd_oai_response_encode_choices(g->oai->kind, id, rt->model_name, created, c,
                                                     g->n_members, g->prompt_tokens,
                                                     g->completion_tokens, g->cached_tokens,
                                                     &rt->out) != EPD_OK) {
        epd_oai_error_t err;

        epd_oai_error_set(&err, 500, NULL, NULL, "out of memory");
        epd_router_group_respond_error(rt, g, &err);
    } else {
        (void)epd_http_respond(g->http, 200, EPD_ROUTER_JSON, rt->out.data, rt->out.len);
    }
    epd_free(c);
}

/* Copies src[0..len) into *dst_p (owned).  0, or -1 out of memory. */
static int epd_router_dup(char **dst_p, size_t *len_p, const char *src, size_t len)
{
    *dst_p = epd_malloc(len + 1);
    if (*dst_p == NULL) {
        return -1;
    }
    if (len > 0) {
        memcpy(*dst_p, src, len);
    }
    (*dst_p)[len] = '\0';
    *len_p = len;
    return 0;
}

void epd__router_group_finish(epd_router_t *rt, epd_router_req_t *r, epd_oai_finish_t finish,
                              const char *lp, size_t lp_len)
{
    epd_router_group_t *g = r->group;
    epd_router_choice_res_t *res = &g->res[r->choice];
    epd_oai_error_t err;

    if (g->http == NULL || r->http == NULL) {
        r->http = NULL;
        return;
    }
    res->finish = finish;
    if (!g->oai->stream) {
        int bad = epd_router_dup(&res->text, &res->len, r->text != NULL ? r->text : "",
                                 r->text_len) != 0 ||
                  (r->echo_len > 0 &&
                   epd_router_dup(&res->echo, &res->echo_len, r->echo, r->echo_len) != 0) ||
                  (lp != NULL && epd_router_dup(&res->lp, &res->lp_len, lp, lp_len) != 0);

        if (bad) {
            epd_oai_error_set(&err, 500, NULL, NULL, "out of memory");
            snprintf(err.type, sizeof(err.type), "server_error");
            epd__router_group_fail(rt, r, &err);
            return;
        }
    }
    /* each prompt counts once (its first choice's), as OpenAI's usage */
    if (r->choice % g->n_choices == 0) {
        g->prompt_tokens += r->n_prompt;
        g->cached_tokens += r->cached_tokens;
    }
    g->completion_tokens += r->n_out;
    g->n_finished++;
    r->http = NULL;
    if (g->n_finished < g->n_members) {
        return;
    }
    if (g->oai->stream) {
        epd_oai_buf_reset(&rt->out);
        if (epd_oai_stream_trailer(&r->stream, g->prompt_tokens, g->completion_tokens,
                                   g->cached_tokens, &rt->out) == EPD_OK) {
            (void)epd_http_stream_send(g->http, rt->out.data, rt->out.len);
        }
        (void)epd_http_stream_end(g->http);
    } else {
        epd_router_group_answer(rt, g, r->id, r->created);
    }
    epd_router_group_closed(g);
}
