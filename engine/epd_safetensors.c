/*
 * epd_safetensors.c — mmap + jansson parse of the header, every field
 * checked before a byte of data is touched.  The tensor table is one array
 * owned by the file; names are copied out of the JSON so that the JSON can be
 * dropped right after parsing.
 */
#include "epd_safetensors.h"

#include "epd_hash.h"

#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <jansson.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "epd_alloc.h"
#include "epd_log.h"

#define EPD_ST_LOG "safetensors"

struct epd_st_file {
    void *map;
    size_t map_len;
    epd_st_tensor_t *tensors;
    size_t n_tensors;
};

static epd_status_t epd_st_parse_dtype(const char *s, epd_dtype_t *dtype_p)
{
    if (strcmp(s, "F32") == 0) {
        *dtype_p = EPD_DTYPE_F32;
    } else if (strcmp(s, "F16") == 0) {
        *dtype_p = EPD_DTYPE_F16;
    } else if (strcmp(s, "BF16") == 0) {
        *dtype_p = EPD_DTYPE_BF16;
    } else {
        return EPD_ERR_UNSUPPORTED;
    }
    return EPD_OK;
}

static epd_status_t epd_st_parse_entry(const char *path, const char *key, json_t *val,
                                       const unsigned char *data, uint64_t data_len,
                                       epd_st_tensor_t *t)
{
    json_t *jdtype = json_object_get(val, "dtype");
    json_t *jshape = json_object_get(val, "shape");
    json_t *joff = json_object_get(val, "data_offsets");
    json_int_t begin;
    json_int_t end;
    uint64_t n = 1;
    size_t esize;

    if (!json_is_object(val) || !json_is_string(jdtype) || !json_is_array(jshape) ||
        !json_is_array(joff) || json_array_size(joff) != 2 ||
        !json_is_integer(json_array_get(joff, 0)) || !json_is_integer(json_array_get(joff, 1))) {
        epd_log_error(EPD_ST_LOG, 0,
                      "%s: tensor '%s': needs dtype, shape and data_offsets [begin, end]", path,
                      key);
        return EPD_ERR_MALFORMED;
    }
    if (epd_st_parse_dtype(json_string_value(jdtype), &t->dtype) != EPD_OK) {
        epd_log_error(EPD_ST_LOG, 0, "%s: tensor '%s': unsupported dtype '%s' (F32, F16, BF16)",
                      path, key, json_string_value(jdtype));
        return EPD_ERR_MALFORMED;
    }
    if (json_array_size(jshape) > EPD_ST_MAX_DIMS) {
        epd_log_error(EPD_ST_LOG, 0, "%s: tensor '%s': %zu dims (at most %d)", path, key,
                      json_array_size(jshape), EPD_ST_MAX_DIMS);
        return EPD_ERR_MALFORMED;
    }
    t->ndim = (uint32_t)json_array_size(jshape);
    for (uint32_t d = 0; d < t->ndim; d++) {
        json_t *jd = json_array_get(jshape, d);

        if (!json_is_integer(jd) || json_integer_value(jd) < 0) {
            epd_log_error(EPD_ST_LOG, 0, "%s: tensor '%s': dim %u is not a non-negative integer",
                          path, key, d);
            return EPD_ERR_MALFORMED;
        }
        t->shape[d] = (uint64_t)json_integer_value(jd);
        if (__builtin_mul_overflow(n, t->shape[d], &n)) {
            epd_log_error(EPD_ST_LOG, 0, "%s: tensor '%s': shape overflows", path, key);
            return EPD_ERR_MALFORMED;
        }
    }
    t->n_elems = n;
    esize = epd_dtype_size(t->dtype);
    begin = json_integer_value(json_array_get(joff, 0));
    end = json_integer_value(json_array_get(joff, 1));
    if (begin < 0 || end < begin || (uint64_t)end > data_len) {
        epd_log_error(EPD_ST_LOG, 0,
                      "%s: tensor '%s': data_offsets [%lld, %lld] outside the %llu data bytes",
                      path, key, (long long)begin, (long long)end, (unsigned long long)data_len);
        return EPD_ERR_MALFORMED;
    }
    if (__builtin_mul_overflow(n, (uint64_t)esize, &t->nbytes) ||
        t->nbytes != (uint64_t)(end - begin)) {
        epd_log_error(EPD_ST_LOG, 0, "%s: tensor '%s': %lld bytes for %llu elements of %s", path,
                      key, (long long)(end - begin), (unsigned long long)n,
                      epd_dtype_name(t->dtype));
        return EPD_ERR_MALFORMED;
    }
    t->data = data + begin;
    return EPD_OK;
}

