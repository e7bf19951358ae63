/*
 * test_epd_bench_sse.c — bench/epd_bench_sse.c (serve's streaming client)
 * on a libuv loop against a scripted server thread on 127.0.0.1 (an
 * ephemeral port): chunked SSE answers hand over each `data:` payload,
 * [DONE] and error events are the client's, a kept-alive connection
 * carries the next request, a close-delimited answer ends at the close, a
 * non-200 answer keeps its body, and a bad answer, a refused connect and
 * epd_bench_sse_close_all end a request as lost — each request ends once.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "epd_test.h"

#include "epd_alloc.h"
#include "epd_bench_http.h"

#define MAX_REQ 4

/* The server: answers the k-th request it reads with resp[k] (NULL: never
 * answers), closes the connection after it when bit k of close_mask is
 * set (else keeps it for the next request), and ends once it answered
 * n_resp requests and the last connection closed. */
typedef struct {
    int lfd;
    struct sockaddr_in addr;
    const char *resp[MAX_REQ];
    int n_resp;
    unsigned close_mask;
    int accepts;
    int requests;
    pthread_t th;
} srv_t;

/* Reads one request (headers and Content-Length body).  0, or -1 when the
 * client closed. */
static int srv_read_req(int fd)
{
    char buf[8192];
    size_t len = 0;

    for (;;) {
        ssize_t n = recv(fd, buf + len, sizeof(buf) - 1 - len, 0);
        char *end;
        const char *cl;

        if (n <= 0) {
            return -1;
        }
        len += (size_t)n;
        buf[len] = '\0';
        end = strstr(buf, "\r\n\r\n");
        if (end == NULL) {
            continue;
        }
        cl = strstr(buf, "Content-Length: ");
        if (cl == NULL || len >= (size_t)(end + 4 - buf) + strtoul(cl + 16, NULL, 10)) {
            return 0;
        }
    }
}

static void *srv_main(void *arg)
{
    srv_t *s = arg;

    while (s->requests < s->n_resp) {
        int fd = accept(s->lfd, NULL, NULL), closing = 0;

        if (fd < 0) {
            return NULL;
        }
        s->accepts++;
        while (s->requests < s->n_resp && srv_read_req(fd) == 0) {
            int k = s->requests++;

            if (s->resp[k] != NULL && send(fd, s->resp[k], strlen(s->resp[k]), MSG_NOSIGNAL) < 0) {
                break;
            }
            if ((s->close_mask >> k) & 1u) {
                closing = 1;
                break;
            }
        }
        if (!closing) {
            char tmp[256];

            /* until the client closes (a kept-alive connection) */
            while (recv(fd, tmp, sizeof(tmp), 0) > 0) {
            }
        }
        close(fd);
    }
    return NULL;
}

static void srv_start(srv_t *s, unsigned close_mask)
{
    socklen_t al = sizeof(s->addr);

    s->addr.sin_family = AF_INET;
    s->addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    s->lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(s->lfd >= 0);
    assert_int_equal(bind(s->lfd, (struct sockaddr *)&s->addr, sizeof(s->addr)), 0);
    assert_int_equal(listen(s->lfd, 4), 0);
    assert_int_equal(getsockname(s->lfd, (struct sockaddr *)&s->addr, &al), 0);
    s->close_mask = close_mask;
    assert_int_equal(pthread_create(&s->th, NULL, srv_main, s), 0);
}

static void srv_join(srv_t *s)
{
    /* a server still waiting for a request that never came (close_all
     * before the bytes went) is woken: accept() fails */
    shutdown(s->lfd, SHUT_RDWR);
    pthread_join(s->th, NULL);
    close(s->lfd);
}

/* What the client said, per request (user = its index). */
typedef struct {
    uv_loop_t loop;
    uv_timer_t next; /* starts the next request once one ended */
    epd_bench_sse_t *sse;
    int n_req;   /* requests to send, one after the other */
    int started; /* sent so far */
    int sends[MAX_REQ];
    char data[MAX_REQ][256]; /* the payloads, each followed by '|' */
    int ends[MAX_REQ];
    epd_bench_sse_end_t end[MAX_REQ];
    char error[MAX_REQ][160], body[MAX_REQ][160], lost[MAX_REQ][64];
    int closes;
    int close_all_on_send; /* close everything once request 0 was sent */
    int close_all_on_end0; /* close everything when request 0 ended */
} cl_t;

