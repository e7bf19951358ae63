/*
 * epd_prom.c — Prometheus text exposition (see epd_prom.h).
 */
#include "epd_prom.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"

typedef struct {
    size_t n;
    double b[EPD_PROM_BUCKETS_MAX];
} epd_prom_set_t;

static const epd_prom_set_t epd_prom_sets[EPD_PROM_BOUND_SETS] = {
    [EPD_PROM_SECONDS] = {20,
                          {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                           0.25,   0.5,     1.0,    2.5,   5.0,    10.0,  20.0, 30.0,  45.0, 60.0}},
    [EPD_PROM_COUNT] = {12, {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048}},
    [EPD_PROM_TOKENS] = {9, {16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576}},
};

void epd_prom_histo_init(epd_prom_histo_t *h, epd_prom_bounds_t b)
{
    h->bounds = b;
    for (size_t i = 0; i <= EPD_PROM_BUCKETS_MAX; i++) {
        atomic_init(&h->counts[i], 0);
    }
    atomic_init(&h->sum, 0.0);
}

void epd_prom_histo_observe(epd_prom_histo_t *h, double v)
{
    const epd_prom_set_t *s = &epd_prom_sets[h->bounds];
    size_t i = 0;

    while (i < s->n && v > s->b[i]) {
        i++;
    }
    atomic_fetch_add_explicit(&h->counts[i], 1, memory_order_relaxed);
    /* one writer: a load and a store cannot lose an addition */
    atomic_store_explicit(&h->sum, atomic_load_explicit(&h->sum, memory_order_relaxed) + v,
                          memory_order_relaxed);
}

void epd_prom_histo_observe_ns(epd_prom_histo_t *h, uint64_t ns)
{
    epd_prom_histo_observe(h, (double)ns / 1e9);
}

void epd_prom_printf(epd_prom_text_t *t, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (t->failed) {
        return;
    }
    for (;;) {
        size_t room = t->cap - t->len;

        va_start(ap, fmt);
        n = vsnprintf(t->data != NULL ? t->data + t->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = 1;
            return;
        }
        if ((size_t)n < room) {
            t->len += (size_t)n;
            return;
        }
        {
            size_t cap = (t->cap + (size_t)n + 1) * 2;
            char *p = epd_realloc(t->data, cap);

            if (p == NULL) {
                t->failed = 1;
                return;
            }
            t->data = p;
            t->cap = cap;
        }
    }
}

void epd_prom_text_cleanup(epd_prom_text_t *t)
{
    epd_free(t->data);
    memset(t, 0, sizeof(*t));
}

void epd_prom_label(epd_prom_text_t *t, const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '\\' || *s == '"') {
            epd_prom_printf(t, "\\%c", *s);
        } else if (*s == '\n') {
            epd_prom_printf(t, "\\n");
        } else {
            epd_prom_printf(t, "%c", *s);
        }
    }
}

void epd_prom_family(epd_prom_text_t *t, const char *name, const char *type, const char *help)
{
    epd_prom_printf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{model="..."[,extra] */
static void epd_prom_head(epd_prom_text_t *t, const char *name, const char *suffix,
                          const char *model, const char *extra)
{
    epd_prom_printf(t, "%s%s{model=\"", name, suffix);
    epd_prom_label(t, model);
    epd_prom_printf(t, "\"%s%s", extra != NULL ? "," : "", extra != NULL ? extra : "");
}

void epd_prom_sample(epd_prom_text_t *t, const char *name, const char *model, const char *extra,
                     double value)
{
    epd_prom_head(t, name, "", model, extra);
    epd_prom_printf(t, "} %.9g\n", value);
}

void epd_prom_sample_u64(epd_prom_text_t *t, const char *name, const char *model, const char *extra,
                         uint64_t value)
{
    epd_prom_head(t, name, "", model, extra);
    epd_prom_printf(t, "} %llu\n", (unsigned long long)value);
}

void epd_prom_histo(epd_prom_text_t *t, const char *name, const char *model, const char *extra,
                    const epd_prom_histo_t *h)
{
    const epd_prom_set_t *s = &epd_prom_sets[h->bounds];
    uint64_t counts[EPD_PROM_BUCKETS_MAX + 1];
    uint64_t cum = 0;
    double sum;

    /* the buckets first, so _count (their total) and +Inf agree */
    for (size_t i = 0; i <= s->n; i++) {
        counts[i] = atomic_load_explicit(&h->counts[i], memory_order_relaxed);
    }
    sum = atomic_load_explicit(&h->sum, memory_order_relaxed);
    for (size_t i = 0; i < s->n; i++) {
        cum += counts[i];
        epd_prom_head(t, name, "_bucket", model, extra);
        /* whole bounds in full (1048576, not 1.04858e+06) */
        epd_prom_printf(t,
                        s->b[i] >= 1.0 && s->b[i] == (double)(uint64_t)s->b[i]
                            ? ",le=\"%.0f\"} %llu\n"
                            : ",le=\"%g\"} %llu\n",
                        s->b[i], (unsigned long long)cum);
    }
    cum += counts[s->n];
    epd_prom_head(t, name, "_bucket", model, extra);
    epd_prom_printf(t, ",le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    epd_prom_head(t, name, "_sum", model, extra);
    epd_prom_printf(t, "} %.9f\n", sum);
    epd_prom_head(t, name, "_count", model, extra);
    epd_prom_printf(t, "} %llu\n", (unsigned long long)cum);
}

void epd_prom_counter(epd_prom_text_t *t, const char *name, const char *help, const char *model,
                      uint64_t value)
{
    epd_prom_family(t, name, "counter", help);
    epd_prom_sample_u64(t, name, model, NULL, value);
}

void epd_prom_gauge(epd_prom_text_t *t, const char *name, const char *help, const char *model,
                    double value)
{
    epd_prom_family(t, name, "gauge", help);
    epd_prom_sample(t, name, model, NULL, value);
}
