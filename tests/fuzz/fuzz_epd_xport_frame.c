/*
 * libFuzzer target for the transport core's frame decoder and handshake
 * (transport/epd_xport_recv.c, epd__xport_deliver): every byte string handed to
 * a worker as a frame is routed, checked (length, magic, version, flags,
 * identity block, MACs, sequence) and either handled or dropped; never a
 * crash, a leak, undefined behaviour, an accept without a valid proof, or a
 * message from a frame whose MAC failed.
 *
 * Two workers A and B on the in-process loopback backend
 * (tests/transport/epd_xport_loop.c), made afresh for every input, with
 * libsodium's random numbers replaced by a seeded generator restarted per
 * input, so that the same input always meets the same ids, nonces and keys
 * — and a seed that holds a genuine MAC'd frame stays genuine.
 *
 * Input: one mode byte, then records {u8 to, u16 len (little-endian),
 * bytes[len]}, each handed to B (to even) or A (to odd), both workers
 * progressed after each.  Mode bits: 0x01 both workers have the secret,
 * 0x02 both present identities, 0x04 A connects to B (handshake done)
 * before the records, 0x08 B alone has the secret.
 *
 * Seeds (tests/fuzz/corpus/fuzz_epd_xport_frame/) come from this file built
 * with -DEPD_FUZZ_SEEDGEN as a program: it runs the same set-up and records
 * the frames A and B really send (see seedgen_main at the end).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "epd_log.h"
#include "epd_rng.h"
#include "epd_xport_loop.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define F_SECRET 0x01
#define F_IDENT 0x02
#define F_CONNECT 0x04
#define F_B_ONLY 0x08

/* ------------------------------------------ deterministic random numbers */

static epd_rng_t fuzz_rng;

static const char *fuzz_rng_name(void)
{
    return "epd-fuzz-seeded";
}

static uint32_t fuzz_rng_random(void)
{
    return (uint32_t)epd_rng_next(&fuzz_rng);
}

static void fuzz_rng_buf(void *const buf, const size_t size)
{
    epd_rng_fill(&fuzz_rng, buf, size);
}

static randombytes_implementation fuzz_rng_impl = {
    .implementation_name = fuzz_rng_name,
    .random = fuzz_rng_random,
    .stir = NULL,
    .uniform = NULL,
    .buf = fuzz_rng_buf,
    .close = NULL,
};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* seeded now too: other code of the process (another target in the
     * replay program) draws before the first input */
    epd_rng_seed(&fuzz_rng, 0x5eed);
    randombytes_set_implementation(&fuzz_rng_impl);
    if (sodium_init() < 0) {
        abort();
    }
    epd_log_set_level(EPD_LOG_ERROR);
    return 0;
}

/* ----------------------------------------------------------- two workers */

typedef struct {
    epd_xport_t *x;
    int accepts;
    int msgs;
    epd_xport_ep_t *eps[8];
    int n_eps;
} fw_t;

static void fw_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    fw_t *w = arg;

    (void)ep;
    (void)data;
    if (len == 0) {
        abort(); /* the core never delivers an empty message */
    }
    w->msgs++;
}

static void fw_accept(void *arg, epd_xport_ep_t *ep)
{
    fw_t *w = arg;

    w->accepts++;
    if (w->n_eps < 8) {
        w->eps[w->n_eps++] = ep;
    }
}

static const char fuzz_secret[] = "fuzzing cluster secret, 32 bytes";
static const char fuzz_other[] = "another cluster secret, 32 bytes";

static int fw_init(fw_t *w, unsigned mode, const char *name, int role, const char *secret)
{
    epd_xport_config_t cfg;

    memset(w, 0, sizeof(*w));
    epd_xport_config_init(&cfg);
    cfg.msg_cb = fw_msg;
    cfg.accept_cb = fw_accept;
    cfg.cb_arg = w;
    cfg.max_inflight = 8;
    cfg.max_msg_size = 4096;
    cfg.connect_timeout_ms = 60000;
    cfg.peer_timeout_ms = 60000;
    if (secret != NULL) {
        cfg.secret = secret;
        cfg.secret_len = strlen(secret);
    }
    if (mode & F_IDENT) {
        snprintf(cfg.identity.worker_id, sizeof(cfg.identity.worker_id), "%s", name);
        cfg.identity.role = role;
        cfg.identity.epoch.start_time_ns = 1700000000000000000ull + (uint64_t)role;
        cfg.identity.epoch.nonce = 42u + (uint64_t)role;
    }
    return epd__xport_create_ops(&epd_xport_loop_ops, &cfg, &w->x) == EPD_OK ? 0 : -1;
}

static void fw_pump(fw_t *a, fw_t *b)
{
    for (int i = 0; i < 16; i++) {
        int n = epd_xport_progress(a->x) + epd_xport_progress(b->x);
        if (n == 0 && epd_xport_loop_pending(a->x) == 0 && epd_xport_loop_pending(b->x) == 0) {
            return;
        }
    }
}

