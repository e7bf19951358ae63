/*
 * Tests of client/epd_client.c without daemons: Health answers are parsed
 * and refused exactly; and a client talks over a real transport (UCX on
 * loopback, both ends in this process and thread) to a scripted fake
 * worker that plays prefill and decode: the GenerateRequest both receive,
 * chunk streaming, out-of-order chunks, foreign senders and old epochs,
 * unknown ids, garbage frames, errors, refusals, deadlines, aborts (an
 * aborted request ends as aborted whatever its workers answer) and a
 * dying worker — each request ends in exactly one terminal event.
 */
#include "epd_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_client.h"
#include "epd_msg.h"
#include "epd_time.h"
#include "epd_xport.h"
#include "epd_xport_uv.h"

/* UCX keeps process-wide allocations until exit (not epd's). */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libucs.so\nleak:libucp.so\nleak:libuct.so\nleak:libucm.so\n"
           "leak:libfabric.so\n";
}

/* ------------------------------------------------------------ Health */

typedef struct {
    Epd__Epoch epoch;
    Epd__WorkerIdentity id;
    Epd__KvLayout layout;
    Epd__Capacity cap;
    Epd__Load load;
    Epd__HealthResponse h;
    unsigned char addr[16];
} health_fixture_t;

static void health_fill(health_fixture_t *f)
{
    memset(f, 0, sizeof(*f));
    epd__epoch__init(&f->epoch);
    f->epoch.start_time_ns = 111;
    f->epoch.nonce = 222;
    epd__worker_identity__init(&f->id);
    f->id.worker_id = "decode-7";
    f->id.role = EPD__ROLE__ROLE_DECODE;
    f->id.model = "tiny";
    f->id.epoch = &f->epoch;
    epd__kv_layout__init(&f->layout);
    f->layout.n_layers = 3;
    f->layout.layer_pattern = "LLA";
    f->layout.block_tokens = 16;
    f->layout.n_kv_heads = 2;
    f->layout.head_dim = 16;
    f->layout.dtype = EPD__KV_DTYPE__KV_DTYPE_F32;
    f->layout.block_bytes = 4096;
    f->layout.state_bytes = 2048;
    epd__capacity__init(&f->cap);
    f->cap.kv_blocks_total = 4096;
    f->cap.block_tokens = 16;
    f->cap.state_slots_total = 256;
    f->cap.max_batch = 32;
    f->cap.max_context = 1024;
    epd__load__init(&f->load);
    f->load.kv_blocks_free = 4000;
    f->load.running_requests = 3;
    epd__health_response__init(&f->h);
    f->h.serving = 1;
    f->h.worker = &f->id;
    f->h.load = &f->load;
    f->h.transport = "ucx";
    memset(f->addr, 0xab, sizeof(f->addr));
    f->h.data_plane_address.data = f->addr;
    f->h.data_plane_address.len = sizeof(f->addr);
    f->h.kv_layout = &f->layout;
    f->h.capacity = &f->cap;
}

static size_t health_pack(const Epd__HealthResponse *h, unsigned char *buf)
{
    return epd__health_response__pack(h, buf);
}

static void test_health_parse_ok(void **state)
{
    health_fixture_t f;
    epd_client_worker_info_t *info = epd_calloc(1, sizeof(*info));
    unsigned char buf[1024];
    size_t len;
    const char *why = NULL;

    (void)state;
    health_fill(&f);
    len = health_pack(&f.h, buf);
    assert_int_equal(epd_client_health_parse(buf, len, info, &why), EPD_OK);
    assert_string_equal(info->worker_id, "decode-7");
    assert_int_equal(info->role, EPD_CLIENT_ROLE_DECODE);
    assert_string_equal(info->model, "tiny");
    assert_int_equal(info->epoch_start_ns, 111);
    assert_int_equal(info->epoch_nonce, 222);
    assert_string_equal(info->transport, "ucx");
    assert_int_equal(info->address_len, 16);
    assert_memory_equal(info->address, f.addr, 16);
    assert_string_equal(info->layer_pattern, "LLA");
    assert_int_equal(info->block_tokens, 16);
    assert_int_equal(info->block_bytes, 4096);
    assert_int_equal(info->kv_blocks_total, 4096);
    assert_int_equal(info->max_context, 1024);
    assert_int_equal(info->kv_blocks_free, 4000);
    assert_int_equal(info->running_requests, 3);
    assert_int_equal(info->serving, 1);
    epd_free(info);
}

