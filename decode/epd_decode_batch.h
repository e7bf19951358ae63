/*
 * epd_decode_batch.h — the decode worker's compute thread: continuous
 * batching over the engine.
 *
 * The loop thread owns every request; when a request's KV is verified it
 * hands the request's sequence (epd_decode_seq_t, embedded in the request)
 * to the compute thread with epd_decode_batch_submit (a bounded SPSC queue).
 * The compute thread repeats, for as long as it has work:
 *
 *   admit queued sequences while fewer than max_batch run;
 *   drop the sequences the loop asked to abort (step boundary);
 *   one epd_engine_decode for every running sequence;
 *   sample each one's next token (epd_sample_token, step = tokens generated
 *   so far, the first token being step 0 sampled by prefill);
 *   publish the new tokens and finished sequences to the loop.
 *
 * KV on demand (proto/README.md rule 30): a sequence's block table may
 * grow while it runs.  The loop writes the new ids into block_table[] past
 * the published count, then publishes the count (epd_decode_seq_grow, a
 * release store); the compute thread reads the count (acquire) at every
 * step and runs a sequence only when its blocks hold the position it
 * writes next.  A sequence without room waits in the batch (its tokens do
 * not change: decode is batch-invariant) until the loop grows it or asks
 * it to leave; a step in which no sequence could run sleeps until
 * epd_decode_batch_kick (or the idle bound).
 *
 * Publishing: a sequence's tokens[] array (sized max_tokens) is filled by
 * the compute thread; `n_produced` (release store) says how many entries are
 * final.  A sequence with news goes onto a second bounded SPSC queue at most
 * once ("notify" entry) until the loop took it, and once more, tagged final,
 * when it leaves the batch; after the final entry the compute thread never
 * touches the sequence again, so the loop may free it when it pops that
 * entry.  If the queue is full the compute thread keeps the entries on a
 * private list and retries (never blocks, never drops).  The `wake` callback
 * (uv_async_send) runs after each step that queued something.
 *
 * The compute thread never calls the transport; the loop never waits for
 * compute.  The only lock is the mutex of the idle wait (held only around
 * the condition variable, never across engine calls).
 */
#ifndef EPD_DECODE_BATCH_H
#define EPD_DECODE_BATCH_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "epd_engine.h"
#include "epd_prom.h"
#include "epd_sample.h"
#include "epd_status.h"

typedef enum {
    EPD_DECODE_FINISH_NONE = 0,
    EPD_DECODE_FINISH_LENGTH, /* max_tokens or the context limit reached */
    EPD_DECODE_FINISH_STOP,   /* EOS or a stop id sampled (included in tokens) */
    EPD_DECODE_FINISH_ABORT,  /* the loop asked (epd_decode_seq_abort) */
    EPD_DECODE_FINISH_ERROR,  /* the engine or the sampler failed: see `error` */
} epd_decode_finish_t;

typedef struct epd_decode_seq epd_decode_seq_t;

struct epd_decode_seq {
    /* Set by the loop before submit; read-only afterwards (borrowed by the
     * compute thread until the final entry). */
    uint64_t req_id;
    const uint32_t *block_table; /* [capacity]: the blocks of prompt + max_tokens at most */
    uint32_t slot; /* state slot (ignored without linear layers) */
    uint32_t n_prompt;
    uint32_t max_tokens;
    epd_sample_params_t sp;
    const uint32_t *stop_ids; /* [n_stop] */
    uint32_t n_stop;
    /* [n_prompt] the prompt, for the repetition penalty (sp's logit
     * adjustments); NULL when sp has none */
    const uint32_t *prompt;
    /* [max_tokens] when sp.logprobs > 0: tokens[i]'s log-probabilities
     * (lps[0] from prefill's PrefillComplete; the rest computed here from
     * the raw logits); NULL otherwise */
    epd_sample_logprob_t *lps;
    int32_t *tokens; /* [max_tokens]; tokens[0] = first token (set by the loop) */

    /* Shared. */
    atomic_uint n_blocks;   /* block_table[0..n) hold this sequence's KV (loop: release
                             * store when it grows; never shrinks while lent) */
    atomic_uint n_produced; /* tokens[0..n) are final (compute: release store) */
    atomic_int finish;      /* epd_decode_finish_t, valid after the final entry */
    atomic_int abort;       /* set by the loop: leave at the next step boundary */
    atomic_int notified;    /* 1 while a notify entry is queued (compute sets, loop clears) */
    epd_status_t error;     /* FINISH_ERROR: why (written before the final entry) */

