/*
 * epd_bench_stats.c — the statistics every epd-bench table uses: sort,
 * percentile (nearest rank), median and its distribution-free interval,
 * and a process's CPU time from /proc.  One definition of each, so two
 * tables that both say "p99" mean the same thing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "epd_bench.h"

int epd_bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

void epd_bench_sort(double *v, size_t n)
{
    if (n > 1) {
        qsort(v, n, sizeof(*v), epd_bench_cmp_double);
    }
}

double epd_bench_pct(const double *sorted, size_t n, double p)
{
    size_t i;

    if (n == 0) {
        return NAN;
    }
    if (p <= 0.0) {
        return sorted[0];
    }
    i = (size_t)ceil(p / 100.0 * (double)n);
    i = i == 0 ? 0 : i - 1;
    return sorted[i < n ? i : n - 1];
}

double epd_bench_median(double *v, size_t n)
{
    if (n == 0) {
        return NAN;
    }
    epd_bench_sort(v, n);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void epd_bench_median_ci(const double *sorted, size_t n, double *lo_p, double *hi_p)
{
    double cdf = 0.0, p = pow(0.5, (double)n); /* P(X = 0) */
    size_t k = 0;

    for (size_t j = 0; j < n; j++) {
        cdf += p; /* P(X <= j) */
        if (cdf > 0.025) {
            break;
        }
        k = j + 1; /* P(X < k) = P(X <= j) <= 0.025 */
        p = p * (double)(n - j) / (double)(j + 1);
    }
    if (k < 1) {
        *lo_p = *hi_p = NAN;
        return;
    }
    *lo_p = sorted[k - 1];
    *hi_p = sorted[n - k];
}

int epd_bench_cpu_ns(pid_t pid, uint64_t *ns_p)
{
    char path[64], buf[2048], *p;
    unsigned long long ut = 0, st = 0;
    long hz = sysconf(_SC_CLK_TCK);
    FILE *f;
    size_t n;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    p = strrchr(buf, ')'); /* the command may hold spaces */
    if (p == NULL || hz <= 0 ||
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2) {
        return -1;
    }
    *ns_p = (ut + st) * (1000000000ull / (unsigned long long)hz);
    return 0;
}
