/*
 * epd_addr.c — HOST:PORT parsing (see epd_addr.h).
 */
#include <arpa/inet.h>
#include <ifaddrs.h>
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

epd_status_t epd_addr_resolve(const char *host, char *out, size_t cap, const char **why_p)
{
    struct addrinfo hints, *res = NULL;
    char num[NI_MAXHOST];
    int rc;

    if (host == NULL || host[0] == '\0') {
        return epd_addr_refuse(why_p, "empty host");
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || res == NULL) {
        if (why_p != NULL) {
            *why_p = "does not resolve";
        }
        if (res != NULL) {
            freeaddrinfo(res);
        }
        return EPD_ERR_NOT_FOUND;
    }
    rc = getnameinfo(res->ai_addr, res->ai_addrlen, num, sizeof(num), NULL, 0, NI_NUMERICHOST);
    freeaddrinfo(res);
    if (rc != 0) {
        if (why_p != NULL) {
            *why_p = "resolves to an address that has no numeric form";
        }
        return EPD_ERR_NOT_FOUND;
    }
    if (strlen(num) >= cap) {
        if (why_p != NULL) {
            *why_p = "resolved address too long";
        }
        return EPD_ERR_TOO_LONG;
    }
    strcpy(out, num);
    return EPD_OK;
}

epd_status_t epd_addr_resolve_hostport(const char *addr, char *out, size_t cap,
                                       const char **why_p)
{
    char host[EPD_ADDR_HOST_MAX];
    char num[EPD_ADDR_HOST_MAX];
    uint16_t port;
    epd_status_t st;

    st = epd_addr_split(addr, host, sizeof(host), &port, why_p);
    if (st != EPD_OK) {
        return st;
    }
    st = epd_addr_resolve(host, num, sizeof(num), why_p);
    if (st != EPD_OK) {
        return st;
    }
    st = epd_addr_join(num, port, out, cap);
    if (st != EPD_OK && why_p != NULL) {
        *why_p = "resolved address too long";
    }
    return st;
}

/* `host` as a socket address (numeric only); 0 when it is not one. */
static int epd_addr_numeric(const char *host, struct sockaddr_storage *ss)
{
    struct addrinfo hints, *res = NULL;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_flags = AI_NUMERICHOST;
    if (host == NULL || getaddrinfo(host, NULL, &hints, &res) != 0 || res == NULL) {
        return 0;
    }
    memset(ss, 0, sizeof(*ss));
    memcpy(ss, res->ai_addr,
           res->ai_addrlen < sizeof(*ss) ? (size_t)res->ai_addrlen : sizeof(*ss));
    freeaddrinfo(res);
    return 1;
}

int epd_addr_is_wildcard(const char *host)
{
    struct sockaddr_storage ss;

    if (!epd_addr_numeric(host, &ss)) {
        return 0;
    }
    if (ss.ss_family == AF_INET) {
        return ((const struct sockaddr_in *)(const void *)&ss)->sin_addr.s_addr == INADDR_ANY;
    }
    return ss.ss_family == AF_INET6 &&
           IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)(const void *)&ss)->sin6_addr);
}

int epd_addr_is_ipv6(const char *host)
{
    struct sockaddr_storage ss;

    return epd_addr_numeric(host, &ss) && ss.ss_family == AF_INET6;
}

epd_status_t epd_addr_iface(const char *host, char *ifname, size_t cap)
{
    struct sockaddr_storage want;
    struct ifaddrs *ifs = NULL, *i;
    epd_status_t st = EPD_ERR_NOT_FOUND;

    if (!epd_addr_numeric(host, &want)) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (getifaddrs(&ifs) != 0) {
        return EPD_ERR_NOT_FOUND;
    }
    for (i = ifs; i != NULL && st == EPD_ERR_NOT_FOUND; i = i->ifa_next) {
        int same = 0;

        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != want.ss_family) {
            continue;
        }
        if (want.ss_family == AF_INET) {
            same = ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr.s_addr ==
                   ((const struct sockaddr_in *)(const void *)&want)->sin_addr.s_addr;
        } else if (want.ss_family == AF_INET6) {
            same = memcmp(&((const struct sockaddr_in6 *)(const void *)i->ifa_addr)->sin6_addr,
                          &((const struct sockaddr_in6 *)(const void *)&want)->sin6_addr,
                          sizeof(struct in6_addr)) == 0;
        }
        if (same) {
            st = strlen(i->ifa_name) < cap ? EPD_OK : EPD_ERR_TOO_LONG;
            if (st == EPD_OK) {
                strcpy(ifname, i->ifa_name);
            }
        }
    }
    freeifaddrs(ifs);
    return st;
}
