/*
 * epd_itest_stall.c — `epd-itest-stall kv|embed ...`: a writer stalled
 * (SIGSTOP) in the middle of its one-sided writes, declared dead by the
 * worker whose memory it writes, and continued (SIGCONT) once that memory
 * may have gone to another request: the fence tests (proto/README.md rule
 * 25 and on).  Run by test_fence_*.sh, which starts the daemons with the
 * fault point that stops the writer at the worst moment and makes it, once
 * continued, post its remaining writes before it hears anything of its
 * peers (common/epd_fault.h).
 *
 *   kv --decode ADDR --prefill-a ADDR --prefill-a-pid PID --prefill-b ADDR --model DIR
 *       Request A goes through prefill A (EPD_FAULT_POINTS=
 *       prefill.pause_after_layer=0: it stops after its first layer's
 *       writes).  Once it is stopped and A has ended (decode declared it
 *       dead: short --peer-timeout-ms), request B goes through prefill B
 *       into the same decode worker, whose pool (--kv-blocks, one state
 *       slot) holds one such request: B can only get A's blocks and slot.
 *       B is retried while decode refuses it for capacity.  As soon as B
 *       streams its first token — or, if decode keeps A's blocks
 *       quarantined, after a while — prefill A is continued: it writes
 *       A's remaining layers into what were A's blocks.  B must then
 *       finish with exactly its colocated tokens; two more requests (one
 *       through each prefill) too; decode's pool must come back to full.
 *
 *   embed --decode ADDR --prefill ADDR --encoder-a ADDR --encoder-a-pid PID
 *         --encoder-b ADDR --model DIR --image-a PNG --image-b PNG
 *       Request A's image goes to encoder A (EPD_FAULT_POINTS=
 *       encoder.pause_before_write=1: it stops with the embeddings and the
 *       reservation in hand).  The prefill worker has one embedding slot.
 *       Once A has ended (prefill declared the encoder dead), request B's
 *       image goes to encoder B: into the same slot, which then caches it.
 *       Encoder A is continued and writes A's embeddings into that slot.
 *       Request C sends B's image again without an encoder (a cache hit:
 *       the prefill worker reads the slot).  B and C must equal their
 *       colocated tokens (C is B's request again).
 *
 * On the code before the fence, A's late writes land in B's KV (or B's
 * cached embeddings) and B or C differ.  Prints what happened; exit 0 when
 * every expectation held.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include <sodium.h>

#include "epd_alloc.h"
#include "epd_client.h"
#include "epd_config.h"
#include "epd_engine.h"
#include "epd_image.h"
#include "epd_itest_colo.h"
#include "epd_itest_status.h"
#include "epd_log.h"
#include "epd_msg.h"
#include "epd_rpc.h"
#include "epd_secret.h"
#include "epd_time.h"

/* UCX and libfabric keep process-wide allocations until exit (not epd's). */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libucs.so\nleak:libucp.so\nleak:libuct.so\nleak:libucm.so\n"
           "leak:libfabric.so\nleak:librdmacm.so\nleak:libibverbs.so\n";
}

#define ST_MAX_TOKENS 4096
#define ST_MAX_PROMPT 4096

typedef struct {
    /* arguments */
    const char *mode;
    const char *decode, *prefill_a, *prefill_b, *encoder_a, *encoder_b;
    int64_t stalled_pid;
    const char *model, *transport, *provider, *secret_file;
    const char *image_a, *image_b;
    int64_t peer_timeout_ms;
    int64_t timeout_s;
    int64_t kv_tokens; /* kv: prompt + max_tokens of A and of B (the decode pool) */
} st_args_t;

typedef struct {
    const char *name;
    uint64_t id;
    int32_t prompt[ST_MAX_PROMPT];
    uint32_t n_prompt;
    uint32_t max_tokens;
    epd_sample_params_t sp;
    int32_t want[ST_MAX_TOKENS];
    uint32_t n_want;
    uint32_t got[ST_MAX_TOKENS];
    uint32_t n_got;
    int live;  /* submitted, no terminal event yet */
    int ended; /* terminal events seen */
    epd_client_ev_kind_t end_kind;
    int finish;
    epd_status_t status;
    char message[200];
    char from[64];
    uint64_t t_first_ns;
    /* images: one, through `encoder` (NULL: cached at the prefill worker) */
    epd_client_media_t media;
    uint32_t n_media;
} st_req_t;

