/*
 * epd_openai_parse.c — OpenAI request bodies (design: epd_openai.h):
 * POST /v1/completions and /v1/chat/completions parsed with jansson and
 * validated field by field, the chat template rendered, images decoded
 * from their data: URLs; and the length check the router makes once it
 * has tokenized the prompt.
 *
 * Parsing walks a jansson tree field by field; each refusal says which
 * field and why, in the wording OpenAI uses ("Missing required parameter:
 * 'model'.", "Invalid type for 'temperature': expected a number, but got a
 * string instead.").  Refusals are filled with epd_oai_error_set
 * (epd_openai_json.c); nothing here encodes output.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>
#include <sodium.h>

#include "epd_alloc.h"
#include "epd_openai_int.h"

static const char *epd_oai_json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a decimal";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "a value";
}

static void epd_oai_type_error(epd_oai_error_t *err, const char *param, const char *expected,
                               const json_t *got)
{
    epd_oai_error_set(err, 400, param, NULL,
                      "Invalid type for '%s': expected %s, but got %s instead.", param, expected,
                      epd_oai_json_type_name(got));
}

static void epd_oai_missing_error(epd_oai_error_t *err, const char *param)
{
    epd_oai_error_set(err, 400, param, NULL, "Missing required parameter: '%s'.", param);
}

static void epd_oai_oom_error(epd_oai_error_t *err)
{
    epd_oai_error_set(err, 500, NULL, NULL, "The server is out of memory.");
}

/* An optional field: NULL when absent or JSON null. */
static json_t *epd_oai_opt_field(json_t *obj, const char *name)
{
    json_t *v = json_object_get(obj, name);

    return v == NULL || json_is_null(v) ? NULL : v;
}

void epd_oai_request_destroy(epd_oai_request_t *req)
{
    size_t i;

    if (req == NULL) {
        return;
    }
    epd_free(req->model);
    epd_free(req->prompt);
    for (i = 0; i < req->n_stop; i++) {
        epd_free(req->stop[i]);
    }
    for (i = 0; i < req->n_images; i++) {
        epd_free(req->images[i].data);
    }
    epd_free(req->images);
    epd_free(req->cache_salt);
    epd_free(req->bias_ids);
    epd_free(req->bias_values);
    epd_free(req->stop_token_ids);
    epd_free(req->prompt_ids);
    epd_free(req->msgs);
    for (i = 0; i < req->n_batch; i++) {
        epd_free(req->batch[i].text);
        epd_free(req->batch[i].ids);
    }
    epd_free(req->batch);
    epd_free(req);
}

/* One prompt `v` (a string or a non-empty array of token ids; `what` names
 * it in errors) into *text and *len, or *ids and *n_ids (then *text is "").
 * Owned by the caller, also on failure. */
static epd_status_t epd_oai_prompt_one(json_t *v, const char *what, char **text, size_t *len,
                                       uint32_t **ids, size_t *n_ids, epd_oai_error_t *err)
{
    if (json_is_string(v)) {
        *len = json_string_length(v);
        *text = epd_strndup(json_string_value(v), *len);
        if (*text == NULL) {
            epd_oai_oom_error(err);
            return EPD_ERR_NO_MEMORY;
        }
        return EPD_OK;
    }
    if (!json_is_array(v) || json_array_size(v) == 0) {
        epd_oai_error_set(err, 400, "prompt", NULL,
                          "'%s' must be a string or a non-empty array of token ids.", what);
        return EPD_ERR_INVALID_PARAM;
    }
    {
        /* token ids, used as given (nothing added, as vLLM does); the
         * router checks them against the vocabulary and the context */
        size_t n = json_array_size(v);

        *ids = epd_calloc(n, sizeof(**ids));
        *text = epd_strdup("");
        if (*ids == NULL || *text == NULL) {
            epd_oai_oom_error(err);
            return EPD_ERR_NO_MEMORY;
        }
        for (size_t i = 0; i < n; i++) {
            json_t *e = json_array_get(v, i);

            if (!json_is_integer(e) || json_integer_value(e) < 0 ||
                json_integer_value(e) > (json_int_t)UINT32_MAX) {
                epd_oai_error_set(err, 400, "prompt", NULL,
                                  "'%s[%zu]' must be a token id (an integer >= 0).", what, i);
                return EPD_ERR_INVALID_PARAM;
            }
            (*ids)[i] = (uint32_t)json_integer_value(e);
        }
        *n_ids = n;
    }
    return EPD_OK;
}

/* "prompt": a string, an array of token ids, or an array of these (one:
 * a single prompt; 2..EPD_OAI_MAX_BATCH: a batch, req->batch). */
