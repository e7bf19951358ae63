/*
 * epd_prefill_int.h — the prefill daemon's internals.
 *
 *   main.c                  flags -> config -> the daemon runtime (daemon/),
 *                           the local KV pool, the embedding region, the
 *                           compute thread, the callbacks the runtime calls
 *   epd_prefill_msg.c       the message layer: checks every request-plane
 *                           message as far as it can be checked without the
 *                           request table, refuses the bad ones, hands the
 *                           rest to the request layer
 *   epd_prefill_req.c       the request layer: the only place a request's
 *                           state changes (epd_prefill_req_state_t, one
 *                           step switch), the request id as a whole (abort,
 *                           tombstones, early reservations), leases, the
 *                           images a request waits for
 *   epd_prefill_ids.c       request ids with no live request: early
 *                           reservations (stash), how ended ids ended
 *                           (tombstones), the answers to late messages
 *   epd_prefill_pool.c      the local KV pool (its free blocks and slots)
 *                           and a request's memory
 *   epd_prefill_cache.c     the prefix cache: cached blocks a request
 *                           starts from, checkpoints, eviction
 *   epd_prefill_tier.c      the prefix cache's host and disk tier: evicted
 *                           blocks stored, restored when that beats
 *                           computing (called by the cache part only)
 *   epd_prefill_xfer.c      one request's KV transfer: the reservation and
 *                           its key, posting the writes, their completions,
 *                           LayerDone, PrefillComplete
 *   epd_prefill_media.c     the embedding region: its slots (the encoders'
 *                           landing zone and the image cache), placing a
 *                           request's images, quarantine, EmbedReservation /
 *                           Abort to encoders, checks
 *   epd_prefill_metrics.c   /metrics: the phase times of a request (rule
 *                           38) and their histograms, rendered
 *   epd_prefill_compute.c   the compute thread (own header)
 *   epd_prefill_plan.c      the pure write plan (own header)
 *
 * Calls go one way: main.c -> epd_prefill_msg.c -> epd_prefill_req.c ->
 * the parts (epd_prefill_ids.c, epd_prefill_pool.c, epd_prefill_cache.c,
 * epd_prefill_media.c, epd_prefill_xfer.c, epd_prefill_metrics.c) -> epd_prefill_compute.c,
 * epd_prefill_plan.c; among the parts: pool -> cache, xfer, plan; cache -> tier;
 * xfer -> plan; media -> compute; tier -> compute.
 * main.c also calls the request layer and the parts to set them up.  A
 * part never calls the request layer: it answers with return values, and
 * reaches it only through callbacks registered at start-up — the daemon's
 * ops (main.c), the compute thread's event callback, srv->on_written
 * (write completions).
 *
 * Threads: everything here belongs to the loop thread, except what the
 * compute thread reads and writes through a submitted job (see
 * epd_prefill_compute.h): the prompt, the block table, the layer checksums
 * and the embedding slots of the request until the job's last event.
 *
 * Re-entrancy: transport callbacks (write completions) and the daemon's
 * on_peer_dead may run nested inside a transport call; they only record
 * facts and mark requests dirty.  Requests are freed only by the pump (the
 * daemon's on_pump, at the top of the loop).
 */
#ifndef EPD_PREFILL_INT_H
#define EPD_PREFILL_INT_H

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "epd_daemon.h"
#include "epd_engine.h"
#include "epd_hash.h"
#include "epd_kvcache.h"
#include "epd_kvtier.h"
#include "epd_link.h"
#include "epd_msg.h"
#include "epd_peer.h"
#include "epd_prefix.h"
#include "epd_prefill_compute.h"
#include "epd_prefill_plan.h"
#include "epd_reqtab.h"
#include "epd_sample.h"
#include "epd_stash.h"
#include "epd_tomb.h"
#include "epd_trace.h"
#include "epd_xport.h"

#define EPD_PREFILL_LOG "prefill"
#define EPD_PREFILL_STASH_MAX 256 /* reservations that came before their request */
#define EPD_PREFILL_TOMB_MAX 4096 /* recently aborted / failed request ids */
/* --prefill-chunk-tokens defaults per engine.  sim models a GPU, where 8k
 * tokens per step is what the field runs (vLLM's max_num_batched_tokens,
 * SGLang's chunked-prefill-size); ref is the CPU reference, slow per
 * token: 2k keeps a short prompt's wait behind a long one near a second
 * at its test scales.  Other engines: off until measured. */
#define EPD_PREFILL_CHUNK_SIM 8192u
#define EPD_PREFILL_CHUNK_REF 2048u
#define EPD_PREFILL_CHUNK_DEFAULTS "ref 2048, sim 8192, others 0"
/* --compute-nice's default: the compute thread ahead of the loop and the
 * tier threads for the CPU (a late wake-up ends each chunk late: a
 * 1M-token prompt in 128 chunks, B's compute over A's by 3.9 ms on average
 * at 0, 2.4 at -10; epd-bench overhead, docs/long-context.md) */
#define EPD_PREFILL_COMPUTE_NICE (-10)

/* The default chunk of engine `name` (0: off).  Pure. */
static inline uint32_t epd_prefill_chunk_default(const char *name)
{
    if (name != NULL && strcmp(name, "sim") == 0) {
        return EPD_PREFILL_CHUNK_SIM;
    }
    if (name != NULL && strcmp(name, "ref") == 0) {
        return EPD_PREFILL_CHUNK_REF;
    }
    return 0;
}

/* --write-group-bytes default: every layer as it finishes.  Measured with
 * `epd-bench overhead --groups per-layer,64K,256K,1M,4M,1024M` at 128, 256
 * and 1k tokens on shm and TCP (docs/benchmarks/overhead.md of the time): no
 * grouping shortened the transfer tail where it mattered — a layer is one
 * write (its blocks coalesce), and since per-layer verification one small
 * fenced LayerDone; re-measured with it, grouping moved the end-to-end
 * medians within the noise, so posting early only hides more. */
#define EPD_PREFILL_WRITE_GROUP_DEFAULT 0
/* --write-chunk-bytes default: a 1 MiB put is ~50-80 us of memcpy on the
 * loop thread over shared memory, so a message waits at most that long
 * behind a large layer (a 32k-token dense layer at the shipped scale is
 * 6.4 MiB: seven passes of the loop). */
