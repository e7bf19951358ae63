/*
 * epd_itest_storm.c — `epd-itest-storm --prefill ADDR --decode ADDR --model DIR`:
 * many concurrent requests through one prefill and one decode daemon, with
 * aborts at random moments, over client/epd_client (what the router will
 * use).  Run by test_storm_aborts.sh, which starts and stops the daemons.
 *
 * Each request gets a random prompt, max_tokens and sampling (greedy or
 * seeded temperature/top-p), and one abort plan:
 *   NONE       never aborted: its tokens must equal the colocated result;
 *   AT_SUBMIT  Abort right behind the GenerateRequest (before decode can
 *              have reserved, and before prefill started);
 *   DELAY      Abort after a random 0..15 ms (mid-prefill, mid-layer or
 *              mid-transfer, depending on the queue);
 *   MID_DECODE Abort on receiving the chunk with a random index >= 1;
 *   AFTER_END  Abort after the terminal event (must be EPD_ERR_NOT_FOUND
 *              locally: nothing is sent).
 * Truths checked:
 *   - every request ends in exactly one terminal event (and all end before
 *     the time limit);
 *   - a request that was not aborted finished (LENGTH/STOP) with exactly
 *     the colocated tokens; an aborted one ended with finish ABORT (or an
 *     Error EPD_ERR_CANCELED: decode may hear of the abort from prefill
 *     before the client's own Abort arrives; or finished normally when the
 *     abort came too late) and every token it
 *     did get is the colocated token at that index (no request ever sees
 *     another's KV);
 *   - afterwards the decode daemon's Status shows every KV block and state
 *     slot free again (polled: quarantine releases are asynchronous), and
 *     both daemons still answer Health.
 * Exit 0 when all hold; 1 with one line per violation otherwise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_client.h"
#include "epd_config.h"
#include "epd_engine.h"
#include "epd_itest_colo.h"
#include "epd_itest_status.h"
#include "epd_log.h"
#include "epd_msg.h"
#include "epd_rng.h"
#include "epd_rpc.h"
#include "epd_time.h"

/* UCX and libfabric keep process-wide allocations until exit (not epd's). */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libucs.so\nleak:libucp.so\nleak:libuct.so\nleak:libucm.so\n"
           "leak:libfabric.so\nleak:librdmacm.so\nleak:libibverbs.so\n";
}

enum { PLAN_NONE, PLAN_AT_SUBMIT, PLAN_DELAY, PLAN_MID_DECODE, PLAN_AFTER_END, N_PLANS };
static const char *const plan_names[N_PLANS] = {"none", "at-submit", "delay", "mid-decode",
                                                "after-end"};

#define MAX_PROMPT 320
#define MAX_OUT 40

typedef struct {
    uint32_t prompt[MAX_PROMPT + 1];
    uint32_t n_prompt;
    uint32_t max_tokens;
    epd_sample_params_t sp;
    int32_t want[MAX_OUT];
    uint32_t n_want;
    int plan;
    uint64_t abort_at_ns;    /* DELAY */
    uint32_t abort_at_index; /* MID_DECODE */
    uint64_t id;
    int aborted;
    uint32_t got[MAX_OUT];
    uint32_t n_got;
    int terminals;
    int events_after_end;
    epd_client_ev_kind_t end_kind;
    int finish;
    epd_status_t status;
    char message[160];
    char from[64];
} storm_req_t;

typedef struct {
    epd_client_t *client;
    storm_req_t *reqs;
    uint32_t n;
    uint32_t ended;
    int bad;
} storm_t;

