/*
 * epd_addr.h — "HOST:PORT" strings as every daemon and tool takes them.
 *
 * One parser for every address flag (--listen, --control-addr, --router,
 * epd-ctl's targets), so that they all take the same forms:
 *
 *   127.0.0.1:8000    name.example:8000    [::1]:8000    [fe80::1%eth0]:0
 *
 * An IPv6 literal must be bracketed (its colons would be ambiguous with
 * the port's).  The port is 0..65535; 0 asks the server for an ephemeral
 * one.  Pure functions; any thread.
 *
 * A cluster across hosts binds and advertises separately: a daemon binds
 * its control port on --control-addr (possibly the wildcard 0.0.0.0 or
 * ::), tells the others --advertise-addr, and runs its data plane on the
 * interface owning --data-addr.  Names are resolved once, at start
 * (epd_addr_resolve), so what a daemon binds and advertises never changes
 * under it; the helpers below say what kind of address a host is.
 */
#ifndef EPD_ADDR_H
#define EPD_ADDR_H

#include <stddef.h>
#include <stdint.h>

#include "epd_status.h"

#define EPD_ADDR_HOST_MAX 256 /* host bytes with NUL */
#define EPD_ADDR_MAX 272      /* "[host]:port" with NUL */

/*
 * Splits `addr` into host (brackets removed, written to host[0..cap)) and
 * *port_p.  EPD_ERR_INVALID_PARAM, with *why_p (when not NULL) a static
 * string naming the problem, for no colon, an empty or too long host, an
 * unbracketed IPv6 literal, unbalanced brackets or a port that is not a
 * number in 0..65535.  Outputs are written only on success.
 */
epd_status_t epd_addr_split(const char *addr, char *host, size_t cap, uint16_t *port_p,
                            const char **why_p);

/* Nonzero when every address `host` names is a loopback one (127.0.0.0/8,
 * ::1; a name is resolved, e.g. "localhost").  0 for anything else, and for
 * a name that does not resolve. */
int epd_addr_is_loopback(const char *host);

/* Joins host and port into out[0..cap) ("[::1]:80" when host holds a
 * colon).  EPD_ERR_TOO_LONG when it does not fit. */
epd_status_t epd_addr_join(const char *host, uint16_t port, char *out, size_t cap);

/*
 * Resolves `host` (an IPv4 or IPv6 literal, or a name) once into its first
 * address in the system's order (getaddrinfo, RFC 6724), written
 * numerically without brackets to out[0..cap) ("10.77.0.11", "::1",
 * "fe80::1%eth0").  EPD_ERR_NOT_FOUND when it does not resolve (*why_p, when
 * not NULL, says so), EPD_ERR_TOO_LONG when it does not fit.  Blocking (a
 * name may ask DNS): at start-up only.
 */
epd_status_t epd_addr_resolve(const char *host, char *out, size_t cap, const char **why_p);

/* The same for "HOST:PORT" / "[HOST]:PORT": the host resolved, the port
 * kept, joined again into out[0..cap). */
epd_status_t epd_addr_resolve_hostport(const char *addr, char *out, size_t cap,
                                       const char **why_p);

/* Nonzero when numeric `host` is a wildcard address (0.0.0.0, ::): bound,
 * it listens on every interface, and it names no host another can reach. */
int epd_addr_is_wildcard(const char *host);

/* Nonzero when numeric `host` is an IPv6 address. */
int epd_addr_is_ipv6(const char *host);

/*
 * The network interface of this host (its network namespace) holding the
 * numeric address `host`, its name into ifname[0..cap) ("eth0", "lo").
 * EPD_ERR_NOT_FOUND when no interface holds it (not an address of this
 * host), EPD_ERR_INVALID_PARAM when `host` is not numeric.
 */
epd_status_t epd_addr_iface(const char *host, char *ifname, size_t cap);

#endif
