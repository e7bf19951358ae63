/*
 * epd_openai_fields.c — nothing silently ignored: every top-level key of a
 * /v1/completions or /v1/chat/completions body is looked up here before
 * any field is parsed (design: epd_openai.h, "Fields").
 *
 * Each key the server knows has one class:
 *   IMPL     implemented: epd_openai_parse.c reads and validates it;
 *   NOEFFECT accepted and has no effect (bookkeeping fields of OpenAI's
 *            platform: user, metadata, store, ...);
 *   NOOP     accepted only at the value that asks for nothing (0 for a
 *            penalty, false for a switch, {"type": "text"} for
 *            response_format, ...), refused with a 400 naming it at any
 *            other value, because the server does not implement it;
 *   REFUSED  refused with a 400 naming it whenever it is present and not
 *            null (a feature the server lacks, such as tools).
 * A key absent from the table is refused as OpenAI refuses it:
 * "Unrecognized request argument supplied: KEY" (param: the key).
 *
 * Why a table and not the parser's own reads: the parser reads the fields
 * it needs by name, so it cannot see what it does not read; the table is
 * the one place a reviewer reads to know what the server does with each
 * key, and docs/api.md's "Fields" table is written from it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "epd_alloc.h"
#include "epd_openai_int.h"

typedef enum {
    EPD_OAI_F_IMPL = 0,
    EPD_OAI_F_NOEFFECT,
    EPD_OAI_F_NOOP,
    EPD_OAI_F_REFUSED,
} epd_oai_fclass_t;

/* The value of a NOOP field that asks for nothing. */
typedef enum {
    EPD_OAI_NOOP_NONE = 0,    /* (REFUSED and others: no such value) */
    EPD_OAI_NOOP_ZERO,        /* the number 0 */
    EPD_OAI_NOOP_ONE,         /* the number 1 */
    EPD_OAI_NOOP_FALSE,       /* false */
    EPD_OAI_NOOP_TRUE,        /* true */
    EPD_OAI_NOOP_EMPTY,       /* [] or {} */
    EPD_OAI_NOOP_EMPTY_STR,   /* "" */
    EPD_OAI_NOOP_STR_NONE,    /* "none" */
    EPD_OAI_NOOP_FORMAT_TEXT, /* {"type": "text"} */
    EPD_OAI_NOOP_TEXT_ONLY,   /* ["text"] */
} epd_oai_noop_t;

#define EPD_OAI_K_C 0x1u  /* /v1/completions */
#define EPD_OAI_K_CH 0x2u /* /v1/chat/completions */
#define EPD_OAI_K_ALL (EPD_OAI_K_C | EPD_OAI_K_CH)

typedef struct {
    const char *name;
    unsigned kinds;
    epd_oai_fclass_t cls;
    epd_oai_noop_t noop;
    const char *why; /* REFUSED / NOOP: what the server lacks */
} epd_oai_field_t;

