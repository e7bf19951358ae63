/*
 * epd_xport.c — lifecycle of a transport: config, create (backend chosen, keys
 * derived), destroy, the xport accessors, connect.
 */
#include "epd_xport_core.h"

#include <string.h>

#include <sodium.h>

#include "epd_alloc.h"
#include "epd_bufpool.h"
#include "epd_log.h"
#include "epd_proc.h"
#include "epd_time.h"

void epd_xport_config_init(epd_xport_config_t *config)
{
    memset(config, 0, sizeof(*config));
    config->backend = "ucx";
    config->expect = NULL;
    config->provider = NULL;
    config->bind_host = NULL;
    config->max_msg_size = 64 * 1024;
    config->max_inflight = 4096;
    config->connect_timeout_ms = 5000;
    config->peer_timeout_ms = 10000;
}

static const epd__xport_backend_ops_t *const epd__xport_backends[] = {
#if EPD_WITH_UCX
    &epd__xport_ucx_ops,
#endif
#if EPD_WITH_OFI
    &epd__xport_ofi_ops,
#endif
    NULL,
};

/* Stacked over the backend at create (epd_xport_int.h "Interposers"). */
static const epd__xport_interposer_t *const epd__xport_interposers[] = {
    EPD__XPORT_INTERPOSERS NULL,
};

static epd_status_t epd__xport_create(const epd__xport_backend_ops_t *ops,
                                      const epd_xport_config_t *config, epd_xport_t **x_p);

