/*
 * libFuzzer target for the libfabric backend's address blobs and packed
 * keys (transport/ofi/epd_xport_ofi_ep.c, _mr.c: epd__ofi_ep_create,
 * epd__ofi_rkey_unpack) through the core's epd_xport_connect /
 * epd_xport_rkey_unpack.  The body is epd_fuzz_xport_keys.h; here the ofi
 * envelope of an address blob.  Runs on tcp;ofi_rxm unless FI_PROVIDER is
 * set.  `make fuzz`.
 */
#if EPD_WITH_OFI

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "epd_hash.h"

#define EPD_FUZZ_BACKEND "ofi"
#define EPD_FUZZ_ENV()                                                                             \
    do {                                                                                           \
        setenv("FI_PROVIDER", "tcp;ofi_rxm", 0);                                                   \
    } while (0)

#include "epd_fuzz_xport_keys.h"

/* transport/ofi's address envelope (version 1) and its checksum */
typedef struct {
    uint64_t magic;
    uint16_t version;
    uint16_t hdr_len;
    uint32_t name_len;
    uint32_t addr_format;
    uint32_t reserved;
    char prov[32];
    uint64_t check;
} epd_fuzz_ofi_addr_t;

/* Its checksum over a header of hdr_len bytes (the last 8 are the check)
 * and the body behind it; packed keys (version 2) have an 88-byte header. */
static uint64_t epd_fuzz_ofi_check(const uint8_t *blob, size_t len, size_t hdr_len)
{
    uint64_t h = epd_hash64(blob, hdr_len - 8, 0x6570645f6f666921ull);

    return epd_hash64(blob + hdr_len, len - hdr_len, h);
}

#define EPD_FUZZ_OFI_RKEY_HDR 88

static int epd_fuzz_addr_intact(const uint8_t *blob, size_t len)
{
    epd_fuzz_ofi_addr_t w;

    if (len < sizeof(w)) {
        return 0;
    }
    memcpy(&w, blob, sizeof(w));
    return w.check == epd_fuzz_ofi_check(blob, len, sizeof(w));
}

static void epd_fuzz_addr_fix(uint8_t *blob, size_t len, int good)
{
    uint64_t c;

    if (len < sizeof(epd_fuzz_ofi_addr_t)) {
        return;
    }
    c = epd_fuzz_ofi_check(blob, len, sizeof(epd_fuzz_ofi_addr_t)) ^ (good ? 0 : 1);
    memcpy(blob + offsetof(epd_fuzz_ofi_addr_t, check), &c, sizeof(c));
}

static void epd_fuzz_rkey_fix(uint8_t *blob, size_t len)
{
    uint64_t c;

    if (len < EPD_FUZZ_OFI_RKEY_HDR) {
        return;
    }
    c = epd_fuzz_ofi_check(blob, len, EPD_FUZZ_OFI_RKEY_HDR);
    memcpy(blob + EPD_FUZZ_OFI_RKEY_HDR - 8, &c, sizeof(c));
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
