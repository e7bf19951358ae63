/*
 * libFuzzer target for the safetensors reader (engine/epd_safetensors.c):
 * any file content is either refused or yields tensors whose bytes lie
 * inside the file — read them all to let ASan prove it.  The input goes
 * through a memfd, since the reader maps a path.  `make fuzz`.
 */
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "epd_log.h"
#include "epd_safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    char path[64];
    epd_st_file_t *file = NULL;

    if (fd < 0) {
        epd_log_set_level(EPD_LOG_ERROR);
        fd = memfd_create("epd-fuzz-safetensors", 0);
        if (fd < 0) {
            return 0;
        }
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) {
        return 0;
    }
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    if (epd_st_open(path, &file) == EPD_OK) {
        volatile uint8_t sink = 0;

        for (size_t i = 0; i < epd_st_count(file); i++) {
            const epd_st_tensor_t *t = epd_st_at(file, i);

            for (uint64_t b = 0; b < t->nbytes; b++) {
                sink ^= ((const uint8_t *)t->data)[b];
            }
        }
        (void)sink;
        epd_st_close(file);
    }
    return 0;
}
