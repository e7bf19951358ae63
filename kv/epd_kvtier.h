/*
 * epd_kvtier.h — the host-memory and disk tier below a prefix cache: KV
 * blocks evicted from a worker's pool, compressed, checksummed, kept in a
 * bounded host tier and then (optionally) in a bounded directory on local
 * disk, until a prompt that starts the same way asks for them again.
 *
 * An entry is one block, keyed by its chain hash (kv/epd_prefix.h):
 * its payload is every attention layer's part of the block in layer order,
 * then optionally the block's recurrent-state checkpoint (the caller lays
 * it out; the tier only keeps bytes and the checkpoint's length).  The
 * payload is stored byte-plane shuffled (elements of `shuffle` bytes: all
 * first bytes, then all second bytes, ...; 0 or 1: not shuffled) and
 * compressed with zstd at `level`, with the XXH3-128 of the uncompressed
 * payload, which every restore verifies: a block that fails it is never
 * handed out (the entry is dropped, the caller recomputes).
 *
 *   host  compressed bytes in memory, LRU, at most host_bytes of them
 *         (0: no host tier, an evicted block goes straight to disk)
 *   disk  what the host tier evicts, when disk_dir is set: one file per
 *         block named by its key in hex, written to a temporary name and
 *         renamed; at most disk_bytes of files, the least recently used
 *         deleted first.  Without disk_dir, what the host tier evicts is
 *         dropped.
 *
 * A file starts with a fixed header (EPD_KVTIER_HDR_BYTES, little-endian):
 * magic "EPDKVTR\0", format version, shuffle, level, the namespace (the
 * worker's unsalted prefix root: engine, model digest, KV layout), the key,
 * raw, compressed and checkpoint lengths, the payload's XXH3-128 and the
 * XXH3-64 of the header before it.  A file whose header fails a check is
 * refused with one log line naming it and the reason; it is deleted only
 * when its header names our namespace (ours, corrupt) — a foreign file
 * ("written by another model or KV layout") is never touched.
 *
 * persist: at create the directory is scanned and every valid file of our
 * namespace indexed (most recently modified = most recently used); at
 * destroy the host tier is written out too (disk bound permitting) and the
 * files stay.  Without it our files of earlier runs are removed
 * at create and ours at destroy.
 *
 * Synchronous: put compresses (and may write a file), get reads and
 * decompresses, on the caller's thread.  Threads: one (the caller's; no
 * lock) — but a store may be split: epd_kvtier_pack (hash, shuffle, zstd:
 * the cost) on any thread with a packer of its own, then
 * epd_kvtier_insert on the tier's thread.  Allocates per entry (its
 * compressed bytes).
 */
#ifndef EPD_KVTIER_H
#define EPD_KVTIER_H

#include <stddef.h>
#include <stdint.h>

#include "epd_prefix.h"
#include "epd_status.h"

#define EPD_KVTIER_HDR_BYTES 144
#define EPD_KVTIER_VERSION 1

typedef struct epd_kvtier epd_kvtier_t;

typedef struct {
    epd_prefix_hash_t ns;   /* the namespace every entry belongs to */
    uint64_t host_bytes;    /* bound of the host tier (compressed bytes; 0: none) */
    const char *disk_dir;   /* borrowed for create; NULL: no disk tier */
    uint64_t disk_bytes;    /* bound of the disk tier (file bytes) */
    int persist;            /* index our files at create, keep them at destroy */
    int level;              /* zstd level */
    uint32_t shuffle;       /* byte-plane shuffle element size (0, 1: none) */
    const char *log_comp;   /* static component name of the log lines */
} epd_kvtier_config_t;

/* Where an entry is. */
typedef enum { EPD_KVTIER_NONE = 0, EPD_KVTIER_HOST = 1, EPD_KVTIER_DISK = 2 } epd_kvtier_where_t;

typedef struct {
    uint64_t stored;           /* blocks put into the host tier */
    uint64_t spilled;          /* blocks written to disk */
    uint64_t restored_host;    /* blocks handed out from the host tier */
    uint64_t restored_disk;    /* from disk */
    uint64_t restore_us;       /* microseconds spent in successful gets */
    uint64_t restore_bytes;    /* raw bytes those gets returned */
    uint64_t checksum_failures;/* gets refused: the payload's XXH3-128 differs */
    uint64_t refused_files;    /* files refused (header, foreign, truncated, unreadable) */
    uint64_t dropped;          /* entries dropped for room with nowhere to go */
    uint64_t host_bytes;       /* now: compressed bytes in memory */
    uint64_t disk_bytes;       /* now: bytes of our files */
    uint64_t host_entries, disk_entries; /* now */
} epd_kvtier_stats_t;

