/*
 * epd_xport_frame.c — the frame codec: building and sending a frame header
 * (with its tag on an authenticated endpoint), recognising a MSG frame.
 */
#include "epd_xport_core.h"

#include <string.h>

#include "epd_time.h"

/* Fills the header of the next frame on `ep`. */
void epd__xport_frame_hdr(const epd_xport_ep_t *ep, int type, int32_t status, unsigned flags,
                          size_t len, epd__frame_t *f)
{
    memset(f, 0, sizeof(*f));
    f->magic = EPD__XPORT_MAGIC;
    f->version = EPD__XPORT_VERSION;
    f->type = (uint8_t)type;
    f->flags = (uint8_t)flags;
    f->len = (uint32_t)len;
    f->status = status;
    f->sender_id = ep->x->id;
    f->src_cookie = ep->cookie;
    f->dst_cookie = ep->remote_cookie;
    f->seq = ep->tx_seq + 1;
}

/* Sends a frame whose header `f` came from epd__xport_frame_hdr; on an
 * authenticated endpoint a tag goes between header and payload.  Updates
 * sequence and tx time only when the backend accepted it. */
epd_status_t epd__xport_frame_send_hdr(epd_xport_ep_t *ep, epd__frame_t *f, const void *payload,
                                       size_t len)
{
    epd_xport_t *x = ep->x;
    struct {
        epd__frame_t f;
        unsigned char tag[EPD__XPORT_TAG_BYTES];
    } w;
    size_t hdr_len = sizeof(w.f);
    epd_status_t st;

    if (ep->authed) {
        f->flags |= EPD__FRAME_F_MAC;
        w.f = *f;
        epd__xport_frame_tag(ep->tx_key, &w.f, payload, len, w.tag);
        hdr_len = sizeof(w);
    } else {
        w.f = *f;
    }
    st = x->ops->send(ep->be_ep, &w, hdr_len, payload, len);
    if (st == EPD_OK) {
        ep->tx_seq++;
        ep->last_tx_ns = epd_time_now_ns();
    }
    return st;
}

/* Sends one frame on the backend endpoint; updates sequence and tx time only
 * when the backend accepted it. */
epd_status_t epd__xport_frame_send(epd_xport_ep_t *ep, int type, int32_t status,
                                   const void *payload, size_t len)
{
    epd__frame_t f;

    epd__xport_frame_hdr(ep, type, status, 0, len, &f);
    return epd__xport_frame_send_hdr(ep, &f, payload, len);
}

int epd__xport_frame_is_msg(const void *data, size_t len, size_t *payload_off_p)
{
    epd__frame_t f;
    size_t hdr_len;

    if (len < sizeof(f)) {
        return 0;
    }
    memcpy(&f, data, sizeof(f));
    hdr_len = sizeof(f) + ((f.flags & EPD__FRAME_F_MAC) != 0 ? EPD__XPORT_TAG_BYTES : 0);
    if (f.magic != EPD__XPORT_MAGIC || f.version != EPD__XPORT_VERSION ||
        f.type != EPD__FRAME_MSG || len < hdr_len || (size_t)f.len != len - hdr_len) {
        return 0;
    }
    *payload_off_p = hdr_len;
    return 1;
}
