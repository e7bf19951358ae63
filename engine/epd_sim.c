/*
 * epd_sim.c — the `sim` engine: a timing model behind the engine interface,
 * with an honest split between what an accelerator does on the device
 * (modelled: it costs modelled time, no host CPU) and what the host does
 * (real: the stamps below, and whatever the caller does with the KV).
 *
 * Opened with a model folder holding sim.conf (epd_sim.h), it describes the
 * KV layout of the profiled model (scaled), and for each prefill layer l
 * (t0 = the call's start, E_l = the modelled end of layers 0..l-1):
 *   1. writes the layer's stamps (epd_kv_stamp.h) into the caller's pool —
 *      the host's share: 64 bytes per block (per state slot) — and, once
 *      per (layer, block) of a pool, the block's template body;
 *   2. with want_sums, the layer's checksum (EPD_KV_SUM_STAMPED) from those
 *      stamps: the result of a device checksum kernel, whose modelled time
 *      (the layer's bytes / the devices' memory bandwidth) is added to the
 *      layer;
 *   3. calls the sink once the clock has passed E_l + ready_l (+ the
 *      kernel): where the modelled layer has produced its KV (its QKV
 *      projection, epd_sim_timing.c) — the transfer of layer l overlaps the
 *      rest of layer l (attention, MLP) and layers l+1..; never before;
 *   4. goes on with layer l+1 (its stamps are the host's share of launching
 *      it early); after the last layer, waits until the modelled end.
 * Deadlines are absolute from t0: oversleeping never accumulates and the
 * host's work is inside the modelled time, not added to it.  Sleep mode
 * sleeps (clock_nanosleep, TIMER_ABSTIME), at most once per 200 us except
 * for the first and the last layer's readiness and the end (layers ready
 * in between are reported at the next wake-up: late by less than that,
 * never early), and spins only through waits under 20 us: a timer costs
 * 25-40 us of CPU on a virtual machine and wakes about as late, and a
 * compute thread that spins through short layers takes a core from the
 * transfer it models a device for.  A decode step writes every request's
 * stamp of each layer, then waits once for the sum of its layers' times.
 *
 * The bytes.  KV "produced on the device" is not computed: a block's body
 * (all but its 64 stamp bytes) is a template — pseudo-random bytes drawn
 * from the seed, the layer and the block id — written into a pool once, its
 * digest kept; a state slot likewise.  What depends on the request is in
 * the stamps: request id, layer, block index, token count, the decode
 * incarnation's tag (epd_kv_seq_t.stamp_tag) and, as `hk`, the prefix hash
 *   h(-1) = EPD_SIM_H0,  h(p) = mix(h(p-1) ^ (token(p) + 1) * G)
 * of the unit's last token, xor key(l).  Logits are a function of the seed
 * and h(last) only.  Hence the same prompt gives the same stamps in any
 * process, a chunked prefill the same as a whole one, and a decode step or
 * a later chunk recovers h(p-1) from the pool itself (the first attention
 * layer's block holding p-1, else the first linear layer's state), so a
 * decode node that received the KV continues exactly as the node that
 * computed it: disaggregated equals colocated.  A misrouted, misplaced,
 * torn or missing write changes the stamps — which decode checks — and the
 * checksums.  What is NOT real here: the bodies' contents (they do not
 * depend on the prompt) and the device time (slept, not spent); the bytes
 * moved are real and of the real (scaled) size.
 *
 * Allocation: the template digests of a pool, once per pool (the first
 * prefill with it); nothing per request.
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
#include "epd_kv_stamp.h"
#include "epd_kvq.h"
#include "epd_log.h"
#include "epd_rng.h"
#include "epd_sim.h"
#include "epd_time.h"

#define EPD_SIM_LOG "sim"
#define EPD_SIM_BOS 256
#define EPD_SIM_EOS 257
#define EPD_SIM_TB_BYTES 65536u /* the byte table templates are copied from (a power of 2) */
#define EPD_SIM_TB_SPAN 4096u   /* longest piece copied from one table offset */
#define EPD_SIM_H0 0x6570642d73696d00ull /* "epd-sim" */
#define EPD_SIM_G 0x9E3779B97F4A7C15ull
#define EPD_SIM_C 0xD1B54A32D192ED03ull
#define EPD_SIM_STATE_KEY 0x5374617465ull /* "State" */
#define EPD_SIM_LOGIT_FLOOR (-20.0f)
#define EPD_SIM_LOGIT_CANDIDATES 8
#define EPD_SIM_AHEAD 8      /* blocks whose stamps are prefetched ahead */
#define EPD_SIM_SUM_UNITS 64 /* units' stamps gathered per hash update */
/* sleep mode: waits shorter than this are spun (see epd_sim_wait_until) */
#define EPD_SIM_SPIN_BELOW_NS (20 * EPD_NSEC_PER_USEC)
/* sleep mode: how late a timer usually wakes here; precise waits spin that
 * long after it (see epd_sim_wait_until) */
