/*
 * epd_rpc_guard.c — what an unauthenticated peer can hold of a control port.
 *
 * Why epd accepts the connections itself.  Debian's gRPC core (1.51) lets
 * a peer hold what it likes: no cap on connections, none on idle ones (an
 * idle connection sends no bytes, so no gRPC deadline ever starts), and a
 * listener that stops for good after one accept4() fails with EMFILE.  And
 * it has no defence against HTTP/2 rapid reset (HEADERS + RST_STREAM pairs,
 * the CVE-2023-44487 class): it has no pending-call limit
 * (grpc.server.max_pending_requests came later), and
 * SETTINGS_MAX_CONCURRENT_STREAMS does not bound streams that are reset as
 * soon as they open.  Measured on a router (tests/integration/
 * test_control_guard.sh has the figures): 100,000 reset streams on one
 * connection took its RSS from 20 MB to 1.3 GB, kept after the connection
 * closed (a second and third burst did not grow it further: gRPC's backlog
 * of calls waiting for the server's cq thread, freed to malloc but not to
 * the system; epd's own code held at most 17 call objects at once).  Only
 * the bytes on the wire can bound that, so they pass through epd first.
 *
 * The design, the simplest that bounds descriptors and memory:
 *  - One thread with its own libuv loop (the daemon's loop carries the
 *    request plane) owns the listener and every connection.
 *  - Accept: a peer from an address that already holds max_conns_per_addr
 *    connections (an IPv6 /64 counts as one address) is closed at once.
 *    When max_conns are open, the oldest connection with no authenticated
 *    call yet is closed to make room (a flood of strangers displaces
 *    strangers, never a member); when all are members the new one is
 *    refused.  When accept4() fails for lack of descriptors (EMFILE,
 *    ENFILE: the process's other users of descriptors share the limit),
 *    the oldest stranger is closed and accept4() tried again; with no
 *    stranger to close, a spare descriptor kept for this is given up to
 *    accept the waiting peer and close it, then taken again — the backlog
 *    drains and the listener never stops (the guard accepts on its own
 *    socket: libuv's listener would close waiting peers without a word).
 *  - Until the 24-byte HTTP/2 client preface has arrived a connection costs
 *    one descriptor and ~300 bytes: gRPC has not seen it.  Then a
 *    socketpair is made, gRPC core gets one end (grpc_server_add_channel_
 *    from_fd, whose transport takes the server's channel arguments:
 *    max_concurrent_streams), and the guard copies bytes both ways, at most
 *    EPD_GUARD_QUEUE_MAX bytes queued per direction before it stops reading
 *    the other side.
 *  - Client-to-server bytes are parsed as HTTP/2 frame headers only (9
 *    bytes each; payloads are skipped, never decoded): a HEADERS frame for
 *    a new stream id opens a stream, a RST_STREAM frame is a reset.  A
 *    connection is closed when it sends more than max_resets resets in 10 s
 *    (rapid reset), or opens more than EPD_RPC_GUARD_STRANGER_STREAMS
 *    streams before one of its calls authenticated.
 *  - Deadline: auth_timeout_ms after the accept, a connection that has not
 *    had a call authenticated (epd_rpc_guard_mark, from the server's cq
 *    thread; with no secret set any call counts) is closed.  A member's
 *    channel is kept as long as it lives.
 * So a stranger holds at most auth_timeout_ms of one of max_conns slots,
 * at most max_conns_per_addr of them from one address, 3 descriptors each,
 * and gRPC at most EPD_RPC_GUARD_STRANGER_STREAMS calls per connection.
 *
 * Which connection a mark names: gRPC names a connection it got from an
 * fd "fd:N" (its end of the socketpair).  marks[N] is cleared when the
 * guard makes the socketpair that returns N, and set by the cq thread while
 * a call on it is alive — the call's reference keeps gRPC's transport, and
 * so fd N, open, so N cannot name a newer connection yet.
 *
 * Costs: one copy per byte each way through a socketpair (the control
 * plane carries registrations, heartbeats and status: small), two extra
 * descriptors per connection once it spoke HTTP/2.
 */
#include "epd_rpc_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "epd_addr.h"
#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_time.h"

#define EPD_GUARD_LOG "rpc"
#define EPD_GUARD_READ_BUF 65536
#define EPD_GUARD_QUEUE_MAX (256u << 10)
#define EPD_GUARD_MARKS_MAX (1u << 20)
#define EPD_GUARD_ACCEPT_BATCH 64 /* accepts per wake-up of the listener */

/* Kinds of events logged, each rate-limited on its own (a burst of one
 * must not hide another). */
enum {
    EPD_GUARD_EV_ACCEPT,
    EPD_GUARD_EV_ADDR,
    EPD_GUARD_EV_FULL,
    EPD_GUARD_EV_DEADLINE,
    EPD_GUARD_EV_PROTOCOL,
    EPD_GUARD_EV_FLOOD,
    EPD_GUARD_KINDS
};

