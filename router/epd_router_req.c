/*
 * epd_router_req.c — a generation request's life behind the HTTP intake
 * (see epd_router_int.h): its attempts, each a prefill and a decode
 * worker (and an encoder per image) chosen by the registry's policy and
 * submitted through the request-plane client; the client's events for
 * them; retries; aborts; deadlines.
 *
 *   PARSED     built by the intake (epd_router_api.c), not yet listed
 *   WAITING    listed, no attempt in flight: before the first, after one
 *              that failed and may be retried, or while the transport
 *              refuses the submit for room (EPD_ERR_NO_RESOURCE)
 *   SUBMITTED  an attempt in flight, no token yet: its prompt counts in its
 *              prefill worker's queued tokens; a failure may be retried
 *   STREAMING  tokens arriving: the text goes to the client as it comes
 *   ABORTING   the HTTP side finished while the attempt runs (a stop
 *              string, a failure of ours, the client gone): Abort sent to
 *              its workers, waiting for its terminal event
 *   DONE       the HTTP side finished and no attempt in flight: freed
 *
 *   from        what happened                                 to
 *   PARSED      epd__router_req_start: listed                 WAITING
 *   WAITING     a submit accepted                             SUBMITTED
 *               no room in the transport, deadline ahead      WAITING (the tick
 *                                                               submits again)
 *               no worker, deadline, a submit error           DONE (answered)
 *               the client gone                               DONE
 *   SUBMITTED   the first token                               STREAMING
 *   SUBMITTED,  terminal event: failed before a token,        WAITING (submits
 *   STREAMING     retryable, retries and deadline left          again at once)
 *               any other terminal event                      DONE (answered)
 *               the HTTP side finished                        ABORTING (Abort sent)
 *   ABORTING    terminal event                                DONE
 *
 * Every transition is made by epd_router_req_step (one switch) from the
 * facts events record — the HTTP side finished (r->http NULL: answered by
 * epd_router_answer.c, or the client's abort callback here), tokens
 * received (r->n_out, with the text they decode to) — and from the
 * attempt's terminal event, which the step reads while the client
 * delivers it.  Event handlers record and call the step
 * (epd_router_req_advance), which frees a DONE request.
 *
 * Failures: an attempt that fails before any token (a refusal for
 * capacity, a draining or dead worker) is sent again to other workers, at
 * most --max-retries times, within the request's deadline; after tokens
 * went out, a failure ends the stream with an error event.  A client that
 * disconnects aborts the attempt on every worker.  The request's memory
 * lives until the client's terminal event for its attempt (or at once
 * when no attempt is in flight).
 *
 * Called by epd_router_api.c (a new request) and, through callbacks
 * registered at start-up, by the client (its events), the HTTP server
 * (a client gone) and the daemon's tick; calls epd_router_answer.c for
 * everything the HTTP client sees, never epd_router_api.c.
 */
#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_router_int.h"
#include "epd_time.h"

/* ------------------------------------------------------------ bookkeeping */

static void epd_router_req_list(epd_router_t *rt, epd_router_req_t *r)
{
    r->prev = NULL;
    r->next = rt->reqs;
    if (rt->reqs != NULL) {
        rt->reqs->prev = r;
    }
    rt->reqs = r;
    rt->n_reqs++;
}

/* Into the queue at its place by arrival (a request refused for room goes
 * back behind the older ones, ahead of the newer). */
static void epd_router_queue_add(epd_router_t *rt, epd_router_req_t *r)
{
    epd_router_req_t *after = rt->wait_tail;

    while (after != NULL && after->t_arrival_ns > r->t_arrival_ns) {
        after = after->wprev;
    }
    r->wprev = after;
    r->wnext = after != NULL ? after->wnext : rt->wait_head;
    if (r->wnext != NULL) {
        r->wnext->wprev = r;
    } else {
        rt->wait_tail = r;
    }
    if (after != NULL) {
        after->wnext = r;
    } else {
        rt->wait_head = r;
    }
    rt->n_waiting++;
}

static void epd_router_queue_remove(epd_router_t *rt, epd_router_req_t *r)
{
    if (r->wprev != NULL) {
        r->wprev->wnext = r->wnext;
    } else {
        rt->wait_head = r->wnext;
    }
    if (r->wnext != NULL) {
        r->wnext->wprev = r->wprev;
    } else {
        rt->wait_tail = r->wprev;
    }
    r->wprev = r->wnext = NULL;
    rt->n_waiting--;
}

/* The backoff after the n-th refusal for room (0-based): half of
 * min(BASE << n, MAX), plus a random share of the other half. */
static uint64_t epd_router_backoff_ns(epd_router_t *rt, uint32_t n)
{
    uint64_t cap = (uint64_t)EPD_ROUTER_BACKOFF_BASE_MS << (n < 16 ? n : 16);

    if (cap > EPD_ROUTER_BACKOFF_MAX_MS) {
        cap = EPD_ROUTER_BACKOFF_MAX_MS;
    }
    cap *= 1000000ull;
    return cap / 2 + epd_rng_next(&rt->rng) % (cap / 2 + 1);
}

static void epd_router_req_free(epd_router_t *rt, epd_router_req_t *r)
{
    if (r->prev != NULL) {
        r->prev->next = r->next;
    } else {
        rt->reqs = r->next;
    }
    if (r->next != NULL) {
        r->next->prev = r->prev;
    }
    rt->n_reqs--;
    if (r->group != NULL) {
        /* a member borrows the group's oai */
        r->group->members[r->choice] = NULL;
        epd__router_group_unref(r->group);
    } else {
        epd_oai_request_destroy(r->oai);
    }
    epd_free(r->echo);
    epd_oai_stream_cleanup(&r->stream);
    epd_free(r->img_hash);
    epd_free(r->img_pos);
    epd_free(r->prompt);
    epd_free(r->out);
    epd_free(r->lp_ids);
    epd_free(r->lps);
    epd_free(r->text);
    epd_free(r);
}