static void test_health_parse_refusals(void **state)
{
    health_fixture_t f;
    epd_client_worker_info_t *info = epd_calloc(1, sizeof(*info));
    unsigned char buf[1024];
    char long_id[300];
    size_t len;
    const char *why;

    (void)state;
    /* garbage */
    memset(buf, 0xff, 64);
    why = NULL;
    assert_int_equal(epd_client_health_parse(buf, 64, info, &why), EPD_ERR_MALFORMED);
    assert_non_null(why);
    /* empty answer: no identity */
    why = NULL;
    assert_int_equal(epd_client_health_parse(NULL, 0, info, &why), EPD_ERR_MALFORMED);
    assert_non_null(strstr(why, "identity"));
    /* no epoch */
    health_fill(&f);
    f.id.epoch = NULL;
    len = health_pack(&f.h, buf);
    assert_int_equal(epd_client_health_parse(buf, len, info, &why), EPD_ERR_MALFORMED);
    /* a tool is not a worker */
    health_fill(&f);
    f.id.role = EPD__ROLE__ROLE_TOOL;
    len = health_pack(&f.h, buf);
    assert_int_equal(epd_client_health_parse(buf, len, info, &why), EPD_ERR_MALFORMED);
    assert_non_null(strstr(why, "role"));
    /* no data-plane address */
    health_fill(&f);
    f.h.data_plane_address.len = 0;
    len = health_pack(&f.h, buf);
    assert_int_equal(epd_client_health_parse(buf, len, info, &why), EPD_ERR_MALFORMED);
    assert_non_null(strstr(why, "address"));
    /* oversized worker id */
    health_fill(&f);
    memset(long_id, 'x', sizeof(long_id) - 1);
    long_id[sizeof(long_id) - 1] = '\0';
    f.id.worker_id = long_id;
    len = health_pack(&f.h, buf);
    assert_int_equal(epd_client_health_parse(buf, len, info, &why), EPD_ERR_MALFORMED);
    /* no layout */
    health_fill(&f);
    f.h.kv_layout = NULL;
    len = health_pack(&f.h, buf);
    assert_int_equal(epd_client_health_parse(buf, len, info, &why), EPD_ERR_MALFORMED);
    /* every truncation of a valid answer is either refused or parsed: never a crash */
    health_fill(&f);
    len = health_pack(&f.h, buf);
    for (size_t cut = 0; cut < len; cut++) {
        epd_status_t s = epd_client_health_parse(buf, cut, info, &why);
        assert_true(s == EPD_OK || s == EPD_ERR_MALFORMED);
    }
    epd_free(info);
}

/* ------------------------------------------------ fake worker over UCX */

#define MAX_RX 160
#define MAX_EV 64

typedef struct {
    Epd__Envelope *env;
    epd_xport_ep_t *ep;
} rx_t;

typedef struct {
    epd_xport_t *x;
    rx_t rx[MAX_RX];
    int n_rx;
    uint64_t seq;
} fake_t;

typedef struct {
    epd_client_ev_kind_t kind;
    uint64_t id;
    int terminal;
    uint32_t index;
    uint32_t tokens[16];
    uint32_t n_tokens;
    int finish;
    epd_status_t status;
    char message[128];
    char from[64];
} ev_t;

typedef struct {
    fake_t fake;  /* plays the decode worker */
    fake_t pfake; /* plays the prefill worker */
    epd_client_t *client;
    epd_client_worker_t *pw;
    epd_client_worker_t *dw;
    epd_client_worker_info_t *pinfo;
    epd_client_worker_info_t *dinfo;
    ev_t ev[MAX_EV];
    int n_ev;
    uint32_t prompt[5];
} fx_t;

static void fake_on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    fake_t *f = arg;
    Epd__Envelope *env = NULL;

    assert_int_equal(epd_msg_decode(data, len, &env, NULL), EPD_OK);
    assert_true(f->n_rx < MAX_RX);
    f->rx[f->n_rx].env = env;
    f->rx[f->n_rx].ep = ep;
    f->n_rx++;
}

static void on_event(void *arg, const epd_client_event_t *e)
{
    fx_t *fx = arg;
    ev_t *ev;

    assert_true(fx->n_ev < MAX_EV);
    ev = &fx->ev[fx->n_ev++];
    memset(ev, 0, sizeof(*ev));
    ev->kind = e->kind;
    ev->id = e->request_id;
    ev->terminal = e->terminal;
    ev->index = e->index;
    ev->n_tokens = e->n_tokens < 16 ? e->n_tokens : 16;
    if (ev->n_tokens > 0) {
        memcpy(ev->tokens, e->tokens, ev->n_tokens * sizeof(uint32_t));
    }
    ev->finish = e->finish;
    ev->status = e->status;
    snprintf(ev->message, sizeof(ev->message), "%s", e->message);
    snprintf(ev->from, sizeof(ev->from), "%s", e->from);
}

static void pump(fx_t *fx, int ms)
{
    uint64_t end = epd_time_now_ns() + (uint64_t)ms * EPD_NSEC_PER_MSEC;

    while (epd_time_now_ns() < end) {
        epd_client_poll(fx->client, 0);
        epd_xport_progress(fx->fake.x);
        epd_xport_progress(fx->pfake.x);
    }
}

/* Pumps until the fake worker holds `n` messages (or fails after 3 s). */
static void pump_rx(fx_t *fx, int n)
{
    uint64_t end = epd_time_now_ns() + 3 * EPD_NSEC_PER_SEC;

    while (fx->fake.n_rx + fx->pfake.n_rx < n && epd_time_now_ns() < end) {
        epd_client_poll(fx->client, 0);
        epd_xport_progress(fx->fake.x);
        epd_xport_progress(fx->pfake.x);
    }
    assert_int_equal(fx->fake.n_rx + fx->pfake.n_rx, n);
}

static void pump_ev(fx_t *fx, int n, int ms)
{
    uint64_t end = epd_time_now_ns() + (uint64_t)ms * EPD_NSEC_PER_MSEC;

    while (fx->n_ev < n && epd_time_now_ns() < end) {
        epd_client_poll(fx->client, 0);
        epd_xport_progress(fx->fake.x);
        epd_xport_progress(fx->pfake.x);
    }
    assert_int_equal(fx->n_ev, n);
}

static void rx_clear(fake_t *f)
{
    for (int i = 0; i < f->n_rx; i++) {
        epd_msg_free(f->rx[i].env);
    }
    f->n_rx = 0;
}

