/*
 * epd_itest_status.h — a worker's load as the test programs read it: its
 * Status over the control plane (the first worker it lists).  Test code.
 */
#ifndef EPD_ITEST_STATUS_H
#define EPD_ITEST_STATUS_H

#include <stdint.h>

typedef struct {
    uint32_t kv_blocks_free;
    uint32_t kv_blocks_total;
    uint32_t state_slots_free;
    uint32_t state_slots_total;
    uint32_t running_requests;
    uint32_t quarantined;
} epd_itest_load_t;

/* The load of the worker whose control plane listens at addr (3 s at
 * most).  0, or -1 when it did not answer with one. */
int epd_itest_load(const char *addr, epd_itest_load_t *load_p);

#endif