static void on_event(void *arg, const epd_client_event_t *ev)
{
    storm_t *s = arg;
    storm_req_t *r = ev->user;

    if (r->terminals > 0) {
        r->events_after_end++;
        return;
    }
    if (ev->kind == EPD_CLIENT_EV_TOKENS) {
        for (uint32_t i = 0; i < ev->n_tokens; i++) {
            if (r->n_got < MAX_OUT) {
                r->got[r->n_got] = ev->tokens[i];
            }
            r->n_got++;
        }
        if (r->plan == PLAN_MID_DECODE && !r->aborted && !ev->terminal &&
            ev->index + ev->n_tokens > r->abort_at_index) {
            r->aborted = 1;
            (void)epd_client_abort(s->client, r->id);
        }
    }
    if (ev->terminal) {
        r->terminals++;
        r->end_kind = ev->kind;
        r->finish = ev->finish;
        r->status = ev->status;
        snprintf(r->message, sizeof(r->message), "%s", ev->message);
        snprintf(r->from, sizeof(r->from), "%s", ev->from);
        s->ended++;
        if (r->plan == PLAN_AFTER_END) {
            if (epd_client_abort(s->client, r->id) != EPD_ERR_NOT_FOUND) {
                fprintf(stderr, "storm: abort after the end of request %llu was not refused\n",
                        (unsigned long long)r->id);
                s->bad = 1;
            }
        }
    }
}

static int decode_status(const char *addr, uint32_t *free_p, uint32_t *total_p,
                         uint32_t *slots_free_p, uint32_t *slots_total_p, uint32_t *running_p)
{
    epd_itest_load_t l;

    if (epd_itest_load(addr, &l) != 0) {
        return -1;
    }
    *free_p = l.kv_blocks_free;
    *total_p = l.kv_blocks_total;
    *slots_free_p = l.state_slots_free;
    *slots_total_p = l.state_slots_total;
    *running_p = l.running_requests;
    return 0;
}

typedef struct {
    const char *prefill;
    const char *decode;
    const char *model;
    const char *transport;
    int64_t n;
    int64_t seed;
    int64_t timeout_s;
    int64_t deadline_ms;
} storm_args_t;

