/*
 * Tests of the epd-decode daemon as a program ($EPD_BUILD/bin/epd-decode),
 * with this process playing both of its peers over loopback UCX: a client
 * (GenerateRequest, Abort; reads TokenChunks and Errors) and a scripted
 * prefill worker (reads KvReservation, writes the KV it computed with the
 * ref engine into the decode pool with one-sided writes, sends a fenced
 * PrefillComplete, WritesQuiesced, or nothing).  It pins the decode side of
 * proto/README.md without the real prefill daemon:
 *
 *   - disaggregated output equals colocated output (greedy, sampled, stop
 *     ids), several requests at once, finish reasons, blocks back to full;
 *   - a corrupt checksum fails the request with EPD_ERR_CORRUPT;
 *   - Abort before PrefillComplete: final ABORT chunk, Abort to P, blocks
 *     quarantined until WritesQuiesced; Abort while generating;
 *   - a silent P: EPD_ERR_TIMEOUT after the lease, blocks quarantined until
 *     WritesQuiesced;
 *   - P dies (its transport goes away): EPD_ERR_PEER_DEAD, blocks back;
 *   - refusals: unknown id, duplicate id, stale decode epoch, invalid
 *     sampling, no capacity (KvRefused), stale prefill epoch;
 *   - a retired prefill incarnation's own endpoint closes with it even if
 *     it never spoke there (its writes would travel on it);
 *   - Status load fields and SIGTERM → exit 0.
 */
#include "epd_test.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "epd_alloc.h"
#include "epd_engine.h"
#include "epd_hash.h"
#include "epd_msg.h"
#include "epd_rpc.h"
#include "epd_sample.h"
#include "epd_test_engine_util.h"
#include "epd_time.h"
#include "epd_xport.h"

/* UCX keeps process-wide allocations until exit (not epd's). */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libucs.so\nleak:libucp.so\nleak:libuct.so\nleak:libucm.so\n"
           "leak:libfabric.so\nleak:librdmacm.so\n";
}

#define MAX_RX 512
#define LEASE_MS 1500
#define KV_BLOCKS 48
#define P_ID "fake-prefill"

typedef struct {
    const char *name;
    epd_xport_t *x;
    epd_xport_ep_t *ep; /* connected to the decode daemon */
    Epd__Envelope *rx[MAX_RX];
    int n_rx;
    uint64_t start, nonce;
    uint64_t seq;
} side_t;

static struct {
    const char *dir;
    const char *model;
    pid_t pid;
    char control[64];
    /* from Health */
    char worker_id[128];
    uint64_t d_start, d_nonce;
    unsigned char d_addr[EPD_XPORT_ADDR_MAX];
    size_t d_addr_len;
    side_t c, p;
    side_t *extra, *extra2; /* other sides, progressed too when set */
    /* the fake prefill's engine and local pool */
    epd_engine_t *engine;
    const epd_engine_info_t *info;
    epd_kv_pool_t pool;
    epd_xport_mr_t *pool_mr;
    unsigned char buf[70 * 1024];
} T;

/* ------------------------------------------------------------ transport */

static void on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    side_t *s = arg;
    Epd__Envelope *env = NULL;
    const char *why = NULL;

    (void)ep;
    if (epd_msg_decode(data, len, &env, &why) != EPD_OK) {
        fail_msg("%s: a frame from the daemon did not decode: %s", s->name, why);
    }
    if (s->n_rx < MAX_RX) {
        s->rx[s->n_rx++] = env;
    } else {
        epd_msg_free(env);
    }
}

static void side_open(side_t *s, const char *name, uint64_t start)
{
    epd_xport_config_t xc;
    uint64_t end;

    memset(s, 0, sizeof(*s));
    s->name = name;
    s->start = start;
    s->nonce = 0x1234;
    epd_xport_config_init(&xc);
    xc.peer_timeout_ms = 5000; /* colocated runs below do not progress */
    xc.connect_timeout_ms = 3000;
    xc.msg_cb = on_msg;
    xc.cb_arg = s;
    assert_int_equal(epd_xport_create(&xc, &s->x), EPD_OK);
    assert_true(epd_xport_connect(s->x, T.d_addr, T.d_addr_len, NULL, NULL, &s->ep) ==
                EPD_INPROGRESS);
    end = epd_time_now_ns() + 5 * EPD_NSEC_PER_SEC;
    while (epd_xport_ep_peer_id(s->ep) == 0) {
        assert_true(epd_time_now_ns() < end);
        epd_xport_poll(s->x, 2);
    }
}

static void side_close(side_t *s)
{
    for (int i = 0; i < s->n_rx; i++) {
        epd_msg_free(s->rx[i]);
    }
    s->n_rx = 0;
    epd_xport_destroy(s->x);
    s->x = NULL;
}

static void poll_ms(int ms)
{
    uint64_t end = epd_time_now_ns() + (uint64_t)ms * EPD_NSEC_PER_MSEC;

    do {
        if (T.c.x != NULL) {
            epd_xport_poll(T.c.x, T.p.x != NULL ? 0 : 1);
        }
        if (T.extra != NULL && T.extra->x != NULL) {
            epd_xport_poll(T.extra->x, 0);
        }
        if (T.extra2 != NULL && T.extra2->x != NULL) {
            epd_xport_poll(T.extra2->x, 0);
        }
        if (T.p.x != NULL) {
            epd_xport_poll(T.p.x, 1);
        }
    } while (epd_time_now_ns() < end);
}

/* Takes the first message of `body` about `id` that `s` received, waiting
 * up to ms; NULL when none came. */
static Epd__Envelope *take(side_t *s, uint64_t id, int body, int ms)
{
    uint64_t end = epd_time_now_ns() + (uint64_t)ms * EPD_NSEC_PER_MSEC;

    for (;;) {
        for (int i = 0; i < s->n_rx; i++) {
            Epd__Envelope *env = s->rx[i];

            if (epd_msg_request_id(env) == id && (body == 0 || (int)env->body_case == body)) {
                memmove(&s->rx[i], &s->rx[i + 1], (size_t)(s->n_rx - i - 1) * sizeof(s->rx[0]));
                s->n_rx--;
                return env;
            }
        }
        if (epd_time_now_ns() >= end) {
            return NULL;
        }
        poll_ms(1);
    }
}

static void send_env(side_t *s, const char *who, Epd__Envelope *env, unsigned flags)
{
    Epd__Epoch e = EPD__EPOCH__INIT;
    Epd__SenderRef sr = EPD__SENDER_REF__INIT;
    size_t len;

    e.start_time_ns = s->start;
    e.nonce = s->nonce;
    sr.worker_id = (char *)who;
    sr.epoch = &e;
    env->sender = &sr;
    env->seq = ++s->seq;
    assert_int_equal(epd_msg_encode(env, T.buf, sizeof(T.buf), &len), EPD_OK);
    env->sender = NULL;
    assert_int_equal(epd_xport_send(s->ep, T.buf, len, flags), EPD_OK);
}