void epd__router_reqs_free_all(epd_router_t *rt)
{
    while (rt->reqs != NULL) {
        epd_router_req_t *r = rt->reqs;

        /* an attempt in flight holds its workers (the registry goes next) */
        if (r->pw != NULL) {
            epd_router_worker_unref(r->pw);
        }
        if (r->dw != NULL) {
            epd_router_worker_unref(r->dw);
        }
        for (uint32_t k = 0; k < r->n_images; k++) {
            if (r->img_enc[k] != NULL) {
                epd_router_worker_unref(r->img_enc[k]);
            }
        }
        epd_router_req_free(rt, r);
    }
}

/* The attempt's prompt (n_prompt + n_base tokens, counted in its prefill
 * worker's queued tokens since the submit) left that worker's queue: its
 * first token came, or the attempt ended without one. */
static void epd_router_prompt_left_queue(epd_router_req_t *r)
{
    r->pw->queued_tokens -= r->n_prompt + r->n_base;
}

/* The attempt in flight ended (its terminal event came): give back the
 * workers' load and references.  Its prompt still counts in the prefill
 * worker's queued tokens while no token came. */
static void epd_router_attempt_end(epd_router_req_t *r)
{
    if (r->pw != NULL) {
        if (r->n_out == r->n_base) {
            epd_router_prompt_left_queue(r);
        }
        r->pw->inflight--;
        epd_router_worker_unref(r->pw);
        r->pw = NULL;
    }
    if (r->dw != NULL) {
        r->dw->inflight--;
        if (r->t_dispatch_ns > r->dw->last_hb_ns) {
            /* sent since its last heartbeat: no longer counted against its
             * free blocks (they are its own business now) */
            r->dw->kv_pending -= r->dw_blocks < r->dw->kv_pending ? r->dw_blocks : r->dw->kv_pending;
        }
        epd_router_worker_unref(r->dw);
        r->dw = NULL;
    }
    for (uint32_t k = 0; k < r->n_images; k++) {
        if (r->img_enc[k] != NULL) {
            r->img_enc[k]->inflight--;
            epd_router_worker_unref(r->img_enc[k]);
            r->img_enc[k] = NULL;
        }
    }
    r->client_id = 0;
}

/* Was the attempt refused for room (a decode worker's KvRefused, a prefill
 * or decode worker's EPD_ERR_NO_CAPACITY)?  Such a request waits and tries
 * again after a backoff; both pools full end the same way (429). */
static int epd_router_for_room(const epd_client_event_t *ev)
{
    return ev->kind == EPD_CLIENT_EV_REFUSED ||
           (ev->kind == EPD_CLIENT_EV_ERROR && ev->status == EPD_ERR_NO_CAPACITY);
}

static int epd_router_retryable(const epd_client_event_t *ev)
{
    if (ev->kind == EPD_CLIENT_EV_REFUSED) {
        return 1;
    }
    if (ev->culprit != NULL && ev->culprit[0] != '\0' &&
        (ev->status == EPD_ERR_TIMEOUT || ev->status == EPD_ERR_CANCELED)) {
        return 1; /* another worker (an encoder) let it down: try another */
    }
    switch (ev->status) {
    case EPD_ERR_PEER_DEAD:
    case EPD_ERR_DRAINING:
    case EPD_ERR_NO_CAPACITY:
    case EPD_ERR_UNREACHABLE:
    case EPD_ERR_CONNECTION_RESET:
    case EPD_ERR_TRANSPORT:
    case EPD_ERR_STALE_EPOCH:
    case EPD_ERR_CORRUPT: /* a transfer its checksum refused: the link's fault, not the
                           * request's (nothing corrupt was used) */
        return 1;
    default:
        return 0;
    }
}

/* Dispatch failed for good: answer with the reason. */
static void epd_router_dispatch_failed(epd_router_t *rt, epd_router_req_t *r, epd_status_t st,
                                       uint64_t now_ns)
{
    if (st == EPD_ERR_UNREACHABLE) {
        if (r->nw_start_ns != 0) {
            rt->m.no_worker_timeouts++;
            epd_router_histo_observe(&rt->m.no_worker_wait,
                                     (double)(now_ns - r->nw_start_ns) / 1e9);
        }
        epd__router_fail_no_workers(rt, r, now_ns);
    } else if (st == EPD_ERR_TIMEOUT) {
        epd__router_fail_http(rt, r, EPD_ROUTER_ERR_TIMEOUT, 504, "request timed out%s%s", "", "");
    } else if (st == EPD_ERR_TOO_LONG) {
        epd__router_fail_http(rt, r, EPD_ROUTER_ERR_BAD_REQUEST, 400,
                              "the prompt does not fit in one request-plane message%s%s", "", "");
    } else if (st == EPD_ERR_OUT_OF_RANGE) {
        char need[64], limit[96];

        snprintf(need, sizeof(need), "%llu", (unsigned long long)r->never_need);
        snprintf(limit, sizeof(limit), "%s worker holds %llu",
                 r->never_role == EPD_CLIENT_ROLE_DECODE ? "decode" : "prefill",
                 (unsigned long long)r->never_limit);
        epd__router_fail_http(rt, r, EPD_ROUTER_ERR_BAD_REQUEST, 400,
                              "this request needs %s tokens of KV cache, but the largest %s "
                              "tokens; please reduce the length of the prompt or max_tokens",
                              need, limit);
    } else {
        epd__router_fail_http(rt, r, EPD_ROUTER_ERR_UPSTREAM, 502,
                              "cannot submit the request: %s%s", epd_status_string(st), "");
    }
}

