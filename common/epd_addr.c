/*
 * epd_addr.c — HOST:PORT parsing (see epd_addr.h).
 */
#include <stdio.h>
#include <string.h>

#include "epd_addr.h"

static epd_status_t epd_addr_refuse(const char **why_p, const char *why)
{
    if (why_p != NULL) {
        *why_p = why;
    }
    return EPD_ERR_INVALID_PARAM;
}

epd_status_t epd_addr_split(const char *addr, char *host, size_t cap, uint16_t *port_p,
                            const char **why_p)
{
    const char *h, *h_end, *colon, *p;
    unsigned long port = 0;

    if (addr == NULL || addr[0] == '\0') {
        return epd_addr_refuse(why_p, "empty address");
    }
    if (addr[0] == '[') {
        h = addr + 1;
        h_end = strchr(h, ']');
        if (h_end == NULL) {
            return epd_addr_refuse(why_p, "'[' without ']'");
        }
        if (h_end[1] != ':') {
            return epd_addr_refuse(why_p, "want [HOST]:PORT");
        }
        colon = h_end + 1;
    } else {
        colon = strrchr(addr, ':');
        if (colon == NULL) {
            return epd_addr_refuse(why_p, "want HOST:PORT");
        }
        if (memchr(addr, ':', (size_t)(colon - addr)) != NULL) {
            return epd_addr_refuse(why_p, "an IPv6 address must be bracketed: [HOST]:PORT");
        }
        if (strchr(addr, ']') != NULL) {
            return epd_addr_refuse(why_p, "']' without '['");
        }
        h = addr;
        h_end = colon;
    }
    if (h_end == h) {
        return epd_addr_refuse(why_p, "empty host");
    }
    if ((size_t)(h_end - h) >= cap) {
        return epd_addr_refuse(why_p, "host too long");
    }
    p = colon + 1;
    if (*p == '\0') {
        return epd_addr_refuse(why_p, "no port after ':'");
    }
    for (; *p != '\0'; p++) {
        if (*p < '0' || *p > '9') {
            return epd_addr_refuse(why_p, "port is not a number");
        }
        port = port * 10 + (unsigned long)(*p - '0');
        if (port > 65535) {
            return epd_addr_refuse(why_p, "port above 65535");
        }
    }
    memcpy(host, h, (size_t)(h_end - h));
    host[h_end - h] = '\0';
    *port_p = (uint16_t)port;
    return EPD_OK;
}

epd_status_t epd_addr_join(const char *host, uint16_t port, char *out, size_t cap)
{
    int n;

    if (strchr(host, ':') != NULL) {
        n = snprintf(out, cap, "[%s]:%u", host, (unsigned)port);
    } else {
        n = snprintf(out, cap, "%s:%u", host, (unsigned)port);
    }
    return n < 0 || (size_t)n >= cap ? EPD_ERR_TOO_LONG : EPD_OK;
}