static epd_status_t epd_oai_parse_prompt(json_t *root, epd_oai_request_t *req, epd_oai_error_t *err)
{
    json_t *v = epd_oai_opt_field(root, "prompt");
    size_t n;

    if (v == NULL) {
        epd_oai_missing_error(err, "prompt");
        return EPD_ERR_INVALID_PARAM;
    }
    if (json_is_array(v) && json_array_size(v) > 0 && json_is_integer(json_array_get(v, 0))) {
        return epd_oai_prompt_one(v, "prompt", &req->prompt, &req->prompt_len, &req->prompt_ids,
                                  &req->n_prompt_ids, err);
    }
    if (!json_is_array(v)) {
        if (!json_is_string(v)) {
            epd_oai_type_error(err, "prompt", "a string", v);
            return EPD_ERR_INVALID_PARAM;
        }
        return epd_oai_prompt_one(v, "prompt", &req->prompt, &req->prompt_len, &req->prompt_ids,
                                  &req->n_prompt_ids, err);
    }
    n = json_array_size(v);
    if (n == 0 || n > EPD_OAI_MAX_BATCH) {
        epd_oai_error_set(err, 400, "prompt", NULL,
                          "'prompt' as a batch must hold 1 to %d prompts, got %zu.",
                          EPD_OAI_MAX_BATCH, n);
        return EPD_ERR_INVALID_PARAM;
    }
    if (n == 1) {
        return epd_oai_prompt_one(json_array_get(v, 0), "prompt[0]", &req->prompt,
                                  &req->prompt_len, &req->prompt_ids, &req->n_prompt_ids, err);
    }
    req->batch = epd_calloc(n, sizeof(*req->batch));
    req->prompt = epd_strdup(""); /* each member's prompt is its batch entry */
    if (req->batch == NULL || req->prompt == NULL) {
        epd_oai_oom_error(err);
        return EPD_ERR_NO_MEMORY;
    }
    req->n_batch = n;
    for (size_t i = 0; i < n; i++) {
        epd_oai_prompt_t *p = &req->batch[i];
        char what[32];
        epd_status_t st;

        snprintf(what, sizeof(what), "prompt[%zu]", i);
        st = epd_oai_prompt_one(json_array_get(v, i), what, &p->text, &p->len, &p->ids,
                                &p->n_ids, err);
        if (st != EPD_OK) {
            return st;
        }
    }
    return EPD_OK;
}

/* The URL of an image part: {"image_url": {"url": URL}} or {"image_url": URL}. */
static json_t *epd_oai_image_part_url(json_t *part)
{
    json_t *iu = json_object_get(part, "image_url");

    if (json_is_object(iu)) {
        return json_object_get(iu, "url");
    }
    return iu;
}

/* Checks an image part's URL (a data: URL of an image, base64) and, when
 * `img` is not NULL, decodes it there (img->data owned by the caller). */
static epd_status_t epd_oai_image_part(json_t *part, size_t i, size_t j, epd_oai_image_t *img,
                                       epd_oai_error_t *err)
{
    json_t *url = epd_oai_image_part_url(part);
    char param[96];
    const char *u;
    const char *comma;
    const char *b64;
    size_t ulen, b64_len, cap, out_len = 0;
    unsigned char *out;

    snprintf(param, sizeof(param), "messages[%zu].content[%zu].image_url.url", i, j);
    if (url == NULL) {
        epd_oai_missing_error(err, param);
        return EPD_ERR_INVALID_PARAM;
    }
    if (!json_is_string(url)) {
        epd_oai_type_error(err, param, "a string", url);
        return EPD_ERR_INVALID_PARAM;
    }
    u = json_string_value(url);
    ulen = json_string_length(url);
    if (strncasecmp(u, "http://", 7) == 0 || strncasecmp(u, "https://", 8) == 0) {
        epd_oai_error_set(err, 400, param, "invalid_image_url",
                          "'%s' is a remote URL: this server accepts only data: URLs "
                          "(data:image/png;base64,... or data:image/jpeg;base64,...) and does not "
                          "fetch images.",
                          param);
        return EPD_ERR_INVALID_PARAM;
    }
    if (strncasecmp(u, "data:", 5) != 0) {
        epd_oai_error_set(err, 400, param, "invalid_image_url",
                          "'%s' must be a data: URL (data:image/png;base64,...).", param);
        return EPD_ERR_INVALID_PARAM;
    }
    comma = memchr(u, ',', ulen);
    if (comma == NULL || strncasecmp(u + 5, "image/", 6) != 0 || comma - u < 11 + 7 ||
        strncasecmp(comma - 7, ";base64", 7) != 0) {
        epd_oai_error_set(err, 400, param, "invalid_image_url",
                          "'%s' must be a base64 data: URL of an image "
                          "(data:image/SUBTYPE;base64,DATA).",
                          param);
        return EPD_ERR_INVALID_PARAM;
    }
    b64 = comma + 1;
    b64_len = ulen - (size_t)(b64 - u);
    if (b64_len == 0) {
        epd_oai_error_set(err, 400, param, "invalid_image_url", "'%s' holds no image data.",
                          param);
        return EPD_ERR_INVALID_PARAM;
    }
    cap = b64_len / 4 * 3 + 3;
    out = epd_malloc(cap);
    if (out == NULL) {
        epd_oai_oom_error(err);
        return EPD_ERR_NO_MEMORY;
    }
    /* strict base64 (libsodium): padded, or unpadded, nothing else */
    if (sodium_base642bin(out, cap, b64, b64_len, NULL, &out_len, NULL,
                          b64_len % 4 == 0 ? sodium_base64_VARIANT_ORIGINAL
                                           : sodium_base64_VARIANT_ORIGINAL_NO_PADDING) != 0 ||
        out_len == 0) {
        epd_free(out);
        epd_oai_error_set(err, 400, param, "invalid_image_url",
                          "The image data in '%s' is not valid base64.", param);
        return EPD_ERR_INVALID_PARAM;
    }
    if (img == NULL) {
        epd_free(out);
        return EPD_OK;
    }
    img->data = out;
    img->len = out_len;
    img->message = (uint32_t)i;
    img->part = (uint32_t)j;
    return EPD_OK;
}

