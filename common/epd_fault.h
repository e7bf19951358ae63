/*
 * epd_fault.h — fault points: places in the daemons where a test (or
 * `epd-bench soak`) makes a process misbehave on purpose, named by the
 * environment:
 *
 *   EPD_FAULT_POINTS="name=value[,name=value...]"
 *
 * e.g. "prefill.pause_after_layer=0" (prefill stops itself with SIGSTOP
 * once it has written a request's first layer, and when continued posts
 * the rest at once, before it learns anything from its peers),
 * "encoder.pause_before_write=1", "decode.die_after_msgs=200" (the process
 * exits between two request-plane messages).  The points each daemon
 * knows are listed where they are used (daemon/, prefill/, encoder/) and
 * in docs/design/soak.md.  Unset (the normal case) a
 * point costs one load and one branch; nothing is read from the
 * environment after the first call.  Any thread.
 */
#ifndef EPD_FAULT_H
#define EPD_FAULT_H

#include <stdint.h>

/* Longest point name and the most points EPD_FAULT_POINTS may name. */
#define EPD_FAULT_NAME_MAX 63
#define EPD_FAULT_MAX 16

/* Nonzero when any point is set (the first call reads the environment;
 * a malformed entry is logged once and ignored). */
int epd_fault_any(void);

/* Nonzero when point `name` is set; *value_p (may be NULL) gets its value
 * (a decimal integer; a point given without "=value" is 1). */
int epd_fault_point(const char *name, int64_t *value_p);

/* Fires a point at most once per process: nonzero the first time a caller
 * claims it (atomically), 0 afterwards and when it is not set. */
int epd_fault_once(const char *name);

/* Stops the whole process with SIGSTOP (after one log line naming `what`),
 * as an outside stall would: every thread stops where it is, and the
 * caller continues right here when someone sends SIGCONT. */
void epd_fault_pause(const char *what);

/* Ends the process at once (_exit(137), after one log line naming `what`),
 * as SIGKILL would: no destructor, no goodbye on any link. */
void epd_fault_die(const char *what) __attribute__((noreturn));

#endif