#define EPD_PREFILL_WRITE_CHUNK_DEFAULT (1u << 20)
/* zstd level of the KV tier: docs/prefix-cache.md "Host and disk tier" has the measurement
 * (epd-bench kvtier) that chose it */
#define EPD_PREFILL_TIER_LEVEL_DEFAULT 3
#define EPD_PREFILL_MEDIA_MAX 8 /* images per request (proto/README.md rule 13) */
#define EPD_PREFILL_HASH_BYTES 32 /* MediaRef.content_hash: BLAKE2b-256 */
/* The largest request-plane message: images may come inline (a cluster
 * without encoders) when the model has vision; 64 KiB otherwise. */
#define EPD_PREFILL_MSG_IMAGES (16u << 20)
#define EPD_PREFILL_MSG_TEXT (64u << 10)

/* Tombstone kinds (daemon/epd_tomb.h): how an id ended here, so that a late
 * KvReservation is answered the way the request really ended — an aborted
 * request must end as an abort whatever order the messages cross in. */
#define EPD_PREFILL_TOMB_ABORTED 1 /* an Abort (client, decode, encoder) ended it */
#define EPD_PREFILL_TOMB_FAILED 2  /* it failed here */

/*
 * Where one request stands.  Transitions happen in epd_prefill_req.c's step
 * function only, driven by facts the events record:
 *
 *   MEDIA --every image READY, run queued--> COMPUTING --DONE event--> COMPUTED
 *   COMPUTED --every layer posted, PrefillComplete (prefill only: the first
 *             token) sent--> LANDING --last write completed--> RELEASING
 *   any --failure, abort, lease, peer death--> FAILED --compute and the
 *             transport gave everything back, owed messages sent--> RELEASING
 *   RELEASING --RELEASED event--> DONE (freed at once)
 *
 * A request without images starts in COMPUTING (its run is queued at
 * admission).  Layers are written as they finish whenever the reservation
 * is there, in COMPUTING and COMPUTED alike.
 */
typedef enum {
    EPD_PREFILL_REQ_MEDIA = 1, /* waiting for its images: slots (possibly waiting for
                                * them, holding none), encoders' writes, local encodes */
    EPD_PREFILL_REQ_COMPUTING, /* the run is lent to the compute thread */
    EPD_PREFILL_REQ_COMPUTED,  /* the run is back (ok): the rest of the writes, then
                                * PrefillComplete fenced behind them */
    EPD_PREFILL_REQ_LANDING,   /* PrefillComplete sent: waiting for write completions */
    EPD_PREFILL_REQ_FAILED,    /* failed or aborted: see `owe` */
    EPD_PREFILL_REQ_RELEASING, /* the release job is lent to the compute thread */
    EPD_PREFILL_REQ_DONE,
} epd_prefill_req_state_t;

/* What a failure owes (epd_prefill_req.c's fail `tell`). */
#define EPD_PREFILL_TELL_CLIENT 0x1u /* an Error to the client */
#define EPD_PREFILL_TELL_DECODE 0x2u /* an Error to the decode worker */
#define EPD_PREFILL_QUIESCE 0x4u     /* WritesQuiesced to the decode worker once no
                                      * write of the request is in flight */
#define EPD_PREFILL_TELL_ALL (EPD_PREFILL_TELL_CLIENT | EPD_PREFILL_TELL_DECODE | EPD_PREFILL_QUIESCE)
#define EPD_PREFILL_ABORTED 0x8u     /* an Abort ended it (its tombstone says so) */

struct epd_prefill_srv;

/* ------------------------------------------------------- embedding slots */

/* One slot of the embedding region: one image's embeddings
 * ([image_embeddings][embed_dim] f32).  Lifecycle (proto/README.md rules
 * 15-19):
 *   FREE -> WAITING (taken for an image: an encoder's write, or our own
 *   encode) -> READY (verified; cached under `hash`; pinned while requests
 *   use it; the least recently used unpinned one is taken first when no
 *   slot is FREE) ... -> FREE (taken again as WAITING);
 *   WAITING -> QUARANTINED (its request ended while an encoder may still
 *   write) -> FREE once that encoder quiesced, sent its late EmbedComplete,
 *   or is dead and every endpoint of it closed. */
typedef enum {
    EPD_PREFILL_ES_FREE = 0,
    EPD_PREFILL_ES_WAITING,
    EPD_PREFILL_ES_READY,
    EPD_PREFILL_ES_QUARANTINED,
} epd_prefill_es_state_t;

typedef struct {
    uint32_t idx;
    epd_prefill_es_state_t state;
    unsigned char hash[EPD_PREFILL_HASH_BYTES]; /* READY: the image's content hash */
    uint32_t pins;        /* READY: requests whose prefill reads it */
    uint64_t req_id;      /* WAITING / QUARANTINED: taken for this request */
    uint32_t media_index; /* ... and this image of it */
    epd_peer_t *enc;      /* WAITING / QUARANTINED: the encoder that writes it
                           * (counted reference), NULL for our own encode */
    uint64_t used_ns;     /* last unpinned (LRU) */
    uint64_t asked_ns;    /* QUARANTINED: the last time its retired encoder was asked */
} epd_prefill_eslot_t;

/* Where one image of a request stands (the media part's: which slot it
 * holds and why; the request layer counts what is pending). */
typedef enum {
    EPD_PREFILL_MEDIA_UNPLACED = 0, /* no slot yet (the request may wait for slots) */
    EPD_PREFILL_MEDIA_ENCODER,      /* waiting for its encoder's EmbedComplete */
    EPD_PREFILL_MEDIA_LOCAL,        /* our compute thread encodes it (job lent) */
    EPD_PREFILL_MEDIA_READY,        /* its slot is READY and pinned by the request */
    EPD_PREFILL_MEDIA_GONE,         /* given back (quarantined, freed or unpinned) */
} epd_prefill_media_state_t;

