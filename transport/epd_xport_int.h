/*
 * epd_xport_int.h — what a transport backend implements, and what the core
 * offers it.  Not for users of transport/ (they include epd_xport.h).
 *
 * The core (transport/epd_xport*.c) owns every object the user sees and does
 * everything that is the same on every library: the handshake (HELLO /
 * HELLO_ACK carrying worker ids and address blobs, so each side has an
 * endpoint to the other; with a cluster secret also identities, nonces,
 * MACs and a HELLO_FIN), the MAC of every later frame, keepalives and the
 * peer-silence timeout, fences,
 * the bound on operations in flight, range checks, message framing.  A
 * backend only moves bytes:
 *
 *   - `send`: a framed message (bytes copied before return), delivered on the
 *     peer by calling epd__xport_deliver(core, bytes, len) from its progress.
 *     Messages on one backend endpoint must arrive in order.  The core puts
 *     the sender's id in the frame, so a backend needs no reply endpoint.
 *     A frame is at most epd__xport_frame_cap(config->max_msg_size) bytes.
 *   - `write`: local bytes into a peer's region at an offset; completion
 *     through epd__xport_op_done(op, status) from progress.  Whether it is an
 *     RMA put or a rendezvous message received into the region is the
 *     backend's choice; a receiving backend validates (region known, range
 *     inside it) before letting anything land.  A backend whose completion
 *     of a write already implies delivery says so per write (op->delivers):
 *     a fence behind such writes then skips the flush.
 *   - `flush`: epd__xport_op_done(op, ...) once every write posted earlier on
 *     that endpoint has landed remotely.
 *
 * Every backend call runs on the owning thread.  A backend reports an
 * endpoint failure with epd__xport_ep_failed(core_ep, status), and must
 * complete every op it holds for an endpoint (with an error) before its
 * ep_destroy returns.  Op tables have no NULL slots.
 */
#ifndef EPD_XPORT_INT_H
#define EPD_XPORT_INT_H

#include "epd_xport.h"

/* An asynchronous operation (write or flush) handed to a backend.  Owned by
 * the core; the backend keeps the pointer until it calls epd__xport_op_done
 * exactly once.  `be_priv` is scratch space for the backend (e.g. a
 * ucs_status_ptr_t or a struct fi_context2 must fit in 64 bytes). */
typedef struct epd__xport_op {
    _Alignas(16) unsigned char be_priv[64];
    /* Set by the backend's `write` when it posts (the core zeroes it): 1
     * when this write's completion with EPD_OK means its bytes are in the
     * peer's memory already (a put copied into memory the peer maps, a
     * delivery-complete write), so that a fence behind it needs no flush. */
    unsigned char delivers;
    /* Scratch space for an interposer (see "Interposers" below), zeroed with
     * be_priv before each post: the faults keep which of their endpoints
     * posted a write, and a corrupted copy of its bytes. */
    void *ip_priv[2];
    /* core-private fields follow in epd_xport_core.h's container */
} epd__xport_op_t;

/* Bytes the core puts in front of a payload (48-byte header, then a 16-byte
 * MAC tag on authenticated endpoints), and the largest payload of the
 * core's own frames (a HELLO: identity block, nonce, address blob). */
#define EPD__XPORT_FRAME_ROOM 64
#define EPD__XPORT_CTRL_MAX                                                                        \
    (320 + EPD_XPORT_ADDR_MAX) /* identity, process block, nonce, address                          \
                                */

/* Largest frame a backend must carry for a config's max_msg_size. */
static inline size_t epd__xport_frame_cap(size_t max_msg_size)
{
    return EPD__XPORT_FRAME_ROOM +
           (max_msg_size > EPD__XPORT_CTRL_MAX ? max_msg_size : EPD__XPORT_CTRL_MAX);
}