/* The text of message i's content (a string, or the concatenated text
 * parts): when `dst` is NULL only *len_p (and *n_images_p) are computed;
 * otherwise the text goes to dst, which is the rendered prompt at offset
 * `at`, and each image part is decoded into req->images (its
 * prompt_offset where it stands). */
static epd_status_t epd_oai_message_content(json_t *content, size_t i, char *dst, size_t at,
                                            epd_oai_request_t *req, size_t *len_p,
                                            size_t *n_images_p, epd_oai_error_t *err)
{
    char param[64];
    size_t len = 0;
    size_t n_images = 0;
    size_t j;
    epd_status_t status;

    if (json_is_string(content)) {
        len = json_string_length(content);
        if (dst != NULL) {
            memcpy(dst, json_string_value(content), len);
        }
        *len_p = len;
        *n_images_p = 0;
        return EPD_OK;
    }
    if (!json_is_array(content)) {
        snprintf(param, sizeof(param), "messages[%zu].content", i);
        if (content == NULL) {
            epd_oai_missing_error(err, param);
        } else {
            epd_oai_type_error(err, param, "a string or an array of content parts", content);
        }
        return EPD_ERR_INVALID_PARAM;
    }
    for (j = 0; j < json_array_size(content); j++) {
        json_t *part = json_array_get(content, j);
        json_t *type;
        json_t *text;

        snprintf(param, sizeof(param), "messages[%zu].content[%zu]", i, j);
        if (!json_is_object(part)) {
            epd_oai_type_error(err, param, "an object", part);
            return EPD_ERR_INVALID_PARAM;
        }
        type = json_object_get(part, "type");
        if (json_is_string(type) && strcmp(json_string_value(type), "image_url") == 0) {
            if (dst == NULL) {
                status = epd_oai_image_part(part, i, j, NULL, err);
            } else {
                epd_oai_image_t *img = &req->images[req->n_images];

                status = epd_oai_image_part(part, i, j, img, err);
                if (status == EPD_OK) {
                    img->prompt_offset = at + len;
                    req->n_images++;
                }
            }
            if (status != EPD_OK) {
                return status;
            }
            n_images++;
            continue;
        }
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0) {
            snprintf(param, sizeof(param), "messages[%zu].content[%zu].type", i, j);
            epd_oai_error_set(err, 400, param, NULL,
                              "Unsupported content part type in '%s': only \"text\" and "
                              "\"image_url\" are supported.",
                              param);
            return EPD_ERR_INVALID_PARAM;
        }
        text = json_object_get(part, "text");
        if (!json_is_string(text)) {
            snprintf(param, sizeof(param), "messages[%zu].content[%zu].text", i, j);
            if (text == NULL) {
                epd_oai_missing_error(err, param);
            } else {
                epd_oai_type_error(err, param, "a string", text);
            }
            return EPD_ERR_INVALID_PARAM;
        }
        if (dst != NULL) {
            memcpy(dst + len, json_string_value(text), json_string_length(text));
        }
        len += json_string_length(text);
    }
    *len_p = len;
    *n_images_p = n_images;
    return EPD_OK;
}

