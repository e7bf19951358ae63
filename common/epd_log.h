/*
 * epd_log.h — logging: one line per event on stderr,
 *
 *   2026-11-29T15:03:47.123456Z ERROR prefill req=42 reservation refused: ...
 *
 * with level, UTC time, component and (when nonzero) the request id.  The
 * level comes from epd_log_set_level() or the EPD_LOG_LEVEL environment
 * variable (error, warn, info, debug, trace).  A line is formatted into a
 * stack buffer and written with one write(2), so lines from different threads
 * never interleave; no lock is taken.  Any thread.
 */
#ifndef EPD_LOG_H
#define EPD_LOG_H

#include <stdint.h>

#include "epd_status.h"

typedef enum {
    EPD_LOG_ERROR = 0,
    EPD_LOG_WARN,
    EPD_LOG_INFO,
    EPD_LOG_DEBUG,
    EPD_LOG_TRACE,
} epd_log_level_t;

/* Sets the process-wide level (messages above it are dropped). */
void epd_log_set_level(epd_log_level_t level);

/* Parses "error".."trace" into *level_p; EPD_ERR_INVALID_PARAM otherwise. */
epd_status_t epd_log_level_parse(const char *text, epd_log_level_t *level_p);

/* Nonzero when `level` would be printed. */
int epd_log_enabled(epd_log_level_t level);

/* Formats and writes one line.  `component` is a short static name
 * ("prefill"), `req_id` 0 when the line is not about a request. */
void epd_log_write(epd_log_level_t level, const char *component, uint64_t req_id,
                   const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* A rate limit for lines a peer can trigger at will (garbage, stale
 * messages): at most `burst` pass per second of the monotonic clock.
 * Zero-initialised; one per thread (not locked). */
typedef struct {
    uint64_t window_ns;
    uint32_t count;
} epd_log_limit_t;

/* Nonzero when one more line may pass `l` now. */
int epd_log_limit_ok(epd_log_limit_t *l, uint32_t burst);

#define EPD_LOG(level, comp, req, ...)                  \
    do {                                                \
        if (epd_log_enabled(level)) {                   \
            epd_log_write(level, comp, req, __VA_ARGS__); \
        }                                               \
    } while (0)

#define epd_log_error(comp, req, ...) EPD_LOG(EPD_LOG_ERROR, comp, req, __VA_ARGS__)
#define epd_log_warn(comp, req, ...) EPD_LOG(EPD_LOG_WARN, comp, req, __VA_ARGS__)
#define epd_log_info(comp, req, ...) EPD_LOG(EPD_LOG_INFO, comp, req, __VA_ARGS__)
#define epd_log_debug(comp, req, ...) EPD_LOG(EPD_LOG_DEBUG, comp, req, __VA_ARGS__)
#define epd_log_trace(comp, req, ...) EPD_LOG(EPD_LOG_TRACE, comp, req, __VA_ARGS__)

#endif
