/*
 * epd_bench_overhead.c — `epd-bench overhead`: what disaggregation costs,
 * beside what physics makes it cost.
 *
 * For each engine (sim profiles in sleep mode, the ref CPU model), each
 * transport and each prompt length, one epd-prefill and one epd-decode
 * daemon are started (with --trace), and the same prefill daemon serves,
 * one request at a time, in rotating order within each repetition:
 *
 *   A  prefill only: GenerateRequest{prefill_only} to prefill alone; it
 *      computes every layer exactly as usual, writes nothing, and answers
 *      with the first token;
 *   B  prefill + KV transfer: the same GenerateRequest to decode and
 *      prefill (proto/README.md); prefill streams each layer's KV into
 *      decode's reservation as it exists, decode checks it;
 *   Z  the protocol without the data (GenerateRequest{protocol_only}): the
 *      reservation, every LayerDone and the PrefillComplete, no write, no
 *      check — what the messages alone cost.
 *
 * Every time is read from the daemons' own traces (CLOCK_MONOTONIC, shared
 * by the processes of one host), parsed after the daemons exit:
 *
 *   t0        prefill's "GenerateRequest received" (its loop thread)
 *   A_i       t0 -> prefill's compute done (the "prefill" span's end: every
 *             layer and the first token sampled, compute thread)
 *   B_i, Z_i  t0 -> decode's "KV held" (PrefillComplete received and every
 *             layer checked)
 *   d_i       B_i - A_i of the same repetition (paired: the machine's load
 *             moves both alike); the row's overhead is median(d) /
 *             median(A), with a distribution-free 95% interval of the
 *             median of d (order statistics of the binomial)
 *   msg       the message latency: LayerDone "sent" (prefill) -> "received"
 *             (decode) in the Z requests (no write to wait for), median
 *   link      the bandwidth the KV moved at: the bytes of a B request over
 *             the union of its "KV write" spans (prefill traces one per
 *             busy episode of a layer's writes: one per layer unchunked,
 *             about one per chunk and layer chunked), median over the B
 *             requests
 *   floor     the least B - A that this link and this compute allow, per B
 *             request from its own trace (the row's message latency): a
 *             chunk's layer l exists at moment t (the end of its "compute"
 *             span: the engine's sink); each write episode belongs to the
 *             last moment of its layer at or before its first post; a link
 *             that is never idle while bytes wait, moving each stretch of
 *             bytes as fast as it moved them, finishes by max_t (t + the
 *             union of the episodes of moment t and later) — never later
 *             than the writes did, so the floor never exceeds what
 *             happened; PrefillComplete (it carries the first token)
 *             leaves when compute ends (e) at the earliest; so floor =
 *             max(0, that - e) + msg, median over the B requests.  bound =
 *             link when the KV before the last moment was still crossing
 *             at it (a backlog) or the link's busy time exceeds the compute
 *             after the first moment, else compute.  What the runtime
 *             adds — a post later than its KV, the link idle while bytes
 *             wait, the chain after the last write — is the excess
 *   excess    ovh - floor: what the runtime adds beyond physics
 *   model     the sim profile's modelled prefill time; A! when A's compute
 *             took more than 2% longer (the host cannot honour the model)
 *   cpu       host CPU per request per thread of each daemon and arm, from
 *             /proc/PID/task/TID/schedstat around each request (ns): what
 *             each arm asks of the machine's cores
 *
 * --kv-dtype MAP (repeatable; or --kv-dtypes "MAP;MAP", ';' between maps
 * since a map holds commas) runs every configuration once per KV dtype map,
 * both daemons started with --kv-dtype MAP and the layer bytes (floor,
 * link) taken from that map's layout; each row names its map (kv_dtype,
 * canonical: what workers register) and its KV bytes per request.
 * Without it each engine keeps its own dtype (sim: its profile's; ref: f32).
 *
 * --tsv prints the same rows machine-readably (columns named in its header:
 * engine, xport, tokens, kv_dtype, kv_bytes, ovh_pct, floor_pct, ...).
 * --trace FILE writes one B request's events from both daemons into one
 * Chrome trace JSON (open it in ui.perfetto.dev).  This measures; it never
 * judges (tests/ do).
 *
 * This file is the one-host mode's main: defaults, the configurations'
 * loop, the temp dir.  The rest is in the files epd_bench_overhead_int.h
 * lists (options, one daemon pair, requests, CPU, traces, rows).
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "epd_alloc.h"
#include "epd_bench.h"
#include "epd_bench_overhead_int.h"
#include "epd_rng.h"
#include "epd_secret.h"
#include "epd_sim.h"
#include "epd_time.h"

/* Every row's prompt plus its 2 output tokens within its engine's window,
 * said before anything starts: a row over it used to fail inside the run
 * (prefill's 400) and vanish from the table, its reason in a kept log. */
