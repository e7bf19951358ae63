/*
 * test_xport_conformance.c — one conformance suite for every compiled
 * transport backend and configuration (epd_xport.h's promises).
 *
 * Each configuration (backend name + environment + expected transport
 * class) runs in its own process: with no arguments this program re-executes
 * itself once per configuration ("--conf NAME") and reports each; with
 * --conf it runs the cmocka group for that one.  Adding a backend or a
 * transport is one line in epd_test_confs[].
 *
 * Every test talks to real peer processes on 127.0.0.1: a peer is this
 * program re-executed with "--peer CONF FD" (fork + exec, so it starts with
 * no inherited UCX/libfabric state), given one end of a socketpair.  The
 * socketpair stands in for the control plane: the peer sends its address
 * blob and the packed key of a region it allocated over it.  Everything
 * else travels over the transport under test:
 *
 *   CHECK {offset, len, xxh3}...  sent with EPD_XPORT_SEND_FENCE right after
 *                                 posting writes (without waiting for them):
 *                                 the peer hashes its region when the
 *                                 message arrives and answers RESULT — a
 *                                 mismatch means data lost, corrupted, or the
 *                                 fence overtaken by a write;
 *   SEQ {seq, xxh3, payload}      random sizes up to max_msg_size; the peer
 *                                 checks order and content, END asks RESULT.
 *
 * The trust boundary (DESIGN.md): a peer may be started with a cluster
 * secret ("--peer CONF FD MODE", MODE a | b | none) and an identity; over
 * the socketpair the test then asks it for what it saw ('S': accepts,
 * messages, refusals, the identity of its last accepted endpoint) and has
 * it connect back ('C'), so both directions of every handshake are checked
 * from both ends.  The peer also keeps a local (source-only) region and
 * hands over the key an attacker would need for it.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "epd_alloc.h"
#include "epd_hash.h"
#include "epd_log.h"
#include "epd_rng.h"
#include "epd_time.h"
#include "epd_xport.h"
#include "epd_xport_int.h"

/* UCX keeps some process-wide allocations until exit (its global
 * configuration and memory hooks); they are not epd's.  Only consulted by
 * LeakSanitizer builds. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libucs.so\nleak:libucp.so\nleak:libuct.so\nleak:libucm.so\n"
           "leak:libfabric.so\nleak:librdmacm.so\nleak:libibverbs.so\n";
}

typedef struct {
    const char *name;
    const char *backend;
    const char *expect;      /* what the lanes must be */
    const char *wrong;       /* an expectation that must be refused */
    const char *provider;
    const char *env[4];      /* NAME=VALUE, NULL-terminated */
    int extra;               /* only when named by EPD_XPORT_CONF (keeps the default run short) */
} epd_test_conf_t;

static const epd_test_conf_t epd_test_confs[] = {
#if EPD_WITH_UCX
    /* shared memory, every lane iface-connected (posix AM, cma rma_bw) */
    {"ucx-shm",
     "ucx",
     "shm",
     "tcp",
     NULL,
     {"UCX_TLS=posix,cma,tcp", "UCX_NET_DEVICES=lo", NULL},
     0},
    /* shared memory next to a wired-up tcp lane (rma_bw): the closing of
     * half-wired endpoints matters here (see epd__ucx_ep_destroy) */
    {"ucx-posix-tcp",
     "ucx",
     "shm",
     "tcp",
     NULL,
     {"UCX_TLS=posix,tcp", "UCX_NET_DEVICES=lo", NULL},
     0},
    {"ucx-sysv", "ucx", "shm", "tcp", NULL, {"UCX_TLS=sysv,tcp", "UCX_NET_DEVICES=lo", NULL}, 1},
    {"ucx-tcp", "ucx", "tcp", "shm", NULL, {"UCX_TLS=tcp", "UCX_NET_DEVICES=lo", NULL}, 0},
#endif
#if EPD_WITH_OFI
    {"ofi-tcp", "ofi", "tcp", "shm", "tcp;ofi_rxm", {"FI_PROVIDER=tcp;ofi_rxm", NULL}, 0},
    /* writes without delivery complete: flushes read the target's sink */
    {"ofi-tcp-readflush",
     "ofi",
     "tcp",
     "shm",
     "tcp;ofi_rxm",
     {"FI_PROVIDER=tcp;ofi_rxm", "EPD_OFI_DELIVERY_COMPLETE=0", NULL},
     1},
#endif
};
#define N_CONFS (sizeof(epd_test_confs) / sizeof(epd_test_confs[0]))

#define REGION_SIZE ((size_t)72 << 20)
#define REG_SIZE ((size_t)8 << 20) /* the peer's second region: its own memory, mr_reg */
#define MAX_MSG (512 * 1024) /* above the core's 64 KiB small-copy size */
#define SEQ_MSG (64 * 1024)  /* the random stream of test_messages_in_order */
/* The machine running the suite is shared and loaded: a generous peer
 * timeout everywhere except the test that kills a peer, which uses 1 s. */
#define PEER_TIMEOUT_MS 5000
#define KILL_PEER_TIMEOUT_MS 1000
#define CONNECT_TIMEOUT_MS 1500
/* The handshake deadline of the host's workers where a connect must
 * succeed: ofi-tcp under ASan with other programs beside it once took more
 * than 1.5 s to answer the third guessed-key connect of test_guessed_keys
 * (after two connections torn down by the peer's provider).  The tests of
 * the deadline itself (test_connect_dead, refused_pair) use
 * CONNECT_TIMEOUT_MS, and so does the peer process. */
#define CONNECT_OK_TIMEOUT_MS 10000

enum { M_CHECK = 1, M_RESULT, M_SEQ, M_END, M_QUIT };

typedef struct {
    uint32_t type;
    uint32_t n;
} m_hdr_t;

typedef struct {
    uint64_t offset;
    uint64_t len;
    uint64_t hash;
    uint64_t region; /* 0: the peer's mr_alloc region, 1: its mr_reg region */
} m_check_t;

typedef struct {
    uint32_t type;
    uint32_t n;
    uint64_t ok;
    uint64_t bad;
} m_result_t;

typedef struct {
    uint32_t type;
    uint32_t pad;
    uint64_t seq;
    uint64_t hash;
} m_seq_t;

static const epd_test_conf_t *conf;

/* Cluster secrets of the trust-boundary tests. */
static const char secret_a[] = "conformance cluster secret A, 32+";
static const char secret_b[] = "conformance cluster secret B, 32+";
#define LOCAL_SIZE ((size_t)1 << 20) /* the peer's local region (region 2 of CHECK) */
#define PEER_ROLE 3
static uint32_t peer_timeout_ms = PEER_TIMEOUT_MS;
static uint32_t max_inflight = 4096;
static uint32_t connect_timeout_ms = CONNECT_TIMEOUT_MS;
static char self_path[4096];

/* ------------------------------------------------------------- helpers */

static void apply_env(const epd_test_conf_t *c)
{
    for (int i = 0; c->env[i] != NULL; i++) {
        char buf[256];
        char *eq;
        snprintf(buf, sizeof(buf), "%s", c->env[i]);
        eq = strchr(buf, '=');
        *eq = '\0';
        setenv(buf, eq + 1, 1);
    }
}

static const epd_test_conf_t *find_conf(const char *name)
{
    for (size_t i = 0; i < N_CONFS; i++) {
        if (strcmp(epd_test_confs[i].name, name) == 0) {
            return &epd_test_confs[i];
        }
    }
    return NULL;
}

static int chan_write(int fd, const void *data, uint32_t len)
{
    const char *p = data;
    size_t left = len;

    if (write(fd, &len, sizeof(len)) != sizeof(len)) {
        return -1;
    }
    while (left > 0) {
        ssize_t n = write(fd, p, left);
        if (n <= 0) {
            return -1;
        }
        p += n;
        left -= (size_t)n;
    }
    return 0;
}

/* Reads one length-prefixed blob, progressing `x` (may be NULL) meanwhile. */
static int chan_read(int fd, epd_xport_t *x, void *buf, uint32_t cap, uint32_t *len_p,
                     int timeout_ms)
{
    uint64_t deadline = epd_time_now_ns() + (uint64_t)timeout_ms * EPD_NSEC_PER_MSEC;
    uint32_t len;
    size_t got = 0;
    char *p;

    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, x != NULL ? 0 : 10) > 0) {
            break;
        }
        if (x != NULL) {
            epd_xport_poll(x, 1);
        }
        if (epd_time_now_ns() > deadline) {
            return -1;
        }
    }
    if (read(fd, &len, sizeof(len)) != sizeof(len) || len > cap) {
        return -1;
    }
    p = buf;
    while (got < len) {
        ssize_t n = read(fd, p + got, len - got);
        if (n <= 0) {
            return -1;
        }
        got += (size_t)n;
    }
    *len_p = len;
    return 0;
}

/* ------------------------------------------------------------ the peer */

/* What a peer reports over the socketpair ('S'). */
typedef struct {
    uint32_t accepts;
    uint32_t msgs;
    uint64_t handshakes_refused;
    uint64_t frames_forged;
    int32_t last_authed; /* -1: nothing accepted */
    int32_t last_role;
    char last_id[EPD_XPORT_WORKER_ID_MAX + 1];
} peer_report_t;

typedef struct {
    epd_xport_t *x;
    epd_xport_mr_t *mr;
    epd_xport_mr_t *reg_mr;
    epd_xport_mr_t *local_mr;
    peer_report_t report;
    epd_xport_ep_t *reply_ep;
    m_result_t pending;   /* a reply to send from the main loop */
    int have_pending;
    uint64_t seq_expected;
    uint64_t seq_ok, seq_bad;
    int quit;
} peer_t;

static void peer_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    peer_t *pr = arg;
    m_hdr_t h;
    epd_xport_mr_t *mrs[3] = {pr->mr, pr->reg_mr, pr->local_mr};

    pr->report.msgs++;
    if (len < sizeof(h)) {
        return;
    }
    memcpy(&h, data, sizeof(h));
    pr->reply_ep = ep;
    if (h.type == M_CHECK && len == sizeof(h) + (size_t)h.n * sizeof(m_check_t)) {
        m_result_t r = {.type = M_RESULT, .n = h.n};
        for (uint32_t i = 0; i < h.n; i++) {
            m_check_t c;
            memcpy(&c, (const char *)data + sizeof(h) + i * sizeof(c), sizeof(c));
            if (c.region < 3 && c.offset + c.len <= epd_xport_mr_size(mrs[c.region]) &&
                epd_hash64((const unsigned char *)epd_xport_mr_addr(mrs[c.region]) + c.offset,
                           c.len, 0) == c.hash) {
                r.ok++;
            } else {
                r.bad++;
            }
        }
        pr->pending = r;
        pr->have_pending = 1;
    } else if (h.type == M_SEQ && len >= sizeof(m_seq_t)) {
        m_seq_t s;
        memcpy(&s, data, sizeof(s));
        if (s.seq == pr->seq_expected &&
            epd_hash64((const char *)data + sizeof(s), len - sizeof(s), s.seq) == s.hash) {
            pr->seq_ok++;
        } else {
            pr->seq_bad++;
        }
        pr->seq_expected = s.seq + 1;
    } else if (h.type == M_END) {
        m_result_t r = {.type = M_RESULT, .n = h.n, .ok = pr->seq_ok, .bad = pr->seq_bad};
        pr->pending = r;
        pr->have_pending = 1;
        pr->seq_ok = pr->seq_bad = 0;
        pr->seq_expected = 0;
    } else if (h.type == M_QUIT) {
        pr->quit = 1;
    }
}