/* Sends one envelope from the fake worker named (id, start, nonce). */
static void fake_send(fake_t *f, epd_xport_ep_t *ep, const char *id, uint64_t start, uint64_t nonce,
                      Epd__Envelope *env)
{
    Epd__Epoch ep_ = EPD__EPOCH__INIT;
    Epd__SenderRef s = EPD__SENDER_REF__INIT;
    unsigned char buf[4096];
    size_t len;

    ep_.start_time_ns = start;
    ep_.nonce = nonce;
    s.worker_id = (char *)id;
    s.epoch = &ep_;
    env->sender = &s;
    env->seq = ++f->seq;
    assert_int_equal(epd_msg_encode(env, buf, sizeof(buf), &len), EPD_OK);
    assert_int_equal(epd_xport_send(ep, buf, len, 0), EPD_OK);
}

static void send_chunk(fx_t *fx, epd_xport_ep_t *ep, uint64_t id, uint32_t index,
                       const uint32_t *toks, size_t n, int finish)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__TokenChunk tc = EPD__TOKEN_CHUNK__INIT;

    tc.request_id = id;
    tc.index = index;
    tc.tokens = (uint32_t *)toks;
    tc.n_tokens = n;
    tc.finish = finish;
    env.body_case = EPD__ENVELOPE__BODY_TOKENS;
    env.tokens = &tc;
    fake_send(&fx->fake, ep, fx->dinfo->worker_id, fx->dinfo->epoch_start_ns,
              fx->dinfo->epoch_nonce, &env);
}

static int setup(void **state)
{
    fx_t *fx = epd_calloc(1, sizeof(*fx));
    epd_xport_config_t xc;
    epd_client_config_t cc;
    const void *addr;
    size_t addr_len;

    epd_xport_config_init(&xc);
    xc.backend = "ucx";
    xc.peer_timeout_ms = 1000;
    xc.connect_timeout_ms = 1000;
    xc.msg_cb = fake_on_msg;
    xc.cb_arg = &fx->fake;
    assert_int_equal(epd_xport_create(&xc, &fx->fake.x), EPD_OK);
    xc.cb_arg = &fx->pfake;
    assert_int_equal(epd_xport_create(&xc, &fx->pfake.x), EPD_OK);

    epd_client_config_init(&cc);
    cc.worker_id = "test-client";
    cc.peer_timeout_ms = 1000;
    cc.connect_timeout_ms = 1000;
    cc.event_cb = on_event;
    cc.cb_arg = fx;
    assert_int_equal(epd_client_create(&cc, &fx->client), EPD_OK);

    fx->pinfo = epd_calloc(1, sizeof(*fx->pinfo));
    fx->dinfo = epd_calloc(1, sizeof(*fx->dinfo));
    snprintf(fx->pinfo->worker_id, sizeof(fx->pinfo->worker_id), "fake-prefill");
    fx->pinfo->role = EPD_CLIENT_ROLE_PREFILL;
    fx->pinfo->epoch_start_ns = 1000;
    fx->pinfo->epoch_nonce = 0x1111;
    assert_int_equal(epd_xport_address(fx->pfake.x, &addr, &addr_len), EPD_OK);
    memcpy(fx->pinfo->address, addr, addr_len);
    fx->pinfo->address_len = addr_len;
    *fx->dinfo = *fx->pinfo;
    assert_int_equal(epd_xport_address(fx->fake.x, &addr, &addr_len), EPD_OK);
    memcpy(fx->dinfo->address, addr, addr_len);
    fx->dinfo->address_len = addr_len;
    snprintf(fx->dinfo->worker_id, sizeof(fx->dinfo->worker_id), "fake-decode");
    fx->dinfo->role = EPD_CLIENT_ROLE_DECODE;
    fx->dinfo->epoch_start_ns = 2000;
    fx->dinfo->epoch_nonce = 0x2222;
    assert_int_equal(epd_client_add_worker_info(fx->client, fx->pinfo, &fx->pw), EPD_OK);
    assert_int_equal(epd_client_add_worker_info(fx->client, fx->dinfo, &fx->dw), EPD_OK);
    fx->prompt[0] = 256; /* BOS of the ref tokenizer */
    fx->prompt[1] = 'h';
    fx->prompt[2] = 'e';
    fx->prompt[3] = 'l';
    fx->prompt[4] = 'o';
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fx_t *fx = *state;

    rx_clear(&fx->fake);
    rx_clear(&fx->pfake);
    epd_client_destroy(fx->client);
    epd_xport_destroy(fx->fake.x);
    epd_xport_destroy(fx->pfake.x);
    epd_free(fx->pinfo);
    epd_free(fx->dinfo);
    epd_free(fx);
    return 0;
}

static uint64_t submit(fx_t *fx, uint32_t max_tokens, uint32_t deadline_ms)
{
    epd_client_request_t q;
    uint64_t id = 0;

    memset(&q, 0, sizeof(q));
    q.prompt = fx->prompt;
    q.n_prompt = 5;
    q.temperature = 0.8f;
    q.top_p = 0.9f;
    q.top_k = 7;
    q.seed = 42;
    q.max_tokens = max_tokens;
    q.prefill = fx->pw;
    q.decode = fx->dw;
    q.deadline_ms = deadline_ms;
    assert_int_equal(epd_client_submit(fx->client, &q, &id), EPD_OK);
    assert_int_not_equal(id, 0);
    return id;
}

