/* test_epd_sample.c — greedy, temperature, top-k, top-p; reproducible from
 * (seed, step); the empirical distribution matches the softmax. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "epd_rng.h"
#include "epd_sample.h"

#define V 16

static epd_sample_scratch_t *scratch;
static float logits[V];

static int setup(void **state)
{
    (void)state;
    for (int i = 0; i < V; i++) {
        logits[i] = (float)sin(i * 1.7) * 2.0f; /* max at i = 11 */
    }
    return epd_sample_scratch_create(V, &scratch) == EPD_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    epd_sample_scratch_destroy(scratch);
    return 0;
}

static int32_t draw(float t, uint32_t k, float p, uint64_t seed, uint64_t step)
{
    epd_sample_params_t sp = {.temperature = t, .top_k = k, .top_p = p, .seed = seed};
    int32_t tok = -1;

    assert_int_equal(epd_sample_token(&sp, scratch, logits, V, step, &tok), EPD_OK);
    return tok;
}

static int32_t argmax(void)
{
    int best = 0;

    for (int i = 1; i < V; i++) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return best;
}

static void test_greedy(void **state)
{
    float ties[4] = {1.0f, 3.0f, 3.0f, 0.0f};
    epd_sample_params_t sp;
    int32_t tok;

    (void)state;
    for (uint64_t s = 0; s < 20; s++) {
        assert_int_equal(draw(0.0f, 0, 1.0f, s, s), argmax());
    }
    epd_sample_params_default(&sp);
    assert_int_equal(epd_sample_token(&sp, scratch, ties, 4, 0, &tok), EPD_OK);
    assert_int_equal(tok, 1); /* lowest id on a tie */
}

static void test_top_k_one_and_tiny_top_p_are_greedy(void **state)
{
    (void)state;
    for (uint64_t s = 0; s < 200; s++) {
        assert_int_equal(draw(1.5f, 1, 1.0f, s, s), argmax());
        assert_int_equal(draw(1.5f, 0, 1e-6f, s, s), argmax());
    }
}

static void test_top_k_limits_the_candidates(void **state)
{
    int hits[V] = {0};
    int sorted[V];
    int kept = 0;

    (void)state;
    for (uint64_t s = 0; s < 3000; s++) {
        hits[draw(5.0f, 3, 1.0f, 1, s)]++;
    }
    /* the three largest logits and nothing else */
    for (int i = 0; i < V; i++) {
        sorted[i] = i;
    }
    for (int i = 0; i < V; i++) {
        for (int j = i + 1; j < V; j++) {
            if (logits[sorted[j]] > logits[sorted[i]]) {
                int t = sorted[i];

                sorted[i] = sorted[j];
                sorted[j] = t;
            }
        }
    }
    for (int i = 0; i < V; i++) {
        kept += hits[i] > 0;
    }
    assert_int_equal(kept, 3);
    assert_true(hits[sorted[0]] > 0 && hits[sorted[1]] > 0 && hits[sorted[2]] > 0);
}

static void test_distribution_matches_softmax(void **state)
{
    float two[2] = {0.0f, (float)log(3.0)}; /* p = 1/4, 3/4 */
    epd_sample_params_t sp = {.temperature = 1.0f, .top_p = 1.0f, .seed = 99};
    int ones = 0;
    const int n = 20000;

    (void)state;
    for (int s = 0; s < n; s++) {
        int32_t tok;

        assert_int_equal(epd_sample_token(&sp, scratch, two, 2, (uint64_t)s, &tok), EPD_OK);
        ones += tok;
    }
    assert_true(fabs((double)ones / n - 0.75) < 0.02);
    /* top-p 0.7 keeps only the 3/4 token */
    sp.top_p = 0.7f;
    for (int s = 0; s < 100; s++) {
        int32_t tok;

        assert_int_equal(epd_sample_token(&sp, scratch, two, 2, (uint64_t)s, &tok), EPD_OK);
        assert_int_equal(tok, 1);
    }
}

static void test_reproducible(void **state)
{
    int same_step_other_seed = 0;

    (void)state;
    for (uint64_t s = 0; s < 100; s++) {
        assert_int_equal(draw(2.0f, 0, 0.9f, 1234, s), draw(2.0f, 0, 0.9f, 1234, s));
        same_step_other_seed += draw(2.0f, 0, 1.0f, 1234, s) == draw(2.0f, 0, 1.0f, 4321, s);
    }
    assert_true(same_step_other_seed < 60);
}