static void peer_accept(void *arg, epd_xport_ep_t *ep)
{
    peer_t *pr = arg;
    epd_xport_identity_t id;
    int authed = 0;

    pr->report.accepts++;
    if (epd_xport_ep_identity(ep, &id, &authed) == EPD_OK) {
        pr->report.last_authed = authed;
        pr->report.last_role = id.role;
        memcpy(pr->report.last_id, id.worker_id, sizeof(pr->report.last_id));
    }
}

/* A secret (MODE "a" / "b" / "none") and an identity into `cfg`; NULL mode:
 * neither, the configuration every older test runs with. */
static void apply_trust(epd_xport_config_t *cfg, const char *mode, const char *who, int role)
{
    if (mode == NULL) {
        return;
    }
    if (strcmp(mode, "a") == 0 || strcmp(mode, "b") == 0) {
        cfg->secret = mode[0] == 'a' ? secret_a : secret_b;
        cfg->secret_len = strlen(cfg->secret);
    }
    snprintf(cfg->identity.worker_id, sizeof(cfg->identity.worker_id), "%s-%d", who, (int)getpid());
    cfg->identity.role = role;
    cfg->identity.epoch.start_time_ns = epd_time_now_ns();
    cfg->identity.epoch.nonce = (uint64_t)getpid() * 7919u;
}

static epd_xport_config_t test_config(epd_xport_msg_cb_t cb, void *arg)
{
    epd_xport_config_t cfg;

    epd_xport_config_init(&cfg);
    cfg.backend = conf->backend;
    cfg.provider = conf->provider;
    cfg.max_msg_size = MAX_MSG;
    cfg.peer_timeout_ms = peer_timeout_ms;
    cfg.max_inflight = max_inflight;
    cfg.connect_timeout_ms = connect_timeout_ms;
    cfg.msg_cb = cb;
    cfg.cb_arg = arg;
    return cfg;
}

typedef struct {
    int calls;
    epd_status_t status;
} peer_conn_t;

static void peer_connect_cb(void *arg, epd_status_t status)
{
    peer_conn_t *c = arg;

    if (c->calls++ == 0) {
        c->status = status;
    }
}

/* The peer connects to the address the test sent ('C') and answers with
 * the connect's status (int32), progressing meanwhile. */
static void peer_connect_back(peer_t *pr, int fd)
{
    unsigned char blob[EPD_XPORT_ADDR_MAX];
    uint32_t len;
    epd_xport_ep_t *ep = NULL;
    peer_conn_t c = {0, EPD_OK};
    int32_t answer;
    epd_status_t st;
    uint64_t deadline = epd_time_now_ns() + 10 * EPD_NSEC_PER_SEC;

    if (chan_read(fd, pr->x, blob, sizeof(blob), &len, 5000) != 0) {
        return;
    }
    st = epd_xport_connect(pr->x, blob, len, peer_connect_cb, &c, &ep);
    if (st == EPD_INPROGRESS) {
        while (c.calls == 0 && epd_time_now_ns() < deadline) {
            epd_xport_poll(pr->x, 1);
        }
        st = c.calls != 0 ? c.status : EPD_ERR_TIMEOUT;
    }
    answer = (int32_t)st;
    (void)chan_write(fd, &answer, sizeof(answer));
    /* a connected endpoint stays open for the test to look at; a failed one
     * goes */
    if (ep != NULL && st != EPD_OK) {
        epd_xport_ep_close(ep);
    }
}

static int peer_main(int fd, const char *mode)
{
    peer_t pr;
    epd_xport_config_t cfg;
    const void *blob;
    size_t blob_len;
    unsigned char key[EPD_XPORT_RKEY_MAX];
    size_t key_len, key2_len, key3_len = 0;
    unsigned char key2[EPD_XPORT_RKEY_MAX];
    unsigned char key3[EPD_XPORT_RKEY_MAX];
    void *reg_mem = epd_calloc(1, REG_SIZE);
    uint64_t deadline = epd_time_now_ns() + 120 * EPD_NSEC_PER_SEC;

    epd_status_t st;

    memset(&pr, 0, sizeof(pr));
    pr.report.last_authed = -1;
    cfg = test_config(peer_msg, &pr);
    cfg.accept_cb = peer_accept;
    apply_trust(&cfg, mode, "peer", PEER_ROLE);
    st = epd_xport_create(&cfg, &pr.x);
    if (st != EPD_OK) {
        fprintf(stderr, "peer %d: epd_xport_create: %s\n", (int)getpid(), epd_status_name(st));
        return 2;
    }
    if ((st = epd_xport_mr_alloc(pr.x, REGION_SIZE, &pr.mr)) != EPD_OK ||
        (st = epd_xport_address(pr.x, &blob, &blob_len)) != EPD_OK ||
        (st = epd_xport_mr_pack(pr.mr, key, sizeof(key), &key_len)) != EPD_OK ||
        (st = reg_mem == NULL ? EPD_ERR_NO_MEMORY : EPD_OK) != EPD_OK ||
        (st = epd_xport_mr_reg(pr.x, reg_mem, REG_SIZE, &pr.reg_mr)) != EPD_OK ||
        (st = epd_xport_mr_pack(pr.reg_mr, key2, sizeof(key2), &key2_len)) != EPD_OK ||
        (st = epd_xport_mr_alloc_ex(pr.x, LOCAL_SIZE, EPD_XPORT_MR_LOCAL, &pr.local_mr)) !=
            EPD_OK) {
        fprintf(stderr, "peer %d: region set-up: %s\n", (int)getpid(), epd_status_name(st));
        return 3;
    }
    /* the key an attacker would need for the local region (none may exist) */
    if (epd__xport_mr_pack_any(pr.local_mr, key3, sizeof(key3), &key3_len) != EPD_OK) {
        key3_len = 0;
    }
    if (chan_write(fd, blob, (uint32_t)blob_len) != 0 ||
        chan_write(fd, key, (uint32_t)key_len) != 0 ||
        chan_write(fd, key2, (uint32_t)key2_len) != 0 ||
        chan_write(fd, key3, (uint32_t)key3_len) != 0) {
        fprintf(stderr, "peer %d: side channel: %s\n", (int)getpid(), strerror(errno));
        return 4;
    }
    while (!pr.quit && epd_time_now_ns() < deadline) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        char c;

        epd_xport_poll(pr.x, 2);
        if (pr.have_pending && pr.reply_ep != NULL) {
            /* done unless backpressure (a dead endpoint: the test notices) */
            if (epd_xport_send(pr.reply_ep, &pr.pending, sizeof(pr.pending), 0) !=
                EPD_ERR_NO_RESOURCE) {
                pr.have_pending = 0;
            }
        }
        /* parent gone: stop; else its commands */
        if (poll(&pfd, 1, 0) > 0) {
            if (read(fd, &c, 1) <= 0) {
                break;
            }
            if (c == 'S') {
                epd_xport_stats_t xs;
                epd_xport_stats(pr.x, &xs);
                pr.report.handshakes_refused = xs.handshakes_refused;
                pr.report.frames_forged = xs.frames_forged;
                (void)chan_write(fd, &pr.report, sizeof(pr.report));
            } else if (c == 'C') {
                peer_connect_back(&pr, fd);
            }
        }
    }
    epd_xport_mr_dereg(pr.mr);
    epd_xport_mr_dereg(pr.reg_mr);
    epd_xport_mr_dereg(pr.local_mr);
    epd_xport_destroy(pr.x);
    epd_free(reg_mem);
    return 0;
}

/* ------------------------------------------------------- the test side */

typedef struct {
    epd_xport_t *x;
    m_result_t result;
    int have_result;
    int errs;
    epd_status_t err_status;
    uint64_t err_ns;
    int accepts;
    epd_xport_ep_t *accepted; /* the latest */
} host_t;

typedef struct {
    pid_t pid;
    int fd;
    unsigned char blob[EPD_XPORT_ADDR_MAX];
    uint32_t blob_len;
    unsigned char key[EPD_XPORT_RKEY_MAX];
    uint32_t key_len;
    unsigned char key2[EPD_XPORT_RKEY_MAX]; /* of the peer's mr_reg region */
    uint32_t key2_len;
    unsigned char key3[EPD_XPORT_RKEY_MAX]; /* its local region's, had it leaked (may be empty) */
    uint32_t key3_len;
} peer_proc_t;

static void host_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    host_t *h = arg;

    (void)ep;
    if (len == sizeof(m_result_t)) {
        memcpy(&h->result, data, sizeof(h->result));
        h->have_result = 1;
    }
}

static void host_err(void *arg, epd_xport_ep_t *ep, epd_status_t status)
{
    host_t *h = arg;

    (void)ep;
    if (h->errs++ == 0) {
        h->err_status = status;
        h->err_ns = epd_time_now_ns();
    }
}

static void host_accept(void *arg, epd_xport_ep_t *ep)
{
    host_t *h = arg;

    h->accepts++;
    h->accepted = ep;
}

static void host_init(host_t *h, const char *expect)
{
    epd_xport_config_t cfg;

    memset(h, 0, sizeof(*h));
    cfg = test_config(host_msg, h);
    cfg.expect = expect;
    cfg.err_cb = host_err;
    cfg.accept_cb = host_accept;
    assert_int_equal(epd_xport_create(&cfg, &h->x), EPD_OK);
}

