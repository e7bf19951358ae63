/*
 * epd_bench_kvtier.c — `epd-bench kvtier [--model DIR] [--tokens N]`: how
 * well zstd compresses the ref engine's real KV, block by block as the
 * prefix cache's host/disk tier stores it (kv/epd_kvtier.h).
 *
 * Runs one prefill of N random tokens (default model: epd-mkmodel's
 * defaults, written once into MODELS/bench-kvtier), gathers each full
 * block's KV of every attention layer (the tier's payload), and for zstd
 * levels 1, 3, 6, 9 and 19, each without a shuffle and with byte-plane
 * shuffles of 2 and 4 bytes, compresses and decompresses every block on
 * its own (as the tier does), all in one run: ratio, compress MB/s
 * (shuffle + compress) and decompress MB/s (decompress + unshuffle), of
 * raw bytes, best of --reps.  Then what one block costs through the tier
 * itself at --level (put; get from host memory; put and get through a
 * disk directory, page cache warm), next to what computing a block's
 * tokens cost in that prefill.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zstd.h>

#include "epd_alloc.h"
#include "epd_bench.h"
#include "epd_config.h"
#include "epd_engine.h"
#include "epd_kvtier.h"
#include "epd_mkmodel.h"
#include "epd_rng.h"
#include "epd_time.h"

typedef struct {
    unsigned char *kv; /* [n_blocks][blk_bytes]: each block's attention KV, layer order */
    uint32_t n_blocks;
    size_t blk_bytes;
    double prefill_s;
    uint32_t n_tokens;
    epd_dtype_t dtype;
} epd_bk_kv_t;

static double epd_bk_now(void)
{
    return (double)epd_time_now_ns() / 1e9;
}

/* Prefills n tokens of model dir and gathers its full blocks into *kv_p. */
static int epd_bk_prefill(const char *dir, const char *kv_dtype, uint32_t n, epd_bk_kv_t *kv_p)
{
    epd_engine_config_t cfg = {.model_dir = dir, .block_tokens = 16, .max_batch = 1,
                               .kv_dtype = kv_dtype};
    const epd_engine_info_t *info;
    epd_engine_t *engine = NULL;
    epd_kv_pool_t pool;
    uint32_t *table = NULL;
    int32_t *tokens = NULL;
    float *logits = NULL;
    uint32_t nb;
    epd_rng_t rng;
    double t0;
    int rc = 1;

    memset(&pool, 0, sizeof(pool));
    if (epd_engine_open("ref", &cfg, &engine) != EPD_OK) {
        fprintf(stderr, "epd-bench kvtier: cannot open %s\n", dir);
        return 1;
    }
    info = epd_engine_info(engine);
    if (n > info->max_context) {
        n = info->max_context;
    }
    nb = (n + info->kv.block_tokens - 1) / info->kv.block_tokens;
    pool.n_blocks = nb;
    pool.n_state_slots = 1;
    pool.bytes = epd_kv_pool_bytes(&info->kv, nb, 1);
    pool.base = epd_calloc(1, pool.bytes);
    table = epd_calloc(nb, sizeof(*table));
    tokens = epd_calloc(n, sizeof(*tokens));
    logits = epd_calloc(info->vocab_size, sizeof(*logits));
    kv_p->n_blocks = n / info->kv.block_tokens;
    kv_p->blk_bytes = (size_t)epd_kv_block_set_bytes(&info->kv);
    kv_p->kv = epd_malloc(kv_p->n_blocks * kv_p->blk_bytes + 1);
    if (pool.base == NULL || table == NULL || tokens == NULL || logits == NULL ||
        kv_p->kv == NULL) {
        fprintf(stderr, "epd-bench kvtier: out of memory\n");
        goto out;
    }
    for (uint32_t i = 0; i < nb; i++) {
        table[i] = i;
    }
    epd_rng_seed(&rng, 42);
    for (uint32_t i = 0; i < n; i++) {
        tokens[i] = (int32_t)(epd_rng_next(&rng) % (info->vocab_size > 2 ? info->vocab_size - 2
                                                                           : 1));
    }
    {
        epd_prefill_args_t a = {
            .seq = {.req_id = 1, .block_table = table, .n_blocks = nb, .state_slot = 0},
            .tokens = tokens,
            .n_tokens = n,
            .start = 0,
        };

        t0 = epd_bk_now();
        if (epd_engine_prefill(engine, &pool, &a, NULL, logits) != EPD_OK) {
            fprintf(stderr, "epd-bench kvtier: prefill failed\n");
            goto out;
        }
        kv_p->prefill_s = epd_bk_now() - t0;
    }
    for (uint32_t b = 0; b < kv_p->n_blocks; b++) {
        size_t off = 0;

        for (uint32_t l = 0; l < info->kv.n_layers; l++) {
            uint64_t o;

            if (info->kv.kind[l] != EPD_LAYER_ATTENTION) {
                continue;
            }
            (void)epd_kv_block_offset(&info->kv, nb, l, b, &o);
            memcpy(kv_p->kv + b * kv_p->blk_bytes + off, (unsigned char *)pool.base + o,
                   epd_kv_layer_block_bytes(&info->kv, l));
            off += epd_kv_layer_block_bytes(&info->kv, l);
        }
    }
    kv_p->n_tokens = n;
    kv_p->dtype = info->kv.dtype;
    printf("model %s: %u layers (%u attention), dtype %s, a block of %u tokens = %zu bytes of "
           "KV; %u tokens prefilled in %.3f s (%.0f us per block of tokens)\n\n",
           dir, info->kv.n_layers, info->kv.n_attn_layers, epd_dtype_name(info->kv.dtype),
           info->kv.block_tokens, kv_p->blk_bytes, n, kv_p->prefill_s,
           kv_p->prefill_s * 1e6 * info->kv.block_tokens / n);
    rc = 0;
out:
    epd_free(logits);
    epd_free(tokens);
    epd_free(table);
    epd_free(pool.base);
    epd_engine_close(engine);
    return rc;
}

