/*
 * epd_bench_overhead_attach.c — `epd-bench overhead --attach-prefill
 * HOST:PORT --attach-decode HOST:PORT --cluster-secret-file F`: the same
 * A/B/Z arms, table and --tsv as the one-host mode (epd_bench_overhead.c),
 * against a prefill and a decode daemon that someone else started, on
 * other hosts.  The benchmark never starts, stops or reads the files of
 * those daemons; it needs them to run with --trace (any FILE: it is
 * written at their exit, which the benchmark never waits for).
 *
 * Times come from the daemons' own trace recorders, fetched over the
 * request plane after each prompt length (TraceFetch, proto/README.md rule
 * 39), exactly the events the one-host mode reads from the trace files.
 * Each daemon stamps them on its own CLOCK_MONOTONIC; the benchmark puts
 * them on its own clock with each daemon's offset, estimated NTP-style:
 * a ClockProbe sent at t0 and answered at t1 (the benchmark's clock) with
 * the daemon's clock d says offset = d - (t0 + t1) / 2 within u =
 * (t1 - t0) / 2 whatever the two one-way delays are; of --probes probes the
 * tightest (least t1 - t0) is kept.  A round of probes runs before and
 * after each length; the row uses their mean and an uncertainty of the
 * larger u plus half the offset's change (the clocks' drift over the row).
 *
 * Only differences across the two daemons carry the clock's error: B (and
 * B - A, Z, the KV tail, LayerDone's latency `msg` and so the floor) are
 * uncertain by u_prefill + u_decode, printed beside each row; A and the
 * link's bandwidth (prefill's own write spans) are on one clock.  B - A and
 * the floor move together with the error (both hold one cross-clock
 * difference: decode's receipt minus prefill's send), so the excess is
 * steadier than either.
 *
 * The link and the message latency are those of the KV's own path: the
 * "KV write" spans prefill records for its writes into decode, and the
 * LayerDone messages prefill sends decode (in the Z arm) — not the
 * benchmark's link to either.  Every request carries a cache salt of its
 * own, so the daemons' prefix caches (their operator's setting) never spare
 * an arm its compute.  The CPU lines of the one-host mode are off (the
 * daemons' /proc is not here), and so is the sim model column.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "epd_alloc.h"
#include "epd_bench.h"
#include "epd_bench_overhead_int.h"
#include "epd_kvq.h"
#include "epd_msg.h"
#include "epd_rng.h"
#include "epd_time.h"

#define OA_PROBE_BASE (1ull << 62) /* probe and fetch ids: never a request's */
#define OA_WAIT_NS (10ull * 1000000000ull)

enum { OA_P = 0, OA_D = 1 };
static const char *const oa_who[2] = {"prefill", "decode"};

/* One estimate of a daemon's clock: its offset from ours and the bound. */
typedef struct {
    int64_t off_ns; /* daemon's CLOCK_MONOTONIC - ours */
    double unc_ns;  /* |error| <= unc_ns */
} oa_clock_t;

typedef struct {
    ob_t *b;
    const char *addr[2]; /* control addresses HOST:PORT */
    epd_xport_ep_t *ep[2];
    int probes;
    uint64_t next_probe;
    uint64_t base_ns; /* our clock's origin for the folded times */
    /* the exchange in flight (one at a time) */
    uint64_t want_id;
    int got;
    uint64_t got_t1, got_mono;
    int fetch_which;
    int64_t fetch_off;
    int tracing;
    uint64_t next_cursor, recorded, dropped;
    /* per daemon */
    uint64_t cursor[2];
    uint64_t dropped0[2];
    oa_clock_t clk[2]; /* the row's */
    /* --trace FILE: the events of one B request, both daemons */
    const char *trace_out;
    uint32_t trace_len;
    uint64_t trace_id;
    json_t *trace_evs;
} oa_t;

/* ------------------------------------------------------ request plane */

/* One event of the traced request, Chrome trace JSON on our clock (us):
 * prefill is process 1, decode process 2. */
