/*
 * epd_bench_serve.c — `epd-bench serve`: the serving benchmark.
 *
 * An open-loop load generator: requests arrive at a fixed mean rate
 * (Poisson: exponential gaps from a seeded generator), each with a prompt
 * and an output length drawn from a distribution ("N" or "A:B" uniform),
 * and are sent however many are still running (up to --max-inflight, past
 * which an arrival is counted as dropped, never delayed: delaying would
 * hide the queueing the benchmark exists to show).
 *
 * Two paths for the same workload (same arrivals, prompts, lengths,
 * seeds); by default (--phases ab) one run alternates arrivals between
 * them, so both see the same machine at the same time (this machine's
 * other load moves both alike), each at half the rate; --phases
 * router,direct runs them one after the other, each at the full rate:
 *   router  streaming POST /v1/completions to the router (plain sockets on
 *           libuv, HTTP/1.1 keep-alive, chunked SSE parsed as it comes):
 *           TTFT = first event carrying text, ITL = gaps between text
 *           events, E2E = `data: [DONE]`;
 *   direct  the same token ids (tokenized here with the same engine the
 *           router uses) straight to the prefill and decode workers with
 *           client/epd_client, driven from the same kind of loop:
 *           TTFT = first TokenChunk, ITL = gaps between chunks, E2E = the
 *           last chunk.
 * "What the router adds" is the difference of the two paths'
 * percentiles (TTFT and E2E, p50 and p99): the router's HTTP parsing,
 * tokenization, worker choice, SSE encoding and the extra loopback hop.
 * It is a difference of distributions, not a per-request span (the router
 * exports no per-request spans); the router's own TTFT histogram
 * (epd_router_ttft_seconds, read from /metrics before and after the run)
 * gives its mean, which splits the added time into the router's inside and
 * the HTTP/SSE hop.
 *
 * Long-mixed (--long-len L --long-every N): every N-th arrival's prompt is
 * L bytes instead (drawn after the others' values, so the short prompts
 * are those of the same run without it); the TTFT/ITL/E2E percentiles are
 * then the short prompts' alone — what the long ones cost them — and the
 * long ones get a line of their own.  With an own cluster, the sim model's
 * window and both pools grow to hold two long prompts, and
 * --prefill-chunk-tokens is given to the prefill worker (0: chunking off).
 *
 * Without --router the benchmark starts its own cluster from build/bin
 * (router + 1 prefill + 1 decode, engine sim with a small profile written
 * into a temp folder; --sim-model DIR to use another sim or ref model
 * folder), waits for the ready files and for both workers to be READY in
 * the router's Status, and stops every daemon at the end.  It prints a
 * table; it never judges.
 *
 * This file: the options, the phases' loop (arrivals launched from a 1 ms
 * timer) and the direct path; the router path, the cluster, the workload
 * and the table are files of their own (epd_bench_serve_int.h lists them).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <unistd.h>

#include <uv.h>

#include "epd_alloc.h"
#include "epd_bench.h"
#include "epd_bench_serve_int.h"
#include "epd_client.h"
#include "epd_config.h"
#include "epd_msg.h"
#include "epd_secret.h"

/* ------------------------------------------------------- direct (client) */

static void sv_on_client_event(void *arg, const epd_client_event_t *ev)
{
    sv_t *b = arg;
    sv_res_t *r = &b->dph->res[(uintptr_t)ev->user];
    uint64_t now = sv_now();

    if (r->done) {
        return;
    }
    if (ev->kind == EPD_CLIENT_EV_TOKENS) {
        if (ev->n_tokens > 0) {
            epd__sv_token_event(b->dph, r, now);
            r->n_tokens += ev->n_tokens;
        }
        if (ev->terminal) {
            if (ev->finish != EPD_CLIENT_FINISH_LENGTH && ev->finish != EPD_CLIENT_FINISH_STOP) {
                epd__sv_err(b->dph, r, epd_client_finish_name(ev->finish));
            }
            epd__sv_finish(b, r, now);
        }
        return;
    }
    if (ev->terminal) {
        char kind[48], ex[160];

        snprintf(kind, sizeof(kind), "%s", epd_status_string(ev->status));
        snprintf(ex, sizeof(ex), "%s: %s", ev->from, ev->message);
        epd__sv_err_ex(b->dph, r, kind, ex);
        epd__sv_finish(b, r, now);
    }
}

