/*
 * epd_decode_blocks.c — block and slot lifecycle (see the header for the
 * state diagram).
 *
 * One table per kind (blocks, slots): a state byte and an owner per entry,
 * plus a stack of free ids.  A transition first checks every named entry
 * (range, state, owner, named once) while marking it, and only then applies,
 * so a refused call leaves everything as it was.
 */
#include "epd_decode_blocks.h"

#include <assert.h>
#include <stddef.h>

#include "epd_alloc.h"
#include "epd_log.h"

#define EPD__BLK_MARK 0xffu /* transient "being checked" state */

typedef struct {
    uint32_t n;
    uint32_t n_free;      /* entries on the free stack */
    uint8_t *state;       /* [n] epd_decode_blk_state_t */
    uint64_t *owner;      /* [n] request id, 0 when FREE */
    uint32_t *free_stack; /* [n]; [0..n_free) are FREE ids */
    uint32_t count[EPD_DECODE_BLK_NSTATES];
} epd__blk_table_t;

struct epd_decode_blocks {
    epd__blk_table_t blk;
    epd__blk_table_t slot;
};

static epd_status_t epd__table_init(epd__blk_table_t *t, uint32_t n)
{
    t->n = n;
    t->n_free = n;
    t->state = epd_calloc(n ? n : 1, sizeof(*t->state));
    t->owner = epd_calloc(n ? n : 1, sizeof(*t->owner));
    t->free_stack = epd_calloc(n ? n : 1, sizeof(*t->free_stack));
    if (t->state == NULL || t->owner == NULL || t->free_stack == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    /* popped from the top: hand out low ids first (easier to read in logs) */
    for (uint32_t i = 0; i < n; i++) {
        t->free_stack[i] = n - 1 - i;
    }
    t->count[EPD_DECODE_BLK_FREE] = n;
    return EPD_OK;
}

static void epd__table_cleanup(epd__blk_table_t *t)
{
    epd_free(t->state);
    epd_free(t->owner);
    epd_free(t->free_stack);
}

epd_status_t epd_decode_blocks_create(uint32_t n_blocks, uint32_t n_slots,
                                      epd_decode_blocks_t **blocks_p)
{
    epd_decode_blocks_t *b;
    epd_status_t status;

    if (n_blocks == 0 || blocks_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    b = epd_calloc(1, sizeof(*b));
    if (b == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    status = epd__table_init(&b->blk, n_blocks);
    if (status != EPD_OK) {
        goto err_free;
    }
    status = epd__table_init(&b->slot, n_slots);
    if (status != EPD_OK) {
        goto err_free;
    }
    *blocks_p = b;
    return EPD_OK;

err_free:
    epd__table_cleanup(&b->slot);
    epd__table_cleanup(&b->blk);
    epd_free(b);
    return status;
}

void epd_decode_blocks_destroy(epd_decode_blocks_t *blocks)
{
    if (blocks == NULL) {
        return;
    }
    epd__table_cleanup(&blocks->slot);
    epd__table_cleanup(&blocks->blk);
    epd_free(blocks);
}

/* Marks ids[0..n) after checking each is in `from` and owned by `owner`;
 * on a bad one restores the marks, logs why and refuses. */
static epd_status_t epd__table_check(epd__blk_table_t *t, uint64_t owner, const uint32_t *ids,
                                     uint32_t n, epd_decode_blk_state_t from, const char *what)
{
    uint32_t i;

    for (i = 0; i < n; i++) {
        uint32_t id = ids[i];
        const char *why = NULL;

        if (id >= t->n) {
            why = "outside the pool";
        } else if (t->state[id] == EPD__BLK_MARK) {
            why = "named twice";
        } else if (t->state[id] != (uint8_t)from) {
            why = "not in the expected state";
        } else if (t->owner[id] != owner) {
            why = "owned by another request";
        }
        if (why != NULL) {
            epd_log_error("decode", owner,
                          "refused %s transition of %s %u: %s (state %s, owner %llu)",
                          epd_decode_blk_state_name(from), what, id, why,
                          id < t->n && t->state[id] != EPD__BLK_MARK
                              ? epd_decode_blk_state_name((epd_decode_blk_state_t)t->state[id])
                              : "-",
                          id < t->n ? (unsigned long long)t->owner[id] : 0ULL);
            break;
        }
        t->state[id] = EPD__BLK_MARK;
    }
    if (i == n) {
        return EPD_OK;
    }
    while (i-- > 0) {
        t->state[ids[i]] = (uint8_t)from;
    }
    return EPD_ERR_INVALID_PARAM;
}

/* Applies a checked (marked) transition. */
static void epd__table_apply(epd__blk_table_t *t, uint64_t owner, const uint32_t *ids, uint32_t n,
                             epd_decode_blk_state_t from, epd_decode_blk_state_t to)
{
    /* in reverse, so that freed ids go back on the stack lowest on top: the
     * next reservation gets ascending (usually contiguous) ids again, which
     * prefill writes as one write per layer instead of one per block */
    for (uint32_t i = n; i-- > 0;) {
        uint32_t id = ids[i];

        assert(t->state[id] == EPD__BLK_MARK && t->owner[id] == owner);
        t->state[id] = (uint8_t)to;
        if (to == EPD_DECODE_BLK_FREE) {
            assert(t->n_free < t->n);
            t->owner[id] = 0;
            t->free_stack[t->n_free++] = id;
        }
    }
    assert(t->count[from] >= n);
    t->count[from] -= n;
    t->count[to] += n;
    assert(t->count[EPD_DECODE_BLK_FREE] == t->n_free);
}

static epd_status_t epd__transition(epd_decode_blocks_t *b, uint64_t owner, const uint32_t *ids,
                                    uint32_t n, uint32_t slot, epd_decode_blk_state_t from,
                                    epd_decode_blk_state_t to)
{
    epd_status_t status;

    if (b == NULL || owner == 0 || (n > 0 && ids == NULL)) {
        return EPD_ERR_INVALID_PARAM;
    }
    status = epd__table_check(&b->blk, owner, ids, n, from, "block");
    if (status != EPD_OK) {
        return status;
    }
    if (slot != EPD_DECODE_NO_SLOT) {
        status = epd__table_check(&b->slot, owner, &slot, 1, from, "state slot");
        if (status != EPD_OK) {
            for (uint32_t i = 0; i < n; i++) {
                b->blk.state[ids[i]] = (uint8_t)from;
            }
            return status;
        }
        epd__table_apply(&b->slot, owner, &slot, 1, from, to);
    }
    epd__table_apply(&b->blk, owner, ids, n, from, to);
    return EPD_OK;
}

/* FREE -> `to` for n free blocks (and a slot when want_slot). */
static epd_status_t epd__take(epd_decode_blocks_t *blocks, uint64_t owner, uint32_t n,
                              int want_slot, uint32_t *ids, uint32_t *slot_p,
                              epd_decode_blk_state_t to)
{
    epd__blk_table_t *t;
    uint32_t slot = EPD_DECODE_NO_SLOT;

    if (blocks == NULL || owner == 0 || n == 0 || ids == NULL || slot_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    t = &blocks->blk;
    if (n > t->n_free || (want_slot && blocks->slot.n_free == 0)) {
        return EPD_ERR_NO_CAPACITY;
    }
    if (want_slot) {
        epd__blk_table_t *s = &blocks->slot;

        slot = s->free_stack[--s->n_free];
        assert(s->state[slot] == EPD_DECODE_BLK_FREE && s->owner[slot] == 0);
        s->state[slot] = (uint8_t)to;
        s->owner[slot] = owner;
        s->count[EPD_DECODE_BLK_FREE]--;
        s->count[to]++;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = t->free_stack[--t->n_free];

        assert(t->state[id] == EPD_DECODE_BLK_FREE && t->owner[id] == 0);
        t->state[id] = (uint8_t)to;
        t->owner[id] = owner;
        ids[i] = id;
    }
    t->count[EPD_DECODE_BLK_FREE] -= n;
    t->count[to] += n;
    *slot_p = slot;
    return EPD_OK;
}

epd_status_t epd_decode_blocks_reserve(epd_decode_blocks_t *blocks, uint64_t owner, uint32_t n,
                                       int want_slot, uint32_t *ids, uint32_t *slot_p)
{
    return epd__take(blocks, owner, n, want_slot, ids, slot_p, EPD_DECODE_BLK_RESERVED);
}

epd_status_t epd_decode_blocks_grow(epd_decode_blocks_t *blocks, uint64_t owner, uint32_t n,
                                    uint32_t *ids)
{
    uint32_t none;

    return epd__take(blocks, owner, n, 0, ids, &none, EPD_DECODE_BLK_ACTIVE);
}

epd_status_t epd_decode_blocks_activate(epd_decode_blocks_t *blocks, uint64_t owner,
                                        const uint32_t *ids, uint32_t n, uint32_t slot)
{
    return epd__transition(blocks, owner, ids, n, slot, EPD_DECODE_BLK_RESERVED,
                           EPD_DECODE_BLK_ACTIVE);
}

epd_status_t epd_decode_blocks_quarantine(epd_decode_blocks_t *blocks, uint64_t owner,
                                          const uint32_t *ids, uint32_t n, uint32_t slot)
{
    epd_decode_blk_state_t from;

    if (blocks == NULL || n == 0 || ids == NULL || ids[0] >= blocks->blk.n) {
        return EPD_ERR_INVALID_PARAM;
    }
    /* a request's blocks are all in one state; the check below refuses a
     * mixed set */
    from = (epd_decode_blk_state_t)blocks->blk.state[ids[0]];
    if (from != EPD_DECODE_BLK_RESERVED && from != EPD_DECODE_BLK_ACTIVE) {
        from = EPD_DECODE_BLK_RESERVED; /* refused below with a log line */
    }
    return epd__transition(blocks, owner, ids, n, slot, from, EPD_DECODE_BLK_QUARANTINED);
}

epd_status_t epd_decode_blocks_release(epd_decode_blocks_t *blocks, uint64_t owner,
                                       const uint32_t *ids, uint32_t n, uint32_t slot)
{
    return epd__transition(blocks, owner, ids, n, slot, EPD_DECODE_BLK_QUARANTINED,
                           EPD_DECODE_BLK_FREE);
}

epd_status_t epd_decode_blocks_retire(epd_decode_blocks_t *blocks, uint64_t owner,
                                      const uint32_t *ids, uint32_t n, uint32_t slot)
{
    return epd__transition(blocks, owner, ids, n, slot, EPD_DECODE_BLK_ACTIVE, EPD_DECODE_BLK_FREE);
}

epd_status_t epd_decode_blocks_unreserve(epd_decode_blocks_t *blocks, uint64_t owner,
                                         const uint32_t *ids, uint32_t n, uint32_t slot)
{
    return epd__transition(blocks, owner, ids, n, slot, EPD_DECODE_BLK_RESERVED,
                           EPD_DECODE_BLK_FREE);
}

epd_status_t epd_decode_blocks_cache(epd_decode_blocks_t *blocks, uint64_t owner,
                                     const uint32_t *ids, uint32_t n)
{
    epd__blk_table_t *t;
    epd_status_t status;

    if (blocks == NULL || owner == 0 || (n > 0 && ids == NULL)) {
        return EPD_ERR_INVALID_PARAM;
    }
    t = &blocks->blk;
    status = epd__table_check(t, owner, ids, n, EPD_DECODE_BLK_ACTIVE, "block");
    if (status != EPD_OK) {
        return status;
    }
    for (uint32_t i = 0; i < n; i++) {
        t->state[ids[i]] = EPD_DECODE_BLK_CACHED;
        t->owner[ids[i]] = 0;
    }
    t->count[EPD_DECODE_BLK_ACTIVE] -= n;
    t->count[EPD_DECODE_BLK_CACHED] += n;
    return EPD_OK;
}

epd_status_t epd_decode_blocks_uncache(epd_decode_blocks_t *blocks, const uint32_t *ids,
                                       uint32_t n)
{
    epd__blk_table_t *t;
    epd_status_t status;

    if (blocks == NULL || (n > 0 && ids == NULL)) {
        return EPD_ERR_INVALID_PARAM;
    }
    t = &blocks->blk;
    /* cached blocks have owner 0 */
    status = epd__table_check(t, 0, ids, n, EPD_DECODE_BLK_CACHED, "block");
    if (status != EPD_OK) {
        return status;
    }
    for (uint32_t i = n; i-- > 0;) {
        assert(t->n_free < t->n);
        t->state[ids[i]] = EPD_DECODE_BLK_FREE;
        t->free_stack[t->n_free++] = ids[i];
    }
    t->count[EPD_DECODE_BLK_CACHED] -= n;
    t->count[EPD_DECODE_BLK_FREE] += n;
    return EPD_OK;
}

uint32_t epd_decode_blocks_total(const epd_decode_blocks_t *blocks)
{
    return blocks->blk.n;
}

uint32_t epd_decode_blocks_slots_total(const epd_decode_blocks_t *blocks)
{
    return blocks->slot.n;
}

uint32_t epd_decode_blocks_free(const epd_decode_blocks_t *blocks)
{
    return blocks->blk.n_free;
}

uint32_t epd_decode_blocks_slots_free(const epd_decode_blocks_t *blocks)
{
    return blocks->slot.n_free;
}

uint32_t epd_decode_blocks_count(const epd_decode_blocks_t *blocks, epd_decode_blk_state_t state)
{
    return state < EPD_DECODE_BLK_NSTATES ? blocks->blk.count[state] : 0;
}

uint32_t epd_decode_blocks_slots_count(const epd_decode_blocks_t *blocks,
                                       epd_decode_blk_state_t state)
{
    return state < EPD_DECODE_BLK_NSTATES ? blocks->slot.count[state] : 0;
}

epd_decode_blk_state_t epd_decode_blocks_state(const epd_decode_blocks_t *blocks, uint32_t id)
{
    return id < blocks->blk.n ? (epd_decode_blk_state_t)blocks->blk.state[id] : EPD_DECODE_BLK_FREE;
}

uint64_t epd_decode_blocks_owner(const epd_decode_blocks_t *blocks, uint32_t id)
{
    return id < blocks->blk.n ? blocks->blk.owner[id] : 0;
}

epd_decode_blk_state_t epd_decode_blocks_slot_state(const epd_decode_blocks_t *blocks, uint32_t id)
{
    return id < blocks->slot.n ? (epd_decode_blk_state_t)blocks->slot.state[id]
                               : EPD_DECODE_BLK_FREE;
}

uint64_t epd_decode_blocks_slot_owner(const epd_decode_blocks_t *blocks, uint32_t id)
{
    return id < blocks->slot.n ? blocks->slot.owner[id] : 0;
}

const char *epd_decode_blk_state_name(epd_decode_blk_state_t state)
{
    switch (state) {
    case EPD_DECODE_BLK_FREE:
        return "FREE";
    case EPD_DECODE_BLK_RESERVED:
        return "RESERVED";
    case EPD_DECODE_BLK_ACTIVE:
        return "ACTIVE";
    case EPD_DECODE_BLK_QUARANTINED:
        return "QUARANTINED";
    case EPD_DECODE_BLK_CACHED:
        return "CACHED";
    case EPD_DECODE_BLK_NSTATES:
        break;
    }
    return "?";
}
