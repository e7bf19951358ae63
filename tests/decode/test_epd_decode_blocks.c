/*
 * Unit tests of decode/epd_decode_blocks.c: the block/slot lifecycle.
 * Exhaustion refuses cleanly, quarantined blocks are not reusable until
 * released, the free count returns to full after a random storm of
 * transitions, and double frees / foreign or duplicate / out-of-range
 * blocks are refused without changing anything.
 */
#include "epd_test.h"

#include <string.h>

#include "epd_decode_blocks.h"
#include "epd_rng.h"

static void check_counts(const epd_decode_blocks_t *b)
{
    uint32_t sum = 0;
    uint32_t ssum = 0;

    for (int s = 0; s < EPD_DECODE_BLK_NSTATES; s++) {
        sum += epd_decode_blocks_count(b, (epd_decode_blk_state_t)s);
        ssum += epd_decode_blocks_slots_count(b, (epd_decode_blk_state_t)s);
    }
    assert_int_equal(sum, epd_decode_blocks_total(b));
    assert_int_equal(ssum, epd_decode_blocks_slots_total(b));
    assert_int_equal(epd_decode_blocks_count(b, EPD_DECODE_BLK_FREE), epd_decode_blocks_free(b));
}

static void test_exhaustion_refuses_cleanly(void **state)
{
    epd_decode_blocks_t *b;
    uint32_t ids1[6], ids2[5], slot1, slot2, slot3;

    (void)state;
    assert_int_equal(epd_decode_blocks_create(10, 2, &b), EPD_OK);
    assert_int_equal(epd_decode_blocks_reserve(b, 1, 6, 1, ids1, &slot1), EPD_OK);
    assert_int_not_equal(slot1, EPD_DECODE_NO_SLOT);
    assert_int_equal(epd_decode_blocks_free(b), 4);
    /* 5 > 4 free: refused, nothing taken */
    slot2 = 12345;
    assert_int_equal(epd_decode_blocks_reserve(b, 2, 5, 1, ids2, &slot2), EPD_ERR_NO_CAPACITY);
    assert_int_equal(slot2, 12345);
    assert_int_equal(epd_decode_blocks_free(b), 4);
    assert_int_equal(epd_decode_blocks_slots_free(b), 1);
    check_counts(b);
    assert_int_equal(epd_decode_blocks_reserve(b, 2, 4, 1, ids2, &slot2), EPD_OK);
    assert_int_not_equal(slot1, slot2);
    assert_int_equal(epd_decode_blocks_free(b), 0);
    assert_int_equal(epd_decode_blocks_reserve(b, 3, 1, 0, ids2 + 4, &slot3), EPD_ERR_NO_CAPACITY);
    /* every block handed out once, owned by its request */
    for (int i = 0; i < 6; i++) {
        assert_int_equal(epd_decode_blocks_state(b, ids1[i]), EPD_DECODE_BLK_RESERVED);
        assert_int_equal(epd_decode_blocks_owner(b, ids1[i]), 1);
        for (int j = 0; j < 4; j++) {
            assert_int_not_equal(ids1[i], ids2[j]);
        }
    }
    /* argument refusals */
    assert_int_equal(epd_decode_blocks_reserve(b, 0, 1, 0, ids2, &slot3), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_decode_blocks_reserve(b, 3, 0, 0, ids2, &slot3), EPD_ERR_INVALID_PARAM);
    check_counts(b);
    epd_decode_blocks_destroy(b);
}

static void test_slot_exhaustion(void **state)
{
    epd_decode_blocks_t *b;
    uint32_t ids[2], slot, slot2;

    (void)state;
    assert_int_equal(epd_decode_blocks_create(10, 1, &b), EPD_OK);
    assert_int_equal(epd_decode_blocks_reserve(b, 1, 2, 1, ids, &slot), EPD_OK);
    assert_int_equal(epd_decode_blocks_reserve(b, 2, 2, 1, ids, &slot2), EPD_ERR_NO_CAPACITY);
    assert_int_equal(epd_decode_blocks_free(b), 8);
    /* without a slot (model without linear layers) blocks alone suffice */
    assert_int_equal(epd_decode_blocks_reserve(b, 2, 2, 0, ids, &slot2), EPD_OK);
    assert_int_equal(slot2, EPD_DECODE_NO_SLOT);
    check_counts(b);
    epd_decode_blocks_destroy(b);
    assert_int_equal(epd_decode_blocks_create(0, 1, &b), EPD_ERR_INVALID_PARAM);
}

