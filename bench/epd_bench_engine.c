/*
 * epd_bench_engine.c — `epd-bench engine [--model DIR] [--sizes LIST]`:
 * prefill tokens/s (512 and 2048-token prompts) and decode tokens/s (batch
 * 1 and 8, 128-token contexts, 32 steps) of the ref engine.  Models of the
 * named sizes are written once into MODELS/bench-SIZE with the same code as
 * epd-mkmodel and reused afterwards.  Single compute thread, as in a daemon.
 * --hf LIST runs the Hugging Face table instead (epd_bench_engine_hf.c).
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "epd_alloc.h"
#include "epd_bench.h"
#include "epd_config.h"
#include "epd_engine.h"
#include "epd_mkmodel.h"
#include "epd_rng.h"
#include "epd_time.h"

#define EPD_BE_CTX 2048
#define EPD_BE_BATCH 8
#define EPD_BE_DECODE_CTX 128
#define EPD_BE_STEPS 32

typedef struct {
    const char *name;
    uint32_t dim, layers, heads, kv_heads, ffn;
} epd_be_size_t;

static const epd_be_size_t epd_be_sizes[] = {
    {"default", 256, 8, 8, 2, 768},
    {"medium", 384, 12, 12, 4, 1152},
    {"large", 512, 16, 16, 4, 1536},
};

typedef struct {
    epd_engine_t *engine;
    const epd_engine_info_t *info;
    epd_kv_pool_t pool;
    uint32_t blocks_per_req;
    uint32_t *tables; /* [BATCH][blocks_per_req] */
    int32_t *tokens;  /* [CTX] */
    float *logits;    /* [BATCH][vocab] */
} epd_be_t;

static double epd_be_prefill(epd_be_t *b, uint32_t req, uint32_t n)
{
    epd_prefill_args_t a = {
        .seq = {.req_id = req + 1,
                .block_table = b->tables + (size_t)req * b->blocks_per_req,
                .n_blocks = b->blocks_per_req,
                .state_slot = req},
        .tokens = b->tokens,
        .n_tokens = n,
        .start = 0,
    };
    uint64_t t0 = epd_time_now_ns();

    if (epd_engine_prefill(b->engine, &b->pool, &a, NULL, b->logits) != EPD_OK) {
        return -1.0;
    }
    return (double)(epd_time_now_ns() - t0) / 1e9;
}

static double epd_be_decode(epd_be_t *b, uint32_t batch)
{
    epd_decode_req_t reqs[EPD_BE_BATCH];
    uint64_t t0;

    for (uint32_t r = 0; r < batch; r++) {
        if (epd_be_prefill(b, r, EPD_BE_DECODE_CTX) < 0) {
            return -1.0;
        }
        reqs[r].seq.req_id = r + 1;
        reqs[r].seq.block_table = b->tables + (size_t)r * b->blocks_per_req;
        reqs[r].seq.n_blocks = b->blocks_per_req;
        reqs[r].seq.state_slot = r;
        reqs[r].pos = EPD_BE_DECODE_CTX;
        reqs[r].token = (int32_t)(r * 7 + 1);
    }
    t0 = epd_time_now_ns();
    for (uint32_t s = 0; s < EPD_BE_STEPS; s++) {
        if (epd_engine_decode(b->engine, &b->pool, reqs, batch, b->logits) != EPD_OK) {
            return -1.0;
        }
        for (uint32_t r = 0; r < batch; r++) {
            reqs[r].pos++;
            reqs[r].token = (int32_t)((reqs[r].token * 31 + 7) % 256);
        }
    }
    return (double)(epd_time_now_ns() - t0) / 1e9;
}

static int epd_be_run(const char *label, const char *dir)
{
    epd_engine_config_t cfg = {.model_dir = dir, .block_tokens = 16, .max_batch = EPD_BE_BATCH};
    epd_be_t b;
    epd_rng_t rng;
    double t512, t2048, td1, td8;
    int rc = 1;

    memset(&b, 0, sizeof(b));
    if (epd_engine_open("ref", &cfg, &b.engine) != EPD_OK) {
        fprintf(stderr, "epd-bench engine: cannot open %s\n", dir);
        return 1;
    }
    b.info = epd_engine_info(b.engine);
    if (b.info->max_context < EPD_BE_CTX) {
        fprintf(stderr, "epd-bench engine: %s: context %u < %d\n", dir, b.info->max_context,
                EPD_BE_CTX);
        goto out;
    }
    b.blocks_per_req = (EPD_BE_CTX + b.info->kv.block_tokens - 1) / b.info->kv.block_tokens;
    b.pool.n_blocks = b.blocks_per_req * EPD_BE_BATCH;
    b.pool.n_state_slots = EPD_BE_BATCH;
    b.pool.bytes = epd_kv_pool_bytes(&b.info->kv, b.pool.n_blocks, b.pool.n_state_slots);
    b.pool.base = epd_calloc(1, b.pool.bytes);
    b.tables = epd_calloc((size_t)b.pool.n_blocks, sizeof(uint32_t));
    b.tokens = epd_calloc(EPD_BE_CTX, sizeof(int32_t));
    b.logits = epd_calloc((size_t)EPD_BE_BATCH * b.info->vocab_size, sizeof(float));
    if (b.pool.base == NULL || b.tables == NULL || b.tokens == NULL || b.logits == NULL) {
        fprintf(stderr, "epd-bench engine: out of memory\n");
        goto out;
    }
    for (uint32_t i = 0; i < b.pool.n_blocks; i++) {
        b.tables[i] = i;
    }
    epd_rng_seed(&rng, 42);
    for (uint32_t i = 0; i < EPD_BE_CTX; i++) {
        b.tokens[i] = (int32_t)(epd_rng_next(&rng) % 256);
    }
    epd_be_prefill(&b, 0, 64); /* warm up caches and OpenBLAS */
    t512 = epd_be_prefill(&b, 0, 512);
    t2048 = epd_be_prefill(&b, 0, 2048);
    td1 = epd_be_decode(&b, 1);
    td8 = epd_be_decode(&b, EPD_BE_BATCH);
    if (t512 <= 0 || t2048 <= 0 || td1 <= 0 || td8 <= 0) {
        fprintf(stderr, "epd-bench engine: %s: a run failed\n", dir);
        goto out;
    }
    printf("%-10s %6u %6u %12.0f %12.0f %12.0f %12.0f %10.3f\n", label, b.info->kv.n_layers,
           b.info->kv.head_dim * b.info->kv.n_state_heads, 512 / t512, 2048 / t2048,
           EPD_BE_STEPS / td1, EPD_BE_BATCH * EPD_BE_STEPS / td8, t2048);
    fflush(stdout);
    rc = 0;
out:
    epd_free(b.logits);
    epd_free(b.tokens);
    epd_free(b.tables);
    epd_free(b.pool.base);
    epd_engine_close(b.engine);
    return rc;
}

