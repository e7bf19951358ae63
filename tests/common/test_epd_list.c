/* Unit tests of common/epd_list.h: every link and both ends after inserts
 * and removals at the head, the middle and the tail, for elements with
 * their own links and through an accessor (links kept in another struct,
 * as UCX keeps its ops' links in be_priv). */
#include "epd_test.h"

#include "epd_list.h"

typedef struct item {
    int v;
    struct item *prev, *next;
} item_t;

/* Checks that the list at head/tail holds exactly want[0..n), linked both
 * ways. */
static void check(item_t *head, item_t *tail, const int *want, int n)
{
    item_t *e, *last = NULL;
    int i = 0;

    EPD_LIST_FOREACH(e, head)
    {
        assert_true(i < n);
        assert_int_equal(e->v, want[i]);
        assert_ptr_equal(e->prev, last);
        last = e;
        i++;
    }
    assert_int_equal(i, n);
    assert_ptr_equal(tail, last);
}

static void test_tlist(void **state)
{
    item_t it[4] = {{.v = 0}, {.v = 1}, {.v = 2}, {.v = 3}};
    item_t *head = NULL, *tail = NULL;

    (void)state;
    for (int i = 0; i < 4; i++) {
        EPD_TLIST_INSERT_TAIL(head, tail, &it[i]);
    }
    check(head, tail, (const int[]){0, 1, 2, 3}, 4);
    EPD_TLIST_REMOVE(head, tail, &it[1]); /* middle */
    check(head, tail, (const int[]){0, 2, 3}, 3);
    EPD_TLIST_REMOVE(head, tail, &it[3]); /* tail */
    check(head, tail, (const int[]){0, 2}, 2);
    EPD_TLIST_REMOVE(head, tail, &it[0]); /* head */
    check(head, tail, (const int[]){2}, 1);
    EPD_TLIST_REMOVE(head, tail, &it[2]); /* the last one */
    assert_null(head);
    assert_null(tail);
}

static void test_list(void **state)
{
    item_t it[3] = {{.v = 0}, {.v = 1}, {.v = 2}};
    item_t *head = NULL, *other = NULL;
    item_t *it1 = &it[1];
    int on_head = 1;

    (void)state;
    for (int i = 0; i < 3; i++) {
        EPD_LIST_INSERT_HEAD(head, &it[i]);
    }
    check(head, &it[0], (const int[]){2, 1, 0}, 3);
    EPD_LIST_REMOVE(head, it1);
    check(head, &it[0], (const int[]){2, 0}, 2);
    /* head chosen by an expression, as the UCX tx copies do */
    EPD_LIST_REMOVE(*(on_head ? &head : &other), &it[2]);
    check(head, &it[0], (const int[]){0}, 1);
    EPD_LIST_REMOVE(head, &it[0]);
    assert_null(head);
    assert_null(other);
}

/* Links in a separate struct, reached through an accessor. */
typedef struct {
    int v;
    _Alignas(16) unsigned char scratch[32]; /* as be_priv */
} outer_t;
typedef struct {
    outer_t *prev, *next;
} links_t;
#define LINKS(o) ((links_t *)(void *)(o)->scratch)

static void test_accessor(void **state)
{
    outer_t o[3] = {{.v = 0}, {.v = 1}, {.v = 2}};
    outer_t *head = NULL, *tail = NULL, *e;
    int n = 0;

    (void)state;
    for (int i = 0; i < 3; i++) {
        EPD_TLIST_INSERT_TAIL_N(LINKS, head, tail, &o[i]);
    }
    EPD_TLIST_REMOVE_N(LINKS, head, tail, &o[1]);
    for (e = head; e != NULL; e = LINKS(e)->next) {
        assert_int_equal(e->v, n == 0 ? 0 : 2);
        n++;
    }
    assert_int_equal(n, 2);
    assert_ptr_equal(LINKS(&o[2])->prev, &o[0]);
    assert_ptr_equal(tail, &o[2]);
    EPD_LIST_INSERT_HEAD_N(LINKS, head, &o[1]);
    assert_ptr_equal(head, &o[1]);
    assert_ptr_equal(LINKS(&o[0])->prev, &o[1]);
    assert_null(LINKS(&o[1])->prev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tlist),
        cmocka_unit_test(test_list),
        cmocka_unit_test(test_accessor),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
