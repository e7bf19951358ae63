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

/* BLAKE2b-256 known answers (RFC 7693's function at a 32-byte digest, as
 * Python's hashlib.blake2b(digest_size=32) gives them). */
static void test_content_hash(void **state)
{
    static const unsigned char abc[32] = {
        0xbd, 0xdd, 0x81, 0x3c, 0x63, 0x42, 0x39, 0x72, 0x31, 0x71, 0xef, 0x3f, 0xee, 0x98, 0x57, 0x9b,
        0x94, 0x96, 0x4e, 0x3b, 0xb1, 0xcb, 0x3e, 0x42, 0x72, 0x62, 0xc8, 0xc0, 0x68, 0xd5, 0x23, 0x19};
    static const unsigned char empty[32] = {
        0x0e, 0x57, 0x51, 0xc0, 0x26, 0xe5, 0x43, 0xb2, 0xe8, 0xab, 0x2e, 0xb0, 0x60, 0x99, 0xda, 0xa1,
        0xd1, 0xe5, 0xdf, 0x47, 0x77, 0x8f, 0x77, 0x87, 0xfa, 0xab, 0x45, 0xcd, 0xf1, 0x2f, 0xe3, 0xa8};
    unsigned char out[EPD_CONTENT_HASH_BYTES], out2[EPD_CONTENT_HASH_BYTES];

    (void)state;
    epd_content_hash("abc", 3, out);
    assert_memory_equal(out, abc, 32);
    epd_content_hash("", 0, out);
    assert_memory_equal(out, empty, 32);
    epd_content_hash("abd", 3, out2);
    assert_memory_not_equal(out2, abc, 32);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_streaming_equals_oneshot),
        cmocka_unit_test(test_sensitivity),
        cmocka_unit_test(test_create_fails_cleanly),
        cmocka_unit_test(test_content_hash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
