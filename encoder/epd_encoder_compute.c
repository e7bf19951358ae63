/*
 * epd_encoder_compute.c — the compute thread (see the header for the
 * hand-offs and the queue sizing).
 *
 * The engine and every decoded image belong to this thread alone.  The only
 * state shared with the loop thread is the two SPSC queues, the semaphore,
 * the atomics below and each job's cancel flag.
 */
#include "epd_encoder_compute.h"

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

#define EPD_ENCODER_COMP "encoder"

struct epd_encoder_compute {
    epd_engine_t *engine;  /* compute thread (after create) */
    epd_spsc_queue_t jobs; /* loop -> compute, FIFO */
    epd_spsc_queue_t done; /* compute -> loop */
    sem_t sem;             /* counts submitted jobs (+1 to stop) */
    uv_async_t async;      /* wakes the loop for finished jobs */
    pthread_t thread;
    int thread_started;
    atomic_int stop;
    uint64_t submitted; /* loop thread */
    atomic_uint_fast64_t started;
    epd_encoder_job_cb_t cb;
    void *cb_arg;
    int trace_named; /* compute thread: its trace track is named */
};

/* Compute thread: hand a finished job back.  The queue is sized so this
 * succeeds at once; if the invariant is ever broken it retries with short
 * sleeps rather than dropping the job or blocking for good. */
