/*
 * test_epd_engine_sim.c — the `sim` engine: profile and sim.conf parsing
 * (shipped files load, bad files are refused with the line and the reason),
 * the timing formula against a hand computation, the scale invariant, the
 * KV (templates written once, stamps deterministic across instances and
 * prefix-dependent, chunked == whole, decode == prefill of the longer
 * prompt, continuation after a copy to another pool), the sink (at the
 * layer's modelled KV readiness, with the device checksum when asked), the
 * time actually spent (lower bounds only), decode validation, release,
 * open refusals and an allocation sweep.
 *
 * The tiny test model has 4 layers "LA" and an accelerator fast enough that
 * a layer of a 32-token prefill takes ~100 us, so the whole file runs in
 * well under a second.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "epd_alloc.h"
#include "epd_engine.h"
#include "epd_kv_stamp.h"
#include "epd_sim.h"
#include "epd_test_engine_util.h"
#include "epd_time.h"

#ifndef EPD_TEST_PROFILES
#error "EPD_TEST_PROFILES must name engine/profiles"
#endif
#ifndef EPD_TEST_BIN_DIR
#error "EPD_TEST_BIN_DIR must name the folder holding epd-generate"
#endif

#define VOCAB 300
#define BOS 256

static const char *tmpdir;
static char tiny_model[1024];
static char fast_accel[1024];
static char slow_accel[1024];

static const char TINY_MODEL[] = "# a tiny hybrid model for tests\n"
                                 "name = tiny\n"
                                 "n_layers = 4\n"
                                 "layer_pattern = LA\n"
                                 "hidden = 64\n"
                                 "n_heads = 4\n"
                                 "n_kv_heads = 2\n"
                                 "head_dim = 8\n"
                                 "kv_dtype = F32   # 64 B per K or V row pair\n"
                                 "state_bytes = 256\n"
                                 "active_params = 1e6\n"
                                 "total_params = 4e6\n"
                                 "weight_bytes = 1\n"
                                 "vocab = 300\n"
                                 "max_context = 512\n";

/* 2 * 1e6 / 4 = 5e5 FLOP per token per layer: 32 tokens ~ 100 us */
static const char FAST_ACCEL[] = "name = fast\nflops = 1.6e11\nmem_bw = 1e11\nhbm_bytes = 1e9\n";
/* memory-bound: 1e6 weight bytes per layer at 1e9 B/s = 1 ms per layer */
static const char SLOW_ACCEL[] = "name = slow\nflops = 1e15\nmem_bw = 1e9\nhbm_bytes = 1e9\n";

/* ---- helpers -------------------------------------------------------------- */

/* Writes a sim folder `name` under tmpdir and returns its path (static,
 * 8 rotating buffers). */
static const char *sim_dir(const char *name, const char *model, const char *accel, double scale,
                           epd_sim_mode_t mode, uint64_t seed)
{
    static char bufs[8][1024];
    static int next;
    char *dir = bufs[next++ % 8];
    epd_sim_options_t o = {
        .model = model, .accel = accel, .scale = scale, .mode = mode, .seed = seed};

    snprintf(dir, sizeof(bufs[0]), "%s/%s", tmpdir, name);
    assert_int_equal(epd_sim_conf_write(dir, &o), EPD_OK);
    return dir;
}

static epd_engine_t *open_sim(const char *dir, uint32_t block_tokens)
{
    epd_engine_config_t cfg = {.model_dir = dir, .block_tokens = block_tokens, .max_batch = 8};
    epd_engine_t *e = NULL;

    assert_int_equal(epd_engine_open("sim", &cfg, &e), EPD_OK);
    return e;
}

static epd_engine_t *open_tiny(void)
{
    return open_sim(sim_dir("tiny", tiny_model, fast_accel, 1.0, EPD_SIM_SLEEP, 1), 4);
}

static size_t make_prompt(const char *text, int32_t *toks)
{
    size_t n = 0;

    toks[n++] = BOS;
    for (const char *p = text; *p; p++) {
        toks[n++] = (unsigned char)*p;
    }
    return n;
}

static int32_t argmax(const float *x, size_t n)
{
    size_t best = 0;

    for (size_t i = 1; i < n; i++) {
        if (x[i] > x[best]) {
            best = i;
        }
    }
    return (int32_t)best;
}

static epd_kv_seq_t seq_of(const uint32_t *table, uint32_t n, uint32_t slot, uint64_t id)
{
    epd_kv_seq_t s = {.req_id = id, .block_table = table, .n_blocks = n, .state_slot = slot};

    return s;
}

/* Row r (0..2*kv_heads: K heads then V heads) of position pos in attention
 * layer `layer`. */
static const unsigned char *kv_row(const epd_engine_t *e, const epd_kv_pool_t *pool,
                                   const uint32_t *table, uint32_t layer, uint32_t pos, uint32_t r)
{
    const epd_kv_layout_t *kv = &epd_engine_info(e)->kv;
    size_t row = (size_t)kv->head_dim * epd_dtype_size(kv->dtype);
    uint64_t off;

    assert_int_equal(
        epd_kv_block_offset(kv, pool->n_blocks, layer, table[pos / kv->block_tokens], &off),
        EPD_OK);
    return (const unsigned char *)pool->base + off +
           ((size_t)r * kv->block_tokens + pos % kv->block_tokens) * row;
}

/* The stamp of block i of `table` in attention layer `layer` (valid). */
static epd_kv_stamp_t stamp_blk(const epd_engine_t *e, const epd_kv_pool_t *pool,
                                const uint32_t *table, uint32_t layer, uint32_t i)
{
    const epd_kv_layout_t *kv = &epd_engine_info(e)->kv;
    epd_kv_stamp_t st;
    uint64_t off;

    assert_int_equal(epd_kv_block_offset(kv, pool->n_blocks, layer, table[i], &off), EPD_OK);
    assert_int_equal(epd_kv_stamp_get((const unsigned char *)pool->base + off, kv->block_bytes, &st),
                     EPD_OK);
    return st;
}

/* 1 when two stamps say the same of their request (the body digest aside:
 * it follows the pool's template, which follows the block id). */
static int same_stamp(epd_kv_stamp_t a, epd_kv_stamp_t b)
{
    return a.req_id == b.req_id && a.tag == b.tag && a.hk == b.hk && a.layer == b.layer &&
           a.index == b.index && a.count == b.count;
}

static const unsigned char *state_of(const epd_engine_t *e, const epd_kv_pool_t *pool,
                                     uint32_t layer, uint32_t slot)
{
    const epd_kv_layout_t *kv = &epd_engine_info(e)->kv;
    uint64_t off;

    assert_int_equal(
        epd_kv_state_offset(kv, pool->n_blocks, pool->n_state_slots, layer, slot, &off), EPD_OK);
    return (const unsigned char *)pool->base + off;
}

/* 1 when every row of position pos (every attention layer) is equal in the
 * two pools / tables: the blocks' templates and stamps alike. */
static int rows_equal(const epd_engine_t *e, const epd_kv_pool_t *pa, const uint32_t *ta,
                      const epd_kv_pool_t *pb, const uint32_t *tb, uint32_t pos)
{
    const epd_kv_layout_t *kv = &epd_engine_info(e)->kv;
    size_t row = (size_t)kv->head_dim * epd_dtype_size(kv->dtype);

    for (uint32_t l = 0; l < kv->n_layers; l++) {
        if (kv->kind[l] != EPD_LAYER_ATTENTION) {
            continue;
        }
        for (uint32_t r = 0; r < 2 * kv->n_kv_heads; r++) {
            if (memcmp(kv_row(e, pa, ta, l, pos, r), kv_row(e, pb, tb, l, pos, r), row) != 0) {
                return 0;
            }
        }
    }
    return 1;
}

/* 1 when the stamps of the block holding pos say the same of their request
 * in every attention layer (what a request owns of a block). */
static int stamps_equal(const epd_engine_t *e, const epd_kv_pool_t *pa, const uint32_t *ta,
                        const epd_kv_pool_t *pb, const uint32_t *tb, uint32_t pos)
{
    const epd_kv_layout_t *kv = &epd_engine_info(e)->kv;

    for (uint32_t l = 0; l < kv->n_layers; l++) {
        if (kv->kind[l] == EPD_LAYER_ATTENTION &&
            !same_stamp(stamp_blk(e, pa, ta, l, pos / kv->block_tokens),
                        stamp_blk(e, pb, tb, l, pos / kv->block_tokens))) {
            return 0;
        }
    }
    return 1;
}

/* The same for the state slots (stamps of every linear layer). */
static int states_equal(const epd_engine_t *e, const epd_kv_pool_t *pa, uint32_t sa,
                        const epd_kv_pool_t *pb, uint32_t sb)
{
    const epd_kv_layout_t *kv = &epd_engine_info(e)->kv;

    for (uint32_t l = 0; l < kv->n_layers; l++) {
        epd_kv_stamp_t x, y;

        if (kv->kind[l] != EPD_LAYER_LINEAR) {
            continue;
        }
        if (epd_kv_stamp_get(state_of(e, pa, l, sa), kv->state_bytes, &x) != EPD_OK ||
            epd_kv_stamp_get(state_of(e, pb, l, sb), kv->state_bytes, &y) != EPD_OK ||
            !same_stamp(x, y)) {
            return 0;
        }
    }
    return 1;
}

