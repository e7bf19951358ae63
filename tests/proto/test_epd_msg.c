/*
 * Unit tests of proto/epd_msg.c and the generated schemas: every message
 * round-trips; every truncation, bit flip and random garbage is refused with
 * EPD_ERR_MALFORMED and no crash (this program also runs under ASan+UBSan);
 * allocation failures at any point are reported and leak nothing.
 */
#include "epd_test.h"

#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_hash.h"
#include "epd_msg.h"
#include "epd_rng.h"

/* Storage for one fully populated envelope of each body kind. */
typedef struct {
    Epd__Epoch epoch;
    Epd__SenderRef sender;
    Epd__SamplingParams sampling;
    Epd__MediaRef media;
    Epd__MediaRef *media_list[1];
    Epd__KvLayout layout;
    uint32_t tokens[300];
    uint32_t blocks[17];
    uint64_t checksums[12];
    uint32_t stops[2];
    uint8_t hash_bytes[8];
    uint8_t addr[40];
    Epd__GenerateRequest generate;
    Epd__KvReservation reservation;
    Epd__KvRefused refused;
    Epd__LayerDone layer_done;
    Epd__PrefillComplete complete;
    Epd__WritesQuiesced quiesced;
    Epd__TokenChunk chunk;
    Epd__Abort abort;
    Epd__Error error;
    Epd__Envelope env;
} msg_fixture_t;

#define N_BODIES 9