/* One row: every block compressed and decompressed on its own. */
static int epd_bk_row(const epd_bk_kv_t *kv, int level, uint32_t shuffle, int reps)
{
    size_t bound = ZSTD_compressBound(kv->blk_bytes);
    unsigned char *shuf = epd_malloc(kv->blk_bytes);
    unsigned char *comp = epd_malloc(bound * kv->n_blocks);
    unsigned char *out = epd_malloc(kv->blk_bytes);
    size_t *clen = epd_calloc(kv->n_blocks, sizeof(*clen));
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    ZSTD_DCtx *dc = ZSTD_createDCtx();
    double best_c = 1e30, best_d = 1e30;
    uint64_t total_c = 0;
    int rc = 1;

    if (shuf == NULL || comp == NULL || out == NULL || clen == NULL || cc == NULL || dc == NULL) {
        goto out;
    }
    for (int r = 0; r < reps; r++) {
        double t0 = epd_bk_now();

        total_c = 0;
        for (uint32_t b = 0; b < kv->n_blocks; b++) {
            epd_kvtier_shuffle(kv->kv + b * kv->blk_bytes, shuf, kv->blk_bytes, shuffle);
            clen[b] = ZSTD_compressCCtx(cc, comp + b * bound, bound, shuf, kv->blk_bytes, level);
            if (ZSTD_isError(clen[b])) {
                goto out;
            }
            total_c += clen[b];
        }
        t0 = epd_bk_now() - t0;
        best_c = t0 < best_c ? t0 : best_c;
        t0 = epd_bk_now();
        for (uint32_t b = 0; b < kv->n_blocks; b++) {
            size_t d = ZSTD_decompressDCtx(dc, shuf, kv->blk_bytes, comp + b * bound, clen[b]);

            if (ZSTD_isError(d) || d != kv->blk_bytes) {
                goto out;
            }
            epd_kvtier_unshuffle(shuf, out, kv->blk_bytes, shuffle);
        }
        t0 = epd_bk_now() - t0;
        best_d = t0 < best_d ? t0 : best_d;
        if (memcmp(out, kv->kv + (size_t)(kv->n_blocks - 1) * kv->blk_bytes, kv->blk_bytes) != 0) {
            fprintf(stderr, "epd-bench kvtier: round trip differs\n");
            goto out;
        }
    }
    {
        double raw_mb = (double)kv->n_blocks * (double)kv->blk_bytes / 1e6;

        printf("%6d %8s %8.3f %12.0f %12.0f %14.1f\n", level,
               shuffle > 1 ? (shuffle == 2 ? "16-bit" : "32-bit") : "none",
               (double)kv->n_blocks * (double)kv->blk_bytes / (double)total_c, raw_mb / best_c,
               raw_mb / best_d, best_c * 1e6 / kv->n_blocks);
    }
    rc = 0;
out:
    if (rc != 0) {
        fprintf(stderr, "epd-bench kvtier: level %d shuffle %u failed\n", level, shuffle);
    }
    ZSTD_freeCCtx(cc);
    ZSTD_freeDCtx(dc);
    epd_free(clen);
    epd_free(out);
    epd_free(comp);
    epd_free(shuf);
    return rc;
}