typedef struct {
    const st_args_t *a;
    epd_client_t *client;
    epd_engine_t *engine;
    const epd_engine_info_t *info;
    int continued;          /* the stalled writer got SIGCONT */
    uint64_t continued_ns;
    st_req_t *cont_on_first; /* SIGCONT as this request's first token arrives */
    int bad;
} st_t;

static st_t S;

static void st_continue(const char *why)
{
    if (S.continued) {
        return;
    }
    S.continued = 1;
    S.continued_ns = epd_time_now_ns();
    if (kill((pid_t)S.a->stalled_pid, SIGCONT) != 0) {
        fprintf(stderr, "stall: SIGCONT to %lld: %s\n", (long long)S.a->stalled_pid,
                strerror(errno));
        S.bad = 1;
    }
    printf("stall: writer %lld continued (%s)\n", (long long)S.a->stalled_pid, why);
    fflush(stdout);
}

static void on_event(void *arg, const epd_client_event_t *ev)
{
    st_req_t *r = ev->user;

    (void)arg;
    if (r->ended > 0) {
        r->ended++;
        return;
    }
    if (ev->kind == EPD_CLIENT_EV_TOKENS) {
        for (uint32_t i = 0; i < ev->n_tokens && ev->index + i < ST_MAX_TOKENS; i++) {
            r->got[ev->index + i] = ev->tokens[i];
        }
        if (ev->index + ev->n_tokens > r->n_got) {
            r->n_got = ev->index + ev->n_tokens;
        }
        if (r->t_first_ns == 0) {
            r->t_first_ns = epd_time_now_ns();
            if (S.cont_on_first == r && !ev->terminal) {
                st_continue("request B streams: its KV is verified and in use");
            }
        }
    }
    if (ev->terminal) {
        r->ended = 1;
        r->live = 0;
        r->end_kind = ev->kind;
        r->finish = ev->finish;
        r->status = ev->status;
        snprintf(r->message, sizeof(r->message), "%s", ev->message);
        snprintf(r->from, sizeof(r->from), "%s", ev->from);
    }
}

/* 'T' when process `pid` is stopped, '?' when it cannot be read. */
static char st_proc_state(int64_t pid)
{
    char path[64], buf[512];
    FILE *f;
    char *p;
    size_t n;

    snprintf(path, sizeof(path), "/proc/%lld/stat", (long long)pid);
    f = fopen(path, "r");
    if (f == NULL) {
        return '?';
    }
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    p = strrchr(buf, ')');
    return p != NULL && p[1] == ' ' ? p[2] : '?';
}

static void st_poll_ms(int ms)
{
    uint64_t end = epd_time_now_ns() + (uint64_t)ms * EPD_NSEC_PER_MSEC;

    while (epd_time_now_ns() < end) {
        epd_client_poll(S.client, 5);
    }
}

static int st_submit(st_req_t *r, epd_client_worker_t *p, epd_client_worker_t *d)
{
    epd_client_request_t q;
    uint32_t prompt[ST_MAX_PROMPT];
    epd_status_t st;

    for (uint32_t i = 0; i < r->n_prompt; i++) {
        prompt[i] = (uint32_t)r->prompt[i];
    }
    memset(&q, 0, sizeof(q));
    q.prompt = prompt;
    q.n_prompt = r->n_prompt;
    q.temperature = r->sp.temperature;
    q.top_p = r->sp.top_p;
    q.top_k = r->sp.top_k;
    q.seed = r->sp.seed;
    q.max_tokens = r->max_tokens;
    q.prefill = p;
    q.decode = d;
    q.deadline_ms = 60000;
    q.user = r;
    q.media = r->n_media > 0 ? &r->media : NULL;
    q.n_media = r->n_media;
    r->ended = 0;
    r->n_got = 0;
    r->t_first_ns = 0;
    for (int tries = 0;; tries++) {
        st = epd_client_submit(S.client, &q, &r->id);
        if (st != EPD_ERR_NO_RESOURCE || tries > 10000) {
            break;
        }
        epd_client_poll(S.client, 1);
    }
    if (st != EPD_OK) {
        fprintf(stderr, "stall: submitting request %s: %s\n", r->name, epd_status_string(st));
        return -1;
    }
    r->live = 1;
    return 0;
}