static void cl_start(cl_t *c)
{
    static const char req[] = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                              "Content-Length: 2\r\n\r\n{}";
    char *bytes = epd_malloc(sizeof(req));

    assert_non_null(bytes);
    memcpy(bytes, req, sizeof(req));
    epd_bench_sse_start(c->sse, bytes, sizeof(req) - 1, (void *)(uintptr_t)c->started++);
}

static void cl_on_next(uv_timer_t *t)
{
    cl_start(t->data);
}

static void cl_on_send(void *arg, void *user, uint64_t now)
{
    cl_t *c = arg;

    assert_true(now > 0);
    c->sends[(uintptr_t)user]++;
    if (c->close_all_on_send) {
        epd_bench_sse_close_all(c->sse);
    }
}

static void cl_on_data(void *arg, void *user, const char *data, uint64_t now)
{
    cl_t *c = arg;
    char *d = c->data[(uintptr_t)user];

    (void)now;
    snprintf(d + strlen(d), sizeof(c->data[0]) - strlen(d), "%s|", data);
}

static void cl_on_end(void *arg, void *user, const epd_bench_sse_end_t *end, uint64_t now)
{
    cl_t *c = arg;
    uintptr_t i = (uintptr_t)user;

    (void)now;
    c->ends[i]++;
    c->end[i] = *end;
    /* the strings are borrowed for the call */
    snprintf(c->error[i], sizeof(c->error[i]), "%s", end->error != NULL ? end->error : "");
    snprintf(c->body[i], sizeof(c->body[i]), "%s", end->body != NULL ? end->body : "");
    snprintf(c->lost[i], sizeof(c->lost[i]), "%s", end->lost != NULL ? end->lost : "");
    if (i == 0 && c->close_all_on_end0) {
        epd_bench_sse_close_all(c->sse);
    }
    if (c->started < c->n_req) {
        /* from the loop, not this callback: the connection is idle again
         * (or closed and freed, with close_all_on_end0) */
        uv_timer_start(&c->next, cl_on_next, 0, 0);
    } else {
        epd_bench_sse_close_all(c->sse);
        uv_close((uv_handle_t *)&c->next, NULL);
    }
}

static void cl_on_close(void *arg)
{
    ((cl_t *)arg)->closes++;
}

/* Sends n_req requests one after the other to `addr` and runs the loop
 * until everything closed. */
static void cl_run(cl_t *c, const struct sockaddr_in *addr, int n_req)
{
    epd_bench_sse_cbs_t cbs = {
        .on_send = cl_on_send,
        .on_data = cl_on_data,
        .on_end = cl_on_end,
        .on_close = cl_on_close,
        .arg = c,
    };

    assert_int_equal(uv_loop_init(&c->loop), 0);
    assert_int_equal(uv_timer_init(&c->loop, &c->next), 0);
    c->next.data = c;
    assert_int_equal(
        epd_bench_sse_create(&c->loop, (const struct sockaddr *)addr, sizeof(*addr), &cbs, &c->sse),
        EPD_OK);
    c->n_req = n_req;
    cl_start(c);
    assert_int_equal(uv_run(&c->loop, UV_RUN_DEFAULT), 0);
    assert_int_equal(uv_loop_close(&c->loop), 0); /* no handle left */
    epd_bench_sse_destroy(c->sse);
    for (int i = 0; i < n_req; i++) {
        assert_int_equal(c->ends[i], 1); /* each request ends once */
    }
}

#define CHUNKED_OK                                                                                 \
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"     \
    "14\r\ndata: {\"text\":\"a\"}\n\n\r\n"                                                         \
    "14\r\ndata: {\"text\":\"b\"}\n\n\r\n"                                                         \
    "e\r\ndata: [DONE]\n\n\r\n"                                                                    \
    "0\r\n\r\n"

/* Two streams on one kept-alive connection: every payload, [DONE] the
 * client's own. */
static void test_chunked_keepalive(void **state)
{
    static cl_t c;
    static srv_t s;

    (void)state;
    s.resp[0] = CHUNKED_OK;
    s.resp[1] = CHUNKED_OK;
    s.n_resp = 2;
    srv_start(&s, 0);
    cl_run(&c, &s.addr, 2);
    srv_join(&s);
    assert_int_equal(s.accepts, 1); /* the second request reused the connection */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(c.sends[i], 1);
        assert_string_equal(c.data[i], "{\"text\":\"a\"}|{\"text\":\"b\"}|");
        assert_int_equal(c.end[i].status, 200);
        assert_int_equal(c.end[i].saw_done, 1);
        assert_string_equal(c.error[i], "");
        assert_string_equal(c.lost[i], "");
    }
}