typedef struct epd__guard_conn epd__guard_conn_t;

typedef struct {
    int fd; /* gRPC's end of the socketpair; -1: free */
    char name[64];
} epd__guard_name_t;

struct epd__guard_conn {
    epd_rpc_guard_t *g;
    epd__guard_conn_t *prev, *next; /* accept order: oldest first */
    uv_tcp_t peer;
    uv_pipe_t inner; /* our end of the socketpair; gRPC holds the other */
    uv_timer_t timer;
    int handles; /* open handles; the struct is freed when the last closes */
    int inner_open;
    int grpc_fd; /* gRPC's end; -1 before the preface */
    int closing;
    int64_t name_slot; /* in g->names; -1: none */
    int member;        /* a call of it authenticated (cached from marks[]) */
    int peer_reading, inner_reading;
    int peer_eof, inner_eof;             /* that side sent all it will */
    uv_shutdown_t peer_shut, inner_shut; /* the half-close passed on */
    unsigned char addr[16];
    int have_addr;
    char name[64];         /* the peer's address, for logs */
    epd_rpc_h2scan_t scan; /* the client's bytes */
    uint32_t streams;      /* streams opened */
    uint32_t resets;       /* RST_STREAM in the current window */
    uint64_t window_ns;    /* start of that window */
};

struct epd_rpc_guard {
    uv_loop_t loop;
    int listen_fd;
    uv_poll_t listener; /* listen_fd readable */
    int spare_fd;       /* /dev/null, given up when accept4 finds no descriptor */
    uv_async_t stop_async;
    pthread_t thread;
    int thread_started;
    epd_rpc_limits_t lim;
    epd_rpc_guard_adopt_cb_t adopt;
    void *arg;
    int port;
    epd__guard_conn_t *head, *tail;
    uint32_t live;
    atomic_uchar *marks; /* [n_marks]: fd -> a call on it authenticated */
    /* gRPC's fd -> the peer's address, for the server's log lines (gRPC
     * names these connections "fd:N"): a slot per connection, looked up
     * only when a line is logged */
    pthread_mutex_t names_lock;
    epd__guard_name_t *names; /* [max_conns] */
    uint32_t *free_names;     /* [max_conns]: a stack of free slots */
    uint32_t n_free_names;
    size_t n_marks;
    epd_log_limit_t log_limit[EPD_GUARD_KINDS]; /* one per kind of event */
    atomic_uint_fast64_t n_accepted, n_refused_addr, n_refused_full, n_shed, n_timed_out;
    atomic_uint_fast64_t n_bad_preface, n_reset_flood, n_stream_flood, n_accept_errors;
    atomic_uint live_now;
};

typedef struct {
    uv_write_t req;
    epd__guard_conn_t *conn;
    char *buf; /* epd_malloc'd, freed when the write completes */
} epd__guard_write_t;

static void epd_guard_conn_close(epd__guard_conn_t *c);
static void epd_guard_resume(epd__guard_conn_t *c);
static void epd_guard_read_peer(epd__guard_conn_t *c);
static void epd_guard_read_inner(epd__guard_conn_t *c);

/* ------------------------------------------------------------ helpers */

/* A rate-limited warning: strangers trigger these at will. */
#define EPD_GUARD_WARN(g, kind, ...)                                                               \
    do {                                                                                           \
        if (epd_log_enabled(EPD_LOG_WARN) && epd_log_limit_ok(&(g)->log_limit[kind], 5)) {         \
            epd_log_warn(EPD_GUARD_LOG, 0, __VA_ARGS__);                                           \
        }                                                                                          \
    } while (0)

/* The per-address key: an IPv4 address, or the /64 of an IPv6 one (a
 * host is given a whole /64).  0 on success. */
static int epd_guard_addr_key(const struct sockaddr_storage *ss, unsigned char key[16], char *name,
                              size_t cap)
{
    char host[64] = "?";

    memset(key, 0, 16);
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;

        memcpy(key, &a->sin_addr, 4);
        uv_ip4_name(a, host, sizeof(host));
        snprintf(name, cap, "%s:%u", host, (unsigned)ntohs(a->sin_port));
        return 0;
    }
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

        if (memcmp(a->sin6_addr.s6_addr, mapped, 12) == 0) {
            memcpy(key, a->sin6_addr.s6_addr + 12, 4); /* an IPv4 peer on a dual-stack port */
        } else {
            key[0] = 6;
            memcpy(key + 8, a->sin6_addr.s6_addr, 8);
        }
        uv_ip6_name(a, host, sizeof(host));
        snprintf(name, cap, "[%s]:%u", host, (unsigned)ntohs(a->sin6_port));
        return 0;
    }
    snprintf(name, cap, "?");
    return -1;
}

