/*
 * epd_client_req.c — the client's request path (see epd_client.h): the
 * table of live requests, submit, abort, what comes back from the workers,
 * deadlines.
 *
 * Design: a hash table of live requests keyed by request id; a request
 * holds its workers (prefill, decode, the encoders of its images) so that
 * a worker's endpoint failure finds and fails exactly the requests that
 * depend on it.  The terminal event is delivered after the request left
 * the table (and its memory is freed after the callback returned), which
 * makes "one terminal event, then silence" structural rather than a matter
 * of care, and lets the callback submit or abort freely.
 *
 * A request the caller aborted ends as an abort whatever order the
 * workers' messages cross in: the decode worker's final chunk (finish
 * ABORT), or an Error from any of its workers, which is then reported as
 * EPD_ERR_CANCELED (with the worker's own text) — the worker may well say
 * NOT_FOUND when our Abort reached it after it had let the request go, but
 * the caller asked to stop it, and stopped is what it is.
 *
 * Everything here runs on the owner thread, from the transport's callbacks
 * or the caller's own calls; it calls nothing of the client's other files.
 */
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "epd_alloc.h"
#include "epd_client_int.h"
#include "epd_log.h"
#include "epd_time.h"

static const char *epd_client_role_name(int role)
{
    return role == EPD_CLIENT_ROLE_PREFILL   ? "prefill"
           : role == EPD_CLIENT_ROLE_DECODE  ? "decode"
           : role == EPD_CLIENT_ROLE_ENCODER ? "encoder"
                                             : "other";
}

/* ------------------------------------------------------------- requests */

static uint32_t epd_client_bucket(uint64_t id)
{
    id ^= id >> 33;
    id *= 0xff51afd7ed558ccdULL;
    id ^= id >> 33;
    return (uint32_t)(id & (EPD__CLIENT_BUCKETS - 1));
}

static epd__client_req_t *epd_client_req_find(const epd_client_t *c, uint64_t id)
{
    for (epd__client_req_t *r = c->buckets[epd_client_bucket(id)]; r != NULL; r = r->hnext) {
        if (r->id == id) {
            return r;
        }
    }
    return NULL;
}

static void epd_client_req_insert(epd_client_t *c, epd__client_req_t *r)
{
    uint32_t b = epd_client_bucket(r->id);

    r->hnext = c->buckets[b];
    c->buckets[b] = r;
    c->live++;
}

static void epd_client_req_unlink(epd_client_t *c, epd__client_req_t *r)
{
    epd__client_req_t **pp = &c->buckets[epd_client_bucket(r->id)];

    while (*pp != NULL && *pp != r) {
        pp = &(*pp)->hnext;
    }
    if (*pp == r) {
        *pp = r->hnext;
        c->live--;
    }
}

/* Encodes an envelope with the client's sender into txbuf and sends it. */
static epd_status_t epd_client_send_env(epd_client_t *c, epd_client_worker_t *w, Epd__Envelope *env)
{
    Epd__Epoch epoch = EPD__EPOCH__INIT;
    Epd__SenderRef sender = EPD__SENDER_REF__INIT;
    size_t len;
    epd_status_t status;

    if (w->state != EPD_OK || w->ep == NULL) {
        return w->state != EPD_OK ? w->state : EPD_ERR_PEER_DEAD;
    }
    epoch.start_time_ns = c->epoch_start_ns;
    epoch.nonce = c->epoch_nonce;
    sender.worker_id = c->worker_id;
    sender.epoch = &epoch;
    env->sender = &sender;
    env->seq = ++c->seq;
    status = epd_msg_encode(env, c->txbuf, c->cfg.max_msg_size, &len);
    env->sender = NULL;
    if (status != EPD_OK) {
        return status;
    }
    return epd_xport_send(w->ep, c->txbuf, len, 0);
}

static epd_status_t epd_client_send_abort(epd_client_t *c, epd_client_worker_t *w, uint64_t id,
                                          epd_status_t why, const char *reason)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__Abort ab = EPD__ABORT__INIT;

    ab.request_id = id;
    ab.status = why;
    ab.reason = (char *)reason;
    env.body_case = EPD__ENVELOPE__BODY_ABORT;
    env.abort = &ab;
    return epd_client_send_env(c, w, &env);
}

/* Whom epd_client_abort_sides sends Abort to (the encoders of the request's
 * images go with either). */
#define EPD_CLIENT_ABORT_PREFILL 0x1u
#define EPD_CLIENT_ABORT_DECODE 0x2u
#define EPD_CLIENT_ABORT_ALL (EPD_CLIENT_ABORT_PREFILL | EPD_CLIENT_ABORT_DECODE)

