/*
 * epd_xport_crypto.c — the handshake's cryptography: the per-frame tag, the
 * handshake transcript and keys, MAC_hello, the identity block.
 */
#include "epd_xport_core.h"

#include <assert.h>
#include <string.h>

#include <sodium.h>

/* MAC tag of a frame: Poly1305 over the 48-byte header (flags included, so
 * the tag's presence is covered too) and the payload, under a one-time key
 * that is the first ChaCha20 block of the direction's key with the frame's
 * sequence number as nonce — the way ChaCha20-Poly1305 authenticates its
 * associated data.  Each (direction key, sequence number) pair tags one
 * frame only: a send the backend refused is retried with the same number
 * but was never transmitted.  Chosen over keyed BLAKE2b for throughput:
 * about 3x on the kilobytes-to-megabytes messages of the request plane
 * (images travel on it), the same on the smallest. */
void epd__xport_frame_tag(const unsigned char key[EPD__XPORT_KEY_BYTES], const void *hdr,
                          const void *payload, size_t len, unsigned char tag[EPD__XPORT_TAG_BYTES])
{
    unsigned char nonce[crypto_stream_chacha20_ietf_NONCEBYTES] = {0};
    unsigned char otk[crypto_onetimeauth_poly1305_KEYBYTES];
    crypto_onetimeauth_poly1305_state st;
    epd__frame_t f;

    memcpy(&f, hdr, sizeof(f));
    memcpy(nonce + sizeof(nonce) - sizeof(f.seq), &f.seq, sizeof(f.seq));
    crypto_stream_chacha20_ietf(otk, sizeof(otk), nonce, key);
    crypto_onetimeauth_poly1305_init(&st, otk);
    crypto_onetimeauth_poly1305_update(&st, hdr, sizeof(epd__frame_t));
    if (len > 0) {
        crypto_onetimeauth_poly1305_update(&st, payload, len);
    }
    crypto_onetimeauth_poly1305_final(&st, tag);
    sodium_memzero(otk, sizeof(otk));
}

_Static_assert(crypto_onetimeauth_poly1305_BYTES == EPD__XPORT_TAG_BYTES, "a Poly1305 tag");
_Static_assert(crypto_stream_chacha20_ietf_KEYBYTES == EPD__XPORT_KEY_BYTES, "a ChaCha20 key");

/* H1: the HELLO as it travelled (header and payload). */
void epd__xport_hs_h1(const void *hdr, const void *payload, size_t len,
                      unsigned char h1[EPD__XPORT_KEY_BYTES])
{
    crypto_generichash_state st;

    crypto_generichash_init(&st, NULL, 0, EPD__XPORT_KEY_BYTES);
    crypto_generichash_update(&st, hdr, sizeof(epd__frame_t));
    crypto_generichash_update(&st, payload, len);
    crypto_generichash_final(&st, h1, EPD__XPORT_KEY_BYTES);
}

/* T: the transcript — H1, then the HELLO_ACK's header, identity block and
 * process block (when it carries one: its header's flags say so). */
void epd__xport_hs_transcript(const unsigned char h1[EPD__XPORT_KEY_BYTES], const void *ack_hdr,
                              const epd__hello_ext_t *ack_ext, const epd__hello_proc_t *ack_proc,
                              unsigned char t[EPD__XPORT_KEY_BYTES])
{
    static const char dom[] = "epd-xport-hs-v1";
    crypto_generichash_state st;

    crypto_generichash_init(&st, NULL, 0, EPD__XPORT_KEY_BYTES);
    crypto_generichash_update(&st, (const unsigned char *)dom, sizeof(dom));
    crypto_generichash_update(&st, h1, EPD__XPORT_KEY_BYTES);
    crypto_generichash_update(&st, ack_hdr, sizeof(epd__frame_t));
    crypto_generichash_update(&st, (const unsigned char *)ack_ext, sizeof(*ack_ext));
    if (ack_proc != NULL) {
        crypto_generichash_update(&st, (const unsigned char *)ack_proc, sizeof(*ack_proc));
    }
    crypto_generichash_final(&st, t, EPD__XPORT_KEY_BYTES);
}

/* BLAKE2b-256 keyed with the handshake key K over label || T: the MACs of
 * the handshake and the two direction keys. */
void epd__xport_hs_derive(const epd_xport_t *x, const char label[4],
                          const unsigned char t[EPD__XPORT_KEY_BYTES],
                          unsigned char out[EPD__XPORT_KEY_BYTES])
{
    crypto_generichash_state st;

    crypto_generichash_init(&st, x->hs_key, EPD__XPORT_KEY_BYTES, EPD__XPORT_KEY_BYTES);
    crypto_generichash_update(&st, (const unsigned char *)label, 4);
    crypto_generichash_update(&st, t, EPD__XPORT_KEY_BYTES);
    crypto_generichash_final(&st, out, EPD__XPORT_KEY_BYTES);
}

/* MAC_hello: BLAKE2b-256 keyed with K over "hel" || the HELLO's header and
 * its payload up to this MAC.  Not a proof of freshness (a recorded HELLO
 * replays; its handshake then fails at HELLO_FIN): it lets an acceptor
 * refuse a HELLO from outside the cluster before it hands the address blob
 * in it to the library — UCX trusts address bytes and aborts on crafted
 * ones (found by fuzz_epd_xport_ucx_keys), and a blob's checksum stops
 * corruption, not an attacker. */
void epd__xport_hello_mac(const epd_xport_t *x, const void *hdr, const void *payload, size_t len,
                          unsigned char out[EPD__XPORT_KEY_BYTES])
{
    crypto_generichash_state st;

    crypto_generichash_init(&st, x->hs_key, EPD__XPORT_KEY_BYTES, EPD__XPORT_KEY_BYTES);
    crypto_generichash_update(&st, (const unsigned char *)"hel", 4);
    crypto_generichash_update(&st, hdr, sizeof(epd__frame_t));
    crypto_generichash_update(&st, payload, len);
    crypto_generichash_final(&st, out, EPD__XPORT_KEY_BYTES);
}

/* An identity block's worker id is NUL-terminated printable ASCII without
 * spaces: it ends up in logs and in the daemon's comparisons. */
bool epd__xport_worker_id_ok(const char *id, size_t cap)
{
    const char *end = memchr(id, '\0', cap);

    if (end == NULL) {
        return false;
    }
    for (const char *p = id; p < end; p++) {
        if (*p < 0x21 || *p > 0x7e) {
            return false;
        }
    }
    return true;
}

void epd__xport_ext_fill(const epd_xport_t *x, const unsigned char nonce[EPD__XPORT_NONCE_BYTES],
                         epd__hello_ext_t *ext)
{
    memset(ext, 0, sizeof(*ext));
    memcpy(ext->worker_id, x->cfg.identity.worker_id, sizeof(ext->worker_id));
    ext->role = x->cfg.identity.role;
    ext->epoch_start_ns = x->cfg.identity.epoch.start_time_ns;
    ext->epoch_nonce = x->cfg.identity.epoch.nonce;
    memcpy(ext->nonce, nonce, EPD__XPORT_NONCE_BYTES);
}

void epd__xport_ext_to_ident(const epd__hello_ext_t *ext, epd_xport_identity_t *id)
{
    memset(id, 0, sizeof(*id));
    memcpy(id->worker_id, ext->worker_id, sizeof(id->worker_id));
    id->worker_id[EPD_XPORT_WORKER_ID_MAX] = '\0';
    id->role = ext->role;
    id->epoch.start_time_ns = ext->epoch_start_ns;
    id->epoch.nonce = ext->epoch_nonce;
}
