/*
 * epd_xport_ucx_int.h — the UCX backend's private types and the calls
 * between its files (transport/ucx/ only).  Its files, from the bottom up:
 *   epd_xport_ucx_comp.c  completions, pools, progress
 *   epd_xport_ucx_mr.c    memory registration, keys, grants
 *   epd_xport_ucx_msg.c   messages
 *   epd_xport_ucx_rma.c   writes and flushes
 *   epd_xport_ucx_ep.c    endpoints
 *   epd_xport_ucx.c       context, worker, the ops table
 *
 * The UCX (ucp) backend of epd_xport.
 *
 * One ucp context and one worker (UCS_THREAD_MODE_SINGLE: the owning thread
 * is the only caller), features RMA | AM | WAKEUP.  Endpoints are created
 * from a peer's worker address with UCP_ERR_HANDLING_MODE_NONE: PEER mode
 * silently drops the shared-memory transports (measured on the development machines), so peer death
 * is the core's business (keepalives and the silence timeout).
 *
 * Writes take the fastest path the lanes offer, chosen per remote key:
 *   - "direct": the endpoint's active-message lane is shared memory and the
 *     peer's region is mappable here (ucp_rkey_ptr succeeds — the region was
 *     allocated by ucp_mem_map(ALLOCATE) on posix/sysv): ucp_put_nbx, a true
 *     one-sided memcpy into the peer's memory that needs no target progress;
 *   - otherwise an active message (id EPD__UCX_AM_WRITE) whose header names
 *     the region id and offset, forced to rendezvous from 32 KiB on
 *     (UCP_AM_SEND_FLAG_RNDV): the receiver validates region id and range in
 *     its handler and receives the payload straight into the region with
 *     ucp_am_recv_data_nbx; smaller writes arrive eagerly and are copied.
 *     Over tcp this moves ~4x the bandwidth of put, which UCX emulates.
 *
 * Messages are active messages (id EPD__UCX_AM_MSG) forced eager, so a
 * handler sees them whole and in order.  Nothing user-visible runs inside a
 * UCX callback: handlers and completion callbacks only queue (received
 * messages into a ring, finished ops onto a done list), and
 * epd__ucx_progress hands them to the core after ucp_worker_progress
 * returned — so core callbacks may close endpoints, which itself progresses
 * the worker (nesting ucp_worker_progress inside a UCX callback is not
 * allowed).
 *
 * Address blobs and packed keys are wrapped in an envelope (magic, version,
 * lengths, XXH3 of the UCX bytes) and checked before UCX parses anything:
 * UCX trusts its own blobs, and garbage handed to it can crash it.  (The
 * checksum catches corruption, not an attacker, who can compute it: an
 * address blob from an unauthenticated HELLO still reaches ucp_ep_create.)
 *
 * Memory access: a region that receives writes is mapped local read/write
 * plus remote write (UCP_MEM_MAP_PROT_*), never remote read; a local
 * (source-only) region is plain memory mapped for local access only, so
 * there is no shared-memory segment or key a peer could use, and the
 * active-message write handler refuses a write that names it.  Region ids
 * (what an AM write names) are random from libsodium, not guessable.
 */
#ifndef EPD_XPORT_UCX_INT_H
#define EPD_XPORT_UCX_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>
#include <ucp/api/ucp.h>

#include "epd_alloc.h"
#include "epd_bufpool.h"
#include "epd_hash.h"
#include "epd_list.h"
#include "epd_log.h"
#include "epd_time.h"
#include "epd_xport_int.h"

#define EPD__UCX_COMP "ucx"
#define EPD__UCX_AM_MSG 17
#define EPD__UCX_AM_WRITE 18
#define EPD__UCX_ADDR_MAGIC 0x41555045u /* "EPUA" */
#define EPD__UCX_RKEY_MAGIC 0x4b525045u /* "EPRK" */
#define EPD__UCX_WIRE_VERSION 1
#define EPD__UCX_RNDV_MIN (32 * 1024) /* AM writes from this size on: rendezvous */
#define EPD__UCX_RING 4096            /* received messages queued per progress */
#define EPD__UCX_RING_SLACK 512       /* room kept for one ucp_worker_progress */
#define EPD__UCX_TX_MAX 1024          /* send copies in flight ... */
#define EPD__UCX_TX_BYTES (64u << 20) /* ... and at most this many bytes of them */
/* Send copies UCX holds for one endpoint at most (beyond: backpressure for
 * that peer only).  UCX holds a copy while the send waits for room in the
 * peer's receive queue; a peer that died with it full never takes them
 * and they can never be dropped (epd__ucx_arm), so without this bound one
 * dead router stranded the whole pool: a decode worker that had streamed
 * to it could not even answer the next router's HELLO ("no resource now")
 * in test_router_kill_ucx_shm under ASan.  Half the pool: a live peer a
 * burst fills up must not see it (at 128, test_storm_aborts' 200 requests
 * and their aborts at one decode worker lost 4 aborts and had 103
 * requests refused for room); one dead peer strands at most this many. */
