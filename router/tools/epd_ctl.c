/*
 * epd_ctl.c — `epd-ctl`: talk to epd daemons from a shell.
 *
 *   epd-ctl submit --prefill HOST:PORT --decode HOST:PORT --model DIR
 *                  (--prompt TEXT | --prompt-file F) --max-tokens N
 *                  [--temperature T --top-p P --top-k K --seed S --tokens
 *                   --timeout-ms MS --transport ucx|ofi --expect-transport C
 *                   --provider STR --cluster-secret-file PATH]
 *   epd-ctl health ADDR
 *   epd-ctl status ADDR [--cluster-secret-file PATH]
 *   epd-ctl drain ADDR (--worker-id ID | --self) [--wait-ms MS] [--cluster-secret-file PATH]
 *   epd-ctl workers ROUTER [--cluster-secret-file PATH]
 *   epd-ctl probe ADDR [--service NAME]
 *
 * probe is grpc.health.v1.Health/Check, as an orchestrator's gRPC probe
 * calls it: prints SERVING or NOT_SERVING and exits 0 only for SERVING
 * (a container's HEALTHCHECK, a script waiting for a daemon).
 *
 * A daemon with a cluster secret answers only Health to a caller without
 * it: status, workers and drain then need --cluster-secret-file (the same
 * file the daemons were given); their calls are signed with it (epd_rpc.h).
 * submit takes it too, for the request plane (every endpoint authenticated).
 * Without the flag, the file EPD_CLUSTER_SECRET_FILE names is used, if set
 * (scripts that call epd-ctl many times).
 *
 * submit is a one-request client of the request plane (router/epd_client):
 * Health on both control addresses, the same GenerateRequest to both
 * workers, then the token stream printed as it arrives.  The model folder
 * is used only for the tokenizer: the prompt is tokenized exactly as
 * epd-generate does (BOS added), the output is detokenized and UTF-8
 * repaired the same way (incomplete trailing sequences held back until the
 * next chunk), and --tokens prints the ids in epd-generate's --tokens format
 * (space separated, one line), so the two can be compared byte for byte.
 * Exit 0 when the request finished (LENGTH or STOP); 1 with one line on
 * stderr naming the status, the reporting worker and its message otherwise.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "epd_alloc.h"
#include "epd_client.h"
#include "epd_grpc_health.pb-c.h"
#include "epd_config.h"
#include "epd_engine.h"
#include "epd_log.h"
#include "epd_msg.h"
#include "epd_rpc.h"
#include "epd_secret.h"
#include "epd_utf8.h"

#define CTL_RPC_TIMEOUT_MS 5000

static volatile sig_atomic_t ctl_interrupted;

/* --cluster-secret-file of a control command (len 0: none); wiped at exit */
static epd_secret_t ctl_secret;

/* Consulted only by LeakSanitizer builds: UCX and libfabric keep some
 * process-wide allocations until exit; they are not epd's. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libucs.so\nleak:libucp.so\nleak:libuct.so\nleak:libucm.so\n"
           "leak:libfabric.so\nleak:librdmacm.so\nleak:libibverbs.so\n";
}

static void ctl_on_signal(int sig)
{
    (void)sig;
    ctl_interrupted++;
}

static int ctl_fail(const char *what)
{
    fprintf(stderr, "epd-ctl: %s\n", what);
    return 1;
}

static const char *ctl_role_name(int role)
{
    switch (role) {
    case EPD__ROLE__ROLE_ENCODER:
        return "encoder";
    case EPD__ROLE__ROLE_PREFILL:
        return "prefill";
    case EPD__ROLE__ROLE_DECODE:
        return "decode";
    case EPD__ROLE__ROLE_ROUTER:
        return "router";
    case EPD__ROLE__ROLE_TOOL:
        return "tool";
    default:
        return "unspecified";
    }
}

static const char *ctl_state_name(int state)
{
    switch (state) {
    case EPD__WORKER_STATE__WORKER_STATE_READY:
        return "READY";
    case EPD__WORKER_STATE__WORKER_STATE_DRAINING:
        return "DRAINING";
    case EPD__WORKER_STATE__WORKER_STATE_SUSPECT:
        return "SUSPECT";
    case EPD__WORKER_STATE__WORKER_STATE_DEAD:
        return "DEAD";
    default:
        return "UNSPECIFIED";
    }
}

static int ctl_load_secret(const char *path);

/* ------------------------------------------------------------- submit */

typedef struct {
    epd_engine_t *engine;
    int tokens_mode;
    size_t printed; /* tokens printed (--tokens) */
    char *pending;  /* raw bytes not yet printed (incomplete UTF-8 tail) */
    size_t n_pending;
    size_t cap_pending;
    int done;
    int failed;
    char why[600];
} ctl_stream_t;

/* Prints the repaired text of pending[0..n) and keeps the rest. */
static int ctl_flush_text(ctl_stream_t *s, size_t n)
{
    size_t cap = EPD_UTF8_REPAIR_MAX(n) + 1;
    char *text = epd_malloc(cap);
    size_t len;

    if (text == NULL) {
        return -1;
    }
    if (epd_utf8_repair(s->pending, n, text, cap, &len) != EPD_OK) {
        epd_free(text);
        return -1;
    }
    fwrite(text, 1, len, stdout);
    epd_free(text);
    memmove(s->pending, s->pending + n, s->n_pending - n);
    s->n_pending -= n;
    return 0;
}

