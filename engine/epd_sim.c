/*
 * epd_sim.c — the `sim` engine: a timing model behind the engine interface.
 *
 * Opened with a model folder holding sim.conf (epd_sim.h), it describes the
 * KV layout of the profiled model (scaled), and for each prefill layer
 *   1. writes that layer's KV rows (or recurrent state) into the caller's
 *      pool: deterministic pseudo-random bytes (below),
 *   2. waits until the layer's deadline: t0 + the modelled times of layers
 *      0..l (epd_sim_timing.c), sleeping (clock_nanosleep, TIMER_ABSTIME) or
 *      spinning; deadlines are absolute from the start of the call, so
 *      oversleeping never accumulates and the fill's CPU time is part of the
 *      layer's time, not added to it,
 *   3. calls the sink, as `ref` does (once per layer, in order, KV final),
 *      at the layer's modelled end: the transfer of layer l overlaps layers
 *      l+1.. only (`ref` reports a layer as soon as its KV is written,
 *      before its attention and MLP: a little more overlap).
 * A decode step writes every request's new rows and states, then waits once
 * for the sum of its layers' modelled times.
 *
 * The bytes.  A prefix hash chains over the tokens:
 *   h(-1) = EPD_SIM_H0,  h(p) = mix(h(p-1) ^ (token(p) + 1) * G)
 * so it depends on the token at p and every token before it.  Position p of
 * attention layer l holds, in each of its (K|V, kv head) rows, the bytes
 * of T at offset o(z + (row + 1) * C), z = mix(h(p) ^ key(l)), o(x) = (x ^
 * x >> 29) mod 64 KiB (T: 68 KiB of bytes drawn from the seed, key(l) from
 * the seed and l; a piece longer than 4 KiB continues at o(mix(x + G))), except
 * that the first 8 bytes of the K row of head 0 hold h(p) ^ key(l).  A
 * linear layer's state after a prefix ending at p is filled the same way
 * from h(p), its first 8 bytes h(p) ^ key(l).  Logits are a function of the
 * seed and h(last) only.  Hence: the same prompt gives the same bytes in
 * any process, a different prompt different bytes, a chunked prefill the
 * same bytes as a whole one, and a decode step or a later chunk recovers
 * h(p-1) from the pool itself (first attention layer, else first linear
 * layer), so a decode node that received the KV continues exactly as the
 * node that computed it: disaggregated equals colocated.  A misplaced or
 * corrupted block changes the checksums, and the generated text.
 *
 * Prefill and decode allocate nothing (scratch sized at open by max_context
 * and max_batch).
 *
 * The fill is one memcpy from the table per row (~11-12 GB/s for the
 * 102-byte rows of the shipped scales on one core here, twice computing
 * every word).  When filling one layer takes
 * longer than the layer's modelled time, the model cannot be honoured; the
 * engine says so once, at info level, and carries on late.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include "epd_alloc.h"
#include "epd_engine.h"
#include "epd_engine_int.h"
#include "epd_hash.h"
#include "epd_log.h"
#include "epd_rng.h"
#include "epd_sim.h"
#include "epd_time.h"

#define EPD_SIM_LOG "sim"
#define EPD_SIM_BOS 256
#define EPD_SIM_EOS 257
#define EPD_SIM_TB_BYTES 65536u /* the byte table rows are copied from (a power of 2) */
#define EPD_SIM_TB_SPAN 4096u   /* longest piece copied from one table offset */
#define EPD_SIM_H0 0x6570642d73696d00ull /* "epd-sim" */
#define EPD_SIM_G 0x9E3779B97F4A7C15ull
#define EPD_SIM_C 0xD1B54A32D192ED03ull
#define EPD_SIM_STATE_KEY 0x5374617465ull /* "State" */
#define EPD_SIM_LOGIT_FLOOR (-20.0f)
#define EPD_SIM_LOGIT_CANDIDATES 8
#define EPD_SIM_BATCH 64 /* tokens whose row seeds are computed together */

struct epd_engine_impl {
    epd_sim_conf_t conf;
    epd_sim_timing_t timing;
    epd_engine_info_t info;
    unsigned char table[EPD_SIM_TB_BYTES + EPD_SIM_TB_SPAN]; /* seeded bytes */
    uint64_t key[EPD_KV_MAX_LAYERS];
    uint64_t logit_key;
    uint32_t first_attn;   /* UINT32_MAX when none */
    uint32_t first_linear; /* UINT32_MAX when none */
    size_t row_bytes;      /* head_dim * dtype size: one head's K or V of one token */
    uint64_t *p_hash;      /* [max_context] prefill scratch: prefix hash of each token */
    uint64_t *d_hash;      /* [max_batch] decode scratch */
    int warned;            /* the fill-too-slow line was written */
};