/* The endpoint on which the decode (or prefill) fake got request `id`. */
static epd_xport_ep_t *ep_of(fx_t *fx, uint64_t id, int decode)
{
    fake_t *f = decode ? &fx->fake : &fx->pfake;

    for (int i = 0; i < f->n_rx; i++) {
        Epd__Envelope *env = f->rx[i].env;
        if (env->body_case == EPD__ENVELOPE__BODY_GENERATE && env->generate->request_id == id) {
            return f->rx[i].ep;
        }
    }
    fail_msg("no GenerateRequest for %llu", (unsigned long long)id);
    return NULL;
}

/* The i-th message the decode (or prefill) fake received. */
static Epd__Envelope *rx_at(fx_t *fx, int decode, int i)
{
    fake_t *f = decode ? &fx->fake : &fx->pfake;

    assert_true(i < f->n_rx);
    return f->rx[i].env;
}

static void test_generate_request_and_stream(void **state)
{
    fx_t *fx = *state;
    uint64_t id = submit(fx, 3, 5000);
    const uint32_t a[] = {65};
    const uint32_t bc[] = {66, 67};
    epd_xport_ep_t *dep;

    pump_rx(fx, 2);
    for (int i = 0; i < 2; i++) {
        Epd__Envelope *env = rx_at(fx, i, 0);
        Epd__GenerateRequest *g;

        assert_int_equal(env->body_case, EPD__ENVELOPE__BODY_GENERATE);
        g = env->generate;
        assert_string_equal(env->sender->worker_id, "test-client");
        assert_int_equal(g->request_id, id);
        assert_int_equal(g->n_prompt_tokens, 5);
        assert_memory_equal(g->prompt_tokens, fx->prompt, 5 * sizeof(uint32_t));
        assert_float_equal(g->sampling->temperature, 0.8f, 0);
        assert_float_equal(g->sampling->top_p, 0.9f, 0);
        assert_int_equal(g->sampling->top_k, 7);
        assert_int_equal(g->sampling->seed, 42);
        assert_int_equal(g->sampling->max_tokens, 3);
        assert_string_equal(g->prefill_worker_id, "fake-prefill");
        assert_string_equal(g->decode_worker_id, "fake-decode");
        assert_int_equal(g->prefill_epoch->start_time_ns, 1000);
        assert_int_equal(g->prefill_epoch->nonce, 0x1111);
        assert_int_equal(g->decode_epoch->start_time_ns, 2000);
        assert_int_equal(g->decode_epoch->nonce, 0x2222);
        assert_int_equal(g->decode_address.len, fx->dinfo->address_len);
        assert_int_equal(g->prefill_address.len, fx->pinfo->address_len);
        assert_int_equal(g->deadline_ms, 5000);
    }
    assert_int_equal(epd_client_live(fx->client), 1);
    dep = ep_of(fx, id, 1);
    send_chunk(fx, dep, id, 0, a, 1, EPD_CLIENT_FINISH_NONE);
    pump_ev(fx, 1, 3000);
    assert_int_equal(fx->ev[0].kind, EPD_CLIENT_EV_TOKENS);
    assert_int_equal(fx->ev[0].terminal, 0);
    assert_int_equal(fx->ev[0].index, 0);
    assert_int_equal(fx->ev[0].tokens[0], 65);
    send_chunk(fx, dep, id, 1, bc, 2, EPD_CLIENT_FINISH_LENGTH);
    pump_ev(fx, 2, 3000);
    assert_int_equal(fx->ev[1].terminal, 1);
    assert_int_equal(fx->ev[1].finish, EPD_CLIENT_FINISH_LENGTH);
    assert_int_equal(fx->ev[1].n_tokens, 2);
    assert_string_equal(fx->ev[1].from, "fake-decode");
    assert_int_equal(epd_client_live(fx->client), 0);
    /* after the end: silence, and the id is unknown */
    send_chunk(fx, dep, id, 3, a, 1, EPD_CLIENT_FINISH_LENGTH);
    pump(fx, 100);
    assert_int_equal(fx->n_ev, 2);
    assert_int_equal(epd_client_abort(fx->client, id), EPD_ERR_NOT_FOUND);
    {
        epd_client_stats_t st;
        epd_client_stats(fx->client, &st);
        assert_int_equal(st.unknown_ids, 1);
    }
}

static void test_out_of_order_chunk(void **state)
{
    fx_t *fx = *state;
    uint64_t id = submit(fx, 8, 5000);
    const uint32_t a[] = {65};

    pump_rx(fx, 2);
    send_chunk(fx, ep_of(fx, id, 1), id, 1, a, 1, EPD_CLIENT_FINISH_NONE);
    pump_ev(fx, 1, 3000);
    assert_int_equal(fx->ev[0].kind, EPD_CLIENT_EV_ERROR);
    assert_int_equal(fx->ev[0].terminal, 1);
    assert_int_equal(fx->ev[0].status, EPD_ERR_MALFORMED);
    assert_non_null(strstr(fx->ev[0].message, "out of order"));
    /* both workers are told to stop */
    pump_rx(fx, 4);
    assert_int_equal(rx_at(fx, 1, 1)->body_case, EPD__ENVELOPE__BODY_ABORT);
    assert_int_equal(rx_at(fx, 0, 1)->body_case, EPD__ENVELOPE__BODY_ABORT);
    assert_int_equal(rx_at(fx, 1, 1)->abort->request_id, id);
}

