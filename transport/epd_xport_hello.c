/*
 * epd_xport_hello.c — the handshake: HELLO, HELLO_ACK and HELLO_FIN, sent and
 * received (the cryptography is in epd_xport_crypto.c).
 */
#include "epd_xport_core.h"

#include <string.h>

#include <sodium.h>

#include "epd_log.h"
#include "epd_time.h"

/* Refuses a HELLO with `why` from the endpoint made to answer it, then
 * closes that endpoint (the user never sees it). */
static void epd__hello_refuse(epd_xport_ep_t *ep, epd_status_t why)
{
    (void)epd__xport_frame_send(ep, EPD__FRAME_HELLO_ACK, why, NULL, 0);
    ep->state = EPD__EP_FAILED;
    ep->fail_status = why;
    epd_xport_ep_close(ep);
}

/* Sends our HELLO on a connecting endpoint: the address blob, behind an
 * identity block (with ep->nonce) when we present an identity or
 * authenticate.  Authenticating, H1 goes to ep->hs_hash.  A retry sends the
 * same bytes (same nonce, same sequence number). */
epd_status_t epd__xport_hello_send(epd_xport_ep_t *ep)
{
    epd_xport_t *x = ep->x;
    unsigned char buf[sizeof(epd__hello_ext_t) + sizeof(epd__hello_proc_t) + EPD_XPORT_ADDR_MAX +
                      EPD__XPORT_KEY_BYTES];
    size_t len, pre;
    epd__hello_ext_t ext;
    const void *own;
    size_t own_len;
    epd__frame_t f;
    epd_status_t st;

    st = x->ops->address(x->be, &own, &own_len);
    if (st != EPD_OK) {
        return st;
    }
    if (!x->auth && !x->ident_set) {
        /* the HELLO of epd without authentication, unchanged */
        return epd__xport_frame_send(ep, EPD__FRAME_HELLO, 0, own, own_len);
    }
    if (own_len > EPD_XPORT_ADDR_MAX) {
        return EPD_ERR_BAD_ADDRESS;
    }
    epd__xport_ext_fill(x, ep->nonce, &ext);
    memcpy(buf, &ext, sizeof(ext));
    pre = sizeof(ext);
    if (x->proc_set) {
        memcpy(buf + pre, &x->proc, sizeof(x->proc));
        pre += sizeof(x->proc);
    }
    memcpy(buf + pre, own, own_len);
    len = pre + own_len + (x->auth ? EPD__XPORT_KEY_BYTES : 0);
    epd__xport_frame_hdr(ep, EPD__FRAME_HELLO, 0,
                         EPD__FRAME_F_EXT | (x->auth ? EPD__FRAME_F_AUTH : 0u) |
                             (x->proc_set ? EPD__FRAME_F_PROC : 0u),
                         len, &f);
    if (x->auth) {
        epd__xport_hello_mac(x, &f, buf, len - EPD__XPORT_KEY_BYTES,
                             buf + len - EPD__XPORT_KEY_BYTES);
        epd__xport_hs_h1(&f, buf, len, ep->hs_hash);
    }
    return epd__xport_frame_send_hdr(ep, &f, buf, len);
}

/* Sends the initiator's HELLO_FIN (MAC_fin, computed at the HELLO_ACK). */
epd_status_t epd__xport_fin_send(epd_xport_ep_t *ep)
{
    epd__frame_t f;

    epd__xport_frame_hdr(ep, EPD__FRAME_HELLO_FIN, 0, EPD__FRAME_F_AUTH, sizeof(ep->fin_mac), &f);
    return epd__xport_frame_send_hdr(ep, &f, ep->fin_mac, sizeof(ep->fin_mac));
}

/* The connector's side of the handshake is done: the endpoint is usable,
 * the connect callback runs, held messages go out. */
