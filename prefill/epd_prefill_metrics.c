/*
 * epd_prefill_metrics.c — the prefill role's part of /metrics
 * (--metrics-addr; the daemon renders the families every role has):
 * where each request's time went on this worker (rule 38's phases, the
 * same durations PrefillComplete carries to decode), the KV landing after
 * compute, prompt and cached tokens per request, the prefix cache and
 * images.  The request layer observes on the loop thread; this renders.
 */
#include "epd_prefill_int.h"
#include "epd_time.h"

/* b - a, 0 when b is not after a (a clock read on another thread may be
 * a hair earlier than the loop's) */
static uint64_t epd_prefill_span(uint64_t a, uint64_t b)
{
    return b > a ? b - a : 0;
}

void epd__prefill_metrics_phases(epd_prefill_srv_t *srv, epd_prefill_req_t *req, uint64_t now,
                                 Epd__PhaseTimes *t_p)
{
    uint64_t media = req->t_media_ns != 0 ? req->t_media_ns : req->t_admit_ns;
    uint64_t start = req->t_start_ns > media ? req->t_start_ns : media;
    uint64_t cached = (uint64_t)req->hit_blocks * srv->info->kv.block_tokens;

    t_p->encode_ns = epd_prefill_span(req->t_admit_ns, media);
    t_p->prefill_queue_ns = epd_prefill_span(media, start);
    t_p->prefill_compute_ns = epd_prefill_span(start, req->t_finished_ns);
    t_p->kv_tail_ns = req->prefill_only ? 0 : epd_prefill_span(req->t_finished_ns, now);
    t_p->cached_tokens = (uint32_t)(cached < req->n_tokens ? cached : req->n_tokens);
    epd_prom_histo_observe_ns(&srv->hist.encode, t_p->encode_ns);
    epd_prom_histo_observe_ns(&srv->hist.queue, t_p->prefill_queue_ns);
    epd_prom_histo_observe_ns(&srv->hist.compute, t_p->prefill_compute_ns);
    if (!req->prefill_only) {
        epd_prom_histo_observe_ns(&srv->hist.kv_tail, t_p->kv_tail_ns);
    }
    epd_prom_histo_observe(&srv->hist.prompt, req->n_tokens);
    epd_prom_histo_observe(&srv->hist.cached, t_p->cached_tokens);
}

void epd__prefill_metrics_landed(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    if (req->xfer.writes_inflight == 0 && !req->prefill_only && !req->landed_seen) {
        req->landed_seen = 1;
        epd_prom_histo_observe_ns(&srv->hist.landed,
                                  epd_prefill_span(req->t_finished_ns, epd_time_now_ns()));
    }
}

void epd__prefill_metrics_init(epd_prefill_srv_t *srv)
{
    epd_prom_histo_init(&srv->hist.encode, EPD_PROM_SECONDS);
    epd_prom_histo_init(&srv->hist.queue, EPD_PROM_SECONDS);
    epd_prom_histo_init(&srv->hist.compute, EPD_PROM_SECONDS);
    epd_prom_histo_init(&srv->hist.kv_tail, EPD_PROM_SECONDS);
    epd_prom_histo_init(&srv->hist.landed, EPD_PROM_SECONDS);
    epd_prom_histo_init(&srv->hist.prompt, EPD_PROM_TOKENS);
    epd_prom_histo_init(&srv->hist.cached, EPD_PROM_TOKENS);
}

static void epd_prefill_metrics_histo(epd_prom_text_t *t, const char *name, const char *help,
                                      const char *model, const epd_prom_histo_t *h)
{
    epd_prom_family(t, name, "histogram", help);
    epd_prom_histo(t, name, model, NULL, h);
}

void epd__prefill_metrics_render(void *arg, const char *model, epd_prom_text_t *t)
{
    epd_prefill_srv_t *srv = arg;

    epd_prefill_metrics_histo(t, "epd_prefill_encode_seconds",
                              "Request received to every image's embeddings ready (0 without "
                              "images)",
                              model, &srv->hist.encode);
    epd_prefill_metrics_histo(t, "epd_prefill_queue_seconds",
                              "Images ready (or received) to the run starting on the compute "
                              "thread",
                              model, &srv->hist.queue);
    epd_prefill_metrics_histo(t, "epd_prefill_compute_seconds",
                              "The run: every layer of the prompt and sampling the first token",
                              model, &srv->hist.compute);
    epd_prefill_metrics_histo(t, "epd_prefill_kv_tail_seconds",
                              "Compute done to PrefillComplete posted, fenced behind the last "
                              "KV write (the transfer not hidden behind compute)",
                              model, &srv->hist.kv_tail);
    epd_prefill_metrics_histo(t, "epd_prefill_kv_landed_seconds",
                              "Compute done to the request's last KV write completed", model,
                              &srv->hist.landed);
    epd_prefill_metrics_histo(t, "epd_prefill_prompt_tokens", "Prompt tokens per request", model,
                              &srv->hist.prompt);
    epd_prefill_metrics_histo(t, "epd_prefill_cached_tokens",
                              "Prompt tokens per request served by the prefix cache", model,
                              &srv->hist.cached);
    epd_prom_counter(t, "epd_prefill_layer_notices_total",
                     "Landed LayerDone messages sent (decode verifies while compute goes on)",
                     model, srv->layer_notices);
    epd_prom_counter(t, "epd_prefill_runs_held_total",
                     "Runs that waited for their KV reservation (rule 34, under pressure)", model,
                     srv->runs_held);
    epd_prom_family(t, "epd_prefill_images_total", "counter",
                    "Images by where their embeddings came from: cache (hit), encoder, local");
    epd_prom_sample_u64(t, "epd_prefill_images_total", model, "source=\"cache\"", srv->embed_hits);
    epd_prom_sample_u64(t, "epd_prefill_images_total", model, "source=\"encoder\"",
                        srv->embed_misses);
    epd_prom_sample_u64(t, "epd_prefill_images_total", model, "source=\"local\"", srv->embed_local);
}
