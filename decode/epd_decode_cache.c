/*
 * epd_decode_cache.c — decode-side reuse of a finished conversation's KV
 * (proto/README.md rule 36): a role part below the request layer.
 *
 * A multi-turn chat sends, turn after turn, the whole conversation so far:
 * its next prompt starts with the previous one.  When a request ends well
 * its fully written prompt blocks (those prefill wrote and decode verified:
 * the blocks before the one holding the prompt's last position, which
 * decode's own steps write into) stay here, keyed like prefill's prefix
 * cache (kv/epd_prefix.h: the same namespace, so the same keys) and
 * CACHED in the allocator.  A later request whose prompt starts with them
 * gets them as the head of its reservation, read-only and pinned, and
 * tells prefill (KvReservation.cached_blocks) not to write them.  Its
 * verification does not change: the layer checksums cover every prompt
 * block and decode hashes its own copies, which hold the same bits prefill
 * would have written (the engines are split-invariant) — a cached block
 * that did not would fail the request, never corrupt it.
 *
 * Only attention blocks are kept: a linear layer's state is always written
 * by prefill (it covers the whole prompt).  Prompts holding an image
 * placeholder are never shared here: decode gets no media (rule 13), so
 * it cannot key the images.  Cached blocks nobody pins are evicted, least
 * recently used first, when a reservation needs the room.
 *
 * Only with --kv-reserve upfront: under KV on demand (the default) a
 * request grows, may be preempted and resumes through prefill, so nothing
 * is kept and every reservation has cached_blocks 0.
 *
 * Loop thread only.
 */
#include <string.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_decode_int.h"

epd_status_t epd__decode_cache_init(epd_decode_srv_t *srv, const char *engine_name)
{
    epd_status_t st;

    if (!srv->prefix_cache || srv->info->kv.n_attn_layers == 0) {
        return EPD_OK;
    }
    if (srv->headroom > 0) {
        /* KV on demand (rules 30-32): a request's blocks grow, are preempted
         * and come back through a resume; a pinned read-only head would
         * have to survive all of that, and cached blocks would hold pool
         * room that growth does not evict.  Reuse is an up-front mode's */
        epd_log_info(EPD_DECODE_LOG, 0,
                     "decode-side reuse off: KV on demand (--kv-reserve upfront keeps it)");
        return EPD_OK;
    }
    if (strcmp(engine_name, "sim") == 0) {
        /* sim's KV units carry the stamps of the request that wrote them
         * and per-block templates: a kept block is not the bytes prefill
         * holds for the same tokens, so its checksum would fail the request */
        epd_log_info(EPD_DECODE_LOG, 0,
                     "decode-side reuse off: the sim engine's KV is not a function of the tokens");
        return EPD_OK;
    }
    epd_prefix_root(engine_name, srv->info, NULL, 0, &srv->proot);
    srv->engine_name = engine_name;
    st = epd_kvcache_create(srv->pool.n_blocks, &srv->pcache);
    if (st != EPD_OK) {
        epd_log_error(EPD_DECODE_LOG, 0, "prefix cache: out of memory");
        return st;
    }
    epd_daemon_set_prefix_root(srv->d, srv->proot.b); /* KV hints for the router */
    epd_daemon_set_prefix_cache(srv->d, srv->pcache);
    epd_log_info(EPD_DECODE_LOG, 0, "decode-side reuse on: finished prompts' blocks stay cached");
    return EPD_OK;
}

void epd__decode_cache_cleanup(epd_decode_srv_t *srv)
{
    epd_kvcache_destroy(srv->pcache);
    srv->pcache = NULL;
}

uint32_t epd__decode_cache_evictable(const epd_decode_srv_t *srv)
{
    return srv->pcache != NULL ? epd_kvcache_evictable(srv->pcache) : 0;
}

void epd__decode_cache_stats(const epd_decode_srv_t *srv, epd_prefix_stats_t *s_p)
{
    memset(s_p, 0, sizeof(*s_p));
    if (srv->pcache == NULL) {
        return;
    }
    s_p->requests = srv->pc.requests;
    s_p->prompt_tokens = srv->pc.prompt_tokens;
    s_p->hit_tokens = srv->pc.hit_tokens;
    s_p->evictions = srv->pc.evictions;
    s_p->cached_blocks = epd_kvcache_count(srv->pcache);
}

/* Evicts unpinned cached blocks until `need` blocks are free (or none is
 * left to evict). */
static void epd_decode_cache_room(epd_decode_srv_t *srv, uint32_t need)
{
    while (epd_decode_blocks_free(srv->blocks) < need) {
        epd_prefix_hash_t key;
        uint32_t b = epd_kvcache_evict(srv->pcache, &key);

        if (b == EPD_KVCACHE_NONE) {
            return;
        }
        epd_daemon_prefix_hint(srv->d, epd_prefix_hint(&key), 0);
        if (epd_decode_blocks_uncache(srv->blocks, &b, 1) != EPD_OK) {
            epd_log_error(EPD_DECODE_LOG, 0, "cached block %u was not CACHED (a bug)", b);
            return;
        }
        srv->pc.evictions++;
    }
}

/* The keys of g's prompt into req (req->keys, n_keys); 0 when it has none
 * this worker can compute (no full block, an image, no memory). */
