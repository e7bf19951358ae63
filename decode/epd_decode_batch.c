/*
 * epd_decode_batch.c — the compute thread of the decode worker (see the
 * header for the hand-off protocol).
 *
 * Queue entries are pointers; the final entry of a sequence is the pointer
 * with its low bit set (sequences are at least 8-byte aligned).  Everything
 * the step loop touches is preallocated: the running array, the engine's
 * request array and the logits of a full batch.
 */
#include "epd_decode_batch.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_queue.h"
#include "epd_time.h"

#define EPD__BATCH_COMP "decode"
#define EPD__BATCH_IDLE_MS 200 /* idle wait bound (re-checks the stop flag) */

struct epd_decode_batch {
    epd_engine_t *engine;
    epd_kv_pool_t pool;
    const epd_engine_info_t *info;
    uint32_t max_batch;
    epd_decode_wake_cb_t wake;
    void *wake_arg;

    epd_spsc_queue_t in;  /* loop → compute: sequences to admit */
    epd_spsc_queue_t out; /* compute → loop: notify / final entries */

    pthread_t thread;
    pthread_mutex_t mu; /* only around the idle wait */
    pthread_cond_t cv;
    atomic_int stop;
    atomic_uint kicks; /* bumped under mu by the loop: something may run now */
    atomic_uint n_running;
    atomic_ullong n_steps;
    epd_prom_histo_t step_hist; /* observed by the compute thread only */
    epd_prom_histo_t size_hist;

    /* compute thread only */
    epd_decode_seq_t **running; /* [max_batch] */
    epd_decode_seq_t **stepping; /* [max_batch]: the ones with room this step */
    epd_decode_req_t *reqs;     /* [max_batch] */
    float *logits;              /* [max_batch][vocab] */
    epd_sample_scratch_t *scratch;
    epd_decode_seq_t *pend_head, *pend_tail; /* entries that did not fit in `out` */
    int queued_any;                          /* something was queued since the last wake */
};

void epd_decode_seq_init(epd_decode_seq_t *seq, uint32_t n_known, uint32_t n_blocks)
{
    atomic_init(&seq->n_blocks, n_blocks);
    atomic_init(&seq->n_produced, n_known);
    atomic_init(&seq->finish, EPD_DECODE_FINISH_NONE);
    atomic_init(&seq->abort, 0);
    atomic_init(&seq->notified, 0);
    seq->error = EPD_OK;
    seq->n_gen = n_known;
    seq->stepped = 0;
    seq->pend_notify = 0;
    seq->pend_final = 0;
    seq->pend_next = NULL;
}

/* ------------------------------------------------------------ compute side */

static void epd__pend_add(epd_decode_batch_t *b, epd_decode_seq_t *seq)
{
    if (seq->pend_notify || seq->pend_final) {
        return; /* already listed */
    }
    seq->pend_next = NULL;
    if (b->pend_tail != NULL) {
        b->pend_tail->pend_next = seq;
    } else {
        b->pend_head = seq;
    }
    b->pend_tail = seq;
}

/* Queues a notify entry unless one is queued already. */
static void epd__notify(epd_decode_batch_t *b, epd_decode_seq_t *seq)
{
    if (seq->pend_notify || seq->pend_final) {
        return; /* entries are waiting behind the full queue: they carry it */
    }
    if (atomic_exchange_explicit(&seq->notified, 1, memory_order_acq_rel) != 0) {
        return;
    }
    if (epd_spsc_queue_push(&b->out, seq) == EPD_OK) {
        b->queued_any = 1;
        return;
    }
    epd__pend_add(b, seq);
    seq->pend_notify = 1;
}

void epd_decode_seq_grow(epd_decode_seq_t *seq, uint32_t n_blocks)
{
    assert(n_blocks >= atomic_load_explicit(&seq->n_blocks, memory_order_relaxed));
    atomic_store_explicit(&seq->n_blocks, n_blocks, memory_order_release);
}

uint32_t epd_decode_seq_blocks(const epd_decode_seq_t *seq)
{
    return atomic_load_explicit(&seq->n_blocks, memory_order_acquire);
}

