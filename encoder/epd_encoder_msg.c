/*
 * epd_encoder_msg.c — the encoder's message layer (proto/README.md rules
 * 13–20, encoder side).  The daemon runtime has decoded the frame and
 * applied the epoch rule; here every field that can be checked without the
 * request table is checked, a bad message is refused (an Error to whoever
 * sent it, a rate-limited log line), and a good one goes to the request
 * layer.  Nothing here keeps state.
 *
 * Messages are identified by their Envelope.sender, never by the endpoint
 * they came in on: replies to a client go back on the link its
 * EncodeRequest came in on; the write and every message about an admitted
 * image go on OUR link to its prefill worker (epd_peer.h), because the
 * fence of EmbedComplete / WritesQuiesced orders them behind the writes
 * posted there.  An Error is never answered with an Error.
 */
#include <stdio.h>
#include <string.h>

#include "epd_encoder_int.h"
#include "epd_time.h"

/* The checks of an EncodeRequest that need no request table; EPD_OK or the
 * refusal (msg says why). */
static epd_status_t epd_encoder_check_encode(const epd_encoder_srv_t *srv, const Epd__Envelope *env,
                                             char *msg, size_t cap)
{
    const Epd__EncodeRequest *e = env->encode;
    epd_msg_epoch_t own = epd_daemon_epoch(srv->d);
    epd_msg_epoch_t want = epd_msg_epoch_of(e->encoder_epoch);

    if (epd_daemon_draining(srv->d) || epd_daemon_stopping(srv->d)) {
        snprintf(msg, cap, "encoder worker '%.100s' is draining", epd_daemon_worker_id(srv->d));
        return EPD_ERR_DRAINING;
    }
    if (e->encoder_epoch == NULL || epd_msg_epoch_cmp(&own, &want) != 0) {
        snprintf(msg, cap, "request names another epoch of encoder worker '%.100s'",
                 epd_daemon_worker_id(srv->d));
        return EPD_ERR_STALE_EPOCH;
    }
    if (strlen(env->sender->worker_id) >= EPD_WORKER_ID_MAX) {
        snprintf(msg, cap, "sender id of %zu bytes (at most %d)", strlen(env->sender->worker_id),
                 EPD_WORKER_ID_MAX - 1);
        return EPD_ERR_INVALID_PARAM;
    }
    if (e->media_index >= EPD_ENCODER_MEDIA_MAX) {
        snprintf(msg, cap, "media index %u (at most %d media per request)", e->media_index,
                 EPD_ENCODER_MEDIA_MAX);
        return EPD_ERR_INVALID_PARAM;
    }
    if (e->image.len == 0) {
        snprintf(msg, cap, "empty image");
        return EPD_ERR_INVALID_PARAM;
    }
    if (e->image.len > srv->max_image_bytes) {
        snprintf(msg, cap, "image of %zu bytes exceeds the limit of %llu bytes", e->image.len,
                 (unsigned long long)srv->max_image_bytes);
        return EPD_ERR_TOO_LONG;
    }
    if (e->content_hash.len != EPD_CONTENT_HASH_BYTES) {
        snprintf(msg, cap, "content_hash of %zu bytes, want %d (BLAKE2b-256)", e->content_hash.len,
                 EPD_CONTENT_HASH_BYTES);
        return EPD_ERR_INVALID_PARAM;
    }
    if (e->prefill_worker_id == NULL || e->prefill_worker_id[0] == '\0' ||
        strlen(e->prefill_worker_id) >= EPD_WORKER_ID_MAX || e->prefill_epoch == NULL ||
        e->prefill_address.len == 0 || e->prefill_address.len > EPD_XPORT_ADDR_MAX) {
        snprintf(msg, cap, "request names no (valid) prefill worker, epoch and address");
        return EPD_ERR_INVALID_PARAM;
    }
    return EPD_OK;
}

static void epd_encoder_on_encode(epd_encoder_srv_t *srv, epd_link_t *from,
                                  const Epd__Envelope *env)
{
    char msg[200];
    epd_status_t st;

    epd_trace_instant(srv->trace, "EncodeRequest received", "msg", env->encode->request_id,
                      (int32_t)env->encode->media_index, epd_time_now_ns());
    st = epd_encoder_check_encode(srv, env, msg, sizeof(msg));
    if (st != EPD_OK) {
        epd_link_refuse(from, env->encode->request_id, st, msg);
        /* the image ended here before it began: its reservation (early or
         * late) is answered at once */
        epd__encoder_req_refused(srv, env->encode->request_id, env->encode->media_index, st, msg);
        return;
    }
    epd__encoder_req_encode(srv, from, env);
}

int epd__encoder_on_msg(void *arg, epd_link_t *from, Epd__Envelope *env)
{
    epd_encoder_srv_t *srv = arg;

    switch (env->body_case) {
    case EPD__ENVELOPE__BODY_ENCODE:
        epd_encoder_on_encode(srv, from, env);
        return 0;
    case EPD__ENVELOPE__BODY_EMBED_RESERVATION:
        epd_trace_instant(srv->trace, "EmbedReservation received", "msg",
                          env->embed_reservation->request_id,
                          (int32_t)env->embed_reservation->media_index, epd_time_now_ns());
        return epd__encoder_req_reservation(srv, from, env);
    case EPD__ENVELOPE__BODY_ABORT:
        epd__encoder_req_stop(srv, from, env, env->abort->request_id, env->abort->reason);
        return 0;
    case EPD__ENVELOPE__BODY_ERROR:
        epd__encoder_req_stop(srv, from, env, env->error->request_id, env->error->message);
        return 0;
    default:
        epd_link_refuse(from, epd_msg_request_id(env), EPD_ERR_UNSUPPORTED,
                        "message kind not handled by an encoder worker");
        return 0;
    }
}