#define EPD__UCX_EP_TX_MAX (EPD__UCX_TX_MAX / 2)
#define EPD__UCX_CLOSE_WAIT_NS (2 * EPD_NSEC_PER_SEC)
#define EPD__UCX_FLUSH_WAIT_NS (100 * EPD_NSEC_PER_MSEC) /* before the close */

typedef struct epd__ucx epd__ucx_t;
typedef struct epd__ucx_ep epd__ucx_ep_t;
typedef struct epd__ucx_tx epd__ucx_tx_t;

/* Header of a write active message: the id of a region or of a grant
 * (epd_xport.h, "The fence"), and the offset in the region. */
typedef struct {
    uint64_t region_id;
    uint64_t offset;
} epd__ucx_wr_hdr_t;

/*
 * One UCX request of a write or a flush, the backend's rather than the
 * op's so that it can outlive the op: UCX 1.13 reads an AM write's header
 * (it has no COPY_HEADER) and a put's or a rendezvous's source until the
 * request completes, and ucp_request_free on an unfinished request only
 * suppresses its callback.  An op whose endpoint is destroyed while UCX
 * still holds its request is given back to the core at once (with
 * EPD_ERR_CANCELED, as the contract says) but its wr stays, header
 * included, as an orphan until UCX's callback: the header it reads is never
 * another write's (that is how a closed endpoint used to land one
 * write's bytes at another's offset), and the orphans are counted
 * (epd_xport_limbo: the writer does not claim quiescence meanwhile).
 */
typedef struct epd__ucx_wr {
    epd__ucx_wr_hdr_t hdr;
    epd__xport_op_t *op; /* NULL: an orphan */
    void *req;           /* UCX's request while UCX holds it */
    epd__ucx_t *be;
    uint64_t peer_xid;               /* orphan: the peer its endpoint reached */
    struct epd__ucx_wr *prev, *next; /* be->orphans, or be->wr_free (next only) */
} epd__ucx_wr_t;

/* The backend's view of an op, inside its be_priv scratch space. */
typedef struct {
    epd__ucx_wr_t *wr; /* while UCX holds the request */
    epd__ucx_ep_t *ep;
    epd__xport_op_t *prev, *next; /* ep's outstanding list, then be's done list */
    int32_t status;
    uint32_t where; /* EPD__UCX_OP_* */
} epd__ucx_op_t;

_Static_assert(sizeof(epd__ucx_op_t) <= sizeof(((epd__xport_op_t *)0)->be_priv),
               "UCX op state must fit be_priv");

enum { EPD__UCX_OP_NONE = 0, EPD__UCX_OP_OUT, EPD__UCX_OP_DONE };

#define EPD__UCX_OP(op) ((epd__ucx_op_t *)(void *)(op)->be_priv)

struct epd__ucx_tx {
    void *req;
    epd__ucx_t *be;
    epd__ucx_ep_t *ep;          /* NULL: an orphan, its endpoint destroyed while UCX held it */
    epd__ucx_tx_t *prev, *next; /* ep->tx_head, or be->tx_orphans */
    unsigned char data[];       /* from be->tx (epd_bufpool) */
};

struct epd__ucx_ep {
    epd__ucx_t *be;
    epd_xport_ep_t *core_ep;
    ucp_ep_h ep;
    bool shm; /* AM lane is shared memory */
    const char *cls;
    epd_status_t pending_fail; /* reported by a UCX callback, not yet to the core */
    bool fail_listed;
    epd__xport_op_t *out_head; /* ops UCX holds */
    epd__ucx_tx_t *tx_head;    /* send copies UCX holds */
    uint32_t n_tx;             /* ... how many (at most EPD__UCX_EP_TX_MAX) */
    epd__ucx_ep_t *prev, *next;
    epd__ucx_ep_t *fail_next;
    char desc[256];
};

