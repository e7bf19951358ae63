/*
 * epd_xport_util.c — the core's bookkeeping: re-entrancy depth and the zombie
 * list, endpoint slots (cookies), the op pool and the pool of held message
 * copies.
 */
#include "epd_xport_core.h"

#include <string.h>

#include <sodium.h>

#include "epd_alloc.h"
#include "epd_bufpool.h"
#include "epd_log.h"

bool epd__xport_log_allowed(epd_xport_t *x)
{
    return epd_log_limit_ok(&x->log_limit, EPD__XPORT_LOG_BURST);
}

/* An interposer's upcall hook (epd_xport_int.h "Interposers"). */
void epd__xport_set_hook(epd_xport_t *x, const epd__xport_hook_t *hook, void *ip)
{
    x->hook = hook;
    x->hook_ip = ip;
}

void epd__xport_enter(epd_xport_t *x)
{
    x->depth++;
}

static void epd__ep_free(epd_xport_ep_t *ep);

void epd__xport_leave(epd_xport_t *x)
{
    if (--x->depth == 0) {
        while (x->zombies != NULL) {
            epd_xport_ep_t *ep = x->zombies;
            x->zombies = ep->next;
            epd__ep_free(ep);
        }
    }
}

epd_xport_ep_t *epd__xport_ep_lookup(epd_xport_t *x, uint64_t cookie)
{
    uint32_t idx = (uint32_t)(cookie & 0xffffffffu);
    uint32_t gen = (uint32_t)(cookie >> 32);

    if (idx == 0 || idx > x->n_slots) {
        return NULL;
    }
    if (x->slot_gen[idx - 1] != gen || x->slots[idx - 1] == NULL) {
        return NULL;
    }
    return x->slots[idx - 1];
}

epd_status_t epd__xport_slot_alloc(epd_xport_t *x, epd_xport_ep_t *ep)
{
    uint32_t i;

    for (i = 0; i < x->n_slots; i++) {
        if (x->slots[i] == NULL) {
            break;
        }
    }
    if (i == x->n_slots) {
        uint32_t n = x->n_slots == 0 ? 16 : x->n_slots * 2;
        epd_xport_ep_t **slots = epd_realloc(x->slots, n * sizeof(*slots));
        uint32_t *gens;

        if (slots == NULL) {
            return EPD_ERR_NO_MEMORY;
        }
        x->slots = slots;
        gens = epd_realloc(x->slot_gen, n * sizeof(*gens));
        if (gens == NULL) {
            return EPD_ERR_NO_MEMORY;
        }
        x->slot_gen = gens;
        for (uint32_t j = x->n_slots; j < n; j++) {
            x->slots[j] = NULL;
            x->slot_gen[j] = 0;
        }
        x->n_slots = n;
    }
    if (++x->gen == 0) {
        x->gen = 1;
    }
    x->slots[i] = ep;
    x->slot_gen[i] = x->gen;
    ep->cookie = ((uint64_t)x->gen << 32) | (uint64_t)(i + 1);
    return EPD_OK;
}

void epd__xport_slot_release(epd_xport_t *x, epd_xport_ep_t *ep)
{
    uint32_t idx = (uint32_t)(ep->cookie & 0xffffffffu);

    if (idx != 0 && idx <= x->n_slots && x->slots[idx - 1] == ep) {
        x->slots[idx - 1] = NULL;
        x->slot_gen[idx - 1] = 0;
    }
    ep->cookie = 0;
}

epd__core_op_t *epd__xport_op_get(epd_xport_t *x, bool user)
{
    epd__core_op_t *op;

    if (user && x->user_ops >= x->cfg.max_inflight) {
        return NULL;
    }
    op = x->op_free;
    if (op == NULL) {
        return NULL;
    }
    x->op_free = op->next;
    memset(&op->be, 0, sizeof(op->be));
    op->prev = op->next = NULL;
    if (user) {
        x->user_ops++;
    }
    return op;
}

void epd__xport_op_put(epd_xport_t *x, epd__core_op_t *op)
{
    if (op->kind == EPD__OP_WRITE || op->kind == EPD__OP_FLUSH) {
        x->user_ops--;
    }
    op->kind = EPD__OP_FREE;
    op->ep = NULL;
    op->cb = NULL;
    op->prev = NULL;
    op->next = x->op_free;
    x->op_free = op;
}

/* A copy for a message of `len` bytes (epd_bufpool: small ones pooled,
 * so the send path does not allocate for the request plane's usual
 * messages; a large one, an image, sized to itself). */
epd__held_t *epd__xport_held_get(epd_xport_t *x, size_t len)
{
    epd__held_t *h = epd_bufpool_get(&x->held, len);

    if (h != NULL) {
        h->buf = epd_bufpool_data(&x->held, h);
    }
    return h;
}

void epd__xport_held_put(epd_xport_t *x, epd__held_t *h)
{
    epd_bufpool_put(&x->held, h);
}

/* The worker id a peer claims, for logs ("?" before it said). */
const char *epd__xport_ep_who(const epd_xport_ep_t *ep)
{
    return ep->peer_presented && ep->peer_ident.worker_id[0] != '\0' ? ep->peer_ident.worker_id
                                                                     : "?";
}

static void epd__ep_free(epd_xport_ep_t *ep)
{
    /* nonces, transcript and direction keys go with it */
    sodium_memzero(ep, sizeof(*ep));
    epd_free(ep);
}