/* Runs fn with stderr sent to a file; returns what was written (static). */
static const char *captured(epd_status_t (*fn)(const void *), const void *arg,
                            epd_status_t *status_p)
{
    static char out[4096];
    char path[1024];
    int saved;
    int fd;
    FILE *f;
    size_t n;

    snprintf(path, sizeof(path), "%s/stderr.txt", tmpdir);
    f = fopen(path, "w+");
    assert_non_null(f);
    fflush(stderr);
    saved = dup(2);
    fd = fileno(f);
    assert_true(saved >= 0 && dup2(fd, 2) >= 0);
    *status_p = fn(arg);
    fflush(stderr);
    assert_true(dup2(saved, 2) >= 0);
    close(saved);
    rewind(f);
    n = fread(out, 1, sizeof(out) - 1, f);
    out[n] = '\0';
    fclose(f);
    fprintf(stderr, "(captured) %.600s%s", out, n > 600 ? "...\n" : "");
    return out;
}

static epd_status_t parse_model_text(const void *text)
{
    epd_sim_model_t m;

    return epd_sim_model_parse(text, strlen(text), "bad.profile", &m);
}

static epd_status_t parse_accel_text(const void *text)
{
    epd_sim_accel_t a;

    return epd_sim_accel_parse(text, strlen(text), "bad.accel", &a);
}

static epd_status_t load_conf_dir(const void *dir)
{
    epd_sim_conf_t c;

    return epd_sim_conf_load(dir, &c);
}

/* TINY_MODEL with line `key = ...` replaced by `line` (or dropped when line
 * is NULL, or appended when key is NULL). */
static const char *tiny_with(const char *key, const char *line)
{
    static char out[2048];
    const char *p = TINY_MODEL;
    size_t n = 0;

    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t len = (size_t)(nl - p) + 1;

        if (key != NULL && strncmp(p, key, strlen(key)) == 0 && p[strlen(key)] == ' ') {
            if (line != NULL) {
                n += (size_t)snprintf(out + n, sizeof(out) - n, "%s\n", line);
            }
        } else {
            memcpy(out + n, p, len);
            n += len;
        }
        p = nl + 1;
    }
    if (key == NULL) {
        n += (size_t)snprintf(out + n, sizeof(out) - n, "%s\n", line);
    }
    out[n] = '\0';
    return out;
}

/* ---- profiles --------------------------------------------------------------- */

static void test_shipped_profiles(void **state)
{
    epd_sim_model_t m;
    epd_sim_accel_t a;
    epd_sim_accel_t half;
    const char *dirs[] = {"hybrid-moe-320b-h200", "hybrid-moe-320b-h200-half-bw", "dense-70b-h200",
                          "dense-70b-h200-half-bw"};
    uint32_t n_attn = 0;

    (void)state;
    assert_int_equal(epd_sim_model_load(EPD_TEST_PROFILES "/hybrid-moe-320b.profile", &m), EPD_OK);
    assert_string_equal(m.name, "hybrid-moe-320b");
    assert_true(m.n_layers >= 60);
    for (uint32_t l = 0; l < m.n_layers; l++) {
        n_attn += m.layer_pattern[l % strlen(m.layer_pattern)] == 'A';
    }
    assert_true(n_attn * 4 <= m.n_layers); /* about 3/4 linear */
    assert_true(n_attn > 0 && m.n_kv_heads < m.n_heads);
    assert_true(m.total_params == 320e9 && m.active_params == 18e9);
    assert_true(m.state_bytes > 0);

    assert_int_equal(epd_sim_model_load(EPD_TEST_PROFILES "/dense-70b.profile", &m), EPD_OK);
    assert_int_equal(m.n_layers, 80);
    assert_string_equal(m.layer_pattern, "A");
    assert_int_equal(m.n_kv_heads, 8);
    assert_int_equal(m.head_dim, 128);
    assert_int_equal(m.state_bytes, 0);

    assert_int_equal(epd_sim_accel_load(EPD_TEST_PROFILES "/h200.profile", &a), EPD_OK);
    assert_int_equal(epd_sim_accel_load(EPD_TEST_PROFILES "/h200-half-bw.profile", &half), EPD_OK);
    assert_true(fabs(half.mem_bw * 2 - a.mem_bw) < 1.0);
    assert_true(fabs(half.hbm_bytes * 2 - a.hbm_bytes) < 1.0);
    assert_true(half.flops == a.flops);

    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
        char dir[1024];
        epd_engine_t *e;

        snprintf(dir, sizeof(dir), "%s/%s", EPD_TEST_PROFILES, dirs[i]);
        e = open_sim(dir, 16);
        assert_int_equal(epd_engine_info(e)->kv.block_bytes % 64, 0);
        epd_engine_close(e);
    }
}

static void test_bad_profiles_refused(void **state)
{
    static const struct {
        const char *key;  /* line to replace (NULL: append) */
        const char *line; /* replacement (NULL: drop) */
        const char *why;  /* expected in the error line */
    } cases[] = {
        {NULL, "colour = blue", "bad.profile:16: unknown key 'colour'"},
        {"n_layers", "n_layers = four", "bad.profile:3: bad number 'four' for 'n_layers'"},
        {"n_layers", "n_layers = 4x", "bad number '4x'"},
        {"n_layers", "n_layers = -4", "bad number '-4'"},
        {"n_layers", "n_layers = 0", "out of range"},
        {"n_layers", "n_layers = 257", "out of range"},
        {"n_layers", NULL, "bad.profile: missing key 'n_layers'"},
        {"vocab", NULL, "missing key 'vocab'"},
        {"flops_are_not_here", NULL, NULL}, /* unchanged: parses */
        {NULL, "hidden = 64", "key 'hidden' given twice"},
        {"layer_pattern", "layer_pattern = LXA", "letter 'X'"},
        {"layer_pattern", "layer_pattern = LALAL", "layer_pattern of 5 letters for 4 layers"},
        {"kv_dtype", "kv_dtype = F8", "not BF16, F16 or F32"},
        {"active_params", "active_params = 5e6", "exceeds total_params"},
        {"active_params", "active_params = nan", "bad number 'nan'"},
        {"active_params", "active_params = 0", "out of range"},
        {"n_kv_heads", "n_kv_heads = 3", "not a multiple of n_kv_heads"},
        {"state_bytes", "state_bytes = 4", "at least 8 bytes"},
        {"head_dim", "head_dim = 1", "under 8 bytes"},
        {"name", "name", "expected 'key = value'"},
        {"name", "name =   # nothing", "no value for 'name'"},
        {"vocab", "vocab = 100", "out of range"},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *text = tiny_with(cases[i].key, cases[i].line);
        epd_status_t status;
        const char *err = captured(parse_model_text, text, &status);

        if (cases[i].why == NULL) {
            assert_int_equal(status, EPD_OK);
            continue;
        }
        if (status != EPD_ERR_MALFORMED || strstr(err, cases[i].why) == NULL) {
            fail_msg("case %zu: status %d, wanted '%s' in '%s'", i, status, cases[i].why, err);
        }
    }
    {
        epd_status_t status;
        const char *err = captured(parse_accel_text,
                                   "name = x\nflops = 1e12\nmem_bw = 0\nhbm_bytes = 1\n", &status);

        assert_int_equal(status, EPD_ERR_MALFORMED);
        assert_non_null(strstr(err, "bad.accel:3: 'mem_bw' = 0 out of range"));
        err = captured(parse_accel_text, "name = x\nflops = 1e12\nmem_bw = 1e9\n", &status);
        assert_int_equal(status, EPD_ERR_MALFORMED);
        assert_non_null(strstr(err, "missing key 'hbm_bytes'"));
    }
    {
        epd_sim_model_t m;

        /* a NUL byte is not text */
        assert_int_equal(epd_sim_model_parse("name = a\0b\n", 11, "nul", &m), EPD_ERR_MALFORMED);
        assert_int_equal(epd_sim_model_load("/nonexistent/x.profile", &m), EPD_ERR_NOT_FOUND);
    }
}

/* Mutated profiles (bytes flipped, lines cut, NULs) are parsed or refused,
 * never crash or read past the text (the sanitizer build checks). */
static int mutated_ok;

