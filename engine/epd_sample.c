/*
 * epd_sample.c — probabilities are computed in double; the candidate list is
 * sorted only when top-k or top-p can cut it (plain temperature sampling
 * walks the vocabulary in id order).
 */
#include "epd_sample.h"

#include <math.h>
#include <stdlib.h>

#include "epd_alloc.h"
#include "epd_rng.h"

struct epd_sample_scratch {
    uint32_t vocab;
    uint32_t *ids; /* [vocab] */
    double *probs; /* [vocab] indexed by id */
    uint32_t *counts; /* [vocab] epd_sample_adjust: all 0 between calls */
    uint8_t *seen;    /* [vocab] epd_sample_adjust: all 0 between calls */
    float *logits;    /* [vocab] epd_sample_scratch_logits */
};

void epd_sample_params_default(epd_sample_params_t *p)
{
    p->temperature = 0.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->seed = 0;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->repetition_penalty = 0.0f;
    p->min_tokens = 0;
    p->ignore_eos = 0;
    p->n_bias = 0;
    p->n_stop_ids = 0;
    p->logprobs = 0;
}

float *epd_sample_scratch_logits(epd_sample_scratch_t *s)
{
    return s->logits;
}

void epd_sample_adjust_of(const epd_sample_params_t *p, const int32_t *eos_ids, uint32_t n_eos,
                          epd_sample_adjust_t *a)
{
    epd_sample_adjust_default(a);
    a->presence_penalty = p->presence_penalty;
    a->frequency_penalty = p->frequency_penalty;
    a->repetition_penalty = p->repetition_penalty;
    a->bias = p->bias;
    a->n_bias = p->n_bias;
    a->min_tokens = p->min_tokens;
    a->eos_ids = eos_ids;
    a->n_eos = n_eos;
    a->stop_ids = p->stop_ids;
    a->n_stop_ids = p->n_stop_ids;
}

epd_status_t epd_sample_params_check(const epd_sample_params_t *p)
{
    if (p == NULL || !(p->temperature >= 0.0f) || p->temperature > 100.0f || !(p->top_p > 0.0f) ||
        p->top_p > 1.0f) {
        return EPD_ERR_INVALID_PARAM;
    }
    return EPD_OK;
}

