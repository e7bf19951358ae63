/*
 * epd_rpc_auth.c — the control plane's authentication (the x-epd-auth
 * metadata; the scheme and why it is a MAC are at the top of epd_rpc.h):
 * the key, the MAC, signing a call, and the server's check with its replay
 * cache.  No gRPC here: the server (epd_rpc.c) and the client
 * (epd_rpc_client.c) hand it method, body and metadata value.
 *
 * Replay cache: open addressing (linear probing, SipHash of the nonce under
 * a random key, load <= 1/2), each slot a nonce and the unix ms after
 * which its call fails the clock check anyway (time + window).  Expired
 * slots are swept (backward-shift deletion, no tombstones) only when the
 * cache is full, at most once a second; still full, the call is refused.
 */
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_bytes.h"
#include "epd_rpc.h"
#include "epd_rpc_int.h"
#include "epd_time.h"

#define EPD_RPC_AUTH_NONCE_BYTES 16
#define EPD_RPC_AUTH_MAC_BYTES 32
#define EPD_RPC_AUTH_SWEEP_MS 1000 /* a full cache is swept at most this often */

typedef struct {
    uint64_t expire_ms; /* unix ms; 0: empty slot */
    unsigned char nonce[EPD_RPC_AUTH_NONCE_BYTES];
} epd__rpc_nonce_t;

struct epd_rpc_auth {
    unsigned char key[crypto_generichash_BYTES]; /* K; wiped at destroy */
    unsigned char hkey[crypto_shorthash_KEYBYTES];
    epd__rpc_nonce_t *slots; /* [mask + 1]; NULL: no replay cache */
    size_t mask;
    uint32_t count; /* slots in use (expired ones until swept) */
    uint32_t max;
    uint64_t next_sweep_ms;
};

