/*
 * epd_bench_overhead_opts.c — the option values of `epd-bench overhead`:
 * lists of lengths, engines, transports, write groups and KV dtype maps;
 * the engines and transports the one-host mode knows (each transport with
 * the environment its daemons and client get); the usage.  The
 * benchmark's thread.
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

int epd__ob_parse_u32_list(const char *s, uint32_t *out, int *n_p)
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

int epd__ob_parse_groups(const char *s, long long *groups, int *n_p)
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
int epd__ob_parse_kv_dtypes(const char *s, ob_t *b)
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

void epd__ob_usage(void)
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
