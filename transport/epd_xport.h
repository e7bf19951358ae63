/*
 * epd_xport.h — the data plane and request plane of epd: one interface, two
 * backends (UCX ucp, libfabric RDM), chosen at start-up by name.
 *
 * What it moves:
 *   - one-sided writes: a local buffer into a peer's registered region at an
 *     offset (KV blocks, recurrent states, embeddings).  The backend picks the
 *     fastest protocol its lanes offer: true RMA where the target memory
 *     allows it (UCX shared memory on UCX-allocated regions), rendezvous
 *     messages received straight into the region where RMA would be emulated
 *     or slow (UCX over tcp);
 *   - small messages delivered to a handler on the peer (protobuf messages of
 *     the request plane: dispatch, reservations, completions, token chunks,
 *     aborts), in order per endpoint;
 *   - a fence: a message sent with EPD_XPORT_SEND_FENCE is delivered only
 *     after every earlier write on that endpoint has landed in the peer's
 *     memory ("KV done" never overtakes the KV).
 *
 * Layers: a backend-independent core (transport/epd_xport*.c: handshake,
 * keepalive and peer timeout, fences, in-flight accounting, validation) over
 * a backend ops table (transport/epd_xport_int.h, backends in transport/ucx
 * and transport/ofi).  Core code never compares backend names.
 *
 * Threads: an epd_xport_t and everything made from it (endpoints, regions,
 * remote keys) belong to ONE thread — the one that created it and calls
 * epd_xport_progress.  Every callback runs on that thread, from inside
 * epd_xport_progress (or epd_xport_poll).  Other threads hand work to that
 * thread through a queue (common/epd_queue.h) and a wake-up; nothing here
 * takes a lock that a compute thread could hold.
 *
 * Posting never blocks: a post either is accepted (EPD_OK / EPD_INPROGRESS,
 * completion later through its callback), or refused with
 * EPD_ERR_NO_RESOURCE (nothing was queued: progress, then retry), or fails
 * at once with another error (nothing was queued, no callback).
 *
 * Trust (DESIGN.md "Trust boundary"): with a cluster secret configured on
 * both ends, the handshake is a mutual challenge-response on that secret
 * (HELLO with the initiator's identity and a fresh nonce; HELLO_ACK with the
 * acceptor's identity, its nonce and a MAC over the transcript; HELLO_FIN
 * with the initiator's MAC over it), binding each side's worker id, role
 * and epoch to the endpoint; every later frame on the endpoint carries a
 * MAC under a per-connection key derived from the secret, both nonces and
 * both identities.  A frame whose MAC does not verify fails its endpoint
 * with EPD_ERR_AUTH.  A peer without the secret (or with another one)
 * cannot complete a handshake with this worker in either direction, and the
 * acceptor never calls accept_cb: a worker with a secret drops a HELLO it
 * cannot verify unanswered, before it parses the address blob in it (so an
 * outsider cannot make the library parse crafted bytes), logging why and
 * counting it — the connector's connect times out (EPD_ERR_TIMEOUT); a
 * worker without a secret answers a HELLO that authenticates with a
 * refusal — the connector's connect fails with EPD_ERR_AUTH.
 * Payloads are authenticated, not encrypted; one-sided writes are not
 * MAC'd (their keys go only to authenticated peers and grant remote write
 * only: epd_xport_mr_alloc_ex).
 *
 * Peer failure: when a peer dies (library error, or no traffic — not even
 * the core's keepalives — for `peer_timeout_ms`, which is how death is seen
 * on UCX shared memory where the library reports nothing), the endpoint's
 * error callback runs once, then every write and flush still posted on it
 * completes with that error, and later posts fail with it.  The owner then
 * calls epd_xport_ep_close.
 */
#ifndef EPD_XPORT_H
#define EPD_XPORT_H

#include <stddef.h>
#include <stdint.h>

#include "epd_proc.h"
#include "epd_status.h"

typedef struct epd_xport epd_xport_t;           /* context + worker of one backend */
typedef struct epd_xport_ep epd_xport_ep_t;     /* a connection to one peer */
typedef struct epd_xport_mr epd_xport_mr_t;     /* a registered memory region */
typedef struct epd_xport_rkey epd_xport_rkey_t; /* a peer's region, unpacked on an endpoint */
typedef struct epd_xport_grant epd_xport_grant_t; /* one writer's revocable key to a region */