static void oa_trace_event(oa_t *a, const Epd__TraceEvent *e, double ts_ns)
{
    json_t *o = json_object();
    json_t *args = json_object();

    json_object_set_new(o, "name", json_string(e->name));
    json_object_set_new(o, "cat", json_string(oa_who[a->fetch_which]));
    json_object_set_new(o, "ph", json_string(e->instant ? "i" : "X"));
    json_object_set_new(o, "ts", json_real(ts_ns / 1e3));
    if (e->instant) {
        json_object_set_new(o, "s", json_string("t"));
    } else {
        json_object_set_new(o, "dur", json_real((double)e->dur_ns / 1e3));
    }
    json_object_set_new(o, "pid", json_integer(a->fetch_which + 1));
    json_object_set_new(o, "tid", json_integer(0));
    json_object_set_new(args, "req", json_integer((json_int_t)e->req_id));
    if (e->layer >= 0) {
        json_object_set_new(args, "layer", json_integer(e->layer));
    }
    json_object_set_new(o, "args", args);
    json_array_append_new(a->trace_evs, o);
}

/* Writes the traced request's events (and the two processes' names). */
static int oa_trace_write(oa_t *a)
{
    json_t *root = json_object();
    int rc;

    for (int w = 0; w < 2; w++) {
        char name[160];
        json_t *m = json_object(), *args = json_object();

        snprintf(name, sizeof(name), "epd-%s %s at %s (this host's clock)", oa_who[w],
                 w == OA_P ? a->b->pi.worker_id : a->b->di.worker_id, a->addr[w]);
        json_object_set_new(args, "name", json_string(name));
        json_object_set_new(m, "name", json_string("process_name"));
        json_object_set_new(m, "ph", json_string("M"));
        json_object_set_new(m, "pid", json_integer(w + 1));
        json_object_set_new(m, "tid", json_integer(0));
        json_object_set_new(m, "args", args);
        json_array_append_new(a->trace_evs, m);
    }
    json_object_set_new(root, "displayTimeUnit", json_string("ns"));
    json_object_set(root, "traceEvents", a->trace_evs);
    rc = json_dump_file(root, a->trace_out, JSON_COMPACT);
    json_decref(root);
    return rc;
}

static void oa_on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    oa_t *a = arg;
    uint64_t t1 = epd_time_now_ns(); /* before decoding: inside the bound */
    Epd__Envelope *env = NULL;
    const char *why = NULL;

    if (epd_msg_decode(data, len, &env, &why) != EPD_OK) {
        return;
    }
    if (env->body_case == EPD__ENVELOPE__BODY_CLOCK_REPLY) {
        if (env->clock_reply->request_id == a->want_id && !a->got) {
            a->got = 1;
            a->got_t1 = t1;
            a->got_mono = env->clock_reply->monotonic_ns;
        }
    } else if (env->body_case == EPD__ENVELOPE__BODY_TRACE_EVENTS) {
        const Epd__TraceEvents *te = env->trace_events;

        if (te->request_id == a->want_id && !a->got) {
            a->got = 1;
            a->tracing = te->tracing;
            a->next_cursor = te->next_cursor;
            a->recorded = te->recorded;
            a->dropped = te->dropped;
            for (size_t i = 0; i < te->n_events; i++) {
                const Epd__TraceEvent *e = te->events[i];
                /* the daemon's clock to ours, relative to base_ns (exact
                 * in 64-bit modular arithmetic, then a double of ns) */
                double ts = (double)((int64_t)(e->ts_ns - a->base_ns) - a->fetch_off);

                if (e->name == NULL) {
                    continue;
                }
                epd__ob_fold(a->b, a->fetch_which == OA_D, e->name, e->req_id, e->layer, ts,
                             (double)e->dur_ns);
                if (e->req_id == a->trace_id && a->trace_evs != NULL) {
                    oa_trace_event(a, e, ts);
                }
            }
        }
    } else {
        epd_msg_free(env);
        epd__ob_on_msg(a->b, ep, data, len);
        return;
    }
    epd_msg_free(env);
}

static void oa_on_err(void *arg, epd_xport_ep_t *ep, epd_status_t status)
{
    oa_t *a = arg;

    epd__ob_on_err(a->b, ep, status);
}