/* --------------------------------------------------------------- daemon */

static void rpc_health(void)
{
    epd_rpc_client_t *rc;
    ProtobufCMessage *m;
    Epd__HealthResponse *h;
    void *resp = NULL;
    size_t len = 0;

    assert_int_equal(epd_rpc_client_create(T.control, &rc), EPD_OK);
    assert_int_equal(epd_rpc_call(rc, EPD_RPC_HEALTH, NULL, 0, 5000, &resp, &len, NULL, 0), EPD_OK);
    assert_int_equal(epd_proto_unpack(&epd__health_response__descriptor, resp, len, &m), EPD_OK);
    h = (Epd__HealthResponse *)m;
    assert_true(h->serving);
    assert_int_equal(h->worker->role, EPD__ROLE__ROLE_DECODE);
    snprintf(T.worker_id, sizeof(T.worker_id), "%s", h->worker->worker_id);
    T.d_start = h->worker->epoch->start_time_ns;
    T.d_nonce = h->worker->epoch->nonce;
    assert_true(h->data_plane_address.len <= sizeof(T.d_addr));
    memcpy(T.d_addr, h->data_plane_address.data, h->data_plane_address.len);
    T.d_addr_len = h->data_plane_address.len;
    assert_int_equal(h->capacity->kv_blocks_total, KV_BLOCKS);
    assert_string_equal(h->transport, "ucx");
    assert_non_null(h->kv_layout);
    epd_proto_free(m);
    epd_free(resp);
    epd_rpc_client_destroy(rc);
}

/* Status load of the decode worker. */
static void rpc_load(uint32_t *free_p, uint32_t *running_p)
{
    epd_rpc_client_t *rc;
    ProtobufCMessage *m;
    Epd__StatusResponse *s;
    void *resp = NULL;
    size_t len = 0;

    assert_int_equal(epd_rpc_client_create(T.control, &rc), EPD_OK);
    assert_int_equal(epd_rpc_call(rc, EPD_RPC_STATUS, NULL, 0, 5000, &resp, &len, NULL, 0), EPD_OK);
    assert_int_equal(epd_proto_unpack(&epd__status_response__descriptor, resp, len, &m), EPD_OK);
    s = (Epd__StatusResponse *)m;
    assert_int_equal(s->n_workers, 1);
    *free_p = s->workers[0]->load->kv_blocks_free;
    if (running_p != NULL) {
        *running_p = s->workers[0]->load->running_requests;
    }
    epd_proto_free(m);
    epd_free(resp);
    epd_rpc_client_destroy(rc);
}

static uint32_t blocks_free(void)
{
    uint32_t f;

    rpc_load(&f, NULL);
    return f;
}

/* Waits (polling our transports) until every block is free again. */
static void wait_full(int ms)
{
    uint64_t end = epd_time_now_ns() + (uint64_t)ms * EPD_NSEC_PER_MSEC;
    uint32_t f;

    for (;;) {
        f = blocks_free();
        if (f == KV_BLOCKS) {
            return;
        }
        if (epd_time_now_ns() >= end) {
            fail_msg("kv_blocks_free %u of %u after %d ms", f, KV_BLOCKS, ms);
        }
        poll_ms(20);
    }
}

/* A retired prefill incarnation (worker `who`, epoch start/nonce) confirms
 * on a new endpoint (the client side's) that its writes for `id` are
 * quiesced: the fence's way to free what it held (proto/README.md). */
static void confirm_quiesced(const char *who, uint64_t start, uint64_t nonce, uint64_t id)
{
    Epd__Envelope e = EPD__ENVELOPE__INIT;
    Epd__WritesQuiesced q = EPD__WRITES_QUIESCED__INIT;
    uint64_t s0 = T.c.start, n0 = T.c.nonce;

    q.request_id = id;
    e.body_case = EPD__ENVELOPE__BODY_QUIESCED;
    e.quiesced = &q;
    T.c.start = start;
    T.c.nonce = nonce;
    send_env(&T.c, who, &e, 0);
    T.c.start = s0;
    T.c.nonce = n0;
}

static void start_daemon(void)
{
    const char *build = getenv("EPD_BUILD");
    char bin[512], ready[512], logf[512], trace[512], blocks[16], lease[16];
    uint64_t end;
    FILE *f;

    snprintf(bin, sizeof(bin), "%s/bin/epd-decode", build != NULL ? build : "build");
    snprintf(ready, sizeof(ready), "%s/decode.ready", T.dir);
    snprintf(logf, sizeof(logf), "%s/decode.log", T.dir);
    snprintf(trace, sizeof(trace), "%s/decode.trace.json", T.dir);
    snprintf(blocks, sizeof(blocks), "%d", KV_BLOCKS);
    snprintf(lease, sizeof(lease), "%d", LEASE_MS);
    T.pid = fork();
    assert_true(T.pid >= 0);
    if (T.pid == 0) {
        int fd;

        if (freopen(logf, "w", stderr) == NULL) {
            _exit(126);
        }
        fd = fileno(stderr);
        dup2(fd, 1);
        execl(bin, bin, "--model", T.model, "--ready-file", ready, "--kv-blocks", blocks,
              "--state-slots", "8", "--max-batch", "4", "--lease-ms", lease, "--peer-timeout-ms",
              "5000", "--worker-id", "dtest", "--log-level", "debug", "--trace", trace,
              /* the reservation's mechanics at fixed sizes (KV on demand:
               * tests/integration/test_decode_preempt.sh) */
              "--kv-reserve", "upfront", (char *)NULL);
        _exit(127);
    }
    end = epd_time_now_ns() + 60 * EPD_NSEC_PER_SEC;
    while ((f = fopen(ready, "r")) == NULL) {
        int st;

        assert_int_equal(waitpid(T.pid, &st, WNOHANG), 0);
        assert_true(epd_time_now_ns() < end);
        epd_time_sleep_ns(50 * EPD_NSEC_PER_MSEC);
    }
    assert_int_equal(fscanf(f, "control=%63s", T.control), 1);
    fclose(f);
}