static int ob_check_windows(const ob_t *b)
{
    for (int ei = 0; ei < b->n_engines; ei++) {
        const ob_engine_t *e = b->engines[ei];
        const uint32_t *lens = e->profile != NULL ? b->lengths : b->ref_lengths;
        int nl = e->profile != NULL ? b->n_lengths : b->n_ref_lengths;
        uint64_t window;

        if (e->profile != NULL) {
            char path[PATH_MAX];
            epd_sim_model_t m;

            snprintf(path, sizeof(path), "%s/%s", b->profiles, e->profile);
            if (epd_sim_model_load(path, &m) != EPD_OK) {
                fprintf(stderr, "overhead: cannot read %s's profile %s\n", e->name, path);
                return -1;
            }
            window = m.max_context;
        } else if (b->ref_model == NULL) {
            window = OB_REF_MAX_CONTEXT; /* the model overhead makes itself */
        } else {
            continue; /* the user's own: its prefill says */
        }
        for (int i = 0; i < nl; i++) {
            if ((uint64_t)lens[i] + 2 > window) {
                fprintf(stderr,
                        "overhead: %u tokens (+ 2 output) is over %s's window of %llu tokens: "
                        "give it at most %llu\n",
                        lens[i], e->name, (unsigned long long)window,
                        (unsigned long long)(window - 2));
                return -1;
            }
        }
    }
    return 0;
}

