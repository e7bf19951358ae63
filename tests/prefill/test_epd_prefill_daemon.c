/*
 * Tests of build/bin/epd-prefill as a whole, driven over its real
 * transport by a fake client and a fake decode worker living in this
 * process (two epd_xport instances on loopback UCX), and over its gRPC
 * control plane.  What the daemon must do (proto/README.md), one test each:
 *
 *   - a request with a reservation: every layer written into exactly the
 *     reserved blocks and slot, bytes equal to a colocated prefill into the
 *     same blocks, PrefillComplete with the colocated first token and the
 *     checksums of what landed;
 *   - the reservation may overtake the request, or come after the prefill
 *     finished: both complete;
 *   - refused reservations (layout, blocks beyond the pool, region smaller
 *     than the pool, a garbage remote key): Error to client and decode,
 *     WritesQuiesced to decode, nothing written anywhere;
 *   - abort from the client before the reservation: decode gets
 *     WritesQuiesced and never PrefillComplete; abort for an unknown id from
 *     decode: WritesQuiesced; a reservation (or KvRefused) after the
 *     client's Abort: Error EPD_ERR_CANCELED "aborted" + WritesQuiesced;
 *   - no reservation within the lease: Error EPD_ERR_TIMEOUT to the client;
 *     KvRefused: the client gets the refusal's status;
 *   - out of local slots: EPD_ERR_NO_CAPACITY; a live id again:
 *     EPD_ERR_EXISTS; a stale prefill epoch: EPD_ERR_STALE_EPOCH;
 *   - decode dies: the client gets EPD_ERR_PEER_DEAD and prefill keeps
 *     serving; decode restarts under a newer epoch: requests bound to the
 *     old one fail, its messages are refused (EPD_ERR_STALE_EPOCH);
 *   - Health / Status / Drain (wrong id NOT_FOUND, then DRAINING refusals),
 *     and SIGTERM exits 0.
 * Each test ends with the daemon's pool back to full.  The daemon may post
 * only 3 writes at once (--max-inflight-writes 3), so every request also
 * goes through the backpressure path (writes refused with
 * EPD_ERR_NO_RESOURCE, retried after completions, order and checksums
 * kept).
 */
#include "epd_test.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "epd_alloc.h"
#include "epd_hash.h"
#include "epd_layout.h"
#include "epd_msg.h"
#include "epd_rpc.h"
#include "epd_sample.h"
#include "epd_test_engine_util.h"
#include "epd_time.h"
#include "epd_xport.h"

#define D_POOL_BLOCKS 64
#define D_POOL_SLOTS 8
#define P_SLOTS 3
#define LEASE_MS 1500
#define WAIT_MS 10000

typedef struct msg {
    Epd__Envelope *env;
    struct msg *next;
} msg_t;

typedef struct {
    const char *name;
    epd_xport_t *x;
    epd_xport_ep_t *to_p; /* our connection to the prefill daemon */
    msg_t *head;
    int failed_eps;
} side_t;

typedef struct {
    const char *dir;
    const char *model;
    char ready[1024];
    pid_t pid;
    char control[256];
    epd_rpc_client_t *rpc;
    Epd__HealthResponse *health;
    epd_engine_t *engine; /* the colocated reference */
    const epd_engine_info_t *info;
    side_t client, decode;
    epd_xport_mr_t *region; /* decode's pool: D_POOL_BLOCKS x D_POOL_SLOTS */
    unsigned char rkey[EPD_XPORT_RKEY_MAX];
    size_t rkey_len;
    uint64_t next_id;
    uint64_t decode_nonce; /* the fake decode worker's epoch is {111, this} */
} world_t;

static world_t *w;

/* EPD_PREFILL_TEST_BACKEND=ofi runs everything over libfabric instead. */
static const char *backend(void)
{
    const char *b = getenv("EPD_PREFILL_TEST_BACKEND");

    return b != NULL && b[0] != '\0' ? b : "ucx";
}

/* ---------------------------------------------------------------- sides */

static void on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    side_t *s = arg;
    Epd__Envelope *env = NULL;
    msg_t *m, **pp;

    (void)ep;
    assert_int_equal(epd_msg_decode(data, len, &env, NULL), EPD_OK);
    m = epd_calloc(1, sizeof(*m));
    assert_non_null(m);
    m->env = env;
    for (pp = &s->head; *pp != NULL; pp = &(*pp)->next) {
    }
    *pp = m;
}

static void on_err(void *arg, epd_xport_ep_t *ep, epd_status_t st)
{
    side_t *s = arg;

    (void)ep;
    (void)st;
    s->failed_eps++;
}

static void side_init(side_t *s, const char *name)
{
    epd_xport_config_t cfg;

    memset(s, 0, sizeof(*s));
    s->name = name;
    epd_xport_config_init(&cfg);
    cfg.backend = backend();
    cfg.peer_timeout_ms = 3000;
    cfg.connect_timeout_ms = 3000;
    cfg.msg_cb = on_msg;
    cfg.err_cb = on_err;
    cfg.cb_arg = s;
    assert_int_equal(epd_xport_create(&cfg, &s->x), EPD_OK);
    assert_int_equal(epd_xport_connect(s->x, w->health->data_plane_address.data,
                                       w->health->data_plane_address.len, NULL, NULL, &s->to_p),
                     EPD_INPROGRESS);
}

