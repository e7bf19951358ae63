/*
 * Tests of prefill/epd_prefill_compute.c: the compute thread behind its
 * two queues.  A run reports every layer in order, then DONE with the
 * colocated first token, and leaves exactly the colocated KV in the
 * request's blocks and slot; a run canceled before it starts reports no
 * layer, one canceled while it runs stops at the next layer boundary it
 * reaches; a release reports RELEASED; many requests queued at once all
 * complete in FIFO order and the backlog returns to zero.
 */
#include "epd_test.h"

#include <stdatomic.h>
#include <string.h>

#include <uv.h>

#include "epd_alloc.h"
#include "epd_prefill_compute.h"
#include "epd_sample.h"
#include "epd_test_engine_util.h"
#include "epd_time.h"

#define N_REQ 6
#define POOL_BLOCKS 64
#define POOL_SLOTS 8

typedef struct {
    epd_prefill_job_t job, release;
    epd_prefill_ev_t evs[16];
    atomic_int cancel;
    uint32_t block_table[8];
    int32_t tokens[64];
    uint32_t n_layer_evs;
    int done, released;
    epd_status_t status;
    int32_t first_token;
    int cancel_after_layer0;
} req_t;

typedef struct {
    uv_loop_t loop;
    epd_engine_t *engine; /* taken by the compute thread */
    epd_engine_t *ref;    /* a second instance: the colocated reference */
    const epd_engine_info_t *info;
    epd_kv_pool_t pool;
    epd_prefill_compute_t *c;
    req_t reqs[N_REQ];
    int order[N_REQ];
    int n_done;
    int bad_order;
    const char *dir;
} ctx_t;

static ctx_t *g;

static void on_event(void *arg, epd_prefill_ev_t *ev)
{
    ctx_t *t = arg;
    req_t *r = ev->owner;

    switch (ev->kind) {
    case EPD_PREFILL_EV_LAYER:
        if (ev->layer != r->n_layer_evs || r->done) {
            t->bad_order = 1;
        }
        r->n_layer_evs++;
        if (r->cancel_after_layer0) {
            atomic_store(&r->cancel, 1);
        }
        break;
    case EPD_PREFILL_EV_ENCODED:
        t->bad_order = 1; /* no image is ever submitted here */
        break;
    case EPD_PREFILL_EV_DONE:
        r->done = 1;
        r->status = ev->status;
        r->first_token = ev->first_token;
        t->order[t->n_done++] = (int)(r - t->reqs);
        break;
    case EPD_PREFILL_EV_RELEASED:
        r->released = 1;
        break;
    case EPD_PREFILL_EV_CHUNK:
        t->bad_order = 1; /* the compute module keeps these */
        break;
    }
}

static int setup(void **state)
{
    epd_mkmodel_params_t p;
    epd_engine_config_t cfg;
    const char *model;

    g = epd_calloc(1, sizeof(*g));
    assert_non_null(g);
    g->dir = epd_test_tmpdir();
    epd_test_tiny_params(&p);
    model = epd_test_write_model(g->dir, "tiny", &p);
    memset(&cfg, 0, sizeof(cfg));
    cfg.model_dir = model;
    cfg.block_tokens = 16;
    assert_int_equal(epd_engine_open("ref", &cfg, &g->engine), EPD_OK);
    assert_int_equal(epd_engine_open("ref", &cfg, &g->ref), EPD_OK);
    g->info = epd_engine_info(g->engine);
    epd_test_pool(g->engine, POOL_BLOCKS, POOL_SLOTS, &g->pool);
    assert_int_equal(uv_loop_init(&g->loop), 0);
    assert_int_equal(
        epd_prefill_compute_create(&g->loop, g->engine, &g->pool, POOL_SLOTS, 0, 0, on_event, g,
                                   &g->c),
        EPD_OK);
    *state = g;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    epd_prefill_compute_destroy(g->c);
    uv_run(&g->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&g->loop), 0);
    epd_engine_close(g->ref);
    epd_free(g->pool.base);
    epd_test_rmtree(g->dir);
    epd_free(g);
    return 0;
}

