/* epd_engine_int.h — internals shared by the engine registry and the
 * built-in engines (not an API: daemons include epd_engine.h only). */
#ifndef EPD_ENGINE_INT_H
#define EPD_ENGINE_INT_H

#include <stddef.h>
#include <stdint.h>

#include "epd_engine.h"

/* The byte-level tokenizer both built-ins use: one token per byte (ids
 * 0..255), `bos` first when add_bos.  EPD_ERR_TOO_LONG when cap is too
 * small.  Pure. */
epd_status_t epd__byte_tokenize(int32_t bos, const char *text, size_t len, int add_bos,
                                int32_t *tokens, size_t cap, size_t *n_p);
/* Its inverse: the bytes of ids below 256 (special tokens produce nothing). */
epd_status_t epd__byte_detokenize(const int32_t *tokens, size_t n, char *buf, size_t cap,
                                  size_t *len_p);

/* The description of a Hugging Face folder from its config files alone
 * (epd_engine_tokonly.c), for config->tokenizer_only.  EPD_ERR_UNSUPPORTED
 * when the folder is not a Hugging Face one (the caller then opens the
 * engine in full); other errors logged. */
epd_status_t epd__engine_tok_only_info(const epd_engine_config_t *config,
                                       epd_engine_info_t *info_p);

/* The built-in `ref` engine (epd_ref.c; its files: epd_ref_int.h). */
extern const epd_engine_ops_t epd__ref_ops;
/* The Hugging Face engine (epd_hf.c), opened as `ref` on an HF folder. */
extern const epd_engine_ops_t epd__hf_ops;
/* The built-in `sim` timing model (epd_sim.c). */
extern const epd_engine_ops_t epd__sim_ops;

#endif
