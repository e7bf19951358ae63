/*
 * epd_itest_ctlreplay.c — `epd-itest-ctlreplay`: a control-plane call sent,
 * its x-epd-auth metadata printed as an eavesdropper would capture it, then
 * the identical call (same body, same metadata) sent again — the replay a
 * server must refuse (tests/integration/test_control_auth.sh).
 *
 *   epd-itest-ctlreplay drain ROUTER WORKER_ID [--secret-file F]
 *       Drain(WORKER_ID) to the router.
 *   epd-itest-ctlreplay register ROUTER WORKER_CONTROL [--secret-file F] [--new-epoch]
 *       The RegisterWorker the worker at WORKER_CONTROL sends, rebuilt from
 *       its Health answer (open to anyone): identity, epoch, transport,
 *       data-plane address, capacity and layout.  --new-epoch claims a new
 *       incarnation under the worker's id (what took a live worker's traffic
 *       before calls were authenticated).
 *
 * Without --secret-file the calls carry no metadata.  Prints
 *   sent: <the x-epd-auth value, or (none)>
 *   first: <epd status name> <detail>
 *   replay: <epd status name> <detail>
 * and exits 0 once both calls were made (the script judges the answers);
 * 2 on a usage or set-up error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_msg.h"
#include "epd_rpc.h"
#include "epd_secret.h"
#include "epd_time.h"

#define REPLAY_TIMEOUT_MS 5000

static int replay_usage(void)
{
    fprintf(stderr, "usage: epd-itest-ctlreplay drain ROUTER WORKER_ID [--secret-file F]\n"
                    "       epd-itest-ctlreplay register ROUTER WORKER_CONTROL [--secret-file F] "
                    "[--new-epoch]\n");
    return 2;
}

/* The answer of one call, as one line. */
static void replay_print(const char *what, const char *method, epd_status_t st, void *resp,
                         size_t len, const char *err)
{
    static const unsigned char empty = 0;
    ProtobufCMessage *m = NULL;

    printf("%s: %s", what, epd_status_name(st));
    if (st != EPD_OK) {
        printf(" %s\n", err);
        return;
    }
    if (strcmp(method, EPD_RPC_REGISTER) == 0 &&
        epd_proto_unpack(&epd__register_response__descriptor, len > 0 ? resp : &empty, len, &m) ==
            EPD_OK) {
        const Epd__RegisterResponse *r = (const Epd__RegisterResponse *)m;

        printf(" accepted=%d reason=%s\n", r->accepted, r->reason);
    } else if (strcmp(method, EPD_RPC_DRAIN) == 0 &&
               epd_proto_unpack(&epd__drain_response__descriptor, len > 0 ? resp : &empty, len,
                                &m) == EPD_OK) {
        printf(" ok=%d\n", ((const Epd__DrainResponse *)m)->ok);
    } else {
        printf(" (undecodable answer)\n");
    }
    epd_proto_free(m);
}

/* The worker's RegisterRequest, from its Health; 0 on success. */
static int replay_register_body(const char *control, int new_epoch, void **body_p, size_t *len_p)
{
    Epd__RegisterRequest r = EPD__REGISTER_REQUEST__INIT;
    epd_rpc_client_t *c = NULL;
    ProtobufCMessage *m = NULL;
    Epd__HealthResponse *h;
    void *resp = NULL;
    size_t len = 0;
    char err[256] = "";
    epd_status_t st;

    if (epd_rpc_client_create(control, &c) != EPD_OK) {
        return -1;
    }
    st = epd_rpc_call(c, EPD_RPC_HEALTH, NULL, 0, REPLAY_TIMEOUT_MS, &resp, &len, err, sizeof(err));
    epd_rpc_client_destroy(c);
    if (st != EPD_OK || epd_proto_unpack(&epd__health_response__descriptor,
                                         len > 0 ? resp : (const void *)err, len, &m) != EPD_OK) {
        fprintf(stderr, "epd-itest-ctlreplay: Health of %s: %s %s\n", control, epd_status_name(st),
                err);
        epd_free(resp);
        return -1;
    }
    epd_free(resp);
    h = (Epd__HealthResponse *)m;
    if (h->worker == NULL || h->worker->epoch == NULL) {
        epd_proto_free(m);
        return -1;
    }
    if (new_epoch) {
        h->worker->epoch->start_time_ns = epd_time_wall_ns();
        h->worker->epoch->nonce ^= 0x5eed;
    }
    r.worker = h->worker;
    r.transport = h->transport;
    r.data_plane_address = h->data_plane_address;
    r.control_address = (char *)control;
    r.capacity = h->capacity;
    r.kv_layout = h->kv_layout;
    len = protobuf_c_message_get_packed_size(&r.base);
    *body_p = epd_malloc(len > 0 ? len : 1);
    if (*body_p == NULL) {
        epd_proto_free(m);
        return -1;
    }
    protobuf_c_message_pack(&r.base, *body_p);
    *len_p = len;
    epd_proto_free(m);
    return 0;
}

