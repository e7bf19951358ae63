/*
 * epd_fault.c — fault points named by EPD_FAULT_POINTS (epd_fault.h).
 */
#include "epd_fault.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "epd_log.h"

#define EPD_FAULT_LOG "fault"

typedef struct {
    char name[EPD_FAULT_NAME_MAX + 1];
    int64_t value;
    atomic_int fired;
} epd_fault_entry_t;

static epd_fault_entry_t epd_fault_tab[EPD_FAULT_MAX];
static int epd_fault_n;
static pthread_once_t epd_fault_once_ctl = PTHREAD_ONCE_INIT;

static void epd_fault_parse(void)
{
    const char *env = getenv("EPD_FAULT_POINTS");
    const char *p = env;

    while (p != NULL && *p != '\0') {
        const char *end = strchr(p, ',');
        size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        size_t nlen = eq != NULL ? (size_t)(eq - p) : len;
        int64_t value = 1;
        int ok = nlen > 0 && nlen <= EPD_FAULT_NAME_MAX && epd_fault_n < EPD_FAULT_MAX;

        if (ok && eq != NULL) {
            char num[32];
            size_t vlen = len - nlen - 1;
            char *stop = NULL;

            ok = vlen > 0 && vlen < sizeof(num);
            if (ok) {
                memcpy(num, eq + 1, vlen);
                num[vlen] = '\0';
                value = strtoll(num, &stop, 10);
                ok = stop != NULL && *stop == '\0';
            }
        }
        if (ok) {
            epd_fault_entry_t *e = &epd_fault_tab[epd_fault_n++];

            memcpy(e->name, p, nlen);
            e->name[nlen] = '\0';
            e->value = value;
            atomic_init(&e->fired, 0);
            epd_log_warn(EPD_FAULT_LOG, 0, "fault point %s=%lld is armed (EPD_FAULT_POINTS)",
                         e->name, (long long)value);
        } else if (len > 0) {
            epd_log_error(EPD_FAULT_LOG, 0, "ignoring a malformed entry of EPD_FAULT_POINTS: %.*s",
                          (int)len, p);
        }
        p = end != NULL ? end + 1 : NULL;
    }
}

static epd_fault_entry_t *epd_fault_find(const char *name)
{
    pthread_once(&epd_fault_once_ctl, epd_fault_parse);
    for (int i = 0; i < epd_fault_n; i++) {
        if (strcmp(epd_fault_tab[i].name, name) == 0) {
            return &epd_fault_tab[i];
        }
    }
    return NULL;
}

int epd_fault_any(void)
{
    pthread_once(&epd_fault_once_ctl, epd_fault_parse);
    return epd_fault_n > 0;
}

int epd_fault_point(const char *name, int64_t *value_p)
{
    epd_fault_entry_t *e = epd_fault_find(name);

    if (e == NULL) {
        return 0;
    }
    if (value_p != NULL) {
        *value_p = e->value;
    }
    return 1;
}

int epd_fault_once(const char *name)
{
    epd_fault_entry_t *e = epd_fault_find(name);
    int expected = 0;

    return e != NULL && atomic_compare_exchange_strong(&e->fired, &expected, 1);
}

void epd_fault_pause(const char *what)
{
    epd_log_warn(EPD_FAULT_LOG, 0, "fault point: %s — stopping this process (SIGSTOP, pid %d)",
                 what, (int)getpid());
    (void)raise(SIGSTOP);
    epd_log_warn(EPD_FAULT_LOG, 0, "fault point: %s — continued", what);
}

void epd_fault_die(const char *what)
{
    epd_log_warn(EPD_FAULT_LOG, 0, "fault point: %s — exiting at once (pid %d)", what,
                 (int)getpid());
    _exit(137);
}
