/*
 * epd-daemon-testd — the smallest role on the daemon runtime, for
 * tests/daemon/test_epd_daemon.c: it lets a test drive daemon/ through its
 * real interfaces (the request plane, gRPC, signals, the ready file) and
 * see what the runtime told the role.
 *
 * What it does, on request-plane messages from its client:
 *   GenerateRequest{id, prefill_worker_id, prefill_epoch, prefill_address}
 *       epd_peer_get(ROLE_PREFILL, ...) and a KvRefused{id, "hello"} on the
 *       peer's link (the peer answers nothing); the client's link is kept as
 *       the "reporting" link;
 *   Abort{id = N, reason "flood"}
 *       N TokenChunks {request_id 7, index 0..N-1} on the client's link, in
 *       one go (the outbox takes what the transport refuses);
 *   Abort{id, reason "kill"} kills the peer named by the last GenerateRequest.
 * What the runtime tells the role goes to the reporting link as an Error
 * whose request_id names the upcall (EPD_TESTD_EV_*) and whose message
 * says what: "dead WORKER: WHY", "closed WORKER", "drained", "link down".
 * Its load reports the number of messages it took (queue_depth).
 */
#include <stdio.h>
#include <string.h>

#include "epd_daemon.h"
#include "epd_link.h"
#include "epd_log.h"
#include "epd_peer.h"

#define EPD_TESTD_EV_DEAD 9001
#define EPD_TESTD_EV_CLOSED 9002
#define EPD_TESTD_EV_DRAINED 9003
#define EPD_TESTD_EV_LINK_DOWN 9004
#define EPD_TESTD_FLOOD_ID 7

typedef struct {
    epd_daemon_t *d;
    epd_link_t *report; /* counted */
    epd_peer_t *peer;   /* counted */
    uint32_t took;
} epd_testd_t;

static void epd_testd_report(epd_testd_t *t, uint64_t ev, const char *fmt, const char *a,
                             const char *b)
{
    char msg[200];

    snprintf(msg, sizeof(msg), fmt, a, b);
    (void)epd_link_send_error(t->report, ev, EPD_ERR_FATAL, msg, NULL);
}

static int epd_testd_on_msg(void *arg, epd_link_t *from, Epd__Envelope *env)
{
    epd_testd_t *t = arg;

    t->took++;
    if (env->body_case == EPD__ENVELOPE__BODY_GENERATE) {
        const Epd__GenerateRequest *g = env->generate;
        epd_msg_epoch_t e = epd_msg_epoch_of(g->prefill_epoch);
        epd_peer_t *p = NULL;
        epd_status_t st;

        if (t->report != from) {
            epd_link_unref(t->report);
            epd_link_ref(from);
            t->report = from;
        }
        st = epd_peer_get(t->d, EPD__ROLE__ROLE_PREFILL,
                          g->prefill_worker_id != NULL ? g->prefill_worker_id : "", &e,
                          g->prefill_address.data, g->prefill_address.len, &p);
        if (st != EPD_OK) {
            (void)epd_link_send_error(from, g->request_id, st, "peer_get failed", NULL);
            return 0;
        }
        epd_peer_unref(t->peer);
        t->peer = p;
        (void)epd_link_send_refused(epd_peer_link(p), g->request_id, EPD_ERR_NO_CAPACITY, "hello");
        return 0;
    }
    if (env->body_case == EPD__ENVELOPE__BODY_ABORT && env->abort->reason != NULL &&
        strcmp(env->abort->reason, "flood") == 0) {
        uint64_t i;
        uint32_t queued = 0;

        for (i = 0; i < env->abort->request_id; i++) {
            Epd__TokenChunk c = EPD__TOKEN_CHUNK__INIT;
            uint32_t tok = (uint32_t)i;

            c.request_id = EPD_TESTD_FLOOD_ID;
            c.index = (uint32_t)i;
            c.tokens = &tok;
            c.n_tokens = 1;
            queued = epd_link_queued(from);
            if (epd_link_send(from, EPD__ENVELOPE__BODY_TOKENS, &c, 0) != EPD_OK) {
                break;
            }
        }
        if (i < env->abort->request_id) {
            /* the outbox bound: what waited in it went down with the link */
            epd_log_warn("testd", 0, "flood: accepted=%llu queued=%u when the link went down",
                         (unsigned long long)(i - queued), queued);
        } else {
            epd_log_info("testd", 0, "flood: all %llu sent or queued", (unsigned long long)i);
        }
        return 0;
    }
    if (env->body_case == EPD__ENVELOPE__BODY_ABORT && env->abort->reason != NULL &&
        strcmp(env->abort->reason, "kill") == 0 && t->peer != NULL) {
        epd_peer_kill(t->peer, EPD_ERR_CANCELED, "killed on request");
    }
    return 0;
}

