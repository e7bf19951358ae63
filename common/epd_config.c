/*
 * epd_config.c — table-driven flag and config-file parsing.
 *
 * Numbers are parsed with strtoll/strtod and must consume the whole value;
 * integers also accept the binary suffixes k, m, g (KV capacities and sizes
 * are easier to write as "64m").
 */
#include "epd_config.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_log.h"

static const epd_opt_t *epd_opts_find(const epd_opts_t *o, const char *name, size_t len)
{
    for (size_t i = 0; i < o->n_opts; i++) {
        if (strlen(o->opts[i].name) == len && strncmp(o->opts[i].name, name, len) == 0) {
            return &o->opts[i];
        }
    }
    return NULL;
}

static epd_status_t epd_opts_keep(epd_opts_t *o, const char *value, char **copy_p)
{
    char *copy;

    if (o->n_owned_ == o->cap_owned_) {
        size_t cap = o->cap_owned_ ? o->cap_owned_ * 2 : 8;
        char **grown = epd_realloc(o->owned_, cap * sizeof(*grown));

        if (grown == NULL) {
            return EPD_ERR_NO_MEMORY;
        }
        o->owned_ = grown;
        o->cap_owned_ = cap;
    }
    copy = epd_strdup(value);
    if (copy == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    o->owned_[o->n_owned_++] = copy;
    *copy_p = copy;
    return EPD_OK;
}

static int epd_opts_in_range(const epd_opt_t *opt, double v)
{
    return opt->min == opt->max || (v >= opt->min && v <= opt->max);
}

static epd_status_t epd_opts_bad(const epd_opts_t *o, const char *name, const char *value,
                                 const char *why)
{
    epd_log_error(o->prog, 0, "--%s: invalid value '%s': %s", name, value, why);
    return EPD_ERR_INVALID_PARAM;
}

static epd_status_t epd_opts_apply(epd_opts_t *o, const epd_opt_t *opt, const char *value)
{
    char *end = NULL;
    char *copy;
    epd_status_t status;

    switch (opt->type) {
    case EPD_OPT_STRING:
        status = epd_opts_keep(o, value, &copy);
        if (status != EPD_OK) {
            return status;
        }
        *(const char **)opt->value = copy;
        return EPD_OK;
    case EPD_OPT_INT: {
        long long v;
        long long mul = 1;

        errno = 0;
        v = strtoll(value, &end, 0);
        if (end == value || errno != 0) {
            return epd_opts_bad(o, opt->name, value, "not an integer");
        }
        if (*end == 'k' || *end == 'K') {
            mul = 1LL << 10;
            end++;
        } else if (*end == 'm' || *end == 'M') {
            mul = 1LL << 20;
            end++;
        } else if (*end == 'g' || *end == 'G') {
            mul = 1LL << 30;
            end++;
        }
        if (*end != '\0') {
            return epd_opts_bad(o, opt->name, value, "not an integer");
        }
        if (__builtin_mul_overflow(v, mul, &v)) {
            return epd_opts_bad(o, opt->name, value, "integer overflow");
        }
        if (!epd_opts_in_range(opt, (double)v)) {
            epd_log_error(o->prog, 0, "--%s: %s is outside the allowed range [%.0f, %.0f]",
                          opt->name, value, opt->min, opt->max);
            return EPD_ERR_INVALID_PARAM;
        }
        *(int64_t *)opt->value = (int64_t)v;
        return EPD_OK;
    }
    case EPD_OPT_DOUBLE: {
        double v;

        errno = 0;
        v = strtod(value, &end);
        if (end == value || *end != '\0' || errno != 0 || !isfinite(v)) {
            return epd_opts_bad(o, opt->name, value, "not a finite number");
        }
        if (!epd_opts_in_range(opt, v)) {
            epd_log_error(o->prog, 0, "--%s: %s is outside the allowed range [%g, %g]", opt->name,
                          value, opt->min, opt->max);
            return EPD_ERR_INVALID_PARAM;
        }
        *(double *)opt->value = v;
        return EPD_OK;
    }
    case EPD_OPT_BOOL:
        if (strcmp(value, "1") == 0 || strcmp(value, "true") == 0 || strcmp(value, "yes") == 0 ||
            strcmp(value, "on") == 0) {
            *(int *)opt->value = 1;
            return EPD_OK;
        }
        if (strcmp(value, "0") == 0 || strcmp(value, "false") == 0 || strcmp(value, "no") == 0 ||
            strcmp(value, "off") == 0) {
            *(int *)opt->value = 0;
            return EPD_OK;
        }
        return epd_opts_bad(o, opt->name, value, "expected true/false, yes/no, on/off or 1/0");
    }
    return EPD_ERR_INVALID_PARAM;
}

epd_status_t epd_opts_set(epd_opts_t *o, const char *name, const char *value)
{
    const epd_opt_t *opt = epd_opts_find(o, name, strlen(name));

    if (opt == NULL) {
        epd_log_error(o->prog, 0, "unknown option '%s' (see --help)", name);
        return EPD_ERR_INVALID_PARAM;
    }
    return epd_opts_apply(o, opt, value);
}

static char *epd_opts_trim(char *s)
{
    char *end;

    while (*s == ' ' || *s == '\t') {
        s++;
    }
    end = s + strlen(s);
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r' || end[-1] == '\n')) {
        *--end = '\0';
    }
    return s;
}