static void test_too_many_tokens(void **state)
{
    fx_t *fx = *state;
    uint64_t id = submit(fx, 2, 5000);
    const uint32_t abc[] = {65, 66, 67};

    pump_rx(fx, 2);
    send_chunk(fx, ep_of(fx, id, 1), id, 0, abc, 3, EPD_CLIENT_FINISH_LENGTH);
    pump_ev(fx, 1, 3000);
    assert_int_equal(fx->ev[0].kind, EPD_CLIENT_EV_ERROR);
    assert_int_equal(fx->ev[0].status, EPD_ERR_MALFORMED);
}

static void test_foreign_and_stale_senders_ignored(void **state)
{
    fx_t *fx = *state;
    uint64_t id = submit(fx, 4, 5000);
    const uint32_t a[] = {65};
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__TokenChunk tc = EPD__TOKEN_CHUNK__INIT;
    epd_xport_ep_t *dep;
    epd_client_stats_t st;
    unsigned char junk[100];

    pump_rx(fx, 2);
    dep = ep_of(fx, id, 1);
    tc.request_id = id;
    tc.tokens = (uint32_t *)a;
    tc.n_tokens = 1;
    tc.finish = EPD__FINISH_REASON__FINISH_STOP;
    env.body_case = EPD__ENVELOPE__BODY_TOKENS;
    env.tokens = &tc;
    /* the decode worker's previous incarnation */
    fake_send(&fx->fake, dep, "fake-decode", 1999, 0x2222, &env);
    /* some other worker */
    fake_send(&fx->fake, dep, "decode-other", 2000, 0x2222, &env);
    /* the prefill worker may not stream tokens */
    fake_send(&fx->fake, dep, "fake-prefill", 1000, 0x1111, &env);
    /* garbage and a truncated frame */
    memset(junk, 0x5a, sizeof(junk));
    assert_int_equal(epd_xport_send(dep, junk, sizeof(junk), 0), EPD_OK);
    {
        unsigned char buf[512];
        size_t len;
        Epd__Epoch e = EPD__EPOCH__INIT;
        Epd__SenderRef s = EPD__SENDER_REF__INIT;
        e.start_time_ns = 2000;
        e.nonce = 0x2222;
        s.worker_id = "fake-decode";
        s.epoch = &e;
        env.sender = &s;
        assert_int_equal(epd_msg_encode(&env, buf, sizeof(buf), &len), EPD_OK);
        assert_int_equal(epd_xport_send(dep, buf, len - 3, 0), EPD_OK);
    }
    pump(fx, 200);
    assert_int_equal(fx->n_ev, 0);
    epd_client_stats(fx->client, &st);
    assert_int_equal(st.foreign_sender, 2);
    assert_int_equal(st.unexpected, 1);
    assert_int_equal(st.bad_frames, 2);
    /* the real one still works */
    send_chunk(fx, dep, id, 0, a, 1, EPD_CLIENT_FINISH_STOP);
    pump_ev(fx, 1, 3000);
    assert_int_equal(fx->ev[0].terminal, 1);
    assert_int_equal(fx->ev[0].finish, EPD_CLIENT_FINISH_STOP);
}

static void test_error_from_prefill(void **state)
{
    fx_t *fx = *state;
    uint64_t id = submit(fx, 4, 5000);
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__Error er = EPD__ERROR__INIT;

    pump_rx(fx, 2);
    er.request_id = id;
    er.status = EPD_ERR_PEER_DEAD;
    er.message = "decode worker died";
    env.body_case = EPD__ENVELOPE__BODY_ERROR;
    env.error = &er;
    fake_send(&fx->pfake, ep_of(fx, id, 0), "fake-prefill", 1000, 0x1111, &env);
    pump_ev(fx, 1, 3000);
    assert_int_equal(fx->ev[0].kind, EPD_CLIENT_EV_ERROR);
    assert_int_equal(fx->ev[0].terminal, 1);
    assert_int_equal(fx->ev[0].status, EPD_ERR_PEER_DEAD);
    assert_string_equal(fx->ev[0].message, "decode worker died");
    assert_string_equal(fx->ev[0].from, "fake-prefill");
    /* decode (the other side) is told to stop; prefill is not */
    pump_rx(fx, 3);
    assert_int_equal(rx_at(fx, 1, 1)->body_case, EPD__ENVELOPE__BODY_ABORT);
    assert_int_equal(fx->pfake.n_rx, 1);
    /* a second error for the same request is not a second terminal event */
    fake_send(&fx->fake, ep_of(fx, id, 1), "fake-decode", 2000, 0x2222, &env);
    pump(fx, 100);
    assert_int_equal(fx->n_ev, 1);
}

static void test_refused(void **state)
{
    fx_t *fx = *state;
    uint64_t id = submit(fx, 4, 5000);
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__KvRefused rf = EPD__KV_REFUSED__INIT;

    pump_rx(fx, 2);
    rf.request_id = id;
    rf.status = EPD_ERR_NO_CAPACITY;
    rf.reason = "no free KV blocks";
    env.body_case = EPD__ENVELOPE__BODY_REFUSED;
    env.refused = &rf;
    fake_send(&fx->fake, ep_of(fx, id, 1), "fake-decode", 2000, 0x2222, &env);
    pump_ev(fx, 1, 3000);
    assert_int_equal(fx->ev[0].kind, EPD_CLIENT_EV_REFUSED);
    assert_int_equal(fx->ev[0].terminal, 1);
    assert_int_equal(fx->ev[0].status, EPD_ERR_NO_CAPACITY);
    assert_string_equal(fx->ev[0].message, "no free KV blocks");
}

