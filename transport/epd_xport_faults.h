/*
 * epd_xport_faults.h — faults injected below the daemons, by an
 * interposer between the transport core and its backend (transport/ only;
 * users never see it).
 *
 *   EPD_XPORT_FAULTS="drop=P,delay=MS[:P],dup=P,reorder=P,corrupt=P,wcorrupt=P,stall=MS:P,seed=N"
 *
 * P is a probability (0..1) per event, MS milliseconds.  The events:
 *   - every request-plane message (a MSG frame) a worker receives: dropped,
 *     delayed (it and every frame behind it), delivered twice, held back so
 *     that later frames pass it (reorder), delivered with one payload byte
 *     flipped (corrupt: the MAC refuses it, so a cluster secret is
 *     required), or the whole thread stalled for MS before it is delivered;
 *   - every write completion: lost (drop: the write completes with
 *     EPD_ERR_TRANSPORT, the endpoint fails) or delayed;
 *   - every write's bytes: one byte flipped on the way (corrupt: the bytes
 *     are copied first, the writer's memory is never touched; the
 *     receiver's checksums refuse them); wcorrupt=P flips write bytes
 *     alone, at its own probability, and leaves messages whole (no secret
 *     needed: the KV checksums, not the MACs, are what it tests).
 * The draws are seeded (seed=N, default 1, mixed with the worker id), so a
 * run repeats per seed given the same order of events.  The interposer is
 * in the stack only when the variable was set at create: without it the
 * core calls the backend directly, as if there were no faults at all.
 * Counts of what was injected are logged (first of each kind, then at each
 * power of two, and at destroy).  Owning thread only.
 */
#ifndef EPD_XPORT_FAULTS_H
#define EPD_XPORT_FAULTS_H

#include "epd_xport_int.h"

/* The interposer itself, epd__xport_faults_interposer, is declared with
 * the backends in epd_xport_int.h ("Interposers"); this header only says
 * what it does. */

#endif
