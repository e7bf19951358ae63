/*
 * epd_prefill_xfer.c — one request's KV transfer to its decode worker
 * (proto/README.md rules 3-6 and 9): a role part below the request layer.
 *
 *   the reservation  checked before a byte moves (layout, blocks, region,
 *                    the key unpacked on our link to that decode
 *                    incarnation — once per incarnation, then shared, see
 *                    epd_peer_rkey — and covering the region);
 *   the writes       planned once, when the reservation is taken: runs of
 *                    blocks contiguous on both sides (epd_prefill_plan_runs),
 *                    one write per run and layer; one cursor (post_layer,
 *                    post_idx, post_off) walks the finished layers in order,
 *                    each layer's runs in order (the checksums' order), a
 *                    run in chunks of at most --write-chunk-bytes, and stops
 *                    after that many bytes in one pass so that the loop
 *                    gets back to its messages between the chunks of a
 *                    large layer; with --write-group-bytes, finished layers
 *                    wait while compute runs until enough bytes are ready;
 *   checksums        the engine's, computed next to the KV (sim: a device
 *                    kernel, kind STAMPED when decode takes it); else the
 *                    bytes are hashed here (kind BYTES: ref, an older decode);
 *   LayerDone        after each layer's writes, fenced behind them (decode
 *                    verifies that layer while the next ones compute) —
 *                    except the last layer's once compute is done, which
 *                    PrefillComplete covers — and as decode's lease
 *                    keep-alive during a long layer;
 *   PrefillComplete  fenced behind every write.
 * Every write and message goes on OUR link to the decode incarnation
 * (epd_peer_link), so that a fence orders a message behind the writes.
 *
 * The per-write path computes offsets arithmetically (epd_prefill_plan)
 * and allocates nothing.  A write refused for room (EPD_ERR_NO_RESOURCE)
 * leaves the cursor where it was and says so; a completion updates the
 * counters here and hands the rest to srv->on_written (the request layer,
 * registered at start-up).
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_fault.h"
#include "epd_kv_stamp.h"
#include "epd_layout.h"
#include "epd_log.h"
#include "epd_prefill_int.h"
#include "epd_time.h"

epd_status_t epd__prefill_xfer_peer_status(epd_status_t st)
{
    return epd_status_scope(st) >= EPD_SCOPE_CONNECTION ? EPD_ERR_PEER_DEAD : st;
}

epd_status_t epd__prefill_xfer_init(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x, uint64_t id,
                                    epd_peer_t *peer, const uint32_t *local_blocks,
                                    uint32_t n_blocks, uint32_t slot)
{
    uint32_t n_layers = srv->info->kv.n_layers;

    memset(x, 0, sizeof(*x));
    x->srv = srv;
    x->id = id;
    x->peer = peer;
    x->local.block_ids = local_blocks;
    x->local.n_blocks = n_blocks;
    x->local.state_slot = slot;
    x->local.pool_blocks = srv->kv_blocks;
    x->local.pool_state_slots = srv->state_slots;
    x->sum_kind = -1;
    x->remote_blocks = epd_calloc((size_t)n_blocks + 1, sizeof(*x->remote_blocks));
    x->runs = epd_calloc((size_t)n_blocks + 1, sizeof(*x->runs));
    x->lw = epd_calloc((size_t)n_layers + 1, sizeof(*x->lw));
    x->checksums = epd_calloc((size_t)n_layers + 1, sizeof(*x->checksums));
    x->sum_kinds = epd_calloc((size_t)n_layers + 1, sizeof(*x->sum_kinds));
    x->ready_blocks = epd_calloc((size_t)n_layers + 1, sizeof(*x->ready_blocks));
    x->sent_blocks = epd_calloc((size_t)n_layers + 1, sizeof(*x->sent_blocks));
    x->srun = epd_calloc((size_t)n_layers + 1, sizeof(*x->srun));
    x->lhash = epd_calloc((size_t)n_layers + 1, sizeof(*x->lhash));
    x->hashed_blocks = epd_calloc((size_t)n_layers + 1, sizeof(*x->hashed_blocks));
    x->range_sent = epd_calloc((size_t)n_layers + 1, sizeof(*x->range_sent));
    if (x->lhash == NULL || x->hashed_blocks == NULL || x->range_sent == NULL ||
        x->remote_blocks == NULL || x->runs == NULL || x->lw == NULL || x->checksums == NULL ||
        x->sum_kinds == NULL || x->ready_blocks == NULL || x->sent_blocks == NULL ||
        x->srun == NULL) {
        epd__prefill_xfer_cleanup(x);
        return EPD_ERR_NO_MEMORY;
    }
    for (uint32_t l = 0; l < n_layers; l++) {
        x->lw[l].x = x;
        x->lw[l].layer = l;
    }
    return EPD_OK;
}

void epd__prefill_xfer_cleanup(epd_prefill_xfer_t *x)
{
    if (x->rkey != NULL && !x->rkey_shared) {
        epd_xport_rkey_destroy(x->rkey);
    }
    x->rkey = NULL;
    epd_free(x->remote_blocks);
    epd_free(x->runs);
    epd_free(x->lw);
    epd_free(x->checksums);
    epd_free(x->sum_kinds);
    epd_free(x->ready_blocks);
    epd_free(x->sent_blocks);
    epd_free(x->srun);
    for (uint32_t l = 0; x->lhash != NULL && l < x->srv->info->kv.n_layers; l++) {
        epd_hash_state_destroy(x->lhash[l]);
    }
    epd_free(x->lhash);
    epd_free(x->hashed_blocks);
    epd_free(x->range_sent);
    x->lhash = NULL;
    x->hashed_blocks = NULL;
    x->range_sent = NULL;
    x->ready_blocks = NULL;
    x->sent_blocks = NULL;
    x->srun = NULL;
    x->remote_blocks = NULL;
    x->runs = NULL;
    x->lw = NULL;
    x->checksums = NULL;
    x->sum_kinds = NULL;
}

void epd__prefill_xfer_forget_key(epd_prefill_xfer_t *x)
{
    x->rkey = NULL; /* dies with the link it was unpacked on */
    x->rkey_shared = 0;
}

