/* Unit tests of common/epd_status.c. */
#include "epd_test.h"

#include <string.h>

#include "epd_status.h"

static void test_strings_and_names(void **state)
{
    (void)state;
    assert_string_equal(epd_status_string(EPD_OK), "success");
    assert_string_equal(epd_status_name(EPD_ERR_TIMEOUT), "EPD_ERR_TIMEOUT");
    assert_string_equal(epd_status_string(EPD_ERR_NO_RESOURCE),
                        "no resource now (backpressure): retry after progress");
    assert_string_equal(epd_status_string((epd_status_t)-9999), "unknown status");
    assert_string_equal(epd_status_name((epd_status_t)42), "EPD_UNKNOWN_STATUS");
}

static void test_every_status_has_distinct_text(void **state)
{
    static const epd_status_t all[] = {
#define EPD__T(name, value, text) name,
        EPD_STATUS_LIST(EPD__T)
#undef EPD__T
    };
    size_t n = sizeof(all) / sizeof(all[0]);

    (void)state;
    for (size_t i = 0; i < n; i++) {
        assert_string_not_equal(epd_status_string(all[i]), "unknown status");
        for (size_t j = i + 1; j < n; j++) {
            assert_int_not_equal(all[i], all[j]);
            assert_string_not_equal(epd_status_name(all[i]), epd_status_name(all[j]));
        }
    }
}

static void test_scopes(void **state)
{
    (void)state;
    assert_int_equal(epd_status_scope(EPD_OK), EPD_SCOPE_NONE);
    assert_int_equal(epd_status_scope(EPD_INPROGRESS), EPD_SCOPE_NONE);
    assert_int_equal(epd_status_scope(EPD_ERR_NO_CAPACITY), EPD_SCOPE_REQUEST);
    assert_int_equal(epd_status_scope(EPD_ERR_CORRUPT), EPD_SCOPE_REQUEST);
    assert_int_equal(epd_status_scope(EPD_ERR_UNREACHABLE), EPD_SCOPE_CONNECTION);
    assert_int_equal(epd_status_scope(EPD_ERR_BAD_RKEY), EPD_SCOPE_CONNECTION);
    assert_int_equal(epd_status_scope(EPD_ERR_PEER_DEAD), EPD_SCOPE_PEER);
    assert_int_equal(epd_status_scope(EPD_ERR_STALE_EPOCH), EPD_SCOPE_PEER);
    assert_int_equal(epd_status_scope(EPD_ERR_CONFIG), EPD_SCOPE_NODE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strings_and_names),
        cmocka_unit_test(test_every_status_has_distinct_text),
        cmocka_unit_test(test_scopes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