static void fixture_fill(msg_fixture_t *f, int which)
{
    memset(f, 0, sizeof(*f));
    epd__epoch__init(&f->epoch);
    f->epoch.start_time_ns = 1764428627000000000ULL;
    f->epoch.nonce = 0xfeedfacecafebeefULL;
    epd__sender_ref__init(&f->sender);
    f->sender.worker_id = "prefill-0";
    f->sender.epoch = &f->epoch;
    epd__envelope__init(&f->env);
    f->env.sender = &f->sender;
    f->env.seq = 77;
    for (unsigned i = 0; i < 300; i++) {
        f->tokens[i] = (i * 7919u) % 258u;
    }
    for (unsigned i = 0; i < 17; i++) {
        f->blocks[i] = 1000 + i * 3;
    }
    for (unsigned i = 0; i < 12; i++) {
        f->checksums[i] = 0x0123456789abcdefULL * (i + 1);
    }
    memset(f->addr, 0xa5, sizeof(f->addr));
    memset(f->hash_bytes, 0x5a, sizeof(f->hash_bytes));

    switch (which) {
    case 0:
        epd__sampling_params__init(&f->sampling);
        f->sampling.temperature = 0.7f;
        f->sampling.top_p = 0.9f;
        f->sampling.top_k = 40;
        f->sampling.seed = 1234;
        f->sampling.max_tokens = 64;
        f->stops[0] = 257;
        f->stops[1] = 10;
        f->sampling.n_stop_token_ids = 2;
        f->sampling.stop_token_ids = f->stops;
        epd__media_ref__init(&f->media);
        f->media.kind = "image";
        f->media.content_hash.data = f->hash_bytes;
        f->media.content_hash.len = sizeof(f->hash_bytes);
        f->media.n_embeddings = 64;
        f->media.placeholder_pos = 5;
        f->media.encoder_worker_id = "encoder-1";
        f->media_list[0] = &f->media;
        epd__generate_request__init(&f->generate);
        f->generate.request_id = 42;
        f->generate.n_prompt_tokens = 300;
        f->generate.prompt_tokens = f->tokens;
        f->generate.sampling = &f->sampling;
        f->generate.n_media = 1;
        f->generate.media = f->media_list;
        f->generate.prefill_worker_id = "prefill-0";
        f->generate.decode_worker_id = "decode-1";
        f->generate.decode_address.data = f->addr;
        f->generate.decode_address.len = sizeof(f->addr);
        f->generate.deadline_ms = 30000;
        f->env.body_case = EPD__ENVELOPE__BODY_GENERATE;
        f->env.generate = &f->generate;
        break;
    case 1:
        epd__kv_layout__init(&f->layout);
        f->layout.n_layers = 12;
        f->layout.layer_pattern = "LLALLALLALLA";
        f->layout.block_tokens = 16;
        f->layout.n_kv_heads = 2;
        f->layout.head_dim = 32;
        f->layout.dtype = EPD__KV_DTYPE__KV_DTYPE_F32;
        f->layout.block_bytes = 8192;
        f->layout.state_bytes = 65536;
        epd__kv_reservation__init(&f->reservation);
        f->reservation.request_id = 43;
        f->reservation.n_block_ids = 17;
        f->reservation.block_ids = f->blocks;
        f->reservation.state_slot = 3;
        f->reservation.rkey.data = f->addr;
        f->reservation.rkey.len = sizeof(f->addr);
        f->reservation.region_size = 1ULL << 33;
        f->reservation.layout = &f->layout;
        f->reservation.lease_ms = 5000;
        f->env.body_case = EPD__ENVELOPE__BODY_RESERVATION;
        f->env.reservation = &f->reservation;
        break;
    case 2:
        epd__kv_refused__init(&f->refused);
        f->refused.request_id = 44;
        f->refused.status = EPD_ERR_NO_CAPACITY;
        f->refused.reason = "17 blocks asked, 3 free";
        f->env.body_case = EPD__ENVELOPE__BODY_REFUSED;
        f->env.refused = &f->refused;
        break;
    case 3:
        epd__layer_done__init(&f->layer_done);
        f->layer_done.request_id = 45;
        f->layer_done.layer = 11;
        f->layer_done.checksum = 0xdeadbeefULL;
        f->env.body_case = EPD__ENVELOPE__BODY_LAYER_DONE;
        f->env.layer_done = &f->layer_done;
        break;
    case 4:
        epd__prefill_complete__init(&f->complete);
        f->complete.request_id = 46;
        f->complete.first_token = 101;
        f->complete.n_prompt_tokens = 300;
        f->complete.n_layer_checksums = 12;
        f->complete.layer_checksums = f->checksums;
        f->env.body_case = EPD__ENVELOPE__BODY_PREFILL_COMPLETE;
        f->env.prefill_complete = &f->complete;
        break;
    case 5:
        epd__writes_quiesced__init(&f->quiesced);
        f->quiesced.request_id = 47;
        f->env.body_case = EPD__ENVELOPE__BODY_QUIESCED;
        f->env.quiesced = &f->quiesced;
        break;
    case 6:
        epd__token_chunk__init(&f->chunk);
        f->chunk.request_id = 48;
        f->chunk.index = 9;
        f->chunk.n_tokens = 5;
        f->chunk.tokens = f->tokens;
        f->chunk.finish = EPD__FINISH_REASON__FINISH_LENGTH;
        f->env.body_case = EPD__ENVELOPE__BODY_TOKENS;
        f->env.tokens = &f->chunk;
        break;
    case 7:
        epd__abort__init(&f->abort);
        f->abort.request_id = 49;
        f->abort.status = EPD_ERR_CANCELED;
        f->abort.reason = "client disconnected";
        f->env.body_case = EPD__ENVELOPE__BODY_ABORT;
        f->env.abort = &f->abort;
        break;
    default:
        epd__error__init(&f->error);
        f->error.request_id = 50;
        f->error.status = EPD_ERR_CORRUPT;
        f->error.message = "layer 3 checksum mismatch";
        f->env.body_case = EPD__ENVELOPE__BODY_ERROR;
        f->env.error = &f->error;
        break;
    }
}

static size_t fixture_encode(msg_fixture_t *f, int which, unsigned char *buf, size_t cap)
{
    size_t len = 0;

    fixture_fill(f, which);
    assert_int_equal(epd_msg_encode(&f->env, buf, cap, &len), EPD_OK);
    assert_int_equal(len, epd_msg_encoded_size(&f->env));
    return len;
}

