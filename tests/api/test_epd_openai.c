/*
 * Tests of api/epd_openai_*.c: every refusal has its status, type, param
 * and code; valid bodies parse to the right fields; the chat template is
 * exact; every encoder's output parses back with jansson and has the
 * fields the official SDKs read; a stream never splits a UTF-8 character
 * across events and its text equals epd_utf8_repair of all bytes at once;
 * failed allocations leave nothing behind; the JSON limits (depth,
 * elements, string bytes) refuse with 400 naming the limit before jansson
 * parses, exactly at their bounds, and count nothing inside strings.
 */
#include "epd_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "epd_alloc.h"
#include "epd_openai.h"
#include "epd_utf8.h"

static const char *const models[] = {"tiny", "other"};
#define N_MODELS 2
#define CONTEXT 1024

/* ------------------------------------------------------------ refusals */

typedef struct {
    epd_oai_kind_t kind;
    const char *body;
    int status;
    const char *param; /* NULL: JSON null */
    const char *code;  /* NULL: JSON null */
    const char *in_message;
} refusal_t;

#define C EPD_OAI_COMPLETION
#define H EPD_OAI_CHAT

static const refusal_t refusals[] = {
    {C, "", 400, NULL, NULL, "could not parse the JSON body"},
    {C, "{\"model\": \"tiny\",", 400, NULL, NULL, "could not parse the JSON body"},
    {C, "[1, 2]", 400, NULL, NULL, "must be a JSON object"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"caf\xe9\"}", 400, NULL, NULL, "not valid UTF-8"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"prompt\": \"b\"}", 400, NULL, NULL,
     "duplicate"},
    {C, "{\"prompt\": \"hi\"}", 400, "model", NULL, "Missing required parameter: 'model'"},
    {C, "{\"model\": null, \"prompt\": \"hi\"}", 400, "model", NULL, "Missing required"},
    {C, "{\"model\": 7, \"prompt\": \"hi\"}", 400, "model", NULL, "Invalid type for 'model'"},
    {C, "{\"model\": \"gpt-4\", \"prompt\": \"hi\"}", 404, "model", "model_not_found",
     "The model 'gpt-4' does not exist"},
    {C, "{\"model\": \"tiny\"}", 400, "prompt", NULL, "Missing required parameter: 'prompt'"},
    {C, "{\"model\": \"tiny\", \"prompt\": 12}", 400, "prompt", NULL, "Invalid type for 'prompt'"},
    {C, "{\"model\": \"tiny\", \"prompt\": [\"a\", {\"b\": 1}]}", 400, "prompt", NULL,
     "'prompt[1]' must be a string or a non-empty array of token ids"},
    {C, "{\"model\": \"tiny\", \"prompt\": [1, \"a\"]}", 400, "prompt", NULL,
     "'prompt[1]' must be a token id"},
    {C, "{\"model\": \"tiny\", \"prompt\": [[1], []]}", 400, "prompt", NULL, "non-empty"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"max_tokens\": 0}", 400, "max_tokens", NULL,
     "at least 1"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"max_tokens\": -5}", 400, "max_tokens", NULL,
     "at least 1"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"max_tokens\": 2.5}", 400, "max_tokens", NULL,
     "expected an integer, but got a decimal"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"max_tokens\": 1025}", 400, "max_tokens",
     "context_length_exceeded", "maximum context length is 1024"},
    /* jansson refuses \u0000 naming its JSON_ALLOW_NUL flag: the message
     * says it in the client's terms (and names no flag: test_refusals) */
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\\u0000b\"}", 400, NULL, NULL,
     "NUL characters are not allowed in strings"},
    {H, "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"\\u0000\"}]}",
     400, NULL, NULL, "NUL characters are not allowed in strings"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"temperature\": \"hot\"}", 400, "temperature",
     NULL, "Invalid type for 'temperature'"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"temperature\": 2.5}", 400, "temperature", NULL,
     "must be in"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"top_p\": 0}", 400, "top_p", NULL, "must be in"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"top_p\": 1.5}", 400, "top_p", NULL,
     "must be in"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"top_k\": -2}", 400, "top_k", NULL, "top_k"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"top_k\": \"5\"}", 400, "top_k", NULL,
     "Invalid type"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"seed\": 1.5}", 400, "seed", NULL,
     "Invalid type"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"n\": 17}", 400, "n", NULL,
     "'n' must be an integer from 1 to 16"},
    /* nothing silently ignored (epd_openai_fields.c): an unknown key, a
     * refused feature, a no-op-only field at another value */
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"bogus_knob\": 1}", 400, "bogus_knob", NULL,
     "Unrecognized request argument supplied: bogus_knob"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
     " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}",
     400, "tools", "unsupported_parameter", "tool calling"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
     " \"tool_choice\": \"auto\"}",
     400, "tool_choice", "unsupported_parameter", "Unsupported parameter: 'tool_choice'"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
     " \"functions\": [{\"name\": \"f\"}]}",
     400, "functions", "unsupported_parameter", "function calling"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
     " \"function_call\": \"auto\"}",
     400, "function_call", "unsupported_parameter", "function calling"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
     " \"response_format\": {\"type\": \"json_object\"}}",
     400, "response_format", "unsupported_parameter", "structured output"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"suffix\": \"end\"}", 400, "suffix",
     "unsupported_parameter", "suffix"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
     " \"audio\": {\"voice\": \"alloy\"}}",
     400, "audio", "unsupported_parameter", "audio"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
     " \"modalities\": [\"text\", \"audio\"]}",
     400, "modalities", "unsupported_parameter", "modalities"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
     " \"prediction\": {\"type\": \"content\", \"content\": \"x\"}}",
     400, "prediction", "unsupported_parameter", "predicted"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"echo\": true, \"logprobs\": 1}", 400,
     "echo", "unsupported_parameter", "echo"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"best_of\": 3}", 400, "best_of",
     "unsupported_parameter", "best_of"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"guided_json\": {}}", 400, "guided_json",
     "unsupported_parameter", "guided decoding"},
    /* the sampling fields (epd_openai_fields.c) */
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"presence_penalty\": 2.5}", 400,
     "presence_penalty", NULL, "must be in [-2, 2]"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"frequency_penalty\": \"x\"}", 400,
     "frequency_penalty", NULL, "Invalid type"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"repetition_penalty\": 0}", 400,
     "repetition_penalty", NULL, "must be in (0, 2]"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"logit_bias\": {\"abc\": 1}}", 400, "logit_bias",
     NULL, "not a token id"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"logit_bias\": {\"-1\": 1}}", 400, "logit_bias",
     NULL, "not a token id"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"logit_bias\": {\"99999999999\": 1}}", 400,
     "logit_bias", NULL, "not a token id"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"logit_bias\": {\"5\": \"up\"}}", 400,
     "logit_bias", NULL, "expected a number"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"logit_bias\": [1]}", 400, "logit_bias", NULL,
     "Invalid type"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"min_tokens\": -1}", 400, "min_tokens", NULL,
     "integer >= 0"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"ignore_eos\": 1}", 400, "ignore_eos", NULL,
     "expected a boolean"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"stop_token_ids\": [1, -2]}", 400,
     "stop_token_ids", NULL, "stop_token_ids[1]"},
    /* chat-only keys are unknown on /v1/completions */
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"messages\": []}", 400, "messages", NULL,
     "Unrecognized request argument supplied: messages"},
    {C,
     "{\"model\": \"tiny\", \"prompt\": \"a\", \"max_tokens\": 3,"
     " \"max_completion_tokens\": 4}",
     400, "max_completion_tokens", NULL, "differ"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"n\": \"1\"}", 400, "n", NULL, "Invalid type"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"stream\": \"yes\"}", 400, "stream", NULL,
     "expected a boolean"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"stream_options\": {\"include_usage\": true}}",
     400, "stream_options", NULL, "only allowed when 'stream' is true"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"stream\": true, \"stream_options\": 3}", 400,
     "stream_options", NULL, "Invalid type"},
    {C,
     "{\"model\": \"tiny\", \"prompt\": \"a\", \"stream\": true, \"stream_options\": "
     "{\"include_usage\": 1}}",
     400, "stream_options.include_usage", NULL, "expected a boolean"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"stop\": 5}", 400, "stop", NULL, "Invalid type"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"stop\": [\"x\", \"\"]}", 400, "stop", NULL,
     "must not be empty"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400,
     "stop", NULL, "at most 4"},
    {H, "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}], "
        "\"add_generation_prompt\": 1}", 400, "add_generation_prompt", NULL, "Invalid type"},
    {H, "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}], "
        "\"chat_template_kwargs\": []}", 400, "chat_template_kwargs", NULL, "Invalid type"},
    {H, "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}], "
        "\"chat_template_kwargs\": {\"enable_thinking\": \"no\"}}", 400,
     "chat_template_kwargs.enable_thinking", NULL, "Invalid type"},
    {C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"stop\": [\"a\", 1]}", 400, "stop", NULL,
     "Invalid type"},
    {H, "{\"model\": \"tiny\"}", 400, "messages", NULL, "Missing required parameter: 'messages'"},
    {H, "{\"model\": \"tiny\", \"messages\": \"hi\"}", 400, "messages", NULL, "Invalid type"},
    {H, "{\"model\": \"tiny\", \"messages\": []}", 400, "messages", NULL, "at least one"},
    {H, "{\"model\": \"tiny\", \"messages\": [5]}", 400, "messages[0]", NULL, "Invalid type"},
    {H, "{\"model\": \"tiny\", \"messages\": [{\"content\": \"x\"}]}", 400, "messages[0].role",
     NULL, "Missing required"},
    {H, "{\"model\": \"tiny\", \"messages\": [{\"role\": 1, \"content\": \"x\"}]}", 400,
     "messages[0].role", NULL, "Invalid type"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}, "
     "{\"role\": \"tool\", \"content\": \"x\"}]}",
     400, "messages[1].role", NULL, "expected one of"},
    {H, "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\"}]}", 400, "messages[0].content",
     NULL, "Missing required"},
    {H, "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": 4}]}", 400,
     "messages[0].content", NULL, "Invalid type"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": "
     "[{\"type\": \"input_audio\", \"input_audio\": {}}]}]}",
     400, "messages[0].content[0].type", NULL, "only \"text\" and \"image_url\""},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
     "\"epd_encode\": \"remote\"}",
     400, "epd_encode", NULL, "must be \"auto\" or \"local\""},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
     "\"cache_salt\": \"\"}",
     400, "cache_salt", NULL, "1 to 256 bytes"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
     "\"cache_salt\": 7}",
     400, "cache_salt", NULL, "1 to 256 bytes"},
    /* images: data: URLs of base64 images only */
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": "
     "[{\"type\": \"image_url\", \"image_url\": {\"url\": \"x\"}}]}]}",
     400, "messages[0].content[0].image_url.url", "invalid_image_url", "must be a data: URL"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": "
     "[{\"type\": \"image_url\", \"image_url\": {\"url\": \"https://x.org/a.png\"}}]}]}",
     400, "messages[0].content[0].image_url.url", "invalid_image_url", "does not fetch images"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": "
     "[{\"type\": \"image_url\", \"image_url\": \"HTTP://x.org/a.png\"}]}]}",
     400, "messages[0].content[0].image_url.url", "invalid_image_url", "remote URL"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": "
     "[{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:text/plain;base64,aGk=\"}}]}]}",
     400, "messages[0].content[0].image_url.url", "invalid_image_url", "of an image"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": "
     "[{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png,aGk=\"}}]}]}",
     400, "messages[0].content[0].image_url.url", "invalid_image_url", "base64 data: URL"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": "
     "[{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,\"}}]}]}",
     400, "messages[0].content[0].image_url.url", "invalid_image_url", "no image data"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": "
     "[{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"image_url\", "
     "\"image_url\": {\"url\": \"data:image/png;base64,aG!k\"}}]}]}",
     400, "messages[0].content[1].image_url.url", "invalid_image_url", "not valid base64"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": "
     "[{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,aGk==\"}}]}]}",
     400, "messages[0].content[0].image_url.url", "invalid_image_url", "not valid base64"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": "
     "[{\"type\": \"image_url\", \"image_url\": {}}]}]}",
     400, "messages[0].content[0].image_url.url", NULL, "Missing required"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": "
     "[{\"type\": \"image_url\", \"image_url\": {\"url\": 5}}]}]}",
     400, "messages[0].content[0].image_url.url", NULL, "Invalid type"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": "
     "[{\"type\": \"text\", \"text\": 4}]}]}",
     400, "messages[0].content[0].text", NULL, "Invalid type"},
    {H,
     "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
     "\"max_completion_tokens\": 0}",
     400, "max_completion_tokens", NULL, "at least 1"},
    {H, "{\"model\": \"nope\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", 404,
     "model", "model_not_found", "does not exist"},
};

