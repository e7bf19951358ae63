/*
 * epd_encoder_compute.c — the compute thread (see the header for the
 * hand-offs and the queue sizing; the queues, semaphore and wake-up are
 * daemon/epd_handoff's).
 *
 * The engine and every decoded image belong to this thread alone.  The only
 * state shared with the loop thread is the hand-off and each job's cancel
 * flag.
 */
#include "epd_encoder_compute.h"

#include <string.h>

#include "epd_alloc.h"
#include "epd_handoff.h"
#include "epd_hash.h"
#include "epd_image.h"
#include "epd_log.h"
#include "epd_time.h"

#define EPD_ENCODER_COMP "encoder"

struct epd_encoder_compute {
    epd_engine_t *engine; /* compute thread (after create) */
    epd_handoff_t *h;
    epd_encoder_job_cb_t cb;
    void *cb_arg;
    int trace_named; /* compute thread: its trace track is named */
};

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
    epd_handoff_post(c->h, job);
}

void epd_encoder_job_describe(const epd_encoder_job_t *j, uint64_t max_pixels, char *msg,
                              size_t cap)
{
    const char *fmt =
        j->format != 0 ? epd_image_format_name((epd_image_format_t)j->format) : "PNG/JPEG";

    if (max_pixels == 0) {
        max_pixels = EPD_IMAGE_MAX_PIXELS_DEFAULT; /* as epd_image_decode reads 0 */
    }

    if (j->bad_hash) {
        snprintf(msg, cap, "content_hash is not the BLAKE2b-256 of the image (%zu bytes)",
                 j->image_len);
        return;
    }
    switch (j->status) {
    case EPD_ERR_MALFORMED:
        snprintf(msg, cap, "image does not decode: corrupt or truncated %s data (%zu bytes)", fmt,
                 j->image_len);
        break;
    case EPD_ERR_UNSUPPORTED:
        snprintf(msg, cap,
                 "image is not PNG or JPEG (or a JPEG kind the decoder lacks: lossless, "
                 "arithmetic coding, 12-bit)");
        break;
    case EPD_ERR_TOO_LONG:
        /* epd_image_decode's three size refusals, told apart by what they
         * measure: the message never names a limit the image is within */
        if (j->width == 0) {
            snprintf(msg, cap, "image of %zu bytes exceeds the decoder's limit of %zu bytes",
                     j->image_len, (size_t)EPD_IMAGE_MAX_BYTES);
        } else if ((uint64_t)j->width * j->height > max_pixels) {
            snprintf(msg, cap, "%s image of %u x %u pixels exceeds the limit of %llu pixels", fmt,
                     j->width, j->height, (unsigned long long)max_pixels);
        } else {
            snprintf(msg, cap, "%s image of %u x %u pixels: a side exceeds the limit of %u pixels",
                     fmt, j->width, j->height, EPD_IMAGE_MAX_SIDE);
        }
        break;
    case EPD_ERR_NO_MEMORY:
        snprintf(msg, cap, "out of memory decoding or encoding a %u x %u %s image", j->width,
                 j->height, fmt);
        break;
    default:
        snprintf(msg, cap, "encoding the image failed: %s", epd_status_string(j->status));
        break;
    }
}

/* Compute thread: the hand-off's run callback. */
static void epd_encoder_compute_on_job(void *arg, void *job, uint32_t queue)
{
    (void)queue;
    epd_encoder_compute_run(arg, job);
}

/* Loop thread: a finished job. */
static void epd_encoder_compute_on_done(void *arg, void *job)
{
    epd_encoder_compute_t *c = arg;

    c->cb(c->cb_arg, job);
}

epd_status_t epd_encoder_compute_create(uv_loop_t *loop, epd_engine_t *engine, uint32_t max_jobs,
                                        epd_encoder_job_cb_t cb, void *cb_arg,
                                        epd_encoder_compute_t **c_p)
{
    epd_handoff_config_t hc;
    epd_encoder_compute_t *c;
    epd_status_t st;

    if (loop == NULL || engine == NULL || cb == NULL || max_jobs == 0 || c_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    c = epd_calloc(1, sizeof(*c));
    if (c == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    c->cb = cb;
    c->cb_arg = cb_arg;
    c->engine = engine;
    memset(&hc, 0, sizeof(hc));
    hc.name = "encoder compute";
    hc.n_queues = 1;
    hc.queue_cap[0] = max_jobs;
    hc.event_cap = max_jobs;
    hc.run = epd_encoder_compute_on_job;
    hc.run_arg = c;
    hc.on_event = epd_encoder_compute_on_done;
    hc.event_arg = c;
    st = epd_handoff_create(loop, &hc, &c->h);
    if (st != EPD_OK) {
        epd_log_error(EPD_ENCODER_COMP, 0, "cannot start the compute thread: %s",
                      epd_status_string(st));
        epd_free(c); /* the caller keeps the engine */
        return st;
    }
    *c_p = c;
    return EPD_OK;
}

epd_status_t epd_encoder_compute_submit(epd_encoder_compute_t *c, epd_encoder_job_t *job)
{
    epd_status_t st = epd_handoff_submit(c->h, 0, job);

    if (st != EPD_OK) {
        epd_log_error(EPD_ENCODER_COMP, job->req_id,
                      "loop -> compute queue full (sizing invariant broken)");
    }
    return st;
}

uint32_t epd_encoder_compute_backlog(const epd_encoder_compute_t *c)
{
    return epd_handoff_backlog(c->h, 0);
}

void epd_encoder_compute_destroy(epd_encoder_compute_t *c)
{
    if (c == NULL) {
        return;
    }
    epd_handoff_destroy(c->h); /* joins the thread: the engine is ours again */
    epd_engine_close(c->engine);
    epd_free(c);
}
