/*
 * epd_safetensors.h — a validating, read-only safetensors reader.
 *
 * Format: 8-byte little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {...}}, then the data; offsets are relative to the data.
 * The file is mmapped; everything is checked before use: header length
 * against the file size (and a sane cap), JSON well formed, dtype known,
 * shape non-negative with at most EPD_ST_MAX_DIMS dims, byte count equal to
 * the product of the shape times the dtype size (no overflow), offsets inside
 * the data.  A file is used by one thread at a time (reads are pure).
 */
#ifndef EPD_SAFETENSORS_H
#define EPD_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "epd_engine.h"
#include "epd_status.h"

#define EPD_ST_MAX_DIMS 8
#define EPD_ST_MAX_HEADER (64u << 20) /* bytes of JSON header we accept */

typedef struct {
    const char *name; /* owned by the file */
    epd_dtype_t dtype;
    uint32_t ndim;
    uint64_t shape[EPD_ST_MAX_DIMS];
    uint64_t n_elems;
    uint64_t nbytes;
    const void *data; /* inside the mapping; may be unaligned */
} epd_st_tensor_t;

typedef struct epd_st_file epd_st_file_t;

/* Maps and validates `path`.  *file_p is owned by the caller (close with
 * epd_st_close).  EPD_ERR_NOT_FOUND / EPD_ERR_IO when it cannot be opened,
 * EPD_ERR_MALFORMED (logged with the exact cause) when invalid,
 * EPD_ERR_NO_MEMORY. */
epd_status_t epd_st_open(const char *path, epd_st_file_t **file_p);

/* Unmaps; NULL is a no-op.  Tensor pointers become dangling. */
void epd_st_close(epd_st_file_t *file);

/* XXH3-128 of the whole file (header and data) with `seed`: what a model's
 * weights are, digested (epd_engine_info_t.model_digest). */
void epd_st_digest(const epd_st_file_t *file, uint64_t seed, uint8_t out[16]);

/* The whole mapping, header and data (borrowed, read-only; *len_p its
 * length): what a sampled digest reads without a second open. */
const void *epd_st_bytes(const epd_st_file_t *file, size_t *len_p);

/* Number of tensors and the i-th one (in header order). */
size_t epd_st_count(const epd_st_file_t *file);
const epd_st_tensor_t *epd_st_at(const epd_st_file_t *file, size_t i);

/* The tensor called `name`, or NULL. */
const epd_st_tensor_t *epd_st_find(const epd_st_file_t *file, const char *name);

/*
 * Finds `name`, checks its shape equals shape[0..ndim) and converts it to
 * f32 into dst (caller's buffer of the product of shape floats).
 * EPD_ERR_NOT_FOUND or EPD_ERR_MALFORMED (both logged, naming the tensor).
 */
epd_status_t epd_st_read_f32(const epd_st_file_t *file, const char *name, uint32_t ndim,
                             const uint64_t *shape, float *dst);

/* Half-precision conversions (exact; used for F16/BF16 weights). */
float epd_f16_to_f32(uint16_t h);
float epd_bf16_to_f32(uint16_t h);

#endif