/* Largest packed remote key and address blob that the core accepts. */
#define EPD_XPORT_RKEY_MAX 4096
#define EPD_XPORT_ADDR_MAX 8192

/* Cluster secret lengths accepted by epd_xport_create (bytes). */
#define EPD_XPORT_SECRET_MIN 16
#define EPD_XPORT_SECRET_MAX 1024

/* Longest worker id of an identity, without its NUL. */
#define EPD_XPORT_WORKER_ID_MAX 127

/* A worker incarnation: same meaning as epd.Epoch on the request plane. */
typedef struct {
    uint64_t start_time_ns;
    uint64_t nonce;
} epd_xport_epoch_t;

/* Who a worker says it is in the handshake.  worker_id is NUL-terminated
 * printable ASCII without spaces (bytes 0x21..0x7e), "" for none; role is
 * the caller's role number (the transport does not interpret it). */
typedef struct {
    char worker_id[EPD_XPORT_WORKER_ID_MAX + 1];
    int32_t role;
    epd_xport_epoch_t epoch;
} epd_xport_identity_t;

/* Flags of epd_xport_send. */
#define EPD_XPORT_SEND_FENCE 0x1u /* deliver after every earlier write on this ep landed */

/* A message from a peer: `data` is borrowed for the duration of the call. */
typedef void (*epd_xport_msg_cb_t)(void *arg, epd_xport_ep_t *ep, const void *data, size_t len);

/* A peer connected to us (its handshake completed — with a secret, only
 * after it proved itself): `ep` is now usable for replies and is owned by
 * the callee's owner (close it with epd_xport_ep_close when done). */
typedef void (*epd_xport_accept_cb_t)(void *arg, epd_xport_ep_t *ep);

/* An endpoint failed (peer dead, unreachable, stale, or connect timed out);
 * runs once per endpoint.  The endpoint stays allocated until closed. */
typedef void (*epd_xport_err_cb_t)(void *arg, epd_xport_ep_t *ep, epd_status_t status);

/* Completion of a write, flush or connect: `status` EPD_OK or an error. */
typedef void (*epd_xport_comp_cb_t)(void *arg, epd_status_t status);

typedef struct {
    const char *backend;       /* "ucx" or "ofi" */
    /*
     * Expected transport class: NULL or "any", "shm" (shared memory on one
     * host), "tcp", "rdma" (verbs/EFA).  When the lanes the library chose for
     * an endpoint are not of this class, the connect fails with EPD_ERR_CONFIG
     * and one log line naming what was chosen — silent fallback to TCP is the
     * most common complaint about peer systems.
     */
    const char *expect;
    /* ofi: provider hint ("tcp;ofi_rxm" by default on loopback; FI_PROVIDER
     * in the environment wins).  ucx: ignored — UCX_TLS, UCX_NET_DEVICES and
     * the other UCX_* variables pass through to UCX untouched. */
    const char *provider;
    /* ofi: the node to bind ("127.0.0.1" by default: without a node libfabric
     * picks eth0).  ucx: ignored. */
    const char *bind_host;
    size_t max_msg_size;        /* largest message payload (default 64 KiB, at most 16 MiB) */
    uint32_t max_inflight;      /* writes+flushes posted at once per xport (default 4096) */
    uint32_t connect_timeout_ms; /* handshake deadline (default 5000) */
    uint32_t peer_timeout_ms;   /* silence that declares a peer dead (default 10000) */
    epd_xport_msg_cb_t msg_cb;  /* required */
    epd_xport_accept_cb_t accept_cb; /* may be NULL: incoming eps are still accepted */
    epd_xport_err_cb_t err_cb;  /* may be NULL */
    void *cb_arg;               /* passed to the three callbacks above */
    /*
     * The cluster secret: NULL / 0 for none (any HELLO is accepted, frames
     * carry no MAC: the behaviour and wire format of epd without
     * authentication), else EPD_XPORT_SECRET_MIN..EPD_XPORT_SECRET_MAX bytes,
     * the same on every member.  Borrowed for the duration of
     * epd_xport_create only: the transport keeps a key derived from it
     * (wiped at destroy), never the pointer.
     */
    const void *secret;
    size_t secret_len;
    /* This worker's identity, presented in every handshake (proven when a
     * secret is set, merely claimed otherwise); copied at create.  All zero
     * (epd_xport_config_init): none presented. */
    epd_xport_identity_t identity;
} epd_xport_config_t;

