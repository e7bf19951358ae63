/*
 * libFuzzer target for the OpenAI request parser (api/epd_openai): any
 * body is parsed, as a completion and as a chat request, into a checked
 * request or refused with a 4xx error whose JSON encodes; a parsed request
 * then goes through the length check, and the body's bytes are streamed
 * (split at a point taken from the input) and encoded as a full response,
 * so every encoder sees arbitrary text.  `make fuzz`.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "epd_openai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void one(epd_oai_kind_t kind, const uint8_t *data, size_t size, epd_oai_buf_t *out)
{
    static const char *const models[] = {"tiny", "m"};
    epd_oai_request_t *req = NULL;
    epd_oai_error_t err;
    int64_t max_new;

    if (epd_oai_request_parse(kind, data, size, models, 2, 64, &req, &err) != EPD_OK) {
        if (err.http_status < 400 || err.http_status > 599) {
            abort();
        }
        (void)epd_oai_error_encode(&err, out);
        return;
    }
    if (req->prompt == NULL || req->model == NULL || strlen(req->prompt) != req->prompt_len ||
        (req->has_max_tokens && (req->max_tokens < 1 || req->max_tokens > 64))) {
        abort();
    }
    if (epd_oai_check_length(req, (int64_t)(size % 80), 64, &max_new, &err) == EPD_OK &&
        (max_new < 1 || max_new > 64)) {
        abort();
    }
    epd_oai_request_destroy(req);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    epd_oai_buf_t out = EPD_OAI_BUF_INIT;
    epd_oai_stream_t stream;
    size_t split = size > 0 ? data[0] % (size + 1) : 0;

    one(EPD_OAI_COMPLETION, data, size, &out);
    one(EPD_OAI_CHAT, data, size, &out);
    if (epd_oai_stream_init(&stream, size % 2 ? EPD_OAI_CHAT : EPD_OAI_COMPLETION, "id-1", "tiny",
                            1, size % 3 == 0) == EPD_OK) {
        (void)epd_oai_stream_text(&stream, data, split, &out);
        (void)epd_oai_stream_text(&stream, data + split, size - split, &out);
        (void)epd_oai_stream_finish(&stream, EPD_OAI_FINISH_LENGTH, 1, 2, -1, &out);
        epd_oai_stream_cleanup(&stream);
    }
    (void)epd_oai_response_encode(EPD_OAI_CHAT, "id-2", "tiny", 1, data, size, EPD_OAI_FINISH_STOP,
                                  1, 2, -1, &out);
    epd_oai_buf_cleanup(&out);
    return 0;
}
