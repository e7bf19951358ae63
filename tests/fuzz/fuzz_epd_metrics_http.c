/*
 * libFuzzer target for a worker's /metrics request reading
 * (daemon/epd_metrics_http.c): any bytes, taken as what a client sent.
 * The end of the head found in one look equals the end found in two looks
 * split where the input itself chooses (its first byte), as the listener
 * looks again after each read; the route of any head is one of the five
 * and never reads outside it (ASan: the buffer is exactly the input);
 * never a crash or undefined behaviour.  `make fuzz`; the seeds in
 * tests/fuzz/corpus/fuzz_epd_metrics_http/ are replayed by make check.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "epd_metrics_http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t split, whole, two;
    char *buf;
    epd_metrics_route_t route;

    if (size < 1) {
        return 0;
    }
    split = data[0] % size;
    data++;
    size--;
    /* an exact copy: a read past the end is a heap overflow ASan sees */
    buf = malloc(size > 0 ? size : 1);
    if (buf == NULL) {
        return 0;
    }
    memcpy(buf, data, size);
    whole = epd_metrics_http_head_end(buf, 0, size);
    two = epd_metrics_http_head_end(buf, 0, split);
    if (two == 0) {
        two = epd_metrics_http_head_end(buf, split >= 3 ? split - 3 : 0, size);
    }
    if (whole != two || whole > size) {
        abort();
    }
    route = epd_metrics_http_route(buf, whole != 0 ? whole : size);
    if ((unsigned)route > EPD_METRICS_ROUTE_METHOD) {
        abort();
    }
    free(buf);
    return 0;
}