static epd_status_t parse_mutations(const void *arg)
{
    size_t len = strlen(TINY_MODEL);
    char *buf = malloc(len + 8);
    uint64_t x = 12345;

    (void)arg;
    assert_non_null(buf);
    for (int it = 0; it < 3000; it++) {
        size_t n = len;
        epd_sim_model_t m;
        epd_sim_accel_t a;
        epd_status_t st;

        memcpy(buf, TINY_MODEL, len);
        for (int k = 0; k < 1 + it % 4; k++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            buf[(x >> 33) % len] = (char)(x >> 13);
        }
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        if (it % 3 == 0) {
            n = (size_t)(x >> 33) % (len + 1); /* cut anywhere */
        }
        st = epd_sim_model_parse(buf, n, "mutated", &m);
        assert_true(st == EPD_OK || st == EPD_ERR_MALFORMED);
        mutated_ok += st == EPD_OK;
        if (st == EPD_OK) {
            assert_true(m.n_layers >= 1 && m.n_layers <= EPD_KV_MAX_LAYERS);
            assert_true(strlen(m.layer_pattern) >= 1 && strlen(m.layer_pattern) <= m.n_layers);
            assert_true(m.active_params <= m.total_params);
        }
        st = epd_sim_accel_parse(buf, n, "mutated", &a);
        assert_int_equal(st, EPD_ERR_MALFORMED);
    }
    free(buf);
    return EPD_OK;
}

static void test_mutated_profiles(void **state)
{
    epd_status_t status;

    (void)state;
    captured(parse_mutations, NULL, &status);
    print_message("%d of 3000 mutated profiles still parse\n", mutated_ok);
    assert_true(mutated_ok > 0 && mutated_ok < 3000);
}

static void test_bad_conf_refused(void **state)
{
    static const struct {
        const char *extra;
        const char *why;
    } cases[] = {
        {"scale = 0\n", "'scale' = 0 out of range"}, {"scale = 1.5\n", "out of range"},
        {"mode = nap\n", "not sleep or spin"},       {"devices = 0\n", "out of range"},
        {"speed = 9\n", "unknown key 'speed'"},
    };
    char dir[1024];
    char text[4096];
    epd_status_t status;
    const char *err;

    (void)state;
    snprintf(dir, sizeof(dir), "%s/badconf", tmpdir);
    assert_int_equal(mkdir(dir, 0777) == 0 || access(dir, F_OK) == 0, 1);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(text, sizeof(text), "model = %s\naccel = %s\n%s", tiny_model, fast_accel,
                 cases[i].extra);
        epd_test_write_file(epd_test_path(dir, "sim.conf"), text, strlen(text));
        err = captured(load_conf_dir, dir, &status);
        if (status != EPD_ERR_MALFORMED || strstr(err, cases[i].why) == NULL) {
            fail_msg("case %zu: status %d, wanted '%s' in '%s'", i, status, cases[i].why, err);
        }
    }
    /* a profile that is not there; the relative path is resolved in dir */
    snprintf(text, sizeof(text), "model = missing.profile\naccel = %s\n", fast_accel);
    epd_test_write_file(epd_test_path(dir, "sim.conf"), text, strlen(text));
    err = captured(load_conf_dir, dir, &status);
    assert_int_equal(status, EPD_ERR_NOT_FOUND);
    assert_non_null(strstr(err, "badconf/missing.profile"));
    /* no sim.conf at all: the engine refuses to open */
    {
        epd_engine_config_t cfg = {.model_dir = tmpdir};
        epd_engine_t *e = NULL;

        assert_int_equal(epd_engine_open("sim", &cfg, &e), EPD_ERR_NOT_FOUND);
        assert_null(e);
        cfg.model_dir = NULL;
        assert_int_equal(epd_engine_open("sim", &cfg, &e), EPD_ERR_INVALID_PARAM);
    }
    /* the writer refuses what the reader would */
    {
        epd_sim_options_t o = {.model = tiny_model, .accel = fast_accel, .scale = 2.0};

        assert_int_equal(epd_sim_conf_write(dir, &o), EPD_ERR_INVALID_PARAM);
        o.scale = 0.5;
        o.model = "/nonexistent.profile";
        assert_int_equal(epd_sim_conf_write(dir, &o), EPD_ERR_NOT_FOUND);
    }
}

static void test_conf_round_trip(void **state)
{
    epd_sim_conf_t c;
    const char *dir = sim_dir("rt", tiny_model, fast_accel, 0.25, EPD_SIM_SPIN, 42);
    epd_sim_options_t o = {.model = tiny_model, .accel = fast_accel, .devices = 3, .vocab = 1000};
    epd_engine_t *e;

    (void)state;
    assert_int_equal(epd_sim_conf_load(dir, &c), EPD_OK);
    assert_true(c.scale == 0.25);
    assert_int_equal(c.mode, EPD_SIM_SPIN);
    assert_int_equal(c.seed, 42);
    assert_int_equal(c.devices, 1);
    assert_int_equal(c.vocab, 0);
    assert_string_equal(c.model.name, "tiny");
    assert_string_equal(c.accel.name, "fast");
    assert_int_equal(epd_sim_conf_write(dir, &o), EPD_OK);
    assert_int_equal(epd_sim_conf_load(dir, &c), EPD_OK);
    assert_int_equal(c.devices, 3);
    assert_true(c.scale == 1.0);
    assert_int_equal(c.mode, EPD_SIM_SLEEP);
    e = open_sim(dir, 4);
    assert_int_equal(epd_engine_info(e)->vocab_size, 1000);
    assert_int_equal(epd_engine_info(e)->max_context, 512);
    assert_string_equal(epd_engine_name(e), "sim");
    epd_engine_close(e);
}

/* ---- timing ------------------------------------------------------------------ */

static void test_timing_formula(void **state)
{
    epd_sim_conf_t c;
    epd_sim_timing_t t;
    epd_decode_req_t reqs[3] = {{.pos = 9}, {.pos = 99}, {.pos = 0}};
    double want;

    (void)state;
    assert_int_equal(epd_sim_conf_load(sim_dir("f", tiny_model, fast_accel, 1.0, 0, 0), &c),
                     EPD_OK);
    c.devices = 2;
    assert_int_equal(epd_sim_timing_init(&c, 4, &t), EPD_OK);
    assert_true(t.attn_factor == 1.0 && t.linear_factor == 1.0);
    /* layer 1 (A), prefill of 32 tokens after 8 cached:
     * flops = 32 * 2 * 1e6 / 4 + 4 * 4 * 8 * (32 * 8 + 32 * 33 / 2) = 1.6e7 + 128 * 784
     * bytes = min(4e6, 32e6) / 4 * 1 + (8 + 32) * (2 * 2 * 8 * 4) */
    want = fmax((1.6e7 + 128.0 * 784) / (2 * 1.6e11), (1e6 + 40.0 * 128) / (2 * 1e11));
    assert_true(fabs(epd_sim_prefill_seconds(&t, 1, 8, 32) - want) < 1e-15);
    /* layer 0 (L): bytes add the state read + write */
    want = fmax(1.6e7 / (2 * 1.6e11), (1e6 + 2 * 256.0) / (2 * 1e11));
    assert_true(fabs(epd_sim_prefill_seconds(&t, 0, 8, 32) - want) < 1e-15);
    /* decode of 3 requests: weights of 3 tokens (3e6 of 4e6 params) */
    want = fmax((3 * 5e5 + 128.0 * (10 + 100 + 1)) / (2 * 1.6e11),
                (3e6 / 4 + 111.0 * 128) / (2 * 1e11));
    assert_true(fabs(epd_sim_decode_seconds(&t, 1, reqs, 3) - want) < 1e-15);
    /* 5 requests would touch every expert: weights capped at total / L */
    {
        epd_decode_req_t five[5] = {{.pos = 0}, {.pos = 0}, {.pos = 0}, {.pos = 0}, {.pos = 0}};

        c.accel.flops = 1e30; /* memory-bound */
        assert_int_equal(epd_sim_timing_init(&c, 4, &t), EPD_OK);
        want = (4e6 / 4 + 5 * 2 * 256.0) / (2 * 1e11);
        assert_true(fabs(epd_sim_decode_seconds(&t, 0, five, 5) - want) < 1e-15);
    }
}

/* time / bytes written, per layer, for a few chunks and a decode batch */
static void check_ratio(const epd_engine_t *e1, const epd_sim_timing_t *t1, const epd_engine_t *es,
                        const epd_sim_timing_t *ts)
{
    const epd_kv_layout_t *k1 = &epd_engine_info(e1)->kv;
    const epd_kv_layout_t *ks = &epd_engine_info(es)->kv;
    static const uint32_t chunks[][2] = {{0, 1}, {0, 100}, {100, 1000}, {0, 30000}};
    epd_decode_req_t reqs[4] = {{.pos = 5}, {.pos = 500}, {.pos = 5000}, {.pos = 50000}};

    for (uint32_t l = 0; l < k1->n_layers; l++) {
        int attn = k1->kind[l] == EPD_LAYER_ATTENTION;
        double b1 = attn ? (double)k1->block_bytes / k1->block_tokens : (double)k1->state_bytes;
        double bs = attn ? (double)ks->block_bytes / ks->block_tokens : (double)ks->state_bytes;

        for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
            double n = attn ? chunks[c][1] : 1.0; /* a state is written once per chunk */
            double r1 = epd_sim_prefill_seconds(t1, l, chunks[c][0], chunks[c][1]) / (n * b1);
            double rs = epd_sim_prefill_seconds(ts, l, chunks[c][0], chunks[c][1]) / (n * bs);

            if (fabs(r1 - rs) > 1e-12 * r1) {
                fail_msg("layer %u chunk %zu: %.17g s/B at scale 1, %.17g s/B scaled", l, c, r1,
                         rs);
            }
        }
        {
            double r1 = epd_sim_decode_seconds(t1, l, reqs, 4) / b1;
            double rs = epd_sim_decode_seconds(ts, l, reqs, 4) / bs;

            assert_true(fabs(r1 - rs) <= 1e-12 * r1);
        }
    }
}

