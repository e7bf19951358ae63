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

#endif