static void test_refuses_bad_input(void **state)
{
    epd_sample_params_t sp = {.temperature = 1.0f, .top_p = 1.0f};
    float nan_logits[2] = {0.0f, NAN};
    int32_t tok = 77;

    (void)state;
    sp.top_p = 0.0f;
    assert_int_equal(epd_sample_token(&sp, scratch, logits, V, 0, &tok), EPD_ERR_INVALID_PARAM);
    sp.top_p = 1.5f;
    assert_int_equal(epd_sample_token(&sp, scratch, logits, V, 0, &tok), EPD_ERR_INVALID_PARAM);
    sp.top_p = 1.0f;
    sp.temperature = -1.0f;
    assert_int_equal(epd_sample_token(&sp, scratch, logits, V, 0, &tok), EPD_ERR_INVALID_PARAM);
    sp.temperature = 1.0f;
    assert_int_equal(epd_sample_token(&sp, scratch, logits, V + 1, 0, &tok), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_sample_token(&sp, scratch, nan_logits, 2, 0, &tok), EPD_ERR_INVALID_PARAM);
    assert_int_equal(tok, 77); /* untouched on error */
    assert_int_equal(epd_sample_scratch_create(0, &scratch), EPD_ERR_INVALID_PARAM);
}

/* ---- epd_sample_adjust against a reference computation (vLLM's formulas,
 * token by token over the whole vocabulary, O(V * N)) ---- */

static void reference_adjust(const epd_sample_adjust_t *a, float *out, const uint32_t *prompt,
                             size_t n_prompt, const uint32_t *output, size_t n_output)
{
    for (uint32_t v = 0; v < V; v++) {
        float x = logits[v];
        int in_prompt = 0;
        uint32_t count = 0;

        for (uint32_t i = 0; i < a->n_bias; i++) {
            if (a->bias[i].id == v) {
                x += a->bias[i].bias;
            }
        }
        if (n_output < a->min_tokens) {
            int masked = 0;

            for (uint32_t i = 0; i < a->n_eos; i++) {
                masked |= a->eos_ids[i] == (int32_t)v;
            }
            for (uint32_t i = 0; i < a->n_stop_ids; i++) {
                masked |= a->stop_ids[i] == v;
            }
            if (masked) {
                x = -INFINITY;
            }
        }
        for (size_t i = 0; i < n_prompt; i++) {
            in_prompt |= prompt[i] == v;
        }
        for (size_t i = 0; i < n_output; i++) {
            count += output[i] == v;
        }
        if (a->repetition_penalty != 1.0f && a->repetition_penalty != 0.0f &&
            (in_prompt || count > 0)) {
            x = x > 0.0f ? x / a->repetition_penalty : x * a->repetition_penalty;
        }
        if (count > 0) {
            x -= a->frequency_penalty * (float)count + a->presence_penalty;
        }
        out[v] = x;
    }
}

static void check_adjust(const epd_sample_adjust_t *a, const uint32_t *prompt, size_t n_prompt,
                         const uint32_t *output, size_t n_output)
{
    float got[V];
    float want[V];

    memcpy(got, logits, sizeof(got));
    reference_adjust(a, want, prompt, n_prompt, output, n_output);
    assert_int_equal(epd_sample_adjust(a, scratch, got, V, prompt, n_prompt, output, n_output),
                     EPD_OK);
    for (int v = 0; v < V; v++) {
        if (isinf(want[v])) {
            assert_true(isinf(got[v]) && got[v] < 0);
        } else {
            assert_true(got[v] == want[v]); /* the same float operations */
        }
    }
}

