/*
 * Tests of encoder/epd_encoder_compute.c, the encoder's compute thread, on
 * a real libuv loop and the ref engine's tiny vision model:
 *   - jobs come back in FIFO order, each once, on the loop thread; a good
 *     image's output equals epd_image_decode + epd_engine_encode_image run
 *     here, with the xxh3 checksum of those bytes;
 *   - a content hash of other bytes: EPD_ERR_INVALID_PARAM with bad_hash,
 *     the output untouched; a corrupt image EPD_ERR_MALFORMED, a non-image
 *     EPD_ERR_UNSUPPORTED, a header over the pixel guard EPD_ERR_TOO_LONG
 *     with the declared size;
 *   - a job canceled before it starts comes back EPD_ERR_CANCELED without
 *     touching its output;
 *   - the backlog counts jobs submitted and not started;
 *   - destroy with jobs still queued returns (they never come back) and
 *     leaks nothing;
 *   - an image of exactly max_pixels is encoded, one pixel more refused,
 *     and each size refusal's text names the limit the image is over.
 */
#include "epd_test.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_encoder_compute.h"
#include "epd_hash.h"
#include "epd_image.h"
#include "epd_test_engine_util.h"
#include "epd_time.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#define STBI_WRITE_NO_STDIO
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop

#define N_JOBS 6

typedef struct {
    unsigned char *data;
    size_t len, cap;
} blob_t;

typedef struct {
    const char *dir;
    epd_engine_t *engine; /* the compute thread's (taken by create) */
    epd_engine_t *ref;    /* this thread's reference */
    size_t out_bytes;
    uv_loop_t loop;
    epd_encoder_job_t *order[N_JOBS]; /* as they came back */
    int n_back;
    pthread_t loop_thread;
} ctx_t;

static ctx_t *c;

static void blob_put(void *ctx, void *data, int size)
{
    blob_t *b = ctx;

    if (size <= 0) {
        return;
    }
    if (b->len + (size_t)size > b->cap) {
        b->cap = (b->len + (size_t)size) * 2 + 64;
        b->data = realloc(b->data, b->cap);
        assert_non_null(b->data);
    }
    memcpy(b->data + b->len, data, (size_t)size);
    b->len += (size_t)size;
}

static blob_t make_png(int w, int h, int seed)
{
    unsigned char *px = malloc((size_t)w * h * 3);
    blob_t b = {0};

    assert_non_null(px);
    for (int i = 0; i < w * h * 3; i++) {
        px[i] = (unsigned char)((i * 7 + seed * 13 + (i / (w * 3)) * 5) & 0xff);
    }
    assert_true(stbi_write_png_to_func(blob_put, &b, w, h, 3, px, w * 3) != 0);
    free(px);
    return b;
}

static void on_job(void *arg, epd_encoder_job_t *job)
{
    ctx_t *x = arg;

    assert_true(x->n_back < N_JOBS);
    x->order[x->n_back++] = job;
}

static void job_init(epd_encoder_job_t *j, const blob_t *img, const unsigned char *hash, float *out,
                     uint64_t id)
{
    memset(j, 0, sizeof(*j));
    j->image = img->data;
    j->image_len = img->len;
    j->content_hash = hash;
    j->max_pixels = EPD_IMAGE_MAX_PIXELS_DEFAULT;
    j->out = out;
    j->out_bytes = c->out_bytes;
    j->req_id = id;
    j->owner = j;
    atomic_init(&j->cancel, 0);
}

/* Runs the loop until n jobs came back (bounded). */
static void run_until(int n)
{
    uint64_t end = epd_time_now_ns() + 30 * EPD_NSEC_PER_SEC;

    while (c->n_back < n && epd_time_now_ns() < end) {
        uv_run(&c->loop, UV_RUN_NOWAIT);
        epd_time_sleep_ns(200 * EPD_NSEC_PER_USEC);
    }
    assert_int_equal(c->n_back, n);
}

static int setup(void **state)
{
    epd_mkmodel_params_t p;
    epd_engine_config_t cfg;
    const char *model;
    const epd_engine_info_t *info;

    c = epd_calloc(1, sizeof(*c));
    c->dir = epd_test_tmpdir();
    epd_test_tiny_vision_params(&p);
    model = epd_test_write_model(c->dir, "tinyv", &p);
    memset(&cfg, 0, sizeof(cfg));
    cfg.model_dir = model;
    assert_int_equal(epd_engine_open("ref", &cfg, &c->engine), EPD_OK);
    assert_int_equal(epd_engine_open("ref", &cfg, &c->ref), EPD_OK);
    info = epd_engine_info(c->ref);
    c->out_bytes = (size_t)info->image_embeddings * info->embed_dim * sizeof(float);
    assert_int_equal(uv_loop_init(&c->loop), 0);
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    uv_run(&c->loop, UV_RUN_DEFAULT); /* the closed async handle */
    assert_int_equal(uv_loop_close(&c->loop), 0);
    epd_engine_close(c->engine);
    epd_engine_close(c->ref);
    epd_test_rmtree(c->dir);
    epd_free(c);
    return 0;
}

