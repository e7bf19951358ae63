/*
 * epd_bench_kvq.c — `epd-bench kvq --model DIR [--maps LIST]`: what a KV
 * dtype map costs in accuracy and saves in bytes.
 *
 * For --prompts random prompts of --prompt-len tokens (seeded), the f32-KV
 * engine generates --tokens greedy tokens; each map's engine then runs the
 * same prompt and is fed the same tokens (teacher forcing), and at every one
 * of the --tokens positions its next-token distribution is compared with
 * f32's: top-1 agreement (argmax equal) and KL(p_f32 || p_map) in nats.
 * Bytes per request are the attention KV of prompt + generated tokens in
 * whole blocks, scales included (what prefill sends and decode holds), and
 * the recurrent state (f32 whatever the map).  Random weights are not a
 * trained model's distribution: run it on your own checkpoint for numbers
 * that mean something for it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_bench.h"
#include "epd_config.h"
#include "epd_engine.h"
#include "epd_kvq.h"
#include "epd_rng.h"

typedef struct {
    epd_engine_t *engine;
    const epd_engine_info_t *info;
    epd_kv_pool_t pool;
    uint32_t *table;
    uint32_t nb;
} epd_bq_eng_t;

static void epd_bq_close(epd_bq_eng_t *e)
{
    epd_free(e->pool.base);
    epd_free(e->table);
    epd_engine_close(e->engine);
    memset(e, 0, sizeof(*e));
}

/* Opens `engine` on `dir` with map (NULL: f32) and a pool for n tokens. */
static int epd_bq_open(const char *engine, const char *dir, const char *map, uint32_t n,
                       epd_bq_eng_t *e)
{
    epd_engine_config_t cfg = {.model_dir = dir, .block_tokens = 16, .max_batch = 1,
                               .kv_dtype = map};

    memset(e, 0, sizeof(*e));
    if (epd_engine_open(engine, &cfg, &e->engine) != EPD_OK) {
        fprintf(stderr, "epd-bench kvq: cannot open %s with --kv-dtype %s\n", dir,
                map != NULL ? map : "f32");
        return 1;
    }
    e->info = epd_engine_info(e->engine);
    e->nb = (n + e->info->kv.block_tokens - 1) / e->info->kv.block_tokens;
    e->pool.n_blocks = e->nb;
    e->pool.n_state_slots = 1;
    e->pool.bytes = epd_kv_pool_bytes(&e->info->kv, e->nb, 1);
    e->pool.base = epd_calloc(1, e->pool.bytes);
    e->table = epd_calloc(e->nb, sizeof(*e->table));
    if (e->pool.base == NULL || e->table == NULL) {
        epd_bq_close(e);
        return 1;
    }
    for (uint32_t i = 0; i < e->nb; i++) {
        e->table[i] = i;
    }
    return 0;
}

/* Runs prompt[0..np) then tokens gen[0..ng-1) one by one; logits of the
 * ng positions into out[ng][vocab]. */
static int epd_bq_run(epd_bq_eng_t *e, const int32_t *prompt, uint32_t np, const int32_t *gen,
                      uint32_t ng, float *out)
{
    uint32_t V = e->info->vocab_size;
    epd_prefill_args_t a = {
        .seq = {.req_id = 1, .block_table = e->table, .n_blocks = e->nb, .state_slot = 0},
        .tokens = prompt,
        .n_tokens = np,
    };

    if (epd_engine_prefill(e->engine, &e->pool, &a, NULL, out) != EPD_OK) {
        return 1;
    }
    for (uint32_t t = 1; t < ng; t++) {
        epd_decode_req_t r = {.seq = a.seq, .pos = np + t - 1, .token = gen[t - 1]};

        if (epd_engine_decode(e->engine, &e->pool, &r, 1, out + (size_t)t * V) != EPD_OK) {
            return 1;
        }
    }
    epd_engine_release(e->engine, &e->pool, &a.seq);
    return 0;
}

static uint32_t epd_bq_argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;

    for (uint32_t i = 1; i < n; i++) {
        best = x[i] > x[best] ? i : best;
    }
    return best;
}

