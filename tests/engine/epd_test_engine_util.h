/* epd_test_engine_util.h — helpers shared by the engine tests: scratch
 * folders (mkdtemp, removed at the end), tiny models, pools. */
#ifndef EPD_TEST_ENGINE_UTIL_H
#define EPD_TEST_ENGINE_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "epd_engine.h"
#include "epd_mkmodel.h"

/* Creates a fresh folder under $TMPDIR (or /tmp); returns its path (static
 * storage, one per process).  Aborts the test on failure. */
const char *epd_test_tmpdir(void);
/* Removes the folder and everything in it. */
void epd_test_rmtree(const char *dir);
/* Joins dir and name into a static buffer (rotating over 4 buffers). */
const char *epd_test_path(const char *dir, const char *name);

/* A tiny hybrid text-only model: dim 32, 4 layers "LA", 4 heads, 2 kv
 * heads, head_dim 8, ffn 48, vocab 258, context 256, seed 7. */
void epd_test_tiny_params(epd_mkmodel_params_t *p);
/* The same with a tiny vision encoder: 32 x 32 pixels, 8-pixel patches
 * (4 x 4), hidden 16, 2 layers, 2 heads, MLP 24, 2 x 2 merge (4 embeddings
 * per image); vocab 259, image token 258. */
void epd_test_tiny_vision_params(epd_mkmodel_params_t *p);
/* Writes a model with `p` into dir/name and returns that folder (static
 * storage that stays valid for the next 31 calls). */
const char *epd_test_write_model(const char *dir, const char *name, const epd_mkmodel_params_t *p);

/* A pool of n_blocks / n_slots for `engine`, zero-filled (epd_free(base)). */
void epd_test_pool(const epd_engine_t *engine, uint32_t n_blocks, uint32_t n_slots,
                   epd_kv_pool_t *pool);

/* Largest |a-b| over largest |b|. */
double epd_test_rel_err(const float *a, const double *b, size_t n);
double epd_test_rel_err_f(const float *a, const float *b, size_t n);

/* Reads a whole file into a new buffer (epd_free); *len_p its size. */
unsigned char *epd_test_read_file(const char *path, size_t *len_p);
/* Writes len bytes to path. */
void epd_test_write_file(const char *path, const void *data, size_t len);

#endif
