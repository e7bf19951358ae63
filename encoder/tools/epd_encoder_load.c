/*
 * epd_encoder_load.c — `epd-encoder-load`: drives a running epd-encoder at
 * a fixed number of images in flight and reports images/s and latency.
 *
 * It plays both the client and the prefill worker over one transport
 * endpoint: for each image it sends the EncodeRequest (sender
 * "load-client") and the EmbedReservation (sender "load-prefill", whose
 * epoch and address the request names) back to back, receives the write
 * into its own registered region and the fenced EmbedComplete, and checks
 * that the checksum equals the xxh3 of the bytes that landed.  Latency is
 * EncodeRequest sent -> EmbedComplete received (decode + encode + write +
 * notice, plus the queueing behind the images in flight).  One thread:
 * the transport is progressed here between sends.
 *
 * Against a cluster with a secret (--cluster-secret-file) its endpoint is
 * authenticated as "load-prefill", and the encoder refuses an envelope
 * whose sender is not the endpoint's: both messages are then sent as
 * "load-prefill" with one epoch (the client and the prefill worker are one
 * member).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_config.h"
#include "epd_hash.h"
#include "epd_log.h"
#include "epd_msg.h"
#include "epd_rng.h"
#include "epd_rpc.h"
#include "epd_secret.h"
#include "epd_time.h"
#include "epd_xport.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#define STBI_WRITE_NO_STDIO
#define STBIW_MALLOC(sz) epd_malloc(sz)
#define STBIW_REALLOC(p, newsz) epd_realloc(p, newsz)
#define STBIW_FREE(p) epd_free(p)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
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

#define LOAD_LOG "load"
#define LOAD_MAX_INFLIGHT 1024

typedef struct {
    unsigned char *data;
    size_t len, cap;
} load_blob_t;

typedef struct {
    int busy;
    uint64_t id;
    uint64_t t_sent_ns;
} load_slot_t;

typedef struct {
    epd_xport_t *x;
    epd_xport_ep_t *ep;
    epd_xport_mr_t *region;
    size_t slot_bytes;
    load_slot_t *slots;
    uint32_t n_slots;
    uint64_t done, errors, bad_sums;
    uint64_t *lat_ns; /* [images] */
    uint64_t n_lat;
    int failed_ep;
} load_t;

static void load_on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    load_t *l = arg;
    Epd__Envelope *env = NULL;
    uint64_t id, now = epd_time_now_ns();

    (void)ep;
    if (epd_msg_decode(data, len, &env, NULL) != EPD_OK) {
        l->errors++;
        return;
    }
    id = epd_msg_request_id(env);
    for (uint32_t s = 0; s < l->n_slots; s++) {
        load_slot_t *sl = &l->slots[s];

        if (!sl->busy || sl->id != id) {
            continue;
        }
        if (env->body_case == EPD__ENVELOPE__BODY_EMBED_COMPLETE) {
            const char *at = (const char *)epd_xport_mr_addr(l->region) + s * l->slot_bytes;

            if (epd_hash64(at, l->slot_bytes, 0) != env->embed_complete->checksum) {
                l->bad_sums++;
            }
            l->lat_ns[l->n_lat++] = now - sl->t_sent_ns;
            l->done++;
            sl->busy = 0;
        } else if (env->body_case == EPD__ENVELOPE__BODY_ERROR) {
            epd_log_warn(LOAD_LOG, id, "Error %s: %s",
                         epd_status_name((epd_status_t)env->error->status),
                         env->error->message != NULL ? env->error->message : "");
            l->errors++;
            l->done++;
            sl->busy = 0;
        }
        break;
    }
    epd_msg_free(env);
}

static void load_on_err(void *arg, epd_xport_ep_t *ep, epd_status_t st)
{
    load_t *l = arg;

    (void)ep;
    epd_log_error(LOAD_LOG, 0, "an endpoint failed: %s", epd_status_string(st));
    l->failed_ep = 1;
}

static void load_blob_put(void *ctx, void *data, int size)
{
    load_blob_t *b = ctx;

    if (size <= 0 || b->cap == (size_t)-1) {
        return;
    }
    if (b->len + (size_t)size > b->cap) {
        size_t cap = (b->len + (size_t)size) * 2 + 64;
        unsigned char *p = epd_realloc(b->data, cap);

        if (p == NULL) {
            b->cap = (size_t)-1; /* remembered: the file is incomplete */
            return;
        }
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, (size_t)size);
    b->len += (size_t)size;
}

