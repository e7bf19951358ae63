/*
 * test_epd_prefill_trace.c — the daemons' --trace output, end to end.
 *
 * Runs `epd-bench overhead` on a tiny ref model over loopback UCX (one
 * prefill-only request and one prefill + transfer request against a live
 * prefill and decode daemon, both started with --trace), then parses with
 * jansson: the merged one-request trace (--trace FILE) and each daemon's own
 * file.  Checks structure only — never a duration (benchmarks measure,
 * tests judge): valid Chrome trace JSON; for the transferred request one
 * compute span and one KV write span per layer on prefill, the messages on
 * both sides, decode's verification and "KV held"; for the prefill-only
 * request compute spans per layer, its answer, and no write at all.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#define N_LAYERS 4

static char tdir[256];
static char bin[512];

static const char *build_dir(void)
{
    const char *b = getenv("EPD_BUILD");

    return b != NULL && b[0] != '\0' ? b : "build";
}

/* Runs the bench once; fills tdir with its output and the daemons' files. */
static int setup(void **state)
{
    char cmd[4096];
    char line[1024];
    FILE *f;

    (void)state;
    snprintf(bin, sizeof(bin), "%s/bin", build_dir());
    snprintf(tdir, sizeof(tdir), "/tmp/epd-trace-test-XXXXXX");
    assert_non_null(mkdtemp(tdir));
    snprintf(cmd, sizeof(cmd),
             "'%s/epd-mkmodel' --out '%s/model' --layers %d --dim 64 --heads 4 --kv-heads 2 "
             "--layer-pattern LA --ffn 128 --max-context 1024 > '%s/mkmodel.log' 2>&1",
             bin, tdir, N_LAYERS, tdir);
    assert_int_equal(system(cmd), 0);
    snprintf(
        cmd, sizeof(cmd),
        "UCX_TLS=posix,cma,tcp UCX_NET_DEVICES=lo '%s/epd-bench' overhead --engines ref "
        "--ref-model '%s/model' --transports ucx-shm --ref-lengths 100 --reps-ref 1 --warmup 0 "
        "--groups per-layer --trace-length 100 --trace '%s/merged.json' --keep "
        "> '%s/bench.out' 2> '%s/bench.err'",
        bin, tdir, tdir, tdir, tdir);
    if (system(cmd) != 0) {
        snprintf(cmd, sizeof(cmd), "cat '%s/bench.out' '%s/bench.err' >&2", tdir, tdir);
        (void)system(cmd);
        fail_msg("epd-bench overhead failed");
    }
    /* where --keep left the daemons' own traces */
    snprintf(cmd, sizeof(cmd), "%s/bench.out", tdir);
    f = fopen(cmd, "r");
    assert_non_null(f);
    while (fgets(line, sizeof(line), f) != NULL) {
        const char *p = strstr(line, "kept in ");

        if (p != NULL) {
            char kept[512];

            snprintf(kept, sizeof(kept), "%s", p + 8);
            kept[strcspn(kept, "\n")] = '\0';
            snprintf(cmd, sizeof(cmd), "cp '%s/p.json' '%s/d.json' '%s/' && rm -rf '%s'", kept,
                     kept, tdir, kept);
            assert_int_equal(system(cmd), 0);
        }
    }
    fclose(f);
    return 0;
}

static int teardown(void **state)
{
    char cmd[512];

    (void)state;
    if (getenv("EPD_TEST_KEEP") == NULL) {
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tdir);
        (void)system(cmd);
    }
    return 0;
}

static json_t *load(const char *name)
{
    char path[512];
    json_error_t err;
    json_t *root;

    snprintf(path, sizeof(path), "%s/%s", tdir, name);
    root = json_load_file(path, 0, &err);
    if (root == NULL) {
        fail_msg("%s: not valid JSON: %s (line %d)", path, err.text, err.line);
    }
    assert_true(json_is_array(json_object_get(root, "traceEvents")));
    return root;
}

typedef struct {
    uint64_t req;   /* 0: any */
    const char *ph; /* NULL: any */
    long pid;       /* 0: any */
} want_t;

