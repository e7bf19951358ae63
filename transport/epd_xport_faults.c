/*
 * epd_xport_faults.c — EPD_XPORT_FAULTS (see epd_xport_faults.h).
 *
 * Held frames sit in one FIFO per transport.  A delayed frame blocks every
 * frame that arrives after it (order is kept: a delay is a slow link); a
 * frame held for reordering does not (later frames pass it, and the core
 * refuses them as out of order: the endpoint fails).  Held write
 * completions sit in a list of their own, released when due or when their
 * endpoint goes.
 */
#include "epd_xport_faults.h"

#include <stdbool.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_rng.h"
#include "epd_time.h"

#define EPD__FAULTS_COMP "xport-faults"
#define EPD__FAULTS_MS_MAX 60000
/* a frame held for reordering is delivered after this, if nothing passed it */
#define EPD__REORDER_HOLD_NS (20 * EPD_NSEC_PER_MSEC)

enum {
    EPD__FK_DROP,
    EPD__FK_DELAY,
    EPD__FK_DUP,
    EPD__FK_REORDER,
    EPD__FK_CORRUPT,
    EPD__FK_STALL,
    EPD__FK_WC_DROP,
    EPD__FK_WC_DELAY,
    EPD__FK_WR_CORRUPT,
    EPD__FK_COUNT
};

static const char *const epd__fk_name[EPD__FK_COUNT] = {
    "msg-drop",      "msg-delay",        "msg-dup",
    "msg-reorder",   "msg-corrupt",      "stall",
    "write-comp-drop", "write-comp-delay", "write-corrupt",
};

typedef struct epd__xport_faults epd__faults_t;

typedef struct epd__fframe {
    struct epd__fframe *next;
    uint64_t due_ns;
    bool passable; /* reorder: later frames do not wait for it */
    size_t len;
    unsigned char bytes[]; /* [len] */
} epd__fframe_t;

typedef struct epd__fcomp {
    struct epd__fcomp *next;
    uint64_t due_ns;
    epd__xport_op_t *op;
    const void *ep;
    epd_status_t status;
} epd__fcomp_t;

struct epd__xport_faults {
    double p_drop, p_delay, p_dup, p_reorder, p_corrupt, p_stall;
    double p_wcorrupt; /* writes' bytes alone (wcorrupt=P); else p_corrupt */
    uint32_t delay_ms, stall_ms;
    uint64_t seed;
    epd_rng_t rng;
    epd__fframe_t *head, *tail;
    epd__fcomp_t *comps;
    uint64_t count[EPD__FK_COUNT];
    uint64_t total;
    /* the interposer: the core above, the backend below */
    epd_xport_t *core;
    const epd__xport_backend_ops_t *inner;
    void *inner_be;
    epd__xport_backend_ops_t ops; /* what the core calls: epd__faults_ops */
};

/* An endpoint of the backend below, as the core sees it through us. */
typedef struct {
    epd__faults_t *f;
    void *inner;             /* the backend's endpoint */
    epd_xport_ep_t *core_ep; /* the core's, for epd__xport_ep_live */
} epd__fep_t;

static int epd__faults_tick(epd__faults_t *f, epd_xport_t *x, uint64_t now_ns);
static void epd__faults_release(epd__faults_t *f, const void *ep);

static int epd__parse_p(const char *v, double *p)
{
    char *end;
    double d = strtod(v, &end);

    if (end == v || *end != '\0' || !(d >= 0.0 && d <= 1.0)) {
        return -1;
    }
    *p = d;
    return 0;
}

static int epd__parse_ms(const char *v, uint32_t *ms, double *p, bool p_required)
{
    char *end;
    unsigned long n = strtoul(v, &end, 10);

    if (end == v || n > EPD__FAULTS_MS_MAX) {
        return -1;
    }
    if (*end == '\0') {
        if (p_required) {
            return -1;
        }
        *ms = (uint32_t)n;
        *p = 1.0;
        return 0;
    }
    if (*end != ':') {
        return -1;
    }
    *ms = (uint32_t)n;
    return epd__parse_p(end + 1, p);
}

