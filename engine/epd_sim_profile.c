/*
 * epd_sim_profile.c — the `sim` engine's text files: model and accelerator
 * profiles and sim.conf (see epd_sim.h for the keys).
 *
 * One table-driven reader serves all three: each file type lists its keys
 * (type, range, where the value goes), the reader fills a struct through
 * offsets, and refuses the first problem with "FILE:LINE: why".  Checks that
 * involve several keys (the pattern against n_layers, GQA divisibility,
 * active <= total) run after, with the file name alone.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_sim.h"

#define EPD_SIM_LOG "sim"
#define EPD_SIM_FILE_MAX (1u << 20) /* profiles are a few hundred bytes */
#define EPD_SIM_PATH_MAX 4096

typedef enum {
    EPD_SIM_V_TEXT,    /* char[EPD_SIM_NAME_MAX] */
    EPD_SIM_V_PATH,    /* char[EPD_SIM_PATH_MAX] */
    EPD_SIM_V_U32,     /* uint32_t, [min, max] */
    EPD_SIM_V_U64,     /* uint64_t, [min, max] */
    EPD_SIM_V_DOUBLE,  /* double, finite, (min, max] */
    EPD_SIM_V_PATTERN, /* char[EPD_KV_MAX_LAYERS + 1] of L / A */
    EPD_SIM_V_DTYPE,   /* epd_dtype_t */
    EPD_SIM_V_MODE,    /* epd_sim_mode_t */
    EPD_SIM_V_KVMAP,   /* char[EPD_KVQ_MAP_MAX]: checked against the model later */
} epd_sim_vtype_t;

typedef struct {
    const char *key;
    epd_sim_vtype_t type;
    size_t offset;
    double min;
    double max;
    int required;
} epd_sim_key_t;

#define EPD_SIM_MAX_KEYS 16

/* ---- the reader ----------------------------------------------------------- */

static char *epd_sim_trim(char *s, char *end)
{
    while (s < end && (*s == ' ' || *s == '\t' || *s == '\r')) {
        s++;
    }
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r')) {
        end--;
    }
    *end = '\0';
    return s;
}

static int epd_sim_parse_u64(const char *v, uint64_t *out)
{
    char *end;
    unsigned long long x;

    if (v[0] < '0' || v[0] > '9') {
        return 0;
    }
    errno = 0;
    x = strtoull(v, &end, 10);
    if (errno != 0 || *end != '\0') {
        return 0;
    }
    *out = x;
    return 1;
}

static int epd_sim_parse_double(const char *v, double *out)
{
    char *end;
    double x;

    errno = 0;
    x = strtod(v, &end);
    if (end == v || *end != '\0' || errno != 0 || !isfinite(x)) {
        return 0;
    }
    *out = x;
    return 1;
}

/* Stores `value` for key `k` into `dst`; NULL on success, else why not
 * (static text, or `why` filled). */