/* What a rendezvous receive's user data points at (its first field). */
enum { EPD__UCX_KIND_MR = 1, EPD__UCX_KIND_GRANT };

typedef struct epd__ucx_mr {
    int kind; /* EPD__UCX_KIND_MR */
    epd__ucx_t *be;
    ucp_mem_h memh;
    void *addr;
    size_t size;
    void *owned;       /* local region: the memory we allocated (epd_free) */
    bool remote_write; /* EPD_XPORT_MR_REMOTE_WRITE: peers may write into it */
    uint64_t id;
    bool allocated;         /* UCP_MEM_MAP_ALLOCATE: may be a shared-memory segment */
    bool dead;              /* deregistered, waiting for receives */
    uint32_t recv_inflight; /* rendezvous receives landing in it (grants' too) */
    struct epd__ucx_mr *prev, *next;
} epd__ucx_mr_t;

/* A grant: a writer's own id for AM writes into a region. */
typedef struct epd__ucx_grant {
    int kind; /* EPD__UCX_KIND_GRANT */
    uint64_t id;
    epd__ucx_mr_t *mr;
    epd_xport_grant_t *core;
    bool revoked;
    uint32_t recv_inflight;             /* rendezvous receives under it */
    struct epd__ucx_grant *prev, *next; /* be->grants, or be->dead_grants */
} epd__ucx_grant_t;

typedef struct {
    epd__ucx_ep_t *ep;
    ucp_rkey_h rkey;
    uint64_t base;
    uint64_t region_id;
    uint64_t size;
    bool direct;
} epd__ucx_rkey_t;

#define EPD__UCX_RX_INLINE 240 /* small messages are copied into the ring slot */

typedef struct {
    void *data; /* UCX's descriptor (released after delivery), or inl */
    size_t len;
    bool held; /* data is a UCX descriptor to release */
    unsigned char inl[EPD__UCX_RX_INLINE];
} epd__ucx_rx_t;

struct epd__ucx {
    epd_xport_t *core;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *uaddr;
    size_t uaddr_len;
    unsigned char *blob;
    size_t blob_len;
    int efd;
    size_t msg_cap; /* frame header + max_msg_size */
    epd__ucx_ep_t *eps;
    epd__ucx_ep_t *fail_list;
    epd__ucx_mr_t *mrs, *dead_mrs;
    epd__ucx_grant_t *grants, *dead_grants; /* dead: closed, receives in flight */
    epd__ucx_wr_t *wr_free;                 /* request records, grown on demand */
    epd__ucx_wr_t *orphans;                 /* their op given back, UCX still holds them */
    uint32_t n_orphans;
    bool maps_shm; /* a transport that maps a peer's region (posix, sysv, xpmem) */
    epd__xport_op_t *done_head, *done_tail;
    epd__ucx_rx_t *ring; /* [EPD__UCX_RING] */
    uint32_t ring_head, ring_count;
    epd_bufpool_t tx; /* send copies UCX holds (epd__ucx_tx_t + bytes) */
    /* Send copies of destroyed endpoints that UCX still holds: a send
     * pending on an endpoint that is closed (force) is not always completed
     * by the close, and UCX may still transmit its bytes afterwards.  Such
     * a copy goes back to the pool only when its callback says UCX is done
     * with it — returned earlier, it was reused by the next send and the
     * peer received one frame's length with another frame's header. */
    epd__ucx_tx_t *tx_orphans;
    uint64_t dropped;
    bool half_wired; /* an endpoint may have been closed mid wire-up */
    char resources[160];
};

/* Address blob: header, then the UCX worker address. */
typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t reserved;
    uint32_t ucx_len;
    uint32_t reserved2;
    uint64_t hash; /* XXH3 of the UCX bytes, seeded with ucx_len */
} epd__ucx_addr_wire_t;

/* Packed key: header, then the UCX packed rkey. */
typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t ucx_len;
    uint64_t region_id;
    uint64_t base;
    uint64_t size;
    uint64_t hash; /* XXH3 of the UCX bytes, seeded with the fields above */
} epd__ucx_rkey_wire_t;

