/*
 * epd_client.c — the request-plane client (see epd_client.h): its
 * lifecycle, its workers and their endpoints.
 *
 * Design: the client owns one xport and a list of workers, one endpoint
 * each, keyed by the worker's Health identity.  The requests themselves
 * live in epd_client_req.c (the transport's message callback goes there);
 * this file turns an endpoint failure into the failure of its worker,
 * which that file then carries to every request using it.  Calls go one
 * way: here -> epd_client_req.c and epd_client_health.c (see
 * epd_client_int.h).  State changes happen only on the owner thread, so
 * there is no lock.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "epd_alloc.h"
#include "epd_client_int.h"
#include "epd_log.h"
#include "epd_rng.h"
#include "epd_time.h"

const char *epd_client_finish_name(int finish)
{
    switch (finish) {
    case EPD_CLIENT_FINISH_NONE:
        return "NONE";
    case EPD_CLIENT_FINISH_LENGTH:
        return "LENGTH";
    case EPD_CLIENT_FINISH_STOP:
        return "STOP";
    case EPD_CLIENT_FINISH_ABORT:
        return "ABORT";
    case EPD_CLIENT_FINISH_ERROR:
        return "ERROR";
    default:
        return "?";
    }
}

static void epd_client_on_err(void *arg, epd_xport_ep_t *ep, epd_status_t status)
{
    epd_client_t *c = arg;
    epd_client_worker_t *w = epd_xport_ep_user(ep);

    if (w == NULL) {
        /* an endpoint some peer opened to us; we never use those */
        epd_xport_ep_close(ep);
        return;
    }
    epd__client_worker_failed(c, w, status);
}

static void epd_client_on_accept(void *arg, epd_xport_ep_t *ep)
{
    (void)arg;
    /* Replies come on the endpoints we opened; a peer connecting to a
     * client has nothing to say that those would not carry.  Keep it open
     * (closing would make the peer's sends fail) and untracked. */
    epd_xport_ep_set_user(ep, NULL);
}

static void epd_client_on_connect(void *arg, epd_status_t status)
{
    epd_client_worker_t *w = arg;

    if (status == EPD_OK) {
        epd_log_debug(EPD__CLIENT_LOG, 0, "connected to %s", w->info.worker_id);
    }
    /* failures reach epd_client_on_err, which fails the worker's requests */
}

/* ------------------------------------------------------------- lifecycle */

void epd_client_config_init(epd_client_config_t *config)
{
    memset(config, 0, sizeof(*config));
    config->backend = "ucx";
    config->expect = "any";
    config->peer_timeout_ms = 3000;
    config->connect_timeout_ms = 3000;
    config->max_msg_size = 64 * 1024;
    config->role = EPD_CLIENT_ROLE_TOOL;
    config->rpc_timeout_ms = 3000;
}