static void test_scale_invariant(void **state)
{
    static const char *models[] = {"hybrid-moe-320b.profile", "dense-70b.profile"};
    static const double scales[] = {0.5, 0.1, 0.01, 0.003};
    static const uint32_t bts[] = {16, 1, 64};

    (void)state;
    for (size_t m = 0; m < 2; m++) {
        char model[1024];
        const char *d1;
        epd_engine_t *e1;
        epd_sim_conf_t c;
        epd_sim_timing_t t1;

        snprintf(model, sizeof(model), "%s/%s", EPD_TEST_PROFILES, models[m]);
        d1 = sim_dir("s1", model, EPD_TEST_PROFILES "/h200.profile", 1.0, 0, 0);
        e1 = open_sim(d1, 16);
        assert_int_equal(epd_sim_conf_load(d1, &c), EPD_OK);
        assert_int_equal(epd_sim_timing_init(&c, 16, &t1), EPD_OK);
        for (size_t s = 0; s < sizeof(scales) / sizeof(scales[0]); s++) {
            for (size_t b = 0; b < sizeof(bts) / sizeof(bts[0]); b++) {
                const char *ds =
                    sim_dir("ss", model, EPD_TEST_PROFILES "/h200.profile", scales[s], 0, 0);
                epd_engine_t *es = open_sim(ds, bts[b]);
                const epd_kv_layout_t *ks = &epd_engine_info(es)->kv;
                epd_sim_timing_t ts;
                epd_sim_conf_t cs;

                assert_int_equal(epd_sim_conf_load(ds, &cs), EPD_OK);
                assert_int_equal(epd_sim_timing_init(&cs, bts[b], &ts), EPD_OK);
                /* the layout the engine describes is the timing's */
                assert_int_equal(ks->n_kv_heads, ts.n_kv_heads_scaled);
                assert_int_equal(ks->head_dim, ts.head_dim_scaled);
                assert_int_equal(ks->state_bytes, ts.state_bytes_scaled);
                assert_int_equal(ks->block_bytes % 64, 0);
                assert_true(ks->head_dim * epd_dtype_size(ks->dtype) >= 8);
                /* the KV shrinks by about the scale (rounding to whole
                 * elements; with 1-token blocks or tiny scales the
                 * 64-byte block floor decides) */
                assert_true(ts.attn_factor > 0.0 && ts.attn_factor <= 1.0);
                if (bts[b] == 16 && scales[s] >= 0.01 &&
                    fabs(ts.attn_factor / scales[s] - 1.0) > 0.05) {
                    fail_msg("%s scale %g bt %u: KV factor %g", models[m], scales[s], bts[b],
                             ts.attn_factor);
                }
                assert_true(ks->state_bytes == 0 ||
                            fabs(ts.linear_factor / scales[s] - 1.0) < 0.05);
                check_ratio(e1, &t1, es, &ts);
                epd_engine_close(es);
            }
        }
        epd_engine_close(e1);
    }
}

/* ---- bytes -------------------------------------------------------------------- */

static void prefill_ok(epd_engine_t *e, epd_kv_pool_t *pool, const uint32_t *table,
                       uint32_t n_table, uint32_t slot, const int32_t *toks, uint32_t start,
                       uint32_t n, float *logits)
{
    epd_prefill_args_t a = {.seq = seq_of(table, n_table, slot, 7),
                            .tokens = toks + start,
                            .n_tokens = n,
                            .start = start};

    assert_int_equal(epd_engine_prefill(e, pool, &a, NULL, logits), EPD_OK);
}

static void test_same_prompt_same_bytes(void **state)
{
    epd_engine_t *a = open_tiny();
    epd_engine_t *b = open_tiny();
    epd_kv_pool_t pa;
    epd_kv_pool_t pb;
    uint32_t table[16];
    int32_t toks[64];
    float la[VOCAB];
    float lb[VOCAB];
    size_t n = make_prompt("the same prompt twice", toks);

    (void)state;
    for (uint32_t i = 0; i < 16; i++) {
        table[i] = (i * 5) % 16;
    }
    epd_test_pool(a, 16, 2, &pa);
    epd_test_pool(b, 16, 2, &pb);
    prefill_ok(a, &pa, table, 16, 1, toks, 0, (uint32_t)n, la);
    prefill_ok(b, &pb, table, 16, 1, toks, 0, (uint32_t)n, lb);
    assert_memory_equal(pa.base, pb.base, pa.bytes);
    assert_memory_equal(la, lb, sizeof(la));
    /* something was written, and the logits choose a printable byte */
    assert_false(rows_equal(a, &pa, table, &pa, table + 1, 0));
    assert_true(argmax(la, VOCAB) >= 32 && argmax(la, VOCAB) < 127);
    epd_free(pa.base);
    epd_free(pb.base);
    epd_engine_close(a);
    epd_engine_close(b);
}

static void test_different_prompts_differ(void **state)
{
    epd_engine_t *e = open_tiny();
    epd_engine_t *seeded = open_sim(sim_dir("seed2", tiny_model, fast_accel, 1.0, 0, 2), 4);
    epd_kv_pool_t pool;
    epd_kv_pool_t ps;
    uint32_t ta[16];
    uint32_t tb[16];
    int32_t xa[64];
    int32_t xb[64];
    float la[VOCAB];
    float lb[VOCAB];
    size_t n = make_prompt("shared prefix, then A differs", xa);

    (void)state;
    make_prompt("shared prefix, then B differs", xb);
    for (uint32_t i = 0; i < 16; i++) {
        ta[i] = i;
        tb[i] = 16 + i;
    }
    epd_test_pool(e, 32, 2, &pool);
    prefill_ok(e, &pool, ta, 16, 0, xa, 0, (uint32_t)n, la);
    prefill_ok(e, &pool, tb, 16, 1, xb, 0, (uint32_t)n, lb);
    /* a block's stamp carries the prefix hash of its last token: equal for
     * blocks that end before "A"/"B", different from there on (the
     * templates follow the block ids, not the prompt) */
    for (uint32_t p = 0; p < n; p++) {
        const epd_kv_layout_t *kv = &epd_engine_info(e)->kv;
        uint32_t last = (p / kv->block_tokens + 1) * kv->block_tokens - 1;
        int same;

        last = last < n - 1 ? last : (uint32_t)n - 1;
        same = epd_kv_stamp_get(kv_row(e, &pool, ta, 1, p, 0) - (p % kv->block_tokens) *
                                                                     (size_t)kv->head_dim * 4,
                                kv->block_bytes, &(epd_kv_stamp_t){0}) == EPD_OK &&
               stamp_blk(e, &pool, ta, 1, p / kv->block_tokens).hk ==
                   stamp_blk(e, &pool, tb, 1, p / kv->block_tokens).hk;
        if (same != (last < 21)) {
            fail_msg("position %u (block ending at %u): stamps %s", p, last,
                     same ? "equal" : "differ");
        }
    }
    assert_false(states_equal(e, &pool, 0, &pool, 1));
    assert_true(memcmp(la, lb, sizeof(la)) != 0);
    /* another seed, another model: the same prompt gives other bytes */
    epd_test_pool(seeded, 32, 2, &ps);
    prefill_ok(seeded, &ps, ta, 16, 0, xa, 0, (uint32_t)n, lb);
    for (uint32_t p = 0; p < n; p++) {
        assert_false(rows_equal(e, &pool, ta, &ps, ta, p));
        assert_false(stamps_equal(e, &pool, ta, &ps, ta, p));
    }
    assert_true(memcmp(la, lb, sizeof(la)) != 0);
    epd_free(ps.base);
    epd_free(pool.base);
    epd_engine_close(seeded);
    epd_engine_close(e);
}

