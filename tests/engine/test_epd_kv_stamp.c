/*
 * test_epd_kv_stamp.c — stamped KV units (engine/epd_kv_stamp), on KV the
 * sim engine writes: a stamp round-trips; the sim's device checksum of each
 * layer is what a checker recomputes from the stamps; and the check — on a
 * "decode" pool the KV was copied into, other block ids, as the transport
 * would — passes for the right KV and fails, naming the problem, for every
 * kind of wrong write it exists to catch: misrouted (another request's
 * block), misplaced (blocks swapped, a layer's block in another layer),
 * torn (only part of a write landed), missing (a block never written), for
 * another decode incarnation, a changed checksum.  A body changed while its
 * stamps stayed intact is seen by the full check only (as documented).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_engine.h"
#include "epd_hash.h"
#include "epd_kv_stamp.h"
#include "epd_sim.h"
#include "epd_test_engine_util.h"

#define VOCAB 300
#define BT 4         /* tokens per block */
#define N_TOK 30     /* the prompt: 8 blocks, the last one partly filled */
#define N_BLK 8
#define POOL_BLK 32
#define TAG 0x7a67ull /* the decode incarnation's tag */

static const char TINY_MODEL[] = "name = tiny\n"
                                 "n_layers = 4\n"
                                 "layer_pattern = LA\n"
                                 "hidden = 64\n"
                                 "n_heads = 4\n"
                                 "n_kv_heads = 2\n"
                                 "head_dim = 8\n"
                                 "kv_dtype = F32\n"
                                 "state_bytes = 256\n"
                                 "active_params = 1e6\n"
                                 "total_params = 4e6\n"
                                 "weight_bytes = 1\n"
                                 "vocab = 300\n"
                                 "max_context = 512\n";
static const char FAST_ACCEL[] = "name = fast\nflops = 1e16\nmem_bw = 1e15\nhbm_bytes = 1e9\n";

static const char *tmpdir;

/* A prefill on the "prefill node" (sums asked for, captured by the sink),
 * copied into a "decode node" pool at other block ids and slot. */
typedef struct {
    epd_engine_t *e;
    const epd_kv_layout_t *kv;
    epd_kv_pool_t pp, pd;
    uint32_t tp[N_BLK], td[N_BLK];
    uint32_t slot_p, slot_d;
    uint64_t sums[EPD_KV_MAX_LAYERS];
    int kinds[EPD_KV_MAX_LAYERS];
    epd_hash_state_t *h;
} fix_t;

static fix_t F;

static epd_status_t sink(void *ctx, uint32_t layer, const epd_layer_done_t *d)
{
    fix_t *f = ctx;

    assert_true(d->has_sum);
    f->sums[layer] = d->sum;
    f->kinds[layer] = d->sum_kind;
    return EPD_OK;
}

static void prefill(fix_t *f, const uint32_t *table, uint32_t slot, uint64_t req, uint64_t tag,
                    int32_t salt)
{
    int32_t toks[N_TOK];
    float logits[VOCAB];
    epd_engine_sink_t sk = {.cb = sink, .ctx = f};
    epd_prefill_args_t a = {.seq = {.req_id = req,
                                    .block_table = table,
                                    .n_blocks = N_BLK,
                                    .state_slot = slot,
                                    .stamp_tag = tag},
                            .tokens = toks,
                            .n_tokens = N_TOK,
                            .want_sums = 1};

    for (int i = 0; i < N_TOK; i++) {
        toks[i] = 32 + (i * 7 + salt) % 90;
    }
    assert_int_equal(epd_engine_prefill(f->e, &f->pp, &a, &sk, logits), EPD_OK);
}

/* The transport: layer l's blocks (or state) from the prefill pool to the
 * decode pool, block i of `src` to block i of `dst`. */
static void copy_layer(fix_t *f, uint32_t l, const uint32_t *src, uint32_t sslot)
{
    uint64_t so, dof;

    if (f->kv->kind[l] == EPD_LAYER_LINEAR) {
        assert_int_equal(epd_kv_state_offset(f->kv, POOL_BLK, 4, l, sslot, &so), EPD_OK);
        assert_int_equal(epd_kv_state_offset(f->kv, POOL_BLK, 4, l, f->slot_d, &dof), EPD_OK);
        memcpy((char *)f->pd.base + dof, (char *)f->pp.base + so, f->kv->state_bytes);
        return;
    }
    for (uint32_t i = 0; i < N_BLK; i++) {
        assert_int_equal(epd_kv_block_offset(f->kv, POOL_BLK, l, src[i], &so), EPD_OK);
        assert_int_equal(epd_kv_block_offset(f->kv, POOL_BLK, l, f->td[i], &dof), EPD_OK);
        memcpy((char *)f->pd.base + dof, (char *)f->pp.base + so, f->kv->block_bytes);
    }
}