/* Events named `name` matching `w`; counts per layer into per_layer (when
 * not NULL, layers 0..N_LAYERS-1). */
static int count(json_t *root, const char *name, const want_t *w, int *per_layer)
{
    json_t *evs = json_object_get(root, "traceEvents"), *e;
    size_t i;
    int n = 0;

    json_array_foreach(evs, i, e)
    {
        const char *nm = json_string_value(json_object_get(e, "name"));
        const char *ph = json_string_value(json_object_get(e, "ph"));
        json_t *args = json_object_get(e, "args");
        json_t *req = json_object_get(args, "req");
        json_t *layer = json_object_get(args, "layer");

        if (nm == NULL || strcmp(nm, name) != 0 || ph == NULL) {
            continue;
        }
        if (w->ph != NULL && strcmp(ph, w->ph) != 0) {
            continue;
        }
        if (w->req != 0 && (!json_is_integer(req) || (uint64_t)json_integer_value(req) != w->req)) {
            continue;
        }
        if (w->pid != 0 && json_integer_value(json_object_get(e, "pid")) != w->pid) {
            continue;
        }
        /* every event is well formed: a timestamp, and a duration for spans */
        assert_true(json_is_number(json_object_get(e, "ts")));
        if (strcmp(ph, "X") == 0) {
            assert_true(json_is_number(json_object_get(e, "dur")));
            assert_true(json_number_value(json_object_get(e, "dur")) >= 0.0);
        }
        if (per_layer != NULL && json_is_integer(layer)) {
            json_int_t l = json_integer_value(layer);

            assert_in_range(l, 0, N_LAYERS - 1);
            per_layer[l]++;
        }
        n++;
    }
    return n;
}

/* The id of the (only) request an event named `name` carries. */
static uint64_t req_of(json_t *root, const char *name)
{
    json_t *evs = json_object_get(root, "traceEvents"), *e;
    size_t i;

    json_array_foreach(evs, i, e)
    {
        const char *nm = json_string_value(json_object_get(e, "name"));

        if (nm != NULL && strcmp(nm, name) == 0) {
            return (uint64_t)json_integer_value(json_object_get(json_object_get(e, "args"), "req"));
        }
    }
    fail_msg("no '%s' event", name);
    return 0;
}

/* pid of the process whose process_name starts with `prefix`. */
static long pid_of(json_t *root, const char *prefix)
{
    json_t *evs = json_object_get(root, "traceEvents"), *e;
    size_t i;

    json_array_foreach(evs, i, e)
    {
        const char *nm = json_string_value(json_object_get(e, "name"));
        const char *pn = json_string_value(json_object_get(json_object_get(e, "args"), "name"));

        if (nm != NULL && strcmp(nm, "process_name") == 0 && pn != NULL &&
            strncmp(pn, prefix, strlen(prefix)) == 0) {
            return (long)json_integer_value(json_object_get(e, "pid"));
        }
    }
    fail_msg("no process named '%s...'", prefix);
    return 0;
}

