/*
 * epd_client.c — request-plane client (see epd_client.h).
 *
 * Design: the client owns one xport, a list of workers (one endpoint each,
 * keyed by the worker's Health identity) and a hash table of live requests
 * keyed by request id.  A request holds counted references to its two
 * workers so that a worker's endpoint failure can find and fail exactly the
 * requests that depend on it.  State changes happen only on the owner
 * thread, from xport callbacks or the caller's own calls, so there is no
 * lock.  The terminal event is delivered after the request left the table
 * (and its memory is freed after the callback returned), which makes "one
 * terminal event, then silence" structural rather than a matter of care,
 * and lets the callback submit or abort freely.
 */
#include "epd_client.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_msg.h"
#include "epd_rng.h"
#include "epd_rpc.h"
#include "epd_time.h"

#define EPD__CLIENT_BUCKETS 1024u
#define EPD__CLIENT_LOG "client"

struct epd_client_worker {
    epd_client_t *client;
    epd_client_worker_info_t info;
    epd_xport_ep_t *ep; /* NULL once failed and closed */
    epd_status_t state; /* EPD_OK, or the endpoint's failure */
    epd_client_worker_t *next;
};

typedef struct epd__client_req {
    uint64_t id;
    void *user;
    epd_client_worker_t *prefill;
    epd_client_worker_t *decode;
    epd_client_worker_t *enc[EPD_CLIENT_MEDIA_MAX]; /* distinct encoders of its images */
    uint32_t n_enc;
    uint32_t abort_pending_e; /* bit i: Abort to enc[i] not yet accepted */
    uint32_t next_index; /* tokens received so far */
    uint32_t max_tokens;
    uint64_t deadline_ns; /* monotonic */
    int aborted;          /* the caller asked for an abort */
    int abort_pending_p;  /* Abort to prefill not yet accepted */
    int abort_pending_d;
    struct epd__client_req *hnext;
} epd__client_req_t;

struct epd_client {
    epd_client_config_t cfg;
    char worker_id[EPD_CLIENT_NAME_MAX];
    uint64_t epoch_start_ns;
    uint64_t epoch_nonce;
    uint64_t seq;
    uint64_t id_high; /* random high 32 bits of request ids */
    uint32_t id_counter;
    epd_xport_t *x;
    epd_client_worker_t *workers;
    epd__client_req_t *buckets[EPD__CLIENT_BUCKETS];
    uint32_t live;
    unsigned char *txbuf; /* one encoded frame, max_msg_size bytes */
    epd_client_stats_t stats;
    uint64_t last_bad_log_ns;
    char culprit[EPD_CLIENT_NAME_MAX]; /* of the Error being delivered */
};

/* ------------------------------------------------------------- helpers */

static void epd__copy_str(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src != NULL ? src : "");
}

const char *epd_client_finish_name(int finish)
{
    switch (finish) {
    case EPD_CLIENT_FINISH_NONE:
        return "NONE";
    case EPD_CLIENT_FINISH_LENGTH:
        return "LENGTH";
    case EPD_CLIENT_FINISH_STOP:
        return "STOP";
    case EPD_CLIENT_FINISH_ABORT:
        return "ABORT";
    case EPD_CLIENT_FINISH_ERROR:
        return "ERROR";
    default:
        return "?";
    }
}

static const char *epd__role_name(int role)
{
    return role == EPD_CLIENT_ROLE_PREFILL   ? "prefill"
           : role == EPD_CLIENT_ROLE_DECODE  ? "decode"
           : role == EPD_CLIENT_ROLE_ENCODER ? "encoder"
                                             : "other";
}

/* ------------------------------------------------------------- Health */

static epd_status_t epd__health_refuse(const char **why_p, const char *why)
{
    if (why_p != NULL) {
        *why_p = why;
    }
    return EPD_ERR_MALFORMED;
}