static void test_quarantine_not_reusable(void **state)
{
    epd_decode_blocks_t *b;
    uint32_t ids[8], other[1], slot, s2;

    (void)state;
    assert_int_equal(epd_decode_blocks_create(8, 1, &b), EPD_OK);
    assert_int_equal(epd_decode_blocks_reserve(b, 7, 8, 1, ids, &slot), EPD_OK);
    /* aborted while P may still write */
    assert_int_equal(epd_decode_blocks_quarantine(b, 7, ids, 8, slot), EPD_OK);
    assert_int_equal(epd_decode_blocks_count(b, EPD_DECODE_BLK_QUARANTINED), 8);
    assert_int_equal(epd_decode_blocks_slots_count(b, EPD_DECODE_BLK_QUARANTINED), 1);
    assert_int_equal(epd_decode_blocks_free(b), 0);
    assert_int_equal(epd_decode_blocks_reserve(b, 8, 1, 0, other, &s2), EPD_ERR_NO_CAPACITY);
    /* quarantine is not ACTIVE: retire/activate/unreserve refuse it */
    assert_int_equal(epd_decode_blocks_retire(b, 7, ids, 8, slot), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_decode_blocks_activate(b, 7, ids, 8, slot), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_decode_blocks_unreserve(b, 7, ids, 8, slot), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_decode_blocks_count(b, EPD_DECODE_BLK_QUARANTINED), 8);
    /* P quiesced: free again */
    assert_int_equal(epd_decode_blocks_release(b, 7, ids, 8, slot), EPD_OK);
    assert_int_equal(epd_decode_blocks_free(b), 8);
    assert_int_equal(epd_decode_blocks_slots_free(b), 1);
    assert_int_equal(epd_decode_blocks_reserve(b, 8, 1, 1, other, &s2), EPD_OK);
    check_counts(b);
    epd_decode_blocks_destroy(b);
}

/* Decode-side reuse: a finished request's prompt blocks become CACHED
 * (nobody owns them, nobody may take them), a later request owns only
 * its other blocks, and only an eviction frees them. */
static void test_cached_blocks(void **state)
{
    epd_decode_blocks_t *b;
    uint32_t ids[6], more[3], slot, s2;

    (void)state;
    assert_int_equal(epd_decode_blocks_create(8, 2, &b), EPD_OK);
    assert_int_equal(epd_decode_blocks_reserve(b, 7, 6, 1, ids, &slot), EPD_OK);
    /* only ACTIVE blocks of the owner can be kept */
    assert_int_equal(epd_decode_blocks_cache(b, 7, ids, 4), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_decode_blocks_activate(b, 7, ids, 6, slot), EPD_OK);
    assert_int_equal(epd_decode_blocks_cache(b, 8, ids, 4), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_decode_blocks_cache(b, 7, ids, 4), EPD_OK);
    assert_int_equal(epd_decode_blocks_count(b, EPD_DECODE_BLK_CACHED), 4);
    assert_int_equal(epd_decode_blocks_state(b, ids[0]), EPD_DECODE_BLK_CACHED);
    assert_int_equal(epd_decode_blocks_owner(b, ids[0]), 0);
    /* the request retires what it still owns; the cached ones stay */
    assert_int_equal(epd_decode_blocks_retire(b, 7, ids, 6, slot), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_decode_blocks_retire(b, 7, ids + 4, 2, slot), EPD_OK);
    assert_int_equal(epd_decode_blocks_free(b), 4);
    assert_int_equal(epd_decode_blocks_reserve(b, 9, 5, 0, more, &s2), EPD_ERR_NO_CAPACITY);
    /* cached blocks are not anybody's to quarantine, retire or release */
    assert_int_equal(epd_decode_blocks_retire(b, 7, ids, 1, EPD_DECODE_NO_SLOT),
                     EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_decode_blocks_quarantine(b, 7, ids, 1, EPD_DECODE_NO_SLOT),
                     EPD_ERR_INVALID_PARAM);
    /* eviction: free again, and only once */
    assert_int_equal(epd_decode_blocks_uncache(b, ids, 2), EPD_OK);
    assert_int_equal(epd_decode_blocks_uncache(b, ids, 1), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_decode_blocks_uncache(b, ids + 4, 1), EPD_ERR_INVALID_PARAM); /* FREE */
    assert_int_equal(epd_decode_blocks_free(b), 6);
    assert_int_equal(epd_decode_blocks_count(b, EPD_DECODE_BLK_CACHED), 2);
    assert_int_equal(epd_decode_blocks_uncache(b, ids + 2, 2), EPD_OK);
    assert_int_equal(epd_decode_blocks_free(b), 8);
    assert_string_equal(epd_decode_blk_state_name(EPD_DECODE_BLK_CACHED), "CACHED");
    epd_decode_blocks_destroy(b);
}

