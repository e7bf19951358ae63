/*
 * epd_bench_overhead.c — `epd-bench overhead`: what disaggregation costs,
 * beside what physics makes it cost.
 *
 * For each engine (sim profiles in sleep mode, the ref CPU model), each
 * transport and each prompt length, one epd-prefill and one epd-decode
 * daemon are started (with --trace), and the same prefill daemon serves,
 * one request at a time, in rotating order within each repetition:
 *
 *   A  prefill only: GenerateRequest{prefill_only} to prefill alone; it
 *      computes every layer exactly as usual, writes nothing, and answers
 *      with the first token;
 *   B  prefill + KV transfer: the same GenerateRequest to decode and
 *      prefill (proto/README.md); prefill streams each layer's KV into
 *      decode's reservation as it exists, decode checks it;
 *   Z  the protocol without the data (GenerateRequest{protocol_only}): the
 *      reservation, every LayerDone and the PrefillComplete, no write, no
 *      check — what the messages alone cost.
 *
 * Every time is read from the daemons' own traces (CLOCK_MONOTONIC, shared
 * by the processes of one host), parsed after the daemons exit:
 *
 *   t0        prefill's "GenerateRequest received" (its loop thread)
 *   A_i       t0 -> prefill's compute done (the "prefill" span's end: every
 *             layer and the first token sampled, compute thread)
 *   B_i, Z_i  t0 -> decode's "KV held" (PrefillComplete received and every
 *             layer checked)
 *   d_i       B_i - A_i of the same repetition (paired: the machine's load
 *             moves both alike); the row's overhead is median(d) /
 *             median(A), with a distribution-free 95% interval of the
 *             median of d (order statistics of the binomial)
 *   msg       the message latency: LayerDone "sent" (prefill) -> "received"
 *             (decode) in the Z requests (no write to wait for), median
 *   link      the bandwidth the KV moved at: the bytes of a B request over
 *             the union of its "KV write" spans (first post -> last
 *             completion of each layer), median over the B requests
 *   floor     the least B - A that this link and this compute allow, per B
 *             request from its own trace (its own link bandwidth, the row's
 *             message latency): layer l's KV exists at r_l (the
 *             end of its "compute" span: the engine's sink), compute ends
 *             at e; a link of bandwidth `link` that is never idle while
 *             bytes wait finishes at max_l (r_l + bytes(l..L-1) / link),
 *             and PrefillComplete (it carries the first token) leaves at e
 *             at the earliest; so floor = max(0, that - e) + msg, median
 *             over the B requests.  bound = link when the maximum is set by
 *             an earlier layer than the last (the link falls behind KV
 *             production: a backlog) or the whole KV cannot cross in the
 *             compute after the first layer, else compute
 *   excess    ovh - floor: what the runtime adds beyond physics
 *   model     the sim profile's modelled prefill time; A! when A's compute
 *             took more than 2% longer (the host cannot honour the model)
 *   cpu       host CPU per request per thread of each daemon and arm, from
 *             /proc/PID/task/TID/schedstat around each request (ns): what
 *             each arm asks of the machine's cores
 *
 * --kv-dtype MAP (repeatable; or --kv-dtypes "MAP;MAP", ';' between maps
 * since a map holds commas) runs every configuration once per KV dtype map,
 * both daemons started with --kv-dtype MAP and the layer bytes (floor,
 * link) taken from that map's layout; each row names its map (kv_dtype,
 * canonical: what workers register) and its KV bytes per request.
 * Without it each engine keeps its own dtype (sim: its profile's; ref: f32).
 *
 * --tsv prints the same rows machine-readably (columns named in its header:
 * engine, xport, tokens, kv_dtype, kv_bytes, ovh_pct, floor_pct, ...).
 * --trace FILE writes one B request's events from both daemons into one
 * Chrome trace JSON (open it in ui.perfetto.dev).  This measures; it never
 * judges (tests/ do).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "epd_bench.h"
#include "epd_bench_overhead_int.h"
#include "epd_client.h"
#include "epd_engine.h"
#include "epd_kvq.h"
#include "epd_msg.h"
#include "epd_rng.h"
#include "epd_secret.h"
#include "epd_sim.h"
#include "epd_time.h"
#include "epd_xport.h"

/* a GenerateRequest carries its prompt: room for 1M tokens and more (the
 * transport's limit; 1 MiB refused 1M-token prompts) */
#define OB_TXBUF (16u << 20)

static const char *const ob_arm_name[OB_ARMS] = {"A", "B", "Z"};

static const ob_xport_t ob_xports[] = {
    {"ucx-shm", "ucx", NULL, "posix,cma,tcp"},
    {"ucx-tcp", "ucx", NULL, "tcp"},
    {"ofi-tcp", "ofi", "tcp;ofi_rxm", NULL},
};

static const ob_engine_t ob_engines[] = {
    {"dense-70b", "dense-70b.profile", "h200.profile", 4, 0.05},
    {"hybrid-320b", "hybrid-moe-320b.profile", "h200.profile", 8, 0.1},
    {"ref", NULL, NULL, 0, 0},
};

/* ------------------------------------------------------------ processes */

static pid_t ob_spawn(char *const argv[], const ob_xport_t *xp, const char *log)
{
    pid_t pid = fork();

    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        if (xp->ucx_tls != NULL) {
            setenv("UCX_TLS", xp->ucx_tls, 1);
            setenv("UCX_NET_DEVICES", "lo", 1);
        }
        if (xp->provider != NULL) {
            setenv("FI_PROVIDER", xp->provider, 1);
        }
        /* ref runs OpenBLAS on one thread (epd_ref.c); without this its
         * library still starts idle worker threads at load */
        setenv("OPENBLAS_NUM_THREADS", "1", 0);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* SIGTERM, then up to timeout_ms for the exit (the trace is written at
 * exit), then SIGKILL.  0 when the daemon exited cleanly (status 0: under a
 * sanitizer, no report either), -1 otherwise (said on stderr, with its log). */
static int ob_stop(pid_t pid, int timeout_ms, const char *log)
{
    uint64_t end;
    int status;

    if (pid <= 0) {
        return -1;
    }
    kill(pid, SIGTERM);
    end = epd_time_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (epd_time_now_ns() < end) {
        if (waitpid(pid, &status, WNOHANG) == pid) {
            if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
                return 0;
            }
            fprintf(stderr, "overhead: daemon %d ended with %s %d (log: %s)\n", (int)pid,
                    WIFEXITED(status) ? "status" : "signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), log);
            return -1;
        }
        epd_time_sleep_ns(10 * 1000000ull);
    }
    fprintf(stderr, "overhead: pid %d did not stop in %d ms: killed (log: %s)\n", (int)pid,
            timeout_ms, log);
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

/* Waits for a ready file and returns its control address. */
static int ob_wait_ready(const char *path, pid_t pid, char *control, size_t cap)
{
    uint64_t end = epd_time_now_ns() + 120ull * 1000000000ull;
    int status;

    while (epd_time_now_ns() < end) {
        FILE *f = fopen(path, "r");

        if (f != NULL) {
            char line[512];
            char *p;

            if (fgets(line, sizeof(line), f) != NULL && (p = strstr(line, "control=")) != NULL) {
                size_t n = strcspn(p + 8, " \n");

                fclose(f);
                if (n >= cap) {
                    return -1;
                }
                memcpy(control, p + 8, n);
                control[n] = '\0';
                return 0;
            }
            fclose(f);
        }
        if (waitpid(pid, &status, WNOHANG) == pid) {
            return -1;
        }
        epd_time_sleep_ns(20 * 1000000ull);
    }
    return -1;
}

/* ------------------------------------------------------- request plane */

static void ob_on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    ob_t *b = arg;
    Epd__Envelope *env = NULL;
    const char *why = NULL;

    (void)ep;
    if (epd_msg_decode(data, len, &env, &why) != EPD_OK) {
        return;
    }
    if (epd_msg_request_id(env) == b->waiting_id && !b->waiting_done) {
        switch (env->body_case) {
        case EPD__ENVELOPE__BODY_TOKENS:
            if (env->tokens->finish != EPD__FINISH_REASON__FINISH_NONE) {
                b->waiting_done = 1;
                b->waiting_status = env->tokens->finish == EPD__FINISH_REASON__FINISH_LENGTH ||
                                            env->tokens->finish == EPD__FINISH_REASON__FINISH_STOP
                                        ? EPD_OK
                                        : EPD_ERR_CANCELED;
            }
            break;
        case EPD__ENVELOPE__BODY_ERROR:
            b->waiting_done = 1;
            b->waiting_status = env->error->status < 0 ? env->error->status : EPD_ERR_FATAL;
            snprintf(b->waiting_msg, sizeof(b->waiting_msg), "%s: %s", env->sender->worker_id,
                     env->error->message != NULL ? env->error->message : "");
            break;
        case EPD__ENVELOPE__BODY_REFUSED:
            b->waiting_done = 1;
            b->waiting_status = EPD_ERR_NO_CAPACITY;
            snprintf(b->waiting_msg, sizeof(b->waiting_msg), "refused: %s",
                     env->refused->reason != NULL ? env->refused->reason : "");
            break;
        default:
            break;
        }
    }
    epd_msg_free(env);
}

static void ob_on_err(void *arg, epd_xport_ep_t *ep, epd_status_t status)
{
    ob_t *b = arg;

    (void)ep;
    if (!b->waiting_done && b->waiting_id != 0) {
        b->waiting_done = 1;
        b->waiting_status = status;
        snprintf(b->waiting_msg, sizeof(b->waiting_msg), "endpoint failed: %s",
                 epd_status_string(status));
    }
}

static void ob_on_connect(void *arg, epd_status_t status)
{
    ob_t *b = arg;

    if (status == EPD_OK) {
        b->n_connected++;
    } else {
        b->connect_failed = 1;
    }
}

static epd_status_t ob_send_generate(ob_t *b, epd_xport_ep_t *ep, const uint32_t *tokens,
                                     uint32_t n, uint64_t id, int arm)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__SenderRef sender = EPD__SENDER_REF__INIT;
    Epd__Epoch me = EPD__EPOCH__INIT, pe = EPD__EPOCH__INIT, de = EPD__EPOCH__INIT;
    Epd__GenerateRequest g = EPD__GENERATE_REQUEST__INIT;
    Epd__SamplingParams sp = EPD__SAMPLING_PARAMS__INIT;
    char wid[64];
    size_t len;
    epd_status_t st;

    snprintf(wid, sizeof(wid), "bench-overhead-%d", (int)getpid());
    me.start_time_ns = b->epoch_start;
    me.nonce = b->epoch_nonce;
    sender.worker_id = wid;
    sender.epoch = &me;
    env.sender = &sender;
    env.seq = ++b->seq;
    sp.temperature = 0.0f;
    sp.top_p = 1.0f;
    sp.seed = 1;
    sp.max_tokens = 2; /* decode runs exactly one step after the KV is held */
    g.request_id = id;
    g.prompt_tokens = (uint32_t *)tokens;
    g.n_prompt_tokens = n;
    g.sampling = &sp;
    g.prefill_worker_id = b->pi.worker_id;
    pe.start_time_ns = b->pi.epoch_start_ns;
    pe.nonce = b->pi.epoch_nonce;
    g.prefill_epoch = &pe;
    g.prefill_address.data = b->pi.address;
    g.prefill_address.len = b->pi.address_len;
    g.prefill_only = arm == OB_ARM_A;
    g.protocol_only = arm == OB_ARM_Z;
    if (arm != OB_ARM_A) {
        g.decode_worker_id = b->di.worker_id;
        de.start_time_ns = b->di.epoch_start_ns;
        de.nonce = b->di.epoch_nonce;
        g.decode_epoch = &de;
        g.decode_address.data = b->di.address;
        g.decode_address.len = b->di.address_len;
    }
    g.deadline_ms = 120000;
    if (b->attach) {
        /* the daemons' prefix caches are their operator's to configure: a
         * salt per request (rule 35) has every arm compute its whole prompt */
        g.cache_salt.data = (uint8_t *)&id;
        g.cache_salt.len = sizeof(id);
    }
    env.body_case = EPD__ENVELOPE__BODY_GENERATE;
    env.generate = &g;
    st = epd_msg_encode(&env, b->txbuf, OB_TXBUF, &len);
    if (st != EPD_OK) {
        return st;
    }
    for (int tries = 0; tries < 10000; tries++) {
        st = epd_xport_send(ep, b->txbuf, len, 0);
        if (st != EPD_ERR_NO_RESOURCE) {
            return st;
        }
        epd_xport_progress(b->x);
    }
    return st;
}