static void test_chunked_equals_whole(void **state)
{
    epd_engine_t *e = open_tiny();
    epd_kv_pool_t pw;
    epd_kv_pool_t pc;
    uint32_t table[16];
    int32_t toks[64];
    float whole[VOCAB];
    float chunked[VOCAB];
    size_t n = make_prompt("Chunked prefill must equal whole!!", toks);
    uint32_t cuts[] = {0, 5, 6, 13, 16, (uint32_t)n};

    (void)state;
    for (uint32_t i = 0; i < 16; i++) {
        table[i] = 15 - i;
    }
    epd_test_pool(e, 16, 1, &pw);
    epd_test_pool(e, 16, 1, &pc);
    prefill_ok(e, &pw, table, 16, 0, toks, 0, (uint32_t)n, whole);
    for (size_t c = 0; c + 1 < sizeof(cuts) / sizeof(cuts[0]); c++) {
        prefill_ok(e, &pc, table, 16, 0, toks, cuts[c], cuts[c + 1] - cuts[c], chunked);
    }
    assert_memory_equal(pw.base, pc.base, pw.bytes);
    assert_memory_equal(whole, chunked, sizeof(whole));
    epd_free(pw.base);
    epd_free(pc.base);
    epd_engine_close(e);
}

/* Greedy decode after a prefill writes what a prefill of prompt + generated
 * tokens writes; and after the pool is copied to another "node" (other block
 * ids, other slot, another engine instance) decoding continues identically. */
static void test_decode_continues_prefill(void **state)
{
    epd_engine_t *e = open_tiny();
    epd_engine_t *d = open_tiny();
    epd_kv_pool_t pp;
    epd_kv_pool_t pl;
    epd_kv_pool_t pd;
    uint32_t tp[16];
    uint32_t tdn[16];
    int32_t toks[128];
    float lp[VOCAB];
    float ll[VOCAB];
    float ld[VOCAB];
    size_t n = make_prompt("decode continues", toks);
    size_t total = n;
    const epd_kv_layout_t *kv = &epd_engine_info(e)->kv;

    (void)state;
    for (uint32_t i = 0; i < 16; i++) {
        tp[i] = i;
        tdn[i] = (i * 3 + 1) % 16;
    }
    epd_test_pool(e, 16, 2, &pp);
    epd_test_pool(e, 16, 2, &pl);
    epd_test_pool(d, 16, 3, &pd);
    prefill_ok(e, &pp, tp, 16, 0, toks, 0, (uint32_t)n, lp);
    /* "transfer" the prompt's KV to the decode node: its blocks and slot 2 */
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        if (kv->kind[l] == EPD_LAYER_LINEAR) {
            memcpy((void *)state_of(d, &pd, l, 2), state_of(e, &pp, l, 0), kv->state_bytes);
            continue;
        }
        for (uint32_t b = 0; b < (n + kv->block_tokens - 1) / kv->block_tokens; b++) {
            uint64_t src;
            uint64_t dst;

            assert_int_equal(epd_kv_block_offset(kv, 16, l, tp[b], &src), EPD_OK);
            assert_int_equal(epd_kv_block_offset(kv, 16, l, tdn[b], &dst), EPD_OK);
            memcpy((char *)pd.base + dst, (char *)pp.base + src, kv->block_bytes);
        }
    }
    memcpy(ld, lp, sizeof(lp));
    for (int step = 0; step < 20; step++) {
        /* the same request id as the prefill's (as in the cluster) */
        epd_decode_req_t rp = {
            .seq = seq_of(tp, 16, 0, 7), .pos = (uint32_t)total, .token = argmax(lp, VOCAB)};
        epd_decode_req_t rd = {
            .seq = seq_of(tdn, 16, 2, 7), .pos = (uint32_t)total, .token = argmax(ld, VOCAB)};

        assert_int_equal(rp.token, rd.token);
        toks[total++] = rp.token;
        assert_int_equal(epd_engine_decode(e, &pp, &rp, 1, lp), EPD_OK);
        assert_int_equal(epd_engine_decode(d, &pd, &rd, 1, ld), EPD_OK);
        assert_memory_equal(lp, ld, sizeof(lp));
    }
    /* one prefill of everything stamps the same as prefill + decodes (a
     * decode step writes no template: the device wrote the token's KV) */
    prefill_ok(e, &pl, tp, 16, 0, toks, 0, (uint32_t)total, ll);
    assert_memory_equal(lp, ll, sizeof(lp));
    for (uint32_t p = 0; p < total; p++) {
        assert_true(stamps_equal(e, &pp, tp, &pl, tp, p));
        assert_true(stamps_equal(e, &pp, tp, &pd, tdn, p));
    }
    assert_true(states_equal(e, &pp, 0, &pl, 0));
    assert_true(states_equal(e, &pp, 0, &pd, 2));
    /* the generated text is not one repeated byte */
    {
        int distinct = 0;

        for (size_t i = n + 1; i < total; i++) {
            distinct += toks[i] != toks[n];
        }
        assert_true(distinct > 0);
    }
    epd_free(pp.base);
    epd_free(pl.base);
    epd_free(pd.base);
    epd_engine_close(d);
    epd_engine_close(e);
}

static void test_batch_equals_single(void **state)
{
    const char *prompts[3] = {"a", "medium prompt", "a longer prompt than the others"};
    epd_engine_t *e = open_tiny();
    epd_kv_pool_t pool;
    uint32_t tables[3][16];
    uint32_t stables[3][16];
    int32_t toks[3][64];
    float blog[3 * VOCAB];
    float slog[3][VOCAB];
    epd_decode_req_t reqs[3];

    (void)state;
    epd_test_pool(e, 96, 6, &pool);
    for (int r = 0; r < 3; r++) {
        size_t n = make_prompt(prompts[r], toks[r]);

        for (uint32_t i = 0; i < 16; i++) {
            tables[r][i] = i * 3 + (uint32_t)r;
            stables[r][i] = 48 + (uint32_t)r * 16 + i;
        }
        prefill_ok(e, &pool, tables[r], 16, (uint32_t)r, toks[r], 0, (uint32_t)n, blog + r * VOCAB);
        prefill_ok(e, &pool, stables[r], 16, 3 + (uint32_t)r, toks[r], 0, (uint32_t)n, slog[r]);
        reqs[r] = (epd_decode_req_t){.seq = seq_of(tables[r], 16, (uint32_t)r, 1 + r),
                                     .pos = (uint32_t)n,
                                     .token = argmax(blog + r * VOCAB, VOCAB)};
    }
    for (int step = 0; step < 8; step++) {
        assert_int_equal(epd_engine_decode(e, &pool, reqs, 3, blog), EPD_OK);
        for (int r = 0; r < 3; r++) {
            epd_decode_req_t one = {.seq = seq_of(stables[r], 16, 3 + (uint32_t)r, 11 + r),
                                    .pos = reqs[r].pos,
                                    .token = reqs[r].token};

            assert_int_equal(epd_engine_decode(e, &pool, &one, 1, slog[r]), EPD_OK);
            assert_memory_equal(blog + r * VOCAB, slog[r], sizeof(slog[r]));
            reqs[r].pos++;
            reqs[r].token = argmax(slog[r], VOCAB);
        }
    }
    epd_free(pool.base);
    epd_engine_close(e);
}

/* ---- sink ------------------------------------------------------------------------- */

typedef struct {
    const epd_engine_t *e;
    const epd_kv_pool_t *pool;
    const uint32_t *table;
    uint32_t start;
    uint32_t n;
    uint32_t calls;
    uint32_t abort_at;
    uint64_t t0;
    uint64_t at_ns[8];    /* when each layer was reported, since t0 */
    unsigned char *after; /* a copy of the pool once prefill returned */
    unsigned char *seen[8];
} sink_rec_t;

static epd_status_t sink_cb(void *ctx, uint32_t layer, const epd_layer_done_t *d)
{
    sink_rec_t *s = ctx;
    const epd_kv_layout_t *kv = &epd_engine_info(s->e)->kv;

    s->at_ns[s->calls] = epd_time_now_ns() - s->t0;
    assert_int_equal(layer, s->calls); /* once per layer, in order */
    assert_int_equal(d->layer, layer);
    assert_int_equal(d->req_id, 7);
    assert_int_equal(d->kind, kv->kind[layer]);
    assert_int_equal(d->tok_start, s->start);
    assert_int_equal(d->tok_end, s->start + s->n);
    if (d->kind == EPD_LAYER_ATTENTION) {
        assert_int_equal(d->first_block, s->start / kv->block_tokens);
        assert_int_equal(d->n_blocks,
                         (s->start + s->n - 1) / kv->block_tokens - d->first_block + 1);
        assert_ptr_equal(d->block_ids, s->table + d->first_block);
    } else {
        assert_int_equal(d->state_slot, 1);
    }
    if (s->calls == s->abort_at) {
        return EPD_ERR_CANCELED;
    }
    /* what the layer holds now must be final: keep a copy of the pool */
    s->seen[s->calls] = malloc(s->pool->bytes);
    assert_non_null(s->seen[s->calls]);
    memcpy(s->seen[s->calls], s->pool->base, s->pool->bytes);
    s->calls++;
    return EPD_OK;
}