/* Checks the error JSON shape and values. */
static void check_error_json(const epd_oai_error_t *err, const refusal_t *r)
{
    epd_oai_buf_t buf = EPD_OAI_BUF_INIT;
    json_error_t jerr;
    json_t *root;
    json_t *e;
    json_t *param;
    json_t *code;

    assert_int_equal(epd_oai_error_encode(err, &buf), EPD_OK);
    root = json_loadb(buf.data, buf.len, 0, &jerr);
    assert_non_null(root);
    e = json_object_get(root, "error");
    assert_true(json_is_object(e));
    assert_true(json_is_string(json_object_get(e, "message")));
    assert_string_equal(json_string_value(json_object_get(e, "type")), "invalid_request_error");
    param = json_object_get(e, "param");
    code = json_object_get(e, "code");
    assert_non_null(param);
    assert_non_null(code);
    if (r->param == NULL) {
        assert_true(json_is_null(param));
    } else {
        assert_string_equal(json_string_value(param), r->param);
    }
    if (r->code == NULL) {
        assert_true(json_is_null(code));
    } else {
        assert_string_equal(json_string_value(code), r->code);
    }
    json_decref(root);
    epd_oai_buf_cleanup(&buf);
}

static void test_refusals(void **state)
{
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(refusals) / sizeof(refusals[0]); i++) {
        const refusal_t *r = &refusals[i];
        epd_oai_request_t *req = (epd_oai_request_t *)0x1;
        epd_oai_error_t err;
        epd_status_t st;

        memset(&err, 0, sizeof(err));
        st = epd_oai_request_parse(r->kind, r->body, strlen(r->body), models, N_MODELS, CONTEXT,
                                   &req, &err);
        if (st != EPD_ERR_INVALID_PARAM || err.http_status != r->status ||
            strstr(err.message, r->in_message) == NULL ||
            strcmp(err.param, r->param != NULL ? r->param : "") != 0 ||
            strcmp(err.code, r->code != NULL ? r->code : "") != 0) {
            print_error("case %zu body=%s\n  got status=%d param='%s' code='%s' message='%s'\n", i,
                        r->body, err.http_status, err.param, err.code, err.message);
        }
        assert_int_equal(st, EPD_ERR_INVALID_PARAM);
        assert_ptr_equal(req, (epd_oai_request_t *)0x1); /* untouched */
        assert_int_equal(err.http_status, r->status);
        assert_string_equal(err.param, r->param != NULL ? r->param : "");
        assert_string_equal(err.code, r->code != NULL ? r->code : "");
        assert_non_null(strstr(err.message, r->in_message));
        assert_null(strstr(err.message, "JSON_")); /* never a library's flag */
        check_error_json(&err, r);
    }
}