static int ctl_take_tokens(ctl_stream_t *s, const uint32_t *ids, uint32_t n)
{
    int32_t *tok;
    size_t len;

    if (s->tokens_mode) {
        for (uint32_t i = 0; i < n; i++) {
            printf("%s%u", s->printed++ ? " " : "", ids[i]);
        }
        fflush(stdout);
        return 0;
    }
    tok = epd_calloc(n > 0 ? n : 1, sizeof(*tok));
    if (tok == NULL) {
        return -1;
    }
    for (uint32_t i = 0; i < n; i++) {
        tok[i] = (int32_t)ids[i];
    }
    if (s->n_pending + n > s->cap_pending) {
        size_t cap = (s->n_pending + n) * 2 + 64;
        char *p = epd_realloc(s->pending, cap);

        if (p == NULL) {
            epd_free(tok);
            return -1;
        }
        s->pending = p;
        s->cap_pending = cap;
    }
    if (epd_engine_detokenize(s->engine, tok, n, s->pending + s->n_pending,
                              s->cap_pending - s->n_pending, &len) != EPD_OK) {
        epd_free(tok);
        return -1;
    }
    epd_free(tok);
    s->n_pending += len;
    if (ctl_flush_text(s, s->n_pending - epd_utf8_incomplete_tail(s->pending, s->n_pending)) != 0) {
        return -1;
    }
    fflush(stdout);
    return 0;
}

static void ctl_on_event(void *arg, const epd_client_event_t *ev)
{
    ctl_stream_t *s = arg;

    switch (ev->kind) {
    case EPD_CLIENT_EV_TOKENS:
        if (ctl_take_tokens(s, ev->tokens, ev->n_tokens) != 0) {
            snprintf(s->why, sizeof(s->why),
                     "cannot detokenize the output (token id outside "
                     "the vocabulary?)");
            s->failed = 1;
        }
        if (ev->terminal) {
            s->done = 1;
            if (ev->finish != EPD_CLIENT_FINISH_LENGTH && ev->finish != EPD_CLIENT_FINISH_STOP) {
                snprintf(s->why, sizeof(s->why), "request ended with finish %s (from %s)",
                         epd_client_finish_name(ev->finish), ev->from);
                s->failed = 1;
            }
        }
        break;
    case EPD_CLIENT_EV_ERROR:
    case EPD_CLIENT_EV_REFUSED:
        s->done = 1;
        s->failed = 1;
        snprintf(s->why, sizeof(s->why), "request %s by %s: %s: %s",
                 ev->kind == EPD_CLIENT_EV_REFUSED ? "refused" : "failed", ev->from,
                 epd_status_name(ev->status), ev->message);
        break;
    }
}

