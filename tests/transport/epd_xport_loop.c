/*
 * epd_xport_loop.c — the in-process loopback backend (see epd_xport_loop.h).
 *
 * A registry of live workers by number (the address blob names one); each
 * worker has an inbox of frame copies, a list of regions and a list of
 * finished operations.  Bounded only by what a test does: this is test
 * code, never built into a daemon.
 */
#include "epd_xport_loop.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "epd_alloc.h"

#define LOOP_MAX 1024               /* live workers per process */
#define LOOP_ADDR_MAGIC 0x504f4f4cu /* "LOOP" */
#define LOOP_KEY_MAGIC 0x59454b4cu  /* "LKEY" */
#define LOOP_INBOX_MAX 100000u      /* frames queued per worker before backpressure */

typedef struct loop_be loop_be_t;
typedef struct loop_ep loop_ep_t;

typedef struct loop_frame {
    struct loop_frame *next;
    size_t len;
    unsigned char data[];
} loop_frame_t;

typedef struct loop_mr {
    struct loop_mr *next;
    uint64_t id;
    void *addr;
    size_t size;
    void *owned;
    bool remote_write;
} loop_mr_t;

/* a grant: its own id, checked by the core on every write (like a UCX
 * active-message write: the loop backend's writes are all checked) */
typedef struct loop_grant {
    struct loop_grant *next;
    uint64_t id;
    loop_mr_t *mr;
    epd_xport_grant_t *core;
} loop_grant_t;

/* an op's state, in be_priv */
typedef struct {
    loop_ep_t *ep;
    epd__xport_op_t *next; /* ep's list of finished (or held) ops */
    epd_status_t status;
    unsigned char *dst; /* a held write: lands when released */
    const unsigned char *src;
    size_t len;
} loop_op_t;

_Static_assert(sizeof(loop_op_t) <= sizeof(((epd__xport_op_t *)0)->be_priv), "op fits");
#define LOOP_OP(op) ((loop_op_t *)(void *)(op)->be_priv)

struct loop_ep {
    loop_be_t *be;
    epd_xport_ep_t *core_ep;
    uint64_t peer; /* worker number of the peer */
    epd__xport_op_t *done_head, *done_tail;
    epd__xport_op_t *held_head, *held_tail; /* writes held back (epd_xport_loop_set_writes) */
    loop_ep_t *next;
};

struct loop_be {
    epd_xport_t *core;
    uint64_t num;
    struct {
        uint32_t magic;
        uint32_t pad;
        uint64_t num;
    } addr;
    loop_frame_t *in_head, *in_tail;
    size_t in_count;
    loop_mr_t *mrs;
    loop_grant_t *grants;
    loop_ep_t *eps;
};

typedef struct {
    uint32_t magic;
    uint32_t pad;
    uint64_t num;
    uint64_t region;
    uint64_t size;
} loop_key_t;

typedef struct {
    uint64_t num;
    uint64_t region;
    uint64_t size;
} loop_rkey_t;

static loop_be_t *loop_live[LOOP_MAX];
static uint64_t loop_next_num = 1;
static epd__xport_tap_cb_t loop_tap;
static void *loop_tap_arg;

void epd_xport_loop_reset(void)
{
    for (int i = 0; i < LOOP_MAX; i++) {
        if (loop_live[i] != NULL) {
            return;
        }
    }
    loop_next_num = 1;
}

static int loop_delivers;       /* writes say their completion means delivery */
static int loop_hold;           /* writes land only when released */
static unsigned long loop_n_flush; /* flushes the core asked for */

void epd_xport_loop_set_writes(int delivers, int hold)
{
    loop_delivers = delivers;
    loop_hold = hold;
}

unsigned long epd_xport_loop_flushes(void)
{
    return loop_n_flush;
}

void epd_xport_loop_set_send_tap(epd__xport_tap_cb_t tap, void *arg)
{
    loop_tap = tap;
    loop_tap_arg = arg;
}

static loop_be_t *loop_find(uint64_t num)
{
    for (int i = 0; i < LOOP_MAX; i++) {
        if (loop_live[i] != NULL && loop_live[i]->num == num) {
            return loop_live[i];
        }
    }
    return NULL;
}

