/*
 * epd_bufpool.c — see epd_bufpool.h.  Every buffer carries a hidden prefix
 * (its tier and the free-list link) in front of the caller's header.
 */
#include "epd_bufpool.h"

#include <stddef.h>
#include <string.h>

#include "epd_alloc.h"

struct epd_bufpool_blk {
    union {
        struct {
            epd_bufpool_blk_t *next; /* free list (pooled) */
            size_t large;            /* 0: pooled; else its data bytes */
        } s;
        max_align_t align_; /* the caller's header starts aligned */
    } u;
};

void epd_bufpool_init(epd_bufpool_t *p, size_t head, size_t small, uint32_t max_small,
                      size_t large_max)
{
    memset(p, 0, sizeof(*p));
    p->head = head;
    p->small = small;
    p->max_small = max_small;
    p->large_max = large_max;
}

void *epd_bufpool_get(epd_bufpool_t *p, size_t len)
{
    epd_bufpool_blk_t *b;

    if (len > p->small) {
        if (p->large_bytes + len > p->large_max) {
            return NULL;
        }
        b = epd_malloc(sizeof(*b) + p->head + len);
        if (b == NULL) {
            return NULL;
        }
        b->u.s.large = len;
        p->large_bytes += len;
    } else if ((b = p->free) != NULL) {
        p->free = b->u.s.next;
    } else {
        if (p->n_small >= p->max_small) {
            return NULL;
        }
        b = epd_malloc(sizeof(*b) + p->head + p->small);
        if (b == NULL) {
            return NULL;
        }
        b->u.s.large = 0;
        p->n_small++;
    }
    b->u.s.next = NULL;
    memset(b + 1, 0, p->head);
    return b + 1;
}

void epd_bufpool_put(epd_bufpool_t *p, void *buf)
{
    epd_bufpool_blk_t *b;

    if (buf == NULL) {
        return;
    }
    b = (epd_bufpool_blk_t *)buf - 1;
    if (b->u.s.large != 0) {
        p->large_bytes -= b->u.s.large;
        epd_free(b);
        return;
    }
    b->u.s.next = p->free;
    p->free = b;
}

void epd_bufpool_cleanup(epd_bufpool_t *p)
{
    while (p->free != NULL) {
        epd_bufpool_blk_t *b = p->free;

        p->free = b->u.s.next;
        epd_free(b);
        p->n_small--;
    }
}