/* Microseconds per block through the tier itself: put, get (host), and
 * with dir: put and get through files. */
static int epd_bk_tier(const epd_bk_kv_t *kv, int level, uint32_t shuffle, const char *dir)
{
    epd_kvtier_config_t cfg;
    unsigned char *buf = epd_malloc(kv->blk_bytes);
    double put_us[2] = {0, 0}, get_us[2] = {0, 0};
    int rc = 1;

    if (buf == NULL) {
        return 1;
    }
    for (int disk = 0; disk < 2; disk++) {
        epd_kvtier_t *t = NULL;
        double t0;

        memset(&cfg, 0, sizeof(cfg));
        memset(cfg.ns.b, 0x5a, sizeof(cfg.ns.b));
        cfg.host_bytes = disk ? 0 : (uint64_t)kv->n_blocks * kv->blk_bytes * 2;
        cfg.disk_dir = disk ? dir : NULL;
        cfg.disk_bytes = disk ? (uint64_t)kv->n_blocks * kv->blk_bytes * 2 : 0;
        cfg.level = level;
        cfg.shuffle = shuffle;
        cfg.log_comp = "bench";
        if (epd_kvtier_create(&cfg, &t) != EPD_OK) {
            goto out;
        }
        t0 = epd_bk_now();
        for (uint32_t b = 0; b < kv->n_blocks; b++) {
            epd_prefix_hash_t k;

            memset(&k, 0, sizeof(k));
            memcpy(k.b, &b, sizeof(b));
            if (epd_kvtier_put(t, &k, kv->kv + b * kv->blk_bytes, kv->blk_bytes, 0) != EPD_OK) {
                epd_kvtier_destroy(t);
                goto out;
            }
        }
        put_us[disk] = (epd_bk_now() - t0) * 1e6 / kv->n_blocks;
        t0 = epd_bk_now();
        for (uint32_t b = 0; b < kv->n_blocks; b++) {
            epd_prefix_hash_t k;
            size_t len, cl;

            memset(&k, 0, sizeof(k));
            memcpy(k.b, &b, sizeof(b));
            if (epd_kvtier_get(t, &k, buf, kv->blk_bytes, &len, &cl) != EPD_OK) {
                epd_kvtier_destroy(t);
                goto out;
            }
        }
        get_us[disk] = (epd_bk_now() - t0) * 1e6 / kv->n_blocks;
        epd_kvtier_destroy(t);
        if (dir == NULL) {
            break;
        }
    }
    printf("\nthrough the tier (level %d, shuffle %u, XXH3-128 included), per block of %zu bytes:\n"
           "  host: put %.1f us, get %.1f us\n", level, shuffle, kv->blk_bytes, put_us[0],
           get_us[0]);
    if (dir != NULL) {
        printf("  disk (%s, page cache warm): put %.1f us, get %.1f us\n", dir, put_us[1],
               get_us[1]);
    }
    printf("  computing a block's tokens in this prefill: %.1f us\n",
           kv->prefill_s * 1e6 / kv->n_blocks);
    rc = 0;
out:
    epd_free(buf);
    if (rc != 0) {
        fprintf(stderr, "epd-bench kvtier: the tier failed\n");
    }
    return rc;
}

