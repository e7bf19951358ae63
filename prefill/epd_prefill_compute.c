/*
 * epd_prefill_compute.c — the compute thread (see the header for the
 * hand-offs and the queue sizing; the queues, semaphore and wake-up are
 * daemon/epd_handoff's).
 *
 * The engine, the logits buffer and the sampler scratch belong to this
 * thread alone.  The only state shared with the loop
 * thread is the hand-off, the backlog counters below and each job's cancel
 * flag.
 */
#include "epd_prefill_compute.h"

#include <string.h>

#include "epd_alloc.h"
#include "epd_handoff.h"
#include "epd_hash.h"
#include "epd_image.h"
#include "epd_log.h"
#include "epd_time.h"

#define EPD_PREFILL_COMP "prefill"

/* The hand-off's queues (releases first: the lowest number is taken first). */
enum { EPD_PREFILL_Q_RELEASE = 0, EPD_PREFILL_Q_RUN, EPD_PREFILL_N_QUEUES };

struct epd_prefill_compute {
    epd_engine_t *engine; /* compute thread (after create) */
    const epd_engine_info_t *info;
    epd_kv_pool_t pool;
    float *logits;                 /* [vocab], compute thread */
    epd_sample_scratch_t *scratch; /* compute thread */
    epd_handoff_t *h;
    /* backlog: runs submitted (loop) minus runs started (compute) */
    uint64_t submitted_runs; /* loop thread */
    atomic_uint_fast64_t started_runs;
    /* their tokens, apart for the router's runs ([1]) and the others' ([0])
     * (epd_prefill_job_t.from_router): each run counts in one of them, so
     * the backlog's sum and its router part come from the same reads */
    uint64_t submitted_tokens[2]; /* loop thread */
    atomic_uint_fast64_t started_tokens[2];
    epd_prefill_ev_cb_t cb;
    void *cb_arg;
    int trace_named;         /* compute thread: its trace track is named */
    uint32_t chunk_tokens;   /* prompt tokens per engine call and turn; 0: whole */
    int greedy;              /* the next chunk at once when nothing else waits */
    epd_embed_span_t *spans; /* [max_media]: one chunk's spans, compute thread */
    uint32_t max_media;
    atomic_uint_fast64_t copied; /* the tier's copies done, in order (loop writes) */
    epd_prefill_job_t *parked;   /* runs waiting for them (loop) */
};

/* What the sink needs: lives on the compute thread's stack for one run. */
typedef struct {
    epd_prefill_compute_t *c;
    epd_prefill_job_t *job;
    uint64_t layer_start_ns; /* the current layer's compute started here */
    int hold;                /* a resume: layers are handed over after the decode tail */
    uint32_t partial_end;    /* an earlier chunk: rows [0, this) final (0: the last) */
} epd_prefill_sink_ctx_t;

/* Compute thread: hands one event to the loop (the hand-off retries with
 * short sleeps should the sizing invariant ever break). */
static void epd_prefill_compute_emit(epd_prefill_compute_t *c, epd_prefill_ev_t *ev)
{
    epd_handoff_post(c->h, ev);
}

/* The engine's layer-done sink, on the compute thread: push, wake, and stop
 * at this layer boundary when the loop canceled the request.  Nothing else:
 * the writes are posted by the loop thread. */
static epd_status_t epd_prefill_compute_sink(void *ctx, uint32_t layer,
                                             const epd_layer_done_t *done)
{
    epd_prefill_sink_ctx_t *s = ctx;
    uint64_t now;

    if (layer >= s->c->info->kv.n_layers) {
        return EPD_ERR_FATAL;
    }
    if (s->job->layer_sums != NULL) {
        /* the engine's (a device kernel's) checksum, or none: the loop then
         * hashes the bytes, off this thread.  A resume's layers change again
         * in its decode tail: always hashed by the loop, after it */
        s->job->layer_sums[layer] = done->has_sum && !s->hold ? done->sum : 0;
        s->job->layer_sum_kinds[layer] =
            done->has_sum && !s->hold ? (uint8_t)(1 + done->sum_kind) : 0;
    }
    if (s->job->trace != NULL) {
        /* one clock read per layer: the span ends where the next begins */
        now = epd_time_now_ns();
        epd_trace_span(s->job->trace, "compute", "compute", s->job->seq.req_id, (int32_t)layer,
                       s->layer_start_ns, now);
        s->layer_start_ns = now;
        s->job->done_ev->layer_end_ns = now;
    }
    if (!s->hold) {
        s->job->layer_evs[layer].final_tokens = s->partial_end;
        epd_prefill_compute_emit(s->c, &s->job->layer_evs[layer]);
    }
    if (atomic_load_explicit(s->job->cancel, memory_order_acquire)) {
        return EPD_ERR_CANCELED;
    }
    return EPD_OK;
}