static int epd__parse_entry(epd__faults_t *f, char *e)
{
    char *eq = strchr(e, '=');
    char *end;

    if (eq == NULL) {
        return -1;
    }
    *eq = '\0';
    const char *v = eq + 1;
    if (strcmp(e, "drop") == 0) {
        return epd__parse_p(v, &f->p_drop);
    }
    if (strcmp(e, "dup") == 0) {
        return epd__parse_p(v, &f->p_dup);
    }
    if (strcmp(e, "reorder") == 0) {
        return epd__parse_p(v, &f->p_reorder);
    }
    if (strcmp(e, "corrupt") == 0) {
        return epd__parse_p(v, &f->p_corrupt);
    }
    if (strcmp(e, "wcorrupt") == 0) {
        return epd__parse_p(v, &f->p_wcorrupt);
    }
    if (strcmp(e, "delay") == 0) {
        return epd__parse_ms(v, &f->delay_ms, &f->p_delay, false);
    }
    if (strcmp(e, "stall") == 0) {
        return epd__parse_ms(v, &f->stall_ms, &f->p_stall, true);
    }
    if (strcmp(e, "seed") == 0) {
        f->seed = strtoull(v, &end, 10);
        return end == v || *end != '\0' ? -1 : 0;
    }
    return -1;
}

/* Owned by the caller (epd__faults_destroy). */
static epd_status_t epd__faults_create(bool auth, const char *worker_id, epd__faults_t **f_p)
{
    const char *spec = getenv("EPD_XPORT_FAULTS");
    epd__faults_t *f;
    char *copy, *save = NULL, *e;
    uint64_t salt = 1469598103934665603ull;

    *f_p = NULL;
    if (spec == NULL || spec[0] == '\0') {
        return EPD_OK;
    }
    f = epd_calloc(1, sizeof(*f));
    copy = epd_strdup(spec);
    if (f == NULL || copy == NULL) {
        epd_free(f);
        epd_free(copy);
        return EPD_ERR_NO_MEMORY;
    }
    f->seed = 1;
    for (e = strtok_r(copy, ",", &save); e != NULL; e = strtok_r(NULL, ",", &save)) {
        if (epd__parse_entry(f, e) != 0) {
            epd_log_error(EPD__FAULTS_COMP, 0,
                          "EPD_XPORT_FAULTS: bad entry '%s' in '%s' (want drop=P, delay=MS[:P], "
                          "dup=P, reorder=P, corrupt=P, wcorrupt=P, stall=MS:P, seed=N; P in "
                          "0..1, MS up to %d)",
                          e, spec, EPD__FAULTS_MS_MAX);
            goto err;
        }
    }
    if (f->p_corrupt > 0.0 && !auth) {
        epd_log_error(EPD__FAULTS_COMP, 0,
                      "EPD_XPORT_FAULTS: corrupt needs a cluster secret (without frame MACs a "
                      "corrupted message would be delivered)");
        goto err;
    }
    epd_free(copy);
    for (const char *c = worker_id != NULL ? worker_id : ""; *c != '\0'; c++) {
        salt = (salt ^ (unsigned char)*c) * 1099511628211ull;
    }
    epd_rng_seed(&f->rng, f->seed ^ salt);
    epd_log_warn(EPD__FAULTS_COMP, 0,
                 "EPD_XPORT_FAULTS armed: messages drop %.4g, delay %u ms at %.4g, dup %.4g, "
                 "reorder %.4g, corrupt %.4g, stall %u ms at %.4g; write completions drop %.4g, "
                 "delay at %.4g; write bytes corrupt %.4g; seed %llu",
                 f->p_drop, f->delay_ms, f->p_delay, f->p_dup, f->p_reorder, f->p_corrupt,
                 f->stall_ms, f->p_stall, f->p_drop, f->p_delay,
                 f->p_wcorrupt > 0.0 ? f->p_wcorrupt : f->p_corrupt,
                 (unsigned long long)f->seed);
    *f_p = f;
    return EPD_OK;

err:
    epd_free(copy);
    epd_free(f);
    return EPD_ERR_CONFIG;
}

