/*
 * Tests of api/epd_http_proxy.c: --trusted-proxies parsing (IPv4 and
 * IPv6 blocks, single addresses, every malformed entry refused with a
 * reason that names it) and the X-Forwarded-For rule (nginx's
 * real_ip_recursive): from an untrusted peer the header is ignored; from a
 * trusted one the right-most entry that is not itself trusted is the
 * client, over several headers as one list; all trusted: the left-most;
 * a non-address entry stops the walk at the last trusted hop.  How the
 * server counts with it is tested through the router
 * (tests/integration/test_router_overload.sh).
 */
#include "epd_test.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_http.h"

/* addr[16] of a literal (the 16-byte form: IPv4 as ::ffff:a.b.c.d) */
static void addr_of(const char *s, unsigned char addr[16])
{
    struct in_addr v4;

    memset(addr, 0, 16);
    if (inet_pton(AF_INET, s, &v4) == 1) {
        addr[10] = 0xff;
        addr[11] = 0xff;
        memcpy(addr + 12, &v4, 4);
        return;
    }
    assert_int_equal(inet_pton(AF_INET6, s, addr), 1);
}

static void addr_text(const unsigned char addr[16], char *out, size_t cap)
{
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

    if (memcmp(addr, mapped, 12) == 0) {
        inet_ntop(AF_INET, addr + 12, out, (socklen_t)cap);
    } else {
        inet_ntop(AF_INET6, addr, out, (socklen_t)cap);
    }
}

static epd_http_proxies_t *parse_ok(const char *list)
{
    epd_http_proxies_t *p = NULL;
    char why[256] = "";
    epd_status_t st = epd_http_proxies_parse(list, &p, why, sizeof(why));

    if (st != EPD_OK) {
        print_error("'%s' refused: %s\n", list, why);
    }
    assert_int_equal(st, EPD_OK);
    return p;
}

static int matches(const epd_http_proxies_t *p, const char *addr)
{
    unsigned char a[16];

    addr_of(addr, a);
    return epd_http_proxies_match(p, a);
}

static void test_parse_and_match(void **state)
{
    epd_http_proxies_t *p;

    (void)state;
    p = parse_ok("10.0.0.0/8, 192.168.1.7 ,fd00::/8,2001:db8::1,172.16.0.0/12");
    assert_int_equal(epd_http_proxies_count(p), 5);
    assert_true(matches(p, "10.0.0.1"));
    assert_true(matches(p, "10.255.255.255"));
    assert_false(matches(p, "11.0.0.1"));
    assert_true(matches(p, "192.168.1.7"));
    assert_false(matches(p, "192.168.1.8"));
    assert_true(matches(p, "172.31.0.9"));
    assert_false(matches(p, "172.32.0.9"));
    assert_true(matches(p, "fd12:3456::1"));
    assert_false(matches(p, "fe80::1"));
    assert_true(matches(p, "2001:db8::1"));
    assert_false(matches(p, "2001:db8::2"));
    /* an IPv4 peer reaching an IPv6 listener is the same IPv4 address */
    assert_true(matches(p, "::ffff:10.1.2.3"));
    epd_http_proxies_destroy(p);

    p = parse_ok("0.0.0.0/0");
    assert_true(matches(p, "203.0.113.9"));
    assert_false(matches(p, "2001:db8::1")); /* IPv4's /0 is not all of IPv6 */
    epd_http_proxies_destroy(p);
    p = parse_ok("::/0");
    assert_true(matches(p, "2001:db8::1"));
    assert_true(matches(p, "203.0.113.9")); /* ::ffff:0:0/96 is inside ::/0 */
    epd_http_proxies_destroy(p);
    p = parse_ok("127.0.0.1/32");
    assert_true(matches(p, "127.0.0.1"));
    assert_false(matches(p, "127.0.0.2"));
    epd_http_proxies_destroy(p);
    assert_false(epd_http_proxies_match(NULL, (const unsigned char *)"0123456789abcdef"));
    assert_int_equal(epd_http_proxies_count(NULL), 0);
    epd_http_proxies_destroy(NULL);
}

static void test_parse_refusals(void **state)
{
    static const struct {
        const char *list;
        const char *why; /* a piece of the reason */
    } bad[] = {
        {"", "empty entry"},
        {"10.0.0.0/8,", "empty entry"},
        {"10.0.0.0/8,,fd00::/8", "empty entry"},
        {"10.0.0.0/33", "prefix length must be 0 to 32"},
        {"fd00::/129", "prefix length must be 0 to 128"},
        {"10.0.0.0/", "prefix length"},
        {"10.0.0.0/8x", "prefix length"},
        {"10.0.0.0/-1", "prefix length"},
        {"10.0.0.1/8", "did you mean 10.0.0.0/8"},
        {"fd00::1/8", "did you mean fd00::/8"},
        {"10.0.0", "not an IPv4 or IPv6 address"},
        {"example.com", "not an IPv4 or IPv6 address"},
        {"10.0.0.0/8 fd00::/8", "prefix length"},
        {"fe80::1%eth0", "not an IPv4 or IPv6 address"},
        {"1.2.3.4.5/32", "not an IPv4 or IPv6 address"},
    };
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        epd_http_proxies_t *p = NULL;
        char why[256] = "";
        epd_status_t st = epd_http_proxies_parse(bad[i].list, &p, why, sizeof(why));

        if (st != EPD_ERR_INVALID_PARAM || strstr(why, bad[i].why) == NULL) {
            print_error("'%s': status %d, why '%s' (want '%s')\n", bad[i].list, (int)st, why,
                        bad[i].why);
        }
        assert_int_equal(st, EPD_ERR_INVALID_PARAM);
        assert_non_null(strstr(why, bad[i].why));
        assert_null(p);
    }
}

