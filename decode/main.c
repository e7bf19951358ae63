/*
 * epd-decode — the decode daemon.
 *
 * Threads:
 *   - the loop thread (libuv) owns every piece of state: requests, the block
 *     allocator, peers, endpoints.  It drives the transport (epd_xport_uv:
 *     uv_poll on its fd + bounded progress batches + a tick timer for
 *     keepalives and peer timeouts), serves the gRPC control handlers
 *     (epd_rpc runs them here), verifies PrefillComplete checksums (hashing
 *     the prompt's KV; cheap next to prefill itself), and streams tokens;
 *   - the compute thread (epd_decode_batch) runs the continuous batch over
 *     the engine and never calls the transport;
 *   - gRPC's own threads (epd_rpc's completion-queue thread posts to the
 *     loop).
 * Hand-offs: loop → compute through a bounded SPSC queue of sequences
 * (full: the request stays on the loop's pending-join list and is retried
 * at the next wake-up); compute → loop through a second bounded SPSC queue
 * + uv_async.  Nothing on the loop waits for compute.
 *
 * A request (proto/README.md): GenerateRequest from the client C → validate
 * and reserve blocks (+ a state slot) → KvReservation to the prefill worker
 * P → PrefillComplete from P's expected epoch → verify checksums →
 * TokenChunk{0, [first]} → the batch → TokenChunks → final chunk → blocks
 * free.  Aborts, leases, P death and restarts quarantine blocks until P can
 * no longer write (rule 8): see epd_decode_blocks.h for the lifecycle.
 *
 * Replies to C go on the endpoint its GenerateRequest arrived on; messages
 * to P on one endpoint per P worker that this daemon connects; every
 * received message is attributed by its Envelope.sender.  Sends the
 * transport refuses for backpressure wait, in order, on a bounded
 * per-endpoint list and are retried on a 1 ms timer.  Endpoint failures
 * (the transport's error callback, which epd_xport_send may run
 * synchronously) and closes are handled from a zero-delay reap timer, so no
 * handler ever sees its link or request freed under it.
 *
 * Checksums of PrefillComplete are verified here, on the loop thread
 * (epd_decode_check_kv: one streaming xxh3 pass over the prompt's blocks of
 * each attention layer and the state slot of each linear layer).
 *
 * Leases: one sweep timer (lease/8) fails a RESERVED request whose P said
 * nothing about it for lease_ms, unless P is speaking about other requests
 * (it is alive and working through its queue), for at most 4 leases; it
 * also re-sends Abort to P for quarantined requests every lease and
 * enforces GenerateRequest.deadline_ms.
 */
#include <assert.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "epd_alloc.h"
#include "epd_config.h"
#include "epd_decode_batch.h"
#include "epd_decode_blocks.h"
#include "epd_decode_check.h"
#include "epd_engine.h"
#include "epd_hash.h"
#include "epd_layout.h"
#include "epd_log.h"
#include "epd_msg.h"
#include "epd_registrar.h"
#include "epd_rng.h"
#include "epd_rpc.h"
#include "epd_time.h"
#include "epd_trace.h"
#include "epd_xport.h"
#include "epd_xport_uv.h"

/* UCX and libfabric keep process-wide allocations until exit (not epd's):
 * LeakSanitizer must not fail a clean sanitizer-build shutdown on them. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libucs.so\nleak:libucp.so\nleak:libuct.so\nleak:libucm.so\n"
           "leak:libfabric.so\nleak:librdmacm.so\nleak:libibverbs.so\n";
}

#define COMP "decode"
#define DEC_MAX_MSG (64u * 1024u)
#define DEC_OUTBOX_MAX 4096u /* sends waiting for transport room, all endpoints */
#define DEC_CHUNK_MAX 4096u  /* tokens per TokenChunk */
#define DEC_LOG_BURST 20     /* refusal log lines per second before suppression */
#define DEC_JOIN_QUEUE 256u  /* loop → compute queue */

/* ------------------------------------------------------------------ types */

typedef struct dec_daemon dec_daemon_t;
typedef struct dec_link dec_link_t;
typedef struct dec_peer dec_peer_t;
typedef struct dec_req dec_req_t;

typedef struct dec_outmsg {
    struct dec_outmsg *next;
    size_t len;
    unsigned flags;
    unsigned char data[];
} dec_outmsg_t;

enum { LINK_CLIENT = 1, LINK_PEER = 2 };

/* One endpoint (the transport's user pointer). */
struct dec_link {
    int kind;
    dec_daemon_t *d;
    epd_xport_ep_t *ep;
    dec_outmsg_t *out_head, *out_tail;
    int on_retry;
    dec_link_t *retry_next;
    dec_link_t *prev, *next; /* d->links */
    dec_req_t *reqs;         /* LINK_CLIENT: requests answered here (c_next) */
    dec_peer_t *peer;        /* LINK_PEER */
    /* Endpoints are closed and failures handled from the reap timer, never
     * inside a transport callback or a message handler that may still use
     * the link (epd_xport_send runs the error callback synchronously). */
    int closing; /* detached: close at the next reap */
    int failed;  /* the transport's error callback ran */
    epd_status_t fail_status;
};

/* A prefill worker: one record per worker id, holding its newest epoch. */
struct dec_peer {
    char *worker_id;
    uint64_t epoch_start, epoch_nonce;
    dec_link_t *link;  /* our endpoint to it, NULL when none */
    uint64_t xport_id; /* its transport worker id (0: not known yet) */
    uint64_t heard_ns; /* last message from this incarnation */
    dec_req_t *reqs;   /* requests bound to this epoch (p_next) */
    dec_peer_t *next;
};

typedef enum {
    RS_RESERVED = 1, /* blocks RESERVED, waiting for P */
    RS_READY,        /* verified, blocks ACTIVE, waiting to join the batch */
    RS_RUNNING,      /* lent to the compute thread */
    RS_QUARANTINED,  /* answered; blocks QUARANTINED until P is done */
} dec_req_state_t;

struct dec_req {
    uint64_t id;
    dec_req_state_t state;
    uint64_t client_hash; /* hash of the client's worker id (Abort check) */
    dec_link_t *client;   /* NULL once answered finally or gone */
    dec_req_t *c_prev, *c_next;
    dec_peer_t *peer; /* until P is done with it */
    dec_req_t *p_prev, *p_next;
    dec_req_t *h_next; /* hash chain */
    dec_req_t *j_next; /* pending-join list */
    uint32_t n_prompt;
    uint32_t max_tokens;
    uint32_t n_blocks; /* reserved: prompt + max_tokens */
    uint32_t n_prompt_blocks;
    uint32_t slot;
    uint32_t *blocks;   /* [n_blocks] */
    uint32_t *stop_ids; /* [n_stop] */
    uint32_t n_stop;
    uint32_t n_sent;        /* tokens sent to C */
    uint64_t lease_ns;      /* RESERVED: P must speak before this... */
    uint64_t lease_cap_ns;  /* ...or, while P is busy with others, this */
    uint64_t deadline_ns;   /* whole request (0: none) */
    uint64_t abort_sent_ns; /* QUARANTINED: last Abort sent to P */
    uint64_t t_join_ns;     /* trace: KV held and verified (0: first step traced) */
    /* per-layer verification (LayerDone landed = true): layer l was hashed
     * on arrival and matched layer_sums[l]; PrefillComplete then checks only
     * the others (and that it agrees with these) */
    uint64_t *layer_sums; /* [n_layers] */
    uint8_t *layer_ok;    /* [n_layers] */
    uint32_t n_layers_ok;
    uint64_t kv_bytes;    /* hashed so far (verified) */
    epd_decode_seq_t seq;
};

typedef struct {
    const char *model;
    const char *engine;
    const char *worker_id;
    const char *transport;
    const char *expect;
    const char *provider;
    const char *control_addr;
    const char *ready_file;
    const char *log_level;
    int64_t kv_blocks;
    int64_t state_slots;
    int64_t block_tokens;
    int64_t max_batch;
    int64_t lease_ms;
    int64_t peer_timeout_ms;
    int64_t connect_timeout_ms;
    const char *trace;    /* --trace FILE: Chrome trace JSON written at exit */
    int64_t trace_events; /* --trace-events: recorder capacity */
    const char *router;   /* --router HOST:PORT: register and heartbeat (NULL: no) */
} dec_args_t;

struct dec_daemon {
    dec_args_t a;
    char worker_id[128];
    uint64_t epoch_start, epoch_nonce;
    uint64_t seq_no;
    uv_loop_t loop;
    uv_signal_t sigterm, sigint, sigusr1;
    uv_timer_t sweep, retry, reap;
    epd_trace_t *trace; /* NULL: tracing off */
    uv_async_t wake;
    int stopping;
    int draining;

    epd_engine_t *engine;
    const epd_engine_info_t *info;
    char pattern[EPD_LAYOUT_PATTERN_MAX];
    Epd__KvLayout layout_msg;

    epd_xport_t *x;
    epd_xport_uv_t *xuv;
    const void *addr;
    size_t addr_len;
    epd_xport_mr_t *mr;
    unsigned char rkey[EPD_XPORT_RKEY_MAX];
    size_t rkey_len;
    epd_kv_pool_t pool;

    epd_decode_blocks_t *blocks;
    epd_decode_batch_t *batch;
    epd_hash_state_t *hash;
    epd_rpc_server_t *rpc;
    int rpc_port;
    epd_registrar_t *registrar; /* --router; NULL = not registering */

    dec_req_t **table; /* [n_buckets] */
    size_t n_buckets;
    uint32_t n_reqs;
    dec_req_t *join_head, *join_tail;
    uint32_t n_join;
    dec_link_t *links;
    dec_link_t *retry_head;
    uint32_t n_outbox;
    dec_peer_t *peers;

    unsigned char *txbuf; /* [DEC_MAX_MSG] */
    /* counters */
    uint64_t n_bad_frames;
    uint64_t n_refused;
    uint64_t log_window_ns;
    uint32_t log_in_window;
    uint64_t log_suppressed;
    uint64_t kv_bytes_received; /* verified KV bytes of requests that joined */
};

static void dec_req_free(dec_daemon_t *d, dec_req_t *r);
static void dec_on_retry(uv_timer_t *t);
static void dec_on_reap(uv_timer_t *t);
static void dec_abort_req(dec_daemon_t *d, dec_req_t *r, const char *why);

/* ---------------------------------------------------------------- logging */

/* One refusal log line, at most DEC_LOG_BURST per second (floods of
 * garbage must not flood the log). */
__attribute__((format(printf, 3, 4))) static void dec_refuse_log(dec_daemon_t *d, uint64_t req_id,
                                                                 const char *fmt, ...)
{
    uint64_t now = epd_time_now_ns();
    char line[512];
    va_list ap;

    d->n_refused++;
    if (now - d->log_window_ns > EPD_NSEC_PER_SEC) {
        if (d->log_suppressed > 0) {
            epd_log_warn(COMP, 0, "%llu refusal log lines suppressed in the last second",
                         (unsigned long long)d->log_suppressed);
        }
        d->log_window_ns = now;
        d->log_in_window = 0;
        d->log_suppressed = 0;
    }
    if (d->log_in_window >= DEC_LOG_BURST) {
        d->log_suppressed++;
        return;
    }
    d->log_in_window++;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    epd_log_warn(COMP, req_id, "refused: %s", line);
}

/* ------------------------------------------------------------------ links */

static dec_link_t *dec_link_new(dec_daemon_t *d, int kind, epd_xport_ep_t *ep)
{
    dec_link_t *l = epd_calloc(1, sizeof(*l));

    if (l == NULL) {
        return NULL;
    }
    l->kind = kind;
    l->d = d;
    l->ep = ep;
    l->next = d->links;
    if (d->links != NULL) {
        d->links->prev = l;
    }
    d->links = l;
    epd_xport_ep_set_user(ep, l);
    return l;
}

