/*
 * epd_daemon_addr.c — where a daemon binds, what it advertises, and who may
 * reach it (the cluster secret, or this host only).
 *
 * A cluster across hosts binds and advertises separately:
 *
 *   --control-addr HOST:PORT  the gRPC control port's bind; may be a
 *                             wildcard (0.0.0.0, [::]) to listen everywhere;
 *   --advertise-addr HOST     what other members (the router, epd-ctl, a
 *                             kubelet) use to reach this daemon: the control
 *                             address it registers and answers in Health is
 *                             ADVERTISE:BOUND_PORT.  Default: the control
 *                             host; required when that is a wildcard;
 *   --data-addr HOST          the data plane's local address.  UCX runs on
 *                             the network interface owning it (UCX_NET_DEVICES,
 *                             unless the user set it — RDMA users name their
 *                             devices there), libfabric binds it (its address
 *                             blob carries it).  Default: the advertised host,
 *                             which must then be an address of this host.
 *
 * Every name is resolved once, here, at start: a daemon binds, advertises
 * and registers numeric addresses that never change under it (a name that
 * later resolves elsewhere does not move a running cluster).  IPv4 and
 * IPv6 alike; UCX connects without blocking (UCX_TCP_CONN_NB=y, unless
 * set: a blocking connect to an unreachable peer stalls the loop); with an
 * IPv6 data address UCX is told to prefer inet6
 * (UCX_TCP_AF_PRIO, unless set) — but for ::1: UCX 1.13's tcp serves lo
 * over IPv4 only, and loopback is this host either way.
 *
 * Without a cluster secret a daemon cannot tell members from strangers, so
 * it serves its own host only (#12's rule): the control bind, the
 * advertised and the data addresses must all be loopback, and UCX is held
 * to lo.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_daemon_int.h"

/* A --advertise-addr / --data-addr value without brackets, resolved. */
static epd_status_t epd_daemon_resolve_host(epd_daemon_t *d, const char *flag, const char *value,
                                            char *out, size_t cap)
{
    char bare[EPD_ADDR_HOST_MAX];
    const char *why = NULL;
    size_t n = strlen(value);
    epd_status_t st;

    if (n >= 2 && value[0] == '[' && value[n - 1] == ']') {
        snprintf(bare, sizeof(bare), "%.*s", (int)(n - 2), value + 1);
    } else {
        snprintf(bare, sizeof(bare), "%s", value);
    }
    st = epd_addr_resolve(bare, out, cap, &why);
    if (st != EPD_OK) {
        epd_log_error(d->log, 0, "--%s '%s': %s", flag, value, why != NULL ? why : "bad host");
    }
    return st;
}

/* Resolves the control bind, the advertised and data hosts, the data
 * interface and --router.  EPD_OK or EPD_ERR_CONFIG (logged). */
