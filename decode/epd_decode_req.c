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
 *   PREEMPTED    KV on demand (rules 30-32): it gave its blocks back to an
 *                older request; its tokens so far went to the client; it
 *                waits, oldest first, until the pool holds prompt +
 *                generated + headroom again, then P prefills all of it once
 *                more (RESERVED, under a fresh prefill-side id) and the
 *                stream goes on where it stopped
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
 *
 * KV on demand: a RUNNING request's step grows its blocks as its tokens
 * come (epd_decode_kv.c); one whose next step finds no block is hungry and
 * marks victims, newest first, until the blocks on their way back cover
 * what the hungry lack; blocks coming free wake the hungry, then the
 * oldest PREEMPTED request (srv->freed, from the pump).
 */
#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_decode_int.h"
#include "epd_log.h"
#include "epd_time.h"

/* ------------------------------------------------------------ bookkeeping */

/* Marks a request for a step at the top of the loop. */
static void epd_decode_dirty(epd_decode_srv_t *srv, epd_decode_request_t *req)
{
    if (epd_reqtab_dirty(&srv->reqs, &req->ent)) {
        epd_daemon_kick(srv->d);
    }
}

/* A block transition of epd_decode_blocks.h (all but reserve). */
typedef epd_status_t (*epd_decode_blk_op_t)(epd_decode_blocks_t *blocks, uint64_t owner,
                                            const uint32_t *ids, uint32_t n, uint32_t slot);

/* Moves the blocks of `req` with its state (its own: a cached head is lent,
 * never owned): a refusal is a broken invariant of this file, never input
 * (the allocator changed nothing: a block stays unavailable, never free
 * too early). */
static void epd_decode_blocks_to(epd_decode_srv_t *srv, epd_decode_request_t *req,
                                 epd_decode_blk_op_t op, const char *name)
{
    epd_status_t st = op(srv->blocks, req->id, req->blocks + req->n_cached,
                         req->n_blocks - req->n_cached, req->slot);

    if (st != EPD_OK) {
        epd_log_error(EPD_DECODE_LOG, req->id, "block allocator refused %s: %s (a bug)", name,
                      epd_status_string(st));
    }
    assert(st == EPD_OK);
    if (op == epd_decode_blocks_retire || op == epd_decode_blocks_release ||
        op == epd_decode_blocks_unreserve) {
        /* they are free: whoever waits for blocks looks again (the pump) */
        srv->blocks_incoming -= req->incoming;
        req->incoming = 0;
        req->n_blocks = 0;
        req->slot = EPD_DECODE_NO_SLOT;
        srv->freed = 1;
        epd_daemon_kick(srv->d);
    }
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
    if (req->state == EPD_DECODE_REQ_DONE || (req->fail_status != EPD_OK && !req->resume_again)) {
        return;
    }
    /* a real end overrides a resume that was to be retried */
    req->resume_again = 0;
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
        srv->verify_failures++;
        epd_log_error(EPD_DECODE_LOG, req->id,
                      "KV of layer %u from %s does not match its checksum: request failed, never "
                      "generated",
                      bad_layer, env->sender->worker_id);
    } else {
        epd__decode_refuse(srv, from, env, req->id, st, why);
    }
    epd_decode_fail(srv, req, st, why, EPD_DECODE_TELL_CLIENT | EPD_DECODE_ABORT_P);
}

/* Lends layer `layer`'s check (marked CHECKING, its sum recorded) to the
 * verifier; a refusal is a broken sizing invariant: the request fails. */
static void epd_decode_check_lend(epd_decode_srv_t *srv, epd_decode_request_t *req, uint32_t layer)
{
    if (epd__decode_lend_layer(srv, req, layer) != EPD_OK) {
        epd_log_error(EPD_DECODE_LOG, req->id, "verifier queue full (sizing invariant broken)");
        (void)epd_decode_seen_result(&req->kv, layer, EPD_ERR_NO_RESOURCE, 0, NULL);
        epd_decode_fail(srv, req, EPD_ERR_NO_RESOURCE, "verifier queue full",
                        EPD_DECODE_TELL_CLIENT | EPD_DECODE_ABORT_P);
    }
}

/* ------------------------------------------------------------------- step */

/* RESERVED -> READY (or DONE when the first token ends it): the blocks are
 * P's no more; the first token goes out (a resume's: generated token
 * n_resume, where the stream stopped). */
