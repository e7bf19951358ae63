/*
 * epd_encoder_int.h — the encoder daemon's internals, shared by its modules:
 *
 *   main.c                  flags, start-up, signals, ready file, shutdown
 *   epd_encoder_msg.c       request plane: transport callbacks, message
 *                           handlers, prefill peers (one endpoint per prefill
 *                           worker id + epoch), early reservations (stash),
 *                           tombstones, the outbox of small replies
 *   epd_encoder_req.c       one image's state machine: admission, compute
 *                           results, reservation, the write, EmbedComplete,
 *                           failure, abort and quiesce, leases, the pump
 *   epd_encoder_rpc.c       control plane (Health, Status, Drain), the
 *                           RegisterRequest and the registrar's load
 *   epd_encoder_compute.c   the compute thread (own header)
 *
 * Unit of work: one image, i.e. one (request_id, media_index) pair — an
 * epd_encoder_req_t, holding one slot of the registered region from
 * admission until its write completed.
 *
 * Threads: everything here belongs to the loop thread, except what the
 * compute thread reads and writes through a submitted job (see
 * epd_encoder_compute.h): the image bytes (read) and the request's slot
 * (written) until the job comes back.
 *
 * Re-entrancy rule (as prefill's): transport callbacks (write completions,
 * endpoint errors, messages) may run nested inside any epd_xport_* call.
 * They only record facts and mark requests dirty; requests are freed and
 * our endpoints to prefill workers closed (their remote keys die with them)
 * only by epd__encoder_on_pump, which runs at the top of the loop (a
 * uv_idle), never nested inside a transport call.  The one exception: an
 * accepted endpoint (a client's, or a prefill worker's own) that failed is
 * closed inside the error callback, after every pointer to it was dropped —
 * the transport parks it until its own stack unwinds.
 */
#ifndef EPD_ENCODER_INT_H
#define EPD_ENCODER_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include <uv.h>

#include "epd_encoder_compute.h"
#include "epd_engine.h"
#include "epd_hash.h"
#include "epd_log.h"
#include "epd_msg.h"
#include "epd_registrar.h"
#include "epd_rpc.h"
#include "epd_trace.h"
#include "epd_xport.h"
#include "epd_xport_uv.h"

#define EPD_ENCODER_LOG "encoder"
#define EPD_ENCODER_ID_MAX 128      /* worker id bytes, NUL included */
#define EPD_ENCODER_MEDIA_MAX 8     /* media per request (proto/README.md rule 13) */
#define EPD_ENCODER_STASH_MAX 256   /* reservations that came before their EncodeRequest */
#define EPD_ENCODER_TOMB_MAX 4096   /* recently ended (request, media) and aborted ids */
#define EPD_ENCODER_OUTBOX_MAX 1024 /* replies waiting for transport room */
#define EPD_ENCODER_KNOWN_P 64      /* prefill worker ids seen (abort answers) */
/* The transport's largest message (transport/epd_xport.h: at most 16 MiB),
 * and the room an EncodeRequest needs beyond its image bytes: the frame
 * header, the envelope, the hash, ids and a prefill address of up to
 * EPD_XPORT_ADDR_MAX bytes. */
#define EPD_ENCODER_MSG_LIMIT (16u << 20)
#define EPD_ENCODER_MSG_HEADROOM (64u << 10)
#define EPD_ENCODER_MEDIA_ALL UINT32_MAX /* a tombstone for every media of an id */

typedef epd_msg_epoch_t epd_encoder_epoch_t; /* epd_msg_epoch_cmp, epd_msg_epoch_of */

typedef enum {
    EPD_ENCODER_PEER_CONNECTING = 1,
    EPD_ENCODER_PEER_UP,
    EPD_ENCODER_PEER_DEAD, /* failed or retired: no more sends, ep closed by the pump */
} epd_encoder_peer_state_t;

/* Our endpoint to one prefill worker incarnation (worker id + epoch): every
 * write and every message about its requests goes on it, so that the fence
 * of EmbedComplete / WritesQuiesced orders them behind the writes. */