static void epd_testd_on_link_down(void *arg, epd_link_t *link, epd_status_t status)
{
    epd_testd_t *t = arg;

    (void)status;
    if (link != t->report) {
        epd_testd_report(t, EPD_TESTD_EV_LINK_DOWN, "link down%s%s", "", "");
    }
}

static void epd_testd_on_peer_dead(void *arg, epd_peer_t *peer, epd_status_t status,
                                   const char *why)
{
    epd_testd_t *t = arg;

    (void)status;
    epd_testd_report(t, EPD_TESTD_EV_DEAD, "dead %s: %s", epd_peer_id(peer), why);
}

static void epd_testd_on_peer_closed(void *arg, epd_peer_t *peer)
{
    epd_testd_t *t = arg;

    /* every endpoint of the incarnation is closed by now */
    epd_testd_report(t, EPD_TESTD_EV_CLOSED, "closed %s%s",
                     epd_link_ep(epd_peer_link(peer)) == NULL ? epd_peer_id(peer) : "(open!)", "");
    if (peer == t->peer) {
        epd_peer_unref(peer);
        t->peer = NULL;
    }
}

static void epd_testd_load(void *arg, epd_daemon_load_t *load_p)
{
    epd_testd_t *t = arg;

    load_p->queue_depth = t->took;
}

static void epd_testd_on_drain(void *arg)
{
    epd_testd_report(arg, EPD_TESTD_EV_DRAINED, "drained%s%s", "", "");
}

static const epd_daemon_ops_t epd_testd_ops = {
    .on_msg = epd_testd_on_msg,
    .on_link_down = epd_testd_on_link_down,
    .on_peer_dead = epd_testd_on_peer_dead,
    .on_peer_closed = epd_testd_on_peer_closed,
    .on_pump = epd_daemon_op_pump_none,
    .on_tick = epd_daemon_op_tick_none,
    .load = epd_testd_load,
    .on_drain = epd_testd_on_drain,
    .on_rpc = epd_daemon_op_rpc_pass,
    .on_stop = epd_daemon_op_none,
    .stopped = epd_daemon_op_stopped_now,
    .idle = epd_daemon_op_stopped_now,
    .on_exit = epd_daemon_op_none,
    .setup = epd_daemon_op_setup_none, /* it drives create/serve/destroy itself */
    .cleanup = epd_daemon_op_none,
};

static int epd_testd_run(const epd_daemon_flags_t *fl, void *arg)
{
    epd_daemon_config_t dc;
    epd_daemon_capacity_t cap;
    epd_testd_t t;
    epd_status_t st;

    (void)arg;
    memset(&t, 0, sizeof(t));
    memset(&dc, 0, sizeof(dc));
    dc.role_name = "testd";
    dc.role = EPD__ROLE__ROLE_PREFILL;
    dc.flags = fl;
    dc.with_xport = 1;
    dc.ops = &epd_testd_ops;
    dc.arg = &t;
    st = epd_daemon_create(&dc, &t.d);
    if (st == EPD_OK) {
        memset(&cap, 0, sizeof(cap));
        cap.kv_blocks_total = 42;
        cap.max_batch = 3;
        epd_daemon_set_capacity(t.d, &cap);
        st = epd_daemon_serve(t.d, NULL);
        epd_link_unref(t.report);
        epd_peer_unref(t.peer);
        epd_daemon_destroy(t.d);
    }
    return st == EPD_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    return epd_daemon_main("epd-daemon-testd", "a test role on the daemon runtime",
                           EPD_DAEMON_FLAG_REGISTER, NULL, 0, epd_testd_run, NULL, argc, argv);
}