static void check_transferred(json_t *root, uint64_t id, long ppid, long dpid)
{
    int compute[N_LAYERS] = {0}, writes[N_LAYERS] = {0};
    want_t p_span = {id, "X", ppid}, p_inst = {id, "i", ppid};
    want_t d_span = {id, "X", dpid}, d_inst = {id, "i", dpid};

    /* prefill: one compute span and one write span (posted -> completed)
     * per layer, attention and linear alike */
    assert_int_equal(count(root, "compute", &p_span, compute), N_LAYERS);
    assert_int_equal(count(root, "KV write", &p_span, writes), N_LAYERS);
    for (int l = 0; l < N_LAYERS; l++) {
        assert_int_equal(compute[l], 1);
        assert_int_equal(writes[l], 1);
    }
    assert_int_equal(count(root, "GenerateRequest received", &p_inst, NULL), 1);
    assert_int_equal(count(root, "queued", &p_span, NULL), 1);
    assert_int_equal(count(root, "prefill", &p_span, NULL), 1);
    assert_int_equal(count(root, "KvReservation received", &p_inst, NULL), 1);
    assert_int_equal(count(root, "PrefillComplete sent", &p_inst, NULL), 1);
    /* decode: the reservation, the completion message, verification */
    assert_int_equal(count(root, "GenerateRequest received", &d_inst, NULL), 1);
    assert_int_equal(count(root, "reserve", &d_span, NULL), 1);
    assert_int_equal(count(root, "KvReservation sent", &d_inst, NULL), 1);
    assert_int_equal(count(root, "PrefillComplete received", &d_inst, NULL), 1);
    /* per-layer verification: each layer's LayerDone (fenced behind its
     * writes) is sent once and checked once on arrival — but the last
     * layer's only when compute was not done by the time its writes were
     * posted (else PrefillComplete carries its checksum, proto/README.md
     * step 4); every layer is checked exactly once, nothing is left for a
     * final pass */
    {
        int sent[N_LAYERS] = {0}, recv[N_LAYERS] = {0}, checked[N_LAYERS] = {0};
        int n_sent = count(root, "LayerDone sent", &p_inst, sent);

        assert_true(n_sent == N_LAYERS - 1 || n_sent == N_LAYERS);
        assert_int_equal(count(root, "LayerDone received", &d_inst, recv), n_sent);
        assert_int_equal(count(root, "verify layer", &d_span, checked), N_LAYERS);
        for (int l = 0; l < N_LAYERS; l++) {
            assert_int_equal(sent[l], l < N_LAYERS - 1 ? 1 : n_sent - (N_LAYERS - 1));
            assert_int_equal(recv[l], sent[l]);
            assert_int_equal(checked[l], 1);
        }
    }
    assert_int_equal(count(root, "verify KV", &d_span, NULL), 0);
    assert_int_equal(count(root, "KV held", &d_inst, NULL), 1);
    assert_int_equal(count(root, "first decode step", &d_span, NULL), 1);
}

static void test_merged_trace(void **state)
{
    json_t *m = load("merged.json");
    long ppid = pid_of(m, "epd-prefill");
    long dpid = pid_of(m, "epd-decode");
    uint64_t id = req_of(m, "PrefillComplete sent");
    want_t any = {0, NULL, 0};

    (void)state;
    assert_true(ppid != dpid);
    check_transferred(m, id, ppid, dpid);
    /* one request only: nothing of the prefill-only one */
    assert_int_equal(count(m, "first token sent", &any, NULL), 0);
    assert_int_equal(count(m, "GenerateRequest received (prefill only)", &any, NULL), 0);
    json_decref(m);
}

static void test_daemon_traces(void **state)
{
    json_t *p = load("p.json");
    json_t *d = load("d.json");
    long ppid = pid_of(p, "epd-prefill");
    long dpid = pid_of(d, "epd-decode");
    uint64_t id_b = req_of(p, "PrefillComplete sent");
    uint64_t id_a = req_of(p, "GenerateRequest received (prefill only)");
    int compute[N_LAYERS] = {0};
    want_t a_span = {id_a, "X", 0}, a_inst = {id_a, "i", 0};
    json_t *both = json_object();
    json_t *evs = json_array();

    (void)state;
    assert_true(id_a != id_b);
    /* the prefill-only request: computed layer by layer, answered, and not
     * one write or message towards decode */
    assert_int_equal(count(p, "compute", &a_span, compute), N_LAYERS);
    for (int l = 0; l < N_LAYERS; l++) {
        assert_int_equal(compute[l], 1);
    }
    assert_int_equal(count(p, "first token sent", &a_inst, NULL), 1);
    assert_int_equal(count(p, "KV write", &a_span, NULL), 0);
    assert_int_equal(count(p, "PrefillComplete sent", &a_inst, NULL), 0);
    assert_int_equal(count(d, "GenerateRequest received", &a_inst, NULL), 0);
    /* the transferred one, from the two files side by side */
    json_array_extend(evs, json_object_get(p, "traceEvents"));
    json_array_extend(evs, json_object_get(d, "traceEvents"));
    json_object_set_new(both, "traceEvents", evs);
    check_transferred(both, id_b, ppid, dpid);
    json_decref(both);
    json_decref(p);
    json_decref(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merged_trace),
        cmocka_unit_test(test_daemon_traces),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