/* The client the rule names for `peer` and the headers values[0..n). */
static void expect_client(const epd_http_proxies_t *p, const char *peer, const char *const *values,
                          size_t n, const char *want)
{
    unsigned char a[16];
    unsigned char got[16];
    char text[64];

    addr_of(peer, a);
    epd_http_forwarded_addr(p, a, values, n, got);
    addr_text(got, text, sizeof(text));
    if (strcmp(text, want) != 0) {
        print_error("peer %s, %zu headers (first '%s'): client %s, want %s\n", peer, n,
                    n > 0 ? values[0] : "", text, want);
    }
    assert_string_equal(text, want);
}

static void test_forwarded_rule(void **state)
{
    epd_http_proxies_t *p = parse_ok("127.0.0.2/32,10.9.0.0/16,fd00::/8");
    const char *one[1];
    const char *two[2];

    (void)state;
    /* an untrusted peer: whatever it claims, its own address */
    one[0] = "203.0.113.9";
    expect_client(p, "127.0.0.1", one, 1, "127.0.0.1");
    expect_client(p, "127.0.0.1", NULL, 0, "127.0.0.1");
    /* a trusted peer without the header: itself */
    expect_client(p, "127.0.0.2", NULL, 0, "127.0.0.2");
    /* the right-most entry, when not trusted */
    one[0] = "203.0.113.9";
    expect_client(p, "127.0.0.2", one, 1, "203.0.113.9");
    /* a client's forged entries on the left are never reached */
    one[0] = "1.1.1.1, 2.2.2.2, 203.0.113.9";
    expect_client(p, "127.0.0.2", one, 1, "203.0.113.9");
    /* trusted hops on the right are passed over (recursive) */
    one[0] = "1.1.1.1, 203.0.113.9, 10.9.3.4,fd00::7 ";
    expect_client(p, "127.0.0.2", one, 1, "203.0.113.9");
    /* a trusted hop forged by the client left of the client is not read */
    one[0] = "10.9.0.1, 203.0.113.9";
    expect_client(p, "127.0.0.2", one, 1, "203.0.113.9");
    /* every entry trusted: the left-most */
    one[0] = "10.9.0.1, 10.9.0.2";
    expect_client(p, "127.0.0.2", one, 1, "10.9.0.1");
    /* several headers: one list, the last header's last entry first */
    two[0] = "198.51.100.1, 10.9.0.5";
    two[1] = "10.9.0.6";
    expect_client(p, "127.0.0.2", two, 2, "198.51.100.1");
    two[0] = "198.51.100.1";
    two[1] = "203.0.113.9";
    expect_client(p, "127.0.0.2", two, 2, "203.0.113.9");
    /* empty elements are skipped; blanks around entries too */
    one[0] = " 203.0.113.9 , , \t";
    expect_client(p, "127.0.0.2", one, 1, "203.0.113.9");
    one[0] = "";
    expect_client(p, "127.0.0.2", one, 1, "127.0.0.2");
    /* not an address: the walk stops at the last trusted hop reached */
    one[0] = "203.0.113.9, unknown";
    expect_client(p, "127.0.0.2", one, 1, "127.0.0.2");
    one[0] = "203.0.113.9, garbage, 10.9.0.8";
    expect_client(p, "127.0.0.2", one, 1, "10.9.0.8");
    one[0] = "203.0.113.9:4711";
    expect_client(p, "127.0.0.2", one, 1, "127.0.0.2");
    /* IPv6 clients and proxies */
    one[0] = "2001:db8::5, fd00::1";
    expect_client(p, "fd00::2", one, 1, "2001:db8::5");
    expect_client(p, "2001:db8::9", one, 1, "2001:db8::9");
    /* a long list stays a walk from the right */
    {
        static char big[8192];
        size_t len = 0;
        int i;

        for (i = 0; i < 500; i++) {
            len += (size_t)snprintf(big + len, sizeof(big) - len, "192.0.2.%d, ", i % 250);
        }
        snprintf(big + len, sizeof(big) - len, "203.0.113.77, 10.9.1.1");
        one[0] = big;
        expect_client(p, "127.0.0.2", one, 1, "203.0.113.77");
    }
    epd_http_proxies_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_and_match),
        cmocka_unit_test(test_parse_refusals),
        cmocka_unit_test(test_forwarded_rule),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
