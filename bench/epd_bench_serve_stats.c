/*
 * epd_bench_serve_stats.c — `epd-bench serve`: what each request came to
 * (errors by kind, token events, the inter-token gaps) and the table
 * printed from it (nearest-rank percentiles, epd_bench_stats.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_bench.h"
#include "epd_bench_serve_int.h"

/* Counts an error of `kind` for request `r`; `example` (may be NULL) is
 * kept for the first error of the kind. */
void epd__sv_err_ex(sv_phase_t *ph, sv_res_t *r, const char *kind, const char *example)
{
    int i;

    for (i = 0; i < ph->n_errs; i++) {
        if (strncmp(ph->errs[i].name, kind, sizeof(ph->errs[i].name) - 1) == 0) {
            break;
        }
    }
    if (i == ph->n_errs) {
        if (ph->n_errs == SV_MAX_ERR_KINDS) {
            i = SV_MAX_ERR_KINDS - 1; /* the last kind collects the rest */
        } else {
            snprintf(ph->errs[i].name, sizeof(ph->errs[i].name), "%s", kind);
            snprintf(ph->errs[i].example, sizeof(ph->errs[i].example), "%s",
                     example != NULL ? example : "");
            ph->n_errs++;
        }
    }
    ph->errs[i].count++;
    r->err = i + 1;
}

void epd__sv_err(sv_phase_t *ph, sv_res_t *r, const char *kind)
{
    epd__sv_err_ex(ph, r, kind, NULL);
}

static void sv_itl(sv_phase_t *ph, uint64_t gap_ns)
{
    if (ph->n_itl == ph->cap_itl) {
        size_t cap = ph->cap_itl ? ph->cap_itl * 2 : 65536;
        double *p = epd_malloc(cap * sizeof(*p));

        if (p == NULL) {
            return;
        }
        if (ph->n_itl > 0) {
            memcpy(p, ph->itl_us, ph->n_itl * sizeof(*p));
        }
        epd_free(ph->itl_us);
        ph->itl_us = p;
        ph->cap_itl = cap;
    }
    ph->itl_us[ph->n_itl++] = (double)gap_ns / 1e3;
}

/* A text event (or chunk) of request `r` arrived now. */
void epd__sv_token_event(sv_phase_t *ph, sv_res_t *r, uint64_t now)
{
    if (r->t_first == 0) {
        r->t_first = now;
    } else {
        sv_itl(ph, now - r->t_last);
    }
    r->t_last = now;
}

void epd__sv_finish(sv_t *b, sv_res_t *r, uint64_t now)
{
    if (r->done) {
        return;
    }
    r->done = 1;
    r->t_end = now;
    b->inflight--;
}

int epd__sv_phase_init(sv_t *b, sv_phase_t *ph, const char *name)
{
    memset(ph, 0, sizeof(*ph));
    ph->name = name;
    ph->n = b->n_work;
    ph->res = epd_calloc(b->n_work, sizeof(*ph->res));
    return ph->res != NULL ? 0 : -1;
}

/* ------------------------------------------------------------- the table */

typedef struct {
    double ttft[3], itl[3], e2e[3]; /* p50, p90, p99 in ms (long prompts apart) */
    double long_ttft[3];            /* --long-every's prompts: p50, max, mean in ms */
    uint64_t long_ok;
    uint64_t ok, err, tokens;
    double secs, rps, tps;
    double ttft_mean_all; /* ms, every ok request, warm-up included (vs /metrics) */
    uint64_t n_all;
} sv_stats_t;

