/* Unit tests of proto/epd_rpc_h2scan.c: the guard sees the preface, each
 * frame header once, in order, whatever the cuts; a new stream only for a
 * HEADERS frame above every earlier stream id; anything else than HTTP/2
 * is refused. */
#include "epd_test.h"

#include <string.h>

#include "epd_rpc_h2scan.h"

typedef struct {
    int n;
    int stop_after;
    uint8_t type[16];
    uint32_t sid[16];
    int opens[16];
} rec_t;

static int on_frame(void *arg, uint8_t type, uint32_t sid, int opens)
{
    rec_t *r = arg;

    if (r->n < 16) {
        r->type[r->n] = type;
        r->sid[r->n] = sid;
        r->opens[r->n] = opens;
    }
    r->n++;
    return r->stop_after != 0 && r->n >= r->stop_after;
}

/* Appends a frame header (and `len` payload bytes of 0xab) at *p. */
static size_t frame(unsigned char *p, uint32_t len, uint8_t type, uint32_t sid)
{
    p[0] = (unsigned char)(len >> 16);
    p[1] = (unsigned char)(len >> 8);
    p[2] = (unsigned char)len;
    p[3] = type;
    p[4] = 0;
    p[5] = (unsigned char)(sid >> 24);
    p[6] = (unsigned char)(sid >> 16);
    p[7] = (unsigned char)(sid >> 8);
    p[8] = (unsigned char)sid;
    memset(p + 9, 0xab, len);
    return 9 + len;
}

/* preface, SETTINGS, HEADERS 1, RST 1, HEADERS 3, HEADERS 3 (trailers),
 * HEADERS 1 (old id), DATA 3 with 300 bytes */
static size_t stream_of(unsigned char *buf)
{
    size_t n = 0;

    memcpy(buf, EPD_RPC_H2_PREFACE, EPD_RPC_H2_PREFACE_LEN);
    n += EPD_RPC_H2_PREFACE_LEN;
    n += frame(buf + n, 0, 0x4, 0);
    n += frame(buf + n, 20, EPD_RPC_H2_HEADERS, 1);
    n += frame(buf + n, 4, EPD_RPC_H2_RST_STREAM, 1);
    n += frame(buf + n, 20, EPD_RPC_H2_HEADERS, 3);
    n += frame(buf + n, 5, EPD_RPC_H2_HEADERS, 3);
    n += frame(buf + n, 5, EPD_RPC_H2_HEADERS, 1);
    n += frame(buf + n, 300, 0x0, 3);
    return n;
}

static void check_events(const rec_t *r)
{
    static const uint8_t type[] = {0x4, 1, 3, 1, 1, 1, 0};
    static const uint32_t sid[] = {0, 1, 1, 3, 3, 1, 3};
    static const int opens[] = {0, 1, 0, 1, 0, 0, 0};

    assert_int_equal(r->n, 7);
    for (int i = 0; i < 7; i++) {
        assert_int_equal(r->type[i], type[i]);
        assert_int_equal(r->sid[i], sid[i]);
        assert_int_equal(r->opens[i], opens[i]);
    }
}

static void test_whole_and_byte_by_byte(void **state)
{
    unsigned char buf[1024];
    size_t n = stream_of(buf);
    epd_rpc_h2scan_t s;
    rec_t r;

    (void)state;
    memset(&s, 0, sizeof(s));
    memset(&r, 0, sizeof(r));
    assert_int_equal(epd_rpc_h2scan_feed(&s, buf, n, on_frame, &r), EPD_OK);
    check_events(&r);
    assert_int_equal(s.max_stream, 3);
    assert_int_equal(s.skip, 0);

    memset(&s, 0, sizeof(s));
    memset(&r, 0, sizeof(r));
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(epd_rpc_h2scan_feed(&s, buf + i, 1, on_frame, &r), EPD_OK);
    }
    check_events(&r);
    assert_int_equal(s.preface, EPD_RPC_H2_PREFACE_LEN);
}

static void test_not_http2_refused(void **state)
{
    static const char get[] = "GET / HTTP/1.1\r\n";
    epd_rpc_h2scan_t s;
    rec_t r;

    (void)state;
    memset(&s, 0, sizeof(s));
    memset(&r, 0, sizeof(r));
    assert_int_equal(epd_rpc_h2scan_feed(&s, (const unsigned char *)get, 3, on_frame, &r),
                     EPD_ERR_MALFORMED);
    /* a preface cut after its first bytes, then wrong */
    memset(&s, 0, sizeof(s));
    assert_int_equal(
        epd_rpc_h2scan_feed(&s, (const unsigned char *)EPD_RPC_H2_PREFACE, 10, on_frame, &r),
        EPD_OK);
    assert_int_equal(s.preface, 10);
    assert_int_equal(epd_rpc_h2scan_feed(&s, (const unsigned char *)"XXXX", 4, on_frame, &r),
                     EPD_ERR_MALFORMED);
    assert_int_equal(r.n, 0);
}

static void test_callback_stops(void **state)
{
    unsigned char buf[1024];
    size_t n = stream_of(buf);
    epd_rpc_h2scan_t s;
    rec_t r;

    (void)state;
    memset(&s, 0, sizeof(s));
    memset(&r, 0, sizeof(r));
    r.stop_after = 3;
    assert_int_equal(epd_rpc_h2scan_feed(&s, buf, n, on_frame, &r), EPD_ERR_CANCELED);
    assert_int_equal(r.n, 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_and_byte_by_byte),
        cmocka_unit_test(test_not_http2_refused),
        cmocka_unit_test(test_callback_stops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
