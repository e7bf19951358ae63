/*
 * epd_ctl_control.c — epd-ctl's control-plane commands (health, status,
 * workers, drain, probe), the cluster secret their calls are signed with,
 * and the names and one-line failure epd_ctl.c shares.  Calls nothing in
 * epd_ctl.c (one way: the command line and submit call down into here).
 */
#include "epd_ctl_control.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "epd_alloc.h"
#include "epd_client.h"
#include "epd_grpc_health.pb-c.h"
#include "epd_config.h"
#include "epd_engine.h"
#include "epd_log.h"
#include "epd_msg.h"
#include "epd_rpc.h"
#include "epd_secret.h"
#include "epd_utf8.h"

/* --cluster-secret-file of a control command (len 0: none); wiped at exit */
epd_secret_t epd_ctl_secret;

int epd_ctl_fail(const char *what)
{
    fprintf(stderr, "epd-ctl: %s\n", what);
    return 1;
}

const char *epd_ctl_role_name(int role)
{
    switch (role) {
    case EPD__ROLE__ROLE_ENCODER:
        return "encoder";
    case EPD__ROLE__ROLE_PREFILL:
        return "prefill";
    case EPD__ROLE__ROLE_DECODE:
        return "decode";
    case EPD__ROLE__ROLE_ROUTER:
        return "router";
    case EPD__ROLE__ROLE_TOOL:
        return "tool";
    default:
        return "unspecified";
    }
}

const char *epd_ctl_state_name(int state)
{
    switch (state) {
    case EPD__WORKER_STATE__WORKER_STATE_READY:
        return "READY";
    case EPD__WORKER_STATE__WORKER_STATE_DRAINING:
        return "DRAINING";
    case EPD__WORKER_STATE__WORKER_STATE_SUSPECT:
        return "SUSPECT";
    case EPD__WORKER_STATE__WORKER_STATE_DEAD:
        return "DEAD";
    default:
        return "UNSPECIFIED";
    }
}

/* ------------------------------------------------------------- control */

static int ctl_call(const char *addr, const char *method, const void *req, size_t req_len,
                    const ProtobufCMessageDescriptor *desc, ProtobufCMessage **msg_p)
{
    static const unsigned char empty = 0;
    epd_rpc_client_t *rpc = NULL;
    void *resp = NULL;
    size_t resp_len = 0;
    char err[256] = "";
    epd_status_t status;

    status = epd_rpc_client_create(addr, &rpc);
    if (status != EPD_OK) {
        fprintf(stderr, "epd-ctl: cannot open a channel to %s: %s\n", addr,
                epd_status_string(status));
        return 1;
    }
    if (epd_ctl_secret.len > 0) {
        status = epd_rpc_client_set_auth(rpc, epd_ctl_secret.bytes, epd_ctl_secret.len);
        if (status != EPD_OK) {
            epd_rpc_client_destroy(rpc);
            fprintf(stderr, "epd-ctl: cannot use the cluster secret: %s\n",
                    epd_status_string(status));
            return 1;
        }
    }
    status = epd_rpc_call(rpc, method, req, req_len, CTL_RPC_TIMEOUT_MS, &resp, &resp_len, err,
                          sizeof(err));
    epd_rpc_client_destroy(rpc);
    if (status != EPD_OK) {
        fprintf(stderr, "epd-ctl: %s on %s: %s%s%s\n", method, addr, epd_status_name(status),
                err[0] ? ": " : "", err);
        if (status == EPD_ERR_AUTH) {
            fprintf(stderr, "epd-ctl: %s\n",
                    epd_ctl_secret.len == 0
                        ? "the daemon requires the cluster secret: pass --cluster-secret-file PATH "
                          "(the file the daemons were given)"
                        : "the daemon refused this cluster secret: not the daemons' file, or "
                          "the clocks differ by more than 30 s");
        }
        epd_free(resp);
        return 1;
    }
    status = epd_proto_unpack(desc, resp_len > 0 ? resp : &empty, resp_len, msg_p);
    epd_free(resp);
    if (status != EPD_OK) {
        fprintf(stderr, "epd-ctl: %s on %s: the answer does not decode\n", method, addr);
        return 1;
    }
    return 0;
}

