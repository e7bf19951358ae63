/*
 * epd_itest_rogue.c — `epd-itest-rogue --prefill ADDR --decode ADDR
 * --model DIR --secret-file F --wrong-secret-file W`: attacks a cluster
 * that runs with a cluster secret through its real interfaces, and checks
 * that a victim's request is unharmed.
 *
 *   1. A stranger (the wrong secret, and no secret at all) cannot complete
 *      a handshake with the prefill or the decode worker: every connect
 *      fails, nothing is accepted.
 *   2. A member (the right secret, its own identity "rogue-1") speaks for
 *      others on its own authenticated endpoints, while a victim client
 *      ("victim", the right secret) runs a request:
 *        - to decode: WritesQuiesced for the victim's id, as the prefill
 *          worker (blocks recycled early);
 *        - to decode and prefill: Abort for the victim's id, as the victim;
 *        - to decode: a LayerDone as a newer epoch of the prefill worker
 *          (which would retire the real one);
 *        - to the victim client: a final TokenChunk for its id, as the
 *          decode worker (tokens injected into its stream).
 *      Every one is refused; the victim's request ends with exactly the
 *      colocated tokens (epd_itest_colo) and the victim client counts the
 *      forged chunk.
 * The daemons' logs name each refusal (test_trust_*.sh checks them).
 * Prints one line per case; exit 0 when every expectation held.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_client.h"
#include "epd_config.h"
#include "epd_engine.h"
#include "epd_itest_colo.h"
#include "epd_log.h"
#include "epd_msg.h"
#include "epd_rng.h"
#include "epd_sample.h"
#include "epd_secret.h"
#include "epd_time.h"
#include "epd_xport.h"

/* UCX and libfabric keep process-wide allocations until exit (not epd's). */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libucs.so\nleak:libucp.so\nleak:libuct.so\nleak:libucm.so\n"
           "leak:libfabric.so\nleak:librdmacm.so\nleak:libibverbs.so\n";
}

#define MAX_OUT 64
#define MAX_TOK 256

typedef struct {
    int done;
    int kind;
    epd_status_t status;
    int32_t got[MAX_OUT];
    uint32_t n;
} victim_t;

static void on_event(void *arg, const epd_client_event_t *ev)
{
    victim_t *v = ev->user;

    (void)arg;
    if (ev->kind == EPD_CLIENT_EV_TOKENS) {
        for (uint32_t i = 0; i < ev->n_tokens && ev->index + i < MAX_OUT; i++) {
            v->got[ev->index + i] = (int32_t)ev->tokens[i];
            if (ev->index + i + 1 > v->n) {
                v->n = ev->index + i + 1;
            }
        }
    }
    if (ev->terminal) {
        v->done = 1;
        v->kind = ev->kind;
        v->status = ev->status;
    }
}

static void rogue_on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    (void)arg;
    (void)ep;
    (void)data;
    (void)len;
}

static epd_xport_t *rogue_xport(const char *backend, const epd_secret_t *secret, const char *id)
{
    epd_xport_config_t xc;
    epd_xport_t *x = NULL;

    epd_xport_config_init(&xc);
    xc.backend = backend;
    xc.connect_timeout_ms = 1500;
    xc.peer_timeout_ms = 10000;
    if (secret != NULL) {
        xc.secret = secret->bytes;
        xc.secret_len = secret->len;
    }
    snprintf(xc.identity.worker_id, sizeof(xc.identity.worker_id), "%s", id);
    xc.identity.role = EPD_CLIENT_ROLE_TOOL;
    xc.identity.epoch.start_time_ns = epd_time_wall_ns();
    xc.identity.epoch.nonce = epd_rng_entropy();
    xc.msg_cb = rogue_on_msg;
    if (epd_xport_create(&xc, &x) != EPD_OK) {
        return NULL;
    }
    return x;
}

static void rogue_connected(void *arg, epd_status_t status)
{
    *(epd_status_t *)arg = status;
}

/* Where each connect's callback writes (the callback may run as late as
 * epd_xport_destroy, after rogue_connect returned). */
static epd_status_t conn_status[16];
static unsigned n_conn;
/* the victim, polled while the rogue connects (its handshake needs it) */
static epd_client_t *g_victim;

/* Connects x to addr; the status the connect ended with (EPD_ERR_TIMEOUT
 * after 10 s without an answer either way). */
static epd_status_t rogue_connect(epd_xport_t *x, const void *addr, size_t len,
                                  epd_xport_ep_t **ep_p)
{
    epd_status_t *done = &conn_status[n_conn++ % 16];
    uint64_t end = epd_time_now_ns() + 10 * EPD_NSEC_PER_SEC;
    epd_status_t st;

    *done = EPD_INPROGRESS;
    st = epd_xport_connect(x, addr, len, rogue_connected, done, ep_p);
    if (st != EPD_INPROGRESS && st != EPD_OK) {
        return st;
    }
    while (*done == EPD_INPROGRESS && epd_time_now_ns() < end) {
        epd_xport_poll(x, g_victim != NULL ? 0 : 5);
        if (g_victim != NULL) {
            epd_client_poll(g_victim, 2);
        }
    }
    return *done == EPD_INPROGRESS ? EPD_ERR_TIMEOUT : *done;
}