typedef struct {
    epd_prefill_media_state_t state;
    uint32_t pos, n; /* placeholder positions [pos, pos + n) */
    unsigned char hash[EPD_PREFILL_HASH_BYTES];
    epd_prefill_eslot_t *slot;
    epd_peer_t *enc;     /* ENCODER (and after): the encoder, counted reference */
    unsigned char *data; /* an inline image for our own encode (owned) */
    size_t data_len;
    uint64_t t_start_ns; /* reservation sent / local encode queued */
    int hit;             /* READY from the cache at placement */
    /* its source, kept from the GenerateRequest until it is placed (the
     * request may wait for slots): an encoder (enc_addr != NULL), or data,
     * or neither (it must be cached) */
    char enc_id[EPD_WORKER_ID_MAX];
    epd_msg_epoch_t enc_epoch;
    unsigned char *enc_addr; /* owned */
    size_t enc_addr_len;
    /* our own encode: lent to the compute thread until ev comes back */
    epd_prefill_job_t job;
    epd_prefill_ev_t ev;
} epd_prefill_media_t;

/* A request waiting for embedding slots (the media part's FIFO, first come
 * first served: waiting requests hold no slot, so they cannot deadlock
 * each other). */
typedef struct epd_prefill_waiter {
    struct epd_prefill_waiter *next;
    const epd_prefill_media_t *media; /* [n], borrowed from the request */
    uint32_t n;
    uint64_t id;
    uint64_t since_ns;
    int waiting; /* in srv's FIFO */
} epd_prefill_waiter_t;

/* ---------------------------------------------------------- KV transfer */

typedef struct epd_prefill_xfer epd_prefill_xfer_t;

/* One layer's writes of one request: the completion callbacks' argument.
 * Its "KV write" trace spans are the layer's busy episodes: from a post
 * while none of its writes was in flight to the completion that leaves
 * none in flight and nothing being posted — one per layer unchunked, about
 * one per chunk and layer chunked (epd-bench overhead's floor reads them). */
typedef struct {
    epd_prefill_xfer_t *x;
    uint32_t layer;
    uint32_t inflight;  /* posted, not completed */
    int all_posted;     /* every write of the layer is posted */
    int failed;         /* a write of the layer completed with an error */
    int landed;         /* every write posted and completed (counted once) */
    int posting;        /* the loop is posting the layer's writes right now */
    uint64_t posted_ns; /* first post */
    uint64_t ep_ns;     /* the open episode's first post (0: none open) */
    uint64_t bytes;     /* posted so far */
} epd_prefill_lw_t;

/* One request's KV transfer (the xfer part's; inside the request).  The
 * request layer reads have_resv, writes_inflight, post_layer and more as
 * facts. */
struct epd_prefill_xfer {
    struct epd_prefill_srv *srv;
    uint64_t id;
    epd_peer_t *peer;           /* the decode worker (borrowed from the request) */
    epd_prefill_place_t local;  /* our blocks (borrowed from the request) and slot */
    int protocol_only;          /* GenerateRequest.protocol_only: messages, no writes */
    /* the reservation (valid when have_resv) */
    int have_resv;
    uint32_t *remote_blocks;    /* [n_blocks] */
    epd_prefill_place_t remote; /* block_ids = remote_blocks */
    uint64_t region_size;
    epd_xport_rkey_t *rkey;     /* unpacked on the peer's link; NULL once it died */
    int rkey_shared;            /* the peer's (borrowed, not destroyed here) */
    uint32_t d_lease_ms;        /* decode's lease on the reservation */
    uint32_t skip;              /* leading blocks decode holds already (not written) */
    int from_cache;             /* the KV has blocks of the prefix cache (no STAMPED sums) */
    int resumed;                /* a resume's decode tail wrote into it (no STAMPED sums) */
    int d_stamped;              /* decode verifies STAMPED checksums */
    int d_ranges;               /* decode verifies LayerDone block ranges (chunked) */
    /* the write runs, planned once when the reservation is taken */
    epd_prefill_run_t *runs;    /* [n_blocks] */
    uint32_t n_runs;
    /* posting: one cursor over layers in order, runs in order, bytes of a
     * run in chunks of at most srv->write_chunk_bytes */
    uint32_t post_layer, post_idx;
    uint64_t post_off;
    int more;                   /* posting stopped after a burst: go on at the next pump */
    uint32_t writes_inflight;
    uint64_t writes_posted, writes_coalesced;
    epd_prefill_lw_t *lw;       /* [n_layers] */
    uint64_t *checksums;        /* [n_layers], written by the compute thread (layer_sums) */
    uint8_t *sum_kinds;         /* [n_layers], likewise (layer_sum_kinds) */
    int sum_kind;               /* the request's epd_kv_sum_kind_t once chosen, else -1 */
    uint64_t last_d_msg_ns;     /* decode's lease keep-alive (LayerDone) */
    int backpressured;          /* a post was refused (logged once) */
    /* fault point prefill.pause_after_layer (common/epd_fault.h): this
     * transfer is the one that stops the process once its later layers are
     * computed (0: not armed for it) */
    int fault_pause;
    int cur_begun; /* the cursor's layer (post_layer) began: checksum taken */
    /* per-chunk streaming of a chunked run (attention layers, [n_layers]
     * each): blocks [0, ready_blocks) are final by an earlier chunk, [0,
     * sent_blocks) were posted ahead of the layer's end, and srun is the
     * run that holds block sent_blocks (a cursor: O(chunk) per chunk) */
    uint32_t *ready_blocks;
    uint32_t *sent_blocks;
    uint32_t *srun;
    /* ... and the layer's BYTES checksum over blocks [0, hashed_blocks),
     * hashed as they become final (NULL: none yet, or no memory for it —
     * then the whole layer is hashed at its end, as unchunked) */
    epd_hash_state_t **lhash;
    uint32_t *hashed_blocks;
    /* ... and the blocks [0, range_sent) a LayerDone with `blocks` told
     * decode about (rule 4: verified chunk by chunk) */
    uint32_t *range_sent;
};

/* -------------------------------------------------------------- request */