static void oa_on_connect(void *arg, epd_status_t status)
{
    oa_t *a = arg;

    epd__ob_on_connect(a->b, status);
}

/* Sends one message of ours to daemon `which`.  EPD_OK or the failure. */
static epd_status_t oa_send(oa_t *a, int which, Epd__Envelope__BodyCase body_case, void *body)
{
    ob_t *b = a->b;
    char wid[64];
    epd_msg_epoch_t me = {b->epoch_start, b->epoch_nonce};
    size_t len;
    epd_status_t st;

    snprintf(wid, sizeof(wid), "bench-overhead-%d", (int)getpid());
    st = epd_msg_encode_body(wid, &me, ++b->seq, body_case, body, b->txbuf, 1 << 20, &len);
    if (st != EPD_OK) {
        return st;
    }
    for (int tries = 0; tries < 10000; tries++) {
        st = epd_xport_send(a->ep[which], b->txbuf, len, 0);
        if (st != EPD_ERR_NO_RESOURCE) {
            return st;
        }
        epd_xport_progress(b->x);
    }
    return st;
}

/* Polls until the answer to a->want_id came (10 s).  0 or -1 (said). */
static int oa_wait(oa_t *a, int which, const char *what)
{
    uint64_t end = epd_time_now_ns() + OA_WAIT_NS;

    while (!a->got && epd_time_now_ns() < end) {
        epd_xport_poll(a->b->x, 5);
    }
    if (!a->got) {
        fprintf(stderr,
                "overhead: %s at %s did not answer a %s in 10 s (a daemon older than "
                "rule 39, or the link is down)\n",
                oa_who[which], a->addr[which], what);
        return -1;
    }
    return 0;
}

/* A round of a->probes clock probes to daemon `which`: the tightest. */
static int oa_clock_round(oa_t *a, int which, oa_clock_t *out)
{
    double best = INFINITY;

    for (int i = 0; i < a->probes; i++) {
        Epd__ClockProbe p = EPD__CLOCK_PROBE__INIT;
        uint64_t t0;
        double rtt;

        p.request_id = a->want_id = a->next_probe++;
        a->got = 0;
        t0 = epd_time_now_ns();
        if (oa_send(a, which, EPD__ENVELOPE__BODY_CLOCK_PROBE, &p) != EPD_OK ||
            oa_wait(a, which, "clock probe") != 0) {
            return -1;
        }
        rtt = (double)(a->got_t1 - t0);
        if (rtt < best) {
            best = rtt;
            /* d - (t0 + t1) / 2, without adding two clocks' worth of ns */
            out->off_ns = (int64_t)(a->got_mono - t0) - (int64_t)((a->got_t1 - t0) / 2);
            out->unc_ns = rtt / 2.0;
        }
    }
    return 0;
}

/* The clocks of both daemons before and after a row: their mean, and an
 * uncertainty that covers the drift in between. */
static void oa_clock_merge(const oa_clock_t *c0, const oa_clock_t *c1, oa_clock_t *out)
{
    int64_t d = c1->off_ns - c0->off_ns;

    out->off_ns = c0->off_ns + d / 2;
    out->unc_ns = fmax(c0->unc_ns, c1->unc_ns) + fabs((double)d) / 2.0;
}

/* Fetches daemon `which`'s events of requests [lo, hi] recorded since the
 * last fetch and folds them (on our clock, with the row's offset). */
static int oa_fetch(oa_t *a, int which, uint64_t lo, uint64_t hi)
{
    for (int n = 0; n < 100000; n++) {
        Epd__TraceFetch f = EPD__TRACE_FETCH__INIT;

        f.request_id = a->want_id = a->next_probe++;
        f.cursor = a->cursor[which];
        f.req_min = lo;
        f.req_max = hi;
        a->got = 0;
        a->fetch_which = which;
        a->fetch_off = a->clk[which].off_ns;
        if (oa_send(a, which, EPD__ENVELOPE__BODY_TRACE_FETCH, &f) != EPD_OK ||
            oa_wait(a, which, "trace fetch") != 0) {
            return -1;
        }
        if (!a->tracing) {
            fprintf(stderr,
                    "overhead: %s at %s runs without --trace: start it with --trace FILE "
                    "(the benchmark reads the recorder over the request plane)\n",
                    oa_who[which], a->addr[which]);
            return -1;
        }
        a->cursor[which] = a->next_cursor;
        if (a->next_cursor >= a->recorded) {
            if (a->dropped > a->dropped0[which]) {
                fprintf(stderr,
                        "overhead: %s's trace recorder is full (%" PRIu64 " events "
                        "dropped): its requests lack times; restart it with a larger "
                        "--trace-events\n",
                        oa_who[which], a->dropped);
                a->dropped0[which] = a->dropped;
            }
            return 0;
        }
    }
    return -1;
}

