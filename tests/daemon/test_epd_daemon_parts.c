/*
 * Unit tests of the daemon runtime's parts that need no transport:
 *   epd_tomb     ring of ended ids: kinds, EPD_TOMB_ALL, expiry, clear, wrap;
 *   epd_stash    early messages: bound, duplicates, take by (id, sub), any,
 *                expiry order;
 *   epd_reqtab   table by (id, sub), the walk, dirty and blocked lists;
 *   epd_handoff  a real compute thread: priority between queues, events in
 *                posting order, backlog, destroy with jobs still queued;
 *                a nice value added to that thread alone.
 */
#include "epd_test.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <uv.h>

#include "epd_alloc.h"
#include "epd_handoff.h"
#include "epd_msg.h"
#include "epd_reqtab.h"
#include "epd_stash.h"
#include "epd_time.h"
#include "epd_tomb.h"

/* ------------------------------------------------------------------ tombs */

static void test_tombs(void **state)
{
    epd_tombs_t *t;

    (void)state;
    assert_int_equal(epd_tombs_create(0, 1, &t), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_tombs_create(4, 60 * EPD_NSEC_PER_SEC, &t), EPD_OK);
    assert_int_equal(epd_tombs_find(t, 1, 0), 0);
    epd_tombs_add(t, 1, 0, 5);
    assert_int_equal(epd_tombs_find(t, 1, 0), 5);
    assert_int_equal(epd_tombs_find(t, 1, 1), 0); /* another sub */
    assert_int_equal(epd_tombs_find(t, 2, 0), 0);
    /* a tombstone for every sub of an id, newer: it wins */
    epd_tombs_add(t, 1, EPD_TOMB_ALL, 7);
    assert_int_equal(epd_tombs_find(t, 1, 0), 7);
    assert_int_equal(epd_tombs_find(t, 1, 3), 7);
    /* clear forgets (1, 0) only, not the id-wide one */
    epd_tombs_clear(t, 1, 0);
    assert_int_equal(epd_tombs_find(t, 1, 0), 7);
    /* the ring wraps: the oldest goes first */
    epd_tombs_add(t, 10, 0, 1);
    epd_tombs_add(t, 11, 0, 1);
    epd_tombs_add(t, 12, 0, 1);
    epd_tombs_add(t, 13, 0, 1);
    assert_int_equal(epd_tombs_find(t, 1, 3), 0);
    assert_int_equal(epd_tombs_find(t, 10, 0), 1);
    epd_tombs_add(t, 14, 0, 1);
    assert_int_equal(epd_tombs_find(t, 10, 0), 0);
    assert_int_equal(epd_tombs_find(t, 14, 0), 1);
    epd_tombs_destroy(t);
    /* expiry */
    assert_int_equal(epd_tombs_create(8, 20 * EPD_NSEC_PER_MSEC, &t), EPD_OK);
    epd_tombs_add(t, 99, 0, 3);
    assert_int_equal(epd_tombs_find(t, 99, 0), 3);
    epd_time_sleep_ns(40 * EPD_NSEC_PER_MSEC);
    assert_int_equal(epd_tombs_find(t, 99, 0), 0);
    epd_tombs_destroy(t);
    epd_tombs_destroy(NULL);
}

/* ------------------------------------------------------------------ stash */

static Epd__Envelope *mk_env(uint64_t id)
{
    Epd__Envelope *env = epd_calloc(1, sizeof(*env));
    Epd__Abort *a = epd_calloc(1, sizeof(*a));

    epd__envelope__init(env);
    epd__abort__init(a);
    a->request_id = id;
    env->body_case = EPD__ENVELOPE__BODY_ABORT;
    env->abort = a;
    return env;
}