int epd_bench_overhead_main(int argc, char **argv)
{
    static ob_t b;
    int rc = 0;

    memset(&b, 0, sizeof(b));
    b.lengths[0] = 128;
    b.lengths[1] = 1024;
    b.lengths[2] = 4096;
    b.lengths[3] = 16384;
    b.lengths[4] = 32768;
    b.n_lengths = 5;
    b.ref_lengths[0] = 128;
    b.ref_lengths[1] = 1024;
    b.n_ref_lengths = 2;
    b.reps = 12;
    b.reps_long = 6;
    b.reps_ref = 6;
    b.warmup = 1;
    b.zero = 1;
    b.cpu = 1;
    b.verify = "stamps";
    b.chunk_tokens = -1;
    b.trace_len = 1024;
    rc = epd__ob_parse_args(&b, argc, argv);
    if (rc >= 0) {
        return rc;
    }
    rc = 0;
    if (b.n_engines == 0) {
        epd__ob_parse_names("dense-70b,hybrid-320b,ref", 1, &b);
    }
    if (b.n_xports == 0) {
        epd__ob_parse_names("ucx-shm,ucx-tcp,ofi-tcp", 0, &b);
    }
    if (b.n_groups == 0) {
        b.groups[0] = OB_GROUP_DEFAULT;
        b.n_groups = 1;
    }
    /* canonical maps spell out the last layer ("4-" -> "4-79"): room for that */
    b.kv_w = 8;
    for (int i = 0; i < b.n_kv_dtypes; i++) {
        int w = (int)strlen(b.kv_dtypes[i]) + 3;

        b.kv_w = w > b.kv_w ? w : b.kv_w;
    }
    if (epd_bench_bindir(b.bindir, sizeof(b.bindir)) != 0) {
        fprintf(stderr, "overhead: cannot find my own binary\n");
        return 1;
    }
    {
        static char prof[PATH_MAX];

        if (b.profiles == NULL) {
            /* build/bin or build/san/bin */
            snprintf(prof, sizeof(prof), "%s/../../engine/profiles", b.bindir);
            if (access(prof, R_OK) != 0) {
                snprintf(prof, sizeof(prof), "%s/../../../engine/profiles", b.bindir);
            }
            if (access(prof, R_OK) != 0) {
                snprintf(prof, sizeof(prof), "engine/profiles");
            }
            b.profiles = prof;
        }
    }
    if (ob_check_windows(&b) != 0) {
        return 2;
    }
    snprintf(b.tmp, sizeof(b.tmp), "/tmp/epd-overhead-XXXXXX");
    if (mkdtemp(b.tmp) == NULL) {
        fprintf(stderr, "overhead: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    if (epd_bench_make_secret(b.tmp, b.secret_file, sizeof(b.secret_file), &b.secret,
                              "overhead") != 0) {
        return 1;
    }
    b.txbuf = epd_malloc(OB_TXBUF);
    if (b.txbuf == NULL) {
        fprintf(stderr, "overhead: out of memory for a %u-byte send buffer\n", (unsigned)OB_TXBUF);
        return 1;
    }
    b.epoch_start = epd_time_wall_ns();
    b.epoch_nonce = epd_rng_entropy();
    b.next_id = ((uint64_t)(uint32_t)getpid() << 32) | 1;
    signal(SIGPIPE, SIG_IGN);

    {
        FILE *f = fopen("/proc/loadavg", "r");
        char la[64] = "?";

        if (f != NULL) {
            if (fgets(la, sizeof(la), f) == NULL) {
                snprintf(la, sizeof(la), "?");
            }
            fclose(f);
        }
        la[strcspn(la, "\n")] = '\0';
        printf("# epd-bench overhead: A = prefill only, B = prefill + KV transfer to a live decode\n"
               "# (--verify %s), Z = the protocol without the data; ms from prefill receiving\n"
               "# the request to A: compute done, B/Z: decode holding all KV.  B-A: paired median\n"
               "# [95%% CI]; ovh = B-A / A; msg = LayerDone latency (Z); GB/s = the KV's link\n"
               "# bandwidth (B); floor = least B-A this link and compute allow; excess = ovh -\n"
               "# floor; A! = A's compute > 1.02 x model.  Load average at start: %s, %ld CPUs\n",
               b.verify, la, sysconf(_SC_NPROCESSORS_ONLN));
        if (b.chunk_tokens >= 0) {
            printf("# prefill --prefill-chunk-tokens %d\n", b.chunk_tokens);
        }
    }
    epd__ob_print_header(&b);
    for (int ei = 0; ei < b.n_engines; ei++) {
        const ob_engine_t *e = b.engines[ei];
        const uint32_t *lens = e->profile != NULL ? b.lengths : b.ref_lengths;
        int nl = e->profile != NULL ? b.n_lengths : b.n_ref_lengths;

        for (int xi = 0; xi < b.n_xports; xi++) {
            for (int gi = 0; gi < b.n_groups; gi++) {
                /* the maps innermost: one engine and link's rows side by side */
                for (int ki = 0; ki < (b.n_kv_dtypes > 0 ? b.n_kv_dtypes : 1); ki++) {
                    if (epd__ob_config(&b, e, b.xports[xi], b.groups[gi],
                                       b.n_kv_dtypes > 0 ? b.kv_dtypes[ki] : NULL, lens, nl) != 0) {
                        rc = 1;
                    }
                }
            }
        }
    }
    if (b.keep || rc != 0) {
        /* a failure keeps them too: the daemons' logs say why */
        printf("# daemon logs and traces kept in %s\n", b.tmp);
    } else {
        char cmd[PATH_MAX + 32];

        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", b.tmp);
        if (system(cmd) != 0) {
            fprintf(stderr, "overhead: could not remove %s\n", b.tmp);
        }
    }
    epd_free(b.txbuf);
    epd_secret_wipe(&b.secret);
    return rc;
}