/* ------------------------------------------------------------- the run */

/* The daemons' Health: roles, transport, the KV layout the floor needs. */
static int oa_health(oa_t *a)
{
    ob_t *b = a->b;
    epd_client_worker_info_t *inf[2] = {&b->pi, &b->di};
    int roles[2] = {EPD_CLIENT_ROLE_PREFILL, EPD_CLIENT_ROLE_DECODE};
    const epd_client_worker_info_t *p = &b->pi;

    for (int w = 0; w < 2; w++) {
        char err[256] = "";

        if (epd_client_health(a->addr[w], 10000, inf[w], err, sizeof(err)) != EPD_OK) {
            fprintf(stderr, "overhead: Health of %s at %s: %s\n", oa_who[w], a->addr[w], err);
            return -1;
        }
        if (inf[w]->role != roles[w]) {
            fprintf(stderr, "overhead: %s (worker '%s') is not a %s daemon\n", a->addr[w],
                    inf[w]->worker_id, oa_who[w]);
            return -1;
        }
    }
    if (strcmp(b->pi.transport, b->di.transport) != 0) {
        fprintf(stderr, "overhead: prefill runs %s, decode %s\n", b->pi.transport, b->di.transport);
        return -1;
    }
    if (p->n_layers == 0 || p->n_layers > EPD_KV_MAX_LAYERS ||
        strlen(p->layer_pattern) != p->n_layers || p->block_tokens == 0) {
        fprintf(stderr, "overhead: prefill's KV layout is not usable (%u layers, pattern '%s')\n",
                p->n_layers, p->layer_pattern);
        return -1;
    }
    memset(&b->kv, 0, sizeof(b->kv));
    b->kv.n_layers = p->n_layers;
    for (uint32_t l = 0; l < p->n_layers; l++) {
        b->kv.kind[l] = p->layer_pattern[l] == 'L' ? EPD_LAYER_LINEAR : EPD_LAYER_ATTENTION;
    }
    b->kv.block_tokens = p->block_tokens;
    b->kv.n_kv_heads = p->n_kv_heads;
    b->kv.head_dim = p->head_dim;
    b->kv.block_bytes = p->block_bytes;
    b->kv.state_bytes = p->state_bytes;
    if (strcmp(p->kv_dtype_map, b->di.kv_dtype_map) != 0) {
        fprintf(stderr, "overhead: prefill's KV dtype map '%s' differs from decode's '%s'\n",
                p->kv_dtype_map, b->di.kv_dtype_map);
        return -1;
    }
    /* the rows name the daemons' map; a per-layer one sizes each layer's
     * blocks (a uniform one is block_bytes, as Health says) */
    snprintf(b->kv_name, sizeof(b->kv_name), "%s", p->kv_dtype_map[0] != '\0' ? p->kv_dtype_map : "-");
    if (strchr(p->kv_dtype_map, ':') != NULL) {
        uint8_t dt[EPD_KV_MAX_LAYERS];
        const char *why = "";

        if (epd_kvq_map_parse(p->kv_dtype_map, p->n_layers, dt, &why) != EPD_OK) {
            fprintf(stderr, "overhead: prefill's KV dtype map '%s': %s\n", p->kv_dtype_map, why);
            return -1;
        }
        epd_kvq_layout_apply(&b->kv, dt);
    }
    if ((int)strlen(b->kv_name) > b->kv_w) {
        b->kv_w = (int)strlen(b->kv_name);
    }
    return 0;
}

