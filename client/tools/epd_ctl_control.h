/*
 * epd_ctl_control.h — epd-ctl's control-plane commands and the pieces the
 * command line shares with them (epd_ctl_control.c).  Each command prints
 * its answer and returns the process exit status (0 ok, 1 after one line on
 * stderr).
 */
#ifndef EPD_CTL_CONTROL_H
#define EPD_CTL_CONTROL_H

#include "epd_secret.h"

/* How long a control call or a submit's Health waits for its answer. */
#define CTL_RPC_TIMEOUT_MS 5000

/* The secret control calls are signed with (len 0: none); loaded by
 * epd_ctl_load_secret, wiped by the caller at exit. */
extern epd_secret_t epd_ctl_secret;

/* Prints "epd-ctl: WHAT" to stderr; returns 1. */
int epd_ctl_fail(const char *what);
/* Names of a role / worker state as epd-ctl prints them (static strings). */
const char *epd_ctl_role_name(int role);
const char *epd_ctl_state_name(int state);
/* Loads PATH (or $EPD_CLUSTER_SECRET_FILE when PATH is NULL) into
 * epd_ctl_secret; 0, or 1 after a message. */
int epd_ctl_load_secret(const char *path);
/* Parses `CMD ADDR [--cluster-secret-file PATH]` (argv[0] is ADDR): 0 (the
 * secret loaded when given), 1 after a message, -1 for --help. */
int epd_ctl_control_flags(const char *cmd, int argc, char **argv);

int epd_ctl_health(const char *addr);
int epd_ctl_status(const char *addr);
int epd_ctl_workers(const char *addr);
int epd_ctl_drain(const char *addr, int argc, char **argv);
int epd_ctl_probe(const char *addr, int argc, char **argv);

#endif