static unsigned char *dblock(fix_t *f, uint32_t l, uint32_t i)
{
    uint64_t off;

    assert_int_equal(epd_kv_block_offset(f->kv, POOL_BLK, l, f->td[i], &off), EPD_OK);
    return (unsigned char *)f->pd.base + off;
}

/* Checks layer l on the decode pool; returns the status, *why_p the reason. */
static epd_status_t check(fix_t *f, uint32_t l, uint64_t tag, int full, const char **why_p)
{
    epd_kv_stamp_expect_t x = {.req_id = 7, .tag = tag, .n_tokens = N_TOK, .full = full};
    uint64_t bytes = 0;

    *why_p = "";
    return epd_kv_stamp_check_layer(f->kv, &f->pd, f->td, N_BLK, f->slot_d, l, &x, f->sums[l], f->h,
                                    &bytes, why_p);
}

static uint32_t first_attn(const fix_t *f)
{
    for (uint32_t l = 0; l < f->kv->n_layers; l++) {
        if (f->kv->kind[l] == EPD_LAYER_ATTENTION) {
            return l;
        }
    }
    fail_msg("no attention layer");
    return 0;
}

static int setup(void **state)
{
    char model[1024], accel[1024], dir[1024];
    epd_sim_options_t o = {.scale = 1.0, .mode = EPD_SIM_SPIN, .seed = 5};
    epd_engine_config_t cfg = {.block_tokens = BT, .max_batch = 4};

    (void)state;
    memset(&F, 0, sizeof(F));
    tmpdir = epd_test_tmpdir();
    snprintf(model, sizeof(model), "%s", epd_test_path(tmpdir, "tiny.profile"));
    snprintf(accel, sizeof(accel), "%s", epd_test_path(tmpdir, "fast.profile"));
    snprintf(dir, sizeof(dir), "%s", epd_test_path(tmpdir, "sim"));
    epd_test_write_file(model, TINY_MODEL, strlen(TINY_MODEL));
    epd_test_write_file(accel, FAST_ACCEL, strlen(FAST_ACCEL));
    o.model = model;
    o.accel = accel;
    assert_int_equal(epd_sim_conf_write(dir, &o), EPD_OK);
    cfg.model_dir = dir;
    assert_int_equal(epd_engine_open("sim", &cfg, &F.e), EPD_OK);
    F.kv = &epd_engine_info(F.e)->kv;
    epd_test_pool(F.e, POOL_BLK, 4, &F.pp);
    epd_test_pool(F.e, POOL_BLK, 4, &F.pd);
    for (uint32_t i = 0; i < N_BLK; i++) {
        F.tp[i] = 3 + i;              /* prefill's ids */
        F.td[i] = (i * 5 + 11) % 32;  /* decode's: scattered, disjoint from nothing in particular */
    }
    F.slot_p = 1;
    F.slot_d = 3;
    assert_int_equal(epd_hash_state_create(0, &F.h), EPD_OK);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    epd_hash_state_destroy(F.h);
    epd_free(F.pp.base);
    epd_free(F.pd.base);
    epd_engine_close(F.e);
    epd_test_rmtree(tmpdir);
    return 0;
}

/* The right KV, copied: every layer checks out, by its stamps and in full;
 * the device checksum is the stamps' checksum. */
static void transfer_all(void)
{
    prefill(&F, F.tp, F.slot_p, 7, TAG, 0);
    for (uint32_t l = 0; l < F.kv->n_layers; l++) {
        copy_layer(&F, l, F.tp, F.slot_p);
    }
}

