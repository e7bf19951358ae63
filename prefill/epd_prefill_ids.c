/*
 * epd_prefill_ids.c — request ids with no live request here: a role part
 * below the request layer.
 *
 * Two senders talk to a prefill worker about one request on different
 * links (the client's GenerateRequest and Abort, decode's KvReservation or
 * KvRefused), so their messages may cross in any order:
 *   - a reservation may overtake its GenerateRequest: it is kept
 *     (daemon/epd_stash, bounded) for a lease and taken when the request
 *     arrives; one never claimed is answered Error + WritesQuiesced, and
 *     one that finds the stash full Error EPD_ERR_NO_CAPACITY +
 *     WritesQuiesced (backpressure, retried for room like a refusal);
 *   - a request that ended here leaves a tombstone (daemon/epd_tomb) of its
 *     kind, aborted or failed: a late GenerateRequest is refused (writing
 *     after "quiesced" is the very recycle race the protocol exists to
 *     prevent) and a late reservation is answered the way the request
 *     ended — after an Abort with Error EPD_ERR_CANCELED "aborted", so
 *     decode ends the stream as an abort, not as a failure;
 *   - an Abort for an id not live here is remembered the same way, and
 *     answered WritesQuiesced when it comes from a decode worker (nothing
 *     of that id is in flight).
 * Answers go on the link the message came on: nothing of the id was ever
 * written, so no fence has anything to order.
 */
#include <stdio.h>

#include "epd_log.h"
#include "epd_prefill_int.h"
#include "epd_time.h"

epd_status_t epd__prefill_ids_init(epd_prefill_srv_t *srv)
{
    uint64_t ttl_ms = (uint64_t)srv->lease_ms * 10;
    epd_status_t st;

    st = epd_stash_create(EPD_PREFILL_STASH_MAX, &srv->stash);
    if (st != EPD_OK) {
        return st;
    }
    /* a tombstone outlives every lease a late message could still be under */
    return epd_tombs_create(EPD_PREFILL_TOMB_MAX,
                            (ttl_ms < 60000 ? 60000 : ttl_ms) * EPD_NSEC_PER_MSEC, &srv->tombs);
}

void epd__prefill_ids_cleanup(epd_prefill_srv_t *srv)
{
    epd_stash_destroy(srv->stash);
    srv->stash = NULL;
    epd_tombs_destroy(srv->tombs);
    srv->tombs = NULL;
}

void epd__prefill_ids_end(epd_prefill_srv_t *srv, uint64_t id, int kind)
{
    epd_tombs_add(srv->tombs, id, 0, kind);
}

int epd__prefill_ids_ended(const epd_prefill_srv_t *srv, uint64_t id)
{
    return epd_tombs_find(srv->tombs, id, 0);
}

void epd__prefill_ids_answer(epd_prefill_srv_t *srv, epd_link_t *to, const Epd__Envelope *env,
                             int kind)
{
    uint64_t id = epd_msg_request_id(env);

    if (kind == EPD_PREFILL_TOMB_ABORTED) {
        epd_log_debug(EPD_PREFILL_LOG, id, "%s for an aborted request: answered as aborted",
                      epd_msg_body_name(env));
        (void)epd_link_send_error(to, id, EPD_ERR_CANCELED, "aborted", NULL);
    } else if (env->body_case == EPD__ENVELOPE__BODY_RESERVATION) {
        epd_daemon_refuse_log(srv->d, id, "reservation for a request that is not live here");
        (void)epd_link_send_error(to, id, EPD_ERR_NOT_FOUND,
                                  "no such request on this prefill worker", NULL);
    } else {
        return; /* a refusal of an id that failed here: nothing was reserved */
    }
    (void)epd_link_send_quiesced(to, id);
}

