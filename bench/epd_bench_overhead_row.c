/*
 * epd_bench_overhead_row.c — one row of `epd-bench overhead` from its
 * requests: the medians of A, B, Z and the paired B - A with its interval
 * (epd_bench_stats.c), the link's bandwidth and the message latency, the
 * physical floor per B request (epd_bench_overhead.c's top comment says
 * how), and the row printed as a table line or --tsv.  Both modes print
 * through it.  The benchmark's thread.
 */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_bench.h"
#include "epd_bench_overhead_int.h"
#include "epd_sim.h"

/* Bytes layer l of a request of n_tokens writes. */
double epd__ob_layer_bytes(const epd_kv_layout_t *kv, uint32_t l, uint32_t n_tokens)
{
    if (kv->kind[l] == EPD_LAYER_LINEAR) {
        return (double)kv->state_bytes;
    }
    /* a KV dtype map: each layer's own block size */
    return (double)((n_tokens + kv->block_tokens - 1) / kv->block_tokens) *
           (double)epd_kv_layer_block_bytes(kv, l);
}

/* KV bytes of a whole request of n_tokens (every layer). */
double epd__ob_req_bytes(const epd_kv_layout_t *kv, uint32_t n_tokens)
{
    double bytes = 0.0;

    for (uint32_t l = 0; l < kv->n_layers; l++) {
        bytes += epd__ob_layer_bytes(kv, l, n_tokens);
    }
    return bytes;
}

/* Disjoint intervals sorted by start, and their total length: the link's
 * busy time over a set of write episodes.  s and e hold `cap` each. */
typedef struct {
    double *s, *e;
    int n, cap;
    double len;
} ob_union_t;

/* Adds [s, e): it absorbs every interval it overlaps or touches. */
static void ob_union_add(ob_union_t *u, double s, double e)
{
    int lo = 0, hi = u->n, j;

    if (e <= s || u->n == u->cap) {
        return;
    }
    while (lo < hi) { /* the first interval ending at or after s */
        int m = (lo + hi) / 2;

        if (u->e[m] < s) {
            lo = m + 1;
        } else {
            hi = m;
        }
    }
    for (j = lo; j < u->n && u->s[j] <= e; j++) {
        s = u->s[j] < s ? u->s[j] : s;
        e = u->e[j] > e ? u->e[j] : e;
        u->len -= u->e[j] - u->s[j];
    }
    memmove(u->s + lo + 1, u->s + j, (size_t)(u->n - j) * sizeof(double));
    memmove(u->e + lo + 1, u->e + j, (size_t)(u->n - j) * sizeof(double));
    u->s[lo] = s;
    u->e[lo] = e;
    u->n += 1 - (j - lo);
    u->len += e - s;
}

static int ob_cmp_ready(const void *a, const void *b)
{
    double x = ((const ob_span_t *)a)->e, y = ((const ob_span_t *)b)->e;

    return x < y ? -1 : x > y;
}

/* A write episode with the moment its bytes existed (t): the last "compute"
 * end of its layer at or before its first post (the chunk it carries; a
 * backlog merges later chunks into it), or its post when none was before
 * (blocks a prefix cache held). */
typedef struct {
    double t, s, e;
} ob_item_t;

static int ob_cmp_item_desc(const void *a, const void *b)
{
    double x = ((const ob_item_t *)a)->t, y = ((const ob_item_t *)b)->t;

    return x > y ? -1 : x < y;
}

/* Request r's write episodes with their moments, latest first, into *items_p
 * (owned by the caller; NULL when it wrote nothing); *t_first_p and
 * *t_last_p get the first and the last moment any KV existed.  Returns the
 * number of items, or -1 (no memory). */