typedef struct epd_prefill_req {
    epd_reqent_t ent; /* srv->reqs, keyed (id, 0) */
    uint64_t id;
    epd_prefill_req_state_t state;
    struct epd_prefill_srv *srv;
    /* who asked */
    epd_link_t *client; /* counted reference */
    char client_id[EPD_WORKER_ID_MAX];
    epd_peer_t *peer;   /* the decode worker (counted); NULL: prefill only */
    int prefill_only;   /* no decode, no writes: the first token to the client */
    int more_listed;    /* counted in srv->n_more: stepped again at the next pump */
    /* the prompt and its local placement */
    int32_t *tokens;        /* [n_tokens] */
    uint32_t n_tokens;
    uint32_t n_blocks;      /* prompt blocks */
    uint32_t *local_blocks; /* [n_blocks] */
    uint32_t slot;          /* local state slot */
    /* the prefix cache (the cache part's): the run computes tokens
     * [start, n_tokens) — [start, replay_end) only to rebuild the state —
     * over the leading hit_blocks the cache lent (pinned) */
    epd_prefix_hash_t *keys; /* [n_keys]: the prompt's full blocks */
    uint32_t n_keys;
    uint32_t hit_blocks;
    uint32_t start, replay_end;
    uint32_t restore_ckpt;    /* arena slot the state starts from, or EPD_KVCACHE_NONE */
    epd_state_ckpt_t *ckpts;  /* [n_keys]: checkpoints the run takes */
    uint32_t *ckpt_slots;     /* [n_keys]: their arena slots (the request's until cached) */
    uint32_t n_ckpts;
    epd_prefill_xfer_t xfer;
    /* compute hand-off (lent from submit until the job's last event) */
    epd_prefill_job_t run_job, release_job;
    epd_prefill_ev_t *evs; /* [n_layers + 2]: layers, DONE, RELEASED */
    atomic_int cancel;
    /* facts the step function reads */
    int run_submitted;
    uint32_t layers_done;
    int compute_done; /* DONE consumed */
    epd_status_t compute_status;
    int32_t first_token;
    epd_sample_logprob_t first_logprob; /* when run_job.sample.logprobs > 0 */
    int complete_sent; /* PrefillComplete (or the first token) went out */
    int landed_seen;   /* its last write landed (observed once for /metrics) */
    int hold;          /* admitted under pressure: its run waits for the reservation */
    /* local_blocks[copy_from..) were still being copied out to the tier at
     * admission: no chunk writes them before the copies up to copy_wait
     * are done (the compute module parks the run; 0: none) */
    uint32_t copy_from;
    uint64_t copy_wait;
    int released;      /* RELEASED consumed */
    /* images: the run is queued once media_pending is 0 */
    epd_prefill_media_t *media; /* [n_media] */
    uint32_t n_media;
    uint32_t media_pending;    /* images not READY yet (set when placed) */
    uint32_t encodes_inflight; /* local encodes lent to the compute thread */
    epd_embed_span_t *spans;   /* [n_media], the run's */
    epd_prefill_waiter_t wait; /* waiting for slots (wait.waiting), holding none */
    /* clocks (epd_time_now_ns), for traces and the debug line */
    uint64_t t_admit_ns, t_start_ns, t_resv_ns, t_complete_ns, compute_done_ns,
        t_first_layer_ns;
    uint64_t t_media_ns;    /* every image ready, its run submitted (text: t_admit_ns) */
    uint64_t t_finished_ns; /* the compute thread finished the run */
    /* FAILED: why, and what it still owes */
    epd_status_t fail_status;
    char fail_msg[160];
    char fail_culprit[EPD_WORKER_ID_MAX]; /* the worker that caused it, if not us or the client */
    unsigned owe;                         /* EPD_PREFILL_TELL_* / QUIESCE not yet sent */
} epd_prefill_req_t;

