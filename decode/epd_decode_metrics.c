/*
 * epd_decode_metrics.c — the decode role's part of /metrics
 * (--metrics-addr; the daemon renders the families every role has, KV
 * blocks and preemptions among them): the batch's step time and size (its
 * compute thread observes), the request's KV tail and hand-off (rule 38,
 * the durations the first TokenChunk carries to the router), and KV
 * verification failures.
 */
#include "epd_decode_batch.h"
#include "epd_decode_int.h"
#include "epd_time.h"

void epd__decode_metrics_init(epd_decode_srv_t *srv)
{
    epd_prom_histo_init(&srv->hist.kv_tail, EPD_PROM_SECONDS);
    epd_prom_histo_init(&srv->hist.handoff, EPD_PROM_SECONDS);
    epd_prom_histo_init(&srv->hist.wait, EPD_PROM_SECONDS);
}

static void epd_decode_metrics_histo(epd_prom_text_t *t, const char *name, const char *help,
                                     const char *model, const epd_prom_histo_t *h)
{
    epd_prom_family(t, name, "histogram", help);
    epd_prom_histo(t, name, model, NULL, h);
}

void epd__decode_metrics_render(void *arg, const char *model, epd_prom_text_t *t)
{
    epd_decode_srv_t *srv = arg;
    epd_prom_histo_t empty_s, empty_c;

    /* before the batch exists (setup failed half way): empty histograms,
     * so the families never come and go */
    epd_prom_histo_init(&empty_s, EPD_PROM_SECONDS);
    epd_prom_histo_init(&empty_c, EPD_PROM_COUNT);
    epd_decode_metrics_histo(
        t, "epd_decode_step_seconds",
        "One batch step that ran at least one sequence (compute thread)", model,
        srv->batch != NULL ? epd_decode_batch_step_histo(srv->batch) : &empty_s);
    epd_decode_metrics_histo(t, "epd_decode_batch_size", "Sequences a batch step ran", model,
                             srv->batch != NULL ? epd_decode_batch_size_histo(srv->batch)
                                                : &empty_c);
    epd_prom_gauge(t, "epd_decode_batch_running", "Sequences in the batch now", model,
                   srv->batch != NULL ? epd_decode_batch_running(srv->batch) : 0);
    epd_prom_counter(t, "epd_decode_steps_total", "Batch steps run", model,
                     srv->batch != NULL ? epd_decode_batch_steps(srv->batch) : 0);
    epd_decode_metrics_histo(t, "epd_decode_kv_tail_seconds",
                             "PrefillComplete received to the request's KV held (every layer "
                             "verified)",
                             model, &srv->hist.kv_tail);
    epd_decode_metrics_histo(t, "epd_decode_handoff_seconds",
                             "The KV held to the request's first TokenChunk posted", model,
                             &srv->hist.handoff);
    epd_decode_metrics_histo(t, "epd_decode_kv_wait_seconds",
                             "GenerateRequest received to the request's KV held", model,
                             &srv->hist.wait);
    epd_prom_counter(t, "epd_decode_kv_range_checks_total",
                     "Chunked prefill: checks of a layer's blocks as they landed, before the "
                     "layer's end (LayerDone with blocks)",
                     model, srv->kv_range_checks);
    epd_prom_counter(t, "epd_decode_kv_range_bytes_total",
                     "Chunked prefill: KV bytes verified as their chunk landed", model,
                     srv->kv_range_bytes);
    epd_prom_counter(t, "epd_decode_verification_failures_total",
                     "Requests failed because their KV did not match its checksums", model,
                     srv->verify_failures);
}

void epd__decode_metrics_times_in(epd_decode_request_t *req, const Epd__PhaseTimes *pt,
                                  uint64_t t_recv)
{
    req->t_pc_ns = t_recv;
    epd__phase_times__init(&req->times);
    if (pt != NULL) {
        req->times.encode_ns = pt->encode_ns;
        req->times.prefill_queue_ns = pt->prefill_queue_ns;
        req->times.prefill_compute_ns = pt->prefill_compute_ns;
        req->times.kv_tail_ns = pt->kv_tail_ns;
        req->times.cached_tokens = pt->cached_tokens;
    }
}

void epd__decode_metrics_held(epd_decode_srv_t *srv, epd_decode_request_t *req)
{
    uint64_t tail = req->t_join_ns > req->t_pc_ns ? req->t_join_ns - req->t_pc_ns : 0;

    if (req->n_resume != 0) {
        return; /* a resume's first chunk is not the request's first token */
    }
    /* our part of the KV tail, then the hand-off to the first chunk */
    req->times.kv_tail_ns += tail;
    epd_trace_span(srv->trace, "KV tail (verify)", "xfer", req->id, -1, req->t_pc_ns,
                   req->t_join_ns);
    epd_prom_histo_observe_ns(&srv->hist.kv_tail, tail);
    epd_prom_histo_observe_ns(&srv->hist.wait, req->t_join_ns - req->t_recv_ns);
    req->times.handoff_ns = epd_time_now_ns() - req->t_join_ns;
    epd_prom_histo_observe_ns(&srv->hist.handoff, req->times.handoff_ns);
    req->send_times = 1;
}