static int setup(void **state)
{
    epd_mkmodel_params_t p;
    epd_engine_config_t cfg = {0};

    (void)state;
    setenv("UCX_TLS", "posix,cma,tcp", 0);
    setenv("UCX_NET_DEVICES", "lo", 0);
    T.dir = epd_test_tmpdir();
    /* the tiny test model, wider: a decode step must take long enough
     * (~0.5 ms) for an Abort to land while a request is in the batch */
    epd_test_tiny_params(&p);
    p.hp.dim = 128;
    p.hp.head_dim = 32;
    p.hp.ffn = 512;
    T.model = epd_test_write_model(T.dir, "tiny", &p);
    start_daemon();
    rpc_health();
    cfg.model_dir = T.model;
    assert_int_equal(epd_engine_open("ref", &cfg, &T.engine), EPD_OK);
    T.info = epd_engine_info(T.engine);
    epd_test_pool(T.engine, 16, 1, &T.pool);
    side_open(&T.c, "client", 1);
    side_open(&T.p, "prefill", 1000);
    assert_int_equal(epd_xport_mr_reg(T.p.x, T.pool.base, T.pool.bytes, &T.pool_mr), EPD_OK);
    return 0;
}

/* The trace written at exit (--trace) names the loop's track and holds the
 * requests' events (the track name is borrowed by the recorder until it
 * writes: a name that did not outlive start-up came out as garbage). */
static void check_trace(void)
{
    char path[512];
    char *text;
    long n;
    FILE *f;

    snprintf(path, sizeof(path), "%s/decode.trace.json", T.dir);
    f = fopen(path, "r");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    n = ftell(f);
    assert_true(n > 0);
    rewind(f);
    text = epd_calloc(1, (size_t)n + 1);
    assert_int_equal(fread(text, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    if (strstr(text, "\"args\":{\"name\":\"decode loop\"}") == NULL) {
        fail_msg("the trace does not name the decode loop's track: %.300s", text);
    }
    assert_non_null(strstr(text, "\"name\":\"epd-decode dtest\""));
    assert_non_null(strstr(text, "\"KV held\""));
    assert_non_null(strstr(text, "\"first decode step\""));
    epd_free(text);
}

static int teardown(void **state)
{
    int st = 0;
    char cmd[600];

    (void)state;
    epd_xport_mr_dereg(T.pool_mr);
    side_close(&T.p);
    side_close(&T.c);
    epd_free(T.pool.base);
    epd_engine_close(T.engine);
    kill(T.pid, SIGTERM);
    {
        uint64_t end = epd_time_now_ns() + 20 * EPD_NSEC_PER_SEC;
        pid_t w;

        while ((w = waitpid(T.pid, &st, WNOHANG)) == 0 && epd_time_now_ns() < end) {
            epd_time_sleep_ns(20 * EPD_NSEC_PER_MSEC);
        }
        if (w == 0) {
            kill(T.pid, SIGKILL);
            (void)waitpid(T.pid, &st, 0);
            fail_msg("epd-decode did not exit within 20 s of SIGTERM");
        }
        assert_int_equal(w, T.pid);
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        snprintf(cmd, sizeof(cmd), "tail -n 40 %s/decode.log", T.dir);
        if (system(cmd) != 0) {
            print_message("(no decode log)\n");
        }
    }
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    check_trace();
    if (getenv("EPD_TEST_KEEP") != NULL) {
        print_message("kept %s\n", T.dir);
    } else {
        epd_test_rmtree(T.dir);
    }
    return 0;
}

/* ------------------------------------------------------------ requests */

typedef struct {
    uint64_t id;
    uint32_t prompt[64];
    uint32_t n_prompt;
    uint32_t max_tokens;
    float temperature;
    uint32_t top_k;
    uint64_t seed;
    uint32_t stop[1];
    uint32_t n_stop;
    int32_t expect[256];
    uint32_t n_expect;
    int expect_finish;
    uint32_t got[256];
    uint32_t n_got;
    int finish;
} rq_t;

static void rq_init(rq_t *r, uint64_t id, uint32_t n_prompt, uint32_t max_tokens)
{
    memset(r, 0, sizeof(*r));
    r->id = id;
    r->n_prompt = n_prompt;
    r->max_tokens = max_tokens;
    r->prompt[0] = (uint32_t)T.info->bos_token;
    for (uint32_t i = 1; i < n_prompt; i++) {
        r->prompt[i] = (uint32_t)((id * 31 + i * 7) % 200) + 40;
    }
}

static void params_of(const rq_t *r, epd_sample_params_t *sp)
{
    epd_sample_params_default(sp);
    sp->temperature = r->temperature;
    sp->top_k = r->top_k;
    sp->seed = r->seed;
}

/* Prefill into the local pool (blocks 0.., slot 0); returns the first token
 * (step 0) and leaves the logits in `logits`. */
static int32_t local_prefill(const rq_t *r, float *logits)
{
    uint32_t table[16];
    int32_t prompt[64];
    epd_prefill_args_t pa;
    epd_sample_params_t sp;
    epd_sample_scratch_t *scratch;
    int32_t tok;

    for (uint32_t i = 0; i < 16; i++) {
        table[i] = i;
    }
    for (uint32_t i = 0; i < r->n_prompt; i++) {
        prompt[i] = (int32_t)r->prompt[i];
    }
    memset(&pa, 0, sizeof(pa));
    pa.seq.req_id = r->id;
    pa.seq.block_table = table;
    pa.seq.n_blocks = 16;
    pa.tokens = prompt;
    pa.n_tokens = r->n_prompt;
    assert_int_equal(epd_engine_prefill(T.engine, &T.pool, &pa, NULL, logits), EPD_OK);
    params_of(r, &sp);
    assert_int_equal(epd_sample_scratch_create(T.info->vocab_size, &scratch), EPD_OK);
    assert_int_equal(epd_sample_token(&sp, scratch, logits, T.info->vocab_size, 0, &tok), EPD_OK);
    epd_sample_scratch_destroy(scratch);
    return tok;
}

/* The colocated output (epd-generate's loop). */
static void colocated(rq_t *r)
{
    float *logits = epd_calloc(T.info->vocab_size, sizeof(float));
    epd_sample_scratch_t *scratch;
    epd_sample_params_t sp;
    uint32_t table[16];

    for (uint32_t i = 0; i < 16; i++) {
        table[i] = i;
    }
    params_of(r, &sp);
    assert_int_equal(epd_sample_scratch_create(T.info->vocab_size, &scratch), EPD_OK);
    local_prefill(r, logits);
    r->n_expect = 0;
    for (;;) {
        epd_decode_req_t dr;
        int32_t tok;

        assert_int_equal(
            epd_sample_token(&sp, scratch, logits, T.info->vocab_size, r->n_expect, &tok), EPD_OK);
        r->expect[r->n_expect++] = tok;
        if (tok == T.info->eos_token || (r->n_stop > 0 && (uint32_t)tok == r->stop[0])) {
            r->expect_finish = EPD__FINISH_REASON__FINISH_STOP;
            break;
        }
        if (r->n_expect == r->max_tokens) {
            r->expect_finish = EPD__FINISH_REASON__FINISH_LENGTH;
            break;
        }
        memset(&dr, 0, sizeof(dr));
        dr.seq.req_id = r->id;
        dr.seq.block_table = table;
        dr.seq.n_blocks = 16;
        dr.pos = r->n_prompt + r->n_expect - 1;
        dr.token = tok;
        assert_int_equal(epd_engine_decode(T.engine, &T.pool, &dr, 1, logits), EPD_OK);
    }
    epd_sample_scratch_destroy(scratch);
    epd_free(logits);
}

/* GenerateRequest from client side `c`, naming prefill side `ps`
 * (address and nonce) as worker p_id at epoch start p_start. */
static void send_generate_to(side_t *c, side_t *ps, const rq_t *r, uint64_t d_start,
                             uint64_t p_start, const char *p_id)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__GenerateRequest g = EPD__GENERATE_REQUEST__INIT;
    Epd__SamplingParams sp = EPD__SAMPLING_PARAMS__INIT;
    Epd__Epoch pe = EPD__EPOCH__INIT, de = EPD__EPOCH__INIT;
    const void *paddr;
    size_t plen;

    assert_int_equal(epd_xport_address(ps->x, &paddr, &plen), EPD_OK);
    sp.temperature = r->temperature;
    sp.top_k = r->top_k;
    sp.seed = r->seed;
    sp.max_tokens = r->max_tokens;
    sp.stop_token_ids = (uint32_t *)r->stop;
    sp.n_stop_token_ids = r->n_stop;
    pe.start_time_ns = p_start;
    pe.nonce = ps->nonce;
    de.start_time_ns = d_start;
    de.nonce = T.d_nonce;
    g.request_id = r->id;
    g.prompt_tokens = (uint32_t *)r->prompt;
    g.n_prompt_tokens = r->n_prompt;
    g.sampling = &sp;
    g.prefill_worker_id = (char *)p_id;
    g.decode_worker_id = T.worker_id;
    g.prefill_address.data = (uint8_t *)(uintptr_t)paddr;
    g.prefill_address.len = plen;
    g.decode_address.data = T.d_addr;
    g.decode_address.len = T.d_addr_len;
    g.prefill_epoch = &pe;
    g.decode_epoch = &de;
    g.deadline_ms = 30000;
    env.body_case = EPD__ENVELOPE__BODY_GENERATE;
    env.generate = &g;
    send_env(c, c == &T.c ? "test-client" : c->name, &env, 0);
}

static void send_generate_on(side_t *c, const rq_t *r, uint64_t d_start, uint64_t p_start,
                             const char *p_id)
{
    send_generate_to(c, &T.p, r, d_start, p_start, p_id);
}

static void send_generate_ex(const rq_t *r, uint64_t d_start, uint64_t p_start, const char *p_id)
{
    send_generate_on(&T.c, r, d_start, p_start, p_id);
}

static void send_generate(const rq_t *r)
{
    send_generate_ex(r, T.d_start, T.p.start, P_ID);
}

static void send_abort(side_t *s, const char *who, uint64_t id)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__Abort a = EPD__ABORT__INIT;

    a.request_id = id;
    a.status = EPD_ERR_CANCELED;
    a.reason = (char *)"test";
    env.body_case = EPD__ENVELOPE__BODY_ABORT;
    env.abort = &a;
    send_env(s, who, &env, 0);
}

