/*
 * epd_decode_verify.h — the decode worker's verifier thread: the KV checks
 * (proto/README.md rule 6) off the loop thread, so that hashing a layer
 * never stalls the transport's progress or the messages of other requests.
 *
 *   loop -> verifier: one bounded queue of jobs (daemon/epd_handoff); each
 *     job is one layer of one request, storage inside that request, lent
 *     from submit until it comes back as an event.
 *   verifier -> loop: the job itself, with its result, through the
 *     hand-off's event queue and uv_async.
 *
 * A check of kind STAMPED in stamps mode reads 64 bytes per unit — what a
 * real decode accelerator's verification kernel leaves to the host — and
 * the job then lasts at least the kernel's modelled time (the layer's bytes
 * / the engine's device_mem_bw, an absolute deadline: never added to the
 * host's time).  In full mode (or kind BYTES, or an engine whose device is
 * the CPU) every byte is hashed here, for real.
 *
 * Sizing: a request lends at most one job per layer and is freed only once
 * they all came back; live requests are at most the pool's blocks (each
 * holds one), so both queues hold max_jobs = blocks x layers (pointers) and
 * a push never meets a full queue.
 *
 * Threads: create, submit and destroy on the loop thread; the event
 * callback runs on the loop thread.
 */
#ifndef EPD_DECODE_VERIFY_H
#define EPD_DECODE_VERIFY_H

#include <stdint.h>

#include <uv.h>

#include "epd_engine.h"
#include "epd_hash.h"
#include "epd_kv_stamp.h"
#include "epd_status.h"
#include "epd_trace.h"

/* One layer's check (storage inside the request; the loop fills the
 * inputs before submit and reads the results in the event callback). */
typedef struct {
    void *owner; /* the request */
    uint64_t req_id;
    uint32_t layer;
    uint64_t sum;
    epd_kv_sum_kind_t kind;
    const uint32_t *ids; /* borrowed: the request's prompt blocks */
    uint32_t n_ids;
    uint32_t slot;
    epd_kv_stamp_expect_t expect; /* STAMPED: what every unit must say */
    /* BYTES over blocks ids[from..n_ids) continuing `hs` (the layer's
     * running state, lent with the job) instead of from a fresh state:
     * a chunked prefill's layer checked chunk by chunk (epd_decode_lend.c).
     * NULL: the whole layer.  `range`: a check of the blocks so far, not
     * of the whole layer. */
    epd_hash_state_t *hs;
    uint32_t from;
    int range;
    /* results (verifier thread, before the hand-back) */
    epd_status_t status;
    const char *why; /* static string when status != EPD_OK */
    uint64_t bytes;
    uint64_t start_ns, end_ns;
} epd_decode_vjob_t;

/* Fills job `j` for layer `layer` of request `owner` (its id in x->req_id):
 * check `sum` of `kind` over blocks ids[0..n_ids) (borrowed) or `slot`. */
void epd_decode_vjob_init(epd_decode_vjob_t *j, void *owner, uint32_t layer, uint64_t sum,
                          epd_kv_sum_kind_t kind, const uint32_t *ids, uint32_t n_ids,
                          uint32_t slot, const epd_kv_stamp_expect_t *x);

typedef struct epd_decode_verify epd_decode_verify_t;

/* Called on the loop thread once per job, in the order they finished. */
typedef void (*epd_decode_verify_cb_t)(void *arg, epd_decode_vjob_t *job);

/*
 * Starts the verifier thread over `pool` (borrowed until destroy) of an
 * engine with `info` (borrowed likewise), for at most max_jobs jobs lent at
 * once; `trace` (may be NULL) gets a "verify layer" span per job.  Loop
 * thread.  *v_p owned by the caller.
 */
epd_status_t epd_decode_verify_create(uv_loop_t *loop, const epd_engine_info_t *info,
                                      const epd_kv_pool_t *pool, uint32_t max_jobs,
                                      epd_trace_t *trace, epd_decode_verify_cb_t cb, void *cb_arg,
                                      epd_decode_verify_t **v_p);

/* Lends `job` to the thread.  EPD_ERR_NO_RESOURCE only when the sizing is
 * broken (nothing lent).  Loop thread; never blocks. */
epd_status_t epd_decode_verify_submit(epd_decode_verify_t *v, epd_decode_vjob_t *job);

/* Stops the thread after its current job, joins it (jobs not started and
 * results not handed back are dropped: the caller forgets what it lent).
 * Loop thread; the loop must run once more to close the wake-up.  NULL is
 * a no-op. */
void epd_decode_verify_destroy(epd_decode_verify_t *v);

#endif
