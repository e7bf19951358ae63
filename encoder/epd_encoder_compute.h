/*
 * epd_encoder_compute.h — the encoder's compute thread.
 *
 * The compute thread owns the engine and runs one job at a time, in FIFO
 * order: check that the image's bytes are what its content hash names
 * (BLAKE2b-256, ~1.5 ms per MiB: kept off the loop thread), decode it
 * (epd_image_decode: PNG / JPEG to RGB8, with the pixel guard) and run it
 * through the engine's vision encoder (epd_engine_encode_image) straight
 * into the job's output buffer — a slot of the encoder's registered
 * region, the source of the one-sided write.
 * It also computes the checksum the EmbedComplete carries (xxh3-64, seed 0,
 * of the output bytes), where the bytes were just produced, so that the
 * loop thread only posts the write.
 *
 Hand-offs (daemon/epd_handoff.h), with no lock held across a compute or
 * network call: loop -> compute, a bounded queue of job pointers and a
 * semaphore; compute -> loop, the finished job itself on a bounded queue
 * plus a uv_async wake-up.
 *
 * Sizing, so that neither push meets a full queue: a job lives inside one
 * request of the loop, every live request holds one slot, and a request
 * submits exactly one job and is freed by the loop only after it consumed
 * that job back.  So at most max_jobs (= the slots) jobs are ever queued in
 * either direction, which is both queues' capacity.  A push that fails
 * anyway (a broken invariant) is logged; the compute side retries with short
 * sleeps while not being stopped — it never blocks forever.
 *
 * Cancel: the loop may set a job's `cancel` at any time; the compute thread
 * checks it before decoding and between decoding and encoding, and then
 * finishes the job with EPD_ERR_CANCELED at once.  An encode already running
 * completes (it is one synchronous engine call) and the loop discards it.
 *
 * Threads: create, submit, backlog and destroy on the loop thread; the
 * callback runs on the loop thread (from the uv_async).
 */
#ifndef EPD_ENCODER_COMPUTE_H
#define EPD_ENCODER_COMPUTE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "epd_engine.h"
#include "epd_status.h"
#include "epd_trace.h"

/*
 * One job: storage inside the request that owns it, lent to the compute
 * thread from submit until the thread pushed it back (its last touch).  The
 * loop fills the inputs before submit and reads the results only after the
 * job came back; `cancel` is the one field both threads touch meanwhile
 * (atomically).
 */
typedef struct {
    /* inputs (loop, before submit) */
    const void *image; /* the encoded bytes, borrowed from the request */
    size_t image_len;
    const unsigned char *content_hash; /* [EPD_CONTENT_HASH_BYTES] the request names, borrowed */
    uint64_t max_pixels;               /* the pixel guard of epd_image_decode */
    float *out;                        /* [image_embeddings][embed_dim] f32: a slot of the region */
    size_t out_bytes;                  /* image_embeddings * embed_dim * 4 */
    uint64_t req_id;                   /* for traces and logs */
    uint32_t media_index;
    epd_trace_t *trace; /* NULL = off: "verify hash", "decode image", "encode" spans */
    void *owner;        /* the request; passed back untouched */
    atomic_int cancel;  /* nonzero: finish with EPD_ERR_CANCELED at the next check */
    /* results (compute, before the push back) */
    epd_status_t status;    /* EPD_OK, an epd_image_decode or encode error, or
                             * EPD_ERR_INVALID_PARAM (bad_hash), or EPD_ERR_CANCELED */
    int bad_hash;           /* the bytes are not what content_hash names */
    uint32_t width, height; /* decoded size; the declared one for EPD_ERR_TOO_LONG; else 0 */
    int format;             /* epd_image_format_t the magic bytes claim, 0 for neither */
    uint64_t checksum;      /* xxh3-64 (seed 0) of out[0..out_bytes) when EPD_OK */
    uint64_t started_ns;    /* epd_time_now_ns at the start of the job */
    uint64_t decoded_ns;    /* after the image decode (0 when it did not run) */
    uint64_t finished_ns;   /* after the encode and checksum */
} epd_encoder_job_t;

typedef struct epd_encoder_compute epd_encoder_compute_t;

/* Called on the loop thread once per finished job, in FIFO order. */
typedef void (*epd_encoder_job_cb_t)(void *arg, epd_encoder_job_t *job);

/*
 * Starts the compute thread for `engine` (taken: closed by destroy; on
 * failure the caller keeps it) with queues for `max_jobs` jobs in flight.
 * Loop thread (the uv_async is created on `loop`).  *c_p owned by the
 * caller (epd_encoder_compute_destroy).  EPD_ERR_INVALID_PARAM,
 * EPD_ERR_NO_MEMORY, EPD_ERR_FATAL (thread or handle creation).
 */
epd_status_t epd_encoder_compute_create(uv_loop_t *loop, epd_engine_t *engine, uint32_t max_jobs,
                                        epd_encoder_job_cb_t cb, void *cb_arg,
                                        epd_encoder_compute_t **c_p);

/* Queues `job` (lent, see above).  EPD_ERR_NO_RESOURCE only when the sizing
 * invariant is broken (nothing queued).  Loop thread; never blocks. */
epd_status_t epd_encoder_compute_submit(epd_encoder_compute_t *c, epd_encoder_job_t *job);

/* Jobs submitted and not started yet (the queue depth).  Loop thread. */
uint32_t epd_encoder_compute_backlog(const epd_encoder_compute_t *c);

/* The Error text of a failed job (what was wrong with the image) into
 * msg[0..cap); max_pixels is the guard the job ran with.  Any thread. */
void epd_encoder_job_describe(const epd_encoder_job_t *job, uint64_t max_pixels, char *msg,
                              size_t cap);

/*
 * Stops the thread after the job it is running (jobs still queued are
 * dropped: the caller sets their cancel flags and frees them itself after
 * this returns), joins it, closes the engine and closes the uv_async (the
 * loop must run once more to free the memory).  No callback runs after this
 * returns.  Loop thread.  NULL is a no-op.
 */
void epd_encoder_compute_destroy(epd_encoder_compute_t *c);

#endif
