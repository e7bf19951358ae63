/*
 * epd_itest_colo.h — the colocated baseline inside a test program: exactly
 * what epd-generate does (tokenize with BOS, prefill, sample step 0 from
 * the prefill logits, decode step i, stop at EOS, max_tokens or the
 * context limit), with the public engine API.  Test code; one thread.
 */
#ifndef EPD_ITEST_COLO_H
#define EPD_ITEST_COLO_H

#include <stdint.h>

#include "epd_engine.h"
#include "epd_sample.h"

/* Generates for tokens[0..n_prompt) into out[0..max_tokens); *n_out_p gets
 * the count.  EPD_OK or the engine's error. */
epd_status_t epd_itest_colocated(epd_engine_t *engine, const int32_t *prompt, uint32_t n_prompt,
                                 const epd_sample_params_t *sp, uint32_t max_tokens, int32_t *out,
                                 uint32_t *n_out_p);

/* The same with image embeddings placed at their placeholders (spans as
 * epd_prefill_args_t.embeds; NULL / 0: text only), as epd-generate --image. */
epd_status_t epd_itest_colocated_mm(epd_engine_t *engine, const int32_t *prompt, uint32_t n_prompt,
                                    const epd_embed_span_t *spans, uint32_t n_spans,
                                    const epd_sample_params_t *sp, uint32_t max_tokens,
                                    int32_t *out, uint32_t *n_out_p);

#endif