static void ctl_print_load(const char *sep, const Epd__Load *l)
{
    if (l == NULL) {
        return;
    }
    printf("queue_depth=%u%squeued_tokens=%llu%skv_blocks_free=%u%sstate_slots_free=%u%s"
           "running_requests=%u%spreemptions=%llu%srecomputed_tokens=%llu%s",
           l->queue_depth, sep, (unsigned long long)l->queued_tokens, sep, l->kv_blocks_free, sep,
           l->state_slots_free, sep, l->running_requests, sep,
           (unsigned long long)l->preemptions, sep, (unsigned long long)l->recomputed_tokens,
           sep);
    printf("kv_bytes_sent=%llu%skv_bytes_received=%llu%s", (unsigned long long)l->kv_bytes_sent,
           sep, (unsigned long long)l->kv_bytes_received, sep);
    if (l->prefix != NULL && l->prefix->requests > 0) {
        const Epd__PrefixCacheStats *p = l->prefix;

        printf("prefix_requests=%llu%sprefix_prompt_tokens=%llu%sprefix_hit_tokens=%llu%s"
               "prefix_computed_tokens=%llu%sprefix_replayed_tokens=%llu%sprefix_replay_cut=%llu%s"
               "prefix_checkpoints_taken=%llu%sprefix_checkpoints_restored=%llu%s"
               "prefix_checkpoints_dropped=%llu%sprefix_evictions=%llu%sprefix_cached_blocks=%llu%s"
               "prefix_checkpoints_held=%llu%s",
               (unsigned long long)p->requests, sep, (unsigned long long)p->prompt_tokens, sep,
               (unsigned long long)p->hit_tokens, sep, (unsigned long long)p->computed_tokens, sep,
               (unsigned long long)p->replayed_tokens, sep, (unsigned long long)p->replay_cut, sep,
               (unsigned long long)p->checkpoints_taken, sep,
               (unsigned long long)p->checkpoints_restored, sep,
               (unsigned long long)p->checkpoints_dropped, sep, (unsigned long long)p->evictions,
               sep, (unsigned long long)p->cached_blocks, sep,
               (unsigned long long)p->checkpoints_held, sep);
        printf("prefix_tier_stored=%llu%sprefix_tier_spilled=%llu%sprefix_tier_restored_host=%llu%s"
               "prefix_tier_restored_disk=%llu%sprefix_tier_restore_us=%llu%s"
               "prefix_tier_checksum_failures=%llu%sprefix_tier_refused_files=%llu%s"
               "prefix_tier_dropped=%llu%sprefix_tier_host_bytes=%llu%sprefix_tier_disk_bytes=%llu%s",
               (unsigned long long)p->tier_stored, sep, (unsigned long long)p->tier_spilled, sep,
               (unsigned long long)p->tier_restored_host, sep,
               (unsigned long long)p->tier_restored_disk, sep,
               (unsigned long long)p->tier_restore_us, sep,
               (unsigned long long)p->tier_checksum_failures, sep,
               (unsigned long long)p->tier_refused_files, sep, (unsigned long long)p->tier_dropped,
               sep, (unsigned long long)p->tier_host_bytes, sep,
               (unsigned long long)p->tier_disk_bytes, sep);
    }
}

static void ctl_print_capacity(const char *sep, const Epd__Capacity *cap)
{
    if (cap == NULL) {
        return;
    }
    /* kv_tokens_total: what the pool holds in tokens (its blocks are of
     * the KV dtype map's size: --kv-blocks int8 blocks hold as many tokens
     * as f32 ones, in a quarter of the memory) */
    printf("kv_blocks_total=%u%sblock_tokens=%u%skv_tokens_total=%llu%sstate_slots_total=%u%s"
           "max_batch=%u%smax_context=%u%s",
           cap->kv_blocks_total, sep, cap->block_tokens, sep,
           (unsigned long long)cap->kv_blocks_total * cap->block_tokens, sep,
           cap->state_slots_total, sep, cap->max_batch, sep, cap->max_context, sep);
}