static void test_adjust_matches_reference(void **state)
{
    /* token 11 is the argmax (logit ~1.9), 3 is negative, 99 out of vocab */
    const uint32_t prompt[] = {11, 3, 3, 7, 99, 11};
    const uint32_t output[] = {11, 5, 5, 5, 3, 99};
    const epd_sample_bias_t bias[] = {{0, 100.0f}, {4, -2.5f}, {4, 1.0f}};
    const uint32_t stops[] = {2, 9};
    const int32_t eos[] = {1, 14};
    epd_sample_adjust_t a;
    float lg[V];
    int32_t tok;

    (void)state;
    epd_sample_adjust_default(&a);
    assert_true(epd_sample_adjust_is_off(&a));
    check_adjust(&a, prompt, 6, output, 6);
    a.repetition_penalty = 1.7f;
    check_adjust(&a, prompt, 6, output, 6); /* repetition alone (prompt + output) */
    check_adjust(&a, prompt, 6, NULL, 0);   /* the first token: prompt only */
    epd_sample_adjust_default(&a);
    a.frequency_penalty = 0.6f;
    check_adjust(&a, prompt, 6, output, 6); /* frequency alone (output only) */
    epd_sample_adjust_default(&a);
    a.presence_penalty = -1.25f;
    check_adjust(&a, prompt, 6, output, 6); /* presence alone, negative */
    epd_sample_adjust_default(&a);
    a.bias = bias;
    a.n_bias = 3;
    check_adjust(&a, prompt, 6, output, 6); /* bias alone (repeated ids add) */
    epd_sample_adjust_default(&a);
    a.min_tokens = 7;
    a.eos_ids = eos;
    a.n_eos = 2;
    a.stop_ids = stops;
    a.n_stop_ids = 2;
    check_adjust(&a, prompt, 6, output, 6); /* min_tokens: 6 < 7 masks 1, 14, 2, 9 */
    a.min_tokens = 6;
    check_adjust(&a, prompt, 6, output, 6); /* reached: nothing masked */
    /* all together, twice: the scratch's count space came back clean */
    a.min_tokens = 9;
    a.repetition_penalty = 1.3f;
    a.frequency_penalty = 0.5f;
    a.presence_penalty = 0.25f;
    a.bias = bias;
    a.n_bias = 3;
    check_adjust(&a, prompt, 6, output, 6);
    check_adjust(&a, prompt, 6, output, 6);

    /* what a client sees: greedy follows the adjusted logits */
    epd_sample_adjust_default(&a);
    a.bias = bias; /* +100 on token 0 */
    a.n_bias = 1;
    memcpy(lg, logits, sizeof(lg));
    assert_int_equal(epd_sample_adjust(&a, scratch, lg, V, NULL, 0, NULL, 0), EPD_OK);
    {
        epd_sample_params_t sp;

        epd_sample_params_default(&sp);
        assert_int_equal(epd_sample_token(&sp, scratch, lg, V, 0, &tok), EPD_OK);
        assert_int_equal(tok, 0);
    }

    /* refusals */
    epd_sample_adjust_default(&a);
    a.presence_penalty = 2.5f;
    assert_int_equal(epd_sample_adjust_check(&a, V), EPD_ERR_INVALID_PARAM);
    epd_sample_adjust_default(&a);
    a.repetition_penalty = NAN;
    assert_int_equal(epd_sample_adjust_check(&a, V), EPD_ERR_INVALID_PARAM);
    epd_sample_adjust_default(&a);
    {
        const epd_sample_bias_t oov = {V, 1.0f};
        const epd_sample_bias_t big = {1, 1e30f};

        a.bias = &oov;
        a.n_bias = 1;
        assert_int_equal(epd_sample_adjust_check(&a, V), EPD_ERR_INVALID_PARAM);
        a.bias = &big;
        assert_int_equal(epd_sample_adjust_check(&a, V), EPD_ERR_INVALID_PARAM);
        memcpy(lg, logits, sizeof(lg));
        assert_int_equal(epd_sample_adjust(&a, scratch, lg, V, NULL, 0, NULL, 0),
                         EPD_ERR_INVALID_PARAM);
    }
}

/* epd_sample_logprobs against the k-pass reference epd-generate --jsonl
 * uses (ties: lower id first), logits with ties included */
/* The sampler as it was before candidates were selected instead of sorted
 * whole: when top-k or top-p can cut, every id sorted by (probability
 * desc, id asc) and cut by top-k then top-p; one draw.  The selection must give the same token for any input. */
static const double *ref_probs;

static int ref_cmp(const void *a, const void *b)
{
    uint32_t ia = *(const uint32_t *)a, ib = *(const uint32_t *)b;

    if (ref_probs[ia] != ref_probs[ib]) {
        return ref_probs[ia] > ref_probs[ib] ? -1 : 1;
    }
    return ia < ib ? -1 : (ia > ib ? 1 : 0);
}