/* ------------------------------------------------------------------ CPU */

/* Reads every thread of `pid`: its name and CPU time so far (ns). */
static int ob_cpu_read(pid_t pid, ob_task_t *out, int cap)
{
    char path[128];
    DIR *dir;
    struct dirent *de;
    int n = 0;

    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    dir = opendir(path);
    if (dir == NULL) {
        return 0;
    }
    while ((de = readdir(dir)) != NULL && n < cap) {
        char p2[512], comm[32] = "?";
        unsigned long long run = 0;
        FILE *f;

        if (de->d_name[0] == '.') {
            continue;
        }
        snprintf(p2, sizeof(p2), "%s/%s/schedstat", path, de->d_name);
        f = fopen(p2, "r");
        if (f == NULL) {
            continue;
        }
        if (fscanf(f, "%llu", &run) != 1) {
            run = 0;
        }
        fclose(f);
        snprintf(p2, sizeof(p2), "%s/%s/comm", path, de->d_name);
        f = fopen(p2, "r");
        if (f != NULL) {
            if (fgets(comm, sizeof(comm), f) == NULL) {
                snprintf(comm, sizeof(comm), "?");
            }
            fclose(f);
            comm[strcspn(comm, "\n")] = '\0';
        }
        out[n].tid = atoi(de->d_name);
        snprintf(out[n].name, sizeof(out[n].name), "%s", comm);
        out[n].ns = (double)run;
        n++;
    }
    closedir(dir);
    return n;
}

/* Adds what each thread of daemon `which` (0 prefill, 1 decode) ran since
 * the last sample to row `li`, arm `arm` (arm < 0: only take the sample). */
static void ob_cpu_account(ob_t *b, int which, int li, int arm)
{
    ob_task_t now[OB_MAX_THREADS];
    int n = ob_cpu_read(which == 0 ? b->pid_p : b->pid_d, now, OB_MAX_THREADS);

    for (int i = 0; i < n && arm >= 0; i++) {
        double before = 0.0;
        char name[32];
        int k;

        for (int j = 0; j < b->n_tasks[which]; j++) {
            if (b->tasks[which][j].tid == now[i].tid) {
                before = b->tasks[which][j].ns;
                break;
            }
        }
        if (now[i].ns <= before) {
            continue;
        }
        /* the main thread is the daemon's loop; threads that inherit its
         * name are a library's (OpenBLAS's, UCX's) */
        snprintf(name, sizeof(name), "%c:%.28s", which == 0 ? 'p' : 'd',
                 now[i].tid == (which == 0 ? b->pid_p : b->pid_d) ? "loop" : now[i].name);
        for (k = 0; k < b->n_cpu[li]; k++) {
            if (strcmp(b->cpu_tab[li][k].name, name) == 0) {
                break;
            }
        }
        if (k == b->n_cpu[li]) {
            if (k == OB_MAX_THREADS) {
                continue;
            }
            memset(&b->cpu_tab[li][k], 0, sizeof(b->cpu_tab[li][k]));
            snprintf(b->cpu_tab[li][k].name, sizeof(b->cpu_tab[li][k].name), "%s", name);
            b->n_cpu[li]++;
        }
        b->cpu_tab[li][k].ns[arm] += now[i].ns - before;
    }
    memcpy(b->tasks[which], now, sizeof(now[0]) * (size_t)n);
    b->n_tasks[which] = n;
}

/* ------------------------------------------------------------- requests */

/* One request, to completion (the client's view; times come from the
 * traces).  0 or -1 (logged). */
static int ob_request(ob_t *b, const uint32_t *tokens, uint32_t n, int arm, int rep, int warmup,
                      int li)
{
    uint64_t id = b->next_id++;
    uint64_t end;
    epd_status_t st;
    ob_req_t *r;

    if (b->n_reqs >= OB_MAX_REQS) {
        fprintf(stderr, "overhead: too many requests in one configuration\n");
        return -1;
    }
    b->waiting_id = id;
    b->waiting_done = 0;
    b->waiting_status = EPD_OK;
    b->waiting_msg[0] = '\0';
    if (b->cpu) {
        ob_cpu_account(b, 0, li, -1);
        ob_cpu_account(b, 1, li, -1);
    }
    if (arm != OB_ARM_A) {
        st = ob_send_generate(b, b->ep_d, tokens, n, id, arm);
        if (st == EPD_OK) {
            st = ob_send_generate(b, b->ep_p, tokens, n, id, arm);
        }
    } else {
        st = ob_send_generate(b, b->ep_p, tokens, n, id, arm);
    }
    if (st != EPD_OK) {
        fprintf(stderr, "overhead: sending request %llu: %s\n", (unsigned long long)id,
                epd_status_string(st));
        return -1;
    }
    end = epd_time_now_ns() + 30ull * 1000000000ull;
    while (!b->waiting_done && epd_time_now_ns() < end) {
        epd_xport_poll(b->x, 5);
    }
    b->waiting_id = 0;
    if (!b->waiting_done || b->waiting_status != EPD_OK) {
        fprintf(stderr, "overhead: request %llu (%u tokens, %s) failed: %s %s\n",
                (unsigned long long)id, n, ob_arm_name[arm],
                b->waiting_done ? epd_status_string(b->waiting_status) : "no answer in 30 s",
                b->waiting_msg);
        return -1;
    }
    if (b->cpu && !warmup) {
        /* both daemons are idle again: the client had its answer, and
         * prefill answers A last; B's and Z's last work is decode's */
        ob_cpu_account(b, 0, li, arm);
        ob_cpu_account(b, 1, li, arm);
        b->cpu_reqs[li][arm]++;
    }
    r = &b->reqs[b->n_reqs];
    memset(r, 0, sizeof(*r));
    r->ready = calloc((size_t)b->kv.n_layers * 5 + 1, sizeof(double));
    if (r->ready == NULL) {
        return -1;
    }
    r->wr_s = r->ready + b->kv.n_layers;
    r->wr_e = r->wr_s + b->kv.n_layers;
    r->ld_sent = r->wr_e + b->kv.n_layers;
    r->ld_rx = r->ld_sent + b->kv.n_layers;
    b->n_reqs++;
    r->id = id;
    r->n_tokens = n;
    r->arm = arm;
    r->rep = rep;
    r->warmup = warmup;
    return 0;
}