static epd_status_t epd_oai_parse_messages(json_t *root, epd_oai_request_t *req,
                                           epd_oai_error_t *err)
{
    static const char tail[] = "<|assistant|>\n";
    json_t *msgs = epd_oai_opt_field(root, "messages");
    size_t total = sizeof(tail) - 1;
    size_t total_images = 0;
    size_t pos = 0;
    size_t i;
    epd_status_t status;

    if (msgs == NULL) {
        epd_oai_missing_error(err, "messages");
        return EPD_ERR_INVALID_PARAM;
    }
    if (!json_is_array(msgs)) {
        epd_oai_type_error(err, "messages", "an array", msgs);
        return EPD_ERR_INVALID_PARAM;
    }
    if (json_array_size(msgs) == 0) {
        epd_oai_error_set(err, 400, "messages", NULL, "'messages' must hold at least one message.");
        return EPD_ERR_INVALID_PARAM;
    }
    /* Pass 1: validate and size; pass 2: render. */
    for (i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        json_t *role;
        char param[64];
        const char *r;
        size_t clen, cimg;

        snprintf(param, sizeof(param), "messages[%zu]", i);
        if (!json_is_object(m)) {
            epd_oai_type_error(err, param, "an object", m);
            return EPD_ERR_INVALID_PARAM;
        }
        role = json_object_get(m, "role");
        snprintf(param, sizeof(param), "messages[%zu].role", i);
        if (role == NULL) {
            epd_oai_missing_error(err, param);
            return EPD_ERR_INVALID_PARAM;
        }
        if (!json_is_string(role)) {
            epd_oai_type_error(err, param, "a string", role);
            return EPD_ERR_INVALID_PARAM;
        }
        r = json_string_value(role);
        if (strcmp(r, "system") != 0 && strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0) {
            epd_oai_error_set(err, 400, param, NULL,
                              "Invalid value for '%s': expected one of 'system', 'user', "
                              "'assistant'.",
                              param);
            return EPD_ERR_INVALID_PARAM;
        }
        status = epd_oai_message_content(epd_oai_opt_field(m, "content"), i, NULL, 0, req, &clen,
                                         &cimg, err);
        if (status != EPD_OK) {
            return status;
        }
        total += 2 + strlen(r) + 3 + clen + 1; /* "<|" role "|>\n" content "\n" */
        total_images += cimg;
    }
    if (total_images > EPD_OAI_MAX_IMAGES) {
        epd_oai_error_set(err, 400, "messages", NULL,
                          "%zu images in one request: at most %d are accepted.", total_images,
                          EPD_OAI_MAX_IMAGES);
        return EPD_ERR_INVALID_PARAM;
    }
    req->prompt = epd_malloc(total + 1);
    req->msgs = epd_calloc(json_array_size(msgs), sizeof(*req->msgs));
    if (req->msgs == NULL) {
        epd_oai_oom_error(err);
        return EPD_ERR_NO_MEMORY;
    }
    if (total_images > 0) {
        req->images = epd_calloc(total_images, sizeof(*req->images));
    }
    if (req->prompt == NULL || (total_images > 0 && req->images == NULL)) {
        epd_oai_oom_error(err);
        return EPD_ERR_NO_MEMORY;
    }
    for (i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        const char *r = json_string_value(json_object_get(m, "role"));
        size_t clen, cimg;

        req->msgs[i].role_off = pos + 2;
        req->msgs[i].role_len = strlen(r);
        pos += (size_t)sprintf(req->prompt + pos, "<|%s|>\n", r);
        status = epd_oai_message_content(epd_oai_opt_field(m, "content"), i, req->prompt + pos, pos,
                                         req, &clen, &cimg, err);
        if (status != EPD_OK) {
            return status; /* out of memory only: pass 1 validated everything */
        }
        req->msgs[i].content_off = pos;
        req->msgs[i].content_len = clen;
        req->n_msgs = i + 1;
        pos += clen;
        req->prompt[pos++] = '\n';
    }
    memcpy(req->prompt + pos, tail, sizeof(tail));
    req->prompt_len = pos + sizeof(tail) - 1;
    return EPD_OK;
}

/* The range epd_oai_parse_number accepts: [lo, hi], or (lo, hi]. */
#define EPD_OAI_RANGE_CLOSED 0x0u
#define EPD_OAI_RANGE_LO_OPEN 0x1u