static void ctl_print_identity(const char *sep, const Epd__WorkerIdentity *w)
{
    if (w == NULL) {
        return;
    }
    printf("worker=%s%srole=%s%smodel=%s%s", w->worker_id, sep, epd_ctl_role_name(w->role), sep,
           w->model, sep);
    if (w->epoch != NULL) {
        printf("epoch=%llu/%016llx%s", (unsigned long long)w->epoch->start_time_ns,
               (unsigned long long)w->epoch->nonce, sep);
    }
}

int epd_ctl_health(const char *addr)
{
    ProtobufCMessage *msg = NULL;
    Epd__HealthResponse *h;

    if (ctl_call(addr, EPD_RPC_HEALTH, NULL, 0, &epd__health_response__descriptor, &msg) != 0) {
        return 1;
    }
    h = (Epd__HealthResponse *)msg;
    printf("serving=%d\ndraining=%d\n", h->serving, h->draining);
    ctl_print_identity("\n", h->worker);
    printf("transport=%s\ndata_plane_address_bytes=%zu\n", h->transport, h->data_plane_address.len);
    printf("control_address=%s\ndata_address=%s\n", h->control_address, h->data_address);
    if (h->kv_layout != NULL) {
        printf("kv_layers=%u\nlayer_pattern=%s\nkv_block_tokens=%u\nkv_heads=%u\nhead_dim=%u\n"
               "kv_dtype=%d\nkv_dtype_map=%s\nblock_bytes=%llu\nstate_bytes=%llu\n",
               h->kv_layout->n_layers, h->kv_layout->layer_pattern, h->kv_layout->block_tokens,
               h->kv_layout->n_kv_heads, h->kv_layout->head_dim, (int)h->kv_layout->dtype,
               h->kv_layout->kv_dtype_map != NULL ? h->kv_layout->kv_dtype_map : "",
               (unsigned long long)h->kv_layout->block_bytes,
               (unsigned long long)h->kv_layout->state_bytes);
    }
    ctl_print_capacity("\n", h->capacity);
    ctl_print_load("\n", h->load);
    epd_proto_free(msg);
    return 0;
}

int epd_ctl_status(const char *addr)
{
    ProtobufCMessage *msg = NULL;
    Epd__StatusResponse *st;

    if (ctl_call(addr, EPD_RPC_STATUS, NULL, 0, &epd__status_response__descriptor, &msg) != 0) {
        return 1;
    }
    st = (Epd__StatusResponse *)msg;
    for (size_t i = 0; i < st->n_workers; i++) {
        const Epd__WorkerStatus *w = st->workers[i];

        ctl_print_identity(" ", w->worker);
        printf("state=%s ", epd_ctl_state_name(w->state));
        ctl_print_load(" ", w->load);
        ctl_print_capacity(" ", w->capacity);
        printf("last_heartbeat_age_ms=%llu control_address=%s data_address=%s",
               (unsigned long long)w->last_heartbeat_age_ms, w->control_address,
               w->data_address);
        if (w->link[0] != '\0') {
            printf(" link=\"%s\"", w->link);
        }
        printf("\n");
    }
    epd_proto_free(msg);
    return 0;
}

/* The class of the router's link to a worker ("tcp: lanes..." -> "tcp"). */
static void ctl_link_class(const char *link, char *out, size_t cap)
{
    size_t n = strcspn(link, ":");

    snprintf(out, cap, "%.*s", (int)n, n > 0 ? link : "-");
}

/* The worker's own links to other workers by class: "tcp=2 shm=1" or "-". */
static void ctl_peer_links(const Epd__Load *l, char *out, size_t cap)
{
    size_t used = 0;

    out[0] = '\0';
    if (l != NULL) {
        const struct {
            const char *name;
            uint32_t n;
        } c[4] = {{"shm", l->links_shm}, {"tcp", l->links_tcp}, {"rdma", l->links_rdma},
                  {"other", l->links_other}};

        for (int i = 0; i < 4; i++) {
            if (c[i].n > 0 && used < cap) {
                used += (size_t)snprintf(out + used, cap - used, "%s%s=%u", used > 0 ? " " : "",
                                         c[i].name, c[i].n);
            }
        }
    }
    if (out[0] == '\0') {
        snprintf(out, cap, "-");
    }
}