static int epd_guard_is_member(epd__guard_conn_t *c)
{
    epd_rpc_guard_t *g = c->g;

    if (!c->member && c->grpc_fd >= 0 && (size_t)c->grpc_fd < g->n_marks &&
        atomic_load(&g->marks[c->grpc_fd]) != 0) {
        c->member = 1;
    }
    return c->member;
}

/* The oldest connection that is not a member's, or NULL. */
static epd__guard_conn_t *epd_guard_oldest_stranger(epd_rpc_guard_t *g)
{
    for (epd__guard_conn_t *c = g->head; c != NULL; c = c->next) {
        if (!c->closing && !epd_guard_is_member(c)) {
            return c;
        }
    }
    return NULL;
}

/* ------------------------------------------------------------ closing */

static void epd_guard_on_handle_closed(uv_handle_t *h)
{
    epd__guard_conn_t *c = h->data;

    if (--c->handles == 0) {
        epd_free(c);
    }
}

static void epd_guard_conn_close(epd__guard_conn_t *c)
{
    epd_rpc_guard_t *g = c->g;

    if (c->closing) {
        return;
    }
    c->closing = 1;
    if (c->name_slot >= 0) {
        pthread_mutex_lock(&g->names_lock);
        g->names[c->name_slot].fd = -1;
        g->free_names[g->n_free_names++] = (uint32_t)c->name_slot;
        pthread_mutex_unlock(&g->names_lock);
        c->name_slot = -1;
    }
    if (c->prev != NULL) {
        c->prev->next = c->next;
    } else {
        g->head = c->next;
    }
    if (c->next != NULL) {
        c->next->prev = c->prev;
    } else {
        g->tail = c->prev;
    }
    g->live--;
    atomic_store(&g->live_now, g->live);
    /* gRPC reads EOF on its end and closes it with its transport */
    uv_close((uv_handle_t *)&c->peer, epd_guard_on_handle_closed);
    uv_close((uv_handle_t *)&c->timer, epd_guard_on_handle_closed);
    if (c->inner_open) {
        uv_close((uv_handle_t *)&c->inner, epd_guard_on_handle_closed);
    }
}

/* --------------------------------------------------------- byte copying */

static void epd_guard_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    buf->base = epd_malloc(EPD_GUARD_READ_BUF);
    buf->len = buf->base != NULL ? EPD_GUARD_READ_BUF : 0;
}

static void epd_guard_on_written(uv_write_t *req, int status)
{
    epd__guard_write_t *w = (epd__guard_write_t *)req;
    epd__guard_conn_t *c = w->conn;

    epd_free(w->buf);
    epd_free(w);
    if (c->closing) {
        return;
    }
    if (status < 0) {
        epd_guard_conn_close(c);
        return;
    }
    epd_guard_resume(c);
}

/* Queues buf[0..len) (taken) on `to`; 0, or -1 when the connection must
 * close (buf freed either way). */
static int epd_guard_forward(epd__guard_conn_t *c, uv_stream_t *to, char *buf, size_t len)
{
    epd__guard_write_t *w = epd_malloc(sizeof(*w));
    uv_buf_t b = uv_buf_init(buf, (unsigned)len);

    if (w == NULL) {
        epd_free(buf);
        return -1;
    }
    w->conn = c;
    w->buf = buf;
    if (uv_write(&w->req, to, &b, 1, epd_guard_on_written) != 0) {
        epd_free(buf);
        epd_free(w);
        return -1;
    }
    return 0;
}

/* Reads again from a side whose destination queue drained below the bound. */
static void epd_guard_resume(epd__guard_conn_t *c)
{
    if (!c->peer_reading && !c->peer_eof && c->inner_open &&
        uv_stream_get_write_queue_size((uv_stream_t *)&c->inner) < EPD_GUARD_QUEUE_MAX) {
        epd_guard_read_peer(c);
    }
    if (c->inner_open && !c->inner_reading && !c->inner_eof &&
        uv_stream_get_write_queue_size((uv_stream_t *)&c->peer) < EPD_GUARD_QUEUE_MAX) {
        epd_guard_read_inner(c);
    }
}

/* A half-close passed on finished: towards the peer, it has all gRPC
 * wrote and the connection closes. */
static void epd_guard_on_shut(uv_shutdown_t *req, int status)
{
    epd__guard_conn_t *c = req->data;

    /* towards gRPC, success only means it will answer: its EOF closes */
    if (!c->closing && (req == &c->peer_shut || status < 0)) {
        epd_guard_conn_close(c);
    }
}

