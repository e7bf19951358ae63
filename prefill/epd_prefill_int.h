/*
 * epd_prefill_int.h — the prefill daemon's internals, shared by its modules:
 *
 *   main.c                  flags, start-up, signals, shutdown
 *   epd_prefill_msg.c       request plane: transport callbacks, message
 *                           handlers, decode peers, epochs, early
 *                           reservations, tombstones of aborted ids
 *   epd_prefill_xfer.c      the per-request state machine: admission,
 *                           posting writes per finished layer, checksums,
 *                           completion, failure, abort, release
 *   epd_prefill_rpc.c       control plane (Health, Status, Drain)
 *   epd_prefill_compute.c   the compute thread (own header)
 *   epd_prefill_plan.c      pure write-plan arithmetic (own header)
 *
 * Threads: everything here belongs to the loop thread, except what the
 * compute thread reads through a submitted job (see epd_prefill_compute.h).
 *
 * Re-entrancy rule: transport callbacks (write completions, endpoint
 * errors, messages) may run nested inside any epd_xport_* call.  They only
 * record facts and mark requests dirty; requests are freed and our
 * endpoints to decode workers closed (their remote keys die with them) only
 * by epd__prefill_on_pump, which runs at the top of the loop (a uv_idle),
 * never nested inside a transport call.  The one exception: an accepted
 * endpoint (a client's, or a decode worker's own) that failed is closed
 * inside the error callback, after every pointer to it was dropped — the
 * transport parks it until its own stack unwinds.
 */
#ifndef EPD_PREFILL_INT_H
#define EPD_PREFILL_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include <uv.h>

#include "epd_engine.h"
#include "epd_hash.h"
#include "epd_log.h"
#include "epd_msg.h"
#include "epd_prefill_compute.h"
#include "epd_prefill_plan.h"
#include "epd_registrar.h"
#include "epd_rpc.h"
#include "epd_sample.h"
#include "epd_trace.h"
#include "epd_xport.h"
#include "epd_xport_uv.h"

#define EPD_PREFILL_LOG "prefill"
#define EPD_PREFILL_ID_MAX 128    /* worker id bytes, NUL included */
#define EPD_PREFILL_STASH_MAX 256 /* reservations that came before their request */
#define EPD_PREFILL_TOMB_MAX 4096 /* recently aborted / failed request ids */
/* --write-group-bytes default: every layer as it finishes.  Measured with
 * `epd-bench overhead --groups per-layer,64K,256K,1M,4M,1024M` at 128, 256
 * and 1k tokens on shm and TCP (README.md "What disaggregation costs"): no
 * grouping shortened the transfer tail where it mattered — a layer is one
 * write (its blocks coalesce), and since per-layer verification one small
 * fenced LayerDone; re-measured with it, grouping moved the end-to-end
 * medians within the noise, so posting early only hides more. */
#define EPD_PREFILL_WRITE_GROUP_DEFAULT 0
#define EPD_PREFILL_MEDIA_MAX 8 /* images per request (proto/README.md rule 13) */

typedef epd_msg_epoch_t epd_prefill_epoch_t; /* epd_msg_epoch_cmp, epd_msg_epoch_of */

typedef enum {
    EPD_PREFILL_ROLE_DECODE = 1, /* we write its KV reservations */
    EPD_PREFILL_ROLE_ENCODER,    /* it writes our embedding slots */
} epd_prefill_role_t;

typedef enum {
    EPD_PREFILL_PEER_CONNECTING = 1,
    EPD_PREFILL_PEER_UP,
    EPD_PREFILL_PEER_DEAD, /* failed or retired: no more sends, ep closed by the pump */
} epd_prefill_peer_state_t;

/* Our endpoint to one decode or encoder worker incarnation (worker id +
 * epoch). */