/* Waits for r's terminal event (polling); -1 after the test's time. */
static int st_wait_end(st_req_t *r, uint64_t until)
{
    while (r->ended == 0 && epd_time_now_ns() < until) {
        epd_client_poll(S.client, 5);
    }
    return r->ended > 0 ? 0 : -1;
}

static const char *st_outcome(const st_req_t *r, char *buf, size_t cap)
{
    if (r->end_kind == EPD_CLIENT_EV_TOKENS) {
        snprintf(buf, cap, "finish %s after %u tokens", epd_client_finish_name(r->finish),
                 r->n_got);
    } else {
        snprintf(buf, cap, "%s %s from %s: %s",
                 r->end_kind == EPD_CLIENT_EV_REFUSED ? "refused" : "error",
                 epd_status_name(r->status), r->from, r->message);
    }
    return buf;
}

/* Did r finish with exactly its colocated tokens? */
static int st_equal(const st_req_t *r)
{
    char buf[300];
    uint32_t diff = UINT32_MAX;

    if (r->end_kind != EPD_CLIENT_EV_TOKENS ||
        (r->finish != EPD_CLIENT_FINISH_LENGTH && r->finish != EPD_CLIENT_FINISH_STOP)) {
        fprintf(stderr, "stall: request %s did not finish: %s\n", r->name,
                st_outcome(r, buf, sizeof(buf)));
        return 0;
    }
    for (uint32_t i = 0; i < r->n_got && i < r->n_want; i++) {
        if ((int32_t)r->got[i] != r->want[i]) {
            diff = i;
            break;
        }
    }
    if (diff == UINT32_MAX && r->n_got == r->n_want) {
        printf("stall: request %s equals its colocated result (%u tokens)\n", r->name, r->n_got);
        return 1;
    }
    fprintf(stderr,
            "stall: request %s differs from its colocated result: %u tokens against %u, first "
            "difference at token %d — the stalled writer's late writes landed in its memory\n",
            r->name, r->n_got, r->n_want, diff == UINT32_MAX ? -1 : (int)diff);
    return 0;
}

/* Submits r until it is not refused for capacity (decode's pool may still
 * hold the stalled writer's blocks, prefill's slot may be quarantined),
 * continuing the stalled writer after `patience_ms` without a start;
 * then waits for its end.  -1 when time ran out. */
static int st_run_retrying(st_req_t *r, epd_client_worker_t *p, epd_client_worker_t *d,
                           uint64_t patience_ms, uint64_t until, int retry_dead)
{
    uint64_t t0 = epd_time_now_ns();
    uint32_t refusals = 0;

    for (;;) {
        if (st_submit(r, p, d) != 0) {
            return -1;
        }
        while (r->ended == 0 && epd_time_now_ns() < until) {
            epd_client_poll(S.client, 5);
            if (!S.continued && r->t_first_ns == 0 &&
                epd_time_now_ns() - t0 > patience_ms * EPD_NSEC_PER_MSEC) {
                st_continue("the stalled writer's memory is still held: continued so that it "
                            "can answer for its writes");
            }
        }
        if (r->ended == 0) {
            return -1;
        }
        if (retry_dead && r->end_kind == EPD_CLIENT_EV_ERROR && r->t_first_ns == 0 &&
            (r->status == EPD_ERR_PEER_DEAD || r->status == EPD_ERR_UNREACHABLE) &&
            retry_dead++ < 4) {
            /* what the router does: a worker that came back may fail the
             * first request bound to its old endpoints */
            printf("stall: request %s failed before its first token (%s): retrying\n", r->name,
                   r->message);
            st_poll_ms(200);
            continue;
        }
        if ((r->end_kind == EPD_CLIENT_EV_REFUSED ||
             (r->end_kind == EPD_CLIENT_EV_ERROR && r->status == EPD_ERR_NO_CAPACITY)) &&
            r->t_first_ns == 0) {
            if (refusals++ == 0) {
                printf("stall: request %s refused for capacity (%s): retrying\n", r->name,
                       r->message);
            }
            st_poll_ms(50);
            continue;
        }
        if (refusals > 0) {
            printf("stall: request %s admitted after %u refusals (%.0f ms)\n", r->name, refusals,
                   (double)(epd_time_now_ns() - t0) / 1e6);
        }
        return 0;
    }
}