/* ------------------------------------------------------------ reservation */

epd_status_t epd__prefill_xfer_take(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x,
                                    const Epd__KvReservation *r, char *msg, size_t cap)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    epd_prefill_place_t place;
    epd_xport_rkey_t *rkey;
    const char *why = NULL;
    epd_status_t st;
    int shared;

    st = epd_layout_check(kv, r->layout, &why);
    if (st != EPD_OK) {
        snprintf(msg, cap, "reservation refused: KV layout differs (%s)", why);
        return EPD_ERR_INVALID_PARAM;
    }
    memset(&place, 0, sizeof(place));
    place.block_ids = r->block_ids;
    place.n_blocks = r->n_block_ids > UINT32_MAX ? UINT32_MAX : (uint32_t)r->n_block_ids;
    place.state_slot = r->state_slot;
    place.pool_blocks = r->pool_blocks;
    place.pool_state_slots = r->pool_state_slots;
    st = epd_prefill_plan_check(kv, x->local.n_blocks, &place, r->region_size, &why);
    if (st != EPD_OK) {
        snprintf(msg, cap,
                 "reservation refused: %s (%zu blocks, pool %u blocks/%u slots, region %llu "
                 "bytes)",
                 why, r->n_block_ids, r->pool_blocks, r->pool_state_slots,
                 (unsigned long long)r->region_size);
        return st == EPD_ERR_NO_MEMORY ? st : EPD_ERR_OUT_OF_RANGE;
    }
    if (r->cached_blocks > place.n_blocks) {
        snprintf(msg, cap, "reservation refused: %u cached blocks of %u", r->cached_blocks,
                 place.n_blocks);
        return EPD_ERR_OUT_OF_RANGE;
    }
    if (r->rkey.len == 0 || r->rkey.len > EPD_XPORT_RKEY_MAX) {
        snprintf(msg, cap, "reservation refused: remote key of %zu bytes", r->rkey.len);
        return EPD_ERR_BAD_RKEY;
    }
    if (!epd_peer_usable(x->peer)) {
        snprintf(msg, cap, "decode worker is gone");
        return EPD_ERR_PEER_DEAD;
    }
    /* unpacked once per decode incarnation: per request, the region would be
     * mapped afresh each time (on shared memory every page of every
     * request's KV then faults in again — measured: most of the transfer) */
    st = epd_peer_rkey(x->peer, r->rkey.data, r->rkey.len, &rkey, &shared);
    if (st != EPD_OK) {
        snprintf(msg, cap, "reservation refused: remote key does not unpack (%s)",
                 epd_status_string(st));
        return st == EPD_ERR_BAD_RKEY ? st : EPD_ERR_PEER_DEAD;
    }
    if (epd_xport_rkey_size(rkey) < r->region_size) {
        snprintf(msg, cap, "reservation refused: region of %llu bytes, key covers %zu",
                 (unsigned long long)r->region_size, epd_xport_rkey_size(rkey));
        if (!shared) {
            epd_xport_rkey_destroy(rkey);
        }
        return EPD_ERR_OUT_OF_RANGE;
    }
    memcpy(x->remote_blocks, r->block_ids, (size_t)x->local.n_blocks * sizeof(uint32_t));
    x->remote = place;
    x->remote.block_ids = x->remote_blocks;
    x->region_size = r->region_size;
    x->n_runs = epd_prefill_plan_runs(&x->local, &x->remote, x->runs);
    /* decode's own copies of the leading cached_blocks are the same bits
     * (rule 36): no run writes them */
    x->n_runs = epd_prefill_plan_runs_skip(x->runs, x->n_runs, r->cached_blocks);
    x->d_stamped = r->stamped_sums;
    x->d_ranges = r->range_sums;
    x->rkey = rkey;
    x->rkey_shared = shared;
    x->d_lease_ms = r->lease_ms;
    x->skip = r->cached_blocks; /* decode's own copy of them is the same bits (rule 36) */
    x->last_d_msg_ns = epd_time_now_ns();
    x->have_resv = 1;
    return EPD_OK;
}

