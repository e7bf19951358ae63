/*
 * epd_prefill_req.c — prefill's request layer: one request's life, and a
 * request id as a whole, on the loop thread (prefill/README.md tells the
 * story; proto/README.md is the protocol).
 *
 *   MEDIA      admitted (local blocks and a state slot): its images are
 *              placed — cached ones pinned, reservations sent to encoders,
 *              our own encodes queued — or it waits, holding no slot, until
 *              slots come free
 *   COMPUTING  the run is lent to the compute thread (queued at admission
 *              for a text prompt); each finished layer is written as soon
 *              as the reservation is there
 *   COMPUTED   the run is back: the rest of the writes, then PrefillComplete
 *              fenced behind them (prefill only: the first token to the
 *              client, nothing written)
 *   LANDING    every write posted: waiting for the last completion
 *   FAILED     failure, abort, lease or peer death: the cancel flag stops the
 *              engine at its next layer boundary, posting stops; it waits
 *              until compute and the transport gave everything back and what
 *              it owes (EPD_PREFILL_TELL_*, WritesQuiesced once no write is
 *              in flight) went out
 *   RELEASING  the release job (epd_engine_release) is on the compute thread
 *   DONE       local blocks and slot free, the request freed
 *
 * Every transition is made by epd_prefill_req_step (one switch) from the
 * facts events record: compute events (epd__prefill_req_on_event), write
 * completions (srv->on_written, registered here), messages, the daemon's
 * peer upcalls and the tick.  The local blocks are lent to the transport
 * until the last write completion and to the compute thread until RELEASED.
 *
 * A request that ends leaves a tombstone of its kind (aborted or failed)
 * and a decode message that overtook its request is kept: see
 * epd_prefill_ids.c for how late and early messages are answered.
 * Messages never wait (the links queue them in order); a write refused for
 * room parks the request on the blocked list with its cursor, retried after
 * the next write completion and on the tick.
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_prefill_int.h"
#include "epd_time.h"

static void epd_prefill_advance(epd_prefill_srv_t *srv, epd_prefill_req_t *req);

/* ------------------------------------------------------------ bookkeeping */

/* Marks a request for a step at the top of the loop. */
static void epd_prefill_dirty(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    if (epd_reqtab_dirty(&srv->reqs, &req->ent)) {
        epd_daemon_kick(srv->d);
    }
}

static void epd_prefill_unblock_all(epd_prefill_srv_t *srv)
{
    if (epd_reqtab_unblock_all(&srv->reqs)) {
        epd_daemon_kick(srv->d);
    }
}

/* May its run start: not held for its reservation (rule 34), or that came. */
static int epd_prefill_may_run(const epd_prefill_req_t *req)
{
    return !req->hold || req->xfer.have_resv;
}

/* Is `env`'s sender the decode incarnation `req` is bound to? */
static int epd_prefill_from_decode(const epd_prefill_req_t *req, const Epd__Envelope *env)
{
    return req->peer != NULL && epd_peer_is_sender(req->peer, env);
}

/* ---------------------------------------------------------------- failure */

/*
 * Fails (or aborts) a request: the first call wins the status, message and
 * culprit (the worker that caused it, named in the client's Error) and what
 * it owes (`tell`: EPD_PREFILL_TELL_*); later calls only add QUIESCE.  The
 * engine stops at its next layer boundary, nothing more is posted, what its
 * images' encoders may still write is quarantined; the step does the rest.
 * Nested-safe: frees nothing.
 */
static void epd_prefill_fail(epd_prefill_srv_t *srv, epd_prefill_req_t *req, epd_status_t status,
                             const char *msg, unsigned tell, const char *culprit)
{
    if (req->state >= EPD_PREFILL_REQ_RELEASING) {
        return; /* nothing of it is in flight any more: its outcome is sealed */
    }
    if (req->fail_status == EPD_OK) {
        req->fail_status = status != EPD_OK ? status : EPD_ERR_FATAL;
        snprintf(req->fail_msg, sizeof(req->fail_msg), "%s", msg);
        snprintf(req->fail_culprit, sizeof(req->fail_culprit), "%s",
                 culprit != NULL ? culprit : "");
        atomic_store_explicit(&req->cancel, 1, memory_order_release);
        req->owe |= tell & (EPD_PREFILL_TELL_CLIENT | EPD_PREFILL_TELL_DECODE);
        epd_daemon_counts(srv->d)->failed++;
        /* a late GenerateRequest or reservation of the id never starts
         * writing again; it learns how the id ended */
        epd__prefill_ids_end(srv, req->id,
                             (tell & EPD_PREFILL_ABORTED) != 0 ? EPD_PREFILL_TOMB_ABORTED
                                                               : EPD_PREFILL_TOMB_FAILED);
        if ((tell & EPD_PREFILL_ABORTED) != 0) {
            epd_log_debug(EPD_PREFILL_LOG, req->id, "aborted: %s", msg);
        } else {
            epd_log_warn(EPD_PREFILL_LOG, req->id, "failed: %s (%s)", msg,
                         epd_status_name(req->fail_status));
        }
    }
    req->owe |= tell & EPD_PREFILL_QUIESCE;
    epd__prefill_media_unwait(srv, &req->wait);
    for (uint32_t i = 0; i < req->n_media; i++) {
        epd__prefill_media_give_back(srv, &req->media[i], req->id, req->fail_msg, 0);
    }
    epd_prefill_dirty(srv, req);
}