void epd__xport_ep_connected(epd_xport_ep_t *ep)
{
    epd_xport_t *x = ep->x;
    epd_xport_comp_cb_t cb;

    ep->state = EPD__EP_CONNECTED;
    ep->handshaken = true;
    ep->authed = x->auth;
    ep->hs_pending = 0;
    sodium_memzero(ep->nonce, sizeof(ep->nonce));
    sodium_memzero(ep->hs_hash, sizeof(ep->hs_hash));
    sodium_memzero(ep->fin_mac, sizeof(ep->fin_mac));
    epd_log_info(EPD__XPORT_COMP, 0, "connected to peer %016llx (worker '%s'%s): %s",
                 (unsigned long long)ep->peer_id, epd__xport_ep_who(ep),
                 ep->authed ? ", authenticated" : "", ep->desc);
    cb = ep->conn_cb;
    ep->conn_cb = NULL;
    if (cb != NULL) {
        cb(ep->conn_arg, EPD_OK);
    }
    if (ep->state == EPD__EP_CONNECTED && ep->held_head != NULL && !epd__xport_ep_pump(ep)) {
        epd__xport_pump_schedule(ep);
    }
}

void epd__xport_on_hello(epd_xport_t *x, const epd__frame_t *f, const unsigned char *payload)
{
    bool has_ext = (f->flags & EPD__FRAME_F_EXT) != 0;
    bool their_auth = (f->flags & EPD__FRAME_F_AUTH) != 0;
    bool their_proc = (f->flags & EPD__FRAME_F_PROC) != 0;
    size_t proc_len = their_proc ? sizeof(epd__hello_proc_t) : 0;
    const unsigned char *addr = payload;
    size_t addr_len = f->len;
    unsigned char h1[EPD__XPORT_KEY_BYTES];
    unsigned char pl[sizeof(epd__hello_ext_t) + sizeof(epd__hello_proc_t) + EPD__XPORT_KEY_BYTES];
    size_t pl_len;
    epd__hello_ext_t ext, mine;
    epd__hello_proc_t proc;
    epd__frame_t ack;
    epd_xport_ep_t *ep;
    const char *cls;
    epd_status_t st;

    if (f->seq != 1 || (f->flags & ~EPD__FRAME_F_HELLO) != 0 || (their_auth && !has_ext) ||
        (their_proc && !has_ext)) {
        EPD__DROP(x, "dropping a HELLO from %016llx: sequence %llu, flags %#x",
                  (unsigned long long)f->sender_id, (unsigned long long)f->seq, f->flags);
        return;
    }
    if (has_ext) {
        size_t tail = sizeof(ext) + proc_len + (their_auth ? EPD__XPORT_KEY_BYTES : 0);

        if (f->len <= tail) {
            EPD__DROP(x, "dropping a HELLO from %016llx: %u bytes, no room for an address",
                      (unsigned long long)f->sender_id, f->len);
            return;
        }
        memcpy(&ext, payload, sizeof(ext));
        if (their_proc) {
            memcpy(&proc, payload + sizeof(ext), sizeof(proc));
        }
        if (!epd__xport_worker_id_ok(ext.worker_id, sizeof(ext.worker_id)) || ext.reserved != 0 ||
            (their_proc && proc.reserved != 0)) {
            EPD__DROP(x, "dropping a HELLO from %016llx: malformed identity block",
                      (unsigned long long)f->sender_id);
            return;
        }
        addr = payload + sizeof(ext) + proc_len;
        addr_len = f->len - tail;
    }
    if (addr_len == 0 || addr_len > EPD_XPORT_ADDR_MAX) {
        EPD__DROP(x, "dropping HELLO from %016llx: bad address length %zu",
                  (unsigned long long)f->sender_id, addr_len);
        return;
    }
    for (ep = x->eps; ep != NULL; ep = ep->next) {
        if (ep->incoming && ep->peer_id == f->sender_id && ep->remote_cookie == f->src_cookie) {
            return; /* duplicate */
        }
    }
    if (x->auth) {
        /* Nothing of a HELLO that does not verify under our secret reaches
         * the library (see epd__xport_hello_mac): it is dropped unanswered, since
         * answering needs an endpoint made from its address.  Its sender's
         * connect times out; this side says why, here. */
        unsigned char mac[EPD__XPORT_KEY_BYTES];
        const char *who = has_ext ? ext.worker_id : "?";

        if (!their_auth) {
            x->stats.handshakes_refused++;
            EPD__LOG_LIMITED_ERR(x,
                                 "refusing peer %016llx (claims worker '%s'): its HELLO is not "
                                 "authenticated and this worker requires the cluster secret (is "
                                 "the secret configured there?); dropped unanswered",
                                 (unsigned long long)f->sender_id, who[0] != '\0' ? who : "?");
            return;
        }
        epd__xport_hello_mac(x, f, payload, f->len - EPD__XPORT_KEY_BYTES, mac);
        if (crypto_verify_32(mac, payload + f->len - EPD__XPORT_KEY_BYTES) != 0) {
            x->stats.handshakes_refused++;
            EPD__LOG_LIMITED_ERR(x,
                                 "refusing peer %016llx (claims worker '%s'): its HELLO does not "
                                 "verify under this worker's cluster secret (the secrets differ, "
                                 "or it is not a member); dropped unanswered",
                                 (unsigned long long)f->sender_id, who[0] != '\0' ? who : "?");
            return;
        }
        if (x->half_open >= EPD__XPORT_HALF_OPEN_MAX) {
            EPD__DROP(x, "dropping a HELLO from %016llx: %u handshakes already under way",
                      (unsigned long long)f->sender_id, x->half_open);
            return;
        }
    }
    st = epd__xport_ep_new(x, addr, addr_len, &ep);
    if (st != EPD_OK) {
        EPD__DROP(x, "refusing HELLO from %016llx: %s", (unsigned long long)f->sender_id,
                  epd_status_string(st));
        return;
    }
    ep->incoming = true;
    ep->peer_id = f->sender_id;
    ep->remote_cookie = f->src_cookie;
    ep->rx_seq = f->seq;
    if (has_ext) {
        ep->peer_presented = true;
        epd__xport_ext_to_ident(&ext, &ep->peer_ident);
        if (their_proc) {
            ep->peer_proc_known = true;
            ep->peer_proc = proc;
        }
    }
    cls = epd__xport_class_ok(ep);
    if (cls != NULL) {
        epd_log_error(EPD__XPORT_COMP, 0,
                      "refusing peer %016llx: expected transport class '%s' but %s chose '%s' (%s)",
                      (unsigned long long)f->sender_id, x->expect, x->ops->name, cls, ep->desc);
        epd__hello_refuse(ep, EPD_ERR_CONFIG);
        return;
    }
    if (!x->auth && their_auth) {
        /* without a secret every HELLO's address is used anyway (nothing to
         * check it with), so the refusal can be answered: the connector
         * learns at once that the two disagree */
        x->stats.handshakes_refused++;
        EPD__LOG_LIMITED_ERR(x,
                             "refusing peer %016llx (claims worker '%s'): it authenticates "
                             "with a cluster secret and this worker has none configured",
                             (unsigned long long)f->sender_id, epd__xport_ep_who(ep));
        epd__hello_refuse(ep, EPD_ERR_AUTH);
        return;
    }
    if (!x->auth) {
        ep->state = EPD__EP_CONNECTED;
        ep->handshaken = true;
        if (x->ident_set) {
            /* our identity back, claimed only (nothing proves it) */
            memset(ep->nonce, 0, sizeof(ep->nonce));
            epd__xport_ext_fill(x, ep->nonce, &mine);
            memcpy(pl, &mine, sizeof(mine));
            pl_len = sizeof(mine);
            if (x->proc_set) {
                memcpy(pl + pl_len, &x->proc, sizeof(x->proc));
                pl_len += sizeof(x->proc);
            }
            epd__xport_frame_hdr(ep, EPD__FRAME_HELLO_ACK, EPD_OK,
                                 EPD__FRAME_F_EXT | (x->proc_set ? EPD__FRAME_F_PROC : 0u), pl_len,
                                 &ack);
            st = epd__xport_frame_send_hdr(ep, &ack, pl, pl_len);
        } else {
            st = epd__xport_frame_send(ep, EPD__FRAME_HELLO_ACK, EPD_OK, NULL, 0);
        }
        if (st != EPD_OK) {
            /* the backend is full right now: the peer retries nothing, so
             * give up on this endpoint; the connector times out and may try
             * again */
            EPD__LOG_LIMITED(x, "cannot answer HELLO from %016llx: %s",
                             (unsigned long long)f->sender_id, epd_status_string(st));
            epd_xport_ep_close(ep);
            return;
        }
        epd_log_info(EPD__XPORT_COMP, 0,
                     "accepted peer %016llx (worker '%s', not authenticated): %s",
                     (unsigned long long)f->sender_id, epd__xport_ep_who(ep), ep->desc);
        if (x->cfg.accept_cb != NULL) {
            x->cfg.accept_cb(x->cfg.cb_arg, ep);
        }
        return;
    }

    /* authenticated: answer with our identity, nonce and MAC_ack, then wait
     * (half-open, invisible to the user) for the initiator's proof */
    randombytes_buf(ep->nonce, sizeof(ep->nonce));
    epd__xport_ext_fill(x, ep->nonce, &mine);
    epd__xport_hs_h1(f, payload, f->len, h1);
    memcpy(pl, &mine, sizeof(mine));
    pl_len = sizeof(mine);
    if (x->proc_set) {
        memcpy(pl + pl_len, &x->proc, sizeof(x->proc));
        pl_len += sizeof(x->proc);
    }
    epd__xport_frame_hdr(ep, EPD__FRAME_HELLO_ACK, EPD_OK,
                         EPD__FRAME_F_EXT | EPD__FRAME_F_AUTH |
                             (x->proc_set ? EPD__FRAME_F_PROC : 0u),
                         pl_len + EPD__XPORT_KEY_BYTES, &ack);
    epd__xport_hs_transcript(h1, &ack, &mine, x->proc_set ? &x->proc : NULL, ep->hs_hash);
    epd__xport_hs_derive(x, "ack", ep->hs_hash, pl + pl_len);
    pl_len += EPD__XPORT_KEY_BYTES;
    ep->state = EPD__EP_ACCEPTING;
    x->half_open++;
    ep->deadline_ns = epd_time_now_ns() + (uint64_t)x->cfg.connect_timeout_ms * EPD_NSEC_PER_MSEC;
    st = epd__xport_frame_send_hdr(ep, &ack, pl, pl_len);
    if (st != EPD_OK) {
        EPD__LOG_LIMITED(x, "cannot answer HELLO from %016llx: %s",
                         (unsigned long long)f->sender_id, epd_status_string(st));
        epd_xport_ep_close(ep);
    }
}

