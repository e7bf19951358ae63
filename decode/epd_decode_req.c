/*
 * epd_decode_req.c — the decode worker's request layer: one request's life
 * on the loop thread (decode/README.md tells the story; proto/README.md
 * rules 3-11 the protocol).
 *
 *   RESERVED     admitted: blocks (+ a state slot) reserved, KvReservation
 *                sent on our link to the prefill worker P
 *   READY        P's fenced PrefillComplete came and every layer's checksum
 *                matched (as each landed LayerDone came, the rest now):
 *                blocks ACTIVE, TokenChunk{0, [first]} sent; it waits for
 *                room in the compute thread's queue
 *   RUNNING      its sequence is in the continuous batch; tokens stream
 *   QUARANTINED  ended before P completed (client abort or gone, lease,
 *                deadline, a failure of P's or of its KV, P dead): the
 *                client has its answer, P was told to stop, the blocks wait
 *                until nothing of P can land — its WritesQuiesced or
 *                PrefillComplete, or every endpoint of its incarnation
 *                closed (on_peer_closed)
 *   DONE         blocks FREE; freed at once
 *
 * Every transition is made by epd_decode_step (one switch) from the facts
 * events record (epd_decode_request_t's "facts"); the blocks move with the
 * state (epd_decode_blocks.h), so a block P may still write is never free.
 * Events that are not nested in anything (messages, compute results,
 * ticks, the pump) step their request at once; the death of a prefill
 * incarnation may be noticed nested inside a message handler, so it only
 * records and marks requests dirty for the pump.  A failure records what
 * it owes (EPD_DECODE_TELL_CLIENT, END_CLIENT, ABORT_P), sent once by the
 * step.  Messages never wait (the links queue them, in order); a READY
 * request that finds the compute queue full parks on the blocked list,
 * retried after the compute thread's next wake-up and on the tick.
 */
#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_decode_int.h"
#include "epd_log.h"
#include "epd_time.h"

/* ------------------------------------------------------------ bookkeeping */

int epd__decode_req_live(const epd_decode_srv_t *srv, uint64_t id)
{
    return epd_reqtab_find_req(&srv->reqs, id, 0) != NULL;
}

/* Marks a request for a step at the top of the loop. */
static void epd_decode_dirty(epd_decode_srv_t *srv, epd_decode_request_t *req)
{
    if (epd_reqtab_dirty(&srv->reqs, &req->ent)) {
        epd_daemon_kick(srv->d);
    }
}

/* Refuses a message: one rate-limited line and an Error to its sender
 * (never in answer to an Error). */
static void epd_decode_refuse(epd_decode_srv_t *srv, epd_link_t *to, const Epd__Envelope *env,
                              uint64_t id, epd_status_t status, const char *what)
{
    epd_daemon_counts(srv->d)->refused++;
    epd_daemon_refuse_log(srv->d, id, "%s from %s: %s (%s)", epd_msg_body_name(env),
                          env->sender->worker_id, what, epd_status_name(status));
    if (env->body_case != EPD__ENVELOPE__BODY_ERROR) {
        (void)epd_link_send_error(to, id, status, what, NULL);
    }
}

/* A block transition of epd_decode_blocks.h (all but reserve). */
typedef epd_status_t (*epd_decode_blk_op_t)(epd_decode_blocks_t *blocks, uint64_t owner,
                                            const uint32_t *ids, uint32_t n, uint32_t slot);

/* Moves the blocks of `req` with its state: a refusal is a broken
 * invariant of this file, never input (the allocator changed nothing: a
 * block stays unavailable, never free too early). */
static void epd_decode_blocks_to(epd_decode_srv_t *srv, const epd_decode_request_t *req,
                                 epd_decode_blk_op_t op, const char *name)
{
    /* the request's own blocks: the cached head is lent, never owned */
    epd_status_t st = op(srv->blocks, req->id, req->blocks + req->n_cached,
                         req->n_blocks - req->n_cached, req->slot);

    if (st != EPD_OK) {
        epd_log_error(EPD_DECODE_LOG, req->id, "block allocator refused %s: %s (a bug)", name,
                      epd_status_string(st));
    }
    assert(st == EPD_OK);
}

/* ---------------------------------------------------------------- sending */

/* Streams the tokens produced since the last chunk and, with `finish`,
 * ends the stream: the client's final answer. */
static void epd_decode_stream(epd_decode_request_t *req, uint32_t n_produced,
                              Epd__FinishReason finish)
{
    if (req->client_done) {
        return;
    }
    while (req->n_sent < n_produced || finish != EPD__FINISH_REASON__FINISH_NONE) {
        Epd__TokenChunk c = EPD__TOKEN_CHUNK__INIT;
        uint32_t n = n_produced - req->n_sent;
        int last;

        if (n > EPD_DECODE_CHUNK_MAX) {
            n = EPD_DECODE_CHUNK_MAX;
        }
        last = req->n_sent + n == n_produced;
        c.request_id = req->id;
        c.index = req->n_sent;
        /* int32_t and uint32_t may alias; token ids are < vocab */
        c.tokens = (uint32_t *)(uintptr_t)(req->seq.tokens + req->n_sent);
        c.n_tokens = n;
        c.finish = last ? finish : EPD__FINISH_REASON__FINISH_NONE;
        /* a link that failed tells us through on_link_down */
        (void)epd_link_send(req->client, EPD__ENVELOPE__BODY_TOKENS, &c, 0);
        req->n_sent += n;
        if (last) {
            break;
        }
    }
    if (finish != EPD__FINISH_REASON__FINISH_NONE) {
        req->client_done = 1;
    }
}

/* The Abort that tells P to stop writing for `req` (on our link to it). */
static void epd_decode_abort_p(epd_decode_request_t *req, epd_status_t status, const char *reason)
{
    req->abort_sent_ns = epd_time_now_ns();
    if (!req->p_done && epd_peer_usable(req->peer)) {
        (void)epd_link_send_abort(epd_peer_link(req->peer), req->id, status, reason);
    }
}

