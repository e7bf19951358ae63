/*
 * epd_msg.c — request-plane framing (see epd_msg.h for the layout) and the
 * protobuf-c allocator hook.
 */
#include "epd_msg.h"

#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_hash.h"
#include "epd_rpc.h"

static void *epd_proto_alloc(void *data, size_t size)
{
    (void)data;
    return epd_malloc(size);
}

static void epd_proto_dealloc(void *data, void *ptr)
{
    (void)data;
    epd_free(ptr);
}

ProtobufCAllocator epd_proto_allocator = {
    .alloc = epd_proto_alloc,
    .free = epd_proto_dealloc,
    .allocator_data = NULL,
};

static void epd_msg_put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

static void epd_msg_put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

static uint32_t epd_msg_get32(const unsigned char *p)
{
    uint32_t v = 0;

    for (int i = 0; i < 4; i++) {
        v |= (uint32_t)p[i] << (8 * i);
    }
    return v;
}

static uint64_t epd_msg_get64(const unsigned char *p)
{
    uint64_t v = 0;

    for (int i = 0; i < 8; i++) {
        v |= (uint64_t)p[i] << (8 * i);
    }
    return v;
}

size_t epd_msg_encoded_size(const Epd__Envelope *env)
{
    return EPD_MSG_HDR_SIZE + epd__envelope__get_packed_size(env);
}

epd_status_t epd_msg_encode(const Epd__Envelope *env, void *buf, size_t cap, size_t *len_p)
{
    unsigned char *p = buf;
    size_t body;

    if (env->body_case == EPD__ENVELOPE__BODY__NOT_SET) {
        return EPD_ERR_INVALID_PARAM;
    }
    body = epd__envelope__get_packed_size(env);
    if (body > UINT32_MAX || cap < EPD_MSG_HDR_SIZE || cap - EPD_MSG_HDR_SIZE < body) {
        return EPD_ERR_TOO_LONG;
    }
    epd__envelope__pack(env, p + EPD_MSG_HDR_SIZE);
    epd_msg_put32(p, EPD_MSG_MAGIC);
    p[4] = (unsigned char)EPD_MSG_VERSION;
    p[5] = 0;
    p[6] = 0;
    p[7] = 0;
    epd_msg_put32(p + 8, (uint32_t)body);
    epd_msg_put32(p + 12, 0);
    epd_msg_put64(p + 16, epd_hash64(p + EPD_MSG_HDR_SIZE, body, 0));
    *len_p = EPD_MSG_HDR_SIZE + body;
    return EPD_OK;
}

uint64_t epd_msg_request_id(const Epd__Envelope *env)
{
    switch (env->body_case) {
    case EPD__ENVELOPE__BODY_GENERATE:
        return env->generate->request_id;
    case EPD__ENVELOPE__BODY_RESERVATION:
        return env->reservation->request_id;
    case EPD__ENVELOPE__BODY_REFUSED:
        return env->refused->request_id;
    case EPD__ENVELOPE__BODY_LAYER_DONE:
        return env->layer_done->request_id;
    case EPD__ENVELOPE__BODY_PREFILL_COMPLETE:
        return env->prefill_complete->request_id;
    case EPD__ENVELOPE__BODY_QUIESCED:
        return env->quiesced->request_id;
    case EPD__ENVELOPE__BODY_TOKENS:
        return env->tokens->request_id;
    case EPD__ENVELOPE__BODY_ABORT:
        return env->abort->request_id;
    case EPD__ENVELOPE__BODY_ERROR:
        return env->error->request_id;
    case EPD__ENVELOPE__BODY_ENCODE:
        return env->encode->request_id;
    case EPD__ENVELOPE__BODY_EMBED_RESERVATION:
        return env->embed_reservation->request_id;
    case EPD__ENVELOPE__BODY_EMBED_COMPLETE:
        return env->embed_complete->request_id;
    case EPD__ENVELOPE__BODY_CLOCK_PROBE:
        return env->clock_probe->request_id;
    case EPD__ENVELOPE__BODY_CLOCK_REPLY:
        return env->clock_reply->request_id;
    case EPD__ENVELOPE__BODY_TRACE_FETCH:
        return env->trace_fetch->request_id;
    case EPD__ENVELOPE__BODY_TRACE_EVENTS:
        return env->trace_events->request_id;
    case EPD__ENVELOPE__BODY__NOT_SET:
    default:
        return 0;
    }
}

