/*
 * epd_prefill_compute.h — prefill's compute thread.
 *
 * The compute thread owns the engine and runs one job at a time.  The
 * hand-offs are daemon/epd_handoff's, with no lock held across a compute or
 * network call:
 *
 *   loop -> compute: two bounded queues of jobs (pointers into the request
 *     that owns them) and the hand-off's semaphore.  Queue 0 holds
 *     releases, queue 1 runs and local image encodes in FIFO order; the
 *     thread always takes a release first, so that a finished request's
 *     local blocks wait behind at most the run in progress, never behind
 *     the whole backlog.  sem_post never blocks: the loop never waits for
 *     compute.
 *   compute -> loop: the hand-off's bounded event queue (pointers into the
 *     request, prepared by the loop at admission) plus its uv_async.  The
 *     engine's layer-done sink only records the layer's checksum, posts "layer L of
 *     request R done" (with the checksum the engine computed, if any) and
 *     wakes the loop, before the next layer starts; it
 *     then checks the request's cancel flag and stops the engine at this
 *     layer boundary (EPD_ERR_CANCELED) when the loop set it.
 *
 * Sizing, so that the sink never meets a full queue: every event pointer
 * lives inside a request, a request has at most n_layers + 3 + max_media
 * events queued at once (one per layer, "finished", "released", its CHUNK
 * event, one per image it encodes itself) and is freed by the loop only
 * after it consumed "released", its last event; live requests are bounded
 * by max_requests (each holds one local state slot).  So at most
 * max_requests * (n_layers + 3 + max_media) events are ever queued, and
 * that is the event queue's capacity.  Likewise a request has at most one
 * run queued (a chunked run goes back only after its turn), max_media
 * encodes (the run queue holds max_requests * (1 + max_media)) and one
 * release (the release queue holds max_requests).  A push that fails anyway
 * (a broken invariant) is logged and retried with short sleeps while the
 * thread is not being stopped — it never blocks forever.
 *
 * Chunked prefill (epd_prefill_compute_set_chunk): a run whose uncached
 * prompt part is longer than the chunk is computed chunk by chunk, each an
 * epd_engine_prefill with `start` at the chunk.  Policy: one chunk is one
 * turn; after a turn that did not end the run, the compute thread posts the
 * job's CHUNK event and the loop puts the job back at the tail of the run
 * queue, so the runs (and local image encodes) queued meanwhile go first:
 * round robin among running prompts with a budget of one chunk's tokens per
 * turn, and a prompt no longer than a chunk waits behind at most one chunk
 * of each prompt ahead of it.  Each chunk hands every layer to the loop as
 * it finishes: in an earlier chunk with final_tokens set (its attention
 * rows so far are final: the loop streams their full blocks to decode), in
 * the last chunk as an unchunked run does (a resume's layers and a prefill
 * only run's wait for the end, as before).  A layer event is re-posted in
 * the next chunk only after the loop consumed the CHUNK event posted behind
 * it, hence the layer event too.  The cancel flag
 * is checked at every layer and at the start of every turn, so an abort or
 * a decode worker's death stops it at the next layer or chunk boundary.
 * The CHUNK event lives in the job and is re-posted only after the loop
 * consumed it: one more event per request (n_layers + 3 + max_media).
 * A turn whose chunk would write a block still being copied out to the
 * tier (copy_from, copy_wait) gives the turn back before computing, with
 * the same CHUNK event; the loop keeps the job until
 * epd_prefill_compute_copied says the copies are done.
 *
 * Threads: create, submit, backlog and destroy on the loop thread; the
 * event callback runs on the loop thread (from the hand-off's uv_async).
 */
#ifndef EPD_PREFILL_COMPUTE_H
#define EPD_PREFILL_COMPUTE_H

#include <stdatomic.h>
#include <stdint.h>

#include <uv.h>

#include "epd_engine.h"
#include "epd_sample.h"
#include "epd_status.h"
#include "epd_trace.h"

typedef enum {
    EPD_PREFILL_EV_LAYER = 1, /* layer `layer` is final in the local pool */
    EPD_PREFILL_EV_DONE,      /* the run finished: status, first_token */
    EPD_PREFILL_EV_RELEASED,  /* epd_engine_release ran: the compute thread
                               * holds nothing of the request any more */
    EPD_PREFILL_EV_ENCODED,   /* an ENCODE job finished: status (media index
                               * in `layer`) */
    EPD_PREFILL_EV_CHUNK,     /* a chunked run finished a chunk: the compute
                               * module queues its next one (never handed to
                               * the event callback) */
} epd_prefill_ev_kind_t;