typedef struct epd_prefill_srv {
    epd_daemon_t *d;
    const epd_engine_info_t *info;
    epd_trace_t *trace; /* the daemon's (NULL = off) */
    /* configuration (flags) */
    uint32_t kv_blocks, state_slots, lease_ms;
    /* while compute runs, finished layers are posted only once at least
     * this many of their bytes wait (0: every layer at once); after compute
     * everything left goes at once */
    uint64_t write_group_bytes;
    uint32_t chunk_tokens; /* --prefill-chunk-tokens, resolved (0: off) */
    /* after each layer's writes, a LayerDone (landed) fenced behind them, so
     * decode verifies that layer while the next ones compute */
    int layer_notify;
    /* a write is at most this long, and one pass posts at most this many
     * bytes before the loop gets back to its events (messages interleave
     * with a large layer's writes) */
    uint64_t write_chunk_bytes;
    epd_hash_state_t *hash; /* loop thread: BYTES checksums the engine did not compute */
    uint32_t n_more;        /* requests whose posting stopped after a burst */
    uint32_t embed_slots;
    uint64_t max_image_pixels; /* local encodes' pixel guard */
    /* rule 34: after a decode worker refused a reservation, runs admitted
     * until pressure_until_ns wait for their reservation before computing */
    int hold_under_pressure;
    uint64_t pressure_until_ns;
    /* the local KV pool, registered: the writes' source (the pool part's) */
    epd_xport_mr_t *pool_mr;
    epd_kv_pool_t pool;
    uint32_t *free_blocks, n_free_blocks; /* stack, lowest on top */
    uint32_t *free_slots, n_free_slots;   /* stack, lowest on top */
    epd_prefill_compute_t *compute;
    epd_engine_t *engine; /* until the compute thread takes it (setup) */
    const char *engine_name;
    /* the prefix cache (the cache part's; pcache NULL: off).  Cached blocks
     * are pool blocks that belong to the index, not to the free stack;
     * checkpoints are copies of every linear layer's state after a cached
     * block, in an arena of ckpt_slots slots of ckpt_bytes each */
    int prefix_cache;        /* --prefix-cache */
    int kv_prefault;         /* --kv-prefault: the pool committed at start */
    int compute_nice;        /* --compute-nice */
    epd_kvcache_t *pcache;
    epd_prefix_hash_t proot; /* the namespace without a salt */
    uint32_t ckpt_every;     /* a checkpoint every this many blocks (0: only each prompt's last) */
    uint64_t ckpt_budget;    /* bytes of the arena */
    uint32_t replay_budget;  /* tokens a hit may replay; more: the hit is cut back */
    uint64_t ckpt_bytes;     /* one checkpoint: n_linear_layers * state_bytes */
    unsigned char *ckpt_arena;
    uint32_t ckpt_slots, *ckpt_free, n_ckpt_free;
    uint32_t *blk_ckpt; /* [kv_blocks]: the checkpoint after a cached block, or NONE */
    struct {
        uint64_t requests, prompt_tokens, hit_tokens, computed_tokens, replayed_tokens;
        uint64_t replay_cut;            /* hits cut back to a checkpoint: over the budget */
        uint64_t ckpts_taken, ckpts_restored, ckpts_dropped, evictions;
        uint64_t ckpts_held; /* now */
    } pc;
    /* the host/disk tier (the tier part's; tier NULL: off) */
    uint64_t tier_host_bytes;  /* --kv-host-bytes */
    const char *tier_dir;      /* --kv-disk (borrowed from the flags), NULL: none */
    uint64_t tier_disk_bytes;  /* --kv-disk-bytes */
    int tier_persist;          /* --kv-disk-persist */
    int tier_level;            /* --kv-tier-level */
    epd_kvtier_t *tier;
    unsigned char *tier_buf;   /* one block's payload: attention KV then a checkpoint */
    size_t tier_blk_bytes;     /* its attention part */
    double tier_tps;           /* EWMA of the prefill's computed tokens per second */
    /* stores on their way: the tier thread packs them (epd_prefill_tier.c) */
    struct epd_handoff *tier_ho;
    struct epd_handoff *tier_copy_ho;      /* a large eviction's copies out of the pool */
    unsigned char **tier_spare;            /* payload buffers to reuse (a stack) */
    uint32_t tier_n_spare, tier_spare_max;
    epd_kvtier_packer_t *tier_packer;      /* the tier thread's */
    struct epd_prefill_tjob **tier_pend;   /* [EPD_PREFILL_TIER_BUCKETS]: by key, not inserted */
    struct epd_prefill_tjob *tier_jobs;    /* every job not freed yet */
    uint64_t tier_staged, tier_staged_max; /* payload bytes of the pending ones, and their cap */
    uint64_t tier_skipped;                 /* evicted blocks not kept: the cap was reached */
    /* a large eviction's blocks are copied out by the tier thread, not the
     * loop: the stores get sequence numbers, copied in order */
    uint64_t *blk_copy;          /* [kv_blocks]: the store copying a block out, 0: none */
    uint64_t tier_seq;           /* the last store numbered */
    uint64_t tier_copied;        /* every store up to this one is copied out */
    /* requests (the request layer's) */
    epd_reqtab_t reqs;
    int room; /* a write completed: retry the blocked */
    /* ids with no live request (the ids part's) */
    epd_stash_t *stash; /* early KvReservation / KvRefused, keyed (id, 0) */
    epd_tombs_t *tombs;
    /* write completions of the xfer part (registered by the request layer
     * at start-up): facts into the request, a kick of the pump */
    void (*on_written)(struct epd_prefill_srv *srv, epd_prefill_xfer_t *x, epd_status_t status);
    /* the embedding region (the media part's; embed_slots 0 = none) */
    uint64_t embed_slot_bytes; /* image_embeddings * embed_dim * 4 */
    epd_xport_mr_t *embed_mr;
    epd_prefill_eslot_t *eslots; /* [embed_slots] */
    epd_prefill_waiter_t *wait_head, *wait_tail; /* waiting for slots, in arrival order */
    int embed_room; /* a slot came free: the pump places the waiting */
    /* counters */
    uint64_t kv_bytes_sent;         /* bytes of layers whose writes all landed */
    uint64_t layer_notices;         /* landed LayerDones sent */
    uint64_t layer_notices_skipped; /* skipped: the link had messages waiting */
    uint64_t embed_hits, embed_misses, embed_local; /* images: cached, from an encoder, ours */
    uint64_t embed_parked; /* requests that waited for slots */
    uint64_t runs_held;    /* runs that waited for their reservation (rule 34) */
    uint64_t wasted_prefill_tokens; /* prompt tokens x layers computed / n_layers for
                                     * requests that ended without PrefillComplete */
    /* /metrics (epd_prefill_metrics.c renders; the request layer observes,
     * loop thread), one observation per request that sent PrefillComplete
     * (or its first token, prefill only) */
    struct {
        epd_prom_histo_t encode;   /* received -> every image ready (0: none) */
        epd_prom_histo_t queue;    /* ... -> its run started */
        epd_prom_histo_t compute;  /* the run */
        epd_prom_histo_t kv_tail;  /* compute done -> PrefillComplete posted */
        epd_prom_histo_t landed;   /* compute done -> the last write landed */
        epd_prom_histo_t prompt;   /* prompt tokens */
        epd_prom_histo_t cached;   /* of those, served by the prefix cache */
    } hist;
} epd_prefill_srv_t;

/* ---- epd_prefill_metrics.c ---- */
/* Zeroes srv->hist (before serve). */
void epd__prefill_metrics_init(epd_prefill_srv_t *srv);
/* Where a request's time went until now (rule 38): received -> images
 * ready -> run started -> run finished -> now (the PrefillComplete about to
 * be posted, or the first token of a prefill-only request), observed into
 * the histograms once and written to *t_p (for decode).  Loop thread. */
void epd__prefill_metrics_phases(epd_prefill_srv_t *srv, epd_prefill_req_t *req, uint64_t now,
                                 Epd__PhaseTimes *t_p);
/* LANDING: once its last write landed, compute done -> now, once. */
void epd__prefill_metrics_landed(epd_prefill_srv_t *srv, epd_prefill_req_t *req);
/* The role's part of /metrics (epd_daemon_metrics_cb_t; arg = srv). */
void epd__prefill_metrics_render(void *arg, const char *model, epd_prom_text_t *out);

/* ---- epd_prefill_msg.c (the daemon's on_msg) ---- */
int epd__prefill_on_msg(void *arg, epd_link_t *from, Epd__Envelope *env);

/* ---- epd_prefill_req.c ---- */
/* The request table; registers srv->on_written. */
epd_status_t epd__prefill_reqs_init(epd_prefill_srv_t *srv);
/* Frees every request (after epd_daemon_serve returned: the compute
 * thread and the transport hold nothing any more). */
void epd__prefill_reqs_cleanup(epd_prefill_srv_t *srv);
/* A checked GenerateRequest (sampling `sp` parsed) from `from`. */
void epd__prefill_req_generate(epd_prefill_srv_t *srv, epd_link_t *from, const Epd__Envelope *env,
                               const epd_sample_params_t *sp);
/* The message layer refused the GenerateRequest `id` with `status`: an
 * early reservation of it is answered. */