static void sv_direct_start(sv_t *b, uint32_t i)
{
    const sv_work_t *w = &b->work[i];
    sv_res_t *r = &b->dph->res[i];
    epd_client_request_t q;
    uint64_t t_send;
    epd_status_t st;

    memset(&q, 0, sizeof(q));
    q.prompt = (const uint32_t *)w->tokens;
    q.n_prompt = w->n_tokens;
    q.temperature = 0;
    q.top_p = 1;
    q.seed = w->seed >> 1;
    q.max_tokens = w->max_tokens;
    q.prefill = b->pw;
    q.decode = b->dw;
    q.deadline_ms = 60000;
    q.user = (void *)(uintptr_t)i;
    t_send = r->t_send != 0 ? r->t_send : sv_now();
    r->t_send = t_send;
    st = epd_client_submit(b->client, &q, NULL);
    if (st == EPD_ERR_NO_RESOURCE && b->n_deferred < b->n_work) {
        /* transport backpressure: retried after progress, the wait counts */
        r->t_send = t_send;
        b->deferred[(b->deferred_head + b->n_deferred) % b->n_work] = i;
        b->n_deferred++;
        return;
    }
    if (st != EPD_OK) {
        epd__sv_err(b->dph, r, epd_status_string(st));
        epd__sv_finish(b, r, sv_now());
    }
}

/* ------------------------------------------------------------ the phases */

static void sv_launch_due(sv_t *b)
{
    uint64_t now = sv_now();
    uint32_t n = b->n_deferred;

    /* backpressured submits first, in order (each goes back on the ring
     * if still refused) */
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = b->deferred[b->deferred_head];

        b->deferred_head = (b->deferred_head + 1) % b->n_work;
        b->n_deferred--;
        sv_direct_start(b, i);
    }
    while (b->next < b->n_work && b->t0 + b->work[b->next].at_ns <= now) {
        uint32_t i = b->next++;
        int direct = b->mode == 1 || (b->mode == 2 && (i & 1u));
        int second = (b->mode == 2 || b->mode == 3) && (i & 1u); /* odd arrivals: dph */
        sv_phase_t *ph = b->mode == 3 ? (second ? b->dph : b->hph) : direct ? b->dph : b->hph;

        if (b->mode == 2 || b->mode == 3) {
            (second ? b->hph : b->dph)->res[i].unused = 1;
        }
        b->inflight++;
        if (b->inflight > (uint32_t)b->max_inflight) {
            sv_res_t *r = &ph->res[i];

            ph->dropped++;
            epd__sv_err(ph, r, "dropped (max in flight)");
            epd__sv_finish(b, r, now);
            continue;
        }
        if (direct) {
            sv_direct_start(b, i);
        } else {
            epd__sv_http_start(b, i, ph);
        }
    }
}

/* A router connection closed: the arrivals that are due go now. */
static void sv_on_conn_close(void *arg)
{
    sv_launch_due(arg);
}

static void sv_stop_loop(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h) && h->type == UV_TIMER) {
        uv_close(h, NULL);
    }
}

static void sv_on_tick(uv_timer_t *t)
{
    sv_t *b = t->data;
    uint64_t now = sv_now();

    sv_launch_due(b);
    if (b->client != NULL) {
        epd_client_tick(b->client);
    }
    if ((b->next == b->n_work && b->inflight == 0) || now > b->hard_end) {
        for (int k = 0; k < 2; k++) {
            sv_phase_t *ph = k == 0 ? b->hph : b->dph;

            for (uint32_t i = 0; ph != NULL && i < b->n_work; i++) {
                if (!ph->res[i].done && !ph->res[i].unused && ph->res[i].t_send != 0) {
                    epd__sv_err(ph, &ph->res[i], "benchmark deadline");
                    epd__sv_finish(b, &ph->res[i], now);
                }
            }
            if (ph != NULL) {
                ph->t_end = now;
            }
        }
        uv_timer_stop(t);
        if (b->xuv != NULL) {
            epd_xport_uv_stop(b->xuv);
            b->xuv = NULL;
        }
        epd_bench_sse_close_all(b->sse);
        uv_walk(&b->loop, sv_stop_loop, NULL);
    }
}

