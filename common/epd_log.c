/*
 * epd_log.c — lock-free line logging.
 *
 * The level is read lazily from EPD_LOG_LEVEL on first use; after that it is
 * an atomic int.  Each line is built in a 2 KiB stack buffer (longer messages
 * are cut and end in "...") and written with a single write(2), which POSIX
 * keeps whole for pipes up to PIPE_BUF and which in practice never interleaves
 * on a terminal or file either.
 */
#include "epd_log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "epd_time.h"

static atomic_int epd_log_level = -1;

static const char *const epd_log_names[] = {"error", "warn", "info", "debug", "trace"};
static const char *const epd_log_tags[] = {"ERROR", "WARN ", "INFO ", "DEBUG", "TRACE"};

epd_status_t epd_log_level_parse(const char *text, epd_log_level_t *level_p)
{
    for (int i = 0; i <= EPD_LOG_TRACE; i++) {
        if (strcasecmp(text, epd_log_names[i]) == 0) {
            *level_p = (epd_log_level_t)i;
            return EPD_OK;
        }
    }
    return EPD_ERR_INVALID_PARAM;
}

void epd_log_set_level(epd_log_level_t level)
{
    atomic_store(&epd_log_level, (int)level);
}

static int epd_log_current(void)
{
    int level = atomic_load_explicit(&epd_log_level, memory_order_relaxed);
    epd_log_level_t parsed = EPD_LOG_INFO;
    const char *env;

    if (level >= 0) {
        return level;
    }
    env = getenv("EPD_LOG_LEVEL");
    if (env != NULL && epd_log_level_parse(env, &parsed) != EPD_OK) {
        parsed = EPD_LOG_INFO;
    }
    atomic_store(&epd_log_level, (int)parsed);
    return (int)parsed;
}

int epd_log_enabled(epd_log_level_t level)
{
    return (int)level <= epd_log_current();
}

void epd_log_write(epd_log_level_t level, const char *component, uint64_t req_id,
                   const char *fmt, ...)
{
    char line[2048];
    uint64_t now = epd_time_wall_ns();
    time_t secs = (time_t)(now / EPD_NSEC_PER_SEC);
    struct tm tm;
    size_t len;
    int n;
    va_list ap;

    gmtime_r(&secs, &tm);
    len = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
    n = snprintf(line + len, sizeof(line) - len, ".%06uZ %s %s ",
                 (unsigned)((now % EPD_NSEC_PER_SEC) / 1000), epd_log_tags[level],
                 component != NULL ? component : "-");
    len += (size_t)n;
    if (req_id != 0) {
        n = snprintf(line + len, sizeof(line) - len, "req=%llu ", (unsigned long long)req_id);
        len += (size_t)n;
    }
    va_start(ap, fmt);
    n = vsnprintf(line + len, sizeof(line) - len - 1, fmt, ap);
    va_end(ap);
    if (n < 0) {
        n = 0;
    }
    if ((size_t)n >= sizeof(line) - len - 1) {
        len = sizeof(line) - 5;
        memcpy(line + len, "...", 3);
        len += 3;
    } else {
        len += (size_t)n;
    }
    line[len++] = '\n';
    if (write(STDERR_FILENO, line, len) < 0) {
        /* Nowhere left to report a failed log write. */
    }
}

int epd_log_limit_ok(epd_log_limit_t *l, uint32_t burst)
{
    uint64_t now = epd_time_now_ns();

    if (now - l->window_ns > EPD_NSEC_PER_SEC) {
        l->window_ns = now;
        l->count = 0;
    }
    return l->count++ < burst;
}