/* Sends Abort to the request's workers named by `to` (EPD_CLIENT_ABORT_*);
 * an Abort that cannot be sent now is left pending for epd_client_tick,
 * one that cannot be sent at all (dead endpoint) is dropped. */
static void epd_client_abort_sides(epd_client_t *c, epd__client_req_t *r, unsigned to,
                                   epd_status_t why, const char *reason)
{
    epd_status_t s;

    /* the encoders of its images always (a no-op for them once done) */
    for (uint32_t i = 0; i < r->n_enc; i++) {
        if (to != 0 && r->enc[i]->state == EPD_OK) {
            s = epd_client_send_abort(c, r->enc[i], r->id, why, reason);
            if (s == EPD_ERR_NO_RESOURCE) {
                r->abort_pending_e |= 1u << i;
            } else {
                r->abort_pending_e &= ~(1u << i);
            }
        }
    }
    if ((to & EPD_CLIENT_ABORT_DECODE) != 0) {
        s = epd_client_send_abort(c, r->decode, r->id, why, reason);
        r->abort_pending_d = s == EPD_ERR_NO_RESOURCE;
    }
    if ((to & EPD_CLIENT_ABORT_PREFILL) != 0) {
        s = epd_client_send_abort(c, r->prefill, r->id, why, reason);
        r->abort_pending_p = s == EPD_ERR_NO_RESOURCE;
    }
}

/* Ends `r`: out of the table first, then the terminal callback, then free.
 * An Abort still pending for it is sent once more, best effort. */
static void epd_client_req_end(epd_client_t *c, epd__client_req_t *r, epd_client_event_t *ev)
{
    epd_client_req_unlink(c, r);
    if (r->abort_pending_d) {
        (void)epd_client_send_abort(c, r->decode, r->id, EPD_ERR_CANCELED, "client abort");
    }
    if (r->abort_pending_p) {
        (void)epd_client_send_abort(c, r->prefill, r->id, EPD_ERR_CANCELED, "client abort");
    }
    for (uint32_t i = 0; i < r->n_enc; i++) {
        if ((r->abort_pending_e & (1u << i)) != 0 && r->enc[i]->state == EPD_OK) {
            (void)epd_client_send_abort(c, r->enc[i], r->id, EPD_ERR_CANCELED, "client abort");
        }
    }
    ev->request_id = r->id;
    ev->user = r->user;
    ev->terminal = 1;
    c->cfg.event_cb(c->cfg.cb_arg, ev);
    epd_free(r);
}

static void epd_client_req_fail(epd_client_t *c, epd__client_req_t *r, epd_client_ev_kind_t kind,
                                epd_status_t status, const char *message, const char *from)
{
    epd_client_event_t ev;

    memset(&ev, 0, sizeof(ev));
    ev.kind = kind;
    ev.status = status;
    ev.message = message != NULL ? message : "";
    ev.from = from != NULL ? from : "client";
    ev.culprit = c->culprit;
    epd_client_req_end(c, r, &ev);
    c->culprit[0] = '\0';
}

/* ------------------------------------------------------------- incoming */

static int epd_client_sender_is(const Epd__SenderRef *s, const epd_client_worker_t *w)
{
    return strcmp(s->worker_id, w->info.worker_id) == 0 &&
           s->epoch->start_time_ns == w->info.epoch_start_ns &&
           s->epoch->nonce == w->info.epoch_nonce;
}

/* A chunk's TokenLogprobs into lps[0..n_tokens): 0, or -1 for a malformed
 * one (ids beyond the worker's vocabulary are the router's to check: the
 * client knows none, so it bounds them by UINT32_MAX only). */
static int epd_client_chunk_logprobs(epd_client_t *c, const epd__client_req_t *r,
                                     const Epd__TokenChunk *tc, epd_sample_logprob_t *lps)
{
    (void)c;
    (void)r;
    for (size_t i = 0; i < tc->n_tokens; i++) {
        if (epd_token_logprob_read(tc->logprobs[i], UINT32_MAX, &lps[i]) != 0) {
            return -1;
        }
    }
    return 0;
}

