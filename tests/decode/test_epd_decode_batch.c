/*
 * Unit tests of decode/epd_decode_batch.c: the compute thread's continuous
 * batch reproduces colocated generation token for token (requests of
 * different lengths and sampling settings joining one batch, more requests
 * than max_batch), an aborted request leaves at a step boundary with
 * FINISH_ABORT while the others go on, and sequences whose blocks grow
 * on demand wait at block boundaries and still produce the same tokens.
 */
#include "epd_test.h"

#include <stdatomic.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_decode_batch.h"
#include "epd_time.h"
#include "epd_test_engine_util.h"

#define N_REQS 7
#define MAX_NEW 24

typedef struct {
    int32_t prompt[40];
    uint32_t n_prompt;
    uint32_t max_tokens;
    epd_sample_params_t sp;
    uint32_t stop[1];
    uint32_t n_stop;
    int32_t expect[MAX_NEW];
    uint32_t n_expect;
    int expect_finish;
    /* disaggregated side */
    uint32_t table[8];
    int32_t tokens[MAX_NEW];
    epd_decode_seq_t seq;
    uint32_t seen;
    int done;
} breq_t;

static atomic_int wakes;

static void on_wake(void *arg)
{
    (void)arg;
    atomic_fetch_add(&wakes, 1);
}

static const char *model_dir;
static const char *tmp_dir;

static int setup(void **state)
{
    epd_mkmodel_params_t p;

    (void)state;
    tmp_dir = epd_test_tmpdir();
    epd_test_tiny_params(&p);
    model_dir = epd_test_write_model(tmp_dir, "tiny", &p);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    epd_test_rmtree(tmp_dir);
    return 0;
}

/* Colocated reference, exactly as engine/tools/epd_generate.c. */
static void colocated(epd_engine_t *engine, breq_t *r)
{
    const epd_engine_info_t *info = epd_engine_info(engine);
    epd_sample_scratch_t *scratch;
    epd_kv_pool_t pool;
    uint32_t table[8];
    float *logits = epd_calloc(info->vocab_size, sizeof(float));
    epd_prefill_args_t pa;

    assert_int_equal(epd_sample_scratch_create(info->vocab_size, &scratch), EPD_OK);
    epd_test_pool(engine, 8, 1, &pool);
    for (uint32_t i = 0; i < 8; i++) {
        table[i] = i;
    }
    memset(&pa, 0, sizeof(pa));
    pa.seq.req_id = 1;
    pa.seq.block_table = table;
    pa.seq.n_blocks = 8;
    pa.tokens = r->prompt;
    pa.n_tokens = r->n_prompt;
    assert_int_equal(epd_engine_prefill(engine, &pool, &pa, NULL, logits), EPD_OK);
    r->n_expect = 0;
    for (;;) {
        epd_decode_req_t dr;
        int32_t tok;

        assert_int_equal(
            epd_sample_token(&r->sp, scratch, logits, info->vocab_size, r->n_expect, &tok), EPD_OK);
        r->expect[r->n_expect++] = tok;
        if (tok == info->eos_token || (r->n_stop && (uint32_t)tok == r->stop[0])) {
            r->expect_finish = EPD_DECODE_FINISH_STOP;
            break;
        }
        if (r->n_expect == r->max_tokens) {
            r->expect_finish = EPD_DECODE_FINISH_LENGTH;
            break;
        }
        dr.seq = pa.seq;
        dr.pos = r->n_prompt + r->n_expect - 1;
        dr.token = tok;
        assert_int_equal(epd_engine_decode(engine, &pool, &dr, 1, logits), EPD_OK);
    }
    epd_free(pool.base);
    epd_free(logits);
    epd_sample_scratch_destroy(scratch);
}

/* Prefill into the shared pool (what P + the transfer would leave there)
 * and sample the first token (P's step 0). */