/* ------------------------------------------------------------------- step */

/* Sends what a failed request still owes (the links queue, never drop). */
static void epd_prefill_send_owed(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    if ((req->owe & EPD_PREFILL_TELL_CLIENT) != 0) {
        (void)epd_link_send_error(req->client, req->id, req->fail_status, req->fail_msg,
                                  req->fail_culprit);
        req->owe &= ~EPD_PREFILL_TELL_CLIENT;
    }
    req->owe = epd__prefill_xfer_owed(srv, &req->xfer, req->owe, req->fail_status,
                                      req->fail_msg);
}

/* Posts what may go; returns -1 when parked on backpressure. */
static int epd_prefill_post(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    char msg[200];
    epd_status_t st;

    st = epd__prefill_xfer_post(srv, &req->xfer, req->layers_done, req->compute_done, msg,
                                sizeof(msg));
    if (st == EPD_OK && req->xfer.more && !req->more_listed) {
        /* a burst went out: the loop's events first, the rest at the next
         * pump (epd__prefill_req_on_pump) */
        req->more_listed = 1;
        srv->n_more++;
    }
    if (st == EPD_ERR_NO_RESOURCE) {
        epd_reqtab_block(&srv->reqs, &req->ent);
        return -1;
    }
    if (st != EPD_OK) {
        epd_prefill_fail(srv, req, st, msg, EPD_PREFILL_TELL_ALL, NULL);
    }
    return 0;
}

/* The run of a request whose images are all READY (or that has none). */
static epd_status_t epd_prefill_submit_run(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    epd__prefill_media_spans(srv, req->media, req->n_media, req->spans);
    req->run_job.embeds = req->n_media > 0 ? req->spans : NULL;
    req->run_job.n_embeds = req->n_media;
    if (req->n_media > 0 && req->t_media_ns == 0) {
        /* before the compute thread can start it (rule 38: encode ends here) */
        req->t_media_ns = epd_time_now_ns();
    }
    if (epd_prefill_compute_submit(srv->compute, &req->run_job) != EPD_OK) {
        return EPD_ERR_NO_CAPACITY;
    }
    req->run_submitted = 1;
    return EPD_OK;
}

static void epd_prefill_send_complete(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    Epd__PhaseTimes times = EPD__PHASE_TIMES__INIT;
    char msg[200];
    epd_status_t st;

    epd__prefill_metrics_phases(srv, req, epd_time_now_ns(), &times);
    st = epd__prefill_xfer_complete(srv, &req->xfer, req->first_token, req->n_tokens, &times,
                                    req->run_job.sample.logprobs > 0 ? &req->first_logprob : NULL);
    if (st != EPD_OK) {
        snprintf(msg, sizeof(msg), "sending PrefillComplete to decode '%.80s': %s",
                 epd_peer_id(req->peer), epd_status_string(st));
        epd_prefill_fail(srv, req, epd__prefill_xfer_peer_status(st), msg, EPD_PREFILL_TELL_CLIENT,
                         NULL);
        return;
    }
    req->complete_sent = 1;
    req->t_complete_ns = epd_time_now_ns();
    epd_daemon_counts(srv->d)->served++;
    epd_trace_instant(srv->trace, "PrefillComplete sent", "msg", req->id, -1, req->t_complete_ns);
}

/*
 * Moves a request as far as its facts allow: the only place its state
 * changes.  Returns -1 when a write waits for transport room (the request
 * is on the blocked list), 0 otherwise.
 */