/* ------------------------------------------------------------ valid requests */

static epd_oai_request_t *parse_ok(epd_oai_kind_t kind, const char *body)
{
    epd_oai_request_t *req = NULL;
    epd_oai_error_t err;
    epd_status_t st;

    st = epd_oai_request_parse(kind, body, strlen(body), models, N_MODELS, CONTEXT, &req, &err);
    if (st != EPD_OK) {
        print_error("refused: %s (param '%s')\n", err.message, err.param);
    }
    assert_int_equal(st, EPD_OK);
    assert_non_null(req);
    return req;
}

static void test_completion_fields(void **state)
{
    epd_oai_request_t *req;

    (void)state;
    req = parse_ok(
        C, "{\"model\": \"other\", \"prompt\": \"Hello\\nworld \\u00e9\", \"max_tokens\": 7,"
           " \"temperature\": 0.5, \"top_p\": 0.9, \"top_k\": 40, \"seed\": -3,"
           " \"stream\": true, \"stream_options\": {\"include_usage\": true},"
           " \"stop\": [\"\\n\\n\", \"END\"], \"n\": 1, \"user\": \"ignored\","
           " \"frequency_penalty\": 0}");
    assert_int_equal(req->kind, C);
    assert_string_equal(req->model, "other");
    assert_string_equal(req->prompt, "Hello\nworld \xc3\xa9");
    assert_int_equal(req->prompt_len, strlen("Hello\nworld \xc3\xa9"));
    assert_true(req->has_max_tokens);
    assert_int_equal(req->max_tokens, 7);
    assert_true(req->temperature == 0.5);
    assert_true(req->top_p == 0.9);
    assert_int_equal(req->top_k, 40);
    assert_true(req->has_seed);
    assert_int_equal(req->seed, -3);
    assert_true(req->stream);
    assert_true(req->include_usage);
    assert_int_equal(req->n_stop, 2);
    assert_string_equal(req->stop[0], "\n\n");
    assert_string_equal(req->stop[1], "END");
    epd_oai_request_destroy(req);

    /* Defaults; nulls count as absent; an array of one string; a single stop. */
    req = parse_ok(C, "{\"model\": \"tiny\", \"prompt\": [\"x\"], \"max_tokens\": null,"
                      " \"temperature\": null, \"stream\": false, \"stop\": \"###\", \"top_k\": -1,"
                      " \"stream_options\": null}");
    assert_string_equal(req->prompt, "x");
    assert_false(req->has_max_tokens);
    assert_true(req->temperature == 1.0);
    assert_true(req->top_p == 1.0);
    assert_int_equal(req->top_k, 0);
    assert_false(req->has_seed);
    assert_false(req->stream);
    assert_false(req->include_usage);
    assert_int_equal(req->n_stop, 1);
    assert_string_equal(req->stop[0], "###");
    epd_oai_request_destroy(req);

    /* Accepted without effect, and no-op values of unimplemented fields. */
    req = parse_ok(H,
                   "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
                   " \"user\": \"u\", \"metadata\": {\"k\": \"v\"}, \"store\": false,"
                   " \"service_tier\": \"auto\", \"parallel_tool_calls\": true,"
                   " \"tools\": [], \"tool_choice\": \"none\", \"logit_bias\": {},"
                   " \"response_format\": {\"type\": \"text\"}, \"modalities\": [\"text\"],"
                   " \"logprobs\": false, \"presence_penalty\": 0, \"repetition_penalty\": 1,"
                   " \"audio\": null, \"max_completion_tokens\": 5, \"max_tokens\": 5}");
    assert_int_equal(req->max_tokens, 5);
    epd_oai_request_destroy(req);
    req = parse_ok(C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"max_completion_tokens\": 9,"
                      " \"echo\": false, \"best_of\": 1, \"suffix\": \"\"}");
    assert_int_equal(req->max_tokens, 9);
    epd_oai_request_destroy(req);

    /* The sampling fields: values kept, logit_bias clamped to [-100, 100]. */
    req = parse_ok(C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"presence_penalty\": -1.5,"
                      " \"frequency_penalty\": 2, \"repetition_penalty\": 1.2,"
                      " \"logit_bias\": {\"7\": 1e300, \"0\": -101, \"12\": 3.5},"
                      " \"min_tokens\": 4, \"ignore_eos\": true, \"stop_token_ids\": [3, 9]}");
    assert_true(req->presence_penalty == -1.5);
    assert_true(req->frequency_penalty == 2.0);
    assert_true(req->repetition_penalty == 1.2);
    assert_int_equal(req->n_bias, 3);
    assert_int_equal(req->bias_ids[0], 7);
    assert_true(req->bias_values[0] == 100.0f);
    assert_int_equal(req->bias_ids[1], 0);
    assert_true(req->bias_values[1] == -100.0f);
    assert_true(req->bias_values[2] == 3.5f);
    assert_int_equal(req->min_tokens, 4);
    assert_true(req->ignore_eos);
    assert_int_equal(req->n_stop_token_ids, 2);
    assert_int_equal(req->stop_token_ids[1], 9);
    {
        epd_oai_error_t err;

        assert_int_equal(epd_oai_check_sampling(req, 258, 16, &err), EPD_OK);
        assert_int_equal(epd_oai_check_sampling(req, 12, 16, &err), EPD_ERR_INVALID_PARAM);
        assert_string_equal(err.param, "logit_bias"); /* 12 >= 12 */
        assert_int_equal(epd_oai_check_sampling(req, 258, 3, &err), EPD_ERR_INVALID_PARAM);
        assert_string_equal(err.param, "min_tokens");
    }
    epd_oai_request_destroy(req);
    req = parse_ok(C, "{\"model\": \"tiny\", \"prompt\": \"a\"}");
    assert_true(req->repetition_penalty == 1.0);
    assert_int_equal(req->n_bias, 0);
    epd_oai_request_destroy(req);

    /* A prompt of token ids, bare or as the one element of a list. */
    req = parse_ok(C, "{\"model\": \"tiny\", \"prompt\": [256, 72, 105]}");
    assert_int_equal(req->n_prompt_ids, 3);
    assert_int_equal(req->prompt_ids[0], 256);
    assert_int_equal(req->prompt_ids[2], 105);
    assert_int_equal(req->prompt_len, 0);
    epd_oai_request_destroy(req);
    req = parse_ok(C, "{\"model\": \"tiny\", \"prompt\": [[7]]}");
    assert_int_equal(req->n_prompt_ids, 1);
    epd_oai_request_destroy(req);

    /* An integer temperature is a number; max_tokens == context is allowed. */
    req = parse_ok(
        C, "{\"model\": \"tiny\", \"prompt\": \"\", \"temperature\": 0, \"max_tokens\": 1024}");
    assert_true(req->temperature == 0.0);
    assert_int_equal(req->max_tokens, 1024);
    assert_int_equal(req->prompt_len, 0);
    epd_oai_request_destroy(req);
}

