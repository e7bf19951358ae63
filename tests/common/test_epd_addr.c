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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_ok),
        cmocka_unit_test(test_split_refused),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