/* Sends what a failed request still owes, each once. */
static void epd_decode_send_owed(epd_decode_request_t *req)
{
    if ((req->owe & EPD_DECODE_TELL_CLIENT) != 0 && !req->client_done) {
        (void)epd_link_send_error(req->client, req->id, req->fail_status, req->fail_msg,
                                  req->culprit[0] != '\0' ? req->culprit : NULL);
        req->client_done = 1;
    }
    if ((req->owe & EPD_DECODE_END_CLIENT) != 0) {
        epd_decode_stream(req, req->n_sent, EPD__FINISH_REASON__FINISH_ABORT);
    }
    req->client_done = 1;
    if ((req->owe & EPD_DECODE_ABORT_P) != 0) {
        epd_decode_abort_p(req, req->p_status, req->p_reason);
    }
    req->owe = 0;
}

/* The KvReservation for `req`, on our link to its prefill worker. */
static epd_status_t epd_decode_send_reservation(epd_decode_srv_t *srv, epd_decode_request_t *req)
{
    Epd__KvReservation kr = EPD__KV_RESERVATION__INIT;

    kr.request_id = req->id;
    kr.n_block_ids = req->n_prompt_blocks;
    kr.block_ids = req->blocks;
    kr.state_slot = req->seq.slot;
    kr.rkey.data = srv->rkey;
    kr.rkey.len = srv->rkey_len;
    kr.region_size = epd_xport_mr_size(srv->mr);
    kr.layout = &srv->layout_msg;
    kr.lease_ms = srv->lease_ms;
    kr.pool_blocks = srv->pool.n_blocks;
    kr.pool_state_slots = srv->pool.n_state_slots;
    kr.cached_blocks = req->n_cached;
    kr.stamped_sums = 1; /* we check either kind */
    return epd_link_send(epd_peer_link(req->peer), EPD__ENVELOPE__BODY_RESERVATION, &kr, 0);
}

/* ---------------------------------------------------------------- failure */

/*
 * Fails (or aborts) `req`: the first call wins the status and message;
 * `owe` says what it owes (EPD_DECODE_*), less what cannot be owed any
 * more (a client that has its answer, a P that is done).  The step does
 * the rest.  Nested-safe: records and marks dirty only.
 */
static void epd_decode_fail(epd_decode_srv_t *srv, epd_decode_request_t *req, epd_status_t status,
                            const char *msg, unsigned owe)
{
    if (req->fail_status != EPD_OK || req->state == EPD_DECODE_REQ_DONE) {
        return;
    }
    req->fail_status = status != EPD_OK ? status : EPD_ERR_FATAL;
    snprintf(req->fail_msg, sizeof(req->fail_msg), "%s", msg);
    req->p_status = req->fail_status;
    snprintf(req->p_reason, sizeof(req->p_reason), "%s", msg);
    if (req->client_done) {
        owe &= ~(EPD_DECODE_TELL_CLIENT | EPD_DECODE_END_CLIENT);
    }
    if (req->p_done || req->state != EPD_DECODE_REQ_RESERVED) {
        owe &= ~EPD_DECODE_ABORT_P; /* nothing of P in flight */
    }
    req->owe = owe;
    epd_daemon_counts(srv->d)->failed++;
    epd_decode_dirty(srv, req);
}

/* The KV P wrote for a RESERVED request failed its checks: the client
 * gets the error, P too (on the link the message came on) unless the cache
 * itself is corrupt, and P is told to stop unless it is done already. */
static void epd_decode_fail_kv(epd_decode_srv_t *srv, epd_decode_request_t *req, epd_link_t *from,
                               const Epd__Envelope *env, epd_status_t st, const char *why,
                               uint32_t bad_layer)
{
    if (st == EPD_ERR_CORRUPT) {
        epd_log_error(EPD_DECODE_LOG, req->id,
                      "KV of layer %u from %s does not match its checksum: request failed, never "
                      "generated",
                      bad_layer, env->sender->worker_id);
    } else {
        epd_decode_refuse(srv, from, env, req->id, st, why);
    }
    epd_decode_fail(srv, req, st, why, EPD_DECODE_TELL_CLIENT | EPD_DECODE_ABORT_P);
}

/* Lends layer `layer`'s check (marked CHECKING, its sum recorded) to the
 * verifier; a refusal is a broken sizing invariant: the request fails. */
static void epd_decode_check_lend(epd_decode_srv_t *srv, epd_decode_request_t *req, uint32_t layer)
{
    epd_decode_vjob_t *j = &req->vjobs[layer];
    epd_kv_stamp_expect_t x = {
        .req_id = req->id, .tag = srv->stamp_tag, .n_tokens = req->n_prompt, .full = srv->verify_full};

    epd_decode_vjob_init(j, req, layer, req->kv.sums[layer], (epd_kv_sum_kind_t)req->kv.kind,
                         req->blocks, req->n_prompt_blocks, req->seq.slot, &x);
    if (epd_decode_verify_submit(srv->verify, j) != EPD_OK) {
        epd_log_error(EPD_DECODE_LOG, req->id, "verifier queue full (sizing invariant broken)");
        (void)epd_decode_seen_result(&req->kv, layer, EPD_ERR_NO_RESOURCE, 0, NULL);
        epd_decode_fail(srv, req, EPD_ERR_NO_RESOURCE, "verifier queue full",
                        EPD_DECODE_TELL_CLIENT | EPD_DECODE_ABORT_P);
        return;
    }
    req->v_lent++;
}

/* ------------------------------------------------------------------- step */