static void test_chat_template(void **state)
{
    epd_oai_request_t *req;

    (void)state;
    req = parse_ok(H, "{\"model\": \"tiny\", \"messages\": ["
                      "{\"role\": \"system\", \"content\": \"Be brief.\"},"
                      "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hi \"},"
                      " {\"type\": \"text\", \"text\": \"there\"}], \"name\": \"bob\"},"
                      "{\"role\": \"assistant\", \"content\": \"Hello!\"},"
                      "{\"role\": \"user\", \"content\": \"\"}],"
                      " \"max_completion_tokens\": 9}");
    assert_int_equal(req->kind, H);
    assert_string_equal(req->prompt, "<|system|>\nBe brief.\n<|user|>\nHi there\n"
                                     "<|assistant|>\nHello!\n<|user|>\n\n<|assistant|>\n");
    assert_int_equal(req->prompt_len, strlen(req->prompt));
    assert_int_equal(req->max_tokens, 9); /* (with max_tokens too, both must agree) */
    /* each message's role and content, for a model's own template */
    assert_int_equal(req->n_msgs, 4);
    {
        static const char *const roles[] = {"system", "user", "assistant", "user"};
        static const char *const contents[] = {"Be brief.", "Hi there", "Hello!", ""};

        for (size_t i = 0; i < 4; i++) {
            assert_int_equal(req->msgs[i].role_len, strlen(roles[i]));
            assert_memory_equal(req->prompt + req->msgs[i].role_off, roles[i], strlen(roles[i]));
            assert_int_equal(req->msgs[i].content_len, strlen(contents[i]));
            assert_memory_equal(req->prompt + req->msgs[i].content_off, contents[i],
                                strlen(contents[i]));
        }
    }
    assert_true(req->add_generation_prompt); /* the defaults */
    assert_true(req->enable_thinking);
    epd_oai_request_destroy(req);

    req = parse_ok(
        H, "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}");
    assert_string_equal(req->prompt, "<|user|>\nq\n<|assistant|>\n");
    assert_false(req->has_max_tokens);
    epd_oai_request_destroy(req);

    /* vLLM's extensions for the template */
    req = parse_ok(H, "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": "
                      "\"q\"}], \"add_generation_prompt\": false, \"chat_template_kwargs\": "
                      "{\"enable_thinking\": false, \"other\": 1}}");
    assert_false(req->add_generation_prompt);
    assert_false(req->enable_thinking);
    epd_oai_request_destroy(req);
    req = parse_ok(H, "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": "
                      "\"q\"}], \"chat_template_kwargs\": null}");
    assert_true(req->enable_thinking);
    epd_oai_request_destroy(req);
}

/* Image parts: decoded from their data: URLs, in prompt order, each at
 * the byte offset of the rendered template where it stands. */
static void test_chat_images(void **state)
{
    epd_oai_request_t *req;
    const char *before = "<|user|>\nLook: ";

    (void)state;
    /* "hi" = aGk=, "abc" = YWJj (unpadded form accepted too: YWI for "ab") */
    req = parse_ok(H, "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": ["
                      "{\"type\": \"text\", \"text\": \"Look: \"},"
                      "{\"type\": \"image_url\", \"image_url\": {\"url\": "
                      "\"data:image/png;base64,aGk=\", \"detail\": \"low\"}},"
                      "{\"type\": \"text\", \"text\": \" and \"},"
                      "{\"type\": \"image_url\", \"image_url\": \"DATA:image/jpeg;BASE64,YWJj\"}]},"
                      "{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", "
                      "\"image_url\": {\"url\": \"data:image/png;base64,YWI\"}}]}]}");
    assert_string_equal(req->prompt, "<|user|>\nLook:  and \n<|user|>\n\n<|assistant|>\n");
    assert_int_equal(req->n_images, 3);
    assert_int_equal(req->images[0].len, 2);
    assert_memory_equal(req->images[0].data, "hi", 2);
    assert_int_equal(req->images[0].prompt_offset, strlen(before));
    assert_int_equal(req->images[0].message, 0);
    assert_int_equal(req->images[0].part, 1);
    assert_int_equal(req->images[1].len, 3);
    assert_memory_equal(req->images[1].data, "abc", 3);
    assert_int_equal(req->images[1].prompt_offset, strlen("<|user|>\nLook:  and "));
    assert_int_equal(req->images[1].part, 3);
    assert_int_equal(req->images[2].len, 2);
    assert_memory_equal(req->images[2].data, "ab", 2);
    assert_int_equal(req->images[2].prompt_offset, strlen("<|user|>\nLook:  and \n<|user|>\n"));
    assert_int_equal(req->images[2].message, 1);
    assert_false(req->encode_local);
    epd_oai_request_destroy(req);
    req = parse_ok(H, "{\"model\": \"tiny\", \"epd_encode\": \"local\", \"messages\": "
                      "[{\"role\": \"user\", \"content\": \"q\"}]}");
    assert_true(req->encode_local);
    assert_null(req->cache_salt);
    epd_oai_request_destroy(req);
    req = parse_ok(H, "{\"model\": \"tiny\", \"cache_salt\": \"tenant-7\", \"messages\": "
                      "[{\"role\": \"user\", \"content\": \"q\"}]}");
    assert_string_equal(req->cache_salt, "tenant-7");
    epd_oai_request_destroy(req);
    /* more than EPD_OAI_MAX_IMAGES */
    {
        char *body = malloc(200 + (EPD_OAI_MAX_IMAGES + 1) * 80);
        size_t n = 0;
        epd_oai_error_t err;

        assert_non_null(body);
        n += (size_t)sprintf(body + n, "{\"model\": \"tiny\", \"messages\": [{\"role\": "
                                       "\"user\", \"content\": [");
        for (int i = 0; i <= EPD_OAI_MAX_IMAGES; i++) {
            n += (size_t)sprintf(body + n, "%s{\"type\": \"image_url\", \"image_url\": "
                                           "\"data:image/png;base64,aGk=\"}",
                                 i ? "," : "");
        }
        n += (size_t)sprintf(body + n, "]}]}");
        req = NULL;
        assert_int_equal(epd_oai_request_parse(H, body, n, models, N_MODELS, CONTEXT, &req, &err),
                         EPD_ERR_INVALID_PARAM);
        assert_null(req);
        assert_int_equal(err.http_status, 400);
        assert_non_null(strstr(err.message, "images in one request"));
        free(body);
    }
}

static void test_check_length(void **state)
{
    epd_oai_request_t *req;
    epd_oai_error_t err;
    int64_t max_new = -1;

    (void)state;
    req = parse_ok(C, "{\"model\": \"tiny\", \"prompt\": \"a\", \"max_tokens\": 100}");
    assert_int_equal(epd_oai_check_length(req, 924, 1024, &max_new, &err), EPD_OK);
    assert_int_equal(max_new, 100);
    max_new = -1;
    assert_int_equal(epd_oai_check_length(req, 925, 1024, &max_new, &err), EPD_ERR_INVALID_PARAM);
    assert_int_equal(max_new, -1);
    assert_int_equal(err.http_status, 400);
    assert_string_equal(err.param, "max_tokens");
    assert_string_equal(err.code, "context_length_exceeded");
    assert_non_null(strstr(err.message, "you requested 1025 tokens (925 in the prompt, 100 in the "
                                        "completion)"));
    epd_oai_request_destroy(req);

    /* Completions default 16, clamped to the room left. */
    req = parse_ok(C, "{\"model\": \"tiny\", \"prompt\": \"a\"}");
    assert_int_equal(epd_oai_check_length(req, 10, 1024, &max_new, &err), EPD_OK);
    assert_int_equal(max_new, 16);
    assert_int_equal(epd_oai_check_length(req, 1020, 1024, &max_new, &err), EPD_OK);
    assert_int_equal(max_new, 4);
    assert_int_equal(epd_oai_check_length(req, 1023, 1024, &max_new, &err), EPD_OK);
    assert_int_equal(max_new, 1);
    /* exactly at the context: no room, refused like a longer prompt */
    assert_int_equal(epd_oai_check_length(req, 1024, 1024, &max_new, &err), EPD_ERR_INVALID_PARAM);
    assert_string_equal(err.param, "prompt");
    assert_string_equal(err.code, "context_length_exceeded");
    assert_int_equal(epd_oai_check_length(req, 1025, 1024, &max_new, &err), EPD_ERR_INVALID_PARAM);
    assert_string_equal(err.code, "context_length_exceeded");
    epd_oai_request_destroy(req);

    /* Chat without max_tokens: all the room left. */
    req = parse_ok(
        H, "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}");
    assert_int_equal(epd_oai_check_length(req, 24, 1024, &max_new, &err), EPD_OK);
    assert_int_equal(max_new, 1000);
    assert_int_equal(epd_oai_check_length(req, 2000, 1024, &max_new, &err), EPD_ERR_INVALID_PARAM);
    assert_string_equal(err.param, "messages");
    assert_string_equal(err.code, "context_length_exceeded");
    assert_int_equal(err.http_status, 400);
    epd_oai_request_destroy(req);
}

/* ------------------------------------------------------------ encoders */

static json_t *load(const char *s, size_t n)
{
    json_error_t jerr;
    json_t *root = json_loadb(s, n, JSON_REJECT_DUPLICATES, &jerr);

    if (root == NULL) {
        print_error("bad JSON (%s): %.*s\n", jerr.text, (int)n, s);
    }
    assert_non_null(root);
    return root;
}

static const char *jstr(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);

    assert_true(json_is_string(v));
    return json_string_value(v);
}

