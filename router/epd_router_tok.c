/*
 * epd_router_tok.c — the router's tokenizer endpoints, in vLLM's shapes,
 * and GET /version:
 *
 *   POST /tokenize   {"model"?, "prompt": TEXT, "add_special_tokens"?: true}
 *                    or {"model", "messages": [...], ...chat fields}
 *                    -> {"count": N, "max_model_len": CONTEXT, "tokens": [ids],
 *                        "token_strs": null}
 *                    The ids are exactly the prompt a /v1/completions request
 *                    with this text sends to the workers (BOS added unless
 *                    add_special_tokens is false), or a
 *                    /v1/chat/completions request with these messages (its
 *                    body's fields and refusals; no images).
 *   POST /detokenize {"model"?, "tokens": [ids]} -> {"prompt": TEXT}
 *                    TEXT repaired as generated text is (one U+FFFD per
 *                    invalid UTF-8 sequence), special tokens producing nothing.
 *   GET  /version    {"version": EPD_ROUTER_VERSION}
 *
 * Bodies are held to the router's JSON limits before jansson parses them;
 * every refusal is an OpenAI-shaped 400 naming its field.  Loop thread
 * (the router's only tokenizer user).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "epd_alloc.h"
#include "epd_router_int.h"
#include "epd_utf8.h"

/* the API version /version reports (the OpenAI surface of issue #26) */
#define EPD_ROUTER_VERSION "0.2.0"

static void epd_router_tok_bad(epd_router_t *rt, epd_http_req_t *http, epd_oai_error_t *err)
{
    rt->m.errors[EPD_ROUTER_ERR_BAD_REQUEST]++;
    epd__router_respond_error(rt, http, err);
}

/* json_dumps's text as the answer (jansson allocates it; freed with
 * free, as jansson's default allocator asks) */
static void epd_router_tok_answer(epd_router_t *rt, epd_http_req_t *http, json_t *obj)
{
    char *text = obj != NULL ? json_dumps(obj, JSON_COMPACT) : NULL;

    if (text == NULL) {
        rt->m.errors[EPD_ROUTER_ERR_INTERNAL]++;
        epd__router_respond_simple_error(rt, http, 500, "out of memory");
    } else {
        (void)epd_http_respond(http, 200, EPD_ROUTER_JSON, text, strlen(text));
    }
    free(text);
    json_decref(obj);
}

/* The body as a JSON object, its "model" (when given) the served one:
 * NULL after answering the refusal. */
static json_t *epd_router_tok_body(epd_router_t *rt, epd_http_req_t *http, const char *const *keys,
                                   size_t n_keys)
{
    epd_oai_error_t err;
    json_error_t jerr;
    size_t len = 0;
    const char *body = epd_http_req_body(http, &len);
    const char *key;
    json_t *root;
    json_t *v;

    if (epd_oai_json_check(body != NULL ? body : "", len, &rt->json_limits, &err) != EPD_OK) {
        epd_router_tok_bad(rt, http, &err);
        return NULL;
    }
    root = json_loadb(body != NULL ? body : "", len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL || !json_is_object(root)) {
        epd_oai_error_set(&err, 400, NULL, NULL, "The body must be a JSON object%s%s.",
                          root == NULL ? ": " : "", root == NULL ? jerr.text : "");
        json_decref(root);
        epd_router_tok_bad(rt, http, &err);
        return NULL;
    }
    json_object_foreach(root, key, v)
    {
        size_t i;

        for (i = 0; i < n_keys && strcmp(keys[i], key) != 0; i++) {
        }
        if (i == n_keys) {
            epd_oai_error_set(&err, 400, NULL, NULL,
                              "Unrecognized request argument supplied: %.100s", key);
            snprintf(err.param, sizeof(err.param), "%.60s", key);
            json_decref(root);
            epd_router_tok_bad(rt, http, &err);
            return NULL;
        }
    }
    v = json_object_get(root, "model");
    if (v != NULL && !json_is_null(v) &&
        (!json_is_string(v) || strcmp(json_string_value(v), rt->model_name) != 0)) {
        epd_oai_error_set(&err, 404, "model", "model_not_found", "The model does not exist.");
        json_decref(root);
        epd_router_tok_bad(rt, http, &err);
        return NULL;
    }
    return root;
}

