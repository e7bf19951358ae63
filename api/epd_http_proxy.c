/*
 * epd_http_proxy.c — trusted proxies (see epd_http.h): a list of CIDR
 * blocks, parsed once at start-up, and the rule that takes a request's
 * client address from X-Forwarded-For.
 *
 * Addresses are handled in one form, 16 bytes: an IPv6 address as it is,
 * an IPv4 address as ::ffff:a.b.c.d (an IPv4 block's prefix grows by 96),
 * so one comparison serves both families and a peer that reaches an IPv6
 * listener as ::ffff:10.0.0.1 matches 10.0.0.0/8.
 *
 * The rule is nginx's real_ip_recursive: X-Forwarded-For is a list each
 * proxy appends its own peer to, so only the entries at its right end were
 * written by proxies we trust; the first (from the right) entry that is
 * not itself a trusted proxy is the last address a trusted proxy saw, the
 * client.  Anything to its left was written by the client and may be
 * anything.  The header is read only when the connection's peer is
 * trusted: from anyone else it is the client's own claim.
 *
 * Created once at start-up, then read-only: any thread may read it.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_http_int.h"

/* One block: the first `bits` bits of `net` (16-byte form, the rest zero). */
typedef struct {
    unsigned char net[16];
    unsigned bits;
} epd_http_cidr_t;

struct epd_http_proxies {
    size_t n;
    epd_http_cidr_t cidr[]; /* [n] */
};

/* 1 when the address text s[0..len) (no blanks) is an IPv4 or IPv6
 * literal, written to out[16] in the 16-byte form; 0 otherwise. */
int epd__http_addr_parse(const char *s, size_t len, unsigned char out[16])
{
    char buf[INET6_ADDRSTRLEN + 1];
    struct in_addr v4;

    if (len == 0 || len >= sizeof(buf)) {
        return 0;
    }
    memcpy(buf, s, len);
    buf[len] = '\0';
    if (inet_pton(AF_INET, buf, &v4) == 1) {
        memset(out, 0, 10);
        out[10] = 0xff;
        out[11] = 0xff;
        memcpy(out + 12, &v4, 4);
        return 1;
    }
    return inet_pton(AF_INET6, buf, out) == 1;
}

/* 1 when the first `bits` bits of a and b are equal. */
static int epd_http_prefix_equal(const unsigned char a[16], const unsigned char b[16],
                                 unsigned bits)
{
    unsigned whole = bits / 8;
    unsigned rest = bits % 8;
    unsigned char mask;

    if (memcmp(a, b, whole) != 0) {
        return 0;
    }
    if (rest == 0) {
        return 1;
    }
    mask = (unsigned char)(0xff << (8 - rest));
    return (a[whole] & mask) == (b[whole] & mask);
}

/* Parses one block tok[0..len) into *cidr: 0, or -1 with why[] set. */
static int epd_http_cidr_parse(const char *tok, size_t len, epd_http_cidr_t *cidr, char *why,
                               size_t why_cap)
{
    const char *slash = memchr(tok, '/', len);
    size_t alen = slash != NULL ? (size_t)(slash - tok) : len;
    unsigned max_bits;
    unsigned bits;
    int v4;

    if (!epd__http_addr_parse(tok, alen, cidr->net)) {
        snprintf(why, why_cap, "'%.*s' is not an IPv4 or IPv6 address (want ADDR or ADDR/BITS)",
                 (int)alen, tok);
        return -1;
    }
    v4 = memchr(tok, '.', alen) != NULL && memchr(tok, ':', alen) == NULL;
    max_bits = v4 ? 32 : 128;
    bits = max_bits;
    if (slash != NULL) {
        const char *p = slash + 1;
        const char *end = tok + len;

        if (p == end || end - p > 3) {
            snprintf(why, why_cap, "'%.*s': the prefix length must be 0 to %u", (int)len, tok,
                     max_bits);
            return -1;
        }
        bits = 0;
        for (; p < end; p++) {
            if (*p < '0' || *p > '9') {
                snprintf(why, why_cap, "'%.*s': the prefix length must be 0 to %u", (int)len, tok,
                         max_bits);
                return -1;
            }
            bits = bits * 10 + (unsigned)(*p - '0');
        }
        if (bits > max_bits) {
            snprintf(why, why_cap, "'%.*s': the prefix length must be 0 to %u", (int)len, tok,
                     max_bits);
            return -1;
        }
    }
    cidr->bits = v4 ? bits + 96 : bits;
    {
        /* bits set past the prefix are a typo (10.0.0.1/8 for 10.0.0.0/8):
         * refused, not silently widened or narrowed */
        unsigned char masked[16];
        unsigned i;

        memcpy(masked, cidr->net, 16);
        for (i = cidr->bits; i < 128; i++) {
            masked[i / 8] &= (unsigned char)~(0x80u >> (i % 8));
        }
        if (memcmp(masked, cidr->net, 16) != 0) {
            char net[INET6_ADDRSTRLEN];

            if (v4) {
                inet_ntop(AF_INET, masked + 12, net, sizeof(net));
            } else {
                inet_ntop(AF_INET6, masked, net, sizeof(net));
            }
            snprintf(why, why_cap, "'%.*s' has bits set past its prefix: did you mean %s/%u?",
                     (int)len, tok, net, bits);
            return -1;
        }
    }
    return 0;
}

