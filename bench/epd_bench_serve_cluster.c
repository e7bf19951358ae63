/*
 * epd_bench_serve_cluster.c — `epd-bench serve`'s own cluster (router, one
 * prefill, one decode, and an encoder for the multimodal mix, from
 * build/bin, with a fresh cluster secret; the sim model written into a
 * temp folder unless --sim-model) and the router's /metrics, read before
 * and after a run (epd_bench_http.c).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "epd_alloc.h"
#include "epd_bench.h"
#include "epd_bench_http.h"
#include "epd_bench_serve_int.h"

/* The values of the router's `n` series `names` from GET /metrics
 * (5 s at most; before and after the run only): absent ones read 0, and
 * how many were there into *found_p.  0, or -1 when /metrics did not
 * answer. */
int epd__sv_metrics_get(const sv_t *b, const char *const *names, int n, double *out,
                        int *found_p)
{
    char *text = NULL;
    int found = 0;

    if (epd_bench_http_get(b->router, "/metrics", 5000, &text, NULL) != EPD_OK) {
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (epd_bench_metric(text, names[i], &out[i])) {
            found++;
        } else {
            out[i] = 0.0;
        }
    }
    epd_free(text);
    if (found_p != NULL) {
        *found_p = found;
    }
    return 0;
}

/* The router's epd_router_ttft_seconds _sum and _count.  0, or -1 when
 * /metrics did not answer or lacks them. */
int epd__sv_metrics_ttft(const sv_t *b, double *sum_p, uint64_t *count_p)
{
    static const char *const names[2] = {"epd_router_ttft_seconds_sum",
                                         "epd_router_ttft_seconds_count"};
    double v[2];
    int found = 0;

    if (epd__sv_metrics_get(b, names, 2, v, &found) != 0 || found != 2) {
        return -1;
    }
    *sum_p = v[0];
    *count_p = (uint64_t)v[1];
    return 0;
}

const char *const epd__sv_img_metrics[6] = {
    "epd_router_images_total",         "epd_router_image_cache_hits_total",
    "epd_router_images_encoded_total", "epd_router_images_local_total",
    "epd_router_image_cache_stale_total", "epd_router_retries_total",
};

/* ------------------------------------------------------------ the cluster */

static int sv_make_secret(sv_t *b)
{
    return epd_bench_make_secret(b->tmp, b->secret_file, sizeof(b->secret_file), &b->secret,
                                 "serve");
}

static int sv_wait_workers(const sv_t *b, const char *ctl, int want)
{
    return epd_bench_wait_workers(ctl, &b->secret, want);
}