static void ob_free_reqs(ob_t *b)
{
    for (int i = 0; i < b->n_reqs; i++) {
        free(b->reqs[i].ready);
        b->reqs[i].ready = NULL;
    }
    b->n_reqs = 0;
}

/* --------------------------------------------------------------- traces */

static ob_req_t *ob_find(ob_t *b, uint64_t id)
{
    for (int i = b->n_reqs; i-- > 0;) {
        if (b->reqs[i].id == id) {
            return &b->reqs[i];
        }
    }
    return NULL;
}

/* Folds one trace event (ns on the benchmark's clock) into its request,
 * if it is one of ours. */
static void ob_fold(ob_t *b, int is_decode, const char *name, uint64_t req, long long layer,
                    double ts, double dur)
{
    int lok = layer >= 0 && layer < (long long)b->kv.n_layers;
    ob_req_t *r = ob_find(b, req);

    if (r == NULL) {
        return;
    }
    if (!is_decode) {
        if (strncmp(name, "GenerateRequest received", 24) == 0) {
            r->p_recv = ts;
        } else if (strcmp(name, "queued") == 0) {
            r->q_end = ts + dur;
        } else if (strcmp(name, "prefill") == 0) {
            r->c_start = ts;
            r->c_end = ts + dur;
        } else if (strcmp(name, "compute") == 0 && lok) {
            r->ready[layer] = ts + dur;
        } else if (strcmp(name, "KV write") == 0 && lok) {
            r->wr_s[layer] = ts;
            r->wr_e[layer] = ts + dur;
        } else if (strcmp(name, "LayerDone sent") == 0 && lok && r->ld_sent[layer] == 0) {
            r->ld_sent[layer] = ts;
        } else if (strcmp(name, "KvReservation received") == 0) {
            r->resv = ts;
        }
    } else {
        if (strcmp(name, "KV held") == 0) {
            r->d_held = ts;
        } else if (strcmp(name, "first decode step") == 0) {
            r->step1 = dur;
        } else if (strcmp(name, "PrefillComplete received") == 0) {
            r->pc_recv = ts;
        } else if (strcmp(name, "LayerDone received") == 0 && lok && r->ld_rx[layer] == 0) {
            r->ld_rx[layer] = ts;
        }
    }
}

/* Folds one daemon's trace into the requests.  Returns the root (owned by
 * the caller) or NULL. */
static json_t *ob_read_trace(ob_t *b, const char *path, int is_decode)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    json_t *evs, *e;
    size_t i;

    if (root == NULL) {
        fprintf(stderr, "overhead: trace %s: %s (line %d)\n", path, jerr.text, jerr.line);
        return NULL;
    }
    evs = json_object_get(root, "traceEvents");
    json_array_foreach(evs, i, e)
    {
        const char *name = json_string_value(json_object_get(e, "name"));
        json_t *args = json_object_get(e, "args");
        json_t *req = json_object_get(args, "req");
        json_t *lj = json_object_get(args, "layer");
        double ts = json_number_value(json_object_get(e, "ts")) * 1000.0;
        double dur = json_number_value(json_object_get(e, "dur")) * 1000.0;
        long long layer = json_is_integer(lj) ? json_integer_value(lj) : -1;

        if (name == NULL || !json_is_integer(req)) {
            continue;
        }
        ob_fold(b, is_decode, name, (uint64_t)json_integer_value(req), layer, ts, dur);
    }
    return root;
}

/* Writes request `id`'s events of both daemons (and their track names)
 * into one Chrome trace file. */
static int ob_write_merged(const char *out, json_t *p, json_t *d, uint64_t id)
{
    json_t *root = json_object();
    json_t *all = json_array();
    json_t *srcs[2] = {p, d};
    int rc;

    for (int s = 0; s < 2; s++) {
        json_t *evs = json_object_get(srcs[s], "traceEvents"), *e;
        size_t i;

        json_array_foreach(evs, i, e)
        {
            const char *ph = json_string_value(json_object_get(e, "ph"));
            json_t *req = json_object_get(json_object_get(e, "args"), "req");

            if ((ph != NULL && strcmp(ph, "M") == 0) ||
                (json_is_integer(req) && (uint64_t)json_integer_value(req) == id)) {
                json_array_append(all, e);
            }
        }
    }
    json_object_set_new(root, "displayTimeUnit", json_string("ns"));
    json_object_set_new(root, "traceEvents", all);
    rc = json_dump_file(root, out, JSON_COMPACT);
    json_decref(root);
    return rc;
}

/* ---------------------------------------------------------------- stats */

static int ob_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

