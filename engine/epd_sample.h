/*
 * epd_sample.h — next-token sampling: greedy, temperature, top-k, top-p.
 *
 * Sampling is stateless: the random draw for step `step` of a request comes
 * from (seed, step) alone, not from a generator carried along.  A request
 * can therefore sample its first token on a prefill node and the rest on a
 * decode node and still produce exactly the colocated output, with nothing
 * but the seed and the step index travelling between them.
 *
 * Order of operations: temperature 0 means greedy (argmax, lowest id on a
 * tie; no randomness).  Otherwise logits / temperature -> softmax -> keep the
 * top_k most likely (0 = all) -> keep the smallest prefix of those whose
 * probability sums to >= top_p (1 = all; at least one token always stays) ->
 * renormalise -> one uniform draw.  Ties in probability are ordered by id, so
 * the result is a pure function of the inputs.
 */
#ifndef EPD_SAMPLE_H
#define EPD_SAMPLE_H

#include <stdint.h>

#include "epd_status.h"

typedef struct {
    float temperature; /* 0 = greedy; otherwise in (0, 100] */
    uint32_t top_k;    /* 0 = no limit */
    float top_p;       /* in (0, 1] */
    uint64_t seed;
} epd_sample_params_t;

/* Greedy, top_k 0, top_p 1, seed 0. */
void epd_sample_params_default(epd_sample_params_t *params_p);

/* EPD_OK when the parameters are in range; EPD_ERR_INVALID_PARAM otherwise. */
epd_status_t epd_sample_params_check(const epd_sample_params_t *params);

/* Per-thread scratch sized for one vocabulary (top-k / top-p sort space). */
typedef struct epd_sample_scratch epd_sample_scratch_t;

/* *scratch_p owned by the caller; EPD_ERR_NO_MEMORY, EPD_ERR_INVALID_PARAM
 * for vocab 0. */
epd_status_t epd_sample_scratch_create(uint32_t vocab, epd_sample_scratch_t **scratch_p);
/* NULL is a no-op. */
void epd_sample_scratch_destroy(epd_sample_scratch_t *scratch);

/*
 * Samples one token id from logits[0..vocab) (borrowed) for generation step
 * `step` (0 = the first generated token).  vocab must not exceed the
 * scratch's.  EPD_ERR_INVALID_PARAM for bad parameters or a logit that is
 * NaN.  Allocates nothing; one thread per scratch.
 */
epd_status_t epd_sample_token(const epd_sample_params_t *params, epd_sample_scratch_t *scratch,
                              const float *logits, uint32_t vocab, uint64_t step, int32_t *token_p);

#endif
