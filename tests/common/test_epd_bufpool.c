/* Unit tests of common/epd_bufpool.c: the pooled tier recycles (no
 * allocation once warm) and stops at its count, the large tier is sized to
 * each request and bounded in bytes, headers come back zeroed and the data
 * sits right after them. */
#include "epd_test.h"

#include <string.h>

#include "epd_alloc.h"
#include "epd_bufpool.h"

typedef struct {
    void *link;
    size_t len;
    unsigned char data[];
} hdr_t;

static uint64_t allocs(void)
{
    epd_alloc_stats_t s;

    epd_alloc_stats(&s);
    return s.total_allocs;
}

static void test_small_tier_recycles_and_is_bounded(void **state)
{
    epd_bufpool_t p;
    hdr_t *b[3];
    uint64_t n0;

    (void)state;
    epd_bufpool_init(&p, offsetof(hdr_t, data), 64, 3, 1000);
    for (int i = 0; i < 3; i++) {
        b[i] = epd_bufpool_get(&p, i == 0 ? 0 : 64);
        assert_non_null(b[i]);
        assert_ptr_equal(epd_bufpool_data(&p, b[i]), b[i]->data);
        memset(b[i], 0xab, sizeof(hdr_t) + 64); /* header and every data byte are ours */
    }
    assert_null(epd_bufpool_get(&p, 10)); /* the count bound */
    assert_int_equal(p.n_small, 3);
    for (int i = 0; i < 3; i++) {
        epd_bufpool_put(&p, b[i]);
    }
    n0 = allocs();
    for (int i = 0; i < 3; i++) {
        b[i] = epd_bufpool_get(&p, 32);
        assert_non_null(b[i]);
        assert_null(b[i]->link); /* zeroed header */
        assert_int_equal(b[i]->len, 0);
    }
    assert_int_equal(allocs(), n0); /* warm: nothing allocated */
    for (int i = 0; i < 3; i++) {
        epd_bufpool_put(&p, b[i]);
    }
    epd_bufpool_put(&p, NULL);
    epd_bufpool_cleanup(&p);
    assert_int_equal(p.n_small, 0);
}

static void test_large_tier_is_sized_and_bounded(void **state)
{
    epd_bufpool_t p;
    hdr_t *a, *b, *c;

    (void)state;
    epd_bufpool_init(&p, offsetof(hdr_t, data), 64, 2, 1000);
    a = epd_bufpool_get(&p, 600);
    assert_non_null(a);
    memset(a->data, 1, 600);
    assert_int_equal(p.large_bytes, 600);
    assert_null(epd_bufpool_get(&p, 401)); /* 600 + 401 > 1000 */
    b = epd_bufpool_get(&p, 400);
    assert_non_null(b);
    memset(b->data, 2, 400);
    assert_int_equal(p.large_bytes, 1000);
    c = epd_bufpool_get(&p, 8); /* the small tier is independent */
    assert_non_null(c);
    epd_bufpool_put(&p, a);
    assert_int_equal(p.large_bytes, 400);
    a = epd_bufpool_get(&p, 500);
    assert_non_null(a);
    epd_bufpool_put(&p, a);
    epd_bufpool_put(&p, b);
    epd_bufpool_put(&p, c);
    assert_int_equal(p.large_bytes, 0);
    assert_int_equal(p.n_small, 1); /* large buffers never enter the pool */
    epd_bufpool_cleanup(&p);
}

static void test_allocation_failure_changes_nothing(void **state)
{
    epd_bufpool_t p;

    (void)state;
    epd_bufpool_init(&p, sizeof(hdr_t), 64, 4, 1000);
    epd_alloc_fail_after(0);
    assert_null(epd_bufpool_get(&p, 10));
    assert_null(epd_bufpool_get(&p, 100));
    epd_alloc_fail_after(-1);
    assert_int_equal(p.n_small, 0);
    assert_int_equal(p.large_bytes, 0);
    epd_bufpool_cleanup(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_tier_recycles_and_is_bounded),
        cmocka_unit_test(test_large_tier_is_sized_and_bounded),
        cmocka_unit_test(test_allocation_failure_changes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