/* Median of v[0..n) (sorted in place); NaN when empty. */
static double ob_median(double *v, int n)
{
    if (n == 0) {
        return NAN;
    }
    qsort(v, (size_t)n, sizeof(*v), ob_cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The distribution-free ~95% interval of the median of v[0..n) (sorted):
 * [v_(k), v_(n-k+1)] with k the largest rank such that P(Bin(n, 1/2) <
 * k) <= 0.025.  NaN when n is too small for one (n < 6). */
static void ob_median_ci(const double *v, int n, double *lo_p, double *hi_p)
{
    double cdf = 0.0, p = pow(0.5, n); /* P(X = 0) */
    int k = 0;

    for (int j = 0; j < n; j++) {
        cdf += p;             /* P(X <= j) */
        if (cdf > 0.025) {
            break;
        }
        k = j + 1;            /* P(X < k) = P(X <= j) <= 0.025 */
        p = p * (n - j) / (j + 1);
    }
    if (k < 1) {
        *lo_p = *hi_p = NAN;
        return;
    }
    *lo_p = v[k - 1];
    *hi_p = v[n - k];
}

/* Bytes layer l of a request of n_tokens writes. */
static double ob_layer_bytes(const epd_kv_layout_t *kv, uint32_t l, uint32_t n_tokens)
{
    if (kv->kind[l] == EPD_LAYER_LINEAR) {
        return (double)kv->state_bytes;
    }
    /* a KV dtype map: each layer's own block size */
    return (double)((n_tokens + kv->block_tokens - 1) / kv->block_tokens) *
           (double)epd_kv_layer_block_bytes(kv, l);
}

/* KV bytes of a whole request of n_tokens (every layer). */
static double ob_req_bytes(const epd_kv_layout_t *kv, uint32_t n_tokens)
{
    double bytes = 0.0;

    for (uint32_t l = 0; l < kv->n_layers; l++) {
        bytes += ob_layer_bytes(kv, l, n_tokens);
    }
    return bytes;
}

/* The KV of a B request over the union of its layers' write spans (B/s),
 * or 0 when it wrote nothing. */
static double ob_req_bw(const ob_t *b, const ob_req_t *r)
{
    double bytes = 0.0, busy = 0.0, cur_s = 0.0, cur_e = -1.0;
    double s[EPD_KV_MAX_LAYERS], e[EPD_KV_MAX_LAYERS];
    int n = 0;

    for (uint32_t l = 0; l < b->kv.n_layers; l++) {
        if (r->wr_e[l] > r->wr_s[l]) {
            s[n] = r->wr_s[l];
            e[n] = r->wr_e[l];
            n++;
            bytes += ob_layer_bytes(&b->kv, l, r->n_tokens);
        }
    }
    /* spans are in layer order and nearly sorted; a union by insertion */
    for (int i = 1; i < n; i++) {
        for (int j = i; j > 0 && s[j] < s[j - 1]; j--) {
            double t = s[j];
            s[j] = s[j - 1];
            s[j - 1] = t;
            t = e[j];
            e[j] = e[j - 1];
            e[j - 1] = t;
        }
    }
    for (int i = 0; i < n; i++) {
        if (s[i] > cur_e) {
            busy += cur_e > cur_s ? cur_e - cur_s : 0.0;
            cur_s = s[i];
            cur_e = e[i];
        } else if (e[i] > cur_e) {
            cur_e = e[i];
        }
    }
    busy += cur_e > cur_s ? cur_e - cur_s : 0.0;
    return busy > 0.0 ? bytes / (busy / 1e9) : 0.0;
}

/* The floor of B - A for one B request (ns), given the link's bandwidth
 * (B/s) and one message's latency (ns); *link_bound_p says whether the
 * link, not the compute, sets it. */
static double ob_req_floor(const ob_t *b, const ob_req_t *r, double bw, double msg,
                           int *link_bound_p)
{
    uint32_t L = b->kv.n_layers;
    double rest = 0.0, finish = 0.0, first_ready = 0.0, total = 0.0;
    uint32_t arg = L;

    for (uint32_t l = L; l-- > 0;) {
        double f;

        rest += ob_layer_bytes(&b->kv, l, r->n_tokens);
        if (r->ready[l] <= 0.0 || bw <= 0.0) {
            continue;
        }
        f = r->ready[l] + rest / bw * 1e9;
        if (f > finish) {
            finish = f;
            arg = l;
        }
        first_ready = r->ready[l];
    }
    total = rest;
    *link_bound_p = arg + 1 < L ||
                    (bw > 0.0 && first_ready > 0.0 && total / bw * 1e9 > r->c_end - first_ready);
    return (finish > r->c_end ? finish - r->c_end : 0.0) + msg;
}

static void ob_row(const ob_t *b, uint32_t len, ob_row_t *row)
{
    static double va[OB_MAX_REQS], vb[OB_MAX_REQS], vz[OB_MAX_REQS], vd[OB_MAX_REQS],
        vzd[OB_MAX_REQS], vc[OB_MAX_REQS], vmsg[OB_MAX_REQS * 4], vbw[OB_MAX_REQS],
        vfl[OB_MAX_REQS], vq[OB_MAX_REQS], vr[OB_MAX_REQS], vt[OB_MAX_REQS], vv[OB_MAX_REQS],
        vs[OB_MAX_REQS], vbc[OB_MAX_REQS];
    int na = 0, nb = 0, nz = 0, nd = 0, nzd = 0, nmsg = 0, nbw = 0, nfl = 0, nlink = 0;

    memset(row, 0, sizeof(*row));
    row->model_ms = NAN;
    if (b->have_timing) {
        double s = 0.0;

        for (uint32_t l = 0; l < b->timing.n_layers; l++) {
            s += epd_sim_prefill_seconds(&b->timing, l, 0, len);
        }
        row->model_ms = s * 1e3;
    }
    for (int i = 0; i < b->n_reqs; i++) {
        const ob_req_t *r = &b->reqs[i];

        if (r->n_tokens != len || r->warmup || !r->ok) {
            continue;
        }
        if (r->arm == OB_ARM_A) {
            vc[na] = r->c_end - r->c_start;
            va[na++] = r->c_end - r->p_recv;
        } else if (r->arm == OB_ARM_B) {
            vb[nb] = r->d_held - r->p_recv;
            vq[nb] = r->q_end - r->p_recv;
            vr[nb] = r->resv - r->p_recv;
            vt[nb] = r->d_held - r->c_end;
            vv[nb] = r->pc_recv > 0 ? r->d_held - r->pc_recv : 0.0;
            vs[nb] = r->step1;
            vbc[nb] = r->c_end - r->c_start;
            nb++;
            if ((vbw[nbw] = ob_req_bw(b, r)) > 0.0) {
                nbw++;
            }
        } else {
            vz[nz++] = r->d_held - r->p_recv;
            for (uint32_t l = 0; l < b->kv.n_layers && nmsg < OB_MAX_REQS * 4; l++) {
                if (r->ld_sent[l] > 0 && r->ld_rx[l] > r->ld_sent[l]) {
                    vmsg[nmsg++] = r->ld_rx[l] - r->ld_sent[l];
                }
            }
        }
    }
    /* pairs: the A and B (Z) of one repetition */
    for (int i = 0; i < b->n_reqs; i++) {
        const ob_req_t *ra = &b->reqs[i];

        if (ra->n_tokens != len || ra->warmup || !ra->ok || ra->arm != OB_ARM_A) {
            continue;
        }
        for (int j = 0; j < b->n_reqs; j++) {
            const ob_req_t *rx = &b->reqs[j];

            if (rx->n_tokens != len || rx->warmup || !rx->ok || rx->rep != ra->rep) {
                continue;
            }
            if (rx->arm == OB_ARM_B) {
                vd[nd++] = (rx->d_held - rx->p_recv) - (ra->c_end - ra->p_recv);
            } else if (rx->arm == OB_ARM_Z) {
                vzd[nzd++] = (rx->d_held - rx->p_recv) - (ra->c_end - ra->p_recv);
            }
        }
    }
    row->n_pairs = nd;
    row->a_ms = ob_median(va, na) / 1e6;
    row->a_compute_ms = ob_median(vc, na) / 1e6;
    row->b_ms = ob_median(vb, nb) / 1e6;
    row->z_ms = ob_median(vz, nz) / 1e6;
    row->d_ms = ob_median(vd, nd) / 1e6;
    ob_median_ci(vd, nd, &row->d_lo_ms, &row->d_hi_ms);
    row->d_lo_ms /= 1e6;
    row->d_hi_ms /= 1e6;
    row->zd_ms = ob_median(vzd, nzd) / 1e6;
    row->msg_us = ob_median(vmsg, nmsg) / 1e3;
    row->link_gbs = ob_median(vbw, nbw) / 1e9;
    row->queue_ms = ob_median(vq, nb) / 1e6;
    row->resv_ms = ob_median(vr, nb) / 1e6;
    row->tail_ms = ob_median(vt, nb) / 1e6;
    row->verify_ms = ob_median(vv, nb) / 1e6;
    row->step1_ms = ob_median(vs, nb) / 1e6;
    row->b_compute_ms = ob_median(vbc, nb) / 1e6;
    for (int i = 0; i < b->n_reqs; i++) {
        const ob_req_t *r = &b->reqs[i];
        int lb = 0;

        if (r->n_tokens != len || r->warmup || !r->ok || r->arm != OB_ARM_B) {
            continue;
        }
        double bw = ob_req_bw(b, r); /* the link as this request found it */

        vfl[nfl++] = ob_req_floor(b, r, bw > 0.0 ? bw : row->link_gbs * 1e9,
                                  isnan(row->msg_us) ? 0.0 : row->msg_us * 1e3, &lb);
        nlink += lb;
    }
    row->floor_ms = ob_median(vfl, nfl) / 1e6;
    row->link_bound = 2 * nlink > nfl;
    row->a_flag = !isnan(row->model_ms) && row->a_compute_ms > row->model_ms * 1.02;
}

/* ------------------------------------------------------------- printing */

static void ob_fmt(char *buf, size_t cap, const char *fmt, double v)
{
    if (isnan(v)) {
        snprintf(buf, cap, "-");
    } else {
        snprintf(buf, cap, fmt, v);
    }
}

static void ob_print_header(const ob_t *b)
{
    if (b->tsv) {
        printf("engine\txport\ttokens\tkv_dtype\tkv_bytes\tovh_pct\tfloor_pct\texcess_pct\tbound\tpairs\tmodel_ms\ta_ms"
               "\tb_ms\tdiff_ms\tdiff_lo_ms\tdiff_hi_ms\tzero_ms\tzero_diff_ms\tmsg_us\tlink_gbs"
               "\tfloor_ms\ta_compute_ms\ta_flag\ttail_ms\tverify_ms\n");
        return;
    }
    printf("%-11s %-7s %6s %-*s %8s %5s | %8s %8s %8s | %8s %-19s %7s | %6s %7s %8s %7s %7s %-7s "
           "| %8s\n",
           "engine", "xport", "tokens", b->kv_w, "kv_dtype", "KV MB", "pairs", "model", "A med", "B med", "B-A", "[95% CI]", "ovh",
           "msg us", "GB/s", "floor", "floor", "excess", "bound", "Z-A");
}

static void ob_print_row(const ob_t *b, const ob_engine_t *e, const ob_xport_t *xp, uint32_t len,
                         const ob_row_t *w)
{
    double ovh = 100.0 * w->d_ms / w->a_ms;
    double fl = 100.0 * w->floor_ms / w->a_ms;
    char m[32], ci[48], msg[32], bw[32], z[32];

    if (b->tsv) {
        printf("%s\t%s\t%u\t%s\t%.0f\t%.3f\t%.3f\t%.3f\t%s\t%d\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f"
               "\t%.2f\t%.3f\t%.4f\t%.4f\t%d\t%.4f\t%.4f\n",
               e->name, xp->name, len, b->kv_name, ob_req_bytes(&b->kv, len), ovh, fl, ovh - fl,
               w->link_bound ? "link" : "compute", w->n_pairs, w->model_ms, w->a_ms, w->b_ms, w->d_ms, w->d_lo_ms, w->d_hi_ms, w->z_ms,
               w->zd_ms, w->msg_us, w->link_gbs, w->floor_ms, w->a_compute_ms, w->a_flag,
               w->tail_ms, w->verify_ms);
        return;
    }
    ob_fmt(m, sizeof(m), "%8.3f", w->model_ms);
    if (isnan(w->d_lo_ms)) {
        snprintf(ci, sizeof(ci), "[-]");
    } else {
        snprintf(ci, sizeof(ci), "[%+.3f, %+.3f]", w->d_lo_ms, w->d_hi_ms);
    }
    ob_fmt(msg, sizeof(msg), "%6.1f", w->msg_us);
    ob_fmt(bw, sizeof(bw), "%7.2f", w->link_gbs);
    ob_fmt(z, sizeof(z), "%+8.3f", w->zd_ms);
    printf("%-11s %-7s %6u %-*s %8.3f %5d | %8s %7.3f%s %8.3f | %+8.3f %-19s %6.2f%% | %6s %7s "
           "%8.3f %6.2f%% %6.2f%% %-7s | %8s\n",
           e->name, xp->name, len, b->kv_w, b->kv_name, ob_req_bytes(&b->kv, len) / 1e6, w->n_pairs, m, w->a_ms, w->a_flag ? "!" : " ", w->b_ms,
           w->d_ms, ci, ovh, msg, bw, w->floor_ms, fl, ovh - fl,
           w->link_bound ? "link" : "compute", z);
    printf("%-28s compute A %.3f B %.3f  tail %.3f  verify %.3f  queue %.3f  resv %.3f  step1 "
           "%.3f ms%s\n",
           "", w->a_compute_ms, w->b_compute_ms, w->tail_ms, w->verify_ms, w->queue_ms, w->resv_ms,
           w->step1_ms,
           w->a_flag ? "  (A! = A's compute took > 2% longer than the model)" : "");
}

/* Host CPU per request of each thread and arm, for row li. */
static void ob_print_cpu(const ob_t *b, int li)
{
    if (!b->cpu || b->tsv || b->n_cpu[li] == 0) {
        return;
    }
    printf("%-28s cpu ms/req", "");
    for (int arm = 0; arm < OB_ARMS; arm++) {
        int n = b->cpu_reqs[li][arm];
        double total = 0.0;

        if (n == 0) {
            continue;
        }
        for (int k = 0; k < b->n_cpu[li]; k++) {
            total += b->cpu_tab[li][k].ns[arm];
        }
        printf("  %s %.2f:", ob_arm_name[arm], total / n / 1e6);
        for (int k = 0; k < b->n_cpu[li]; k++) {
            double v = b->cpu_tab[li][k].ns[arm] / n / 1e6;

            if (v >= 0.005) {
                printf(" %s %.2f", b->cpu_tab[li][k].name, v);
            }
        }
    }
    printf("\n");
}

/* ------------------------------------------------------ one configuration */

static void ob_group_name(long long g, char *buf, size_t cap)
{
    if (g == OB_GROUP_DEFAULT) {
        snprintf(buf, cap, "default");
    } else if (g == 0) {
        snprintf(buf, cap, "per-layer");
    } else if (g % (1 << 20) == 0) {
        snprintf(buf, cap, "%lldM", g >> 20);
    } else if (g % 1024 == 0) {
        snprintf(buf, cap, "%lldK", g >> 10);
    } else {
        snprintf(buf, cap, "%lld", g);
    }
}

static int ob_model_dir(ob_t *b, const ob_engine_t *e, char *dir, size_t cap)
{
    if (e->profile == NULL) {
        if (b->ref_model != NULL) {
            snprintf(dir, cap, "%s", b->ref_model);
            return 0;
        }
        snprintf(dir, cap, "%s/ref-model", b->tmp);
        if (access(dir, F_OK) != 0) {
            char cmd[PATH_MAX * 2 + 128];

            /* small enough for a 2-core machine: 8 layers LLA, dim 256 */
            snprintf(cmd, sizeof(cmd), "'%s/epd-mkmodel' --out '%s' --max-context 40000 >/dev/null",
                     b->bindir, dir);
            if (system(cmd) != 0) {
                fprintf(stderr, "overhead: epd-mkmodel failed\n");
                return -1;
            }
        }
        return 0;
    } else {
        epd_sim_options_t o;
        char model[PATH_MAX], accel[PATH_MAX];
        epd_status_t st;

        snprintf(dir, cap, "%s/sim-%s-%g", b->tmp, e->name, b->scale > 0.0 ? b->scale : e->scale);
        snprintf(model, sizeof(model), "%s/%s", b->profiles, e->profile);
        snprintf(accel, sizeof(accel), "%s/%s", b->profiles, e->accel);
        memset(&o, 0, sizeof(o));
        o.model = model;
        o.accel = accel;
        o.scale = b->scale > 0.0 ? b->scale : e->scale;
        o.devices = e->devices;
        o.mode = EPD_SIM_SLEEP;
        o.seed = 1;
        o.vocab = 4096; /* the logits of step 0 are not what is measured */
        st = epd_sim_conf_write(dir, &o);
        if (st != EPD_OK) {
            fprintf(stderr, "overhead: sim.conf for %s from %s: %s\n", e->name, b->profiles,
                    epd_status_string(st));
            return -1;
        }
        return 0;
    }
}

/* The engine's KV layout (bytes per layer) and, for sim, its timing, with
 * KV dtype map `kvd` (NULL: the engine's own dtype). */
static int ob_engine_facts(ob_t *b, const ob_engine_t *e, const char *model, const char *kvd)
{
    epd_engine_config_t cfg = {
        .model_dir = model, .block_tokens = OB_BLOCK_TOKENS, .kv_dtype = kvd};
    epd_engine_t *eng = NULL;

    if (epd_engine_open(e->profile != NULL ? "sim" : "ref", &cfg, &eng) != EPD_OK) {
        fprintf(stderr, "overhead: cannot open engine %s from %s\n", e->name, model);
        return -1;
    }
    b->kv = epd_engine_info(eng)->kv;
    epd_engine_close(eng);
    epd_kvq_map_format(&b->kv, b->kv_name, sizeof(b->kv_name));
    b->have_timing = 0;
    if (e->profile != NULL) {
        epd_sim_conf_t conf;

        if (epd_sim_conf_load(model, &conf) != EPD_OK) {
            return -1;
        }
        if (kvd != NULL) {
            /* as the engine: --kv-dtype wins over sim.conf (the engine above
             * accepted it, so it fits) */
            snprintf(conf.kv_dtype_map, sizeof(conf.kv_dtype_map), "%s", kvd);
        }
        if (epd_sim_timing_init(&conf, OB_BLOCK_TOKENS, &b->timing) != EPD_OK) {
            return -1;
        }
        b->have_timing = 1;
    }
    return 0;
}

/* Runs one daemon pair (KV dtype map kvd; NULL: the engine's own) over
 * `lengths` and prints its rows. */
static int ob_config(ob_t *b, const ob_engine_t *e, const ob_xport_t *xp, long long group,
                     const char *kvd, const uint32_t *lengths, int n_lengths)
{
    char model[PATH_MAX], p_ready[PATH_MAX], d_ready[PATH_MAX], p_trace[PATH_MAX],
        d_trace[PATH_MAX], p_log[PATH_MAX], d_log[PATH_MAX], p_ctl[128], d_ctl[128];
    char pexe[PATH_MAX], dexe[PATH_MAX], gbuf[32], kvb_p[32], kvb_d[32], gname[32], cbuf[16];
    int arms[OB_ARMS] = {OB_ARM_A, OB_ARM_B, OB_ARM_Z};
    int n_arms = b->zero ? 3 : 2;
    uint32_t max_len = 0;
    pid_t pp = -1, pd = -1;
    epd_xport_config_t xc;
    json_t *pj = NULL, *dj = NULL;
    epd_rng_t rng;
    uint32_t *tokens = NULL;
    uint64_t trace_id = 0;
    int rc = -1;

    for (int i = 0; i < n_lengths; i++) {
        max_len = lengths[i] > max_len ? lengths[i] : max_len;
    }
    if (ob_model_dir(b, e, model, sizeof(model)) != 0 ||
        ob_engine_facts(b, e, model, kvd) != 0) {
        return -1;
    }
    memset(b->n_cpu, 0, sizeof(b->n_cpu));
    memset(b->cpu_reqs, 0, sizeof(b->cpu_reqs));
    memset(b->n_tasks, 0, sizeof(b->n_tasks));
    ob_group_name(group, gname, sizeof(gname));
    snprintf(p_ready, sizeof(p_ready), "%s/p.ready", b->tmp);
    snprintf(d_ready, sizeof(d_ready), "%s/d.ready", b->tmp);
    snprintf(p_trace, sizeof(p_trace), "%s/p.json", b->tmp);
    snprintf(d_trace, sizeof(d_trace), "%s/d.json", b->tmp);
    /* numbered: one per configuration, KV dtype maps included */
    b->n_configs++;
    snprintf(p_log, sizeof(p_log), "%s/p-%s-%s-%s-%d.log", b->tmp, e->name, xp->name, gname,
             b->n_configs);
    snprintf(d_log, sizeof(d_log), "%s/d-%s-%s-%s-%d.log", b->tmp, e->name, xp->name, gname,
             b->n_configs);
    unlink(p_ready);
    unlink(d_ready);
    unlink(p_trace);
    unlink(d_trace);
    snprintf(pexe, sizeof(pexe), "%s/epd-prefill", b->bindir);
    snprintf(dexe, sizeof(dexe), "%s/epd-decode", b->bindir);
    /* prefill frees a request's blocks only after its last write completed
     * and the compute thread released it, which may be after decode already
     * answered: room for three prompts */
    snprintf(kvb_p, sizeof(kvb_p), "%u", 3 * (max_len / OB_BLOCK_TOKENS + 1) + 8);
    /* decode admits a prompt (KV on demand) only while its blocks plus a
     * watermark of 1% of the pool stay free (epd__decode_kv_may_admit):
     * the prompt, 16 blocks of headroom and growth, and 2% on top (a 32k
     * prompt found 2,064 blocks too few: 2,049 + 20 wanted) */
    {
        uint32_t d_blocks = max_len / OB_BLOCK_TOKENS + 16;

        snprintf(kvb_d, sizeof(kvb_d), "%u", d_blocks + d_blocks / 50 + 1);
    }
    snprintf(gbuf, sizeof(gbuf), "%lld", group);
    {
        char *dargv[48], *pargv[48];
        int n = 0;

        dargv[n++] = dexe;
        dargv[n++] = "--engine";
        dargv[n++] = e->profile != NULL ? "sim" : "ref";
        dargv[n++] = "--model";
        dargv[n++] = model;
        dargv[n++] = "--transport";
        dargv[n++] = (char *)xp->backend;
        dargv[n++] = "--worker-id";
        dargv[n++] = "bench-decode";
        dargv[n++] = "--ready-file";
        dargv[n++] = d_ready;
        dargv[n++] = "--trace";
        dargv[n++] = d_trace;
        dargv[n++] = "--kv-blocks";
        dargv[n++] = kvb_d;
        dargv[n++] = "--state-slots";
        dargv[n++] = "8";
        dargv[n++] = "--lease-ms";
        dargv[n++] = "60000";
        dargv[n++] = "--peer-timeout-ms";
        dargv[n++] = "30000";
        dargv[n++] = "--log-level";
        dargv[n++] = getenv("EPD_BENCH_LOG_LEVEL") != NULL ? getenv("EPD_BENCH_LOG_LEVEL") : "warn";
        dargv[n++] = "--cluster-secret-file";
        dargv[n++] = b->secret_file;
        if (xp->provider != NULL) {
            dargv[n++] = "--provider";
            dargv[n++] = (char *)xp->provider;
        }
        if (kvd != NULL) {
            dargv[n++] = "--kv-dtype";
            dargv[n++] = (char *)kvd;
        }
        dargv[n] = NULL;
        /* prefill takes the same flags, then its own */
        for (int i = 0; i <= n; i++) {
            pargv[i] = dargv[i];
        }
        pargv[0] = pexe;
        pargv[8] = "bench-prefill";
        pargv[10] = p_ready;
        pargv[12] = p_trace;
        pargv[14] = kvb_p;
        /* every arm computes its whole prompt: the prefix cache (on by
         * default) would let repeated prompts skip their compute */
        pargv[n++] = "--no-prefix-cache";
        pargv[n] = NULL;
        if (group != OB_GROUP_DEFAULT) {
            pargv[n++] = "--write-group-bytes";
            pargv[n++] = gbuf;
            pargv[n] = NULL;
        }
        if (b->chunk_tokens >= 0) {
            /* long prompts: chunked prefill streams each chunk's KV as it
             * is made (docs/long-context.md); absent, the engine's default */
            snprintf(cbuf, sizeof(cbuf), "%d", b->chunk_tokens);
            pargv[n++] = "--prefill-chunk-tokens";
            pargv[n++] = cbuf;
            pargv[n] = NULL;
        }
        /* decode's own */
        n = 0;
        while (dargv[n] != NULL) {
            n++;
        }
        dargv[n++] = "--max-batch";
        dargv[n++] = "4";
        dargv[n++] = "--verify";
        dargv[n++] = (char *)b->verify;
        dargv[n] = NULL;
        pd = ob_spawn(dargv, xp, d_log);
        pp = ob_spawn(pargv, xp, p_log);
    }
    b->pid_p = pp;
    b->pid_d = pd;
    if (pd < 0 || pp < 0 || ob_wait_ready(d_ready, pd, d_ctl, sizeof(d_ctl)) != 0 ||
        ob_wait_ready(p_ready, pp, p_ctl, sizeof(p_ctl)) != 0) {
        fprintf(stderr, "overhead: daemons did not start (logs: %s, %s)\n", p_log, d_log);
        goto out;
    }
    {
        char err[256];

        if (epd_client_health(p_ctl, 10000, &b->pi, err, sizeof(err)) != EPD_OK ||
            epd_client_health(d_ctl, 10000, &b->di, err, sizeof(err)) != EPD_OK) {
            fprintf(stderr, "overhead: Health: %s\n", err);
            goto out;
        }
    }
    if (xp->provider != NULL) {
        setenv("FI_PROVIDER", xp->provider, 1);
    }
    if (xp->ucx_tls != NULL) {
        setenv("UCX_TLS", xp->ucx_tls, 1);
        setenv("UCX_NET_DEVICES", "lo", 1);
    }
    epd_xport_config_init(&xc);
    xc.backend = xp->backend;
    xc.provider = xp->provider;
    xc.max_msg_size = epd_msg_cap_for_context(max_len); /* the prompt travels whole */
    xc.peer_timeout_ms = 60000;
    xc.connect_timeout_ms = 10000;
    xc.msg_cb = ob_on_msg;
    xc.err_cb = ob_on_err;
    xc.cb_arg = b;
    xc.secret = b->secret.bytes;
    xc.secret_len = b->secret.len;
    snprintf(xc.identity.worker_id, sizeof(xc.identity.worker_id), "bench-overhead-%d",
             (int)getpid());
    xc.identity.role = EPD_CLIENT_ROLE_TOOL;
    xc.identity.epoch.start_time_ns = b->epoch_start;
    xc.identity.epoch.nonce = b->epoch_nonce;
    if (epd_xport_create(&xc, &b->x) != EPD_OK) {
        fprintf(stderr, "overhead: cannot start the client transport %s\n", xp->name);
        goto out;
    }
    b->n_connected = 0;
    b->connect_failed = 0;
    if (epd_xport_connect(b->x, b->pi.address, b->pi.address_len, ob_on_connect, b, &b->ep_p) !=
            EPD_INPROGRESS ||
        epd_xport_connect(b->x, b->di.address, b->di.address_len, ob_on_connect, b, &b->ep_d) !=
            EPD_INPROGRESS) {
        fprintf(stderr, "overhead: cannot connect to the daemons\n");
        goto out;
    }
    {
        uint64_t end = epd_time_now_ns() + 15ull * 1000000000ull;

        while (b->n_connected < 2 && !b->connect_failed && epd_time_now_ns() < end) {
            epd_xport_poll(b->x, 5);
        }
    }
    if (b->n_connected < 2) {
        fprintf(stderr, "overhead: connecting to the daemons failed\n");
        goto out;
    }

    tokens = malloc(sizeof(*tokens) * (max_len + 1));
    if (tokens == NULL) {
        goto out;
    }
    epd_rng_seed(&rng, 42);
    ob_free_reqs(b);
    for (int li = 0; li < n_lengths; li++) {
        uint32_t len = lengths[li];
        int reps = e->profile == NULL ? b->reps_ref : len >= 16384 ? b->reps_long : b->reps;

        tokens[0] = 256; /* BOS of the byte tokenizer; an ordinary id for sim */
        for (uint32_t t = 1; t < len; t++) {
            /* below 128: one varint byte each, so 32k tokens fit a 64 KiB message */
            tokens[t] = 1 + (uint32_t)(epd_rng_next(&rng) % 127);
        }
        for (int w = 0; w < b->warmup; w++) {
            for (int k = 0; k < n_arms; k++) {
                if (ob_request(b, tokens, len, arms[k], -1, 1, li) != 0) {
                    goto out;
                }
            }
        }
        /* each repetition runs every arm once, in rotating order, so that
         * no arm always goes first (or always follows the same one) */
        for (int r = 0; r < reps; r++) {
            for (int k = 0; k < n_arms; k++) {
                int arm = arms[(k + r) % n_arms];

                if (ob_request(b, tokens, len, arm, li * 100000 + r, 0, li) != 0) {
                    goto out;
                }
                if (arm == OB_ARM_B && (len == b->trace_len || trace_id == 0)) {
                    trace_id = b->reqs[b->n_reqs - 1].id;
                }
            }
        }
    }
    rc = 0;
out:
    free(tokens);
    if (b->x != NULL) {
        epd_xport_ep_close(b->ep_p);
        epd_xport_ep_close(b->ep_d);
        epd_xport_destroy(b->x);
        b->x = NULL;
        b->ep_p = b->ep_d = NULL;
    }
    if (ob_stop(pp, 30000, p_log) != 0) {
        rc = -1;
    }
    if (ob_stop(pd, 30000, d_log) != 0) {
        rc = -1;
    }
    if (rc != 0) {
        ob_free_reqs(b);
        return rc;
    }
    pj = ob_read_trace(b, p_trace, 0);
    dj = ob_read_trace(b, d_trace, 1);
    if (pj == NULL || dj == NULL) {
        json_decref(pj);
        json_decref(dj);
        ob_free_reqs(b);
        return -1;
    }
    for (int i = 0; i < b->n_reqs; i++) {
        ob_req_t *r = &b->reqs[i];

        r->ok = r->p_recv > 0 && r->c_end > 0 && r->c_start > 0 &&
                (r->arm == OB_ARM_A || r->d_held > 0);
    }
    if (b->trace_out != NULL && !b->trace_written && trace_id != 0) {
        if (ob_write_merged(b->trace_out, pj, dj, trace_id) == 0) {
            ob_req_t *r = ob_find(b, trace_id);

            printf("# trace of request %llu (%s, %s, %u tokens, KV %s, %s, prefill + transfer) -> "
                   "%s\n",
                   (unsigned long long)trace_id, e->name, xp->name, r != NULL ? r->n_tokens : 0,
                   b->kv_name, gname, b->trace_out);
            b->trace_written = 1;
        } else {
            fprintf(stderr, "overhead: cannot write %s\n", b->trace_out);
        }
    }
    json_decref(pj);
    json_decref(dj);

    for (int li = 0; li < n_lengths; li++) {
        ob_row_t row;

        ob_row(b, lengths[li], &row);
        ob_print_row(b, e, xp, lengths[li], &row);
        ob_print_cpu(b, li);
        fflush(stdout);
    }
    ob_free_reqs(b);
    return 0;
}

/* ----------------------------------------------------------------- main */

static int ob_parse_u32_list(const char *s, uint32_t *out, int *n_p)
{
    int n = 0;

    while (*s != '\0') {
        char *end;
        unsigned long v = strtoul(s, &end, 10);

        if (end == s || n == OB_MAX_LIST) {
            return -1;
        }
        if (*end == 'k' || *end == 'K') {
            v *= 1024;
            end++;
        }
        if (v == 0 || v > 1u << 20) {
            return -1;
        }
        out[n++] = (uint32_t)v;
        s = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0') {
            return -1;
        }
    }
    *n_p = n;
    return n > 0 ? 0 : -1;
}

static int ob_parse_names(const char *s, int engines, ob_t *b)
{
    char buf[512];
    char *save = NULL;

    snprintf(buf, sizeof(buf), "%s", s);
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        int found = 0;

        if (engines) {
            for (size_t i = 0; i < sizeof(ob_engines) / sizeof(ob_engines[0]); i++) {
                if (strcmp(tok, ob_engines[i].name) == 0 && b->n_engines < OB_MAX_LIST) {
                    b->engines[b->n_engines++] = &ob_engines[i];
                    found = 1;
                }
            }
        } else {
            for (size_t i = 0; i < sizeof(ob_xports) / sizeof(ob_xports[0]); i++) {
                if (strcmp(tok, ob_xports[i].name) == 0 && b->n_xports < OB_MAX_LIST) {
                    b->xports[b->n_xports++] = &ob_xports[i];
                    found = 1;
                }
            }
        }
        if (!found) {
            fprintf(stderr, "overhead: unknown %s '%s'\n", engines ? "engine" : "transport", tok);
            return -1;
        }
    }
    return 0;
}