/* ----------------------------------------------------------------- writes */

/* The layer's open episode ends when none of its writes is in flight and
 * the loop is not posting it: its "KV write" trace span. */
static void epd_prefill_lw_episode(epd_prefill_srv_t *srv, epd_prefill_lw_t *lw)
{
    if (lw->ep_ns == 0 || lw->inflight > 0 || lw->posting) {
        return;
    }
    epd_trace_span(srv->trace, "KV write", "xfer", lw->x->id, (int32_t)lw->layer, lw->ep_ns,
                   epd_time_now_ns());
    lw->ep_ns = 0;
}

/* A write of the layer was posted; t0_ns, read before the post when no
 * episode was open (0 otherwise), starts one. */
static void epd_prefill_lw_posted(epd_prefill_lw_t *lw, uint64_t t0_ns)
{
    if (lw->ep_ns == 0) {
        lw->ep_ns = t0_ns;
    }
    if (lw->posted_ns == 0) {
        lw->posted_ns = lw->ep_ns;
    }
}

/* The layer's last write completed after its last post: counted once. */
static void epd_prefill_lw_done(epd_prefill_srv_t *srv, epd_prefill_lw_t *lw)
{
    if (lw->landed) {
        return;
    }
    lw->landed = 1;
    if (!lw->failed) {
        srv->kv_bytes_sent += lw->bytes;
    }
}

/* Write completion (loop thread, possibly nested in a transport call, or
 * from the transport's destruction with EPD_ERR_CANCELED): counters here,
 * the rest is the request layer's. */
static void epd_prefill_on_write(void *arg, epd_status_t status)
{
    epd_prefill_lw_t *lw = arg;
    epd_prefill_xfer_t *x = lw->x;
    epd_prefill_srv_t *srv = x->srv;

    x->writes_inflight--;
    lw->inflight--;
    if (status != EPD_OK) {
        lw->failed = 1;
    }
    if (lw->inflight == 0 && lw->all_posted) {
        epd_prefill_lw_done(srv, lw);
    }
    epd_prefill_lw_episode(srv, lw);
    srv->on_written(srv, x, status);
}

/* Sends one LayerDone on our link unless messages already wait there: it
 * is optional (decode verifies a layer without one after PrefillComplete),
 * so it never adds to a backlog.  Nonzero when sent. */
static int epd_prefill_send_layer_done(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x,
                                       Epd__LayerDone *ld, const char *trace_name)
{
    epd_link_t *link = epd_peer_link(x->peer);
    uint64_t now;

    if (link == NULL || epd_link_queued(link) > 0) {
        return 0;
    }
    if (epd_link_send(link, EPD__ENVELOPE__BODY_LAYER_DONE, ld,
                      ld->landed ? EPD_XPORT_SEND_FENCE : 0) != EPD_OK) {
        return 0;
    }
    now = epd_time_now_ns();
    x->last_d_msg_ns = now;
    epd_trace_instant(srv->trace, trace_name, "msg", x->id, (int32_t)ld->layer, now);
    return 1;
}

/* Layer `layer`'s LayerDone with its checksum (landed: fenced behind the
 * layer's writes; otherwise a keep-alive). */
static int epd_prefill_layer_done(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x, uint32_t layer,
                                  int landed)
{
    Epd__LayerDone ld = EPD__LAYER_DONE__INIT;

    ld.request_id = x->id;
    ld.layer = layer;
    ld.checksum = x->checksums[layer];
    ld.checksum_kind = x->sum_kind > 0 ? (uint32_t)x->sum_kind : 0;
    ld.landed = landed != 0;
    return epd_prefill_send_layer_done(srv, x, &ld, "LayerDone sent");
}

/* Keep-alive for decode's lease while a long prefill runs: at most one
 * LayerDone per lease/4. */
static void epd_prefill_maybe_keepalive(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x,
                                        uint32_t layer, uint64_t now)
{
    uint32_t lease_ms = x->d_lease_ms != 0 ? x->d_lease_ms : srv->lease_ms;

    if (now - x->last_d_msg_ns >= (uint64_t)lease_ms * EPD_NSEC_PER_MSEC / 4) {
        (void)epd_prefill_layer_done(srv, x, layer, 0);
    }
}