/* A RUNNING request's sequence came back for good: its end goes out. */
static void epd_decode_finish_run(epd_decode_srv_t *srv, epd_decode_request_t *req)
{
    uint32_t n = atomic_load_explicit(&req->seq.n_produced, memory_order_acquire);
    epd_decode_finish_t fin =
        (epd_decode_finish_t)atomic_load_explicit(&req->seq.finish, memory_order_acquire);

    switch (fin) {
    case EPD_DECODE_FINISH_LENGTH:
    case EPD_DECODE_FINISH_STOP:
        epd_decode_stream(req, n,
                          fin == EPD_DECODE_FINISH_STOP ? EPD__FINISH_REASON__FINISH_STOP
                                                        : EPD__FINISH_REASON__FINISH_LENGTH);
        epd_daemon_counts(srv->d)->served++;
        break;
    case EPD_DECODE_FINISH_ABORT:
        /* asked by the loop: the client was answered then (or is gone) */
        epd_decode_stream(req, req->n_sent, EPD__FINISH_REASON__FINISH_ABORT);
        break;
    case EPD_DECODE_FINISH_ERROR:
    case EPD_DECODE_FINISH_NONE:
        epd_log_error(EPD_DECODE_LOG, req->id, "generation failed: %s",
                      epd_status_string(req->seq.error));
        if (!req->client_done) {
            (void)epd_link_send_error(req->client, req->id,
                                      req->seq.error != EPD_OK ? req->seq.error : EPD_ERR_FATAL,
                                      "decode step failed", NULL);
            req->client_done = 1;
        }
        epd_daemon_counts(srv->d)->failed++;
        break;
    }
    epd_log_debug(EPD_DECODE_LOG, req->id, "finished after %u tokens", n);
}

/* RESERVED -> READY (or DONE when the first token ends it): the blocks are
 * P's no more; the first token goes out. */
static void epd_decode_activate(epd_decode_srv_t *srv, epd_decode_request_t *req)
{
    epd_decode_blocks_to(srv, req, epd_decode_blocks_activate, "activate");
    /* received: what prefill wrote (not the cached head it skipped) */
    srv->kv_bytes_received += req->kv.bytes - epd__decode_cache_head_bytes(srv, req);
    /* the decode side holds all of the prompt's KV, verified: the end of the
     * transfer (epd-bench overhead measures up to here) */
    req->t_join_ns = epd_time_now_ns();
    epd_trace_instant(srv->trace, "KV held", "xfer", req->id, -1, req->t_join_ns);
    epd_decode_stream(req, 1, (Epd__FinishReason)req->first_finish);
    if (req->first_finish != EPD__FINISH_REASON__FINISH_NONE) {
        epd__decode_cache_finished(srv, req);
        epd_decode_blocks_to(srv, req, epd_decode_blocks_retire, "retire");
        epd_daemon_counts(srv->d)->served++;
        req->state = EPD_DECODE_REQ_DONE;
        return;
    }
    req->state = EPD_DECODE_REQ_READY;
    srv->n_ready++;
}

/* READY -> RUNNING when the compute queue has room, behind the requests
 * already waiting for it (returns -1: parked on the blocked list). */
static int epd_decode_join(epd_decode_srv_t *srv, epd_decode_request_t *req)
{
    if ((epd_reqtab_has_blocked(&srv->reqs) && !epd_reqtab_is_blocked(&req->ent)) ||
        srv->batch == NULL || epd_decode_batch_submit(srv->batch, &req->seq) != EPD_OK) {
        epd_reqtab_block(&srv->reqs, &req->ent);
        return -1;
    }
    srv->n_ready--;
    req->state = EPD_DECODE_REQ_RUNNING;
    return 0;
}

/*
 * Moves a request as far as its facts allow: the only place its state (and
 * that of its blocks) changes.
 */
static void epd_decode_step(epd_decode_srv_t *srv, epd_decode_request_t *req)
{
    for (;;) {
        epd_decode_req_state_t from = req->state;

        switch (req->state) {
        case EPD_DECODE_REQ_RESERVED:
            if (req->fail_status != EPD_OK && req->resv_unsent) {
                /* P never saw the reservation: nothing can land */
                epd_decode_send_owed(req);
                epd_decode_blocks_to(srv, req, epd_decode_blocks_unreserve, "unreserve");
                req->state = EPD_DECODE_REQ_DONE;
            } else if (req->fail_status != EPD_OK || req->p_closed) {
                epd_decode_send_owed(req);
                epd_decode_blocks_to(srv, req, epd_decode_blocks_quarantine, "quarantine");
                req->client_done = 1;
                req->abort_sent_ns = epd_time_now_ns(); /* the next Abort after a lease */
                req->state = EPD_DECODE_REQ_QUARANTINED;
            } else if (req->kv_verified) {
                epd_decode_activate(srv, req);
            }
            break;
        case EPD_DECODE_REQ_READY:
            if (req->fail_status != EPD_OK) {
                epd_decode_send_owed(req);
                epd_decode_blocks_to(srv, req, epd_decode_blocks_retire, "retire");
                srv->n_ready--;
                req->state = EPD_DECODE_REQ_DONE;
            } else if (epd_decode_join(srv, req) != 0) {
                return; /* waits for room */
            }
            break;
        case EPD_DECODE_REQ_RUNNING:
            if (req->fail_status != EPD_OK && !req->abort_asked) {
                /* leaves at the next step boundary; its final entry frees it */
                epd_decode_send_owed(req);
                epd_decode_seq_abort(&req->seq);
                req->abort_asked = 1;
            }
            if (req->compute_done) {
                epd_decode_finish_run(srv, req);
                epd__decode_cache_finished(srv, req);
                epd_decode_blocks_to(srv, req, epd_decode_blocks_retire, "retire");
                req->state = EPD_DECODE_REQ_DONE;
            }
            break;
        case EPD_DECODE_REQ_QUARANTINED:
            if (req->p_done || req->p_closed) {
                epd_decode_blocks_to(srv, req, epd_decode_blocks_release, "release");
                req->state = EPD_DECODE_REQ_DONE;
            }
            break;
        case EPD_DECODE_REQ_DONE:
            break;
        }
        if (req->state == from) {
            return; /* nothing more until the next event */
        }
    }
}