static int ob_req_items(const ob_t *b, const ob_req_t *r, ob_item_t **items_p, double *t_first_p,
                        double *t_last_p)
{
    uint32_t L = b->kv.n_layers;
    int nr = r->ready.n, nw = r->writes.n, n = 0;
    int *first = NULL, *cnt = NULL;
    double *times = NULL;
    ob_span_t *rdy = NULL;
    ob_item_t *items = NULL;

    *items_p = NULL;
    *t_first_p = *t_last_p = 0.0;
    if (nw == 0) {
        return 0;
    }
    items = epd_malloc((size_t)nw * sizeof(*items));
    first = epd_calloc((size_t)L + 1, sizeof(int));
    cnt = epd_calloc((size_t)L + 1, sizeof(int));
    times = epd_malloc((size_t)(nr > 0 ? nr : 1) * sizeof(double));
    rdy = epd_malloc((size_t)(nr > 0 ? nr : 1) * sizeof(*rdy));
    if (items == NULL || first == NULL || cnt == NULL || times == NULL || rdy == NULL) {
        n = -1;
        goto out;
    }
    /* each layer's moments, in time order, side by side in `times` */
    memcpy(rdy, r->ready.v, (size_t)nr * sizeof(*rdy));
    qsort(rdy, (size_t)nr, sizeof(*rdy), ob_cmp_ready);
    for (int i = 0; i < nr; i++) {
        first[rdy[i].layer + 1]++;
    }
    for (uint32_t l = 0; l < L; l++) {
        first[l + 1] += first[l];
    }
    for (int i = 0; i < nr; i++) {
        uint32_t l = rdy[i].layer;

        times[first[l] + cnt[l]++] = rdy[i].e;
    }
    if (nr > 0) {
        *t_first_p = rdy[0].e;
        *t_last_p = rdy[nr - 1].e;
    }
    for (int i = 0; i < nw; i++) {
        const ob_span_t *w = &r->writes.v[i];
        int lo = first[w->layer], hi = first[w->layer] + cnt[w->layer];

        while (lo < hi) { /* the first moment of the layer after the post */
            int m = (lo + hi) / 2;

            if (times[m] <= w->s) {
                lo = m + 1;
            } else {
                hi = m;
            }
        }
        items[n].t = lo > first[w->layer] ? times[lo - 1] : w->s;
        items[n].s = w->s;
        items[n].e = w->e;
        n++;
    }
    qsort(items, (size_t)n, sizeof(*items), ob_cmp_item_desc);
    *items_p = items;
    items = NULL;
out:
    epd_free(items);
    epd_free(first);
    epd_free(cnt);
    epd_free(times);
    epd_free(rdy);
    return n;
}

/* The KV of a B request over the union of its write episodes (B/s), or 0
 * when it wrote nothing. */
static double ob_req_bw(const ob_t *b, const ob_req_t *r)
{
    int n = r->writes.n;
    double *sv = epd_malloc((size_t)(n + 1) * sizeof(double));
    double *ev = epd_malloc((size_t)(n + 1) * sizeof(double));
    ob_union_t u = {.s = sv, .e = ev, .cap = n + 1};

    if (sv != NULL && ev != NULL) {
        for (int i = 0; i < n; i++) {
            ob_union_add(&u, r->writes.v[i].s, r->writes.v[i].e);
        }
    }
    epd_free(sv);
    epd_free(ev);
    return u.len > 0.0 ? epd__ob_req_bytes(&b->kv, r->n_tokens) / (u.len / 1e9) : 0.0;
}

/* The latest end, over the moments t of `items` (latest first) from index
 * `from` on, of t + the link's busy time over the episodes of moment t and
 * later: what a link that is never idle while bytes wait, moving each
 * stretch of bytes as fast as it moved them, finishes by.  *busy_p (may
 * be NULL) gets the busy time of them all.  0 without memory. */
