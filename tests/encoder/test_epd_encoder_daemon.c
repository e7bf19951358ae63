/*
 * Tests of build/bin/epd-encoder as a whole, driven over its real transport
 * by a fake client and a fake prefill worker living in this process (two
 * epd_xport instances on loopback UCX, or libfabric with
 * EPD_ENCODER_TEST_BACKEND=ofi), over its gRPC control plane, and through
 * a fake router (an epd_rpc server on its own thread) it registers with.
 * What the daemon must do (proto/README.md rules 13–20), one test each:
 *
 *   - an image (PNG, JPEG) with its reservation after, before, or long
 *     after the embeddings are ready: one write into exactly the reserved
 *     bytes of the fake prefill's registered region, equal to what
 *     epd_engine_encode_image computes here for the same file with the same
 *     model, then EmbedComplete fenced behind it (the bytes are already
 *     there when it arrives) with the dimensions and the xxh3 checksum;
 *   - several images at once, reservations in mixed order, one image of
 *     ~200 KB (a message of many transport fragments); the daemon posts one
 *     write at a time (--max-inflight-writes 1), so writes posted back to
 *     back usually meet backpressure;
 *   - a corrupt image, a non-image, a PNG header declaring 60000 x 60000:
 *     Error EPD_ERR_MALFORMED / UNSUPPORTED / TOO_LONG to the client and to
 *     the prefill worker (then WritesQuiesced), nothing written;
 *   - a content hash of other bytes: Error EPD_ERR_INVALID_PARAM to the
 *     client and the prefill worker (it is checked on the compute thread);
 *     a short hash, a stale encoder epoch, no prefill named, a media index
 *     past 8, an empty image, bytes over the limit, a duplicate, no free
 *     slot: each its Error to the client;
 *   - frames that do not decode (junk, truncated, corrupted) are dropped,
 *     a message kind an encoder does not take gets EPD_ERR_UNSUPPORTED;
 *   - a reservation of the wrong size, one outside its region, a garbage
 *     key: Error to client and prefill, WritesQuiesced, nothing written;
 *   - Abort before the reservation: WritesQuiesced, nothing written, a late
 *     reservation refused, the id refused afterwards; an Abort for an id
 *     never seen: WritesQuiesced;
 *   - lease expiry and the request's deadline: Error EPD_ERR_TIMEOUT;
 *   - the prefill worker dies: the client gets EPD_ERR_PEER_DEAD; a message
 *     from an older epoch of a known prefill worker: EPD_ERR_STALE_EPOCH;
 *   - Health (role ENCODER, capacity, data-plane address), Status, Drain
 *     (refusals EPD_ERR_DRAINING), registration with the router (role,
 *     capacity, heartbeats), SIGTERM exits 0 and the trace has every span.
 * Each test ends with the daemon idle (nothing queued, nothing running).
 * No timing thresholds: every wait is for an event, with a generous bound.
 */
#include "epd_test.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "epd_alloc.h"
#include "epd_hash.h"
#include "epd_image.h"
#include "epd_msg.h"
#include "epd_rng.h"
#include "epd_rpc.h"
#include "epd_test_engine_util.h"
#include "epd_time.h"
#include "epd_xport.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#define STBI_WRITE_NO_STDIO
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
/* stbiw__jpg_writeBits shifts a signed int into its sign bit for some bit
 * patterns (stb_image_write 1.16): UBSan would stop the test in the test's
 * own JPEG maker, which is not code under test. */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((no_sanitize("undefined"))), apply_to = function)
#endif
#include <stb/stb_image_write.h>
#if defined(__clang__)
#pragma clang attribute pop
#endif
#pragma GCC diagnostic pop

/* UCX and libfabric keep process-wide allocations until exit (not epd's). */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libucs.so\nleak:libucp.so\nleak:libuct.so\nleak:libucm.so\n"
           "leak:libfabric.so\nleak:librdmacm.so\nleak:libibverbs.so\n";
}

#define E_SLOTS 4 /* the daemon's --slots */
#define P_SLOTS 8 /* slots of the fake prefill's region */
#define LEASE_MS 1500
#define MAX_IMAGE 300000 /* the daemon's --max-image-bytes */
#define WAIT_MS 15000
#define P_ID "fake-prefill"
#define P_START 111u

typedef struct msg {
    Epd__Envelope *env;
    unsigned char *region; /* EmbedComplete: the whole region when it arrived */
    struct msg *next;
} msg_t;

typedef struct {
    const char *name;
    epd_xport_t *x;
    epd_xport_ep_t *to_e; /* our connection to the encoder daemon */
    msg_t *head;
    int failed_eps;
    epd_xport_mr_t *region; /* prefill sides: [P_SLOTS][slot_bytes] */
} side_t;

/* ------------------------------------------------------------ fake router */

typedef struct {
    uv_loop_t loop;
    uv_async_t stop;
    epd_rpc_server_t *server;
    pthread_t thread;
    int port;
    atomic_int ready;
    pthread_mutex_t mu;
    int n_register, n_heartbeat;
    int role, embed_slots, image_embeddings, embed_dim, has_layout;
    char worker_id[128], transport[16];
    size_t addr_len;
} router_t;

typedef struct {
    const char *dir;
    const char *model;
    char ready[1024];
    char trace[1024];
    pid_t pid;
    char control[256];
    epd_rpc_client_t *rpc;
    Epd__HealthResponse *health;
    epd_engine_t *engine; /* the in-process reference */
    const epd_engine_info_t *info;
    size_t slot_bytes;
    side_t client, prefill;
    unsigned char rkey[EPD_XPORT_RKEY_MAX];
    size_t rkey_len;
    unsigned char *shadow; /* what the prefill region must hold */
    uint64_t next_id;
    uint64_t p_nonce; /* the fake prefill's epoch is {P_START, this} */
    router_t router;
} world_t;

static world_t *w;

/* EPD_ENCODER_TEST_BACKEND=ofi runs everything over libfabric instead. */
static const char *backend(void)
{
    const char *b = getenv("EPD_ENCODER_TEST_BACKEND");

    return b != NULL && b[0] != '\0' ? b : "ucx";
}

static int router_pack(const ProtobufCMessage *m, void **resp_p, size_t *resp_len_p)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    void *buf = epd_malloc(n > 0 ? n : 1);

    protobuf_c_message_pack(m, buf);
    *resp_p = buf;
    *resp_len_p = n;
    return EPD_RPC_OK;
}