unsigned epd__prefill_xfer_owed(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x, unsigned owe,
                                epd_status_t status, const char *msg)
{
    epd_link_t *dl;

    (void)srv;
    if (!epd_peer_usable(x->peer)) {
        /* its links are gone.  It may still hold memory for our writes in
         * quarantine (a retired writer's one-sided writes are not stopped
         * by closing endpoints): once every write of ours for this request
         * completed, the daemon tells that incarnation so on a new link
         * (rule 28) */
        owe &= ~EPD_PREFILL_TELL_DECODE;
        if ((owe & EPD_PREFILL_QUIESCE) != 0 && x->writes_inflight == 0) {
            if (x->peer != NULL) {
                epd_peer_owe_quiesced(x->peer, x->id);
            }
            owe &= ~EPD_PREFILL_QUIESCE;
        }
        return owe;
    }
    dl = epd_peer_link(x->peer);
    if ((owe & EPD_PREFILL_TELL_DECODE) != 0) {
        (void)epd_link_send_error(dl, x->id, status, msg, NULL);
        owe &= ~EPD_PREFILL_TELL_DECODE;
    }
    if ((owe & EPD_PREFILL_QUIESCE) != 0 && x->writes_inflight == 0) {
        /* fenced on our link: behind every write posted on it */
        (void)epd_link_send_quiesced(dl, x->id);
        owe &= ~EPD_PREFILL_QUIESCE;
        epd_log_debug(EPD_PREFILL_LOG, x->id, "writes quiesced (%llu posted)",
                      (unsigned long long)x->writes_posted);
    }
    return owe;
}

void epd__prefill_xfer_keepalive(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x, uint64_t now_ns)
{
    if (x->have_resv && epd_peer_usable(x->peer)) {
        /* also while the request still waits for the compute thread: a
         * prompt queued behind others is alive, and decode's lease must
         * not fail it (a keep-alive's layer is not read: the last posted
         * one, or 0 before any) */
        epd_prefill_maybe_keepalive(srv, x, x->post_layer > 0 ? x->post_layer - 1 : 0, now_ns);
    }
}

/* Bytes one layer writes for this request. */
static uint64_t epd_prefill_layer_bytes(const epd_kv_layout_t *kv, uint32_t layer,
                                        uint32_t n_blocks)
{
    return kv->kind[layer] == EPD_LAYER_ATTENTION
               ? (uint64_t)n_blocks * epd_kv_layer_block_bytes(kv, layer)
               : kv->state_bytes;
}

/* Write grouping: while compute runs, finished layers wait until at least
 * write_group_bytes of them are ready, so that a short prompt (whose layers
 * are a few KiB each) does not pay a wake-up, a batch of posts and their
 * completions per layer while the compute thread is still busy with the
 * next one.  A layer whose writes have started always continues; once
 * compute is done everything goes. */
static int epd_prefill_group_ready(const epd_prefill_srv_t *srv, const epd_prefill_xfer_t *x,
                                   uint32_t layers_done, int compute_done)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    uint64_t pending = 0;

    if (srv->write_group_bytes == 0 || compute_done || x->cur_begun) {
        return 1;
    }
    for (uint32_t l = x->post_layer; l < layers_done; l++) {
        pending += epd_prefill_layer_bytes(kv, l, x->local.n_blocks);
        if (pending >= srv->write_group_bytes) {
            return 1;
        }
    }
    return 0;
}

/* Layer `layer`'s unit u (a block of the request, or its state slot):
 * its bytes in the local pool, or NULL. */
static const unsigned char *epd_prefill_unit(const epd_prefill_srv_t *srv,
                                             const epd_prefill_xfer_t *x, uint32_t layer,
                                             uint32_t u, uint64_t *bytes_p)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    uint64_t off;

    if (kv->kind[layer] == EPD_LAYER_LINEAR) {
        *bytes_p = kv->state_bytes;
        return epd_kv_state_offset(kv, srv->pool.n_blocks, srv->pool.n_state_slots, layer,
                                   x->local.state_slot, &off) == EPD_OK
                   ? (const unsigned char *)srv->pool.base + off
                   : NULL;
    }
    *bytes_p = epd_kv_layer_block_bytes(kv, layer);
    return u < x->local.n_blocks && epd_kv_block_offset(kv, srv->pool.n_blocks, layer,
                                                        x->local.block_ids[u], &off) == EPD_OK
               ? (const unsigned char *)srv->pool.base + off
               : NULL;
}

/* The request's checksum kind, chosen once (decode's reservation is here):
 * STAMPED when decode takes it, no block came from a cache (those carry the
 * stamps of the request that computed them), no resume's tail wrote into
 * the layers after the engine's sums, and the engine stamps its KV —
 * it gave a STAMPED sum (`got`, a whole run's), or, a chunked run's engine
 * giving none, layer `layer`'s first unit carries a valid stamp naming this
 * request and layer (a 64-bit check: never by chance); else BYTES. */
static void epd_prefill_sum_kind(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x, uint32_t layer,
                                 uint8_t got)
{
    const unsigned char *unit;
    epd_kv_stamp_t st;
    uint64_t ub;

    if (x->sum_kind >= 0) {
        return;
    }
    x->sum_kind = EPD_KV_SUM_BYTES;
    if (!x->d_stamped || x->skip != 0 || x->from_cache || x->resumed) {
        return;
    }
    if (got == 1 + EPD_KV_SUM_STAMPED) {
        x->sum_kind = EPD_KV_SUM_STAMPED;
        return;
    }
    unit = got == 0 ? epd_prefill_unit(srv, x, layer, 0, &ub) : NULL;
    if (unit != NULL && epd_kv_stamp_get(unit, ub, &st) == EPD_OK && st.req_id == x->id &&
        st.layer == layer) {
        x->sum_kind = EPD_KV_SUM_STAMPED;
    }
}

