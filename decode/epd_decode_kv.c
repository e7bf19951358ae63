/*
 * epd_decode_kv.c — KV on demand (proto/README.md rules 30-32): how many
 * blocks a request holds, its growth as it generates, which request gives
 * its blocks back when the pool runs dry, and the queue of those that did.
 *
 * A role part below the request layer: it sizes, grows (FREE -> ACTIVE
 * blocks of a request that already runs: nobody remote ever sees them),
 * picks and queues, and the request layer's step acts on what it answers.
 * A request's state is never changed here.
 *
 * Why newest first: the oldest requests have waited longest and hold the
 * most generated tokens (the most work a preemption would redo), so they
 * keep running; a request whose own next step cannot be covered and that
 * is itself the newest gives its own blocks back rather than take an
 * older one's.  Loop thread.
 */
#include <sodium.h>

#include "epd_decode_int.h"

uint32_t epd__decode_kv_admit_blocks(const epd_decode_srv_t *srv, uint32_t n_known,
                                     uint32_t n_prompt, uint32_t max_tokens, int grows)
{
    uint64_t end = (uint64_t)n_prompt + max_tokens;
    uint64_t hold = grows ? (uint64_t)n_known + srv->headroom : end;

    return (uint32_t)epd_decode_div_up(hold < end ? hold : end, srv->info->kv.block_tokens);
}

int epd__decode_kv_may_admit(const epd_decode_srv_t *srv, uint32_t n_blocks)
{
    uint32_t total = srv->pool.n_blocks;
    uint32_t watermark = total / 100 > 0 ? total / 100 : 1;

    if (srv->headroom == 0) {
        return 1; /* up front: the reservation decides alone */
    }
    /* resumes and growth come first; and a little room stays for the next
     * block of the running ones, so that an admission does not force a
     * preemption at once */
    return srv->n_hungry == 0 && srv->pre_head == NULL &&
           (uint64_t)n_blocks + watermark <= epd_decode_blocks_free(srv->blocks);
}

int epd__decode_kv_grow(epd_decode_srv_t *srv, epd_decode_request_t *req)
{
    uint32_t bt = srv->info->kv.block_tokens;
    uint32_t n = atomic_load_explicit(&req->seq.n_produced, memory_order_acquire);
    uint64_t end = (uint64_t)req->n_prompt + req->max_tokens;
    uint64_t ahead = (uint64_t)req->n_prompt + n + srv->headroom;
    uint32_t must, want, add, free_now, had = req->n_blocks;

    if (n >= req->max_tokens) {
        req->short_by = 0;
        return 0; /* its last token is out: no step follows */
    }
    /* the next step writes the KV of position n_prompt + n - 1 */
    must = (uint32_t)epd_decode_div_up((uint64_t)req->n_prompt + n, bt);
    want = (uint32_t)epd_decode_div_up(ahead < end ? ahead : end, bt);
    if (srv->n_hungry > (uint32_t)(req->hungry != 0)) {
        want = must; /* others wait for their next step: no room ahead for this one */
    }
    free_now = epd_decode_blocks_free(srv->blocks);
    add = want > req->n_blocks ? want - req->n_blocks : 0;
    add = add < free_now ? add : free_now;
    if (add > 0 &&
        epd_decode_blocks_grow(srv->blocks, req->id, add, req->blocks + req->n_blocks) == EPD_OK) {
        req->n_blocks += add;
        epd_decode_seq_grow(&req->seq, req->n_blocks);
        if (had < must && srv->batch != NULL) {
            epd_decode_batch_kick(srv->batch); /* it may be waiting for them */
        }
    }
    req->short_by = req->n_blocks < must ? must - req->n_blocks : 0;
    return req->short_by == 0 ? 0 : -1;
}

epd_decode_request_t *epd__decode_kv_victim(epd_decode_srv_t *srv)
{
    /* the table's walk is newest first (admission order) */
    for (epd_decode_request_t *r = epd_reqtab_first_req(&srv->reqs); r != NULL;
         r = epd_reqtab_next_req(&srv->reqs, r)) {
        if ((r->state == EPD_DECODE_REQ_READY || r->state == EPD_DECODE_REQ_RUNNING) &&
            r->grows && !r->preempt && r->fail_status == EPD_OK && !r->compute_done) {
            return r;
        }
    }
    return NULL;
}

void epd__decode_kv_hungry(epd_decode_srv_t *srv, epd_decode_request_t *req, int hungry)
{
    if (req->hungry != hungry) {
        req->hungry = hungry;
        srv->n_hungry = hungry ? srv->n_hungry + 1 : srv->n_hungry - 1;
    }
}

uint64_t epd__decode_kv_short(const epd_decode_srv_t *srv)
{
    uint64_t n = 0;

    if (srv->n_hungry == 0) {
        return 0;
    }
    for (epd_decode_request_t *r = epd_reqtab_first_req(&srv->reqs); r != NULL;
         r = epd_reqtab_next_req(&srv->reqs, r)) {
        n += r->hungry ? r->short_by : 0;
    }
    return n;
}

void epd__decode_kv_queue(epd_decode_srv_t *srv, epd_decode_request_t *req)
{
    epd_decode_request_t *after = srv->pre_tail;

    /* by first arrival: a request preempted again keeps its place */
    while (after != NULL && after->t_recv_ns > req->t_recv_ns) {
        after = after->pre_prev;
    }
    req->pre_prev = after;
    req->pre_next = after != NULL ? after->pre_next : srv->pre_head;
    if (req->pre_next != NULL) {
        req->pre_next->pre_prev = req;
    } else {
        srv->pre_tail = req;
    }
    if (after != NULL) {
        after->pre_next = req;
    } else {
        srv->pre_head = req;
    }
}

void epd__decode_kv_unqueue(epd_decode_srv_t *srv, epd_decode_request_t *req)
{
    if (req->pre_prev != NULL) {
        req->pre_prev->pre_next = req->pre_next;
    } else if (srv->pre_head == req) {
        srv->pre_head = req->pre_next;
    } else {
        return; /* not queued */
    }
    if (req->pre_next != NULL) {
        req->pre_next->pre_prev = req->pre_prev;
    } else {
        srv->pre_tail = req->pre_prev;
    }
    req->pre_prev = req->pre_next = NULL;
}

void epd__decode_kv_new_pid(epd_decode_srv_t *srv, epd_decode_request_t *req)
{
    uint64_t pid;

    /* as clients choose theirs (proto/README.md rule 2): unpredictable, so
     * nobody can name another request's resume */
    do {
        randombytes_buf(&pid, sizeof(pid));
        pid &= 0x7fffffffffffffffULL;
    } while (pid == 0 || epd_reqtab_find(&srv->by_pid, pid, 0) != NULL ||
             epd_reqtab_find(&srv->reqs, pid, 0) != NULL);
    epd_reqtab_remove(&srv->by_pid, &req->pent);
    req->pid = pid;
    req->pent.id = pid;
    req->pent.sub = 0;
    epd_reqtab_insert(&srv->by_pid, &req->pent);
}