static int epd_decode_cache_keys(epd_decode_srv_t *srv, epd_decode_request_t *req,
                                 const Epd__GenerateRequest *g)
{
    uint32_t bt = srv->info->kv.block_tokens;
    uint32_t n_prompt = (uint32_t)g->n_prompt_tokens;
    epd_prefix_hash_t salted;
    const epd_prefix_hash_t *root = &srv->proot;
    int32_t *toks;

    if (n_prompt / bt == 0) {
        return 0;
    }
    for (uint32_t i = 0; i < n_prompt; i++) {
        if (srv->info->image_embeddings > 0 &&
            (int32_t)g->prompt_tokens[i] == srv->info->image_token) {
            return 0; /* images: keys this worker cannot compute (no media) */
        }
    }
    req->keys = epd_malloc((size_t)(n_prompt / bt) * sizeof(*req->keys));
    toks = epd_malloc((size_t)n_prompt * sizeof(*toks));
    if (req->keys == NULL || toks == NULL) {
        epd_free(toks);
        epd_free(req->keys);
        req->keys = NULL;
        return 0; /* no reuse: the request goes on without it */
    }
    req->n_keys = n_prompt / bt;
    for (uint32_t i = 0; i < n_prompt; i++) {
        toks[i] = (int32_t)g->prompt_tokens[i];
    }
    if (g->cache_salt.len > 0) {
        epd_prefix_root(srv->engine_name, srv->info, g->cache_salt.data, g->cache_salt.len,
                        &salted);
        root = &salted;
    }
    epd_prefix_chain(root, bt, toks, n_prompt, NULL, 0, req->keys, req->n_keys);
    epd_free(toks);
    return 1;
}

/* The cached head of req (pinned into req->blocks[0..k)) and room for the
 * other n_blocks - k; returns k. */
static uint32_t epd_decode_cache_admit(epd_decode_srv_t *srv, epd_decode_request_t *req,
                                       const Epd__GenerateRequest *g, uint32_t n_blocks)
{
    uint32_t bt = srv->info->kv.block_tokens;
    uint32_t n_prompt = (uint32_t)g->n_prompt_tokens;
    uint32_t k = 0;

    req->n_cached = 0;
    if (srv->pcache == NULL) {
        return 0;
    }
    /* (a migrated request, rule 37, neither uses nor keeps a head: its
     * prompt ends with generated tokens prefill recomputes one by one) */
    if (g->resume_generated == 0 && epd_decode_cache_keys(srv, req, g)) {
        /* never the block holding the prompt's last position: decode's
         * steps write after it */
        k = epd_kvcache_acquire(srv->pcache, req->keys, (n_prompt - 1) / bt, req->blocks);
        req->n_cached = k;
        srv->pc.requests++;
        srv->pc.prompt_tokens += n_prompt;
        srv->pc.hit_tokens += (uint64_t)k * bt;
    }
    /* kept blocks nobody uses give way to new requests */
    epd_decode_cache_room(srv, n_blocks - k);
    return k;
}

epd_status_t epd__decode_cache_reserve(epd_decode_srv_t *srv, epd_decode_request_t *req,
                                       const Epd__GenerateRequest *g, uint32_t n_blocks)
{
    uint32_t k = epd_decode_cache_admit(srv, req, g, n_blocks);
    epd_status_t st;

    st = epd_decode_blocks_reserve(srv->blocks, g->request_id, n_blocks - k,
                                   srv->info->kv.n_linear_layers > 0, req->blocks + k, &req->slot);
    if (st == EPD_ERR_INVALID_PARAM && k == n_blocks) {
        st = EPD_ERR_NO_CAPACITY; /* cannot happen: the last block is never cached */
    }
    return st;
}

uint64_t epd__decode_cache_head_bytes(const epd_decode_srv_t *srv, const epd_decode_request_t *req)
{
    return (uint64_t)req->n_cached * epd_kv_block_set_bytes(&srv->info->kv);
}

void epd__decode_cache_finished(epd_decode_srv_t *srv, epd_decode_request_t *req)
{
    uint32_t bt = srv->info->kv.block_tokens;
    uint32_t full = req->n_prompt / bt; /* blocks prefill wrote whole */
    uint32_t i;
    epd_decode_finish_t fin;

    if (srv->pcache == NULL || req->keys == NULL || !req->kv_verified) {
        return;
    }
    fin = (epd_decode_finish_t)atomic_load_explicit(&req->seq.finish, memory_order_acquire);
    if (req->state == EPD_DECODE_REQ_RUNNING && fin != EPD_DECODE_FINISH_LENGTH &&
        fin != EPD_DECODE_FINISH_STOP) {
        return;
    }
    /* the leading run of the request's own full blocks that no other
     * request cached first: the owned blocks stay one range */
    for (i = req->n_cached; i < full && i < req->n_keys; i++) {
        if (epd_kvcache_find(srv->pcache, &req->keys[i]) != EPD_KVCACHE_NONE) {
            break;
        }
    }
    if (i == req->n_cached ||
        epd_decode_blocks_cache(srv->blocks, req->id, req->blocks + req->n_cached,
                                i - req->n_cached) != EPD_OK) {
        return;
    }
    for (uint32_t j = req->n_cached; j < i; j++) {
        /* cannot fail: the key is not cached (checked above), the block is ours */
        (void)epd_kvcache_insert(srv->pcache, &req->keys[j], req->blocks[j]);
        epd_daemon_prefix_hint(srv->d, epd_prefix_hint(&req->keys[j]), 1);
    }
    req->n_cached = i;
}

void epd__decode_cache_drop(epd_decode_srv_t *srv, epd_decode_request_t *req)
{
    /* deepest first: the chain's head is the most recently used */
    for (uint32_t i = req->n_cached; i-- > 0;) {
        (void)epd_kvcache_release(srv->pcache, req->blocks[i]);
    }
    req->n_cached = 0;
    epd_free(req->keys);
    req->keys = NULL;
    req->n_keys = 0;
}