static void test_deadline(void **state)
{
    fx_t *fx = *state;
    uint64_t id = submit(fx, 4, 150);
    uint64_t t0 = epd_time_now_ns();

    pump_ev(fx, 1, 2000);
    assert_true(epd_time_now_ns() - t0 >= 140 * EPD_NSEC_PER_MSEC);
    assert_int_equal(fx->ev[0].kind, EPD_CLIENT_EV_ERROR);
    assert_int_equal(fx->ev[0].id, id);
    assert_int_equal(fx->ev[0].status, EPD_ERR_TIMEOUT);
    pump_rx(fx, 4); /* 2 requests + 2 aborts */
    assert_int_equal(rx_at(fx, 1, 1)->body_case, EPD__ENVELOPE__BODY_ABORT);
    assert_int_equal(rx_at(fx, 1, 1)->abort->status, EPD_ERR_TIMEOUT);
    assert_int_equal(rx_at(fx, 0, 1)->body_case, EPD__ENVELOPE__BODY_ABORT);
    assert_int_equal(epd_client_live(fx->client), 0);
}

static void test_abort(void **state)
{
    fx_t *fx = *state;
    uint64_t id = submit(fx, 4, 5000);
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__Error er = EPD__ERROR__INIT;

    pump_rx(fx, 2);
    assert_int_equal(epd_client_abort(fx->client, id), EPD_OK);
    pump_rx(fx, 4);
    assert_int_equal(rx_at(fx, 1, 1)->body_case, EPD__ENVELOPE__BODY_ABORT);
    assert_int_equal(rx_at(fx, 0, 1)->body_case, EPD__ENVELOPE__BODY_ABORT);
    /* prefill's complaint after an abort is not the answer... */
    er.request_id = id;
    er.status = EPD_ERR_CANCELED;
    er.message = "aborted";
    env.body_case = EPD__ENVELOPE__BODY_ERROR;
    env.error = &er;
    fake_send(&fx->pfake, ep_of(fx, id, 0), "fake-prefill", 1000, 0x1111, &env);
    pump(fx, 100);
    assert_int_equal(fx->n_ev, 0);
    /* ...decode's final chunk is */
    send_chunk(fx, ep_of(fx, id, 1), id, 0, NULL, 0, EPD_CLIENT_FINISH_ABORT);
    pump_ev(fx, 1, 3000);
    assert_int_equal(fx->ev[0].kind, EPD_CLIENT_EV_TOKENS);
    assert_int_equal(fx->ev[0].terminal, 1);
    assert_int_equal(fx->ev[0].finish, EPD_CLIENT_FINISH_ABORT);
}

/* Sends an Error for request `id` from the fake decode worker. */
static void decode_error(fx_t *fx, uint64_t id, epd_status_t status, const char *message)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__Error er = EPD__ERROR__INIT;

    er.request_id = id;
    er.status = status;
    er.message = (char *)message;
    env.body_case = EPD__ENVELOPE__BODY_ERROR;
    env.error = &er;
    fake_send(&fx->fake, ep_of(fx, id, 1), "fake-decode", 2000, 0x2222, &env);
}

/* The storm race, client side: an aborted request ends as aborted however
 * the workers' answers cross the Abort — decode answering NOT_FOUND
 * because our Abort reached it after it had let the request go, or its
 * own failure on the way while we aborted — never as that status. */
static void test_abort_ends_as_aborted(void **state)
{
    fx_t *fx = *state;
    uint64_t a = submit(fx, 4, 5000);
    uint64_t b = submit(fx, 4, 5000);
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__Error er = EPD__ERROR__INIT;

    pump_rx(fx, 4);
    /* a: aborted; prefill says CANCELED (not the answer), then decode says
     * it does not know the request any more */
    assert_int_equal(epd_client_abort(fx->client, a), EPD_OK);
    pump_rx(fx, 6);
    er.request_id = a;
    er.status = EPD_ERR_CANCELED;
    er.message = "aborted";
    env.body_case = EPD__ENVELOPE__BODY_ERROR;
    env.error = &er;
    fake_send(&fx->pfake, ep_of(fx, a, 0), "fake-prefill", 1000, 0x1111, &env);
    pump(fx, 50);
    assert_int_equal(fx->n_ev, 0);
    decode_error(fx, a, EPD_ERR_NOT_FOUND, "unknown request id");
    pump_ev(fx, 1, 3000);
    assert_int_equal(fx->ev[0].id, a);
    assert_int_equal(fx->ev[0].kind, EPD_CLIENT_EV_ERROR);
    assert_int_equal(fx->ev[0].terminal, 1);
    assert_int_equal(fx->ev[0].status, EPD_ERR_CANCELED);
    assert_string_equal(fx->ev[0].message, "unknown request id");
    assert_string_equal(fx->ev[0].from, "fake-decode");
    /* b: decode's own failure is on its way when the caller aborts (the
     * client reads it only after the abort): still an abort */
    decode_error(fx, b, EPD_ERR_NOT_FOUND, "no such request of this client");
    assert_int_equal(epd_client_abort(fx->client, b), EPD_OK);
    pump_ev(fx, 2, 3000);
    assert_int_equal(fx->ev[1].id, b);
    assert_int_equal(fx->ev[1].kind, EPD_CLIENT_EV_ERROR);
    assert_int_equal(fx->ev[1].status, EPD_ERR_CANCELED);
    assert_string_equal(fx->ev[1].message, "no such request of this client");
    pump(fx, 100);
    assert_int_equal(fx->n_ev, 2);
    assert_int_equal(epd_client_live(fx->client), 0);
    /* a request nobody aborted still reports what its worker said */
    b = submit(fx, 4, 5000);
    pump_rx(fx, 10); /* 4 requests, 2 aborts each for a and b */
    decode_error(fx, b, EPD_ERR_NOT_FOUND, "unknown request id");
    pump_ev(fx, 3, 3000);
    assert_int_equal(fx->ev[2].status, EPD_ERR_NOT_FOUND);
}

