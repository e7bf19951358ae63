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
 *   - authentication (a cluster secret configured): the HELLO also carries
 *     the initiator's identity, a fresh 32-byte nonce and MAC_hello; the
 *     HELLO_ACK the acceptor's identity, its nonce and MAC_ack; a third
 *     frame, HELLO_FIN, the initiator's MAC_fin.  With K = BLAKE2b-256 of
 *     the secret (personalised "epd-xport-v1"), H1 = BLAKE2b-256(HELLO
 *     header and payload as sent), T = BLAKE2b-256("epd-xport-hs-v1" || H1
 *     || HELLO_ACK header || its identity block):
 *         MAC_hello = BLAKE2b-256_K("hel" || HELLO header, identity, address)
 *                     lets the acceptor refuse outsiders before it parses
 *                     their address (replayable: only a filter),
 *         MAC_ack = BLAKE2b-256_K("ack" || T)   proves the acceptor,
 *         MAC_fin = BLAKE2b-256_K("fin" || T)   proves the initiator,
 *         key_i2a = BLAKE2b-256_K("i2a" || T), key_a2i = ... "a2i" ...
 *     T covers both nonces (so nothing of an old handshake replays), both
 *     identities, worker ids, cookies and the initiator's address.  The
 *     acceptor answers from a half-open endpoint that the user never sees
 *     (bounded in number, closed at the connect deadline) and calls
 *     accept_cb only once MAC_fin verified; the connector's callback runs
 *     once MAC_ack verified and the FIN is out.  Afterwards every frame
 *     carries a 16-byte tag (Poly1305 under a one-time key from ChaCha20 of
 *     the direction's key and the frame's sequence number, over the header
 *     and the payload), between the two: a frame on an
 *     authenticated endpoint without a tag, or whose tag does not verify,
 *     fails the endpoint (EPD_ERR_AUTH).  Sequence numbers (inside the
 *     MAC) stop replay within a connection, the nonces across connections.
 *     A side with a secret drops a HELLO without authentication, or whose
 *     MAC_hello does not verify, unanswered (answering would mean an
 *     endpoint made from an outsider's address): it logs and counts the
 *     refusal, the connector times out.  A side without a secret refuses a
 *     HELLO with one by a HELLO_ACK with status EPD_ERR_AUTH (it parses
 *     every address anyway), and a connector that cannot verify a
 *     HELLO_ACK says so by a HELLO_FIN with that status (both
 *     unauthenticated: they can only refuse).  Without a secret and an
 *     identity the frames are byte for byte what they were before.
 *   - liveness: every connected endpoint sends a KEEPALIVE after
 *     peer_timeout_ms/4 without sending anything, and is declared dead after
 *     peer_timeout_ms without receiving anything.  BYE on close.
 *   - fences: a fenced message (and every message after it, to keep order)
 *     is held until the writes posted before it completed locally, then a
 *     backend flush ran, then it is sent — the flush only when a write since
 *     the last one does not deliver on completion (op->delivers: UCX puts
 *     into mapped shared memory, libfabric delivery-complete writes), where
 *     it would only cost a round of progress.
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
#include "epd_xport_faults.h"

#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "epd_alloc.h"
#include "epd_bufpool.h"
#include "epd_log.h"
#include "epd_proc.h"
#include "epd_time.h"

#define EPD__XPORT_COMP "xport"
#define EPD__XPORT_MAGIC 0x58445045u /* "EPDX" little-endian */
#define EPD__XPORT_VERSION 1
#define EPD__XPORT_OP_RESERVE 64   /* ops kept for fence flushes */
#define EPD__XPORT_HELD_MAX 256    /* held message copies per xport ... */
#define EPD__XPORT_HELD_BYTES (64u << 20) /* ... and at most this many bytes of them */
#define EPD__XPORT_LOG_BURST 10    /* rate-limited log lines per second */
#define EPD__XPORT_MSG_LIMIT (16u << 20) /* messages are small; bulk data is written */
/* Handshakes answered and not yet finished (HELLO_FIN outstanding) at once:
 * each holds a backend endpoint made from unauthenticated bytes, so a flood
 * of HELLOs must not pin an unbounded number of them. */
#define EPD__XPORT_HALF_OPEN_MAX 256
#define EPD__XPORT_KEY_BYTES 32 /* handshake key, direction keys, MACs of the handshake */
#define EPD__XPORT_NONCE_BYTES 32
#define EPD__XPORT_TAG_BYTES 16 /* per-frame MAC */

enum {
    EPD__FRAME_HELLO = 1,
    EPD__FRAME_HELLO_ACK = 2,
    EPD__FRAME_MSG = 3,
    EPD__FRAME_KEEPALIVE = 4,
    EPD__FRAME_BYE = 5,
    EPD__FRAME_HELLO_FIN = 6,
};

/* Frame flags. */
#define EPD__FRAME_F_EXT 0x01u  /* HELLO / HELLO_ACK: the payload starts with an epd__hello_ext_t  \
                                 */
#define EPD__FRAME_F_AUTH 0x02u /* HELLO / HELLO_ACK / HELLO_FIN: the sender authenticates */
#define EPD__FRAME_F_MAC 0x04u  /* an EPD__XPORT_TAG_BYTES tag follows the header */
#define EPD__FRAME_F_PROC                                                                          \
    0x08u /* HELLO / HELLO_ACK with F_EXT: an epd__hello_proc_t follows                            \
           * the identity block */
#define EPD__FRAME_F_ALL                                                                           \
    (EPD__FRAME_F_EXT | EPD__FRAME_F_AUTH | EPD__FRAME_F_MAC | EPD__FRAME_F_PROC)
/* Flags a HELLO or HELLO_ACK may carry. */
#define EPD__FRAME_F_HELLO (EPD__FRAME_F_EXT | EPD__FRAME_F_AUTH | EPD__FRAME_F_PROC)

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
_Static_assert(sizeof(epd__frame_t) + EPD__XPORT_TAG_BYTES == EPD__XPORT_FRAME_ROOM,
               "header and tag fill the frame room");

/* Identity block of a HELLO / HELLO_ACK with EPD__FRAME_F_EXT (host byte
 * order, like the header).  HELLO: followed by the address blob;
 * HELLO_ACK with EPD__FRAME_F_AUTH: followed by MAC_ack. */
typedef struct {
    char worker_id[EPD_XPORT_WORKER_ID_MAX + 1]; /* NUL-terminated, checked */
    int32_t role;
    uint32_t reserved; /* 0 */
    uint64_t epoch_start_ns;
    uint64_t epoch_nonce;
    unsigned char nonce[EPD__XPORT_NONCE_BYTES]; /* fresh per handshake */
} epd__hello_ext_t;

_Static_assert(sizeof(epd__hello_ext_t) == 184, "identity block layout");

/* Process block of a HELLO / HELLO_ACK with EPD__FRAME_F_PROC: which process
 * on which host the sender is, so that a receiver on the same host (same
 * boot id and pid namespace) can watch it end (a pidfd, checked against
 * the process's start time so a reused pid is never mistaken for it) —
 * the fence's proof for memory the sender may write without the receiver's
 * check (proto/README.md rule 27).  Inside the handshake's MACs with a
 * cluster secret; claimed only without one. */
typedef struct {
    uint32_t pid;
    uint32_t reserved;             /* 0 */
    uint64_t start_ticks;          /* /proc/<pid>/stat field 22: clock ticks after boot */
    uint64_t pidns_dev, pidns_ino; /* /proc/<pid>/ns/pid */
    unsigned char boot_id[16];     /* /proc/sys/kernel/random/boot_id */
} epd__hello_proc_t;

_Static_assert(sizeof(epd__hello_proc_t) == 48, "process block layout");
_Static_assert(sizeof(epd__hello_ext_t) + sizeof(epd__hello_proc_t) + EPD_XPORT_ADDR_MAX +
                       EPD__XPORT_KEY_BYTES <=
                   EPD__XPORT_CTRL_MAX,
               "a HELLO fits the control frame size");

/* CONNECTING: ours, handshake under way.  ACCEPTING: a peer's HELLO was
 * answered, its HELLO_FIN awaited; never seen by the user. */
enum {
    EPD__EP_CONNECTING = 1,
    EPD__EP_ACCEPTING,
    EPD__EP_CONNECTED,
    EPD__EP_FAILED,
    EPD__EP_CLOSED
};
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
    void *fault_copy; /* EPD_XPORT_FAULTS: corrupted copy of the bytes (owned) */
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
    unsigned access;
    epd_xport_write_check_cb_t check; /* the owner's check of writes (may be NULL) */
    void *check_arg;
    epd_xport_grant_t *grants; /* open on it */
    epd_xport_mr_t *prev, *next;
};

/* Where a grant stands (epd_xport.h, "The fence"). */
enum {
    EPD__GRANT_OPEN = 0,
    EPD__GRANT_REVOKED, /* the backend checks every byte: settles when it says so */
    EPD__GRANT_HELD,    /* bytes may land unchecked: only the writer's end settles it */
    EPD__GRANT_SETTLED,
};

