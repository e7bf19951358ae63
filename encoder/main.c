/*
 * main.c — `epd-encoder`: the encoder daemon.
 *
 * Turns images into embeddings and writes them, one-sided, into the slot a
 * prefill worker reserved for them (proto/README.md rules 13-20;
 * encoder/README.md tells the story).  What every daemon does the same way
 * — loop, transport, control plane, registration, signals, ready file,
 * trace, the stop order — is daemon/'s; this file turns flags into the
 * role: the model, the embedding region (the writes' source), the compute
 * thread, and the callbacks the runtime calls.
 *
 * Threads: the loop thread (the daemon runtime's, owning every image), the
 * compute thread (epd_encoder_compute: hash check, decode, vision encoder),
 * gRPC's and the registrar's own (hidden in daemon/).
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_encoder_int.h"
#include "epd_image.h"
#include "epd_log.h"

typedef struct {
    int64_t slots;
    int64_t max_image_bytes;
    int64_t max_pixels;
    int64_t lease_ms;
    int64_t max_inflight_writes;
} epd_encoder_flags_t;

/* Shutdown step 5 (daemon/epd_daemon.h): the compute thread writes into
 * the region, so it is joined before the transport frees it. */
static void epd_encoder_on_exit(void *arg)
{
    epd_encoder_srv_t *srv = arg;

    epd_encoder_compute_destroy(srv->compute);
    srv->compute = NULL;
}

/* The role on a created daemon: the region, the tables, the compute thread
 * (which takes the engine).  EPD_OK or the failure (logged). */
static epd_status_t epd_encoder_setup(void *arg, epd_daemon_t *d)
{
    epd_encoder_srv_t *srv = arg;
    epd_daemon_capacity_t cap;
    uint64_t region_bytes;
    epd_status_t st;

    srv->d = d;
    srv->trace = epd_daemon_trace(d);
    epd__encoder_metrics_init(srv);
    epd_daemon_set_metrics(d, epd__encoder_metrics_render, srv);
    /* the slots, registered: the source of the one-sided writes, and where
     * the compute thread encodes into */
    region_bytes = (uint64_t)srv->slots * srv->slot_stride;
    st = epd_xport_mr_alloc_ex(epd_daemon_xport(srv->d), (size_t)region_bytes, EPD_XPORT_MR_LOCAL,
                               &srv->region);
    if (st != EPD_OK) {
        epd_log_error(EPD_ENCODER_LOG, 0, "cannot allocate a %llu-byte embedding region: %s",
                      (unsigned long long)region_bytes, epd_status_string(st));
        return st;
    }
    st = epd__encoder_reqs_init(srv);
    if (st != EPD_OK) {
        epd_log_error(EPD_ENCODER_LOG, 0, "out of memory");
        return st;
    }
    st = epd_encoder_compute_create(epd_daemon_loop(srv->d), srv->engine, srv->slots,
                                    epd__encoder_req_on_job, srv, &srv->compute);
    if (st != EPD_OK) {
        return st;
    }
    srv->engine = NULL; /* the compute thread owns it now */
    memset(&cap, 0, sizeof(cap));
    cap.embed_slots = srv->slots;
    cap.image_embeddings = srv->info->image_embeddings;
    cap.embed_dim = srv->info->embed_dim;
    cap.max_batch = 1; /* one image at a time on the compute thread */
    cap.max_context = srv->info->max_context;
    epd_daemon_set_capacity(srv->d, &cap);
    /* an encoder computes no KV, but the layout is how the router tells
     * that every worker runs the same model */
    epd_daemon_set_kv_layout(srv->d, &srv->info->kv);
    epd_log_info(EPD_ENCODER_LOG, 0,
                 "serving model '%s': %u embeddings x %u f32 per image (%zu bytes), %u slots "
                 "(%llu bytes registered), images up to %llu bytes and %llu pixels, lease %u ms",
                 epd_daemon_model_name(srv->d), srv->info->image_embeddings, srv->info->embed_dim,
                 srv->slot_bytes, srv->slots, (unsigned long long)region_bytes,
                 (unsigned long long)srv->max_image_bytes, (unsigned long long)srv->max_pixels,
                 srv->lease_ms);
    return EPD_OK;
}

/* ops->cleanup: the compute thread is joined and the transport gone (the
 * region with it): only memory is left */
static void epd_encoder_cleanup(void *arg)
{
    epd_encoder_srv_t *srv = arg;

    epd_encoder_compute_destroy(srv->compute);
    srv->compute = NULL;
    epd_engine_close(srv->engine);
    epd__encoder_reqs_cleanup(srv);
}

/* A SIGTERM drain ends when no image is left (queued, encoding or being
 * written). */
static int epd_encoder_idle(void *arg)
{
    epd_encoder_srv_t *srv = arg;

    return epd_reqtab_count(&srv->reqs) == 0;
}

