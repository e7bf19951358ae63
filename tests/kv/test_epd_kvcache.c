/*
 * Unit tests of the prefix cache's keys and index:
 *   epd_prefix   roots differ by engine, model digest, layout and salt;
 *                a changed token or image changes its block's key and every
 *                later one, never an earlier one; only full blocks; cap;
 *   epd_kvcache  acquire pins the leading cached blocks, a pinned block is
 *                never evicted, release deepest-first evicts chains from
 *                their end, duplicates, lru_find, counts; allocation
 *                failures.
 */
#include "epd_test.h"

#include <string.h>

#include "epd_alloc.h"
#include "epd_kvcache.h"
#include "epd_prefix.h"

static void layout_info(epd_engine_info_t *info, uint32_t bt)
{
    memset(info, 0, sizeof(*info));
    info->kv.n_layers = 3;
    info->kv.kind[0] = EPD_LAYER_LINEAR;
    info->kv.kind[1] = EPD_LAYER_LINEAR;
    info->kv.kind[2] = EPD_LAYER_ATTENTION;
    info->kv.n_attn_layers = 1;
    info->kv.n_linear_layers = 2;
    info->kv.block_tokens = bt;
    info->kv.n_kv_heads = 2;
    info->kv.head_dim = 8;
    info->kv.block_bytes = 2ull * 2 * bt * 8 * 4;
    info->kv.state_bytes = 1000;
    info->model_digest[0] = 1;
}

static int same(const epd_prefix_hash_t *a, const epd_prefix_hash_t *b)
{
    return memcmp(a->b, b->b, EPD_PREFIX_HASH_BYTES) == 0;
}

static void test_roots(void **state)
{
    epd_engine_info_t a, b;
    epd_prefix_hash_t r0, r1;

    (void)state;
    layout_info(&a, 16);
    epd_prefix_root("ref", &a, NULL, 0, &r0);
    epd_prefix_root("ref", &a, NULL, 0, &r1);
    assert_true(same(&r0, &r1));
    epd_prefix_root("sim", &a, NULL, 0, &r1);
    assert_false(same(&r0, &r1));
    epd_prefix_root("ref", &a, "tenant-a", 8, &r1);
    assert_false(same(&r0, &r1));
    epd_prefix_root("ref", &a, "tenant-b", 8, &r0);
    assert_false(same(&r0, &r1));
    epd_prefix_root("ref", &a, NULL, 0, &r0);
    b = a;
    b.model_digest[5] ^= 1;
    epd_prefix_root("ref", &b, NULL, 0, &r1);
    assert_false(same(&r0, &r1));
    layout_info(&b, 32); /* another block size */
    epd_prefix_root("ref", &b, NULL, 0, &r1);
    assert_false(same(&r0, &r1));
    b = a;
    b.kv.kind[1] = EPD_LAYER_ATTENTION; /* another pattern */
    epd_prefix_root("ref", &b, NULL, 0, &r1);
    assert_false(same(&r0, &r1));
}

static void test_chain(void **state)
{
    epd_engine_info_t info;
    epd_prefix_hash_t root, h1[8], h2[8];
    int32_t toks[100];
    unsigned char img1[32], img2[32];
    epd_prefix_media_t m1 = {.pos = 20, .n = 8, .hash = img1};
    epd_prefix_media_t m2 = m1;

    (void)state;
    layout_info(&info, 16);
    epd_prefix_root("ref", &info, NULL, 0, &root);
    for (int i = 0; i < 100; i++) {
        toks[i] = 'a' + i % 26;
    }
    assert_int_equal(epd_prefix_chain(&root, 16, toks, 100, NULL, 0, h1, 8), 6); /* 100 / 16 */
    assert_int_equal(epd_prefix_chain(&root, 16, toks, 100, NULL, 0, h2, 3), 3);  /* cap */
    assert_int_equal(epd_prefix_chain(&root, 16, toks, 15, NULL, 0, h2, 8), 0);   /* no full block */
    /* from the middle: the same keys as the whole chain */
    assert_int_equal(epd_prefix_chain_from(&h1[2], 16, toks, 100, NULL, 0, 3, h2, 8), 3);
    for (int i = 0; i < 3; i++) {
        assert_true(same(&h1[3 + i], &h2[i]));
    }
    assert_int_equal(epd_prefix_chain_from(&h1[5], 16, toks, 100, NULL, 0, 6, h2, 8), 0);
    /* a token of block 2 changes keys 2.. and not 0, 1 */
    toks[40] = 'Z';
    epd_prefix_chain(&root, 16, toks, 100, NULL, 0, h2, 8);
    assert_true(same(&h1[0], &h2[0]));
    assert_true(same(&h1[1], &h2[1]));
    for (int i = 2; i < 6; i++) {
        assert_false(same(&h1[i], &h2[i]));
    }
    toks[40] = 'a' + 40 % 26;
    /* an image over [20, 28) (block 1): the key of block 1 on depends on
     * its content hash and position */
    memset(img1, 1, sizeof(img1));
    memset(img2, 2, sizeof(img2));
    epd_prefix_chain(&root, 16, toks, 100, &m1, 1, h1, 8);
    m2.hash = img2;
    epd_prefix_chain(&root, 16, toks, 100, &m2, 1, h2, 8);
    assert_true(same(&h1[0], &h2[0]));
    for (int i = 1; i < 6; i++) {
        assert_false(same(&h1[i], &h2[i]));
    }
    epd_prefix_chain(&root, 16, toks, 100, &m1, 1, h2, 8);
    for (int i = 0; i < 6; i++) {
        assert_true(same(&h1[i], &h2[i])); /* the same image: the same keys */
    }
    m2 = m1;
    m2.pos = 36; /* the same image elsewhere (block 2) */
    epd_prefix_chain(&root, 16, toks, 100, &m2, 1, h2, 8);
    assert_false(same(&h1[1], &h2[1]));
    /* an image straddling blocks 1 and 2 enters both keys */
    m2 = m1;
    m2.pos = 28;
    epd_prefix_chain(&root, 16, toks, 100, &m2, 1, h2, 8);
    m2.hash = img2;
    epd_prefix_chain(&root, 16, toks, 100, &m2, 1, h1, 8);
    assert_false(same(&h1[1], &h2[1]));
    assert_true(same(&h1[0], &h2[0]));
}