/* Units [from, to) of layer `layer` into h: their stamps (STAMPED) or their
 * bytes (BYTES), in order. */
static void epd_prefill_hash_units(const epd_prefill_srv_t *srv, const epd_prefill_xfer_t *x,
                                   uint32_t layer, uint32_t from, uint32_t to, epd_hash_state_t *h)
{
    for (uint32_t i = from; i < to; i++) {
        uint64_t ub;
        const unsigned char *unit = epd_prefill_unit(srv, x, layer, i, &ub);

        if (unit == NULL) {
            continue;
        }
        if (x->sum_kind == EPD_KV_SUM_STAMPED && ub >= EPD_KV_STAMP_MIN) {
            epd_kv_stamp_hash_unit(h, unit, ub);
        } else {
            epd_hash_state_update(h, unit, ub);
        }
    }
}

/* The checksum of layer `layer` to send: the engine's when it is of the
 * request's kind, else computed here — BYTES from the bytes (a STAMPED sum
 * of KV decode partly holds is of no use), or a chunked run's STAMPED from
 * the stamps — the layer is final in the local pool (the compute thread
 * handed it over). */
static void epd_prefill_layer_sum(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x, uint32_t layer)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    uint8_t got = x->sum_kinds[layer];
    epd_hash_state_t *h = srv->hash;
    uint32_t from = 0;

    epd_prefill_sum_kind(srv, x, layer, got);
    if (got == 1 + x->sum_kind || x->protocol_only) {
        return;
    }
    epd_hash_state_reset(srv->hash, 0);
    if (kv->kind[layer] == EPD_LAYER_LINEAR) {
        epd_prefill_hash_units(srv, x, layer, 0, 1, h);
    } else {
        /* blocks [0, hashed_blocks) went into the layer's own state as
         * earlier chunks made them final: only the rest now */
        if (x->lhash[layer] != NULL) {
            h = x->lhash[layer];
            from = x->hashed_blocks[layer];
        }
        epd_prefill_hash_units(srv, x, layer, from, x->local.n_blocks, h);
    }
    x->checksums[layer] = epd_hash_state_digest(h);
}

/* Posts the rest of layer `layer` from the cursor, one write per run (the
 * bytes, their order and so the checksum are those of block-by-block
 * writes), each at most write_chunk_bytes, while *budget lasts.  EPD_OK
 * once the layer is posted; EPD_INPROGRESS when the budget ran out first. */
static epd_status_t epd_prefill_post_layer(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x,
                                           uint32_t layer, uint64_t *budget, char *msg, size_t cap)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    uint32_t n = x->protocol_only ? 0 : kv->kind[layer] == EPD_LAYER_LINEAR ? 1 : x->n_runs;
    epd_prefill_lw_t *lw = &x->lw[layer];
    char *base = srv->pool.base;

    while (x->post_idx < n) {
        epd_prefill_write_t w;
        uint64_t len, t0;
        epd_status_t st;

        if (*budget == 0) {
            return EPD_INPROGRESS;
        }
        st = epd_prefill_plan_run_write(kv, &x->local, &x->remote, x->region_size, layer,
                                        &x->runs[x->post_idx], &w);
        if (st != EPD_OK) {
            snprintf(msg, cap, "write plan outside a pool");
            return st;
        }
        len = w.len - x->post_off;
        len = len < srv->write_chunk_bytes ? len : srv->write_chunk_bytes;
        t0 = lw->ep_ns == 0 ? epd_time_now_ns() : 0;
        st = epd_xport_write(epd_link_ep(epd_peer_link(x->peer)), base + w.local_off + x->post_off,
                             (size_t)len, srv->pool_mr, x->rkey, w.remote_off + x->post_off,
                             epd_prefill_on_write, lw);
        if (st == EPD_ERR_NO_RESOURCE) {
            if (!x->backpressured) {
                x->backpressured = 1;
                epd_log_debug(EPD_PREFILL_LOG, x->id,
                              "transport backpressure at layer %u run %u (%u in flight): "
                              "retrying after progress",
                              layer, x->post_idx, x->writes_inflight);
            }
            return st;
        }
        if (st != EPD_INPROGRESS && st != EPD_OK) {
            snprintf(msg, cap, "posting a KV write to decode '%.80s': %s", epd_peer_id(x->peer),
                     epd_status_string(st));
            return epd__prefill_xfer_peer_status(st);
        }
        epd_prefill_lw_posted(lw, t0);
        x->writes_inflight++;
        lw->inflight++;
        lw->bytes += len;
        x->writes_posted++;
        *budget = *budget > len ? *budget - len : 0;
        x->post_off += len;
        if (x->post_off == w.len) {
            x->writes_coalesced += kv->kind[layer] == EPD_LAYER_LINEAR
                                       ? 0
                                       : x->runs[x->post_idx].n - 1;
            x->post_idx++;
            x->post_off = 0;
        }
    }
    return EPD_OK;
}