static const char *epd_sim_store(const epd_sim_key_t *k, const char *value, void *dst, char *why,
                                 size_t why_len)
{
    char *field = (char *)dst + k->offset;
    uint64_t u;
    double d;

    switch (k->type) {
    case EPD_SIM_V_TEXT:
        if (strlen(value) >= EPD_SIM_NAME_MAX) {
            snprintf(why, why_len, "value of '%s' longer than %d characters", k->key,
                     EPD_SIM_NAME_MAX - 1);
            return why;
        }
        strcpy(field, value);
        return NULL;
    case EPD_SIM_V_KVMAP:
        if (strlen(value) >= EPD_KVQ_MAP_MAX) {
            snprintf(why, why_len, "value of '%s' longer than %d characters", k->key,
                     EPD_KVQ_MAP_MAX - 1);
            return why;
        }
        strcpy(field, value);
        return NULL;
    case EPD_SIM_V_PATH:
        if (strlen(value) >= EPD_SIM_PATH_MAX) {
            snprintf(why, why_len, "path of '%s' too long", k->key);
            return why;
        }
        strcpy(field, value);
        return NULL;
    case EPD_SIM_V_U32:
    case EPD_SIM_V_U64:
        if (!epd_sim_parse_u64(value, &u)) {
            snprintf(why, why_len, "bad number '%.80s' for '%s' (a whole number)", value, k->key);
            return why;
        }
        if ((double)u < k->min || (double)u > k->max) {
            snprintf(why, why_len, "'%s' = %.80s out of range [%.0f, %.0f]", k->key, value, k->min,
                     k->max);
            return why;
        }
        if (k->type == EPD_SIM_V_U32) {
            uint32_t v32 = (uint32_t)u;

            memcpy(field, &v32, sizeof(v32));
        } else {
            memcpy(field, &u, sizeof(u));
        }
        return NULL;
    case EPD_SIM_V_DOUBLE:
        if (!epd_sim_parse_double(value, &d)) {
            snprintf(why, why_len, "bad number '%.80s' for '%s'", value, k->key);
            return why;
        }
        if (!(d > k->min) || d > k->max) {
            snprintf(why, why_len, "'%s' = %.80s out of range (%g, %g]", k->key, value, k->min,
                     k->max);
            return why;
        }
        memcpy(field, &d, sizeof(d));
        return NULL;
    case EPD_SIM_V_PATTERN: {
        size_t n = strlen(value);

        if (n == 0 || n > EPD_KV_MAX_LAYERS) {
            snprintf(why, why_len, "'%s' must have 1..%d letters", k->key, EPD_KV_MAX_LAYERS);
            return why;
        }
        for (size_t i = 0; i < n; i++) {
            if (value[i] != 'L' && value[i] != 'A') {
                snprintf(why, why_len,
                         "'%s' = %.80s: letter '%c' is neither L (linear) nor A (attention)",
                         k->key, value, value[i]);
                return why;
            }
        }
        strcpy(field, value);
        return NULL;
    }
    case EPD_SIM_V_DTYPE: {
        epd_dtype_t t;

        if (strcasecmp(value, "BF16") == 0) {
            t = EPD_DTYPE_BF16;
        } else if (strcasecmp(value, "F16") == 0) {
            t = EPD_DTYPE_F16;
        } else if (strcasecmp(value, "F32") == 0) {
            t = EPD_DTYPE_F32;
        } else {
            snprintf(why, why_len, "'%s' = %.80s: not BF16, F16 or F32", k->key, value);
            return why;
        }
        memcpy(field, &t, sizeof(t));
        return NULL;
    }
    case EPD_SIM_V_MODE: {
        epd_sim_mode_t m;

        if (strcmp(value, "sleep") == 0) {
            m = EPD_SIM_SLEEP;
        } else if (strcmp(value, "spin") == 0) {
            m = EPD_SIM_SPIN;
        } else {
            snprintf(why, why_len, "'%s' = %.80s: not sleep or spin", k->key, value);
            return why;
        }
        memcpy(field, &m, sizeof(m));
        return NULL;
    }
    }
    return "internal: unknown value type";
}

