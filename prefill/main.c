/*
 * main.c — `epd-prefill`: the prefill daemon.
 *
 * Runs prompts through the model and streams each finished layer's KV into
 * the blocks a decode worker reserved, so the transfer hides behind the
 * compute of the next layers (proto/README.md is the protocol; DESIGN.md
 * the why; prefill/README.md the story).  What every daemon does the same
 * way — loop, transport, control plane (Health, Status, Drain),
 * registration, signals, ready file, trace, the stop order — is daemon/'s;
 * this file turns flags into the role: the model, the local KV pool (the
 * writes' source), the embedding region (the encoders' landing zone), the
 * compute thread, and the callbacks the runtime calls.
 *
 * Threads: the loop thread (the daemon runtime's, owning every request and
 * the transport, which it keeps progressing whatever compute does), the
 * compute thread (epd_prefill_compute: owns the engine, one job at a time),
 * gRPC's and the registrar's own (hidden in daemon/).  No lock is held
 * across a compute call or a network call.
 */
#include <stdio.h>
#include <string.h>

#include "epd_image.h"
#include "epd_layout.h"
#include "epd_log.h"
#include "epd_msg.h"
#include "epd_prefill_int.h"

typedef struct {
    int64_t kv_blocks;
    int64_t state_slots;
    int64_t block_tokens;
    int64_t lease_ms;
    int64_t max_inflight_writes;
    int64_t write_group_bytes;
    int64_t write_chunk_bytes;
    int layer_notify;
    int64_t embed_slots;
    int64_t max_image_pixels;
    int prefix_cache;
    int kv_prefault;
    int64_t compute_nice;
    int64_t ckpt_every;
    int64_t ckpt_bytes;
    int64_t replay_tokens;
    int hold_under_pressure;
    int64_t kv_host_bytes;
    const char *kv_disk;
    int64_t kv_disk_bytes; /* -1: not given */
    int kv_disk_persist;
    int64_t kv_tier_level;
    int64_t chunk_tokens; /* -1: the engine's default */
} epd_prefill_flags_t;

/* Shutdown step 5 (daemon/epd_daemon.h): the compute thread writes into
 * the pool and the embedding slots, so it is joined before the transport
 * frees them (every run was canceled at step 1: it ends at its next layer
 * boundary). */
static void epd_prefill_on_exit(void *arg)
{
    epd_prefill_srv_t *srv = arg;

    epd_prefill_compute_destroy(srv->compute);
    srv->compute = NULL;
    epd__prefill_tier_stop(srv); /* its thread too, while the loop still runs */
}

/* The load the control plane reports (Health, Status, heartbeats). */
static void epd_prefill_load(void *arg, epd_daemon_load_t *load_p)
{
    epd_prefill_srv_t *srv = arg;
    uint32_t jobs = 0;
    uint64_t tokens = 0, router_tokens = 0;

    if (srv->compute != NULL) {
        epd_prefill_compute_backlog(srv->compute, &jobs, &tokens, &router_tokens);
    }
    load_p->queue_depth = jobs;
    load_p->queued_tokens = tokens;
    load_p->router_queued_tokens = router_tokens;
    load_p->kv_blocks_free = epd__prefill_cache_available(srv);
    load_p->state_slots_free = srv->n_free_slots;
    load_p->running_requests = epd_reqtab_count(&srv->reqs);
    load_p->kv_bytes_sent = srv->kv_bytes_sent;
    epd__prefill_cache_stats(srv, &load_p->prefix);
    load_p->quarantined = epd__prefill_media_quarantined(srv);
    load_p->wasted_prefill_tokens = srv->wasted_prefill_tokens;
}

/* A SIGTERM drain ends when no request is left (none queued for compute,
 * none writing or waiting on a peer). */
static int epd_prefill_idle(void *arg)
{
    epd_prefill_srv_t *srv = arg;

    return epd_reqtab_count(&srv->reqs) == 0;
}

/* The role on a created daemon: the local pool, the embedding region, the
 * request tables, the compute thread (which takes the engine), what the
 * control plane says.  EPD_OK or the failure (logged). */
