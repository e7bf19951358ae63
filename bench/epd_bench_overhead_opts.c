/*
 * epd_bench_overhead_opts.c — the options of `epd-bench overhead`, both
 * modes, from one table: each option names the modes that take it (the
 * one-host mode, the attach mode, or both), whether it takes a value, and
 * one switch checks and stores that value in the ob_t.  One loop parses
 * argv for either mode, with the messages both printed before; the values'
 * parsers (lists of lengths, engines, transports, write groups, KV dtype
 * maps); the engines and transports the one-host mode knows (each
 * transport with the environment its daemons and client get); both
 * usages.  The benchmark's thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_bench_overhead_int.h"
#include "epd_kvq.h"

static const ob_xport_t ob_xports[] = {
    {"ucx-shm", "ucx", NULL, {"UCX_TLS=posix,cma,tcp", "UCX_NET_DEVICES=lo", NULL}},
    {"ucx-tcp", "ucx", NULL, {"UCX_TLS=tcp", "UCX_NET_DEVICES=lo", NULL}},
    {"ofi-tcp", "ofi", "tcp;ofi_rxm", {"FI_PROVIDER=tcp;ofi_rxm", NULL}},
};

static const ob_engine_t ob_engines[] = {
    {"dense-70b", "dense-70b.profile", "h200.profile", 4, 0.05},
    {"hybrid-320b", "hybrid-moe-320b.profile", "h200.profile", 8, 0.1},
    {"ref", NULL, NULL, 0, 0},
};

/* -------------------------------------------------------------- parsing */

/* "128,1k,4096" into out[0..OB_MAX_LIST) (k: x1024; each 1..1M); 0, or -1
 * for a bad or empty list. */
static int ob_parse_u32_list(const char *s, uint32_t *out, int *n_p)
{
    int n = 0;

    while (*s != '\0') {
        char *end;
        unsigned long v = strtoul(s, &end, 10);

        if (end == s || n == OB_MAX_LIST) {
            return -1;
        }
        if (*end == 'k' || *end == 'K') {
            v *= 1024;
            end++;
        }
        if (v == 0 || v > 1u << 20) {
            return -1;
        }
        out[n++] = (uint32_t)v;
        s = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0') {
            return -1;
        }
    }
    *n_p = n;
    return n > 0 ? 0 : -1;
}

int epd__ob_parse_names(const char *s, int engines, ob_t *b)
{
    char buf[512];
    char *save = NULL;

    snprintf(buf, sizeof(buf), "%s", s);
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        int found = 0;

        if (engines) {
            for (size_t i = 0; i < sizeof(ob_engines) / sizeof(ob_engines[0]); i++) {
                if (strcmp(tok, ob_engines[i].name) == 0 && b->n_engines < OB_MAX_LIST) {
                    b->engines[b->n_engines++] = &ob_engines[i];
                    found = 1;
                }
            }
        } else {
            for (size_t i = 0; i < sizeof(ob_xports) / sizeof(ob_xports[0]); i++) {
                if (strcmp(tok, ob_xports[i].name) == 0 && b->n_xports < OB_MAX_LIST) {
                    b->xports[b->n_xports++] = &ob_xports[i];
                    found = 1;
                }
            }
        }
        if (!found) {
            fprintf(stderr, "overhead: unknown %s '%s'\n", engines ? "engine" : "transport", tok);
            return -1;
        }
    }
    return 0;
}

/* --groups "default,per-layer,64K,1M" (K, M: x1024, x1024^2); 0 or -1. */
static int ob_parse_groups(const char *s, long long *groups, int *n_p)
{
    char buf[512];
    char *save = NULL;
    int n = 0;

    snprintf(buf, sizeof(buf), "%s", s);
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        long long v;
        char *end;

        if (n == OB_MAX_LIST) {
            return -1;
        }
        if (strcmp(tok, "default") == 0) {
            v = OB_GROUP_DEFAULT;
        } else if (strcmp(tok, "per-layer") == 0) {
            v = 0;
        } else {
            v = strtoll(tok, &end, 10);
            if (*end == 'k' || *end == 'K') {
                v <<= 10;
                end++;
            } else if (*end == 'm' || *end == 'M') {
                v <<= 20;
                end++;
            }
            if (end == tok || *end != '\0' || v < 0) {
                return -1;
            }
        }
        groups[n++] = v;
    }
    *n_p = n;
    return n > 0 ? 0 : -1;
}

/* --kv-dtypes "MAP;MAP;...": appended to the --kv-dtype list (';' because
 * a map holds commas).  Nonzero for an empty entry or too many. */