static void test_fifo_results_cancel(void **state)
{
    static const char text[] = "plain text, not a picture";
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
    epd_encoder_compute_t *comp;
    epd_encoder_job_t jobs[N_JOBS];
    unsigned char hash[N_JOBS][EPD_CONTENT_HASH_BYTES];
    blob_t img[N_JOBS];
    float *out[N_JOBS], *ref;
    epd_image_t im;
    epd_image_view_t view;

    (void)state;
    img[0] = make_png(40, 30, 1);
    img[1] = make_png(17, 23, 2); /* hash of other bytes below */
    img[2] = make_png(20, 20, 3); /* truncated below */
    img[3] = (blob_t){(unsigned char *)strdup(text), sizeof(text) - 1, 0};
    img[4] = make_png(8, 8, 4);  /* header says 60000 x 60000 */
    img[5] = make_png(33, 9, 5); /* canceled before it starts */
    img[2].len /= 2;
    assert_memory_equal(img[4].data, sig, 8);
    /* IHDR width/height at 16..23: the CRC is not checked by the probe, and
     * the pixel guard refuses before any pixel is read */
    img[4].data[16] = 0;
    img[4].data[17] = 0;
    img[4].data[18] = 0xea;
    img[4].data[19] = 0x60;
    memcpy(img[4].data + 20, img[4].data + 16, 4);
    for (int i = 0; i < N_JOBS; i++) {
        epd_content_hash(img[i].data, img[i].len, hash[i]);
        out[i] = epd_calloc(1, c->out_bytes);
        job_init(&jobs[i], &img[i], hash[i], out[i], 100 + (uint64_t)i);
    }
    hash[1][0] ^= 0x80;
    atomic_store(&jobs[5].cancel, 1);

    assert_int_equal(epd_encoder_compute_create(&c->loop, c->engine, N_JOBS, on_job, c, &comp),
                     EPD_OK);
    c->engine = NULL; /* taken */
    for (int i = 0; i < N_JOBS; i++) {
        assert_int_equal(epd_encoder_compute_submit(comp, &jobs[i]), EPD_OK);
    }
    assert_true(epd_encoder_compute_backlog(comp) <= N_JOBS);
    run_until(N_JOBS);
    assert_int_equal(epd_encoder_compute_backlog(comp), 0);
    for (int i = 0; i < N_JOBS; i++) {
        assert_ptr_equal(c->order[i], &jobs[i]); /* FIFO */
    }
    /* the good one: equal to the colocated path, with its checksum */
    assert_int_equal(jobs[0].status, EPD_OK);
    ref = epd_malloc(c->out_bytes);
    assert_int_equal(epd_image_decode(img[0].data, img[0].len, 0, &im), EPD_OK);
    view = epd_image_view(&im);
    assert_int_equal(epd_engine_encode_image(c->ref, &view, ref), EPD_OK);
    epd_image_cleanup(&im);
    assert_memory_equal(out[0], ref, c->out_bytes);
    assert_int_equal(jobs[0].checksum, epd_hash64(ref, c->out_bytes, 0));
    assert_int_equal(jobs[0].width, 40);
    assert_int_equal(jobs[0].height, 30);
    assert_int_equal(jobs[0].format, EPD_IMAGE_PNG);
    assert_true(jobs[0].started_ns <= jobs[0].decoded_ns &&
                jobs[0].decoded_ns <= jobs[0].finished_ns);
    epd_free(ref);
    /* the refusals */
    assert_int_equal(jobs[1].status, EPD_ERR_INVALID_PARAM);
    assert_true(jobs[1].bad_hash);
    assert_int_equal(jobs[2].status, EPD_ERR_MALFORMED);
    assert_false(jobs[2].bad_hash);
    assert_int_equal(jobs[2].format, EPD_IMAGE_PNG);
    assert_int_equal(jobs[3].status, EPD_ERR_UNSUPPORTED);
    assert_int_equal(jobs[3].format, 0);
    assert_int_equal(jobs[4].status, EPD_ERR_TOO_LONG);
    assert_int_equal(jobs[4].width, 60000);
    assert_int_equal(jobs[4].height, 60000);
    assert_int_equal(jobs[5].status, EPD_ERR_CANCELED);
    for (int i = 1; i < N_JOBS; i++) {
        for (size_t b = 0; b < c->out_bytes / sizeof(float); b++) {
            assert_true(out[i][b] == 0.0f); /* nothing written */
        }
    }
    epd_encoder_compute_destroy(comp);
    for (int i = 0; i < N_JOBS; i++) {
        free(img[i].data);
        epd_free(out[i]);
    }
}

/* Destroy with a backlog: returns after the running job, the rest never
 * come back, the engine is closed (LeakSanitizer checks the rest). */
