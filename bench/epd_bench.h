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

/* The folder of the running epd-bench (build/bin; epd_bench_serve.c).
 * The process helpers are epd_bench_proc.c's, below. */
#include <stddef.h>
int epd_bench_bindir(char *out, size_t cap);

/* ---- epd_bench_proc.c: a benchmark's own cluster ---- */
#include <stddef.h>
#include <sys/types.h>

#include "epd_secret.h"

/* Forks and execs argv[0] (an absolute path) with stdout and stderr into
 * `log`, UCX held to loopback unless the environment says otherwise; the
 * child's pid (-1: fork failed). */
pid_t epd_bench_spawn(char *const argv[], const char *log);
/* SIGTERM, then SIGKILL after 10 s; says (prefixed `who`) when daemon
 * `name` did not exit 0. */
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

#endif