static void epd_client_on_chunk(epd_client_t *c, epd__client_req_t *r, const Epd__TokenChunk *tc)
{
    /* (chunks with logprobs carry at most EPD_CLIENT_LP_CHUNK_MAX tokens) */
    epd_sample_logprob_t lps[EPD_CLIENT_LP_CHUNK_MAX];
    epd_client_phase_times_t times;
    epd_client_event_t ev;
    char msg[160];

    if (tc->index != r->next_index) {
        snprintf(msg, sizeof(msg), "token chunk out of order: index %u, expected %u", tc->index,
                 r->next_index);
        epd_log_warn(EPD__CLIENT_LOG, r->id, "%s (from %s)", msg, r->decode->info.worker_id);
        epd_client_abort_sides(c, r, EPD_CLIENT_ABORT_ALL, EPD_ERR_MALFORMED, msg);
        epd_client_req_fail(c, r, EPD_CLIENT_EV_ERROR, EPD_ERR_MALFORMED, msg,
                            r->decode->info.worker_id);
        return;
    }
    if (tc->n_tokens > (size_t)(r->max_tokens - r->next_index)) {
        snprintf(msg, sizeof(msg), "token chunk beyond max_tokens: %zu tokens at index %u of %u",
                 tc->n_tokens, tc->index, r->max_tokens);
        epd_log_warn(EPD__CLIENT_LOG, r->id, "%s (from %s)", msg, r->decode->info.worker_id);
        epd_client_abort_sides(c, r, EPD_CLIENT_ABORT_ALL, EPD_ERR_MALFORMED, msg);
        epd_client_req_fail(c, r, EPD_CLIENT_EV_ERROR, EPD_ERR_MALFORMED, msg,
                            r->decode->info.worker_id);
        return;
    }
    if ((int)tc->finish < EPD_CLIENT_FINISH_NONE || (int)tc->finish > EPD_CLIENT_FINISH_ERROR) {
        snprintf(msg, sizeof(msg), "token chunk with unknown finish reason %d", (int)tc->finish);
        epd_log_warn(EPD__CLIENT_LOG, r->id, "%s (from %s)", msg, r->decode->info.worker_id);
        epd_client_abort_sides(c, r, EPD_CLIENT_ABORT_ALL, EPD_ERR_MALFORMED, msg);
        epd_client_req_fail(c, r, EPD_CLIENT_EV_ERROR, EPD_ERR_MALFORMED, msg,
                            r->decode->info.worker_id);
        return;
    }
    if (r->logprobs > 0 &&
        (tc->n_logprobs != tc->n_tokens || tc->n_tokens > EPD_CLIENT_LP_CHUNK_MAX ||
         epd_client_chunk_logprobs(c, r, tc, lps) != 0)) {
        snprintf(msg, sizeof(msg), "token chunk of %zu tokens with %zu bad or missing logprobs",
                 tc->n_tokens, tc->n_logprobs);
        epd_log_warn(EPD__CLIENT_LOG, r->id, "%s (from %s)", msg, r->decode->info.worker_id);
        epd_client_abort_sides(c, r, EPD_CLIENT_ABORT_ALL, EPD_ERR_MALFORMED, msg);
        epd_client_req_fail(c, r, EPD_CLIENT_EV_ERROR, EPD_ERR_MALFORMED, msg,
                            r->decode->info.worker_id);
        return;
    }
    memset(&ev, 0, sizeof(ev));
    ev.logprobs = r->logprobs > 0 ? lps : NULL;
    if (tc->times != NULL && tc->index == 0) {
        times.encode_ns = tc->times->encode_ns;
        times.prefill_queue_ns = tc->times->prefill_queue_ns;
        times.prefill_compute_ns = tc->times->prefill_compute_ns;
        times.kv_tail_ns = tc->times->kv_tail_ns;
        times.handoff_ns = tc->times->handoff_ns;
        times.cached_tokens = tc->times->cached_tokens;
        ev.times = &times;
    }
    ev.kind = EPD_CLIENT_EV_TOKENS;
    ev.index = tc->index;
    ev.tokens = tc->tokens;
    ev.n_tokens = (uint32_t)tc->n_tokens;
    ev.finish = (int)tc->finish;
    ev.status = EPD_OK;
    ev.message = "";
    ev.from = r->decode->info.worker_id;
    ev.culprit = "";
    r->next_index += (uint32_t)tc->n_tokens;
    if (tc->finish != EPD__FINISH_REASON__FINISH_NONE) {
        epd_client_req_end(c, r, &ev);
        return;
    }
    if (tc->n_tokens == 0) {
        epd_log_debug(EPD__CLIENT_LOG, r->id, "empty token chunk without finish");
        return;
    }
    ev.request_id = r->id;
    ev.user = r->user;
    ev.terminal = 0;
    c->cfg.event_cb(c->cfg.cb_arg, &ev);
}

/* An error status on the wire should be negative; anything else is
 * reported as a fatal error of the peer, never as success. */
