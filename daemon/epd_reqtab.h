/*
 * epd_reqtab.h — a daemon's live requests: found by id, walked in order,
 * and queued for work.
 *
 * A role embeds an epd_reqent_t in each of its requests and keeps one
 * epd_reqtab_t: a hash table by (id, sub) — `sub` tells apart several
 * entries of one request id (the encoder's images); 0 otherwise — a list
 * of every entry (newest first), and two work lists:
 *   dirty    entries to look at again at the top of the loop (the pump);
 *   blocked  entries parked on transport backpressure, retried after room
 *            is made (a write completed) or on the tick.
 * An entry is on at most one of the two.  Nothing here allocates after
 * init; nothing takes a lock.  Threads: the owner's (a loop thread).
 */
#ifndef EPD_REQTAB_H
#define EPD_REQTAB_H

#include <stddef.h>
#include <stdint.h>

#include "epd_status.h"

typedef struct epd_reqent {
    uint64_t id;
    uint32_t sub;
    /* private */
    struct epd_reqent *hnext_;
    struct epd_reqent *all_prev_, *all_next_;
    struct epd_reqent *lprev_, *lnext_;
    int list_; /* 0 none, 1 dirty, 2 blocked */
} epd_reqent_t;

typedef struct {
    /* private */
    epd_reqent_t **table_; /* [size_] chains */
    uint32_t size_;
    uint32_t n_;
    epd_reqent_t *all_;
    epd_reqent_t *dirty_head_, *dirty_tail_;
    epd_reqent_t *blocked_head_, *blocked_tail_;
    size_t offset_; /* of the entry in its request */
} epd_reqtab_t;

/* The request that embeds entry `e` as member `field`. */
#define EPD_REQ_OF(e, type, field) ((type *)(void *)((char *)(e)-offsetof(type, field)))

/* Sizes the table for about `expected` live entries (caller's storage);
 * each entry sits at ent_offset in its request (offsetof(type, field)), so
 * the *_req calls below hand back the request itself. */
epd_status_t epd_reqtab_init(epd_reqtab_t *t, uint32_t expected, size_t ent_offset);
/* Frees the table; the entries are the owner's. */
void epd_reqtab_cleanup(epd_reqtab_t *t);

/* Adds `e` (its id and sub set) to the table and the head of the walk. */
void epd_reqtab_insert(epd_reqtab_t *t, epd_reqent_t *e);
/* Takes `e` out of the table, the walk and its work list. */
void epd_reqtab_remove(epd_reqtab_t *t, epd_reqent_t *e);
epd_reqent_t *epd_reqtab_find(const epd_reqtab_t *t, uint64_t id, uint32_t sub);
uint32_t epd_reqtab_count(const epd_reqtab_t *t);

/* The walk: every entry, newest first (safe to remove the current one
 * after taking its next). */
epd_reqent_t *epd_reqtab_first(const epd_reqtab_t *t);
epd_reqent_t *epd_reqtab_next(const epd_reqent_t *e);

/* The same, returning the requests (NULL: none). */
void *epd_reqtab_find_req(const epd_reqtab_t *t, uint64_t id, uint32_t sub);
void *epd_reqtab_first_req(const epd_reqtab_t *t);
void *epd_reqtab_next_req(const epd_reqtab_t *t, const void *req);
void *epd_reqtab_pop_dirty_req(epd_reqtab_t *t);

/* Work lists.  dirty: appends `e` unless it is dirty already (a blocked one
 * moves); returns nonzero when it was not dirty before. */
int epd_reqtab_dirty(epd_reqtab_t *t, epd_reqent_t *e);
void epd_reqtab_block(epd_reqtab_t *t, epd_reqent_t *e);
int epd_reqtab_is_blocked(const epd_reqent_t *e);
/* Takes the first dirty entry off its list (NULL: none). */
epd_reqent_t *epd_reqtab_pop_dirty(epd_reqtab_t *t);
/* Every blocked entry becomes dirty, in order; nonzero when there was one. */
int epd_reqtab_unblock_all(epd_reqtab_t *t);
int epd_reqtab_has_blocked(const epd_reqtab_t *t);
int epd_reqtab_has_dirty(const epd_reqtab_t *t);
/* Takes `e` off whichever work list it is on. */
void epd_reqtab_unlist(epd_reqtab_t *t, epd_reqent_t *e);

#endif