static void epd__log_counts(const epd__faults_t *f, const char *when)
{
    char buf[512];
    size_t off = 0;

    buf[0] = '\0';
    for (int k = 0; k < EPD__FK_COUNT && off < sizeof(buf); k++) {
        int n = snprintf(buf + off, sizeof(buf) - off, " %s=%llu", epd__fk_name[k],
                         (unsigned long long)f->count[k]);
        if (n < 0) {
            break;
        }
        off += (size_t)n;
    }
    epd_log_warn(EPD__FAULTS_COMP, 0, "xport faults injected %s: %llu (%s )", when,
                 (unsigned long long)f->total, buf);
}

static void epd__count(epd__faults_t *f, int kind)
{
    f->count[kind]++;
    f->total++;
    if (f->count[kind] == 1 || (f->total & (f->total - 1)) == 0) {
        epd__log_counts(f, "so far");
    }
}

static bool epd__hit(epd__faults_t *f, double p)
{
    return p > 0.0 && epd_rng_uniform(&f->rng) < p;
}

static void epd__faults_destroy(epd__faults_t *f)
{
    if (f == NULL) {
        return;
    }
    epd__faults_release(f, NULL);
    while (f->head != NULL) {
        epd__fframe_t *h = f->head;
        f->head = h->next;
        epd_free(h);
    }
    epd__log_counts(f, "in all");
    epd_free(f);
}

/* Appends a copy of the frame; false when out of memory. */
static bool epd__hold(epd__faults_t *f, const void *data, size_t len, uint64_t due_ns,
                      bool passable, size_t flip_at)
{
    epd__fframe_t *h = epd_malloc(sizeof(*h) + len);

    if (h == NULL) {
        return false;
    }
    h->next = NULL;
    h->due_ns = due_ns;
    h->passable = passable;
    h->len = len;
    memcpy(h->bytes, data, len);
    if (flip_at < len) {
        h->bytes[flip_at] ^= 0x5a;
    }
    if (f->tail != NULL) {
        f->tail->next = h;
    } else {
        f->head = h;
    }
    f->tail = h;
    return true;
}

/* A frame that must wait: one not yet due and not passable is in the queue. */
static bool epd__blocked(const epd__faults_t *f)
{
    for (const epd__fframe_t *h = f->head; h != NULL; h = h->next) {
        if (!h->passable) {
            return true;
        }
    }
    return false;
}

static int epd__faults_rx(epd__faults_t *f, epd_xport_t *x, const void *data, size_t len)
{
    size_t off;
    uint64_t now;

    if (!epd__xport_frame_is_msg(data, len, &off)) {
        /* handshakes and keepalives are not attacked, but keep their order */
        if (epd__blocked(f) && epd__hold(f, data, len, 0, false, SIZE_MAX)) {
            return 1;
        }
        return 0;
    }
    now = epd_time_now_ns();
    if (epd__hit(f, f->p_stall)) {
        epd__count(f, EPD__FK_STALL);
        epd_time_sleep_ns((uint64_t)f->stall_ms * EPD_NSEC_PER_MSEC);
    }
    if (epd__hit(f, f->p_drop)) {
        epd__count(f, EPD__FK_DROP);
        return 1;
    }
    if (epd__hit(f, f->p_corrupt) && off < len) {
        size_t at = off + (size_t)(epd_rng_next(&f->rng) % (len - off));
        if (epd__hold(f, data, len, 0, false, at)) {
            epd__count(f, EPD__FK_CORRUPT);
            (void)epd__faults_tick(f, x, now); /* now, unless behind a delay */
            return 1;
        }
    }
    if (epd__hit(f, f->p_delay)) {
        if (epd__hold(f, data, len, now + (uint64_t)f->delay_ms * EPD_NSEC_PER_MSEC, false,
                      SIZE_MAX)) {
            epd__count(f, EPD__FK_DELAY);
            return 1;
        }
    }
    if (epd__hit(f, f->p_reorder)) {
        if (epd__hold(f, data, len, now + EPD__REORDER_HOLD_NS, true, SIZE_MAX)) {
            epd__count(f, EPD__FK_REORDER);
            return 1;
        }
    }
    if (epd__blocked(f)) {
        return epd__hold(f, data, len, 0, false, SIZE_MAX) ? 1 : 0;
    }
    if (epd__hit(f, f->p_dup)) {
        epd__count(f, EPD__FK_DUP);
        epd__xport_deliver_now(x, data, len);
        /* the second copy goes through the core as well (and is refused:
         * its sequence number is spent) */
    }
    return 0;
}