static void epd_decode_activate(epd_decode_srv_t *srv, epd_decode_request_t *req)
{
    epd_decode_blocks_to(srv, req, epd_decode_blocks_activate, "activate");
    srv->kv_bytes_received += req->kv.bytes - epd__decode_cache_head_bytes(srv, req);
    /* the decode side holds all of the prompt's KV, verified: the end of the
     * transfer (epd-bench overhead measures up to here) */
    req->t_join_ns = epd_time_now_ns();
    epd_trace_instant(srv->trace, "KV held", "xfer", req->id, -1, req->t_join_ns);
    epd__decode_metrics_held(srv, req); /* rule 38: the first chunk's times */
    epd__decode_stream(req, req->n_resume + 1, (Epd__FinishReason)req->first_finish);
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
 * A RUNNING request's next step lacks blocks (rule 31): while the blocks
 * the hungry lack exceed the free ones and those already on their way
 * back, the newest request that grows gives its blocks back — possibly
 * the hungry one itself.  The victims' own steps do the rest.
 */
static void epd_decode_reclaim(epd_decode_srv_t *srv)
{
    uint64_t need = epd__decode_kv_short(srv);
    uint64_t have = (uint64_t)epd_decode_blocks_free(srv->blocks) + srv->blocks_incoming;
    epd_decode_request_t *v;

    while (need > have && (v = epd__decode_kv_victim(srv)) != NULL) {
        v->preempt = 1;
        if (v->hungry) {
            need -= v->short_by;
            epd__decode_kv_hungry(srv, v, 0);
        }
        v->incoming = v->n_blocks;
        srv->blocks_incoming += v->n_blocks;
        have += v->n_blocks;
        srv->preemptions++;
        epd_log_debug(EPD_DECODE_LOG, v->id,
                      "preempted after %u tokens: its %u blocks go to older requests",
                      atomic_load(&v->seq.n_produced), v->n_blocks);
        epd_decode_dirty(srv, v);
    }
}

/* -> PREEMPTED: the blocks are free, the request waits to be resumed. */
static void epd_decode_preempted(epd_decode_srv_t *srv, epd_decode_request_t *req)
{
    epd_decode_blocks_to(srv, req, epd_decode_blocks_retire, "retire");
    req->preempt = 0;
    req->abort_asked = 0;
    req->compute_done = 0;
    epd__decode_kv_queue(srv, req);
    req->state = EPD_DECODE_REQ_PREEMPTED;
}

/*
 * PREEMPTED -> RESERVED (rule 32): blocks for prompt + the tokens made so
 * far + headroom, a fresh prefill-side id, and P asked to prefill all of
 * it again (GenerateRequest, then the KvReservation).  EPD_OK;
 * EPD_ERR_NO_CAPACITY (not yet: nothing changed); another error with
 * *why_p (the request fails).
 */
static epd_status_t epd_decode_resume(epd_decode_srv_t *srv, epd_decode_request_t *req,
                                      const char **why_p)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    /* every token made so far went out to the client */
    uint32_t k = atomic_load_explicit(&req->seq.n_produced, memory_order_acquire);
    uint32_t n_blocks = epd__decode_kv_admit_blocks(srv, req->n_prompt + k, req->n_prompt,
                                                    req->max_tokens, 1);
    uint64_t now = epd_time_now_ns();
    epd_status_t st;

    if (!epd_peer_usable(req->peer)) {
        *why_p = "its prefill worker is gone: the preempted request cannot resume";
        return EPD_ERR_PEER_DEAD;
    }
    if (n_blocks > epd_decode_blocks_free(srv->blocks)) {
        return EPD_ERR_NO_CAPACITY;
    }
    st = epd_decode_blocks_reserve(srv->blocks, req->id, n_blocks, kv->n_linear_layers > 0,
                                   req->blocks, &req->slot);
    if (st != EPD_OK) {
        return st == EPD_ERR_NO_CAPACITY ? st : (*why_p = "reservation failed", st);
    }
    epd__decode_kv_new_pid(srv, req);
    req->n_blocks = n_blocks;
    req->n_resume = k;
    req->n_prompt_blocks = (uint32_t)epd_decode_div_up((uint64_t)req->n_prompt + k,
                                                       kv->block_tokens);
    req->p_done = req->p_closed = req->kv_verified = req->resv_unsent = 0;
    /* a fresh verification (no check is out: the request ran) */
    req->pc_seen = 0;
    req->kv.n_ok = 0;
    req->kv.n_checking = 0;
    req->kv.kind = -1;
    req->kv.bytes = 0;
    memset(req->kv.state, 0, kv->n_layers);
    epd__decode_lend_reset(srv, req);
    req->lease_ns = now + (uint64_t)srv->lease_ms * EPD_NSEC_PER_MSEC;
    req->lease_cap_ns = req->lease_ns + 3 * (uint64_t)srv->lease_ms * EPD_NSEC_PER_MSEC;
    epd_decode_seq_init(&req->seq, k + 1, n_blocks);
    req->seq.slot = req->slot == EPD_DECODE_NO_SLOT ? 0 : req->slot;
    srv->recomputed_tokens += (uint64_t)req->n_prompt + k;
    req->state = EPD_DECODE_REQ_RESERVED;
    if (epd__decode_send_resume(srv, req, now) != EPD_OK ||
        epd__decode_send_reservation(srv, req) != EPD_OK) {
        /* P holds no reservation of it: unreserved by the step */
        req->resv_unsent = 1;
        *why_p = "cannot reach its prefill worker to resume it";
        return EPD_ERR_UNREACHABLE;
    }
    epd_log_debug(EPD_DECODE_LOG, req->id,
                  "resumed after %u tokens: %u blocks, prefill-side id %llu on %s", k, n_blocks,
                  (unsigned long long)req->pid, epd_peer_id(req->peer));
    return EPD_OK;
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
                epd__decode_send_owed(req);
                epd_decode_blocks_to(srv, req, epd_decode_blocks_unreserve, "unreserve");
                req->state = EPD_DECODE_REQ_DONE;
            } else if (req->fail_status != EPD_OK || req->p_closed) {
                epd__decode_send_owed(req);
                epd_decode_blocks_to(srv, req, epd_decode_blocks_quarantine, "quarantine");
                req->client_done = req->client_done || !req->resume_again;
                req->abort_sent_ns = epd_time_now_ns(); /* the next Abort after a lease */
                req->state = EPD_DECODE_REQ_QUARANTINED;
            } else if (req->kv_verified) {
                epd_decode_activate(srv, req);
            }
            break;
        case EPD_DECODE_REQ_READY:
            if (req->fail_status != EPD_OK) {
                epd__decode_send_owed(req);
                epd_decode_blocks_to(srv, req, epd_decode_blocks_retire, "retire");
                srv->n_ready--;
                req->state = EPD_DECODE_REQ_DONE;
            } else if (req->preempt) {
                /* never ran: its first token (or the resumed one) is out */
                epd_reqtab_unlist(&srv->reqs, &req->ent);
                srv->n_ready--;
                epd_decode_preempted(srv, req);
            } else if (epd_decode_join(srv, req) != 0) {
                return; /* waits for room */
            }
            break;
        case EPD_DECODE_REQ_RUNNING:
            if (!req->abort_asked && (req->fail_status != EPD_OK || req->preempt)) {
                /* leaves at the next step boundary; its final entry frees it */
                if (req->fail_status != EPD_OK) {
                    epd__decode_send_owed(req);
                }
                epd_decode_seq_abort(&req->seq);
                if (srv->batch != NULL) {
                    epd_decode_batch_kick(srv->batch); /* it may sleep: all wait for blocks */
                }
                req->abort_asked = 1;
            }
            if (req->compute_done) {
                epd__decode_kv_hungry(srv, req, 0);
                if (req->preempt && req->fail_status == EPD_OK &&
                    atomic_load(&req->seq.finish) == EPD_DECODE_FINISH_ABORT) {
                    /* what it made so far is final: the client has it now */
                    epd__decode_stream(req, atomic_load(&req->seq.n_produced),
                                      EPD__FINISH_REASON__FINISH_NONE);
                    epd_decode_preempted(srv, req);
                    break;
                }
                epd__decode_finish_run(srv, req);
                epd__decode_cache_finished(srv, req);
                epd_decode_blocks_to(srv, req, epd_decode_blocks_retire, "retire");
                req->state = EPD_DECODE_REQ_DONE;
            } else if (req->grows && !req->preempt && req->fail_status == EPD_OK) {
                int short_now = epd__decode_kv_grow(srv, req) != 0;

                epd__decode_kv_hungry(srv, req, short_now);
                if (short_now) {
                    epd_decode_reclaim(srv);
                }
            }
            break;
        case EPD_DECODE_REQ_QUARANTINED:
            if (req->owe != 0) {
                epd__decode_send_owed(req); /* an end that came while a resume waited */
            }
            /* its prefill incarnation's word, or it retired and is fenced
             * (proto/README.md rule 29); a resume to retry waits for its
             * checks to come back: on_verified steps it */
            if ((req->p_done || (req->p_closed && epd_peer_fenced(req->peer))) &&
                !(req->resume_again && req->v_lent > 0)) {
                epd_decode_blocks_to(srv, req, epd_decode_blocks_release, "release");
                if (req->resume_again) {
                    /* its resume's prefill had no room: in line again */
                    req->resume_again = 0;
                    req->fail_status = EPD_OK;
                    req->owe = 0;
                    epd__decode_kv_queue(srv, req);
                    req->state = EPD_DECODE_REQ_PREEMPTED;
                    break;
                }
                req->state = EPD_DECODE_REQ_DONE;
            }
            break;
        case EPD_DECODE_REQ_PREEMPTED:
            if (req->fail_status == EPD_OK && srv->n_hungry == 0 && srv->pre_head == req) {
                const char *why = NULL;
                epd_status_t st = epd_decode_resume(srv, req, &why);

                if (st == EPD_OK || req->state == EPD_DECODE_REQ_RESERVED) {
                    epd__decode_kv_unqueue(srv, req);
                    if (srv->pre_head != NULL) {
                        epd_decode_dirty(srv, srv->pre_head); /* the next in line may fit too */
                    }
                }
                if (st != EPD_OK && st != EPD_ERR_NO_CAPACITY) {
                    epd_decode_fail(srv, req, st, why, EPD_DECODE_TELL_CLIENT);
                }
                if (req->state == EPD_DECODE_REQ_RESERVED) {
                    break;
                }
            }
            if (req->fail_status != EPD_OK) {
                /* nothing of it is anywhere: no blocks, no prefill at work */
                epd__decode_kv_unqueue(srv, req);
                epd__decode_send_owed(req);
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
    epd__decode_kv_hungry(srv, req, 0);
    epd__decode_kv_unqueue(srv, req);
    epd_reqtab_remove(&srv->reqs, &req->ent);
    epd__decode_cache_drop(srv, req);
    epd_reqtab_remove(&srv->by_pid, &req->pent);
    epd_link_unref(req->client);
    epd_peer_unref(req->peer);
    epd__decode_lend_reset(srv, req);
    epd_free(req);
}

