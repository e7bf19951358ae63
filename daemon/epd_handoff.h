/*
 * epd_handoff.h — a compute thread and the loop thread handing work to each
 * other, with no lock held across a compute or a network call.
 *
 *   loop -> compute: up to EPD_HANDOFF_QUEUES_MAX bounded SPSC queues of job
 *     pointers plus a POSIX semaphore counting them; the thread sleeps in
 *     sem_wait when there is nothing to do and takes the next job from the
 *     lowest-numbered queue that has one (prefill's releases, queue 0, never
 *     wait behind its queued runs, queue 1).  sem_post never blocks, so the
 *     loop never waits for compute.
 *   compute -> loop: a bounded SPSC queue of event pointers plus
 *     uv_async_send; on the loop, every queued event is handed to the
 *     event callback (uv_async coalesces wake-ups: the callback drains).
 *
 * Jobs and events are the owner's memory (inside its requests), lent from
 * submit / post until handed back; the owner sizes the queues so that a
 * push cannot meet a full queue (the number of jobs and events that can be
 * outstanding at once).  A push that fails anyway is a broken invariant:
 * submit returns EPD_ERR_NO_RESOURCE; post logs once and retries with short
 * sleeps while the hand-off is not being stopped — it never blocks forever.
 *
 * Threads: create, submit, backlog and destroy on the loop thread; `run`
 * on the compute thread; `on_event` on the loop thread.
 */
#ifndef EPD_HANDOFF_H
#define EPD_HANDOFF_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "epd_status.h"

#define EPD_HANDOFF_QUEUES_MAX 4

typedef struct epd_handoff epd_handoff_t;

/* Compute thread: run one job taken from `queue`.  It hands results back
 * with epd_handoff_post (any number of them, each its own event). */
typedef void (*epd_handoff_run_cb_t)(void *arg, void *job, uint32_t queue);
/* Loop thread: one event the compute thread posted, in posting order. */
typedef void (*epd_handoff_event_cb_t)(void *arg, void *event);

typedef struct {
    const char *name; /* for log lines, e.g. "prefill compute" */
    uint32_t n_queues; /* 1..EPD_HANDOFF_QUEUES_MAX */
    size_t queue_cap[EPD_HANDOFF_QUEUES_MAX];
    size_t event_cap;
    epd_handoff_run_cb_t run;
    void *run_arg;
    epd_handoff_event_cb_t on_event;
    void *event_arg;
    int nice; /* added to the thread's nice value as it starts (0: none; Linux: per
               * thread; a failure is logged, not fatal) */
} epd_handoff_config_t;

/* Starts the thread.  Owned by the caller (epd_handoff_destroy).  Loop
 * thread (the uv_async is created on `loop`). */
epd_status_t epd_handoff_create(uv_loop_t *loop, const epd_handoff_config_t *config,
                                epd_handoff_t **h_p);

/* Queues `job` (lent) on `queue`.  EPD_OK, or EPD_ERR_NO_RESOURCE when the
 * queue is full (nothing queued).  Loop thread; never blocks. */
epd_status_t epd_handoff_submit(epd_handoff_t *h, uint32_t queue, void *job);

/* Jobs of `queue` submitted and not yet started.  Loop thread. */
uint32_t epd_handoff_backlog(const epd_handoff_t *h, uint32_t queue);

/* Compute thread: hands `event` (lent back to the loop) to on_event and
 * wakes the loop. */
void epd_handoff_post(epd_handoff_t *h, void *event);

/* Compute thread: nonzero when no job waits in any queue and no stop was
 * asked — a job in several turns may run its next one at once instead of
 * going back to the loop (a job submitted just after waits for that turn). */
int epd_handoff_idle(epd_handoff_t *h);

/* Compute thread: nonzero once destroy was asked (long jobs may end early). */
int epd_handoff_stopping(const epd_handoff_t *h);

/* Stops the thread after the job it is running (the owner cancels that one
 * first if it must end early), joins it and closes the uv_async (the loop
 * must run once more to free it).  Jobs not started and events not yet
 * handed back are dropped.  Loop thread.  NULL is a no-op. */
void epd_handoff_destroy(epd_handoff_t *h);

#endif