static void keys(epd_prefix_hash_t *h, uint32_t n, unsigned char tag)
{
    for (uint32_t i = 0; i < n; i++) {
        memset(h[i].b, 0, sizeof(h[i].b));
        h[i].b[0] = tag;
        h[i].b[1] = (unsigned char)i;
        h[i].b[9] = 0x5a; /* same bucket bits for some */
    }
}

static void test_cache(void **state)
{
    epd_kvcache_t *c;
    epd_prefix_hash_t a[4], b[4], out;
    uint32_t blocks[4];

    (void)state;
    assert_int_equal(epd_kvcache_create(0, &c), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_kvcache_create(10, &c), EPD_OK);
    keys(a, 4, 'a');
    keys(b, 4, 'b');
    assert_int_equal(epd_kvcache_peek(c, a, 4), 0);
    /* a request computed chain a into blocks 5, 6, 7 and caches them */
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(epd_kvcache_insert(c, &a[i], 5 + i), EPD_OK);
    }
    assert_int_equal(epd_kvcache_insert(c, &a[0], 9), EPD_ERR_EXISTS);
    assert_int_equal(epd_kvcache_insert(c, &b[0], 5), EPD_ERR_INVALID_PARAM); /* cached already */
    assert_int_equal(epd_kvcache_insert(c, &b[0], 10), EPD_ERR_INVALID_PARAM); /* out of range */
    assert_int_equal(epd_kvcache_count(c), 3);
    assert_int_equal(epd_kvcache_evictable(c), 0);
    assert_int_equal(epd_kvcache_evict(c, &out), EPD_KVCACHE_NONE); /* all pinned */
    assert_int_equal(epd_kvcache_peek(c, a, 4), 3);
    assert_int_equal(epd_kvcache_find(c, &a[1]), 6);
    assert_int_equal(epd_kvcache_find(c, &b[1]), EPD_KVCACHE_NONE);
    assert_true(same(epd_kvcache_key(c, 7), &a[2]));
    assert_null(epd_kvcache_key(c, 4));
    /* released deepest first */
    assert_int_equal(epd_kvcache_release(c, 7), 1);
    assert_int_equal(epd_kvcache_release(c, 6), 1);
    assert_int_equal(epd_kvcache_release(c, 5), 1);
    assert_int_equal(epd_kvcache_release(c, 4), 0); /* not cached: the caller's */
    assert_int_equal(epd_kvcache_evictable(c), 3);
    /* a second request pins the first two */
    assert_int_equal(epd_kvcache_acquire(c, a, 4, blocks), 3);
    assert_int_equal(blocks[0], 5);
    assert_int_equal(blocks[2], 7);
    assert_int_equal(epd_kvcache_evictable(c), 0);
    epd_kvcache_release(c, 7);
    /* only the unpinned one goes */
    assert_int_equal(epd_kvcache_evict(c, &out), 7);
    assert_true(same(&out, &a[2]));
    assert_int_equal(epd_kvcache_evict(c, &out), EPD_KVCACHE_NONE);
    assert_int_equal(epd_kvcache_peek(c, a, 4), 2);
    epd_kvcache_release(c, 6);
    epd_kvcache_release(c, 5);
    /* the deeper first, then the root */
    assert_int_equal(epd_kvcache_evict(c, NULL), 6);
    assert_int_equal(epd_kvcache_evict(c, NULL), 5);
    assert_int_equal(epd_kvcache_count(c), 0);
    /* the block may be cached again, under any key */
    assert_int_equal(epd_kvcache_insert(c, &b[0], 5), EPD_OK);
    assert_int_equal(epd_kvcache_find(c, &b[0]), 5);
    epd_kvcache_destroy(c);
    epd_kvcache_destroy(NULL);
}

static int is_odd(void *arg, uint32_t block)
{
    (void)arg;
    return block % 2 == 1;
}

static void test_lru_find_and_failures(void **state)
{
    epd_kvcache_t *c;
    epd_prefix_hash_t a[6];

    (void)state;
    assert_int_equal(epd_kvcache_create(8, &c), EPD_OK);
    keys(a, 6, 'x');
    for (uint32_t i = 0; i < 6; i++) {
        assert_int_equal(epd_kvcache_insert(c, &a[i], i), EPD_OK);
    }
    for (uint32_t i = 0; i < 6; i++) {
        epd_kvcache_release(c, i); /* 0 is the least recent */
    }
    assert_int_equal(epd_kvcache_lru_find(c, is_odd, NULL), 1);
    assert_int_equal(epd_kvcache_evict(c, NULL), 0);
    assert_int_equal(epd_kvcache_lru_find(c, is_odd, NULL), 1);
    epd_kvcache_destroy(c);
    for (int n = 0; n < 3; n++) {
        epd_alloc_fail_after(n);
        assert_int_equal(epd_kvcache_create(8, &c), EPD_ERR_NO_MEMORY);
        epd_alloc_fail_after(-1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roots),
        cmocka_unit_test(test_chain),
        cmocka_unit_test(test_cache),
        cmocka_unit_test(test_lru_find_and_failures),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