epd_status_t epd_client_health_parse(const void *buf, size_t len, epd_client_worker_info_t *info_p,
                                     const char **why_p)
{
    static const unsigned char empty = 0;
    ProtobufCMessage *msg = NULL;
    Epd__HealthResponse *h;
    epd_client_worker_info_t *info;
    epd_status_t status;

    status = epd_proto_unpack(&epd__health_response__descriptor, len > 0 ? buf : &empty, len, &msg);
    if (status != EPD_OK) {
        return epd__health_refuse(why_p, "Health answer does not decode");
    }
    h = (Epd__HealthResponse *)msg;
    if (h->worker == NULL || h->worker->epoch == NULL) {
        status = epd__health_refuse(why_p, "Health answer without worker identity or epoch");
        goto out;
    }
    if (h->worker->worker_id == NULL || h->worker->worker_id[0] == '\0' ||
        strlen(h->worker->worker_id) >= EPD_CLIENT_NAME_MAX) {
        status = epd__health_refuse(why_p, "Health answer with an empty or oversized worker id");
        goto out;
    }
    if (h->worker->role != EPD__ROLE__ROLE_PREFILL && h->worker->role != EPD__ROLE__ROLE_DECODE &&
        h->worker->role != EPD__ROLE__ROLE_ENCODER) {
        status = epd__health_refuse(why_p,
                                    "Health answer with a role other than prefill/decode/encoder");
        goto out;
    }
    if (h->data_plane_address.len == 0 || h->data_plane_address.len > EPD_XPORT_ADDR_MAX) {
        status = epd__health_refuse(why_p, "Health answer with an empty or oversized address");
        goto out;
    }
    if ((h->kv_layout == NULL && h->worker->role != EPD__ROLE__ROLE_ENCODER) ||
        h->capacity == NULL) {
        status = epd__health_refuse(why_p, "Health answer without KV layout or capacity");
        goto out;
    }
    if (h->kv_layout != NULL && h->kv_layout->layer_pattern != NULL &&
        strlen(h->kv_layout->layer_pattern) >= EPD_CLIENT_PATTERN_MAX) {
        status = epd__health_refuse(why_p, "Health answer with an oversized layer pattern");
        goto out;
    }
    info = epd_calloc(1, sizeof(*info));
    if (info == NULL) {
        status = EPD_ERR_NO_MEMORY;
        goto out;
    }
    epd__copy_str(info->worker_id, sizeof(info->worker_id), h->worker->worker_id);
    info->role = h->worker->role;
    epd__copy_str(info->model, sizeof(info->model), h->worker->model);
    info->epoch_start_ns = h->worker->epoch->start_time_ns;
    info->epoch_nonce = h->worker->epoch->nonce;
    epd__copy_str(info->transport, sizeof(info->transport), h->transport);
    memcpy(info->address, h->data_plane_address.data, h->data_plane_address.len);
    info->address_len = h->data_plane_address.len;
    info->serving = h->serving;
    info->draining = h->draining;
    if (h->kv_layout != NULL) {
        info->n_layers = h->kv_layout->n_layers;
        epd__copy_str(info->layer_pattern, sizeof(info->layer_pattern),
                      h->kv_layout->layer_pattern);
        info->block_tokens = h->kv_layout->block_tokens;
        info->n_kv_heads = h->kv_layout->n_kv_heads;
        info->head_dim = h->kv_layout->head_dim;
        info->kv_dtype = h->kv_layout->dtype;
        info->block_bytes = h->kv_layout->block_bytes;
        info->state_bytes = h->kv_layout->state_bytes;
    }
    info->kv_blocks_total = h->capacity->kv_blocks_total;
    info->state_slots_total = h->capacity->state_slots_total;
    info->max_batch = h->capacity->max_batch;
    info->max_context = h->capacity->max_context;
    info->embed_slots = h->capacity->embed_slots;
    info->image_embeddings = h->capacity->image_embeddings;
    info->embed_dim = h->capacity->embed_dim;
    if (h->load != NULL) {
        info->queue_depth = h->load->queue_depth;
        info->queued_tokens = h->load->queued_tokens;
        info->kv_blocks_free = h->load->kv_blocks_free;
        info->state_slots_free = h->load->state_slots_free;
        info->running_requests = h->load->running_requests;
    }
    memcpy(info_p, info, sizeof(*info));
    epd_free(info);
    status = EPD_OK;
out:
    epd_proto_free(msg);
    return status;
}