static void send_quiesced(uint64_t id)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__WritesQuiesced q = EPD__WRITES_QUIESCED__INIT;

    q.request_id = id;
    env.body_case = EPD__ENVELOPE__BODY_QUIESCED;
    env.quiesced = &q;
    send_env(&T.p, P_ID, &env, 0);
}

static int n_done;

static void on_write(void *arg, epd_status_t status)
{
    (void)arg;
    assert_int_equal(status, EPD_OK);
    n_done++;
}

/*
 * The fake prefill: waits for r's KvReservation, prefills locally, writes
 * every layer into the reserved blocks/slot (one-sided), then sends the
 * fenced PrefillComplete (with a wrong checksum for layer `corrupt_layer`
 * when >= 0).
 */
static void send_abort(side_t *s, const char *who, uint64_t id);

/* landed: after each layer's writes, a LayerDone{landed} fenced behind
 * them (per-layer verification; corrupt_layer then corrupts only that
 * LayerDone's sum); pc_differs: PrefillComplete carries a wrong sum for
 * layer 0 whose LayerDone was right. */
static void fake_prefill_ex(const rq_t *r, int corrupt_layer, int abort_after, int landed,
                            int pc_differs)
{
    Epd__Envelope *env = take(&T.p, r->id, EPD__ENVELOPE__BODY_RESERVATION, 5000);
    Epd__Envelope out = EPD__ENVELOPE__INIT;
    Epd__PrefillComplete pc = EPD__PREFILL_COMPLETE__INIT;
    const Epd__KvReservation *kr;
    epd_xport_rkey_t *rkey;
    uint64_t sums[EPD_KV_MAX_LAYERS];
    float *logits = epd_calloc(T.info->vocab_size, sizeof(float));
    epd_hash_state_t *h;
    int n_posted = 0;
    int32_t first;
    uint64_t end;

    assert_non_null(env);
    kr = env->reservation;
    assert_int_equal(kr->n_block_ids, (r->n_prompt + 15) / 16);
    assert_int_equal(kr->pool_blocks, KV_BLOCKS);
    assert_int_equal(kr->lease_ms, LEASE_MS);
    assert_int_equal(epd_xport_rkey_unpack(T.p.ep, kr->rkey.data, kr->rkey.len, &rkey), EPD_OK);
    assert_true(epd_xport_rkey_size(rkey) == kr->region_size);
    first = local_prefill(r, logits);
    assert_int_equal(epd_hash_state_create(0, &h), EPD_OK);
    n_done = 0;
    for (uint32_t l = 0; l < T.info->kv.n_layers; l++) {
        uint64_t src, dst;

        epd_hash_state_reset(h, 0);
        if (T.info->kv.kind[l] == EPD_LAYER_LINEAR) {
            assert_int_equal(epd_kv_state_offset(&T.info->kv, 16, 1, l, 0, &src), EPD_OK);
            assert_int_equal(epd_kv_state_offset(&T.info->kv, kr->pool_blocks, kr->pool_state_slots,
                                                 l, kr->state_slot, &dst),
                             EPD_OK);
            assert_int_equal(epd_xport_write(T.p.ep, (char *)T.pool.base + src,
                                             T.info->kv.state_bytes, T.pool_mr, rkey, dst, on_write,
                                             NULL),
                             EPD_INPROGRESS);
            n_posted++;
            epd_hash_state_update(h, (char *)T.pool.base + src, T.info->kv.state_bytes);
        } else {
            for (uint32_t i = 0; i < kr->n_block_ids; i++) {
                assert_int_equal(epd_kv_block_offset(&T.info->kv, 16, l, i, &src), EPD_OK);
                assert_int_equal(
                    epd_kv_block_offset(&T.info->kv, kr->pool_blocks, l, kr->block_ids[i], &dst),
                    EPD_OK);
                assert_int_equal(epd_xport_write(T.p.ep, (char *)T.pool.base + src,
                                                 T.info->kv.block_bytes, T.pool_mr, rkey, dst,
                                                 on_write, NULL),
                                 EPD_INPROGRESS);
                n_posted++;
                epd_hash_state_update(h, (char *)T.pool.base + src, T.info->kv.block_bytes);
            }
        }
        /* with landed LayerDones, corrupt_layer corrupts only the
         * LayerDone's sum: PrefillComplete's is right, so only the
         * per-layer check can catch it */
        sums[l] = epd_hash_state_digest(h) ^ ((int)l == corrupt_layer && !landed ? 1u : 0u);
        if (landed) {
            Epd__Envelope lo = EPD__ENVELOPE__INIT;
            Epd__LayerDone ld = EPD__LAYER_DONE__INIT;

            ld.request_id = r->id;
            ld.layer = l;
            ld.checksum = sums[l] ^ ((int)l == corrupt_layer ? 1u : 0u);
            ld.landed = 1;
            lo.body_case = EPD__ENVELOPE__BODY_LAYER_DONE;
            lo.layer_done = &ld;
            send_env(&T.p, P_ID, &lo, EPD_XPORT_SEND_FENCE);
        }
    }
    if (pc_differs) {
        sums[0] ^= 2u;
    }
    pc.request_id = r->id;
    pc.first_token = (uint32_t)first;
    pc.n_prompt_tokens = r->n_prompt;
    pc.layer_checksums = sums;
    pc.n_layer_checksums = T.info->kv.n_layers;
    out.body_case = EPD__ENVELOPE__BODY_PREFILL_COMPLETE;
    out.prefill_complete = &pc;
    send_env(&T.p, P_ID, &out, EPD_XPORT_SEND_FENCE);
    if (abort_after) {
        send_abort(&T.c, "test-client", r->id);
    }
    /* our local pool is lent until the writes complete */
    end = epd_time_now_ns() + 5 * EPD_NSEC_PER_SEC;
    while (n_done < n_posted) {
        assert_true(epd_time_now_ns() < end);
        poll_ms(1);
    }
    epd_xport_rkey_destroy(rkey);
    epd_hash_state_destroy(h);
    epd_free(logits);
    epd_msg_free(env);
}