static void dec_req_unlink_client(dec_req_t *r);

/* Drops the sends still waiting for transport room. */
static void dec_link_drop_out(dec_daemon_t *d, dec_link_t *l)
{
    while (l->out_head != NULL) {
        dec_outmsg_t *m = l->out_head;
        l->out_head = m->next;
        epd_free(m);
        d->n_outbox--;
    }
    l->out_tail = NULL;
    if (l->on_retry) {
        dec_link_t **pp = &d->retry_head;
        while (*pp != l) {
            pp = &(*pp)->retry_next;
        }
        *pp = l->retry_next;
        l->on_retry = 0;
    }
}

/* Closes the endpoint now (allowed inside transport callbacks: the
 * transport parks it until its own stack unwinds); nothing of the peer
 * arrives on it afterwards. */
static void dec_link_close_ep(dec_link_t *l)
{
    if (l->ep != NULL) {
        epd_xport_ep_set_user(l->ep, NULL);
        epd_xport_ep_close(l->ep);
        l->ep = NULL;
    }
}

/* Frees the link (closing its endpoint if still open). */
static void dec_link_free(dec_daemon_t *d, dec_link_t *l)
{
    /* requests answered here lose their client (replies are dropped) */
    while (l->reqs != NULL) {
        dec_req_unlink_client(l->reqs);
    }
    dec_link_drop_out(d, l);
    if (l->prev != NULL) {
        l->prev->next = l->next;
    } else {
        d->links = l->next;
    }
    if (l->next != NULL) {
        l->next->prev = l->prev;
    }
    dec_link_close_ep(l);
    epd_free(l);
}

/* Detaches `l` (its requests lose their client; a peer loses its link) and
 * closes its endpoint at once; the struct itself is freed at the next reap
 * (a handler up the stack may still hold it: it sees `closing`). */
static void dec_link_close(dec_daemon_t *d, dec_link_t *l)
{
    while (l->reqs != NULL) {
        dec_req_unlink_client(l->reqs);
    }
    if (l->peer != NULL) {
        l->peer->link = NULL;
        l->peer = NULL;
    }
    dec_link_drop_out(d, l);
    dec_link_close_ep(l);
    l->closing = 1;
    if (!d->stopping && !uv_is_active((uv_handle_t *)&d->reap)) {
        uv_timer_start(&d->reap, dec_on_reap, 0, 0);
    }
}

static void dec_retry_arm(dec_daemon_t *d, dec_link_t *l)
{
    if (!l->on_retry) {
        l->on_retry = 1;
        l->retry_next = d->retry_head;
        d->retry_head = l;
    }
    if (!uv_is_active((uv_handle_t *)&d->retry)) {
        uv_timer_start(&d->retry, dec_on_retry, 1, 1);
    }
}

static void dec_on_ep_error(void *arg, epd_xport_ep_t *ep, epd_status_t status);

/* Sends one frame on `l`, or keeps it (copied) behind earlier ones. */
static void dec_link_send_raw(dec_daemon_t *d, dec_link_t *l, const void *buf, size_t len,
                              unsigned flags)
{
    dec_outmsg_t *m;
    epd_status_t st;

    if (l->out_head == NULL) {
        st = epd_xport_send(l->ep, buf, len, flags);
        if (st == EPD_OK) {
            return;
        }
        if (st != EPD_ERR_NO_RESOURCE) {
            /* the endpoint failed: its error callback cleans up */
            epd_log_debug(COMP, 0, "send failed: %s", epd_status_string(st));
            return;
        }
    }
    /* A message that cannot be kept must not silently vanish from a stream
     * (the client would see a gap): the link is failed instead, so every
     * request on it ends with a clear error (client link: its requests are
     * aborted and its endpoint closed; prefill link: that worker is treated
     * as gone). */
    if (d->n_outbox >= DEC_OUTBOX_MAX) {
        epd_log_error(COMP, 0,
                      "%u sends already wait for the transport: failing the endpoint that "
                      "cannot keep up rather than dropping a message",
                      d->n_outbox);
        dec_on_ep_error(d, l->ep, EPD_ERR_NO_RESOURCE);
        return;
    }
    m = epd_malloc(sizeof(*m) + len);
    if (m == NULL) {
        epd_log_error(COMP, 0, "out of memory for an outgoing message: failing its endpoint");
        dec_on_ep_error(d, l->ep, EPD_ERR_NO_MEMORY);
        return;
    }
    m->next = NULL;
    m->len = len;
    m->flags = flags;
    memcpy(m->data, buf, len);
    if (l->out_tail != NULL) {
        l->out_tail->next = m;
    } else {
        l->out_head = m;
    }
    l->out_tail = m;
    d->n_outbox++;
    dec_retry_arm(d, l);
}

static void dec_on_retry(uv_timer_t *t)
{
    dec_daemon_t *d = t->data;
    dec_link_t *l = d->retry_head;

    d->retry_head = NULL;
    while (l != NULL) {
        dec_link_t *next = l->retry_next;

        l->on_retry = 0;
        while (l->out_head != NULL) {
            dec_outmsg_t *m = l->out_head;
            epd_status_t st = epd_xport_send(l->ep, m->data, m->len, m->flags);

            if (st == EPD_ERR_NO_RESOURCE) {
                break;
            }
            l->out_head = m->next;
            if (l->out_head == NULL) {
                l->out_tail = NULL;
            }
            epd_free(m);
            d->n_outbox--;
        }
        if (l->out_head != NULL) {
            l->on_retry = 1;
            l->retry_next = d->retry_head;
            d->retry_head = l;
        }
        l = next;
    }
    if (d->retry_head == NULL) {
        uv_timer_stop(&d->retry);
    }
}

/* Fills the envelope's sender and seq, encodes, sends. */
static void dec_send(dec_daemon_t *d, dec_link_t *l, Epd__Envelope *env, unsigned flags)
{
    Epd__SenderRef sender = EPD__SENDER_REF__INIT;
    Epd__Epoch epoch = EPD__EPOCH__INIT;
    size_t len;
    epd_status_t st;

    if (l == NULL || l->closing || l->failed) {
        return;
    }
    epoch.start_time_ns = d->epoch_start;
    epoch.nonce = d->epoch_nonce;
    sender.worker_id = d->worker_id;
    sender.epoch = &epoch;
    env->sender = &sender;
    env->seq = ++d->seq_no;
    st = epd_msg_encode(env, d->txbuf, DEC_MAX_MSG, &len);
    if (st != EPD_OK) {
        epd_log_error(COMP, epd_msg_request_id(env), "cannot encode %s: %s", epd_msg_body_name(env),
                      epd_status_string(st));
        return;
    }
    dec_link_send_raw(d, l, d->txbuf, len, flags);
}

/* An Error naming `culprit` (NULL: none), the worker whose failure this
 * relays (the request's prefill worker), for the client's retries. */
static void dec_send_error_by(dec_daemon_t *d, dec_link_t *l, uint64_t id, epd_status_t status,
                              const char *msg, const char *culprit)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__Error e = EPD__ERROR__INIT;

    e.request_id = id;
    e.status = status;
    e.message = (char *)msg;
    if (culprit != NULL && culprit[0] != '\0') {
        e.culprit = (char *)culprit;
    }
    env.body_case = EPD__ENVELOPE__BODY_ERROR;
    env.error = &e;
    dec_send(d, l, &env, 0);
}

static void dec_send_error(dec_daemon_t *d, dec_link_t *l, uint64_t id, epd_status_t status,
                           const char *msg)
{
    dec_send_error_by(d, l, id, status, msg, NULL);
}

static void dec_send_refused(dec_daemon_t *d, dec_link_t *l, uint64_t id, epd_status_t status,
                             const char *reason)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__KvRefused r = EPD__KV_REFUSED__INIT;

    r.request_id = id;
    r.status = status;
    r.reason = (char *)reason;
    env.body_case = EPD__ENVELOPE__BODY_REFUSED;
    env.refused = &r;
    dec_send(d, l, &env, 0);
}

static void dec_send_abort(dec_daemon_t *d, dec_link_t *l, uint64_t id, epd_status_t status,
                           const char *reason)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__Abort a = EPD__ABORT__INIT;

    a.request_id = id;
    a.status = status;
    a.reason = (char *)reason;
    env.body_case = EPD__ENVELOPE__BODY_ABORT;
    env.abort = &a;
    dec_send(d, l, &env, 0);
}

static void dec_send_chunk(dec_daemon_t *d, dec_link_t *l, uint64_t id, uint32_t index,
                           const int32_t *tokens, uint32_t n, Epd__FinishReason finish)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__TokenChunk c = EPD__TOKEN_CHUNK__INIT;

    c.request_id = id;
    c.index = index;
    /* int32_t and uint32_t may alias; token ids are < vocab */
    c.tokens = (uint32_t *)(uintptr_t)tokens;
    c.n_tokens = n;
    c.finish = finish;
    env.body_case = EPD__ENVELOPE__BODY_TOKENS;
    env.tokens = &c;
    dec_send(d, l, &env, 0);
}

/* ------------------------------------------------------------------ peers */

static int dec_epoch_cmp(uint64_t s1, uint64_t n1, uint64_t s2, uint64_t n2)
{
    if (s1 != s2) {
        return s1 < s2 ? -1 : 1;
    }
    if (n1 != n2) {
        return n1 < n2 ? -1 : 1;
    }
    return 0;
}

static dec_peer_t *dec_peer_find(dec_daemon_t *d, const char *worker_id)
{
    for (dec_peer_t *p = d->peers; p != NULL; p = p->next) {
        if (strcmp(p->worker_id, worker_id) == 0) {
            return p;
        }
    }
    return NULL;
}

static void dec_req_unlink_peer(dec_req_t *r)
{
    if (r->peer == NULL) {
        return;
    }
    if (r->p_prev != NULL) {
        r->p_prev->p_next = r->p_next;
    } else {
        r->peer->reqs = r->p_next;
    }
    if (r->p_next != NULL) {
        r->p_next->p_prev = r->p_prev;
    }
    r->peer = NULL;
    r->p_prev = r->p_next = NULL;
}

static void dec_req_unlink_client(dec_req_t *r)
{
    if (r->client == NULL) {
        return;
    }
    if (r->c_prev != NULL) {
        r->c_prev->c_next = r->c_next;
    } else {
        r->client->reqs = r->c_next;
    }
    if (r->c_next != NULL) {
        r->c_next->c_prev = r->c_prev;
    }
    r->client = NULL;
    r->c_prev = r->c_next = NULL;
}

static void dec_peer_close_link(dec_daemon_t *d, dec_peer_t *p)
{
    if (p->link != NULL) {
        dec_link_close(d, p->link);
    }
}

/*
 * The prefill incarnation `p` is gone (its endpoint failed, or a newer epoch
 * appeared): nothing of it can write any more once its endpoint is closed.
 * Requests still waiting for it fail; quarantined blocks return to the pool.
 */