/* Decode's free blocks and slots, from its Status (-1: no answer). */
static uint32_t st_quarantined; /* the last Load.quarantined read */

static int st_decode_free(const char *addr, uint32_t *free_p, uint32_t *total_p,
                          uint32_t *sfree_p, uint32_t *stotal_p)
{
    epd_itest_load_t l;

    if (epd_itest_load(addr, &l) != 0) {
        return -1;
    }
    *free_p = l.kv_blocks_free;
    *total_p = l.kv_blocks_total;
    *sfree_p = l.state_slots_free;
    *stotal_p = l.state_slots_total;
    st_quarantined = l.quarantined;
    return 0;
}

static int st_pool_full(const char *addr)
{
    uint32_t fr = 0, tot = 1, sf = 0, stt = 1;
    uint64_t until = epd_time_now_ns() + 30 * EPD_NSEC_PER_SEC;
    int got = -1;

    while (epd_time_now_ns() < until) {
        got = st_decode_free(addr, &fr, &tot, &sf, &stt);
        if (got == 0 && fr == tot && sf == stt) {
            break;
        }
        st_poll_ms(100);
    }
    printf("stall: decode kv_blocks_free %u/%u state_slots_free %u/%u quarantined %u\n", fr, tot,
           sf, stt, st_quarantined);
    if (got != 0 || fr != tot || sf != stt || st_quarantined != 0) {
        fprintf(stderr, "stall: decode's pool did not come back to full (a leaked block)\n");
        return 0;
    }
    return 1;
}

/* A text request of n_prompt tokens (BOS + bytes from `seed`), colocated. */
static int st_make_text(st_req_t *r, const char *name, uint32_t n_prompt, uint32_t max_tokens,
                        uint64_t seed)
{
    char text[ST_MAX_PROMPT];
    size_t n = 0;

    memset(r, 0, sizeof(*r));
    r->name = name;
    for (uint32_t i = 0; i + 1 < n_prompt; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        text[i] = (char)('a' + (seed >> 33) % 26);
    }
    if (epd_engine_tokenize(S.engine, text, n_prompt - 1, 1, r->prompt, ST_MAX_PROMPT, &n) !=
            EPD_OK ||
        n != n_prompt) {
        fprintf(stderr, "stall: tokenizing request %s: %zu tokens, want %u\n", name, n, n_prompt);
        return -1;
    }
    r->n_prompt = n_prompt;
    r->max_tokens = max_tokens;
    epd_sample_params_default(&r->sp);
    r->sp.temperature = 1.0f; /* sampled: any change of the KV shows in the tokens */
    r->sp.seed = seed >> 1;
    if (epd_itest_colocated(S.engine, r->prompt, r->n_prompt, &r->sp, max_tokens, r->want,
                            &r->n_want) != EPD_OK) {
        fprintf(stderr, "stall: colocated generation of %s failed\n", name);
        return -1;
    }
    return 0;
}

static int st_connect(epd_client_worker_t **ws[], const char *const addrs[], int n)
{
    epd_client_config_t cc;
    epd_secret_t secret;
    char why[200];

    memset(&secret, 0, sizeof(secret));
    epd_client_config_init(&cc);
    cc.backend = S.a->transport;
    cc.provider = S.a->provider;
    cc.worker_id = "itest-stall";
    cc.role = EPD_CLIENT_ROLE_ROUTER;
    cc.peer_timeout_ms = (uint32_t)S.a->peer_timeout_ms;
    cc.event_cb = on_event;
    if (S.a->secret_file != NULL) {
        if (epd_secret_load(S.a->secret_file, &secret, why, sizeof(why)) != EPD_OK) {
            fprintf(stderr, "stall: --secret-file: %s\n", why);
            return -1;
        }
        cc.secret = secret.bytes;
        cc.secret_len = secret.len;
    }
    if (epd_client_create(&cc, &S.client) != EPD_OK) {
        fprintf(stderr, "stall: cannot create the client\n");
        return -1;
    }
    epd_secret_wipe(&secret);
    for (int i = 0; i < n; i++) {
        if (epd_client_add_worker(S.client, addrs[i], ws[i]) != EPD_OK) {
            fprintf(stderr, "stall: cannot reach %s\n", addrs[i]);
            return -1;
        }
    }
    return 0;
}