void epd__prefill_xfer_chunk_ready(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x, uint32_t layer,
                                   uint32_t final_tokens)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    uint32_t blocks;

    if (layer >= kv->n_layers || kv->kind[layer] != EPD_LAYER_ATTENTION || kv->block_tokens == 0) {
        return; /* a recurrent state is final only after the last chunk */
    }
    /* full blocks only: the next chunk writes the rest of a partial one */
    blocks = final_tokens / kv->block_tokens;
    if (blocks > x->local.n_blocks) {
        blocks = x->local.n_blocks;
    }
    if (blocks > x->ready_blocks[layer]) {
        x->ready_blocks[layer] = blocks;
    }
}

/* The layer's checksum goes along (every block in order, those decode holds
 * included) as earlier chunks make blocks final: blocks [hashed, ready)
 * into the layer's running state, once decode's reservation is here (the
 * kind depends on it) — after the layer's last chunk only its blocks are
 * left (epd_prefill_layer_sum).  No memory: hashed whole at the end. */
static void epd_prefill_hash_ready(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x, uint32_t layer)
{
    uint32_t blocks = x->ready_blocks[layer];

    if (x->protocol_only || x->hashed_blocks[layer] >= blocks) {
        return;
    }
    if (x->lhash[layer] == NULL && epd_hash_state_create(0, &x->lhash[layer]) != EPD_OK) {
        x->lhash[layer] = NULL;
        return;
    }
    epd_prefill_sum_kind(srv, x, layer, 0);
    epd_prefill_hash_units(srv, x, layer, x->hashed_blocks[layer], blocks, x->lhash[layer]);
    x->hashed_blocks[layer] = blocks;
}

/* Posts layer `layer`'s blocks [sent_blocks, ready_blocks) — final by an
 * earlier chunk — in block order (the checksum's order), through the runs
 * (cut at the ready edge; blocks decode holds are skipped), each write at
 * most --write-chunk-bytes (whole blocks).  Same returns as
 * epd_prefill_post_layer. */
static epd_status_t epd_prefill_stream_layer(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x,
                                             uint32_t layer, uint64_t *budget, char *msg,
                                             size_t cap)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    uint64_t bb = epd_kv_layer_block_bytes(kv, layer); /* per layer: a KV dtype map */
    uint32_t per_write = bb > 0 && srv->write_chunk_bytes >= bb
                             ? (uint32_t)(srv->write_chunk_bytes / bb)
                             : 1;
    epd_prefill_lw_t *lw = &x->lw[layer];
    char *base = srv->pool.base;

    while (x->sent_blocks[layer] < x->ready_blocks[layer]) {
        uint32_t sent = x->sent_blocks[layer];
        uint32_t i = x->srun[layer];
        uint32_t end;
        epd_prefill_run_t r;
        epd_prefill_write_t w;
        epd_status_t st;
        uint64_t t0;

        while (i < x->n_runs && x->runs[i].first + x->runs[i].n <= sent) {
            i++;
        }
        x->srun[layer] = i;
        if (i == x->n_runs) {
            x->sent_blocks[layer] = x->ready_blocks[layer]; /* decode holds the rest */
            break;
        }
        if (x->runs[i].first > sent) {
            sent = x->runs[i].first; /* blocks decode holds (cached) */
            if (sent >= x->ready_blocks[layer]) {
                x->sent_blocks[layer] = x->ready_blocks[layer];
                break;
            }
        }
        if (*budget == 0) {
            x->sent_blocks[layer] = sent;
            return EPD_INPROGRESS;
        }
        end = x->runs[i].first + x->runs[i].n;
        end = end < x->ready_blocks[layer] ? end : x->ready_blocks[layer];
        r.first = sent;
        r.n = end - sent < per_write ? end - sent : per_write;
        st = epd_prefill_plan_run_write(kv, &x->local, &x->remote, x->region_size, layer, &r, &w);
        if (st != EPD_OK) {
            snprintf(msg, cap, "write plan outside a pool");
            return st;
        }
        t0 = lw->ep_ns == 0 ? epd_time_now_ns() : 0;
        st = epd_xport_write(epd_link_ep(epd_peer_link(x->peer)), base + w.local_off, (size_t)w.len,
                             srv->pool_mr, x->rkey, w.remote_off, epd_prefill_on_write, lw);
        if (st == EPD_ERR_NO_RESOURCE) {
            x->sent_blocks[layer] = sent;
            if (!x->backpressured) {
                x->backpressured = 1;
                epd_log_debug(EPD_PREFILL_LOG, x->id,
                              "transport backpressure streaming layer %u (%u in flight): "
                              "retrying after progress",
                              layer, x->writes_inflight);
            }
            return st;
        }
        if (st != EPD_INPROGRESS && st != EPD_OK) {
            snprintf(msg, cap, "posting a KV write to decode '%.80s': %s", epd_peer_id(x->peer),
                     epd_status_string(st));
            return epd__prefill_xfer_peer_status(st);
        }
        epd_prefill_lw_posted(lw, t0);
        x->writes_inflight++;
        lw->inflight++;
        lw->bytes += w.len;
        x->writes_posted++;
        x->writes_coalesced += r.n - 1;
        *budget = *budget > w.len ? *budget - w.len : 0;
        x->sent_blocks[layer] = sent + r.n;
    }
    return EPD_OK;
}

