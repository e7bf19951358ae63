/*
 * epd_bench_prefix.c — `epd-bench serve --workload shared-prefix`: what the
 * prefix cache buys (docs/prefix-cache.md).
 *
 * For each model (text: attention only; hybrid: linear + attention) and
 * each cache setting — off (both workers --no-prefix-cache), prefill (its
 * prefix cache on, decode-side reuse off), on (both) — a fresh prefill and
 * decode worker pair from build/bin and
 * two workloads, run one request at a time (closed loop: TTFT is the
 * prefill's work, not queueing behind earlier prompts):
 *   shared-prefix  a system prompt of --system-len bytes, then --questions
 *                  short questions after it (each its own request);
 *   multi-turn     --chats conversations of --turns turns: each turn's
 *                  prompt is the whole conversation so far (the system
 *                  prompt, every question and every answer, the answers
 *                  being the tokens the cluster generated) plus a new
 *                  question.
 * Requests go straight to the two workers (client/epd_client, token ids,
 * the router's chat template), greedy, --max-tokens each.  Per row: TTFT
 * p50 / p99 (submit -> first token), prompt tokens, prefill tokens
 * computed (the prefill's Load.prefix counters; with the cache off every
 * prompt token), KV bytes the prefill wrote to decode (Load.kv_bytes_sent)
 * and the hit ratio (prefill's); then TTFT p50 with both over without.  It prints
 * a table; it never judges.
 */
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <uv.h>

#include "epd_alloc.h"
#include "epd_bench.h"
#include "epd_client.h"
#include "epd_config.h"
#include "epd_log.h"
#include "epd_msg.h"
#include "epd_rpc.h"
#include "epd_time.h"
#include "epd_xport_uv.h"

#define PB_MAX_PROMPT 16384

typedef struct {
    /* options */
    const char *models;
    int64_t system_len, questions, chats, turns, max_tokens, block_tokens;
    const char *question_len;
    int64_t seed;
    int keep;
    char bindir[PATH_MAX];
    char tmp[PATH_MAX];
    /* a running pair */
    pid_t pids[2];
    char p_ctl[64], d_ctl[64];
    /* the client and the request in flight */
    uv_loop_t loop;
    uv_timer_t tick;
    epd_client_t *client;
    epd_client_worker_t *pw, *dw;
    epd_xport_uv_t *xuv;
    int done;
    uint64_t t_first;
    char err[200];
    uint32_t out[1024];
    uint32_t n_out;
} pb_t;

/* One row of the table. */
typedef struct {
    const char *model, *workload, *cache;
    double *ttft_ms;
    uint32_t n;
    uint64_t prompt_tokens, computed, hit, kv_bytes;
} pb_row_t;

/* ------------------------------------------------------------- counters */

typedef struct {
    uint64_t kv_bytes_sent, prompt_tokens, hit_tokens, computed_tokens;
} pb_counts_t;

/* The prefill's counters from its Health answer. */
static int pb_counts(const pb_t *b, pb_counts_t *c)
{
    epd_rpc_client_t *rc = NULL;
    void *resp = NULL;
    size_t len = 0;
    ProtobufCMessage *m = NULL;
    int rv = -1;

    memset(c, 0, sizeof(*c));
    if (epd_rpc_client_create(b->p_ctl, &rc) != EPD_OK) {
        return -1;
    }
    if (epd_rpc_call(rc, EPD_RPC_HEALTH, NULL, 0, 3000, &resp, &len, NULL, 0) == EPD_OK &&
        epd_proto_unpack(&epd__health_response__descriptor, resp, len, &m) == EPD_OK) {
        const Epd__HealthResponse *h = (const Epd__HealthResponse *)m;

        if (h->load != NULL) {
            c->kv_bytes_sent = h->load->kv_bytes_sent;
            if (h->load->prefix != NULL) {
                c->prompt_tokens = h->load->prefix->prompt_tokens;
                c->hit_tokens = h->load->prefix->hit_tokens;
                c->computed_tokens = h->load->prefix->computed_tokens;
            }
            rv = 0;
        }
        epd_proto_free(m);
    }
    epd_free(resp);
    epd_rpc_client_destroy(rc);
    return rv;
}