static void dec_peer_gone(dec_daemon_t *d, dec_peer_t *p, epd_status_t why, const char *what)
{
    uint32_t failed = 0;
    uint32_t released = 0;

    if (p->xport_id == 0 && p->link != NULL) {
        p->xport_id = epd_xport_ep_peer_id(p->link->ep);
    }
    dec_peer_close_link(d, p);
    /* and the endpoints it opened to us (its writes and messages travel on
     * those): nothing of this incarnation may land after this point */
    if (p->xport_id != 0) {
        dec_link_t *l = d->links;

        while (l != NULL) {
            dec_link_t *next = l->next;

            if (l->kind == LINK_CLIENT && !l->closing &&
                epd_xport_ep_peer_id(l->ep) == p->xport_id) {
                while (l->reqs != NULL) {
                    dec_req_t *r = l->reqs;

                    dec_req_unlink_client(r);
                    dec_abort_req(d, r, "client endpoint closed with its prefill worker");
                }
                epd_log_info(COMP, 0, "closing the endpoint prefill worker %s opened to us",
                             p->worker_id);
                dec_link_close(d, l);
            }
            l = next;
        }
        p->xport_id = 0;
    }
    while (p->reqs != NULL) {
        dec_req_t *r = p->reqs;
        epd_status_t st;

        dec_req_unlink_peer(r);
        if (r->state == RS_RESERVED) {
            char msg[160];

            snprintf(msg, sizeof(msg), "prefill worker %s %s before completing the request",
                     p->worker_id, what);
            dec_send_error(d, r->client, r->id, why, msg);
            st = epd_decode_blocks_quarantine(d->blocks, r->id, r->blocks, r->n_blocks, r->slot);
            assert(st == EPD_OK);
            failed++;
        }
        assert(r->state == RS_RESERVED || r->state == RS_QUARANTINED);
        st = epd_decode_blocks_release(d->blocks, r->id, r->blocks, r->n_blocks, r->slot);
        assert(st == EPD_OK);
        (void)st;
        released++;
        dec_req_free(d, r);
    }
    epd_log_warn(COMP, 0, "prefill worker %s %s: %u requests failed, %u requests' blocks released",
                 p->worker_id, what, failed, released);
}

/*
 * Looks up (or creates) the record of prefill worker `id` at epoch (s, n).
 * An older epoch than the newest seen → EPD_ERR_STALE_EPOCH.  A newer one
 * retires the old incarnation first (rule 10).
 */
static epd_status_t dec_peer_get(dec_daemon_t *d, const char *id, uint64_t s, uint64_t n,
                                 dec_peer_t **peer_p)
{
    dec_peer_t *p = dec_peer_find(d, id);
    int c;

    if (p == NULL) {
        p = epd_calloc(1, sizeof(*p));
        if (p == NULL) {
            return EPD_ERR_NO_MEMORY;
        }
        p->worker_id = epd_strdup(id);
        if (p->worker_id == NULL) {
            epd_free(p);
            return EPD_ERR_NO_MEMORY;
        }
        p->epoch_start = s;
        p->epoch_nonce = n;
        p->next = d->peers;
        d->peers = p;
        *peer_p = p;
        return EPD_OK;
    }
    c = dec_epoch_cmp(s, n, p->epoch_start, p->epoch_nonce);
    if (c < 0) {
        return EPD_ERR_STALE_EPOCH;
    }
    if (c > 0) {
        dec_peer_gone(d, p, EPD_ERR_PEER_DEAD, "restarted (newer epoch)");
        p->epoch_start = s;
        p->epoch_nonce = n;
    }
    *peer_p = p;
    return EPD_OK;
}

static void dec_on_connect(void *arg, epd_status_t status)
{
    (void)arg;
    if (status != EPD_OK) {
        epd_log_warn(COMP, 0, "connect to a prefill worker failed: %s", epd_status_string(status));
    }
}

/* Our endpoint to `p`, connecting when there is none. */
static dec_link_t *dec_peer_link(dec_daemon_t *d, dec_peer_t *p, const void *addr, size_t len)
{
    epd_xport_ep_t *ep;
    epd_status_t st;

    if (p->link != NULL) {
        return p->link;
    }
    if (addr == NULL || len == 0) {
        return NULL;
    }
    st = epd_xport_connect(d->x, addr, len, dec_on_connect, d, &ep);
    if (st != EPD_OK && st != EPD_INPROGRESS) {
        dec_refuse_log(d, 0, "cannot connect to prefill worker %s: %s", p->worker_id,
                       epd_status_string(st));
        return NULL;
    }
    p->link = dec_link_new(d, LINK_PEER, ep);
    if (p->link == NULL) {
        epd_xport_ep_close(ep);
        return NULL;
    }
    p->link->peer = p;
    epd_log_info(COMP, 0, "connecting to prefill worker %s", p->worker_id);
    return p->link;
}

/* --------------------------------------------------------------- requests */

static size_t dec_bucket(const dec_daemon_t *d, uint64_t id)
{
    return (size_t)(epd_hash64(&id, sizeof(id), 0) & (d->n_buckets - 1));
}

static dec_req_t *dec_req_find(dec_daemon_t *d, uint64_t id)
{
    for (dec_req_t *r = d->table[dec_bucket(d, id)]; r != NULL; r = r->h_next) {
        if (r->id == id) {
            return r;
        }
    }
    return NULL;
}

static void dec_join_remove(dec_daemon_t *d, dec_req_t *r)
{
    dec_req_t **pp = &d->join_head;
    dec_req_t *prev = NULL;

    while (*pp != NULL && *pp != r) {
        prev = *pp;
        pp = &(*pp)->j_next;
    }
    assert(*pp == r);
    *pp = r->j_next;
    if (d->join_tail == r) {
        d->join_tail = prev;
    }
    r->j_next = NULL;
    d->n_join--;
}

/* Unhashes and frees a request whose blocks are already back (or were
 * never taken). */
static void dec_req_free(dec_daemon_t *d, dec_req_t *r)
{
    dec_req_t **pp = &d->table[dec_bucket(d, r->id)];

    while (*pp != NULL && *pp != r) {
        pp = &(*pp)->h_next;
    }
    if (*pp == r) {
        *pp = r->h_next;
        d->n_reqs--;
    }
    dec_req_unlink_client(r);
    dec_req_unlink_peer(r);
    epd_free(r);
}

/* Answers the client finally (the caller sent the final message). */
static void dec_req_client_done(dec_req_t *r)
{
    dec_req_unlink_client(r);
}

/*
 * A RESERVED request ends before P completed (abort, lease, P's error): P is
 * told to stop, the blocks wait in quarantine for its WritesQuiesced /
 * PrefillComplete (or its death).
 */
static void dec_req_quarantine(dec_daemon_t *d, dec_req_t *r, epd_status_t why, const char *reason)
{
    epd_status_t st;

    assert(r->state == RS_RESERVED);
    st = epd_decode_blocks_quarantine(d->blocks, r->id, r->blocks, r->n_blocks, r->slot);
    assert(st == EPD_OK);
    (void)st;
    r->state = RS_QUARANTINED;
    dec_req_client_done(r);
    if (r->peer != NULL) {
        dec_send_abort(d, r->peer->link, r->id, why, reason);
    }
    r->abort_sent_ns = epd_time_now_ns();
}

/* P is done writing for a QUARANTINED request: its blocks are free. */
static void dec_req_release(dec_daemon_t *d, dec_req_t *r)
{
    epd_status_t st;

    assert(r->state == RS_QUARANTINED);
    st = epd_decode_blocks_release(d->blocks, r->id, r->blocks, r->n_blocks, r->slot);
    assert(st == EPD_OK);
    (void)st;
    dec_req_free(d, r);
}

/* A READY request (blocks ACTIVE, not in the batch) ends. */
static void dec_req_retire(dec_daemon_t *d, dec_req_t *r)
{
    epd_status_t st;

    st = epd_decode_blocks_retire(d->blocks, r->id, r->blocks, r->n_blocks, r->slot);
    assert(st == EPD_OK);
    (void)st;
    dec_req_free(d, r);
}

/* Hands READY requests to the compute thread while its queue has room. */
static void dec_join_pump(dec_daemon_t *d)
{
    while (d->batch != NULL && d->join_head != NULL) {
        dec_req_t *r = d->join_head;

        if (epd_decode_batch_submit(d->batch, &r->seq) != EPD_OK) {
            return; /* full: retried at the next wake-up */
        }
        d->join_head = r->j_next;
        if (d->join_head == NULL) {
            d->join_tail = NULL;
        }
        r->j_next = NULL;
        d->n_join--;
        r->state = RS_RUNNING;
    }
}

/* Sends the tokens produced since the last chunk (and the finish). */
static void dec_req_stream(dec_daemon_t *d, dec_req_t *r, uint32_t n_produced,
                           Epd__FinishReason finish)
{
    if (r->client == NULL) {
        return;
    }
    while (r->n_sent < n_produced || finish != EPD__FINISH_REASON__FINISH_NONE) {
        uint32_t n = n_produced - r->n_sent;
        int last;

        if (n > DEC_CHUNK_MAX) {
            n = DEC_CHUNK_MAX;
        }
        last = r->n_sent + n == n_produced;
        dec_send_chunk(d, r->client, r->id, r->n_sent, r->seq.tokens + r->n_sent, n,
                       last ? finish : EPD__FINISH_REASON__FINISH_NONE);
        r->n_sent += n;
        if (last) {
            break;
        }
    }
}

static void dec_on_wake(uv_async_t *h)
{
    dec_daemon_t *d = h->data;
    epd_decode_seq_t *seq;
    int final;

    if (d->batch == NULL) {
        return; /* stopping */
    }
    while ((seq = epd_decode_batch_poll(d->batch, &final)) != NULL) {
        dec_req_t *r = (dec_req_t *)((char *)seq - offsetof(dec_req_t, seq));
        uint32_t n = atomic_load_explicit(&seq->n_produced, memory_order_acquire);

        if (r->t_join_ns != 0 && n >= 2) {
            /* from joining the batch to the loop seeing its first decoded
             * token (batch wait + one step + the hand-back) */
            epd_trace_span(d->trace, "first decode step", "compute", r->id, -1, r->t_join_ns,
                           epd_time_now_ns());
            r->t_join_ns = 0;
        }
        if (!final) {
            dec_req_stream(d, r, n, EPD__FINISH_REASON__FINISH_NONE);
            continue;
        }
        switch ((epd_decode_finish_t)atomic_load_explicit(&seq->finish, memory_order_acquire)) {
        case EPD_DECODE_FINISH_LENGTH:
            dec_req_stream(d, r, n, EPD__FINISH_REASON__FINISH_LENGTH);
            break;
        case EPD_DECODE_FINISH_STOP:
            dec_req_stream(d, r, n, EPD__FINISH_REASON__FINISH_STOP);
            break;
        case EPD_DECODE_FINISH_ABORT:
            /* the client was answered when it asked (or is gone) */
            dec_req_stream(d, r, r->n_sent, EPD__FINISH_REASON__FINISH_ABORT);
            break;
        case EPD_DECODE_FINISH_ERROR:
        case EPD_DECODE_FINISH_NONE:
            epd_log_error(COMP, r->id, "generation failed: %s", epd_status_string(seq->error));
            dec_send_error(d, r->client, r->id, seq->error != EPD_OK ? seq->error : EPD_ERR_FATAL,
                           "decode step failed");
            break;
        }
        epd_log_debug(COMP, r->id, "finished after %u tokens", n);
        r->state = RS_READY; /* back from the compute thread */
        dec_req_retire(d, r);
    }
    dec_join_pump(d);
}

static void dec_wake_from_compute(void *arg)
{
    dec_daemon_t *d = arg;

    uv_async_send(&d->wake);
}

/* --------------------------------------------------------------- messages */

