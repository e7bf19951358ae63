/*
 * epd_bench_main.c — `epd-bench SUBCOMMAND [options]`: one binary for every
 * benchmark, each subcommand in its own file (bench/epd_bench_<name>.c).
 * Benchmarks measure and print tables; they never judge (that is tests/).
 */
#include <stdio.h>
#include <string.h>

#include "epd_bench.h"
#include "epd_bench_overhead_int.h"

/* overhead on one host (epd_bench_overhead.c), or against running daemons
 * (epd_bench_overhead_attach.c, which uses the first's table and traces):
 * chosen here so that neither file calls the other back */
static int epd_bench_overhead_entry(int argc, char **argv)
{
    if (epd__ob_attach_wanted(argc, argv)) {
        return epd__ob_attach_main(argc, argv);
    }
    return epd_bench_overhead_main(argc, argv);
}

static const struct {
    const char *name;
    int (*main)(int argc, char **argv);
    const char *help;
} epd_bench_commands[] = {
    {"engine", epd_bench_engine_main, "prefill and decode tokens/s of an engine"},
    {"xfer", epd_bench_xfer_main, "transport write bandwidth and message latency vs ucx_perftest / fi_pingpong"},
    {"overhead", epd_bench_overhead_entry,
     "prefill-only vs prefill + KV transfer (interleaved A/B), TTFT breakdown from daemon traces"},
    {"serve", epd_bench_serve_main,
     "serving load through the router (Poisson arrivals): TTFT, ITL, E2E, errors; router vs direct"},
    {"burst", epd_bench_burst_main,
     "a burst of requests at once: decode KV up front vs on demand (goodput, 429s, preemptions)"},
    {"fleet", epd_bench_fleet_main,
     "the router's CPU, memory and added latency while it holds 10, 100, 1,000 heartbeating workers"},
    {"kvtier", epd_bench_kvtier_main,
     "zstd ratio and MB/s on the ref engine's KV blocks (levels x byte-plane shuffles), the tier's cost per block"},
    {"kvq", epd_bench_kvq_main,
     "quantized KV (--kv-dtype): top-1 agreement and KL vs f32 KV, bytes per request, per dtype"},
    {"soak", epd_bench_soak_main,
     "requests through a cluster under transport faults, stalls, kills and aborts: every answer checked"},
};

static void epd_bench_usage(FILE *out)
{
    fprintf(out, "usage: epd-bench SUBCOMMAND [options]   (SUBCOMMAND --help for its options)\n\n");
    for (size_t i = 0; i < sizeof(epd_bench_commands) / sizeof(epd_bench_commands[0]); i++) {
        fprintf(out, "  %-10s %s\n", epd_bench_commands[i].name, epd_bench_commands[i].help);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        epd_bench_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof(epd_bench_commands) / sizeof(epd_bench_commands[0]); i++) {
        if (strcmp(argv[1], epd_bench_commands[i].name) == 0) {
            return epd_bench_commands[i].main(argc - 1, argv + 1);
        }
    }
    fprintf(stderr, "epd-bench: unknown subcommand '%s'\n", argv[1]);
    epd_bench_usage(stderr);
    return 2;
}