static void epd_guard_on_inner_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    epd__guard_conn_t *c = s->data;

    if (n <= 0) {
        epd_free(buf->base);
        if (n == UV_EOF && !c->closing && !c->inner_eof) {
            /* gRPC closed its end: what it wrote last (a GOAWAY) reaches
             * the peer before the connection closes (uv_shutdown waits
             * for the queued writes) */
            c->inner_eof = 1;
            c->inner_reading = 0;
            c->peer_shut.data = c;
            if (uv_shutdown(&c->peer_shut, (uv_stream_t *)&c->peer, epd_guard_on_shut) != 0) {
                epd_guard_conn_close(c);
            }
        } else if (n < 0 && !c->closing) {
            epd_guard_conn_close(c);
        }
        return;
    }
    if (c->closing) {
        epd_free(buf->base);
        return;
    }
    if (epd_guard_forward(c, (uv_stream_t *)&c->peer, buf->base, (size_t)n) != 0) {
        epd_guard_conn_close(c);
        return;
    }
    if (uv_stream_get_write_queue_size((uv_stream_t *)&c->peer) >= EPD_GUARD_QUEUE_MAX) {
        uv_read_stop((uv_stream_t *)&c->inner); /* the peer does not read: wait for it */
        c->inner_reading = 0;
    }
}

static void epd_guard_read_inner(epd__guard_conn_t *c)
{
    if (uv_read_start((uv_stream_t *)&c->inner, epd_guard_alloc, epd_guard_on_inner_read) == 0) {
        c->inner_reading = 1;
    }
}

/* ------------------------------------------------------ HTTP/2 framing */

/* One frame header of the client (epd_rpc_h2scan_cb_t): counts streams
 * and resets; nonzero when the connection must close (counted, logged). */
static int epd_guard_on_frame(void *arg, uint8_t type, uint32_t sid, int opens)
{
    epd__guard_conn_t *c = arg;
    epd_rpc_guard_t *g = c->g;

    (void)sid;
    if (opens) {
        c->streams++;
        if (c->streams > EPD_RPC_GUARD_STRANGER_STREAMS && !epd_guard_is_member(c)) {
            atomic_fetch_add(&g->n_stream_flood, 1);
            EPD_GUARD_WARN(g, EPD_GUARD_EV_FLOOD,
                           "control: closed %s: %u streams and none of its calls "
                           "authenticated",
                           c->name, c->streams);
            return -1;
        }
    } else if (type == EPD_RPC_H2_RST_STREAM) {
        uint64_t now = epd_time_now_ns();

        if (now - c->window_ns > (uint64_t)EPD_RPC_GUARD_RESET_WINDOW_MS * EPD_NSEC_PER_MSEC) {
            c->window_ns = now;
            c->resets = 0;
        }
        if (++c->resets > g->lim.max_resets) {
            atomic_fetch_add(&g->n_reset_flood, 1);
            EPD_GUARD_WARN(g, EPD_GUARD_EV_FLOOD,
                           "control: closed %s: over %u stream resets within %u s "
                           "(--control-max-resets; HTTP/2 rapid reset)",
                           c->name, g->lim.max_resets, EPD_RPC_GUARD_RESET_WINDOW_MS / 1000);
            return -1;
        }
    }
    return 0;
}

/* The preface is complete: a socketpair, one end to gRPC.  0 or -1. */
static int epd_guard_hand_over(epd__guard_conn_t *c)
{
    epd_rpc_guard_t *g = c->g;
    char *preface;
    int sv[2];

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) != 0) {
        atomic_fetch_add(&g->n_accept_errors, 1);
        EPD_GUARD_WARN(g, EPD_GUARD_EV_ACCEPT, "control: cannot serve %s: socketpair: %s", c->name,
                       strerror(errno));
        if (errno == EMFILE || errno == ENFILE) {
            epd__guard_conn_t *old = epd_guard_oldest_stranger(g);

            if (old != NULL && old != c) {
                atomic_fetch_add(&g->n_shed, 1);
                epd_guard_conn_close(old);
            }
        }
        return -1;
    }
    if (uv_pipe_init(&g->loop, &c->inner, 0) != 0) {
        close(sv[0]);
        close(sv[1]);
        return -1;
    }
    c->inner.data = c;
    c->handles++;
    c->inner_open = 1;
    if (uv_pipe_open(&c->inner, sv[0]) != 0) {
        close(sv[0]); /* the handle is closed with the connection */
        close(sv[1]);
        return -1;
    }
    if ((size_t)sv[1] < g->n_marks) {
        atomic_store(&g->marks[sv[1]], 0);
    }
    c->grpc_fd = sv[1];
    pthread_mutex_lock(&g->names_lock);
    if (g->n_free_names > 0) {
        c->name_slot = g->free_names[--g->n_free_names];
        g->names[c->name_slot].fd = sv[1];
        snprintf(g->names[c->name_slot].name, sizeof(g->names[c->name_slot].name), "%s", c->name);
    }
    pthread_mutex_unlock(&g->names_lock);
    g->adopt(g->arg, sv[1]); /* gRPC owns sv[1] from here */
    preface = epd_malloc(EPD_RPC_H2_PREFACE_LEN);
    if (preface == NULL) {
        return -1;
    }
    memcpy(preface, EPD_RPC_H2_PREFACE, EPD_RPC_H2_PREFACE_LEN);
    if (epd_guard_forward(c, (uv_stream_t *)&c->inner, preface, EPD_RPC_H2_PREFACE_LEN) != 0) {
        return -1;
    }
    epd_guard_read_inner(c);
    return 0;
}