static void side_drop_msgs(side_t *s)
{
    while (s->head != NULL) {
        msg_t *m = s->head;
        s->head = m->next;
        epd_msg_free(m->env);
        epd_free(m);
    }
}

static void pump(int ms)
{
    uint64_t end = epd_time_now_ns() + (uint64_t)ms * EPD_NSEC_PER_MSEC;

    do {
        epd_xport_poll(w->client.x, 0);
        if (w->decode.x != NULL) {
            epd_xport_poll(w->decode.x, 0);
        }
        epd_time_sleep_ns(200 * EPD_NSEC_PER_USEC);
    } while (epd_time_now_ns() < end);
}

/* The first message of `body_case` for `id` on side s (taken: epd_msg_free),
 * or NULL after timeout_ms. */
static Epd__Envelope *expect_msg(side_t *s, Epd__Envelope__BodyCase body_case, uint64_t id,
                                 int timeout_ms)
{
    uint64_t end = epd_time_now_ns() + (uint64_t)timeout_ms * EPD_NSEC_PER_MSEC;

    for (;;) {
        for (msg_t **pp = &s->head; *pp != NULL; pp = &(*pp)->next) {
            msg_t *m = *pp;

            if (m->env->body_case == body_case && epd_msg_request_id(m->env) == id) {
                Epd__Envelope *env = m->env;

                *pp = m->next;
                epd_free(m);
                return env;
            }
        }
        if (epd_time_now_ns() >= end) {
            return NULL;
        }
        pump(1);
    }
}

static void expect_error(side_t *s, uint64_t id, epd_status_t status)
{
    Epd__Envelope *env = expect_msg(s, EPD__ENVELOPE__BODY_ERROR, id, WAIT_MS);

    if (env == NULL) {
        fail_msg("%s: no Error for request %llu", s->name, (unsigned long long)id);
    }
    if (env->error->status != (int32_t)status) {
        fail_msg("%s: request %llu: Error %s (%s), want %s", s->name, (unsigned long long)id,
                 epd_status_name((epd_status_t)env->error->status), env->error->message,
                 epd_status_name(status));
    }
    epd_msg_free(env);
}

static void expect_quiesced(uint64_t id)
{
    Epd__Envelope *env = expect_msg(&w->decode, EPD__ENVELOPE__BODY_QUIESCED, id, WAIT_MS);

    if (env == NULL) {
        fail_msg("decode: no WritesQuiesced for request %llu", (unsigned long long)id);
    }
    epd_msg_free(env);
}

static void send_env(side_t *s, Epd__Envelope *env)
{
    static unsigned char buf[65536];
    Epd__SenderRef sender = EPD__SENDER_REF__INIT;
    Epd__Epoch epoch = EPD__EPOCH__INIT;
    size_t len;

    epoch.start_time_ns = s == &w->decode ? 111 : 333;
    epoch.nonce = s == &w->decode ? w->decode_nonce : 444;
    sender.worker_id = (char *)s->name;
    sender.epoch = &epoch;
    env->sender = &sender;
    env->seq = 1;
    assert_int_equal(epd_msg_encode(env, buf, sizeof(buf), &len), EPD_OK);
    assert_int_equal(epd_xport_send(s->to_p, buf, len, 0), EPD_OK);
}

/* ---------------------------------------------------------- the requests */

typedef struct {
    uint64_t id;
    int32_t tokens[300];
    uint32_t n;
    uint32_t blocks[16];
    uint32_t n_blocks;
    uint32_t slot;
    float temperature;
    uint64_t seed;
} req_t;

static void req_make(req_t *r, uint32_t n)
{
    memset(r, 0, sizeof(*r));
    r->id = ++w->next_id;
    r->n = n;
    r->tokens[0] = w->info->bos_token;
    for (uint32_t i = 1; i < n; i++) {
        r->tokens[i] = (int32_t)(40 + (i * 31 + r->id * 7) % 80);
    }
    r->n_blocks = (n + 15) / 16;
    for (uint32_t i = 0; i < r->n_blocks; i++) {
        r->blocks[i] = D_POOL_BLOCKS - 1 - 3 * i; /* scattered, descending */
    }
    r->slot = 5;
    r->temperature = 0.9f;
    r->seed = 1000 + r->id;
}

/* When set, send_generate sends a prefill-only request naming no decode
 * worker (proto/README.md rule 12). */
static int gen_prefill_only;

