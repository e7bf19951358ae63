/*
 * epd_bench_overhead_req.c — the request plane of `epd-bench overhead`:
 * the client transport's callbacks, the GenerateRequest of each arm (A:
 * prefill_only to prefill; B: to decode, then prefill; Z: the same with
 * protocol_only), and one request waited to its end and recorded in
 * b->reqs (its times come later, from the traces).  Both modes use it
 * (epd_bench_overhead_cluster.c, epd_bench_overhead_attach.c).  One thread:
 * the benchmark's; every callback runs inside its epd_xport_poll.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "epd_alloc.h"
#include "epd_bench_overhead_int.h"
#include "epd_msg.h"
#include "epd_time.h"
#include "epd_xport.h"

/* ------------------------------------------------------- request plane */

void epd__ob_on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    ob_t *b = arg;
    Epd__Envelope *env = NULL;
    const char *why = NULL;

    (void)ep;
    if (epd_msg_decode(data, len, &env, &why) != EPD_OK) {
        return;
    }
    if (epd_msg_request_id(env) == b->waiting_id && !b->waiting_done) {
        switch (env->body_case) {
        case EPD__ENVELOPE__BODY_TOKENS:
            if (env->tokens->finish != EPD__FINISH_REASON__FINISH_NONE) {
                b->waiting_done = 1;
                b->waiting_status = env->tokens->finish == EPD__FINISH_REASON__FINISH_LENGTH ||
                                            env->tokens->finish == EPD__FINISH_REASON__FINISH_STOP
                                        ? EPD_OK
                                        : EPD_ERR_CANCELED;
            }
            break;
        case EPD__ENVELOPE__BODY_ERROR:
            b->waiting_done = 1;
            b->waiting_status = env->error->status < 0 ? env->error->status : EPD_ERR_FATAL;
            snprintf(b->waiting_msg, sizeof(b->waiting_msg), "%s: %s", env->sender->worker_id,
                     env->error->message != NULL ? env->error->message : "");
            break;
        case EPD__ENVELOPE__BODY_REFUSED:
            b->waiting_done = 1;
            b->waiting_status = EPD_ERR_NO_CAPACITY;
            snprintf(b->waiting_msg, sizeof(b->waiting_msg), "refused: %s",
                     env->refused->reason != NULL ? env->refused->reason : "");
            break;
        default:
            break;
        }
    }
    epd_msg_free(env);
}

void epd__ob_on_err(void *arg, epd_xport_ep_t *ep, epd_status_t status)
{
    ob_t *b = arg;

    (void)ep;
    if (!b->waiting_done && b->waiting_id != 0) {
        b->waiting_done = 1;
        b->waiting_status = status;
        snprintf(b->waiting_msg, sizeof(b->waiting_msg), "endpoint failed: %s",
                 epd_status_string(status));
    }
}

void epd__ob_on_connect(void *arg, epd_status_t status)
{
    ob_t *b = arg;

    if (status == EPD_OK) {
        b->n_connected++;
    } else {
        b->connect_failed = 1;
    }
}

static epd_status_t ob_send_generate(ob_t *b, epd_xport_ep_t *ep, const uint32_t *tokens,
                                     uint32_t n, uint64_t id, int arm)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__SenderRef sender = EPD__SENDER_REF__INIT;
    Epd__Epoch me = EPD__EPOCH__INIT, pe = EPD__EPOCH__INIT, de = EPD__EPOCH__INIT;
    Epd__GenerateRequest g = EPD__GENERATE_REQUEST__INIT;
    Epd__SamplingParams sp = EPD__SAMPLING_PARAMS__INIT;
    char wid[64];
    size_t len;
    epd_status_t st;

    snprintf(wid, sizeof(wid), "bench-overhead-%d", (int)getpid());
    me.start_time_ns = b->epoch_start;
    me.nonce = b->epoch_nonce;
    sender.worker_id = wid;
    sender.epoch = &me;
    env.sender = &sender;
    env.seq = ++b->seq;
    sp.temperature = 0.0f;
    sp.top_p = 1.0f;
    sp.seed = 1;
    sp.max_tokens = 2; /* decode runs exactly one step after the KV is held */
    g.request_id = id;
    g.prompt_tokens = (uint32_t *)tokens;
    g.n_prompt_tokens = n;
    g.sampling = &sp;
    g.prefill_worker_id = b->pi.worker_id;
    pe.start_time_ns = b->pi.epoch_start_ns;
    pe.nonce = b->pi.epoch_nonce;
    g.prefill_epoch = &pe;
    g.prefill_address.data = b->pi.address;
    g.prefill_address.len = b->pi.address_len;
    g.prefill_only = arm == OB_ARM_A;
    g.protocol_only = arm == OB_ARM_Z;
    if (arm != OB_ARM_A) {
        g.decode_worker_id = b->di.worker_id;
        de.start_time_ns = b->di.epoch_start_ns;
        de.nonce = b->di.epoch_nonce;
        g.decode_epoch = &de;
        g.decode_address.data = b->di.address;
        g.decode_address.len = b->di.address_len;
    }
    g.deadline_ms = 120000;
    if (b->attach) {
        /* the daemons' prefix caches are their operator's to configure: a
         * salt per request (rule 35) has every arm compute its whole prompt */
        g.cache_salt.data = (uint8_t *)&id;
        g.cache_salt.len = sizeof(id);
    }
    env.body_case = EPD__ENVELOPE__BODY_GENERATE;
    env.generate = &g;
    st = epd_msg_encode(&env, b->txbuf, OB_TXBUF, &len);
    if (st != EPD_OK) {
        return st;
    }
    for (int tries = 0; tries < 10000; tries++) {
        st = epd_xport_send(ep, b->txbuf, len, 0);
        if (st != EPD_ERR_NO_RESOURCE) {
            return st;
        }
        epd_xport_progress(b->x);
    }
    return st;
}

