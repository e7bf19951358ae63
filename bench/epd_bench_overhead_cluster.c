/*
 * epd_bench_overhead_cluster.c — one configuration of `epd-bench overhead`
 * in the one-host mode: the engine's model (a sim.conf, or a small ref
 * model made once), its KV layout and timing, a prefill and a decode daemon
 * started with --trace on that engine, transport and KV dtype map
 * (epd_bench_spawn_ex, the transport's environment), the client transport
 * connected to both, every length's arms run in rotating order, the
 * daemons stopped (their traces are written at exit) and read, the rows
 * printed.  The benchmark's thread.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "epd_alloc.h"
#include "epd_bench.h"
#include "epd_bench_overhead_int.h"
#include "epd_client.h"
#include "epd_engine.h"
#include "epd_kvq.h"
#include "epd_msg.h"
#include "epd_rng.h"
#include "epd_sim.h"
#include "epd_time.h"
#include "epd_xport.h"

static void ob_group_name(long long g, char *buf, size_t cap)
{
    if (g == OB_GROUP_DEFAULT) {
        snprintf(buf, cap, "default");
    } else if (g == 0) {
        snprintf(buf, cap, "per-layer");
    } else if (g % (1 << 20) == 0) {
        snprintf(buf, cap, "%lldM", g >> 20);
    } else if (g % 1024 == 0) {
        snprintf(buf, cap, "%lldK", g >> 10);
    } else {
        snprintf(buf, cap, "%lld", g);
    }
}

static int ob_model_dir(ob_t *b, const ob_engine_t *e, char *dir, size_t cap)
{
    if (e->profile == NULL) {
        if (b->ref_model != NULL) {
            snprintf(dir, cap, "%s", b->ref_model);
            return 0;
        }
        snprintf(dir, cap, "%s/ref-model", b->tmp);
        if (access(dir, F_OK) != 0) {
            char cmd[PATH_MAX * 2 + 128];

            /* small enough for a 2-core machine: 8 layers LLA, dim 256 */
            snprintf(cmd, sizeof(cmd), "'%s/epd-mkmodel' --out '%s' --max-context %u >/dev/null",
                     b->bindir, dir, (unsigned)OB_REF_MAX_CONTEXT);
            if (system(cmd) != 0) {
                fprintf(stderr, "overhead: epd-mkmodel failed\n");
                return -1;
            }
        }
        return 0;
    } else {
        epd_sim_options_t o;
        char model[PATH_MAX], accel[PATH_MAX];
        epd_status_t st;

        snprintf(dir, cap, "%s/sim-%s-%g", b->tmp, e->name, b->scale > 0.0 ? b->scale : e->scale);
        snprintf(model, sizeof(model), "%s/%s", b->profiles, e->profile);
        snprintf(accel, sizeof(accel), "%s/%s", b->profiles, e->accel);
        memset(&o, 0, sizeof(o));
        o.model = model;
        o.accel = accel;
        o.scale = b->scale > 0.0 ? b->scale : e->scale;
        o.devices = e->devices;
        o.mode = EPD_SIM_SLEEP;
        o.seed = 1;
        o.vocab = 4096; /* the logits of step 0 are not what is measured */
        st = epd_sim_conf_write(dir, &o);
        if (st != EPD_OK) {
            fprintf(stderr, "overhead: sim.conf for %s from %s: %s\n", e->name, b->profiles,
                    epd_status_string(st));
            return -1;
        }
        return 0;
    }
}

/* The engine's KV layout (bytes per layer) and, for sim, its timing, with
 * KV dtype map `kvd` (NULL: the engine's own dtype). */
static int ob_engine_facts(ob_t *b, const ob_engine_t *e, const char *model, const char *kvd)
{
    epd_engine_config_t cfg = {
        .model_dir = model, .block_tokens = OB_BLOCK_TOKENS, .kv_dtype = kvd};
    epd_engine_t *eng = NULL;

    if (epd_engine_open(e->profile != NULL ? "sim" : "ref", &cfg, &eng) != EPD_OK) {
        fprintf(stderr, "overhead: cannot open engine %s from %s\n", e->name, model);
        return -1;
    }
    b->kv = epd_engine_info(eng)->kv;
    epd_engine_close(eng);
    epd_kvq_map_format(&b->kv, b->kv_name, sizeof(b->kv_name));
    b->have_timing = 0;
    if (e->profile != NULL) {
        epd_sim_conf_t conf;

        if (epd_sim_conf_load(model, &conf) != EPD_OK) {
            return -1;
        }
        if (kvd != NULL) {
            /* as the engine: --kv-dtype wins over sim.conf (the engine above
             * accepted it, so it fits) */
            snprintf(conf.kv_dtype_map, sizeof(conf.kv_dtype_map), "%s", kvd);
        }
        if (epd_sim_timing_init(&conf, OB_BLOCK_TOKENS, &b->timing) != EPD_OK) {
            return -1;
        }
        b->have_timing = 1;
    }
    return 0;
}

