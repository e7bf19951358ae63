/*
 * epd_addr.c — HOST:PORT parsing (see epd_addr.h).
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

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

int epd_addr_is_loopback(const char *host)
{
    struct addrinfo hints, *res = NULL, *ai;
    int all = 1;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || res == NULL) {
        return 0;
    }
    for (ai = res; ai != NULL && all; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET) {
            const struct sockaddr_in *a = (const struct sockaddr_in *)(const void *)ai->ai_addr;

            all = (ntohl(a->sin_addr.s_addr) >> 24) == 127;
        } else if (ai->ai_family == AF_INET6) {
            const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)(const void *)ai->ai_addr;

            all = IN6_IS_ADDR_LOOPBACK(&a->sin6_addr);
        } else {
            all = 0;
        }
    }
    freeaddrinfo(res);
    return all;
}