/* Fills `config` with the defaults above (backend "ucx"). */
void epd_xport_config_init(epd_xport_config_t *config);

/*
 * Creates a context and worker of the configured backend, owned by the
 * caller (epd_xport_destroy) and bound to the calling thread.  Logs one
 * line saying what the library offers (UCX transports, libfabric provider
 * and fabric).  EPD_ERR_CONFIG for an unknown backend or expectation, or
 * when the library cannot start (the log says why).
 */
epd_status_t epd_xport_create(const epd_xport_config_t *config, epd_xport_t **x_p);

/* Closes every endpoint (their pending operations complete with
 * EPD_ERR_CANCELED), releases every region and the worker.  NULL is a no-op. */
void epd_xport_destroy(epd_xport_t *x);

/* This worker's address as a blob (borrowed, valid until destroy), to be
 * carried to peers by the control plane. */
epd_status_t epd_xport_address(epd_xport_t *x, const void **blob_p, size_t *len_p);

/* A one-line description of the backend and what it chose, into buf. */
void epd_xport_describe(epd_xport_t *x, char *buf, size_t len);

/* 64-bit identity of this worker (random at creation; carried in handshakes). */
uint64_t epd_xport_id(const epd_xport_t *x);

/* 1 when this worker was created with a cluster secret (every endpoint it
 * has is then authenticated), else 0. */
int epd_xport_authenticating(const epd_xport_t *x);

/* Counters of refusals, for metrics; monotonic from create unless said. */
typedef struct {
    uint64_t handshakes_refused; /* handshakes that failed authentication, both roles */
    uint64_t frames_forged;      /* frames whose MAC did not verify (each failed its endpoint) */
    uint64_t frames_dropped;     /* malformed, stale or unroutable frames dropped */
    /* the fence (grants, below): writes that reached this worker's check and
     * were refused — under a revoked grant (a retired writer's late write),
     * or outside what the grant's owner allows (epd_xport_mr_set_check) */
    uint64_t writes_refused_late;
    uint64_t writes_refused_range;
    /* now: grants revoked whose writer may still land bytes (not settled),
     * and writes given back by a closed endpoint while the library may
     * still move their bytes (epd_xport_limbo) */
    uint32_t grants_held;
    uint32_t writes_limbo;
} epd_xport_stats_t;

/* Copies the counters into *stats_p.  Owning thread. */
void epd_xport_stats(const epd_xport_t *x, epd_xport_stats_t *stats_p);

/*
 * Connects to the peer whose address blob is given (copied).  Returns
 * EPD_INPROGRESS with *ep_p set: the endpoint may be used at once (sends and
 * writes queue behind the handshake), and `cb` runs once with EPD_OK when
 * the peer answered (with a secret: proved itself, and was sent our proof),
 * or an error (EPD_ERR_TIMEOUT after connect_timeout_ms when nobody answers
 * — also what a worker with a cluster secret does to a HELLO it cannot
 * verify —, EPD_ERR_CONFIG when the expectation is not met, EPD_ERR_AUTH
 * when this side has a secret and the peer none, or the peer's proof does
 * not verify).
 * EPD_ERR_BAD_ADDRESS at once for a malformed blob (no ep, no callback).
 */
epd_status_t epd_xport_connect(epd_xport_t *x, const void *blob, size_t len,
                               epd_xport_comp_cb_t cb, void *arg, epd_xport_ep_t **ep_p);

/* Closes an endpoint: pending writes and flushes complete with
 * EPD_ERR_CANCELED before this returns; rkeys unpacked on it are destroyed.
 * NULL is a no-op. */
void epd_xport_ep_close(epd_xport_ep_t *ep);

/* The peer's worker id (from the handshake; 0 before it completed). */
uint64_t epd_xport_ep_peer_id(const epd_xport_ep_t *ep);

