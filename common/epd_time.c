/* epd_time.c — clock_gettime wrappers. */
#include "epd_time.h"

#include <errno.h>
#include <time.h>

static uint64_t epd_time_read(clockid_t id)
{
    struct timespec ts;

    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * EPD_NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

uint64_t epd_time_now_ns(void)
{
    return epd_time_read(CLOCK_MONOTONIC);
}

uint64_t epd_time_wall_ns(void)
{
    return epd_time_read(CLOCK_REALTIME);
}

void epd_time_sleep_ns(uint64_t ns)
{
    struct timespec req = {.tv_sec = (time_t)(ns / EPD_NSEC_PER_SEC),
                           .tv_nsec = (long)(ns % EPD_NSEC_PER_SEC)};
    struct timespec rem;

    while (nanosleep(&req, &rem) != 0 && errno == EINTR) {
        req = rem;
    }
}
