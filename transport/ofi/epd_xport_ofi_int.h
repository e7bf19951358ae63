/*
 * epd_xport_ofi_int.h — the libfabric backend's private types and the
 * calls between its files (transport/ofi/ only).  Its files, from the bottom up:
 *   epd_xport_ofi_util.c  base: envelopes, errors, pools, endpoint state
 *   epd_xport_ofi_msg.c   messages (fragments, reassembly, send)
 *   epd_xport_ofi_rma.c   writes and flushes
 *   epd_xport_ofi_comp.c  completions, progress
 *   epd_xport_ofi_mr.c    memory registration, keys, grants
 *   epd_xport_ofi_ep.c    endpoints
 *   epd_xport_ofi.c       libfabric, the worker, the ops table
 *
 * The libfabric backend of the transport (ops contract in
 * transport/epd_xport_int.h).
 *
 * One worker = one fabric, domain, address vector (AV), completion queue
 * (CQ) and ONE reliable-datagram endpoint (FI_EP_RDM) shared by every peer.
 * A backend endpoint is only an fi_addr_t in the AV plus the bookkeeping of
 * the writes and flushes posted to that peer.
 *
 * Provider choice: hints ask for FI_EP_RDM with FI_MSG | FI_RMA, send-after-
 * send ordering (FI_ORDER_SAS) and the provider named by config->provider
 * ("tcp;ofi_rxm" by default).  FI_PROVIDER in the environment wins: libfabric
 * filters on it itself, so the config's name is then not put in the hints.
 * The node is config->bind_host with FI_SOURCE (without a node libfabric
 * binds eth0).
 *
 * Memory registration: hints request FI_MR_LOCAL | FI_MR_VIRT_ADDR |
 * FI_MR_PROV_KEY | FI_MR_ALLOCATED | FI_MR_ENDPOINT | FI_MR_RAW and the code
 * honours whatever subset the provider keeps:
 *   - LOCAL: every local buffer is passed with its descriptor (the send and
 *     receive pools and the flush scratch are registered once; a write from
 *     a region of ours uses its fi_mr_desc; a write from unregistered memory
 *     registers the range for the duration of the write).
 *   - VIRT_ADDR: the packed key carries the region's virtual address as base
 *     and the writer adds the offset; without it the base is 0 (offsets).
 *   - PROV_KEY: the key is fi_mr_key() after registration; without it the
 *     worker picks each key at random (libsodium; a collision with a key in
 *     use, -FI_ENOKEY, draws again), within the provider's mr_key_size: a
 *     key is the only thing standing between a peer that can reach the
 *     endpoint and the region, so it must not be guessable (it used to be
 *     a counter from 1).
 *   - ENDPOINT: every region is bound to the endpoint (fi_mr_bind) and
 *     enabled (fi_mr_enable) before use.
 *   - ALLOCATED: only memory that exists is ever registered (heap buffers),
 *     nothing to do.
 *   - RAW: keys wider than 64 bits travel as raw bytes (fi_mr_raw_attr) and
 *     are mapped on the writer with fi_mr_map_raw / fi_mr_unmap_key.
 * Every provider on the build machines returns mr_mode = 0; the other paths
 * exist for verbs / EFA clusters.
 *
 * Access: a region that receives writes is registered FI_REMOTE_WRITE (and
 * FI_WRITE: it may also be the local source of a write), never
 * FI_REMOTE_READ; a local (source-only) region is registered only where the
 * provider needs local registration (FI_MR_LOCAL), with FI_WRITE alone, so
 * with mr_mode 0 it has no key at all.
 *
 * Messages and their order: rxm delivers messages up to its eager limit
 * (16 KiB by default) in order, but sends larger ones by segmentation or
 * rendezvous, and their receive completions arrive hundreds of messages
 * late (measured: 20000 mixed-size messages on tcp;ofi_rxm 1.17, every one
 * above 16 KiB overtaken).  So every message is cut into fragments that stay
 * under that limit (rxm: FI_OFI_RXM_EAGER_LIMIT, else 16 KiB; shm: its
 * inject size; others: 8 KiB), each with a 16-byte header {stream, total,
 * offset}.  The stream names the sending endpoint (a random worker nonce
 * plus an endpoint serial); fragments of one stream arrive in order, so a
 * receiver reassembles per stream in a small table (EPD__OFI_REASM entries,
 * buffers kept once allocated), and a one-fragment message is delivered
 * straight from the receive buffer.  Receive buffers: a bounded pool of
 * fragment-sized slots pre-posted with fi_recv and reposted after each
 * completion.  Sends: the caller's bytes are copied before send returns,
 * into fi_inject's buffer when the message is small, else into slots of a
 * bounded pool; when the provider pushes back (-FI_EAGAIN: rxm is still
 * setting up its connection, or its queues are full) the copied fragments
 * wait in the endpoint's backlog and go out in order from progress.
 * EPD_ERR_NO_RESOURCE means the slot pool is empty; the provider is then
 * nudged (fi_cq_read of zero entries progresses it without consuming
 * anything, so no upcall runs inside the caller's send).
 *
 * Writes and what completion means: when the provider accepts
 * FI_DELIVERY_COMPLETE (checked with fi_getinfo; tcp;ofi_rxm and shm do),
 * every write part is posted with fi_writemsg(FI_DELIVERY_COMPLETE), so a
 * write's completion means its bytes are in the target's memory (tcp makes
 * the target acknowledge after placing the data).  A flush is then pure
 * bookkeeping: it completes once no write posted before it on that endpoint
 * is still outstanding.  When the provider does not offer delivery
 * complete (verbs), writes complete at transmit, and a flush whose writes
 * have completed locally posts a 1-byte fi_read from the target's flush
 * sink: the read is ordered after the writes on this endpoint pair
 * (FI_ORDER_RAW orders transmission on the endpoint, whatever the address;
 * the target executes them in order), so its completion means they landed.
 * The sink is one zero byte each worker registers FI_REMOTE_READ (its key
 * travels in every packed key of that worker's regions); that is all of a
 * worker's memory a peer can ever read.  It used to read back the last
 * byte written, which needed FI_REMOTE_READ on every region: any holder of
 * a KV pool's key could read every request's KV in it.  Writes longer
 * than the provider's max_msg_size (or the EPD_OFI_WRITE_CHUNK environment
 * variable, a test knob) are split into parts; the op completes once every
 * part did, with the first error.  EPD_OFI_DELIVERY_COMPLETE=0 (a test
 * knob) takes the read-flushed path on providers that have delivery
 * complete.
 *
 * Completions: one CQ (FI_CQ_FORMAT_DATA) with FI_WAIT_FD where the
 * provider has one (get_fd = fi_control(FI_GETWAIT), arm = fi_trywait);
 * shm has none, and get_fd says EPD_ERR_UNSUPPORTED.  Each posted libfabric
 * operation has its own context object (struct fi_context2 first, so
 * providers that need FI_CONTEXT/FI_CONTEXT2 work) pointing back to its
 * request and endpoint; a CQ error that means the peer is gone fails the
 * endpoint once (epd__xport_ep_failed), then its queued flushes and unposted
 * write parts complete with that status; posted parts complete with the
 * provider's error.
 *
 * Ownership: a request whose libfabric parts are still posted is never
 * freed before the provider hands them back, even when its endpoint is
 * destroyed (it is then an orphan: its op was already completed with
 * EPD_ERR_CANCELED, and the late completion only frees it).  Caveat: the
 * caller's source buffer of such a canceled write may still be read by the
 * provider until that late completion; nothing here can wait for it without
 * blocking.
 *
 * Addresses: each distinct peer address is inserted into the AV once and
 * shared, refcounted, by every endpoint to it; the worker keeps the name
 * bytes until fi_av_remove (shm 1.17 keys its name map with the pointer
 * given to fi_av_insert), and removes an address only once the provider has
 * returned every operation posted to it (shm crashes when an address is
 * removed under operations in flight; destroyed endpoints wait as zombies).
 *
 * Provider quirks (libfabric 1.17, measured on loopback):
 *   - tcp;ofi_rxm: the default; connects lazily (the first sends get
 *     -FI_EAGAIN and wait in the backlog); a dead peer shows as
 *     FI_ECONNRESET / FI_ECONNREFUSED completions.
 *   - shm: no wait fd (get_fd says EPD_ERR_UNSUPPORTED); no node may be
 *     given (its address is named after the node: two processes collide);
 *     an address whose segment is gone is refused with EPD_ERR_UNREACHABLE
 *     before fi_av_insert (which crashes on a closed endpoint of this
 *     process); a dead peer is never reported (only the core's keepalive
 *     timeout sees it), and writes to it never complete: they sit at the
 *     head of shm's response queue, so later writes to OTHER peers from this
 *     worker stall too.  After a peer death on shm, recreate the worker.
 *   - sockets (deprecated): works, except that destroying a second endpoint
 *     to the same peer with writes in flight breaks the first.
 *
 * All calls run on the owning thread; progress does bounded work (at most
 * EPD__OFI_CQ_BUDGET completions and EPD__OFI_SWEEP_BUDGET upcalls from
 * queued work per call).  Nothing sleeps or blocks.
 */
