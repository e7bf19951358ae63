/*
 * epd_kvtier.c — the host and disk tier of a prefix cache (see the header).
 *
 * Entries are heap nodes in a chained hash table (keys are BLAKE2b
 * outputs: their first 8 bytes index the buckets) and on one of two LRU
 * lists, host or disk.  A host entry owns its compressed bytes; a disk
 * entry owns nothing but its file.  Compression and decompression go
 * through one scratch buffer of the largest payload seen (the shuffled
 * bytes) and one for a file's compressed bytes.
 */

#include "epd_kvtier_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "epd_alloc.h"
#include "epd_bytes.h"
#include "epd_hash.h"
#include "epd_log.h"
#include "epd_time.h"

#define EPD_KVTIER_BUCKETS (1u << 14)
#define EPD_KVTIER_PATH_MAX 4096
static const unsigned char epd_kvtier_magic[8] = {'E', 'P', 'D', 'K', 'V', 'T', 'R', 0};


typedef struct {
    epd_kvtier_ent_t *lru, *mru;
    uint64_t bytes, n;
} epd_kvtier_list_t;

struct epd_kvtier {
    epd_kvtier_config_t cfg;
    char *dir; /* owned copy, NULL: no disk */
    epd_kvtier_ent_t **buckets;
    epd_kvtier_list_t host, disk;
    unsigned char *scratch; /* shuffled raw bytes */
    size_t scratch_cap;
    unsigned char *fbuf; /* compressed bytes (put: the file image, header first) */
    size_t fbuf_cap;
    epd_kvtier_packer_t *packer; /* epd_kvtier_put's */
    ZSTD_DCtx *dctx;
    epd_kvtier_stats_t st;
    double rate; /* EWMA of restore bytes per second */
};

/* ---- little helpers ---------------------------------------------------- */

void epd_kvtier_file_name(const epd_prefix_hash_t *key, char out[65])
{
    epd_hex_encode(out, key->b, sizeof(key->b));
    out[64] = '\0';
}

/* The key a file name spells (64 lower-case hex digits); -1 otherwise. */
static int epd_kvtier_name_key(const char *name, epd_prefix_hash_t *key_p)
{
    if (strnlen(name, 65) != 64) {
        return -1;
    }
    return epd_hex_decode(key_p->b, name, sizeof(key_p->b));
}

static void epd_kvtier_path(const epd_kvtier_t *t, const epd_prefix_hash_t *key, char *out,
                            size_t cap)
{
    char name[65];

    epd_kvtier_file_name(key, name);
    snprintf(out, cap, "%s/%s", t->dir, name);
}

/* ---- the index ---------------------------------------------------------- */

static epd_kvtier_ent_t **epd_kvtier_slot(const epd_kvtier_t *t, const epd_prefix_hash_t *key)
{
    uint64_t h;

    memcpy(&h, key->b, sizeof(h));
    return &t->buckets[h & (EPD_KVTIER_BUCKETS - 1)];
}

static epd_kvtier_ent_t *epd_kvtier_find(const epd_kvtier_t *t, const epd_prefix_hash_t *key)
{
    for (epd_kvtier_ent_t *e = *epd_kvtier_slot(t, key); e != NULL; e = e->chain) {
        if (memcmp(e->key.b, key->b, sizeof(key->b)) == 0) {
            return e;
        }
    }
    return NULL;
}

static epd_kvtier_list_t *epd_kvtier_list(epd_kvtier_t *t, const epd_kvtier_ent_t *e)
{
    return e->where == EPD_KVTIER_HOST ? &t->host : &t->disk;
}

static uint64_t epd_kvtier_size(const epd_kvtier_ent_t *e)
{
    return e->where == EPD_KVTIER_HOST ? e->comp_len : e->file_bytes;
}

static void epd_kvtier_unlist(epd_kvtier_t *t, epd_kvtier_ent_t *e)
{
    epd_kvtier_list_t *l = epd_kvtier_list(t, e);

    if (e->prev != NULL) {
        e->prev->next = e->next;
    } else {
        l->lru = e->next;
    }
    if (e->next != NULL) {
        e->next->prev = e->prev;
    } else {
        l->mru = e->prev;
    }
    e->prev = e->next = NULL;
    l->bytes -= epd_kvtier_size(e);
    l->n--;
}