static int ob_parse_kv_dtypes(const char *s, ob_t *b)
{
    size_t len = strlen(s);
    char *p;
    char *save = NULL;

    if (b->kv_dtypes_used + len + 1 > sizeof(b->kv_dtypes_buf) || len == 0 || s[0] == ';' ||
        strstr(s, ";;") != NULL || s[len - 1] == ';') {
        return -1;
    }
    p = b->kv_dtypes_buf + b->kv_dtypes_used;
    memcpy(p, s, len + 1);
    b->kv_dtypes_used += len + 1;
    for (char *tok = strtok_r(p, ";", &save); tok != NULL; tok = strtok_r(NULL, ";", &save)) {
        if (b->n_kv_dtypes == OB_MAX_LIST || strlen(tok) >= EPD_KVQ_MAP_MAX) {
            return -1;
        }
        b->kv_dtypes[b->n_kv_dtypes++] = tok;
    }
    return 0;
}

static void ob_usage(void)
{
    printf("usage: epd-bench overhead [options]\n"
           "  prefill-only (A) vs prefill + KV transfer into a live decode (B) vs the protocol\n"
           "  without the data (Z), interleaved request by request against the same daemons;\n"
           "  times from the daemons' traces, the physical floor of B - A beside each row.\n\n"
           "  --lengths LIST       prompt lengths for sim engines [128,1024,4096,16384,32768]\n"
           "  --ref-lengths LIST   prompt lengths for ref [128,1024]\n"
           "  --engines LIST       dense-70b,hybrid-320b,ref [all]\n"
           "  --transports LIST    ucx-shm,ucx-tcp,ofi-tcp [all]\n"
           "  --groups LIST        prefill --write-group-bytes of each row: default (the\n"
           "                       daemon's), per-layer (0) or bytes (64K, 1M) [default]\n"
           "  --reps N             repetitions (one request of each arm) per length [12]\n"
           "  --reps-long N        repetitions for lengths >= 16k [6]\n"
           "  --reps-ref N         repetitions per length with ref (slow on a CPU) [6]\n"
           "  --warmup N           repetitions not counted, per length [1]\n"
           "  --no-zero            without the zero-byte arm (Z)\n"
           "  --kv-dtype MAP       run every configuration with this KV dtype map (f32, bf16,\n"
           "                       fp8, int8 or per layer \"0-3:bf16,4-:fp8\"); repeat it for\n"
           "                       rows of each map side by side [each engine's own: sim its\n"
           "                       profile's, ref f32]\n"
           "  --kv-dtypes LIST     the same, maps separated by ';' (\"bf16;int8;0-3:bf16,4-:fp8\")\n"
           "  --scale S            sim engines at scale S (0 < S <= 1) instead of their own\n"
           "                       (dense-70b 0.05, hybrid-320b 0.1): 1 is the full-size KV\n"
           "  --chunk-tokens N     prefill's --prefill-chunk-tokens (0: off) [its engine's]\n"
           "  --verify MODE        decode's --verify for stamped KV: stamps or full [stamps]\n"
           "  --tsv                tab-separated rows (engine xport tokens kv_dtype kv_bytes\n"
           "                       ovh_pct floor_pct excess_pct bound ...; the header names\n"
           "                       every column)\n"
           "  --no-cpu             without the per-thread CPU lines\n"
           "  --trace FILE         one B request, prefill and decode merged (Chrome JSON)\n"
           "  --trace-length N     which length that request has [1024]\n"
           "  --profiles DIR       sim profiles [<repo>/engine/profiles]\n"
           "  --ref-model DIR      ref model [epd-mkmodel defaults, written to a temp dir]\n"
           "  --keep               keep the temp dir (daemon logs, traces)\n\n"
           "  Against daemons already running on other hosts: --attach-prefill HOST:PORT\n"
           "  --attach-decode HOST:PORT --cluster-secret-file F (their options:\n"
           "  epd-bench overhead --attach-prefill X --help).\n");
}