static void send_generate(const req_t *r, const Epd__Epoch *prefill_epoch)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__GenerateRequest g = EPD__GENERATE_REQUEST__INIT;
    Epd__SamplingParams sp = EPD__SAMPLING_PARAMS__INIT;
    Epd__Epoch d_epoch = EPD__EPOCH__INIT;
    uint32_t toks[300];
    const void *addr;
    size_t addr_len;

    for (uint32_t i = 0; i < r->n; i++) {
        toks[i] = (uint32_t)r->tokens[i];
    }
    assert_int_equal(epd_xport_address(w->decode.x, &addr, &addr_len), EPD_OK);
    sp.temperature = r->temperature;
    sp.top_p = 0.95f;
    sp.seed = r->seed;
    sp.max_tokens = 4;
    d_epoch.start_time_ns = 111;
    d_epoch.nonce = w->decode_nonce;
    g.request_id = r->id;
    g.n_prompt_tokens = r->n;
    g.prompt_tokens = toks;
    g.sampling = &sp;
    g.prefill_worker_id = w->health->worker->worker_id;
    g.decode_worker_id = (char *)"fake-decode";
    g.decode_address.data = (uint8_t *)addr;
    g.decode_address.len = addr_len;
    g.prefill_epoch =
        (Epd__Epoch *)(prefill_epoch != NULL ? prefill_epoch : w->health->worker->epoch);
    g.decode_epoch = &d_epoch;
    if (gen_prefill_only) {
        g.prefill_only = 1;
        g.decode_worker_id = NULL;
        g.decode_address.data = NULL;
        g.decode_address.len = 0;
        g.decode_epoch = NULL;
    }
    env.body_case = EPD__ENVELOPE__BODY_GENERATE;
    env.generate = &g;
    send_env(&w->client, &env);
}

/* A reservation of r's blocks; `tweak` may spoil it before it is sent. */
static void send_reservation(const req_t *r, void (*tweak)(Epd__KvReservation *))
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__KvReservation kr = EPD__KV_RESERVATION__INIT;
    Epd__KvLayout layout;
    char pattern[EPD_LAYOUT_PATTERN_MAX];

    epd_layout_to_msg(&w->info->kv, &layout, pattern);
    kr.request_id = r->id;
    kr.n_block_ids = r->n_blocks;
    kr.block_ids = (uint32_t *)r->blocks;
    kr.state_slot = r->slot;
    kr.rkey.data = w->rkey;
    kr.rkey.len = w->rkey_len;
    kr.region_size = epd_xport_mr_size(w->region);
    kr.layout = &layout;
    kr.lease_ms = LEASE_MS;
    kr.pool_blocks = D_POOL_BLOCKS;
    kr.pool_state_slots = D_POOL_SLOTS;
    if (tweak != NULL) {
        tweak(&kr);
    }
    env.body_case = EPD__ENVELOPE__BODY_RESERVATION;
    env.reservation = &kr;
    send_env(&w->decode, &env);
}

static void send_abort(side_t *s, uint64_t id)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__Abort a = EPD__ABORT__INIT;

    a.request_id = id;
    a.status = EPD_ERR_CANCELED;
    a.reason = (char *)"test abort";
    env.body_case = EPD__ENVELOPE__BODY_ABORT;
    env.abort = &a;
    send_env(s, &env);
}

static int region_is_zero(void)
{
    const unsigned char *p = epd_xport_mr_addr(w->region);
    size_t n = epd_xport_mr_size(w->region);

    for (size_t i = 0; i < n; i++) {
        if (p[i] != 0) {
            return 0;
        }
    }
    return 1;
}

static void region_clear(void)
{
    memset(epd_xport_mr_addr(w->region), 0, epd_xport_mr_size(w->region));
}

/* PrefillComplete for r: the colocated first token, the checksums of what
 * landed in the reserved blocks and slot, and those bytes equal to a
 * colocated prefill into the same blocks. */
static void expect_complete(const req_t *r)
{
    const epd_kv_layout_t *kv = &w->info->kv;
    Epd__Envelope *env =
        expect_msg(&w->decode, EPD__ENVELOPE__BODY_PREFILL_COMPLETE, r->id, WAIT_MS);
    const Epd__PrefillComplete *pc;
    const char *base = epd_xport_mr_addr(w->region);
    epd_kv_pool_t pool;
    epd_prefill_args_t a;
    epd_sample_params_t sp;
    epd_sample_scratch_t *scratch;
    float *logits;
    int32_t tok;

    if (env == NULL) {
        fail_msg("decode: no PrefillComplete for request %llu", (unsigned long long)r->id);
    }
    pc = env->prefill_complete;
    assert_int_equal(pc->n_prompt_tokens, r->n);
    assert_int_equal(pc->n_layer_checksums, kv->n_layers);

    /* colocated: same model, same blocks of a pool of decode's geometry */
    epd_test_pool(w->engine, D_POOL_BLOCKS, D_POOL_SLOTS, &pool);
    logits = epd_calloc(w->info->vocab_size, sizeof(float));
    memset(&a, 0, sizeof(a));
    a.seq.req_id = r->id;
    a.seq.block_table = r->blocks;
    a.seq.n_blocks = r->n_blocks;
    a.seq.state_slot = r->slot;
    a.tokens = r->tokens;
    a.n_tokens = r->n;
    assert_int_equal(epd_engine_prefill(w->engine, &pool, &a, NULL, logits), EPD_OK);
    epd_sample_params_default(&sp);
    sp.temperature = r->temperature;
    sp.top_p = 0.95f;
    sp.seed = r->seed;
    assert_int_equal(epd_sample_scratch_create(w->info->vocab_size, &scratch), EPD_OK);
    assert_int_equal(epd_sample_token(&sp, scratch, logits, w->info->vocab_size, 0, &tok), EPD_OK);
    assert_int_equal(pc->first_token, (uint32_t)tok);

    for (uint32_t l = 0; l < kv->n_layers; l++) {
        uint64_t sum = 0, off;
        epd_hash_state_t *h;

        assert_int_equal(epd_hash_state_create(0, &h), EPD_OK);
        if (kv->kind[l] == EPD_LAYER_LINEAR) {
            assert_int_equal(epd_kv_state_offset(kv, D_POOL_BLOCKS, D_POOL_SLOTS, l, r->slot, &off),
                             EPD_OK);
            assert_memory_equal(base + off, (char *)pool.base + off, kv->state_bytes);
            epd_hash_state_update(h, base + off, kv->state_bytes);
        } else {
            for (uint32_t b = 0; b < r->n_blocks; b++) {
                assert_int_equal(epd_kv_block_offset(kv, D_POOL_BLOCKS, l, r->blocks[b], &off),
                                 EPD_OK);
                assert_memory_equal(base + off, (char *)pool.base + off, kv->block_bytes);
                epd_hash_state_update(h, base + off, kv->block_bytes);
            }
        }
        sum = epd_hash_state_digest(h);
        epd_hash_state_destroy(h);
        assert_int_equal(pc->layer_checksums[l], sum);
    }
    /* nothing outside the reservation was written */
    assert_memory_equal(base, pool.base,
                        epd_xport_mr_size(w->region) < pool.bytes ? epd_xport_mr_size(w->region)
                                                                  : pool.bytes);
    epd_sample_scratch_destroy(scratch);
    epd_free(logits);
    epd_free(pool.base);
    epd_msg_free(env);
}

