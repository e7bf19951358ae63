/*
 * epd_generate.c — `epd-generate --model DIR --prompt TEXT --max-tokens N
 * [--image FILE[,FILE...]]`: prefill then decode in one process, printing
 * the completion (or its token ids with --tokens).  This is the colocated
 * baseline: the disaggregated cluster must reproduce its output token for
 * token, so it uses exactly the public engine API and the stateless sampler
 * a daemon uses (sampling step 0 after prefill, step i after the i-th
 * decode).  With --image each file is decoded (epd_image_decode, default
 * pixel guard), encoded (epd_engine_encode_image) and placed at its
 * placeholders (epd_engine_tokenize_images: at the prompt's <|image|>
 * markers, or right after BOS when it has none) by one prefill with
 * embedding spans: the multimodal baseline.
 *
 * Oracle hooks (a numpy reference drives them): --prompt-ids takes the
 * prompt as ids, nothing added; --logits-out writes the logits of every
 * prompt position and exits (--logits-path prefill: row t from a fresh
 * prefill of tokens [0..t]; decode: a prefill of token 0, then
 * teacher-forced decode steps); --jsonl prints one JSON object per
 * generated token with its log-probability and the --logprobs K best.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_config.h"
#include "epd_engine.h"
#include "epd_image.h"
#include "epd_log.h"
#include "epd_sample.h"
#include "epd_time.h"
#include "epd_utf8.h"

#define EPD_GEN_MAX_IMAGES 8
#define EPD_GEN_MAX_FILE (256u << 20) /* bytes of one image file */

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
    const char *kv_dtype; /* --kv-dtype MAP, or NULL (f32) */
    const char *image; /* comma-separated files, or NULL */
    int timing;        /* print the time of each phase to stderr */
    const char *prompt_ids;  /* "1,2,3": the prompt as ids, nothing added */
    const char *logits_out;  /* write [T][vocab] f32 logits here and exit */
    const char *logits_path; /* "prefill" | "decode" */
    int jsonl;               /* one JSON object per generated token */
    int64_t logprobs;        /* top_logprobs entries with --jsonl */
    /* logit adjustments (engine/epd_sample.h), as the router's requests */
    double presence_penalty;
    double frequency_penalty;
    double repetition_penalty;
    const char *logit_bias; /* "ID:VALUE,ID:VALUE" */
    int64_t min_tokens;
    int ignore_eos;
} epd_gen_args_t;

/* The images of one run: files read, decoded and encoded. */
typedef struct {
    uint32_t n;
    float *embeds[EPD_GEN_MAX_IMAGES]; /* [image_embeddings][embed_dim] each */
    uint64_t encode_ns;                /* epd_engine_encode_image, all images */
} epd_gen_images_t;

static int epd_gen_fail(const char *what)
{
    fprintf(stderr, "epd-generate: %s\n", what);
    return 1;
}