static int epd_prefill_req_step(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    for (;;) {
        epd_prefill_req_state_t from = req->state;

        if (req->fail_status != EPD_OK && from < EPD_PREFILL_REQ_FAILED) {
            req->state = EPD_PREFILL_REQ_FAILED;
        }
        switch (req->state) {
        case EPD_PREFILL_REQ_MEDIA:
            if (!req->wait.waiting && req->media_pending == 0 && epd_prefill_may_run(req)) {
                if (epd_prefill_submit_run(srv, req) == EPD_OK) {
                    req->state = EPD_PREFILL_REQ_COMPUTING;
                    epd_trace_span(srv->trace, "encode (images)", "wait", req->id, -1,
                                   req->t_admit_ns, req->t_media_ns);
                    epd_trace_instant(srv->trace, "images ready", "wait", req->id, -1,
                                      req->t_media_ns);
                } else {
                    epd_prefill_fail(srv, req, EPD_ERR_NO_CAPACITY, "compute queue full",
                                     EPD_PREFILL_TELL_ALL, NULL);
                }
            }
            break;
        case EPD_PREFILL_REQ_COMPUTING:
            if (!req->run_submitted) {
                /* held for its reservation (rule 34) */
                if (!epd_prefill_may_run(req)) {
                    break;
                }
                if (epd_prefill_submit_run(srv, req) != EPD_OK) {
                    epd_prefill_fail(srv, req, EPD_ERR_NO_CAPACITY, "compute queue full",
                                     EPD_PREFILL_TELL_ALL, NULL);
                    break;
                }
            }
            if (epd_prefill_post(srv, req) != 0) {
                return -1;
            }
            if (req->compute_done && req->fail_status == EPD_OK) {
                req->state = EPD_PREFILL_REQ_COMPUTED;
            }
            break;
        case EPD_PREFILL_REQ_COMPUTED:
            if (req->prefill_only) {
                /* nothing was written anywhere; a client that is gone
                 * loses its answer */
                Epd__PhaseTimes times = EPD__PHASE_TIMES__INIT;

                epd__prefill_metrics_phases(srv, req, epd_time_now_ns(), &times);
                epd__prefill_xfer_first_token(srv, req->client, req->id, req->first_token);
                req->complete_sent = 1;
                req->t_complete_ns = epd_time_now_ns();
                epd_daemon_counts(srv->d)->served++;
            } else {
                if (epd_prefill_post(srv, req) != 0) {
                    return -1;
                }
                if (req->fail_status == EPD_OK && req->xfer.have_resv &&
                    req->xfer.post_layer == srv->info->kv.n_layers) {
                    epd_prefill_send_complete(srv, req);
                }
            }
            if (req->complete_sent) {
                req->state = EPD_PREFILL_REQ_LANDING;
            }
            break;
        case EPD_PREFILL_REQ_LANDING:
            epd__prefill_metrics_landed(srv, req);
            if (req->xfer.writes_inflight == 0 &&
                epd_prefill_compute_submit(srv->compute, &req->release_job) == EPD_OK) {
                req->state = EPD_PREFILL_REQ_RELEASING;
            }
            break;
        case EPD_PREFILL_REQ_FAILED:
            epd_prefill_send_owed(srv, req);
            /* compute holds nothing of it: its run came back, or it never
             * ran and no image of it is being encoded */
            if ((req->run_submitted ? req->compute_done : req->encodes_inflight == 0) &&
                req->xfer.writes_inflight == 0 && req->owe == 0 &&
                epd_prefill_compute_submit(srv->compute, &req->release_job) == EPD_OK) {
                req->state = EPD_PREFILL_REQ_RELEASING;
            }
            break;
        case EPD_PREFILL_REQ_RELEASING:
            if (req->released) {
                req->state = EPD_PREFILL_REQ_DONE;
            }
            break;
        case EPD_PREFILL_REQ_DONE:
            break;
        }
        if (req->state == from && (req->fail_status == EPD_OK || from >= EPD_PREFILL_REQ_FAILED)) {
            return 0; /* nothing more to do until the next event */
        }
    }
}

/* ---------------------------------------------------------------- freeing */

/* A DONE request: out of every list, its images' slots unpinned, its pool
 * share back, freed.  Pump only. */
static void epd_prefill_req_destroy(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    if (req->complete_sent && req->peer != NULL && epd_log_enabled(EPD_LOG_DEBUG)) {
        uint64_t now = epd_time_now_ns();

        /* queued: admission to the start of the run; compute: the run,
         * sampling included; completion after compute: what of the posting
         * was not hidden behind compute; released after compute: until the
         * last write landed and the compute thread released the request */
        epd_log_debug(EPD_PREFILL_LOG, req->id,
                      "done: %u tokens, first token %d, %llu writes to '%.80s'; queued %.3f ms, "
                      "compute %.3f ms, reservation %+.3f ms after admission, completion %.3f ms "
                      "after compute, released %.3f ms after compute",
                      req->n_tokens, req->first_token, (unsigned long long)req->xfer.writes_posted,
                      epd_peer_id(req->peer), (double)(req->t_start_ns - req->t_admit_ns) / 1e6,
                      (double)(req->compute_done_ns - req->t_start_ns) / 1e6,
                      ((double)req->t_resv_ns - (double)req->t_admit_ns) / 1e6,
                      ((double)req->t_complete_ns - (double)req->compute_done_ns) / 1e6,
                      (double)(now - req->compute_done_ns) / 1e6);
    }
    if (!req->complete_sent && req->layers_done > 0) {
        /* compute nobody took (rule 34 keeps this low under pressure) */
        srv->wasted_prefill_tokens +=
            (uint64_t)req->n_tokens * req->layers_done / srv->info->kv.n_layers;
    }
    if (req->more_listed) {
        srv->n_more--;
    }
    epd_reqtab_remove(&srv->reqs, &req->ent);
    epd__prefill_media_unwait(srv, &req->wait);
    for (uint32_t i = 0; i < req->n_media; i++) {
        epd__prefill_media_give_back(srv, &req->media[i], req->id, req->fail_msg, 1);
    }
    epd__prefill_pool_free(srv, req);
}

/* Steps a request and frees it once it is done. */
static void epd_prefill_advance(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    if (epd_daemon_stopping(srv->d)) {
        return; /* only facts from now on: everything is freed after serve */
    }
    if (epd_prefill_req_step(srv, req) == 0 && req->state == EPD_PREFILL_REQ_DONE) {
        epd_prefill_req_destroy(srv, req);
    }
}

/* -------------------------------------------------------------- admission */

/* Places every image of req (the slots are there); may fail it. */
static void epd_prefill_place(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    const char *culprit = NULL;
    uint32_t pending, encodes;
    char msg[200];
    epd_status_t st;

    st = epd__prefill_media_place(srv, req->media, req->n_media, req->id, req, &req->fail_status,
                                  &pending, &encodes, msg, sizeof(msg), &culprit);
    /* the run goes as soon as the last image is READY: at once when all of
     * them were cached */
    req->media_pending = pending;
    req->encodes_inflight += encodes;
    if (st != EPD_OK) {
        epd_prefill_fail(srv, req, st, msg, EPD_PREFILL_TELL_ALL, culprit);
    }
}

/* The images of an admitted request (rule 15): their sources copied, then
 * placed now, or the request waits for slots. */