#ifndef EPD_XPORT_OFI_INT_H
#define EPD_XPORT_OFI_INT_H

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sodium.h>

#include "epd_alloc.h"
#include "epd_hash.h"
#include "epd_list.h"
#include "epd_log.h"
#include "epd_rng.h"
#include "epd_xport_int.h"

/* libfabric is opened at the first ofi worker (dlopen), not linked: the
 * Debian build pulls in its psm providers, and libinfinipath's constructor
 * spends about 0.17 s of every process start calibrating a clock with
 * usleep (measured on epd-ctl: 0.24 s to print --help, 0.03 s without) and
 * installs handlers for SIGINT and SIGTERM that call exit() — in every
 * program that links the transport, whichever backend it uses.  Opened
 * here, only workers of the ofi backend pay the start, and the signal
 * dispositions the process had before dlopen are put back after it (the
 * daemons' SIGTERM drains; their fault handlers stay theirs).  The handle
 * stays open for the process's life.  Only these five functions are
 * libfabric symbols; the rest of its API is inline calls through the ops
 * tables of the objects they return. */
typedef struct {
    int (*getinfo)(uint32_t version, const char *node, const char *service, uint64_t flags,
                   const struct fi_info *hints, struct fi_info **info);
    void (*freeinfo)(struct fi_info *info);
    struct fi_info *(*dupinfo)(const struct fi_info *info);
    int (*fabric)(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context);
    const char *(*strerror)(int errnum);
} epd__fi_api_t;