static int storm_run(const storm_args_t *a)
{
    epd_engine_config_t ecfg = {.model_dir = a->model, .block_tokens = 16};
    const epd_engine_info_t *info;
    epd_engine_t *engine = NULL;
    epd_client_config_t cc;
    epd_client_worker_t *pw = NULL;
    epd_client_worker_t *dw = NULL;
    epd_client_worker_info_t *hinfo = NULL;
    storm_t s;
    epd_rng_t rng;
    uint64_t t0;
    uint64_t end;
    uint32_t counts[N_PLANS][3];
    uint32_t counts_canceled = 0;
    int rc = 1;

    memset(&s, 0, sizeof(s));
    memset(counts, 0, sizeof(counts));
    s.n = (uint32_t)a->n;
    s.reqs = epd_calloc(s.n, sizeof(*s.reqs));
    hinfo = epd_calloc(1, sizeof(*hinfo));
    if (s.reqs == NULL || hinfo == NULL) {
        fprintf(stderr, "storm: out of memory\n");
        goto out;
    }
    if (epd_engine_open("ref", &ecfg, &engine) != EPD_OK) {
        fprintf(stderr, "storm: cannot open the model %s\n", a->model);
        goto out;
    }
    info = epd_engine_info(engine);

    /* the requests and their colocated results */
    epd_rng_seed(&rng, (uint64_t)a->seed);
    t0 = epd_time_now_ns();
    for (uint32_t i = 0; i < s.n; i++) {
        storm_req_t *r = &s.reqs[i];
        int32_t toks[MAX_PROMPT + 1];
        char text[MAX_PROMPT];
        uint32_t len = 1 + (uint32_t)(epd_rng_next(&rng) % MAX_PROMPT);
        size_t n_tok = 0;
        uint32_t p = (uint32_t)(epd_rng_next(&rng) % 100);

        for (uint32_t j = 0; j < len; j++) {
            text[j] = (char)(32 + epd_rng_next(&rng) % 95);
        }
        if (epd_engine_tokenize(engine, text, len, 1, toks, MAX_PROMPT + 1, &n_tok) != EPD_OK) {
            fprintf(stderr, "storm: tokenize failed\n");
            goto out;
        }
        for (size_t j = 0; j < n_tok; j++) {
            r->prompt[j] = (uint32_t)toks[j];
        }
        r->n_prompt = (uint32_t)n_tok;
        r->max_tokens = 1 + (uint32_t)(epd_rng_next(&rng) % MAX_OUT);
        epd_sample_params_default(&r->sp);
        if (epd_rng_next(&rng) % 2) {
            r->sp.temperature = 0.8f;
            r->sp.top_p = 0.9f;
            r->sp.seed = epd_rng_next(&rng) >> 1;
        }
        r->plan = p < 40   ? PLAN_NONE
                  : p < 55 ? PLAN_AT_SUBMIT
                  : p < 70 ? PLAN_DELAY
                  : p < 85 ? PLAN_MID_DECODE
                           : PLAN_AFTER_END;
        r->abort_at_ns = (epd_rng_next(&rng) % 15) * EPD_NSEC_PER_MSEC;
        if (r->plan == PLAN_MID_DECODE) {
            /* a decode long enough for the abort to land in */
            r->max_tokens = MAX_OUT;
        }
        r->abort_at_index = 1 + (uint32_t)(epd_rng_next(&rng) % 4);
        if (epd_itest_colocated(engine, toks, r->n_prompt, &r->sp, r->max_tokens, r->want,
                                &r->n_want) != EPD_OK) {
            fprintf(stderr, "storm: colocated generation failed\n");
            goto out;
        }
    }
    printf("storm: %u colocated results in %.1f s (vocab %u)\n", s.n,
           (double)(epd_time_now_ns() - t0) / 1e9, info->vocab_size);

    epd_client_config_init(&cc);
    cc.backend = a->transport;
    cc.worker_id = "itest-storm";
    cc.role = EPD_CLIENT_ROLE_ROUTER;
    cc.event_cb = on_event;
    cc.cb_arg = &s;
    if (epd_client_create(&cc, &s.client) != EPD_OK ||
        epd_client_add_worker(s.client, a->prefill, &pw) != EPD_OK ||
        epd_client_add_worker(s.client, a->decode, &dw) != EPD_OK) {
        fprintf(stderr, "storm: cannot reach the daemons\n");
        goto out;
    }

    /* submit everything at once (backpressure: progress and retry) */
    t0 = epd_time_now_ns();
    for (uint32_t i = 0; i < s.n; i++) {
        storm_req_t *r = &s.reqs[i];
        epd_client_request_t q;
        epd_status_t st;

        memset(&q, 0, sizeof(q));
        q.prompt = r->prompt;
        q.n_prompt = r->n_prompt;
        q.temperature = r->sp.temperature;
        q.top_p = r->sp.top_p;
        q.top_k = r->sp.top_k;
        q.seed = r->sp.seed;
        q.max_tokens = r->max_tokens;
        q.prefill = pw;
        q.decode = dw;
        q.deadline_ms = (uint32_t)a->deadline_ms;
        q.user = r;
        for (int tries = 0;; tries++) {
            st = epd_client_submit(s.client, &q, &r->id);
            if (st != EPD_ERR_NO_RESOURCE || tries > 10000) {
                break;
            }
            epd_client_poll(s.client, 1);
        }
        if (st != EPD_OK) {
            fprintf(stderr, "storm: submit %u failed: %s\n", i, epd_status_string(st));
            goto out;
        }
        r->abort_at_ns += epd_time_now_ns();
        if (r->plan == PLAN_AT_SUBMIT) {
            r->aborted = 1;
            if (epd_client_abort(s.client, r->id) != EPD_OK) {
                fprintf(stderr, "storm: abort at submit refused\n");
                s.bad = 1;
            }
        }
    }
    end = epd_time_now_ns() + (uint64_t)a->timeout_s * EPD_NSEC_PER_SEC;
    while (s.ended < s.n && epd_time_now_ns() < end) {
        uint64_t now = epd_time_now_ns();

        for (uint32_t i = 0; i < s.n; i++) {
            storm_req_t *r = &s.reqs[i];
            if (r->plan == PLAN_DELAY && !r->aborted && r->terminals == 0 &&
                now >= r->abort_at_ns) {
                r->aborted = 1;
                (void)epd_client_abort(s.client, r->id);
            }
        }
        epd_client_poll(s.client, 2);
    }
    printf("storm: %u of %u requests ended in %.1f s\n", s.ended, s.n,
           (double)(epd_time_now_ns() - t0) / 1e9);
    /* a little longer: a second terminal event would show up now */
    end = epd_time_now_ns() + 200 * EPD_NSEC_PER_MSEC;
    while (epd_time_now_ns() < end) {
        epd_client_poll(s.client, 10);
    }

    for (uint32_t i = 0; i < s.n; i++) {
        storm_req_t *r = &s.reqs[i];
        int ok = 1;
        int outcome;

        if (r->terminals != 1 || r->events_after_end != 0) {
            fprintf(stderr, "storm: request %u (%s): %d terminal events, %d events after\n", i,
                    plan_names[r->plan], r->terminals, r->events_after_end);
            s.bad = 1;
            continue;
        }
        uint32_t first_diff = UINT32_MAX;

        for (uint32_t j = 0; j < r->n_got && j < MAX_OUT; j++) {
            if (j >= r->n_want || (int32_t)r->got[j] != r->want[j]) {
                ok = 0;
                if (first_diff == UINT32_MAX) {
                    first_diff = j;
                }
            }
        }
        if (r->n_got > r->n_want) {
            ok = 0;
        }
        if (r->end_kind == EPD_CLIENT_EV_TOKENS &&
            (r->finish == EPD_CLIENT_FINISH_LENGTH || r->finish == EPD_CLIENT_FINISH_STOP)) {
            outcome = 0;
            if (r->n_got != r->n_want) {
                ok = 0;
            }
        } else if (r->end_kind == EPD_CLIENT_EV_TOKENS && r->finish == EPD_CLIENT_FINISH_ABORT) {
            outcome = 1;
        } else if (r->aborted && r->end_kind == EPD_CLIENT_EV_ERROR &&
                   r->status == EPD_ERR_CANCELED) {
            /* the Abort reached decode through prefill first (prefill
             * stopped, told decode, decode failed the request with
             * CANCELED) and the client's own Abort arrived after: the
             * same outcome in another shape */
            outcome = 1;
            counts_canceled++;
        } else {
            outcome = 2;
        }
        counts[r->plan][outcome]++;
        if (!ok) {
            fprintf(stderr,
                    "storm: request %u id %llu (%s, prompt %u, max %u, temp %.1f, seed %llu): got "
                    "%u tokens, first differing at %d, against %u colocated ones; ended with "
                    "%s %s: %s (%s)\n",
                    i, (unsigned long long)r->id, plan_names[r->plan], r->n_prompt, r->max_tokens,
                    r->sp.temperature, (unsigned long long)r->sp.seed, r->n_got,
                    first_diff == UINT32_MAX ? -1 : (int)first_diff, r->n_want,
                    r->end_kind == EPD_CLIENT_EV_TOKENS ? "finish" : "error",
                    r->end_kind == EPD_CLIENT_EV_TOKENS ? epd_client_finish_name(r->finish)
                                                        : epd_status_name(r->status),
                    r->message, r->from);
            s.bad = 1;
        }
        if (outcome == 2 || (outcome == 1 && !r->aborted)) {
            fprintf(stderr,
                    "storm: request %u id %llu (%s, prompt %u, max %u) ended with %s %s: %s (%s)\n",
                    i, (unsigned long long)r->id, plan_names[r->plan], r->n_prompt, r->max_tokens,
                    r->end_kind == EPD_CLIENT_EV_TOKENS ? "finish" : "error",
                    r->end_kind == EPD_CLIENT_EV_TOKENS ? epd_client_finish_name(r->finish)
                                                        : epd_status_name(r->status),
                    r->message, r->from);
            s.bad = 1;
        }
    }
    for (int p = 0; p < N_PLANS; p++) {
        printf("storm: plan %-10s finished %3u, aborted %3u, failed %3u\n", plan_names[p],
               counts[p][0], counts[p][1], counts[p][2]);
    }

    printf("storm: %u aborted requests ended with Error EPD_ERR_CANCELED instead of a chunk "
           "with finish ABORT\n",
           counts_canceled);

    /* the decode pool returns to full */
    {
        uint32_t fr = 0, tot = 1, sf = 0, st = 1, run = 0;
        uint64_t until = epd_time_now_ns() + 30 * EPD_NSEC_PER_SEC;
        int got = -1;

        while (epd_time_now_ns() < until) {
            got = decode_status(a->decode, &fr, &tot, &sf, &st, &run);
            if (got == 0 && fr == tot && sf == st) {
                break;
            }
            epd_client_poll(s.client, 100);
        }
        printf("storm: decode kv_blocks_free %u/%u state_slots_free %u/%u running %u\n", fr, tot,
               sf, st, run);
        if (got != 0 || fr != tot || sf != st) {
            fprintf(stderr, "storm: decode's KV pool did not return to full\n");
            s.bad = 1;
        }
    }
    if (epd_client_health(a->prefill, 3000, hinfo, NULL, 0) != EPD_OK ||
        epd_client_health(a->decode, 3000, hinfo, NULL, 0) != EPD_OK) {
        fprintf(stderr, "storm: a daemon no longer answers Health\n");
        s.bad = 1;
    }
    rc = s.bad ? 1 : 0;
out:
    epd_client_destroy(s.client);
    epd_engine_close(engine);
    epd_free(hinfo);
    epd_free(s.reqs);
    return rc;
}

