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

#include <stddef.h>
#include <stdint.h>

#include "epd_status.h"

/*
 * Adjusting the logits before sampling (vLLM's formulas and order), for
 * requests that ask for it; epd_sample_adjust changes logits in place and
 * the caller then samples them with epd_sample_token (greedy included):
 *
 *   1. logit_bias: logits[id] += bias (ids < vocab; values in [-100, 100],
 *      as OpenAI clamps them);
 *   2. min_tokens: while fewer than min_tokens tokens were generated, the
 *      logits of every eos id and of every stop_token_ids entry are -inf;
 *   3. repetition_penalty r (vLLM's, "CTRL"): for each distinct token of
 *      prompt + output, logit / r when the logit is > 0, logit * r
 *      otherwise;
 *   4. frequency_penalty f and presence_penalty p (OpenAI's): for each
 *      token of the output alone, logit -= f * count + p * (count > 0).
 *
 * Then temperature, top-k and top-p as epd_sample_token does.
 */
/* The most logit_bias entries a request may carry (OpenAI's limit). */
#define EPD_SAMPLE_MAX_BIAS 300
/* The most stop token ids a request may carry (decode's limit). */
#define EPD_SAMPLE_MAX_STOP_IDS 64

typedef struct {
    uint32_t id;
    float bias;
} epd_sample_bias_t;

typedef struct {
    float presence_penalty;        /* [-2, 2]; 0: off */
    float frequency_penalty;       /* [-2, 2]; 0: off */
    float repetition_penalty;      /* (0, 2]; 0 or 1: off */
    const epd_sample_bias_t *bias; /* borrowed [n_bias]; ids < vocab */
    uint32_t n_bias;
    uint32_t min_tokens;    /* 0: off */
    const int32_t *eos_ids; /* borrowed [n_eos] (min_tokens masks them) */
    uint32_t n_eos;
    const uint32_t *stop_ids; /* borrowed [n_stop_ids] (min_tokens masks them) */
    uint32_t n_stop_ids;
} epd_sample_adjust_t;

/* All off. */
void epd_sample_adjust_default(epd_sample_adjust_t *adj_p);

/* 1 when `adj` changes nothing (the caller may skip epd_sample_adjust). */
int epd_sample_adjust_is_off(const epd_sample_adjust_t *adj);

/* EPD_OK when the adjustments are in range for `vocab`;
 * EPD_ERR_INVALID_PARAM otherwise. */
epd_status_t epd_sample_adjust_check(const epd_sample_adjust_t *adj, uint32_t vocab);

typedef struct {
    float temperature; /* 0 = greedy; otherwise in (0, 100] */
    uint32_t top_k;    /* 0 = no limit */
    float top_p;       /* in (0, 1] */
    uint64_t seed;
    /* A request's logit adjustments, carried by value with it (prefill's
     * job, decode's sequence: nothing borrowed to dangle); all 0: none.
     * epd_sample_adjust_of turns them into an epd_sample_adjust_t. */
    float presence_penalty;
    float frequency_penalty;
    float repetition_penalty; /* 0 or 1: off */
    uint32_t min_tokens;
    int ignore_eos; /* not the sampler's: decode's stop rule reads it */
    uint32_t n_bias;
    epd_sample_bias_t bias[EPD_SAMPLE_MAX_BIAS];
    uint32_t logprobs;   /* 0: none; 1 + k: the token's logprob and its k best */
    uint32_t n_stop_ids; /* the request's stop ids (min_tokens masks them) */
    uint32_t stop_ids[EPD_SAMPLE_MAX_STOP_IDS];
} epd_sample_params_t;

/* The adjustments of `params` (borrowed: adj points into it) with the
 * model's eos ids (borrowed) for min_tokens. */
void epd_sample_adjust_of(const epd_sample_params_t *params, const int32_t *eos_ids, uint32_t n_eos,
                          epd_sample_adjust_t *adj_p);

/* Greedy, top_k 0, top_p 1, seed 0, no adjustments. */
void epd_sample_params_default(epd_sample_params_t *params_p);

/* EPD_OK when the parameters are in range; EPD_ERR_INVALID_PARAM otherwise. */
epd_status_t epd_sample_params_check(const epd_sample_params_t *params);

/* Log-probabilities of one generated token, as an OpenAI answer reports
 * them: the log-softmax of the raw logits (before temperature, penalties
 * and bias; as epd-generate --jsonl prints them), of the token and of the
 * n_top most likely ids (best first; ties: lower id first). */
#define EPD_SAMPLE_MAX_LOGPROBS 20

typedef struct {
    double logprob;
    uint32_t n_top;
    uint32_t top_ids[EPD_SAMPLE_MAX_LOGPROBS];
    double top_logprobs[EPD_SAMPLE_MAX_LOGPROBS];
} epd_sample_logprob_t;

/* Fills *out for `token` of logits[0..vocab) (borrowed) with the k (<=
 * EPD_SAMPLE_MAX_LOGPROBS) best alternatives: log-softmax computed in
 * double as mx + log(sum exp(l - mx)), bit for bit epd-generate --jsonl's.
 * O(vocab * log k).  EPD_ERR_INVALID_PARAM for bad arguments.  Pure. */
epd_status_t epd_sample_logprobs(const float *logits, uint32_t vocab, int32_t token, uint32_t k,
                                 epd_sample_logprob_t *out);

/* Per-thread scratch sized for one vocabulary (top-k / top-p sort space). */
typedef struct epd_sample_scratch epd_sample_scratch_t;

/* *scratch_p owned by the caller; EPD_ERR_NO_MEMORY, EPD_ERR_INVALID_PARAM
 * for vocab 0. */
epd_status_t epd_sample_scratch_create(uint32_t vocab, epd_sample_scratch_t **scratch_p);
/* NULL is a no-op. */
void epd_sample_scratch_destroy(epd_sample_scratch_t *scratch);
/* The scratch's own [vocab] float buffer (owned by the scratch): where a
 * caller that must keep its raw logits (for logprobs) adjusts a copy. */
float *epd_sample_scratch_logits(epd_sample_scratch_t *scratch);

/*
 * Samples one token id from logits[0..vocab) (borrowed) for generation step
 * `step` (0 = the first generated token).  vocab must not exceed the
 * scratch's.  EPD_ERR_INVALID_PARAM for bad parameters or a logit that is
 * NaN.  Allocates nothing; one thread per scratch.
 */
epd_status_t epd_sample_token(const epd_sample_params_t *params, epd_sample_scratch_t *scratch,
                              const float *logits, uint32_t vocab, uint64_t step, int32_t *token_p);

/*
 * Applies `adj` (see above) to logits[0..vocab) in place, for a request
 * whose prompt is prompt[0..n_prompt) and which generated
 * output[0..n_output) so far (both borrowed; ids >= vocab are skipped).
 * O(n_prompt + n_output + n_bias); the scratch's count space is left
 * clean.  EPD_ERR_INVALID_PARAM for bad adjustments.  One thread per
 * scratch.
 */
epd_status_t epd_sample_adjust(const epd_sample_adjust_t *adj, epd_sample_scratch_t *scratch,
                               float *logits, uint32_t vocab, const uint32_t *prompt,
                               size_t n_prompt, const uint32_t *output, size_t n_output);

#endif