int epd_bench_kvtier_main(int argc, char **argv)
{
    const char *model = NULL;
    const char *models = "build/models";
    const char *disk = NULL;
    const char *kv_dtype = NULL;
    int64_t n_tokens = 1024;
    int64_t reps = 3;
    int64_t level = 1;
    const epd_opt_t opts[] = {
        {"model", EPD_OPT_STRING, &model, 0, 0,
         "model folder (default: epd-mkmodel's defaults, written into MODELS/bench-kvtier)"},
        {"models-dir", EPD_OPT_STRING, &models, 0, 0, "where the default model is written"},
        {"tokens", EPD_OPT_INT, &n_tokens, 16, 1 << 20, "prompt tokens prefilled"},
        {"reps", EPD_OPT_INT, &reps, 1, 1000, "repetitions per row (best is printed)"},
        {"level", EPD_OPT_INT, &level, 1, 19, "zstd level of the tier's own costs"},
        {"disk", EPD_OPT_STRING, &disk, 0, 0, "a directory for the tier's disk costs (optional)"},
        {"kv-dtype", EPD_OPT_STRING, &kv_dtype, 0, 0,
         "the engine's KV dtype map (f32, bf16, fp8, int8, \"0-3:bf16,4-:fp8\"): the blocks the "
         "tier stores as they are"},
    };
    epd_opts_t o = {.prog = "epd-bench kvtier",
                    .summary = "zstd ratio and speed on the ref engine's KV blocks",
                    .opts = opts,
                    .n_opts = sizeof(opts) / sizeof(opts[0])};
    static const int levels[] = {1, 3, 6, 9, 19};
    static const uint32_t shuffles[] = {0, 2, 4};
    char dir[1024];
    epd_bk_kv_t kv;
    epd_status_t status;
    int argi;
    int rc = 0;

    memset(&kv, 0, sizeof(kv));
    status = epd_opts_parse(&o, argc, argv, &argi);
    if (status != EPD_OK) {
        epd_opts_cleanup(&o);
        return status == EPD_ERR_CANCELED ? 0 : 2;
    }
    if (model == NULL) {
        char cfg[1100];
        struct stat st;

        snprintf(dir, sizeof(dir), "%s/bench-kvtier", models);
        snprintf(cfg, sizeof(cfg), "%s/config.json", dir);
        if (stat(cfg, &st) != 0) {
            epd_mkmodel_params_t p;

            epd_mkmodel_defaults(&p);
            mkdir(models, 0777);
            if (epd_mkmodel_write(&p, dir) != EPD_OK) {
                fprintf(stderr, "epd-bench kvtier: cannot write %s\n", dir);
                epd_opts_cleanup(&o);
                return 1;
            }
        }
        model = dir;
    }
    if (epd_bk_prefill(model, kv_dtype, (uint32_t)n_tokens, &kv) != 0 || kv.n_blocks == 0) {
        epd_free(kv.kv);
        epd_opts_cleanup(&o);
        return 1;
    }
    printf("%6s %8s %8s %12s %12s %14s\n", "level", "shuffle", "ratio", "compress", "decompress",
           "compress");
    printf("%6s %8s %8s %12s %12s %14s\n", "", "", "", "MB/s", "MB/s", "us/block");
    for (size_t li = 0; li < sizeof(levels) / sizeof(levels[0]); li++) {
        for (size_t si = 0; si < sizeof(shuffles) / sizeof(shuffles[0]); si++) {
            rc |= epd_bk_row(&kv, levels[li], shuffles[si], (int)reps);
        }
    }
    rc |= epd_bk_tier(&kv, (int)level, (uint32_t)epd_dtype_size(kv.dtype), disk);
    epd_free(kv.kv);
    epd_opts_cleanup(&o);
    return rc;
}
