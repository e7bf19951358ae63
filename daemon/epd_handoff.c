/*
 * epd_handoff.c — compute thread hand-offs (see epd_handoff.h).
 */
#include "epd_handoff.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_queue.h"
#include "epd_time.h"

#define EPD_HANDOFF_LOG "handoff"

struct epd_handoff {
    epd_handoff_config_t cfg;
    epd_spsc_queue_t in[EPD_HANDOFF_QUEUES_MAX]; /* loop -> compute */
    epd_spsc_queue_t out;                        /* compute -> loop */
    sem_t sem;                                   /* jobs queued (+1 to stop) */
    uv_async_t async;
    pthread_t thread;
    int thread_started;
    int sem_ready;
    atomic_int stop;
    uint64_t submitted[EPD_HANDOFF_QUEUES_MAX];          /* loop thread */
    atomic_uint_fast64_t started[EPD_HANDOFF_QUEUES_MAX]; /* compute thread */
};

static void *epd_handoff_main(void *arg)
{
    epd_handoff_t *h = arg;

    if (h->cfg.nice != 0) {
        /* Linux keeps a nice value per thread: this one's only */
        id_t tid = (id_t)syscall(SYS_gettid);
        int cur;

        errno = 0;
        cur = getpriority(PRIO_PROCESS, tid);
        if ((cur == -1 && errno != 0) || setpriority(PRIO_PROCESS, tid, cur + h->cfg.nice) != 0) {
            if (h->cfg.nice < 0 && (errno == EACCES || errno == EPERM)) {
                /* raising a priority is a privilege (CAP_SYS_NICE,
                 * RLIMIT_NICE): the thread goes on at the daemon's */
                epd_log_info(EPD_HANDOFF_LOG, 0,
                             "%s: nice %+d refused (%s; CAP_SYS_NICE or RLIMIT_NICE allow it): "
                             "it runs at the daemon's",
                             h->cfg.name, h->cfg.nice, strerror(errno));
            } else {
                epd_log_warn(EPD_HANDOFF_LOG, 0, "%s: cannot change the thread's nice value: %s",
                             h->cfg.name, strerror(errno));
            }
        }
    }

    for (;;) {
        void *job = NULL;
        uint32_t q;

        if (sem_wait(&h->sem) != 0) {
            if (errno == EINTR) {
                continue;
            }
            epd_log_error(EPD_HANDOFF_LOG, 0, "%s: sem_wait failed: %s", h->cfg.name,
                          strerror(errno));
            break;
        }
        if (atomic_load(&h->stop)) {
            break; /* the loop no longer reads events */
        }
        for (q = 0; q < h->cfg.n_queues; q++) {
            job = epd_spsc_queue_pop(&h->in[q]);
            if (job != NULL) {
                break;
            }
        }
        if (job == NULL) {
            continue;
        }
        atomic_fetch_add(&h->started[q], 1);
        h->cfg.run(h->cfg.run_arg, job, q);
    }
    return NULL;
}

/* Loop thread: every event queued so far (uv_async_send coalesces). */
static void epd_handoff_on_async(uv_async_t *async)
{
    epd_handoff_t *h = async->data;
    void *ev;

    while ((ev = epd_spsc_queue_pop(&h->out)) != NULL) {
        h->cfg.on_event(h->cfg.event_arg, ev);
    }
}

static void epd_handoff_free(epd_handoff_t *h)
{
    for (uint32_t q = 0; q < EPD_HANDOFF_QUEUES_MAX; q++) {
        epd_spsc_queue_cleanup(&h->in[q]);
    }
    epd_spsc_queue_cleanup(&h->out);
    if (h->sem_ready) {
        sem_destroy(&h->sem);
    }
    epd_free(h);
}

static void epd_handoff_on_closed(uv_handle_t *handle)
{
    epd_handoff_free(handle->data);
}