/* Waits until the stalled writer stopped itself at its fault point. */
static int st_wait_stopped(uint64_t until)
{
    while (st_proc_state(S.a->stalled_pid) != 'T') {
        if (epd_time_now_ns() > until) {
            fprintf(stderr, "stall: process %lld never stopped at its fault point (state %c)\n",
                    (long long)S.a->stalled_pid, st_proc_state(S.a->stalled_pid));
            return -1;
        }
        epd_client_poll(S.client, 5);
    }
    printf("stall: writer %lld stopped at its fault point\n", (long long)S.a->stalled_pid);
    return 0;
}

/* ----------------------------------------------------------------- kv */

static int st_kv(void)
{
    const st_args_t *a = S.a;
    epd_client_worker_t *pa = NULL, *pb = NULL, *dw = NULL;
    epd_client_worker_t **ws[] = {&dw, &pa, &pb};
    const char *addrs[] = {a->decode, a->prefill_a, a->prefill_b};
    uint64_t until = epd_time_now_ns() + (uint64_t)a->timeout_s * EPD_NSEC_PER_SEC;
    uint32_t total = (uint32_t)a->kv_tokens;
    static st_req_t A, B, C, D;
    char buf[300];
    uint32_t held = 0;
    int ok = 1;

    /* A: a long prompt (its later layers are many writes); B: a short one
     * and a long generation, both exactly the decode pool */
    if (st_make_text(&A, "A", total * 7 / 8, total - total * 7 / 8, 11) != 0 ||
        st_make_text(&B, "B", total / 8, total - total / 8, 22) != 0 ||
        st_make_text(&C, "C", 40, 24, 33) != 0 || st_make_text(&D, "D", 50, 24, 44) != 0) {
        return 0;
    }
    if (st_connect(ws, addrs, 3) != 0) {
        return 0;
    }
    printf("stall: A %u+%u tokens through prefill A, B %u+%u through prefill B\n", A.n_prompt,
           A.max_tokens, B.n_prompt, B.max_tokens);
    if (st_submit(&A, pa, dw) != 0 || st_wait_stopped(until) != 0) {
        return 0;
    }
    if (st_wait_end(&A, until) != 0) {
        fprintf(stderr, "stall: request A never ended while its prefill worker was stopped\n");
        return 0;
    }
    printf("stall: A ended: %s\n", st_outcome(&A, buf, sizeof(buf)));
    if (A.end_kind == EPD_CLIENT_EV_TOKENS && A.finish != EPD_CLIENT_FINISH_ABORT) {
        fprintf(stderr, "stall: request A finished although its prefill worker is stopped\n");
        ok = 0;
    }
    /* decode may need its peer timeout to retire the stopped incarnation */
    st_poll_ms((int)a->peer_timeout_ms);
    {
        uint32_t fr = 0, tot = 0, sf = 0, stt = 0;

        if (st_decode_free(a->decode, &fr, &tot, &sf, &stt) == 0) {
            /* what decode holds for the stopped writer (its Load, /metrics) */
            printf("stall: while the writer is stopped decode reports %u blocks quarantined, "
                   "%u/%u free\n",
                   st_quarantined, fr, tot);
            held = st_quarantined;
        }
    }
    S.cont_on_first = &B;
    if (st_run_retrying(&B, pb, dw, 4 * (uint64_t)a->peer_timeout_ms, until, 0) != 0) {
        fprintf(stderr, "stall: request B never ended\n");
        return 0;
    }
    st_continue("request B ended");
    printf("stall: B %s writer continued %s\n",
           B.t_first_ns != 0 && S.continued_ns >= B.t_first_ns ? "streamed before the"
                                                               : "was admitted only after the",
           B.t_first_ns != 0 && S.continued_ns >= B.t_first_ns
               ? "(decode let the stopped writer's memory go: revoked)"
               : "(decode held the stopped writer's memory in quarantine)");
    ok &= st_equal(&B);
    if (S.continued_ns < B.t_first_ns && held == 0) {
        fprintf(stderr, "stall: decode held A's blocks but reported none quarantined\n");
        ok = 0;
    }
    /* the continued prefill worker had time to post its late writes; the
     * pool must serve correctly through both prefill workers */
    st_poll_ms(300);
    /* this client declared prefill A dead while it was stopped: learn it anew */
    if (epd_client_add_worker(S.client, a->prefill_a, &pa) != EPD_OK) {
        fprintf(stderr, "stall: prefill A does not answer after it was continued\n");
        return 0;
    }
    if (st_run_retrying(&C, pb, dw, 0, until, 1) != 0 ||
        st_run_retrying(&D, pa, dw, 0, until, 1) != 0) {
        fprintf(stderr, "stall: requests C / D never ended\n");
        return 0;
    }
    ok &= st_equal(&C);
    ok &= st_equal(&D);
    ok &= st_pool_full(a->decode);
    return ok;
}