/* Reads "key = value" lines of text[0..len) into dst through keys[0..n). */
static epd_status_t epd_sim_read_keys(const char *text, size_t len, const char *origin,
                                      const epd_sim_key_t *keys, size_t n_keys, void *dst)
{
    int seen[EPD_SIM_MAX_KEYS] = {0};
    char *copy;
    char *line;
    char *next;
    unsigned lineno = 0;
    epd_status_t status = EPD_ERR_MALFORMED;

    if (memchr(text, '\0', len) != NULL) {
        epd_log_error(EPD_SIM_LOG, 0, "%s: contains a NUL byte (not a text file)", origin);
        return EPD_ERR_MALFORMED;
    }
    copy = epd_strndup(text, len);
    if (copy == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    for (line = copy; line != NULL; line = next) {
        char *nl = strchr(line, '\n');
        char *hash;
        char *eq;
        char *key;
        char *value;
        const epd_sim_key_t *k = NULL;
        size_t ki;
        char why[512];
        const char *problem;

        lineno++;
        next = nl != NULL ? nl + 1 : NULL;
        if (nl != NULL) {
            *nl = '\0';
        }
        hash = strchr(line, '#');
        if (hash != NULL) {
            *hash = '\0';
        }
        line = epd_sim_trim(line, line + strlen(line));
        if (line[0] == '\0') {
            continue;
        }
        eq = strchr(line, '=');
        if (eq == NULL) {
            epd_log_error(EPD_SIM_LOG, 0, "%s:%u: expected 'key = value', got '%s'", origin, lineno,
                          line);
            goto out;
        }
        key = epd_sim_trim(line, eq);
        value = epd_sim_trim(eq + 1, eq + 1 + strlen(eq + 1));
        for (ki = 0; ki < n_keys; ki++) {
            if (strcmp(keys[ki].key, key) == 0) {
                k = &keys[ki];
                break;
            }
        }
        if (k == NULL) {
            epd_log_error(EPD_SIM_LOG, 0, "%s:%u: unknown key '%s'", origin, lineno, key);
            goto out;
        }
        if (seen[ki]) {
            epd_log_error(EPD_SIM_LOG, 0, "%s:%u: key '%s' given twice", origin, lineno, key);
            goto out;
        }
        if (value[0] == '\0') {
            epd_log_error(EPD_SIM_LOG, 0, "%s:%u: no value for '%s'", origin, lineno, key);
            goto out;
        }
        problem = epd_sim_store(k, value, dst, why, sizeof(why));
        if (problem != NULL) {
            epd_log_error(EPD_SIM_LOG, 0, "%s:%u: %s", origin, lineno, problem);
            goto out;
        }
        seen[ki] = 1;
    }
    for (size_t i = 0; i < n_keys; i++) {
        if (keys[i].required && !seen[i]) {
            epd_log_error(EPD_SIM_LOG, 0, "%s: missing key '%s'", origin, keys[i].key);
            goto out;
        }
    }
    status = EPD_OK;
out:
    epd_free(copy);
    return status;
}

/* Reads a whole (small) file into a new NUL-terminated buffer. */
static epd_status_t epd_sim_read_file(const char *path, char **text_p, size_t *len_p)
{
    struct stat st;
    FILE *f;
    char *buf;
    size_t len;

    f = fopen(path, "rb");
    if (f == NULL) {
        epd_log_error(EPD_SIM_LOG, 0, "cannot open %s: %s", path, strerror(errno));
        return errno == ENOENT ? EPD_ERR_NOT_FOUND : EPD_ERR_IO;
    }
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        epd_log_error(EPD_SIM_LOG, 0, "%s: not a regular file", path);
        fclose(f);
        return EPD_ERR_IO;
    }
    if ((uint64_t)st.st_size > EPD_SIM_FILE_MAX) {
        epd_log_error(EPD_SIM_LOG, 0, "%s: larger than %u bytes (not a profile)", path,
                      EPD_SIM_FILE_MAX);
        fclose(f);
        return EPD_ERR_MALFORMED;
    }
    buf = epd_malloc((size_t)st.st_size + 1);
    if (buf == NULL) {
        fclose(f);
        return EPD_ERR_NO_MEMORY;
    }
    len = fread(buf, 1, (size_t)st.st_size, f);
    if (ferror(f) || len != (size_t)st.st_size) {
        epd_log_error(EPD_SIM_LOG, 0, "cannot read %s", path);
        fclose(f);
        epd_free(buf);
        return EPD_ERR_IO;
    }
    fclose(f);
    buf[len] = '\0';
    *text_p = buf;
    *len_p = len;
    return EPD_OK;
}

/* ---- model profile -------------------------------------------------------- */

#define EPD_SIM_M(field) offsetof(epd_sim_model_t, field)

static const epd_sim_key_t epd_sim_model_keys[] = {
    {"name", EPD_SIM_V_TEXT, EPD_SIM_M(name), 0, 0, 1},
    {"n_layers", EPD_SIM_V_U32, EPD_SIM_M(n_layers), 1, EPD_KV_MAX_LAYERS, 1},
    {"layer_pattern", EPD_SIM_V_PATTERN, EPD_SIM_M(layer_pattern), 0, 0, 1},
    {"hidden", EPD_SIM_V_U32, EPD_SIM_M(hidden), 1, 1 << 20, 1},
    {"n_heads", EPD_SIM_V_U32, EPD_SIM_M(n_heads), 1, 1 << 16, 1},
    {"n_kv_heads", EPD_SIM_V_U32, EPD_SIM_M(n_kv_heads), 1, 1 << 16, 1},
    {"head_dim", EPD_SIM_V_U32, EPD_SIM_M(head_dim), 1, 4096, 1},
    {"kv_dtype", EPD_SIM_V_DTYPE, EPD_SIM_M(kv_dtype), 0, 0, 1},
    {"state_bytes", EPD_SIM_V_U64, EPD_SIM_M(state_bytes), 0, (double)(1ull << 40), 1},
    {"active_params", EPD_SIM_V_DOUBLE, EPD_SIM_M(active_params), 0, 1e15, 1},
    {"total_params", EPD_SIM_V_DOUBLE, EPD_SIM_M(total_params), 0, 1e15, 1},
    {"weight_bytes", EPD_SIM_V_DOUBLE, EPD_SIM_M(weight_bytes), 0, 8, 1},
    {"vocab", EPD_SIM_V_U32, EPD_SIM_M(vocab), 258, INT32_MAX, 1},
    {"max_context", EPD_SIM_V_U32, EPD_SIM_M(max_context), 1, INT32_MAX, 1},
};