static int router_handler(void *arg, const char *method, const void *req, size_t req_len,
                          void **resp_p, size_t *resp_len_p, char *err, size_t err_cap)
{
    router_t *r = arg;
    ProtobufCMessage *m = NULL;

    if (strcmp(method, EPD_RPC_REGISTER) == 0) {
        Epd__RegisterResponse a = EPD__REGISTER_RESPONSE__INIT;
        Epd__RegisterRequest *q;

        if (epd_proto_unpack(&epd__register_request__descriptor, req, req_len, &m) != EPD_OK) {
            snprintf(err, err_cap, "malformed");
            return EPD_RPC_INVALID_ARGUMENT;
        }
        q = (Epd__RegisterRequest *)m;
        pthread_mutex_lock(&r->mu);
        r->n_register++;
        if (q->worker != NULL) {
            r->role = q->worker->role;
            snprintf(r->worker_id, sizeof(r->worker_id), "%s",
                     q->worker->worker_id != NULL ? q->worker->worker_id : "");
        }
        if (q->capacity != NULL) {
            r->embed_slots = (int)q->capacity->embed_slots;
            r->image_embeddings = (int)q->capacity->image_embeddings;
            r->embed_dim = (int)q->capacity->embed_dim;
        }
        r->has_layout = q->kv_layout != NULL;
        snprintf(r->transport, sizeof(r->transport), "%s",
                 q->transport != NULL ? q->transport : "");
        r->addr_len = q->data_plane_address.len;
        pthread_mutex_unlock(&r->mu);
        epd_proto_free(m);
        a.accepted = 1;
        a.heartbeat_interval_ms = 50;
        return router_pack(&a.base, resp_p, resp_len_p);
    }
    if (strcmp(method, EPD_RPC_HEARTBEAT) == 0) {
        Epd__HeartbeatResponse a = EPD__HEARTBEAT_RESPONSE__INIT;

        if (epd_proto_unpack(&epd__heartbeat_request__descriptor, req, req_len, &m) != EPD_OK) {
            snprintf(err, err_cap, "malformed");
            return EPD_RPC_INVALID_ARGUMENT;
        }
        pthread_mutex_lock(&r->mu);
        if (((Epd__HeartbeatRequest *)m)->load != NULL) {
            r->n_heartbeat++;
        }
        pthread_mutex_unlock(&r->mu);
        epd_proto_free(m);
        a.known = 1;
        return router_pack(&a.base, resp_p, resp_len_p);
    }
    snprintf(err, err_cap, "unknown method %s", method);
    return EPD_RPC_UNIMPLEMENTED;
}

static void router_on_stop(uv_async_t *a)
{
    router_t *r = a->data;

    epd_rpc_server_destroy(r->server);
    r->server = NULL;
    uv_close((uv_handle_t *)&r->stop, NULL);
}

static void *router_thread(void *arg)
{
    router_t *r = arg;

    if (uv_loop_init(&r->loop) != 0 || uv_async_init(&r->loop, &r->stop, router_on_stop) != 0) {
        atomic_store(&r->ready, -1);
        return NULL;
    }
    r->stop.data = r;
    if (epd_rpc_server_create(&r->loop, "127.0.0.1:0", router_handler, r, &r->server) != EPD_OK) {
        uv_close((uv_handle_t *)&r->stop, NULL);
        uv_run(&r->loop, UV_RUN_DEFAULT);
        uv_loop_close(&r->loop);
        atomic_store(&r->ready, -1);
        return NULL;
    }
    r->port = epd_rpc_server_port(r->server);
    atomic_store(&r->ready, 1);
    uv_run(&r->loop, UV_RUN_DEFAULT);
    uv_loop_close(&r->loop);
    return NULL;
}

static void router_start(router_t *r)
{
    pthread_mutex_init(&r->mu, NULL);
    atomic_init(&r->ready, 0);
    assert_int_equal(pthread_create(&r->thread, NULL, router_thread, r), 0);
    while (atomic_load(&r->ready) == 0) {
        epd_time_sleep_ns(EPD_NSEC_PER_MSEC);
    }
    assert_int_equal(atomic_load(&r->ready), 1);
}