/* A hit's run starts from a checkpoint: the state of every linear layer
 * after the cached tokens, copied into the request's slot. */
static void epd_prefill_compute_restore(epd_prefill_compute_t *c, const epd_prefill_job_t *job)
{
    const epd_kv_layout_t *kv = &c->info->kv;
    uint64_t off;

    if (job->restore == NULL) {
        return;
    }
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        if (kv->kind[l] == EPD_LAYER_LINEAR &&
            epd_kv_state_offset(kv, c->pool.n_blocks, c->pool.n_state_slots, l,
                                job->seq.state_slot, &off) == EPD_OK) {
            memcpy((char *)c->pool.base + off,
                   (const char *)job->restore + (size_t)kv->kind_index[l] * kv->state_bytes,
                   kv->state_bytes);
        }
    }
}

/* A resume's tail (rule 33): the generated tokens through the decode path,
 * one at a time at their positions (batch-invariant: what decode computed
 * for them, bit for bit), then every layer handed over (their checksums
 * hashed by the loop from the bytes).  The logits of the last one are left
 * in c->logits. */
static epd_status_t epd_prefill_compute_tail(epd_prefill_compute_t *c, epd_prefill_job_t *job)
{
    uint32_t first = job->n_tokens - job->n_decode;
    uint64_t t0 = epd_time_now_ns();
    epd_status_t status = EPD_OK;

    for (uint32_t j = 0; status == EPD_OK && j < job->n_decode; j++) {
        epd_decode_req_t r = {.seq = job->seq, .pos = first + j, .token = job->tokens[first + j]};

        if (atomic_load_explicit(job->cancel, memory_order_acquire)) {
            return EPD_ERR_CANCELED;
        }
        status = epd_engine_decode(c->engine, &c->pool, &r, 1, c->logits);
    }
    if (job->trace != NULL) {
        epd_trace_span(job->trace, "decode tail (resume)", "compute", job->seq.req_id, -1, t0,
                       epd_time_now_ns());
    }
    for (uint32_t l = 0; status == EPD_OK && l < c->info->kv.n_layers; l++) {
        job->layer_evs[l].final_tokens = 0;
        epd_prefill_compute_emit(c, &job->layer_evs[l]);
    }
    return status;
}

/* The arguments of the run's next chunk, [job->chunk_next, end): the
 * checkpoints and embedding spans that fall in it (cost O(chunk's spans and
 * checkpoints), never O(prompt)); the span that straddles the chunk's end
 * is cut there (epd_engine.h), the next chunk passes it whole again. */