typedef struct epd_prefill_peer {
    char worker_id[EPD_PREFILL_ID_MAX];
    epd_prefill_epoch_t epoch;
    epd_prefill_role_t role;
    /* an encoder's own endpoint to us (where its messages arrive), so that
     * it is closed too when the encoder is declared dead: only then can the
     * slots it might still write be recycled */
    epd_xport_ep_t *in_ep;
    epd_xport_ep_t *ep; /* ours (connected by us); NULL once closed */
    epd_prefill_peer_state_t state;
    epd_status_t dead_status;
    uint32_t n_reqs; /* requests and embedding slots bound to it (it lives while > 0) */
    /* decode's packed key of its KV region, unpacked once on ep and shared by
     * every request that names the same key: unpacking per request would
     * map the region afresh each time (on shared memory every page of every
     * request's KV then faults in again — measured: most of the transfer
     * time).  Destroyed by closing ep. */
    epd_xport_rkey_t *rkey;
    unsigned char rkey_blob[EPD_XPORT_RKEY_MAX];
    size_t rkey_len;
    int listed;                    /* in srv->peers (lookup by id) */
    struct epd_prefill_peer *next; /* srv->peers */
} epd_prefill_peer_t;

typedef struct epd_prefill_req epd_prefill_req_t;
struct epd_prefill_srv;

/* One slot of the embedding region: one image's embeddings
 * ([image_embeddings][embed_dim] f32).  Lifecycle (proto/README.md rules
 * 15-19):
 *   FREE -> WAITING (taken for a request: an encoder's write, or our own
 *   encode) -> READY (verified; cached under `hash`; pinned while requests
 *   use it, the least recently used unpinned one is taken first when no
 *   slot is FREE) ... -> FREE (taken again as WAITING);
 *   WAITING -> QUARANTINED (its request ended while an encoder may still
 *   write) -> FREE once that encoder quiesced or was declared dead. */
typedef enum {
    EPD_PREFILL_ES_FREE = 0,
    EPD_PREFILL_ES_WAITING,
    EPD_PREFILL_ES_READY,
    EPD_PREFILL_ES_QUARANTINED,
} epd_prefill_es_state_t;

typedef struct {
    uint32_t idx;
    epd_prefill_es_state_t state;
    unsigned char hash[32];  /* READY: the image's content hash */
    uint32_t pins;           /* READY: requests whose prefill reads it */
    uint64_t req_id;         /* WAITING / QUARANTINED: taken for this request */
    uint32_t media_index;    /* ... and this image of it */
    struct epd_prefill_peer *enc; /* WAITING / QUARANTINED: the encoder that writes
                                   * it (counted ref), NULL for our own encode */
    uint64_t used_ns;        /* last unpinned (LRU) */
} epd_prefill_eslot_t;

/* Where one image of a request stands. */
typedef enum {
    EPD_PREFILL_MEDIA_ENCODER = 1, /* waiting for its encoder's EmbedComplete */
    EPD_PREFILL_MEDIA_LOCAL,       /* our compute thread encodes it */
    EPD_PREFILL_MEDIA_READY,       /* its slot is READY and pinned by us */
    EPD_PREFILL_MEDIA_GONE,        /* given back (quarantined, freed or unpinned) */
} epd_prefill_media_state_t;

typedef struct {
    epd_prefill_media_state_t state;
    uint32_t pos, n;          /* placeholder positions [pos, pos + n) */
    unsigned char hash[32];
    epd_prefill_eslot_t *slot;
    struct epd_prefill_peer *enc; /* ENCODER: counted ref */
    unsigned char *data;      /* LOCAL: the encoded image (owned) */
    size_t data_len;
    uint64_t t_start_ns;      /* reservation sent / local encode queued */
    int hit;                  /* READY from the cache at arrival */
    /* its source, kept from the GenerateRequest until it is placed (the
     * request waits when no slot is free): an encoder, or data (then
     * `data` above holds the bytes), or neither (it must be cached) */
    char enc_id[EPD_PREFILL_ID_MAX];
    epd_prefill_epoch_t enc_epoch;
    unsigned char *enc_addr; /* owned; NULL: no encoder */
    size_t enc_addr_len;
} epd_prefill_media_t;

/* One layer's writes of one request: the completion callbacks' argument, so
 * that a layer's "KV write" trace span runs from its first post to its last
 * completion. */
typedef struct {
    epd_prefill_req_t *req;
    uint32_t layer;
    uint32_t inflight;  /* posted, not completed */
    int all_posted;     /* every write of the layer is posted */
    int failed;         /* a write of the layer completed with an error */
    int landed;         /* every write posted and completed (counted once) */
    uint64_t posted_ns; /* first post */
    uint64_t bytes;     /* posted so far */
} epd_prefill_lw_t;