static epd_status_t epd_prefill_setup(void *arg, epd_daemon_t *d)
{
    epd_prefill_srv_t *srv = arg;
    const epd_engine_info_t *info = srv->info;
    char pattern[EPD_LAYOUT_PATTERN_MAX];
    epd_daemon_capacity_t cap;
    Epd__KvLayout lm;
    epd_status_t st;

    srv->d = d;
    srv->trace = epd_daemon_trace(d);
    epd__prefill_metrics_init(srv);
    epd_daemon_set_metrics(d, epd__prefill_metrics_render, srv);
    /* the local KV pool (the writes' source) and the embedding region
     * (the encoders' landing zone), both registered on the transport */
    st = epd__prefill_pool_init(srv, srv->engine);
    if (st != EPD_OK) {
        return st;
    }
    st = epd__prefill_cache_init(srv, srv->engine_name);
    if (st != EPD_OK) {
        return st;
    }
    st = epd__prefill_media_init(srv);
    if (st != EPD_OK) {
        return st;
    }
    st = epd__prefill_reqs_init(srv);
    if (st == EPD_OK) {
        st = epd__prefill_ids_init(srv);
    }
    if (st != EPD_OK) {
        epd_log_error(EPD_PREFILL_LOG, 0, "out of memory");
        return st;
    }
    st = epd_prefill_compute_create(
        epd_daemon_loop(srv->d), srv->engine, &srv->pool, srv->state_slots,
        srv->embed_slots > 0 ? EPD_PREFILL_MEDIA_MAX : 0, srv->compute_nice,
        epd__prefill_req_on_event, srv, &srv->compute);
    if (st != EPD_OK) {
        return st;
    }
    srv->engine = NULL; /* the compute thread owns it now */
    epd_prefill_compute_set_chunk(srv->compute, srv->chunk_tokens);
    memset(&cap, 0, sizeof(cap));
    cap.kv_blocks_total = srv->kv_blocks;
    cap.block_tokens = info->kv.block_tokens;
    cap.state_slots_total = srv->state_slots;
    cap.max_batch = 1; /* one prefill at a time on the compute thread */
    cap.max_context = info->max_context;
    cap.embed_slots = srv->embed_slots;
    cap.image_embeddings = srv->embed_slots > 0 ? info->image_embeddings : 0;
    cap.embed_dim = srv->embed_slots > 0 ? info->embed_dim : 0;
    epd_daemon_set_capacity(srv->d, &cap);
    epd_daemon_set_kv_layout(srv->d, &info->kv);
    epd_layout_to_msg(&info->kv, &lm, pattern);
    epd_log_info(EPD_PREFILL_LOG, 0,
                 "serving model '%s' (%u layers '%.40s', vocab %u, context %u): pool %u blocks x "
                 "%u tokens + %u slots (%llu bytes), lease %u ms",
                 epd_daemon_model_name(srv->d), info->kv.n_layers, pattern, info->vocab_size,
                 info->max_context, srv->kv_blocks, info->kv.block_tokens, srv->state_slots,
                 (unsigned long long)srv->pool.bytes, srv->lease_ms);
    return EPD_OK;
}

/* ops->cleanup: the compute thread is joined and the transport gone (the
 * pool and the embedding region with it): only memory is left */
static void epd_prefill_cleanup(void *arg)
{
    epd_prefill_srv_t *srv = arg;

    epd_prefill_compute_destroy(srv->compute);
    srv->compute = NULL;
    epd_engine_close(srv->engine);
    epd__prefill_reqs_cleanup(srv);
    epd__prefill_ids_cleanup(srv);
    epd__prefill_media_cleanup(srv);
    epd__prefill_cache_cleanup(srv);
    epd__prefill_pool_cleanup(srv);
}