static const epd_oai_field_t epd_oai_fields[] = {
    /* implemented */
    {"model", EPD_OAI_K_ALL, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"prompt", EPD_OAI_K_C, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"messages", EPD_OAI_K_CH, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"max_tokens", EPD_OAI_K_ALL, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"max_completion_tokens", EPD_OAI_K_ALL, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"temperature", EPD_OAI_K_ALL, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"top_p", EPD_OAI_K_ALL, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"top_k", EPD_OAI_K_ALL, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"seed", EPD_OAI_K_ALL, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"n", EPD_OAI_K_ALL, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"stream", EPD_OAI_K_ALL, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"stream_options", EPD_OAI_K_ALL, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"stop", EPD_OAI_K_ALL, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"epd_encode", EPD_OAI_K_ALL, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"cache_salt", EPD_OAI_K_ALL, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"add_generation_prompt", EPD_OAI_K_CH, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"chat_template_kwargs", EPD_OAI_K_CH, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"presence_penalty", EPD_OAI_K_ALL, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"frequency_penalty", EPD_OAI_K_ALL, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"repetition_penalty", EPD_OAI_K_ALL, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"logit_bias", EPD_OAI_K_ALL, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"min_tokens", EPD_OAI_K_ALL, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"ignore_eos", EPD_OAI_K_ALL, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"stop_token_ids", EPD_OAI_K_ALL, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"logprobs", EPD_OAI_K_ALL, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"top_logprobs", EPD_OAI_K_CH, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    {"echo", EPD_OAI_K_C, EPD_OAI_F_IMPL, EPD_OAI_NOOP_NONE, NULL},
    /* accepted, without effect */
    {"user", EPD_OAI_K_ALL, EPD_OAI_F_NOEFFECT, EPD_OAI_NOOP_NONE, NULL},
    {"metadata", EPD_OAI_K_ALL, EPD_OAI_F_NOEFFECT, EPD_OAI_NOOP_NONE, NULL},
    {"store", EPD_OAI_K_ALL, EPD_OAI_F_NOEFFECT, EPD_OAI_NOOP_NONE, NULL},
    {"service_tier", EPD_OAI_K_ALL, EPD_OAI_F_NOEFFECT, EPD_OAI_NOOP_NONE, NULL},
    {"parallel_tool_calls", EPD_OAI_K_CH, EPD_OAI_F_NOEFFECT, EPD_OAI_NOOP_NONE, NULL},
    {"prompt_cache_key", EPD_OAI_K_ALL, EPD_OAI_F_NOEFFECT, EPD_OAI_NOOP_NONE, NULL},
    {"safety_identifier", EPD_OAI_K_ALL, EPD_OAI_F_NOEFFECT, EPD_OAI_NOOP_NONE, NULL},
    {"request_id", EPD_OAI_K_ALL, EPD_OAI_F_NOEFFECT, EPD_OAI_NOOP_NONE, NULL},
    /* accepted only at the value that asks for nothing */
    {"min_p", EPD_OAI_K_ALL, EPD_OAI_F_NOOP, EPD_OAI_NOOP_ZERO, "min_p sampling"},
    {"best_of", EPD_OAI_K_C, EPD_OAI_F_NOOP, EPD_OAI_NOOP_ONE, "best_of"},
    {"echo", EPD_OAI_K_CH, EPD_OAI_F_NOOP, EPD_OAI_NOOP_FALSE, "echo"},
    {"suffix", EPD_OAI_K_C, EPD_OAI_F_NOOP, EPD_OAI_NOOP_EMPTY_STR, "suffixes (insertion)"},
    {"response_format", EPD_OAI_K_ALL, EPD_OAI_F_NOOP, EPD_OAI_NOOP_FORMAT_TEXT,
     "structured output (only {\"type\": \"text\"})"},
    {"tools", EPD_OAI_K_CH, EPD_OAI_F_NOOP, EPD_OAI_NOOP_EMPTY, "tool calling"},
    {"tool_choice", EPD_OAI_K_CH, EPD_OAI_F_NOOP, EPD_OAI_NOOP_STR_NONE, "tool calling"},
    {"functions", EPD_OAI_K_CH, EPD_OAI_F_NOOP, EPD_OAI_NOOP_EMPTY, "function calling"},
    {"function_call", EPD_OAI_K_CH, EPD_OAI_F_NOOP, EPD_OAI_NOOP_STR_NONE, "function calling"},
    {"modalities", EPD_OAI_K_CH, EPD_OAI_F_NOOP, EPD_OAI_NOOP_TEXT_ONLY,
     "output modalities "
     "other than text"},
    {"use_beam_search", EPD_OAI_K_ALL, EPD_OAI_F_NOOP, EPD_OAI_NOOP_FALSE, "beam search"},
    {"length_penalty", EPD_OAI_K_ALL, EPD_OAI_F_NOOP, EPD_OAI_NOOP_ONE, "beam search"},
    {"include_stop_str_in_output", EPD_OAI_K_ALL, EPD_OAI_F_NOOP, EPD_OAI_NOOP_FALSE,
     "include_stop_str_in_output"},
    {"skip_special_tokens", EPD_OAI_K_ALL, EPD_OAI_F_NOOP, EPD_OAI_NOOP_TRUE,
     "skip_special_tokens false"},
    {"spaces_between_special_tokens", EPD_OAI_K_ALL, EPD_OAI_F_NOOP, EPD_OAI_NOOP_TRUE,
     "spaces_between_special_tokens false"},
    {"return_tokens_as_token_ids", EPD_OAI_K_ALL, EPD_OAI_F_NOOP, EPD_OAI_NOOP_FALSE,
     "return_tokens_as_token_ids"},
    {"continue_final_message", EPD_OAI_K_CH, EPD_OAI_F_NOOP, EPD_OAI_NOOP_FALSE,
     "continue_final_message"},
    {"priority", EPD_OAI_K_ALL, EPD_OAI_F_NOOP, EPD_OAI_NOOP_ZERO, "priority scheduling"},
    /* refused whenever present */
    {"prompt_logprobs", EPD_OAI_K_ALL, EPD_OAI_F_REFUSED, EPD_OAI_NOOP_NONE, "prompt logprobs"},
    {"audio", EPD_OAI_K_CH, EPD_OAI_F_REFUSED, EPD_OAI_NOOP_NONE, "audio output"},
    {"prediction", EPD_OAI_K_CH, EPD_OAI_F_REFUSED, EPD_OAI_NOOP_NONE, "predicted outputs"},
    {"web_search_options", EPD_OAI_K_CH, EPD_OAI_F_REFUSED, EPD_OAI_NOOP_NONE, "web search"},
    {"reasoning_effort", EPD_OAI_K_CH, EPD_OAI_F_REFUSED, EPD_OAI_NOOP_NONE, "reasoning effort"},
    {"verbosity", EPD_OAI_K_CH, EPD_OAI_F_REFUSED, EPD_OAI_NOOP_NONE, "verbosity"},
    {"guided_json", EPD_OAI_K_ALL, EPD_OAI_F_REFUSED, EPD_OAI_NOOP_NONE, "guided decoding"},
    {"guided_regex", EPD_OAI_K_ALL, EPD_OAI_F_REFUSED, EPD_OAI_NOOP_NONE, "guided decoding"},
    {"guided_choice", EPD_OAI_K_ALL, EPD_OAI_F_REFUSED, EPD_OAI_NOOP_NONE, "guided decoding"},
    {"guided_grammar", EPD_OAI_K_ALL, EPD_OAI_F_REFUSED, EPD_OAI_NOOP_NONE, "guided decoding"},
    {"structured_outputs", EPD_OAI_K_ALL, EPD_OAI_F_REFUSED, EPD_OAI_NOOP_NONE,
     "structured output"},
    {"truncate_prompt_tokens", EPD_OAI_K_ALL, EPD_OAI_F_REFUSED, EPD_OAI_NOOP_NONE,
     "prompt truncation"},
    {"chat_template", EPD_OAI_K_CH, EPD_OAI_F_REFUSED, EPD_OAI_NOOP_NONE,
     "a chat template sent by the client"},
    {"add_special_tokens", EPD_OAI_K_ALL, EPD_OAI_F_REFUSED, EPD_OAI_NOOP_NONE,
     "add_special_tokens"},
};

static int epd_oai_noop_value(epd_oai_noop_t noop, json_t *v)
{
    switch (noop) {
    case EPD_OAI_NOOP_NONE:
        return 0;
    case EPD_OAI_NOOP_ZERO:
        return json_is_number(v) && json_number_value(v) == 0.0;
    case EPD_OAI_NOOP_ONE:
        return json_is_number(v) && json_number_value(v) == 1.0;
    case EPD_OAI_NOOP_FALSE:
        return json_is_false(v);
    case EPD_OAI_NOOP_TRUE:
        return json_is_true(v);
    case EPD_OAI_NOOP_EMPTY:
        return (json_is_array(v) && json_array_size(v) == 0) ||
               (json_is_object(v) && json_object_size(v) == 0);
    case EPD_OAI_NOOP_EMPTY_STR:
        return json_is_string(v) && json_string_length(v) == 0;
    case EPD_OAI_NOOP_STR_NONE:
        return json_is_string(v) && strcmp(json_string_value(v), "none") == 0;
    case EPD_OAI_NOOP_FORMAT_TEXT: {
        json_t *t = json_object_get(v, "type");

        return json_is_object(v) && json_object_size(v) == 1 && json_is_string(t) &&
               strcmp(json_string_value(t), "text") == 0;
    }
    case EPD_OAI_NOOP_TEXT_ONLY:
        return json_is_array(v) && json_array_size(v) == 1 &&
               json_is_string(json_array_get(v, 0)) &&
               strcmp(json_string_value(json_array_get(v, 0)), "text") == 0;
    }
    return 0;
}

static const epd_oai_field_t *epd_oai_field_find(unsigned kind_bit, const char *key)
{
    size_t i;

    for (i = 0; i < sizeof(epd_oai_fields) / sizeof(epd_oai_fields[0]); i++) {
        if ((epd_oai_fields[i].kinds & kind_bit) != 0 && strcmp(epd_oai_fields[i].name, key) == 0) {
            return &epd_oai_fields[i];
        }
    }
    return NULL;
}

epd_status_t epd__oai_fields_check(epd_oai_kind_t kind, json_t *root, epd_oai_error_t *err)
{
    unsigned kind_bit = kind == EPD_OAI_CHAT ? EPD_OAI_K_CH : EPD_OAI_K_C;
    const char *key;
    json_t *v;

    json_object_foreach(root, key, v)
    {
        const epd_oai_field_t *f = epd_oai_field_find(kind_bit, key);

        if (f == NULL) {
            /* OpenAI's own words for it; the key (at most 60 bytes of it)
             * as param so that a client sees which */
            epd_oai_error_set(err, 400, NULL, NULL,
                              "Unrecognized request argument supplied: %.100s", key);
            snprintf(err->param, sizeof(err->param), "%.60s", key);
            return EPD_ERR_INVALID_PARAM;
        }
        if (json_is_null(v) || f->cls == EPD_OAI_F_IMPL || f->cls == EPD_OAI_F_NOEFFECT) {
            continue;
        }
        if (f->cls == EPD_OAI_F_NOOP && epd_oai_noop_value(f->noop, v)) {
            continue;
        }
        epd_oai_error_set(err, 400, f->name, "unsupported_parameter",
                          "Unsupported parameter: '%s': this server does not implement %s%s.",
                          f->name, f->why,
                          f->cls == EPD_OAI_F_NOOP ? " (omit it, or send its default)" : "");
        return EPD_ERR_INVALID_PARAM;
    }
    return EPD_OK;
}

/* ---- the sampling fields (engine/epd_sample.h) ---- */

#define EPD_OAI_MAX_BIAS 300    /* engine/epd_sample.h EPD_SAMPLE_MAX_BIAS */
#define EPD_OAI_MAX_STOP_IDS 64 /* decode's EPD_DECODE_MAX_STOP_IDS */

static epd_status_t epd_oai_penalty(json_t *root, const char *name, double lo, int lo_open,
                                    double hi, double *value_p, epd_oai_error_t *err)
{
    json_t *v = json_object_get(root, name);
    double d;

    if (v == NULL || json_is_null(v)) {
        return EPD_OK;
    }
    if (!json_is_number(v)) {
        epd_oai_error_set(err, 400, name, NULL, "Invalid type for '%s': expected a number.", name);
        return EPD_ERR_INVALID_PARAM;
    }
    d = json_number_value(v);
    if (!(d >= lo && d <= hi) || (lo_open && d == lo)) {
        epd_oai_error_set(err, 400, name, NULL, "'%s' must be in %s%g, %g], got %g.", name,
                          lo_open ? "(" : "[", lo, hi, d);
        return EPD_ERR_INVALID_PARAM;
    }
    *value_p = d;
    return EPD_OK;
}

static void epd_oai_sampling_oom(epd_oai_error_t *err)
{
    epd_oai_error_set(err, 500, NULL, NULL, "The server is out of memory.");
}

/* logit_bias: {"ID": number}, ID a decimal token id (OpenAI's shape) */
static epd_status_t epd_oai_logit_bias(json_t *root, epd_oai_request_t *req, epd_oai_error_t *err)
{
    json_t *v = json_object_get(root, "logit_bias");
    const char *key;
    json_t *val;
    size_t n;

    if (v == NULL || json_is_null(v)) {
        return EPD_OK;
    }
    if (!json_is_object(v)) {
        epd_oai_error_set(err, 400, "logit_bias", NULL,
                          "Invalid type for 'logit_bias': expected an object mapping token ids "
                          "to numbers.");
        return EPD_ERR_INVALID_PARAM;
    }
    n = json_object_size(v);
    if (n > EPD_OAI_MAX_BIAS) {
        epd_oai_error_set(err, 400, "logit_bias", NULL,
                          "'logit_bias' holds %zu entries: at most %d are accepted.", n,
                          EPD_OAI_MAX_BIAS);
        return EPD_ERR_INVALID_PARAM;
    }
    if (n == 0) {
        return EPD_OK;
    }
    req->bias_ids = epd_calloc(n, sizeof(*req->bias_ids));
    req->bias_values = epd_calloc(n, sizeof(*req->bias_values));
    if (req->bias_ids == NULL || req->bias_values == NULL) {
        epd_oai_sampling_oom(err);
        return EPD_ERR_NO_MEMORY;
    }
    json_object_foreach(v, key, val)
    {
        char *end = NULL;
        unsigned long long id;
        double d;

        errno = 0;
        id = strtoull(key, &end, 10);
        if (key[0] < '0' || key[0] > '9' || end == key || *end != '\0' || errno != 0 ||
            id > UINT32_MAX) {
            epd_oai_error_set(err, 400, "logit_bias", NULL,
                              "Invalid key in 'logit_bias': '%.40s' is not a token id.", key);
            return EPD_ERR_INVALID_PARAM;
        }
        if (!json_is_number(val)) {
            epd_oai_error_set(err, 400, "logit_bias", NULL,
                              "Invalid value in 'logit_bias' for token %llu: expected a number.",
                              id);
            return EPD_ERR_INVALID_PARAM;
        }
        d = json_number_value(val);
        /* OpenAI's rule: the value is clamped to [-100, 100] (1e300 too;
         * jansson refuses what is not a finite number) */
        d = d < -100.0 ? -100.0 : d > 100.0 ? 100.0 : d;
        req->bias_ids[req->n_bias] = (uint32_t)id;
        req->bias_values[req->n_bias] = (float)d;
        req->n_bias++;
    }
    return EPD_OK;
}

static epd_status_t epd_oai_stop_token_ids(json_t *root, epd_oai_request_t *req,
                                           epd_oai_error_t *err)
{
    json_t *v = json_object_get(root, "stop_token_ids");
    size_t n;

    if (v == NULL || json_is_null(v)) {
        return EPD_OK;
    }
    if (!json_is_array(v)) {
        epd_oai_error_set(err, 400, "stop_token_ids", NULL,
                          "Invalid type for 'stop_token_ids': expected an array of token ids.");
        return EPD_ERR_INVALID_PARAM;
    }
    n = json_array_size(v);
    if (n > EPD_OAI_MAX_STOP_IDS) {
        epd_oai_error_set(err, 400, "stop_token_ids", NULL,
                          "'stop_token_ids' holds %zu ids: at most %d are accepted.", n,
                          EPD_OAI_MAX_STOP_IDS);
        return EPD_ERR_INVALID_PARAM;
    }
    if (n == 0) {
        return EPD_OK;
    }
    req->stop_token_ids = epd_calloc(n, sizeof(*req->stop_token_ids));
    if (req->stop_token_ids == NULL) {
        epd_oai_sampling_oom(err);
        return EPD_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(v, i);

        if (!json_is_integer(e) || json_integer_value(e) < 0 ||
            json_integer_value(e) > (json_int_t)UINT32_MAX) {
            epd_oai_error_set(err, 400, "stop_token_ids", NULL,
                              "'stop_token_ids[%zu]' must be a token id (an integer >= 0).", i);
            return EPD_ERR_INVALID_PARAM;
        }
        req->stop_token_ids[i] = (uint32_t)json_integer_value(e);
    }
    req->n_stop_token_ids = n;
    return EPD_OK;
}

/* completions: "logprobs": K (0..20: the token's and its K best);
 * chat: "logprobs": true, "top_logprobs": K (0..20; only with logprobs) */
static epd_status_t epd_oai_logprobs(json_t *root, epd_oai_request_t *req, epd_oai_error_t *err)
{
    json_t *lp = json_object_get(root, "logprobs");
    json_t *top = json_object_get(root, "top_logprobs");
    json_t *k = NULL;
    const char *kname = "logprobs";

    lp = json_is_null(lp) ? NULL : lp;
    top = json_is_null(top) ? NULL : top;
    if (req->kind == EPD_OAI_CHAT) {
        if (lp != NULL && !json_is_boolean(lp)) {
            epd_oai_error_set(err, 400, "logprobs", NULL,
                              "Invalid type for 'logprobs': expected a boolean.");
            return EPD_ERR_INVALID_PARAM;
        }
        req->want_logprobs = lp != NULL && json_is_true(lp);
        if (top != NULL && !req->want_logprobs) {
            epd_oai_error_set(err, 400, "top_logprobs", NULL,
                              "'top_logprobs' is only allowed when 'logprobs' is true.");
            return EPD_ERR_INVALID_PARAM;
        }
        k = top;
        kname = "top_logprobs";
    } else if (lp != NULL) {
        req->want_logprobs = 1;
        k = lp;
    }
    if (k != NULL) {
        if (!json_is_integer(k) || json_integer_value(k) < 0 ||
            json_integer_value(k) > EPD_OAI_MAX_TOP_LOGPROBS) {
            epd_oai_error_set(err, 400, kname, NULL, "'%s' must be an integer from 0 to %d.", kname,
                              EPD_OAI_MAX_TOP_LOGPROBS);
            return EPD_ERR_INVALID_PARAM;
        }
        req->top_logprobs = (uint32_t)json_integer_value(k);
    }
    return EPD_OK;
}

epd_status_t epd__oai_parse_sampling(json_t *root, epd_oai_request_t *req, epd_oai_error_t *err)
{
    json_t *v;
    epd_status_t st;

    if ((st = epd_oai_penalty(root, "presence_penalty", -2.0, 0, 2.0, &req->presence_penalty,
                              err)) != EPD_OK ||
        (st = epd_oai_penalty(root, "frequency_penalty", -2.0, 0, 2.0, &req->frequency_penalty,
                              err)) != EPD_OK ||
        (st = epd_oai_penalty(root, "repetition_penalty", 0.0, 1, 2.0, &req->repetition_penalty,
                              err)) != EPD_OK ||
        (st = epd_oai_logit_bias(root, req, err)) != EPD_OK ||
        (st = epd_oai_stop_token_ids(root, req, err)) != EPD_OK) {
        return st;
    }
    if ((st = epd_oai_logprobs(root, req, err)) != EPD_OK) {
        return st;
    }
    v = json_object_get(root, "min_tokens");
    if (v != NULL && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 0) {
            epd_oai_error_set(err, 400, "min_tokens", NULL,
                              "'min_tokens' must be an integer >= 0.");
            return EPD_ERR_INVALID_PARAM;
        }
        req->min_tokens = (int64_t)json_integer_value(v);
    }
    v = json_object_get(root, "ignore_eos");
    if (v != NULL && !json_is_null(v)) {
        if (!json_is_boolean(v)) {
            epd_oai_error_set(err, 400, "ignore_eos", NULL,
                              "Invalid type for 'ignore_eos': expected a boolean.");
            return EPD_ERR_INVALID_PARAM;
        }
        req->ignore_eos = json_is_true(v);
    }
    return EPD_OK;
}

