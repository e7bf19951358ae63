/*
 * epd_router_hints.h — the router's index of the KV blocks one worker
 * holds: the 8-byte hints (kv/epd_prefix.h epd_prefix_hint, bit 0
 * cleared) its heartbeats publish, and the ones the router adds itself
 * when it sends a prompt there (the worker will cache them; its own
 * events confirm or correct that).  A set of uint64 with linear probing and
 * backward-shift deletion (no tombstones), bounded at creation: a worker
 * holds at most its pool, so more than that means stale hints (the router
 * expected blocks of a request that failed first): the set is cleared and
 * starts again.  Hints are hints: a wrong one costs a worse choice of
 * worker, never a wrong answer (nor a retry).
 *
 * Threads: the router's loop thread only.
 */
#ifndef EPD_ROUTER_HINTS_H
#define EPD_ROUTER_HINTS_H

#include <stddef.h>
#include <stdint.h>

#include "epd_status.h"

/* At most this many hints a worker (a 16 MiB table): a worker declaring
 * a larger pool gets a set that starts afresh more often, not a larger
 * allocation. */
#define EPD_ROUTER_HINTS_MAX (1u << 20)

typedef struct epd_router_hints epd_router_hints_t;

/* A set for at most `max` hints; *h_p owned by the caller.  EPD_ERR_NO_MEMORY. */
epd_status_t epd_router_hints_create(uint32_t max, epd_router_hints_t **h_p);
/* NULL is a no-op. */
void epd_router_hints_destroy(epd_router_hints_t *h);

/* One published event (bit 0: added, else removed). */
void epd_router_hints_apply(epd_router_hints_t *h, uint64_t event);
void epd_router_hints_add(epd_router_hints_t *h, uint64_t hint);
void epd_router_hints_clear(epd_router_hints_t *h);
int epd_router_hints_has(const epd_router_hints_t *h, uint64_t hint);
uint32_t epd_router_hints_count(const epd_router_hints_t *h);

#endif