/* Publishes `seq`'s end: after this the compute thread forgets it. */
static void epd__finish(epd_decode_batch_t *b, epd_decode_seq_t *seq, epd_decode_finish_t finish,
                        epd_status_t error)
{
    epd_kv_seq_t kv = {.req_id = seq->req_id,
                       .block_table = seq->block_table,
                       .n_blocks = epd_decode_seq_blocks(seq),
                       .state_slot = seq->slot};

    epd_engine_release(b->engine, &b->pool, &kv);
    seq->error = error;
    atomic_store_explicit(&seq->finish, finish, memory_order_release);
    if (!seq->pend_notify &&
        epd_spsc_queue_push(&b->out, (void *)((uintptr_t)seq | 1u)) == EPD_OK) {
        b->queued_any = 1;
        return;
    }
    epd__pend_add(b, seq);
    seq->pend_final = 1;
}

/* Retries entries that did not fit, in order. */
static void epd__pend_flush(epd_decode_batch_t *b)
{
    while (b->pend_head != NULL) {
        epd_decode_seq_t *seq = b->pend_head;
        epd_decode_seq_t *next = seq->pend_next;

        if (seq->pend_notify) {
            if (epd_spsc_queue_push(&b->out, seq) != EPD_OK) {
                return;
            }
            seq->pend_notify = 0;
            b->queued_any = 1;
        }
        /* unlink first: once its final entry is out, the loop may free it */
        b->pend_head = next;
        if (next == NULL) {
            b->pend_tail = NULL;
        }
        if (seq->pend_final) {
            seq->pend_final = 0;
            if (epd_spsc_queue_push(&b->out, (void *)((uintptr_t)seq | 1u)) != EPD_OK) {
                /* relink at the head and retry later */
                seq->pend_final = 1;
                seq->pend_next = next;
                b->pend_head = seq;
                if (next == NULL) {
                    b->pend_tail = seq;
                }
                return;
            }
            b->queued_any = 1;
        }
    }
}

static int epd__is_stop(const epd_decode_batch_t *b, const epd_decode_seq_t *seq, int32_t tok)
{
    if (!seq->sp.ignore_eos && epd_engine_is_eos(b->info, tok)) {
        return 1;
    }
    for (uint32_t i = 0; i < seq->n_stop; i++) {
        if ((uint32_t)tok == seq->stop_ids[i]) {
            return 1;
        }
    }
    return 0;
}

/* Removes running[i] (order does not matter: every request is independent). */
static void epd__running_remove(epd_decode_batch_t *b, uint32_t *n, uint32_t i)
{
    b->running[i] = b->running[*n - 1];
    (*n)--;
}

/* One step for every running sequence whose blocks hold its next
 * position (the others wait for the loop to grow them); returns how many
 * ran. */