static void fake_prefill(const rq_t *r, int corrupt_layer)
{
    fake_prefill_ex(r, corrupt_layer, 0, 0, 0);
}

/* Collects r's chunks until the final one (or an Error: returns its
 * status). */
static int collect(rq_t *r, int ms)
{
    uint64_t end = epd_time_now_ns() + (uint64_t)ms * EPD_NSEC_PER_MSEC;

    for (;;) {
        Epd__Envelope *env;
        uint64_t now = epd_time_now_ns();

        assert_true(now < end);
        env = take(&T.c, r->id, 0, (int)((end - now) / EPD_NSEC_PER_MSEC));
        assert_non_null(env);
        if (env->body_case == EPD__ENVELOPE__BODY_ERROR) {
            int st = env->error->status;

            epd_msg_free(env);
            return st;
        }
        if (env->body_case == EPD__ENVELOPE__BODY_REFUSED) {
            int st = env->refused->status;

            epd_msg_free(env);
            return st;
        }
        assert_int_equal(env->body_case, EPD__ENVELOPE__BODY_TOKENS);
        assert_string_equal(env->sender->worker_id, T.worker_id);
        assert_int_equal(env->tokens->index, r->n_got);
        assert_true(r->n_got + env->tokens->n_tokens <= r->max_tokens);
        if (env->tokens->n_tokens > 0) {
            memcpy(r->got + r->n_got, env->tokens->tokens,
                   env->tokens->n_tokens * sizeof(uint32_t));
        }
        r->n_got += (uint32_t)env->tokens->n_tokens;
        r->finish = env->tokens->finish;
        epd_msg_free(env);
        if (r->finish != EPD__FINISH_REASON__FINISH_NONE) {
            return 0;
        }
    }
}

static void expect_error(uint64_t id, int want, int ms)
{
    Epd__Envelope *env = take(&T.c, id, EPD__ENVELOPE__BODY_ERROR, ms);

    if (env == NULL) {
        fail_msg("no Error about request %llu within %d ms", (unsigned long long)id, ms);
    }
    if (env->error->status != want) {
        fail_msg("request %llu: Error %s (%s), wanted %s", (unsigned long long)id,
                 epd_status_name((epd_status_t)env->error->status), env->error->message,
                 epd_status_name((epd_status_t)want));
    }
    epd_msg_free(env);
}

/* ---------------------------------------------------------------- tests */

static void test_disagg_equals_colocated(void **state)
{
    static rq_t r[4];

    (void)state;
    rq_init(&r[0], 11, 5, 20);
    rq_init(&r[1], 12, 23, 40);
    r[1].temperature = 0.8f;
    r[1].top_k = 20;
    r[1].seed = 99;
    rq_init(&r[2], 13, 17, 30);
    r[2].temperature = 1.1f;
    r[2].seed = 5;
    rq_init(&r[3], 14, 40, 1); /* finishes with the first token */
    for (int i = 0; i < 4; i++) {
        colocated(&r[i]);
    }
    /* a stop id taken from request 0's own output */
    if (r[0].n_expect > 4) {
        r[0].stop[0] = (uint32_t)r[0].expect[4];
        r[0].n_stop = 1;
        colocated(&r[0]);
    }
    for (int i = 0; i < 4; i++) {
        send_generate(&r[i]);
    }
    for (int i = 0; i < 4; i++) {
        /* half of them verified layer by layer as the layers land */
        fake_prefill_ex(&r[i], -1, 0, i % 2, 0);
    }
    for (int i = 0; i < 4; i++) {
        assert_int_equal(collect(&r[i], 20000), 0);
        assert_int_equal(r[i].n_got, r[i].n_expect);
        assert_memory_equal(r[i].got, r[i].expect, r[i].n_expect * sizeof(uint32_t));
        assert_int_equal(r[i].finish, r[i].expect_finish);
    }
    wait_full(3000);
}