/* ---------------------------------------------------------- control plane */

static ProtobufCMessage *rpc(const char *method, const ProtobufCMessageDescriptor *desc,
                             const ProtobufCMessage *req, epd_status_t *st_p)
{
    unsigned char in[256];
    size_t in_len = req != NULL ? protobuf_c_message_pack(req, in) : 0;
    void *out = NULL;
    size_t out_len = 0;
    ProtobufCMessage *m = NULL;
    epd_status_t st;

    st =
        epd_rpc_call(w->rpc, method, in_len > 0 ? in : NULL, in_len, 5000, &out, &out_len, NULL, 0);
    *st_p = st;
    if (st == EPD_OK) {
        assert_int_equal(epd_proto_unpack(desc, out, out_len, &m), EPD_OK);
    }
    epd_free(out);
    return m;
}

static Epd__Load *load_now(Epd__StatusResponse **resp_p)
{
    epd_status_t st;
    Epd__StatusResponse *s =
        (Epd__StatusResponse *)rpc(EPD_RPC_STATUS, &epd__status_response__descriptor, NULL, &st);

    assert_int_equal(st, EPD_OK);
    assert_int_equal(s->n_workers, 1);
    *resp_p = s;
    return s->workers[0]->load;
}

/* Until the daemon holds no request and its pool is full again. */
static void wait_idle(void)
{
    uint64_t end = epd_time_now_ns() + 15 * EPD_NSEC_PER_SEC;
    int idle = 0;

    while (!idle && epd_time_now_ns() < end) {
        Epd__StatusResponse *s;
        Epd__Load *l = load_now(&s);

        idle = l->running_requests == 0 && l->queue_depth == 0 && l->state_slots_free == P_SLOTS &&
               l->kv_blocks_free == 256;
        epd_proto_free(&s->base);
        if (!idle) {
            pump(20);
        }
    }
    assert_true(idle);
}

/* ------------------------------------------------------- daemon lifetime */

static const char *bin_path(void)
{
    static char path[1024];
    const char *b = getenv("EPD_BUILD");

    snprintf(path, sizeof(path), "%s/bin/epd-prefill", b != NULL && b[0] != '\0' ? b : "build");
    return path;
}