static epd_status_t epd_oai_parse_number(json_t *root, const char *name, double lo, double hi,
                                         unsigned range, double *value_p, epd_oai_error_t *err)
{
    json_t *v = epd_oai_opt_field(root, name);
    double d;

    if (v == NULL) {
        return EPD_OK;
    }
    if (!json_is_number(v)) {
        epd_oai_type_error(err, name, "a number", v);
        return EPD_ERR_INVALID_PARAM;
    }
    d = json_number_value(v);
    if (d < lo || d > hi || ((range & EPD_OAI_RANGE_LO_OPEN) != 0 && d == lo)) {
        epd_oai_error_set(err, 400, name, NULL, "'%s' must be in %s%g, %g], got %g.", name,
                          (range & EPD_OAI_RANGE_LO_OPEN) != 0 ? "(" : "[", lo, hi, d);
        return EPD_ERR_INVALID_PARAM;
    }
    *value_p = d;
    return EPD_OK;
}

/* An optional integer field: *present_p 1 and *value_p set when given. */
static epd_status_t epd_oai_parse_int(json_t *root, const char *name, int64_t *value_p,
                                      int *present_p, epd_oai_error_t *err)
{
    json_t *v = epd_oai_opt_field(root, name);

    if (v == NULL) {
        return EPD_OK;
    }
    if (!json_is_integer(v)) {
        epd_oai_type_error(err, name, "an integer", v);
        return EPD_ERR_INVALID_PARAM;
    }
    *value_p = (int64_t)json_integer_value(v);
    *present_p = 1;
    return EPD_OK;
}

static epd_status_t epd_oai_parse_bool(json_t *obj, const char *name, const char *param,
                                       int *value_p, epd_oai_error_t *err)
{
    json_t *v = epd_oai_opt_field(obj, name);

    if (v == NULL) {
        return EPD_OK;
    }
    if (!json_is_boolean(v)) {
        epd_oai_type_error(err, param, "a boolean", v);
        return EPD_ERR_INVALID_PARAM;
    }
    *value_p = json_is_true(v);
    return EPD_OK;
}

static epd_status_t epd_oai_add_stop(epd_oai_request_t *req, json_t *s, epd_oai_error_t *err)
{
    if (!json_is_string(s)) {
        epd_oai_type_error(err, "stop", "a string or an array of strings", s);
        return EPD_ERR_INVALID_PARAM;
    }
    if (json_string_length(s) == 0) {
        epd_oai_error_set(err, 400, "stop", NULL, "Stop sequences in 'stop' must not be empty.");
        return EPD_ERR_INVALID_PARAM;
    }
    req->stop[req->n_stop] = epd_strndup(json_string_value(s), json_string_length(s));
    if (req->stop[req->n_stop] == NULL) {
        epd_oai_oom_error(err);
        return EPD_ERR_NO_MEMORY;
    }
    req->n_stop++;
    return EPD_OK;
}

static epd_status_t epd_oai_parse_stop(json_t *root, epd_oai_request_t *req, epd_oai_error_t *err)
{
    json_t *v = epd_oai_opt_field(root, "stop");
    size_t i;
    epd_status_t status;

    if (v == NULL) {
        return EPD_OK;
    }
    if (!json_is_array(v)) {
        return epd_oai_add_stop(req, v, err);
    }
    if (json_array_size(v) > EPD_OAI_MAX_STOP) {
        epd_oai_error_set(err, 400, "stop", NULL, "'stop' takes at most %d sequences, got %zu.",
                          EPD_OAI_MAX_STOP, json_array_size(v));
        return EPD_ERR_INVALID_PARAM;
    }
    for (i = 0; i < json_array_size(v); i++) {
        status = epd_oai_add_stop(req, json_array_get(v, i), err);
        if (status != EPD_OK) {
            return status;
        }
    }
    return EPD_OK;
}