static void test_corrupt_checksum(void **state)
{
    rq_t r;

    (void)state;
    rq_init(&r, 21, 20, 10);
    send_generate(&r);
    fake_prefill(&r, 1);
    expect_error(r.id, EPD_ERR_CORRUPT, 5000);
    assert_null(take(&T.c, r.id, EPD__ENVELOPE__BODY_TOKENS, 200));
    wait_full(3000);
}

/* Per-layer verification: a landed LayerDone whose checksum does not match
 * what arrived fails the request (even though PrefillComplete's sums are
 * right), and the blocks come back only once the prefill side is done. */
static void test_corrupt_layer_done(void **state)
{
    rq_t r;

    (void)state;
    rq_init(&r, 22, 40, 10);
    send_generate(&r);
    fake_prefill_ex(&r, 2, 0, 1, 0);
    expect_error(r.id, EPD_ERR_CORRUPT, 5000);
    assert_null(take(&T.c, r.id, EPD__ENVELOPE__BODY_TOKENS, 200));
    wait_full(3000);
}

/* A PrefillComplete that disagrees with a layer's landed LayerDone is
 * refused as invalid (the layer was already verified against the
 * LayerDone's sum; without per-layer checks it would read as corrupt). */
static void test_layer_done_disagrees(void **state)
{
    rq_t r;

    (void)state;
    rq_init(&r, 23, 30, 10);
    send_generate(&r);
    fake_prefill_ex(&r, -1, 0, 1, 1);
    expect_error(r.id, EPD_ERR_INVALID_PARAM, 5000);
    assert_null(take(&T.c, r.id, EPD__ENVELOPE__BODY_TOKENS, 200));
    wait_full(3000);
}

static void test_abort_before_complete_quarantines(void **state)
{
    rq_t r;
    Epd__Envelope *env;

    (void)state;
    rq_init(&r, 31, 20, 100);
    send_generate(&r);
    env = take(&T.p, r.id, EPD__ENVELOPE__BODY_RESERVATION, 5000);
    assert_non_null(env);
    epd_msg_free(env);
    assert_true(blocks_free() < KV_BLOCKS);
    send_abort(&T.c, "test-client", r.id);
    assert_int_equal(collect(&r, 5000), 0);
    assert_int_equal(r.finish, EPD__FINISH_REASON__FINISH_ABORT);
    /* decode tells P, and keeps the blocks until P says nothing is in flight */
    env = take(&T.p, r.id, EPD__ENVELOPE__BODY_ABORT, 5000);
    assert_non_null(env);
    epd_msg_free(env);
    poll_ms(200);
    assert_true(blocks_free() < KV_BLOCKS);
    /* an abort for it now: unknown to the client */
    send_abort(&T.c, "test-client", r.id);
    expect_error(r.id, EPD_ERR_NOT_FOUND, 3000);
    send_quiesced(r.id);
    wait_full(3000);
}

/* Reads r's chunks until the final one; returns its finish. */
static int drain_chunks(rq_t *r)
{
    for (;;) {
        Epd__Envelope *env = take(&T.c, r->id, 0, 5000);
        int fin;

        assert_non_null(env);
        assert_int_equal(env->body_case, EPD__ENVELOPE__BODY_TOKENS);
        assert_int_equal(env->tokens->index, r->n_got);
        r->n_got += (uint32_t)env->tokens->n_tokens;
        fin = env->tokens->finish;
        epd_msg_free(env);
        if (fin != EPD__FINISH_REASON__FINISH_NONE) {
            return fin;
        }
    }
}

static void test_abort_right_after_complete(void **state)
{
    rq_t r;

    (void)state;
    rq_init(&r, 41, 10, 240);
    send_generate(&r);
    /* the Abort follows the fenced PrefillComplete at once: it usually
     * lands first (quarantine, then the completion releases the blocks) */
    fake_prefill_ex(&r, -1, 1, 0, 0);
    print_message("abort right after complete: %u tokens, finish %d\n", r.n_got, drain_chunks(&r));
    wait_full(3000);
}

static void test_abort_while_generating(void **state)
{
    static rq_t r[3];
    int n_abort = 0;

    (void)state;
    for (int i = 0; i < 3; i++) {
        rq_init(&r[i], 42 + (uint64_t)i, 10, 240);
        r[i].temperature = 1.0f;
        r[i].seed = 17 + (uint64_t)i;
        send_generate(&r[i]);
    }
    for (int i = 0; i < 3; i++) {
        fake_prefill(&r[i], -1);
    }
    /* abort each after its first chunk, while the batch runs */
    for (int i = 0; i < 3; i++) {
        Epd__Envelope *env = take(&T.c, r[i].id, EPD__ENVELOPE__BODY_TOKENS, 5000);
        int fin;

        assert_non_null(env);
        assert_int_equal(env->tokens->index, 0);
        r[i].n_got = (uint32_t)env->tokens->n_tokens;
        fin = env->tokens->finish;
        epd_msg_free(env);
        send_abort(&T.c, "test-client", r[i].id);
        if (fin == EPD__FINISH_REASON__FINISH_NONE) {
            fin = drain_chunks(&r[i]);
        }
        n_abort += fin == EPD__FINISH_REASON__FINISH_ABORT;
    }
    print_message("abort while generating: %d of 3 ended by the abort\n", n_abort);
    assert_true(n_abort > 0);
    wait_full(3000);
}

static void test_lease_expires(void **state)
{
    rq_t r;
    Epd__Envelope *env;
    uint64_t t0 = epd_time_now_ns();

    (void)state;
    rq_init(&r, 51, 12, 20);
    send_generate(&r);
    env = take(&T.p, r.id, EPD__ENVELOPE__BODY_RESERVATION, 5000);
    assert_non_null(env);
    epd_msg_free(env);
    expect_error(r.id, EPD_ERR_TIMEOUT, LEASE_MS * 3);
    assert_true(epd_time_now_ns() - t0 >= (uint64_t)LEASE_MS * EPD_NSEC_PER_MSEC * 9 / 10);
    env = take(&T.p, r.id, EPD__ENVELOPE__BODY_ABORT, 3000);
    assert_non_null(env);
    epd_msg_free(env);
    assert_true(blocks_free() < KV_BLOCKS);
    send_quiesced(r.id);
    wait_full(3000);
}