static const epd_daemon_ops_t epd_encoder_ops = {
    .on_msg = epd__encoder_on_msg,
    .on_link_down = epd_daemon_op_link_down_none, /* images hold their client's link */
    .on_peer_dead = epd__encoder_req_on_peer_dead,
    .on_peer_closed = epd_daemon_op_peer_closed_none, /* we write; nothing of theirs lands here */
    .on_pump = epd__encoder_req_on_pump,
    .on_tick = epd__encoder_req_on_tick,
    .load = epd__encoder_req_load,
    .on_drain = epd_daemon_op_none,
    .on_rpc = epd_daemon_op_rpc_pass,
    .on_stop = epd__encoder_req_on_stop,
    .stopped = epd_daemon_op_stopped_now,
    .idle = epd_encoder_idle,
    .on_exit = epd_encoder_on_exit,
    .setup = epd_encoder_setup,
    .cleanup = epd_encoder_cleanup,
};

static int epd_encoder_run(const epd_daemon_flags_t *dfl, void *arg)
{
    const epd_encoder_flags_t *fl = arg;
    epd_daemon_config_t dc;
    epd_encoder_srv_t srv;

    memset(&srv, 0, sizeof(srv));
    srv.slots = (uint32_t)fl->slots;
    srv.max_image_bytes = (uint64_t)fl->max_image_bytes;
    srv.max_pixels = (uint64_t)fl->max_pixels;
    srv.lease_ms = (uint32_t)fl->lease_ms;
    /* the model (blocking: before the loop runs) */
    if (epd_daemon_engine_open(dfl, EPD_ENCODER_LOG, 0, 1, &srv.engine) != EPD_OK) {
        return 1;
    }
    srv.info = epd_engine_info(srv.engine);
    if (srv.info->image_embeddings == 0 || srv.info->embed_dim == 0) {
        epd_log_error(EPD_ENCODER_LOG, 0,
                      "model '%s' (engine '%s') has no vision encoder: nothing to encode with",
                      dfl->model, dfl->engine);
        epd_engine_close(srv.engine);
        return 1;
    }
    srv.slot_bytes = (size_t)srv.info->image_embeddings * srv.info->embed_dim * sizeof(float);
    srv.slot_stride = (srv.slot_bytes + 63) & ~(size_t)63;
    memset(&dc, 0, sizeof(dc));
    dc.role_name = EPD_ENCODER_LOG;
    dc.role = EPD__ROLE__ROLE_ENCODER;
    dc.flags = dfl;
    dc.with_xport = 1;
    /* an EncodeRequest carries the image itself: messages up to the
     * transport's own limit arrive whole, so an image over
     * --max-image-bytes is refused with a clear EPD_ERR_TOO_LONG instead of
     * being dropped by the transport (held and send copies are sized to
     * each message, so the large limit costs nothing for small ones) */
    dc.max_msg_size = EPD_ENCODER_MSG_LIMIT;
    dc.max_inflight = (uint32_t)fl->max_inflight_writes;
    dc.ops = &epd_encoder_ops;
    dc.arg = &srv;
    return epd_daemon_run(&dc);
}

int main(int argc, char **argv)
{
    epd_encoder_flags_t fl = {
        .slots = 16,
        .max_image_bytes = 8 << 20,
        .max_pixels = (int64_t)EPD_IMAGE_MAX_PIXELS_DEFAULT,
        .lease_ms = 5000,
        .max_inflight_writes = 4096,
    };
    const epd_opt_t opts[] = {
        {"slots", EPD_OPT_INT, &fl.slots, 1, 4096,
         "images in flight at once: slots of the registered region the writes come from"},
        {"max-image-bytes", EPD_OPT_INT, &fl.max_image_bytes, 1,
         (double)(EPD_ENCODER_MSG_LIMIT - EPD_ENCODER_MSG_HEADROOM),
         "largest encoded image an EncodeRequest may carry (the transport's message limit "
         "is set to this plus 64 KiB)"},
        {"max-pixels", EPD_OPT_INT, &fl.max_pixels, 1, (double)(65536.0 * 65536.0),
         "largest width x height decoded (refused from the header, before any pixel memory)"},
        {"lease-ms", EPD_OPT_INT, &fl.lease_ms, 1, 3600000,
         "fail an image whose EmbedReservation has not come this long after its embeddings "
         "are ready (and drop an early reservation without a lease of its own after this)"},
        {"max-inflight-writes", EPD_OPT_INT, &fl.max_inflight_writes, 1, 1 << 24,
         "embedding writes posted at once; more wait (backpressure) until earlier ones complete"},
    };
    return epd_daemon_main("epd-encoder",
                           "encoder worker: images in, embeddings written into prefill's slots",
                           EPD_DAEMON_FLAG_REGISTER, opts, sizeof(opts) / sizeof(opts[0]),
                           epd_encoder_run, &fl, argc, argv);
}