static void epd_prefill_media_start(epd_prefill_srv_t *srv, epd_prefill_req_t *req,
                                    const Epd__GenerateRequest *g)
{
    char msg[200];
    epd_status_t st;

    for (uint32_t i = 0; i < req->n_media; i++) {
        st = epd__prefill_media_copy(srv, &req->media[i], i, g->media[i], msg, sizeof(msg));
        if (st != EPD_OK) {
            epd_prefill_fail(srv, req, st, msg, EPD_PREFILL_TELL_ALL, NULL);
            return;
        }
    }
    if (epd__prefill_media_fits(srv, req->media, req->n_media)) {
        epd_prefill_place(srv, req);
        epd_prefill_advance(srv, req);
        return;
    }
    req->wait.media = req->media;
    req->wait.n = req->n_media;
    req->wait.id = req->id;
    epd__prefill_media_wait(srv, &req->wait);
}

/* ------------------------------------------------------------ reservation */

/* A KvReservation or KvRefused from `from` for a live request. */
static void epd_prefill_reservation_for(epd_prefill_srv_t *srv, epd_prefill_req_t *req,
                                        epd_link_t *from, const Epd__Envelope *env)
{
    char msg[200];
    epd_status_t st;

    if (!epd_prefill_from_decode(req, env)) {
        epd_link_refuse(from, req->id, EPD_ERR_INVALID_PARAM,
                        "sender is not the decode worker of this request");
        return;
    }
    if (env->body_case == EPD__ENVELOPE__BODY_REFUSED) {
        const Epd__KvRefused *rf = env->refused;

        snprintf(msg, sizeof(msg), "decode '%.80s' refused the KV reservation: %.100s",
                 epd_peer_id(req->peer), rf->reason != NULL ? rf->reason : "");
        /* its pool is under pressure: later runs wait for their
         * reservations for a while (rule 34) */
        srv->pressure_until_ns = epd_time_now_ns() + (uint64_t)srv->lease_ms * EPD_NSEC_PER_MSEC;
        epd_prefill_fail(srv, req, rf->status < 0 ? (epd_status_t)rf->status : EPD_ERR_NO_CAPACITY,
                         msg, EPD_PREFILL_TELL_CLIENT, NULL);
        return;
    }
    if (req->fail_status != EPD_OK) {
        /* its WritesQuiesced is on its way behind it — or already went out,
         * maybe before decode knew the request: answered again here */
        if ((req->owe & EPD_PREFILL_QUIESCE) == 0) {
            epd__prefill_ids_answer(srv, from, env, epd__prefill_ids_ended(srv, req->id));
        }
        return;
    }
    if (req->xfer.have_resv) {
        epd_link_refuse(from, req->id, EPD_ERR_EXISTS, "a second reservation");
        return;
    }
    st = epd__prefill_xfer_take(srv, &req->xfer, env->reservation, msg, sizeof(msg));
    if (st != EPD_OK) {
        epd_prefill_fail(srv, req, st, msg, EPD_PREFILL_TELL_ALL, NULL);
        return;
    }
    req->t_resv_ns = epd_time_now_ns();
    epd_trace_instant(srv->trace, "KvReservation received", "msg", req->id, -1, req->t_resv_ns);
    if (req->layers_done > 0) {
        /* finished layers waited for somewhere to write them */
        epd_trace_span(srv->trace, "reservation wait", "wait", req->id, -1, req->t_first_layer_ns,
                       req->t_resv_ns);
    }
    epd_log_debug(EPD_PREFILL_LOG, req->id, "reservation: %u blocks, slot %u, after %u layers",
                  req->n_blocks, env->reservation->state_slot, req->layers_done);
    if (!epd_reqtab_is_blocked(&req->ent)) {
        epd_prefill_advance(srv, req); /* the lean path: post what is ready right here */
    }
}

/* ------------------------------------------------------ from the messages */

void epd__prefill_req_refused(epd_prefill_srv_t *srv, uint64_t id, epd_status_t status,
                              const char *msg)
{
    epd_daemon_counts(srv->d)->refused++;
    epd__prefill_ids_refused(srv, id, status, msg);
}

