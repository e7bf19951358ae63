/*
 * epd_msg.h — request-plane frames and protobuf-c glue.
 *
 * Every request-plane message is one epd.Envelope (epd_request.proto) in a
 * frame:
 *
 *   offset 0   u32 magic "EPDM"     (little endian, as every field)
 *          4   u16 version (1)
 *          6   u16 flags (0)
 *          8   u32 body length      (bytes after the 24-byte header)
 *         12   u32 reserved (0)
 *         16   u64 xxh3-64 of the body
 *         24   body: the packed Envelope
 *
 * Protobuf alone cannot tell a truncated message from a shorter valid one
 * (cutting at a field boundary leaves valid bytes), and the request plane
 * must refuse both truncation and corruption: the length and checksum do.
 * Decoding also checks that the envelope names its sender (worker id and
 * epoch) and carries exactly one body with a nonzero request id.
 *
 * All protobuf-c allocation goes through epd_proto_allocator, i.e. the
 * epd_malloc funnel, so fault injection and byte counts cover it.
 * Any thread; no shared state.
 */
#ifndef EPD_MSG_H
#define EPD_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "epd_common.pb-c.h"
#include "epd_control.pb-c.h"
#include "epd_request.pb-c.h"
#include "epd_sample.h"
#include "epd_status.h"

#define EPD_MSG_MAGIC 0x4d445045u /* "EPDM" */
#define EPD_MSG_VERSION 1u
#define EPD_MSG_HDR_SIZE 24u

/* gRPC method paths of the control service (epd_control.proto). */
#define EPD_RPC_REGISTER "/epd.Control/RegisterWorker"
#define EPD_RPC_HEARTBEAT "/epd.Control/Heartbeat"
#define EPD_RPC_DRAIN "/epd.Control/Drain"
#define EPD_RPC_STATUS "/epd.Control/Status"
#define EPD_RPC_HEALTH "/epd.Control/Health"
/* gRPC's standard health service (epd_grpc_health.proto), for orchestrators'
 * probes: Check is served, Watch answers UNIMPLEMENTED. */
#define EPD_RPC_GRPC_HEALTH_CHECK "/grpc.health.v1.Health/Check"
#define EPD_RPC_GRPC_HEALTH_WATCH "/grpc.health.v1.Health/Watch"

/* The request-plane message size (a transport's max_msg_size) that holds
 * a prompt of `max_context` tokens: a GenerateRequest carries the whole
 * prompt (decode's resume, prompt + output), at most 5 bytes a token (a
 * uint32 varint), plus 64 KiB for the rest; never under 64 KiB (the
 * default) nor over 16 MiB (the transport's limit).  A flat 64 KiB
 * refused prompts from about 30k tokens on (issue #25).  Both ends of a
 * message must allow it: the sender's buffer, the receiver's check. */
static inline size_t epd_msg_cap_for_context(uint64_t max_context)
{
    uint64_t cap = ((uint64_t)64 << 10) + 5 * max_context;

    return cap > ((uint64_t)16 << 20) ? (size_t)16 << 20 : (size_t)cap;
}

/* protobuf-c allocator backed by epd_malloc/epd_free. */
extern ProtobufCAllocator epd_proto_allocator;

/* Bytes epd_msg_encode will produce for `env`. */
size_t epd_msg_encoded_size(const Epd__Envelope *env);

/*
 * Encodes `env` (borrowed) as a frame into buf[0..cap).  *len_p gets the
 * frame length.  EPD_ERR_TOO_LONG when cap is too small (nothing useful
 * written), EPD_ERR_INVALID_PARAM when env has no body.
 */
epd_status_t epd_msg_encode(const Epd__Envelope *env, void *buf, size_t cap, size_t *len_p);

