/*
 * epd_prefill_tier.c — the host and disk tier of prefill's prefix cache
 * (kv/epd_kvtier.h): a role part called only by the cache part.
 *
 * A block the cache evicts from the pool is gathered — every attention
 * layer's part of it in layer order ([attn layer][2][kv_head][tok][dim],
 * the pool's dtype), then its recurrent-state checkpoint when it has one
 * ([linear layer][state]) — into one payload and put into the tier, which
 * compresses it (byte-plane shuffle by the KV element size, zstd at
 * --kv-tier-level) and keeps it in host memory, then on disk.  A prompt
 * whose next blocks miss the pool but are in the tier gets them back into
 * fresh pool blocks (the cache part inserts them as if the request had
 * computed them) when restoring is faster than computing: the restore
 * rate (raw bytes per second of the tier's gets, disk reads included)
 * against the prefill rate (tokens per second of finished runs), both
 * EWMAs; before either is measured it restores.  Every restored block was
 * verified against the XXH3-128 of its payload; one that fails is not
 * used, and the run of restored blocks stops there (the rest computes).
 *
 * Synchronous on the loop thread: compression at eviction, reads and
 * decompression at admission (docs/prefix-cache.md "Host and disk tier" has what a
 * block costs).  Loop thread only.
 */
#include <string.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_prefill_int.h"

epd_status_t epd__prefill_tier_init(epd_prefill_srv_t *srv)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    epd_kvtier_config_t cfg;
    size_t esz = epd_dtype_size(kv->dtype);
    epd_status_t st;

    if (srv->pcache == NULL || (srv->tier_host_bytes == 0 && srv->tier_dir == NULL)) {
        return EPD_OK;
    }
    memset(&cfg, 0, sizeof(cfg));
    cfg.ns = srv->proot;
    cfg.host_bytes = srv->tier_host_bytes;
    cfg.disk_dir = srv->tier_dir;
    cfg.disk_bytes = srv->tier_disk_bytes;
    cfg.persist = srv->tier_persist;
    cfg.level = srv->tier_level;
    cfg.shuffle = esz == 2 || esz == 4 ? (uint32_t)esz : 0;
    cfg.log_comp = EPD_PREFILL_LOG;
    srv->tier_blk_bytes = (size_t)epd_kv_block_set_bytes(kv);
    srv->tier_buf = epd_malloc(srv->tier_blk_bytes + srv->ckpt_bytes + 1);
    if (srv->tier_buf == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    st = epd_kvtier_create(&cfg, &srv->tier);
    if (st != EPD_OK) {
        return st;
    }
    epd_log_info(EPD_PREFILL_LOG, 0,
                 "kv tier on: host %llu bytes, disk %s (%llu bytes%s), zstd level %d, shuffle %u; "
                 "a block is %zu bytes (+ %llu of checkpoint)",
                 (unsigned long long)cfg.host_bytes, srv->tier_dir != NULL ? srv->tier_dir : "off",
                 (unsigned long long)cfg.disk_bytes, cfg.persist ? ", persistent" : "", cfg.level,
                 cfg.shuffle, srv->tier_blk_bytes, (unsigned long long)srv->ckpt_bytes);
    return EPD_OK;
}

void epd__prefill_tier_cleanup(epd_prefill_srv_t *srv)
{
    epd_kvtier_destroy(srv->tier);
    epd_free(srv->tier_buf);
    srv->tier = NULL;
    srv->tier_buf = NULL;
}

void epd__prefill_tier_store(epd_prefill_srv_t *srv, const epd_prefix_hash_t *key, uint32_t block,
                             const void *ckpt)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    const unsigned char *base = srv->pool.base;
    size_t off = 0;
    size_t ckpt_len = ckpt != NULL ? srv->ckpt_bytes : 0;
    epd_status_t st;

    for (uint32_t l = 0; l < kv->n_layers; l++) {
        uint64_t o;

        if (kv->kind[l] != EPD_LAYER_ATTENTION) {
            continue;
        }
        (void)epd_kv_block_offset(kv, srv->kv_blocks, l, block, &o);
        /* quantized blocks move as they are, scales included: no re-quantization */
        memcpy(srv->tier_buf + off, base + o, epd_kv_layer_block_bytes(kv, l));
        off += epd_kv_layer_block_bytes(kv, l);
    }
    if (ckpt_len > 0) {
        memcpy(srv->tier_buf + off, ckpt, ckpt_len);
    }
    st = epd_kvtier_put(srv->tier, key, srv->tier_buf, off + ckpt_len, ckpt_len);
    if (st != EPD_OK && st != EPD_ERR_TOO_LONG) {
        epd_log_warn(EPD_PREFILL_LOG, 0, "kv tier: block not kept: %s", epd_status_string(st));
    }
}