static void test_response_encode(void **state)
{
    epd_oai_buf_t buf = EPD_OAI_BUF_INIT;
    char id[EPD_OAI_ID_MAX];
    json_t *root;
    json_t *choice;
    json_t *usage;
    const char raw[] = "ok \"quoted\"\n\t\x01 caf\xc3\xa9 bad\xff\xfe end\xe2\x82";

    (void)state;
    epd_oai_make_id(C, 0xabcdefULL, id);
    assert_string_equal(id, "cmpl-0000000000abcdef");
    assert_int_equal(epd_oai_response_encode(C, id, "tiny", 1700000000, raw, sizeof(raw) - 1,
                                             EPD_OAI_FINISH_LENGTH, 5, 7, -1, &buf),
                     EPD_OK);
    root = load(buf.data, buf.len);
    assert_string_equal(jstr(root, "id"), id);
    assert_string_equal(jstr(root, "object"), "text_completion");
    assert_int_equal(json_integer_value(json_object_get(root, "created")), 1700000000);
    assert_string_equal(jstr(root, "model"), "tiny");
    assert_int_equal(json_array_size(json_object_get(root, "choices")), 1);
    choice = json_array_get(json_object_get(root, "choices"), 0);
    assert_int_equal(json_integer_value(json_object_get(choice, "index")), 0);
    assert_string_equal(jstr(choice, "text"),
                        "ok \"quoted\"\n\t\x01 caf\xc3\xa9 bad\xef\xbf\xbd\xef\xbf\xbd end"
                        "\xef\xbf\xbd");
    assert_string_equal(jstr(choice, "finish_reason"), "length");
    usage = json_object_get(root, "usage");
    assert_int_equal(json_integer_value(json_object_get(usage, "prompt_tokens")), 5);
    assert_int_equal(json_integer_value(json_object_get(usage, "completion_tokens")), 7);
    assert_int_equal(json_integer_value(json_object_get(usage, "total_tokens")), 12);
    assert_null(json_object_get(usage, "prompt_tokens_details")); /* -1: unknown */
    json_decref(root);

    /* cached tokens known: usage.prompt_tokens_details.cached_tokens */
    epd_oai_buf_reset(&buf);
    assert_int_equal(
        epd_oai_response_encode(C, id, "tiny", 1, "x", 1, EPD_OAI_FINISH_STOP, 40, 1, 32, &buf),
        EPD_OK);
    root = load(buf.data, buf.len);
    usage = json_object_get(root, "usage");
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(usage, "prompt_tokens_details"), "cached_tokens")),
                     32);
    json_decref(root);

    epd_oai_buf_reset(&buf);
    epd_oai_make_id(H, 1, id);
    assert_string_equal(id, "chatcmpl-0000000000000001");
    assert_int_equal(
        epd_oai_response_encode(H, id, "tiny", 1, "Hi!", 3, EPD_OAI_FINISH_STOP, 3, 2, -1, &buf),
        EPD_OK);
    root = load(buf.data, buf.len);
    assert_string_equal(jstr(root, "object"), "chat.completion");
    choice = json_array_get(json_object_get(root, "choices"), 0);
    assert_string_equal(jstr(json_object_get(choice, "message"), "role"), "assistant");
    assert_string_equal(jstr(json_object_get(choice, "message"), "content"), "Hi!");
    assert_string_equal(jstr(choice, "finish_reason"), "stop");
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(root, "usage"), "total_tokens")), 5);
    json_decref(root);

    epd_oai_buf_reset(&buf);
    assert_int_equal(epd_oai_models_encode(models, N_MODELS, 42, 0, &buf), EPD_OK);
    root = load(buf.data, buf.len);
    assert_string_equal(jstr(root, "object"), "list");
    assert_int_equal(json_array_size(json_object_get(root, "data")), 2);
    choice = json_array_get(json_object_get(root, "data"), 1);
    assert_string_equal(jstr(choice, "id"), "other");
    assert_string_equal(jstr(choice, "object"), "model");
    assert_string_equal(jstr(choice, "owned_by"), "epd");
    assert_int_equal(json_integer_value(json_object_get(choice, "created")), 42);
    assert_null(json_object_get(choice, "max_model_len")); /* 0: left out */
    json_decref(root);
    epd_oai_buf_reset(&buf);
    assert_int_equal(epd_oai_models_encode(models, N_MODELS, 42, 1024, &buf), EPD_OK);
    root = load(buf.data, buf.len);
    choice = json_array_get(json_object_get(root, "data"), 0);
    assert_int_equal(json_integer_value(json_object_get(choice, "max_model_len")), 1024);
    json_decref(root);
    epd_oai_buf_cleanup(&buf);
}

/* ------------------------------------------------------------ streaming */

typedef struct {
    json_t *events[4096]; /* NULL entry: "[DONE]" */
    size_t n;
} events_t;

/* Splits SSE text into events; each must be "data: ...\n\n". */
static void sse_parse(const char *s, size_t n, events_t *ev)
{
    size_t pos = 0;

    while (pos < n) {
        const char *end = strstr(s + pos, "\n\n");

        assert_non_null(end);
        assert_int_equal(strncmp(s + pos, "data: ", 6), 0);
        assert_true(ev->n < 4096);
        if ((size_t)(end - (s + pos)) == 12 && strncmp(s + pos + 6, "[DONE]", 6) == 0) {
            ev->events[ev->n++] = NULL;
        } else {
            /* One line per event: no raw newline inside the JSON. */
            assert_null(memchr(s + pos + 6, '\n', (size_t)(end - (s + pos + 6))));
            ev->events[ev->n++] = load(s + pos + 6, (size_t)(end - (s + pos + 6)));
        }
        pos = (size_t)(end - s) + 2;
    }
}