static double ob_items_finish(const ob_item_t *items, int n, int from, double *busy_p)
{
    double finish = 0.0;
    double *sv = epd_malloc((size_t)(n + 1) * sizeof(double));
    double *ev = epd_malloc((size_t)(n + 1) * sizeof(double));
    ob_union_t u = {.s = sv, .e = ev, .cap = n + 1};

    for (int i = from; sv != NULL && ev != NULL && i < n; i++) {
        ob_union_add(&u, items[i].s, items[i].e);
        if (items[i].t + u.len > finish) {
            finish = items[i].t + u.len;
        }
    }
    if (busy_p != NULL) {
        *busy_p = u.len;
    }
    epd_free(sv);
    epd_free(ev);
    return finish;
}

/* The floor of B - A for one B request (ns), given one message's latency
 * (ns); *link_bound_p says whether the link, not the compute, sets it.
 *
 * Each stretch of KV is taken at the speed the link moved it: from moment
 * t (a chunk's layer existed) on, the bytes produced from t on need at
 * least the busy time of their own write episodes — so the floor is never
 * above what happened (the old whole-request bandwidth and last-chunk
 * moments put it up to 60% above at 32k tokens, chunked), and what the
 * runtime adds — a post later than its KV, the link idle while bytes
 * wait, the chain after the last write — is the excess. */
static double ob_req_floor(const ob_t *b, const ob_req_t *r, double msg, int *link_bound_p)
{
    ob_item_t *items = NULL;
    double t_first, t_last, busy, finish, prior;
    int n = ob_req_items(b, r, &items, &t_first, &t_last), k = 0;

    *link_bound_p = 0;
    if (n <= 0 || t_last <= 0.0) {
        epd_free(items);
        return msg;
    }
    finish = ob_items_finish(items, n, 0, &busy);
    while (k < n && items[k].t >= t_last) {
        k++; /* the last moment's episodes: what was there before them? */
    }
    prior = ob_items_finish(items, n, k, NULL);
    /* a backlog when the last layer came, or more to move than compute after
     * the first layer gave time for */
    *link_bound_p = prior > t_last || busy > r->c_end - t_first;
    epd_free(items);
    return (finish > r->c_end ? finish - r->c_end : 0.0) + msg;
}