static void peer_start_mode(peer_proc_t *p, epd_xport_t *x, const char *mode)
{
    int sv[2];
    char fd_arg[16];

    memset(p, 0, sizeof(*p));
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    snprintf(fd_arg, sizeof(fd_arg), "%d", sv[1]);
    p->pid = fork();
    assert_true(p->pid >= 0);
    if (p->pid == 0) {
        close(sv[0]);
        if (mode != NULL) {
            execl(self_path, self_path, "--peer", conf->name, fd_arg, mode, (char *)NULL);
        } else {
            execl(self_path, self_path, "--peer", conf->name, fd_arg, (char *)NULL);
        }
        _exit(127);
    }
    close(sv[1]);
    fcntl(sv[0], F_SETFD, FD_CLOEXEC);
    p->fd = sv[0];
    if (chan_read(p->fd, x, p->blob, sizeof(p->blob), &p->blob_len, 20000) != 0 ||
        chan_read(p->fd, x, p->key, sizeof(p->key), &p->key_len, 20000) != 0 ||
        chan_read(p->fd, x, p->key2, sizeof(p->key2), &p->key2_len, 20000) != 0 ||
        chan_read(p->fd, x, p->key3, sizeof(p->key3), &p->key3_len, 20000) != 0) {
        int status = 0;
        kill(p->pid, SIGKILL);
        waitpid(p->pid, &status, 0);
        fail_msg("peer %d did not start: %s %d", (int)p->pid,
                 WIFSIGNALED(status) ? "signal" : "exit status",
                 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    }
}

static void peer_start(peer_proc_t *p, epd_xport_t *x)
{
    peer_start_mode(p, x, NULL);
}

static void peer_stop(peer_proc_t *p)
{
    int status;
    uint64_t deadline = epd_time_now_ns() + 5 * EPD_NSEC_PER_SEC;

    if (p->pid <= 0) {
        return;
    }
    close(p->fd); /* the peer sees EOF and exits */
    while (waitpid(p->pid, &status, WNOHANG) == 0) {
        if (epd_time_now_ns() > deadline) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &status, 0);
            break;
        }
        epd_time_sleep_ns(5 * EPD_NSEC_PER_MSEC);
    }
    p->pid = 0;
}

typedef struct {
    int calls;
    epd_status_t status;
} comp_t;

static void comp_cb(void *arg, epd_status_t status)
{
    comp_t *c = arg;

    if (c->calls++ == 0) {
        c->status = status;
    }
}

static int wait_flag(epd_xport_t *x, const int *flag, int target, int timeout_ms)
{
    uint64_t deadline = epd_time_now_ns() + (uint64_t)timeout_ms * EPD_NSEC_PER_MSEC;

    while (*flag < target) {
        if (epd_time_now_ns() > deadline) {
            return -1;
        }
        epd_xport_poll(x, 1);
    }
    return 0;
}

/* Connects and unpacks the peer's key; asserts the lanes meet the config's
 * expectation and prints them. */
static epd_xport_ep_t *connect_peer(host_t *h, peer_proc_t *p, epd_xport_rkey_t **rkey_p)
{
    comp_t c = {0};
    epd_xport_ep_t *ep = NULL;
    char desc[512];

    assert_int_equal(epd_xport_connect(h->x, p->blob, p->blob_len, comp_cb, &c, &ep),
                     EPD_INPROGRESS);
    assert_int_equal(wait_flag(h->x, &c.calls, 1, 10000), 0);
    assert_int_equal(c.status, EPD_OK);
    assert_int_not_equal(epd_xport_ep_peer_id(ep), 0);
    epd_xport_ep_describe(ep, desc, sizeof(desc));
    printf("[%s] lanes: %s\n", conf->name, desc);
    if (rkey_p != NULL) {
        assert_int_equal(epd_xport_rkey_unpack(ep, p->key, p->key_len, rkey_p), EPD_OK);
        assert_int_equal(epd_xport_rkey_size(*rkey_p), REGION_SIZE);
    }
    return ep;
}

/* Sends `msg` (retrying on backpressure) and waits for the peer's RESULT. */
static m_result_t ask(host_t *h, epd_xport_ep_t *ep, const void *msg, size_t len, unsigned flags)
{
    epd_status_t st;
    uint64_t deadline = epd_time_now_ns() + 30 * EPD_NSEC_PER_SEC;

    h->have_result = 0;
    while ((st = epd_xport_send(ep, msg, len, flags)) == EPD_ERR_NO_RESOURCE) {
        assert_true(epd_time_now_ns() < deadline);
        epd_xport_poll(h->x, 1);
    }
    assert_int_equal(st, EPD_OK);
    assert_int_equal(wait_flag(h->x, &h->have_result, 1, 30000), 0);
    return h->result;
}

static void send_quit(host_t *h, epd_xport_ep_t *ep)
{
    m_hdr_t q = {.type = M_QUIT};

    (void)epd_xport_send(ep, &q, sizeof(q), 0);
    for (int i = 0; i < 20; i++) {
        epd_xport_poll(h->x, 1);
    }
}

/* -------------------------------------------------------------- tests */

static void *check_buf;

/* Posts `n` writes of `size` random bytes, all in flight at once, then a
 * fenced CHECK at once: the peer must see every byte when it arrives. */
