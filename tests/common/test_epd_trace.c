/* Unit tests of common/epd_trace.c: the JSON is valid Chrome trace format
 * (parsed back with jansson), holds exactly the recorded spans with their
 * request and layer, filters by request, and a full buffer drops (counted)
 * instead of blocking, and epd_trace_read resumes from its cursor. */
#include "epd_test.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "epd_time.h"
#include "epd_trace.h"

static void *trace_thread(void *arg)
{
    epd_trace_t *t = arg;

    epd_trace_thread_name(t, "compute");
    for (int layer = 0; layer < 8; layer++) {
        uint64_t t0 = epd_time_now_ns();

        epd_trace_span(t, "layer", "compute", 7, layer, t0, t0 + 1000 + (uint64_t)layer);
    }
    return NULL;
}

static json_t *trace_load(const char *path)
{
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);

    if (root == NULL) {
        fail_msg("invalid JSON at line %d: %s", err.line, err.text);
    }
    return root;
}

static void test_json_holds_the_spans(void **state)
{
    char path[] = "/tmp/epd-trace-XXXXXX";
    int fd = mkstemp(path);
    epd_trace_t *t = NULL;
    pthread_t th;
    json_t *root;
    json_t *events;
    size_t i;
    int spans = 0;
    int instants = 0;
    int named = 0;
    uint64_t rec;
    uint64_t drop;

    (void)state;
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(epd_trace_create(1000, "prefill \"0\"", &t), EPD_OK);
    epd_trace_thread_name(t, "loop");
    pthread_create(&th, NULL, trace_thread, t);
    pthread_join(th, NULL);
    epd_trace_instant(t, "reservation", "msg", 7, -1, epd_time_now_ns());
    epd_trace_span(t, "write", "xfer", 8, 3, 5000, 9000);
    epd_trace_counts(t, &rec, &drop);
    assert_int_equal(rec, 10);
    assert_int_equal(drop, 0);

    assert_int_equal(epd_trace_write_json(t, path, 0), EPD_OK);
    root = trace_load(path);
    events = json_object_get(root, "traceEvents");
    assert_true(json_is_array(events));
    json_t *ev;

    json_array_foreach(events, i, ev) {
        const char *ph = json_string_value(json_object_get(ev, "ph"));
        const char *name = json_string_value(json_object_get(ev, "name"));
        json_t *args = json_object_get(ev, "args");

        assert_non_null(ph);
        assert_non_null(name);
        if (strcmp(ph, "M") == 0) {
            const char *what = json_string_value(json_object_get(args, "name"));

            named += strcmp(what, "compute") == 0 || strcmp(what, "loop") == 0 ||
                     strcmp(what, "prefill \"0\"") == 0;
        } else if (strcmp(ph, "X") == 0) {
            assert_true(json_is_number(json_object_get(ev, "ts")));
            assert_true(json_is_number(json_object_get(ev, "dur")));
            if (strcmp(name, "layer") == 0) {
                json_int_t layer = json_integer_value(json_object_get(args, "layer"));

                assert_int_equal(json_integer_value(json_object_get(args, "req")), 7);
                /* durations are 1000+layer ns = (1 + layer/1000) us */
                assert_true(json_number_value(json_object_get(ev, "dur")) ==
                            1.0 + (double)layer / 1000.0);
            }
            spans++;
        } else if (strcmp(ph, "i") == 0) {
            assert_null(json_object_get(args, "layer"));
            instants++;
        }
    }
    assert_int_equal(spans, 9);
    assert_int_equal(instants, 1);
    assert_int_equal(named, 3);
    json_decref(root);

    /* filtered by request 8: only the write span (plus metadata) */
    assert_int_equal(epd_trace_write_json(t, path, 8), EPD_OK);
    root = trace_load(path);
    spans = 0;
    json_array_foreach(json_object_get(root, "traceEvents"), i, ev) {
        if (strcmp(json_string_value(json_object_get(ev, "ph")), "M") != 0) {
            assert_string_equal(json_string_value(json_object_get(ev, "name")), "write");
            assert_true(json_number_value(json_object_get(ev, "ts")) == 5.0);
            assert_true(json_number_value(json_object_get(ev, "dur")) == 4.0);
            spans++;
        }
    }
    assert_int_equal(spans, 1);
    json_decref(root);
    unlink(path);
    epd_trace_destroy(t);
}

static void test_full_buffer_drops(void **state)
{
    epd_trace_t *t = NULL;
    uint64_t rec;
    uint64_t drop;

    (void)state;
    assert_int_equal(epd_trace_create(4, "decode", &t), EPD_OK);
    for (int i = 0; i < 10; i++) {
        epd_trace_span(t, "step", "compute", 1, -1, 0, 1);
    }
    epd_trace_counts(t, &rec, &drop);
    assert_int_equal(rec, 4);
    assert_int_equal(drop, 6);
    epd_trace_destroy(t);
    /* tracing off: a NULL recorder is accepted everywhere it is hot */
    epd_trace_span(NULL, "step", "compute", 1, -1, 0, 1);
    epd_trace_instant(NULL, "x", "y", 0, -1, 0);
    assert_int_equal(epd_trace_create(0, "x", &t), EPD_ERR_INVALID_PARAM);
}

/* epd_trace_read: the events of a request range, in slot order, bounded by
 * `scan` and `cap`, resumable from the cursor until it reaches `recorded`. */
static void test_read_by_cursor(void **state)
{
    epd_trace_t *t = NULL;
    epd_trace_rec_t out[4];
    uint64_t cursor = 0, rec = 0;
    size_t n, total = 0;
    int calls = 0;

    (void)state;
    assert_int_equal(epd_trace_create(64, "prefill", &t), EPD_OK);
    for (int i = 0; i < 10; i++) {
        /* requests 100 (even i) and 200 (odd i) interleaved */
        epd_trace_span(t, "compute", "compute", i % 2 ? 200 : 100, i, (uint64_t)i * 10,
                       (uint64_t)i * 10 + 5);
    }
    epd_trace_instant(t, "KV held", "msg", 100, -1, 1000);
    /* scan 3 slots at a time, room for 4: request 100 only */
    while (cursor < 11 || calls == 0) {
        n = epd_trace_read(t, &cursor, 100, 150, 3, out, 4, &rec);
        assert_int_equal(rec, 11);
        for (size_t k = 0; k < n; k++) {
            assert_int_equal(out[k].req_id, 100);
            if (out[k].instant) {
                assert_string_equal(out[k].name, "KV held");
                assert_int_equal(out[k].ts_ns, 1000);
                assert_int_equal(out[k].layer, -1);
            } else {
                assert_int_equal(out[k].layer % 2, 0);
                assert_int_equal(out[k].ts_ns, (uint64_t)out[k].layer * 10);
                assert_int_equal(out[k].dur_ns, 5);
            }
        }
        total += n;
        assert_true(++calls < 20);
    }
    assert_int_equal(total, 6);
    assert_int_equal(cursor, 11);
    /* a full `out` stops the cursor at the first event not copied */
    cursor = 0;
    n = epd_trace_read(t, &cursor, 0, UINT64_MAX, 100, out, 2, NULL);
    assert_int_equal(n, 2);
    assert_int_equal(cursor, 2);
    n = epd_trace_read(t, &cursor, 0, UINT64_MAX, 100, out, 1, NULL);
    assert_int_equal(out[0].layer, 2);
    epd_trace_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_holds_the_spans),
        cmocka_unit_test(test_full_buffer_drops),
        cmocka_unit_test(test_read_by_cursor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
