/*
 * epd_xport_ofi.c — the libfabric backend of the transport (ops contract in
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

static epd__fi_api_t epd__fi;
static pthread_once_t epd__fi_once = PTHREAD_ONCE_INIT;
static char epd__fi_error[256]; /* empty: loaded */

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

/* ---------------------------------------------------------------- helpers */

/* Checksum of a blob: its header (whose last 8 bytes, the check field,
 * count as zero) then its body.  Catches torn or corrupted blobs that would
 * otherwise parse (a flipped bit in a size or key). */
static uint64_t epd__ofi_blob_check(const void *hdr, size_t hdr_len, const void *body,
                                    size_t body_len)
{
    uint64_t h = epd_hash64(hdr, hdr_len - sizeof(uint64_t), EPD__OFI_CHECK_SEED);

    return epd_hash64(body, body_len, h);
}

static const char *epd__ofi_prov(const epd__ofi_t *be)
{
    return be->info->fabric_attr->prov_name != NULL ? be->info->fabric_attr->prov_name : "?";
}

static void epd__ofi_mr_mode_str(uint64_t mode, char *buf, size_t len)
{
    static const struct {
        uint64_t bit;
        const char *name;
    } bits[] = {
        {FI_MR_LOCAL, "LOCAL"},
        {FI_MR_RAW, "RAW"},
        {FI_MR_VIRT_ADDR, "VIRT_ADDR"},
        {FI_MR_ALLOCATED, "ALLOCATED"},
        {FI_MR_PROV_KEY, "PROV_KEY"},
        {FI_MR_ENDPOINT, "ENDPOINT"},
        {FI_MR_MMU_NOTIFY, "MMU_NOTIFY"},
        {FI_MR_RMA_EVENT, "RMA_EVENT"},
        {FI_MR_HMEM, "HMEM"},
    };
    size_t off = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < sizeof(bits) / sizeof(bits[0]); i++) {
        if ((mode & bits[i].bit) != 0 && off < len) {
            int n = snprintf(buf + off, len - off, "%s%s", off != 0 ? "|" : "", bits[i].name);
            if (n > 0) {
                off += (size_t)n;
            }
        }
    }
    if (off == 0) {
        snprintf(buf, len, "0");
    }
}

/* Maps a libfabric error (positive FI_E* value) to a status, and says
 * whether it means the peer is gone. */
static epd_status_t epd__ofi_map_err(int err, bool *peer_gone_p)
{
    *peer_gone_p = false;
    switch (err) {
    case FI_ECONNREFUSED:
    case FI_EHOSTUNREACH:
    case FI_ENETUNREACH:
    case FI_EADDRNOTAVAIL:
    case FI_ETIMEDOUT:
    case FI_EHOSTDOWN:
    case FI_ENETDOWN:
        *peer_gone_p = true;
        return EPD_ERR_UNREACHABLE;
    case FI_ECONNRESET:
    case FI_ENOTCONN:
    case FI_ECONNABORTED:
    case EPIPE:
    case FI_ESHUTDOWN:
    case FI_ECANCELED:
    case FI_EIO:
        *peer_gone_p = true;
        return EPD_ERR_PEER_DEAD;
    case FI_ETRUNC:
    case FI_EMSGSIZE:
        return EPD_ERR_TOO_LONG;
    case FI_EAGAIN:
        return EPD_ERR_NO_RESOURCE;
    case FI_ENOMEM:
        return EPD_ERR_NO_MEMORY;
    default:
        return EPD_ERR_TRANSPORT;
    }
}

/* A status for a negative return of a posting call other than -FI_EAGAIN. */
static epd_status_t epd__ofi_post_err(ssize_t ret)
{
    bool gone;

    return epd__ofi_map_err((int)-ret, &gone);
}

static epd_status_t epd__ofi_reg(epd__ofi_t *be, void *addr, size_t size, uint64_t access,
                                 struct fid_mr **mr_p)
{
    struct fid_mr *mr = NULL;
    uint64_t key = 0;
    int ret;

    for (int tries = 0;; tries++) {
        if ((be->mr_mode & FI_MR_PROV_KEY) == 0) {
            randombytes_buf(&key, sizeof(key));
            key &= be->key_mask;
        }
        ret = fi_mr_reg(be->domain, addr, size, access, 0, key, 0, &mr, NULL);
        if (ret != -FI_ENOKEY || (be->mr_mode & FI_MR_PROV_KEY) != 0 ||
            tries + 1 >= EPD__OFI_KEY_TRIES) {
            break;
        }
    }
    if (ret != 0) {
        epd_log_error(EPD__OFI_LOG, 0, "fi_mr_reg(%zu bytes) failed: %s", size,
                      epd__fi.strerror(-ret));
        return ret == -FI_ENOMEM ? EPD_ERR_NO_MEMORY : EPD_ERR_TRANSPORT;
    }
    if ((be->mr_mode & FI_MR_ENDPOINT) != 0) {
        ret = fi_mr_bind(mr, &be->ep->fid, 0);
        if (ret == 0) {
            ret = fi_mr_enable(mr);
        }
        if (ret != 0) {
            epd_log_error(EPD__OFI_LOG, 0, "fi_mr_bind/enable failed: %s", epd__fi.strerror(-ret));
            fi_close(&mr->fid);
            return EPD_ERR_TRANSPORT;
        }
    }
    *mr_p = mr;
    return EPD_OK;
}

static void *epd__ofi_desc(const epd__ofi_t *be, struct fid_mr *mr)
{
    return ((be->mr_mode & FI_MR_LOCAL) != 0 && mr != NULL) ? fi_mr_desc(mr) : NULL;
}

/* Progresses the provider without consuming completions (no upcall runs):
 * util-based CQs run their progress function on every read. */
static void epd__ofi_nudge(epd__ofi_t *be)
{
    (void)fi_cq_read(be->cq, NULL, 0);
}

/* ---------------------------------------------------------------- pools */

static epd__ofi_req_t *epd__ofi_req_get(epd__ofi_t *be)
{
    epd__ofi_req_t *req = be->req_free;

    if (req != NULL) {
        be->req_free = req->next;
        memset(req, 0, sizeof(*req));
    }
    return req;
}

static void epd__ofi_req_put(epd__ofi_t *be, epd__ofi_req_t *req)
{
    if (req->tmp_mr != NULL) {
        fi_close(&req->tmp_mr->fid);
        req->tmp_mr = NULL;
    }
    req->op = NULL;
    req->ep = NULL;
    req->next = be->req_free;
    be->req_free = req;
}

static epd__ofi_xfer_t *epd__ofi_part_get(epd__ofi_t *be, epd__ofi_req_t *req)
{
    epd__ofi_xfer_t *x = be->parts_free;

    if (x != NULL) {
        be->parts_free = x->next_free;
        x->req = req;
    }
    return x;
}

static void epd__ofi_part_put(epd__ofi_t *be, epd__ofi_xfer_t *x)
{
    x->req = NULL;
    x->ep = NULL;
    x->next_free = be->parts_free;
    be->parts_free = x;
}

/* Doubly linked request lists (head/tail). */
static void epd__ofi_list_append(epd__ofi_req_t **head, epd__ofi_req_t **tail, epd__ofi_req_t *req)
{
    req->next = NULL;
    req->prev = *tail;
    if (*tail != NULL) {
        (*tail)->next = req;
    } else {
        *head = req;
    }
    *tail = req;
}

static void epd__ofi_list_remove(epd__ofi_req_t **head, epd__ofi_req_t **tail, epd__ofi_req_t *req)
{
    if (req->prev != NULL) {
        req->prev->next = req->next;
    } else {
        *head = req->next;
    }
    if (req->next != NULL) {
        req->next->prev = req->prev;
    } else {
        *tail = req->prev;
    }
    req->prev = NULL;
    req->next = NULL;
}

/* ---------------------------------------------------------------- receives */

static void epd__ofi_post_recvs(epd__ofi_t *be)
{
    void *desc = epd__ofi_desc(be, be->rx_mr);

    if (be->rx_unposted == 0) {
        return;
    }
    for (unsigned i = 0; i < be->rx_count; i++) {
        epd__ofi_xfer_t *x = &be->rx[i];
        ssize_t ret;

        if (x->posted) {
            continue;
        }
        ret = fi_recv(be->ep, x->buf, be->frag_size, desc, FI_ADDR_UNSPEC, x);
        if (ret == -FI_EAGAIN) {
            return; /* retried from the next progress */
        }
        if (ret != 0) {
            epd_log_error(EPD__OFI_LOG, 0, "fi_recv failed: %s", epd__fi.strerror((int)-ret));
            return;
        }
        x->posted = true;
        be->rx_unposted--;
    }
}

/* ---------------------------------------------------------------- sends */

/* Copies bytes [off, off+n) of the message hdr ++ payload to dst. */
static void epd__ofi_gather(unsigned char *dst, const void *hdr, size_t hdr_len,
                            const void *payload, size_t off, size_t n)
{
    if (off < hdr_len) {
        size_t k = hdr_len - off < n ? hdr_len - off : n;

        memcpy(dst, (const unsigned char *)hdr + off, k);
        dst += k;
        off += k;
        n -= k;
    }
    if (n != 0) {
        memcpy(dst, (const unsigned char *)payload + (off - hdr_len), n);
    }
}

static void epd__ofi_tx_put(epd__ofi_t *be, epd__ofi_xfer_t *x)
{
    x->ep = NULL;
    x->next_free = be->tx_free;
    be->tx_free = x;
    be->tx_nfree++;
}

/* Posts the fragments of ep's backlog in order until the provider pushes
 * back.  EPD_OK (empty), EPD_ERR_NO_RESOURCE, or the error that stopped it
 * (the rest is dropped: the peer would get a torn message, so the caller
 * fails the endpoint). */
static epd_status_t epd__ofi_backlog_post(epd__ofi_t *be, epd__ofi_ep_t *ep)
{
    void *desc = epd__ofi_desc(be, be->tx_mr);
    epd__ofi_xfer_t *x;

    while ((x = ep->backlog) != NULL) {
        ssize_t ret = fi_send(be->ep, x->buf, x->len, desc, ep->addr, x);

        if (ret == -FI_EAGAIN) {
            return EPD_ERR_NO_RESOURCE;
        }
        ep->backlog = x->next_free;
        if (ep->backlog == NULL) {
            ep->backlog_tail = NULL;
        }
        x->next_free = NULL;
        if (ret != 0) {
            epd_log_error(EPD__OFI_LOG, 0, "fi_send(%zu bytes) to %s failed: %s", x->len, ep->peer,
                          epd__fi.strerror((int)-ret));
            epd__ofi_tx_put(be, x);
            while ((x = ep->backlog) != NULL) {
                ep->backlog = x->next_free;
                epd__ofi_tx_put(be, x);
            }
            ep->backlog_tail = NULL;
            return epd__ofi_post_err(ret);
        }
        x->ep = ep;
        ep->inflight++;
    }
    return EPD_OK;
}

/* ---------------------------------------------------------------- endpoints */

/* Reports the failure of `ep` once.  The core may destroy the endpoint from
 * inside the upcall: callers must not touch `ep` afterwards. */