typedef struct {
    size_t size; /* sizeof(epd__xport_backend_ops_t), checked by the core */
    const char *name;

    /* Starts the library (context + worker) for `config`.  `core` is the
     * opaque handle for upcalls.  Logs what the library offers.  Writes the
     * backend's state to *be_p. */
    epd_status_t (*create)(epd_xport_t *core, const epd_xport_config_t *config, void **be_p);
    void (*destroy)(void *be);
    /* Borrowed address blob of this worker (valid until destroy). */
    epd_status_t (*address)(void *be, const void **blob_p, size_t *len_p);
    void (*describe)(void *be, char *buf, size_t len);

    /* Creates a backend endpoint from a peer's address blob (validated:
     * EPD_ERR_BAD_ADDRESS).  Non-blocking; the core runs the handshake over
     * it.  `core_ep` is the handle for epd__xport_ep_failed. */
    epd_status_t (*ep_create)(void *be, const void *blob, size_t len, epd_xport_ep_t *core_ep,
                              void **be_ep_p);
    /* Completes every op still held for the endpoint with EPD_ERR_CANCELED
     * (calling epd__xport_op_done), then releases it. */
    void (*ep_destroy)(void *be_ep);
    /* Lanes chosen for the endpoint, one line, and their class for the
     * `expect` check: "shm", "tcp", "rdma" or "other". */
    void (*ep_describe)(void *be_ep, char *buf, size_t len, const char **class_p);

    /* Sends hdr[0..hdr_len) followed by payload[0..len) as one message
     * (both copied before return).  EPD_OK, EPD_ERR_NO_RESOURCE, or an
     * error of the endpoint. */
    epd_status_t (*send)(void *be_ep, const void *hdr, size_t hdr_len, const void *payload,
                         size_t len);
    /* Posts a write; EPD_INPROGRESS (op completes later), EPD_ERR_NO_RESOURCE
     * (nothing posted), or an error (nothing posted, op not completed). */
    epd_status_t (*write)(void *be_ep, const void *local, size_t len, void *be_local_mr,
                          void *be_rkey, uint64_t remote_offset, epd__xport_op_t *op);
    epd_status_t (*flush)(void *be_ep, epd__xport_op_t *op);

    /* Memory.  mr_alloc returns zeroed memory at *addr_p.  `access` is
     * EPD_XPORT_MR_REMOTE_WRITE (peers may write into the region and do
     * nothing else: no remote read, ever) or EPD_XPORT_MR_LOCAL (only a
     * source of this worker's writes: no remote access at all, and a write
     * that names it anyway is refused on arrival).  Keys that name a region
     * must not be guessable (random, or chosen by the provider). */
    epd_status_t (*mr_alloc)(void *be, size_t size, unsigned access, void **addr_p, void **be_mr_p);
    epd_status_t (*mr_reg)(void *be, void *addr, size_t size, unsigned access, void **be_mr_p);
    void (*mr_dereg)(void *be, void *be_mr);
    /* Packs what a peer needs to write into the region (key, base address,
     * size, region id, ...) into buf[0..cap).  The core calls it for
     * EPD_XPORT_MR_REMOTE_WRITE regions only (tests call it for any region,
     * through epd__xport_mr_pack_any: a backend may refuse a local one with
     * EPD_ERR_UNSUPPORTED when it has no key at all). */
    epd_status_t (*mr_pack)(void *be, void *be_mr, void *buf, size_t cap, size_t *len_p);
    /* Unpacks (validated: EPD_ERR_BAD_RKEY) for use on be_ep; *size_p gets
     * the remote region's size. */
    epd_status_t (*rkey_unpack)(void *be_ep, const void *blob, size_t len, void **be_rkey_p,
                                size_t *size_p);
    void (*rkey_destroy)(void *be_rkey);

    /* Grants (epd_xport.h "The fence").  grant_open makes the backend's
     * half of `core_grant` on region be_mr: a key of its own (a random id
     * an active-message write names, or a registration of its own).
     * Writes that reach a check of the backend's under it call
     * epd__xport_grant_write first.  grant_revoke: EPD_OK when, once
     * grant_settled says so, nothing under the grant can land any more;
     * EPD_ERR_UNSUPPORTED when a write may still land without any check
     * (`writer_same_host`: the writer runs on this host, or nobody knows —
     * it could map the region).  grant_close frees it (revoked first). */
    epd_status_t (*grant_open)(void *be, void *be_mr, epd_xport_grant_t *core_grant,
                               void **be_grant_p);
    epd_status_t (*grant_pack)(void *be, void *be_grant, void *buf, size_t cap, size_t *len_p);
    epd_status_t (*grant_revoke)(void *be, void *be_grant, int writer_same_host);
    int (*grant_settled)(void *be, void *be_grant);
    void (*grant_close)(void *be, void *be_grant);
    /* Ops given back by ep_destroy that the library still holds (their
     * bytes may still move), towards peer `peer_xid` (0: all). */
    uint32_t (*limbo)(void *be, uint64_t peer_xid);

    /* Bounded batch of progress; returns events handled. */
    int (*progress)(void *be);
    epd_status_t (*get_fd)(void *be, int *fd_p);
    epd_status_t (*arm)(void *be);
} epd__xport_backend_ops_t;

/* Upcalls, backend -> core, on the owning thread. */

/* A message arrived (bytes borrowed for the call). */
void epd__xport_deliver(epd_xport_t *core, const void *data, size_t len);
/* An operation finished. */
void epd__xport_op_done(epd__xport_op_t *op, epd_status_t status);
/* The library reported an endpoint failure. */
void epd__xport_ep_failed(epd_xport_ep_t *core_ep, epd_status_t status);
/* A write under `g` reached the backend's check (offset and length inside
 * the region): 1 to let it land, 0 to drop it (counted).  May run inside
 * the library's progress. */
