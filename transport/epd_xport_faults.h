/*
 * epd_xport_faults.h — faults injected below the daemons, inside the
 * transport core (transport/ only; users never see it).
 *
 *   EPD_XPORT_FAULTS="drop=P,delay=MS[:P],dup=P,reorder=P,corrupt=P,stall=MS:P,seed=N"
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
 *     receiver's checksums refuse them).
 * The draws are seeded (seed=N, default 1, mixed with the worker id), so a
 * run repeats per seed given the same order of events.  The core calls
 * these only when the variable was set at create (x->faults != NULL).
 * Counts of what was injected are logged (first of each kind, then at each
 * power of two, and at destroy).  Owning thread only.
 */
#ifndef EPD_XPORT_FAULTS_H
#define EPD_XPORT_FAULTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "epd_xport_int.h"

typedef struct epd__xport_faults epd__xport_faults_t;

/* Reads EPD_XPORT_FAULTS.  *f_p: NULL when it is unset or empty (EPD_OK);
 * a new set (owned by the caller: epd__xport_faults_destroy) when it arms
 * anything; EPD_ERR_CONFIG (logged) when it is malformed, or asks for
 * corrupt without `auth`.  Logs once what is armed. */
epd_status_t epd__xport_faults_create(bool auth, const char *worker_id,
                                      epd__xport_faults_t **f_p);
/* Completes every held write completion, drops held frames, logs totals. */
void epd__xport_faults_destroy(epd__xport_faults_t *f);

/* A frame reached epd__xport_deliver: 1 when the faults took it (dropped,
 * held, or delivered by them through epd__xport_deliver_now), 0 to let the
 * core deliver it as usual. */
int epd__xport_faults_rx(epd__xport_faults_t *f, epd_xport_t *x, const void *data, size_t len);
/* A write completed with *status_p (the op belongs to endpoint `ep`): 1
 * when the faults hold the completion (completed later through
 * epd__xport_op_done_now), 0 to complete it now (*status_p may have been
 * changed). */
int epd__xport_faults_comp(epd__xport_faults_t *f, epd__xport_op_t *op, const void *ep,
                           epd_status_t *status_p);
/* A write is about to be posted: 1 with *copy_p (owned by the caller, to
 * free with epd_free once the write completes) holding the bytes with one
 * flipped, to post instead of `local`; 0 otherwise (also when out of
 * memory). */
int epd__xport_faults_write(epd__xport_faults_t *f, const void *local, size_t len,
                            void **copy_p);
/* Delivers and completes what is due; returns events handled. */
int epd__xport_faults_tick(epd__xport_faults_t *f, epd_xport_t *x, uint64_t now_ns);
/* Nonzero while anything is held (the loop must not sleep on the fd). */
int epd__xport_faults_pending(const epd__xport_faults_t *f);
/* Completes now every held completion of endpoint `ep` (before it goes). */
void epd__xport_faults_release(epd__xport_faults_t *f, const void *ep);

/* Core entry points the faults use. */
void epd__xport_deliver_now(epd_xport_t *x, const void *data, size_t len);
void epd__xport_op_done_now(epd__xport_op_t *op, epd_status_t status);
/* 1 when data[0..len) is a well-formed MSG frame; *payload_off_p gets where
 * its payload starts (after header and tag). */
int epd__xport_frame_is_msg(const void *data, size_t len, size_t *payload_off_p);

#endif