void epd__prefill_req_generate(epd_prefill_srv_t *srv, epd_link_t *from, const Epd__Envelope *env,
                               const epd_sample_params_t *sp)
{
    const Epd__GenerateRequest *g = env->generate;
    uint64_t id = g->request_id;
    int only = g->prefill_only != 0;
    uint64_t t_recv = epd_time_now_ns();
    epd_peer_t *peer = NULL;
    epd_prefill_req_t *req = NULL;
    Epd__Envelope *senv;
    epd_link_t *sl;
    char msg[200];
    epd_status_t st = EPD_OK;

    epd_daemon_counts(srv->d)->received++;
    if (epd_reqtab_find_req(&srv->reqs, id, 0) != NULL) {
        st = EPD_ERR_EXISTS;
        snprintf(msg, sizeof(msg), "request id %llu is already live", (unsigned long long)id);
    } else if (epd__prefill_ids_ended(srv, id) != 0) {
        st = EPD_ERR_CANCELED;
        snprintf(msg, sizeof(msg), "request id %llu was aborted or failed here",
                 (unsigned long long)id);
    } else if (!only) {
        epd_msg_epoch_t d_epoch = epd_msg_epoch_of(g->decode_epoch);

        st = epd_peer_get(srv->d, EPD__ROLE__ROLE_DECODE, g->decode_worker_id, &d_epoch,
                          g->decode_address.data, g->decode_address.len, &peer);
        if (st != EPD_OK) {
            snprintf(msg, sizeof(msg), "decode worker '%.60s': %s", g->decode_worker_id,
                     st == EPD_ERR_STALE_EPOCH ? "a newer epoch of it is known"
                                               : epd_status_string(st));
        }
    }
    if (st == EPD_OK) {
        st = epd__prefill_pool_admit(srv, g, sp, peer, &req);
        if (st == EPD_OK) {
            req->run_job.from_router = epd_daemon_sent_by_router(srv->d, env);
            /* under pressure a run waits for its reservation (rule 34): a
             * refusal then costs no compute at all */
            req->hold = !only && srv->hold_under_pressure && t_recv < srv->pressure_until_ns;
            srv->runs_held += req->hold != 0;
        }
        if (st == EPD_OK && req->n_media == 0 && !req->hold &&
            epd_prefill_submit_run(srv, req) != EPD_OK) {
            req->peer = NULL; /* the reference goes back to this function */
            epd__prefill_pool_free(srv, req);
            st = EPD_ERR_NO_CAPACITY;
        }
        if (st == EPD_ERR_NO_CAPACITY) {
            snprintf(msg, sizeof(msg),
                     "no local capacity for %zu tokens (%u blocks, %u slots free)",
                     g->n_prompt_tokens, srv->n_free_blocks, srv->n_free_slots);
        } else if (st != EPD_OK) {
            snprintf(msg, sizeof(msg), "cannot admit the request: %s", epd_status_string(st));
        }
        if (st != EPD_OK) {
            epd_peer_unref(peer);
        }
    }
    if (st != EPD_OK) {
        epd_link_refuse(from, id, st, msg);
        epd__prefill_req_refused(srv, id, st, msg);
        return;
    }
    /* a text prompt's run is queued already */
    req->state = req->n_media > 0 ? EPD_PREFILL_REQ_MEDIA : EPD_PREFILL_REQ_COMPUTING;
    req->client = from;
    epd_link_ref(from);
    snprintf(req->client_id, sizeof(req->client_id), "%s", env->sender->worker_id);
    req->ent.id = id;
    req->ent.sub = 0;
    epd_reqtab_insert(&srv->reqs, &req->ent);
    epd_trace_instant(srv->trace,
                      only ? "GenerateRequest received (prefill only)" : "GenerateRequest received",
                      "msg", id, -1, t_recv);
    epd_log_debug(EPD_PREFILL_LOG, id, "admitted: %u tokens, %u blocks, slot %u, decode '%s'",
                  req->n_tokens, req->n_blocks, req->slot,
                  peer != NULL ? epd_peer_id(peer) : "(none: prefill only)");
    senv = epd__prefill_ids_take(srv, id, &sl);
    if (req->n_media > 0) {
        epd_prefill_media_start(srv, req, g);
    }
    if (senv != NULL) {
        /* the reservation overtook the request (req is still live: it can
         * only be freed by the pump) */
        if (epd_prefill_from_decode(req, senv)) {
            epd_prefill_reservation_for(srv, req, sl, senv);
            epd_msg_free(senv);
            epd_link_unref(sl);
        } else {
            epd__prefill_ids_drop(srv, senv, sl, EPD_ERR_INVALID_PARAM,
                                  "sender is not the decode worker of this request");
        }
    }
}

int epd__prefill_req_reservation(epd_prefill_srv_t *srv, epd_link_t *from, Epd__Envelope *env)
{
    uint64_t id = epd_msg_request_id(env);
    epd_prefill_req_t *req = epd_reqtab_find_req(&srv->reqs, id, 0);

    if (req == NULL) {
        return epd__prefill_ids_early(srv, from, env);
    }
    epd_prefill_reservation_for(srv, req, from, env);
    return 0;
}

void epd__prefill_req_abort(epd_prefill_srv_t *srv, epd_link_t *from, const Epd__Envelope *env)
{
    uint64_t id = env->abort->request_id;
    epd_prefill_req_t *req = epd_reqtab_find_req(&srv->reqs, id, 0);
    const char *who = env->sender->worker_id;
    char msg[200];

    if (req == NULL) {
        epd__prefill_ids_abort(srv, from, env);
        return;
    }
    if (strcmp(who, req->client_id) != 0 && !epd_prefill_from_decode(req, env)) {
        epd_link_refuse(from, id, EPD_ERR_NOT_FOUND,
                        "abort from neither the client nor the decode worker of this request");
        return;
    }
    snprintf(msg, sizeof(msg), "abort from '%.60s': %.100s", who,
             env->abort->reason != NULL ? env->abort->reason : "");
    epd_prefill_fail(srv, req, EPD_ERR_CANCELED, msg, EPD_PREFILL_QUIESCE | EPD_PREFILL_ABORTED,
                     NULL);
}