/* epd_xport_ucx_comp.c */
epd_status_t epd__ucx_status(ucs_status_t s);
void epd__ucx_out_remove(epd__xport_op_t *op);
void epd__ucx_out_add(epd__ucx_ep_t *ep, epd__xport_op_t *op);
void epd__ucx_done_add(epd__ucx_t *be, epd__xport_op_t *op, epd_status_t status);
void epd__ucx_done_remove(epd__ucx_t *be, epd__xport_op_t *op);
epd__ucx_wr_t *epd__ucx_wr_get(epd__ucx_t *be);
void epd__ucx_wr_put(epd__ucx_t *be, epd__ucx_wr_t *wr);
void epd__ucx_op_cb(void *request, ucs_status_t status, void *user_data);
epd__ucx_tx_t *epd__ucx_tx_get(epd__ucx_t *be, size_t len);
void epd__ucx_tx_put(epd__ucx_t *be, epd__ucx_tx_t *tx);
void epd__ucx_tx_unlink(epd__ucx_tx_t *tx);
void epd__ucx_tx_cb(void *request, ucs_status_t status, void *user_data);
void epd__ucx_reap(epd__ucx_t *be);
int epd__ucx_progress(void *arg);
epd_status_t epd__ucx_get_fd(void *arg, int *fd_p);
epd_status_t epd__ucx_arm(void *arg);

/* epd_xport_ucx_mr.c */
epd__ucx_mr_t *epd__ucx_mr_find(epd__ucx_t *be, uint64_t id);
epd__ucx_grant_t *epd__ucx_grant_find(epd__ucx_t *be, uint64_t id);
void epd__ucx_mr_unmap(epd__ucx_mr_t *mr);
epd_status_t epd__ucx_mr_alloc(void *arg, size_t size, unsigned access, void **addr_p,
                               void **be_mr_p);
epd_status_t epd__ucx_mr_reg(void *arg, void *addr, size_t size, unsigned access, void **be_mr_p);
void epd__ucx_mr_dereg(void *arg, void *be_mr);
epd_status_t epd__ucx_mr_pack(void *arg, void *be_mr, void *buf, size_t cap, size_t *len_p);
epd_status_t epd__ucx_grant_open(void *arg, void *be_mr, epd_xport_grant_t *core_grant,
                                 void **be_grant_p);
epd_status_t epd__ucx_grant_pack(void *arg, void *be_grant, void *buf, size_t cap, size_t *len_p);
epd_status_t epd__ucx_grant_revoke(void *arg, void *be_grant, int writer_same_host);
int epd__ucx_grant_settled(void *arg, void *be_grant);
void epd__ucx_grant_close(void *arg, void *be_grant);
epd_status_t epd__ucx_rkey_unpack(void *arg, const void *blob, size_t len, void **be_rkey_p,
                                  size_t *size_p);
void epd__ucx_rkey_destroy(void *be_rkey);

/* epd_xport_ucx_msg.c */
ucs_status_t epd__ucx_am_msg(void *arg, const void *header, size_t header_length, void *data,
                             size_t length, const ucp_am_recv_param_t *param);
void epd__ucx_recv_cb(void *request, ucs_status_t status, size_t length, void *user_data);
epd_status_t epd__ucx_send(void *arg, const void *hdr, size_t hdr_len, const void *payload,
                           size_t len);

/* epd_xport_ucx_rma.c */
ucs_status_t epd__ucx_am_write(void *arg, const void *header, size_t header_length, void *data,
                               size_t length, const ucp_am_recv_param_t *param);
epd_status_t epd__ucx_write(void *arg, const void *local, size_t len, void *be_local_mr,
                            void *be_rkey, uint64_t remote_offset, epd__xport_op_t *op);
epd_status_t epd__ucx_flush(void *arg, epd__xport_op_t *op);

/* epd_xport_ucx_ep.c */
epd_status_t epd__ucx_ep_create(void *arg, const void *blob, size_t len, epd_xport_ep_t *core_ep,
                                void **be_ep_p);
void epd__ucx_ep_destroy(void *arg);
void epd__ucx_ep_describe(void *arg, char *buf, size_t len, const char **class_p);
uint32_t epd__ucx_limbo(void *arg, uint64_t peer_xid);

#endif