static void router_stop(router_t *r)
{
    uv_async_send(&r->stop);
    pthread_join(r->thread, NULL);
    pthread_mutex_destroy(&r->mu);
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
    if (env->body_case == EPD__ENVELOPE__BODY_EMBED_COMPLETE && s->region != NULL) {
        /* what the region holds the moment the fenced notice arrives */
        m->region = epd_malloc(epd_xport_mr_size(s->region));
        memcpy(m->region, epd_xport_mr_addr(s->region), epd_xport_mr_size(s->region));
    }
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

static void side_init(side_t *s, const char *name, int with_region)
{
    epd_xport_config_t cfg;

    memset(s, 0, sizeof(*s));
    s->name = name;
    epd_xport_config_init(&cfg);
    cfg.backend = backend();
    cfg.max_msg_size = 1u << 20; /* images travel in EncodeRequests */
    cfg.peer_timeout_ms = 3000;
    cfg.connect_timeout_ms = 3000;
    cfg.msg_cb = on_msg;
    cfg.err_cb = on_err;
    cfg.cb_arg = s;
    assert_int_equal(epd_xport_create(&cfg, &s->x), EPD_OK);
    assert_int_equal(epd_xport_connect(s->x, w->health->data_plane_address.data,
                                       w->health->data_plane_address.len, NULL, NULL, &s->to_e),
                     EPD_INPROGRESS);
    if (with_region) {
        assert_int_equal(epd_xport_mr_alloc(s->x, P_SLOTS * w->slot_bytes, &s->region), EPD_OK);
    }
}

static void msg_free(msg_t *m)
{
    epd_msg_free(m->env);
    epd_free(m->region);
    epd_free(m);
}

static void side_drop_msgs(side_t *s)
{
    while (s->head != NULL) {
        msg_t *m = s->head;

        s->head = m->next;
        msg_free(m);
    }
}

static void side_destroy(side_t *s)
{
    side_drop_msgs(s);
    epd_xport_mr_dereg(s->region);
    s->region = NULL;
    epd_xport_destroy(s->x);
    s->x = NULL;
}

static void pump(int ms)
{
    uint64_t end = epd_time_now_ns() + (uint64_t)ms * EPD_NSEC_PER_MSEC;

    do {
        if (w->client.x != NULL) {
            epd_xport_poll(w->client.x, 0);
        }
        if (w->prefill.x != NULL) {
            epd_xport_poll(w->prefill.x, 0);
        }
        epd_time_sleep_ns(200 * EPD_NSEC_PER_USEC);
    } while (epd_time_now_ns() < end);
}

/* The first message of `body_case` for `id` (an EmbedComplete: of media
 * `media`, unless UINT32_MAX) on side s (taken), or NULL after timeout_ms. */
static msg_t *expect_msg_media(side_t *s, Epd__Envelope__BodyCase body_case, uint64_t id,
                               uint32_t media, int timeout_ms)
{
    uint64_t end = epd_time_now_ns() + (uint64_t)timeout_ms * EPD_NSEC_PER_MSEC;

    for (;;) {
        for (msg_t **pp = &s->head; *pp != NULL; pp = &(*pp)->next) {
            msg_t *m = *pp;

            if (m->env->body_case == body_case && epd_msg_request_id(m->env) == id &&
                (media == UINT32_MAX || body_case != EPD__ENVELOPE__BODY_EMBED_COMPLETE ||
                 m->env->embed_complete->media_index == media)) {
                *pp = m->next;
                m->next = NULL;
                return m;
            }
        }
        if (epd_time_now_ns() >= end) {
            return NULL;
        }
        pump(1);
    }
}

static msg_t *expect_msg(side_t *s, Epd__Envelope__BodyCase body_case, uint64_t id, int timeout_ms)
{
    return expect_msg_media(s, body_case, id, UINT32_MAX, timeout_ms);
}

/* An Error of `status` for `id` on side s; returns its message (static
 * copy) for checks of the text. */
static const char *expect_error(side_t *s, uint64_t id, epd_status_t status)
{
    static char text[256];
    msg_t *m = expect_msg(s, EPD__ENVELOPE__BODY_ERROR, id, WAIT_MS);

    if (m == NULL) {
        fail_msg("%s: no Error for request %llu (want %s)", s->name, (unsigned long long)id,
                 epd_status_name(status));
    }
    if (m->env->error->status != (int32_t)status) {
        fail_msg("%s: request %llu: Error %s (%s), want %s", s->name, (unsigned long long)id,
                 epd_status_name((epd_status_t)m->env->error->status), m->env->error->message,
                 epd_status_name(status));
    }
    snprintf(text, sizeof(text), "%s",
             m->env->error->message != NULL ? m->env->error->message : "");
    print_message("  %s got %s: %s\n", s->name, epd_status_name(status), text);
    msg_free(m);
    return text;
}

static void expect_quiesced(uint64_t id)
{
    msg_t *m = expect_msg(&w->prefill, EPD__ENVELOPE__BODY_QUIESCED, id, WAIT_MS);

    if (m == NULL) {
        fail_msg("prefill: no WritesQuiesced for request %llu", (unsigned long long)id);
    }
    msg_free(m);
}

/* Sends env on s's endpoint as `as` (a side's name and epoch; may be
 * another side, to play a client and a prefill worker sharing one
 * endpoint), with sender_epoch instead when not NULL. */
static void send_env_as(side_t *s, const side_t *as, Epd__Envelope *env,
                        const Epd__Epoch *sender_epoch)
{
    Epd__SenderRef sender = EPD__SENDER_REF__INIT;
    Epd__Epoch epoch = EPD__EPOCH__INIT;
    unsigned char *buf;
    size_t cap, len;

    if (sender_epoch != NULL) {
        epoch = *sender_epoch;
    } else {
        epoch.start_time_ns = as == &w->client ? 333 : P_START;
        epoch.nonce = as == &w->client ? 444 : w->p_nonce;
    }
    sender.worker_id = (char *)as->name;
    sender.epoch = &epoch;
    env->sender = &sender;
    env->seq = 1;
    cap = epd_msg_encoded_size(env);
    buf = epd_malloc(cap);
    assert_non_null(buf);
    assert_int_equal(epd_msg_encode(env, buf, cap, &len), EPD_OK);
    assert_int_equal(epd_xport_send(s->to_e, buf, len, 0), EPD_OK);
    epd_free(buf);
}

static void send_env(side_t *s, Epd__Envelope *env, const Epd__Epoch *sender_epoch)
{
    send_env_as(s, s, env, sender_epoch);
}

/* --------------------------------------------------------------- images */

typedef struct {
    unsigned char *data;
    size_t len, cap;
} blob_t;

static void blob_put(void *ctx, void *data, int size)
{
    blob_t *b = ctx;

    if (size <= 0) {
        return;
    }
    if (b->len + (size_t)size > b->cap) {
        b->cap = (b->len + (size_t)size) * 2 + 64;
        b->data = realloc(b->data, b->cap);
        assert_non_null(b->data);
    }
    memcpy(b->data + b->len, data, (size_t)size);
    b->len += (size_t)size;
}

/* w x h RGB: smooth gradients with edges (seed shifts them), or noise. */
static unsigned char *make_pixels(int pw, int ph, int seed, int noise)
{
    unsigned char *px = malloc((size_t)pw * ph * 3);
    epd_rng_t rng;

    assert_non_null(px);
    epd_rng_seed(&rng, (uint64_t)seed);
    for (int y = 0; y < ph; y++) {
        for (int x = 0; x < pw; x++) {
            for (int c = 0; c < 3; c++) {
                int v = noise ? (int)(epd_rng_next(&rng) & 0xff)
                              : ((x * 255 / pw) * (c + 1) + (y * 255 / ph) * (3 - c) + seed * 37 +
                                 ((x / 5 + y / 7) % 2) * 60) /
                                    4;

                px[((size_t)y * pw + x) * 3 + c] = (unsigned char)(v & 0xff);
            }
        }
    }
    return px;
}

static blob_t make_png(int pw, int ph, int seed, int noise)
{
    unsigned char *px = make_pixels(pw, ph, seed, noise);
    blob_t b = {0};

    assert_true(stbi_write_png_to_func(blob_put, &b, pw, ph, 3, px, pw * 3) != 0);
    free(px);
    return b;
}

static blob_t make_jpeg(int pw, int ph, int seed)
{
    unsigned char *px = make_pixels(pw, ph, seed, 0);
    blob_t b = {0};

    assert_true(stbi_write_jpg_to_func(blob_put, &b, pw, ph, 3, px, 90) != 0);
    free(px);
    return b;
}

static blob_t blob_of(const void *data, size_t len)
{
    blob_t b = {0};

    blob_put(&b, (void *)data, (int)len);
    return b;
}

static uint32_t crc32_of(const unsigned char *p, size_t n)
{
    uint32_t c = 0xffffffffu;

    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) {
            c = c & 1 ? (c >> 1) ^ 0xedb88320u : c >> 1;
        }
    }
    return c ^ 0xffffffffu;
}

static void put_be32(blob_t *b, uint32_t v)
{
    unsigned char x[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 8), (unsigned char)v};

    blob_put(b, x, 4);
}

static void png_chunk(blob_t *b, const char *type, const unsigned char *data, size_t n)
{
    size_t at;

    put_be32(b, (uint32_t)n);
    at = b->len;
    blob_put(b, (void *)type, 4);
    if (n > 0) {
        blob_put(b, (void *)data, (int)n);
    }
    put_be32(b, crc32_of(b->data + at, 4 + n));
}

/* A valid-looking PNG of a few dozen bytes whose header declares w x h. */
static blob_t bomb_png(uint32_t pw, uint32_t ph)
{
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
    static const unsigned char idat[] = {0x78, 0x01, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01};
    unsigned char ihdr[13] = {(unsigned char)(pw >> 24),
                              (unsigned char)(pw >> 16),
                              (unsigned char)(pw >> 8),
                              (unsigned char)pw,
                              (unsigned char)(ph >> 24),
                              (unsigned char)(ph >> 16),
                              (unsigned char)(ph >> 8),
                              (unsigned char)ph,
                              8,
                              2,
                              0,
                              0,
                              0};
    blob_t b = {0};

    blob_put(&b, (void *)sig, 8);
    png_chunk(&b, "IHDR", ihdr, sizeof(ihdr));
    png_chunk(&b, "IDAT", idat, sizeof(idat));
    png_chunk(&b, "IEND", NULL, 0);
    return b;
}