static void dec_on_generate(dec_daemon_t *d, dec_link_t *from, const Epd__Envelope *env)
{
    const Epd__GenerateRequest *g = env->generate;
    epd_decode_limits_t lim = {.vocab_size = d->info->vocab_size,
                               .max_context = d->info->max_context};
    Epd__Envelope out = EPD__ENVELOPE__INIT;
    Epd__KvReservation kr = EPD__KV_RESERVATION__INIT;
    epd_sample_params_t sp;
    dec_peer_t *peer = NULL;
    dec_link_t *plink;
    dec_req_t *r;
    const char *why = NULL;
    epd_status_t st;
    uint64_t n_total;
    uint64_t t_recv = epd_time_now_ns();
    uint32_t n_blocks;
    int p_ok;
    size_t sz;

    /* can P be told?  (an identifiable, reachable, current incarnation) */
    p_ok = g->prefill_worker_id != NULL && g->prefill_worker_id[0] != '\0' &&
           strlen(g->prefill_worker_id) < 128 && g->prefill_epoch != NULL &&
           g->prefill_address.len > 0 && g->prefill_address.len <= EPD_XPORT_ADDR_MAX;

    if (g->decode_epoch == NULL || g->decode_epoch->start_time_ns != d->epoch_start ||
        g->decode_epoch->nonce != d->epoch_nonce) {
        st = EPD_ERR_STALE_EPOCH;
        why = "request names another decode incarnation (epoch)";
    } else if (g->decode_worker_id != NULL && g->decode_worker_id[0] != '\0' &&
               strcmp(g->decode_worker_id, d->worker_id) != 0) {
        st = EPD_ERR_INVALID_PARAM;
        why = "request names another decode worker";
    } else if (d->draining || d->stopping) {
        st = EPD_ERR_DRAINING;
        why = "decode worker is draining";
    } else if (dec_req_find(d, g->request_id) != NULL) {
        /* the live request keeps its P: P must not hear about this one */
        dec_refuse_log(d, g->request_id, "generate: request id already live");
        dec_send_error(d, from, g->request_id, EPD_ERR_EXISTS, "request id already live");
        return;
    } else if (!p_ok) {
        dec_refuse_log(d, g->request_id, "generate: no usable prefill worker id/epoch/address");
        dec_send_error(d, from, g->request_id, EPD_ERR_INVALID_PARAM,
                       "generate request without a usable prefill worker id, epoch and address");
        return;
    } else {
        st = epd_decode_check_generate(&lim, g, &sp, &why);
    }
    if (st == EPD_OK) {
        st = dec_peer_get(d, g->prefill_worker_id, g->prefill_epoch->start_time_ns,
                          g->prefill_epoch->nonce, &peer);
        if (st == EPD_ERR_STALE_EPOCH) {
            dec_refuse_log(d, g->request_id, "generate: prefill worker %s epoch is stale",
                           g->prefill_worker_id);
            dec_send_error(d, from, g->request_id, st,
                           "request names an old incarnation of its prefill worker");
            return;
        }
        if (st != EPD_OK) {
            why = "out of memory";
        }
    }
    if (st == EPD_OK) {
        n_total = (uint64_t)g->n_prompt_tokens + g->sampling->max_tokens;
        n_blocks = (uint32_t)epd_decode_div_up(n_total, d->info->kv.block_tokens);
        /* one block: the struct, per-layer sums (8-aligned right after it),
         * tokens, block ids, stop ids, per-layer flags */
        sz = sizeof(*r) + (size_t)d->info->kv.n_layers * sizeof(uint64_t) +
             (size_t)n_blocks * sizeof(uint32_t) +
             (size_t)g->sampling->n_stop_token_ids * sizeof(uint32_t) +
             (size_t)g->sampling->max_tokens * sizeof(int32_t) + d->info->kv.n_layers;
        r = epd_calloc(1, sz);
        if (r == NULL) {
            st = EPD_ERR_NO_MEMORY;
            why = "out of memory";
        }
    }
    if (st == EPD_OK) {
        r->id = g->request_id;
        r->n_prompt = (uint32_t)g->n_prompt_tokens;
        r->max_tokens = g->sampling->max_tokens;
        r->n_blocks = n_blocks;
        r->n_prompt_blocks = (uint32_t)epd_decode_div_up(r->n_prompt, d->info->kv.block_tokens);
        r->layer_sums = (uint64_t *)(r + 1);
        r->seq.tokens = (int32_t *)(r->layer_sums + d->info->kv.n_layers);
        r->blocks = (uint32_t *)(r->seq.tokens + r->max_tokens);
        r->stop_ids = r->blocks + n_blocks;
        r->n_stop = (uint32_t)g->sampling->n_stop_token_ids;
        r->layer_ok = (uint8_t *)(r->stop_ids + r->n_stop);
        if (r->n_stop > 0) {
            memcpy(r->stop_ids, g->sampling->stop_token_ids, r->n_stop * sizeof(uint32_t));
        }
        st = epd_decode_blocks_reserve(d->blocks, r->id, n_blocks, d->info->kv.n_linear_layers > 0,
                                       r->blocks, &r->slot);
        if (st != EPD_OK) {
            epd_free(r);
            why = st != EPD_ERR_NO_CAPACITY     ? "reservation failed"
                  : n_blocks > d->pool.n_blocks ? "request needs more KV blocks than the whole pool"
                                                : "not enough free KV blocks or state slots";
        }
    }
    if (st != EPD_OK) {
        dec_refuse_log(d, g->request_id, "generate: %s (%s)", why, epd_status_name(st));
        if (st == EPD_ERR_NO_CAPACITY) {
            dec_send_refused(d, from, g->request_id, st, why);
        } else {
            dec_send_error(d, from, g->request_id, st, why);
        }
        /* P got the same request and must not wait for a reservation */
        if (p_ok &&
            (peer != NULL || dec_peer_get(d, g->prefill_worker_id, g->prefill_epoch->start_time_ns,
                                          g->prefill_epoch->nonce, &peer) == EPD_OK)) {
            dec_send_refused(
                d, dec_peer_link(d, peer, g->prefill_address.data, g->prefill_address.len),
                g->request_id, st, why);
        }
        return;
    }

    /* bound to its client and P */
    r->state = RS_RESERVED;
    r->client_hash = epd_hash64(env->sender->worker_id, strlen(env->sender->worker_id), 0);
    r->client = from;
    r->c_next = from->reqs;
    if (from->reqs != NULL) {
        from->reqs->c_prev = r;
    }
    from->reqs = r;
    r->peer = peer;
    r->p_next = peer->reqs;
    if (peer->reqs != NULL) {
        peer->reqs->p_prev = r;
    }
    peer->reqs = r;
    r->h_next = d->table[dec_bucket(d, r->id)];
    d->table[dec_bucket(d, r->id)] = r;
    d->n_reqs++;
    r->lease_ns = epd_time_now_ns() + (uint64_t)d->a.lease_ms * EPD_NSEC_PER_MSEC;
    r->lease_cap_ns = r->lease_ns + 3 * (uint64_t)d->a.lease_ms * EPD_NSEC_PER_MSEC;
    /* a budget beyond a day is as good as none (and must not overflow) */
    r->deadline_ns = g->deadline_ms > 0 && g->deadline_ms <= 86400000ULL
                         ? epd_time_now_ns() + g->deadline_ms * EPD_NSEC_PER_MSEC
                         : 0;
    epd_decode_seq_init(&r->seq);
    r->seq.req_id = r->id;
    r->seq.block_table = r->blocks;
    r->seq.n_blocks = r->n_blocks;
    r->seq.slot = r->slot == EPD_DECODE_NO_SLOT ? 0 : r->slot;
    r->seq.n_prompt = r->n_prompt;
    r->seq.max_tokens = r->max_tokens;
    r->seq.sp = sp;
    r->seq.stop_ids = r->stop_ids;
    r->seq.n_stop = r->n_stop;

    plink = dec_peer_link(d, peer, g->prefill_address.data, g->prefill_address.len);
    if (plink == NULL) {
        /* P never sees the reservation: the blocks are free at once */
        dec_send_error(d, from, r->id, EPD_ERR_UNREACHABLE, "cannot reach the prefill worker");
        st = epd_decode_blocks_unreserve(d->blocks, r->id, r->blocks, r->n_blocks, r->slot);
        assert(st == EPD_OK);
        dec_req_free(d, r);
        return;
    }
    kr.request_id = r->id;
    kr.n_block_ids = r->n_prompt_blocks;
    kr.block_ids = r->blocks;
    kr.state_slot = r->seq.slot;
    kr.rkey.data = d->rkey;
    kr.rkey.len = d->rkey_len;
    kr.region_size = epd_xport_mr_size(d->mr);
    kr.layout = &d->layout_msg;
    kr.lease_ms = (uint32_t)d->a.lease_ms;
    kr.pool_blocks = d->pool.n_blocks;
    kr.pool_state_slots = d->pool.n_state_slots;
    out.body_case = EPD__ENVELOPE__BODY_RESERVATION;
    out.reservation = &kr;
    dec_send(d, plink, &out, 0);
    epd_trace_instant(d->trace, "GenerateRequest received", "msg", r->id, -1, t_recv);
    epd_trace_span(d->trace, "reserve", "wait", r->id, -1, t_recv, epd_time_now_ns());
    epd_trace_instant(d->trace, "KvReservation sent", "msg", r->id, -1, epd_time_now_ns());
    epd_log_debug(COMP, r->id, "reserved %u blocks (%u for the prompt), slot %d for %s",
                  r->n_blocks, r->n_prompt_blocks, (int)r->seq.slot, peer->worker_id);
}

/* Finds the request `id` that P (the envelope's sender) may speak about.
 * Refuses (log + Error reply) an unknown id when `answer_unknown`, a sender
 * that is not the request's P, a stale epoch. */
static dec_req_t *dec_req_of_peer(dec_daemon_t *d, dec_link_t *from, const Epd__Envelope *env,
                                  uint64_t id, int answer_unknown)
{
    dec_req_t *r = dec_req_find(d, id);
    const Epd__SenderRef *s = env->sender;

    if (r == NULL || r->peer == NULL) {
        if (answer_unknown) {
            dec_refuse_log(d, id, "%s from %s: unknown request id", epd_msg_body_name(env),
                           s->worker_id);
            dec_send_error(d, from, id, EPD_ERR_NOT_FOUND, "unknown request id");
        } else {
            epd_log_debug(COMP, id, "%s from %s for a request no longer waiting for it",
                          epd_msg_body_name(env), s->worker_id);
        }
        return NULL;
    }
    if (strcmp(r->peer->worker_id, s->worker_id) != 0) {
        dec_refuse_log(d, id, "%s from %s: not the request's prefill worker (%s)",
                       epd_msg_body_name(env), s->worker_id, r->peer->worker_id);
        dec_send_error(d, from, id, EPD_ERR_INVALID_PARAM,
                       "sender is not this request's prefill worker");
        return NULL;
    }
    if (dec_epoch_cmp(s->epoch->start_time_ns, s->epoch->nonce, r->peer->epoch_start,
                      r->peer->epoch_nonce) != 0) {
        dec_refuse_log(d, id, "%s from %s: epoch is not the request's", epd_msg_body_name(env),
                       s->worker_id);
        dec_send_error(d, from, id, EPD_ERR_STALE_EPOCH, "message from another incarnation");
        return NULL;
    }
    if (r->peer->xport_id == 0) {
        /* the transport identity of this incarnation: its endpoints are
         * closed with it when it dies */
        r->peer->xport_id = epd_xport_ep_peer_id(from->ep);
    }
    r->peer->heard_ns = epd_time_now_ns();
    return r;
}

/* The KV P wrote for a RESERVED request failed its checks (`st`, `why`;
 * bad_layer for EPD_ERR_CORRUPT): the client gets the error, P too unless
 * the cache itself was corrupt, the blocks go to quarantine and are
 * released at once when P is done with them (`p_done`: PrefillComplete). */
static void dec_req_fail_kv(dec_daemon_t *d, dec_req_t *r, dec_link_t *from,
                            const Epd__Envelope *env, epd_status_t st, const char *why,
                            uint32_t bad_layer, int p_done)
{
    epd_status_t qst;

    if (st == EPD_ERR_CORRUPT) {
        epd_log_error(COMP, r->id,
                      "KV of layer %u from %s does not match its checksum: "
                      "request failed, never generated",
                      bad_layer, env->sender->worker_id);
    } else {
        dec_refuse_log(d, r->id, "%s", why);
        dec_send_error(d, from, r->id, st, why);
    }
    dec_send_error(d, r->client, r->id, st, why);
    dec_req_client_done(r);
    if (!p_done) {
        /* P may still be writing: it is told to stop, and the blocks stay
         * quarantined until it says it is done (or is declared dead) */
        dec_req_quarantine(d, r, st, why);
        return;
    }
    qst = epd_decode_blocks_quarantine(d->blocks, r->id, r->blocks, r->n_blocks, r->slot);
    assert(qst == EPD_OK);
    (void)qst;
    r->state = RS_QUARANTINED;
    dec_req_release(d, r);
}

