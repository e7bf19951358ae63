/*
 * epd_router_api.c — the router's HTTP intake: the routes (the OpenAI
 * endpoints, /v1/models, /health, /ready, /metrics) and each generation request
 * up to its first attempt.
 *
 * Keys and connection limits are the HTTP server's (config.keys and the
 * caps, set by main.c): a /v1 request without the key never reaches this
 * file.
 *
 * A generation request: parse and validate (epd_openai, under the JSON
 * limits), refuse a prompt whose bytes could not fit in the context
 * whatever its tokens (before tokenizing it: the tokenizer's work and
 * scratch stay bounded by the context, not by the body), check its images
 * (count, size, format, pixels: the header only), tokenize with the
 * engine's tokenizer (BOS added, as epd-generate does; each image's
 * placeholder tokens where it stands; a chat through the model's own
 * template, engine/epd_chat.h, as epd-tokenize --chat --ids gives it),
 * (epd_router_prompt.c), check the length, and hand the
 * request to epd_router_req.c, which owns it from there (its state, its
 * attempts, retries and events): built here PARSED, as epd_calloc leaves
 * it; this file records its facts and never sets its state.  Generated text equals epd-generate's
 * for the same prompt and sampling settings: an absent seed is 0 (epd-generate's default), so
 * outputs are reproducible.
 *
 * The top of the request's layers: called by the HTTP server (its handler,
 * registered at start-up); calls epd_router_prompt.c, epd_router_req.c and
 * epd_router_answer.c, which never call it.
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

/* The model folder's default sampling (generation_config.json) where the
 * request gives none, as vLLM: a value the request gives always wins. */
static void epd_router_apply_gen_defaults(const epd_gen_defaults_t *g, epd_oai_request_t *oai)
{
    if (!oai->has_temperature && g->has_temperature) {
        oai->temperature = g->temperature;
    }
    if (!oai->has_top_p && g->has_top_p) {
        oai->top_p = g->top_p;
    }
    if (!oai->has_top_k && g->has_top_k) {
        oai->top_k = g->top_k;
    }
}

/* The router's own checks of a request's images (rule 13): a model with a
 * vision encoder, the count, each image's size, format and pixels (its
 * header only: the decoding is the encoder's).  EPD_OK, or *err filled
 * (400). */
static epd_status_t epd_router_check_images(epd_router_t *rt, const epd_oai_request_t *oai,
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

        snprintf(param, sizeof(param), "messages[%u].content[%u].image_url", im->message, im->part);
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

/* echo of a prompt of token ids: their bytes (as the detokenizer gives
 * them) into *out_p (owned).  0, or -1 out of memory or an id outside
 * the vocabulary (checked before). */
static int epd_router_echo_ids(epd_router_t *rt, const uint32_t *ids, size_t n, char **out_p,
                               size_t *len_p)
{
    int32_t *tmp = epd_malloc((n > 0 ? n : 1) * sizeof(*tmp));
    size_t cap = n * 8 + 64, len = 0;
    char *buf = NULL;
    epd_status_t st = EPD_ERR_NO_MEMORY;

    if (tmp == NULL) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        tmp[i] = (int32_t)ids[i];
    }
    for (;;) {
        char *p = epd_realloc(buf, cap);

        if (p == NULL) {
            st = EPD_ERR_NO_MEMORY;
            break;
        }
        buf = p;
        st = epd_engine_detokenize(rt->engine, tmp, n, buf, cap, &len);
        if (st != EPD_ERR_TOO_LONG) {
            break;
        }
        cap *= 2;
    }
    epd_free(tmp);
    if (st != EPD_OK) {
        epd_free(buf);
        return -1;
    }
    *out_p = buf;
    *len_p = len;
    return 0;
}

/* One request of the prompt in rt->tok_scratch[0..n_tok) (PARSED, as
 * epd_calloc leaves it but for what the intake records; its image arrays
 * copied from img_pos and img_hash, borrowed).  `echo` (borrowed, or
 * NULL) its prompt's bytes for "echo".  The caller's (epd__router_req_start,
 * a group, or epd__router_req_discard).  NULL: out of memory. */