static void test_stash(void **state)
{
    epd_stash_t *s;
    Epd__Envelope *e1 = mk_env(1), *e2 = mk_env(2), *e3 = mk_env(3), *got;
    epd_link_t *from = (epd_link_t *)1;
    uint64_t now = epd_time_now_ns();

    (void)state;
    assert_int_equal(epd_stash_create(2, &s), EPD_OK);
    assert_int_equal(epd_stash_put(s, e1, NULL, 1, 0, now + 1000), EPD_OK);
    /* the same (id, sub) twice: refused, nothing taken */
    assert_int_equal(epd_stash_put(s, e3, NULL, 1, 0, now), EPD_ERR_NO_RESOURCE);
    assert_int_equal(epd_stash_put(s, e2, NULL, 2, 5, now + 10), EPD_OK);
    /* full */
    assert_int_equal(epd_stash_put(s, e3, NULL, 3, 0, now), EPD_ERR_NO_RESOURCE);
    assert_int_equal(epd_stash_count(s), 2);
    assert_true(epd_stash_has(s, 2, 5));
    assert_false(epd_stash_has(s, 2, 4));
    assert_null(epd_stash_take(s, 2, 4, &from));
    /* expiry hands back only what is due */
    assert_null(epd_stash_take_expired(s, now + 9, &from));
    got = epd_stash_take_expired(s, now + 10, &from);
    assert_ptr_equal(got, e2);
    assert_null(from);
    epd_msg_free(got);
    /* any sub of an id */
    got = epd_stash_take_any(s, 1, &from);
    assert_ptr_equal(got, e1);
    epd_msg_free(got);
    assert_int_equal(epd_stash_count(s), 0);
    /* what is left at destroy is freed (ASan checks) */
    assert_int_equal(epd_stash_put(s, e3, NULL, 3, 0, now), EPD_OK);
    epd_stash_destroy(s);
    epd_stash_destroy(NULL);
}

/* ----------------------------------------------------------------- reqtab */

typedef struct {
    int tag;
    epd_reqent_t ent;
} rq_t;

static void test_reqtab(void **state)
{
    epd_reqtab_t t;
    rq_t r[40];
    epd_reqent_t *e;
    int seen[40] = {0};
    int n = 0;

    (void)state;
    assert_int_equal(epd_reqtab_init(&t, 4, offsetof(rq_t, ent)), EPD_OK);
    for (int i = 0; i < 40; i++) {
        memset(&r[i], 0, sizeof(r[i]));
        r[i].tag = i;
        r[i].ent.id = 1000 + (uint64_t)(i / 2);
        r[i].ent.sub = (uint32_t)(i % 2);
        epd_reqtab_insert(&t, &r[i].ent);
    }
    assert_int_equal(epd_reqtab_count(&t), 40);
    for (int i = 0; i < 40; i++) {
        e = epd_reqtab_find(&t, 1000 + (uint64_t)(i / 2), (uint32_t)(i % 2));
        assert_non_null(e);
        assert_int_equal(EPD_REQ_OF(e, rq_t, ent)->tag, i);
    }
    assert_null(epd_reqtab_find(&t, 1000, 2));
    /* the same, as requests */
    assert_ptr_equal(epd_reqtab_find_req(&t, 1001, 1), &r[3]);
    assert_null(epd_reqtab_find_req(&t, 1000, 2));
    assert_ptr_equal(epd_reqtab_first_req(&t), &r[39]);
    assert_ptr_equal(epd_reqtab_next_req(&t, &r[39]), &r[38]);
    assert_null(epd_reqtab_next_req(&t, &r[0]));
    /* the walk: every entry once, newest first */
    for (e = epd_reqtab_first(&t); e != NULL; e = epd_reqtab_next(e)) {
        int tag = EPD_REQ_OF(e, rq_t, ent)->tag;

        if (n == 0) {
            assert_int_equal(tag, 39);
        }
        seen[tag]++;
        n++;
    }
    assert_int_equal(n, 40);
    for (int i = 0; i < 40; i++) {
        assert_int_equal(seen[i], 1);
    }
    /* work lists: dirty in order, once; blocked back to dirty in order */
    assert_true(epd_reqtab_dirty(&t, &r[3].ent));
    assert_true(epd_reqtab_dirty(&t, &r[1].ent));
    assert_false(epd_reqtab_dirty(&t, &r[3].ent));
    epd_reqtab_block(&t, &r[7].ent);
    epd_reqtab_block(&t, &r[5].ent);
    assert_true(epd_reqtab_is_blocked(&r[7].ent));
    assert_true(epd_reqtab_has_blocked(&t));
    assert_ptr_equal(epd_reqtab_pop_dirty(&t), &r[3].ent);
    assert_true(epd_reqtab_unblock_all(&t));
    assert_false(epd_reqtab_has_blocked(&t));
    assert_ptr_equal(epd_reqtab_pop_dirty(&t), &r[1].ent);
    assert_ptr_equal(epd_reqtab_pop_dirty_req(&t), &r[7]);
    /* removing an entry takes it off its list too */
    epd_reqtab_remove(&t, &r[5].ent);
    assert_null(epd_reqtab_pop_dirty(&t));
    assert_false(epd_reqtab_has_dirty(&t));
    assert_null(epd_reqtab_find(&t, r[5].ent.id, r[5].ent.sub));
    assert_int_equal(epd_reqtab_count(&t), 39);
    epd_reqtab_remove(&t, &r[5].ent); /* twice: a no-op */
    assert_int_equal(epd_reqtab_count(&t), 39);
    epd_reqtab_cleanup(&t);
}