/*
 * The identity the peer presented in the handshake, into *id_p (all zero
 * when it presented none), and in *authenticated_p 1 when the handshake
 * proved it under the cluster secret (the peer holds the secret and was the
 * one to answer on this endpoint), else 0 — the daemon checks every
 * envelope's claimed sender against an authenticated identity.  EPD_OK once
 * the handshake completed (the endpoint was delivered by accept_cb or its
 * connect callback ran with EPD_OK; still EPD_OK after it failed later);
 * EPD_INPROGRESS before (nothing written); EPD_ERR_INVALID_PARAM for NULL
 * arguments.  Owning thread.
 */
epd_status_t epd_xport_ep_identity(const epd_xport_ep_t *ep, epd_xport_identity_t *id_p,
                                   int *authenticated_p);

/* Which process the peer is (the process block of its handshake: pid,
 * start time, pid namespace, boot id — proven with a cluster secret).
 * EPD_OK once the handshake carried one; EPD_ERR_NOT_FOUND when it did not
 * (a peer without an identity) or has not completed. */
epd_status_t epd_xport_ep_peer_proc(const epd_xport_ep_t *ep, epd_proc_id_t *proc_p);

/* A one-line description of the lanes the library chose for this endpoint. */
void epd_xport_ep_describe(epd_xport_ep_t *ep, char *buf, size_t len);

/* The class of those lanes (static string): "shm", "tcp", "rdma" or
 * "other" — what --expect-transport compares; "" for a closed endpoint.
 * Owning thread. */
const char *epd_xport_ep_class(epd_xport_ep_t *ep);

/* Per-endpoint user pointer (not touched by the transport). */
void epd_xport_ep_set_user(epd_xport_ep_t *ep, void *user);
void *epd_xport_ep_user(const epd_xport_ep_t *ep);

/*
 * Sends `len` bytes (1..max_msg_size) to the peer's msg_cb.  The bytes are
 * copied: the buffer is free again when this returns.  Messages on one
 * endpoint arrive in the order sent.  With EPD_XPORT_SEND_FENCE the message
 * is held back until every write posted earlier on `ep` has landed remotely.
 * EPD_OK (queued), EPD_ERR_NO_RESOURCE (backpressure), EPD_ERR_TOO_LONG,
 * or the endpoint's error.
 */
epd_status_t epd_xport_send(epd_xport_ep_t *ep, const void *buf, size_t len, unsigned flags);

/* Access of a region (epd_xport_mr_alloc_ex / epd_xport_mr_reg_ex). */
#define EPD_XPORT_MR_LOCAL 0x0u        /* a write source only: no key, nothing remote */
#define EPD_XPORT_MR_REMOTE_WRITE 0x1u /* peers holding its packed key may write into it */

/*
 * Allocates and registers a region of `size` bytes with `access`:
 *   - EPD_XPORT_MR_REMOTE_WRITE: meant to receive writes (decode's KV pool,
 *     prefill's embedding slots).  Peers may write into it with its packed
 *     key and do nothing else: no remote read on any backend (libfabric
 *     without delivery complete reads a separate 1-byte sink to order its
 *     flushes, never the region).  The backend allocates it where that
 *     enables true one-sided writes (UCX UCP_MEM_MAP_ALLOCATE on shared
 *     memory).  It may also be the source of writes.
 *   - EPD_XPORT_MR_LOCAL: only ever the source of writes (prefill's local KV
 *     pool, the encoder's output): no remote access at all.  It has no
 *     packed key (epd_xport_mr_pack refuses), and a write naming it anyway
 *     (a forged key) is refused by the receiving side.
 * Owned by the caller (epd_xport_mr_dereg frees the memory too).  Contents
 * are zeroed.  EPD_ERR_INVALID_PARAM for other access bits.
 */
epd_status_t epd_xport_mr_alloc_ex(epd_xport_t *x, size_t size, unsigned access,
                                   epd_xport_mr_t **mr_p);

/* Registers existing memory [addr, addr+size) (borrowed: it must outlive the
 * region) with `access` as above.  Owned by the caller (epd_xport_mr_dereg). */
epd_status_t epd_xport_mr_reg_ex(epd_xport_t *x, void *addr, size_t size, unsigned access,
                                 epd_xport_mr_t **mr_p);

/* epd_xport_mr_alloc_ex / epd_xport_mr_reg_ex with EPD_XPORT_MR_REMOTE_WRITE
 * (what every region was before access existed). */