void epd__prefill_req_refused(epd_prefill_srv_t *srv, uint64_t id, epd_status_t status,
                              const char *msg);
/* A KvReservation or KvRefused; returns nonzero when `env` was kept. */
int epd__prefill_req_reservation(epd_prefill_srv_t *srv, epd_link_t *from, Epd__Envelope *env);
void epd__prefill_req_abort(epd_prefill_srv_t *srv, epd_link_t *from, const Epd__Envelope *env);
void epd__prefill_req_error(epd_prefill_srv_t *srv, epd_link_t *from, const Epd__Envelope *env);
/* From encoders: EmbedComplete, WritesQuiesced. */
void epd__prefill_req_embed_complete(epd_prefill_srv_t *srv, const Epd__Envelope *env);
void epd__prefill_req_quiesced(epd_prefill_srv_t *srv, const Epd__Envelope *env);
/* Callbacks registered by main.c: the compute thread's, the daemon's. */
void epd__prefill_req_on_event(void *arg, epd_prefill_ev_t *ev);
void epd__prefill_req_on_peer_dead(void *arg, epd_peer_t *peer, epd_status_t status,
                                   const char *why);
void epd__prefill_req_on_peer_closed(void *arg, epd_peer_t *peer);
int epd__prefill_req_on_pump(void *arg);
void epd__prefill_req_on_tick(void *arg, uint64_t now_ns);
void epd__prefill_req_on_stop(void *arg);

/* ---- epd_prefill_ids.c ---- */
/* The stash and the tombstones (start-up); cleanup frees what is kept. */
epd_status_t epd__prefill_ids_init(epd_prefill_srv_t *srv);
void epd__prefill_ids_cleanup(epd_prefill_srv_t *srv);
/* Request `id` ended here (EPD_PREFILL_TOMB_*); how it ended, 0: it did not
 * (recently). */
void epd__prefill_ids_end(epd_prefill_srv_t *srv, uint64_t id, int kind);
int epd__prefill_ids_ended(const epd_prefill_srv_t *srv, uint64_t id);
/* Answers a reservation or refusal `env` for an id that ended `kind` on
 * `to`: after an abort Error EPD_ERR_CANCELED "aborted", else (a
 * reservation) Error EPD_ERR_NOT_FOUND; then WritesQuiesced. */
void epd__prefill_ids_answer(epd_prefill_srv_t *srv, epd_link_t *to, const Epd__Envelope *env,
                             int kind);
/* A reservation or refusal for an id with no live request: answered when
 * the id ended here, else kept for a lease (returns nonzero: env taken, a
 * reference to `from` added). */
int epd__prefill_ids_early(epd_prefill_srv_t *srv, epd_link_t *from, Epd__Envelope *env);
/* Takes the kept message of `id` (the caller frees it and takes the
 * reference *from_p), or NULL. */
Epd__Envelope *epd__prefill_ids_take(epd_prefill_srv_t *srv, uint64_t id, epd_link_t **from_p);
/* Answers a kept message whose request will never run here (a
 * reservation: Error{status, why} + WritesQuiesced); takes env and from. */
void epd__prefill_ids_drop(epd_prefill_srv_t *srv, Epd__Envelope *env, epd_link_t *from,
                           epd_status_t status, const char *why);
/* The GenerateRequest `id` was refused: its kept message is answered. */
void epd__prefill_ids_refused(epd_prefill_srv_t *srv, uint64_t id, epd_status_t status,
                              const char *msg);
/* An Abort for an id with no live request. */
void epd__prefill_ids_abort(epd_prefill_srv_t *srv, epd_link_t *from, const Epd__Envelope *env);
/* Periodic: kept messages whose lease passed are answered. */
void epd__prefill_ids_expire(epd_prefill_srv_t *srv, uint64_t now_ns);

/* ---- epd_prefill_pool.c ---- */
/* The local pool, registered on the daemon's transport (it goes with it),
 * checked against `engine`, and its free stacks.  Logs a failure. */
epd_status_t epd__prefill_pool_init(epd_prefill_srv_t *srv, epd_engine_t *engine);
void epd__prefill_pool_cleanup(epd_prefill_srv_t *srv);
/* A request for checked GenerateRequest `g`: its memory, its local blocks
 * and state slot, its run and release jobs (not submitted), its transfer
 * to `peer` (NULL: prefill only; on success the caller's reference becomes
 * the request's).  Who asked and its state are the caller's to set.
 * EPD_ERR_NO_CAPACITY or EPD_ERR_NO_MEMORY (nothing kept). */
epd_status_t epd__prefill_pool_admit(epd_prefill_srv_t *srv, const Epd__GenerateRequest *g,
                                     const epd_sample_params_t *sp, epd_peer_t *peer,
                                     epd_prefill_req_t **req_p);
/* Its blocks and slot back, its references dropped, its memory freed
 * (nothing may hold any of it any more). */
void epd__prefill_pool_free(epd_prefill_srv_t *srv, epd_prefill_req_t *req);

/* ---- epd_prefill_cache.c ---- */
/* The prefix cache (flags set in srv; after the pool): its index and the
 * checkpoint arena, or nothing when it is off.  Logs a failure. */
epd_status_t epd__prefill_cache_init(epd_prefill_srv_t *srv, const char *engine_name);
void epd__prefill_cache_cleanup(epd_prefill_srv_t *srv);
/* Admission: req's blocks for checked GenerateRequest `g` (req->n_tokens,
 * tokens and n_blocks set): the leading ones the cache holds (pinned), the
 * compute start, the replay, the state to restore and the checkpoints to
 * take (slots reserved), fresh blocks for the rest (evicting unpinned
 * cached blocks when the free ones do not cover them), into
 * req->local_blocks.  EPD_ERR_NO_CAPACITY (nothing held) or
 * EPD_ERR_NO_MEMORY. */
epd_status_t epd__prefill_cache_place(epd_prefill_srv_t *srv, epd_prefill_req_t *req,
                                      const Epd__GenerateRequest *g);
/* req's run finished well: its fresh full blocks and its checkpoints are
 * cached (it keeps its pins until release). */
void epd__prefill_cache_computed(epd_prefill_srv_t *srv, epd_prefill_req_t *req);
/* req's blocks back (nothing of them in flight): its pins dropped deepest
 * first, what is not cached freed, checkpoint slots nobody took freed. */