/* Steps one request and frees it when it is done. */
static void epd_decode_advance(epd_decode_srv_t *srv, epd_decode_request_t *req)
{
    epd_decode_step(srv, req);
    if (req->state == EPD_DECODE_REQ_DONE && req->v_lent == 0) {
        /* (with checks still lent, their return frees it) */
        epd_decode_destroy(srv, req);
    }
}

/* The dirty requests, then — when blocks came free — those that wait for
 * them: the hungry (RUNNING), then the oldest PREEMPTED, which passes it on
 * to the next when it resumed.  Never nested inside a daemon upcall that
 * may run inside a message handler. */
static void epd_decode_run_dirty(epd_decode_srv_t *srv)
{
    epd_decode_request_t *req;

    for (;;) {
        while ((req = epd_reqtab_pop_dirty_req(&srv->reqs)) != NULL) {
            epd_decode_advance(srv, req);
        }
        if (!srv->freed) {
            return;
        }
        srv->freed = 0;
        for (req = epd_reqtab_first_req(&srv->reqs); req != NULL && srv->n_hungry > 0;
             req = epd_reqtab_next_req(&srv->reqs, req)) {
            if (req->hungry) {
                epd_decode_dirty(srv, req);
            }
        }
        if (srv->pre_head != NULL) {
            epd_decode_dirty(srv, srv->pre_head);
        }
    }
}