static void epd_prefill_compute_chunk_args(epd_prefill_compute_t *c, epd_prefill_job_t *job,
                                           uint32_t end, epd_prefill_args_t *args)
{
    uint32_t pos = job->chunk_next;
    uint32_t n_ck = 0;
    uint32_t n_sp = 0;

    memset(args, 0, sizeof(*args));
    args->seq = job->seq;
    args->tokens = job->tokens + pos;
    args->n_tokens = end - pos;
    args->start = pos;
    if (job->replay_end > pos) {
        args->replay_end = job->replay_end < end ? job->replay_end : end;
    }
    /* checkpoints are sorted: those in (pos, end] follow the cursor */
    while (job->chunk_ckpt + n_ck < job->n_ckpts && job->ckpts[job->chunk_ckpt + n_ck].pos <= end) {
        n_ck++;
    }
    args->ckpts = n_ck > 0 ? job->ckpts + job->chunk_ckpt : NULL;
    args->n_ckpts = n_ck;
    job->chunk_ckpt += n_ck;
    /* spans are sorted and few (max_media): those that overlap the chunk */
    for (uint32_t i = 0; i < job->n_embeds; i++) {
        const epd_embed_span_t *sp = &job->embeds[i];

        if ((uint64_t)sp->pos + sp->n <= pos) {
            continue;
        }
        if (sp->pos >= end || n_sp == c->max_media) {
            break; /* the cap: a request has at most max_media images */
        }
        c->spans[n_sp] = *sp;
        if ((uint64_t)sp->pos + sp->n > end) {
            c->spans[n_sp].n = end - sp->pos;
        }
        n_sp++;
    }
    args->embeds = n_sp > 0 ? c->spans : NULL;
    args->n_embeds = n_sp;
}

/* One turn of a run: its next chunk (the whole uncached prompt part when
 * chunking is off or the part fits one chunk).  A turn that does not end
 * the run posts the job's CHUNK event (the loop queues it again) — or,
 * when no other job waits (epd_handoff_idle), runs the next chunk at once;
 * the last one runs a resume's decode tail, samples and posts DONE. */