/* `workers ROUTER`: the router's Status as a table, one pool after the
 * other, with a count of workers per state, each worker's advertised
 * control address, the class of the router's link to it (LINK) and of its
 * own links to other workers (PEER_LINKS): what each link really uses. */
int epd_ctl_workers(const char *addr)
{
    static const Epd__Role roles[3] = {EPD__ROLE__ROLE_PREFILL, EPD__ROLE__ROLE_DECODE,
                                       EPD__ROLE__ROLE_ENCODER};
    ProtobufCMessage *msg = NULL;
    Epd__StatusResponse *st;

    if (ctl_call(addr, EPD_RPC_STATUS, NULL, 0, &epd__status_response__descriptor, &msg) != 0) {
        return 1;
    }
    st = (Epd__StatusResponse *)msg;
    for (int r = 0; r < 3; r++) {
        unsigned counts[5] = {0};

        for (size_t i = 0; i < st->n_workers; i++) {
            const Epd__WorkerStatus *w = st->workers[i];

            if (w->worker != NULL && w->worker->role == roles[r] && (int)w->state >= 0 &&
                w->state <= 4) {
                counts[w->state]++;
            }
        }
        printf("%s pool: %u READY, %u DRAINING, %u SUSPECT, %u DEAD\n", epd_ctl_role_name(roles[r]),
               counts[1], counts[2], counts[3], counts[4]);
        /* KV_DTYPE last: scripts that read the columns before it keep working */
        printf("  %-24s %-9s %8s %8s %14s %13s %9s  %-22s %-5s %-12s %s\n", "WORKER", "STATE",
               "RUNNING", "QUEUE", "QUEUED_TOKENS", "KV_FREE", "HB_AGE_MS", "ADDRESS", "LINK",
               "PEER_LINKS", "KV_DTYPE");
        for (size_t i = 0; i < st->n_workers; i++) {
            const Epd__WorkerStatus *w = st->workers[i];
            char kv[32];
            char cls[16];
            char peers[96];

            if (w->worker == NULL || w->worker->role != roles[r]) {
                continue;
            }
            if (roles[r] == EPD__ROLE__ROLE_ENCODER) {
                snprintf(kv, sizeof(kv), "-");
            } else {
                snprintf(kv, sizeof(kv), "%u/%u", w->load != NULL ? w->load->kv_blocks_free : 0,
                         w->capacity != NULL ? w->capacity->kv_blocks_total : 0);
            }
            ctl_link_class(w->link, cls, sizeof(cls));
            ctl_peer_links(w->load, peers, sizeof(peers));
            printf("  %-24s %-9s %8u %8u %14llu %13s %9llu  %-22s %-5s %-12s %s\n",
                   w->worker->worker_id,
                   epd_ctl_state_name(w->state), w->load != NULL ? w->load->running_requests : 0,
                   w->load != NULL ? w->load->queue_depth : 0,
                   (unsigned long long)(w->load != NULL ? w->load->queued_tokens : 0), kv,
                   (unsigned long long)w->last_heartbeat_age_ms,
                   w->control_address[0] != '\0' ? w->control_address : "-", cls, peers,
                   w->kv_dtype_map != NULL && w->kv_dtype_map[0] != '\0' ? w->kv_dtype_map : "-");
        }
    }
    epd_proto_free(msg);
    return 0;
}

/* Loads --cluster-secret-file (or else $EPD_CLUSTER_SECRET_FILE) into
 * epd_ctl_secret; 0, or 1 after a message. */
int epd_ctl_load_secret(const char *path)
{
    char why[256];

    if (path == NULL || path[0] == '\0') {
        path = getenv("EPD_CLUSTER_SECRET_FILE");
    }
    if (path == NULL || path[0] == '\0') {
        return 0;
    }
    if (epd_secret_load(path, &epd_ctl_secret, why, sizeof(why)) != EPD_OK) {
        fprintf(stderr, "epd-ctl: --cluster-secret-file: %s\n", why);
        return 1;
    }
    return 0;
}