static int epd_gen_print(const epd_gen_args_t *args, epd_engine_t *engine, const int32_t *out,
                         size_t n_out)
{
    char *raw = NULL;
    char *text = NULL;
    size_t raw_len = 0;
    size_t text_len;
    int rc = 1;

    if (args->tokens) {
        for (size_t i = 0; i < n_out; i++) {
            printf("%s%d", i ? " " : "", out[i]);
        }
        printf("\n");
        return 0;
    }
    /* a token of a tokenizer.json spells up to max_token_bytes bytes: the
     * buffer grows until the text fits (a byte tokenizer fits at once) */
    for (size_t cap = n_out + 1;; cap *= 2) {
        epd_status_t st;

        epd_free(raw);
        raw = epd_malloc(cap);
        if (raw == NULL) {
            goto out;
        }
        st = epd_engine_detokenize(engine, out, n_out, raw, cap, &raw_len);
        if (st == EPD_OK) {
            break;
        }
        if (st != EPD_ERR_TOO_LONG) {
            goto out;
        }
    }
    text = epd_malloc(EPD_UTF8_REPAIR_MAX(raw_len) + 1);
    if (text == NULL ||
        epd_utf8_repair(raw, raw_len, text, EPD_UTF8_REPAIR_MAX(raw_len), &text_len) != EPD_OK) {
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

/* Reads `path` whole into a new buffer (epd_free).  0, or 1 after printing. */
static int epd_gen_read_file(const char *path, unsigned char **data_p, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    unsigned char *data = NULL;
    size_t len = 0;
    size_t cap = 0;

    if (f == NULL) {
        fprintf(stderr, "epd-generate: cannot read image '%s': %s\n", path, strerror(errno));
        return 1;
    }
    for (;;) {
        size_t got;

        if (len == cap) {
            unsigned char *bigger;

            cap = cap ? cap * 2 : 1u << 16;
            if (cap > EPD_GEN_MAX_FILE) {
                fprintf(stderr, "epd-generate: image '%s' is too large (over %u MiB)\n", path,
                        EPD_GEN_MAX_FILE >> 20);
                goto err;
            }
            bigger = epd_realloc(data, cap);
            if (bigger == NULL) {
                fprintf(stderr, "epd-generate: out of memory reading '%s'\n", path);
                goto err;
            }
            data = bigger;
        }
        got = fread(data + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            break;
        }
    }
    if (ferror(f)) {
        fprintf(stderr, "epd-generate: cannot read image '%s': %s\n", path, strerror(errno));
        goto err;
    }
    fclose(f);
    *data_p = data;
    *len_p = len;
    return 0;

err:
    fclose(f);
    epd_free(data);
    return 1;
}

/* Decodes and encodes one image file into a new embeddings buffer.  0, or
 * 1 after printing why not. */
static int epd_gen_load_image(epd_engine_t *engine, const char *path, float **embeds_p,
                              uint64_t *encode_ns_p)
{
    const epd_engine_info_t *info = epd_engine_info(engine);
    epd_image_info_t hdr;
    epd_image_t img = {0};
    epd_image_view_t view;
    unsigned char *data = NULL;
    size_t len = 0;
    float *out = NULL;
    uint64_t t0;
    epd_status_t status;
    int rc = 1;

    if (epd_gen_read_file(path, &data, &len) != 0) {
        return 1;
    }
    status = epd_image_decode(data, len, EPD_IMAGE_MAX_PIXELS_DEFAULT, &img);
    if (status == EPD_ERR_UNSUPPORTED) {
        fprintf(stderr, "epd-generate: '%s' is not a PNG or JPEG image (or an unsupported kind)\n",
                path);
        goto out;
    }
    if (status == EPD_ERR_TOO_LONG) {
        if (epd_image_probe(data, len, &hdr) == EPD_OK) {
            fprintf(stderr,
                    "epd-generate: image '%s' is too large: %u x %u pixels (at most %llu)\n",
                    path, hdr.width, hdr.height,
                    (unsigned long long)EPD_IMAGE_MAX_PIXELS_DEFAULT);
        } else {
            fprintf(stderr, "epd-generate: image '%s' is too large\n", path);
        }
        goto out;
    }
    if (status != EPD_OK) {
        fprintf(stderr, "epd-generate: cannot decode image '%s': %s\n", path,
                status == EPD_ERR_MALFORMED ? "corrupt or truncated" : epd_status_string(status));
        goto out;
    }
    out = epd_calloc((size_t)info->image_embeddings * info->embed_dim, sizeof(float));
    if (out == NULL) {
        epd_gen_fail("out of memory for the image embeddings");
        goto out;
    }
    view = epd_image_view(&img);
    t0 = epd_time_now_ns();
    status = epd_engine_encode_image(engine, &view, out);
    *encode_ns_p += epd_time_now_ns() - t0;
    if (status != EPD_OK) {
        fprintf(stderr, "epd-generate: cannot encode image '%s': %s\n", path,
                epd_status_string(status));
        goto out;
    }
    *embeds_p = out;
    out = NULL;
    rc = 0;
out:
    epd_free(out);
    epd_image_cleanup(&img);
    epd_free(data);
    return rc;
}

/* Loads every file of the comma-separated list `list`.  0, or 1 after
 * printing why not. */
static int epd_gen_load_images(epd_engine_t *engine, const char *list, epd_gen_images_t *images)
{
    const char *p = list;
    uint32_t n_files = 1;

    memset(images, 0, sizeof(*images));
    for (const char *c = list; *c; c++) {
        n_files += *c == ',';
    }
    if (n_files > EPD_GEN_MAX_IMAGES) {
        fprintf(stderr, "epd-generate: --image: %u files, at most %d images\n", n_files,
                EPD_GEN_MAX_IMAGES);
        return 1;
    }
    if (epd_engine_info(engine)->image_embeddings == 0) {
        fprintf(stderr, "epd-generate: --image: the model has no vision encoder\n");
        return 1;
    }
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t n = comma != NULL ? (size_t)(comma - p) : strlen(p);
        char path[4096];

        if (n == 0 || n >= sizeof(path)) {
            epd_gen_fail("--image: an empty or overlong file name in the list");
            return 1;
        }
        memcpy(path, p, n);
        path[n] = '\0';
        if (epd_gen_load_image(engine, path, &images->embeds[images->n], &images->encode_ns) !=
            0) {
            return 1;
        }
        images->n++;
        if (comma == NULL) {
            return 0;
        }
        p = comma + 1;
    }
}

static void epd_gen_images_cleanup(epd_gen_images_t *images)
{
    for (uint32_t i = 0; i < images->n; i++) {
        epd_free(images->embeds[i]);
    }
    images->n = 0;
}

/* Parses "1,2,3" into ids[0..cap); *n_p the count.  0, or 1 after printing. */
static int epd_gen_parse_ids(const char *list, int32_t *ids, size_t cap, size_t *n_p)
{
    const char *p = list;
    size_t n = 0;

    for (;;) {
        char *end;
        long long v;

        errno = 0;
        v = strtoll(p, &end, 10);
        if (end == p || errno != 0 || v < 0 || v > INT32_MAX || (*end != ',' && *end != '\0')) {
            return epd_gen_fail("--prompt-ids must be a comma-separated list of token ids");
        }
        if (n == cap) {
            return epd_gen_fail("--prompt-ids: more ids than the context limit");
        }
        ids[n++] = (int32_t)v;
        if (*end == '\0') {
            break;
        }
        p = end + 1;
    }
    *n_p = n;
    return 0;
}

/* Count of ids in "1,2,3" (an upper bound for the parse). */
static size_t epd_gen_count_ids(const char *list)
{
    size_t n = 1;

    for (const char *c = list; *c; c++) {
        n += *c == ',';
    }
    return n;
}

/* --logits-out: the logits after each prompt prefix [0..t], little-endian
 * f32 [T][vocab] (this tool runs on little-endian hosts only, as the KV
 * transport does).  0, or 1 after printing. */
static int epd_gen_logits_out(const epd_gen_args_t *args, epd_engine_t *engine,
                              const epd_kv_pool_t *pool, epd_prefill_args_t *pa, float *logits)
{
    const epd_engine_info_t *info = epd_engine_info(engine);
    int decode = strcmp(args->logits_path, "decode") == 0;
    uint32_t T = pa->n_tokens;
    FILE *f;
    epd_status_t status = EPD_OK;

    if (!decode && strcmp(args->logits_path, "prefill") != 0) {
        return epd_gen_fail("--logits-path must be prefill or decode");
    }
    f = fopen(args->logits_out, "wb");
    if (f == NULL) {
        fprintf(stderr, "epd-generate: cannot create '%s': %s\n", args->logits_out,
                strerror(errno));
        return 1;
    }
    for (uint32_t t = 0; t < T && status == EPD_OK; t++) {
        if (t == 0 || !decode) {
            pa->n_tokens = t + 1; /* a fresh prefill of [0..t] */
            status = epd_engine_prefill(engine, pool, pa, NULL, logits);
        } else {
            epd_decode_req_t r = {.seq = pa->seq, .pos = t, .token = pa->tokens[t]};

            status = epd_engine_decode(engine, pool, &r, 1, logits);
        }
        if (status == EPD_OK && fwrite(logits, sizeof(float), info->vocab_size, f) !=
                                    info->vocab_size) {
            status = EPD_ERR_IO;
        }
    }
    pa->n_tokens = T;
    if (fclose(f) != 0 && status == EPD_OK) {
        status = EPD_ERR_IO;
    }
    if (status != EPD_OK) {
        fprintf(stderr, "epd-generate: --logits-out failed: %s\n", epd_status_string(status));
        return 1;
    }
    return 0;
}

/* Writes s[0..len) as a JSON string (after UTF-8 repair: invalid bytes
 * become U+FFFD). */
static void epd_gen_json_string(const char *s, size_t len)
{
    char buf[4096];
    size_t n = 0;

    if (EPD_UTF8_REPAIR_MAX(len) > sizeof(buf) ||
        epd_utf8_repair(s, len, buf, sizeof(buf), &n) != EPD_OK) {
        n = 0;
    }
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)buf[i];

        if (c == '"' || c == '\\') {
            printf("\\%c", c);
        } else if (c == '\n') {
            fputs("\\n", stdout);
        } else if (c == '\t') {
            fputs("\\t", stdout);
        } else if (c == '\r') {
            fputs("\\r", stdout);
        } else if (c < 0x20 || c == 0x7f) {
            printf("\\u%04x", c);
        } else {
            putchar(c);
        }
    }
    putchar('"');
}

