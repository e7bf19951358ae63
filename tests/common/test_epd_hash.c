/* Unit tests of common/epd_hash.c: streaming equals one-shot, seeds and
 * single-bit changes change the hash. */
#include "epd_test.h"

#include <string.h>

#include "epd_alloc.h"
#include "epd_hash.h"
#include "epd_rng.h"

static void test_streaming_equals_oneshot(void **state)
{
    unsigned char buf[10000];
    epd_rng_t rng;
    epd_hash_state_t *h;
    uint64_t whole;

    (void)state;
    epd_rng_seed(&rng, 7);
    epd_rng_fill(&rng, buf, sizeof(buf));
    whole = epd_hash64(buf, sizeof(buf), 99);
    assert_int_equal(epd_hash_state_create(99, &h), EPD_OK);
    epd_hash_state_update(h, buf, 1);
    epd_hash_state_update(h, buf + 1, 4095);
    epd_hash_state_update(h, buf + 4096, sizeof(buf) - 4096);
    assert_int_equal(epd_hash_state_digest(h), whole);
    epd_hash_state_reset(h, 99);
    epd_hash_state_update(h, buf, sizeof(buf));
    assert_int_equal(epd_hash_state_digest(h), whole);
    epd_hash_state_destroy(h);
    epd_hash_state_destroy(NULL);
}

static void test_sensitivity(void **state)
{
    unsigned char buf[4096];
    uint64_t base;

    (void)state;
    memset(buf, 0xab, sizeof(buf));
    base = epd_hash64(buf, sizeof(buf), 0);
    assert_int_not_equal(base, epd_hash64(buf, sizeof(buf), 1));
    assert_int_not_equal(base, epd_hash64(buf, sizeof(buf) - 1, 0));
    for (size_t bit = 0; bit < sizeof(buf) * 8; bit += 97) {
        buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        assert_int_not_equal(base, epd_hash64(buf, sizeof(buf), 0));
        buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
    }
    assert_int_equal(base, epd_hash64(buf, sizeof(buf), 0));
}

static void test_create_fails_cleanly(void **state)
{
    epd_hash_state_t *h = NULL;

    (void)state;
    epd_alloc_fail_after(0);
    assert_int_equal(epd_hash_state_create(1, &h), EPD_ERR_NO_MEMORY);
    epd_alloc_fail_after(-1);
    assert_null(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_streaming_equals_oneshot),
        cmocka_unit_test(test_sensitivity),
        cmocka_unit_test(test_create_fails_cleanly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