void epd__xport_on_ack(epd_xport_t *x, epd_xport_ep_t *ep, const epd__frame_t *f,
                       const unsigned char *payload)
{
    bool has_ext = (f->flags & EPD__FRAME_F_EXT) != 0;
    bool their_auth = (f->flags & EPD__FRAME_F_AUTH) != 0;
    bool their_proc = (f->flags & EPD__FRAME_F_PROC) != 0;
    size_t proc_len = their_proc ? sizeof(epd__hello_proc_t) : 0;
    size_t want = 0;
    epd__hello_ext_t ext;
    epd__hello_proc_t proc;
    const char *cls;
    epd_status_t st;

    if (f->status == EPD_OK && has_ext) {
        want = sizeof(ext) + proc_len + (their_auth ? EPD__XPORT_KEY_BYTES : 0);
    }
    if (ep->state != EPD__EP_CONNECTING || ep->incoming || f->seq != 1 ||
        (f->flags & ~EPD__FRAME_F_HELLO) != 0 || (their_auth && !has_ext) ||
        (their_proc && !has_ext) || f->len != want || ep->hs_pending == EPD__FRAME_HELLO_FIN) {
        EPD__DROP(x, "dropping unexpected HELLO_ACK from %016llx",
                  (unsigned long long)f->sender_id);
        return;
    }
    if (has_ext) {
        memcpy(&ext, payload, sizeof(ext));
        if (their_proc) {
            memcpy(&proc, payload + sizeof(ext), sizeof(proc));
        }
        if (!epd__xport_worker_id_ok(ext.worker_id, sizeof(ext.worker_id)) || ext.reserved != 0 ||
            (their_proc && proc.reserved != 0)) {
            EPD__DROP(x, "dropping a HELLO_ACK from %016llx: malformed identity block",
                      (unsigned long long)f->sender_id);
            return;
        }
    }
    ep->peer_id = f->sender_id;
    ep->remote_cookie = f->src_cookie;
    ep->rx_seq = f->seq;
    if (has_ext) {
        ep->peer_presented = true;
        epd__xport_ext_to_ident(&ext, &ep->peer_ident);
        if (their_proc) {
            ep->peer_proc_known = true;
            ep->peer_proc = proc;
        }
    }
    if (f->status != EPD_OK) {
        st = f->status == EPD_ERR_CONFIG ? EPD_ERR_CONFIG
             : f->status == EPD_ERR_AUTH ? EPD_ERR_AUTH
                                         : EPD_ERR_UNREACHABLE;
        if (st == EPD_ERR_AUTH) {
            x->stats.handshakes_refused++;
            epd_log_error(EPD__XPORT_COMP, 0, "peer %016llx refused the connection: %s",
                          (unsigned long long)f->sender_id,
                          x->auth ? "it has no cluster secret configured, and this worker "
                                    "authenticates"
                                  : "it requires the cluster secret, which this worker does "
                                    "not have");
        } else {
            epd_log_error(EPD__XPORT_COMP, 0, "peer %016llx refused the connection: %s",
                          (unsigned long long)f->sender_id,
                          epd_status_string((epd_status_t)f->status));
        }
        epd__xport_ep_fail(ep, st);
        return;
    }
    if (x->auth != their_auth) {
        /* an answer against the protocol (a worker with a secret refuses a
         * HELLO without one, and the reverse): not who it should be */
        x->stats.handshakes_refused++;
        epd_log_error(EPD__XPORT_COMP, 0,
                      "peer %016llx (claims worker '%s') accepted the connection %s: not a "
                      "member of this cluster",
                      (unsigned long long)f->sender_id, epd__xport_ep_who(ep),
                      x->auth ? "without authenticating"
                              : "with authentication we did not ask for");
        if (x->auth) {
            (void)epd__xport_frame_send(ep, EPD__FRAME_HELLO_FIN, EPD_ERR_AUTH, NULL, 0);
        } else {
            (void)epd__xport_frame_send(ep, EPD__FRAME_BYE, 0, NULL, 0);
        }
        epd__xport_ep_fail(ep, EPD_ERR_AUTH);
        return;
    }
    if (x->auth) {
        unsigned char t[EPD__XPORT_KEY_BYTES], mac[EPD__XPORT_KEY_BYTES];

        epd__xport_hs_transcript(ep->hs_hash, f, &ext, their_proc ? &proc : NULL, t);
        epd__xport_hs_derive(x, "ack", t, mac);
        if (crypto_verify_32(mac, payload + sizeof(ext) + proc_len) != 0) {
            x->stats.handshakes_refused++;
            sodium_memzero(t, sizeof(t));
            epd_log_error(EPD__XPORT_COMP, 0,
                          "the HELLO_ACK of peer %016llx (claims worker '%s') does not verify "
                          "under this worker's cluster secret: the secrets differ, or it is not "
                          "a member",
                          (unsigned long long)f->sender_id, epd__xport_ep_who(ep));
            /* says so to the acceptor at once (it would wait out its deadline) */
            (void)epd__xport_frame_send(ep, EPD__FRAME_HELLO_FIN, EPD_ERR_AUTH, NULL, 0);
            epd__xport_ep_fail(ep, EPD_ERR_AUTH);
            return;
        }
        epd__xport_hs_derive(x, "fin", t, ep->fin_mac);
        epd__xport_hs_derive(x, "i2a", t, ep->tx_key);
        epd__xport_hs_derive(x, "a2i", t, ep->rx_key);
        sodium_memzero(t, sizeof(t));
    }
    cls = epd__xport_class_ok(ep);
    if (cls != NULL) {
        epd_log_error(
            EPD__XPORT_COMP, 0,
            "connect to peer %016llx refused: expected transport class '%s' but %s chose '%s' (%s)",
            (unsigned long long)f->sender_id, x->expect, x->ops->name, cls, ep->desc);
        if (x->auth) {
            (void)epd__xport_frame_send(ep, EPD__FRAME_HELLO_FIN, EPD_ERR_CONFIG, NULL, 0);
        } else {
            (void)epd__xport_frame_send(ep, EPD__FRAME_BYE, 0, NULL, 0);
        }
        epd__xport_ep_fail(ep, EPD_ERR_CONFIG);
        return;
    }
    if (x->auth) {
        st = epd__xport_fin_send(ep);
        if (st == EPD_ERR_NO_RESOURCE) {
            /* retried by the timers; messages stay held until it is out */
            ep->hs_pending = EPD__FRAME_HELLO_FIN;
            return;
        }
        if (st != EPD_OK) {
            epd__xport_ep_fail(ep, st);
            return;
        }
    }
    epd__xport_ep_connected(ep);
}

