/*
 * epd_itest_poison.c — `epd-itest-poison --prefill ADDR --decode ADDR
 * --model DIR --image A --other B`: a request-plane client that lies about
 * an image's content hash, as a member of the cluster could, and checks that
 * the prefill worker's embedding cache cannot be poisoned with it.
 *
 *   1. A's bytes inline, named by B's BLAKE2b-256: refused (EPD_ERR_CORRUPT,
 *      the message says the hash is not the bytes'), nothing cached;
 *   2. B's hash alone (no bytes, no encoder: "from the cache"): not cached,
 *      so EPD_ERR_NOT_FOUND — before the check, B's hash now named A's
 *      embeddings and this request was served with them;
 *   3. A's bytes inline under A's own hash: served;
 *   4. A's hash alone: a cache hit, the same tokens as 3.
 * Prints one line per case; exit 0 when every expectation held.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_client.h"
#include "epd_config.h"
#include "epd_engine.h"
#include "epd_hash.h"
#include "epd_log.h"
#include "epd_time.h"

/* UCX and libfabric keep process-wide allocations until exit (not epd's). */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libucs.so\nleak:libucp.so\nleak:libuct.so\nleak:libucm.so\n"
           "leak:libfabric.so\nleak:librdmacm.so\nleak:libibverbs.so\n";
}

#define MAX_TOK 512
#define MAX_OUT 16

typedef struct {
    int done;
    int kind; /* EPD_CLIENT_EV_* of the terminal event */
    epd_status_t status;
    char message[256];
    uint32_t tokens[MAX_OUT];
    uint32_t n;
} outcome_t;

static void on_event(void *arg, const epd_client_event_t *ev)
{
    outcome_t *o = ev->user;

    (void)arg;
    if (ev->kind == EPD_CLIENT_EV_TOKENS) {
        for (uint32_t i = 0; i < ev->n_tokens && ev->index + i < MAX_OUT; i++) {
            o->tokens[ev->index + i] = ev->tokens[i];
            if (ev->index + i + 1 > o->n) {
                o->n = ev->index + i + 1;
            }
        }
    }
    if (ev->terminal) {
        o->done = 1;
        o->kind = ev->kind;
        o->status = ev->status;
        snprintf(o->message, sizeof(o->message), "%s", ev->message != NULL ? ev->message : "");
    }
}

static unsigned char *read_file(const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf;
    long n;

    if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) <= 0) {
        if (f != NULL) {
            fclose(f);
        }
        return NULL;
    }
    rewind(f);
    buf = epd_malloc((size_t)n);
    if (buf != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        epd_free(buf);
        buf = NULL;
    }
    fclose(f);
    *len_p = (size_t)n;
    return buf;
}

/* Submits one request with one image and waits for its end (10 s). */
static int run_one(epd_client_t *c, epd_client_worker_t *pw, epd_client_worker_t *dw,
                   const uint32_t *prompt, uint32_t n_prompt, uint32_t pos, uint32_t n_emb,
                   const void *image, size_t image_len, const unsigned char *hash, outcome_t *o)
{
    epd_client_media_t m;
    epd_client_request_t q;
    uint64_t id;
    uint64_t end;

    memset(o, 0, sizeof(*o));
    memset(&m, 0, sizeof(m));
    m.image = image;
    m.image_len = image_len;
    m.hash = hash;
    m.pos = pos;
    m.n = n_emb;
    m.inline_data = image != NULL;
    memset(&q, 0, sizeof(q));
    q.prompt = prompt;
    q.n_prompt = n_prompt;
    q.max_tokens = 8;
    q.top_p = 1.0f;
    q.prefill = pw;
    q.decode = dw;
    q.deadline_ms = 20000;
    q.user = o;
    q.media = &m;
    q.n_media = 1;
    if (epd_client_submit(c, &q, &id) != EPD_OK) {
        fprintf(stderr, "poison: submit failed\n");
        return -1;
    }
    end = epd_time_now_ns() + 20 * EPD_NSEC_PER_SEC;
    while (!o->done && epd_time_now_ns() < end) {
        epd_client_poll(c, 5);
    }
    return o->done ? 0 : -1;
}