/* A photo-like w x h image (smooth gradients, edges, some noise). */
static int load_make_image(int w, int h, int jpeg, uint64_t seed, load_blob_t *b)
{
    unsigned char *px = epd_malloc((size_t)w * h * 3);
    epd_rng_t rng;
    int ok;

    if (px == NULL) {
        return -1;
    }
    epd_rng_seed(&rng, seed);
    for (int y = 0; y < h; y++) {
        for (int x = 0; x < w; x++) {
            for (int c = 0; c < 3; c++) {
                int v = (x * 255 / w * (c + 1) + y * 255 / h * (3 - c)) / 4 +
                        ((x / 13 + y / 17) % 2) * 40 + (int)(epd_rng_next(&rng) % 16);

                px[((size_t)y * w + x) * 3 + c] = (unsigned char)(v > 255 ? 255 : v);
            }
        }
    }
    memset(b, 0, sizeof(*b));
    ok = jpeg ? stbi_write_jpg_to_func(load_blob_put, b, w, h, 3, px, 90)
              : stbi_write_png_to_func(load_blob_put, b, w, h, 3, px, w * 3);
    epd_free(px);
    return ok != 0 && b->cap != (size_t)-1 ? 0 : -1;
}

static int load_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

static epd_status_t load_send(load_t *l, Epd__Envelope *env, const char *who,
                              const Epd__Epoch *epoch, unsigned char *buf, size_t cap)
{
    Epd__SenderRef sender = EPD__SENDER_REF__INIT;
    size_t len;
    epd_status_t st;

    sender.worker_id = (char *)who;
    sender.epoch = (Epd__Epoch *)epoch;
    env->sender = &sender;
    env->seq = 1;
    st = epd_msg_encode(env, buf, cap, &len);
    if (st != EPD_OK) {
        return st;
    }
    do {
        st = epd_xport_send(l->ep, buf, len, 0);
        if (st == EPD_ERR_NO_RESOURCE) {
            (void)epd_xport_poll(l->x, 1);
        }
    } while (st == EPD_ERR_NO_RESOURCE && !l->failed_ep);
    return st;
}