static void test_stamp_round_trip(void **state)
{
    unsigned char unit[256];
    epd_kv_stamp_t in = {.req_id = 42, .tag = 9, .hk = 0x1234, .body = 77, .layer = 3,
                         .index = 5, .count = 16};
    epd_kv_stamp_t out;

    (void)state;
    memset(unit, 0xab, sizeof(unit));
    epd_kv_stamp_put(unit, sizeof(unit), &in);
    assert_int_equal(epd_kv_stamp_get(unit, sizeof(unit), &out), EPD_OK);
    assert_true(out.req_id == 42 && out.tag == 9 && out.hk == 0x1234 && out.body == 77 &&
                out.layer == 3 && out.index == 5 && out.count == 16);
    assert_int_equal(epd_kv_stamp_body_field(unit, sizeof(unit)), 77);
    /* any field of either half changed: the halves disagree */
    for (size_t i = 0; i < 32; i++) {
        unit[i] ^= 1;
        assert_int_equal(epd_kv_stamp_get(unit, sizeof(unit), &out), EPD_ERR_CORRUPT);
        unit[i] ^= 1;
        unit[sizeof(unit) - 32 + i] ^= 1;
        assert_int_equal(epd_kv_stamp_get(unit, sizeof(unit), &out), EPD_ERR_CORRUPT);
        unit[sizeof(unit) - 32 + i] ^= 1;
    }
    /* the tags of two incarnations differ, no epoch gives 0 */
    assert_true(epd_kv_stamp_tag(100, 1) != epd_kv_stamp_tag(100, 2));
    assert_true(epd_kv_stamp_tag(0, 0) == 0);
}

static void test_right_kv_checks_out(void **state)
{
    const char *why;

    (void)state;
    transfer_all();
    for (uint32_t l = 0; l < F.kv->n_layers; l++) {
        assert_int_equal(F.kinds[l], EPD_KV_SUM_STAMPED);
        if (check(&F, l, TAG, 0, &why) != EPD_OK || check(&F, l, TAG, 1, &why) != EPD_OK) {
            fail_msg("layer %u: %s", l, why);
        }
    }
}

static void test_misrouted(void **state)
{
    uint32_t other[N_BLK];
    uint32_t l = first_attn(&F);
    const char *why;

    (void)state;
    /* another request's block landed where block 2 of ours belongs */
    for (uint32_t i = 0; i < N_BLK; i++) {
        other[i] = 20 + i;
    }
    prefill(&F, other, 2, 8, TAG, 3);
    transfer_all();
    {
        uint64_t so;

        assert_int_equal(epd_kv_block_offset(F.kv, POOL_BLK, l, other[2], &so), EPD_OK);
        memcpy(dblock(&F, l, 2), (char *)F.pp.base + so, F.kv->block_bytes);
    }
    assert_int_equal(check(&F, l, TAG, 0, &why), EPD_ERR_CORRUPT);
    assert_non_null(strstr(why, "another request"));
}

static void test_misplaced(void **state)
{
    uint32_t swapped[N_BLK];
    uint32_t l = first_attn(&F);
    const char *why;

    (void)state;
    /* blocks 1 and 4 written to each other's place */
    transfer_all();
    memcpy(swapped, F.tp, sizeof(swapped));
    swapped[1] = F.tp[4];
    swapped[4] = F.tp[1];
    copy_layer(&F, l, swapped, F.slot_p);
    assert_int_equal(check(&F, l, TAG, 0, &why), EPD_ERR_CORRUPT);
    assert_non_null(strstr(why, "misplaced"));
    /* a whole layer's blocks written into the next attention layer */
    transfer_all();
    for (uint32_t m = l + 1; m < F.kv->n_layers; m++) {
        if (F.kv->kind[m] == EPD_LAYER_ATTENTION) {
            for (uint32_t i = 0; i < N_BLK; i++) {
                memcpy(dblock(&F, m, i), dblock(&F, l, i), F.kv->block_bytes);
            }
            assert_int_equal(check(&F, m, TAG, 0, &why), EPD_ERR_CORRUPT);
            assert_non_null(strstr(why, "misplaced"));
            break;
        }
    }
}

