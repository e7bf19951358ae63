/*
 * epd_xport.c — the backend-independent core of the transport.
 *
 * Everything the user sees (xport, endpoints, regions, keys) is a core object
 * wrapping a backend object.  The core does what is the same on every
 * library:
 *
 *   - framing: every message is a 48-byte frame header (magic, version,
 *     type, payload length, sender worker id, both endpoint cookies, a
 *     per-endpoint sequence number) plus payload.  A received frame is
 *     checked (length == header + payload, magic, version, type, routing,
 *     sequence) before anything looks at the payload; bad frames are logged
 *     (rate-limited) and dropped.
 *   - the handshake: HELLO (carries our address blob, so the acceptor can
 *     create an endpoint back) and HELLO_ACK (carries a status: the acceptor
 *     may refuse).  A cookie per endpoint (slot index + generation) routes
 *     frames to the right endpoint even with several endpoints to one peer
 *     and makes frames for a closed endpoint harmless.  Since a backend
 *     endpoint can be created to a dead address without error, the connect
 *     deadline is what makes "nobody listens" fail.
 *   - liveness: every connected endpoint sends a KEEPALIVE after
 *     peer_timeout_ms/4 without sending anything, and is declared dead after
 *     peer_timeout_ms without receiving anything.  BYE on close.
 *   - fences: a fenced message (and every message after it, to keep order)
 *     is held until the writes posted before it completed locally, then a
 *     backend flush ran, then it is sent.
 *   - bounds: ops come from a pool sized by max_inflight (plus a reserve for
 *     the core's own fence flushes); held copies of small messages (up to
 *     64 KiB) from a lazily grown pool with a fixed cap, so the write/send
 *     paths never allocate for them; a large message held (an image) gets
 *     a copy of its own size, all of those bounded in bytes.
 *
 * Re-entrancy: user callbacks may post, close endpoints or deregister
 * regions.  An endpoint closed while any core call is on the stack is parked
 * on a zombie list and freed when the outermost call unwinds, so no frame of
 * the stack ever touches freed memory.
 */
#include "epd_xport_int.h"

#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_bufpool.h"
#include "epd_log.h"
#include "epd_rng.h"
#include "epd_time.h"

#define EPD__XPORT_COMP "xport"
#define EPD__XPORT_MAGIC 0x58445045u /* "EPDX" little-endian */
#define EPD__XPORT_VERSION 1
#define EPD__XPORT_OP_RESERVE 64   /* ops kept for fence flushes */
#define EPD__XPORT_HELD_MAX 256    /* held message copies per xport ... */
#define EPD__XPORT_HELD_BYTES (64u << 20) /* ... and at most this many bytes of them */
#define EPD__XPORT_LOG_BURST 10    /* rate-limited log lines per second */
#define EPD__XPORT_MSG_LIMIT (16u << 20) /* messages are small; bulk data is written */

enum {
    EPD__FRAME_HELLO = 1,
    EPD__FRAME_HELLO_ACK = 2,
    EPD__FRAME_MSG = 3,
    EPD__FRAME_KEEPALIVE = 4,
    EPD__FRAME_BYE = 5,
};

/* Wire header of every core frame (host byte order: both ends are epd of the
 * same build on the same kind of machine; the version catches mismatches). */
typedef struct {
    uint32_t magic;
    uint16_t version;
    uint8_t type;
    uint8_t flags;
    uint32_t len;        /* payload bytes after the header */
    int32_t status;      /* HELLO_ACK: EPD_OK or why the acceptor refused */
    uint64_t sender_id;  /* sender's worker id */
    uint64_t src_cookie; /* sender's endpoint */
    uint64_t dst_cookie; /* receiver's endpoint (0 in HELLO) */
    uint64_t seq;        /* per-endpoint frame number, from 1 */
} epd__frame_t;

_Static_assert(sizeof(epd__frame_t) == 48, "frame header layout");

enum { EPD__EP_CONNECTING = 1, EPD__EP_CONNECTED, EPD__EP_FAILED, EPD__EP_CLOSED };
enum { EPD__OP_FREE = 0, EPD__OP_WRITE, EPD__OP_FLUSH, EPD__OP_FENCE };
enum { EPD__FENCE_NONE = 0, EPD__FENCE_FLUSHING };

typedef struct epd__core_op epd__core_op_t;
typedef struct epd__held epd__held_t;

struct epd__core_op {
    epd__xport_op_t be; /* first: the backend sees a pointer to this */
    epd_xport_ep_t *ep;
    epd_xport_comp_cb_t cb;
    void *arg;
    uint64_t seq;       /* write: its number; flush: writes it covers */
    int kind;
    epd__core_op_t *prev, *next; /* ep's write list, or the free list */
};

struct epd__held {
    epd__held_t *next;
    size_t len;
    bool fenced;
    uint64_t fence_target; /* writes 1..target must land first */
    unsigned char *buf;    /* [len], right after this header (x->held) */
};

struct epd_xport_rkey {
    epd_xport_ep_t *ep;
    void *be_rkey;
    size_t size;
    epd_xport_rkey_t *prev, *next;
};

struct epd_xport_mr {
    epd_xport_t *x;
    void *be_mr;
    void *addr;
    size_t size;
    epd_xport_mr_t *prev, *next;
};

struct epd_xport_ep {
    epd_xport_t *x;
    void *be_ep;
    int state;
    bool incoming;
    bool pump_listed;
    bool hello_pending;           /* HELLO refused by backpressure: retry */
    epd_status_t fail_status;
    uint64_t cookie;
    uint64_t remote_cookie;
    uint64_t peer_id;
    uint64_t deadline_ns;
    uint64_t last_rx_ns, last_tx_ns;
    uint64_t tx_seq, rx_seq;
    epd_xport_comp_cb_t conn_cb;
    void *conn_arg;
    /* writes posted, in posting order (oldest first) */
    uint64_t wr_seq;       /* writes posted so far */
    uint64_t flushed_seq;  /* writes 1..flushed_seq are known to have landed */
    epd__core_op_t *wr_head, *wr_tail;
    uint32_t ops_held;     /* ops (writes/flushes) the backend holds */
    /* messages held behind the handshake or a fence */
    epd__held_t *held_head, *held_tail;
    int fence_state;
    epd_xport_rkey_t *rkeys;
    void *user;
    epd_xport_ep_t *prev, *next;      /* x->eps, or x->zombies */
    epd_xport_ep_t *pump_next;        /* x->pump list */
    char desc[256];
};

struct epd_xport {
    const epd__xport_backend_ops_t *ops;
    void *be;
    epd_xport_config_t cfg;
    char expect[16];
    uint64_t id;
    epd_rng_t rng;
    int depth;                 /* core calls on the stack */
    epd_xport_ep_t *eps, *zombies, *pump;
    epd_xport_ep_t **slots;    /* cookie index -> ep */
    uint32_t *slot_gen;
    uint32_t n_slots;
    uint32_t gen;
    epd_xport_mr_t *mrs;
    epd__core_op_t *op_pool;   /* [max_inflight + reserve] */
    epd__core_op_t *op_free;
    uint32_t user_ops;         /* user writes+flushes in flight */
    epd_bufpool_t held;        /* copies of held messages (epd__held_t + bytes) */
    uint64_t next_timer_ns;
    uint64_t timer_step_ns;
    epd_log_limit_t log_limit;
};