static epd_router_req_t *epd_router_req_build(epd_router_t *rt, epd_oai_request_t *oai,
                                              size_t n_tok, int64_t max_new,
                                              const uint32_t *img_pos,
                                              const unsigned char (*img_hash)[32],
                                              const char *echo, size_t echo_len, uint64_t now)
{
    epd_router_req_t *r = epd_calloc(1, sizeof(*r));

    if (r == NULL) {
        return NULL;
    }
    r->prompt = epd_malloc((n_tok > 0 ? n_tok : 1) * sizeof(*r->prompt));
    epd_tokenizer_stream_init(&r->detok, EPD_DETOKENIZE_SKIP_SPECIAL);
    r->n_images = (uint32_t)oai->n_images;
    if (r->n_images > 0) {
        r->img_pos = epd_malloc(r->n_images * sizeof(*r->img_pos));
        r->img_hash = epd_malloc(r->n_images * sizeof(*r->img_hash));
    }
    r->max_new = (uint32_t)max_new;
    if (r->n_images == 0) {
        /* what a migration needs (rule 37); without it the request just
         * cannot migrate */
        r->out = epd_malloc((size_t)r->max_new * sizeof(*r->out));
    }
    if (echo != NULL) {
        r->echo = epd_malloc(echo_len + 1);
        if (r->echo != NULL) {
            memcpy(r->echo, echo, echo_len);
            r->echo_len = echo_len;
        }
    }
    if (r->prompt == NULL || (r->n_images > 0 && (r->img_pos == NULL || r->img_hash == NULL)) ||
        (echo != NULL && r->echo == NULL)) {
        epd__router_req_discard(r);
        return NULL;
    }
    for (size_t i = 0; i < n_tok; i++) {
        r->prompt[i] = (uint32_t)rt->tok_scratch[i];
    }
    if (r->n_images > 0) {
        memcpy(r->img_pos, img_pos, r->n_images * sizeof(*r->img_pos));
        memcpy(r->img_hash, img_hash, r->n_images * sizeof(*r->img_hash));
    }
    r->rt = rt;
    r->oai = oai;
    r->n_prompt = (uint32_t)n_tok;
    r->seed = oai->has_seed ? (uint64_t)oai->seed : 0;
    for (size_t i = 0; i < oai->n_stop; i++) {
        size_t sl = strlen(oai->stop[i]);

        r->max_stop_len = sl > r->max_stop_len ? sl : r->max_stop_len;
    }
    r->t_arrival_ns = now;
    r->t_parsed_ns = epd_time_now_ns();
    r->deadline_ns = now + (uint64_t)rt->request_timeout_ms * 1000000ull;
    return r;
}

/* The prompt of oai (its text, or token ids) through the tokenizer into
 * rt->tok_scratch, checked for length and sampling: 0 with *n_tok_p and
 * *max_new_p; -1 with *err filled. */
static int epd_router_prompt_tokens(epd_router_t *rt, epd_oai_request_t *oai, int use_chat,
                                    uint32_t *img_pos, size_t *n_tok_p, int64_t *max_new_p,
                                    epd_oai_error_t *err)
{
    if (oai->prompt_ids != NULL) {
        if (epd__router_prompt_ids(rt, oai, n_tok_p, err) != 0) {
            return -1;
        }
    } else if ((oai->n_images > 0 ? epd__router_tokenize_images(rt, oai, img_pos, n_tok_p)
                : use_chat        ? epd__router_tokenize_chat(rt, n_tok_p)
                           : epd__router_tokenize(rt, oai->prompt, oai->prompt_len, n_tok_p)) !=
               0) {
        epd_oai_error_set(err, 500, NULL, NULL, "cannot tokenize the prompt");
        snprintf(err->type, sizeof(err->type), "server_error");
        return -1;
    }
    if (epd_oai_check_length(oai, (int64_t)*n_tok_p, rt->info->max_context, max_new_p, err) !=
            EPD_OK ||
        epd_oai_check_sampling(oai, rt->info->vocab_size, *max_new_p, err) != EPD_OK) {
        return -1;
    }
    return 0;
}

/* The echo bytes of oai's prompt (a text prompt's own; token ids
 * detokenized into *owned_p).  0, or -1 out of memory. */
static int epd_router_echo_of(epd_router_t *rt, const epd_oai_request_t *oai, const char **echo_p,
                              size_t *len_p, char **owned_p)
{
    *echo_p = NULL;
    *len_p = 0;
    *owned_p = NULL;
    if (!oai->echo) {
        return 0;
    }
    if (oai->prompt_ids == NULL) {
        *echo_p = oai->prompt;
        *len_p = oai->prompt_len;
        return 0;
    }
    if (epd_router_echo_ids(rt, oai->prompt_ids, oai->n_prompt_ids, owned_p, len_p) != 0) {
        return -1;
    }
    *echo_p = *owned_p;
    return 0;
}