static void epd_guard_on_peer_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    epd__guard_conn_t *c = s->data;
    epd_rpc_guard_t *g = c->g;
    unsigned char *p = (unsigned char *)buf->base;
    size_t len = n > 0 ? (size_t)n : 0;
    uint32_t preface_before = c->scan.preface;
    size_t off; /* bytes of this read that were preface: gRPC gets it whole at hand-over */
    epd_status_t st;

    if (n <= 0 || c->closing) {
        epd_free(buf->base);
        if (n == UV_EOF && !c->closing && c->inner_open && !c->peer_eof) {
            /* the peer half-closed: gRPC is told the same and answers what
             * it has; its EOF then closes the connection (a stranger's
             * deadline still runs) */
            c->peer_eof = 1;
            c->peer_reading = 0;
            c->inner_shut.data = c;
            if (uv_shutdown(&c->inner_shut, (uv_stream_t *)&c->inner, epd_guard_on_shut) != 0) {
                epd_guard_conn_close(c);
            }
        } else if (n < 0 && !c->closing) {
            epd_guard_conn_close(c); /* gone, or EOF before it spoke HTTP/2 */
        }
        return;
    }
    st = epd_rpc_h2scan_feed(&c->scan, p, len, epd_guard_on_frame, c);
    if (st == EPD_ERR_MALFORMED) {
        atomic_fetch_add(&g->n_bad_preface, 1);
        EPD_GUARD_WARN(g, EPD_GUARD_EV_PROTOCOL, "control: closed %s: not an HTTP/2 client preface",
                       c->name);
    }
    if (st != EPD_OK) {
        goto err_close;
    }
    off = EPD_RPC_H2_PREFACE_LEN - preface_before;
    off = len < off ? len : off;
    if (preface_before < EPD_RPC_H2_PREFACE_LEN && c->scan.preface == EPD_RPC_H2_PREFACE_LEN &&
        epd_guard_hand_over(c) != 0) {
        goto err_close;
    }
    if (len == off) {
        epd_free(buf->base);
        return;
    }
    memmove(p, p + off, len - off);
    if (epd_guard_forward(c, (uv_stream_t *)&c->inner, buf->base, len - off) != 0) {
        epd_guard_conn_close(c);
        return;
    }
    if (uv_stream_get_write_queue_size((uv_stream_t *)&c->inner) >= EPD_GUARD_QUEUE_MAX) {
        uv_read_stop((uv_stream_t *)&c->peer); /* gRPC does not keep up: wait for it */
        c->peer_reading = 0;
    }
    return;

err_close:
    epd_free(buf->base);
    epd_guard_conn_close(c);
}

static void epd_guard_read_peer(epd__guard_conn_t *c)
{
    if (uv_read_start((uv_stream_t *)&c->peer, epd_guard_alloc, epd_guard_on_peer_read) == 0) {
        c->peer_reading = 1;
    }
}

/* ------------------------------------------------------------ accepting */

static void epd_guard_on_deadline(uv_timer_t *t)
{
    epd__guard_conn_t *c = t->data;
    epd_rpc_guard_t *g = c->g;

    if (c->closing || epd_guard_is_member(c)) {
        return;
    }
    atomic_fetch_add(&g->n_timed_out, 1);
    EPD_GUARD_WARN(g, EPD_GUARD_EV_DEADLINE,
                   "control: closed %s: %s within %u ms of connecting "
                   "(--control-auth-timeout-ms)",
                   c->name,
                   c->scan.preface < EPD_RPC_H2_PREFACE_LEN ? "no HTTP/2 preface"
                                                            : "no call authenticated",
                   g->lim.auth_timeout_ms);
    epd_guard_conn_close(c);
}