/* An error event is handed over at the end, not as data; no [DONE]. */
static void test_error_event(void **state)
{
    static const char body[] = "data: {\"text\":\"a\"}\n\n"
                               "data: {\"error\":{\"x\":1}}\n\n";
    static char resp[256];
    static cl_t c;
    static srv_t s;

    (void)state;
    snprintf(resp, sizeof(resp), "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n%s",
             sizeof(body) - 1, body);
    s.resp[0] = resp;
    s.n_resp = 1;
    srv_start(&s, 0);
    cl_run(&c, &s.addr, 1);
    srv_join(&s);
    assert_string_equal(c.data[0], "{\"text\":\"a\"}|");
    assert_int_equal(c.end[0].status, 200);
    assert_int_equal(c.end[0].saw_done, 0);
    assert_string_equal(c.error[0], "{\"error\":{\"x\":1}}");
}

/* A 503 keeps its body; a close-delimited answer ends at the close (and
 * the close is told). */
static void test_status_and_close(void **state)
{
    static const char r503[] = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 9\r\n\r\n"
                               "no worker";
    static const char rclose[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
                                 "data: x\n\ndata: [DONE]\n\n";
    static cl_t c;
    static srv_t s;

    (void)state;
    s.resp[0] = r503;
    s.resp[1] = rclose;
    s.n_resp = 2;
    srv_start(&s, 2u); /* the close ends the second answer */
    cl_run(&c, &s.addr, 2);
    srv_join(&s);
    assert_int_equal(c.end[0].status, 503);
    assert_string_equal(c.body[0], "no worker");
    assert_string_equal(c.data[0], "");
    assert_int_equal(c.end[1].status, 200);
    assert_int_equal(c.end[1].saw_done, 1);
    assert_string_equal(c.data[1], "x|");
    assert_true(c.closes >= 1);
}

static void test_bad_response(void **state)
{
    static cl_t c;
    static srv_t s;

    (void)state;
    s.resp[0] = "garbage\r\n\r\n";
    s.n_resp = 1;
    srv_start(&s, 0);
    cl_run(&c, &s.addr, 1);
    srv_join(&s);
    assert_string_equal(c.lost[0], "bad HTTP response");
    assert_int_equal(c.end[0].status, 0);
}

/* A port bound and never listened on: the connect is refused. */
static void test_refused(void **state)
{
    static cl_t c;
    struct sockaddr_in a;
    socklen_t al = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    (void)state;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &al), 0);
    cl_run(&c, &a, 1);
    close(fd);
    assert_int_equal(c.sends[0], 0);
    assert_string_equal(c.lost[0], "connection lost");
}

/* A server that never answers: close_all ends the request as lost. */
static void test_close_all(void **state)
{
    static cl_t c;
    static srv_t s;

    (void)state;
    s.resp[0] = NULL;
    s.n_resp = 1;
    srv_start(&s, 0);
    c.close_all_on_send = 1;
    cl_run(&c, &s.addr, 1);
    srv_join(&s);
    assert_int_equal(c.sends[0], 1);
    assert_string_equal(c.lost[0], "connection lost");
}

/* close_all from on_end: the connection that just answered is closed,
 * never handed to the next request (which opens a new one).  (It went
 * back on the idle list after on_end and was used once freed.) */
static void test_close_all_in_on_end(void **state)
{
    static cl_t c;
    static srv_t s;

    (void)state;
    s.resp[0] = CHUNKED_OK;
    s.resp[1] = CHUNKED_OK;
    s.n_resp = 2;
    srv_start(&s, 0);
    c.close_all_on_end0 = 1;
    cl_run(&c, &s.addr, 2);
    srv_join(&s);
    assert_int_equal(s.accepts, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(c.end[i].status, 200);
        assert_string_equal(c.data[i], "{\"text\":\"a\"}|{\"text\":\"b\"}|");
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunked_keepalive),
        cmocka_unit_test(test_error_event),
        cmocka_unit_test(test_status_and_close),
        cmocka_unit_test(test_bad_response),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_close_all),
        cmocka_unit_test(test_close_all_in_on_end),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