/* Request i: n tokens, blocks 8*i+7, 8*i+2, ... (scattered), slot i. */
static void req_init(req_t *r, int i, uint32_t n)
{
    uint32_t n_layers = g->info->kv.n_layers;
    uint32_t nb = (n + 15) / 16;

    memset(r, 0, sizeof(*r));
    atomic_init(&r->cancel, 0);
    r->tokens[0] = g->info->bos_token;
    for (uint32_t k = 1; k < n; k++) {
        r->tokens[k] = (int32_t)(32 + (k * 7 + (uint32_t)i * 13) % 90);
    }
    for (uint32_t b = 0; b < nb; b++) {
        r->block_table[b] = (uint32_t)i * 8 + (7 - b * 5 % 8);
    }
    for (uint32_t l = 0; l < n_layers; l++) {
        r->evs[l] = (epd_prefill_ev_t){.kind = EPD_PREFILL_EV_LAYER, .layer = l, .owner = r};
    }
    r->evs[n_layers] = (epd_prefill_ev_t){.kind = EPD_PREFILL_EV_DONE, .owner = r};
    r->evs[n_layers + 1] = (epd_prefill_ev_t){.kind = EPD_PREFILL_EV_RELEASED, .owner = r};
    r->job.kind = EPD_PREFILL_JOB_RUN;
    r->job.seq.req_id = (uint64_t)i + 1;
    r->job.seq.block_table = r->block_table;
    r->job.seq.n_blocks = nb;
    r->job.seq.state_slot = (uint32_t)i;
    r->job.tokens = r->tokens;
    r->job.n_tokens = n;
    epd_sample_params_default(&r->job.sample);
    r->job.sample.temperature = 0.7f;
    r->job.sample.seed = 42 + (uint64_t)i;
    r->job.cancel = &r->cancel;
    r->job.layer_evs = r->evs;
    r->job.done_ev = &r->evs[n_layers];
    r->release.kind = EPD_PREFILL_JOB_RELEASE;
    r->release.seq = r->job.seq;
    r->release.done_ev = &r->evs[n_layers + 1];
}