    /* Compute thread only. */
    uint32_t n_gen;
    int stepped; /* ran in the current step */
    int pend_notify, pend_final; /* entries that did not fit in the queue */
    epd_decode_seq_t *pend_next;
};

typedef struct epd_decode_batch epd_decode_batch_t;

/* Runs on the compute thread when entries were queued for the loop (e.g. a
 * uv_async_send).  Must not block. */
typedef void (*epd_decode_wake_cb_t)(void *arg);

/*
 * Starts the compute thread.  `engine` (borrowed; only this thread uses it
 * from now on until destroy), `pool` (copied descriptor of the caller's
 * pool), max_batch (1..engine max_batch), queue_cap (>= 1: sequences
 * waiting to join).  *batch_p owned by the caller (epd_decode_batch_destroy).
 * EPD_ERR_NO_MEMORY, EPD_ERR_INVALID_PARAM, EPD_ERR_FATAL (no thread).
 */
epd_status_t epd_decode_batch_create(epd_engine_t *engine, const epd_kv_pool_t *pool,
                                     uint32_t max_batch, uint32_t queue_cap,
                                     epd_decode_wake_cb_t wake, void *wake_arg,
                                     epd_decode_batch_t **batch_p);

/* Stops and joins the compute thread (it finishes its current step).
 * Sequences it still held are the caller's again (no final entry comes).
 * Loop thread.  NULL is a no-op. */
void epd_decode_batch_destroy(epd_decode_batch_t *batch);

/* Prepares seq's shared fields: tokens[0..n_known) are known (1: the
 * first token; more when a preempted request resumes), n_blocks blocks of
 * block_table hold its KV, no finish, no abort. */
void epd_decode_seq_init(epd_decode_seq_t *seq, uint32_t n_known, uint32_t n_blocks);

/* Publishes block_table[0..n_blocks) (n_blocks no smaller than before;
 * the new ids written first).  Loop thread; the sequence may be running. */
void epd_decode_seq_grow(epd_decode_seq_t *seq, uint32_t n_blocks);

/* The blocks a sequence holds (any thread). */
uint32_t epd_decode_seq_blocks(const epd_decode_seq_t *seq);

/* Hands `seq` (lent until its final entry is popped) to the compute thread.
 * EPD_ERR_NO_RESOURCE when the queue is full (nothing queued: retry after
 * the next wake-up).  Loop thread. */
epd_status_t epd_decode_batch_submit(epd_decode_batch_t *batch, epd_decode_seq_t *seq);

/* Asks `seq` (submitted) to leave at the next step boundary; its final entry
 * then carries EPD_DECODE_FINISH_ABORT (or the finish it reached first).
 * Loop thread. */
void epd_decode_seq_abort(epd_decode_seq_t *seq);

/* Wakes the compute thread if it sleeps (a sequence waiting for blocks
 * got them, or one was asked to leave).  Loop thread. */
void epd_decode_batch_kick(epd_decode_batch_t *batch);

/* Pops the next entry for the loop: the sequence, and *final_p 1 when it
 * left the batch (the compute thread is done with it), 0 for new tokens
 * (the entry's notify flag is cleared).  NULL when nothing is queued.
 * Loop thread. */
epd_decode_seq_t *epd_decode_batch_poll(epd_decode_batch_t *batch, int *final_p);

/* Sequences submitted but not yet running (queue depth) and running now
 * (approximate; any thread). */
uint32_t epd_decode_batch_queued(epd_decode_batch_t *batch);
uint32_t epd_decode_batch_running(epd_decode_batch_t *batch);

/* Steps run since start (any thread, approximate). */
uint64_t epd_decode_batch_steps(epd_decode_batch_t *batch);

/* The compute thread's histograms (it alone observes; any thread may
 * render them, epd_prom.h): the time of each step that ran a sequence,
 * and how many sequences it ran.  Borrowed for the batch's life. */
const epd_prom_histo_t *epd_decode_batch_step_histo(const epd_decode_batch_t *batch);
const epd_prom_histo_t *epd_decode_batch_size_histo(const epd_decode_batch_t *batch);

#endif