epd_status_t epd_client_health(const char *control_addr, int timeout_ms,
                               epd_client_worker_info_t *info_p, char *err, size_t err_cap)
{
    epd_rpc_client_t *rpc = NULL;
    void *resp = NULL;
    size_t resp_len = 0;
    const char *why = NULL;
    char rpc_err[256] = "";
    epd_status_t status;

    status = epd_rpc_client_create(control_addr, &rpc);
    if (status != EPD_OK) {
        if (err != NULL) {
            snprintf(err, err_cap, "cannot open a gRPC channel to %s: %s", control_addr,
                     epd_status_string(status));
        }
        return status;
    }
    status = epd_rpc_call(rpc, EPD_RPC_HEALTH, NULL, 0, timeout_ms, &resp, &resp_len, rpc_err,
                          sizeof(rpc_err));
    if (status != EPD_OK) {
        if (err != NULL) {
            snprintf(err, err_cap, "Health %s: %s%s%s", control_addr, epd_status_string(status),
                     rpc_err[0] ? ": " : "", rpc_err);
        }
        goto out;
    }
    status = epd_client_health_parse(resp, resp_len, info_p, &why);
    if (status != EPD_OK && err != NULL) {
        snprintf(err, err_cap, "Health %s: %s", control_addr,
                 why != NULL ? why : epd_status_string(status));
    }
out:
    epd_free(resp);
    epd_rpc_client_destroy(rpc);
    return status;
}

/* ------------------------------------------------------------- requests */

static uint32_t epd__bucket(uint64_t id)
{
    id ^= id >> 33;
    id *= 0xff51afd7ed558ccdULL;
    id ^= id >> 33;
    return (uint32_t)(id & (EPD__CLIENT_BUCKETS - 1));
}

static epd__client_req_t *epd__req_find(const epd_client_t *c, uint64_t id)
{
    for (epd__client_req_t *r = c->buckets[epd__bucket(id)]; r != NULL; r = r->hnext) {
        if (r->id == id) {
            return r;
        }
    }
    return NULL;
}

static void epd__req_insert(epd_client_t *c, epd__client_req_t *r)
{
    uint32_t b = epd__bucket(r->id);

    r->hnext = c->buckets[b];
    c->buckets[b] = r;
    c->live++;
}

static void epd__req_unlink(epd_client_t *c, epd__client_req_t *r)
{
    epd__client_req_t **pp = &c->buckets[epd__bucket(r->id)];

    while (*pp != NULL && *pp != r) {
        pp = &(*pp)->hnext;
    }
    if (*pp == r) {
        *pp = r->hnext;
        c->live--;
    }
}

/* Encodes an envelope with the client's sender into txbuf and sends it. */
static epd_status_t epd__send_env(epd_client_t *c, epd_client_worker_t *w, Epd__Envelope *env)
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

static epd_status_t epd__send_abort(epd_client_t *c, epd_client_worker_t *w, uint64_t id,
                                    epd_status_t why, const char *reason)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__Abort ab = EPD__ABORT__INIT;

    ab.request_id = id;
    ab.status = why;
    ab.reason = (char *)reason;
    env.body_case = EPD__ENVELOPE__BODY_ABORT;
    env.abort = &ab;
    return epd__send_env(c, w, &env);
}

/* Sends Abort to the request's workers (those named by the flags); an Abort
 * that cannot be sent now is left pending for epd_client_tick, one that
 * cannot be sent at all (dead endpoint) is dropped. */
static void epd__abort_sides(epd_client_t *c, epd__client_req_t *r, int to_p, int to_d,
                             epd_status_t why, const char *reason)
{
    epd_status_t s;

    /* the encoders of its images always (a no-op for them once done) */
    for (uint32_t i = 0; i < r->n_enc; i++) {
        if ((to_p || to_d) && r->enc[i]->state == EPD_OK) {
            s = epd__send_abort(c, r->enc[i], r->id, why, reason);
            if (s == EPD_ERR_NO_RESOURCE) {
                r->abort_pending_e |= 1u << i;
            } else {
                r->abort_pending_e &= ~(1u << i);
            }
        }
    }
    if (to_d) {
        s = epd__send_abort(c, r->decode, r->id, why, reason);
        r->abort_pending_d = s == EPD_ERR_NO_RESOURCE;
    }
    if (to_p) {
        s = epd__send_abort(c, r->prefill, r->id, why, reason);
        r->abort_pending_p = s == EPD_ERR_NO_RESOURCE;
    }
}

