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

/*
 * The fence (proto/README.md rules 25-29), reader side: memory this
 * incarnation may write is reachable only under its own grant, revoked
 * when it dies (before on_peer_dead runs).
 *
 * The grant of this incarnation on `mr` (the daemon's one receive region;
 * the grant's user pointer is the peer, for the region's write check),
 * opened at the first call; *key_p, *len_p: its packed key, borrowed while
 * the record lives, to hand to this incarnation only.  EPD_ERR_PEER_DEAD
 * once it is dead.
 */
epd_status_t epd_peer_grant(epd_peer_t *peer, epd_xport_mr_t *mr, const void **key_p,
                            size_t *len_p);

/* Nonzero when nothing this incarnation was ever granted can land any
 * more: it is dead, its links are closed, and its grant (if it had one)
 * is settled (epd_xport_grant_settled).  Memory of its requests that its
 * own word (WritesQuiesced, PrefillComplete) did not free waits for this. */
int epd_peer_fenced(epd_peer_t *peer);

/* Where its fence stands, for logs ("no grant", "open", "revoked", "held:
 * ...", "the writer's process ended"). */
const char *epd_peer_fence_state(const epd_peer_t *peer);

/*
 * Writer side: every write this daemon posted for request `id` to this
 * (dead) incarnation has completed — send it WritesQuiesced{id} once none
 * of our writes to it is in limbo (epd_xport_limbo), on a new link to the
 * same incarnation (the old one is gone), so that memory it holds in
 * quarantine for us can be freed before our process ends.  Bounded: at
 * most EPD_PEER_OWED_MAX owed at once (the oldest is dropped, logged);
 * given up after EPD_PEER_OWED_MS, when a newer incarnation is known
 * (the reader then relies on our process ending), or when the reader's
 * process is gone or unknown (nothing to tell; see epd_peer_ask_quiesced).  Idempotent per (peer,
 * id).
 */
/*
 * Reader side: asks a retired incarnation (dead, its fence not settled:
 * it may still write, and its own word is what frees the memory) to
 * confirm that nothing of request `id` can land any more: an Abort{id,
 * why} on a new link to that same incarnation.  It answers WritesQuiesced
 * once none of its writes for `id` is in flight or in limbo — the request
 * still live there (it fails it first), or long ended
 * (epd_peer_may_quiesce).  The caller paces it (a stopped writer answers
 * nothing until it runs again: ask again later).  EPD_ERR_PEER_DEAD when
 * its process is gone or unknown (no link is tried: UCX 1.13.1 aborts the
 * process that wires shared memory up to a worker whose process ended);
 * EPD_ERR_STALE_EPOCH when a newer incarnation of that worker is known
 * (the old one's process ending is then the only proof).
 */
epd_status_t epd_peer_ask_quiesced(epd_peer_t *peer, uint64_t id, const char *why);

/*
 * Writer side: may an Abort of an id this daemon no longer has (nothing of
 * it live, nothing in flight) be answered with WritesQuiesced on `from`?
 * Nonzero when the sender is a worker of `reader_role` (by our live record
 * of it, or the role its handshake presented — proven with a cluster
 * secret) and none of our writes to its process is in limbo
 * (epd_xport_limbo).
 */
int epd_peer_may_quiesce(epd_daemon_t *d, epd_link_t *from, const Epd__Envelope *env,
                         int reader_role);

#define EPD_PEER_OWED_MAX 4096
#define EPD_PEER_OWED_MS 60000
void epd_peer_owe_quiesced(epd_peer_t *peer, uint64_t id);

/* A pointer of the role's (untouched by the daemon). */
void epd_peer_set_user(epd_peer_t *peer, void *user);
void *epd_peer_user(const epd_peer_t *peer);

#endif