/* The worker of the failed attempt an event blames by name, or NULL. */
static epd_router_worker_t *epd_router_attempt_worker(epd_router_worker_t *pw,
                                                      epd_router_worker_t *dw,
                                                      epd_router_worker_t *const *ew,
                                                      uint32_t n_images, const char *id)
{
    if (id == NULL || id[0] == '\0') {
        return NULL;
    }
    if (strcmp(id, pw->info.worker_id) == 0) {
        return pw;
    }
    if (strcmp(id, dw->info.worker_id) == 0) {
        return dw;
    }
    for (uint32_t k = 0; k < n_images; k++) {
        if (ew[k] != NULL && strcmp(id, ew[k]->info.worker_id) == 0) {
            return ew[k];
        }
    }
    return NULL;
}

static void epd_router_avoid(epd_router_req_t *r, epd_router_worker_t *w, uint64_t now_ns)
{
    for (uint32_t i = 0; i < r->n_avoid; i++) {
        if (r->avoid[i] == w) {
            r->avoid_ns[i] = now_ns;
            return;
        }
    }
    if (r->n_avoid < EPD_ROUTER_MAX_AVOID) {
        r->avoid_ns[r->n_avoid] = now_ns;
        r->avoid[r->n_avoid++] = w;
    }
}

/*
 * The dispatch found no usable pair (EPD_ERR_UNREACHABLE): may `r` wait in
 * line for one — a restarted worker registering, a stopped one resuming,
 * another pair — rather than be answered 503 now?  Yes for
 * --no-worker-wait-ms after it first found none (over all its attempts:
 * the wait is bounded once per request), within its deadline.
 */
static int epd_router_pair_wait(epd_router_t *rt, epd_router_req_t *r, uint64_t now_ns)
{
    if (rt->no_worker_wait_ms == 0) {
        return 0; /* 503 at once */
    }
    if (r->nw_start_ns == 0) {
        r->nw_start_ns = now_ns;
        rt->m.no_worker_waits++;
        epd_log_debug(EPD_ROUTER_LOG, r->trace_id,
                      "no usable prefill and decode pair: waiting up to %u ms for one",
                      rt->no_worker_wait_ms);
    }
    r->nw_waiting = 1;
    return now_ns - r->nw_start_ns < (uint64_t)rt->no_worker_wait_ms * 1000000ull &&
           now_ns < r->deadline_ns;
}

/* ------------------------------------------------------ an attempt's end */

/* What the end of an attempt leads to (epd_router_attempt_over). */
typedef enum {
    EPD_ROUTER_ATTEMPT_FINAL, /* the request is over: answered now, or before */
    EPD_ROUTER_ATTEMPT_RETRY, /* failed before its first token, retries and time left:
                               * another attempt, on other workers (or after a backoff
                               * when it was refused for room) */
} epd_router_attempt_next_t;

/* Refused for room before its first token (`reporter` said so): the worker
 * gets no new work until its next heartbeat, the request waits in the
 * queue (by its arrival) for a backoff — or, past its queue's time, is
 * answered 429.  Returns what follows. */
static epd_router_attempt_next_t epd_router_attempt_no_room(epd_router_t *rt, epd_router_req_t *r,
                                                            const epd_client_event_t *ev,
                                                            epd_router_worker_t *reporter,
                                                            uint64_t now)
{
    if (reporter != NULL) {
        reporter->cap_refused = 1;
    }
    if (now >= r->queue_deadline_ns || now >= r->deadline_ns) {
        rt->m.rejected_queue_timeout++;
        epd__router_fail_overloaded(rt, r, "no room in the prefill or decode pools in time");
        return EPD_ROUTER_ATTEMPT_FINAL;
    }
    r->retry_at_ns = now + epd_router_backoff_ns(rt, r->room_refusals++);
    rt->m.capacity_retries++;
    epd_log_debug(EPD_ROUTER_LOG, ev->request_id,
                  "attempt %u refused for room by %s (%s): again in %llu ms", r->attempts,
                  ev->from, ev->message,
                  (unsigned long long)((r->retry_at_ns - now) / 1000000ull));
    return EPD_ROUTER_ATTEMPT_RETRY;
}

/* May the stream of r, cut after some tokens, go on from another pair
 * (rule 37)?  Not with images (a resume recomputes the prompt's KV without
 * media), nor when it has all its tokens, nor without the token ids. */
static int epd_router_may_migrate(const epd_router_req_t *r)
{
    return r->n_out > 0 && r->n_images == 0 && r->n_out < r->max_new && r->out != NULL;
}

/* The attempt failed (an ERROR or REFUSED event, `ev`): what it tells of
 * the workers (a disproved cache hint, whom to avoid), the workers let go,
 * then a retry, or the answer. */