/* ------------------------------------------------------------ processes */

/* Runs epd-mkmodel ARGS... into the temp folder; 0 on success. */
static int pb_mkmodel(pb_t *b, char *const argv[])
{
    char log[PATH_MAX + 16];
    pid_t pid;
    int status = 0;

    snprintf(log, sizeof(log), "%s/mkmodel.log", b->tmp);
    pid = epd_bench_spawn(argv, log);
    if (pid < 0 || epd_bench_reap(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
        fprintf(stderr, "serve: epd-mkmodel failed (log: %s)\n", log);
        return -1;
    }
    return 0;
}

/* Starts decode and prefill on `model`: cache 0 both caches off, 1 the
 * prefill's prefix cache only, 2 that and decode-side reuse. */
static int pb_pair_start(pb_t *b, const char *model, const char *tag, int cache)
{
    char dexe[PATH_MAX + 32], pexe[PATH_MAX + 32], bt[16];
    char dready[PATH_MAX + 64], pready[PATH_MAX + 64], dlog[PATH_MAX + 64], plog[PATH_MAX + 64];

    snprintf(dexe, sizeof(dexe), "%s/epd-decode", b->bindir);
    snprintf(pexe, sizeof(pexe), "%s/epd-prefill", b->bindir);
    snprintf(bt, sizeof(bt), "%lld", (long long)b->block_tokens);
    snprintf(dready, sizeof(dready), "%s/%s-decode.ready", b->tmp, tag);
    snprintf(pready, sizeof(pready), "%s/%s-prefill.ready", b->tmp, tag);
    snprintf(dlog, sizeof(dlog), "%s/%s-decode.log", b->tmp, tag);
    snprintf(plog, sizeof(plog), "%s/%s-prefill.log", b->tmp, tag);
    {
        /* up front in every arm: decode-side reuse is an up-front worker's */
        char *argv[] = {dexe,           "--model",       (char *)model, "--worker-id",
                        "decode-0",     "--ready-file",  dready,        "--kv-blocks",
                        "8192",         "--state-slots", "64",          "--block-tokens",
                        bt,             cache == 2 ? "--prefix-cache" : "--no-prefix-cache",
                        "--kv-reserve", "upfront",       "--log-level", "warn",
                        NULL};

        b->pids[0] = epd_bench_spawn(argv, dlog);
    }
    {
        char *argv[] = {pexe,         "--model",       (char *)model,
                        "--worker-id", "prefill-0",    "--ready-file",
                        pready,       "--kv-blocks",   "4096",
                        "--state-slots", "16",         "--block-tokens",
                        bt,           cache ? "--prefix-cache" : "--no-prefix-cache",
                        "--log-level", "warn",         NULL};

        b->pids[1] = epd_bench_spawn(argv, plog);
    }
    if (b->pids[0] < 0 || b->pids[1] < 0 ||
        epd_bench_wait_ready(dready, b->pids[0], "control", b->d_ctl, sizeof(b->d_ctl)) != 0 ||
        epd_bench_wait_ready(pready, b->pids[1], "control", b->p_ctl, sizeof(b->p_ctl)) != 0) {
        fprintf(stderr, "serve: a worker did not start (logs: %s, %s)\n", plog, dlog);
        return -1;
    }
    return 0;
}

static void pb_pair_stop(pb_t *b)
{
    epd_bench_kill(b->pids[1], "prefix", "prefill");
    epd_bench_kill(b->pids[0], "prefix", "decode");
    b->pids[0] = b->pids[1] = 0;
}

/* --------------------------------------------------------------- client */

static void pb_on_event(void *arg, const epd_client_event_t *ev)
{
    pb_t *b = arg;

    if (b->done) {
        return;
    }
    if (ev->kind == EPD_CLIENT_EV_TOKENS) {
        if (ev->n_tokens > 0 && b->t_first == 0) {
            b->t_first = epd_time_now_ns();
        }
        for (uint32_t i = 0; i < ev->n_tokens && b->n_out < sizeof(b->out) / sizeof(b->out[0]);
             i++) {
            b->out[b->n_out++] = ev->tokens[i];
        }
        b->done = ev->terminal;
        return;
    }
    if (ev->terminal) {
        snprintf(b->err, sizeof(b->err), "%s from %s: %s", epd_status_string(ev->status), ev->from,
                 ev->message);
        b->done = 1;
    }
}

static void pb_on_tick(uv_timer_t *t)
{
    pb_t *b = t->data;

    epd_client_tick(b->client);
}

static int pb_client_start(pb_t *b)
{
    epd_client_config_t cc;
    epd_status_t st;

    if (uv_loop_init(&b->loop) != 0) {
        return -1;
    }
    epd_client_config_init(&cc);
    cc.event_cb = pb_on_event;
    cc.cb_arg = b;
    cc.worker_id = "bench-prefix";
    st = epd_client_create(&cc, &b->client);
    if (st == EPD_OK) {
        st = epd_client_add_worker(b->client, b->p_ctl, &b->pw);
    }
    if (st == EPD_OK) {
        st = epd_client_add_worker(b->client, b->d_ctl, &b->dw);
    }
    if (st == EPD_OK) {
        st = epd_xport_uv_start(&b->loop, epd_client_xport(b->client), 10, &b->xuv);
    }
    if (st != EPD_OK) {
        fprintf(stderr, "serve: cannot reach the workers %s / %s: %s\n", b->p_ctl, b->d_ctl,
                epd_status_string(st));
        epd_client_destroy(b->client);
        b->client = NULL;
        uv_loop_close(&b->loop);
        return -1;
    }
    uv_timer_init(&b->loop, &b->tick);
    b->tick.data = b;
    uv_timer_start(&b->tick, pb_on_tick, 1, 1);
    return 0;
}

static void pb_close_walk(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h)) {
        uv_close(h, NULL);
    }
}