static void epd_prefill_compute_run(epd_prefill_compute_t *c, epd_prefill_job_t *job)
{
    uint32_t prompt_end = job->n_tokens - job->n_decode;
    epd_prefill_sink_ctx_t sctx = {.c = c, .job = job};
    epd_engine_sink_t sink = {.cb = epd_prefill_compute_sink, .ctx = &sctx};
    epd_prefill_args_t args;
    epd_prefill_ev_t *ev = job->done_ev;
    epd_status_t status;
    const float *row = NULL;
    int32_t token = -1;
    uint32_t end;
    int single;

    if (!job->chunk_started) {
        job->chunk_started = 1;
        job->chunk_next = job->start;
        job->chunk_ckpt = 0;
        ev->started_ns = epd_time_now_ns();
        ev->layer_end_ns = 0;
        if (job->trace != NULL && !c->trace_named) {
            epd_trace_thread_name(job->trace, "prefill compute");
            c->trace_named = 1;
        }
        atomic_fetch_add(&c->started_runs, 1);
        atomic_fetch_add(&c->started_tokens[job->from_router != 0], job->n_tokens - job->start);
        /* a hit's checkpoint goes into the slot once, before the first
         * chunk; later chunks carry the state on (start > 0 keeps it) */
        epd_prefill_compute_restore(c, job);
    }
next_turn:
    sctx.layer_start_ns = epd_time_now_ns();
    end = prompt_end;
    if (c->chunk_tokens > 0 && prompt_end - job->chunk_next > c->chunk_tokens) {
        end = job->chunk_next + c->chunk_tokens;
    }
    if (job->copy_wait != 0 &&
        (end == prompt_end ? job->seq.n_blocks - 1 : (end - 1) / c->info->kv.block_tokens) >=
            job->copy_from &&
        atomic_load_explicit(&c->copied, memory_order_acquire) < job->copy_wait) {
        /* the chunk (a resume's tail: to the last block) would write a
         * block still being copied out to the tier: the turn goes back */
        job->copy_parked = 1;
        epd_prefill_compute_emit(c, &job->chunk_ev);
        return;
    }
    single = job->chunk_next == job->start && end == prompt_end;
    /* a layer is final only after the last chunk (and a resume's tail):
     * an earlier chunk hands each layer over as partial (its rows so far,
     * streamed to decode), unless it is a resume's (its layers change
     * again in the tail) or nothing is written (prefill only) */
    sctx.hold = job->n_decode > 0 || (end < prompt_end && job->layer_sums == NULL);
    sctx.partial_end = end < prompt_end ? end : 0;
    if (atomic_load_explicit(job->cancel, memory_order_acquire)) {
        status = EPD_ERR_CANCELED;
    } else {
        /* a prefix hit's run starts after its cached blocks (a resume's
         * hits lie in its prompt part: epd__prefill_cache_place) */
        epd_prefill_compute_chunk_args(c, job, end, &args);
        /* an engine's checksum covers the rows of its call: a chunked run's
         * layers are hashed by the loop from the bytes (kind BYTES).  The
         * last block's unused tail is the engine's to clear (ABI 3) */
        args.want_sums = job->layer_sums != NULL && single;
        status = epd_engine_prefill(c->engine, &c->pool, &args, &sink, c->logits);
        job->chunk_next = end;
        if (status == EPD_OK && end < prompt_end) {
            if (c->greedy && epd_handoff_idle(c->h)) {
                /* nobody waits: the next chunk at once, rather than a round
                 * trip through the loop, which is busy with this chunk's
                 * layers (hashing, posting their writes) */
                goto next_turn;
            }
            /* not the last chunk: back to the queue's tail (round robin) */
            epd_prefill_compute_emit(c, &job->chunk_ev);
            return;
        }
        if (status == EPD_OK && job->n_decode > 0) {
            status = epd_prefill_compute_tail(c, job);
        }
        if (status == EPD_OK) {
            /* step n_decode of the stateless sampler (0: the colocated first
             * token; a resume's: the token the stream continues with) */
            epd_sample_adjust_t adj;

            /* the request's logit adjustments first (the prompt's tokens;
             * a resume's generated ones are its output), as decode does,
             * on a copy: logprobs are the raw logits' */
            epd_sample_adjust_of(&job->sample, c->info->eos_tokens, c->info->n_eos, &adj);
            row = c->logits;
            if (!epd_sample_adjust_is_off(&adj)) {
                uint32_t n_in = job->n_tokens - job->n_decode;
                float *copy = epd_sample_scratch_logits(c->scratch);

                memcpy(copy, c->logits, (size_t)c->info->vocab_size * sizeof(*copy));
                status = epd_sample_adjust(&adj, c->scratch, copy, c->info->vocab_size,
                                           (const uint32_t *)job->tokens, n_in,
                                           (const uint32_t *)job->tokens + n_in, job->n_decode);
                row = copy;
            }
        }
        if (status == EPD_OK) {
            status = epd_sample_token(&job->sample, c->scratch, row, c->info->vocab_size,
                                      job->n_decode, &token);
        }
        if (status == EPD_OK && job->sample.logprobs > 0) {
            status = epd_sample_logprobs(c->logits, c->info->vocab_size, token,
                                         job->sample.logprobs - 1, &ev->first_logprob);
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
    unsigned char hash[EPD_CONTENT_HASH_BYTES];
    epd_prefill_ev_t *ev = job->done_ev;
    epd_image_t img;
    epd_status_t status;

    ev->started_ns = epd_time_now_ns();
    /* the cache key must name these bytes (proto/README.md rule 16): an
     * inline image is cached under the hash its sender claims, so a claim
     * that lies would poison every later request for the named image */
    epd_content_hash(job->image, job->image_len, hash);
    if (job->content_hash == NULL || memcmp(hash, job->content_hash, sizeof(hash)) != 0) {
        status = EPD_ERR_CORRUPT;
    } else {
        status = epd_image_decode(job->image, job->image_len, job->max_pixels, &img);
    }
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

/* Compute thread: the hand-off's run callback. */
static void epd_prefill_compute_on_job(void *arg, void *job_v, uint32_t queue)
{
    epd_prefill_compute_t *c = arg;
    epd_prefill_job_t *job = job_v;

    (void)queue;
    switch (job->kind) {
    case EPD_PREFILL_JOB_RELEASE:
        epd_engine_release(c->engine, &c->pool, &job->seq);
        epd_prefill_compute_emit(c, job->done_ev);
        break;
    case EPD_PREFILL_JOB_ENCODE:
        epd_prefill_compute_encode(c, job);
        break;
    case EPD_PREFILL_JOB_RUN:
        epd_prefill_compute_run(c, job);
        break;
    }
}

static void epd_prefill_compute_requeue(epd_prefill_compute_t *c, epd_prefill_job_t *job);

/* Loop thread: one event, in posting order. */
static void epd_prefill_compute_on_event(void *arg, void *ev_v)
{
    epd_prefill_compute_t *c = arg;
    epd_prefill_ev_t *ev = ev_v;
    epd_prefill_job_t *job;

    if (ev->kind != EPD_PREFILL_EV_CHUNK) {
        c->cb(c->cb_arg, ev);
        return;
    }
    /* a chunk ended: the run's next turn queues behind the jobs queued
     * meanwhile (the run holds its queue place once: the sizing of the
     * header).  A queue that is full anyway ends the run as a failure */
    job = ev->owner;
    if (job->copy_parked && atomic_load(&c->copied) < job->copy_wait) {
        job->parked_ns = epd_time_now_ns();
        job->park_next = c->parked;
        c->parked = job;
        return;
    }
    epd_prefill_compute_requeue(c, job);
}

void epd_prefill_compute_copied(epd_prefill_compute_t *c, uint64_t seq)
{
    epd_prefill_job_t **pp = &c->parked;

    atomic_store_explicit(&c->copied, seq, memory_order_release);
    while (*pp != NULL) {
        epd_prefill_job_t *job = *pp;

        if (job->copy_wait > seq) {
            pp = &job->park_next;
            continue;
        }
        *pp = job->park_next;
        epd_trace_span(job->trace, "tier copy wait", "wait", job->seq.req_id, -1, job->parked_ns,
                       epd_time_now_ns());
        epd_prefill_compute_requeue(c, job);
    }
}

uint32_t epd_prefill_compute_parked(const epd_prefill_compute_t *c)
{
    uint32_t n = 0;

    for (const epd_prefill_job_t *job = c->parked; job != NULL; job = job->park_next) {
        n++;
    }
    return n;
}

/* Loop thread: a run back at the run queue's tail (its next turn). */
static void epd_prefill_compute_requeue(epd_prefill_compute_t *c, epd_prefill_job_t *job)
{
    job->copy_parked = 0;
    if (epd_handoff_submit(c->h, EPD_PREFILL_Q_RUN, job) != EPD_OK) {
        epd_log_error(EPD_PREFILL_COMP, job->seq.req_id,
                      "loop -> compute job queue full (sizing invariant broken)");
        job->done_ev->status = EPD_ERR_NO_RESOURCE;
        job->done_ev->first_token = -1;
        job->done_ev->finished_ns = epd_time_now_ns();
        c->cb(c->cb_arg, job->done_ev);
    }
}

static void epd_prefill_compute_free(epd_prefill_compute_t *c)
{
    epd_sample_scratch_destroy(c->scratch);
    epd_free(c->spans);
    epd_free(c->logits);
    epd_free(c);
}

epd_status_t epd_prefill_compute_create(uv_loop_t *loop, epd_engine_t *engine,
                                        const epd_kv_pool_t *pool, uint32_t max_requests,
                                        uint32_t max_media, int nice, epd_prefill_ev_cb_t cb,
                                        void *cb_arg, epd_prefill_compute_t **c_p)
{
    epd_handoff_config_t hc;
    epd_prefill_compute_t *c;
    epd_status_t st;

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
    atomic_init(&c->started_runs, 0);
    c->greedy = 1;
    atomic_init(&c->started_tokens[0], 0);
    atomic_init(&c->started_tokens[1], 0);
    atomic_init(&c->copied, 0);
    c->logits = epd_calloc(c->info->vocab_size, sizeof(*c->logits));
    if (c->logits == NULL) {
        st = EPD_ERR_NO_MEMORY;
        goto err_free;
    }
    st = epd_sample_scratch_create(c->info->vocab_size, &c->scratch);
    if (st != EPD_OK) {
        goto err_free;
    }
    c->max_media = max_media;
    if (max_media > 0) {
        c->spans = epd_calloc(max_media, sizeof(*c->spans));
        if (c->spans == NULL) {
            st = EPD_ERR_NO_MEMORY;
            goto err_free;
        }
    }
    memset(&hc, 0, sizeof(hc));
    hc.name = "prefill compute";
    hc.nice = nice;
    hc.n_queues = EPD_PREFILL_N_QUEUES;
    hc.queue_cap[EPD_PREFILL_Q_RELEASE] = max_requests;
    hc.queue_cap[EPD_PREFILL_Q_RUN] = (size_t)max_requests * (1 + (size_t)max_media);
    /* the size argument of the header: each live request has at most
     * n_layers + 3 + max_media events queued */
    hc.event_cap = (size_t)max_requests * ((size_t)c->info->kv.n_layers + 3 + max_media);
    hc.run = epd_prefill_compute_on_job;
    hc.run_arg = c;
    hc.on_event = epd_prefill_compute_on_event;
    hc.event_arg = c;
    st = epd_handoff_create(loop, &hc, &c->h);
    if (st != EPD_OK) {
        epd_log_error(EPD_PREFILL_COMP, 0, "cannot start the compute thread: %s",
                      epd_status_string(st));
        goto err_free;
    }
    epd_log_info(EPD_PREFILL_COMP, 0,
                 "compute thread started: run queue %zu, release queue %zu, event queue %zu "
                 "(%u requests x (%u layers + 3 + %u images))",
                 hc.queue_cap[EPD_PREFILL_Q_RUN], hc.queue_cap[EPD_PREFILL_Q_RELEASE],
                 hc.event_cap, max_requests, c->info->kv.n_layers, max_media);
    *c_p = c;
    return EPD_OK;

err_free:
    epd_prefill_compute_free(c); /* the caller keeps the engine */
    return st;
}

void epd_prefill_compute_set_greedy(epd_prefill_compute_t *c, int on)
{
    c->greedy = on != 0;
}

void epd_prefill_compute_set_chunk(epd_prefill_compute_t *c, uint32_t tokens)
{
    c->chunk_tokens = tokens;
}

epd_status_t epd_prefill_compute_submit(epd_prefill_compute_t *c, epd_prefill_job_t *job)
{
    epd_status_t st;

    if (job->kind == EPD_PREFILL_JOB_RUN) {
        /* the compute module's part of the job (before the hand-off
         * publishes it to the compute thread) */
        job->chunk_started = 0;
        job->chunk_next = 0;
        job->chunk_ckpt = 0;
        job->chunk_ev = (epd_prefill_ev_t){.kind = EPD_PREFILL_EV_CHUNK, .owner = job};
        job->copy_parked = 0;
    }
    st = epd_handoff_submit(
        c->h, job->kind == EPD_PREFILL_JOB_RELEASE ? EPD_PREFILL_Q_RELEASE : EPD_PREFILL_Q_RUN, job);

    if (st != EPD_OK) {
        epd_log_error(EPD_PREFILL_COMP, job->seq.req_id,
                      "loop -> compute job queue full (sizing invariant broken)");
        return st;
    }
    if (job->kind == EPD_PREFILL_JOB_RUN) {
        c->submitted_runs++;
        c->submitted_tokens[job->from_router != 0] += job->n_tokens - job->start;
    }
    return EPD_OK;
}

void epd_prefill_compute_backlog(epd_prefill_compute_t *c, uint32_t *jobs_p, uint64_t *tokens_p,
                                 uint64_t *router_tokens_p)
{
    uint64_t runs = atomic_load(&c->started_runs);
    uint64_t others = c->submitted_tokens[0] - atomic_load(&c->started_tokens[0]);
    uint64_t router = c->submitted_tokens[1] - atomic_load(&c->started_tokens[1]);

    *jobs_p = (uint32_t)(c->submitted_runs - runs);
    *tokens_p = others + router;
    *router_tokens_p = router;
}

void epd_prefill_compute_destroy(epd_prefill_compute_t *c)
{
    if (c == NULL) {
        return;
    }
    epd_handoff_destroy(c->h); /* joins the thread: the engine is ours again */
    epd_engine_close(c->engine);
    epd_prefill_compute_free(c);
}