extern epd__fi_api_t epd__fi; /* epd_xport_ofi_util.c; loaded in epd_xport_ofi.c */

#define EPD__OFI_LOG "ofi"

/* Room for the core's frame header in front of a max_msg_size payload. */
#define EPD__OFI_HDR_ROOM 256
/* Receive and send slots (one fragment each) per worker. */
#define EPD__OFI_RX_SLOTS 256u
#define EPD__OFI_TX_SLOTS 256u
/* Messages being reassembled at once (one per sending endpoint). */
#define EPD__OFI_REASM 64u
/* Fragment size when the provider's in-order limit is not known. */
#define EPD__OFI_FRAG_DEFAULT 8192u
#define EPD__OFI_FRAG_MIN 256u
/* Contexts for posted write parts and flush reads. */
#define EPD__OFI_PARTS 512u
/* Requests beyond config->max_inflight, for orphans awaiting completions. */
#define EPD__OFI_REQ_SPARE 256u
#define EPD__OFI_CQ_BATCH 16
#define EPD__OFI_CQ_BUDGET 64
/* Empty reads before a progress call gives up: rxm handles one entry of its
 * inner (tcp) CQ per fi_cq_read, and that entry may be internal (a
 * connection event, an ack), so one empty read does not mean nothing
 * arrived. */