/* What the colocated path computes for this file: epd_image_decode +
 * epd_engine_encode_image in this process, same model. */
static float *reference_embeddings(const blob_t *img)
{
    float *out = epd_malloc(w->slot_bytes);
    epd_image_view_t view;
    epd_image_t im;

    assert_non_null(out);
    assert_int_equal(epd_image_decode(img->data, img->len, 0, &im), EPD_OK);
    view = epd_image_view(&im);
    assert_int_equal(epd_engine_encode_image(w->engine, &view, out), EPD_OK);
    epd_image_cleanup(&im);
    return out;
}

/* ------------------------------------------------------------- requests */

typedef struct {
    uint64_t id;
    uint32_t media;
    blob_t img;
    unsigned char hash[EPD_CONTENT_HASH_BYTES];
    size_t hash_len;
    const Epd__Epoch *encoder_epoch; /* NULL: the daemon's */
    int no_prefill;
    uint64_t deadline_ms;
    uint32_t slot; /* where the fake prefill reserves it */
} enc_t;

static void enc_make(enc_t *e, blob_t img, uint32_t slot)
{
    memset(e, 0, sizeof(*e));
    e->id = ((uint64_t)0xE5 << 40) + ++w->next_id;
    e->img = img;
    epd_content_hash(img.data, img.len, e->hash);
    e->hash_len = sizeof(e->hash);
    e->slot = slot;
}

static void enc_cleanup(enc_t *e)
{
    free(e->img.data);
    e->img.data = NULL;
}

static void send_encode(const enc_t *e)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__EncodeRequest r = EPD__ENCODE_REQUEST__INIT;
    Epd__Epoch p_epoch = EPD__EPOCH__INIT;
    const void *addr;
    size_t addr_len;

    assert_int_equal(epd_xport_address(w->prefill.x, &addr, &addr_len), EPD_OK);
    p_epoch.start_time_ns = P_START;
    p_epoch.nonce = w->p_nonce;
    r.request_id = e->id;
    r.media_index = e->media;
    r.image.data = e->img.data;
    r.image.len = e->img.len;
    r.content_hash.data = (uint8_t *)e->hash;
    r.content_hash.len = e->hash_len;
    if (!e->no_prefill) {
        r.prefill_worker_id = (char *)P_ID;
        r.prefill_address.data = (uint8_t *)addr;
        r.prefill_address.len = addr_len;
        r.prefill_epoch = &p_epoch;
    }
    r.encoder_epoch =
        (Epd__Epoch *)(e->encoder_epoch != NULL ? e->encoder_epoch : w->health->worker->epoch);
    r.deadline_ms = e->deadline_ms;
    env.body_case = EPD__ENVELOPE__BODY_ENCODE;
    env.encode = &r;
    send_env(&w->client, &env, NULL);
}

/* A reservation of e's slot; `tweak` may spoil it before it is sent. */
static void send_reservation(const enc_t *e, void (*tweak)(Epd__EmbedReservation *))
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__EmbedReservation r = EPD__EMBED_RESERVATION__INIT;

    r.request_id = e->id;
    r.media_index = e->media;
    r.rkey.data = w->rkey;
    r.rkey.len = w->rkey_len;
    r.region_size = epd_xport_mr_size(w->prefill.region);
    r.offset = (uint64_t)e->slot * w->slot_bytes;
    r.bytes = w->slot_bytes;
    r.lease_ms = LEASE_MS;
    if (tweak != NULL) {
        tweak(&r);
    }
    env.body_case = EPD__ENVELOPE__BODY_EMBED_RESERVATION;
    env.embed_reservation = &r;
    send_env(&w->prefill, &env, NULL);
}

/* An Abort from `as` on s's endpoint. */
static void send_abort_as(side_t *s, const side_t *as, uint64_t id)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__Abort a = EPD__ABORT__INIT;

    a.request_id = id;
    a.status = EPD_ERR_CANCELED;
    a.reason = (char *)"test abort";
    env.body_case = EPD__ENVELOPE__BODY_ABORT;
    env.abort = &a;
    send_env_as(s, as, &env, NULL);
}

static void send_abort(side_t *s, uint64_t id)
{
    send_abort_as(s, s, id);
}

/* The region holds exactly the shadow (nothing written outside what was
 * reserved and completed). */
static void expect_region_is_shadow(void)
{
    assert_memory_equal(epd_xport_mr_addr(w->prefill.region), w->shadow,
                        epd_xport_mr_size(w->prefill.region));
}

/* EmbedComplete for e: dimensions, the checksum of the reference bytes, and
 * the reference bytes in e's slot already when it arrived (the fence); with
 * `alone`, the rest of the region as before (nothing else written: other
 * images in flight may land at any time, so callers with several check the
 * whole region once all completed). */
static void expect_complete_ex(const enc_t *e, int alone)
{
    msg_t *m =
        expect_msg_media(&w->prefill, EPD__ENVELOPE__BODY_EMBED_COMPLETE, e->id, e->media, WAIT_MS);
    float *ref = reference_embeddings(&e->img);
    size_t off = (size_t)e->slot * w->slot_bytes;
    const Epd__EmbedComplete *ec;

    if (m == NULL) {
        fail_msg("prefill: no EmbedComplete for request %llu media %u", (unsigned long long)e->id,
                 e->media);
    }
    ec = m->env->embed_complete;
    assert_int_equal(ec->media_index, e->media);
    assert_int_equal(ec->n_embeddings, w->info->image_embeddings);
    assert_int_equal(ec->embed_dim, w->info->embed_dim);
    assert_int_equal(ec->checksum, epd_hash64(ref, w->slot_bytes, 0));
    assert_memory_equal(m->region + off, ref, w->slot_bytes);
    memcpy(w->shadow + off, ref, w->slot_bytes);
    if (alone) {
        expect_region_is_shadow();
    }
    epd_free(ref);
    msg_free(m);
}