static void pb_client_stop(pb_t *b)
{
    uv_timer_stop(&b->tick);
    epd_xport_uv_stop(b->xuv);
    b->xuv = NULL;
    epd_client_destroy(b->client);
    b->client = NULL;
    uv_walk(&b->loop, pb_close_walk, NULL);
    uv_run(&b->loop, UV_RUN_DEFAULT);
    uv_loop_close(&b->loop);
}

/* One request, to its end: its TTFT in ms (< 0 on failure); the tokens it
 * generated in b->out[0..n_out). */
static double pb_request(pb_t *b, const int32_t *prompt, uint32_t n)
{
    epd_client_request_t q;
    uint64_t t0, deadline;

    memset(&q, 0, sizeof(q));
    q.prompt = (const uint32_t *)prompt;
    q.n_prompt = n;
    q.temperature = 0;
    q.top_p = 1;
    q.max_tokens = (uint32_t)b->max_tokens;
    q.prefill = b->pw;
    q.decode = b->dw;
    q.deadline_ms = 300000;
    b->done = 0;
    b->t_first = 0;
    b->n_out = 0;
    b->err[0] = '\0';
    t0 = epd_time_now_ns();
    deadline = t0 + 300 * EPD_NSEC_PER_SEC;
    if (epd_client_submit(b->client, &q, NULL) != EPD_OK) {
        fprintf(stderr, "serve: submit refused\n");
        return -1;
    }
    while (!b->done && epd_time_now_ns() < deadline) {
        uv_run(&b->loop, UV_RUN_ONCE);
    }
    if (!b->done || b->err[0] != '\0' || b->t_first == 0) {
        fprintf(stderr, "serve: request failed: %s\n", b->done ? b->err : "timeout");
        return -1;
    }
    return (double)(b->t_first - t0) / 1e6;
}

/* ------------------------------------------------------------- workload */

static uint64_t pb_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Appends text to tokens[*n..] (byte tokenizer: a token per byte). */
static void pb_put(int32_t *tokens, uint32_t *n, const char *text, size_t len)
{
    for (size_t i = 0; i < len && *n < PB_MAX_PROMPT; i++) {
        tokens[(*n)++] = (unsigned char)text[i];
    }
}