/* Takes in one accepted socket `fd` from `ss`, or closes it (refused). */
static void epd_guard_take(epd_rpc_guard_t *g, int fd, const struct sockaddr_storage *ss)
{
    epd__guard_conn_t *c;
    uint32_t same = 0;

    c = epd_calloc(1, sizeof(*c));
    if (c == NULL) {
        close(fd);
        return;
    }
    c->g = g;
    c->grpc_fd = -1;
    c->name_slot = -1;
    uv_tcp_init(&g->loop, &c->peer);
    c->peer.data = c;
    c->handles = 1;
    if (uv_tcp_open(&c->peer, fd) != 0) {
        close(fd);
        uv_close((uv_handle_t *)&c->peer, epd_guard_on_handle_closed);
        return;
    }
    if (epd_guard_addr_key(ss, c->addr, c->name, sizeof(c->name)) == 0) {
        c->have_addr = 1;
    }
    if (c->have_addr && g->lim.max_conns_per_addr != UINT32_MAX) {
        for (epd__guard_conn_t *o = g->head; o != NULL; o = o->next) {
            same += o->have_addr && memcmp(o->addr, c->addr, sizeof(c->addr)) == 0;
        }
    }
    if (same >= g->lim.max_conns_per_addr && g->lim.max_conns_per_addr != UINT32_MAX) {
        atomic_fetch_add(&g->n_refused_addr, 1);
        EPD_GUARD_WARN(g, EPD_GUARD_EV_ADDR,
                       "control: refused %s: %u connections from its address "
                       "(--control-max-conns-per-addr)",
                       c->name, same);
        uv_close((uv_handle_t *)&c->peer, epd_guard_on_handle_closed);
        return;
    }
    if (g->live >= g->lim.max_conns) {
        epd__guard_conn_t *old = epd_guard_oldest_stranger(g);

        if (old == NULL) {
            atomic_fetch_add(&g->n_refused_full, 1);
            EPD_GUARD_WARN(g, EPD_GUARD_EV_FULL,
                           "control: refused %s: %u members' connections open "
                           "(--control-max-conns)",
                           c->name, g->live);
            uv_close((uv_handle_t *)&c->peer, epd_guard_on_handle_closed);
            return;
        }
        atomic_fetch_add(&g->n_shed, 1);
        EPD_GUARD_WARN(g, EPD_GUARD_EV_FULL,
                       "control: %u connections open (--control-max-conns): closed %s, the "
                       "oldest unauthenticated, for %s",
                       g->live, old->name, c->name);
        epd_guard_conn_close(old);
    }
    uv_timer_init(&g->loop, &c->timer);
    c->timer.data = c;
    c->handles++;
    c->prev = g->tail;
    if (g->tail != NULL) {
        g->tail->next = c;
    } else {
        g->head = c;
    }
    g->tail = c;
    g->live++;
    atomic_store(&g->live_now, g->live);
    atomic_fetch_add(&g->n_accepted, 1);
    uv_tcp_nodelay(&c->peer, 1);
    uv_timer_start(&c->timer, epd_guard_on_deadline, g->lim.auth_timeout_ms, 0);
    epd_guard_read_peer(c);
}

/* Out of descriptors (accept4 failed EMFILE/ENFILE): the oldest
 * unauthenticated connection is closed (uv_close closes its socket at
 * once) so the next accept4 succeeds; with none, the spare descriptor is
 * given up to accept the waiting peer and close it, then taken again, so
 * the backlog drains and the listener stays live.  Either way the caller
 * accepts again. */
static void epd_guard_out_of_fds(epd_rpc_guard_t *g, int err)
{
    epd__guard_conn_t *old = epd_guard_oldest_stranger(g);

    atomic_fetch_add(&g->n_accept_errors, 1);
    EPD_GUARD_WARN(g, EPD_GUARD_EV_ACCEPT, "control: accept: %s (%u connections open); %s",
                   strerror(err), g->live,
                   old != NULL ? "closing the oldest unauthenticated one"
                               : "refusing the next with the spare descriptor");
    if (old != NULL) {
        atomic_fetch_add(&g->n_shed, 1);
        epd_guard_conn_close(old);
        return;
    }
    if (g->spare_fd >= 0) {
        int fd;

        close(g->spare_fd);
        fd = accept4(g->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) {
            close(fd);
        }
        g->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
}

/* The listening socket is readable: accept what waits, a bounded batch
 * per wake-up (the loop also carries the connections' bytes). */
static void epd_guard_on_listen(uv_poll_t *poll, int status, int events)
{
    epd_rpc_guard_t *g = poll->data;

    (void)events;
    if (status < 0) {
        return;
    }
    for (int i = 0; i < EPD_GUARD_ACCEPT_BATCH; i++) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        int fd = accept4(g->listen_fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd >= 0) {
            epd_guard_take(g, fd, &ss);
            continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return;
        }
        if (errno == EMFILE || errno == ENFILE) {
            epd_guard_out_of_fds(g, errno);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) {
            continue;
        }
        atomic_fetch_add(&g->n_accept_errors, 1);
        EPD_GUARD_WARN(g, EPD_GUARD_EV_ACCEPT, "control: accept: %s", strerror(errno));
        return; /* level-triggered: the next turn tries again */
    }
}

/* ------------------------------------------------------------ life cycle */