/* Hashes layer `layer` of a RESERVED request and compares it with `sum`;
 * on a match the layer is marked verified.  EPD_OK, or the failure
 * (*why_p set). */
static epd_status_t dec_verify_layer(dec_daemon_t *d, dec_req_t *r, uint32_t layer, uint64_t sum,
                                     const char **why_p)
{
    uint64_t bytes = 0;
    epd_status_t st;

    st = epd_decode_check_kv_layer(&d->info->kv, &d->pool, r->blocks, r->n_prompt_blocks,
                                   r->seq.slot, layer, sum, d->hash, &bytes);
    if (st == EPD_OK) {
        r->layer_ok[layer] = 1;
        r->layer_sums[layer] = sum;
        r->n_layers_ok++;
        r->kv_bytes += bytes;
    } else {
        *why_p = st == EPD_ERR_CORRUPT ? "KV checksum mismatch: the cache is corrupt"
                                       : "KV verification failed";
    }
    return st;
}

static void dec_on_prefill_complete(dec_daemon_t *d, dec_link_t *from, const Epd__Envelope *env)
{
    const Epd__PrefillComplete *pc = env->prefill_complete;
    dec_req_t *r = dec_req_of_peer(d, from, env, pc->request_id, 1);
    uint32_t bad_layer = 0;
    Epd__FinishReason fin = EPD__FINISH_REASON__FINISH_NONE;
    epd_status_t st = EPD_OK;
    const char *why = NULL;
    uint64_t t_recv = epd_time_now_ns();

    if (r == NULL) {
        return;
    }
    epd_trace_instant(d->trace, "PrefillComplete received", "msg", r->id, -1, t_recv);
    /* P's fence: every write of this request has landed, none will follow */
    dec_req_unlink_peer(r);
    if (r->state == RS_QUARANTINED) {
        epd_log_debug(COMP, r->id, "prefill completed after the request ended: blocks released");
        dec_req_release(d, r);
        return;
    }
    assert(r->state == RS_RESERVED);
    if (pc->n_prompt_tokens != r->n_prompt) {
        st = EPD_ERR_INVALID_PARAM;
        why = "PrefillComplete: prompt length differs from the request's";
    } else if (pc->first_token >= d->info->vocab_size) {
        st = EPD_ERR_INVALID_PARAM;
        why = "PrefillComplete: first token outside the vocabulary";
    } else if (pc->n_layer_checksums != d->info->kv.n_layers) {
        st = EPD_ERR_INVALID_PARAM;
        why = "PrefillComplete: wrong number of layer checksums";
    } else {
        /* the layers not verified as they landed (all of them when P sends
         * no landed LayerDones) */
        for (uint32_t l = 0; l < d->info->kv.n_layers && st == EPD_OK; l++) {
            if (r->layer_ok[l]) {
                if (r->layer_sums[l] != pc->layer_checksums[l]) {
                    st = EPD_ERR_INVALID_PARAM;
                    why = "PrefillComplete: a layer checksum differs from its LayerDone's";
                }
                continue;
            }
            st = dec_verify_layer(d, r, l, pc->layer_checksums[l], &why);
            bad_layer = l;
        }
        if (r->n_layers_ok < d->info->kv.n_layers || st != EPD_OK) {
            epd_trace_span(d->trace, "verify KV", "compute", r->id, -1, t_recv,
                           epd_time_now_ns());
        }
    }
    if (st != EPD_OK) {
        dec_req_fail_kv(d, r, from, env, st, why, bad_layer, 1);
        return;
    }
    d->kv_bytes_received += r->kv_bytes;
    st = epd_decode_blocks_activate(d->blocks, r->id, r->blocks, r->n_blocks, r->slot);
    assert(st == EPD_OK);
    (void)st;
    r->seq.tokens[0] = (int32_t)pc->first_token;
    /* the decode side holds all of the prompt's KV, verified: the end of
     * the transfer (epd-bench overhead measures up to here) */
    r->t_join_ns = epd_time_now_ns();
    epd_trace_instant(d->trace, "KV held", "xfer", r->id, -1, r->t_join_ns);
    for (uint32_t i = 0; i < r->n_stop; i++) {
        if (r->stop_ids[i] == pc->first_token) {
            fin = EPD__FINISH_REASON__FINISH_STOP;
        }
    }
    if ((int32_t)pc->first_token == d->info->eos_token) {
        fin = EPD__FINISH_REASON__FINISH_STOP;
    } else if (fin == EPD__FINISH_REASON__FINISH_NONE && r->max_tokens == 1) {
        fin = EPD__FINISH_REASON__FINISH_LENGTH;
    }
    r->state = RS_READY;
    dec_req_stream(d, r, 1, fin);
    if (fin != EPD__FINISH_REASON__FINISH_NONE) {
        dec_req_retire(d, r);
        return;
    }
    r->j_next = NULL;
    if (d->join_tail != NULL) {
        d->join_tail->j_next = r;
    } else {
        d->join_head = r;
    }
    d->join_tail = r;
    d->n_join++;
    dec_join_pump(d);
}

static void dec_on_quiesced(dec_daemon_t *d, dec_link_t *from, const Epd__Envelope *env)
{
    dec_req_t *r = dec_req_of_peer(d, from, env, env->quiesced->request_id, 0);

    if (r == NULL) {
        return;
    }
    dec_req_unlink_peer(r);
    if (r->state == RS_RESERVED) {
        /* P gave up on its own: nothing of it will land */
        dec_send_error(d, r->client, r->id, EPD_ERR_CANCELED, "prefill worker stopped the request");
        dec_req_client_done(r);
        dec_req_quarantine(d, r, EPD_ERR_CANCELED, "prefill stopped");
    }
    assert(r->state == RS_QUARANTINED);
    dec_req_release(d, r);
}

static void dec_on_layer_done(dec_daemon_t *d, dec_link_t *from, const Epd__Envelope *env)
{
    const Epd__LayerDone *ld = env->layer_done;
    dec_req_t *r = dec_req_of_peer(d, from, env, ld->request_id, 0);
    uint64_t now = epd_time_now_ns();
    const char *why = NULL;
    epd_status_t st;

    epd_trace_instant(d->trace, "LayerDone received", "msg", ld->request_id, (int32_t)ld->layer,
                      now);
    if (r == NULL || r->state != RS_RESERVED) {
        return;
    }
    r->lease_ns = now + (uint64_t)d->a.lease_ms * EPD_NSEC_PER_MSEC;
    if (!ld->landed) {
        return; /* a keep-alive */
    }
    if (ld->layer >= d->info->kv.n_layers) {
        dec_req_fail_kv(d, r, from, env, EPD_ERR_INVALID_PARAM,
                        "LayerDone: layer outside the model", 0, 0);
        return;
    }
    if (r->layer_ok[ld->layer]) {
        if (r->layer_sums[ld->layer] != ld->checksum) {
            dec_req_fail_kv(d, r, from, env, EPD_ERR_INVALID_PARAM,
                            "LayerDone: a second, different checksum for one layer", 0, 0);
        }
        return;
    }
    /* fenced behind the layer's writes: its bytes are final here */
    st = dec_verify_layer(d, r, ld->layer, ld->checksum, &why);
    epd_trace_span(d->trace, "verify layer", "compute", r->id, (int32_t)ld->layer, now,
                   epd_time_now_ns());
    if (st != EPD_OK) {
        dec_req_fail_kv(d, r, from, env, st, why, ld->layer, 0);
    }
}

/* Error / KvRefused / Abort from the request's P before it completed. */
static void dec_on_peer_failure(dec_daemon_t *d, dec_link_t *from, const Epd__Envelope *env,
                                uint64_t id, int32_t status, const char *text)
{
    dec_req_t *r = dec_req_of_peer(d, from, env, id, 0);
    char msg[256];

    if (r == NULL || r->state != RS_RESERVED) {
        return;
    }
    snprintf(msg, sizeof(msg), "prefill worker %s: %s", env->sender->worker_id,
             text != NULL && text[0] != '\0' ? text : epd_status_string((epd_status_t)status));
    if (status == EPD_ERR_CANCELED && env->body_case != EPD__ENVELOPE__BODY_REFUSED) {
        /* the client's Abort reached P first and P passed it on: end the
         * stream the way a direct Abort does */
        epd_log_debug(COMP, id, "%s (%s)", msg, epd_msg_body_name(env));
        dec_req_stream(d, r, r->n_sent, EPD__FINISH_REASON__FINISH_ABORT);
    } else {
        epd_log_warn(COMP, id, "%s (%s)", msg, epd_msg_body_name(env));
        /* relayed: the failure is the prefill worker's (or the one it
         * names, e.g. its encoder) */
        dec_send_error_by(d, r->client, r->id,
                          status < 0 ? (epd_status_t)status : EPD_ERR_CANCELED, msg,
                          env->body_case == EPD__ENVELOPE__BODY_ERROR &&
                                  env->error->culprit != NULL && env->error->culprit[0] != '\0'
                              ? env->error->culprit
                              : env->sender->worker_id);
    }
    dec_req_client_done(r);
    /* Abort makes P answer WritesQuiesced, which releases the blocks */
    dec_req_quarantine(d, r, EPD_ERR_CANCELED, "prefill failed");
}

/* Abort from the client (or the client's death: from == NULL). */
static void dec_abort_req(dec_daemon_t *d, dec_req_t *r, const char *why)
{
    dec_link_t *c = r->client;

    switch (r->state) {
    case RS_RESERVED:
        dec_req_stream(d, r, r->n_sent, EPD__FINISH_REASON__FINISH_ABORT);
        dec_req_quarantine(d, r, EPD_ERR_CANCELED, why);
        break;
    case RS_READY:
        dec_req_stream(d, r, r->n_sent, EPD__FINISH_REASON__FINISH_ABORT);
        dec_join_remove(d, r);
        dec_req_retire(d, r);
        break;
    case RS_RUNNING:
        /* leaves at the next step boundary; freed when the final entry comes */
        dec_req_stream(d, r, r->n_sent, EPD__FINISH_REASON__FINISH_ABORT);
        dec_req_client_done(r);
        epd_decode_seq_abort(&r->seq);
        break;
    case RS_QUARANTINED:
        break;
    }
    (void)c;
}

static void dec_on_abort(dec_daemon_t *d, dec_link_t *from, const Epd__Envelope *env)
{
    const Epd__Abort *a = env->abort;
    dec_req_t *r = dec_req_find(d, a->request_id);
    const char *sid = env->sender->worker_id;

    if (r != NULL && r->peer != NULL && strcmp(r->peer->worker_id, sid) == 0) {
        dec_on_peer_failure(d, from, env, a->request_id, a->status, a->reason);
        return;
    }
    if (r == NULL || r->state == RS_QUARANTINED || r->client == NULL) {
        dec_refuse_log(d, a->request_id, "abort from %s: unknown request id", sid);
        dec_send_error(d, from, a->request_id, EPD_ERR_NOT_FOUND, "unknown request id");
        return;
    }
    if (r->client_hash != epd_hash64(sid, strlen(sid), 0)) {
        dec_refuse_log(d, a->request_id, "abort from %s: not the request's client", sid);
        dec_send_error(d, from, a->request_id, EPD_ERR_NOT_FOUND, "no such request of this client");
        return;
    }
    epd_log_debug(COMP, r->id, "aborted by the client");
    dec_abort_req(d, r, "aborted by the client");
}