static void epd__ofi_ep_fail(epd__ofi_ep_t *ep, epd_status_t status)
{
    if (ep->failed == EPD_OK) {
        ep->failed = status;
    }
    if (!ep->fail_reported) {
        ep->fail_reported = true;
        if (ep->closing) {
            return;
        }
        epd_log_warn(EPD__OFI_LOG, 0, "endpoint to %s failed: %s", ep->peer,
                     epd_status_string(status));
        epd__xport_ep_failed(ep->core_ep, status);
    }
}

/* The lowest write ordinal still outstanding on ep. */
static uint64_t epd__ofi_oldest_write(const epd__ofi_ep_t *ep)
{
    return ep->writes != NULL ? ep->writes->seq : ep->write_seq;
}

/* Finishes a write whose parts are all done: unlinks, frees, completes.
 * Runs an upcall. */
static void epd__ofi_write_finish(epd__ofi_t *be, epd__ofi_req_t *req)
{
    epd__xport_op_t *op = req->op;
    epd_status_t status = req->status;
    epd__ofi_ep_t *ep = req->ep;

    if (ep != NULL) {
        epd__ofi_list_remove(&ep->writes, &ep->writes_tail, req);
    }
    epd__ofi_req_put(be, req);
    if (op != NULL) {
        epd__xport_op_done(op, status);
    }
}

static void epd__ofi_flush_finish(epd__ofi_t *be, epd__ofi_req_t *req, epd_status_t status)
{
    epd__xport_op_t *op = req->op;
    epd__ofi_ep_t *ep = req->ep;

    if (ep != NULL) {
        epd__ofi_list_remove(&ep->flushes, &ep->flushes_tail, req);
    }
    epd__ofi_req_put(be, req);
    if (op != NULL) {
        epd__xport_op_done(op, status);
    }
}

/* Posts as many remaining parts of `req` as the provider takes.  Returns
 * EPD_OK (all posted), EPD_ERR_NO_RESOURCE (some remain: retry later) or an
 * error (posting stopped; req->status set). */
static epd_status_t epd__ofi_write_post(epd__ofi_t *be, epd__ofi_req_t *req)
{
    uint64_t flags = FI_COMPLETION | (be->dc ? FI_DELIVERY_COMPLETE : 0);

    while (req->posted < req->len) {
        size_t chunk = req->len - req->posted;
        epd__ofi_xfer_t *x;
        struct iovec iov;
        struct fi_rma_iov riov;
        struct fi_msg_rma msg;
        ssize_t ret;

        if (chunk > be->write_chunk) {
            chunk = be->write_chunk;
        }
        x = epd__ofi_part_get(be, req);
        if (x == NULL) {
            return EPD_ERR_NO_RESOURCE;
        }
        iov.iov_base = (void *)(req->local + req->posted);
        iov.iov_len = chunk;
        riov.addr = req->raddr + req->posted;
        riov.len = chunk;
        riov.key = req->key;
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = &iov;
        msg.desc = &req->desc;
        msg.iov_count = 1;
        msg.addr = req->ep->addr;
        msg.rma_iov = &riov;
        msg.rma_iov_count = 1;
        msg.context = x;
        ret = fi_writemsg(be->ep, &msg, flags);
        if (ret != 0) {
            epd__ofi_part_put(be, x);
            if (ret == -FI_EAGAIN) {
                epd_log_trace(EPD__OFI_LOG, 0, "fi_writemsg(%zu bytes) to %s: pushed back", chunk,
                              req->ep->peer);
                return EPD_ERR_NO_RESOURCE;
            }
            epd_log_error(EPD__OFI_LOG, 0, "fi_writemsg(%zu bytes) to %s failed: %s", chunk,
                          req->ep->peer, epd__fi.strerror((int)-ret));
            if (req->status == EPD_OK) {
                req->status = epd__ofi_post_err(ret);
            }
            return req->status;
        }
        req->parts_out++;
        req->posted += chunk;
        x->ep = req->ep;
        req->ep->inflight++;
        if (!be->dc) {
            req->ep->have_flush_target = true;
            req->ep->flush_raddr = req->sink_addr;
            req->ep->flush_key = req->sink_key;
        }
    }
    return EPD_OK;
}

/* Posts the ordering read of a flush (non-DC providers). */
static epd_status_t epd__ofi_flush_read(epd__ofi_t *be, epd__ofi_req_t *req)
{
    epd__ofi_ep_t *ep = req->ep;
    epd__ofi_xfer_t *x = epd__ofi_part_get(be, req);
    ssize_t ret;

    if (x == NULL) {
        return EPD_ERR_NO_RESOURCE;
    }
    ret = fi_read(be->ep, be->scratch, 1, epd__ofi_desc(be, be->scratch_mr), ep->addr,
                  ep->flush_raddr, ep->flush_key, x);
    if (ret != 0) {
        epd__ofi_part_put(be, x);
        if (ret == -FI_EAGAIN) {
            return EPD_ERR_NO_RESOURCE;
        }
        epd_log_error(EPD__OFI_LOG, 0, "fi_read (flush) from %s failed: %s", ep->peer,
                      epd__fi.strerror((int)-ret));
        return epd__ofi_post_err(ret);
    }
    req->parts_out++;
    req->reading = true;
    x->ep = ep;
    ep->inflight++;
    return EPD_OK;
}

/* Does the queued work of one endpoint: posts pending write parts, retires
 * ready flushes.  Returns true after running an upcall (the endpoint list
 * may have changed: the caller restarts its walk). */
static bool epd__ofi_ep_sweep(epd__ofi_t *be, epd__ofi_ep_t *ep)
{
    if (ep->backlog != NULL) {
        epd_status_t status = ep->failed;

        if (status == EPD_OK) {
            status = epd__ofi_backlog_post(be, ep);
        }
        if (status != EPD_OK && status != EPD_ERR_NO_RESOURCE) {
            epd__ofi_xfer_t *x;

            while ((x = ep->backlog) != NULL) {
                ep->backlog = x->next_free;
                epd__ofi_tx_put(be, x);
            }
            ep->backlog_tail = NULL;
            if (ep->failed == EPD_OK) {
                ep->failed = status;
            }
        }
    }
    if (ep->failed != EPD_OK && !ep->fail_reported) {
        epd__ofi_ep_fail(ep, ep->failed);
        return true;
    }
    if (ep->unposted != 0) {
        for (epd__ofi_req_t *req = ep->writes; req != NULL; req = req->next) {
            epd_status_t status;

            if (!req->queued) {
                continue;
            }
            if (ep->failed != EPD_OK) {
                status = ep->failed;
                if (req->status == EPD_OK) {
                    req->status = status;
                }
            } else {
                status = epd__ofi_write_post(be, req);
                if (status == EPD_ERR_NO_RESOURCE) {
                    break;
                }
            }
            /* all posted, or posting stopped for good */
            if (status != EPD_OK) {
                req->posted = req->len;
            }
            req->queued = false;
            ep->unposted--;
            if (req->parts_out == 0) {
                epd__ofi_write_finish(be, req);
                return true;
            }
        }
    }

    if (ep->flushes != NULL) {
        epd__ofi_req_t *req = ep->flushes;

        if (ep->failed != EPD_OK && !req->reading) {
            epd__ofi_flush_finish(be, req, ep->failed);
            return true;
        }
        if (req->reading || epd__ofi_oldest_write(ep) < req->seq) {
            return false;
        }
        if (!be->dc && ep->have_flush_target) {
            epd_status_t status = epd__ofi_flush_read(be, req);

            if (status == EPD_OK || status == EPD_ERR_NO_RESOURCE) {
                return false;
            }
            epd__ofi_flush_finish(be, req, status);
            return true;
        }
        epd__ofi_flush_finish(be, req, EPD_OK);
        return true;
    }
    return false;
}

static bool epd__ofi_ep_has_work(const epd__ofi_t *be, const epd__ofi_ep_t *ep)
{
    const epd__ofi_req_t *req = ep->flushes;

    if (ep->unposted != 0 || ep->backlog != NULL || (ep->failed != EPD_OK && !ep->fail_reported)) {
        return true;
    }
    if (req == NULL || req->reading) {
        return false;
    }
    (void)be;
    return ep->failed != EPD_OK || epd__ofi_oldest_write(ep) >= req->seq;
}

static int epd__ofi_sweep(epd__ofi_t *be)
{
    int n = 0;

again:
    for (epd__ofi_ep_t *ep = be->eps; ep != NULL && n < EPD__OFI_SWEEP_BUDGET; ep = ep->next) {
        if (!epd__ofi_ep_has_work(be, ep)) {
            continue;
        }
        if (epd__ofi_ep_sweep(be, ep)) {
            n++;
            goto again;
        }
    }
    return n;
}

/* ---------------------------------------------------------------- completions */

static void epd__ofi_part_done(epd__ofi_t *be, epd__ofi_xfer_t *x, epd_status_t status)
{
    epd__ofi_req_t *req = x->req;

    epd__ofi_part_put(be, x);
    req->parts_out--;
    if (status != EPD_OK && req->status == EPD_OK) {
        req->status = status;
    }
    if (req->parts_out != 0) {
        return;
    }
    if (req->op == NULL) {
        /* orphan: its op completed when its endpoint was destroyed */
        be->n_orphans--;
        epd__ofi_req_put(be, req);
        return;
    }
    if (req->kind == EPD__OFI_REQ_FLUSH) {
        epd__ofi_flush_finish(be, req, req->status);
        return;
    }
    if (!req->queued) {
        epd__ofi_write_finish(be, req);
    } else if (req->status != EPD_OK && req->ep != NULL) {
        /* an error while parts remain: give up on the rest */
        req->posted = req->len;
        req->queued = false;
        req->ep->unposted--;
        epd__ofi_write_finish(be, req);
    }
}

/* Drops an endpoint's reference on its address; the last one removes the
 * address from the AV (once per distinct address: shm's fi_av_remove drops
 * the peer on the first remove, whatever the insert count). */
static void epd__ofi_av_unref(epd__ofi_t *be, epd__ofi_av_entry_t *e)
{
    epd__ofi_av_entry_t **pp;
    int ret;

    if (--e->refs != 0) {
        return;
    }
    if (be->av != NULL) {
        ret = fi_av_remove(be->av, &e->addr, 1, 0);
        if (ret != 0) {
            epd_log_warn(EPD__OFI_LOG, 0, "fi_av_remove(fi_addr %llu): %s",
                         (unsigned long long)e->addr, epd__fi.strerror(-ret));
        }
    }
    for (pp = &be->av_entries; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    }
    epd_free(e);
}

/* Frees a destroyed endpoint (already unlinked). */
static void epd__ofi_ep_free(epd__ofi_t *be, epd__ofi_ep_t *ep)
{
    epd__ofi_av_unref(be, ep->av);
    epd_free(ep);
}

/* Drops the reference of a completed send or part on its endpoint. */
static void epd__ofi_ep_unref(epd__ofi_t *be, epd__ofi_ep_t *ep)
{
    if (ep == NULL) {
        return;
    }
    ep->inflight--;
    if (ep->closing && ep->inflight == 0) {
        if (ep->prev != NULL) {
            ep->prev->next = ep->next;
        } else {
            be->zombies = ep->next;
        }
        if (ep->next != NULL) {
            ep->next->prev = ep->prev;
        }
        epd__ofi_ep_free(be, ep);
    }
}