#define EPD_SIM_EARLY_NS (60 * EPD_NSEC_PER_USEC)
/* sleep mode: wake-ups at least this far apart (see epd_sim_prefill) */
#define EPD_SIM_WAKE_MIN_NS (200 * EPD_NSEC_PER_USEC)

/* The template digests of one pool: 0 = the unit's template is not written
 * yet (a digest of 0 only costs a rewrite). */
typedef struct {
    const void *base; /* the pool they describe (NULL: none yet) */
    uint32_t n_blocks;
    uint32_t n_slots;
    uint64_t *blk;   /* [n_attn_layers][n_blocks] */
    uint64_t *state; /* [n_linear_layers][n_slots] */
} epd_sim_tmpl_t;

struct epd_engine_impl {
    epd_sim_conf_t conf;
    epd_sim_timing_t timing;
    epd_engine_info_t info;
    unsigned char table[EPD_SIM_TB_BYTES + EPD_SIM_TB_SPAN]; /* seeded bytes */
    uint64_t key[EPD_KV_MAX_LAYERS];
    uint64_t logit_key;
    uint32_t first_attn;   /* UINT32_MAX when none */
    uint32_t first_linear; /* UINT32_MAX when none */
    uint64_t *p_hash;      /* [max_context] prefill scratch: prefix hash of each token */
    uint64_t *d_hash;      /* [max_batch] decode scratch */
    epd_hash_state_t *sum; /* prefill scratch: a layer's checksum */
    epd_sim_tmpl_t tmpl;   /* compute thread */
    /* prefill scratch: each layer's report and when its KV exists */
    epd_layer_done_t done[EPD_KV_MAX_LAYERS];
    uint64_t ready_ns[EPD_KV_MAX_LAYERS];
    int warned; /* the host-too-slow line was written */
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

static void epd_sim_fill(const epd_engine_impl_t *e, unsigned char *dst, size_t len, uint64_t z)
{
    size_t done = 0;

    /* pieces of the seeded table at offsets drawn from z */
    while (done < len) {
        size_t n = len - done < EPD_SIM_TB_SPAN ? len - done : EPD_SIM_TB_SPAN;

        memcpy(dst + done, e->table + ((z ^ (z >> 29)) & (EPD_SIM_TB_BYTES - 1)), n);
        done += n;
        z = epd_sim_mix(z + EPD_SIM_G);
    }
}

/* Block `block` of attention layer `layer` (blocks of layers of another
 * KV dtype differ in size: epd_kv_block_offset). */
static inline unsigned char *epd_sim_block(const epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                                           uint32_t layer, uint32_t block)
{
    uint64_t off = 0;

    (void)epd_kv_block_offset(&e->info.kv, pool->n_blocks, layer, block, &off);
    return (unsigned char *)pool->base + off;
}

static inline unsigned char *epd_sim_state(const epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                                           uint32_t layer, uint32_t slot)
{
    const epd_kv_layout_t *kv = &e->info.kv;

    return (unsigned char *)pool->base + (uint64_t)pool->n_blocks * epd_kv_block_set_bytes(kv) +
           ((uint64_t)kv->kind_index[layer] * pool->n_state_slots + slot) * kv->state_bytes;
}

static void epd_sim_tmpl_free(epd_sim_tmpl_t *t)
{
    epd_free(t->blk);
    epd_free(t->state);
    memset(t, 0, sizeof(*t));
}

/* The template digests of `pool` (allocated the first time this pool is
 * used; another pool starts afresh: its templates are rewritten once). */
static epd_status_t epd_sim_tmpl_for(epd_engine_impl_t *e, const epd_kv_pool_t *pool)
{
    const epd_kv_layout_t *kv = &e->info.kv;
    epd_sim_tmpl_t *t = &e->tmpl;

    if (t->base == pool->base && t->n_blocks == pool->n_blocks &&
        t->n_slots == pool->n_state_slots) {
        return EPD_OK;
    }
    epd_sim_tmpl_free(t);
    t->blk = epd_calloc((size_t)kv->n_attn_layers * pool->n_blocks + 1, sizeof(*t->blk));
    t->state = epd_calloc((size_t)kv->n_linear_layers * pool->n_state_slots + 1,
                          sizeof(*t->state));
    if (t->blk == NULL || t->state == NULL) {
        epd_sim_tmpl_free(t);
        return EPD_ERR_NO_MEMORY;
    }
    t->base = pool->base;
    t->n_blocks = pool->n_blocks;
    t->n_slots = pool->n_state_slots;
    return EPD_OK;
}

/* The body digest of a unit, its template written first when it is not
 * yet (once per pool and unit: the device's KV has no host cost). */
static uint64_t epd_sim_template(const epd_engine_impl_t *e, uint64_t *digest, unsigned char *unit,
                                 uint64_t unit_bytes, uint64_t z)
{
    if (*digest == 0) {
        epd_sim_fill(e, unit + EPD_KV_STAMP_HALF, (size_t)(unit_bytes - EPD_KV_STAMP_BYTES), z);
        *digest = epd_kv_stamp_body(unit, unit_bytes);
    }
    return *digest;
}

/* Stamps the units of attention layer `layer` holding positions [pos, end)
 * (h[i] is the prefix hash of position pos + i), their templates first
 * where needed, and feeds the stamps of every unit of the request up to
 * `end` to `sum` (NULL: no checksum). */
static void epd_sim_stamp_rows(epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                               const epd_kv_seq_t *seq, uint32_t layer, uint32_t pos, uint32_t end,
                               const uint64_t *h, epd_hash_state_t *sum)
{
    const epd_kv_layout_t *kv = &e->info.kv;
    uint32_t bt = kv->block_tokens;
    uint64_t bb = epd_kv_layer_block_bytes(kv, layer);
    uint64_t *dig = e->tmpl.blk + (size_t)kv->kind_index[layer] * pool->n_blocks;
    uint32_t first = pos / bt;
    uint32_t last = (end - 1) / bt;

    unsigned char buf[EPD_SIM_SUM_UNITS * EPD_KV_STAMP_BYTES]; /* stamps to hash, in order */
    uint32_t n_buf = 0;

    if (sum != NULL) {
        epd_hash_state_reset(sum, 0);
    }
    for (uint32_t i = sum != NULL ? 0 : first; i <= last; i++) {
        uint32_t id = seq->block_table[i];
        unsigned char *b = epd_sim_block(e, pool, layer, id);

        if (i + EPD_SIM_AHEAD <= last) {
            /* the stamps a few blocks ahead are cache misses (a block's two
             * ends, blocks apart): start them now so that they overlap */
            unsigned char *a = epd_sim_block(e, pool, layer, seq->block_table[i + EPD_SIM_AHEAD]);

            __builtin_prefetch(a, 1);
            __builtin_prefetch(a + bb - EPD_KV_STAMP_HALF, 1);
        }
        if (i >= first) {
            uint32_t hi = (i + 1) * bt < end ? (i + 1) * bt : end; /* past the block's last */
            epd_kv_stamp_t st = {.req_id = seq->req_id,
                                 .tag = seq->stamp_tag,
                                 .hk = h[hi - 1 - pos] ^ e->key[layer],
                                 .layer = layer,
                                 .index = i,
                                 .count = hi - i * bt};

            st.body = epd_sim_template(
                e, &dig[id], b, bb, epd_sim_mix(e->key[layer] ^ ((uint64_t)id + 1) * EPD_SIM_C));
            epd_kv_stamp_put(b, bb, &st);
        }
        if (sum != NULL) {
            /* gathered, hashed in large pieces (one update per unit costs
             * more than the hash itself) */
            memcpy(buf + (size_t)n_buf * EPD_KV_STAMP_BYTES, b, EPD_KV_STAMP_HALF);
            memcpy(buf + (size_t)n_buf * EPD_KV_STAMP_BYTES + EPD_KV_STAMP_HALF,
                   b + bb - EPD_KV_STAMP_HALF, EPD_KV_STAMP_HALF);
            if (++n_buf == EPD_SIM_SUM_UNITS) {
                epd_hash_state_update(sum, buf, sizeof(buf));
                n_buf = 0;
            }
        }
    }
    if (sum != NULL && n_buf > 0) {
        epd_hash_state_update(sum, buf, (size_t)n_buf * EPD_KV_STAMP_BYTES);
    }
}

/* Stamps the state of linear layer `layer` after a prefix of `count` tokens
 * ending with hash h (its template first where needed), and feeds it to
 * `sum` (NULL: none). */
static void epd_sim_stamp_state(epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                                const epd_kv_seq_t *seq, uint32_t layer, uint32_t count,
                                uint64_t h, epd_hash_state_t *sum)
{
    const epd_kv_layout_t *kv = &e->info.kv;
    unsigned char *s = epd_sim_state(e, pool, layer, seq->state_slot);
    uint64_t *dig = e->tmpl.state + (size_t)kv->kind_index[layer] * pool->n_state_slots;
    epd_kv_stamp_t st = {.req_id = seq->req_id,
                         .tag = seq->stamp_tag,
                         .hk = h ^ e->key[layer],
                         .layer = layer,
                         .index = 0,
                         .count = count};

    st.body = epd_sim_template(
        e, &dig[seq->state_slot], s, kv->state_bytes,
        epd_sim_mix(e->key[layer] ^ EPD_SIM_STATE_KEY ^ ((uint64_t)seq->state_slot + 1) * EPD_SIM_C));
    epd_kv_stamp_put(s, kv->state_bytes, &st);
    if (sum != NULL) {
        epd_hash_state_reset(sum, 0);
        epd_hash_state_update(sum, s, EPD_KV_STAMP_HALF);
        epd_hash_state_update(sum, s + kv->state_bytes - EPD_KV_STAMP_HALF, EPD_KV_STAMP_HALF);
    }
}

/* A state checkpoint of linear layer `layer` at ckpt->pos (prefix hash h):
 * its stamp only — what sim reads back (epd_sim_recover) once a prefix
 * cache restores it into a slot; the body is the slot's template again
 * then. */
static void epd_sim_stamp_ckpt(const epd_engine_impl_t *e, const epd_kv_seq_t *seq, uint32_t layer,
                               const epd_state_ckpt_t *ckpt, uint64_t h)
{
    const epd_kv_layout_t *kv = &e->info.kv;
    epd_kv_stamp_t st = {.req_id = seq->req_id,
                         .tag = seq->stamp_tag,
                         .hk = h ^ e->key[layer],
                         .layer = layer,
                         .index = 0,
                         .count = ckpt->pos};

    epd_kv_stamp_put((unsigned char *)ckpt->dst + (size_t)kv->kind_index[layer] * kv->state_bytes,
                     kv->state_bytes, &st);
}

/* A decode step's share of the host: the stamp of the unit holding `pos`
 * (the device wrote the token's KV into the body; the body digest stays
 * what the unit's tail says, and no template is written here). */
static void epd_sim_stamp_step(const epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                               const epd_kv_seq_t *seq, uint32_t layer, uint32_t pos, uint64_t h)
{
    const epd_kv_layout_t *kv = &e->info.kv;
    uint32_t bt = kv->block_tokens;
    epd_kv_stamp_t st = {.req_id = seq->req_id,
                         .tag = seq->stamp_tag,
                         .hk = h ^ e->key[layer],
                         .layer = layer};
    unsigned char *u;
    uint64_t bytes;

    if (kv->kind[layer] == EPD_LAYER_ATTENTION) {
        u = epd_sim_block(e, pool, layer, seq->block_table[pos / bt]);
        bytes = epd_kv_layer_block_bytes(kv, layer);
        st.index = pos / bt;
        st.count = pos % bt + 1;
    } else {
        u = epd_sim_state(e, pool, layer, seq->state_slot);
        bytes = kv->state_bytes;
        st.count = pos + 1;
    }
    st.body = epd_kv_stamp_body_field(u, bytes);
    epd_kv_stamp_put(u, bytes, &st);
}

/* The prefix hash of tokens [0, pos], read back from the pool. */
static uint64_t epd_sim_recover(const epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                                const epd_kv_seq_t *seq, uint32_t pos)
{
    const epd_kv_layout_t *kv = &e->info.kv;
    epd_kv_stamp_t st;

    if (e->first_attn != UINT32_MAX) {
        (void)epd_kv_stamp_get(
            epd_sim_block(e, pool, e->first_attn, seq->block_table[pos / kv->block_tokens]),
            epd_kv_layer_block_bytes(kv, e->first_attn), &st);
        return st.hk ^ e->key[e->first_attn];
    }
    (void)epd_kv_stamp_get(epd_sim_state(e, pool, e->first_linear, seq->state_slot),
                           kv->state_bytes, &st);
    return st.hk ^ e->key[e->first_linear];
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

static void epd_sim_spin_until(uint64_t deadline_ns)
{
    while (epd_time_now_ns() < deadline_ns) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
}

/* Waits until deadline_ns; `precise`: sleeps only until a timer's usual
 * lateness before it and spins the rest (the end of a prefill, its last
 * layer's readiness: what A and the transfer's tail are measured against). */
static void epd_sim_wait_until(const epd_engine_impl_t *e, uint64_t deadline_ns, int precise)
{
    uint64_t now = epd_time_now_ns();

    if (now >= deadline_ns) {
        return;
    }
    if (precise && e->conf.mode == EPD_SIM_SLEEP && deadline_ns - now > EPD_SIM_EARLY_NS) {
        epd_sim_wait_until(e, deadline_ns - EPD_SIM_EARLY_NS, 0);
        epd_sim_spin_until(deadline_ns);
        return;
    }
    /* a wait shorter than a timer's own cost is spun: a clock_nanosleep
     * costs 25-40 us of CPU on a virtual machine (and wakes as late) */
    if (e->conf.mode == EPD_SIM_SPIN || deadline_ns - now < EPD_SIM_SPIN_BELOW_NS) {
        epd_sim_spin_until(deadline_ns);
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

/* Says once that the host's share of a layer (its stamps, or a template
 * written for the first time) took longer than the modelled time it must
 * fit in: the layer ends late (later ones catch up when they can). */
static void epd_sim_check_host(epd_engine_impl_t *e, uint64_t req_id, const char *what,
                               uint64_t host_ns, double model_s)
{
    if (e->warned || host_ns <= epd_sim_ns(model_s)) {
        return;
    }
    e->warned = 1;
    epd_log_info(EPD_SIM_LOG, req_id,
                 "%s: the host's share (stamps, first-time templates) took %.1f us, more than the "
                 "modelled %.1f us it must fit in: the timing model is not honoured on this CPU "
                 "at scale %g (a pool's first use writes its templates; said once)",
                 what, host_ns / 1e3, model_s * 1e6, e->conf.scale);
}

/* ---- open / close ----------------------------------------------------------- */

static void epd_sim_close(epd_engine_impl_t *e)
{
    if (e == NULL) {
        return;
    }
    epd_sim_tmpl_free(&e->tmpl);
    epd_hash_state_destroy(e->sum);
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
    info->device_mem_bw = t->mem_bw;
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
    if (t->kv_mapped) {
        /* a KV dtype map: each attention layer's blocks in its own dtype
         * (scales inside the block for fp8 / int8), as the timing counts */
        epd_kvq_layout_apply(kv, t->kv_dtype);
    }
    kv->n_state_heads = kv->n_linear_layers > 0 ? 1 : 0; /* the state is opaque bytes */
    kv->state_bytes = t->state_bytes_scaled;
}

/* The smallest block of an attention layer (UINT64_MAX when none). */
static uint64_t epd_sim_min_block_bytes(const epd_kv_layout_t *kv)
{
    uint64_t least = UINT64_MAX;

    for (uint32_t l = 0; l < kv->n_layers; l++) {
        uint64_t bb = epd_kv_layer_block_bytes(kv, l);

        least = bb != 0 && bb < least ? bb : least;
    }
    return least;
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
    char map[EPD_KVQ_MAP_MAX];
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
    if (config->kv_dtype != NULL) {
        /* --kv-dtype wins over sim.conf's kv_dtype_map and the profile's
         * kv_dtype; "" is the grammar's all-f32 */
        int n = snprintf(e->conf.kv_dtype_map, sizeof(e->conf.kv_dtype_map), "%s",
                         config->kv_dtype[0] != '\0' ? config->kv_dtype : "f32");

        if (n < 0 || (size_t)n >= sizeof(e->conf.kv_dtype_map)) {
            epd_log_error(EPD_SIM_LOG, 0, "--kv-dtype: KV dtype map too long");
            status = EPD_ERR_INVALID_PARAM;
            goto err_close;
        }
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
    status = epd_hash_state_create(0, &e->sum);
    if (status != EPD_OK) {
        goto err_close;
    }
    epd_sim_fill_info(e, block_tokens, max_batch, max_context);
    if ((e->info.kv.n_attn_layers > 0 && epd_sim_min_block_bytes(&e->info.kv) < EPD_KV_STAMP_MIN) ||
        (e->info.kv.n_linear_layers > 0 && e->info.kv.state_bytes < EPD_KV_STAMP_MIN)) {
        epd_log_error(EPD_SIM_LOG, 0,
                      "%s: blocks of %llu bytes / states of %llu bytes: the KV stamps need %u",
                      config->model_dir, (unsigned long long)epd_sim_min_block_bytes(&e->info.kv),
                      (unsigned long long)e->info.kv.state_bytes, EPD_KV_STAMP_MIN);
        status = EPD_ERR_INVALID_PARAM;
        goto err_close;
    }
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
    epd_kvq_map_format(&e->info.kv, map, sizeof(map));
    epd_log_debug(EPD_SIM_LOG, 0,
                  "%s: %s on %u x %s, scale %g (KV x%.4g, state x%.4g), %s; %u layers (%u "
                  "attention), %u-token blocks of up to %llu bytes (%u x %u, KV %s), state %llu "
                  "bytes, context %u; 1024-token prefill %.3f ms",
                  config->model_dir, e->conf.model.name, e->conf.devices, e->conf.accel.name,
                  e->conf.scale, e->timing.attn_factor, e->timing.linear_factor,
                  e->conf.mode == EPD_SIM_SPIN ? "spin" : "sleep", e->info.kv.n_layers,
                  e->info.kv.n_attn_layers, block_tokens,
                  (unsigned long long)e->info.kv.block_bytes, e->info.kv.n_kv_heads,
                  e->info.kv.head_dim, map,
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

/* Reports the layers whose KV exists by now (their readiness is past):
 * pending layers [*next, n) in order.  A sink's refusal stops it. */
static epd_status_t epd_sim_fire(epd_engine_impl_t *e, const epd_engine_sink_t *sink,
                                 uint32_t *next, uint32_t n)
{
    uint64_t now = epd_time_now_ns();

    while (*next < n && e->ready_ns[*next] <= now) {
        uint32_t l = (*next)++;

        if (sink != NULL && sink->cb != NULL) {
            epd_status_t st = sink->cb(sink->ctx, l, &e->done[l]);

            if (st != EPD_OK) {
                return st;
            }
        }
    }
    return EPD_OK;
}

static epd_status_t epd_sim_prefill(epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                                    const epd_prefill_args_t *args, const epd_engine_sink_t *sink,
                                    float *logits)
{
    const epd_kv_layout_t *kv = &e->info.kv;
    uint64_t t0 = epd_time_now_ns();
    uint64_t last_wake = t0;
    uint32_t T = args->n_tokens;
    uint32_t start = args->start;
    uint32_t end = start + T;
    uint32_t L = kv->n_layers;
    uint32_t next = 0; /* the first layer not reported yet */
    uint64_t *h = e->p_hash;
    epd_hash_state_t *sum = args->want_sums ? e->sum : NULL;
    double elapsed = 0.0; /* modelled seconds of layers 0..l-1 (and their kernels) */
    epd_status_t status;

    status = epd_sim_tmpl_for(e, pool);
    if (status != EPD_OK) {
        epd_log_error(EPD_SIM_LOG, args->seq.req_id, "prefill: no memory for the pool's templates");
        return status;
    }
    h[0] = epd_sim_chain(start == 0 ? EPD_SIM_H0 : epd_sim_recover(e, pool, &args->seq, start - 1),
                         args->tokens[0]);
    for (uint32_t i = 1; i < T; i++) {
        h[i] = epd_sim_chain(h[i - 1], args->tokens[i]);
    }
    epd_sim_logits(e, h[T - 1], logits);
    for (uint32_t l = 0; l < L; l++) {
        double layer_s = epd_sim_prefill_seconds(&e->timing, l, start, T);
        double ready_s = epd_sim_prefill_ready_seconds(&e->timing, l, start, T);
        double kernel_s = 0.0;
        uint64_t host_start = epd_time_now_ns();
        epd_layer_done_t *done = &e->done[l];

        /* the host's share of layer l: its stamps (launching it, early) */
        memset(done, 0, sizeof(*done));
        done->req_id = args->seq.req_id;
        done->layer = l;
        done->kind = (epd_layer_kind_t)kv->kind[l];
        done->tok_start = start;
        done->tok_end = end;
        if (kv->kind[l] == EPD_LAYER_ATTENTION) {
            /* replayed positions keep the KV a prefix cache gave them */
            uint32_t from = args->replay_end > start ? args->replay_end : start;

            epd_sim_stamp_rows(e, pool, &args->seq, l, from, end, h + (from - start), sum);
            done->tok_start = from;
            done->first_block = from / kv->block_tokens;
            done->n_blocks = (end - 1) / kv->block_tokens - done->first_block + 1;
            done->block_ids = args->seq.block_table + done->first_block;
            kernel_s = (double)((end - 1) / kv->block_tokens + 1) *
                       (double)epd_kv_layer_block_bytes(kv, l);
        } else {
            if (start > 0) {
                /* the slot may hold a checkpoint a prefix cache restored
                 * (its stamp gave h above), not this slot's template: write
                 * the template again so the body digest is the body's */
                e->tmpl.state[(size_t)kv->kind_index[l] * pool->n_state_slots +
                              args->seq.state_slot] = 0;
            }
            for (uint32_t c = 0; c < args->n_ckpts; c++) {
                epd_sim_stamp_ckpt(e, &args->seq, l, &args->ckpts[c],
                                   h[args->ckpts[c].pos - 1 - start]);
            }
            epd_sim_stamp_state(e, pool, &args->seq, l, end, h[T - 1], sum);
            done->state_slot = args->seq.state_slot;
            kernel_s = (double)kv->state_bytes;
        }
        if (sum != NULL) {
            /* the device's checksum kernel reads the layer once */
            kernel_s = epd_sim_bytes_seconds(&e->timing, kernel_s);
            done->has_sum = 1;
            done->sum_kind = EPD_KV_SUM_STAMPED;
            done->sum = epd_hash_state_digest(sum);
        } else {
            kernel_s = 0.0;
        }
        epd_sim_check_host(e, args->seq.req_id, "prefill", epd_time_now_ns() - host_start,
                           ready_s);
        /* the layer's KV (and its checksum) exist from here on, while the
         * modelled layer goes on with attention and MLP */
        e->ready_ns[l] = t0 + epd_sim_ns(elapsed + ready_s + kernel_s);
        elapsed += layer_s + kernel_s;
        /* Report what exists by now.  In sleep mode, a layer that is not
         * ready yet is waited for only when it is the first or the last,
         * or when its readiness is at least EPD_SIM_WAKE_MIN_NS after the
         * last wake-up: the others ride on the next wake-up, reported late
         * by less than that (never early) — a timer costs 25-40 us of CPU
         * on a VM, and a thread that spins through short layers takes a
         * core the transfer needs. */
        for (;;) {
            uint64_t due;

            status = epd_sim_fire(e, sink, &next, l + 1);
            if (status != EPD_OK || next > l) {
                break;
            }
            due = e->ready_ns[next];
            if (e->conf.mode == EPD_SIM_SLEEP && next != 0 && next + 1 != L && l + 1 < L &&
                due < last_wake + EPD_SIM_WAKE_MIN_NS) {
                break; /* the next layer's host share first; it rides on a later wake-up */
            }
            if (e->conf.mode == EPD_SIM_SLEEP && next != 0 && next + 1 != L &&
                due < last_wake + EPD_SIM_WAKE_MIN_NS) {
                due = last_wake + EPD_SIM_WAKE_MIN_NS;
            }
            epd_sim_wait_until(e, due, next + 1 == L);
            last_wake = epd_time_now_ns();
        }
        if (status != EPD_OK) {
            return status;
        }
    }
    epd_sim_wait_until(e, t0 + epd_sim_ns(elapsed), 1);
    return EPD_OK;
}

static epd_status_t epd_sim_decode(epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                                   const epd_decode_req_t *reqs, uint32_t B, float *logits)
{
    const epd_kv_layout_t *kv = &e->info.kv;
    uint64_t t0 = epd_time_now_ns();
    double step_s = 0.0;

    for (uint32_t b = 0; b < B; b++) {
        const epd_decode_req_t *r = &reqs[b];

        e->d_hash[b] = epd_sim_chain(
            r->pos == 0 ? EPD_SIM_H0 : epd_sim_recover(e, pool, &r->seq, r->pos - 1), r->token);
    }
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        for (uint32_t b = 0; b < B; b++) {
            epd_sim_stamp_step(e, pool, &reqs[b].seq, l, reqs[b].pos, e->d_hash[b]);
        }
        step_s += epd_sim_decode_seconds(&e->timing, l, reqs, B);
    }
    for (uint32_t b = 0; b < B; b++) {
        epd_sim_logits(e, e->d_hash[b], logits + (size_t)b * e->info.vocab_size);
    }
    epd_sim_check_host(e, reqs[0].seq.req_id, "decode", epd_time_now_ns() - t0, step_s);
    epd_sim_wait_until(e, t0 + epd_sim_ns(step_s), 0);
    return EPD_OK;
}

static void epd_sim_release(epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                            const epd_kv_seq_t *seq)
{
    /* Nothing per request outside the pool; the state slots' stamps are
     * wiped, so that a stale state cannot be read as this request's by
     * mistake (the template body stays: it is no request's). */
    for (uint32_t l = 0; l < e->info.kv.n_layers; l++) {
        if (e->info.kv.kind[l] == EPD_LAYER_LINEAR) {
            unsigned char *s = epd_sim_state(e, pool, l, seq->state_slot);

            memset(s, 0, EPD_KV_STAMP_HALF);
            memset(s + e->info.kv.state_bytes - EPD_KV_STAMP_HALF, 0, EPD_KV_STAMP_HALF);
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