static void run_until(int (*cond)(void), int timeout_ms)
{
    uint64_t end = uv_hrtime() + (uint64_t)timeout_ms * 1000000ull;

    while (!cond() && uv_hrtime() < end) {
        uv_run(&g->loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
}

static int all_done(void)
{
    for (int i = 0; i < N_REQ; i++) {
        if (g->reqs[i].job.kind != 0 && !g->reqs[i].done) {
            return 0;
        }
    }
    return 1;
}

static int all_released(void)
{
    for (int i = 0; i < N_REQ; i++) {
        if (g->reqs[i].job.kind != 0 && !g->reqs[i].released) {
            return 0;
        }
    }
    return 1;
}

/* The colocated reference: the same prefill on another engine instance and
 * pool, same blocks, same slot; the same sampler step 0. */
static void check_against_reference(const req_t *r)
{
    const epd_kv_layout_t *kv = &g->info->kv;
    epd_kv_pool_t pool;
    epd_prefill_args_t a;
    epd_sample_scratch_t *scratch;
    float *logits = epd_calloc(g->info->vocab_size, sizeof(float));
    int32_t tok;

    epd_test_pool(g->ref, POOL_BLOCKS, POOL_SLOTS, &pool);
    memset(&a, 0, sizeof(a));
    a.seq = r->job.seq;
    a.tokens = r->tokens;
    a.n_tokens = r->job.n_tokens;
    a.embeds = r->job.embeds; /* whole: the reference is one call */
    a.n_embeds = r->job.n_embeds;
    assert_int_equal(epd_engine_prefill(g->ref, &pool, &a, NULL, logits), EPD_OK);
    assert_int_equal(epd_sample_scratch_create(g->info->vocab_size, &scratch), EPD_OK);
    assert_int_equal(
        epd_sample_token(&r->job.sample, scratch, logits, g->info->vocab_size, 0, &tok), EPD_OK);
    assert_int_equal(r->first_token, tok);
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        uint64_t off;

        if (kv->kind[l] == EPD_LAYER_LINEAR) {
            assert_int_equal(
                epd_kv_state_offset(kv, POOL_BLOCKS, POOL_SLOTS, l, r->job.seq.state_slot, &off),
                EPD_OK);
            assert_memory_equal((char *)g->pool.base + off, (char *)pool.base + off,
                                kv->state_bytes);
            continue;
        }
        for (uint32_t b = 0; b < r->job.seq.n_blocks; b++) {
            assert_int_equal(epd_kv_block_offset(kv, POOL_BLOCKS, l, r->block_table[b], &off),
                             EPD_OK);
            assert_memory_equal((char *)g->pool.base + off, (char *)pool.base + off,
                                kv->block_bytes);
        }
    }
    epd_sample_scratch_destroy(scratch);
    epd_free(logits);
    epd_free(pool.base);
}

static void test_runs_in_order_and_match_colocated(void **state)
{
    uint32_t jobs;
    uint64_t toks, rtoks, router_total = 0, others_total = 0;

    (void)state;
    for (int i = 0; i < N_REQ; i++) {
        req_init(&g->reqs[i], i, 5 + (uint32_t)i * 9);
        g->reqs[i].job.from_router = i % 2; /* the router's runs count apart */
        *(i % 2 ? &router_total : &others_total) += 5 + (uint64_t)i * 9;
        assert_int_equal(epd_prefill_compute_submit(g->c, &g->reqs[i].job), EPD_OK);
    }
    /* whatever has started by now: the router's part is within the sum,
     * each part within what was submitted of it */
    epd_prefill_compute_backlog(g->c, &jobs, &toks, &rtoks);
    assert_true(rtoks <= toks);
    assert_true(rtoks <= router_total);
    assert_true(toks - rtoks <= others_total);
    run_until(all_done, 30000);
    assert_true(all_done());
    assert_int_equal(g->bad_order, 0);
    for (int i = 0; i < N_REQ; i++) {
        req_t *r = &g->reqs[i];

        assert_int_equal(g->order[i], i); /* FIFO */
        assert_int_equal(r->status, EPD_OK);
        assert_int_equal(r->n_layer_evs, g->info->kv.n_layers);
        check_against_reference(r);
    }
    epd_prefill_compute_backlog(g->c, &jobs, &toks, &rtoks);
    assert_int_equal(jobs, 0);
    assert_int_equal(toks, 0);
    assert_int_equal(rtoks, 0);
    for (int i = 0; i < N_REQ; i++) {
        assert_int_equal(epd_prefill_compute_submit(g->c, &g->reqs[i].release), EPD_OK);
    }
    run_until(all_released, 30000);
    assert_true(all_released());
}

static void test_cancel(void **state)
{
    (void)state;
    memset(g->reqs, 0, sizeof(g->reqs));
    g->n_done = 0;
    /* canceled before it starts: no layer at all */
    req_init(&g->reqs[0], 0, 40);
    atomic_store(&g->reqs[0].cancel, 1);
    /* canceled by the loop after layer 0: stops at that boundary */
    req_init(&g->reqs[1], 1, 40);
    g->reqs[1].cancel_after_layer0 = 1;
    /* untouched: runs to the end */
    req_init(&g->reqs[2], 2, 40);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(epd_prefill_compute_submit(g->c, &g->reqs[i].job), EPD_OK);
    }
    run_until(all_done, 30000);
    assert_true(all_done());
    assert_int_equal(g->reqs[0].status, EPD_ERR_CANCELED);
    assert_int_equal(g->reqs[0].n_layer_evs, 0);
    /* the loop sets the flag when it sees layer 0, while the compute thread
     * runs on: the sink of the next boundary it reaches stops the run, or
     * the run had already passed its last boundary (then it completes) */
    if (g->reqs[1].status == EPD_ERR_CANCELED) {
        assert_true(g->reqs[1].n_layer_evs >= 1);
        assert_true(g->reqs[1].n_layer_evs <= g->info->kv.n_layers);
    } else {
        assert_int_equal(g->reqs[1].status, EPD_OK);
        assert_int_equal(g->reqs[1].n_layer_evs, g->info->kv.n_layers);
    }
    assert_int_equal(g->reqs[2].status, EPD_OK);
    assert_int_equal(g->reqs[2].n_layer_evs, g->info->kv.n_layers);
}

/* The size argument: with max_requests 1 the event queue holds what one
 * request can have queued (n_layers + 3, rounded up to a power of two).  The loop does not drain at
 * all while the run completes and the release follows: nothing blocks, nothing is lost, everything
 * arrives in order afterwards. */