static void write_batch(host_t *h, epd_xport_ep_t *ep, epd_xport_rkey_t *rk, uint64_t region,
                        epd_xport_mr_t *lmr, size_t size, uint32_t n, epd_rng_t *rng)
{
    comp_t *comps = epd_calloc(n, sizeof(*comps));
    size_t *loffs = epd_calloc(n, sizeof(*loffs));
    m_hdr_t *hdr = check_buf;
    m_check_t *checks = (m_check_t *)(hdr + 1);
    unsigned char *local = epd_xport_mr_addr(lmr);
    size_t stride = size + 13;
    int done = 0;
    uint64_t deadline = epd_time_now_ns() + 60 * EPD_NSEC_PER_SEC;
    m_result_t r;

    assert_non_null(comps);
    assert_non_null(loffs);
    assert_true((size_t)n * stride <= epd_xport_rkey_size(rk));
    assert_true(sizeof(*hdr) + n * sizeof(*checks) <= MAX_MSG);
    hdr->type = M_CHECK;
    hdr->n = n;
    /* fresh bytes first: a posted buffer is lent until its completion, so
     * nothing may change under a write in flight (sources may overlap) */
    for (uint32_t i = 0; i < n; i++) {
        loffs[i] = (size_t)(epd_rng_next(rng) % (epd_xport_mr_size(lmr) - size + 1));
        epd_rng_fill(rng, local + loffs[i], size < 64 ? size : 64);
    }
    for (uint32_t i = 0; i < n; i++) {
        checks[i].offset = (uint64_t)i * stride + (epd_rng_next(rng) % 13);
        checks[i].len = size;
        checks[i].hash = epd_hash64(local + loffs[i], size, 0);
        checks[i].region = region;
    }
    for (uint32_t i = 0; i < n; i++) {
        epd_status_t st;

        while ((st = epd_xport_write(ep, local + loffs[i], size, lmr, rk, checks[i].offset, comp_cb,
                                     &comps[i])) == EPD_ERR_NO_RESOURCE) {
            assert_true(epd_time_now_ns() < deadline);
            epd_xport_progress(h->x);
        }
        assert_int_equal(st, EPD_INPROGRESS);
    }
    r = ask(h, ep, check_buf, sizeof(*hdr) + n * sizeof(*checks), EPD_XPORT_SEND_FENCE);
    if (r.bad != 0) {
        printf("[%s] %llu of %u writes of %zu bytes wrong at the fence\n", conf->name,
               (unsigned long long)r.bad, n, size);
    }
    assert_int_equal(r.bad, 0);
    assert_int_equal(r.ok, n);
    while (done < (int)n) {
        done = 0;
        for (uint32_t i = 0; i < n; i++) {
            done += comps[i].calls > 0;
        }
        if (done < (int)n) {
            assert_true(epd_time_now_ns() < deadline);
            epd_xport_poll(h->x, 1);
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(comps[i].calls, 1);
        assert_int_equal(comps[i].status, EPD_OK);
    }
    epd_free(comps);
    epd_free(loffs);
}

static void test_writes_land(void **state)
{
    host_t h;
    peer_proc_t p;
    epd_xport_ep_t *ep;
    epd_xport_rkey_t *rk, *rk2;
    epd_xport_mr_t *lmr;
    epd_rng_t rng;
    uint64_t t0;

    (void)state;
    host_init(&h, conf->expect);
    peer_start(&p, h.x);
    ep = connect_peer(&h, &p, &rk);
    assert_int_equal(epd_xport_mr_alloc(h.x, (size_t)65 << 20, &lmr), EPD_OK);
    epd_rng_seed(&rng, 42);
    epd_rng_fill(&rng, epd_xport_mr_addr(lmr), epd_xport_mr_size(lmr));

    t0 = epd_time_now_ns();
    write_batch(&h, ep, rk, 0, lmr, 1, 1000, &rng);
    write_batch(&h, ep, rk, 0, lmr, 4096, 1000, &rng);
    write_batch(&h, ep, rk, 0, lmr, 1 << 20, 64, &rng);
    write_batch(&h, ep, rk, 0, lmr, (size_t)64 << 20, 1, &rng);
    write_batch(&h, ep, rk, 0, lmr, (size_t)64 << 20, 1, &rng);
    /* into memory the peer registered (not allocated by the transport):
     * no direct mapping, the rendezvous path on every configuration */
    assert_int_equal(epd_xport_rkey_unpack(ep, p.key2, p.key2_len, &rk2), EPD_OK);
    assert_int_equal(epd_xport_rkey_size(rk2), REG_SIZE);
    write_batch(&h, ep, rk2, 1, lmr, 1, 500, &rng);
    write_batch(&h, ep, rk2, 1, lmr, 4096, 500, &rng);
    write_batch(&h, ep, rk2, 1, lmr, 1 << 20, 7, &rng);
    write_batch(&h, ep, rk2, 1, lmr, REG_SIZE - 13, 1, &rng);
    epd_xport_rkey_destroy(rk2);
    printf("[%s] writes 1 B..64 MiB verified in %.0f ms\n", conf->name,
           (double)(epd_time_now_ns() - t0) / 1e6);

    assert_int_equal(h.errs, 0);
    send_quit(&h, ep);
    epd_xport_rkey_destroy(rk);
    epd_xport_ep_close(ep);
    epd_xport_mr_dereg(lmr);
    peer_stop(&p);
    epd_xport_destroy(h.x);
}

/* A fenced message never overtakes an earlier write: repeated, with
 * unregistered local memory too (local_mr NULL). */
static void test_fence_repeated(void **state)
{
    host_t h;
    peer_proc_t p;
    epd_xport_ep_t *ep;
    epd_xport_rkey_t *rk;
    epd_rng_t rng;
    size_t size = 256 * 1024;
    unsigned char *local = epd_malloc(size);
    struct {
        m_hdr_t h;
        m_check_t c;
    } msg;

    (void)state;
    assert_non_null(local);
    host_init(&h, conf->expect);
    peer_start(&p, h.x);
    ep = connect_peer(&h, &p, &rk);
    epd_rng_seed(&rng, 7);
    for (int i = 0; i < 200; i++) {
        comp_t c = {0};
        size_t len = 1 + (size_t)(epd_rng_next(&rng) % size);
        uint64_t off = epd_rng_next(&rng) % (REGION_SIZE - len);
        m_result_t r;

        epd_rng_fill(&rng, local, len);
        assert_int_equal(epd_xport_write(ep, local, len, NULL, rk, off, comp_cb, &c),
                         EPD_INPROGRESS);
        msg.h.type = M_CHECK;
        msg.h.n = 1;
        msg.c.offset = off;
        msg.c.len = len;
        msg.c.hash = epd_hash64(local, len, 0);
        msg.c.region = 0;
        r = ask(&h, ep, &msg, sizeof(msg), EPD_XPORT_SEND_FENCE);
        assert_int_equal(r.bad, 0);
        assert_int_equal(wait_flag(h.x, &c.calls, 1, 10000), 0);
        assert_int_equal(c.status, EPD_OK);
    }
    /* flush completes after the writes before it */
    {
        comp_t w = {0}, f = {0};
        assert_int_equal(epd_xport_write(ep, local, size, NULL, rk, 0, comp_cb, &w), EPD_INPROGRESS);
        assert_int_equal(epd_xport_flush(ep, comp_cb, &f), EPD_INPROGRESS);
        assert_int_equal(wait_flag(h.x, &f.calls, 1, 10000), 0);
        assert_int_equal(f.status, EPD_OK);
        assert_int_equal(wait_flag(h.x, &w.calls, 1, 10000), 0);
        assert_int_equal(w.status, EPD_OK);
    }
    assert_int_equal(h.errs, 0);
    send_quit(&h, ep);
    epd_xport_rkey_destroy(rk);
    epd_xport_ep_close(ep);
    peer_stop(&p);
    epd_xport_destroy(h.x);
    epd_free(local);
}

/* Messages arrive intact and in order, random sizes up to max_msg_size. */
static void test_messages_in_order(void **state)
{
    host_t h;
    peer_proc_t p;
    epd_xport_ep_t *ep;
    epd_rng_t rng;
    unsigned char *buf = epd_malloc(MAX_MSG);
    m_hdr_t end = {.type = M_END};
    m_result_t r;
    const uint32_t n = 3000;
    uint64_t deadline = epd_time_now_ns() + 60 * EPD_NSEC_PER_SEC;

    (void)state;
    assert_non_null(buf);
    host_init(&h, conf->expect);
    peer_start(&p, h.x);
    ep = connect_peer(&h, &p, NULL);
    epd_rng_seed(&rng, 99);
    for (uint32_t i = 0; i < n; i++) {
        m_seq_t s = {.type = M_SEQ, .seq = i};
        size_t len = sizeof(s) + (size_t)(epd_rng_next(&rng) % (SEQ_MSG - sizeof(s) + 1));
        epd_status_t st;

        if (i % 7 == 0) {
            len = sizeof(s) + (size_t)(epd_rng_next(&rng) % 64); /* plenty of small ones */
        }
        epd_rng_fill(&rng, buf + sizeof(s), len - sizeof(s));
        s.hash = epd_hash64(buf + sizeof(s), len - sizeof(s), s.seq);
        memcpy(buf, &s, sizeof(s));
        while ((st = epd_xport_send(ep, buf, len, 0)) == EPD_ERR_NO_RESOURCE) {
            assert_true(epd_time_now_ns() < deadline);
            epd_xport_progress(h.x);
        }
        assert_int_equal(st, EPD_OK);
    }
    r = ask(&h, ep, &end, sizeof(end), 0);
    assert_int_equal(r.bad, 0);
    assert_int_equal(r.ok, n);
    /* refusals on a live endpoint */
    assert_int_equal(epd_xport_send(ep, buf, MAX_MSG + 1, 0), EPD_ERR_TOO_LONG);
    assert_int_equal(epd_xport_send(ep, buf, 0, 0), EPD_ERR_INVALID_PARAM);
    send_quit(&h, ep);
    epd_xport_ep_close(ep);
    peer_stop(&p);
    epd_xport_destroy(h.x);
    epd_free(buf);
}

/* Messages larger than the core's pooled copies, held behind fences:
 * each fenced one waits for a write, so the core copies it (to its own
 * size) and sends it later; all arrive intact and in order, and sends
 * refused for the byte bound succeed once the held ones went out. */
static void test_large_held_messages(void **state)
{
    host_t h;
    peer_proc_t p;
    epd_xport_ep_t *ep;
    epd_xport_rkey_t *rk;
    epd_rng_t rng;
    unsigned char *buf = epd_malloc(MAX_MSG);
    unsigned char *local = epd_malloc(64 * 1024);
    m_hdr_t end = {.type = M_END};
    m_result_t r;
    const uint32_t n = 40;
    comp_t c[40];
    uint64_t deadline = epd_time_now_ns() + 60 * EPD_NSEC_PER_SEC;

    (void)state;
    assert_non_null(buf);
    assert_non_null(local);
    memset(c, 0, sizeof(c));
    host_init(&h, conf->expect);
    peer_start(&p, h.x);
    ep = connect_peer(&h, &p, &rk);
    epd_rng_seed(&rng, 4242);
    for (uint32_t i = 0; i < n; i++) {
        m_seq_t s = {.type = M_SEQ, .seq = i};
        size_t len = MAX_MSG / 2 + (size_t)(epd_rng_next(&rng) % (MAX_MSG / 2 - sizeof(s) + 1));
        epd_status_t st;

        epd_rng_fill(&rng, local, 64 * 1024);
        assert_int_equal(epd_xport_write(ep, local, 64 * 1024, NULL, rk,
                                         (uint64_t)(i % 8) * 64 * 1024, comp_cb, &c[i]),
                         EPD_INPROGRESS);
        epd_rng_fill(&rng, buf + sizeof(s), len - sizeof(s));
        s.hash = epd_hash64(buf + sizeof(s), len - sizeof(s), s.seq);
        memcpy(buf, &s, sizeof(s));
        while ((st = epd_xport_send(ep, buf, len, EPD_XPORT_SEND_FENCE)) == EPD_ERR_NO_RESOURCE) {
            assert_true(epd_time_now_ns() < deadline);
            epd_xport_progress(h.x);
        }
        assert_int_equal(st, EPD_OK);
    }
    r = ask(&h, ep, &end, sizeof(end), 0);
    assert_int_equal(r.bad, 0);
    assert_int_equal(r.ok, n);
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(wait_flag(h.x, &c[i].calls, 1, 10000), 0);
        assert_int_equal(c[i].status, EPD_OK);
    }
    /* small fenced messages held behind a write cost small copies, not
     * max_msg_size each (completions are small: a big message limit must
     * not make every held one pin megabytes) */
    {
        epd_alloc_stats_t before, during;
        comp_t w = {0};
        m_seq_t s = {.type = M_SEQ};
        m_result_t r2;

        epd_alloc_stats(&before);
        assert_int_equal(epd_xport_write(ep, local, 64 * 1024, NULL, rk, 0, comp_cb, &w),
                         EPD_INPROGRESS);
        for (uint32_t i = 0; i < 32; i++) {
            s.seq = i; /* END restarted the peer's count */
            s.hash = epd_hash64(buf, 0, s.seq);
            assert_int_equal(epd_xport_send(ep, &s, sizeof(s), EPD_XPORT_SEND_FENCE), EPD_OK);
        }
        epd_alloc_stats(&during);
        print_message("32 held small messages: %llu bytes more\n",
                      (unsigned long long)(during.live_bytes - before.live_bytes));
        assert_true(during.live_bytes - before.live_bytes < 32ull * 64 * 1024 + (64 << 10));
        r2 = ask(&h, ep, &end, sizeof(end), 0);
        assert_int_equal(r2.bad, 0);
        assert_int_equal(r2.ok, 32);
        assert_int_equal(wait_flag(h.x, &w.calls, 1, 10000), 0);
    }
    assert_int_equal(h.errs, 0);
    send_quit(&h, ep);
    epd_xport_rkey_destroy(rk);
    epd_xport_ep_close(ep);
    peer_stop(&p);
    epd_xport_destroy(h.x);
    epd_free(local);
    epd_free(buf);
}

/* Garbage address and key blobs, writes out of range, wrong expectation. */
static void test_refusals(void **state)
{
    host_t h, wrong;
    peer_proc_t p;
    epd_xport_ep_t *ep, *bad_ep = NULL;
    epd_xport_rkey_t *rk, *bad_rk = NULL;
    epd_rng_t rng;
    unsigned char junk[EPD_XPORT_ADDR_MAX];
    unsigned char local[64];
    comp_t c = {0};

    (void)state;
    epd_rng_seed(&rng, 5);
    host_init(&h, conf->expect);
    peer_start(&p, h.x);

    /* address blobs: zero length, random bytes of many lengths, truncated,
     * one flipped byte */
    assert_int_equal(epd_xport_connect(h.x, p.blob, 0, comp_cb, &c, &bad_ep), EPD_ERR_BAD_ADDRESS);
    for (int i = 0; i < 200; i++) {
        size_t len = 1 + (size_t)(epd_rng_next(&rng) % sizeof(junk));
        epd_rng_fill(&rng, junk, len);
        assert_int_equal(epd_xport_connect(h.x, junk, len, comp_cb, &c, &bad_ep),
                         EPD_ERR_BAD_ADDRESS);
    }
    for (uint32_t len = 1; len < p.blob_len; len += 1 + len / 4) {
        assert_int_equal(epd_xport_connect(h.x, p.blob, len, comp_cb, &c, &bad_ep),
                         EPD_ERR_BAD_ADDRESS);
    }
    memcpy(junk, p.blob, p.blob_len);
    junk[p.blob_len - 1] ^= 0x5a;
    assert_int_equal(epd_xport_connect(h.x, junk, p.blob_len, comp_cb, &c, &bad_ep),
                     EPD_ERR_BAD_ADDRESS);
    assert_null(bad_ep);
    assert_int_equal(c.calls, 0);

    ep = connect_peer(&h, &p, &rk);

    /* keys */
    assert_int_equal(epd_xport_rkey_unpack(ep, p.key, 0, &bad_rk), EPD_ERR_BAD_RKEY);
    for (int i = 0; i < 200; i++) {
        size_t len = 1 + (size_t)(epd_rng_next(&rng) % EPD_XPORT_RKEY_MAX);
        epd_rng_fill(&rng, junk, len);
        assert_int_equal(epd_xport_rkey_unpack(ep, junk, len, &bad_rk), EPD_ERR_BAD_RKEY);
    }
    for (uint32_t len = 1; len < p.key_len; len++) {
        assert_int_equal(epd_xport_rkey_unpack(ep, p.key, len, &bad_rk), EPD_ERR_BAD_RKEY);
    }
    memcpy(junk, p.key, p.key_len);
    junk[p.key_len / 2] ^= 0x01;
    assert_int_equal(epd_xport_rkey_unpack(ep, junk, p.key_len, &bad_rk), EPD_ERR_BAD_RKEY);
    assert_int_equal(epd_xport_rkey_unpack(ep, p.key, EPD_XPORT_RKEY_MAX + 1, &bad_rk),
                     EPD_ERR_BAD_RKEY);
    assert_null(bad_rk);

    /* writes out of range: refused at once, no callback */
    memset(local, 1, sizeof(local));
    assert_int_equal(epd_xport_write(ep, local, 1, NULL, rk, REGION_SIZE, comp_cb, &c),
                     EPD_ERR_OUT_OF_RANGE);
    assert_int_equal(epd_xport_write(ep, local, 64, NULL, rk, REGION_SIZE - 63, comp_cb, &c),
                     EPD_ERR_OUT_OF_RANGE);
    assert_int_equal(epd_xport_write(ep, local, 64, NULL, rk, UINT64_MAX - 10, comp_cb, &c),
                     EPD_ERR_OUT_OF_RANGE);
    assert_int_equal(epd_xport_write(ep, local, 0, NULL, rk, 0, comp_cb, &c),
                     EPD_ERR_INVALID_PARAM);
    for (int i = 0; i < 10; i++) {
        epd_xport_poll(h.x, 1);
    }
    assert_int_equal(c.calls, 0);

    /* an expectation the lanes do not meet: connect fails with CONFIG */
    host_init(&wrong, conf->wrong);
    {
        comp_t wc = {0};
        epd_xport_ep_t *wep = NULL;
        uint64_t t0 = epd_time_now_ns();

        assert_int_equal(epd_xport_connect(wrong.x, p.blob, p.blob_len, comp_cb, &wc, &wep),
                         EPD_INPROGRESS);
        while (wc.calls == 0 && epd_time_now_ns() - t0 < 10 * EPD_NSEC_PER_SEC) {
            epd_xport_poll(wrong.x, 1);
            epd_xport_poll(h.x, 0);
        }
        assert_int_equal(wc.calls, 1);
        assert_int_equal(wc.status, EPD_ERR_CONFIG);
        assert_int_equal(wrong.errs, 1);
        assert_int_equal(wrong.err_status, EPD_ERR_CONFIG);
        assert_int_equal(epd_xport_send(wep, local, 8, 0), EPD_ERR_CONFIG);
        epd_xport_ep_close(wep);
    }
    epd_xport_destroy(wrong.x);
    {
        /* unknown expectation and backend: refused at create */
        epd_xport_config_t cfg = test_config(host_msg, &h);
        epd_xport_t *x2 = NULL;
        cfg.expect = "carrier-pigeon";
        assert_int_equal(epd_xport_create(&cfg, &x2), EPD_ERR_CONFIG);
        cfg.expect = NULL;
        cfg.backend = "nope";
        assert_int_equal(epd_xport_create(&cfg, &x2), EPD_ERR_CONFIG);
        assert_null(x2);
    }

    /* the endpoint still works after all that */
    {
        struct {
            m_hdr_t h;
            m_check_t c;
        } msg = {{M_CHECK, 1}, {100, sizeof(local), 0, 0}};
        comp_t wc = {0};
        m_result_t r;
        assert_int_equal(epd_xport_write(ep, local, sizeof(local), NULL, rk, 100, comp_cb, &wc),
                         EPD_INPROGRESS);
        msg.c.hash = epd_hash64(local, sizeof(local), 0);
        r = ask(&h, ep, &msg, sizeof(msg), EPD_XPORT_SEND_FENCE);
        assert_int_equal(r.ok, 1);
        assert_int_equal(wait_flag(h.x, &wc.calls, 1, 5000), 0);
    }
    send_quit(&h, ep);
    epd_xport_rkey_destroy(rk);
    epd_xport_ep_close(ep);
    peer_stop(&p);
    epd_xport_destroy(h.x);
}