static void dec_on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    dec_daemon_t *d = arg;
    dec_link_t *from = epd_xport_ep_user(ep);
    Epd__Envelope *env = NULL;
    const char *why = NULL;
    dec_peer_t *p;
    uint64_t id;

    if (from == NULL || from->closing || from->failed) {
        return;
    }
    if (epd_msg_decode(data, len, &env, &why) != EPD_OK) {
        d->n_bad_frames++;
        dec_refuse_log(d, 0, "undecodable frame of %zu bytes: %s (%llu so far)", len,
                       why != NULL ? why : "?", (unsigned long long)d->n_bad_frames);
        return;
    }
    id = epd_msg_request_id(env);
    /* rule 10: a worker we know as a prefill peer must speak from its
     * newest epoch; a newer one retires the old incarnation */
    p = dec_peer_find(d, env->sender->worker_id);
    if (p != NULL) {
        int c = dec_epoch_cmp(env->sender->epoch->start_time_ns, env->sender->epoch->nonce,
                              p->epoch_start, p->epoch_nonce);
        if (c < 0) {
            dec_refuse_log(d, id, "%s from %s: stale epoch", epd_msg_body_name(env),
                           env->sender->worker_id);
            if (env->body_case != EPD__ENVELOPE__BODY_ERROR) {
                dec_send_error(d, from, id, EPD_ERR_STALE_EPOCH, "message from a stale epoch");
            }
            epd_msg_free(env);
            return;
        }
        if (c > 0) {
            dec_peer_gone(d, p, EPD_ERR_PEER_DEAD, "restarted (newer epoch)");
            p->epoch_start = env->sender->epoch->start_time_ns;
            p->epoch_nonce = env->sender->epoch->nonce;
            if (from->closing) {
                epd_msg_free(env); /* the old incarnation's endpoint */
                return;
            }
        }
    }
    switch (env->body_case) {
    case EPD__ENVELOPE__BODY_GENERATE:
        dec_on_generate(d, from, env);
        break;
    case EPD__ENVELOPE__BODY_PREFILL_COMPLETE:
        dec_on_prefill_complete(d, from, env);
        break;
    case EPD__ENVELOPE__BODY_QUIESCED:
        dec_on_quiesced(d, from, env);
        break;
    case EPD__ENVELOPE__BODY_LAYER_DONE:
        dec_on_layer_done(d, from, env);
        break;
    case EPD__ENVELOPE__BODY_ABORT:
        dec_on_abort(d, from, env);
        break;
    case EPD__ENVELOPE__BODY_ERROR:
        dec_on_peer_failure(d, from, env, id, env->error->status, env->error->message);
        break;
    case EPD__ENVELOPE__BODY_REFUSED:
        dec_on_peer_failure(d, from, env, id, env->refused->status, env->refused->reason);
        break;
    case EPD__ENVELOPE__BODY_RESERVATION:
    case EPD__ENVELOPE__BODY_TOKENS:
    case EPD__ENVELOPE__BODY__NOT_SET:
    default:
        dec_refuse_log(d, id, "%s from %s: not a message a decode worker takes",
                       epd_msg_body_name(env), env->sender->worker_id);
        dec_send_error(d, from, id, EPD_ERR_UNSUPPORTED, "decode workers do not take this message");
        break;
    }
    epd_msg_free(env);
}

static void dec_on_accept(void *arg, epd_xport_ep_t *ep)
{
    dec_daemon_t *d = arg;

    if (dec_link_new(d, LINK_CLIENT, ep) == NULL) {
        epd_log_error(COMP, 0, "out of memory for an incoming endpoint");
        epd_xport_ep_close(ep);
    }
}

static void dec_on_ep_error(void *arg, epd_xport_ep_t *ep, epd_status_t status)
{
    dec_daemon_t *d = arg;
    dec_link_t *l = epd_xport_ep_user(ep);

    if (l == NULL || l->closing || l->failed) {
        return;
    }
    l->failed = 1;
    l->fail_status = status;
    if (!d->stopping && !uv_is_active((uv_handle_t *)&d->reap)) {
        uv_timer_start(&d->reap, dec_on_reap, 0, 0);
    }
}

/* A failed endpoint: its prefill worker is dead, or its client is gone. */
static void dec_link_failed(dec_daemon_t *d, dec_link_t *l)
{
    if (l->kind == LINK_PEER && l->peer != NULL) {
        dec_peer_t *p = l->peer;

        epd_log_warn(COMP, 0, "endpoint to prefill worker %s failed: %s", p->worker_id,
                     epd_status_string(l->fail_status));
        /* closes its endpoints first: nothing of it can land afterwards */
        dec_peer_gone(d, p, EPD_ERR_PEER_DEAD, "declared dead");
        return;
    }
    if (l->reqs != NULL) {
        epd_log_warn(COMP, 0, "client endpoint failed (%s): aborting its requests",
                     epd_status_string(l->fail_status));
    }
    while (l->reqs != NULL) {
        dec_req_t *r = l->reqs;

        dec_req_unlink_client(r);
        dec_abort_req(d, r, "client gone");
    }
    dec_link_close(d, l);
}

static void dec_on_reap(uv_timer_t *t)
{
    dec_daemon_t *d = t->data;
    dec_link_t *l;

    /* failures first (they may close more links), then the closes */
    for (l = d->links; l != NULL; l = l->next) {
        if (l->failed && !l->closing) {
            dec_link_failed(d, l);
        }
    }
    l = d->links;
    while (l != NULL) {
        dec_link_t *next = l->next;

        if (l->closing) {
            dec_link_free(d, l);
        }
        l = next;
    }
}

/* ------------------------------------------------------------------ sweep */

static void dec_on_sweep(uv_timer_t *t)
{
    dec_daemon_t *d = t->data;
    uint64_t now = epd_time_now_ns();
    uint64_t lease = (uint64_t)d->a.lease_ms * EPD_NSEC_PER_MSEC;

    for (size_t b = 0; b < d->n_buckets; b++) {
        dec_req_t *r = d->table[b];

        while (r != NULL) {
            dec_req_t *next = r->h_next;
            int late = r->deadline_ns != 0 && now > r->deadline_ns && r->client != NULL;

            /* a reservation's lease runs while P says nothing about it; a P
             * that is speaking about other requests is alive and works
             * through its queue, so it gets up to 4 leases */
            int expired =
                r->state == RS_RESERVED && now > r->lease_ns &&
                (r->peer == NULL || now > r->peer->heard_ns + lease || now > r->lease_cap_ns);

            if (r->state == RS_RESERVED && (expired || late)) {
                const char *why = late ? "request deadline passed before prefill completed"
                                       : "prefill worker silent for the whole lease";

                epd_log_warn(COMP, r->id, "%s: failing the request", why);
                dec_send_error(d, r->client, r->id, EPD_ERR_TIMEOUT, why);
                dec_req_client_done(r);
                dec_req_quarantine(d, r, EPD_ERR_TIMEOUT, why);
            } else if (r->state == RS_QUARANTINED && r->peer != NULL &&
                       now - r->abort_sent_ns > lease) {
                /* P has not confirmed yet: ask again (it answers WritesQuiesced
                 * even for ids it forgot) */
                dec_send_abort(d, r->peer->link, r->id, EPD_ERR_CANCELED,
                               "request ended on the decode worker");
                r->abort_sent_ns = now;
            } else if (late && (r->state == RS_READY || r->state == RS_RUNNING)) {
                epd_log_warn(COMP, r->id, "request deadline passed: stopping it");
                dec_send_error(d, r->client, r->id, EPD_ERR_TIMEOUT, "request deadline passed");
                dec_req_client_done(r);
                if (r->state == RS_READY) {
                    dec_join_remove(d, r);
                    dec_req_retire(d, r);
                } else {
                    epd_decode_seq_abort(&r->seq);
                }
            }
            r = next;
        }
    }
    dec_join_pump(d);
}

/* ---------------------------------------------------------- control plane */

static void dec_fill_load(dec_daemon_t *d, Epd__Load *load)
{
    epd__load__init(load);
    load->queue_depth = d->n_join + (d->batch != NULL ? epd_decode_batch_queued(d->batch) : 0);
    load->kv_blocks_free = epd_decode_blocks_free(d->blocks);
    load->state_slots_free = epd_decode_blocks_slots_free(d->blocks);
    load->running_requests = d->batch != NULL ? epd_decode_batch_running(d->batch) : 0;
    load->kv_bytes_received = d->kv_bytes_received;
    load->draining = d->draining != 0;
}

static void dec_fill_capacity(dec_daemon_t *d, Epd__Capacity *cap)
{
    epd__capacity__init(cap);
    cap->kv_blocks_total = d->pool.n_blocks;
    cap->block_tokens = d->info->kv.block_tokens;
    cap->state_slots_total = d->pool.n_state_slots;
    cap->max_batch = (uint32_t)d->a.max_batch;
    cap->max_context = d->info->max_context;
}

static int dec_pack(const ProtobufCMessage *m, void **resp_p, size_t *resp_len_p, char *err,
                    size_t err_cap)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    void *buf = epd_malloc(n);

    if (buf == NULL) {
        snprintf(err, err_cap, "out of memory");
        return EPD_RPC_INTERNAL;
    }
    protobuf_c_message_pack(m, buf);
    *resp_p = buf;
    *resp_len_p = n;
    return EPD_RPC_OK;
}

static int dec_rpc(void *arg, const char *method, const void *req, size_t req_len, void **resp_p,
                   size_t *resp_len_p, char *err, size_t err_cap)
{
    dec_daemon_t *d = arg;
    Epd__Epoch epoch = EPD__EPOCH__INIT;
    Epd__WorkerIdentity ident = EPD__WORKER_IDENTITY__INIT;
    Epd__Load load;
    Epd__Capacity cap;

    epoch.start_time_ns = d->epoch_start;
    epoch.nonce = d->epoch_nonce;
    ident.worker_id = d->worker_id;
    ident.role = EPD__ROLE__ROLE_DECODE;
    ident.model = (char *)d->a.model;
    ident.epoch = &epoch;
    dec_fill_load(d, &load);
    dec_fill_capacity(d, &cap);

    if (strcmp(method, EPD_RPC_HEALTH) == 0) {
        Epd__HealthResponse h = EPD__HEALTH_RESPONSE__INIT;

        h.serving = !d->draining && !d->stopping;
        h.worker = &ident;
        h.load = &load;
        h.transport = (char *)d->a.transport;
        h.data_plane_address.data = (uint8_t *)(uintptr_t)d->addr;
        h.data_plane_address.len = d->addr_len;
        h.kv_layout = &d->layout_msg;
        h.capacity = &cap;
        h.draining = d->draining;
        return dec_pack(&h.base, resp_p, resp_len_p, err, err_cap);
    }
    if (strcmp(method, EPD_RPC_STATUS) == 0) {
        Epd__StatusResponse s = EPD__STATUS_RESPONSE__INIT;
        Epd__WorkerStatus w = EPD__WORKER_STATUS__INIT;
        Epd__WorkerStatus *ws[1] = {&w};

        w.worker = &ident;
        w.state = d->draining ? EPD__WORKER_STATE__WORKER_STATE_DRAINING
                              : EPD__WORKER_STATE__WORKER_STATE_READY;
        w.load = &load;
        w.capacity = &cap;
        s.n_workers = 1;
        s.workers = ws;
        return dec_pack(&s.base, resp_p, resp_len_p, err, err_cap);
    }
    if (strcmp(method, EPD_RPC_DRAIN) == 0) {
        Epd__DrainResponse r = EPD__DRAIN_RESPONSE__INIT;
        ProtobufCMessage *m = NULL;
        Epd__DrainRequest *dr;

        if (epd_proto_unpack(&epd__drain_request__descriptor, req, req_len, &m) != EPD_OK) {
            snprintf(err, err_cap, "malformed DrainRequest");
            return EPD_RPC_INVALID_ARGUMENT;
        }
        dr = (Epd__DrainRequest *)m;
        if (dr->worker_id == NULL || strcmp(dr->worker_id, d->worker_id) != 0) {
            snprintf(err, err_cap, "this is worker '%s', not '%s'", d->worker_id,
                     dr->worker_id != NULL ? dr->worker_id : "");
            epd_proto_free(m);
            return EPD_RPC_NOT_FOUND;
        }
        epd_proto_free(m);
        if (!d->draining) {
            epd_log_info(COMP, 0, "draining: new requests are refused, running ones finish");
        }
        d->draining = 1;
        r.ok = 1;
        return dec_pack(&r.base, resp_p, resp_len_p, err, err_cap);
    }
    if (strcmp(method, EPD_RPC_REGISTER) == 0 || strcmp(method, EPD_RPC_HEARTBEAT) == 0) {
        snprintf(err, err_cap, "%s is served by the router, not by a decode worker", method);
        return EPD_RPC_UNIMPLEMENTED;
    }
    snprintf(err, err_cap, "unknown method %s", method);
    return EPD_RPC_UNIMPLEMENTED;
}