struct epd_prefill_req {
    uint64_t id;
    struct epd_prefill_srv *srv;
    epd_prefill_req_t *hnext;               /* srv->table chain */
    epd_prefill_req_t *lprev, *lnext;       /* srv->dirty or srv->blocked */
    int list;                               /* 0 none, 1 dirty, 2 blocked */
    epd_prefill_req_t *all_prev, *all_next; /* srv->all */
    /* who asked */
    epd_xport_ep_t *client_ep; /* NULL once that endpoint failed */
    char client_id[EPD_PREFILL_ID_MAX];
    epd_prefill_peer_t *peer; /* the decode worker (counted ref) */
    /* the prompt and its local placement */
    int32_t *tokens; /* [n_tokens] */
    uint32_t n_tokens;
    uint32_t n_blocks;      /* prompt blocks */
    uint32_t *local_blocks; /* [n_blocks] */
    uint32_t slot;          /* local state slot */
    /* the reservation (valid when have_resv) */
    int have_resv;
    uint32_t *remote_blocks; /* [n_blocks] */
    epd_prefill_place_t remote;
    uint64_t region_size;
    epd_xport_rkey_t *rkey; /* on peer->ep; NULL once that ep closed */
    int rkey_shared;        /* rkey is peer->rkey (borrowed, not destroyed here) */
    /* compute hand-off */
    epd_prefill_job_t run_job, release_job;
    epd_prefill_ev_t *evs; /* [n_layers + 2]: layers, DONE, RELEASED */
    atomic_int cancel;
    int compute_done; /* DONE consumed */
    epd_status_t compute_status;
    int32_t first_token;
    uint32_t layers_done;
    int release_queued, released;
    /* transfer */
    uint32_t post_layer, post_idx; /* next write to post */
    uint32_t writes_inflight;
    uint64_t writes_posted;
    uint64_t *checksums;      /* [n_layers], written by the compute thread (run_job.layer_sums) */
    uint64_t last_d_msg_ns;   /* lease keep-alive (LayerDone) */
    uint32_t d_lease_ms;      /* decode's lease on the reservation */
    uint64_t compute_done_ns; /* P's lease on the reservation */
    /* timings (loop thread clock), for the per-request debug line */
    uint64_t t_admit_ns, t_start_ns, t_resv_ns, t_complete_ns;
    /* outcome */
    int failed; /* failed or aborted: no more writes */
    epd_status_t fail_status;
    char fail_msg[160];
    char fail_culprit[EPD_PREFILL_ID_MAX]; /* the worker that caused it, if not us or the client */
    int tell_client;   /* Error to the client pending */
    int tell_d;        /* Error to decode pending */
    int need_quiesced; /* WritesQuiesced to decode pending */
    int complete_sent;
    int backpressured; /* a post was refused (logged once) */
    /* prefill-only (GenerateRequest.prefill_only): no decode, no writes;
     * the first token goes to the client in a TokenChunk */
    int prefill_only;
    /* media (multimodal prompts): the run is submitted once media_pending
     * reaches 0; encodes_inflight counts ENCODE jobs lent to compute */
    epd_prefill_media_t *media; /* [n_media] */
    uint32_t n_media;
    uint32_t media_pending;
    /* waiting for embedding slots (srv->park_head FIFO): nothing of the
     * region is held meanwhile; failed after lease_ms */
    int parked;
    uint64_t t_park_ns;
    struct epd_prefill_req *park_next;
    uint32_t encodes_inflight;
    int run_submitted;
    epd_embed_span_t *spans;          /* [n_media], the run's */
    epd_prefill_job_t *encode_jobs;   /* [n_media] */
    epd_prefill_ev_t *encode_evs;     /* [n_media] */
    epd_prefill_lw_t *lw;      /* [n_layers] */
    uint64_t t_first_layer_ns; /* layer 0 done (loop clock) */
    uint64_t writes_coalesced; /* block writes merged into a neighbour */
};