/* A group's HTTP client went away: every started member's HTTP side is
 * finished and each is stepped (the group held over the walk: the last
 * member's free would drop it). */
static void epd_router_on_group_abort(epd_http_req_t *http, void *arg)
{
    epd_router_group_t *g = arg;
    uint64_t now = epd_time_now_ns();

    (void)http;
    if (g->http == NULL) {
        return;
    }
    g->http = NULL;
    g->refs++;
    for (uint32_t i = 0; i < g->n_members; i++) {
        epd_router_req_t *m = g->started[i] ? g->members[i] : NULL;

        if (m != NULL) {
            if (m->http != NULL) {
                m->http = NULL;
                m->rt->m.errors[EPD_ROUTER_ERR_CLIENT_GONE]++;
            }
            epd__router_req_poke(m->rt, m, now);
        }
    }
    epd__router_group_unref(g); /* the walk's */
    epd__router_group_unref(g); /* the HTTP side's */
}

/* Starts a group's leaders (choice 0 of each prompt); the others follow
 * each leader's first token (epd_router_req.c). */
static void epd_router_group_start(epd_router_t *rt, epd_router_group_t *g, uint64_t now)
{
    epd_http_req_set_abort(g->http, epd_router_on_group_abort, g);
    g->refs++; /* held while the leaders start: one may end the group */
    for (uint32_t i = 0; i < g->n_members; i += g->n_choices) {
        if (g->members[i] != NULL && !g->started[i]) {
            g->started[i] = 1;
            g->refs++; /* dropped when it is freed */
            g->members[i]->http = g->http;
            epd__router_req_start(rt, g->members[i], now);
        }
    }
    epd__router_group_unref(g);
}

/* A request of several choices (n > 1, a batch of prompts): one member
 * a choice, each prompt tokenized and checked alone (a batch's prompt k
 * lent to oai's prompt fields meanwhile); oai owned from here. */
static void epd_router_generate_group(epd_router_t *rt, epd_http_req_t *http,
                                      epd_oai_request_t *oai, int use_chat, uint32_t *img_pos,
                                      const unsigned char (*img_hash)[32], uint64_t now)
{
    size_t n_prompts = oai->n_batch > 0 ? oai->n_batch : 1;
    uint32_t n = oai->n;
    epd_router_group_t *g = epd__router_group_new(http, oai, (uint32_t)(n_prompts * n));
    char id[EPD_OAI_ID_MAX];
    int64_t created = (int64_t)time(NULL);
    char *saved_prompt = oai->prompt;
    size_t saved_len = oai->prompt_len;
    epd_oai_error_t err;
    int failed = 0;

    if (g == NULL) {
        rt->m.errors[EPD_ROUTER_ERR_INTERNAL]++;
        epd__router_respond_simple_error(rt, http, 500, "out of memory");
        return;
    }
    epd_oai_make_id(oai->kind, (rt->epoch.nonce ^ (++rt->id_counter * 0x9e3779b97f4a7c15ull)), id);
    for (size_t p = 0; p < n_prompts && !failed; p++) {
        size_t n_tok = 0;
        int64_t max_new = 0;
        const char *echo = NULL;
        size_t echo_len = 0;
        char *echo_owned = NULL;

        if (oai->n_batch > 0) {
            /* lent: put back below, before anything can free oai */
            oai->prompt = oai->batch[p].text;
            oai->prompt_len = oai->batch[p].len;
            oai->prompt_ids = oai->batch[p].ids;
            oai->n_prompt_ids = oai->batch[p].n_ids;
        }
        if (epd_router_prompt_tokens(rt, oai, use_chat, img_pos, &n_tok, &max_new, &err) != 0) {
            if (err.param[0] != '\0' && oai->n_batch > 0) {
                snprintf(err.param, sizeof(err.param), "prompt[%zu]", p);
            }
            failed = 1;
        } else if (epd_router_echo_of(rt, oai, &echo, &echo_len, &echo_owned) != 0) {
            epd_oai_error_set(&err, 500, NULL, NULL, "out of memory");
            failed = 1;
        }
        for (uint32_t c = 0; c < n && !failed; c++) {
            uint32_t i = (uint32_t)(p * n + c);
            epd_router_req_t *r = epd_router_req_build(rt, oai, n_tok, max_new, img_pos,
                                                       img_hash, echo, echo_len, now);

            if (r == NULL) {
                epd_oai_error_set(&err, 500, NULL, NULL, "out of memory");
                failed = 1;
                break;
            }
            r->group = g;
            r->choice = i;
            /* choice c of a prompt: seed + c (reproducible, distinct) */
            r->seed += c;
            r->created = created;
            memcpy(r->id, id, sizeof(r->id));
            g->members[i] = r;
            rt->m.prompt_tokens += n_tok;
        }
        epd_free(echo_owned);
        if (oai->n_batch > 0) {
            oai->prompt = saved_prompt;
            oai->prompt_len = saved_len;
            oai->prompt_ids = NULL;
            oai->n_prompt_ids = 0;
        }
    }
    if (failed) {
        rt->m.errors[err.http_status >= 500 ? EPD_ROUTER_ERR_INTERNAL
                                            : EPD_ROUTER_ERR_BAD_REQUEST]++;
        epd__router_respond_error(rt, http, &err);
        g->http = NULL;
        epd__router_group_unref(g); /* frees the members built */
        return;
    }
    rt->m.requests[oai->kind == EPD_OAI_CHAT][oai->stream != 0]++;
    epd_router_group_start(rt, g, now);
}

