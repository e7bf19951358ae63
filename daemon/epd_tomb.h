/*
 * epd_tomb.h — request ids that ended here, remembered for a while.
 *
 * Once a worker answered WritesQuiesced for a request (or refused it), a
 * late message of the same id — a GenerateRequest, a reservation — must not
 * start writing again: that is the recycle race the protocol exists to
 * prevent.  A tombstone remembers the id (and why it ended) for `ttl_ns`;
 * the oldest is overwritten when all `cap` are in use (a ring).
 *
 * Entries are keyed by (request id, sub) like the stash's, with
 * EPD_TOMB_ALL as the sub of one that covers every sub of the id.
 * Lookups scan the ring (cap is a few thousand; it runs per message, not
 * per token).  Threads: the owner's (a daemon's loop thread).
 */
#ifndef EPD_TOMB_H
#define EPD_TOMB_H

#include <stdint.h>

#include "epd_status.h"

#define EPD_TOMB_ALL UINT32_MAX

typedef struct epd_tombs epd_tombs_t;

/* A ring of `cap` tombstones living ttl_ns each; owned by the caller. */
epd_status_t epd_tombs_create(uint32_t cap, uint64_t ttl_ns, epd_tombs_t **tombs_p);
void epd_tombs_destroy(epd_tombs_t *tombs);

/* Remembers (id, sub) ended for `kind` (a nonzero value of the owner's). */
void epd_tombs_add(epd_tombs_t *tombs, uint64_t id, uint32_t sub, int kind);

/* The kind of the newest live tombstone of (id, sub) or of (id,
 * EPD_TOMB_ALL); 0 when none. */
int epd_tombs_find(const epd_tombs_t *tombs, uint64_t id, uint32_t sub);

/* Forgets the tombstones of (id, sub) (not those of EPD_TOMB_ALL). */
void epd_tombs_clear(epd_tombs_t *tombs, uint64_t id, uint32_t sub);

#endif