/* After layer `layer`'s blocks [0, sent_blocks) were posted ahead of its
 * end (a chunk made them final): a landed LayerDone naming them, fenced
 * behind those writes, with their BYTES checksum so far — decode verifies
 * them while later chunks compute, and only the last chunk's blocks are
 * left to check after the last one (rule 4).  Only when decode takes
 * ranges and the layer's hash covers exactly the posted blocks; a message
 * refused for backpressure is skipped (the next range, or the layer's own
 * LayerDone, covers its blocks). */
static void epd_prefill_range_done(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x, uint32_t layer)
{
    Epd__LayerDone ld = EPD__LAYER_DONE__INIT;
    uint32_t k = x->sent_blocks[layer];

    epd_prefill_hash_ready(srv, x, layer);
    if (!x->d_ranges || !srv->layer_notify || x->protocol_only || x->lhash[layer] == NULL ||
        k == 0 || k != x->hashed_blocks[layer] || k <= x->range_sent[layer] || x->sum_kind < 0) {
        return;
    }
    ld.request_id = x->id;
    ld.layer = layer;
    ld.checksum = epd_hash_state_digest(x->lhash[layer]);
    ld.checksum_kind = (uint32_t)x->sum_kind; /* chosen by epd_prefill_hash_ready */
    ld.landed = 1;
    ld.blocks = k;
    if (epd_prefill_send_layer_done(srv, x, &ld, "LayerDone (blocks) sent")) {
        x->range_sent[layer] = k;
    }
}

/* The cursor at the start of layer `layer`'s own posting: past the blocks
 * streamed ahead by earlier chunks. */
static void epd_prefill_cursor_skip_sent(const epd_prefill_srv_t *srv, epd_prefill_xfer_t *x,
                                         uint32_t layer)
{
    uint32_t sent = x->sent_blocks[layer];
    uint32_t i = x->srun[layer];

    if (sent == 0 || srv->info->kv.kind[layer] != EPD_LAYER_ATTENTION) {
        return;
    }
    while (i < x->n_runs && x->runs[i].first + x->runs[i].n <= sent) {
        i++;
    }
    x->post_idx = i;
    x->post_off = i < x->n_runs && sent > x->runs[i].first
                      ? (uint64_t)(sent - x->runs[i].first) *
                            epd_kv_layer_block_bytes(&srv->info->kv, layer)
                      : 0;
}

/* Fault point prefill.pause_after_layer=N (common/epd_fault.h), for the
 * fence tests: the first transfer that posted layer N holds its later
 * layers until compute is done, then stops the whole process (SIGSTOP)
 * right before posting layer N + 1 — so that, once continued, it posts
 * every later layer before its loop hears anything of its peers (a
 * decode worker that declared it dead meanwhile, say).  Returns nonzero
 * while the layer is held. */
static int epd_prefill_fault_pause(epd_prefill_xfer_t *x, uint32_t layer, int compute_done)
{
    int64_t n;

    if (!epd_fault_any() ||
        !epd_fault_point("prefill.pause_after_layer", &n) || n < 0) {
        return 0;
    }
    if (x->fault_pause == 0 && layer == (uint32_t)n + 1 &&
        epd_fault_once("prefill.pause_after_layer")) {
        x->fault_pause = 1;
    }
    if (x->fault_pause != 1 || layer != (uint32_t)n + 1) {
        return 0;
    }
    if (!compute_done) {
        return 1;
    }
    x->fault_pause = 2;
    epd_log_warn(EPD_PREFILL_LOG, x->id,
                 "fault point prefill.pause_after_layer=%lld: layers 0..%lld written, stopping "
                 "before layer %u",
                 (long long)n, (long long)n, layer);
    epd_fault_pause("prefill.pause_after_layer");
    return 0;
}