epd_status_t epd_handoff_create(uv_loop_t *loop, const epd_handoff_config_t *config,
                                epd_handoff_t **h_p)
{
    epd_handoff_t *h;
    epd_status_t st;

    if (config->n_queues == 0 || config->n_queues > EPD_HANDOFF_QUEUES_MAX ||
        config->run == NULL || config->on_event == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    h = epd_calloc(1, sizeof(*h));
    if (h == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    h->cfg = *config;
    if (h->cfg.name == NULL) {
        h->cfg.name = "compute";
    }
    for (uint32_t q = 0; q < config->n_queues; q++) {
        st = epd_spsc_queue_init(&h->in[q], config->queue_cap[q] > 0 ? config->queue_cap[q] : 2);
        if (st != EPD_OK) {
            goto err_free;
        }
    }
    st = epd_spsc_queue_init(&h->out, config->event_cap > 0 ? config->event_cap : 2);
    if (st != EPD_OK) {
        goto err_free;
    }
    if (sem_init(&h->sem, 0, 0) != 0) {
        st = EPD_ERR_NO_MEMORY;
        goto err_free;
    }
    h->sem_ready = 1;
    if (uv_async_init(loop, &h->async, epd_handoff_on_async) != 0) {
        st = EPD_ERR_NO_MEMORY;
        goto err_free;
    }
    h->async.data = h;
    if (pthread_create(&h->thread, NULL, epd_handoff_main, h) != 0) {
        /* the handle frees h once closed */
        uv_close((uv_handle_t *)&h->async, epd_handoff_on_closed);
        return EPD_ERR_NO_MEMORY;
    }
    h->thread_started = 1;
    {
        /* the thread's name (15 bytes at most): what top, perf and
         * epd-bench overhead's CPU accounting show */
        char name[16];

        snprintf(name, sizeof(name), "%s", h->cfg.name != NULL ? h->cfg.name : "epd handoff");
        (void)pthread_setname_np(h->thread, name);
    }
    *h_p = h;
    return EPD_OK;

err_free:
    epd_handoff_free(h);
    return st;
}

epd_status_t epd_handoff_submit(epd_handoff_t *h, uint32_t queue, void *job)
{
    epd_status_t st;

    if (queue >= h->cfg.n_queues) {
        return EPD_ERR_INVALID_PARAM;
    }
    st = epd_spsc_queue_push(&h->in[queue], job);
    if (st != EPD_OK) {
        return st;
    }
    h->submitted[queue]++;
    (void)sem_post(&h->sem);
    return EPD_OK;
}

int epd_handoff_idle(epd_handoff_t *h)
{
    int v = 1;

    /* the semaphore counts the jobs queued (and the stop's post) */
    return !atomic_load(&h->stop) && sem_getvalue(&h->sem, &v) == 0 && v <= 0;
}

uint32_t epd_handoff_backlog(const epd_handoff_t *h, uint32_t queue)
{
    uint64_t started;

    if (queue >= h->cfg.n_queues) {
        return 0;
    }
    started = atomic_load(&((epd_handoff_t *)h)->started[queue]);
    return started >= h->submitted[queue] ? 0 : (uint32_t)(h->submitted[queue] - started);
}

void epd_handoff_post(epd_handoff_t *h, void *event)
{
    int warned = 0;

    while (epd_spsc_queue_push(&h->out, event) != EPD_OK) {
        if (!warned) {
            epd_log_error(EPD_HANDOFF_LOG, 0, "%s: event queue full (sizing invariant broken)",
                          h->cfg.name);
            warned = 1;
        }
        (void)uv_async_send(&h->async);
        if (atomic_load(&h->stop)) {
            return;
        }
        epd_time_sleep_ns(100 * EPD_NSEC_PER_USEC);
    }
    (void)uv_async_send(&h->async);
}

int epd_handoff_stopping(const epd_handoff_t *h)
{
    return atomic_load(&((epd_handoff_t *)h)->stop) != 0;
}

void epd_handoff_destroy(epd_handoff_t *h)
{
    if (h == NULL) {
        return;
    }
    atomic_store(&h->stop, 1);
    if (h->thread_started) {
        (void)sem_post(&h->sem);
        pthread_join(h->thread, NULL);
    }
    uv_close((uv_handle_t *)&h->async, epd_handoff_on_closed);
}
