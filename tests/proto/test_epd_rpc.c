/*
 * Tests of proto/epd_rpc*.c: a real gRPC server on 127.0.0.1 whose handler
 * runs on a libuv loop (this program's main thread), called by client
 * threads: answers and errors arrive intact, deadlines and a dead server
 * fail within bounded time, many concurrent calls all complete, and the
 * server shuts down cleanly with clients still calling.
 *
 * Authentication: with a cluster secret on the server, calls signed with it
 * run; no metadata, another secret, a body that is not the signed one, a
 * time outside the window, a malformed value and the exact same call sent
 * twice are each refused UNAUTHENTICATED (EPD_ERR_AUTH) without the handler
 * running; Health needs nothing; a server without a secret ignores the
 * metadata.  The replay cache itself: bounded (full refuses, never
 * forgets), expired nonces swept, replays still caught after sweeps.
 */
#include "epd_test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
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
    const char *secret; /* the server's cluster secret (NULL: none) */
    int auth_late;      /* set it only after the client's first call is queued */
} rpc_fixture_t;

#define SECRET "0123456789abcdef-cluster-secret"
#define OTHER_SECRET "0123456789abcdef-another-secret"

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

/* Runs `client` on a thread while this thread serves, the server with
 * `secret` (NULL: none); auth_late: the secret is set only 300 ms after the
 * client started, before the loop first runs (so the client's first call
 * waits in the queue to the loop, passed by the server thread unchecked). */
static void rpc_run_ex(void (*client)(void *), const char *secret, int auth_late)
{
    rpc_fixture_t f;
    pthread_t thread;

    memset(&f, 0, sizeof(f));
    f.secret = secret;
    f.auth_late = auth_late;
    assert_int_equal(uv_loop_init(&f.loop), 0);
    assert_int_equal(uv_async_init(&f.loop, &f.stop, rpc_on_stop), 0);
    f.stop.data = &f;
    assert_int_equal(epd_rpc_server_create(&f.loop, "127.0.0.1:0", rpc_handler, &f, &f.server),
                     EPD_OK);
    assert_true(epd_rpc_server_port(f.server) > 0);
    if (secret != NULL && !auth_late) {
        assert_int_equal(epd_rpc_server_set_auth(f.server, secret, strlen(secret)), EPD_OK);
    }
    snprintf(f.target, sizeof(f.target), "127.0.0.1:%d", epd_rpc_server_port(f.server));
    f.client = client;
    assert_int_equal(pthread_create(&thread, NULL, rpc_client_thread, &f), 0);
    if (secret != NULL && auth_late) {
        epd_time_sleep_ns(300 * EPD_NSEC_PER_MSEC);
        assert_int_equal(epd_rpc_server_set_auth(f.server, secret, strlen(secret)), EPD_OK);
    }
    uv_run(&f.loop, UV_RUN_DEFAULT);
    pthread_join(thread, NULL);
    assert_int_equal(uv_loop_close(&f.loop), 0);
    assert_int_equal(f.client_failed, 0);
}