/* --------------------------------------------------------------- embed */

typedef struct {
    unsigned char *bytes;
    size_t len;
    unsigned char hash[32];
    float *embeds;
} st_image_t;

static int st_load_image(const char *path, st_image_t *im)
{
    const epd_engine_info_t *info = S.info;
    epd_image_t img = {0};
    epd_image_view_t view;
    FILE *f = fopen(path, "rb");
    long n;

    memset(im, 0, sizeof(*im));
    if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) <= 0 ||
        fseek(f, 0, SEEK_SET) != 0) {
        fprintf(stderr, "stall: cannot read %s\n", path);
        if (f != NULL) {
            fclose(f);
        }
        return -1;
    }
    im->len = (size_t)n;
    im->bytes = epd_malloc(im->len);
    if (im->bytes == NULL || fread(im->bytes, 1, im->len, f) != im->len) {
        fclose(f);
        return -1;
    }
    fclose(f);
    crypto_generichash(im->hash, sizeof(im->hash), im->bytes, im->len, NULL, 0);
    im->embeds = epd_calloc((size_t)info->image_embeddings * info->embed_dim, sizeof(float));
    if (im->embeds == NULL ||
        epd_image_decode(im->bytes, im->len, EPD_IMAGE_MAX_PIXELS_DEFAULT, &img) != EPD_OK) {
        fprintf(stderr, "stall: cannot decode %s\n", path);
        return -1;
    }
    view = epd_image_view(&img);
    if (epd_engine_encode_image(S.engine, &view, im->embeds) != EPD_OK) {
        epd_image_cleanup(&img);
        fprintf(stderr, "stall: cannot encode %s\n", path);
        return -1;
    }
    epd_image_cleanup(&img);
    return 0;
}

static int st_make_image_req(st_req_t *r, const char *name, const st_image_t *im,
                             const char *text, uint64_t seed)
{
    epd_embed_span_t span;
    uint32_t pos = 0;
    size_t n = 0;

    memset(r, 0, sizeof(*r));
    r->name = name;
    if (epd_engine_tokenize_images(S.engine, text, strlen(text), 1, r->prompt, ST_MAX_PROMPT, &n,
                                   &pos) != EPD_OK) {
        fprintf(stderr, "stall: tokenizing request %s\n", name);
        return -1;
    }
    r->n_prompt = (uint32_t)n;
    r->max_tokens = 24;
    epd_sample_params_default(&r->sp);
    r->sp.temperature = 1.0f;
    r->sp.seed = seed;
    r->media.image = im->bytes;
    r->media.image_len = im->len;
    r->media.hash = im->hash;
    r->media.pos = pos;
    r->media.n = S.info->image_embeddings;
    r->n_media = 1;
    span.pos = pos;
    span.n = S.info->image_embeddings;
    span.data = im->embeds;
    if (epd_itest_colocated_mm(S.engine, r->prompt, r->n_prompt, &span, 1, &r->sp, r->max_tokens,
                               r->want, &r->n_want) != EPD_OK) {
        fprintf(stderr, "stall: colocated generation of %s failed\n", name);
        return -1;
    }
    return 0;
}