/* --jsonl: one line for token `tok` sampled from `logits` (raw, before
 * temperature): its id, its text, its log-softmax and the k best. */
static void epd_gen_jsonl(epd_engine_t *engine, const float *logits, uint32_t vocab, int32_t tok,
                          int64_t k)
{
    double mx = logits[0];
    double sum = 0.0;
    double lse;
    char bytes[1024];
    size_t blen = 0;
    int32_t prev_id = -1;
    float prev = INFINITY;

    for (uint32_t i = 1; i < vocab; i++) {
        mx = logits[i] > mx ? logits[i] : mx;
    }
    for (uint32_t i = 0; i < vocab; i++) {
        sum += exp((double)logits[i] - mx);
    }
    lse = mx + log(sum);
    if (epd_engine_detokenize(engine, &tok, 1, bytes, sizeof(bytes), &blen) != EPD_OK) {
        blen = 0;
    }
    printf("{\"id\": %d, \"text\": ", tok);
    epd_gen_json_string(bytes, blen);
    printf(", \"logprob\": %.9g, \"top_logprobs\": [", (double)logits[tok] - lse);
    /* k passes, each the best below the previous (ties: lower id first) */
    for (int64_t j = 0; j < k && j < (int64_t)vocab; j++) {
        int32_t best = -1;

        for (uint32_t i = 0; i < vocab; i++) {
            int after = logits[i] < prev || (logits[i] == prev && (int32_t)i > prev_id);

            if (after && (best < 0 || logits[i] > logits[best])) {
                best = (int32_t)i;
            }
        }
        if (best < 0) {
            break;
        }
        printf("%s[%d, %.9g]", j ? ", " : "", best, (double)logits[best] - lse);
        prev = logits[best];
        prev_id = best;
    }
    printf("]}\n");
}

