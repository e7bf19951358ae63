/*
 * libFuzzer target for the UCX backend's address blobs and packed keys
 * (transport/ucx/epd_xport_ucx_ep.c, _mr.c: epd__ucx_ep_create,
 * epd__ucx_rkey_unpack) through the core's epd_xport_connect /
 * epd_xport_rkey_unpack.  The body is epd_fuzz_xport_keys.h; here the UCX
 * envelope of an address blob.  Runs with UCX_TLS=tcp,self on lo unless
 * UCX_TLS is set.  `make fuzz`.
 */
#if EPD_WITH_UCX

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "epd_hash.h"

#define EPD_FUZZ_BACKEND "ucx"
#define EPD_FUZZ_ENV()                                                                             \
    do {                                                                                           \
        setenv("UCX_TLS", "tcp,self", 0);                                                          \
        setenv("UCX_NET_DEVICES", "lo", 0);                                                        \
    } while (0)

#include "epd_fuzz_xport_keys.h"

/* transport/ucx's address envelope (version 1): what anyone can compute */
typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t reserved;
    uint32_t ucx_len;
    uint32_t reserved2;
    uint64_t hash;
} epd_fuzz_ucx_addr_t;

/* transport/ucx's packed key envelope (version 1) */
typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t ucx_len;
    uint64_t region_id;
    uint64_t base;
    uint64_t size;
    uint64_t hash;
} epd_fuzz_ucx_rkey_t;

static uint64_t epd_fuzz_ucx_addr_hash(const uint8_t *blob, size_t len)
{
    return epd_hash64(blob + sizeof(epd_fuzz_ucx_addr_t), len - sizeof(epd_fuzz_ucx_addr_t),
                      (uint32_t)(len - sizeof(epd_fuzz_ucx_addr_t)));
}

static int epd_fuzz_addr_intact(const uint8_t *blob, size_t len)
{
    epd_fuzz_ucx_addr_t w;

    if (len < sizeof(w)) {
        return 0;
    }
    memcpy(&w, blob, sizeof(w));
    return w.hash == epd_fuzz_ucx_addr_hash(blob, len);
}

static void epd_fuzz_addr_fix(uint8_t *blob, size_t len, int good)
{
    epd_fuzz_ucx_addr_t w;

    if (len < sizeof(w)) {
        return;
    }
    memcpy(&w, blob, sizeof(w));
    w.hash = epd_fuzz_ucx_addr_hash(blob, len) ^ (good ? 0 : 1);
    memcpy(blob, &w, sizeof(w));
}

static void epd_fuzz_rkey_fix(uint8_t *blob, size_t len)
{
    epd_fuzz_ucx_rkey_t w;

    if (len < sizeof(w)) {
        return;
    }
    memcpy(&w, blob, sizeof(w));
    w.hash =
        epd_hash64(blob + sizeof(w), len - sizeof(w), w.region_id ^ w.base ^ w.size ^ w.ucx_len);
    memcpy(blob, &w, sizeof(w));
}

#else
#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)data;
    (void)size;
    return 0;
}
#endif
