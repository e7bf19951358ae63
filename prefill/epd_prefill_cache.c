/*
 * epd_prefill_cache.c — prefill's prefix cache: a role part below the
 * request layer (called by it and by the pool part).
 *
 * Full prompt blocks outlive their request.  A request's prompt is cut
 * into keys (kv/epd_prefix.h: a chain over the tokens and images, in
 * the namespace of this engine, model, layout and the request's salt); the
 * leading blocks the index (kv/epd_kvcache.h) holds are lent to the
 * request, pinned, as the head of its block table, and its run computes
 * only the rest.  Its whole KV still goes to decode as before: the cached
 * blocks are read by the writes like any other.  When the run is done its
 * fresh full blocks join the cache (the last, partial block never does),
 * and they stay pinned until the request is released.
 *
 * Recurrent state.  A linear layer's state is a fold over every token, so
 * cached attention KV alone cannot resume a hybrid model: the run must
 * start from the state after the cached tokens.  Runs take checkpoints —
 * every linear layer's state, copied by the engine as it passes a block
 * boundary — every `ckpt_every` blocks and at the prompt's last full block
 * (where the next turn of a chat will hit), into an arena of fixed slots;
 * a checkpoint belongs to the cached block it ends.  A hit of h blocks
 * restores the deepest checkpoint at c <= h blocks and replays tokens
 * [c, h) through the model — reading their cached KV, never writing it —
 * to rebuild the state (epd_prefill_args_t.replay_end), then computes the
 * rest.  A replay longer than `replay_budget` tokens is not worth it: the
 * hit is cut back to c and [c, h) is computed into fresh blocks like any
 * miss.  Since ref and sim are split-invariant, all of this gives the bits
 * a miss gives.
 *
 * Room: blocks not cached and not used are on the pool's free stack;
 * cached blocks nobody pins are evicted (least recently used, a chain from
 * its end) when an admission needs more than the free stack has.  The
 * checkpoint of an evicted block goes with it; when the arena is full a
 * new checkpoint takes the slot of the least recently used unpinned block
 * that has one (a pinned one may be restored by a run in flight).  With
 * the tier on, an evicted block is stored there first: an admission that
 * evicts more than EPD_PREFILL_EVICT_SYNC_MAX blocks leaves the copying to
 * a copy thread, a smaller one copies on the loop; the blocks still being
 * copied go to the end of the request's table, and no chunk of its run
 * writes them before they are copied out (req->copy_from, copy_wait).
 *
 * Loop thread only; the compute thread reads a checkpoint (restore) and
 * writes the request's new ones while the run is lent to it — slots the
 * request holds (pins, reservations) until its release.
 */
#include <string.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_prefill_int.h"

/* Evictions an admission copies out to the tier on the loop (64 blocks of
 * 16 tokens: a 1k-token prompt's); more go to the tier thread */
#define EPD_PREFILL_EVICT_SYNC_MAX 64u

epd_status_t epd__prefill_cache_init(epd_prefill_srv_t *srv, const char *engine_name)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    epd_status_t st;

    srv->engine_name = engine_name;
    if (!srv->prefix_cache) {
        epd_log_info(EPD_PREFILL_LOG, 0, "prefix cache off: every prompt is computed whole");
        return EPD_OK;
    }
    epd_prefix_root(engine_name, srv->info, NULL, 0, &srv->proot);
    st = epd_kvcache_create(srv->kv_blocks, &srv->pcache);
    if (st != EPD_OK) {
        epd_log_error(EPD_PREFILL_LOG, 0, "prefix cache: out of memory");
        return st;
    }
    /* the router routes by what we hold (KV hints with the heartbeats) */
    epd_daemon_set_prefix_root(srv->d, srv->proot.b);
    epd_daemon_set_prefix_cache(srv->d, srv->pcache);
    srv->ckpt_bytes = (uint64_t)kv->n_linear_layers * kv->state_bytes;
    if (srv->ckpt_bytes > 0) {
        uint64_t slots = srv->ckpt_budget / srv->ckpt_bytes;

        srv->ckpt_slots = slots > (1u << 24) ? (1u << 24) : (uint32_t)slots;
        srv->blk_ckpt = epd_malloc((size_t)srv->kv_blocks * sizeof(*srv->blk_ckpt));
        if (srv->ckpt_slots > 0) {
            srv->ckpt_arena = epd_malloc((size_t)srv->ckpt_slots * srv->ckpt_bytes);
            srv->ckpt_free = epd_malloc((size_t)srv->ckpt_slots * sizeof(*srv->ckpt_free));
        }
        if (srv->blk_ckpt == NULL ||
            (srv->ckpt_slots > 0 && (srv->ckpt_arena == NULL || srv->ckpt_free == NULL))) {
            epd_log_error(EPD_PREFILL_LOG, 0, "prefix cache: no memory for %u checkpoints of %llu "
                          "bytes", srv->ckpt_slots, (unsigned long long)srv->ckpt_bytes);
            return EPD_ERR_NO_MEMORY;
        }
        for (uint32_t b = 0; b < srv->kv_blocks; b++) {
            srv->blk_ckpt[b] = EPD_KVCACHE_NONE;
        }
        for (uint32_t i = 0; i < srv->ckpt_slots; i++) {
            srv->ckpt_free[i] = srv->ckpt_slots - 1 - i;
        }
        srv->n_ckpt_free = srv->ckpt_slots;
    }
    epd_log_info(EPD_PREFILL_LOG, 0,
                 "prefix cache on: %u blocks of %u tokens; %u checkpoints of %llu bytes (every "
                 "%u blocks and at each prompt's last full block), replay budget %u tokens",
                 srv->kv_blocks, kv->block_tokens, srv->ckpt_slots,
                 (unsigned long long)srv->ckpt_bytes, srv->ckpt_every, srv->replay_budget);
    return epd__prefill_tier_init(srv);
}