struct epd_xport_grant {
    epd_xport_mr_t *mr;
    void *be_grant;
    void *user;
    int state;
    const char *why; /* SETTLED: how */
    bool proc_known; /* the writer's process, from a handshake */
    epd_proc_id_t proc;
    int pidfd;                      /* a watch of it (same host), -1 */
    epd_xport_grant_t *prev, *next; /* mr->grants */
};

struct epd_xport_ep {
    epd_xport_t *x;
    void *be_ep;
    int state;
    bool incoming;
    bool pump_listed;
    int hs_pending;      /* HELLO or HELLO_FIN refused by backpressure: retry */
    bool authed;         /* frames carry MACs under tx_key / rx_key */
    bool handshaken;     /* the handshake completed (identity known) */
    bool peer_presented; /* the peer sent an identity block */
    bool peer_proc_known; /* ... and a process block */
    epd_xport_identity_t peer_ident;
    epd__hello_proc_t peer_proc;
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
    uint64_t nd_seq;       /* the newest write whose completion does not mean delivery */
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
    /* handshake and frame keys (wiped when the endpoint is freed) */
    unsigned char nonce[EPD__XPORT_NONCE_BYTES]; /* ours, this handshake */
    unsigned char hs_hash[EPD__XPORT_KEY_BYTES]; /* initiator: H1; acceptor: T */
    unsigned char fin_mac[EPD__XPORT_KEY_BYTES]; /* initiator: MAC_fin while the FIN waits */
    unsigned char tx_key[EPD__XPORT_KEY_BYTES];
    unsigned char rx_key[EPD__XPORT_KEY_BYTES];
};