epd_status_t epd_xport_mr_alloc(epd_xport_t *x, size_t size, epd_xport_mr_t **mr_p);
epd_status_t epd_xport_mr_reg(epd_xport_t *x, void *addr, size_t size, epd_xport_mr_t **mr_p);

/* Deregisters (and frees, for mr_alloc regions).  Writes into it that a peer
 * still has in flight fail on the peer's side.  NULL is a no-op. */
void epd_xport_mr_dereg(epd_xport_mr_t *mr);

void *epd_xport_mr_addr(const epd_xport_mr_t *mr);
size_t epd_xport_mr_size(const epd_xport_mr_t *mr);

/* Packs the region's remote key (with its size) into buf[0..cap);
 * *len_p gets the packed length.  EPD_ERR_NO_RESOURCE when cap is too small,
 * EPD_ERR_INVALID_PARAM for an EPD_XPORT_MR_LOCAL region (it has none).
 * The key lets its holder write anywhere in the region: give it only to
 * authenticated peers (epd_xport_ep_identity). */
epd_status_t epd_xport_mr_pack(epd_xport_mr_t *mr, void *buf, size_t cap, size_t *len_p);

/* Unpacks a peer's packed key for use on `ep` (owned by the caller; also
 * destroyed by epd_xport_ep_close).  EPD_ERR_BAD_RKEY for a malformed blob. */
epd_status_t epd_xport_rkey_unpack(epd_xport_ep_t *ep, const void *blob, size_t len,
                                   epd_xport_rkey_t **rkey_p);
void epd_xport_rkey_destroy(epd_xport_rkey_t *rkey);
/* Size of the remote region the key names. */
size_t epd_xport_rkey_size(const epd_xport_rkey_t *rkey);

/*
 * Writes local[0..len) into the peer's region at `remote_offset`.  The local
 * buffer is lent to the transport until `cb` runs.  `local_mr` is the
 * registered region containing it (NULL is allowed when the buffer is not
 * registered; the backend then registers or bounces as it must, more
 * slowly).  Writes outside the remote region are refused at once with
 * EPD_ERR_OUT_OF_RANGE; the receiving side checks again.  EPD_INPROGRESS
 * (cb will run), EPD_ERR_NO_RESOURCE, or the endpoint's error.
 */
epd_status_t epd_xport_write(epd_xport_ep_t *ep, const void *local, size_t len,
                             epd_xport_mr_t *local_mr, epd_xport_rkey_t *rkey,
                             uint64_t remote_offset, epd_xport_comp_cb_t cb, void *arg);

/* Completes (cb) when every write posted earlier on `ep` has landed
 * remotely.  EPD_INPROGRESS, EPD_ERR_NO_RESOURCE or the endpoint's error. */
epd_status_t epd_xport_flush(epd_xport_ep_t *ep, epd_xport_comp_cb_t cb, void *arg);

/*
 * The fence (proto/README.md rules 25-29): a grant is ONE writer's
 * permission to write into a region, with a key of its own, that the
 * receiver can take back.  The receiver opens a grant per writer
 * incarnation, hands its packed key (epd_xport_grant_pack, unpacked by the
 * writer with epd_xport_rkey_unpack like a region's key) only to that
 * writer, and revokes it when it retires the writer (declared dead or
 * restarted).  Memory the writer was allowed to write may be reused once
 * epd_xport_grant_settled says nothing of it can land any more:
 *   - where every byte of a write reaches the receiver's own check before
 *     it lands (UCX active-message writes: eager ones are checked in the
 *     handler, rendezvous ones before their receive starts, and receives
 *     that started under the grant are counted), settled once revoked and
 *     no receive under it is in flight;
 *   - where the writer may land bytes that pass no check of the receiver's
 *     after the revocation (a same-host writer that maps the region: UCX
 *     shared-memory puts; a library that checks the key once per
 *     operation, so a write under way when the key is closed still lands:
 *     libfabric), settled only once the writer's process is known to have
 *     ended (its process block from the handshake, same host: a pidfd).
 *     The writer's own word (a WritesQuiesced sent once every write it
 *     posted completed and none is in limbo, see epd_xport_limbo) is the
 *     other proof; that one is the request plane's, not the transport's.
 * Owning thread.
 */