static void sv_stats(sv_t *b, sv_phase_t *ph, sv_stats_t *s)
{
    double *ttft = epd_malloc((ph->n + 1) * sizeof(double));
    double *e2e = epd_malloc((ph->n + 1) * sizeof(double));
    double *long_ttft = epd_malloc((ph->n + 1) * sizeof(double));
    size_t n = 0;
    static const double ps[3] = {50, 90, 99};

    memset(s, 0, sizeof(*s));
    if (ttft == NULL || e2e == NULL || long_ttft == NULL) {
        epd_free(ttft);
        epd_free(e2e);
        epd_free(long_ttft);
        return;
    }
    /* the first --warmup requests are sent but not counted */
    for (uint32_t i = (uint32_t)b->warmup < ph->n ? (uint32_t)b->warmup : 0; i < ph->n; i++) {
        const sv_res_t *r = &ph->res[i];

        if (r->unused) {
            continue;
        }
        if (r->err != 0) {
            s->err++;
            continue;
        }
        s->ok++;
        s->tokens += r->n_tokens;
        if (b->work[i].is_long) {
            /* the percentiles are the short prompts' (what a long prompt
             * costs the others); the long ones get their own line */
            double t = (double)(r->t_first - r->t_send) / 1e6;

            long_ttft[s->long_ok++] = t;
            continue;
        }
        ttft[n] = (double)(r->t_first - r->t_send) / 1e6;
        e2e[n] = (double)(r->t_end - r->t_send) / 1e6;
        n++;
    }
    {
        double sum = 0;

        for (uint32_t i = 0; i < ph->n; i++) {
            const sv_res_t *r = &ph->res[i];

            if (!r->unused && r->err == 0 && r->t_first != 0) {
                sum += (double)(r->t_first - r->t_send) / 1e6;
                s->n_all++;
            }
        }
        s->ttft_mean_all = s->n_all > 0 ? sum / (double)s->n_all : NAN;
    }
    epd_bench_sort(ttft, n);
    epd_bench_sort(e2e, n);
    epd_bench_sort(long_ttft, s->long_ok);
    if (s->long_ok > 0) {
        double sum = 0;

        for (uint64_t i = 0; i < s->long_ok; i++) {
            sum += long_ttft[i];
        }
        s->long_ttft[0] = epd_bench_pct(long_ttft, s->long_ok, 50);
        s->long_ttft[1] = long_ttft[s->long_ok - 1];
        s->long_ttft[2] = sum / (double)s->long_ok;
    }
    epd_bench_sort(ph->itl_us, ph->n_itl);
    for (int k = 0; k < 3; k++) {
        s->ttft[k] = epd_bench_pct(ttft, n, ps[k]);
        s->e2e[k] = epd_bench_pct(e2e, n, ps[k]);
        s->itl[k] = epd_bench_pct(ph->itl_us, ph->n_itl, ps[k]) / 1e3;
    }
    /* the counted window: from the first counted arrival to the end */
    {
        uint32_t w0 = (uint32_t)b->warmup < ph->n ? (uint32_t)b->warmup : 0;
        uint64_t start = ph->t0 + b->work[w0].at_ns;

        s->secs = ph->t_end > start ? (double)(ph->t_end - start) / 1e9 : 0;
    }
    s->rps = s->secs > 0 ? (double)s->ok / s->secs : 0;
    s->tps = s->secs > 0 ? (double)s->tokens / s->secs : 0;
    epd_free(ttft);
    epd_free(e2e);
    epd_free(long_ttft);
}

