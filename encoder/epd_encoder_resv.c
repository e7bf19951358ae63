/*
 * epd_encoder_resv.c — what an EmbedReservation must be for this encoder
 * to write into it (proto/README.md rule 17): exactly one image's
 * embeddings, inside the prefill worker's region, under a key that unpacks
 * on our link to that worker and covers the region.  A role part below the
 * request layer: it answers, it changes no request.
 */
#include <stdio.h>

#include "epd_encoder_int.h"

epd_status_t epd__encoder_resv_take(epd_encoder_srv_t *srv, epd_peer_t *peer,
                                    const Epd__EmbedReservation *r, epd_xport_rkey_t **rkey_p,
                                    int *shared_p, char *msg, size_t cap)
{
    epd_xport_rkey_t *rkey;
    epd_status_t st;
    int shared;

    if (r->bytes != srv->slot_bytes) {
        snprintf(msg, cap,
                 "reservation refused: %llu bytes, an image's embeddings are %zu (%u x %u f32)",
                 (unsigned long long)r->bytes, srv->slot_bytes, srv->info->image_embeddings,
                 srv->info->embed_dim);
        return EPD_ERR_INVALID_PARAM;
    }
    if (r->offset > r->region_size || r->bytes > r->region_size - r->offset) {
        snprintf(msg, cap,
                 "reservation refused: %llu bytes at offset %llu do not fit a region of %llu",
                 (unsigned long long)r->bytes, (unsigned long long)r->offset,
                 (unsigned long long)r->region_size);
        return EPD_ERR_OUT_OF_RANGE;
    }
    if (r->rkey.len == 0 || r->rkey.len > EPD_XPORT_RKEY_MAX) {
        snprintf(msg, cap, "reservation refused: remote key of %zu bytes", r->rkey.len);
        return EPD_ERR_BAD_RKEY;
    }
    if (!epd_peer_usable(peer)) {
        snprintf(msg, cap, "prefill worker is gone");
        return EPD_ERR_PEER_DEAD;
    }
    /* unpacked once per prefill incarnation (epd_peer_rkey) */
    st = epd_peer_rkey(peer, r->rkey.data, r->rkey.len, &rkey, &shared);
    if (st != EPD_OK) {
        snprintf(msg, cap, "reservation refused: remote key does not unpack (%s)",
                 epd_status_string(st));
        return st == EPD_ERR_BAD_RKEY ? st : EPD_ERR_PEER_DEAD;
    }
    if (epd_xport_rkey_size(rkey) < r->region_size) {
        snprintf(msg, cap, "reservation refused: region of %llu bytes, its key covers %zu",
                 (unsigned long long)r->region_size, epd_xport_rkey_size(rkey));
        if (!shared) {
            epd_xport_rkey_destroy(rkey);
        }
        return EPD_ERR_OUT_OF_RANGE;
    }
    *rkey_p = rkey;
    *shared_p = shared;
    return EPD_OK;
}