static epd_status_t epd_client_wire_status(int32_t status)
{
    return status < 0 ? (epd_status_t)status : EPD_ERR_FATAL;
}

/* A worker's failure message (Error, Abort, KvRefused) ended a request
 * the caller had aborted: it ends as the abort it is — EPD_ERR_CANCELED,
 * the worker's own text kept — whatever the worker says (NOT_FOUND when
 * our Abort reached it after it had let the request go; its own failure
 * when that crossed our Abort on the way).  Every worker of the request
 * was sent an Abort already (one still pending goes once more at the
 * end), so nobody else needs telling. */
static void epd_client_end_aborted(epd_client_t *c, epd__client_req_t *r, const Epd__Envelope *env,
                                   epd_status_t said, const char *text)
{
    char from[EPD_CLIENT_NAME_MAX];

    epd_log_debug(EPD__CLIENT_LOG, r->id, "%s from %s after the abort (%s: %s): ends as aborted",
                  epd_msg_body_name(env), env->sender->worker_id, epd_status_name(said), text);
    epd__client_copy_str(from, sizeof(from), env->sender->worker_id);
    epd_client_req_fail(c, r, EPD_CLIENT_EV_ERROR, EPD_ERR_CANCELED, text, from);
}

/* Is `env` sent as the member its endpoint authenticated (worker id and
 * epoch)?  A member may not speak for another: inject tokens into its
 * streams, end its requests. */
static int epd_client_sender_authentic(const epd_xport_ep_t *ep, const Epd__Envelope *env)
{
    epd_xport_identity_t id;
    epd_msg_epoch_t e = epd_msg_epoch_of(env->sender->epoch);
    int authenticated = 0;

    return epd_xport_ep_identity(ep, &id, &authenticated) == EPD_OK && authenticated &&
           strcmp(id.worker_id, env->sender->worker_id) == 0 &&
           id.epoch.start_time_ns == e.start_time_ns && id.epoch.nonce == e.nonce;
}