/* Sends body_case/body on ep with the given sender. */
static epd_status_t rogue_send(epd_xport_ep_t *ep, const char *as, epd_msg_epoch_t epoch,
                               Epd__Envelope__BodyCase body_case, void *body)
{
    unsigned char buf[4096];
    size_t len;
    epd_status_t st;

    st = epd_msg_encode_body(as, &epoch, 1, body_case, body, buf, sizeof(buf), &len);
    if (st != EPD_OK) {
        return st;
    }
    return epd_xport_send(ep, buf, len, 0);
}

static int check(int ok, const char *what)
{
    printf("rogue: %-62s %s\n", what, ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    struct {
        const char *prefill, *decode, *model, *secret, *wrong, *backend;
    } a = {NULL, NULL, NULL, NULL, NULL, "ucx"};
    const epd_opt_t opts[] = {
        {"prefill", EPD_OPT_STRING, &a.prefill, 0, 0, "the prefill worker's control address"},
        {"decode", EPD_OPT_STRING, &a.decode, 0, 0, "the decode worker's control address"},
        {"model", EPD_OPT_STRING, &a.model, 0, 0, "the model folder"},
        {"secret-file", EPD_OPT_STRING, &a.secret, 0, 0, "the cluster's secret"},
        {"wrong-secret-file", EPD_OPT_STRING, &a.wrong, 0, 0, "another secret"},
        {"backend", EPD_OPT_STRING, &a.backend, 0, 0, "ucx (default) or ofi"},
    };
    epd_opts_t o = {.prog = "epd-itest-rogue",
                    .summary = "attacks through the real interfaces",
                    .opts = opts,
                    .n_opts = sizeof(opts) / sizeof(opts[0])};
    static epd_secret_t secret, wrong;
    epd_client_worker_info_t pinfo, dinfo;
    epd_engine_config_t ecfg = {0};
    epd_client_config_t cc;
    epd_client_worker_t *pw, *dw;
    epd_client_request_t q;
    epd_client_stats_t cs;
    epd_client_t *victim = NULL;
    epd_engine_t *engine = NULL;
    epd_xport_t *x;
    epd_xport_ep_t *ep_p = NULL, *ep_d = NULL, *ep_v = NULL;
    epd_sample_params_t sp;
    epd_msg_epoch_t p_epoch, d_epoch, v_epoch;
    const void *vaddr;
    size_t vlen;
    int32_t toks[MAX_TOK], want[MAX_OUT];
    uint32_t prompt[MAX_TOK];
    uint32_t n_want = 0;
    size_t n_tok;
    victim_t v;
    uint64_t vid = 0, end;
    char why[256];
    int argi, bad = 0;

    if (epd_opts_parse(&o, argc, argv, &argi) != EPD_OK || a.prefill == NULL ||
        a.decode == NULL || a.model == NULL || a.secret == NULL || a.wrong == NULL) {
        fprintf(stderr, "usage: epd-itest-rogue --prefill A --decode A --model D "
                        "--secret-file F --wrong-secret-file W\n");
        return 2;
    }
    if (epd_secret_load(a.secret, &secret, why, sizeof(why)) != EPD_OK ||
        epd_secret_load(a.wrong, &wrong, why, sizeof(why)) != EPD_OK) {
        fprintf(stderr, "rogue: %s\n", why);
        return 2;
    }
    if (epd_client_health(a.prefill, 5000, &pinfo, why, sizeof(why)) != EPD_OK ||
        epd_client_health(a.decode, 5000, &dinfo, why, sizeof(why)) != EPD_OK) {
        fprintf(stderr, "rogue: Health: %s\n", why);
        return 2;
    }
    p_epoch.start_time_ns = pinfo.epoch_start_ns;
    p_epoch.nonce = pinfo.epoch_nonce;
    d_epoch.start_time_ns = dinfo.epoch_start_ns;
    d_epoch.nonce = dinfo.epoch_nonce;

    /* 1. strangers: no handshake completes */
    for (int k = 0; k < 2; k++) {
        x = rogue_xport(a.backend, k == 0 ? &wrong : NULL, "stranger");
        if (x == NULL) {
            return 2;
        }
        bad |= check(rogue_connect(x, pinfo.address, pinfo.address_len, &ep_p) != EPD_OK,
                     k == 0 ? "wrong secret: no handshake with prefill"
                            : "no secret: no handshake with prefill");
        bad |= check(rogue_connect(x, dinfo.address, dinfo.address_len, &ep_d) != EPD_OK,
                     k == 0 ? "wrong secret: no handshake with decode"
                            : "no secret: no handshake with decode");
        epd_xport_destroy(x);
    }

    /* the victim's expected tokens: the colocated run */
    ecfg.model_dir = a.model;
    ecfg.max_batch = 1;
    if (epd_engine_open("ref", &ecfg, &engine) != EPD_OK ||
        epd_engine_tokenize(engine, "A victim's prompt, long enough to take a while.", 47, 1,
                            toks, MAX_TOK, &n_tok) != EPD_OK) {
        fprintf(stderr, "rogue: cannot open the model\n");
        return 2;
    }
    epd_sample_params_default(&sp);
    if (epd_itest_colocated(engine, toks, (uint32_t)n_tok, &sp, 24, want, &n_want) != EPD_OK) {
        return 2;
    }
    for (size_t i = 0; i < n_tok; i++) {
        prompt[i] = (uint32_t)toks[i];
    }

    /* 2. the victim starts a request; a member speaks for others */
    epd_client_config_init(&cc);
    cc.event_cb = on_event;
    cc.secret = secret.bytes;
    cc.secret_len = secret.len;
    cc.worker_id = "victim";
    cc.backend = a.backend;
    if (epd_client_create(&cc, &victim) != EPD_OK ||
        epd_client_add_worker(victim, a.prefill, &pw) != EPD_OK ||
        epd_client_add_worker(victim, a.decode, &dw) != EPD_OK) {
        fprintf(stderr, "rogue: the victim cannot reach the workers\n");
        return 2;
    }
    epd_client_epoch(victim, &v_epoch.start_time_ns, &v_epoch.nonce);
    g_victim = victim;
    x = rogue_xport(a.backend, &secret, "rogue-1");
    if (x == NULL || rogue_connect(x, pinfo.address, pinfo.address_len, &ep_p) != EPD_OK ||
        rogue_connect(x, dinfo.address, dinfo.address_len, &ep_d) != EPD_OK ||
        epd_xport_address(epd_client_xport(victim), &vaddr, &vlen) != EPD_OK ||
        rogue_connect(x, vaddr, vlen, &ep_v) != EPD_OK) {
        fprintf(stderr, "rogue: a member could not connect\n");
        return 2;
    }
    memset(&v, 0, sizeof(v));
    memset(&q, 0, sizeof(q));
    q.prompt = prompt;
    q.n_prompt = (uint32_t)n_tok;
    q.max_tokens = 24;
    q.top_p = 1.0f;
    q.prefill = pw;
    q.decode = dw;
    q.deadline_ms = 60000;
    q.user = &v;
    if (epd_client_submit(victim, &q, &vid) != EPD_OK) {
        return 2;
    }
    {
        Epd__WritesQuiesced wq = EPD__WRITES_QUIESCED__INIT;
        Epd__Abort ab = EPD__ABORT__INIT;
        Epd__LayerDone ld = EPD__LAYER_DONE__INIT;
        Epd__TokenChunk tc = EPD__TOKEN_CHUNK__INIT;
        epd_msg_epoch_t newer = p_epoch;
        uint32_t junk[3] = {1, 2, 3};

        newer.start_time_ns += 1;
        wq.request_id = vid;
        ab.request_id = vid;
        ab.status = EPD_ERR_CANCELED;
        ab.reason = "forged";
        ld.request_id = vid;
        ld.layer = 0;
        tc.request_id = vid;
        tc.index = 0;
        tc.tokens = junk;
        tc.n_tokens = 3;
        tc.finish = EPD__FINISH_REASON__FINISH_STOP;
        (void)rogue_send(ep_d, pinfo.worker_id, p_epoch, EPD__ENVELOPE__BODY_QUIESCED, &wq);
        (void)rogue_send(ep_d, "victim", v_epoch, EPD__ENVELOPE__BODY_ABORT, &ab);
        (void)rogue_send(ep_p, "victim", v_epoch, EPD__ENVELOPE__BODY_ABORT, &ab);
        (void)rogue_send(ep_d, pinfo.worker_id, newer, EPD__ENVELOPE__BODY_LAYER_DONE, &ld);
        (void)rogue_send(ep_v, dinfo.worker_id, d_epoch, EPD__ENVELOPE__BODY_TOKENS, &tc);
    }
    end = epd_time_now_ns() + 60 * EPD_NSEC_PER_SEC;
    while (!v.done && epd_time_now_ns() < end) {
        epd_client_poll(victim, 2);
        epd_xport_poll(x, 0);
    }
    epd_client_stats(victim, &cs);
    bad |= check(v.done && v.kind == EPD_CLIENT_EV_TOKENS, "the victim's request finished");
    bad |= check(v.n == n_want && memcmp(v.got, want, n_want * sizeof(int32_t)) == 0,
                 "its tokens equal the colocated ones");
    bad |= check(cs.forged >= 1, "the victim dropped the TokenChunk forged as decode's");
    printf("rogue: victim got %u tokens (want %u); forged frames dropped by the victim: %llu\n",
           v.n, n_want, (unsigned long long)cs.forged);
    epd_xport_destroy(x);
    epd_client_destroy(victim);
    epd_engine_close(engine);
    epd_secret_wipe(&secret);
    epd_secret_wipe(&wrong);
    epd_opts_cleanup(&o);
    printf("rogue: %s\n", bad ? "FAILED" : "ok");
    return bad;
}