int epd__sv_cluster_start(sv_t *b)
{
    char model[PATH_MAX + 16], rready[PATH_MAX + 16], pready[PATH_MAX + 16], dready[PATH_MAX + 16];
    char rlog[PATH_MAX + 16], plog[PATH_MAX + 16], dlog[PATH_MAX + 16];
    char rtrace[PATH_MAX + 16], ptrace[PATH_MAX + 16], dtrace[PATH_MAX + 16];
    char exe[PATH_MAX + 32], pexe[PATH_MAX + 32], dexe[PATH_MAX + 32];
    char pblocks[24], dblocks[24], chunk[24];
    /* a long prompt's blocks on top of the short prompts' pools, twice (a
     * second one may arrive while the first's blocks are still held) */
    uint64_t extra = b->long_every > 0 ? 2 * ((uint64_t)b->long_len / 16 + 2) : 0;

    snprintf(pblocks, sizeof(pblocks), "%llu", (unsigned long long)(8192 + extra));
    snprintf(dblocks, sizeof(dblocks), "%llu", (unsigned long long)(16384 + extra));
    snprintf(chunk, sizeof(chunk), "%lld", (long long)b->chunk_tokens);
    snprintf(b->tmp, sizeof(b->tmp), "/tmp/epd-serve.XXXXXX");
    if (mkdtemp(b->tmp) == NULL) {
        return -1;
    }
    if (sv_make_secret(b) != 0) {
        return -1;
    }
    if (b->sim_model != NULL) {
        snprintf(model, sizeof(model), "%s", b->sim_model);
    } else if (b->n_images > 0) {
        /* images: epd-mkmodel's default model (ref, with its vision encoder) */
        char mk[PATH_MAX + 32], mklog[PATH_MAX + 16];
        int status = 0;
        pid_t pid;

        snprintf(model, sizeof(model), "%s/vlm", b->tmp);
        snprintf(mk, sizeof(mk), "%s/epd-mkmodel", b->bindir);
        snprintf(mklog, sizeof(mklog), "%s/mkmodel.log", b->tmp);
        {
            char *argv[] = {mk, "--out", model, NULL};

            pid = epd_bench_spawn(argv, mklog);
        }
        if (pid < 0 || epd_bench_reap(pid, &status, 0) != pid || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0) {
            fprintf(stderr, "serve: epd-mkmodel failed (log: %s)\n", mklog);
            return -1;
        }
    } else {
        snprintf(model, sizeof(model), "%s/sim", b->tmp);
        /* long prompts: a context that holds them and their output */
        if (epd_bench_write_sim_ctx(model, b->long_len + 4096 > 4096
                                               ? (uint32_t)(b->long_len + 4096)
                                               : 4096) != 0) {
            fprintf(stderr, "serve: cannot write the sim model into %s\n", model);
            return -1;
        }
    }
    snprintf(b->model_buf, sizeof(b->model_buf), "%s", model);
    b->model_dir = b->model_buf;
    snprintf(rready, sizeof(rready), "%s/router.ready", b->tmp);
    snprintf(pready, sizeof(pready), "%s/prefill.ready", b->tmp);
    snprintf(dready, sizeof(dready), "%s/decode.ready", b->tmp);
    snprintf(rlog, sizeof(rlog), "%s/router.log", b->tmp);
    snprintf(plog, sizeof(plog), "%s/prefill.log", b->tmp);
    snprintf(dlog, sizeof(dlog), "%s/decode.log", b->tmp);
    if (b->trace_dir != NULL) {
        snprintf(rtrace, sizeof(rtrace), "%s/router.json", b->trace_dir);
        snprintf(ptrace, sizeof(ptrace), "%s/prefill.json", b->trace_dir);
        snprintf(dtrace, sizeof(dtrace), "%s/decode.json", b->trace_dir);
    }
    snprintf(exe, sizeof(exe), "%s/epd-router", b->bindir);
    snprintf(pexe, sizeof(pexe), "%s/epd-prefill", b->bindir);
    snprintf(dexe, sizeof(dexe), "%s/epd-decode", b->bindir);
    {
        char *argv[] = {exe,
                        "--listen",
                        "127.0.0.1:0",
                        "--control-addr",
                        "127.0.0.1:0",
                        "--model",
                        model,
                        "--engine",
                        (char *)b->engine_name,
                        "--served-model-name",
                        (char *)b->model_name,
                        "--ready-file",
                        rready,
                        "--cluster-secret-file",
                        b->secret_file,
                        /* every waiting request holds a connection from
                         * 127.0.0.1: no per-address cap */
                        "--max-connections-per-addr",
                        "0",
                        "--log-level",
                        "warn",
                        NULL,
                        NULL,
                        NULL};

        if (b->trace_dir != NULL) {
            argv[19] = "--trace";
            argv[20] = rtrace;
        }
        b->pids[0] = epd_bench_spawn(argv, rlog);
    }
    if (b->pids[0] < 0 ||
        epd_bench_wait_ready(rready, b->pids[0], "http", b->router_buf, sizeof(b->router_buf)) != 0 ||
        epd_bench_wait_ready(rready, b->pids[0], "control", b->router_ctl_buf,
                      sizeof(b->router_ctl_buf)) != 0) {
        fprintf(stderr, "serve: the router did not start (log: %s)\n", rlog);
        return -1;
    }
    b->router = b->router_buf;
    b->router_ctl = b->router_ctl_buf;
    {
        char *argv[] = {dexe,
                        "--model",
                        model,
                        "--engine",
                        (char *)b->engine_name,
                        "--worker-id",
                        "decode-0",
                        "--router",
                        b->router_ctl_buf,
                        "--ready-file",
                        dready,
                        "--kv-blocks",
                        dblocks,
                        "--max-batch",
                        "256",
                        "--state-slots",
                        "1024",
                        "--cluster-secret-file",
                        b->secret_file,
                        "--log-level",
                        "warn",
                        NULL,
                        NULL,
                        NULL};

        if (b->trace_dir != NULL) {
            argv[21] = "--trace";
            argv[22] = dtrace;
        }
        b->pids[1] = epd_bench_spawn(argv, dlog);
    }
    {
        char *argv[] = {
            pexe,          "--model",     model,      "--engine",        (char *)b->engine_name,
            "--worker-id", "prefill-0",   "--router", b->router_ctl_buf, "--ready-file",
            pready,        "--kv-blocks", pblocks,    "--state-slots",   "512",
            "--cluster-secret-file", b->secret_file,
            "--log-level", "warn",        NULL, NULL, NULL, NULL, NULL, NULL};
        int n = 19;

        if (b->chunk_tokens >= 0) {
            argv[n++] = "--prefill-chunk-tokens";
            argv[n++] = chunk;
        }
        if (b->no_prefix_cache) {
            argv[n++] = "--no-prefix-cache";
        }
        if (b->trace_dir != NULL) {
            argv[n++] = "--trace";
            argv[n++] = ptrace;
        }

        b->pids[2] = epd_bench_spawn(argv, plog);
    }
    if (b->pids[1] < 0 || b->pids[2] < 0 ||
        epd_bench_wait_ready(dready, b->pids[1], "control", b->d_ctl_buf, sizeof(b->d_ctl_buf)) != 0 ||
        epd_bench_wait_ready(pready, b->pids[2], "control", b->p_ctl_buf, sizeof(b->p_ctl_buf)) != 0) {
        fprintf(stderr, "serve: a worker did not start (logs: %s, %s)\n", plog, dlog);
        return -1;
    }
    b->prefill_ctl = b->p_ctl_buf;
    b->decode_ctl = b->d_ctl_buf;
    if (b->n_images > 0) {
        char eexe[PATH_MAX + 32], eready[PATH_MAX + 16], elog[PATH_MAX + 16];

        snprintf(eexe, sizeof(eexe), "%s/epd-encoder", b->bindir);
        snprintf(eready, sizeof(eready), "%s/encoder.ready", b->tmp);
        snprintf(elog, sizeof(elog), "%s/encoder.log", b->tmp);
        {
            char *argv[] = {eexe,        "--model",     model,      "--engine",
                            (char *)b->engine_name,     "--worker-id", "encoder-0",
                            "--router",  b->router_ctl_buf,         "--ready-file",
                            eready,      "--cluster-secret-file",   b->secret_file,
                            "--log-level", "warn",     NULL};

            b->pids[3] = epd_bench_spawn(argv, elog);
        }
        if (b->pids[3] < 0 ||
            epd_bench_wait_ready(eready, b->pids[3], "control", b->enc_ctl_buf,
                          sizeof(b->enc_ctl_buf)) != 0) {
            fprintf(stderr, "serve: the encoder did not start (log: %s)\n", elog);
            return -1;
        }
    }
    if (sv_wait_workers(b, b->router_ctl, b->n_images > 0 ? 3 : 2) != 0) {
        fprintf(stderr, "serve: the workers did not become READY at the router (logs in %s)\n",
                b->tmp);
        return -1;
    }
    fprintf(stderr, "serve: cluster up: router http=%s control=%s, prefill %s, decode %s (%s)\n",
            b->router, b->router_ctl, b->prefill_ctl, b->decode_ctl, b->tmp);
    return 0;
}

void epd__sv_cluster_stop(sv_t *b)
{
    static const char *const names[4] = {"router", "decode", "prefill", "encoder"};

    for (int i = 3; i >= 0; i--) {
        epd_bench_kill(b->pids[i], "serve", names[i]);
        b->pids[i] = 0;
    }
}