typedef struct epd_prefill_srv {
    /* configuration (flags) */
    const char *model_dir;
    char model_name[128]; /* last path component of model_dir */
    const char *engine_name;
    char worker_id[EPD_PREFILL_ID_MAX];
    const char *transport;
    const char *expect;
    const char *provider;
    const char *control_addr;
    const char *ready_file;
    uint32_t kv_blocks, state_slots, block_tokens;
    uint32_t lease_ms, peer_timeout_ms, connect_timeout_ms;
    /* identity */
    epd_prefill_epoch_t epoch;
    uint64_t seq; /* envelope sequence */
    /* loop and its handles */
    uv_loop_t *loop;
    uv_idle_t pump;
    int pump_on;
    uv_timer_t timer; /* leases, stash and tombstone expiry, retries */
    uv_signal_t sigterm, sigint, sigusr1;
    int stopping;
    /* engine, pool, compute */
    const epd_engine_info_t *info;
    epd_xport_t *x;
    epd_xport_uv_t *xuv;
    epd_xport_mr_t *pool_mr;
    epd_kv_pool_t pool;
    epd_prefill_compute_t *compute;
    epd_rpc_server_t *rpc;
    epd_registrar_t *registrar; /* --router; NULL = not registering */
    const void *addr;           /* our data-plane address (borrowed from x) */
    size_t addr_len;
    /* local pool allocation */
    uint32_t *free_blocks; /* stack */
    uint32_t n_free_blocks;
    uint32_t *free_slots; /* stack */
    uint32_t n_free_slots;
    /* requests */
    epd_prefill_req_t **table; /* [table_size] chains, by id */
    uint32_t table_size;
    uint32_t n_live;
    epd_prefill_req_t *all;
    epd_prefill_req_t *dirty_head, *dirty_tail;
    epd_prefill_req_t *blocked_head, *blocked_tail;
    int room; /* a write completed: retry the blocked */
    epd_prefill_peer_t *peers;
    /* early reservations, tombstones */
    struct epd_prefill_stash {
        Epd__Envelope *env; /* owned */
        epd_xport_ep_t *ep; /* where it came from */
        uint64_t expires_ns;
    } stash[EPD_PREFILL_STASH_MAX];
    uint32_t n_stash;
    struct epd_prefill_tomb {
        uint64_t id;
        uint64_t expires_ns;
    } tombs[EPD_PREFILL_TOMB_MAX];
    uint32_t tomb_next;
    char known_d[32][EPD_PREFILL_ID_MAX]; /* decode worker ids seen in requests */
    uint32_t known_d_next;
    /* state */
    int draining;
    uint64_t bad_frames;
    uint64_t served, failed_reqs;
    epd_log_limit_t log_limit;
    unsigned char *tx_buf; /* [tx_cap], loop thread scratch for frames */
    size_t tx_cap;
    /* write grouping: while compute runs, finished layers are posted only
     * once at least this many of their bytes wait (0: every layer at once);
     * after compute everything left goes at once */
    uint64_t write_group_bytes;
    /* per-layer verification: after each layer's writes, a LayerDone
     * (landed = true) fenced behind them, so decode hashes that layer while
     * the next ones compute (--layer-notify; 0 = only PrefillComplete) */
    int layer_notify;
    uint64_t kv_bytes_sent;    /* bytes of layers whose writes all landed */
    /* the embedding region (engines with vision; embed_slots 0 = none) */
    uint32_t embed_slots;
    uint64_t embed_slot_bytes; /* image_embeddings * embed_dim * 4 */
    epd_xport_mr_t *embed_mr;
    unsigned char embed_rkey[EPD_XPORT_RKEY_MAX];
    size_t embed_rkey_len;
    epd_prefill_eslot_t *eslots; /* [embed_slots] */
    uint64_t max_image_pixels;   /* local encodes' pixel guard */
    uint64_t embed_hits, embed_misses, embed_local; /* images: cached, from an encoder, ours */
    uint64_t embed_parked;     /* requests that waited for slots */
    epd_prefill_req_t *park_head, *park_tail; /* waiting for slots, in arrival order */
    int embed_room;            /* a slot came free: the pump places the parked */
    uint64_t layer_notices;    /* landed LayerDones sent */
    uint64_t layer_notices_skipped; /* refused by backpressure (decode verifies at the end) */
    epd_trace_t *trace;     /* --trace; NULL = off */
    const char *trace_path; /* where the JSON goes at exit / SIGUSR1 */
} epd_prefill_srv_t;