static epd_status_t epd_oai_parse_fields(epd_oai_kind_t kind, json_t *root,
                                         const char *const *models, size_t n_models,
                                         int64_t max_context, epd_oai_request_t *req,
                                         epd_oai_error_t *err)
{
    const char *mt_name = "max_tokens";
    json_t *v;
    json_t *opts;
    int64_t n = 1;
    int has_n = 0;
    size_t i;
    epd_status_t status;

    v = epd_oai_opt_field(root, "model");
    if (v == NULL) {
        epd_oai_missing_error(err, "model");
        return EPD_ERR_INVALID_PARAM;
    }
    if (!json_is_string(v)) {
        epd_oai_type_error(err, "model", "a string", v);
        return EPD_ERR_INVALID_PARAM;
    }
    for (i = 0; i < n_models; i++) {
        if (strcmp(models[i], json_string_value(v)) == 0) {
            break;
        }
    }
    if (i == n_models) {
        epd_oai_error_set(err, 404, "model", "model_not_found",
                          "The model '%.100s' does not exist.", json_string_value(v));
        return EPD_ERR_INVALID_PARAM;
    }
    req->model = epd_strdup(json_string_value(v));
    if (req->model == NULL) {
        epd_oai_oom_error(err);
        return EPD_ERR_NO_MEMORY;
    }

    status = kind == EPD_OAI_CHAT ? epd_oai_parse_messages(root, req, err)
                                  : epd_oai_parse_prompt(root, req, err);
    if (status != EPD_OK) {
        return status;
    }
    req->add_generation_prompt = 1;
    req->enable_thinking = 1;
    if (kind == EPD_OAI_CHAT) {
        /* vLLM's extensions for the model's chat template */
        json_t *kw = epd_oai_opt_field(root, "chat_template_kwargs");

        status = epd_oai_parse_bool(root, "add_generation_prompt", "add_generation_prompt",
                                    &req->add_generation_prompt, err);
        if (status != EPD_OK) {
            return status;
        }
        if (kw != NULL && !json_is_object(kw)) {
            epd_oai_type_error(err, "chat_template_kwargs", "an object", kw);
            return EPD_ERR_INVALID_PARAM;
        }
        if (kw != NULL) {
            status =
                epd_oai_parse_bool(kw, "enable_thinking", "chat_template_kwargs.enable_thinking",
                                   &req->enable_thinking, err);
            if (status != EPD_OK) {
                return status;
            }
        }
    }

    if (epd_oai_opt_field(root, "max_completion_tokens") != NULL) {
        json_t *a = epd_oai_opt_field(root, "max_tokens");
        json_t *b = epd_oai_opt_field(root, "max_completion_tokens");

        /* both: they must agree (one would otherwise be ignored) */
        if (a != NULL && !json_equal(a, b)) {
            epd_oai_error_set(err, 400, "max_completion_tokens", NULL,
                              "'max_tokens' and 'max_completion_tokens' differ: send one.");
            return EPD_ERR_INVALID_PARAM;
        }
        mt_name = "max_completion_tokens";
    }
    status = epd_oai_parse_int(root, mt_name, &req->max_tokens, &req->has_max_tokens, err);
    if (status != EPD_OK) {
        return status;
    }
    if (req->has_max_tokens && req->max_tokens < 1) {
        epd_oai_error_set(err, 400, mt_name, NULL, "'%s' must be at least 1, got %" PRId64 ".",
                          mt_name, req->max_tokens);
        return EPD_ERR_INVALID_PARAM;
    }
    if (req->has_max_tokens && req->max_tokens > max_context) {
        epd_oai_error_set(err, 400, mt_name, "context_length_exceeded",
                          "'%s' is too large: %" PRId64 ". This model's maximum context length "
                          "is %" PRId64 " tokens.",
                          mt_name, req->max_tokens, max_context);
        return EPD_ERR_INVALID_PARAM;
    }

    status = epd_oai_parse_number(root, "temperature", 0.0, 2.0, EPD_OAI_RANGE_CLOSED,
                                  &req->temperature, err);
    if (status != EPD_OK) {
        return status;
    }
    status = epd_oai_parse_number(root, "top_p", 0.0, 1.0, EPD_OAI_RANGE_LO_OPEN, &req->top_p, err);
    if (status != EPD_OK) {
        return status;
    }
    {
        int has_top_k = 0;

        status = epd_oai_parse_int(root, "top_k", &req->top_k, &has_top_k, err);
        if (status != EPD_OK) {
            return status;
        }
        if (req->top_k < -1) {
            epd_oai_error_set(err, 400, "top_k", NULL,
                              "'top_k' must be -1 or 0 (off) or a positive integer, got %" PRId64
                              ".",
                              req->top_k);
            return EPD_ERR_INVALID_PARAM;
        }
        if (req->top_k == -1) {
            req->top_k = 0;
        }
    }
    req->has_temperature = epd_oai_opt_field(root, "temperature") != NULL;
    req->has_top_p = epd_oai_opt_field(root, "top_p") != NULL;
    req->has_top_k = epd_oai_opt_field(root, "top_k") != NULL;
    status = epd_oai_parse_int(root, "seed", &req->seed, &req->has_seed, err);
    if (status != EPD_OK) {
        return status;
    }
    status = epd_oai_parse_int(root, "n", &n, &has_n, err);
    if (status != EPD_OK) {
        return status;
    }
    if (n < 1 || n > EPD_OAI_MAX_N) {
        epd_oai_error_set(err, 400, "n", NULL,
                          "'n' must be an integer from 1 to %d (got %" PRId64 ").", EPD_OAI_MAX_N,
                          n);
        return EPD_ERR_INVALID_PARAM;
    }
    req->n = (uint32_t)n;
    if ((req->n_batch > 0 ? req->n_batch : 1) * req->n > EPD_OAI_MAX_CHOICES) {
        epd_oai_error_set(err, 400, "n", NULL,
                          "'n' x the prompts must be at most %d choices (got %zu).",
                          EPD_OAI_MAX_CHOICES, req->n_batch * req->n);
        return EPD_ERR_INVALID_PARAM;
    }
    status = epd_oai_parse_bool(root, "stream", "stream", &req->stream, err);
    if (status != EPD_OK) {
        return status;
    }
    opts = epd_oai_opt_field(root, "stream_options");
    if (opts != NULL) {
        if (!json_is_object(opts)) {
            epd_oai_type_error(err, "stream_options", "an object", opts);
            return EPD_ERR_INVALID_PARAM;
        }
        if (!req->stream) {
            epd_oai_error_set(err, 400, "stream_options", NULL,
                              "'stream_options' is only allowed when 'stream' is true.");
            return EPD_ERR_INVALID_PARAM;
        }
        status = epd_oai_parse_bool(opts, "include_usage", "stream_options.include_usage",
                                    &req->include_usage, err);
        if (status != EPD_OK) {
            return status;
        }
    }
    status = epd_oai_parse_stop(root, req, err);
    if (status != EPD_OK) {
        return status;
    }
    status = epd__oai_parse_sampling(root, req, err);
    if (status != EPD_OK) {
        return status;
    }
    if (kind == EPD_OAI_COMPLETION) {
        status = epd_oai_parse_bool(root, "echo", "echo", &req->echo, err);
        if (status != EPD_OK) {
            return status;
        }
        if (req->echo && req->want_logprobs) {
            /* the prompt's own logprobs would need a scoring pass the
             * prefill does not make: refused rather than half answered */
            epd_oai_error_set(err, 400, "echo", "unsupported_parameter",
                              "'echo' with 'logprobs' is not supported: this server does not "
                              "compute the prompt's log-probabilities.");
            return EPD_ERR_INVALID_PARAM;
        }
    }
    {
        /* extension: "epd_encode": "local" makes the prefill worker encode
         * this request's images itself, as if there were no encoder pool
         * (epd-bench serve --images compares the two); "auto" (the
         * default) lets the router choose */
        json_t *enc = epd_oai_opt_field(root, "epd_encode");

        if (enc != NULL) {
            if (!json_is_string(enc) || (strcmp(json_string_value(enc), "local") != 0 &&
                                         strcmp(json_string_value(enc), "auto") != 0)) {
                epd_oai_error_set(err, 400, "epd_encode", NULL,
                                  "'epd_encode' must be \"auto\" or \"local\".");
                return EPD_ERR_INVALID_PARAM;
            }
            req->encode_local = strcmp(json_string_value(enc), "local") == 0;
        }
    }
    {
        /* extension (vLLM's name): a tenant's own prefix-cache namespace */
        json_t *salt = epd_oai_opt_field(root, "cache_salt");

        if (salt != NULL) {
            if (!json_is_string(salt) || json_string_length(salt) == 0 ||
                json_string_length(salt) > 256 ||
                strlen(json_string_value(salt)) != json_string_length(salt)) {
                epd_oai_error_set(err, 400, "cache_salt", NULL,
                                  "'cache_salt' must be a string of 1 to 256 bytes.");
                return EPD_ERR_INVALID_PARAM;
            }
            req->cache_salt = epd_strdup(json_string_value(salt));
            if (req->cache_salt == NULL) {
                return EPD_ERR_NO_MEMORY;
            }
        }
    }
    return EPD_OK;
}