int main(int argc, char **argv)
{
    struct {
        const char *prefill, *decode, *model, *image, *other;
    } a = {NULL, NULL, NULL, NULL, NULL};
    const epd_opt_t opts[] = {
        {"prefill", EPD_OPT_STRING, &a.prefill, 0, 0, "the prefill worker's control address"},
        {"decode", EPD_OPT_STRING, &a.decode, 0, 0, "the decode worker's control address"},
        {"model", EPD_OPT_STRING, &a.model, 0, 0, "the model folder (its tokenizer)"},
        {"image", EPD_OPT_STRING, &a.image, 0, 0, "image A"},
        {"other", EPD_OPT_STRING, &a.other, 0, 0, "image B (only its hash is used)"},
    };
    epd_opts_t o = {.prog = "epd-itest-poison",
                    .summary = "a client lying about an image's content hash",
                    .opts = opts,
                    .n_opts = sizeof(opts) / sizeof(opts[0])};
    unsigned char hash_a[EPD_CONTENT_HASH_BYTES], hash_b[EPD_CONTENT_HASH_BYTES];
    epd_engine_config_t ecfg = {0};
    epd_client_config_t cc;
    epd_client_worker_t *pw, *dw;
    epd_client_t *c = NULL;
    epd_engine_t *engine = NULL;
    const epd_engine_info_t *info;
    unsigned char *img_a = NULL, *img_b = NULL;
    size_t len_a = 0, len_b = 0;
    int32_t toks[MAX_TOK];
    uint32_t prompt[MAX_TOK];
    size_t n_tok = 0;
    uint32_t pos = 0;
    static const char text[] = "Look: <|image|> now.";
    outcome_t r1, r2, r3, r4;
    int argi, bad = 0;

    if (epd_opts_parse(&o, argc, argv, &argi) != EPD_OK || a.prefill == NULL ||
        a.decode == NULL || a.model == NULL || a.image == NULL || a.other == NULL) {
        fprintf(stderr, "usage: epd-itest-poison --prefill A --decode A --model D --image F "
                        "--other F\n");
        return 2;
    }
    ecfg.model_dir = a.model;
    ecfg.max_batch = 1;
    img_a = read_file(a.image, &len_a);
    img_b = read_file(a.other, &len_b);
    if (img_a == NULL || img_b == NULL || epd_engine_open("ref", &ecfg, &engine) != EPD_OK) {
        fprintf(stderr, "poison: cannot read the images or open the model\n");
        return 2;
    }
    info = epd_engine_info(engine);
    epd_content_hash(img_a, len_a, hash_a);
    epd_content_hash(img_b, len_b, hash_b);
    if (epd_engine_tokenize_images(engine, text, sizeof(text) - 1, 1, toks, MAX_TOK, &n_tok,
                                   &pos) != EPD_OK) {
        fprintf(stderr, "poison: cannot tokenize\n");
        return 2;
    }
    for (size_t i = 0; i < n_tok; i++) {
        prompt[i] = (uint32_t)toks[i];
    }
    epd_client_config_init(&cc);
    cc.event_cb = on_event;
    cc.max_msg_size = (size_t)16 << 20;
    if (epd_client_create(&cc, &c) != EPD_OK || epd_client_add_worker(c, a.prefill, &pw) != EPD_OK ||
        epd_client_add_worker(c, a.decode, &dw) != EPD_OK) {
        fprintf(stderr, "poison: cannot reach the workers\n");
        return 2;
    }

    /* 1. a lie: A's bytes named by B's hash */
    if (run_one(c, pw, dw, prompt, (uint32_t)n_tok, pos, info->image_embeddings, img_a, len_a, hash_b,
                &r1) != 0) {
        return 1;
    }
    printf("poison: A's bytes under B's hash: %s %s (%s)\n",
           r1.kind == EPD_CLIENT_EV_ERROR ? "error" : "tokens", epd_status_name(r1.status),
           r1.message);
    if (r1.kind != EPD_CLIENT_EV_ERROR || r1.status != EPD_ERR_CORRUPT ||
        strstr(r1.message, "content_hash") == NULL) {
        bad = 1;
    }
    /* 2. B's hash from the cache: nothing may be there */
    if (run_one(c, pw, dw, prompt, (uint32_t)n_tok, pos, info->image_embeddings, NULL, 0, hash_b, &r2) != 0) {
        return 1;
    }
    printf("poison: B's hash from the cache: %s %s (%s)\n",
           r2.kind == EPD_CLIENT_EV_ERROR ? "error" : "tokens", epd_status_name(r2.status),
           r2.message);
    if (r2.kind != EPD_CLIENT_EV_ERROR || r2.status != EPD_ERR_NOT_FOUND) {
        bad = 1;
    }
    /* 3. the truth, then 4. its cache hit: the same answer */
    if (run_one(c, pw, dw, prompt, (uint32_t)n_tok, pos, info->image_embeddings, img_a, len_a, hash_a,
                &r3) != 0 ||
        run_one(c, pw, dw, prompt, (uint32_t)n_tok, pos, info->image_embeddings, NULL, 0, hash_a, &r4) != 0) {
        return 1;
    }
    printf("poison: A under its own hash: %u tokens; again from the cache: %u tokens\n", r3.n,
           r4.n);
    if (r3.kind != EPD_CLIENT_EV_TOKENS || r4.kind != EPD_CLIENT_EV_TOKENS || r3.n == 0 ||
        r3.n != r4.n || memcmp(r3.tokens, r4.tokens, r3.n * sizeof(uint32_t)) != 0) {
        bad = 1;
    }
    epd_client_destroy(c);
    epd_engine_close(engine);
    epd_free(img_a);
    epd_free(img_b);
    epd_opts_cleanup(&o);
    printf("poison: %s\n", bad ? "FAILED" : "ok");
    return bad;
}