static int st_embed(void)
{
    const st_args_t *a = S.a;
    epd_client_worker_t *pw = NULL, *dw = NULL, *ea = NULL, *eb = NULL;
    epd_client_worker_t **ws[] = {&dw, &pw, &ea, &eb};
    const char *addrs[] = {a->decode, a->prefill_a, a->encoder_a, a->encoder_b};
    uint64_t until = epd_time_now_ns() + (uint64_t)a->timeout_s * EPD_NSEC_PER_SEC;
    static st_image_t ia, ib;
    static st_req_t A, B, C;
    char buf[300];
    uint32_t held = 0;
    int ok = 1;

    if (S.info->image_embeddings == 0) {
        fprintf(stderr, "stall: the model has no vision encoder\n");
        return 0;
    }
    if (st_load_image(a->image_a, &ia) != 0 || st_load_image(a->image_b, &ib) != 0 ||
        st_make_image_req(&A, "A", &ia, "First <|image|> here.", 5) != 0 ||
        st_make_image_req(&B, "B", &ib, "Second <|image|> there.", 6) != 0 ||
        st_make_image_req(&C, "C", &ib, "Second <|image|> there.", 6) != 0) {
        return 0;
    }
    if (st_connect(ws, addrs, 4) != 0) {
        return 0;
    }
    A.media.encoder = ea;
    B.media.encoder = eb;
    C.media.encoder = NULL; /* cached at the prefill worker: it reads the slot */
    C.media.image = NULL;
    C.media.image_len = 0;
    if (st_submit(&A, pw, dw) != 0 || st_wait_stopped(until) != 0) {
        return 0;
    }
    if (st_wait_end(&A, until) != 0) {
        fprintf(stderr, "stall: request A never ended while its encoder was stopped\n");
        return 0;
    }
    printf("stall: A ended: %s\n", st_outcome(&A, buf, sizeof(buf)));
    if (A.end_kind == EPD_CLIENT_EV_TOKENS && A.finish != EPD_CLIENT_FINISH_ABORT) {
        fprintf(stderr, "stall: request A finished although its encoder is stopped\n");
        ok = 0;
    }
    st_poll_ms((int)a->peer_timeout_ms);
    {
        uint32_t fr = 0, tot = 0, sf = 0, stt = 0;

        if (st_decode_free(a->prefill_a, &fr, &tot, &sf, &stt) == 0) {
            /* what the prefill worker holds for the stopped encoder */
            printf("stall: while the encoder is stopped the prefill worker reports %u embedding "
                   "slots quarantined\n",
                   st_quarantined);
            held = st_quarantined;
        }
    }
    if (st_run_retrying(&B, pw, dw, 4 * (uint64_t)a->peer_timeout_ms, until, 0) != 0) {
        fprintf(stderr, "stall: request B never ended\n");
        return 0;
    }
    if (S.continued && held == 0) {
        fprintf(stderr, "stall: the prefill worker held the slot but reported none quarantined\n");
        ok = 0;
    }
    printf("stall: B %s\n", S.continued ? "was placed only after the encoder was continued "
                                          "(the slot was held in quarantine)"
                                        : "ran while the encoder was stopped (the slot was "
                                          "revoked)");
    ok &= st_equal(&B);
    st_continue("request B ended: its image is cached in the slot");
    /* the encoder posts its late write at once; give it time to land */
    st_poll_ms(500);
    if (st_run_retrying(&C, pw, dw, 0, until, 1) != 0) {
        fprintf(stderr, "stall: request C never ended\n");
        return 0;
    }
    ok &= st_equal(&C);
    ok &= st_pool_full(a->decode);
    return ok;
}

