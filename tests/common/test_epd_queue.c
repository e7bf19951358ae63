/* Unit tests of common/epd_queue.c: bounds, order, and a two-thread run
 * where every item arrives exactly once and in order. */
#include "epd_test.h"

#include <pthread.h>
#include <sched.h>

#include "epd_queue.h"

static void test_bounded_fifo(void **state)
{
    epd_spsc_queue_t q;
    uintptr_t i;

    (void)state;
    assert_int_equal(epd_spsc_queue_init(&q, 5), EPD_OK); /* rounds up to 8 */
    assert_null(epd_spsc_queue_pop(&q));
    for (i = 1; i <= 8; i++) {
        assert_int_equal(epd_spsc_queue_push(&q, (void *)i), EPD_OK);
    }
    assert_int_equal(epd_spsc_queue_push(&q, (void *)i), EPD_ERR_NO_RESOURCE);
    assert_int_equal(epd_spsc_queue_size(&q), 8);
    for (i = 1; i <= 8; i++) {
        assert_ptr_equal(epd_spsc_queue_pop(&q), (void *)i);
    }
    assert_null(epd_spsc_queue_pop(&q));
    epd_spsc_queue_cleanup(&q);
}

static void test_init_refuses_bad_capacity(void **state)
{
    epd_spsc_queue_t q;

    (void)state;
    assert_int_equal(epd_spsc_queue_init(&q, 0), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_spsc_queue_init(&q, (size_t)1 << 40), EPD_ERR_INVALID_PARAM);
}

#define QUEUE_ITEMS 2000000u

static void *queue_producer(void *arg)
{
    epd_spsc_queue_t *q = arg;

    for (uintptr_t i = 1; i <= QUEUE_ITEMS;) {
        if (epd_spsc_queue_push(q, (void *)i) == EPD_OK) {
            i++;
        } else {
            sched_yield();
        }
    }
    return NULL;
}

static void test_two_threads(void **state)
{
    epd_spsc_queue_t q;
    pthread_t producer;
    uintptr_t expect = 1;

    (void)state;
    assert_int_equal(epd_spsc_queue_init(&q, 64), EPD_OK);
    assert_int_equal(pthread_create(&producer, NULL, queue_producer, &q), 0);
    while (expect <= QUEUE_ITEMS) {
        void *item = epd_spsc_queue_pop(&q);

        if (item == NULL) {
            sched_yield();
            continue;
        }
        assert_int_equal((uintptr_t)item, expect);
        expect++;
    }
    pthread_join(producer, NULL);
    assert_null(epd_spsc_queue_pop(&q));
    epd_spsc_queue_cleanup(&q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bounded_fifo),
        cmocka_unit_test(test_init_refuses_bad_capacity),
        cmocka_unit_test(test_two_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