void epd__prefill_cache_cleanup(epd_prefill_srv_t *srv)
{
    epd__prefill_tier_cleanup(srv);
    epd_kvcache_destroy(srv->pcache);
    epd_free(srv->ckpt_arena);
    epd_free(srv->ckpt_free);
    epd_free(srv->blk_ckpt);
    srv->pcache = NULL;
    srv->ckpt_arena = NULL;
    srv->ckpt_free = NULL;
    srv->blk_ckpt = NULL;
}

void epd__prefill_cache_stats(const epd_prefill_srv_t *srv, epd_prefix_stats_t *s_p)
{
    memset(s_p, 0, sizeof(*s_p));
    if (srv->pcache == NULL) {
        return;
    }
    s_p->requests = srv->pc.requests;
    s_p->prompt_tokens = srv->pc.prompt_tokens;
    s_p->hit_tokens = srv->pc.hit_tokens;
    s_p->computed_tokens = srv->pc.computed_tokens;
    s_p->replayed_tokens = srv->pc.replayed_tokens;
    s_p->replay_cut = srv->pc.replay_cut;
    s_p->checkpoints_taken = srv->pc.ckpts_taken;
    s_p->checkpoints_restored = srv->pc.ckpts_restored;
    s_p->checkpoints_dropped = srv->pc.ckpts_dropped;
    s_p->evictions = srv->pc.evictions;
    s_p->cached_blocks = epd_kvcache_count(srv->pcache);
    s_p->checkpoints_held = srv->pc.ckpts_held;
    epd__prefill_tier_stats(srv, s_p);
}

uint32_t epd__prefill_cache_available(const epd_prefill_srv_t *srv)
{
    return srv->n_free_blocks + (srv->pcache != NULL ? epd_kvcache_evictable(srv->pcache) : 0);
}

/* Evicts the least recently used unpinned cached block onto the free
 * stack (its checkpoint freed); 0 when none could be.  defer: the tier
 * thread copies its KV out (epd__prefill_tier_store). */
static int epd_prefill_cache_evict(epd_prefill_srv_t *srv, int defer)
{
    epd_prefix_hash_t key;
    uint32_t b;

    if (srv->pcache == NULL) {
        return 0; /* --no-prefix-cache: nothing is kept to evict */
    }
    b = epd_kvcache_evict(srv->pcache, &key);
    if (b == EPD_KVCACHE_NONE) {
        return 0;
    }
    epd_daemon_prefix_hint(srv->d, epd_prefix_hint(&key), 0);
    if (srv->tier != NULL) {
        /* before the block is anyone's again: its KV and checkpoint */
        uint32_t cs = srv->blk_ckpt != NULL ? srv->blk_ckpt[b] : EPD_KVCACHE_NONE;

        epd__prefill_tier_store(srv, &key, b,
                                cs != EPD_KVCACHE_NONE
                                    ? srv->ckpt_arena + (size_t)cs * srv->ckpt_bytes
                                    : NULL,
                                defer);
    }
    if (srv->blk_ckpt != NULL && srv->blk_ckpt[b] != EPD_KVCACHE_NONE) {
        srv->ckpt_free[srv->n_ckpt_free++] = srv->blk_ckpt[b];
        srv->blk_ckpt[b] = EPD_KVCACHE_NONE;
        srv->pc.ckpts_held--;
    }
    srv->free_blocks[srv->n_free_blocks++] = b;
    srv->pc.evictions++;
    return 1;
}