epd_status_t epd_oai_check_sampling(const epd_oai_request_t *req, uint32_t vocab, int64_t max_new,
                                    epd_oai_error_t *err)
{
    for (size_t i = 0; i < req->n_bias; i++) {
        if (req->bias_ids[i] >= vocab) {
            epd_oai_error_set(err, 400, "logit_bias", NULL,
                              "Invalid key in 'logit_bias': token %" PRIu32
                              " is outside the vocabulary (%" PRIu32 " tokens).",
                              req->bias_ids[i], vocab);
            return EPD_ERR_INVALID_PARAM;
        }
    }
    for (size_t i = 0; i < req->n_stop_token_ids; i++) {
        if (req->stop_token_ids[i] >= vocab) {
            epd_oai_error_set(err, 400, "stop_token_ids", NULL,
                              "'stop_token_ids[%zu]' is %" PRIu32
                              ", outside the vocabulary (%" PRIu32 " tokens).",
                              i, req->stop_token_ids[i], vocab);
            return EPD_ERR_INVALID_PARAM;
        }
    }
    if (req->min_tokens > max_new) {
        epd_oai_error_set(err, 400, "min_tokens", NULL,
                          "'min_tokens' (%" PRId64 ") must not exceed the tokens to generate "
                          "(%" PRId64 ").",
                          req->min_tokens, max_new);
        return EPD_ERR_INVALID_PARAM;
    }
    return EPD_OK;
}