static void epd_kvtier_list_mru(epd_kvtier_t *t, epd_kvtier_ent_t *e)
{
    epd_kvtier_list_t *l = epd_kvtier_list(t, e);

    e->prev = l->mru;
    e->next = NULL;
    if (l->mru != NULL) {
        l->mru->next = e;
    } else {
        l->lru = e;
    }
    l->mru = e;
    l->bytes += epd_kvtier_size(e);
    l->n++;
}

/* Unlinks e from its bucket and list and frees it (its file stays). */
static void epd_kvtier_forget(epd_kvtier_t *t, epd_kvtier_ent_t *e)
{
    epd_kvtier_ent_t **pp = epd_kvtier_slot(t, &e->key);

    while (*pp != e) {
        pp = &(*pp)->chain;
    }
    *pp = e->chain;
    epd_kvtier_unlist(t, e);
    epd_free(e->data);
    epd_free(e);
}

/* Forgets e and deletes its file (a disk entry). */
static void epd_kvtier_remove(epd_kvtier_t *t, epd_kvtier_ent_t *e)
{
    char path[EPD_KVTIER_PATH_MAX];

    if (e->where == EPD_KVTIER_DISK) {
        epd_kvtier_path(t, &e->key, path, sizeof(path));
        (void)unlink(path);
    }
    epd_kvtier_forget(t, e);
}

/* ---- the file format ---------------------------------------------------- */

static void epd_kvtier_hdr_pack(const epd_kvtier_t *t, const epd_kvtier_ent_t *e,
                                unsigned char h[EPD_KVTIER_HDR_BYTES])
{
    memset(h, 0, EPD_KVTIER_HDR_BYTES);
    memcpy(h, epd_kvtier_magic, 8);
    epd_le_put(h + 8, EPD_KVTIER_VERSION, 4);
    epd_le_put(h + 12, e->shuffle, 4);
    epd_le_put(h + 16, (uint32_t)t->cfg.level, 4);
    memcpy(h + 24, t->cfg.ns.b, 32);
    memcpy(h + 56, e->key.b, 32);
    epd_le_put(h + 88, e->raw_len, 8);
    epd_le_put(h + 96, e->comp_len, 8);
    epd_le_put(h + 104, e->ckpt_len, 8);
    memcpy(h + 112, e->sum, 16);
    epd_le_put(h + 136, epd_hash64(h, 136, 0), 8);
}

/* Checks a file's header (h[0..have) read of a file of file_bytes; its
 * name's key, NULL when the name spelled none) into *e_p; NULL when fine,
 * else why not, with *ours_p set when the file is ours (our namespace)
 * and so may be deleted. */
static const char *epd_kvtier_hdr_check(const epd_kvtier_t *t, const unsigned char *h,
                                        size_t have, uint64_t file_bytes,
                                        const epd_prefix_hash_t *name_key, epd_kvtier_ent_t *e_p,
                                        int *ours_p)
{
    *ours_p = have >= 56 && memcmp(h + 24, t->cfg.ns.b, 32) == 0;
    if (have < EPD_KVTIER_HDR_BYTES) {
        return "truncated: shorter than the header";
    }
    if (memcmp(h, epd_kvtier_magic, 8) != 0) {
        return "not a KV tier file (bad magic)";
    }
    if ((uint32_t)epd_le_get(h + 8, 4) != EPD_KVTIER_VERSION) {
        return "unknown format version";
    }
    if (epd_hash64(h, 136, 0) != epd_le_get(h + 136, 8)) {
        return "header checksum mismatch";
    }
    if (!*ours_p) {
        return "written by another model or KV layout";
    }
    memcpy(e_p->key.b, h + 56, 32);
    e_p->shuffle = (uint32_t)epd_le_get(h + 12, 4);
    e_p->raw_len = epd_le_get(h + 88, 8);
    e_p->comp_len = epd_le_get(h + 96, 8);
    e_p->ckpt_len = epd_le_get(h + 104, 8);
    memcpy(e_p->sum, h + 112, 16);
    if (e_p->ckpt_len > e_p->raw_len || e_p->shuffle > 64 ||
        e_p->comp_len > ZSTD_compressBound(e_p->raw_len)) {
        return "inconsistent lengths";
    }
    if (file_bytes != EPD_KVTIER_HDR_BYTES + e_p->comp_len) {
        return file_bytes < EPD_KVTIER_HDR_BYTES + e_p->comp_len ? "truncated payload"
                                                                   : "trailing bytes";
    }
    if (name_key == NULL || memcmp(name_key->b, e_p->key.b, 32) != 0) {
        return "its name is not its key";
    }
    return NULL;
}

