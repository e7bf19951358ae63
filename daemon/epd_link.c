/*
 * epd_link.c — links and their outboxes (see epd_link.h).
 *
 * Why the two-step end (down now, reported and closed from the pump): the
 * transport runs its error callback synchronously inside epd_xport_send,
 * i.e. possibly inside a role's message handler that still uses the link
 * or its requests.  Marking is all that happens there; the role hears of
 * it (on_link_down) at the top of the loop, and the memory goes only when
 * the last reference does — a handler up the stack never sees it freed.
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_daemon_int.h"

static void epd_link_unlist(epd_link_t *l)
{
    epd_daemon_t *d = l->d;

    if (l->prev != NULL) {
        l->prev->next = l->next;
    } else {
        d->links = l->next;
    }
    if (l->next != NULL) {
        l->next->prev = l->prev;
    }
    l->prev = l->next = NULL;
}

static void epd_link_setup(epd_link_t *l, epd_daemon_t *d, epd_link_kind_t kind,
                           epd_xport_ep_t *ep)
{
    l->d = d;
    l->kind = kind;
    l->ep = ep;
    l->refs = 1; /* the daemon's list */
    l->status = EPD_OK;
    l->next = d->links;
    if (d->links != NULL) {
        d->links->prev = l;
    }
    d->links = l;
    epd_xport_ep_set_user(ep, l);
}

epd_link_t *epd__link_new(epd_daemon_t *d, epd_link_kind_t kind, epd_xport_ep_t *ep)
{
    epd_link_t *l = epd_calloc(1, sizeof(*l));

    if (l == NULL) {
        return NULL;
    }
    epd_link_setup(l, d, kind, ep);
    l->connected = 1; /* its handshake arrived */
    return l;
}

/* Drops the queued messages (the link is going). */
static void epd_link_drop_out(epd_link_t *l)
{
    epd_daemon_t *d = l->d;

    while (l->out_head != NULL) {
        epd_outmsg_t *m = l->out_head;

        l->out_head = m->next;
        d->n_out--;
        d->out_bytes -= m->len;
        epd_free(m);
    }
    l->out_tail = NULL;
    l->n_out = 0;
    if (l->on_flush) {
        epd_link_t **pp = &d->flush_head;

        while (*pp != l) {
            pp = &(*pp)->flush_next;
        }
        *pp = l->flush_next;
        l->flush_next = NULL;
        l->on_flush = 0;
    }
}

/* Closes the endpoint now: keys unpacked on it die, writes still posted
 * complete with EPD_ERR_CANCELED (into their owners' callbacks). */
static void epd_link_close_ep(epd_link_t *l)
{
    epd_xport_ep_t *ep = l->ep;

    if (ep == NULL) {
        return;
    }
    l->ep = NULL;
    epd_xport_ep_set_user(ep, NULL);
    epd_xport_ep_close(ep);
}

static void epd_link_free(epd_link_t *l)
{
    epd_link_drop_out(l);
    epd_link_close_ep(l);
    epd_link_unlist(l);
    epd_free(l);
}

/* The handshake of an OUT link was answered (failures arrive through the
 * error callback as well; closing completes it with EPD_ERR_CANCELED). */
static void epd_link_on_connected(void *arg, epd_status_t status)
{
    epd_link_t *l = arg;

    if (status == EPD_OK) {
        l->connected = 1;
    }
}