void epd__ob_row(const ob_t *b, uint32_t len, ob_row_t *row)
{
    static double va[OB_MAX_REQS], vb[OB_MAX_REQS], vz[OB_MAX_REQS], vd[OB_MAX_REQS],
        vzd[OB_MAX_REQS], vc[OB_MAX_REQS], vmsg[OB_MAX_REQS * 4], vbw[OB_MAX_REQS],
        vfl[OB_MAX_REQS], vq[OB_MAX_REQS], vr[OB_MAX_REQS], vt[OB_MAX_REQS], vv[OB_MAX_REQS],
        vs[OB_MAX_REQS], vbc[OB_MAX_REQS];
    int na = 0, nb = 0, nz = 0, nd = 0, nzd = 0, nmsg = 0, nbw = 0, nfl = 0, nlink = 0;

    memset(row, 0, sizeof(*row));
    row->model_ms = NAN;
    if (b->have_timing) {
        double s = 0.0;

        for (uint32_t l = 0; l < b->timing.n_layers; l++) {
            s += epd_sim_prefill_seconds(&b->timing, l, 0, len);
        }
        row->model_ms = s * 1e3;
    }
    for (int i = 0; i < b->n_reqs; i++) {
        const ob_req_t *r = &b->reqs[i];

        if (r->n_tokens != len || r->warmup || !r->ok) {
            continue;
        }
        if (r->arm == OB_ARM_A) {
            vc[na] = r->c_end - r->c_start;
            va[na++] = r->c_end - r->p_recv;
        } else if (r->arm == OB_ARM_B) {
            vb[nb] = r->d_held - r->p_recv;
            vq[nb] = r->q_end - r->p_recv;
            vr[nb] = r->resv - r->p_recv;
            vt[nb] = r->d_held - r->c_end;
            vv[nb] = r->pc_recv > 0 ? r->d_held - r->pc_recv : 0.0;
            vs[nb] = r->step1;
            vbc[nb] = r->c_end - r->c_start;
            nb++;
            if ((vbw[nbw] = ob_req_bw(b, r)) > 0.0) {
                nbw++;
            }
        } else {
            vz[nz++] = r->d_held - r->p_recv;
            for (uint32_t l = 0; l < b->kv.n_layers && nmsg < OB_MAX_REQS * 4; l++) {
                if (r->ld_sent[l] > 0 && r->ld_rx[l] > r->ld_sent[l]) {
                    vmsg[nmsg++] = r->ld_rx[l] - r->ld_sent[l];
                }
            }
        }
    }
    /* pairs: the A and B (Z) of one repetition */
    for (int i = 0; i < b->n_reqs; i++) {
        const ob_req_t *ra = &b->reqs[i];

        if (ra->n_tokens != len || ra->warmup || !ra->ok || ra->arm != OB_ARM_A) {
            continue;
        }
        for (int j = 0; j < b->n_reqs; j++) {
            const ob_req_t *rx = &b->reqs[j];

            if (rx->n_tokens != len || rx->warmup || !rx->ok || rx->rep != ra->rep) {
                continue;
            }
            if (rx->arm == OB_ARM_B) {
                vd[nd++] = (rx->d_held - rx->p_recv) - (ra->c_end - ra->p_recv);
            } else if (rx->arm == OB_ARM_Z) {
                vzd[nzd++] = (rx->d_held - rx->p_recv) - (ra->c_end - ra->p_recv);
            }
        }
    }
    row->n_pairs = nd;
    row->a_ms = epd_bench_median(va, (size_t)na) / 1e6;
    row->a_compute_ms = epd_bench_median(vc, (size_t)na) / 1e6;
    row->b_ms = epd_bench_median(vb, (size_t)nb) / 1e6;
    row->z_ms = epd_bench_median(vz, (size_t)nz) / 1e6;
    row->d_ms = epd_bench_median(vd, (size_t)nd) / 1e6;
    epd_bench_median_ci(vd, (size_t)nd, &row->d_lo_ms, &row->d_hi_ms);
    row->d_lo_ms /= 1e6;
    row->d_hi_ms /= 1e6;
    row->zd_ms = epd_bench_median(vzd, (size_t)nzd) / 1e6;
    row->msg_us = epd_bench_median(vmsg, (size_t)nmsg) / 1e3;
    row->link_gbs = epd_bench_median(vbw, (size_t)nbw) / 1e9;
    row->queue_ms = epd_bench_median(vq, (size_t)nb) / 1e6;
    row->resv_ms = epd_bench_median(vr, (size_t)nb) / 1e6;
    row->tail_ms = epd_bench_median(vt, (size_t)nb) / 1e6;
    row->verify_ms = epd_bench_median(vv, (size_t)nb) / 1e6;
    row->step1_ms = epd_bench_median(vs, (size_t)nb) / 1e6;
    row->b_compute_ms = epd_bench_median(vbc, (size_t)nb) / 1e6;
    for (int i = 0; i < b->n_reqs; i++) {
        const ob_req_t *r = &b->reqs[i];
        int lb = 0;

        if (r->n_tokens != len || r->warmup || !r->ok || r->arm != OB_ARM_B) {
            continue;
        }
        vfl[nfl++] = ob_req_floor(b, r, isnan(row->msg_us) ? 0.0 : row->msg_us * 1e3, &lb);
        nlink += lb;
    }
    row->floor_ms = epd_bench_median(vfl, (size_t)nfl) / 1e6;
    row->link_bound = 2 * nlink > nfl;
    row->a_flag = !isnan(row->model_ms) && row->a_compute_ms > row->model_ms * 1.02;
}

/* ------------------------------------------------------------- printing */

static void ob_fmt(char *buf, size_t cap, const char *fmt, double v)
{
    if (isnan(v)) {
        snprintf(buf, cap, "-");
    } else {
        snprintf(buf, cap, fmt, v);
    }
}

