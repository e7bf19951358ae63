/*
 * epd_prefill_compute.c — the compute thread (see the header for the
 * hand-offs and the queue sizing).
 *
 * The engine, the logits buffer and the sampler scratch belong to this
 * thread alone.  The only state shared with the loop thread is the two SPSC
 * queues, the semaphore, the atomics below and each job's cancel flag.
 */
#include "epd_prefill_compute.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_hash.h"
#include "epd_image.h"
#include "epd_log.h"
#include "epd_queue.h"
#include "epd_time.h"

#define EPD_PREFILL_COMP "prefill"

struct epd_prefill_compute {
    epd_engine_t *engine;
    const epd_engine_info_t *info;
    epd_kv_pool_t pool;
    float *logits;                 /* [vocab], compute thread */
    epd_sample_scratch_t *scratch; /* compute thread */
    epd_hash_state_t *hash;        /* compute thread: layer checksums */
    epd_spsc_queue_t jobs;         /* loop -> compute: runs, FIFO */
    epd_spsc_queue_t releases;     /* loop -> compute: releases, before the next run */
    epd_spsc_queue_t events;       /* compute -> loop */
    sem_t sem;                     /* counts submitted jobs (+1 to stop) */
    uv_async_t async;              /* wakes the loop for events */
    pthread_t thread;
    int thread_started;
    atomic_int stop;
    /* backlog: runs submitted (loop) minus runs started (compute) */
    uint64_t submitted_runs;   /* loop thread */
    uint64_t submitted_tokens; /* loop thread */
    atomic_uint_fast64_t started_runs;
    atomic_uint_fast64_t started_tokens;
    epd_prefill_ev_cb_t cb;
    void *cb_arg;
    int trace_named; /* compute thread: its trace track is named */
};

/* What the sink needs: lives on the compute thread's stack for one run. */
typedef struct {
    epd_prefill_compute_t *c;
    epd_prefill_job_t *job;
    uint64_t layer_start_ns; /* the current layer's compute started here */
} epd_prefill_sink_ctx_t;

/* Compute thread: hand one event to the loop.  The queue is sized so this
 * succeeds at once; if the invariant is ever broken it retries with short
 * sleeps rather than dropping an event or blocking for good. */
static void epd_prefill_compute_emit(epd_prefill_compute_t *c, epd_prefill_ev_t *ev)
{
    int warned = 0;

    while (epd_spsc_queue_push(&c->events, ev) != EPD_OK) {
        if (!warned) {
            epd_log_error(EPD_PREFILL_COMP, 0,
                          "compute -> loop event queue full (sizing invariant broken)");
            warned = 1;
        }
        (void)uv_async_send(&c->async);
        if (atomic_load(&c->stop)) {
            return;
        }
        epd_time_sleep_ns(100 * EPD_NSEC_PER_USEC);
    }
    (void)uv_async_send(&c->async);
}

/* The checksum of one layer of a request's local KV (see layer_sums). */
static uint64_t epd_prefill_compute_layer_sum(epd_prefill_compute_t *c, const epd_kv_seq_t *seq,
                                              uint32_t layer)
{
    const epd_kv_layout_t *kv = &c->info->kv;
    const char *base = c->pool.base;
    uint64_t off;

    epd_hash_state_reset(c->hash, 0);
    if (kv->kind[layer] == EPD_LAYER_LINEAR) {
        if (epd_kv_state_offset(kv, c->pool.n_blocks, c->pool.n_state_slots, layer, seq->state_slot,
                                &off) == EPD_OK) {
            epd_hash_state_update(c->hash, base + off, kv->state_bytes);
        }
    } else {
        for (uint32_t i = 0; i < seq->n_blocks; i++) {
            if (epd_kv_block_offset(kv, c->pool.n_blocks, layer, seq->block_table[i], &off) ==
                EPD_OK) {
                epd_hash_state_update(c->hash, base + off, kv->block_bytes);
            }
        }
    }
    return epd_hash_state_digest(c->hash);
}

/* The engine's layer-done sink, on the compute thread: push, wake, and stop
 * at this layer boundary when the loop canceled the request.  Nothing else:
 * the writes are posted by the loop thread. */