static void ob_attach_usage(void)
{
    printf("usage: epd-bench overhead --attach-prefill HOST:PORT --attach-decode HOST:PORT\n"
           "                          --cluster-secret-file FILE [options]\n"
           "  The A/B/Z arms against a prefill and a decode someone else started (run with\n"
           "  --trace FILE, any file), on other hosts; HOST:PORT are their control addresses.\n"
           "  Times from their trace recorders over the request plane, put on this host's\n"
           "  clock with each daemon's offset (clock probes; the uncertainty is printed).\n\n"
           "  --lengths LIST       prompt lengths [128,1024,4096]\n"
           "  --reps N             repetitions (one request of each arm) per length [12]\n"
           "  --warmup N           repetitions not counted, per length [1]\n"
           "  --no-zero            without the zero-byte arm (Z)\n"
           "  --probes N           clock probes per daemon before and after each length [%d]\n"
           "  --data-addr IP       this host's data-plane address (ofi binds it) [127.0.0.1]\n"
           "  --trace FILE         one B request, prefill and decode merged on this host's\n"
           "                       clock (Chrome JSON)\n"
           "  --trace-length N     which length that request has [1024]\n"
           "  --tsv                tab-separated rows: p_off_us p_unc_us d_off_us d_unc_us\n"
           "                       clock_unc_us kv_mb, then the one-host mode's columns\n",
           OB_PROBES_DEFAULT);
}

/* ---------------------------------------------------------- the table */

enum { OB_ONE = 1, OB_ATTACH = 2, OB_BOTH = 3 }; /* the modes that take an option */

typedef enum {
    OB_O_KEEP, OB_O_NO_ZERO, OB_O_TSV, OB_O_NO_CPU, OB_O_LENGTHS, OB_O_REF_LENGTHS,
    OB_O_ENGINES, OB_O_TRANSPORTS, OB_O_GROUPS, OB_O_REPS, OB_O_REPS_REF, OB_O_REPS_LONG,
    OB_O_WARMUP, OB_O_KV_DTYPE, OB_O_KV_DTYPES, OB_O_SCALE, OB_O_CHUNK_TOKENS, OB_O_VERIFY,
    OB_O_TRACE, OB_O_TRACE_LENGTH, OB_O_PROFILES, OB_O_REF_MODEL, OB_O_ATTACH_PREFILL,
    OB_O_ATTACH_DECODE, OB_O_SECRET, OB_O_DATA_ADDR, OB_O_PROBES,
} ob_opt_id_t;

typedef struct {
    const char *name;
    int modes;     /* OB_ONE, OB_ATTACH or both */
    int has_value; /* 0: a flag */
    ob_opt_id_t id;
} ob_opt_t;

static const ob_opt_t ob_opts[] = {
    {"--keep", OB_ONE, 0, OB_O_KEEP},
    {"--no-zero", OB_BOTH, 0, OB_O_NO_ZERO},
    {"--tsv", OB_BOTH, 0, OB_O_TSV},
    /* the attach mode has no CPU lines anyway: taken, changes nothing */
    {"--no-cpu", OB_BOTH, 0, OB_O_NO_CPU},
    {"--lengths", OB_BOTH, 1, OB_O_LENGTHS},
    {"--ref-lengths", OB_ONE, 1, OB_O_REF_LENGTHS},
    /* the daemons' flags (engine, transport, groups, KV dtype, verify) are
     * their operator's in the attach mode, not the benchmark's */
    {"--engines", OB_ONE, 1, OB_O_ENGINES},
    {"--transports", OB_ONE, 1, OB_O_TRANSPORTS},
    {"--groups", OB_ONE, 1, OB_O_GROUPS},
    {"--reps", OB_BOTH, 1, OB_O_REPS},
    {"--reps-ref", OB_ONE, 1, OB_O_REPS_REF},
    {"--reps-long", OB_ONE, 1, OB_O_REPS_LONG},
    {"--warmup", OB_BOTH, 1, OB_O_WARMUP},
    {"--kv-dtype", OB_ONE, 1, OB_O_KV_DTYPE},
    {"--kv-dtypes", OB_ONE, 1, OB_O_KV_DTYPES},
    {"--scale", OB_ONE, 1, OB_O_SCALE},
    {"--chunk-tokens", OB_ONE, 1, OB_O_CHUNK_TOKENS},
    {"--verify", OB_ONE, 1, OB_O_VERIFY},
    {"--trace", OB_BOTH, 1, OB_O_TRACE},
    {"--trace-length", OB_BOTH, 1, OB_O_TRACE_LENGTH},
    {"--profiles", OB_ONE, 1, OB_O_PROFILES},
    {"--ref-model", OB_ONE, 1, OB_O_REF_MODEL},
    {"--attach-prefill", OB_ATTACH, 1, OB_O_ATTACH_PREFILL},
    {"--attach-decode", OB_ATTACH, 1, OB_O_ATTACH_DECODE},
    {"--cluster-secret-file", OB_ATTACH, 1, OB_O_SECRET},
    {"--data-addr", OB_ATTACH, 1, OB_O_DATA_ADDR},
    {"--probes", OB_ATTACH, 1, OB_O_PROBES},
};