static void epd_guard_on_stop(uv_async_t *a)
{
    epd_rpc_guard_t *g = a->data;

    while (g->head != NULL) {
        epd_guard_conn_close(g->head);
    }
    uv_close((uv_handle_t *)&g->listener, NULL);
    uv_close((uv_handle_t *)&g->stop_async, NULL);
    close(g->listen_fd);
    g->listen_fd = -1;
    if (g->spare_fd >= 0) {
        close(g->spare_fd);
        g->spare_fd = -1;
    }
}

static void *epd_guard_thread(void *arg)
{
    epd_rpc_guard_t *g = arg;

    uv_run(&g->loop, UV_RUN_DEFAULT);
    return NULL;
}

/* The cap in force: max_conns, at most a third of the descriptors left
 * after a reserve for everything else (a quarter of the limit, at most
 * 1024).  Sized once, at start: a daemon raises its limit before. */
static uint32_t epd_guard_fd_budget(uint32_t want, size_t *limit_p)
{
    struct rlimit rl;
    rlim_t reserve, room;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) {
        *limit_p = EPD_GUARD_MARKS_MAX;
        return want;
    }
    *limit_p = rl.rlim_cur < EPD_GUARD_MARKS_MAX ? (size_t)rl.rlim_cur : EPD_GUARD_MARKS_MAX;
    reserve = rl.rlim_cur / 4 < 1024 ? rl.rlim_cur / 4 : 1024;
    room = (rl.rlim_cur - reserve) / 3;
    if (room < 1) {
        room = 1;
    }
    return (rlim_t)want > room ? (uint32_t)room : want;
}

epd_status_t epd_rpc_guard_start(const char *bind_addr, const epd_rpc_limits_t *limits,
                                 epd_rpc_guard_adopt_cb_t adopt, void *arg,
                                 epd_rpc_guard_t **guard_p)
{
    epd_rpc_guard_t *g;
    char host[128];
    uint16_t port;
    struct sockaddr_storage ss;
    struct sockaddr_storage bound;
    socklen_t namelen = sizeof(bound);
    uint32_t want;
    epd_status_t st = EPD_ERR_UNREACHABLE;
    int one = 1;

    g = epd_calloc(1, sizeof(*g));
    if (g == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    g->lim = *limits;
    if (g->lim.max_conns == 0) {
        g->lim.max_conns = EPD_RPC_DEFAULT_MAX_CONNS;
    }
    if (g->lim.max_conns_per_addr == 0) {
        g->lim.max_conns_per_addr = EPD_RPC_DEFAULT_MAX_CONNS_PER_ADDR;
    }
    if (g->lim.auth_timeout_ms == 0) {
        g->lim.auth_timeout_ms = EPD_RPC_DEFAULT_AUTH_TIMEOUT_MS;
    }
    if (g->lim.max_resets == 0) {
        g->lim.max_resets = EPD_RPC_DEFAULT_MAX_RESETS;
    }
    want = g->lim.max_conns;
    g->lim.max_conns = epd_guard_fd_budget(want, &g->n_marks);
    if (g->lim.max_conns < want) {
        epd_log_warn(EPD_GUARD_LOG, 0,
                     "control: --control-max-conns %u clamped to %u by the file-descriptor "
                     "limit %zu (3 a connection, a reserve kept)",
                     want, g->lim.max_conns, g->n_marks);
    }
    g->adopt = adopt;
    g->arg = arg;
    g->marks = epd_calloc(g->n_marks, sizeof(*g->marks));
    g->names = epd_calloc(g->lim.max_conns, sizeof(*g->names));
    g->free_names = epd_calloc(g->lim.max_conns, sizeof(*g->free_names));
    if (g->marks == NULL || g->names == NULL || g->free_names == NULL) {
        st = EPD_ERR_NO_MEMORY;
        goto err_free;
    }
    for (uint32_t i = 0; i < g->lim.max_conns; i++) {
        g->names[i].fd = -1;
        g->free_names[i] = g->lim.max_conns - 1 - i;
    }
    g->n_free_names = g->lim.max_conns;
    pthread_mutex_init(&g->names_lock, NULL);
    if (uv_loop_init(&g->loop) != 0) {
        st = EPD_ERR_FATAL;
        goto err_mutex;
    }
    g->listen_fd = -1;
    g->spare_fd = -1;
    if (epd_addr_split(bind_addr, host, sizeof(host), &port, NULL) != EPD_OK ||
        (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) != 0 &&
         uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) != 0)) {
        epd_log_error(EPD_GUARD_LOG, 0, "control: '%s' is not a numeric HOST:PORT", bind_addr);
        goto err_loop;
    }
    /* our own socket, not uv_listen: libuv's listener handles EMFILE by
     * closing the waiting peers without telling us, and the guard must
     * shed to make room (epd_guard_out_of_fds).  SO_REUSEADDR as libuv
     * sets it; no SO_REUSEPORT: a second daemon cannot share the port. */
    g->listen_fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (g->listen_fd < 0 ||
        setsockopt(g->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(g->listen_fd, (const struct sockaddr *)&ss,
             ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in)) !=
            0 ||
        listen(g->listen_fd, 511) != 0 ||
        getsockname(g->listen_fd, (struct sockaddr *)&bound, &namelen) != 0) {
        epd_log_error(EPD_GUARD_LOG, 0, "control: cannot listen on %s: %s", bind_addr,
                      strerror(errno));
        goto err_loop;
    }
    g->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (uv_poll_init(&g->loop, &g->listener, g->listen_fd) != 0) {
        goto err_loop;
    }
    g->listener.data = g;
    uv_poll_start(&g->listener, UV_READABLE, epd_guard_on_listen);
    g->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
    uv_async_init(&g->loop, &g->stop_async, epd_guard_on_stop);
    g->stop_async.data = g;
    if (pthread_create(&g->thread, NULL, epd_guard_thread, g) != 0) {
        st = EPD_ERR_FATAL;
        uv_close((uv_handle_t *)&g->stop_async, NULL);
        goto err_loop;
    }
    g->thread_started = 1;
    *guard_p = g;
    return EPD_OK;