typedef struct epd_encoder_peer {
    char worker_id[EPD_ENCODER_ID_MAX];
    epd_encoder_epoch_t epoch;
    epd_xport_ep_t *ep; /* ours (connected by us); NULL once closed */
    epd_encoder_peer_state_t state;
    epd_status_t dead_status;
    uint32_t n_refs; /* requests and outbox entries bound to it (it lives while > 0) */
    /* the prefill worker's packed key of its embedding region, unpacked once
     * on ep and shared by every request naming the same key (as prefill does
     * for decode's key: unpacking per request would map the region afresh
     * each time).  Destroyed by closing ep. */
    epd_xport_rkey_t *rkey;
    unsigned char rkey_blob[EPD_XPORT_RKEY_MAX];
    size_t rkey_len;
    int listed;                    /* in srv->peers lookups (not retired) */
    struct epd_encoder_peer *next; /* srv->peers */
} epd_encoder_peer_t;

struct epd_encoder_srv;

typedef struct epd_encoder_req {
    uint64_t id;
    uint32_t media_index;
    struct epd_encoder_srv *srv;
    struct epd_encoder_req *hnext;               /* srv->table chain */
    struct epd_encoder_req *lprev, *lnext;       /* srv->dirty or srv->blocked */
    int list;                                    /* 0 none, 1 dirty, 2 blocked */
    struct epd_encoder_req *all_prev, *all_next; /* srv->all */
    /* who asked */
    epd_xport_ep_t *client_ep; /* NULL once that endpoint failed */
    char client_id[EPD_ENCODER_ID_MAX];
    epd_encoder_peer_t *peer; /* the prefill worker (counted ref) */
    /* the image and the slot */
    unsigned char *image; /* [image_len], freed once compute is done with it */
    size_t image_len;
    unsigned char content_hash[EPD_CONTENT_HASH_BYTES]; /* as the EncodeRequest names it */
    uint32_t slot;
    float *out; /* the slot: [image_embeddings][embed_dim] f32 in srv->region */
    epd_encoder_job_t job;
    int compute_done;  /* the job came back */
    uint64_t ready_ns; /* embeddings computed (loop clock; 0 = not yet) */
    /* the reservation (valid when have_resv) */
    int have_resv;
    uint64_t offset, bytes, region_size;
    epd_xport_rkey_t *rkey; /* on peer->ep; NULL once that ep closed */
    int rkey_shared;        /* rkey is peer->rkey (borrowed, not destroyed here) */
    /* the write */
    int write_posted, write_inflight;
    int complete_sent; /* EmbedComplete queued on the transport */
    int backpressured; /* a post was refused (logged once) */
    /* clocks (epd_time_now_ns) */
    uint64_t t_recv_ns, t_resv_ns, t_posted_ns, t_written_ns, deadline_ns;
    /* outcome */
    int failed; /* failed or aborted: no more writes */
    epd_status_t fail_status;
    char fail_msg[200];
    int tell_client;   /* Error to the client pending */
    int tell_p;        /* Error to the prefill worker pending */
    int need_quiesced; /* WritesQuiesced to the prefill worker pending */
} epd_encoder_req_t;

/* A reply not tied to a live request (refusals of early or late
 * reservations, answers to aborts) that met backpressure. */
typedef struct {
    epd_xport_ep_t *ep;           /* an accepted endpoint, or NULL when `peer` */
    epd_encoder_peer_t *peer;     /* counted ref; its ep is used */
    Epd__Envelope__BodyCase kind; /* ERROR or QUIESCED */
    uint64_t id;
    int32_t status;
    char text[160];
} epd_encoder_out_t;

typedef enum {
    EPD_ENCODER_TOMB_ENDED = 1, /* one (id, media) ended here (done, failed, refused) */
    EPD_ENCODER_TOMB_ABORTED,   /* every media of the id: aborted */
} epd_encoder_tomb_kind_t;