static void epd_router_generate(epd_router_t *rt, epd_http_req_t *http, epd_oai_kind_t kind)
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
    size_t prompt_len;
    int use_chat;
    uint32_t *img_pos = NULL;
    unsigned char(*img_hash)[32] = NULL;
    const char *echo = NULL;
    size_t echo_len = 0;
    char *echo_owned = NULL;
    epd_status_t st;

    memset(&err, 0, sizeof(err));
    body = epd_http_req_body(http, &body_len);
    st = epd_oai_request_parse_limited(kind, body, body_len, models, 1, rt->info->max_context,
                                       &rt->json_limits, &oai, &err);
    if (st != EPD_OK) {
        rt->m.errors[st == EPD_ERR_NO_MEMORY ? EPD_ROUTER_ERR_INTERNAL
                                             : EPD_ROUTER_ERR_BAD_REQUEST]++;
        epd__router_respond_error(rt, http, &err);
        return;
    }
    epd_router_apply_gen_defaults(&rt->gen_defaults, oai);
    /* a model's own chat template (images keep the plain rendering: no
     * model with a tokenizer.json has a vision encoder) */
    use_chat = kind == EPD_OAI_CHAT && rt->chat != NULL && oai->n_images == 0;
    prompt_len = oai->prompt_len;
    for (size_t k = 0; k < oai->n_batch; k++) {
        prompt_len = oai->batch[k].len > prompt_len ? oai->batch[k].len : prompt_len;
    }
    if (use_chat && epd__router_render_chat(rt, oai, &prompt_len) != 0) {
        rt->m.errors[EPD_ROUTER_ERR_INTERNAL]++;
        epd__router_respond_simple_error(rt, http, 500, "out of memory");
        epd_oai_request_destroy(oai);
        return;
    }
    if (rt->max_prompt_bytes != 0 && prompt_len > rt->max_prompt_bytes) {
        const char *what = kind == EPD_OAI_CHAT ? "messages" : "prompt";

        rt->m.errors[EPD_ROUTER_ERR_BAD_REQUEST]++;
        epd_oai_error_set(&err, 400, what, "context_length_exceeded",
                          "This model's maximum context length is %u tokens. However, your %s is "
                          "%zu bytes, more than %llu tokens of this model's tokenizer can hold. "
                          "Please reduce the length of the %s.",
                          rt->info->max_context, what, prompt_len,
                          (unsigned long long)rt->info->max_context, what);
        epd__router_respond_error(rt, http, &err);
        epd_oai_request_destroy(oai);
        return;
    }
    if (oai->n_images > 0 && epd_router_check_images(rt, oai, &err) != EPD_OK) {
        rt->m.errors[EPD_ROUTER_ERR_BAD_REQUEST]++;
        epd__router_respond_error(rt, http, &err);
        epd_oai_request_destroy(oai);
        return;
    }
    if (oai->n_images > 0) {
        img_pos = epd_calloc(oai->n_images, sizeof(*img_pos));
        img_hash = epd_calloc(oai->n_images, sizeof(*img_hash));
        if (img_pos == NULL || img_hash == NULL) {
            epd_free(img_pos);
            epd_free(img_hash);
            rt->m.errors[EPD_ROUTER_ERR_INTERNAL]++;
            epd__router_respond_simple_error(rt, http, 500, "out of memory");
            epd_oai_request_destroy(oai);
            return;
        }
        /* images: their content hashes name them in every cache (rule 13) */
        for (size_t k = 0; k < oai->n_images; k++) {
            epd_content_hash(oai->images[k].data, oai->images[k].len, img_hash[k]);
            rt->m.image_bytes += oai->images[k].len;
        }
    }
    if (oai->n > 1 || oai->n_batch > 0) {
        epd_router_generate_group(rt, http, oai, use_chat, img_pos,
                                  (const unsigned char(*)[32])img_hash, now);
        epd_free(img_pos);
        epd_free(img_hash);
        return;
    }
    if (epd_router_prompt_tokens(rt, oai, use_chat, img_pos, &n_tok, &max_new, &err) != 0 ||
        epd_router_echo_of(rt, oai, &echo, &echo_len, &echo_owned) != 0) {
        if (err.http_status == 0) {
            epd_oai_error_set(&err, 500, NULL, NULL, "out of memory");
        }
        rt->m.errors[err.http_status >= 500 ? EPD_ROUTER_ERR_INTERNAL
                                            : EPD_ROUTER_ERR_BAD_REQUEST]++;
        epd__router_respond_error(rt, http, &err);
        epd_free(img_pos);
        epd_free(img_hash);
        epd_oai_request_destroy(oai);
        return;
    }
    r = epd_router_req_build(rt, oai, n_tok, max_new, img_pos,
                             (const unsigned char(*)[32])img_hash, echo, echo_len, now);
    epd_free(echo_owned);
    epd_free(img_pos);
    epd_free(img_hash);
    if (r == NULL) {
        rt->m.errors[EPD_ROUTER_ERR_INTERNAL]++;
        epd__router_respond_simple_error(rt, http, 500, "out of memory");
        epd_oai_request_destroy(oai);
        return;
    }
    r->http = http;
    r->created = (int64_t)time(NULL);
    epd_oai_make_id(kind, (rt->epoch.nonce ^ (++rt->id_counter * 0x9e3779b97f4a7c15ull)), r->id);
    rt->m.requests[kind == EPD_OAI_CHAT][oai->stream != 0]++;
    rt->m.prompt_tokens += n_tok;
    epd__router_req_start(rt, r, now);
}