static void test_queue_bound(void **state)
{
    epd_prefill_compute_t *one;
    req_t *r = &g->reqs[0];
    uint64_t end;
    uint32_t jobs = 1;
    uint64_t toks, rtoks;

    (void)state;
    memset(g->reqs, 0, sizeof(g->reqs));
    g->n_done = 0;
    epd_prefill_compute_destroy(g->c); /* the setup's instance, engine included */
    uv_run(&g->loop, UV_RUN_NOWAIT);
    g->c = NULL;
    {
        epd_engine_config_t cfg;
        epd_mkmodel_params_t p;

        epd_test_tiny_params(&p);
        memset(&cfg, 0, sizeof(cfg));
        cfg.model_dir = epd_test_write_model(g->dir, "tiny2", &p);
        cfg.block_tokens = 16;
        assert_int_equal(epd_engine_open("ref", &cfg, &g->engine), EPD_OK);
        g->info = epd_engine_info(g->engine);
    }
    assert_int_equal(
        epd_prefill_compute_create(&g->loop, g->engine, &g->pool, 1, 0, 0, on_event, g, &one),
        EPD_OK);
    g->c = one;
    req_init(r, 0, 60);
    assert_int_equal(epd_prefill_compute_submit(one, &r->job), EPD_OK);
    /* wait for the run to finish without running the loop */
    end = epd_time_now_ns() + 30 * EPD_NSEC_PER_SEC;
    while (jobs != 0 && epd_time_now_ns() < end) {
        epd_prefill_compute_backlog(one, &jobs, &toks, &rtoks);
        epd_time_sleep_ns(EPD_NSEC_PER_MSEC);
    }
    assert_int_equal(jobs, 0);
    epd_time_sleep_ns(300 * EPD_NSEC_PER_MSEC); /* the run itself ends */
    assert_int_equal(epd_prefill_compute_submit(one, &r->release), EPD_OK);
    epd_time_sleep_ns(100 * EPD_NSEC_PER_MSEC);
    assert_int_equal(r->n_layer_evs, 0); /* nothing consumed yet */
    run_until(all_released, 30000);
    assert_true(r->done);
    assert_true(r->released);
    assert_int_equal(r->status, EPD_OK);
    assert_int_equal(r->n_layer_evs, g->info->kv.n_layers);
    assert_int_equal(g->bad_order, 0);
}

/* Chunked prefill (issue #25): with 7-token chunks (not dividing the
 * 16-token block) on the hybrid tiny model, every run leaves exactly the
 * colocated whole-prompt KV, state and first token, reports each layer
 * once, in its last chunk; and the turns go round robin: a 5-token prompt
 * submitted behind a 60-token one (9 chunks) finishes first.  Greedy
 * turns off: with it the 60-token run may take chunks while the others are
 * still being submitted (nothing waits yet), and the order depends on
 * that race (it did, once, in a clean-clone make check). */
static void test_chunked_round_robin(void **state)
{
    uint32_t jobs;
    uint64_t toks, rtoks;

    (void)state;
    memset(g->reqs, 0, sizeof(g->reqs));
    g->n_done = 0;
    epd_prefill_compute_set_chunk(g->c, 7);
    epd_prefill_compute_set_greedy(g->c, 0);
    req_init(&g->reqs[0], 0, 60);
    req_init(&g->reqs[1], 1, 5);
    req_init(&g->reqs[2], 2, 33);
    req_init(&g->reqs[3], 3, 14); /* two chunks exactly */
    for (int i = 0; i < 4; i++) {
        assert_int_equal(epd_prefill_compute_submit(g->c, &g->reqs[i].job), EPD_OK);
    }
    run_until(all_done, 30000);
    assert_true(all_done());
    assert_int_equal(g->bad_order, 0);
    /* the one-chunk prompt waits behind one chunk of the long one at most */
    assert_int_equal(g->order[0], 1);
    assert_int_equal(g->order[3], 0); /* the longest ends last */
    for (int i = 0; i < 4; i++) {
        assert_int_equal(g->reqs[i].status, EPD_OK);
        assert_int_equal(g->reqs[i].n_layer_evs, g->info->kv.n_layers);
        check_against_reference(&g->reqs[i]);
    }
    epd_prefill_compute_backlog(g->c, &jobs, &toks, &rtoks);
    assert_int_equal(jobs, 0);
    assert_int_equal(toks, 0);
    epd_prefill_compute_set_greedy(g->c, 1);
}

static int one_parked(void)
{
    return epd_prefill_compute_parked(g->c) == 1;
}

/* A run whose blocks from block_table[2] on are still being copied out to
 * the prefix cache's tier (copy_from 2, copy_wait 3), in chunks of one
 * block: its first two chunks run, the third parks it; copies up to 2
 * leave it parked, up to 3 let it go on; it ends as the reference does.
 * Not chunked, the same run parks before computing anything. */
static void test_copy_park(void **state)
{
    (void)state;
    for (int chunked = 1; chunked >= 0; chunked--) {
        memset(g->reqs, 0, sizeof(g->reqs));
        g->n_done = 0;
        epd_prefill_compute_set_chunk(g->c, chunked ? 16 : 0);
        req_init(&g->reqs[0], 0, 60);
        g->reqs[0].job.copy_from = 2;
        g->reqs[0].job.copy_wait = 3 + 10 * (uint64_t)(1 - chunked);
        assert_int_equal(epd_prefill_compute_submit(g->c, &g->reqs[0].job), EPD_OK);
        run_until(one_parked, 30000);
        assert_int_equal(epd_prefill_compute_parked(g->c), 1);
        assert_false(g->reqs[0].done);
        epd_prefill_compute_copied(g->c, g->reqs[0].job.copy_wait - 1);
        assert_int_equal(epd_prefill_compute_parked(g->c), 1);
        epd_prefill_compute_copied(g->c, g->reqs[0].job.copy_wait);
        assert_int_equal(epd_prefill_compute_parked(g->c), 0);
        run_until(all_done, 30000);
        assert_true(all_done());
        assert_int_equal(g->bad_order, 0);
        assert_int_equal(g->reqs[0].status, EPD_OK);
        assert_int_equal(g->reqs[0].n_layer_evs, g->info->kv.n_layers);
        check_against_reference(&g->reqs[0]);
    }
}