typedef struct epd_encoder_srv {
    /* configuration (flags) */
    const char *model_dir;
    char model_name[128]; /* last path component of model_dir */
    const char *engine_name;
    char worker_id[EPD_ENCODER_ID_MAX];
    const char *transport;
    uint32_t slots;
    uint64_t max_image_bytes, max_pixels;
    uint32_t lease_ms, peer_timeout_ms, connect_timeout_ms;
    /* identity */
    epd_encoder_epoch_t epoch;
    uint64_t seq; /* envelope sequence */
    /* loop and its handles */
    uv_loop_t *loop;
    uv_idle_t pump;
    int pump_on;
    uv_timer_t timer; /* leases, deadlines, stash and tombstone expiry, retries */
    uv_signal_t sigterm, sigint, sigusr1;
    int stopping;
    /* engine, region, compute */
    const epd_engine_info_t *info;
    size_t slot_bytes;  /* image_embeddings * embed_dim * 4 */
    size_t slot_stride; /* slot_bytes rounded up to 64 */
    epd_xport_t *x;
    epd_xport_uv_t *xuv;
    epd_xport_mr_t *region; /* [slots][slot_stride] bytes, the writes' source */
    epd_encoder_compute_t *compute;
    epd_rpc_server_t *rpc;
    epd_registrar_t *registrar; /* --router; NULL = not registering */
    const void *addr;           /* our data-plane address (borrowed from x) */
    size_t addr_len;
    uint32_t *free_slots; /* stack, lowest on top */
    uint32_t n_free_slots;
    /* requests, by (id, media_index) */
    epd_encoder_req_t **table; /* [table_size] chains */
    uint32_t table_size;
    uint32_t n_live;
    epd_encoder_req_t *all;
    epd_encoder_req_t *dirty_head, *dirty_tail;
    epd_encoder_req_t *blocked_head, *blocked_tail;
    int room; /* a write completed: retry the blocked */
    epd_encoder_peer_t *peers;
    /* early reservations, tombstones, known prefill workers, outbox */
    struct epd_encoder_stash {
        Epd__Envelope *env; /* owned: an EmbedReservation */
        epd_xport_ep_t *ep; /* where it came from (NULL once that ep failed) */
        uint64_t expires_ns;
    } stash[EPD_ENCODER_STASH_MAX];
    uint32_t n_stash;
    struct epd_encoder_tomb {
        uint64_t id;
        uint32_t media; /* EPD_ENCODER_MEDIA_ALL for an aborted id */
        epd_encoder_tomb_kind_t kind;
        uint64_t expires_ns;
    } tombs[EPD_ENCODER_TOMB_MAX];
    uint32_t tomb_next;
    char known_p[EPD_ENCODER_KNOWN_P][EPD_ENCODER_ID_MAX];
    uint32_t known_p_next;
    epd_encoder_out_t outbox[EPD_ENCODER_OUTBOX_MAX]; /* ring */
    uint32_t out_head, n_out;
    /* state and counters */
    int draining;
    uint64_t bad_frames;
    uint64_t received, served, failed_reqs, refused;
    uint64_t bytes_written; /* embedding bytes whose write completed */
    epd_log_limit_t log_limit;
    unsigned char *tx_buf; /* [tx_cap], loop thread scratch for frames */
    size_t tx_cap;
    epd_trace_t *trace;     /* --trace; NULL = off */
    const char *trace_path; /* where the JSON goes at exit / SIGUSR1 */
} epd_encoder_srv_t;

/* ---- epd_encoder_msg.c ---- */
void epd__encoder_on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len);
void epd__encoder_on_accept(void *arg, epd_xport_ep_t *ep);
void epd__encoder_on_ep_error(void *arg, epd_xport_ep_t *ep, epd_status_t status);
/* Sends a body of `body_case` to `ep` (flags: fence).  EPD_OK,
 * EPD_ERR_NO_RESOURCE (retry later) or the endpoint's error. */
epd_status_t epd__encoder_send(epd_encoder_srv_t *srv, epd_xport_ep_t *ep,
                               Epd__Envelope__BodyCase body_case, void *body, unsigned flags);
epd_status_t epd__encoder_send_error(epd_encoder_srv_t *srv, epd_xport_ep_t *ep, uint64_t id,
                                     epd_status_t status, const char *msg);
epd_status_t epd__encoder_send_quiesced(epd_encoder_srv_t *srv, epd_xport_ep_t *ep, uint64_t id);
void epd__encoder_peer_unref(epd_encoder_srv_t *srv, epd_encoder_peer_t *peer);
int epd__encoder_peer_usable(const epd_encoder_peer_t *peer);
/* Closes endpoints of dead peers, frees unreferenced ones (pump only). */
void epd__encoder_peers_reap(epd_encoder_srv_t *srv);
/* Retries the outbox (pump and tick). */
void epd__encoder_outbox_flush(epd_encoder_srv_t *srv);
/* Periodic: stash expiry. */
void epd__encoder_msg_tick(epd_encoder_srv_t *srv, uint64_t now);
void epd__encoder_tomb_add(epd_encoder_srv_t *srv, uint64_t id, uint32_t media,
                           epd_encoder_tomb_kind_t kind);