static epd__ofi_reasm_t *epd__ofi_reasm_find(epd__ofi_t *be, uint64_t stream, bool make)
{
    epd__ofi_reasm_t *victim = NULL;

    for (unsigned i = 0; i < EPD__OFI_REASM; i++) {
        epd__ofi_reasm_t *r = &be->reasm[i];

        if (r->active && r->stream == stream) {
            return r;
        }
        if (victim == NULL || (victim->active && (!r->active || r->last_use < victim->last_use))) {
            victim = r;
        }
    }
    if (!make) {
        return NULL;
    }
    if (victim->active) {
        epd_log_error(EPD__OFI_LOG, 0,
                      "more than %u messages in reassembly: dropping a partial one of %u bytes",
                      EPD__OFI_REASM, victim->total);
        victim->active = false;
    }
    if (victim->buf == NULL) {
        victim->buf = epd_malloc(be->max_total);
        if (victim->buf == NULL) {
            return NULL;
        }
    }
    return victim;
}

/* A fragment arrived in buf[0..len): deliver it, or the message it
 * completes.  Fragments of one stream arrive in order (they are all below
 * the provider's in-order size). */
static void epd__ofi_recv_frag(epd__ofi_t *be, const unsigned char *buf, size_t len)
{
    epd__ofi_frag_t fh;
    epd__ofi_reasm_t *r;
    size_t n;

    if (len < sizeof(fh)) {
        epd_log_warn(EPD__OFI_LOG, 0, "dropped a %zu-byte message: no fragment header", len);
        return;
    }
    memcpy(&fh, buf, sizeof(fh));
    n = len - sizeof(fh);
    if (n == 0 || fh.total == 0 || fh.total > be->max_total || fh.offset >= fh.total ||
        n > fh.total - fh.offset) {
        epd_log_warn(EPD__OFI_LOG, 0, "dropped a malformed fragment (%zu bytes, at %u of %u)", len,
                     fh.offset, fh.total);
        return;
    }
    if (fh.offset == 0 && n == fh.total) {
        epd__xport_deliver(be->core, buf + sizeof(fh), n);
        return;
    }
    r = epd__ofi_reasm_find(be, fh.stream, fh.offset == 0);
    if (fh.offset == 0) {
        if (r == NULL) {
            epd_log_error(EPD__OFI_LOG, 0, "no memory to reassemble a %u-byte message", fh.total);
            return;
        }
        if (r->active) {
            epd_log_warn(EPD__OFI_LOG, 0, "dropped a partial %u-byte message (new one began)",
                         r->total);
        }
        r->stream = fh.stream;
        r->total = fh.total;
        r->got = 0;
        r->active = true;
    } else if (r == NULL || r->got != fh.offset || r->total != fh.total) {
        epd_log_warn(EPD__OFI_LOG, 0, "dropped a fragment out of sequence (at %u of %u)", fh.offset,
                     fh.total);
        if (r != NULL) {
            r->active = false;
        }
        return;
    }
    memcpy(r->buf + fh.offset, buf + sizeof(fh), n);
    r->got += (uint32_t)n;
    r->last_use = ++be->reasm_clock;
    if (r->got == r->total) {
        r->active = false;
        epd__xport_deliver(be->core, r->buf, r->total);
    }
}

static void epd__ofi_handle(epd__ofi_t *be, void *ctx, size_t len, epd_status_t status,
                            bool peer_gone)
{
    epd__ofi_xfer_t *x = ctx;
    epd__ofi_ep_t *ep;

    switch (x->kind) {
    case EPD__OFI_X_RECV:
        x->posted = false;
        be->rx_unposted++;
        if (status == EPD_OK) {
            epd__ofi_recv_frag(be, x->buf, len);
        }
        return;
    case EPD__OFI_X_SEND:
        ep = x->ep;
        if (status != EPD_OK && peer_gone && ep != NULL) {
            /* may destroy the endpoint: it then lives on as a zombie, as
             * this send still holds a reference */
            epd__ofi_ep_fail(ep, status);
        }
        epd__ofi_tx_put(be, x);
        epd__ofi_ep_unref(be, ep);
        return;
    case EPD__OFI_X_PART:
        ep = x->ep;
        if (status == EPD_OK && x->req->ep != NULL &&
            (be->dc || x->req->kind == EPD__OFI_REQ_FLUSH)) {
            /* the peer placed the data (or answered the read): alive */
            epd__xport_ep_alive(x->req->ep->core_ep);
        }
        if (status != EPD_OK && peer_gone && x->req->ep != NULL) {
            /* may destroy the endpoint; x->req survives (parts_out > 0) */
            epd__ofi_ep_fail(x->req->ep, status);
        }
        epd__ofi_part_done(be, x, status);
        epd__ofi_ep_unref(be, ep);
        return;
    }
}

static int epd__ofi_read_cq(epd__ofi_t *be)
{
    struct fi_cq_data_entry entries[EPD__OFI_CQ_BATCH];
    int handled = 0;
    int empty = 0;

    while (handled < EPD__OFI_CQ_BUDGET) {
        ssize_t n = fi_cq_read(be->cq, entries, EPD__OFI_CQ_BATCH);

        if (n == -FI_EAGAIN) {
            if (++empty >= EPD__OFI_CQ_EMPTY_TRIES) {
                break;
            }
            continue;
        }
        empty = 0;
        if (n == -FI_EAVAIL) {
            struct fi_cq_err_entry err;
            char text[256];
            epd_status_t status;
            bool gone;

            memset(&err, 0, sizeof(err));
            n = fi_cq_readerr(be->cq, &err, 0);
            if (n != 1) {
                break;
            }
            handled++;
            status = epd__ofi_map_err(err.err, &gone);
            if (err.op_context == NULL) {
                epd_log_warn(
                    EPD__OFI_LOG, 0, "completion error without context: %s (%s)",
                    epd__fi.strerror(err.err),
                    fi_cq_strerror(be->cq, err.prov_errno, err.err_data, text, sizeof(text)));
                continue;
            }
            if (((epd__ofi_xfer_t *)err.op_context)->kind != EPD__OFI_X_RECV ||
                err.err != FI_ECANCELED) {
                epd_log_debug(
                    EPD__OFI_LOG, 0, "completion error: %s (%s)", epd__fi.strerror(err.err),
                    fi_cq_strerror(be->cq, err.prov_errno, err.err_data, text, sizeof(text)));
            }
            epd__ofi_handle(be, err.op_context, 0, status, gone);
            continue;
        }
        if (n < 0) {
            epd_log_error(EPD__OFI_LOG, 0, "fi_cq_read failed: %s", epd__fi.strerror((int)-n));
            break;
        }
        for (ssize_t i = 0; i < n; i++) {
            if (entries[i].op_context != NULL) {
                epd__ofi_handle(be, entries[i].op_context, entries[i].len, EPD_OK, false);
            }
        }
        handled += (int)n;
    }
    return handled;
}

/* ---------------------------------------------------------------- ops: worker */

static void epd__ofi_close_all(epd__ofi_t *be)
{
    /* Order matters: the endpoint first (it cancels what is posted), then
     * what it was bound to, the regions, the domain, the fabric.  A shm
     * process that skips fi_close leaves its POSIX shm segment behind. */
    if (be->ep != NULL) {
        fi_close(&be->ep->fid);
        be->ep = NULL;
    }
    if (be->av != NULL) {
        fi_close(&be->av->fid);
        be->av = NULL;
    }
    if (be->cq != NULL) {
        fi_close(&be->cq->fid);
        be->cq = NULL;
    }
    for (size_t i = 0; be->reqs != NULL && i < be->req_count; i++) {
        if (be->reqs[i].tmp_mr != NULL) {
            fi_close(&be->reqs[i].tmp_mr->fid);
            be->reqs[i].tmp_mr = NULL;
        }
    }
    if (be->rx_mr != NULL) {
        fi_close(&be->rx_mr->fid);
        be->rx_mr = NULL;
    }
    if (be->tx_mr != NULL) {
        fi_close(&be->tx_mr->fid);
        be->tx_mr = NULL;
    }
    if (be->scratch_mr != NULL) {
        fi_close(&be->scratch_mr->fid);
        be->scratch_mr = NULL;
    }
    if (be->sink.mr != NULL) {
        fi_close(&be->sink.mr->fid);
        be->sink.mr = NULL;
    }
    if (be->domain != NULL) {
        fi_close(&be->domain->fid);
        be->domain = NULL;
    }
    if (be->fabric != NULL) {
        fi_close(&be->fabric->fid);
        be->fabric = NULL;
    }
    if (be->info != NULL) {
        epd__fi.freeinfo(be->info);
        be->info = NULL;
    }
}

static void epd__ofi_free_mem(epd__ofi_t *be)
{
    epd_free(be->addr_blob);
    epd_free(be->rx_bufs);
    epd_free(be->rx);
    epd_free(be->tx_bufs);
    epd_free(be->tx);
    epd_free(be->inject_buf);
    epd_free(be->parts);
    epd_free(be->scratch);
    epd_free(be->sink.buf);
    epd_free(be->reqs);
    for (unsigned i = 0; i < EPD__OFI_REASM; i++) {
        epd_free(be->reasm[i].buf);
    }
    epd_free(be);
}

/* Whether a provider name ("shm", "shm;ofi_...") has shm as its core. */
static bool epd__ofi_is_shm(const char *prov)
{
    return prov != NULL && strncmp(prov, "shm", 3) == 0 && (prov[3] == '\0' || prov[3] == ';');
}

static size_t epd__ofi_env_size(const char *name)
{
    const char *text = getenv(name);
    char *end;
    unsigned long long v;

    if (text == NULL || *text == '\0') {
        return 0;
    }
    errno = 0;
    v = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || v == 0 || v > SIZE_MAX) {
        epd_log_warn(EPD__OFI_LOG, 0, "ignoring %s=%s (want bytes > 0)", name, text);
        return 0;
    }
    return (size_t)v;
}

/*
 * The largest message the provider delivers in order with the messages
 * around it.  rxm sends messages up to its eager limit through bounce
 * buffers in order, but larger ones through segmentation or rendezvous
 * protocols whose receive completions arrive hundreds of messages late
 * (measured on tcp;ofi_rxm 1.17), so messages are cut into fragments that
 * stay eager.  shm keeps order up to its inject size.
 */
static size_t epd__ofi_frag_limit(const epd__ofi_t *be)
{
    const char *prov = epd__ofi_prov(be);
    size_t v;

    if (strstr(prov, "ofi_rxm") != NULL) {
        v = epd__ofi_env_size("FI_OFI_RXM_EAGER_LIMIT");
        if (v == 0) {
            v = epd__ofi_env_size("FI_OFI_RXM_BUFFER_SIZE");
        }
        return v != 0 ? v : 16384;
    }
    if (epd__ofi_is_shm(prov)) {
        return be->info->tx_attr->inject_size != 0 ? be->info->tx_attr->inject_size
                                                   : EPD__OFI_FRAG_DEFAULT;
    }
    return EPD__OFI_FRAG_DEFAULT;
}