epd_status_t epd_oai_request_parse(epd_oai_kind_t kind, const void *body, size_t len,
                                   const char *const *models, size_t n_models, int64_t max_context,
                                   epd_oai_request_t **req_p, epd_oai_error_t *err)
{
    return epd_oai_request_parse_limited(kind, body, len, models, n_models, max_context, NULL,
                                         req_p, err);
}

epd_status_t epd_oai_request_parse_limited(epd_oai_kind_t kind, const void *body, size_t len,
                                           const char *const *models, size_t n_models,
                                           int64_t max_context, const epd_oai_limits_t *limits,
                                           epd_oai_request_t **req_p, epd_oai_error_t *err)
{
    epd_oai_limits_t defaults;
    epd_oai_request_t *req;
    json_error_t jerr;
    json_t *root;
    epd_status_t status;

    if ((body == NULL && len > 0) || (models == NULL && n_models > 0) || max_context < 1 ||
        req_p == NULL || err == NULL || (kind != EPD_OAI_COMPLETION && kind != EPD_OAI_CHAT)) {
        if (err != NULL) {
            epd_oai_error_set(err, 500, NULL, NULL, "Internal error: bad parse arguments.");
        }
        return EPD_ERR_INVALID_PARAM;
    }
    if (limits == NULL) {
        epd_oai_limits_init(&defaults);
        limits = &defaults;
    }
    /* the limits on the bytes, before jansson allocates a node */
    status = epd_oai_json_check(body != NULL ? body : "", len, limits, err);
    if (status != EPD_OK) {
        return status;
    }
    root = json_loadb(body != NULL ? body : "", len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        if (json_error_code(&jerr) == json_error_invalid_utf8) {
            epd_oai_error_set(err, 400, NULL, NULL,
                              "The request body is not valid UTF-8 (bad byte near position %d). "
                              "Send JSON text encoded as UTF-8.",
                              jerr.position);
        } else if (json_error_code(&jerr) == json_error_null_character) {
            /* jansson's own text names its JSON_ALLOW_NUL flag: say it in
             * the client's terms */
            epd_oai_error_set(err, 400, NULL, NULL,
                              "The request body holds a NUL character (\\u0000) in a string "
                              "(line %d, column %d): NUL characters are not allowed in strings.",
                              jerr.line, jerr.column);
        } else {
            epd_oai_error_set(err, 400, NULL, NULL,
                              "We could not parse the JSON body of your request: %s (line %d, "
                              "column %d).",
                              jerr.text, jerr.line, jerr.column);
        }
        return EPD_ERR_INVALID_PARAM;
    }
    if (!json_is_object(root)) {
        epd_oai_error_set(err, 400, NULL, NULL, "The request body must be a JSON object, not %s.",
                          epd_oai_json_type_name(root));
        status = EPD_ERR_INVALID_PARAM;
        goto err_decref;
    }
    /* nothing silently ignored: every key is known, and one that is not
     * implemented is refused naming it (epd_openai_fields.c) */
    status = epd__oai_fields_check(kind, root, err);
    if (status != EPD_OK) {
        goto err_decref;
    }
    req = epd_calloc(1, sizeof(*req));
    if (req == NULL) {
        epd_oai_oom_error(err);
        status = EPD_ERR_NO_MEMORY;
        goto err_decref;
    }
    req->kind = kind;
    req->temperature = 1.0;
    req->top_p = 1.0;
    req->repetition_penalty = 1.0;
    status = epd_oai_parse_fields(kind, root, models, n_models, max_context, req, err);
    if (status != EPD_OK) {
        goto err_destroy_req;
    }
    json_decref(root);
    *req_p = req;
    return EPD_OK;

err_destroy_req:
    epd_oai_request_destroy(req);
err_decref:
    json_decref(root);
    return status;
}