static int oa_connect(oa_t *a, const char *data_addr)
{
    ob_t *b = a->b;
    epd_xport_config_t xc;

    epd_xport_config_init(&xc);
    xc.backend = b->pi.transport;
    xc.provider = getenv("FI_PROVIDER");
    xc.bind_host = data_addr;
    xc.max_msg_size = 64 * 1024; /* as the daemons */
    xc.peer_timeout_ms = 60000;
    xc.connect_timeout_ms = 10000;
    xc.msg_cb = oa_on_msg;
    xc.err_cb = oa_on_err;
    xc.cb_arg = a;
    xc.secret = b->secret.bytes;
    xc.secret_len = b->secret.len;
    snprintf(xc.identity.worker_id, sizeof(xc.identity.worker_id), "bench-overhead-%d",
             (int)getpid());
    xc.identity.role = EPD_CLIENT_ROLE_TOOL;
    xc.identity.epoch.start_time_ns = b->epoch_start;
    xc.identity.epoch.nonce = b->epoch_nonce;
    if (epd_xport_create(&xc, &b->x) != EPD_OK) {
        fprintf(stderr, "overhead: cannot start the client transport %s\n", xc.backend);
        return -1;
    }
    b->n_connected = 0;
    b->connect_failed = 0;
    if (epd_xport_connect(b->x, b->pi.address, b->pi.address_len, oa_on_connect, a, &b->ep_p) !=
            EPD_INPROGRESS ||
        epd_xport_connect(b->x, b->di.address, b->di.address_len, oa_on_connect, a, &b->ep_d) !=
            EPD_INPROGRESS) {
        fprintf(stderr, "overhead: cannot connect to the daemons' data planes\n");
        return -1;
    }
    a->ep[OA_P] = b->ep_p;
    a->ep[OA_D] = b->ep_d;
    {
        uint64_t end = epd_time_now_ns() + 15ull * 1000000000ull;

        while (b->n_connected < 2 && !b->connect_failed && epd_time_now_ns() < end) {
            epd_xport_poll(b->x, 5);
        }
    }
    if (b->n_connected < 2) {
        fprintf(stderr, "overhead: connecting to the daemons failed (same cluster secret? the "
                        "transport's environment, UCX_TLS / FI_PROVIDER, as theirs?)\n");
        return -1;
    }
    return 0;
}