void epd__prefill_cache_release(epd_prefill_srv_t *srv, epd_prefill_req_t *req);
/* The cache's counters for the control plane (all zero when off). */
void epd__prefill_cache_stats(const epd_prefill_srv_t *srv, epd_prefix_stats_t *s_p);
/* Blocks a request could get now: free, plus cached ones nobody pins. */
uint32_t epd__prefill_cache_available(const epd_prefill_srv_t *srv);

/* The host/disk tier (after the cache; off without pcache or with neither
 * --kv-host-bytes nor --kv-disk).  EPD_OK or the failure (logged). */
epd_status_t epd__prefill_tier_init(epd_prefill_srv_t *srv);
void epd__prefill_tier_cleanup(epd_prefill_srv_t *srv);
/* Joins the tier thread (shutdown step 5; stores not packed yet are not
 * kept).  Idempotent. */
void epd__prefill_tier_stop(epd_prefill_srv_t *srv);
/* Puts pool block `block` (evicted under key) and its checkpoint (ckpt:
 * ckpt_bytes, borrowed; NULL: none) into the tier.  defer: the tier thread
 * copies the block's KV out (the checkpoint is copied now); until it has,
 * srv->blk_copy[block] names the store and nothing may write the block
 * (epd__prefill_tier_copying).  Otherwise the KV is copied now. */
void epd__prefill_tier_store(epd_prefill_srv_t *srv, const epd_prefix_hash_t *key, uint32_t block,
                             const void *ckpt, int defer);
/* The store that must be copied out before blocks[0..n) may be written
 * (compare with srv->tier_copied), or 0 when none is on its way. */
uint64_t epd__prefill_tier_copying(const epd_prefill_srv_t *srv, const uint32_t *blocks,
                                   uint32_t n);
/* Reorders blocks[0..n): those still being copied out to the tier last.
 * Returns how many are not. */
uint32_t epd__prefill_tier_copies_last(const epd_prefill_srv_t *srv, uint32_t *blocks,
                                       uint32_t n);
/* How many of keys[0..n) (consecutive, from the first) to restore from
 * the tier: the run the tier holds, or 0 when computing them is faster. */
uint32_t epd__prefill_tier_worth(epd_prefill_srv_t *srv, const epd_prefix_hash_t *keys,
                                 uint32_t n);
/* Restores key's block into free pool block `block` (verified); *ckpt_p its
 * checkpoint (ckpt_bytes in the tier's buffer, valid until the next tier
 * call) or NULL.  EPD_OK or why not (the block is not used). */
epd_status_t epd__prefill_tier_restore(epd_prefill_srv_t *srv, const epd_prefix_hash_t *key,
                                       uint32_t block, const void **ckpt_p);
/* A finished run computed `tokens` in `ns`: the prefill rate. */
void epd__prefill_tier_ran(epd_prefill_srv_t *srv, uint64_t tokens, uint64_t ns);
/* The tier's fields of *s_p. */
void epd__prefill_tier_stats(const epd_prefill_srv_t *srv, epd_prefix_stats_t *s_p);

/* ---- epd_prefill_xfer.c ---- */
/* Sets up x for request `id` to decode `peer` (borrowed) from our blocks
 * local_blocks[0..n_blocks) (borrowed) and `slot`: its arrays.  EPD_OK or
 * EPD_ERR_NO_MEMORY. */
epd_status_t epd__prefill_xfer_init(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x, uint64_t id,
                                    epd_peer_t *peer, const uint32_t *local_blocks,
                                    uint32_t n_blocks, uint32_t slot);
/* Frees x's arrays and the key it unpacked for itself. */
void epd__prefill_xfer_cleanup(epd_prefill_xfer_t *x);
/* Checks reservation `r` (layout, blocks, region, the key unpacked on our
 * link to the peer and covering the region) and takes it into x.  EPD_OK,
 * or the refusal with msg[0..cap) saying why (EPD_ERR_PEER_DEAD: the decode
 * worker is gone). */
epd_status_t epd__prefill_xfer_take(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x,
                                    const Epd__KvReservation *r, char *msg, size_t cap);
/* Posts every write of layers [post_layer, layers_done) that may go now
 * (write grouping while compute runs), with a LayerDone after each layer
 * (not after the last one once compute is done: PrefillComplete follows at
 * once and covers it), at most write_chunk_bytes in one pass (x->more:
 * call again at the next pump).  EPD_OK; EPD_ERR_NO_RESOURCE when the
 * transport pushed back (the cursor stays: post again after room was made);
 * another error with msg[0..cap) when the transfer cannot go on. */
/* An earlier chunk of a chunked run made layer `layer`'s attention rows
 * [0, final_tokens) final: its full blocks may go to decode now (posted by
 * the next epd__prefill_xfer_post).  Loop thread. */
void epd__prefill_xfer_chunk_ready(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x, uint32_t layer,
                                   uint32_t final_tokens);

epd_status_t epd__prefill_xfer_post(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x,
                                    uint32_t layers_done, int compute_done, char *msg, size_t cap);
/* PrefillComplete{first_token, n_tokens, checksums, times (borrowed; rule 38),
 * first_logprob (borrowed; NULL: none)},
 * fenced behind every
 * write; EPD_OK or the link's failure. */
epd_status_t epd__prefill_xfer_complete(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x,
                                        int32_t first_token, uint32_t n_tokens,
                                        const Epd__PhaseTimes *times,
                                        const epd_sample_logprob_t *first_logprob);
/* Prefill only: TokenChunk{index 0, [first_token], finish LENGTH} to the
 * client (a failure is logged: the request is over either way). */
void epd__prefill_xfer_first_token(epd_prefill_srv_t *srv, epd_link_t *client, uint64_t id,
                                   int32_t first_token);
/* Decode's lease keep-alive during a long layer: the last posted layer's
 * LayerDone again, at most every lease/4. */
/* What a failed request owes its decode worker (`owe`: EPD_PREFILL_TELL_DECODE,
 * EPD_PREFILL_QUIESCE once no write is in flight; a dead link's WritesQuiesced
 * goes to the daemon, rule 28), sent as far as it can be: returns what is
 * still owed. */