static void start_daemon(void)
{
    char lease[32], slots[32];
    char line[512] = "";
    FILE *f = NULL;
    epd_status_t st;

    snprintf(w->ready, sizeof(w->ready), "%s/p.ready", w->dir);
    snprintf(lease, sizeof(lease), "%d", LEASE_MS);
    snprintf(slots, sizeof(slots), "%d", P_SLOTS);
    w->pid = fork();
    assert_true(w->pid >= 0);
    if (w->pid == 0) {
        char *argv[] = {(char *)bin_path(),
                        "--model",
                        (char *)w->model,
                        "--worker-id",
                        "prefill-t",
                        "--ready-file",
                        w->ready,
                        "--lease-ms",
                        lease,
                        "--state-slots",
                        slots,
                        "--kv-blocks",
                        "256",
                        "--peer-timeout-ms",
                        "1500",
                        "--log-level",
                        "debug",
                        "--max-inflight-writes",
                        "3",
                        "--transport",
                        (char *)backend(),
                        NULL};
        char log[1100];

        snprintf(log, sizeof(log), "%s/p.log", w->dir);
        if (freopen(log, "w", stderr) == NULL) {
            _exit(127);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    for (int i = 0; i < 600 && (f = fopen(w->ready, "r")) == NULL; i++) {
        assert_int_equal(waitpid(w->pid, NULL, WNOHANG), 0);
        epd_time_sleep_ns(100 * EPD_NSEC_PER_MSEC);
    }
    assert_non_null(f);
    assert_non_null(fgets(line, sizeof(line), f));
    fclose(f);
    assert_int_equal(sscanf(line, "control=%255s", w->control), 1);
    assert_non_null(strstr(line, "worker=prefill-t"));
    assert_int_equal(epd_rpc_client_create(w->control, &w->rpc), EPD_OK);
    w->health =
        (Epd__HealthResponse *)rpc(EPD_RPC_HEALTH, &epd__health_response__descriptor, NULL, &st);
    assert_int_equal(st, EPD_OK);
}

static int setup(void **state)
{
    epd_mkmodel_params_t p;
    epd_engine_config_t cfg;

    setenv("UCX_TLS", "posix,cma,tcp", 0);
    setenv("UCX_NET_DEVICES", "lo", 0);
    w = epd_calloc(1, sizeof(*w));
    w->dir = epd_test_tmpdir();
    epd_test_tiny_params(&p);
    p.hp.max_context = 256;
    w->model = epd_test_write_model(w->dir, "tiny", &p);
    memset(&cfg, 0, sizeof(cfg));
    cfg.model_dir = w->model;
    cfg.block_tokens = 16;
    assert_int_equal(epd_engine_open("ref", &cfg, &w->engine), EPD_OK);
    w->info = epd_engine_info(w->engine);
    w->decode_nonce = 222;
    start_daemon();
    side_init(&w->client, "fake-client");
    side_init(&w->decode, "fake-decode");
    assert_int_equal(
        epd_xport_mr_alloc(
            w->decode.x, epd_kv_pool_bytes(&w->info->kv, D_POOL_BLOCKS, D_POOL_SLOTS), &w->region),
        EPD_OK);
    assert_int_equal(epd_xport_mr_pack(w->region, w->rkey, sizeof(w->rkey), &w->rkey_len), EPD_OK);
    *state = w;
    return 0;
}

static int teardown(void **state)
{
    int status = 0;

    (void)state;
    side_drop_msgs(&w->client);
    side_drop_msgs(&w->decode);
    epd_xport_destroy(w->client.x);
    epd_xport_destroy(w->decode.x);
    if (w->health != NULL) {
        epd_proto_free(&w->health->base);
    }
    epd_rpc_client_destroy(w->rpc);
    if (w->pid > 0) {
        kill(w->pid, SIGTERM);
        for (int i = 0; i < 100 && waitpid(w->pid, &status, WNOHANG) == 0; i++) {
            epd_time_sleep_ns(100 * EPD_NSEC_PER_MSEC);
        }
        kill(w->pid, SIGKILL);
        waitpid(w->pid, NULL, 0);
    }
    epd_engine_close(w->engine);
    epd_test_rmtree(w->dir);
    epd_free(w);
    return 0;
}

/* ------------------------------------------------------------------ tests */

static void test_health(void **state)
{
    Epd__HealthResponse *h;
    Epd__StatusResponse *s;
    Epd__Load *l;
    const char *why = NULL;

    (void)state;
    h = w->health;
    assert_true(h->serving);
    assert_false(h->draining);
    assert_string_equal(h->worker->worker_id, "prefill-t");
    assert_int_equal(h->worker->role, EPD__ROLE__ROLE_PREFILL);
    assert_string_equal(h->worker->model, "tiny");
    assert_non_null(h->worker->epoch);
    assert_true(h->worker->epoch->start_time_ns > 0);
    assert_string_equal(h->transport, backend());
    assert_true(h->data_plane_address.len > 0);
    assert_int_equal(epd_layout_check(&w->info->kv, h->kv_layout, &why), EPD_OK);
    assert_int_equal(h->capacity->kv_blocks_total, 256);
    assert_int_equal(h->capacity->state_slots_total, P_SLOTS);
    assert_int_equal(h->capacity->block_tokens, 16);
    assert_int_equal(h->capacity->max_context, w->info->max_context);
    l = load_now(&s);
    assert_int_equal(l->kv_blocks_free, 256);
    assert_int_equal(l->state_slots_free, P_SLOTS);
    assert_int_equal(s->workers[0]->state, EPD__WORKER_STATE__WORKER_STATE_READY);
    epd_proto_free(&s->base);
}

static void test_reservation_then_layers(void **state)
{
    req_t r;

    (void)state;
    region_clear();
    req_make(&r, 150);
    send_generate(&r, NULL);
    pump(5);
    send_reservation(&r, NULL);
    expect_complete(&r);
    wait_idle();
    /* with 3 writes in flight at most, this request met backpressure */
    {
        char path[1100];
        size_t len;
        unsigned char *log;

        snprintf(path, sizeof(path), "%s/p.log", w->dir);
        log = epd_test_read_file(path, &len);
        log[len - 1] = '\0';
        assert_non_null(strstr((char *)log, "transport backpressure"));
        epd_free(log);
    }
}

/* prefill_only: the same first token as the full path, to the client, in
 * one TokenChunk; nothing written, nothing sent to the decode worker. */
static void test_prefill_only(void **state)
{
    Epd__Envelope *env;
    uint32_t first;
    req_t r, a;

    (void)state;
    region_clear();
    req_make(&r, 150);
    send_generate(&r, NULL);
    pump(5);
    send_reservation(&r, NULL);
    env = expect_msg(&w->decode, EPD__ENVELOPE__BODY_PREFILL_COMPLETE, r.id, WAIT_MS);
    assert_non_null(env);
    first = env->prefill_complete->first_token;
    epd_msg_free(env);
    wait_idle();
    side_drop_msgs(&w->decode);
    region_clear();

    a = r; /* same prompt and seed */
    a.id = ++w->next_id;
    gen_prefill_only = 1;
    send_generate(&a, NULL);
    gen_prefill_only = 0;
    env = expect_msg(&w->client, EPD__ENVELOPE__BODY_TOKENS, a.id, WAIT_MS);
    if (env == NULL) {
        fail_msg("client: no TokenChunk for prefill-only request %llu", (unsigned long long)a.id);
    }
    assert_int_equal(env->tokens->index, 0);
    assert_int_equal(env->tokens->n_tokens, 1);
    assert_int_equal(env->tokens->tokens[0], first);
    assert_int_equal(env->tokens->finish, EPD__FINISH_REASON__FINISH_LENGTH);
    epd_msg_free(env);
    wait_idle();
    assert_true(region_is_zero());
    pump(50);
    for (msg_t *m = w->decode.head; m != NULL; m = m->next) {
        if (epd_msg_request_id(m->env) == a.id) {
            fail_msg("decode got %s for a prefill-only request", epd_msg_body_name(m->env));
        }
    }
}

static void test_reservation_before_request(void **state)
{
    req_t r;

    (void)state;
    region_clear();
    req_make(&r, 37);
    send_reservation(&r, NULL);
    pump(50); /* the reservation is in before the request */
    send_generate(&r, NULL);
    expect_complete(&r);
    wait_idle();
}

static void test_reservation_after_prefill(void **state)
{
    req_t r;

    (void)state;
    region_clear();
    req_make(&r, 16); /* exactly one block */
    send_generate(&r, NULL);
    pump(300); /* the tiny prefill is long done */
    send_reservation(&r, NULL);
    expect_complete(&r);
    wait_idle();
}

static void spoil_layout(Epd__KvReservation *kr)
{
    kr->layout->block_tokens = 32;
}

static void spoil_block(Epd__KvReservation *kr)
{
    kr->block_ids[0] = D_POOL_BLOCKS; /* one past decode's pool */
}

static void spoil_region(Epd__KvReservation *kr)
{
    kr->pool_blocks = D_POOL_BLOCKS * 2; /* more than the region holds */
}

static void spoil_rkey(Epd__KvReservation *kr)
{
    static unsigned char junk[40];

    memset(junk, 0x5a, sizeof(junk));
    kr->rkey.data = junk;
    kr->rkey.len = sizeof(junk);
}

static void test_bad_reservations(void **state)
{
    void (*spoil[])(Epd__KvReservation *) = {spoil_layout, spoil_block, spoil_region, spoil_rkey};
    epd_status_t want[] = {EPD_ERR_INVALID_PARAM, EPD_ERR_OUT_OF_RANGE, EPD_ERR_OUT_OF_RANGE,
                           EPD_ERR_BAD_RKEY};

    (void)state;
    region_clear();
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        req_t r;

        req_make(&r, 70);
        send_generate(&r, NULL);
        send_reservation(&r, spoil[i]);
        expect_error(&w->client, r.id, want[i]);
        expect_error(&w->decode, r.id, want[i]);
        expect_quiesced(r.id);
        assert_null(expect_msg(&w->decode, EPD__ENVELOPE__BODY_PREFILL_COMPLETE, r.id, 100));
    }
    wait_idle();
    assert_true(region_is_zero());
}

static void test_abort(void **state)
{
    req_t r;

    (void)state;
    region_clear();
    /* from the client, before any reservation: nothing to wait for */
    req_make(&r, 120);
    send_generate(&r, NULL);
    send_abort(&w->client, r.id);
    expect_quiesced(r.id);
    wait_idle();
    /* a late reservation for the aborted id is answered as an abort, never
     * written */
    send_reservation(&r, NULL);
    expect_error(&w->decode, r.id, EPD_ERR_CANCELED);
    expect_quiesced(r.id);
    assert_null(expect_msg(&w->decode, EPD__ENVELOPE__BODY_PREFILL_COMPLETE, r.id, 300));
    /* the client hears nothing from prefill about its own abort */
    assert_null(expect_msg(&w->client, EPD__ENVELOPE__BODY_ERROR, r.id, 10));
    /* a request reusing the aborted id is refused */
    send_generate(&r, NULL);
    expect_error(&w->client, r.id, EPD_ERR_CANCELED);
    /* from decode for an id prefill never saw: WritesQuiesced at once */
    send_abort(&w->decode, 987654321);
    expect_quiesced(987654321);
    wait_idle();
    assert_true(region_is_zero());
}

/* The client's Abort, THEN decode's KvReservation (they come from different
 * senders on different links, so they may cross in this order): the
 * request must end as an abort — Error EPD_ERR_CANCELED "aborted" (decode
 * then ends the stream with finish ABORT, not with an error) and
 * WritesQuiesced — whether the request was live when the Abort came, or
 * the Abort came first of all; a KvRefused after the Abort too.  Before
 * the fix the reservation was answered EPD_ERR_NOT_FOUND, which decode
 * relayed to the client as a failure. */
static void test_abort_then_reservation(void **state)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__KvRefused rf = EPD__KV_REFUSED__INIT;
    Epd__Envelope *err;
    req_t r;

    (void)state;
    region_clear();
    /* live when the Abort came: aborted, quiesced, gone */
    req_make(&r, 50);
    send_generate(&r, NULL);
    pump(5);
    send_abort(&w->client, r.id);
    expect_quiesced(r.id);
    wait_idle();
    send_reservation(&r, NULL);
    err = expect_msg(&w->decode, EPD__ENVELOPE__BODY_ERROR, r.id, WAIT_MS);
    assert_non_null(err);
    if (err->error->status != EPD_ERR_CANCELED) {
        fail_msg("reservation after the client's Abort: Error %s (%s), want EPD_ERR_CANCELED",
                 epd_status_name((epd_status_t)err->error->status), err->error->message);
    }
    assert_string_equal(err->error->message, "aborted");
    epd_msg_free(err);
    expect_quiesced(r.id);
    assert_null(expect_msg(&w->decode, EPD__ENVELOPE__BODY_PREFILL_COMPLETE, r.id, 100));

    /* the Abort before anything else of the id: the same answer */
    req_make(&r, 50);
    send_abort(&w->client, r.id);
    pump(20);
    send_reservation(&r, NULL);
    expect_error(&w->decode, r.id, EPD_ERR_CANCELED);
    expect_quiesced(r.id);

    /* decode refused after the Abort: told it was aborted too */
    req_make(&r, 50);
    send_generate(&r, NULL);
    send_abort(&w->client, r.id);
    expect_quiesced(r.id);
    wait_idle();
    rf.request_id = r.id;
    rf.status = EPD_ERR_NO_CAPACITY;
    rf.reason = (char *)"decode is full";
    env.body_case = EPD__ENVELOPE__BODY_REFUSED;
    env.refused = &rf;
    send_env(&w->decode, &env);
    expect_error(&w->decode, r.id, EPD_ERR_CANCELED);
    expect_quiesced(r.id);
    /* the client hears nothing from prefill about its own aborts */
    assert_null(expect_msg(&w->client, EPD__ENVELOPE__BODY_ERROR, r.id, 10));
    wait_idle();
    assert_true(region_is_zero());
}