/* POST /tokenize with "messages": the body read as a chat completion's
 * (the same fields and refusals; "model" required), tokenized as one. */
static void epd_router_tokenize_chat_http(epd_router_t *rt, epd_http_req_t *http)
{
    const char *models[1] = {rt->model_name};
    epd_oai_request_t *oai = NULL;
    epd_oai_error_t err;
    size_t len = 0;
    const char *body = epd_http_req_body(http, &len);
    json_t *ids;
    json_t *out;
    size_t n = 0;

    if (epd_oai_request_parse_limited(EPD_OAI_CHAT, body, len, models, 1, rt->info->max_context,
                                      &rt->json_limits, &oai, &err) != EPD_OK) {
        epd_router_tok_bad(rt, http, &err);
        return;
    }
    if (oai->n_images > 0) {
        epd_oai_error_set(&err, 400, "messages", NULL,
                          "/tokenize does not take images (their placeholders are the "
                          "router's).");
        epd_oai_request_destroy(oai);
        epd_router_tok_bad(rt, http, &err);
        return;
    }
    if (epd__router_tokenize_chat_request(rt, oai, &n) != 0) {
        epd_oai_request_destroy(oai);
        epd_router_tok_answer(rt, http, NULL);
        return;
    }
    epd_oai_request_destroy(oai);
    ids = json_array();
    for (size_t i = 0; ids != NULL && i < n; i++) {
        if (json_array_append_new(ids, json_integer(rt->tok_scratch[i])) != 0) {
            json_decref(ids);
            ids = NULL;
        }
    }
    out = ids == NULL ? NULL
                      : json_pack("{s:I,s:I,s:o,s:n}", "count", (json_int_t)n, "max_model_len",
                                  (json_int_t)rt->info->max_context, "tokens", ids, "token_strs");
    epd_router_tok_answer(rt, http, out);
}

/* Whether the body (a JSON object, judged cheaply: the parse that follows
 * decides) has a top-level "messages" key. */
static int epd_router_tok_has_messages(epd_http_req_t *http)
{
    size_t len = 0;
    const char *body = epd_http_req_body(http, &len);
    json_t *root = body != NULL ? json_loadb(body, len, 0, NULL) : NULL;
    int has = json_is_object(root) && json_object_get(root, "messages") != NULL;

    json_decref(root);
    return has;
}

void epd__router_tokenize_http(epd_router_t *rt, epd_http_req_t *http)
{
    static const char *const keys[] = {"model", "prompt", "add_special_tokens"};
    epd_oai_error_t err;
    json_t *root;
    json_t *prompt;
    json_t *special;
    json_t *ids;
    json_t *out;
    size_t n = 0;
    int add_bos = 1;
    epd_status_t st;

    if (epd_router_tok_has_messages(http)) {
        epd_router_tokenize_chat_http(rt, http);
        return;
    }
    root = epd_router_tok_body(rt, http, keys, 3);
    if (root == NULL) {
        return;
    }
    prompt = json_object_get(root, "prompt");
    special = json_object_get(root, "add_special_tokens");
    if (!json_is_string(prompt)) {
        epd_oai_error_set(&err, 400, "prompt", NULL, "'prompt' must be a string.");
        goto bad;
    }
    if (special != NULL && !json_is_null(special)) {
        if (!json_is_boolean(special)) {
            epd_oai_error_set(&err, 400, "add_special_tokens", NULL,
                              "'add_special_tokens' must be a boolean.");
            goto bad;
        }
        add_bos = json_is_true(special);
    }
    for (size_t cap = json_string_length(prompt) + 2;;) {
        if (rt->tok_scratch_cap < cap) {
            int32_t *p = epd_realloc(rt->tok_scratch, cap * sizeof(*p));

            if (p == NULL) {
                json_decref(root);
                epd_router_tok_answer(rt, http, NULL);
                return;
            }
            rt->tok_scratch = p;
            rt->tok_scratch_cap = cap;
        }
        st = epd_engine_tokenize(rt->engine, json_string_value(prompt), json_string_length(prompt),
                                 add_bos, rt->tok_scratch, rt->tok_scratch_cap, &n);
        if (st != EPD_ERR_TOO_LONG) {
            break;
        }
        cap = rt->tok_scratch_cap * 2;
    }
    if (st != EPD_OK) {
        epd_oai_error_set(&err, 400, "prompt", NULL, "The prompt cannot be tokenized.");
        goto bad;
    }
    json_decref(root);
    ids = json_array();
    for (size_t i = 0; ids != NULL && i < n; i++) {
        if (json_array_append_new(ids, json_integer(rt->tok_scratch[i])) != 0) {
            json_decref(ids);
            ids = NULL;
        }
    }
    out = ids == NULL ? NULL
                      : json_pack("{s:I,s:I,s:o,s:n}", "count", (json_int_t)n, "max_model_len",
                                  (json_int_t)rt->info->max_context, "tokens", ids, "token_strs");
    epd_router_tok_answer(rt, http, out);
    return;

bad:
    json_decref(root);
    epd_router_tok_bad(rt, http, &err);
}