void epd__prefill_req_error(epd_prefill_srv_t *srv, epd_link_t *from, const Epd__Envelope *env)
{
    const Epd__Error *e = env->error;
    epd_prefill_req_t *req = epd_reqtab_find_req(&srv->reqs, e->request_id, 0);
    epd_status_t st = e->status < 0 ? (epd_status_t)e->status : EPD_ERR_TRANSPORT;
    const char *who = env->sender->worker_id;
    char msg[200];

    (void)from; /* an Error is never answered */
    if (req == NULL) {
        epd_log_debug(EPD_PREFILL_LOG, e->request_id,
                      "error from '%s' about an unknown request: %s", who,
                      e->message != NULL ? e->message : "");
        return;
    }
    for (uint32_t i = 0; i < req->n_media; i++) {
        if (epd__prefill_media_from(&req->media[i], env)) {
            /* an image of it failed on its encoder (which tells the client):
             * decode frees its reservation */
            snprintf(msg, sizeof(msg), "encoder '%.60s': %.120s", who,
                     e->message != NULL ? e->message : "");
            epd_prefill_fail(srv, req, st, msg, EPD_PREFILL_TELL_DECODE | EPD_PREFILL_QUIESCE,
                             NULL);
            return;
        }
    }
    if (strcmp(who, req->client_id) != 0 && !epd_prefill_from_decode(req, env)) {
        epd_daemon_refuse_log(srv->d, req->id,
                              "ignoring an error from '%s', a stranger to this request", who);
        return;
    }
    /* the sender tells the client itself; decode may have reserved blocks:
     * it gets WritesQuiesced once nothing is in flight */
    snprintf(msg, sizeof(msg), "'%.60s' failed the request: %.100s", who,
             e->message != NULL ? e->message : "");
    epd_prefill_fail(srv, req, st, msg, EPD_PREFILL_QUIESCE, NULL);
}

void epd__prefill_req_embed_complete(epd_prefill_srv_t *srv, const Epd__Envelope *env)
{
    const Epd__EmbedComplete *ec = env->embed_complete;
    epd_prefill_req_t *req = epd_reqtab_find_req(&srv->reqs, ec->request_id, 0);
    epd_prefill_media_t *m = NULL;
    char msg[200];
    epd_status_t st;

    if (req != NULL && ec->media_index < req->n_media) {
        m = &req->media[ec->media_index];
    }
    if (m != NULL && m->state == EPD_PREFILL_MEDIA_ENCODER && epd__prefill_media_from(m, env)) {
        epd_trace_span(srv->trace, "embeddings wait", "wait", req->id, (int32_t)ec->media_index,
                       m->t_start_ns, epd_time_now_ns());
        st = epd__prefill_media_verify(srv, m, ec, msg, sizeof(msg));
        if (st != EPD_OK) {
            epd_log_error(EPD_PREFILL_LOG, req->id, "%s", msg);
            epd_prefill_fail(srv, req, st, msg, EPD_PREFILL_TELL_ALL, NULL);
            return;
        }
        req->media_pending--;
        epd_prefill_advance(srv, req); /* the run goes with the last image */
        return;
    }
    /* a late one for a slot we quarantined: the encoder is done with it */
    if (!epd__prefill_media_late(srv, ec, env)) {
        epd_log_debug(EPD_PREFILL_LOG, ec->request_id,
                      "EmbedComplete from '%s' for no image waiting here", env->sender->worker_id);
    }
}

void epd__prefill_req_quiesced(epd_prefill_srv_t *srv, const Epd__Envelope *env)
{
    uint64_t id = env->quiesced->request_id;
    epd_prefill_req_t *req = epd_reqtab_find_req(&srv->reqs, id, 0);
    uint32_t freed = epd__prefill_media_quiesced(srv, id, env);
    char msg[200];

    if (req != NULL && req->fail_status == EPD_OK) {
        for (uint32_t i = 0; i < req->n_media; i++) {
            if (req->media[i].state == EPD_PREFILL_MEDIA_ENCODER &&
                epd__prefill_media_from(&req->media[i], env)) {
                /* the encoder gave up on it (and tells the client why) */
                snprintf(msg, sizeof(msg), "encoder '%.60s' stopped the request",
                         env->sender->worker_id);
                epd_prefill_fail(srv, req, EPD_ERR_CANCELED, msg, EPD_PREFILL_TELL_ALL, NULL);
                /* nothing of it is in flight: the slots just quarantined are free */
                freed += epd__prefill_media_quiesced(srv, id, env);
                break;
            }
        }
    }
    if (freed > 0) {
        epd_log_debug(EPD_PREFILL_LOG, id, "encoder '%s' quiesced: %u slots free",
                      env->sender->worker_id, freed);
    }
}

/* ------------------------------------------------------------ compute back */

