/*
 * epd_xport_loop.h — an in-process loopback backend of epd_xport, for
 * deterministic tests of the transport core (handshake, MACs, framing) and
 * for its fuzz target: no library, no sockets, no timing.
 *
 * Workers made with it (epd__xport_create_ops(&epd_xport_loop_ops, ...))
 * reach each other by address blob inside one process.  A frame sent is
 * copied into the receiver's inbox and delivered by the receiver's next
 * epd_xport_progress; a write is copied into the target region at once if
 * the region exists, takes remote writes and the range fits (otherwise
 * nothing lands — like a UCX active-message write refused on arrival — and
 * the write still completes EPD_OK), and completes on the writer's next
 * progress; a flush completes on the next progress (and is counted).
 * Tests may hold writes back and make them say their completion means
 * delivery (epd_xport_loop_set_writes).  Every loop worker of a process
 * belongs to one thread.
 */
#ifndef EPD_XPORT_LOOP_H
#define EPD_XPORT_LOOP_H

#include <stddef.h>

#include "epd_xport_int.h"

extern const epd__xport_backend_ops_t epd_xport_loop_ops;

/* Restarts the numbering of loop workers (their addresses) from 1, so that a
 * run that creates the same workers in the same order sends the same bytes
 * (with a deterministic randombytes implementation).  Only when no loop
 * worker is alive. */
void epd_xport_loop_reset(void);

/* Calls `tap(arg, frame, len)` for every frame any loop worker sends (NULL:
 * off): a test or seed generator records real frames with it. */
void epd_xport_loop_set_send_tap(epd__xport_tap_cb_t tap, void *arg);

/* How writes behave from now on: `delivers` — each write tells the core
 * its completion means delivery (op->delivers); `hold` — a write lands and
 * completes only when epd_xport_loop_release_writes is called (a write still
 * on the wire).  Both 0 by default. */
void epd_xport_loop_set_writes(int delivers, int hold);

/* Lands and completes every write held on `x`'s endpoints (they complete on
 * its next progress); returns how many. */
size_t epd_xport_loop_release_writes(epd_xport_t *x);

/* Flushes the core asked any loop worker for, since the process started. */
unsigned long epd_xport_loop_flushes(void);

/* Frames sent to `x`'s loop worker and not delivered yet. */
size_t epd_xport_loop_pending(epd_xport_t *x);

#endif
