/* epd_kvq.c — quantized KV codecs, dtype maps and rows (see epd_kvq.h). */
#include "epd_kvq.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_log.h"

#define EPD_KVQ_FP8_MAX 448.0f
#define EPD_KVQ_INT8_MAX 127.0f
#define EPD_KVQ_INT8_NAN (-128)

uint16_t epd_kvq_bf16_from_f32(float x)
{
    uint32_t u;

    memcpy(&u, &x, sizeof(u));
    if (isnan(x)) {
        return (uint16_t)((u >> 16) | 0x40u); /* quiet, sign kept */
    }
    /* round to nearest even on the 16 dropped bits (overflow rounds to Inf) */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float epd_kvq_bf16_to_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float x;

    memcpy(&x, &u, sizeof(x));
    return x;
}

uint8_t epd_kvq_fp8_from_f32(float x)
{
    uint8_t sign = signbit(x) ? 0x80u : 0x00u;
    float a = fabsf(x);
    int e2;
    float f;
    int m;
    int e;

    if (isnan(x)) {
        return (uint8_t)(sign | 0x7fu);
    }
    if (a >= EPD_KVQ_FP8_MAX) { /* saturating: Inf and overflow go to ±448 */
        return (uint8_t)(sign | 0x7eu);
    }
    if (a < 0.015625f) { /* below 2^-6: subnormals, step 2^-9; rint ties to even,
                          * and a result of 8 is exactly the smallest normal's code */
        return (uint8_t)(sign | (uint8_t)rintf(a * 512.0f));
    }
    f = frexpf(a, &e2); /* a = f * 2^e2, f in [0.5, 1) */
    e = e2 - 1;         /* a = (2f) * 2^e, e in [-6, 8] */
    m = (int)rintf((2.0f * f - 1.0f) * 8.0f); /* exact product; ties to even */
    if (m == 8) {
        m = 0;
        e++;
    }
    if (e + 7 > 15 || (e + 7 == 15 && m == 7)) {
        return (uint8_t)(sign | 0x7eu); /* rounded past 448 */
    }
    return (uint8_t)(sign | (uint8_t)((e + 7) << 3) | (uint8_t)m);
}

float epd_kvq_fp8_to_f32(uint8_t c)
{
    int ef = (c >> 3) & 0xf;
    int m = c & 7;
    float a;

    if ((c & 0x7fu) == 0x7fu) {
        return (c & 0x80u) ? -NAN : NAN;
    }
    a = ef == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + (float)m / 8.0f, ef - 7);
    return (c & 0x80u) ? -a : a;
}

int8_t epd_kvq_int8_from_f32(float x, float inv_scale)
{
    float q;

    if (isnan(x)) {
        return EPD_KVQ_INT8_NAN;
    }
    q = rintf(x * inv_scale); /* Inf * s is Inf: clamped below */
    if (q > EPD_KVQ_INT8_MAX) {
        q = EPD_KVQ_INT8_MAX;
    } else if (q < -EPD_KVQ_INT8_MAX) {
        q = -EPD_KVQ_INT8_MAX;
    }
    return (int8_t)q;
}

float epd_kvq_int8_to_f32(int8_t c, float scale)
{
    return c == EPD_KVQ_INT8_NAN ? NAN : (float)c * scale;
}

int epd_kvq_dtype_ok(epd_dtype_t dtype)
{
    return dtype == EPD_DTYPE_F32 || dtype == EPD_DTYPE_BF16 || dtype == EPD_DTYPE_FP8_E4M3 ||
           dtype == EPD_DTYPE_INT8;
}

int epd_kvq_dtype_scaled(epd_dtype_t dtype)
{
    return dtype == EPD_DTYPE_FP8_E4M3 || dtype == EPD_DTYPE_INT8;
}

const char *epd_kvq_dtype_short(epd_dtype_t dtype)
{
    switch (dtype) {
    case EPD_DTYPE_F32:
        return "f32";
    case EPD_DTYPE_BF16:
        return "bf16";
    case EPD_DTYPE_FP8_E4M3:
        return "fp8";
    case EPD_DTYPE_INT8:
        return "int8";
    case EPD_DTYPE_F16:
        break;
    }
    return "?";
}

