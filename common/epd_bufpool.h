/*
 * epd_bufpool.h — copies of messages that must outlive the call that made
 * them (a send UCX completes later, a completion held behind a fence).
 *
 * Two tiers.  A buffer of up to `small` bytes comes from a pool that grows
 * lazily to `max_small` buffers and is then recycled: the steady state
 * allocates nothing.  A larger one (an image, up to the transport's
 * max_msg_size) is allocated to its own size and freed when given back,
 * all of those together bounded by `large_max` bytes — sizing every copy
 * to the largest message would pin megabytes per buffer.
 *
 * Each buffer is `head` bytes of the caller's header (zeroed by get),
 * followed by the data; get returns the header.  One thread (not locked).
 */
#ifndef EPD_BUFPOOL_H
#define EPD_BUFPOOL_H

#include <stddef.h>
#include <stdint.h>

typedef struct epd_bufpool_blk epd_bufpool_blk_t;

typedef struct {
    size_t head;             /* caller header bytes before the data */
    size_t small;            /* data bytes of a pooled buffer */
    uint32_t max_small;      /* pooled buffers at most */
    uint32_t n_small;        /* pooled buffers allocated */
    size_t large_max;        /* bytes of large buffers out at once, at most */
    size_t large_bytes;      /* bytes of large buffers out now */
    epd_bufpool_blk_t *free; /* pooled buffers given back */
} epd_bufpool_t;

/* Sets `p` up (caller's storage; allocates nothing yet). */
void epd_bufpool_init(epd_bufpool_t *p, size_t head, size_t small, uint32_t max_small,
                      size_t large_max);

/* A buffer for `len` data bytes: the caller's header, zeroed, with the data
 * right after it (epd_bufpool_data).  NULL when the tier is at its bound or
 * memory is short (backpressure: nothing changed).  Owned by the caller
 * until epd_bufpool_put. */
void *epd_bufpool_get(epd_bufpool_t *p, size_t len);

/* The data bytes of a buffer from epd_bufpool_get. */
static inline unsigned char *epd_bufpool_data(const epd_bufpool_t *p, void *buf)
{
    return (unsigned char *)buf + p->head;
}

/* Gives a buffer back (pooled ones are kept, large ones freed).  NULL is a
 * no-op. */
void epd_bufpool_put(epd_bufpool_t *p, void *buf);

/* Frees the pooled buffers given back; every buffer must have been put
 * first. */
void epd_bufpool_cleanup(epd_bufpool_t *p);

#endif