static int ob_parse_groups(const char *s, long long *groups, int *n_p)
{
    char buf[512];
    char *save = NULL;
    int n = 0;

    snprintf(buf, sizeof(buf), "%s", s);
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        long long v;
        char *end;

        if (n == OB_MAX_LIST) {
            return -1;
        }
        if (strcmp(tok, "default") == 0) {
            v = OB_GROUP_DEFAULT;
        } else if (strcmp(tok, "per-layer") == 0) {
            v = 0;
        } else {
            v = strtoll(tok, &end, 10);
            if (*end == 'k' || *end == 'K') {
                v <<= 10;
                end++;
            } else if (*end == 'm' || *end == 'M') {
                v <<= 20;
                end++;
            }
            if (end == tok || *end != '\0' || v < 0) {
                return -1;
            }
        }
        groups[n++] = v;
    }
    *n_p = n;
    return n > 0 ? 0 : -1;
}

/* --kv-dtypes "MAP;MAP;...": appended to the --kv-dtype list (';' because
 * a map holds commas).  Nonzero for an empty entry or too many. */
static int ob_parse_kv_dtypes(const char *s, ob_t *b)
{
    size_t len = strlen(s);
    char *p;
    char *save = NULL;

    if (b->kv_dtypes_used + len + 1 > sizeof(b->kv_dtypes_buf) || len == 0 || s[0] == ';' ||
        strstr(s, ";;") != NULL || s[len - 1] == ';') {
        return -1;
    }
    p = b->kv_dtypes_buf + b->kv_dtypes_used;
    memcpy(p, s, len + 1);
    b->kv_dtypes_used += len + 1;
    for (char *tok = strtok_r(p, ";", &save); tok != NULL; tok = strtok_r(NULL, ";", &save)) {
        if (b->n_kv_dtypes == OB_MAX_LIST || strlen(tok) >= EPD_KVQ_MAP_MAX) {
            return -1;
        }
        b->kv_dtypes[b->n_kv_dtypes++] = tok;
    }
    return 0;
}

