/*
 * epd_bench_fleet_int.h — what the two files of `epd-bench fleet` share:
 * the benchmark's state (fl_t) and one row of its table (fl_row_t).
 * epd_bench_fleet.c measures the router and prints the table (the main
 * thread); epd_bench_fleet_sim.c runs the simulated workers on the fleet
 * thread, which epd_bench_fleet.c asks to grow or stop.  Internal to
 * bench/.
 */
#ifndef EPD_BENCH_FLEET_INT_H
#define EPD_BENCH_FLEET_INT_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include <uv.h>

#include "epd_client.h"
#include "epd_registrar.h"
#include "epd_secret.h"
#include "epd_xport.h"
#include "epd_xport_uv.h"

#define FL_SIZES_MAX 8
#define FL_FLEET_MAX 10000
#define FL_STEP 100 /* workers started at once */

typedef struct {
    uint32_t size;
    uint32_t ready;         /* READY workers at the router (the real pair included) */
    double hb_per_s;        /* accepted heartbeats of the fleet per second */
    double hb_failed_per_s; /* refused or timed-out heartbeats per second */
    double cpu_idle;        /* router CPU ms per s, heartbeats only */
    double cpu_req;         /* router CPU ms per s, while requests run */
    double rss_mib;         /* router VmRSS after the window */
    double p50, p90, p99;   /* request latency, ms */
    uint32_t ok, failed;
    uint64_t strays; /* request-plane messages that reached a simulated worker */
} fl_row_t;

typedef struct {
    /* options */
    uint32_t sizes[FL_SIZES_MAX];
    int n_sizes;
    double idle_s;
    uint32_t requests;
    uint32_t max_tokens;
    const char *attach;
    const char *secret_path;
    const char *like; /* --attach: a worker whose layout the fleet copies */
    double hold_s;
    int keep;
    /* the cluster */
    char bindir[PATH_MAX];
    char tmp[PATH_MAX];
    char secret_file[PATH_MAX + 32];
    epd_secret_t secret;
    pid_t pids[3]; /* router, decode, prefill */
    char router_http[128], router_ctl[128], prefill_ctl[128], decode_ctl[128];
    char model_dir[PATH_MAX + 16];
    epd_client_worker_info_t layout; /* the real prefill's layout and capacity */
    /* the fleet thread */
    pthread_t thread;
    int thread_started;
    uv_loop_t loop;
    uv_async_t async;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t want; /* mu: the size asked for */
    uint32_t have; /* mu: registrars started */
    int stop;      /* mu: stop every registrar and the loop */
    int started;   /* mu: 1 once the transport is up, -1 when it failed */
    int failed;    /* mu: a registrar did not start */
    epd_xport_t *x;
    epd_xport_uv_t *xuv;
    const void *addr;
    size_t addr_len;
    epd_registrar_t **regs; /* [FL_FLEET_MAX] */
    _Atomic uint64_t strays;
    _Atomic uint64_t accepted;
    fl_row_t rows[FL_SIZES_MAX];
} fl_t;

/* ---- epd_bench_fleet_sim.c: the simulated workers (the fleet thread) ---- */
/* Starts the fleet thread (its loop and the one transport worker behind
 * every simulated worker).  0 or -1.  Main thread. */
int epd__fl_fleet_start(fl_t *b);
/* Stops every simulated worker and joins the fleet thread; a no-op when
 * it never started.  Main thread. */
void epd__fl_fleet_stop(fl_t *b);
/* Asks the fleet thread for `size` simulated workers and waits until they
 * were started (registration goes on in their threads).  0 or -1. */
int epd__fl_grow(fl_t *b, uint32_t size);
/* Accepted heartbeats of the whole fleet so far; failed ones (refused or
 * timed out) into *failed_p.  Any thread. */
uint64_t epd__fl_heartbeats(fl_t *b, uint64_t *failed_p);

#endif
