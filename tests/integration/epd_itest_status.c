/*
 * epd_itest_status.c — a worker's load from its Status (epd_itest_status.h).
 */
#include "epd_itest_status.h"

#include <string.h>

#include "epd_alloc.h"
#include "epd_msg.h"
#include "epd_rpc.h"

int epd_itest_load(const char *addr, epd_itest_load_t *load_p)
{
    static const unsigned char empty = 0;
    epd_rpc_client_t *rpc = NULL;
    ProtobufCMessage *msg = NULL;
    Epd__StatusResponse *st;
    void *resp = NULL;
    size_t len = 0;
    int rc = -1;

    if (epd_rpc_client_create(addr, &rpc) != EPD_OK) {
        return -1;
    }
    if (epd_rpc_call(rpc, EPD_RPC_STATUS, NULL, 0, 3000, &resp, &len, NULL, 0) != EPD_OK ||
        epd_proto_unpack(&epd__status_response__descriptor, len > 0 ? resp : &empty, len, &msg) !=
            EPD_OK) {
        goto out;
    }
    st = (Epd__StatusResponse *)msg;
    if (st->n_workers < 1 || st->workers[0]->load == NULL || st->workers[0]->capacity == NULL) {
        goto out;
    }
    memset(load_p, 0, sizeof(*load_p));
    load_p->kv_blocks_free = st->workers[0]->load->kv_blocks_free;
    load_p->kv_blocks_total = st->workers[0]->capacity->kv_blocks_total;
    load_p->state_slots_free = st->workers[0]->load->state_slots_free;
    load_p->state_slots_total = st->workers[0]->capacity->state_slots_total;
    load_p->running_requests = st->workers[0]->load->running_requests;
    load_p->quarantined = st->workers[0]->load->quarantined;
    rc = 0;
out:
    epd_proto_free(msg);
    epd_free(resp);
    epd_rpc_client_destroy(rpc);
    return rc;
}
