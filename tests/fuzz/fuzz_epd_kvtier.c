/*
 * libFuzzer target for the KV tier's file decoder (kv/epd_kvtier.c):
 * any bytes, as a file in a persistent tier's directory, are indexed only
 * when their header checks out (magic, version, header checksum, our
 * namespace, lengths against the file's size, the name against the key)
 * and refused otherwise; an indexed one is restored only when it
 * decompresses to bytes whose XXH3-128 matches — never a crash, never a
 * read past a buffer.  The file is named by the key the input's header
 * claims (bytes 56..88), so that well-formed seeds reach the payload.
 * `make fuzz`.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "epd_kvtier.h"
#include "epd_log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_dir[512];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static unsigned char out[1 << 20];
    epd_kvtier_config_t cfg;
    epd_prefix_hash_t key;
    epd_kvtier_t *t = NULL;
    char name[65], path[700];
    size_t len, ckpt_len;
    FILE *f;

    epd_log_set_level(EPD_LOG_ERROR);
    if (g_dir[0] == '\0') {
        const char *tmp = getenv("TMPDIR");

        snprintf(g_dir, sizeof(g_dir), "%s/fuzz-kvtier-XXXXXX", tmp != NULL ? tmp : "/tmp");
        if (mkdtemp(g_dir) == NULL) {
            abort();
        }
    }
    memset(&key, 0, sizeof(key));
    if (size >= 88) {
        memcpy(key.b, data + 56, sizeof(key.b));
    }
    epd_kvtier_file_name(&key, name);
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
        abort();
    }
    memset(&cfg, 0, sizeof(cfg));
    memset(cfg.ns.b, 0x5a, sizeof(cfg.ns.b)); /* the seeds' namespace */
    cfg.host_bytes = 0;
    cfg.disk_dir = g_dir;
    cfg.disk_bytes = (uint64_t)1 << 30;
    cfg.persist = 1;
    cfg.level = 1;
    cfg.log_comp = "fuzz";
    if (epd_kvtier_create(&cfg, &t) == EPD_OK) {
        if (epd_kvtier_where(t, &key) == EPD_KVTIER_DISK) {
            (void)epd_kvtier_get(t, &key, out, sizeof(out), &len, &ckpt_len);
        }
        epd_kvtier_destroy(t);
    }
    (void)unlink(path);
    return 0;
}