static void expect_connect_fails(host_t *h, const void *blob, size_t len)
{
    comp_t c = {0};
    epd_xport_ep_t *ep = NULL;
    uint64_t t0 = epd_time_now_ns();
    epd_status_t st = epd_xport_connect(h->x, blob, len, comp_cb, &c, &ep);
    double ms;

    if (st == EPD_INPROGRESS) {
        assert_int_equal(wait_flag(h->x, &c.calls, 1, CONNECT_TIMEOUT_MS + 3000), 0);
        st = c.status;
        assert_int_equal(h->errs, 1);
        epd_xport_ep_close(ep);
    }
    ms = (double)(epd_time_now_ns() - t0) / 1e6;
    printf("[%s] connect to a dead worker: %s after %.0f ms\n", conf->name, epd_status_name(st),
           ms);
    assert_true(st == EPD_ERR_TIMEOUT || st == EPD_ERR_UNREACHABLE);
    assert_true(ms < CONNECT_TIMEOUT_MS + 3000);
    h->errs = 0;
}

/* Connecting where nobody listens fails clearly within bounded time. */
static void test_connect_dead(void **state)
{
    host_t h, gone;
    peer_proc_t p;
    const void *blob;
    size_t len;
    unsigned char copy[EPD_XPORT_ADDR_MAX];

    (void)state;
    connect_timeout_ms = CONNECT_TIMEOUT_MS;
    host_init(&h, conf->expect);
    connect_timeout_ms = CONNECT_OK_TIMEOUT_MS;
    /* a worker that was destroyed (same process) */
    host_init(&gone, NULL);
    assert_int_equal(epd_xport_address(gone.x, &blob, &len), EPD_OK);
    memcpy(copy, blob, len);
    epd_xport_destroy(gone.x);
    expect_connect_fails(&h, copy, len);
    /* a process that exited */
    peer_start(&p, h.x);
    peer_stop(&p);
    expect_connect_fails(&h, p.blob, p.blob_len);
    /* a process that is alive but never answers (stopped): the library
     * accepts the endpoint, only the handshake deadline can fail it */
    peer_start(&p, h.x);
    kill(p.pid, SIGSTOP);
    {
        comp_t c = {0};
        epd_xport_ep_t *ep = NULL;
        uint64_t t0 = epd_time_now_ns();
        double ms;

        assert_int_equal(epd_xport_connect(h.x, p.blob, p.blob_len, comp_cb, &c, &ep),
                         EPD_INPROGRESS);
        assert_int_equal(wait_flag(h.x, &c.calls, 1, CONNECT_TIMEOUT_MS + 3000), 0);
        ms = (double)(epd_time_now_ns() - t0) / 1e6;
        printf("[%s] connect to a stopped peer: %s after %.0f ms\n", conf->name,
               epd_status_name(c.status), ms);
        assert_int_equal(c.status, EPD_ERR_TIMEOUT);
        assert_true(ms >= CONNECT_TIMEOUT_MS - 50 && ms < CONNECT_TIMEOUT_MS + 3000);
        assert_int_equal(h.errs, 1);
        epd_xport_ep_close(ep);
    }
    kill(p.pid, SIGCONT);
    /* the stale HELLO it answers now lands on a closed endpoint: dropped */
    for (int i = 0; i < 50; i++) {
        epd_xport_poll(h.x, 2);
    }
    peer_stop(&p);
    epd_xport_destroy(h.x);
}

/* Garbage handed to the core's frame decoder (as if a backend delivered
 * it) is dropped, never a crash, and the xport keeps working. */
static void test_garbage_frames(void **state)
{
    host_t h;
    peer_proc_t p;
    epd_xport_ep_t *ep;
    epd_rng_t rng;
    unsigned char buf[512];
    uint32_t magic = 0x58445045u;

    (void)state;
    epd_rng_seed(&rng, 11);
    host_init(&h, conf->expect);
    peer_start(&p, h.x);
    ep = connect_peer(&h, &p, NULL);
    epd_log_set_level(EPD_LOG_ERROR); /* the drops are logged (rate-limited) */
    epd__xport_deliver(h.x, buf, 0);
    for (int i = 0; i < 20000; i++) {
        size_t len = (size_t)(epd_rng_next(&rng) % sizeof(buf));
        epd_rng_fill(&rng, buf, len);
        if (i % 2 == 0 && len >= 8) {
            /* right magic and version, random rest: exercises the checks
             * behind the first one */
            memcpy(buf, &magic, 4);
            buf[4] = 1;
            buf[5] = 0;
            if (i % 4 == 0 && len >= 12) {
                uint32_t plen = (uint32_t)(len >= 48 ? len - 48 : 0);
                memcpy(buf + 8, &plen, 4);
                buf[6] = (unsigned char)(1 + epd_rng_next(&rng) % 6);
            }
            if (i % 8 == 0 && len >= 48) {
                /* a HELLO carrying a garbage address blob */
                uint64_t one = 1;
                buf[6] = 1;
                memcpy(buf + 40, &one, 8);
            }
        }
        epd__xport_deliver(h.x, buf, len);
    }
    epd_log_set_level(EPD_LOG_INFO);
    assert_int_equal(h.errs, 0);
    assert_int_equal(h.accepts, 0);
    {
        m_hdr_t end = {.type = M_END};
        m_result_t r = ask(&h, ep, &end, sizeof(end), 0);
        assert_int_equal(r.bad, 0);
    }
    send_quit(&h, ep);
    epd_xport_ep_close(ep);
    peer_stop(&p);
    epd_xport_destroy(h.x);
}

typedef struct {
    host_t *h;
    int posted;
    int completed;
    int dup;
    int ok, failed;
    int inflight;
    unsigned char flags[4096]; /* per write: completions seen */
} stream_t;

typedef struct {
    stream_t *s;
    int idx;
} stream_op_t;

static stream_op_t stream_ops[4096];

static void stream_cb(void *arg, epd_status_t status)
{
    stream_op_t *o = arg;
    stream_t *s = o->s;

    if (s->flags[o->idx]++ != 0) {
        s->dup++;
    }
    s->completed++;
    s->inflight--;
    if (status == EPD_OK) {
        s->ok++;
    } else {
        s->failed++;
    }
}

/* The peer dies in the middle of a stream of writes: the error callback
 * fires within a bounded time, every posted write completes exactly once,
 * and the survivor then serves a new peer. */
