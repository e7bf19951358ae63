/*
 * libFuzzer target for the control plane's handling of untrusted bytes:
 *
 *   byte 0 even — a session of up to 16 calls, each [op][len: le16][body],
 *     op: bits 0-2 the method (mod 6), 0x80 the client cannot connect the
 *     worker, 0x40 a registry tick ((op >> 3 & 7) x 2 s later) after the call:
 *     every body is unpacked as every epd.Control message type, then handed
 *     to the router's own handlers (router/epd_router_rpc.c, linked in with
 *     the registry) under the method the first byte picks, against one
 *     router per input — so RegisterWorker, then a Heartbeat or a Drain of
 *     what was registered, a new epoch under the same id, Status over the
 *     result, are all reachable.  An answer OK must unpack as its method's
 *     response type.
 *   byte 0 odd — the x-epd-auth check (proto/epd_rpc_auth.c):
 *     [method][now: le64][value length][value][body]: the fuzzed value is
 *     checked (never accepted: the fuzzer has no key); then a value signed
 *     for the same call must pass once, fail as a replay, and fail for any
 *     other body.
 *
 * What is not real here: the request-plane client the router connects a
 * registered worker with (epd_client_add_worker_info: stubbed, its address
 * parsing has fuzz targets of its own per transport — fails when the method
 * byte's top bit is set), the daemon runtime (its worker id and secret:
 * stubbed), and the forwarding of a Drain to the worker (a real gRPC call to
 * a fuzzed address: every registered worker's control address is cleared
 * after each call, so the forward is never queued).  `make fuzz`.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_msg.h"
#include "epd_router_int.h"
#include "epd_rpc.h"
#include "epd_time.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ------------------------------------------------ stand-ins (see above) */

static int fuzz_add_fails;
static char fuzz_cw; /* what a stubbed client worker points to */

epd_status_t epd_client_add_worker_info(epd_client_t *client, const epd_client_worker_info_t *info,
                                        epd_client_worker_t **worker_p)
{
    (void)client;
    if (fuzz_add_fails || info->address_len == 0) {
        return EPD_ERR_BAD_ADDRESS;
    }
    *worker_p = (epd_client_worker_t *)(void *)&fuzz_cw;
    return EPD_OK;
}

epd_status_t epd_client_worker_state(const epd_client_worker_t *worker)
{
    (void)worker;
    return EPD_OK;
}

void epd_client_worker_link(epd_client_worker_t *worker, char *buf, size_t len)
{
    (void)worker;
    snprintf(buf, len, "tcp: fuzz");
}

const char *epd_daemon_worker_id(const epd_daemon_t *d)
{
    (void)d;
    return "router-fuzz";
}

void epd_daemon_secret(const epd_daemon_t *d, const void **secret_p, size_t *len_p)
{
    (void)d;
    *secret_p = NULL;
    *len_p = 0;
}

/* ---------------------------------------------------------- the router */

static const char *const fuzz_methods[] = {
    EPD_RPC_REGISTER, EPD_RPC_HEARTBEAT, EPD_RPC_DRAIN,
    EPD_RPC_STATUS,   EPD_RPC_HEALTH,    "/epd.Control/Nope",
};
#define FUZZ_N_METHODS (sizeof(fuzz_methods) / sizeof(fuzz_methods[0]))

/* the response type of each method (NULL: no answer OK expected) */
static const ProtobufCMessageDescriptor *const fuzz_answers[FUZZ_N_METHODS] = {
    &epd__register_response__descriptor, &epd__heartbeat_response__descriptor,
    &epd__drain_response__descriptor,    &epd__status_response__descriptor,
    &epd__health_response__descriptor,   NULL,
};

static const ProtobufCMessageDescriptor *const fuzz_types[] = {
    &epd__register_request__descriptor,  &epd__register_response__descriptor,
    &epd__heartbeat_request__descriptor, &epd__heartbeat_response__descriptor,
    &epd__drain_request__descriptor,     &epd__drain_response__descriptor,
    &epd__status_request__descriptor,    &epd__status_response__descriptor,
    &epd__health_request__descriptor,    &epd__health_response__descriptor,
};

/* The model the router serves: what a registration must match (the seeds
 * in tests/fuzz/corpus/fuzz_epd_control match it). */
static void fuzz_router_init(epd_router_t *rt, epd_engine_info_t *info)
{
    memset(info, 0, sizeof(*info));
    info->kv.n_layers = 2;
    info->kv.block_tokens = 16;
    info->kv.n_kv_heads = 2;
    info->kv.head_dim = 16;
    info->image_embeddings = 4;
    info->embed_dim = 64;
    memset(rt, 0, sizeof(*rt));
    rt->info = info;
    rt->transport = "ucx";
    snprintf(rt->model_name, sizeof(rt->model_name), "tiny");
    rt->heartbeat_ms = 500;
    rt->dead_after_ms = 3000;
    rt->epoch.start_time_ns = 1;
    rt->epoch.nonce = 2;
    epd_router_registry_init(&rt->reg, EPD_ROUTER_POLICY_LEAST_LOAD, rt->dead_after_ms);
}

