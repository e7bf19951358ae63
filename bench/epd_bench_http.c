/*
 * epd_bench_http.c — epd-bench's blocking HTTP/1.1 client (see
 * epd_bench_http.h).
 *
 * One non-blocking socket driven by poll(): every wait (connect, each
 * send, each read) gets what is left of the one deadline, so a server
 * that stops answering costs the caller at most timeout_ms, never a hang
 * (the hand-made GETs this replaces had a 5 s timeout per read, or none).
 * The answer ends at its Content-Length, at the chunked body's last chunk,
 * or at the close: waiting for the close when the length is known would
 * cost a server's keep-alive timeout on a server that ignores
 * Connection: close.
 */
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "epd_addr.h"
#include "epd_alloc.h"
#include "epd_bench_http.h"
#include "epd_time.h"

#define HB_FIRST_CAP (64u << 10)
#define HB_GET_MAX (16u << 20)

/* Waits until fd is ready for `events` or the deadline passed.  EPD_OK or
 * EPD_ERR_TIMEOUT / EPD_ERR_IO. */
static epd_status_t hb_wait(int fd, short events, uint64_t deadline)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        uint64_t now = epd_time_now_ns();
        int ms, n;

        if (now >= deadline) {
            return EPD_ERR_TIMEOUT;
        }
        ms = (int)((deadline - now + EPD_NSEC_PER_MSEC - 1) / EPD_NSEC_PER_MSEC);
        n = poll(&p, 1, ms);
        if (n > 0) {
            return EPD_OK;
        }
        if (n < 0 && errno != EINTR) {
            return EPD_ERR_IO;
        }
    }
}

/* A connected non-blocking socket to hostport into *fd_p. */
static epd_status_t hb_connect(const char *hostport, uint64_t deadline, int *fd_p)
{
    struct addrinfo hints, *ai = NULL;
    char host[256], port_s[8];
    uint16_t port;
    epd_status_t st;
    int fd, err = 0;
    socklen_t el = sizeof(err);

    if (epd_addr_split(hostport, host, sizeof(host), &port, NULL) != EPD_OK) {
        return EPD_ERR_INVALID_PARAM;
    }
    snprintf(port_s, sizeof(port_s), "%u", (unsigned)port);
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    /* a literal first: no resolver round trip inside a timed request */
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    if (getaddrinfo(host, port_s, &hints, &ai) != 0) {
        hints.ai_flags = AI_NUMERICSERV;
        if (getaddrinfo(host, port_s, &hints, &ai) != 0) {
            return EPD_ERR_UNREACHABLE;
        }
    }
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(ai);
        return EPD_ERR_IO;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) {
            st = EPD_ERR_UNREACHABLE;
            goto err_close;
        }
        st = hb_wait(fd, POLLOUT, deadline);
        if (st != EPD_OK) {
            goto err_close;
        }
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
            st = EPD_ERR_UNREACHABLE;
            goto err_close;
        }
    }
    freeaddrinfo(ai);
    *fd_p = fd;
    return EPD_OK;

err_close:
    close(fd);
    freeaddrinfo(ai);
    return st;
}

static epd_status_t hb_send_all(int fd, const char *p, size_t len, uint64_t deadline)
{
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            return EPD_ERR_IO;
        }
        if (n < 0 && errno != EINTR) {
            epd_status_t st = hb_wait(fd, POLLOUT, deadline);

            if (st != EPD_OK) {
                return st;
            }
        }
    }
    return EPD_OK;
}

/* Decodes the chunked body at b[0..len) in place.  1: complete, with its
 * length in *out_p; 0: not all there yet; -1: malformed. */
static int hb_dechunk(char *b, size_t len, int write, size_t *out_p)
{
    size_t in = 0, out = 0;

    for (;;) {
        char *eol = memmem(b + in, len - in, "\r\n", 2);
        unsigned long long n;
        char *end;

        if (eol == NULL) {
            return len - in > 32 ? -1 : 0;
        }
        if (!isxdigit((unsigned char)b[in])) {
            return -1; /* strtoull would skip blanks and signs */
        }
        n = strtoull(b + in, &end, 16);
        if (end > eol) {
            return -1;
        }
        if (n > len) {
            return 0; /* more than has come so far */
        }
        in = (size_t)(eol - b) + 2;
        if (n == 0) {
            /* trailers (none expected) end at an empty line */
            if (memmem(b + in - 2, len - in + 2, "\r\n\r\n", 4) == NULL) {
                return 0;
            }
            break;
        }
        if (len - in < n + 2) {
            return 0;
        }
        if (b[in + n] != '\r' || b[in + n + 1] != '\n') {
            return -1;
        }
        if (write) {
            memmove(b + out, b + in, (size_t)n);
        }
        out += (size_t)n;
        in += (size_t)n + 2;
    }
    *out_p = out;
    return 1;
}

/* Whether the headers buf[0..hdr) (hdr: the body's offset) say
 * "Transfer-Encoding: chunked". */
static int hb_chunked(char *buf, size_t hdr)
{
    static const char name[] = "\r\ntransfer-encoding:";
    char *end = buf + hdr - 4;
    const char *te;

    *end = '\0'; /* the search stops at the headers' end */
    te = strcasestr(buf, name);
    *end = '\r';
    if (te == NULL) {
        return 0;
    }
    te += sizeof(name) - 1;
    return strncasecmp(te + strspn(te, " \t"), "chunked", 7) == 0;
}

