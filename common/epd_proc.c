/*
 * epd_proc.c — process names and watches (epd_proc.h).
 */
#include "epd_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static int epd_proc_hex(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static int epd_proc_boot_id(unsigned char out[16])
{
    char buf[64];
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    size_t n, k = 0;

    if (f == NULL) {
        return -1;
    }
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    for (size_t i = 0; i + 1 < n && k < 16; i++) {
        int hi = epd_proc_hex(buf[i]), lo;

        if (hi < 0) {
            continue;
        }
        lo = epd_proc_hex(buf[i + 1]);
        if (lo < 0) {
            return -1;
        }
        out[k++] = (unsigned char)(hi << 4 | lo);
        i++;
    }
    return k == 16 ? 0 : -1;
}

/* Start time (0: unreadable) and state letter of process `pid`. */
static uint64_t epd_proc_stat(uint32_t pid, char *state_p)
{
    char path[64], buf[1024];
    unsigned long long start = 0;
    const char *p;
    FILE *f;
    size_t n;

    *state_p = '?';
    snprintf(path, sizeof(path), "/proc/%u/stat", pid);
    f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* the command may hold anything: fields count from the last ')' */
    p = strrchr(buf, ')');
    if (p == NULL) {
        return 0;
    }
    p++;
    for (int field = 3; field <= 22 && *p != '\0'; field++) {
        while (*p == ' ') {
            p++;
        }
        if (field == 3) {
            *state_p = *p;
        }
        if (field == 22) {
            start = strtoull(p, NULL, 10);
            break;
        }
        while (*p != ' ' && *p != '\0') {
            p++;
        }
    }
    return (uint64_t)start;
}

uint64_t epd_proc_start_ticks(uint32_t pid)
{
    char state;

    return epd_proc_stat(pid, &state);
}

epd_status_t epd_proc_self(epd_proc_id_t *id_p)
{
    struct stat ns;

    memset(id_p, 0, sizeof(*id_p));
    if (stat("/proc/self/ns/pid", &ns) != 0 || epd_proc_boot_id(id_p->boot_id) != 0) {
        memset(id_p, 0, sizeof(*id_p));
        return EPD_ERR_UNSUPPORTED;
    }
    id_p->pid = (uint32_t)getpid();
    id_p->start_ticks = epd_proc_start_ticks(id_p->pid);
    id_p->pidns_dev = (uint64_t)ns.st_dev;
    id_p->pidns_ino = (uint64_t)ns.st_ino;
    if (id_p->start_ticks == 0) {
        memset(id_p, 0, sizeof(*id_p));
        return EPD_ERR_UNSUPPORTED;
    }
    return EPD_OK;
}

int epd_proc_same_host(const epd_proc_id_t *a, const epd_proc_id_t *b)
{
    static const unsigned char zero[16];

    return a->pid != 0 && b->pid != 0 && a->start_ticks != 0 && b->start_ticks != 0 &&
           memcmp(a->boot_id, zero, sizeof(zero)) != 0 &&
           memcmp(a->boot_id, b->boot_id, sizeof(a->boot_id)) == 0 &&
           a->pidns_dev == b->pidns_dev && a->pidns_ino == b->pidns_ino;
}

epd_status_t epd_proc_watch(const epd_proc_id_t *id, int *fd_p)
{
    int fd = -1;

#ifdef SYS_pidfd_open
    fd = (int)syscall(SYS_pidfd_open, (pid_t)id->pid, 0);
    if (fd < 0 && errno == ESRCH) {
        return EPD_ERR_NOT_FOUND;
    }
#endif
    /* opened first, checked after: if the pid was reused before the open,
     * the start time differs; if the process ends after it, the pidfd is
     * that process's and says so */
    if (epd_proc_start_ticks(id->pid) != id->start_ticks) {
        if (fd >= 0) {
            close(fd);
        }
        return EPD_ERR_NOT_FOUND;
    }
    *fd_p = fd;
    return EPD_OK;
}

int epd_proc_gone(const epd_proc_id_t *id, int fd)
{
    if (fd >= 0) {
        struct pollfd p = {.fd = fd, .events = POLLIN};

        return poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
    }
    {
        char state;

        /* a zombie has released its memory: ended as far as writes go */
        return epd_proc_stat(id->pid, &state) != id->start_ticks || state == 'Z' || state == 'X';
    }
}
