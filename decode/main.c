/*
 * main.c — `epd-decode`: the decode daemon.
 *
 * Reserves KV blocks for each request, lets a prefill worker write the
 * prompt's KV into them (one-sided), verifies it, and generates the rest of
 * the tokens in a continuous batch, streaming them to the client
 * (proto/README.md rules 3-11; decode/README.md tells the story).  What
 * every daemon does the same way — loop, transport, control plane,
 * registration, signals, ready file, trace, the stop order — is daemon/'s;
 * this file turns flags into the role: the engine, the registered KV pool
 * and its packed key, the block allocator, the compute thread and its
 * wake-up, and the callbacks the runtime calls.
 *
 * Threads: the loop thread (the daemon runtime's, owning every request and
 * block), the compute thread (epd_decode_batch: the engine, the batch),
 * gRPC's and the registrar's own (hidden in daemon/).
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"

#include "epd_decode_int.h"
#include "epd_kv_stamp.h"
#include "epd_kvq.h"
#include "epd_log.h"
#include "epd_msg.h"

typedef struct {
    int64_t kv_blocks;
    int64_t state_slots;
    int64_t block_tokens;
    int64_t max_batch;
    int64_t lease_ms;
    int prefix_cache;
    int kv_prefault;
    const char *kv_reserve;
    int64_t kv_headroom_tokens;
    const char *verify;
} epd_decode_flags_t;

/* The parsed role flags (main owns them; setup reads them). */
static const epd_decode_flags_t *epd_decode_fl;

/* Compute thread: sequences were queued for the loop. */
static void epd_decode_wake(void *arg)
{
    epd_decode_srv_t *srv = arg;

    uv_async_send(&srv->wake);
}

static void epd_decode_on_wake(uv_async_t *h)
{
    epd__decode_req_on_batch(h->data);
}

/* Shutdown step 5 (daemon/epd_daemon.h): the compute thread reads the KV
 * pool, so it is joined before the transport frees the pool. */
static void epd_decode_on_exit(void *arg)
{
    epd_decode_srv_t *srv = arg;

    epd_decode_batch_destroy(srv->batch);
    srv->batch = NULL;
    epd_decode_verify_destroy(srv->verify); /* it reads the pool too */
    srv->verify = NULL;
    if (srv->wake_ready) {
        uv_close((uv_handle_t *)&srv->wake, NULL);
        srv->wake_ready = 0;
    }
}

/* The KV pool, registered for the prefill workers' writes, and its key. */
static epd_status_t epd_decode_pool(epd_decode_srv_t *srv, const epd_decode_flags_t *fl,
                                    uint32_t n_slots)
{
    uint64_t bytes = epd_kv_pool_bytes(&srv->info->kv, (uint32_t)fl->kv_blocks, n_slots);
    epd_status_t st;

    if (bytes == 0 || bytes > SIZE_MAX) {
        epd_log_error(EPD_DECODE_LOG, 0, "KV pool of %lld blocks and %u slots is too large",
                      (long long)fl->kv_blocks, n_slots);
        return EPD_ERR_INVALID_PARAM;
    }
    /* prefill workers write into it; nothing else is remotely possible */
    st = epd_xport_mr_alloc_ex(epd_daemon_xport(srv->d), (size_t)bytes, EPD_XPORT_MR_REMOTE_WRITE,
                               &srv->mr);
    if (st != EPD_OK) {
        epd_log_error(EPD_DECODE_LOG, 0, "cannot allocate the KV pool (%llu bytes): %s",
                      (unsigned long long)bytes, epd_status_string(st));
        return st;
    }
    /* the fence: writes that reach this worker's check land only in blocks
     * reserved for a request of their writer (epd_decode_fence.c); each
     * writer gets a key of its own (epd_peer_grant, in KvReservation) */
    epd_xport_mr_set_check(srv->mr, epd__decode_fence_check, srv);
    st = epd_xport_mr_pack(srv->mr, srv->rkey, sizeof(srv->rkey), &srv->rkey_len);
    if (st != EPD_OK) {
        epd_log_error(EPD_DECODE_LOG, 0, "cannot pack the KV pool's key: %s",
                      epd_status_string(st));
        return st;
    }
    srv->pool.base = epd_xport_mr_addr(srv->mr);
    srv->pool.bytes = epd_xport_mr_size(srv->mr);
    epd_daemon_kv_prefault(fl->kv_prefault, EPD_DECODE_LOG, srv->pool.base, srv->pool.bytes);
    srv->pool.n_blocks = (uint32_t)fl->kv_blocks;
    srv->pool.n_state_slots = n_slots;
    if (epd_engine_check_pool(srv->engine, &srv->pool) != EPD_OK) {
        epd_log_error(EPD_DECODE_LOG, 0, "the engine refuses the KV pool");
        return EPD_ERR_INVALID_PARAM;
    }
    return EPD_OK;
}