static int epd__faults_comp(epd__faults_t *f, epd__xport_op_t *op, const void *ep,
                            epd_status_t *status_p)
{
    epd__fcomp_t *c;

    if (*status_p != EPD_OK) {
        return 0;
    }
    if (epd__hit(f, f->p_drop)) {
        epd__count(f, EPD__FK_WC_DROP);
        *status_p = EPD_ERR_TRANSPORT;
        return 0;
    }
    if (f->delay_ms > 0 && epd__hit(f, f->p_delay)) {
        c = epd_malloc(sizeof(*c));
        if (c != NULL) {
            epd__count(f, EPD__FK_WC_DELAY);
            c->due_ns = epd_time_now_ns() + (uint64_t)f->delay_ms * EPD_NSEC_PER_MSEC;
            c->op = op;
            c->ep = ep;
            c->status = *status_p;
            c->next = f->comps;
            f->comps = c;
            return 1;
        }
    }
    return 0;
}

/* The copy is owned by the caller. */
static int epd__faults_write(epd__faults_t *f, const void *local, size_t len, void **copy_p)
{
    unsigned char *copy;

    if (!epd__hit(f, f->p_wcorrupt > 0.0 ? f->p_wcorrupt : f->p_corrupt)) {
        return 0;
    }
    copy = epd_malloc(len);
    if (copy == NULL) {
        return 0;
    }
    memcpy(copy, local, len);
    copy[epd_rng_next(&f->rng) % len] ^= 0x5a;
    epd__count(f, EPD__FK_WR_CORRUPT);
    *copy_p = copy;
    return 1;
}

static int epd__faults_tick(epd__faults_t *f, epd_xport_t *x, uint64_t now_ns)
{
    epd__fframe_t **pp = &f->head, *prev = NULL;
    epd__fcomp_t **cp = &f->comps;
    int n = 0;

    /* frames: in order; a passable one not due is skipped, anything else
     * not due stops the walk */
    while (*pp != NULL) {
        epd__fframe_t *h = *pp;
        if (h->due_ns > now_ns) {
            if (!h->passable) {
                break;
            }
            prev = h;
            pp = &h->next;
            continue;
        }
        *pp = h->next;
        if (f->tail == h) {
            f->tail = prev;
        }
        epd__xport_deliver_now(x, h->bytes, h->len);
        epd_free(h);
        n++;
        /* a delivery may have queued more (it runs user callbacks): start
         * over from the head */
        pp = &f->head;
        prev = NULL;
    }
    while (*cp != NULL) {
        epd__fcomp_t *c = *cp;
        if (c->due_ns > now_ns) {
            cp = &c->next;
            continue;
        }
        *cp = c->next;
        epd__xport_op_done_now(c->op, c->status);
        epd_free(c);
        n++;
        cp = &f->comps;
    }
    return n;
}