/*
 * Decodes and validates a frame.  On success *env_p is a new envelope owned
 * by the caller (epd_msg_free).  On failure returns EPD_ERR_MALFORMED (or
 * EPD_ERR_NO_MEMORY) and, when why_p is not NULL, a static string saying
 * exactly what was wrong ("truncated frame: 10 bytes, header says 40").
 */
epd_status_t epd_msg_decode(const void *buf, size_t len, Epd__Envelope **env_p,
                            const char **why_p);

/* Frees an envelope from epd_msg_decode.  NULL is a no-op. */
void epd_msg_free(Epd__Envelope *env);

/* The request id of whichever body `env` carries (0 when none). */
uint64_t epd_msg_request_id(const Epd__Envelope *env);

/* A short name of the body case ("reservation"), for logs. */
const char *epd_msg_body_name(const Epd__Envelope *env);

/* A worker incarnation's epoch as a value (epd.Epoch on the wire). */
typedef struct {
    uint64_t start_time_ns;
    uint64_t nonce;
} epd_msg_epoch_t;

/* -1, 0, 1 as a is older than, equal to, newer than b. */
int epd_msg_epoch_cmp(const epd_msg_epoch_t *a, const epd_msg_epoch_t *b);

/* The value of a wire Epoch (NULL: {0, 0}, older than any real one). */
epd_msg_epoch_t epd_msg_epoch_of(const Epd__Epoch *e);

/*
 * Encodes one message from worker `sender_id` of `epoch` with sequence
 * number `seq`: `body` (borrowed, of kind body_case) in an Envelope, framed
 * into buf[0..cap) as epd_msg_encode does.  EPD_ERR_INVALID_PARAM for no
 * body or an unknown kind, EPD_ERR_TOO_LONG when cap is too small.
 */
epd_status_t epd_msg_encode_body(const char *sender_id, const epd_msg_epoch_t *epoch,
                                 uint64_t seq, Epd__Envelope__BodyCase body_case, void *body,
                                 void *buf, size_t cap, size_t *len_p);

/*
 * Control plane helpers (gRPC payloads are plain packed messages; gRPC
 * itself frames and checks them).  epd_proto_unpack returns a message owned
 * by the caller (epd_proto_free), or EPD_ERR_MALFORMED.
 */
epd_status_t epd_proto_unpack(const ProtobufCMessageDescriptor *desc, const void *buf,
                              size_t len, ProtobufCMessage **msg_p);
void epd_proto_free(ProtobufCMessage *msg);

/*
 * A gRPC handler's answer (epd_rpc_handler_cb_t): packs `msg` into a buffer
 * from epd_malloc for *resp_p (taken by the server) and returns
 * EPD_RPC_OK, or EPD_RPC_INTERNAL with "out of memory" in err.
 */
int epd_proto_answer(const ProtobufCMessage *msg, void **resp_p, size_t *resp_len_p, char *err,
                     size_t err_cap);

/* The logit adjustments of a request's SamplingParams (fields 7..13;
 * absent: none) checked for a vocabulary of `vocab` ids and copied into
 * *sp (its other fields untouched): EPD_OK, or EPD_ERR_INVALID_PARAM with
 * msg[0..cap) saying why (a penalty out of range, a bias id >= vocab or
 * value outside [-100, 100], more than EPD_SAMPLE_MAX_BIAS biases, ids
 * and values of different counts).  Any thread. */
/* A TokenLogprob message viewing *lp (borrowed: msg points into it). */
void epd_token_logprob_view(const epd_sample_logprob_t *lp, Epd__TokenLogprob *msg);
/* A received TokenLogprob into *lp, its ids checked against `vocab`:
 * 0, or -1 for a malformed one. */
int epd_token_logprob_read(const Epd__TokenLogprob *msg, uint32_t vocab, epd_sample_logprob_t *lp);

epd_status_t epd_sample_params_from_msg(const Epd__SamplingParams *s, uint32_t vocab,
                                        epd_sample_params_t *sp, char *msg, size_t cap);

#endif
