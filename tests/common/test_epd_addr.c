/*
 * Tests of common/epd_addr.c: every HOST:PORT form a flag may carry, and
 * every malformed one refused with its reason.
 */
#include "epd_test.h"

#include <string.h>

#include "epd_addr.h"

static void test_split_ok(void **state)
{
    static const struct {
        const char *in, *host;
        uint16_t port;
    } cases[] = {
        {"127.0.0.1:8000", "127.0.0.1", 8000},
        {"localhost:0", "localhost", 0},
        {"name.example:65535", "name.example", 65535},
        {"[::1]:7000", "::1", 7000},
        {"[fe80::1%eth0]:0", "fe80::1%eth0", 0},
        {"[2001:db8::42]:443", "2001:db8::42", 443},
        {"10.77.0.11:00080", "10.77.0.11", 80},
    };
    char host[EPD_ADDR_HOST_MAX];
    char joined[EPD_ADDR_MAX];
    uint16_t port;

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(epd_addr_split(cases[i].in, host, sizeof(host), &port, NULL), EPD_OK);
        assert_string_equal(host, cases[i].host);
        assert_int_equal(port, cases[i].port);
        /* and back: IPv6 literals bracketed again */
        assert_int_equal(epd_addr_join(host, port, joined, sizeof(joined)), EPD_OK);
        assert_int_equal(epd_addr_split(joined, host, sizeof(host), &port, NULL), EPD_OK);
        assert_string_equal(host, cases[i].host);
    }
    assert_int_equal(epd_addr_join("::1", 9, joined, sizeof(joined)), EPD_OK);
    assert_string_equal(joined, "[::1]:9");
    assert_int_equal(epd_addr_join("h", 9, joined, 3), EPD_ERR_TOO_LONG);
}

static void test_split_refused(void **state)
{
    static const struct {
        const char *in, *why;
    } cases[] = {
        {"", "empty address"},
        {"localhost", "want HOST:PORT"},
        {":80", "empty host"},
        {"[]:80", "empty host"},
        {"host:", "no port"},
        {"host:80x", "not a number"},
        {"host:-1", "not a number"},
        {"host:65536", "above 65535"},
        {"::1:80", "bracketed"},
        {"[::1:80", "without ']'"},
        {"[::1]80", "want [HOST]:PORT"},
        {"::1]:80", "bracketed"},
        {"h]:80", "without '['"},
    };
    char host[EPD_ADDR_HOST_MAX] = "untouched";
    char small[4];
    uint16_t port = 12345;
    const char *why;

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        why = NULL;
        assert_int_equal(epd_addr_split(cases[i].in, host, sizeof(host), &port, &why),
                         EPD_ERR_INVALID_PARAM);
        assert_non_null(why);
        if (strstr(why, cases[i].why) == NULL) {
            fail_msg("'%s': '%s', want '%s'", cases[i].in, why, cases[i].why);
        }
        /* outputs written only on success */
        assert_string_equal(host, "untouched");
        assert_int_equal(port, 12345);
    }
    assert_int_equal(epd_addr_split(NULL, host, sizeof(host), &port, &why), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_addr_split("hostname:1", small, sizeof(small), &port, &why),
                     EPD_ERR_INVALID_PARAM);
    assert_non_null(strstr(why, "too long"));
}

/* Names resolve once into numeric hosts; wildcards and families are told
 * apart; the interface holding an address is found (lo on every host). */
static void test_resolve(void **state)
{
    char out[EPD_ADDR_MAX];
    char ifname[64];
    const char *why = NULL;

    (void)state;
    assert_int_equal(epd_addr_resolve("127.0.0.1", out, sizeof(out), NULL), EPD_OK);
    assert_string_equal(out, "127.0.0.1");
    assert_int_equal(epd_addr_resolve("::1", out, sizeof(out), NULL), EPD_OK);
    assert_string_equal(out, "::1");
    assert_int_equal(epd_addr_resolve("0.0.0.0", out, sizeof(out), NULL), EPD_OK);
    assert_string_equal(out, "0.0.0.0");
    /* a name: whatever the system puts first, numeric and loopback */
    assert_int_equal(epd_addr_resolve("localhost", out, sizeof(out), NULL), EPD_OK);
    assert_true(strcmp(out, "127.0.0.1") == 0 || strcmp(out, "::1") == 0);
    /* (a name that does not resolve would ask DNS: no traffic off the
     * host in tests; an empty one is refused before) */
    assert_int_equal(epd_addr_resolve("", out, sizeof(out), &why), EPD_ERR_INVALID_PARAM);
    assert_non_null(why);
    assert_int_equal(epd_addr_resolve("127.0.0.1", out, 4, NULL), EPD_ERR_TOO_LONG);
    assert_int_equal(epd_addr_resolve_hostport("[::1]:7000", out, sizeof(out), NULL), EPD_OK);
    assert_string_equal(out, "[::1]:7000");
    assert_int_equal(epd_addr_resolve_hostport("127.0.0.1:0", out, sizeof(out), NULL), EPD_OK);
    assert_string_equal(out, "127.0.0.1:0");
    assert_int_equal(epd_addr_resolve_hostport("localhost", out, sizeof(out), &why),
                     EPD_ERR_INVALID_PARAM);

    assert_true(epd_addr_is_wildcard("0.0.0.0"));
    assert_true(epd_addr_is_wildcard("::"));
    assert_true(epd_addr_is_wildcard("0:0::0"));
    assert_false(epd_addr_is_wildcard("127.0.0.1"));
    assert_false(epd_addr_is_wildcard("::1"));
    assert_false(epd_addr_is_wildcard("localhost")); /* numeric only */
    assert_true(epd_addr_is_ipv6("::1"));
    assert_true(epd_addr_is_ipv6("fe80::1"));
    assert_false(epd_addr_is_ipv6("10.77.0.1"));
    assert_false(epd_addr_is_ipv6("localhost"));

    assert_int_equal(epd_addr_iface("127.0.0.1", ifname, sizeof(ifname)), EPD_OK);
    assert_string_equal(ifname, "lo");
    assert_int_equal(epd_addr_iface("192.0.2.254", ifname, sizeof(ifname)), EPD_ERR_NOT_FOUND);
    assert_int_equal(epd_addr_iface("localhost", ifname, sizeof(ifname)), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_addr_iface("127.0.0.1", ifname, 2), EPD_ERR_TOO_LONG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_ok),
        cmocka_unit_test(test_split_refused),
        cmocka_unit_test(test_resolve),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
