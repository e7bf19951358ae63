/* test_epd_gen_config.c — generation_config.json's default sampling
 * (engine/epd_gen_config.c): absent file or keys, Qwen3's file, top_k's
 * two spellings of off, and refusals (out of range, wrong type, not an
 * object). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <string.h>

#include "epd_gen_config.h"
#include "epd_test_engine_util.h"

static epd_status_t load_text(const char *dir, const char *text, epd_gen_defaults_t *g)
{
    epd_test_write_file(epd_test_path(dir, "generation_config.json"), text, strlen(text));
    return epd_gen_defaults_load(dir, g);
}

static void test_defaults(void **state)
{
    const char *dir = epd_test_tmpdir();
    epd_gen_defaults_t g;

    (void)state;
    /* no file: no defaults */
    assert_int_equal(epd_gen_defaults_load(dir, &g), EPD_OK);
    assert_false(g.has_temperature || g.has_top_p || g.has_top_k);
    /* Qwen3's */
    assert_int_equal(load_text(dir,
                               "{\"bos_token_id\": 151643, \"do_sample\": true, \"eos_token_id\": "
                               "[151645, 151643], \"pad_token_id\": 151643, \"temperature\": 0.6, "
                               "\"top_k\": 20, \"top_p\": 0.95, \"transformers_version\": "
                               "\"4.51.0\"}",
                               &g),
                     EPD_OK);
    assert_true(g.has_temperature && g.has_top_p && g.has_top_k);
    assert_true(g.temperature == 0.6);
    assert_true(g.top_p == 0.95);
    assert_int_equal(g.top_k, 20);
    /* Llama-3's: only eos and sampling without top_k */
    assert_int_equal(load_text(dir, "{\"temperature\": 0.6, \"top_p\": 0.9, \"top_k\": null}", &g),
                     EPD_OK);
    assert_true(g.has_temperature && g.has_top_p);
    assert_false(g.has_top_k);
    /* top_k -1 and 0: off (given, 0) */
    assert_int_equal(load_text(dir, "{\"top_k\": -1}", &g), EPD_OK);
    assert_true(g.has_top_k);
    assert_int_equal(g.top_k, 0);
    assert_false(g.has_temperature);
    assert_int_equal(load_text(dir, "{\"temperature\": 0}", &g), EPD_OK);
    assert_true(g.has_temperature && g.temperature == 0.0);
    /* refused, *g left without defaults */
    assert_int_equal(load_text(dir, "{\"temperature\": 2.5}", &g), EPD_ERR_MALFORMED);
    assert_false(g.has_temperature);
    assert_int_equal(load_text(dir, "{\"top_p\": 0}", &g), EPD_ERR_MALFORMED);
    assert_int_equal(load_text(dir, "{\"top_p\": \"0.9\"}", &g), EPD_ERR_MALFORMED);
    assert_int_equal(load_text(dir, "{\"top_k\": -2}", &g), EPD_ERR_MALFORMED);
    assert_int_equal(load_text(dir, "{\"top_k\": 1.5}", &g), EPD_ERR_MALFORMED);
    assert_int_equal(load_text(dir, "[1]", &g), EPD_ERR_MALFORMED);
    assert_int_equal(load_text(dir, "{", &g), EPD_ERR_MALFORMED);
    epd_test_rmtree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
