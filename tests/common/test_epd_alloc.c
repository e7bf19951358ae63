/* Unit tests of common/epd_alloc.c: counters, fault injection, overflow,
 * the fill of fresh memory, prefaulting a region. */
#include "epd_test.h"

#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "epd_alloc.h"

static void test_counts_live_bytes(void **state)
{
    epd_alloc_stats_t before;
    epd_alloc_stats_t during;
    epd_alloc_stats_t after;
    char *a;
    char *b;

    (void)state;
    epd_alloc_stats(&before);
    a = epd_malloc(100);
    b = epd_calloc(10, 30);
    assert_non_null(a);
    assert_non_null(b);
    for (int i = 0; i < 300; i++) {
        assert_int_equal(b[i], 0);
    }
    epd_alloc_stats(&during);
    assert_int_equal(during.live_bytes - before.live_bytes, 400);
    assert_int_equal(during.live_blocks - before.live_blocks, 2);
    a = epd_realloc(a, 1000);
    assert_non_null(a);
    epd_alloc_stats(&during);
    assert_int_equal(during.live_bytes - before.live_bytes, 1300);
    epd_free(a);
    epd_free(b);
    epd_free(NULL);
    epd_alloc_stats(&after);
    assert_int_equal(after.live_bytes, before.live_bytes);
    assert_int_equal(after.live_blocks, before.live_blocks);
}

static void test_fail_after(void **state)
{
    void *p[3];

    (void)state;
    epd_alloc_fail_after(2);
    p[0] = epd_malloc(8);
    p[1] = epd_strdup("x");
    p[2] = epd_calloc(1, 8);
    assert_non_null(p[0]);
    assert_non_null(p[1]);
    assert_null(p[2]);
    assert_null(epd_malloc(1));
    epd_alloc_fail_after(-1);
    p[2] = epd_malloc(8);
    assert_non_null(p[2]);
    for (int i = 0; i < 3; i++) {
        epd_free(p[i]);
    }
}

static void test_realloc_failure_keeps_block(void **state)
{
    char *p = epd_strdup("keep me");
    char *q;

    (void)state;
    assert_non_null(p);
    epd_alloc_fail_after(0);
    q = epd_realloc(p, 4096);
    epd_alloc_fail_after(-1);
    assert_null(q);
    assert_string_equal(p, "keep me");
    epd_free(p);
}

static void test_overflow_refused(void **state)
{
    epd_alloc_stats_t before;
    epd_alloc_stats_t after;

    (void)state;
    epd_alloc_stats(&before);
    assert_null(epd_calloc(SIZE_MAX / 2, 4));
    assert_null(epd_malloc(SIZE_MAX - 4));
    epd_alloc_stats(&after);
    assert_int_equal(after.failed - before.failed, 2);
}

static void test_fill_with(void **state)
{
    unsigned char *p;
    unsigned char *q;

    (void)state;
    epd_alloc_fill_with(0xa5);
    p = epd_malloc(100);
    assert_non_null(p);
    for (int i = 0; i < 100; i++) {
        assert_int_equal(p[i], 0xa5);
    }
    memset(p, 1, 100);
    /* what realloc adds is filled, what the block held is kept */
    epd_alloc_fill_with(0x3c);
    p = epd_realloc(p, 300);
    assert_non_null(p);
    for (int i = 0; i < 300; i++) {
        assert_int_equal(p[i], i < 100 ? 1 : 0x3c);
    }
    /* calloc still zeroes */
    q = epd_calloc(10, 10);
    assert_non_null(q);
    for (int i = 0; i < 100; i++) {
        assert_int_equal(q[i], 0);
    }
    epd_free(q);
    epd_free(p);
    epd_alloc_fill_with(-1);
}

static void test_strndup(void **state)
{
    char *s = epd_strndup("abcdef", 3);

    (void)state;
    assert_string_equal(s, "abc");
    epd_free(s);
    s = epd_strndup("ab", 10);
    assert_string_equal(s, "ab");
    epd_free(s);
}

/* Pages of [base, base + n pages) the kernel holds (mincore). */
static size_t resident_pages(unsigned char *base, size_t n, size_t page)
{
    unsigned char vec[64];
    size_t count = 0;

    assert_true(n <= sizeof(vec));
    assert_int_equal(mincore(base, n * page, vec), 0);
    for (size_t i = 0; i < n; i++) {
        count += vec[i] & 1;
    }
    return count;
}

/* epd_mem_prefault commits every page a range touches, the partial pages
 * at both ends included, and changes no byte: private and shared memory
 * (a KV pool is either: calloc'd, or a transport's shared segment). */
static void test_prefault(void **state)
{
    const int flags[] = {MAP_PRIVATE | MAP_ANONYMOUS, MAP_SHARED | MAP_ANONYMOUS};
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t n = 64;

    (void)state;
    epd_mem_prefault(NULL, 4096); /* no-ops */
    for (size_t f = 0; f < sizeof(flags) / sizeof(flags[0]); f++) {
        unsigned char *base = mmap(NULL, n * page, PROT_READ | PROT_WRITE, flags[f], -1, 0);

        assert_true(base != MAP_FAILED);
        base[3 * page + 7] = 0xA5;
        base[40 * page] = 0x5A;
        epd_mem_prefault(base + 10, 0);
        assert_int_equal(resident_pages(base, n, page), 2);
        /* from inside page 0 to inside page 63 */
        epd_mem_prefault(base + 100, n * page - 200);
        assert_int_equal(resident_pages(base, n, page), n);
        for (size_t i = 0; i < n * page; i++) {
            unsigned char want = i == 3 * page + 7 ? 0xA5 : i == 40 * page ? 0x5A : 0;

            if (base[i] != want) {
                fail_msg("byte %zu is %u after the prefault, was %u", i, base[i], want);
            }
        }
        assert_int_equal(munmap(base, n * page), 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_live_bytes),
        cmocka_unit_test(test_fail_after),
        cmocka_unit_test(test_realloc_failure_keeps_block),
        cmocka_unit_test(test_overflow_refused),
        cmocka_unit_test(test_strndup),
        cmocka_unit_test(test_fill_with),
        cmocka_unit_test(test_prefault),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