void epd__sv_print(sv_t *b, sv_phase_t *phs, int n_ph)
{
    sv_stats_t st[2];
    int ir = -1, id = -1;

    if (b->n_images > 0) {
        printf("\nepd-bench serve: %.0f req/s offered for %.1f s (%u requests, first %lld not "
               "counted), chat with one %lldx%lld PNG + %s bytes of text, output %s tokens; "
               "paths alternating (half the rate each): encoders = the encoder pool encodes "
               "the images, local = the prefill worker does (\"epd_encode\": \"local\"); each "
               "path draws from its own %lld images\n",
               b->rate, b->duration_s, b->n_work, (long long)b->warmup, (long long)b->image_size,
               (long long)b->image_size, b->prompt_len, b->output_len, (long long)b->n_images);
    } else {
        printf("\nepd-bench serve: %.0f req/s offered for %.1f s (%u requests, first %lld not "
               "counted), prompt %s bytes, output %s tokens, %s, paths: %s\n",
               b->rate, b->duration_s, b->n_work, (long long)b->warmup, b->prompt_len,
               b->output_len, b->chat ? "chat" : "completions",
               strcmp(b->phases, "ab") == 0 ? "alternating router/direct (half the rate each)"
                                            : b->phases);
    }
    if (b->long_every > 0) {
        char ct[32];

        snprintf(ct, sizeof(ct), "%lld", (long long)b->chunk_tokens);
        printf("long-mixed: arrival N*%lld-1 a %lld-byte prompt; the percentiles below are the "
               "other prompts'; prefill --prefill-chunk-tokens %s%s\n",
               (long long)b->long_every, (long long)b->long_len,
               b->chunk_tokens < 0 ? "(the engine's default)" : ct,
               b->no_prefix_cache ? ", --no-prefix-cache" : "");
    }
    printf("%-8s %7s %6s %8s %9s | %8s %8s %8s | %7s %7s %7s | %8s %8s %8s\n", "path", "ok",
           "errors", "req/s", "tok/s", "ttft_p50", "ttft_p90", "ttft_p99", "itl_p50", "itl_p90",
           "itl_p99", "e2e_p50", "e2e_p90", "e2e_p99");
    printf("%-8s %7s %6s %8s %9s | %8s %8s %8s | %7s %7s %7s | %8s %8s %8s\n", "", "", "", "", "",
           "ms", "ms", "ms", "ms", "ms", "ms", "ms", "ms", "ms");
    for (int k = 0; k < n_ph; k++) {
        sv_stats_t *s = &st[k];

        sv_stats(b, &phs[k], s);
        if (strcmp(phs[k].name, "router") == 0) {
            ir = k;
        } else {
            id = k;
        }
        printf("%-8s %7llu %6llu %8.1f %9.0f | %8.3f %8.3f %8.3f | %7.3f %7.3f %7.3f | %8.3f "
               "%8.3f %8.3f\n",
               phs[k].name, (unsigned long long)s->ok, (unsigned long long)s->err, s->rps, s->tps,
               s->ttft[0], s->ttft[1], s->ttft[2], s->itl[0], s->itl[1], s->itl[2], s->e2e[0],
               s->e2e[1], s->e2e[2]);
    }
    for (int k = 0; k < n_ph && b->long_every > 0; k++) {
        printf("  %s long prompts: %llu ok, TTFT p50 %.3f ms, max %.3f ms, mean %.3f ms\n",
               phs[k].name, (unsigned long long)st[k].long_ok, st[k].long_ttft[0],
               st[k].long_ttft[1], st[k].long_ttft[2]);
    }
    for (int k = 0; k < n_ph; k++) {
        for (int e = 0; e < phs[k].n_errs; e++) {
            printf("  %s errors: %llu x %s%s%s\n", phs[k].name,
                   (unsigned long long)phs[k].errs[e].count, phs[k].errs[e].name,
                   phs[k].errs[e].example[0] != '\0' ? "  e.g. " : "", phs[k].errs[e].example);
        }
    }
    if (b->n_images > 0) {
        double d[6];

        for (int k = 0; k < 6; k++) {
            d[k] = b->img1[k] - b->img0[k];
        }
        printf("images (the router's /metrics over the run): %.0f, cache hits %.0f (hit rate "
               "%.1f%%), encoded by the encoder pool %.0f, by prefill %.0f, stale hints %.0f, "
               "retries %.0f\n",
               d[0], d[1], d[0] > 0 ? 100.0 * d[1] / d[0] : 0.0, d[2], d[3], d[4], d[5]);
        if (n_ph == 2) {
            printf("encoder pool vs prefill encoding (encoders - local): TTFT p50 %+.3f ms, p99 "
                   "%+.3f ms; E2E p50 %+.3f ms\n",
                   st[0].ttft[0] - st[1].ttft[0], st[0].ttft[2] - st[1].ttft[2],
                   st[0].e2e[0] - st[1].e2e[0]);
        }
    } else if (ir >= 0 && id >= 0) {
        printf("router adds (router - direct): TTFT p50 %+.0f us, p99 %+.0f us; E2E p50 %+.0f us, "
               "p99 %+.0f us\n",
               (st[ir].ttft[0] - st[id].ttft[0]) * 1e3, (st[ir].ttft[2] - st[id].ttft[2]) * 1e3,
               (st[ir].e2e[0] - st[id].e2e[0]) * 1e3, (st[ir].e2e[2] - st[id].e2e[2]) * 1e3);
    }
    if (ir >= 0 && b->m_count > 0) {
        printf("TTFT means over every ok request (warm-up included): the router's own /metrics "
               "(request parsed -> first token at the router) %.3f ms over %llu; this client, "
               "router path %.3f ms over %llu",
               b->m_sum / (double)b->m_count * 1e3, (unsigned long long)b->m_count,
               st[ir].ttft_mean_all, (unsigned long long)st[ir].n_all);
        if (id >= 0) {
            printf(", direct %.3f ms over %llu", st[id].ttft_mean_all,
                   (unsigned long long)st[id].n_all);
        }
        printf("\n");
    }
    fflush(stdout);
}
