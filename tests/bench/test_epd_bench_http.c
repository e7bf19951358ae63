/*
 * test_epd_bench_http.c — bench/epd_bench_http.c against a real server on
 * 127.0.0.1 (a thread of this test, an ephemeral port): an answer ends at
 * its Content-Length or last chunk even when the server keeps the
 * connection open, a close-delimited one at the close; chunked bodies come
 * back whole; statuses, a silent server (the deadline), a closed port, an
 * over-long answer and malformed ones map to their epd_status_t.
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

/* One connection's server: answers `resp` to the first request, then
 * closes (close_after) or waits for the client to close first. */
typedef struct {
    int lfd;
    char addr[64];
    const char *resp;
    size_t resp_len;
    int close_after;
    char req[8192];
    size_t req_len;
    pthread_t th;
} srv_t;

static void *srv_main(void *arg)
{
    srv_t *s = arg;
    int fd = accept(s->lfd, NULL, NULL);
    char *end;
    char tmp[256];

    if (fd < 0) {
        return NULL;
    }
    /* the request: its headers, then its Content-Length of body */
    for (;;) {
        ssize_t n = recv(fd, s->req + s->req_len, sizeof(s->req) - 1 - s->req_len, 0);
        const char *cl;

        if (n <= 0) {
            break;
        }
        s->req_len += (size_t)n;
        s->req[s->req_len] = '\0';
        end = strstr(s->req, "\r\n\r\n");
        if (end == NULL) {
            continue;
        }
        cl = strstr(s->req, "Content-Length: ");
        if (cl == NULL || s->req_len >= (size_t)(end + 4 - s->req) + strtoul(cl + 16, NULL, 10)) {
            break;
        }
    }
    if (s->resp != NULL) {
        size_t off = 0;

        while (off < s->resp_len) {
            ssize_t n = send(fd, s->resp + off, s->resp_len - off, MSG_NOSIGNAL);

            if (n <= 0) {
                break;
            }
            off += (size_t)n;
        }
    }
    if (!s->close_after) {
        /* hold the connection until the client is done with it */
        while (recv(fd, tmp, sizeof(tmp), 0) > 0) {
        }
    }
    close(fd);
    return NULL;
}

