/*
 * epd_queue.h — bounded single-producer single-consumer queue of pointers.
 *
 * The hand-off between a daemon's threads (loop → compute, compute →
 * transfer, transfer → loop): one thread pushes, one thread pops, no lock,
 * no allocation after init.  Push on a full queue returns
 * EPD_ERR_NO_RESOURCE (backpressure: nothing was queued); it never blocks and
 * never grows.  Pair it with uv_async_send (or an eventfd) to wake the
 * consumer.
 */
#ifndef EPD_QUEUE_H
#define EPD_QUEUE_H

#include <stdatomic.h>
#include <stddef.h>

#include "epd_status.h"

typedef struct {
    void **slots;         /* [capacity], owned */
    size_t mask;          /* capacity - 1 */
    /* The producer and consumer indices sit 64 bytes apart so the two threads
     * do not share a cache line.  Padding rather than _Alignas: an aligned
     * member would make every struct embedding a queue need 64-byte
     * alignment, which epd_malloc (16) does not give. */
    char pad0_[64];
    atomic_size_t head;   /* next slot to pop (consumer-owned) */
    char pad1_[64 - sizeof(atomic_size_t)];
    atomic_size_t tail;   /* next slot to push (producer-owned) */
    char pad2_[64 - sizeof(atomic_size_t)];
} epd_spsc_queue_t;

/* Initializes `q` (caller's storage) for at least `capacity` entries (rounded
 * up to a power of two, at least 2).  EPD_ERR_NO_MEMORY, EPD_ERR_INVALID_PARAM. */
epd_status_t epd_spsc_queue_init(epd_spsc_queue_t *q, size_t capacity);

/* Releases the slots; entries still queued are not touched (the caller owns
 * what they point to). */
void epd_spsc_queue_cleanup(epd_spsc_queue_t *q);

/* Producer thread only.  Queues `item` (not NULL); EPD_OK or
 * EPD_ERR_NO_RESOURCE when full. */
epd_status_t epd_spsc_queue_push(epd_spsc_queue_t *q, void *item);

/* Consumer thread only.  Returns the oldest entry, or NULL when empty. */
void *epd_spsc_queue_pop(epd_spsc_queue_t *q);

/* Approximate number of queued entries; any thread. */
size_t epd_spsc_queue_size(epd_spsc_queue_t *q);

#endif