static void test_double_free_and_foreign_blocks(void **state)
{
    epd_decode_blocks_t *b;
    uint32_t a[3], c[3], slot_a, slot_c;
    uint32_t mixed[3];
    uint32_t dup[2];
    uint32_t out[1] = {99};

    (void)state;
    assert_int_equal(epd_decode_blocks_create(8, 2, &b), EPD_OK);
    assert_int_equal(epd_decode_blocks_reserve(b, 1, 3, 1, a, &slot_a), EPD_OK);
    assert_int_equal(epd_decode_blocks_reserve(b, 2, 3, 1, c, &slot_c), EPD_OK);

    /* foreign owner: refused, nothing changes */
    assert_int_equal(epd_decode_blocks_activate(b, 2, a, 3, slot_a), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_decode_blocks_state(b, a[0]), EPD_DECODE_BLK_RESERVED);
    /* a mixed set (one block of another request): all-or-nothing */
    mixed[0] = a[0];
    mixed[1] = a[1];
    mixed[2] = c[0];
    assert_int_equal(epd_decode_blocks_activate(b, 1, mixed, 3, EPD_DECODE_NO_SLOT),
                     EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_decode_blocks_state(b, a[0]), EPD_DECODE_BLK_RESERVED);
    assert_int_equal(epd_decode_blocks_state(b, a[1]), EPD_DECODE_BLK_RESERVED);
    /* the right blocks with someone else's slot */
    assert_int_equal(epd_decode_blocks_activate(b, 1, a, 3, slot_c), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_decode_blocks_state(b, a[2]), EPD_DECODE_BLK_RESERVED);
    /* a block named twice */
    dup[0] = a[0];
    dup[1] = a[0];
    assert_int_equal(epd_decode_blocks_activate(b, 1, dup, 2, EPD_DECODE_NO_SLOT),
                     EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_decode_blocks_state(b, a[0]), EPD_DECODE_BLK_RESERVED);
    /* outside the pool */
    assert_int_equal(epd_decode_blocks_release(b, 1, out, 1, EPD_DECODE_NO_SLOT),
                     EPD_ERR_INVALID_PARAM);
    /* a free block */
    out[0] = 7;
    assert_int_equal(epd_decode_blocks_state(b, 7), EPD_DECODE_BLK_FREE);
    assert_int_equal(epd_decode_blocks_retire(b, 1, out, 1, EPD_DECODE_NO_SLOT),
                     EPD_ERR_INVALID_PARAM);

    /* normal life, then a double free */
    assert_int_equal(epd_decode_blocks_activate(b, 1, a, 3, slot_a), EPD_OK);
    assert_int_equal(epd_decode_blocks_retire(b, 1, a, 3, slot_a), EPD_OK);
    assert_int_equal(epd_decode_blocks_retire(b, 1, a, 3, slot_a), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_decode_blocks_release(b, 1, a, 3, slot_a), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_decode_blocks_free(b), 5);
    assert_int_equal(epd_decode_blocks_slots_free(b), 1);
    /* the other request is untouched */
    for (int i = 0; i < 3; i++) {
        assert_int_equal(epd_decode_blocks_state(b, c[i]), EPD_DECODE_BLK_RESERVED);
        assert_int_equal(epd_decode_blocks_owner(b, c[i]), 2);
    }
    assert_int_equal(epd_decode_blocks_quarantine(b, 2, c, 3, slot_c), EPD_OK);
    assert_int_equal(epd_decode_blocks_quarantine(b, 2, c, 3, slot_c), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_decode_blocks_release(b, 2, c, 3, slot_c), EPD_OK);
    assert_int_equal(epd_decode_blocks_free(b), 8);
    assert_int_equal(epd_decode_blocks_slots_free(b), 2);
    check_counts(b);
    epd_decode_blocks_destroy(b);
}