/* ---- bytes ----------------------------------------------------------------- */

/* splitmix64's finalizer: a bijection with good avalanche. */
static inline uint64_t epd_sim_mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x;
}

static inline uint64_t epd_sim_chain(uint64_t h, int32_t token)
{
    return epd_sim_mix(h ^ ((uint64_t)(uint32_t)token + 1) * EPD_SIM_G);
}

static inline void epd_sim_fill(const epd_engine_impl_t *e, unsigned char *dst, size_t len,
                                uint64_t z)
{
    size_t done = 0;

    /* pieces of the seeded table at offsets drawn from z: a memcpy per row
     * (rows are 20..256 bytes), about twice the speed of computing every
     * word, so the fill stays well inside a layer's modelled time */
    while (done < len) {
        size_t n = len - done < EPD_SIM_TB_SPAN ? len - done : EPD_SIM_TB_SPAN;

        memcpy(dst + done, e->table + ((z ^ (z >> 29)) & (EPD_SIM_TB_BYTES - 1)), n);
        done += n;
        z = epd_sim_mix(z + EPD_SIM_G);
    }
}

static inline unsigned char *epd_sim_block(const epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                                           uint32_t layer, uint32_t block)
{
    const epd_kv_layout_t *kv = &e->info.kv;

    return (unsigned char *)pool->base +
           ((uint64_t)kv->kind_index[layer] * pool->n_blocks + block) * kv->block_bytes;
}

static inline unsigned char *epd_sim_state(const epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                                           uint32_t layer, uint32_t slot)
{
    const epd_kv_layout_t *kv = &e->info.kv;

    return (unsigned char *)pool->base +
           (uint64_t)kv->n_attn_layers * pool->n_blocks * kv->block_bytes +
           ((uint64_t)kv->kind_index[layer] * pool->n_state_slots + slot) * kv->state_bytes;
}

/* Writes positions [pos, pos + n) (prefix hashes h[0..n)) of attention
 * layer `layer`.  Works block by block, and inside a block row by row:
 * the rows of one (K|V, head) for consecutive tokens are contiguous, so the
 * writes stream. */
static void epd_sim_fill_rows(const epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                              const epd_kv_seq_t *seq, uint32_t layer, uint32_t pos, uint32_t n,
                              const uint64_t *h)
{
    const epd_kv_layout_t *kv = &e->info.kv;
    uint32_t bt = kv->block_tokens;
    size_t row = e->row_bytes;
    uint32_t done = 0;

    while (done < n) {
        uint32_t p = pos + done;
        uint32_t tok = p % bt;
        uint32_t cnt = bt - tok < EPD_SIM_BATCH ? bt - tok : EPD_SIM_BATCH;
        unsigned char *b = epd_sim_block(e, pool, layer, seq->block_table[p / bt]);
        uint64_t hk[EPD_SIM_BATCH];
        uint64_t z[EPD_SIM_BATCH];

        cnt = cnt < n - done ? cnt : n - done;
        for (uint32_t k = 0; k < cnt; k++) {
            hk[k] = h[done + k] ^ e->key[layer];
            z[k] = epd_sim_mix(hk[k]);
        }
        for (uint32_t r = 0; r < 2 * kv->n_kv_heads; r++) {
            unsigned char *dst = b + ((size_t)r * bt + tok) * row;
            uint64_t zr = (r + 1ull) * EPD_SIM_C;

            for (uint32_t k = 0; k < cnt; k++) {
                epd_sim_fill(e, dst + (size_t)k * row, row, z[k] + zr);
            }
        }
        for (uint32_t k = 0; k < cnt; k++) {
            memcpy(b + (size_t)(tok + k) * row, &hk[k], 8); /* K row of head 0 */
        }
        done += cnt;
    }
}

/* Writes the state of linear layer `layer` after a prefix with hash h into
 * s (state_bytes). */