/* Ends `r`: out of the table first, then the terminal callback, then free.
 * An Abort still pending for it is sent once more, best effort. */
static void epd__req_end(epd_client_t *c, epd__client_req_t *r, epd_client_event_t *ev)
{
    epd__req_unlink(c, r);
    if (r->abort_pending_d) {
        (void)epd__send_abort(c, r->decode, r->id, EPD_ERR_CANCELED, "client abort");
    }
    if (r->abort_pending_p) {
        (void)epd__send_abort(c, r->prefill, r->id, EPD_ERR_CANCELED, "client abort");
    }
    for (uint32_t i = 0; i < r->n_enc; i++) {
        if ((r->abort_pending_e & (1u << i)) != 0 && r->enc[i]->state == EPD_OK) {
            (void)epd__send_abort(c, r->enc[i], r->id, EPD_ERR_CANCELED, "client abort");
        }
    }
    ev->request_id = r->id;
    ev->user = r->user;
    ev->terminal = 1;
    c->cfg.event_cb(c->cfg.cb_arg, ev);
    epd_free(r);
}

static void epd__req_fail(epd_client_t *c, epd__client_req_t *r, epd_client_ev_kind_t kind,
                          epd_status_t status, const char *message, const char *from)
{
    epd_client_event_t ev;

    memset(&ev, 0, sizeof(ev));
    ev.kind = kind;
    ev.status = status;
    ev.message = message != NULL ? message : "";
    ev.from = from != NULL ? from : "client";
    ev.culprit = c->culprit;
    epd__req_end(c, r, &ev);
    c->culprit[0] = '\0';
}

/* ------------------------------------------------------------- incoming */

static int epd__sender_is(const Epd__SenderRef *s, const epd_client_worker_t *w)
{
    return strcmp(s->worker_id, w->info.worker_id) == 0 &&
           s->epoch->start_time_ns == w->info.epoch_start_ns &&
           s->epoch->nonce == w->info.epoch_nonce;
}

