/*
 * epd_queue.c — Lamport ring with C11 acquire/release ordering.
 *
 * The producer publishes a slot by storing `tail` with release order after
 * writing the slot; the consumer reads `tail` with acquire order before
 * reading the slot (and symmetrically for `head`), so no fence or lock is
 * needed.  Indices run freely and are masked on use.
 */
#include "epd_queue.h"

#include "epd_alloc.h"

epd_status_t epd_spsc_queue_init(epd_spsc_queue_t *q, size_t capacity)
{
    size_t cap = 2;

    if (capacity == 0 || capacity > ((size_t)1 << 30)) {
        return EPD_ERR_INVALID_PARAM;
    }
    while (cap < capacity) {
        cap <<= 1;
    }
    q->slots = epd_calloc(cap, sizeof(*q->slots));
    if (q->slots == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    q->mask = cap - 1;
    atomic_init(&q->head, 0);
    atomic_init(&q->tail, 0);
    return EPD_OK;
}

void epd_spsc_queue_cleanup(epd_spsc_queue_t *q)
{
    epd_free(q->slots);
    q->slots = NULL;
}

epd_status_t epd_spsc_queue_push(epd_spsc_queue_t *q, void *item)
{
    size_t tail = atomic_load_explicit(&q->tail, memory_order_relaxed);
    size_t head = atomic_load_explicit(&q->head, memory_order_acquire);

    if (tail - head > q->mask) {
        return EPD_ERR_NO_RESOURCE;
    }
    q->slots[tail & q->mask] = item;
    atomic_store_explicit(&q->tail, tail + 1, memory_order_release);
    return EPD_OK;
}

void *epd_spsc_queue_pop(epd_spsc_queue_t *q)
{
    size_t head = atomic_load_explicit(&q->head, memory_order_relaxed);
    size_t tail = atomic_load_explicit(&q->tail, memory_order_acquire);
    void *item;

    if (head == tail) {
        return NULL;
    }
    item = q->slots[head & q->mask];
    atomic_store_explicit(&q->head, head + 1, memory_order_release);
    return item;
}

size_t epd_spsc_queue_size(epd_spsc_queue_t *q)
{
    size_t tail = atomic_load_explicit(&q->tail, memory_order_acquire);
    size_t head = atomic_load_explicit(&q->head, memory_order_acquire);

    return tail - head;
}