static int epd__faults_pending(const epd__faults_t *f)
{
    return f->head != NULL || f->comps != NULL;
}

static void epd__faults_release(epd__faults_t *f, const void *ep)
{
    epd__fcomp_t **cp = &f->comps;

    while (*cp != NULL) {
        epd__fcomp_t *c = *cp;
        if (ep != NULL && c->ep != ep) {
            cp = &c->next;
            continue;
        }
        *cp = c->next;
        epd__xport_op_done_now(c->op, c->status);
        epd_free(c);
        cp = &f->comps;
    }
}

/* ------------------------------------------------------ the interposer */

/* Upcalls from the backend below, before the core sees them. */

static int epd__faults_on_deliver(void *ip, const void *data, size_t len)
{
    epd__faults_t *f = ip;

    return epd__faults_rx(f, f->core, data, len);
}

static int epd__faults_on_op_done(void *ip, epd__xport_op_t *op, epd_status_t *status_p)
{
    epd__faults_t *f = ip;
    epd__fep_t *fep = op->ip_priv[0];

    if (fep == NULL) {
        return 0; /* not a write (a flush): untouched */
    }
    /* the backend is done with the bytes: a corrupted copy can go */
    epd_free(op->ip_priv[1]);
    op->ip_priv[1] = NULL;
    /* held only while the endpoint lives (its teardown completes every op
     * before it returns) */
    return epd__xport_ep_live(fep->core_ep) && epd__faults_comp(f, op, fep, status_p);
}

static const epd__xport_hook_t epd__faults_hook = {
    .deliver = epd__faults_on_deliver,
    .op_done = epd__faults_on_op_done,
};

/* Downcalls: each goes to the backend below; write, ep_destroy, progress,
 * arm and destroy do the faults' part first. */

static epd_status_t epd__faults_be_create(epd_xport_t *core, const epd_xport_config_t *config,
                                          void **be_p)
{
    (void)core;
    (void)config;
    (void)be_p;
    return EPD_ERR_FATAL; /* armed through epd__faults_wrap only */
}

static void epd__faults_be_destroy(void *be)
{
    epd__faults_t *f = be;
    const epd__xport_backend_ops_t *inner = f->inner;
    void *inner_be = f->inner_be;

    epd__xport_set_hook(f->core, NULL, NULL); /* whatever comes now goes straight up */
    epd__faults_destroy(f); /* held frames go with it */
    inner->destroy(inner_be);
}

static epd_status_t epd__faults_address(void *be, const void **blob_p, size_t *len_p)
{
    epd__faults_t *f = be;

    return f->inner->address(f->inner_be, blob_p, len_p);
}

static void epd__faults_describe(void *be, char *buf, size_t len)
{
    epd__faults_t *f = be;

    f->inner->describe(f->inner_be, buf, len);
}