void epd__client_on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    epd_client_t *c = arg;
    Epd__Envelope *env = NULL;
    epd__client_req_t *r;
    const char *why = NULL;
    int from_p;
    int from_d;
    uint64_t id;

    if (epd_msg_decode(data, len, &env, &why) != EPD_OK) {
        uint64_t now = epd_time_now_ns();

        c->stats.bad_frames++;
        if (now - c->last_bad_log_ns > EPD_NSEC_PER_SEC) {
            c->last_bad_log_ns = now;
            epd_log_warn(EPD__CLIENT_LOG, 0, "dropped a request-plane frame of %zu bytes: %s", len,
                         why != NULL ? why : "does not decode");
        }
        return;
    }
    id = epd_msg_request_id(env);
    if (c->authenticating && !epd_client_sender_authentic(ep, env)) {
        c->stats.forged++;
        epd_log_debug(EPD__CLIENT_LOG, id, "%s claiming to be from %s on another's endpoint: "
                      "dropped", epd_msg_body_name(env), env->sender->worker_id);
        goto out;
    }
    r = epd_client_req_find(c, id);
    if (r == NULL) {
        c->stats.unknown_ids++;
        epd_log_debug(EPD__CLIENT_LOG, id, "%s from %s: unknown request id, ignored",
                      epd_msg_body_name(env), env->sender->worker_id);
        goto out;
    }
    from_p = epd_client_sender_is(env->sender, r->prefill);
    from_d = epd_client_sender_is(env->sender, r->decode);
    if (!from_p && !from_d) {
        for (uint32_t i = 0; i < r->n_enc; i++) {
            if (epd_client_sender_is(env->sender, r->enc[i]) &&
                (env->body_case == EPD__ENVELOPE__BODY_ERROR ||
                 env->body_case == EPD__ENVELOPE__BODY_ABORT)) {
                /* an image failed on its encoder: the request is over */
                int is_err = env->body_case == EPD__ENVELOPE__BODY_ERROR;
                epd_status_t st =
                    epd_client_wire_status(is_err ? env->error->status : env->abort->status);
                const char *text = is_err ? env->error->message : env->abort->reason;
                char from[EPD_CLIENT_NAME_MAX];

                if (r->aborted) {
                    epd_client_end_aborted(c, r, env, st, text);
                    goto out;
                }
                epd_log_info(EPD__CLIENT_LOG, id, "%s from encoder %s: %s: %s",
                             epd_msg_body_name(env), env->sender->worker_id, epd_status_name(st),
                             text);
                epd_client_abort_sides(c, r, EPD_CLIENT_ABORT_ALL, st,
                                       "an image of the request failed");
                epd__client_copy_str(from, sizeof(from), env->sender->worker_id);
                epd_client_req_fail(c, r, EPD_CLIENT_EV_ERROR, st, text, from);
                goto out;
            }
        }
    }
    if (!from_p && !from_d) {
        c->stats.foreign_sender++;
        epd_log_warn(EPD__CLIENT_LOG, id,
                     "%s from %s (epoch %llu/%llx) is neither this request's prefill nor "
                     "decode incarnation, ignored",
                     epd_msg_body_name(env), env->sender->worker_id,
                     (unsigned long long)env->sender->epoch->start_time_ns,
                     (unsigned long long)env->sender->epoch->nonce);
        goto out;
    }
    switch (env->body_case) {
    case EPD__ENVELOPE__BODY_TOKENS:
        if (!from_d) {
            c->stats.unexpected++;
            epd_log_warn(EPD__CLIENT_LOG, id, "token chunk from the prefill worker %s, ignored",
                         env->sender->worker_id);
            break;
        }
        epd_client_on_chunk(c, r, env->tokens);
        break;
    case EPD__ENVELOPE__BODY_ERROR:
    case EPD__ENVELOPE__BODY_ABORT: {
        int is_err = env->body_case == EPD__ENVELOPE__BODY_ERROR;
        epd_status_t st = epd_client_wire_status(is_err ? env->error->status : env->abort->status);
        const char *text = is_err ? env->error->message : env->abort->reason;
        char from[EPD_CLIENT_NAME_MAX];

        if (r->aborted && from_p && !from_d) {
            /* after an abort, the decode worker gives the final answer */
            epd_log_debug(EPD__CLIENT_LOG, id, "%s from prefill %s after abort: %s",
                          epd_msg_body_name(env), env->sender->worker_id, text);
            break;
        }
        if (r->aborted) {
            epd_client_end_aborted(c, r, env, st, text);
            break;
        }
        epd_log_info(EPD__CLIENT_LOG, id, "%s from %s %s: %s: %s", epd_msg_body_name(env),
                     from_p ? "prefill" : "decode", env->sender->worker_id, epd_status_name(st),
                     text);
        /* the other side may still hold the request: tell it */
        epd_client_abort_sides(
            c, r, (from_p ? 0 : EPD_CLIENT_ABORT_PREFILL) | (from_d ? 0 : EPD_CLIENT_ABORT_DECODE),
            st, "the other worker failed the request");
        epd__client_copy_str(from, sizeof(from), env->sender->worker_id);
        epd__client_copy_str(c->culprit, sizeof(c->culprit), is_err ? env->error->culprit : NULL);
        epd_client_req_fail(c, r, EPD_CLIENT_EV_ERROR, st, text, from);
        break;
    }
    case EPD__ENVELOPE__BODY_REFUSED: {
        char from[EPD_CLIENT_NAME_MAX];

        if (r->aborted) {
            epd_client_end_aborted(c, r, env, epd_client_wire_status(env->refused->status),
                                   env->refused->reason);
            break;
        }
        epd_log_info(EPD__CLIENT_LOG, id, "refused by %s: %s: %s", env->sender->worker_id,
                     epd_status_name(epd_client_wire_status(env->refused->status)),
                     env->refused->reason);
        if (!from_d) {
            /* the decode worker tells the prefill worker itself; a refusal
             * relayed by the prefill side leaves decode unaware */
            epd_client_abort_sides(c, r, EPD_CLIENT_ABORT_DECODE, EPD_ERR_NO_CAPACITY,
                                   "refused by the prefill worker");
        }
        epd__client_copy_str(from, sizeof(from), env->sender->worker_id);
        epd_client_req_fail(c, r, EPD_CLIENT_EV_REFUSED,
                            epd_client_wire_status(env->refused->status), env->refused->reason,
                            from);
        break;
    }
    default:
        c->stats.unexpected++;
        epd_log_warn(EPD__CLIENT_LOG, id, "unexpected %s from %s, ignored", epd_msg_body_name(env),
                     env->sender->worker_id);
        break;
    }
out:
    epd_msg_free(env);
}