int main(int argc, char **argv)
{
    st_args_t a = {
        .transport = "ucx",
        .peer_timeout_ms = 1000,
        .timeout_s = 90,
        .kv_tokens = 1024,
    };
    const epd_opt_t opts[] = {
        {"decode", EPD_OPT_STRING, &a.decode, 0, 0, "decode control address"},
        {"prefill-a", EPD_OPT_STRING, &a.prefill_a, 0, 0, "prefill control address (kv: the "
                                                           "stalled one; embed: the only one)"},
        {"prefill-b", EPD_OPT_STRING, &a.prefill_b, 0, 0, "kv: the other prefill worker"},
        {"encoder-a", EPD_OPT_STRING, &a.encoder_a, 0, 0, "embed: the stalled encoder"},
        {"encoder-b", EPD_OPT_STRING, &a.encoder_b, 0, 0, "embed: the other encoder"},
        {"stalled-pid", EPD_OPT_INT, &a.stalled_pid, 1, 4194304, "pid of the writer that stalls"},
        {"model", EPD_OPT_STRING, &a.model, 0, 0, "model folder (the daemons')"},
        {"transport", EPD_OPT_STRING, &a.transport, 0, 0, "ucx or ofi"},
        {"provider", EPD_OPT_STRING, &a.provider, 0, 0, "ofi provider"},
        {"secret-file", EPD_OPT_STRING, &a.secret_file, 0, 0, "cluster secret file"},
        {"image-a", EPD_OPT_STRING, &a.image_a, 0, 0, "embed: request A's image (PNG/JPEG)"},
        {"image-b", EPD_OPT_STRING, &a.image_b, 0, 0, "embed: request B's image"},
        {"peer-timeout-ms", EPD_OPT_INT, &a.peer_timeout_ms, 1, 600000,
         "the daemons' --peer-timeout-ms"},
        {"kv-tokens", EPD_OPT_INT, &a.kv_tokens, 64, ST_MAX_TOKENS,
         "kv: tokens of A and of B (prompt + max_tokens): the decode pool's size"},
        {"timeout-s", EPD_OPT_INT, &a.timeout_s, 1, 3600, "the whole test ends within this"},
    };
    epd_opts_t o = {.prog = "epd-itest-stall",
                    .summary = "a writer stalled mid-write and continued after its memory may "
                               "have been reused (kv | embed)",
                    .opts = opts,
                    .n_opts = sizeof(opts) / sizeof(opts[0])};
    epd_engine_config_t ecfg;
    int argi;
    int ok = 0;

    if (argc < 2 || (strcmp(argv[1], "kv") != 0 && strcmp(argv[1], "embed") != 0)) {
        fprintf(stderr, "usage: epd-itest-stall kv|embed [options] (--help)\n");
        return 1;
    }
    a.mode = argv[1];
    if (epd_opts_parse(&o, argc - 1, argv + 1, &argi) != EPD_OK) {
        epd_opts_cleanup(&o);
        return 1;
    }
    S.a = &a;
    memset(&ecfg, 0, sizeof(ecfg));
    ecfg.model_dir = a.model;
    ecfg.block_tokens = 16;
    if (a.model == NULL || a.decode == NULL || a.prefill_a == NULL || a.stalled_pid <= 0 ||
        (strcmp(a.mode, "kv") == 0 && a.prefill_b == NULL) ||
        (strcmp(a.mode, "embed") == 0 &&
         (a.encoder_a == NULL || a.encoder_b == NULL || a.image_a == NULL || a.image_b == NULL))) {
        fprintf(stderr, "epd-itest-stall: missing arguments (--help)\n");
    } else if (sodium_init() < 0 || epd_engine_open("ref", &ecfg, &S.engine) != EPD_OK) {
        fprintf(stderr, "epd-itest-stall: cannot open the model %s\n", a.model);
    } else {
        S.info = epd_engine_info(S.engine);
        ok = strcmp(a.mode, "kv") == 0 ? st_kv() : st_embed();
        if (!S.continued) {
            st_continue("the test ends");
        }
    }
    printf("stall: %s\n", ok && !S.bad ? "every expectation held" : "FAILED");
    epd_client_destroy(S.client);
    epd_engine_close(S.engine);
    epd_opts_cleanup(&o);
    return ok && !S.bad ? 0 : 1;
}