static void events_free(events_t *ev)
{
    size_t i;

    for (i = 0; i < ev->n; i++) {
        json_decref(ev->events[i]);
    }
    ev->n = 0;
}

/* The content of a choice chunk (text or delta.content; "" when absent). */
static const char *chunk_text(json_t *ev, epd_oai_kind_t kind)
{
    json_t *choice = json_array_get(json_object_get(ev, "choices"), 0);
    json_t *v;

    assert_non_null(choice);
    v = kind == H ? json_object_get(json_object_get(choice, "delta"), "content")
                  : json_object_get(choice, "text");
    return v == NULL ? "" : json_string_value(v);
}

/* Streams raw[0..n) in pieces of `step` bytes; returns the concatenated
 * text and checks the framing. */
static void stream_run(epd_oai_kind_t kind, const unsigned char *raw, size_t n, size_t step,
                       int include_usage, char **text_p, size_t *text_len_p)
{
    epd_oai_stream_t s;
    epd_oai_buf_t out = EPD_OAI_BUF_INIT;
    events_t *ev = calloc(1, sizeof(*ev));
    char *text = calloc(1, 3 * n + 16);
    size_t tlen = 0;
    size_t i;
    size_t n_choice;

    assert_non_null(ev);
    assert_int_equal(epd_oai_stream_init(&s, kind, "cmpl-1", "tiny", 99, include_usage), EPD_OK);
    for (i = 0; i < n; i += step) {
        size_t k = n - i < step ? n - i : step;
        size_t before = out.len;

        assert_int_equal(epd_oai_stream_text(&s, raw + i, k, &out), EPD_OK);
        /* Every event on its own is valid UTF-8 JSON (jansson checks). */
        if (out.len > before) {
            events_t one;
            one.n = 0;
            sse_parse(out.data + before, out.len - before, &one);
            assert_int_equal(one.n, 1);
            events_free(&one);
        }
    }
    assert_int_equal(epd_oai_stream_finish(&s, EPD_OAI_FINISH_STOP, 3, 4, -1, &out), EPD_OK);
    assert_int_equal(epd_oai_stream_finish(&s, EPD_OAI_FINISH_STOP, 3, 4, -1, &out),
                     EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_oai_stream_text(&s, "x", 1, &out), EPD_ERR_INVALID_PARAM);
    sse_parse(out.data, out.len, ev);

    assert_true(ev->n >= 2);
    assert_null(ev->events[ev->n - 1]); /* [DONE] */
    n_choice = ev->n - 1 - (include_usage ? 1 : 0);
    for (i = 0; i < n_choice; i++) {
        json_t *e = ev->events[i];
        json_t *choice = json_array_get(json_object_get(e, "choices"), 0);
        json_t *fr = json_object_get(choice, "finish_reason");
        const char *t = chunk_text(e, kind);

        assert_string_equal(jstr(e, "id"), "cmpl-1");
        assert_string_equal(jstr(e, "object"),
                            kind == H ? "chat.completion.chunk" : "text_completion");
        assert_string_equal(jstr(e, "model"), "tiny");
        assert_int_equal(json_integer_value(json_object_get(e, "created")), 99);
        if (include_usage) {
            assert_true(json_is_null(json_object_get(e, "usage")));
        }
        if (kind == H) {
            json_t *role = json_object_get(json_object_get(choice, "delta"), "role");
            if (i == 0) {
                assert_string_equal(json_string_value(role), "assistant");
            } else {
                assert_null(role);
            }
        }
        if (i == n_choice - 1) {
            assert_string_equal(json_string_value(fr), "stop");
        } else {
            assert_true(json_is_null(fr));
            assert_true(strlen(t) > 0); /* no empty text events */
        }
        memcpy(text + tlen, t, strlen(t));
        tlen += strlen(t);
    }
    if (include_usage) {
        json_t *u = ev->events[ev->n - 2];
        json_t *usage = json_object_get(u, "usage");
        assert_int_equal(json_array_size(json_object_get(u, "choices")), 0);
        assert_int_equal(json_integer_value(json_object_get(usage, "prompt_tokens")), 3);
        assert_int_equal(json_integer_value(json_object_get(usage, "completion_tokens")), 4);
        assert_int_equal(json_integer_value(json_object_get(usage, "total_tokens")), 7);
    }
    events_free(ev);
    free(ev);
    epd_oai_buf_cleanup(&out);
    epd_oai_stream_cleanup(&s);
    *text_p = text;
    *text_len_p = tlen;
}

static void expect_repaired(const unsigned char *raw, size_t n, const char *text, size_t tlen)
{
    char *want = malloc(3 * n + 1);
    size_t wlen = 0;

    assert_int_equal(epd_utf8_repair(raw, n, want, 3 * n + 1, &wlen), EPD_OK);
    assert_int_equal(tlen, wlen);
    assert_memory_equal(text, want, wlen);
    free(want);
}

static void test_stream_multibyte_byte_by_byte(void **state)
{
    /* 1-, 2-, 3- and 4-byte characters fed one byte at a time: each event
     * holds whole characters only (the per-event JSON parse checks it). */
    const char *s = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80z\xe4\xb8\xad\xf0\x9f\x8e\x89";
    char *text;
    size_t tlen;
    int kind;

    (void)state;
    for (kind = C; kind <= H; kind++) {
        stream_run((epd_oai_kind_t)kind, (const unsigned char *)s, strlen(s), 1, kind == H, &text,
                   &tlen);
        assert_int_equal(tlen, strlen(s));
        assert_memory_equal(text, s, tlen);
        free(text);
    }
}

static void test_stream_repairs_like_whole(void **state)
{
    /* Random bytes (biased towards UTF-8 lead/continuation bytes) in random
     * pieces: the stream's text is epd_utf8_repair of the whole. */
    static const unsigned char pool[] = {'a',  ' ',  '"',  '\\', '\n', 0x01, 0x7f, 0x80,
                                         0x8f, 0xa0, 0xbf, 0xc0, 0xc2, 0xdf, 0xe0, 0xe2,
                                         0xed, 0xef, 0xf0, 0xf4, 0xf5, 0xff};
    unsigned seed = 12345;
    int iter;

    (void)state;
    for (iter = 0; iter < 300; iter++) {
        unsigned char raw[64];
        size_t n;
        size_t i;
        char *text;
        size_t tlen;

        seed = seed * 1103515245u + 12345u;
        n = (seed >> 16) % sizeof(raw);
        for (i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            raw[i] = pool[(seed >> 16) % sizeof(pool)];
        }
        seed = seed * 1103515245u + 12345u;
        stream_run(iter % 2 ? H : C, raw, n, 1 + (seed >> 16) % 5, iter % 3 == 0, &text, &tlen);
        expect_repaired(raw, n, text, tlen);
        free(text);
    }
}