/* Fails every request that uses `w` (the worker's endpoint is gone). */
void epd__client_worker_failed(epd_client_t *c, epd_client_worker_t *w, epd_status_t status)
{
    char msg[256];

    if (w->state != EPD_OK) {
        return;
    }
    w->state = status == EPD_OK ? EPD_ERR_PEER_DEAD : status;
    epd_log_warn(EPD__CLIENT_LOG, 0, "%s worker %s: endpoint failed: %s",
                 epd_client_role_name(w->info.role), w->info.worker_id, epd_status_string(status));
    if (w->ep != NULL) {
        epd_xport_ep_close(w->ep);
        w->ep = NULL;
    }
    snprintf(msg, sizeof(msg), "%s worker %s is unreachable: %s",
             epd_client_role_name(w->info.role), w->info.worker_id, epd_status_string(status));
    for (uint32_t b = 0; b < EPD__CLIENT_BUCKETS; b++) {
        epd__client_req_t *r = c->buckets[b];

        while (r != NULL) {
            epd__client_req_t *next = r->hnext;

            int uses = r->prefill == w || r->decode == w;

            for (uint32_t i = 0; i < r->n_enc; i++) {
                uses |= r->enc[i] == w;
            }
            if (uses) {
                unsigned to = (r->prefill != w ? EPD_CLIENT_ABORT_PREFILL : 0) |
                              (r->decode != w ? EPD_CLIENT_ABORT_DECODE : 0);

                epd_client_abort_sides(c, r, to, EPD_ERR_PEER_DEAD, msg);
                epd_client_req_fail(c, r, EPD_CLIENT_EV_ERROR, EPD_ERR_PEER_DEAD, msg, "client");
                /* the callback may have ended or added requests anywhere:
                 * restart this bucket */
                next = c->buckets[b];
            }
            r = next;
        }
    }
}

/* ------------------------------------------------------------- submit */

/* Request ids are random (libsodium's CSPRNG): a stranger who sees some
 * cannot guess the next ones, nor another client's; the top bit stays clear
 * (ids travel as signed numbers in some tools). */
static uint64_t epd_client_next_id(epd_client_t *c)
{
    uint64_t id;

    do {
        randombytes_buf(&id, sizeof(id));
        id &= 0x7fffffffffffffffULL;
    } while (id == 0 || epd_client_req_find(c, id) != NULL);
    return id;
}