static void test_peer_killed(void **state)
{
    host_t h;
    peer_proc_t p, p2;
    epd_xport_ep_t *ep, *ep2;
    epd_xport_rkey_t *rk, *rk2;
    static stream_t s;
    size_t size = 256 * 1024;
    unsigned char *local = epd_malloc(size);
    uint64_t kill_ns = 0, deadline;
    double detect_ms;
    int status;

    (void)state;
    assert_non_null(local);
    memset(local, 0x3c, size);
    memset(&s, 0, sizeof(s));
    peer_timeout_ms = KILL_PEER_TIMEOUT_MS;
    host_init(&h, conf->expect);
    s.h = &h;
    peer_start(&p, h.x);
    ep = connect_peer(&h, &p, &rk);
    deadline = epd_time_now_ns() + 30 * EPD_NSEC_PER_SEC;
    while (h.errs == 0 && epd_time_now_ns() < deadline && s.posted < 4096) {
        if (s.inflight < 16) {
            stream_op_t *o = &stream_ops[s.posted];
            epd_status_t st;
            o->s = &s;
            o->idx = s.posted;
            st = epd_xport_write(ep, local, size, NULL, rk,
                                 (uint64_t)(s.posted % 200) * size, stream_cb, o);
            if (st == EPD_INPROGRESS) {
                s.posted++;
                s.inflight++;
            } else if (st != EPD_ERR_NO_RESOURCE) {
                break; /* the endpoint's error: nothing posted */
            }
        }
        if (kill_ns == 0 && s.completed >= 50) {
            kill(p.pid, SIGKILL);
            kill_ns = epd_time_now_ns();
        }
        epd_xport_progress(h.x);
    }
    assert_true(kill_ns != 0);
    assert_int_equal(wait_flag(h.x, &h.errs, 1, 10000), 0);
    detect_ms = (double)(h.err_ns - kill_ns) / 1e6;
    printf("[%s] peer killed: error %s after %.0f ms; %d writes posted, %d ok, %d failed\n",
           conf->name, epd_status_name(h.err_status), detect_ms, s.posted, s.ok, s.failed);
    assert_true(detect_ms < KILL_PEER_TIMEOUT_MS + 3000);
    assert_true(epd_status_scope(h.err_status) >= EPD_SCOPE_CONNECTION);
    /* every posted write completed, exactly once */
    assert_int_equal(wait_flag(h.x, &s.completed, s.posted, 5000), 0);
    for (int i = 0; i < 50; i++) {
        epd_xport_poll(h.x, 1);
    }
    assert_int_equal(s.completed, s.posted);
    assert_int_equal(s.dup, 0);
    assert_int_equal(h.errs, 1);
    /* later posts fail with the endpoint's error */
    assert_int_equal(epd_xport_write(ep, local, 1, NULL, rk, 0, comp_cb, &(comp_t){0}),
                     h.err_status);
    waitpid(p.pid, &status, 0);
    p.pid = 0;
    close(p.fd);
    epd_xport_rkey_destroy(rk);
    epd_xport_ep_close(ep);

    /* a new peer is served */
    h.errs = 0;
    peer_start(&p2, h.x);
    ep2 = connect_peer(&h, &p2, &rk2);
    {
        struct {
            m_hdr_t h;
            m_check_t c;
        } msg = {{M_CHECK, 1}, {12345, size, epd_hash64(local, size, 0), 0}};
        comp_t c = {0};
        m_result_t r;
        assert_int_equal(epd_xport_write(ep2, local, size, NULL, rk2, 12345, comp_cb, &c),
                         EPD_INPROGRESS);
        r = ask(&h, ep2, &msg, sizeof(msg), EPD_XPORT_SEND_FENCE);
        assert_int_equal(r.ok, 1);
        assert_int_equal(wait_flag(h.x, &c.calls, 1, 5000), 0);
        assert_int_equal(c.status, EPD_OK);
    }
    assert_int_equal(h.errs, 0);
    send_quit(&h, ep2);
    epd_xport_rkey_destroy(rk2);
    epd_xport_ep_close(ep2);
    peer_stop(&p2);
    epd_xport_destroy(h.x);
    epd_free(local);
    peer_timeout_ms = PEER_TIMEOUT_MS;
}

/* Callbacks may close the endpoint they are about: the error callback and
 * the write completions that follow it both close it (re-entrantly, while
 * the core is tearing the endpoint down); nothing is used after free (the
 * sanitizer build checks) and every write completes exactly once. */
static epd_xport_ep_t *reentry_ep;
static int reentry_closes;
static int reentry_err_closes; /* 1: the error callback closes; 0: the first failed write */

static void reentry_err(void *arg, epd_xport_ep_t *ep, epd_status_t status)
{
    host_t *h = arg;

    (void)status;
    h->errs++;
    if (reentry_err_closes && ep == reentry_ep) {
        reentry_closes++;
        epd_xport_ep_close(ep);
        reentry_ep = NULL;
    }
}

static void reentry_write_cb(void *arg, epd_status_t status)
{
    comp_t *c = arg;

    comp_cb(c, status);
    if (!reentry_err_closes && status != EPD_OK && reentry_ep != NULL) {
        /* from inside the teardown of the failed endpoint */
        reentry_closes++;
        epd_xport_ep_close(reentry_ep);
        reentry_ep = NULL;
    }
}

static void close_in_callbacks(int err_closes)
{
    host_t h;
    peer_proc_t p;
    epd_xport_config_t cfg;
    epd_xport_rkey_t *rk;
    static comp_t comps[64];
    size_t size = 1 << 20;
    unsigned char *local = epd_calloc(1, size);
    int n = 0, status;
    uint64_t deadline;

    assert_non_null(local);
    memset(comps, 0, sizeof(comps));
    memset(&h, 0, sizeof(h));
    reentry_closes = 0;
    reentry_err_closes = err_closes;
    cfg = test_config(host_msg, &h);
    cfg.expect = conf->expect;
    cfg.err_cb = reentry_err;
    cfg.peer_timeout_ms = KILL_PEER_TIMEOUT_MS;
    assert_int_equal(epd_xport_create(&cfg, &h.x), EPD_OK);
    peer_start(&p, h.x);
    reentry_ep = connect_peer(&h, &p, &rk);
    /* writes in flight, then the peer dies under them */
    for (; n < 32; n++) {
        assert_int_equal(epd_xport_write(reentry_ep, local, size, NULL, rk, (uint64_t)n * size,
                                         reentry_write_cb, &comps[n]),
                         EPD_INPROGRESS);
    }
    kill(p.pid, SIGKILL);
    waitpid(p.pid, &status, 0);
    p.pid = 0;
    close(p.fd);
    deadline = epd_time_now_ns() + 10 * EPD_NSEC_PER_SEC;
    while (h.errs == 0 && epd_time_now_ns() < deadline) {
        if (reentry_ep != NULL && n < 64 &&
            epd_xport_write(reentry_ep, local, size, NULL, rk, (uint64_t)n * size,
                            reentry_write_cb, &comps[n]) == EPD_INPROGRESS) {
            n++;
        }
        epd_xport_poll(h.x, 1);
    }
    assert_int_equal(h.errs, 1);
    if (reentry_ep != NULL) {
        /* every write had landed before the failure (shared memory puts):
         * nothing failed, so no callback closed it */
        epd_xport_ep_close(reentry_ep);
        reentry_ep = NULL;
    }
    for (int i = 0; i < 20; i++) {
        epd_xport_poll(h.x, 1);
    }
    for (int i = 0; i < n; i++) {
        assert_int_equal(comps[i].calls, 1);
    }
    if (err_closes) {
        assert_int_equal(reentry_closes, 1);
    }
    epd_xport_destroy(h.x);
    epd_free(local);
}

static void test_close_in_callbacks(void **state)
{
    (void)state;
    close_in_callbacks(1);
    close_in_callbacks(0);
}

/* max_inflight bounds what is posted (EPD_ERR_NO_RESOURCE, nothing
 * queued); closing an endpoint with writes in flight completes each exactly
 * once (EPD_OK if it had landed, EPD_ERR_CANCELED otherwise) before close
 * returns; a connect still in progress completes with EPD_ERR_CANCELED. */
static void test_close_with_inflight(void **state)
{
    host_t h;
    peer_proc_t p;
    epd_xport_ep_t *ep, *ep2 = NULL;
    epd_xport_rkey_t *rk;
    static comp_t comps[256];
    comp_t extra = {0}, conn = {0};
    size_t size = 1 << 20;
    unsigned char *local = epd_calloc(1, size);
    int n = 0;
    epd_status_t st;

    (void)state;
    assert_non_null(local);
    memset(comps, 0, sizeof(comps));
    max_inflight = 32;
    host_init(&h, conf->expect);
    max_inflight = 4096;
    peer_start(&p, h.x);
    ep = connect_peer(&h, &p, &rk);
    /* no progress in between: the 33rd is refused, whatever finished */
    while ((st = epd_xport_write(ep, local, size, NULL, rk, (uint64_t)n * size, comp_cb,
                                 &comps[n])) == EPD_INPROGRESS) {
        n++;
        assert_true(n <= 32);
    }
    assert_int_equal(st, EPD_ERR_NO_RESOURCE);
    assert_int_equal(n, 32);
    assert_int_equal(epd_xport_flush(ep, comp_cb, &extra), EPD_ERR_NO_RESOURCE);
    epd_xport_rkey_destroy(rk);
    epd_xport_ep_close(ep);
    for (int i = 0; i < n; i++) {
        assert_int_equal(comps[i].calls, 1);
        assert_true(comps[i].status == EPD_OK || comps[i].status == EPD_ERR_CANCELED);
    }
    assert_int_equal(extra.calls, 0);
    /* a connect closed before the answer */
    assert_int_equal(epd_xport_connect(h.x, p.blob, p.blob_len, comp_cb, &conn, &ep2),
                     EPD_INPROGRESS);
    epd_xport_ep_close(ep2);
    assert_int_equal(conn.calls, 1);
    assert_int_equal(conn.status, EPD_ERR_CANCELED);
    for (int i = 0; i < 20; i++) {
        epd_xport_poll(h.x, 1);
    }
    for (int i = 0; i < n; i++) {
        assert_int_equal(comps[i].calls, 1);
    }
    assert_int_equal(conn.calls, 1);
    peer_stop(&p);
    epd_xport_destroy(h.x);
    epd_free(local);
}

/* ------------------------------------------------- the trust boundary */

static void host_init_trust(host_t *h, const char *expect, const char *mode)
{
    epd_xport_config_t cfg;

    memset(h, 0, sizeof(*h));
    cfg = test_config(host_msg, h);
    cfg.expect = expect;
    cfg.err_cb = host_err;
    cfg.accept_cb = host_accept;
    apply_trust(&cfg, mode, "host", 1);
    assert_int_equal(epd_xport_create(&cfg, &h->x), EPD_OK);
}

/* What the peer saw so far ('S'). */
static peer_report_t peer_report(peer_proc_t *p, epd_xport_t *x)
{
    peer_report_t r;
    uint32_t len = 0;
    char c = 'S';

    assert_int_equal(write(p->fd, &c, 1), 1);
    assert_int_equal(chan_read(p->fd, x, &r, sizeof(r), &len, 10000), 0);
    assert_int_equal(len, sizeof(r));
    return r;
}

/* Has the peer connect to `h` ('C'); its connect's status. */
static epd_status_t peer_connect_to(peer_proc_t *p, host_t *h)
{
    const void *blob;
    size_t blob_len;
    int32_t st = 0;
    uint32_t len = 0;
    char c = 'C';

    assert_int_equal(epd_xport_address(h->x, &blob, &blob_len), EPD_OK);
    assert_int_equal(write(p->fd, &c, 1), 1);
    assert_int_equal(chan_write(p->fd, blob, (uint32_t)blob_len), 0);
    assert_int_equal(chan_read(p->fd, h->x, &st, sizeof(st), &len, 20000), 0);
    assert_int_equal(len, sizeof(st));
    return (epd_status_t)st;
}