/* The initiator's proof (or its refusal of our HELLO_ACK) on a half-open
 * endpoint. */
void epd__xport_on_fin(epd_xport_t *x, epd_xport_ep_t *ep, const epd__frame_t *f,
                       const unsigned char *payload)
{
    unsigned char mac[EPD__XPORT_KEY_BYTES];

    if (ep->state != EPD__EP_ACCEPTING || f->seq != 2 || ep->peer_id != f->sender_id ||
        ep->remote_cookie != f->src_cookie) {
        EPD__DROP(x, "dropping unexpected HELLO_FIN from %016llx",
                  (unsigned long long)f->sender_id);
        return;
    }
    if (f->status != EPD_OK) {
        if (f->status == EPD_ERR_AUTH) {
            x->stats.handshakes_refused++;
        }
        EPD__LOG_LIMITED_ERR(
            x, "peer %016llx (claims worker '%s') refused our HELLO_ACK: %s",
            (unsigned long long)f->sender_id, epd__xport_ep_who(ep),
            f->status == EPD_ERR_AUTH
                ? "it does not verify under its cluster secret (the secrets differ)"
                : epd_status_string((epd_status_t)f->status));
        epd_xport_ep_close(ep);
        return;
    }
    if (f->flags != EPD__FRAME_F_AUTH || f->len != EPD__XPORT_KEY_BYTES) {
        EPD__DROP(x, "dropping a malformed HELLO_FIN from %016llx",
                  (unsigned long long)f->sender_id);
        return;
    }
    epd__xport_hs_derive(x, "fin", ep->hs_hash, mac);
    if (crypto_verify_32(mac, payload) != 0) {
        x->stats.handshakes_refused++;
        EPD__LOG_LIMITED_ERR(x,
                             "the HELLO_FIN of peer %016llx (claims worker '%s') does not verify "
                             "under this worker's cluster secret: not a member (or forged); "
                             "endpoint closed",
                             (unsigned long long)f->sender_id, epd__xport_ep_who(ep));
        epd_xport_ep_close(ep);
        return;
    }
    epd__xport_hs_derive(x, "a2i", ep->hs_hash, ep->tx_key);
    epd__xport_hs_derive(x, "i2a", ep->hs_hash, ep->rx_key);
    sodium_memzero(ep->hs_hash, sizeof(ep->hs_hash));
    sodium_memzero(ep->nonce, sizeof(ep->nonce));
    x->half_open--;
    ep->rx_seq = f->seq;
    ep->last_rx_ns = epd_time_now_ns();
    ep->state = EPD__EP_CONNECTED;
    ep->handshaken = true;
    ep->authed = true;
    epd_log_info(EPD__XPORT_COMP, 0,
                 "accepted peer %016llx (worker '%s', role %d, authenticated): %s",
                 (unsigned long long)f->sender_id, epd__xport_ep_who(ep), (int)ep->peer_ident.role,
                 ep->desc);
    if (x->cfg.accept_cb != NULL) {
        x->cfg.accept_cb(x->cfg.cb_arg, ep);
    }
}