epd_status_t epd_client_submit(epd_client_t *c, const epd_client_request_t *q,
                               uint64_t *request_id_p)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__GenerateRequest g = EPD__GENERATE_REQUEST__INIT;
    Epd__SamplingParams sp = EPD__SAMPLING_PARAMS__INIT;
    Epd__Epoch pe = EPD__EPOCH__INIT;
    Epd__Epoch de = EPD__EPOCH__INIT;
    epd__client_req_t *r;
    epd_status_t status;

    Epd__MediaRef mrefs[EPD_CLIENT_MEDIA_MAX];
    Epd__MediaRef *mptrs[EPD_CLIENT_MEDIA_MAX];
    Epd__Epoch mepochs[EPD_CLIENT_MEDIA_MAX];
    uint32_t n_encodes = 0;

    if (q->prompt == NULL || q->n_prompt == 0 || q->max_tokens == 0 || q->deadline_ms == 0 ||
        q->prefill == NULL || q->decode == NULL ||
        q->prefill->info.role != EPD_CLIENT_ROLE_PREFILL ||
        q->decode->info.role != EPD_CLIENT_ROLE_DECODE ||
        (q->n_stop_ids > 0 && q->stop_ids == NULL) ||
        (q->n_bias > 0 && (q->bias_ids == NULL || q->bias_values == NULL)) ||
        q->n_media > EPD_CLIENT_MEDIA_MAX || (q->n_media > 0 && q->media == NULL) ||
        (q->resume_generated > 0 && (q->resume_generated >= q->n_prompt ||
                                     q->resume_generated >= q->max_tokens || q->n_media > 0))) {
        return EPD_ERR_INVALID_PARAM;
    }
    for (uint32_t i = 0; i < q->n_media; i++) {
        const epd_client_media_t *m = &q->media[i];

        if (m->hash == NULL || (m->encoder != NULL || m->inline_data) != (m->image_len > 0) ||
            (m->image_len > 0 && m->image == NULL) ||
            (m->encoder != NULL && m->encoder->info.role != EPD_CLIENT_ROLE_ENCODER)) {
            return EPD_ERR_INVALID_PARAM;
        }
        if (m->encoder != NULL && m->encoder->state != EPD_OK) {
            return m->encoder->state;
        }
    }
    if (q->prefill->state != EPD_OK) {
        return q->prefill->state;
    }
    if (q->decode->state != EPD_OK) {
        return q->decode->state;
    }
    r = epd_calloc(1, sizeof(*r));
    if (r == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < q->n_media; i++) {
        epd_client_worker_t *e = q->media[i].encoder;
        uint32_t k;

        if (e == NULL) {
            continue;
        }
        n_encodes++;
        for (k = 0; k < r->n_enc && r->enc[k] != e; k++) {
        }
        if (k == r->n_enc) {
            r->enc[r->n_enc++] = e;
        }
    }
    r->id = epd_client_next_id(c);
    r->user = q->user;
    r->prefill = q->prefill;
    r->decode = q->decode;
    r->max_tokens = q->max_tokens;
    r->logprobs = q->logprobs;
    r->next_index = q->resume_generated; /* (the tokens before came in an earlier attempt) */
    r->deadline_ns = epd_time_now_ns() + (uint64_t)q->deadline_ms * EPD_NSEC_PER_MSEC;

    sp.temperature = q->temperature;
    sp.top_p = q->top_p;
    sp.top_k = q->top_k;
    sp.seed = q->seed;
    sp.max_tokens = q->max_tokens;
    sp.presence_penalty = q->presence_penalty;
    sp.frequency_penalty = q->frequency_penalty;
    sp.repetition_penalty = q->repetition_penalty;
    sp.n_logit_bias_ids = q->n_bias;
    sp.logit_bias_ids = (uint32_t *)q->bias_ids;
    sp.n_logit_bias_values = q->n_bias;
    sp.logit_bias_values = (float *)q->bias_values;
    sp.min_tokens = q->min_tokens;
    sp.ignore_eos = q->ignore_eos != 0;
    sp.logprobs = q->logprobs;
    sp.n_stop_token_ids = q->n_stop_ids;
    sp.stop_token_ids = (uint32_t *)q->stop_ids;
    pe.start_time_ns = q->prefill->info.epoch_start_ns;
    pe.nonce = q->prefill->info.epoch_nonce;
    de.start_time_ns = q->decode->info.epoch_start_ns;
    de.nonce = q->decode->info.epoch_nonce;
    g.request_id = r->id;
    g.n_prompt_tokens = q->n_prompt;
    g.prompt_tokens = (uint32_t *)q->prompt;
    g.sampling = &sp;
    g.prefill_worker_id = q->prefill->info.worker_id;
    g.decode_worker_id = q->decode->info.worker_id;
    g.prefill_address.data = q->prefill->info.address;
    g.prefill_address.len = q->prefill->info.address_len;
    g.decode_address.data = q->decode->info.address;
    g.decode_address.len = q->decode->info.address_len;
    g.prefill_epoch = &pe;
    g.decode_epoch = &de;
    g.deadline_ms = q->deadline_ms;
    g.cache_salt.data = (uint8_t *)q->cache_salt;
    g.cache_salt.len = q->cache_salt != NULL ? q->cache_salt_len : 0;
    g.resume_generated = q->resume_generated;
    env.body_case = EPD__ENVELOPE__BODY_GENERATE;
    env.generate = &g;

    /* decode first: it reserves while prefill already computes; it gets
     * no media (only the tokens matter to it) */
    status = epd_client_send_env(c, r->decode, &env);
    if (status != EPD_OK) {
        goto err_free_req;
    }
    for (uint32_t i = 0; i < q->n_media; i++) {
        const epd_client_media_t *m = &q->media[i];

        epd__media_ref__init(&mrefs[i]);
        epd__epoch__init(&mepochs[i]);
        mrefs[i].kind = "image";
        mrefs[i].content_hash.data = (uint8_t *)m->hash;
        mrefs[i].content_hash.len = 32;
        mrefs[i].n_embeddings = m->n;
        mrefs[i].placeholder_pos = m->pos;
        if (m->encoder != NULL) {
            mepochs[i].start_time_ns = m->encoder->info.epoch_start_ns;
            mepochs[i].nonce = m->encoder->info.epoch_nonce;
            mrefs[i].encoder_worker_id = m->encoder->info.worker_id;
            mrefs[i].encoder_epoch = &mepochs[i];
            mrefs[i].encoder_address.data = m->encoder->info.address;
            mrefs[i].encoder_address.len = m->encoder->info.address_len;
        } else if (m->inline_data) {
            mrefs[i].data.data = (uint8_t *)m->image;
            mrefs[i].data.len = m->image_len;
        }
        mptrs[i] = &mrefs[i];
    }
    g.n_media = q->n_media;
    g.media = q->n_media > 0 ? mptrs : NULL;
    status = epd_client_send_env(c, r->prefill, &env);
    if (status == EPD_OK && n_encodes > 0) {
        /* and the images to their encoders, at the same time */
        Epd__Envelope eenv = EPD__ENVELOPE__INIT;
        Epd__EncodeRequest er = EPD__ENCODE_REQUEST__INIT;
        Epd__Epoch ee = EPD__EPOCH__INIT;

        er.request_id = r->id;
        er.prefill_worker_id = q->prefill->info.worker_id;
        er.prefill_address.data = q->prefill->info.address;
        er.prefill_address.len = q->prefill->info.address_len;
        er.prefill_epoch = &pe;
        er.encoder_epoch = &ee;
        er.deadline_ms = q->deadline_ms;
        eenv.body_case = EPD__ENVELOPE__BODY_ENCODE;
        eenv.encode = &er;
        for (uint32_t i = 0; i < q->n_media && status == EPD_OK; i++) {
            const epd_client_media_t *m = &q->media[i];

            if (m->encoder == NULL) {
                continue;
            }
            er.media_index = i;
            er.image.data = (uint8_t *)m->image;
            er.image.len = m->image_len;
            er.content_hash.data = (uint8_t *)m->hash;
            er.content_hash.len = 32;
            ee.start_time_ns = m->encoder->info.epoch_start_ns;
            ee.nonce = m->encoder->info.epoch_nonce;
            status = epd_client_send_env(c, m->encoder, &eenv);
        }
        if (status != EPD_OK) {
            /* prefill has it too: take it back there as well */
            (void)epd_client_send_abort(c, r->prefill, r->id, EPD_ERR_CANCELED, "submit failed");
            for (uint32_t i = 0; i < r->n_enc; i++) {
                (void)epd_client_send_abort(c, r->enc[i], r->id, EPD_ERR_CANCELED, "submit failed");
            }
        }
    }
    if (status != EPD_OK) {
        /* decode has it: take it back (its answer names an id we forget) */
        if (epd_client_send_abort(c, r->decode, r->id, EPD_ERR_CANCELED, "submit failed") !=
            EPD_OK) {
            epd_log_warn(EPD__CLIENT_LOG, r->id,
                         "could not withdraw the request from decode %s; it ends by its "
                         "deadline there",
                         r->decode->info.worker_id);
        }
        goto err_free_req;
    }
    epd_client_req_insert(c, r);
    if (request_id_p != NULL) {
        *request_id_p = r->id;
    }
    return EPD_OK;

