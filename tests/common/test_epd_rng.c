/* Unit tests of common/epd_rng.c: reproducible, seed-sensitive, sane ranges. */
#include "epd_test.h"

#include <math.h>

#include "epd_rng.h"

static void test_reproducible(void **state)
{
    epd_rng_t a;
    epd_rng_t b;
    epd_rng_t c;
    int differ = 0;

    (void)state;
    epd_rng_seed(&a, 1234);
    epd_rng_seed(&b, 1234);
    epd_rng_seed(&c, 1235);
    for (int i = 0; i < 1000; i++) {
        uint64_t x = epd_rng_next(&a);

        assert_int_equal(x, epd_rng_next(&b));
        differ += x != epd_rng_next(&c);
    }
    assert_true(differ > 990);
}

static void test_uniform_and_normal_moments(void **state)
{
    epd_rng_t rng;
    double sum = 0;
    double sum2 = 0;
    double nsum = 0;
    double nsum2 = 0;
    const int n = 200000;

    (void)state;
    epd_rng_seed(&rng, 42);
    for (int i = 0; i < n; i++) {
        double u = epd_rng_uniform(&rng);
        double z = epd_rng_normal(&rng);

        assert_true(u >= 0.0 && u < 1.0);
        sum += u;
        sum2 += u * u;
        nsum += z;
        nsum2 += z * z;
    }
    assert_true(fabs(sum / n - 0.5) < 0.01);
    assert_true(fabs(sum2 / n - 1.0 / 3.0) < 0.01);
    assert_true(fabs(nsum / n) < 0.02);
    assert_true(fabs(nsum2 / n - 1.0) < 0.02);
}

static void test_fill_and_entropy(void **state)
{
    epd_rng_t a;
    epd_rng_t b;
    unsigned char x[13];
    unsigned char y[13];

    (void)state;
    epd_rng_seed(&a, 5);
    epd_rng_seed(&b, 5);
    epd_rng_fill(&a, x, sizeof(x));
    epd_rng_fill(&b, y, sizeof(y));
    assert_memory_equal(x, y, sizeof(x));
    assert_int_not_equal(epd_rng_entropy(), epd_rng_entropy());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reproducible),
        cmocka_unit_test(test_uniform_and_normal_moments),
        cmocka_unit_test(test_fill_and_entropy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