static const epd_daemon_ops_t epd_prefill_ops = {
    .on_msg = epd__prefill_on_msg,
    .on_link_down = epd_daemon_op_link_down_none, /* requests hold their client's link */
    .on_peer_dead = epd__prefill_req_on_peer_dead,
    .on_peer_closed = epd__prefill_req_on_peer_closed, /* an encoder's quarantined slots */
    .on_pump = epd__prefill_req_on_pump,
    .on_tick = epd__prefill_req_on_tick,
    .load = epd_prefill_load,
    .on_drain = epd_daemon_op_none, /* new requests are refused; running ones finish */
    .on_rpc = epd_daemon_op_rpc_pass,
    .on_stop = epd__prefill_req_on_stop,
    .stopped = epd_daemon_op_stopped_now,
    .idle = epd_prefill_idle,
    .on_exit = epd_prefill_on_exit,
    .setup = epd_prefill_setup,
    .cleanup = epd_prefill_cleanup,
};

static int epd_prefill_run(const epd_daemon_flags_t *dfl, void *arg)
{
    const epd_prefill_flags_t *fl = arg;
    epd_daemon_config_t dc;
    epd_prefill_srv_t srv;

    memset(&srv, 0, sizeof(srv));
    srv.kv_blocks = (uint32_t)fl->kv_blocks;
    srv.state_slots = (uint32_t)fl->state_slots;
    srv.lease_ms = (uint32_t)fl->lease_ms;
    srv.write_group_bytes = (uint64_t)fl->write_group_bytes;
    srv.write_chunk_bytes = (uint64_t)fl->write_chunk_bytes;
    srv.layer_notify = fl->layer_notify;
    srv.embed_slots = (uint32_t)fl->embed_slots;
    srv.max_image_pixels = (uint64_t)fl->max_image_pixels;
    srv.prefix_cache = fl->prefix_cache;
    srv.kv_prefault = fl->kv_prefault;
    srv.compute_nice = (int)fl->compute_nice;
    srv.ckpt_every = (uint32_t)fl->ckpt_every;
    srv.ckpt_budget = (uint64_t)fl->ckpt_bytes;
    srv.replay_budget = (uint32_t)fl->replay_tokens;
    srv.hold_under_pressure = fl->hold_under_pressure;
    if (fl->kv_disk == NULL && (fl->kv_disk_bytes >= 0 || fl->kv_disk_persist)) {
        fprintf(stderr, "epd-prefill: --kv-disk-bytes and --kv-disk-persist need --kv-disk DIR\n");
        return 2;
    }
    if (fl->kv_disk != NULL && fl->kv_disk[0] == '\0') {
        fprintf(stderr, "epd-prefill: --kv-disk needs a directory\n");
        return 2;
    }
    srv.tier_host_bytes = (uint64_t)fl->kv_host_bytes;
    srv.tier_dir = fl->kv_disk;
    srv.tier_disk_bytes = fl->kv_disk == NULL       ? 0
                          : fl->kv_disk_bytes >= 0 ? (uint64_t)fl->kv_disk_bytes
                                                   : (uint64_t)1 << 30;
    srv.tier_persist = fl->kv_disk_persist;
    srv.tier_level = (int)fl->kv_tier_level;
    /* the model (blocking: before the loop runs) */
    if (epd_daemon_engine_open(dfl, EPD_PREFILL_LOG, (uint32_t)fl->block_tokens, 1, &srv.engine) !=
        EPD_OK) {
        return 1;
    }
    srv.info = epd_engine_info(srv.engine);
    srv.engine_name = epd_engine_name(srv.engine);
    srv.chunk_tokens = fl->chunk_tokens >= 0 ? (uint32_t)fl->chunk_tokens
                                             : epd_prefill_chunk_default(srv.engine_name);
    epd_log_info(EPD_PREFILL_LOG, 0, "chunked prefill: %s%u tokens per chunk",
                 srv.chunk_tokens == 0 ? "off, " : "", srv.chunk_tokens);

    memset(&dc, 0, sizeof(dc));
    dc.role_name = EPD_PREFILL_LOG;
    dc.role = EPD__ROLE__ROLE_PREFILL;
    dc.flags = dfl;
    dc.with_xport = 1;
    /* images may come inline (a cluster without encoders): room for them */
    dc.max_msg_size = srv.info->image_embeddings > 0 && srv.embed_slots > 0 ? EPD_PREFILL_MSG_IMAGES
                                                                            : EPD_PREFILL_MSG_TEXT;
    /* a prompt as long as the model's window fits one GenerateRequest */
    if (epd_msg_cap_for_context(srv.info->max_context) > dc.max_msg_size) {
        dc.max_msg_size = epd_msg_cap_for_context(srv.info->max_context);
    }
    dc.max_inflight = (uint32_t)fl->max_inflight_writes;
    dc.ops = &epd_prefill_ops;
    dc.arg = &srv;
    return epd_daemon_run(&dc);
}