epd_status_t epd_rpc_auth_create(const void *secret, size_t secret_len, uint32_t max_nonces,
                                 epd_rpc_auth_t **auth_p)
{
    /* 16 bytes, zero padded: the transport's HELLO key is "epd-xport-v1" */
    static const unsigned char personal[crypto_generichash_blake2b_PERSONALBYTES] = "epd-rpc-v1";
    epd_rpc_auth_t *a;

    if (secret == NULL || secret_len < EPD_RPC_SECRET_MIN || secret_len > EPD_RPC_SECRET_MAX ||
        max_nonces > (1u << 30)) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (sodium_init() < 0) {
        return EPD_ERR_FATAL;
    }
    a = epd_calloc(1, sizeof(*a));
    if (a == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    if (max_nonces > 0) {
        size_t slots = 2;

        while (slots < 2 * (size_t)max_nonces) {
            slots <<= 1;
        }
        a->slots = epd_calloc(slots, sizeof(*a->slots));
        if (a->slots == NULL) {
            epd_free(a);
            return EPD_ERR_NO_MEMORY;
        }
        a->mask = slots - 1;
        a->max = max_nonces;
        randombytes_buf(a->hkey, sizeof(a->hkey));
    }
    crypto_generichash_blake2b_salt_personal(a->key, sizeof(a->key), secret, secret_len, NULL, 0,
                                             NULL, personal);
    *auth_p = a;
    return EPD_OK;
}

void epd_rpc_auth_destroy(epd_rpc_auth_t *a)
{
    if (a == NULL) {
        return;
    }
    sodium_memzero(a->key, sizeof(a->key));
    epd_free(a->slots);
    epd_free(a);
}

uint32_t epd_rpc_auth_nonces(const epd_rpc_auth_t *a)
{
    return a->count;
}

static void epd_rpc_auth_mac(const epd_rpc_auth_t *a, const char *method, const void *body,
                             size_t body_len, uint64_t time_ms, const unsigned char *nonce,
                             unsigned char mac[EPD_RPC_AUTH_MAC_BYTES])
{
    crypto_generichash_state st;
    size_t mlen = strlen(method);
    unsigned char version = 1;
    unsigned char n4[4], n8[8];

    crypto_generichash_init(&st, a->key, sizeof(a->key), EPD_RPC_AUTH_MAC_BYTES);
    crypto_generichash_update(&st, &version, 1);
    epd_le_put(n4, mlen, 4);
    crypto_generichash_update(&st, n4, 4);
    crypto_generichash_update(&st, (const unsigned char *)method, mlen);
    epd_le_put(n8, body_len, 8);
    crypto_generichash_update(&st, n8, 8);
    if (body_len > 0) {
        crypto_generichash_update(&st, body, body_len);
    }
    epd_le_put(n8, time_ms, 8);
    crypto_generichash_update(&st, n8, 8);
    crypto_generichash_update(&st, nonce, EPD_RPC_AUTH_NONCE_BYTES);
    crypto_generichash_final(&st, mac, EPD_RPC_AUTH_MAC_BYTES);
}

epd_status_t epd_rpc_auth_sign(const epd_rpc_auth_t *a, const char *method, const void *body,
                               size_t body_len, uint64_t now_ms, char *value, size_t cap)
{
    unsigned char nonce[EPD_RPC_AUTH_NONCE_BYTES];
    unsigned char mac[EPD_RPC_AUTH_MAC_BYTES];
    int n;

    if (cap < EPD_RPC_AUTH_VALUE_MAX) {
        return EPD_ERR_TOO_LONG;
    }
    randombytes_buf(nonce, sizeof(nonce));
    epd_rpc_auth_mac(a, method, body, body_len, now_ms, nonce, mac);
    n = snprintf(value, cap, "v1:%llu:", (unsigned long long)now_ms);
    epd_hex_encode(value + n, nonce, sizeof(nonce));
    n += 2 * (int)sizeof(nonce);
    value[n++] = ':';
    epd_hex_encode(value + n, mac, sizeof(mac));
    n += 2 * (int)sizeof(mac);
    value[n] = '\0';
    return EPD_OK;
}

/* Parses "v1:<ms>:<32 hex>:<64 hex>" exactly; 0 when well formed. */
static int epd_rpc_auth_parse(const char *v, size_t len, uint64_t *time_p,
                              unsigned char nonce[EPD_RPC_AUTH_NONCE_BYTES],
                              unsigned char mac[EPD_RPC_AUTH_MAC_BYTES])
{
    uint64_t t = 0;
    size_t i = 3, digits;

    if (len < 3 || memcmp(v, "v1:", 3) != 0) {
        return -1;
    }
    for (digits = 0; i < len && v[i] >= '0' && v[i] <= '9'; i++, digits++) {
        unsigned d = (unsigned)(v[i] - '0');

        if (t > (UINT64_MAX - d) / 10) {
            return -1;
        }
        t = t * 10 + d;
    }
    /* no leading zero: one spelling per time */
    if (digits == 0 || (digits > 1 && v[3] == '0')) {
        return -1;
    }
    if (len - i != 1 + 2 * EPD_RPC_AUTH_NONCE_BYTES + 1 + 2 * EPD_RPC_AUTH_MAC_BYTES ||
        v[i] != ':' || v[i + 1 + 2 * EPD_RPC_AUTH_NONCE_BYTES] != ':') {
        return -1;
    }
    if (epd_hex_decode(nonce, v + i + 1, EPD_RPC_AUTH_NONCE_BYTES) != 0 ||
        epd_hex_decode(mac, v + i + 2 + 2 * EPD_RPC_AUTH_NONCE_BYTES, EPD_RPC_AUTH_MAC_BYTES) !=
            0) {
        return -1;
    }
    *time_p = t;
    return 0;
}

static size_t epd_rpc_nonce_home(const epd_rpc_auth_t *a, const unsigned char *nonce)
{
    unsigned char h[crypto_shorthash_BYTES];

    crypto_shorthash(h, nonce, EPD_RPC_AUTH_NONCE_BYTES, a->hkey);
    return (size_t)epd_le_get(h, 8) & a->mask;
}

/* Empties slot i and moves later members of its probe run back (Knuth's
 * algorithm R): lookups never need tombstones. */
static void epd_rpc_nonce_delete(epd_rpc_auth_t *a, size_t i)
{
    size_t j = i;

    for (;;) {
        size_t k;

        j = (j + 1) & a->mask;
        if (a->slots[j].expire_ms == 0) {
            break;
        }
        k = epd_rpc_nonce_home(a, a->slots[j].nonce);
        /* j stays when its home k lies cyclically in (i, j] */
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j)) {
            continue;
        }
        a->slots[i] = a->slots[j];
        i = j;
    }
    a->slots[i].expire_ms = 0;
    a->count--;
}