int epd__xport_grant_write(epd_xport_grant_t *g, uint64_t offset, uint64_t len);
/* The transport id of core_ep's peer (0 before its handshake). */
uint64_t epd__xport_ep_peer(const epd_xport_ep_t *core_ep);
/* Marks traffic from the peer of core_ep (resets its silence timer); the
 * core calls it itself for every delivered message, a backend may call it
 * for other signs of life. */
void epd__xport_ep_alive(epd_xport_ep_t *core_ep);

/* Interposers.  An interposer is a backend that wraps the backend below it
 * (as libfabric's hook providers wrap a provider): the core calls its ops
 * table, it calls the one below, and on the way it may watch or change
 * what passes.  Downcalls it sees as its ops; the upcalls of the backend
 * below (frames delivered, ops done) through a hook it sets on the core,
 * which calls the hook first.  Each interposer is armed by its own switch
 * at epd_xport_create (faults: EPD_XPORT_FAULTS, epd_xport_faults.h);
 * unarmed it is not in the stack at all, so the core then calls the
 * backend directly.  A tracing interposer would be the same shape: pass
 * every op through, log it with its timing, and see frames and
 * completions through the hook. */
typedef struct {
    /* A frame reached epd__xport_deliver: 1 when the interposer took it
     * (it hands it on later, or never, through epd__xport_deliver_now), 0
     * to let the core have it now. */
    int (*deliver)(void *ip, const void *data, size_t len);
    /* An op completed with *status_p: 1 when the interposer holds the
     * completion (it completes it later through epd__xport_op_done_now),
     * 0 to complete it now (*status_p may have been changed). */
    int (*op_done)(void *ip, epd__xport_op_t *op, epd_status_t *status_p);
} epd__xport_hook_t;

typedef struct {
    const char *name;
    /* Called right after the backend (inner, inner_be) was created.  Not
     * armed: *ip_p = NULL (EPD_OK).  Armed: *ops_p and *ip_p replace them
     * for every later call of the core (its destroy destroys the inner
     * backend too).  EPD_ERR_CONFIG (logged) when its switch is malformed. */
    epd_status_t (*wrap)(epd_xport_t *core, const epd_xport_config_t *config,
                         const epd__xport_backend_ops_t *inner, void *inner_be,
                         const epd__xport_backend_ops_t **ops_p, void **ip_p);
} epd__xport_interposer_t;

/* Upcalls for interposers. */

/* Routes the upcalls of the backend below through `hook` (one per
 * transport; `ip` is handed to it). */
void epd__xport_set_hook(epd_xport_t *core, const epd__xport_hook_t *hook, void *ip);
/* epd__xport_deliver and epd__xport_op_done without the hook. */
void epd__xport_deliver_now(epd_xport_t *core, const void *data, size_t len);
void epd__xport_op_done_now(epd__xport_op_t *op, epd_status_t status);
/* 1 when data[0..len) is a well-formed MSG frame; *payload_off_p gets where
 * its payload starts (after header and tag). */
int epd__xport_frame_is_msg(const void *data, size_t len, size_t *payload_off_p);
/* 1 while core_ep is connected and its backend endpoint is not being
 * destroyed (an interposer may then hold one of its completions). */
int epd__xport_ep_live(const epd_xport_ep_t *core_ep);

/* For tests and fuzzers only. */

/* epd_xport_create with a backend that is not in the core's table (an
 * in-process loopback, for deterministic tests of the core). */
epd_status_t epd__xport_create_ops(const epd__xport_backend_ops_t *ops,
                                   const epd_xport_config_t *config, epd_xport_t **x_p);

/* Calls `tap(arg, frame, len)` with every frame handed to
 * epd__xport_deliver on `x`, before the core looks at it (NULL: off) — lets a
 * test capture real frames to tamper with or replay. */
typedef void (*epd__xport_tap_cb_t)(void *arg, const void *frame, size_t len);
void epd__xport_set_tap(epd_xport_t *x, epd__xport_tap_cb_t tap, void *arg);

/* The backend's packed key of any region, EPD_XPORT_MR_LOCAL ones included:
 * what an attacker who learned (or guessed) a source region's key would
 * hold; epd_xport_mr_pack refuses those. */
epd_status_t epd__xport_mr_pack_any(epd_xport_mr_t *mr, void *buf, size_t cap, size_t *len_p);

/* The backends, each compiled in unless switched off (EPD_WITH_UCX=0 /
 * EPD_WITH_OFI=0). */
#if EPD_WITH_UCX
extern const epd__xport_backend_ops_t epd__xport_ucx_ops;
#endif
#if EPD_WITH_OFI
extern const epd__xport_backend_ops_t epd__xport_ofi_ops;
#endif

/* The interposers, innermost first, each armed by its own switch. */
extern const epd__xport_interposer_t epd__xport_faults_interposer;
#define EPD__XPORT_INTERPOSERS &epd__xport_faults_interposer,

#endif
