/*
 * epd_encoder_int.h — the encoder daemon's internals.
 *
 *   main.c                  flags -> config -> the daemon runtime (daemon/),
 *                           the embedding region, the compute thread
 *   epd_encoder_msg.c       the message layer: checks every request-plane
 *                           message that can be checked without the
 *                           request table, refuses the bad ones, hands the
 *                           rest to the request layer
 *   epd_encoder_req.c       the request layer: the only place an image's
 *                           state changes (epd_encoder_req_state_t, one
 *                           switch), the request id as a whole (abort,
 *                           tombstones, early reservations), leases
 *   epd_encoder_resv.c      what a reservation must be to be written into
 *   epd_encoder_compute.c   the compute thread (own header)
 *
 * Calls go one way: main.c -> epd_encoder_msg.c -> epd_encoder_req.c ->
 * epd_encoder_resv.c, epd_encoder_compute.c.  Upward only through callbacks registered at
 * start: the daemon's ops (main.c fills them with the functions below),
 * the compute thread's job callback, the transport's write completions.
 *
 * Unit of work: one image, i.e. one (request_id, media_index) pair — an
 * epd_encoder_req_t, holding one slot of the registered region from
 * admission until its write completed.
 *
 * Threads: everything here belongs to the loop thread, except what the
 * compute thread reads and writes through a submitted job (see
 * epd_encoder_compute.h): the image bytes (read) and the request's slot
 * (written) until the job comes back.
 */
#ifndef EPD_ENCODER_INT_H
#define EPD_ENCODER_INT_H

#include <stdint.h>

#include "epd_daemon.h"
#include "epd_encoder_compute.h"
#include "epd_engine.h"
#include "epd_hash.h"
#include "epd_link.h"
#include "epd_peer.h"
#include "epd_reqtab.h"
#include "epd_stash.h"
#include "epd_tomb.h"

#define EPD_ENCODER_LOG "encoder"
#define EPD_ENCODER_MEDIA_MAX 8     /* media per request (proto/README.md rule 13) */
#define EPD_ENCODER_STASH_MAX 256   /* reservations that came before their EncodeRequest */
#define EPD_ENCODER_TOMB_MAX 4096   /* recently ended (request, media) and aborted ids */
/* The transport's largest message (transport/epd_xport.h: at most 16 MiB),
 * and the room an EncodeRequest needs beyond its image bytes: the frame
 * header, the envelope, the hash, ids and a prefill address of up to
 * EPD_XPORT_ADDR_MAX bytes. */
#define EPD_ENCODER_MSG_LIMIT (16u << 20)
#define EPD_ENCODER_MSG_HEADROOM (64u << 10)

/* Tombstone kinds (epd_tomb.h): how an id (or one image of it) ended. */
#define EPD_ENCODER_TOMB_ENDED 1   /* one (id, media) ended here (done, failed, refused) */
#define EPD_ENCODER_TOMB_ABORTED 2 /* every media of the id: aborted or failed as a whole */

/* Where one image stands.  Transitions happen in epd_encoder_req.c's
 * step function only:
 *
 *   ENCODING --job back, ok--> READY --reservation--> WRITING --written--> DONE
 *      |  (a reservation may come while ENCODING: READY is skipped)
 *      +----------any failure, abort, lease, peer death----> FAILED --let go--> DONE
 *
 * FAILED waits until the compute thread and the transport gave back the
 * slot and every message it owes went out; DONE is freed at once. */
typedef enum {
    EPD_ENCODER_REQ_ENCODING = 1, /* the job is lent to the compute thread */
    EPD_ENCODER_REQ_READY,        /* embeddings in the slot; no reservation yet */
    EPD_ENCODER_REQ_WRITING,      /* the write is posted (or waits for room), EmbedComplete
                                   * fenced behind it */
    EPD_ENCODER_REQ_FAILED,
    EPD_ENCODER_REQ_DONE,
} epd_encoder_req_state_t;

/* What a failure owes (epd__encoder_req_fail's `tell`). */
#define EPD_ENCODER_TELL_CLIENT 0x1u  /* an Error to the client */
#define EPD_ENCODER_TELL_PREFILL 0x2u /* an Error to the prefill worker (which fails the
                                       * whole request on it: the id ends here too) */
#define EPD_ENCODER_QUIESCE 0x4u      /* WritesQuiesced to the prefill worker once nothing
                                       * of the id is in flight */

struct epd_encoder_srv;

typedef struct epd_encoder_req {
    epd_reqent_t ent; /* srv->reqs, keyed (id, media_index) */
    uint64_t id;
    uint32_t media_index;
    epd_encoder_req_state_t state;
    struct epd_encoder_srv *srv;
    /* who asked */
    epd_link_t *client; /* counted reference */
    char client_id[EPD_WORKER_ID_MAX];
    epd_peer_t *peer; /* the prefill worker (counted reference) */
    /* the image and the slot */
    unsigned char *image; /* [image_len], freed once compute is done with it */
    size_t image_len;
    unsigned char content_hash[EPD_CONTENT_HASH_BYTES]; /* as the EncodeRequest names it */
    uint32_t slot;
    float *out; /* the slot: [image_embeddings][embed_dim] f32 in srv->region */
    epd_encoder_job_t job;
    /* facts the step function reads */
    int compute_done;   /* the job came back */
    int have_resv;      /* a valid reservation (below) */
    int write_inflight; /* posted, not completed */
    int complete_sent;  /* EmbedComplete queued on the link */
    /* the reservation */
    uint64_t offset, bytes, region_size;
    epd_xport_rkey_t *rkey; /* on the peer's link; NULL once that link closed */
    int rkey_shared;        /* the peer's (borrowed, not destroyed here) */
    int backpressured;      /* the write was refused for room (logged once) */
    /* clocks (epd_time_now_ns) */
    uint64_t t_recv_ns, ready_ns, t_resv_ns, t_posted_ns, t_written_ns, deadline_ns;
    /* FAILED: what it still owes */
    epd_status_t fail_status;
    char fail_msg[200];
    unsigned owe; /* EPD_ENCODER_TELL_* / QUIESCE not yet sent */
} epd_encoder_req_t;

