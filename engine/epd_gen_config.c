/*
 * epd_gen_config.c — generation_config.json's default sampling (see the
 * header).  Ranges are the OpenAI API's, which the router enforces on a
 * request's own values, so a default is never something a client could not
 * have asked for.
 */
#include "epd_gen_config.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "epd_log.h"

#define EPD_GEN_LOG "engine"

/* One optional number key in [lo, hi] (lo excluded when lo_open). */
static epd_status_t epd_gen_number(const char *path, json_t *root, const char *key, double lo,
                                   double hi, int lo_open, int *has_p, double *value_p)
{
    json_t *v = json_object_get(root, key);
    double d;

    if (v == NULL || json_is_null(v)) {
        return EPD_OK;
    }
    if (!json_is_number(v)) {
        epd_log_error(EPD_GEN_LOG, 0, "%s: '%s' is not a number", path, key);
        return EPD_ERR_MALFORMED;
    }
    d = json_number_value(v);
    if (!(d >= lo && d <= hi) || (lo_open && d == lo)) {
        epd_log_error(EPD_GEN_LOG, 0, "%s: '%s' = %g is outside %s%g, %g]", path, key, d,
                      lo_open ? "(" : "[", lo, hi);
        return EPD_ERR_MALFORMED;
    }
    *has_p = 1;
    *value_p = d;
    return EPD_OK;
}

epd_status_t epd_gen_defaults_load(const char *dir, epd_gen_defaults_t *out_p)
{
    epd_gen_defaults_t d;
    char path[4096];
    struct stat sb;
    json_error_t jerr;
    json_t *root;
    json_t *k;
    epd_status_t status;
    double top_k = 0;
    int n;

    memset(&d, 0, sizeof(d));
    memset(out_p, 0, sizeof(*out_p));
    if (dir == NULL) {
        return EPD_OK;
    }
    n = snprintf(path, sizeof(path), "%s/generation_config.json", dir);
    if (n < 0 || (size_t)n >= sizeof(path)) {
        epd_log_error(EPD_GEN_LOG, 0, "model folder path too long: %s", dir);
        return EPD_ERR_INVALID_PARAM;
    }
    if (stat(path, &sb) != 0) {
        if (errno == ENOENT) {
            return EPD_OK;
        }
        epd_log_error(EPD_GEN_LOG, 0, "%s: %s", path, strerror(errno));
        return EPD_ERR_IO;
    }
    root = json_load_file(path, 0, &jerr);
    if (root == NULL || !json_is_object(root)) {
        epd_log_error(EPD_GEN_LOG, 0, "%s: not a JSON object (line %d: %s)", path, jerr.line,
                      root == NULL ? jerr.text : "another type");
        json_decref(root);
        return EPD_ERR_MALFORMED;
    }
    status = epd_gen_number(path, root, "temperature", 0.0, 2.0, 0, &d.has_temperature,
                            &d.temperature);
    if (status == EPD_OK) {
        status = epd_gen_number(path, root, "top_p", 0.0, 1.0, 1, &d.has_top_p, &d.top_p);
    }
    k = json_object_get(root, "top_k");
    if (status == EPD_OK && k != NULL && !json_is_null(k)) {
        /* Hugging Face's "off" is 0 (transformers) or -1 (vLLM): both off */
        if (!json_is_integer(k) || json_integer_value(k) < -1) {
            epd_log_error(EPD_GEN_LOG, 0, "%s: 'top_k' is not an integer >= -1", path);
            status = EPD_ERR_MALFORMED;
        } else {
            top_k = (double)json_integer_value(k);
            d.has_top_k = 1;
            d.top_k = top_k > 0 ? (int64_t)top_k : 0;
        }
    }
    json_decref(root);
    if (status == EPD_OK) {
        *out_p = d;
    }
    return status;
}