static void test_torn_and_missing(void **state)
{
    uint32_t l = first_attn(&F);
    unsigned char *stale;
    const char *why;

    (void)state;
    /* an earlier request's KV in the decode pool... */
    prefill(&F, F.tp, F.slot_p, 6, TAG, 9);
    for (uint32_t m = 0; m < F.kv->n_layers; m++) {
        copy_layer(&F, m, F.tp, F.slot_p);
    }
    stale = malloc(F.kv->block_bytes);
    assert_non_null(stale);
    memcpy(stale, dblock(&F, l, 3), F.kv->block_bytes);
    /* ...then ours, of which block 3 landed only in part (the first half
     * is ours, the rest still the earlier request's) */
    transfer_all();
    memcpy(dblock(&F, l, 3) + F.kv->block_bytes / 2, stale + F.kv->block_bytes / 2,
           F.kv->block_bytes / 2);
    assert_int_equal(check(&F, l, TAG, 0, &why), EPD_ERR_CORRUPT);
    assert_non_null(strstr(why, "torn"));
    /* ...and the other way round: the write's end landed, its start not */
    transfer_all();
    memcpy(dblock(&F, l, 3), stale, F.kv->block_bytes / 2);
    assert_int_equal(check(&F, l, TAG, 0, &why), EPD_ERR_CORRUPT);
    assert_non_null(strstr(why, "torn"));
    /* a block never written: the earlier request's, whole */
    transfer_all();
    memcpy(dblock(&F, l, 5), stale, F.kv->block_bytes);
    assert_int_equal(check(&F, l, TAG, 0, &why), EPD_ERR_CORRUPT);
    /* (block 5 of the earlier request: it names that request, and it is
     * not even the block it claims to be) */
    assert_true(strstr(why, "another request") != NULL || strstr(why, "misplaced") != NULL);
    /* nothing ever written there: zeros */
    transfer_all();
    memset(dblock(&F, l, 0), 0, F.kv->block_bytes);
    assert_int_equal(check(&F, l, TAG, 0, &why), EPD_ERR_CORRUPT);
    assert_non_null(strstr(why, "torn or missing"));
    free(stale);
}

static void test_state_slot(void **state)
{
    uint32_t lin = 0;
    const char *why;
    uint64_t off;

    (void)state;
    while (F.kv->kind[lin] != EPD_LAYER_LINEAR) {
        lin++;
    }
    transfer_all();
    assert_int_equal(check(&F, lin, TAG, 0, &why), EPD_OK);
    /* another request's state in our slot */
    prefill(&F, F.tp, 2, 9, TAG, 1);
    copy_layer(&F, lin, F.tp, 2);
    assert_int_equal(check(&F, lin, TAG, 0, &why), EPD_ERR_CORRUPT);
    assert_non_null(strstr(why, "another request"));
    /* a torn state: its tail from elsewhere */
    transfer_all();
    assert_int_equal(epd_kv_state_offset(F.kv, POOL_BLK, 4, lin, F.slot_d, &off), EPD_OK);
    memset((char *)F.pd.base + off + F.kv->state_bytes - 8, 0x5a, 8);
    assert_int_equal(check(&F, lin, TAG, 0, &why), EPD_ERR_CORRUPT);
}

static void test_other_incarnation_and_sum(void **state)
{
    uint32_t l = first_attn(&F);
    const char *why;

    (void)state;
    /* KV stamped for another decode incarnation */
    prefill(&F, F.tp, F.slot_p, 7, TAG + 1, 0);
    for (uint32_t m = 0; m < F.kv->n_layers; m++) {
        copy_layer(&F, m, F.tp, F.slot_p);
    }
    assert_int_equal(check(&F, l, TAG, 0, &why), EPD_ERR_CORRUPT);
    assert_non_null(strstr(why, "incarnation"));
    /* the right KV against another checksum */
    transfer_all();
    F.sums[l] ^= 1;
    assert_int_equal(check(&F, l, TAG, 0, &why), EPD_ERR_CORRUPT);
    assert_non_null(strstr(why, "checksum"));
    F.sums[l] ^= 1;
    /* another number of tokens than the stamps say (a shorter prompt's KV) */
    {
        epd_kv_stamp_expect_t x = {.req_id = 7, .tag = TAG, .n_tokens = N_TOK - 1};

        assert_int_equal(epd_kv_stamp_check_layer(F.kv, &F.pd, F.td, N_BLK, F.slot_d, l, &x,
                                                  F.sums[l], F.h, NULL, &why),
                         EPD_ERR_CORRUPT);
    }
}

static void test_body_needs_full(void **state)
{
    uint32_t l = first_attn(&F);
    const char *why;

    (void)state;
    transfer_all();
    /* one byte of a body flipped, both stamps intact: by design only the
     * full check (every body against its digest) sees it */
    dblock(&F, l, 6)[F.kv->block_bytes / 2] ^= 0x10;
    assert_int_equal(check(&F, l, TAG, 0, &why), EPD_OK);
    assert_int_equal(check(&F, l, TAG, 1, &why), EPD_ERR_CORRUPT);
    assert_non_null(strstr(why, "body"));
}

