/* epd_bench.h — the subcommands of epd-bench.  Each takes argv with
 * argv[0] = the subcommand name, prints its table to stdout and returns the
 * process exit status. */
#ifndef EPD_BENCH_H
#define EPD_BENCH_H

int epd_bench_engine_main(int argc, char **argv);
/* `engine --hf LIST`: the Hugging Face models of that list, `layers` layers
 * each, written under `models` (epd_bench_engine_hf.c). */
#include <stdint.h>
int epd_bench_engine_hf(const char *models, const char *list, uint32_t layers);
int epd_bench_xfer_main(int argc, char **argv);
int epd_bench_overhead_main(int argc, char **argv);
int epd_bench_serve_main(int argc, char **argv);
int epd_bench_burst_main(int argc, char **argv);
int epd_bench_fleet_main(int argc, char **argv);
int epd_bench_soak_main(int argc, char **argv);
int epd_bench_kvtier_main(int argc, char **argv);
int epd_bench_kvq_main(int argc, char **argv);
/* `serve --workload shared-prefix` (epd_bench_prefix.c) */
int epd_bench_prefix_main(int argc, char **argv);

/* The folder of the running epd-bench (build/bin; epd_bench_proc.c).
 * The process helpers are epd_bench_proc.c's, below. */
#include <stddef.h>
int epd_bench_bindir(char *out, size_t cap);

/* ---- epd_bench_proc.c: a benchmark's own cluster ---- */
#include <stddef.h>
#include <sys/types.h>

#include "epd_secret.h"

/* Sets each "NAME=VALUE" of env (NULL-terminated; NULL: none) in this
 * process's environment, over what it has when `overwrite`; an entry
 * without '=' is skipped. */
void epd_bench_setenv(const char *const *env, int overwrite);
/* How epd_bench_spawn_ex starts a process.  Every pointer is borrowed for
 * the call only (the child has its own copy once forked). */
typedef struct {
    /* stdout and stderr into this file (created 0644, truncated); NULL:
     * stdout into out_fd and stderr into /dev/null */
    const char *log;
    int out_fd; /* with log NULL: stdout's fd, or -1 for /dev/null */
    /* "NAME=VALUE" strings, NULL-terminated (either list may be NULL):
     * env_default's are set only where the environment has no NAME, then
     * env's are set whatever it has */
    const char *const *env_default;
    const char *const *env;
} epd_bench_spawn_t;

/* Forks and execs argv[0] (a path, or a name looked up in PATH) as `how`
 * says; the child's pid (-1: fork failed; a failed exec exits 127).  The
 * one launcher of every subcommand: the daemons of a benchmark's own
 * cluster and the reference tools (xfer) alike.  Any thread.  Until it is
 * reaped (epd_bench_stop, epd_bench_wait) the child is remembered: a
 * SIGINT, SIGTERM or SIGHUP that ends the bench sends it SIGTERM first
 * (the first spawn installs those handlers), so a benchmark stopped by a
 * signal leaves no daemon behind (SIGKILL still does: nothing runs then). */
pid_t epd_bench_spawn_ex(char *const argv[], const epd_bench_spawn_t *how);
/* waitpid(pid, status_p, options) for a child of epd_bench_spawn*, which
 * it forgets once reaped; waitpid's result.  Any thread. */
pid_t epd_bench_reap(pid_t pid, int *status_p, int options);
/* The daemons' usual case: stdout and stderr into `log`, UCX held to
 * loopback unless the environment says otherwise (env_default
 * UCX_TLS=posix,cma,tcp, UCX_NET_DEVICES=lo). */
pid_t epd_bench_spawn(char *const argv[], const char *log);
/* SIGTERM, then up to timeout_ms for the exit, then SIGKILL.  0 when the
 * process exited 0 (under a sanitizer: no report either), -1 otherwise
 * (pid <= 0, a signal, another status, killed: each said on stderr,
 * prefixed `who`, naming `name`, except pid <= 0). */
int epd_bench_stop(pid_t pid, uint32_t timeout_ms, const char *who, const char *name);
/* epd_bench_stop with 10 s, its verdict said and dropped. */
void epd_bench_kill(pid_t pid, const char *who, const char *name);
/* Waits (120 s) for the ready file `path` of `pid` and copies the value of
 * its `key=` into out[0..cap).  0, or -1 (timeout, the process died). */
int epd_bench_wait_ready(const char *path, pid_t pid, const char *key, char *out, size_t cap);
/* Writes 32 fresh random bytes to DIR/cluster-secret (0600, never
 * overwritten; its path into path[0..cap)) and loads them into *secret.
 * 0, or -1 after a line on stderr. */
int epd_bench_make_secret(const char *dir, char *path, size_t cap, epd_secret_t *secret,
                          const char *who);
/* Polls the router's Status at `ctl` (signed with `secret`) until `want`
 * workers are READY (30 s).  0 or -1. */
int epd_bench_wait_workers(const char *ctl, const epd_secret_t *secret, int want);
/* A small sim model in `dir` (created): 4 attention layers, a
 * 1B-parameter timing on one H200 (prefill of 128 tokens ~0.4 ms, a decode
 * step ~0.5 ms), byte tokenizer, context 4096.  0 or -1. */
int epd_bench_write_sim(const char *dir);
/* The same with the profile's max_context set (long-prompt workloads). */
int epd_bench_write_sim_ctx(const char *dir, uint32_t max_context);
/* The value of the sample `name` (a name without labels) in the
 * Prometheus text `text`: the line `name value` or `name{model="..."}
 * value` (the model label every router series carries).  1 with *out set,
 * 0 when absent. */
int epd_bench_metric(const char *text, const char *name, double *out);

/* ---- epd_bench_stats.c: the statistics every table uses ---- */
/* qsort comparator of doubles, ascending. */
int epd_bench_cmp_double(const void *a, const void *b);
/* Sorts v[0..n) ascending, in place. */
void epd_bench_sort(double *v, size_t n);
/* The p-th percentile (p in percent, 0..100) of sorted[0..n), nearest
 * rank: the smallest value with at least p% of the samples at or below
 * it; p <= 0 gives the minimum.  NaN when n is 0. */
double epd_bench_pct(const double *sorted, size_t n, double p);
/* The median of v[0..n) (sorts v in place); NaN when n is 0. */
double epd_bench_median(double *v, size_t n);
/* The distribution-free ~95% interval of the median of sorted[0..n):
 * [v_(k), v_(n-k+1)] with k the largest rank such that P(Bin(n, 1/2) <
 * k) <= 0.025.  Both NaN when n is too small for one (n < 6). */
void epd_bench_median_ci(const double *sorted, size_t n, double *lo_p, double *hi_p);
/* utime + stime of process `pid` in ns (every thread, exited ones too),
 * from /proc/PID/stat.  0, or -1 (no such process). */
int epd_bench_cpu_ns(pid_t pid, uint64_t *ns_p);

#endif