static epd_status_t epd_daemon_resolve(epd_daemon_t *d)
{
    const epd_daemon_flags_t *fl = d->fl;
    char host[EPD_ADDR_HOST_MAX];
    char bind_host[EPD_ADDR_HOST_MAX];
    const char *why = NULL;
    uint16_t port;
    epd_status_t st;

    if (epd_addr_split(fl->control_addr, host, sizeof(host), &port, &why) != EPD_OK ||
        epd_addr_resolve(host, bind_host, sizeof(bind_host), &why) != EPD_OK ||
        epd_addr_join(bind_host, port, d->control_bind, sizeof(d->control_bind)) != EPD_OK) {
        epd_log_error(d->log, 0, "--control-addr '%s': %s", fl->control_addr,
                      why != NULL ? why : "too long");
        return EPD_ERR_CONFIG;
    }
    if (fl->advertise_addr != NULL && fl->advertise_addr[0] != '\0') {
        st = epd_daemon_resolve_host(d, "advertise-addr", fl->advertise_addr, d->advertise_host,
                                     sizeof(d->advertise_host));
        if (st != EPD_OK) {
            return EPD_ERR_CONFIG;
        }
        if (epd_addr_is_wildcard(d->advertise_host)) {
            epd_log_error(d->log, 0,
                          "--advertise-addr '%s' is a wildcard: advertise an address the "
                          "other members can reach",
                          fl->advertise_addr);
            return EPD_ERR_CONFIG;
        }
    } else if (epd_addr_is_wildcard(bind_host)) {
        epd_log_error(d->log, 0,
                      "--control-addr %s binds every interface: give --advertise-addr HOST, "
                      "the address other members reach this daemon at",
                      fl->control_addr);
        return EPD_ERR_CONFIG;
    } else {
        snprintf(d->advertise_host, sizeof(d->advertise_host), "%s", bind_host);
    }
    if (fl->data_addr != NULL && fl->data_addr[0] != '\0') {
        st = epd_daemon_resolve_host(d, "data-addr", fl->data_addr, d->data_host,
                                     sizeof(d->data_host));
        if (st != EPD_OK) {
            return EPD_ERR_CONFIG;
        }
        if (epd_addr_is_wildcard(d->data_host)) {
            epd_log_error(d->log, 0,
                          "--data-addr '%s' is a wildcard: the data plane needs the one "
                          "address its peers reach it at",
                          fl->data_addr);
            return EPD_ERR_CONFIG;
        }
    } else {
        snprintf(d->data_host, sizeof(d->data_host), "%s", d->advertise_host);
    }
    st = epd_addr_iface(d->data_host, d->data_iface, sizeof(d->data_iface));
    if (st != EPD_OK) {
        epd_log_error(d->log, 0,
                      "the data-plane address %s (%s) is not an address of this host: give "
                      "--data-addr the local IP its peers reach",
                      d->data_host,
                      fl->data_addr != NULL && fl->data_addr[0] != '\0' ? "--data-addr"
                                                                        : "the advertised host");
        return EPD_ERR_CONFIG;
    }
    if (fl->metrics_addr != NULL && fl->metrics_addr[0] != '\0' &&
        (epd_addr_split(fl->metrics_addr, host, sizeof(host), &port, &why) != EPD_OK ||
         epd_addr_resolve(host, bind_host, sizeof(bind_host), &why) != EPD_OK ||
         epd_addr_join(bind_host, port, d->metrics_bind, sizeof(d->metrics_bind)) != EPD_OK)) {
        epd_log_error(d->log, 0, "--metrics-addr '%s': %s", fl->metrics_addr,
                      why != NULL ? why : "too long");
        return EPD_ERR_CONFIG;
    }
    if (fl->router != NULL && fl->router[0] != '\0' &&
        epd_addr_resolve_hostport(fl->router, d->router_addr, sizeof(d->router_addr), &why) !=
            EPD_OK) {
        epd_log_error(d->log, 0, "--router '%s': %s", fl->router, why != NULL ? why : "bad");
        return EPD_ERR_CONFIG;
    }
    return EPD_OK;
}

/* Without a secret: every address loopback (this host only). */
static epd_status_t epd_daemon_loopback_only(epd_daemon_t *d)
{
    const char *flag = NULL;
    char bind_host[EPD_ADDR_HOST_MAX];
    uint16_t port;

    if (epd_addr_split(d->control_bind, bind_host, sizeof(bind_host), &port, NULL) != EPD_OK ||
        !epd_addr_is_loopback(bind_host)) {
        flag = "--control-addr";
    } else if (!epd_addr_is_loopback(d->advertise_host)) {
        flag = "--advertise-addr";
    } else if (!epd_addr_is_loopback(d->data_host)) {
        flag = "--data-addr";
    } else if (d->metrics_bind[0] != '\0' &&
               (epd_addr_split(d->metrics_bind, bind_host, sizeof(bind_host), &port, NULL) !=
                    EPD_OK ||
                !epd_addr_is_loopback(bind_host))) {
        flag = "--metrics-addr";
    }
    if (flag != NULL) {
        epd_log_error(d->log, 0,
                      "%s is not a loopback address (control %s, advertised %s, data %s): "
                      "without --cluster-secret-file a daemon serves its own host only",
                      flag, d->fl->control_addr, d->advertise_host, d->data_host);
        return EPD_ERR_CONFIG;
    }
    return EPD_OK;
}