static void epd_sim_fill_state_at(const epd_engine_impl_t *e, unsigned char *s, uint32_t layer,
                                  uint64_t h)
{
    uint64_t hk = h ^ e->key[layer];

    epd_sim_fill(e, s, e->info.kv.state_bytes, epd_sim_mix(hk ^ EPD_SIM_STATE_KEY));
    memcpy(s, &hk, 8);
}

/* Writes the state of linear layer `layer` after a prefix with hash h. */
static void epd_sim_fill_state(const epd_engine_impl_t *e, const epd_kv_pool_t *pool, uint32_t slot,
                               uint32_t layer, uint64_t h)
{
    epd_sim_fill_state_at(e, epd_sim_state(e, pool, layer, slot), layer, h);
}

/* The prefix hash of tokens [0, pos], read back from the pool. */
static uint64_t epd_sim_recover(const epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                                const epd_kv_seq_t *seq, uint32_t pos)
{
    const epd_kv_layout_t *kv = &e->info.kv;
    uint64_t hk;

    if (e->first_attn != UINT32_MAX) {
        unsigned char *b =
            epd_sim_block(e, pool, e->first_attn, seq->block_table[pos / kv->block_tokens]);

        memcpy(&hk, b + (size_t)(pos % kv->block_tokens) * e->row_bytes, 8);
        return hk ^ e->key[e->first_attn];
    }
    memcpy(&hk, epd_sim_state(e, pool, e->first_linear, seq->state_slot), 8);
    return hk ^ e->key[e->first_linear];
}

/* A few printable-byte candidates with pseudo-random scores over a low
 * floor: greedy decoding gives a deterministic stream that depends on the
 * prefix; EOS stays at the floor, so requests end at their max_tokens. */
static void epd_sim_logits(const epd_engine_impl_t *e, uint64_t h, float *logits)
{
    uint64_t x = epd_sim_mix(h ^ e->logit_key);

    for (uint32_t i = 0; i < e->info.vocab_size; i++) {
        logits[i] = EPD_SIM_LOGIT_FLOOR;
    }
    for (int c = 0; c < EPD_SIM_LOGIT_CANDIDATES; c++) {
        x = epd_sim_mix(x + EPD_SIM_G);
        logits[32 + (x & 0xffffffffu) % 95] = (float)((x >> 32) % 1000) / 100.0f;
    }
}

/* ---- time ------------------------------------------------------------------ */

static void epd_sim_wait_until(const epd_engine_impl_t *e, uint64_t deadline_ns)
{
    if (e->conf.mode == EPD_SIM_SPIN) {
        while (epd_time_now_ns() < deadline_ns) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        }
        return;
    }
#if defined(__linux__)
    {
        /* The default 50 us timer slack would end every short layer late:
         * ask for 1 ns on this (compute) thread, once. */
        static _Thread_local int slack_set;

        if (!slack_set) {
            prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
            slack_set = 1;
        }
    }
#endif
    {
        struct timespec ts = {.tv_sec = (time_t)(deadline_ns / EPD_NSEC_PER_SEC),
                              .tv_nsec = (long)(deadline_ns % EPD_NSEC_PER_SEC)};

        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
        }
    }
}

static uint64_t epd_sim_ns(double seconds)
{
    /* a day at most: keeps deadlines far from overflowing with any profile */
    return seconds < 86400.0 ? (uint64_t)llround(seconds * 1e9) : 86400 * EPD_NSEC_PER_SEC;
}

/* Says once that filling took longer than the modelled time. */
static void epd_sim_check_fill(epd_engine_impl_t *e, uint64_t req_id, const char *what,
                               uint64_t fill_ns, double model_s, uint64_t bytes)
{
    if (e->warned || fill_ns <= epd_sim_ns(model_s)) {
        return;
    }
    e->warned = 1;
    epd_log_info(EPD_SIM_LOG, req_id,
                 "%s: writing %llu bytes took %.1f us, more than the modelled %.1f us: the timing "
                 "model cannot be honoured at scale %g on this CPU (or the pool's pages were "
                 "touched for the first time; said once)",
                 what, (unsigned long long)bytes, fill_ns / 1e3, model_s * 1e6, e->conf.scale);
}

/* ---- open / close ----------------------------------------------------------- */

static void epd_sim_close(epd_engine_impl_t *e)
{
    if (e == NULL) {
        return;
    }
    epd_free(e->d_hash);
    epd_free(e->p_hash);
    epd_free(e);
}

