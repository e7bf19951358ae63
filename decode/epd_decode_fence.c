/*
 * epd_decode_fence.c — the decode worker's check of the KV writes that
 * reach it (proto/README.md rules 25-29; transport/epd_xport.h, "The
 * fence").
 *
 * Prefill workers write into the pool under a grant of their own (one per
 * incarnation, epd_peer_grant), revoked when decode retires the
 * incarnation.  Where the transport sees each write before its bytes land
 * (UCX active messages: tcp, and shared memory into regions it does not
 * map), it asks here first, with the writer's peer record (the grant's
 * user pointer) and the byte range: every block (or state slot) the range
 * touches must be RESERVED by a live request of that very incarnation.  A
 * write into someone else's blocks, into blocks whose request already
 * verified its KV (ACTIVE), into blocks quarantined, free or CACHED (a
 * reservation's read-only head of decode-side reuse: never written by a
 * remote writer, so never granted) is dropped
 * and counted (epd_xport_stats.writes_refused_range) — a wrong-headed or
 * late writer cannot land in another request's KV through this path.
 *
 * The check runs inside the transport's progress (it only reads the block
 * table and the request table).  Also here: the key a reservation carries
 * (the writer's own grant), the asking of a retired writer to confirm, and
 * the line that says what a closed incarnation left held.  Loop thread.
 */
#include "epd_decode_int.h"
#include "epd_log.h"
#include "epd_time.h"

/* Is a block (slot) of state `st` owned by `owner` writable by `who` now?
 * One write is one request's: every unit it touches has the owner of the
 * first (*last, 0 before it). */
static int epd_decode_fence_owned(epd_decode_srv_t *srv, epd_decode_blk_state_t st, uint64_t owner,
                                  const epd_peer_t *who, uint64_t *last)
{
    const epd_decode_request_t *req;

    if (st != EPD_DECODE_BLK_RESERVED || owner == 0) {
        return 0;
    }
    if (*last != 0) {
        return owner == *last;
    }
    req = epd_reqtab_find_req(&srv->reqs, owner, 0);
    if (req == NULL || req->peer != who || req->state != EPD_DECODE_REQ_RESERVED) {
        return 0;
    }
    *last = owner;
    return 1;
}

int epd__decode_fence_check(void *arg, void *grant_user, uint64_t off, uint64_t len)
{
    epd_decode_srv_t *srv = arg;
    const epd_kv_layout_t *kv = &srv->info->kv;
    const epd_peer_t *who = grant_user;
    uint64_t n_blocks = srv->pool.n_blocks, n_slots = srv->pool.n_state_slots;
    uint64_t attn = n_blocks * epd_kv_block_set_bytes(kv);
    uint64_t end, last = 0;

    if (len == 0 || __builtin_add_overflow(off, len, &end)) {
        return 0;
    }
    /* attention layers: [layer][block][block_bytes]; every block touched */
    if (off < attn) {
        uint64_t pos = off;

        if (end > attn) {
            return 0;
        }
        /* blocks of different layers may differ in size (a KV dtype map) */
        while (pos < end) {
            uint32_t l;
            uint32_t b;
            uint64_t start;

            if (epd_kv_block_at(kv, (uint32_t)n_blocks, pos, &l, &b) != EPD_OK ||
                epd_kv_block_offset(kv, (uint32_t)n_blocks, l, b, &start) != EPD_OK ||
                !epd_decode_fence_owned(srv, epd_decode_blocks_state(srv->blocks, b),
                                        epd_decode_blocks_owner(srv->blocks, b), who, &last)) {
                return 0;
            }
            pos = start + epd_kv_layer_block_bytes(kv, l);
        }
        return 1;
    }
    /* linear layers' recurrent states: [layer][slot][state_bytes] */
    if (kv->state_bytes == 0 || n_slots == 0) {
        return 0;
    }
    for (uint64_t u = (off - attn) / kv->state_bytes; u <= (end - 1 - attn) / kv->state_bytes;
         u++) {
        uint32_t sl = (uint32_t)(u % n_slots);

        if (u >= (uint64_t)kv->n_linear_layers * n_slots ||
            !epd_decode_fence_owned(srv, epd_decode_blocks_slot_state(srv->blocks, sl),
                                    epd_decode_blocks_slot_owner(srv->blocks, sl), who, &last)) {
            return 0;
        }
    }
    return 1;
}

epd_status_t epd__decode_fence_key(epd_decode_srv_t *srv, const epd_decode_request_t *req,
                                   ProtobufCBinaryData *key_p)
{
    const void *key;
    size_t len;
    epd_status_t st = epd_peer_grant(req->peer, srv->mr, &key, &len);

    if (st == EPD_OK) {
        key_p->data = (uint8_t *)(uintptr_t)key;
        key_p->len = len;
    }
    return st;
}

void epd__decode_fence_ask(epd_decode_srv_t *srv, epd_decode_request_t *req, uint64_t now)
{
    /* a retired writer is asked once per its silence limit */
    uint64_t ask = (uint64_t)epd_daemon_flags(srv->d)->peer_timeout_ms * EPD_NSEC_PER_MSEC;

    if (!epd_peer_fenced(req->peer) && now - req->abort_sent_ns > ask) {
        req->abort_sent_ns = now;
        (void)epd_peer_ask_quiesced(req->peer, req->id,
                                    "retired: confirm no write of this request can land");
    }
}

void epd__decode_fence_closed(epd_decode_srv_t *srv, epd_peer_t *peer, uint32_t n)
{
    uint32_t held = 0;

    for (const epd_decode_request_t *req = epd_reqtab_first_req(&srv->reqs); req != NULL;
         req = epd_reqtab_next_req(&srv->reqs, req)) {
        held += req->peer == peer && !req->p_done;
    }
    epd_log_info(EPD_DECODE_LOG, 0,
                 "prefill worker %s: its endpoints are closed; %u requests' blocks released, %u "
                 "held until nothing it was granted can land (%s)",
                 epd_peer_id(peer), n - held, held, epd_peer_fence_state(peer));
}