static void test_many_requests_one_terminal_each(void **state)
{
    fx_t *fx = *state;
    uint64_t ids[40];
    int ends[40];

    for (int i = 0; i < 40; i++) {
        ids[i] = submit(fx, 2, 5000);
        for (int j = 0; j < i; j++) {
            assert_true(ids[j] != ids[i]);
        }
    }
    pump_rx(fx, 80);
    for (int i = 0; i < 40; i++) {
        const uint32_t t[] = {70, 71};
        epd_xport_ep_t *dep = ep_of(fx, ids[i], 1);
        if (i % 2 == 0) {
            send_chunk(fx, dep, ids[i], 0, t, 2, EPD_CLIENT_FINISH_LENGTH);
        } else {
            send_chunk(fx, dep, ids[i], 0, t, 1, EPD_CLIENT_FINISH_NONE);
            send_chunk(fx, dep, ids[i], 1, t + 1, 1, EPD_CLIENT_FINISH_LENGTH);
            /* a duplicate final chunk is ignored */
            send_chunk(fx, dep, ids[i], 1, t + 1, 1, EPD_CLIENT_FINISH_LENGTH);
        }
    }
    pump_ev(fx, 60, 5000);
    memset(ends, 0, sizeof(ends));
    for (int e = 0; e < fx->n_ev; e++) {
        for (int i = 0; i < 40; i++) {
            if (fx->ev[e].id == ids[i] && fx->ev[e].terminal) {
                ends[i]++;
            }
        }
    }
    for (int i = 0; i < 40; i++) {
        assert_int_equal(ends[i], 1);
    }
    assert_int_equal(epd_client_live(fx->client), 0);
}

static void test_worker_death(void **state)
{
    fx_t *fx = *state;
    uint64_t id = submit(fx, 4, 20000);
    epd_client_request_t q;
    uint64_t t0;

    pump_rx(fx, 2);
    rx_clear(&fx->fake);
    rx_clear(&fx->pfake);
    /* both fake workers vanish */
    epd_xport_destroy(fx->fake.x);
    epd_xport_destroy(fx->pfake.x);
    fx->fake.x = NULL;
    fx->pfake.x = NULL;
    t0 = epd_time_now_ns();
    while (fx->n_ev < 1 && epd_time_now_ns() - t0 < 5 * EPD_NSEC_PER_SEC) {
        epd_client_poll(fx->client, 10);
    }
    assert_int_equal(fx->n_ev, 1);
    assert_int_equal(fx->ev[0].id, id);
    assert_int_equal(fx->ev[0].kind, EPD_CLIENT_EV_ERROR);
    assert_int_equal(fx->ev[0].status, EPD_ERR_PEER_DEAD);
    assert_true(epd_client_worker_state(fx->dw) != EPD_OK ||
                epd_client_worker_state(fx->pw) != EPD_OK);
    /* wait for both endpoints to be declared dead, then submit is refused */
    while (
        (epd_client_worker_state(fx->dw) == EPD_OK || epd_client_worker_state(fx->pw) == EPD_OK) &&
        epd_time_now_ns() - t0 < 5 * EPD_NSEC_PER_SEC) {
        epd_client_poll(fx->client, 10);
    }
    memset(&q, 0, sizeof(q));
    q.prompt = fx->prompt;
    q.n_prompt = 5;
    q.max_tokens = 1;
    q.top_p = 1;
    q.prefill = fx->pw;
    q.decode = fx->dw;
    q.deadline_ms = 100;
    assert_true(epd_client_submit(fx->client, &q, NULL) != EPD_OK);
    /* the fixture's teardown must not destroy it again */
    {
        epd_xport_config_t xc;
        epd_xport_config_init(&xc);
        xc.msg_cb = fake_on_msg;
        xc.cb_arg = &fx->fake;
        assert_int_equal(epd_xport_create(&xc, &fx->fake.x), EPD_OK);
        xc.cb_arg = &fx->pfake;
        assert_int_equal(epd_xport_create(&xc, &fx->pfake.x), EPD_OK);
    }
}