static void epd_router_health(epd_router_t *rt, epd_http_req_t *http)
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
    (void)epd_http_respond(http, 200, EPD_ROUTER_JSON, body, (size_t)n);
}

/* GET /ready, for load balancers and kubelets (/health is liveness): 200
 * only while the router can serve a request — at least one READY prefill
 * and one READY decode worker, and a READY encoder when the model has
 * vision (unless --ready-without-encoder: the prefill workers encode) —
 * and is not draining; else 503 with the reason. */
static void epd_router_ready(epd_router_t *rt, epd_http_req_t *http)
{
    uint32_t counts[EPD_ROUTER_POOLS][5];
    uint32_t p, dc, e;
    const char *why = NULL;
    char body[384];
    int n;

    epd_router_registry_counts(&rt->reg, counts);
    p = counts[EPD_ROUTER_POOL_PREFILL][EPD_ROUTER_READY];
    dc = counts[EPD_ROUTER_POOL_DECODE][EPD_ROUTER_READY];
    e = counts[EPD_ROUTER_POOL_ENCODER][EPD_ROUTER_READY];
    if (epd_daemon_draining(rt->d)) {
        why = "draining";
    } else if (p == 0) {
        why = "no READY prefill worker";
    } else if (dc == 0) {
        why = "no READY decode worker";
    } else if (e == 0 && rt->info->image_embeddings > 0 && !rt->ready_without_encoder) {
        why = "no READY encoder (the model has vision)";
    }
    n = snprintf(
        body, sizeof(body),
        "{\"ready\":%s,\"prefill_ready\":%u,\"decode_ready\":%u,\"encoder_ready\":%u%s%s%s}",
        why == NULL ? "true" : "false", p, dc, e, why != NULL ? ",\"reason\":\"" : "",
        why != NULL ? why : "", why != NULL ? "\"" : "");
    (void)epd_http_respond(http, why == NULL ? 200 : 503, EPD_ROUTER_JSON, body, (size_t)n);
}