static void epd__fi_load(void)
{
    static struct sigaction before[NSIG];
    static bool had[NSIG];
    void *h;

    for (int sig = 1; sig < NSIG; sig++) {
        had[sig] = sigaction(sig, NULL, &before[sig]) == 0;
    }
    h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction now;

        if (had[sig] && sigaction(sig, NULL, &now) == 0 &&
            (now.sa_handler != before[sig].sa_handler || now.sa_flags != before[sig].sa_flags)) {
            sigaction(sig, &before[sig], NULL);
        }
    }
    if (h == NULL) {
        snprintf(epd__fi_error, sizeof(epd__fi_error), "%s", dlerror());
        return;
    }
    *(void **)&epd__fi.getinfo = dlsym(h, "fi_getinfo");
    *(void **)&epd__fi.freeinfo = dlsym(h, "fi_freeinfo");
    *(void **)&epd__fi.dupinfo = dlsym(h, "fi_dupinfo");
    *(void **)&epd__fi.fabric = dlsym(h, "fi_fabric");
    *(void **)&epd__fi.strerror = dlsym(h, "fi_strerror");
    if (epd__fi.getinfo == NULL || epd__fi.freeinfo == NULL || epd__fi.dupinfo == NULL ||
        epd__fi.fabric == NULL || epd__fi.strerror == NULL) {
        snprintf(epd__fi_error, sizeof(epd__fi_error),
                 "libfabric.so.1 lacks fi_getinfo, "
                 "fi_freeinfo, fi_dupinfo, fi_fabric or fi_strerror");
    }
}

/* Builds the hints; `dc` asks for FI_DELIVERY_COMPLETE. */
static struct fi_info *epd__ofi_hints(const char *prov, bool dc)
{
    struct fi_info *hints = epd__fi.dupinfo(NULL); /* fi_allocinfo() */

    if (hints == NULL) {
        return NULL;
    }
    hints->caps = FI_MSG | FI_RMA | FI_SEND | FI_RECV | FI_WRITE | FI_REMOTE_WRITE;
    if (!dc) {
        hints->caps |= FI_READ | FI_REMOTE_READ; /* the flush's ordering read */
    }
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->ep_attr->type = FI_EP_RDM;
    hints->domain_attr->mr_mode = EPD__OFI_MR_REQUEST;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->tx_attr->msg_order = FI_ORDER_SAS | (dc ? 0 : FI_ORDER_RAW);
    hints->rx_attr->msg_order = FI_ORDER_SAS;
    if (dc) {
        hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
    }
    if (prov != NULL) {
        /* fi_freeinfo releases it with free(): it must come from libc, not
         * from the epd_malloc funnel. */
        hints->fabric_attr->prov_name = strdup(prov);
        if (hints->fabric_attr->prov_name == NULL) {
            epd__fi.freeinfo(hints);
            return NULL;
        }
    }
    return hints;
}

static epd_status_t epd__ofi_getinfo(epd__ofi_t *be, const char *prov, const char *node)
{
    const char *dc_env = getenv("EPD_OFI_DELIVERY_COMPLETE");
    /* test knob: "0" takes the path of providers without delivery complete */
    int first = dc_env != NULL && strcmp(dc_env, "0") == 0 ? 1 : 0;

    for (int attempt = first; attempt < 2; attempt++) {
        bool dc = attempt == 0;
        struct fi_info *hints = epd__ofi_hints(prov, dc);
        struct fi_info *info = NULL;
        int ret;

        if (hints == NULL) {
            return EPD_ERR_NO_MEMORY;
        }
        ret = epd__fi.getinfo(FI_VERSION(1, 17), node, NULL, node != NULL ? FI_SOURCE : 0, hints,
                              &info);
        epd__fi.freeinfo(hints);
        if (ret == 0 && info != NULL) {
            /* DC was only asked to learn that the provider has it; the
             * endpoint's default stays plain so sends do not wait for acks,
             * and writes ask for it per operation. */
            info->tx_attr->op_flags &= ~(uint64_t)FI_DELIVERY_COMPLETE;
            if (info->next != NULL) {
                epd__fi.freeinfo(info->next);
                info->next = NULL;
            }
            be->info = info;
            be->dc = dc;
            return EPD_OK;
        }
        if (ret != -FI_ENODATA) {
            epd_log_error(EPD__OFI_LOG, 0, "fi_getinfo(provider %s, node %s) failed: %s",
                          prov != NULL ? prov : getenv("FI_PROVIDER"),
                          node != NULL ? node : "(none)", epd__fi.strerror(-ret));
            return EPD_ERR_CONFIG;
        }
    }
    epd_log_error(EPD__OFI_LOG, 0,
                  "no libfabric provider matches: provider %s%s, node %s, FI_EP_RDM with "
                  "FI_MSG|FI_RMA and send-after-send ordering",
                  prov != NULL ? prov : getenv("FI_PROVIDER"),
                  prov != NULL ? "" : " (from FI_PROVIDER)", node != NULL ? node : "(none)");
    return EPD_ERR_CONFIG;
}

static epd_status_t epd__ofi_open_cq(epd__ofi_t *be, size_t size)
{
    struct fi_cq_attr attr;
    int ret;

    memset(&attr, 0, sizeof(attr));
    attr.format = FI_CQ_FORMAT_DATA;
    attr.size = size;
    attr.wait_obj = FI_WAIT_FD;
    ret = fi_cq_open(be->domain, &attr, &be->cq, NULL);
    if (ret == 0) {
        int fd = -1;

        ret = fi_control(&be->cq->fid, FI_GETWAIT, &fd);
        if (ret == 0 && fd >= 0) {
            be->wait_fd = fd;
            return EPD_OK;
        }
        fi_close(&be->cq->fid);
        be->cq = NULL;
    }
    /* shm and other providers without fd-wait: poll the CQ */
    attr.wait_obj = FI_WAIT_NONE;
    ret = fi_cq_open(be->domain, &attr, &be->cq, NULL);
    if (ret != 0) {
        epd_log_error(EPD__OFI_LOG, 0, "fi_cq_open failed: %s", epd__fi.strerror(-ret));
        return EPD_ERR_TRANSPORT;
    }
    be->wait_fd = -1;
    return EPD_OK;
}

static epd_status_t epd__ofi_open(epd__ofi_t *be)
{
    struct fi_info *info = be->info;
    struct fi_av_attr av_attr;
    size_t cq_size;
    int ret;

    ret = epd__fi.fabric(info->fabric_attr, &be->fabric, NULL);
    if (ret != 0) {
        epd_log_error(EPD__OFI_LOG, 0, "fi_fabric(%s) failed: %s", epd__ofi_prov(be),
                      epd__fi.strerror(-ret));
        return EPD_ERR_CONFIG;
    }
    ret = fi_domain(be->fabric, info, &be->domain, NULL);
    if (ret != 0) {
        epd_log_error(EPD__OFI_LOG, 0, "fi_domain(%s) failed: %s", info->domain_attr->name,
                      epd__fi.strerror(-ret));
        return EPD_ERR_CONFIG;
    }
    memset(&av_attr, 0, sizeof(av_attr));
    av_attr.type =
        info->domain_attr->av_type != FI_AV_UNSPEC ? info->domain_attr->av_type : FI_AV_TABLE;
    ret = fi_av_open(be->domain, &av_attr, &be->av, NULL);
    if (ret != 0) {
        epd_log_error(EPD__OFI_LOG, 0, "fi_av_open failed: %s", epd__fi.strerror(-ret));
        return EPD_ERR_TRANSPORT;
    }
    cq_size = (size_t)be->rx_count + be->tx_count + EPD__OFI_PARTS + 64;
    if (epd__ofi_open_cq(be, cq_size) != EPD_OK) {
        return EPD_ERR_TRANSPORT;
    }
    ret = fi_endpoint(be->domain, info, &be->ep, NULL);
    if (ret != 0) {
        epd_log_error(EPD__OFI_LOG, 0, "fi_endpoint failed: %s", epd__fi.strerror(-ret));
        return EPD_ERR_TRANSPORT;
    }
    ret = fi_ep_bind(be->ep, &be->av->fid, 0);
    if (ret == 0) {
        ret = fi_ep_bind(be->ep, &be->cq->fid, FI_TRANSMIT | FI_RECV);
    }
    if (ret == 0) {
        ret = fi_enable(be->ep);
    }
    if (ret != 0) {
        epd_log_error(EPD__OFI_LOG, 0, "binding/enabling the endpoint failed: %s",
                      epd__fi.strerror(-ret));
        return EPD_ERR_TRANSPORT;
    }
    return EPD_OK;
}