/* A chunked run canceled between its chunks stops at the next chunk
 * boundary: DONE with EPD_ERR_CANCELED and not one layer handed over. */
static void test_chunked_cancel(void **state)
{
    (void)state;
    memset(g->reqs, 0, sizeof(g->reqs));
    g->n_done = 0;
    epd_prefill_compute_set_chunk(g->c, 4);
    req_init(&g->reqs[0], 0, 60);
    atomic_store(&g->reqs[0].cancel, 1);
    req_init(&g->reqs[1], 1, 60);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(epd_prefill_compute_submit(g->c, &g->reqs[i].job), EPD_OK);
    }
    run_until(all_done, 30000);
    assert_true(all_done());
    assert_int_equal(g->reqs[0].status, EPD_ERR_CANCELED);
    assert_int_equal(g->reqs[0].n_layer_evs, 0);
    assert_int_equal(g->reqs[1].status, EPD_OK);
    check_against_reference(&g->reqs[1]);
}

/* A chunk that ends inside an image's placeholder span (issue #25): the
 * vision tiny model, a 4-embedding image at positions 5..8, 7-token
 * chunks: the first chunk passes the span cut at 7, the second the rest;
 * the KV, state and first token equal the whole-prompt run's. */
static void test_chunked_image_span(void **state)
{
    epd_mkmodel_params_t p;
    epd_engine_config_t cfg;
    epd_embed_span_t span;
    req_t *r = &g->reqs[0];
    float *rows;
    uint32_t n_rows;

    (void)state;
    memset(g->reqs, 0, sizeof(g->reqs));
    g->n_done = 0;
    /* the setup's instances give way to vision ones */
    epd_prefill_compute_destroy(g->c);
    uv_run(&g->loop, UV_RUN_NOWAIT);
    g->c = NULL;
    epd_engine_close(g->ref);
    epd_free(g->pool.base);
    epd_test_tiny_vision_params(&p);
    memset(&cfg, 0, sizeof(cfg));
    cfg.model_dir = epd_test_write_model(g->dir, "tinyv", &p);
    cfg.block_tokens = 16;
    assert_int_equal(epd_engine_open("ref", &cfg, &g->engine), EPD_OK);
    assert_int_equal(epd_engine_open("ref", &cfg, &g->ref), EPD_OK);
    g->info = epd_engine_info(g->engine);
    assert_true(g->info->image_embeddings > 2 && g->info->image_embeddings < 10);
    epd_test_pool(g->engine, POOL_BLOCKS, POOL_SLOTS, &g->pool);
    assert_int_equal(epd_prefill_compute_create(&g->loop, g->engine, &g->pool, POOL_SLOTS, 1, 0,
                                                on_event, g, &g->c),
                     EPD_OK);
    epd_prefill_compute_set_chunk(g->c, 7);
    req_init(r, 0, 30);
    n_rows = g->info->image_embeddings;
    for (uint32_t k = 0; k < n_rows; k++) {
        r->tokens[5 + k] = g->info->image_token;
    }
    rows = epd_calloc((size_t)n_rows * g->info->embed_dim, sizeof(float));
    assert_non_null(rows);
    for (size_t k = 0; k < (size_t)n_rows * g->info->embed_dim; k++) {
        rows[k] = (float)((k * 37) % 17) / 8.0f - 1.0f;
    }
    span = (epd_embed_span_t){.pos = 5, .n = n_rows, .data = rows};
    r->job.embeds = &span;
    r->job.n_embeds = 1;
    assert_int_equal(epd_prefill_compute_submit(g->c, &r->job), EPD_OK);
    run_until(all_done, 30000);
    assert_true(all_done());
    assert_int_equal(g->bad_order, 0);
    assert_int_equal(r->status, EPD_OK);
    assert_int_equal(r->n_layer_evs, g->info->kv.n_layers);
    check_against_reference(r);
    epd_free(rows);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_runs_in_order_and_match_colocated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_queue_bound, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chunked_round_robin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chunked_cancel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_copy_park, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chunked_image_span, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
