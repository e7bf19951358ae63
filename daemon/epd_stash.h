/*
 * epd_stash.h — messages that arrived before the request they are about.
 *
 * Two senders talk to a worker about one request on different endpoints
 * (the client's GenerateRequest, decode's KvReservation; the client's
 * EncodeRequest, prefill's EmbedReservation), so the second may overtake
 * the first.  The early one is kept here — bounded, with the link it came
 * on, until a deadline — and taken when its request arrives; one never
 * claimed is handed back at expiry so the role can answer it.
 *
 * Entries are keyed by (request id, sub): `sub` tells apart several
 * messages of one id (the encoder's per-image reservations); 0 otherwise.
 * Threads: the owner's (a daemon's loop thread).
 */
#ifndef EPD_STASH_H
#define EPD_STASH_H

#include <stdint.h>

#include "epd_link.h"
#include "epd_msg.h"

typedef struct epd_stash epd_stash_t;

/* A stash of at most `cap` entries, owned by the caller (epd_stash_destroy). */
epd_status_t epd_stash_create(uint32_t cap, epd_stash_t **stash_p);

/* Frees every entry (envelopes freed, links unreferenced).  NULL is a no-op. */
void epd_stash_destroy(epd_stash_t *stash);

/* Keeps `env` (taken) that came on `from` (a reference is added; NULL
 * allowed) until expires_ns.  EPD_ERR_NO_RESOURCE when full or when
 * (id, sub) is already kept (nothing taken). */
epd_status_t epd_stash_put(epd_stash_t *stash, Epd__Envelope *env, epd_link_t *from, uint64_t id,
                           uint32_t sub, uint64_t expires_ns);

/* Nonzero when (id, sub) is kept. */
int epd_stash_has(const epd_stash_t *stash, uint64_t id, uint32_t sub);

/* Takes (id, sub) out: returns the envelope (the caller frees it) and sets
 * *from_p to its link (the caller takes the reference; may be NULL).
 * NULL when not kept. */
Epd__Envelope *epd_stash_take(epd_stash_t *stash, uint64_t id, uint32_t sub,
                              epd_link_t **from_p);

/* Takes out any entry of `id` (whatever its sub), as epd_stash_take. */
Epd__Envelope *epd_stash_take_any(epd_stash_t *stash, uint64_t id, epd_link_t **from_p);

/* Takes out the first entry whose deadline is at or before now_ns, as
 * epd_stash_take (call until NULL). */
Epd__Envelope *epd_stash_take_expired(epd_stash_t *stash, uint64_t now_ns, epd_link_t **from_p);

uint32_t epd_stash_count(const epd_stash_t *stash);

#endif
