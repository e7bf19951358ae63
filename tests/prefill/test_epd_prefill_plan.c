/*
 * Tests of prefill/epd_prefill_plan.c: the write plan of one request —
 * which local bytes go to which remote offset, for attention blocks and
 * linear states — and the refusal of reservations that name blocks or slots
 * outside decode's pool, the wrong number of blocks, a block twice, or a
 * region smaller than its pool.
 */
#include "epd_test.h"

#include <string.h>

#include "epd_prefill_plan.h"

/* A hybrid layout "LALA": block_tokens 16, 2 kv heads of 16, f32. */
static void plan_layout(epd_kv_layout_t *kv)
{
    uint32_t n_attn = 0, n_lin = 0;

    memset(kv, 0, sizeof(*kv));
    kv->n_layers = 4;
    for (uint32_t l = 0; l < 4; l++) {
        kv->kind[l] = l % 2 == 0 ? EPD_LAYER_LINEAR : EPD_LAYER_ATTENTION;
        kv->kind_index[l] = kv->kind[l] == EPD_LAYER_LINEAR ? n_lin++ : n_attn++;
    }
    kv->n_attn_layers = n_attn;
    kv->n_linear_layers = n_lin;
    kv->dtype = EPD_DTYPE_F32;
    kv->block_tokens = 16;
    kv->n_kv_heads = 2;
    kv->head_dim = 16;
    kv->block_bytes = 2ull * 2 * 16 * 16 * 4;
    kv->n_state_heads = 2;
    kv->state_bytes = 4352;
}

static void test_blocks_and_counts(void **state)
{
    epd_kv_layout_t kv;

    (void)state;
    plan_layout(&kv);
    assert_int_equal(epd_prefill_plan_blocks(&kv, 1), 1);
    assert_int_equal(epd_prefill_plan_blocks(&kv, 16), 1);
    assert_int_equal(epd_prefill_plan_blocks(&kv, 17), 2);
    assert_int_equal(epd_prefill_plan_blocks(&kv, 1024), 64);
    assert_int_equal(epd_prefill_plan_layer_writes(&kv, 0, 5), 1); /* linear */
    assert_int_equal(epd_prefill_plan_layer_writes(&kv, 1, 5), 5); /* attention */
    assert_int_equal(epd_prefill_plan_layer_writes(&kv, 4, 5), 0); /* no such layer */
}

static const uint32_t local_ids[3] = {7, 0, 3};
static const uint32_t remote_ids[3] = {100, 5, 99};

static void places(epd_prefill_place_t *local, epd_prefill_place_t *remote)
{
    *local = (epd_prefill_place_t){.block_ids = local_ids,
                                   .n_blocks = 3,
                                   .state_slot = 2,
                                   .pool_blocks = 8,
                                   .pool_state_slots = 4};
    *remote = (epd_prefill_place_t){.block_ids = remote_ids,
                                    .n_blocks = 3,
                                    .state_slot = 9,
                                    .pool_blocks = 128,
                                    .pool_state_slots = 16};
}

static void test_check_accepts_a_good_reservation(void **state)
{
    epd_prefill_place_t local, remote;
    epd_kv_layout_t kv;
    const char *why = NULL;
    uint64_t bytes;

    (void)state;
    plan_layout(&kv);
    places(&local, &remote);
    bytes = epd_kv_pool_bytes(&kv, 128, 16);
    assert_int_equal(epd_prefill_plan_check(&kv, 3, &remote, bytes, &why), EPD_OK);
    assert_int_equal(epd_prefill_plan_check(&kv, 3, &remote, bytes + 4096, &why), EPD_OK);
}

