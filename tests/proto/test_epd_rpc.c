/*
 * Tests of proto/epd_rpc.c: a real gRPC server on 127.0.0.1 whose handler
 * runs on a libuv loop (this program's main thread), called by client
 * threads: answers and errors arrive intact, deadlines and a dead server
 * fail within bounded time, many concurrent calls all complete, and the
 * server shuts down cleanly with clients still calling.
 */
#include "epd_test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_msg.h"
#include "epd_rpc.h"
#include "epd_time.h"

typedef struct {
    uv_loop_t loop;
    uv_async_t stop;
    epd_rpc_server_t *server;
    char target[64];
    atomic_int handled;
    void (*client)(void *);
    int client_failed;
    atomic_int stop_sent;
} rpc_fixture_t;

/* Asks the loop thread to destroy the server and stop; once only (libuv
 * forbids uv_async_send on a handle being closed). */
static void rpc_request_stop(rpc_fixture_t *f)
{
    if (atomic_exchange(&f->stop_sent, 1) == 0) {
        uv_async_send(&f->stop);
    }
}

static int rpc_handler(void *arg, const char *method, const void *req, size_t req_len,
                       void **resp_p, size_t *resp_len_p, char *err, size_t err_cap)
{
    rpc_fixture_t *f = arg;

    atomic_fetch_add(&f->handled, 1);
    if (strcmp(method, EPD_RPC_HEALTH) == 0) {
        /* echo the request behind a prefix */
        unsigned char *out = epd_malloc(req_len + 3);

        memcpy(out, "ok:", 3);
        if (req_len > 0) {
            memcpy(out + 3, req, req_len);
        }
        *resp_p = out;
        *resp_len_p = req_len + 3;
        return EPD_RPC_OK;
    }
    if (strcmp(method, EPD_RPC_DRAIN) == 0) {
        snprintf(err, err_cap, "no worker named '%.*s'", (int)req_len, (const char *)req);
        return EPD_RPC_NOT_FOUND;
    }
    if (strcmp(method, "/epd.Control/Slow") == 0) {
        epd_time_sleep_ns(1500 * EPD_NSEC_PER_MSEC);
        *resp_p = NULL;
        *resp_len_p = 0;
        return EPD_RPC_OK;
    }
    snprintf(err, err_cap, "unknown method %s", method);
    return EPD_RPC_UNIMPLEMENTED;
}

static void rpc_on_stop(uv_async_t *handle)
{
    rpc_fixture_t *f = handle->data;

    epd_rpc_server_destroy(f->server);
    f->server = NULL;
    uv_close((uv_handle_t *)&f->stop, NULL);
}

static void *rpc_client_thread(void *arg)
{
    rpc_fixture_t *f = arg;

    f->client(f);
    rpc_request_stop(f);
    return NULL;
}

/* Runs `client` on a thread while this thread serves. */
static void rpc_run(void (*client)(void *))
{
    rpc_fixture_t f;
    pthread_t thread;

    memset(&f, 0, sizeof(f));
    assert_int_equal(uv_loop_init(&f.loop), 0);
    assert_int_equal(uv_async_init(&f.loop, &f.stop, rpc_on_stop), 0);
    f.stop.data = &f;
    assert_int_equal(epd_rpc_server_create(&f.loop, "127.0.0.1:0", rpc_handler, &f, &f.server),
                     EPD_OK);
    assert_true(epd_rpc_server_port(f.server) > 0);
    snprintf(f.target, sizeof(f.target), "127.0.0.1:%d", epd_rpc_server_port(f.server));
    f.client = client;
    assert_int_equal(pthread_create(&thread, NULL, rpc_client_thread, &f), 0);
    uv_run(&f.loop, UV_RUN_DEFAULT);
    pthread_join(thread, NULL);
    assert_int_equal(uv_loop_close(&f.loop), 0);
    assert_int_equal(f.client_failed, 0);
}

#define CHECK(cond)                                                       \
    do {                                                                  \
        if (!(cond)) {                                                    \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            f->client_failed = 1;                                         \
            return;                                                       \
        }                                                                 \
    } while (0)

static void client_basic(void *arg)
{
    rpc_fixture_t *f = arg;
    epd_rpc_client_t *c = NULL;
    void *resp = NULL;
    size_t len = 0;
    char err[128];
    epd_status_t st;

    CHECK(epd_rpc_client_create(f->target, &c) == EPD_OK);
    st = epd_rpc_call(c, EPD_RPC_HEALTH, "ping", 4, 5000, &resp, &len, err, sizeof(err));
    CHECK(st == EPD_OK);
    CHECK(len == 7 && memcmp(resp, "ok:ping", 7) == 0);
    epd_free(resp);
    st = epd_rpc_call(c, EPD_RPC_DRAIN, "decode-9", 8, 5000, &resp, &len, err, sizeof(err));
    CHECK(st == EPD_ERR_NOT_FOUND);
    CHECK(strcmp(err, "no worker named 'decode-9'") == 0);
    st = epd_rpc_call(c, "/epd.Control/Nope", "", 0, 5000, &resp, &len, err, sizeof(err));
    CHECK(st == EPD_ERR_UNSUPPORTED);
    /* an empty request is a valid (empty) protobuf message */
    st = epd_rpc_call(c, EPD_RPC_HEALTH, NULL, 0, 5000, &resp, &len, err, sizeof(err));
    CHECK(st == EPD_OK && len == 3);
    epd_free(resp);
    CHECK(atomic_load(&f->handled) == 4);
    epd_rpc_client_destroy(c);
}