/* A chunked run's checks: blocks [0, k) then [k, N) on one running state
 * give the whole layer's STAMPED checksum — the engine's, and what a writer
 * gets from epd_kv_stamp_hash_unit over the blocks' stamps — and a block of
 * the second range written into another's place fails that range. */
static void test_blocks_in_ranges(void **state)
{
    epd_kv_stamp_expect_t x = {.req_id = 7, .tag = TAG, .n_tokens = N_TOK};
    uint32_t l = first_attn(&F);
    uint32_t k = N_BLK / 2;
    uint64_t bytes = 0, part;
    const char *why = "";
    epd_hash_state_t *w;

    (void)state;
    transfer_all();
    /* the writer's side: the stamps of blocks [0, k), then of the rest */
    assert_int_equal(epd_hash_state_create(0, &w), EPD_OK);
    for (uint32_t i = 0; i < k; i++) {
        epd_kv_stamp_hash_unit(w, dblock(&F, l, i), F.kv->block_bytes);
    }
    part = epd_hash_state_digest(w);
    for (uint32_t i = k; i < N_BLK; i++) {
        epd_kv_stamp_hash_unit(w, dblock(&F, l, i), F.kv->block_bytes);
    }
    assert_true(epd_hash_state_digest(w) == F.sums[l]); /* the engine's own */
    epd_hash_state_destroy(w);
    /* the checker's: two ranges, one running state */
    epd_hash_state_reset(F.h, 0);
    assert_int_equal(epd_kv_stamp_check_blocks(F.kv, &F.pd, F.td, 0, k, l, &x, part, F.h, &bytes,
                                               &why),
                     EPD_OK);
    assert_true(bytes == (uint64_t)k * F.kv->block_bytes);
    assert_int_equal(epd_kv_stamp_check_blocks(F.kv, &F.pd, F.td, k, N_BLK, l, &x, F.sums[l], F.h,
                                               &bytes, &why),
                     EPD_OK);
    /* the first range's sum for both: the second range's check fails */
    epd_hash_state_reset(F.h, 0);
    assert_int_equal(epd_kv_stamp_check_blocks(F.kv, &F.pd, F.td, 0, k, l, &x, part, F.h, &bytes,
                                               &why),
                     EPD_OK);
    assert_int_equal(epd_kv_stamp_check_blocks(F.kv, &F.pd, F.td, k, N_BLK, l, &x, part, F.h,
                                               &bytes, &why),
                     EPD_ERR_CORRUPT);
    assert_non_null(strstr(why, "checksum mismatch"));
    /* block k+1 holds block k's KV: misplaced, caught in the second range */
    memcpy(dblock(&F, l, k + 1), dblock(&F, l, k), F.kv->block_bytes);
    epd_hash_state_reset(F.h, 0);
    assert_int_equal(epd_kv_stamp_check_blocks(F.kv, &F.pd, F.td, 0, k, l, &x, part, F.h, &bytes,
                                               &why),
                     EPD_OK);
    assert_int_equal(epd_kv_stamp_check_blocks(F.kv, &F.pd, F.td, k, N_BLK, l, &x, F.sums[l], F.h,
                                               &bytes, &why),
                     EPD_ERR_CORRUPT);
    assert_non_null(strstr(why, "misplaced"));
}

static void test_bad_arguments(void **state)
{
    epd_kv_stamp_expect_t x = {.req_id = 7, .tag = TAG, .n_tokens = N_TOK};
    uint32_t outside[1] = {POOL_BLK};
    const char *why;

    (void)state;
    transfer_all();
    assert_int_equal(epd_kv_stamp_check_layer(F.kv, &F.pd, F.td, N_BLK, F.slot_d, F.kv->n_layers,
                                              &x, 0, F.h, NULL, &why),
                     EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_kv_stamp_check_layer(F.kv, &F.pd, outside, 1, F.slot_d, first_attn(&F),
                                              &x, 0, F.h, NULL, &why),
                     EPD_ERR_INVALID_PARAM);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stamp_round_trip),
        cmocka_unit_test(test_right_kv_checks_out),
        cmocka_unit_test(test_misrouted),
        cmocka_unit_test(test_misplaced),
        cmocka_unit_test(test_torn_and_missing),
        cmocka_unit_test(test_state_slot),
        cmocka_unit_test(test_other_incarnation_and_sum),
        cmocka_unit_test(test_body_needs_full),
        cmocka_unit_test(test_blocks_in_ranges),
        cmocka_unit_test(test_bad_arguments),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