err_loop:
    if (uv_is_active((uv_handle_t *)&g->listener) || g->listener.data == g) {
        uv_close((uv_handle_t *)&g->listener, NULL);
    }
    uv_run(&g->loop, UV_RUN_DEFAULT);
    if (g->listen_fd >= 0) {
        close(g->listen_fd);
    }
    if (g->spare_fd >= 0) {
        close(g->spare_fd);
    }
    uv_loop_close(&g->loop);
err_mutex:
    pthread_mutex_destroy(&g->names_lock);
err_free:
    epd_free(g->free_names);
    epd_free(g->names);
    epd_free(g->marks);
    epd_free(g);
    return st;
}

int epd_rpc_guard_port(const epd_rpc_guard_t *g)
{
    return g->port;
}

void epd_rpc_guard_mark(epd_rpc_guard_t *g, const char *peer)
{
    long fd;
    char *end;

    if (g == NULL || peer == NULL || strncmp(peer, "fd:", 3) != 0) {
        return;
    }
    errno = 0;
    fd = strtol(peer + 3, &end, 10);
    if (errno != 0 || end == peer + 3 || fd < 0 || (size_t)fd >= g->n_marks) {
        return;
    }
    atomic_store(&g->marks[fd], 1);
}

void epd_rpc_guard_stats(const epd_rpc_guard_t *g, epd_rpc_guard_stats_t *s)
{
    memset(s, 0, sizeof(*s));
    if (g == NULL) {
        return;
    }
    s->accepted = atomic_load(&g->n_accepted);
    s->refused_addr = atomic_load(&g->n_refused_addr);
    s->refused_full = atomic_load(&g->n_refused_full);
    s->shed = atomic_load(&g->n_shed);
    s->timed_out = atomic_load(&g->n_timed_out);
    s->bad_preface = atomic_load(&g->n_bad_preface);
    s->reset_flood = atomic_load(&g->n_reset_flood);
    s->stream_flood = atomic_load(&g->n_stream_flood);
    s->accept_errors = atomic_load(&g->n_accept_errors);
    s->live = atomic_load(&g->live_now);
    s->max_conns = g->lim.max_conns;
}

void epd_rpc_guard_stop(epd_rpc_guard_t *g)
{
    if (g == NULL || !g->thread_started) {
        return;
    }
    uv_async_send(&g->stop_async);
    pthread_join(g->thread, NULL);
    g->thread_started = 0;
    /* every handle was closed by epd_guard_on_stop and the loop ran dry */
    if (uv_loop_close(&g->loop) != 0) {
        epd_log_warn(EPD_GUARD_LOG, 0, "control: the guard's loop still had handles at stop");
    }
}

void epd_rpc_guard_destroy(epd_rpc_guard_t *g)
{
    if (g == NULL) {
        return;
    }
    pthread_mutex_destroy(&g->names_lock);
    epd_free(g->free_names);
    epd_free(g->names);
    epd_free(g->marks);
    epd_free(g);
}

void epd_rpc_guard_peer_name(epd_rpc_guard_t *g, const char *peer, char *out, size_t cap)
{
    long fd;
    char *end;

    snprintf(out, cap, "%s", peer != NULL ? peer : "?");
    if (g == NULL || peer == NULL || strncmp(peer, "fd:", 3) != 0) {
        return;
    }
    fd = strtol(peer + 3, &end, 10);
    if (end == peer + 3 || fd < 0) {
        return;
    }
    pthread_mutex_lock(&g->names_lock);
    for (uint32_t i = 0; i < g->lim.max_conns; i++) {
        if (g->names[i].fd == fd) {
            snprintf(out, cap, "%s", g->names[i].name);
            break;
        }
    }
    pthread_mutex_unlock(&g->names_lock);
}