#define EPD__OFI_CQ_EMPTY_TRIES 4
#define EPD__OFI_SWEEP_BUDGET 32
#define EPD__OFI_MAX_RAW_KEY 256u
#define EPD__OFI_MAX_NAME 1024u

#define EPD__OFI_ADDR_MAGIC 0x4f46494155445045ull /* "EPDUAIFO" */
#define EPD__OFI_RKEY_MAGIC 0x4f46494b45595045ull /* "EPYEKIFO" */
#define EPD__OFI_WIRE_VERSION 1u /* address blobs */
#define EPD__OFI_RKEY_VERSION 2u /* packed keys: 2 added the flush sink */
#define EPD__OFI_SINK_BYTES 64   /* the flush sink's buffer (one byte is read) */
#define EPD__OFI_KEY_TRIES 16    /* random keys drawn before giving up on -FI_ENOKEY */
#define EPD__OFI_PROV_LEN 32
#define EPD__OFI_CHECK_SEED 0x6570645f6f666921ull

#define EPD__OFI_MR_REQUEST                                                                        \
    (FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED | FI_MR_ENDPOINT | FI_MR_RAW)

/* Address blob: this header, then name_len bytes of fi_getname. */
typedef struct {
    uint64_t magic;
    uint16_t version;
    uint16_t hdr_len; /* sizeof(this header) */
    uint32_t name_len;
    uint32_t addr_format;
    uint32_t reserved;
    char prov[EPD__OFI_PROV_LEN]; /* provider name, NUL padded (wire compatibility) */
    uint64_t check;               /* epd__ofi_blob_check of the blob */
} epd__ofi_addr_hdr_t;

/* Packed remote key: this header, then raw_len raw key bytes (FI_MR_RAW),
 * then sink_raw_len raw key bytes of the flush sink. */
typedef struct {
    uint64_t magic;
    uint16_t version;
    uint16_t hdr_len;
    uint32_t raw_len;
    uint64_t base;     /* remote address of offset 0: vaddr (VIRT_ADDR) or 0 */
    uint64_t size;     /* bytes in the region */
    uint64_t key;      /* fi_mr_key, unused with raw keys */
    uint64_t raw_base; /* fi_mr_raw_attr base address, for fi_mr_map_raw */
    uint32_t has_sink; /* 1: the worker has a flush sink (no delivery complete) */
    uint32_t sink_raw_len;
    uint64_t sink_addr; /* remote address of the sink's byte */
    uint64_t sink_key;  /* unused with raw keys */
    uint64_t sink_raw_base;
    uint64_t check;    /* epd__ofi_blob_check of the blob */
} epd__ofi_rkey_hdr_t;

/* In front of every message fragment on the wire. */
typedef struct {
    uint64_t stream; /* the sending endpoint: worker nonce + endpoint serial */
    uint32_t total;  /* bytes of the whole message */
    uint32_t offset; /* of this fragment's bytes in the message */
} epd__ofi_frag_t;

/* The checksum covers everything before `check`, which must end the header. */
_Static_assert(offsetof(epd__ofi_addr_hdr_t, check) + sizeof(uint64_t) ==
                   sizeof(epd__ofi_addr_hdr_t),
               "check ends the address header");
_Static_assert(offsetof(epd__ofi_rkey_hdr_t, check) + sizeof(uint64_t) ==
                   sizeof(epd__ofi_rkey_hdr_t),
               "check ends the key header");

typedef struct epd__ofi epd__ofi_t;
typedef struct epd__ofi_ep epd__ofi_ep_t;

/* A peer address in the AV, shared by every endpoint to that peer.  The
 * name bytes live here as long as the address is in the AV: shm keeps the
 * pointer given to fi_av_insert as the key of its name map (1.17), so they
 * must not move or be freed before fi_av_remove. */
typedef struct epd__ofi_av_entry {
    struct epd__ofi_av_entry *next;
    fi_addr_t addr;
    uint32_t refs;
    size_t name_len;
    unsigned char name[]; /* fi_getname bytes of the peer */
} epd__ofi_av_entry_t;
typedef struct epd__ofi_req epd__ofi_req_t;