static void pb_text(char *out, size_t len, uint64_t *s)
{
    static const char chars[] = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ.,;0123456789 "
                                "the and of ";

    for (size_t i = 0; i < len; i++) {
        out[i] = chars[pb_rand(s) % (sizeof(chars) - 1)];
    }
}

static uint32_t pb_qlen(const pb_t *b, uint64_t *s)
{
    unsigned lo = 16, hi = 64;

    if (sscanf(b->question_len, "%u:%u", &lo, &hi) != 2 && sscanf(b->question_len, "%u", &lo) == 1) {
        hi = lo;
    }
    if (hi < lo) {
        hi = lo;
    }
    return lo + (uint32_t)(pb_rand(s) % (hi - lo + 1));
}

/* The p-th percentile (p in percent) of a row's TTFTs: nearest rank, as
 * every epd-bench table (sorts them in place); 0 when there are none. */
static double pb_pct(double *v, uint32_t n, double p)
{
    if (n == 0) {
        return 0;
    }
    epd_bench_sort(v, n);
    return epd_bench_pct(v, n, p);
}

/* Both workloads on a running pair: rows[0] shared-prefix, rows[1]
 * multi-turn.  0 or -1. */
static int pb_run(pb_t *b, int cache, pb_row_t rows[2])
{
    char sys[PB_MAX_PROMPT];
    char q[256];
    int32_t *tok = epd_malloc(PB_MAX_PROMPT * sizeof(int32_t));
    uint32_t n = 0;
    uint64_t s = (uint64_t)b->seed * 2654435761u + 1;
    pb_counts_t c0, c1;
    int rv = -1;
    static const char sys_head[] = "<|system|>\n";
    static const char user_head[] = "\n<|user|>\n";
    static const char asst_head[] = "\n<|assistant|>\n";

    if (tok == NULL || b->system_len >= PB_MAX_PROMPT / 2) {
        epd_free(tok);
        return -1;
    }
    pb_text(sys, (size_t)b->system_len, &s);
    for (int w = 0; w < 2; w++) {
        pb_row_t *r = &rows[w];
        uint32_t total = w == 0 ? (uint32_t)b->questions : (uint32_t)(b->chats * b->turns);
        uint64_t cs = s;

        r->cache = cache == 0 ? "off" : cache == 1 ? "prefill" : "on";
        r->workload = w == 0 ? "shared-prefix" : "multi-turn";
        r->ttft_ms = epd_calloc(total, sizeof(double));
        r->n = 0;
        if (r->ttft_ms == NULL || pb_counts(b, &c0) != 0) {
            goto out;
        }
        for (uint32_t k = 0; k < total; k++) {
            uint32_t turn = w == 0 ? 0 : k % (uint32_t)b->turns;
            uint32_t qn = pb_qlen(b, &cs);
            double ms;

            if (turn == 0) {
                /* a new conversation: BOS, the system prompt */
                n = 0;
                tok[n++] = 256;
                pb_put(tok, &n, sys_head, sizeof(sys_head) - 1);
                pb_put(tok, &n, sys, (size_t)b->system_len);
            }
            pb_text(q, qn, &cs);
            pb_put(tok, &n, user_head, sizeof(user_head) - 1);
            pb_put(tok, &n, q, qn);
            pb_put(tok, &n, asst_head, sizeof(asst_head) - 1);
            if (n + (uint32_t)b->max_tokens >= PB_MAX_PROMPT) {
                fprintf(stderr, "serve: a conversation outgrew %d tokens\n", PB_MAX_PROMPT);
                goto out;
            }
            ms = pb_request(b, tok, n);
            if (ms < 0) {
                goto out;
            }
            r->ttft_ms[r->n++] = ms;
            r->prompt_tokens += n;
            if (w == 1) {
                /* the answer becomes part of the conversation (not EOS) */
                for (uint32_t i = 0; i < b->n_out && n < PB_MAX_PROMPT; i++) {
                    if (b->out[i] < 256) {
                        tok[n++] = (int32_t)b->out[i];
                    }
                }
            } else {
                n -= qn + (uint32_t)(sizeof(user_head) - 1 + sizeof(asst_head) - 1);
            }
        }
        if (pb_counts(b, &c1) != 0) {
            goto out;
        }
        r->kv_bytes = c1.kv_bytes_sent - c0.kv_bytes_sent;
        r->hit = c1.hit_tokens - c0.hit_tokens;
        /* with the cache off every prompt token is computed */
        r->computed = cache ? c1.computed_tokens - c0.computed_tokens : r->prompt_tokens;
    }
    rv = 0;
out:
    epd_free(tok);
    return rv;
}

