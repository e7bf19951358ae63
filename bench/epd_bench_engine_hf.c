/*
 * epd_bench_engine_hf.c — `epd-bench engine --hf LIST [--hf-layers N]`:
 * the Hugging Face engine on random models shaped like real ones, at a
 * reduced layer count (every layer costs the same, so per-layer figures
 * carry over; the vocabulary is the real one, so the lm_head is too).
 * Per model, all in the same run so the machine's state is the same:
 *  - prefill tokens/s of a 512-token prompt, against OpenBLAS sgemm on the
 *    same matrix shapes (f32 weights widened beforehand, 512 rows; the
 *    experts of a MoE with 512 * top_k / experts rows each) — the engine's
 *    matrix work at BLAS speed, attention not counted;
 *  - decode tokens/s (batch 1, 128-token context, 32 steps) against the
 *    memory roofline: the weight bytes one token reads (every dense matrix,
 *    the chosen experts' share, the lm_head) over a read bandwidth
 *    measured here (summing a 256 MiB buffer);
 *  - resident memory growth of the process against the weight files' size
 *    plus the KV pool.
 * Models are written once into MODELS/hf-NAME-LlN and reused.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>

#include "epd_alloc.h"
#include "epd_bench.h"
#include "epd_engine.h"
#include "epd_hf_model.h"
#include "epd_rng.h"
#include "epd_time.h"

#define EPD_BH_PROMPT 512
#define EPD_BH_CTX 128
#define EPD_BH_STEPS 32

typedef struct {
    const char *name;
    epd_hf_arch_t arch;
    uint32_t dim, heads, kv_heads, head_dim, ffn, vocab, experts, top_k, moe_ffn;
    int tied;
} epd_bh_size_t;

/* Qwen2.5-0.5B and -1.5B, a small Qwen3-MoE (Qwen3-30B-A3B's attention
 * and vocabulary, 32 experts of 384), and a tiny one for the smoke test */
static const epd_bh_size_t epd_bh_sizes[] = {
    {"qwen-0.5b", EPD_HF_QWEN2, 896, 14, 2, 64, 4864, 151936, 0, 0, 0, 1},
    {"qwen-1.5b", EPD_HF_QWEN2, 1536, 12, 2, 128, 8960, 151936, 0, 0, 0, 1},
    {"moe", EPD_HF_QWEN3_MOE, 1024, 16, 4, 128, 0, 151936, 32, 4, 384, 0},
    {"tiny", EPD_HF_LLAMA, 64, 4, 2, 16, 128, 1024, 0, 0, 0, 0},
};

static uint64_t epd_bh_rss(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kb = 0;

    if (f == NULL) {
        return 0;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, "VmRSS: %llu kB", &kb) == 1) {
            break;
        }
    }
    fclose(f);
    return (uint64_t)kb << 10;
}

/* Bytes of the *.safetensors files in dir. */
static uint64_t epd_bh_file_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    uint64_t total = 0;

    if (d == NULL) {
        return 0;
    }
    while ((de = readdir(d)) != NULL) {
        char path[2048];
        struct stat st;
        size_t n = strlen(de->d_name);

        if (n > 12 && strcmp(de->d_name + n - 12, ".safetensors") == 0) {
            snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
            if (stat(path, &st) == 0) {
                total += (uint64_t)st.st_size;
            }
        }
    }
    closedir(d);
    return total;
}

/* Read bandwidth, bytes/s: the best of 3 sums over a 256 MiB buffer (far
 * past any cache of this class of machine). */
static double epd_bh_bandwidth(void)
{
    size_t n = (size_t)1 << 25; /* uint64 words: 256 MiB */
    uint64_t *buf = epd_malloc(n * sizeof(uint64_t));
    double best = 0.0;
    volatile uint64_t sink = 0;

    if (buf == NULL) {
        return 0.0;
    }
    for (size_t i = 0; i < n; i++) {
        buf[i] = i;
    }
    for (int rep = 0; rep < 3; rep++) {
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        uint64_t t0 = epd_time_now_ns();
        double secs;

        for (size_t i = 0; i < n; i += 4) {
            s0 += buf[i];
            s1 += buf[i + 1];
            s2 += buf[i + 2];
            s3 += buf[i + 3];
        }
        secs = (double)(epd_time_now_ns() - t0) / 1e9;
        sink += s0 + s1 + s2 + s3;
        if (secs > 0 && n * 8.0 / secs > best) {
            best = n * 8.0 / secs;
        }
    }
    (void)sink;
    epd_free(buf);
    return best;
}