/* -------------------------------------------------------------- admission */

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
        epd__decode_refuse(
            srv, from, env, g->request_id,
            st == EPD_ERR_STALE_EPOCH || st == EPD_ERR_NO_MEMORY ? st : EPD_ERR_UNREACHABLE,
            st == EPD_ERR_STALE_EPOCH ? "request names an old incarnation of its prefill worker"
                                      : "cannot reach the prefill worker");
        return;
    }
    st = epd__decode_admit(srv, env, sp, from, peer, t_recv, &req, &why);
    if (st != EPD_OK) {
        epd_daemon_counts(srv->d)->refused++;
        epd_daemon_refuse_log(srv->d, g->request_id, "GenerateRequest from %s: %s (%s)",
                              env->sender->worker_id, why, epd_status_name(st));
        if (st == EPD_ERR_NO_CAPACITY) {
            (void)epd_link_send_refused(from, g->request_id, st, why);
        } else {
            (void)epd_link_send_error(from, g->request_id, st, why, NULL);
        }
        /* P got the same request and must not wait for a reservation (but
         * an id live here as another's is none of its business) */
        if (st != EPD_ERR_EXISTS) {
            (void)epd_link_send_refused(epd_peer_link(peer), g->request_id, st, why);
        }
        epd_peer_unref(peer);
        return;
    }
    if (epd__decode_send_reservation(srv, req) != EPD_OK) {
        req->resv_unsent = 1;
        epd_decode_fail(srv, req, EPD_ERR_UNREACHABLE, "cannot reach the prefill worker",
                        EPD_DECODE_TELL_CLIENT);
        epd_decode_advance(srv, req);
        return;
    }
    epd_trace_instant(srv->trace, "GenerateRequest received", "msg", req->id, -1, t_recv);
    epd_trace_span(srv->trace, "reserve", "wait", req->id, -1, t_recv, epd_time_now_ns());
    epd_trace_instant(srv->trace, "KvReservation sent", "msg", req->id, -1, epd_time_now_ns());
    epd_log_debug(EPD_DECODE_LOG, req->id,
                  "reserved %u blocks (%u for the prompt, %u at most), slot %d for %s",
                  req->n_blocks, req->n_prompt_blocks, req->max_blocks, (int)req->seq.slot,
                  epd_peer_id(peer));
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
    /* P knows a request by its prefill-side id (a resume's is fresh) */
    epd_decode_request_t *req = epd_reqtab_find_req(&srv->by_pid, id, 0);

    if (req == NULL || req->p_done) {
        if (answer_unknown) {
            epd__decode_refuse(srv, from, env, id, EPD_ERR_NOT_FOUND, "unknown request id");
        } else {
            epd_log_debug(EPD_DECODE_LOG, id, "%s from %s for a request no longer waiting for it",
                          epd_msg_body_name(env), env->sender->worker_id);
        }
        return NULL;
    }
    if (strcmp(epd_peer_id(req->peer), env->sender->worker_id) != 0) {
        epd__decode_refuse(srv, from, env, id, EPD_ERR_INVALID_PARAM,
                          "sender is not this request's prefill worker");
        return NULL;
    }
    if (!epd_peer_is_sender(req->peer, env)) {
        epd__decode_refuse(srv, from, env, id, EPD_ERR_STALE_EPOCH,
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
    if (pc->n_prompt_tokens != req->n_prompt + req->n_resume) {
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
    epd__decode_metrics_times_in(req, pc->times, t_recv); /* rule 38 */
    /* the next token of the stream: the first, or where a resume stopped */
    req->seq.tokens[req->n_resume] = (int32_t)pc->first_token;
    if (req->seq.lps != NULL && epd_token_logprob_read(pc->first_logprob, srv->info->vocab_size,
                                                       &req->seq.lps[req->n_resume]) != 0) {
        /* an older prefill, or a malformed one: the token stands, its
         * logprobs say nothing (NaN is no valid JSON number: 0 with no
         * alternatives is what the router then reports) */
        memset(&req->seq.lps[req->n_resume], 0, sizeof(req->seq.lps[0]));
    }
    /* protocol only: never decode from blocks nothing was written into */
    req->first_finish = epd_decode_first_finish(
        pc->first_token, req->seq.sp.ignore_eos ? NULL : srv->info, req->stop_ids, req->n_stop,
        req->protocol_only ? 1 : req->max_tokens - req->n_resume);
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
    if (ld->blocks > 0) {
        /* a chunked prefill's blocks [0, blocks) of the layer landed */
        st = epd__decode_lend_range_landed(srv, req, ld, &why);
        if (st != EPD_OK) {
            epd_decode_fail_kv(srv, req, from, env, st, why, ld->layer);
            epd_decode_advance(srv, req);
        }
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
    if (req->n_resume > 0 && status == EPD_ERR_NO_CAPACITY) {
        /* a resume its prefill worker had no room for: not the client's
         * failure — in line again once nothing of P can land */
        epd_log_debug(EPD_DECODE_LOG, req->id, "%s: the resume waits again", msg);
        epd_decode_fail(srv, req, EPD_ERR_NO_CAPACITY, msg, EPD_DECODE_ABORT_P);
        req->resume_again = 1;
    } else if (status == EPD_ERR_CANCELED && env->body_case != EPD__ENVELOPE__BODY_REFUSED) {
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
    epd_decode_request_t *req = epd_reqtab_find_req(&srv->by_pid, a->request_id, 0);
    const char *sid = env->sender->worker_id;

    if (req != NULL && !req->p_done && strcmp(epd_peer_id(req->peer), sid) == 0) {
        epd__decode_req_failed_by(srv, from, env, a->request_id, a->status, a->reason);
        return;
    }
    req = epd_reqtab_find_req(&srv->reqs, a->request_id, 0); /* the client's id */
    if (req == NULL || req->client_done) {
        epd__decode_refuse(srv, from, env, a->request_id, EPD_ERR_NOT_FOUND, "unknown request id");
        return;
    }
    if (req->client_hash != epd_hash64(sid, strlen(sid), 0)) {
        epd__decode_refuse(srv, from, env, a->request_id, EPD_ERR_NOT_FOUND,
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

        if (req->t_join_ns != 0 && n >= req->n_resume + 2) {
            /* from joining the batch to the loop seeing its first decoded
             * token (batch wait + one step + the hand-back) */
            epd_trace_span(srv->trace, "first decode step", "compute", req->id, -1, req->t_join_ns,
                           epd_time_now_ns());
            req->t_join_ns = 0;
        }
        if (!final) {
            epd__decode_stream(req, n, EPD__FINISH_REASON__FINISH_NONE);
            if (req->grows) {
                epd_decode_advance(srv, req); /* its blocks keep ahead of its tokens */
            }
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
    st = job->range ? epd__decode_lend_range_back(srv, req, job, &why)
                    : epd_decode_seen_result(&req->kv, job->layer, job->status, job->bytes, &why);
    if (req->state == EPD_DECODE_REQ_RESERVED && req->fail_status == EPD_OK && st != EPD_OK) {
        srv->verify_failures++;
        epd_log_error(EPD_DECODE_LOG, req->id,
                      "KV of layer %u from %s fails its check (%s): request failed, never "
                      "generated%s",
                      job->layer, epd_peer_id(req->peer), why != NULL ? why : epd_status_string(st),
                      job->range ? " (a chunk check: the blocks landed so far)" : "");
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
        } else if (req->peer == peer && req->state == EPD_DECODE_REQ_PREEMPTED) {
            /* nobody left to prefill it again */
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
        /* nothing of it travels on an endpoint any more; its one-sided
         * writes are the fence's (epd_peer_fenced) */
        req->p_closed = 1;
        epd_decode_advance(srv, req);
        n++;
    }
    if (n > 0) {
        epd__decode_fence_closed(srv, peer, n);
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
        } else if (req->state == EPD_DECODE_REQ_QUARANTINED && req->p_closed) {
            /* its writer retired: fenced by now, or asked to confirm */
            epd__decode_fence_ask(srv, req, now);
            epd_decode_advance(srv, req);
        } else if (req->state == EPD_DECODE_REQ_QUARANTINED && now - req->abort_sent_ns > lease &&
                   epd_peer_usable(req->peer)) {
            /* P has not confirmed yet: ask again (it answers WritesQuiesced
             * even for ids it forgot) */
            epd__decode_abort_p(req, EPD_ERR_CANCELED, "request ended on the decode worker");
        } else if (late &&
                   (req->state == EPD_DECODE_REQ_READY || req->state == EPD_DECODE_REQ_RUNNING ||
                    req->state == EPD_DECODE_REQ_PREEMPTED)) {
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

/* ------------------------------------------------------------------- life */

epd_status_t epd__decode_reqs_init(epd_decode_srv_t *srv)
{
    /* about one live request per block (preempted ones hold none, but
     * wait only while others hold theirs) */
    epd_status_t st =
        epd_reqtab_init(&srv->reqs, srv->pool.n_blocks, offsetof(epd_decode_request_t, ent));

    if (st != EPD_OK) {
        return st;
    }
    return epd_reqtab_init(&srv->by_pid, srv->pool.n_blocks, offsetof(epd_decode_request_t, pent));
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
    epd_reqtab_cleanup(&srv->by_pid);
}