static epd_status_t epd_prefill_compute_sink(void *ctx, uint32_t layer,
                                             const epd_layer_done_t *done)
{
    epd_prefill_sink_ctx_t *s = ctx;
    uint64_t now;

    (void)done;
    if (layer >= s->c->info->kv.n_layers) {
        return EPD_ERR_FATAL;
    }
    if (s->job->layer_sums != NULL) {
        s->job->layer_sums[layer] = epd_prefill_compute_layer_sum(s->c, &s->job->seq, layer);
    }
    if (s->job->trace != NULL) {
        /* one clock read per layer: the span ends where the next begins */
        now = epd_time_now_ns();
        epd_trace_span(s->job->trace, "compute", "compute", s->job->seq.req_id, (int32_t)layer,
                       s->layer_start_ns, now);
        s->layer_start_ns = now;
        s->job->done_ev->layer_end_ns = now;
    }
    epd_prefill_compute_emit(s->c, &s->job->layer_evs[layer]);
    if (atomic_load_explicit(s->job->cancel, memory_order_acquire)) {
        return EPD_ERR_CANCELED;
    }
    return EPD_OK;
}

/* Zeroes the last prompt block of every attention layer before the run, so
 * the unused tail of that block (which is written to decode in full) never
 * carries a previous request's KV. */
static void epd_prefill_compute_clear_tail(epd_prefill_compute_t *c, const epd_prefill_job_t *job)
{
    const epd_kv_layout_t *kv = &c->info->kv;
    uint32_t last;
    uint64_t off;

    if (job->seq.n_blocks == 0) {
        return;
    }
    last = job->seq.block_table[job->seq.n_blocks - 1];
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        if (kv->kind[l] == EPD_LAYER_ATTENTION &&
            epd_kv_block_offset(kv, c->pool.n_blocks, l, last, &off) == EPD_OK) {
            memset((char *)c->pool.base + off, 0, kv->block_bytes);
        }
    }
}

static void epd_prefill_compute_run(epd_prefill_compute_t *c, epd_prefill_job_t *job)
{
    epd_prefill_sink_ctx_t sctx = {.c = c, .job = job};
    epd_engine_sink_t sink = {.cb = epd_prefill_compute_sink, .ctx = &sctx};
    epd_prefill_args_t args;
    epd_prefill_ev_t *ev = job->done_ev;
    epd_status_t status;
    int32_t token = -1;

    ev->started_ns = epd_time_now_ns();
    ev->layer_end_ns = 0;
    sctx.layer_start_ns = ev->started_ns;
    if (job->trace != NULL && !c->trace_named) {
        epd_trace_thread_name(job->trace, "prefill compute");
        c->trace_named = 1;
    }
    atomic_fetch_add(&c->started_runs, 1);
    atomic_fetch_add(&c->started_tokens, job->n_tokens);
    if (atomic_load_explicit(job->cancel, memory_order_acquire)) {
        status = EPD_ERR_CANCELED;
    } else {
        memset(&args, 0, sizeof(args));
        args.seq = job->seq;
        args.tokens = job->tokens;
        args.n_tokens = job->n_tokens;
        args.start = 0;
        args.embeds = job->embeds;
        args.n_embeds = job->n_embeds;
        epd_prefill_compute_clear_tail(c, job);
        status = epd_engine_prefill(c->engine, &c->pool, &args, &sink, c->logits);
        if (status == EPD_OK) {
            /* step 0 of the stateless sampler: the colocated first token */
            status = epd_sample_token(&job->sample, c->scratch, c->logits, c->info->vocab_size, 0,
                                      &token);
        }
    }
    ev->status = status;
    ev->first_token = token;
    ev->finished_ns = epd_time_now_ns();
    /* last touch of the job: after the push the loop may reuse the request */
    epd_prefill_compute_emit(c, ev);
}

/* An image no encoder sends: decode it and run the vision encoder into the
 * request's embedding slot (the loop verifies nothing here: it is our own
 * compute). */