static void test_calls_and_errors(void **state)
{
    (void)state;
    rpc_run(client_basic);
}

static void client_deadline(void *arg)
{
    rpc_fixture_t *f = arg;
    epd_rpc_client_t *c = NULL;
    void *resp = NULL;
    size_t len = 0;
    uint64_t t0;
    epd_status_t st;

    CHECK(epd_rpc_client_create(f->target, &c) == EPD_OK);
    t0 = epd_time_now_ns();
    st = epd_rpc_call(c, "/epd.Control/Slow", "", 0, 300, &resp, &len, NULL, 0);
    CHECK(st == EPD_ERR_TIMEOUT);
    /* a liveness bound, not a performance one: far above 300 ms */
    CHECK(epd_time_now_ns() - t0 < 1400 * EPD_NSEC_PER_MSEC);
    epd_rpc_client_destroy(c);
}

static void test_deadline(void **state)
{
    (void)state;
    rpc_run(client_deadline);
}

static void client_port_taken(void *arg)
{
    rpc_fixture_t *f = arg;
    uv_loop_t loop;
    epd_rpc_server_t *second = NULL;

    /* a second server on the port the first one holds must be refused */
    CHECK(uv_loop_init(&loop) == 0);
    CHECK(epd_rpc_server_create(&loop, f->target, rpc_handler, f, &second) ==
          EPD_ERR_UNREACHABLE);
    CHECK(second == NULL);
    uv_run(&loop, UV_RUN_NOWAIT);
    CHECK(uv_loop_close(&loop) == 0);
}

static void test_port_taken(void **state)
{
    (void)state;
    rpc_run(client_port_taken);
}

static void test_dead_server_fails_fast(void **state)
{
    epd_rpc_client_t *c = NULL;
    void *resp = NULL;
    size_t len = 0;
    char err[256];
    uint64_t t0 = epd_time_now_ns();

    (void)state;
    /* port 1 on loopback: nothing listens there (and we are not allowed to) */
    assert_int_equal(epd_rpc_client_create("127.0.0.1:1", &c), EPD_OK);
    assert_int_equal(epd_rpc_call(c, EPD_RPC_HEALTH, "x", 1, 3000, &resp, &len, err, sizeof(err)),
                     EPD_ERR_UNREACHABLE);
    assert_true(epd_time_now_ns() - t0 < 10 * EPD_NSEC_PER_SEC);
    epd_rpc_client_destroy(c);
}

#define RPC_THREADS 4
#define RPC_CALLS 50

typedef struct {
    rpc_fixture_t *f;
    int ok;
    int id;
} rpc_worker_t;

static void *rpc_worker(void *arg)
{
    rpc_worker_t *w = arg;
    epd_rpc_client_t *c = NULL;

    if (epd_rpc_client_create(w->f->target, &c) != EPD_OK) {
        return NULL;
    }
    for (int i = 0; i < RPC_CALLS; i++) {
        char req[32];
        void *resp = NULL;
        size_t len = 0;
        int n = snprintf(req, sizeof(req), "t%d-c%d", w->id, i);

        if (epd_rpc_call(c, EPD_RPC_HEALTH, req, (size_t)n, 10000, &resp, &len, NULL, 0) ==
                EPD_OK &&
            len == (size_t)n + 3 && memcmp((char *)resp + 3, req, (size_t)n) == 0) {
            w->ok++;
        }
        epd_free(resp);
    }
    epd_rpc_client_destroy(c);
    return NULL;
}

static void client_concurrent(void *arg)
{
    rpc_fixture_t *f = arg;
    pthread_t threads[RPC_THREADS];
    rpc_worker_t workers[RPC_THREADS];
    int total = 0;

    for (int i = 0; i < RPC_THREADS; i++) {
        workers[i] = (rpc_worker_t){.f = f, .ok = 0, .id = i};
        pthread_create(&threads[i], NULL, rpc_worker, &workers[i]);
    }
    for (int i = 0; i < RPC_THREADS; i++) {
        pthread_join(threads[i], NULL);
        total += workers[i].ok;
    }
    CHECK(total == RPC_THREADS * RPC_CALLS);
    CHECK(atomic_load(&f->handled) == RPC_THREADS * RPC_CALLS);
}

static void test_concurrent_calls(void **state)
{
    (void)state;
    rpc_run(client_concurrent);
}

static void client_shutdown_midway(void *arg)
{
    rpc_fixture_t *f = arg;
    epd_rpc_client_t *c = NULL;
    void *resp = NULL;
    size_t len = 0;

    /* one answered call, then the server is destroyed by rpc_run while this
     * client's channel is still open (destroyed afterwards) */
    CHECK(epd_rpc_client_create(f->target, &c) == EPD_OK);
    CHECK(epd_rpc_call(c, EPD_RPC_HEALTH, "a", 1, 5000, &resp, &len, NULL, 0) == EPD_OK);
    epd_free(resp);
    rpc_request_stop(f);
    epd_time_sleep_ns(200 * EPD_NSEC_PER_MSEC);
    /* the server is gone: a call now fails with a clear status, no hang */
    CHECK(epd_rpc_call(c, EPD_RPC_HEALTH, "b", 1, 2000, &resp, &len, NULL, 0) != EPD_OK);
    epd_rpc_client_destroy(c);
}

static void test_shutdown(void **state)
{
    (void)state;
    rpc_run(client_shutdown_midway);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calls_and_errors),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_port_taken),
        cmocka_unit_test(test_dead_server_fails_fast),
        cmocka_unit_test(test_concurrent_calls),
        cmocka_unit_test(test_shutdown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