/*
 * Ends request `id` here as a whole: a tombstone (later EncodeRequests of it
 * are refused EPD_ERR_CANCELED, later reservations answered at once), every
 * live image of it fails with `status` and owes its prefill worker a
 * WritesQuiesced (sent fenced once no write of the id is in flight), every
 * stashed reservation of it gets Error(status, msg) and WritesQuiesced.
 * `p_env`/`p_ep` (may be NULL): a prefill worker's message that asked for
 * it; its sender gets WritesQuiesced on p_ep at once when no live image of
 * the id is bound to it.  Nested-safe (frees nothing).
 */
void epd__encoder_id_kill(epd_encoder_srv_t *srv, uint64_t id, epd_status_t status, const char *msg,
                          const Epd__Envelope *p_env, epd_xport_ep_t *p_ep);
/* Applies an EmbedReservation to `req` (validation, rkey); fails req when
 * invalid. */
void epd__encoder_apply_reservation(epd_encoder_srv_t *srv, epd_encoder_req_t *req,
                                    const Epd__EmbedReservation *r);
/* Rate-limited warning gate. */
int epd__encoder_log_allowed(epd_encoder_srv_t *srv);

/* ---- epd_encoder_req.c ---- */
epd_encoder_req_t *epd__encoder_req_find(epd_encoder_srv_t *srv, uint64_t id, uint32_t media);
/* Admits a validated EncodeRequest: a slot, a copy of the image, the compute
 * job.  On success *req_p is live (in the table); EPD_ERR_NO_CAPACITY or
 * EPD_ERR_NO_MEMORY otherwise (nothing kept). */
epd_status_t epd__encoder_req_admit(epd_encoder_srv_t *srv, const Epd__EncodeRequest *e,
                                    epd_xport_ep_t *client_ep, const char *client_id,
                                    epd_encoder_peer_t *peer, uint64_t t_recv_ns,
                                    epd_encoder_req_t **req_p);
/* Fails (or aborts) one image: the compute job is canceled (an encode
 * running is discarded), nothing more is posted; tell_client / tell_p
 * queue an Error; quiesce queues a WritesQuiesced for the prefill worker,
 * sent (fenced) once no write of this request id is or will be in flight.
 * The first call wins the status; later calls only add what they ask for. */
void epd__encoder_req_fail(epd_encoder_srv_t *srv, epd_encoder_req_t *req, epd_status_t status,
                           const char *msg, int tell_client, int tell_p, int quiesce);
void epd__encoder_req_dirty(epd_encoder_srv_t *srv, epd_encoder_req_t *req);
/* The reservation just became valid: post what is ready. */
void epd__encoder_req_reserved(epd_encoder_srv_t *srv, epd_encoder_req_t *req);
void epd__encoder_on_job(void *arg, epd_encoder_job_t *job);
void epd__encoder_on_pump(uv_idle_t *idle);
void epd__encoder_pump_start(epd_encoder_srv_t *srv);
void epd__encoder_tick(epd_encoder_srv_t *srv, uint64_t now);
/* Frees every request (shutdown, after the transport and compute are gone). */
void epd__encoder_reqs_free_all(epd_encoder_srv_t *srv);

/* ---- epd_encoder_rpc.c ---- */
int epd__encoder_on_rpc(void *arg, const char *method, const void *req, size_t req_len,
                        void **resp_p, size_t *resp_len_p, char *err, size_t err_cap);
/* The RegisterRequest for the router (identity with role ENCODER, transport,
 * data-plane and control addresses, capacity, the model's layout), packed
 * into an epd_malloc buffer. */
epd_status_t epd__encoder_register_pack(epd_encoder_srv_t *srv, const char *control_address,
                                        void **buf_p, size_t *len_p);
/* epd_registrar callbacks (loop thread): the load, and the router's drain. */
void epd__encoder_registrar_load(void *arg, epd_registrar_load_t *load_p);
void epd__encoder_registrar_drain(void *arg);

#endif