static void test_round_trip_every_body(void **state)
{
    static unsigned char buf[8192];
    static unsigned char again[8192];
    msg_fixture_t f;

    (void)state;
    for (int which = 0; which < N_BODIES; which++) {
        size_t len = fixture_encode(&f, which, buf, sizeof(buf));
        size_t len2 = 0;
        Epd__Envelope *env = NULL;
        const char *why = NULL;

        assert_int_equal(epd_msg_decode(buf, len, &env, &why), EPD_OK);
        assert_int_equal(env->body_case, f.env.body_case);
        assert_string_equal(env->sender->worker_id, "prefill-0");
        assert_int_equal(env->sender->epoch->nonce, 0xfeedfacecafebeefULL);
        assert_int_equal(env->seq, 77);
        assert_int_equal(epd_msg_request_id(env), 42 + which);
        assert_string_not_equal(epd_msg_body_name(env), "none");
        /* re-encoding the decoded message gives the same bytes */
        assert_int_equal(epd_msg_encode(env, again, sizeof(again), &len2), EPD_OK);
        assert_int_equal(len2, len);
        assert_memory_equal(again, buf, len);
        if (which == 0) {
            assert_int_equal(env->generate->n_prompt_tokens, 300);
            assert_memory_equal(env->generate->prompt_tokens, f.tokens, sizeof(f.tokens));
            assert_true(env->generate->sampling->top_p == 0.9f);
            assert_string_equal(env->generate->media[0]->encoder_worker_id, "encoder-1");
        } else if (which == 1) {
            assert_int_equal(env->reservation->n_block_ids, 17);
            assert_int_equal(env->reservation->block_ids[16], 1048);
            assert_int_equal(env->reservation->region_size, 1ULL << 33);
            assert_string_equal(env->reservation->layout->layer_pattern, "LLALLALLALLA");
        } else if (which == 4) {
            assert_memory_equal(env->prefill_complete->layer_checksums, f.checksums,
                                sizeof(f.checksums));
        }
        epd_msg_free(env);
    }
}

/* The fixture's body, whichever it is (the oneof's union of pointers). */
static void *fixture_body(msg_fixture_t *f)
{
    switch (f->env.body_case) {
    case EPD__ENVELOPE__BODY_GENERATE:
        return f->env.generate;
    case EPD__ENVELOPE__BODY_RESERVATION:
        return f->env.reservation;
    case EPD__ENVELOPE__BODY_REFUSED:
        return f->env.refused;
    case EPD__ENVELOPE__BODY_LAYER_DONE:
        return f->env.layer_done;
    case EPD__ENVELOPE__BODY_PREFILL_COMPLETE:
        return f->env.prefill_complete;
    case EPD__ENVELOPE__BODY_QUIESCED:
        return f->env.quiesced;
    case EPD__ENVELOPE__BODY_TOKENS:
        return f->env.tokens;
    case EPD__ENVELOPE__BODY_ABORT:
        return f->env.abort;
    case EPD__ENVELOPE__BODY_ERROR:
        return f->env.error;
    default:
        fail_msg("fixture body %d", (int)f->env.body_case);
        return NULL;
    }
}

/* epd_msg_encode_body (what the daemons send with) frames exactly what
 * epd_msg_encode frames for the same envelope, for every body; no body or
 * an unknown kind is refused. */
static void test_encode_body_equals_encode(void **state)
{
    static unsigned char buf[8192];
    static unsigned char mine[8192];
    const epd_msg_epoch_t epoch = {1764428627000000000ULL, 0xfeedfacecafebeefULL};
    msg_fixture_t f;
    size_t len2 = 0;

    (void)state;
    for (int which = 0; which < N_BODIES; which++) {
        size_t len = fixture_encode(&f, which, buf, sizeof(buf));

        assert_int_equal(epd_msg_encode_body("prefill-0", &epoch, 77, f.env.body_case,
                                             fixture_body(&f), mine, sizeof(mine), &len2),
                         EPD_OK);
        assert_int_equal(len2, len);
        assert_memory_equal(mine, buf, len);
    }
    assert_int_equal(epd_msg_encode_body("p", &epoch, 1, EPD__ENVELOPE__BODY_ERROR, NULL, mine,
                                         sizeof(mine), &len2),
                     EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_msg_encode_body("p", &epoch, 1, EPD__ENVELOPE__BODY__NOT_SET, &f, mine,
                                         sizeof(mine), &len2),
                     EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_msg_encode_body("p", &epoch, 1, (Epd__Envelope__BodyCase)999, &f, mine,
                                         sizeof(mine), &len2),
                     EPD_ERR_INVALID_PARAM);
}