const char *epd_msg_body_name(const Epd__Envelope *env)
{
    switch (env->body_case) {
    case EPD__ENVELOPE__BODY_GENERATE:
        return "generate";
    case EPD__ENVELOPE__BODY_RESERVATION:
        return "reservation";
    case EPD__ENVELOPE__BODY_REFUSED:
        return "refused";
    case EPD__ENVELOPE__BODY_LAYER_DONE:
        return "layer_done";
    case EPD__ENVELOPE__BODY_PREFILL_COMPLETE:
        return "prefill_complete";
    case EPD__ENVELOPE__BODY_QUIESCED:
        return "quiesced";
    case EPD__ENVELOPE__BODY_TOKENS:
        return "tokens";
    case EPD__ENVELOPE__BODY_ABORT:
        return "abort";
    case EPD__ENVELOPE__BODY_ERROR:
        return "error";
    case EPD__ENVELOPE__BODY_ENCODE:
        return "encode";
    case EPD__ENVELOPE__BODY_EMBED_RESERVATION:
        return "embed_reservation";
    case EPD__ENVELOPE__BODY_EMBED_COMPLETE:
        return "embed_complete";
    case EPD__ENVELOPE__BODY_CLOCK_PROBE:
        return "clock_probe";
    case EPD__ENVELOPE__BODY_CLOCK_REPLY:
        return "clock_reply";
    case EPD__ENVELOPE__BODY_TRACE_FETCH:
        return "trace_fetch";
    case EPD__ENVELOPE__BODY_TRACE_EVENTS:
        return "trace_events";
    case EPD__ENVELOPE__BODY__NOT_SET:
    default:
        return "none";
    }
}

int epd_msg_epoch_cmp(const epd_msg_epoch_t *a, const epd_msg_epoch_t *b)
{
    if (a->start_time_ns != b->start_time_ns) {
        return a->start_time_ns < b->start_time_ns ? -1 : 1;
    }
    if (a->nonce != b->nonce) {
        return a->nonce < b->nonce ? -1 : 1;
    }
    return 0;
}

epd_msg_epoch_t epd_msg_epoch_of(const Epd__Epoch *e)
{
    epd_msg_epoch_t out = {0, 0};

    if (e != NULL) {
        out.start_time_ns = e->start_time_ns;
        out.nonce = e->nonce;
    }
    return out;
}

epd_status_t epd_msg_encode_body(const char *sender_id, const epd_msg_epoch_t *epoch,
                                 uint64_t seq, Epd__Envelope__BodyCase body_case, void *body,
                                 void *buf, size_t cap, size_t *len_p)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__SenderRef sender = EPD__SENDER_REF__INIT;
    Epd__Epoch ep = EPD__EPOCH__INIT;

    if (body == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    ep.start_time_ns = epoch->start_time_ns;
    ep.nonce = epoch->nonce;
    sender.worker_id = (char *)sender_id;
    sender.epoch = &ep;
    env.sender = &sender;
    env.seq = seq;
    env.body_case = body_case;
    switch (body_case) {
    case EPD__ENVELOPE__BODY_GENERATE:
        env.generate = body;
        break;
    case EPD__ENVELOPE__BODY_RESERVATION:
        env.reservation = body;
        break;
    case EPD__ENVELOPE__BODY_REFUSED:
        env.refused = body;
        break;
    case EPD__ENVELOPE__BODY_LAYER_DONE:
        env.layer_done = body;
        break;
    case EPD__ENVELOPE__BODY_PREFILL_COMPLETE:
        env.prefill_complete = body;
        break;
    case EPD__ENVELOPE__BODY_QUIESCED:
        env.quiesced = body;
        break;
    case EPD__ENVELOPE__BODY_TOKENS:
        env.tokens = body;
        break;
    case EPD__ENVELOPE__BODY_ABORT:
        env.abort = body;
        break;
    case EPD__ENVELOPE__BODY_ERROR:
        env.error = body;
        break;
    case EPD__ENVELOPE__BODY_ENCODE:
        env.encode = body;
        break;
    case EPD__ENVELOPE__BODY_EMBED_RESERVATION:
        env.embed_reservation = body;
        break;
    case EPD__ENVELOPE__BODY_EMBED_COMPLETE:
        env.embed_complete = body;
        break;
    case EPD__ENVELOPE__BODY_CLOCK_PROBE:
        env.clock_probe = body;
        break;
    case EPD__ENVELOPE__BODY_CLOCK_REPLY:
        env.clock_reply = body;
        break;
    case EPD__ENVELOPE__BODY_TRACE_FETCH:
        env.trace_fetch = body;
        break;
    case EPD__ENVELOPE__BODY_TRACE_EVENTS:
        env.trace_events = body;
        break;
    case EPD__ENVELOPE__BODY__NOT_SET:
    default:
        return EPD_ERR_INVALID_PARAM;
    }
    return epd_msg_encode(&env, buf, cap, len_p);
}

