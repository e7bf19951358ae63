/*
 * epd_generate.c — `epd-generate --model DIR --prompt TEXT --max-tokens N`:
 * prefill then decode in one process, printing the completion (or its token
 * ids with --tokens).  This is the colocated baseline: the disaggregated
 * cluster must reproduce its output token for token, so it uses exactly the
 * public engine API and the stateless sampler a daemon uses (sampling step
 * 0 after prefill, step i after the i-th decode).
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_config.h"
#include "epd_engine.h"
#include "epd_log.h"
#include "epd_sample.h"
#include "epd_utf8.h"

typedef struct {
    const char *engine;
    const char *model;
    const char *prompt;
    int64_t max_tokens;
    double temperature;
    double top_p;
    int64_t top_k;
    int64_t seed;
    int tokens;
    int64_t block_tokens;
} epd_gen_args_t;

static int epd_gen_fail(const char *what)
{
    fprintf(stderr, "epd-generate: %s\n", what);
    return 1;
}

static int epd_gen_print(const epd_gen_args_t *args, epd_engine_t *engine, const int32_t *out,
                         size_t n_out)
{
    char *raw;
    char *text;
    size_t raw_len;
    size_t text_len;
    int rc = 1;

    if (args->tokens) {
        for (size_t i = 0; i < n_out; i++) {
            printf("%s%d", i ? " " : "", out[i]);
        }
        printf("\n");
        return 0;
    }
    raw = epd_malloc(n_out + 1);
    text = epd_malloc(EPD_UTF8_REPAIR_MAX(n_out) + 1);
    if (raw == NULL || text == NULL) {
        goto out;
    }
    if (epd_engine_detokenize(engine, out, n_out, raw, n_out, &raw_len) != EPD_OK ||
        epd_utf8_repair(raw, raw_len, text, EPD_UTF8_REPAIR_MAX(n_out), &text_len) != EPD_OK) {
        goto out;
    }
    fwrite(text, 1, text_len, stdout);
    printf("\n");
    rc = 0;
out:
    epd_free(text);
    epd_free(raw);
    return rc;
}

static int epd_gen_run(const epd_gen_args_t *args)
{
    epd_engine_config_t cfg = {.model_dir = args->model,
                               .block_tokens = (uint32_t)args->block_tokens};
    const epd_engine_info_t *info;
    epd_sample_params_t sp;
    epd_sample_scratch_t *scratch = NULL;
    epd_engine_t *engine = NULL;
    epd_kv_pool_t pool = {0};
    epd_prefill_args_t pa;
    uint32_t *table = NULL;
    int32_t *prompt = NULL;
    int32_t *out = NULL;
    float *logits = NULL;
    size_t plen = strlen(args->prompt);
    size_t n_prompt = 0;
    size_t n_out = 0;
    uint64_t n_total;
    uint32_t n_blocks;
    epd_status_t status;
    int rc = 1;

    epd_sample_params_default(&sp);
    sp.temperature = (float)args->temperature;
    sp.top_p = (float)args->top_p;
    sp.top_k = (uint32_t)args->top_k;
    sp.seed = (uint64_t)args->seed;
    if (epd_sample_params_check(&sp) != EPD_OK) {
        return epd_gen_fail("bad sampling parameters (temperature 0..100, top-p in (0, 1])");
    }
    status = epd_engine_open(args->engine, &cfg, &engine);
    if (status != EPD_OK) {
        fprintf(stderr, "epd-generate: cannot open model '%s': %s\n", args->model,
                epd_status_string(status));
        return 1;
    }
    info = epd_engine_info(engine);
    if ((uint64_t)args->max_tokens > info->max_context) {
        fprintf(stderr, "epd-generate: --max-tokens %lld is more than the context limit of %u\n",
                (long long)args->max_tokens, info->max_context);
        goto out;
    }
    if (plen + 1 > info->max_context) {
        fprintf(
            stderr,
            "epd-generate: prompt of %zu tokens is longer than the context limit of %u tokens\n",
            plen + 1, info->max_context);
        goto out;
    }
    prompt = epd_calloc(plen + 1, sizeof(*prompt));
    out = epd_calloc((size_t)args->max_tokens, sizeof(*out));
    logits = epd_calloc(info->vocab_size, sizeof(*logits));
    if (prompt == NULL || out == NULL || logits == NULL ||
        epd_sample_scratch_create(info->vocab_size, &scratch) != EPD_OK) {
        epd_gen_fail("out of memory");
        goto out;
    }
    status = epd_engine_tokenize(engine, args->prompt, plen, 1, prompt, plen + 1, &n_prompt);
    if (status != EPD_OK) {
        epd_gen_fail("cannot tokenize the prompt");
        goto out;
    }
    n_total = n_prompt + (uint64_t)args->max_tokens;
    if (n_total > info->max_context) {
        n_total = info->max_context;
    }
    n_blocks = (uint32_t)((n_total + info->kv.block_tokens - 1) / info->kv.block_tokens);
    pool.n_blocks = n_blocks;
    pool.n_state_slots = 1;
    pool.bytes = epd_kv_pool_bytes(&info->kv, n_blocks, 1);
    pool.base = epd_calloc(1, pool.bytes);
    table = epd_calloc(n_blocks, sizeof(*table));
    if (pool.base == NULL || table == NULL) {
        epd_gen_fail("out of memory for the KV pool");
        goto out;
    }
    for (uint32_t i = 0; i < n_blocks; i++) {
        table[i] = i;
    }
    memset(&pa, 0, sizeof(pa));
    pa.seq.req_id = 1;
    pa.seq.block_table = table;
    pa.seq.n_blocks = n_blocks;
    pa.tokens = prompt;
    pa.n_tokens = (uint32_t)n_prompt;
    status = epd_engine_prefill(engine, &pool, &pa, NULL, logits);
    if (status != EPD_OK) {
        fprintf(stderr, "epd-generate: prefill failed: %s\n", epd_status_string(status));
        goto out;
    }
    for (;;) {
        epd_decode_req_t r;
        int32_t tok;

        if (epd_sample_token(&sp, scratch, logits, info->vocab_size, n_out, &tok) != EPD_OK) {
            epd_gen_fail("sampling failed");
            goto out;
        }
        out[n_out++] = tok;
        /* the next decode would put this token at position n_prompt + n_out - 1 */
        if (tok == info->eos_token || n_out == (size_t)args->max_tokens ||
            n_prompt + n_out - 1 >= info->max_context) {
            break;
        }
        r.seq = pa.seq;
        r.pos = (uint32_t)(n_prompt + n_out - 1);
        r.token = tok;
        status = epd_engine_decode(engine, &pool, &r, 1, logits);
        if (status != EPD_OK) {
            fprintf(stderr, "epd-generate: decode failed: %s\n", epd_status_string(status));
            goto out;
        }
    }
    rc = epd_gen_print(args, engine, out, n_out);