int epd__ob_config(ob_t *b, const ob_engine_t *e, const ob_xport_t *xp, long long group,
                   const char *kvd, const uint32_t *lengths, int n_lengths)
{
    char model[PATH_MAX], p_ready[PATH_MAX], d_ready[PATH_MAX], p_trace[PATH_MAX],
        d_trace[PATH_MAX], p_log[PATH_MAX], d_log[PATH_MAX], p_ctl[128], d_ctl[128];
    char p_who[PATH_MAX + 32], d_who[PATH_MAX + 32]; /* in epd_bench_stop's lines */
    char pexe[PATH_MAX], dexe[PATH_MAX], gbuf[32], kvb_p[32], kvb_d[32], gname[32], cbuf[16];
    int arms[OB_ARMS] = {OB_ARM_A, OB_ARM_B, OB_ARM_Z};
    int n_arms = b->zero ? 3 : 2;
    uint32_t max_len = 0;
    pid_t pp = -1, pd = -1;
    epd_xport_config_t xc;
    json_t *pj = NULL, *dj = NULL;
    epd_rng_t rng;
    uint32_t *tokens = NULL;
    uint64_t trace_id = 0;
    int rc = -1;

    for (int i = 0; i < n_lengths; i++) {
        max_len = lengths[i] > max_len ? lengths[i] : max_len;
    }
    if (ob_model_dir(b, e, model, sizeof(model)) != 0 ||
        ob_engine_facts(b, e, model, kvd) != 0) {
        return -1;
    }
    memset(b->n_cpu, 0, sizeof(b->n_cpu));
    memset(b->cpu_reqs, 0, sizeof(b->cpu_reqs));
    memset(b->n_tasks, 0, sizeof(b->n_tasks));
    ob_group_name(group, gname, sizeof(gname));
    snprintf(p_ready, sizeof(p_ready), "%s/p.ready", b->tmp);
    snprintf(d_ready, sizeof(d_ready), "%s/d.ready", b->tmp);
    snprintf(p_trace, sizeof(p_trace), "%s/p.json", b->tmp);
    snprintf(d_trace, sizeof(d_trace), "%s/d.json", b->tmp);
    /* numbered: one per configuration, KV dtype maps included */
    b->n_configs++;
    snprintf(p_log, sizeof(p_log), "%s/p-%s-%s-%s-%d.log", b->tmp, e->name, xp->name, gname,
             b->n_configs);
    snprintf(d_log, sizeof(d_log), "%s/d-%s-%s-%s-%d.log", b->tmp, e->name, xp->name, gname,
             b->n_configs);
    snprintf(p_who, sizeof(p_who), "epd-prefill (log %s)", p_log);
    snprintf(d_who, sizeof(d_who), "epd-decode (log %s)", d_log);
    unlink(p_ready);
    unlink(d_ready);
    unlink(p_trace);
    unlink(d_trace);
    snprintf(pexe, sizeof(pexe), "%s/epd-prefill", b->bindir);
    snprintf(dexe, sizeof(dexe), "%s/epd-decode", b->bindir);
    /* prefill frees a request's blocks only after its last write completed
     * and the compute thread released it, which may be after decode already
     * answered: room for three prompts */
    snprintf(kvb_p, sizeof(kvb_p), "%u", 3 * (max_len / OB_BLOCK_TOKENS + 1) + 8);
    /* decode admits a prompt (KV on demand) only while its blocks plus a
     * watermark of 1% of the pool stay free (epd__decode_kv_may_admit):
     * the prompt, 16 blocks of headroom and growth, and 2% on top (a 32k
     * prompt found 2,064 blocks too few: 2,049 + 20 wanted) */
    {
        uint32_t d_blocks = max_len / OB_BLOCK_TOKENS + 16;

        snprintf(kvb_d, sizeof(kvb_d), "%u", d_blocks + d_blocks / 50 + 1);
    }
    snprintf(gbuf, sizeof(gbuf), "%lld", group);
    {
        char *dargv[48], *pargv[48];
        int n = 0;

        dargv[n++] = dexe;
        dargv[n++] = "--engine";
        dargv[n++] = e->profile != NULL ? "sim" : "ref";
        dargv[n++] = "--model";
        dargv[n++] = model;
        dargv[n++] = "--transport";
        dargv[n++] = (char *)xp->backend;
        dargv[n++] = "--worker-id";
        dargv[n++] = "bench-decode";
        dargv[n++] = "--ready-file";
        dargv[n++] = d_ready;
        dargv[n++] = "--trace";
        dargv[n++] = d_trace;
        dargv[n++] = "--kv-blocks";
        dargv[n++] = kvb_d;
        dargv[n++] = "--state-slots";
        dargv[n++] = "8";
        dargv[n++] = "--lease-ms";
        dargv[n++] = "60000";
        dargv[n++] = "--peer-timeout-ms";
        dargv[n++] = "30000";
        dargv[n++] = "--log-level";
        dargv[n++] = getenv("EPD_BENCH_LOG_LEVEL") != NULL ? getenv("EPD_BENCH_LOG_LEVEL") : "warn";
        dargv[n++] = "--cluster-secret-file";
        dargv[n++] = b->secret_file;
        if (xp->provider != NULL) {
            dargv[n++] = "--provider";
            dargv[n++] = (char *)xp->provider;
        }
        if (kvd != NULL) {
            dargv[n++] = "--kv-dtype";
            dargv[n++] = (char *)kvd;
        }
        dargv[n] = NULL;
        /* prefill takes the same flags, then its own */
        for (int i = 0; i <= n; i++) {
            pargv[i] = dargv[i];
        }
        pargv[0] = pexe;
        pargv[8] = "bench-prefill";
        pargv[10] = p_ready;
        pargv[12] = p_trace;
        pargv[14] = kvb_p;
        /* every arm computes its whole prompt: the prefix cache (on by
         * default) would let repeated prompts skip their compute */
        pargv[n++] = "--no-prefix-cache";
        pargv[n] = NULL;
        if (group != OB_GROUP_DEFAULT) {
            pargv[n++] = "--write-group-bytes";
            pargv[n++] = gbuf;
            pargv[n] = NULL;
        }
        if (b->chunk_tokens >= 0) {
            /* long prompts: chunked prefill streams each chunk's KV as it
             * is made (docs/long-context.md); absent, the engine's default */
            snprintf(cbuf, sizeof(cbuf), "%d", b->chunk_tokens);
            pargv[n++] = "--prefill-chunk-tokens";
            pargv[n++] = cbuf;
            pargv[n] = NULL;
        }
        /* decode's own */
        n = 0;
        while (dargv[n] != NULL) {
            n++;
        }
        dargv[n++] = "--max-batch";
        dargv[n++] = "4";
        dargv[n++] = "--verify";
        dargv[n++] = (char *)b->verify;
        dargv[n] = NULL;
        /* ref runs OpenBLAS on one thread (epd_ref.c); without this its
         * library still starts idle worker threads at load */
        {
            static const char *const blas[] = {"OPENBLAS_NUM_THREADS=1", NULL};
            epd_bench_spawn_t how = {
                .log = d_log, .out_fd = -1, .env_default = blas, .env = xp->env};

            pd = epd_bench_spawn_ex(dargv, &how);
            how.log = p_log;
            pp = epd_bench_spawn_ex(pargv, &how);
        }
    }
    b->pid_p = pp;
    b->pid_d = pd;
    if (pd < 0 || pp < 0 ||
        epd_bench_wait_ready(d_ready, pd, "control", d_ctl, sizeof(d_ctl)) != 0 ||
        epd_bench_wait_ready(p_ready, pp, "control", p_ctl, sizeof(p_ctl)) != 0) {
        fprintf(stderr, "overhead: daemons did not start (logs: %s, %s)\n", p_log, d_log);
        goto out;
    }
    {
        char err[256];

        if (epd_client_health(p_ctl, 10000, &b->pi, err, sizeof(err)) != EPD_OK ||
            epd_client_health(d_ctl, 10000, &b->di, err, sizeof(err)) != EPD_OK) {
            fprintf(stderr, "overhead: Health: %s\n", err);
            goto out;
        }
    }
    /* the client transport reads them at its start, as the daemons did */
    epd_bench_setenv(xp->env, 1);
    epd_xport_config_init(&xc);
    xc.backend = xp->backend;
    xc.provider = xp->provider;
    xc.max_msg_size = epd_msg_cap_for_context(max_len); /* the prompt travels whole */
    xc.peer_timeout_ms = 60000;
    xc.connect_timeout_ms = 10000;
    xc.msg_cb = epd__ob_on_msg;
    xc.err_cb = epd__ob_on_err;
    xc.cb_arg = b;
    xc.secret = b->secret.bytes;
    xc.secret_len = b->secret.len;
    snprintf(xc.identity.worker_id, sizeof(xc.identity.worker_id), "bench-overhead-%d",
             (int)getpid());
    xc.identity.role = EPD_CLIENT_ROLE_TOOL;
    xc.identity.epoch.start_time_ns = b->epoch_start;
    xc.identity.epoch.nonce = b->epoch_nonce;
    if (epd_xport_create(&xc, &b->x) != EPD_OK) {
        fprintf(stderr, "overhead: cannot start the client transport %s\n", xp->name);
        goto out;
    }
    b->n_connected = 0;
    b->connect_failed = 0;
    if (epd_xport_connect(b->x, b->pi.address, b->pi.address_len, epd__ob_on_connect, b,
                          &b->ep_p) != EPD_INPROGRESS ||
        epd_xport_connect(b->x, b->di.address, b->di.address_len, epd__ob_on_connect, b,
                          &b->ep_d) != EPD_INPROGRESS) {
        fprintf(stderr, "overhead: cannot connect to the daemons\n");
        goto out;
    }
    {
        uint64_t end = epd_time_now_ns() + 15ull * 1000000000ull;

        while (b->n_connected < 2 && !b->connect_failed && epd_time_now_ns() < end) {
            epd_xport_poll(b->x, 5);
        }
    }
    if (b->n_connected < 2) {
        fprintf(stderr, "overhead: connecting to the daemons failed\n");
        goto out;
    }

    tokens = epd_malloc(sizeof(*tokens) * (max_len + 1));
    if (tokens == NULL) {
        goto out;
    }
    epd_rng_seed(&rng, 42);
    epd__ob_free_reqs(b);
    for (int li = 0; li < n_lengths; li++) {
        uint32_t len = lengths[li];
        int reps = e->profile == NULL ? b->reps_ref : len >= 16384 ? b->reps_long : b->reps;

        tokens[0] = 256; /* BOS of the byte tokenizer; an ordinary id for sim */
        for (uint32_t t = 1; t < len; t++) {
            /* below 128: one varint byte each, so 32k tokens fit a 64 KiB message */
            tokens[t] = 1 + (uint32_t)(epd_rng_next(&rng) % 127);
        }
        for (int w = 0; w < b->warmup; w++) {
            for (int k = 0; k < n_arms; k++) {
                if (epd__ob_request(b, tokens, len, arms[k], -1, 1, li) != 0) {
                    goto out;
                }
            }
        }
        /* each repetition runs every arm once, in rotating order, so that
         * no arm always goes first (or always follows the same one) */
        for (int r = 0; r < reps; r++) {
            for (int k = 0; k < n_arms; k++) {
                int arm = arms[(k + r) % n_arms];

                if (epd__ob_request(b, tokens, len, arm, li * 100000 + r, 0, li) != 0) {
                    goto out;
                }
                if (arm == OB_ARM_B && (len == b->trace_len || trace_id == 0)) {
                    trace_id = b->reqs[b->n_reqs - 1].id;
                }
            }
        }
    }
    rc = 0;
out:
    epd_free(tokens);
    if (b->x != NULL) {
        epd_xport_ep_close(b->ep_p);
        epd_xport_ep_close(b->ep_d);
        epd_xport_destroy(b->x);
        b->x = NULL;
        b->ep_p = b->ep_d = NULL;
    }
    /* 30 s each: the trace is written at exit; a daemon that did not exit
     * 0 (under a sanitizer: a report) fails the configuration */
    if (epd_bench_stop(pp, 30000, "overhead", p_who) != 0) {
        rc = -1;
    }
    if (epd_bench_stop(pd, 30000, "overhead", d_who) != 0) {
        rc = -1;
    }
    if (rc != 0) {
        epd__ob_free_reqs(b);
        return rc;
    }
    pj = epd__ob_read_trace(b, p_trace, 0);
    dj = epd__ob_read_trace(b, d_trace, 1);
    if (pj == NULL || dj == NULL) {
        json_decref(pj);
        json_decref(dj);
        epd__ob_free_reqs(b);
        return -1;
    }
    for (int i = 0; i < b->n_reqs; i++) {
        ob_req_t *r = &b->reqs[i];

        r->ok = r->p_recv > 0 && r->c_end > 0 && r->c_start > 0 &&
                (r->arm == OB_ARM_A || r->d_held > 0);
    }
    if (b->trace_out != NULL && !b->trace_written && trace_id != 0) {
        if (epd__ob_write_merged(b->trace_out, pj, dj, trace_id) == 0) {
            ob_req_t *r = epd__ob_find(b, trace_id);

            printf("# trace of request %llu (%s, %s, %u tokens, KV %s, %s, prefill + transfer) -> "
                   "%s\n",
                   (unsigned long long)trace_id, e->name, xp->name, r != NULL ? r->n_tokens : 0,
                   b->kv_name, gname, b->trace_out);
            b->trace_written = 1;
        } else {
            fprintf(stderr, "overhead: cannot write %s\n", b->trace_out);
        }
    }
    json_decref(pj);
    json_decref(dj);

    for (int li = 0; li < n_lengths; li++) {
        ob_row_t row;

        epd__ob_row(b, lengths[li], &row);
        epd__ob_print_row(b, e, xp, lengths[li], &row);
        epd__ob_print_cpu(b, li);
        fflush(stdout);
    }
    epd__ob_free_reqs(b);
    return 0;
}