static void test_refusals(void **state)
{
    rq_t r, r2, big[3];
    Epd__Envelope *env;

    (void)state;
    /* unknown id */
    send_abort(&T.c, "test-client", 777777);
    expect_error(777777, EPD_ERR_NOT_FOUND, 3000);
    /* another decode incarnation */
    rq_init(&r, 61, 8, 8);
    send_generate_ex(&r, T.d_start - 1, T.p.start, P_ID);
    expect_error(r.id, EPD_ERR_STALE_EPOCH, 3000);
    env = take(&T.p, r.id, EPD__ENVELOPE__BODY_REFUSED, 3000);
    assert_non_null(env);
    epd_msg_free(env);
    /* bad sampling */
    rq_init(&r, 62, 8, 8);
    r.temperature = -2.0f;
    send_generate(&r);
    expect_error(r.id, EPD_ERR_INVALID_PARAM, 3000);
    env = take(&T.p, r.id, EPD__ENVELOPE__BODY_REFUSED, 3000);
    assert_non_null(env);
    epd_msg_free(env);
    /* beyond the context */
    rq_init(&r, 63, 8, 1000);
    send_generate(&r);
    expect_error(r.id, EPD_ERR_TOO_LONG, 3000);
    /* a duplicate live id: refused, and P hears nothing about it */
    rq_init(&r, 64, 8, 8);
    send_generate(&r);
    env = take(&T.p, r.id, EPD__ENVELOPE__BODY_RESERVATION, 3000);
    assert_non_null(env);
    epd_msg_free(env);
    r2 = r;
    send_generate(&r2);
    expect_error(r.id, EPD_ERR_EXISTS, 3000);
    assert_null(take(&T.p, r.id, 0, 200));
    /* no capacity: 48 blocks, 16 per request (10 + 240 tokens) */
    for (int i = 0; i < 3; i++) {
        rq_init(&big[i], 70 + (uint64_t)i, 10, 240);
        send_generate(&big[i]);
    }
    for (int i = 0; i < 2; i++) {
        env = take(&T.p, big[i].id, EPD__ENVELOPE__BODY_RESERVATION, 3000);
        assert_non_null(env);
        epd_msg_free(env);
    }
    env = take(&T.c, big[2].id, EPD__ENVELOPE__BODY_REFUSED, 3000);
    assert_non_null(env);
    assert_int_equal(env->refused->status, EPD_ERR_NO_CAPACITY);
    epd_msg_free(env);
    env = take(&T.p, big[2].id, EPD__ENVELOPE__BODY_REFUSED, 3000);
    assert_non_null(env);
    epd_msg_free(env);
    /* a request naming an older incarnation of the prefill worker */
    rq_init(&r2, 65, 8, 8);
    send_generate_ex(&r2, T.d_start, T.p.start - 1, P_ID);
    expect_error(r2.id, EPD_ERR_STALE_EPOCH, 3000);
    /* P fails one of them: Error to the client, Abort back to P */
    {
        Epd__Envelope e = EPD__ENVELOPE__INIT;
        Epd__Error er = EPD__ERROR__INIT;

        er.request_id = big[0].id;
        er.status = EPD_ERR_NO_MEMORY;
        er.message = (char *)"prefill out of memory";
        e.body_case = EPD__ENVELOPE__BODY_ERROR;
        e.error = &er;
        send_env(&T.p, P_ID, &e, 0);
        expect_error(big[0].id, EPD_ERR_NO_MEMORY, 3000);
        env = take(&T.p, big[0].id, EPD__ENVELOPE__BODY_ABORT, 3000);
        assert_non_null(env);
        epd_msg_free(env);
    }
    /* clean up: abort the rest, P quiesces everything */
    send_abort(&T.c, "test-client", r.id);
    send_abort(&T.c, "test-client", big[1].id);
    assert_int_equal(collect(&r, 3000), 0);
    assert_int_equal(collect(&big[1], 3000), 0);
    send_quiesced(r.id);
    send_quiesced(big[0].id);
    send_quiesced(big[1].id);
    wait_full(3000);
}

/* A client goes away with one request waiting for P and one generating:
 * both are aborted (P told for the first), the blocks come back. */
static void test_client_death(void **state)
{
    static side_t c2;
    rq_t a, b;
    Epd__Envelope *env;

    (void)state;
    side_open(&c2, "client2", 2);
    T.extra = &c2;
    rq_init(&a, 91, 10, 20);
    rq_init(&b, 92, 10, 240);
    send_generate_on(&c2, &a, T.d_start, T.p.start, P_ID);
    send_generate_on(&c2, &b, T.d_start, T.p.start, P_ID);
    env = take(&T.p, a.id, EPD__ENVELOPE__BODY_RESERVATION, 5000);
    assert_non_null(env);
    epd_msg_free(env);
    fake_prefill(&b, -1);
    /* b is in the batch once its first chunk came */
    env = take(&c2, b.id, EPD__ENVELOPE__BODY_TOKENS, 5000);
    assert_non_null(env);
    epd_msg_free(env);
    T.extra = NULL;
    side_close(&c2);
    env = take(&T.p, a.id, EPD__ENVELOPE__BODY_ABORT, 5000);
    assert_non_null(env);
    epd_msg_free(env);
    assert_true(blocks_free() < KV_BLOCKS);
    send_quiesced(a.id);
    wait_full(5000);
}

/* Last: the prefill side goes away for good. */
static void test_prefill_death(void **state)
{
    rq_t r;
    Epd__Envelope *env;

    (void)state;
    rq_init(&r, 81, 30, 50);
    send_generate(&r);
    env = take(&T.p, r.id, EPD__ENVELOPE__BODY_RESERVATION, 5000);
    assert_non_null(env);
    epd_msg_free(env);
    assert_true(blocks_free() < KV_BLOCKS);
    epd_xport_mr_dereg(T.pool_mr);
    T.pool_mr = NULL;
    side_close(&T.p);
    expect_error(r.id, EPD_ERR_PEER_DEAD, 5000);
    /* the fence: its process (this one) lives and may have mapped the pool,
     * so its blocks stay quarantined until it confirms (rule 28) */
    poll_ms(300);
    assert_true(blocks_free() < KV_BLOCKS);
    confirm_quiesced(P_ID, T.p.start, T.p.nonce, r.id);
    wait_full(3000);
}

/* After the prefill's death: a new incarnation appears.  A request naming
 * a newer epoch of the worker fails the old epoch's requests at once
 * (EPD_ERR_PEER_DEAD, blocks back) and closes the old incarnation's
 * endpoints; its messages are refused afterwards (EPD_ERR_STALE_EPOCH). */