epd_status_t epd_oai_check_length(const epd_oai_request_t *req, int64_t prompt_tokens,
                                  int64_t max_context, int64_t *max_new_p, epd_oai_error_t *err)
{
    const char *what = req->kind == EPD_OAI_CHAT ? "messages" : "prompt";
    int64_t room;
    int64_t max_new;

    if (prompt_tokens < 0 || max_context < 1) {
        epd_oai_error_set(err, 500, NULL, NULL, "Internal error: bad length arguments.");
        return EPD_ERR_INVALID_PARAM;
    }
    /* One rule at every boundary: prompt + completion <= max_context, with
     * at least one completion token; every refusal of it is
     * context_length_exceeded, as the router's early refusal by bytes is. */
    room = max_context - prompt_tokens;
    if (room < 1) {
        epd_oai_error_set(err, 400, what, "context_length_exceeded",
                          "This model's maximum context length is %" PRId64 " tokens. However, "
                          "your %s is %" PRId64 " tokens, which leaves no room for a completion. "
                          "Please reduce the length of the %s.",
                          max_context, what, prompt_tokens, what);
        return EPD_ERR_INVALID_PARAM;
    }
    if (req->has_max_tokens) {
        if (req->max_tokens > room) {
            epd_oai_error_set(err, 400, "max_tokens", "context_length_exceeded",
                              "This model's maximum context length is %" PRId64 " tokens. "
                              "However, you requested %" PRId64 " tokens (%" PRId64 " in the "
                              "%s, %" PRId64 " in the completion). Please reduce the length of "
                              "the %s or completion.",
                              max_context, prompt_tokens + req->max_tokens, prompt_tokens, what,
                              req->max_tokens, what);
            return EPD_ERR_INVALID_PARAM;
        }
        max_new = req->max_tokens;
    } else if (req->kind == EPD_OAI_COMPLETION) {
        max_new = room < 16 ? room : 16;
    } else {
        max_new = room;
    }
    *max_new_p = max_new;
    return EPD_OK;
}