epd_status_t epd_sim_model_parse(const char *text, size_t len, const char *origin,
                                 epd_sim_model_t *model_p)
{
    epd_sim_model_t m;
    epd_status_t status;
    int has_linear;

    memset(&m, 0, sizeof(m));
    status = epd_sim_read_keys(text, len, origin, epd_sim_model_keys,
                               sizeof(epd_sim_model_keys) / sizeof(epd_sim_model_keys[0]), &m);
    if (status != EPD_OK) {
        return status;
    }
    has_linear = 0;
    for (uint32_t l = 0; l < m.n_layers; l++) {
        has_linear |= m.layer_pattern[l % strlen(m.layer_pattern)] == 'L';
    }
    if (strlen(m.layer_pattern) > m.n_layers) {
        epd_log_error(EPD_SIM_LOG, 0, "%s: layer_pattern of %zu letters for %u layers", origin,
                      strlen(m.layer_pattern), m.n_layers);
        return EPD_ERR_MALFORMED;
    }
    if (m.n_heads % m.n_kv_heads != 0) {
        epd_log_error(EPD_SIM_LOG, 0, "%s: n_heads %u is not a multiple of n_kv_heads %u", origin,
                      m.n_heads, m.n_kv_heads);
        return EPD_ERR_MALFORMED;
    }
    if (m.active_params > m.total_params) {
        epd_log_error(EPD_SIM_LOG, 0, "%s: active_params %g exceeds total_params %g", origin,
                      m.active_params, m.total_params);
        return EPD_ERR_MALFORMED;
    }
    if (strchr(m.layer_pattern, 'A') != NULL &&
        (uint64_t)m.head_dim * epd_dtype_size(m.kv_dtype) < 8) {
        /* the engine keeps an 8-byte prefix hash at the head of each K row */
        epd_log_error(EPD_SIM_LOG, 0, "%s: head_dim %u of %s is under 8 bytes", origin, m.head_dim,
                      epd_dtype_name(m.kv_dtype));
        return EPD_ERR_MALFORMED;
    }
    if (has_linear && m.state_bytes < 8) {
        /* the engine keeps an 8-byte prefix hash at the head of each state */
        epd_log_error(EPD_SIM_LOG, 0,
                      "%s: state_bytes %llu: linear layers need a state of at least 8 bytes",
                      origin, (unsigned long long)m.state_bytes);
        return EPD_ERR_MALFORMED;
    }
    if (!has_linear) {
        m.state_bytes = 0;
    }
    *model_p = m;
    return EPD_OK;
}

epd_status_t epd_sim_model_load(const char *path, epd_sim_model_t *model_p)
{
    char *text;
    size_t len;
    epd_status_t status;

    status = epd_sim_read_file(path, &text, &len);
    if (status != EPD_OK) {
        return status;
    }
    status = epd_sim_model_parse(text, len, path, model_p);
    epd_free(text);
    return status;
}

/* ---- accelerator profile -------------------------------------------------- */

#define EPD_SIM_A(field) offsetof(epd_sim_accel_t, field)

static const epd_sim_key_t epd_sim_accel_keys[] = {
    {"name", EPD_SIM_V_TEXT, EPD_SIM_A(name), 0, 0, 1},
    /* at least 1e6 per second: a sane device, and modelled times that fit
     * in nanoseconds */
    {"flops", EPD_SIM_V_DOUBLE, EPD_SIM_A(flops), 1e6, 1e20, 1},
    {"mem_bw", EPD_SIM_V_DOUBLE, EPD_SIM_A(mem_bw), 1e6, 1e18, 1},
    {"hbm_bytes", EPD_SIM_V_DOUBLE, EPD_SIM_A(hbm_bytes), 0, 1e18, 1},
};