static void expect_complete(const enc_t *e)
{
    expect_complete_ex(e, 1);
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

/* Until the daemon holds no image: nothing queued, nothing running. */
static void wait_idle(void)
{
    uint64_t end = epd_time_now_ns() + (uint64_t)WAIT_MS * EPD_NSEC_PER_MSEC;
    int idle = 0;

    while (!idle && epd_time_now_ns() < end) {
        Epd__StatusResponse *s;
        Epd__Load *l = load_now(&s);

        idle = l->running_requests == 0 && l->queue_depth == 0;
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

    snprintf(path, sizeof(path), "%s/bin/epd-encoder", b != NULL && b[0] != '\0' ? b : "build");
    return path;
}

static void start_daemon(void)
{
    char lease[32], slots[32], maxb[32], router[64];
    char line[512] = "";
    FILE *f = NULL;
    epd_status_t st;

    snprintf(w->ready, sizeof(w->ready), "%s/e.ready", w->dir);
    snprintf(w->trace, sizeof(w->trace), "%s/e.trace.json", w->dir);
    snprintf(lease, sizeof(lease), "%d", LEASE_MS);
    snprintf(slots, sizeof(slots), "%d", E_SLOTS);
    snprintf(maxb, sizeof(maxb), "%d", MAX_IMAGE);
    snprintf(router, sizeof(router), "127.0.0.1:%d", w->router.port);
    w->pid = fork();
    assert_true(w->pid >= 0);
    if (w->pid == 0) {
        char *argv[] = {(char *)bin_path(),
                        "--model",
                        (char *)w->model,
                        "--worker-id",
                        "encoder-t",
                        "--ready-file",
                        w->ready,
                        "--lease-ms",
                        lease,
                        "--slots",
                        slots,
                        "--max-image-bytes",
                        maxb,
                        "--peer-timeout-ms",
                        "1500",
                        "--max-inflight-writes",
                        "1",
                        "--router",
                        router,
                        "--trace",
                        w->trace,
                        "--log-level",
                        "debug",
                        "--transport",
                        (char *)backend(),
                        NULL};
        char log[1100];

        snprintf(log, sizeof(log), "%s/e.log", w->dir);
        if (freopen(log, "w", stderr) == NULL) {
            _exit(127);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    for (int i = 0; i < 1200 && (f = fopen(w->ready, "r")) == NULL; i++) {
        assert_int_equal(waitpid(w->pid, NULL, WNOHANG), 0);
        epd_time_sleep_ns(100 * EPD_NSEC_PER_MSEC);
    }
    assert_non_null(f);
    assert_non_null(fgets(line, sizeof(line), f));
    fclose(f);
    assert_int_equal(sscanf(line, "control=%255s", w->control), 1);
    assert_non_null(strstr(line, " worker=encoder-t "));
    assert_non_null(strstr(line, " pid="));
    assert_non_null(strstr(line, backend()));
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
    /* the engine tests' tiny vision model (epd-mkmodel's writer): 32 x 32
     * pixels, 4 embeddings of 32 floats per image */
    epd_test_tiny_vision_params(&p);
    w->model = epd_test_write_model(w->dir, "tinyv", &p);
    memset(&cfg, 0, sizeof(cfg));
    cfg.model_dir = w->model;
    assert_int_equal(epd_engine_open("ref", &cfg, &w->engine), EPD_OK);
    w->info = epd_engine_info(w->engine);
    assert_true(w->info->image_embeddings > 0);
    w->slot_bytes = (size_t)w->info->image_embeddings * w->info->embed_dim * sizeof(float);
    w->p_nonce = 222;
    router_start(&w->router);
    start_daemon();
    side_init(&w->client, "fake-client", 0);
    side_init(&w->prefill, P_ID, 1);
    assert_int_equal(epd_xport_mr_pack(w->prefill.region, w->rkey, sizeof(w->rkey), &w->rkey_len),
                     EPD_OK);
    w->shadow = epd_calloc(1, epd_xport_mr_size(w->prefill.region));
    *state = w;
    return 0;
}

static char *daemon_log(void);

static int teardown(void **state)
{
    int status = 0;

    (void)state;
    side_destroy(&w->client);
    side_destroy(&w->prefill);
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
    router_stop(&w->router);
    epd_engine_close(w->engine);
    epd_free(w->shadow);
    if (getenv("EPD_ENCODER_TEST_KEEP_LOG") != NULL) {
        /* for debugging: the daemon's log outlives the scratch folder */
        char *log = daemon_log();

        epd_test_write_file(getenv("EPD_ENCODER_TEST_KEEP_LOG"), log, strlen(log));
        epd_free(log);
    }
    epd_test_rmtree(w->dir);
    epd_free(w);
    return 0;
}

static char *daemon_log(void)
{
    char path[1100];
    size_t len;
    unsigned char *log;

    snprintf(path, sizeof(path), "%s/e.log", w->dir);
    log = epd_test_read_file(path, &len);
    log[len > 0 ? len - 1 : 0] = '\0';
    return (char *)log;
}

/* ------------------------------------------------------------------ tests */

static void test_health(void **state)
{
    Epd__HealthResponse *h = w->health;
    Epd__StatusResponse *s;
    Epd__Load *l;

    (void)state;
    assert_true(h->serving);
    assert_false(h->draining);
    assert_string_equal(h->worker->worker_id, "encoder-t");
    assert_int_equal(h->worker->role, EPD__ROLE__ROLE_ENCODER);
    assert_string_equal(h->worker->model, "tinyv");
    assert_non_null(h->worker->epoch);
    assert_true(h->worker->epoch->start_time_ns > 0);
    assert_string_equal(h->transport, backend());
    assert_true(h->data_plane_address.len > 0);
    assert_non_null(h->capacity);
    assert_int_equal(h->capacity->embed_slots, E_SLOTS);
    assert_int_equal(h->capacity->image_embeddings, w->info->image_embeddings);
    assert_int_equal(h->capacity->embed_dim, w->info->embed_dim);
    l = load_now(&s);
    assert_int_equal(l->queue_depth, 0);
    assert_int_equal(l->running_requests, 0);
    assert_false(l->draining);
    assert_int_equal(s->workers[0]->state, EPD__WORKER_STATE__WORKER_STATE_READY);
    assert_int_equal(s->workers[0]->worker->role, EPD__ROLE__ROLE_ENCODER);
    epd_proto_free(&s->base);
}

/* --router: RegisterWorker as ROLE_ENCODER with the capacity, then
 * heartbeats carrying a load. */
static void test_registers_with_router(void **state)
{
    uint64_t end = epd_time_now_ns() + (uint64_t)WAIT_MS * EPD_NSEC_PER_MSEC;
    int done = 0;

    (void)state;
    while (!done && epd_time_now_ns() < end) {
        pthread_mutex_lock(&w->router.mu);
        done = w->router.n_register > 0 && w->router.n_heartbeat > 0;
        pthread_mutex_unlock(&w->router.mu);
        if (!done) {
            epd_time_sleep_ns(10 * EPD_NSEC_PER_MSEC);
        }
    }
    pthread_mutex_lock(&w->router.mu);
    assert_true(done);
    assert_int_equal(w->router.role, EPD__ROLE__ROLE_ENCODER);
    assert_string_equal(w->router.worker_id, "encoder-t");
    assert_int_equal(w->router.embed_slots, E_SLOTS);
    assert_int_equal(w->router.image_embeddings, w->info->image_embeddings);
    assert_int_equal(w->router.embed_dim, w->info->embed_dim);
    assert_true(w->router.has_layout);
    assert_string_equal(w->router.transport, backend());
    assert_int_equal(w->router.addr_len, w->health->data_plane_address.len);
    pthread_mutex_unlock(&w->router.mu);
}

static void test_png_then_reservation(void **state)
{
    enc_t e;

    (void)state;
    enc_make(&e, make_png(48, 40, 1, 0), 0);
    send_encode(&e);
    pump(5);
    send_reservation(&e, NULL);
    expect_complete(&e);
    wait_idle();
    enc_cleanup(&e);
}

static void test_reservation_before_jpeg(void **state)
{
    enc_t e;

    (void)state;
    enc_make(&e, make_jpeg(64, 64, 2), 1);
    send_reservation(&e, NULL);
    pump(50); /* the reservation is in before the request */
    send_encode(&e);
    expect_complete(&e);
    wait_idle();
    enc_cleanup(&e);
}

static void test_reservation_long_after(void **state)
{
    Epd__StatusResponse *s;
    Epd__Load *l;
    enc_t e;

    (void)state;
    enc_make(&e, make_png(20, 30, 3, 0), 2);
    e.media = 3;
    send_encode(&e);
    pump(300); /* the tiny encode is long done: the embeddings wait */
    l = load_now(&s);
    assert_int_equal(l->running_requests + l->queue_depth, 1);
    epd_proto_free(&s->base);
    send_reservation(&e, NULL);
    expect_complete(&e);
    wait_idle();
    enc_cleanup(&e);
}

/* E_SLOTS images at once, mixed formats and sizes (one of ~200 KB: a long
 * message), two of them of one request, reservations half before the
 * requests and half after the embeddings are ready — those two then come
 * back to back while the daemon may post only one write at a time
 * (--max-inflight-writes 1), which usually parks the second on
 * backpressure (reported, not asserted: whether the first write completed
 * in between is the machine's timing). */
static void test_several_at_once(void **state)
{
    enc_t e[E_SLOTS];
    char *log;

    (void)state;
    enc_make(&e[0], make_png(256, 256, 4, 1), 3);
    enc_make(&e[1], make_jpeg(100, 80, 5), 4);
    enc_make(&e[2], make_png(7, 9, 6, 0), 5);
    enc_make(&e[3], make_jpeg(33, 65, 7), 6);
    assert_true(e[0].img.len > 150000 && e[0].img.len < MAX_IMAGE);
    e[1].id = e[0].id; /* two images of one request */
    e[1].media = 1;
    send_reservation(&e[1], NULL);
    send_reservation(&e[3], NULL);
    for (int i = 0; i < E_SLOTS; i++) {
        send_encode(&e[i]);
    }
    pump(300);
    send_reservation(&e[0], NULL);
    send_reservation(&e[2], NULL);
    for (int i = E_SLOTS; i-- > 0;) {
        expect_complete_ex(&e[i], 0);
    }
    wait_idle();
    expect_region_is_shadow();
    log = daemon_log();
    print_message("  backpressure %s\n", strstr(log, "transport backpressure") != NULL
                                             ? "met (writes parked and retried)"
                                             : "not met this time");
    epd_free(log);
    for (int i = 0; i < E_SLOTS; i++) {
        enc_cleanup(&e[i]);
    }
}

/* Images that do not decode: their Error to the client and the prefill
 * worker (then WritesQuiesced), nothing written; the daemon serves on. */
static void test_bad_images(void **state)
{
    static const char text[] = "this is not an image, it is a sentence about one";
    static const unsigned char gif[] = "GIF89a\x01\x00\x01\x00\x00\x00\x00;";
    blob_t good = make_png(40, 40, 8, 0);
    blob_t trunc = blob_of(good.data, good.len / 2);
    blob_t flipped = blob_of(good.data, good.len);
    struct {
        blob_t img;
        epd_status_t want;
        const char *says;
    } cases[5];
    enc_t e;

    (void)state;
    /* a zlib stream header no decoder accepts, right after "IDAT" */
    for (size_t i = 8; i + 6 < flipped.len; i++) {
        if (memcmp(flipped.data + i, "IDAT", 4) == 0) {
            flipped.data[i + 4] = 0xff;
            flipped.data[i + 5] = 0xff;
            break;
        }
    }
    cases[0].img = trunc;
    cases[0].want = EPD_ERR_MALFORMED;
    cases[0].says = "corrupt";
    cases[1].img = blob_of(text, sizeof(text) - 1);
    cases[1].want = EPD_ERR_UNSUPPORTED;
    cases[1].says = "not PNG or JPEG";
    cases[2].img = bomb_png(60000, 60000);
    cases[2].want = EPD_ERR_TOO_LONG;
    cases[2].says = "60000 x 60000";
    cases[3].img = blob_of(gif, sizeof(gif) - 1);
    cases[3].want = EPD_ERR_UNSUPPORTED;
    cases[3].says = "not PNG or JPEG";
    cases[4].img = flipped;
    cases[4].want = EPD_ERR_MALFORMED;
    cases[4].says = "corrupt";
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *msg;

        enc_make(&e, cases[i].img, 0);
        send_encode(&e);
        msg = expect_error(&w->client, e.id, cases[i].want);
        assert_non_null(strstr(msg, cases[i].says));
        expect_error(&w->prefill, e.id, cases[i].want);
        expect_quiesced(e.id);
        enc_cleanup(&e);
    }
    wait_idle();
    expect_region_is_shadow();
    /* still serving */
    enc_make(&e, good, 7);
    send_encode(&e);
    send_reservation(&e, NULL);
    expect_complete(&e);
    wait_idle();
    enc_cleanup(&e);
}

static void test_refusals(void **state)
{
    Epd__Epoch stale = EPD__EPOCH__INIT;
    enc_t e, q[E_SLOTS];
    const char *msg;

    (void)state;
    /* a hash of other bytes (checked on the compute thread, so the prefill
     * worker hears of it too) */
    enc_make(&e, make_png(16, 16, 9, 0), 0);
    e.hash[5] ^= 1;
    send_encode(&e);
    msg = expect_error(&w->client, e.id, EPD_ERR_INVALID_PARAM);
    assert_non_null(strstr(msg, "BLAKE2b"));
    expect_error(&w->prefill, e.id, EPD_ERR_INVALID_PARAM);
    expect_quiesced(e.id);
    /* a hash of the wrong length */
    e.id = ((uint64_t)0xE5 << 40) + ++w->next_id;
    epd_content_hash(e.img.data, e.img.len, e.hash);
    e.hash_len = 16;
    send_encode(&e);
    expect_error(&w->client, e.id, EPD_ERR_INVALID_PARAM);
    e.hash_len = EPD_CONTENT_HASH_BYTES;
    /* another incarnation of this encoder */
    stale.start_time_ns = w->health->worker->epoch->start_time_ns - 1;
    stale.nonce = w->health->worker->epoch->nonce;
    e.id = ((uint64_t)0xE5 << 40) + ++w->next_id;
    e.encoder_epoch = &stale;
    send_encode(&e);
    expect_error(&w->client, e.id, EPD_ERR_STALE_EPOCH);
    e.encoder_epoch = NULL;
    /* no prefill worker named */
    e.id = ((uint64_t)0xE5 << 40) + ++w->next_id;
    e.no_prefill = 1;
    send_encode(&e);
    expect_error(&w->client, e.id, EPD_ERR_INVALID_PARAM);
    e.no_prefill = 0;
    /* media index past the protocol's 8 */
    e.id = ((uint64_t)0xE5 << 40) + ++w->next_id;
    e.media = 8;
    send_encode(&e);
    expect_error(&w->client, e.id, EPD_ERR_INVALID_PARAM);
    e.media = 0;
    enc_cleanup(&e);
    /* an empty image */
    enc_make(&e, blob_of("", 0), 0);
    send_encode(&e);
    expect_error(&w->client, e.id, EPD_ERR_INVALID_PARAM);
    enc_cleanup(&e);
    /* one byte over --max-image-bytes */
    {
        blob_t big = {0};
        unsigned char *junk = calloc(1, MAX_IMAGE + 1);

        assert_non_null(junk);
        big.data = junk;
        big.len = big.cap = MAX_IMAGE + 1;
        enc_make(&e, big, 0);
        send_encode(&e);
        msg = expect_error(&w->client, e.id, EPD_ERR_TOO_LONG);
        assert_non_null(strstr(msg, "exceeds"));
        enc_cleanup(&e);
    }
    /* every slot busy (no reservations), one more refused; a live
     * (request, media) again refused */
    for (int i = 0; i < E_SLOTS; i++) {
        enc_make(&q[i], make_png(16 + i, 16, 10 + i, 0), (uint32_t)i);
        send_encode(&q[i]);
    }
    enc_make(&e, make_png(16, 16, 20, 0), 0);
    send_encode(&e);
    expect_error(&w->client, e.id, EPD_ERR_NO_CAPACITY);
    enc_cleanup(&e);
    send_encode(&q[0]);
    expect_error(&w->client, q[0].id, EPD_ERR_EXISTS);
    for (int i = 0; i < E_SLOTS; i++) {
        send_abort(&w->client, q[i].id);
        expect_quiesced(q[i].id);
        enc_cleanup(&q[i]);
    }
    wait_idle();
    expect_region_is_shadow();
}

/* Frames that do not decode are dropped (counted, logged), a message kind
 * an encoder does not handle gets EPD_ERR_UNSUPPORTED, and the daemon
 * serves on. */
static void test_garbage(void **state)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__TokenChunk tc = EPD__TOKEN_CHUNK__INIT;
    unsigned char junk[300], frame[512];
    epd_rng_t rng;
    size_t len;
    char *log;
    enc_t e;

    (void)state;
    epd_rng_seed(&rng, 99);
    epd_rng_fill(&rng, junk, sizeof(junk));
    assert_int_equal(epd_xport_send(w->client.to_e, junk, sizeof(junk), 0), EPD_OK);
    /* a valid frame cut short, and one with a flipped body byte */
    tc.request_id = 5150;
    env.body_case = EPD__ENVELOPE__BODY_TOKENS;
    env.tokens = &tc;
    {
        Epd__SenderRef sender = EPD__SENDER_REF__INIT;
        Epd__Epoch epoch = EPD__EPOCH__INIT;

        epoch.start_time_ns = 333;
        epoch.nonce = 444;
        sender.worker_id = (char *)"fake-client";
        sender.epoch = &epoch;
        env.sender = &sender;
        assert_int_equal(epd_msg_encode(&env, frame, sizeof(frame), &len), EPD_OK);
        assert_int_equal(epd_xport_send(w->client.to_e, frame, len - 3, 0), EPD_OK);
        frame[len - 1] ^= 0x40;
        assert_int_equal(epd_xport_send(w->client.to_e, frame, len, 0), EPD_OK);
    }
    /* a well-formed message of a kind the encoder does not take */
    send_env(&w->client, &env, NULL);
    expect_error(&w->client, 5150, EPD_ERR_UNSUPPORTED);
    /* still serving */
    enc_make(&e, make_jpeg(30, 30, 80), 0);
    send_encode(&e);
    send_reservation(&e, NULL);
    expect_complete(&e);
    wait_idle();
    enc_cleanup(&e);
    log = daemon_log();
    assert_non_null(strstr(log, "undecodable request-plane frame"));
    epd_free(log);
}

static void spoil_bytes(Epd__EmbedReservation *r)
{
    r->bytes -= 4;
}

static void spoil_range(Epd__EmbedReservation *r)
{
    r->offset = r->region_size - r->bytes + 4; /* runs 4 bytes past the end */
}

static void spoil_rkey(Epd__EmbedReservation *r)
{
    static unsigned char junk[40];

    memset(junk, 0x5a, sizeof(junk));
    r->rkey.data = junk;
    r->rkey.len = sizeof(junk);
}

static void test_bad_reservations(void **state)
{
    void (*spoil[])(Epd__EmbedReservation *) = {spoil_bytes, spoil_range, spoil_rkey};
    epd_status_t want[] = {EPD_ERR_INVALID_PARAM, EPD_ERR_OUT_OF_RANGE, EPD_ERR_BAD_RKEY};

    (void)state;
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        enc_t e;

        enc_make(&e, make_png(24, 24, 30 + (int)i, 0), 7);
        send_encode(&e);
        send_reservation(&e, spoil[i]);
        expect_error(&w->client, e.id, want[i]);
        expect_error(&w->prefill, e.id, want[i]);
        expect_quiesced(e.id);
        assert_null(expect_msg(&w->prefill, EPD__ENVELOPE__BODY_EMBED_COMPLETE, e.id, 100));
        enc_cleanup(&e);
    }
    wait_idle();
    expect_region_is_shadow();
}

static void test_abort(void **state)
{
    enc_t e;

    (void)state;
    /* from the client, before any reservation */
    enc_make(&e, make_png(30, 30, 40, 0), 0);
    send_encode(&e);
    send_abort(&w->client, e.id);
    expect_quiesced(e.id);
    wait_idle();
    /* a late reservation for it is refused (and quiesced), never written */
    send_reservation(&e, NULL);
    expect_error(&w->prefill, e.id, EPD_ERR_NOT_FOUND);
    expect_quiesced(e.id);
    assert_null(expect_msg(&w->prefill, EPD__ENVELOPE__BODY_EMBED_COMPLETE, e.id, 300));
    /* the client hears nothing about its own abort */
    assert_null(expect_msg(&w->client, EPD__ENVELOPE__BODY_ERROR, e.id, 10));
    /* the id is over here: another of its images is refused */
    e.media = 1;
    send_encode(&e);
    expect_error(&w->client, e.id, EPD_ERR_CANCELED);
    /* from the prefill worker for an id never seen: WritesQuiesced */
    send_abort(&w->prefill, 987654321);
    expect_quiesced(987654321);
    /* a reservation first, then the prefill worker's abort: the stashed
     * reservation is answered, nothing is written later */
    e.id = ((uint64_t)0xE5 << 40) + ++w->next_id;
    e.media = 0;
    send_reservation(&e, NULL);
    pump(20);
    send_abort(&w->prefill, e.id);
    expect_quiesced(e.id);
    send_encode(&e);
    expect_error(&w->client, e.id, EPD_ERR_CANCELED);
    /* the same with the client's abort on the prefill worker's endpoint (a
     * client and a prefill worker sharing one, as epd-encoder-load does):
     * the stashed reservation's sender still gets its WritesQuiesced */
    e.id = ((uint64_t)0xE5 << 40) + ++w->next_id;
    send_reservation(&e, NULL);
    pump(20);
    send_abort_as(&w->prefill, &w->client, e.id);
    expect_error(&w->prefill, e.id, EPD_ERR_CANCELED);
    expect_quiesced(e.id);
    wait_idle();
    expect_region_is_shadow();
    enc_cleanup(&e);
}

static void test_lease(void **state)
{
    const char *msg;
    enc_t e;

    (void)state;
    enc_make(&e, make_png(30, 20, 50, 0), 0);
    send_encode(&e);
    msg = expect_error(&w->client, e.id, EPD_ERR_TIMEOUT);
    assert_non_null(strstr(msg, "EmbedReservation"));
    expect_error(&w->prefill, e.id, EPD_ERR_TIMEOUT);
    expect_quiesced(e.id);
    wait_idle();
    /* a reservation after the lease ran out is refused, never written */
    send_reservation(&e, NULL);
    expect_error(&w->prefill, e.id, EPD_ERR_NOT_FOUND);
    expect_quiesced(e.id);
    wait_idle();
    expect_region_is_shadow();
    enc_cleanup(&e);
}

/* deadline_ms (well under the lease) bounds the request. */
static void test_deadline(void **state)
{
    const char *msg;
    enc_t e;

    (void)state;
    enc_make(&e, make_png(30, 20, 51, 0), 0);
    e.deadline_ms = 200;
    send_encode(&e);
    msg = expect_error(&w->client, e.id, EPD_ERR_TIMEOUT);
    assert_non_null(strstr(msg, "deadline"));
    expect_error(&w->prefill, e.id, EPD_ERR_TIMEOUT);
    expect_quiesced(e.id);
    wait_idle();
    enc_cleanup(&e);
}

/* The prefill worker dies (its transport goes away): the client hears
 * EPD_ERR_PEER_DEAD; a new incarnation is served. */
static void test_prefill_dies(void **state)
{
    enc_t e;

    (void)state;
    enc_make(&e, make_png(30, 20, 60, 0), 0);
    send_encode(&e);
    pump(50);
    side_destroy(&w->prefill); /* says BYE: the endpoint fails at once */
    expect_error(&w->client, e.id, EPD_ERR_PEER_DEAD);
    wait_idle();
    enc_cleanup(&e);

    w->p_nonce = 223; /* a new incarnation of the same worker id */
    side_init(&w->prefill, P_ID, 1);
    assert_int_equal(epd_xport_mr_pack(w->prefill.region, w->rkey, sizeof(w->rkey), &w->rkey_len),
                     EPD_OK);
    memset(w->shadow, 0, epd_xport_mr_size(w->prefill.region));
    enc_make(&e, make_jpeg(50, 50, 61), 2);
    send_encode(&e);
    send_reservation(&e, NULL);
    expect_complete(&e);
    wait_idle();
    enc_cleanup(&e);
}

/* A message from an older epoch of a known prefill worker is refused. */
static void test_stale_prefill_epoch(void **state)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__EmbedReservation r = EPD__EMBED_RESERVATION__INIT;
    Epd__Epoch old = EPD__EPOCH__INIT;

    (void)state;
    old.start_time_ns = P_START;
    old.nonce = w->p_nonce - 1;
    r.request_id = 424242;
    r.rkey.data = w->rkey;
    r.rkey.len = w->rkey_len;
    r.region_size = epd_xport_mr_size(w->prefill.region);
    r.bytes = w->slot_bytes;
    env.body_case = EPD__ENVELOPE__BODY_EMBED_RESERVATION;
    env.embed_reservation = &r;
    send_env(&w->prefill, &env, &old);
    expect_error(&w->prefill, 424242, EPD_ERR_STALE_EPOCH);
    wait_idle();
}