/* ---- epd_prefill_msg.c ---- */
void epd__prefill_on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len);
void epd__prefill_on_accept(void *arg, epd_xport_ep_t *ep);
void epd__prefill_on_ep_error(void *arg, epd_xport_ep_t *ep, epd_status_t status);
/* Sends an envelope body of `body_case` with `body` to `ep` (flags: fence).
 * EPD_OK, EPD_ERR_NO_RESOURCE (retry later) or the endpoint's error. */
epd_status_t epd__prefill_send(epd_prefill_srv_t *srv, epd_xport_ep_t *ep,
                               Epd__Envelope__BodyCase body_case, void *body, unsigned flags);
epd_status_t epd__prefill_send_error(epd_prefill_srv_t *srv, epd_xport_ep_t *ep, uint64_t id,
                                     epd_status_t status, const char *msg);
/* The same naming the worker that caused the failure (Error.culprit). */
epd_status_t epd__prefill_send_error_by(epd_prefill_srv_t *srv, epd_xport_ep_t *ep, uint64_t id,
                                        epd_status_t status, const char *msg, const char *culprit);
void epd__prefill_peer_unref(epd_prefill_srv_t *srv, epd_prefill_peer_t *peer);
/* The peer for (worker_id, epoch) of `role`, connecting when new (a newer
 * epoch retires the older one).  EPD_ERR_STALE_EPOCH when a newer one is
 * known. */
epd_status_t epd__prefill_peer_get(epd_prefill_srv_t *srv, epd_prefill_role_t role,
                                   const char *worker_id, const epd_prefill_epoch_t *epoch,
                                   const void *addr, size_t addr_len, epd_prefill_peer_t **peer_p);
/* Closes endpoints of dead peers (pump only). */
void epd__prefill_peers_reap(epd_prefill_srv_t *srv);
/* Periodic: stash and tombstone expiry. */
void epd__prefill_msg_tick(epd_prefill_srv_t *srv, uint64_t now);
void epd__prefill_tomb_add(epd_prefill_srv_t *srv, uint64_t id);
/* Applies a KvReservation to `req` (validation, rkey); fails req when invalid. */
void epd__prefill_apply_reservation(epd_prefill_srv_t *srv, epd_prefill_req_t *req,
                                    const Epd__KvReservation *r);
/* Rate-limited warning. */
int epd__prefill_log_allowed(epd_prefill_srv_t *srv);

/* ---- epd_prefill_xfer.c ---- */
epd_prefill_req_t *epd__prefill_req_find(epd_prefill_srv_t *srv, uint64_t id);
/* Admits a validated request: local blocks and slot, compute job (queued
 * at once without media; with n_media > 0 the caller starts the media and
 * the run follows when they are ready).  On success *req_p is live (in the
 * table); EPD_ERR_NO_CAPACITY or EPD_ERR_NO_MEMORY otherwise (nothing
 * kept). */
epd_status_t epd__prefill_req_admit(epd_prefill_srv_t *srv, uint64_t id, const uint32_t *tokens,
                                    uint32_t n_tokens, const epd_sample_params_t *sample,
                                    uint32_t n_media, epd_xport_ep_t *client_ep,
                                    const char *client_id, epd_prefill_peer_t *peer,
                                    epd_prefill_req_t **req_p);
/* Queues the run of an admitted request whose media are all READY (or
 * that has none).  Fails the request when the queue refuses it. */
void epd__prefill_req_submit_run(epd_prefill_srv_t *srv, epd_prefill_req_t *req);
/* Fails (or aborts) a request: stops compute at the next layer, stops
 * posting; tell_client / tell_d queue an Error; quiesce queues a
 * WritesQuiesced for decode once no write is in flight.  First call wins
 * the status; later calls only add what they ask for. */
void epd__prefill_req_fail(epd_prefill_srv_t *srv, epd_prefill_req_t *req, epd_status_t status,
                           const char *msg, int tell_client, int tell_d, int quiesce);
