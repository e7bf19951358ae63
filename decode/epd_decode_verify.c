/*
 * epd_decode_verify.c — the verifier thread (see the header), on
 * daemon/epd_handoff.  The thread owns its hash state; it reads the KV pool
 * (the blocks of requests whose writes landed: fenced messages said so)
 * and the job, nothing else.
 */
#include "epd_decode_verify.h"

#include <errno.h>
#include <string.h>
#include <math.h>
#include <time.h>

#include "epd_alloc.h"
#include "epd_decode_check.h"
#include "epd_handoff.h"
#include "epd_log.h"
#include "epd_time.h"

struct epd_decode_verify {
    const epd_engine_info_t *info;
    epd_kv_pool_t pool;
    epd_hash_state_t *h; /* verifier thread */
    epd_trace_t *trace;
    epd_handoff_t *ho;
    epd_decode_verify_cb_t cb;
    void *cb_arg;
    int named; /* verifier thread: its trace track is named */
};

void epd_decode_vjob_init(epd_decode_vjob_t *j, void *owner, uint32_t layer, uint64_t sum,
                          epd_kv_sum_kind_t kind, const uint32_t *ids, uint32_t n_ids,
                          uint32_t slot, const epd_kv_stamp_expect_t *x)
{
    memset(j, 0, sizeof(*j));
    j->owner = owner;
    j->req_id = x->req_id;
    j->layer = layer;
    j->sum = sum;
    j->kind = kind;
    j->ids = ids;
    j->n_ids = n_ids;
    j->slot = slot;
    j->expect = *x;
}

/* The modelled device kernel lasts until `deadline` (absolute): sleep out
 * what the host's check did not already take. */
static void epd_decode_verify_until(uint64_t deadline_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(deadline_ns / EPD_NSEC_PER_SEC),
                          .tv_nsec = (long)(deadline_ns % EPD_NSEC_PER_SEC)};

    if (epd_time_now_ns() >= deadline_ns) {
        return;
    }
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* Verifier thread: one job. */
static void epd_decode_verify_run(void *arg, void *job_v, uint32_t queue)
{
    epd_decode_verify_t *v = arg;
    epd_decode_vjob_t *job = job_v;
    const epd_kv_layout_t *kv = &v->info->kv;

    (void)queue;
    if (v->trace != NULL && !v->named) {
        epd_trace_thread_name(v->trace, "decode verify");
        v->named = 1;
    }
    job->start_ns = epd_time_now_ns();
    job->why = NULL;
    job->bytes = 0;
    if (job->hs != NULL && job->kind == EPD_KV_SUM_STAMPED) {
        job->status = epd_kv_stamp_check_blocks(kv, &v->pool, job->ids, job->from, job->n_ids,
                                                job->layer, &job->expect, job->sum, job->hs,
                                                &job->bytes, &job->why);
    } else if (job->hs != NULL) {
        job->status = epd_decode_check_kv_blocks(kv, &v->pool, job->ids, job->from, job->n_ids,
                                                 job->layer, job->sum, job->hs, &job->bytes,
                                                 &job->why);
    } else {
        job->status = epd_decode_check_layer(kv, &v->pool, job->ids, job->n_ids, job->slot,
                                             job->layer, job->sum, job->kind, &job->expect, v->h,
                                             &job->bytes, &job->why);
    }
    if (job->kind == EPD_KV_SUM_STAMPED && !job->expect.full && v->info->device_mem_bw > 0.0) {
        /* the device's verification kernel reads the layer once */
        double s = (double)job->bytes / v->info->device_mem_bw;

        epd_decode_verify_until(job->start_ns + (uint64_t)llround(s * 1e9));
    }
    job->end_ns = epd_time_now_ns();
    if (v->trace != NULL) {
        epd_trace_span(v->trace, job->range ? "verify blocks" : "verify layer", "compute",
                       job->req_id, (int32_t)job->layer,
                       job->start_ns, job->end_ns);
    }
    epd_handoff_post(v->ho, job);
}

/* Loop thread: a job came back. */
static void epd_decode_verify_on_event(void *arg, void *ev)
{
    epd_decode_verify_t *v = arg;

    v->cb(v->cb_arg, ev);
}

epd_status_t epd_decode_verify_create(uv_loop_t *loop, const epd_engine_info_t *info,
                                      const epd_kv_pool_t *pool, uint32_t max_jobs,
                                      epd_trace_t *trace, epd_decode_verify_cb_t cb, void *cb_arg,
                                      epd_decode_verify_t **v_p)
{
    epd_handoff_config_t hc;
    epd_decode_verify_t *v;
    epd_status_t st;

    if (info == NULL || pool == NULL || cb == NULL || max_jobs == 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    v = epd_calloc(1, sizeof(*v));
    if (v == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    v->info = info;
    v->pool = *pool;
    v->trace = trace;
    v->cb = cb;
    v->cb_arg = cb_arg;
    st = epd_hash_state_create(0, &v->h);
    if (st != EPD_OK) {
        goto err_free;
    }
    memset(&hc, 0, sizeof(hc));
    hc.name = "decode verify";
    hc.n_queues = 1;
    hc.queue_cap[0] = max_jobs;
    hc.event_cap = max_jobs;
    hc.run = epd_decode_verify_run;
    hc.run_arg = v;
    hc.on_event = epd_decode_verify_on_event;
    hc.event_arg = v;
    st = epd_handoff_create(loop, &hc, &v->ho);
    if (st != EPD_OK) {
        goto err_free;
    }
    *v_p = v;
    return EPD_OK;

err_free:
    epd_hash_state_destroy(v->h);
    epd_free(v);
    return st;
}

epd_status_t epd_decode_verify_submit(epd_decode_verify_t *v, epd_decode_vjob_t *job)
{
    return epd_handoff_submit(v->ho, 0, job);
}

void epd_decode_verify_destroy(epd_decode_verify_t *v)
{
    if (v == NULL) {
        return;
    }
    epd_handoff_destroy(v->ho); /* joins the thread */
    epd_hash_state_destroy(v->h);
    epd_free(v);
}