static void epd_st_free_tensors(epd_st_file_t *file)
{
    for (size_t i = 0; i < file->n_tensors; i++) {
        epd_free((void *)file->tensors[i].name);
    }
    epd_free(file->tensors);
    file->tensors = NULL;
    file->n_tensors = 0;
}

static epd_status_t epd_st_parse_header(const char *path, epd_st_file_t *file)
{
    const unsigned char *base = file->map;
    uint64_t hlen = 0;
    const unsigned char *data;
    uint64_t data_len;
    json_error_t jerr;
    json_t *root;
    const char *key;
    json_t *val;
    size_t cap;
    epd_status_t status;

    if (file->map_len < 8) {
        epd_log_error(EPD_ST_LOG, 0, "%s: %zu bytes, too short for a header", path, file->map_len);
        return EPD_ERR_MALFORMED;
    }
    for (int i = 7; i >= 0; i--) {
        hlen = (hlen << 8) | base[i];
    }
    if (hlen < 2 || hlen > EPD_ST_MAX_HEADER || hlen > file->map_len - 8) {
        epd_log_error(EPD_ST_LOG, 0, "%s: header length %llu is not sane for a %zu-byte file", path,
                      (unsigned long long)hlen, file->map_len);
        return EPD_ERR_MALFORMED;
    }
    data = base + 8 + hlen;
    data_len = file->map_len - 8 - hlen;
    root = json_loadb((const char *)base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        epd_log_error(EPD_ST_LOG, 0, "%s: header JSON: %s (line %d column %d)", path, jerr.text,
                      jerr.line, jerr.column);
        return EPD_ERR_MALFORMED;
    }
    if (!json_is_object(root)) {
        epd_log_error(EPD_ST_LOG, 0, "%s: header is not a JSON object", path);
        status = EPD_ERR_MALFORMED;
        goto err_decref;
    }
    cap = json_object_size(root);
    file->tensors = epd_calloc(cap == 0 ? 1 : cap, sizeof(*file->tensors));
    if (file->tensors == NULL) {
        status = EPD_ERR_NO_MEMORY;
        goto err_decref;
    }
    json_object_foreach(root, key, val)
    {
        epd_st_tensor_t *t = &file->tensors[file->n_tensors];

        if (strcmp(key, "__metadata__") == 0) {
            continue;
        }
        status = epd_st_parse_entry(path, key, val, data, data_len, t);
        if (status != EPD_OK) {
            goto err_free_tensors;
        }
        t->name = epd_strdup(key);
        if (t->name == NULL) {
            status = EPD_ERR_NO_MEMORY;
            goto err_free_tensors;
        }
        file->n_tensors++;
    }
    json_decref(root);
    return EPD_OK;

err_free_tensors:
    epd_st_free_tensors(file);
err_decref:
    json_decref(root);
    return status;
}

epd_status_t epd_st_open(const char *path, epd_st_file_t **file_p)
{
    epd_st_file_t *file;
    struct stat st;
    epd_status_t status;
    int fd;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        epd_log_error(EPD_ST_LOG, 0, "%s: cannot open: %s", path, strerror(errno));
        return errno == ENOENT ? EPD_ERR_NOT_FOUND : EPD_ERR_IO;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        epd_log_error(EPD_ST_LOG, 0, "%s: not a regular file", path);
        status = EPD_ERR_IO;
        goto err_close_fd;
    }
    file = epd_calloc(1, sizeof(*file));
    if (file == NULL) {
        status = EPD_ERR_NO_MEMORY;
        goto err_close_fd;
    }
    file->map_len = (size_t)st.st_size;
    if (file->map_len == 0) {
        epd_log_error(EPD_ST_LOG, 0, "%s: empty file", path);
        status = EPD_ERR_MALFORMED;
        goto err_free_file;
    }
    file->map = mmap(NULL, file->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (file->map == MAP_FAILED) {
        epd_log_error(EPD_ST_LOG, 0, "%s: mmap: %s", path, strerror(errno));
        status = EPD_ERR_IO;
        goto err_free_file;
    }
    status = epd_st_parse_header(path, file);
    if (status != EPD_OK) {
        goto err_unmap;
    }
    close(fd);
    *file_p = file;
    return EPD_OK;

err_unmap:
    munmap(file->map, file->map_len);
err_free_file:
    epd_free(file);
err_close_fd:
    close(fd);
    return status;
}