static epd_router_attempt_next_t epd_router_attempt_failed(epd_router_t *rt, epd_router_req_t *r,
                                                           const epd_client_event_t *ev,
                                                           uint64_t now)
{
    epd_router_worker_t *pw = r->pw, *dw = r->dw;
    epd_router_worker_t *ew[EPD_CLIENT_MEDIA_MAX];
    epd_router_worker_t *culprit, *reporter;
    int stale_hint;

    memcpy(ew, r->img_enc, sizeof(ew));
    culprit = epd_router_attempt_worker(pw, dw, ew, r->n_images, ev->culprit);
    reporter = epd_router_attempt_worker(pw, dw, ew, r->n_images, ev->from);
    /* a cache hint the prefill worker disproved: it did not hold an image
     * we sent without an encoder; forget the hints, go again with one */
    stale_hint = ev->kind == EPD_CLIENT_EV_ERROR && ev->status == EPD_ERR_NOT_FOUND &&
                 (reporter == pw || culprit == pw) && r->n_images > 0 && !r->no_hints;
    if (stale_hint) {
        r->no_hints = 1; /* at most once per request: the next attempt encodes */
        for (uint32_t k = 0; k < r->n_images; k++) {
            if (r->img_src[k] == EPD_ROUTER_IMG_CACHE) {
                epd_router_cache_forget(pw, r->img_hash[k]);
            }
        }
        rt->m.image_cache_stale++;
    }
    if (ev->kind == EPD_CLIENT_EV_ERROR &&
        (ev->status == EPD_ERR_UNREACHABLE || ev->status == EPD_ERR_PEER_DEAD ||
         ev->status == EPD_ERR_CONNECTION_RESET || ev->status == EPD_ERR_TRANSPORT) &&
        ((reporter == pw && (culprit == dw || culprit == NULL)) ||
         (reporter == dw && (culprit == pw || culprit == NULL)))) {
        /* the other may be dead (killed, its endpoints not yet failed here)
         * or stopped: no new work for it until it heartbeats again — when
         * requests may wait for a pair (--no-worker-wait-ms; at 0 that
         * would only turn more of them into an immediate 503), and only if
         * it is late for a heartbeat too.  A worker that heartbeats on time
         * is alive and cut off from this one peer only: the pair is avoided
         * below, the worker serves the others (test_mh_partition: set aside
         * on every report, decode-1 served none of 32 requests while it
         * heartbeat every 500 ms) */
        epd_router_worker_t *other = reporter == pw ? dw : pw;

        if (rt->no_worker_wait_ms > 0 &&
            now - other->last_hb_ns > (uint64_t)rt->heartbeat_ms * 1000000ull) {
            other->unreachable_ns = now;
        }
        /* prefill and decode each blame the other while the router reaches
         * both: the network between them may be broken, not either worker */
        if (epd_client_worker_state(pw->cw) == EPD_OK &&
            epd_client_worker_state(dw->cw) == EPD_OK) {
            epd__router_pair_break(rt, pw, dw, now);
        }
    }
    /* the workers stay valid (unreferenced entries are freed by the
     * registry's tick only): compared and named below */
    epd_router_attempt_end(r);
    if (r->http == NULL) {
        return EPD_ROUTER_ATTEMPT_FINAL; /* nobody to answer or retry for */
    }
    if (r->n_images > 0 && ev->kind == EPD_CLIENT_EV_ERROR && r->n_out == 0 &&
        (ev->status == EPD_ERR_MALFORMED || ev->status == EPD_ERR_UNSUPPORTED ||
         ev->status == EPD_ERR_TOO_LONG) &&
        reporter != NULL && reporter != dw) {
        /* the image itself is bad (its encoder, or the prefill worker
         * encoding it, could not decode it): the client's fault */
        epd__router_fail_http(rt, r, EPD_ROUTER_ERR_BAD_REQUEST, 400,
                              "an image of the request: %s%s", ev->message, "");
        return EPD_ROUTER_ATTEMPT_FINAL;
    }
    if (r->n_out == r->n_base && epd_router_for_room(ev)) {
        return epd_router_attempt_no_room(
            rt, r, ev, ev->kind == EPD_CLIENT_EV_REFUSED ? dw : reporter != NULL ? reporter : pw,
            now);
    }
    /* a disproved hint is nobody's failure: it gets one attempt on top;
     * refusals for room do not count */
    if ((r->n_out == r->n_base || epd_router_may_migrate(r)) &&
        (epd_router_retryable(ev) || stale_hint) &&
        r->attempts - r->room_refusals <= rt->max_retries + (uint32_t)r->no_hints &&
        now < r->deadline_ns) {
        int enc_dead = 0;

        for (uint32_t k = 0; k < r->n_images; k++) {
            if (ew[k] != NULL && epd_client_worker_state(ew[k]->cw) != EPD_OK) {
                epd_router_avoid(r, ew[k], now);
                enc_dead = 1;
            }
        }
        if (stale_hint) {
            /* nobody failed */
        } else if (culprit != NULL) {
            epd_router_avoid(r, culprit, now);
        } else if (!enc_dead) {
            /* avoid the worker that failed (both when it cannot be told) */
            int blame_p =
                ev->kind != EPD_CLIENT_EV_REFUSED &&
                (strcmp(ev->from, pw->info.worker_id) == 0 ||
                 epd_client_worker_state(pw->cw) != EPD_OK || strcmp(ev->from, "client") == 0);
            int blame_d = ev->kind == EPD_CLIENT_EV_REFUSED ||
                          strcmp(ev->from, dw->info.worker_id) == 0 ||
                          epd_client_worker_state(dw->cw) != EPD_OK;

            if (reporter != NULL && reporter != pw && reporter != dw) {
                epd_router_avoid(r, reporter, now); /* an encoder */
            } else {
                if (blame_p) {
                    epd_router_avoid(r, pw, now);
                }
                if (blame_d) {
                    epd_router_avoid(r, dw, now);
                }
            }
        }
        rt->m.retries++;
        if (r->n_out > r->n_base) {
            /* the stream goes on from another pair where this one stopped */
            r->migrations++;
            rt->m.migrations++;
            epd_log_info(EPD_ROUTER_LOG, ev->request_id,
                         "attempt %u failed after %u tokens (%s from %s: %s): migrating, the "
                         "stream goes on from token %u",
                         r->attempts, r->n_out - r->n_base, epd_status_name(ev->status), ev->from,
                         ev->message, r->n_out);
        } else {
            epd_log_info(EPD_ROUTER_LOG, ev->request_id,
                         "attempt %u failed before its first token (%s from %s: %s): retrying",
                         r->attempts, epd_status_name(ev->status), ev->from, ev->message);
        }
        return EPD_ROUTER_ATTEMPT_RETRY;
    }
    if (ev->status == EPD_ERR_TIMEOUT) {
        epd__router_fail_http(rt, r, EPD_ROUTER_ERR_TIMEOUT, 504, "request timed out (%s%s)",
                              ev->from, "");
    } else if (ev->kind == EPD_CLIENT_EV_REFUSED) {
        epd__router_fail_http(rt, r, EPD_ROUTER_ERR_UPSTREAM, 503, "no decode capacity: %s%s",
                              ev->message, "");
    } else {
        char why[300];

        snprintf(why, sizeof(why), "%s: %s", epd_status_name(ev->status), ev->message);
        epd__router_fail_http(rt, r, EPD_ROUTER_ERR_UPSTREAM, 502,
                              "the request failed (reported by %s): %s",
                              strcmp(ev->from, "client") == 0 ? "the router" : ev->from, why);
    }
    return EPD_ROUTER_ATTEMPT_FINAL;
}