/* ------------------------------------------------------------------ main */

static void pb_print(const pb_row_t *rows, int n_rows)
{
    printf("%-7s %-13s %-7s %5s | %10s %10s | %9s %9s %7s | %9s\n", "model", "workload", "cache",
           "reqs", "ttft_p50", "ttft_p99", "prompt", "computed", "hit", "kv_MB");
    for (int i = 0; i < n_rows; i++) {
        const pb_row_t *r = &rows[i];

        printf("%-7s %-13s %-7s %5u | %10.2f %10.2f | %9llu %9llu %6.1f%% | %9.2f\n", r->model,
               r->workload, r->cache, r->n, pb_pct(r->ttft_ms, r->n, 50),
               pb_pct(r->ttft_ms, r->n, 99), (unsigned long long)r->prompt_tokens,
               (unsigned long long)r->computed,
               r->prompt_tokens > 0 ? 100.0 * (double)r->hit / (double)r->prompt_tokens : 0.0,
               (double)r->kv_bytes / 1e6);
    }
    printf("TTFT p50 with both caches / without (ms):\n");
    for (int i = 0; i + 2 < n_rows; i++) {
        const pb_row_t *off = &rows[i], *on = &rows[i + 2];

        if (strcmp(off->model, on->model) == 0 && strcmp(off->workload, on->workload) == 0 &&
            strcmp(off->cache, "off") == 0 && strcmp(on->cache, "on") == 0) {
            double a = pb_pct(off->ttft_ms, off->n, 50), c = pb_pct(on->ttft_ms, on->n, 50);

            printf("  %-7s %-13s %.2f / %.2f = %.3f\n", on->model, on->workload, c, a,
                   a > 0 ? c / a : 0.0);
        }
    }
}