epd_status_t epd_sim_accel_parse(const char *text, size_t len, const char *origin,
                                 epd_sim_accel_t *accel_p)
{
    epd_sim_accel_t a;
    epd_status_t status;

    memset(&a, 0, sizeof(a));
    status = epd_sim_read_keys(text, len, origin, epd_sim_accel_keys,
                               sizeof(epd_sim_accel_keys) / sizeof(epd_sim_accel_keys[0]), &a);
    if (status == EPD_OK) {
        *accel_p = a;
    }
    return status;
}

epd_status_t epd_sim_accel_load(const char *path, epd_sim_accel_t *accel_p)
{
    char *text;
    size_t len;
    epd_status_t status;

    status = epd_sim_read_file(path, &text, &len);
    if (status != EPD_OK) {
        return status;
    }
    status = epd_sim_accel_parse(text, len, path, accel_p);
    epd_free(text);
    return status;
}

/* ---- sim.conf ------------------------------------------------------------- */

typedef struct {
    char model[EPD_SIM_PATH_MAX];
    char accel[EPD_SIM_PATH_MAX];
    double scale;
    uint32_t devices;
    epd_sim_mode_t mode;
    uint64_t seed;
    uint32_t vocab;
    char kv_dtype_map[EPD_KVQ_MAP_MAX];
} epd_sim_conf_file_t;

#define EPD_SIM_C(field) offsetof(epd_sim_conf_file_t, field)

static const epd_sim_key_t epd_sim_conf_keys[] = {
    {"model", EPD_SIM_V_PATH, EPD_SIM_C(model), 0, 0, 1},
    {"accel", EPD_SIM_V_PATH, EPD_SIM_C(accel), 0, 0, 1},
    {"scale", EPD_SIM_V_DOUBLE, EPD_SIM_C(scale), 0, 1, 0},
    {"devices", EPD_SIM_V_U32, EPD_SIM_C(devices), 1, 4096, 0},
    {"mode", EPD_SIM_V_MODE, EPD_SIM_C(mode), 0, 0, 0},
    {"seed", EPD_SIM_V_U64, EPD_SIM_C(seed), 0, (double)UINT64_MAX, 0},
    {"vocab", EPD_SIM_V_U32, EPD_SIM_C(vocab), 258, INT32_MAX, 0},
    {"kv_dtype_map", EPD_SIM_V_KVMAP, EPD_SIM_C(kv_dtype_map), 0, 0, 0},
};

/* dir/rel, or rel when absolute. */
static epd_status_t epd_sim_join(const char *dir, const char *rel, char *out, size_t cap)
{
    int n = rel[0] == '/' ? snprintf(out, cap, "%s", rel) : snprintf(out, cap, "%s/%s", dir, rel);

    return n < 0 || (size_t)n >= cap ? EPD_ERR_INVALID_PARAM : EPD_OK;
}

epd_status_t epd_sim_conf_load(const char *dir, epd_sim_conf_t *conf_p)
{
    epd_sim_conf_file_t *f;
    epd_sim_conf_t c;
    char *path;
    char *text = NULL;
    size_t len;
    epd_status_t status;

    /* two 4 KiB paths and a scratch path: off the stack */
    f = epd_calloc(1, sizeof(*f));
    path = epd_malloc(EPD_SIM_PATH_MAX);
    if (f == NULL || path == NULL) {
        status = EPD_ERR_NO_MEMORY;
        goto out;
    }
    f->scale = 1.0;
    f->devices = 1;
    f->mode = EPD_SIM_SLEEP;
    status = epd_sim_join(dir, EPD_SIM_CONF_FILE, path, EPD_SIM_PATH_MAX);
    if (status != EPD_OK) {
        goto out;
    }
    status = epd_sim_read_file(path, &text, &len);
    if (status != EPD_OK) {
        goto out;
    }
    status = epd_sim_read_keys(text, len, path, epd_sim_conf_keys,
                               sizeof(epd_sim_conf_keys) / sizeof(epd_sim_conf_keys[0]), f);
    if (status != EPD_OK) {
        goto out;
    }
    memset(&c, 0, sizeof(c));
    status = epd_sim_join(dir, f->model, path, EPD_SIM_PATH_MAX);
    if (status == EPD_OK) {
        status = epd_sim_model_load(path, &c.model);
    }
    if (status != EPD_OK) {
        goto out;
    }
    status = epd_sim_join(dir, f->accel, path, EPD_SIM_PATH_MAX);
    if (status == EPD_OK) {
        status = epd_sim_accel_load(path, &c.accel);
    }
    if (status != EPD_OK) {
        goto out;
    }
    c.scale = f->scale;
    c.devices = f->devices;
    c.mode = f->mode;
    c.seed = f->seed;
    c.vocab = f->vocab;
    memcpy(c.kv_dtype_map, f->kv_dtype_map, sizeof(c.kv_dtype_map));
    *conf_p = c;
out:
    epd_free(text);
    epd_free(path);
    epd_free(f);
    return status;
}

