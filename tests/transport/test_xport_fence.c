/*
 * test_xport_fence.c — the transport core's fences, on the in-process
 * loopback backend (tests/transport/epd_xport_loop.c): a fenced message is
 * delivered only after every earlier write on its endpoint landed; a
 * backend flush orders it only when a write since the last flush does not
 * deliver on completion (op->delivers) — writes that do (UCX puts into
 * mapped shared memory, libfabric delivery-complete writes) are fenced by
 * their completions alone.  Writes can be held "on the wire" by the
 * loopback backend, so the order is checked, not assumed.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_test.h"
#include "epd_xport_loop.h"

#define REGION 4096

typedef struct {
    epd_xport_t *x;
    unsigned char *region; /* the receive region, to look at when a message arrives */
    int msgs;
    char last[64];
    unsigned char seen_at_msg; /* region[0] when the last message arrived */
} w_t;

static void w_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    w_t *w = arg;

    (void)ep;
    w->msgs++;
    snprintf(w->last, sizeof(w->last), "%.*s", (int)len, (const char *)data);
    w->seen_at_msg = w->region != NULL ? w->region[0] : 0;
}

static void w_init(w_t *w)
{
    epd_xport_config_t cfg;

    memset(w, 0, sizeof(*w));
    epd_xport_config_init(&cfg);
    cfg.msg_cb = w_msg;
    cfg.cb_arg = w;
    cfg.max_inflight = 64;
    cfg.connect_timeout_ms = 2000;
    cfg.peer_timeout_ms = 60000;
    assert_int_equal(epd__xport_create_ops(&epd_xport_loop_ops, &cfg, &w->x), EPD_OK);
}