size_t epd_xport_loop_pending(epd_xport_t *x)
{
    for (int i = 0; i < LOOP_MAX; i++) {
        if (loop_live[i] != NULL && loop_live[i]->core == x) {
            return loop_live[i]->in_count;
        }
    }
    return 0;
}

static epd_status_t loop_create(epd_xport_t *core, const epd_xport_config_t *config, void **be_p)
{
    loop_be_t *be;
    int slot = -1;

    (void)config;
    for (int i = 0; i < LOOP_MAX; i++) {
        if (loop_live[i] == NULL) {
            slot = i;
            break;
        }
    }
    if (slot < 0) {
        return EPD_ERR_NO_RESOURCE;
    }
    be = epd_calloc(1, sizeof(*be));
    if (be == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    be->core = core;
    be->num = loop_next_num++;
    be->addr.magic = LOOP_ADDR_MAGIC;
    be->addr.num = be->num;
    loop_live[slot] = be;
    *be_p = be;
    return EPD_OK;
}

static void loop_destroy(void *arg)
{
    loop_be_t *be = arg;

    for (int i = 0; i < LOOP_MAX; i++) {
        if (loop_live[i] == be) {
            loop_live[i] = NULL;
        }
    }
    while (be->in_head != NULL) {
        loop_frame_t *f = be->in_head;
        be->in_head = f->next;
        epd_free(f);
    }
    while (be->mrs != NULL) {
        loop_mr_t *mr = be->mrs;
        be->mrs = mr->next;
        epd_free(mr->owned);
        epd_free(mr);
    }
    epd_free(be);
}

static epd_status_t loop_address(void *arg, const void **blob_p, size_t *len_p)
{
    loop_be_t *be = arg;

    *blob_p = &be->addr;
    *len_p = sizeof(be->addr);
    return EPD_OK;
}

static void loop_describe(void *arg, char *buf, size_t len)
{
    loop_be_t *be = arg;

    snprintf(buf, len, "loop worker %llu", (unsigned long long)be->num);
}

static epd_status_t loop_ep_create(void *arg, const void *blob, size_t len, epd_xport_ep_t *core_ep,
                                   void **be_ep_p)
{
    loop_be_t *be = arg;
    loop_ep_t *ep;
    uint32_t magic;
    uint64_t num;

    if (len != sizeof(be->addr)) {
        return EPD_ERR_BAD_ADDRESS;
    }
    memcpy(&magic, blob, sizeof(magic));
    memcpy(&num, (const unsigned char *)blob + 8, sizeof(num));
    if (magic != LOOP_ADDR_MAGIC || num == 0) {
        return EPD_ERR_BAD_ADDRESS;
    }
    ep = epd_calloc(1, sizeof(*ep));
    if (ep == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    ep->be = be;
    ep->core_ep = core_ep;
    ep->peer = num; /* a worker that does not exist (yet) swallows frames */
    ep->next = be->eps;
    be->eps = ep;
    *be_ep_p = ep;
    return EPD_OK;
}

static void loop_ep_destroy(void *arg)
{
    loop_ep_t *ep = arg;
    loop_be_t *be = ep->be;
    loop_ep_t **pp = &be->eps;
    epd__xport_op_t *op;

    while (*pp != ep) {
        pp = &(*pp)->next;
    }
    *pp = ep->next;
    while ((op = ep->done_head) != NULL) {
        ep->done_head = LOOP_OP(op)->next;
        epd__xport_op_done(op, LOOP_OP(op)->status == EPD_OK ? EPD_OK : EPD_ERR_CANCELED);
    }
    while ((op = ep->held_head) != NULL) {
        ep->held_head = LOOP_OP(op)->next;
        epd__xport_op_done(op, EPD_ERR_CANCELED);
    }
    epd_free(ep);
}

static void loop_ep_describe(void *arg, char *buf, size_t len, const char **class_p)
{
    loop_ep_t *ep = arg;

    snprintf(buf, len, "loop to worker %llu", (unsigned long long)ep->peer);
    *class_p = "other";
}

static epd_status_t loop_send(void *arg, const void *hdr, size_t hdr_len, const void *payload,
                              size_t len)
{
    loop_ep_t *ep = arg;
    loop_be_t *to = loop_find(ep->peer);
    loop_frame_t *f;

    if (to != NULL && to->in_count >= LOOP_INBOX_MAX) {
        return EPD_ERR_NO_RESOURCE;
    }
    f = epd_malloc(sizeof(*f) + hdr_len + len);
    if (f == NULL) {
        return EPD_ERR_NO_RESOURCE;
    }
    f->next = NULL;
    f->len = hdr_len + len;
    memcpy(f->data, hdr, hdr_len);
    if (len > 0) {
        memcpy(f->data + hdr_len, payload, len);
    }
    if (loop_tap != NULL) {
        loop_tap(loop_tap_arg, f->data, f->len);
    }
    if (to == NULL) {
        epd_free(f); /* nobody there: gone like a datagram */
        return EPD_OK;
    }
    if (to->in_tail != NULL) {
        to->in_tail->next = f;
    } else {
        to->in_head = f;
    }
    to->in_tail = f;
    to->in_count++;
    return EPD_OK;
}

static void loop_done(loop_ep_t *ep, epd__xport_op_t *op, epd_status_t status)
{
    LOOP_OP(op)->ep = ep;
    LOOP_OP(op)->status = status;
    LOOP_OP(op)->next = NULL;
    if (ep->done_tail != NULL) {
        LOOP_OP(ep->done_tail)->next = op;
    } else {
        ep->done_head = op;
    }
    ep->done_tail = op;
}

static epd_status_t loop_write(void *arg, const void *local, size_t len, void *be_local_mr,
                               void *be_rkey, uint64_t remote_offset, epd__xport_op_t *op)
{
    loop_ep_t *ep = arg;
    loop_rkey_t *rk = be_rkey;
    loop_be_t *to = loop_find(rk->num);

    unsigned char *dst = NULL;

    (void)be_local_mr;
    if (to != NULL) {
        for (loop_mr_t *mr = to->mrs; mr != NULL; mr = mr->next) {
            /* the receiving side's own check: region, access, range */
            if (mr->id == rk->region && mr->remote_write && remote_offset <= mr->size &&
                len <= mr->size - remote_offset) {
                dst = (unsigned char *)mr->addr + remote_offset;
                break;
            }
        }
        for (loop_grant_t *g = to->grants; g != NULL; g = g->next) {
            /* a grant's id: the fence's check first (revoked, owner's check) */
            if (g->id == rk->region && remote_offset <= g->mr->size &&
                len <= g->mr->size - remote_offset &&
                epd__xport_grant_write(g->core, remote_offset, len)) {
                memcpy((unsigned char *)g->mr->addr + remote_offset, local, len);
                break;
            }
        }
    }
    op->delivers = (unsigned char)(loop_delivers != 0);
    if (loop_hold && to != NULL) {
        /* lands (and completes) only when the test releases it */
        LOOP_OP(op)->ep = ep;
        LOOP_OP(op)->dst = dst;
        LOOP_OP(op)->src = local;
        LOOP_OP(op)->len = len;
        LOOP_OP(op)->next = NULL;
        if (ep->held_tail != NULL) {
            LOOP_OP(ep->held_tail)->next = op;
        } else {
            ep->held_head = op;
        }
        ep->held_tail = op;
        return EPD_INPROGRESS;
    }
    if (dst != NULL) {
        memcpy(dst, local, len);
    }
    loop_done(ep, op, to != NULL ? EPD_OK : EPD_ERR_PEER_DEAD);
    return EPD_INPROGRESS;
}

static epd_status_t loop_flush(void *arg, epd__xport_op_t *op)
{
    loop_ep_t *ep = arg;

    loop_n_flush++;
    loop_done(ep, op, EPD_OK);
    return EPD_INPROGRESS;
}

size_t epd_xport_loop_release_writes(epd_xport_t *x)
{
    size_t n = 0;

    for (int i = 0; i < LOOP_MAX; i++) {
        if (loop_live[i] == NULL || loop_live[i]->core != x) {
            continue;
        }
        for (loop_ep_t *ep = loop_live[i]->eps; ep != NULL; ep = ep->next) {
            epd__xport_op_t *op;

            while ((op = ep->held_head) != NULL) {
                ep->held_head = LOOP_OP(op)->next;
                if (ep->held_head == NULL) {
                    ep->held_tail = NULL;
                }
                if (LOOP_OP(op)->dst != NULL) {
                    memcpy(LOOP_OP(op)->dst, LOOP_OP(op)->src, LOOP_OP(op)->len);
                }
                loop_done(ep, op, EPD_OK);
                n++;
            }
        }
    }
    return n;
}

static epd_status_t loop_mr_new(loop_be_t *be, void *addr, size_t size, unsigned access,
                                void **addr_p, void **be_mr_p)
{
    loop_mr_t *mr = epd_calloc(1, sizeof(*mr));

    if (mr == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    if (addr == NULL) {
        mr->owned = epd_calloc(1, size);
        if (mr->owned == NULL) {
            epd_free(mr);
            return EPD_ERR_NO_MEMORY;
        }
        addr = mr->owned;
    }
    mr->addr = addr;
    mr->size = size;
    mr->remote_write = (access & EPD_XPORT_MR_REMOTE_WRITE) != 0;
    randombytes_buf(&mr->id, sizeof(mr->id));
    mr->next = be->mrs;
    be->mrs = mr;
    if (addr_p != NULL) {
        *addr_p = addr;
    }
    *be_mr_p = mr;
    return EPD_OK;
}

static epd_status_t loop_mr_alloc(void *arg, size_t size, unsigned access, void **addr_p,
                                  void **be_mr_p)
{
    return loop_mr_new(arg, NULL, size, access, addr_p, be_mr_p);
}

static epd_status_t loop_mr_reg(void *arg, void *addr, size_t size, unsigned access, void **be_mr_p)
{
    return loop_mr_new(arg, addr, size, access, NULL, be_mr_p);
}

static void loop_mr_dereg(void *arg, void *be_mr)
{
    loop_be_t *be = arg;
    loop_mr_t **pp = &be->mrs;

    while (*pp != be_mr) {
        pp = &(*pp)->next;
    }
    *pp = ((loop_mr_t *)be_mr)->next;
    epd_free(((loop_mr_t *)be_mr)->owned);
    epd_free(be_mr);
}

static epd_status_t loop_mr_pack(void *arg, void *be_mr, void *buf, size_t cap, size_t *len_p)
{
    loop_be_t *be = arg;
    loop_mr_t *mr = be_mr;
    loop_key_t k = {LOOP_KEY_MAGIC, 0, be->num, mr->id, mr->size};

    if (cap < sizeof(k)) {
        return EPD_ERR_NO_RESOURCE;
    }
    memcpy(buf, &k, sizeof(k));
    *len_p = sizeof(k);
    return EPD_OK;
}

static epd_status_t loop_rkey_unpack(void *arg, const void *blob, size_t len, void **be_rkey_p,
                                     size_t *size_p)
{
    loop_key_t k;
    loop_rkey_t *rk;

    (void)arg;
    if (len != sizeof(k)) {
        return EPD_ERR_BAD_RKEY;
    }
    memcpy(&k, blob, sizeof(k));
    if (k.magic != LOOP_KEY_MAGIC || k.size == 0 || k.size > SIZE_MAX) {
        return EPD_ERR_BAD_RKEY;
    }
    rk = epd_calloc(1, sizeof(*rk));
    if (rk == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    rk->num = k.num;
    rk->region = k.region;
    rk->size = k.size;
    *be_rkey_p = rk;
    *size_p = (size_t)k.size;
    return EPD_OK;
}

static void loop_rkey_destroy(void *be_rkey)
{
    epd_free(be_rkey);
}

static epd_status_t loop_grant_open(void *arg, void *be_mr, epd_xport_grant_t *core_grant,
                                    void **be_grant_p)
{
    loop_be_t *be = arg;
    loop_grant_t *g = epd_calloc(1, sizeof(*g));

    if (g == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    g->mr = be_mr;
    g->core = core_grant;
    randombytes_buf(&g->id, sizeof(g->id));
    g->next = be->grants;
    be->grants = g;
    *be_grant_p = g;
    return EPD_OK;
}

static epd_status_t loop_grant_pack(void *arg, void *be_grant, void *buf, size_t cap, size_t *len_p)
{
    loop_be_t *be = arg;
    loop_grant_t *g = be_grant;
    loop_key_t k = {LOOP_KEY_MAGIC, 0, be->num, g->id, g->mr->size};

    if (cap < sizeof(k)) {
        return EPD_ERR_NO_RESOURCE;
    }
    memcpy(buf, &k, sizeof(k));
    *len_p = sizeof(k);
    return EPD_OK;
}

static epd_status_t loop_grant_revoke(void *arg, void *be_grant, int writer_same_host)
{
    (void)arg;
    (void)be_grant;
    (void)writer_same_host;
    return EPD_OK; /* every write is checked at once: nothing is ever in flight */
}

static int loop_grant_settled(void *arg, void *be_grant)
{
    (void)arg;
    (void)be_grant;
    return 1;
}

static void loop_grant_close(void *arg, void *be_grant)
{
    loop_be_t *be = arg;
    loop_grant_t **pp = &be->grants;

    while (*pp != be_grant) {
        pp = &(*pp)->next;
    }
    *pp = ((loop_grant_t *)be_grant)->next;
    epd_free(be_grant);
}

static uint32_t loop_limbo(void *arg, uint64_t peer_xid)
{
    (void)arg;
    (void)peer_xid;
    return 0;
}

static int loop_progress(void *arg)
{
    loop_be_t *be = arg;
    size_t n_in = be->in_count;
    int n = 0;

    /* finished ops first (an endpoint may be closed by a callback: take one
     * at a time from the list head, re-reading it) */
    for (loop_ep_t *ep = be->eps; ep != NULL;) {
        epd__xport_op_t *op = ep->done_head;

        if (op == NULL) {
            ep = ep->next;
            continue;
        }
        ep->done_head = LOOP_OP(op)->next;
        if (ep->done_head == NULL) {
            ep->done_tail = NULL;
        }
        epd__xport_op_done(op, LOOP_OP(op)->status);
        n++;
        ep = be->eps; /* the list may have changed */
    }
    /* then what had arrived when we started (bounded) */
    while (n_in-- > 0 && be->in_head != NULL) {
        loop_frame_t *f = be->in_head;

        be->in_head = f->next;
        if (be->in_head == NULL) {
            be->in_tail = NULL;
        }
        be->in_count--;
        epd__xport_deliver(be->core, f->data, f->len);
        epd_free(f);
        n++;
    }
    return n;
}

static epd_status_t loop_get_fd(void *arg, int *fd_p)
{
    (void)arg;
    (void)fd_p;
    return EPD_ERR_UNSUPPORTED;
}

static epd_status_t loop_arm(void *arg)
{
    loop_be_t *be = arg;

    return be->in_count > 0 ? EPD_ERR_BUSY : EPD_ERR_UNSUPPORTED;
}

const epd__xport_backend_ops_t epd_xport_loop_ops = {
    .size = sizeof(epd__xport_backend_ops_t),
    .name = "loop",
    .create = loop_create,
    .destroy = loop_destroy,
    .address = loop_address,
    .describe = loop_describe,
    .ep_create = loop_ep_create,
    .ep_destroy = loop_ep_destroy,
    .ep_describe = loop_ep_describe,
    .send = loop_send,
    .write = loop_write,
    .flush = loop_flush,
    .mr_alloc = loop_mr_alloc,
    .mr_reg = loop_mr_reg,
    .mr_dereg = loop_mr_dereg,
    .mr_pack = loop_mr_pack,
    .rkey_unpack = loop_rkey_unpack,
    .rkey_destroy = loop_rkey_destroy,
    .grant_open = loop_grant_open,
    .grant_pack = loop_grant_pack,
    .grant_revoke = loop_grant_revoke,
    .grant_settled = loop_grant_settled,
    .grant_close = loop_grant_close,
    .limbo = loop_limbo,
    .progress = loop_progress,
    .get_fd = loop_get_fd,
    .arm = loop_arm,
};