uint64_t epd_kvq_block_bytes(epd_dtype_t dtype, uint32_t n_kv_heads, uint32_t block_tokens,
                             uint32_t head_dim)
{
    uint64_t rows = (uint64_t)n_kv_heads * block_tokens;
    uint64_t half = rows * head_dim * epd_dtype_size(dtype);

    if (epd_kvq_dtype_scaled(dtype)) {
        half += rows * sizeof(float);
    }
    return 2 * half;
}

static int epd_kvq_dtype_parse(const char *s, size_t n, epd_dtype_t *dtype_p)
{
    static const struct {
        const char *name;
        epd_dtype_t dtype;
    } names[] = {
        {"f32", EPD_DTYPE_F32},  {"fp32", EPD_DTYPE_F32},       {"bf16", EPD_DTYPE_BF16},
        {"fp8", EPD_DTYPE_FP8_E4M3}, {"e4m3", EPD_DTYPE_FP8_E4M3}, {"int8", EPD_DTYPE_INT8},
    };

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strlen(names[i].name) == n && strncmp(names[i].name, s, n) == 0) {
            *dtype_p = names[i].dtype;
            return 1;
        }
    }
    return 0;
}

/* A decimal layer index of s[0..n) (no sign, no blanks). */
static int epd_kvq_index_parse(const char *s, size_t n, uint32_t *v_p)
{
    uint64_t v = 0;

    if (n == 0 || n > 9) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return 0;
        }
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *v_p = (uint32_t)v;
    return 1;
}

epd_status_t epd_kvq_map_parse(const char *map, uint32_t n_layers, uint8_t *dtypes,
                               const char **why_p)
{
    const char *p = map;
    const char *why = NULL;
    epd_dtype_t dt;

    for (uint32_t l = 0; l < n_layers; l++) {
        dtypes[l] = EPD_DTYPE_F32;
    }
    if (map == NULL || map[0] == '\0') {
        return EPD_OK;
    }
    if (strlen(map) >= EPD_KVQ_MAP_MAX) {
        why = "KV dtype map too long";
        goto refuse;
    }
    if (strchr(map, ':') == NULL && strchr(map, ',') == NULL) {
        if (!epd_kvq_dtype_parse(map, strlen(map), &dt)) {
            why = "unknown KV dtype (f32, bf16, fp8, int8)";
            goto refuse;
        }
        for (uint32_t l = 0; l < n_layers; l++) {
            dtypes[l] = (uint8_t)dt;
        }
        return EPD_OK;
    }
    while (*p != '\0') {
        const char *end = strchr(p, ',');
        const char *colon;
        const char *dash;
        size_t n = end != NULL ? (size_t)(end - p) : strlen(p);
        uint32_t lo;
        uint32_t hi;

        colon = memchr(p, ':', n);
        if (colon == NULL) {
            why = "KV dtype map entry without ':' (want A-B:dtype)";
            goto refuse;
        }
        if (!epd_kvq_dtype_parse(colon + 1, n - (size_t)(colon + 1 - p), &dt)) {
            why = "unknown KV dtype (f32, bf16, fp8, int8)";
            goto refuse;
        }
        dash = memchr(p, '-', (size_t)(colon - p));
        if (dash == NULL) {
            if (!epd_kvq_index_parse(p, (size_t)(colon - p), &lo)) {
                why = "bad layer index in KV dtype map";
                goto refuse;
            }
            hi = lo;
        } else {
            if (!epd_kvq_index_parse(p, (size_t)(dash - p), &lo)) {
                why = "bad layer index in KV dtype map";
                goto refuse;
            }
            if (dash + 1 == colon) {
                hi = n_layers - 1; /* "A-": to the last layer */
            } else if (!epd_kvq_index_parse(dash + 1, (size_t)(colon - dash - 1), &hi)) {
                why = "bad layer index in KV dtype map";
                goto refuse;
            }
        }
        if (n_layers == 0 || lo > hi || hi >= n_layers) {
            why = "KV dtype map range outside the model's layers";
            goto refuse;
        }
        for (uint32_t l = lo; l <= hi; l++) {
            dtypes[l] = (uint8_t)dt;
        }
        p += n;
        if (*p == ',') {
            p++;
            if (*p == '\0') {
                why = "empty entry in KV dtype map";
                goto refuse;
            }
        }
    }
    return EPD_OK;
refuse:
    if (why_p != NULL) {
        *why_p = why;
    }
    return EPD_ERR_INVALID_PARAM;
}