typedef enum {
    EPD__OFI_X_RECV = 1,
    EPD__OFI_X_SEND,
    EPD__OFI_X_PART,
} epd__ofi_xkind_t;

/* One posted libfabric operation; its address is the op_context. */
typedef struct epd__ofi_xfer {
    struct fi_context2 ctx; /* first: some providers (FI_CONTEXT2) write here */
    epd__ofi_xkind_t kind;
    struct epd__ofi_xfer *next_free;
    epd__ofi_ep_t *ep;   /* send/part once posted: the endpoint (holds a ref) */
    epd__ofi_req_t *req; /* part: the write or flush it belongs to */
    unsigned char *buf;  /* recv/send: the slot's bytes */
    size_t len;          /* send: wire bytes in buf */
    bool posted;         /* recv: posted to the provider */
} epd__ofi_xfer_t;

typedef enum {
    EPD__OFI_REQ_WRITE = 1,
    EPD__OFI_REQ_FLUSH,
} epd__ofi_rkind_t;

/* A write or flush op held by the backend. */
struct epd__ofi_req {
    epd__ofi_rkind_t kind;
    epd__xport_op_t *op;  /* NULL once completed early (orphan) */
    epd__ofi_ep_t *ep;    /* NULL once orphaned */
    epd__ofi_req_t *prev; /* in ep->writes or ep->flushes */
    epd__ofi_req_t *next; /* ditto, and the free list */
    uint64_t seq;         /* write: ordinal on ep; flush: writes before it */
    const unsigned char *local;
    size_t len;
    size_t posted;  /* bytes handed to the provider so far */
    uint64_t raddr; /* remote address of byte 0 */
    uint64_t key;
    uint64_t sink_addr; /* non-DC: the target's flush sink */
    uint64_t sink_key;
    void *desc;            /* local descriptor (FI_MR_LOCAL) */
    struct fid_mr *tmp_mr; /* on-the-fly registration of local */
    uint32_t parts_out;    /* parts posted and not yet completed */
    uint64_t peer_xid;     /* orphan: the peer its endpoint reached (limbo) */
    bool queued;           /* write: counted in ep->unposted (parts to post) */
    bool reading;          /* flush: its ordering read is posted */
    epd_status_t status;   /* first error */
};

struct epd__ofi_ep {
    epd__ofi_t *be;
    epd_xport_ep_t *core_ep;
    fi_addr_t addr;
    epd__ofi_av_entry_t *av;                /* holds one reference */
    uint64_t stream;                        /* id of our messages to this peer */
    epd__ofi_xfer_t *backlog;               /* fragments copied, not yet posted, */
    epd__ofi_xfer_t *backlog_tail;          /* in order */
    epd__ofi_ep_t *prev, *next;             /* be->eps */
    epd__ofi_req_t *writes, *writes_tail;   /* in seq order */
    epd__ofi_req_t *flushes, *flushes_tail; /* in watermark order */
    uint64_t write_seq;                     /* writes accepted so far */
    uint32_t unposted;                      /* writes with parts still to post */
    uint32_t inflight;                      /* sends and parts posted to the provider */
    epd_status_t failed;                    /* EPD_OK or the failure reported */
    bool fail_reported;
    bool closing;           /* destroyed: a zombie until inflight drops to 0 */
    bool have_flush_target; /* non-DC flush: the peer's sink, to read */
    uint64_t flush_raddr;
    uint64_t flush_key;
    char peer[96];
};

typedef struct {
    epd__ofi_t *be;
    struct fid_mr *mr; /* NULL: a local region on a provider without FI_MR_LOCAL */
    void *addr;
    size_t size;
    void *alloc; /* mr_alloc: the block to free */
    bool remote_write;
    uint64_t key;
    uint64_t raw_base;
    size_t raw_len;
    unsigned char raw[EPD__OFI_MAX_RAW_KEY];
} epd__ofi_mr_t;