static void epd_sim_fill_info(epd_engine_impl_t *e, uint32_t block_tokens, uint32_t max_batch,
                              uint32_t max_context)
{
    const epd_sim_timing_t *t = &e->timing;
    epd_engine_info_t *info = &e->info;
    epd_kv_layout_t *kv = &info->kv;

    memset(info, 0, sizeof(*info));
    info->vocab_size = e->conf.vocab != 0 ? e->conf.vocab : e->conf.model.vocab;
    info->bos_token = EPD_SIM_BOS;
    info->eos_token = EPD_SIM_EOS;
    info->max_context = max_context;
    info->max_batch = max_batch;
    info->image_token = -1; /* no vision encoder */
    kv->n_layers = t->n_layers;
    e->first_attn = UINT32_MAX;
    e->first_linear = UINT32_MAX;
    for (uint32_t l = 0; l < t->n_layers; l++) {
        kv->kind[l] = t->kind[l];
        if (kv->kind[l] == EPD_LAYER_ATTENTION) {
            e->first_attn = e->first_attn == UINT32_MAX ? l : e->first_attn;
            kv->kind_index[l] = kv->n_attn_layers++;
        } else {
            e->first_linear = e->first_linear == UINT32_MAX ? l : e->first_linear;
            kv->kind_index[l] = kv->n_linear_layers++;
        }
    }
    kv->dtype = e->conf.model.kv_dtype;
    kv->block_tokens = block_tokens;
    kv->n_kv_heads = t->n_kv_heads_scaled;
    kv->head_dim = t->head_dim_scaled;
    kv->block_bytes =
        2ull * kv->n_kv_heads * block_tokens * kv->head_dim * epd_dtype_size(kv->dtype);
    kv->n_state_heads = kv->n_linear_layers > 0 ? 1 : 0; /* the state is opaque bytes */
    kv->state_bytes = t->state_bytes_scaled;
    e->row_bytes = (size_t)kv->head_dim * epd_dtype_size(kv->dtype);
}

/* Modelled seconds of a whole prefill of n tokens from position 0. */
static double epd_sim_prefill_total(const epd_sim_timing_t *t, uint32_t n)
{
    double s = 0.0;

    for (uint32_t l = 0; l < t->n_layers; l++) {
        s += epd_sim_prefill_seconds(t, l, 0, n);
    }
    return s;
}