/* The attempt's terminal event `ev` came (its tokens, if any, already
 * recorded): the workers let go, then a retry, or the answer unless the
 * HTTP side is finished. */
static epd_router_attempt_next_t epd_router_attempt_over(epd_router_t *rt, epd_router_req_t *r,
                                                         const epd_client_event_t *ev, uint64_t now)
{
    if (ev->kind != EPD_CLIENT_EV_TOKENS) {
        return epd_router_attempt_failed(rt, r, ev, now);
    }
    epd_router_attempt_end(r);
    if (r->http == NULL) {
        return EPD_ROUTER_ATTEMPT_FINAL;
    }
    if ((ev->finish == EPD_CLIENT_FINISH_LENGTH || ev->finish == EPD_CLIENT_FINISH_STOP) &&
        epd__router_text_flush(rt, r) != 0) {
        epd__router_fail_http(rt, r, EPD_ROUTER_ERR_INTERNAL, 500, "out of memory%s%s", "", "");
    } else if (ev->finish == EPD_CLIENT_FINISH_LENGTH || ev->finish == EPD_CLIENT_FINISH_STOP) {
        epd__router_finish_ok(rt, r,
                              ev->finish == EPD_CLIENT_FINISH_STOP ? EPD_OAI_FINISH_STOP
                                                                   : EPD_OAI_FINISH_LENGTH);
    } else {
        epd__router_fail_http(rt, r, EPD_ROUTER_ERR_UPSTREAM, 502,
                              "the request ended with finish %s (from %s)",
                              epd_client_finish_name(ev->finish), ev->from);
    }
    return EPD_ROUTER_ATTEMPT_FINAL;
}

/* ------------------------------------------------------------------- step */

static void epd_router_on_http_abort(epd_http_req_t *http, void *arg);

/*
 * Moves a request as far as its facts allow: the only place its state
 * changes.  `end` is the attempt's terminal event while the client
 * delivers it (borrowed; NULL otherwise); it is read once.
 */