typedef struct {
    epd_prefill_ev_kind_t kind; /* set by the loop at admission */
    uint32_t layer;             /* set by the loop at admission */
    void *owner;                /* the request; set by the loop */
    epd_status_t status;        /* DONE: written by compute before the push */
    int32_t first_token;        /* DONE */
    epd_sample_logprob_t first_logprob; /* DONE, when the request asked (sample.logprobs) */
    uint64_t started_ns;        /* DONE: when the run started (epd_time_now_ns) */
    uint64_t finished_ns;       /* DONE: when compute and sampling ended */
    uint64_t layer_end_ns;      /* DONE: when the last layer's sink ran */
    /* LAYER, written by compute before the push: 0 = the layer is final
     * (the run's last chunk); else only its attention rows [0,
     * final_tokens) are (an earlier chunk of a chunked run: they may be
     * written to decode now — per-chunk streaming) */
    uint32_t final_tokens;
} epd_prefill_ev_t;

typedef enum {
    EPD_PREFILL_JOB_RUN = 1, /* prefill + sample step 0 */
    EPD_PREFILL_JOB_RELEASE, /* epd_engine_release */
    EPD_PREFILL_JOB_ENCODE,  /* decode an image and run the vision encoder (a
                              * request whose image no encoder sends; FIFO
                              * with the runs) */
} epd_prefill_job_kind_t;

/*
 * One job: storage inside the request (lent to the compute thread from
 * submit until its last event — DONE for a run, RELEASED for a release —
 * was pushed).  The loop fills every field before submit and does not
 * touch them afterwards, except `cancel`, which both threads access
 * atomically.
 */
typedef struct epd_prefill_job {
    epd_prefill_job_kind_t kind;
    epd_kv_seq_t seq;      /* block_table borrowed from the request */
    const int32_t *tokens; /* RUN: the prompt, borrowed */
    uint32_t n_tokens;
    /* RUN, prefix cache: the prompt's tokens [0, start) are in the leading
     * blocks already and `restore` (borrowed until DONE: a checkpoint,
     * [n_linear_layers][state_bytes]; NULL: none) is the state after them,
     * copied into the slot before the engine runs [start, n_tokens) with
     * positions [start, replay_end) replayed (epd_prefill_args_t); the
     * engine takes checkpoints ckpts[0..n_ckpts) (borrowed until DONE) */
    uint32_t start;
    uint32_t replay_end;
    const void *restore;
    const epd_state_ckpt_t *ckpts;
    uint32_t n_ckpts;
    /* RUN: a resume (proto/README.md rule 33): tokens[n_tokens - n_decode
     * ..) are tokens the request generated; they go through the engine's
     * decode path one at a time after the prefill of the rest — so their KV
     * and the logits are bit for bit what decode computed — and every
     * layer is handed over (checksummed) only after them.  The token is
     * sampled at step n_decode.  0: a plain prefill, sampled at step 0. */
    uint32_t n_decode;
    /* RUN: the request came from the router this worker registered with
     * (epd_daemon_sent_by_router): its tokens count apart in the backlog */
    int from_router;
    epd_sample_params_t sample;  /* RUN: sampling */
    atomic_int *cancel;          /* RUN: nonzero = stop at the next layer */
    epd_prefill_ev_t *layer_evs; /* RUN: [n_layers] */
    epd_prefill_ev_t *done_ev;   /* RUN: the DONE event; RELEASE: RELEASED */
    epd_trace_t *trace;          /* RUN: per-layer compute spans; NULL = off */
    /* RUN: NULL (prefill only: nothing is written, no checksums), or
     * [n_layers] checksums and their kinds the sink writes before it hands
     * layer l to the loop: the checksum the engine computed next to the KV
     * (epd_prefill_args_t.want_sums: sim's device kernel) with
     * layer_sum_kinds[l] = 1 + its epd_kv_sum_kind_t, or 0 when the engine
     * computed none (ref: its device is the CPU) — then the loop hashes the
     * bytes itself before it posts them, off this thread.  Lent like the
     * job. */
    uint64_t *layer_sums;
    uint8_t *layer_sum_kinds;
    /* RUN: the embedding spans of a multimodal prompt (borrowed, and their
     * rows, until DONE); NULL / 0 for text */
    const epd_embed_span_t *embeds;
    uint32_t n_embeds;
    /* ENCODE: image[0..image_len) (borrowed until its ENCODED event),
     * decoded with the pixel guard max_pixels, encoded into embed_out
     * ([image_embeddings][embed_dim] f32, borrowed likewise); done_ev is
     * the ENCODED event */
    const void *image;
    size_t image_len;
    /* ENCODE: the BLAKE2b-256 the request names for the image (borrowed
     * likewise): the bytes must be what it names before anything is
     * cached under it, else the job ends EPD_ERR_CORRUPT */
    const unsigned char *content_hash;
    uint64_t max_pixels;
    float *embed_out;
    /* RUN: blocks seq.block_table[copy_from..) were still being copied out
     * to the prefix cache's tier at admission: no chunk writes them before
     * the copies up to number copy_wait are done
     * (epd_prefill_compute_copied); 0: none */
    uint32_t copy_from;
    uint64_t copy_wait;
    /* RUN, chunked prefill: the compute module's own (set by submit and the
     * compute thread; the loop touches none of it): whether the run
     * started, where its next chunk starts, its next checkpoint, and the
     * event that sends it back to the queue after a chunk */
    int chunk_started;
    uint32_t chunk_next;
    uint32_t chunk_ckpt;
    epd_prefill_ev_t chunk_ev;
    /* ... and a turn given back before its chunk (it writes a block still
     * being copied out): the loop parks the job until the copies are done */
    int copy_parked;
    uint64_t parked_ns;
    struct epd_prefill_job *park_next; /* the module's list of parked jobs (loop) */
} epd_prefill_job_t;

