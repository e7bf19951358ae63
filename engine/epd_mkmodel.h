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
 * head_dim 32, ffn 768, max context 8192, seed 1, with the default vision
 * encoder (below): vocab 259, image_token_id 258. */
void epd_mkmodel_defaults(epd_mkmodel_params_t *params_p);

/* Turns the vision encoder of `params` (caller's) on with its default
 * sizes: 224 x 224 pixels, 16-pixel patches (14 x 14), hidden 192, 4
 * layers, 3 heads, MLP 768, 2 x 2 merge (49 embeddings per image); vocab
 * 259, image_token_id 258.  Pure. */
void epd_mkmodel_vision_defaults(epd_mkmodel_params_t *params);

/* Turns vision off: no vision_config, vocab 258, image_token -1 (the model
 * epd-mkmodel wrote before vision existed, byte for byte, for the same
 * other parameters).  Pure. */
void epd_mkmodel_text_only(epd_mkmodel_params_t *params);

/* Creates `dir` when missing (one level) and writes the two files.
 * EPD_ERR_MALFORMED for bad parameters, EPD_ERR_IO, EPD_ERR_NO_MEMORY (all
 * logged).  Blocking; caller's thread. */
epd_status_t epd_mkmodel_write(const epd_mkmodel_params_t *params, const char *dir);

/* f32 to BF16 / F16, round to nearest even (F16 clamps to the largest
 * finite half); shared with the Hugging Face writer.  Pure. */
uint16_t epd_mk_to_bf16(float f);
uint16_t epd_mk_to_f16(float f);

#endif