/* Forgets every nonce whose call would now fail the clock check.  A slot
 * filled by a shift is looked at again (i is not advanced). */
static void epd_rpc_nonce_sweep(epd_rpc_auth_t *a, uint64_t now_ms)
{
    size_t i = 0;

    while (i <= a->mask) {
        if (a->slots[i].expire_ms != 0 && a->slots[i].expire_ms < now_ms) {
            epd_rpc_nonce_delete(a, i);
        } else {
            i++;
        }
    }
}

static uint64_t epd_rpc_add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

epd_status_t epd_rpc_auth_check(epd_rpc_auth_t *a, const char *method, const void *body,
                                size_t body_len, const char *value, size_t value_len,
                                uint64_t now_ms, const char **why_p)
{
    unsigned char nonce[EPD_RPC_AUTH_NONCE_BYTES];
    unsigned char mac[EPD_RPC_AUTH_MAC_BYTES], want[EPD_RPC_AUTH_MAC_BYTES];
    uint64_t t;
    size_t i;

    if (value == NULL) {
        *why_p = "no " EPD_RPC_AUTH_KEY " metadata: the cluster secret is required";
        return EPD_ERR_AUTH;
    }
    if (epd_rpc_auth_parse(value, value_len, &t, nonce, mac) != 0) {
        *why_p = "malformed " EPD_RPC_AUTH_KEY " metadata";
        return EPD_ERR_AUTH;
    }
    /* saturated sums: no time, however absurd, wraps around */
    if (t > epd_rpc_add_sat(now_ms, EPD_RPC_AUTH_WINDOW_MS) ||
        epd_rpc_add_sat(t, EPD_RPC_AUTH_WINDOW_MS) < now_ms) {
        *why_p = "call time outside the +-30 s window (clocks differ, or a replay)";
        return EPD_ERR_AUTH;
    }
    epd_rpc_auth_mac(a, method, body, body_len, t, nonce, want);
    if (crypto_verify_32(mac, want) != 0) {
        *why_p = "MAC does not verify (another cluster secret, or altered)";
        return EPD_ERR_AUTH;
    }
    if (a->slots == NULL) {
        return EPD_OK;
    }
    for (i = epd_rpc_nonce_home(a, nonce); a->slots[i].expire_ms != 0; i = (i + 1) & a->mask) {
        if (memcmp(a->slots[i].nonce, nonce, sizeof(nonce)) == 0) {
            *why_p = "replayed call (nonce already seen)";
            return EPD_ERR_AUTH;
        }
    }
    if (a->count >= a->max) {
        /* (a clock stepped back more than that sweeps at once) */
        if (now_ms < a->next_sweep_ms && a->next_sweep_ms - now_ms <= EPD_RPC_AUTH_SWEEP_MS) {
            *why_p = "replay cache full";
            return EPD_ERR_NO_RESOURCE;
        }
        a->next_sweep_ms = epd_rpc_add_sat(now_ms, EPD_RPC_AUTH_SWEEP_MS);
        epd_rpc_nonce_sweep(a, now_ms);
        if (a->count >= a->max) {
            *why_p = "replay cache full";
            return EPD_ERR_NO_RESOURCE;
        }
        /* the sweep moved slots: find the free one again */
        for (i = epd_rpc_nonce_home(a, nonce); a->slots[i].expire_ms != 0; i = (i + 1) & a->mask) {
        }
    }
    memcpy(a->slots[i].nonce, nonce, sizeof(nonce));
    a->slots[i].expire_ms = epd_rpc_add_sat(t, EPD_RPC_AUTH_WINDOW_MS); /* never 0 */
    a->count++;
    return EPD_OK;
}

uint64_t epd__rpc_now_ms(void)
{
    return epd_time_wall_ns() / EPD_NSEC_PER_MSEC;
}
