/*
 * epd_stash.c — early messages kept for their request (see epd_stash.h).
 * A small array scanned linearly: a few hundred entries at most, touched
 * per message, never per token.
 */
#include "epd_stash.h"

#include "epd_alloc.h"

typedef struct {
    Epd__Envelope *env; /* owned */
    epd_link_t *from;   /* counted reference, may be NULL */
    uint64_t id;
    uint32_t sub;
    uint64_t expires_ns;
} epd_stash_entry_t;

struct epd_stash {
    epd_stash_entry_t *e; /* [cap], the first n used */
    uint32_t cap;
    uint32_t n;
};

epd_status_t epd_stash_create(uint32_t cap, epd_stash_t **stash_p)
{
    epd_stash_t *s;

    if (cap == 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    s = epd_calloc(1, sizeof(*s));
    if (s == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    s->e = epd_calloc(cap, sizeof(*s->e));
    if (s->e == NULL) {
        epd_free(s);
        return EPD_ERR_NO_MEMORY;
    }
    s->cap = cap;
    *stash_p = s;
    return EPD_OK;
}

void epd_stash_destroy(epd_stash_t *stash)
{
    if (stash == NULL) {
        return;
    }
    for (uint32_t i = 0; i < stash->n; i++) {
        epd_msg_free(stash->e[i].env);
        epd_link_unref(stash->e[i].from);
    }
    epd_free(stash->e);
    epd_free(stash);
}

static int epd_stash_index(const epd_stash_t *s, uint64_t id, uint32_t sub)
{
    for (uint32_t i = 0; i < s->n; i++) {
        if (s->e[i].id == id && s->e[i].sub == sub) {
            return (int)i;
        }
    }
    return -1;
}

epd_status_t epd_stash_put(epd_stash_t *stash, Epd__Envelope *env, epd_link_t *from, uint64_t id,
                           uint32_t sub, uint64_t expires_ns)
{
    epd_stash_entry_t *e;

    if (stash->n == stash->cap || epd_stash_index(stash, id, sub) >= 0) {
        return EPD_ERR_NO_RESOURCE;
    }
    e = &stash->e[stash->n++];
    e->env = env;
    e->from = from;
    if (from != NULL) {
        epd_link_ref(from);
    }
    e->id = id;
    e->sub = sub;
    e->expires_ns = expires_ns;
    return EPD_OK;
}

int epd_stash_has(const epd_stash_t *stash, uint64_t id, uint32_t sub)
{
    return epd_stash_index(stash, id, sub) >= 0;
}

/* Removes entry i (the last one moves into its place). */
static Epd__Envelope *epd_stash_remove(epd_stash_t *s, uint32_t i, epd_link_t **from_p)
{
    Epd__Envelope *env = s->e[i].env;

    *from_p = s->e[i].from;
    s->e[i] = s->e[--s->n];
    return env;
}

Epd__Envelope *epd_stash_take(epd_stash_t *stash, uint64_t id, uint32_t sub, epd_link_t **from_p)
{
    int i = epd_stash_index(stash, id, sub);

    if (i < 0) {
        return NULL;
    }
    return epd_stash_remove(stash, (uint32_t)i, from_p);
}

Epd__Envelope *epd_stash_take_any(epd_stash_t *stash, uint64_t id, epd_link_t **from_p)
{
    for (uint32_t i = 0; i < stash->n; i++) {
        if (stash->e[i].id == id) {
            return epd_stash_remove(stash, i, from_p);
        }
    }
    return NULL;
}

Epd__Envelope *epd_stash_take_expired(epd_stash_t *stash, uint64_t now_ns, epd_link_t **from_p)
{
    for (uint32_t i = 0; i < stash->n; i++) {
        if (stash->e[i].expires_ns <= now_ns) {
            return epd_stash_remove(stash, i, from_p);
        }
    }
    return NULL;
}

uint32_t epd_stash_count(const epd_stash_t *stash)
{
    return stash->n;
}
