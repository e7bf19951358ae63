/*
 * epd_client_int.h — the request-plane client's internals, shared by its
 * files (the API is epd_client.h):
 *
 *   epd_client.c         lifecycle (create, destroy), workers (add, connect,
 *                        endpoint failures), polling, accessors
 *   epd_client_req.c     the request path: the table of live requests,
 *                        submit, abort, incoming messages, deadlines
 *   epd_client_health.c  a worker's Health answer: the blocking gRPC call
 *                        and the parsing of what it says
 *
 * Calls between them go one way: epd_client.c -> epd_client_req.c and
 * epd_client_health.c; the request path reaches nothing above it (the
 * transport calls it back through the message callback epd_client.c
 * registers at create).
 *
 * Threads: the owner thread only (see epd_client.h); nothing takes a lock.
 */
#ifndef EPD_CLIENT_INT_H
#define EPD_CLIENT_INT_H

#include <stdio.h>

#include "epd_client.h"
#include "epd_msg.h"

#define EPD__CLIENT_BUCKETS 1024u
#define EPD__CLIENT_LOG "client"

struct epd_client_worker {
    epd_client_t *client;
    epd_client_worker_info_t info;
    epd_xport_ep_t *ep; /* NULL once failed and closed */
    epd_status_t state; /* EPD_OK, or the endpoint's failure */
    epd_client_worker_t *next;
};

/* One live request; owned by the client's table from submit until its
 * terminal event (freed right after that callback returns). */
typedef struct epd__client_req {
    uint64_t id;
    void *user;
    epd_client_worker_t *prefill; /* borrowed: workers live as long as the client */
    epd_client_worker_t *decode;
    epd_client_worker_t *enc[EPD_CLIENT_MEDIA_MAX]; /* distinct encoders of its images */
    uint32_t n_enc;
    uint32_t abort_pending_e; /* bit i: Abort to enc[i] not yet accepted */
    uint32_t next_index;      /* tokens received so far */
    uint32_t max_tokens;
    uint32_t logprobs;    /* the request's SamplingParams.logprobs */
    uint64_t deadline_ns; /* monotonic */
    int aborted;          /* the caller asked for an abort */
    int abort_pending_p;  /* Abort to prefill not yet accepted */
    int abort_pending_d;
    struct epd__client_req *hnext;
} epd__client_req_t;

struct epd_client {
    epd_client_config_t cfg;
    char worker_id[EPD_CLIENT_NAME_MAX];
    uint64_t epoch_start_ns;
    uint64_t epoch_nonce;
    uint64_t seq;
    int authenticating; /* a cluster secret: every sender is checked against its endpoint */
    epd_xport_t *x;
    epd_client_worker_t *workers;
    epd__client_req_t *buckets[EPD__CLIENT_BUCKETS];
    uint32_t live;
    unsigned char *txbuf; /* one encoded frame, max_msg_size bytes */
    epd_client_stats_t stats;
    uint64_t last_bad_log_ns;
    char culprit[EPD_CLIENT_NAME_MAX]; /* of the Error being delivered */
};

/* Copies a possibly NULL string, truncated to cap. */
static inline void epd__client_copy_str(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src != NULL ? src : "");
}

/* ---- epd_client_req.c ---- */

/* The transport's message callback (xport msg_cb, arg = the client):
 * decodes, attributes by sender and delivers the request's events. */
void epd__client_on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len);
/* The endpoint of `w` failed (or could not connect): the worker is
 * unusable from now on and every request that uses it ends with
 * EPD_ERR_PEER_DEAD (Abort to its other workers).  Closes w->ep. */
void epd__client_worker_failed(epd_client_t *c, epd_client_worker_t *w, epd_status_t status);
/* Frees every live request without an event (destroy). */
void epd__client_reqs_free_all(epd_client_t *c);

#endif