int main(int argc, char **argv)
{
    const char *encoder = NULL, *transport = "ucx", *format = "jpeg", *log_level = "warn";
    const char *secret_file = NULL;
    static epd_secret_t secret;
    const char *client_name = "load-client";
    char why[256];
    int64_t images = 200, inflight = 4, width = 640, height = 480, warmup = 8;
    const epd_opt_t opts[] = {
        {"encoder", EPD_OPT_STRING, &encoder, 0, 0, "the encoder's control address HOST:PORT"},
        {"transport", EPD_OPT_STRING, &transport, 0, 0, "ucx or ofi (as the encoder's)"},
        {"images", EPD_OPT_INT, &images, 1, 1 << 24, "images to encode (after the warm-up)"},
        {"warmup", EPD_OPT_INT, &warmup, 0, 1 << 20, "images encoded first and not counted"},
        {"inflight", EPD_OPT_INT, &inflight, 1, LOAD_MAX_INFLIGHT,
         "images in flight at once (at most the encoder's --slots)"},
        {"width", EPD_OPT_INT, &width, 1, 8192, "image width in pixels"},
        {"height", EPD_OPT_INT, &height, 1, 8192, "image height in pixels"},
        {"format", EPD_OPT_STRING, &format, 0, 0, "jpeg or png"},
        {"log-level", EPD_OPT_STRING, &log_level, 0, 0, "error, warn, info, debug or trace"},
        {"cluster-secret-file", EPD_OPT_STRING, &secret_file, 0, 0,
         "the cluster's secret (the encoder's --cluster-secret-file)"},
    };
    epd_opts_t o = {.prog = "epd-encoder-load",
                    .summary = "drive an epd-encoder: images/s and latency at a fixed concurrency",
                    .opts = opts,
                    .n_opts = sizeof(opts) / sizeof(opts[0])};
    Epd__HealthResponse *h = NULL;
    ProtobufCMessage *m = NULL;
    epd_rpc_client_t *rpc = NULL;
    epd_xport_config_t xcfg;
    epd_log_level_t level;
    load_blob_t img = {0};
    load_t l;
    unsigned char hash[EPD_CONTENT_HASH_BYTES];
    unsigned char rkey[EPD_XPORT_RKEY_MAX];
    size_t rkey_len = 0, cap;
    unsigned char *buf = NULL;
    Epd__Epoch p_epoch = EPD__EPOCH__INIT, c_epoch = EPD__EPOCH__INIT;
    const void *addr;
    size_t addr_len;
    uint64_t total, sent = 0, id_base, t0 = 0, t_end, deadline;
    void *resp = NULL;
    size_t resp_len = 0;
    epd_status_t st;
    int argi, rc = 1;

    memset(&l, 0, sizeof(l));
    st = epd_opts_parse(&o, argc, argv, &argi);
    if (st == EPD_ERR_CANCELED) {
        epd_opts_cleanup(&o);
        return 0;
    }
    if (st != EPD_OK || argi != argc || encoder == NULL ||
        epd_log_level_parse(log_level, &level) != EPD_OK ||
        (strcmp(format, "jpeg") != 0 && strcmp(format, "png") != 0)) {
        fprintf(stderr, "epd-encoder-load: --encoder HOST:PORT is required; --format jpeg|png; "
                        "see --help\n");
        epd_opts_cleanup(&o);
        return 1;
    }
    epd_log_set_level(level);
    total = (uint64_t)images + (uint64_t)warmup;
    if (secret_file != NULL && epd_secret_load(secret_file, &secret, why, sizeof(why)) != EPD_OK) {
        epd_log_error(LOAD_LOG, 0, "--cluster-secret-file: %s", why);
        goto out;
    }

    /* who the encoder is */
    if (epd_rpc_client_create(encoder, &rpc) != EPD_OK ||
        epd_rpc_call(rpc, EPD_RPC_HEALTH, NULL, 0, 5000, &resp, &resp_len, NULL, 0) != EPD_OK ||
        epd_proto_unpack(&epd__health_response__descriptor, resp, resp_len, &m) != EPD_OK) {
        epd_log_error(LOAD_LOG, 0, "no Health answer from '%s'", encoder);
        goto out;
    }
    h = (Epd__HealthResponse *)m;
    if (h->worker == NULL || h->worker->role != EPD__ROLE__ROLE_ENCODER || h->capacity == NULL ||
        h->capacity->image_embeddings == 0 || h->worker->epoch == NULL) {
        epd_log_error(LOAD_LOG, 0, "'%s' is not an encoder with a vision model", encoder);
        goto out;
    }
    if ((uint64_t)inflight > h->capacity->embed_slots) {
        inflight = h->capacity->embed_slots;
    }
    l.slot_bytes = (size_t)h->capacity->image_embeddings * h->capacity->embed_dim * sizeof(float);
    l.n_slots = (uint32_t)inflight;
    l.slots = epd_calloc(l.n_slots, sizeof(*l.slots));
    l.lat_ns = epd_calloc(total, sizeof(*l.lat_ns));
    if (l.slots == NULL || l.lat_ns == NULL ||
        load_make_image((int)width, (int)height, strcmp(format, "jpeg") == 0, 7, &img) != 0) {
        epd_log_error(LOAD_LOG, 0, "out of memory");
        goto out;
    }
    epd_content_hash(img.data, img.len, hash);

    p_epoch.start_time_ns = epd_time_wall_ns();
    p_epoch.nonce = epd_rng_entropy();
    c_epoch = p_epoch;
    c_epoch.nonce ^= 1;
    epd_xport_config_init(&xcfg);
    xcfg.backend = transport;
    if (secret.len > 0) {
        xcfg.secret = secret.bytes;
        xcfg.secret_len = secret.len;
        snprintf(xcfg.identity.worker_id, sizeof(xcfg.identity.worker_id), "load-prefill");
        xcfg.identity.role = EPD__ROLE__ROLE_PREFILL;
        xcfg.identity.epoch.start_time_ns = p_epoch.start_time_ns;
        xcfg.identity.epoch.nonce = p_epoch.nonce;
        c_epoch = p_epoch;
        client_name = "load-prefill";
    }
    xcfg.max_msg_size = img.len + (64u << 10);
    xcfg.msg_cb = load_on_msg;
    xcfg.err_cb = load_on_err;
    xcfg.cb_arg = &l;
    if (epd_xport_create(&xcfg, &l.x) != EPD_OK ||
        epd_xport_connect(l.x, h->data_plane_address.data, h->data_plane_address.len, NULL, NULL,
                          &l.ep) != EPD_INPROGRESS ||
        epd_xport_mr_alloc(l.x, l.n_slots * l.slot_bytes, &l.region) != EPD_OK ||
        epd_xport_mr_pack(l.region, rkey, sizeof(rkey), &rkey_len) != EPD_OK ||
        epd_xport_address(l.x, &addr, &addr_len) != EPD_OK) {
        epd_log_error(LOAD_LOG, 0, "cannot set up the '%s' transport", transport);
        goto out;
    }
    cap = img.len + (64u << 10);
    buf = epd_malloc(cap);
    if (buf == NULL) {
        goto out;
    }
    id_base = (epd_rng_entropy() & 0xffffffffull) << 32;
    printf("encoder %s (%s): %u embeddings x %u f32 per image; %s %lldx%lld of %zu bytes; %u "
           "in flight\n",
           encoder, h->worker->worker_id, h->capacity->image_embeddings, h->capacity->embed_dim,
           format, (long long)width, (long long)height, img.len, l.n_slots);

    deadline = epd_time_now_ns() + 600 * EPD_NSEC_PER_SEC;
    while (l.done < total && !l.failed_ep && epd_time_now_ns() < deadline) {
        for (uint32_t s = 0; s < l.n_slots && sent < total; s++) {
            Epd__Envelope env = EPD__ENVELOPE__INIT;
            Epd__EncodeRequest er = EPD__ENCODE_REQUEST__INIT;
            Epd__EmbedReservation rv = EPD__EMBED_RESERVATION__INIT;
            load_slot_t *sl = &l.slots[s];

            if (sl->busy) {
                continue;
            }
            if (sent == (uint64_t)warmup) {
                t0 = epd_time_now_ns();
                l.n_lat = 0;
            }
            sl->busy = 1;
            sl->id = id_base + ++sent;
            sl->t_sent_ns = epd_time_now_ns();
            er.request_id = sl->id;
            er.image.data = img.data;
            er.image.len = img.len;
            er.content_hash.data = hash;
            er.content_hash.len = sizeof(hash);
            er.prefill_worker_id = (char *)"load-prefill";
            er.prefill_address.data = (uint8_t *)addr;
            er.prefill_address.len = addr_len;
            er.prefill_epoch = &p_epoch;
            er.encoder_epoch = h->worker->epoch;
            env.body_case = EPD__ENVELOPE__BODY_ENCODE;
            env.encode = &er;
            if (load_send(&l, &env, client_name, &c_epoch, buf, cap) != EPD_OK) {
                l.failed_ep = 1;
                break;
            }
            rv.request_id = sl->id;
            rv.rkey.data = rkey;
            rv.rkey.len = rkey_len;
            rv.region_size = epd_xport_mr_size(l.region);
            rv.offset = (uint64_t)s * l.slot_bytes;
            rv.bytes = l.slot_bytes;
            rv.lease_ms = 60000;
            env.body_case = EPD__ENVELOPE__BODY_EMBED_RESERVATION;
            env.embed_reservation = &rv;
            if (load_send(&l, &env, "load-prefill", &p_epoch, buf, cap) != EPD_OK) {
                l.failed_ep = 1;
                break;
            }
        }
        (void)epd_xport_poll(l.x, 1);
    }
    t_end = epd_time_now_ns();
    if (l.done < total) {
        epd_log_error(LOAD_LOG, 0, "only %llu of %llu images finished", (unsigned long long)l.done,
                      (unsigned long long)total);
        goto out;
    }
    qsort(l.lat_ns, l.n_lat, sizeof(uint64_t), load_cmp_u64);
    printf("%lld images in %.3f s: %.1f images/s; latency p50 %.2f ms, p99 %.2f ms, max %.2f ms; "
           "%llu errors, %llu checksum mismatches\n",
           (long long)images, (double)(t_end - t0) / 1e9,
           (double)images / ((double)(t_end - t0) / 1e9), (double)l.lat_ns[l.n_lat / 2] / 1e6,
           (double)l.lat_ns[(l.n_lat * 99) / 100 < l.n_lat ? (l.n_lat * 99) / 100 : l.n_lat - 1] /
               1e6,
           (double)l.lat_ns[l.n_lat - 1] / 1e6, (unsigned long long)l.errors,
           (unsigned long long)l.bad_sums);
    rc = l.errors == 0 && l.bad_sums == 0 ? 0 : 1;

out:
    epd_free(buf);
    epd_xport_destroy(l.x); /* also deregisters the region */
    epd_free(img.data);
    epd_free(l.lat_ns);
    epd_free(l.slots);
    if (m != NULL) {
        epd_proto_free(m);
    }
    epd_free(resp);
    epd_rpc_client_destroy(rpc);
    epd_secret_wipe(&secret);
    epd_opts_cleanup(&o);
    return rc;
}

/* gcc checks for static functions declared but never defined (the HDR
 * writer of stb_image_write, compiled out) at the end of the file. */
#pragma GCC diagnostic ignored "-Wunused-function"