static void test_destroy_with_backlog(void **state)
{
    epd_mkmodel_params_t p;
    epd_engine_config_t cfg;
    epd_encoder_compute_t *comp;
    epd_encoder_job_t jobs[N_JOBS];
    unsigned char hash[EPD_CONTENT_HASH_BYTES];
    blob_t img = make_png(64, 64, 9);
    float *out = epd_calloc(N_JOBS, c->out_bytes);
    const char *model;

    (void)state;
    epd_test_tiny_vision_params(&p);
    model = epd_test_write_model(c->dir, "tinyv2", &p);
    memset(&cfg, 0, sizeof(cfg));
    cfg.model_dir = model;
    assert_int_equal(epd_engine_open("ref", &cfg, &c->engine), EPD_OK);
    epd_content_hash(img.data, img.len, hash);
    c->n_back = 0;
    assert_int_equal(epd_encoder_compute_create(&c->loop, c->engine, N_JOBS, on_job, c, &comp),
                     EPD_OK);
    c->engine = NULL;
    for (int i = 0; i < N_JOBS; i++) {
        job_init(&jobs[i], &img, hash, out + (size_t)i * (c->out_bytes / sizeof(float)),
                 (uint64_t)i);
        assert_int_equal(epd_encoder_compute_submit(comp, &jobs[i]), EPD_OK);
    }
    epd_encoder_compute_destroy(comp);
    uv_run(&c->loop, UV_RUN_NOWAIT);
    assert_int_equal(c->n_back, 0); /* no callback after destroy */
    free(img.data);
    epd_free(out);
}

/* The pixel limit is inclusive, and a size refusal's Error text names the
 * limit the image is over, never one it is within. */
static void test_pixel_limit_and_messages(void **state)
{
    epd_mkmodel_params_t p;
    epd_engine_config_t cfg;
    epd_encoder_compute_t *comp;
    epd_encoder_job_t jobs[2];
    unsigned char hash[EPD_CONTENT_HASH_BYTES];
    blob_t img = make_png(40, 30, 11);
    float *out = epd_calloc(2, c->out_bytes);
    const char *model;
    char msg[200];

    (void)state;
    epd_test_tiny_vision_params(&p);
    model = epd_test_write_model(c->dir, "tinyv3", &p);
    memset(&cfg, 0, sizeof(cfg));
    cfg.model_dir = model;
    assert_int_equal(epd_engine_open("ref", &cfg, &c->engine), EPD_OK);
    epd_content_hash(img.data, img.len, hash);
    c->n_back = 0;
    assert_int_equal(epd_encoder_compute_create(&c->loop, c->engine, 2, on_job, c, &comp), EPD_OK);
    c->engine = NULL;
    for (int i = 0; i < 2; i++) {
        job_init(&jobs[i], &img, hash, out + (size_t)i * (c->out_bytes / sizeof(float)),
                 200 + (uint64_t)i);
        jobs[i].max_pixels = 40 * 30 - (uint64_t)i; /* exactly at, then one under */
        assert_int_equal(epd_encoder_compute_submit(comp, &jobs[i]), EPD_OK);
    }
    run_until(2);
    assert_int_equal(jobs[0].status, EPD_OK);
    assert_int_equal(jobs[1].status, EPD_ERR_TOO_LONG);
    epd_encoder_job_describe(&jobs[1], jobs[1].max_pixels, msg, sizeof(msg));
    assert_string_equal(msg, "PNG image of 40 x 30 pixels exceeds the limit of 1199 pixels");
    epd_encoder_compute_destroy(comp);
    uv_run(&c->loop, UV_RUN_NOWAIT);
    /* a side over EPD_IMAGE_MAX_SIDE within the pixel limit: the side is
     * named, not the pixel limit it is within */
    jobs[1].width = EPD_IMAGE_MAX_SIDE + 1;
    jobs[1].height = 1;
    epd_encoder_job_describe(&jobs[1], 0, msg, sizeof(msg));
    assert_string_equal(msg,
                        "PNG image of 65501 x 1 pixels: a side exceeds the limit of 65500 pixels");
    /* more bytes than the decoder reads (no header looked at: no size) */
    jobs[1].width = jobs[1].height = 0;
    jobs[1].format = 0;
    jobs[1].image_len = (size_t)EPD_IMAGE_MAX_BYTES + 1;
    epd_encoder_job_describe(&jobs[1], 0, msg, sizeof(msg));
    assert_non_null(strstr(msg, "bytes exceeds the decoder's limit of 2147483647 bytes"));
    free(img.data);
    epd_free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo_results_cancel),
        cmocka_unit_test(test_destroy_with_backlog),
        cmocka_unit_test(test_pixel_limit_and_messages),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/* gcc checks for static functions declared but never defined (the HDR
 * writer of stb_image_write, compiled out) at the end of the file. */
#pragma GCC diagnostic ignored "-Wunused-function"