/* Seconds of sgemm of `rows` x [out, in]^T, f32, the weight widened before. */
static double epd_bh_sgemm(uint32_t rows, uint32_t out, uint32_t in)
{
    float *x = epd_calloc((size_t)rows * in, sizeof(float));
    float *w = epd_calloc((size_t)out * in, sizeof(float));
    float *y = epd_calloc((size_t)rows * out, sizeof(float));
    double best = 1e30;

    if (x == NULL || w == NULL || y == NULL || rows == 0) {
        epd_free(x);
        epd_free(w);
        epd_free(y);
        return 0.0;
    }
    for (size_t i = 0; i < (size_t)rows * in; i++) {
        x[i] = (float)(i % 13) * 0.01f;
    }
    for (size_t i = 0; i < (size_t)out * in; i++) {
        w[i] = (float)(i % 7) * 0.01f;
    }
    for (int rep = 0; rep < 2; rep++) {
        uint64_t t0 = epd_time_now_ns();
        double s;

        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)out, (int)in, 1.0f, x,
                    (int)in, w, (int)in, 0.0f, y, (int)out);
        s = (double)(epd_time_now_ns() - t0) / 1e9;
        best = s < best ? s : best;
    }
    epd_free(x);
    epd_free(w);
    epd_free(y);
    return best;
}

/* The sgemm baseline of a 512-token prefill and the weight bytes of one
 * decode token (BF16). */
static void epd_bh_model_costs(const epd_bh_size_t *sz, uint32_t layers, double *sgemm_s,
                               double *token_bytes)
{
    uint32_t qd = sz->heads * sz->head_dim;
    uint32_t kvd = sz->kv_heads * sz->head_dim;
    double layer = 0.0;
    double bytes = 0.0;

    layer += epd_bh_sgemm(EPD_BH_PROMPT, qd, sz->dim);
    layer += 2 * epd_bh_sgemm(EPD_BH_PROMPT, kvd, sz->dim);
    layer += epd_bh_sgemm(EPD_BH_PROMPT, sz->dim, qd);
    bytes += 2.0 * sz->dim * (2.0 * qd + 2.0 * kvd);
    if (sz->experts == 0) {
        layer += 2 * epd_bh_sgemm(EPD_BH_PROMPT, sz->ffn, sz->dim);
        layer += epd_bh_sgemm(EPD_BH_PROMPT, sz->dim, sz->ffn);
        bytes += 2.0 * 3.0 * sz->dim * sz->ffn;
    } else {
        uint32_t m = EPD_BH_PROMPT * sz->top_k / sz->experts;

        layer += epd_bh_sgemm(EPD_BH_PROMPT, sz->experts, sz->dim);
        layer += sz->experts * (2 * epd_bh_sgemm(m, sz->moe_ffn, sz->dim) +
                                epd_bh_sgemm(m, sz->dim, sz->moe_ffn));
        bytes += 2.0 * sz->experts * sz->dim + 2.0 * 3.0 * sz->dim * sz->moe_ffn * sz->top_k;
    }
    *sgemm_s = layer * layers;
    *token_bytes = bytes * layers + 2.0 * sz->vocab * sz->dim; /* + the lm_head */
}

static int epd_bh_write(const epd_bh_size_t *sz, uint32_t layers, const char *dir)
{
    epd_hf_mkmodel_params_t p;
    char cfg[1100];
    struct stat st;

    snprintf(cfg, sizeof(cfg), "%s/config.json", dir);
    if (stat(cfg, &st) == 0) {
        return 0;
    }
    epd_hf_mkmodel_defaults(sz->arch, &p);
    p.hp.dim = sz->dim;
    p.hp.n_layers = layers;
    p.hp.n_heads = sz->heads;
    p.hp.n_kv_heads = sz->kv_heads;
    p.hp.head_dim = sz->head_dim;
    p.hp.ffn = sz->ffn;
    p.hp.vocab = sz->vocab;
    p.hp.n_experts = sz->experts;
    p.hp.top_k = sz->top_k;
    p.hp.moe_ffn = sz->moe_ffn;
    p.hp.tied = sz->tied;
    p.hp.max_context = 32768;
    if (epd_hf_mkmodel_write(&p, NULL, dir) != EPD_OK) {
        fprintf(stderr, "epd-bench engine: cannot write %s\n", dir);
        return 1;
    }
    return 0;
}

