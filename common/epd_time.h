/* epd_time.h — clocks.  Monotonic time for every duration and deadline;
 * wall time only for log lines and trace anchors.  Any thread. */
#ifndef EPD_TIME_H
#define EPD_TIME_H

#include <stdint.h>

#define EPD_NSEC_PER_USEC 1000ULL
#define EPD_NSEC_PER_MSEC 1000000ULL
#define EPD_NSEC_PER_SEC 1000000000ULL

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t epd_time_now_ns(void);

/* CLOCK_REALTIME in nanoseconds since the Unix epoch. */
uint64_t epd_time_wall_ns(void);

/* Sleeps for `ns` nanoseconds (restarts after signals).  Never call it on a
 * loop thread. */
void epd_time_sleep_ns(uint64_t ns);

#endif