static void ob_usage(void)
{
    printf("usage: epd-bench overhead [options]\n"
           "  prefill-only (A) vs prefill + KV transfer into a live decode (B) vs the protocol\n"
           "  without the data (Z), interleaved request by request against the same daemons;\n"
           "  times from the daemons' traces, the physical floor of B - A beside each row.\n\n"
           "  --lengths LIST       prompt lengths for sim engines [128,1024,4096,16384,32768]\n"
           "  --ref-lengths LIST   prompt lengths for ref [128,1024]\n"
           "  --engines LIST       dense-70b,hybrid-320b,ref [all]\n"
           "  --transports LIST    ucx-shm,ucx-tcp,ofi-tcp [all]\n"
           "  --groups LIST        prefill --write-group-bytes of each row: default (the\n"
           "                       daemon's), per-layer (0) or bytes (64K, 1M) [default]\n"
           "  --reps N             repetitions (one request of each arm) per length [12]\n"
           "  --reps-long N        repetitions for lengths >= 16k [6]\n"
           "  --reps-ref N         repetitions per length with ref (slow on a CPU) [6]\n"
           "  --warmup N           repetitions not counted, per length [1]\n"
           "  --no-zero            without the zero-byte arm (Z)\n"
           "  --kv-dtype MAP       run every configuration with this KV dtype map (f32, bf16,\n"
           "                       fp8, int8 or per layer \"0-3:bf16,4-:fp8\"); repeat it for\n"
           "                       rows of each map side by side [each engine's own: sim its\n"
           "                       profile's, ref f32]\n"
           "  --kv-dtypes LIST     the same, maps separated by ';' (\"bf16;int8;0-3:bf16,4-:fp8\")\n"
           "  --scale S            sim engines at scale S (0 < S <= 1) instead of their own\n"
           "                       (dense-70b 0.05, hybrid-320b 0.1): 1 is the full-size KV\n"
           "  --chunk-tokens N     prefill's --prefill-chunk-tokens (0: off) [its engine's]\n"
           "  --verify MODE        decode's --verify for stamped KV: stamps or full [stamps]\n"
           "  --tsv                tab-separated rows (engine xport tokens kv_dtype kv_bytes\n"
           "                       ovh_pct floor_pct excess_pct bound ...; the header names\n"
           "                       every column)\n"
           "  --no-cpu             without the per-thread CPU lines\n"
           "  --trace FILE         one B request, prefill and decode merged (Chrome JSON)\n"
           "  --trace-length N     which length that request has [1024]\n"
           "  --profiles DIR       sim profiles [<repo>/engine/profiles]\n"
           "  --ref-model DIR      ref model [epd-mkmodel defaults, written to a temp dir]\n"
           "  --keep               keep the temp dir (daemon logs, traces)\n\n"
           "  Against daemons already running on other hosts: --attach-prefill HOST:PORT\n"
           "  --attach-decode HOST:PORT --cluster-secret-file F (their options:\n"
           "  epd-bench overhead --attach-prefill X --help).\n");
}

