/*
 * epd_decode_send.c — the messages a decode request sends (a role part
 * below the request layer: it builds and sends, and records what went out
 * — tokens sent, the client answered, what a failure still owed — but
 * never moves a request from one state to another).
 *
 *   TokenChunks   to the client, in order, at most EPD_DECODE_CHUNK_MAX
 *                 tokens each (proto/README.md rule 6);
 *   KvReservation to the prefill worker, on our link to it (rule 3);
 *   a resume      GenerateRequest to the same prefill worker for a request
 *                 preempted here (rules 32-33): decode is that prefill's
 *                 client, so its answers come back to us.
 *
 * Loop thread.  A link that fails tells the daemon (on_link_down); the
 * callers read the returned status where it decides something.
 */
#include <string.h>

#include "epd_alloc.h"
#include "epd_decode_int.h"
#include "epd_log.h"
#include "epd_time.h"

/* TokenChunks of tokens[from..to), the last with `finish` (a lone chunk
 * of none when from == to and finish != NONE). */
static void epd_decode_send_chunks(epd_link_t *client, uint64_t id, const int32_t *tokens,
                                   const epd_sample_logprob_t *lps, uint32_t from, uint32_t to,
                                   Epd__FinishReason finish, Epd__PhaseTimes *times)
{
    /* with logprobs a chunk carries fewer tokens: their views live here */
    Epd__TokenLogprob lp_msgs[EPD_DECODE_LP_CHUNK_MAX];
    Epd__TokenLogprob *lp_ptrs[EPD_DECODE_LP_CHUNK_MAX];
    uint32_t cap = lps != NULL ? EPD_DECODE_LP_CHUNK_MAX : EPD_DECODE_CHUNK_MAX;

    while (from < to || finish != EPD__FINISH_REASON__FINISH_NONE) {
        Epd__TokenChunk c = EPD__TOKEN_CHUNK__INIT;
        uint32_t n = to - from;
        int last;

        if (n > cap) {
            n = cap;
        }
        last = from + n == to;
        c.request_id = id;
        c.index = from;
        /* int32_t and uint32_t may alias; token ids are < vocab */
        c.tokens = (uint32_t *)(uintptr_t)(tokens + from);
        c.n_tokens = n;
        c.finish = last ? finish : EPD__FINISH_REASON__FINISH_NONE;
        c.times = from == 0 ? times : NULL; /* the request's first chunk (rule 38) */
        if (lps != NULL) {
            /* one per token, viewing the request's own (borrowed for the send) */
            for (uint32_t i = 0; i < n; i++) {
                epd_token_logprob_view(&lps[from + i], &lp_msgs[i]);
                lp_ptrs[i] = &lp_msgs[i];
            }
            c.n_logprobs = n;
            c.logprobs = lp_ptrs;
        }
        (void)epd_link_send(client, EPD__ENVELOPE__BODY_TOKENS, &c, 0);
        from += n;
        if (last) {
            break;
        }
    }
}

epd_status_t epd__decode_send_reservation(epd_decode_srv_t *srv, const epd_decode_request_t *req)
{
    Epd__KvReservation kr = EPD__KV_RESERVATION__INIT;
    epd_status_t st = epd__decode_fence_key(srv, req, &kr.rkey); /* its own grant's (rule 25) */

    if (st != EPD_OK) {
        return st;
    }
    kr.request_id = req->pid;
    kr.n_block_ids = req->n_prompt_blocks;
    kr.block_ids = req->blocks;
    kr.state_slot = req->seq.slot;
    kr.region_size = epd_xport_mr_size(srv->mr);
    kr.layout = &srv->layout_msg;
    kr.lease_ms = srv->lease_ms;
    kr.pool_blocks = srv->pool.n_blocks;
    kr.pool_state_slots = srv->pool.n_state_slots;
    /* decode-side reuse (rule 36): prefill skips the cached head, which the
     * fence refuses anyway (CACHED blocks are nobody's to write) */
    kr.cached_blocks = req->n_cached;
    kr.stamped_sums = 1; /* we check either kind */
    kr.range_sums = 1;   /* and a chunked prefill's layers chunk by chunk */
    return epd_link_send(epd_peer_link(req->peer), EPD__ENVELOPE__BODY_RESERVATION, &kr, 0);
}