static epd_status_t epd_sim_open(const epd_engine_config_t *config, epd_engine_impl_t **impl_p)
{
    uint32_t block_tokens = config->block_tokens ? config->block_tokens : 16;
    uint32_t max_batch = config->max_batch ? config->max_batch : 64;
    uint32_t max_context;
    epd_engine_impl_t *e;
    epd_rng_t rng;
    epd_status_t status;

    if (config->model_dir == NULL) {
        epd_log_error(EPD_SIM_LOG, 0, "no model folder given (a folder holding %s)",
                      EPD_SIM_CONF_FILE);
        return EPD_ERR_INVALID_PARAM;
    }
    if (block_tokens > 4096 || max_batch > 4096) {
        epd_log_error(EPD_SIM_LOG, 0, "block_tokens %u / max_batch %u out of range (1..4096)",
                      block_tokens, max_batch);
        return EPD_ERR_INVALID_PARAM;
    }
    e = epd_calloc(1, sizeof(*e));
    if (e == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    status = epd_sim_conf_load(config->model_dir, &e->conf);
    if (status != EPD_OK) {
        goto err_close;
    }
    status = epd_sim_timing_init(&e->conf, block_tokens, &e->timing);
    if (status != EPD_OK) {
        goto err_close;
    }
    max_context = e->conf.model.max_context;
    if (config->max_context != 0 && config->max_context < max_context) {
        max_context = config->max_context;
    }
    /* a chunk never exceeds max_context: with this, prefill allocates
     * nothing (pages are touched only as long prompts use them) */
    e->p_hash = epd_malloc((size_t)max_context * sizeof(*e->p_hash));
    e->d_hash = epd_calloc(max_batch, sizeof(*e->d_hash));
    if (e->p_hash == NULL || e->d_hash == NULL) {
        status = EPD_ERR_NO_MEMORY;
        goto err_close;
    }
    epd_sim_fill_info(e, block_tokens, max_batch, max_context);
    epd_rng_seed(&rng, e->conf.seed);
    for (size_t i = 0; i < sizeof(e->table); i += 8) {
        uint64_t w = epd_rng_next(&rng);

        memcpy(e->table + i, &w, 8);
    }
    for (uint32_t l = 0; l < EPD_KV_MAX_LAYERS; l++) {
        e->key[l] = epd_rng_next(&rng);
    }
    e->logit_key = epd_rng_next(&rng);
    /* the bytes are a function of the seed (the table and keys), the layout
     * and the vocabulary: the digest of the first and the last */
    {
        uint64_t id[2] = {e->conf.seed, e->info.vocab_size};

        epd_hash128(id, sizeof(id), 0x73696d /* "sim" */, e->info.model_digest);
    }
    epd_log_debug(EPD_SIM_LOG, 0,
                  "%s: %s on %u x %s, scale %g (KV x%.4g, state x%.4g), %s; %u layers (%u "
                  "attention), %u-token blocks of %llu bytes (%u x %u %s), state %llu bytes, "
                  "context %u; 1024-token prefill %.3f ms",
                  config->model_dir, e->conf.model.name, e->conf.devices, e->conf.accel.name,
                  e->conf.scale, e->timing.attn_factor, e->timing.linear_factor,
                  e->conf.mode == EPD_SIM_SPIN ? "spin" : "sleep", e->info.kv.n_layers,
                  e->info.kv.n_attn_layers, block_tokens,
                  (unsigned long long)e->info.kv.block_bytes, e->info.kv.n_kv_heads,
                  e->info.kv.head_dim, epd_dtype_name(e->info.kv.dtype),
                  (unsigned long long)e->info.kv.state_bytes, max_context,
                  epd_sim_prefill_total(&e->timing, 1024) * 1e3);
    *impl_p = e;
    return EPD_OK;

err_close:
    epd_sim_close(e);
    return status;
}

static void epd_sim_describe(const epd_engine_impl_t *e, epd_engine_info_t *info_p)
{
    *info_p = e->info;
}

/* ---- tokenizer: one token per byte, plus BOS and EOS (as `ref`) ------------- */

static epd_status_t epd_sim_tokenize(const epd_engine_impl_t *e, const char *text, size_t len,
                                     int add_bos, int32_t *tokens, size_t cap, size_t *n_p)
{
    (void)e;
    return epd__byte_tokenize(EPD_SIM_BOS, text, len, add_bos, tokens, cap, n_p);
}

static epd_status_t epd_sim_detokenize(const epd_engine_impl_t *e, const int32_t *tokens, size_t n,
                                       char *buf, size_t cap, size_t *len_p)
{
    (void)e;
    return epd__byte_detokenize(tokens, n, buf, cap, len_p);
}

/* ---- prefill / decode ------------------------------------------------------- */

static epd_status_t epd_sim_prefill(epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                                    const epd_prefill_args_t *args, const epd_engine_sink_t *sink,
                                    float *logits)
{
    const epd_kv_layout_t *kv = &e->info.kv;
    uint64_t t0 = epd_time_now_ns();
    uint32_t T = args->n_tokens;
    uint32_t start = args->start;
    uint64_t *h = e->p_hash;
    double elapsed = 0.0; /* modelled seconds of layers 0..l */
    epd_status_t status = EPD_OK;

    h[0] = epd_sim_chain(start == 0 ? EPD_SIM_H0 : epd_sim_recover(e, pool, &args->seq, start - 1),
                         args->tokens[0]);
    for (uint32_t i = 1; i < T; i++) {
        h[i] = epd_sim_chain(h[i - 1], args->tokens[i]);
    }
    epd_sim_logits(e, h[T - 1], logits);
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        double layer_s = epd_sim_prefill_seconds(&e->timing, l, start, T);
        uint64_t fill_start = epd_time_now_ns();
        uint64_t bytes;
        epd_layer_done_t done;

        memset(&done, 0, sizeof(done));
        done.req_id = args->seq.req_id;
        done.layer = l;
        done.kind = (epd_layer_kind_t)kv->kind[l];
        done.tok_start = start;
        done.tok_end = start + T;
        if (kv->kind[l] == EPD_LAYER_ATTENTION) {
            /* replayed positions keep the KV a prefix cache gave them */
            uint32_t from = args->replay_end > start ? args->replay_end : start;

            epd_sim_fill_rows(e, pool, &args->seq, l, from, start + T - from, h + (from - start));
            done.tok_start = from;
            done.first_block = from / kv->block_tokens;
            done.n_blocks = (start + T - 1) / kv->block_tokens - done.first_block + 1;
            done.block_ids = args->seq.block_table + done.first_block;
            bytes = (uint64_t)T * kv->block_bytes / kv->block_tokens;
        } else {
            for (uint32_t c = 0; c < args->n_ckpts; c++) {
                epd_sim_fill_state_at(e,
                                      (unsigned char *)args->ckpts[c].dst +
                                          (size_t)kv->kind_index[l] * kv->state_bytes,
                                      l, h[args->ckpts[c].pos - 1 - start]);
            }
            epd_sim_fill_state(e, pool, args->seq.state_slot, l, h[T - 1]);
            done.state_slot = args->seq.state_slot;
            bytes = kv->state_bytes;
        }
        epd_sim_check_fill(e, args->seq.req_id, "prefill", epd_time_now_ns() - fill_start, layer_s,
                           bytes);
        /* the layer's KV is final now, before the rest of the layer's
         * modelled time (attention output, MLP): report it, as ref does and
         * as a real engine can once the layer's K/V are written */
        if (sink != NULL && sink->cb != NULL) {
            status = sink->cb(sink->ctx, l, &done);
            if (status != EPD_OK) {
                break;
            }
        }
        elapsed += layer_s;
        epd_sim_wait_until(e, t0 + epd_sim_ns(elapsed));
    }
    return status;
}