/* Whether buf[0..len) is a whole answer: 1 yes, 0 not yet, -1 malformed
 * (chunked only).  *hdr_p: the body's offset, once the headers are in. */
static int hb_complete(char *buf, size_t len, size_t *hdr_p)
{
    char *end = strstr(buf, "\r\n\r\n");
    const char *cl;
    size_t hdr, n;

    if (end == NULL) {
        return 0;
    }
    hdr = (size_t)(end - buf) + 4;
    *hdr_p = hdr;
    if (hb_chunked(buf, hdr)) {
        return hb_dechunk(buf + hdr, len - hdr, 0, &n);
    }
    *end = '\0'; /* the search stops at the headers' end */
    cl = strcasestr(buf, "\r\ncontent-length:");
    *end = '\r';
    if (cl != NULL) {
        return len - hdr >= strtoull(cl + 17, NULL, 10);
    }
    return 0; /* to the close */
}

epd_status_t epd_bench_http_request(const char *hostport, const char *method, const char *path,
                                    const char *body, size_t body_len, uint32_t timeout_ms,
                                    size_t max_bytes, epd_bench_http_resp_t *resp_p)
{
    uint64_t deadline = epd_time_now_ns() + (uint64_t)timeout_ms * EPD_NSEC_PER_MSEC;
    size_t len = 0, cap = HB_FIRST_CAP < max_bytes ? HB_FIRST_CAP : max_bytes, hdr = 0, out_len;
    char head[512];
    char *buf;
    epd_status_t st;
    int fd, hl, done = 0, status;

    hl = snprintf(head, sizeof(head), "%s %s HTTP/1.1\r\nHost: %s\r\n", method, path, hostport);
    if (hl < 0 || (size_t)hl >= sizeof(head) - 128 || max_bytes == 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (body != NULL) {
        hl += snprintf(head + hl, sizeof(head) - (size_t)hl,
                       "Content-Type: application/json\r\nConnection: close\r\n"
                       "Content-Length: %zu\r\n\r\n",
                       body_len);
    } else {
        hl += snprintf(head + hl, sizeof(head) - (size_t)hl, "Connection: close\r\n\r\n");
    }
    buf = epd_malloc(cap + 1);
    if (buf == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    st = hb_connect(hostport, deadline, &fd);
    if (st != EPD_OK) {
        goto err_free;
    }
    st = hb_send_all(fd, head, (size_t)hl, deadline);
    if (st == EPD_OK && body != NULL) {
        st = hb_send_all(fd, body, body_len, deadline);
    }
    while (st == EPD_OK && !done) {
        ssize_t n;
        int c;

        if (len == cap) {
            char *bigger;

            if (cap >= max_bytes) {
                st = EPD_ERR_TOO_LONG;
                break;
            }
            cap = cap * 2 < max_bytes ? cap * 2 : max_bytes;
            bigger = epd_realloc(buf, cap + 1);
            if (bigger == NULL) {
                st = EPD_ERR_NO_MEMORY;
                break;
            }
            buf = bigger;
        }
        n = recv(fd, buf + len, cap - len, 0);
        if (n == 0) {
            break; /* the close ends the answer */
        }
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            st = errno == EAGAIN || errno == EWOULDBLOCK ? hb_wait(fd, POLLIN, deadline)
                                                         : EPD_ERR_IO;
            continue;
        }
        len += (size_t)n;
        buf[len] = '\0';
        c = hb_complete(buf, len, &hdr);
        if (c < 0) {
            st = EPD_ERR_MALFORMED;
        }
        done = c > 0;
    }
    close(fd);
    if (st != EPD_OK) {
        goto err_free;
    }
    buf[len] = '\0';
    if (hdr == 0) {
        (void)hb_complete(buf, len, &hdr); /* the close came with the first read */
    }
    if (hdr == 0 || sscanf(buf, "HTTP/1.%*d %d", &status) != 1) {
        st = EPD_ERR_MALFORMED;
        goto err_free;
    }
    out_len = len - hdr;
    if (hb_chunked(buf, hdr) && hb_dechunk(buf + hdr, len - hdr, 1, &out_len) != 1) {
        st = EPD_ERR_MALFORMED;
        goto err_free;
    }
    buf[hdr + out_len] = '\0';
    resp_p->status = status; /* written only on success */
    resp_p->buf = buf;
    resp_p->len = hdr + out_len;
    resp_p->body = buf + hdr;
    resp_p->body_len = out_len;
    return EPD_OK;

err_free:
    epd_free(buf);
    return st;
}

void epd_bench_http_resp_cleanup(epd_bench_http_resp_t *resp)
{
    epd_free(resp->buf);
    memset(resp, 0, sizeof(*resp));
}

epd_status_t epd_bench_http_get(const char *hostport, const char *path, uint32_t timeout_ms,
                                char **body_p, size_t *len_p)
{
    epd_bench_http_resp_t r;
    epd_status_t st;

    st = epd_bench_http_request(hostport, "GET", path, NULL, 0, timeout_ms, HB_GET_MAX, &r);
    if (st != EPD_OK) {
        return st;
    }
    if (r.status != 200) {
        st = r.status == 404 ? EPD_ERR_NOT_FOUND : EPD_ERR_IO;
        epd_bench_http_resp_cleanup(&r);
        return st;
    }
    /* the body alone, at the start of the buffer the caller takes */
    memmove(r.buf, r.body, r.body_len + 1);
    *body_p = r.buf;
    if (len_p != NULL) {
        *len_p = r.body_len;
    }
    return EPD_OK;
}