void epd_st_close(epd_st_file_t *file)
{
    if (file == NULL) {
        return;
    }
    epd_st_free_tensors(file);
    munmap(file->map, file->map_len);
    epd_free(file);
}

void epd_st_digest(const epd_st_file_t *file, uint64_t seed, uint8_t out[16])
{
    epd_hash128(file->map, file->map_len, seed, out);
}

const void *epd_st_bytes(const epd_st_file_t *file, size_t *len_p)
{
    *len_p = file->map_len;
    return file->map;
}

size_t epd_st_count(const epd_st_file_t *file)
{
    return file->n_tensors;
}

const epd_st_tensor_t *epd_st_at(const epd_st_file_t *file, size_t i)
{
    return i < file->n_tensors ? &file->tensors[i] : NULL;
}

const epd_st_tensor_t *epd_st_find(const epd_st_file_t *file, const char *name)
{
    for (size_t i = 0; i < file->n_tensors; i++) {
        if (strcmp(file->tensors[i].name, name) == 0) {
            return &file->tensors[i];
        }
    }
    return NULL;
}

float epd_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    float f;

    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 */
        f = (float)man * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    memcpy(&f, &bits, sizeof(f));
    return f;
}

float epd_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;

    memcpy(&f, &bits, sizeof(f));
    return f;
}

epd_status_t epd_st_read_f32(const epd_st_file_t *file, const char *name, uint32_t ndim,
                             const uint64_t *shape, float *dst)
{
    const epd_st_tensor_t *t = epd_st_find(file, name);
    const unsigned char *src;

    if (t == NULL) {
        epd_log_error(EPD_ST_LOG, 0, "tensor '%s' is missing", name);
        return EPD_ERR_NOT_FOUND;
    }
    if (t->ndim != ndim || memcmp(t->shape, shape, ndim * sizeof(*shape)) != 0) {
        char want[128];
        char have[128];
        int wl = 0;
        int hl = 0;

        for (uint32_t d = 0; d < ndim && wl < 100; d++) {
            wl += snprintf(want + wl, sizeof(want) - (size_t)wl, "%s%llu", d ? "," : "",
                           (unsigned long long)shape[d]);
        }
        want[wl] = '\0';
        have[0] = '\0';
        for (uint32_t d = 0; d < t->ndim && hl < 100; d++) {
            hl += snprintf(have + hl, sizeof(have) - (size_t)hl, "%s%llu", d ? "," : "",
                           (unsigned long long)t->shape[d]);
        }
        epd_log_error(EPD_ST_LOG, 0, "tensor '%s': shape [%s], the config wants [%s]", name, have,
                      want);
        return EPD_ERR_MALFORMED;
    }
    src = t->data;
    switch (t->dtype) {
    case EPD_DTYPE_F32:
        memcpy(dst, src, t->nbytes);
        break;
    case EPD_DTYPE_F16:
    case EPD_DTYPE_BF16:
        for (uint64_t i = 0; i < t->n_elems; i++) {
            uint16_t h = (uint16_t)(src[2 * i] | (src[2 * i + 1] << 8));

            dst[i] = t->dtype == EPD_DTYPE_F16 ? epd_f16_to_f32(h) : epd_bf16_to_f32(h);
        }
        break;
    case EPD_DTYPE_FP8_E4M3: /* KV-only dtypes: the header parser never names them */
    case EPD_DTYPE_INT8:
        return EPD_ERR_MALFORMED;
    }
    for (uint64_t i = 0; i < t->n_elems; i++) {
        if (dst[i] != dst[i] || dst[i] > 3.0e38f || dst[i] < -3.0e38f) {
            epd_log_error(EPD_ST_LOG, 0, "tensor '%s': element %llu is not finite", name,
                          (unsigned long long)i);
            return EPD_ERR_MALFORMED;
        }
    }
    return EPD_OK;
}
