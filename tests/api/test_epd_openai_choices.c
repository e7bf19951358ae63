/*
 * test_epd_openai_choices.c — api/epd_openai_*.c for answers of several
 * choices: "prompt" as a batch (strings and token ids), "n" and its caps,
 * "echo", the multi-choice answer (epd_oai_response_encode_choices) and a
 * member stream's index, finish without [DONE], and the trailer.  Each
 * answer is read back with jansson, as a client would.
 */
#include "epd_test.h"

#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "epd_openai.h"

static const char *const models[] = {"tiny"};
#define CONTEXT 1024
#define C EPD_OAI_COMPLETION
#define H EPD_OAI_CHAT

static epd_status_t parse(epd_oai_kind_t kind, const char *body, epd_oai_request_t **req,
                          epd_oai_error_t *err)
{
    *req = NULL;
    return epd_oai_request_parse(kind, body, strlen(body), models, 1, CONTEXT, req, err);
}

static void test_batch_parse(void **state)
{
    epd_oai_request_t *req;
    epd_oai_error_t err;

    (void)state;
    assert_int_equal(parse(C,
                           "{\"model\": \"tiny\", \"prompt\": [\"ab\", [5, 6, 7], \"\"],"
                           " \"n\": 2, \"echo\": true}",
                           &req, &err),
                     EPD_OK);
    assert_int_equal(req->n_batch, 3);
    assert_int_equal(req->n, 2);
    assert_true(req->echo);
    assert_string_equal(req->batch[0].text, "ab");
    assert_int_equal(req->batch[0].len, 2);
    assert_null(req->batch[0].ids);
    assert_int_equal(req->batch[1].n_ids, 3);
    assert_int_equal(req->batch[1].ids[2], 7);
    assert_int_equal(req->batch[2].len, 0);
    assert_null(req->prompt_ids); /* each member's prompt is its batch entry */
    epd_oai_request_destroy(req);

    /* one entry is one prompt, as before (no batch) */
    assert_int_equal(parse(C, "{\"model\": \"tiny\", \"prompt\": [[9, 8]]}", &req, &err), EPD_OK);
    assert_int_equal(req->n_batch, 0);
    assert_int_equal(req->n_prompt_ids, 2);
    assert_int_equal(req->n, 1);
    epd_oai_request_destroy(req);
    assert_int_equal(parse(H,
                           "{\"model\": \"tiny\", \"n\": 16, \"messages\": [{\"role\": \"user\","
                           " \"content\": \"x\"}]}",
                           &req, &err),
                     EPD_OK);
    assert_int_equal(req->n, 16);
    epd_oai_request_destroy(req);
}

static void test_batch_refusals(void **state)
{
    static const struct {
        const char *body;
        const char *param;
        const char *in_message;
    } cases[] = {
        {"{\"model\": \"tiny\", \"prompt\": []}", "prompt", "1 to 64 prompts"},
        {"{\"model\": \"tiny\", \"prompt\": [\"a\", []]}", "prompt", "'prompt[1]' must be"},
        {"{\"model\": \"tiny\", \"prompt\": [\"a\", [[1]]]}", "prompt", "'prompt[1][0]' must be"},
        {"{\"model\": \"tiny\", \"prompt\": [\"a\", 3]}", "prompt", "'prompt[1]' must be"},
        {"{\"model\": \"tiny\", \"prompt\": [\"a\", [-1]]}", "prompt", "'prompt[1][0]' must be"},
        {"{\"model\": \"tiny\", \"prompt\": \"a\", \"n\": 0}", "n", "from 1 to 16"},
        {"{\"model\": \"tiny\", \"prompt\": \"a\", \"n\": -1}", "n", "from 1 to 16"},
        {"{\"model\": \"tiny\", \"prompt\": \"a\", \"n\": 10000}", "n", "from 1 to 16"},
        {"{\"model\": \"tiny\", \"prompt\": [\"a\", \"b\", \"c\", \"d\", \"e\"], \"n\": 13}", "n",
         "at most 64 choices"},
        {"{\"model\": \"tiny\", \"prompt\": \"a\", \"echo\": \"yes\"}", "echo", "echo"},
        {"{\"model\": \"tiny\", \"prompt\": \"a\", \"echo\": true, \"logprobs\": 0}", "echo",
         "not supported"},
    };
    char big[65 * 4 + 64];
    size_t off;

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        epd_oai_request_t *req;
        epd_oai_error_t err;

        if (parse(C, cases[i].body, &req, &err) != EPD_ERR_INVALID_PARAM ||
            err.http_status != 400 || strcmp(err.param, cases[i].param) != 0 ||
            strstr(err.message, cases[i].in_message) == NULL) {
            print_error("case %zu: param '%s' message '%s'\n", i, err.param, err.message);
            fail();
        }
    }
    /* 65 prompts: one past the cap */
    off = (size_t)snprintf(big, sizeof(big), "{\"model\": \"tiny\", \"prompt\": [");
    for (int i = 0; i < 65; i++) {
        off += (size_t)snprintf(big + off, sizeof(big) - off, "%s\"p\"", i > 0 ? "," : "");
    }
    snprintf(big + off, sizeof(big) - off, "]}");
    {
        epd_oai_request_t *req;
        epd_oai_error_t err;

        assert_int_equal(parse(C, big, &req, &err), EPD_ERR_INVALID_PARAM);
        assert_string_equal(err.param, "prompt");
    }
    /* chat has no echo (accepted only false, as before) */
    {
        epd_oai_request_t *req;
        epd_oai_error_t err;

        assert_int_equal(parse(H,
                               "{\"model\": \"tiny\", \"echo\": true, \"messages\": [{\"role\":"
                               " \"user\", \"content\": \"x\"}]}",
                               &req, &err),
                         EPD_ERR_INVALID_PARAM);
        assert_string_equal(err.param, "echo");
    }
}