epd_status_t epd_client_create(const epd_client_config_t *config, epd_client_t **client_p)
{
    epd_xport_config_t xc;
    epd_client_t *c;
    epd_status_t status;

    if (config->event_cb == NULL || config->max_msg_size < 256 ||
        (config->role != EPD_CLIENT_ROLE_TOOL && config->role != EPD_CLIENT_ROLE_ROUTER)) {
        return EPD_ERR_INVALID_PARAM;
    }
    c = epd_calloc(1, sizeof(*c));
    if (c == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    c->cfg = *config;
    if (config->worker_id != NULL && config->worker_id[0] != '\0') {
        epd__client_copy_str(c->worker_id, sizeof(c->worker_id), config->worker_id);
    } else {
        snprintf(c->worker_id, sizeof(c->worker_id), "ctl-%d", (int)getpid());
    }
    c->cfg.worker_id = c->worker_id;
    c->cfg.backend = NULL;
    c->cfg.expect = NULL;
    c->cfg.provider = NULL;
    if (config->epoch_start_ns != 0 || config->epoch_nonce != 0) {
        /* the identity of the daemon it serves (the router's) */
        c->epoch_start_ns = config->epoch_start_ns;
        c->epoch_nonce = config->epoch_nonce;
    } else {
        c->epoch_start_ns = epd_time_wall_ns();
        c->epoch_nonce = epd_rng_entropy();
    }
    c->txbuf = epd_malloc(config->max_msg_size);
    if (c->txbuf == NULL) {
        status = EPD_ERR_NO_MEMORY;
        goto err_free_client;
    }
    epd_xport_config_init(&xc);
    xc.backend = config->backend != NULL ? config->backend : "ucx";
    xc.expect = config->expect;
    xc.provider = config->provider;
    xc.bind_host = config->bind_host;
    xc.max_msg_size = config->max_msg_size;
    if (config->peer_timeout_ms > 0) {
        xc.peer_timeout_ms = config->peer_timeout_ms;
    }
    if (config->connect_timeout_ms > 0) {
        xc.connect_timeout_ms = config->connect_timeout_ms;
    }
    if (config->secret != NULL && config->secret_len > 0) {
        xc.secret = config->secret;
        xc.secret_len = config->secret_len;
        c->authenticating = 1;
    }
    snprintf(xc.identity.worker_id, sizeof(xc.identity.worker_id), "%s", c->worker_id);
    xc.identity.role = config->role;
    xc.identity.epoch.start_time_ns = c->epoch_start_ns;
    xc.identity.epoch.nonce = c->epoch_nonce;
    xc.msg_cb = epd__client_on_msg;
    xc.accept_cb = epd_client_on_accept;
    xc.err_cb = epd_client_on_err;
    xc.cb_arg = c;
    status = epd_xport_create(&xc, &c->x);
    if (status != EPD_OK) {
        goto err_free_buf;
    }
    *client_p = c;
    return EPD_OK;

err_free_buf:
    epd_free(c->txbuf);
err_free_client:
    epd_free(c);
    return status;
}

void epd_client_destroy(epd_client_t *c)
{
    if (c == NULL) {
        return;
    }
    epd__client_reqs_free_all(c);
    while (c->workers != NULL) {
        epd_client_worker_t *w = c->workers;
        c->workers = w->next;
        if (w->ep != NULL) {
            epd_xport_ep_set_user(w->ep, NULL);
            epd_xport_ep_close(w->ep);
        }
        epd_free(w);
    }
    epd_xport_destroy(c->x);
    epd_free(c->txbuf);
    epd_free(c);
}

epd_xport_t *epd_client_xport(epd_client_t *c)
{
    return c->x;
}

const char *epd_client_id(const epd_client_t *c)
{
    return c->worker_id;
}

void epd_client_epoch(const epd_client_t *c, uint64_t *start_ns_p, uint64_t *nonce_p)
{
    *start_ns_p = c->epoch_start_ns;
    *nonce_p = c->epoch_nonce;
}

epd_status_t epd_client_add_worker_info(epd_client_t *c, const epd_client_worker_info_t *info,
                                        epd_client_worker_t **worker_p)
{
    epd_client_worker_t *w;
    epd_status_t status;

    if (info->address_len == 0 || info->address_len > EPD_XPORT_ADDR_MAX) {
        return EPD_ERR_BAD_ADDRESS;
    }
    w = epd_calloc(1, sizeof(*w));
    if (w == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    w->client = c;
    w->info = *info;
    w->state = EPD_OK;
    status =
        epd_xport_connect(c->x, info->address, info->address_len, epd_client_on_connect, w, &w->ep);
    if (status != EPD_OK && status != EPD_INPROGRESS) {
        epd_log_error(EPD__CLIENT_LOG, 0, "cannot connect to %s: %s", info->worker_id,
                      epd_status_string(status));
        epd_free(w);
        return status;
    }
    epd_xport_ep_set_user(w->ep, w);
    w->next = c->workers;
    c->workers = w;
    *worker_p = w;
    return EPD_OK;
}

epd_status_t epd_client_add_worker(epd_client_t *c, const char *control_addr,
                                   epd_client_worker_t **worker_p)
{
    epd_client_worker_info_t *info;
    char err[512];
    epd_status_t status;

    info = epd_calloc(1, sizeof(*info));
    if (info == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    status = epd_client_health(control_addr, c->cfg.rpc_timeout_ms, info, err, sizeof(err));
    if (status != EPD_OK) {
        epd_log_error(EPD__CLIENT_LOG, 0, "%s", err);
        goto out;
    }
    status = epd_client_add_worker_info(c, info, worker_p);
out:
    epd_free(info);
    return status;
}

const epd_client_worker_info_t *epd_client_worker_info(const epd_client_worker_t *w)
{
    return &w->info;
}

epd_status_t epd_client_worker_state(const epd_client_worker_t *w)
{
    return w->state;
}

void epd_client_worker_link(epd_client_worker_t *w, char *buf, size_t len)
{
    char desc[512];

    if (len == 0) {
        return;
    }
    if (w->ep == NULL || w->state != EPD_OK) {
        snprintf(buf, len, "down: %s", epd_status_name(w->state != EPD_OK ? w->state
                                                                            : EPD_ERR_PEER_DEAD));
        return;
    }
    epd_xport_ep_describe(w->ep, desc, sizeof(desc));
    snprintf(buf, len, "%s: %s", epd_xport_ep_class(w->ep), desc);
}

int epd_client_poll(epd_client_t *c, int timeout_ms)
{
    int n = epd_xport_poll(c->x, timeout_ms > 50 ? 50 : timeout_ms);

    epd_client_tick(c);
    return n;
}

void epd_client_stats(const epd_client_t *c, epd_client_stats_t *stats_p)
{
    *stats_p = c->stats;
}