/* Every byte layer l owns (for this request's tokens) is equal in a and b. */
static void check_layer_final(const sink_rec_t *s, uint32_t l, const unsigned char *a,
                              const unsigned char *b)
{
    const epd_kv_layout_t *kv = &epd_engine_info(s->e)->kv;
    size_t row = (size_t)kv->head_dim * epd_dtype_size(kv->dtype);
    uint64_t off;

    if (kv->kind[l] == EPD_LAYER_LINEAR) {
        assert_int_equal(
            epd_kv_state_offset(kv, s->pool->n_blocks, s->pool->n_state_slots, l, 1, &off), EPD_OK);
        assert_memory_equal(a + off, b + off, kv->state_bytes);
        return;
    }
    for (uint32_t p = s->start; p < s->start + s->n; p++) {
        for (uint32_t r = 0; r < 2 * kv->n_kv_heads; r++) {
            size_t o;

            assert_int_equal(
                epd_kv_block_offset(kv, s->pool->n_blocks, l, s->table[p / kv->block_tokens], &off),
                EPD_OK);
            o = off + ((size_t)r * kv->block_tokens + p % kv->block_tokens) * row;
            assert_memory_equal(a + o, b + o, row);
        }
    }
}

static void run_sink(epd_engine_t *e, epd_kv_pool_t *pool, const uint32_t *table,
                     const int32_t *toks, uint32_t start, uint32_t n)
{
    const epd_kv_layout_t *kv = &epd_engine_info(e)->kv;
    sink_rec_t rec = {
        .e = e, .pool = pool, .table = table, .start = start, .n = n, .abort_at = UINT32_MAX};
    epd_engine_sink_t sink = {.cb = sink_cb, .ctx = &rec};
    epd_prefill_args_t a = {
        .seq = seq_of(table, 16, 1, 7), .tokens = toks + start, .n_tokens = n, .start = start};
    float logits[VOCAB];

    rec.t0 = epd_time_now_ns();
    assert_int_equal(epd_engine_prefill(e, pool, &a, &sink, logits), EPD_OK);
    assert_int_equal(rec.calls, kv->n_layers);
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        check_layer_final(&rec, l, rec.seen[l], pool->base);
        free(rec.seen[l]);
    }
}

static void test_sink_once_per_layer(void **state)
{
    epd_engine_t *e = open_tiny();
    epd_kv_pool_t pool;
    uint32_t table[16];
    int32_t toks[64];
    size_t n = make_prompt("sink sees final bytes", toks);

    (void)state;
    epd_test_pool(e, 20, 2, &pool);
    for (uint32_t i = 0; i < 16; i++) {
        table[i] = (i * 7) % 20;
    }
    run_sink(e, &pool, table, toks, 0, 9);
    run_sink(e, &pool, table, toks, 9, (uint32_t)n - 9);
    epd_free(pool.base);
    epd_engine_close(e);
}

static void test_sink_abort(void **state)
{
    epd_engine_t *e = open_tiny();
    epd_kv_pool_t pool;
    uint32_t table[16] = {0, 1, 2, 3};
    int32_t toks[16];
    size_t n = make_prompt("abort", toks);
    sink_rec_t rec = {.e = e, .pool = &pool, .table = table, .n = (uint32_t)n, .abort_at = 2};
    epd_engine_sink_t sink = {.cb = sink_cb, .ctx = &rec};
    epd_prefill_args_t a = {.seq = seq_of(table, 4, 1, 7), .tokens = toks, .n_tokens = (uint32_t)n};
    float logits[VOCAB];

    (void)state;
    epd_test_pool(e, 4, 2, &pool);
    rec.t0 = epd_time_now_ns();
    assert_int_equal(epd_engine_prefill(e, &pool, &a, &sink, logits), EPD_ERR_CANCELED);
    assert_int_equal(rec.calls, 2);
    free(rec.seen[0]);
    free(rec.seen[1]);
    epd_free(pool.base);
    epd_engine_close(e);
}

/* ---- time spent (lower bounds only: this machine may be slow, never fast) ---- */

static void check_time_spent(epd_sim_mode_t mode, const char *accel, uint32_t n_tok)
{
    const char *dir =
        sim_dir(mode == EPD_SIM_SPIN ? "spin" : "sleep", tiny_model, accel, 1.0, mode, 1);
    epd_engine_t *e = open_sim(dir, 4);
    epd_sim_conf_t c;
    epd_sim_timing_t t;
    epd_kv_pool_t pool;
    uint32_t table[64];
    int32_t toks[256];
    float logits[8 * VOCAB];
    sink_rec_t rec = {.e = e, .pool = &pool, .table = table, .n = n_tok, .abort_at = UINT32_MAX};
    epd_engine_sink_t sink = {.cb = sink_cb, .ctx = &rec};
    epd_prefill_args_t a = {.seq = seq_of(table, 64, 1, 7), .tokens = toks, .n_tokens = n_tok};
    epd_decode_req_t reqs[8];
    double model_s = 0.0;
    uint64_t t0;
    uint64_t took;

    assert_int_equal(epd_sim_conf_load(dir, &c), EPD_OK);
    assert_int_equal(epd_sim_timing_init(&c, 4, &t), EPD_OK);
    epd_test_pool(e, 64, 8, &pool);
    for (uint32_t i = 0; i < 64; i++) {
        table[i] = i;
    }
    for (uint32_t i = 0; i < n_tok; i++) {
        toks[i] = (int32_t)(i % 256);
    }
    t0 = epd_time_now_ns();
    rec.t0 = t0;
    assert_int_equal(epd_engine_prefill(e, &pool, &a, &sink, logits), EPD_OK);
    took = epd_time_now_ns() - t0;
    for (uint32_t l = 0; l < t.n_layers; l++) {
        /* layer l is reported once its KV exists in the modelled layer (its
         * QKV projection ran): its remaining time (attention, MLP)
         * overlaps the transfer, as in ref */
        double ready_s = model_s + epd_sim_prefill_ready_seconds(&t, l, 0, n_tok);

        if ((double)rec.at_ns[l] < ready_s * 1e9 * 0.999) {
            fail_msg("layer %u reported at %.1f us, before its KV exists (%.1f us modelled)", l,
                     rec.at_ns[l] / 1e3, ready_s * 1e6);
        }
        model_s += epd_sim_prefill_seconds(&t, l, 0, n_tok);
        free(rec.seen[l]);
    }
    print_message("%s: prefill of %u tokens took %.1f us, modelled %.1f us\n",
                  mode == EPD_SIM_SPIN ? "spin" : "sleep", n_tok, took / 1e3, model_s * 1e6);
    assert_true((double)took >= model_s * 1e9 * 0.999);
    assert_true(model_s > 50e-6); /* the test measures something */

    /* a decode step of 8 requests, each on its own block and slot */
    for (uint32_t r = 0; r < 8; r++) {
        reqs[r] = (epd_decode_req_t){
            .seq = seq_of(table + 16 + r, 1, r, 1 + r), .pos = 3 - r % 4, .token = 'x'};
    }
    model_s = 0.0;
    for (uint32_t l = 0; l < t.n_layers; l++) {
        model_s += epd_sim_decode_seconds(&t, l, reqs, 8);
    }
    t0 = epd_time_now_ns();
    assert_int_equal(epd_engine_decode(e, &pool, reqs, 8, logits), EPD_OK);
    took = epd_time_now_ns() - t0;
    print_message("%s: decode step of 8 took %.1f us, modelled %.1f us\n",
                  mode == EPD_SIM_SPIN ? "spin" : "sleep", took / 1e3, model_s * 1e6);
    assert_true((double)took >= model_s * 1e9 * 0.999);
    epd_free(pool.base);
    epd_engine_close(e);
}

static void test_time_spent_sleep(void **state)
{
    (void)state;
    check_time_spent(EPD_SIM_SLEEP, fast_accel, 32);
    check_time_spent(EPD_SIM_SLEEP, slow_accel, 32);
}

static void test_time_spent_spin(void **state)
{
    (void)state;
    check_time_spent(EPD_SIM_SPIN, fast_accel, 32);
}

/* An accelerator too fast for this CPU: the host's share (the first
 * prefill's templates, the stamps) outlasts the layers' KV readiness; the
 * engine says so once per instance and still returns correct bytes. */
static epd_status_t two_fast_prefills(const void *dir)
{
    epd_engine_t *e = open_sim(dir, 4);
    epd_kv_pool_t pool;
    uint32_t table[64];
    int32_t toks[256];
    float logits[VOCAB];
    epd_prefill_args_t a = {.seq = seq_of(table, 64, 0, 9), .tokens = toks, .n_tokens = 256};
    epd_status_t status = EPD_OK;

    for (uint32_t i = 0; i < 64; i++) {
        table[i] = i;
    }
    for (uint32_t i = 0; i < 256; i++) {
        toks[i] = (int32_t)i;
    }
    epd_test_pool(e, 64, 1, &pool);
    for (int r = 0; r < 2 && status == EPD_OK; r++) {
        status = epd_engine_prefill(e, &pool, &a, NULL, logits);
    }
    epd_free(pool.base);
    epd_engine_close(e);
    return status;
}