void epd__prefill_req_on_event(void *arg, epd_prefill_ev_t *ev)
{
    epd_prefill_srv_t *srv = arg;
    epd_prefill_req_t *req = ev->owner;
    epd_prefill_media_t *m;
    char msg[200];

    switch (ev->kind) {
    case EPD_PREFILL_EV_LAYER:
        if (ev->final_tokens != 0) {
            /* an earlier chunk: its full blocks of this layer may go now */
            epd__prefill_xfer_chunk_ready(srv, &req->xfer, ev->layer, ev->final_tokens);
        } else {
            req->layers_done = ev->layer + 1;
            if (ev->layer == 0) {
                req->t_first_layer_ns = epd_time_now_ns();
            }
        }
        /* the lean path: post this layer's writes right here, at the top of
         * the loop, while the compute thread runs the next layer */
        if (req->fail_status == EPD_OK && req->xfer.have_resv &&
            !epd_reqtab_is_blocked(&req->ent)) {
            epd_prefill_advance(srv, req);
        }
        return;
    case EPD_PREFILL_EV_DONE:
        req->compute_done = 1;
        req->compute_status = ev->status;
        req->first_token = ev->first_token;
        req->first_logprob = ev->first_logprob;
        req->compute_done_ns = epd_time_now_ns();
        req->t_start_ns = ev->started_ns;
        req->t_finished_ns = ev->finished_ns;
        if (srv->trace != NULL) {
            epd_trace_span(srv->trace, "queued", "wait", req->id, -1, req->t_admit_ns,
                           ev->started_ns);
            epd_trace_span(srv->trace, "prefill", "compute", req->id, -1, ev->started_ns,
                           ev->finished_ns);
            if (ev->layer_end_ns != 0 && ev->finished_ns > ev->layer_end_ns) {
                epd_trace_span(srv->trace, "sample first token", "compute", req->id, -1,
                               ev->layer_end_ns, ev->finished_ns);
            }
        }
        if (ev->status != EPD_OK) {
            snprintf(msg, sizeof(msg), "prefill failed on the compute thread: %s",
                     epd_status_string(ev->status));
            epd_prefill_fail(srv, req, ev->status, msg, EPD_PREFILL_TELL_ALL, NULL);
        } else {
            epd__prefill_cache_computed(srv, req); /* its KV is final: others may share it */
        }
        /* the engine read the embeddings: they are cache entries now */
        for (uint32_t i = 0; i < req->n_media; i++) {
            epd__prefill_media_give_back(srv, &req->media[i], req->id, req->fail_msg, 1);
        }
        break;
    case EPD_PREFILL_EV_ENCODED:
        m = &req->media[ev->layer];
        req->encodes_inflight--;
        /* a failed request's embeddings are discarded */
        epd__prefill_media_encoded(
            srv, m, req->fail_status != EPD_OK ? EPD_ERR_CANCELED : ev->status, msg, sizeof(msg));
        if (req->fail_status == EPD_OK && ev->status != EPD_OK) {
            epd_prefill_fail(srv, req, ev->status, msg, EPD_PREFILL_TELL_ALL, NULL);
        } else if (req->fail_status == EPD_OK) {
            req->media_pending--;
        }
        break;
    case EPD_PREFILL_EV_RELEASED:
        req->released = 1;
        break;
    case EPD_PREFILL_EV_CHUNK:
        return; /* the compute module's own: never handed here */
    }
    epd_prefill_dirty(srv, req);
}

/* Write completions of the xfer part (registered at start-up; possibly
 * nested in a transport call): facts, a step from the pump. */
static void epd_prefill_on_written(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x,
                                   epd_status_t status)
{
    epd_prefill_req_t *req = EPD_REQ_OF(x, epd_prefill_req_t, xfer);
    char msg[200];

    if (status != EPD_OK && req->fail_status == EPD_OK) {
        snprintf(msg, sizeof(msg), "a KV write to decode '%.80s' failed: %s",
                 epd_peer_id(req->peer), epd_status_string(status));
        epd_prefill_fail(srv, req, epd__prefill_xfer_peer_status(status), msg, EPD_PREFILL_TELL_ALL,
                         NULL);
    }
    if (x->writes_inflight == 0) {
        epd_prefill_dirty(srv, req);
    }
    if (epd_reqtab_has_blocked(&srv->reqs)) {
        srv->room = 1;
        epd_daemon_kick(srv->d);
    }
}

/* --------------------------------------------------------- daemon upcalls */

void epd__prefill_req_on_peer_dead(void *arg, epd_peer_t *peer, epd_status_t status,
                                   const char *why)
{
    epd_prefill_srv_t *srv = arg;
    int role = epd_peer_role(peer);
    char msg[200];

    (void)status;
    if (role != EPD__ROLE__ROLE_DECODE && role != EPD__ROLE__ROLE_ENCODER) {
        return;
    }
    snprintf(msg, sizeof(msg), "%s worker '%.80s' %s",
             role == EPD__ROLE__ROLE_ENCODER ? "encoder" : "decode", epd_peer_id(peer), why);
    epd_log_warn(EPD_PREFILL_LOG, 0, "%s: failing its requests", msg);
    for (epd_prefill_req_t *req = epd_reqtab_first_req(&srv->reqs); req != NULL;
         req = epd_reqtab_next_req(&srv->reqs, req)) {
        if (req->peer == peer) {
            /* keys unpacked on its link die when the link closes; it hears
             * WritesQuiesced once our writes for it completed (rule 28) */
            epd__prefill_xfer_forget_key(&req->xfer);
            epd_prefill_fail(srv, req, EPD_ERR_PEER_DEAD, msg,
                             EPD_PREFILL_TELL_CLIENT | EPD_PREFILL_QUIESCE, NULL);
            continue;
        }
        for (uint32_t i = 0; i < req->n_media; i++) {
            if (req->media[i].state == EPD_PREFILL_MEDIA_ENCODER && req->media[i].enc == peer) {
                /* before any token: the client may retry with another
                 * encoder (the Error names it) */
                epd_prefill_fail(srv, req, EPD_ERR_PEER_DEAD, msg, EPD_PREFILL_TELL_ALL,
                                 epd_peer_id(peer));
                break;
            }
        }
    }
}

void epd__prefill_req_on_peer_closed(void *arg, epd_peer_t *peer)
{
    if (epd_peer_role(peer) == EPD__ROLE__ROLE_ENCODER) {
        /* nothing of that incarnation can land any more */
        epd__prefill_media_encoder_gone(arg, peer);
    }
}