static void epd_router_req_step(epd_router_t *rt, epd_router_req_t *r,
                                const epd_client_event_t *end, uint64_t now_ns)
{
    for (;;) {
        epd_router_req_state_t from = r->state;
        epd_status_t st;

        switch (r->state) {
        case EPD_ROUTER_REQ_PARSED:
            epd_router_req_list(rt, r);
            if (r->group == NULL) {
                /* (a group's members hear of it through the group's) */
                epd_http_req_set_abort(r->http, epd_router_on_http_abort, r);
            }
            if (rt->n_waiting >= rt->max_queue) {
                /* the queue is full: not even a place in line */
                rt->m.rejected_queue_full++;
                epd__router_fail_overloaded(rt, r, "too many requests are waiting");
                r->state = EPD_ROUTER_REQ_DONE;
                break;
            }
            epd_router_queue_add(rt, r);
            r->state = EPD_ROUTER_REQ_WAITING;
            break;
        case EPD_ROUTER_REQ_WAITING:
            if (r->http == NULL) {
                epd_router_queue_remove(rt, r);
                r->state = EPD_ROUTER_REQ_DONE; /* the client left while it waited */
                break;
            }
            st = EPD_ERR_NO_CAPACITY;
            if (r->turn) {
                /* its turn in the queue (epd_router_queue_run) */
                r->turn = 0;
                st = epd__router_dispatch(rt, r, now_ns);
                /* no room for the oldest: the walk stops behind it */
                rt->queue_stalled = st == EPD_ERR_NO_CAPACITY || st == EPD_ERR_NO_RESOURCE;
                if (rt->queue_stalled) {
                    r->nw_waiting = 0; /* a pair, without room: it waits for room now */
                }
            }
            if (st == EPD_OK) {
                if (r->nw_waiting) {
                    /* a pair came back in time */
                    r->nw_waiting = 0;
                    r->nw_wait_ns = now_ns - r->nw_start_ns;
                    epd_router_histo_observe(&rt->m.no_worker_wait, (double)r->nw_wait_ns / 1e9);
                }
                epd_router_queue_remove(rt, r);
                r->state = EPD_ROUTER_REQ_SUBMITTED;
            } else if (st == EPD_ERR_UNREACHABLE && epd_router_pair_wait(rt, r, now_ns)) {
                /* waits in line for a pair; the walk goes on behind it (a
                 * newer request may avoid fewer workers) */
            } else if (st != EPD_ERR_NO_CAPACITY && st != EPD_ERR_NO_RESOURCE) {
                epd_router_queue_remove(rt, r);
                epd_router_dispatch_failed(rt, r, st, now_ns);
                r->state = EPD_ROUTER_REQ_DONE;
            } else if (r->nw_waiting && !epd_router_pair_wait(rt, r, now_ns)) {
                /* no pair came within --no-worker-wait-ms (or its deadline) */
                epd_router_queue_remove(rt, r);
                epd_router_dispatch_failed(rt, r, EPD_ERR_UNREACHABLE, now_ns);
                r->state = EPD_ROUTER_REQ_DONE;
            } else if (now_ns >= r->deadline_ns) {
                epd_router_queue_remove(rt, r);
                epd_router_dispatch_failed(rt, r, EPD_ERR_TIMEOUT, now_ns);
                r->state = EPD_ROUTER_REQ_DONE;
            } else if (now_ns >= r->queue_deadline_ns) {
                epd_router_queue_remove(rt, r);
                rt->m.rejected_queue_timeout++;
                epd__router_fail_overloaded(rt, r, "no room in the prefill or decode pools in time");
                r->state = EPD_ROUTER_REQ_DONE;
            }
            /* else it waits in line for room */
            break;
        case EPD_ROUTER_REQ_SUBMITTED:
        case EPD_ROUTER_REQ_STREAMING:
            if (end != NULL) {
                epd_router_attempt_next_t next = epd_router_attempt_over(rt, r, end, now_ns);

                end = NULL;
                if (next == EPD_ROUTER_ATTEMPT_RETRY) {
                    /* back in line at its place; at once unless it backs off */
                    epd_router_queue_add(rt, r);
                    r->turn = r->retry_at_ns <= now_ns;
                    r->state = EPD_ROUTER_REQ_WAITING;
                } else {
                    r->state = EPD_ROUTER_REQ_DONE;
                }
            } else if (r->http == NULL) {
                /* answered (a stop string, a failure of ours) or the client
                 * gone: stop the attempt; its terminal event still comes */
                (void)epd_client_abort(rt->client, r->client_id);
                r->state = EPD_ROUTER_REQ_ABORTING;
            } else if (r->state == EPD_ROUTER_REQ_SUBMITTED && r->n_out > r->n_base) {
                r->state = EPD_ROUTER_REQ_STREAMING;
            }
            break;
        case EPD_ROUTER_REQ_ABORTING:
            if (end != NULL) {
                (void)epd_router_attempt_over(rt, r, end, now_ns); /* nothing to answer */
                end = NULL;
                r->state = EPD_ROUTER_REQ_DONE;
            }
            break;
        case EPD_ROUTER_REQ_DONE:
            break;
        }
        if (r->state == from) {
            return; /* nothing more until the next event */
        }
    }
}

/* Steps a request and frees it when it is done. */
static void epd_router_req_advance(epd_router_t *rt, epd_router_req_t *r,
                                   const epd_client_event_t *end, uint64_t now_ns)
{
    epd_router_req_step(rt, r, end, now_ns);
    if (r->state == EPD_ROUTER_REQ_DONE) {
        assert(r->http == NULL && r->pw == NULL);
        epd_router_req_free(rt, r);
    }
}

/* ------------------------------------------------------------ the events */

/*
 * TTFT taken apart (proto/README.md rule 38): the router's own wait until
 * the serving attempt went out, the workers' durations from the first
 * chunk, and the rest (message latencies) so that a request's phases sum
 * to its TTFT.  The workers' durations lie in causal order inside the
 * attempt's wait, so the rest is never negative but for clock rates;
 * clamped at 0 (and the workers' then scaled to fit) all the same.
 * Traced as spans laid end to end from the arrival (the workers'
 * positions are not known on this clock, their lengths are).
 */