static void test_prefill_restart_epoch(void **state)
{
    static side_t po, pn;
    rq_t a, b;
    Epd__Envelope *env;
    uint64_t t0;

    (void)state;
    side_open(&po, "prefill-old", 5000);
    side_open(&pn, "prefill-new", 6000);
    T.extra = &po;
    rq_init(&a, 101, 20, 20);
    send_generate_to(&T.c, &po, &a, T.d_start, 5000, P_ID);
    env = take(&po, a.id, EPD__ENVELOPE__BODY_RESERVATION, 5000);
    assert_non_null(env);
    epd_msg_free(env);
    /* the new incarnation */
    T.extra = &pn;
    rq_init(&b, 102, 20, 20);
    t0 = epd_time_now_ns();
    send_generate_to(&T.c, &pn, &b, T.d_start, 6000, P_ID);
    expect_error(a.id, EPD_ERR_PEER_DEAD, 3000);
    assert_true(epd_time_now_ns() - t0 < (uint64_t)LEASE_MS * EPD_NSEC_PER_MSEC);
    env = take(&pn, b.id, EPD__ENVELOPE__BODY_RESERVATION, 5000);
    assert_non_null(env);
    epd_msg_free(env);
    /* the old incarnation speaks again (from any endpoint): refused — but
     * its word that its writes are quiesced is what frees the blocks it
     * may still write (its process, this one, lives: the fence) */
    {
        Epd__Envelope e = EPD__ENVELOPE__INIT;
        Epd__Abort ab = EPD__ABORT__INIT;

        ab.request_id = a.id;
        e.body_case = EPD__ENVELOPE__BODY_ABORT;
        e.abort = &ab;
        T.c.start = 5000; /* the client side poses as the old prefill */
        send_env(&T.c, P_ID, &e, 0);
        T.c.start = 1;
        expect_error(a.id, EPD_ERR_STALE_EPOCH, 3000);
        confirm_quiesced(P_ID, 5000, po.nonce, a.id);
    }
    send_abort(&T.c, "test-client", b.id);
    assert_int_equal(collect(&b, 3000), 0);
    assert_int_equal(b.finish, EPD__FINISH_REASON__FINISH_ABORT);
    env = take(&pn, b.id, EPD__ENVELOPE__BODY_ABORT, 3000);
    assert_non_null(env);
    epd_msg_free(env);
    {
        Epd__Envelope e = EPD__ENVELOPE__INIT;
        Epd__WritesQuiesced q = EPD__WRITES_QUIESCED__INIT;

        q.request_id = b.id;
        e.body_case = EPD__ENVELOPE__BODY_QUIESCED;
        e.quiesced = &q;
        send_env(&pn, P_ID, &e, 0);
    }
    wait_full(3000);
    T.extra = NULL;
    side_close(&pn);
    side_close(&po);
}

/*
 * The fence holds for an endpoint a prefill incarnation opened to us but
 * never spoke on (its writes would travel on it): when the incarnation
 * dies, that endpoint is closed with it before its blocks come back.  Here
 * a newer epoch retires the old one, which is still alive: what the old
 * one sends on its own endpoint afterwards must not arrive (while it was
 * open, decode answered it EPD_ERR_STALE_EPOCH).
 */
static void test_silent_endpoint_closes_with_its_incarnation(void **state)
{
    static side_t po, pn;
    Epd__Envelope e = EPD__ENVELOPE__INIT;
    Epd__WritesQuiesced q = EPD__WRITES_QUIESCED__INIT;
    Epd__Epoch ep = EPD__EPOCH__INIT;
    Epd__SenderRef sr = EPD__SENDER_REF__INIT;
    Epd__Envelope *env;
    rq_t a, b;
    size_t len;

    (void)state;
    side_open(&po, "prefill-silent", 7000); /* connected to decode, never speaks there */
    side_open(&pn, "prefill-silent-new", 8000);
    T.extra = &po;
    T.extra2 = &pn;
    rq_init(&a, 121, 20, 20);
    send_generate_to(&T.c, &po, &a, T.d_start, 7000, "silent-prefill");
    env = take(&po, a.id, EPD__ENVELOPE__BODY_RESERVATION, 5000);
    assert_non_null(env);
    epd_msg_free(env);
    rq_init(&b, 122, 20, 20);
    send_generate_to(&T.c, &pn, &b, T.d_start, 8000, "silent-prefill");
    /* sent once every endpoint of the old incarnation is closed */
    expect_error(a.id, EPD_ERR_PEER_DEAD, 3000);
    env = take(&pn, b.id, EPD__ENVELOPE__BODY_RESERVATION, 5000);
    assert_non_null(env);
    epd_msg_free(env);
    q.request_id = a.id;
    e.body_case = EPD__ENVELOPE__BODY_QUIESCED;
    e.quiesced = &q;
    ep.start_time_ns = 7000;
    ep.nonce = po.nonce;
    sr.worker_id = "silent-prefill";
    sr.epoch = &ep;
    e.sender = &sr;
    e.seq = ++po.seq;
    assert_int_equal(epd_msg_encode(&e, T.buf, sizeof(T.buf), &len), EPD_OK);
    (void)epd_xport_send(po.ep, T.buf, len, 0); /* may fail: the endpoint is gone */
    env = take(&po, a.id, EPD__ENVELOPE__BODY_ERROR, 500);
    if (env != NULL) {
        fail_msg("decode still hears the dead incarnation's own endpoint: Error %s (%s)",
                 epd_status_name((epd_status_t)env->error->status), env->error->message);
    }
    send_abort(&T.c, "test-client", b.id);
    assert_int_equal(collect(&b, 3000), 0);
    env = take(&pn, b.id, EPD__ENVELOPE__BODY_ABORT, 3000);
    assert_non_null(env);
    epd_msg_free(env);
    q.request_id = b.id;
    e.sender = NULL;
    send_env(&pn, "silent-prefill", &e, 0);
    /* the old incarnation (its process lives) confirms on a new endpoint */
    confirm_quiesced("silent-prefill", 7000, po.nonce, a.id);
    wait_full(3000);
    T.extra = NULL;
    T.extra2 = NULL;
    side_close(&pn);
    side_close(&po);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_disagg_equals_colocated),
        cmocka_unit_test(test_corrupt_checksum),
        cmocka_unit_test(test_corrupt_layer_done),
        cmocka_unit_test(test_layer_done_disagrees),
        cmocka_unit_test(test_abort_before_complete_quarantines),
        cmocka_unit_test(test_abort_right_after_complete),
        cmocka_unit_test(test_abort_while_generating),
        cmocka_unit_test(test_lease_expires),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_client_death),
        cmocka_unit_test(test_prefill_death),
        cmocka_unit_test(test_prefill_restart_epoch),
        cmocka_unit_test(test_silent_endpoint_closes_with_its_incarnation),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