static void test_epoch_order(void **state)
{
    const epd_msg_epoch_t old = {100, 7}, same = {100, 7}, nonce = {100, 8}, later = {101, 0};
    Epd__Epoch wire = EPD__EPOCH__INIT;
    epd_msg_epoch_t v;

    (void)state;
    assert_int_equal(epd_msg_epoch_cmp(&old, &same), 0);
    assert_int_equal(epd_msg_epoch_cmp(&old, &nonce), -1);
    assert_int_equal(epd_msg_epoch_cmp(&nonce, &old), 1);
    assert_int_equal(epd_msg_epoch_cmp(&nonce, &later), -1); /* start time first */
    assert_int_equal(epd_msg_epoch_cmp(&later, &nonce), 1);
    wire.start_time_ns = 101;
    wire.nonce = 9;
    v = epd_msg_epoch_of(&wire);
    assert_int_equal(v.start_time_ns, 101);
    assert_int_equal(v.nonce, 9);
    v = epd_msg_epoch_of(NULL);
    assert_int_equal(v.start_time_ns, 0);
    assert_int_equal(v.nonce, 0);
    assert_int_equal(epd_msg_epoch_cmp(&v, &old), -1);
}

static void test_encode_refuses_small_buffer_and_empty_body(void **state)
{
    unsigned char buf[64];
    msg_fixture_t f;
    size_t len = 0;

    (void)state;
    fixture_fill(&f, 0);
    assert_int_equal(epd_msg_encode(&f.env, buf, sizeof(buf), &len), EPD_ERR_TOO_LONG);
    assert_int_equal(len, 0);
    f.env.body_case = EPD__ENVELOPE__BODY__NOT_SET;
    assert_int_equal(epd_msg_encode(&f.env, buf, sizeof(buf), &len), EPD_ERR_INVALID_PARAM);
}

static void test_every_truncation_refused(void **state)
{
    static unsigned char buf[8192];
    msg_fixture_t f;

    (void)state;
    for (int which = 0; which < N_BODIES; which++) {
        size_t len = fixture_encode(&f, which, buf, sizeof(buf));

        for (size_t cut = 0; cut < len; cut++) {
            Epd__Envelope *env = NULL;
            const char *why = NULL;

            assert_int_equal(epd_msg_decode(buf, cut, &env, &why), EPD_ERR_MALFORMED);
            assert_null(env);
            assert_non_null(why);
        }
    }
}

static void test_every_bit_flip_refused(void **state)
{
    static unsigned char buf[8192];
    msg_fixture_t f;

    (void)state;
    for (int which = 0; which < N_BODIES; which++) {
        size_t len = fixture_encode(&f, which, buf, sizeof(buf));

        for (size_t bit = 0; bit < len * 8; bit++) {
            Epd__Envelope *env = NULL;

            buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
            assert_int_equal(epd_msg_decode(buf, len, &env, NULL), EPD_ERR_MALFORMED);
            buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        }
    }
}

/* Frames whose header and checksum are right but whose body is wrong. */
static size_t frame_body(const void *body, size_t body_len, unsigned char *out)
{
    Epd__Envelope probe = EPD__ENVELOPE__INIT;
    Epd__Error err = EPD__ERROR__INIT;
    size_t len = 0;

    /* Build a valid header with epd_msg_encode, then swap the body in and
     * recompute the checksum the same way epd_msg.c does. */
    err.request_id = 1;
    probe.body_case = EPD__ENVELOPE__BODY_ERROR;
    probe.error = &err;
    assert_int_equal(epd_msg_encode(&probe, out, 4096, &len), EPD_OK);
    memcpy(out + EPD_MSG_HDR_SIZE, body, body_len);
    for (int i = 0; i < 4; i++) {
        out[8 + i] = (unsigned char)(body_len >> (8 * i));
    }
    {
        uint64_t h = epd_hash64(body, body_len, 0);

        for (int i = 0; i < 8; i++) {
            out[16 + i] = (unsigned char)(h >> (8 * i));
        }
    }
    return EPD_MSG_HDR_SIZE + body_len;
}

