/*
 * epd_kvtier_int.h — what the tier (epd_kvtier.c) and its packer
 * (epd_kvtier_pack.c) share: an entry, which is also a packed block on its
 * way into a tier, and a packer's compression context.
 */
#ifndef EPD_KVTIER_INT_H
#define EPD_KVTIER_INT_H

#include <zstd.h>

#include "epd_kvtier.h"

typedef struct epd_kvtier_ent {
    epd_prefix_hash_t key;
    struct epd_kvtier_ent *chain;      /* next of the bucket */
    struct epd_kvtier_ent *prev, *next; /* its tier's LRU list (prev: older) */
    epd_kvtier_where_t where;
    uint64_t raw_len, comp_len, ckpt_len;
    uint8_t sum[16];           /* XXH3-128 of the raw payload */
    uint32_t shuffle;          /* as stored */
    unsigned char *data;       /* host: comp_len bytes (owned) */
    uint64_t file_bytes;       /* disk: the file's size */
    uint64_t mtime_ns;         /* persist scan: order */
} epd_kvtier_ent_t;

struct epd_kvtier_packer {
    int level;
    uint32_t shuffle;
    ZSTD_CCtx *cctx;
    unsigned char *scratch; /* the shuffled payload */
    size_t scratch_cap;
    unsigned char *cbuf; /* the compressed bytes, before their own allocation */
    size_t cbuf_cap;
};

/* Grows *buf (epd_malloc'd, *cap bytes) to at least need bytes.  0 or -1. */
int epd__kvtier_grow(unsigned char **buf, size_t *cap, size_t need);

#endif