void epd__router_detokenize_http(epd_router_t *rt, epd_http_req_t *http)
{
    static const char *const keys[] = {"model", "tokens"};
    epd_oai_error_t err;
    json_t *root = epd_router_tok_body(rt, http, keys, 2);
    json_t *tokens;
    size_t n;
    size_t len = 0;
    size_t flen = 0;
    char *fixed = NULL;
    epd_status_t st;

    if (root == NULL) {
        return;
    }
    tokens = json_object_get(root, "tokens");
    if (!json_is_array(tokens)) {
        epd_oai_error_set(&err, 400, "tokens", NULL, "'tokens' must be an array of token ids.");
        goto bad;
    }
    n = json_array_size(tokens);
    if (rt->tok_scratch_cap < n + 1) {
        int32_t *p = epd_realloc(rt->tok_scratch, (n + 1) * sizeof(*p));

        if (p == NULL) {
            json_decref(root);
            epd_router_tok_answer(rt, http, NULL);
            return;
        }
        rt->tok_scratch = p;
        rt->tok_scratch_cap = n + 1;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(tokens, i);

        if (!json_is_integer(e) || json_integer_value(e) < 0 ||
            json_integer_value(e) >= (json_int_t)rt->info->vocab_size) {
            epd_oai_error_set(&err, 400, "tokens", NULL,
                              "'tokens[%zu]' is not a token id of this model (0 to %u).", i,
                              rt->info->vocab_size - 1);
            goto bad;
        }
        rt->tok_scratch[i] = (int32_t)json_integer_value(e);
    }
    json_decref(root);
    root = NULL;
    for (;;) {
        st = epd_engine_detokenize(rt->engine, rt->tok_scratch, n, rt->detok_scratch,
                                   rt->detok_scratch_cap, &len);
        if (st != EPD_ERR_TOO_LONG) {
            break;
        }
        {
            size_t cap = rt->detok_scratch_cap * 2 + n * 8 + 64;
            char *p = epd_realloc(rt->detok_scratch, cap);

            if (p == NULL) {
                epd_router_tok_answer(rt, http, NULL);
                return;
            }
            rt->detok_scratch = p;
            rt->detok_scratch_cap = cap;
        }
    }
    if (st == EPD_OK) {
        fixed = epd_malloc(EPD_UTF8_REPAIR_MAX(len) + 1);
    }
    if (st != EPD_OK || fixed == NULL ||
        (len > 0 && epd_utf8_repair(rt->detok_scratch, len, fixed, EPD_UTF8_REPAIR_MAX(len),
                                    &flen) != EPD_OK)) {
        epd_free(fixed);
        epd_router_tok_answer(rt, http, NULL);
        return;
    }
    epd_router_tok_answer(rt, http, json_pack("{s:s%}", "prompt", fixed, flen));
    epd_free(fixed);
    return;

bad:
    json_decref(root);
    epd_router_tok_bad(rt, http, &err);
}

void epd__router_version_http(epd_router_t *rt, epd_http_req_t *http)
{
    epd_router_tok_answer(rt, http, json_pack("{s:s}", "version", EPD_ROUTER_VERSION));
}