epd_status_t epd_opts_load_file(epd_opts_t *o, const char *path)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    unsigned lineno = 0;
    epd_status_t status = EPD_OK;

    if (f == NULL) {
        epd_log_error(o->prog, 0, "cannot open config file '%s': %s", path, strerror(errno));
        return EPD_ERR_INVALID_PARAM;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        char *name;
        char *value;
        char *sep;
        char *hash;

        lineno++;
        if (strchr(line, '\n') == NULL && !feof(f)) {
            epd_log_error(o->prog, 0, "%s:%u: line longer than %zu bytes", path, lineno,
                          sizeof(line) - 1);
            status = EPD_ERR_INVALID_PARAM;
            break;
        }
        hash = strchr(line, '#');
        if (hash != NULL) {
            *hash = '\0';
        }
        name = epd_opts_trim(line);
        if (*name == '\0') {
            continue;
        }
        sep = strpbrk(name, "= \t");
        if (sep == NULL) {
            epd_log_error(o->prog, 0, "%s:%u: expected 'name = value'", path, lineno);
            status = EPD_ERR_INVALID_PARAM;
            break;
        }
        value = sep + strspn(sep, "= \t");
        *sep = '\0';
        value = epd_opts_trim(value);
        if (strcmp(name, "config") == 0) {
            epd_log_error(o->prog, 0, "%s:%u: config files do not nest", path, lineno);
            status = EPD_ERR_INVALID_PARAM;
            break;
        }
        status = epd_opts_set(o, name, value);
        if (status != EPD_OK) {
            epd_log_error(o->prog, 0, "(in %s:%u)", path, lineno);
            break;
        }
    }
    fclose(f);
    return status;
}

epd_status_t epd_opts_parse(epd_opts_t *o, int argc, char *const argv[], int *argi_p)
{
    int i;
    epd_status_t status;

    for (i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *name;
        const char *eq;
        const char *value;
        size_t len;
        const epd_opt_t *opt;

        if (strcmp(arg, "--") == 0) {
            i++;
            break;
        }
        if (strncmp(arg, "--", 2) != 0) {
            break;
        }
        name = arg + 2;
        eq = strchr(name, '=');
        len = eq != NULL ? (size_t)(eq - name) : strlen(name);
        if (len == 4 && strncmp(name, "help", 4) == 0) {
            epd_opts_usage(o, stdout);
            return EPD_ERR_CANCELED;
        }
        if (len == 6 && strncmp(name, "config", 6) == 0) {
            if (eq == NULL && i + 1 >= argc) {
                epd_log_error(o->prog, 0, "--config needs a file name");
                return EPD_ERR_INVALID_PARAM;
            }
            status = epd_opts_load_file(o, eq != NULL ? eq + 1 : argv[++i]);
            if (status != EPD_OK) {
                return status;
            }
            continue;
        }
        opt = epd_opts_find(o, name, len);
        if (opt == NULL && eq == NULL && len > 3 && strncmp(name, "no-", 3) == 0) {
            opt = epd_opts_find(o, name + 3, len - 3);
            if (opt != NULL && opt->type == EPD_OPT_BOOL) {
                *(int *)opt->value = 0;
                continue;
            }
            opt = NULL;
        }
        if (opt == NULL) {
            epd_log_error(o->prog, 0, "unknown option '--%.*s' (see --help)", (int)len, name);
            return EPD_ERR_INVALID_PARAM;
        }
        if (eq != NULL) {
            value = eq + 1;
        } else if (opt->type == EPD_OPT_BOOL) {
            value = "1";
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            epd_log_error(o->prog, 0, "--%s needs a value", opt->name);
            return EPD_ERR_INVALID_PARAM;
        }
        status = epd_opts_apply(o, opt, value);
        if (status != EPD_OK) {
            return status;
        }
    }
    *argi_p = i;
    return EPD_OK;
}

void epd_opts_usage(const epd_opts_t *o, FILE *out)
{
    fprintf(out, "usage: %s [options]\n", o->prog);
    if (o->summary != NULL) {
        fprintf(out, "%s\n", o->summary);
    }
    fprintf(out, "\noptions:\n");
    for (size_t i = 0; i < o->n_opts; i++) {
        const epd_opt_t *opt = &o->opts[i];
        char def[64];

        switch (opt->type) {
        case EPD_OPT_STRING: {
            const char *s = *(const char **)opt->value;

            snprintf(def, sizeof(def), "%s", s != NULL ? s : "(none)");
            break;
        }
        case EPD_OPT_INT:
            snprintf(def, sizeof(def), "%lld", (long long)*(int64_t *)opt->value);
            break;
        case EPD_OPT_DOUBLE:
            snprintf(def, sizeof(def), "%g", *(double *)opt->value);
            break;
        case EPD_OPT_BOOL:
            snprintf(def, sizeof(def), "%s", *(int *)opt->value ? "on" : "off");
            break;
        }
        fprintf(out, "  --%-22s %s [%s]\n", opt->name, opt->help != NULL ? opt->help : "", def);
    }
    fprintf(out, "  --%-22s %s\n", "config FILE", "read 'name = value' lines from FILE");
    fprintf(out, "  --%-22s %s\n", "help", "print this help");
}

void epd_opts_cleanup(epd_opts_t *o)
{
    for (size_t i = 0; i < o->n_owned_; i++) {
        epd_free(o->owned_[i]);
    }
    epd_free(o->owned_);
    o->owned_ = NULL;
    o->n_owned_ = 0;
    o->cap_owned_ = 0;
}