/* Runs the workload once: mode 0 all through the router (hph), 1 all
 * direct (dph), 2 alternating (even arrivals router, odd direct), 3
 * alternating through the router (images: even arrivals with the encoder
 * pool, hph; odd ones encoded by prefill, dph). */
static int sv_run_phase(sv_t *b, int mode, sv_phase_t *hph, sv_phase_t *dph)
{
    int direct = mode == 1 || mode == 2;

    b->mode = mode;
    b->hph = hph;
    b->dph = dph;
    b->next = 0;
    b->deferred_head = 0;
    b->n_deferred = 0;
    b->inflight = 0;
    if (uv_loop_init(&b->loop) != 0) {
        return -1;
    }
    {
        epd_bench_sse_cbs_t cbs;

        epd__sv_http_cbs(b, &cbs);
        cbs.on_close = sv_on_conn_close;
        if (epd_bench_sse_create(&b->loop, (const struct sockaddr *)&b->addr, sizeof(b->addr), &cbs,
                                 &b->sse) != EPD_OK) {
            uv_loop_close(&b->loop);
            return -1;
        }
    }
    if (direct) {
        epd_client_config_t cc;
        epd_status_t st;

        epd_client_config_init(&cc);
        /* the longest prompt travels whole (BOS + one token a byte at most) */
        cc.max_msg_size = epd_msg_cap_for_context(SV_TEXT_BYTES / 2 + 1);
        cc.event_cb = sv_on_client_event;
        cc.cb_arg = b;
        cc.worker_id = "bench-serve";
        cc.secret = b->secret.bytes;
        cc.secret_len = b->secret.len;
        st = epd_client_create(&cc, &b->client);
        if (st == EPD_OK) {
            st = epd_client_add_worker(b->client, b->prefill_ctl, &b->pw);
        }
        if (st == EPD_OK) {
            st = epd_client_add_worker(b->client, b->decode_ctl, &b->dw);
        }
        if (st == EPD_OK) {
            st = epd_xport_uv_start(&b->loop, epd_client_xport(b->client), 10, &b->xuv);
        }
        if (st != EPD_OK) {
            fprintf(stderr, "serve: direct phase: cannot reach the workers %s / %s: %s\n",
                    b->prefill_ctl, b->decode_ctl, epd_status_string(st));
            epd_client_destroy(b->client);
            b->client = NULL;
            uv_loop_close(&b->loop);
            epd_bench_sse_destroy(b->sse);
            b->sse = NULL;
            return -1;
        }
    }
    uv_timer_init(&b->loop, &b->tick);
    b->tick.data = b;
    b->t0 = sv_now() + 20 * EPD_NSEC_PER_MSEC;
    if (hph != NULL) {
        hph->t0 = b->t0;
    }
    if (dph != NULL) {
        dph->t0 = b->t0;
    }
    b->hard_end = b->t0 + (uint64_t)(b->duration_s * 1e9) + 60 * EPD_NSEC_PER_SEC;
    uv_timer_start(&b->tick, sv_on_tick, 1, 1);
    uv_run(&b->loop, UV_RUN_DEFAULT);
    if (b->client != NULL) {
        epd_client_destroy(b->client);
        b->client = NULL;
    }
    uv_run(&b->loop, UV_RUN_DEFAULT);
    uv_loop_close(&b->loop);
    epd_bench_sse_destroy(b->sse); /* its connections closed with the loop */
    b->sse = NULL;
    return 0;
}

/* ------------------------------------------------------------------ main */