static void fuzz_session(const uint8_t *data, size_t size)
{
    static const unsigned char empty = 0;
    epd_engine_info_t info;
    epd_router_t rt;
    size_t off = 0;

    fuzz_router_init(&rt, &info);
    for (int n = 0; n < 16 && off + 3 <= size; n++) {
        uint8_t m = data[off];
        size_t len = (size_t)data[off + 1] | (size_t)data[off + 2] << 8;
        const uint8_t *body = data + off + 3;
        size_t k = (size_t)(m & 7) % FUZZ_N_METHODS;
        void *resp = NULL;
        size_t resp_len = 0;
        char err[256];
        int rc;

        off += 3;
        if (len > size - off) {
            len = size - off;
        }
        off += len;
        for (size_t t = 0; t < sizeof(fuzz_types) / sizeof(fuzz_types[0]); t++) {
            ProtobufCMessage *msg = NULL;

            if (epd_proto_unpack(fuzz_types[t], len > 0 ? body : &empty, len, &msg) == EPD_OK) {
                epd_proto_free(msg);
            }
        }
        fuzz_add_fails = (m & 0x80) != 0;
        err[0] = '\0';
        rc = epd__router_on_rpc(&rt, fuzz_methods[k], len > 0 ? body : NULL, len, &resp, &resp_len,
                                err, sizeof(err));
        if (rc == EPD_RPC_OK) {
            ProtobufCMessage *msg = NULL;

            if (fuzz_answers[k] == NULL ||
                epd_proto_unpack(fuzz_answers[k], resp_len > 0 ? resp : &empty, resp_len, &msg) !=
                    EPD_OK) {
                abort(); /* an OK answer that is not its method's response */
            }
            epd_proto_free(msg);
        } else if (err[0] == '\0' || memchr(err, '\0', sizeof(err)) == NULL) {
            abort(); /* a refusal says why */
        }
        epd_free(resp);
        /* never a real gRPC call to a fuzzed address (see the top) */
        for (epd_router_worker_t *w = rt.reg.workers; w != NULL; w = w->next) {
            w->control_addr[0] = '\0';
        }
        if (m & 0x40) {
            uint32_t died = 0;

            epd_router_registry_tick(
                &rt.reg, epd_time_now_ns() + (uint64_t)((m >> 3) & 7) * 2 * EPD_NSEC_PER_SEC,
                &died);
        }
    }
    epd_router_registry_cleanup(&rt.reg);
}

/* ------------------------------------------------------ x-epd-auth check */

#define FUZZ_SECRET "fuzz-cluster-secret-0123456789"

static void fuzz_auth(const uint8_t *data, size_t size)
{
    char value[EPD_RPC_AUTH_VALUE_MAX];
    const char *method;
    const char *why = NULL;
    epd_rpc_auth_t *auth = NULL;
    const uint8_t *body;
    uint64_t now = 0;
    size_t vlen, blen;
    epd_status_t st;
    unsigned char *other;

    if (size < 10) {
        return;
    }
    method = fuzz_methods[data[0] % FUZZ_N_METHODS];
    for (int i = 0; i < 8; i++) {
        now |= (uint64_t)data[1 + i] << (8 * i);
    }
    vlen = data[9];
    if (vlen > size - 10) {
        vlen = size - 10;
    }
    body = data + 10 + vlen;
    blen = size - 10 - vlen;
    if (epd_rpc_auth_create(FUZZ_SECRET, strlen(FUZZ_SECRET), 4, &auth) != EPD_OK) {
        abort();
    }
    st = epd_rpc_auth_check(auth, method, body, blen, (const char *)data + 10, vlen, now, &why);
    if (st != EPD_ERR_AUTH || why == NULL) {
        abort(); /* the fuzzer has no key: nothing it writes may pass */
    }
    /* a signed value passes once, then is a replay; another body fails */
    if (epd_rpc_auth_sign(auth, method, body, blen, now, value, sizeof(value)) != EPD_OK ||
        epd_rpc_auth_check(auth, method, body, blen, value, strlen(value), now, &why) != EPD_OK ||
        epd_rpc_auth_check(auth, method, body, blen, value, strlen(value), now, &why) !=
            EPD_ERR_AUTH) {
        abort();
    }
    other = malloc(blen + 1);
    if (other != NULL) {
        memcpy(other, body, blen);
        other[blen] = 0x5a;
        /* one byte more */
        if (epd_rpc_auth_check(auth, method, other, blen + 1, value, strlen(value), now, &why) !=
            EPD_ERR_AUTH) {
            abort();
        }
        if (blen > 0) {
            other[0] ^= 1; /* one bit other */
            if (epd_rpc_auth_check(auth, method, other, blen, value, strlen(value), now, &why) !=
                EPD_ERR_AUTH) {
                abort();
            }
        }
        free(other);
    }
    epd_rpc_auth_destroy(auth);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;

    if (!quiet) {
        quiet = 1;
        epd_log_set_level(EPD_LOG_ERROR); /* refusals are logged: millions of them */
    }
    if (size == 0) {
        return 0;
    }
    if (data[0] & 1) {
        fuzz_auth(data + 1, size - 1);
    } else {
        fuzz_session(data + 1, size - 1);
    }
    return 0;
}
