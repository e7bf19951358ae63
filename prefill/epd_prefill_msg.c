/*
 * epd_prefill_msg.c — prefill's message layer (proto/README.md rules 1-20,
 * prefill side).  The daemon runtime has decoded the frame and applied the
 * epoch rule; here every field that can be checked without the request
 * table is checked, a bad message is refused (an Error to whoever sent it,
 * a rate-limited log line), and a good one goes to the request layer.
 * Nothing here keeps state.
 *
 * Messages are identified by their Envelope.sender, never by the link they
 * came in on: replies to a client go back on the link its GenerateRequest
 * came in on; every write and every message about an admitted request goes
 * on OUR link to its decode worker (epd_peer.h), because the fence of
 * LayerDone / PrefillComplete / WritesQuiesced orders them behind the
 * writes posted there.  An Error is never answered with an Error.
 */
#include <stdio.h>
#include <string.h>

#include "epd_prefill_int.h"
#include "epd_time.h"

/* GenerateRequest.media against the prompt and the engine (rule 14). */
static epd_status_t epd_prefill_check_media(const epd_prefill_srv_t *srv,
                                            const Epd__GenerateRequest *g, char *msg, size_t cap)
{
    const epd_engine_info_t *info = srv->info;
    uint32_t covered = 0, n_tok = 0;
    uint64_t prev_end = 0;

    if (info->image_embeddings == 0 || srv->embed_slots == 0) {
        snprintf(msg, cap, "this prefill worker's model has no vision encoder (images refused)");
        return EPD_ERR_UNSUPPORTED;
    }
    if (g->n_media > EPD_PREFILL_MEDIA_MAX) {
        snprintf(msg, cap, "%zu images in one request, at most %d", g->n_media,
                 EPD_PREFILL_MEDIA_MAX);
        return EPD_ERR_TOO_LONG;
    }
    if (g->n_media > srv->embed_slots) {
        snprintf(msg, cap, "%zu images, this worker holds %u at once", g->n_media,
                 srv->embed_slots);
        return EPD_ERR_NO_CAPACITY;
    }
    for (size_t i = 0; i < g->n_media; i++) {
        const Epd__MediaRef *m = g->media[i];
        int has_enc = m->encoder_worker_id != NULL && m->encoder_worker_id[0] != '\0';

        if (m->kind != NULL && m->kind[0] != '\0' && strcmp(m->kind, "image") != 0) {
            snprintf(msg, cap, "media %zu is a '%.40s', only images are supported", i, m->kind);
            return EPD_ERR_UNSUPPORTED;
        }
        if (m->content_hash.len != EPD_PREFILL_HASH_BYTES) {
            snprintf(msg, cap, "media %zu: content hash of %zu bytes, want %d (BLAKE2b-256)", i,
                     m->content_hash.len, EPD_PREFILL_HASH_BYTES);
            return EPD_ERR_INVALID_PARAM;
        }
        if (m->n_embeddings != info->image_embeddings) {
            snprintf(msg, cap, "media %zu: %u embeddings, this model makes %u per image", i,
                     m->n_embeddings, info->image_embeddings);
            return EPD_ERR_INVALID_PARAM;
        }
        if ((uint64_t)m->placeholder_pos < prev_end ||
            (uint64_t)m->placeholder_pos + m->n_embeddings > g->n_prompt_tokens) {
            snprintf(msg, cap,
                     "media %zu: placeholders [%u, %llu) overlap or leave the prompt of %zu "
                     "tokens",
                     i, m->placeholder_pos,
                     (unsigned long long)m->placeholder_pos + m->n_embeddings, g->n_prompt_tokens);
            return EPD_ERR_INVALID_PARAM;
        }
        for (uint32_t p = m->placeholder_pos; p < m->placeholder_pos + m->n_embeddings; p++) {
            if ((int32_t)g->prompt_tokens[p] != info->image_token) {
                snprintf(msg, cap, "media %zu: prompt position %u is not the image token %d", i, p,
                         info->image_token);
                return EPD_ERR_INVALID_PARAM;
            }
        }
        if (has_enc && (strlen(m->encoder_worker_id) >= EPD_WORKER_ID_MAX ||
                        m->encoder_epoch == NULL || m->encoder_address.len == 0)) {
            snprintf(msg, cap, "media %zu names an encoder without a (valid) epoch and address", i);
            return EPD_ERR_INVALID_PARAM;
        }
        prev_end = (uint64_t)m->placeholder_pos + m->n_embeddings;
        covered += m->n_embeddings;
    }
    /* and no image token anywhere else */
    for (size_t p = 0; p < g->n_prompt_tokens; p++) {
        n_tok += (int32_t)g->prompt_tokens[p] == info->image_token;
    }
    if (n_tok != covered) {
        snprintf(msg, cap, "the prompt holds %u image tokens, its images cover %u", n_tok, covered);
        return EPD_ERR_INVALID_PARAM;
    }
    return EPD_OK;
}

/* The checks of a GenerateRequest that need no request table; EPD_OK (with
 * *sp filled) or the refusal (msg says why). */
