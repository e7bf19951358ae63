/* Unit tests of common/epd_config.c: flags, config files, range checks. */
#include "epd_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "epd_config.h"

typedef struct {
    const char *model;
    int64_t blocks;
    double temperature;
    int trace;
} test_cfg_t;

static void test_opts_make(test_cfg_t *cfg, epd_opt_t *opts, epd_opts_t *o)
{
    cfg->model = "default";
    cfg->blocks = 64;
    cfg->temperature = 0.0;
    cfg->trace = 0;
    opts[0] = (epd_opt_t){"model", EPD_OPT_STRING, &cfg->model, 0, 0, "model folder"};
    opts[1] = (epd_opt_t){"kv-blocks", EPD_OPT_INT, &cfg->blocks, 1, 1 << 24, "KV blocks"};
    opts[2] = (epd_opt_t){"temperature", EPD_OPT_DOUBLE, &cfg->temperature, 0, 10, "temp"};
    opts[3] = (epd_opt_t){"trace", EPD_OPT_BOOL, &cfg->trace, 0, 0, "trace"};
    *o = (epd_opts_t){.prog = "test", .summary = "a test", .opts = opts, .n_opts = 4};
}

static void test_parse_forms(void **state)
{
    test_cfg_t cfg;
    epd_opt_t opts[4];
    epd_opts_t o;
    char *argv[] = {"prog", "--model", "m1", "--kv-blocks=4k", "--temperature", "0.5",
                    "--trace", "rest", "--model", "ignored"};
    int argi = -1;

    (void)state;
    test_opts_make(&cfg, opts, &o);
    assert_int_equal(epd_opts_parse(&o, 10, argv, &argi), EPD_OK);
    assert_string_equal(cfg.model, "m1");
    assert_int_equal(cfg.blocks, 4096);
    assert_true(cfg.temperature == 0.5);
    assert_int_equal(cfg.trace, 1);
    assert_int_equal(argi, 7); /* "rest" stops option parsing */
    epd_opts_cleanup(&o);
}

static void test_no_prefix_and_double_dash(void **state)
{
    test_cfg_t cfg;
    epd_opt_t opts[4];
    epd_opts_t o;
    char *argv[] = {"prog", "--trace", "--no-trace", "--", "--model"};
    int argi = -1;

    (void)state;
    test_opts_make(&cfg, opts, &o);
    assert_int_equal(epd_opts_parse(&o, 5, argv, &argi), EPD_OK);
    assert_int_equal(cfg.trace, 0);
    assert_int_equal(argi, 4);
    assert_string_equal(cfg.model, "default");
    epd_opts_cleanup(&o);
}

static void test_bad_values_refused(void **state)
{
    static const char *const bad[][2] = {
        {"--kv-blocks", "0"},       /* below range */
        {"--kv-blocks", "12x"},     /* trailing garbage */
        {"--kv-blocks", ""},        /* empty */
        {"--kv-blocks", "99999999999999999999"}, /* overflow */
        {"--temperature", "nan"},   /* not finite */
        {"--temperature", "11"},    /* above range */
        {"--trace=maybe", NULL},    /* bad bool */
        {"--unknown", "1"},         /* unknown flag */
        {"--model", NULL},          /* missing value */
    };

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        test_cfg_t cfg;
        epd_opt_t opts[4];
        epd_opts_t o;
        char *argv[3] = {"prog", (char *)bad[i][0], (char *)bad[i][1]};
        int argi = -1;

        test_opts_make(&cfg, opts, &o);
        assert_int_equal(epd_opts_parse(&o, bad[i][1] != NULL ? 3 : 2, argv, &argi),
                         EPD_ERR_INVALID_PARAM);
        assert_int_equal(cfg.blocks, 64);
        assert_int_equal(argi, -1);
        epd_opts_cleanup(&o);
    }
}

static void test_config_file(void **state)
{
    char path[] = "/tmp/epd-test-config-XXXXXX";
    int fd = mkstemp(path);
    FILE *f;
    test_cfg_t cfg;
    epd_opt_t opts[4];
    epd_opts_t o;
    int argi;

    (void)state;
    assert_true(fd >= 0);
    f = fdopen(fd, "w");
    fprintf(f, "# a comment\n\nmodel = from-file  # trailing\nkv-blocks 128\ntrace=yes\n");
    fclose(f);
    {
        char *argv[] = {"prog", "--config", path, "--kv-blocks", "7"};

        test_opts_make(&cfg, opts, &o);
        assert_int_equal(epd_opts_parse(&o, 5, argv, &argi), EPD_OK);
        assert_string_equal(cfg.model, "from-file");
        assert_int_equal(cfg.blocks, 7); /* the later flag wins */
        assert_int_equal(cfg.trace, 1);
        epd_opts_cleanup(&o);
    }
    f = fopen(path, "w");
    fprintf(f, "model = ok\nkv-blocks = -5\n");
    fclose(f);
    {
        char *argv[] = {"prog", "--config", path};

        test_opts_make(&cfg, opts, &o);
        assert_int_equal(epd_opts_parse(&o, 3, argv, &argi), EPD_ERR_INVALID_PARAM);
        epd_opts_cleanup(&o);
    }
    unlink(path);
    {
        char *argv[] = {"prog", "--config", "/nonexistent/epd.conf"};

        test_opts_make(&cfg, opts, &o);
        assert_int_equal(epd_opts_parse(&o, 3, argv, &argi), EPD_ERR_INVALID_PARAM);
        epd_opts_cleanup(&o);
    }
}

static void test_help(void **state)
{
    test_cfg_t cfg;
    epd_opt_t opts[4];
    epd_opts_t o;
    char *argv[] = {"prog", "--help"};
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    int argi;

    (void)state;
    test_opts_make(&cfg, opts, &o);
    epd_opts_usage(&o, mem);
    fclose(mem);
    assert_non_null(strstr(text, "--kv-blocks"));
    assert_non_null(strstr(text, "[64]"));
    free(text);
    assert_int_equal(epd_opts_parse(&o, 2, argv, &argi), EPD_ERR_CANCELED);
    epd_opts_cleanup(&o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_forms),
        cmocka_unit_test(test_no_prefix_and_double_dash),
        cmocka_unit_test(test_bad_values_refused),
        cmocka_unit_test(test_config_file),
        cmocka_unit_test(test_help),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
