/*
 * epd_xport_recv.c — the receive path: every frame a backend delivers is
 * checked (length, magic, version, type, routing, sequence, tag) and
 * dispatched.
 */
#include "epd_xport_core.h"

#include <string.h>

#include <sodium.h>

#include "epd_log.h"
#include "epd_time.h"

void epd__xport_deliver(epd_xport_t *x, const void *data, size_t len)
{
    if (x->hook != NULL && x->hook->deliver(x->hook_ip, data, len)) {
        return;
    }
    epd__xport_deliver_now(x, data, len);
}

void epd__xport_deliver_now(epd_xport_t *x, const void *data, size_t len)
{
    const unsigned char *bytes = data;
    const unsigned char *payload;
    size_t hdr_len;
    epd__frame_t f;
    epd_xport_ep_t *ep;

    if (x->tap != NULL) {
        x->tap(x->tap_arg, data, len);
    }
    if (len < sizeof(f)) {
        EPD__DROP(x, "dropping a %zu-byte message: shorter than a frame header", len);
        return;
    }
    memcpy(&f, bytes, sizeof(f));
    if (f.magic != EPD__XPORT_MAGIC || f.version != EPD__XPORT_VERSION) {
        EPD__DROP(x, "dropping a message with bad magic/version %08x/%u", f.magic, f.version);
        return;
    }
    hdr_len = sizeof(f) + ((f.flags & EPD__FRAME_F_MAC) != 0 ? EPD__XPORT_TAG_BYTES : 0);
    if (len < hdr_len || (size_t)f.len != len - hdr_len) {
        EPD__DROP(x, "dropping a frame of type %u: header says %u payload bytes, got %zu", f.type,
                  f.len, len - (len < hdr_len ? len : hdr_len));
        return;
    }
    payload = bytes + hdr_len;
    epd__xport_enter(x);
    if (f.type == EPD__FRAME_HELLO || f.type == EPD__FRAME_HELLO_ACK ||
        f.type == EPD__FRAME_HELLO_FIN) {
        if ((f.flags & EPD__FRAME_F_MAC) != 0) {
            EPD__DROP(x, "dropping a handshake frame with a MAC tag from %016llx",
                      (unsigned long long)f.sender_id);
            goto out;
        }
        if (f.type == EPD__FRAME_HELLO) {
            epd__xport_on_hello(x, &f, payload);
            goto out;
        }
    }
    ep = epd__xport_ep_lookup(x, f.dst_cookie);
    if (ep == NULL || (ep->state != EPD__EP_CONNECTING && ep->state != EPD__EP_ACCEPTING &&
                       ep->state != EPD__EP_CONNECTED)) {
        x->stats.frames_dropped++;
        if (f.type == EPD__FRAME_MSG) {
            EPD__LOG_LIMITED(x, "dropping a message from %016llx: no such endpoint",
                             (unsigned long long)f.sender_id);
        } else {
            /* keepalives, acks and byes for an endpoint closed here are
             * expected until the peer notices */
            epd_log_debug(EPD__XPORT_COMP, 0,
                          "dropping a frame of type %u from %016llx: no such endpoint", f.type,
                          (unsigned long long)f.sender_id);
        }
        goto out;
    }
    if (f.type == EPD__FRAME_HELLO_ACK) {
        epd__xport_on_ack(x, ep, &f, payload);
        goto out;
    }
    if (f.type == EPD__FRAME_HELLO_FIN) {
        epd__xport_on_fin(x, ep, &f, payload);
        goto out;
    }
    if (ep->state != EPD__EP_CONNECTED || ep->peer_id != f.sender_id ||
        ep->remote_cookie != f.src_cookie) {
        EPD__DROP(x, "dropping a frame of type %u from %016llx: %s", f.type,
                  (unsigned long long)f.sender_id, epd_status_string(EPD_ERR_STALE_EPOCH));
        goto out;
    }
    if (ep->authed) {
        unsigned char tag[EPD__XPORT_TAG_BYTES];
        bool has_tag = (f.flags & EPD__FRAME_F_MAC) != 0;

        if (has_tag) {
            epd__xport_frame_tag(ep->rx_key, bytes, payload, f.len, tag);
        }
        if (!has_tag || crypto_verify_16(tag, bytes + sizeof(f)) != 0) {
            /* from the peer's worker id and to this endpoint, yet not under
             * the connection's key: forged, or tampered with on the way */
            x->stats.frames_forged++;
            EPD__LOG_LIMITED_ERR(x,
                                 "frame #%llu of type %u from peer %016llx (worker '%s') %s: "
                                 "failing the endpoint",
                                 (unsigned long long)f.seq, f.type, (unsigned long long)f.sender_id,
                                 epd__xport_ep_who(ep),
                                 has_tag ? "fails its MAC" : "carries no MAC");
            epd__xport_ep_fail(ep, EPD_ERR_AUTH);
            goto out;
        }
    } else if ((f.flags & EPD__FRAME_F_MAC) != 0) {
        EPD__DROP(x, "dropping a frame with a MAC tag from %016llx: endpoint not authenticated",
                  (unsigned long long)f.sender_id);
        goto out;
    }
    if (f.seq != ep->rx_seq + 1) {
        epd_log_error(EPD__XPORT_COMP, 0,
                      "frame from peer %016llx out of order: got #%llu, expected #%llu",
                      (unsigned long long)f.sender_id, (unsigned long long)f.seq,
                      (unsigned long long)(ep->rx_seq + 1));
        epd__xport_ep_fail(ep, EPD_ERR_TRANSPORT);
        goto out;
    }
    ep->rx_seq = f.seq;
    ep->last_rx_ns = epd_time_now_ns();
    switch (f.type) {
    case EPD__FRAME_MSG:
        if (f.len == 0 || f.len > x->cfg.max_msg_size) {
            EPD__DROP(x, "dropping a %u-byte message from %016llx: limit is %zu", f.len,
                      (unsigned long long)f.sender_id, x->cfg.max_msg_size);
            break;
        }
        x->cfg.msg_cb(x->cfg.cb_arg, ep, payload, f.len);
        break;
    case EPD__FRAME_KEEPALIVE:
        break;
    case EPD__FRAME_BYE:
        epd_log_debug(EPD__XPORT_COMP, 0, "peer %016llx closed the endpoint",
                      (unsigned long long)f.sender_id);
        epd__xport_ep_fail(ep, EPD_ERR_CONNECTION_RESET);
        break;
    default:
        EPD__DROP(x, "dropping a frame of unknown type %u from %016llx", f.type,
                  (unsigned long long)f.sender_id);
        break;
    }
out:
    epd__xport_leave(x);
}