static void epd_router_phases(epd_router_t *rt, epd_router_req_t *r, const epd_client_event_t *ev,
                              uint64_t now)
{
    static const char *const span_names[EPD_ROUTER_PHASES] = {
        "queue", "encode (workers' time)", "prefill queue (workers' time)",
        "prefill compute (workers' time)", "KV transfer tail (workers' time)",
        "first-token hand-off (workers' time)", "messages (the rest)"};
    uint64_t ns[EPD_ROUTER_PHASES] = {0};
    uint64_t start = r->t_sent_ns > r->t_arrival_ns && r->t_sent_ns <= now ? r->t_sent_ns
                                                                            : r->t_arrival_ns;
    uint64_t wait = now - start, work = 0, t;
    const epd_client_phase_times_t *pt = ev->times;
    uint32_t cached = 0;

    ns[EPD_ROUTER_PHASE_QUEUE] = start - r->t_arrival_ns;
    if (pt != NULL) {
        ns[EPD_ROUTER_PHASE_ENCODE] = pt->encode_ns;
        ns[EPD_ROUTER_PHASE_PREFILL_QUEUE] = pt->prefill_queue_ns;
        ns[EPD_ROUTER_PHASE_PREFILL_COMPUTE] = pt->prefill_compute_ns;
        ns[EPD_ROUTER_PHASE_KV_TRANSFER] = pt->kv_tail_ns;
        ns[EPD_ROUTER_PHASE_HANDOFF] = pt->handoff_ns;
        cached = pt->cached_tokens < r->n_prompt ? pt->cached_tokens : r->n_prompt;
    } else {
        rt->m.phase_times_missing++;
    }
    for (int p = EPD_ROUTER_PHASE_ENCODE; p < EPD_ROUTER_PHASE_MESSAGES; p++) {
        work += ns[p];
    }
    if (work > wait) {
        /* another clock ran faster (or a worker lied): keep the sum */
        for (int p = EPD_ROUTER_PHASE_ENCODE; p < EPD_ROUTER_PHASE_MESSAGES; p++) {
            ns[p] = (uint64_t)((double)ns[p] * (double)wait / (double)work);
        }
        work = 0;
        for (int p = EPD_ROUTER_PHASE_ENCODE; p < EPD_ROUTER_PHASE_MESSAGES; p++) {
            work += ns[p];
        }
    }
    ns[EPD_ROUTER_PHASE_MESSAGES] = wait - work;
    t = r->t_arrival_ns;
    for (int p = 0; p < EPD_ROUTER_PHASES; p++) {
        epd_prom_histo_observe_ns(&rt->m.phase[p], ns[p]);
        if (ns[p] > 0) {
            epd_trace_span(rt->trace, span_names[p], "ttft", ev->request_id, -1, t, t + ns[p]);
        }
        t += ns[p];
    }
    epd_prom_histo_observe(&rt->m.req_prompt_tokens, r->n_prompt);
    epd_prom_histo_observe(&rt->m.req_cached_tokens, cached);
    rt->m.cached_tokens += cached;
    r->cached_tokens = cached;
}

/* Hands group member i (PARSED) to the request path, its HTTP side the
 * group's (NULL when the group is already answered: it just ends). */
static void epd_router_group_start_member(epd_router_t *rt, epd_router_group_t *g, uint32_t i,
                                          uint64_t now_ns)
{
    epd_router_req_t *m = g->members[i];

    if (m == NULL || g->started[i]) {
        return;
    }
    g->started[i] = 1;
    g->refs++; /* dropped when it is freed */
    m->http = g->http;
    m->queue_deadline_ns = now_ns + (uint64_t)rt->queue_timeout_ms * 1000000ull;
    epd_router_req_advance(rt, m, NULL, now_ns);
    rt->queue_kick = 1; /* the event's handler walks the queue once it is done */
}

/* The attempt's first tokens: the prefill worker ran with every image's
 * embeddings (it has them cached now), and its prompt no longer waits. */
static void epd_router_first_tokens(epd_router_t *rt, epd_router_req_t *r,
                                    const epd_client_event_t *ev, uint64_t now)
{
    for (uint32_t k = 0; k < r->n_images && r->pw != NULL; k++) {
        epd_router_cache_add(r->pw, r->img_hash[k], now);
        rt->m.images++;
        rt->m.image_cache_hits += r->img_src[k] == EPD_ROUTER_IMG_CACHE;
        rt->m.images_encoded += r->img_src[k] == EPD_ROUTER_IMG_ENCODER;
        rt->m.images_local += r->img_src[k] == EPD_ROUTER_IMG_INLINE;
    }
    if (r->n_out == 0) {
        epd_router_histo_observe(&rt->m.ttft, (double)(now - r->t_arrival_ns) / 1e9);
        epd_router_phases(rt, r, ev, now);
        if (r->group != NULL && r->choice % r->group->n_choices == 0) {
            /* a leader's prompt is prefilled and cached: its other
             * choices now (queued behind what waits; started from an
             * event, so the queue's walk runs them) */
            epd_router_group_t *g = r->group;

            for (uint32_t i = r->choice + 1; i < r->choice + g->n_choices; i++) {
                if (g->members[i] != NULL && r->pw != NULL) {
                    snprintf(g->members[i]->pin_prefill, sizeof(g->members[i]->pin_prefill),
                             "%s", r->pw->info.worker_id);
                }
                epd_router_group_start_member(rt, g, i, now);
            }
        }
    }
    epd_trace_span(rt->trace, "wait for first token", "router", ev->request_id, -1, r->t_submit_ns,
                   now);
    if (r->pw != NULL) {
        epd_router_prompt_left_queue(r);
        if (r->dw != NULL) {
            epd__router_pair_ok(rt, r->pw, r->dw);
        }
    }
}

/* Tokens of the attempt in flight (any state of it): recorded, and their
 * text goes to the client while its HTTP side is open — the text may end
 * it (a stop string; a failure of ours). */