/* ---------------------------------------------------------------- handoff */

typedef struct {
    int id;
    uint32_t queue;  /* where it was submitted */
    int order;       /* position it ran in (compute thread) */
    atomic_int *gate; /* job 0 spins on it so the others queue up */
} job_t;

typedef struct {
    atomic_int ran;
    atomic_int wrong_queue; /* the compute thread saw a job come from the wrong queue */
    int events[64];
    int n_events;
    epd_handoff_t *h;
} hctx_t;

static void h_run(void *arg, void *job, uint32_t queue)
{
    hctx_t *c = arg;
    job_t *j = job;

    if (j->gate != NULL) {
        while (atomic_load(j->gate) == 0) {
            epd_time_sleep_ns(EPD_NSEC_PER_MSEC);
        }
    }
    if (queue != j->queue) {
        atomic_store(&c->wrong_queue, 1); /* asserted on the test's thread */
    }
    j->order = atomic_fetch_add(&c->ran, 1);
    epd_handoff_post(c->h, job);
}

static void h_event(void *arg, void *ev)
{
    hctx_t *c = arg;
    job_t *j = ev;

    c->events[c->n_events++] = j->id;
}

static void test_handoff(void **state)
{
    epd_handoff_config_t hc;
    hctx_t c;
    job_t jobs[7];
    atomic_int gate;
    uv_loop_t loop;
    uint64_t end;

    (void)state;
    memset(&c, 0, sizeof(c));
    memset(&hc, 0, sizeof(hc));
    atomic_init(&gate, 0);
    assert_int_equal(uv_loop_init(&loop), 0);
    hc.n_queues = 0;
    assert_int_equal(epd_handoff_create(&loop, &hc, &c.h), EPD_ERR_INVALID_PARAM);
    hc.name = "test compute";
    hc.n_queues = 2;
    hc.queue_cap[0] = 4;
    hc.queue_cap[1] = 4;
    hc.event_cap = 8;
    hc.run = h_run;
    hc.run_arg = &c;
    hc.on_event = h_event;
    hc.event_arg = &c;
    assert_int_equal(epd_handoff_create(&loop, &hc, &c.h), EPD_OK);
    /* job 0 holds the thread; then three "runs" (queue 1) and two
     * "releases" (queue 0): the releases go first, each queue in order */
    for (int i = 0; i < 7; i++) {
        jobs[i].id = i;
        jobs[i].gate = i == 0 ? &gate : NULL;
        jobs[i].queue = (i == 0 || i == 1 || i == 2 || i == 4) ? 1 : 0;
        jobs[i].order = -1;
    }
    assert_int_equal(epd_handoff_submit(c.h, 1, &jobs[0]), EPD_OK);
    end = epd_time_now_ns() + 5 * EPD_NSEC_PER_SEC;
    while (epd_handoff_backlog(c.h, 1) != 0 && epd_time_now_ns() < end) {
        epd_time_sleep_ns(EPD_NSEC_PER_MSEC); /* job 0 started */
    }
    assert_int_equal(epd_handoff_submit(c.h, 1, &jobs[1]), EPD_OK);
    assert_int_equal(epd_handoff_submit(c.h, 1, &jobs[2]), EPD_OK);
    assert_int_equal(epd_handoff_submit(c.h, 0, &jobs[3]), EPD_OK);
    assert_int_equal(epd_handoff_submit(c.h, 1, &jobs[4]), EPD_OK);
    assert_int_equal(epd_handoff_submit(c.h, 0, &jobs[5]), EPD_OK);
    assert_int_equal(epd_handoff_submit(c.h, 7, &jobs[6]), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_handoff_backlog(c.h, 1), 3);
    assert_int_equal(epd_handoff_backlog(c.h, 0), 2);
    /* a full queue pushes back, nothing queued */
    {
        job_t extra[4];

        for (int i = 0; i < 4; i++) {
            extra[i] = jobs[1];
            extra[i].id = 100 + i;
        }
        assert_int_equal(epd_handoff_submit(c.h, 1, &extra[0]), EPD_OK);
        assert_int_equal(epd_handoff_submit(c.h, 1, &extra[1]), EPD_ERR_NO_RESOURCE);
        atomic_store(&gate, 1);
        end = epd_time_now_ns() + 5 * EPD_NSEC_PER_SEC;
        while (c.n_events < 7 && epd_time_now_ns() < end) {
            uv_run(&loop, UV_RUN_NOWAIT);
            epd_time_sleep_ns(EPD_NSEC_PER_MSEC);
        }
    }
    assert_int_equal(c.n_events, 7);
    /* job 0, then the releases in order, then the runs in order */
    assert_int_equal(c.events[0], 0);
    assert_int_equal(c.events[1], 3);
    assert_int_equal(c.events[2], 5);
    assert_int_equal(c.events[3], 1);
    assert_int_equal(c.events[4], 2);
    assert_int_equal(c.events[5], 4);
    assert_int_equal(c.events[6], 100);
    assert_int_equal(atomic_load(&c.wrong_queue), 0);
    assert_int_equal(epd_handoff_backlog(c.h, 0), 0);
    assert_int_equal(epd_handoff_backlog(c.h, 1), 0);
    /* destroy with a job holding the thread and another queued: it joins
     * after the running one and drops the queued one */
    atomic_store(&gate, 0);
    jobs[0].order = -1;
    jobs[1].order = -1;
    assert_int_equal(epd_handoff_submit(c.h, 1, &jobs[0]), EPD_OK);
    assert_int_equal(epd_handoff_submit(c.h, 1, &jobs[1]), EPD_OK);
    end = epd_time_now_ns() + 5 * EPD_NSEC_PER_SEC;
    while (epd_handoff_backlog(c.h, 1) != 1 && epd_time_now_ns() < end) {
        epd_time_sleep_ns(EPD_NSEC_PER_MSEC);
    }
    atomic_store(&gate, 1);
    epd_handoff_destroy(c.h);
    assert_true(jobs[0].order >= 0);
    assert_int_equal(jobs[1].order, -1);
    uv_run(&loop, UV_RUN_DEFAULT); /* the async's close frees the hand-off */
    assert_int_equal(uv_loop_close(&loop), 0);
}