epd_status_t epd_xport_create(const epd_xport_config_t *config, epd_xport_t **x_p)
{
    const epd__xport_backend_ops_t *ops = NULL;

    if (config == NULL || x_p == NULL || config->msg_cb == NULL || config->backend == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    for (size_t i = 0; epd__xport_backends[i] != NULL; i++) {
        if (strcmp(epd__xport_backends[i]->name, config->backend) == 0) {
            ops = epd__xport_backends[i];
        }
    }
    if (ops == NULL) {
        epd_log_error(EPD__XPORT_COMP, 0, "unknown or disabled transport backend '%s'",
                      config->backend);
        return EPD_ERR_CONFIG;
    }
    return epd__xport_create(ops, config, x_p);
}

epd_status_t epd__xport_create_ops(const epd__xport_backend_ops_t *ops,
                                   const epd_xport_config_t *config, epd_xport_t **x_p)
{
    if (ops == NULL || config == NULL || x_p == NULL || config->msg_cb == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    return epd__xport_create(ops, config, x_p);
}

static epd_status_t epd__xport_create(const epd__xport_backend_ops_t *ops,
                                      const epd_xport_config_t *config, epd_xport_t **x_p)
{
    epd_xport_t *x;
    epd_status_t st;
    uint32_t n_ops;
    uint64_t step_ms;
    bool ident_set;

    if (config->max_msg_size == 0 || config->max_msg_size > EPD__XPORT_MSG_LIMIT ||
        config->max_inflight == 0 || config->max_inflight > (1u << 24) ||
        config->connect_timeout_ms == 0 || config->peer_timeout_ms < 4) {
        epd_log_error(EPD__XPORT_COMP, 0,
                      "bad transport limits: max_msg_size %zu, max_inflight %u, "
                      "connect_timeout_ms %u, peer_timeout_ms %u",
                      config->max_msg_size, config->max_inflight, config->connect_timeout_ms,
                      config->peer_timeout_ms);
        return EPD_ERR_CONFIG;
    }
    if ((config->secret == NULL) != (config->secret_len == 0) ||
        (config->secret != NULL && (config->secret_len < EPD_XPORT_SECRET_MIN ||
                                    config->secret_len > EPD_XPORT_SECRET_MAX))) {
        epd_log_error(EPD__XPORT_COMP, 0,
                      "bad cluster secret: %zu bytes (want none, or %d to %d bytes)",
                      config->secret_len, EPD_XPORT_SECRET_MIN, EPD_XPORT_SECRET_MAX);
        return EPD_ERR_CONFIG;
    }
    if (!epd__xport_worker_id_ok(config->identity.worker_id, sizeof(config->identity.worker_id))) {
        epd_log_error(EPD__XPORT_COMP, 0,
                      "bad worker id in the transport identity: want printable ASCII without "
                      "spaces, at most %d bytes, NUL-terminated",
                      EPD_XPORT_WORKER_ID_MAX);
        return EPD_ERR_CONFIG;
    }
    ident_set = config->identity.worker_id[0] != '\0' || config->identity.role != 0 ||
                config->identity.epoch.start_time_ns != 0 || config->identity.epoch.nonce != 0;
    if (sodium_init() < 0) {
        epd_log_error(EPD__XPORT_COMP, 0, "libsodium cannot start");
        return EPD_ERR_FATAL;
    }
    if (ops->size != sizeof(*ops)) {
        epd_log_error(EPD__XPORT_COMP, 0, "backend '%s' has an ops table of %zu bytes, want %zu",
                      ops->name, ops->size, sizeof(*ops));
        return EPD_ERR_CONFIG;
    }
    if (config->expect != NULL && strcmp(config->expect, "any") != 0 &&
        strcmp(config->expect, "shm") != 0 && strcmp(config->expect, "tcp") != 0 &&
        strcmp(config->expect, "rdma") != 0) {
        epd_log_error(EPD__XPORT_COMP, 0,
                      "unknown transport expectation '%s' (want any, shm, tcp or rdma)",
                      config->expect);
        return EPD_ERR_CONFIG;
    }

    x = epd_calloc(1, sizeof(*x));
    if (x == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    x->ops = ops;
    x->cfg = *config;
    /* strings and the secret are borrowed only for create; keep what is
     * needed later */
    x->cfg.backend = ops->name;
    x->cfg.provider = NULL;
    x->cfg.bind_host = NULL;
    x->cfg.secret = NULL;
    x->cfg.secret_len = 0;
    x->ident_set = ident_set;
    if (config->expect != NULL && strcmp(config->expect, "any") != 0) {
        strcpy(x->expect, config->expect);
    }
    x->cfg.expect = x->expect[0] != '\0' ? x->expect : NULL;
    if (config->secret != NULL) {
        /* K: the secret itself may be long and is never needed again */
        static const unsigned char personal[crypto_generichash_blake2b_PERSONALBYTES] =
            "epd-xport-v1";
        crypto_generichash_blake2b_salt_personal(x->hs_key, sizeof(x->hs_key), config->secret,
                                                 config->secret_len, NULL, 0, NULL, personal);
        x->auth = true;
    }
    if (ident_set || x->auth) {
        /* every HELLO says which process this is (a peer on this host may
         * then watch it end: the fence) */
        if (epd_proc_self(&x->self) == EPD_OK) {
            x->proc.pid = x->self.pid;
            x->proc.start_ticks = x->self.start_ticks;
            x->proc.pidns_dev = x->self.pidns_dev;
            x->proc.pidns_ino = x->self.pidns_ino;
            memcpy(x->proc.boot_id, x->self.boot_id, sizeof(x->proc.boot_id));
            x->proc_set = true;
        }
    } else {
        (void)epd_proc_self(&x->self);
    }
    /* unpredictable: a frame is routed by (worker id, cookies), so an
     * outsider should not know a worker id without seeing its traffic */
    do {
        randombytes_buf(&x->id, sizeof(x->id));
    } while (x->id == 0);

    {
        /* most users never hold a message: the pool grows lazily, and its
         * cap bounds what a slow handshake can pin */
        size_t small = config->max_msg_size < 64 * 1024 ? config->max_msg_size : 64 * 1024;
        uint32_t max = (uint32_t)(EPD__XPORT_HELD_BYTES / small);

        max = max > EPD__XPORT_HELD_MAX ? EPD__XPORT_HELD_MAX : max < 16 ? 16 : max;
        epd_bufpool_init(&x->held, sizeof(epd__held_t), small, max, EPD__XPORT_HELD_BYTES);
    }
    n_ops = config->max_inflight + EPD__XPORT_OP_RESERVE;
    x->op_pool = epd_calloc(n_ops, sizeof(*x->op_pool));
    if (x->op_pool == NULL) {
        st = EPD_ERR_NO_MEMORY;
        goto err_free_x;
    }
    for (uint32_t i = n_ops; i-- > 0;) {
        x->op_pool[i].next = x->op_free;
        x->op_free = &x->op_pool[i];
    }

    step_ms = config->peer_timeout_ms / 8;
    if (config->connect_timeout_ms / 8 < step_ms) {
        step_ms = config->connect_timeout_ms / 8;
    }
    if (step_ms > 100) {
        step_ms = 100;
    }
    if (step_ms == 0) {
        step_ms = 1;
    }
    x->timer_step_ns = step_ms * EPD_NSEC_PER_MSEC;
    x->next_timer_ns = epd_time_now_ns() + x->timer_step_ns;

    st = ops->create(x, config, &x->be);
    if (st != EPD_OK) {
        goto err_free_pool;
    }
    /* interposers, each armed by its own switch, stack over the backend */
    for (const epd__xport_interposer_t *const *ip = epd__xport_interposers; *ip != NULL; ip++) {
        const epd__xport_backend_ops_t *ip_ops = NULL;
        void *ip_be = NULL;

        st = (*ip)->wrap(x, config, x->ops, x->be, &ip_ops, &ip_be);
        if (st != EPD_OK) {
            goto err_destroy_be;
        }
        if (ip_be != NULL) {
            x->ops = ip_ops;
            x->be = ip_be;
        }
    }
    *x_p = x;
    return EPD_OK;

err_destroy_be:
    x->ops->destroy(x->be);
err_free_pool:
    epd_free(x->op_pool);
err_free_x:
    sodium_memzero(x->hs_key, sizeof(x->hs_key));
    epd_free(x);
    return st;
}

void epd_xport_destroy(epd_xport_t *x)
{
    if (x == NULL) {
        return;
    }
    epd__xport_enter(x);
    while (x->eps != NULL) {
        /* held completions of each go first (epd__xport_ep_release_backend) */
        epd_xport_ep_close(x->eps);
    }
    while (x->mrs != NULL) {
        epd_xport_mr_dereg(x->mrs);
    }
    epd__xport_leave(x);
    x->ops->destroy(x->be);
    epd_bufpool_cleanup(&x->held);
    epd_free(x->slots);
    epd_free(x->slot_gen);
    epd_free(x->op_pool);
    sodium_memzero(x->hs_key, sizeof(x->hs_key));
    epd_free(x);
}

epd_status_t epd_xport_address(epd_xport_t *x, const void **blob_p, size_t *len_p)
{
    return x->ops->address(x->be, blob_p, len_p);
}

void epd_xport_describe(epd_xport_t *x, char *buf, size_t len)
{
    x->ops->describe(x->be, buf, len);
}

uint64_t epd_xport_id(const epd_xport_t *x)
{
    return x->id;
}

void epd__xport_set_tap(epd_xport_t *x, epd__xport_tap_cb_t tap, void *arg)
{
    x->tap = tap;
    x->tap_arg = arg;
}

int epd_xport_authenticating(const epd_xport_t *x)
{
    return x->auth ? 1 : 0;
}

void epd_xport_stats(const epd_xport_t *x, epd_xport_stats_t *stats_p)
{
    *stats_p = x->stats;
    stats_p->grants_held = x->grants_held;
    stats_p->writes_limbo = x->ops->limbo(x->be, 0);
}

uint32_t epd_xport_limbo(const epd_xport_t *x, uint64_t peer_xid)
{
    return x->ops->limbo(x->be, peer_xid);
}

epd_status_t epd_xport_connect(epd_xport_t *x, const void *blob, size_t len,
                               epd_xport_comp_cb_t cb, void *arg, epd_xport_ep_t **ep_p)
{
    const void *own;
    size_t own_len;
    epd_xport_ep_t *ep;
    epd_status_t st;

    if (blob == NULL || len == 0 || len > EPD_XPORT_ADDR_MAX) {
        return EPD_ERR_BAD_ADDRESS;
    }
    if (ep_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    st = x->ops->address(x->be, &own, &own_len);
    if (st != EPD_OK) {
        return st;
    }
    st = epd__xport_ep_new(x, blob, len, &ep);
    if (st != EPD_OK) {
        return st;
    }
    ep->state = EPD__EP_CONNECTING;
    ep->conn_cb = cb;
    ep->conn_arg = arg;
    ep->deadline_ns = epd_time_now_ns() + (uint64_t)x->cfg.connect_timeout_ms * EPD_NSEC_PER_MSEC;
    if (x->auth) {
        randombytes_buf(ep->nonce, sizeof(ep->nonce));
    }
    st = epd__xport_hello_send(ep);
    if (st != EPD_OK && st != EPD_ERR_NO_RESOURCE) {
        ep->conn_cb = NULL;
        epd_xport_ep_close(ep);
        return st;
    }
    /* backpressure on a fresh endpoint: the timers retry the HELLO until
     * the connect deadline (callbacks only ever run from progress) */
    ep->hs_pending = st == EPD_ERR_NO_RESOURCE ? EPD__FRAME_HELLO : 0;
    *ep_p = ep;
    return EPD_INPROGRESS;
}
