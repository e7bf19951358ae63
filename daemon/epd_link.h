/*
 * epd_link.h — one transport endpoint of a daemon, with a bounded outbox.
 *
 * A link is what the daemon's request plane talks through: an endpoint the
 * daemon accepted (IN: a client's, or a peer's own endpoint to us) or
 * connected (OUT: ours to a peer, see epd_peer.h).  Its lifecycle, as
 * libuv's handles: UP -> DOWN (the endpoint failed, or its peer incarnation
 * died: ops->on_link_down runs once, from the pump) or CLOSED (the owner
 * called epd_link_close) -> freed once nobody holds a reference.  A link
 * whose endpoint is gone stays valid memory while referenced: holders see
 * epd_link_usable() == 0 and stop using it, they never dangle.
 *
 * Sending: a message is encoded with the daemon's identity (worker id,
 * epoch, sequence number) and either goes out now, or waits — copied, in
 * order — in the link's outbox when the transport pushes back
 * (EPD_ERR_NO_RESOURCE), retried after the loop makes progress.  The
 * outboxes of all links are bounded together (count and bytes): a send
 * that would exceed the bound fails the link loudly (an error line; the
 * link goes DOWN, its requests end with a clear error) — a message is
 * never dropped without its link going down.  A message sent with
 * EPD_XPORT_SEND_FENCE is delivered after every write posted earlier on
 * the endpoint landed; queued messages keep their order, so a fence never
 * overtakes an earlier message.
 *
 * Threads: the daemon's loop thread only.
 */
#ifndef EPD_LINK_H
#define EPD_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "epd_daemon.h"
#include "epd_msg.h"
#include "epd_xport.h"

typedef enum {
    EPD_LINK_IN = 1, /* accepted: a peer connected to us */
    EPD_LINK_OUT,    /* connected by us (epd_link_connect, epd_peer_get) */
} epd_link_kind_t;

/* Outbox bounds, over every link of a daemon. */
#define EPD_LINK_OUTBOX_MAX 4096u
#define EPD_LINK_OUTBOX_BYTES ((size_t)256 << 20)

/*
 * Connects to the data-plane address addr[0..len) (copied).  The link is
 * usable at once (sends queue behind the handshake).  *link_p holds one
 * reference for the caller (epd_link_unref; epd_link_close to close it
 * first).  EPD_ERR_BAD_ADDRESS for a malformed address (nothing made).
 */
epd_status_t epd_link_connect(epd_daemon_t *d, const void *addr, size_t len,
                              epd_link_t **link_p);

void epd_link_ref(epd_link_t *link);
/* Drops a reference; the last one of a closed or down link frees it.
 * NULL is a no-op. */
void epd_link_unref(epd_link_t *link);

/* Closes the endpoint (its queued messages are dropped, its writes complete
 * with EPD_ERR_CANCELED), without an on_link_down.  Allowed anywhere,
 * nested in a transport callback too (the transport parks the endpoint).
 * Idempotent; the caller's reference stays its own. */
void epd_link_close(epd_link_t *link);

/* Nonzero once its handshake completed (IN links: always). */
int epd_link_connected(const epd_link_t *link);
/* Nonzero while sends and writes may be posted on it. */
int epd_link_usable(const epd_link_t *link);
/* EPD_OK while usable; otherwise why it went down (EPD_ERR_CANCELED when
 * closed by its owner). */
epd_status_t epd_link_status(const epd_link_t *link);
epd_link_kind_t epd_link_kind(const epd_link_t *link);
/* The endpoint, for writes, flushes and remote keys (NULL once down or
 * closed: keys unpacked on it are destroyed with it). */
epd_xport_ep_t *epd_link_ep(const epd_link_t *link);
/* The peer's transport worker id (0 before its handshake completed). */
uint64_t epd_link_peer_xid(const epd_link_t *link);
/* The peer incarnation this link belongs to (NULL: none known). */
epd_peer_t *epd_link_peer(const epd_link_t *link);
epd_daemon_t *epd_link_daemon(const epd_link_t *link);
/* A one-line description of the lanes its endpoint uses. */
void epd_link_describe(const epd_link_t *link, char *buf, size_t cap);
/* Messages waiting in its outbox. */
uint32_t epd_link_queued(const epd_link_t *link);

/*
 * Sends one message of kind `body_case` (body borrowed for the call) on
 * `link`, as described at the top.  EPD_OK: sent or queued.  Otherwise
 * nothing will be delivered: EPD_ERR_PEER_DEAD (or the link's own status)
 * when the link is down or closed, EPD_ERR_NO_RESOURCE when the outbox
 * bound was hit (the link went down with it), EPD_ERR_TOO_LONG or
 * EPD_ERR_INVALID_PARAM when the message cannot be encoded (logged).
 * NULL link: EPD_ERR_INVALID_PARAM.
 */
epd_status_t epd_link_send(epd_link_t *link, Epd__Envelope__BodyCase body_case, void *body,
                           unsigned flags);

/* The usual messages, built and sent as epd_link_send does. */
/* Error{id, status, msg (cut to 200 bytes), culprit (NULL: none)} */
epd_status_t epd_link_send_error(epd_link_t *link, uint64_t id, epd_status_t status,
                                 const char *msg, const char *culprit);
/* KvRefused{id, status, reason} */
epd_status_t epd_link_send_refused(epd_link_t *link, uint64_t id, epd_status_t status,
                                   const char *reason);
/* Abort{id, status, reason} */
epd_status_t epd_link_send_abort(epd_link_t *link, uint64_t id, epd_status_t status,
                                 const char *reason);
/* Refuses a message that came on `link`: one rate-limited line (the
 * daemon's refusal log: "MSG (STATUS)") and an Error{id, status, msg} back. */
void epd_link_refuse(epd_link_t *link, uint64_t id, epd_status_t status, const char *msg);
/* WritesQuiesced{id}, fenced behind every write posted on the link. */
epd_status_t epd_link_send_quiesced(epd_link_t *link, uint64_t id);

/* A pointer of the owner's (untouched by the daemon). */
void epd_link_set_user(epd_link_t *link, void *user);
void *epd_link_user(const epd_link_t *link);

#endif