static epd_status_t epd__ofi_make_address(epd__ofi_t *be)
{
    epd__ofi_addr_hdr_t hdr;
    size_t name_len = 0;
    unsigned char *blob;
    int ret;

    ret = fi_getname(&be->ep->fid, NULL, &name_len);
    if ((ret != 0 && ret != -FI_ETOOSMALL) || name_len == 0 || name_len > EPD__OFI_MAX_NAME) {
        epd_log_error(EPD__OFI_LOG, 0, "fi_getname failed: %s (length %zu)", epd__fi.strerror(-ret),
                      name_len);
        return EPD_ERR_TRANSPORT;
    }
    blob = epd_calloc(1, sizeof(hdr) + name_len);
    if (blob == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    ret = fi_getname(&be->ep->fid, blob + sizeof(hdr), &name_len);
    if (ret != 0) {
        epd_log_error(EPD__OFI_LOG, 0, "fi_getname failed: %s", epd__fi.strerror(-ret));
        epd_free(blob);
        return EPD_ERR_TRANSPORT;
    }
    memset(&hdr, 0, sizeof(hdr));
    hdr.magic = EPD__OFI_ADDR_MAGIC;
    hdr.version = EPD__OFI_WIRE_VERSION;
    hdr.hdr_len = sizeof(hdr);
    hdr.name_len = (uint32_t)name_len;
    hdr.addr_format = be->info->addr_format;
    snprintf(hdr.prov, sizeof(hdr.prov), "%s", epd__ofi_prov(be));
    hdr.check = epd__ofi_blob_check(&hdr, sizeof(hdr), blob + sizeof(hdr), name_len);
    memcpy(blob, &hdr, sizeof(hdr));
    be->addr_blob = blob;
    be->addr_len = sizeof(hdr) + name_len;
    return EPD_OK;
}

/* The flush sink (see the top of the file): registered remote-read, and
 * its key kept (raw where the provider wants raw keys) for mr_pack. */
static epd_status_t epd__ofi_make_sink(epd__ofi_t *be)
{
    struct epd__ofi_sink *k = &be->sink;
    epd_status_t status;

    k->buf = epd_calloc(1, EPD__OFI_SINK_BYTES);
    if (k->buf == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    status = epd__ofi_reg(be, k->buf, EPD__OFI_SINK_BYTES, FI_REMOTE_READ, &k->mr);
    if (status != EPD_OK) {
        return status;
    }
    k->key = fi_mr_key(k->mr);
    if ((be->mr_mode & FI_MR_RAW) != 0) {
        size_t raw_len = sizeof(k->raw);
        int ret = fi_mr_raw_attr(k->mr, &k->raw_base, k->raw, &raw_len, 0);

        if (ret != 0 || raw_len == 0 || raw_len > sizeof(k->raw)) {
            epd_log_error(EPD__OFI_LOG, 0, "fi_mr_raw_attr (flush sink) failed: %s",
                          epd__fi.strerror(-ret));
            return EPD_ERR_TRANSPORT;
        }
        k->raw_len = raw_len;
    } else if (k->key == FI_KEY_NOTAVAIL) {
        epd_log_error(EPD__OFI_LOG, 0, "provider returned no key for the flush sink");
        return EPD_ERR_TRANSPORT;
    }
    return EPD_OK;
}

static epd_status_t epd__ofi_make_pools(epd__ofi_t *be, size_t max_inflight)
{
    epd_status_t status;

    be->rx_bufs = epd_calloc(be->rx_count, be->frag_size);
    be->rx = epd_calloc(be->rx_count, sizeof(*be->rx));
    be->tx_bufs = epd_calloc(be->tx_count, be->frag_size);
    be->tx = epd_calloc(be->tx_count, sizeof(*be->tx));
    be->inject_buf = epd_calloc(1, be->inject_size != 0 ? be->inject_size : 1);
    be->parts = epd_calloc(EPD__OFI_PARTS, sizeof(*be->parts));
    be->scratch = epd_calloc(1, 64);
    be->req_count = max_inflight + EPD__OFI_REQ_SPARE;
    be->reqs = epd_calloc(be->req_count, sizeof(*be->reqs));
    if (be->rx_bufs == NULL || be->rx == NULL || be->tx_bufs == NULL || be->tx == NULL ||
        be->inject_buf == NULL || be->parts == NULL || be->scratch == NULL || be->reqs == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    for (unsigned i = 0; i < be->rx_count; i++) {
        be->rx[i].kind = EPD__OFI_X_RECV;
        be->rx[i].buf = be->rx_bufs + (size_t)i * be->frag_size;
    }
    be->rx_unposted = be->rx_count;
    for (unsigned i = be->tx_count; i-- > 0;) {
        be->tx[i].kind = EPD__OFI_X_SEND;
        be->tx[i].buf = be->tx_bufs + (size_t)i * be->frag_size;
        be->tx[i].next_free = be->tx_free;
        be->tx_free = &be->tx[i];
    }
    be->tx_nfree = be->tx_count;
    for (unsigned i = EPD__OFI_PARTS; i-- > 0;) {
        be->parts[i].kind = EPD__OFI_X_PART;
        be->parts[i].next_free = be->parts_free;
        be->parts_free = &be->parts[i];
    }
    for (size_t i = be->req_count; i-- > 0;) {
        be->reqs[i].next = be->req_free;
        be->req_free = &be->reqs[i];
    }

    if ((be->mr_mode & FI_MR_LOCAL) != 0) {
        status = epd__ofi_reg(be, be->rx_bufs, (size_t)be->rx_count * be->frag_size, FI_RECV,
                              &be->rx_mr);
        if (status != EPD_OK) {
            return status;
        }
        status = epd__ofi_reg(be, be->tx_bufs, (size_t)be->tx_count * be->frag_size, FI_SEND,
                              &be->tx_mr);
        if (status != EPD_OK) {
            return status;
        }
        if (!be->dc) {
            status = epd__ofi_reg(be, be->scratch, 64, FI_READ, &be->scratch_mr);
            if (status != EPD_OK) {
                return status;
            }
        }
    }
    if (!be->dc) {
        status = epd__ofi_make_sink(be);
        if (status != EPD_OK) {
            return status;
        }
    }
    return EPD_OK;
}

static epd_status_t epd__ofi_create(epd_xport_t *core, const epd_xport_config_t *config,
                                    void **be_p)
{
    const char *env_prov = getenv("FI_PROVIDER");
    const char *prov;
    const char *node;
    size_t max_msg;
    size_t max_inflight;
    char mode_text[128];
    epd__ofi_t *be;
    epd_status_t status;

    if (core == NULL || config == NULL || be_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    max_msg = config->max_msg_size != 0 ? config->max_msg_size : 65536;
    if (max_msg > (1u << 30)) {
        epd_log_error(EPD__OFI_LOG, 0, "max_msg_size %zu is too large for message buffers",
                      max_msg);
        return EPD_ERR_CONFIG;
    }
    max_inflight = config->max_inflight != 0 ? config->max_inflight : 4096;
    prov = (env_prov != NULL && *env_prov != '\0')
               ? NULL
               : (config->provider != NULL && *config->provider != '\0' ? config->provider
                                                                        : "tcp;ofi_rxm");
    node =
        config->bind_host != NULL && *config->bind_host != '\0' ? config->bind_host : "127.0.0.1";
    pthread_once(&epd__fi_once, epd__fi_load);
    if (epd__fi_error[0] != '\0') {
        epd_log_error(EPD__OFI_LOG, 0, "libfabric: %s (is the libfabric1 package installed?)",
                      epd__fi_error);
        return EPD_ERR_UNSUPPORTED;
    }

    be = epd_calloc(1, sizeof(*be));
    if (be == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    be->core = core;
    be->wait_fd = -1;
    be->max_total = max_msg + EPD__OFI_HDR_ROOM;
    be->nonce = epd_rng_entropy() << 24;
    be->rx_count = EPD__OFI_RX_SLOTS;
    be->tx_count = EPD__OFI_TX_SLOTS;
    if (epd__ofi_is_shm(prov != NULL ? prov : env_prov)) {
        /* shm names its address after the node: two processes given the
         * same node collide (EBUSY); without one the name is the pid. */
        node = NULL;
    }

    status = epd__ofi_getinfo(be, prov, node);
    if (status != EPD_OK) {
        goto err_free;
    }
    be->mr_mode = be->info->domain_attr->mr_mode;
    be->key_mask = be->info->domain_attr->mr_key_size > 0 && be->info->domain_attr->mr_key_size < 8
                       ? (UINT64_C(1) << (8 * be->info->domain_attr->mr_key_size)) - 1
                       : UINT64_MAX;
    if ((be->mr_mode & FI_MR_RAW) != 0 &&
        be->info->domain_attr->mr_key_size > EPD__OFI_MAX_RAW_KEY) {
        epd_log_error(EPD__OFI_LOG, 0, "provider %s needs %zu-byte raw keys (at most %u supported)",
                      epd__ofi_prov(be), be->info->domain_attr->mr_key_size, EPD__OFI_MAX_RAW_KEY);
        status = EPD_ERR_CONFIG;
        goto err_close;
    }
    if (be->info->tx_attr->size != 0 && be->tx_count > be->info->tx_attr->size) {
        be->tx_count = (unsigned)be->info->tx_attr->size;
    }
    if (be->info->rx_attr->size != 0 && be->rx_count > be->info->rx_attr->size) {
        be->rx_count = (unsigned)be->info->rx_attr->size;
    }
    be->frag_size = epd__ofi_frag_limit(be);
    if (be->frag_size > be->max_total + sizeof(epd__ofi_frag_t)) {
        be->frag_size = be->max_total + sizeof(epd__ofi_frag_t);
    }
    if (be->info->ep_attr->max_msg_size < be->frag_size) {
        be->frag_size = be->info->ep_attr->max_msg_size;
    }
    if (be->frag_size < EPD__OFI_FRAG_MIN) {
        epd_log_error(EPD__OFI_LOG, 0, "provider %s carries messages up to %zu bytes, need %u",
                      epd__ofi_prov(be), be->info->ep_attr->max_msg_size, EPD__OFI_FRAG_MIN);
        status = EPD_ERR_CONFIG;
        goto err_close;
    }
    be->inject_size = be->info->tx_attr->inject_size;
    if (be->inject_size > be->frag_size) {
        be->inject_size = be->frag_size;
    }
    be->write_chunk = be->info->ep_attr->max_msg_size;
    {
        size_t env_chunk = epd__ofi_env_size("EPD_OFI_WRITE_CHUNK");

        if (env_chunk != 0 && env_chunk < be->write_chunk) {
            be->write_chunk = env_chunk;
        }
    }

    status = epd__ofi_open(be);
    if (status != EPD_OK) {
        goto err_close;
    }
    status = epd__ofi_make_address(be);
    if (status != EPD_OK) {
        goto err_close;
    }
    status = epd__ofi_make_pools(be, max_inflight);
    if (status != EPD_OK) {
        goto err_close;
    }
    epd__ofi_post_recvs(be);
    if (be->rx_unposted == be->rx_count) {
        epd_log_error(EPD__OFI_LOG, 0, "could not post any receive buffer");
        status = EPD_ERR_TRANSPORT;
        goto err_close;
    }

    epd__ofi_mr_mode_str(be->mr_mode, mode_text, sizeof(mode_text));
    snprintf(be->desc, sizeof(be->desc),
             "ofi provider %s fabric %s domain %s mr_mode %s max_msg_size %zu inject %zu "
             "wait_fd %s writes %s",
             epd__ofi_prov(be), be->info->fabric_attr->name, be->info->domain_attr->name, mode_text,
             be->info->ep_attr->max_msg_size, be->inject_size, be->wait_fd >= 0 ? "yes" : "no",
             be->dc ? "delivery-complete" : "read-flushed");
    epd_log_info(EPD__OFI_LOG, 0,
                 "%s (node %s, messages up to %zu bytes in fragments of %zu, %u+%u slots)",
                 be->desc, node != NULL ? node : "(none)", be->max_total, be->frag_size,
                 be->rx_count, be->tx_count);

    *be_p = be;
    return EPD_OK;

err_close:
    epd__ofi_close_all(be);
err_free:
    epd__ofi_free_mem(be);
    return status;
}

static void epd__ofi_ep_destroy(void *be_ep);

static void epd__ofi_destroy(void *arg)
{
    epd__ofi_t *be = arg;

    if (be == NULL) {
        return;
    }
    while (be->eps != NULL) {
        epd__ofi_ep_destroy(be->eps);
    }
    epd__ofi_close_all(be); /* the AV is gone: unrefs below only free */
    while (be->zombies != NULL) {
        epd__ofi_ep_t *ep = be->zombies;

        be->zombies = ep->next;
        epd__ofi_ep_free(be, ep);
    }
    epd__ofi_free_mem(be);
}

static epd_status_t epd__ofi_address(void *arg, const void **blob_p, size_t *len_p)
{
    epd__ofi_t *be = arg;

    if (be == NULL || blob_p == NULL || len_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    *blob_p = be->addr_blob;
    *len_p = be->addr_len;
    return EPD_OK;
}

static void epd__ofi_describe(void *arg, char *buf, size_t len)
{
    epd__ofi_t *be = arg;

    if (buf == NULL || len == 0) {
        return;
    }
    snprintf(buf, len, "%s", be != NULL ? be->desc : "ofi (none)");
}

/* ---------------------------------------------------------------- ops: endpoints */

/*
 * Whether the shm segment named by a shm address ("fi_shm://PID:..." or
 * "PID:...") exists.  shm 1.17 crashes in fi_av_insert when the peer is an
 * endpoint of this process that was closed (it keeps a stale entry in its
 * process-wide name list), and an exited peer unlinks its segment; so an
 * address without a segment is refused before libfabric sees it.
 */
static bool epd__ofi_shm_peer_exists(const unsigned char *name, size_t len)
{
    char buf[256];
    const char *n = buf;
    int fd;

    if (len == 0 || len >= sizeof(buf)) {
        return false;
    }
    memcpy(buf, name, len);
    buf[len] = '\0';
    if (strncmp(n, "fi_shm://", 9) == 0) {
        n += 9;
    }
    if (*n == '\0' || strchr(n, '/') != NULL) {
        return false;
    }
    fd = shm_open(n, O_RDONLY, 0);
    if (fd < 0) {
        return false;
    }
    close(fd);
    return true;
}

static epd_status_t epd__ofi_ep_create(void *arg, const void *blob, size_t len,
                                       epd_xport_ep_t *core_ep, void **be_ep_p)
{
    epd__ofi_t *be = arg;
    epd__ofi_addr_hdr_t hdr;
    const unsigned char *name;
    epd__ofi_av_entry_t *e;
    epd__ofi_ep_t *ep;
    size_t straddr_len;
    int ret;

    if (be == NULL || be_ep_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (blob == NULL || len < sizeof(hdr)) {
        epd_log_warn(EPD__OFI_LOG, 0, "address blob refused: %zu bytes, header needs %zu", len,
                     sizeof(hdr));
        return EPD_ERR_BAD_ADDRESS;
    }
    memcpy(&hdr, blob, sizeof(hdr));
    if (hdr.magic != EPD__OFI_ADDR_MAGIC || hdr.version != EPD__OFI_WIRE_VERSION ||
        hdr.hdr_len != sizeof(hdr) || hdr.name_len == 0 || hdr.name_len > EPD__OFI_MAX_NAME ||
        (size_t)hdr.name_len != len - sizeof(hdr) ||
        hdr.check != epd__ofi_blob_check(&hdr, sizeof(hdr),
                                         (const unsigned char *)blob + sizeof(hdr), hdr.name_len)) {
        epd_log_warn(EPD__OFI_LOG, 0,
                     "address blob refused: not an intact ofi address of this version "
                     "(%zu bytes)",
                     len);
        return EPD_ERR_BAD_ADDRESS;
    }
    if (hdr.addr_format != be->info->addr_format ||
        memchr(hdr.prov, '\0', sizeof(hdr.prov)) == NULL ||
        strncmp(hdr.prov, epd__ofi_prov(be), sizeof(hdr.prov)) != 0) {
        epd_log_warn(EPD__OFI_LOG, 0,
                     "address blob refused: peer uses provider %.*s (address format %u), "
                     "this worker %s (%u)",
                     (int)sizeof(hdr.prov), hdr.prov, hdr.addr_format, epd__ofi_prov(be),
                     be->info->addr_format);
        return EPD_ERR_BAD_ADDRESS;
    }
    name = (const unsigned char *)blob + sizeof(hdr);

    ep = epd_calloc(1, sizeof(*ep));
    if (ep == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    ep->be = be;
    ep->core_ep = core_ep;
    ep->stream = be->nonce + ++be->ep_serial;
    for (e = be->av_entries; e != NULL; e = e->next) {
        if (e->name_len == hdr.name_len && memcmp(e->name, name, e->name_len) == 0) {
            break;
        }
    }
    if (e == NULL && epd__ofi_is_shm(epd__ofi_prov(be)) &&
        !epd__ofi_shm_peer_exists(name, hdr.name_len)) {
        epd_log_warn(EPD__OFI_LOG, 0, "shm peer %.*s is gone (no segment)", (int)hdr.name_len,
                     (const char *)name);
        epd_free(ep);
        return EPD_ERR_UNREACHABLE;
    }
    if (e == NULL) {
        e = epd_malloc(sizeof(*e) + hdr.name_len);
        if (e == NULL) {
            epd_free(ep);
            return EPD_ERR_NO_MEMORY;
        }
        e->name_len = hdr.name_len;
        memcpy(e->name, name, hdr.name_len);
        e->refs = 0;
        ret = fi_av_insert(be->av, e->name, 1, &e->addr, 0, NULL);
        if (ret != 1) {
            epd_log_warn(EPD__OFI_LOG, 0, "address blob refused: fi_av_insert: %s",
                         ret < 0 ? epd__fi.strerror(-ret) : "address not inserted");
            epd_free(e);
            epd_free(ep);
            return EPD_ERR_BAD_ADDRESS;
        }
        e->next = be->av_entries;
        be->av_entries = e;
    }
    e->refs++;
    ep->av = e;
    ep->addr = e->addr;
    straddr_len = sizeof(ep->peer);
    if (fi_av_straddr(be->av, e->name, ep->peer, &straddr_len) == NULL) {
        snprintf(ep->peer, sizeof(ep->peer), "fi_addr %llu", (unsigned long long)ep->addr);
    }
    ep->next = be->eps;
    if (be->eps != NULL) {
        be->eps->prev = ep;
    }
    be->eps = ep;
    *be_ep_p = ep;
    return EPD_OK;
}

static void epd__ofi_ep_destroy(void *arg)
{
    epd__ofi_ep_t *ep = arg;
    epd__ofi_t *be;
    epd__ofi_req_t *done = NULL;
    epd__ofi_req_t *req;

    if (ep == NULL) {
        return;
    }
    be = ep->be;
    ep->closing = true;

    /* Detach everything first; the upcalls below may re-enter. */
    if (ep->prev != NULL) {
        ep->prev->next = ep->next;
    } else {
        be->eps = ep->next;
    }
    if (ep->next != NULL) {
        ep->next->prev = ep->prev;
    }
    while (ep->backlog != NULL) {
        epd__ofi_xfer_t *x = ep->backlog;

        ep->backlog = x->next_free;
        epd__ofi_tx_put(be, x);
    }
    while ((req = ep->writes) != NULL || (req = ep->flushes) != NULL) {
        if (req->kind == EPD__OFI_REQ_WRITE) {
            epd__ofi_list_remove(&ep->writes, &ep->writes_tail, req);
        } else {
            epd__ofi_list_remove(&ep->flushes, &ep->flushes_tail, req);
        }
        req->ep = NULL;
        req->next = done;
        done = req;
    }
    if (ep->inflight == 0) {
        epd__ofi_ep_free(be, ep);
    } else {
        ep->prev = NULL;
        ep->next = be->zombies;
        if (be->zombies != NULL) {
            be->zombies->prev = ep;
        }
        be->zombies = ep;
    }

    while ((req = done) != NULL) {
        epd__xport_op_t *op = req->op;

        done = req->next;
        req->next = NULL;
        req->op = NULL;
        if (req->parts_out == 0) {
            epd__ofi_req_put(be, req);
        } else {
            /* an orphan, freed when the provider returns its parts: its
             * bytes may still move meanwhile (limbo) */
            req->peer_xid = epd__xport_ep_peer(ep->core_ep);
            be->n_orphans++;
        }
        if (op != NULL) {
            epd__xport_op_done(op, EPD_ERR_CANCELED);
        }
    }
}

static void epd__ofi_ep_describe(void *arg, char *buf, size_t len, const char **class_p)
{
    epd__ofi_ep_t *ep = arg;
    const char *cls = "other";
    char core_prov[32];
    size_t n;

    if (ep == NULL) {
        return;
    }
    n = strcspn(epd__ofi_prov(ep->be), ";");
    snprintf(core_prov, sizeof(core_prov), "%.*s", (int)n, epd__ofi_prov(ep->be));
    if (strcmp(core_prov, "shm") == 0) {
        cls = "shm";
    } else if (strcmp(core_prov, "tcp") == 0 || strcmp(core_prov, "net") == 0 ||
               strcmp(core_prov, "sockets") == 0 || strcmp(core_prov, "ofi_rxm") == 0) {
        cls = "tcp";
    } else if (strcmp(core_prov, "verbs") == 0 || strcmp(core_prov, "efa") == 0 ||
               strncmp(core_prov, "psm", 3) == 0 || strcmp(core_prov, "opx") == 0 ||
               strcmp(core_prov, "cxi") == 0) {
        cls = "rdma";
    }
    if (buf != NULL && len != 0) {
        snprintf(buf, len, "ofi %s fabric %s domain %s peer %s", epd__ofi_prov(ep->be),
                 ep->be->info->fabric_attr->name, ep->be->info->domain_attr->name, ep->peer);
    }
    if (class_p != NULL) {
        *class_p = cls;
    }
}

/* The status an endpoint refuses new work with, EPD_OK when usable. */
static epd_status_t epd__ofi_ep_state(const epd__ofi_ep_t *ep)
{
    if (ep->closing) {
        return EPD_ERR_CANCELED;
    }
    return ep->failed;
}

static epd_status_t epd__ofi_send(void *arg, const void *hdr, size_t hdr_len, const void *payload,
                                  size_t len)
{
    epd__ofi_ep_t *ep = arg;
    epd__ofi_t *be;
    epd__ofi_xfer_t *first = NULL;
    epd__ofi_xfer_t *last = NULL;
    epd__ofi_frag_t fh;
    size_t total;
    size_t fpay;
    size_t nfrag;
    uint32_t inflight;
    epd_status_t status;
    ssize_t ret;

    if (ep == NULL || (hdr == NULL && hdr_len != 0) || (payload == NULL && len != 0)) {
        return EPD_ERR_INVALID_PARAM;
    }
    be = ep->be;
    status = epd__ofi_ep_state(ep);
    if (status != EPD_OK) {
        return status;
    }
    total = hdr_len + len;
    if (total < hdr_len || total > be->max_total) {
        return EPD_ERR_TOO_LONG;
    }
    if (total == 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    fh.stream = ep->stream;
    fh.total = (uint32_t)total;
    fh.offset = 0;

    if (total + sizeof(fh) <= be->inject_size && ep->backlog == NULL) {
        memcpy(be->inject_buf, &fh, sizeof(fh));
        epd__ofi_gather(be->inject_buf + sizeof(fh), hdr, hdr_len, payload, 0, total);
        ret = fi_inject(be->ep, be->inject_buf, total + sizeof(fh), ep->addr);
        if (ret == 0) {
            return EPD_OK;
        }
        if (ret != -FI_EAGAIN) {
            epd_log_error(EPD__OFI_LOG, 0, "fi_inject(%zu bytes) to %s failed: %s", total, ep->peer,
                          epd__fi.strerror((int)-ret));
            return epd__ofi_post_err(ret);
        }
        /* pushed back (rxm connects lazily): queue it in send slots */
    }

    fpay = be->frag_size - sizeof(fh);
    nfrag = (total + fpay - 1) / fpay;
    if (nfrag > be->tx_nfree) {
        epd__ofi_nudge(be);
        return EPD_ERR_NO_RESOURCE;
    }
    /* copy the whole message now (copy semantics), fragment by fragment */
    for (size_t off = 0; off < total; off += fpay) {
        epd__ofi_xfer_t *x = be->tx_free;
        size_t n = total - off < fpay ? total - off : fpay;

        be->tx_free = x->next_free;
        be->tx_nfree--;
        x->next_free = NULL;
        x->ep = NULL;
        fh.offset = (uint32_t)off;
        memcpy(x->buf, &fh, sizeof(fh));
        epd__ofi_gather(x->buf + sizeof(fh), hdr, hdr_len, payload, off, n);
        x->len = sizeof(fh) + n;
        if (last != NULL) {
            last->next_free = x;
        } else {
            first = x;
        }
        last = x;
    }

    if (ep->backlog != NULL) {
        /* earlier fragments wait: queue behind them to keep the order */
        ep->backlog_tail->next_free = first;
        ep->backlog_tail = last;
        return EPD_OK;
    }
    /*
     * The bytes are copied into slots of a bounded pool, so when the
     * provider pushes back (-FI_EAGAIN: rxm is still connecting, or its
     * queues are full) the fragments wait in the endpoint's backlog and go
     * out, in order, from progress; EPD_ERR_NO_RESOURCE is left for an
     * empty pool.
     */
    ep->backlog = first;
    ep->backlog_tail = last;
    inflight = ep->inflight;
    status = epd__ofi_backlog_post(be, ep);
    if (status == EPD_OK) {
        return EPD_OK;
    }
    if (status == EPD_ERR_NO_RESOURCE) {
        epd__ofi_nudge(be);
        return EPD_OK;
    }
    if (ep->inflight == inflight) {
        /* nothing of this message went out (the backlog dropped it): refuse */
        return status;
    }
    /* torn message: the endpoint is unusable; reported from progress */
    ep->failed = status;
    return EPD_OK;
}

static epd_status_t epd__ofi_write(void *arg, const void *local, size_t len, void *be_local_mr,
                                   void *be_rkey, uint64_t remote_offset, epd__xport_op_t *op)
{
    epd__ofi_ep_t *ep = arg;
    epd__ofi_mr_t *lmr = be_local_mr;
    epd__ofi_rkey_t *rkey = be_rkey;
    epd__ofi_t *be;
    epd__ofi_req_t *req;
    epd_status_t status;

    if (ep == NULL || op == NULL || rkey == NULL || (local == NULL && len != 0)) {
        return EPD_ERR_INVALID_PARAM;
    }
    be = ep->be;
    status = epd__ofi_ep_state(ep);
    if (status != EPD_OK) {
        return status;
    }
    if (rkey->ep != ep) {
        epd_log_error(EPD__OFI_LOG, 0, "write to %s with a key unpacked on another endpoint",
                      ep->peer);
        return EPD_ERR_INVALID_PARAM;
    }
    if (remote_offset > rkey->size || len > rkey->size - remote_offset) {
        return EPD_ERR_OUT_OF_RANGE;
    }
    req = epd__ofi_req_get(be);
    if (req == NULL) {
        epd__ofi_nudge(be);
        return EPD_ERR_NO_RESOURCE;
    }
    req->kind = EPD__OFI_REQ_WRITE;
    req->op = op;
    req->ep = ep;
    req->local = local;
    req->len = len;
    req->raddr = rkey->base + remote_offset;
    req->key = rkey->key;
    req->sink_addr = rkey->sink_addr;
    req->sink_key = rkey->sink_key;
    req->status = EPD_OK;
    /* delivery complete: the completion comes once the target placed the
     * bytes, so a fence behind this write needs no flush */
    op->delivers = be->dc ? 1 : 0;

    if ((be->mr_mode & FI_MR_LOCAL) != 0 && len != 0) {
        uintptr_t lo = (uintptr_t)local;

        if (lmr != NULL && lmr->be == be && lo >= (uintptr_t)lmr->addr && len <= lmr->size &&
            lo - (uintptr_t)lmr->addr <= lmr->size - len) {
            req->desc = fi_mr_desc(lmr->mr);
        } else {
            status = epd__ofi_reg(be, (void *)local, len, FI_WRITE, &req->tmp_mr);
            if (status != EPD_OK) {
                epd__ofi_req_put(be, req);
                return status;
            }
            req->desc = fi_mr_desc(req->tmp_mr);
        }
    }

    if (ep->unposted == 0) {
        status = epd__ofi_write_post(be, req);
        if (status != EPD_OK && status != EPD_ERR_NO_RESOURCE && req->parts_out == 0) {
            /* nothing posted: refuse, nothing queued */
            epd__ofi_req_put(be, req);
            return status;
        }
        if (status == EPD_ERR_NO_RESOURCE) {
            /* the provider pushed back: the rest is posted from progress
             * (the request pool bounds what waits) */
            epd__ofi_nudge(be);
        } else if (status != EPD_OK) {
            /* failed after some parts: finishes when they come back */
            req->posted = req->len;
        }
    }
    req->seq = ep->write_seq++;
    if (req->posted < req->len || req->parts_out == 0) {
        /* the rest is posted from progress (a zero-length write completes there) */
        req->queued = true;
        ep->unposted++;
    }
    epd__ofi_list_append(&ep->writes, &ep->writes_tail, req);
    return EPD_INPROGRESS;
}

static epd_status_t epd__ofi_flush(void *arg, epd__xport_op_t *op)
{
    epd__ofi_ep_t *ep = arg;
    epd__ofi_req_t *req;
    epd_status_t status;

    if (ep == NULL || op == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    status = epd__ofi_ep_state(ep);
    if (status != EPD_OK) {
        return status;
    }
    req = epd__ofi_req_get(ep->be);
    if (req == NULL) {
        epd__ofi_nudge(ep->be);
        return EPD_ERR_NO_RESOURCE;
    }
    req->kind = EPD__OFI_REQ_FLUSH;
    req->op = op;
    req->ep = ep;
    req->seq = ep->write_seq; /* every write before this one */
    req->status = EPD_OK;
    epd__ofi_list_append(&ep->flushes, &ep->flushes_tail, req);
    return EPD_INPROGRESS;
}

/* ---------------------------------------------------------------- ops: memory */

/* A region that receives writes: remote write and nothing else remote (the
 * flush sink takes the reads of providers without delivery complete);
 * FI_WRITE because it may also be the source of this worker's writes. */
#define EPD__OFI_ACCESS_RECV (FI_WRITE | FI_REMOTE_WRITE)

static epd_status_t epd__ofi_mr_finish(epd__ofi_t *be, epd__ofi_mr_t *mr)
{
    mr->key = fi_mr_key(mr->mr);
    if ((be->mr_mode & FI_MR_RAW) != 0) {
        size_t raw_len = sizeof(mr->raw);
        int ret = fi_mr_raw_attr(mr->mr, &mr->raw_base, mr->raw, &raw_len, 0);

        if (ret != 0 || raw_len == 0 || raw_len > sizeof(mr->raw)) {
            epd_log_error(EPD__OFI_LOG, 0, "fi_mr_raw_attr failed: %s (%zu bytes)",
                          epd__fi.strerror(-ret), raw_len);
            return EPD_ERR_TRANSPORT;
        }
        mr->raw_len = raw_len;
    } else if (mr->key == FI_KEY_NOTAVAIL) {
        epd_log_error(EPD__OFI_LOG, 0, "provider returned no key for a region");
        return EPD_ERR_TRANSPORT;
    }
    return EPD_OK;
}

static epd_status_t epd__ofi_mr_reg(void *arg, void *addr, size_t size, unsigned access,
                                    void **be_mr_p)
{
    epd__ofi_t *be = arg;
    epd__ofi_mr_t *mr;
    epd_status_t status;

    if (be == NULL || addr == NULL || size == 0 || be_mr_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    mr = epd_calloc(1, sizeof(*mr));
    if (mr == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    mr->be = be;
    mr->addr = addr;
    mr->size = size;
    mr->remote_write = (access & EPD_XPORT_MR_REMOTE_WRITE) != 0;
    if (!mr->remote_write) {
        /* a source only: registered where the provider needs a descriptor
         * for local buffers, with local write-source access alone; without
         * FI_MR_LOCAL nothing is registered, so there is no key to guess */
        if ((be->mr_mode & FI_MR_LOCAL) != 0) {
            status = epd__ofi_reg(be, addr, size, FI_WRITE, &mr->mr);
            if (status != EPD_OK) {
                goto err_free;
            }
        }
        *be_mr_p = mr;
        return EPD_OK;
    }
    status = epd__ofi_reg(be, addr, size, EPD__OFI_ACCESS_RECV, &mr->mr);
    if (status != EPD_OK) {
        goto err_free;
    }
    status = epd__ofi_mr_finish(be, mr);
    if (status != EPD_OK) {
        goto err_close;
    }
    *be_mr_p = mr;
    return EPD_OK;

err_close:
    fi_close(&mr->mr->fid);
err_free:
    epd_free(mr);
    return status;
}

static epd_status_t epd__ofi_mr_alloc(void *arg, size_t size, unsigned access, void **addr_p,
                                      void **be_mr_p)
{
    epd__ofi_t *be = arg;
    void *mem;
    void *mr;
    epd_status_t status;

    if (be == NULL || size == 0 || addr_p == NULL || be_mr_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    mem = epd_calloc(1, size);
    if (mem == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    status = epd__ofi_mr_reg(be, mem, size, access, &mr);
    if (status != EPD_OK) {
        epd_free(mem);
        return status;
    }
    ((epd__ofi_mr_t *)mr)->alloc = mem;
    *addr_p = mem;
    *be_mr_p = mr;
    return EPD_OK;
}

static void epd__ofi_mr_dereg(void *arg, void *be_mr)
{
    epd__ofi_mr_t *mr = be_mr;

    (void)arg;
    if (mr == NULL) {
        return;
    }
    if (mr->mr != NULL) {
        fi_close(&mr->mr->fid);
    }
    epd_free(mr->alloc);
    epd_free(mr);
}

static epd_status_t epd__ofi_mr_pack(void *arg, void *be_mr, void *buf, size_t cap, size_t *len_p)
{
    epd__ofi_t *be = arg;
    epd__ofi_mr_t *mr = be_mr;
    epd__ofi_rkey_hdr_t hdr;
    size_t need;

    if (be == NULL || mr == NULL || buf == NULL || len_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (mr->mr == NULL) {
        return EPD_ERR_UNSUPPORTED; /* a local region never registered: no key exists */
    }
    if (!mr->remote_write) {
        /* tests only (epd__xport_mr_pack_any): the local registration's key */
        mr->key = fi_mr_key(mr->mr);
    }
    need = sizeof(hdr) + mr->raw_len + be->sink.raw_len;
    if (cap < need) {
        return EPD_ERR_NO_RESOURCE;
    }
    memset(&hdr, 0, sizeof(hdr));
    hdr.magic = EPD__OFI_RKEY_MAGIC;
    hdr.version = EPD__OFI_RKEY_VERSION;
    hdr.hdr_len = sizeof(hdr);
    hdr.raw_len = (uint32_t)mr->raw_len;
    hdr.base = (be->mr_mode & FI_MR_VIRT_ADDR) != 0 ? (uint64_t)(uintptr_t)mr->addr : 0;
    hdr.size = mr->size;
    hdr.key = mr->key;
    hdr.raw_base = mr->raw_base;
    if (be->sink.mr != NULL) {
        hdr.has_sink = 1;
        hdr.sink_raw_len = (uint32_t)be->sink.raw_len;
        hdr.sink_addr =
            (be->mr_mode & FI_MR_VIRT_ADDR) != 0 ? (uint64_t)(uintptr_t)be->sink.buf : 0;
        hdr.sink_key = be->sink.key;
        hdr.sink_raw_base = be->sink.raw_base;
    }
    memcpy(buf, &hdr, sizeof(hdr));
    if (mr->raw_len != 0) {
        memcpy((unsigned char *)buf + sizeof(hdr), mr->raw, mr->raw_len);
    }
    if (be->sink.raw_len != 0) {
        memcpy((unsigned char *)buf + sizeof(hdr) + mr->raw_len, be->sink.raw, be->sink.raw_len);
    }
    hdr.check = epd__ofi_blob_check(&hdr, sizeof(hdr), (unsigned char *)buf + sizeof(hdr),
                                    need - sizeof(hdr));
    memcpy(buf, &hdr, sizeof(hdr));
    *len_p = need;
    return EPD_OK;
}

/* ---------------------------------------------------------------- grants */

/* A grant is a registration of its own over the region's memory (its own
 * random or provider key), so that it can be closed alone. */
static epd_status_t epd__ofi_grant_open(void *arg, void *be_mr, epd_xport_grant_t *core_grant,
                                        void **be_grant_p)
{
    epd__ofi_t *be = arg;
    epd__ofi_mr_t *region = be_mr;
    epd__ofi_mr_t *g;
    epd_status_t status;

    (void)core_grant; /* writes land without a check of ours: nothing to call */
    g = epd_calloc(1, sizeof(*g));
    if (g == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    g->be = be;
    g->addr = region->addr;
    g->size = region->size;
    g->remote_write = true;
    status = epd__ofi_reg(be, g->addr, g->size, EPD__OFI_ACCESS_RECV, &g->mr);
    if (status == EPD_OK) {
        status = epd__ofi_mr_finish(be, g);
        if (status != EPD_OK) {
            fi_close(&g->mr->fid);
        }
    }
    if (status != EPD_OK) {
        epd_free(g);
        return status;
    }
    *be_grant_p = g;
    return EPD_OK;
}

static epd_status_t epd__ofi_grant_pack(void *arg, void *be_grant, void *buf, size_t cap,
                                        size_t *len_p)
{
    epd__ofi_mr_t *g = be_grant;

    if (g->mr == NULL) {
        return EPD_ERR_INVALID_PARAM; /* revoked */
    }
    return epd__ofi_mr_pack(arg, g, buf, cap, len_p);
}

static epd_status_t epd__ofi_grant_revoke(void *arg, void *be_grant, int writer_same_host)
{
    epd__ofi_mr_t *g = be_grant;

    (void)arg;
    (void)writer_same_host;
    /* Closed: a write that starts after this finds no key and is refused
     * by the provider.  Not a proof that nothing lands: the providers here
     * check the key once per operation (tcp when a write's header arrives,
     * then its bytes go straight into the region as they come), so a write
     * under way when the key closes still lands — only the writer's end
     * (its process gone, or its own word) settles the grant. */
    if (g->mr != NULL) {
        fi_close(&g->mr->fid);
        g->mr = NULL;
    }
    return EPD_ERR_UNSUPPORTED;
}

static int epd__ofi_grant_settled(void *arg, void *be_grant)
{
    (void)arg;
    (void)be_grant;
    return 0;
}

static void epd__ofi_grant_close(void *arg, void *be_grant)
{
    epd__ofi_mr_t *g = be_grant;

    (void)arg;
    if (g->mr != NULL) {
        fi_close(&g->mr->fid);
    }
    epd_free(g);
}

static uint32_t epd__ofi_limbo(void *arg, uint64_t peer_xid)
{
    epd__ofi_t *be = arg;
    uint32_t n = 0;

    if (peer_xid == 0 || be->n_orphans == 0) {
        return be->n_orphans;
    }
    for (size_t i = 0; i < be->req_count; i++) {
        const epd__ofi_req_t *r = &be->reqs[i];

        n += r->op == NULL && r->parts_out > 0 && r->peer_xid == peer_xid;
    }
    return n;
}

static epd_status_t epd__ofi_rkey_unpack(void *arg, const void *blob, size_t len, void **be_rkey_p,
                                         size_t *size_p)
{
    epd__ofi_ep_t *ep = arg;
    epd__ofi_t *be;
    epd__ofi_rkey_hdr_t hdr;
    epd__ofi_rkey_t *rkey;
    const unsigned char *raw;
    bool want_raw;
    int ret;

    if (ep == NULL || be_rkey_p == NULL || size_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    be = ep->be;
    want_raw = (be->mr_mode & FI_MR_RAW) != 0;
    if (blob == NULL || len < sizeof(hdr)) {
        return EPD_ERR_BAD_RKEY;
    }
    memcpy(&hdr, blob, sizeof(hdr));
    raw = (const unsigned char *)blob + sizeof(hdr);
    if (hdr.magic != EPD__OFI_RKEY_MAGIC || hdr.version != EPD__OFI_RKEY_VERSION ||
        hdr.hdr_len != sizeof(hdr) || hdr.raw_len > EPD__OFI_MAX_RAW_KEY ||
        hdr.sink_raw_len > EPD__OFI_MAX_RAW_KEY || hdr.has_sink > 1 ||
        (size_t)hdr.raw_len + hdr.sink_raw_len != len - sizeof(hdr) ||
        (hdr.raw_len != 0) != want_raw || (hdr.sink_raw_len != 0) != (want_raw && hdr.has_sink) ||
        (hdr.has_sink == 0 &&
         (hdr.sink_addr != 0 || hdr.sink_key != 0 || hdr.sink_raw_base != 0)) ||
        hdr.size == 0 || hdr.size > SIZE_MAX || hdr.base > UINT64_MAX - hdr.size ||
        hdr.check != epd__ofi_blob_check(&hdr, sizeof(hdr), raw, len - sizeof(hdr))) {
        epd_log_warn(EPD__OFI_LOG, 0, "remote key refused (%zu bytes): malformed", len);
        return EPD_ERR_BAD_RKEY;
    }
    if (!be->dc && !hdr.has_sink) {
        epd_log_warn(EPD__OFI_LOG, 0,
                     "remote key refused: its worker has no flush sink (it uses delivery "
                     "complete, this worker does not: a configuration mismatch)");
        return EPD_ERR_BAD_RKEY;
    }
    rkey = epd_calloc(1, sizeof(*rkey));
    if (rkey == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    rkey->be = be;
    rkey->ep = ep;
    rkey->base = hdr.base;
    rkey->size = hdr.size;
    rkey->key = hdr.key;
    rkey->sink_addr = hdr.sink_addr;
    rkey->sink_key = hdr.sink_key;
    if (want_raw) {
        ret = fi_mr_map_raw(be->domain, hdr.raw_base, (uint8_t *)raw, hdr.raw_len, &rkey->key, 0);
        if (ret != 0) {
            epd_log_warn(EPD__OFI_LOG, 0, "remote key refused: fi_mr_map_raw: %s",
                         epd__fi.strerror(-ret));
            epd_free(rkey);
            return EPD_ERR_BAD_RKEY;
        }
        rkey->mapped = true;
        if (hdr.has_sink && !be->dc) {
            ret = fi_mr_map_raw(be->domain, hdr.sink_raw_base, (uint8_t *)raw + hdr.raw_len,
                                hdr.sink_raw_len, &rkey->sink_key, 0);
            if (ret != 0) {
                epd_log_warn(EPD__OFI_LOG, 0, "remote key refused: fi_mr_map_raw (sink): %s",
                             epd__fi.strerror(-ret));
                (void)fi_mr_unmap_key(be->domain, rkey->key);
                epd_free(rkey);
                return EPD_ERR_BAD_RKEY;
            }
            rkey->sink_mapped = true;
        }
    }
    *be_rkey_p = rkey;
    *size_p = (size_t)hdr.size;
    return EPD_OK;
}

static void epd__ofi_rkey_destroy(void *be_rkey)
{
    epd__ofi_rkey_t *rkey = be_rkey;

    if (rkey == NULL) {
        return;
    }
    if (rkey->mapped) {
        (void)fi_mr_unmap_key(rkey->be->domain, rkey->key);
    }
    if (rkey->sink_mapped) {
        (void)fi_mr_unmap_key(rkey->be->domain, rkey->sink_key);
    }
    epd_free(rkey);
}

/* ---------------------------------------------------------------- ops: progress */

static int epd__ofi_progress(void *arg)
{
    epd__ofi_t *be = arg;
    int n;

    if (be == NULL) {
        return 0;
    }
    n = epd__ofi_read_cq(be);
    epd__ofi_post_recvs(be);
    n += epd__ofi_sweep(be);
    return n;
}

static epd_status_t epd__ofi_get_fd(void *arg, int *fd_p)
{
    epd__ofi_t *be = arg;

    if (be == NULL || fd_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (be->wait_fd < 0) {
        return EPD_ERR_UNSUPPORTED;
    }
    *fd_p = be->wait_fd;
    return EPD_OK;
}

static epd_status_t epd__ofi_arm(void *arg)
{
    epd__ofi_t *be = arg;
    struct fid *fids[1];
    int ret;

    if (be == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (be->wait_fd < 0) {
        return EPD_ERR_UNSUPPORTED;
    }
    /* queued work of ours is invisible to the fd */
    if (be->rx_unposted != 0) {
        return EPD_ERR_BUSY;
    }
    for (const epd__ofi_ep_t *ep = be->eps; ep != NULL; ep = ep->next) {
        if (epd__ofi_ep_has_work(be, ep)) {
            return EPD_ERR_BUSY;
        }
    }
    fids[0] = &be->cq->fid;
    ret = fi_trywait(be->fabric, fids, 1);
    if (ret == 0) {
        return EPD_OK;
    }
    if (ret == -FI_EAGAIN) {
        return EPD_ERR_BUSY;
    }
    epd_log_error(EPD__OFI_LOG, 0, "fi_trywait failed: %s", epd__fi.strerror(-ret));
    return EPD_ERR_TRANSPORT;
}

const epd__xport_backend_ops_t epd__xport_ofi_ops = {
    .size = sizeof(epd__xport_backend_ops_t),
    .name = "ofi",
    .create = epd__ofi_create,
    .destroy = epd__ofi_destroy,
    .address = epd__ofi_address,
    .describe = epd__ofi_describe,
    .ep_create = epd__ofi_ep_create,
    .ep_destroy = epd__ofi_ep_destroy,
    .ep_describe = epd__ofi_ep_describe,
    .send = epd__ofi_send,
    .write = epd__ofi_write,
    .flush = epd__ofi_flush,
    .mr_alloc = epd__ofi_mr_alloc,
    .mr_reg = epd__ofi_mr_reg,
    .mr_dereg = epd__ofi_mr_dereg,
    .mr_pack = epd__ofi_mr_pack,
    .rkey_unpack = epd__ofi_rkey_unpack,
    .rkey_destroy = epd__ofi_rkey_destroy,
    .grant_open = epd__ofi_grant_open,
    .grant_pack = epd__ofi_grant_pack,
    .grant_revoke = epd__ofi_grant_revoke,
    .grant_settled = epd__ofi_grant_settled,
    .grant_close = epd__ofi_grant_close,
    .limbo = epd__ofi_limbo,
    .progress = epd__ofi_progress,
    .get_fd = epd__ofi_get_fd,
    .arm = epd__ofi_arm,
};