static void test_drain(void **state)
{
    Epd__DrainRequest dr = EPD__DRAIN_REQUEST__INIT;
    Epd__HealthResponse *h;
    ProtobufCMessage *m;
    epd_status_t st;
    enc_t e;

    (void)state;
    dr.worker_id = (char *)"someone-else";
    m = rpc(EPD_RPC_DRAIN, &epd__drain_response__descriptor, &dr.base, &st);
    assert_int_equal(st, EPD_ERR_NOT_FOUND);
    assert_null(m);
    m = rpc(EPD_RPC_REGISTER, &epd__register_response__descriptor, NULL, &st);
    assert_int_equal(st, EPD_ERR_UNSUPPORTED);
    dr.worker_id = (char *)"encoder-t";
    m = rpc(EPD_RPC_DRAIN, &epd__drain_response__descriptor, &dr.base, &st);
    assert_int_equal(st, EPD_OK);
    assert_true(((Epd__DrainResponse *)m)->ok);
    epd_proto_free(m);
    h = (Epd__HealthResponse *)rpc(EPD_RPC_HEALTH, &epd__health_response__descriptor, NULL, &st);
    assert_int_equal(st, EPD_OK);
    assert_true(h->draining);
    assert_false(h->serving);
    assert_true(h->load->draining);
    epd_proto_free(&h->base);
    enc_make(&e, make_png(16, 16, 70, 0), 0);
    send_encode(&e);
    expect_error(&w->client, e.id, EPD_ERR_DRAINING);
    enc_cleanup(&e);
}