static void test_lease_and_refusal(void **state)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__KvRefused rf = EPD__KV_REFUSED__INIT;
    uint64_t t0;
    req_t a, b;

    (void)state;
    req_make(&a, 20);
    req_make(&b, 20);
    t0 = epd_time_now_ns();
    send_generate(&a, NULL);
    send_generate(&b, NULL);
    rf.request_id = b.id;
    rf.status = EPD_ERR_NO_CAPACITY;
    rf.reason = (char *)"decode is full";
    env.body_case = EPD__ENVELOPE__BODY_REFUSED;
    env.refused = &rf;
    send_env(&w->decode, &env);
    expect_error(&w->client, b.id, EPD_ERR_NO_CAPACITY);
    /* no reservation for a: dropped after the lease, client told */
    expect_error(&w->client, a.id, EPD_ERR_TIMEOUT);
    assert_true(epd_time_now_ns() - t0 >= (uint64_t)LEASE_MS * EPD_NSEC_PER_MSEC);
    expect_error(&w->decode, a.id, EPD_ERR_TIMEOUT);
    expect_quiesced(a.id);
    wait_idle();
}

static void test_refusals(void **state)
{
    Epd__Epoch stale = EPD__EPOCH__INIT;
    req_t r[P_SLOTS + 1];

    (void)state;
    /* out of slots: P_SLOTS requests wait for reservations, one more is
     * refused */
    for (int i = 0; i <= P_SLOTS; i++) {
        req_make(&r[i], 20);
        send_generate(&r[i], NULL);
    }
    expect_error(&w->client, r[P_SLOTS].id, EPD_ERR_NO_CAPACITY);
    /* a live id again */
    send_generate(&r[0], NULL);
    expect_error(&w->client, r[0].id, EPD_ERR_EXISTS);
    for (int i = 0; i < P_SLOTS; i++) {
        send_abort(&w->client, r[i].id);
        expect_quiesced(r[i].id);
    }
    /* another incarnation of this prefill worker */
    stale.start_time_ns = w->health->worker->epoch->start_time_ns - 1;
    stale.nonce = w->health->worker->epoch->nonce;
    req_make(&r[0], 20);
    send_generate(&r[0], &stale);
    expect_error(&w->client, r[0].id, EPD_ERR_STALE_EPOCH);
    /* a token outside the vocabulary */
    req_make(&r[0], 20);
    r[0].tokens[3] = (int32_t)w->info->vocab_size;
    send_generate(&r[0], NULL);
    expect_error(&w->client, r[0].id, EPD_ERR_INVALID_PARAM);
    /* a prompt longer than the context */
    req_make(&r[0], 20);
    r[0].n = w->info->max_context + 1;
    assert_true(r[0].n <= 300);
    send_generate(&r[0], NULL);
    expect_error(&w->client, r[0].id, EPD_ERR_TOO_LONG);
    wait_idle();
}