static void test_semantic_checks(void **state)
{
    static unsigned char body[4096];
    static unsigned char frame[8192];
    msg_fixture_t f;
    Epd__Envelope *env = NULL;
    const char *why = NULL;
    size_t n;

    (void)state;
    /* no sender */
    fixture_fill(&f, 3);
    f.env.sender = NULL;
    n = epd__envelope__pack(&f.env, body);
    assert_int_equal(epd_msg_decode(frame, frame_body(body, n, frame), &env, &why),
                     EPD_ERR_MALFORMED);
    assert_string_equal(why, "envelope without sender identity and epoch");
    /* request id 0 */
    fixture_fill(&f, 3);
    f.layer_done.request_id = 0;
    n = epd__envelope__pack(&f.env, body);
    assert_int_equal(epd_msg_decode(frame, frame_body(body, n, frame), &env, &why),
                     EPD_ERR_MALFORMED);
    assert_string_equal(why, "message without a request id");
    /* no body */
    fixture_fill(&f, 3);
    f.env.body_case = EPD__ENVELOPE__BODY__NOT_SET;
    n = epd__envelope__pack(&f.env, body);
    assert_int_equal(epd_msg_decode(frame, frame_body(body, n, frame), &env, &why),
                     EPD_ERR_MALFORMED);
    assert_string_equal(why, "envelope without a body");
    /* checksummed garbage that is not protobuf (a field with wire type 7) */
    memset(body, 0xff, 64);
    assert_int_equal(epd_msg_decode(frame, frame_body(body, 64, frame), &env, &why),
                     EPD_ERR_MALFORMED);
    assert_string_equal(why, "body is not a valid epd.Envelope");
    assert_null(env);
}

static void test_random_garbage(void **state)
{
    static unsigned char buf[4096];
    static unsigned char frame[8192];
    epd_rng_t rng;

    (void)state;
    epd_rng_seed(&rng, 2026);
    for (int i = 0; i < 100000; i++) {
        size_t len = (size_t)(epd_rng_next(&rng) % 200);
        Epd__Envelope *env = NULL;

        epd_rng_fill(&rng, buf, len);
        assert_int_equal(epd_msg_decode(buf, len, &env, NULL), EPD_ERR_MALFORMED);
        /* the same garbage behind a valid header and checksum reaches the
         * protobuf decoder; it must be refused or give a checked envelope */
        if (epd_msg_decode(frame, frame_body(buf, len, frame), &env, NULL) == EPD_OK) {
            assert_non_null(env->sender);
            assert_int_not_equal(epd_msg_request_id(env), 0);
            epd_msg_free(env);
        }
    }
}

static void test_allocation_failures(void **state)
{
    static unsigned char buf[8192];
    msg_fixture_t f;
    size_t len = fixture_encode(&f, 0, buf, sizeof(buf));
    epd_alloc_stats_t before;
    epd_alloc_stats_t after;
    long n;

    (void)state;
    epd_alloc_stats(&before);
    for (n = 0;; n++) {
        Epd__Envelope *env = NULL;
        epd_status_t status;

        epd_alloc_fail_after(n);
        status = epd_msg_decode(buf, len, &env, NULL);
        epd_alloc_fail_after(-1);
        if (status == EPD_OK) {
            epd_msg_free(env);
            break;
        }
        assert_int_equal(status, EPD_ERR_MALFORMED);
        epd_alloc_stats(&after);
        assert_int_equal(after.live_bytes, before.live_bytes);
    }
    assert_true(n > 3); /* the decoder did allocate through the funnel */
    epd_alloc_stats(&after);
    assert_int_equal(after.live_bytes, before.live_bytes);
}

