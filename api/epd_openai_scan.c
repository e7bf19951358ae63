/*
 * epd_openai_scan.c — the limits of a request body's JSON (epd_oai_limits_t,
 * see epd_openai.h), checked on its bytes before jansson parses it.
 *
 * Why before: jansson builds a tree with one allocation per value and
 * recurses once per nesting level, so a 16 MiB body of "[1,1,1,..." costs
 * hundreds of MiB and one of "[[[[..." a deep stack before any field is
 * looked at.  One pass with a handful of counters refuses both first:
 *
 *   depth     '[' and '{' outside strings, less ']' and '}';
 *   elements  a container's first element is counted when the first
 *             byte of a value (or key) follows its opening bracket, every
 *             later one at its ',' — so "[]" and "{}" hold none, and
 *             "{"a": 1, "b": [2, 3]}" holds four;
 *   strings   the bytes between the quotes as sent, an escape's bytes
 *             included (at least the decoded length).
 *
 * Invalid JSON is not judged here (unbalanced brackets only stop counting
 * below zero); the parser refuses it with its own message.
 *
 * Stands on epd_openai_json.c (error objects); called by the parser.
 */
#include <inttypes.h>

#include "epd_openai_int.h"

void epd_oai_limits_init(epd_oai_limits_t *limits)
{
    limits->max_depth = EPD_OAI_MAX_DEPTH;
    limits->max_elements = EPD_OAI_MAX_ELEMENTS;
    limits->max_string_bytes = EPD_OAI_MAX_STRING_BYTES;
}

epd_status_t epd_oai_json_check(const void *body, size_t len, const epd_oai_limits_t *limits,
                                epd_oai_error_t *err)
{
    const unsigned char *b = body;
    uint64_t depth = 0;
    uint64_t elements = 0;
    int pending = 0; /* the innermost container was just opened: no element yet */
    size_t i = 0;

    while (i < len) {
        unsigned char c = b[i];

        if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ':') {
            i++;
            continue;
        }
        if (c == ']' || c == '}') {
            depth -= depth > 0;
            pending = 0;
            i++;
            continue;
        }
        if (c == ',') {
            elements++;
        } else if (pending) {
            elements++; /* the first byte of the container's first value or key */
            pending = 0;
        }
        if (elements > limits->max_elements) {
            epd_oai_error_set(err, 400, NULL, "json_too_many_elements",
                              "The request body's JSON holds more than %" PRIu64
                              " array elements and object members in all (the limit).",
                              limits->max_elements);
            return EPD_ERR_INVALID_PARAM;
        }
        if (c == '[' || c == '{') {
            if (++depth > limits->max_depth) {
                epd_oai_error_set(err, 400, NULL, "json_too_deep",
                                  "The request body's JSON nests arrays and objects more than "
                                  "%" PRIu32 " levels deep (the limit).",
                                  limits->max_depth);
                return EPD_ERR_INVALID_PARAM;
            }
            pending = 1;
            i++;
            continue;
        }
        if (c == '"') {
            size_t start = ++i;

            while (i < len && b[i] != '"') {
                i += b[i] == '\\' ? 2 : 1;
            }
            if (i > len) {
                i = len; /* an escape cut by the end of the body */
            }
            if (i - start > limits->max_string_bytes) {
                epd_oai_error_set(err, 400, NULL, "json_string_too_long",
                                  "The request body's JSON holds a string of more than %zu bytes "
                                  "(the limit).",
                                  limits->max_string_bytes);
                return EPD_ERR_INVALID_PARAM;
            }
            i++; /* the closing quote */
            continue;
        }
        i++; /* a number, a literal, a comma, or bytes the parser will refuse */
    }
    return EPD_OK;
}