/* The role on a created daemon: the pool, the allocator, the table, the
 * compute thread.  EPD_OK or the failure (logged). */
static epd_status_t epd_decode_setup(epd_decode_srv_t *srv, const epd_decode_flags_t *fl)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    uint32_t n_slots = kv->n_linear_layers > 0 ? (uint32_t)fl->state_slots : 0;
    epd_daemon_capacity_t cap;
    char desc[256];
    char map[256];
    epd_status_t st;

    st = epd_decode_pool(srv, fl, n_slots);
    if (st != EPD_OK) {
        return st;
    }
    epd_layout_to_msg(kv, &srv->layout_msg, srv->pattern);
    srv->newly = epd_calloc((size_t)kv->n_layers + 1, 1);
    if (srv->newly == NULL ||
        epd_decode_blocks_create(srv->pool.n_blocks, n_slots, &srv->blocks) != EPD_OK ||
        epd__decode_reqs_init(srv) != EPD_OK) {
        epd_log_error(EPD_DECODE_LOG, 0, "out of memory");
        return EPD_ERR_NO_MEMORY;
    }
    srv->prefix_cache = fl->prefix_cache;
    st = epd__decode_cache_init(srv, epd_engine_name(srv->engine));
    if (st != EPD_OK) {
        return st;
    }
    {
        epd_msg_epoch_t ep = epd_daemon_epoch(srv->d);

        srv->stamp_tag = epd_kv_stamp_tag(ep.start_time_ns, ep.nonce);
    }
    /* every live request holds a block and lends at most a check per layer */
    st = epd_decode_verify_create(epd_daemon_loop(srv->d), srv->info, &srv->pool,
                                  srv->pool.n_blocks * (kv->n_layers > 0 ? kv->n_layers : 1),
                                  srv->trace, epd__decode_req_on_verified, srv, &srv->verify);
    if (st != EPD_OK) {
        epd_log_error(EPD_DECODE_LOG, 0, "cannot start the verifier thread: %s",
                      epd_status_string(st));
        return st;
    }
    uv_async_init(epd_daemon_loop(srv->d), &srv->wake, epd_decode_on_wake);
    srv->wake.data = srv;
    srv->wake_ready = 1;
    st = epd_decode_batch_create(srv->engine, &srv->pool, srv->max_batch, EPD_DECODE_JOIN_QUEUE,
                                 epd_decode_wake, srv, &srv->batch);
    if (st != EPD_OK) {
        epd_log_error(EPD_DECODE_LOG, 0, "cannot start the compute thread: %s",
                      epd_status_string(st));
        return st;
    }
    memset(&cap, 0, sizeof(cap));
    cap.kv_blocks_total = srv->pool.n_blocks;
    cap.block_tokens = kv->block_tokens;
    cap.state_slots_total = n_slots;
    cap.max_batch = srv->max_batch;
    cap.max_context = srv->info->max_context;
    cap.kv_headroom_tokens = srv->headroom;
    epd_daemon_set_capacity(srv->d, &cap);
    epd_daemon_set_kv_layout(srv->d, kv);
    epd_xport_describe(epd_daemon_xport(srv->d), desc, sizeof(desc));
    epd_kvq_map_format(kv, map, sizeof(map));
    epd_log_info(EPD_DECODE_LOG, 0,
                 "pool: %u blocks of %u tokens (%llu tokens; %llu bytes a block over all layers, "
                 "KV dtype %s), %u state slots, "
                 "%llu bytes; layers %s; batch up to %u; lease %u ms; verify %s; KV %s (headroom "
                 "%u tokens); transport %s",
                 srv->pool.n_blocks, kv->block_tokens,
                 (unsigned long long)srv->pool.n_blocks * kv->block_tokens,
                 (unsigned long long)epd_kv_block_set_bytes(kv), map, n_slots,
                 (unsigned long long)srv->pool.bytes, srv->pattern, srv->max_batch, srv->lease_ms,
                 srv->verify_full ? "full" : "stamps",
                 srv->headroom > 0 ? "on demand" : "reserved up front", srv->headroom, desc);
    return EPD_OK;
}

/* ops->setup: the daemon exists (loop, transport) */
static epd_status_t epd_decode_on_setup(void *arg, epd_daemon_t *d)
{
    epd_decode_srv_t *srv = arg;

    srv->d = d;
    srv->trace = epd_daemon_trace(d);
    epd__decode_metrics_init(srv);
    epd_daemon_set_metrics(d, epd__decode_metrics_render, srv);
    return epd_decode_setup(srv, epd_decode_fl);
}