static void pump(w_t *a, w_t *b)
{
    for (int round = 0; round < 1000; round++) {
        int work = epd_xport_progress(a->x) + epd_xport_progress(b->x) +
                   (int)epd_xport_loop_pending(a->x) + (int)epd_xport_loop_pending(b->x);

        if (work == 0) {
            return;
        }
    }
    fail_msg("the workers never went quiet");
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

/* Two workers, a connected to b, a key to b's receive region on a's
 * endpoint, a's source buffer. */
typedef struct {
    w_t a, b;
    epd_xport_ep_t *ep;
    epd_xport_mr_t *dst, *src;
    epd_xport_rkey_t *rk;
    unsigned char *buf;
} fix_t;

static void fix_open(fix_t *f)
{
    unsigned char key[EPD_XPORT_RKEY_MAX];
    size_t key_len;
    const void *blob;
    size_t len;
    comp_t c = {0};

    epd_xport_loop_set_writes(0, 0);
    w_init(&f->a);
    w_init(&f->b);
    assert_int_equal(epd_xport_address(f->b.x, &blob, &len), EPD_OK);
    assert_int_equal(epd_xport_connect(f->a.x, blob, len, comp_cb, &c, &f->ep), EPD_INPROGRESS);
    pump(&f->a, &f->b);
    assert_int_equal(c.calls, 1);
    assert_int_equal(c.status, EPD_OK);
    assert_int_equal(epd_xport_mr_alloc_ex(f->b.x, REGION, EPD_XPORT_MR_REMOTE_WRITE, &f->dst),
                     EPD_OK);
    f->b.region = epd_xport_mr_addr(f->dst);
    assert_int_equal(epd_xport_mr_alloc_ex(f->a.x, REGION, EPD_XPORT_MR_LOCAL, &f->src), EPD_OK);
    f->buf = epd_xport_mr_addr(f->src);
    assert_int_equal(epd_xport_mr_pack(f->dst, key, sizeof(key), &key_len), EPD_OK);
    assert_int_equal(epd_xport_rkey_unpack(f->ep, key, key_len, &f->rk), EPD_OK);
}

static void fix_close(fix_t *f)
{
    epd_xport_loop_set_writes(0, 0);
    epd_xport_ep_close(f->ep);
    epd_xport_destroy(f->a.x);
    epd_xport_destroy(f->b.x);
}

/* Writes byte v to b's region[0] (completion counted in *c). */
static void write_byte(fix_t *f, unsigned char v, comp_t *c)
{
    f->buf[0] = v;
    assert_int_equal(epd_xport_write(f->ep, f->buf, 1, f->src, f->rk, 0, comp_cb, c),
                     EPD_INPROGRESS);
}

static void send_msg(fix_t *f, const char *text, unsigned flags)
{
    assert_int_equal(epd_xport_send(f->ep, text, strlen(text), flags), EPD_OK);
}

/* Writes that deliver on completion: the fenced message waits for the
 * write's completion — not for a flush, which is never asked for. */
static void test_delivering_writes_need_no_flush(void **state)
{
    fix_t f;
    comp_t c = {0};
    unsigned long flushes;

    (void)state;
    fix_open(&f);
    flushes = epd_xport_loop_flushes();
    epd_xport_loop_set_writes(1, 1); /* delivering, held on the wire */
    write_byte(&f, 'A', &c);
    send_msg(&f, "fenced", EPD_XPORT_SEND_FENCE);
    pump(&f.a, &f.b);
    /* the write is still on the wire: the fenced message must wait */
    assert_int_equal(f.b.msgs, 0);
    assert_int_equal(c.calls, 0);
    /* a message without a fence behind it waits too (order per endpoint) */
    send_msg(&f, "after", 0);
    pump(&f.a, &f.b);
    assert_int_equal(f.b.msgs, 0);
    assert_int_equal(epd_xport_loop_release_writes(f.a.x), 1);
    pump(&f.a, &f.b);
    assert_int_equal(c.calls, 1);
    assert_int_equal(c.status, EPD_OK);
    assert_int_equal(f.b.msgs, 2);
    assert_string_equal(f.b.last, "after");
    assert_int_equal(f.b.seen_at_msg, 'A');
    assert_int_equal(epd_xport_loop_flushes(), flushes); /* no flush at all */
    /* a fenced message behind completed delivering writes goes at once */
    epd_xport_loop_set_writes(1, 0);
    write_byte(&f, 'B', &c);
    pump(&f.a, &f.b);
    send_msg(&f, "again", EPD_XPORT_SEND_FENCE);
    pump(&f.a, &f.b);
    assert_int_equal(f.b.msgs, 3);
    assert_int_equal(f.b.seen_at_msg, 'B');
    assert_int_equal(epd_xport_loop_flushes(), flushes);
    fix_close(&f);
}

/* Writes that do not deliver on completion: the fence flushes after them. */
static void test_other_writes_are_flushed(void **state)
{
    fix_t f;
    comp_t c = {0};
    unsigned long flushes;

    (void)state;
    fix_open(&f);
    flushes = epd_xport_loop_flushes();
    epd_xport_loop_set_writes(0, 1);
    write_byte(&f, 'C', &c);
    send_msg(&f, "fenced", EPD_XPORT_SEND_FENCE);
    pump(&f.a, &f.b);
    assert_int_equal(f.b.msgs, 0);
    assert_int_equal(epd_xport_loop_flushes(), flushes); /* not before the write completed */
    epd_xport_loop_release_writes(f.a.x);
    pump(&f.a, &f.b);
    assert_int_equal(f.b.msgs, 1);
    assert_int_equal(f.b.seen_at_msg, 'C');
    assert_int_equal(epd_xport_loop_flushes(), flushes + 1);
    fix_close(&f);
}

/* One non-delivering write among delivering ones makes the next fence
 * flush; after that flush, delivering writes need none again. */
static void test_mixed_writes(void **state)
{
    fix_t f;
    comp_t c = {0};
    unsigned long flushes;

    (void)state;
    fix_open(&f);
    flushes = epd_xport_loop_flushes();
    epd_xport_loop_set_writes(1, 0);
    write_byte(&f, 'D', &c);
    epd_xport_loop_set_writes(0, 0);
    write_byte(&f, 'E', &c);
    epd_xport_loop_set_writes(1, 0);
    write_byte(&f, 'F', &c);
    send_msg(&f, "fenced", EPD_XPORT_SEND_FENCE);
    pump(&f.a, &f.b);
    assert_int_equal(c.calls, 3);
    assert_int_equal(f.b.msgs, 1);
    assert_int_equal(f.b.seen_at_msg, 'F');
    assert_int_equal(epd_xport_loop_flushes(), flushes + 1);
    write_byte(&f, 'G', &c);
    send_msg(&f, "fenced again", EPD_XPORT_SEND_FENCE);
    pump(&f.a, &f.b);
    assert_int_equal(f.b.msgs, 2);
    assert_int_equal(f.b.seen_at_msg, 'G');
    assert_int_equal(epd_xport_loop_flushes(), flushes + 1);
    fix_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_delivering_writes_need_no_flush),
        cmocka_unit_test(test_other_writes_are_flushed),
        cmocka_unit_test(test_mixed_writes),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