/* Refuses a file: one log line naming it and why; deleted when ours. */
static void epd_kvtier_refuse(epd_kvtier_t *t, const char *path, const char *why, int ours)
{
    t->st.refused_files++;
    epd_log_warn(t->cfg.log_comp, 0, "kv tier: refusing file %s: %s%s", path, why,
                 ours ? " (ours: deleted)" : " (left in place)");
    if (ours) {
        (void)unlink(path);
    }
}

/* Writes e's file from the compressed bytes at data (temporary name, then
 * renamed).  0, or -1 (logged). */
static int epd_kvtier_write_file(epd_kvtier_t *t, epd_kvtier_ent_t *e, const unsigned char *data)
{
    char path[EPD_KVTIER_PATH_MAX];
    char tmp[EPD_KVTIER_PATH_MAX + 8];
    unsigned char hdr[EPD_KVTIER_HDR_BYTES];
    char name[65];
    int fd;
    int ok;

    epd_kvtier_file_name(&e->key, name);
    snprintf(path, sizeof(path), "%s/%s", t->dir, name);
    snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", t->dir, name);
    epd_kvtier_hdr_pack(t, e, hdr);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        epd_log_warn(t->cfg.log_comp, 0, "kv tier: cannot create %s: %s", tmp, strerror(errno));
        return -1;
    }
    ok = write(fd, hdr, sizeof(hdr)) == (ssize_t)sizeof(hdr) &&
         write(fd, data, e->comp_len) == (ssize_t)e->comp_len;
    if (close(fd) != 0) {
        ok = 0;
    }
    if (!ok || rename(tmp, path) != 0) {
        epd_log_warn(t->cfg.log_comp, 0, "kv tier: cannot write %s: %s", path, strerror(errno));
        (void)unlink(tmp);
        return -1;
    }
    e->file_bytes = EPD_KVTIER_HDR_BYTES + e->comp_len;
    return 0;
}

/* ---- bounds ------------------------------------------------------------- */

static void epd_kvtier_trim_disk(epd_kvtier_t *t, uint64_t room)
{
    while (t->disk.lru != NULL && t->disk.bytes + room > t->cfg.disk_bytes) {
        t->st.dropped++;
        epd_kvtier_remove(t, t->disk.lru);
    }
}

/* Moves host entry e to disk (or drops it when there is no disk or no room). */
static void epd_kvtier_spill(epd_kvtier_t *t, epd_kvtier_ent_t *e)
{
    uint64_t need = EPD_KVTIER_HDR_BYTES + e->comp_len;

    if (t->dir == NULL || need > t->cfg.disk_bytes) {
        t->st.dropped++;
        epd_kvtier_forget(t, e);
        return;
    }
    epd_kvtier_trim_disk(t, need);
    if (epd_kvtier_write_file(t, e, e->data) != 0) {
        t->st.dropped++;
        epd_kvtier_forget(t, e);
        return;
    }
    epd_kvtier_unlist(t, e);
    epd_free(e->data);
    e->data = NULL;
    e->where = EPD_KVTIER_DISK;
    epd_kvtier_list_mru(t, e);
    t->st.spilled++;
}

static void epd_kvtier_trim_host(epd_kvtier_t *t)
{
    while (t->host.lru != NULL && t->host.bytes > t->cfg.host_bytes) {
        epd_kvtier_spill(t, t->host.lru);
    }
}

/* ---- create / destroy --------------------------------------------------- */

