/*
 * epd_xport_ucx.c — the UCX (ucp) backend of epd_xport: context and worker
 * (create, destroy), the address, and the ops table.  How the backend works is
 * in epd_xport_ucx_int.h.
 */
#include "epd_xport_ucx_int.h"

static void epd__ucx_parse_resources(epd__ucx_t *be)
{
    char *text = NULL, *line, *save = NULL;
    size_t text_len = 0, used = 0;
    FILE *f = open_memstream(&text, &text_len);

    be->resources[0] = '\0';
    if (f == NULL) {
        return;
    }
    ucp_context_print_info(be->ctx, f);
    fclose(f);
    /* lines "#      resource 0  :  md 0  dev 0  flags -- tcp/lo" */
    for (line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        char *dash = strstr(line, "flags -- ");
        int n;

        if (strstr(line, "resource") == NULL || dash == NULL) {
            continue;
        }
        n = snprintf(be->resources + used, sizeof(be->resources) - used, "%s%s",
                     used > 0 ? "," : "", dash + 9);
        if (n < 0 || (size_t)n >= sizeof(be->resources) - used) {
            break;
        }
        used += (size_t)n;
    }
    free(text); /* open_memstream's buffer comes from libc malloc */
}

static epd_status_t epd__ucx_create(epd_xport_t *core, const epd_xport_config_t *config,
                                    void **be_p)
{
    epd__ucx_t *be;
    ucp_params_t params;
    ucp_worker_params_t wparams;
    ucp_am_handler_param_t ah;
    ucs_status_t s;
    epd_status_t st;
    epd__ucx_addr_wire_t w;

    be = epd_calloc(1, sizeof(*be));
    if (be == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    be->core = core;
    be->efd = -1;
    be->msg_cap = epd__xport_frame_cap(config->max_msg_size);
    {
        size_t small = be->msg_cap < EPD__XPORT_FRAME_ROOM + 64 * 1024
                           ? be->msg_cap
                           : EPD__XPORT_FRAME_ROOM + 64 * 1024;
        uint32_t max = (uint32_t)(EPD__UCX_TX_BYTES / small);

        max = max > EPD__UCX_TX_MAX ? EPD__UCX_TX_MAX : max < 16 ? 16 : max;
        epd_bufpool_init(&be->tx, offsetof(epd__ucx_tx_t, data), small, max, EPD__UCX_TX_BYTES);
    }
    be->ring = epd_calloc(EPD__UCX_RING, sizeof(*be->ring));
    if (be->ring == NULL) {
        st = EPD_ERR_NO_MEMORY;
        goto err_free_be;
    }

    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    s = ucp_init(&params, NULL, &be->ctx);
    if (s != UCS_OK) {
        epd_log_error(EPD__UCX_COMP, 0, "ucp_init failed: %s (check UCX_TLS / UCX_NET_DEVICES)",
                      ucs_status_string(s));
        st = EPD_ERR_CONFIG;
        goto err_free_ring;
    }
    memset(&wparams, 0, sizeof(wparams));
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
    s = ucp_worker_create(be->ctx, &wparams, &be->worker);
    if (s != UCS_OK) {
        epd_log_error(EPD__UCX_COMP, 0, "ucp_worker_create failed: %s", ucs_status_string(s));
        st = EPD_ERR_CONFIG;
        goto err_cleanup_ctx;
    }

    memset(&ah, 0, sizeof(ah));
    ah.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    ah.id = EPD__UCX_AM_MSG;
    ah.flags = UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA;
    ah.cb = epd__ucx_am_msg;
    ah.arg = be;
    s = ucp_worker_set_am_recv_handler(be->worker, &ah);
    if (s == UCS_OK) {
        ah.id = EPD__UCX_AM_WRITE;
        ah.flags = UCP_AM_FLAG_WHOLE_MSG;
        ah.cb = epd__ucx_am_write;
        s = ucp_worker_set_am_recv_handler(be->worker, &ah);
    }
    if (s != UCS_OK) {
        epd_log_error(EPD__UCX_COMP, 0, "cannot set AM handlers: %s", ucs_status_string(s));
        st = EPD_ERR_CONFIG;
        goto err_destroy_worker;
    }

    s = ucp_worker_get_address(be->worker, &be->uaddr, &be->uaddr_len);
    if (s != UCS_OK) {
        epd_log_error(EPD__UCX_COMP, 0, "ucp_worker_get_address failed: %s", ucs_status_string(s));
        st = EPD_ERR_CONFIG;
        goto err_destroy_worker;
    }
    be->blob_len = sizeof(w) + be->uaddr_len;
    if (be->blob_len > EPD_XPORT_ADDR_MAX) {
        epd_log_error(EPD__UCX_COMP, 0, "UCX worker address of %zu bytes exceeds %d", be->uaddr_len,
                      EPD_XPORT_ADDR_MAX);
        st = EPD_ERR_CONFIG;
        goto err_release_addr;
    }
    be->blob = epd_malloc(be->blob_len);
    if (be->blob == NULL) {
        st = EPD_ERR_NO_MEMORY;
        goto err_release_addr;
    }
    memset(&w, 0, sizeof(w));
    w.magic = EPD__UCX_ADDR_MAGIC;
    w.version = EPD__UCX_WIRE_VERSION;
    w.ucx_len = (uint32_t)be->uaddr_len;
    w.hash = epd_hash64(be->uaddr, be->uaddr_len, w.ucx_len);
    memcpy(be->blob, &w, sizeof(w));
    memcpy(be->blob + sizeof(w), be->uaddr, be->uaddr_len);

    epd__ucx_parse_resources(be);
    /* a peer on this host may map a region this worker allocates (and then
     * write into it without this worker's check): the fence needs to know */
    be->maps_shm = strstr(be->resources, "posix/") != NULL ||
                   strstr(be->resources, "sysv/") != NULL ||
                   strstr(be->resources, "xpmem/") != NULL;
    epd_log_info(EPD__UCX_COMP, 0, "ucx %s: resources %s; worker address %zu bytes",
                 ucp_get_version_string(), be->resources[0] ? be->resources : "(none)",
                 be->uaddr_len);
    *be_p = be;
    return EPD_OK;

err_release_addr:
    ucp_worker_release_address(be->worker, be->uaddr);
err_destroy_worker:
    ucp_worker_destroy(be->worker);
err_cleanup_ctx:
    ucp_cleanup(be->ctx);
err_free_ring:
    epd_free(be->ring);
err_free_be:
    epd_free(be);
    return st;
}

static void epd__ucx_destroy(void *arg)
{
    epd__ucx_t *be = arg;
    uint64_t deadline = epd_time_now_ns() + EPD__UCX_CLOSE_WAIT_NS;

    /* the core closed every endpoint and region already; receives still
     * landing in deregistered regions get a bounded time to finish — unless
     * an endpoint was closed mid wire-up: progressing the worker again then
     * may abort in UCX 1.13.1 (the same purge as at ucp_worker_destroy, hit
     * once by the conformance suite on ucx-posix-tcp when the refused tcp
     * connect of that endpoint surfaced here), so nothing is waited for */
    while ((be->dead_mrs != NULL || be->dead_grants != NULL) && !be->half_wired &&
           epd_time_now_ns() < deadline) {
        ucp_worker_progress(be->worker);
        epd__ucx_reap(be);
    }
    while (be->dead_grants != NULL) {
        epd__ucx_grant_t *g = be->dead_grants;

        be->dead_grants = g->next;
        epd_free(g);
    }
    while (be->grants != NULL) {
        epd__ucx_grant_t *g = be->grants;

        be->grants = g->next;
        epd_free(g);
    }
    while (be->dead_mrs != NULL) {
        epd__ucx_mr_t *mr = be->dead_mrs;
        be->dead_mrs = mr->next;
        epd__ucx_mr_unmap(mr);
    }
    while (be->mrs != NULL) {
        epd__ucx_mr_t *mr = be->mrs;
        be->mrs = mr->next;
        epd__ucx_mr_unmap(mr);
    }
    while (be->ring_count > 0) {
        if (be->ring[be->ring_head].held) {
            ucp_am_data_release(be->worker, be->ring[be->ring_head].data);
        }
        be->ring_head = (be->ring_head + 1) % EPD__UCX_RING;
        be->ring_count--;
    }
    /* orphaned sends get the close wait to finish; the rest are released
     * without their callbacks, and their copies freed once the worker is
     * gone (or never progressed again) */
    while (be->tx_orphans != NULL && !be->half_wired && epd_time_now_ns() < deadline) {
        ucp_worker_progress(be->worker);
    }
    while ((be->tx_orphans != NULL || be->orphans != NULL) && !be->half_wired &&
           epd_time_now_ns() < deadline) {
        ucp_worker_progress(be->worker);
    }
    for (epd__ucx_tx_t *tx = be->tx_orphans; tx != NULL; tx = tx->next) {
        ucp_request_free(tx->req);
    }
    for (epd__ucx_wr_t *wr = be->orphans; wr != NULL; wr = wr->next) {
        ucp_request_free(wr->req);
    }
    epd_free(be->blob);
    ucp_worker_release_address(be->worker, be->uaddr);
    if (be->half_wired) {
        /* UCX 1.13.1 aborts (ucp_request.c:684, "got REQ message") purging
         * the wire-up request of an endpoint closed before its tcp
         * lane connected (its close never completed).  The worker is never progressed again, so no
         * callback can reach freed memory; it goes with the process. */
        epd_log_debug(EPD__UCX_COMP, 0,
                      "leaving the UCX worker to process exit (an endpoint closed mid wire-up)");
    } else {
        ucp_worker_destroy(be->worker);
        ucp_cleanup(be->ctx);
    }
    while (be->tx_orphans != NULL) {
        epd__ucx_tx_t *tx = be->tx_orphans;

        be->tx_orphans = tx->next;
        epd__ucx_tx_put(be, tx);
    }
    while (be->orphans != NULL) {
        epd__ucx_wr_t *wr = be->orphans;

        be->orphans = wr->next;
        epd_free(wr);
    }
    while (be->wr_free != NULL) {
        epd__ucx_wr_t *wr = be->wr_free;

        be->wr_free = wr->next;
        epd_free(wr);
    }
    epd_bufpool_cleanup(&be->tx);
    epd_free(be->ring);
    epd_free(be);
}

static epd_status_t epd__ucx_address(void *arg, const void **blob_p, size_t *len_p)
{
    epd__ucx_t *be = arg;

    *blob_p = be->blob;
    *len_p = be->blob_len;
    return EPD_OK;
}

static void epd__ucx_describe(void *arg, char *buf, size_t len)
{
    epd__ucx_t *be = arg;
    const char *tls = getenv("UCX_TLS");

    snprintf(buf, len, "ucx %s (UCX_TLS=%s): resources %s", ucp_get_version_string(),
             tls != NULL ? tls : "all", be->resources);
}

const epd__xport_backend_ops_t epd__xport_ucx_ops = {
    .size = sizeof(epd__xport_backend_ops_t),
    .name = "ucx",
    .create = epd__ucx_create,
    .destroy = epd__ucx_destroy,
    .address = epd__ucx_address,
    .describe = epd__ucx_describe,
    .ep_create = epd__ucx_ep_create,
    .ep_destroy = epd__ucx_ep_destroy,
    .ep_describe = epd__ucx_ep_describe,
    .send = epd__ucx_send,
    .write = epd__ucx_write,
    .flush = epd__ucx_flush,
    .mr_alloc = epd__ucx_mr_alloc,
    .mr_reg = epd__ucx_mr_reg,
    .mr_dereg = epd__ucx_mr_dereg,
    .mr_pack = epd__ucx_mr_pack,
    .rkey_unpack = epd__ucx_rkey_unpack,
    .rkey_destroy = epd__ucx_rkey_destroy,
    .grant_open = epd__ucx_grant_open,
    .grant_pack = epd__ucx_grant_pack,
    .grant_revoke = epd__ucx_grant_revoke,
    .grant_settled = epd__ucx_grant_settled,
    .grant_close = epd__ucx_grant_close,
    .limbo = epd__ucx_limbo,
    .progress = epd__ucx_progress,
    .get_fd = epd__ucx_get_fd,
    .arm = epd__ucx_arm,
};