int epd__prefill_req_on_pump(void *arg)
{
    epd_prefill_srv_t *srv = arg;
    epd_prefill_req_t *req;

    if (srv->room) {
        srv->room = 0;
        epd_prefill_unblock_all(srv);
    }
    do {
        if (srv->embed_room) {
            epd_prefill_waiter_t *w;

            srv->embed_room = 0;
            while ((w = epd__prefill_media_next_fit(srv)) != NULL) {
                req = EPD_REQ_OF(w, epd_prefill_req_t, wait);
                epd_prefill_place(srv, req);
                epd_prefill_dirty(srv, req);
            }
        }
        while ((req = epd_reqtab_pop_dirty_req(&srv->reqs)) != NULL) {
            epd_prefill_advance(srv, req);
        }
    } while (srv->embed_room);
    if (srv->n_more > 0) {
        /* posting that stopped after a burst goes on at the next pass, after
         * the loop polled its events */
        for (req = epd_reqtab_first_req(&srv->reqs); req != NULL;
             req = epd_reqtab_next_req(&srv->reqs, req)) {
            if (req->more_listed) {
                req->more_listed = 0;
                srv->n_more--;
                epd_prefill_dirty(srv, req);
            }
        }
        return 1;
    }
    return srv->room;
}

void epd__prefill_req_on_tick(void *arg, uint64_t now)
{
    epd_prefill_srv_t *srv = arg;
    uint64_t lease_ns = (uint64_t)srv->lease_ms * EPD_NSEC_PER_MSEC;
    const epd_prefill_media_t *m;
    epd_prefill_waiter_t *w;
    char msg[200];

    if (epd_daemon_stopping(srv->d)) {
        return;
    }
    epd__prefill_media_tick(srv, now); /* retired encoders' quarantined slots */
    for (epd_prefill_req_t *req = epd_reqtab_first_req(&srv->reqs); req != NULL;
         req = epd_reqtab_next_req(&srv->reqs, req)) {
        if (req->state == EPD_PREFILL_REQ_FAILED || req->state == EPD_PREFILL_REQ_LANDING) {
            epd_prefill_dirty(srv, req); /* a safety net for what it waits on */
            continue;
        }
        if (req->fail_status != EPD_OK) {
            continue;
        }
        if (!req->prefill_only && !req->xfer.have_resv &&
            (req->compute_done
                 ? req->compute_status == EPD_OK && now - req->compute_done_ns > lease_ns
                 : req->hold && !req->run_submitted && now - req->t_admit_ns > lease_ns)) {
            snprintf(msg, sizeof(msg), "no KV reservation from decode '%.80s' within %u ms",
                     epd_peer_id(req->peer), srv->lease_ms);
            epd_prefill_fail(srv, req, EPD_ERR_TIMEOUT, msg, EPD_PREFILL_TELL_ALL, NULL);
            continue;
        }
        if (!req->complete_sent) {
            /* a long layer: decode's lease must not run out meanwhile */
            epd__prefill_xfer_keepalive(srv, &req->xfer, now);
        }
        if ((m = epd__prefill_media_silent(srv, req->media, req->n_media, now)) != NULL) {
            snprintf(msg, sizeof(msg), "no embeddings from encoder '%.60s' within %u ms", m->enc_id,
                     srv->lease_ms);
            epd_prefill_fail(srv, req, EPD_ERR_TIMEOUT, msg, EPD_PREFILL_TELL_ALL, m->enc_id);
        }
    }
    while ((w = epd__prefill_media_overdue(srv, now)) != NULL) {
        snprintf(msg, sizeof(msg),
                 "no embedding slot came free within %u ms (all %u busy with other requests)",
                 srv->lease_ms, srv->embed_slots);
        /* takes it out of the FIFO */
        epd_prefill_fail(srv, EPD_REQ_OF(w, epd_prefill_req_t, wait), EPD_ERR_NO_CAPACITY, msg,
                         EPD_PREFILL_TELL_ALL, NULL);
    }
    epd__prefill_ids_expire(srv, now);
    epd_prefill_unblock_all(srv);
}

void epd__prefill_req_on_stop(void *arg)
{
    epd_prefill_srv_t *srv = arg;

    /* the compute thread ends its run at the next layer boundary */
    for (epd_prefill_req_t *req = epd_reqtab_first_req(&srv->reqs); req != NULL;
         req = epd_reqtab_next_req(&srv->reqs, req)) {
        atomic_store(&req->cancel, 1);
    }
}

/* ------------------------------------------------------------------- life */

epd_status_t epd__prefill_reqs_init(epd_prefill_srv_t *srv)
{
    epd_status_t st;

    srv->on_written = epd_prefill_on_written;
    st = epd_hash_state_create(0, &srv->hash);
    if (st != EPD_OK) {
        return st;
    }
    return epd_reqtab_init(&srv->reqs, srv->state_slots, offsetof(epd_prefill_req_t, ent));
}

void epd__prefill_reqs_cleanup(epd_prefill_srv_t *srv)
{
    epd_prefill_req_t *req;

    if (srv->reqs.table_ != NULL) {
        while ((req = epd_reqtab_first_req(&srv->reqs)) != NULL) {
            epd_reqtab_remove(&srv->reqs, &req->ent);
            /* its key died with the link it was unpacked on (closed by now) */
            epd__prefill_xfer_forget_key(&req->xfer);
            epd__prefill_pool_free(srv, req);
        }
    }
    epd_reqtab_cleanup(&srv->reqs);
    epd_hash_state_destroy(srv->hash);
    srv->hash = NULL;
}