static void test_submit_refusals(void **state)
{
    fx_t *fx = *state;
    epd_client_request_t q;

    memset(&q, 0, sizeof(q));
    q.prompt = fx->prompt;
    q.n_prompt = 5;
    q.max_tokens = 4;
    q.top_p = 1;
    q.prefill = fx->pw;
    q.decode = fx->dw;
    q.deadline_ms = 1000;
    q.n_prompt = 0;
    assert_int_equal(epd_client_submit(fx->client, &q, NULL), EPD_ERR_INVALID_PARAM);
    q.n_prompt = 5;
    q.max_tokens = 0;
    assert_int_equal(epd_client_submit(fx->client, &q, NULL), EPD_ERR_INVALID_PARAM);
    q.max_tokens = 4;
    q.prefill = fx->dw; /* roles swapped */
    q.decode = fx->pw;
    assert_int_equal(epd_client_submit(fx->client, &q, NULL), EPD_ERR_INVALID_PARAM);
    q.prefill = fx->pw;
    q.decode = fx->dw;
    q.deadline_ms = 0;
    assert_int_equal(epd_client_submit(fx->client, &q, NULL), EPD_ERR_INVALID_PARAM);
    /* a prompt that does not fit in one message */
    {
        uint32_t *big = epd_calloc(40000, sizeof(uint32_t));
        for (int i = 0; i < 40000; i++) {
            big[i] = 200;
        }
        q.deadline_ms = 1000;
        q.prompt = big;
        q.n_prompt = 40000;
        assert_int_equal(epd_client_submit(fx->client, &q, NULL), EPD_ERR_TOO_LONG);
        epd_free(big);
    }
    assert_int_equal(epd_client_live(fx->client), 0);
    pump(fx, 50);
    assert_int_equal(fx->fake.n_rx + fx->pfake.n_rx, 0);
    assert_int_equal(fx->n_ev, 0);
}

/* The client driven from a libuv loop, as the router will drive it: the
 * xports progress through epd_xport_uv, deadlines through a timer calling
 * epd_client_tick; nothing calls epd_client_poll. */
typedef struct {
    fx_t *fx;
    uv_timer_t tick;
    uv_timer_t guard;
    uint64_t answered;
    int stop;
} uvfx_t;

static void uv_on_tick(uv_timer_t *t)
{
    uvfx_t *u = t->data;
    fx_t *fx = u->fx;

    epd_client_tick(fx->client);
    /* the fake decode answers the first request once it has it */
    if (u->answered == 0 && fx->fake.n_rx >= 1) {
        const uint32_t a[] = {65, 66};
        Epd__Envelope *env = fx->fake.rx[0].env;

        u->answered = env->generate->request_id;
        send_chunk(fx, fx->fake.rx[0].ep, u->answered, 0, a, 2, EPD_CLIENT_FINISH_LENGTH);
    }
    if (fx->n_ev >= 2 || u->stop) {
        uv_timer_stop(&u->tick);
        uv_timer_stop(&u->guard);
    }
}

static void uv_on_guard(uv_timer_t *t)
{
    uvfx_t *u = t->data;

    u->stop = 1;
}

static void test_client_on_uv_loop(void **state)
{
    fx_t *fx = *state;
    uv_loop_t loop;
    uvfx_t u;
    epd_xport_uv_t *cu = NULL, *du = NULL, *pu = NULL;
    uint64_t first;
    uint64_t second;

    memset(&u, 0, sizeof(u));
    u.fx = fx;
    assert_int_equal(uv_loop_init(&loop), 0);
    assert_int_equal(epd_xport_uv_start(&loop, epd_client_xport(fx->client), 20, &cu), EPD_OK);
    assert_int_equal(epd_xport_uv_start(&loop, fx->fake.x, 20, &du), EPD_OK);
    assert_int_equal(epd_xport_uv_start(&loop, fx->pfake.x, 20, &pu), EPD_OK);
    first = submit(fx, 2, 5000);
    second = submit(fx, 2, 300); /* nobody answers: the deadline ends it */
    uv_timer_init(&loop, &u.tick);
    uv_timer_init(&loop, &u.guard);
    u.tick.data = &u;
    u.guard.data = &u;
    uv_timer_start(&u.tick, uv_on_tick, 10, 10);
    uv_timer_start(&u.guard, uv_on_guard, 5000, 0);
    while (!u.stop && fx->n_ev < 2) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    uv_timer_stop(&u.tick);
    uv_timer_stop(&u.guard);
    uv_close((uv_handle_t *)&u.tick, NULL);
    uv_close((uv_handle_t *)&u.guard, NULL);
    epd_xport_uv_stop(cu);
    epd_xport_uv_stop(du);
    epd_xport_uv_stop(pu);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);

    assert_int_equal(fx->n_ev, 2);
    assert_int_equal(u.answered, first);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(fx->ev[i].terminal, 1);
        if (fx->ev[i].id == first) {
            assert_int_equal(fx->ev[i].kind, EPD_CLIENT_EV_TOKENS);
            assert_int_equal(fx->ev[i].finish, EPD_CLIENT_FINISH_LENGTH);
        } else {
            assert_int_equal(fx->ev[i].id, second);
            assert_int_equal(fx->ev[i].kind, EPD_CLIENT_EV_ERROR);
            assert_int_equal(fx->ev[i].status, EPD_ERR_TIMEOUT);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health_parse_ok),
        cmocka_unit_test(test_health_parse_refusals),
        cmocka_unit_test_setup_teardown(test_generate_request_and_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_order_chunk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_too_many_tokens, setup, teardown),
        cmocka_unit_test_setup_teardown(test_foreign_and_stale_senders_ignored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_from_prefill, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deadline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_ends_as_aborted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_requests_one_terminal_each, setup, teardown),
        cmocka_unit_test_setup_teardown(test_submit_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_on_uv_loop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_worker_death, setup, teardown),
    };

    setenv("UCX_TLS", "posix,cma,tcp", 0);
    setenv("UCX_NET_DEVICES", "lo", 0);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