static int epd_be_size(const char *models, const char *name)
{
    const epd_be_size_t *sz = NULL;
    epd_mkmodel_params_t p;
    char dir[1024];
    char cfg[1100];
    struct stat st;

    for (size_t i = 0; i < sizeof(epd_be_sizes) / sizeof(epd_be_sizes[0]); i++) {
        if (strcmp(epd_be_sizes[i].name, name) == 0) {
            sz = &epd_be_sizes[i];
        }
    }
    if (sz == NULL) {
        fprintf(stderr, "epd-bench engine: unknown size '%s' (default, medium, large)\n", name);
        return 1;
    }
    snprintf(dir, sizeof(dir), "%s/bench-%s", models, name);
    snprintf(cfg, sizeof(cfg), "%s/config.json", dir);
    if (stat(cfg, &st) != 0) {
        epd_mkmodel_defaults(&p);
        p.hp.dim = sz->dim;
        p.hp.n_layers = sz->layers;
        p.hp.n_heads = sz->heads;
        p.hp.n_kv_heads = sz->kv_heads;
        p.hp.head_dim = sz->dim / sz->heads;
        p.hp.ffn = sz->ffn;
        mkdir(models, 0777);
        if (epd_mkmodel_write(&p, dir) != EPD_OK) {
            fprintf(stderr, "epd-bench engine: cannot write %s\n", dir);
            return 1;
        }
    }
    return epd_be_run(name, dir);
}

int epd_bench_engine_main(int argc, char **argv)
{
    const char *model = NULL;
    const char *sizes = "default,medium";
    const char *models = "build/models";
    const char *hf = NULL;
    int64_t hf_layers = 4;
    const epd_opt_t opts[] = {
        {"model", EPD_OPT_STRING, &model, 0, 0, "bench this model folder only"},
        {"sizes", EPD_OPT_STRING, &sizes, 0, 0, "built-in sizes: default, medium, large"},
        {"models-dir", EPD_OPT_STRING, &models, 0, 0, "where bench models are written"},
        {"hf", EPD_OPT_STRING, &hf, 0, 0,
         "Hugging Face models instead, comma-separated: qwen-0.5b, qwen-1.5b, moe, tiny "
         "(prefill vs sgemm, decode vs the memory roofline, RSS vs the file)"},
        {"hf-layers", EPD_OPT_INT, &hf_layers, 1, 256, "layers of the --hf models"},
    };
    epd_opts_t o = {.prog = "epd-bench engine",
                    .summary = "prefill and decode tokens/s of the ref engine",
                    .opts = opts,
                    .n_opts = sizeof(opts) / sizeof(opts[0])};
    char list[256];
    char *save = NULL;
    epd_status_t status;
    int argi;
    int rc = 0;

    status = epd_opts_parse(&o, argc, argv, &argi);
    if (status != EPD_OK) {
        epd_opts_cleanup(&o);
        return status == EPD_ERR_CANCELED ? 0 : 2;
    }
    if (hf != NULL) {
        rc = epd_bench_engine_hf(models, hf, (uint32_t)hf_layers);
        epd_opts_cleanup(&o);
        return rc;
    }
    printf("%-10s %6s %6s %12s %12s %12s %12s %10s\n", "model", "layers", "dim", "prefill512",
           "prefill2048", "decode_b1", "decode_b8", "2048_s");
    printf("%-10s %6s %6s %12s %12s %12s %12s %10s\n", "", "", "", "tok/s", "tok/s", "tok/s",
           "tok/s", "");
    if (model != NULL) {
        rc = epd_be_run("custom", model);
    } else {
        snprintf(list, sizeof(list), "%s", sizes);
        for (char *s = strtok_r(list, ",", &save); s != NULL; s = strtok_r(NULL, ",", &save)) {
            rc |= epd_be_size(models, s);
        }
    }
    epd_opts_cleanup(&o);
    return rc;
}