/* The same start for every input of a mode: workers, then the handshake. */
static int fuzz_setup(unsigned mode, fw_t *a, fw_t *b, epd_xport_ep_t **ep_p)
{
    const char *sa = (mode & F_SECRET) ? fuzz_secret : NULL;
    const char *sb = (mode & F_SECRET) ? fuzz_secret : (mode & F_B_ONLY) ? fuzz_other : NULL;
    const void *blob;
    size_t len;

    epd_rng_seed(&fuzz_rng, 0x5eed);
    epd_xport_loop_reset();
    if (fw_init(a, mode, "prefill-0", 2, sa) != 0) {
        abort();
    }
    if (fw_init(b, mode, "decode-0", 3, sb) != 0) {
        abort();
    }
    *ep_p = NULL;
    if (mode & F_CONNECT) {
        if (epd_xport_address(b->x, &blob, &len) != EPD_OK ||
            epd_xport_connect(a->x, blob, len, NULL, NULL, ep_p) != EPD_INPROGRESS) {
            abort();
        }
        fw_pump(a, b);
    }
    return 0;
}

static void fuzz_check(fw_t *a, fw_t *b, unsigned mode)
{
    /* a worker with a secret accepts only an endpoint that proved itself */
    for (int i = 0; i < b->n_eps; i++) {
        epd_xport_identity_t id;
        int authed = 0;

        if (epd_xport_ep_identity(b->eps[i], &id, &authed) != EPD_OK) {
            abort();
        }
        if (epd_xport_authenticating(b->x) && !authed) {
            abort();
        }
    }
    /* without the right secret nobody completes a handshake with B */
    if ((mode & F_B_ONLY) && !(mode & F_SECRET) && b->accepts != 0) {
        abort();
    }
    (void)a;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fw_t a, b;
    epd_xport_ep_t *ep;
    unsigned mode;
    size_t off = 1;

    if (size < 1) {
        return 0;
    }
    mode = data[0] & 0x0f;
    fuzz_setup(mode, &a, &b, &ep);
    while (off + 3 <= size) {
        unsigned to = data[off];
        size_t len = (size_t)data[off + 1] | ((size_t)data[off + 2] << 8);

        off += 3;
        if (len > size - off) {
            len = size - off;
        }
        epd__xport_deliver((to & 1) ? a.x : b.x, data + off, len);
        fw_pump(&a, &b);
        off += len;
    }
    fuzz_check(&a, &b, mode);
    epd_xport_destroy(a.x);
    epd_xport_destroy(b.x);
    return 0;
}

#ifdef EPD_FUZZ_SEEDGEN
/* ------------------------------------------------------ seed generator */

static FILE *seed_file;
static uint64_t seed_a_id; /* frames from A go to B (0), the others to A (1) */
static int seed_rec;

static void seed_tap(void *arg, const void *frame, size_t len)
{
    uint64_t sender;

    (void)arg;
    if (seed_file != NULL && seed_rec && len >= 24) {
        memcpy(&sender, (const unsigned char *)frame + 16, sizeof(sender));
        unsigned char h[3] = {(unsigned char)(sender == seed_a_id ? 0 : 1), (unsigned char)len,
                              (unsigned char)(len >> 8)};
        fwrite(h, 1, 3, seed_file);
        fwrite(frame, 1, len, seed_file);
    }
}

static void seed_open(const char *dir, const char *name, unsigned mode)
{
    char path[1024];
    unsigned char m = (unsigned char)mode;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    seed_file = fopen(path, "wb");
    if (seed_file == NULL) {
        perror(path);
        exit(1);
    }
    fwrite(&m, 1, 1, seed_file);
}

/* A's frames to B (and B's to A) of one session of `mode`: in the
 * handshake modes only what follows the handshake (the fuzz run redoes the
 * handshake itself, identically); otherwise the handshake's own frames. */
static void seed_session(const char *dir, const char *name, unsigned mode)
{
    fw_t a, b;
    epd_xport_ep_t *ep;
    const void *blob;
    size_t len;
    static const char msg[] = "reservation: 4 blocks for request 7";

    seed_open(dir, name, mode);
    epd_xport_loop_set_send_tap(seed_tap, NULL);
    seed_rec = 0;
    fuzz_setup(mode, &a, &b, &ep);
    seed_a_id = epd_xport_id(a.x);
    seed_rec = 1;
    if (ep == NULL) {
        /* the handshake's own frames (the fuzz run does not connect) */
        epd_xport_address(b.x, &blob, &len);
        epd_xport_connect(a.x, blob, len, NULL, NULL, &ep);
        fw_pump(&a, &b);
    }
    epd_xport_send(ep, msg, sizeof(msg), 0);
    epd_xport_send(ep, msg, 5, 0);
    fw_pump(&a, &b);
    if (b.n_eps > 0) {
        epd_xport_send(b.eps[0], msg, 9, 0);
        fw_pump(&a, &b);
    }
    epd_xport_ep_close(ep);
    fw_pump(&a, &b);
    seed_rec = 0;
    epd_xport_loop_set_send_tap(NULL, NULL);
    epd_xport_destroy(a.x);
    epd_xport_destroy(b.x);
    fclose(seed_file);
    seed_file = NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    LLVMFuzzerInitialize(&argc, &argv);
    seed_session(argv[1], "plain-session", 0);
    seed_session(argv[1], "plain-connected", F_CONNECT);
    seed_session(argv[1], "ident-session", F_IDENT);
    seed_session(argv[1], "auth-handshake", F_SECRET | F_IDENT);
    seed_session(argv[1], "auth-connected", F_SECRET | F_IDENT | F_CONNECT);
    seed_session(argv[1], "auth-wrong-secret", F_B_ONLY | F_IDENT);
    return 0;
}
#endif