/* Round trips of a small request-plane message (END -> RESULT), µs each. */
static double round_trip_us(host_t *h, epd_xport_ep_t *ep, int n)
{
    m_hdr_t end = {.type = M_END};
    uint64_t t0 = epd_time_now_ns();

    for (int i = 0; i < n; i++) {
        (void)ask(h, ep, &end, sizeof(end), 0);
    }
    return (double)(epd_time_now_ns() - t0) / 1e3 / n;
}

/* Same secret on both ends: connected both ways, each end sees the other's
 * proven identity, messages and writes work.  Prints the round trip of a
 * request-plane message with and without authentication. */
static void test_auth_connect(void **state)
{
    host_t h, h0;
    peer_proc_t p, p0;
    epd_xport_ep_t *ep, *ep0;
    epd_xport_rkey_t *rk;
    epd_xport_mr_t *lmr;
    epd_xport_identity_t id;
    epd_xport_stats_t xs;
    peer_report_t r;
    char want[EPD_XPORT_WORKER_ID_MAX + 1];
    int authed = -1;
    epd_rng_t rng;
    double us_auth, us_plain;

    (void)state;
    host_init_trust(&h, conf->expect, "a");
    peer_start_mode(&p, h.x, "a");
    ep = connect_peer(&h, &p, &rk);
    assert_int_equal(epd_xport_ep_identity(ep, &id, &authed), EPD_OK);
    assert_int_equal(authed, 1);
    snprintf(want, sizeof(want), "peer-%d", (int)p.pid);
    assert_string_equal(id.worker_id, want);
    assert_int_equal(id.role, PEER_ROLE);
    assert_int_equal(id.epoch.nonce, (uint64_t)p.pid * 7919u);

    assert_int_equal(epd_xport_mr_alloc(h.x, (size_t)8 << 20, &lmr), EPD_OK);
    epd_rng_seed(&rng, 1234);
    epd_rng_fill(&rng, epd_xport_mr_addr(lmr), epd_xport_mr_size(lmr));
    write_batch(&h, ep, rk, 0, lmr, 4096, 200, &rng);
    write_batch(&h, ep, rk, 0, lmr, 1 << 20, 4, &rng);

    r = peer_report(&p, h.x);
    snprintf(want, sizeof(want), "host-%d", (int)getpid());
    assert_int_equal(r.accepts, 1);
    assert_int_equal(r.last_authed, 1);
    assert_string_equal(r.last_id, want);
    assert_int_equal(r.last_role, 1);
    assert_int_equal(r.handshakes_refused + r.frames_forged, 0);

    /* the other way: the peer connects to us */
    assert_int_equal(peer_connect_to(&p, &h), EPD_OK);
    assert_int_equal(wait_flag(h.x, &h.accepts, 1, 5000), 0);
    assert_non_null(h.accepted);
    assert_int_equal(epd_xport_ep_identity(h.accepted, &id, &authed), EPD_OK);
    assert_int_equal(authed, 1);
    snprintf(want, sizeof(want), "peer-%d", (int)p.pid);
    assert_string_equal(id.worker_id, want);

    /* the same round trips without a secret, for comparison: interleaved,
     * best of 5 (the machine is shared) */
    host_init(&h0, conf->expect);
    peer_start(&p0, h0.x);
    ep0 = connect_peer(&h0, &p0, NULL);
    assert_int_equal(epd_xport_ep_identity(ep0, &id, &authed), EPD_OK);
    assert_int_equal(authed, 0);
    us_auth = us_plain = 1e9;
    for (int i = 0; i < 5; i++) {
        double a = round_trip_us(&h, ep, 400), b = round_trip_us(&h0, ep0, 400);
        us_auth = a < us_auth ? a : us_auth;
        us_plain = b < us_plain ? b : us_plain;
    }
    epd_xport_stats(h.x, &xs);
    assert_int_equal(xs.handshakes_refused + xs.frames_forged, 0);
    assert_int_equal(h.errs, 0);
    printf("[%s] request-plane round trip (8-byte ask, 32-byte answer): %.2f us authenticated, "
           "%.2f us without a secret\n",
           conf->name, us_auth, us_plain);
    send_quit(&h0, ep0);
    epd_xport_ep_close(ep0);
    peer_stop(&p0);
    epd_xport_destroy(h0.x);

    send_quit(&h, ep);
    epd_xport_rkey_destroy(rk);
    epd_xport_ep_close(ep);
    epd_xport_mr_dereg(lmr);
    peer_stop(&p);
    epd_xport_destroy(h.x);
}

/* One end with a secret and the other without, or another secret: no
 * handshake completes in either direction; the acceptor accepts nothing,
 * delivers nothing and counts the refusal; the connector fails with
 * EPD_ERR_AUTH where the acceptor has no secret (it answers the refusal),
 * EPD_ERR_TIMEOUT where it has one (it drops a HELLO it cannot verify
 * unanswered, before parsing the address in it). */
static void refused_pair(const char *host_mode, const char *peer_mode, epd_status_t want_out,
                         epd_status_t want_in)
{
    host_t h;
    peer_proc_t p;
    comp_t c = {0};
    epd_xport_ep_t *ep = NULL;
    epd_xport_stats_t xs;
    peer_report_t r;
    uint64_t t0;
    double ms;
    unsigned char one = 1;

    connect_timeout_ms = CONNECT_TIMEOUT_MS;
    host_init_trust(&h, conf->expect, host_mode);
    connect_timeout_ms = CONNECT_OK_TIMEOUT_MS;
    peer_start_mode(&p, h.x, peer_mode);
    /* we connect to it */
    t0 = epd_time_now_ns();
    assert_int_equal(epd_xport_connect(h.x, p.blob, p.blob_len, comp_cb, &c, &ep), EPD_INPROGRESS);
    assert_int_equal(wait_flag(h.x, &c.calls, 1, CONNECT_TIMEOUT_MS + 3000), 0);
    ms = (double)(epd_time_now_ns() - t0) / 1e6;
    printf("[%s] host %s -> peer %s: %s after %.0f ms\n", conf->name, host_mode, peer_mode,
           epd_status_name(c.status), ms);
    assert_int_equal(c.status, want_out);
    assert_int_equal(h.errs, 1);
    assert_int_equal(h.err_status, want_out);
    assert_int_equal(epd_xport_send(ep, &one, 1, 0), want_out);
    epd_xport_ep_close(ep);
    /* it connects to us */
    assert_int_equal(peer_connect_to(&p, &h), want_in);
    for (int i = 0; i < 20; i++) {
        epd_xport_poll(h.x, 1);
    }
    assert_int_equal(h.accepts, 0);
    assert_int_equal(h.have_result, 0);
    epd_xport_stats(h.x, &xs);
    assert_true(xs.handshakes_refused >= 1);
    r = peer_report(&p, h.x);
    assert_int_equal(r.accepts, 0);
    assert_int_equal(r.msgs, 0);
    assert_true(r.handshakes_refused >= 1);
    peer_stop(&p);
    epd_xport_destroy(h.x);
}

static void test_auth_refused(void **state)
{
    (void)state;
    refused_pair("a", "b", EPD_ERR_TIMEOUT, EPD_ERR_TIMEOUT);
    refused_pair("a", "none", EPD_ERR_AUTH, EPD_ERR_TIMEOUT);
    refused_pair("none", "a", EPD_ERR_TIMEOUT, EPD_ERR_AUTH);
}

/* Frames of the peer captured as they arrive, to tamper with. */
static unsigned char tap_frame[1024];
static size_t tap_len;

static void tap_record(void *arg, const void *frame, size_t len)
{
    (void)arg;
    /* the latest request-plane message (type 3) that fits */
    if (len >= 48 && len <= sizeof(tap_frame) && ((const unsigned char *)frame)[6] == 3) {
        memcpy(tap_frame, frame, len);
        tap_len = len;
    }
}

/* A frame of an authenticated connection changed on the way (one payload
 * byte), or stripped of its MAC, is not delivered and fails the endpoint
 * with EPD_ERR_AUTH. */
static void test_auth_tampered(void **state)
{
    host_t h;
    peer_proc_t p;
    epd_xport_ep_t *ep;
    epd_xport_stats_t xs;
    m_hdr_t end = {.type = M_END};
    unsigned char bad[1024];
    uint64_t seq;

    (void)state;
    host_init_trust(&h, conf->expect, "a");
    peer_start_mode(&p, h.x, "a");
    epd__xport_set_tap(h.x, tap_record, NULL);
    for (int round = 0; round < 2; round++) {
        ep = connect_peer(&h, &p, NULL);
        h.errs = 0;
        tap_len = 0;
        (void)ask(&h, ep, &end, sizeof(end), 0);
        assert_int_equal(tap_len, 48 + 16 + sizeof(m_result_t)); /* header, tag, payload */
        assert_int_equal(tap_frame[7] & 0x4, 0x4);               /* the MAC flag */
        memcpy(bad, tap_frame, tap_len);
        memcpy(&seq, bad + 40, sizeof(seq));
        seq++; /* the next number: only the MAC can refuse it */
        memcpy(bad + 40, &seq, sizeof(seq));
        h.have_result = 0;
        if (round == 0) {
            bad[tap_len - 1] ^= 0x01; /* one payload bit (ok count) */
            epd__xport_deliver(h.x, bad, tap_len);
        } else {
            bad[7] &= (unsigned char)~0x4u; /* no MAC flag, no tag */
            memmove(bad + 48, bad + 64, tap_len - 64);
            epd__xport_deliver(h.x, bad, tap_len - 16);
        }
        assert_int_equal(h.have_result, 0);
        assert_int_equal(h.errs, 1);
        assert_int_equal(h.err_status, EPD_ERR_AUTH);
        assert_int_equal(epd_xport_send(ep, &end, sizeof(end), 0), EPD_ERR_AUTH);
        epd_xport_ep_close(ep);
    }
    epd_xport_stats(h.x, &xs);
    assert_int_equal(xs.frames_forged, 2);
    epd__xport_set_tap(h.x, NULL, NULL);
    peer_stop(&p);
    epd_xport_destroy(h.x);
}

/* Asks the peer whether [off, off+len) of `region` are still all zero. */
static void expect_zero(host_t *h, epd_xport_ep_t *ep, const uint64_t *regions,
                        const uint64_t *offs, int n, uint64_t len)
{
    unsigned char *zero = epd_calloc(1, len);
    struct {
        m_hdr_t h;
        m_check_t c[8];
    } msg;
    m_result_t r;

    assert_non_null(zero);
    assert_true(n <= 8);
    msg.h.type = M_CHECK;
    msg.h.n = (uint32_t)n;
    for (int i = 0; i < n; i++) {
        msg.c[i].offset = offs[i];
        msg.c[i].len = len;
        msg.c[i].hash = epd_hash64(zero, len, 0);
        msg.c[i].region = regions[i];
    }
    r = ask(h, ep, &msg, sizeof(m_hdr_t) + (size_t)n * sizeof(m_check_t), 0);
    assert_int_equal(r.bad, 0);
    assert_int_equal(r.ok, n);
    epd_free(zero);
}

