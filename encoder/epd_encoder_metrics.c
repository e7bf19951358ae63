/*
 * epd_encoder_metrics.c — the encoder role's part of /metrics
 * (--metrics-addr; the daemon renders the families every role has, its
 * queue depth among them): per image, the wait for the compute thread, the
 * encode, and the write of its embeddings into the prefill worker.  The
 * encoder keeps no cache of its own: image cache hits happen at prefill
 * (epd_prefill_images_total{source="cache"}) and are routed by the router
 * (epd_router_image_cache_hits_total).
 */
#include "epd_encoder_int.h"

void epd__encoder_metrics_init(epd_encoder_srv_t *srv)
{
    epd_prom_histo_init(&srv->hist.queue, EPD_PROM_SECONDS);
    epd_prom_histo_init(&srv->hist.encode, EPD_PROM_SECONDS);
    epd_prom_histo_init(&srv->hist.write, EPD_PROM_SECONDS);
}

static void epd_encoder_metrics_histo(epd_prom_text_t *t, const char *name, const char *help,
                                      const char *model, const epd_prom_histo_t *h)
{
    epd_prom_family(t, name, "histogram", help);
    epd_prom_histo(t, name, model, NULL, h);
}

void epd__encoder_metrics_render(void *arg, const char *model, epd_prom_text_t *t)
{
    epd_encoder_srv_t *srv = arg;

    epd_encoder_metrics_histo(t, "epd_encoder_queue_seconds",
                              "EncodeRequest received to its encode started (per image)", model,
                              &srv->hist.queue);
    epd_encoder_metrics_histo(t, "epd_encoder_encode_seconds",
                              "Decoding the image and running the vision tower (per image)", model,
                              &srv->hist.encode);
    epd_encoder_metrics_histo(t, "epd_encoder_write_seconds",
                              "The embeddings' write into the prefill worker, posted to completed",
                              model, &srv->hist.write);
    epd_prom_counter(t, "epd_encoder_embedding_bytes_total",
                     "Embedding bytes written into prefill workers", model, srv->bytes_written);
    epd_prom_gauge(t, "epd_encoder_slots_free", "Free embedding slots (images at once)", model,
                   srv->n_free_slots);
}