static void test_slow_fill_said_once(void **state)
{
    static const char INF[] = "name = inf\nflops = 1e20\nmem_bw = 1e18\nhbm_bytes = 1e9\n";
    const char *path = epd_test_path(tmpdir, "inf.profile");
    const char *dir;
    const char *err;
    const char *first;
    epd_status_t status;

    (void)state;
    epd_test_write_file(path, INF, strlen(INF));
    dir = sim_dir("inf", tiny_model, path, 1.0, EPD_SIM_SLEEP, 1);
    err = captured(two_fast_prefills, dir, &status);
    assert_int_equal(status, EPD_OK);
    first = strstr(err, "the timing model is not honoured");
    assert_non_null(first);
    assert_null(strstr(first + 1, "the timing model is not honoured"));
}

/* ---- refusals, release, allocation ------------------------------------------ */

static void test_refuses_bad_requests(void **state)
{
    epd_engine_t *e = open_tiny();
    epd_kv_pool_t pool;
    uint32_t table[4] = {0, 1, 2, 3};
    int32_t toks[8] = {BOS, 'a', 'b', 'c'};
    float logits[9 * VOCAB];
    epd_prefill_args_t a = {.seq = seq_of(table, 4, 0, 1), .tokens = toks, .n_tokens = 4};
    epd_decode_req_t reqs[9];

    (void)state;
    epd_test_pool(e, 4, 1, &pool);
    a.n_tokens = 0;
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_ERR_INVALID_PARAM);
    a.n_tokens = 4;
    toks[1] = VOCAB;
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_ERR_INVALID_PARAM);
    toks[1] = 'a';
    a.start = 510;
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_ERR_TOO_LONG);
    a.start = 0;
    a.seq.state_slot = 1;
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_ERR_INVALID_PARAM);
    a.seq.state_slot = 0;
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_OK);
    for (int i = 0; i < 9; i++) {
        reqs[i] = (epd_decode_req_t){.seq = a.seq, .pos = 4, .token = 'd'};
    }
    assert_int_equal(epd_engine_decode(e, &pool, reqs, 9, logits), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_engine_decode(e, &pool, reqs, 0, logits), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_engine_decode(e, &pool, reqs, 2, logits), EPD_ERR_INVALID_PARAM);
    reqs[0].pos = 512;
    assert_int_equal(epd_engine_decode(e, &pool, reqs, 1, logits), EPD_ERR_TOO_LONG);
    reqs[0].pos = 16; /* needs a fifth block */
    assert_int_equal(epd_engine_decode(e, &pool, reqs, 1, logits), EPD_ERR_INVALID_PARAM);
    reqs[0].pos = 4;
    assert_int_equal(epd_engine_decode(e, &pool, reqs, 1, logits), EPD_OK);
    epd_free(pool.base);
    epd_engine_close(e);
}

static void test_release_clears_state(void **state)
{
    epd_engine_t *e = open_tiny();
    const epd_kv_layout_t *kv = &epd_engine_info(e)->kv;
    epd_kv_pool_t pool;
    uint32_t table[4] = {0, 1, 2, 3};
    int32_t toks[8];
    float logits[VOCAB];
    size_t n = make_prompt("state", toks);
    epd_kv_seq_t seq = seq_of(table, 4, 1, 1);
    unsigned char *zero;

    (void)state;
    epd_test_pool(e, 4, 2, &pool);
    prefill_ok(e, &pool, table, 4, 1, toks, 0, (uint32_t)n, logits);
    zero = calloc(1, kv->state_bytes);
    assert_non_null(zero);
    assert_true(memcmp(state_of(e, &pool, 0, 1), zero, kv->state_bytes) != 0);
    epd_engine_release(e, &pool, &seq);
    /* its stamps are gone (no stale state reads as a request's); the
     * template body stays, it is nobody's */
    for (uint32_t l = 0; l < kv->n_layers; l += 2) {
        const unsigned char *st = state_of(e, &pool, l, 1);
        epd_kv_stamp_t x;

        assert_memory_equal(st, zero, EPD_KV_STAMP_HALF);
        assert_memory_equal(st + kv->state_bytes - EPD_KV_STAMP_HALF, zero, EPD_KV_STAMP_HALF);
        assert_int_equal(epd_kv_stamp_get(st, kv->state_bytes, &x), EPD_ERR_CORRUPT);
    }
    free(zero);
    epd_free(pool.base);
    epd_engine_close(e);
}

static void test_open_allocation_failures(void **state)
{
    const char *dir = sim_dir("alloc", tiny_model, fast_accel, 0.5, EPD_SIM_SLEEP, 1);
    epd_engine_config_t cfg = {.model_dir = dir, .block_tokens = 4};
    epd_alloc_stats_t before;
    epd_alloc_stats_t after;
    long ok_at = -1;

    (void)state;
    epd_alloc_stats(&before);
    for (long n = 0; n < 200; n++) {
        epd_engine_t *e = NULL;
        epd_status_t status;

        epd_alloc_fail_after(n);
        status = epd_engine_open("sim", &cfg, &e);
        epd_alloc_fail_after(-1);
        if (status == EPD_OK) {
            ok_at = n;
            epd_engine_close(e);
            break;
        }
        assert_int_equal(status, EPD_ERR_NO_MEMORY);
        assert_null(e);
    }
    assert_true(ok_at > 0);
    epd_alloc_stats(&after);
    assert_int_equal(after.live_bytes, before.live_bytes);
    /* a pool's first prefill allocates its template digests (a failure is
     * clean); after that neither prefill nor decode allocates */
    {
        epd_engine_t *e = open_sim(dir, 4);
        epd_kv_pool_t pool;
        uint32_t table[4] = {0, 1, 2, 3};
        int32_t toks[8];
        float logits[VOCAB];
        size_t n = make_prompt("oom", toks);
        epd_prefill_args_t a = {
            .seq = seq_of(table, 4, 0, 1), .tokens = toks, .n_tokens = (uint32_t)n};
        epd_decode_req_t r = {.seq = a.seq, .pos = (uint32_t)n, .token = 'x'};

        epd_test_pool(e, 4, 1, &pool);
        epd_alloc_fail_after(0);
        assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_ERR_NO_MEMORY);
        epd_alloc_fail_after(-1);
        assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_OK);
        epd_alloc_fail_after(0);
        assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_OK);
        assert_int_equal(epd_engine_decode(e, &pool, &r, 1, logits), EPD_OK);
        epd_alloc_fail_after(-1);
        epd_free(pool.base);
        epd_engine_close(e);
    }
}

static void test_tokenizer(void **state)
{
    epd_engine_t *e = open_tiny();
    int32_t toks[16];
    char buf[16];
    size_t n;
    size_t len;
    int32_t mixed[4] = {'h', 257, 'i', 299};

    (void)state;
    assert_int_equal(epd_engine_tokenize(e, "hi", 2, 1, toks, 16, &n), EPD_OK);
    assert_int_equal(n, 3);
    assert_int_equal(toks[0], epd_engine_info(e)->bos_token);
    assert_int_equal(epd_engine_tokenize(e, "hi", 2, 1, toks, 2, &n), EPD_ERR_TOO_LONG);
    assert_int_equal(epd_engine_detokenize(e, mixed, 4, buf, sizeof(buf), &len), EPD_OK);
    assert_int_equal(len, 2);
    assert_memory_equal(buf, "hi", 2);
    epd_engine_close(e);
}

static void test_no_vision(void **state)
{
    /* sim models text only: no encoder, images and spans refused */
    epd_engine_t *e = open_tiny();
    const epd_engine_info_t *info = epd_engine_info(e);
    uint8_t px[3] = {1, 2, 3};
    epd_image_view_t img = {.width = 1, .height = 1, .rgb = px};
    float out[4];
    float rows[4] = {0};
    int32_t toks[16] = {256, 'a', 'b'};
    uint32_t pos[1];
    uint32_t table[4] = {0, 1, 2, 3};
    size_t n;
    epd_kv_pool_t pool;
    epd_embed_span_t span = {.pos = 1, .n = 1, .data = rows};
    epd_prefill_args_t a = {.seq = {.block_table = table, .n_blocks = 4},
                            .tokens = toks,
                            .n_tokens = 3,
                            .embeds = &span,
                            .n_embeds = 1};
    float *logits = calloc(info->vocab_size, sizeof(float));

    (void)state;
    assert_non_null(logits);
    assert_int_equal(info->image_embeddings, 0);
    assert_int_equal(info->embed_dim, 0);
    assert_int_equal(info->image_token, -1);
    assert_int_equal(info->image_size, 0);
    assert_int_equal(epd_engine_encode_image(e, &img, out), EPD_ERR_UNSUPPORTED);
    assert_int_equal(epd_engine_tokenize_images(e, "x", 1, 1, toks, 16, &n, pos),
                     EPD_ERR_UNSUPPORTED);
    assert_int_equal(epd_engine_tokenize_images(e, "ab", 2, 0, toks, 16, &n, NULL), EPD_OK);
    assert_int_equal(n, 3);
    epd_test_pool(e, 4, 1, &pool);
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_ERR_UNSUPPORTED);
    a.n_embeds = 0;
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, logits), EPD_OK);
    epd_free(pool.base);
    free(logits);
    epd_engine_close(e);
}