/* ---------------------------------------------------------------- helpers */

static bool epd__log_allowed(epd_xport_t *x)
{
    return epd_log_limit_ok(&x->log_limit, EPD__XPORT_LOG_BURST);
}

#define EPD__LOG_LIMITED(x, ...)                          \
    do {                                                  \
        if (epd__log_allowed(x)) {                        \
            epd_log_warn(EPD__XPORT_COMP, 0, __VA_ARGS__); \
        }                                                 \
    } while (0)

static void epd__xport_enter(epd_xport_t *x)
{
    x->depth++;
}

static void epd__ep_free(epd_xport_ep_t *ep);

static void epd__xport_leave(epd_xport_t *x)
{
    if (--x->depth == 0) {
        while (x->zombies != NULL) {
            epd_xport_ep_t *ep = x->zombies;
            x->zombies = ep->next;
            epd__ep_free(ep);
        }
    }
}

static epd_xport_ep_t *epd__ep_lookup(epd_xport_t *x, uint64_t cookie)
{
    uint32_t idx = (uint32_t)(cookie & 0xffffffffu);
    uint32_t gen = (uint32_t)(cookie >> 32);

    if (idx == 0 || idx > x->n_slots) {
        return NULL;
    }
    if (x->slot_gen[idx - 1] != gen || x->slots[idx - 1] == NULL) {
        return NULL;
    }
    return x->slots[idx - 1];
}

static epd_status_t epd__slot_alloc(epd_xport_t *x, epd_xport_ep_t *ep)
{
    uint32_t i;

    for (i = 0; i < x->n_slots; i++) {
        if (x->slots[i] == NULL) {
            break;
        }
    }
    if (i == x->n_slots) {
        uint32_t n = x->n_slots == 0 ? 16 : x->n_slots * 2;
        epd_xport_ep_t **slots = epd_realloc(x->slots, n * sizeof(*slots));
        uint32_t *gens;

        if (slots == NULL) {
            return EPD_ERR_NO_MEMORY;
        }
        x->slots = slots;
        gens = epd_realloc(x->slot_gen, n * sizeof(*gens));
        if (gens == NULL) {
            return EPD_ERR_NO_MEMORY;
        }
        x->slot_gen = gens;
        for (uint32_t j = x->n_slots; j < n; j++) {
            x->slots[j] = NULL;
            x->slot_gen[j] = 0;
        }
        x->n_slots = n;
    }
    if (++x->gen == 0) {
        x->gen = 1;
    }
    x->slots[i] = ep;
    x->slot_gen[i] = x->gen;
    ep->cookie = ((uint64_t)x->gen << 32) | (uint64_t)(i + 1);
    return EPD_OK;
}

static void epd__slot_release(epd_xport_t *x, epd_xport_ep_t *ep)
{
    uint32_t idx = (uint32_t)(ep->cookie & 0xffffffffu);

    if (idx != 0 && idx <= x->n_slots && x->slots[idx - 1] == ep) {
        x->slots[idx - 1] = NULL;
        x->slot_gen[idx - 1] = 0;
    }
    ep->cookie = 0;
}

static epd__core_op_t *epd__op_get(epd_xport_t *x, bool user)
{
    epd__core_op_t *op;

    if (user && x->user_ops >= x->cfg.max_inflight) {
        return NULL;
    }
    op = x->op_free;
    if (op == NULL) {
        return NULL;
    }
    x->op_free = op->next;
    memset(&op->be, 0, sizeof(op->be));
    op->prev = op->next = NULL;
    if (user) {
        x->user_ops++;
    }
    return op;
}

static void epd__op_put(epd_xport_t *x, epd__core_op_t *op)
{
    if (op->kind == EPD__OP_WRITE || op->kind == EPD__OP_FLUSH) {
        x->user_ops--;
    }
    op->kind = EPD__OP_FREE;
    op->ep = NULL;
    op->cb = NULL;
    op->prev = NULL;
    op->next = x->op_free;
    x->op_free = op;
}

/* A copy for a message of `len` bytes (epd_bufpool: small ones pooled,
 * so the send path does not allocate for the request plane's usual
 * messages; a large one, an image, sized to itself). */
static epd__held_t *epd__held_get(epd_xport_t *x, size_t len)
{
    epd__held_t *h = epd_bufpool_get(&x->held, len);

    if (h != NULL) {
        h->buf = epd_bufpool_data(&x->held, h);
    }
    return h;
}

static void epd__held_put(epd_xport_t *x, epd__held_t *h)
{
    epd_bufpool_put(&x->held, h);
}

/* Sends one frame on the backend endpoint; updates sequence and tx time only
 * when the backend accepted it. */
static epd_status_t epd__frame_send(epd_xport_ep_t *ep, int type, int32_t status,
                                    const void *payload, size_t len)
{
    epd_xport_t *x = ep->x;
    epd__frame_t f;
    epd_status_t st;

    memset(&f, 0, sizeof(f));
    f.magic = EPD__XPORT_MAGIC;
    f.version = EPD__XPORT_VERSION;
    f.type = (uint8_t)type;
    f.len = (uint32_t)len;
    f.status = status;
    f.sender_id = x->id;
    f.src_cookie = ep->cookie;
    f.dst_cookie = ep->remote_cookie;
    f.seq = ep->tx_seq + 1;
    st = x->ops->send(ep->be_ep, &f, sizeof(f), payload, len);
    if (st == EPD_OK) {
        ep->tx_seq++;
        ep->last_tx_ns = epd_time_now_ns();
    }
    return st;
}

/* ------------------------------------------------------- endpoint failure */

static void epd__held_drop(epd_xport_ep_t *ep)
{
    while (ep->held_head != NULL) {
        epd__held_t *h = ep->held_head;
        ep->held_head = h->next;
        epd__held_put(ep->x, h);
    }
    ep->held_tail = NULL;
}

static void epd__ep_release_backend(epd_xport_ep_t *ep)
{
    epd_xport_t *x = ep->x;

    while (ep->rkeys != NULL) {
        epd_xport_rkey_t *rk = ep->rkeys;
        ep->rkeys = rk->next;
        if (rk->be_rkey != NULL) {
            x->ops->rkey_destroy(rk->be_rkey);
        }
        epd_free(rk);
    }
    if (ep->be_ep != NULL) {
        void *be_ep = ep->be_ep;
        /* cleared first: the completions ep_destroy runs may call back into
         * the core, which must not see a half-destroyed backend endpoint */
        ep->be_ep = NULL;
        x->ops->ep_destroy(be_ep);
        /* contract: ep_destroy completes every op it held */
        assert(ep->ops_held == 0);
    }
    epd__held_drop(ep);
}