static void test_encode_choices(void **state)
{
    epd_oai_buf_t out = EPD_OAI_BUF_INIT;
    epd_oai_choice_t c[3] = {
        {"Say: ", 5, "one", 3, EPD_OAI_FINISH_LENGTH, NULL, 0},
        {NULL, 0, "tw\xc3", 3, EPD_OAI_FINISH_STOP, "{\"x\":1}", 7},
        {NULL, 0, "", 0, EPD_OAI_FINISH_STOP, NULL, 0},
    };
    json_t *root, *ch;
    json_error_t jerr;

    (void)state;
    assert_int_equal(epd_oai_response_encode_choices(C, "cmpl-1", "tiny", 7, c, 3, 10, 4, 2, &out),
                     EPD_OK);
    root = json_loadb(out.data, out.len, 0, &jerr);
    assert_non_null(root);
    ch = json_object_get(root, "choices");
    assert_int_equal(json_array_size(ch), 3);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(json_integer_value(json_object_get(json_array_get(ch, i), "index")), i);
    }
    /* echo prefix joined; an incomplete UTF-8 tail repaired */
    assert_string_equal(json_string_value(json_object_get(json_array_get(ch, 0), "text")),
                        "Say: one");
    assert_string_equal(json_string_value(json_object_get(json_array_get(ch, 1), "text")),
                        "tw\xef\xbf\xbd");
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(ch, 0), "finish_reason")), "length");
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(json_array_get(ch, 1), "logprobs"),
                                           "x")),
        1);
    assert_true(json_is_null(json_object_get(json_array_get(ch, 2), "logprobs")));
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(root, "usage"), "total_tokens")), 14);
    json_decref(root);

    /* chat: message.content */
    epd_oai_buf_reset(&out);
    assert_int_equal(epd_oai_response_encode_choices(H, "chatcmpl-1", "tiny", 7, c, 2, 1, 1, -1,
                                                     &out),
                     EPD_OK);
    root = json_loadb(out.data, out.len, 0, &jerr);
    assert_non_null(root);
    assert_string_equal(
        json_string_value(json_object_get(
            json_object_get(json_array_get(json_object_get(root, "choices"), 1), "message"),
            "content")),
        "tw\xef\xbf\xbd");
    json_decref(root);
    epd_oai_buf_cleanup(&out);
}

static void test_member_stream(void **state)
{
    epd_oai_stream_t s;
    epd_oai_buf_t out = EPD_OAI_BUF_INIT;

    (void)state;
    assert_int_equal(epd_oai_stream_init(&s, C, "cmpl-2", "tiny", 7, 1), EPD_OK);
    s.index = 5;
    s.member = 1;
    assert_int_equal(epd_oai_stream_text(&s, "hi", 2, &out), EPD_OK);
    assert_non_null(strstr(out.data, "\"index\":5,\"text\":\"hi\""));
    epd_oai_buf_reset(&out);
    assert_int_equal(epd_oai_stream_finish(&s, EPD_OAI_FINISH_STOP, 3, 1, 0, &out), EPD_OK);
    /* a member's finish: its chunk only, no usage and no [DONE] */
    assert_non_null(strstr(out.data, "\"finish_reason\":\"stop\""));
    assert_null(strstr(out.data, "[DONE]"));
    assert_null(strstr(out.data, "\"choices\":[]"));
    epd_oai_buf_reset(&out);
    assert_int_equal(epd_oai_stream_trailer(&s, 6, 9, 2, &out), EPD_OK);
    assert_non_null(strstr(out.data, "\"choices\":[],\"usage\":{\"prompt_tokens\":6,"
                                     "\"completion_tokens\":9,\"total_tokens\":15"));
    assert_non_null(strstr(out.data, "data: [DONE]\n\n"));
    epd_oai_stream_cleanup(&s);
    epd_oai_buf_cleanup(&out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_parse),
        cmocka_unit_test(test_batch_refusals),
        cmocka_unit_test(test_encode_choices),
        cmocka_unit_test(test_member_stream),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