static int epd_prefill_cache_has_ckpt(void *arg, uint32_t block)
{
    const epd_prefill_srv_t *srv = arg;

    return srv->blk_ckpt[block] != EPD_KVCACHE_NONE;
}

/* A free checkpoint slot: a free one, else the one of the least recently
 * used unpinned block (dropped); EPD_KVCACHE_NONE when neither exists. */
static uint32_t epd_prefill_cache_ckpt_slot(epd_prefill_srv_t *srv)
{
    uint32_t b;
    uint32_t slot;

    if (srv->n_ckpt_free > 0) {
        return srv->ckpt_free[--srv->n_ckpt_free];
    }
    b = epd_kvcache_lru_find(srv->pcache, epd_prefill_cache_has_ckpt, srv);
    if (b == EPD_KVCACHE_NONE) {
        return EPD_KVCACHE_NONE;
    }
    slot = srv->blk_ckpt[b];
    srv->blk_ckpt[b] = EPD_KVCACHE_NONE;
    srv->pc.ckpts_dropped++;
    srv->pc.ckpts_held--;
    return slot;
}

/* The keys of g's prompt (req->keys, req->n_keys): its first n_pre tokens
 * (a resume's prompt part). */
static epd_status_t epd_prefill_cache_keys(epd_prefill_srv_t *srv, epd_prefill_req_t *req,
                                           const Epd__GenerateRequest *g, uint32_t n_pre)
{
    uint32_t bt = srv->info->kv.block_tokens;
    epd_prefix_media_t media[EPD_PREFILL_MEDIA_MAX];
    uint32_t n_media = 0;
    epd_prefix_hash_t salted;
    const epd_prefix_hash_t *root = &srv->proot;

    req->n_keys = n_pre / bt;
    if (req->n_keys == 0) {
        return EPD_OK;
    }
    req->keys = epd_malloc((size_t)req->n_keys * sizeof(*req->keys));
    req->ckpts = epd_calloc(req->n_keys, sizeof(*req->ckpts));
    req->ckpt_slots = epd_calloc(req->n_keys, sizeof(*req->ckpt_slots));
    if (req->keys == NULL || req->ckpts == NULL || req->ckpt_slots == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    /* checked by the message layer: at most EPD_PREFILL_MEDIA_MAX, sorted,
     * 32-byte hashes */
    for (size_t i = 0; i < g->n_media && i < EPD_PREFILL_MEDIA_MAX; i++) {
        media[n_media++] = (epd_prefix_media_t){.pos = g->media[i]->placeholder_pos,
                                                .n = g->media[i]->n_embeddings,
                                                .hash = g->media[i]->content_hash.data};
    }
    if (g->cache_salt.len > 0) {
        epd_prefix_root(srv->engine_name, srv->info, g->cache_salt.data, g->cache_salt.len,
                        &salted);
        root = &salted;
    }
    epd_prefix_chain(root, bt, req->tokens, n_pre, media, n_media, req->keys, req->n_keys);
    return EPD_OK;
}

/* The deepest c <= h such that the state after c blocks is known: 0 (the
 * empty prefix) or a cached block with a checkpoint. */
static uint32_t epd_prefill_cache_deepest_ckpt(const epd_prefill_srv_t *srv,
                                               const epd_prefill_req_t *req, uint32_t h)
{
    if (srv->info->kv.n_linear_layers == 0) {
        return h; /* attention KV is all there is */
    }
    for (uint32_t c = h; c > 0; c--) {
        if (srv->blk_ckpt[req->local_blocks[c - 1]] != EPD_KVCACHE_NONE) {
            return c;
        }
    }
    return 0;
}

/* The checkpoints the run takes: after every ckpt_every-th block and the
 * last full one, past the start, where the cache has none (slots
 * permitting: a checkpoint is an optimisation, never a requirement). */
static void epd_prefill_cache_plan_ckpts(epd_prefill_srv_t *srv, epd_prefill_req_t *req, uint32_t c)
{
    uint32_t bt = srv->info->kv.block_tokens;

    if (srv->ckpt_slots == 0) {
        return;
    }
    for (uint32_t k = c + 1; k <= req->n_keys; k++) {
        uint32_t slot;

        if (!(k == req->n_keys || (srv->ckpt_every > 0 && k % srv->ckpt_every == 0))) {
            continue;
        }
        if (k <= req->hit_blocks && srv->blk_ckpt[req->local_blocks[k - 1]] != EPD_KVCACHE_NONE) {
            continue;
        }
        slot = epd_prefill_cache_ckpt_slot(srv);
        if (slot == EPD_KVCACHE_NONE) {
            return;
        }
        req->ckpt_slots[req->n_ckpts] = slot;
        req->ckpts[req->n_ckpts].pos = k * bt;
        req->ckpts[req->n_ckpts].dst = srv->ckpt_arena + (size_t)slot * srv->ckpt_bytes;
        req->n_ckpts++;
    }
}

/* Extends a hit of h blocks with the blocks the tier holds after it (up
 * to limit), restored into fresh blocks and cached pinned for req as if
 * it had computed them, their checkpoints into free arena slots; blocks
 * the pool holds again on the way are acquired.  Stops at the first block
 * that cannot be restored (failed check, no room): the rest is computed.
 * Returns the new h. */
static uint32_t epd_prefill_cache_from_tier(epd_prefill_srv_t *srv, epd_prefill_req_t *req,
                                            uint32_t h, uint32_t limit)
{
    uint32_t run = h < limit ? epd__prefill_tier_worth(srv, &req->keys[h], limit - h) : 0;

    for (uint32_t end = h + run; h < end; h++) {
        const void *ckpt = NULL;
        uint32_t b;

        if (epd_kvcache_find(srv->pcache, &req->keys[h]) != EPD_KVCACHE_NONE) {
            if (epd_kvcache_acquire(srv->pcache, &req->keys[h], 1, &req->local_blocks[h]) == 1) {
                continue;
            }
            break;
        }
        if (srv->n_free_blocks == 0 && !epd_prefill_cache_evict(srv, 0)) {
            break;
        }
        b = srv->free_blocks[srv->n_free_blocks - 1];
        if (epd__prefill_tier_copying(srv, &b, 1) != 0) {
            break; /* still being copied out to the tier: not writable yet */
        }
        if (epd__prefill_tier_restore(srv, &req->keys[h], b, &ckpt) != EPD_OK ||
            epd_kvcache_insert(srv->pcache, &req->keys[h], b) != EPD_OK) {
            break; /* b stays free; its bytes are garbage to whoever takes it */
        }
        srv->n_free_blocks--;
        req->local_blocks[h] = b;
        epd_daemon_prefix_hint(srv->d, epd_prefix_hint(&req->keys[h]), 1);
        if (ckpt != NULL && srv->blk_ckpt != NULL && srv->n_ckpt_free > 0) {
            uint32_t slot = srv->ckpt_free[--srv->n_ckpt_free];

            memcpy(srv->ckpt_arena + (size_t)slot * srv->ckpt_bytes, ckpt, srv->ckpt_bytes);
            srv->blk_ckpt[b] = slot;
            srv->pc.ckpts_held++;
        }
    }
    return h;
}

epd_status_t epd__prefill_cache_place(epd_prefill_srv_t *srv, epd_prefill_req_t *req,
                                      const Epd__GenerateRequest *g)
{
    uint32_t bt = srv->info->kv.block_tokens;
    /* a resume (rule 33) uses the cache for its prompt part only: hits,
     * checkpoints and the blocks it adds end before the generated tokens,
     * whose KV its decode tail computes (the message layer checked that
     * resume_generated < n_prompt_tokens) */
    uint32_t n_pre = req->n_tokens - g->resume_generated;
    uint32_t h = 0;
    uint32_t c = 0;
    epd_status_t st;

    req->restore_ckpt = EPD_KVCACHE_NONE;
    if (srv->pcache != NULL) {
        st = epd_prefill_cache_keys(srv, req, g, n_pre);
        if (st != EPD_OK) {
            return st;
        }
        /* a hit leaves at least one token of the prefill run to compute:
         * the first token's logits (a plain prefill's) come from its last
         * position */
        h = epd_kvcache_acquire(srv->pcache, req->keys, (n_pre - 1) / bt, req->local_blocks);
        if (srv->tier != NULL) {
            h = epd_prefill_cache_from_tier(srv, req, h, (n_pre - 1) / bt);
        }
        c = epd_prefill_cache_deepest_ckpt(srv, req, h);
        if ((uint64_t)(h - c) * bt > srv->replay_budget) {
            /* replaying costs as much as computing: cut the hit back */
            for (uint32_t i = h; i-- > c;) {
                epd_kvcache_release(srv->pcache, req->local_blocks[i]);
            }
            srv->pc.replay_cut++;
            h = c;
        }
    }
    if (srv->n_free_blocks < req->n_blocks - h) {
        /* many blocks: a copy thread copies them out to the tier */
        uint32_t want = req->n_blocks - h - srv->n_free_blocks;
        int defer = want > EPD_PREFILL_EVICT_SYNC_MAX;

        while (srv->n_free_blocks < req->n_blocks - h && epd_prefill_cache_evict(srv, defer)) {
        }
        if (defer && srv->tier != NULL) {
            epd_log_debug(EPD_PREFILL_LOG, req->id,
                          "admission evicts %u blocks: the copy thread copies them out", want);
        }
    }
    if (srv->n_free_blocks < req->n_blocks - h) {
        for (uint32_t i = h; i-- > 0;) {
            epd_kvcache_release(srv->pcache, req->local_blocks[i]);
        }
        return EPD_ERR_NO_CAPACITY;
    }
    for (uint32_t i = h; i < req->n_blocks; i++) {
        req->local_blocks[i] = srv->free_blocks[--srv->n_free_blocks];
    }
    req->copy_wait = epd__prefill_tier_copying(srv, &req->local_blocks[h], req->n_blocks - h);
    /* the blocks still being copied out go last: the first chunks need
     * not wait for them */
    req->copy_from = req->copy_wait != 0 ? h + epd__prefill_tier_copies_last(
                                                 srv, &req->local_blocks[h], req->n_blocks - h)
                                         : req->n_blocks;
    req->hit_blocks = h;
    req->start = c * bt;
    req->replay_end = h > c ? h * bt : 0;
    if (c > 0 && srv->info->kv.n_linear_layers > 0) {
        req->restore_ckpt = srv->blk_ckpt[req->local_blocks[c - 1]];
        srv->pc.ckpts_restored++;
    }
    if (srv->pcache != NULL) {
        epd_prefill_cache_plan_ckpts(srv, req, c);
        srv->pc.requests++;
        srv->pc.prompt_tokens += req->n_tokens;
        srv->pc.hit_tokens += (uint64_t)h * bt;
        srv->pc.computed_tokens += req->n_tokens - req->start;
        srv->pc.replayed_tokens += (uint64_t)(h - c) * bt;
    }
    return EPD_OK;
}

void epd__prefill_cache_computed(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    uint32_t bt = srv->info->kv.block_tokens;

    if (srv->pcache == NULL) {
        return;
    }
    epd__prefill_tier_ran(srv, req->n_tokens - req->start, req->compute_done_ns - req->t_start_ns);
    for (uint32_t i = req->hit_blocks; i < req->n_keys; i++) {
        /* EPD_ERR_EXISTS: another request computed the same block first;
         * ours stays the request's and is freed with it */
        if (epd_kvcache_insert(srv->pcache, &req->keys[i], req->local_blocks[i]) == EPD_OK) {
            epd_daemon_prefix_hint(srv->d, epd_prefix_hint(&req->keys[i]), 1);
        }
    }
    for (uint32_t j = 0; j < req->n_ckpts; j++) {
        uint32_t k = req->ckpts[j].pos / bt; /* the checkpoint ends block k - 1 */
        uint32_t b = epd_kvcache_find(srv->pcache, &req->keys[k - 1]);

        if (b != EPD_KVCACHE_NONE && srv->blk_ckpt[b] == EPD_KVCACHE_NONE) {
            srv->blk_ckpt[b] = req->ckpt_slots[j];
            req->ckpt_slots[j] = EPD_KVCACHE_NONE; /* the cache's now */
            srv->pc.ckpts_taken++;
            srv->pc.ckpts_held++;
        }
    }
}

void epd__prefill_cache_release(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    for (uint32_t j = 0; j < req->n_ckpts; j++) {
        if (req->ckpt_slots[j] != EPD_KVCACHE_NONE) {
            srv->ckpt_free[srv->n_ckpt_free++] = req->ckpt_slots[j];
        }
    }
    req->n_ckpts = 0;
    /* deepest first: the chain's head ends up the most recently used */
    for (uint32_t i = req->n_blocks; i-- > 0;) {
        if (srv->pcache == NULL || !epd_kvcache_release(srv->pcache, req->local_blocks[i])) {
            srv->free_blocks[srv->n_free_blocks++] = req->local_blocks[i];
        }
    }
}