void epd__prefill_req_dirty(epd_prefill_srv_t *srv, epd_prefill_req_t *req);
/* Starts the pump (idle handle) if it is not running. */
void epd__prefill_pump_kick(epd_prefill_srv_t *srv);
/* The reservation just became valid: post what is ready. */
void epd__prefill_req_reserved(epd_prefill_srv_t *srv, epd_prefill_req_t *req);
void epd__prefill_on_event(void *arg, epd_prefill_ev_t *ev);
void epd__prefill_on_pump(uv_idle_t *idle);
void epd__prefill_tick(epd_prefill_srv_t *srv, uint64_t now);
/* Frees every request (shutdown, after the transport and compute are gone). */
void epd__prefill_reqs_free_all(epd_prefill_srv_t *srv);

/* ---- epd_prefill_media.c ---- */
/* Allocates and registers the embedding region when the engine has vision
 * and embed_slots > 0 (loop thread, start-up, after the transport). */
epd_status_t epd__prefill_media_init(epd_prefill_srv_t *srv);
/* Deregisters the region (while the transport lives) and frees the slots. */
void epd__prefill_media_cleanup(epd_prefill_srv_t *srv);
/* Checks GenerateRequest.media against the prompt and the engine (rule 14);
 * EPD_OK, or the refusal with msg. */
epd_status_t epd__prefill_media_check(const epd_prefill_srv_t *srv, const Epd__GenerateRequest *g,
                                      char *msg, size_t cap);
/* Starts an admitted request's media (rule 15): cache hits pinned,
 * reservations sent to encoders, local encodes queued; submits the run when
 * nothing is pending.  When the free and evictable slots do not cover its
 * uncached images (or requests wait already), the request waits, holding
 * no slot, until they do.  May fail the request (it stays live until it
 * finishes as usual). */
void epd__prefill_media_start(epd_prefill_srv_t *srv, epd_prefill_req_t *req,
                              const Epd__GenerateRequest *g);
/* Gives back what the request's media hold: slots an encoder may still
 * write are quarantined (with an Abort to it); with `final` (the run is
 * done, or will never run) READY slots are unpinned too.  Idempotent. */
void epd__prefill_media_release(epd_prefill_srv_t *srv, epd_prefill_req_t *req, int final);
/* A failed request whose run never started: once no encode is lent to
 * compute, it counts as computed (canceled), so it can finish. */
void epd__prefill_media_settle(epd_prefill_srv_t *srv, epd_prefill_req_t *req);
/* ENCODED event of media `index`. */
void epd__prefill_media_on_encoded(epd_prefill_srv_t *srv, epd_prefill_req_t *req, uint32_t index,
                                   epd_status_t status);
/* Messages from encoders (EmbedComplete, WritesQuiesced). */
void epd__prefill_media_on_complete(epd_prefill_srv_t *srv, epd_xport_ep_t *ep,
                                    const Epd__Envelope *env);
void epd__prefill_media_on_quiesced(epd_prefill_srv_t *srv, epd_xport_ep_t *ep,
                                    const Epd__Envelope *env);
/* Is `env`'s sender the encoder of one of req's waiting images? */
int epd__prefill_media_from_encoder(const epd_prefill_req_t *req, const Epd__Envelope *env);
/* An encoder peer is dead and both its endpoints are closed: its
 * quarantined slots are free. */
void epd__prefill_media_encoder_gone(epd_prefill_srv_t *srv, epd_prefill_peer_t *peer);
/* Periodic: reservation leases of waiting images, and of requests waiting
 * for slots. */
void epd__prefill_media_tick(epd_prefill_srv_t *srv, uint64_t now);
/* Pump only: places the requests waiting for slots, in order, while the
 * first of them fits. */
void epd__prefill_media_unpark(epd_prefill_srv_t *srv);

/* ---- epd_prefill_rpc.c ---- */
int epd__prefill_on_rpc(void *arg, const char *method, const void *req, size_t req_len,
                        void **resp_p, size_t *resp_len_p, char *err, size_t err_cap);
/* The RegisterRequest for the router (identity, transport, data-plane and
 * control addresses, capacity, layout), packed into an epd_malloc buffer. */
epd_status_t epd__prefill_register_pack(epd_prefill_srv_t *srv, const char *control_address,
                                        void **buf_p, size_t *len_p);
/* epd_registrar callbacks (loop thread): the load, and the router's drain. */
void epd__prefill_registrar_load(void *arg, epd_registrar_load_t *load_p);
void epd__prefill_registrar_drain(void *arg);

#endif