/* A DONE request: out of every list, its references dropped, freed. */
static void epd_decode_destroy(epd_decode_srv_t *srv, epd_decode_request_t *req)
{
    epd_reqtab_remove(&srv->reqs, &req->ent);
    epd__decode_cache_drop(srv, req);
    epd_link_unref(req->client);
    epd_peer_unref(req->peer);
    epd_free(req);
}

/* Steps one request and frees it when it is done.  Never nested inside a
 * daemon upcall that may run inside a message handler. */
static void epd_decode_advance(epd_decode_srv_t *srv, epd_decode_request_t *req)
{
    epd_decode_step(srv, req);
    if (req->state == EPD_DECODE_REQ_DONE && req->v_lent == 0) {
        /* (with checks still lent, their return frees it) */
        epd_decode_destroy(srv, req);
    }
}

static void epd_decode_run_dirty(epd_decode_srv_t *srv)
{
    epd_decode_request_t *req;

    while ((req = epd_reqtab_pop_dirty_req(&srv->reqs)) != NULL) {
        epd_decode_advance(srv, req);
    }
}

/* -------------------------------------------------------------- admission */

/* Admits a checked GenerateRequest bound to `peer` (the caller's reference
 * becomes the request's on success): blocks, the request in the table.
 * EPD_OK, or EPD_ERR_NO_CAPACITY / EPD_ERR_NO_MEMORY with *why_p (nothing
 * kept). */
static epd_status_t epd_decode_admit(epd_decode_srv_t *srv, const Epd__Envelope *env,
                                     const epd_sample_params_t *sp, epd_link_t *client,
                                     epd_peer_t *peer, uint64_t t_recv,
                                     epd_decode_request_t **req_p, const char **why_p)
{
    const Epd__GenerateRequest *g = env->generate;
    const epd_kv_layout_t *kv = &srv->info->kv;
    uint64_t n_total = (uint64_t)g->n_prompt_tokens + g->sampling->max_tokens;
    uint32_t n_blocks = (uint32_t)epd_decode_div_up(n_total, kv->block_tokens);
    uint32_t n_stop = (uint32_t)g->sampling->n_stop_token_ids;
    epd_decode_request_t *req;
    epd_status_t st;
    size_t sz;

    /* one allocation: the struct, the per-layer checks and sums (8-aligned
     * right after it), tokens, block ids, stop ids, per-layer states */
    sz = sizeof(*req) + (size_t)kv->n_layers * (sizeof(epd_decode_vjob_t) + sizeof(uint64_t)) +
         (size_t)g->sampling->max_tokens * sizeof(int32_t) + (size_t)n_blocks * sizeof(uint32_t) +
         (size_t)n_stop * sizeof(uint32_t) + kv->n_layers;
    req = epd_calloc(1, sz);
    if (req == NULL) {
        *why_p = "out of memory";
        return EPD_ERR_NO_MEMORY;
    }
    req->vjobs = (epd_decode_vjob_t *)(req + 1);
    req->kv.sums = (uint64_t *)(req->vjobs + kv->n_layers);
    req->seq.tokens = (int32_t *)(req->kv.sums + kv->n_layers);
    req->blocks = (uint32_t *)(req->seq.tokens + g->sampling->max_tokens);
    req->stop_ids = req->blocks + n_blocks;
    req->kv.state = (uint8_t *)(req->stop_ids + n_stop);
    req->kv.kind = -1;
    st = epd__decode_cache_reserve(srv, req, g, n_blocks); /* a cached head, then fresh blocks */
    if (st != EPD_OK) {
        epd__decode_cache_drop(srv, req);
        epd_free(req);
        *why_p = st != EPD_ERR_NO_CAPACITY ? "reservation failed"
                 : n_blocks > srv->pool.n_blocks
                     ? "request needs more KV blocks than the whole pool"
                     : "not enough free KV blocks or state slots";
        return st;
    }
    req->id = g->request_id;
    req->state = EPD_DECODE_REQ_RESERVED;
    req->srv = srv;
    req->client = client;
    epd_link_ref(client);
    req->client_hash = epd_hash64(env->sender->worker_id, strlen(env->sender->worker_id), 0);
    req->peer = peer;
    req->n_prompt = (uint32_t)g->n_prompt_tokens;
    req->max_tokens = g->sampling->max_tokens;
    req->n_blocks = n_blocks;
    req->n_prompt_blocks = (uint32_t)epd_decode_div_up(req->n_prompt, kv->block_tokens);
    req->n_stop = n_stop;
    req->protocol_only = g->protocol_only;
    if (n_stop > 0) {
        memcpy(req->stop_ids, g->sampling->stop_token_ids, n_stop * sizeof(uint32_t));
    }
    req->fail_status = EPD_OK;
    req->t_recv_ns = t_recv;
    req->lease_ns = epd_time_now_ns() + (uint64_t)srv->lease_ms * EPD_NSEC_PER_MSEC;
    req->lease_cap_ns = req->lease_ns + 3 * (uint64_t)srv->lease_ms * EPD_NSEC_PER_MSEC;
    /* a budget beyond a day is as good as none (and must not overflow) */
    req->deadline_ns = g->deadline_ms > 0 && g->deadline_ms <= 86400000ULL
                           ? t_recv + g->deadline_ms * EPD_NSEC_PER_MSEC
                           : 0;
    epd_decode_seq_init(&req->seq);
    req->seq.req_id = req->id;
    req->seq.block_table = req->blocks;
    req->seq.n_blocks = n_blocks;
    req->seq.slot = req->slot == EPD_DECODE_NO_SLOT ? 0 : req->slot;
    req->seq.n_prompt = req->n_prompt;
    req->seq.max_tokens = req->max_tokens;
    req->seq.sp = *sp;
    req->seq.stop_ids = req->stop_ids;
    req->seq.n_stop = n_stop;
    req->ent.id = req->id;
    req->ent.sub = 0;
    epd_reqtab_insert(&srv->reqs, &req->ent);
    *req_p = req;
    return EPD_OK;
}

