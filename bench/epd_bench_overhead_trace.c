/*
 * epd_bench_overhead_trace.c — the daemons' traces into the requests of
 * `epd-bench overhead`: each event of ours (by request id) folded into its
 * ob_req_t (arrival, queue, compute, per-layer KV writes and LayerDone,
 * KV held), a whole trace file read (one-host mode; the attach mode folds
 * the events it fetched), and one request of both daemons merged into one
 * Chrome trace file (--trace).  The benchmark's thread.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "epd_alloc.h"
#include "epd_bench_overhead_int.h"

ob_req_t *epd__ob_find(ob_t *b, uint64_t id)
{
    for (int i = b->n_reqs; i-- > 0;) {
        if (b->reqs[i].id == id) {
            return &b->reqs[i];
        }
    }
    return NULL;
}

/* Appends [s, e) of `layer` to `list` (a failed allocation drops it: the
 * floor then misses a moment, never invents one). */
static void ob_spans_add(ob_spans_t *list, uint32_t layer, double s, double e)
{
    if (list->n == list->cap) {
        int cap = list->cap > 0 ? list->cap * 2 : 128;
        ob_span_t *v = epd_realloc(list->v, (size_t)cap * sizeof(*v));

        if (v == NULL) {
            return;
        }
        list->v = v;
        list->cap = cap;
    }
    list->v[list->n++] = (ob_span_t){.s = s, .e = e, .layer = layer};
}

/* Folds one trace event (ns on the benchmark's clock) into its request,
 * if it is one of ours. */
void epd__ob_fold(ob_t *b, int is_decode, const char *name, uint64_t req, long long layer,
                  double ts, double dur)
{
    int lok = layer >= 0 && layer < (long long)b->kv.n_layers;
    ob_req_t *r = epd__ob_find(b, req);

    if (r == NULL) {
        return;
    }
    if (!is_decode) {
        if (strncmp(name, "GenerateRequest received", 24) == 0) {
            r->p_recv = ts;
        } else if (strcmp(name, "queued") == 0) {
            r->q_end = ts + dur;
        } else if (strcmp(name, "prefill") == 0) {
            r->c_start = ts;
            r->c_end = ts + dur;
        } else if (strcmp(name, "compute") == 0 && lok) {
            ob_spans_add(&r->ready, (uint32_t)layer, ts, ts + dur);
        } else if (strcmp(name, "KV write") == 0 && lok) {
            ob_spans_add(&r->writes, (uint32_t)layer, ts, ts + dur);
        } else if (strcmp(name, "LayerDone sent") == 0 && lok && r->ld_sent[layer] == 0) {
            r->ld_sent[layer] = ts;
        } else if (strcmp(name, "KvReservation received") == 0) {
            r->resv = ts;
        }
    } else {
        if (strcmp(name, "KV held") == 0) {
            r->d_held = ts;
        } else if (strcmp(name, "first decode step") == 0) {
            r->step1 = dur;
        } else if (strcmp(name, "PrefillComplete received") == 0) {
            r->pc_recv = ts;
        } else if (strcmp(name, "LayerDone received") == 0 && lok && r->ld_rx[layer] == 0) {
            r->ld_rx[layer] = ts;
        }
    }
}

/* Folds one daemon's trace into the requests.  Returns the root (owned by
 * the caller) or NULL. */
json_t *epd__ob_read_trace(ob_t *b, const char *path, int is_decode)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    json_t *evs, *e;
    size_t i;

    if (root == NULL) {
        fprintf(stderr, "overhead: trace %s: %s (line %d)\n", path, jerr.text, jerr.line);
        return NULL;
    }
    evs = json_object_get(root, "traceEvents");
    json_array_foreach(evs, i, e)
    {
        const char *name = json_string_value(json_object_get(e, "name"));
        json_t *args = json_object_get(e, "args");
        json_t *req = json_object_get(args, "req");
        json_t *lj = json_object_get(args, "layer");
        double ts = json_number_value(json_object_get(e, "ts")) * 1000.0;
        double dur = json_number_value(json_object_get(e, "dur")) * 1000.0;
        long long layer = json_is_integer(lj) ? json_integer_value(lj) : -1;

        if (name == NULL || !json_is_integer(req)) {
            continue;
        }
        epd__ob_fold(b, is_decode, name, (uint64_t)json_integer_value(req), layer, ts, dur);
    }
    return root;
}

/* Writes request `id`'s events of both daemons (and their track names)
 * into one Chrome trace file. */
int epd__ob_write_merged(const char *out, json_t *p, json_t *d, uint64_t id)
{
    json_t *root = json_object();
    json_t *all = json_array();
    json_t *srcs[2] = {p, d};
    int rc;

    for (int s = 0; s < 2; s++) {
        json_t *evs = json_object_get(srcs[s], "traceEvents"), *e;
        size_t i;

        json_array_foreach(evs, i, e)
        {
            const char *ph = json_string_value(json_object_get(e, "ph"));
            json_t *req = json_object_get(json_object_get(e, "args"), "req");

            if ((ph != NULL && strcmp(ph, "M") == 0) ||
                (json_is_integer(req) && (uint64_t)json_integer_value(req) == id)) {
                json_array_append(all, e);
            }
        }
    }
    json_object_set_new(root, "displayTimeUnit", json_string("ns"));
    json_object_set_new(root, "traceEvents", all);
    rc = json_dump_file(root, out, JSON_COMPACT);
    json_decref(root);
    return rc;
}