static int32_t ref_sample(const epd_sample_params_t *p, const float *lg, uint32_t n_vocab,
                          uint64_t step, double *probs, uint32_t *ids)
{
    uint32_t best = 0, n = n_vocab;
    double total = 0.0, u;
    epd_rng_t rng;

    for (uint32_t i = 0; i < n_vocab; i++) {
        best = lg[i] > lg[best] ? i : best;
    }
    for (uint32_t i = 0; i < n_vocab; i++) {
        probs[i] = exp(((double)lg[i] - lg[best]) / p->temperature);
        total += probs[i];
        ids[i] = i;
    }
    for (uint32_t i = 0; i < n_vocab; i++) {
        probs[i] /= total;
    }
    if ((p->top_k > 0 && p->top_k < n_vocab) || p->top_p < 1.0f) {
        ref_probs = probs;
        qsort(ids, n_vocab, sizeof(*ids), ref_cmp);
        if (p->top_k > 0 && p->top_k < n) {
            n = p->top_k;
        }
        total = 0.0;
        for (uint32_t i = 0; i < n; i++) {
            total += probs[ids[i]];
            if (total >= p->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    total = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        total += probs[ids[i]];
    }
    epd_rng_seed(&rng, p->seed ^ (0x9e3779b97f4a7c15ull * (step + 1)));
    u = epd_rng_uniform(&rng) * total;
    for (uint32_t i = 0; i < n; i++) {
        u -= probs[ids[i]];
        if (u < 0.0) {
            return (int32_t)ids[i];
        }
    }
    return (int32_t)ids[n - 1];
}

static void test_selection_equals_full_sort(void **state)
{
    enum { BIG = 20000 };
    static float lg[BIG];
    static double probs[BIG];
    static uint32_t ids[BIG];
    const uint32_t ks[] = {0, 1, 2, 7, 50, 255, 256, 257, 3000, BIG - 1, BIG};
    const float ps[] = {1.0f, 0.999f, 0.9f, 0.5f, 0.05f};
    const float ts[] = {0.3f, 1.0f, 2.5f, 20.0f};
    epd_sample_scratch_t *big = NULL;
    epd_rng_t rng;
    uint32_t checks = 0;

    (void)state;
    assert_int_equal(epd_sample_scratch_create(BIG, &big), EPD_OK);
    epd_rng_seed(&rng, 7);
    for (int shape = 0; shape < 3; shape++) {
        for (uint32_t i = 0; i < BIG; i++) {
            double u = epd_rng_uniform(&rng);
            /* peaked, flat, and coarse (many exact ties) */
            lg[i] = shape == 0   ? (float)(u * u * u * 30.0)
                    : shape == 1 ? (float)(u * 0.01)
                                 : (float)floor(u * 8.0);
        }
        for (size_t a = 0; a < sizeof(ks) / sizeof(ks[0]); a++) {
            for (size_t b = 0; b < sizeof(ps) / sizeof(ps[0]); b++) {
                for (size_t c = 0; c < sizeof(ts) / sizeof(ts[0]); c++) {
                    epd_sample_params_t sp = {
                        .temperature = ts[c], .top_k = ks[a], .top_p = ps[b], .seed = a * 31 + b};
                    int32_t tok = -1;

                    for (uint64_t step = 0; step < 2; step++) {
                        assert_int_equal(epd_sample_token(&sp, big, lg, BIG, step, &tok), EPD_OK);
                        assert_int_equal(tok, ref_sample(&sp, lg, BIG, step, probs, ids));
                        checks++;
                    }
                }
            }
        }
    }
    assert_int_equal(checks, 3 * 11 * 5 * 4 * 2);
    epd_sample_scratch_destroy(big);
}

static void test_logprobs_match_reference(void **state)
{
    float lg[V];
    epd_sample_logprob_t lp;

    (void)state;
    memcpy(lg, logits, sizeof(lg));
    lg[3] = lg[11]; /* a tie with the best */
    lg[5] = lg[7];
    for (uint32_t k = 0; k <= V && k <= EPD_SAMPLE_MAX_LOGPROBS; k++) {
        double mx = lg[0], sum = 0.0, lse;
        float prev = INFINITY;
        int32_t prev_id = -1;

        for (int i = 1; i < V; i++) {
            mx = lg[i] > mx ? lg[i] : mx;
        }
        for (int i = 0; i < V; i++) {
            sum += exp((double)lg[i] - mx);
        }
        lse = mx + log(sum);
        assert_int_equal(epd_sample_logprobs(lg, V, 6, k, &lp), EPD_OK);
        assert_true(lp.logprob == (double)lg[6] - lse);
        assert_int_equal(lp.n_top, k);
        for (uint32_t j = 0; j < k; j++) {
            int32_t best = -1;

            for (int i = 0; i < V; i++) {
                int after = lg[i] < prev || (lg[i] == prev && i > prev_id);

                if (after && (best < 0 || lg[i] > lg[best])) {
                    best = i;
                }
            }
            assert_int_equal(lp.top_ids[j], best);
            assert_true(lp.top_logprobs[j] == (double)lg[best] - lse);
            prev = lg[best];
            prev_id = best;
        }
    }
    assert_int_equal(epd_sample_logprobs(lg, V, V, 1, &lp), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_sample_logprobs(lg, V, 0, EPD_SAMPLE_MAX_LOGPROBS + 1, &lp),
                     EPD_ERR_INVALID_PARAM);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_top_k_one_and_tiny_top_p_are_greedy),
        cmocka_unit_test(test_top_k_limits_the_candidates),
        cmocka_unit_test(test_distribution_matches_softmax),
        cmocka_unit_test(test_reproducible),
        cmocka_unit_test(test_refuses_bad_input),
        cmocka_unit_test(test_adjust_matches_reference),
        cmocka_unit_test(test_logprobs_match_reference),
        cmocka_unit_test(test_selection_equals_full_sort),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