#define STORM_REQS 64
#define STORM_STEPS 20000

typedef struct {
    uint64_t owner;
    int stage; /* 0 none, 1 reserved, 2 active, 3 quarantined */
    uint32_t n;
    uint32_t ids[16];
    uint32_t slot;
} storm_req_t;

/* Random reserve / activate / retire / quarantine / release / unreserve:
 * no block is ever owned twice and everything returns to FREE. */
static void test_storm_returns_to_full(void **state)
{
    static storm_req_t reqs[STORM_REQS];
    epd_decode_blocks_t *b;
    uint64_t next_owner = 1;
    epd_rng_t rng;

    (void)state;
    memset(reqs, 0, sizeof(reqs));
    epd_rng_seed(&rng, 42);
    assert_int_equal(epd_decode_blocks_create(200, 16, &b), EPD_OK);
    for (int step = 0; step < STORM_STEPS; step++) {
        storm_req_t *r = &reqs[epd_rng_next(&rng) % STORM_REQS];
        unsigned pick = (unsigned)(epd_rng_next(&rng) % 2);
        epd_status_t st;

        switch (r->stage) {
        case 0:
            r->n = 1 + (uint32_t)(epd_rng_next(&rng) % 16);
            r->owner = next_owner++;
            st = epd_decode_blocks_reserve(b, r->owner, r->n, (int)pick, r->ids, &r->slot);
            if (st == EPD_OK) {
                for (uint32_t i = 0; i < r->n; i++) {
                    assert_int_equal(epd_decode_blocks_owner(b, r->ids[i]), r->owner);
                }
                r->stage = 1;
            } else {
                assert_int_equal(st, EPD_ERR_NO_CAPACITY);
            }
            break;
        case 1:
            if (pick) {
                assert_int_equal(epd_decode_blocks_activate(b, r->owner, r->ids, r->n, r->slot),
                                 EPD_OK);
                r->stage = 2;
            } else if (epd_rng_next(&rng) % 4 == 0) {
                assert_int_equal(epd_decode_blocks_unreserve(b, r->owner, r->ids, r->n, r->slot),
                                 EPD_OK);
                r->stage = 0;
            } else {
                assert_int_equal(epd_decode_blocks_quarantine(b, r->owner, r->ids, r->n, r->slot),
                                 EPD_OK);
                r->stage = 3;
            }
            break;
        case 2:
            if (pick) {
                assert_int_equal(epd_decode_blocks_retire(b, r->owner, r->ids, r->n, r->slot),
                                 EPD_OK);
                r->stage = 0;
            } else {
                assert_int_equal(epd_decode_blocks_quarantine(b, r->owner, r->ids, r->n, r->slot),
                                 EPD_OK);
                r->stage = 3;
            }
            break;
        case 3:
            assert_int_equal(epd_decode_blocks_release(b, r->owner, r->ids, r->n, r->slot), EPD_OK);
            r->stage = 0;
            break;
        }
        if (step % 1000 == 0) {
            check_counts(b);
        }
    }
    /* finish everyone */
    for (int i = 0; i < STORM_REQS; i++) {
        storm_req_t *r = &reqs[i];

        if (r->stage == 1 || r->stage == 2) {
            assert_int_equal(epd_decode_blocks_quarantine(b, r->owner, r->ids, r->n, r->slot),
                             EPD_OK);
            r->stage = 3;
        }
        if (r->stage == 3) {
            assert_int_equal(epd_decode_blocks_release(b, r->owner, r->ids, r->n, r->slot), EPD_OK);
        }
    }
    assert_int_equal(epd_decode_blocks_free(b), 200);
    assert_int_equal(epd_decode_blocks_slots_free(b), 16);
    check_counts(b);
    for (uint32_t i = 0; i < 200; i++) {
        assert_int_equal(epd_decode_blocks_owner(b, i), 0);
    }
    epd_decode_blocks_destroy(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exhaustion_refuses_cleanly),
        cmocka_unit_test(test_slot_exhaustion),
        cmocka_unit_test(test_quarantine_not_reusable),
        cmocka_unit_test(test_double_free_and_foreign_blocks),
        cmocka_unit_test(test_cached_blocks),
        cmocka_unit_test(test_storm_returns_to_full),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