void epd__decode_req_refused(epd_decode_srv_t *srv, const Epd__Envelope *env, epd_status_t status,
                             const char *why)
{
    const Epd__GenerateRequest *g = env->generate;
    epd_msg_epoch_t p_epoch;
    epd_peer_t *peer = NULL;

    if (!epd_decode_check_prefill_named(g)) {
        return;
    }
    p_epoch = epd_msg_epoch_of(g->prefill_epoch);
    if (epd_peer_get(srv->d, EPD__ROLE__ROLE_PREFILL, g->prefill_worker_id, &p_epoch,
                     g->prefill_address.data, g->prefill_address.len, &peer) == EPD_OK) {
        (void)epd_link_send_refused(epd_peer_link(peer), g->request_id, status, why);
        epd_peer_unref(peer);
    }
}

void epd__decode_req_generate(epd_decode_srv_t *srv, epd_link_t *from, const Epd__Envelope *env,
                              const epd_sample_params_t *sp)
{
    const Epd__GenerateRequest *g = env->generate;
    epd_msg_epoch_t p_epoch = epd_msg_epoch_of(g->prefill_epoch);
    uint64_t t_recv = epd_time_now_ns();
    epd_decode_request_t *req = NULL;
    epd_peer_t *peer = NULL;
    const char *why = NULL;
    epd_status_t st;

    st = epd_peer_get(srv->d, EPD__ROLE__ROLE_PREFILL, g->prefill_worker_id, &p_epoch,
                      g->prefill_address.data, g->prefill_address.len, &peer);
    if (st != EPD_OK) {
        /* nobody to tell on the prefill side */
        epd_decode_refuse(
            srv, from, env, g->request_id,
            st == EPD_ERR_STALE_EPOCH || st == EPD_ERR_NO_MEMORY ? st : EPD_ERR_UNREACHABLE,
            st == EPD_ERR_STALE_EPOCH ? "request names an old incarnation of its prefill worker"
                                      : "cannot reach the prefill worker");
        return;
    }
    st = epd_decode_admit(srv, env, sp, from, peer, t_recv, &req, &why);
    if (st != EPD_OK) {
        epd_daemon_counts(srv->d)->refused++;
        epd_daemon_refuse_log(srv->d, g->request_id, "GenerateRequest from %s: %s (%s)",
                              env->sender->worker_id, why, epd_status_name(st));
        if (st == EPD_ERR_NO_CAPACITY) {
            (void)epd_link_send_refused(from, g->request_id, st, why);
        } else {
            (void)epd_link_send_error(from, g->request_id, st, why, NULL);
        }
        /* P got the same request and must not wait for a reservation */
        (void)epd_link_send_refused(epd_peer_link(peer), g->request_id, st, why);
        epd_peer_unref(peer);
        return;
    }
    if (epd_decode_send_reservation(srv, req) != EPD_OK) {
        req->resv_unsent = 1;
        epd_decode_fail(srv, req, EPD_ERR_UNREACHABLE, "cannot reach the prefill worker",
                        EPD_DECODE_TELL_CLIENT);
        epd_decode_advance(srv, req);
        return;
    }
    epd_trace_instant(srv->trace, "GenerateRequest received", "msg", req->id, -1, t_recv);
    epd_trace_span(srv->trace, "reserve", "wait", req->id, -1, t_recv, epd_time_now_ns());
    epd_trace_instant(srv->trace, "KvReservation sent", "msg", req->id, -1, epd_time_now_ns());
    epd_log_debug(EPD_DECODE_LOG, req->id, "reserved %u blocks (%u for the prompt), slot %d for %s",
                  req->n_blocks, req->n_prompt_blocks, (int)req->seq.slot, epd_peer_id(peer));
}

/* ------------------------------------------------------ from the prefill */

/*
 * The live request `id` whose prefill incarnation sent `env` and still
 * speaks about it (no PrefillComplete / WritesQuiesced yet), or NULL after
 * refusing the message: an unknown id (answered only when
 * `answer_unknown`), another sender, another incarnation.
 */
static epd_decode_request_t *epd_decode_of_p(epd_decode_srv_t *srv, epd_link_t *from,
                                             const Epd__Envelope *env, uint64_t id,
                                             int answer_unknown)
{
    epd_decode_request_t *req = epd_reqtab_find_req(&srv->reqs, id, 0);

    if (req == NULL || req->p_done) {
        if (answer_unknown) {
            epd_decode_refuse(srv, from, env, id, EPD_ERR_NOT_FOUND, "unknown request id");
        } else {
            epd_log_debug(EPD_DECODE_LOG, id, "%s from %s for a request no longer waiting for it",
                          epd_msg_body_name(env), env->sender->worker_id);
        }
        return NULL;
    }
    if (strcmp(epd_peer_id(req->peer), env->sender->worker_id) != 0) {
        epd_decode_refuse(srv, from, env, id, EPD_ERR_INVALID_PARAM,
                          "sender is not this request's prefill worker");
        return NULL;
    }
    if (!epd_peer_is_sender(req->peer, env)) {
        epd_decode_refuse(srv, from, env, id, EPD_ERR_STALE_EPOCH,
                          "message from another incarnation");
        return NULL;
    }
    return req;
}