/* One prompt length: clocks, requests, traces, the row. */
static int oa_length(oa_t *a, const ob_engine_t *e, const ob_xport_t *xp, uint32_t len, int li,
                     uint32_t *tokens, epd_rng_t *rng)
{
    ob_t *b = a->b;
    int arms[OB_ARMS] = {OB_ARM_A, OB_ARM_B, OB_ARM_Z};
    int n_arms = b->zero ? 3 : 2;
    oa_clock_t c0[2], c1[2];
    uint64_t lo = b->next_id, hi;
    double kv_bytes = 0.0, unc;
    ob_row_t row;

    tokens[0] = 256;
    for (uint32_t t = 1; t < len; t++) {
        tokens[t] = 1 + (uint32_t)(epd_rng_next(rng) % 127);
    }
    for (int w = 0; w < 2; w++) {
        if (oa_clock_round(a, w, &c0[w]) != 0) {
            return -1;
        }
    }
    for (int w = 0; w < b->warmup; w++) {
        for (int k = 0; k < n_arms; k++) {
            if (epd__ob_request(b, tokens, len, arms[k], -1, 1, li) != 0) {
                return -1;
            }
        }
    }
    for (int r = 0; r < b->reps; r++) {
        for (int k = 0; k < n_arms; k++) {
            if (epd__ob_request(b, tokens, len, arms[(k + r) % n_arms], li * 100000 + r, 0, li) !=
                0) {
                return -1;
            }
        }
    }
    hi = b->next_id - 1;
    if (a->trace_out != NULL && a->trace_evs == NULL && len == a->trace_len) {
        /* the first counted B request of this length */
        for (int i = 0; i < b->n_reqs && a->trace_id == 0; i++) {
            if (b->reqs[i].arm == OB_ARM_B && !b->reqs[i].warmup) {
                a->trace_id = b->reqs[i].id;
            }
        }
        a->trace_evs = json_array();
    }
    for (int w = 0; w < 2; w++) {
        if (oa_clock_round(a, w, &c1[w]) != 0) {
            return -1;
        }
        oa_clock_merge(&c0[w], &c1[w], &a->clk[w]);
        if (oa_fetch(a, w, lo, hi) != 0) {
            return -1;
        }
    }
    if (a->trace_evs != NULL && a->trace_id != 0) {
        if (oa_trace_write(a) == 0) {
            printf("# trace of request %llu (%u tokens, prefill + transfer) -> %s\n",
                   (unsigned long long)a->trace_id, len, a->trace_out);
        } else {
            fprintf(stderr, "overhead: cannot write %s\n", a->trace_out);
        }
        a->trace_id = 0; /* once */
    }
    for (int i = 0; i < b->n_reqs; i++) {
        ob_req_t *r = &b->reqs[i];

        r->ok = r->p_recv > 0 && r->c_end > 0 && r->c_start > 0 &&
                (r->arm == OB_ARM_A || r->d_held > 0);
    }
    for (uint32_t l = 0; l < b->kv.n_layers; l++) {
        kv_bytes += epd__ob_layer_bytes(&b->kv, l, len);
    }
    unc = a->clk[OA_P].unc_ns + a->clk[OA_D].unc_ns;
    epd__ob_row(b, len, &row);
    if (b->tsv) {
        printf("%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.4f\t", (double)a->clk[OA_P].off_ns / 1e3,
               a->clk[OA_P].unc_ns / 1e3, (double)a->clk[OA_D].off_ns / 1e3,
               a->clk[OA_D].unc_ns / 1e3, unc / 1e3, kv_bytes / 1e6);
    }
    epd__ob_print_row(b, e, xp, len, &row);
    if (!b->tsv) {
        printf("%-28s clock vs here: prefill %+.1f us ±%.1f, decode %+.1f us ±%.1f; B, B-A, "
               "Z-A, msg, floor ±%.1f us (%.2f%% of A); KV %.2f MB\n",
               "", (double)a->clk[OA_P].off_ns / 1e3, a->clk[OA_P].unc_ns / 1e3,
               (double)a->clk[OA_D].off_ns / 1e3, a->clk[OA_D].unc_ns / 1e3, unc / 1e3,
               100.0 * unc / 1e6 / row.a_ms, kv_bytes / 1e6);
    }
    fflush(stdout);
    epd__ob_free_reqs(b);
    return 0;
}

int epd__ob_attach_wanted(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--attach-prefill") == 0 || strcmp(argv[i], "--attach-decode") == 0) {
            return 1;
        }
    }
    return 0;
}

