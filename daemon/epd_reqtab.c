/*
 * epd_reqtab.c — live requests by id, their walk and work lists (see
 * epd_reqtab.h).
 */
#include "epd_reqtab.h"

#include "epd_alloc.h"

enum { EPD_REQTAB_NONE = 0, EPD_REQTAB_DIRTY, EPD_REQTAB_BLOCKED };

epd_status_t epd_reqtab_init(epd_reqtab_t *t, uint32_t expected, size_t ent_offset)
{
    uint32_t size = 16;

    while (size < 2 * expected && size < (1u << 24)) {
        size *= 2;
    }
    t->table_ = epd_calloc(size, sizeof(*t->table_));
    if (t->table_ == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    t->size_ = size;
    t->n_ = 0;
    t->all_ = NULL;
    t->dirty_head_ = t->dirty_tail_ = NULL;
    t->blocked_head_ = t->blocked_tail_ = NULL;
    t->offset_ = ent_offset;
    return EPD_OK;
}

void epd_reqtab_cleanup(epd_reqtab_t *t)
{
    epd_free(t->table_);
    t->table_ = NULL;
    t->size_ = 0;
    t->n_ = 0;
    t->all_ = NULL;
    t->dirty_head_ = t->dirty_tail_ = NULL;
    t->blocked_head_ = t->blocked_tail_ = NULL;
}

static uint32_t epd_reqtab_bucket(const epd_reqtab_t *t, uint64_t id, uint32_t sub)
{
    uint64_t h = (id ^ ((uint64_t)sub << 56) ^ ((uint64_t)sub >> 8)) * 0x9E3779B97F4A7C15ull;

    return (uint32_t)(h >> 32) & (t->size_ - 1);
}

void epd_reqtab_insert(epd_reqtab_t *t, epd_reqent_t *e)
{
    uint32_t b = epd_reqtab_bucket(t, e->id, e->sub);

    e->hnext_ = t->table_[b];
    t->table_[b] = e;
    e->all_prev_ = NULL;
    e->all_next_ = t->all_;
    if (t->all_ != NULL) {
        t->all_->all_prev_ = e;
    }
    t->all_ = e;
    e->lprev_ = e->lnext_ = NULL;
    e->list_ = EPD_REQTAB_NONE;
    t->n_++;
}

void epd_reqtab_remove(epd_reqtab_t *t, epd_reqent_t *e)
{
    epd_reqent_t **pp = &t->table_[epd_reqtab_bucket(t, e->id, e->sub)];

    while (*pp != NULL && *pp != e) {
        pp = &(*pp)->hnext_;
    }
    if (*pp != e) {
        return; /* not in the table */
    }
    *pp = e->hnext_;
    if (e->all_prev_ != NULL) {
        e->all_prev_->all_next_ = e->all_next_;
    } else {
        t->all_ = e->all_next_;
    }
    if (e->all_next_ != NULL) {
        e->all_next_->all_prev_ = e->all_prev_;
    }
    e->all_prev_ = e->all_next_ = NULL;
    epd_reqtab_unlist(t, e);
    t->n_--;
}

epd_reqent_t *epd_reqtab_find(const epd_reqtab_t *t, uint64_t id, uint32_t sub)
{
    for (epd_reqent_t *e = t->table_[epd_reqtab_bucket(t, id, sub)]; e != NULL; e = e->hnext_) {
        if (e->id == id && e->sub == sub) {
            return e;
        }
    }
    return NULL;
}

uint32_t epd_reqtab_count(const epd_reqtab_t *t)
{
    return t->n_;
}

epd_reqent_t *epd_reqtab_first(const epd_reqtab_t *t)
{
    return t->all_;
}

epd_reqent_t *epd_reqtab_next(const epd_reqent_t *e)
{
    return e->all_next_;
}

void epd_reqtab_unlist(epd_reqtab_t *t, epd_reqent_t *e)
{
    epd_reqent_t **head, **tail;

    if (e->list_ == EPD_REQTAB_NONE) {
        return;
    }
    head = e->list_ == EPD_REQTAB_DIRTY ? &t->dirty_head_ : &t->blocked_head_;
    tail = e->list_ == EPD_REQTAB_DIRTY ? &t->dirty_tail_ : &t->blocked_tail_;
    if (e->lprev_ != NULL) {
        e->lprev_->lnext_ = e->lnext_;
    } else {
        *head = e->lnext_;
    }
    if (e->lnext_ != NULL) {
        e->lnext_->lprev_ = e->lprev_;
    } else {
        *tail = e->lprev_;
    }
    e->lprev_ = e->lnext_ = NULL;
    e->list_ = EPD_REQTAB_NONE;
}

static void epd_reqtab_append(epd_reqtab_t *t, epd_reqent_t *e, int which)
{
    epd_reqent_t **head = which == EPD_REQTAB_DIRTY ? &t->dirty_head_ : &t->blocked_head_;
    epd_reqent_t **tail = which == EPD_REQTAB_DIRTY ? &t->dirty_tail_ : &t->blocked_tail_;

    e->lprev_ = *tail;
    e->lnext_ = NULL;
    if (*tail != NULL) {
        (*tail)->lnext_ = e;
    } else {
        *head = e;
    }
    *tail = e;
    e->list_ = which;
}

int epd_reqtab_dirty(epd_reqtab_t *t, epd_reqent_t *e)
{
    if (e->list_ == EPD_REQTAB_DIRTY) {
        return 0;
    }
    epd_reqtab_unlist(t, e);
    epd_reqtab_append(t, e, EPD_REQTAB_DIRTY);
    return 1;
}

void epd_reqtab_block(epd_reqtab_t *t, epd_reqent_t *e)
{
    epd_reqtab_unlist(t, e);
    epd_reqtab_append(t, e, EPD_REQTAB_BLOCKED);
}

int epd_reqtab_is_blocked(const epd_reqent_t *e)
{
    return e->list_ == EPD_REQTAB_BLOCKED;
}

epd_reqent_t *epd_reqtab_pop_dirty(epd_reqtab_t *t)
{
    epd_reqent_t *e = t->dirty_head_;

    if (e != NULL) {
        epd_reqtab_unlist(t, e);
    }
    return e;
}

int epd_reqtab_unblock_all(epd_reqtab_t *t)
{
    int any = t->blocked_head_ != NULL;

    while (t->blocked_head_ != NULL) {
        epd_reqtab_dirty(t, t->blocked_head_);
    }
    return any;
}

int epd_reqtab_has_blocked(const epd_reqtab_t *t)
{
    return t->blocked_head_ != NULL;
}

int epd_reqtab_has_dirty(const epd_reqtab_t *t)
{
    return t->dirty_head_ != NULL;
}

/* The request holding entry e (NULL for NULL). */
static void *epd_reqtab_owner(const epd_reqtab_t *t, const epd_reqent_t *e)
{
    return e != NULL ? (void *)((char *)(uintptr_t)e - t->offset_) : NULL;
}

void *epd_reqtab_find_req(const epd_reqtab_t *t, uint64_t id, uint32_t sub)
{
    return epd_reqtab_owner(t, epd_reqtab_find(t, id, sub));
}

void *epd_reqtab_first_req(const epd_reqtab_t *t)
{
    return epd_reqtab_owner(t, t->all_);
}

void *epd_reqtab_next_req(const epd_reqtab_t *t, const void *req)
{
    const epd_reqent_t *e = (const epd_reqent_t *)(const void *)((const char *)req + t->offset_);

    return epd_reqtab_owner(t, e->all_next_);
}

void *epd_reqtab_pop_dirty_req(epd_reqtab_t *t)
{
    return epd_reqtab_owner(t, epd_reqtab_pop_dirty(t));
}