static void disagg_prefill(epd_engine_t *engine, const epd_kv_pool_t *pool, breq_t *r,
                           uint32_t first_block, uint32_t slot, uint64_t id)
{
    const epd_engine_info_t *info = epd_engine_info(engine);
    epd_sample_scratch_t *scratch;
    float *logits = epd_calloc(info->vocab_size, sizeof(float));
    epd_prefill_args_t pa;
    int32_t tok;
    uint32_t n_blocks =
        (r->n_prompt + r->max_tokens + info->kv.block_tokens - 1) / info->kv.block_tokens;

    assert_true(n_blocks <= 8);
    for (uint32_t i = 0; i < n_blocks; i++) {
        r->table[i] = first_block + i;
    }
    assert_int_equal(epd_sample_scratch_create(info->vocab_size, &scratch), EPD_OK);
    memset(&pa, 0, sizeof(pa));
    pa.seq.req_id = id;
    pa.seq.block_table = r->table;
    pa.seq.n_blocks = n_blocks;
    pa.seq.state_slot = slot;
    pa.tokens = r->prompt;
    pa.n_tokens = r->n_prompt;
    assert_int_equal(epd_engine_prefill(engine, pool, &pa, NULL, logits), EPD_OK);
    assert_int_equal(epd_sample_token(&r->sp, scratch, logits, info->vocab_size, 0, &tok), EPD_OK);
    memset(&r->seq, 0, sizeof(r->seq));
    r->seq.req_id = id;
    r->seq.block_table = r->table;
    r->seq.slot = slot;
    r->seq.n_prompt = r->n_prompt;
    r->seq.max_tokens = r->max_tokens;
    r->seq.sp = r->sp;
    r->seq.stop_ids = r->stop;
    r->seq.n_stop = r->n_stop;
    r->seq.tokens = r->tokens;
    epd_decode_seq_init(&r->seq, 1, n_blocks);
    r->tokens[0] = tok;
    r->seen = 1;
    epd_free(logits);
    epd_sample_scratch_destroy(scratch);
}

static void make_reqs(breq_t *reqs, int n)
{
    memset(reqs, 0, sizeof(*reqs) * (size_t)n);
    for (int i = 0; i < n; i++) {
        breq_t *r = &reqs[i];

        r->n_prompt = 3 + (uint32_t)i * 5;
        for (uint32_t t = 0; t < r->n_prompt; t++) {
            r->prompt[t] = (int32_t)((t * 7 + (uint32_t)i * 13 + 1) % 250) + 3;
        }
        r->max_tokens = 2 + (uint32_t)(i * 3) % MAX_NEW;
        epd_sample_params_default(&r->sp);
        if (i % 2 == 1) {
            r->sp.temperature = 0.9f;
            r->sp.top_k = (uint32_t)i * 4;
            r->sp.top_p = 0.95f;
            r->sp.seed = 1000 + (uint64_t)i;
        }
    }
}

/* Drains the loop side until every request finished (or 30 s). */
static void drain(epd_decode_batch_t *b, breq_t *reqs, int n)
{
    uint64_t end = epd_time_now_ns() + 30 * EPD_NSEC_PER_SEC;
    int left = n;

    while (left > 0) {
        epd_decode_seq_t *seq;
        int final;

        assert_true(epd_time_now_ns() < end);
        seq = epd_decode_batch_poll(b, &final);
        if (seq == NULL) {
            epd_time_sleep_ns(200 * EPD_NSEC_PER_USEC);
            continue;
        }
        for (int i = 0; i < n; i++) {
            breq_t *r = &reqs[i];

            if (&r->seq != seq) {
                continue;
            }
            assert_false(r->done);
            r->seen = atomic_load(&seq->n_produced);
            if (final) {
                r->done = 1;
                left--;
            }
        }
    }
}

static void test_batch_equals_colocated(void **state)
{
    static breq_t reqs[N_REQS];
    epd_engine_config_t cfg = {.model_dir = model_dir, .max_batch = 3};
    epd_engine_t *engine;
    epd_decode_batch_t *b;
    epd_kv_pool_t pool;

    (void)state;
    assert_int_equal(epd_engine_open("ref", &cfg, &engine), EPD_OK);
    make_reqs(reqs, N_REQS);
    for (int i = 0; i < N_REQS; i++) {
        colocated(engine, &reqs[i]);
    }
    /* a stop id: request 2 stops at its 3rd token (if not earlier) */
    reqs[2].stop[0] = (uint32_t)reqs[2].expect[2];
    reqs[2].n_stop = 1;
    colocated(engine, &reqs[2]);

    epd_test_pool(engine, 8 * N_REQS, N_REQS, &pool);
    for (int i = 0; i < N_REQS; i++) {
        disagg_prefill(engine, &pool, &reqs[i], 8 * (uint32_t)i, (uint32_t)i, 100 + (uint64_t)i);
    }
    /* max_batch 3 < 7 requests, join queue of 2: the rest wait and retry */
    assert_int_equal(epd_decode_batch_create(engine, &pool, 3, 2, on_wake, NULL, &b), EPD_OK);
    {
        int next = 0;
        uint64_t end = epd_time_now_ns() + 30 * EPD_NSEC_PER_SEC;
        int left = N_REQS;

        while (left > 0) {
            epd_decode_seq_t *seq;
            int final;

            assert_true(epd_time_now_ns() < end);
            while (next < N_REQS && epd_decode_batch_submit(b, &reqs[next].seq) == EPD_OK) {
                next++;
            }
            seq = epd_decode_batch_poll(b, &final);
            if (seq == NULL) {
                epd_time_sleep_ns(100 * EPD_NSEC_PER_USEC);
                continue;
            }
            for (int i = 0; i < N_REQS; i++) {
                if (&reqs[i].seq == seq) {
                    uint32_t n = atomic_load(&seq->n_produced);

                    assert_false(reqs[i].done);
                    assert_true(n >= reqs[i].seen);
                    reqs[i].seen = n;
                    if (final) {
                        reqs[i].done = 1;
                        left--;
                    }
                }
            }
        }
    }
    for (int i = 0; i < N_REQS; i++) {
        breq_t *r = &reqs[i];

        assert_int_equal(r->seen, r->n_expect);
        assert_memory_equal(r->tokens, r->expect, r->n_expect * sizeof(int32_t));
        assert_int_equal(atomic_load(&r->seq.finish), r->expect_finish);
    }
    assert_true(atomic_load(&wakes) > 0);
    assert_int_equal(epd_decode_batch_running(b), 0);
    epd_decode_batch_destroy(b);
    epd_free(pool.base);
    epd_engine_close(engine);
}