static void test_check_refuses(void **state)
{
    static const uint32_t outside[3] = {100, 128, 1};
    static const uint32_t twice[3] = {4, 5, 4};
    epd_prefill_place_t local, remote, r;
    epd_kv_layout_t kv;
    const char *why = NULL;
    uint64_t bytes;

    (void)state;
    plan_layout(&kv);
    places(&local, &remote);
    bytes = epd_kv_pool_bytes(&kv, 128, 16);

    /* too few / too many blocks for the prompt */
    assert_int_equal(epd_prefill_plan_check(&kv, 4, &remote, bytes, &why), EPD_ERR_INVALID_PARAM);
    assert_non_null(why);
    assert_int_equal(epd_prefill_plan_check(&kv, 2, &remote, bytes, &why), EPD_ERR_INVALID_PARAM);
    /* a block outside decode's pool */
    r = remote;
    r.block_ids = outside;
    why = NULL;
    assert_int_equal(epd_prefill_plan_check(&kv, 3, &r, bytes, &why), EPD_ERR_OUT_OF_RANGE);
    assert_non_null(strstr(why, "outside"));
    /* a block named twice */
    r = remote;
    r.block_ids = twice;
    assert_int_equal(epd_prefill_plan_check(&kv, 3, &r, bytes, &why), EPD_ERR_INVALID_PARAM);
    /* a slot outside the pool (the layout has linear layers) */
    r = remote;
    r.state_slot = 16;
    assert_int_equal(epd_prefill_plan_check(&kv, 3, &r, bytes, &why), EPD_ERR_OUT_OF_RANGE);
    /* a region smaller than the pool it claims */
    assert_int_equal(epd_prefill_plan_check(&kv, 3, &remote, bytes - 1, &why),
                     EPD_ERR_OUT_OF_RANGE);
    /* an absurd geometry inside a real region: the pool does not fit */
    r = remote;
    r.pool_blocks = UINT32_MAX;
    r.pool_state_slots = UINT32_MAX;
    assert_int_equal(epd_prefill_plan_check(&kv, 3, &r, bytes, &why), EPD_ERR_OUT_OF_RANGE);
    /* a pool whose size overflows 64 bits */
    {
        epd_kv_layout_t big = kv;

        big.block_bytes = 1ull << 40;
        assert_int_equal(epd_prefill_plan_check(&big, 3, &r, UINT64_MAX, &why),
                         EPD_ERR_OUT_OF_RANGE);
        assert_non_null(strstr(why, "overflow"));
    }
    /* no blocks at all in the remote pool */
    r = remote;
    r.pool_blocks = 0;
    assert_int_equal(epd_prefill_plan_check(&kv, 3, &r, bytes, &why), EPD_ERR_OUT_OF_RANGE);
}

/* Every write of every layer: the right offsets, inside both pools, and no
 * two remote writes overlap. */
static void test_writes(void **state)
{
    epd_prefill_place_t local, remote;
    epd_prefill_write_t all[16];
    epd_kv_layout_t kv;
    uint64_t lbytes, rbytes;
    uint32_t n = 0;

    (void)state;
    plan_layout(&kv);
    places(&local, &remote);
    lbytes = epd_kv_pool_bytes(&kv, 8, 4);
    rbytes = epd_kv_pool_bytes(&kv, 128, 16);
    for (uint32_t l = 0; l < kv.n_layers; l++) {
        uint32_t nw = epd_prefill_plan_layer_writes(&kv, l, 3);

        for (uint32_t i = 0; i < nw; i++) {
            epd_prefill_write_t w;
            uint64_t lo, ro;

            assert_int_equal(epd_prefill_plan_write(&kv, &local, &remote, rbytes, l, i, &w),
                             EPD_OK);
            if (kv.kind[l] == EPD_LAYER_LINEAR) {
                assert_int_equal(epd_kv_state_offset(&kv, 8, 4, l, 2, &lo), EPD_OK);
                assert_int_equal(epd_kv_state_offset(&kv, 128, 16, l, 9, &ro), EPD_OK);
                assert_int_equal(w.len, kv.state_bytes);
            } else {
                assert_int_equal(epd_kv_block_offset(&kv, 8, l, local_ids[i], &lo), EPD_OK);
                assert_int_equal(epd_kv_block_offset(&kv, 128, l, remote_ids[i], &ro), EPD_OK);
                assert_int_equal(w.len, kv.block_bytes);
            }
            assert_int_equal(w.local_off, lo);
            assert_int_equal(w.remote_off, ro);
            assert_true(w.local_off + w.len <= lbytes);
            assert_true(w.remote_off + w.len <= rbytes);
            all[n++] = w;
        }
        /* one past the last write of the layer is refused */
        {
            epd_prefill_write_t w;
            assert_int_equal(epd_prefill_plan_write(&kv, &local, &remote, rbytes, l, nw, &w),
                             EPD_ERR_OUT_OF_RANGE);
        }
    }
    assert_int_equal(n, 2 * 1 + 2 * 3);
    for (uint32_t a = 0; a < n; a++) {
        for (uint32_t b = a + 1; b < n; b++) {
            assert_true(all[a].remote_off + all[a].len <= all[b].remote_off ||
                        all[b].remote_off + all[b].len <= all[a].remote_off);
        }
    }
}