struct epd_xport {
    const epd__xport_backend_ops_t *ops;
    void *be;
    epd_xport_config_t cfg;
    char expect[16];
    uint64_t id;
    int depth;                 /* core calls on the stack */
    bool auth;                 /* a cluster secret is configured */
    bool ident_set;            /* an identity is presented */
    bool proc_set;             /* this process's block is known (sent in every HELLO) */
    epd__hello_proc_t proc;
    epd_proc_id_t self;        /* the same, for same-host comparisons */
    uint32_t grants_held;      /* grants HELD (stats) */
    uint32_t half_open;        /* ACCEPTING endpoints */
    unsigned char hs_key[EPD__XPORT_KEY_BYTES]; /* K, from the secret; wiped at destroy */
    epd_xport_stats_t stats;
    epd__xport_faults_t *faults; /* EPD_XPORT_FAULTS (NULL: none, the normal case) */
    epd__xport_tap_cb_t tap; /* tests: sees every delivered frame */
    void *tap_arg;
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

/* Errors caused by what a peer sent (a failed handshake, a forged frame):
 * anyone who can reach the worker can make them, so they are rate-limited
 * like the drops. */
#define EPD__LOG_LIMITED_ERR(x, ...)                                                               \
    do {                                                                                           \
        if (epd__log_allowed(x)) {                                                                 \
            epd_log_error(EPD__XPORT_COMP, 0, __VA_ARGS__);                                        \
        }                                                                                          \
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

/* ----------------------------------------------------------- crypto */

/* MAC tag of a frame: Poly1305 over the 48-byte header (flags included, so
 * the tag's presence is covered too) and the payload, under a one-time key
 * that is the first ChaCha20 block of the direction's key with the frame's
 * sequence number as nonce — the way ChaCha20-Poly1305 authenticates its
 * associated data.  Each (direction key, sequence number) pair tags one
 * frame only: a send the backend refused is retried with the same number
 * but was never transmitted.  Chosen over keyed BLAKE2b for throughput:
 * about 3x on the kilobytes-to-megabytes messages of the request plane
 * (images travel on it), the same on the smallest. */
static void epd__frame_tag(const unsigned char key[EPD__XPORT_KEY_BYTES], const void *hdr,
                           const void *payload, size_t len, unsigned char tag[EPD__XPORT_TAG_BYTES])
{
    unsigned char nonce[crypto_stream_chacha20_ietf_NONCEBYTES] = {0};
    unsigned char otk[crypto_onetimeauth_poly1305_KEYBYTES];
    crypto_onetimeauth_poly1305_state st;
    epd__frame_t f;

    memcpy(&f, hdr, sizeof(f));
    memcpy(nonce + sizeof(nonce) - sizeof(f.seq), &f.seq, sizeof(f.seq));
    crypto_stream_chacha20_ietf(otk, sizeof(otk), nonce, key);
    crypto_onetimeauth_poly1305_init(&st, otk);
    crypto_onetimeauth_poly1305_update(&st, hdr, sizeof(epd__frame_t));
    if (len > 0) {
        crypto_onetimeauth_poly1305_update(&st, payload, len);
    }
    crypto_onetimeauth_poly1305_final(&st, tag);
    sodium_memzero(otk, sizeof(otk));
}

_Static_assert(crypto_onetimeauth_poly1305_BYTES == EPD__XPORT_TAG_BYTES, "a Poly1305 tag");
_Static_assert(crypto_stream_chacha20_ietf_KEYBYTES == EPD__XPORT_KEY_BYTES, "a ChaCha20 key");

/* H1: the HELLO as it travelled (header and payload). */
static void epd__hs_h1(const void *hdr, const void *payload, size_t len,
                       unsigned char h1[EPD__XPORT_KEY_BYTES])
{
    crypto_generichash_state st;

    crypto_generichash_init(&st, NULL, 0, EPD__XPORT_KEY_BYTES);
    crypto_generichash_update(&st, hdr, sizeof(epd__frame_t));
    crypto_generichash_update(&st, payload, len);
    crypto_generichash_final(&st, h1, EPD__XPORT_KEY_BYTES);
}

/* T: the transcript — H1, then the HELLO_ACK's header, identity block and
 * process block (when it carries one: its header's flags say so). */
static void epd__hs_transcript(const unsigned char h1[EPD__XPORT_KEY_BYTES], const void *ack_hdr,
                               const epd__hello_ext_t *ack_ext, const epd__hello_proc_t *ack_proc,
                               unsigned char t[EPD__XPORT_KEY_BYTES])
{
    static const char dom[] = "epd-xport-hs-v1";
    crypto_generichash_state st;

    crypto_generichash_init(&st, NULL, 0, EPD__XPORT_KEY_BYTES);
    crypto_generichash_update(&st, (const unsigned char *)dom, sizeof(dom));
    crypto_generichash_update(&st, h1, EPD__XPORT_KEY_BYTES);
    crypto_generichash_update(&st, ack_hdr, sizeof(epd__frame_t));
    crypto_generichash_update(&st, (const unsigned char *)ack_ext, sizeof(*ack_ext));
    if (ack_proc != NULL) {
        crypto_generichash_update(&st, (const unsigned char *)ack_proc, sizeof(*ack_proc));
    }
    crypto_generichash_final(&st, t, EPD__XPORT_KEY_BYTES);
}

/* BLAKE2b-256 keyed with the handshake key K over label || T: the MACs of
 * the handshake and the two direction keys. */
static void epd__hs_derive(const epd_xport_t *x, const char label[4],
                           const unsigned char t[EPD__XPORT_KEY_BYTES],
                           unsigned char out[EPD__XPORT_KEY_BYTES])
{
    crypto_generichash_state st;

    crypto_generichash_init(&st, x->hs_key, EPD__XPORT_KEY_BYTES, EPD__XPORT_KEY_BYTES);
    crypto_generichash_update(&st, (const unsigned char *)label, 4);
    crypto_generichash_update(&st, t, EPD__XPORT_KEY_BYTES);
    crypto_generichash_final(&st, out, EPD__XPORT_KEY_BYTES);
}

/* MAC_hello: BLAKE2b-256 keyed with K over "hel" || the HELLO's header and
 * its payload up to this MAC.  Not a proof of freshness (a recorded HELLO
 * replays; its handshake then fails at HELLO_FIN): it lets an acceptor
 * refuse a HELLO from outside the cluster before it hands the address blob
 * in it to the library — UCX trusts address bytes and aborts on crafted
 * ones (found by fuzz_epd_xport_ucx_keys), and a blob's checksum stops
 * corruption, not an attacker. */
static void epd__hello_mac(const epd_xport_t *x, const void *hdr, const void *payload, size_t len,
                           unsigned char out[EPD__XPORT_KEY_BYTES])
{
    crypto_generichash_state st;

    crypto_generichash_init(&st, x->hs_key, EPD__XPORT_KEY_BYTES, EPD__XPORT_KEY_BYTES);
    crypto_generichash_update(&st, (const unsigned char *)"hel", 4);
    crypto_generichash_update(&st, hdr, sizeof(epd__frame_t));
    crypto_generichash_update(&st, payload, len);
    crypto_generichash_final(&st, out, EPD__XPORT_KEY_BYTES);
}

/* An identity block's worker id is NUL-terminated printable ASCII without
 * spaces: it ends up in logs and in the daemon's comparisons. */
static bool epd__worker_id_ok(const char *id, size_t cap)
{
    const char *end = memchr(id, '\0', cap);

    if (end == NULL) {
        return false;
    }
    for (const char *p = id; p < end; p++) {
        if (*p < 0x21 || *p > 0x7e) {
            return false;
        }
    }
    return true;
}

static void epd__ext_fill(const epd_xport_t *x, const unsigned char nonce[EPD__XPORT_NONCE_BYTES],
                          epd__hello_ext_t *ext)
{
    memset(ext, 0, sizeof(*ext));
    memcpy(ext->worker_id, x->cfg.identity.worker_id, sizeof(ext->worker_id));
    ext->role = x->cfg.identity.role;
    ext->epoch_start_ns = x->cfg.identity.epoch.start_time_ns;
    ext->epoch_nonce = x->cfg.identity.epoch.nonce;
    memcpy(ext->nonce, nonce, EPD__XPORT_NONCE_BYTES);
}

static void epd__ext_to_ident(const epd__hello_ext_t *ext, epd_xport_identity_t *id)
{
    memset(id, 0, sizeof(*id));
    memcpy(id->worker_id, ext->worker_id, sizeof(id->worker_id));
    id->worker_id[EPD_XPORT_WORKER_ID_MAX] = '\0';
    id->role = ext->role;
    id->epoch.start_time_ns = ext->epoch_start_ns;
    id->epoch.nonce = ext->epoch_nonce;
}

/* The worker id a peer claims, for logs ("?" before it said). */
static const char *epd__ep_who(const epd_xport_ep_t *ep)
{
    return ep->peer_presented && ep->peer_ident.worker_id[0] != '\0' ? ep->peer_ident.worker_id
                                                                     : "?";
}

/* ----------------------------------------------------------- framing */

/* Fills the header of the next frame on `ep`. */
static void epd__frame_hdr(const epd_xport_ep_t *ep, int type, int32_t status, unsigned flags,
                           size_t len, epd__frame_t *f)
{
    memset(f, 0, sizeof(*f));
    f->magic = EPD__XPORT_MAGIC;
    f->version = EPD__XPORT_VERSION;
    f->type = (uint8_t)type;
    f->flags = (uint8_t)flags;
    f->len = (uint32_t)len;
    f->status = status;
    f->sender_id = ep->x->id;
    f->src_cookie = ep->cookie;
    f->dst_cookie = ep->remote_cookie;
    f->seq = ep->tx_seq + 1;
}

/* Sends a frame whose header `f` came from epd__frame_hdr; on an
 * authenticated endpoint a tag goes between header and payload.  Updates
 * sequence and tx time only when the backend accepted it. */
static epd_status_t epd__frame_send_hdr(epd_xport_ep_t *ep, epd__frame_t *f, const void *payload,
                                        size_t len)
{
    epd_xport_t *x = ep->x;
    struct {
        epd__frame_t f;
        unsigned char tag[EPD__XPORT_TAG_BYTES];
    } w;
    size_t hdr_len = sizeof(w.f);
    epd_status_t st;

    if (ep->authed) {
        f->flags |= EPD__FRAME_F_MAC;
        w.f = *f;
        epd__frame_tag(ep->tx_key, &w.f, payload, len, w.tag);
        hdr_len = sizeof(w);
    } else {
        w.f = *f;
    }
    st = x->ops->send(ep->be_ep, &w, hdr_len, payload, len);
    if (st == EPD_OK) {
        ep->tx_seq++;
        ep->last_tx_ns = epd_time_now_ns();
    }
    return st;
}

/* Sends one frame on the backend endpoint; updates sequence and tx time only
 * when the backend accepted it. */
static epd_status_t epd__frame_send(epd_xport_ep_t *ep, int type, int32_t status,
                                    const void *payload, size_t len)
{
    epd__frame_t f;

    epd__frame_hdr(ep, type, status, 0, len, &f);
    return epd__frame_send_hdr(ep, &f, payload, len);
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
        if (x->faults != NULL) {
            epd__xport_faults_release(x->faults, ep); /* completions it delayed */
        }
        x->ops->ep_destroy(be_ep);
        /* contract: ep_destroy completes every op it held */
        assert(ep->ops_held == 0);
    }
    epd__held_drop(ep);
}

/* Marks the endpoint failed: connect callback (if still connecting), then the
 * error callback, then every op it holds completes with `status`.  A
 * half-open accepted endpoint (the user never saw it) is closed quietly. */
static void epd__ep_fail(epd_xport_ep_t *ep, epd_status_t status)
{
    epd_xport_t *x = ep->x;
    bool connecting = ep->state == EPD__EP_CONNECTING;

    if (ep->state == EPD__EP_FAILED || ep->state == EPD__EP_CLOSED) {
        return;
    }
    if (ep->state == EPD__EP_ACCEPTING) {
        epd_log_debug(EPD__XPORT_COMP, 0, "half-open endpoint of peer %016llx failed: %s",
                      (unsigned long long)ep->peer_id, epd_status_string(status));
        epd_xport_ep_close(ep);
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
            if (x->faults != NULL) {
                epd__xport_faults_release(x->faults, ep); /* completions it delayed */
            }
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
            if (ep->flushed_seq < h->fence_target && ep->nd_seq > ep->flushed_seq) {
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

    if (op->ep->x->faults != NULL && op->kind == EPD__OP_WRITE) {
        /* the backend is done with the bytes: a corrupted copy can go */
        epd_free(op->fault_copy);
        op->fault_copy = NULL;
        /* held only while the endpoint lives (its teardown completes
         * every op before it returns) */
        if (op->ep->state == EPD__EP_CONNECTED && op->ep->be_ep != NULL &&
            epd__xport_faults_comp(op->ep->x->faults, bop, op->ep, &status)) {
            return; /* held: completed later through epd__xport_op_done_now */
        }
    }
    epd__xport_op_done_now(bop, status);
}

void epd__xport_op_done_now(epd__xport_op_t *bop, epd_status_t status)
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

/* A dropped frame: counted, logged (rate-limited). */
#define EPD__DROP(x, ...)                                                                          \
    do {                                                                                           \
        (x)->stats.frames_dropped++;                                                               \
        EPD__LOG_LIMITED((x), __VA_ARGS__);                                                        \
    } while (0)

/* Refuses a HELLO with `why` from the endpoint made to answer it, then
 * closes that endpoint (the user never sees it). */
static void epd__hello_refuse(epd_xport_ep_t *ep, epd_status_t why)
{
    (void)epd__frame_send(ep, EPD__FRAME_HELLO_ACK, why, NULL, 0);
    ep->state = EPD__EP_FAILED;
    ep->fail_status = why;
    epd_xport_ep_close(ep);
}

/* Sends our HELLO on a connecting endpoint: the address blob, behind an
 * identity block (with ep->nonce) when we present an identity or
 * authenticate.  Authenticating, H1 goes to ep->hs_hash.  A retry sends the
 * same bytes (same nonce, same sequence number). */
static epd_status_t epd__hello_send(epd_xport_ep_t *ep)
{
    epd_xport_t *x = ep->x;
    unsigned char buf[sizeof(epd__hello_ext_t) + sizeof(epd__hello_proc_t) + EPD_XPORT_ADDR_MAX +
                      EPD__XPORT_KEY_BYTES];
    size_t len, pre;
    epd__hello_ext_t ext;
    const void *own;
    size_t own_len;
    epd__frame_t f;
    epd_status_t st;

    st = x->ops->address(x->be, &own, &own_len);
    if (st != EPD_OK) {
        return st;
    }
    if (!x->auth && !x->ident_set) {
        /* the HELLO of epd without authentication, unchanged */
        return epd__frame_send(ep, EPD__FRAME_HELLO, 0, own, own_len);
    }
    if (own_len > EPD_XPORT_ADDR_MAX) {
        return EPD_ERR_BAD_ADDRESS;
    }
    epd__ext_fill(x, ep->nonce, &ext);
    memcpy(buf, &ext, sizeof(ext));
    pre = sizeof(ext);
    if (x->proc_set) {
        memcpy(buf + pre, &x->proc, sizeof(x->proc));
        pre += sizeof(x->proc);
    }
    memcpy(buf + pre, own, own_len);
    len = pre + own_len + (x->auth ? EPD__XPORT_KEY_BYTES : 0);
    epd__frame_hdr(ep, EPD__FRAME_HELLO, 0,
                   EPD__FRAME_F_EXT | (x->auth ? EPD__FRAME_F_AUTH : 0u) |
                       (x->proc_set ? EPD__FRAME_F_PROC : 0u),
                   len, &f);
    if (x->auth) {
        epd__hello_mac(x, &f, buf, len - EPD__XPORT_KEY_BYTES, buf + len - EPD__XPORT_KEY_BYTES);
        epd__hs_h1(&f, buf, len, ep->hs_hash);
    }
    return epd__frame_send_hdr(ep, &f, buf, len);
}

/* Sends the initiator's HELLO_FIN (MAC_fin, computed at the HELLO_ACK). */
static epd_status_t epd__fin_send(epd_xport_ep_t *ep)
{
    epd__frame_t f;

    epd__frame_hdr(ep, EPD__FRAME_HELLO_FIN, 0, EPD__FRAME_F_AUTH, sizeof(ep->fin_mac), &f);
    return epd__frame_send_hdr(ep, &f, ep->fin_mac, sizeof(ep->fin_mac));
}

/* The connector's side of the handshake is done: the endpoint is usable,
 * the connect callback runs, held messages go out. */
static void epd__ep_connected(epd_xport_ep_t *ep)
{
    epd_xport_t *x = ep->x;
    epd_xport_comp_cb_t cb;

    ep->state = EPD__EP_CONNECTED;
    ep->handshaken = true;
    ep->authed = x->auth;
    ep->hs_pending = 0;
    sodium_memzero(ep->nonce, sizeof(ep->nonce));
    sodium_memzero(ep->hs_hash, sizeof(ep->hs_hash));
    sodium_memzero(ep->fin_mac, sizeof(ep->fin_mac));
    epd_log_info(EPD__XPORT_COMP, 0, "connected to peer %016llx (worker '%s'%s): %s",
                 (unsigned long long)ep->peer_id, epd__ep_who(ep),
                 ep->authed ? ", authenticated" : "", ep->desc);
    cb = ep->conn_cb;
    ep->conn_cb = NULL;
    if (cb != NULL) {
        cb(ep->conn_arg, EPD_OK);
    }
    if (ep->state == EPD__EP_CONNECTED && ep->held_head != NULL && !epd__ep_pump(ep)) {
        epd__pump_schedule(ep);
    }
}

static void epd__on_hello(epd_xport_t *x, const epd__frame_t *f, const unsigned char *payload)
{
    bool has_ext = (f->flags & EPD__FRAME_F_EXT) != 0;
    bool their_auth = (f->flags & EPD__FRAME_F_AUTH) != 0;
    bool their_proc = (f->flags & EPD__FRAME_F_PROC) != 0;
    size_t proc_len = their_proc ? sizeof(epd__hello_proc_t) : 0;
    const unsigned char *addr = payload;
    size_t addr_len = f->len;
    unsigned char h1[EPD__XPORT_KEY_BYTES];
    unsigned char pl[sizeof(epd__hello_ext_t) + sizeof(epd__hello_proc_t) + EPD__XPORT_KEY_BYTES];
    size_t pl_len;
    epd__hello_ext_t ext, mine;
    epd__hello_proc_t proc;
    epd__frame_t ack;
    epd_xport_ep_t *ep;
    const char *cls;
    epd_status_t st;

    if (f->seq != 1 || (f->flags & ~EPD__FRAME_F_HELLO) != 0 || (their_auth && !has_ext) ||
        (their_proc && !has_ext)) {
        EPD__DROP(x, "dropping a HELLO from %016llx: sequence %llu, flags %#x",
                  (unsigned long long)f->sender_id, (unsigned long long)f->seq, f->flags);
        return;
    }
    if (has_ext) {
        size_t tail = sizeof(ext) + proc_len + (their_auth ? EPD__XPORT_KEY_BYTES : 0);

        if (f->len <= tail) {
            EPD__DROP(x, "dropping a HELLO from %016llx: %u bytes, no room for an address",
                      (unsigned long long)f->sender_id, f->len);
            return;
        }
        memcpy(&ext, payload, sizeof(ext));
        if (their_proc) {
            memcpy(&proc, payload + sizeof(ext), sizeof(proc));
        }
        if (!epd__worker_id_ok(ext.worker_id, sizeof(ext.worker_id)) || ext.reserved != 0 ||
            (their_proc && proc.reserved != 0)) {
            EPD__DROP(x, "dropping a HELLO from %016llx: malformed identity block",
                      (unsigned long long)f->sender_id);
            return;
        }
        addr = payload + sizeof(ext) + proc_len;
        addr_len = f->len - tail;
    }
    if (addr_len == 0 || addr_len > EPD_XPORT_ADDR_MAX) {
        EPD__DROP(x, "dropping HELLO from %016llx: bad address length %zu",
                  (unsigned long long)f->sender_id, addr_len);
        return;
    }
    for (ep = x->eps; ep != NULL; ep = ep->next) {
        if (ep->incoming && ep->peer_id == f->sender_id && ep->remote_cookie == f->src_cookie) {
            return; /* duplicate */
        }
    }
    if (x->auth) {
        /* Nothing of a HELLO that does not verify under our secret reaches
         * the library (see epd__hello_mac): it is dropped unanswered, since
         * answering needs an endpoint made from its address.  Its sender's
         * connect times out; this side says why, here. */
        unsigned char mac[EPD__XPORT_KEY_BYTES];
        const char *who = has_ext ? ext.worker_id : "?";

        if (!their_auth) {
            x->stats.handshakes_refused++;
            EPD__LOG_LIMITED_ERR(x,
                                 "refusing peer %016llx (claims worker '%s'): its HELLO is not "
                                 "authenticated and this worker requires the cluster secret (is "
                                 "the secret configured there?); dropped unanswered",
                                 (unsigned long long)f->sender_id, who[0] != '\0' ? who : "?");
            return;
        }
        epd__hello_mac(x, f, payload, f->len - EPD__XPORT_KEY_BYTES, mac);
        if (crypto_verify_32(mac, payload + f->len - EPD__XPORT_KEY_BYTES) != 0) {
            x->stats.handshakes_refused++;
            EPD__LOG_LIMITED_ERR(x,
                                 "refusing peer %016llx (claims worker '%s'): its HELLO does not "
                                 "verify under this worker's cluster secret (the secrets differ, "
                                 "or it is not a member); dropped unanswered",
                                 (unsigned long long)f->sender_id, who[0] != '\0' ? who : "?");
            return;
        }
        if (x->half_open >= EPD__XPORT_HALF_OPEN_MAX) {
            EPD__DROP(x, "dropping a HELLO from %016llx: %u handshakes already under way",
                      (unsigned long long)f->sender_id, x->half_open);
            return;
        }
    }
    st = epd__ep_new(x, addr, addr_len, &ep);
    if (st != EPD_OK) {
        EPD__DROP(x, "refusing HELLO from %016llx: %s", (unsigned long long)f->sender_id,
                  epd_status_string(st));
        return;
    }
    ep->incoming = true;
    ep->peer_id = f->sender_id;
    ep->remote_cookie = f->src_cookie;
    ep->rx_seq = f->seq;
    if (has_ext) {
        ep->peer_presented = true;
        epd__ext_to_ident(&ext, &ep->peer_ident);
        if (their_proc) {
            ep->peer_proc_known = true;
            ep->peer_proc = proc;
        }
    }
    cls = epd__class_ok(ep);
    if (cls != NULL) {
        epd_log_error(EPD__XPORT_COMP, 0,
                      "refusing peer %016llx: expected transport class '%s' but %s chose '%s' (%s)",
                      (unsigned long long)f->sender_id, x->expect, x->ops->name, cls, ep->desc);
        epd__hello_refuse(ep, EPD_ERR_CONFIG);
        return;
    }
    if (!x->auth && their_auth) {
        /* without a secret every HELLO's address is used anyway (nothing to
         * check it with), so the refusal can be answered: the connector
         * learns at once that the two disagree */
        x->stats.handshakes_refused++;
        EPD__LOG_LIMITED_ERR(x,
                             "refusing peer %016llx (claims worker '%s'): it authenticates "
                             "with a cluster secret and this worker has none configured",
                             (unsigned long long)f->sender_id, epd__ep_who(ep));
        epd__hello_refuse(ep, EPD_ERR_AUTH);
        return;
    }
    if (!x->auth) {
        ep->state = EPD__EP_CONNECTED;
        ep->handshaken = true;
        if (x->ident_set) {
            /* our identity back, claimed only (nothing proves it) */
            memset(ep->nonce, 0, sizeof(ep->nonce));
            epd__ext_fill(x, ep->nonce, &mine);
            memcpy(pl, &mine, sizeof(mine));
            pl_len = sizeof(mine);
            if (x->proc_set) {
                memcpy(pl + pl_len, &x->proc, sizeof(x->proc));
                pl_len += sizeof(x->proc);
            }
            epd__frame_hdr(ep, EPD__FRAME_HELLO_ACK, EPD_OK,
                           EPD__FRAME_F_EXT | (x->proc_set ? EPD__FRAME_F_PROC : 0u), pl_len, &ack);
            st = epd__frame_send_hdr(ep, &ack, pl, pl_len);
        } else {
            st = epd__frame_send(ep, EPD__FRAME_HELLO_ACK, EPD_OK, NULL, 0);
        }
        if (st != EPD_OK) {
            /* the backend is full right now: the peer retries nothing, so
             * give up on this endpoint; the connector times out and may try
             * again */
            EPD__LOG_LIMITED(x, "cannot answer HELLO from %016llx: %s",
                             (unsigned long long)f->sender_id, epd_status_string(st));
            epd_xport_ep_close(ep);
            return;
        }
        epd_log_info(EPD__XPORT_COMP, 0,
                     "accepted peer %016llx (worker '%s', not authenticated): %s",
                     (unsigned long long)f->sender_id, epd__ep_who(ep), ep->desc);
        if (x->cfg.accept_cb != NULL) {
            x->cfg.accept_cb(x->cfg.cb_arg, ep);
        }
        return;
    }

    /* authenticated: answer with our identity, nonce and MAC_ack, then wait
     * (half-open, invisible to the user) for the initiator's proof */
    randombytes_buf(ep->nonce, sizeof(ep->nonce));
    epd__ext_fill(x, ep->nonce, &mine);
    epd__hs_h1(f, payload, f->len, h1);
    memcpy(pl, &mine, sizeof(mine));
    pl_len = sizeof(mine);
    if (x->proc_set) {
        memcpy(pl + pl_len, &x->proc, sizeof(x->proc));
        pl_len += sizeof(x->proc);
    }
    epd__frame_hdr(ep, EPD__FRAME_HELLO_ACK, EPD_OK,
                   EPD__FRAME_F_EXT | EPD__FRAME_F_AUTH | (x->proc_set ? EPD__FRAME_F_PROC : 0u),
                   pl_len + EPD__XPORT_KEY_BYTES, &ack);
    epd__hs_transcript(h1, &ack, &mine, x->proc_set ? &x->proc : NULL, ep->hs_hash);
    epd__hs_derive(x, "ack", ep->hs_hash, pl + pl_len);
    pl_len += EPD__XPORT_KEY_BYTES;
    ep->state = EPD__EP_ACCEPTING;
    x->half_open++;
    ep->deadline_ns = epd_time_now_ns() + (uint64_t)x->cfg.connect_timeout_ms * EPD_NSEC_PER_MSEC;
    st = epd__frame_send_hdr(ep, &ack, pl, pl_len);
    if (st != EPD_OK) {
        EPD__LOG_LIMITED(x, "cannot answer HELLO from %016llx: %s", (unsigned long long)f->sender_id,
                         epd_status_string(st));
        epd_xport_ep_close(ep);
    }
}

static void epd__on_ack(epd_xport_t *x, epd_xport_ep_t *ep, const epd__frame_t *f,
                        const unsigned char *payload)
{
    bool has_ext = (f->flags & EPD__FRAME_F_EXT) != 0;
    bool their_auth = (f->flags & EPD__FRAME_F_AUTH) != 0;
    bool their_proc = (f->flags & EPD__FRAME_F_PROC) != 0;
    size_t proc_len = their_proc ? sizeof(epd__hello_proc_t) : 0;
    size_t want = 0;
    epd__hello_ext_t ext;
    epd__hello_proc_t proc;
    const char *cls;
    epd_status_t st;

    if (f->status == EPD_OK && has_ext) {
        want = sizeof(ext) + proc_len + (their_auth ? EPD__XPORT_KEY_BYTES : 0);
    }
    if (ep->state != EPD__EP_CONNECTING || ep->incoming || f->seq != 1 ||
        (f->flags & ~EPD__FRAME_F_HELLO) != 0 || (their_auth && !has_ext) ||
        (their_proc && !has_ext) || f->len != want || ep->hs_pending == EPD__FRAME_HELLO_FIN) {
        EPD__DROP(x, "dropping unexpected HELLO_ACK from %016llx",
                  (unsigned long long)f->sender_id);
        return;
    }
    if (has_ext) {
        memcpy(&ext, payload, sizeof(ext));
        if (their_proc) {
            memcpy(&proc, payload + sizeof(ext), sizeof(proc));
        }
        if (!epd__worker_id_ok(ext.worker_id, sizeof(ext.worker_id)) || ext.reserved != 0 ||
            (their_proc && proc.reserved != 0)) {
            EPD__DROP(x, "dropping a HELLO_ACK from %016llx: malformed identity block",
                      (unsigned long long)f->sender_id);
            return;
        }
    }
    ep->peer_id = f->sender_id;
    ep->remote_cookie = f->src_cookie;
    ep->rx_seq = f->seq;
    if (has_ext) {
        ep->peer_presented = true;
        epd__ext_to_ident(&ext, &ep->peer_ident);
        if (their_proc) {
            ep->peer_proc_known = true;
            ep->peer_proc = proc;
        }
    }
    if (f->status != EPD_OK) {
        st = f->status == EPD_ERR_CONFIG ? EPD_ERR_CONFIG
             : f->status == EPD_ERR_AUTH ? EPD_ERR_AUTH
                                         : EPD_ERR_UNREACHABLE;
        if (st == EPD_ERR_AUTH) {
            x->stats.handshakes_refused++;
            epd_log_error(EPD__XPORT_COMP, 0, "peer %016llx refused the connection: %s",
                          (unsigned long long)f->sender_id,
                          x->auth ? "it has no cluster secret configured, and this worker "
                                    "authenticates"
                                  : "it requires the cluster secret, which this worker does "
                                    "not have");
        } else {
            epd_log_error(EPD__XPORT_COMP, 0, "peer %016llx refused the connection: %s",
                          (unsigned long long)f->sender_id,
                          epd_status_string((epd_status_t)f->status));
        }
        epd__ep_fail(ep, st);
        return;
    }
    if (x->auth != their_auth) {
        /* an answer against the protocol (a worker with a secret refuses a
         * HELLO without one, and the reverse): not who it should be */
        x->stats.handshakes_refused++;
        epd_log_error(EPD__XPORT_COMP, 0,
                      "peer %016llx (claims worker '%s') accepted the connection %s: not a "
                      "member of this cluster",
                      (unsigned long long)f->sender_id, epd__ep_who(ep),
                      x->auth ? "without authenticating"
                              : "with authentication we did not ask for");
        if (x->auth) {
            (void)epd__frame_send(ep, EPD__FRAME_HELLO_FIN, EPD_ERR_AUTH, NULL, 0);
        } else {
            (void)epd__frame_send(ep, EPD__FRAME_BYE, 0, NULL, 0);
        }
        epd__ep_fail(ep, EPD_ERR_AUTH);
        return;
    }
    if (x->auth) {
        unsigned char t[EPD__XPORT_KEY_BYTES], mac[EPD__XPORT_KEY_BYTES];

        epd__hs_transcript(ep->hs_hash, f, &ext, their_proc ? &proc : NULL, t);
        epd__hs_derive(x, "ack", t, mac);
        if (crypto_verify_32(mac, payload + sizeof(ext) + proc_len) != 0) {
            x->stats.handshakes_refused++;
            sodium_memzero(t, sizeof(t));
            epd_log_error(EPD__XPORT_COMP, 0,
                          "the HELLO_ACK of peer %016llx (claims worker '%s') does not verify "
                          "under this worker's cluster secret: the secrets differ, or it is not "
                          "a member",
                          (unsigned long long)f->sender_id, epd__ep_who(ep));
            /* says so to the acceptor at once (it would wait out its deadline) */
            (void)epd__frame_send(ep, EPD__FRAME_HELLO_FIN, EPD_ERR_AUTH, NULL, 0);
            epd__ep_fail(ep, EPD_ERR_AUTH);
            return;
        }
        epd__hs_derive(x, "fin", t, ep->fin_mac);
        epd__hs_derive(x, "i2a", t, ep->tx_key);
        epd__hs_derive(x, "a2i", t, ep->rx_key);
        sodium_memzero(t, sizeof(t));
    }
    cls = epd__class_ok(ep);
    if (cls != NULL) {
        epd_log_error(EPD__XPORT_COMP, 0,
                      "connect to peer %016llx refused: expected transport class '%s' but %s chose '%s' (%s)",
                      (unsigned long long)f->sender_id, x->expect, x->ops->name, cls, ep->desc);
        if (x->auth) {
            (void)epd__frame_send(ep, EPD__FRAME_HELLO_FIN, EPD_ERR_CONFIG, NULL, 0);
        } else {
            (void)epd__frame_send(ep, EPD__FRAME_BYE, 0, NULL, 0);
        }
        epd__ep_fail(ep, EPD_ERR_CONFIG);
        return;
    }
    if (x->auth) {
        st = epd__fin_send(ep);
        if (st == EPD_ERR_NO_RESOURCE) {
            /* retried by the timers; messages stay held until it is out */
            ep->hs_pending = EPD__FRAME_HELLO_FIN;
            return;
        }
        if (st != EPD_OK) {
            epd__ep_fail(ep, st);
            return;
        }
    }
    epd__ep_connected(ep);
}

/* The initiator's proof (or its refusal of our HELLO_ACK) on a half-open
 * endpoint. */
static void epd__on_fin(epd_xport_t *x, epd_xport_ep_t *ep, const epd__frame_t *f,
                        const unsigned char *payload)
{
    unsigned char mac[EPD__XPORT_KEY_BYTES];

    if (ep->state != EPD__EP_ACCEPTING || f->seq != 2 || ep->peer_id != f->sender_id ||
        ep->remote_cookie != f->src_cookie) {
        EPD__DROP(x, "dropping unexpected HELLO_FIN from %016llx",
                  (unsigned long long)f->sender_id);
        return;
    }
    if (f->status != EPD_OK) {
        if (f->status == EPD_ERR_AUTH) {
            x->stats.handshakes_refused++;
        }
        EPD__LOG_LIMITED_ERR(
            x, "peer %016llx (claims worker '%s') refused our HELLO_ACK: %s",
            (unsigned long long)f->sender_id, epd__ep_who(ep),
            f->status == EPD_ERR_AUTH
                ? "it does not verify under its cluster secret (the secrets differ)"
                : epd_status_string((epd_status_t)f->status));
        epd_xport_ep_close(ep);
        return;
    }
    if (f->flags != EPD__FRAME_F_AUTH || f->len != EPD__XPORT_KEY_BYTES) {
        EPD__DROP(x, "dropping a malformed HELLO_FIN from %016llx",
                  (unsigned long long)f->sender_id);
        return;
    }
    epd__hs_derive(x, "fin", ep->hs_hash, mac);
    if (crypto_verify_32(mac, payload) != 0) {
        x->stats.handshakes_refused++;
        EPD__LOG_LIMITED_ERR(x,
                             "the HELLO_FIN of peer %016llx (claims worker '%s') does not verify "
                             "under this worker's cluster secret: not a member (or forged); "
                             "endpoint closed",
                             (unsigned long long)f->sender_id, epd__ep_who(ep));
        epd_xport_ep_close(ep);
        return;
    }
    epd__hs_derive(x, "a2i", ep->hs_hash, ep->tx_key);
    epd__hs_derive(x, "i2a", ep->hs_hash, ep->rx_key);
    sodium_memzero(ep->hs_hash, sizeof(ep->hs_hash));
    sodium_memzero(ep->nonce, sizeof(ep->nonce));
    x->half_open--;
    ep->rx_seq = f->seq;
    ep->last_rx_ns = epd_time_now_ns();
    ep->state = EPD__EP_CONNECTED;
    ep->handshaken = true;
    ep->authed = true;
    epd_log_info(
        EPD__XPORT_COMP, 0, "accepted peer %016llx (worker '%s', role %d, authenticated): %s",
        (unsigned long long)f->sender_id, epd__ep_who(ep), (int)ep->peer_ident.role, ep->desc);
    if (x->cfg.accept_cb != NULL) {
        x->cfg.accept_cb(x->cfg.cb_arg, ep);
    }
}

int epd__xport_frame_is_msg(const void *data, size_t len, size_t *payload_off_p)
{
    epd__frame_t f;
    size_t hdr_len;

    if (len < sizeof(f)) {
        return 0;
    }
    memcpy(&f, data, sizeof(f));
    hdr_len = sizeof(f) + ((f.flags & EPD__FRAME_F_MAC) != 0 ? EPD__XPORT_TAG_BYTES : 0);
    if (f.magic != EPD__XPORT_MAGIC || f.version != EPD__XPORT_VERSION ||
        f.type != EPD__FRAME_MSG || len < hdr_len || (size_t)f.len != len - hdr_len) {
        return 0;
    }
    *payload_off_p = hdr_len;
    return 1;
}

void epd__xport_deliver(epd_xport_t *x, const void *data, size_t len)
{
    if (x->faults != NULL && epd__xport_faults_rx(x->faults, x, data, len)) {
        return;
    }
    epd__xport_deliver_now(x, data, len);
}

void epd__xport_deliver_now(epd_xport_t *x, const void *data, size_t len)
{
    const unsigned char *bytes = data;
    const unsigned char *payload;
    size_t hdr_len;
    epd__frame_t f;
    epd_xport_ep_t *ep;

    if (x->tap != NULL) {
        x->tap(x->tap_arg, data, len);
    }
    if (len < sizeof(f)) {
        EPD__DROP(x, "dropping a %zu-byte message: shorter than a frame header", len);
        return;
    }
    memcpy(&f, bytes, sizeof(f));
    if (f.magic != EPD__XPORT_MAGIC || f.version != EPD__XPORT_VERSION) {
        EPD__DROP(x, "dropping a message with bad magic/version %08x/%u", f.magic, f.version);
        return;
    }
    hdr_len = sizeof(f) + ((f.flags & EPD__FRAME_F_MAC) != 0 ? EPD__XPORT_TAG_BYTES : 0);
    if (len < hdr_len || (size_t)f.len != len - hdr_len) {
        EPD__DROP(x, "dropping a frame of type %u: header says %u payload bytes, got %zu", f.type,
                  f.len, len - (len < hdr_len ? len : hdr_len));
        return;
    }
    payload = bytes + hdr_len;
    epd__xport_enter(x);
    if (f.type == EPD__FRAME_HELLO || f.type == EPD__FRAME_HELLO_ACK ||
        f.type == EPD__FRAME_HELLO_FIN) {
        if ((f.flags & EPD__FRAME_F_MAC) != 0) {
            EPD__DROP(x, "dropping a handshake frame with a MAC tag from %016llx",
                      (unsigned long long)f.sender_id);
            goto out;
        }
        if (f.type == EPD__FRAME_HELLO) {
            epd__on_hello(x, &f, payload);
            goto out;
        }
    }
    ep = epd__ep_lookup(x, f.dst_cookie);
    if (ep == NULL || (ep->state != EPD__EP_CONNECTING && ep->state != EPD__EP_ACCEPTING &&
                       ep->state != EPD__EP_CONNECTED)) {
        x->stats.frames_dropped++;
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
        epd__on_ack(x, ep, &f, payload);
        goto out;
    }
    if (f.type == EPD__FRAME_HELLO_FIN) {
        epd__on_fin(x, ep, &f, payload);
        goto out;
    }
    if (ep->state != EPD__EP_CONNECTED || ep->peer_id != f.sender_id ||
        ep->remote_cookie != f.src_cookie) {
        EPD__DROP(x, "dropping a frame of type %u from %016llx: %s", f.type,
                  (unsigned long long)f.sender_id, epd_status_string(EPD_ERR_STALE_EPOCH));
        goto out;
    }
    if (ep->authed) {
        unsigned char tag[EPD__XPORT_TAG_BYTES];
        bool has_tag = (f.flags & EPD__FRAME_F_MAC) != 0;

        if (has_tag) {
            epd__frame_tag(ep->rx_key, bytes, payload, f.len, tag);
        }
        if (!has_tag || crypto_verify_16(tag, bytes + sizeof(f)) != 0) {
            /* from the peer's worker id and to this endpoint, yet not under
             * the connection's key: forged, or tampered with on the way */
            x->stats.frames_forged++;
            EPD__LOG_LIMITED_ERR(x,
                                 "frame #%llu of type %u from peer %016llx (worker '%s') %s: "
                                 "failing the endpoint",
                                 (unsigned long long)f.seq, f.type, (unsigned long long)f.sender_id,
                                 epd__ep_who(ep), has_tag ? "fails its MAC" : "carries no MAC");
            epd__ep_fail(ep, EPD_ERR_AUTH);
            goto out;
        }
    } else if ((f.flags & EPD__FRAME_F_MAC) != 0) {
        EPD__DROP(x, "dropping a frame with a MAC tag from %016llx: endpoint not authenticated",
                  (unsigned long long)f.sender_id);
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
            EPD__DROP(x, "dropping a %u-byte message from %016llx: limit is %zu", f.len,
                      (unsigned long long)f.sender_id, x->cfg.max_msg_size);
            break;
        }
        x->cfg.msg_cb(x->cfg.cb_arg, ep, payload, f.len);
        break;
    case EPD__FRAME_KEEPALIVE:
        break;
    case EPD__FRAME_BYE:
        epd_log_debug(EPD__XPORT_COMP, 0, "peer %016llx closed the endpoint",
                      (unsigned long long)f.sender_id);
        epd__ep_fail(ep, EPD_ERR_CONNECTION_RESET);
        break;
    default:
        EPD__DROP(x, "dropping a frame of unknown type %u from %016llx", f.type,
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

static epd_status_t epd__xport_create(const epd__xport_backend_ops_t *ops,
                                      const epd_xport_config_t *config, epd_xport_t **x_p);

epd_status_t epd_xport_create(const epd_xport_config_t *config, epd_xport_t **x_p)
{
    const epd__xport_backend_ops_t *ops = NULL;

    if (config == NULL || x_p == NULL || config->msg_cb == NULL || config->backend == NULL) {
        return EPD_ERR_INVALID_PARAM;
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
    return epd__xport_create(ops, config, x_p);
}

epd_status_t epd__xport_create_ops(const epd__xport_backend_ops_t *ops,
                                   const epd_xport_config_t *config, epd_xport_t **x_p)
{
    if (ops == NULL || config == NULL || x_p == NULL || config->msg_cb == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    return epd__xport_create(ops, config, x_p);
}

static epd_status_t epd__xport_create(const epd__xport_backend_ops_t *ops,
                                      const epd_xport_config_t *config, epd_xport_t **x_p)
{
    epd_xport_t *x;
    epd_status_t st;
    uint32_t n_ops;
    uint64_t step_ms;
    bool ident_set;

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
    if ((config->secret == NULL) != (config->secret_len == 0) ||
        (config->secret != NULL && (config->secret_len < EPD_XPORT_SECRET_MIN ||
                                    config->secret_len > EPD_XPORT_SECRET_MAX))) {
        epd_log_error(EPD__XPORT_COMP, 0,
                      "bad cluster secret: %zu bytes (want none, or %d to %d bytes)",
                      config->secret_len, EPD_XPORT_SECRET_MIN, EPD_XPORT_SECRET_MAX);
        return EPD_ERR_CONFIG;
    }
    if (!epd__worker_id_ok(config->identity.worker_id, sizeof(config->identity.worker_id))) {
        epd_log_error(EPD__XPORT_COMP, 0,
                      "bad worker id in the transport identity: want printable ASCII without "
                      "spaces, at most %d bytes, NUL-terminated",
                      EPD_XPORT_WORKER_ID_MAX);
        return EPD_ERR_CONFIG;
    }
    ident_set = config->identity.worker_id[0] != '\0' || config->identity.role != 0 ||
                config->identity.epoch.start_time_ns != 0 || config->identity.epoch.nonce != 0;
    if (sodium_init() < 0) {
        epd_log_error(EPD__XPORT_COMP, 0, "libsodium cannot start");
        return EPD_ERR_FATAL;
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
    /* strings and the secret are borrowed only for create; keep what is
     * needed later */
    x->cfg.backend = ops->name;
    x->cfg.provider = NULL;
    x->cfg.bind_host = NULL;
    x->cfg.secret = NULL;
    x->cfg.secret_len = 0;
    x->ident_set = ident_set;
    if (config->expect != NULL && strcmp(config->expect, "any") != 0) {
        strcpy(x->expect, config->expect);
    }
    x->cfg.expect = x->expect[0] != '\0' ? x->expect : NULL;
    if (config->secret != NULL) {
        /* K: the secret itself may be long and is never needed again */
        static const unsigned char personal[crypto_generichash_blake2b_PERSONALBYTES] =
            "epd-xport-v1";
        crypto_generichash_blake2b_salt_personal(x->hs_key, sizeof(x->hs_key), config->secret,
                                                 config->secret_len, NULL, 0, NULL, personal);
        x->auth = true;
    }
    if (ident_set || x->auth) {
        /* every HELLO says which process this is (a peer on this host may
         * then watch it end: the fence) */
        if (epd_proc_self(&x->self) == EPD_OK) {
            x->proc.pid = x->self.pid;
            x->proc.start_ticks = x->self.start_ticks;
            x->proc.pidns_dev = x->self.pidns_dev;
            x->proc.pidns_ino = x->self.pidns_ino;
            memcpy(x->proc.boot_id, x->self.boot_id, sizeof(x->proc.boot_id));
            x->proc_set = true;
        }
    } else {
        (void)epd_proc_self(&x->self);
    }
    /* unpredictable: a frame is routed by (worker id, cookies), so an
     * outsider should not know a worker id without seeing its traffic */
    do {
        randombytes_buf(&x->id, sizeof(x->id));
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

    st = epd__xport_faults_create(x->auth, config->identity.worker_id, &x->faults);
    if (st != EPD_OK) {
        goto err_free_pool;
    }
    st = ops->create(x, config, &x->be);
    if (st != EPD_OK) {
        goto err_free_faults;
    }
    *x_p = x;
    return EPD_OK;

err_free_faults:
    epd__xport_faults_destroy(x->faults);
err_free_pool:
    epd_free(x->op_pool);
err_free_x:
    sodium_memzero(x->hs_key, sizeof(x->hs_key));
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
        /* held completions of each go first (epd__ep_release_backend) */
        epd_xport_ep_close(x->eps);
    }
    while (x->mrs != NULL) {
        epd_xport_mr_dereg(x->mrs);
    }
    if (x->faults != NULL) {
        epd__xport_faults_t *f = x->faults;
        x->faults = NULL;
        epd__xport_faults_destroy(f); /* held frames go with it */
    }
    epd__xport_leave(x);
    x->ops->destroy(x->be);
    epd_bufpool_cleanup(&x->held);
    epd_free(x->slots);
    epd_free(x->slot_gen);
    epd_free(x->op_pool);
    sodium_memzero(x->hs_key, sizeof(x->hs_key));
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

void epd__xport_set_tap(epd_xport_t *x, epd__xport_tap_cb_t tap, void *arg)
{
    x->tap = tap;
    x->tap_arg = arg;
}

int epd_xport_authenticating(const epd_xport_t *x)
{
    return x->auth ? 1 : 0;
}

void epd_xport_stats(const epd_xport_t *x, epd_xport_stats_t *stats_p)
{
    *stats_p = x->stats;
    stats_p->grants_held = x->grants_held;
    stats_p->writes_limbo = x->ops->limbo(x->be, 0);
}

uint32_t epd_xport_limbo(const epd_xport_t *x, uint64_t peer_xid)
{
    return x->ops->limbo(x->be, peer_xid);
}

uint64_t epd__xport_ep_peer(const epd_xport_ep_t *core_ep)
{
    return core_ep->peer_id;
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
    if (x->auth) {
        randombytes_buf(ep->nonce, sizeof(ep->nonce));
    }
    st = epd__hello_send(ep);
    if (st != EPD_OK && st != EPD_ERR_NO_RESOURCE) {
        ep->conn_cb = NULL;
        epd_xport_ep_close(ep);
        return st;
    }
    /* backpressure on a fresh endpoint: the timers retry the HELLO until
     * the connect deadline (callbacks only ever run from progress) */
    ep->hs_pending = st == EPD_ERR_NO_RESOURCE ? EPD__FRAME_HELLO : 0;
    *ep_p = ep;
    return EPD_INPROGRESS;
}

static void epd__ep_free(epd_xport_ep_t *ep)
{
    /* nonces, transcript and direction keys go with it */
    sodium_memzero(ep, sizeof(*ep));
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
    if (ep->state == EPD__EP_ACCEPTING) {
        x->half_open--;
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

epd_status_t epd_xport_ep_identity(const epd_xport_ep_t *ep, epd_xport_identity_t *id_p,
                                   int *authenticated_p)
{
    if (ep == NULL || id_p == NULL || authenticated_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (!ep->handshaken) {
        return EPD_INPROGRESS;
    }
    if (ep->peer_presented) {
        *id_p = ep->peer_ident;
    } else {
        memset(id_p, 0, sizeof(*id_p));
    }
    *authenticated_p = ep->authed ? 1 : 0;
    return EPD_OK;
}

epd_status_t epd_xport_ep_peer_proc(const epd_xport_ep_t *ep, epd_proc_id_t *proc_p)
{
    if (ep == NULL || proc_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (!ep->handshaken || !ep->peer_proc_known) {
        return EPD_ERR_NOT_FOUND;
    }
    memset(proc_p, 0, sizeof(*proc_p));
    proc_p->pid = ep->peer_proc.pid;
    proc_p->start_ticks = ep->peer_proc.start_ticks;
    proc_p->pidns_dev = ep->peer_proc.pidns_dev;
    proc_p->pidns_ino = ep->peer_proc.pidns_ino;
    memcpy(proc_p->boot_id, ep->peer_proc.boot_id, sizeof(proc_p->boot_id));
    return EPD_OK;
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

const char *epd_xport_ep_class(epd_xport_ep_t *ep)
{
    const char *cls = "other";

    if (ep == NULL || ep->be_ep == NULL) {
        return "";
    }
    ep->x->ops->ep_describe(ep->be_ep, ep->desc, sizeof(ep->desc), &cls);
    return cls;
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
        (!fenced || (ep->wr_head == NULL &&
                     (ep->flushed_seq >= ep->wr_seq || ep->nd_seq <= ep->flushed_seq)))) {
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

epd_status_t epd_xport_mr_alloc_ex(epd_xport_t *x, size_t size, unsigned access,
                                   epd_xport_mr_t **mr_p)
{
    void *addr, *be_mr;
    epd_status_t st;

    if (size == 0 || mr_p == NULL || (access & ~EPD_XPORT_MR_REMOTE_WRITE) != 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    st = x->ops->mr_alloc(x->be, size, access, &addr, &be_mr);
    if (st != EPD_OK) {
        return st;
    }
    st = epd__mr_wrap(x, be_mr, addr, size, mr_p);
    if (st == EPD_OK) {
        (*mr_p)->access = access;
    }
    return st;
}

epd_status_t epd_xport_mr_reg_ex(epd_xport_t *x, void *addr, size_t size, unsigned access,
                                 epd_xport_mr_t **mr_p)
{
    void *be_mr;
    epd_status_t st;

    if (addr == NULL || size == 0 || mr_p == NULL || (access & ~EPD_XPORT_MR_REMOTE_WRITE) != 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    st = x->ops->mr_reg(x->be, addr, size, access, &be_mr);
    if (st != EPD_OK) {
        return st;
    }
    st = epd__mr_wrap(x, be_mr, addr, size, mr_p);
    if (st == EPD_OK) {
        (*mr_p)->access = access;
    }
    return st;
}

epd_status_t epd_xport_mr_alloc(epd_xport_t *x, size_t size, epd_xport_mr_t **mr_p)
{
    return epd_xport_mr_alloc_ex(x, size, EPD_XPORT_MR_REMOTE_WRITE, mr_p);
}

epd_status_t epd_xport_mr_reg(epd_xport_t *x, void *addr, size_t size, epd_xport_mr_t **mr_p)
{
    return epd_xport_mr_reg_ex(x, addr, size, EPD_XPORT_MR_REMOTE_WRITE, mr_p);
}

void epd_xport_mr_dereg(epd_xport_mr_t *mr)
{
    epd_xport_t *x;

    if (mr == NULL) {
        return;
    }
    x = mr->x;
    while (mr->grants != NULL) {
        epd_xport_grant_close(mr->grants);
    }
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
    if (buf == NULL || len_p == NULL || (mr->access & EPD_XPORT_MR_REMOTE_WRITE) == 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    return mr->x->ops->mr_pack(mr->x->be, mr->be_mr, buf, cap, len_p);
}

/* ------------------------------------------------------------- the fence */

void epd_xport_mr_set_check(epd_xport_mr_t *mr, epd_xport_write_check_cb_t cb, void *arg)
{
    mr->check = cb;
    mr->check_arg = arg;
}

epd_status_t epd_xport_grant_open(epd_xport_mr_t *mr, void *user, epd_xport_grant_t **g_p)
{
    epd_xport_t *x;
    epd_xport_grant_t *g;
    epd_status_t st;

    if (mr == NULL || g_p == NULL || (mr->access & EPD_XPORT_MR_REMOTE_WRITE) == 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    x = mr->x;
    g = epd_calloc(1, sizeof(*g));
    if (g == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    g->mr = mr;
    g->user = user;
    g->pidfd = -1;
    st = x->ops->grant_open(x->be, mr->be_mr, g, &g->be_grant);
    if (st != EPD_OK) {
        epd_free(g);
        return st;
    }
    g->next = mr->grants;
    if (mr->grants != NULL) {
        mr->grants->prev = g;
    }
    mr->grants = g;
    *g_p = g;
    return EPD_OK;
}

epd_status_t epd_xport_grant_pack(epd_xport_grant_t *g, void *buf, size_t cap, size_t *len_p)
{
    epd_xport_t *x;

    if (g == NULL || buf == NULL || len_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    x = g->mr->x;
    return x->ops->grant_pack(x->be, g->be_grant, buf, cap, len_p);
}

static void epd__grant_settle(epd_xport_grant_t *g, const char *why)
{
    epd_xport_t *x = g->mr->x;

    if (g->state == EPD__GRANT_HELD) {
        x->grants_held--;
    }
    g->state = EPD__GRANT_SETTLED;
    g->why = why;
    if (g->pidfd >= 0) {
        close(g->pidfd);
        g->pidfd = -1;
    }
}

void epd_xport_grant_bind(epd_xport_grant_t *g, const epd_xport_ep_t *ep)
{
    if (g == NULL || g->proc_known || ep == NULL || !ep->handshaken || !ep->peer_proc_known) {
        return;
    }
    g->proc_known = true;
    g->proc.pid = ep->peer_proc.pid;
    g->proc.start_ticks = ep->peer_proc.start_ticks;
    g->proc.pidns_dev = ep->peer_proc.pidns_dev;
    g->proc.pidns_ino = ep->peer_proc.pidns_ino;
    memcpy(g->proc.boot_id, ep->peer_proc.boot_id, sizeof(g->proc.boot_id));
}

void epd_xport_grant_revoke(epd_xport_grant_t *g, const epd_xport_ep_t *ep)
{
    epd_xport_t *x;
    int same_host = 1;
    epd_status_t st;

    if (g == NULL) {
        return;
    }
    x = g->mr->x;
    epd_xport_grant_bind(g, ep);
    if (g->state != EPD__GRANT_OPEN) {
        return;
    }
    if (g->proc_known) {
        /* another boot or pid namespace: not this host's process (a pid
         * of ours would name someone else) */
        same_host = epd_proc_same_host(&g->proc, &x->self);
    }
    st = x->ops->grant_revoke(x->be, g->be_grant, same_host);
    if (st == EPD_OK) {
        g->state = EPD__GRANT_REVOKED;
        return;
    }
    /* bytes may still land without a check: only the writer's end proves
     * nothing more will — watch its process when it runs on this host */
    g->state = EPD__GRANT_HELD;
    x->grants_held++;
    if (g->proc_known && same_host && epd_proc_watch(&g->proc, &g->pidfd) == EPD_ERR_NOT_FOUND) {
        epd__grant_settle(g, "the writer's process ended");
    }
}

int epd_xport_grant_settled(epd_xport_grant_t *g)
{
    epd_xport_t *x;

    if (g == NULL) {
        return 1;
    }
    x = g->mr->x;
    switch (g->state) {
    case EPD__GRANT_REVOKED:
        if (x->ops->grant_settled(x->be, g->be_grant)) {
            epd__grant_settle(g, "revoked");
        }
        break;
    case EPD__GRANT_HELD:
        if (g->proc_known && epd_proc_same_host(&g->proc, &x->self) &&
            epd_proc_gone(&g->proc, g->pidfd)) {
            epd__grant_settle(g, "the writer's process ended");
        }
        break;
    default:
        break;
    }
    return g->state == EPD__GRANT_SETTLED;
}

const char *epd_xport_grant_state(const epd_xport_grant_t *g)
{
    switch (g->state) {
    case EPD__GRANT_OPEN:
        return "open";
    case EPD__GRANT_REVOKED:
        return "revoked, receives in flight";
    case EPD__GRANT_HELD:
        return g->proc_known ? "held: the writer may still write without a check until its "
                               "process ends or it confirms"
                             : "held: the writer may still write without a check until it "
                               "confirms";
    default:
        return g->why != NULL ? g->why : "settled";
    }
}

void epd_xport_grant_close(epd_xport_grant_t *g)
{
    epd_xport_mr_t *mr;
    epd_xport_t *x;

    if (g == NULL) {
        return;
    }
    mr = g->mr;
    x = mr->x;
    if (g->state == EPD__GRANT_HELD) {
        x->grants_held--;
    }
    if (g->pidfd >= 0) {
        close(g->pidfd);
    }
    if (g->prev != NULL) {
        g->prev->next = g->next;
    } else {
        mr->grants = g->next;
    }
    if (g->next != NULL) {
        g->next->prev = g->prev;
    }
    x->ops->grant_close(x->be, g->be_grant);
    epd_free(g);
}

int epd__xport_grant_write(epd_xport_grant_t *g, uint64_t offset, uint64_t len)
{
    epd_xport_mr_t *mr = g->mr;
    epd_xport_t *x = mr->x;

    if (g->state != EPD__GRANT_OPEN) {
        /* a retired writer's late write: the fence */
        x->stats.writes_refused_late++;
        EPD__LOG_LIMITED(x,
                         "refusing a late write of %llu bytes at offset %llu: its grant was "
                         "revoked (%llu refused so far)",
                         (unsigned long long)len, (unsigned long long)offset,
                         (unsigned long long)x->stats.writes_refused_late);
        return 0;
    }
    if (mr->check != NULL && !mr->check(mr->check_arg, g->user, offset, len)) {
        x->stats.writes_refused_range++;
        EPD__LOG_LIMITED(x,
                         "refusing a write of %llu bytes at offset %llu: outside what its "
                         "grant allows now (%llu refused so far)",
                         (unsigned long long)len, (unsigned long long)offset,
                         (unsigned long long)x->stats.writes_refused_range);
        return 0;
    }
    return 1;
}

epd_status_t epd__xport_mr_pack_any(epd_xport_mr_t *mr, void *buf, size_t cap, size_t *len_p)
{
    if (mr == NULL || buf == NULL || len_p == NULL) {
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
    if (x->faults != NULL && epd__xport_faults_write(x->faults, local, len, &op->fault_copy)) {
        local = op->fault_copy; /* unregistered: the backend copes (UCX and libfabric here) */
        local_mr = NULL;
    }
    st = x->ops->write(ep->be_ep, local, len, local_mr != NULL ? local_mr->be_mr : NULL,
                       rkey->be_rkey, remote_offset, &op->be);
    if (st != EPD_INPROGRESS) {
        epd_free(op->fault_copy);
        op->fault_copy = NULL;
        epd__op_put(x, op);
        if (st == EPD_OK) {
            st = EPD_ERR_FATAL; /* contract: a backend never completes a write inline */
        } else if (st != EPD_ERR_NO_RESOURCE && epd_status_scope(st) >= EPD_SCOPE_CONNECTION) {
            epd__ep_fail(ep, st);
        }
        return st;
    }
    ep->wr_seq++;
    if (!op->be.delivers) {
        ep->nd_seq = ep->wr_seq; /* a fence behind it flushes */
    }
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
        if (ep->state == EPD__EP_CONNECTING && ep->hs_pending != 0 && now < ep->deadline_ns) {
            if (ep->hs_pending == EPD__FRAME_HELLO) {
                if (epd__hello_send(ep) == EPD_OK) {
                    ep->hs_pending = 0;
                }
            } else if (epd__fin_send(ep) == EPD_OK) {
                epd__ep_connected(ep);
                n++;
            }
        } else if (ep->state == EPD__EP_ACCEPTING && now >= ep->deadline_ns) {
            EPD__LOG_LIMITED(x,
                             "peer %016llx (claims worker '%s') did not finish the handshake "
                             "within %u ms: half-open endpoint closed",
                             (unsigned long long)ep->peer_id, epd__ep_who(ep),
                             x->cfg.connect_timeout_ms);
            epd_xport_ep_close(ep);
            n++;
        } else if (ep->state == EPD__EP_CONNECTING && now >= ep->deadline_ns) {
            epd_log_warn(EPD__XPORT_COMP, 0, "connect timed out after %u ms (nobody answered%s)",
                         x->cfg.connect_timeout_ms,
                         x->auth ? "; a worker with another cluster secret, or none, does not "
                                   "answer either"
                                 : "");
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
    if (x->faults != NULL) {
        n += epd__xport_faults_tick(x->faults, x, now);
    }
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
    if (x->pump != NULL || (x->faults != NULL && epd__xport_faults_pending(x->faults))) {
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
