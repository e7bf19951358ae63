/*
 * epd_daemon_log.c — refusal lines a peer can trigger at will (garbage,
 * stale or refused messages): at most EPD_DAEMON_REFUSE_BURST a second,
 * the rest counted and summarized in one line when the window turns, so
 * a flood cannot flood the log.
 */
#include <stdarg.h>
#include <stdio.h>

#include "epd_daemon_int.h"
#include "epd_time.h"

#define EPD_DAEMON_REFUSE_BURST 20

void epd_daemon_refuse_log(epd_daemon_t *d, uint64_t req_id, const char *fmt, ...)
{
    uint64_t now = epd_time_now_ns();
    char line[512];
    va_list ap;

    d->refusals++;
    if (now - d->refuse_window_ns > EPD_NSEC_PER_SEC) {
        if (d->refuse_suppressed > 0) {
            epd_log_warn(d->log, 0, "%llu refusal lines suppressed in the last second",
                         (unsigned long long)d->refuse_suppressed);
        }
        d->refuse_window_ns = now;
        d->refuse_suppressed = 0;
    }
    if (!epd_log_limit_ok(&d->refuse_limit, EPD_DAEMON_REFUSE_BURST)) {
        d->refuse_suppressed++;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    epd_log_warn(d->log, req_id, "refused: %s", line);
}

uint64_t epd_daemon_refusals(const epd_daemon_t *d)
{
    return d->refusals;
}

uint64_t epd_daemon_bad_frames(const epd_daemon_t *d)
{
    return d->bad_frames;
}
