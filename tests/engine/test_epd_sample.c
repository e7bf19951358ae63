/* test_epd_sample.c — greedy, temperature, top-k, top-p; reproducible from
 * (seed, step); the empirical distribution matches the softmax. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_top_k_one_and_tiny_top_p_are_greedy),
        cmocka_unit_test(test_top_k_limits_the_candidates),
        cmocka_unit_test(test_distribution_matches_softmax),
        cmocka_unit_test(test_reproducible),
        cmocka_unit_test(test_refuses_bad_input),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