epd_status_t epd_sample_scratch_create(uint32_t vocab, epd_sample_scratch_t **scratch_p)
{
    epd_sample_scratch_t *s;

    if (vocab == 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    s = epd_calloc(1, sizeof(*s));
    if (s == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    s->vocab = vocab;
    s->ids = epd_calloc(vocab, sizeof(*s->ids));
    s->probs = epd_calloc(vocab, sizeof(*s->probs));
    s->counts = epd_calloc(vocab, sizeof(*s->counts));
    s->seen = epd_calloc(vocab, sizeof(*s->seen));
    s->logits = epd_calloc(vocab, sizeof(*s->logits));
    if (s->ids == NULL || s->probs == NULL || s->counts == NULL || s->seen == NULL ||
        s->logits == NULL) {
        epd_sample_scratch_destroy(s);
        return EPD_ERR_NO_MEMORY;
    }
    *scratch_p = s;
    return EPD_OK;
}

void epd_sample_scratch_destroy(epd_sample_scratch_t *s)
{
    if (s == NULL) {
        return;
    }
    epd_free(s->logits);
    epd_free(s->seen);
    epd_free(s->counts);
    epd_free(s->probs);
    epd_free(s->ids);
    epd_free(s);
}

/* qsort has no context argument: the probabilities travel through a
 * thread-local pointer, set only around the qsort call. */
static _Thread_local const double *epd_sample_sort_probs;

static int epd_sample_cmp(const void *a, const void *b)
{
    uint32_t ia = *(const uint32_t *)a;
    uint32_t ib = *(const uint32_t *)b;
    double pa = epd_sample_sort_probs[ia];
    double pb = epd_sample_sort_probs[ib];

    if (pa != pb) {
        return pa > pb ? -1 : 1;
    }
    return ia < ib ? -1 : (ia > ib ? 1 : 0);
}

/* Nonzero when id a sorts before id b: higher probability first, the lower
 * id among equals (epd_sample_cmp's total order). */
static inline int epd_sample_before(const double *probs, uint32_t a, uint32_t b)
{
    return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
}

static inline void epd_sample_swap(uint32_t *ids, uint32_t i, uint32_t j)
{
    uint32_t t = ids[i];

    ids[i] = ids[j];
    ids[j] = t;
}

/* Hoare's selection (nth_element) under epd_sample_before: afterwards
 * ids[0..k) hold the k first ids of the total order, in no order, for
 * 0 < k < n.  The order is total (ties broken by id), so the set is the
 * one a full sort puts first.  Expected O(n). */
static void epd_sample_select(const double *probs, uint32_t *ids, uint32_t n, uint32_t k)
{
    uint32_t lo = 0, hi = n - 1;

    while (hi > lo) {
        uint32_t mid = lo + (hi - lo) / 2;
        uint32_t pivot, i = lo, j = hi;

        /* median of three into ids[mid] */
        if (epd_sample_before(probs, ids[mid], ids[lo])) {
            epd_sample_swap(ids, mid, lo);
        }
        if (epd_sample_before(probs, ids[hi], ids[lo])) {
            epd_sample_swap(ids, hi, lo);
        }
        if (epd_sample_before(probs, ids[hi], ids[mid])) {
            epd_sample_swap(ids, hi, mid);
        }
        pivot = ids[mid];
        for (;;) {
            while (epd_sample_before(probs, ids[i], pivot)) {
                i++;
            }
            while (epd_sample_before(probs, pivot, ids[j])) {
                j--;
            }
            if (i >= j) {
                break;
            }
            epd_sample_swap(ids, i, j);
            i++;
            j--;
        }
        /* ids[lo..j] sort no later than ids[j+1..hi] */
        if (k - 1 <= j) {
            hi = j;
        } else {
            lo = j + 1;
        }
    }
}

/* The candidates of top-k / top-p: ids[0..*n_p) the first of the total
 * order, sorted, cut where top-k and then the cumulative top-p say.  A
 * 150k-entry vocabulary is not sorted whole (tens of ms a token): the k
 * best are selected and only they are sorted; top-p alone starts from 256
 * and widens eightfold until the cut falls inside (a flat distribution
 * ends in a full sort, as before).  Same ids, same order as sorting all. */
static uint32_t epd_sample_candidates(const epd_sample_params_t *p, epd_sample_scratch_t *s,
                                      uint32_t vocab)
{
    uint32_t k = p->top_k > 0 && p->top_k < vocab ? p->top_k : (vocab < 256 ? vocab : 256);
    int fixed = p->top_k > 0 && p->top_k < vocab;

    for (;;) {
        double cum = 0.0;

        if (k < vocab) {
            epd_sample_select(s->probs, s->ids, vocab, k);
        }
        epd_sample_sort_probs = s->probs;
        qsort(s->ids, k, sizeof(*s->ids), epd_sample_cmp);
        epd_sample_sort_probs = NULL;
        for (uint32_t i = 0; i < k; i++) {
            cum += s->probs[s->ids[i]];
            if (cum >= p->top_p) {
                return i + 1;
            }
        }
        if (fixed || k == vocab) {
            return k;
        }
        k = vocab / 8 < k ? vocab : k * 8;
    }
}

epd_status_t epd_sample_token(const epd_sample_params_t *p, epd_sample_scratch_t *s,
                              const float *logits, uint32_t vocab, uint64_t step, int32_t *token_p)
{
    uint32_t best = 0;
    uint32_t n;
    double total = 0.0;
    double u;
    epd_rng_t rng;

    if (epd_sample_params_check(p) != EPD_OK || s == NULL || logits == NULL || vocab == 0 ||
        vocab > s->vocab) {
        return EPD_ERR_INVALID_PARAM;
    }
    for (uint32_t i = 0; i < vocab; i++) {
        if (isnan(logits[i])) {
            return EPD_ERR_INVALID_PARAM;
        }
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    if (p->temperature == 0.0f) {
        *token_p = (int32_t)best;
        return EPD_OK;
    }
    for (uint32_t i = 0; i < vocab; i++) {
        s->probs[i] = exp(((double)logits[i] - logits[best]) / p->temperature);
        total += s->probs[i];
        s->ids[i] = i;
    }
    for (uint32_t i = 0; i < vocab; i++) {
        s->probs[i] /= total;
    }
    n = vocab;
    if ((p->top_k > 0 && p->top_k < vocab) || p->top_p < 1.0f) {
        n = epd_sample_candidates(p, s, vocab);
    }
    total = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        total += s->probs[s->ids[i]];
    }
    /* One draw from (seed, step): splitmix-style mixing of the step keeps
     * neighbouring steps independent. */
    epd_rng_seed(&rng, p->seed ^ (0x9e3779b97f4a7c15ull * (step + 1)));
    u = epd_rng_uniform(&rng) * total;
    for (uint32_t i = 0; i < n; i++) {
        u -= s->probs[s->ids[i]];
        if (u < 0.0) {
            *token_p = (int32_t)s->ids[i];
            return EPD_OK;
        }
    }
    *token_p = (int32_t)s->ids[n - 1]; /* rounding left u at ~0 */
    return EPD_OK;
}

void epd_sample_adjust_default(epd_sample_adjust_t *a)
{
    a->presence_penalty = 0.0f;
    a->frequency_penalty = 0.0f;
    a->repetition_penalty = 1.0f;
    a->bias = NULL;
    a->n_bias = 0;
    a->min_tokens = 0;
    a->eos_ids = NULL;
    a->n_eos = 0;
    a->stop_ids = NULL;
    a->n_stop_ids = 0;
}

int epd_sample_adjust_is_off(const epd_sample_adjust_t *a)
{
    return a == NULL || (a->presence_penalty == 0.0f && a->frequency_penalty == 0.0f &&
                         (a->repetition_penalty == 0.0f || a->repetition_penalty == 1.0f) &&
                         a->n_bias == 0 && a->min_tokens == 0);
}

epd_status_t epd_sample_adjust_check(const epd_sample_adjust_t *a, uint32_t vocab)
{
    if (a == NULL || !(a->presence_penalty >= -2.0f && a->presence_penalty <= 2.0f) ||
        !(a->frequency_penalty >= -2.0f && a->frequency_penalty <= 2.0f) ||
        !(a->repetition_penalty >= 0.0f && a->repetition_penalty <= 2.0f) ||
        (a->n_bias > 0 && a->bias == NULL) || a->n_bias > EPD_SAMPLE_MAX_BIAS ||
        (a->n_stop_ids > 0 && a->stop_ids == NULL) || (a->n_eos > 0 && a->eos_ids == NULL)) {
        return EPD_ERR_INVALID_PARAM;
    }
    for (uint32_t i = 0; i < a->n_bias; i++) {
        if (a->bias[i].id >= vocab || !(a->bias[i].bias >= -100.0f && a->bias[i].bias <= 100.0f)) {
            return EPD_ERR_INVALID_PARAM;
        }
    }
    return EPD_OK;
}

/* Penalties for one distinct token t of prompt + output (s->seen[t]: bit 0
 * in the prompt, bit 1 in the output; s->counts[t]: its output count),
 * then its scratch entries cleared so that it is visited once. */
static void epd_sample_penalize_one(const epd_sample_adjust_t *a, epd_sample_scratch_t *s,
                                    float *logits, uint32_t t)
{
    float r = a->repetition_penalty;

    if (s->seen[t] == 0) {
        return;
    }
    if (r != 0.0f && r != 1.0f) {
        logits[t] = logits[t] > 0.0f ? logits[t] / r : logits[t] * r;
    }
    if (s->counts[t] > 0) {
        logits[t] -= a->frequency_penalty * (float)s->counts[t] + a->presence_penalty;
    }
    s->seen[t] = 0;
    s->counts[t] = 0;
}

epd_status_t epd_sample_adjust(const epd_sample_adjust_t *a, epd_sample_scratch_t *s, float *logits,
                               uint32_t vocab, const uint32_t *prompt, size_t n_prompt,
                               const uint32_t *output, size_t n_output)
{
    int rep;

    if (s == NULL || logits == NULL || vocab == 0 || vocab > s->vocab ||
        (n_prompt > 0 && prompt == NULL) || (n_output > 0 && output == NULL) ||
        epd_sample_adjust_check(a, vocab) != EPD_OK) {
        return EPD_ERR_INVALID_PARAM;
    }
    for (uint32_t i = 0; i < a->n_bias; i++) {
        logits[a->bias[i].id] += a->bias[i].bias;
    }
    if (n_output < a->min_tokens) {
        for (uint32_t i = 0; i < a->n_eos; i++) {
            if (a->eos_ids[i] >= 0 && (uint32_t)a->eos_ids[i] < vocab) {
                logits[a->eos_ids[i]] = -INFINITY;
            }
        }
        for (uint32_t i = 0; i < a->n_stop_ids; i++) {
            if (a->stop_ids[i] < vocab) {
                logits[a->stop_ids[i]] = -INFINITY;
            }
        }
    }
    rep = a->repetition_penalty != 0.0f && a->repetition_penalty != 1.0f;
    if (!rep && a->presence_penalty == 0.0f && a->frequency_penalty == 0.0f) {
        return EPD_OK;
    }
    /* mark, then visit each distinct token once (clearing as it goes) */
    if (rep) {
        for (size_t i = 0; i < n_prompt; i++) {
            if (prompt[i] < vocab) {
                s->seen[prompt[i]] |= 1u;
            }
        }
    }
    for (size_t i = 0; i < n_output; i++) {
        if (output[i] < vocab) {
            s->seen[output[i]] |= 2u;
            s->counts[output[i]]++;
        }
    }
    if (rep) {
        for (size_t i = 0; i < n_prompt; i++) {
            if (prompt[i] < vocab) {
                epd_sample_penalize_one(a, s, logits, prompt[i]);
            }
        }
    }
    for (size_t i = 0; i < n_output; i++) {
        if (output[i] < vocab) {
            epd_sample_penalize_one(a, s, logits, output[i]);
        }
    }
    return EPD_OK;
}

epd_status_t epd_sample_logprobs(const float *logits, uint32_t vocab, int32_t token, uint32_t k,
                                 epd_sample_logprob_t *out)
{
    double mx;
    double sum = 0.0;
    double lse;
    uint32_t n = 0;

    if (logits == NULL || out == NULL || vocab == 0 || token < 0 || (uint32_t)token >= vocab ||
        k > EPD_SAMPLE_MAX_LOGPROBS) {
        return EPD_ERR_INVALID_PARAM;
    }
    /* the very operations of epd-generate's epd_gen_jsonl, in its order */
    mx = logits[0];
    for (uint32_t i = 1; i < vocab; i++) {
        mx = logits[i] > mx ? logits[i] : mx;
    }
    for (uint32_t i = 0; i < vocab; i++) {
        sum += exp((double)logits[i] - mx);
    }
    lse = mx + log(sum);
    out->logprob = (double)logits[token] - lse;
    /* the k best in one pass: a sorted list of at most k ids (a later id
     * enters only when strictly better, so ties keep the lower id first) */
    for (uint32_t i = 0; i < vocab && k > 0; i++) {
        uint32_t at;

        if (n == k && !(logits[i] > logits[out->top_ids[n - 1]])) {
            continue;
        }
        at = n < k ? n : k - 1;
        while (at > 0 && logits[i] > logits[out->top_ids[at - 1]]) {
            out->top_ids[at] = out->top_ids[at - 1];
            at--;
        }
        out->top_ids[at] = i;
        n += n < k;
    }
    out->n_top = n;
    for (uint32_t j = 0; j < n; j++) {
        out->top_logprobs[j] = (double)logits[out->top_ids[j]] - lse;
    }
    return EPD_OK;
}
