/*
 * epd_xport_core.h — the core's private objects and the calls between its
 * files (transport/ only; backends include epd_xport_int.h, users
 * epd_xport.h).  The core's files, from the bottom up, each calling only
 * those below it:
 *   epd_xport_util.c, epd_xport_crypto.c   bookkeeping; the cryptography
 *   epd_xport_frame.c                      the frame codec (send side)
 *   epd_xport_ep.c                         endpoints, failure, the pump
 *   epd_xport_hello.c                      the handshake
 *   epd_xport_recv.c                       the receive path
 *   epd_xport_mr.c, epd_xport_write.c      regions, keys, grants; writes
 *   epd_xport_progress.c, epd_xport.c      progress; lifecycle
 * Fault injection is no part of the core: it is an interposer over the
 * backend (epd_xport_faults.c; epd_xport_int.h "Interposers").
 *
 * What the core does:
 *
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
#ifndef EPD_XPORT_CORE_H
#define EPD_XPORT_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "epd_bufpool.h"
#include "epd_list.h"
#include "epd_log.h"
#include "epd_proc.h"
#include "epd_xport_int.h"

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
    const epd__xport_hook_t *hook; /* an interposer's upcall hook (NULL: none, the normal case) */
    void *hook_ip;
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

#define EPD__LOG_LIMITED(x, ...)                                                                   \
    do {                                                                                           \
        if (epd__xport_log_allowed(x)) {                                                           \
            epd_log_warn(EPD__XPORT_COMP, 0, __VA_ARGS__);                                         \
        }                                                                                          \
    } while (0)

/* Errors caused by what a peer sent (a failed handshake, a forged frame):
 * anyone who can reach the worker can make them, so they are rate-limited
 * like the drops. */
#define EPD__LOG_LIMITED_ERR(x, ...)                                                               \
    do {                                                                                           \
        if (epd__xport_log_allowed(x)) {                                                           \
            epd_log_error(EPD__XPORT_COMP, 0, __VA_ARGS__);                                        \
        }                                                                                          \
    } while (0)

/* A dropped frame: counted, logged (rate-limited). */
#define EPD__DROP(x, ...)                                                                          \
    do {                                                                                           \
        (x)->stats.frames_dropped++;                                                               \
        EPD__LOG_LIMITED((x), __VA_ARGS__);                                                        \
    } while (0)

/* epd_xport_util.c */
bool epd__xport_log_allowed(epd_xport_t *x);
void epd__xport_enter(epd_xport_t *x);
void epd__xport_leave(epd_xport_t *x);
epd_xport_ep_t *epd__xport_ep_lookup(epd_xport_t *x, uint64_t cookie);
epd_status_t epd__xport_slot_alloc(epd_xport_t *x, epd_xport_ep_t *ep);
void epd__xport_slot_release(epd_xport_t *x, epd_xport_ep_t *ep);
epd__core_op_t *epd__xport_op_get(epd_xport_t *x, bool user);
void epd__xport_op_put(epd_xport_t *x, epd__core_op_t *op);
epd__held_t *epd__xport_held_get(epd_xport_t *x, size_t len);
void epd__xport_held_put(epd_xport_t *x, epd__held_t *h);
const char *epd__xport_ep_who(const epd_xport_ep_t *ep);

/* epd_xport_crypto.c */
void epd__xport_frame_tag(const unsigned char key[EPD__XPORT_KEY_BYTES], const void *hdr,
                          const void *payload, size_t len, unsigned char tag[EPD__XPORT_TAG_BYTES]);
void epd__xport_hs_h1(const void *hdr, const void *payload, size_t len,
                      unsigned char h1[EPD__XPORT_KEY_BYTES]);
void epd__xport_hs_transcript(const unsigned char h1[EPD__XPORT_KEY_BYTES], const void *ack_hdr,
                              const epd__hello_ext_t *ack_ext, const epd__hello_proc_t *ack_proc,
                              unsigned char t[EPD__XPORT_KEY_BYTES]);
void epd__xport_hs_derive(const epd_xport_t *x, const char label[4],
                          const unsigned char t[EPD__XPORT_KEY_BYTES],
                          unsigned char out[EPD__XPORT_KEY_BYTES]);
void epd__xport_hello_mac(const epd_xport_t *x, const void *hdr, const void *payload, size_t len,
                          unsigned char out[EPD__XPORT_KEY_BYTES]);
bool epd__xport_worker_id_ok(const char *id, size_t cap);
void epd__xport_ext_fill(const epd_xport_t *x, const unsigned char nonce[EPD__XPORT_NONCE_BYTES],
                         epd__hello_ext_t *ext);
void epd__xport_ext_to_ident(const epd__hello_ext_t *ext, epd_xport_identity_t *id);

/* epd_xport_frame.c */
void epd__xport_frame_hdr(const epd_xport_ep_t *ep, int type, int32_t status, unsigned flags,
                          size_t len, epd__frame_t *f);
epd_status_t epd__xport_frame_send_hdr(epd_xport_ep_t *ep, epd__frame_t *f, const void *payload,
                                       size_t len);
epd_status_t epd__xport_frame_send(epd_xport_ep_t *ep, int type, int32_t status,
                                   const void *payload, size_t len);

/* epd_xport_ep.c */
void epd__xport_ep_release_backend(epd_xport_ep_t *ep);
void epd__xport_ep_fail(epd_xport_ep_t *ep, epd_status_t status);
void epd__xport_pump_schedule(epd_xport_ep_t *ep);
bool epd__xport_ep_pump(epd_xport_ep_t *ep);
int epd__xport_pump_all(epd_xport_t *x);
const char *epd__xport_class_ok(epd_xport_ep_t *ep);
epd_status_t epd__xport_ep_new(epd_xport_t *x, const void *blob, size_t len, epd_xport_ep_t **ep_p);
epd_status_t epd__xport_ep_usable(const epd_xport_ep_t *ep);

/* epd_xport_hello.c */
epd_status_t epd__xport_hello_send(epd_xport_ep_t *ep);
epd_status_t epd__xport_fin_send(epd_xport_ep_t *ep);
void epd__xport_ep_connected(epd_xport_ep_t *ep);
void epd__xport_on_hello(epd_xport_t *x, const epd__frame_t *f, const unsigned char *payload);
void epd__xport_on_ack(epd_xport_t *x, epd_xport_ep_t *ep, const epd__frame_t *f,
                       const unsigned char *payload);
void epd__xport_on_fin(epd_xport_t *x, epd_xport_ep_t *ep, const epd__frame_t *f,
                       const unsigned char *payload);

#endif