unsigned epd__prefill_xfer_owed(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x, unsigned owe,
                                epd_status_t status, const char *msg);
void epd__prefill_xfer_keepalive(epd_prefill_srv_t *srv, epd_prefill_xfer_t *x, uint64_t now_ns);
/* The peer's link is going: its key dies with it. */
void epd__prefill_xfer_forget_key(epd_prefill_xfer_t *x);
/* A transport failure seen by one request: connection-scope errors become
 * EPD_ERR_PEER_DEAD, a request-scope one keeps its code. */
epd_status_t epd__prefill_xfer_peer_status(epd_status_t st);

/* ---- epd_prefill_media.c ---- */
/* Allocates and registers the embedding region when the engine has vision
 * and embed_slots > 0 (start-up; it goes with the transport). */
epd_status_t epd__prefill_media_init(epd_prefill_srv_t *srv);
void epd__prefill_media_cleanup(epd_prefill_srv_t *srv);
/* Copies image `i`'s source from `mr` into m.  EPD_OK, or EPD_ERR_NOT_FOUND
 * (not cached here and no source) / EPD_ERR_NO_MEMORY with msg. */
epd_status_t epd__prefill_media_copy(epd_prefill_srv_t *srv, epd_prefill_media_t *m, uint32_t i,
                                     const Epd__MediaRef *mr, char *msg, size_t cap);
/* May m[0..n) be placed now: nobody waits for slots before them, and the
 * free and evictable slots cover their uncached images? */
int epd__prefill_media_fits(epd_prefill_srv_t *srv, const epd_prefill_media_t *m, uint32_t n);
/* w (filled: media, n, id) waits for slots at the end of the FIFO. */
void epd__prefill_media_wait(epd_prefill_srv_t *srv, epd_prefill_waiter_t *w);
/* Takes w out of the FIFO (no-op when it does not wait). */
void epd__prefill_media_unwait(epd_prefill_srv_t *srv, epd_prefill_waiter_t *w);
/* The first waiter, taken out of the FIFO when its images fit now (NULL:
 * none does); the pump places it. */
epd_prefill_waiter_t *epd__prefill_media_next_fit(epd_prefill_srv_t *srv);
/* The first waiter when it has waited longer than the lease, or NULL. */
epd_prefill_waiter_t *epd__prefill_media_overdue(epd_prefill_srv_t *srv, uint64_t now_ns);
/* The first of m[0..n) whose encoder has been silent for the lease, or
 * NULL. */
const epd_prefill_media_t *epd__prefill_media_silent(const epd_prefill_srv_t *srv,
                                                     const epd_prefill_media_t *m, uint32_t n,
                                                     uint64_t now_ns);
/*
 * Places every image of m[0..n) of request `id` (the slots are there:
 * epd__prefill_media_fits): cached ones pinned, then a slot for each other
 * one — its encoder (one link per incarnation, epd_peer_get) gets an
 * EmbedReservation, or our compute thread encodes it (the job lent, its
 * event's owner `owner`).  Stops at once when *failed (the request's
 * failure status) is no longer EPD_OK: retiring an older encoder
 * incarnation may fail the very request being placed.  *pending_p: the
 * images still to come; *encodes_p: the encodes submitted (both also on
 * failure).  EPD_OK, or the failure with msg and *culprit_p (the encoder
 * to name in the client's Error, or NULL); what was placed stays placed
 * for the caller to give back.
 */
epd_status_t epd__prefill_media_place(epd_prefill_srv_t *srv, epd_prefill_media_t *m, uint32_t n,
                                      uint64_t id, void *owner, const epd_status_t *failed,
                                      uint32_t *pending_p, uint32_t *encodes_p, char *msg,
                                      size_t cap, const char **culprit_p);
/* The run's embedding spans of m[0..n): each image's position, length and
 * the rows of its slot (spans[0..n), the caller's). */
void epd__prefill_media_spans(const epd_prefill_srv_t *srv, const epd_prefill_media_t *m,
                              uint32_t n, epd_embed_span_t *spans);
/* Our own encode of m came back with `status`: READY (EPD_OK) or its slot
 * free (GONE) and what was wrong with the image in msg. */
void epd__prefill_media_encoded(epd_prefill_srv_t *srv, epd_prefill_media_t *m,
                                epd_status_t status, char *msg, size_t cap);
/* Checks an EmbedComplete for m (fenced behind the write: the bytes are
 * final): READY, or the slot free (GONE) and the refusal with msg. */
epd_status_t epd__prefill_media_verify(epd_prefill_srv_t *srv, epd_prefill_media_t *m,
                                       const Epd__EmbedComplete *ec, char *msg, size_t cap);
/* Gives back what m holds for request `id`: a slot its encoder may still
 * write is quarantined (an Abort{reason} goes to the encoder); with `final`
 * (the run is done, or will never run) a READY slot is unpinned too.
 * Idempotent. */
void epd__prefill_media_give_back(epd_prefill_srv_t *srv, epd_prefill_media_t *m, uint64_t id,
                                  const char *reason, int final);
/* Is `env`'s sender m's encoder (that incarnation)? */
int epd__prefill_media_from(const epd_prefill_media_t *m, const Epd__Envelope *env);
/* `env`'s sender quiesced request `id`: its quarantined slots of it are
 * free.  Returns how many. */
uint32_t epd__prefill_media_quiesced(epd_prefill_srv_t *srv, uint64_t id, const Epd__Envelope *env);
/* A late EmbedComplete for a quarantined slot frees it; nonzero when one was. */
int epd__prefill_media_late(epd_prefill_srv_t *srv, const Epd__EmbedComplete *ec,
                            const Epd__Envelope *env);
/* Encoder `peer` is dead and every endpoint of it closed: its quarantined
 * slots are free once its fence settled (epd_peer_fenced), else held. */
void epd__prefill_media_encoder_gone(epd_prefill_srv_t *srv, epd_peer_t *peer);
/* Tick: frees quarantined slots of retired encoders whose fence settled;
 * asks the others to confirm (epd_peer_ask_quiesced). */
void epd__prefill_media_tick(epd_prefill_srv_t *srv, uint64_t now_ns);
/* Slots held in quarantine now (Load.quarantined). */
uint32_t epd__prefill_media_quarantined(const epd_prefill_srv_t *srv);

#endif
