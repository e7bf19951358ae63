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

#endif