void epd_kvq_layout_apply(epd_kv_layout_t *kv, const uint8_t *dtypes)
{
    uint64_t prefix = 0;
    uint64_t largest = 0;
    int first = 1;

    kv->mixed = 0;
    for (uint32_t l = 0; l < kv->n_layers && l < EPD_KV_MAX_LAYERS; l++) {
        epd_dtype_t dt = dtypes != NULL ? (epd_dtype_t)dtypes[l] : EPD_DTYPE_F32;
        uint64_t bb;

        if (kv->kind[l] != EPD_LAYER_ATTENTION) {
            kv->layer_dtype[l] = EPD_DTYPE_F32;
            kv->layer_block_bytes[l] = 0;
            kv->layer_prefix[l] = prefix;
            continue;
        }
        bb = epd_kvq_block_bytes(dt, kv->n_kv_heads, kv->block_tokens, kv->head_dim);
        kv->layer_dtype[l] = (uint8_t)dt;
        kv->layer_block_bytes[l] = bb;
        kv->layer_prefix[l] = prefix;
        prefix += bb;
        largest = bb > largest ? bb : largest;
        if (first) {
            kv->dtype = dt;
            first = 0;
        } else if (dt != kv->dtype) {
            kv->mixed = 1;
        }
    }
    if (first) {
        kv->dtype = EPD_DTYPE_F32;
    }
    kv->attn_block_bytes = prefix;
    kv->block_bytes = largest;
}

void epd_kvq_map_format(const epd_kv_layout_t *kv, char *buf, size_t cap)
{
    size_t len = 0;
    uint32_t l = 0;

    if (cap == 0) {
        return;
    }
    buf[0] = '\0';
    if (!kv->mixed || kv->attn_block_bytes == 0) {
        snprintf(buf, cap, "%s", epd_kvq_dtype_short(kv->dtype));
        return;
    }
    while (l < kv->n_layers) {
        uint32_t a;
        int w;

        if (kv->kind[l] != EPD_LAYER_ATTENTION) {
            l++;
            continue;
        }
        a = l;
        /* a run of attention layers (linear ones between are skipped) with one dtype */
        while (l + 1 < kv->n_layers && (kv->kind[l + 1] != EPD_LAYER_ATTENTION ||
                                        kv->layer_dtype[l + 1] == kv->layer_dtype[a])) {
            l++;
        }
        w = snprintf(buf + len, cap - len, "%s%u-%u:%s", len > 0 ? "," : "", a, l,
                     epd_kvq_dtype_short((epd_dtype_t)kv->layer_dtype[a]));
        if (w < 0 || (size_t)w >= cap - len) {
            return;
        }
        len += (size_t)w;
        l++;
    }
}

/* The row's codes and (scaled dtypes) its scale inside a layer's block. */
static void epd_kvq_row_at(const epd_kv_layout_t *kv, uint32_t layer, const void *block, int v,
                           uint32_t kvh, uint32_t tok, epd_dtype_t *dt_p, char **codes_p,
                           float **scale_p)
{
    epd_dtype_t dt = kv->attn_block_bytes != 0 ? (epd_dtype_t)kv->layer_dtype[layer] : kv->dtype;
    uint64_t half = epd_kv_layer_block_bytes(kv, layer) / 2;
    uint64_t row = (uint64_t)kvh * kv->block_tokens + tok;
    uint64_t rows = (uint64_t)kv->n_kv_heads * kv->block_tokens;
    char *h = (char *)block + (v ? half : 0);
    size_t es = epd_dtype_size(dt);

    *dt_p = dt;
    *codes_p = h + row * kv->head_dim * es;
    *scale_p = (float *)(void *)(h + rows * kv->head_dim * es + row * sizeof(float));
}