static void epd_router_on_tokens(epd_router_t *rt, epd_router_req_t *r,
                                 const epd_client_event_t *ev, uint64_t now)
{
    uint32_t n_text;
    int stop;

    if (r->n_out == r->n_base) {
        epd_router_first_tokens(rt, r, ev, now);
    } else {
        epd_router_histo_observe(&rt->m.itl, (double)(now - r->t_last_ns) / 1e9);
    }
    r->t_last_ns = now;
    epd_trace_instant(rt->trace, "TokenChunk received", "msg", ev->request_id, -1, now);
    /* kept for a migration (the client never sends more than max_tokens) */
    if (r->out != NULL && ev->n_tokens <= r->max_new - r->n_out) {
        memcpy(r->out + r->n_out, ev->tokens, (size_t)ev->n_tokens * sizeof(uint32_t));
    }
    if (r->oai->want_logprobs && ev->logprobs != NULL && ev->n_tokens <= r->max_new - r->n_out) {
        if (r->lps == NULL) {
            r->lp_ids = epd_calloc(r->max_new, sizeof(*r->lp_ids));
            r->lps = epd_calloc(r->max_new, sizeof(*r->lps));
        }
        if (r->lps != NULL && r->lp_ids != NULL) {
            memcpy(r->lp_ids + r->n_out, ev->tokens, (size_t)ev->n_tokens * sizeof(uint32_t));
            memcpy(r->lps + r->n_out, ev->logprobs, (size_t)ev->n_tokens * sizeof(*r->lps));
        }
    }
    r->n_out += ev->n_tokens;
    if (r->http == NULL) {
        return; /* answered, or the client is gone: ABORTING */
    }
    n_text = ev->n_tokens;
    if (n_text > 0) {
        /* a stop token id ends the text without its own (as vLLM's): it
         * ends the generation, so it can only be a chunk's last token (its
         * finish may come in a chunk of its own); EOS is a special token
         * the detokenizer drops anyway */
        for (size_t i = 0; i < r->oai->n_stop_token_ids; i++) {
            if (r->oai->stop_token_ids[i] == ev->tokens[n_text - 1]) {
                n_text--;
                break;
            }
        }
    }
    if (epd__router_text_append(rt, r, ev->tokens, n_text) != 0) {
        epd__router_fail_http(rt, r, EPD_ROUTER_ERR_INTERNAL, 500,
                              "cannot detokenize the output%s%s", "", "");
    } else if ((stop = epd__router_after_text(rt, r)) > 0) {
        epd__router_finish_ok(rt, r, EPD_OAI_FINISH_STOP);
    } else if (stop < 0) {
        epd__router_fail_http(rt, r, EPD_ROUTER_ERR_INTERNAL, 500, "out of memory%s%s", "", "");
    }
}

/*
 * The queue's walk, oldest first: each request not backing off gets its
 * turn to try; one that finds no room stops the walk (first come, first
 * served: a newer request does not pass an older one that waits for room;
 * those backing off are passed).
 */
static void epd_router_queue_run(epd_router_t *rt, uint64_t now_ns)
{
    if (rt->queue_walking) {
        rt->queue_again = 1; /* from an event inside a turn: the walk starts over */
        return;
    }
    rt->queue_walking = 1;
    do {
        rt->queue_again = 0;
        for (epd_router_req_t *r = rt->wait_head, *next; r != NULL; r = next) {
            next = r->wnext;
            if (r->retry_at_ns > now_ns) {
                continue;
            }
            r->turn = 1;
            rt->queue_stalled = 0;
            epd_router_req_advance(rt, r, NULL, now_ns); /* (r may be freed now) */
            if (rt->queue_again) {
                break; /* the queue changed under this walk: `next` may be stale */
            }
            if (rt->queue_stalled) {
                break;
            }
        }
    } while (rt->queue_again);
    rt->queue_walking = 0;
}

void epd__router_on_event(void *arg, const epd_client_event_t *ev)
{
    epd_router_t *rt = arg;
    epd_router_req_t *r = ev->user;
    uint64_t now = epd_time_now_ns();
    int terminal = ev->terminal || ev->kind != EPD_CLIENT_EV_TOKENS;

    if (ev->kind == EPD_CLIENT_EV_TOKENS && ev->n_tokens > 0) {
        epd_router_on_tokens(rt, r, ev, now);
    }
    /* an ERROR or a REFUSED is always an attempt's last event */
    epd_router_req_advance(rt, r, terminal ? ev : NULL, now);
    if ((terminal || rt->queue_kick) && rt->wait_head != NULL) {
        /* an attempt's end may have made room; a group's choices may have
         * joined the queue */
        rt->queue_kick = 0;
        epd_router_queue_run(rt, now);
    }
}

/* The HTTP client went away (the HTTP request is invalid once this
 * returns). */
static void epd_router_on_http_abort(epd_http_req_t *http, void *arg)
{
    epd_router_req_t *r = arg;
    epd_router_t *rt = r->rt;

    (void)http;
    if (r->http != NULL) {
        r->http = NULL;
        rt->m.errors[EPD_ROUTER_ERR_CLIENT_GONE]++;
    }
    epd_router_req_advance(rt, r, NULL, epd_time_now_ns());
}

void epd__router_tick(epd_router_t *rt, uint64_t now_ns)
{
    uint32_t died = 0;

    epd_router_registry_tick(&rt->reg, now_ns, &died);
    rt->m.workers_died += died;
    epd_router_drain_sample(&rt->drain, rt->m.ok, now_ns);
    /* the waiting: first their clocks (queue timeout, deadline), then the
     * walk (heartbeats may have brought room, a backoff may be over) */
    for (epd_router_req_t *r = rt->wait_head, *next; r != NULL; r = next) {
        next = r->wnext;
        epd_router_req_advance(rt, r, NULL, now_ns);
    }
    epd_router_queue_run(rt, now_ns);
}

void epd__router_req_poke(epd_router_t *rt, epd_router_req_t *r, uint64_t now_ns)
{
    epd_router_req_advance(rt, r, NULL, now_ns);
}

void epd__router_req_start(epd_router_t *rt, epd_router_req_t *r, uint64_t now_ns)
{
    assert(r->state == EPD_ROUTER_REQ_PARSED);
    r->queue_deadline_ns = now_ns + (uint64_t)rt->queue_timeout_ms * 1000000ull;
    epd_router_req_advance(rt, r, NULL, now_ns);
    /* in line: its turn comes at once when nobody older waits for room */
    epd_router_queue_run(rt, now_ns);
}