static uint32_t epd__step(epd_decode_batch_t *b, uint32_t *n_run)
{
    uint32_t vocab = b->info->vocab_size;
    uint32_t bt = b->info->kv.block_tokens;
    uint32_t n = *n_run, m = 0;
    epd_status_t st;

    for (uint32_t i = 0; i < n; i++) {
        epd_decode_seq_t *seq = b->running[i];
        epd_decode_req_t *r = &b->reqs[m];
        uint32_t n_blocks = epd_decode_seq_blocks(seq);

        /* this step writes the KV of position n_prompt + n_gen - 1 */
        seq->stepped = (uint64_t)n_blocks * bt >= (uint64_t)seq->n_prompt + seq->n_gen;
        if (!seq->stepped) {
            continue;
        }
        r->seq.req_id = seq->req_id;
        r->seq.block_table = seq->block_table;
        r->seq.n_blocks = n_blocks;
        r->seq.state_slot = seq->slot;
        r->pos = seq->n_prompt + seq->n_gen - 1;
        r->token = seq->tokens[seq->n_gen - 1];
        b->stepping[m++] = seq;
    }
    if (m == 0) {
        return 0;
    }
    st = epd_engine_decode(b->engine, &b->pool, b->reqs, m, b->logits);
    atomic_fetch_add_explicit(&b->n_steps, 1, memory_order_relaxed);
    if (st != EPD_OK) {
        epd_log_error(EPD__BATCH_COMP, 0, "decode step of %u requests failed: %s", m,
                      epd_status_string(st));
        for (uint32_t j = 0; j < m; j++) {
            b->stepping[j]->error = st;
        }
    } else {
        /* sample every row first (indices into logits follow stepping[]) */
        for (uint32_t j = 0; j < m; j++) {
            epd_decode_seq_t *seq = b->stepping[j];
            const float *raw = b->logits + (size_t)j * vocab;
            const float *row = raw;
            epd_sample_adjust_t adj;
            int32_t tok;

            /* the request's logit adjustments (prompt + the tokens so far),
             * as prefill applied them to its first token, on a copy: the
             * logprobs are the raw logits' */
            epd_sample_adjust_of(&seq->sp, b->info->eos_tokens, b->info->n_eos, &adj);
            if (!epd_sample_adjust_is_off(&adj)) {
                float *copy = epd_sample_scratch_logits(b->scratch);

                memcpy(copy, raw, (size_t)vocab * sizeof(*copy));
                st = epd_sample_adjust(&adj, b->scratch, copy, vocab, seq->prompt,
                                       seq->prompt != NULL ? seq->n_prompt : 0,
                                       (const uint32_t *)seq->tokens, seq->n_gen);
                if (st != EPD_OK) {
                    seq->error = st;
                    continue;
                }
                row = copy;
            }
            st = epd_sample_token(&seq->sp, b->scratch, row, vocab, seq->n_gen, &tok);
            if (st == EPD_OK && seq->lps != NULL) {
                st = epd_sample_logprobs(raw, vocab, tok, seq->sp.logprobs - 1,
                                         &seq->lps[seq->n_gen]);
            }
            if (st != EPD_OK) {
                seq->error = st;
                continue;
            }
            seq->tokens[seq->n_gen++] = tok;
            atomic_store_explicit(&seq->n_produced, seq->n_gen, memory_order_release);
        }
    }
    /* then the finished ones leave */
    for (uint32_t i = n; i-- > 0;) {
        epd_decode_seq_t *seq = b->running[i];
        int32_t tok = seq->tokens[seq->n_gen - 1];
        epd_decode_finish_t fin = EPD_DECODE_FINISH_NONE;

        if (!seq->stepped) {
            continue;
        }
        if (seq->error != EPD_OK) {
            fin = EPD_DECODE_FINISH_ERROR;
        } else if (epd__is_stop(b, seq, tok)) {
            fin = EPD_DECODE_FINISH_STOP;
        } else if (seq->n_gen >= seq->max_tokens ||
                   seq->n_prompt + seq->n_gen - 1 >= b->info->max_context) {
            fin = EPD_DECODE_FINISH_LENGTH;
        }
        if (fin != EPD_DECODE_FINISH_NONE) {
            epd__running_remove(b, &n, i);
            epd__finish(b, seq, fin, seq->error);
        } else {
            epd__notify(b, seq);
        }
    }
    *n_run = n;
    return m;
}