static int epd_kvtier_cmp_mtime(const void *a, const void *b)
{
    const epd_kvtier_ent_t *x = *(epd_kvtier_ent_t *const *)a;
    const epd_kvtier_ent_t *y = *(epd_kvtier_ent_t *const *)b;

    return x->mtime_ns < y->mtime_ns ? -1 : x->mtime_ns > y->mtime_ns;
}

/* Reads up to cap bytes of path into buf: bytes read (*size_p the file's
 * size), -1 when it cannot be opened or read (errno). */
static ssize_t epd_kvtier_read(const char *path, unsigned char *buf, size_t cap, uint64_t *size_p,
                               uint64_t *mtime_p)
{
    struct stat sb;
    size_t got = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0) {
        return -1;
    }
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return -1;
    }
    *size_p = (uint64_t)sb.st_size;
    if (mtime_p != NULL) {
        *mtime_p = (uint64_t)sb.st_mtim.tv_sec * 1000000000ull + (uint64_t)sb.st_mtim.tv_nsec;
    }
    while (got < cap) {
        ssize_t r = read(fd, buf + got, cap - got);

        if (r < 0) {
            close(fd);
            return -1;
        }
        if (r == 0) {
            break;
        }
        got += (size_t)r;
    }
    close(fd);
    return (ssize_t)got;
}

/* The directory at create: persist indexes our valid files (refusing the
 * others, one line each); otherwise our files are removed.  0 or -1. */
static int epd_kvtier_scan(epd_kvtier_t *t)
{
    DIR *dir = opendir(t->dir);
    epd_kvtier_ent_t **found = NULL;
    size_t n_found = 0, cap_found = 0;
    uint64_t removed = 0;
    struct dirent *de;

    if (dir == NULL) {
        epd_log_error(t->cfg.log_comp, 0, "kv tier: cannot open %s: %s", t->dir, strerror(errno));
        return -1;
    }
    while ((de = readdir(dir)) != NULL) {
        char path[EPD_KVTIER_PATH_MAX];
        unsigned char h[EPD_KVTIER_HDR_BYTES];
        epd_prefix_hash_t name_key;
        epd_kvtier_ent_t probe;
        uint64_t size = 0, mtime = 0;
        const char *why;
        ssize_t have;
        int ours;

        if (de->d_name[0] == '.') {
            continue; /* ".", "..", temporaries */
        }
        snprintf(path, sizeof(path), "%s/%s", t->dir, de->d_name);
        have = epd_kvtier_read(path, h, sizeof(h), &size, &mtime);
        if (have < 0) {
            t->st.refused_files++;
            epd_log_warn(t->cfg.log_comp, 0, "kv tier: refusing file %s: unreadable: %s", path,
                         strerror(errno));
            continue;
        }
        memset(&probe, 0, sizeof(probe));
        why = epd_kvtier_hdr_check(t, h, (size_t)have,
                                   size, epd_kvtier_name_key(de->d_name, &name_key) == 0
                                             ? &name_key : NULL,
                                   &probe, &ours);
        if (!t->cfg.persist) {
            if (ours) {
                (void)unlink(path); /* an earlier run's: not used */
                removed++;
            }
            continue;
        }
        if (why != NULL) {
            epd_kvtier_refuse(t, path, why, ours);
            continue;
        }
        if (epd_kvtier_find(t, &probe.key) != NULL) {
            continue;
        }
        if (n_found == cap_found) {
            size_t nc = cap_found ? 2 * cap_found : 64;
            epd_kvtier_ent_t **nf = epd_realloc(found, nc * sizeof(*nf));

            if (nf == NULL) {
                goto err_nomem;
            }
            found = nf;
            cap_found = nc;
        }
        found[n_found] = epd_calloc(1, sizeof(**found));
        if (found[n_found] == NULL) {
            goto err_nomem;
        }
        *found[n_found] = probe;
        found[n_found]->where = EPD_KVTIER_DISK;
        found[n_found]->file_bytes = size;
        found[n_found]->mtime_ns = mtime;
        n_found++;
    }
    closedir(dir);
    if (n_found > 0) {
        qsort(found, n_found, sizeof(*found), epd_kvtier_cmp_mtime);
    }
    for (size_t i = 0; i < n_found; i++) {
        epd_kvtier_ent_t **slot = epd_kvtier_slot(t, &found[i]->key);

        found[i]->chain = *slot;
        *slot = found[i];
        epd_kvtier_list_mru(t, found[i]);
    }
    epd_free(found);
    epd_kvtier_trim_disk(t, 0);
    if (t->cfg.persist) {
        epd_log_info(t->cfg.log_comp, 0, "kv tier: %s: %llu blocks of earlier runs (%llu bytes) "
                     "indexed", t->dir, (unsigned long long)t->disk.n,
                     (unsigned long long)t->disk.bytes);
    } else if (removed > 0) {
        epd_log_info(t->cfg.log_comp, 0, "kv tier: %s: %llu files of earlier runs removed "
                     "(no --kv-disk-persist)", t->dir, (unsigned long long)removed);
    }
    return 0;

err_nomem:
    closedir(dir);
    for (size_t i = 0; i < n_found; i++) {
        epd_free(found[i]);
    }
    epd_free(found);
    epd_log_error(t->cfg.log_comp, 0, "kv tier: out of memory scanning %s", t->dir);
    return -1;
}

