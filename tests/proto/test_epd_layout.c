/* Unit tests of proto/epd_layout.c: a layout survives the wire and every
 * field that differs is named. */
#include "epd_test.h"

#include <string.h>

#include "epd_layout.h"

static void layout_make(epd_kv_layout_t *l)
{
    memset(l, 0, sizeof(*l));
    l->n_layers = 6;
    for (uint32_t i = 0; i < 6; i++) {
        l->kind[i] = (i % 3 == 2) ? EPD_LAYER_ATTENTION : EPD_LAYER_LINEAR;
    }
    l->n_attn_layers = 2;
    l->n_linear_layers = 4;
    l->dtype = EPD_DTYPE_F32;
    l->block_tokens = 16;
    l->n_kv_heads = 2;
    l->head_dim = 32;
    l->block_bytes = 2ull * 2 * 16 * 32 * 4;
    l->n_state_heads = 4;
    l->state_bytes = 4ull * 32 * 32 * 4;
}

static void test_round_trip_through_bytes(void **state)
{
    epd_kv_layout_t l;
    Epd__KvLayout msg;
    char pattern[EPD_LAYOUT_PATTERN_MAX];
    unsigned char buf[256];
    Epd__KvLayout *back;
    size_t n;

    (void)state;
    layout_make(&l);
    epd_layout_to_msg(&l, &msg, pattern);
    assert_string_equal(pattern, "LLALLA");
    n = epd__kv_layout__pack(&msg, buf);
    back = epd__kv_layout__unpack(&epd_proto_allocator, n, buf);
    assert_non_null(back);
    assert_int_equal(epd_layout_check(&l, back, NULL), EPD_OK);
    epd__kv_layout__free_unpacked(back, &epd_proto_allocator);
}

static void test_each_difference_named(void **state)
{
    epd_kv_layout_t l;
    epd_kv_layout_t other;
    Epd__KvLayout msg;
    char pattern[EPD_LAYOUT_PATTERN_MAX];
    const char *why = NULL;

    (void)state;
    layout_make(&l);
    assert_int_equal(epd_layout_check(&l, NULL, &why), EPD_ERR_INVALID_PARAM);
    assert_string_equal(why, "no KV layout");

    other = l;
    other.kind[0] = EPD_LAYER_ATTENTION;
    epd_layout_to_msg(&other, &msg, pattern);
    assert_int_equal(epd_layout_check(&l, &msg, &why), EPD_ERR_INVALID_PARAM);
    assert_string_equal(why, "layer pattern differs");

    other = l;
    other.block_tokens = 32;
    epd_layout_to_msg(&other, &msg, pattern);
    assert_int_equal(epd_layout_check(&l, &msg, &why), EPD_ERR_INVALID_PARAM);
    assert_string_equal(why, "block_tokens differs");

    other = l;
    other.dtype = EPD_DTYPE_BF16;
    epd_layout_to_msg(&other, &msg, pattern);
    assert_int_equal(epd_layout_check(&l, &msg, &why), EPD_ERR_INVALID_PARAM);
    assert_string_equal(why, "KV dtype differs");

    other = l;
    other.state_bytes += 4;
    epd_layout_to_msg(&other, &msg, pattern);
    assert_int_equal(epd_layout_check(&l, &msg, &why), EPD_ERR_INVALID_PARAM);
    assert_string_equal(why, "recurrent state size differs");

    other = l;
    other.n_layers = 5;
    epd_layout_to_msg(&other, &msg, pattern);
    assert_int_equal(epd_layout_check(&l, &msg, &why), EPD_ERR_INVALID_PARAM);
    assert_string_equal(why, "number of layers differs");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_through_bytes),
        cmocka_unit_test(test_each_difference_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