static void *epd__batch_main(void *arg)
{
    epd_decode_batch_t *b = arg;
    uint32_t n = 0;

    while (!atomic_load_explicit(&b->stop, memory_order_acquire)) {
        unsigned kicks = atomic_load_explicit(&b->kicks, memory_order_acquire);
        uint32_t stepped = 0;
        epd_decode_seq_t *seq;

        epd__pend_flush(b);
        /* step boundary: aborted sequences leave, queued ones join */
        for (uint32_t i = n; i-- > 0;) {
            if (atomic_load_explicit(&b->running[i]->abort, memory_order_acquire)) {
                seq = b->running[i];
                epd__running_remove(b, &n, i);
                epd__finish(b, seq, EPD_DECODE_FINISH_ABORT, EPD_OK);
            }
        }
        while (n < b->max_batch && (seq = epd_spsc_queue_pop(&b->in)) != NULL) {
            if (atomic_load_explicit(&seq->abort, memory_order_acquire)) {
                epd__finish(b, seq, EPD_DECODE_FINISH_ABORT, EPD_OK);
                continue;
            }
            if (seq->n_gen >= seq->max_tokens) {
                /* nothing left to generate (the loop normally ends these
                 * with the first token): tokens[] has no room for more */
                epd__finish(b, seq, EPD_DECODE_FINISH_LENGTH, EPD_OK);
                continue;
            }
            b->running[n++] = seq;
        }
        atomic_store_explicit(&b->n_running, n, memory_order_relaxed);
        if (n > 0) {
            uint64_t t0 = epd_time_now_ns();

            stepped = epd__step(b, &n);
            if (stepped > 0) {
                epd_prom_histo_observe_ns(&b->step_hist, epd_time_now_ns() - t0);
                epd_prom_histo_observe(&b->size_hist, stepped);
            }
            atomic_store_explicit(&b->n_running, n, memory_order_relaxed);
        }
        if (b->queued_any) {
            b->queued_any = 0;
            b->wake(b->wake_arg);
        }
        if (stepped == 0) {
            /* idle, or every running sequence waits for blocks: sleep until
             * the loop submits, grows or aborts one (a kick since the top
             * of this iteration is not lost: it changed `kicks`) */
            struct timespec ts;

            pthread_mutex_lock(&b->mu);
            if (!atomic_load_explicit(&b->stop, memory_order_acquire) &&
                epd_spsc_queue_size(&b->in) == 0 &&
                atomic_load_explicit(&b->kicks, memory_order_acquire) == kicks) {
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += (long)(b->pend_head != NULL ? 1 : EPD__BATCH_IDLE_MS) * 1000000L;
                ts.tv_sec += ts.tv_nsec / 1000000000L;
                ts.tv_nsec %= 1000000000L;
                (void)pthread_cond_timedwait(&b->cv, &b->mu, &ts);
            }
            pthread_mutex_unlock(&b->mu);
        }
    }
    return NULL;
}

/* --------------------------------------------------------------- loop side */