/* The receiver's check of a write that reaches it (the UCX active-message
 * path; other paths cannot be checked, see above): called with the grant's
 * `user` pointer and the write's offset and length inside the region,
 * possibly from inside the library's progress (it must not call into the
 * transport); nonzero lets the write land, 0 drops it (counted in
 * writes_refused_range).  Writes under a revoked grant never get here. */
typedef int (*epd_xport_write_check_cb_t)(void *arg, void *grant_user, uint64_t offset,
                                          uint64_t len);

/* Sets the check of a EPD_XPORT_MR_REMOTE_WRITE region (NULL: none). */
void epd_xport_mr_set_check(epd_xport_mr_t *mr, epd_xport_write_check_cb_t cb, void *arg);

/* Opens a grant on a EPD_XPORT_MR_REMOTE_WRITE region for one writer
 * (`user` is passed to the region's check).  Owned by the caller
 * (epd_xport_grant_close; also closed with the region and the xport).
 * EPD_ERR_INVALID_PARAM for a local region. */
epd_status_t epd_xport_grant_open(epd_xport_mr_t *mr, void *user, epd_xport_grant_t **g_p);

/* Packs the grant's key: what its writer unpacks (epd_xport_rkey_unpack)
 * to write into the region.  Give it to that writer only. */
epd_status_t epd_xport_grant_pack(epd_xport_grant_t *g, void *buf, size_t cap, size_t *len_p);

/* Records which process the grant's writer is, from `ep` (an endpoint to
 * it whose handshake completed and carried its process block; otherwise
 * nothing happens).  The first one recorded stays.  epd_xport_grant_revoke
 * does it too; binding early (while the writer is surely alive) keeps a
 * same-host writer watchable even when no endpoint to it is left at the
 * revocation. */
void epd_xport_grant_bind(epd_xport_grant_t *g, const epd_xport_ep_t *ep);

/* Revokes the grant (idempotent): no write under it starts landing after
 * this returns.  `ep` (may be NULL): an endpoint to the writer whose
 * handshake completed — its process block tells where the writer runs, so
 * that a same-host writer can be watched until it ends. */
void epd_xport_grant_revoke(epd_xport_grant_t *g, const epd_xport_ep_t *ep);

/* Nonzero once the grant is revoked and nothing of its writer can land in
 * the region any more (see the top); sticky. */
int epd_xport_grant_settled(epd_xport_grant_t *g);

/* A static word on where the grant stands, for logs ("open", "revoked",
 * "revoked, receives in flight", "held: the writer may still write without
 * a check", "the writer's process ended"). */
const char *epd_xport_grant_state(const epd_xport_grant_t *g);

/* Closes the grant (its key is refused from now on).  NULL is a no-op. */
void epd_xport_grant_close(epd_xport_grant_t *g);

/* Writes given back by a closed endpoint (completed with an error) while
 * the library may still move their bytes, towards the peer with transport
 * id `peer_xid` (epd_xport_ep_peer_id; 0: any peer).  A writer claims it
 * has quiesced its writes only when this is 0 for that peer. */
uint32_t epd_xport_limbo(const epd_xport_t *x, uint64_t peer_xid);

/* Runs callbacks for up to a bounded batch of events; returns how many
 * events it handled (0: nothing to do).  Also enforces connect and peer
 * timeouts and sends keepalives, so call it at least every
 * peer_timeout_ms / 4 even when nothing arrives. */
int epd_xport_progress(epd_xport_t *x);

/* A file descriptor that becomes readable when there is work: sleep on it
 * after epd_xport_arm returned EPD_OK.  EPD_ERR_UNSUPPORTED when the
 * provider has none (then progress on an idle timer instead). */
epd_status_t epd_xport_get_fd(epd_xport_t *x, int *fd_p);

/* Prepares to sleep on the fd: EPD_OK when it is safe to sleep, EPD_ERR_BUSY
 * when events are pending (progress again first). */
epd_status_t epd_xport_arm(epd_xport_t *x);

/* Convenience for simple threads and tests: progresses, and if nothing was
 * done sleeps on the fd (or briefly) for at most timeout_ms.  Returns the
 * number of events handled. */
int epd_xport_poll(epd_xport_t *x, int timeout_ms);

#endif