void epd_kvq_row_put(const epd_kv_layout_t *kv, uint32_t layer, void *block, int v, uint32_t kvh,
                     uint32_t tok, const float *x)
{
    uint32_t hd = kv->head_dim;
    epd_dtype_t dt;
    char *codes;
    float *scale;
    float amax = 0.0f;
    float s;

    epd_kvq_row_at(kv, layer, block, v, kvh, tok, &dt, &codes, &scale);
    switch (dt) {
    case EPD_DTYPE_BF16:
        for (uint32_t i = 0; i < hd; i++) {
            uint16_t b = epd_kvq_bf16_from_f32(x[i]);
            memcpy(codes + 2 * i, &b, 2);
        }
        return;
    case EPD_DTYPE_FP8_E4M3:
    case EPD_DTYPE_INT8:
        for (uint32_t i = 0; i < hd; i++) {
            float a = fabsf(x[i]);
            amax = isfinite(a) && a > amax ? a : amax; /* NaN, Inf: coded apart */
        }
        s = amax > 0.0f ? amax / (dt == EPD_DTYPE_INT8 ? EPD_KVQ_INT8_MAX : EPD_KVQ_FP8_MAX)
                        : 1.0f;
        if (!isnormal(s)) {
            s = 1.0f; /* amax so small the scale underflows: keep the values as they are */
        }
        memcpy(scale, &s, sizeof(s));
        for (uint32_t i = 0; i < hd; i++) {
            if (dt == EPD_DTYPE_INT8) {
                codes[i] = (char)epd_kvq_int8_from_f32(x[i], 1.0f / s);
            } else {
                codes[i] = (char)epd_kvq_fp8_from_f32(x[i] / s);
            }
        }
        return;
    case EPD_DTYPE_F32:
    case EPD_DTYPE_F16:
        break;
    }
    memcpy(codes, x, hd * sizeof(float));
}

void epd_kvq_row_get(const epd_kv_layout_t *kv, uint32_t layer, const void *block, int v,
                     uint32_t kvh, uint32_t tok, float *out)
{
    uint32_t hd = kv->head_dim;
    epd_dtype_t dt;
    char *codes;
    float *scale;
    float s;

    epd_kvq_row_at(kv, layer, block, v, kvh, tok, &dt, &codes, &scale);
    switch (dt) {
    case EPD_DTYPE_BF16:
        for (uint32_t i = 0; i < hd; i++) {
            uint16_t b;
            memcpy(&b, codes + 2 * i, 2);
            out[i] = epd_kvq_bf16_to_f32(b);
        }
        return;
    case EPD_DTYPE_FP8_E4M3:
        memcpy(&s, scale, sizeof(s));
        for (uint32_t i = 0; i < hd; i++) {
            out[i] = epd_kvq_fp8_to_f32((uint8_t)codes[i]) * s;
        }
        return;
    case EPD_DTYPE_INT8:
        memcpy(&s, scale, sizeof(s));
        for (uint32_t i = 0; i < hd; i++) {
            out[i] = epd_kvq_int8_to_f32((int8_t)codes[i], s);
        }
        return;
    case EPD_DTYPE_F32:
    case EPD_DTYPE_F16:
        break;
    }
    memcpy(out, codes, hd * sizeof(float));
}

void epd_kvq_row_zero(const epd_kv_layout_t *kv, uint32_t layer, void *block, int v, uint32_t kvh,
                      uint32_t tok)
{
    epd_dtype_t dt;
    char *codes;
    float *scale;

    epd_kvq_row_at(kv, layer, block, v, kvh, tok, &dt, &codes, &scale);
    memset(codes, 0, (size_t)kv->head_dim * epd_dtype_size(dt));
    if (epd_kvq_dtype_scaled(dt)) {
        memset(scale, 0, sizeof(float));
    }
}

epd_status_t epd_kvq_layout_set(epd_kv_layout_t *kv, const char *map, const char *comp)
{
    uint8_t dtypes[EPD_KV_MAX_LAYERS];
    const char *why = NULL;
    int quantized = 0;

    if (epd_kvq_map_parse(map, kv->n_layers, dtypes, &why) != EPD_OK) {
        epd_log_error(comp, 0, "--kv-dtype '%s': %s", map, why);
        return EPD_ERR_INVALID_PARAM;
    }
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        quantized |= kv->kind[l] == EPD_LAYER_ATTENTION && dtypes[l] != EPD_DTYPE_F32;
    }
    if (quantized && kv->head_dim > EPD_KVQ_MAX_HEAD_DIM) {
        epd_log_error(comp, 0, "--kv-dtype '%s': head_dim %u above %u", map, kv->head_dim,
                      EPD_KVQ_MAX_HEAD_DIM);
        return EPD_ERR_UNSUPPORTED;
    }
    epd_kvq_layout_apply(kv, dtypes);
    return EPD_OK;
}