void epd__decode_req_complete(epd_decode_srv_t *srv, epd_link_t *from, const Epd__Envelope *env,
                              epd_status_t bad, const char *bad_why)
{
    const Epd__PrefillComplete *pc = env->prefill_complete;
    epd_decode_request_t *req = epd_decode_of_p(srv, from, env, pc->request_id, 1);
    uint32_t n_layers = srv->info->kv.n_layers;
    uint64_t t_recv = epd_time_now_ns();
    const char *why = NULL;
    epd_status_t st = EPD_OK;

    if (req == NULL) {
        return;
    }
    epd_trace_instant(srv->trace, "PrefillComplete received", "msg", req->id, -1, t_recv);
    /* P's fence: every write of this request has landed, none will follow */
    req->p_done = 1;
    if (req->state != EPD_DECODE_REQ_RESERVED || req->fail_status != EPD_OK) {
        epd_log_debug(EPD_DECODE_LOG, req->id,
                      "prefill completed after the request ended: blocks released");
        epd_decode_advance(srv, req);
        return;
    }
    if (pc->n_prompt_tokens != req->n_prompt) {
        st = EPD_ERR_INVALID_PARAM;
        why = "PrefillComplete: prompt length differs from the request's";
    } else if (bad != EPD_OK) {
        st = bad;
        why = bad_why;
    } else if (req->protocol_only) {
        epd_decode_seen_trust(&req->kv, n_layers); /* nothing was written */
    } else {
        /* the layers not checked as they landed (all of them when P sends
         * no landed LayerDones): to the verifier */
        st = epd_decode_seen_completed(&req->kv, n_layers, pc->layer_checksums,
                                       pc->n_layer_checksums, (int)pc->checksum_kind, srv->newly,
                                       &why);
        for (uint32_t l = 0; st == EPD_OK && l < n_layers; l++) {
            if (srv->newly[l]) {
                epd_decode_check_lend(srv, req, l);
            }
        }
    }
    if (st != EPD_OK) {
        epd_decode_fail_kv(srv, req, from, env, st, why, 0);
        epd_decode_advance(srv, req);
        return;
    }
    req->seq.tokens[0] = (int32_t)pc->first_token;
    /* protocol only: never decode from blocks nothing was written into */
    req->first_finish = epd_decode_first_finish(pc->first_token, srv->info->eos_token,
                                                req->stop_ids, req->n_stop,
                                                req->protocol_only ? 1 : req->max_tokens);
    req->pc_seen = 1;
    req->kv_verified = req->kv.n_ok == n_layers; /* else when the last check is back */
    epd_decode_advance(srv, req); /* the lean path: first token and the batch, right here */
}

void epd__decode_req_layer_done(epd_decode_srv_t *srv, epd_link_t *from, const Epd__Envelope *env,
                                epd_status_t bad, const char *bad_why)
{
    const Epd__LayerDone *ld = env->layer_done;
    epd_decode_request_t *req = epd_decode_of_p(srv, from, env, ld->request_id, 0);
    const char *why = NULL;
    epd_status_t st;
    int check = 0;

    if (req == NULL || req->state != EPD_DECODE_REQ_RESERVED || req->fail_status != EPD_OK) {
        return;
    }
    req->lease_ns = epd_time_now_ns() + (uint64_t)srv->lease_ms * EPD_NSEC_PER_MSEC;
    if (!ld->landed) {
        return; /* a keep-alive */
    }
    if (bad != EPD_OK) {
        epd_decode_fail_kv(srv, req, from, env, bad, bad_why, ld->layer);
        epd_decode_advance(srv, req);
        return;
    }
    /* fenced behind the layer's writes: its bytes are final here */
    st = epd_decode_seen_landed(&req->kv, srv->info->kv.n_layers, ld->layer, ld->checksum,
                                (int)ld->checksum_kind, &check, &why);
    if (st != EPD_OK) {
        epd_decode_fail_kv(srv, req, from, env, st, why, ld->layer);
        epd_decode_advance(srv, req);
        return;
    }
    if (check && req->protocol_only) {
        (void)epd_decode_seen_result(&req->kv, ld->layer, EPD_OK, 0, NULL);
    } else if (check) {
        epd_decode_check_lend(srv, req, ld->layer);
    }
}

void epd__decode_req_quiesced(epd_decode_srv_t *srv, epd_link_t *from, const Epd__Envelope *env)
{
    epd_decode_request_t *req = epd_decode_of_p(srv, from, env, env->quiesced->request_id, 0);

    if (req == NULL) {
        return;
    }
    /* nothing of P is or will be in flight for it */
    req->p_done = 1;
    if (req->state == EPD_DECODE_REQ_RESERVED) {
        /* P gave up on its own */
        epd_decode_fail(srv, req, EPD_ERR_CANCELED, "prefill worker stopped the request",
                        EPD_DECODE_TELL_CLIENT);
    }
    epd_decode_advance(srv, req);
}

void epd__decode_req_failed_by(epd_decode_srv_t *srv, epd_link_t *from, const Epd__Envelope *env,
                               uint64_t id, int32_t status, const char *text)
{
    epd_decode_request_t *req = epd_decode_of_p(srv, from, env, id, 0);
    const char *culprit = env->sender->worker_id;
    char msg[256];

    if (req == NULL || req->state != EPD_DECODE_REQ_RESERVED || req->fail_status != EPD_OK) {
        return;
    }
    snprintf(msg, sizeof(msg), "prefill worker %s: %s", env->sender->worker_id,
             text != NULL && text[0] != '\0' ? text : epd_status_string((epd_status_t)status));
    if (status == EPD_ERR_CANCELED && env->body_case != EPD__ENVELOPE__BODY_REFUSED) {
        /* the client's Abort reached P first and P passed it on: end the
         * stream the way a direct Abort does */
        epd_log_debug(EPD_DECODE_LOG, id, "%s (%s)", msg, epd_msg_body_name(env));
        epd_decode_fail(srv, req, EPD_ERR_CANCELED, msg,
                        EPD_DECODE_END_CLIENT | EPD_DECODE_ABORT_P);
    } else {
        epd_log_warn(EPD_DECODE_LOG, id, "%s (%s)", msg, epd_msg_body_name(env));
        /* relayed: the failure is the prefill worker's, or the one it names
         * (e.g. its encoder) */
        epd_decode_fail(srv, req, status < 0 ? (epd_status_t)status : EPD_ERR_CANCELED, msg,
                        EPD_DECODE_TELL_CLIENT | EPD_DECODE_ABORT_P);
        if (env->body_case == EPD__ENVELOPE__BODY_ERROR && env->error->culprit != NULL &&
            env->error->culprit[0] != '\0') {
            culprit = env->error->culprit;
        }
        snprintf(req->culprit, sizeof(req->culprit), "%s", culprit);
    }
    /* its Abort makes P answer WritesQuiesced, which releases the blocks */
    req->p_status = EPD_ERR_CANCELED;
    snprintf(req->p_reason, sizeof(req->p_reason), "prefill failed");
    epd_decode_advance(srv, req);
}