static void test_abort_leaves_at_step_boundary(void **state)
{
    static breq_t reqs[3];
    epd_engine_config_t cfg = {.model_dir = model_dir, .max_batch = 4};
    epd_engine_t *engine;
    epd_decode_batch_t *b;
    epd_kv_pool_t pool;

    (void)state;
    assert_int_equal(epd_engine_open("ref", &cfg, &engine), EPD_OK);
    make_reqs(reqs, 3);
    for (int i = 0; i < 3; i++) {
        reqs[i].max_tokens = MAX_NEW;
        reqs[i].sp.temperature = 0.0f; /* greedy: no early EOS surprises matter */
        colocated(engine, &reqs[i]);
    }
    epd_test_pool(engine, 24, 3, &pool);
    for (int i = 0; i < 3; i++) {
        disagg_prefill(engine, &pool, &reqs[i], 8 * (uint32_t)i, (uint32_t)i, 200 + (uint64_t)i);
    }
    /* abort request 1 before it ever runs, and request 0 at once after submit */
    epd_decode_seq_abort(&reqs[1].seq);
    assert_int_equal(epd_decode_batch_create(engine, &pool, 4, 8, on_wake, NULL, &b), EPD_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(epd_decode_batch_submit(b, &reqs[i].seq), EPD_OK);
    }
    epd_decode_seq_abort(&reqs[0].seq);
    drain(b, reqs, 3);
    assert_int_equal(atomic_load(&reqs[1].seq.finish), EPD_DECODE_FINISH_ABORT);
    assert_int_equal(reqs[1].seen, 1);
    /* request 0 either finished on its own first or left on abort; what it
     * produced is a prefix of the colocated output */
    assert_true(reqs[0].seen <= reqs[0].n_expect);
    assert_memory_equal(reqs[0].tokens, reqs[0].expect, reqs[0].seen * sizeof(int32_t));
    if (atomic_load(&reqs[0].seq.finish) != EPD_DECODE_FINISH_ABORT) {
        assert_int_equal(reqs[0].seen, reqs[0].n_expect);
    }
    /* the untouched request is complete and exact */
    assert_int_equal(reqs[2].seen, reqs[2].n_expect);
    assert_memory_equal(reqs[2].tokens, reqs[2].expect, reqs[2].n_expect * sizeof(int32_t));
    epd_decode_batch_destroy(b);
    epd_free(pool.base);
    epd_engine_close(engine);
}

/* KV on demand: each sequence starts with only the blocks its first step
 * needs and the loop grows it one block at a time, only once it stalls at
 * a block boundary (and the grow wakes the sleeping compute thread):
 * the tokens are still exactly the colocated ones, and a sequence with no
 * room never runs past its blocks. */