int epd__ob_attach_main(int argc, char **argv)
{
    static ob_t b;
    static oa_t a;
    const char *secret_file = NULL, *data_addr = NULL;
    ob_engine_t eng;
    ob_xport_t xp;
    epd_rng_t rng;
    uint32_t *tokens = NULL, max_len = 0;
    char why[256];
    int rc = 1, found_len = 0;

    memset(&b, 0, sizeof(b));
    memset(&a, 0, sizeof(a));
    a.b = &b;
    b.attach = 1;
    b.lengths[0] = 128;
    b.lengths[1] = 1024;
    b.lengths[2] = 4096;
    b.n_lengths = 3;
    b.reps = 12;
    b.warmup = 1;
    b.zero = 1;
    b.probes = OB_PROBES_DEFAULT;
    b.trace_len = 1024;
    rc = epd__ob_parse_args(&b, argc, argv);
    if (rc >= 0) {
        return rc;
    }
    rc = 1;
    a.addr[OA_P] = b.attach_addr[0];
    a.addr[OA_D] = b.attach_addr[1];
    secret_file = b.attach_secret;
    data_addr = b.data_addr;
    a.probes = b.probes;
    a.trace_out = b.trace_out;
    a.trace_len = b.trace_len;
    if (a.addr[OA_P] == NULL || a.addr[OA_D] == NULL || secret_file == NULL) {
        fprintf(stderr, "overhead: the attach mode needs --attach-prefill, --attach-decode and "
                        "--cluster-secret-file\n");
        return 2;
    }
    if (epd_secret_load(secret_file, &b.secret, why, sizeof(why)) != EPD_OK) {
        fprintf(stderr, "overhead: cluster secret %s: %s\n", secret_file, why);
        return 1;
    }
    for (int i = 0; i < b.n_lengths; i++) {
        max_len = b.lengths[i] > max_len ? b.lengths[i] : max_len;
        found_len |= b.lengths[i] == a.trace_len;
    }
    if (!found_len) {
        a.trace_len = b.lengths[0]; /* as the one-host mode: the first length's */
    }
    b.txbuf = epd_malloc(1 << 20);
    tokens = epd_malloc(sizeof(*tokens) * (max_len + 1));
    if (b.txbuf == NULL || tokens == NULL) {
        goto out;
    }
    b.epoch_start = epd_time_wall_ns();
    b.epoch_nonce = epd_rng_entropy();
    b.next_id = ((uint64_t)(uint32_t)getpid() << 32) | 1;
    a.next_probe = OA_PROBE_BASE | ((uint64_t)(uint32_t)getpid() << 24);
    /* every folded time is after this (ob_row takes 0 for "not seen") */
    a.base_ns = epd_time_now_ns() - 1000000000ull;
    if (oa_health(&a) != 0 || oa_connect(&a, data_addr) != 0) {
        goto out;
    }
    /* where each recorder is now: our events come after */
    for (int w = 0; w < 2; w++) {
        a.cursor[w] = UINT64_MAX; /* past the end: the answer says where that is */
        if (oa_fetch(&a, w, 1, 0) != 0) {
            goto out;
        }
        a.cursor[w] = a.recorded;
        a.dropped0[w] = a.dropped;
        if (a.dropped > 0) {
            fprintf(stderr,
                    "overhead: %s's trace recorder is full (%" PRIu64 " events dropped): "
                    "restart it (--trace-events sets its size)\n",
                    oa_who[w], a.dropped);
            goto out;
        }
    }
    memset(&eng, 0, sizeof(eng));
    memset(&xp, 0, sizeof(xp));
    eng.name = b.pi.model[0] != '\0' ? b.pi.model : "?";
    xp.name = b.pi.transport;
    xp.backend = b.pi.transport;
    printf("# epd-bench overhead --attach: prefill '%s' at %s, decode '%s' at %s (%s, model %s,\n"
           "# %u layers); A = prefill only, B = prefill + KV transfer to decode, Z = the protocol\n"
           "# without the data; ms from prefill receiving the request to A: compute done, B/Z:\n"
           "# decode holding all KV, from the daemons' traces on this host's clock.  B-A: paired\n"
           "# median [95%% CI]; msg = LayerDone latency prefill -> decode (Z); GB/s = prefill's\n"
           "# writes into decode (B); floor = least B-A that link and compute allow; excess =\n"
           "# ovh - floor.  Cross-daemon times (B, B-A, Z-A, msg, floor) are uncertain by the\n"
           "# clocks' +-, printed under each row.\n",
           b.pi.worker_id, a.addr[OA_P], b.di.worker_id, a.addr[OA_D], b.pi.transport, eng.name,
           b.kv.n_layers);
    if (b.tsv) {
        printf("p_off_us\tp_unc_us\td_off_us\td_unc_us\tclock_unc_us\tkv_mb\t");
    }
    epd__ob_print_header(&b);
    epd_rng_seed(&rng, 42);
    for (int li = 0; li < b.n_lengths; li++) {
        if (oa_length(&a, &eng, &xp, b.lengths[li], li, tokens, &rng) != 0) {
            goto out;
        }
    }
    rc = 0;
out:
    epd__ob_free_reqs(&b);
    if (b.x != NULL) {
        epd_xport_ep_close(b.ep_p);
        epd_xport_ep_close(b.ep_d);
        epd_xport_destroy(b.x);
        b.x = NULL;
    }
    epd_free(tokens);
    epd_free(b.txbuf);
    json_decref(a.trace_evs);
    epd_secret_wipe(&b.secret);
    return rc;
}