uint32_t epd__prefill_tier_worth(const epd_prefill_srv_t *srv, const epd_prefix_hash_t *keys,
                                 uint32_t n)
{
    uint32_t run = 0;
    double restore_bps = epd_kvtier_restore_rate(srv->tier);

    while (run < n && epd_kvtier_where(srv->tier, &keys[run]) != EPD_KVTIER_NONE) {
        run++;
    }
    if (run > 0 && restore_bps > 0 && srv->tier_tps > 0) {
        /* seconds per block either way */
        double restore_s = (double)(srv->tier_blk_bytes + srv->ckpt_bytes) / restore_bps;
        double compute_s = (double)srv->info->kv.block_tokens / srv->tier_tps;

        if (restore_s >= compute_s) {
            return 0;
        }
    }
    return run;
}

epd_status_t epd__prefill_tier_restore(epd_prefill_srv_t *srv, const epd_prefix_hash_t *key,
                                       uint32_t block, const void **ckpt_p)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    unsigned char *base = srv->pool.base;
    size_t len = 0, ckpt_len = 0, off = 0;
    epd_status_t st;

    st = epd_kvtier_get(srv->tier, key, srv->tier_buf, srv->tier_blk_bytes + srv->ckpt_bytes,
                        &len, &ckpt_len);
    if (st != EPD_OK) {
        return st;
    }
    if (len - ckpt_len != srv->tier_blk_bytes || (ckpt_len != 0 && ckpt_len != srv->ckpt_bytes)) {
        /* our namespace, so our layout: only a bug gets here */
        epd_log_error(EPD_PREFILL_LOG, 0, "kv tier: a block of %zu bytes (%zu of checkpoint), "
                      "expected %zu: not used", len, ckpt_len, srv->tier_blk_bytes);
        return EPD_ERR_MALFORMED;
    }
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        uint64_t o;

        if (kv->kind[l] != EPD_LAYER_ATTENTION) {
            continue;
        }
        (void)epd_kv_block_offset(kv, srv->kv_blocks, l, block, &o);
        memcpy(base + o, srv->tier_buf + off, epd_kv_layer_block_bytes(kv, l));
        off += epd_kv_layer_block_bytes(kv, l);
    }
    *ckpt_p = ckpt_len > 0 ? srv->tier_buf + off : NULL;
    return EPD_OK;
}

void epd__prefill_tier_ran(epd_prefill_srv_t *srv, uint64_t tokens, uint64_t ns)
{
    double tps;

    if (srv->tier == NULL || tokens == 0 || ns == 0) {
        return;
    }
    tps = (double)tokens * 1e9 / (double)ns;
    srv->tier_tps = srv->tier_tps == 0 ? tps : 0.75 * srv->tier_tps + 0.25 * tps;
}

void epd__prefill_tier_stats(const epd_prefill_srv_t *srv, epd_prefix_stats_t *s_p)
{
    epd_kvtier_stats_t t;

    if (srv->tier == NULL) {
        return;
    }
    epd_kvtier_stats(srv->tier, &t);
    s_p->tier_stored = t.stored;
    s_p->tier_spilled = t.spilled;
    s_p->tier_restored_host = t.restored_host;
    s_p->tier_restored_disk = t.restored_disk;
    s_p->tier_restore_us = t.restore_us;
    s_p->tier_checksum_failures = t.checksum_failures;
    s_p->tier_refused_files = t.refused_files;
    s_p->tier_dropped = t.dropped;
    s_p->tier_host_bytes = t.host_bytes;
    s_p->tier_disk_bytes = t.disk_bytes;
}