epd_status_t epd_kvtier_create(const epd_kvtier_config_t *cfg, epd_kvtier_t **t_p)
{
    const char *comp = cfg->log_comp != NULL ? cfg->log_comp : "kvtier";
    epd_kvtier_t *t;

    if (cfg->level < 1 || cfg->level > ZSTD_maxCLevel()) {
        epd_log_error(comp, 0, "kv tier: zstd level %d out of [1, %d]", cfg->level,
                      ZSTD_maxCLevel());
        return EPD_ERR_CONFIG;
    }
    if (cfg->shuffle > 64) {
        epd_log_error(comp, 0, "kv tier: shuffle element of %u bytes", cfg->shuffle);
        return EPD_ERR_CONFIG;
    }
    if (cfg->disk_dir == NULL && (cfg->disk_bytes > 0 || cfg->persist)) {
        epd_log_error(comp, 0, "kv tier: --kv-disk-bytes and --kv-disk-persist need --kv-disk DIR");
        return EPD_ERR_CONFIG;
    }
    t = epd_calloc(1, sizeof(*t));
    if (t == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    t->cfg = *cfg;
    t->cfg.log_comp = comp;
    t->cfg.disk_dir = NULL;
    t->buckets = epd_calloc(EPD_KVTIER_BUCKETS, sizeof(*t->buckets));
    t->dctx = ZSTD_createDCtx();
    if (t->buckets == NULL || t->dctx == NULL || epd_kvtier_packer_create(cfg, &t->packer) != EPD_OK) {
        epd_kvtier_destroy(t);
        return EPD_ERR_NO_MEMORY;
    }
    if (cfg->disk_dir != NULL) {
        t->dir = epd_strdup(cfg->disk_dir);
        if (t->dir == NULL) {
            epd_kvtier_destroy(t);
            return EPD_ERR_NO_MEMORY;
        }
        if (mkdir(t->dir, 0700) != 0 && errno != EEXIST) {
            epd_log_error(comp, 0, "kv tier: cannot create directory %s: %s", t->dir,
                          strerror(errno));
            goto err_config;
        }
        if (access(t->dir, W_OK | X_OK | R_OK) != 0) {
            epd_log_error(comp, 0, "kv tier: directory %s is not writable: %s", t->dir,
                          strerror(errno));
            goto err_config;
        }
        if (epd_kvtier_scan(t) != 0) {
            goto err_config;
        }
    }
    *t_p = t;
    return EPD_OK;

err_config:
    t->cfg.persist = 1; /* leave the directory as it is */
    epd_kvtier_destroy(t);
    return EPD_ERR_CONFIG;
}

void epd_kvtier_destroy(epd_kvtier_t *t)
{
    if (t == NULL) {
        return;
    }
    while (t->host.lru != NULL) {
        if (t->cfg.persist && t->dir != NULL) {
            epd_kvtier_spill(t, t->host.lru); /* the next run may use it */
        } else {
            epd_kvtier_forget(t, t->host.lru);
        }
    }
    while (t->disk.lru != NULL) {
        if (t->cfg.persist) {
            epd_kvtier_forget(t, t->disk.lru);
        } else {
            epd_kvtier_remove(t, t->disk.lru);
        }
    }
    epd_kvtier_packer_destroy(t->packer);
    ZSTD_freeDCtx(t->dctx);
    epd_free(t->buckets);
    epd_free(t->scratch);
    epd_free(t->fbuf);
    epd_free(t->dir);
    epd_free(t);
}

/* ---- put / get ---------------------------------------------------------- */

epd_status_t epd_kvtier_insert(epd_kvtier_t *t, epd_kvtier_packed_t *e)
{
    epd_kvtier_ent_t *had = epd_kvtier_find(t, &e->key);
    epd_kvtier_ent_t **slot;

    if (had != NULL) {
        epd_kvtier_packed_free(e);
        epd_kvtier_unlist(t, had);
        epd_kvtier_list_mru(t, had);
        return EPD_OK;
    }
    slot = epd_kvtier_slot(t, &e->key);
    if (e->comp_len > t->cfg.host_bytes) {
        /* no room in memory at all: straight to disk, if any */
        if (t->dir == NULL || EPD_KVTIER_HDR_BYTES + e->comp_len > t->cfg.disk_bytes) {
            epd_kvtier_packed_free(e);
            t->st.dropped++;
            return EPD_ERR_TOO_LONG;
        }
        epd_kvtier_trim_disk(t, EPD_KVTIER_HDR_BYTES + e->comp_len);
        if (epd_kvtier_write_file(t, e, e->data) != 0) {
            epd_kvtier_packed_free(e);
            t->st.dropped++;
            return EPD_ERR_IO;
        }
        epd_free(e->data);
        e->data = NULL;
        e->where = EPD_KVTIER_DISK;
        e->chain = *slot;
        *slot = e;
        epd_kvtier_list_mru(t, e);
        t->st.spilled++;
        return EPD_OK;
    }
    e->where = EPD_KVTIER_HOST;
    e->chain = *slot;
    *slot = e;
    epd_kvtier_list_mru(t, e);
    t->st.stored++;
    epd_kvtier_trim_host(t);
    return EPD_OK;
}

epd_status_t epd_kvtier_put(epd_kvtier_t *t, const epd_prefix_hash_t *key, const void *payload,
                            size_t len, size_t ckpt_len)
{
    epd_kvtier_ent_t *e = epd_kvtier_find(t, key);
    epd_status_t st;

    if (e != NULL) {
        epd_kvtier_unlist(t, e);
        epd_kvtier_list_mru(t, e);
        return EPD_OK;
    }
    st = epd_kvtier_pack(t->packer, key, payload, len, ckpt_len, &e);
    return st != EPD_OK ? st : epd_kvtier_insert(t, e);
}

epd_kvtier_where_t epd_kvtier_where(const epd_kvtier_t *t, const epd_prefix_hash_t *key)
{
    const epd_kvtier_ent_t *e = epd_kvtier_find(t, key);

    return e != NULL ? e->where : EPD_KVTIER_NONE;
}

/* A disk entry's compressed bytes into t->fbuf, its header checked again
 * (the file may have changed since it was written or indexed).  EPD_OK;
 * EPD_ERR_MALFORMED (refused, logged; e forgotten), EPD_ERR_IO. */
static epd_status_t epd_kvtier_load(epd_kvtier_t *t, epd_kvtier_ent_t *e, const char *path)
{
    epd_kvtier_ent_t probe;
    uint64_t size = 0;
    const char *why;
    ssize_t have;
    int ours;

    if (epd__kvtier_grow(&t->fbuf, &t->fbuf_cap, EPD_KVTIER_HDR_BYTES + e->comp_len + 1) != 0) {
        return EPD_ERR_NO_MEMORY;
    }
    /* one byte more than expected: a longer file is refused too */
    have = epd_kvtier_read(path, t->fbuf, EPD_KVTIER_HDR_BYTES + e->comp_len + 1, &size, NULL);
    if (have < 0) {
        t->st.refused_files++;
        epd_log_warn(t->cfg.log_comp, 0, "kv tier: refusing file %s: unreadable: %s", path,
                     strerror(errno));
        epd_kvtier_forget(t, e);
        return EPD_ERR_MALFORMED;
    }
    memset(&probe, 0, sizeof(probe));
    why = epd_kvtier_hdr_check(t, t->fbuf, (size_t)have, size, &e->key, &probe, &ours);
    if (why == NULL && (probe.raw_len != e->raw_len || probe.comp_len != e->comp_len ||
                        (uint64_t)have != size)) {
        why = "changed since it was indexed";
    }
    if (why != NULL) {
        epd_kvtier_refuse(t, path, why, ours);
        epd_kvtier_forget(t, e);
        return EPD_ERR_MALFORMED;
    }
    memcpy(e->sum, probe.sum, 16);
    e->ckpt_len = probe.ckpt_len;
    e->shuffle = probe.shuffle;
    return EPD_OK;
}

epd_status_t epd_kvtier_get(epd_kvtier_t *t, const epd_prefix_hash_t *key, void *dst, size_t cap,
                            size_t *len_p, size_t *ckpt_len_p)
{
    char path[EPD_KVTIER_PATH_MAX] = "(host memory)";
    epd_kvtier_ent_t *e = epd_kvtier_find(t, key);
    uint64_t t0 = epd_time_now_ns();
    const unsigned char *comp;
    epd_kvtier_where_t where;
    uint8_t sum[16];
    size_t r;

    if (e == NULL) {
        return EPD_ERR_NOT_FOUND;
    }
    if (e->raw_len > cap) {
        return EPD_ERR_TOO_LONG;
    }
    if (epd__kvtier_grow(&t->scratch, &t->scratch_cap, e->raw_len) != 0) {
        return EPD_ERR_NO_MEMORY;
    }
    where = e->where;
    if (where == EPD_KVTIER_DISK) {
        epd_status_t st;

        epd_kvtier_path(t, key, path, sizeof(path));
        st = epd_kvtier_load(t, e, path);
        if (st != EPD_OK) {
            return st;
        }
        comp = t->fbuf + EPD_KVTIER_HDR_BYTES;
    } else {
        comp = e->data;
    }
    r = ZSTD_decompressDCtx(t->dctx, t->scratch, e->raw_len, comp, e->comp_len);
    if (!ZSTD_isError(r) && r == e->raw_len) {
        epd_kvtier_unshuffle(t->scratch, dst, e->raw_len, e->shuffle);
        epd_hash128(dst, e->raw_len, 0, sum);
    }
    if (ZSTD_isError(r) || r != e->raw_len || memcmp(sum, e->sum, 16) != 0) {
        t->st.checksum_failures++;
        epd_log_warn(t->cfg.log_comp, 0, "kv tier: block in %s fails its checksum (%s): not "
                     "used, dropped (its tokens are computed)", path,
                     ZSTD_isError(r) ? ZSTD_getErrorName(r) : "XXH3-128 of the payload differs");
        epd_kvtier_remove(t, e);
        return EPD_ERR_CORRUPT;
    }
    *len_p = e->raw_len;
    *ckpt_len_p = e->ckpt_len;
    epd_kvtier_unlist(t, e);
    epd_kvtier_list_mru(t, e);
    {
        uint64_t dt = epd_time_now_ns() - t0;
        double rate = (double)e->raw_len * 1e9 / (double)(dt > 0 ? dt : 1);

        t->rate = t->rate == 0 ? rate : 0.75 * t->rate + 0.25 * rate;
        t->st.restore_us += dt / 1000;
    }
    t->st.restore_bytes += e->raw_len;
    if (where == EPD_KVTIER_HOST) {
        t->st.restored_host++;
    } else {
        t->st.restored_disk++;
        epd_log_debug(t->cfg.log_comp, 0, "kv tier: restored %s", path);
    }
    return EPD_OK;
}

void epd_kvtier_stats(const epd_kvtier_t *t, epd_kvtier_stats_t *s_p)
{
    *s_p = t->st;
    s_p->host_bytes = t->host.bytes;
    s_p->disk_bytes = t->disk.bytes;
    s_p->host_entries = t->host.n;
    s_p->disk_entries = t->disk.n;
}

double epd_kvtier_restore_rate(const epd_kvtier_t *t)
{
    return t->rate;
}
