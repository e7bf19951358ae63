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
 * submit is a one-request client of the request plane (client/epd_client):
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
#include "epd_ctl_control.h"
#include "epd_grpc_health.pb-c.h"
#include "epd_config.h"
#include "epd_engine.h"
#include "epd_tokenizer.h"
#include "epd_log.h"
#include "epd_msg.h"
#include "epd_rpc.h"
#include "epd_secret.h"
#include "epd_utf8.h"


static volatile sig_atomic_t ctl_interrupted;


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
    size_t need = n;

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
    /* a tokenizer.json token spells up to max_token_bytes bytes (the byte
     * tokenizer one) */
    if (epd_engine_tokenizer(s->engine) != NULL) {
        need = (size_t)n * epd_tokenizer_max_token_bytes(epd_engine_tokenizer(s->engine));
    }
    if (s->n_pending + need > s->cap_pending) {
        size_t cap = (s->n_pending + need) * 2 + 64;
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
    /* only the tokenizer: a Hugging Face folder opens without its weights */
    epd_engine_config_t ecfg = {.model_dir = a->model, .tokenizer_only = 1};
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
        rc = epd_ctl_fail("the prompt must not be empty");
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
        epd_ctl_fail("out of memory");
        goto out;
    }
    status = epd_engine_tokenize(s.engine, text, text_len, 1, itok, text_len + 1, &n_tok);
    if (status != EPD_OK) {
        epd_ctl_fail("cannot tokenize the prompt");
        goto out;
    }
    for (size_t i = 0; i < n_tok; i++) {
        utok[i] = (uint32_t)itok[i];
    }

    epd_client_config_init(&cc);
    cc.max_msg_size = epd_msg_cap_for_context(n_tok); /* the prompt travels whole */
    cc.backend = a->transport;
    cc.expect = a->expect;
    cc.provider = a->provider;
    cc.rpc_timeout_ms = CTL_RPC_TIMEOUT_MS;
    if (epd_ctl_secret.len > 0) {
        cc.secret = epd_ctl_secret.bytes;
        cc.secret_len = epd_ctl_secret.len;
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
                epd_ctl_role_name(epd_client_worker_info(pw)->role));
        goto out;
    }
    if (epd_client_worker_info(dw)->role != EPD_CLIENT_ROLE_DECODE) {
        fprintf(stderr, "epd-ctl: %s is a %s worker, not decode\n", a->decode,
                epd_ctl_role_name(epd_client_worker_info(dw)->role));
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
        rc = epd_ctl_fail("submit: unexpected argument (flags are --name value)");
    } else if (a.prefill == NULL || a.decode == NULL) {
        rc = epd_ctl_fail("submit: --prefill HOST:PORT and --decode HOST:PORT are required");
    } else if (a.model == NULL || a.model[0] == '\0') {
        rc = epd_ctl_fail("submit: --model DIR is required (its tokenizer)");
    } else if ((a.prompt == NULL) == (a.prompt_file == NULL)) {
        rc = epd_ctl_fail("submit: give exactly one of --prompt TEXT and --prompt-file F");
    } else if (!(a.top_p > 0.0)) {
        rc = epd_ctl_fail("submit: --top-p must be in (0, 1]");
    } else if (epd_log_level_parse(a.log_level, &level) != EPD_OK) {
        rc = epd_ctl_fail("submit: bad --log-level");
    } else if (epd_ctl_load_secret(a.secret_file) != 0) {
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
            return epd_ctl_drain(argv[2], argc - 2, argv + 2);
        }
        if (strcmp(cmd, "probe") == 0) {
            return epd_ctl_probe(argv[2], argc - 2, argv + 2);
        }
        rc = epd_ctl_control_flags(cmd, argc - 2, argv + 2);
        if (rc != 0) {
            return rc < 0 ? 0 : rc;
        }
        if (strcmp(cmd, "workers") == 0) {
            return epd_ctl_workers(argv[2]);
        }
        return strcmp(cmd, "health") == 0 ? epd_ctl_health(argv[2]) : epd_ctl_status(argv[2]);
    }
    fprintf(stderr, "epd-ctl: unknown command '%s'\n", cmd);
    ctl_usage(stderr);
    return 1;
}

int main(int argc, char **argv)
{
    int rc = ctl_main(argc, argv);

    epd_secret_wipe(&epd_ctl_secret);
    return rc;
}