/* KL(softmax(p) || softmax(q)) in nats, in double. */
static double epd_bq_kl(const float *p, const float *q, uint32_t n)
{
    double mp = p[epd_bq_argmax(p, n)];
    double mq = q[epd_bq_argmax(q, n)];
    double zp = 0.0;
    double zq = 0.0;
    double kl = 0.0;

    for (uint32_t i = 0; i < n; i++) {
        zp += exp(p[i] - mp);
        zq += exp(q[i] - mq);
    }
    for (uint32_t i = 0; i < n; i++) {
        double lp = p[i] - mp - log(zp);
        double lq = q[i] - mq - log(zq);

        kl += exp(lp) * (lp - lq);
    }
    return kl;
}

int epd_bench_kvq_main(int argc, char **argv)
{
    const char *model = NULL;
    const char *engine = "ref";
    const char *maps = "bf16,fp8,int8";
    const char *mixed = NULL;
    int64_t n_prompts = 64;
    int64_t n_gen = 64;
    int64_t plen = 32;
    int64_t seed = 1;
    const epd_opt_t opts[] = {
        {"model", EPD_OPT_STRING, &model, 0, 0, "model folder (required)"},
        {"engine", EPD_OPT_STRING, &engine, 0, 0, "engine (ref serves ref and HF folders)"},
        {"maps", EPD_OPT_STRING, &maps, 0, 0, "comma-separated uniform dtypes to compare"},
        {"mixed", EPD_OPT_STRING, &mixed, 0, 0,
         "one per-layer map compared too, e.g. \"0-3:bf16,4-:fp8\""},
        {"prompts", EPD_OPT_INT, &n_prompts, 1, 100000, "random prompts"},
        {"tokens", EPD_OPT_INT, &n_gen, 1, 100000, "positions compared per prompt"},
        {"prompt-len", EPD_OPT_INT, &plen, 1, 100000, "prompt tokens"},
        {"seed", EPD_OPT_INT, &seed, 0, 0, "prompt seed"},
    };
    epd_opts_t o = {.prog = "epd-bench kvq",
                    .summary = "top-1 agreement, KL vs f32 KV and bytes per request per KV dtype",
                    .opts = opts,
                    .n_opts = sizeof(opts) / sizeof(opts[0])};
    char list[EPD_KVQ_MAP_MAX * 2];
    const char *names[16];
    uint32_t n_maps = 0;
    epd_bq_eng_t ref;
    epd_bq_eng_t eng[16];
    uint64_t agree[16] = {0};
    double kl[16] = {0};
    int32_t *prompts = NULL;
    int32_t *gen = NULL;
    float *lref = NULL;
    float *lq = NULL;
    uint32_t n;
    uint32_t V;
    epd_rng_t rng;
    epd_status_t status;
    int argi;
    int rc = 1;

    memset(&ref, 0, sizeof(ref));
    memset(eng, 0, sizeof(eng));
    status = epd_opts_parse(&o, argc, argv, &argi);
    if (status != EPD_OK) {
        epd_opts_cleanup(&o);
        return status == EPD_ERR_CANCELED ? 0 : 2;
    }
    if (model == NULL) {
        fprintf(stderr, "epd-bench kvq: --model is required\n");
        goto out;
    }
    snprintf(list, sizeof(list), "%s", maps);
    names[n_maps++] = "f32";
    for (char *s = strtok(list, ","); s != NULL && n_maps < 15; s = strtok(NULL, ",")) {
        names[n_maps++] = s;
    }
    if (mixed != NULL) {
        names[n_maps++] = mixed;
    }
    n = (uint32_t)(plen + n_gen);
    if (epd_bq_open(engine, model, NULL, n, &ref) != 0) {
        goto out;
    }
    V = ref.info->vocab_size;
    prompts = epd_calloc((size_t)plen, sizeof(int32_t));
    gen = epd_calloc((size_t)n_gen, sizeof(int32_t));
    lref = epd_calloc((size_t)n_gen * V, sizeof(float));
    lq = epd_calloc((size_t)n_gen * V, sizeof(float));
    if (prompts == NULL || gen == NULL || lref == NULL || lq == NULL) {
        fprintf(stderr, "epd-bench kvq: out of memory (%lld x %u logits)\n", (long long)n_gen, V);
        goto out;
    }
    for (uint32_t m = 1; m < n_maps; m++) {
        if (epd_bq_open(engine, model, names[m], n, &eng[m]) != 0) {
            goto out;
        }
    }
    epd_rng_seed(&rng, (uint64_t)seed);
    /* prompt by prompt: f32's greedy tokens and logits, then every map
     * teacher-forced with those tokens */
    for (int64_t p = 0; p < n_prompts; p++) {
        epd_prefill_args_t a = {
            .seq = {.req_id = 1, .block_table = ref.table, .n_blocks = ref.nb},
            .tokens = prompts,
            .n_tokens = (uint32_t)plen,
        };

        for (int64_t i = 0; i < plen; i++) {
            prompts[i] = (int32_t)(epd_rng_next(&rng) % (V > 2 ? V - 2 : 1));
        }
        if (epd_engine_prefill(ref.engine, &ref.pool, &a, NULL, lref) != EPD_OK) {
            goto out;
        }
        for (int64_t t = 1; t <= n_gen; t++) {
            epd_decode_req_t r = {.seq = a.seq, .pos = (uint32_t)(plen + t - 1)};

            gen[t - 1] = (int32_t)epd_bq_argmax(lref + (size_t)(t - 1) * V, V);
            if (t == n_gen) {
                break;
            }
            r.token = gen[t - 1];
            if (epd_engine_decode(ref.engine, &ref.pool, &r, 1, lref + (size_t)t * V) != EPD_OK) {
                goto out;
            }
        }
        epd_engine_release(ref.engine, &ref.pool, &a.seq);
        agree[0] += (uint64_t)n_gen;
        for (uint32_t m = 1; m < n_maps; m++) {
            if (epd_bq_run(&eng[m], prompts, (uint32_t)plen, gen, (uint32_t)n_gen, lq) != 0) {
                goto out;
            }
            for (int64_t t = 0; t < n_gen; t++) {
                agree[m] += epd_bq_argmax(lq + (size_t)t * V, V) ==
                            epd_bq_argmax(lref + (size_t)t * V, V);
                kl[m] += epd_bq_kl(lref + (size_t)t * V, lq + (size_t)t * V, V);
            }
        }
    }
    printf("model %s: %u layers (%u attention, %u linear), %u KV heads x %u, vocab %u; %lld "
           "prompts of %lld random tokens, %lld positions each (teacher-forced with f32's greedy "
           "tokens)\n\n",
           model, ref.info->kv.n_layers, ref.info->kv.n_attn_layers, ref.info->kv.n_linear_layers,
           ref.info->kv.n_kv_heads, ref.info->kv.head_dim, V, (long long)n_prompts,
           (long long)plen, (long long)n_gen);
    printf("| KV dtype | block (all layers) | KV bytes / request | vs bf16 | top-1 agreement | "
           "mean KL (nats) |\n|---|---:|---:|---:|---:|---:|\n");
    {
        epd_kv_layout_t bf = ref.info->kv;
        uint64_t bf16_set;
        uint8_t d[EPD_KV_MAX_LAYERS];

        (void)epd_kvq_map_parse("bf16", bf.n_layers, d, NULL);
        epd_kvq_layout_apply(&bf, d);
        bf16_set = epd_kv_block_set_bytes(&bf);
        for (uint32_t m = 0; m < n_maps; m++) {
            const epd_bq_eng_t *e = m == 0 ? &ref : &eng[m];
            uint64_t set = epd_kv_block_set_bytes(&e->info->kv);
            uint64_t req = (uint64_t)e->nb * set +
                           (uint64_t)e->info->kv.n_linear_layers * e->info->kv.state_bytes;
            double total = (double)n_prompts * (double)n_gen;

            printf("| %s | %llu | %llu | %.3f | %.4f | %.3g |\n", names[m],
                   (unsigned long long)set, (unsigned long long)req,
                   (double)set / (double)bf16_set, m == 0 ? 1.0 : (double)agree[m] / total,
                   kl[m] / total);
        }
    }
    rc = 0;
out:
    epd_free(prompts);
    epd_free(gen);
    epd_free(lref);
    epd_free(lq);
    epd_bq_close(&ref);
    for (uint32_t m = 0; m < 16; m++) {
        epd_bq_close(&eng[m]);
    }
    epd_opts_cleanup(&o);
    return rc;
}