int main(int argc, char **argv)
{
    storm_args_t a = {
        .transport = "ucx",
        .n = 200,
        .seed = 1,
        .timeout_s = 120,
        .deadline_ms = 60000,
    };
    const epd_opt_t opts[] = {
        {"prefill", EPD_OPT_STRING, &a.prefill, 0, 0, "prefill control address"},
        {"decode", EPD_OPT_STRING, &a.decode, 0, 0, "decode control address"},
        {"model", EPD_OPT_STRING, &a.model, 0, 0, "model folder (the daemons')"},
        {"transport", EPD_OPT_STRING, &a.transport, 0, 0, "ucx or ofi"},
        {"requests", EPD_OPT_INT, &a.n, 1, 10000, "concurrent requests"},
        {"seed", EPD_OPT_INT, &a.seed, 0, 0, "seed of prompts, sampling and abort plans"},
        {"timeout-s", EPD_OPT_INT, &a.timeout_s, 1, 3600, "all requests end within this"},
        {"deadline-ms", EPD_OPT_INT, &a.deadline_ms, 1, 3600000, "per-request deadline"},
    };
    epd_opts_t o = {.prog = "epd-itest-storm",
                    .summary = "concurrent requests with random aborts",
                    .opts = opts,
                    .n_opts = sizeof(opts) / sizeof(opts[0])};
    int argi;
    int rc;

    if (epd_opts_parse(&o, argc, argv, &argi) != EPD_OK) {
        epd_opts_cleanup(&o);
        return 1;
    }
    if (a.prefill == NULL || a.decode == NULL || a.model == NULL) {
        fprintf(stderr, "epd-itest-storm: --prefill, --decode and --model are required\n");
        rc = 1;
    } else {
        rc = storm_run(&a);
    }
    epd_opts_cleanup(&o);
    return rc;
}