typedef struct {
    epd__ofi_t *be;
    const epd__ofi_ep_t *ep; /* compared, never dereferenced */
    uint64_t base;
    uint64_t size;
    uint64_t key;
    uint64_t sink_addr;
    uint64_t sink_key;
    bool mapped;      /* raw key mapped with fi_mr_map_raw */
    bool sink_mapped; /* the sink's raw key too */
} epd__ofi_rkey_t;

typedef struct {
    uint64_t stream;
    uint32_t total;
    uint32_t got;
    uint64_t last_use;
    bool active;
    unsigned char *buf; /* max_total bytes, allocated on first use, kept */
} epd__ofi_reasm_t;

struct epd__ofi {
    epd_xport_t *core;
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_av *av;
    struct fid_cq *cq;
    struct fid_ep *ep;
    int wait_fd; /* -1: no fd from the provider */
    uint64_t mr_mode;
    bool dc; /* writes use FI_DELIVERY_COMPLETE */
    uint64_t key_mask; /* keys we pick stay within the provider's mr_key_size */
    size_t inject_size;
    size_t write_chunk;
    size_t max_total; /* largest message: max_msg_size + header room */
    size_t frag_size; /* wire bytes of a fragment (header included) */
    uint64_t nonce;   /* high bits of our stream ids */
    uint64_t ep_serial;
    epd__ofi_reasm_t reasm[EPD__OFI_REASM];
    uint64_t reasm_clock;

    void *addr_blob;
    size_t addr_len;

    /* receive pool */
    unsigned rx_count;
    unsigned char *rx_bufs;
    struct fid_mr *rx_mr;
    epd__ofi_xfer_t *rx;
    uint32_t rx_unposted;

    /* send pool */
    unsigned tx_count;
    unsigned char *tx_bufs;
    struct fid_mr *tx_mr;
    epd__ofi_xfer_t *tx;
    epd__ofi_xfer_t *tx_free;
    unsigned tx_nfree;
    unsigned char *inject_buf;

    /* write parts and flush reads */
    epd__ofi_xfer_t *parts;
    epd__ofi_xfer_t *parts_free;
    unsigned char *scratch; /* target of flush reads */
    struct fid_mr *scratch_mr;
    /* Non-DC only: the one byte (of EPD__OFI_SINK_BYTES, zero) peers read to
     * order their flushes; FI_REMOTE_READ, the only such registration. */
    struct epd__ofi_sink {
        unsigned char *buf;
        struct fid_mr *mr;
        uint64_t key;
        uint64_t raw_base;
        size_t raw_len;
        unsigned char raw[EPD__OFI_MAX_RAW_KEY];
    } sink;

    epd__ofi_req_t *reqs;
    epd__ofi_req_t *req_free;
    size_t req_count;
    uint32_t n_orphans; /* requests whose op was given back, parts still posted */

    epd__ofi_ep_t *eps;
    /* Destroyed endpoints whose operations the provider still holds: their
     * address stays in the AV until those come back (shm crashes when an
     * address is removed under operations in flight). */
    epd__ofi_ep_t *zombies;
    epd__ofi_av_entry_t *av_entries;
    char desc[256];
};

/* epd_xport_ofi_util.c */
uint64_t epd__ofi_blob_check(const void *hdr, size_t hdr_len, const void *body, size_t body_len);
const char *epd__ofi_prov(const epd__ofi_t *be);
void epd__ofi_mr_mode_str(uint64_t mode, char *buf, size_t len);
epd_status_t epd__ofi_map_err(int err, bool *peer_gone_p);
epd_status_t epd__ofi_post_err(ssize_t ret);
epd_status_t epd__ofi_reg(epd__ofi_t *be, void *addr, size_t size, uint64_t access,
                          struct fid_mr **mr_p);