/* UCX on the data interface (unless the user chose devices), inet6 first
 * for an IPv6 data address. */
static epd_status_t epd_daemon_ucx_env(epd_daemon_t *d, int secret)
{
    const char *devs = getenv("UCX_NET_DEVICES");
    const char *prio = getenv("UCX_TCP_AF_PRIO");
    const char *nb = getenv("UCX_TCP_CONN_NB");

    if (devs == NULL || devs[0] == '\0') {
        setenv("UCX_NET_DEVICES", d->data_iface, 1);
        epd_log_info(d->log, 0, "data plane on %s (%s): UCX_NET_DEVICES=%s", d->data_iface,
                     d->data_host, d->data_iface);
    } else if (!secret && strcmp(devs, "lo") != 0) {
        epd_log_error(d->log, 0,
                      "UCX_NET_DEVICES=%s reaches beyond loopback: without "
                      "--cluster-secret-file a daemon serves its own host only",
                      devs);
        return EPD_ERR_CONFIG;
    } else if (strcmp(devs, d->data_iface) != 0) {
        epd_log_info(d->log, 0,
                     "data plane: UCX_NET_DEVICES=%s as set (the data address %s is on %s)",
                     devs, d->data_host, d->data_iface);
    }
    /* UCX's default is a blocking connect() on the thread creating the
     * endpoint — the loop: a peer whose packets are dropped (a partition, a
     * host cut off) would stall this daemon until the kernel gives up on the
     * SYN, its heartbeats and keepalives with it, and every other member
     * would declare it dead (found by tests/multihost/test_mh_partition.sh) */
    if (nb == NULL || nb[0] == '\0') {
        setenv("UCX_TCP_CONN_NB", "y", 1);
    }
    /* UCX 1.13's tcp runs on lo over IPv4 only: an IPv6 loopback data
     * address stays on lo as is (the same host either way) */
    if ((prio == NULL || prio[0] == '\0') && epd_addr_is_ipv6(d->data_host) &&
        !epd_addr_is_loopback(d->data_host)) {
        setenv("UCX_TCP_AF_PRIO", "inet6", 1);
    }
    return EPD_OK;
}

epd_status_t epd__daemon_addresses(epd_daemon_t *d)
{
    const epd_daemon_flags_t *fl = d->fl;
    int secret = fl->cluster_secret_file != NULL && fl->cluster_secret_file[0] != '\0';
    char why[256];
    epd_status_t st;

    if (secret) {
        st = epd_secret_load(fl->cluster_secret_file, &d->secret, why, sizeof(why));
        if (st != EPD_OK) {
            epd_log_error(d->log, 0, "--cluster-secret-file: %s", why);
            return st;
        }
    }
    st = epd_daemon_resolve(d);
    if (st == EPD_OK && !secret) {
        st = epd_daemon_loopback_only(d);
    }
    if (st == EPD_OK && strcmp(fl->transport, "ucx") == 0) {
        st = epd_daemon_ucx_env(d, secret);
    }
    if (st != EPD_OK) {
        return st;
    }
    if (!secret) {
        epd_log_info(d->log, 0,
                     "no cluster secret: serving this host only (control %s, data plane on "
                     "loopback); give every member --cluster-secret-file to serve other hosts",
                     d->control_bind);
    } else {
        epd_log_info(d->log, 0, "control bound on %s, advertised as %s; data plane on %s (%s)",
                     d->control_bind, d->advertise_host, d->data_host, d->data_iface);
    }
    return EPD_OK;
}