/* ops->cleanup: the compute thread is joined and every endpoint closed (the
 * pool went with the transport): only memory is left */
static void epd_decode_on_cleanup(void *arg)
{
    epd_decode_srv_t *srv = arg;

    epd_decode_on_exit(srv);
    epd__decode_reqs_cleanup(srv);
    epd__decode_cache_cleanup(srv);
    epd_free(srv->newly);
    epd_decode_blocks_destroy(srv->blocks);
    epd_engine_close(srv->engine);
}

/* ops->load: what Health, Status and the heartbeats report. */
static void epd_decode_load(void *arg, epd_daemon_load_t *load_p)
{
    epd_decode_srv_t *srv = arg;

    load_p->queue_depth =
        srv->n_ready + (srv->batch != NULL ? epd_decode_batch_queued(srv->batch) : 0);
    /* while preempted requests wait to resume (or running ones to grow),
     * no block is free for a new request: the router sees a full pool */
    load_p->kv_blocks_free = srv->n_hungry > 0 || srv->pre_head != NULL
                                 ? 0
                                 : epd_decode_blocks_free(srv->blocks) +
                                       epd__decode_cache_evictable(srv);
    epd__decode_cache_stats(srv, &load_p->prefix);
    load_p->state_slots_free = epd_decode_blocks_slots_free(srv->blocks);
    load_p->running_requests = srv->batch != NULL ? epd_decode_batch_running(srv->batch) : 0;
    load_p->kv_bytes_received = srv->kv_bytes_received;
    load_p->quarantined = epd_decode_blocks_count(srv->blocks, EPD_DECODE_BLK_QUARANTINED);
    load_p->preemptions = srv->preemptions;
    load_p->recomputed_tokens = srv->recomputed_tokens;
}

/* ops->on_stop: new requests see epd_daemon_stopping; a last word. */
static void epd_decode_on_stop(void *arg)
{
    epd_decode_srv_t *srv = arg;

    /* the daemon logged the counts; what only decode knows */
    epd_log_info(EPD_DECODE_LOG, 0,
                 "%u requests live, %u blocks quarantined; %llu preemptions, %llu tokens "
                 "recomputed",
                 epd_reqtab_count(&srv->reqs),
                 epd_decode_blocks_count(srv->blocks, EPD_DECODE_BLK_QUARANTINED),
                 (unsigned long long)srv->preemptions, (unsigned long long)srv->recomputed_tokens);
}

/* A SIGTERM drain ends when no request is left (reserved, receiving KV,
 * waiting for the batch or decoding). */
static int epd_decode_idle(void *arg)
{
    epd_decode_srv_t *srv = arg;

    return epd_reqtab_count(&srv->reqs) == 0;
}

static const epd_daemon_ops_t epd_decode_ops = {
    .on_msg = epd__decode_on_msg,
    .on_link_down = epd__decode_req_on_link_down, /* a client's: abort its requests */
    .on_peer_dead = epd__decode_req_on_peer_dead,
    .on_peer_closed = epd__decode_req_on_peer_closed, /* its quarantined blocks come back */
    .on_pump = epd__decode_req_on_pump,
    .on_tick = epd__decode_req_on_tick, /* leases, deadlines, Abort re-sends */
    .load = epd_decode_load,
    .on_drain = epd_daemon_op_none, /* new requests see epd_daemon_draining */
    .on_rpc = epd_daemon_op_rpc_pass,
    .on_stop = epd_decode_on_stop,
    .stopped = epd_daemon_op_stopped_now,
    .idle = epd_decode_idle,
    .on_exit = epd_decode_on_exit,
    .setup = epd_decode_on_setup,
    .cleanup = epd_decode_on_cleanup,
};