epd_status_t epd_decode_batch_create(epd_engine_t *engine, const epd_kv_pool_t *pool,
                                     uint32_t max_batch, uint32_t queue_cap,
                                     epd_decode_wake_cb_t wake, void *wake_arg,
                                     epd_decode_batch_t **batch_p)
{
    epd_decode_batch_t *b;
    epd_status_t status;
    size_t out_cap;

    if (engine == NULL || pool == NULL || wake == NULL || batch_p == NULL || max_batch == 0 ||
        queue_cap == 0 || max_batch > epd_engine_info(engine)->max_batch) {
        return EPD_ERR_INVALID_PARAM;
    }
    b = epd_calloc(1, sizeof(*b));
    if (b == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    b->engine = engine;
    b->pool = *pool;
    b->info = epd_engine_info(engine);
    b->max_batch = max_batch;
    b->wake = wake;
    b->wake_arg = wake_arg;
    atomic_init(&b->stop, 0);
    atomic_init(&b->kicks, 0);
    atomic_init(&b->n_running, 0);
    atomic_init(&b->n_steps, 0);
    epd_prom_histo_init(&b->step_hist, EPD_PROM_SECONDS);
    epd_prom_histo_init(&b->size_hist, EPD_PROM_COUNT);
    status = epd_spsc_queue_init(&b->in, queue_cap);
    if (status != EPD_OK) {
        goto err_free;
    }
    /* each sequence has at most two entries queued (notify + final); more
     * room only means fewer retries from the private list */
    out_cap = 2 * ((size_t)queue_cap + max_batch);
    status = epd_spsc_queue_init(&b->out, out_cap);
    if (status != EPD_OK) {
        goto err_in;
    }
    b->running = epd_calloc(max_batch, sizeof(*b->running));
    b->stepping = epd_calloc(max_batch, sizeof(*b->stepping));
    b->reqs = epd_calloc(max_batch, sizeof(*b->reqs));
    b->logits = epd_calloc((size_t)max_batch * b->info->vocab_size, sizeof(*b->logits));
    if (b->running == NULL || b->stepping == NULL || b->reqs == NULL || b->logits == NULL) {
        status = EPD_ERR_NO_MEMORY;
        goto err_arrays;
    }
    status = epd_sample_scratch_create(b->info->vocab_size, &b->scratch);
    if (status != EPD_OK) {
        goto err_arrays;
    }
    if (pthread_mutex_init(&b->mu, NULL) != 0) {
        status = EPD_ERR_FATAL;
        goto err_scratch;
    }
    if (pthread_cond_init(&b->cv, NULL) != 0) {
        status = EPD_ERR_FATAL;
        goto err_mu;
    }
    if (pthread_create(&b->thread, NULL, epd__batch_main, b) != 0) {
        epd_log_error(EPD__BATCH_COMP, 0, "cannot start the compute thread");
        status = EPD_ERR_FATAL;
        goto err_cv;
    }
    (void)pthread_setname_np(b->thread, "decode batch");
    *batch_p = b;
    return EPD_OK;

err_cv:
    pthread_cond_destroy(&b->cv);
err_mu:
    pthread_mutex_destroy(&b->mu);
err_scratch:
    epd_sample_scratch_destroy(b->scratch);
err_arrays:
    epd_free(b->logits);
    epd_free(b->reqs);
    epd_free(b->stepping);
    epd_free(b->running);
    epd_spsc_queue_cleanup(&b->out);
err_in:
    epd_spsc_queue_cleanup(&b->in);
err_free:
    epd_free(b);
    return status;
}

void epd_decode_batch_destroy(epd_decode_batch_t *batch)
{
    if (batch == NULL) {
        return;
    }
    pthread_mutex_lock(&batch->mu);
    atomic_store_explicit(&batch->stop, 1, memory_order_release);
    pthread_cond_signal(&batch->cv);
    pthread_mutex_unlock(&batch->mu);
    pthread_join(batch->thread, NULL);
    pthread_cond_destroy(&batch->cv);
    pthread_mutex_destroy(&batch->mu);
    epd_sample_scratch_destroy(batch->scratch);
    epd_free(batch->logits);
    epd_free(batch->reqs);
    epd_free(batch->stepping);
    epd_free(batch->running);
    epd_spsc_queue_cleanup(&batch->out);
    epd_spsc_queue_cleanup(&batch->in);
    epd_free(batch);
}

epd_status_t epd_decode_batch_submit(epd_decode_batch_t *batch, epd_decode_seq_t *seq)
{
    epd_status_t st;

    assert(((uintptr_t)seq & 1u) == 0);
    st = epd_spsc_queue_push(&batch->in, seq);
    if (st != EPD_OK) {
        return st;
    }
    /* the compute thread checks the queue under the mutex before it sleeps,
     * so signalling under it cannot be lost */
    epd_decode_batch_kick(batch);
    return EPD_OK;
}

void epd_decode_batch_kick(epd_decode_batch_t *batch)
{
    pthread_mutex_lock(&batch->mu);
    atomic_fetch_add_explicit(&batch->kicks, 1, memory_order_release);
    pthread_cond_signal(&batch->cv);
    pthread_mutex_unlock(&batch->mu);
}

void epd_decode_seq_abort(epd_decode_seq_t *seq)
{
    atomic_store_explicit(&seq->abort, 1, memory_order_release);
}

epd_decode_seq_t *epd_decode_batch_poll(epd_decode_batch_t *batch, int *final_p)
{
    void *e = epd_spsc_queue_pop(&batch->out);
    epd_decode_seq_t *seq;

    if (e == NULL) {
        return NULL;
    }
    seq = (epd_decode_seq_t *)((uintptr_t)e & ~(uintptr_t)1u);
    if ((uintptr_t)e & 1u) {
        *final_p = 1;
        (void)atomic_load_explicit(&seq->finish, memory_order_acquire);
    } else {
        *final_p = 0;
        /* an RMW, so it reads the compute thread's latest exchange and sees
         * every token published before it */
        (void)atomic_exchange_explicit(&seq->notified, 0, memory_order_acq_rel);
    }
    return seq;
}

uint32_t epd_decode_batch_queued(epd_decode_batch_t *batch)
{
    return (uint32_t)epd_spsc_queue_size(&batch->in);
}

uint32_t epd_decode_batch_running(epd_decode_batch_t *batch)
{
    return atomic_load_explicit(&batch->n_running, memory_order_relaxed);
}

uint64_t epd_decode_batch_steps(epd_decode_batch_t *batch)
{
    return atomic_load_explicit(&batch->n_steps, memory_order_relaxed);
}

const epd_prom_histo_t *epd_decode_batch_step_histo(const epd_decode_batch_t *batch)
{
    return &batch->step_hist;
}

const epd_prom_histo_t *epd_decode_batch_size_histo(const epd_decode_batch_t *batch)
{
    return &batch->size_hist;
}
