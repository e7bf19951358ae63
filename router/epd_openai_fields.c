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
#include <stdio.h>
#include <string.h>

#include <jansson.h>

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
    {"presence_penalty", EPD_OAI_K_ALL, EPD_OAI_F_NOOP, EPD_OAI_NOOP_ZERO, "penalties"},
    {"frequency_penalty", EPD_OAI_K_ALL, EPD_OAI_F_NOOP, EPD_OAI_NOOP_ZERO, "penalties"},
    {"repetition_penalty", EPD_OAI_K_ALL, EPD_OAI_F_NOOP, EPD_OAI_NOOP_ONE, "penalties"},
    {"logit_bias", EPD_OAI_K_ALL, EPD_OAI_F_NOOP, EPD_OAI_NOOP_EMPTY, "logit bias"},
    {"min_tokens", EPD_OAI_K_ALL, EPD_OAI_F_NOOP, EPD_OAI_NOOP_ZERO, "min_tokens"},
    {"ignore_eos", EPD_OAI_K_ALL, EPD_OAI_F_NOOP, EPD_OAI_NOOP_FALSE, "ignore_eos"},
    {"stop_token_ids", EPD_OAI_K_ALL, EPD_OAI_F_NOOP, EPD_OAI_NOOP_EMPTY, "stop token ids"},
    {"min_p", EPD_OAI_K_ALL, EPD_OAI_F_NOOP, EPD_OAI_NOOP_ZERO, "min_p sampling"},
    {"best_of", EPD_OAI_K_C, EPD_OAI_F_NOOP, EPD_OAI_NOOP_ONE, "best_of"},
    {"echo", EPD_OAI_K_ALL, EPD_OAI_F_NOOP, EPD_OAI_NOOP_FALSE, "echo"},
    {"logprobs", EPD_OAI_K_CH, EPD_OAI_F_NOOP, EPD_OAI_NOOP_FALSE, "logprobs"},
    {"top_logprobs", EPD_OAI_K_CH, EPD_OAI_F_NOOP, EPD_OAI_NOOP_ZERO, "logprobs"},
    {"suffix", EPD_OAI_K_C, EPD_OAI_F_NOOP, EPD_OAI_NOOP_EMPTY_STR, "suffixes (insertion)"},
    {"response_format", EPD_OAI_K_ALL, EPD_OAI_F_NOOP, EPD_OAI_NOOP_FORMAT_TEXT,
     "structured output (only {\"type\": \"text\"})"},
    {"tools", EPD_OAI_K_CH, EPD_OAI_F_NOOP, EPD_OAI_NOOP_EMPTY, "tool calling"},
    {"tool_choice", EPD_OAI_K_CH, EPD_OAI_F_NOOP, EPD_OAI_NOOP_STR_NONE, "tool calling"},
    {"functions", EPD_OAI_K_CH, EPD_OAI_F_NOOP, EPD_OAI_NOOP_EMPTY, "function calling"},
    {"function_call", EPD_OAI_K_CH, EPD_OAI_F_NOOP, EPD_OAI_NOOP_STR_NONE, "function calling"},
    {"modalities", EPD_OAI_K_CH, EPD_OAI_F_NOOP, EPD_OAI_NOOP_TEXT_ONLY, "output modalities "
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
    {"logprobs", EPD_OAI_K_C, EPD_OAI_F_REFUSED, EPD_OAI_NOOP_NONE, "logprobs"},
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