int epd_bench_overhead_main(int argc, char **argv)
{
    static ob_t b;
    char exe[1024];
    ssize_t n;
    int rc = 0;

    memset(&b, 0, sizeof(b));
    b.lengths[0] = 128;
    b.lengths[1] = 1024;
    b.lengths[2] = 4096;
    b.lengths[3] = 16384;
    b.lengths[4] = 32768;
    b.n_lengths = 5;
    b.ref_lengths[0] = 128;
    b.ref_lengths[1] = 1024;
    b.n_ref_lengths = 2;
    b.reps = 12;
    b.reps_long = 6;
    b.reps_ref = 6;
    b.warmup = 1;
    b.zero = 1;
    b.cpu = 1;
    b.verify = "stamps";
    b.chunk_tokens = -1;
    b.trace_len = 1024;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;

        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            ob_usage();
            return 0;
        }
        if (strcmp(a, "--keep") == 0) {
            b.keep = 1;
            continue;
        }
        if (strcmp(a, "--no-zero") == 0) {
            b.zero = 0;
            continue;
        }
        if (strcmp(a, "--tsv") == 0) {
            b.tsv = 1;
            continue;
        }
        if (strcmp(a, "--no-cpu") == 0) {
            b.cpu = 0;
            continue;
        }
        if (v == NULL) {
            fprintf(stderr, "overhead: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (strcmp(a, "--lengths") == 0) {
            bad = ob_parse_u32_list(v, b.lengths, &b.n_lengths);
        } else if (strcmp(a, "--ref-lengths") == 0) {
            bad = ob_parse_u32_list(v, b.ref_lengths, &b.n_ref_lengths);
        } else if (strcmp(a, "--engines") == 0) {
            bad = ob_parse_names(v, 1, &b);
        } else if (strcmp(a, "--transports") == 0) {
            bad = ob_parse_names(v, 0, &b);
        } else if (strcmp(a, "--groups") == 0) {
            bad = ob_parse_groups(v, b.groups, &b.n_groups);
        } else if (strcmp(a, "--reps") == 0) {
            b.reps = atoi(v);
            bad = b.reps < 1;
        } else if (strcmp(a, "--reps-ref") == 0) {
            b.reps_ref = atoi(v);
            bad = b.reps_ref < 1;
        } else if (strcmp(a, "--reps-long") == 0) {
            b.reps_long = atoi(v);
            bad = b.reps_long < 1;
        } else if (strcmp(a, "--warmup") == 0) {
            b.warmup = atoi(v);
            bad = b.warmup < 0;
        } else if (strcmp(a, "--kv-dtype") == 0) {
            bad = b.n_kv_dtypes == OB_MAX_LIST || v[0] == '\0' || strlen(v) >= EPD_KVQ_MAP_MAX;
            if (!bad) {
                b.kv_dtypes[b.n_kv_dtypes++] = v;
            }
        } else if (strcmp(a, "--kv-dtypes") == 0) {
            bad = ob_parse_kv_dtypes(v, &b);
        } else if (strcmp(a, "--scale") == 0) {
            b.scale = atof(v);
            bad = !(b.scale > 0.0 && b.scale <= 1.0);
        } else if (strcmp(a, "--chunk-tokens") == 0) {
            b.chunk_tokens = atoi(v);
            bad = b.chunk_tokens < 0 || strspn(v, "0123456789") != strlen(v);
        } else if (strcmp(a, "--verify") == 0) {
            b.verify = v;
            bad = strcmp(v, "stamps") != 0 && strcmp(v, "full") != 0;
        } else if (strcmp(a, "--trace") == 0) {
            b.trace_out = v;
        } else if (strcmp(a, "--trace-length") == 0) {
            b.trace_len = (uint32_t)atoi(v);
        } else if (strcmp(a, "--profiles") == 0) {
            b.profiles = v;
        } else if (strcmp(a, "--ref-model") == 0) {
            b.ref_model = v;
        } else {
            fprintf(stderr, "overhead: unknown option %s (see --help)\n", a);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "overhead: bad value for %s: '%s'\n", a, v);
            return 2;
        }
    }
    if (b.n_engines == 0) {
        ob_parse_names("dense-70b,hybrid-320b,ref", 1, &b);
    }
    if (b.n_xports == 0) {
        ob_parse_names("ucx-shm,ucx-tcp,ofi-tcp", 0, &b);
    }
    if (b.n_groups == 0) {
        b.groups[0] = OB_GROUP_DEFAULT;
        b.n_groups = 1;
    }
    /* canonical maps spell out the last layer ("4-" -> "4-79"): room for that */
    b.kv_w = 8;
    for (int i = 0; i < b.n_kv_dtypes; i++) {
        int w = (int)strlen(b.kv_dtypes[i]) + 3;

        b.kv_w = w > b.kv_w ? w : b.kv_w;
    }
    n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) {
        fprintf(stderr, "overhead: cannot find my own binary\n");
        return 1;
    }
    exe[n] = '\0';
    *strrchr(exe, '/') = '\0';
    snprintf(b.bindir, sizeof(b.bindir), "%s", exe);
    {
        static char prof[PATH_MAX];

        if (b.profiles == NULL) {
            /* build/bin or build/san/bin */
            snprintf(prof, sizeof(prof), "%s/../../engine/profiles", b.bindir);
            if (access(prof, R_OK) != 0) {
                snprintf(prof, sizeof(prof), "%s/../../../engine/profiles", b.bindir);
            }
            if (access(prof, R_OK) != 0) {
                snprintf(prof, sizeof(prof), "engine/profiles");
            }
            b.profiles = prof;
        }
    }
    snprintf(b.tmp, sizeof(b.tmp), "/tmp/epd-overhead-XXXXXX");
    if (mkdtemp(b.tmp) == NULL) {
        fprintf(stderr, "overhead: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    if (epd_bench_make_secret(b.tmp, b.secret_file, sizeof(b.secret_file), &b.secret,
                              "overhead") != 0) {
        return 1;
    }
    b.txbuf = malloc(OB_TXBUF);
    b.epoch_start = epd_time_wall_ns();
    b.epoch_nonce = epd_rng_entropy();
    b.next_id = ((uint64_t)(uint32_t)getpid() << 32) | 1;
    signal(SIGPIPE, SIG_IGN);

    {
        FILE *f = fopen("/proc/loadavg", "r");
        char la[64] = "?";

        if (f != NULL) {
            if (fgets(la, sizeof(la), f) == NULL) {
                snprintf(la, sizeof(la), "?");
            }
            fclose(f);
        }
        la[strcspn(la, "\n")] = '\0';
        printf("# epd-bench overhead: A = prefill only, B = prefill + KV transfer to a live decode\n"
               "# (--verify %s), Z = the protocol without the data; ms from prefill receiving\n"
               "# the request to A: compute done, B/Z: decode holding all KV.  B-A: paired median\n"
               "# [95%% CI]; ovh = B-A / A; msg = LayerDone latency (Z); GB/s = the KV's link\n"
               "# bandwidth (B); floor = least B-A this link and compute allow; excess = ovh -\n"
               "# floor; A! = A's compute > 1.02 x model.  Load average at start: %s, %ld CPUs\n",
               b.verify, la, sysconf(_SC_NPROCESSORS_ONLN));
        if (b.chunk_tokens >= 0) {
            printf("# prefill --prefill-chunk-tokens %d\n", b.chunk_tokens);
        }
    }
    ob_print_header(&b);
    for (int ei = 0; ei < b.n_engines; ei++) {
        const ob_engine_t *e = b.engines[ei];
        const uint32_t *lens = e->profile != NULL ? b.lengths : b.ref_lengths;
        int nl = e->profile != NULL ? b.n_lengths : b.n_ref_lengths;

        for (int xi = 0; xi < b.n_xports; xi++) {
            for (int gi = 0; gi < b.n_groups; gi++) {
                /* the maps innermost: one engine and link's rows side by side */
                for (int ki = 0; ki < (b.n_kv_dtypes > 0 ? b.n_kv_dtypes : 1); ki++) {
                    if (ob_config(&b, e, b.xports[xi], b.groups[gi],
                                  b.n_kv_dtypes > 0 ? b.kv_dtypes[ki] : NULL, lens, nl) != 0) {
                        rc = 1;
                    }
                }
            }
        }
    }
    if (b.keep || rc != 0) {
        /* a failure keeps them too: the daemons' logs say why */
        printf("# daemon logs and traces kept in %s\n", b.tmp);
    } else {
        char cmd[PATH_MAX + 32];

        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", b.tmp);
        if (system(cmd) != 0) {
            fprintf(stderr, "overhead: could not remove %s\n", b.tmp);
        }
    }
    free(b.txbuf);
    epd_secret_wipe(&b.secret);
    return rc;
}