epd_status_t epd__decode_send_resume(epd_decode_srv_t *srv, const epd_decode_request_t *req,
                                     uint64_t now_ns)
{
    Epd__GenerateRequest g = EPD__GENERATE_REQUEST__INIT;
    Epd__SamplingParams sp = EPD__SAMPLING_PARAMS__INIT;
    Epd__Epoch p_ep = EPD__EPOCH__INIT, d_ep = EPD__EPOCH__INIT;
    epd_msg_epoch_t pe = epd_peer_epoch(req->peer);
    epd_msg_epoch_t de = epd_daemon_epoch(srv->d);
    uint32_t n = req->n_prompt + req->n_resume;
    const void *addr = NULL;
    size_t addr_len = 0;
    uint32_t *tokens;
    uint32_t bias_ids[EPD_SAMPLE_MAX_BIAS];
    float bias_values[EPD_SAMPLE_MAX_BIAS];
    epd_status_t st;

    tokens = epd_malloc((size_t)n * sizeof(*tokens));
    if (tokens == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    memcpy(tokens, req->prompt, (size_t)req->n_prompt * sizeof(*tokens));
    for (uint32_t i = 0; i < req->n_resume; i++) {
        tokens[req->n_prompt + i] = (uint32_t)req->seq.tokens[i];
    }
    epd_daemon_address(srv->d, &addr, &addr_len);
    sp.temperature = req->seq.sp.temperature;
    sp.top_p = req->seq.sp.top_p;
    sp.top_k = req->seq.sp.top_k;
    sp.seed = req->seq.sp.seed;
    sp.max_tokens = req->max_tokens;
    /* the logit adjustments and logprobs too: the resumed token is sampled
     * (and reported) exactly as an unpreempted one */
    sp.presence_penalty = req->seq.sp.presence_penalty;
    sp.frequency_penalty = req->seq.sp.frequency_penalty;
    sp.repetition_penalty = req->seq.sp.repetition_penalty;
    sp.min_tokens = req->seq.sp.min_tokens;
    sp.ignore_eos = req->seq.sp.ignore_eos != 0;
    sp.logprobs = req->seq.sp.logprobs;
    sp.n_stop_token_ids = req->n_stop;
    sp.stop_token_ids = req->stop_ids;
    for (uint32_t i = 0; i < req->seq.sp.n_bias; i++) {
        bias_ids[i] = req->seq.sp.bias[i].id;
        bias_values[i] = req->seq.sp.bias[i].bias;
    }
    sp.n_logit_bias_ids = req->seq.sp.n_bias;
    sp.logit_bias_ids = bias_ids;
    sp.n_logit_bias_values = req->seq.sp.n_bias;
    sp.logit_bias_values = bias_values;
    p_ep.start_time_ns = pe.start_time_ns;
    p_ep.nonce = pe.nonce;
    d_ep.start_time_ns = de.start_time_ns;
    d_ep.nonce = de.nonce;
    g.request_id = req->pid;
    g.prompt_tokens = tokens;
    g.n_prompt_tokens = n;
    g.sampling = &sp;
    g.prefill_worker_id = (char *)(uintptr_t)epd_peer_id(req->peer);
    g.prefill_epoch = &p_ep;
    g.decode_worker_id = (char *)(uintptr_t)epd_daemon_worker_id(srv->d);
    g.decode_epoch = &d_ep;
    g.decode_address.data = (uint8_t *)(uintptr_t)addr;
    g.decode_address.len = addr_len;
    g.resume_generated = req->n_resume;
    /* what is left of the request's budget (0: none) */
    g.deadline_ms = req->deadline_ns > now_ns ? (req->deadline_ns - now_ns) / EPD_NSEC_PER_MSEC + 1
                                              : 0;
    st = epd_link_send(epd_peer_link(req->peer), EPD__ENVELOPE__BODY_GENERATE, &g, 0);
    epd_free(tokens);
    return st;
}

/* Streams the tokens produced since the last chunk and, with `finish`,
 * ends the stream: the client's final answer. */
void epd__decode_stream(epd_decode_request_t *req, uint32_t n_produced,
                              Epd__FinishReason finish)
{
    if (req->client_done) {
        return;
    }
    if (n_produced < req->n_sent) {
        n_produced = req->n_sent;
    }
    epd_decode_send_chunks(req->client, req->id, req->seq.tokens, req->seq.lps, req->n_sent,
                           n_produced, finish, req->send_times ? &req->times : NULL);
    req->send_times = 0;
    req->n_sent = n_produced;
    if (finish != EPD__FINISH_REASON__FINISH_NONE) {
        req->client_done = 1;
    }
}

/* The Abort that tells P to stop writing for `req` (on our link to it). */
void epd__decode_abort_p(epd_decode_request_t *req, epd_status_t status, const char *reason)
{
    req->abort_sent_ns = epd_time_now_ns();
    if (!req->p_done && epd_peer_usable(req->peer)) {
        (void)epd_link_send_abort(epd_peer_link(req->peer), req->pid, status, reason);
    }
}

/* Sends what a failed request still owes, each once. */
void epd__decode_send_owed(epd_decode_request_t *req)
{
    if ((req->owe & EPD_DECODE_TELL_CLIENT) != 0 && !req->client_done) {
        (void)epd_link_send_error(req->client, req->id, req->fail_status, req->fail_msg,
                                  req->culprit[0] != '\0' ? req->culprit : NULL);
        req->client_done = 1;
    }
    if ((req->owe & EPD_DECODE_END_CLIENT) != 0) {
        epd__decode_stream(req, req->n_sent, EPD__FINISH_REASON__FINISH_ABORT);
    }
    if (!req->resume_again) {
        req->client_done = 1; /* (a resume to retry owes the client nothing yet) */
    }
    if ((req->owe & EPD_DECODE_ABORT_P) != 0) {
        epd__decode_abort_p(req, req->p_status, req->p_reason);
    }
    req->owe = 0;
}

/* A RUNNING request's sequence came back for good: its end goes out. */
void epd__decode_finish_run(epd_decode_srv_t *srv, epd_decode_request_t *req)
{
    uint32_t n = atomic_load_explicit(&req->seq.n_produced, memory_order_acquire);
    epd_decode_finish_t fin =
        (epd_decode_finish_t)atomic_load_explicit(&req->seq.finish, memory_order_acquire);

    switch (fin) {
    case EPD_DECODE_FINISH_LENGTH:
    case EPD_DECODE_FINISH_STOP:
        epd__decode_stream(req, n,
                          fin == EPD_DECODE_FINISH_STOP ? EPD__FINISH_REASON__FINISH_STOP
                                                        : EPD__FINISH_REASON__FINISH_LENGTH);
        epd_daemon_counts(srv->d)->served++;
        break;
    case EPD_DECODE_FINISH_ABORT:
        /* asked by the loop: the client was answered then (or is gone) */
        epd__decode_stream(req, req->n_sent, EPD__FINISH_REASON__FINISH_ABORT);
        break;
    case EPD_DECODE_FINISH_ERROR:
    case EPD_DECODE_FINISH_NONE:
        epd_log_error(EPD_DECODE_LOG, req->id, "generation failed: %s",
                      epd_status_string(req->seq.error));
        if (!req->client_done) {
            (void)epd_link_send_error(req->client, req->id,
                                      req->seq.error != EPD_OK ? req->seq.error : EPD_ERR_FATAL,
                                      "decode step failed", NULL);
            req->client_done = 1;
        }
        epd_daemon_counts(srv->d)->failed++;
        break;
    }
    epd_log_debug(EPD_DECODE_LOG, req->id, "finished after %u tokens", n);
}

void epd__decode_refuse(epd_decode_srv_t *srv, epd_link_t *to, const Epd__Envelope *env,
                        uint64_t id, epd_status_t status, const char *what)
{
    epd_daemon_counts(srv->d)->refused++;
    epd_daemon_refuse_log(srv->d, id, "%s from %s: %s (%s)", epd_msg_body_name(env),
                          env->sender->worker_id, what, epd_status_name(status));
    if (env->body_case != EPD__ENVELOPE__BODY_ERROR) {
        (void)epd_link_send_error(to, id, status, what, NULL);
    }
}
