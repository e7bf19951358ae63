/*
 * epd_decode_msg.c — the decode worker's message layer (proto/README.md
 * rules 2-11, decode side).  The daemon runtime has decoded the frame and
 * applied the epoch rule (rule 10); here every field that can be checked
 * without the request table is checked and the message goes to the request
 * layer, or is refused: an Error to whoever sent it and a rate-limited log
 * line.  Nothing here keeps state.
 *
 * A GenerateRequest refused here is refused to its prefill worker too
 * (KvRefused, through the request layer), so that it does not wait for a
 * reservation — except a duplicate of a live id: that worker is busy with
 * the live one and must not hear of it.  The checks run in the order the
 * protocol gives them meaning: whose request it is (epoch, worker id), can
 * this worker take work (draining), is the id free, can the prefill worker
 * be named, is it servable by this model.
 *
 * A PrefillComplete or LayerDone whose fields are wrong is not refused
 * here: it still comes from the request's prefill worker (a
 * PrefillComplete is its word that nothing more is in flight), so the
 * verdict goes down with it and the request layer fails the request.
 *
 * Messages are identified by their Envelope.sender, never by the endpoint
 * they came in on.  An Error is never answered with an Error.
 */
#include <stdio.h>
#include <string.h>

#include "epd_decode_int.h"
#include "epd_time.h"

static void epd_decode_refuse(epd_decode_srv_t *srv, epd_link_t *from, const Epd__Envelope *env,
                              uint64_t id, epd_status_t status, const char *what)
{
    epd_daemon_counts(srv->d)->refused++;
    epd_daemon_refuse_log(srv->d, id, "%s from %s: %s (%s)", epd_msg_body_name(env),
                          env->sender->worker_id, what, epd_status_name(status));
    if (env->body_case != EPD__ENVELOPE__BODY_ERROR) {
        (void)epd_link_send_error(from, id, status, what, NULL);
    }
}

/* The checks of a GenerateRequest that need no request table but the
 * duplicate id (the request layer's answer); EPD_OK or the refusal (*why_p
 * says why; *tell_p: its prefill worker is told too). */
static epd_status_t epd_decode_check_generate_msg(const epd_decode_srv_t *srv,
                                                  const Epd__GenerateRequest *g,
                                                  epd_sample_params_t *sp, const char **why_p,
                                                  int *tell_p)
{
    epd_decode_limits_t lim = {.vocab_size = srv->info->vocab_size,
                               .max_context = srv->info->max_context};
    epd_msg_epoch_t own = epd_daemon_epoch(srv->d);
    epd_msg_epoch_t want = epd_msg_epoch_of(g->decode_epoch);

    *tell_p = 1;
    if (g->decode_epoch == NULL || epd_msg_epoch_cmp(&own, &want) != 0) {
        *why_p = "request names another decode incarnation (epoch)";
        return EPD_ERR_STALE_EPOCH;
    }
    if (g->decode_worker_id != NULL && g->decode_worker_id[0] != '\0' &&
        strcmp(g->decode_worker_id, epd_daemon_worker_id(srv->d)) != 0) {
        *why_p = "request names another decode worker";
        return EPD_ERR_INVALID_PARAM;
    }
    if (epd_daemon_draining(srv->d) || epd_daemon_stopping(srv->d)) {
        *why_p = "decode worker is draining";
        return EPD_ERR_DRAINING;
    }
    *tell_p = 0;
    if (epd__decode_admit_live(srv, g->request_id)) {
        *why_p = "request id already live";
        return EPD_ERR_EXISTS;
    }
    if (!epd_decode_check_prefill_named(g)) {
        *why_p = "generate request without a usable prefill worker id, epoch and address";
        return EPD_ERR_INVALID_PARAM;
    }
    *tell_p = 1;
    return epd_decode_check_generate(&lim, g, sp, why_p);
}