/* Marks the endpoint failed: connect callback (if still connecting), then the
 * error callback, then every op it holds completes with `status`. */
static void epd__ep_fail(epd_xport_ep_t *ep, epd_status_t status)
{
    epd_xport_t *x = ep->x;
    bool connecting = ep->state == EPD__EP_CONNECTING;

    if (ep->state == EPD__EP_FAILED || ep->state == EPD__EP_CLOSED) {
        return;
    }
    ep->state = EPD__EP_FAILED;
    ep->fail_status = status;
    epd__xport_enter(x);
    if (connecting && ep->conn_cb != NULL) {
        epd_xport_comp_cb_t cb = ep->conn_cb;
        ep->conn_cb = NULL;
        cb(ep->conn_arg, status);
    }
    if (ep->state == EPD__EP_FAILED && x->cfg.err_cb != NULL) {
        x->cfg.err_cb(x->cfg.cb_arg, ep, status);
    }
    if (ep->state == EPD__EP_FAILED) {
        /* rkeys stay (the user owns them) but the backend endpoint goes:
         * its ops complete now, with `status` (see epd__xport_op_done) */
        void *be_ep = ep->be_ep;
        if (be_ep != NULL) {
            /* the user still owns the rkeys (freed by rkey_destroy or
             * ep_close); only their backend halves go with the endpoint */
            for (epd_xport_rkey_t *rk = ep->rkeys; rk != NULL; rk = rk->next) {
                if (rk->be_rkey != NULL) {
                    x->ops->rkey_destroy(rk->be_rkey);
                    rk->be_rkey = NULL;
                }
            }
            ep->be_ep = NULL; /* before: completions may re-enter (close) */
            x->ops->ep_destroy(be_ep);
            assert(ep->ops_held == 0);
        }
        epd__held_drop(ep);
    }
    epd__xport_leave(x);
}

/* ------------------------------------------------------------------ pump */

static void epd__pump_schedule(epd_xport_ep_t *ep)
{
    if (!ep->pump_listed) {
        ep->pump_listed = true;
        ep->pump_next = ep->x->pump;
        ep->x->pump = ep;
    }
}

/* Sends held messages whose turn came.  Returns true when the queue is
 * empty or waiting on an event that will pump again (a write or flush
 * completion), false when it should be retried from progress. */
static bool epd__ep_pump(epd_xport_ep_t *ep)
{
    epd_xport_t *x = ep->x;

    while (ep->state == EPD__EP_CONNECTED && ep->held_head != NULL) {
        epd__held_t *h = ep->held_head;
        epd_status_t st;

        if (h->fenced) {
            if (ep->fence_state == EPD__FENCE_FLUSHING) {
                return true; /* the flush completion pumps */
            }
            if (ep->wr_head != NULL && ep->wr_head->seq <= h->fence_target) {
                return true; /* an earlier write is still in flight */
            }
            if (ep->flushed_seq < h->fence_target) {
                epd__core_op_t *op = epd__op_get(x, false);
                if (op == NULL) {
                    return false;
                }
                op->kind = EPD__OP_FENCE;
                op->ep = ep;
                op->seq = ep->wr_seq;
                st = x->ops->flush(ep->be_ep, &op->be);
                if (st == EPD_ERR_NO_RESOURCE) {
                    epd__op_put(x, op);
                    return false;
                }
                if (st != EPD_INPROGRESS && st != EPD_OK) {
                    epd__op_put(x, op);
                    epd__ep_fail(ep, st);
                    return true;
                }
                ep->ops_held++;
                ep->fence_state = EPD__FENCE_FLUSHING;
                return true;
            }
        }
        st = epd__frame_send(ep, EPD__FRAME_MSG, 0, h->buf, h->len);
        if (st == EPD_ERR_NO_RESOURCE) {
            return false;
        }
        if (st != EPD_OK) {
            epd__ep_fail(ep, st);
            return true;
        }
        ep->held_head = h->next;
        if (ep->held_head == NULL) {
            ep->held_tail = NULL;
        }
        epd__held_put(x, h);
    }
    return true;
}

static int epd__pump_all(epd_xport_t *x)
{
    epd_xport_ep_t *list = x->pump;
    int n = 0;

    x->pump = NULL;
    while (list != NULL) {
        epd_xport_ep_t *ep = list;
        list = ep->pump_next;
        ep->pump_listed = false;
        if (ep->state == EPD__EP_CLOSED) {
            continue;
        }
        n++;
        if (!epd__ep_pump(ep)) {
            epd__pump_schedule(ep);
        }
    }
    return n;
}

/* ---------------------------------------------------------------- upcalls */

void epd__xport_op_done(epd__xport_op_t *bop, epd_status_t status)
{
    epd__core_op_t *op = (epd__core_op_t *)bop;
    epd_xport_ep_t *ep = op->ep;
    epd_xport_t *x = ep->x;
    epd_xport_comp_cb_t cb = op->cb;
    void *arg = op->arg;
    int kind = op->kind;
    uint64_t seq = op->seq;

    epd__xport_enter(x);
    ep->ops_held--;
    if (status != EPD_OK && status != EPD_ERR_CANCELED &&
        epd_status_scope(status) >= EPD_SCOPE_CONNECTION &&
        (ep->state == EPD__EP_CONNECTING || ep->state == EPD__EP_CONNECTED)) {
        /* this op revealed that the endpoint is broken: the error callback
         * runs first, then every op (this one last) completes with it */
        epd__ep_fail(ep, status);
    }
    if (status == EPD_ERR_CANCELED && ep->fail_status != EPD_OK) {
        status = ep->fail_status;
    }
    if (kind == EPD__OP_WRITE) {
        if (op->prev != NULL) {
            op->prev->next = op->next;
        } else {
            ep->wr_head = op->next;
        }
        if (op->next != NULL) {
            op->next->prev = op->prev;
        } else {
            ep->wr_tail = op->prev;
        }
    } else if (status == EPD_OK && seq > ep->flushed_seq) {
        ep->flushed_seq = seq;
    }
    if (kind == EPD__OP_FENCE) {
        ep->fence_state = EPD__FENCE_NONE;
    }
    epd__op_put(x, op);
    if (cb != NULL) {
        cb(arg, status);
    }
    if (ep->state == EPD__EP_CONNECTED && ep->held_head != NULL) {
        if (!epd__ep_pump(ep)) {
            epd__pump_schedule(ep);
        }
    }
    epd__xport_leave(x);
}

void epd__xport_ep_failed(epd_xport_ep_t *core_ep, epd_status_t status)
{
    epd_log_warn(EPD__XPORT_COMP, 0, "endpoint to peer %016llx failed: %s",
                 (unsigned long long)core_ep->peer_id, epd_status_string(status));
    epd__ep_fail(core_ep, status);
}