/* `CMD ADDR [--cluster-secret-file PATH]`: argv[0] is ADDR.  0 on success
 * (the secret loaded when given); 1 after a message; -1 for --help. */
int epd_ctl_control_flags(const char *cmd, int argc, char **argv)
{
    const char *secret_file = NULL;
    char prog[64];
    const epd_opt_t opts[] = {
        {"cluster-secret-file", EPD_OPT_STRING, &secret_file, 0, 0,
         "the cluster secret (the daemons' file): needed for every call but health"},
    };
    epd_opts_t o = {.prog = prog, .summary = "a control-plane call", .opts = opts, .n_opts = 1};
    epd_status_t status;
    int argi;
    int rc;

    snprintf(prog, sizeof(prog), "epd-ctl %s ADDR", cmd);
    status = epd_opts_parse(&o, argc, argv, &argi);
    if (status != EPD_OK) {
        epd_opts_cleanup(&o);
        return status == EPD_ERR_CANCELED ? -1 : 1;
    }
    if (argi != argc) {
        fprintf(stderr, "epd-ctl: %s takes the control address and flags only\n", cmd);
        rc = 1;
    } else {
        rc = epd_ctl_load_secret(secret_file);
    }
    epd_opts_cleanup(&o);
    return rc;
}

/* The worker id a daemon's Health names (Health needs no secret), into
 * id[cap]; 0 on success. */
static int ctl_own_id(const char *addr, char *id, size_t cap)
{
    ProtobufCMessage *msg = NULL;
    Epd__HealthResponse *h;
    int rc = 1;

    if (ctl_call(addr, EPD_RPC_HEALTH, NULL, 0, &epd__health_response__descriptor, &msg) != 0) {
        return 1;
    }
    h = (Epd__HealthResponse *)msg;
    if (h->worker != NULL && h->worker->worker_id != NULL && h->worker->worker_id[0] != '\0' &&
        strlen(h->worker->worker_id) < cap) {
        snprintf(id, cap, "%s", h->worker->worker_id);
        rc = 0;
    } else {
        epd_ctl_fail("drain --self: the Health answer names no worker");
    }
    epd_proto_free(msg);
    return rc;
}

/* --wait-ms: until the worker's Health shows no request running or
 * queued, polled every 200 ms, at most wait_ms; 0 when idle in time. */
static int ctl_wait_idle(const char *addr, int64_t wait_ms)
{
    int64_t waited = 0;

    for (;;) {
        ProtobufCMessage *msg = NULL;
        Epd__HealthResponse *h;
        int idle;

        if (ctl_call(addr, EPD_RPC_HEALTH, NULL, 0, &epd__health_response__descriptor, &msg) !=
            0) {
            return 1; /* gone: nothing left to wait for, but say so */
        }
        h = (Epd__HealthResponse *)msg;
        idle = h->load == NULL || (h->load->running_requests == 0 && h->load->queue_depth == 0);
        epd_proto_free(msg);
        if (idle) {
            printf("idle=1 waited_ms=%lld\n", (long long)waited);
            return 0;
        }
        if (waited >= wait_ms) {
            printf("idle=0 waited_ms=%lld\n", (long long)waited);
            return 1;
        }
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
        waited += 200;
    }
}