static void epd_decode_on_generate(epd_decode_srv_t *srv, epd_link_t *from,
                                   const Epd__Envelope *env)
{
    const Epd__GenerateRequest *g = env->generate;
    epd_sample_params_t sp;
    const char *why = NULL;
    epd_status_t st;
    int tell = 0;

    epd_daemon_counts(srv->d)->received++;
    st = epd_decode_check_generate_msg(srv, g, &sp, &why, &tell);
    if (st != EPD_OK) {
        epd_decode_refuse(srv, from, env, g->request_id, st, why);
        if (tell) {
            epd__decode_admit_refused(srv, env, st, why);
        }
        return;
    }
    epd__decode_req_generate(srv, from, env, &sp);
}

/* The fields of a PrefillComplete that the model alone bounds. */
static epd_status_t epd_decode_check_complete_msg(const epd_decode_srv_t *srv,
                                                  const Epd__PrefillComplete *pc,
                                                  const char **why_p)
{
    if (pc->first_token >= srv->info->vocab_size) {
        *why_p = "PrefillComplete: first token outside the vocabulary";
        return EPD_ERR_INVALID_PARAM;
    }
    if (pc->n_layer_checksums != srv->info->kv.n_layers) {
        *why_p = "PrefillComplete: wrong number of layer checksums";
        return EPD_ERR_INVALID_PARAM;
    }
    if (pc->checksum_kind > EPD_KV_SUM_STAMPED) {
        *why_p = "PrefillComplete: unknown checksum kind";
        return EPD_ERR_INVALID_PARAM;
    }
    return EPD_OK;
}

int epd__decode_on_msg(void *arg, epd_link_t *from, Epd__Envelope *env)
{
    epd_decode_srv_t *srv = arg;
    const char *why = NULL;
    epd_status_t st;

    switch (env->body_case) {
    case EPD__ENVELOPE__BODY_GENERATE:
        epd_decode_on_generate(srv, from, env);
        return 0;
    case EPD__ENVELOPE__BODY_PREFILL_COMPLETE:
        st = epd_decode_check_complete_msg(srv, env->prefill_complete, &why);
        epd__decode_req_complete(srv, from, env, st, why);
        return 0;
    case EPD__ENVELOPE__BODY_LAYER_DONE:
        epd_trace_instant(srv->trace, "LayerDone received", "msg", env->layer_done->request_id,
                          (int32_t)env->layer_done->layer, epd_time_now_ns());
        st = EPD_OK;
        if (env->layer_done->landed && env->layer_done->layer >= srv->info->kv.n_layers) {
            st = EPD_ERR_INVALID_PARAM;
            why = "LayerDone: layer outside the model";
        } else if (env->layer_done->landed && env->layer_done->checksum_kind > EPD_KV_SUM_STAMPED) {
            st = EPD_ERR_INVALID_PARAM;
            why = "LayerDone: unknown checksum kind";
        } else if (env->layer_done->blocks > 0 &&
                   (!env->layer_done->landed ||
                    srv->info->kv.kind[env->layer_done->layer] != EPD_LAYER_ATTENTION)) {
            /* blocks so far: of an attention layer, landed (rule 4) */
            st = EPD_ERR_INVALID_PARAM;
            why = "LayerDone: blocks of a linear layer, or unlanded";
        }
        epd__decode_req_layer_done(srv, from, env, st, why);
        return 0;
    case EPD__ENVELOPE__BODY_QUIESCED:
        epd__decode_req_quiesced(srv, from, env);
        return 0;
    case EPD__ENVELOPE__BODY_ABORT:
        epd__decode_req_abort(srv, from, env);
        return 0;
    case EPD__ENVELOPE__BODY_ERROR:
        epd__decode_req_failed_by(srv, from, env, env->error->request_id, env->error->status,
                                  env->error->message);
        return 0;
    case EPD__ENVELOPE__BODY_REFUSED:
        epd__decode_req_failed_by(srv, from, env, env->refused->request_id, env->refused->status,
                                  env->refused->reason);
        return 0;
    default:
        epd_decode_refuse(srv, from, env, epd_msg_request_id(env), EPD_ERR_UNSUPPORTED,
                          "not a message a decode worker takes");
        return 0;
    }
}