/* A tier (*t_p owned by the caller, epd_kvtier_destroy).  With a disk_dir:
 * creates it when missing, checks it is writable, scans it (persist) or
 * removes our old files.  EPD_ERR_CONFIG (logged: an unusable directory,
 * disk_bytes without disk_dir, a bad level or shuffle), EPD_ERR_NO_MEMORY. */
epd_status_t epd_kvtier_create(const epd_kvtier_config_t *cfg, epd_kvtier_t **t_p);
/* Without persist removes our files; with it writes the host tier out.
 * NULL is a no-op. */
void epd_kvtier_destroy(epd_kvtier_t *t);

/* Stores payload[0..len) (its last ckpt_len bytes a checkpoint; borrowed
 * for the call) under key into the host tier, evicting the least recently
 * used entries beyond the bounds (to disk, or dropped).  A key held
 * already is only made the most recently used.  EPD_OK, EPD_ERR_NO_MEMORY,
 * EPD_ERR_TOO_LONG (over the host bound and no disk: not kept). */
epd_status_t epd_kvtier_put(epd_kvtier_t *t, const epd_prefix_hash_t *key, const void *payload,
                            size_t len, size_t ckpt_len);

/* A block packed for a tier (hashed, shuffled, compressed), not in one
 * yet; and the compression context of one thread. */
typedef struct epd_kvtier_ent epd_kvtier_packed_t;
typedef struct epd_kvtier_packer epd_kvtier_packer_t;

/* A packer with cfg's level and shuffle (*p_p owned by the caller,
 * epd_kvtier_packer_destroy; NULL is a no-op there).  EPD_ERR_NO_MEMORY. */
epd_status_t epd_kvtier_packer_create(const epd_kvtier_config_t *cfg, epd_kvtier_packer_t **p_p);
void epd_kvtier_packer_destroy(epd_kvtier_packer_t *p);
/* Packs payload[0..len) (borrowed for the call; its last ckpt_len bytes a
 * checkpoint) under key: *pk_p owned by the caller until epd_kvtier_insert
 * or epd_kvtier_packed_free.  Touches no tier: any thread, one packer per
 * thread.  EPD_ERR_INVALID_PARAM, EPD_ERR_NO_MEMORY, EPD_ERR_IO (zstd). */
epd_status_t epd_kvtier_pack(epd_kvtier_packer_t *p, const epd_prefix_hash_t *key,
                             const void *payload, size_t len, size_t ckpt_len,
                             epd_kvtier_packed_t **pk_p);
/* Puts a packed block into the tier (taking it: freed when not kept), as
 * epd_kvtier_put would.  Same returns. */
epd_status_t epd_kvtier_insert(epd_kvtier_t *t, epd_kvtier_packed_t *pk);
/* NULL is a no-op. */
void epd_kvtier_packed_free(epd_kvtier_packed_t *pk);

/* Where key is (nothing changes). */
epd_kvtier_where_t epd_kvtier_where(const epd_kvtier_t *t, const epd_prefix_hash_t *key);

/* Restores key's payload into dst[0..cap): *len_p its length, *ckpt_len_p
 * the checkpoint's (its last bytes).  Verified against its XXH3-128 before
 * EPD_OK; the entry stays (most recently used).  EPD_ERR_NOT_FOUND;
 * EPD_ERR_CORRUPT (the checksum failed: the entry and its file are gone,
 * a warning names the file), EPD_ERR_MALFORMED (the file was refused: a
 * log line names it and why; the entry is gone), EPD_ERR_TOO_LONG (cap),
 * EPD_ERR_IO.  dst may be written on failure. */
epd_status_t epd_kvtier_get(epd_kvtier_t *t, const epd_prefix_hash_t *key, void *dst, size_t cap,
                            size_t *len_p, size_t *ckpt_len_p);

void epd_kvtier_stats(const epd_kvtier_t *t, epd_kvtier_stats_t *s_p);

/* Raw bytes per second of the successful gets so far (an EWMA); 0 before
 * the first. */
double epd_kvtier_restore_rate(const epd_kvtier_t *t);

/* Byte-plane shuffle of src[0..len) into dst (elements of `w` bytes; a
 * tail of len % w bytes copied as is) and its inverse.  Pure. */
void epd_kvtier_shuffle(const void *src, void *dst, size_t len, uint32_t w);
void epd_kvtier_unshuffle(const void *src, void *dst, size_t len, uint32_t w);

/* The file name of key inside the directory: 64 hex digits (out: 65 bytes). */
void epd_kvtier_file_name(const epd_prefix_hash_t *key, char out[65]);

#endif