/* Decode dies mid-request: the client hears EPD_ERR_PEER_DEAD, prefill
 * keeps serving (a later request through a new decode completes). */
static void test_decode_dies(void **state)
{
    req_t r;

    (void)state;
    req_make(&r, 100);
    send_generate(&r, NULL);
    pump(20);
    side_drop_msgs(&w->decode);
    epd_xport_mr_dereg(w->region);
    epd_xport_destroy(w->decode.x); /* says BYE: the endpoint fails at once */
    w->decode.x = NULL;
    expect_error(&w->client, r.id, EPD_ERR_PEER_DEAD);
    wait_idle();

    side_init(&w->decode, "fake-decode");
    assert_int_equal(
        epd_xport_mr_alloc(
            w->decode.x, epd_kv_pool_bytes(&w->info->kv, D_POOL_BLOCKS, D_POOL_SLOTS), &w->region),
        EPD_OK);
    assert_int_equal(epd_xport_mr_pack(w->region, w->rkey, sizeof(w->rkey), &w->rkey_len), EPD_OK);
    req_make(&r, 45);
    send_generate(&r, NULL);
    send_reservation(&r, NULL);
    expect_complete(&r);
    wait_idle();
}

/* The decode worker restarts (same id, newer epoch): requests bound to the
 * old incarnation fail at once, every endpoint of it is closed (ours, and
 * its own to us: nothing of it may land any more), its messages are
 * refused, the new one — which connects anew, as a restarted process
 * does — serves. */