static void test_control_messages_round_trip(void **state)
{
    Epd__Epoch epoch = EPD__EPOCH__INIT;
    Epd__WorkerIdentity who = EPD__WORKER_IDENTITY__INIT;
    Epd__Capacity cap = EPD__CAPACITY__INIT;
    Epd__Load load = EPD__LOAD__INIT;
    Epd__KvLayout layout = EPD__KV_LAYOUT__INIT;
    Epd__RegisterRequest reg = EPD__REGISTER_REQUEST__INIT;
    Epd__HeartbeatRequest hb = EPD__HEARTBEAT_REQUEST__INIT;
    Epd__WorkerStatus ws = EPD__WORKER_STATUS__INIT;
    Epd__WorkerStatus *ws_list[2] = {&ws, &ws};
    Epd__StatusResponse st = EPD__STATUS_RESPONSE__INIT;
    uint8_t addr[100];
    unsigned char buf[4096];
    ProtobufCMessage *msg = NULL;
    size_t n;

    (void)state;
    memset(addr, 7, sizeof(addr));
    epoch.start_time_ns = 5;
    epoch.nonce = 6;
    who.worker_id = "decode-3";
    who.role = EPD__ROLE__ROLE_DECODE;
    who.model = "default";
    who.epoch = &epoch;
    cap.kv_blocks_total = 4096;
    cap.block_tokens = 16;
    load.kv_blocks_free = 4000;
    load.running_requests = 12;
    layout.n_layers = 8;
    layout.layer_pattern = "LLALLALA";
    reg.worker = &who;
    reg.transport = "ucx";
    reg.data_plane_address.data = addr;
    reg.data_plane_address.len = sizeof(addr);
    reg.control_address = "127.0.0.1:50051";
    reg.capacity = &cap;
    reg.kv_layout = &layout;
    n = epd__register_request__pack(&reg, buf);
    assert_int_equal(epd_proto_unpack(&epd__register_request__descriptor, buf, n, &msg), EPD_OK);
    {
        Epd__RegisterRequest *r = (Epd__RegisterRequest *)msg;

        assert_string_equal(r->worker->worker_id, "decode-3");
        assert_int_equal(r->worker->role, EPD__ROLE__ROLE_DECODE);
        assert_int_equal(r->data_plane_address.len, 100);
        assert_int_equal(r->capacity->kv_blocks_total, 4096);
        assert_string_equal(r->kv_layout->layer_pattern, "LLALLALA");
    }
    epd_proto_free(msg);

    hb.worker_id = "decode-3";
    hb.epoch = &epoch;
    hb.load = &load;
    n = epd__heartbeat_request__pack(&hb, buf);
    assert_int_equal(epd_proto_unpack(&epd__heartbeat_request__descriptor, buf, n, &msg), EPD_OK);
    assert_int_equal(((Epd__HeartbeatRequest *)msg)->load->running_requests, 12);
    epd_proto_free(msg);

    ws.worker = &who;
    ws.state = EPD__WORKER_STATE__WORKER_STATE_DRAINING;
    ws.load = &load;
    ws.capacity = &cap;
    ws.last_heartbeat_age_ms = 250;
    st.n_workers = 2;
    st.workers = ws_list;
    n = epd__status_response__pack(&st, buf);
    assert_int_equal(epd_proto_unpack(&epd__status_response__descriptor, buf, n, &msg), EPD_OK);
    assert_int_equal(((Epd__StatusResponse *)msg)->n_workers, 2);
    assert_int_equal(((Epd__StatusResponse *)msg)->workers[1]->state,
                     EPD__WORKER_STATE__WORKER_STATE_DRAINING);
    epd_proto_free(msg);

    /* a cut inside a length-delimited field is refused */
    n = epd__register_request__pack(&reg, buf);
    assert_int_equal(epd_proto_unpack(&epd__register_request__descriptor, buf, n - 3, &msg),
                     EPD_ERR_MALFORMED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_every_body),
        cmocka_unit_test(test_encode_body_equals_encode),
        cmocka_unit_test(test_epoch_order),
        cmocka_unit_test(test_encode_refuses_small_buffer_and_empty_body),
        cmocka_unit_test(test_every_truncation_refused),
        cmocka_unit_test(test_every_bit_flip_refused),
        cmocka_unit_test(test_semantic_checks),
        cmocka_unit_test(test_random_garbage),
        cmocka_unit_test(test_allocation_failures),
        cmocka_unit_test(test_control_messages_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
