/*
 * epd_router_hints.c — a bounded open-addressing set of block hints (see
 * the header).  Hints are BLAKE2b bits, so their low bits index the table
 * directly; 0 marks an empty slot (a hint of 0 is stored as 2: the low bit
 * is the event's flag and never part of a hint).
 */
#include "epd_router_hints.h"

#include <string.h>

#include "epd_alloc.h"

struct epd_router_hints {
    uint64_t *slots; /* [mask + 1], 0 = empty */
    uint64_t mask;
    uint32_t count, max;
};

static uint64_t epd_router_hint_norm(uint64_t hint)
{
    hint &= ~1ull;
    return hint != 0 ? hint : 2;
}

epd_status_t epd_router_hints_create(uint32_t max, epd_router_hints_t **h_p)
{
    epd_router_hints_t *h;
    uint64_t n = 16;

    while (n < 2ull * max) {
        n <<= 1;
    }
    h = epd_calloc(1, sizeof(*h));
    if (h == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    h->slots = epd_calloc((size_t)n, sizeof(*h->slots));
    if (h->slots == NULL) {
        epd_free(h);
        return EPD_ERR_NO_MEMORY;
    }
    h->mask = n - 1;
    h->max = max;
    *h_p = h;
    return EPD_OK;
}

void epd_router_hints_destroy(epd_router_hints_t *h)
{
    if (h == NULL) {
        return;
    }
    epd_free(h->slots);
    epd_free(h);
}

int epd_router_hints_has(const epd_router_hints_t *h, uint64_t hint)
{
    uint64_t v = epd_router_hint_norm(hint);

    for (uint64_t i = v & h->mask;; i = (i + 1) & h->mask) {
        if (h->slots[i] == v) {
            return 1;
        }
        if (h->slots[i] == 0) {
            return 0;
        }
    }
}

void epd_router_hints_add(epd_router_hints_t *h, uint64_t hint)
{
    uint64_t v = epd_router_hint_norm(hint);
    uint64_t i;

    for (i = v & h->mask; h->slots[i] != 0; i = (i + 1) & h->mask) {
        if (h->slots[i] == v) {
            return;
        }
    }
    if (h->count >= h->max) {
        /* more than the worker can hold: some hints are stale (the router
         * expected blocks a failed request never cached).  Start afresh:
         * forgetting hints costs choices, keeping wrong ones costs more */
        epd_router_hints_clear(h);
        for (i = v & h->mask; h->slots[i] != 0; i = (i + 1) & h->mask) {
        }
    }
    h->slots[i] = v;
    h->count++;
}

static void epd_router_hints_remove(epd_router_hints_t *h, uint64_t hint)
{
    uint64_t v = epd_router_hint_norm(hint);
    uint64_t i, j;

    for (i = v & h->mask; h->slots[i] != v; i = (i + 1) & h->mask) {
        if (h->slots[i] == 0) {
            return;
        }
    }
    /* backward shift: move later entries of the run into the hole when
     * their home slot does not lie cyclically in (hole, their slot] */
    for (j = (i + 1) & h->mask; h->slots[j] != 0; j = (j + 1) & h->mask) {
        uint64_t home = h->slots[j] & h->mask;

        if (((j - home) & h->mask) >= ((j - i) & h->mask)) {
            h->slots[i] = h->slots[j];
            i = j;
        }
    }
    h->slots[i] = 0;
    h->count--;
}

void epd_router_hints_apply(epd_router_hints_t *h, uint64_t event)
{
    if ((event & 1u) != 0) {
        epd_router_hints_add(h, event);
    } else {
        epd_router_hints_remove(h, event);
    }
}

void epd_router_hints_clear(epd_router_hints_t *h)
{
    memset(h->slots, 0, (size_t)(h->mask + 1) * sizeof(*h->slots));
    h->count = 0;
}

uint32_t epd_router_hints_count(const epd_router_hints_t *h)
{
    return h->count;
}