static void test_grows_on_demand(void **state)
{
    static breq_t reqs[4];
    epd_engine_config_t cfg = {.model_dir = model_dir, .max_batch = 4};
    epd_engine_t *engine;
    epd_decode_batch_t *b;
    epd_kv_pool_t pool;
    uint32_t bt;
    int left = 4;
    uint64_t end;

    (void)state;
    assert_int_equal(epd_engine_open("ref", &cfg, &engine), EPD_OK);
    bt = epd_engine_info(engine)->kv.block_tokens;
    make_reqs(reqs, 4);
    for (int i = 0; i < 4; i++) {
        reqs[i].max_tokens = MAX_NEW;
        colocated(engine, &reqs[i]);
    }
    epd_test_pool(engine, 32, 4, &pool);
    for (int i = 0; i < 4; i++) {
        disagg_prefill(engine, &pool, &reqs[i], 8 * (uint32_t)i, (uint32_t)i, 400 + (uint64_t)i);
        /* only the blocks of prompt + its first decoded position */
        epd_decode_seq_init(&reqs[i].seq, 1, (reqs[i].n_prompt + 1 + bt - 1) / bt);
    }
    assert_int_equal(epd_decode_batch_create(engine, &pool, 4, 8, on_wake, NULL, &b), EPD_OK);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(epd_decode_batch_submit(b, &reqs[i].seq), EPD_OK);
    }
    end = epd_time_now_ns() + 30 * EPD_NSEC_PER_SEC;
    while (left > 0) {
        epd_decode_seq_t *seq;
        int final;

        assert_true(epd_time_now_ns() < end);
        for (int i = 0; i < 4; i++) {
            breq_t *r = &reqs[i];
            uint32_t n = atomic_load(&r->seq.n_produced);
            uint32_t need = (r->n_prompt + n + bt - 1) / bt;
            uint32_t have = epd_decode_seq_blocks(&r->seq);

            /* never past its blocks: the KV of position n_prompt + n - 2
             * (the last step's) lies inside them */
            assert_true(r->n_prompt + n - 1 <= have * bt);
            if (!r->done && n < r->n_expect && need > have) {
                epd_decode_seq_grow(&r->seq, have + 1); /* one block, lazily */
                epd_decode_batch_kick(b);
            }
        }
        seq = epd_decode_batch_poll(b, &final);
        if (seq == NULL) {
            epd_time_sleep_ns(200 * EPD_NSEC_PER_USEC);
            continue;
        }
        for (int i = 0; i < 4; i++) {
            if (&reqs[i].seq == seq) {
                reqs[i].seen = atomic_load(&seq->n_produced);
                if (final) {
                    assert_false(reqs[i].done);
                    reqs[i].done = 1;
                    left--;
                }
            }
        }
    }
    for (int i = 0; i < 4; i++) {
        breq_t *r = &reqs[i];

        assert_int_equal(r->seen, r->n_expect);
        assert_memory_equal(r->tokens, r->expect, r->n_expect * sizeof(int32_t));
        assert_int_equal(atomic_load(&r->seq.finish), r->expect_finish);
    }
    epd_decode_batch_destroy(b);
    epd_free(pool.base);
    epd_engine_close(engine);
}

/* A sequence with nothing left to generate (max_tokens 1) leaves at once
 * with FINISH_LENGTH and its single token, never writing past tokens[]. */
static void test_no_room_left(void **state)
{
    static breq_t reqs[1];
    epd_engine_config_t cfg = {.model_dir = model_dir, .max_batch = 2};
    epd_engine_t *engine;
    epd_decode_batch_t *b;
    epd_kv_pool_t pool;

    (void)state;
    assert_int_equal(epd_engine_open("ref", &cfg, &engine), EPD_OK);
    make_reqs(reqs, 1);
    reqs[0].max_tokens = 1;
    epd_test_pool(engine, 8, 1, &pool);
    disagg_prefill(engine, &pool, &reqs[0], 0, 0, 300);
    reqs[0].tokens[1] = 0x5a5a;
    assert_int_equal(epd_decode_batch_create(engine, &pool, 2, 2, on_wake, NULL, &b), EPD_OK);
    assert_int_equal(epd_decode_batch_submit(b, &reqs[0].seq), EPD_OK);
    drain(b, reqs, 1);
    assert_int_equal(atomic_load(&reqs[0].seq.finish), EPD_DECODE_FINISH_LENGTH);
    assert_int_equal(reqs[0].seen, 1);
    assert_int_equal(reqs[0].tokens[1], 0x5a5a);
    epd_decode_batch_destroy(b);
    epd_free(pool.base);
    epd_engine_close(engine);
}

static void test_create_refuses(void **state)
{
    epd_engine_config_t cfg = {.model_dir = model_dir, .max_batch = 2};
    epd_engine_t *engine;
    epd_decode_batch_t *b;
    epd_kv_pool_t pool;

    (void)state;
    assert_int_equal(epd_engine_open("ref", &cfg, &engine), EPD_OK);
    epd_test_pool(engine, 4, 1, &pool);
    assert_int_equal(epd_decode_batch_create(engine, &pool, 3, 4, on_wake, NULL, &b),
                     EPD_ERR_INVALID_PARAM); /* above the engine's max_batch */
    assert_int_equal(epd_decode_batch_create(engine, &pool, 0, 4, on_wake, NULL, &b),
                     EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_decode_batch_create(engine, &pool, 2, 0, on_wake, NULL, &b),
                     EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_decode_batch_create(engine, &pool, 2, 4, on_wake, NULL, &b), EPD_OK);
    epd_decode_batch_destroy(b);
    epd_decode_batch_destroy(NULL);
    epd_free(pool.base);
    epd_engine_close(engine);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_equals_colocated),
        cmocka_unit_test(test_abort_leaves_at_step_boundary),
        cmocka_unit_test(test_grows_on_demand),
        cmocka_unit_test(test_no_room_left),
        cmocka_unit_test(test_create_refuses),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
