/*
 * epd_bench_overhead_cpu.c — the per-thread host CPU of `epd-bench
 * overhead`'s own daemons: /proc/PID/task/TID/schedstat sampled before and
 * after each request, what each thread ran in between added to its row and
 * arm, and the row's "cpu ms/req" line.  One-host mode only (the attach
 * mode cannot see the daemons' /proc).  The benchmark's thread.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_bench_overhead_int.h"

/* Reads every thread of `pid`: its name and CPU time so far (ns). */
static int ob_cpu_read(pid_t pid, ob_task_t *out, int cap)
{
    char path[128];
    DIR *dir;
    struct dirent *de;
    int n = 0;

    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    dir = opendir(path);
    if (dir == NULL) {
        return 0;
    }
    while ((de = readdir(dir)) != NULL && n < cap) {
        char p2[512], comm[32] = "?";
        unsigned long long run = 0;
        FILE *f;

        if (de->d_name[0] == '.') {
            continue;
        }
        snprintf(p2, sizeof(p2), "%s/%s/schedstat", path, de->d_name);
        f = fopen(p2, "r");
        if (f == NULL) {
            continue;
        }
        if (fscanf(f, "%llu", &run) != 1) {
            run = 0;
        }
        fclose(f);
        snprintf(p2, sizeof(p2), "%s/%s/comm", path, de->d_name);
        f = fopen(p2, "r");
        if (f != NULL) {
            if (fgets(comm, sizeof(comm), f) == NULL) {
                snprintf(comm, sizeof(comm), "?");
            }
            fclose(f);
            comm[strcspn(comm, "\n")] = '\0';
        }
        out[n].tid = atoi(de->d_name);
        snprintf(out[n].name, sizeof(out[n].name), "%s", comm);
        out[n].ns = (double)run;
        n++;
    }
    closedir(dir);
    return n;
}

/* Adds what each thread of daemon `which` (0 prefill, 1 decode) ran since
 * the last sample to row `li`, arm `arm` (arm < 0: only take the sample). */
void epd__ob_cpu_account(ob_t *b, int which, int li, int arm)
{
    ob_task_t now[OB_MAX_THREADS];
    int n = ob_cpu_read(which == 0 ? b->pid_p : b->pid_d, now, OB_MAX_THREADS);

    for (int i = 0; i < n && arm >= 0; i++) {
        double before = 0.0;
        char name[32];
        int k;

        for (int j = 0; j < b->n_tasks[which]; j++) {
            if (b->tasks[which][j].tid == now[i].tid) {
                before = b->tasks[which][j].ns;
                break;
            }
        }
        if (now[i].ns <= before) {
            continue;
        }
        /* the main thread is the daemon's loop; threads that inherit its
         * name are a library's (OpenBLAS's, UCX's) */
        snprintf(name, sizeof(name), "%c:%.28s", which == 0 ? 'p' : 'd',
                 now[i].tid == (which == 0 ? b->pid_p : b->pid_d) ? "loop" : now[i].name);
        for (k = 0; k < b->n_cpu[li]; k++) {
            if (strcmp(b->cpu_tab[li][k].name, name) == 0) {
                break;
            }
        }
        if (k == b->n_cpu[li]) {
            if (k == OB_MAX_THREADS) {
                continue;
            }
            memset(&b->cpu_tab[li][k], 0, sizeof(b->cpu_tab[li][k]));
            snprintf(b->cpu_tab[li][k].name, sizeof(b->cpu_tab[li][k].name), "%s", name);
            b->n_cpu[li]++;
        }
        b->cpu_tab[li][k].ns[arm] += now[i].ns - before;
    }
    memcpy(b->tasks[which], now, sizeof(now[0]) * (size_t)n);
    b->n_tasks[which] = n;
}

/* Host CPU per request of each thread and arm, for row li. */
void epd__ob_print_cpu(const ob_t *b, int li)
{
    if (!b->cpu || b->tsv || b->n_cpu[li] == 0) {
        return;
    }
    printf("%-28s cpu ms/req", "");
    for (int arm = 0; arm < OB_ARMS; arm++) {
        int n = b->cpu_reqs[li][arm];
        double total = 0.0;

        if (n == 0) {
            continue;
        }
        for (int k = 0; k < b->n_cpu[li]; k++) {
            total += b->cpu_tab[li][k].ns[arm];
        }
        printf("  %s %.2f:", ob_arm_name(arm), total / n / 1e6);
        for (int k = 0; k < b->n_cpu[li]; k++) {
            double v = b->cpu_tab[li][k].ns[arm] / n / 1e6;

            if (v >= 0.005) {
                printf(" %s %.2f", b->cpu_tab[li][k].name, v);
            }
        }
    }
    printf("\n");
}