void epd__ob_print_header(const ob_t *b)
{
    if (b->tsv) {
        printf("engine\txport\ttokens\tkv_dtype\tkv_bytes\tovh_pct\tfloor_pct\texcess_pct\tbound\tpairs\tmodel_ms\ta_ms"
               "\tb_ms\tdiff_ms\tdiff_lo_ms\tdiff_hi_ms\tzero_ms\tzero_diff_ms\tmsg_us\tlink_gbs"
               "\tfloor_ms\ta_compute_ms\ta_flag\ttail_ms\tverify_ms\n");
        return;
    }
    printf("%-11s %-7s %6s %-*s %8s %5s | %8s %8s %8s | %8s %-19s %7s | %6s %7s %8s %7s %7s %-7s "
           "| %8s\n",
           "engine", "xport", "tokens", b->kv_w, "kv_dtype", "KV MB", "pairs", "model", "A med", "B med", "B-A", "[95% CI]", "ovh",
           "msg us", "GB/s", "floor", "floor", "excess", "bound", "Z-A");
}

void epd__ob_print_row(const ob_t *b, const ob_engine_t *e, const ob_xport_t *xp, uint32_t len,
                       const ob_row_t *w)
{
    double ovh = 100.0 * w->d_ms / w->a_ms;
    double fl = 100.0 * w->floor_ms / w->a_ms;
    char m[32], ci[48], msg[32], bw[32], z[32];

    if (b->tsv) {
        printf("%s\t%s\t%u\t%s\t%.0f\t%.3f\t%.3f\t%.3f\t%s\t%d\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f"
               "\t%.2f\t%.3f\t%.4f\t%.4f\t%d\t%.4f\t%.4f\n",
               e->name, xp->name, len, b->kv_name, epd__ob_req_bytes(&b->kv, len), ovh, fl, ovh - fl,
               w->link_bound ? "link" : "compute", w->n_pairs, w->model_ms, w->a_ms, w->b_ms, w->d_ms, w->d_lo_ms, w->d_hi_ms, w->z_ms,
               w->zd_ms, w->msg_us, w->link_gbs, w->floor_ms, w->a_compute_ms, w->a_flag,
               w->tail_ms, w->verify_ms);
        return;
    }
    ob_fmt(m, sizeof(m), "%8.3f", w->model_ms);
    if (isnan(w->d_lo_ms)) {
        snprintf(ci, sizeof(ci), "[-]");
    } else {
        snprintf(ci, sizeof(ci), "[%+.3f, %+.3f]", w->d_lo_ms, w->d_hi_ms);
    }
    ob_fmt(msg, sizeof(msg), "%6.1f", w->msg_us);
    ob_fmt(bw, sizeof(bw), "%7.2f", w->link_gbs);
    ob_fmt(z, sizeof(z), "%+8.3f", w->zd_ms);
    printf("%-11s %-7s %6u %-*s %8.3f %5d | %8s %7.3f%s %8.3f | %+8.3f %-19s %6.2f%% | %6s %7s "
           "%8.3f %6.2f%% %6.2f%% %-7s | %8s\n",
           e->name, xp->name, len, b->kv_w, b->kv_name, epd__ob_req_bytes(&b->kv, len) / 1e6, w->n_pairs, m, w->a_ms, w->a_flag ? "!" : " ", w->b_ms,
           w->d_ms, ci, ovh, msg, bw, w->floor_ms, fl, ovh - fl,
           w->link_bound ? "link" : "compute", z);
    printf("%-28s compute A %.3f B %.3f  tail %.3f  verify %.3f  queue %.3f  resv %.3f  step1 "
           "%.3f ms%s\n",
           "", w->a_compute_ms, w->b_compute_ms, w->tail_ms, w->verify_ms, w->queue_ms, w->resv_ms,
           w->step1_ms,
           w->a_flag ? "  (A! = A's compute took > 2% longer than the model)" : "");
}