epd_status_t epd_http_proxies_parse(const char *list, epd_http_proxies_t **proxies_p, char *why,
                                    size_t why_cap)
{
    epd_http_proxies_t *proxies;
    size_t n = 1;
    const char *p;

    for (p = list; *p != '\0'; p++) {
        n += *p == ',';
    }
    /* ownership: the caller's on success (epd_http_proxies_destroy) */
    proxies = epd_calloc(1, sizeof(*proxies) + n * sizeof(proxies->cidr[0]));
    if (proxies == NULL) {
        snprintf(why, why_cap, "out of memory");
        return EPD_ERR_NO_MEMORY;
    }
    p = list;
    for (;;) {
        size_t len = strcspn(p, ",");
        const char *tok = p;
        size_t tlen = len;

        while (tlen > 0 && (*tok == ' ' || *tok == '\t')) {
            tok++;
            tlen--;
        }
        while (tlen > 0 && (tok[tlen - 1] == ' ' || tok[tlen - 1] == '\t')) {
            tlen--;
        }
        if (tlen == 0) {
            snprintf(why, why_cap,
                     "an empty entry: want CIDR[,CIDR...] such as "
                     "10.0.0.0/8,fd00::/8");
            goto err_free;
        }
        if (epd_http_cidr_parse(tok, tlen, &proxies->cidr[proxies->n], why, why_cap) != 0) {
            goto err_free;
        }
        proxies->n++;
        if (p[len] == '\0') {
            break;
        }
        p += len + 1;
    }
    *proxies_p = proxies;
    return EPD_OK;

err_free:
    epd_free(proxies);
    return EPD_ERR_INVALID_PARAM;
}

size_t epd_http_proxies_count(const epd_http_proxies_t *proxies)
{
    return proxies != NULL ? proxies->n : 0;
}

int epd_http_proxies_match(const epd_http_proxies_t *proxies, const unsigned char addr[16])
{
    size_t i;

    if (proxies == NULL) {
        return 0;
    }
    for (i = 0; i < proxies->n; i++) {
        if (epd_http_prefix_equal(proxies->cidr[i].net, addr, proxies->cidr[i].bits)) {
            return 1;
        }
    }
    return 0;
}

/* Walks the entries of values[0..n) from the right end, the way proxies
 * appended them: a list over several headers reads as one list. */
void epd_http_forwarded_addr(const epd_http_proxies_t *proxies, const unsigned char peer[16],
                             const char *const *values, size_t n, unsigned char addr_p[16])
{
    unsigned char addr[16];
    size_t h;

    memcpy(addr, peer, 16);
    if (!epd_http_proxies_match(proxies, addr)) {
        goto done; /* from an untrusted peer the header is the client's claim */
    }
    for (h = n; h-- > 0;) {
        const char *v = values[h];
        size_t end = strlen(v);

        while (end > 0) {
            size_t start = end;
            size_t a;
            size_t b;
            unsigned char entry[16];

            while (start > 0 && v[start - 1] != ',') {
                start--;
            }
            a = start;
            b = end;
            while (a < b && (v[a] == ' ' || v[a] == '\t')) {
                a++;
            }
            while (b > a && (v[b - 1] == ' ' || v[b - 1] == '\t')) {
                b--;
            }
            end = start > 0 ? start - 1 : 0;
            if (a == b) {
                continue; /* an empty element ("a, , b"): RFC 9110 lists allow it */
            }
            if (!epd__http_addr_parse(v + a, b - a, entry)) {
                /* not an address: the trusted hop that passed it on is as
                 * far back as the chain can be believed */
                goto done;
            }
            memcpy(addr, entry, 16);
            if (!epd_http_proxies_match(proxies, addr)) {
                goto done; /* the first untrusted entry: the client */
            }
        }
    }
    /* every entry a trusted proxy: the left-most one is the client */
done:
    memcpy(addr_p, addr, 16);
}

void epd_http_proxies_destroy(epd_http_proxies_t *proxies)
{
    epd_free(proxies);
}