int main(int argc, char **argv)
{
    epd_prefill_flags_t fl = {
        .kv_blocks = 2048,
        .state_slots = 64,
        .block_tokens = 16,
        .lease_ms = 5000,
        /* a window, not a pool: with 4096 a chunked 32k-token dense-70b
         * prompt over ucx-shm had 360 writes in flight and the first ones'
         * completions (and the LayerDones fenced behind them) came 110 ms
         * late, all in one burst; decode verified nothing before
         * PrefillComplete (epd-bench overhead B-A +79 ms there, +26 ms
         * with 16 or 64; 4096-token rows 1.5 / 0.64 / 0.32 ms) */
        .max_inflight_writes = 16,
        .write_group_bytes = EPD_PREFILL_WRITE_GROUP_DEFAULT,
        .write_chunk_bytes = EPD_PREFILL_WRITE_CHUNK_DEFAULT,
        .layer_notify = 1,
        .embed_slots = 64,
        .max_image_pixels = (int64_t)EPD_IMAGE_MAX_PIXELS_DEFAULT,
        .prefix_cache = 1,
        .kv_prefault = 1,
        .compute_nice = EPD_PREFILL_COMPUTE_NICE,
        .ckpt_every = 16,
        .ckpt_bytes = 64 << 20,
        .replay_tokens = 256,
        .hold_under_pressure = 1,
        .kv_host_bytes = 256 << 20,
        .kv_disk = NULL,
        .kv_disk_bytes = -1,
        .kv_disk_persist = 0,
        .kv_tier_level = EPD_PREFILL_TIER_LEVEL_DEFAULT,
        .chunk_tokens = -1,
    };
    const epd_opt_t opts[] = {
        {"kv-blocks", EPD_OPT_INT, &fl.kv_blocks, 1, 1 << 24, "local KV blocks"},
        {"state-slots", EPD_OPT_INT, &fl.state_slots, 1, 1 << 16,
         "local recurrent-state slots = requests in flight at most"},
        {"block-tokens", EPD_OPT_INT, &fl.block_tokens, 1, 4096, "tokens per KV block"},
        {"lease-ms", EPD_OPT_INT, &fl.lease_ms, 1, 3600000,
         "drop a request whose KV reservation has not come this long after its prefill"},
        {"max-inflight-writes", EPD_OPT_INT, &fl.max_inflight_writes, 1, 1 << 24,
         "KV writes (each at most --write-chunk-bytes) in flight at once; more wait until "
         "earlier ones complete"},
        {"write-group-bytes", EPD_OPT_INT, &fl.write_group_bytes, 0, (int64_t)1 << 40,
         "while compute runs, post finished layers' writes once this many bytes wait "
         "(0: every layer as it finishes)"},
        {"write-chunk-bytes", EPD_OPT_INT, &fl.write_chunk_bytes, 4096, (int64_t)1 << 32,
         "longest KV write; one pass of the loop posts at most this many bytes before it "
         "handles its other events again"},
        {"layer-notify", EPD_OPT_BOOL, &fl.layer_notify, 0, 0,
         "after each layer's writes send decode a LayerDone fenced behind them, so it "
         "verifies that layer at once (--no-layer-notify: verification only after "
         "PrefillComplete)"},
        {"embed-slots", EPD_OPT_INT, &fl.embed_slots, 0, 1 << 16,
         "images whose embeddings this worker holds at once: the landing zone of the encoders' "
         "writes and the embedding cache (0: no images)"},
        {"max-image-pixels", EPD_OPT_INT, &fl.max_image_pixels, 1, (int64_t)1 << 40,
         "width x height limit of an image this worker decodes itself (no encoder pool)"},
        {"compute-nice", EPD_OPT_INT, &fl.compute_nice, -19, 19,
         "added to the compute thread's nice value (Linux, that thread only): it drives the "
         "device, and a late wake-up ends a chunk late; below 0 needs CAP_SYS_NICE (without "
         "it the thread keeps the daemon's, said at info level)"},
        {"kv-prefault", EPD_OPT_BOOL, &fl.kv_prefault, 0, 0,
         "commit the KV pool's memory at start, before ready (as a device allocates its KV "
         "cache up front); --no-kv-prefault: each page on its first write, inside that "
         "request's compute"},
        {"prefix-cache", EPD_OPT_BOOL, &fl.prefix_cache, 0, 0,
         "keep full prompt blocks after their request and compute only what a new prompt "
         "does not share with a cached one (--no-prefix-cache: compute every prompt whole)"},
        {"prefix-ckpt-every", EPD_OPT_INT, &fl.ckpt_every, 0, 1 << 20,
         "hybrid models: checkpoint the recurrent state every this many blocks (0: only at "
         "each prompt's last full block)"},
        {"prefix-ckpt-bytes", EPD_OPT_INT, &fl.ckpt_bytes, 0, (int64_t)1 << 40,
         "hybrid models: memory for recurrent-state checkpoints"},
        {"prefix-replay-tokens", EPD_OPT_INT, &fl.replay_tokens, 0, 1 << 24,
         "hybrid models: tokens a hit may replay from its checkpoint to rebuild the state; "
         "a longer replay cuts the hit back to the checkpoint"},
        {"hold-under-pressure", EPD_OPT_BOOL, &fl.hold_under_pressure, 0, 0,
         "once a decode worker refused a reservation (within the last lease), start a prompt's "
         "compute only when its reservation is in (proto/README.md rule 34; "
         "--no-hold-under-pressure: always at once, before the reservation)"},
        {"kv-host-bytes", EPD_OPT_INT, &fl.kv_host_bytes, 0, (int64_t)1 << 44,
         "prefix cache: compressed bytes of evicted KV blocks kept in host memory (0: none; "
         "docs/prefix-cache.md)"},
        {"kv-disk", EPD_OPT_STRING, &fl.kv_disk, 0, 0,
         "prefix cache: a directory where blocks the host tier evicts go (one file per block)"},
        {"kv-disk-bytes", EPD_OPT_INT, &fl.kv_disk_bytes, -1, (int64_t)1 << 50,
         "bytes of --kv-disk files at most, oldest deleted first (-1: 1 GiB)"},
        {"kv-disk-persist", EPD_OPT_BOOL, &fl.kv_disk_persist, 0, 0,
         "keep --kv-disk files at exit and use those of earlier runs of the same model and "
         "layout (without it they are removed)"},
        {"kv-tier-level", EPD_OPT_INT, &fl.kv_tier_level, 1, 19,
         "zstd level of the host and disk tier"},
        {"prefill-chunk-tokens", EPD_OPT_INT, &fl.chunk_tokens, -1, 1 << 24,
         "compute a prompt's uncached part in chunks of at most this many tokens, one chunk "
         "per turn, round robin with the other prompts (0: whole prompts; default -1: the "
         "engine's, " EPD_PREFILL_CHUNK_DEFAULTS ")"},
    };
    return epd_daemon_main("epd-prefill",
                           "prefill worker: prompts in, KV streamed to decode per layer",
                           EPD_DAEMON_FLAG_REGISTER, opts, sizeof(opts) / sizeof(opts[0]),
                           epd_prefill_run, &fl, argc, argv);
}