typedef struct epd_encoder_srv {
    epd_daemon_t *d;
    const epd_engine_info_t *info;
    /* configuration */
    uint32_t slots;
    uint64_t max_image_bytes, max_pixels;
    uint32_t lease_ms;
    size_t slot_bytes;  /* image_embeddings * embed_dim * 4 */
    size_t slot_stride; /* slot_bytes rounded up to 64 */
    epd_xport_mr_t *region; /* [slots][slot_stride] bytes, the writes' source */
    epd_encoder_compute_t *compute;
    epd_engine_t *engine; /* until the compute thread takes it (setup) */
    uint32_t *free_slots; /* stack, lowest on top */
    uint32_t n_free_slots;
    epd_reqtab_t reqs; /* live images, by (id, media_index) */
    int room;          /* a write completed: retry the blocked */
    epd_stash_t *stash; /* early reservations, keyed (id, media) */
    epd_tombs_t *tombs;
    /* counters */
    uint64_t bytes_written; /* embedding bytes whose write completed */
    epd_trace_t *trace;     /* the daemon's (NULL = off) */
    /* /metrics (epd_encoder_metrics.c renders; the request layer observes,
     * loop thread): per image */
    struct {
        epd_prom_histo_t queue;  /* EncodeRequest received -> its encode started */
        epd_prom_histo_t encode; /* the encode (decode the image + the vision tower) */
        epd_prom_histo_t write;  /* the embeddings' write posted -> completed */
    } hist;
} epd_encoder_srv_t;

/* ---- epd_encoder_metrics.c ---- */
/* Zeroes srv->hist (before serve). */
void epd__encoder_metrics_init(epd_encoder_srv_t *srv);
/* The role's part of /metrics (epd_daemon_metrics_cb_t; arg = srv). */
void epd__encoder_metrics_render(void *arg, const char *model, epd_prom_text_t *out);

/* ---- epd_encoder_msg.c (the daemon's on_msg) ---- */
int epd__encoder_on_msg(void *arg, epd_link_t *from, Epd__Envelope *env);

/* ---- epd_encoder_resv.c ---- */
/* Checks reservation `r` for an image bound to `peer` and takes its key
 * (*rkey_p; *shared_p = 1: the peer's, borrowed).  EPD_OK, or the refusal
 * with msg[0..cap) saying why (EPD_ERR_PEER_DEAD: the worker is gone). */
epd_status_t epd__encoder_resv_take(epd_encoder_srv_t *srv, epd_peer_t *peer,
                                    const Epd__EmbedReservation *r, epd_xport_rkey_t **rkey_p,
                                    int *shared_p, char *msg, size_t cap);

/* ---- epd_encoder_req.c ---- */
/* Tables, stash, tombstones, the free slots (after the region is made). */
epd_status_t epd__encoder_reqs_init(epd_encoder_srv_t *srv);
/* Frees every image (after epd_daemon_serve returned: the compute thread
 * and the transport hold nothing any more). */
void epd__encoder_reqs_cleanup(epd_encoder_srv_t *srv);
/* A checked EncodeRequest from `from` (its sender the client). */
void epd__encoder_req_encode(epd_encoder_srv_t *srv, epd_link_t *from, const Epd__Envelope *env);
/* A checked EmbedReservation; returns nonzero when `env` was kept. */
int epd__encoder_req_reservation(epd_encoder_srv_t *srv, epd_link_t *from, Epd__Envelope *env);
/* An Abort or Error about `id` (reason: its text). */
void epd__encoder_req_stop(epd_encoder_srv_t *srv, epd_link_t *from, const Epd__Envelope *env,
                           uint64_t id, const char *reason);
/* The message layer refused the EncodeRequest of (id, media) with `status`
 * (`msg`): counted, and that image's reservation is answered at once. */
void epd__encoder_req_refused(epd_encoder_srv_t *srv, uint64_t id, uint32_t media,
                              epd_status_t status, const char *msg);
/* Callbacks registered by main.c: the compute thread's, the daemon's. */
void epd__encoder_req_on_job(void *arg, epd_encoder_job_t *job);
void epd__encoder_req_on_peer_dead(void *arg, epd_peer_t *peer, epd_status_t status,
                                   const char *why);
int epd__encoder_req_on_pump(void *arg);
void epd__encoder_req_on_tick(void *arg, uint64_t now_ns);
void epd__encoder_req_load(void *arg, epd_daemon_load_t *load_p);
void epd__encoder_req_on_stop(void *arg);

#endif