/* A local (source-only) region: no packed key; a source of writes that
 * land; and a write naming it anyway (the key an attacker would hold)
 * leaves it untouched. */
static void test_local_region(void **state)
{
    host_t h, h2;
    peer_proc_t p;
    epd_xport_ep_t *ep, *ep2;
    epd_xport_rkey_t *rk, *frk = NULL;
    epd_xport_mr_t *src;
    unsigned char key[EPD_XPORT_RKEY_MAX];
    size_t key_len;
    epd_rng_t rng;
    comp_t c1 = {0}, c2 = {0};
    const uint64_t regions[2] = {2, 2};
    const uint64_t offs[2] = {0, LOCAL_SIZE - 65536};
    epd_status_t st;

    (void)state;
    host_init(&h, conf->expect);
    peer_start(&p, h.x);
    ep = connect_peer(&h, &p, &rk);
    assert_int_equal(epd_xport_mr_alloc_ex(h.x, (size_t)4 << 20, EPD_XPORT_MR_LOCAL, &src), EPD_OK);
    assert_int_equal(epd_xport_mr_pack(src, key, sizeof(key), &key_len), EPD_ERR_INVALID_PARAM);
    epd_rng_seed(&rng, 77);
    epd_rng_fill(&rng, epd_xport_mr_addr(src), epd_xport_mr_size(src));
    write_batch(&h, ep, rk, 0, src, 4096, 100, &rng);
    write_batch(&h, ep, rk, 0, src, 1 << 20, 3, &rng);

    if (p.key3_len == 0) {
        printf("[%s] the peer's local region has no key at all (nothing registered)\n", conf->name);
    } else {
        st = epd_xport_rkey_unpack(ep, p.key3, p.key3_len, &frk);
        printf("[%s] the local region's key unpacks: %s\n", conf->name, epd_status_name(st));
        if (st == EPD_OK) {
            st =
                epd_xport_write(ep, epd_xport_mr_addr(src), 65536, src, frk, offs[0], comp_cb, &c1);
            if (st == EPD_INPROGRESS) {
                st = epd_xport_write(ep, epd_xport_mr_addr(src), 65536, src, frk, offs[1], comp_cb,
                                     &c2);
            }
            printf("[%s] writes into the local region: posted %s\n", conf->name,
                   epd_status_name(st));
            if (st == EPD_INPROGRESS) {
                assert_int_equal(wait_flag(h.x, &c2.calls, 1, 10000), 0);
                assert_int_equal(wait_flag(h.x, &c1.calls, 1, 10000), 0);
                printf("[%s] ... completed %s / %s\n", conf->name, epd_status_name(c1.status),
                       epd_status_name(c2.status));
            }
            epd_xport_rkey_destroy(frk);
        }
    }
    /* a fresh worker asks (the first endpoint may have failed) */
    host_init(&h2, conf->expect);
    ep2 = connect_peer(&h2, &p, NULL);
    expect_zero(&h2, ep2, regions, offs, 2, 65536);
    send_quit(&h2, ep2);
    epd_xport_ep_close(ep2);
    epd_xport_destroy(h2.x);
    epd_xport_rkey_destroy(rk);
    epd_xport_ep_close(ep);
    epd_xport_mr_dereg(src);
    peer_stop(&p);
    epd_xport_destroy(h.x);
}

/* libfabric: a write with a key guessed from a real one (its neighbours,
 * a flipped bit, random values) lands in none of the peer's regions. */
typedef struct {
    uint64_t magic;
    uint16_t version;
    uint16_t hdr_len;
    uint32_t raw_len;
    uint64_t base;
    uint64_t size;
    uint64_t key;
    uint64_t raw_base;
    uint32_t has_sink;
    uint32_t sink_raw_len;
    uint64_t sink_addr;
    uint64_t sink_key;
    uint64_t sink_raw_base;
    uint64_t check;
} ofi_rkey_wire_t; /* transport/ofi's packed key, version 2: what an attacker knows */

static void test_guessed_keys(void **state)
{
    host_t h, h2, hg;
    peer_proc_t p;
    epd_xport_ep_t *ep, *ep2;
    ofi_rkey_wire_t w;
    unsigned char forged[EPD_XPORT_RKEY_MAX];
    unsigned char data[64];
    uint64_t guesses[8];
    epd_rng_t rng;
    const uint64_t regions[3] = {0, 1, 2};
    const uint64_t offs[3] = {0, 0, 0};
    int landed_ok = 0;

    (void)state;
    if (strcmp(conf->backend, "ofi") != 0) {
        printf("[%s] guessed keys: libfabric only (UCX writes name a random region id)\n",
               conf->name);
        return;
    }
    host_init(&h, conf->expect);
    peer_start(&p, h.x);
    assert_true(p.key_len >= sizeof(w));
    memcpy(&w, p.key, sizeof(w));
    assert_int_equal(w.version, 2);
    assert_int_equal(w.hdr_len, sizeof(w));
    assert_int_equal(w.raw_len, 0); /* mr_mode 0 providers here: plain 64-bit keys */
    epd_rng_seed(&rng, epd_rng_entropy());
    guesses[0] = w.key + 1;
    guesses[1] = w.key - 1;
    guesses[2] = w.key + 2;
    guesses[3] = w.key ^ 1;
    for (int i = 4; i < 8; i++) {
        guesses[i] = epd_rng_next(&rng);
    }
    memset(data, 0xee, sizeof(data));
    for (int i = 0; i < 8; i++) {
        epd_xport_rkey_t *rk = NULL;
        comp_t c = {0};
        ofi_rkey_wire_t f = w;
        epd_status_t st;
        uint64_t hh;

        f.key = guesses[i];
        memcpy(forged, p.key, p.key_len);
        hh = epd_hash64(&f, sizeof(f) - 8, 0x6570645f6f666921ull);
        f.check = epd_hash64(forged + sizeof(f), p.key_len - sizeof(f), hh);
        memcpy(forged, &f, sizeof(f));
        /* a worker of its own per guess: tcp;ofi_rxm answers a bad key by
         * tearing the whole connection down, every endpoint on it */
        host_init(&hg, conf->expect);
        ep = connect_peer(&hg, &p, NULL);
        assert_int_equal(epd_xport_rkey_unpack(ep, forged, p.key_len, &rk), EPD_OK);
        st = epd_xport_write(ep, data, sizeof(data), NULL, rk, 0, comp_cb, &c);
        if (st == EPD_INPROGRESS) {
            assert_int_equal(wait_flag(hg.x, &c.calls, 1, 10000), 0);
            st = c.status;
        }
        landed_ok += st == EPD_OK;
        printf("[%s] write with guessed key #%d (%s): %s\n", conf->name, i,
               i < 4 ? "a neighbour of the real one" : "random", epd_status_name(st));
        epd_xport_rkey_destroy(rk);
        epd_xport_ep_close(ep);
        epd_xport_destroy(hg.x);
    }
    /* from a fresh worker: every region still zero where the guesses aimed */
    host_init(&h2, conf->expect);
    ep2 = connect_peer(&h2, &p, NULL);
    expect_zero(&h2, ep2, regions, offs, 3, sizeof(data));
    printf("[%s] %d of 8 guessed-key writes reported success; none landed\n", conf->name,
           landed_ok);
    send_quit(&h2, ep2);
    epd_xport_ep_close(ep2);
    epd_xport_destroy(h2.x);
    peer_stop(&p);
    epd_xport_destroy(h.x);
}

/* ---------------------------------------------------------------- main */

static int run_conf(const char *name)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_messages_in_order),
        cmocka_unit_test(test_writes_land),
        cmocka_unit_test(test_fence_repeated),
        cmocka_unit_test(test_close_with_inflight),
        cmocka_unit_test(test_connect_dead),
        cmocka_unit_test(test_garbage_frames),
        cmocka_unit_test(test_peer_killed),
        cmocka_unit_test(test_close_in_callbacks),
        cmocka_unit_test(test_large_held_messages),
        cmocka_unit_test(test_auth_connect),
        cmocka_unit_test(test_auth_refused),
        cmocka_unit_test(test_auth_tampered),
        cmocka_unit_test(test_local_region),
        cmocka_unit_test(test_guessed_keys),
    };
    char group[64];
    int rc;

    conf = find_conf(name);
    if (conf == NULL) {
        fprintf(stderr, "unknown configuration %s\n", name);
        return 2;
    }
    apply_env(conf);
    connect_timeout_ms = CONNECT_OK_TIMEOUT_MS; /* the host's workers (not the peer process) */
    if (getenv("EPD_XPORT_TEST") != NULL) {     /* one test by name (cmocka's pattern) */
        cmocka_set_test_filter(getenv("EPD_XPORT_TEST"));
    }
    check_buf = epd_malloc(MAX_MSG);
    snprintf(group, sizeof(group), "xport-conformance-%s", name);
    rc = cmocka_run_group_tests_name(group, tests, NULL, NULL);
    epd_free(check_buf);
    return rc;
}

int main(int argc, char **argv)
{
    ssize_t n = readlink("/proc/self/exe", self_path, sizeof(self_path) - 1);
    int failed = 0;

    if (n <= 0) {
        return 2;
    }
    self_path[n] = '\0';
    signal(SIGPIPE, SIG_IGN);
    if ((argc == 4 || argc == 5) && strcmp(argv[1], "--peer") == 0) {
        conf = find_conf(argv[2]);
        if (conf == NULL) {
            return 2;
        }
        apply_env(conf);
        return peer_main(atoi(argv[3]), argc == 5 ? argv[4] : NULL);
    }
    if (argc == 3 && strcmp(argv[1], "--conf") == 0) {
        return run_conf(argv[2]);
    }
    if (argc != 1) {
        printf("usage: %s [--conf NAME]   (no arguments: every configuration; "
               "EPD_XPORT_CONF=NAME picks one)\nconfigurations:", argv[0]);
        for (size_t i = 0; i < N_CONFS; i++) {
            printf(" %s", epd_test_confs[i].name);
        }
        printf("\n");
        return strcmp(argv[1], "--help") == 0 ? 0 : 2;
    }
    /* every configuration, each in its own process (UCX reads its
     * environment once per context, and a crash stays contained) */
    for (size_t i = 0; i < N_CONFS; i++) {
        const char *only = getenv("EPD_XPORT_CONF");
        pid_t pid;
        int status = 0;

        if (only != NULL ? strcmp(only, epd_test_confs[i].name) != 0 : epd_test_confs[i].extra) {
            continue;
        }
        fflush(stdout);
        pid = fork();
        if (pid == 0) {
            execl(self_path, self_path, "--conf", epd_test_confs[i].name, (char *)NULL);
            _exit(127);
        }
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            printf("configuration %s FAILED (status %#x)\n", epd_test_confs[i].name, status);
            failed++;
        } else {
            printf("configuration %s passed\n", epd_test_confs[i].name);
        }
    }
    return failed == 0 ? 0 : 1;
}