/* ------------------------------------- for epd_bench_overhead_attach.c */

void epd__ob_on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    ob_on_msg(arg, ep, data, len);
}

void epd__ob_on_err(void *arg, epd_xport_ep_t *ep, epd_status_t status)
{
    ob_on_err(arg, ep, status);
}

void epd__ob_on_connect(void *arg, epd_status_t status)
{
    ob_on_connect(arg, status);
}

int epd__ob_request(ob_t *b, const uint32_t *tokens, uint32_t n, int arm, int rep, int warmup,
                    int li)
{
    return ob_request(b, tokens, n, arm, rep, warmup, li);
}

void epd__ob_free_reqs(ob_t *b)
{
    ob_free_reqs(b);
}

void epd__ob_fold(ob_t *b, int is_decode, const char *name, uint64_t req, long long layer,
                  double ts, double dur)
{
    ob_fold(b, is_decode, name, req, layer, ts, dur);
}

double epd__ob_layer_bytes(const epd_kv_layout_t *kv, uint32_t l, uint32_t n_tokens)
{
    return ob_layer_bytes(kv, l, n_tokens);
}

void epd__ob_row(const ob_t *b, uint32_t len, ob_row_t *row)
{
    ob_row(b, len, row);
}

void epd__ob_print_header(const ob_t *b)
{
    ob_print_header(b);
}

void epd__ob_print_row(const ob_t *b, const ob_engine_t *e, const ob_xport_t *xp, uint32_t len,
                       const ob_row_t *row)
{
    ob_print_row(b, e, xp, len, row);
}

int epd__ob_parse_u32_list(const char *s, uint32_t *out, int *n_p)
{
    return ob_parse_u32_list(s, out, n_p);
}