int epd_ctl_drain(const char *addr, int argc, char **argv)
{
    const char *worker_id = NULL;
    const char *secret_file = NULL;
    int self = 0;
    int64_t wait_ms = 0;
    char own_id[256];
    const epd_opt_t opts[] = {
        {"worker-id", EPD_OPT_STRING, &worker_id, 0, 0, "the worker's id (must match)"},
        {"self", EPD_OPT_BOOL, &self, 0, 0,
         "drain whichever worker serves ADDR (its id from its Health): for a preStop hook, "
         "where the pod's name is not at hand"},
        {"wait-ms", EPD_OPT_INT, &wait_ms, 0, 86400000,
         "then wait until it runs and queues no request, at most this long (exit 1 if not)"},
        {"cluster-secret-file", EPD_OPT_STRING, &secret_file, 0, 0,
         "the cluster secret (the daemons' file)"},
    };
    epd_opts_t o = {.prog = "epd-ctl drain ADDR",
                    .summary = "stop a worker taking new requests",
                    .opts = opts,
                    .n_opts = 4};
    Epd__DrainRequest req = EPD__DRAIN_REQUEST__INIT;
    ProtobufCMessage *msg = NULL;
    Epd__DrainResponse *d;
    unsigned char *buf = NULL;
    size_t len;
    epd_status_t status;
    int argi;
    int rc = 1;

    status = epd_opts_parse(&o, argc, argv, &argi);
    if (status != EPD_OK) {
        epd_opts_cleanup(&o);
        return status == EPD_ERR_CANCELED ? 0 : 1;
    }
    if (argi != argc || (self != 0) == (worker_id != NULL && worker_id[0] != '\0')) {
        rc = epd_ctl_fail("drain: usage: epd-ctl drain ADDR (--worker-id ID | --self) [--wait-ms MS] "
                      "[--cluster-secret-file F]");
        goto out;
    }
    if (epd_ctl_load_secret(secret_file) != 0) {
        goto out;
    }
    if (self) {
        if (ctl_own_id(addr, own_id, sizeof(own_id)) != 0) {
            goto out;
        }
        worker_id = own_id;
    }
    req.worker_id = (char *)worker_id;
    len = epd__drain_request__get_packed_size(&req);
    buf = epd_malloc(len > 0 ? len : 1);
    if (buf == NULL) {
        rc = epd_ctl_fail("out of memory");
        goto out;
    }
    epd__drain_request__pack(&req, buf);
    if (ctl_call(addr, EPD_RPC_DRAIN, buf, len, &epd__drain_response__descriptor, &msg) != 0) {
        goto out;
    }
    d = (Epd__DrainResponse *)msg;
    printf("ok=%d%s%s\n", d->ok, d->reason[0] ? " reason=" : "", d->reason);
    rc = d->ok ? 0 : 1;
    epd_proto_free(msg);
    if (rc == 0 && wait_ms > 0) {
        rc = ctl_wait_idle(addr, wait_ms);
    }
out:
    epd_free(buf);
    epd_opts_cleanup(&o);
    return rc;
}

/* `probe ADDR [--service NAME]`: grpc.health.v1.Health/Check as a
 * kubelet's gRPC probe calls it (no secret needed); exit 0 only when the
 * answer is SERVING. */
int epd_ctl_probe(const char *addr, int argc, char **argv)
{
    const char *service = "";
    const epd_opt_t opts[] = {
        {"service", EPD_OPT_STRING, &service, 0, 0,
         "the service to ask about ('' the daemon, or its role: router, prefill, ...)"},
    };
    epd_opts_t o = {.prog = "epd-ctl probe ADDR",
                    .summary = "grpc.health.v1.Health/Check: exit 0 when SERVING",
                    .opts = opts,
                    .n_opts = 1};
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    Grpc__Health__V1__HealthCheckResponse *r;
    ProtobufCMessage *msg = NULL;
    unsigned char buf[256];
    size_t len;
    epd_status_t status;
    int argi;
    int rc = 1;

    status = epd_opts_parse(&o, argc, argv, &argi);
    if (status != EPD_OK) {
        epd_opts_cleanup(&o);
        return status == EPD_ERR_CANCELED ? 0 : 1;
    }
    if (argi != argc || strlen(service) > 128) {
        rc = epd_ctl_fail("probe: usage: epd-ctl probe ADDR [--service NAME]");
        goto out;
    }
    req.service = (char *)service;
    len = grpc__health__v1__health_check_request__pack(&req, buf);
    if (ctl_call(addr, EPD_RPC_GRPC_HEALTH_CHECK, buf, len,
                 &grpc__health__v1__health_check_response__descriptor, &msg) != 0) {
        goto out;
    }
    r = (Grpc__Health__V1__HealthCheckResponse *)msg;
    rc = r->status != GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    printf("%s\n", rc == 0 ? "SERVING" : r->status == 2 ? "NOT_SERVING" : "UNKNOWN");
    epd_proto_free(msg);
out:
    epd_opts_cleanup(&o);
    return rc;
}