static void srv_start(srv_t *s, const char *resp, size_t resp_len, int close_after)
{
    struct sockaddr_in a;
    socklen_t al = sizeof(a);

    memset(s, 0, sizeof(*s));
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    s->lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(s->lfd >= 0);
    assert_int_equal(bind(s->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(s->lfd, 4), 0);
    assert_int_equal(getsockname(s->lfd, (struct sockaddr *)&a, &al), 0);
    snprintf(s->addr, sizeof(s->addr), "127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    s->resp = resp;
    s->resp_len = resp_len;
    s->close_after = close_after;
    assert_int_equal(pthread_create(&s->th, NULL, srv_main, s), 0);
}

static void srv_join(srv_t *s)
{
    pthread_join(s->th, NULL);
    close(s->lfd);
}

/* Content-Length ends the answer: the server never closes (a wait for the
 * close would run into the 60 s deadline and fail). */
static void test_get_content_length(void **state)
{
    static const char resp[] = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
    char *body = NULL;
    size_t len = 0;
    srv_t s;

    (void)state;
    srv_start(&s, resp, sizeof(resp) - 1, 0);
    assert_int_equal(epd_bench_http_get(s.addr, "/metrics", 60000, &body, &len), EPD_OK);
    srv_join(&s);
    assert_string_equal(body, "hello");
    assert_int_equal(len, 5);
    assert_non_null(strstr(s.req, "GET /metrics HTTP/1.1\r\n"));
    assert_non_null(strstr(s.req, "\r\nConnection: close\r\n"));
    assert_non_null(strstr(s.req, s.addr)); /* Host: */
    epd_free(body);
}

static void test_get_chunked(void **state)
{
    static const char resp[] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                               "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
    char *body = NULL;
    size_t len = 0;
    srv_t s;

    (void)state;
    srv_start(&s, resp, sizeof(resp) - 1, 0);
    assert_int_equal(epd_bench_http_get(s.addr, "/x", 60000, &body, &len), EPD_OK);
    srv_join(&s);
    assert_string_equal(body, "hello world");
    assert_int_equal(len, 11);
    epd_free(body);
}

static void test_get_to_close(void **state)
{
    static const char resp[] = "HTTP/1.0 200 OK\r\n\r\nuntil the close";
    char *body = NULL;
    srv_t s;

    (void)state;
    srv_start(&s, resp, sizeof(resp) - 1, 1);
    assert_int_equal(epd_bench_http_get(s.addr, "/", 60000, &body, NULL), EPD_OK);
    srv_join(&s);
    assert_string_equal(body, "until the close");
    epd_free(body);
}

/* Past the first buffer (64 KiB): it grows, every byte arrives. */
static void test_get_large(void **state)
{
    size_t n = 300000, hl;
    char *resp = malloc(n + 128), *body = NULL;
    size_t len = 0;
    srv_t s;

    (void)state;
    assert_non_null(resp);
    hl = (size_t)sprintf(resp, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n", n);
    for (size_t i = 0; i < n; i++) {
        resp[hl + i] = (char)('a' + i % 26);
    }
    srv_start(&s, resp, hl + n, 0);
    assert_int_equal(epd_bench_http_get(s.addr, "/", 60000, &body, &len), EPD_OK);
    srv_join(&s);
    assert_int_equal(len, n);
    assert_memory_equal(body, resp + hl, n);
    epd_free(body);
    free(resp);
}

static void test_get_status(void **state)
{
    static const char r404[] = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
    static const char r500[] = "HTTP/1.1 500 Oops\r\nContent-Length: 2\r\n\r\nno";
    char *body = (char *)"untouched";
    srv_t s;

    (void)state;
    srv_start(&s, r404, sizeof(r404) - 1, 0);
    assert_int_equal(epd_bench_http_get(s.addr, "/", 60000, &body, NULL), EPD_ERR_NOT_FOUND);
    srv_join(&s);
    srv_start(&s, r500, sizeof(r500) - 1, 0);
    assert_int_equal(epd_bench_http_get(s.addr, "/", 60000, &body, NULL), EPD_ERR_IO);
    srv_join(&s);
    assert_string_equal(body, "untouched"); /* written only on success */
}

/* A POST: its body and Content-Length go out, any status comes back. */
static void test_request_post(void **state)
{
    static const char resp[] = "HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\n{\"a\"";
    static const char body[] = "{\"prompt\":\"hi\"}";
    epd_bench_http_resp_t r;
    srv_t s;

    (void)state;
    srv_start(&s, resp, sizeof(resp) - 1, 0);
    assert_int_equal(epd_bench_http_request(s.addr, "POST", "/v1/completions", body,
                                            sizeof(body) - 1, 60000, 1 << 20, &r),
                     EPD_OK);
    srv_join(&s);
    assert_int_equal(r.status, 201);
    assert_string_equal(r.body, "{\"a\"");
    assert_int_equal(r.body_len, 4);
    assert_non_null(strstr(s.req, "POST /v1/completions HTTP/1.1\r\n"));
    assert_non_null(strstr(s.req, "\r\nContent-Length: 15\r\n"));
    assert_non_null(strstr(s.req, "\r\n\r\n{\"prompt\":\"hi\"}"));
    epd_bench_http_resp_cleanup(&r);
    assert_null(r.buf);
}

/* A server that takes the request and never answers: the deadline ends
 * the call (the status is checked, not how long it took). */
static void test_timeout(void **state)
{
    char *body = NULL;
    srv_t s;

    (void)state;
    srv_start(&s, NULL, 0, 0);
    assert_int_equal(epd_bench_http_get(s.addr, "/", 200, &body, NULL), EPD_ERR_TIMEOUT);
    srv_join(&s);
    assert_null(body);
}

static void test_unreachable(void **state)
{
    struct sockaddr_in a;
    socklen_t al = sizeof(a);
    char addr[64], *body = NULL;
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    (void)state;
    /* a port bound and never listened on: the connect is refused */
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &al), 0);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    assert_int_equal(epd_bench_http_get(addr, "/", 60000, &body, NULL), EPD_ERR_UNREACHABLE);
    close(fd);
    assert_int_equal(epd_bench_http_get("no-port", "/", 1000, &body, NULL), EPD_ERR_INVALID_PARAM);
    assert_null(body);
}

static void test_too_long(void **state)
{
    static const char resp[] = "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"
                               "0123456789012345678901234567890123456789"
                               "0123456789012345678901234567890123456789"
                               "01234567890123456789";
    epd_bench_http_resp_t r;
    srv_t s;

    (void)state;
    srv_start(&s, resp, sizeof(resp) - 1, 0);
    assert_int_equal(epd_bench_http_request(s.addr, "GET", "/", NULL, 0, 60000, 64, &r),
                     EPD_ERR_TOO_LONG);
    srv_join(&s);
}

static void test_malformed(void **state)
{
    static const char bad_chunk[] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                    "5\r\nhelloXX0\r\n\r\n";
    static const char cut_chunk[] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                    "10\r\nhello";
    static const char no_status[] = "SPDY/9 ok\r\n\r\nbody";
    epd_bench_http_resp_t r;
    srv_t s;

    (void)state;
    srv_start(&s, bad_chunk, sizeof(bad_chunk) - 1, 0);
    assert_int_equal(epd_bench_http_request(s.addr, "GET", "/", NULL, 0, 60000, 1 << 20, &r),
                     EPD_ERR_MALFORMED);
    srv_join(&s);
    /* the close in the middle of a chunk */
    srv_start(&s, cut_chunk, sizeof(cut_chunk) - 1, 1);
    assert_int_equal(epd_bench_http_request(s.addr, "GET", "/", NULL, 0, 60000, 1 << 20, &r),
                     EPD_ERR_MALFORMED);
    srv_join(&s);
    srv_start(&s, no_status, sizeof(no_status) - 1, 1);
    assert_int_equal(epd_bench_http_request(s.addr, "GET", "/", NULL, 0, 60000, 1 << 20, &r),
                     EPD_ERR_MALFORMED);
    srv_join(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_get_content_length),
        cmocka_unit_test(test_get_chunked),
        cmocka_unit_test(test_get_to_close),
        cmocka_unit_test(test_get_large),
        cmocka_unit_test(test_get_status),
        cmocka_unit_test(test_request_post),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_unreachable),
        cmocka_unit_test(test_too_long),
        cmocka_unit_test(test_malformed),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