/* ------------------------------------------------------------- requests */

/* One request, to completion (the client's view; times come from the
 * traces).  0 or -1 (logged). */
int epd__ob_request(ob_t *b, const uint32_t *tokens, uint32_t n, int arm, int rep, int warmup,
                    int li)
{
    uint64_t id = b->next_id++;
    uint64_t end;
    epd_status_t st;
    ob_req_t *r;

    if (b->n_reqs >= OB_MAX_REQS) {
        fprintf(stderr, "overhead: too many requests in one configuration\n");
        return -1;
    }
    b->waiting_id = id;
    b->waiting_done = 0;
    b->waiting_status = EPD_OK;
    b->waiting_msg[0] = '\0';
    if (b->cpu) {
        epd__ob_cpu_account(b, 0, li, -1);
        epd__ob_cpu_account(b, 1, li, -1);
    }
    if (arm != OB_ARM_A) {
        st = ob_send_generate(b, b->ep_d, tokens, n, id, arm);
        if (st == EPD_OK) {
            st = ob_send_generate(b, b->ep_p, tokens, n, id, arm);
        }
    } else {
        st = ob_send_generate(b, b->ep_p, tokens, n, id, arm);
    }
    if (st != EPD_OK) {
        fprintf(stderr, "overhead: sending request %llu: %s\n", (unsigned long long)id,
                epd_status_string(st));
        return -1;
    }
    end = epd_time_now_ns() + 30ull * 1000000000ull;
    while (!b->waiting_done && epd_time_now_ns() < end) {
        epd_xport_poll(b->x, 5);
    }
    b->waiting_id = 0;
    if (!b->waiting_done || b->waiting_status != EPD_OK) {
        fprintf(stderr, "overhead: request %llu (%u tokens, %s) failed: %s %s\n",
                (unsigned long long)id, n, ob_arm_name(arm),
                b->waiting_done ? epd_status_string(b->waiting_status) : "no answer in 30 s",
                b->waiting_msg);
        return -1;
    }
    if (b->cpu && !warmup) {
        /* both daemons are idle again: the client had its answer, and
         * prefill answers A last; B's and Z's last work is decode's */
        epd__ob_cpu_account(b, 0, li, arm);
        epd__ob_cpu_account(b, 1, li, arm);
        b->cpu_reqs[li][arm]++;
    }
    r = &b->reqs[b->n_reqs];
    memset(r, 0, sizeof(*r));
    r->ld_sent = epd_calloc((size_t)b->kv.n_layers * 2 + 1, sizeof(double));
    if (r->ld_sent == NULL) {
        return -1;
    }
    r->ld_rx = r->ld_sent + b->kv.n_layers;
    b->n_reqs++;
    r->id = id;
    r->n_tokens = n;
    r->arm = arm;
    r->rep = rep;
    r->warmup = warmup;
    return 0;
}

void epd__ob_free_reqs(ob_t *b)
{
    for (int i = 0; i < b->n_reqs; i++) {
        epd_free(b->reqs[i].ld_sent);
        epd_free(b->reqs[i].ready.v);
        epd_free(b->reqs[i].writes.v);
        memset(&b->reqs[i], 0, sizeof(b->reqs[i]));
    }
    b->n_reqs = 0;
}
