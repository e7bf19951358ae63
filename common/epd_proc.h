/*
 * epd_proc.h — which process on which host: enough to tell, on the same
 * host, that a given process has ended, with no pid-reuse mistake.
 *
 * A process is named by its pid, its start time (clock ticks after boot,
 * /proc/<pid>/stat field 22), its pid namespace (/proc/<pid>/ns/pid: device
 * and inode) and the host's boot id (/proc/sys/kernel/random/boot_id).  Two
 * names on the same boot and pid namespace name processes of this host
 * that a pid can reach; a pid with another start time is another process.
 * A watch is a pidfd (pidfd_open(2)) checked against the start time once
 * it is open, so it stands for that process only; where pidfd_open is not
 * available the watch reads /proc/<pid>/stat instead (the start time still
 * tells a reused pid apart).
 *
 * Used by the transport's fence (transport/epd_xport.h, grants): memory a
 * same-host process may write without the receiver's check (a shared
 * mapping) is reused only once that process is gone.  Any thread.
 */
#ifndef EPD_PROC_H
#define EPD_PROC_H

#include <stdint.h>

#include "epd_status.h"

typedef struct {
    uint32_t pid;
    uint64_t start_ticks;
    uint64_t pidns_dev, pidns_ino;
    unsigned char boot_id[16];
} epd_proc_id_t;

/* This process's name.  EPD_ERR_UNSUPPORTED when /proc does not say it
 * (*id_p zeroed). */
epd_status_t epd_proc_self(epd_proc_id_t *id_p);

/* Nonzero when `a` and `b` are processes of one host a pid reaches (same
 * boot id and pid namespace, both known). */
int epd_proc_same_host(const epd_proc_id_t *a, const epd_proc_id_t *b);

/* A watch of process `id` (of this host: epd_proc_same_host with
 * epd_proc_self).  EPD_OK with *fd_p a pidfd, or -1 when pidfd_open is not
 * available (the watch then reads /proc); EPD_ERR_NOT_FOUND when that
 * process has ended already (or the pid is another process now). */
epd_status_t epd_proc_watch(const epd_proc_id_t *id, int *fd_p);

/* Nonzero once the watched process has ended (it stays so); `fd` from
 * epd_proc_watch (closed by the caller). */
int epd_proc_gone(const epd_proc_id_t *id, int fd);

/* The start time of process `pid` (0 when it cannot be read). */
uint64_t epd_proc_start_ticks(uint32_t pid);

#endif