int epd_bench_prefix_main(int argc, char **argv)
{
    static pb_t b;
    pb_row_t rows[12];
    int n_rows = 0;
    const char *workload = NULL;
    int rc = 1;
    const epd_opt_t opts[] = {
        {"workload", EPD_OPT_STRING, &workload, 0, 0, "shared-prefix (this benchmark)"},
        {"models", EPD_OPT_STRING, &b.models, 0, 0,
         "text (epd-mkmodel --layer-pattern A), hybrid (the default LLA), or text,hybrid"},
        {"system-len", EPD_OPT_INT, &b.system_len, 1, PB_MAX_PROMPT / 2 - 1,
         "bytes of the shared system prompt (tokens, byte tokenizer)"},
        {"questions", EPD_OPT_INT, &b.questions, 1, 100000, "shared-prefix: questions"},
        {"question-len", EPD_OPT_STRING, &b.question_len, 0, 0, "bytes of a question: N or A:B"},
        {"chats", EPD_OPT_INT, &b.chats, 0, 10000, "multi-turn: conversations"},
        {"turns", EPD_OPT_INT, &b.turns, 1, 1000, "multi-turn: turns per conversation"},
        {"max-tokens", EPD_OPT_INT, &b.max_tokens, 1, 1000, "tokens generated per request"},
        {"block-tokens", EPD_OPT_INT, &b.block_tokens, 1, 4096, "the workers' KV block size"},
        {"seed", EPD_OPT_INT, &b.seed, 0, 1e15, "workload seed"},
        {"keep", EPD_OPT_BOOL, &b.keep, 0, 0, "keep the temp folder (models, logs)"},
    };
    epd_opts_t o = {.prog = "epd-bench serve --workload shared-prefix",
                    .summary = "prefix caches off / prefill only / prefill and decode: a shared system "
                               "prompt, multi-turn chats",
                    .opts = opts,
                    .n_opts = sizeof(opts) / sizeof(opts[0])};
    epd_status_t st;
    int argi;

    memset(&b, 0, sizeof(b));
    memset(rows, 0, sizeof(rows));
    b.models = "text,hybrid";
    b.system_len = 2047; /* + BOS = 2048 tokens */
    b.questions = 16;
    b.question_len = "16:64";
    b.chats = 4;
    b.turns = 4;
    b.max_tokens = 16;
    b.block_tokens = 16;
    b.seed = 1;
    signal(SIGPIPE, SIG_IGN);
    if (getenv("EPD_LOG_LEVEL") == NULL) {
        epd_log_set_level(EPD_LOG_WARN); /* the client's connection lines */
    }
    st = epd_opts_parse(&o, argc, argv, &argi);
    if (st != EPD_OK) {
        epd_opts_cleanup(&o);
        return st == EPD_ERR_CANCELED ? 0 : 2;
    }
    if (argi != argc || workload == NULL || strcmp(workload, "shared-prefix") != 0) {
        fprintf(stderr, "serve: --workload shared-prefix (see --help)\n");
        goto out;
    }
    if (epd_bench_bindir(b.bindir, sizeof(b.bindir)) != 0) {
        goto out;
    }
    snprintf(b.tmp, sizeof(b.tmp), "/tmp/epd-prefix.XXXXXX");
    if (mkdtemp(b.tmp) == NULL) {
        goto out;
    }
    for (int m = 0; m < 2; m++) {
        const char *name = m == 0 ? "text" : "hybrid";
        char mk[PATH_MAX + 32], dir[PATH_MAX + 32];

        if (strstr(b.models, name) == NULL) {
            continue;
        }
        snprintf(mk, sizeof(mk), "%s/epd-mkmodel", b.bindir);
        snprintf(dir, sizeof(dir), "%s/%s", b.tmp, name);
        {
            char *text_argv[] = {mk, "--out", dir, "--vision", "0", "--layer-pattern", "A", NULL};
            char *hyb_argv[] = {mk, "--out", dir, "--vision", "0", NULL};

            if (pb_mkmodel(&b, m == 0 ? text_argv : hyb_argv) != 0) {
                goto out;
            }
        }
        for (int cache = 0; cache < 3; cache++) {
            static const char *const what[3] = {"off", "prefill only", "prefill and decode"};
            char tag[32];

            snprintf(tag, sizeof(tag), "%s-%d", name, cache);
            fprintf(stderr, "serve: %s model, prefix cache %s\n", name, what[cache]);
            if (pb_pair_start(&b, dir, tag, cache) != 0 || pb_client_start(&b) != 0) {
                pb_pair_stop(&b);
                goto out;
            }
            rows[n_rows].model = rows[n_rows + 1].model = name;
            st = pb_run(&b, cache, &rows[n_rows]) == 0 ? EPD_OK : EPD_ERR_FATAL;
            pb_client_stop(&b);
            pb_pair_stop(&b);
            if (st != EPD_OK) {
                fprintf(stderr, "serve: the %s run failed (logs in %s)\n", tag, b.tmp);
                b.keep = 1;
                goto out;
            }
            n_rows += 2;
        }
        /* rows: (shared, multi) per setting -> every shared row, then
         * every multi-turn one */
        {
            pb_row_t t[6];

            memcpy(t, &rows[n_rows - 6], sizeof(t));
            for (int k = 0; k < 3; k++) {
                rows[n_rows - 6 + k] = t[2 * k];
                rows[n_rows - 3 + k] = t[2 * k + 1];
            }
        }
    }
    pb_print(rows, n_rows);
    rc = 0;
out:
    if (b.tmp[0] != '\0' && !b.keep) {
        char cmd[PATH_MAX + 16];

        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", b.tmp);
        if (system(cmd) != 0) {
            fprintf(stderr, "serve: could not remove %s\n", b.tmp);
        }
    } else if (b.tmp[0] != '\0') {
        fprintf(stderr, "serve: kept %s\n", b.tmp);
    }
    for (int i = 0; i < n_rows; i++) {
        epd_free(rows[i].ttft_ms);
    }
    epd_opts_cleanup(&o);
    return rc;
}