/* ------------------------------------------------------- from the client */

void epd__decode_req_abort(epd_decode_srv_t *srv, epd_link_t *from, const Epd__Envelope *env)
{
    const Epd__Abort *a = env->abort;
    epd_decode_request_t *req = epd_reqtab_find_req(&srv->reqs, a->request_id, 0);
    const char *sid = env->sender->worker_id;

    if (req != NULL && !req->p_done && strcmp(epd_peer_id(req->peer), sid) == 0) {
        epd__decode_req_failed_by(srv, from, env, a->request_id, a->status, a->reason);
        return;
    }
    if (req == NULL || req->client_done) {
        epd_decode_refuse(srv, from, env, a->request_id, EPD_ERR_NOT_FOUND, "unknown request id");
        return;
    }
    if (req->client_hash != epd_hash64(sid, strlen(sid), 0)) {
        epd_decode_refuse(srv, from, env, a->request_id, EPD_ERR_NOT_FOUND,
                          "no such request of this client");
        return;
    }
    epd_log_debug(EPD_DECODE_LOG, req->id, "aborted by the client");
    epd_decode_fail(srv, req, EPD_ERR_CANCELED, "aborted by the client",
                    EPD_DECODE_END_CLIENT | EPD_DECODE_ABORT_P);
    epd_decode_advance(srv, req);
}

/* ------------------------------------------------------------ compute back */

void epd__decode_req_on_batch(epd_decode_srv_t *srv)
{
    epd_decode_seq_t *seq;
    int final;

    if (srv->batch == NULL) {
        return; /* stopping */
    }
    while ((seq = epd_decode_batch_poll(srv->batch, &final)) != NULL) {
        epd_decode_request_t *req =
            (epd_decode_request_t *)((char *)seq - offsetof(epd_decode_request_t, seq));
        uint32_t n = atomic_load_explicit(&seq->n_produced, memory_order_acquire);

        if (req->t_join_ns != 0 && n >= 2) {
            /* from joining the batch to the loop seeing its first decoded
             * token (batch wait + one step + the hand-back) */
            epd_trace_span(srv->trace, "first decode step", "compute", req->id, -1, req->t_join_ns,
                           epd_time_now_ns());
            req->t_join_ns = 0;
        }
        if (!final) {
            epd_decode_stream(req, n, EPD__FINISH_REASON__FINISH_NONE);
            continue;
        }
        req->compute_done = 1;
        epd_decode_advance(srv, req);
    }
    /* the compute thread took sequences off its queue: the waiting join */
    epd_reqtab_unblock_all(&srv->reqs);
    epd_decode_run_dirty(srv);
}

/* ----------------------------------------------------------- verifier back */

void epd__decode_req_on_verified(void *arg, epd_decode_vjob_t *job)
{
    epd_decode_srv_t *srv = arg;
    epd_decode_request_t *req = job->owner;
    const char *why = job->why;
    epd_status_t st;

    req->v_lent--;
    st = epd_decode_seen_result(&req->kv, job->layer, job->status, job->bytes, &why);
    if (req->state == EPD_DECODE_REQ_RESERVED && req->fail_status == EPD_OK && st != EPD_OK) {
        epd_log_error(EPD_DECODE_LOG, req->id,
                      "KV of layer %u from %s fails its check (%s): request failed, never generated",
                      job->layer, epd_peer_id(req->peer), why != NULL ? why : epd_status_string(st));
        epd_decode_fail(srv, req, st, why != NULL ? why : "KV verification failed",
                        EPD_DECODE_TELL_CLIENT | EPD_DECODE_ABORT_P);
    }
    /* PrefillComplete came and every layer checked out: the KV is held */
    req->kv_verified = req->pc_seen && req->kv.n_ok == srv->info->kv.n_layers;
    epd_decode_advance(srv, req);
}

/* --------------------------------------------------------- daemon upcalls */

void epd__decode_req_on_link_down(void *arg, epd_link_t *link, epd_status_t status)
{
    epd_decode_srv_t *srv = arg;
    epd_decode_request_t *req, *next;
    uint32_t n = 0;

    for (req = epd_reqtab_first_req(&srv->reqs); req != NULL; req = next) {
        next = epd_reqtab_next_req(&srv->reqs, req);
        if (req->client != link || req->client_done) {
            continue;
        }
        req->client_done = 1; /* nobody to answer */
        epd_decode_fail(srv, req, EPD_ERR_CANCELED, "client gone", EPD_DECODE_ABORT_P);
        epd_decode_advance(srv, req);
        n++;
    }
    if (n > 0) {
        epd_log_warn(EPD_DECODE_LOG, 0, "client endpoint failed (%s): aborted its %u requests",
                     epd_status_string(status), n);
    }
}