static void epd_encoder_compute_emit(epd_encoder_compute_t *c, epd_encoder_job_t *job)
{
    int warned = 0;

    while (epd_spsc_queue_push(&c->done, job) != EPD_OK) {
        if (!warned) {
            epd_log_error(EPD_ENCODER_COMP, 0,
                          "compute -> loop queue full (sizing invariant broken)");
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

static int epd_encoder_job_canceled(epd_encoder_job_t *job)
{
    return atomic_load_explicit(&job->cancel, memory_order_acquire) != 0;
}

/* The format the magic bytes claim (0 for neither), for error messages:
 * read here rather than by epd_image_probe, which logs what it refuses and
 * epd_image_decode already did. */
static int epd_encoder_magic_format(const unsigned char *p, size_t len)
{
    static const unsigned char png[8] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};

    if (len >= sizeof(png) && memcmp(p, png, sizeof(png)) == 0) {
        return EPD_IMAGE_PNG;
    }
    if (len >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff) {
        return EPD_IMAGE_JPEG;
    }
    return 0;
}

static void epd_encoder_compute_run(epd_encoder_compute_t *c, epd_encoder_job_t *job)
{
    unsigned char hash[EPD_CONTENT_HASH_BYTES];
    epd_image_info_t info;
    epd_image_view_t view;
    epd_image_t img;
    uint64_t t_hashed;
    epd_status_t st;

    memset(&img, 0, sizeof(img));
    job->started_ns = epd_time_now_ns();
    job->decoded_ns = 0;
    job->finished_ns = 0;
    job->width = job->height = 0;
    job->format = 0;
    job->checksum = 0;
    job->bad_hash = 0;
    if (job->trace != NULL && !c->trace_named) {
        epd_trace_thread_name(job->trace, "encoder compute");
        c->trace_named = 1;
    }
    atomic_fetch_add(&c->started, 1);
    if (epd_encoder_job_canceled(job)) {
        st = EPD_ERR_CANCELED;
        goto out;
    }
    /* the cache key must name its bytes (proto/README.md rule 16) */
    epd_content_hash(job->image, job->image_len, hash);
    t_hashed = epd_time_now_ns();
    epd_trace_span(job->trace, "verify hash", "compute", job->req_id, (int32_t)job->media_index,
                   job->started_ns, t_hashed);
    if (memcmp(hash, job->content_hash, sizeof(hash)) != 0) {
        job->bad_hash = 1;
        st = EPD_ERR_INVALID_PARAM;
        goto out;
    }
    st = epd_image_decode(job->image, job->image_len, job->max_pixels, &img);
    job->decoded_ns = epd_time_now_ns();
    epd_trace_span(job->trace, "decode image", "compute", job->req_id, (int32_t)job->media_index,
                   t_hashed, job->decoded_ns);
    job->format = epd_encoder_magic_format(job->image, job->image_len);
    if (st == EPD_OK) {
        job->width = img.width;
        job->height = img.height;
    } else if (st == EPD_ERR_TOO_LONG &&
               epd_image_probe(job->image, job->image_len, &info) == EPD_OK) {
        /* the declared size names the refusal (a header that probes is not
         * logged again) */
        job->width = info.width;
        job->height = info.height;
    }
    if (st != EPD_OK) {
        goto out;
    }
    if (epd_encoder_job_canceled(job)) {
        st = EPD_ERR_CANCELED;
        goto out;
    }
    view = epd_image_view(&img);
    st = epd_engine_encode_image(c->engine, &view, job->out);
    if (st == EPD_OK) {
        job->checksum = epd_hash64(job->out, job->out_bytes, 0);
    }
    job->finished_ns = epd_time_now_ns();
    epd_trace_span(job->trace, "encode", "compute", job->req_id, (int32_t)job->media_index,
                   job->decoded_ns, job->finished_ns);
out:
    epd_image_cleanup(&img);
    if (job->finished_ns == 0) {
        job->finished_ns = epd_time_now_ns();
    }
    job->status = st;
    /* last touch of the job: after the push the loop may free the request */
    epd_encoder_compute_emit(c, job);
}

static void *epd_encoder_compute_main(void *arg)
{
    epd_encoder_compute_t *c = arg;

    for (;;) {
        epd_encoder_job_t *job;

        if (sem_wait(&c->sem) != 0) {
            if (errno == EINTR) {
                continue;
            }
            epd_log_error(EPD_ENCODER_COMP, 0, "compute thread: sem_wait failed: %s",
                          strerror(errno));
            break;
        }
        if (atomic_load(&c->stop)) {
            break; /* shutting down: the loop no longer reads finished jobs */
        }
        job = epd_spsc_queue_pop(&c->jobs);
        if (job == NULL) {
            continue;
        }
        epd_encoder_compute_run(c, job);
    }
    return NULL;
}

/* Loop thread: hand every finished job back (uv_async_send coalesces). */
static void epd_encoder_compute_on_async(uv_async_t *handle)
{
    epd_encoder_compute_t *c = handle->data;
    epd_encoder_job_t *job;

    while ((job = epd_spsc_queue_pop(&c->done)) != NULL) {
        c->cb(c->cb_arg, job);
    }
}

static void epd_encoder_compute_on_closed(uv_handle_t *handle)
{
    epd_free(handle->data);
}

epd_status_t epd_encoder_compute_create(uv_loop_t *loop, epd_engine_t *engine, uint32_t max_jobs,
                                        epd_encoder_job_cb_t cb, void *cb_arg,
                                        epd_encoder_compute_t **c_p)
{
    epd_encoder_compute_t *c;
    epd_status_t st;
    int rc;

    if (loop == NULL || engine == NULL || cb == NULL || max_jobs == 0 || c_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    c = epd_calloc(1, sizeof(*c));
    if (c == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    c->cb = cb;
    c->cb_arg = cb_arg;
    atomic_init(&c->stop, 0);
    atomic_init(&c->started, 0);
    st = epd_spsc_queue_init(&c->jobs, max_jobs);
    if (st != EPD_OK) {
        goto err_free;
    }
    st = epd_spsc_queue_init(&c->done, max_jobs);
    if (st != EPD_OK) {
        goto err_cleanup_jobs;
    }
    if (sem_init(&c->sem, 0, 0) != 0) {
        st = EPD_ERR_FATAL;
        goto err_cleanup_done;
    }
    rc = uv_async_init(loop, &c->async, epd_encoder_compute_on_async);
    if (rc != 0) {
        epd_log_error(EPD_ENCODER_COMP, 0, "uv_async_init: %s", uv_strerror(rc));
        st = EPD_ERR_FATAL;
        goto err_destroy_sem;
    }
    c->async.data = c;
    c->engine = engine;
    rc = pthread_create(&c->thread, NULL, epd_encoder_compute_main, c);
    if (rc != 0) {
        epd_log_error(EPD_ENCODER_COMP, 0, "cannot start the compute thread: %s", strerror(rc));
        c->engine = NULL; /* the caller keeps it */
        sem_destroy(&c->sem);
        epd_spsc_queue_cleanup(&c->done);
        epd_spsc_queue_cleanup(&c->jobs);
        /* the handle is live: c is freed by its close callback */
        uv_close((uv_handle_t *)&c->async, epd_encoder_compute_on_closed);
        return EPD_ERR_FATAL;
    }
    c->thread_started = 1;
    *c_p = c;
    return EPD_OK;

err_destroy_sem:
    sem_destroy(&c->sem);
err_cleanup_done:
    epd_spsc_queue_cleanup(&c->done);
err_cleanup_jobs:
    epd_spsc_queue_cleanup(&c->jobs);
err_free:
    epd_free(c);
    return st;
}

epd_status_t epd_encoder_compute_submit(epd_encoder_compute_t *c, epd_encoder_job_t *job)
{
    epd_status_t st = epd_spsc_queue_push(&c->jobs, job);

    if (st != EPD_OK) {
        epd_log_error(EPD_ENCODER_COMP, job->req_id,
                      "loop -> compute queue full (sizing invariant broken)");
        return st;
    }
    c->submitted++;
    (void)sem_post(&c->sem);
    return EPD_OK;
}

uint32_t epd_encoder_compute_backlog(const epd_encoder_compute_t *c)
{
    uint64_t started = atomic_load(&((epd_encoder_compute_t *)c)->started);

    return c->submitted > started ? (uint32_t)(c->submitted - started) : 0;
}

void epd_encoder_compute_destroy(epd_encoder_compute_t *c)
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
    epd_spsc_queue_cleanup(&c->done);
    epd_spsc_queue_cleanup(&c->jobs);
    uv_close((uv_handle_t *)&c->async, epd_encoder_compute_on_closed);
}