/* The calling thread's nice value (Linux: per thread). */
static int thread_nice(void)
{
    errno = 0;
    return getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
}

typedef struct {
    epd_handoff_t *h; /* set before the first submit */
    atomic_int seen;
} nctx_t;

static void n_run(void *arg, void *job, uint32_t queue)
{
    nctx_t *c = arg;

    (void)queue;
    *(int *)job = thread_nice();
    epd_handoff_post(c->h, job);
}

static void n_event(void *arg, void *ev)
{
    (void)ev;
    atomic_store(&((nctx_t *)arg)->seen, 1);
}

static void test_handoff_nice(void **state)
{
    epd_handoff_config_t hc;
    nctx_t c;
    uv_loop_t loop;
    int before = thread_nice();
    int got = -100;
    uint64_t end;

    (void)state;
    memset(&c, 0, sizeof(c));
    atomic_init(&c.seen, 0);
    assert_int_equal(uv_loop_init(&loop), 0);
    memset(&hc, 0, sizeof(hc));
    hc.name = "test nice";
    hc.n_queues = 1;
    hc.queue_cap[0] = 1;
    hc.event_cap = 1;
    hc.run = n_run;
    hc.run_arg = &c;
    hc.on_event = n_event;
    hc.event_arg = &c;
    hc.nice = 3;
    assert_int_equal(epd_handoff_create(&loop, &hc, &c.h), EPD_OK);
    assert_int_equal(epd_handoff_submit(c.h, 0, &got), EPD_OK);
    end = epd_time_now_ns() + 5 * EPD_NSEC_PER_SEC;
    while (!atomic_load(&c.seen) && epd_time_now_ns() < end) {
        uv_run(&loop, UV_RUN_NOWAIT);
        epd_time_sleep_ns(EPD_NSEC_PER_MSEC);
    }
    assert_true(atomic_load(&c.seen));
    /* the thread's value moved by 3 (capped at 19), this thread's did not */
    assert_int_equal(got, before + 3 > 19 ? 19 : before + 3);
    assert_int_equal(thread_nice(), before);
    epd_handoff_destroy(c.h);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tombs),
        cmocka_unit_test(test_stash),
        cmocka_unit_test(test_reqtab),
        cmocka_unit_test(test_handoff),
        cmocka_unit_test(test_handoff_nice),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
