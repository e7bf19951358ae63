/*
 * epd_fuzz_xport_keys.h — the body of the libFuzzer targets for a backend's
 * unpacking of peer address blobs and packed remote keys
 * (fuzz_epd_xport_ucx_keys.c, fuzz_epd_xport_ofi_keys.c include it after
 * defining EPD_FUZZ_BACKEND and the two envelope fix-ups).
 *
 * One worker of the backend per process, with an endpoint to itself for the
 * keys.  Input: a selector byte (even: an address blob for
 * epd_xport_connect; odd: a packed key for epd_xport_rkey_unpack), then the
 * blob.  Every blob is refused (EPD_ERR_BAD_ADDRESS / EPD_ERR_BAD_RKEY) or
 * accepted and released; never a crash, leak or undefined behaviour.
 *
 * Packed keys that pass the envelope's checks go on to the library's own
 * unpacking (UCX's rkey parser; libfabric's is ours).  Address blobs that
 * pass them would make the library connect somewhere (a tcp connection to
 * whatever the fuzzer wrote), so by default their checksum is spoilt first
 * and only the envelope is fuzzed.  EPD_FUZZ_DEEP=1 instead makes every
 * input's checksum right (the fuzzer cannot compute XXH3 itself), so that
 * the library's own address and key parsers see fuzzed bytes: run it by
 * hand — a crash there is the library's, and says what an unauthenticated
 * HELLO could do to a worker (the checksum stops corruption, not an
 * attacker).
 */
#ifndef EPD_FUZZ_XPORT_KEYS_H
#define EPD_FUZZ_XPORT_KEYS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_log.h"
#include "epd_xport_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* From the including file, on the backend's envelopes (a blob shorter than
 * the envelope's header is left alone): whether an address blob's checksum
 * is right; set an address blob's checksum right (good) or wrong; set a
 * packed key's checksum right. */
static int epd_fuzz_addr_intact(const uint8_t *blob, size_t len);
static void epd_fuzz_addr_fix(uint8_t *blob, size_t len, int good);
static void epd_fuzz_rkey_fix(uint8_t *blob, size_t len);

#ifndef EPD_FUZZ_REPLAY
/* UCX and libfabric keep process-wide allocations until exit (the worker
 * lives as long as the fuzzer); the replay program has its own list. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libucs.so\nleak:libucp.so\nleak:libuct.so\nleak:libucm.so\n"
           "leak:libfabric.so\nleak:librdmacm.so\nleak:libibverbs.so\n";
}
#endif

static epd_xport_t *epd_fuzz_x;
static epd_xport_ep_t *epd_fuzz_self;
static int epd_fuzz_deep;

static void epd_fuzz_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    (void)arg;
    (void)ep;
    (void)data;
    (void)len;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    epd_xport_config_t cfg;
    const void *blob;
    size_t len;
    const char *deep = getenv("EPD_FUZZ_DEEP");

    (void)argc;
    (void)argv;
    epd_fuzz_deep = deep != NULL && strcmp(deep, "1") == 0;
    epd_log_set_level(EPD_LOG_ERROR);
    EPD_FUZZ_ENV();
    epd_xport_config_init(&cfg);
    cfg.backend = EPD_FUZZ_BACKEND;
    cfg.msg_cb = epd_fuzz_msg;
    cfg.max_inflight = 16;
    cfg.connect_timeout_ms = 60000;
    cfg.peer_timeout_ms = 60000;
    if (epd_xport_create(&cfg, &epd_fuzz_x) != EPD_OK ||
        epd_xport_address(epd_fuzz_x, &blob, &len) != EPD_OK ||
        epd_xport_connect(epd_fuzz_x, blob, len, NULL, NULL, &epd_fuzz_self) != EPD_INPROGRESS) {
        fprintf(stderr, "fuzz: cannot start a %s worker\n", EPD_FUZZ_BACKEND);
        abort();
    }
    for (int i = 0; i < 50; i++) {
        epd_xport_poll(epd_fuzz_x, 1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *blob;
    size_t len;

    if (size < 1 || size - 1 > 2 * EPD_XPORT_ADDR_MAX) {
        return 0;
    }
    len = size - 1;
    blob = malloc(len > 0 ? len : 1);
    if (blob == NULL) {
        return 0;
    }
    memcpy(blob, data + 1, len);
    if ((data[0] & 1) == 0) {
        epd_xport_ep_t *ep = NULL;

        if (epd_fuzz_deep) {
            epd_fuzz_addr_fix(blob, len, 1);
        } else if (epd_fuzz_addr_intact(blob, len)) {
            epd_fuzz_addr_fix(blob, len, 0);
        }
        if (epd_xport_connect(epd_fuzz_x, blob, len, NULL, NULL, &ep) == EPD_INPROGRESS) {
            epd_xport_ep_close(ep);
        }
    } else {
        epd_xport_rkey_t *rk = NULL;

        if (epd_fuzz_deep) {
            epd_fuzz_rkey_fix(blob, len);
        }
        if (epd_xport_rkey_unpack(epd_fuzz_self, blob, len, &rk) == EPD_OK) {
            if (epd_xport_rkey_size(rk) == 0) {
                abort(); /* an accepted key names a region of some size */
            }
            epd_xport_rkey_destroy(rk);
        }
    }
    free(blob);
    return 0;
}

#ifdef EPD_FUZZ_SEEDGEN
/* Writes seeds: this worker's address and packed keys (a receive region
 * and, as pack_any gives it, a local one), each with its selector byte. */
static void epd_fuzz_seed(const char *dir, const char *name, uint8_t sel, const void *blob,
                          size_t len)
{
    char path[1024];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "wb");
    if (f == NULL) {
        perror(path);
        exit(1);
    }
    fwrite(&sel, 1, 1, f);
    fwrite(blob, 1, len, f);
    fclose(f);
}

int main(int argc, char **argv)
{
    const void *blob;
    size_t len;
    epd_xport_mr_t *mr, *local;
    unsigned char key[EPD_XPORT_RKEY_MAX];
    size_t key_len;

    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    LLVMFuzzerInitialize(&argc, &argv);
    epd_xport_address(epd_fuzz_x, &blob, &len);
    epd_fuzz_seed(argv[1], "address", 0, blob, len);
    epd_fuzz_seed(argv[1], "address-truncated", 0, blob, len / 2);
    if (epd_xport_mr_alloc(epd_fuzz_x, 1 << 20, &mr) != EPD_OK ||
        epd_xport_mr_pack(mr, key, sizeof(key), &key_len) != EPD_OK) {
        return 1;
    }
    epd_fuzz_seed(argv[1], "rkey", 1, key, key_len);
    epd_fuzz_seed(argv[1], "rkey-truncated", 1, key, key_len - 1);
    if (epd_xport_mr_alloc_ex(epd_fuzz_x, 1 << 20, EPD_XPORT_MR_LOCAL, &local) == EPD_OK &&
        epd__xport_mr_pack_any(local, key, sizeof(key), &key_len) == EPD_OK) {
        epd_fuzz_seed(argv[1], "rkey-local", 1, key, key_len);
    }
    epd_xport_destroy(epd_fuzz_x);
    return 0;
}
#endif

#endif