static epd_status_t epd_msg_refuse(const char **why_p, const char *why)
{
    if (why_p != NULL) {
        *why_p = why;
    }
    return EPD_ERR_MALFORMED;
}

epd_status_t epd_msg_decode(const void *buf, size_t len, Epd__Envelope **env_p,
                            const char **why_p)
{
    const unsigned char *p = buf;
    uint32_t body;
    Epd__Envelope *env;

    if (buf == NULL || len < EPD_MSG_HDR_SIZE) {
        return epd_msg_refuse(why_p, "frame shorter than its 24-byte header");
    }
    if (epd_msg_get32(p) != EPD_MSG_MAGIC) {
        return epd_msg_refuse(why_p, "bad magic: not an epd request-plane frame");
    }
    if (p[4] != EPD_MSG_VERSION || p[5] != 0) {
        return epd_msg_refuse(why_p, "unsupported frame version");
    }
    if (p[6] != 0 || p[7] != 0 || epd_msg_get32(p + 12) != 0) {
        return epd_msg_refuse(why_p, "reserved frame bits set");
    }
    body = epd_msg_get32(p + 8);
    if ((size_t)body != len - EPD_MSG_HDR_SIZE) {
        return epd_msg_refuse(why_p, (size_t)body > len - EPD_MSG_HDR_SIZE
                                         ? "truncated frame: shorter than its header says"
                                         : "trailing bytes after the frame body");
    }
    if (epd_hash64(p + EPD_MSG_HDR_SIZE, body, 0) != epd_msg_get64(p + 16)) {
        return epd_msg_refuse(why_p, "frame checksum mismatch");
    }
    env = epd__envelope__unpack(&epd_proto_allocator, body, p + EPD_MSG_HDR_SIZE);
    if (env == NULL) {
        return epd_msg_refuse(why_p, "body is not a valid epd.Envelope");
    }
    if (env->sender == NULL || env->sender->worker_id == NULL ||
        env->sender->worker_id[0] == '\0' || env->sender->epoch == NULL) {
        epd__envelope__free_unpacked(env, &epd_proto_allocator);
        return epd_msg_refuse(why_p, "envelope without sender identity and epoch");
    }
    if (env->body_case == EPD__ENVELOPE__BODY__NOT_SET) {
        epd__envelope__free_unpacked(env, &epd_proto_allocator);
        return epd_msg_refuse(why_p, "envelope without a body");
    }
    if (epd_msg_request_id(env) == 0) {
        epd__envelope__free_unpacked(env, &epd_proto_allocator);
        return epd_msg_refuse(why_p, "message without a request id");
    }
    *env_p = env;
    return EPD_OK;
}

void epd_msg_free(Epd__Envelope *env)
{
    if (env != NULL) {
        epd__envelope__free_unpacked(env, &epd_proto_allocator);
    }
}

epd_status_t epd_proto_unpack(const ProtobufCMessageDescriptor *desc, const void *buf,
                              size_t len, ProtobufCMessage **msg_p)
{
    ProtobufCMessage *msg = protobuf_c_message_unpack(desc, &epd_proto_allocator, len, buf);

    if (msg == NULL) {
        return EPD_ERR_MALFORMED;
    }
    *msg_p = msg;
    return EPD_OK;
}

void epd_proto_free(ProtobufCMessage *msg)
{
    if (msg != NULL) {
        protobuf_c_message_free_unpacked(msg, &epd_proto_allocator);
    }
}

int epd_proto_answer(const ProtobufCMessage *msg, void **resp_p, size_t *resp_len_p, char *err,
                     size_t err_cap)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    void *buf = epd_malloc(n > 0 ? n : 1);

    if (buf == NULL) {
        snprintf(err, err_cap, "out of memory");
        return EPD_RPC_INTERNAL;
    }
    protobuf_c_message_pack(msg, buf);
    *resp_p = buf;
    *resp_len_p = n;
    return EPD_RPC_OK;
}