err_free_req:
    epd_free(r);
    return status;
}

epd_status_t epd_client_abort(epd_client_t *c, uint64_t request_id)
{
    epd__client_req_t *r = epd_client_req_find(c, request_id);

    if (r == NULL) {
        return EPD_ERR_NOT_FOUND;
    }
    r->aborted = 1;
    epd_client_abort_sides(c, r, EPD_CLIENT_ABORT_ALL, EPD_ERR_CANCELED, "client abort");
    return EPD_OK;
}

uint32_t epd_client_live(const epd_client_t *c)
{
    return c->live;
}

void epd_client_tick(epd_client_t *c)
{
    uint64_t now = epd_time_now_ns();

    for (uint32_t b = 0; b < EPD__CLIENT_BUCKETS; b++) {
        epd__client_req_t *r = c->buckets[b];

        while (r != NULL) {
            epd__client_req_t *next = r->hnext;

            if (now >= r->deadline_ns) {
                char msg[96];

                snprintf(msg, sizeof(msg), "no answer within the request's deadline");
                epd_log_warn(EPD__CLIENT_LOG, r->id, "%s (prefill %s, decode %s)", msg,
                             r->prefill->info.worker_id, r->decode->info.worker_id);
                epd_client_abort_sides(c, r, EPD_CLIENT_ABORT_ALL, EPD_ERR_TIMEOUT, msg);
                epd_client_req_fail(c, r, EPD_CLIENT_EV_ERROR, EPD_ERR_TIMEOUT, msg, "client");
                next = c->buckets[b];
            } else if (r->abort_pending_p || r->abort_pending_d || r->abort_pending_e != 0) {
                unsigned to =
                    (r->abort_pending_p || r->abort_pending_e != 0 ? EPD_CLIENT_ABORT_PREFILL : 0) |
                    (r->abort_pending_d ? EPD_CLIENT_ABORT_DECODE : 0);

                epd_client_abort_sides(c, r, to, EPD_ERR_CANCELED, "client abort");
            }
            r = next;
        }
    }
}

void epd__client_reqs_free_all(epd_client_t *c)
{
    for (uint32_t b = 0; b < EPD__CLIENT_BUCKETS; b++) {
        while (c->buckets[b] != NULL) {
            epd__client_req_t *r = c->buckets[b];
            c->buckets[b] = r->hnext;
            epd_free(r);
        }
    }
    c->live = 0;
}