int epd_bench_serve_main(int argc, char **argv)
{
    static sv_t b;
    static const char *workload_help = "default";
    const char *ext_secret = NULL;
    sv_phase_t phs[2];
    double m_sum0 = 0, m_sum1 = 0;
    uint64_t m_count0 = UINT64_MAX, m_count1 = 0;
    int n_ph = 0;
    int rc = 1;
    const epd_opt_t opts[] = {
        {"router", EPD_OPT_STRING, &b.router, 0, 0,
         "the router's HTTP address HOST:PORT (absent: start a cluster from build/bin)"},
        {"prefill", EPD_OPT_STRING, &b.prefill_ctl, 0, 0,
         "with --router: a prefill worker's control address, for the direct phase"},
        {"decode", EPD_OPT_STRING, &b.decode_ctl, 0, 0,
         "with --router: a decode worker's control address, for the direct phase"},
        {"model", EPD_OPT_STRING, &b.model_dir, 0, 0,
         "with --router: the model folder (tokenizer of the direct phase)"},
        {"sim-model", EPD_OPT_STRING, &b.sim_model, 0, 0,
         "own cluster: this model folder instead of the built-in small sim profile"},
        {"engine", EPD_OPT_STRING, &b.engine_name, 0, 0, "the workers' engine: sim or ref"},
        {"model-name", EPD_OPT_STRING, &b.model_name, 0, 0, "the served model name"},
        {"rate", EPD_OPT_DOUBLE, &b.rate, 0, 0, "requests per second (Poisson arrivals)"},
        {"duration", EPD_OPT_DOUBLE, &b.duration_s, 0, 0, "seconds of arrivals per phase"},
        {"prompt-len", EPD_OPT_STRING, &b.prompt_len, 0, 0,
         "prompt bytes (= tokens - 1, byte tokenizer): N or A:B uniform"},
        {"output-len", EPD_OPT_STRING, &b.output_len, 0, 0, "max_tokens: N or A:B uniform"},
        {"phases", EPD_OPT_STRING, &b.phases, 0, 0,
         "router, direct, router,direct (one after the other, each at --rate) or ab (one run, "
         "arrivals alternating between the two paths: each gets half the rate)"},
        {"max-inflight", EPD_OPT_INT, &b.max_inflight, 1, 1 << 20,
         "requests outstanding at most (later arrivals are dropped and counted)"},
        {"warmup", EPD_OPT_INT, &b.warmup, 0, 1 << 30, "first requests of a phase not counted"},
        {"seed", EPD_OPT_INT, &b.seed, 0, 1e15, "workload seed"},
        {"chat", EPD_OPT_BOOL, &b.chat, 0, 0, "POST /v1/chat/completions instead of completions"},
        {"keep", EPD_OPT_BOOL, &b.keep, 0, 0, "keep the cluster's temp folder (logs)"},
        {"images", EPD_OPT_INT, &b.n_images, 0, 100000,
         "multimodal mix: every request a chat with one PNG drawn from N distinct images per "
         "path; paths encoders vs local (prefill encodes) alternate; own cluster: ref with "
         "vision + 1 encoder (0: text requests)"},
        {"image-size", EPD_OPT_INT, &b.image_size, 8, 4096, "the images' width and height"},
        {"long-len", EPD_OPT_INT, &b.long_len, 0, SV_TEXT_BYTES / 2 - 1,
         "long-mixed workload: the long prompts' bytes (= tokens - 1); own cluster: the sim "
         "model's context and the pools grow to hold two"},
        {"long-every", EPD_OPT_INT, &b.long_every, 0, 1 << 30,
         "every N-th arrival is a --long-len prompt (0: none); TTFT/E2E percentiles are then "
         "the other prompts', the long ones get their own line"},
        {"prefill-chunk-tokens", EPD_OPT_INT, &b.chunk_tokens, -1, 1 << 24,
         "own cluster: prefill's --prefill-chunk-tokens (0: off; -1: the engine's default)"},
        {"no-prefix-cache", EPD_OPT_BOOL, &b.no_prefix_cache, 0, 0,
         "own cluster: prefill without its prefix cache (long prompts then evict nothing into "
         "its host tier)"},
        {"trace-dir", EPD_OPT_STRING, &b.trace_dir, 0, 0,
         "own cluster: the router, prefill and decode write their Chrome traces (--trace) to "
         "router.json, prefill.json and decode.json in this existing folder at exit"},
        {"workload", EPD_OPT_STRING, &workload_help, 0, 0,
         "shared-prefix: the prefix cache off vs on, its own options (--workload shared-prefix "
         "--help)"},
        {"cluster-secret-file", EPD_OPT_STRING, &ext_secret, 0, 0,
         "with --router: the cluster's secret (Status calls and the direct phase); an own "
         "cluster gets a fresh one"},
    };
    epd_opts_t o = {.prog = "epd-bench serve",
                    .summary = "serving load (Poisson arrivals) through the router vs straight "
                               "to the workers: TTFT, ITL, E2E, throughput, errors",
                    .opts = opts,
                    .n_opts = sizeof(opts) / sizeof(opts[0])};
    epd_status_t status;
    int argi;

    memset(&b, 0, sizeof(b));
    memset(phs, 0, sizeof(phs));
    b.engine_name = "sim";
    b.model_name = "bench-sim";
    b.rate = 200;
    b.duration_s = 20;
    b.prompt_len = "16:128";
    b.output_len = "4:16";
    b.phases = "ab";
    b.max_inflight = 4096;
    b.warmup = 200;
    b.seed = 1;
    b.image_size = 224;
    b.chunk_tokens = -1;
    signal(SIGPIPE, SIG_IGN);
    for (int k = 1; k < argc; k++) {
        /* the prefix-cache workloads are their own benchmark */
        if (strncmp(argv[k], "--workload", 10) == 0) {
            return epd_bench_prefix_main(argc, argv);
        }
    }
    status = epd_opts_parse(&o, argc, argv, &argi);
    if (status != EPD_OK) {
        epd_opts_cleanup(&o);
        return status == EPD_ERR_CANCELED ? 0 : 2;
    }
    if (argi != argc || !(b.rate > 0) || !(b.duration_s > 0)) {
        fprintf(stderr, "serve: --rate and --duration must be > 0 (see --help)\n");
        goto out;
    }
    if (epd_bench_bindir(b.bindir, sizeof(b.bindir)) != 0) {
        goto out;
    }
    if (b.n_images > 0) {
        /* the multimodal mix: ref with its vision encoder, chat, both
         * router paths interleaved; a lighter default load */
        int rate_given = 0, dur_given = 0, warm_given = 0;

        for (int k = 1; k < argc; k++) {
            rate_given |= strncmp(argv[k], "--rate", 6) == 0;
            dur_given |= strncmp(argv[k], "--duration", 10) == 0;
            warm_given |= strncmp(argv[k], "--warmup", 8) == 0;
        }
        if (!rate_given) {
            b.rate = 8;
        }
        if (!dur_given) {
            b.duration_s = 30;
        }
        if (!warm_given) {
            b.warmup = 8;
        }
        if (strcmp(b.engine_name, "sim") == 0) {
            b.engine_name = "ref";
        }
        if (strcmp(b.model_name, "bench-sim") == 0) {
            b.model_name = "bench-vlm";
        }
        if (strcmp(b.prompt_len, "16:128") == 0) {
            b.prompt_len = "16:64";
        }
        b.phases = "ab";
        if (epd__sv_images_make(&b) != 0) {
            fprintf(stderr, "serve: cannot make the images\n");
            goto out;
        }
    }
    if (epd__sv_workload(&b) != 0) {
        goto out;
    }
    if (b.router == NULL) {
        if (epd__sv_cluster_start(&b) != 0) {
            goto out_cluster;
        }
    } else if (ext_secret != NULL) {
        char why[256];

        if (epd_secret_load(ext_secret, &b.secret, why, sizeof(why)) != EPD_OK) {
            fprintf(stderr, "serve: --cluster-secret-file: %s\n", why);
            goto out;
        }
    }
    {
        const char *colon = strrchr(b.router, ':');
        char host[64];

        if (colon == NULL || (size_t)(colon - b.router) >= sizeof(host)) {
            fprintf(stderr, "serve: --router wants HOST:PORT\n");
            goto out_cluster;
        }
        snprintf(host, sizeof(host), "%.*s", (int)(colon - b.router), b.router);
        if (uv_ip4_addr(host, atoi(colon + 1), &b.addr) != 0) {
            fprintf(stderr, "serve: --router %s: not an IPv4 address\n", b.router);
            goto out_cluster;
        }
    }
    {
        int ab = strcmp(b.phases, "ab") == 0;
        int want_r = ab || strstr(b.phases, "router") != NULL;
        int want_d = ab || strstr(b.phases, "direct") != NULL;

        if (!want_r && !want_d) {
            fprintf(stderr, "serve: --phases wants router, direct, router,direct or ab\n");
            goto out_cluster;
        }
        if (b.n_images > 0) {
            (void)epd__sv_metrics_get(&b, epd__sv_img_metrics, 6, b.img0, NULL);
            fprintf(stderr,
                    "serve: images: encoders and local interleaved, %u requests at "
                    "%.1f/s\n",
                    b.n_work, b.rate);
            if (epd__sv_phase_init(&b, &phs[0], "encoders") == 0 &&
                epd__sv_phase_init(&b, &phs[1], "local") == 0 &&
                sv_run_phase(&b, 3, &phs[0], &phs[1]) == 0) {
                n_ph = 2;
            }
            (void)epd__sv_metrics_get(&b, epd__sv_img_metrics, 6, b.img1, NULL);
            want_r = want_d = ab = 0;
        }
        if (want_d && (b.prefill_ctl == NULL || b.decode_ctl == NULL || b.model_dir == NULL)) {
            fprintf(stderr, "serve: the direct path needs --prefill, --decode and --model with "
                            "--router: skipped\n");
            want_d = 0;
            ab = 0;
        }
        if (want_d && epd__sv_tokenize(&b) != 0) {
            goto out_cluster;
        }
        if (want_r && epd__sv_metrics_ttft(&b, &m_sum0, &m_count0) != 0) {
            m_count0 = UINT64_MAX; /* no /metrics: the line is left out */
        }
        if (ab) {
            fprintf(stderr, "serve: router and direct interleaved: %u requests at %.0f/s\n",
                    b.n_work, b.rate);
            if (epd__sv_phase_init(&b, &phs[0], "router") == 0 &&
                epd__sv_phase_init(&b, &phs[1], "direct") == 0 &&
                sv_run_phase(&b, 2, &phs[0], &phs[1]) == 0) {
                n_ph = 2;
            }
        } else {
            if (want_r) {
                fprintf(stderr, "serve: router phase: %u requests at %.0f/s\n", b.n_work, b.rate);
                if (epd__sv_phase_init(&b, &phs[n_ph], "router") == 0 &&
                    sv_run_phase(&b, 0, &phs[n_ph], NULL) == 0) {
                    n_ph++;
                }
            }
            if (want_d) {
                fprintf(stderr, "serve: direct phase: %u requests at %.0f/s\n", b.n_work, b.rate);
                if (epd__sv_phase_init(&b, &phs[n_ph], "direct") == 0 &&
                    sv_run_phase(&b, 1, NULL, &phs[n_ph]) == 0) {
                    n_ph++;
                }
            }
        }
    }
    if (m_count0 != UINT64_MAX && epd__sv_metrics_ttft(&b, &m_sum1, &m_count1) == 0 &&
        m_count1 > m_count0) {
        b.m_sum = m_sum1 - m_sum0;
        b.m_count = m_count1 - m_count0;
    }
    if (n_ph > 0) {
        epd__sv_print(&b, phs, n_ph);
        rc = 0;
    }
    if (rc == 0 && b.n_images > 0 && b.enc_ctl_buf[0] != '\0') {
        /* the encoder alone, saturated: images/s at a few in flight */
        char exe[PATH_MAX + 32], w[16], cmd[4 * PATH_MAX + 256];

        snprintf(exe, sizeof(exe), "%s/epd-encoder-load", b.bindir);
        snprintf(w, sizeof(w), "%lld", (long long)b.image_size);
        snprintf(cmd, sizeof(cmd),
                 "'%s' --encoder %s --images 100 --inflight 4 --width %s --height %s --format png "
                 "--cluster-secret-file '%s' "
                 "2>&1 | sed 's/^/encoder alone (epd-encoder-load, 4 in flight): /'",
                 exe, b.enc_ctl_buf, w, w, b.secret_file);
        fflush(stdout);
        if (system(cmd) != 0) {
            fprintf(stderr, "serve: epd-encoder-load failed\n");
        }
    }
    for (int k = 0; k < 2; k++) {
        epd_free(phs[k].res);
        epd_free(phs[k].itl_us);
    }
out_cluster:
    epd__sv_cluster_stop(&b);
    if (b.tmp[0] != '\0' && rc == 0 && !b.keep) {
        char cmd[PATH_MAX + 16];

        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", b.tmp);
        if (system(cmd) != 0) {
            fprintf(stderr, "serve: could not remove %s\n", b.tmp);
        }
    } else if (b.tmp[0] != '\0') {
        fprintf(stderr, "serve: logs kept in %s\n", b.tmp);
    }
out:
    if (b.work != NULL) {
        for (uint32_t i = 0; i < b.n_work; i++) {
            epd_free(b.work[i].tokens);
        }
    }
    epd_free(b.work);
    epd_free(b.deferred);
    epd_free(b.text);
    epd__sv_images_free(&b);
    epd_secret_wipe(&b.secret);
    epd_opts_cleanup(&o);
    return rc;
}
