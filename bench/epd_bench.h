/* epd_bench.h — the subcommands of epd-bench.  Each takes argv with
 * argv[0] = the subcommand name, prints its table to stdout and returns the
 * process exit status. */
#ifndef EPD_BENCH_H
#define EPD_BENCH_H

int epd_bench_engine_main(int argc, char **argv);
int epd_bench_xfer_main(int argc, char **argv);
int epd_bench_overhead_main(int argc, char **argv);
int epd_bench_serve_main(int argc, char **argv);
int epd_bench_fleet_main(int argc, char **argv);
/* `serve --workload shared-prefix` (epd_bench_prefix.c) */
int epd_bench_prefix_main(int argc, char **argv);

/* Process helpers of the serving benchmarks (epd_bench_serve.c): starts
 * argv[0] with stdout and stderr into `log` (UCX on loopback unless set);
 * stops a daemon (SIGTERM, SIGKILL after 10 s; a bad exit is reported);
 * waits (120 s) for `path` to hold `key=VALUE` and copies VALUE; the
 * folder of the running epd-bench (build/bin). */
#include <stddef.h>
#include <sys/types.h>
pid_t epd_bench_spawn(char *const argv[], const char *log);
void epd_bench_kill(pid_t pid, const char *name);
int epd_bench_wait_ready(const char *path, pid_t pid, const char *key, char *out, size_t cap);
int epd_bench_bindir(char *out, size_t cap);

#endif