static void test_write_refusals(void **state)
{
    static const uint32_t outside[3] = {100, 5, 200};
    epd_prefill_place_t local, remote, r;
    epd_prefill_write_t w;
    epd_kv_layout_t kv;
    uint64_t rbytes;

    (void)state;
    plan_layout(&kv);
    places(&local, &remote);
    rbytes = epd_kv_pool_bytes(&kv, 128, 16);
    /* a region shorter than the write's end */
    assert_int_equal(epd_prefill_plan_write(&kv, &local, &remote, 4096, 1, 0, &w),
                     EPD_ERR_OUT_OF_RANGE);
    /* unchecked block outside the remote pool: still refused per write */
    r = remote;
    r.block_ids = outside;
    assert_int_equal(epd_prefill_plan_write(&kv, &local, &r, rbytes, 1, 2, &w),
                     EPD_ERR_OUT_OF_RANGE);
    /* no such layer */
    assert_int_equal(epd_prefill_plan_write(&kv, &local, &remote, rbytes, 4, 0, &w),
                     EPD_ERR_OUT_OF_RANGE);
    /* a linear layer has one write */
    assert_int_equal(epd_prefill_plan_write(&kv, &local, &remote, rbytes, 0, 1, &w),
                     EPD_ERR_OUT_OF_RANGE);
}

/* An attention-only layout: no slot check (decode reserves no slot). */
static void test_attention_only(void **state)
{
    epd_prefill_place_t local, remote;
    epd_kv_layout_t kv;
    const char *why;

    (void)state;
    plan_layout(&kv);
    for (uint32_t l = 0; l < 4; l++) {
        kv.kind[l] = EPD_LAYER_ATTENTION;
        kv.kind_index[l] = l;
    }
    kv.n_attn_layers = 4;
    kv.n_linear_layers = 0;
    places(&local, &remote);
    remote.state_slot = 12345;
    remote.pool_state_slots = 0;
    assert_int_equal(epd_prefill_plan_check(&kv, 3, &remote, epd_kv_pool_bytes(&kv, 128, 0), &why),
                     EPD_OK);
}

/* Decode's cached head (rule 36): runs start after it, a run it cuts keeps
 * its tail, the others are untouched. */
static void test_runs_skip(void **state)
{
    uint32_t lb[6] = {10, 11, 12, 20, 21, 30};
    uint32_t rb[6] = {5, 6, 7, 8, 9, 40};
    epd_prefill_place_t local = {.block_ids = lb, .n_blocks = 6};
    epd_prefill_place_t remote = {.block_ids = rb, .n_blocks = 6};
    epd_prefill_run_t runs[6];
    uint32_t n;

    (void)state;
    n = epd_prefill_plan_runs(&local, &remote, runs);
    assert_int_equal(n, 3); /* [0,3) [3,5) [5,6) */
    assert_int_equal(epd_prefill_plan_runs_skip(runs, n, 0), 3);
    n = epd_prefill_plan_runs_skip(runs, n, 2);
    assert_int_equal(n, 3);
    assert_int_equal(runs[0].first, 2);
    assert_int_equal(runs[0].n, 1);
    assert_int_equal(runs[1].first, 3);
    assert_int_equal(runs[1].n, 2);
    n = epd_prefill_plan_runs_skip(runs, n, 5); /* only the last block left */
    assert_int_equal(n, 1);
    assert_int_equal(runs[0].first, 5);
    assert_int_equal(runs[0].n, 1);
    assert_int_equal(epd_prefill_plan_runs_skip(runs, n, 6), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blocks_and_counts),
        cmocka_unit_test(test_check_accepts_a_good_reservation),
        cmocka_unit_test(test_check_refuses),
        cmocka_unit_test(test_writes),
        cmocka_unit_test(test_write_refusals),
        cmocka_unit_test(test_attention_only),
        cmocka_unit_test(test_runs_skip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
