/*
 * Unit tests of the prefix cache's host and disk tier (kv/epd_kvtier.c):
 * round trips bit for bit with and without the byte-plane shuffle; the host
 * tier's LRU bound and its spill to disk, the disk bound; a flipped payload
 * byte in a file fails the checksum (the entry and file gone, never handed
 * out); truncated, bad-magic and foreign files refused at lookup and at the
 * persist scan (ours deleted, foreign ones left); a persistent rescan finds
 * our files, the host tier written out at exit; a run without persist
 * removes ours; bad configurations.
 */
#include "epd_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "epd_alloc.h"
#include "epd_kvtier.h"

#define PAYLOAD 4096

static char g_dir[512];

static void make_dir(const char *tag, char *out, size_t cap)
{
    const char *tmp = getenv("TMPDIR");

    snprintf(out, cap, "%s/kvtier-%s-XXXXXX", tmp != NULL ? tmp : "/tmp", tag);
    assert_non_null(mkdtemp(out));
}

static void rm_dir(const char *dir)
{
    char cmd[1100];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void key_of(epd_prefix_hash_t *k, int i)
{
    memset(k, 0, sizeof(*k));
    for (int j = 0; j < 32; j++) {
        k->b[j] = (unsigned char)(i * 37 + j * 11 + 1);
    }
}

/* KV-like bytes: floats of a smooth function, so zstd has something to find */
static void payload_of(unsigned char *p, size_t len, int i)
{
    int32_t tag = i;

    for (size_t j = 0; j + 4 <= len; j += 4) {
        float f = (float)(0.001 * (double)(j % 512) - 0.25);

        memcpy(p + j, &f, 4);
    }
    for (size_t j = len / 4 * 4; j < len; j++) {
        p[j] = (unsigned char)(i + j);
    }
    memcpy(p, &tag, sizeof(tag)); /* every i compresses to about the same size */
}

static epd_kvtier_config_t config(uint64_t host, const char *dir, uint64_t disk, int persist,
                                  int ns_byte)
{
    epd_kvtier_config_t c;

    memset(&c, 0, sizeof(c));
    memset(c.ns.b, ns_byte, sizeof(c.ns.b));
    c.host_bytes = host;
    c.disk_dir = dir;
    c.disk_bytes = disk;
    c.persist = persist;
    c.level = 3;
    c.shuffle = 4;
    c.log_comp = "test";
    return c;
}

static void file_of(const char *dir, int i, char *out, size_t cap)
{
    epd_prefix_hash_t k;
    char name[65];

    key_of(&k, i);
    epd_kvtier_file_name(&k, name);
    snprintf(out, cap, "%s/%s", dir, name);
}

static int exists(const char *path)
{
    struct stat sb;

    return stat(path, &sb) == 0;
}

/* Checks key i restores to payload i (len, with ckpt_len). */
static void check_get(epd_kvtier_t *t, int i, size_t len, size_t ckpt_len)
{
    unsigned char want[PAYLOAD], got[PAYLOAD];
    epd_prefix_hash_t k;
    size_t l = 0, cl = 0;

    key_of(&k, i);
    payload_of(want, len, i);
    memset(got, 0xee, sizeof(got));
    assert_int_equal(epd_kvtier_get(t, &k, got, sizeof(got), &l, &cl), EPD_OK);
    assert_int_equal(l, len);
    assert_int_equal(cl, ckpt_len);
    assert_memory_equal(got, want, len);
}

static void put(epd_kvtier_t *t, int i, size_t len, size_t ckpt_len)
{
    unsigned char p[PAYLOAD];
    epd_prefix_hash_t k;

    key_of(&k, i);
    payload_of(p, len, i);
    assert_int_equal(epd_kvtier_put(t, &k, p, len, ckpt_len), EPD_OK);
}

static void test_shuffle_round_trip(void **state)
{
    unsigned char a[1003], b[1003], c[1003];
    uint32_t widths[] = {0, 1, 2, 4, 8};

    (void)state;
    payload_of(a, sizeof(a), 5);
    for (size_t w = 0; w < sizeof(widths) / sizeof(widths[0]); w++) {
        epd_kvtier_shuffle(a, b, sizeof(a), widths[w]);
        if (widths[w] == 2) {
            /* all first bytes, then all second bytes; the odd tail as is */
            assert_int_equal(b[0], a[0]);
            assert_int_equal(b[1], a[2]);
            assert_int_equal(b[501], a[1]);
            assert_int_equal(b[1002], a[1002]);
        }
        epd_kvtier_unshuffle(b, c, sizeof(a), widths[w]);
        assert_memory_equal(a, c, sizeof(a));
    }
    /* through the tier, each shuffle, with and without a checkpoint */
    for (size_t w = 0; w < sizeof(widths) / sizeof(widths[0]); w++) {
        epd_kvtier_config_t cfg = config(1 << 20, NULL, 0, 0, 1);
        epd_kvtier_t *t;
        epd_kvtier_stats_t st;

        cfg.shuffle = widths[w];
        assert_int_equal(epd_kvtier_create(&cfg, &t), EPD_OK);
        put(t, 1, PAYLOAD, 0);
        put(t, 2, PAYLOAD - 3, 1000);
        check_get(t, 1, PAYLOAD, 0);
        check_get(t, 2, PAYLOAD - 3, 1000);
        check_get(t, 1, PAYLOAD, 0);
        epd_kvtier_stats(t, &st);
        assert_int_equal(st.stored, 2);
        assert_int_equal(st.restored_host, 3);
        assert_int_equal(st.host_entries, 2);
        assert_true(st.host_bytes > 0 && st.host_bytes < 2 * PAYLOAD); /* compressed */
        assert_true(epd_kvtier_restore_rate(t) > 0);
        epd_kvtier_destroy(t);
    }
}

/* A store split in two (what prefill does: pack on its tier thread, insert
 * on its loop) gives what put gives: the bytes back bit for bit, one entry
 * per key (a second insert of a key only refreshes it, freeing the packed
 * block: ASan's leak check holds it), the checkpoint's length; a packer
 * refuses a checkpoint longer than its payload. */
static void test_pack_then_insert(void **state)
{
    epd_kvtier_config_t cfg = config(1 << 20, NULL, 0, 0, 1);
    unsigned char *p = malloc(PAYLOAD);
    epd_kvtier_packer_t *pk;
    epd_kvtier_packed_t *b;
    epd_prefix_hash_t k;
    epd_kvtier_stats_t st;
    epd_kvtier_t *t;

    (void)state;
    assert_non_null(p);
    cfg.shuffle = 4;
    assert_int_equal(epd_kvtier_create(&cfg, &t), EPD_OK);
    assert_int_equal(epd_kvtier_packer_create(&cfg, &pk), EPD_OK);
    for (int i = 1; i <= 2; i++) {
        key_of(&k, i);
        payload_of(p, PAYLOAD, i);
        assert_int_equal(epd_kvtier_pack(pk, &k, p, PAYLOAD, i == 2 ? 1000 : 0, &b), EPD_OK);
        assert_int_equal(epd_kvtier_where(t, &k), EPD_KVTIER_NONE); /* packed, not in yet */
        assert_int_equal(epd_kvtier_insert(t, b), EPD_OK);
        assert_int_equal(epd_kvtier_where(t, &k), EPD_KVTIER_HOST);
    }
    check_get(t, 1, PAYLOAD, 0);
    check_get(t, 2, PAYLOAD, 1000);
    key_of(&k, 1);
    payload_of(p, PAYLOAD, 1);
    assert_int_equal(epd_kvtier_pack(pk, &k, p, PAYLOAD, 0, &b), EPD_OK);
    assert_int_equal(epd_kvtier_insert(t, b), EPD_OK);
    epd_kvtier_stats(t, &st);
    assert_int_equal(st.stored, 2);
    assert_int_equal(st.host_entries, 2);
    assert_int_equal(epd_kvtier_pack(pk, &k, p, 10, 11, &b), EPD_ERR_INVALID_PARAM);
    epd_kvtier_packed_free(NULL);
    epd_kvtier_packer_destroy(pk);
    epd_kvtier_destroy(t);
    free(p);
}

static void test_host_lru_and_spill(void **state)
{
    epd_kvtier_t *t;
    epd_kvtier_stats_t st;
    epd_prefix_hash_t k;
    uint64_t one;
    char path[1100];

    (void)state;
    make_dir("spill", g_dir, sizeof(g_dir));
    /* measure one entry's compressed size first */
    {
        epd_kvtier_config_t cfg = config(1 << 20, NULL, 0, 0, 1);

        assert_int_equal(epd_kvtier_create(&cfg, &t), EPD_OK);
        put(t, 0, PAYLOAD, 0);
        epd_kvtier_stats(t, &st);
        one = st.host_bytes;
        epd_kvtier_destroy(t);
    }
    /* room for 2 in memory (entries of 0..4 are about the same size), 3 on disk */
    {
        uint64_t file = one + EPD_KVTIER_HDR_BYTES;
        epd_kvtier_config_t cfg = config(2 * one + one / 2, g_dir, 3 * file + file / 2, 0, 1);

        assert_int_equal(epd_kvtier_create(&cfg, &t), EPD_OK);
    }
    for (int i = 0; i < 6; i++) {
        put(t, i, PAYLOAD, 0);
    }
    epd_kvtier_stats(t, &st);
    assert_int_equal(st.stored, 6);
    assert_int_equal(st.host_entries, 2);
    assert_int_equal(st.spilled, 4);
    assert_int_equal(st.disk_entries, 3); /* the oldest spilled file was deleted */
    assert_int_equal(st.dropped, 1);
    key_of(&k, 0);
    assert_int_equal(epd_kvtier_where(t, &k), EPD_KVTIER_NONE);
    file_of(g_dir, 0, path, sizeof(path));
    assert_false(exists(path));
    for (int i = 1; i <= 3; i++) {
        key_of(&k, i);
        assert_int_equal(epd_kvtier_where(t, &k), EPD_KVTIER_DISK);
        file_of(g_dir, i, path, sizeof(path));
        assert_true(exists(path));
    }
    for (int i = 4; i <= 5; i++) {
        key_of(&k, i);
        assert_int_equal(epd_kvtier_where(t, &k), EPD_KVTIER_HOST);
    }
    check_get(t, 2, PAYLOAD, 0);
    check_get(t, 5, PAYLOAD, 0);
    epd_kvtier_stats(t, &st);
    assert_int_equal(st.restored_disk, 1);
    assert_int_equal(st.restored_host, 1);
    assert_true(st.disk_bytes > 0);
    /* without persist, our files go at destroy */
    epd_kvtier_destroy(t);
    file_of(g_dir, 2, path, sizeof(path));
    assert_false(exists(path));
    rm_dir(g_dir);
    /* no disk: what the host tier evicts is dropped */
    {
        epd_kvtier_config_t cfg = config(2 * one + one / 2, NULL, 0, 0, 1);

        assert_int_equal(epd_kvtier_create(&cfg, &t), EPD_OK);
        for (int i = 0; i < 4; i++) {
            put(t, i, PAYLOAD, 0);
        }
        epd_kvtier_stats(t, &st);
        assert_int_equal(st.host_entries, 2);
        assert_int_equal(st.dropped, 2);
        assert_int_equal(st.spilled, 0);
        epd_kvtier_destroy(t);
    }
}

/* A tier whose every entry goes straight to disk (no host tier). */
static epd_kvtier_t *disk_tier(const char *dir, int persist, int ns_byte)
{
    epd_kvtier_config_t cfg = config(0, dir, 1 << 24, persist, ns_byte);
    epd_kvtier_t *t;

    assert_int_equal(epd_kvtier_create(&cfg, &t), EPD_OK);
    return t;
}

static void flip_byte(const char *path, long off)
{
    FILE *f = fopen(path, "r+b");
    int c;

    assert_non_null(f);
    assert_int_equal(fseek(f, off, SEEK_SET), 0);
    c = fgetc(f);
    assert_int_equal(fseek(f, off, SEEK_SET), 0);
    fputc(c ^ 0x40, f);
    assert_int_equal(fclose(f), 0);
}

static void test_checksum_failure(void **state)
{
    unsigned char buf[PAYLOAD];
    epd_kvtier_t *t;
    epd_kvtier_stats_t st;
    epd_prefix_hash_t k;
    size_t l, cl;
    char path[1100];
    int corrupt = 0;

    (void)state;
    make_dir("sum", g_dir, sizeof(g_dir));
    t = disk_tier(g_dir, 0, 1);
    /* a flipped byte anywhere in the compressed payload: either zstd or the
     * XXH3-128 finds it — never the wrong bytes handed out */
    for (int i = 0; i < 8; i++) {
        put(t, i, PAYLOAD, 100);
        file_of(g_dir, i, path, sizeof(path));
        assert_true(exists(path));
        flip_byte(path, EPD_KVTIER_HDR_BYTES + 7 + i * 13);
        key_of(&k, i);
        assert_int_equal(epd_kvtier_get(t, &k, buf, sizeof(buf), &l, &cl), EPD_ERR_CORRUPT);
        corrupt++;
        assert_int_equal(epd_kvtier_where(t, &k), EPD_KVTIER_NONE);
        assert_false(exists(path));
        assert_int_equal(epd_kvtier_get(t, &k, buf, sizeof(buf), &l, &cl), EPD_ERR_NOT_FOUND);
    }
    epd_kvtier_stats(t, &st);
    assert_int_equal(st.checksum_failures, corrupt);
    assert_int_equal(st.restored_disk, 0);
    assert_int_equal(st.disk_entries, 0);
    /* an intact one still restores */
    put(t, 20, PAYLOAD, 100);
    check_get(t, 20, PAYLOAD, 100);
    epd_kvtier_destroy(t);
    rm_dir(g_dir);
}

static void copy_file(const char *from, const char *to, long len)
{
    char cmd[2400];

    if (len < 0) {
        snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", from, to);
    } else {
        snprintf(cmd, sizeof(cmd), "head -c %ld '%s' > '%s'", len, from, to);
    }
    assert_int_equal(system(cmd), 0);
}

static void test_refused_at_lookup(void **state)
{
    unsigned char buf[PAYLOAD];
    char other[512], path[1100], fpath[1100];
    epd_kvtier_t *t, *f;
    epd_kvtier_stats_t st;
    epd_prefix_hash_t k;
    size_t l, cl;

    (void)state;
    make_dir("look", g_dir, sizeof(g_dir));
    make_dir("other", other, sizeof(other));
    t = disk_tier(g_dir, 0, 1);
    f = disk_tier(other, 1, 2); /* another model's namespace */
    for (int i = 0; i < 4; i++) {
        put(t, i, PAYLOAD, 0);
    }
    put(f, 3, PAYLOAD, 0);
    /* truncated: refused, ours, deleted */
    file_of(g_dir, 0, path, sizeof(path));
    assert_int_equal(truncate(path, EPD_KVTIER_HDR_BYTES + 10), 0);
    key_of(&k, 0);
    assert_int_equal(epd_kvtier_get(t, &k, buf, sizeof(buf), &l, &cl), EPD_ERR_MALFORMED);
    assert_int_equal(epd_kvtier_where(t, &k), EPD_KVTIER_NONE);
    assert_false(exists(path));
    /* bad magic: refused */
    file_of(g_dir, 1, path, sizeof(path));
    flip_byte(path, 0);
    key_of(&k, 1);
    assert_int_equal(epd_kvtier_get(t, &k, buf, sizeof(buf), &l, &cl), EPD_ERR_MALFORMED);
    assert_int_equal(epd_kvtier_where(t, &k), EPD_KVTIER_NONE);
    /* a header byte changed (its length): the header checksum */
    file_of(g_dir, 2, path, sizeof(path));
    flip_byte(path, 90);
    key_of(&k, 2);
    assert_int_equal(epd_kvtier_get(t, &k, buf, sizeof(buf), &l, &cl), EPD_ERR_MALFORMED);
    /* foreign: another namespace's file under our key's name is refused and
     * left where it is */
    file_of(g_dir, 3, path, sizeof(path));
    file_of(other, 3, fpath, sizeof(fpath));
    copy_file(fpath, path, -1);
    key_of(&k, 3);
    assert_int_equal(epd_kvtier_get(t, &k, buf, sizeof(buf), &l, &cl), EPD_ERR_MALFORMED);
    assert_int_equal(epd_kvtier_where(t, &k), EPD_KVTIER_NONE);
    assert_true(exists(path));
    epd_kvtier_stats(t, &st);
    assert_int_equal(st.refused_files, 4);
    assert_int_equal(st.checksum_failures, 0);
    assert_int_equal(st.restored_disk, 0);
    epd_kvtier_destroy(t);
    assert_true(exists(path)); /* not ours: never deleted */
    epd_kvtier_destroy(f);
    rm_dir(g_dir);
    rm_dir(other);
}

static void test_persist_rescan(void **state)
{
    char other[512], path[1100], fpath[1100], trunc_path[1100], junk[1100];
    epd_kvtier_t *t, *f;
    epd_kvtier_stats_t st;
    epd_prefix_hash_t k;
    FILE *j;

    (void)state;
    make_dir("persist", g_dir, sizeof(g_dir));
    make_dir("pother", other, sizeof(other));
    t = disk_tier(g_dir, 1, 1);
    for (int i = 0; i < 5; i++) {
        put(t, i, PAYLOAD - i, (size_t)i * 10);
    }
    epd_kvtier_destroy(t); /* persist: the files stay */
    for (int i = 0; i < 5; i++) {
        file_of(g_dir, i, path, sizeof(path));
        assert_true(exists(path));
    }
    /* a foreign file (its own name), a truncated file of ours, junk */
    f = disk_tier(other, 1, 2);
    put(f, 40, PAYLOAD, 0);
    epd_kvtier_destroy(f);
    file_of(other, 40, fpath, sizeof(fpath));
    file_of(g_dir, 40, path, sizeof(path));
    copy_file(fpath, path, -1);
    file_of(g_dir, 4, fpath, sizeof(fpath));
    file_of(g_dir, 41, trunc_path, sizeof(trunc_path));
    copy_file(fpath, trunc_path, EPD_KVTIER_HDR_BYTES + 5);
    snprintf(junk, sizeof(junk), "%s/README", g_dir);
    j = fopen(junk, "w");
    assert_non_null(j);
    fputs("not a block\n", j);
    fclose(j);

    t = disk_tier(g_dir, 1, 1);
    epd_kvtier_stats(t, &st);
    assert_int_equal(st.disk_entries, 5);
    assert_int_equal(st.refused_files, 3);
    assert_true(exists(path));        /* foreign: left */
    assert_false(exists(trunc_path)); /* ours and truncated: deleted */
    assert_true(exists(junk));        /* not ours: left */
    for (int i = 0; i < 5; i++) {
        key_of(&k, i);
        assert_int_equal(epd_kvtier_where(t, &k), EPD_KVTIER_DISK);
        check_get(t, i, PAYLOAD - (size_t)i, (size_t)i * 10);
    }
    key_of(&k, 40);
    assert_int_equal(epd_kvtier_where(t, &k), EPD_KVTIER_NONE);
    epd_kvtier_destroy(t);

    /* persist writes the host tier out at destroy: a restart finds it */
    {
        epd_kvtier_config_t cfg = config(1 << 20, g_dir, 1 << 24, 1, 1);

        assert_int_equal(epd_kvtier_create(&cfg, &t), EPD_OK);
        put(t, 50, PAYLOAD, 7);
        key_of(&k, 50);
        assert_int_equal(epd_kvtier_where(t, &k), EPD_KVTIER_HOST);
        epd_kvtier_destroy(t);
        t = disk_tier(g_dir, 1, 1);
        assert_int_equal(epd_kvtier_where(t, &k), EPD_KVTIER_DISK);
        check_get(t, 50, PAYLOAD, 7);
        epd_kvtier_destroy(t);
    }
    /* without persist: ours removed at create (not used), foreign ones left */
    t = disk_tier(g_dir, 0, 1);
    epd_kvtier_stats(t, &st);
    assert_int_equal(st.disk_entries, 0);
    for (int i = 0; i < 5; i++) {
        file_of(g_dir, i, fpath, sizeof(fpath));
        assert_false(exists(fpath));
    }
    file_of(g_dir, 50, fpath, sizeof(fpath));
    assert_false(exists(fpath));
    assert_true(exists(path));
    epd_kvtier_destroy(t);
    rm_dir(g_dir);
    rm_dir(other);
}

static void test_config(void **state)
{
    epd_kvtier_config_t cfg;
    epd_kvtier_t *t = NULL;
    char file[600];
    FILE *f;

    (void)state;
    cfg = config(1024, NULL, 4096, 0, 1); /* disk bytes without a directory */
    assert_int_equal(epd_kvtier_create(&cfg, &t), EPD_ERR_CONFIG);
    cfg = config(1024, NULL, 0, 1, 1); /* persist without a directory */
    assert_int_equal(epd_kvtier_create(&cfg, &t), EPD_ERR_CONFIG);
    cfg = config(1024, NULL, 0, 0, 1);
    cfg.level = 0;
    assert_int_equal(epd_kvtier_create(&cfg, &t), EPD_ERR_CONFIG);
    make_dir("cfg", g_dir, sizeof(g_dir));
    snprintf(file, sizeof(file), "%s/plain", g_dir);
    f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(file, sizeof(file), "%s/plain/sub", g_dir); /* under a regular file */
    cfg = config(1024, file, 4096, 0, 1);
    assert_int_equal(epd_kvtier_create(&cfg, &t), EPD_ERR_CONFIG);
    assert_null(t);
    for (int n = 0; n < 3; n++) {
        cfg = config(1024, g_dir, 4096, 0, 1);
        epd_alloc_fail_after(n);
        assert_int_equal(epd_kvtier_create(&cfg, &t), EPD_ERR_NO_MEMORY);
        epd_alloc_fail_after(-1);
    }
    rm_dir(g_dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shuffle_round_trip), cmocka_unit_test(test_pack_then_insert),
        cmocka_unit_test(test_host_lru_and_spill),
        cmocka_unit_test(test_checksum_failure),   cmocka_unit_test(test_refused_at_lookup),
        cmocka_unit_test(test_persist_rescan),     cmocka_unit_test(test_config),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