int epd__prefill_ids_early(epd_prefill_srv_t *srv, epd_link_t *from, Epd__Envelope *env)
{
    uint64_t id = epd_msg_request_id(env);
    int kind = epd_tombs_find(srv->tombs, id, 0);

    if (kind != 0) {
        epd__prefill_ids_answer(srv, from, env, kind);
        return 0;
    }
    if (epd_stash_has(srv->stash, id, 0)) {
        /* a second one: no request will take it */
        epd__prefill_ids_answer(srv, from, env, EPD_PREFILL_TOMB_FAILED);
        return 0;
    }
    if (epd_stash_put(srv->stash, env, from, id, 0,
                      epd_time_now_ns() + (uint64_t)srv->lease_ms * EPD_NSEC_PER_MSEC) != EPD_OK) {
        /* too many reservations ahead of their requests: this worker is out
         * of room for one more, as when it refuses a request for capacity —
         * so decode and the client hear "no capacity" (retried after a
         * backoff), never "no such request" (a failure) */
        if (env->body_case == EPD__ENVELOPE__BODY_RESERVATION) {
            epd_daemon_refuse_log(srv->d, id, "reservation before its request: stash full");
            (void)epd_link_send_error(from, id, EPD_ERR_NO_CAPACITY,
                                      "prefill worker busy: too many reservations ahead of "
                                      "their requests",
                                      NULL);
            (void)epd_link_send_quiesced(from, id);
        }
        return 0;
    }
    epd_log_debug(EPD_PREFILL_LOG, id, "%s before its request: kept", epd_msg_body_name(env));
    return 1;
}

Epd__Envelope *epd__prefill_ids_take(epd_prefill_srv_t *srv, uint64_t id, epd_link_t **from_p)
{
    return epd_stash_take(srv->stash, id, 0, from_p);
}

void epd__prefill_ids_drop(epd_prefill_srv_t *srv, Epd__Envelope *env, epd_link_t *from,
                           epd_status_t status, const char *why)
{
    uint64_t id = epd_msg_request_id(env);

    if (env->body_case == EPD__ENVELOPE__BODY_RESERVATION) {
        /* decode may recycle the blocks at once */
        (void)epd_link_send_error(from, id, status, why, NULL);
        (void)epd_link_send_quiesced(from, id);
    }
    epd_daemon_refuse_log(srv->d, id, "dropping an early %s from '%s': %s", epd_msg_body_name(env),
                          env->sender->worker_id, why);
    epd_msg_free(env);
    epd_link_unref(from);
}

void epd__prefill_ids_refused(epd_prefill_srv_t *srv, uint64_t id, epd_status_t status,
                              const char *msg)
{
    epd_link_t *sl;
    Epd__Envelope *senv = epd_stash_take(srv->stash, id, 0, &sl);

    if (senv != NULL) {
        epd__prefill_ids_drop(srv, senv, sl, status, msg);
    }
}

void epd__prefill_ids_abort(epd_prefill_srv_t *srv, epd_link_t *from, const Epd__Envelope *env)
{
    uint64_t id = env->abort->request_id;
    const char *who = env->sender->worker_id;
    epd_link_t *sl;
    Epd__Envelope *senv;

    /* nothing of it is in flight; remember the id so a late request or
     * reservation never starts writing after this answer */
    epd_tombs_add(srv->tombs, id, 0, EPD_PREFILL_TOMB_ABORTED);
    senv = epd_stash_take(srv->stash, id, 0, &sl);
    if (senv != NULL) {
        epd__prefill_ids_drop(srv, senv, sl, EPD_ERR_CANCELED, "aborted");
    } else if (epd_peer_may_quiesce(srv->d, from, env, EPD__ROLE__ROLE_DECODE)) {
        /* a decode worker we write to may hold blocks for it (rule 7) —
         * also one that retired us and asks before reusing them (the
         * fence); not while a write of ours to it may still move */
        (void)epd_link_send_quiesced(from, id);
    }
    epd_log_debug(EPD_PREFILL_LOG, id, "abort from '%s' for a request not live here", who);
}

void epd__prefill_ids_expire(epd_prefill_srv_t *srv, uint64_t now_ns)
{
    epd_link_t *sl;
    Epd__Envelope *senv;

    while ((senv = epd_stash_take_expired(srv->stash, now_ns, &sl)) != NULL) {
        epd__prefill_ids_drop(srv, senv, sl, EPD_ERR_NOT_FOUND,
                              "no GenerateRequest for this id arrived within the lease");
    }
}