void *epd__ofi_desc(const epd__ofi_t *be, struct fid_mr *mr);
void epd__ofi_nudge(epd__ofi_t *be);
epd__ofi_req_t *epd__ofi_req_get(epd__ofi_t *be);
void epd__ofi_req_put(epd__ofi_t *be, epd__ofi_req_t *req);
epd__ofi_xfer_t *epd__ofi_part_get(epd__ofi_t *be, epd__ofi_req_t *req);
void epd__ofi_part_put(epd__ofi_t *be, epd__ofi_xfer_t *x);
void epd__ofi_list_append(epd__ofi_req_t **head, epd__ofi_req_t **tail, epd__ofi_req_t *req);
void epd__ofi_list_remove(epd__ofi_req_t **head, epd__ofi_req_t **tail, epd__ofi_req_t *req);
void epd__ofi_ep_fail(epd__ofi_ep_t *ep, epd_status_t status);
bool epd__ofi_is_shm(const char *prov);
epd_status_t epd__ofi_ep_state(const epd__ofi_ep_t *ep);

/* epd_xport_ofi_msg.c */
void epd__ofi_post_recvs(epd__ofi_t *be);
void epd__ofi_tx_put(epd__ofi_t *be, epd__ofi_xfer_t *x);
epd_status_t epd__ofi_backlog_post(epd__ofi_t *be, epd__ofi_ep_t *ep);
void epd__ofi_recv_frag(epd__ofi_t *be, const unsigned char *buf, size_t len);
epd_status_t epd__ofi_send(void *arg, const void *hdr, size_t hdr_len, const void *payload,
                           size_t len);

/* epd_xport_ofi_rma.c */
void epd__ofi_write_finish(epd__ofi_t *be, epd__ofi_req_t *req);
void epd__ofi_flush_finish(epd__ofi_t *be, epd__ofi_req_t *req, epd_status_t status);
bool epd__ofi_ep_has_work(const epd__ofi_t *be, const epd__ofi_ep_t *ep);
int epd__ofi_sweep(epd__ofi_t *be);
epd_status_t epd__ofi_write(void *arg, const void *local, size_t len, void *be_local_mr,
                            void *be_rkey, uint64_t remote_offset, epd__xport_op_t *op);
epd_status_t epd__ofi_flush(void *arg, epd__xport_op_t *op);

/* epd_xport_ofi_comp.c */
void epd__ofi_ep_free(epd__ofi_t *be, epd__ofi_ep_t *ep);
int epd__ofi_progress(void *arg);
epd_status_t epd__ofi_get_fd(void *arg, int *fd_p);
epd_status_t epd__ofi_arm(void *arg);

/* epd_xport_ofi_mr.c */
epd_status_t epd__ofi_mr_reg(void *arg, void *addr, size_t size, unsigned access, void **be_mr_p);
epd_status_t epd__ofi_mr_alloc(void *arg, size_t size, unsigned access, void **addr_p,
                               void **be_mr_p);
void epd__ofi_mr_dereg(void *arg, void *be_mr);
epd_status_t epd__ofi_mr_pack(void *arg, void *be_mr, void *buf, size_t cap, size_t *len_p);
epd_status_t epd__ofi_grant_open(void *arg, void *be_mr, epd_xport_grant_t *core_grant,
                                 void **be_grant_p);
epd_status_t epd__ofi_grant_pack(void *arg, void *be_grant, void *buf, size_t cap, size_t *len_p);
epd_status_t epd__ofi_grant_revoke(void *arg, void *be_grant, int writer_same_host);
int epd__ofi_grant_settled(void *arg, void *be_grant);
void epd__ofi_grant_close(void *arg, void *be_grant);
epd_status_t epd__ofi_rkey_unpack(void *arg, const void *blob, size_t len, void **be_rkey_p,
                                  size_t *size_p);
void epd__ofi_rkey_destroy(void *be_rkey);

/* epd_xport_ofi_ep.c */
epd_status_t epd__ofi_ep_create(void *arg, const void *blob, size_t len, epd_xport_ep_t *core_ep,
                                void **be_ep_p);
void epd__ofi_ep_destroy(void *arg);
void epd__ofi_ep_describe(void *arg, char *buf, size_t len, const char **class_p);
uint32_t epd__ofi_limbo(void *arg, uint64_t peer_xid);

#endif