/* epd-generate --engine sim is the colocated baseline: greedy, it prints
 * the tokens a prefill + decode loop over the engine API produces. */
static void test_generate_tool(void **state)
{
    const char *dir = sim_dir("gen", tiny_model, fast_accel, 1.0, EPD_SIM_SLEEP, 3);
    epd_engine_t *e = open_sim(dir, 16);
    epd_kv_pool_t pool;
    uint32_t table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    int32_t toks[64];
    float logits[VOCAB];
    size_t n = make_prompt("colocated", toks);
    char cmd[4096];
    char want[1024];
    char got[1024];
    size_t len = 0;
    FILE *f;
    int rc;

    (void)state;
    epd_test_pool(e, 8, 1, &pool);
    prefill_ok(e, &pool, table, 8, 0, toks, 0, (uint32_t)n, logits);
    for (uint32_t i = 0; i < 12; i++) {
        epd_decode_req_t r = {
            .seq = seq_of(table, 8, 0, 1), .pos = (uint32_t)n + i, .token = argmax(logits, VOCAB)};

        len += (size_t)snprintf(want + len, sizeof(want) - len, "%s%d", i ? " " : "", r.token);
        if (i + 1 < 12) {
            assert_int_equal(epd_engine_decode(e, &pool, &r, 1, logits), EPD_OK);
        }
    }
    snprintf(want + len, sizeof(want) - len, "\n");
    snprintf(cmd, sizeof(cmd),
             "%s/epd-generate --engine sim --model %s --prompt colocated --max-tokens 12 "
             "--tokens >%s",
             EPD_TEST_BIN_DIR, dir, epd_test_path(tmpdir, "gen.out"));
    rc = system(cmd);
    assert_true(WIFEXITED(rc));
    assert_int_equal(WEXITSTATUS(rc), 0);
    f = fopen(epd_test_path(tmpdir, "gen.out"), "rb");
    assert_non_null(f);
    len = fread(got, 1, sizeof(got) - 1, f);
    got[len] = '\0';
    fclose(f);
    assert_string_equal(got, want);
    epd_free(pool.base);
    epd_engine_close(e);
}

static int setup(void **state)
{
    (void)state;
    tmpdir = epd_test_tmpdir();
    snprintf(tiny_model, sizeof(tiny_model), "%s/tiny.profile", tmpdir);
    snprintf(fast_accel, sizeof(fast_accel), "%s/fast.profile", tmpdir);
    snprintf(slow_accel, sizeof(slow_accel), "%s/slow.profile", tmpdir);
    epd_test_write_file(tiny_model, TINY_MODEL, strlen(TINY_MODEL));
    epd_test_write_file(fast_accel, FAST_ACCEL, strlen(FAST_ACCEL));
    epd_test_write_file(slow_accel, SLOW_ACCEL, strlen(SLOW_ACCEL));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    epd_test_rmtree(tmpdir);
    return 0;
}

/* Prefix caching: a checkpoint equals the state a prefill stopping there
 * leaves; a replay from it over shared blocks leaves them untouched and
 * ends where the whole prefill ends. */
/* 1 when two stamps say the same of the tokens (a cached block or a
 * checkpoint keeps the stamp of the request that computed it: its id and
 * tag aside). */
static int same_content(epd_kv_stamp_t a, epd_kv_stamp_t b)
{
    return a.hk == b.hk && a.layer == b.layer && a.index == b.index && a.count == b.count;
}

/* The stamp of linear layer `layer`'s unit in a state buffer. */
static epd_kv_stamp_t stamp_state(const epd_engine_t *e, const unsigned char *s)
{
    epd_kv_stamp_t st;

    assert_int_equal(epd_kv_stamp_get(s, epd_engine_info(e)->kv.state_bytes, &st), EPD_OK);
    return st;
}

static void test_replay_and_checkpoints(void **state)
{
    epd_engine_t *e = open_tiny();
    const epd_kv_layout_t *kv = &epd_engine_info(e)->kv;
    uint64_t ck_bytes = (uint64_t)kv->n_linear_layers * kv->state_bytes;
    unsigned char *ck8 = calloc(1, ck_bytes);
    unsigned char *snap;
    epd_state_ckpt_t ck = {8, ck8};
    uint32_t ta[16], tb[16], tc[16];
    int32_t toks[64];
    float whole[VOCAB], other[VOCAB];
    size_t n = make_prompt("a prompt long enough for several blocks", toks);
    epd_kv_pool_t pool;
    epd_prefill_args_t a;

    (void)state;
    assert_non_null(ck8);
    for (uint32_t i = 0; i < 16; i++) {
        ta[i] = i;
        tb[i] = 16 + i;
        tc[i] = 32 + i;
    }
    epd_test_pool(e, 48, 3, &pool);
    a = (epd_prefill_args_t){.seq = seq_of(ta, 16, 0, 1), .tokens = toks,
                             .n_tokens = (uint32_t)n, .ckpts = &ck, .n_ckpts = 1};
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, whole), EPD_OK);
    a = (epd_prefill_args_t){.seq = seq_of(tb, 16, 1, 2), .tokens = toks, .n_tokens = 8};
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, other), EPD_OK);
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        if (kv->kind[l] == EPD_LAYER_LINEAR) {
            assert_true(same_content(
                stamp_state(e, ck8 + (size_t)kv->kind_index[l] * kv->state_bytes),
                stamp_state(e, state_of(e, &pool, l, 1))));
        }
    }
    /* positions < 16 (4 blocks of 4) shared from ta, state from the checkpoint */
    memcpy(tc, ta, 4 * sizeof(uint32_t));
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        if (kv->kind[l] == EPD_LAYER_LINEAR) {
            memcpy((unsigned char *)state_of(e, &pool, l, 2),
                   ck8 + (size_t)kv->kind_index[l] * kv->state_bytes, kv->state_bytes);
        }
    }
    snap = malloc(pool.bytes);
    assert_non_null(snap);
    memcpy(snap, pool.base, pool.bytes);
    a = (epd_prefill_args_t){.seq = seq_of(tc, 16, 2, 3), .tokens = toks + 8,
                             .n_tokens = (uint32_t)n - 8, .start = 8, .replay_end = 16};
    assert_int_equal(epd_engine_prefill(e, &pool, &a, NULL, other), EPD_OK);
    assert_memory_equal(whole, other, sizeof(whole));
    /* what sim's bytes say of the tokens (its stamps: the bodies are
     * per-block templates) is the whole prompt's */
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        if (kv->kind[l] == EPD_LAYER_ATTENTION) {
            for (uint32_t b = 0; b * kv->block_tokens < n; b++) {
                assert_true(
                    same_content(stamp_blk(e, &pool, ta, l, b), stamp_blk(e, &pool, tc, l, b)));
            }
        } else {
            assert_true(same_content(stamp_state(e, state_of(e, &pool, l, 0)),
                                     stamp_state(e, state_of(e, &pool, l, 2))));
        }
    }
    /* the shared blocks were read, never written */
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        for (uint32_t b = 0; kv->kind[l] == EPD_LAYER_ATTENTION && b < 4; b++) {
            uint64_t off;

            assert_int_equal(epd_kv_block_offset(kv, 48, l, ta[b], &off), EPD_OK);
            assert_memory_equal(snap + off, (unsigned char *)pool.base + off, kv->block_bytes);
        }
    }
    free(snap);
    free(ck8);
    epd_free(pool.base);
    epd_engine_close(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shipped_profiles),
        cmocka_unit_test(test_bad_profiles_refused),
        cmocka_unit_test(test_mutated_profiles),
        cmocka_unit_test(test_bad_conf_refused),
        cmocka_unit_test(test_conf_round_trip),
        cmocka_unit_test(test_timing_formula),
        cmocka_unit_test(test_scale_invariant),
        cmocka_unit_test(test_same_prompt_same_bytes),
        cmocka_unit_test(test_different_prompts_differ),
        cmocka_unit_test(test_chunked_equals_whole),
        cmocka_unit_test(test_decode_continues_prefill),
        cmocka_unit_test(test_batch_equals_single),
        cmocka_unit_test(test_sink_once_per_layer),
        cmocka_unit_test(test_sink_abort),
        cmocka_unit_test(test_time_spent_sleep),
        cmocka_unit_test(test_time_spent_spin),
        cmocka_unit_test(test_slow_fill_said_once),
        cmocka_unit_test(test_refuses_bad_requests),
        cmocka_unit_test(test_release_clears_state),
        cmocka_unit_test(test_open_allocation_failures),
        cmocka_unit_test(test_tokenizer),
        cmocka_unit_test(test_no_vision),
        cmocka_unit_test(test_generate_tool),
        cmocka_unit_test(test_replay_and_checkpoints),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