static void epd_prefill_compute_encode(epd_prefill_compute_t *c, epd_prefill_job_t *job)
{
    epd_prefill_ev_t *ev = job->done_ev;
    epd_image_t img;
    epd_status_t status;

    ev->started_ns = epd_time_now_ns();
    status = epd_image_decode(job->image, job->image_len, job->max_pixels, &img);
    if (status == EPD_OK) {
        epd_image_view_t view = epd_image_view(&img);

        status = epd_engine_encode_image(c->engine, &view, job->embed_out);
        epd_image_cleanup(&img);
    }
    ev->status = status;
    ev->finished_ns = epd_time_now_ns();
    if (job->trace != NULL) {
        epd_trace_span(job->trace, "encode image (local)", "compute", job->seq.req_id,
                       (int32_t)ev->layer, ev->started_ns, ev->finished_ns);
    }
    epd_prefill_compute_emit(c, ev);
}

static void *epd_prefill_compute_main(void *arg)
{
    epd_prefill_compute_t *c = arg;

    for (;;) {
        epd_prefill_job_t *job;

        if (sem_wait(&c->sem) != 0) {
            if (errno == EINTR) {
                continue;
            }
            epd_log_error(EPD_PREFILL_COMP, 0, "compute thread: sem_wait failed: %s",
                          strerror(errno));
            break;
        }
        /* releases first: a finished request's blocks and slot must not wait
         * behind every run queued after it, only behind the one running */
        while ((job = epd_spsc_queue_pop(&c->releases)) != NULL) {
            if (!atomic_load(&c->stop)) {
                epd_engine_release(c->engine, &c->pool, &job->seq);
                epd_prefill_compute_emit(c, job->done_ev);
            }
        }
        job = epd_spsc_queue_pop(&c->jobs);
        if (job == NULL) {
            if (atomic_load(&c->stop)) {
                break;
            }
            continue;
        }
        if (atomic_load(&c->stop)) {
            continue; /* shutting down: the loop no longer reads events */
        }
        if (job->kind == EPD_PREFILL_JOB_ENCODE) {
            epd_prefill_compute_encode(c, job);
            continue;
        }
        epd_prefill_compute_run(c, job);
    }
    return NULL;
}

/* Loop thread: drain every event (uv_async_send coalesces wake-ups). */
static void epd_prefill_compute_on_async(uv_async_t *handle)
{
    epd_prefill_compute_t *c = handle->data;
    epd_prefill_ev_t *ev;

    while ((ev = epd_spsc_queue_pop(&c->events)) != NULL) {
        c->cb(c->cb_arg, ev);
    }
}