epd_status_t epd_link_connect(epd_daemon_t *d, const void *addr, size_t len,
                              epd_link_t **link_p)
{
    epd_xport_ep_t *ep = NULL;
    epd_link_t *l;
    epd_status_t st;

    if (d->x == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    l = epd_calloc(1, sizeof(*l));
    if (l == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    st = epd_xport_connect(d->x, addr, len, epd_link_on_connected, l, &ep);
    if (st != EPD_OK && st != EPD_INPROGRESS) {
        epd_free(l);
        return st;
    }
    epd_link_setup(l, d, EPD_LINK_OUT, ep);
    l->refs++; /* the caller's */
    *link_p = l;
    return EPD_OK;
}

int epd_link_connected(const epd_link_t *link)
{
    return link->connected;
}

void epd_link_ref(epd_link_t *link)
{
    link->refs++;
}

void epd_link_unref(epd_link_t *link)
{
    if (link == NULL) {
        return;
    }
    link->refs--;
    if (link->refs == 0) {
        /* only possible once the daemon's list let go (destroy) */
        epd_link_free(link);
    } else if (link->refs == 1 && (link->closed || link->down)) {
        link->d->links_dirty = 1; /* only the list holds it: the pump frees it */
        epd__daemon_pump_kick(link->d);
    }
}

void epd_link_close(epd_link_t *link)
{
    if (link == NULL || link->closed) {
        return;
    }
    link->closed = 1;
    if (link->status == EPD_OK) {
        link->status = EPD_ERR_CANCELED;
    }
    epd_link_drop_out(link);
    epd_link_close_ep(link);
    link->d->links_dirty = 1;
    epd__daemon_pump_kick(link->d);
}

void epd__link_fail(epd_link_t *link, epd_status_t status)
{
    if (link->down || link->closed) {
        return;
    }
    link->down = 1;
    link->status = status != EPD_OK ? status : EPD_ERR_PEER_DEAD;
    epd_link_drop_out(link);
    link->d->links_dirty = 1;
    epd__daemon_pump_kick(link->d);
}

void epd__link_shut(epd_link_t *link, epd_status_t status)
{
    epd__link_fail(link, status);
    epd_link_close_ep(link);
}

int epd_link_usable(const epd_link_t *link)
{
    return link != NULL && link->ep != NULL && !link->down && !link->closed;
}

epd_status_t epd_link_status(const epd_link_t *link)
{
    return link->status;
}

epd_link_kind_t epd_link_kind(const epd_link_t *link)
{
    return link->kind;
}

epd_xport_ep_t *epd_link_ep(const epd_link_t *link)
{
    return epd_link_usable(link) ? link->ep : NULL;
}

uint64_t epd_link_peer_xid(const epd_link_t *link)
{
    return link->ep != NULL ? epd_xport_ep_peer_id(link->ep) : 0;
}

epd_peer_t *epd_link_peer(const epd_link_t *link)
{
    return link->peer;
}

epd_daemon_t *epd_link_daemon(const epd_link_t *link)
{
    return link->d;
}

void epd_link_describe(const epd_link_t *link, char *buf, size_t cap)
{
    if (link->ep == NULL) {
        snprintf(buf, cap, "closed");
        return;
    }
    epd_xport_ep_describe(link->ep, buf, cap);
}

uint32_t epd_link_queued(const epd_link_t *link)
{
    return link->n_out;
}

void epd_link_set_user(epd_link_t *link, void *user)
{
    link->user = user;
}

void *epd_link_user(const epd_link_t *link)
{
    return link->user;
}

/* ----------------------------------------------------------------- sending */

static void epd_link_flush_arm(epd_link_t *l)
{
    epd_daemon_t *d = l->d;

    if (!l->on_flush) {
        l->on_flush = 1;
        l->flush_next = d->flush_head;
        d->flush_head = l;
    }
    if (!d->flush_on && d->handles_ready) {
        d->flush_on = 1;
        uv_check_start(&d->flush, epd__link_on_flush);
    }
}

/* Sends one frame, or keeps a copy behind the earlier ones. */
static epd_status_t epd_link_send_frame(epd_link_t *l, const void *buf, size_t len,
                                        unsigned flags)
{
    epd_daemon_t *d = l->d;
    epd_outmsg_t *m;
    epd_status_t st;

    if (l->out_head == NULL) {
        st = epd_xport_send(l->ep, buf, len, flags);
        if (st == EPD_OK) {
            return EPD_OK;
        }
        if (st != EPD_ERR_NO_RESOURCE) {
            /* the endpoint failed (its error callback marked the link) */
            epd__link_fail(l, st);
            return st;
        }
    }
    if (d->n_out >= EPD_LINK_OUTBOX_MAX || d->out_bytes + len > EPD_LINK_OUTBOX_BYTES) {
        epd_log_error(d->log, 0,
                      "%u messages (%zu bytes) already wait for the transport: failing the "
                      "endpoint that cannot keep up rather than dropping a message",
                      d->n_out, d->out_bytes);
        epd__link_fail(l, EPD_ERR_NO_RESOURCE);
        return EPD_ERR_NO_RESOURCE;
    }
    m = epd_malloc(sizeof(*m) + len);
    if (m == NULL) {
        epd_log_error(d->log, 0, "out of memory for an outgoing message: failing its endpoint");
        epd__link_fail(l, EPD_ERR_NO_MEMORY);
        return EPD_ERR_NO_MEMORY;
    }
    m->next = NULL;
    m->len = len;
    m->flags = flags;
    memcpy(m->data, buf, len);
    if (l->out_tail != NULL) {
        l->out_tail->next = m;
    } else {
        l->out_head = m;
    }
    l->out_tail = m;
    l->n_out++;
    d->n_out++;
    d->out_bytes += len;
    epd_link_flush_arm(l);
    return EPD_OK;
}

epd_status_t epd_link_send(epd_link_t *link, Epd__Envelope__BodyCase body_case, void *body,
                           unsigned flags)
{
    epd_daemon_t *d;
    epd_status_t st;
    size_t len;

    if (link == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (!epd_link_usable(link)) {
        return link->status != EPD_OK ? link->status : EPD_ERR_PEER_DEAD;
    }
    d = link->d;
    st = epd_msg_encode_body(d->worker_id, &d->epoch, ++d->seq, body_case, body, d->tx_buf,
                             d->tx_cap, &len);
    if (st != EPD_OK) {
        epd_log_error(d->log, 0, "cannot encode a message of kind %d: %s", (int)body_case,
                      epd_status_string(st));
        return st;
    }
    return epd_link_send_frame(link, d->tx_buf, len, flags);
}

epd_status_t epd_link_send_error(epd_link_t *link, uint64_t id, epd_status_t status,
                                 const char *msg, const char *culprit)
{
    Epd__Error e = EPD__ERROR__INIT;
    char text[200];

    snprintf(text, sizeof(text), "%s", msg != NULL ? msg : "");
    e.request_id = id;
    e.status = (int32_t)status;
    e.message = text;
    if (culprit != NULL && culprit[0] != '\0') {
        e.culprit = (char *)culprit;
    }
    return epd_link_send(link, EPD__ENVELOPE__BODY_ERROR, &e, 0);
}

epd_status_t epd_link_send_refused(epd_link_t *link, uint64_t id, epd_status_t status,
                                   const char *reason)
{
    Epd__KvRefused r = EPD__KV_REFUSED__INIT;
    char text[200];

    snprintf(text, sizeof(text), "%s", reason != NULL ? reason : "");
    r.request_id = id;
    r.status = (int32_t)status;
    r.reason = text;
    return epd_link_send(link, EPD__ENVELOPE__BODY_REFUSED, &r, 0);
}

epd_status_t epd_link_send_abort(epd_link_t *link, uint64_t id, epd_status_t status,
                                 const char *reason)
{
    Epd__Abort a = EPD__ABORT__INIT;
    char text[200];

    snprintf(text, sizeof(text), "%s", reason != NULL ? reason : "");
    a.request_id = id;
    a.status = (int32_t)status;
    a.reason = text;
    return epd_link_send(link, EPD__ENVELOPE__BODY_ABORT, &a, 0);
}

void epd_link_refuse(epd_link_t *link, uint64_t id, epd_status_t status, const char *msg)
{
    if (link == NULL) {
        return;
    }
    epd_daemon_refuse_log(link->d, id, "%s (%s)", msg, epd_status_name(status));
    (void)epd_link_send_error(link, id, status, msg, NULL);
}

epd_status_t epd_link_send_quiesced(epd_link_t *link, uint64_t id)
{
    Epd__WritesQuiesced q = EPD__WRITES_QUIESCED__INIT;

    q.request_id = id;
    return epd_link_send(link, EPD__ENVELOPE__BODY_QUIESCED, &q, EPD_XPORT_SEND_FENCE);
}

/* ---------------------------------------------------------------- outboxes */

void epd__link_flush_all(epd_daemon_t *d)
{
    epd_link_t *l = d->flush_head;

    d->flush_head = NULL;
    while (l != NULL) {
        epd_link_t *next = l->flush_next;

        l->on_flush = 0;
        l->flush_next = NULL;
        while (l->out_head != NULL && epd_link_usable(l)) {
            epd_outmsg_t *m = l->out_head;
            epd_status_t st = epd_xport_send(l->ep, m->data, m->len, m->flags);

            if (st == EPD_ERR_NO_RESOURCE) {
                break;
            }
            if (st != EPD_OK) {
                epd__link_fail(l, st);
                break;
            }
            l->out_head = m->next;
            if (l->out_head == NULL) {
                l->out_tail = NULL;
            }
            l->n_out--;
            d->n_out--;
            d->out_bytes -= m->len;
            epd_free(m);
        }
        if (l->out_head != NULL && epd_link_usable(l)) {
            l->on_flush = 1;
            l->flush_next = d->flush_head;
            d->flush_head = l;
        }
        l = next;
    }
    if (d->flush_head == NULL && d->flush_on) {
        d->flush_on = 0;
        uv_check_stop(&d->flush);
    }
}

void epd__link_on_flush(uv_check_t *check)
{
    epd__link_flush_all(check->data);
}

/* ------------------------------------------------------------------ reaping */

void epd__link_reap(epd_daemon_t *d)
{
    epd_link_t *l = d->links;

    d->links_dirty = 0;
    while (l != NULL) {
        epd_link_t *next = l->next;

        if (l->down || l->closed) {
            epd_link_close_ep(l);
            if (l->refs == 1) {
                epd_link_free(l); /* only the list held it */
            }
        }
        l = next;
    }
}

void epd__link_close_all(epd_daemon_t *d)
{
    for (epd_link_t *l = d->links; l != NULL; l = l->next) {
        epd_link_drop_out(l);
        if (!l->down && !l->closed) {
            l->closed = 1;
            l->status = EPD_ERR_CANCELED;
        }
        epd_link_close_ep(l);
    }
}

void epd__link_free_all(epd_daemon_t *d)
{
    while (d->links != NULL) {
        epd_link_free(d->links);
    }
}