static void epd__on_chunk(epd_client_t *c, epd__client_req_t *r, const Epd__TokenChunk *tc)
{
    epd_client_event_t ev;
    char msg[160];

    if (tc->index != r->next_index) {
        snprintf(msg, sizeof(msg), "token chunk out of order: index %u, expected %u", tc->index,
                 r->next_index);
        epd_log_warn(EPD__CLIENT_LOG, r->id, "%s (from %s)", msg, r->decode->info.worker_id);
        epd__abort_sides(c, r, 1, 1, EPD_ERR_MALFORMED, msg);
        epd__req_fail(c, r, EPD_CLIENT_EV_ERROR, EPD_ERR_MALFORMED, msg, r->decode->info.worker_id);
        return;
    }
    if (tc->n_tokens > (size_t)(r->max_tokens - r->next_index)) {
        snprintf(msg, sizeof(msg), "token chunk beyond max_tokens: %zu tokens at index %u of %u",
                 tc->n_tokens, tc->index, r->max_tokens);
        epd_log_warn(EPD__CLIENT_LOG, r->id, "%s (from %s)", msg, r->decode->info.worker_id);
        epd__abort_sides(c, r, 1, 1, EPD_ERR_MALFORMED, msg);
        epd__req_fail(c, r, EPD_CLIENT_EV_ERROR, EPD_ERR_MALFORMED, msg, r->decode->info.worker_id);
        return;
    }
    if ((int)tc->finish < EPD_CLIENT_FINISH_NONE || (int)tc->finish > EPD_CLIENT_FINISH_ERROR) {
        snprintf(msg, sizeof(msg), "token chunk with unknown finish reason %d", (int)tc->finish);
        epd_log_warn(EPD__CLIENT_LOG, r->id, "%s (from %s)", msg, r->decode->info.worker_id);
        epd__abort_sides(c, r, 1, 1, EPD_ERR_MALFORMED, msg);
        epd__req_fail(c, r, EPD_CLIENT_EV_ERROR, EPD_ERR_MALFORMED, msg, r->decode->info.worker_id);
        return;
    }
    memset(&ev, 0, sizeof(ev));
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
        epd__req_end(c, r, &ev);
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
static epd_status_t epd__wire_status(int32_t status)
{
    return status < 0 ? (epd_status_t)status : EPD_ERR_FATAL;
}

static void epd__on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    epd_client_t *c = arg;
    Epd__Envelope *env = NULL;
    epd__client_req_t *r;
    const char *why = NULL;
    int from_p;
    int from_d;
    uint64_t id;

    (void)ep;
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
    r = epd__req_find(c, id);
    if (r == NULL) {
        c->stats.unknown_ids++;
        epd_log_debug(EPD__CLIENT_LOG, id, "%s from %s: unknown request id, ignored",
                      epd_msg_body_name(env), env->sender->worker_id);
        goto out;
    }
    from_p = epd__sender_is(env->sender, r->prefill);
    from_d = epd__sender_is(env->sender, r->decode);
    if (!from_p && !from_d) {
        for (uint32_t i = 0; i < r->n_enc; i++) {
            if (epd__sender_is(env->sender, r->enc[i]) &&
                (env->body_case == EPD__ENVELOPE__BODY_ERROR ||
                 env->body_case == EPD__ENVELOPE__BODY_ABORT)) {
                /* an image failed on its encoder: the request is over */
                int is_err = env->body_case == EPD__ENVELOPE__BODY_ERROR;
                epd_status_t st =
                    epd__wire_status(is_err ? env->error->status : env->abort->status);
                const char *text = is_err ? env->error->message : env->abort->reason;
                char from[EPD_CLIENT_NAME_MAX];

                epd_log_info(EPD__CLIENT_LOG, id, "%s from encoder %s: %s: %s",
                             epd_msg_body_name(env), env->sender->worker_id, epd_status_name(st),
                             text);
                epd__abort_sides(c, r, 1, 1, st, "an image of the request failed");
                epd__copy_str(from, sizeof(from), env->sender->worker_id);
                epd__req_fail(c, r, EPD_CLIENT_EV_ERROR, st, text, from);
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
        epd__on_chunk(c, r, env->tokens);
        break;
    case EPD__ENVELOPE__BODY_ERROR:
    case EPD__ENVELOPE__BODY_ABORT: {
        int is_err = env->body_case == EPD__ENVELOPE__BODY_ERROR;
        epd_status_t st = epd__wire_status(is_err ? env->error->status : env->abort->status);
        const char *text = is_err ? env->error->message : env->abort->reason;
        char from[EPD_CLIENT_NAME_MAX];

        if (r->aborted && from_p && !from_d) {
            /* after an abort, the decode worker gives the final answer */
            epd_log_debug(EPD__CLIENT_LOG, id, "%s from prefill %s after abort: %s",
                          epd_msg_body_name(env), env->sender->worker_id, text);
            break;
        }
        epd_log_info(EPD__CLIENT_LOG, id, "%s from %s %s: %s: %s", epd_msg_body_name(env),
                     from_p ? "prefill" : "decode", env->sender->worker_id, epd_status_name(st),
                     text);
        /* the other side may still hold the request: tell it */
        epd__abort_sides(c, r, !from_p, !from_d, st, "the other worker failed the request");
        epd__copy_str(from, sizeof(from), env->sender->worker_id);
        epd__copy_str(c->culprit, sizeof(c->culprit), is_err ? env->error->culprit : NULL);
        epd__req_fail(c, r, EPD_CLIENT_EV_ERROR, st, text, from);
        break;
    }
    case EPD__ENVELOPE__BODY_REFUSED: {
        char from[EPD_CLIENT_NAME_MAX];

        epd_log_info(EPD__CLIENT_LOG, id, "refused by %s: %s: %s", env->sender->worker_id,
                     epd_status_name(epd__wire_status(env->refused->status)), env->refused->reason);
        if (!from_d) {
            /* the decode worker tells the prefill worker itself; a refusal
             * relayed by the prefill side leaves decode unaware */
            epd__abort_sides(c, r, 0, 1, EPD_ERR_NO_CAPACITY, "refused by the prefill worker");
        }
        epd__copy_str(from, sizeof(from), env->sender->worker_id);
        epd__req_fail(c, r, EPD_CLIENT_EV_REFUSED, epd__wire_status(env->refused->status),
                      env->refused->reason, from);
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
static void epd__worker_failed(epd_client_t *c, epd_client_worker_t *w, epd_status_t status)
{
    char msg[256];

    if (w->state != EPD_OK) {
        return;
    }
    w->state = status == EPD_OK ? EPD_ERR_PEER_DEAD : status;
    epd_log_warn(EPD__CLIENT_LOG, 0, "%s worker %s: endpoint failed: %s",
                 epd__role_name(w->info.role), w->info.worker_id, epd_status_string(status));
    if (w->ep != NULL) {
        epd_xport_ep_close(w->ep);
        w->ep = NULL;
    }
    snprintf(msg, sizeof(msg), "%s worker %s is unreachable: %s", epd__role_name(w->info.role),
             w->info.worker_id, epd_status_string(status));
    for (uint32_t b = 0; b < EPD__CLIENT_BUCKETS; b++) {
        epd__client_req_t *r = c->buckets[b];

        while (r != NULL) {
            epd__client_req_t *next = r->hnext;

            int uses = r->prefill == w || r->decode == w;

            for (uint32_t i = 0; i < r->n_enc; i++) {
                uses |= r->enc[i] == w;
            }
            if (uses) {
                epd__abort_sides(c, r, r->prefill != w, r->decode != w, EPD_ERR_PEER_DEAD, msg);
                epd__req_fail(c, r, EPD_CLIENT_EV_ERROR, EPD_ERR_PEER_DEAD, msg, "client");
                /* the callback may have ended or added requests anywhere:
                 * restart this bucket */
                next = c->buckets[b];
            }
            r = next;
        }
    }
}

static void epd__on_err(void *arg, epd_xport_ep_t *ep, epd_status_t status)
{
    epd_client_t *c = arg;
    epd_client_worker_t *w = epd_xport_ep_user(ep);

    if (w == NULL) {
        /* an endpoint some peer opened to us; we never use those */
        epd_xport_ep_close(ep);
        return;
    }
    epd__worker_failed(c, w, status);
}

static void epd__on_accept(void *arg, epd_xport_ep_t *ep)
{
    (void)arg;
    /* Replies come on the endpoints we opened; a peer connecting to a
     * client has nothing to say that those would not carry.  Keep it open
     * (closing would make the peer's sends fail) and untracked. */
    epd_xport_ep_set_user(ep, NULL);
}

static void epd__on_connect(void *arg, epd_status_t status)
{
    epd_client_worker_t *w = arg;

    if (status == EPD_OK) {
        epd_log_debug(EPD__CLIENT_LOG, 0, "connected to %s", w->info.worker_id);
    }
    /* failures reach epd__on_err, which fails the worker's requests */
}

/* ------------------------------------------------------------- lifecycle */

void epd_client_config_init(epd_client_config_t *config)
{
    memset(config, 0, sizeof(*config));
    config->backend = "ucx";
    config->expect = "any";
    config->peer_timeout_ms = 3000;
    config->connect_timeout_ms = 3000;
    config->max_msg_size = 64 * 1024;
    config->role = EPD_CLIENT_ROLE_TOOL;
    config->rpc_timeout_ms = 3000;
}

epd_status_t epd_client_create(const epd_client_config_t *config, epd_client_t **client_p)
{
    epd_xport_config_t xc;
    epd_client_t *c;
    epd_status_t status;

    if (config->event_cb == NULL || config->max_msg_size < 256 ||
        (config->role != EPD_CLIENT_ROLE_TOOL && config->role != EPD_CLIENT_ROLE_ROUTER)) {
        return EPD_ERR_INVALID_PARAM;
    }
    c = epd_calloc(1, sizeof(*c));
    if (c == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    c->cfg = *config;
    if (config->worker_id != NULL && config->worker_id[0] != '\0') {
        epd__copy_str(c->worker_id, sizeof(c->worker_id), config->worker_id);
    } else {
        snprintf(c->worker_id, sizeof(c->worker_id), "ctl-%d", (int)getpid());
    }
    c->cfg.worker_id = c->worker_id;
    c->cfg.backend = NULL;
    c->cfg.expect = NULL;
    c->cfg.provider = NULL;
    c->epoch_start_ns = epd_time_wall_ns();
    c->epoch_nonce = epd_rng_entropy();
    c->id_high = (epd_rng_entropy() & 0x7fffffffULL) << 32;
    c->txbuf = epd_malloc(config->max_msg_size);
    if (c->txbuf == NULL) {
        status = EPD_ERR_NO_MEMORY;
        goto err_free_client;
    }
    epd_xport_config_init(&xc);
    xc.backend = config->backend != NULL ? config->backend : "ucx";
    xc.expect = config->expect;
    xc.provider = config->provider;
    xc.max_msg_size = config->max_msg_size;
    if (config->peer_timeout_ms > 0) {
        xc.peer_timeout_ms = config->peer_timeout_ms;
    }
    if (config->connect_timeout_ms > 0) {
        xc.connect_timeout_ms = config->connect_timeout_ms;
    }
    xc.msg_cb = epd__on_msg;
    xc.accept_cb = epd__on_accept;
    xc.err_cb = epd__on_err;
    xc.cb_arg = c;
    status = epd_xport_create(&xc, &c->x);
    if (status != EPD_OK) {
        goto err_free_buf;
    }
    *client_p = c;
    return EPD_OK;

err_free_buf:
    epd_free(c->txbuf);
err_free_client:
    epd_free(c);
    return status;
}

void epd_client_destroy(epd_client_t *c)
{
    if (c == NULL) {
        return;
    }
    for (uint32_t b = 0; b < EPD__CLIENT_BUCKETS; b++) {
        while (c->buckets[b] != NULL) {
            epd__client_req_t *r = c->buckets[b];
            c->buckets[b] = r->hnext;
            epd_free(r);
        }
    }
    while (c->workers != NULL) {
        epd_client_worker_t *w = c->workers;
        c->workers = w->next;
        if (w->ep != NULL) {
            epd_xport_ep_set_user(w->ep, NULL);
            epd_xport_ep_close(w->ep);
        }
        epd_free(w);
    }
    epd_xport_destroy(c->x);
    epd_free(c->txbuf);
    epd_free(c);
}

epd_xport_t *epd_client_xport(epd_client_t *c)
{
    return c->x;
}

const char *epd_client_id(const epd_client_t *c)
{
    return c->worker_id;
}

void epd_client_epoch(const epd_client_t *c, uint64_t *start_ns_p, uint64_t *nonce_p)
{
    *start_ns_p = c->epoch_start_ns;
    *nonce_p = c->epoch_nonce;
}

epd_status_t epd_client_add_worker_info(epd_client_t *c, const epd_client_worker_info_t *info,
                                        epd_client_worker_t **worker_p)
{
    epd_client_worker_t *w;
    epd_status_t status;

    if (info->address_len == 0 || info->address_len > EPD_XPORT_ADDR_MAX) {
        return EPD_ERR_BAD_ADDRESS;
    }
    w = epd_calloc(1, sizeof(*w));
    if (w == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    w->client = c;
    w->info = *info;
    w->state = EPD_OK;
    status = epd_xport_connect(c->x, info->address, info->address_len, epd__on_connect, w, &w->ep);
    if (status != EPD_OK && status != EPD_INPROGRESS) {
        epd_log_error(EPD__CLIENT_LOG, 0, "cannot connect to %s: %s", info->worker_id,
                      epd_status_string(status));
        epd_free(w);
        return status;
    }
    epd_xport_ep_set_user(w->ep, w);
    w->next = c->workers;
    c->workers = w;
    *worker_p = w;
    return EPD_OK;
}

epd_status_t epd_client_add_worker(epd_client_t *c, const char *control_addr,
                                   epd_client_worker_t **worker_p)
{
    epd_client_worker_info_t *info;
    char err[512];
    epd_status_t status;

    info = epd_calloc(1, sizeof(*info));
    if (info == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    status = epd_client_health(control_addr, c->cfg.rpc_timeout_ms, info, err, sizeof(err));
    if (status != EPD_OK) {
        epd_log_error(EPD__CLIENT_LOG, 0, "%s", err);
        goto out;
    }
    status = epd_client_add_worker_info(c, info, worker_p);
out:
    epd_free(info);
    return status;
}

const epd_client_worker_info_t *epd_client_worker_info(const epd_client_worker_t *w)
{
    return &w->info;
}

epd_status_t epd_client_worker_state(const epd_client_worker_t *w)
{
    return w->state;
}

/* ------------------------------------------------------------- submit */

static uint64_t epd__next_id(epd_client_t *c)
{
    uint64_t id;

    do {
        id = c->id_high | ++c->id_counter;
    } while (id == 0 || epd__req_find(c, id) != NULL);
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
        (q->n_stop_ids > 0 && q->stop_ids == NULL) || q->n_media > EPD_CLIENT_MEDIA_MAX ||
        (q->n_media > 0 && q->media == NULL)) {
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
    r->id = epd__next_id(c);
    r->user = q->user;
    r->prefill = q->prefill;
    r->decode = q->decode;
    r->max_tokens = q->max_tokens;
    r->deadline_ns = epd_time_now_ns() + (uint64_t)q->deadline_ms * EPD_NSEC_PER_MSEC;

    sp.temperature = q->temperature;
    sp.top_p = q->top_p;
    sp.top_k = q->top_k;
    sp.seed = q->seed;
    sp.max_tokens = q->max_tokens;
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
    env.body_case = EPD__ENVELOPE__BODY_GENERATE;
    env.generate = &g;

    /* decode first: it reserves while prefill already computes; it gets
     * no media (only the tokens matter to it) */
    status = epd__send_env(c, r->decode, &env);
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
    status = epd__send_env(c, r->prefill, &env);
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
            status = epd__send_env(c, m->encoder, &eenv);
        }
        if (status != EPD_OK) {
            /* prefill has it too: take it back there as well */
            (void)epd__send_abort(c, r->prefill, r->id, EPD_ERR_CANCELED, "submit failed");
            for (uint32_t i = 0; i < r->n_enc; i++) {
                (void)epd__send_abort(c, r->enc[i], r->id, EPD_ERR_CANCELED, "submit failed");
            }
        }
    }
    if (status != EPD_OK) {
        /* decode has it: take it back (its answer names an id we forget) */
        if (epd__send_abort(c, r->decode, r->id, EPD_ERR_CANCELED, "submit failed") != EPD_OK) {
            epd_log_warn(EPD__CLIENT_LOG, r->id,
                         "could not withdraw the request from decode %s; it ends by its "
                         "deadline there",
                         r->decode->info.worker_id);
        }
        goto err_free_req;
    }
    epd__req_insert(c, r);
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
    epd__client_req_t *r = epd__req_find(c, request_id);

    if (r == NULL) {
        return EPD_ERR_NOT_FOUND;
    }
    r->aborted = 1;
    epd__abort_sides(c, r, 1, 1, EPD_ERR_CANCELED, "client abort");
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
                epd__abort_sides(c, r, 1, 1, EPD_ERR_TIMEOUT, msg);
                epd__req_fail(c, r, EPD_CLIENT_EV_ERROR, EPD_ERR_TIMEOUT, msg, "client");
                next = c->buckets[b];
            } else if (r->abort_pending_p || r->abort_pending_d || r->abort_pending_e != 0) {
                epd__abort_sides(c, r, r->abort_pending_p || r->abort_pending_e != 0,
                                 r->abort_pending_d, EPD_ERR_CANCELED, "client abort");
            }
            r = next;
        }
    }
}

int epd_client_poll(epd_client_t *c, int timeout_ms)
{
    int n = epd_xport_poll(c->x, timeout_ms > 50 ? 50 : timeout_ms);

    epd_client_tick(c);
    return n;
}

void epd_client_stats(const epd_client_t *c, epd_client_stats_t *stats_p)
{
    *stats_p = c->stats;
}