epd_status_t epd_prefill_compute_create(uv_loop_t *loop, epd_engine_t *engine,
                                        const epd_kv_pool_t *pool, uint32_t max_requests,
                                        uint32_t max_media, epd_prefill_ev_cb_t cb, void *cb_arg,
                                        epd_prefill_compute_t **c_p)
{
    epd_prefill_compute_t *c;
    epd_status_t st;
    uint64_t n_events;
    int rc;

    if (engine == NULL || pool == NULL || cb == NULL || max_requests == 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    c = epd_calloc(1, sizeof(*c));
    if (c == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    c->engine = engine;
    c->info = epd_engine_info(engine);
    c->pool = *pool;
    c->cb = cb;
    c->cb_arg = cb_arg;
    atomic_init(&c->stop, 0);
    atomic_init(&c->started_runs, 0);
    atomic_init(&c->started_tokens, 0);
    c->logits = epd_calloc(c->info->vocab_size, sizeof(*c->logits));
    if (c->logits == NULL) {
        st = EPD_ERR_NO_MEMORY;
        goto err_free;
    }
    st = epd_sample_scratch_create(c->info->vocab_size, &c->scratch);
    if (st != EPD_OK) {
        goto err_free_logits;
    }
    st = epd_hash_state_create(0, &c->hash);
    if (st != EPD_OK) {
        goto err_free_scratch;
    }
    st = epd_spsc_queue_init(&c->jobs, (size_t)max_requests * (1 + (size_t)max_media));
    if (st != EPD_OK) {
        goto err_free_hash;
    }
    st = epd_spsc_queue_init(&c->releases, max_requests);
    if (st != EPD_OK) {
        goto err_cleanup_jobs;
    }
    /* the size argument of the header: each live request queues at most
     * n_layers + 2 events */
    n_events = (uint64_t)max_requests * ((uint64_t)c->info->kv.n_layers + 2 + max_media);
    st = epd_spsc_queue_init(&c->events, (size_t)n_events);
    if (st != EPD_OK) {
        goto err_cleanup_releases;
    }
    if (sem_init(&c->sem, 0, 0) != 0) {
        st = EPD_ERR_FATAL;
        goto err_cleanup_events;
    }
    rc = uv_async_init(loop, &c->async, epd_prefill_compute_on_async);
    if (rc != 0) {
        epd_log_error(EPD_PREFILL_COMP, 0, "uv_async_init: %s", uv_strerror(rc));
        st = EPD_ERR_FATAL;
        goto err_destroy_sem;
    }
    c->async.data = c;
    rc = pthread_create(&c->thread, NULL, epd_prefill_compute_main, c);
    if (rc != 0) {
        epd_log_error(EPD_PREFILL_COMP, 0, "cannot start the compute thread: %s", strerror(rc));
        /* the async handle is closed by destroy's path: free c from its
         * close callback */
        c->engine = NULL;
        epd_prefill_compute_destroy(c);
        return EPD_ERR_FATAL;
    }
    c->thread_started = 1;
    epd_log_info(EPD_PREFILL_COMP, 0,
                 "compute thread started: run queue %zu, release queue %zu, event queue %zu "
                 "(%u requests x (%u layers + 2 + %u images))",
                 c->jobs.mask + 1, c->releases.mask + 1, c->events.mask + 1, max_requests,
                 c->info->kv.n_layers, max_media);
    *c_p = c;
    return EPD_OK;

err_destroy_sem:
    sem_destroy(&c->sem);
err_cleanup_events:
    epd_spsc_queue_cleanup(&c->events);
err_cleanup_releases:
    epd_spsc_queue_cleanup(&c->releases);
err_cleanup_jobs:
    epd_spsc_queue_cleanup(&c->jobs);
err_free_hash:
    epd_hash_state_destroy(c->hash);
err_free_scratch:
    epd_sample_scratch_destroy(c->scratch);
err_free_logits:
    epd_free(c->logits);
err_free:
    epd_free(c);
    return st;
}

epd_status_t epd_prefill_compute_submit(epd_prefill_compute_t *c, epd_prefill_job_t *job)
{
    /* runs and encodes in FIFO order; releases on their own queue */
    epd_status_t st =
        epd_spsc_queue_push(job->kind == EPD_PREFILL_JOB_RELEASE ? &c->releases : &c->jobs, job);

    if (st != EPD_OK) {
        epd_log_error(EPD_PREFILL_COMP, 0,
                      "loop -> compute job queue full (sizing invariant broken)");
        return st;
    }
    if (job->kind == EPD_PREFILL_JOB_RUN) {
        c->submitted_runs++;
        c->submitted_tokens += job->n_tokens;
    }
    (void)sem_post(&c->sem);
    return EPD_OK;
}

void epd_prefill_compute_backlog(epd_prefill_compute_t *c, uint32_t *jobs_p, uint64_t *tokens_p)
{
    uint64_t runs = atomic_load(&c->started_runs);
    uint64_t toks = atomic_load(&c->started_tokens);

    *jobs_p = (uint32_t)(c->submitted_runs - runs);
    *tokens_p = c->submitted_tokens - toks;
}

static void epd_prefill_compute_on_closed(uv_handle_t *handle)
{
    epd_free(handle->data);
}

void epd_prefill_compute_destroy(epd_prefill_compute_t *c)
{
    if (c == NULL) {
        return;
    }
    atomic_store(&c->stop, 1);
    if (c->thread_started) {
        (void)sem_post(&c->sem);
        pthread_join(c->thread, NULL);
    }
    epd_engine_close(c->engine);
    sem_destroy(&c->sem);
    epd_spsc_queue_cleanup(&c->events);
    epd_spsc_queue_cleanup(&c->releases);
    epd_spsc_queue_cleanup(&c->jobs);
    epd_hash_state_destroy(c->hash);
    epd_sample_scratch_destroy(c->scratch);
    epd_free(c->logits);
    uv_close((uv_handle_t *)&c->async, epd_prefill_compute_on_closed);
}