/* Option `id` with value v (NULL for a flag) into b.  0, or nonzero for a
 * bad value (a list parser may have said why first). */
static int ob_opt_set(ob_t *b, ob_opt_id_t id, const char *v)
{
    switch (id) {
    case OB_O_KEEP:
        b->keep = 1;
        return 0;
    case OB_O_NO_ZERO:
        b->zero = 0;
        return 0;
    case OB_O_TSV:
        b->tsv = 1;
        return 0;
    case OB_O_NO_CPU:
        b->cpu = 0;
        return 0;
    case OB_O_LENGTHS:
        return ob_parse_u32_list(v, b->lengths, &b->n_lengths);
    case OB_O_REF_LENGTHS:
        return ob_parse_u32_list(v, b->ref_lengths, &b->n_ref_lengths);
    case OB_O_ENGINES:
        return epd__ob_parse_names(v, 1, b);
    case OB_O_TRANSPORTS:
        return epd__ob_parse_names(v, 0, b);
    case OB_O_GROUPS:
        return ob_parse_groups(v, b->groups, &b->n_groups);
    case OB_O_REPS:
        b->reps = atoi(v);
        return b->reps < 1;
    case OB_O_REPS_REF:
        b->reps_ref = atoi(v);
        return b->reps_ref < 1;
    case OB_O_REPS_LONG:
        b->reps_long = atoi(v);
        return b->reps_long < 1;
    case OB_O_WARMUP:
        b->warmup = atoi(v);
        return b->warmup < 0;
    case OB_O_KV_DTYPE:
        if (b->n_kv_dtypes == OB_MAX_LIST || v[0] == '\0' || strlen(v) >= EPD_KVQ_MAP_MAX) {
            return 1;
        }
        b->kv_dtypes[b->n_kv_dtypes++] = v;
        return 0;
    case OB_O_KV_DTYPES:
        return ob_parse_kv_dtypes(v, b);
    case OB_O_SCALE:
        b->scale = atof(v);
        return !(b->scale > 0.0 && b->scale <= 1.0);
    case OB_O_CHUNK_TOKENS:
        b->chunk_tokens = atoi(v);
        return b->chunk_tokens < 0 || strspn(v, "0123456789") != strlen(v);
    case OB_O_VERIFY:
        b->verify = v;
        return strcmp(v, "stamps") != 0 && strcmp(v, "full") != 0;
    case OB_O_TRACE:
        b->trace_out = v;
        return 0;
    case OB_O_TRACE_LENGTH:
        b->trace_len = (uint32_t)atoi(v);
        return 0;
    case OB_O_PROFILES:
        b->profiles = v;
        return 0;
    case OB_O_REF_MODEL:
        b->ref_model = v;
        return 0;
    case OB_O_ATTACH_PREFILL:
        b->attach_addr[0] = v;
        return 0;
    case OB_O_ATTACH_DECODE:
        b->attach_addr[1] = v;
        return 0;
    case OB_O_SECRET:
        b->attach_secret = v;
        return 0;
    case OB_O_DATA_ADDR:
        b->data_addr = v;
        return 0;
    case OB_O_PROBES:
        b->probes = atoi(v);
        return b->probes < 1;
    }
    return 1;
}

int epd__ob_parse_args(ob_t *b, int argc, char **argv)
{
    int mode = b->attach ? OB_ATTACH : OB_ONE;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        const ob_opt_t *o = NULL;

        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            if (b->attach) {
                ob_attach_usage();
            } else {
                ob_usage();
            }
            return 0;
        }
        for (size_t k = 0; k < sizeof(ob_opts) / sizeof(ob_opts[0]); k++) {
            if ((ob_opts[k].modes & mode) != 0 && strcmp(a, ob_opts[k].name) == 0) {
                o = &ob_opts[k];
                break;
            }
        }
        if (o != NULL && !o->has_value) {
            (void)ob_opt_set(b, o->id, NULL);
            continue;
        }
        /* as before the table: anything but a known flag takes the next
         * argument, or is missing it */
        if (v == NULL) {
            fprintf(stderr, "overhead: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (o == NULL) {
            if (b->attach) {
                fprintf(stderr,
                        "overhead: %s is not an option of the attach mode (see --attach-prefill "
                        "--help)\n",
                        a);
            } else {
                fprintf(stderr, "overhead: unknown option %s (see --help)\n", a);
            }
            return 2;
        }
        if (ob_opt_set(b, o->id, v) != 0) {
            fprintf(stderr, "overhead: bad value for %s: '%s'\n", a, v);
            return 2;
        }
    }
    return -1;
}