/* GET /v1/models/{id}: the model object, or 404 model_not_found. */
static void epd_router_model(epd_router_t *rt, epd_http_req_t *http, const char *id)
{
    epd_router_text_t t = {0};
    epd_oai_error_t err;

    if (strcmp(id, rt->model_name) != 0) {
        rt->m.errors[EPD_ROUTER_ERR_BAD_REQUEST]++;
        epd_oai_error_set(&err, 404, "model", "model_not_found",
                          "the model '%.100s' does not exist", id);
        epd__router_respond_error(rt, http, &err);
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
    epd_router_text_printf(&t,
                           "\",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"epd\","
                           "\"max_model_len\":%u}",
                           (long long)(rt->epoch.start_time_ns / 1000000000ull),
                           rt->info->max_context);
    if (t.failed) {
        epd__router_respond_simple_error(rt, http, 500, "out of memory");
    } else {
        (void)epd_http_respond(http, 200, EPD_ROUTER_JSON, t.data, t.len);
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
        epd__router_respond_simple_error(rt, http, 503, "the router is shutting down");
        return;
    }
    if (post && epd_daemon_draining(rt->d) &&
        (strcmp(path, "/v1/completions") == 0 || strcmp(path, "/v1/chat/completions") == 0)) {
        /* SIGTERM: what is running finishes, nothing new starts */
        epd__router_respond_simple_error(rt, http, 503, "the router is draining");
        return;
    }
    if (strcmp(path, "/v1/completions") == 0 && post) {
        epd_router_generate(rt, http, EPD_OAI_COMPLETION);
    } else if (strcmp(path, "/v1/chat/completions") == 0 && post) {
        epd_router_generate(rt, http, EPD_OAI_CHAT);
    } else if (strcmp(path, "/v1/models") == 0 && get) {
        const char *models[1] = {rt->model_name};

        epd_oai_buf_reset(&rt->out);
        if (epd_oai_models_encode(models, 1, (int64_t)(rt->epoch.start_time_ns / 1000000000ull),
                                  (int64_t)rt->info->max_context, &rt->out) != EPD_OK) {
            epd__router_respond_simple_error(rt, http, 500, "out of memory");
        } else {
            (void)epd_http_respond(http, 200, EPD_ROUTER_JSON, rt->out.data, rt->out.len);
        }
    } else if (strcmp(path, "/tokenize") == 0 && post) {
        epd__router_tokenize_http(rt, http);
    } else if (strcmp(path, "/detokenize") == 0 && post) {
        epd__router_detokenize_http(rt, http);
    } else if (strcmp(path, "/version") == 0 && get) {
        epd__router_version_http(rt, http);
    } else if (strncmp(path, "/v1/models/", 11) == 0 && get) {
        epd_router_model(rt, http, path + 11);
    } else if (strcmp(path, "/health") == 0 && get) {
        epd_router_health(rt, http);
    } else if (strcmp(path, "/ready") == 0 && get) {
        epd_router_ready(rt, http);
    } else if (strcmp(path, "/metrics") == 0 && get) {
        epd_router_text_t t = {0};

        if (rt->http != NULL) {
            epd_http_server_stats(rt->http, &rt->m.http);
        }
        rt->m.queue_depth = rt->n_waiting;
        if (epd_router_metrics_render(&rt->m, &rt->reg, rt->n_reqs, &t) != EPD_OK) {
            epd__router_respond_simple_error(rt, http, 500, "out of memory");
        } else {
            (void)epd_http_respond(http, 200, "text/plain; version=0.0.4; charset=utf-8", t.data,
                                   t.len);
        }
        epd_router_text_cleanup(&t);
    } else if (strcmp(path, "/v1/completions") == 0 || strcmp(path, "/v1/chat/completions") == 0 ||
               strcmp(path, "/v1/models") == 0 || strcmp(path, "/health") == 0 ||
               strcmp(path, "/ready") == 0 || strcmp(path, "/metrics") == 0 ||
               strcmp(path, "/tokenize") == 0 || strcmp(path, "/detokenize") == 0 ||
               strcmp(path, "/version") == 0) {
        rt->m.errors[EPD_ROUTER_ERR_BAD_REQUEST]++;
        epd__router_respond_simple_error(rt, http, 405, "method not allowed on this path");
    } else {
        rt->m.errors[EPD_ROUTER_ERR_BAD_REQUEST]++;
        epd__router_respond_simple_error(rt, http, 404, "no such endpoint");
    }
}