out:
    epd_free(table);
    epd_free(pool.base);
    epd_sample_scratch_destroy(scratch);
    epd_free(logits);
    epd_free(out);
    epd_free(prompt);
    epd_engine_close(engine);
    return rc;
}

int main(int argc, char **argv)
{
    epd_gen_args_t a = {
        .engine = "ref",
        .model = NULL,
        .prompt = NULL,
        .max_tokens = 64,
        .temperature = 0.0,
        .top_p = 1.0,
        .top_k = 0,
        .seed = 0,
        .tokens = 0,
        .block_tokens = 16,
    };
    const epd_opt_t opts[] = {
        {"engine", EPD_OPT_STRING, &a.engine, 0, 0, "engine: built-in name or path to a .so"},
        {"model", EPD_OPT_STRING, &a.model, 0, 0, "model folder (ref: config.json + model.safetensors; sim: sim.conf)"},
        {"prompt", EPD_OPT_STRING, &a.prompt, 0, 0, "prompt text"},
        {"max-tokens", EPD_OPT_INT, &a.max_tokens, 1, 1 << 24, "tokens to generate at most"},
        {"temperature", EPD_OPT_DOUBLE, &a.temperature, 0, 100, "0 = greedy"},
        {"top-p", EPD_OPT_DOUBLE, &a.top_p, 0, 1, "nucleus sampling mass, (0, 1]"},
        {"top-k", EPD_OPT_INT, &a.top_k, 0, 1 << 20, "keep the k most likely (0 = all)"},
        {"seed", EPD_OPT_INT, &a.seed, 0, 0, "sampling seed"},
        {"tokens", EPD_OPT_BOOL, &a.tokens, 0, 0, "print token ids instead of text"},
        {"block-tokens", EPD_OPT_INT, &a.block_tokens, 1, 4096, "KV block size in tokens"},
    };
    epd_opts_t o = {.prog = "epd-generate",
                    .summary = "prefill + decode one prompt in one process (colocated baseline)",
                    .opts = opts,
                    .n_opts = sizeof(opts) / sizeof(opts[0])};
    epd_status_t status;
    int argi;
    int rc;

    status = epd_opts_parse(&o, argc, argv, &argi);
    if (status == EPD_ERR_CANCELED) {
        epd_opts_cleanup(&o);
        return 0;
    }
    if (status != EPD_OK) {
        epd_opts_cleanup(&o);
        return 1;
    }
    if (argi != argc) {
        rc = epd_gen_fail("unexpected argument (flags are --name value)");
    } else if (a.model == NULL || a.model[0] == '\0') {
        rc = epd_gen_fail("--model DIR is required");
    } else if (a.prompt == NULL || a.prompt[0] == '\0') {
        rc = epd_gen_fail("--prompt must not be empty");
    } else if (!(a.top_p > 0.0)) {
        rc = epd_gen_fail("--top-p must be in (0, 1]");
    } else {
        rc = epd_gen_run(&a);
    }
    epd_opts_cleanup(&o);
    return rc;
}