static int epd_decode_run(const epd_daemon_flags_t *dfl, void *arg)
{
    epd_daemon_config_t dc;
    epd_decode_srv_t srv;

    epd_decode_fl = arg;
    memset(&srv, 0, sizeof(srv));
    if (strcmp(epd_decode_fl->kv_reserve, "on-demand") == 0) {
        srv.headroom = (uint32_t)epd_decode_fl->kv_headroom_tokens;
    } else if (strcmp(epd_decode_fl->kv_reserve, "upfront") != 0) {
        epd_log_error(EPD_DECODE_LOG, 0, "--kv-reserve '%s': want upfront or on-demand",
                      epd_decode_fl->kv_reserve);
        return 1;
    }
    srv.lease_ms = (uint32_t)epd_decode_fl->lease_ms;
    srv.max_batch = (uint32_t)epd_decode_fl->max_batch;
    if (strcmp(epd_decode_fl->verify, "full") == 0) {
        srv.verify_full = 1;
    } else if (strcmp(epd_decode_fl->verify, "stamps") != 0) {
        epd_log_error(EPD_DECODE_LOG, 0, "--verify %s: stamps or full", epd_decode_fl->verify);
        return 1;
    }
    /* the model (blocking: before the loop runs) */
    if (epd_daemon_engine_open(dfl, EPD_DECODE_LOG, (uint32_t)epd_decode_fl->block_tokens,
                               srv.max_batch, &srv.engine) != EPD_OK) {
        return 1;
    }
    srv.info = epd_engine_info(srv.engine);
    if (srv.max_batch > srv.info->max_batch) {
        epd_log_error(EPD_DECODE_LOG, 0, "--max-batch %u exceeds the engine's %u", srv.max_batch,
                      srv.info->max_batch);
        epd_engine_close(srv.engine);
        return 1;
    }
    memset(&dc, 0, sizeof(dc));
    dc.role_name = EPD_DECODE_LOG;
    dc.role = EPD__ROLE__ROLE_DECODE;
    dc.flags = dfl;
    dc.with_xport = 1;
    /* GenerateRequests (and the resumes decode sends) carry the prompt */
    dc.max_msg_size = epd_msg_cap_for_context(srv.info->max_context);
    /* the lease sweep: a lease is noticed within an eighth of it */
    dc.tick_ms = srv.lease_ms / 8 > 10 ? srv.lease_ms / 8 : 10;
    dc.ops = &epd_decode_ops;
    dc.arg = &srv;
    return epd_daemon_run(&dc);
}

int main(int argc, char **argv)
{
    epd_decode_flags_t fl = {
        .kv_blocks = 4096,
        .state_slots = 256,
        .block_tokens = 16,
        .max_batch = 32,
        .lease_ms = 5000,
        .prefix_cache = 1,
        .kv_prefault = 1,
        .kv_reserve = "on-demand",
        .kv_headroom_tokens = 16,
        .verify = "stamps",
    };
    const epd_opt_t opts[] = {
        {"kv-blocks", EPD_OPT_INT, &fl.kv_blocks, 1, 1 << 24, "KV blocks in the pool"},
        {"state-slots", EPD_OPT_INT, &fl.state_slots, 1, 1 << 20,
         "recurrent-state slots (models with linear-attention layers)"},
        {"block-tokens", EPD_OPT_INT, &fl.block_tokens, 1, 4096, "tokens per KV block"},
        {"max-batch", EPD_OPT_INT, &fl.max_batch, 1, 4096, "largest decode batch"},
        {"lease-ms", EPD_OPT_INT, &fl.lease_ms, 10, 3600000,
         "fail a reservation whose prefill worker says nothing about it this long (up to 4 "
         "leases while it speaks about others); quarantined blocks re-send their Abort as often"},
        {"kv-prefault", EPD_OPT_BOOL, &fl.kv_prefault, 0, 0,
         "commit the KV pool's memory at start, before ready (as a device allocates its KV "
         "cache up front); --no-kv-prefault: each page when the first write lands in it"},
        {"prefix-cache", EPD_OPT_BOOL, &fl.prefix_cache, 0, 0,
         "keep a finished request's full prompt blocks; a later prompt that starts with them "
         "(the next turn of a chat) gets them back and prefill does not write them again "
         "(--no-prefix-cache: every prompt block is written)"},
        {"kv-reserve", EPD_OPT_STRING, &fl.kv_reserve, 0, 0,
         "on-demand: a request holds its prompt's blocks plus --kv-headroom-tokens and grows as "
         "it generates; when the pool runs dry the newest requests are preempted and prefilled "
         "again later (proto/README.md rules 30-33); upfront: prompt + max_tokens reserved at "
         "admission"},
        {"kv-headroom-tokens", EPD_OPT_INT, &fl.kv_headroom_tokens, 1, 1 << 20,
         "on-demand: tokens of room a request keeps ahead of its generation"},
        {"verify", EPD_OPT_STRING, &fl.verify, 0, 0,
         "checks of stamped KV (checksum kind STAMPED, the sim engine): stamps (every unit's "
         "stamps and the checksum over them; the bodies are the modelled device's) or full "
         "(every byte hashed too); KV of kind BYTES (ref) is always hashed whole"},
    };
    return epd_daemon_main("epd-decode",
                           "decode worker: KV reservations, continuous batching, token streams",
                           EPD_DAEMON_FLAG_REGISTER, opts, sizeof(opts) / sizeof(opts[0]),
                           epd_decode_run, &fl, argc, argv);
}