/* ------------------------------------------------- router registration */

static void dec_registrar_load(void *arg, epd_registrar_load_t *l)
{
    dec_daemon_t *d = arg;
    Epd__Load load;

    dec_fill_load(d, &load);
    l->queue_depth = load.queue_depth;
    l->queued_tokens = load.queued_tokens;
    l->kv_blocks_free = load.kv_blocks_free;
    l->state_slots_free = load.state_slots_free;
    l->running_requests = load.running_requests;
    l->kv_bytes_received = load.kv_bytes_received;
    l->draining = load.draining;
}

static void dec_registrar_drain(void *arg)
{
    dec_daemon_t *d = arg;

    if (!d->draining) {
        epd_log_info(COMP, 0, "draining (asked by the router): new requests are refused, "
                              "running ones finish");
    }
    d->draining = 1;
}

/* --router: RegisterWorker + heartbeats on the registrar's thread.  The
 * model is named by the last component of --model, as the router's
 * --served-model-name default and the prefill worker do. */
static int dec_register(dec_daemon_t *d, const char *control_address)
{
    Epd__RegisterRequest r = EPD__REGISTER_REQUEST__INIT;
    Epd__WorkerIdentity ident = EPD__WORKER_IDENTITY__INIT;
    Epd__Epoch epoch = EPD__EPOCH__INIT;
    Epd__Capacity cap;
    epd_registrar_config_t cfg;
    char model[256];
    const char *end, *start;
    size_t n;
    void *buf;
    epd_status_t st;

    n = strlen(d->a.model);
    while (n > 1 && d->a.model[n - 1] == '/') {
        n--;
    }
    end = d->a.model + n;
    for (start = end; start > d->a.model && start[-1] != '/'; start--) {
    }
    snprintf(model, sizeof(model), "%.*s", (int)(end - start), start);
    epoch.start_time_ns = d->epoch_start;
    epoch.nonce = d->epoch_nonce;
    ident.worker_id = d->worker_id;
    ident.role = EPD__ROLE__ROLE_DECODE;
    ident.model = model;
    ident.epoch = &epoch;
    dec_fill_capacity(d, &cap);
    r.worker = &ident;
    r.transport = (char *)d->a.transport;
    r.data_plane_address.data = (uint8_t *)(uintptr_t)d->addr;
    r.data_plane_address.len = d->addr_len;
    r.control_address = (char *)control_address;
    r.capacity = &cap;
    r.kv_layout = &d->layout_msg;
    n = protobuf_c_message_get_packed_size(&r.base);
    buf = epd_malloc(n);
    if (buf == NULL) {
        st = EPD_ERR_NO_MEMORY;
    } else {
        protobuf_c_message_pack(&r.base, buf);
        memset(&cfg, 0, sizeof(cfg));
        cfg.router = d->a.router;
        cfg.request = buf;
        cfg.request_len = n;
        cfg.load_cb = dec_registrar_load;
        cfg.drain_cb = dec_registrar_drain;
        cfg.cb_arg = d;
        cfg.log_component = COMP;
        st = epd_registrar_start(&d->loop, &cfg, &d->registrar);
        epd_free(buf);
    }
    if (st != EPD_OK) {
        epd_log_error(COMP, 0, "cannot register with the router '%s': %s", d->a.router,
                      epd_status_string(st));
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- startup */

static void dec_on_closed(uv_handle_t *h)
{
    (void)h;
}

/* Writes the trace (--trace) now: blocking file I/O, so only at exit and on
 * an explicit SIGUSR1, never per request. */
static void dec_trace_write(dec_daemon_t *d)
{
    uint64_t n, dropped;
    epd_status_t st;

    if (d->trace == NULL) {
        return;
    }
    st = epd_trace_write_json(d->trace, d->a.trace, 0);
    epd_trace_counts(d->trace, &n, &dropped);
    if (st != EPD_OK) {
        epd_log_error(COMP, 0, "cannot write the trace '%s': %s", d->a.trace,
                      epd_status_string(st));
    } else {
        epd_log_info(COMP, 0, "trace: %llu events written to %s (%llu dropped: buffer full)",
                     (unsigned long long)n, d->a.trace, (unsigned long long)dropped);
    }
}

static void dec_on_sigusr1(uv_signal_t *s, int signum)
{
    (void)signum;
    dec_trace_write(s->data);
}

static void dec_shutdown(dec_daemon_t *d)
{
    if (d->stopping) {
        return;
    }
    d->stopping = 1;
    epd_log_info(COMP, 0, "stopping");
    epd_registrar_stop(d->registrar);
    d->registrar = NULL;
    epd_rpc_server_destroy(d->rpc);
    d->rpc = NULL;
    uv_close((uv_handle_t *)&d->sigterm, dec_on_closed);
    uv_close((uv_handle_t *)&d->sigint, dec_on_closed);
    uv_close((uv_handle_t *)&d->sigusr1, dec_on_closed);
    uv_close((uv_handle_t *)&d->sweep, dec_on_closed);
    uv_close((uv_handle_t *)&d->retry, dec_on_closed);
    uv_close((uv_handle_t *)&d->reap, dec_on_closed);
    /* the compute thread stops before the async handle goes */
    epd_decode_batch_destroy(d->batch);
    d->batch = NULL;
    uv_close((uv_handle_t *)&d->wake, dec_on_closed);
    epd_xport_uv_stop(d->xuv);
    d->xuv = NULL;
}

static void dec_on_signal(uv_signal_t *s, int signum)
{
    dec_daemon_t *d = s->data;

    epd_log_info(COMP, 0, "signal %d", signum);
    dec_shutdown(d);
}

static int dec_write_ready(const dec_daemon_t *d, const char *line)
{
    char tmp[4096];
    FILE *f;

    if (d->a.ready_file == NULL || d->a.ready_file[0] == '\0') {
        return 0;
    }
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", d->a.ready_file, (int)getpid());
    f = fopen(tmp, "w");
    if (f == NULL) {
        epd_log_error(COMP, 0, "cannot write ready file %s: %s", tmp, strerror(errno));
        return -1;
    }
    fputs(line, f);
    if (fclose(f) != 0 || rename(tmp, d->a.ready_file) != 0) {
        epd_log_error(COMP, 0, "cannot write ready file %s: %s", d->a.ready_file, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* Frees what is left at exit (requests, links, peers). */
static void dec_free_all(dec_daemon_t *d)
{
    for (size_t b = 0; b < d->n_buckets; b++) {
        while (d->table[b] != NULL) {
            dec_req_t *r = d->table[b];

            d->table[b] = r->h_next;
            r->client = NULL;
            r->peer = NULL;
            epd_free(r);
        }
    }
    while (d->links != NULL) {
        dec_link_t *l = d->links;

        if (l->peer != NULL) {
            l->peer->link = NULL;
        }
        l->reqs = NULL;
        dec_link_free(d, l);
    }
    while (d->peers != NULL) {
        dec_peer_t *p = d->peers;

        d->peers = p->next;
        epd_free(p->worker_id);
        epd_free(p);
    }
}

static int dec_run(dec_daemon_t *d)
{
    epd_engine_config_t ecfg = {.model_dir = d->a.model,
                                .block_tokens = (uint32_t)d->a.block_tokens,
                                .max_batch = (uint32_t)d->a.max_batch};
    epd_xport_config_t xc;
    char line[512];
    char desc[256];
    const char *colon;
    uint64_t pool_bytes;
    uint32_t n_slots;
    epd_status_t st;
    int rc = 1;

    st = epd_engine_open(d->a.engine, &ecfg, &d->engine);
    if (st != EPD_OK) {
        epd_log_error(COMP, 0, "cannot open model '%s' with engine '%s': %s", d->a.model,
                      d->a.engine, epd_status_string(st));
        return 1;
    }
    d->info = epd_engine_info(d->engine);
    if ((uint32_t)d->a.max_batch > d->info->max_batch) {
        epd_log_error(COMP, 0, "--max-batch %lld exceeds the engine's %u",
                      (long long)d->a.max_batch, d->info->max_batch);
        goto out_engine;
    }
    epd_layout_to_msg(&d->info->kv, &d->layout_msg, d->pattern);
    n_slots = d->info->kv.n_linear_layers > 0 ? (uint32_t)d->a.state_slots : 0;

    if (uv_loop_init(&d->loop) != 0) {
        epd_log_error(COMP, 0, "cannot create the event loop");
        goto out_engine;
    }
    if (d->a.trace != NULL && d->a.trace[0] != '\0') {
        char pname[160];

        snprintf(pname, sizeof(pname), "epd-decode %s", d->worker_id);
        st = epd_trace_create((size_t)d->a.trace_events, pname, &d->trace);
        if (st != EPD_OK) {
            epd_log_error(COMP, 0, "cannot create the trace recorder (%lld events): %s",
                          (long long)d->a.trace_events, epd_status_string(st));
            goto out_loop;
        }
        epd_trace_thread_name(d->trace, "decode loop");
    }
    epd_xport_config_init(&xc);
    xc.backend = d->a.transport;
    xc.expect = d->a.expect;
    xc.provider = d->a.provider;
    xc.max_msg_size = DEC_MAX_MSG;
    xc.peer_timeout_ms = (uint32_t)d->a.peer_timeout_ms;
    xc.connect_timeout_ms = (uint32_t)d->a.connect_timeout_ms;
    xc.msg_cb = dec_on_msg;
    xc.accept_cb = dec_on_accept;
    xc.err_cb = dec_on_ep_error;
    xc.cb_arg = d;
    st = epd_xport_create(&xc, &d->x);
    if (st != EPD_OK) {
        epd_log_error(COMP, 0, "cannot start transport '%s': %s", d->a.transport,
                      epd_status_string(st));
        goto out_loop;
    }
    st = epd_xport_address(d->x, &d->addr, &d->addr_len);
    if (st != EPD_OK) {
        epd_log_error(COMP, 0, "no transport address: %s", epd_status_string(st));
        goto out_xport;
    }
    pool_bytes = epd_kv_pool_bytes(&d->info->kv, (uint32_t)d->a.kv_blocks, n_slots);
    if (pool_bytes == 0 || pool_bytes > SIZE_MAX) {
        epd_log_error(COMP, 0, "KV pool of %lld blocks and %u slots is too large",
                      (long long)d->a.kv_blocks, n_slots);
        goto out_xport;
    }
    st = epd_xport_mr_alloc(d->x, (size_t)pool_bytes, &d->mr);
    if (st != EPD_OK) {
        epd_log_error(COMP, 0, "cannot allocate the KV pool (%llu bytes): %s",
                      (unsigned long long)pool_bytes, epd_status_string(st));
        goto out_xport;
    }
    st = epd_xport_mr_pack(d->mr, d->rkey, sizeof(d->rkey), &d->rkey_len);
    if (st != EPD_OK) {
        epd_log_error(COMP, 0, "cannot pack the KV pool's key: %s", epd_status_string(st));
        goto out_mr;
    }
    d->pool.base = epd_xport_mr_addr(d->mr);
    d->pool.bytes = epd_xport_mr_size(d->mr);
    d->pool.n_blocks = (uint32_t)d->a.kv_blocks;
    d->pool.n_state_slots = n_slots;
    if (epd_engine_check_pool(d->engine, &d->pool) != EPD_OK) {
        epd_log_error(COMP, 0, "the engine refuses the KV pool");
        goto out_mr;
    }
    if (epd_decode_blocks_create(d->pool.n_blocks, n_slots, &d->blocks) != EPD_OK ||
        epd_hash_state_create(0, &d->hash) != EPD_OK) {
        epd_log_error(COMP, 0, "out of memory");
        goto out_blocks;
    }
    for (d->n_buckets = 64;
         d->n_buckets < 2 * (size_t)d->pool.n_blocks && d->n_buckets < (1u << 20);
         d->n_buckets *= 2) {
    }
    d->table = epd_calloc(d->n_buckets, sizeof(*d->table));
    d->txbuf = epd_malloc(DEC_MAX_MSG);
    if (d->table == NULL || d->txbuf == NULL) {
        epd_log_error(COMP, 0, "out of memory");
        goto out_blocks;
    }
    uv_async_init(&d->loop, &d->wake, dec_on_wake);
    d->wake.data = d;
    st = epd_decode_batch_create(d->engine, &d->pool, (uint32_t)d->a.max_batch, DEC_JOIN_QUEUE,
                                 dec_wake_from_compute, d, &d->batch);
    if (st != EPD_OK) {
        epd_log_error(COMP, 0, "cannot start the compute thread: %s", epd_status_string(st));
        uv_close((uv_handle_t *)&d->wake, dec_on_closed);
        uv_run(&d->loop, UV_RUN_NOWAIT);
        goto out_blocks;
    }
    st = epd_xport_uv_start(&d->loop, d->x,
                            (uint32_t)(d->a.peer_timeout_ms / 8 > 0 ? d->a.peer_timeout_ms / 8 : 1),
                            &d->xuv);
    if (st != EPD_OK) {
        epd_log_error(COMP, 0, "cannot drive the transport from the loop: %s",
                      epd_status_string(st));
        goto out_batch;
    }
    st = epd_rpc_server_create(&d->loop, d->a.control_addr, dec_rpc, d, &d->rpc);
    if (st != EPD_OK) {
        epd_log_error(COMP, 0, "cannot serve the control plane on %s: %s", d->a.control_addr,
                      epd_status_string(st));
        goto out_xuv;
    }
    d->rpc_port = epd_rpc_server_port(d->rpc);
    uv_signal_init(&d->loop, &d->sigterm);
    uv_signal_init(&d->loop, &d->sigint);
    d->sigterm.data = d;
    d->sigint.data = d;
    uv_signal_start(&d->sigterm, dec_on_signal, SIGTERM);
    uv_signal_start(&d->sigint, dec_on_signal, SIGINT);
    uv_signal_init(&d->loop, &d->sigusr1);
    d->sigusr1.data = d;
    uv_signal_start(&d->sigusr1, dec_on_sigusr1, SIGUSR1);
    uv_timer_init(&d->loop, &d->sweep);
    uv_timer_init(&d->loop, &d->retry);
    uv_timer_init(&d->loop, &d->reap);
    d->reap.data = d;
    d->sweep.data = d;
    d->retry.data = d;
    uv_timer_start(&d->sweep, dec_on_sweep, 50,
                   (uint64_t)(d->a.lease_ms / 8 > 10 ? d->a.lease_ms / 8 : 10));

    epd_xport_describe(d->x, desc, sizeof(desc));
    colon = strrchr(d->a.control_addr, ':');
    snprintf(line, sizeof(line), "control=%.*s:%d pid=%d worker=%s transport=%s\n",
             colon != NULL ? (int)(colon - d->a.control_addr) : 9,
             colon != NULL ? d->a.control_addr : "127.0.0.1", d->rpc_port, (int)getpid(),
             d->worker_id, d->a.transport);
    epd_log_info(COMP, 0,
                 "pool: %u blocks of %u tokens (%llu bytes each per layer), %u state slots, "
                 "%llu bytes; layers %s; transport %s",
                 d->pool.n_blocks, d->info->kv.block_tokens,
                 (unsigned long long)d->info->kv.block_bytes, n_slots,
                 (unsigned long long)d->pool.bytes, d->pattern, desc);
    if (dec_write_ready(d, line) != 0) {
        dec_shutdown(d);
        uv_run(&d->loop, UV_RUN_DEFAULT);
        goto out_after_run;
    }
    line[strcspn(line, "\n")] = '\0';
    epd_log_info(COMP, 0, "%s", line);
    if (d->a.router != NULL && d->a.router[0] != '\0') {
        char ctl[300];

        /* the control address as the ready line names it */
        snprintf(ctl, sizeof(ctl), "%.*s:%d", colon != NULL ? (int)(colon - d->a.control_addr) : 9,
                 colon != NULL ? d->a.control_addr : "127.0.0.1", d->rpc_port);
        if (dec_register(d, ctl) != 0) {
            dec_shutdown(d);
            uv_run(&d->loop, UV_RUN_DEFAULT);
            goto out_after_run;
        }
    }
    uv_run(&d->loop, UV_RUN_DEFAULT);
    rc = 0;

out_after_run:
    dec_trace_write(d);
    epd_trace_destroy(d->trace);
    d->trace = NULL;
    dec_free_all(d);
    epd_free(d->table);
    epd_free(d->txbuf);
    epd_hash_state_destroy(d->hash);
    epd_decode_blocks_destroy(d->blocks);
    epd_xport_mr_dereg(d->mr);
    epd_xport_destroy(d->x);
    (void)uv_loop_close(&d->loop);
    epd_engine_close(d->engine);
    return rc;

out_xuv:
    epd_xport_uv_stop(d->xuv);
out_batch:
    epd_decode_batch_destroy(d->batch);
    uv_close((uv_handle_t *)&d->wake, dec_on_closed);
    uv_run(&d->loop, UV_RUN_NOWAIT);
out_blocks:
    epd_free(d->table);
    epd_free(d->txbuf);
    epd_hash_state_destroy(d->hash);
    epd_decode_blocks_destroy(d->blocks);
out_mr:
    epd_xport_mr_dereg(d->mr);
out_xport:
    epd_xport_destroy(d->x);
out_loop:
    uv_run(&d->loop, UV_RUN_NOWAIT);
    (void)uv_loop_close(&d->loop);
    epd_trace_destroy(d->trace);
    d->trace = NULL;
out_engine:
    epd_engine_close(d->engine);
    return 1;
}

int main(int argc, char **argv)
{
    static dec_daemon_t d;
    const epd_opt_t opts[] = {
        {"model", EPD_OPT_STRING, &d.a.model, 0, 0,
         "model folder (config.json + model.safetensors)"},
        {"engine", EPD_OPT_STRING, &d.a.engine, 0, 0, "engine: built-in name or path to a .so"},
        {"worker-id", EPD_OPT_STRING, &d.a.worker_id, 0, 0, "worker name (default decode-<pid>)"},
        {"transport", EPD_OPT_STRING, &d.a.transport, 0, 0, "ucx or ofi"},
        {"expect-transport", EPD_OPT_STRING, &d.a.expect, 0, 0, "any, shm, tcp or rdma"},
        {"provider", EPD_OPT_STRING, &d.a.provider, 0, 0, "libfabric provider hint (ofi)"},
        {"control-addr", EPD_OPT_STRING, &d.a.control_addr, 0, 0, "gRPC control address HOST:PORT"},
        {"ready-file", EPD_OPT_STRING, &d.a.ready_file, 0, 0, "written once serving"},
        {"kv-blocks", EPD_OPT_INT, &d.a.kv_blocks, 1, 1 << 24, "KV blocks in the pool"},
        {"state-slots", EPD_OPT_INT, &d.a.state_slots, 1, 1 << 20, "recurrent-state slots"},
        {"block-tokens", EPD_OPT_INT, &d.a.block_tokens, 1, 4096, "tokens per KV block"},
        {"max-batch", EPD_OPT_INT, &d.a.max_batch, 1, 4096, "largest decode batch"},
        {"lease-ms", EPD_OPT_INT, &d.a.lease_ms, 10, 3600000, "reservation lease"},
        {"peer-timeout-ms", EPD_OPT_INT, &d.a.peer_timeout_ms, 10, 3600000,
         "silence that declares a peer dead"},
        {"connect-timeout-ms", EPD_OPT_INT, &d.a.connect_timeout_ms, 10, 3600000,
         "transport handshake deadline"},
        {"log-level", EPD_OPT_STRING, &d.a.log_level, 0, 0, "error, warn, info, debug, trace"},
        {"trace", EPD_OPT_STRING, &d.a.trace, 0, 0,
         "record a per-request trace; Chrome trace JSON written to FILE at exit and on SIGUSR1"},
        {"trace-events", EPD_OPT_INT, &d.a.trace_events, 1024, 1 << 26,
         "trace buffer capacity in events (64 bytes each; later events are dropped)"},
        {"router", EPD_OPT_STRING, &d.a.router, 0, 0,
         "register with the router's control service HOST:PORT and heartbeat the load "
         "(absent: no registration)"},
    };
    epd_opts_t o = {.prog = "epd-decode",
                    .summary = "decode worker: KV reservations, continuous batching, token streams",
                    .opts = opts,
                    .n_opts = sizeof(opts) / sizeof(opts[0])};
    epd_log_level_t level;
    epd_status_t status;
    int argi;
    int rc;

    d.a.engine = "ref";
    d.a.transport = "ucx";
    d.a.expect = "any";
    d.a.control_addr = "127.0.0.1:0";
    d.a.log_level = "info";
    d.a.kv_blocks = 4096;
    d.a.state_slots = 256;
    d.a.block_tokens = 16;
    d.a.max_batch = 32;
    d.a.lease_ms = 5000;
    d.a.peer_timeout_ms = 3000;
    d.a.connect_timeout_ms = 3000;
    d.a.trace_events = 1 << 20;

    signal(SIGPIPE, SIG_IGN);
    status = epd_opts_parse(&o, argc, argv, &argi);
    if (status == EPD_ERR_CANCELED) {
        epd_opts_cleanup(&o);
        return 0;
    }
    if (status != EPD_OK) {
        epd_opts_cleanup(&o);
        return 1;
    }
    rc = 1;
    if (argi != argc) {
        epd_log_error(COMP, 0, "unexpected argument '%s' (flags are --name value)", argv[argi]);
    } else if (epd_log_level_parse(d.a.log_level, &level) != EPD_OK) {
        epd_log_error(COMP, 0, "--log-level must be error, warn, info, debug or trace");
    } else if (d.a.model == NULL || d.a.model[0] == '\0') {
        epd_log_error(COMP, 0, "--model DIR is required");
    } else if (strcmp(d.a.transport, "ucx") != 0 && strcmp(d.a.transport, "ofi") != 0) {
        epd_log_error(COMP, 0, "--transport must be ucx or ofi, not '%s'", d.a.transport);
    } else if (d.a.worker_id != NULL &&
               (d.a.worker_id[0] == '\0' || strlen(d.a.worker_id) >= 100)) {
        epd_log_error(COMP, 0, "--worker-id must be 1..99 characters");
    } else {
        epd_log_set_level(level);
        if (d.a.worker_id != NULL) {
            snprintf(d.worker_id, sizeof(d.worker_id), "%s", d.a.worker_id);
        } else {
            snprintf(d.worker_id, sizeof(d.worker_id), "decode-%d", (int)getpid());
        }
        d.epoch_start = epd_time_wall_ns();
        d.epoch_nonce = epd_rng_entropy();
        rc = dec_run(&d);
    }
    epd_opts_cleanup(&o);
    return rc;
}