static int epd_bh_run(const epd_bh_size_t *sz, uint32_t layers, const char *dir, double bw)
{
    epd_engine_config_t cfg = {.model_dir = dir, .block_tokens = 16, .max_batch = 1};
    const epd_engine_info_t *info;
    epd_engine_t *e = NULL;
    epd_kv_pool_t pool = {0};
    uint32_t nb = (EPD_BH_PROMPT + EPD_BH_CTX + EPD_BH_STEPS + 15) / 16;
    uint32_t *table = NULL;
    int32_t toks[EPD_BH_PROMPT];
    float *logits = NULL;
    uint64_t rss0 = epd_bh_rss();
    uint64_t files = epd_bh_file_bytes(dir);
    double sgemm_s, token_bytes, tp, td;
    epd_prefill_args_t a;
    epd_decode_req_t r;
    epd_rng_t rng;
    uint64_t t0;
    int rc = 1;

    if (epd_engine_open("ref", &cfg, &e) != EPD_OK) {
        fprintf(stderr, "epd-bench engine: cannot open %s\n", dir);
        return 1;
    }
    info = epd_engine_info(e);
    pool.n_blocks = nb;
    pool.n_state_slots = 1;
    pool.bytes = epd_kv_pool_bytes(&info->kv, nb, 1);
    pool.base = epd_calloc(1, pool.bytes);
    table = epd_calloc(nb, sizeof(uint32_t));
    logits = epd_calloc(info->vocab_size, sizeof(float));
    if (pool.base == NULL || table == NULL || logits == NULL) {
        fprintf(stderr, "epd-bench engine: out of memory\n");
        goto out;
    }
    for (uint32_t i = 0; i < nb; i++) {
        table[i] = i;
    }
    epd_rng_seed(&rng, 42);
    for (uint32_t i = 0; i < EPD_BH_PROMPT; i++) {
        toks[i] = (int32_t)(epd_rng_next(&rng) % info->vocab_size);
    }
    a = (epd_prefill_args_t){
        .seq = {.req_id = 1, .block_table = table, .n_blocks = nb}, .tokens = toks, .n_tokens = 64};
    if (epd_engine_prefill(e, &pool, &a, NULL, logits) != EPD_OK) { /* warm-up */
        goto out;
    }
    a.n_tokens = EPD_BH_PROMPT;
    t0 = epd_time_now_ns();
    if (epd_engine_prefill(e, &pool, &a, NULL, logits) != EPD_OK) {
        goto out;
    }
    tp = (double)(epd_time_now_ns() - t0) / 1e9;
    a.n_tokens = EPD_BH_CTX;
    if (epd_engine_prefill(e, &pool, &a, NULL, logits) != EPD_OK) {
        goto out;
    }
    r = (epd_decode_req_t){.seq = a.seq, .pos = EPD_BH_CTX, .token = 7};
    t0 = epd_time_now_ns();
    for (uint32_t s = 0; s < EPD_BH_STEPS; s++) {
        if (epd_engine_decode(e, &pool, &r, 1, logits) != EPD_OK) {
            goto out;
        }
        r.pos++;
        r.token = (r.token * 31 + 7) % (int32_t)info->vocab_size;
    }
    td = (double)(epd_time_now_ns() - t0) / 1e9;
    {
        uint64_t rss = epd_bh_rss() - rss0;
        double denom = (double)files + (double)pool.bytes;

        epd_bh_model_costs(sz, layers, &sgemm_s, &token_bytes);
        printf("%-10s %6u %6u %10.0f %10.0f %6.2f %10.1f %10.1f %6.2f %8.0f %8.0f %6.2f\n",
               sz->name, layers, sz->dim, EPD_BH_PROMPT / tp, EPD_BH_PROMPT / sgemm_s, sgemm_s / tp,
               EPD_BH_STEPS / td, bw / token_bytes, (EPD_BH_STEPS / td) / (bw / token_bytes),
               rss / 1048576.0, denom / 1048576.0, rss / denom);
        fflush(stdout);
    }
    rc = 0;
out:
    epd_free(logits);
    epd_free(table);
    epd_free(pool.base);
    epd_engine_close(e);
    return rc;
}

int epd_bench_engine_hf(const char *models, const char *list, uint32_t layers)
{
    char buf[256];
    char *save = NULL;
    double bw = epd_bh_bandwidth();
    int rc = 0;

    printf("read bandwidth %.2f GB/s (256 MiB sum, best of 3)\n", bw / 1e9);
    printf("%-10s %6s %6s %10s %10s %6s %10s %10s %6s %8s %8s %6s\n", "hf model", "layers",
           "hidden", "prefill", "sgemm", "ratio", "decode", "roofline", "ratio", "rss", "file+kv",
           "ratio");
    printf("%-10s %6s %6s %10s %10s %6s %10s %10s %6s %8s %8s %6s\n", "", "", "", "tok/s", "tok/s",
           "", "tok/s", "tok/s", "", "MiB", "MiB", "");
    snprintf(buf, sizeof(buf), "%s", list);
    for (char *s = strtok_r(buf, ",", &save); s != NULL; s = strtok_r(NULL, ",", &save)) {
        const epd_bh_size_t *sz = NULL;
        char dir[1024];

        for (size_t i = 0; i < sizeof(epd_bh_sizes) / sizeof(epd_bh_sizes[0]); i++) {
            if (strcmp(epd_bh_sizes[i].name, s) == 0) {
                sz = &epd_bh_sizes[i];
            }
        }
        if (sz == NULL) {
            fprintf(stderr,
                    "epd-bench engine: unknown --hf model '%s' (qwen-0.5b, qwen-1.5b, "
                    "moe, tiny)\n",
                    s);
            rc = 1;
            continue;
        }
        mkdir(models, 0777);
        snprintf(dir, sizeof(dir), "%s/hf-%s-L%u", models, sz->name, layers);
        if (epd_bh_write(sz, layers, dir) != 0 || epd_bh_run(sz, layers, dir, bw) != 0) {
            rc = 1;
        }
    }
    return rc;
}