/* "ID:VALUE,ID:VALUE" into sp->bias (values clamped to [-100, 100] as
 * OpenAI clamps them): 0, or -1 for bad text. */
static int epd_gen_parse_bias(const char *text, epd_sample_params_t *sp)
{
    const char *p = text;

    sp->n_bias = 0;
    while (*p != '\0') {
        char *end;
        unsigned long id;
        double v;

        if (sp->n_bias == EPD_SAMPLE_MAX_BIAS || *p < '0' || *p > '9') {
            return -1;
        }
        id = strtoul(p, &end, 10);
        if (*end != ':' || id > UINT32_MAX) {
            return -1;
        }
        p = end + 1;
        v = strtod(p, &end);
        if (end == p || !(v == v)) {
            return -1;
        }
        sp->bias[sp->n_bias].id = (uint32_t)id;
        sp->bias[sp->n_bias].bias = (float)(v < -100.0 ? -100.0 : v > 100.0 ? 100.0 : v);
        sp->n_bias++;
        p = end;
        if (*p == ',') {
            p++;
        } else if (*p != '\0') {
            return -1;
        }
    }
    return 0;
}

static int epd_gen_run(const epd_gen_args_t *args)
{
    epd_engine_config_t cfg = {.model_dir = args->model,
                               .block_tokens = (uint32_t)args->block_tokens,
                               .kv_dtype = args->kv_dtype};
    const epd_engine_info_t *info;
    epd_sample_params_t sp;
    epd_sample_scratch_t *scratch = NULL;
    epd_engine_t *engine = NULL;
    epd_kv_pool_t pool = {0};
    epd_prefill_args_t pa;
    epd_gen_images_t images = {0};
    epd_embed_span_t spans[EPD_GEN_MAX_IMAGES];
    uint32_t image_pos[EPD_GEN_MAX_IMAGES];
    size_t cap;
    uint64_t t_prefill;
    uint64_t t_decode;
    uint32_t *table = NULL;
    int32_t *prompt = NULL;
    int32_t *out = NULL;
    float *logits = NULL;
    float *adj_logits = NULL; /* logits after the request's adjustments */
    epd_sample_adjust_t adj;
    size_t plen = args->prompt != NULL ? strlen(args->prompt) : 0;
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
    sp.presence_penalty = (float)args->presence_penalty;
    sp.frequency_penalty = (float)args->frequency_penalty;
    sp.repetition_penalty = (float)args->repetition_penalty;
    sp.min_tokens = (uint32_t)args->min_tokens;
    sp.ignore_eos = args->ignore_eos;
    if (args->logit_bias != NULL && epd_gen_parse_bias(args->logit_bias, &sp) != 0) {
        return epd_gen_fail("--logit-bias takes ID:VALUE,ID:VALUE (at most 300, values clamped "
                            "to [-100, 100])");
    }
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
    if (args->image != NULL && epd_gen_load_images(engine, args->image, &images) != 0) {
        goto out;
    }
    /* BPE gives at most one id per byte, plus the post-processor's few */
    cap = plen + 8 + (size_t)images.n * info->image_embeddings;
    if (args->prompt_ids != NULL) {
        cap = epd_gen_count_ids(args->prompt_ids);
    }
    if (cap > info->max_context) {
        fprintf(
            stderr,
            "epd-generate: prompt of %zu tokens is longer than the context limit of %u tokens\n",
            cap, info->max_context);
        goto out;
    }
    prompt = epd_calloc(cap, sizeof(*prompt));
    out = epd_calloc((size_t)args->max_tokens, sizeof(*out));
    logits = epd_calloc(info->vocab_size, sizeof(*logits));
    adj_logits = epd_calloc(info->vocab_size, sizeof(*adj_logits));
    if (prompt == NULL || out == NULL || logits == NULL || adj_logits == NULL ||
        epd_sample_scratch_create(info->vocab_size, &scratch) != EPD_OK) {
        epd_gen_fail("out of memory");
        goto out;
    }
    if (args->prompt_ids != NULL) {
        if (epd_gen_parse_ids(args->prompt_ids, prompt, cap, &n_prompt) != 0) {
            goto out;
        }
        status = EPD_OK;
    } else if (images.n == 0) {
        status = epd_engine_tokenize(engine, args->prompt, plen, 1, prompt, cap, &n_prompt);
    } else {
        status = epd_engine_tokenize_images(engine, args->prompt, plen, images.n, prompt, cap,
                                            &n_prompt, image_pos);
    }
    if (status == EPD_ERR_INVALID_PARAM) {
        fprintf(stderr, "epd-generate: the prompt's %s markers do not match the %u images\n",
                EPD_IMAGE_MARKER, images.n);
        goto out;
    }
    if (status != EPD_OK) {
        epd_gen_fail("cannot tokenize the prompt");
        goto out;
    }
    for (uint32_t i = 0; i < images.n; i++) {
        spans[i] = (epd_embed_span_t){
            .pos = image_pos[i], .n = info->image_embeddings, .data = images.embeds[i]};
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
    pa.embeds = images.n > 0 ? spans : NULL;
    pa.n_embeds = images.n;
    if (args->logits_out != NULL) {
        rc = epd_gen_logits_out(args, engine, &pool, &pa, logits);
        goto out;
    }
    t_prefill = epd_time_now_ns();
    status = epd_engine_prefill(engine, &pool, &pa, NULL, logits);
    t_prefill = epd_time_now_ns() - t_prefill;
    if (status != EPD_OK) {
        fprintf(stderr, "epd-generate: prefill failed: %s\n", epd_status_string(status));
        goto out;
    }
    t_decode = epd_time_now_ns();
    for (;;) {
        epd_decode_req_t r;
        int32_t tok;

        const float *row = logits;

        /* the adjustments as prefill and decode make them (the prompt, the
         * tokens so far); --jsonl still prints the raw logits' logprobs */
        epd_sample_adjust_of(&sp, info->eos_tokens, info->n_eos, &adj);
        if (!epd_sample_adjust_is_off(&adj)) {
            memcpy(adj_logits, logits, (size_t)info->vocab_size * sizeof(*logits));
            if (epd_sample_adjust(&adj, scratch, adj_logits, info->vocab_size,
                                  (const uint32_t *)prompt, n_prompt, (const uint32_t *)out,
                                  n_out) != EPD_OK) {
                epd_gen_fail("bad logit adjustments (a --logit-bias id outside the vocabulary?)");
                goto out;
            }
            row = adj_logits;
        }
        if (epd_sample_token(&sp, scratch, row, info->vocab_size, n_out, &tok) != EPD_OK) {
            epd_gen_fail("sampling failed");
            goto out;
        }
        if (args->jsonl) {
            epd_gen_jsonl(engine, logits, info->vocab_size, tok, args->logprobs);
        }
        out[n_out++] = tok;
        /* the next decode would put this token at position n_prompt + n_out - 1 */
        if ((!sp.ignore_eos && epd_engine_is_eos(info, tok)) || n_out == (size_t)args->max_tokens ||
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
    t_decode = epd_time_now_ns() - t_decode;
    rc = args->jsonl ? 0 : epd_gen_print(args, engine, out, n_out);
    fflush(stdout);
    if (args->timing) {
        fprintf(stderr,
                "epd-generate: timing: %u images encoded in %.2f ms (%.2f ms each), prefill of "
                "%zu tokens %.2f ms, %zu decode steps %.2f ms (%.3f ms each)\n",
                images.n, images.encode_ns / 1e6,
                images.n ? images.encode_ns / 1e6 / images.n : 0.0, n_prompt, t_prefill / 1e6,
                n_out - 1, t_decode / 1e6, n_out > 1 ? t_decode / 1e6 / (double)(n_out - 1) : 0.0);
    }
out:
    epd_gen_images_cleanup(&images);
    epd_free(table);
    epd_free(pool.base);
    epd_sample_scratch_destroy(scratch);
    epd_free(adj_logits);
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
        .image = NULL,
        .timing = 0,
        .prompt_ids = NULL,
        .logits_out = NULL,
        .logits_path = "prefill",
        .jsonl = 0,
        .logprobs = 0,
        .presence_penalty = 0.0,
        .frequency_penalty = 0.0,
        .repetition_penalty = 1.0,
        .logit_bias = NULL,
        .min_tokens = 0,
        .ignore_eos = 0,
    };
    const epd_opt_t opts[] = {
        {"engine", EPD_OPT_STRING, &a.engine, 0, 0, "engine: built-in name or path to a .so"},
        {"model", EPD_OPT_STRING, &a.model, 0, 0,
         "model folder (ref: config.json + model.safetensors; sim: sim.conf)"},
        {"prompt", EPD_OPT_STRING, &a.prompt, 0, 0, "prompt text"},
        {"max-tokens", EPD_OPT_INT, &a.max_tokens, 1, 1 << 24, "tokens to generate at most"},
        {"temperature", EPD_OPT_DOUBLE, &a.temperature, 0, 100, "0 = greedy"},
        {"top-p", EPD_OPT_DOUBLE, &a.top_p, 0, 1, "nucleus sampling mass, (0, 1]"},
        {"top-k", EPD_OPT_INT, &a.top_k, 0, 1 << 20, "keep the k most likely (0 = all)"},
        {"seed", EPD_OPT_INT, &a.seed, 0, 0, "sampling seed"},
        {"tokens", EPD_OPT_BOOL, &a.tokens, 0, 0, "print token ids instead of text"},
        {"block-tokens", EPD_OPT_INT, &a.block_tokens, 1, 4096, "KV block size in tokens"},
        {"kv-dtype", EPD_OPT_STRING, &a.kv_dtype, 0, 0,
         "KV cache dtype per layer: f32 (default), bf16, fp8, int8, or a map such as "
         "\"0-3:bf16,4-:fp8\" (the colocated reference of a disaggregated run)"},
        {"image", EPD_OPT_STRING, &a.image, 0, 0,
         "PNG / JPEG files, comma-separated (at most 8), placed at the prompt's <|image|> "
         "markers or after BOS"},
        {"timing", EPD_OPT_BOOL, &a.timing, 0, 0,
         "print the time of image encoding, prefill and decode to stderr"},
        {"prompt-ids", EPD_OPT_STRING, &a.prompt_ids, 0, 0,
         "the prompt as token ids, comma-separated, used as given (no BOS added)"},
        {"logits-out", EPD_OPT_STRING, &a.logits_out, 0, 0,
         "write the logits after each prompt prefix [0..t] as little-endian f32 [T][vocab] "
         "to this file and exit without generating"},
        {"logits-path", EPD_OPT_STRING, &a.logits_path, 0, 0,
         "with --logits-out: prefill (row t from a fresh prefill of [0..t]) or decode (prefill "
         "of token 0, then teacher-forced decode steps)"},
        {"jsonl", EPD_OPT_BOOL, &a.jsonl, 0, 0,
         "print one JSON object per generated token: {\"id\", \"text\", \"logprob\", "
         "\"top_logprobs\": [[id, logprob], ...]} (log-softmax of the raw logits, before "
         "temperature; top_logprobs best first)"},
        {"logprobs", EPD_OPT_INT, &a.logprobs, 0, 1 << 20,
         "with --jsonl: top_logprobs entries per token"},
        {"presence-penalty", EPD_OPT_DOUBLE, &a.presence_penalty, -2, 2,
         "subtract this from the logit of every token generated so far (OpenAI's)"},
        {"frequency-penalty", EPD_OPT_DOUBLE, &a.frequency_penalty, -2, 2,
         "subtract this times its count from the logit of every token generated so far"},
        {"repetition-penalty", EPD_OPT_DOUBLE, &a.repetition_penalty, 0, 2,
         "vLLM's: a logit > 0 of a prompt or generated token is divided by it, one <= 0 "
         "multiplied (1 = off)"},
        {"logit-bias", EPD_OPT_STRING, &a.logit_bias, 0, 0,
         "ID:VALUE,...: add VALUE (clamped to [-100, 100]) to token ID's logit"},
        {"min-tokens", EPD_OPT_INT, &a.min_tokens, 0, 1 << 24,
         "EOS cannot be sampled before this many tokens"},
        {"ignore-eos", EPD_OPT_BOOL, &a.ignore_eos, 0, 0, "EOS does not end the generation"},
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
    } else if ((a.prompt == NULL || a.prompt[0] == '\0') && a.prompt_ids == NULL) {
        rc = epd_gen_fail("--prompt must not be empty (or give --prompt-ids)");
    } else if (a.prompt != NULL && a.prompt_ids != NULL) {
        rc = epd_gen_fail("--prompt and --prompt-ids exclude each other");
    } else if (a.prompt_ids != NULL && a.image != NULL) {
        rc = epd_gen_fail("--prompt-ids does not take --image");
    } else if (!(a.top_p > 0.0)) {
        rc = epd_gen_fail("--top-p must be in (0, 1]");
    } else {
        rc = epd_gen_run(&a);
    }
    epd_opts_cleanup(&o);
    return rc;
}