static void test_sigterm(void **state)
{
    static const char *spans[] = {"EncodeRequest received",
                                  "\"queued\"",
                                  "verify hash",
                                  "decode image",
                                  "\"encode\"",
                                  "reservation wait",
                                  "embed write",
                                  "EmbedComplete sent",
                                  "EmbedReservation received"};
    unsigned char *json;
    size_t len;
    int status = 0;

    (void)state;
    assert_int_equal(kill(w->pid, SIGTERM), 0);
    for (int i = 0; i < 300 && waitpid(w->pid, &status, WNOHANG) == 0; i++) {
        epd_time_sleep_ns(100 * EPD_NSEC_PER_MSEC);
    }
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    w->pid = 0;
    json = epd_test_read_file(w->trace, &len);
    assert_true(len > 0);
    json[len - 1] = '\0';
    for (size_t i = 0; i < sizeof(spans) / sizeof(spans[0]); i++) {
        if (strstr((char *)json, spans[i]) == NULL) {
            fail_msg("the trace has no '%s' event", spans[i]);
        }
    }
    epd_free(json);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health),
        cmocka_unit_test(test_registers_with_router),
        cmocka_unit_test(test_png_then_reservation),
        cmocka_unit_test(test_reservation_before_jpeg),
        cmocka_unit_test(test_reservation_long_after),
        cmocka_unit_test(test_several_at_once),
        cmocka_unit_test(test_bad_images),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_bad_reservations),
        cmocka_unit_test(test_abort),
        cmocka_unit_test(test_lease),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_prefill_dies),
        cmocka_unit_test(test_stale_prefill_epoch),
        cmocka_unit_test(test_drain),
        cmocka_unit_test(test_sigterm),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/* gcc checks for static functions declared but never defined (the HDR
 * writer of stb_image_write, compiled out) at the end of the file. */
#pragma GCC diagnostic ignored "-Wunused-function"