typedef struct epd_prefill_compute epd_prefill_compute_t;

/* Called on the loop thread once per event, in the order pushed. */
typedef void (*epd_prefill_ev_cb_t)(void *arg, epd_prefill_ev_t *ev);

/*
 * Starts the compute thread for `engine` (taken: closed by destroy; on
 * failure the caller keeps it) computing into `pool` (borrowed; the caller
 * keeps it alive until destroy).  A request
 * queues at most one run, one release and max_media encodes (the queues are
 * sized for max_requests of them).  `nice` is added to the thread's nice
 * value as it starts (0: none; below 0 needs CAP_SYS_NICE or RLIMIT_NICE,
 * else the thread keeps the daemon's and an info line says so).  Loop
 * thread (the uv_async is created on `loop`).  *c_p owned by the caller.
 */
epd_status_t epd_prefill_compute_create(uv_loop_t *loop, epd_engine_t *engine,
                                        const epd_kv_pool_t *pool, uint32_t max_requests,
                                        uint32_t max_media, int nice, epd_prefill_ev_cb_t cb,
                                        void *cb_arg, epd_prefill_compute_t **c_p);

/* Sets the chunk size of later runs: at most `tokens` prompt tokens per
 * engine call and per turn (0: a run is one call).  Loop thread, before the
 * first submit. */
void epd_prefill_compute_set_chunk(epd_prefill_compute_t *c, uint32_t tokens);

/* on (the default): a run whose chunk ended goes on to its next chunk at
 * once when no other job waits; off: every chunk's end puts it at the
 * queue's tail, through the loop (strict round robin even against jobs
 * submitted after it started).  Loop thread, with no run in progress. */
void epd_prefill_compute_set_greedy(epd_prefill_compute_t *c, int on);

/* The tier's copies up to number `seq` are done (in order): parked runs
 * whose copy_wait it reaches go back to the run queue.  Loop thread. */
void epd_prefill_compute_copied(epd_prefill_compute_t *c, uint64_t seq);

/* Runs parked for the tier's copies now.  Loop thread. */
uint32_t epd_prefill_compute_parked(const epd_prefill_compute_t *c);

/* Queues `job` (lent, see above).  EPD_ERR_NO_RESOURCE only when the sizing
 * invariant is broken.  Loop thread; never blocks. */
epd_status_t epd_prefill_compute_submit(epd_prefill_compute_t *c, epd_prefill_job_t *job);

/* Run jobs submitted but not yet started, their prompt tokens, and of
 * those the tokens of runs from_router.  Loop thread. */
void epd_prefill_compute_backlog(epd_prefill_compute_t *c, uint32_t *jobs_p, uint64_t *tokens_p,
                                 uint64_t *router_tokens_p);

/* Stops the thread after the job it is running (the caller sets the cancel
 * flags first so that ends at the next layer boundary), joins it, closes
 * the engine, and closes the uv_async (the loop must run once more to free
 * it).  Events still queued are dropped.  Loop thread.  NULL is a no-op. */
void epd_prefill_compute_destroy(epd_prefill_compute_t *c);

#endif