static void test_stream_empty_and_error(void **state)
{
    epd_oai_stream_t s;
    epd_oai_buf_t out = EPD_OAI_BUF_INIT;
    epd_oai_error_t err;
    events_t ev;
    json_t *choice;

    (void)state;
    /* A chat stream with no text at all: the finish chunk carries the role. */
    assert_int_equal(epd_oai_stream_init(&s, H, "chatcmpl-2", "tiny", 1, 0), EPD_OK);
    assert_int_equal(epd_oai_stream_finish(&s, EPD_OAI_FINISH_LENGTH, 1, 0, -1, &out), EPD_OK);
    ev.n = 0;
    sse_parse(out.data, out.len, &ev);
    assert_int_equal(ev.n, 2);
    choice = json_array_get(json_object_get(ev.events[0], "choices"), 0);
    assert_string_equal(jstr(json_object_get(choice, "delta"), "role"), "assistant");
    assert_string_equal(jstr(choice, "finish_reason"), "length");
    assert_null(json_object_get(ev.events[0], "usage"));
    events_free(&ev);
    epd_oai_stream_cleanup(&s);

    /* An error in the middle of a stream. */
    epd_oai_buf_reset(&out);
    assert_int_equal(epd_oai_stream_init(&s, C, "cmpl-3", "tiny", 1, 0), EPD_OK);
    assert_int_equal(epd_oai_stream_text(&s, "ab", 2, &out), EPD_OK);
    epd_oai_error_set(&err, 503, NULL, NULL, "decode worker %s died", "d-1");
    assert_int_equal(epd_oai_stream_error(&s, &err, &out), EPD_OK);
    assert_int_equal(epd_oai_stream_text(&s, "c", 1, &out), EPD_ERR_INVALID_PARAM);
    ev.n = 0;
    sse_parse(out.data, out.len, &ev);
    assert_int_equal(ev.n, 3);
    assert_string_equal(jstr(json_object_get(ev.events[1], "error"), "message"),
                        "decode worker d-1 died");
    assert_string_equal(jstr(json_object_get(ev.events[1], "error"), "type"), "server_error");
    assert_null(ev.events[2]);
    events_free(&ev);
    epd_oai_stream_cleanup(&s);
    epd_oai_buf_cleanup(&out);

    assert_int_equal(
        epd_oai_stream_init(&s, C, "this-id-is-far-too-long-for-the-buffer", "m", 1, 0),
        EPD_ERR_INVALID_PARAM);
}

/* ------------------------------------------------------------ allocation failures */

static void test_alloc_failures(void **state)
{
    static const char chat[] =
        "{\"model\": \"tiny\", \"stop\": [\"a\", \"b\"], \"messages\": [{\"role\": \"user\","
        " \"content\": [{\"type\": \"text\", \"text\": \"hi\"}]}]}";
    static const char compl [] = "{\"model\": \"tiny\", \"prompt\": \"x\", \"stop\": \"s\"}";
    epd_alloc_stats_t before;
    epd_alloc_stats_t after;
    long n;
    int ok_parse = 0;
    int ok_stream = 0;

    (void)state;
    epd_alloc_stats(&before);
    for (n = 0; n < 40; n++) {
        epd_oai_request_t *req = NULL;
        epd_oai_error_t err;
        epd_oai_stream_t s;
        epd_oai_buf_t out = EPD_OAI_BUF_INIT;
        epd_status_t st;

        epd_alloc_fail_after(n);
        st = epd_oai_request_parse(n % 2 ? H : C, n % 2 ? chat : compl,
                                   strlen(n % 2 ? chat : compl ), models, N_MODELS, CONTEXT, &req,
                                   &err);
        if (st == EPD_OK) {
            ok_parse++;
            epd_oai_request_destroy(req);
        } else {
            assert_int_equal(st, EPD_ERR_NO_MEMORY);
            assert_int_equal(err.http_status, 500);
        }
        epd_alloc_fail_after(n);
        memset(&s, 0, sizeof(s));
        if (epd_oai_stream_init(&s, H, "c-1", "tiny", 1, 1) == EPD_OK) {
            size_t len0 = out.len;
            st = epd_oai_stream_text(&s, "h\xc3", 2, &out);
            if (st != EPD_OK) {
                assert_int_equal(out.len, len0); /* nothing half-appended */
                assert_int_equal(s.tail_len, 0);
            } else if (epd_oai_stream_text(&s, "\xa9", 1, &out) == EPD_OK &&
                       epd_oai_stream_finish(&s, EPD_OAI_FINISH_STOP, 1, 2, -1, &out) == EPD_OK) {
                ok_stream++;
            }
        }
        epd_alloc_fail_after(-1);
        epd_oai_stream_cleanup(&s);
        epd_oai_buf_cleanup(&out);
    }
    assert_true(ok_parse > 0);
    assert_true(ok_stream > 0);
    epd_alloc_stats(&after);
    assert_int_equal(after.live_blocks, before.live_blocks);
    assert_int_equal(after.live_bytes, before.live_bytes);
}

/* ------------------------------------------------------------ JSON limits */

/* A completion body whose extra field "x" holds `inner` (borrowed). */
static char *body_with(const char *inner)
{
    size_t n = strlen(inner) + 64;
    char *b = malloc(n);

    assert_non_null(b);
    snprintf(b, n, "{\"model\": \"tiny\", \"prompt\": \"a\", \"x\": %s}", inner);
    return b;
}

/* `depth` arrays nested, the innermost holding 1. */
static char *nested(size_t depth)
{
    char *s = malloc(2 * depth + 2);

    assert_non_null(s);
    memset(s, '[', depth);
    s[depth] = '1';
    memset(s + depth + 1, ']', depth);
    s[2 * depth + 1] = '\0';
    return s;
}

/* An array of `n` ones. */
static char *ones(size_t n)
{
    char *s = malloc(2 * n + 3);
    size_t at = 0;

    assert_non_null(s);
    s[at++] = '[';
    for (size_t i = 0; i < n; i++) {
        if (i > 0) {
            s[at++] = ',';
        }
        s[at++] = '1';
    }
    s[at++] = ']';
    s[at] = '\0';
    return s;
}

/* Parses `body` under `limits`: the refusal's code, or "" when it parsed. */
static const char *limited(const char *body, const epd_oai_limits_t *limits, char code[32])
{
    epd_oai_request_t *req = NULL;
    epd_oai_error_t err;
    epd_status_t st = epd_oai_request_parse_limited(EPD_OAI_COMPLETION, body, strlen(body), models,
                                                    N_MODELS, CONTEXT, limits, &req, &err);

    if (st == EPD_OK) {
        epd_oai_request_destroy(req);
        code[0] = '\0';
        return code;
    }
    assert_int_equal(err.http_status, 400);
    snprintf(code, 32, "%s", err.code);
    if (strncmp(code, "json_", 5) == 0) {
        /* the refusal names the limit, with param null */
        assert_non_null(strstr(err.message, "(the limit)"));
        assert_string_equal(err.param, "");
    }
    return code;
}