epd_status_t epd__prefill_xfer_post(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x,
                                    uint32_t layers_done, int compute_done, char *msg, size_t cap)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    uint64_t budget = srv->write_chunk_bytes;

    x->more = 0;
    if (!x->have_resv) {
        return EPD_OK;
    }
    /* per-chunk streaming: the layers not final yet post what earlier
     * chunks made final, whatever the grouping (a chunk is large) */
    for (uint32_t l = layers_done; !x->protocol_only && l < kv->n_layers; l++) {
        epd_status_t st;

        if (x->sent_blocks[l] >= x->ready_blocks[l]) {
            epd_prefill_range_done(srv, x, l); /* one skipped for backpressure */
            continue;
        }
        if (!epd_peer_usable(x->peer) || x->rkey == NULL) {
            snprintf(msg, cap, "decode worker '%.80s' is gone", epd_peer_id(x->peer));
            return EPD_ERR_PEER_DEAD;
        }
        x->lw[l].posting = 1;
        st = epd_prefill_stream_layer(srv, x, l, &budget, msg, cap);
        x->lw[l].posting = 0;
        epd_prefill_lw_episode(srv, &x->lw[l]);
        if (st == EPD_INPROGRESS) {
            x->more = 1; /* the loop's other events first */
            return EPD_OK;
        }
        if (st != EPD_OK) {
            return st;
        }
        epd_prefill_range_done(srv, x, l);
    }
    if (!epd_prefill_group_ready(srv, x, layers_done, compute_done)) {
        return EPD_OK;
    }
    if (x->post_layer < layers_done && (!epd_peer_usable(x->peer) || x->rkey == NULL)) {
        snprintf(msg, cap, "decode worker '%.80s' is gone", epd_peer_id(x->peer));
        return EPD_ERR_PEER_DEAD;
    }
    while (x->post_layer < layers_done) {
        uint32_t layer = x->post_layer;
        epd_prefill_lw_t *lw = &x->lw[layer];
        epd_status_t st;

        if (!x->cur_begun && epd_prefill_fault_pause(x, layer, compute_done) != 0) {
            return EPD_OK; /* held until compute is done (fault point) */
        }

        if (!x->cur_begun) {
            /* x->checksums[layer] was written by the compute thread before it
             * handed the layer over (the event queue orders it before us) */
            epd_prefill_layer_sum(srv, x, layer);
            epd_prefill_cursor_skip_sent(srv, x, layer);
            x->cur_begun = 1;
        }
        lw->posting = 1;
        st = epd_prefill_post_layer(srv, x, layer, &budget, msg, cap);
        lw->posting = 0;
        epd_prefill_lw_episode(srv, lw);
        if (st == EPD_INPROGRESS) {
            x->more = 1; /* the loop's other events first */
            return EPD_OK;
        }
        if (st != EPD_OK) {
            return st;
        }
        x->post_layer++;
        x->post_idx = 0;
        x->post_off = 0;
        x->cur_begun = 0;
        lw->all_posted = 1;
        if (lw->inflight == 0 && lw->bytes > 0) {
            epd_prefill_lw_done(srv, lw); /* completed while we were posting */
        }
        if (compute_done && layer + 1 == kv->n_layers) {
            /* PrefillComplete goes right after, fenced the same way and
             * carrying every checksum: a LayerDone would only duplicate it */
            break;
        }
        if (srv->layer_notify) {
            /* per-layer verification: fenced behind every write posted so
             * far, i.e. behind the whole layer, so decode may check it now */
            if (epd_prefill_layer_done(srv, x, layer, 1)) {
                srv->layer_notices++;
            } else {
                srv->layer_notices_skipped++;
            }
        } else {
            epd_prefill_maybe_keepalive(srv, x, layer, epd_time_now_ns());
        }
    }
    return EPD_OK;
}

epd_status_t epd__prefill_xfer_complete(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x,
                                        int32_t first_token, uint32_t n_tokens,
                                        const Epd__PhaseTimes *times,
                                        const epd_sample_logprob_t *first_logprob)
{
    Epd__PrefillComplete pc = EPD__PREFILL_COMPLETE__INIT;
    Epd__TokenLogprob lp;

    if (first_logprob != NULL) {
        epd_token_logprob_view(first_logprob, &lp);
        pc.first_logprob = &lp;
    }

    pc.request_id = x->id;
    pc.first_token = (uint32_t)first_token;
    pc.n_prompt_tokens = n_tokens;
    pc.n_layer_checksums = srv->info->kv.n_layers;
    pc.layer_checksums = x->checksums;
    pc.checksum_kind = x->sum_kind > 0 ? (uint32_t)x->sum_kind : 0;
    /* protobuf-c packs from a non-const pointer; it only reads it */
    pc.times = (Epd__PhaseTimes *)(uintptr_t)times;
    /* fenced: decode sees it only after every write of this request landed */
    return epd_link_send(epd_peer_link(x->peer), EPD__ENVELOPE__BODY_PREFILL_COMPLETE, &pc,
                         EPD_XPORT_SEND_FENCE);
}

void epd__prefill_xfer_first_token(epd_prefill_srv_t *srv, epd_link_t *client, uint64_t id,
                                   int32_t first_token)
{
    Epd__TokenChunk tc = EPD__TOKEN_CHUNK__INIT;
    uint32_t tok = (uint32_t)first_token;
    epd_status_t st;

    tc.request_id = id;
    tc.index = 0;
    tc.n_tokens = 1;
    tc.tokens = &tok;
    tc.finish = EPD__FINISH_REASON__FINISH_LENGTH;
    st = epd_link_send(client, EPD__ENVELOPE__BODY_TOKENS, &tc, 0);
    if (st != EPD_OK) {
        epd_daemon_refuse_log(srv->d, id, "cannot answer the client: %s", epd_status_string(st));
    }
    epd_trace_instant(srv->trace, "first token sent", "msg", id, -1, epd_time_now_ns());
}
