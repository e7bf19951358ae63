/*
 * epd_peer.h — the other workers a daemon talks to, by incarnation.
 *
 * A peer is one incarnation (worker id + epoch) of another worker this
 * daemon writes to or is written by: a decode worker for prefill, an
 * encoder or a decode worker for prefill, a prefill worker for decode and
 * the encoder.  It holds:
 *   - our OUT link to it (connected by epd_peer_get at first use): every
 *     write and every message about its requests goes there, so that a
 *     fenced message is ordered behind the writes;
 *   - its own IN links to us (adopted when a message of this incarnation
 *     arrives on one): they close with it, so that nothing of a dead
 *     incarnation can land afterwards;
 *   - the remote key of its region unpacked once on our link (unpacking
 *     per request maps the region afresh each time);
 *   - references: whatever waits on it (requests, quarantined memory)
 *     holds one; the record is freed once it is dead, closed and
 *     unreferenced.
 *
 * Lifecycle: CONNECTING -> UP (handshake answered) -> DEAD.  A peer dies
 * when one of its links fails, when a newer epoch of the same worker id
 * appears (here: epd_peer_get, or any message from it — rule 10), or by
 * epd_peer_kill.  Death runs ops->on_peer_dead at once (nested-safe: the
 * role only records it), then, from the pump, closes every link of the
 * incarnation and runs ops->on_peer_closed: from then on nothing it sent
 * can land.
 *
 * Threads: the daemon's loop thread only.
 */
#ifndef EPD_PEER_H
#define EPD_PEER_H

#include <stddef.h>
#include <stdint.h>

#include "epd_daemon.h"
#include "epd_link.h"
#include "epd_msg.h"
#include "epd_xport.h"

typedef enum {
    EPD_PEER_CONNECTING = 1,
    EPD_PEER_UP,
    EPD_PEER_DEAD,
} epd_peer_state_t;

/*
 * The live peer (worker_id, epoch) of `role` (EPD__ROLE__ROLE_*), made and
 * connected to addr[0..len) when it is new; a newer epoch than a live one
 * kills the older first.  Adds a reference for the caller (epd_peer_unref).
 * EPD_ERR_STALE_EPOCH when a newer epoch of that worker is live,
 * EPD_ERR_BAD_ADDRESS / EPD_ERR_NO_MEMORY when it cannot be made.
 */
epd_status_t epd_peer_get(epd_daemon_t *d, int role, const char *worker_id,
                          const epd_msg_epoch_t *epoch, const void *addr, size_t len,
                          epd_peer_t **peer_p);

/* The live incarnation of `worker_id` (any role), or NULL.  No reference. */
epd_peer_t *epd_peer_find(epd_daemon_t *d, const char *worker_id);

void epd_peer_ref(epd_peer_t *peer);
/* NULL is a no-op. */
void epd_peer_unref(epd_peer_t *peer);

/* Declares it dead (see the top).  Idempotent. */
void epd_peer_kill(epd_peer_t *peer, epd_status_t status, const char *why);

const char *epd_peer_id(const epd_peer_t *peer);
epd_msg_epoch_t epd_peer_epoch(const epd_peer_t *peer);
int epd_peer_role(const epd_peer_t *peer);
epd_peer_state_t epd_peer_state(const epd_peer_t *peer);
/* Why it died (EPD_OK while alive). */
epd_status_t epd_peer_dead_status(const epd_peer_t *peer);
/* Nonzero while it is not dead and our link is usable. */
int epd_peer_usable(const epd_peer_t *peer);
/* Our link to it (borrowed; NULL once closed). */
epd_link_t *epd_peer_link(const epd_peer_t *peer);
/* Is `env` from exactly this incarnation? */
int epd_peer_is_sender(const epd_peer_t *peer, const Epd__Envelope *env);
/* When a message of this incarnation last arrived (epd_time_now_ns; 0:
 * never). */
uint64_t epd_peer_heard_ns(const epd_peer_t *peer);

/*
 * The peer's region key blob[0..len), unpacked on our link: the first key
 * of the incarnation is kept and shared (*shared_p = 1: borrowed, do not
 * destroy; it dies with the link), another is unpacked for the caller
 * (*shared_p = 0: epd_xport_rkey_destroy it).  EPD_ERR_PEER_DEAD when the
 * link is gone, EPD_ERR_BAD_RKEY for a malformed blob.
 */
epd_status_t epd_peer_rkey(epd_peer_t *peer, const void *blob, size_t len,
                           epd_xport_rkey_t **rkey_p, int *shared_p);

/*
 * Adopts as this incarnation's own every IN link nobody adopted yet whose
 * endpoint comes from the same transport worker as our link to it (known
 * once that link's handshake completed), so that they close with it.  An
 * IN link is otherwise adopted when a message of the incarnation arrives
 * on it: a peer that wrote into our memory on its endpoint before it spoke
 * there would leave that endpoint open after on_peer_closed.  The daemon
 * calls it itself when it closes a dead incarnation (before
 * on_peer_closed); a role may call it earlier, e.g. from on_peer_dead.
 * Returns how many it adopted.  Nested-safe (it only links records).
 */
uint32_t epd_peer_adopt_strays(epd_peer_t *peer);

/* A pointer of the role's (untouched by the daemon). */
void epd_peer_set_user(epd_peer_t *peer, void *user);
void *epd_peer_user(const epd_peer_t *peer);

#endif