static char *ctl_read_file(const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0;
    size_t cap = 0;

    if (f == NULL) {
        return NULL;
    }
    for (;;) {
        size_t n;

        if (len + 4096 + 1 > cap) {
            char *p = epd_realloc(buf, cap * 2 + 8192);
            if (p == NULL) {
                epd_free(buf);
                fclose(f);
                return NULL;
            }
            buf = p;
            cap = cap * 2 + 8192;
        }
        n = fread(buf + len, 1, 4096, f);
        len += n;
        if (n < 4096) {
            break;
        }
    }
    if (ferror(f)) {
        epd_free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[len] = '\0';
    *len_p = len;
    return buf;
}

typedef struct {
    const char *prefill;
    const char *decode;
    const char *model;
    const char *engine;
    const char *prompt;
    const char *prompt_file;
    int64_t max_tokens;
    double temperature;
    double top_p;
    int64_t top_k;
    int64_t seed;
    int tokens;
    int64_t timeout_ms;
    const char *transport;
    const char *expect;
    const char *provider;
    const char *log_level;
    const char *secret_file;
} ctl_submit_args_t;

static int ctl_submit_run(const ctl_submit_args_t *a)
{
    epd_engine_config_t ecfg = {.model_dir = a->model};
    epd_client_config_t cc;
    epd_client_request_t q;
    epd_client_t *client = NULL;
    epd_client_worker_t *pw = NULL;
    epd_client_worker_t *dw = NULL;
    ctl_stream_t s;
    char *file_text = NULL;
    const char *text;
    size_t text_len;
    int32_t *itok = NULL;
    uint32_t *utok = NULL;
    size_t n_tok = 0;
    uint64_t id = 0;
    int aborted = 0;
    epd_status_t status;
    int rc = 1;

    memset(&s, 0, sizeof(s));
    s.tokens_mode = a->tokens;
    if (a->prompt_file != NULL) {
        file_text = ctl_read_file(a->prompt_file, &text_len);
        if (file_text == NULL) {
            fprintf(stderr, "epd-ctl: cannot read --prompt-file %s: %s\n", a->prompt_file,
                    strerror(errno));
            return 1;
        }
        text = file_text;
    } else {
        text = a->prompt;
        text_len = strlen(text);
    }
    if (text_len == 0) {
        rc = ctl_fail("the prompt must not be empty");
        goto out;
    }
    status = epd_engine_open(a->engine, &ecfg, &s.engine);
    if (status != EPD_OK) {
        fprintf(stderr, "epd-ctl: cannot open model '%s' for its tokenizer: %s\n", a->model,
                epd_status_string(status));
        goto out;
    }
    itok = epd_calloc(text_len + 1, sizeof(*itok));
    utok = epd_calloc(text_len + 1, sizeof(*utok));
    if (itok == NULL || utok == NULL) {
        ctl_fail("out of memory");
        goto out;
    }
    status = epd_engine_tokenize(s.engine, text, text_len, 1, itok, text_len + 1, &n_tok);
    if (status != EPD_OK) {
        ctl_fail("cannot tokenize the prompt");
        goto out;
    }
    for (size_t i = 0; i < n_tok; i++) {
        utok[i] = (uint32_t)itok[i];
    }

    epd_client_config_init(&cc);
    cc.backend = a->transport;
    cc.expect = a->expect;
    cc.provider = a->provider;
    cc.rpc_timeout_ms = CTL_RPC_TIMEOUT_MS;
    if (ctl_secret.len > 0) {
        cc.secret = ctl_secret.bytes;
        cc.secret_len = ctl_secret.len;
    }
    cc.event_cb = ctl_on_event;
    cc.cb_arg = &s;
    status = epd_client_create(&cc, &client);
    if (status != EPD_OK) {
        fprintf(stderr, "epd-ctl: cannot start the %s transport: %s\n", a->transport,
                epd_status_string(status));
        goto out;
    }
    status = epd_client_add_worker(client, a->prefill, &pw);
    if (status != EPD_OK) {
        fprintf(stderr, "epd-ctl: prefill worker at %s: %s\n", a->prefill,
                epd_status_string(status));
        goto out;
    }
    status = epd_client_add_worker(client, a->decode, &dw);
    if (status != EPD_OK) {
        fprintf(stderr, "epd-ctl: decode worker at %s: %s\n", a->decode, epd_status_string(status));
        goto out;
    }
    if (epd_client_worker_info(pw)->role != EPD_CLIENT_ROLE_PREFILL) {
        fprintf(stderr, "epd-ctl: %s is a %s worker, not prefill\n", a->prefill,
                ctl_role_name(epd_client_worker_info(pw)->role));
        goto out;
    }
    if (epd_client_worker_info(dw)->role != EPD_CLIENT_ROLE_DECODE) {
        fprintf(stderr, "epd-ctl: %s is a %s worker, not decode\n", a->decode,
                ctl_role_name(epd_client_worker_info(dw)->role));
        goto out;
    }
    if (strcmp(epd_client_worker_info(pw)->transport, a->transport) != 0 ||
        strcmp(epd_client_worker_info(dw)->transport, a->transport) != 0) {
        fprintf(stderr,
                "epd-ctl: transport mismatch: --transport %s, prefill serves %s, "
                "decode serves %s\n",
                a->transport, epd_client_worker_info(pw)->transport,
                epd_client_worker_info(dw)->transport);
        goto out;
    }

    memset(&q, 0, sizeof(q));
    q.prompt = utok;
    q.n_prompt = (uint32_t)n_tok;
    q.temperature = (float)a->temperature;
    q.top_p = (float)a->top_p;
    q.top_k = (uint32_t)a->top_k;
    q.seed = (uint64_t)a->seed;
    q.max_tokens = (uint32_t)a->max_tokens;
    q.prefill = pw;
    q.decode = dw;
    q.deadline_ms = (uint32_t)a->timeout_ms;
    for (int tries = 0;; tries++) {
        status = epd_client_submit(client, &q, &id);
        if (status != EPD_ERR_NO_RESOURCE || tries > 1000) {
            break;
        }
        epd_client_poll(client, 1);
    }
    if (status != EPD_OK) {
        fprintf(stderr, "epd-ctl: submit failed: %s\n", epd_status_string(status));
        goto out;
    }
    while (!s.done) {
        if (ctl_interrupted && !aborted) {
            aborted = 1;
            (void)epd_client_abort(client, id);
        }
        if (ctl_interrupted > 1) {
            snprintf(s.why, sizeof(s.why), "interrupted");
            s.failed = 1;
            break;
        }
        epd_client_poll(client, 50);
    }
    if (!s.tokens_mode && s.n_pending > 0) {
        (void)ctl_flush_text(&s, s.n_pending);
    }
    if (s.printed > 0 || !s.tokens_mode) {
        printf("\n");
    }
    fflush(stdout);
    if (s.failed) {
        fprintf(stderr, "epd-ctl: %s\n", s.why);
        goto out;
    }
    rc = 0;
out:
    epd_client_destroy(client);
    epd_free(s.pending);
    epd_free(utok);
    epd_free(itok);
    epd_free(file_text);
    epd_engine_close(s.engine);
    return rc;
}

static int ctl_submit(int argc, char **argv)
{
    ctl_submit_args_t a = {
        .engine = "ref",
        .max_tokens = 64,
        .temperature = 0.0,
        .top_p = 1.0,
        .top_k = 0,
        .seed = 0,
        .timeout_ms = 60000,
        .transport = "ucx",
        .expect = "any",
        .log_level = "warn",
    };
    const epd_opt_t opts[] = {
        {"prefill", EPD_OPT_STRING, &a.prefill, 0, 0, "prefill worker's control address HOST:PORT"},
        {"decode", EPD_OPT_STRING, &a.decode, 0, 0, "decode worker's control address HOST:PORT"},
        {"model", EPD_OPT_STRING, &a.model, 0, 0, "model folder (for its tokenizer only)"},
        {"engine", EPD_OPT_STRING, &a.engine, 0, 0, "engine whose tokenizer to use"},
        {"prompt", EPD_OPT_STRING, &a.prompt, 0, 0, "prompt text"},
        {"prompt-file", EPD_OPT_STRING, &a.prompt_file, 0, 0,
         "read the prompt from a file (bytes as is)"},
        {"max-tokens", EPD_OPT_INT, &a.max_tokens, 1, 1 << 24, "tokens to generate at most"},
        {"temperature", EPD_OPT_DOUBLE, &a.temperature, 0, 100, "0 = greedy"},
        {"top-p", EPD_OPT_DOUBLE, &a.top_p, 0, 1, "nucleus sampling mass, (0, 1]"},
        {"top-k", EPD_OPT_INT, &a.top_k, 0, 1 << 20, "keep the k most likely (0 = all)"},
        {"seed", EPD_OPT_INT, &a.seed, 0, 0, "sampling seed"},
        {"tokens", EPD_OPT_BOOL, &a.tokens, 0, 0, "print token ids instead of text"},
        {"timeout-ms", EPD_OPT_INT, &a.timeout_ms, 1, 3600000, "deadline of the request"},
        {"transport", EPD_OPT_STRING, &a.transport, 0, 0, "ucx or ofi"},
        {"expect-transport", EPD_OPT_STRING, &a.expect, 0, 0, "any, shm, tcp or rdma"},
        {"provider", EPD_OPT_STRING, &a.provider, 0, 0, "libfabric provider (ofi)"},
        {"log-level", EPD_OPT_STRING, &a.log_level, 0, 0, "error, warn, info, debug, trace"},
        {"cluster-secret-file", EPD_OPT_STRING, &a.secret_file, 0, 0,
         "the cluster secret (the daemons' file): authenticates the request plane"},
    };
    epd_opts_t o = {.prog = "epd-ctl submit",
                    .summary = "send one request through a prefill and a decode worker",
                    .opts = opts,
                    .n_opts = sizeof(opts) / sizeof(opts[0])};
    epd_log_level_t level;
    epd_status_t status;
    int argi;
    int rc;

    status = epd_opts_parse(&o, argc, argv, &argi);
    if (status != EPD_OK) {
        epd_opts_cleanup(&o);
        return status == EPD_ERR_CANCELED ? 0 : 1;
    }
    if (argi != argc) {
        rc = ctl_fail("submit: unexpected argument (flags are --name value)");
    } else if (a.prefill == NULL || a.decode == NULL) {
        rc = ctl_fail("submit: --prefill HOST:PORT and --decode HOST:PORT are required");
    } else if (a.model == NULL || a.model[0] == '\0') {
        rc = ctl_fail("submit: --model DIR is required (its tokenizer)");
    } else if ((a.prompt == NULL) == (a.prompt_file == NULL)) {
        rc = ctl_fail("submit: give exactly one of --prompt TEXT and --prompt-file F");
    } else if (!(a.top_p > 0.0)) {
        rc = ctl_fail("submit: --top-p must be in (0, 1]");
    } else if (epd_log_level_parse(a.log_level, &level) != EPD_OK) {
        rc = ctl_fail("submit: bad --log-level");
    } else if (ctl_load_secret(a.secret_file) != 0) {
        rc = 1;
    } else {
        if (getenv("EPD_LOG_LEVEL") == NULL) {
            epd_log_set_level(level);
        }
        rc = ctl_submit_run(&a);
    }
    epd_opts_cleanup(&o);
    return rc;
}

/* ------------------------------------------------------------- control */

static int ctl_call(const char *addr, const char *method, const void *req, size_t req_len,
                    const ProtobufCMessageDescriptor *desc, ProtobufCMessage **msg_p)
{
    static const unsigned char empty = 0;
    epd_rpc_client_t *rpc = NULL;
    void *resp = NULL;
    size_t resp_len = 0;
    char err[256] = "";
    epd_status_t status;

    status = epd_rpc_client_create(addr, &rpc);
    if (status != EPD_OK) {
        fprintf(stderr, "epd-ctl: cannot open a channel to %s: %s\n", addr,
                epd_status_string(status));
        return 1;
    }
    if (ctl_secret.len > 0) {
        status = epd_rpc_client_set_auth(rpc, ctl_secret.bytes, ctl_secret.len);
        if (status != EPD_OK) {
            epd_rpc_client_destroy(rpc);
            fprintf(stderr, "epd-ctl: cannot use the cluster secret: %s\n",
                    epd_status_string(status));
            return 1;
        }
    }
    status = epd_rpc_call(rpc, method, req, req_len, CTL_RPC_TIMEOUT_MS, &resp, &resp_len, err,
                          sizeof(err));
    epd_rpc_client_destroy(rpc);
    if (status != EPD_OK) {
        fprintf(stderr, "epd-ctl: %s on %s: %s%s%s\n", method, addr, epd_status_name(status),
                err[0] ? ": " : "", err);
        if (status == EPD_ERR_AUTH) {
            fprintf(stderr, "epd-ctl: %s\n",
                    ctl_secret.len == 0
                        ? "the daemon requires the cluster secret: pass --cluster-secret-file PATH "
                          "(the file the daemons were given)"
                        : "the daemon refused this cluster secret: not the daemons' file, or "
                          "the clocks differ by more than 30 s");
        }
        epd_free(resp);
        return 1;
    }
    status = epd_proto_unpack(desc, resp_len > 0 ? resp : &empty, resp_len, msg_p);
    epd_free(resp);
    if (status != EPD_OK) {
        fprintf(stderr, "epd-ctl: %s on %s: the answer does not decode\n", method, addr);
        return 1;
    }
    return 0;
}

static void ctl_print_load(const char *sep, const Epd__Load *l)
{
    if (l == NULL) {
        return;
    }
    printf("queue_depth=%u%squeued_tokens=%llu%skv_blocks_free=%u%sstate_slots_free=%u%s"
           "running_requests=%u%s",
           l->queue_depth, sep, (unsigned long long)l->queued_tokens, sep, l->kv_blocks_free, sep,
           l->state_slots_free, sep, l->running_requests, sep);
    printf("kv_bytes_sent=%llu%skv_bytes_received=%llu%s", (unsigned long long)l->kv_bytes_sent,
           sep, (unsigned long long)l->kv_bytes_received, sep);
    if (l->prefix != NULL && l->prefix->requests > 0) {
        const Epd__PrefixCacheStats *p = l->prefix;

        printf("prefix_requests=%llu%sprefix_prompt_tokens=%llu%sprefix_hit_tokens=%llu%s"
               "prefix_computed_tokens=%llu%sprefix_replayed_tokens=%llu%sprefix_replay_cut=%llu%s"
               "prefix_checkpoints_taken=%llu%sprefix_checkpoints_restored=%llu%s"
               "prefix_checkpoints_dropped=%llu%sprefix_evictions=%llu%sprefix_cached_blocks=%llu%s"
               "prefix_checkpoints_held=%llu%s",
               (unsigned long long)p->requests, sep, (unsigned long long)p->prompt_tokens, sep,
               (unsigned long long)p->hit_tokens, sep, (unsigned long long)p->computed_tokens, sep,
               (unsigned long long)p->replayed_tokens, sep, (unsigned long long)p->replay_cut, sep,
               (unsigned long long)p->checkpoints_taken, sep,
               (unsigned long long)p->checkpoints_restored, sep,
               (unsigned long long)p->checkpoints_dropped, sep, (unsigned long long)p->evictions,
               sep, (unsigned long long)p->cached_blocks, sep,
               (unsigned long long)p->checkpoints_held, sep);
    }
}

static void ctl_print_capacity(const char *sep, const Epd__Capacity *cap)
{
    if (cap == NULL) {
        return;
    }
    printf("kv_blocks_total=%u%sblock_tokens=%u%sstate_slots_total=%u%smax_batch=%u%s"
           "max_context=%u%s",
           cap->kv_blocks_total, sep, cap->block_tokens, sep, cap->state_slots_total, sep,
           cap->max_batch, sep, cap->max_context, sep);
}

static void ctl_print_identity(const char *sep, const Epd__WorkerIdentity *w)
{
    if (w == NULL) {
        return;
    }
    printf("worker=%s%srole=%s%smodel=%s%s", w->worker_id, sep, ctl_role_name(w->role), sep,
           w->model, sep);
    if (w->epoch != NULL) {
        printf("epoch=%llu/%016llx%s", (unsigned long long)w->epoch->start_time_ns,
               (unsigned long long)w->epoch->nonce, sep);
    }
}

static int ctl_health(const char *addr)
{
    ProtobufCMessage *msg = NULL;
    Epd__HealthResponse *h;

    if (ctl_call(addr, EPD_RPC_HEALTH, NULL, 0, &epd__health_response__descriptor, &msg) != 0) {
        return 1;
    }
    h = (Epd__HealthResponse *)msg;
    printf("serving=%d\ndraining=%d\n", h->serving, h->draining);
    ctl_print_identity("\n", h->worker);
    printf("transport=%s\ndata_plane_address_bytes=%zu\n", h->transport, h->data_plane_address.len);
    printf("control_address=%s\ndata_address=%s\n", h->control_address, h->data_address);
    if (h->kv_layout != NULL) {
        printf("kv_layers=%u\nlayer_pattern=%s\nkv_block_tokens=%u\nkv_heads=%u\nhead_dim=%u\n"
               "kv_dtype=%d\nblock_bytes=%llu\nstate_bytes=%llu\n",
               h->kv_layout->n_layers, h->kv_layout->layer_pattern, h->kv_layout->block_tokens,
               h->kv_layout->n_kv_heads, h->kv_layout->head_dim, (int)h->kv_layout->dtype,
               (unsigned long long)h->kv_layout->block_bytes,
               (unsigned long long)h->kv_layout->state_bytes);
    }
    ctl_print_capacity("\n", h->capacity);
    ctl_print_load("\n", h->load);
    epd_proto_free(msg);
    return 0;
}

static int ctl_status(const char *addr)
{
    ProtobufCMessage *msg = NULL;
    Epd__StatusResponse *st;

    if (ctl_call(addr, EPD_RPC_STATUS, NULL, 0, &epd__status_response__descriptor, &msg) != 0) {
        return 1;
    }
    st = (Epd__StatusResponse *)msg;
    for (size_t i = 0; i < st->n_workers; i++) {
        const Epd__WorkerStatus *w = st->workers[i];

        ctl_print_identity(" ", w->worker);
        printf("state=%s ", ctl_state_name(w->state));
        ctl_print_load(" ", w->load);
        ctl_print_capacity(" ", w->capacity);
        printf("last_heartbeat_age_ms=%llu control_address=%s data_address=%s",
               (unsigned long long)w->last_heartbeat_age_ms, w->control_address,
               w->data_address);
        if (w->link[0] != '\0') {
            printf(" link=\"%s\"", w->link);
        }
        printf("\n");
    }
    epd_proto_free(msg);
    return 0;
}

/* The class of the router's link to a worker ("tcp: lanes..." -> "tcp"). */
static void ctl_link_class(const char *link, char *out, size_t cap)
{
    size_t n = strcspn(link, ":");

    snprintf(out, cap, "%.*s", (int)n, n > 0 ? link : "-");
}

/* The worker's own links to other workers by class: "tcp=2 shm=1" or "-". */
static void ctl_peer_links(const Epd__Load *l, char *out, size_t cap)
{
    size_t used = 0;

    out[0] = '\0';
    if (l != NULL) {
        const struct {
            const char *name;
            uint32_t n;
        } c[4] = {{"shm", l->links_shm}, {"tcp", l->links_tcp}, {"rdma", l->links_rdma},
                  {"other", l->links_other}};

        for (int i = 0; i < 4; i++) {
            if (c[i].n > 0 && used < cap) {
                used += (size_t)snprintf(out + used, cap - used, "%s%s=%u", used > 0 ? " " : "",
                                         c[i].name, c[i].n);
            }
        }
    }
    if (out[0] == '\0') {
        snprintf(out, cap, "-");
    }
}

/* `workers ROUTER`: the router's Status as a table, one pool after the
 * other, with a count of workers per state, each worker's advertised
 * control address, the class of the router's link to it (LINK) and of its
 * own links to other workers (PEER_LINKS): what each link really uses. */
static int ctl_workers(const char *addr)
{
    static const Epd__Role roles[3] = {EPD__ROLE__ROLE_PREFILL, EPD__ROLE__ROLE_DECODE,
                                       EPD__ROLE__ROLE_ENCODER};
    ProtobufCMessage *msg = NULL;
    Epd__StatusResponse *st;

    if (ctl_call(addr, EPD_RPC_STATUS, NULL, 0, &epd__status_response__descriptor, &msg) != 0) {
        return 1;
    }
    st = (Epd__StatusResponse *)msg;
    for (int r = 0; r < 3; r++) {
        unsigned counts[5] = {0};

        for (size_t i = 0; i < st->n_workers; i++) {
            const Epd__WorkerStatus *w = st->workers[i];

            if (w->worker != NULL && w->worker->role == roles[r] && (int)w->state >= 0 &&
                w->state <= 4) {
                counts[w->state]++;
            }
        }
        printf("%s pool: %u READY, %u DRAINING, %u SUSPECT, %u DEAD\n", ctl_role_name(roles[r]),
               counts[1], counts[2], counts[3], counts[4]);
        printf("  %-24s %-9s %8s %8s %14s %13s %9s  %-22s %-5s %s\n", "WORKER", "STATE", "RUNNING",
               "QUEUE", "QUEUED_TOKENS", "KV_FREE", "HB_AGE_MS", "ADDRESS", "LINK", "PEER_LINKS");
        for (size_t i = 0; i < st->n_workers; i++) {
            const Epd__WorkerStatus *w = st->workers[i];
            char kv[32];
            char cls[16];
            char peers[96];

            if (w->worker == NULL || w->worker->role != roles[r]) {
                continue;
            }
            if (roles[r] == EPD__ROLE__ROLE_ENCODER) {
                snprintf(kv, sizeof(kv), "-");
            } else {
                snprintf(kv, sizeof(kv), "%u/%u", w->load != NULL ? w->load->kv_blocks_free : 0,
                         w->capacity != NULL ? w->capacity->kv_blocks_total : 0);
            }
            ctl_link_class(w->link, cls, sizeof(cls));
            ctl_peer_links(w->load, peers, sizeof(peers));
            printf("  %-24s %-9s %8u %8u %14llu %13s %9llu  %-22s %-5s %s\n", w->worker->worker_id,
                   ctl_state_name(w->state), w->load != NULL ? w->load->running_requests : 0,
                   w->load != NULL ? w->load->queue_depth : 0,
                   (unsigned long long)(w->load != NULL ? w->load->queued_tokens : 0), kv,
                   (unsigned long long)w->last_heartbeat_age_ms,
                   w->control_address[0] != '\0' ? w->control_address : "-", cls, peers);
        }
    }
    epd_proto_free(msg);
    return 0;
}

/* Loads --cluster-secret-file (or else $EPD_CLUSTER_SECRET_FILE) into
 * ctl_secret; 0, or 1 after a message. */
static int ctl_load_secret(const char *path)
{
    char why[256];

    if (path == NULL || path[0] == '\0') {
        path = getenv("EPD_CLUSTER_SECRET_FILE");
    }
    if (path == NULL || path[0] == '\0') {
        return 0;
    }
    if (epd_secret_load(path, &ctl_secret, why, sizeof(why)) != EPD_OK) {
        fprintf(stderr, "epd-ctl: --cluster-secret-file: %s\n", why);
        return 1;
    }
    return 0;
}

/* `CMD ADDR [--cluster-secret-file PATH]`: argv[0] is ADDR.  0 on success
 * (the secret loaded when given); 1 after a message; -1 for --help. */
static int ctl_control_flags(const char *cmd, int argc, char **argv)
{
    const char *secret_file = NULL;
    char prog[64];
    const epd_opt_t opts[] = {
        {"cluster-secret-file", EPD_OPT_STRING, &secret_file, 0, 0,
         "the cluster secret (the daemons' file): needed for every call but health"},
    };
    epd_opts_t o = {.prog = prog, .summary = "a control-plane call", .opts = opts, .n_opts = 1};
    epd_status_t status;
    int argi;
    int rc;

    snprintf(prog, sizeof(prog), "epd-ctl %s ADDR", cmd);
    status = epd_opts_parse(&o, argc, argv, &argi);
    if (status != EPD_OK) {
        epd_opts_cleanup(&o);
        return status == EPD_ERR_CANCELED ? -1 : 1;
    }
    if (argi != argc) {
        fprintf(stderr, "epd-ctl: %s takes the control address and flags only\n", cmd);
        rc = 1;
    } else {
        rc = ctl_load_secret(secret_file);
    }
    epd_opts_cleanup(&o);
    return rc;
}

/* The worker id a daemon's Health names (Health needs no secret), into
 * id[cap]; 0 on success. */
static int ctl_own_id(const char *addr, char *id, size_t cap)
{
    ProtobufCMessage *msg = NULL;
    Epd__HealthResponse *h;
    int rc = 1;

    if (ctl_call(addr, EPD_RPC_HEALTH, NULL, 0, &epd__health_response__descriptor, &msg) != 0) {
        return 1;
    }
    h = (Epd__HealthResponse *)msg;
    if (h->worker != NULL && h->worker->worker_id != NULL && h->worker->worker_id[0] != '\0' &&
        strlen(h->worker->worker_id) < cap) {
        snprintf(id, cap, "%s", h->worker->worker_id);
        rc = 0;
    } else {
        ctl_fail("drain --self: the Health answer names no worker");
    }
    epd_proto_free(msg);
    return rc;
}

/* --wait-ms: until the worker's Health shows no request running or
 * queued, polled every 200 ms, at most wait_ms; 0 when idle in time. */
static int ctl_wait_idle(const char *addr, int64_t wait_ms)
{
    int64_t waited = 0;

    for (;;) {
        ProtobufCMessage *msg = NULL;
        Epd__HealthResponse *h;
        int idle;

        if (ctl_call(addr, EPD_RPC_HEALTH, NULL, 0, &epd__health_response__descriptor, &msg) !=
            0) {
            return 1; /* gone: nothing left to wait for, but say so */
        }
        h = (Epd__HealthResponse *)msg;
        idle = h->load == NULL || (h->load->running_requests == 0 && h->load->queue_depth == 0);
        epd_proto_free(msg);
        if (idle) {
            printf("idle=1 waited_ms=%lld\n", (long long)waited);
            return 0;
        }
        if (waited >= wait_ms) {
            printf("idle=0 waited_ms=%lld\n", (long long)waited);
            return 1;
        }
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
        waited += 200;
    }
}

static int ctl_drain(const char *addr, int argc, char **argv)
{
    const char *worker_id = NULL;
    const char *secret_file = NULL;
    int self = 0;
    int64_t wait_ms = 0;
    char own_id[256];
    const epd_opt_t opts[] = {
        {"worker-id", EPD_OPT_STRING, &worker_id, 0, 0, "the worker's id (must match)"},
        {"self", EPD_OPT_BOOL, &self, 0, 0,
         "drain whichever worker serves ADDR (its id from its Health): for a preStop hook, "
         "where the pod's name is not at hand"},
        {"wait-ms", EPD_OPT_INT, &wait_ms, 0, 86400000,
         "then wait until it runs and queues no request, at most this long (exit 1 if not)"},
        {"cluster-secret-file", EPD_OPT_STRING, &secret_file, 0, 0,
         "the cluster secret (the daemons' file)"},
    };
    epd_opts_t o = {.prog = "epd-ctl drain ADDR",
                    .summary = "stop a worker taking new requests",
                    .opts = opts,
                    .n_opts = 4};
    Epd__DrainRequest req = EPD__DRAIN_REQUEST__INIT;
    ProtobufCMessage *msg = NULL;
    Epd__DrainResponse *d;
    unsigned char *buf = NULL;
    size_t len;
    epd_status_t status;
    int argi;
    int rc = 1;

    status = epd_opts_parse(&o, argc, argv, &argi);
    if (status != EPD_OK) {
        epd_opts_cleanup(&o);
        return status == EPD_ERR_CANCELED ? 0 : 1;
    }
    if (argi != argc || (self != 0) == (worker_id != NULL && worker_id[0] != '\0')) {
        rc = ctl_fail("drain: usage: epd-ctl drain ADDR (--worker-id ID | --self) [--wait-ms MS] "
                      "[--cluster-secret-file F]");
        goto out;
    }
    if (ctl_load_secret(secret_file) != 0) {
        goto out;
    }
    if (self) {
        if (ctl_own_id(addr, own_id, sizeof(own_id)) != 0) {
            goto out;
        }
        worker_id = own_id;
    }
    req.worker_id = (char *)worker_id;
    len = epd__drain_request__get_packed_size(&req);
    buf = epd_malloc(len > 0 ? len : 1);
    if (buf == NULL) {
        rc = ctl_fail("out of memory");
        goto out;
    }
    epd__drain_request__pack(&req, buf);
    if (ctl_call(addr, EPD_RPC_DRAIN, buf, len, &epd__drain_response__descriptor, &msg) != 0) {
        goto out;
    }
    d = (Epd__DrainResponse *)msg;
    printf("ok=%d%s%s\n", d->ok, d->reason[0] ? " reason=" : "", d->reason);
    rc = d->ok ? 0 : 1;
    epd_proto_free(msg);
    if (rc == 0 && wait_ms > 0) {
        rc = ctl_wait_idle(addr, wait_ms);
    }
out:
    epd_free(buf);
    epd_opts_cleanup(&o);
    return rc;
}

/* `probe ADDR [--service NAME]`: grpc.health.v1.Health/Check as a
 * kubelet's gRPC probe calls it (no secret needed); exit 0 only when the
 * answer is SERVING. */
static int ctl_probe(const char *addr, int argc, char **argv)
{
    const char *service = "";
    const epd_opt_t opts[] = {
        {"service", EPD_OPT_STRING, &service, 0, 0,
         "the service to ask about ('' the daemon, or its role: router, prefill, ...)"},
    };
    epd_opts_t o = {.prog = "epd-ctl probe ADDR",
                    .summary = "grpc.health.v1.Health/Check: exit 0 when SERVING",
                    .opts = opts,
                    .n_opts = 1};
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    Grpc__Health__V1__HealthCheckResponse *r;
    ProtobufCMessage *msg = NULL;
    unsigned char buf[256];
    size_t len;
    epd_status_t status;
    int argi;
    int rc = 1;

    status = epd_opts_parse(&o, argc, argv, &argi);
    if (status != EPD_OK) {
        epd_opts_cleanup(&o);
        return status == EPD_ERR_CANCELED ? 0 : 1;
    }
    if (argi != argc || strlen(service) > 128) {
        rc = ctl_fail("probe: usage: epd-ctl probe ADDR [--service NAME]");
        goto out;
    }
    req.service = (char *)service;
    len = grpc__health__v1__health_check_request__pack(&req, buf);
    if (ctl_call(addr, EPD_RPC_GRPC_HEALTH_CHECK, buf, len,
                 &grpc__health__v1__health_check_response__descriptor, &msg) != 0) {
        goto out;
    }
    r = (Grpc__Health__V1__HealthCheckResponse *)msg;
    rc = r->status != GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    printf("%s\n", rc == 0 ? "SERVING" : r->status == 2 ? "NOT_SERVING" : "UNKNOWN");
    epd_proto_free(msg);
out:
    epd_opts_cleanup(&o);
    return rc;
}

static void ctl_usage(FILE *out)
{
    fprintf(out,
            "usage: epd-ctl COMMAND ...\n"
            "  submit --prefill HOST:PORT --decode HOST:PORT --model DIR\n"
            "         (--prompt TEXT | --prompt-file F) --max-tokens N\n"
            "         [--temperature T --top-p P --top-k K --seed S --tokens --timeout-ms MS\n"
            "          --transport ucx|ofi --expect-transport any|shm|tcp|rdma --provider STR]\n"
            "                      one request; prints the text as it streams (or the token\n"
            "                      ids with --tokens); exit 1 on error, refusal or timeout\n"
            "  health ADDR         print a worker's Health answer\n"
            "  status ADDR         print a worker's Status answer (one line per worker)\n"
            "  workers ROUTER      the router's workers as a table per pool (state, load,\n"
            "                      address, the class of each link: shm, tcp, rdma)\n"
            "  probe ADDR [--service NAME]\n"
            "                      grpc.health.v1.Health/Check (what a kubelet's gRPC probe\n"
            "                      calls): prints SERVING or NOT_SERVING, exit 0 when SERVING\n"
            "  drain ADDR (--worker-id ID | --self) [--wait-ms MS]\n"
            "                      stop the worker taking new requests\n"
            "  status, workers and drain take --cluster-secret-file PATH (default:\n"
            "  $EPD_CLUSTER_SECRET_FILE): daemons with a cluster secret answer only health\n"
            "  without it; submit takes it for the request plane\n"
            "  (epd-ctl submit --help lists every flag)\n");
}

static int ctl_main(int argc, char **argv)
{
    struct sigaction sa;
    const char *cmd;
    int rc;

    if (argc < 2) {
        ctl_usage(stderr);
        return 1;
    }
    cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
        ctl_usage(stdout);
        return 0;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = ctl_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (strcmp(cmd, "submit") == 0) {
        return ctl_submit(argc - 1, argv + 1);
    }
    if (strcmp(cmd, "health") == 0 || strcmp(cmd, "status") == 0 || strcmp(cmd, "drain") == 0 ||
        strcmp(cmd, "workers") == 0 || strcmp(cmd, "probe") == 0) {
        if (argc < 3 || argv[2][0] == '-') {
            fprintf(stderr, "epd-ctl: %s: the worker's control address HOST:PORT is required\n",
                    cmd);
            return 1;
        }
        if (strcmp(cmd, "drain") == 0) {
            return ctl_drain(argv[2], argc - 2, argv + 2);
        }
        if (strcmp(cmd, "probe") == 0) {
            return ctl_probe(argv[2], argc - 2, argv + 2);
        }
        rc = ctl_control_flags(cmd, argc - 2, argv + 2);
        if (rc != 0) {
            return rc < 0 ? 0 : rc;
        }
        if (strcmp(cmd, "workers") == 0) {
            return ctl_workers(argv[2]);
        }
        return strcmp(cmd, "health") == 0 ? ctl_health(argv[2]) : ctl_status(argv[2]);
    }
    fprintf(stderr, "epd-ctl: unknown command '%s'\n", cmd);
    ctl_usage(stderr);
    return 1;
}

int main(int argc, char **argv)
{
    int rc = ctl_main(argc, argv);

    epd_secret_wipe(&ctl_secret);
    return rc;
}