epd_status_t epd_sim_conf_write(const char *dir, const epd_sim_options_t *opts)
{
    char *model = NULL;
    char *accel = NULL;
    char path[EPD_SIM_PATH_MAX];
    double scale = opts->scale == 0.0 ? 1.0 : opts->scale;
    FILE *f;
    epd_status_t status = EPD_OK;

    if (opts->model == NULL || opts->accel == NULL || !(scale > 0.0 && scale <= 1.0) ||
        opts->devices > 4096 || (opts->vocab != 0 && opts->vocab < 258) ||
        (opts->mode != EPD_SIM_SLEEP && opts->mode != EPD_SIM_SPIN) ||
        (opts->kv_dtype_map != NULL && (strlen(opts->kv_dtype_map) >= EPD_KVQ_MAP_MAX ||
                                        strpbrk(opts->kv_dtype_map, "#\n") != NULL)) ||
        snprintf(path, sizeof(path), "%s/%s", dir, EPD_SIM_CONF_FILE) >= (int)sizeof(path)) {
        epd_log_error(EPD_SIM_LOG, 0, "sim.conf options out of range");
        return EPD_ERR_INVALID_PARAM;
    }
    /* realpath allocates with malloc: copy into the funnel at once */
    {
        char *m = realpath(opts->model, NULL);
        char *a = realpath(opts->accel, NULL);

        if (m != NULL && a != NULL) {
            model = epd_strdup(m);
            accel = epd_strdup(a);
        }
        if (m == NULL || a == NULL) {
            epd_log_error(EPD_SIM_LOG, 0, "no profile at %s",
                          m == NULL ? opts->model : opts->accel);
            status = EPD_ERR_NOT_FOUND;
        } else if (model == NULL || accel == NULL) {
            status = EPD_ERR_NO_MEMORY;
        }
        free(m);
        free(a);
        if (status != EPD_OK) {
            goto out;
        }
    }
    if (strchr(model, '#') != NULL || strchr(accel, '#') != NULL) {
        /* '#' starts a comment in the file: such a path cannot be read back */
        epd_log_error(EPD_SIM_LOG, 0, "profile path %s contains '#'",
                      strchr(model, '#') != NULL ? model : accel);
        status = EPD_ERR_INVALID_PARAM;
        goto out;
    }
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        epd_log_error(EPD_SIM_LOG, 0, "cannot create %s: %s", dir, strerror(errno));
        status = EPD_ERR_IO;
        goto out;
    }
    f = fopen(path, "w");
    if (f == NULL) {
        epd_log_error(EPD_SIM_LOG, 0, "cannot write %s: %s", path, strerror(errno));
        status = EPD_ERR_IO;
        goto out;
    }
    fprintf(f, "# written by epd_sim_conf_write; see engine/README.md\n");
    fprintf(f, "model = %s\naccel = %s\nscale = %.17g\ndevices = %u\nmode = %s\nseed = %llu\n",
            model, accel, scale, opts->devices == 0 ? 1u : opts->devices,
            opts->mode == EPD_SIM_SPIN ? "spin" : "sleep", (unsigned long long)opts->seed);
    if (opts->vocab != 0) {
        fprintf(f, "vocab = %u\n", opts->vocab);
    }
    if (opts->kv_dtype_map != NULL && opts->kv_dtype_map[0] != '\0') {
        fprintf(f, "kv_dtype_map = %s\n", opts->kv_dtype_map);
    }
    if (fclose(f) != 0) {
        epd_log_error(EPD_SIM_LOG, 0, "cannot write %s", path);
        status = EPD_ERR_IO;
    }
out:
    epd_free(accel);
    epd_free(model);
    return status;
}