/* *be_ep_p: owned by the core (ep_destroy). */
static epd_status_t epd__faults_ep_create(void *be, const void *blob, size_t len,
                                          epd_xport_ep_t *core_ep, void **be_ep_p)
{
    epd__faults_t *f = be;
    epd__fep_t *fep = epd_calloc(1, sizeof(*fep));
    epd_status_t st;

    if (fep == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    st = f->inner->ep_create(f->inner_be, blob, len, core_ep, &fep->inner);
    if (st != EPD_OK) {
        epd_free(fep);
        return st;
    }
    fep->f = f;
    fep->core_ep = core_ep;
    *be_ep_p = fep;
    return EPD_OK;
}

static void epd__faults_ep_destroy(void *be_ep)
{
    epd__fep_t *fep = be_ep;

    epd__faults_release(fep->f, fep); /* completions it delayed */
    fep->f->inner->ep_destroy(fep->inner);
    epd_free(fep);
}

static void epd__faults_ep_describe(void *be_ep, char *buf, size_t len, const char **class_p)
{
    epd__fep_t *fep = be_ep;

    fep->f->inner->ep_describe(fep->inner, buf, len, class_p);
}

static epd_status_t epd__faults_send(void *be_ep, const void *hdr, size_t hdr_len,
                                     const void *payload, size_t len)
{
    epd__fep_t *fep = be_ep;

    return fep->f->inner->send(fep->inner, hdr, hdr_len, payload, len);
}

/* op->ip_priv: [0] the endpoint (marks a write of ours), [1] a corrupted
 * copy of the bytes (owned until the op completes, or NULL). */
static epd_status_t epd__faults_be_write(void *be_ep, const void *local, size_t len,
                                         void *be_local_mr, void *be_rkey, uint64_t remote_offset,
                                         epd__xport_op_t *op)
{
    epd__fep_t *fep = be_ep;
    void *copy = NULL;
    epd_status_t st;

    if (epd__faults_write(fep->f, local, len, &copy)) {
        local = copy; /* unregistered: the backend copes (UCX and libfabric here) */
        be_local_mr = NULL;
    }
    op->ip_priv[0] = fep;
    op->ip_priv[1] = copy;
    st = fep->f->inner->write(fep->inner, local, len, be_local_mr, be_rkey, remote_offset, op);
    if (st != EPD_INPROGRESS) {
        epd_free(copy);
        op->ip_priv[0] = op->ip_priv[1] = NULL;
    }
    return st;
}

static epd_status_t epd__faults_flush(void *be_ep, epd__xport_op_t *op)
{
    epd__fep_t *fep = be_ep;

    return fep->f->inner->flush(fep->inner, op);
}

static epd_status_t epd__faults_mr_alloc(void *be, size_t size, unsigned access, void **addr_p,
                                         void **be_mr_p)
{
    epd__faults_t *f = be;

    return f->inner->mr_alloc(f->inner_be, size, access, addr_p, be_mr_p);
}

static epd_status_t epd__faults_mr_reg(void *be, void *addr, size_t size, unsigned access,
                                       void **be_mr_p)
{
    epd__faults_t *f = be;

    return f->inner->mr_reg(f->inner_be, addr, size, access, be_mr_p);
}

static void epd__faults_mr_dereg(void *be, void *be_mr)
{
    epd__faults_t *f = be;

    f->inner->mr_dereg(f->inner_be, be_mr);
}

static epd_status_t epd__faults_mr_pack(void *be, void *be_mr, void *buf, size_t cap, size_t *len_p)
{
    epd__faults_t *f = be;

    return f->inner->mr_pack(f->inner_be, be_mr, buf, cap, len_p);
}

static epd_status_t epd__faults_rkey_unpack(void *be_ep, const void *blob, size_t len,
                                            void **be_rkey_p, size_t *size_p)
{
    epd__fep_t *fep = be_ep;

    return fep->f->inner->rkey_unpack(fep->inner, blob, len, be_rkey_p, size_p);
}

/* rkey_destroy names no backend state: the inner one is called directly
 * (the table below takes it at wrap time). */

static epd_status_t epd__faults_grant_open(void *be, void *be_mr, epd_xport_grant_t *core_grant,
                                           void **be_grant_p)
{
    epd__faults_t *f = be;

    return f->inner->grant_open(f->inner_be, be_mr, core_grant, be_grant_p);
}

static epd_status_t epd__faults_grant_pack(void *be, void *be_grant, void *buf, size_t cap,
                                           size_t *len_p)
{
    epd__faults_t *f = be;

    return f->inner->grant_pack(f->inner_be, be_grant, buf, cap, len_p);
}

static epd_status_t epd__faults_grant_revoke(void *be, void *be_grant, int writer_same_host)
{
    epd__faults_t *f = be;

    return f->inner->grant_revoke(f->inner_be, be_grant, writer_same_host);
}

static int epd__faults_grant_settled(void *be, void *be_grant)
{
    epd__faults_t *f = be;

    return f->inner->grant_settled(f->inner_be, be_grant);
}

static void epd__faults_grant_close(void *be, void *be_grant)
{
    epd__faults_t *f = be;

    f->inner->grant_close(f->inner_be, be_grant);
}

static uint32_t epd__faults_limbo(void *be, uint64_t peer_xid)
{
    epd__faults_t *f = be;

    return f->inner->limbo(f->inner_be, peer_xid);
}

/* The backend's progress, then what the faults hold that is due. */
static int epd__faults_progress(void *be)
{
    epd__faults_t *f = be;
    int n = f->inner->progress(f->inner_be);

    return n + epd__faults_tick(f, f->core, epd_time_now_ns());
}

static epd_status_t epd__faults_get_fd(void *be, int *fd_p)
{
    epd__faults_t *f = be;

    return f->inner->get_fd(f->inner_be, fd_p);
}

/* While anything is held the loop must not sleep on the fd. */
static epd_status_t epd__faults_arm(void *be)
{
    epd__faults_t *f = be;

    if (epd__faults_pending(f)) {
        return EPD_ERR_BUSY;
    }
    return f->inner->arm(f->inner_be);
}

/* The template of every transport's table (epd__faults_wrap copies it):
 * rkey_destroy names no backend state, so the copy gets the inner
 * backend's own. */
static const epd__xport_backend_ops_t epd__faults_ops = {
    .size = sizeof(epd__xport_backend_ops_t),
    .name = "faults",
    .create = epd__faults_be_create,
    .destroy = epd__faults_be_destroy,
    .address = epd__faults_address,
    .describe = epd__faults_describe,
    .ep_create = epd__faults_ep_create,
    .ep_destroy = epd__faults_ep_destroy,
    .ep_describe = epd__faults_ep_describe,
    .send = epd__faults_send,
    .write = epd__faults_be_write,
    .flush = epd__faults_flush,
    .mr_alloc = epd__faults_mr_alloc,
    .mr_reg = epd__faults_mr_reg,
    .mr_dereg = epd__faults_mr_dereg,
    .mr_pack = epd__faults_mr_pack,
    .rkey_unpack = epd__faults_rkey_unpack,
    .rkey_destroy = NULL, /* the inner backend's, in the copy */
    .grant_open = epd__faults_grant_open,
    .grant_pack = epd__faults_grant_pack,
    .grant_revoke = epd__faults_grant_revoke,
    .grant_settled = epd__faults_grant_settled,
    .grant_close = epd__faults_grant_close,
    .limbo = epd__faults_limbo,
    .progress = epd__faults_progress,
    .get_fd = epd__faults_get_fd,
    .arm = epd__faults_arm,
};

/* Arms over (inner, inner_be) when EPD_XPORT_FAULTS asks for anything:
 * *ip_p is then ours (destroyed through (*ops_p)->destroy, which destroys
 * the inner backend too) and the core's upcalls come to us first. */
static epd_status_t epd__faults_wrap(epd_xport_t *core, const epd_xport_config_t *config,
                                     const epd__xport_backend_ops_t *inner, void *inner_be,
                                     const epd__xport_backend_ops_t **ops_p, void **ip_p)
{
    epd__faults_t *f;
    epd_status_t st;

    *ip_p = NULL;
    st = epd__faults_create(config->secret != NULL, config->identity.worker_id, &f);
    if (st != EPD_OK || f == NULL) {
        return st;
    }
    f->core = core;
    f->inner = inner;
    f->inner_be = inner_be;
    f->ops = epd__faults_ops;
    f->ops.rkey_destroy = inner->rkey_destroy;
    epd__xport_set_hook(core, &epd__faults_hook, f);
    *ops_p = &f->ops;
    *ip_p = f;
    return EPD_OK;
}

const epd__xport_interposer_t epd__xport_faults_interposer = {
    .name = "faults",
    .wrap = epd__faults_wrap,
};