void epd__decode_req_on_peer_dead(void *arg, epd_peer_t *peer, epd_status_t status, const char *why)
{
    epd_decode_srv_t *srv = arg;
    uint32_t n = 0, adopted;
    char msg[256];

    (void)status;
    /* its writes travel on its own endpoints to us: every one of them
     * closes with it, before on_peer_closed releases anything */
    adopted = epd_peer_adopt_strays(peer);
    snprintf(msg, sizeof(msg), "prefill worker %.80s %.80s before completing the request",
             epd_peer_id(peer), why);
    for (epd_decode_request_t *req = epd_reqtab_first_req(&srv->reqs); req != NULL;
         req = epd_reqtab_next_req(&srv->reqs, req)) {
        if (req->peer == peer && !req->p_done && req->state == EPD_DECODE_REQ_RESERVED) {
            epd_decode_fail(srv, req, EPD_ERR_PEER_DEAD, msg, EPD_DECODE_TELL_CLIENT);
            n++;
        }
    }
    epd_log_warn(EPD_DECODE_LOG, 0,
                 "prefill worker %s %s: %u requests failed; their blocks wait until every "
                 "endpoint of it is closed (%u more adopted)",
                 epd_peer_id(peer), why, n, adopted);
}

void epd__decode_req_on_peer_closed(void *arg, epd_peer_t *peer)
{
    epd_decode_srv_t *srv = arg;
    epd_decode_request_t *req, *next;
    uint32_t n = 0;

    for (req = epd_reqtab_first_req(&srv->reqs); req != NULL; req = next) {
        next = epd_reqtab_next_req(&srv->reqs, req);
        if (req->peer != peer || req->p_done) {
            continue;
        }
        /* nothing of that incarnation can land any more */
        req->p_closed = 1;
        epd_decode_advance(srv, req);
        n++;
    }
    if (n > 0) {
        epd_log_info(EPD_DECODE_LOG, 0,
                     "prefill worker %s: its endpoints are closed; %u requests' blocks released",
                     epd_peer_id(peer), n);
    }
}

int epd__decode_req_on_pump(void *arg)
{
    epd_decode_run_dirty(arg);
    return 0;
}

void epd__decode_req_on_tick(void *arg, uint64_t now)
{
    epd_decode_srv_t *srv = arg;
    uint64_t lease = (uint64_t)srv->lease_ms * EPD_NSEC_PER_MSEC;
    epd_decode_request_t *req, *next;

    for (req = epd_reqtab_first_req(&srv->reqs); req != NULL; req = next) {
        int late = req->deadline_ns != 0 && now > req->deadline_ns && !req->client_done;
        /* a reservation's lease runs while P says nothing about it; a P
         * that is speaking about other requests is alive and works through
         * its queue, so it gets up to 4 leases */
        int expired = req->state == EPD_DECODE_REQ_RESERVED && now > req->lease_ns &&
                      (now > epd_peer_heard_ns(req->peer) + lease || now > req->lease_cap_ns);

        next = epd_reqtab_next_req(&srv->reqs, req);
        if (req->fail_status != EPD_OK && req->state != EPD_DECODE_REQ_QUARANTINED) {
            continue;
        }
        if (req->state == EPD_DECODE_REQ_RESERVED && (expired || late)) {
            const char *why = late ? "request deadline passed before prefill completed"
                                   : "prefill worker silent for the whole lease";

            epd_log_warn(EPD_DECODE_LOG, req->id, "%s: failing the request", why);
            epd_decode_fail(srv, req, EPD_ERR_TIMEOUT, why,
                            EPD_DECODE_TELL_CLIENT | EPD_DECODE_ABORT_P);
            epd_decode_advance(srv, req);
        } else if (req->state == EPD_DECODE_REQ_QUARANTINED && now - req->abort_sent_ns > lease &&
                   epd_peer_usable(req->peer)) {
            /* P has not confirmed yet: ask again (it answers WritesQuiesced
             * even for ids it forgot) */
            epd_decode_abort_p(req, EPD_ERR_CANCELED, "request ended on the decode worker");
        } else if (late &&
                   (req->state == EPD_DECODE_REQ_READY || req->state == EPD_DECODE_REQ_RUNNING)) {
            epd_log_warn(EPD_DECODE_LOG, req->id, "request deadline passed: stopping it");
            epd_decode_fail(srv, req, EPD_ERR_TIMEOUT, "request deadline passed",
                            EPD_DECODE_TELL_CLIENT);
            epd_decode_advance(srv, req);
        }
    }
    /* a safety net for the requests waiting to join the batch */
    epd_reqtab_unblock_all(&srv->reqs);
    epd_decode_run_dirty(srv);
}

void epd__decode_req_load(void *arg, epd_daemon_load_t *load_p)
{
    epd_decode_srv_t *srv = arg;

    load_p->queue_depth =
        srv->n_ready + (srv->batch != NULL ? epd_decode_batch_queued(srv->batch) : 0);
    load_p->kv_blocks_free = epd_decode_blocks_free(srv->blocks) + epd__decode_cache_evictable(srv);
    epd__decode_cache_stats(srv, &load_p->prefix);
    load_p->state_slots_free = epd_decode_blocks_slots_free(srv->blocks);
    load_p->running_requests = srv->batch != NULL ? epd_decode_batch_running(srv->batch) : 0;
    load_p->kv_bytes_received = srv->kv_bytes_received;
}

void epd__decode_req_on_stop(void *arg)
{
    epd_decode_srv_t *srv = arg;

    /* the daemon logged the counts; what only decode knows */
    epd_log_info(EPD_DECODE_LOG, 0, "%u requests live, %u blocks quarantined",
                 epd_reqtab_count(&srv->reqs),
                 epd_decode_blocks_count(srv->blocks, EPD_DECODE_BLK_QUARANTINED));
}

/* ------------------------------------------------------------------- life */

epd_status_t epd__decode_reqs_init(epd_decode_srv_t *srv)
{
    /* every live request holds at least one block */
    return epd_reqtab_init(&srv->reqs, srv->pool.n_blocks, offsetof(epd_decode_request_t, ent));
}

void epd__decode_reqs_cleanup(epd_decode_srv_t *srv)
{
    epd_decode_request_t *req;

    if (srv->reqs.table_ == NULL) {
        return;
    }
    while ((req = epd_reqtab_first_req(&srv->reqs)) != NULL) {
        epd_decode_destroy(srv, req);
    }
    epd_reqtab_cleanup(&srv->reqs);
}
