/*
 * epd_bench_overhead_row.c — one row of `epd-bench overhead` from its
 * requests: the medians of A, B, Z and the paired B - A with its interval
 * (epd_bench_stats.c), the link's bandwidth and the message latency, the
 * physical floor per B request (epd_bench_overhead.c's top comment says
 * how), and the row printed as a table line or --tsv.  Both modes print
 * through it.  The benchmark's thread.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

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

/* The KV of a B request over the union of its layers' write spans (B/s),
 * or 0 when it wrote nothing. */
static double ob_req_bw(const ob_t *b, const ob_req_t *r)
{
    double bytes = 0.0, busy = 0.0, cur_s = 0.0, cur_e = -1.0;
    double s[EPD_KV_MAX_LAYERS], e[EPD_KV_MAX_LAYERS];
    int n = 0;

    for (uint32_t l = 0; l < b->kv.n_layers; l++) {
        if (r->wr_e[l] > r->wr_s[l]) {
            s[n] = r->wr_s[l];
            e[n] = r->wr_e[l];
            n++;
            bytes += epd__ob_layer_bytes(&b->kv, l, r->n_tokens);
        }
    }
    /* spans are in layer order and nearly sorted; a union by insertion */
    for (int i = 1; i < n; i++) {
        for (int j = i; j > 0 && s[j] < s[j - 1]; j--) {
            double t = s[j];
            s[j] = s[j - 1];
            s[j - 1] = t;
            t = e[j];
            e[j] = e[j - 1];
            e[j - 1] = t;
        }
    }
    for (int i = 0; i < n; i++) {
        if (s[i] > cur_e) {
            busy += cur_e > cur_s ? cur_e - cur_s : 0.0;
            cur_s = s[i];
            cur_e = e[i];
        } else if (e[i] > cur_e) {
            cur_e = e[i];
        }
    }
    busy += cur_e > cur_s ? cur_e - cur_s : 0.0;
    return busy > 0.0 ? bytes / (busy / 1e9) : 0.0;
}

/* The floor of B - A for one B request (ns), given the link's bandwidth
 * (B/s) and one message's latency (ns); *link_bound_p says whether the
 * link, not the compute, sets it. */
static double ob_req_floor(const ob_t *b, const ob_req_t *r, double bw, double msg,
                           int *link_bound_p)
{
    uint32_t L = b->kv.n_layers;
    double rest = 0.0, finish = 0.0, first_ready = 0.0, total = 0.0;
    uint32_t arg = L;

    for (uint32_t l = L; l-- > 0;) {
        double f;

        rest += epd__ob_layer_bytes(&b->kv, l, r->n_tokens);
        if (r->ready[l] <= 0.0 || bw <= 0.0) {
            continue;
        }
        f = r->ready[l] + rest / bw * 1e9;
        if (f > finish) {
            finish = f;
            arg = l;
        }
        first_ready = r->ready[l];
    }
    total = rest;
    *link_bound_p = arg + 1 < L ||
                    (bw > 0.0 && first_ready > 0.0 && total / bw * 1e9 > r->c_end - first_ready);
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
        double bw = ob_req_bw(b, r); /* the link as this request found it */

        vfl[nfl++] = ob_req_floor(b, r, bw > 0.0 ? bw : row->link_gbs * 1e9,
                                  isnan(row->msg_us) ? 0.0 : row->msg_us * 1e3, &lb);
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