int main(int argc, char **argv)
{
    const char *secret_file = NULL;
    const char *method;
    int new_epoch = 0;
    epd_secret_t secret;
    epd_rpc_auth_t *auth = NULL;
    epd_rpc_client_t *c = NULL;
    char value[EPD_RPC_AUTH_VALUE_MAX];
    void *body = NULL;
    size_t body_len = 0;
    int rc = 2;

    memset(&secret, 0, sizeof(secret));
    if (argc < 4) {
        return replay_usage();
    }
    for (int i = 4; i < argc; i++) {
        if (strcmp(argv[i], "--secret-file") == 0 && i + 1 < argc) {
            secret_file = argv[++i];
        } else if (strcmp(argv[i], "--new-epoch") == 0) {
            new_epoch = 1;
        } else {
            return replay_usage();
        }
    }
    if (secret_file != NULL) {
        char why[256] = "cannot make a key of it";

        if (epd_secret_load(secret_file, &secret, why, sizeof(why)) != EPD_OK ||
            epd_rpc_auth_create(secret.bytes, secret.len, 0, &auth) != EPD_OK) {
            fprintf(stderr, "epd-itest-ctlreplay: --secret-file %s: %s\n", secret_file, why);
            goto out;
        }
    }
    if (strcmp(argv[1], "drain") == 0) {
        Epd__DrainRequest d = EPD__DRAIN_REQUEST__INIT;

        method = EPD_RPC_DRAIN;
        d.worker_id = argv[3];
        body_len = epd__drain_request__get_packed_size(&d);
        body = epd_malloc(body_len + 1);
        if (body == NULL) {
            goto out;
        }
        epd__drain_request__pack(&d, body);
    } else if (strcmp(argv[1], "register") == 0) {
        method = EPD_RPC_REGISTER;
        if (replay_register_body(argv[3], new_epoch, &body, &body_len) != 0) {
            goto out;
        }
    } else {
        rc = replay_usage();
        goto out;
    }
    if (epd_rpc_client_create(argv[2], &c) != EPD_OK) {
        goto out;
    }
    if (auth != NULL) {
        epd_rpc_auth_sign(auth, method, body, body_len, epd_time_wall_ns() / EPD_NSEC_PER_MSEC,
                          value, sizeof(value));
    }
    printf("sent: %s\n", auth != NULL ? value : "(none)");
    for (int i = 0; i < 2; i++) {
        void *resp = NULL;
        size_t len = 0;
        char err[256] = "";
        epd_status_t st =
            epd_rpc_call_with_auth(c, method, body, body_len, auth != NULL ? value : NULL,
                                   REPLAY_TIMEOUT_MS, &resp, &len, err, sizeof(err));

        replay_print(i == 0 ? "first" : "replay", method, st, resp, len, err);
        epd_free(resp);
    }
    fflush(stdout);
    rc = 0;
out:
    epd_rpc_client_destroy(c);
    epd_rpc_auth_destroy(auth);
    epd_secret_wipe(&secret);
    epd_free(body);
    return rc;
}
