/*
 * epd_mkmodel.h — writes a `ref` model of seeded random weights
 * (config.json + model.safetensors), shared by the epd-mkmodel tool, the
 * engine benchmark and the tests.  Matrices are N(0, 1/fan_in) so that every
 * projection keeps unit-scale activations, norms are ones, the embedding is
 * N(0, 1): greedy output of such a model wanders instead of collapsing.
 * The same parameters and seed always give the same bytes.
 */
#ifndef EPD_MKMODEL_H
#define EPD_MKMODEL_H

#include <stdint.h>

#include "epd_engine.h"
#include "epd_ref_model.h"
#include "epd_status.h"

typedef struct {
    epd_ref_hparams_t hp;
    uint64_t seed;
    epd_dtype_t dtype; /* dtype of the stored weights: F32 (default), F16, BF16 */
} epd_mkmodel_params_t;

/* The default model: dim 256, 8 layers "LLA" repeated, 8 heads, 2 kv heads,
 * head_dim 32, ffn 768, vocab 258, max context 8192, seed 1. */
void epd_mkmodel_defaults(epd_mkmodel_params_t *params_p);

/* Creates `dir` when missing (one level) and writes the two files.
 * EPD_ERR_MALFORMED for bad parameters, EPD_ERR_IO, EPD_ERR_NO_MEMORY (all
 * logged).  Blocking; caller's thread. */
epd_status_t epd_mkmodel_write(const epd_mkmodel_params_t *params, const char *dir);

#endif