void epd__xport_ep_alive(epd_xport_ep_t *core_ep)
{
    core_ep->last_rx_ns = epd_time_now_ns();
}

static const char *epd__class_ok(epd_xport_ep_t *ep)
{
    const char *cls = "other";

    ep->x->ops->ep_describe(ep->be_ep, ep->desc, sizeof(ep->desc), &cls);
    if (ep->x->expect[0] == '\0' || strcmp(ep->x->expect, cls) == 0) {
        return NULL;
    }
    return cls;
}

static epd_status_t epd__ep_new(epd_xport_t *x, const void *blob, size_t len,
                                epd_xport_ep_t **ep_p)
{
    epd_xport_ep_t *ep;
    epd_status_t st;

    ep = epd_calloc(1, sizeof(*ep));
    if (ep == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    ep->x = x;
    st = epd__slot_alloc(x, ep);
    if (st != EPD_OK) {
        goto err_free;
    }
    st = x->ops->ep_create(x->be, blob, len, ep, &ep->be_ep);
    if (st != EPD_OK) {
        goto err_slot;
    }
    ep->last_rx_ns = ep->last_tx_ns = epd_time_now_ns();
    ep->next = x->eps;
    if (x->eps != NULL) {
        x->eps->prev = ep;
    }
    x->eps = ep;
    *ep_p = ep;
    return EPD_OK;

err_slot:
    epd__slot_release(x, ep);
err_free:
    epd_free(ep);
    return st;
}

static void epd__on_hello(epd_xport_t *x, const epd__frame_t *f, const unsigned char *payload)
{
    epd_xport_ep_t *ep;
    const char *cls;
    epd_status_t st;

    if (f->len == 0 || f->len > EPD_XPORT_ADDR_MAX || f->seq != 1) {
        EPD__LOG_LIMITED(x, "dropping HELLO from %016llx: bad address length %u",
                         (unsigned long long)f->sender_id, f->len);
        return;
    }
    for (ep = x->eps; ep != NULL; ep = ep->next) {
        if (ep->incoming && ep->peer_id == f->sender_id && ep->remote_cookie == f->src_cookie) {
            return; /* duplicate */
        }
    }
    st = epd__ep_new(x, payload, f->len, &ep);
    if (st != EPD_OK) {
        EPD__LOG_LIMITED(x, "refusing HELLO from %016llx: %s", (unsigned long long)f->sender_id,
                         epd_status_string(st));
        return;
    }
    ep->incoming = true;
    ep->peer_id = f->sender_id;
    ep->remote_cookie = f->src_cookie;
    ep->rx_seq = f->seq;
    cls = epd__class_ok(ep);
    if (cls != NULL) {
        epd_log_error(EPD__XPORT_COMP, 0,
                      "refusing peer %016llx: expected transport class '%s' but %s chose '%s' (%s)",
                      (unsigned long long)f->sender_id, x->expect, x->ops->name, cls, ep->desc);
        (void)epd__frame_send(ep, EPD__FRAME_HELLO_ACK, EPD_ERR_CONFIG, NULL, 0);
        ep->state = EPD__EP_FAILED;
        ep->fail_status = EPD_ERR_CONFIG;
        epd_xport_ep_close(ep);
        return;
    }
    ep->state = EPD__EP_CONNECTED;
    st = epd__frame_send(ep, EPD__FRAME_HELLO_ACK, EPD_OK, NULL, 0);
    if (st != EPD_OK) {
        /* the backend is full right now: the peer retries nothing, so give up
         * on this endpoint; the connector times out and may try again */
        EPD__LOG_LIMITED(x, "cannot answer HELLO from %016llx: %s", (unsigned long long)f->sender_id,
                         epd_status_string(st));
        epd_xport_ep_close(ep);
        return;
    }
    epd_log_info(EPD__XPORT_COMP, 0, "accepted peer %016llx: %s", (unsigned long long)f->sender_id,
                  ep->desc);
    if (x->cfg.accept_cb != NULL) {
        x->cfg.accept_cb(x->cfg.cb_arg, ep);
    }
}

static void epd__on_ack(epd_xport_t *x, epd_xport_ep_t *ep, const epd__frame_t *f)
{
    const char *cls;
    epd_xport_comp_cb_t cb;

    if (ep->state != EPD__EP_CONNECTING || ep->incoming || f->seq != 1 || f->len != 0) {
        EPD__LOG_LIMITED(x, "dropping unexpected HELLO_ACK from %016llx",
                         (unsigned long long)f->sender_id);
        return;
    }
    ep->peer_id = f->sender_id;
    ep->remote_cookie = f->src_cookie;
    ep->rx_seq = f->seq;
    if (f->status != EPD_OK) {
        epd_status_t st = f->status == EPD_ERR_CONFIG ? EPD_ERR_CONFIG : EPD_ERR_UNREACHABLE;
        epd_log_error(EPD__XPORT_COMP, 0, "peer %016llx refused the connection: %s",
                      (unsigned long long)f->sender_id, epd_status_string((epd_status_t)f->status));
        epd__ep_fail(ep, st);
        return;
    }
    cls = epd__class_ok(ep);
    if (cls != NULL) {
        epd_log_error(EPD__XPORT_COMP, 0,
                      "connect to peer %016llx refused: expected transport class '%s' but %s chose '%s' (%s)",
                      (unsigned long long)f->sender_id, x->expect, x->ops->name, cls, ep->desc);
        (void)epd__frame_send(ep, EPD__FRAME_BYE, 0, NULL, 0);
        epd__ep_fail(ep, EPD_ERR_CONFIG);
        return;
    }
    ep->state = EPD__EP_CONNECTED;
    epd_log_info(EPD__XPORT_COMP, 0, "connected to peer %016llx: %s",
                  (unsigned long long)f->sender_id, ep->desc);
    cb = ep->conn_cb;
    ep->conn_cb = NULL;
    if (cb != NULL) {
        cb(ep->conn_arg, EPD_OK);
    }
    if (ep->state == EPD__EP_CONNECTED && ep->held_head != NULL && !epd__ep_pump(ep)) {
        epd__pump_schedule(ep);
    }
}

void epd__xport_deliver(epd_xport_t *x, const void *data, size_t len)
{
    const unsigned char *bytes = data;
    epd__frame_t f;
    epd_xport_ep_t *ep;

    if (len < sizeof(f)) {
        EPD__LOG_LIMITED(x, "dropping a %zu-byte message: shorter than a frame header", len);
        return;
    }
    memcpy(&f, bytes, sizeof(f));
    if (f.magic != EPD__XPORT_MAGIC || f.version != EPD__XPORT_VERSION) {
        EPD__LOG_LIMITED(x, "dropping a message with bad magic/version %08x/%u", f.magic,
                         f.version);
        return;
    }
    if ((size_t)f.len != len - sizeof(f)) {
        EPD__LOG_LIMITED(x, "dropping a frame of type %u: header says %u payload bytes, got %zu",
                         f.type, f.len, len - sizeof(f));
        return;
    }
    epd__xport_enter(x);
    if (f.type == EPD__FRAME_HELLO) {
        epd__on_hello(x, &f, bytes + sizeof(f));
        goto out;
    }
    ep = epd__ep_lookup(x, f.dst_cookie);
    if (ep == NULL || (ep->state != EPD__EP_CONNECTING && ep->state != EPD__EP_CONNECTED)) {
        if (f.type == EPD__FRAME_MSG) {
            EPD__LOG_LIMITED(x, "dropping a message from %016llx: no such endpoint",
                             (unsigned long long)f.sender_id);
        } else {
            /* keepalives, acks and byes for an endpoint closed here are
             * expected until the peer notices */
            epd_log_debug(EPD__XPORT_COMP, 0,
                          "dropping a frame of type %u from %016llx: no such endpoint", f.type,
                          (unsigned long long)f.sender_id);
        }
        goto out;
    }
    if (f.type == EPD__FRAME_HELLO_ACK) {
        epd__on_ack(x, ep, &f);
        goto out;
    }
    if (ep->state != EPD__EP_CONNECTED || ep->peer_id != f.sender_id ||
        ep->remote_cookie != f.src_cookie) {
        EPD__LOG_LIMITED(x, "dropping a frame of type %u from %016llx: %s", f.type,
                         (unsigned long long)f.sender_id,
                         epd_status_string(EPD_ERR_STALE_EPOCH));
        goto out;
    }
    if (f.seq != ep->rx_seq + 1) {
        epd_log_error(EPD__XPORT_COMP, 0,
                      "frame from peer %016llx out of order: got #%llu, expected #%llu",
                      (unsigned long long)f.sender_id, (unsigned long long)f.seq,
                      (unsigned long long)(ep->rx_seq + 1));
        epd__ep_fail(ep, EPD_ERR_TRANSPORT);
        goto out;
    }
    ep->rx_seq = f.seq;
    ep->last_rx_ns = epd_time_now_ns();
    switch (f.type) {
    case EPD__FRAME_MSG:
        if (f.len == 0 || f.len > x->cfg.max_msg_size) {
            EPD__LOG_LIMITED(x, "dropping a %u-byte message from %016llx: limit is %zu", f.len,
                             (unsigned long long)f.sender_id, x->cfg.max_msg_size);
            break;
        }
        x->cfg.msg_cb(x->cfg.cb_arg, ep, bytes + sizeof(f), f.len);
        break;
    case EPD__FRAME_KEEPALIVE:
        break;
    case EPD__FRAME_BYE:
        epd_log_debug(EPD__XPORT_COMP, 0, "peer %016llx closed the endpoint",
                      (unsigned long long)f.sender_id);
        epd__ep_fail(ep, EPD_ERR_CONNECTION_RESET);
        break;
    default:
        EPD__LOG_LIMITED(x, "dropping a frame of unknown type %u from %016llx", f.type,
                         (unsigned long long)f.sender_id);
        break;
    }
out:
    epd__xport_leave(x);
}

/* ------------------------------------------------------------- lifecycle */

void epd_xport_config_init(epd_xport_config_t *config)
{
    memset(config, 0, sizeof(*config));
    config->backend = "ucx";
    config->expect = NULL;
    config->provider = NULL;
    config->bind_host = NULL;
    config->max_msg_size = 64 * 1024;
    config->max_inflight = 4096;
    config->connect_timeout_ms = 5000;
    config->peer_timeout_ms = 10000;
}

static const epd__xport_backend_ops_t *const epd__xport_backends[] = {
#if EPD_WITH_UCX
    &epd__xport_ucx_ops,
#endif
#if EPD_WITH_OFI
    &epd__xport_ofi_ops,
#endif
    NULL,
};

epd_status_t epd_xport_create(const epd_xport_config_t *config, epd_xport_t **x_p)
{
    const epd__xport_backend_ops_t *ops = NULL;
    epd_xport_t *x;
    epd_status_t st;
    uint32_t n_ops;
    uint64_t step_ms;

    if (config == NULL || x_p == NULL || config->msg_cb == NULL || config->backend == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (config->max_msg_size == 0 || config->max_msg_size > EPD__XPORT_MSG_LIMIT ||
        config->max_inflight == 0 || config->max_inflight > (1u << 24) ||
        config->connect_timeout_ms == 0 || config->peer_timeout_ms < 4) {
        epd_log_error(EPD__XPORT_COMP, 0,
                      "bad transport limits: max_msg_size %zu, max_inflight %u, "
                      "connect_timeout_ms %u, peer_timeout_ms %u",
                      config->max_msg_size, config->max_inflight, config->connect_timeout_ms,
                      config->peer_timeout_ms);
        return EPD_ERR_CONFIG;
    }
    for (size_t i = 0; epd__xport_backends[i] != NULL; i++) {
        if (strcmp(epd__xport_backends[i]->name, config->backend) == 0) {
            ops = epd__xport_backends[i];
        }
    }
    if (ops == NULL) {
        epd_log_error(EPD__XPORT_COMP, 0, "unknown or disabled transport backend '%s'",
                      config->backend);
        return EPD_ERR_CONFIG;
    }
    if (ops->size != sizeof(*ops)) {
        epd_log_error(EPD__XPORT_COMP, 0, "backend '%s' has an ops table of %zu bytes, want %zu",
                      ops->name, ops->size, sizeof(*ops));
        return EPD_ERR_CONFIG;
    }
    if (config->expect != NULL && strcmp(config->expect, "any") != 0 &&
        strcmp(config->expect, "shm") != 0 && strcmp(config->expect, "tcp") != 0 &&
        strcmp(config->expect, "rdma") != 0) {
        epd_log_error(EPD__XPORT_COMP, 0,
                      "unknown transport expectation '%s' (want any, shm, tcp or rdma)",
                      config->expect);
        return EPD_ERR_CONFIG;
    }

    x = epd_calloc(1, sizeof(*x));
    if (x == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    x->ops = ops;
    x->cfg = *config;
    /* strings are borrowed only for create; keep what is needed later */
    x->cfg.backend = ops->name;
    x->cfg.provider = NULL;
    x->cfg.bind_host = NULL;
    if (config->expect != NULL && strcmp(config->expect, "any") != 0) {
        strcpy(x->expect, config->expect);
    }
    x->cfg.expect = x->expect[0] != '\0' ? x->expect : NULL;
    epd_rng_seed(&x->rng, epd_rng_entropy());
    do {
        x->id = epd_rng_next(&x->rng);
    } while (x->id == 0);

    {
        /* most users never hold a message: the pool grows lazily, and its
         * cap bounds what a slow handshake can pin */
        size_t small = config->max_msg_size < 64 * 1024 ? config->max_msg_size : 64 * 1024;
        uint32_t max = (uint32_t)(EPD__XPORT_HELD_BYTES / small);

        max = max > EPD__XPORT_HELD_MAX ? EPD__XPORT_HELD_MAX : max < 16 ? 16 : max;
        epd_bufpool_init(&x->held, sizeof(epd__held_t), small, max, EPD__XPORT_HELD_BYTES);
    }
    n_ops = config->max_inflight + EPD__XPORT_OP_RESERVE;
    x->op_pool = epd_calloc(n_ops, sizeof(*x->op_pool));
    if (x->op_pool == NULL) {
        st = EPD_ERR_NO_MEMORY;
        goto err_free_x;
    }
    for (uint32_t i = n_ops; i-- > 0;) {
        x->op_pool[i].next = x->op_free;
        x->op_free = &x->op_pool[i];
    }

    step_ms = config->peer_timeout_ms / 8;
    if (config->connect_timeout_ms / 8 < step_ms) {
        step_ms = config->connect_timeout_ms / 8;
    }
    if (step_ms > 100) {
        step_ms = 100;
    }
    if (step_ms == 0) {
        step_ms = 1;
    }
    x->timer_step_ns = step_ms * EPD_NSEC_PER_MSEC;
    x->next_timer_ns = epd_time_now_ns() + x->timer_step_ns;

    st = ops->create(x, config, &x->be);
    if (st != EPD_OK) {
        goto err_free_pool;
    }
    *x_p = x;
    return EPD_OK;

err_free_pool:
    epd_free(x->op_pool);
err_free_x:
    epd_free(x);
    return st;
}

void epd_xport_destroy(epd_xport_t *x)
{
    if (x == NULL) {
        return;
    }
    epd__xport_enter(x);
    while (x->eps != NULL) {
        epd_xport_ep_close(x->eps);
    }
    while (x->mrs != NULL) {
        epd_xport_mr_dereg(x->mrs);
    }
    epd__xport_leave(x);
    x->ops->destroy(x->be);
    epd_bufpool_cleanup(&x->held);
    epd_free(x->slots);
    epd_free(x->slot_gen);
    epd_free(x->op_pool);
    epd_free(x);
}

epd_status_t epd_xport_address(epd_xport_t *x, const void **blob_p, size_t *len_p)
{
    return x->ops->address(x->be, blob_p, len_p);
}

void epd_xport_describe(epd_xport_t *x, char *buf, size_t len)
{
    x->ops->describe(x->be, buf, len);
}

uint64_t epd_xport_id(const epd_xport_t *x)
{
    return x->id;
}

/* -------------------------------------------------------------- endpoints */

epd_status_t epd_xport_connect(epd_xport_t *x, const void *blob, size_t len,
                               epd_xport_comp_cb_t cb, void *arg, epd_xport_ep_t **ep_p)
{
    const void *own;
    size_t own_len;
    epd_xport_ep_t *ep;
    epd_status_t st;

    if (blob == NULL || len == 0 || len > EPD_XPORT_ADDR_MAX) {
        return EPD_ERR_BAD_ADDRESS;
    }
    if (ep_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    st = x->ops->address(x->be, &own, &own_len);
    if (st != EPD_OK) {
        return st;
    }
    st = epd__ep_new(x, blob, len, &ep);
    if (st != EPD_OK) {
        return st;
    }
    ep->state = EPD__EP_CONNECTING;
    ep->conn_cb = cb;
    ep->conn_arg = arg;
    ep->deadline_ns = epd_time_now_ns() + (uint64_t)x->cfg.connect_timeout_ms * EPD_NSEC_PER_MSEC;
    st = epd__frame_send(ep, EPD__FRAME_HELLO, 0, own, own_len);
    if (st != EPD_OK && st != EPD_ERR_NO_RESOURCE) {
        ep->conn_cb = NULL;
        epd_xport_ep_close(ep);
        return st;
    }
    /* backpressure on a fresh endpoint: the timers retry the HELLO until
     * the connect deadline (callbacks only ever run from progress) */
    ep->hello_pending = st == EPD_ERR_NO_RESOURCE;
    *ep_p = ep;
    return EPD_INPROGRESS;
}

static void epd__ep_free(epd_xport_ep_t *ep)
{
    epd_free(ep);
}

void epd_xport_ep_close(epd_xport_ep_t *ep)
{
    epd_xport_t *x;

    if (ep == NULL || ep->state == EPD__EP_CLOSED) {
        return;
    }
    x = ep->x;
    epd__xport_enter(x);
    if (ep->state == EPD__EP_CONNECTED) {
        (void)epd__frame_send(ep, EPD__FRAME_BYE, 0, NULL, 0);
    }
    if (ep->state == EPD__EP_CONNECTING && ep->conn_cb != NULL) {
        /* the connect completes, like every other pending operation */
        epd_xport_comp_cb_t cb = ep->conn_cb;
        ep->conn_cb = NULL;
        ep->state = EPD__EP_CLOSED;
        cb(ep->conn_arg, EPD_ERR_CANCELED);
    }
    ep->state = EPD__EP_CLOSED;
    ep->conn_cb = NULL;
    epd__ep_release_backend(ep);
    epd__slot_release(x, ep);
    if (ep->prev != NULL) {
        ep->prev->next = ep->next;
    } else {
        x->eps = ep->next;
    }
    if (ep->next != NULL) {
        ep->next->prev = ep->prev;
    }
    /* the pump list may still point at it: parked until the stack unwinds,
     * and epd__pump_all skips closed endpoints */
    if (ep->pump_listed) {
        epd_xport_ep_t **pp = &x->pump;
        while (*pp != NULL && *pp != ep) {
            pp = &(*pp)->pump_next;
        }
        if (*pp == ep) {
            *pp = ep->pump_next;
        }
        ep->pump_listed = false;
    }
    ep->prev = NULL;
    ep->next = x->zombies;
    x->zombies = ep;
    epd__xport_leave(x);
}

uint64_t epd_xport_ep_peer_id(const epd_xport_ep_t *ep)
{
    return ep->state == EPD__EP_CONNECTING ? 0 : ep->peer_id;
}

void epd_xport_ep_describe(epd_xport_ep_t *ep, char *buf, size_t len)
{
    const char *cls = "other";

    if (len == 0) {
        return;
    }
    if (ep->be_ep != NULL) {
        ep->x->ops->ep_describe(ep->be_ep, ep->desc, sizeof(ep->desc), &cls);
    }
    snprintf(buf, len, "%s", ep->desc[0] != '\0' ? ep->desc : "(closed)");
}

void epd_xport_ep_set_user(epd_xport_ep_t *ep, void *user)
{
    ep->user = user;
}

void *epd_xport_ep_user(const epd_xport_ep_t *ep)
{
    return ep->user;
}

static epd_status_t epd__ep_usable(const epd_xport_ep_t *ep)
{
    if (ep->state == EPD__EP_FAILED) {
        return ep->fail_status;
    }
    if (ep->state == EPD__EP_CLOSED) {
        return EPD_ERR_INVALID_PARAM;
    }
    return EPD_OK;
}

epd_status_t epd_xport_send(epd_xport_ep_t *ep, const void *buf, size_t len, unsigned flags)
{
    epd_xport_t *x;
    epd__held_t *h;
    epd_status_t st;
    bool fenced;

    if (ep == NULL || buf == NULL || len == 0 || (flags & ~EPD_XPORT_SEND_FENCE) != 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    x = ep->x;
    if (len > x->cfg.max_msg_size) {
        return EPD_ERR_TOO_LONG;
    }
    st = epd__ep_usable(ep);
    if (st != EPD_OK) {
        return st;
    }
    fenced = (flags & EPD_XPORT_SEND_FENCE) != 0;
    if (ep->state == EPD__EP_CONNECTED && ep->held_head == NULL &&
        (!fenced || (ep->wr_head == NULL && ep->flushed_seq >= ep->wr_seq))) {
        st = epd__frame_send(ep, EPD__FRAME_MSG, 0, buf, len);
        if (st != EPD_OK && st != EPD_ERR_NO_RESOURCE) {
            epd__ep_fail(ep, st);
        }
        return st;
    }
    h = epd__held_get(x, len);
    if (h == NULL) {
        return EPD_ERR_NO_RESOURCE;
    }
    memcpy(h->buf, buf, len);
    h->len = len;
    h->fenced = fenced;
    h->fence_target = ep->wr_seq;
    h->next = NULL;
    if (ep->held_tail != NULL) {
        ep->held_tail->next = h;
    } else {
        ep->held_head = h;
    }
    ep->held_tail = h;
    if (ep->state == EPD__EP_CONNECTED && ep->held_head == h && !epd__ep_pump(ep)) {
        epd__pump_schedule(ep);
    }
    return EPD_OK;
}

/* ---------------------------------------------------------------- memory */

static epd_status_t epd__mr_wrap(epd_xport_t *x, void *be_mr, void *addr, size_t size,
                                 epd_xport_mr_t **mr_p)
{
    epd_xport_mr_t *mr = epd_calloc(1, sizeof(*mr));

    if (mr == NULL) {
        x->ops->mr_dereg(x->be, be_mr);
        return EPD_ERR_NO_MEMORY;
    }
    mr->x = x;
    mr->be_mr = be_mr;
    mr->addr = addr;
    mr->size = size;
    mr->next = x->mrs;
    if (x->mrs != NULL) {
        x->mrs->prev = mr;
    }
    x->mrs = mr;
    *mr_p = mr;
    return EPD_OK;
}

epd_status_t epd_xport_mr_alloc(epd_xport_t *x, size_t size, epd_xport_mr_t **mr_p)
{
    void *addr, *be_mr;
    epd_status_t st;

    if (size == 0 || mr_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    st = x->ops->mr_alloc(x->be, size, &addr, &be_mr);
    if (st != EPD_OK) {
        return st;
    }
    return epd__mr_wrap(x, be_mr, addr, size, mr_p);
}

epd_status_t epd_xport_mr_reg(epd_xport_t *x, void *addr, size_t size, epd_xport_mr_t **mr_p)
{
    void *be_mr;
    epd_status_t st;

    if (addr == NULL || size == 0 || mr_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    st = x->ops->mr_reg(x->be, addr, size, &be_mr);
    if (st != EPD_OK) {
        return st;
    }
    return epd__mr_wrap(x, be_mr, addr, size, mr_p);
}

void epd_xport_mr_dereg(epd_xport_mr_t *mr)
{
    epd_xport_t *x;

    if (mr == NULL) {
        return;
    }
    x = mr->x;
    if (mr->prev != NULL) {
        mr->prev->next = mr->next;
    } else {
        x->mrs = mr->next;
    }
    if (mr->next != NULL) {
        mr->next->prev = mr->prev;
    }
    x->ops->mr_dereg(x->be, mr->be_mr);
    epd_free(mr);
}

void *epd_xport_mr_addr(const epd_xport_mr_t *mr)
{
    return mr->addr;
}

size_t epd_xport_mr_size(const epd_xport_mr_t *mr)
{
    return mr->size;
}

epd_status_t epd_xport_mr_pack(epd_xport_mr_t *mr, void *buf, size_t cap, size_t *len_p)
{
    if (buf == NULL || len_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    return mr->x->ops->mr_pack(mr->x->be, mr->be_mr, buf, cap, len_p);
}

epd_status_t epd_xport_rkey_unpack(epd_xport_ep_t *ep, const void *blob, size_t len,
                                   epd_xport_rkey_t **rkey_p)
{
    epd_xport_rkey_t *rk;
    epd_status_t st;

    if (blob == NULL || len == 0 || len > EPD_XPORT_RKEY_MAX) {
        return EPD_ERR_BAD_RKEY;
    }
    if (rkey_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    st = epd__ep_usable(ep);
    if (st != EPD_OK) {
        return st;
    }
    rk = epd_calloc(1, sizeof(*rk));
    if (rk == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    st = ep->x->ops->rkey_unpack(ep->be_ep, blob, len, &rk->be_rkey, &rk->size);
    if (st != EPD_OK) {
        epd_free(rk);
        return st;
    }
    rk->ep = ep;
    rk->next = ep->rkeys;
    if (ep->rkeys != NULL) {
        ep->rkeys->prev = rk;
    }
    ep->rkeys = rk;
    *rkey_p = rk;
    return EPD_OK;
}

void epd_xport_rkey_destroy(epd_xport_rkey_t *rkey)
{
    epd_xport_ep_t *ep;

    if (rkey == NULL) {
        return;
    }
    ep = rkey->ep;
    if (ep != NULL) {
        if (rkey->prev != NULL) {
            rkey->prev->next = rkey->next;
        } else {
            ep->rkeys = rkey->next;
        }
        if (rkey->next != NULL) {
            rkey->next->prev = rkey->prev;
        }
        if (rkey->be_rkey != NULL) {
            ep->x->ops->rkey_destroy(rkey->be_rkey);
        }
    }
    epd_free(rkey);
}

size_t epd_xport_rkey_size(const epd_xport_rkey_t *rkey)
{
    return rkey->size;
}

/* -------------------------------------------------------- writes, flushes */

epd_status_t epd_xport_write(epd_xport_ep_t *ep, const void *local, size_t len,
                             epd_xport_mr_t *local_mr, epd_xport_rkey_t *rkey,
                             uint64_t remote_offset, epd_xport_comp_cb_t cb, void *arg)
{
    epd_xport_t *x;
    epd__core_op_t *op;
    epd_status_t st;

    if (ep == NULL || local == NULL || len == 0 || rkey == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    st = epd__ep_usable(ep);
    if (st != EPD_OK) {
        return st;
    }
    if (rkey->ep != ep) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (remote_offset > rkey->size || len > rkey->size - remote_offset) {
        return EPD_ERR_OUT_OF_RANGE;
    }
    x = ep->x;
    if (local_mr != NULL && ((const char *)local < (const char *)local_mr->addr ||
                             len > local_mr->size ||
                             (size_t)((const char *)local - (const char *)local_mr->addr) >
                                 local_mr->size - len)) {
        return EPD_ERR_OUT_OF_RANGE;
    }
    op = epd__op_get(x, true);
    if (op == NULL) {
        return EPD_ERR_NO_RESOURCE;
    }
    op->kind = EPD__OP_WRITE;
    op->ep = ep;
    op->cb = cb;
    op->arg = arg;
    op->seq = ep->wr_seq + 1;
    st = x->ops->write(ep->be_ep, local, len, local_mr != NULL ? local_mr->be_mr : NULL,
                       rkey->be_rkey, remote_offset, &op->be);
    if (st != EPD_INPROGRESS) {
        epd__op_put(x, op);
        if (st == EPD_OK) {
            st = EPD_ERR_FATAL; /* contract: a backend never completes a write inline */
        } else if (st != EPD_ERR_NO_RESOURCE && epd_status_scope(st) >= EPD_SCOPE_CONNECTION) {
            epd__ep_fail(ep, st);
        }
        return st;
    }
    ep->wr_seq++;
    ep->ops_held++;
    op->prev = ep->wr_tail;
    op->next = NULL;
    if (ep->wr_tail != NULL) {
        ep->wr_tail->next = op;
    } else {
        ep->wr_head = op;
    }
    ep->wr_tail = op;
    return EPD_INPROGRESS;
}

epd_status_t epd_xport_flush(epd_xport_ep_t *ep, epd_xport_comp_cb_t cb, void *arg)
{
    epd_xport_t *x;
    epd__core_op_t *op;
    epd_status_t st;

    if (ep == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    st = epd__ep_usable(ep);
    if (st != EPD_OK) {
        return st;
    }
    x = ep->x;
    op = epd__op_get(x, true);
    if (op == NULL) {
        return EPD_ERR_NO_RESOURCE;
    }
    op->kind = EPD__OP_FLUSH;
    op->ep = ep;
    op->cb = cb;
    op->arg = arg;
    op->seq = ep->wr_seq;
    st = x->ops->flush(ep->be_ep, &op->be);
    if (st != EPD_INPROGRESS) {
        epd__op_put(x, op);
        if (st == EPD_OK) {
            st = EPD_ERR_FATAL;
        } else if (st != EPD_ERR_NO_RESOURCE && epd_status_scope(st) >= EPD_SCOPE_CONNECTION) {
            epd__ep_fail(ep, st);
        }
        return st;
    }
    ep->ops_held++;
    return EPD_INPROGRESS;
}

/* --------------------------------------------------------------- progress */

static int epd__timers(epd_xport_t *x, uint64_t now)
{
    uint64_t peer_ns = (uint64_t)x->cfg.peer_timeout_ms * EPD_NSEC_PER_MSEC;
    uint64_t ka_ns = peer_ns / 4;
    epd_xport_ep_t *ep, *next;
    int n = 0;

    for (ep = x->eps; ep != NULL; ep = next) {
        next = ep->next;
        if (ep->state == EPD__EP_CONNECTING && ep->hello_pending && now < ep->deadline_ns) {
            const void *own;
            size_t own_len;
            if (x->ops->address(x->be, &own, &own_len) == EPD_OK &&
                epd__frame_send(ep, EPD__FRAME_HELLO, 0, own, own_len) == EPD_OK) {
                ep->hello_pending = false;
            }
        } else if (ep->state == EPD__EP_CONNECTING && now >= ep->deadline_ns) {
            epd_log_warn(EPD__XPORT_COMP, 0, "connect timed out after %u ms (nobody answered)",
                         x->cfg.connect_timeout_ms);
            epd__ep_fail(ep, EPD_ERR_TIMEOUT);
            n++;
        } else if (ep->state == EPD__EP_CONNECTED) {
            if (now - ep->last_rx_ns > peer_ns) {
                epd_log_warn(EPD__XPORT_COMP, 0,
                             "peer %016llx silent for %llu ms (limit %u ms): declared dead",
                             (unsigned long long)ep->peer_id,
                             (unsigned long long)((now - ep->last_rx_ns) / EPD_NSEC_PER_MSEC),
                             x->cfg.peer_timeout_ms);
                epd__ep_fail(ep, EPD_ERR_PEER_DEAD);
                n++;
            } else if (now - ep->last_tx_ns >= ka_ns) {
                (void)epd__frame_send(ep, EPD__FRAME_KEEPALIVE, 0, NULL, 0);
            }
        }
        /* an endpoint closed by a callback above is parked on the zombie
         * list, so `next` was read before and stays valid: only the current
         * one could have been unlinked */
    }
    return n;
}

int epd_xport_progress(epd_xport_t *x)
{
    uint64_t now;
    int n;

    epd__xport_enter(x);
    n = x->ops->progress(x->be);
    if (x->pump != NULL) {
        n += epd__pump_all(x);
    }
    now = epd_time_now_ns();
    if (now >= x->next_timer_ns) {
        x->next_timer_ns = now + x->timer_step_ns;
        n += epd__timers(x, now);
    }
    epd__xport_leave(x);
    return n;
}

epd_status_t epd_xport_get_fd(epd_xport_t *x, int *fd_p)
{
    return x->ops->get_fd(x->be, fd_p);
}

epd_status_t epd_xport_arm(epd_xport_t *x)
{
    if (x->pump != NULL) {
        return EPD_ERR_BUSY;
    }
    return x->ops->arm(x->be);
}

int epd_xport_poll(epd_xport_t *x, int timeout_ms)
{
    struct pollfd pfd;
    uint64_t now, wait_ns;
    int n, fd, ms;

    n = epd_xport_progress(x);
    if (n > 0 || timeout_ms <= 0) {
        return n;
    }
    now = epd_time_now_ns();
    wait_ns = x->next_timer_ns > now ? x->next_timer_ns - now : 0;
    if (wait_ns > (uint64_t)timeout_ms * EPD_NSEC_PER_MSEC) {
        wait_ns = (uint64_t)timeout_ms * EPD_NSEC_PER_MSEC;
    }
    if (epd_xport_get_fd(x, &fd) != EPD_OK) {
        /* no fd: nap briefly, never longer than the timer step */
        epd_time_sleep_ns(wait_ns < 50 * EPD_NSEC_PER_USEC ? wait_ns : 50 * EPD_NSEC_PER_USEC);
        return epd_xport_progress(x);
    }
    if (epd_xport_arm(x) != EPD_OK) {
        return epd_xport_progress(x);
    }
    ms = (int)((wait_ns + EPD_NSEC_PER_MSEC - 1) / EPD_NSEC_PER_MSEC);
    pfd.fd = fd;
    pfd.events = POLLIN;
    pfd.revents = 0;
    if (poll(&pfd, 1, ms) < 0 && errno != EINTR) {
        epd_log_warn(EPD__XPORT_COMP, 0, "poll on the transport fd failed: %s", strerror(errno));
    }
    return epd_xport_progress(x);
}