static epd_status_t epd_prefill_check_generate(const epd_prefill_srv_t *srv,
                                               const Epd__Envelope *env, epd_sample_params_t *sp,
                                               char *msg, size_t cap)
{
    const Epd__GenerateRequest *g = env->generate;
    const epd_engine_info_t *info = srv->info;
    const char *self = epd_daemon_worker_id(srv->d);
    epd_msg_epoch_t own = epd_daemon_epoch(srv->d);
    epd_msg_epoch_t want = epd_msg_epoch_of(g->prefill_epoch);
    epd_status_t st;

    if (epd_daemon_draining(srv->d) || epd_daemon_stopping(srv->d)) {
        snprintf(msg, cap, "prefill worker '%.100s' is draining", self);
        return EPD_ERR_DRAINING;
    }
    if (g->prefill_epoch == NULL || epd_msg_epoch_cmp(&own, &want) != 0) {
        snprintf(msg, cap, "request names another epoch of prefill worker '%.100s'", self);
        return EPD_ERR_STALE_EPOCH;
    }
    if (g->prefill_worker_id != NULL && g->prefill_worker_id[0] != '\0' &&
        strcmp(g->prefill_worker_id, self) != 0) {
        snprintf(msg, cap, "request is for prefill worker '%.60s', this is '%.60s'",
                 g->prefill_worker_id, self);
        return EPD_ERR_NOT_FOUND;
    }
    if (strlen(env->sender->worker_id) >= EPD_WORKER_ID_MAX) {
        snprintf(msg, cap, "sender id of %zu bytes (at most %d)", strlen(env->sender->worker_id),
                 EPD_WORKER_ID_MAX - 1);
        return EPD_ERR_INVALID_PARAM;
    }
    if (g->n_prompt_tokens == 0) {
        snprintf(msg, cap, "empty prompt");
        return EPD_ERR_INVALID_PARAM;
    }
    if (g->n_prompt_tokens > info->max_context) {
        snprintf(msg, cap, "prompt of %zu tokens exceeds the context limit of %u",
                 g->n_prompt_tokens, info->max_context);
        return EPD_ERR_TOO_LONG;
    }
    if (g->cache_salt.len > EPD_PREFIX_SALT_MAX) {
        snprintf(msg, cap, "cache salt of %zu bytes (at most %d)", g->cache_salt.len,
                 EPD_PREFIX_SALT_MAX);
        return EPD_ERR_INVALID_PARAM;
    }
    if (g->n_media > 0 && (st = epd_prefill_check_media(srv, g, msg, cap)) != EPD_OK) {
        return st;
    }
    if (g->resume_generated > 0 &&
        (g->resume_generated >= g->n_prompt_tokens || g->n_media > 0 || g->prefill_only)) {
        snprintf(msg, cap,
                 "a resume of %u generated tokens needs a text prompt longer than them and a "
                 "decode worker",
                 g->resume_generated);
        return EPD_ERR_INVALID_PARAM;
    }
    if (!g->prefill_only && (g->decode_worker_id == NULL || g->decode_worker_id[0] == '\0' ||
                             strlen(g->decode_worker_id) >= EPD_WORKER_ID_MAX ||
                             g->decode_epoch == NULL || g->decode_address.len == 0)) {
        snprintf(msg, cap, "request names no (valid) decode worker, epoch and address");
        return EPD_ERR_INVALID_PARAM;
    }
    for (size_t i = 0; i < g->n_prompt_tokens; i++) {
        if (g->prompt_tokens[i] >= info->vocab_size) {
            snprintf(msg, cap, "prompt token %zu is %u, vocabulary has %u", i, g->prompt_tokens[i],
                     info->vocab_size);
            return EPD_ERR_INVALID_PARAM;
        }
    }
    epd_sample_params_default(sp);
    if (g->sampling != NULL) {
        sp->temperature = g->sampling->temperature;
        sp->top_k = g->sampling->top_k;
        sp->top_p = g->sampling->top_p == 0.0f ? 1.0f : g->sampling->top_p;
        sp->seed = g->sampling->seed;
        if (epd_sample_params_check(sp) != EPD_OK) {
            snprintf(msg, cap, "bad sampling parameters (temperature %g, top_p %g)",
                     (double)sp->temperature, (double)sp->top_p);
            return EPD_ERR_INVALID_PARAM;
        }
        st = epd_sample_params_from_msg(g->sampling, info->vocab_size, sp, msg, cap);
        if (st != EPD_OK) {
            return st;
        }
    }
    return EPD_OK;
}

static void epd_prefill_on_generate(epd_prefill_srv_t *srv, epd_link_t *from,
                                    const Epd__Envelope *env)
{
    uint64_t id = env->generate->request_id;
    epd_sample_params_t sp;
    char msg[200];
    epd_status_t st;

    st = epd_prefill_check_generate(srv, env, &sp, msg, sizeof(msg));
    if (st != EPD_OK) {
        epd_link_refuse(from, id, st, msg);
        /* it ended here before it began: an early reservation is answered */
        epd__prefill_req_refused(srv, id, st, msg);
        return;
    }
    epd__prefill_req_generate(srv, from, env, &sp);
}

int epd__prefill_on_msg(void *arg, epd_link_t *from, Epd__Envelope *env)
{
    epd_prefill_srv_t *srv = arg;

    switch (env->body_case) {
    case EPD__ENVELOPE__BODY_GENERATE:
        epd_prefill_on_generate(srv, from, env);
        return 0;
    case EPD__ENVELOPE__BODY_RESERVATION:
    case EPD__ENVELOPE__BODY_REFUSED:
        return epd__prefill_req_reservation(srv, from, env);
    case EPD__ENVELOPE__BODY_ABORT:
        epd__prefill_req_abort(srv, from, env);
        return 0;
    case EPD__ENVELOPE__BODY_ERROR:
        epd__prefill_req_error(srv, from, env);
        return 0;
    case EPD__ENVELOPE__BODY_EMBED_COMPLETE:
        epd__prefill_req_embed_complete(srv, env);
        return 0;
    case EPD__ENVELOPE__BODY_QUIESCED:
        epd__prefill_req_quiesced(srv, env);
        return 0;
    default:
        epd_link_refuse(from, epd_msg_request_id(env), EPD_ERR_UNSUPPORTED,
                        "message kind not handled by a prefill worker");
        return 0;
    }
}