static void rpc_run(void (*client)(void *))
{
    rpc_run_ex(client, NULL, 0);
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

/* ------------------------------------------------------ authentication */

static uint64_t now_ms(void)
{
    return epd_time_wall_ns() / EPD_NSEC_PER_MSEC;
}

#define DRAIN_BODY "decode-9"

/* A Drain that reaches the handler answers NOT_FOUND with its message. */
#define CHECK_HANDLED(st, err)                                                                     \
    CHECK((st) == EPD_ERR_NOT_FOUND && strcmp((err), "no worker named 'decode-9'") == 0)

/* st is the refusal `why` names, and the handler count did not move. */
static int refused(rpc_fixture_t *f, epd_status_t st, const char *err, const char *why,
                   int handled_before)
{
    if (st != EPD_ERR_AUTH || strstr(err, why) == NULL ||
        atomic_load(&f->handled) != handled_before) {
        fprintf(stderr,
                "want EPD_ERR_AUTH '%s' with the handler not run: got %s '%s', %d -> %d "
                "handled\n",
                why, epd_status_name(st), err, handled_before, atomic_load(&f->handled));
        return 0;
    }
    return 1;
}

static void client_auth(void *arg)
{
    rpc_fixture_t *f = arg;
    epd_rpc_client_t *good = NULL, *none = NULL, *other = NULL;
    epd_rpc_auth_t *auth = NULL;
    char value[EPD_RPC_AUTH_VALUE_MAX];
    void *resp = NULL;
    size_t len = 0;
    char err[256];
    epd_status_t st;
    int h;

    CHECK(epd_rpc_client_create(f->target, &good) == EPD_OK);
    CHECK(epd_rpc_client_create(f->target, &none) == EPD_OK);
    CHECK(epd_rpc_client_create(f->target, &other) == EPD_OK);
    CHECK(epd_rpc_client_set_auth(good, SECRET, strlen(SECRET)) == EPD_OK);
    CHECK(epd_rpc_client_set_auth(other, OTHER_SECRET, strlen(OTHER_SECRET)) == EPD_OK);
    CHECK(epd_rpc_auth_create(SECRET, strlen(SECRET), 0, &auth) == EPD_OK);

    /* signed with the secret: the handler runs, every time */
    for (int i = 0; i < 3; i++) {
        h = atomic_load(&f->handled);
        st = epd_rpc_call(good, EPD_RPC_DRAIN, DRAIN_BODY, 8, 5000, &resp, &len, err, sizeof(err));
        CHECK_HANDLED(st, err);
        CHECK(atomic_load(&f->handled) == h + 1);
    }
    /* Health is open: no metadata needed, the handler runs */
    h = atomic_load(&f->handled);
    st = epd_rpc_call(none, EPD_RPC_HEALTH, "ping", 4, 5000, &resp, &len, err, sizeof(err));
    CHECK(st == EPD_OK && len == 7 && memcmp(resp, "ok:ping", 7) == 0);
    epd_free(resp);
    CHECK(atomic_load(&f->handled) == h + 1);
    h++;
    /* no metadata */
    st = epd_rpc_call(none, EPD_RPC_DRAIN, DRAIN_BODY, 8, 5000, &resp, &len, err, sizeof(err));
    CHECK(refused(f, st, err, "no x-epd-auth metadata", h));
    /* an unknown method is refused as well, before the handler */
    st = epd_rpc_call(none, "/epd.Control/Nope", "", 0, 5000, &resp, &len, err, sizeof(err));
    CHECK(refused(f, st, err, "no x-epd-auth metadata", h));
    /* another secret */
    st = epd_rpc_call(other, EPD_RPC_DRAIN, DRAIN_BODY, 8, 5000, &resp, &len, err, sizeof(err));
    CHECK(refused(f, st, err, "MAC does not verify", h));
    /* a body other than the signed one (same metadata) */
    CHECK(epd_rpc_auth_sign(auth, EPD_RPC_DRAIN, DRAIN_BODY, 8, now_ms(), value, sizeof(value)) ==
          EPD_OK);
    st = epd_rpc_call_with_auth(none, EPD_RPC_DRAIN, "decode-8", 8, value, 5000, &resp, &len, err,
                                sizeof(err));
    CHECK(refused(f, st, err, "MAC does not verify", h));
    /* another method under the same metadata */
    st = epd_rpc_call_with_auth(none, EPD_RPC_STATUS, DRAIN_BODY, 8, value, 5000, &resp, &len, err,
                                sizeof(err));
    CHECK(refused(f, st, err, "MAC does not verify", h));
    /* times outside the window, either side */
    CHECK(epd_rpc_auth_sign(auth, EPD_RPC_DRAIN, DRAIN_BODY, 8,
                            now_ms() - EPD_RPC_AUTH_WINDOW_MS - 2000, value,
                            sizeof(value)) == EPD_OK);
    st = epd_rpc_call_with_auth(none, EPD_RPC_DRAIN, DRAIN_BODY, 8, value, 5000, &resp, &len, err,
                                sizeof(err));
    CHECK(refused(f, st, err, "outside the +-30 s window", h));
    CHECK(epd_rpc_auth_sign(auth, EPD_RPC_DRAIN, DRAIN_BODY, 8,
                            now_ms() + EPD_RPC_AUTH_WINDOW_MS + 2000, value,
                            sizeof(value)) == EPD_OK);
    st = epd_rpc_call_with_auth(none, EPD_RPC_DRAIN, DRAIN_BODY, 8, value, 5000, &resp, &len, err,
                                sizeof(err));
    CHECK(refused(f, st, err, "outside the +-30 s window", h));
    /* malformed values */
    st = epd_rpc_call_with_auth(none, EPD_RPC_DRAIN, DRAIN_BODY, 8, "v1:12:zz", 5000, &resp, &len,
                                err, sizeof(err));
    CHECK(refused(f, st, err, "malformed x-epd-auth", h));
    CHECK(epd_rpc_auth_sign(auth, EPD_RPC_DRAIN, DRAIN_BODY, 8, now_ms(), value, sizeof(value)) ==
          EPD_OK);
    value[3] = 'x';
    st = epd_rpc_call_with_auth(none, EPD_RPC_DRAIN, DRAIN_BODY, 8, value, 5000, &resp, &len, err,
                                sizeof(err));
    CHECK(refused(f, st, err, "malformed x-epd-auth", h));
    /* the exact same call twice: the first runs, the replay is refused */
    CHECK(epd_rpc_auth_sign(auth, EPD_RPC_DRAIN, DRAIN_BODY, 8, now_ms(), value, sizeof(value)) ==
          EPD_OK);
    st = epd_rpc_call_with_auth(none, EPD_RPC_DRAIN, DRAIN_BODY, 8, value, 5000, &resp, &len, err,
                                sizeof(err));
    CHECK_HANDLED(st, err);
    CHECK(atomic_load(&f->handled) == h + 1);
    h++;
    st = epd_rpc_call_with_auth(none, EPD_RPC_DRAIN, DRAIN_BODY, 8, value, 5000, &resp, &len, err,
                                sizeof(err));
    CHECK(refused(f, st, err, "replayed", h));
    /* ... also over another channel (another connection) */
    st = epd_rpc_call_with_auth(other, EPD_RPC_DRAIN, DRAIN_BODY, 8, value, 5000, &resp, &len, err,
                                sizeof(err));
    CHECK(refused(f, st, err, "replayed", h));
    /* every refusal above counted */
    CHECK(epd_rpc_server_auth_refused(f->server) == 11);
    epd_rpc_auth_destroy(auth);
    epd_rpc_client_destroy(good);
    epd_rpc_client_destroy(none);
    epd_rpc_client_destroy(other);
}

static void test_auth_required(void **state)
{
    (void)state;
    rpc_run_ex(client_auth, SECRET, 0);
}

/* Without a secret on the server, signed and unsigned calls both run. */
static void client_no_server_secret(void *arg)
{
    rpc_fixture_t *f = arg;
    epd_rpc_client_t *c = NULL;
    void *resp = NULL;
    size_t len = 0;
    char err[256];
    epd_status_t st;

    CHECK(epd_rpc_client_create(f->target, &c) == EPD_OK);
    st = epd_rpc_call(c, EPD_RPC_DRAIN, DRAIN_BODY, 8, 5000, &resp, &len, err, sizeof(err));
    CHECK_HANDLED(st, err);
    CHECK(epd_rpc_client_set_auth(c, SECRET, strlen(SECRET)) == EPD_OK);
    st = epd_rpc_call(c, EPD_RPC_DRAIN, DRAIN_BODY, 8, 5000, &resp, &len, err, sizeof(err));
    CHECK_HANDLED(st, err);
    st = epd_rpc_call_with_auth(c, EPD_RPC_DRAIN, DRAIN_BODY, 8, "garbage", 5000, &resp, &len, err,
                                sizeof(err));
    CHECK_HANDLED(st, err);
    CHECK(atomic_load(&f->handled) == 3);
    CHECK(epd_rpc_server_auth_refused(f->server) == 0);
    epd_rpc_client_destroy(c);
}

static void test_auth_off(void **state)
{
    (void)state;
    rpc_run_ex(client_no_server_secret, NULL, 0);
}

/* A call the server thread took before the secret was set never runs. */
static void client_before_auth(void *arg)
{
    rpc_fixture_t *f = arg;
    epd_rpc_client_t *c = NULL, *good = NULL;
    void *resp = NULL;
    size_t len = 0;
    char err[256];
    epd_status_t st;

    CHECK(epd_rpc_client_create(f->target, &c) == EPD_OK);
    CHECK(epd_rpc_client_create(f->target, &good) == EPD_OK);
    CHECK(epd_rpc_client_set_auth(good, SECRET, strlen(SECRET)) == EPD_OK);
    st = epd_rpc_call(c, EPD_RPC_DRAIN, DRAIN_BODY, 8, 5000, &resp, &len, err, sizeof(err));
    /* the loop refuses it (taken before set_auth: the usual case here) or,
     * on a machine slow enough that the call came after, the server thread */
    fprintf(stderr, "the early call: %s '%s'\n", epd_status_name(st), err);
    CHECK(refused(f, st, err, "", 0));
    st = epd_rpc_call(good, EPD_RPC_DRAIN, DRAIN_BODY, 8, 5000, &resp, &len, err, sizeof(err));
    CHECK_HANDLED(st, err);
    epd_rpc_client_destroy(c);
    epd_rpc_client_destroy(good);
}

static void test_auth_set_late(void **state)
{
    (void)state;
    rpc_run_ex(client_before_auth, SECRET, 1);
}

static void test_auth_params(void **state)
{
    uv_loop_t loop;
    epd_rpc_server_t *s = NULL;
    epd_rpc_client_t *c = NULL;
    epd_rpc_auth_t *a = NULL;
    char value[EPD_RPC_AUTH_VALUE_MAX];

    (void)state;
    assert_int_equal(epd_rpc_auth_create("short", 5, 0, &a), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_rpc_auth_create(NULL, 0, 0, &a), EPD_ERR_INVALID_PARAM);
    assert_null(a);
    assert_int_equal(epd_rpc_auth_create(SECRET, strlen(SECRET), 0, &a), EPD_OK);
    assert_int_equal(epd_rpc_auth_sign(a, EPD_RPC_DRAIN, "", 0, 1, value, 64), EPD_ERR_TOO_LONG);
    epd_rpc_auth_destroy(a);
    epd_rpc_auth_destroy(NULL);
    assert_int_equal(uv_loop_init(&loop), 0);
    assert_int_equal(epd_rpc_server_create(&loop, "127.0.0.1:0", rpc_handler, NULL, &s), EPD_OK);
    assert_int_equal(epd_rpc_server_set_auth(s, "short", 5), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_rpc_server_set_auth(s, SECRET, strlen(SECRET)), EPD_OK);
    assert_int_equal(epd_rpc_server_set_auth(s, SECRET, strlen(SECRET)), EPD_ERR_BUSY);
    epd_rpc_server_destroy(s);
    uv_run(&loop, UV_RUN_NOWAIT);
    assert_int_equal(uv_loop_close(&loop), 0);
    assert_int_equal(epd_rpc_client_create("127.0.0.1:1", &c), EPD_OK);
    assert_int_equal(epd_rpc_client_set_auth(c, "short", 5), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_rpc_client_set_auth(c, SECRET, strlen(SECRET)), EPD_OK);
    assert_int_equal(epd_rpc_client_set_auth(c, NULL, 0), EPD_OK);
    epd_rpc_client_destroy(c);
}

/* The format: v1:<ms>:<32 hex>:<64 hex>, one spelling only. */
static void test_auth_value_format(void **state)
{
    epd_rpc_auth_t *a = NULL;
    char v[EPD_RPC_AUTH_VALUE_MAX], w[EPD_RPC_AUTH_VALUE_MAX + 32];
    const char *why = NULL;
    const uint64_t t = 1700000000123ull;
    size_t n;

    (void)state;
    assert_int_equal(epd_rpc_auth_create(SECRET, strlen(SECRET), 16, &a), EPD_OK);
    assert_int_equal(epd_rpc_auth_sign(a, EPD_RPC_DRAIN, "b", 1, t, v, sizeof(v)), EPD_OK);
    n = strlen(v);
    assert_int_equal(n, 3 + 13 + 1 + 32 + 1 + 64);
    assert_memory_equal(v, "v1:1700000000123:", 17);
    for (size_t i = 17; i < n; i++) {
        assert_true((v[i] >= '0' && v[i] <= '9') || (v[i] >= 'a' && v[i] <= 'f') ||
                    (i == 17 + 32 && v[i] == ':'));
    }
    /* uppercase hex, a leading zero, a sign, bytes more or less: malformed */
    snprintf(w, sizeof(w), "%s", v);
    w[20] = w[20] >= 'a' ? (char)(w[20] - 32) : 'A';
    assert_int_equal(epd_rpc_auth_check(a, EPD_RPC_DRAIN, "b", 1, w, n, t, &why), EPD_ERR_AUTH);
    assert_non_null(strstr(why, "malformed"));
    snprintf(w, sizeof(w), "v1:0%s", v + 3);
    assert_int_equal(epd_rpc_auth_check(a, EPD_RPC_DRAIN, "b", 1, w, n + 1, t, &why), EPD_ERR_AUTH);
    assert_non_null(strstr(why, "malformed"));
    snprintf(w, sizeof(w), "v1:+%s", v + 3);
    assert_int_equal(epd_rpc_auth_check(a, EPD_RPC_DRAIN, "b", 1, w, n + 1, t, &why), EPD_ERR_AUTH);
    snprintf(w, sizeof(w), "%s0", v);
    assert_int_equal(epd_rpc_auth_check(a, EPD_RPC_DRAIN, "b", 1, w, n + 1, t, &why), EPD_ERR_AUTH);
    assert_int_equal(epd_rpc_auth_check(a, EPD_RPC_DRAIN, "b", 1, v, n - 1, t, &why), EPD_ERR_AUTH);
    snprintf(w, sizeof(w), "v1:99999999999999999999999:%s", strchr(v + 3, ':') + 1);
    assert_int_equal(epd_rpc_auth_check(a, EPD_RPC_DRAIN, "b", 1, w, strlen(w), t, &why),
                     EPD_ERR_AUTH);
    assert_non_null(strstr(why, "malformed"));
    /* the window's edges are inside */
    assert_int_equal(
        epd_rpc_auth_check(a, EPD_RPC_DRAIN, "b", 1, v, n, t + EPD_RPC_AUTH_WINDOW_MS, &why),
        EPD_OK);
    assert_int_equal(epd_rpc_auth_sign(a, EPD_RPC_DRAIN, "b", 1, t, v, sizeof(v)), EPD_OK);
    assert_int_equal(
        epd_rpc_auth_check(a, EPD_RPC_DRAIN, "b", 1, v, n, t + EPD_RPC_AUTH_WINDOW_MS + 1, &why),
        EPD_ERR_AUTH);
    assert_int_equal(
        epd_rpc_auth_check(a, EPD_RPC_DRAIN, "b", 1, v, n, t - EPD_RPC_AUTH_WINDOW_MS - 1, &why),
        EPD_ERR_AUTH);
    assert_int_equal(
        epd_rpc_auth_check(a, EPD_RPC_DRAIN, "b", 1, v, n, t - EPD_RPC_AUTH_WINDOW_MS, &why),
        EPD_OK);
    /* an empty body signs and checks */
    assert_int_equal(epd_rpc_auth_sign(a, EPD_RPC_STATUS, NULL, 0, t, v, sizeof(v)), EPD_OK);
    assert_int_equal(epd_rpc_auth_check(a, EPD_RPC_STATUS, NULL, 0, v, n, t, &why), EPD_OK);
    epd_rpc_auth_destroy(a);
}

/* Bounded: full, a new nonce is refused (NO_RESOURCE) rather than an old
 * one forgotten; once the old ones' window passed they are swept. */
static void test_replay_cache_full(void **state)
{
    epd_rpc_auth_t *a = NULL;
    char v[8][EPD_RPC_AUTH_VALUE_MAX];
    const char *why = NULL;
    const uint64_t t = 1700000000000ull;
    const uint64_t w = EPD_RPC_AUTH_WINDOW_MS;

    (void)state;
    assert_int_equal(epd_rpc_auth_create(SECRET, strlen(SECRET), 4, &a), EPD_OK);
    /* v[i] at t + 100 i ms (gone after t + w + 100 i), v[5] at t + 5000 */
    for (int i = 0; i < 6; i++) {
        assert_int_equal(epd_rpc_auth_sign(a, EPD_RPC_HEARTBEAT, "x", 1,
                                           t + (i < 5 ? (uint64_t)i * 100 : 5000), v[i],
                                           sizeof(v[i])),
                         EPD_OK);
    }
    for (int i = 0; i < 4; i++) {
        assert_int_equal(
            epd_rpc_auth_check(a, EPD_RPC_HEARTBEAT, "x", 1, v[i], strlen(v[i]), t + 5000, &why),
            EPD_OK);
    }
    assert_int_equal(epd_rpc_auth_nonces(a), 4);
    /* full: refused, and all four still remembered */
    assert_int_equal(
        epd_rpc_auth_check(a, EPD_RPC_HEARTBEAT, "x", 1, v[4], strlen(v[4]), t + 5000, &why),
        EPD_ERR_NO_RESOURCE);
    assert_non_null(strstr(why, "full"));
    for (int i = 0; i < 4; i++) {
        assert_int_equal(
            epd_rpc_auth_check(a, EPD_RPC_HEARTBEAT, "x", 1, v[i], strlen(v[i]), t + 5000, &why),
            EPD_ERR_AUTH);
        assert_non_null(strstr(why, "replayed"));
    }
    /* after t + w, v[0] is gone: a sweep (the last ran at t + 5000) makes room */
    assert_int_equal(
        epd_rpc_auth_check(a, EPD_RPC_HEARTBEAT, "x", 1, v[4], strlen(v[4]), t + w + 1, &why),
        EPD_OK);
    assert_int_equal(epd_rpc_auth_nonces(a), 4); /* v[1..4] */
    /* v[1] is gone too at t + w + 500, but a full cache is swept at most
     * once a second: refused */
    assert_int_equal(
        epd_rpc_auth_check(a, EPD_RPC_HEARTBEAT, "x", 1, v[5], strlen(v[5]), t + w + 500, &why),
        EPD_ERR_NO_RESOURCE);
    assert_int_equal(epd_rpc_auth_nonces(a), 4);
    /* a second after the last sweep: v[1..4] are swept, v[5] is remembered */
    assert_int_equal(
        epd_rpc_auth_check(a, EPD_RPC_HEARTBEAT, "x", 1, v[5], strlen(v[5]), t + w + 1001, &why),
        EPD_OK);
    assert_int_equal(epd_rpc_auth_nonces(a), 1);
    assert_int_equal(
        epd_rpc_auth_check(a, EPD_RPC_HEARTBEAT, "x", 1, v[5], strlen(v[5]), t + w + 1001, &why),
        EPD_ERR_AUTH);
    assert_non_null(strstr(why, "replayed"));
    /* forgotten only once its time fails the window */
    assert_int_equal(
        epd_rpc_auth_check(a, EPD_RPC_HEARTBEAT, "x", 1, v[4], strlen(v[4]), t + w + 1001, &why),
        EPD_ERR_AUTH);
    assert_non_null(strstr(why, "window"));
    epd_rpc_auth_destroy(a);
}

/* Many nonces of spread-out times through several sweeps: every one still
 * in its window is caught as a replay (the backward-shift deletion keeps
 * every probe run whole), and the count stays bounded. */
static void test_replay_cache_sweeps(void **state)
{
    enum { MAX = 512, ROUNDS = 6, PER = 400 };
    epd_rpc_auth_t *a = NULL;
    static char v[ROUNDS * PER][EPD_RPC_AUTH_VALUE_MAX];
    static uint64_t tv[ROUNDS * PER];
    static int stored[ROUNDS * PER];
    const char *why = NULL;
    uint64_t base = 1700000000000ull, now = base;
    int n = 0, n_stored = 0, n_full = 0;

    (void)state;
    srand(7);
    assert_int_equal(epd_rpc_auth_create(SECRET, strlen(SECRET), MAX, &a), EPD_OK);
    for (int r = 0; r < ROUNDS; r++) {
        now = base + (uint64_t)r * 20000;
        for (int i = 0; i < PER; i++, n++) {
            epd_status_t st;

            /* times spread over the window around now */
            tv[n] =
                now - EPD_RPC_AUTH_WINDOW_MS + (uint64_t)(rand() % (2 * EPD_RPC_AUTH_WINDOW_MS));
            assert_int_equal(
                epd_rpc_auth_sign(a, EPD_RPC_HEARTBEAT, "h", 1, tv[n], v[n], sizeof(v[n])), EPD_OK);
            st = epd_rpc_auth_check(a, EPD_RPC_HEARTBEAT, "h", 1, v[n], strlen(v[n]), now, &why);
            assert_true(st == EPD_OK || st == EPD_ERR_NO_RESOURCE);
            stored[n] = st == EPD_OK;
            n_stored += st == EPD_OK;
            n_full += st != EPD_OK;
            now += 5; /* 400 calls: 2 s, so more than one sweep may run */
        }
        assert_true(epd_rpc_auth_nonces(a) <= MAX);
        /* every stored nonce still in its window is a replay now */
        for (int k = 0; k < n; k++) {
            epd_status_t st;

            if (!stored[k] || tv[k] + EPD_RPC_AUTH_WINDOW_MS < now) {
                continue;
            }
            st = epd_rpc_auth_check(a, EPD_RPC_HEARTBEAT, "h", 1, v[k], strlen(v[k]), now, &why);
            if (st != EPD_ERR_AUTH || strstr(why, "replayed") == NULL) {
                fail_msg("round %d: nonce %d (time %+lld ms) not caught: %s %s", r, k,
                         (long long)(tv[k] - now), epd_status_name(st), why);
            }
        }
    }
    fprintf(stderr, "%d nonces remembered, %d refused (full)\n", n_stored, n_full);
    assert_true(n_stored > MAX); /* sweeps made room */
    assert_true(n_full > 0);     /* and the bound held */
    epd_rpc_auth_destroy(a);
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
        cmocka_unit_test(test_auth_required),
        cmocka_unit_test(test_auth_off),
        cmocka_unit_test(test_auth_set_late),
        cmocka_unit_test(test_auth_params),
        cmocka_unit_test(test_auth_value_format),
        cmocka_unit_test(test_replay_cache_full),
        cmocka_unit_test(test_replay_cache_sweeps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
