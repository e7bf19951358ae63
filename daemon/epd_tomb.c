/*
 * epd_tomb.c — tombstones of ended request ids (see epd_tomb.h).
 */
#include "epd_tomb.h"

#include "epd_alloc.h"
#include "epd_time.h"

typedef struct {
    uint64_t id;
    uint32_t sub;
    int kind; /* 0: empty */
    uint64_t expires_ns;
} epd_tomb_t;

struct epd_tombs {
    epd_tomb_t *ring; /* [cap] */
    uint32_t cap;
    uint32_t next;
    uint64_t ttl_ns;
};

epd_status_t epd_tombs_create(uint32_t cap, uint64_t ttl_ns, epd_tombs_t **tombs_p)
{
    epd_tombs_t *t;

    if (cap == 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    t = epd_calloc(1, sizeof(*t));
    if (t == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    t->ring = epd_calloc(cap, sizeof(*t->ring));
    if (t->ring == NULL) {
        epd_free(t);
        return EPD_ERR_NO_MEMORY;
    }
    t->cap = cap;
    t->ttl_ns = ttl_ns;
    *tombs_p = t;
    return EPD_OK;
}

void epd_tombs_destroy(epd_tombs_t *tombs)
{
    if (tombs == NULL) {
        return;
    }
    epd_free(tombs->ring);
    epd_free(tombs);
}

void epd_tombs_add(epd_tombs_t *tombs, uint64_t id, uint32_t sub, int kind)
{
    epd_tomb_t *t = &tombs->ring[tombs->next];

    t->id = id;
    t->sub = sub;
    t->kind = kind;
    t->expires_ns = epd_time_now_ns() + tombs->ttl_ns;
    tombs->next = (tombs->next + 1) % tombs->cap;
}

int epd_tombs_find(const epd_tombs_t *tombs, uint64_t id, uint32_t sub)
{
    uint64_t now = epd_time_now_ns();
    uint64_t best_exp = 0;
    int kind = 0;

    for (uint32_t i = 0; i < tombs->cap; i++) {
        const epd_tomb_t *t = &tombs->ring[i];

        if (t->kind != 0 && t->id == id && (t->sub == sub || t->sub == EPD_TOMB_ALL) &&
            t->expires_ns > now && t->expires_ns >= best_exp) {
            /* the newest one says how the id ended last */
            best_exp = t->expires_ns;
            kind = t->kind;
        }
    }
    return kind;
}

void epd_tombs_clear(epd_tombs_t *tombs, uint64_t id, uint32_t sub)
{
    for (uint32_t i = 0; i < tombs->cap; i++) {
        epd_tomb_t *t = &tombs->ring[i];

        if (t->kind != 0 && t->id == id && t->sub == sub) {
            t->kind = 0;
        }
    }
}