static void test_decode_new_epoch(void **state)
{
    req_t a, b;

    (void)state;
    region_clear();
    req_make(&a, 30);
    send_generate(&a, NULL);
    pump(20);
    w->decode_nonce = 999; /* same start time, another incarnation */
    req_make(&b, 30);
    send_generate(&b, NULL);
    expect_error(&w->client, a.id, EPD_ERR_PEER_DEAD);
    /* the old incarnation's own endpoint to prefill was closed with it */
    for (int i = 0; i < 500 && w->decode.failed_eps == 0; i++) {
        pump(10);
    }
    assert_true(w->decode.failed_eps > 0);
    epd_xport_ep_close(w->decode.to_p);
    assert_int_equal(epd_xport_connect(w->decode.x, w->health->data_plane_address.data,
                                       w->health->data_plane_address.len, NULL, NULL,
                                       &w->decode.to_p),
                     EPD_INPROGRESS);
    w->decode_nonce = 222;
    send_reservation(&b, NULL); /* from the old incarnation */
    expect_error(&w->decode, b.id, EPD_ERR_STALE_EPOCH);
    w->decode_nonce = 999;
    send_reservation(&b, NULL);
    expect_complete(&b);
    wait_idle();
}

static void test_drain(void **state)
{
    Epd__DrainRequest dr = EPD__DRAIN_REQUEST__INIT;
    Epd__HealthResponse *h;
    ProtobufCMessage *m;
    epd_status_t st;
    req_t r;

    (void)state;
    dr.worker_id = (char *)"someone-else";
    m = rpc(EPD_RPC_DRAIN, &epd__drain_response__descriptor, &dr.base, &st);
    assert_int_equal(st, EPD_ERR_NOT_FOUND);
    assert_null(m);
    m = rpc(EPD_RPC_REGISTER, &epd__register_response__descriptor, NULL, &st);
    assert_int_equal(st, EPD_ERR_UNSUPPORTED);
    dr.worker_id = (char *)"prefill-t";
    m = rpc(EPD_RPC_DRAIN, &epd__drain_response__descriptor, &dr.base, &st);
    assert_int_equal(st, EPD_OK);
    assert_true(((Epd__DrainResponse *)m)->ok);
    epd_proto_free(m);
    h = (Epd__HealthResponse *)rpc(EPD_RPC_HEALTH, &epd__health_response__descriptor, NULL, &st);
    assert_int_equal(st, EPD_OK);
    assert_true(h->draining);
    assert_false(h->serving);
    epd_proto_free(&h->base);
    req_make(&r, 20);
    send_generate(&r, NULL);
    expect_error(&w->client, r.id, EPD_ERR_DRAINING);
}

static void test_sigterm(void **state)
{
    int status = 0;

    (void)state;
    assert_int_equal(kill(w->pid, SIGTERM), 0);
    for (int i = 0; i < 100 && waitpid(w->pid, &status, WNOHANG) == 0; i++) {
        epd_time_sleep_ns(100 * EPD_NSEC_PER_MSEC);
    }
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    w->pid = 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health),
        cmocka_unit_test(test_reservation_then_layers),
        cmocka_unit_test(test_prefill_only),
        cmocka_unit_test(test_reservation_before_request),
        cmocka_unit_test(test_reservation_after_prefill),
        cmocka_unit_test(test_bad_reservations),
        cmocka_unit_test(test_abort),
        cmocka_unit_test(test_abort_then_reservation),
        cmocka_unit_test(test_lease_and_refusal),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_decode_dies),
        cmocka_unit_test(test_decode_new_epoch),
        cmocka_unit_test(test_drain),
        cmocka_unit_test(test_sigterm),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
