/*
 * epd_kvtier_pack.c — a block made ready for a tier (see epd_kvtier.h):
 * its XXH3-128, the byte-plane shuffle, zstd.  A packer is one thread's
 * compression context; what it packs is inserted into the tier by the
 * tier's own thread (epd_kvtier_insert), so that the compression — the
 * cost of a store — may run elsewhere.
 */
#include "epd_kvtier_int.h"

#include <string.h>

#include "epd_alloc.h"
#include "epd_hash.h"
#include "epd_log.h"

void epd_kvtier_shuffle(const void *src, void *dst, size_t len, uint32_t w)
{
    const unsigned char *s = src;
    unsigned char *d = dst;
    size_t n;

    if (w <= 1) {
        memcpy(d, s, len);
        return;
    }
    n = len / w;
    for (uint32_t j = 0; j < w; j++) {
        unsigned char *plane = d + (size_t)j * n;

        for (size_t i = 0; i < n; i++) {
            plane[i] = s[i * w + j];
        }
    }
    memcpy(d + n * w, s + n * w, len - n * w);
}

void epd_kvtier_unshuffle(const void *src, void *dst, size_t len, uint32_t w)
{
    const unsigned char *s = src;
    unsigned char *d = dst;
    size_t n;

    if (w <= 1) {
        memcpy(d, s, len);
        return;
    }
    n = len / w;
    for (uint32_t j = 0; j < w; j++) {
        const unsigned char *plane = s + (size_t)j * n;

        for (size_t i = 0; i < n; i++) {
            d[i * w + j] = plane[i];
        }
    }
    memcpy(d + n * w, s + n * w, len - n * w);
}
int epd__kvtier_grow(unsigned char **buf, size_t *cap, size_t need)
{
    unsigned char *p;

    if (need <= *cap) {
        return 0;
    }
    p = epd_realloc(*buf, need);
    if (p == NULL) {
        return -1;
    }
    *buf = p;
    *cap = need;
    return 0;
}

epd_status_t epd_kvtier_packer_create(const epd_kvtier_config_t *cfg, epd_kvtier_packer_t **p_p)
{
    epd_kvtier_packer_t *p = epd_calloc(1, sizeof(*p));

    if (p == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    p->level = cfg->level;
    p->shuffle = cfg->shuffle;
    p->cctx = ZSTD_createCCtx();
    if (p->cctx == NULL) {
        epd_free(p);
        return EPD_ERR_NO_MEMORY;
    }
    *p_p = p;
    return EPD_OK;
}

void epd_kvtier_packer_destroy(epd_kvtier_packer_t *p)
{
    if (p == NULL) {
        return;
    }
    ZSTD_freeCCtx(p->cctx);
    epd_free(p->scratch);
    epd_free(p->cbuf);
    epd_free(p);
}

epd_status_t epd_kvtier_pack(epd_kvtier_packer_t *p, const epd_prefix_hash_t *key,
                             const void *payload, size_t len, size_t ckpt_len,
                             epd_kvtier_packed_t **pk_p)
{
    size_t bound = ZSTD_compressBound(len);
    epd_kvtier_ent_t *e;
    size_t clen;

    if (ckpt_len > len) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (epd__kvtier_grow(&p->scratch, &p->scratch_cap, len) != 0 ||
        epd__kvtier_grow(&p->cbuf, &p->cbuf_cap, bound) != 0) {
        return EPD_ERR_NO_MEMORY;
    }
    e = epd_calloc(1, sizeof(*e));
    if (e == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    e->key = *key;
    e->raw_len = len;
    e->ckpt_len = ckpt_len;
    e->shuffle = p->shuffle;
    epd_hash128(payload, len, 0, e->sum);
    epd_kvtier_shuffle(payload, p->scratch, len, e->shuffle);
    clen = ZSTD_compressCCtx(p->cctx, p->cbuf, bound, p->scratch, len, p->level);
    if (ZSTD_isError(clen)) {
        epd_free(e);
        epd_log_warn("kvtier", 0, "kv tier: zstd: %s", ZSTD_getErrorName(clen));
        return EPD_ERR_IO;
    }
    e->comp_len = clen;
    e->data = epd_malloc(clen);
    if (e->data == NULL) {
        epd_free(e);
        return EPD_ERR_NO_MEMORY;
    }
    memcpy(e->data, p->cbuf, clen);
    *pk_p = e;
    return EPD_OK;
}

void epd_kvtier_packed_free(epd_kvtier_packed_t *pk)
{
    if (pk != NULL) {
        epd_free(pk->data);
        epd_free(pk);
    }
}