static epd_status_t epd_sim_decode(epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                                   const epd_decode_req_t *reqs, uint32_t B, float *logits)
{
    const epd_kv_layout_t *kv = &e->info.kv;
    uint64_t t0 = epd_time_now_ns();
    uint64_t bytes = 0;
    double step_s = 0.0;

    for (uint32_t b = 0; b < B; b++) {
        const epd_decode_req_t *r = &reqs[b];

        e->d_hash[b] = epd_sim_chain(
            r->pos == 0 ? EPD_SIM_H0 : epd_sim_recover(e, pool, &r->seq, r->pos - 1), r->token);
    }
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        for (uint32_t b = 0; b < B; b++) {
            if (kv->kind[l] == EPD_LAYER_ATTENTION) {
                epd_sim_fill_rows(e, pool, &reqs[b].seq, l, reqs[b].pos, 1, &e->d_hash[b]);
                bytes += kv->block_bytes / kv->block_tokens;
            } else {
                epd_sim_fill_state(e, pool, reqs[b].seq.state_slot, l, e->d_hash[b]);
                bytes += kv->state_bytes;
            }
        }
        step_s += epd_sim_decode_seconds(&e->timing, l, reqs, B);
    }
    for (uint32_t b = 0; b < B; b++) {
        epd_sim_logits(e, e->d_hash[b], logits + (size_t)b * e->info.vocab_size);
    }
    epd_sim_check_fill(e, reqs[0].seq.req_id, "decode", epd_time_now_ns() - t0, step_s, bytes);
    epd_sim_wait_until(e, t0 + epd_sim_ns(step_s));
    return EPD_OK;
}

static void epd_sim_release(epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                            const epd_kv_seq_t *seq)
{
    /* As `ref`: nothing per request outside the pool; clearing the state
     * slots makes a stale state impossible to read by mistake. */
    for (uint32_t l = 0; l < e->info.kv.n_layers; l++) {
        if (e->info.kv.kind[l] == EPD_LAYER_LINEAR) {
            memset(epd_sim_state(e, pool, l, seq->state_slot), 0, e->info.kv.state_bytes);
        }
    }
}

/* The timing model has no vision encoder (yet): images are refused. */
static epd_status_t epd_sim_encode_image(epd_engine_impl_t *e, const epd_image_view_t *image,
                                         float *out)
{
    (void)e;
    (void)image;
    (void)out;
    return EPD_ERR_UNSUPPORTED;
}

const epd_engine_ops_t epd__sim_ops = {
    .size = sizeof(epd_engine_ops_t),
    .abi_version = EPD_ENGINE_ABI_VERSION,
    .name = "sim",
    .open = epd_sim_open,
    .close = epd_sim_close,
    .describe = epd_sim_describe,
    .tokenize = epd_sim_tokenize,
    .detokenize = epd_sim_detokenize,
    .prefill = epd_sim_prefill,
    .decode = epd_sim_decode,
    .release = epd_sim_release,
    .encode_image = epd_sim_encode_image,
};