static void test_json_limits(void **state)
{
    epd_oai_limits_t lim;
    epd_oai_error_t err;
    char code[32];
    char *inner;
    char *body;

    (void)state;
    epd_oai_limits_init(&lim);
    assert_int_equal(lim.max_depth, 64);
    assert_int_equal(lim.max_elements, 100000);

    /* depth: the body's object is level 1 */
    inner = nested(63);
    body = body_with(inner);
    assert_string_equal(limited(body, NULL, code), "");
    free(inner);
    free(body);
    inner = nested(64);
    body = body_with(inner);
    assert_string_equal(limited(body, NULL, code), "json_too_deep");
    /* the default parse holds the same limits */
    {
        epd_oai_request_t *req = NULL;

        assert_int_equal(epd_oai_request_parse(EPD_OAI_COMPLETION, body, strlen(body), models,
                                               N_MODELS, CONTEXT, &req, &err),
                         EPD_ERR_INVALID_PARAM);
        assert_string_equal(err.code, "json_too_deep");
        assert_null(req);
    }
    free(inner);
    free(body);
    /* a million levels: refused by the scan (jansson would recurse) */
    inner = nested(1000000);
    body = body_with(inner);
    assert_string_equal(limited(body, NULL, code), "json_too_deep");
    free(inner);
    free(body);

    /* elements: the body's 3 members plus the array's */
    inner = ones(100000 - 3);
    body = body_with(inner);
    assert_string_equal(limited(body, NULL, code), "");
    free(inner);
    free(body);
    inner = ones(100000 - 2);
    body = body_with(inner);
    assert_string_equal(limited(body, NULL, code), "json_too_many_elements");
    free(inner);
    free(body);
    /* empty containers hold nothing; nested ones are elements themselves */
    lim.max_elements = 3 + 4 + 2;
    assert_string_equal(limited("{\"model\": \"tiny\", \"prompt\": \"a\", "
                                "\"x\": [[], {}, [ ], {\"k\": [1]}]}",
                                &lim, code),
                        "");
    lim.max_elements = 3 + 4 + 1;
    assert_string_equal(limited("{\"model\": \"tiny\", \"prompt\": \"a\", "
                                "\"x\": [[], {}, [ ], {\"k\": [1]}]}",
                                &lim, code),
                        "json_too_many_elements");

    /* strings, as sent (an escape is its bytes) */
    epd_oai_limits_init(&lim);
    lim.max_string_bytes = 16;
    assert_string_equal(
        limited("{\"model\": \"tiny\", \"prompt\": \"0123456789abcdef\"}", &lim, code), "");
    assert_string_equal(
        limited("{\"model\": \"tiny\", \"prompt\": \"0123456789abcdefg\"}", &lim, code),
        "json_string_too_long");
    assert_string_equal(
        limited("{\"model\": \"tiny\", \"prompt\": \"0123456789abcde\\n\"}", &lim, code),
        "json_string_too_long");
    /* keys are strings too */
    assert_string_equal(limited("{\"model\": \"tiny\", \"prompt\": \"a\", "
                                "\"0123456789abcdefg\": 1}",
                                &lim, code),
                        "json_string_too_long");

    /* brackets, commas and escaped quotes inside strings count for nothing */
    epd_oai_limits_init(&lim);
    lim.max_depth = 1;
    lim.max_elements = 2;
    assert_string_equal(
        limited("{\"model\": \"tiny\", \"prompt\": \"[[[{{,,,\\\"]],\\\\\"}", &lim, code), "");
    lim.max_depth = 2;
    lim.max_elements = 100;
    assert_string_equal(limited("{\"model\": \"tiny\", \"prompt\": [\"a\"]}", &lim, code), "");
    assert_string_equal(limited("{\"model\": \"tiny\", \"prompt\": [[\"a\"]]}", &lim, code),
                        "json_too_deep");

    /* the scan alone, on bytes that are not JSON: judged by the limits only */
    epd_oai_limits_init(&lim);
    assert_int_equal(epd_oai_json_check("\"abc\\", 5, &lim, &err), EPD_OK);
    assert_int_equal(epd_oai_json_check("]]]}}}[", 7, &lim, &err), EPD_OK);
    assert_int_equal(epd_oai_json_check("", 0, &lim, &err), EPD_OK);
    lim.max_string_bytes = 2;
    assert_int_equal(epd_oai_json_check("\"abc", 4, &lim, &err), EPD_ERR_INVALID_PARAM);
    assert_string_equal(err.code, "json_string_too_long");
}

/* the logprobs object in OpenAI's shapes, spliced into an answer */
static void test_logprobs_encode(void **state)
{
    epd_oai_buf_t buf = EPD_OAI_BUF_INIT;
    epd_oai_buf_t frag = EPD_OAI_BUF_INIT;
    epd_oai_token_lp_t t[2];
    char id[EPD_OAI_ID_MAX];
    json_t *root;
    json_t *lp;
    json_t *c0;

    (void)state;
    memset(t, 0, sizeof(t));
    t[0].bytes = "Hi";
    t[0].len = 2;
    t[0].logprob = -0.25;
    t[0].n_top = 2;
    t[0].top_bytes[0] = "Hi";
    t[0].top_len[0] = 2;
    t[0].top_logprob[0] = -0.25;
    t[0].top_bytes[1] = "\xe2"; /* part of a character */
    t[0].top_len[1] = 1;
    t[0].top_logprob[1] = -2.5;
    t[1].bytes = "\xff";
    t[1].len = 1;
    t[1].logprob = -1.0 / 3.0;
    /* completions */
    assert_int_equal(epd_oai_logprobs_encode(C, t, 2, &frag), EPD_OK);
    epd_oai_make_id(C, 9, id);
    assert_int_equal(
        epd_oai_response_encode(C, id, "tiny", 1, "Hi\xff", 3, EPD_OAI_FINISH_STOP, 1, 2, -1, &buf),
        EPD_OK);
    assert_int_equal(epd_oai_splice_logprobs(&buf, 0, frag.data, frag.len), EPD_OK);
    root = load(buf.data, buf.len);
    lp = json_object_get(json_array_get(json_object_get(root, "choices"), 0), "logprobs");
    assert_string_equal(json_string_value(json_array_get(json_object_get(lp, "tokens"), 0)), "Hi");
    assert_string_equal(json_string_value(json_array_get(json_object_get(lp, "tokens"), 1)),
                        "bytes:\\xff");
    assert_true(json_real_value(json_array_get(json_object_get(lp, "token_logprobs"), 1)) ==
                -1.0 / 3.0); /* 17 digits: the double round-trips */
    c0 = json_array_get(json_object_get(lp, "top_logprobs"), 0);
    assert_int_equal(json_object_size(c0), 2);
    assert_true(json_real_value(json_object_get(c0, "bytes:\\xe2")) == -2.5);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(lp, "text_offset"), 1)), 2);
    json_decref(root);
    /* chat */
    epd_oai_buf_reset(&frag);
    epd_oai_buf_reset(&buf);
    assert_int_equal(epd_oai_logprobs_encode(H, t, 2, &frag), EPD_OK);
    root = load(frag.data, frag.len);
    c0 = json_array_get(json_object_get(root, "content"), 0);
    assert_string_equal(json_string_value(json_object_get(c0, "token")), "Hi");
    assert_int_equal(json_array_size(json_object_get(c0, "bytes")), 2);
    assert_int_equal(json_array_size(json_object_get(c0, "top_logprobs")), 2);
    assert_int_equal(
        json_integer_value(json_array_get(
            json_object_get(json_array_get(json_object_get(root, "content"), 1), "bytes"), 0)),
        255);
    assert_true(json_is_null(json_object_get(root, "refusal")));
    json_decref(root);
    /* no "logprobs":null to replace */
    epd_oai_buf_reset(&buf);
    assert_int_equal(epd_oai_error_encode(&(epd_oai_error_t){.http_status = 400}, &buf), EPD_OK);
    assert_int_equal(epd_oai_splice_logprobs(&buf, 0, "{}", 2), EPD_ERR_NOT_FOUND);
    epd_oai_buf_cleanup(&frag);
    epd_oai_buf_cleanup(&buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_json_limits),
        cmocka_unit_test(test_completion_fields),
        cmocka_unit_test(test_chat_template),
        cmocka_unit_test(test_chat_images),
        cmocka_unit_test(test_check_length),
        cmocka_unit_test(test_response_encode),
        cmocka_unit_test(test_logprobs_encode),
        cmocka_unit_test(test_stream_multibyte_byte_by_byte),
        cmocka_unit_test(test_stream_repairs_like_whole),
        cmocka_unit_test(test_stream_empty_and_error),
        cmocka_unit_test(test_alloc_failures),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
