/*
 * epd_decode_int.h — the decode daemon's internals.
 *
 *   main.c                 flags -> config -> the daemon runtime (daemon/),
 *                          the engine, the KV pool, the block allocator, the
 *                          compute thread and its wake-up
 *   epd_decode_msg.c       the message layer: checks every request-plane
 *                          message as far as it can without the request
 *                          table, refuses the bad ones, hands the rest to
 *                          the request layer
 *   epd_decode_req.c       the request layer: the only place a request's
 *                          state changes (epd_decode_req_state_t, one
 *                          switch), leases, deadlines, the peers' and
 *                          clients' deaths, the compute thread's results
 *   epd_decode_admit.c     admission: a request's memory, blocks and tables
 *   epd_decode_send.c      the messages a request sends: token chunks, the
 *                          KvReservation, a resume's GenerateRequest, what a
 *                          failure owes, a run's end
 *   epd_decode_kv.c        KV on demand: a request's blocks at admission and
 *                          as it generates, the preemption victim, the queue
 *                          of preempted requests, prefill-side ids
 *   epd_decode_blocks.c    the KV block / state-slot lifecycle (own header)
 *   epd_decode_check.c     the pure checks and the KV verification (own header)
 *   epd_decode_batch.c     the compute thread: continuous batching (own header)
 *   epd_decode_verify.c    the verifier thread: the KV checks off the loop (own header)
 *   epd_decode_lend.c      lending the KV checks to the verifier: whole
 *                          layers, and a chunked prefill's blocks as they land
 *   epd_decode_cache.c     decode-side reuse: finished prompts' blocks kept
 *   epd_decode_metrics.c   /metrics: a request's phase times (rule 38), the
 *                          role's histograms, rendered
 *
 * Calls go one way: main.c -> epd_decode_msg.c -> epd_decode_req.c ->
 * epd_decode_admit.c, epd_decode_send.c, epd_decode_kv.c, epd_decode_lend.c,
 * epd_decode_cache.c,
 * epd_decode_metrics.c, epd_decode_blocks.c, epd_decode_check.c, epd_decode_batch.c,
 * epd_decode_verify.c (-> epd_decode_check.c); epd_decode_admit.c ->
 * epd_decode_cache.c -> epd_decode_blocks.c (the message layer also
 * calls epd_decode_admit.c's refusal; main.c also
 * calls the request layer's start-up, shutdown and daemon callbacks, and
 * sets the parts up).  Upward only through callbacks registered at start:
 * the daemon's ops (main.c fills them with the functions below) and the
 * compute thread's wake-up (a uv_async of main.c's that calls
 * epd__decode_req_on_batch) and the verifier's results
 * (epd__decode_req_on_verified, registered by main.c).
 *
 * Threads: everything here belongs to the loop thread, except what the
 * compute thread reads and writes through a submitted sequence (see
 * epd_decode_batch.h) and the KV pool it reads (the blocks of RUNNING
 * requests, ACTIVE: nobody writes them), and what the verifier thread
 * reads and writes through a lent job (a layer's blocks, the job's
 * results: epd_decode_verify.h).
 */
#ifndef EPD_DECODE_INT_H
#define EPD_DECODE_INT_H

#include <stdint.h>

#include <uv.h>

#include "epd_daemon.h"
#include "epd_decode_batch.h"
#include "epd_decode_blocks.h"
#include "epd_decode_check.h"
#include "epd_decode_verify.h"
#include "epd_engine.h"
#include "epd_hash.h"
#include "epd_kvcache.h"
#include "epd_layout.h"
#include "epd_link.h"
#include "epd_peer.h"
#include "epd_prefix.h"
#include "epd_registrar.h"
#include "epd_reqtab.h"

#define EPD_DECODE_LOG "decode"
#define EPD_DECODE_CHUNK_MAX 4096u /* tokens per TokenChunk */
#define EPD_DECODE_LP_CHUNK_MAX 64u /* ... when they carry logprobs */
#define EPD_DECODE_JOIN_QUEUE 256u /* loop -> compute: sequences waiting to join the batch */

/*
 * Where one request stands; its blocks are in the matching state of
 * epd_decode_blocks.h (RESERVED; ACTIVE for READY and RUNNING;
 * QUARANTINED; none for PREEMPTED; FREE).  Transitions happen in
 * epd_decode_req.c's step function only:
 *
 *   RESERVED --PrefillComplete verified--> READY --joins the batch--> RUNNING
 *    |  |  ^    (the first token ends it: DONE)  | |                   | |
 *    |  |  |                   failure, abort: DONE |   final entry back: DONE
 *    |  |  |                    preempted (KV on demand): PREEMPTED <----+
 *    |  |  +--resumed: blocks again, a GenerateRequest to P----+ |
 *    |  |                               failure, abort: DONE <---+
 *    |  +--KvReservation never went out--> DONE (unreserved)
 *    +--failure, abort, lease, deadline, P dead--> QUARANTINED
 *                   --P quiesced / completed, or its incarnation closed--> DONE
 *                     (a resume P refused for capacity: PREEMPTED again)
 *
 * DONE is freed at once.
 */
typedef enum {
    EPD_DECODE_REQ_RESERVED = 1, /* blocks RESERVED: its prefill worker may be writing */
    EPD_DECODE_REQ_READY,        /* KV verified, blocks ACTIVE, first token sent; waits
                                  * to join the batch */
    EPD_DECODE_REQ_RUNNING,      /* its sequence is lent to the compute thread */
    EPD_DECODE_REQ_QUARANTINED,  /* answered; blocks QUARANTINED until its prefill
                                  * worker can write no more */
    EPD_DECODE_REQ_PREEMPTED,    /* KV on demand: its blocks were taken back for an
                                  * older request; it holds none and waits (in
                                  * srv->pre_*, by age) to be prefilled again */
    EPD_DECODE_REQ_DONE,         /* blocks FREE: freed at once */
} epd_decode_req_state_t;

/* What a failure owes (epd_decode_fail's `owe`), each sent once:
 *   TELL_CLIENT  an Error{fail_status, fail_msg, culprit} to the client;
 *   END_CLIENT   a final TokenChunk{finish ABORT} to the client;
 *   ABORT_P      an Abort{p_status, p_reason} to its prefill worker, which
 *                may still be writing (RESERVED only). */
#define EPD_DECODE_TELL_CLIENT 0x1u
#define EPD_DECODE_END_CLIENT 0x2u
#define EPD_DECODE_ABORT_P 0x4u

struct epd_decode_srv;

/* One layer's checks of a chunked prefill's blocks as they land
 * (epd_decode_lend.c): blocks [0, done) checked, hashed into h (the
 * verifier's while the layer's job is out); a range [0, pend) with its
 * checksum waiting for that job; the layer's own check waiting too. */
typedef struct {
    epd_hash_state_t *h;
    uint32_t done, pend;
    uint64_t pend_sum;
    uint8_t busy;       /* the layer's job is out with a range check */
    uint8_t final_wait; /* the layer's own check follows it */
} epd_decode_range_t;

typedef struct epd_decode_request {
    epd_reqent_t ent;  /* srv->reqs, keyed (id, 0): the client's id */
    epd_reqent_t pent; /* srv->by_pid, keyed (pid, 0): the id its prefill worker knows
                        * (the client's for the first prefill, a fresh one per resume) */
    uint64_t id;
    uint64_t pid;
    epd_decode_req_state_t state;
    struct epd_decode_srv *srv;
    /* who asked and who writes */
    epd_link_t *client;   /* counted reference: its GenerateRequest came on it, replies go back */
    uint64_t client_hash; /* epd_hash64 of the client's worker id (its Abort must match) */
    epd_peer_t *peer;     /* the prefill incarnation (counted reference); KvReservation and
                           * Abort go on our link to it */
    /* the request, in the same allocation as the struct */
    uint32_t n_prompt, max_tokens;
    uint32_t *prompt;         /* [n_prompt] kept to resume it (grows), else NULL */
    int grows;                /* KV on demand: holds prompt + headroom and grows (a
                               * preemption victim); else prompt + max_tokens up front */
    uint32_t n_blocks;        /* held now (up front: prompt + max_tokens) */
    uint32_t max_blocks;      /* prompt + max_tokens: the size of blocks[] */
    uint32_t n_prompt_blocks; /* the ones the prefill worker writes */
    uint32_t n_resume;        /* this prefill recomputes n_prompt + n_resume tokens (0:
                               * the first prefill) */
    uint32_t slot;            /* state slot, or EPD_DECODE_NO_SLOT */
    uint32_t *blocks;         /* [max_blocks]; [0..n_blocks) held */
    /* decode-side reuse (the cache part's): blocks[0..n_cached) are the
     * prefix cache's (pinned, read-only, never owned by the request) */
    uint32_t n_cached;
    epd_prefix_hash_t *keys; /* [n_keys]: the prompt's full blocks; NULL: no reuse */
    uint32_t n_keys;
    uint32_t *stop_ids;       /* [n_stop] */
    uint32_t n_stop;
    epd_decode_kv_seen_t kv; /* per-layer verification so far ([n_layers] arrays) */
    epd_decode_vjob_t *vjobs; /* [n_layers]: a layer's check, lent to the verifier */
    uint32_t v_lent;          /* jobs lent: the request is freed only once they are back */
    epd_decode_range_t *rng;  /* [n_layers] once a LayerDone with blocks came, else NULL */
    epd_decode_seq_t seq;    /* lent to the compute thread while RUNNING; seq.tokens
                              * [max_tokens] int32 */
    uint32_t n_sent;         /* tokens sent to the client */
    /* facts the step function reads */
    int resv_unsent;  /* the KvReservation never went out: nobody can write */
    int protocol_only; /* GenerateRequest.protocol_only: no KV, ends at the first token */
    int pc_seen;      /* PrefillComplete came and was consistent: the first token is
                       * seq.tokens[0]; the checks of the layers may still run */
    int kv_verified;  /* ...and every layer checked out */
    int first_finish; /* Epd__FinishReason the first token already ends it with */
    int p_done;       /* PrefillComplete or WritesQuiesced from its prefill incarnation:
                       * nothing of it is in flight any more */
    int p_closed;     /* every endpoint of that incarnation is closed (on_peer_closed) */
    int client_done;  /* the client has its final answer, or is gone */
    int compute_done; /* the compute thread handed the sequence back (final entry) */
    int abort_asked;  /* RUNNING: epd_decode_seq_abort was called */
    int preempt;      /* chosen to give its blocks back (newest first) */
    int hungry;       /* RUNNING: its next step needs a block the pool lacks */
    int resume_again; /* a resume's prefill refused for room: PREEMPTED again once its
                       * blocks are released (its failure is not the client's) */
    uint32_t short_by; /* hungry: blocks its next step lacks */
    uint32_t incoming; /* preempt: its blocks counted in srv->blocks_incoming */
    struct epd_decode_request *pre_prev, *pre_next; /* PREEMPTED: srv->pre_*, oldest first */
    /* clocks (epd_time_now_ns) */
    uint64_t t_recv_ns;
    uint64_t lease_ns;      /* RESERVED: its prefill worker must speak before this... */
    uint64_t lease_cap_ns;  /* ...or, while it speaks about other requests, before this */
    uint64_t deadline_ns;   /* the whole request (0: none) */
    uint64_t abort_sent_ns; /* QUARANTINED: the last Abort to its prefill worker */
    uint64_t t_join_ns;     /* trace: KV held and verified (0: first step traced) */
    uint64_t t_pc_ns;       /* PrefillComplete received (rule 38) */
    Epd__PhaseTimes times;  /* P's phase times (rule 38), completed at activation and sent
                             * on the first TokenChunk (index 0) */
    int send_times;         /* the next chunk from index 0 carries `times` */
    /* a failure: what it still owes */
    epd_status_t fail_status;
    char fail_msg[200];
    char culprit[EPD_WORKER_ID_MAX]; /* the Error's culprit ("": none) */
    epd_status_t p_status;           /* the Abort to the prefill worker */
    char p_reason[200];
    unsigned owe; /* EPD_DECODE_TELL_CLIENT / END_CLIENT / ABORT_P not yet sent */
} epd_decode_request_t;

typedef struct epd_decode_srv {
    epd_daemon_t *d;
    epd_engine_t *engine; /* the compute thread uses it while the batch runs */
    const epd_engine_info_t *info;
    /* configuration */
    uint32_t lease_ms;
    uint32_t max_batch;
    uint32_t headroom; /* KV on demand: tokens of room ahead of a request (0: up front) */
    /* the KV pool: registered, written by prefill workers, read by the
     * compute thread; freed with the transport (after every endpoint closed) */
    epd_xport_mr_t *mr;
    epd_kv_pool_t pool;
    unsigned char rkey[EPD_XPORT_RKEY_MAX]; /* its packed key, in every KvReservation */
    size_t rkey_len;
    Epd__KvLayout layout_msg; /* in every KvReservation (pattern below) */
    char pattern[EPD_LAYOUT_PATTERN_MAX];
    epd_decode_blocks_t *blocks;
    int verify_full;     /* --verify full: STAMPED checks hash every body too */
    uint64_t stamp_tag;  /* our incarnation's tag, in every stamp written for us */
    uint8_t *newly;      /* [n_layers] scratch of epd_decode_seen_completed */
    epd_decode_verify_t *verify; /* the verifier thread */
    epd_decode_batch_t *batch;
    uv_async_t wake; /* the compute thread's wake-up (main.c's) */
    int wake_ready;
    epd_reqtab_t reqs;   /* live requests, by id; blocked = READY waiting for queue room */
    epd_reqtab_t by_pid; /* the same, by the id their prefill worker knows */
    uint32_t n_ready;    /* requests READY */
    /* KV on demand */
    uint32_t n_hungry;        /* RUNNING requests waiting for a block */
    uint32_t blocks_incoming; /* blocks of victims on their way back */
    int freed;                /* blocks came free since the waiters last looked */
    struct epd_decode_request *pre_head, *pre_tail; /* PREEMPTED, oldest first */
    /* decode-side reuse (the cache part's; pcache NULL: off) */
    int prefix_cache;
    const char *engine_name;
    epd_kvcache_t *pcache;
    epd_prefix_hash_t proot;
    struct {
        uint64_t requests, prompt_tokens, hit_tokens, evictions;
    } pc;
    /* counters */
    uint64_t kv_bytes_received; /* verified KV of requests that joined */
    uint64_t preemptions;       /* requests preempted */
    uint64_t recomputed_tokens; /* tokens prefilled again to resume them */
    uint64_t verify_failures;   /* requests failed because their KV failed its check */
    uint64_t kv_range_checks;   /* chunked prefill: block ranges checked as they landed */
    uint64_t kv_range_bytes;    /* ... and their bytes */
    epd_trace_t *trace;         /* the daemon's (NULL = off) */
    /* /metrics (epd_decode_metrics.c renders; the request layer observes
     * on the loop thread, the batch its own step histograms) */
    struct {
        epd_prom_histo_t kv_tail; /* PrefillComplete received -> the KV held */
        epd_prom_histo_t handoff; /* the KV held -> the first TokenChunk posted */
        epd_prom_histo_t wait;    /* GenerateRequest received -> the KV held */
    } hist;
} epd_decode_srv_t;

/* ---- epd_decode_metrics.c ---- */
/* Zeroes srv->hist (before serve). */
void epd__decode_metrics_init(epd_decode_srv_t *srv);
/* PrefillComplete came at t_recv with P's phase times (NULL: none, an older
 * prefill): kept in req->times (rule 38). */
void epd__decode_metrics_times_in(epd_decode_request_t *req, const Epd__PhaseTimes *pt,
                                  uint64_t t_recv);
/* The KV is held (req->t_join_ns): our part of the KV tail and the hand-off
 * observed and added to req->times, sent on the first chunk (a resume's
 * first chunk is not the request's first token: nothing). */
void epd__decode_metrics_held(epd_decode_srv_t *srv, epd_decode_request_t *req);
/* The role's part of /metrics (epd_daemon_metrics_cb_t; arg = srv). */
void epd__decode_metrics_render(void *arg, const char *model, epd_prom_text_t *out);

/* ---- epd_decode_cache.c ---- */
/* Decode-side reuse on (srv->prefix_cache, a model with attention layers)
 * or nothing; after the pool and blocks. */
epd_status_t epd__decode_cache_init(epd_decode_srv_t *srv, const char *engine_name);
void epd__decode_cache_cleanup(epd_decode_srv_t *srv);
/* Admission of `req` (its blocks array of n_blocks): the leading blocks of
 * g's prompt the cache holds, pinned into req->blocks[0..req->n_cached),
 * room made for the others (evicting), and those reserved from the
 * allocator with a state slot when the model has linear layers (into
 * req->blocks + n_cached, req->slot).  epd_decode_blocks_reserve's status;
 * on failure the caller drops the pins (epd__decode_cache_drop). */
epd_status_t epd__decode_cache_reserve(epd_decode_srv_t *srv, epd_decode_request_t *req,
                                       const Epd__GenerateRequest *g, uint32_t n_blocks);
/* Bytes of req's KV prefill did not write: the cached head's. */
uint64_t epd__decode_cache_head_bytes(const epd_decode_srv_t *srv, const epd_decode_request_t *req);
/* `req` is about to retire its blocks, its KV verified: when it ended well
 * its own full prompt blocks join the cache (req->n_cached grows). */
void epd__decode_cache_finished(epd_decode_srv_t *srv, epd_decode_request_t *req);
/* `req` is freed: its pins dropped, its keys freed. */
void epd__decode_cache_drop(epd_decode_srv_t *srv, epd_decode_request_t *req);
uint32_t epd__decode_cache_evictable(const epd_decode_srv_t *srv);
void epd__decode_cache_stats(const epd_decode_srv_t *srv, epd_prefix_stats_t *s_p);

/* ---- epd_decode_fence.c ---- */
/* The pool's write check (epd_xport_mr_set_check; arg: the server; the
 * grant's user: the writer's peer record): nonzero when every block or
 * state slot of [off, off + len) is RESERVED by one live request of that
 * writer incarnation. */
int epd__decode_fence_check(void *arg, void *grant_user, uint64_t off, uint64_t len);
/* The key a KvReservation for `req` carries: its prefill incarnation's own
 * grant (epd_peer_grant; borrowed while the peer record lives), never the
 * pool's own key (rule 25). */
epd_status_t epd__decode_fence_key(epd_decode_srv_t *srv, const epd_decode_request_t *req,
                                   ProtobufCBinaryData *key_p);
/* A QUARANTINED request whose writer retired and is not fenced yet: asks
 * that incarnation to confirm (epd_peer_ask_quiesced), at most once per
 * --peer-timeout-ms (rule 28). */
void epd__decode_fence_ask(epd_decode_srv_t *srv, epd_decode_request_t *req, uint64_t now);
/* Logs what the closing of prefill incarnation `peer` released: `n` of its
 * requests were quarantined; those still live wait for its fence. */
void epd__decode_fence_closed(epd_decode_srv_t *srv, epd_peer_t *peer, uint32_t n);

/* ---- epd_decode_send.c ---- */
/* Refuses a message: one rate-limited line and an Error to its sender
 * (never in answer to an Error). */
void epd__decode_refuse(epd_decode_srv_t *srv, epd_link_t *to, const Epd__Envelope *env,
                        uint64_t id, epd_status_t status, const char *what);

/* Streams tokens[n_sent..n_produced) to the client (TokenChunks of at most
 * EPD_DECODE_CHUNK_MAX) and, with `finish`, ends the stream: the client's
 * final answer (client_done).  Nothing once the client is done. */
void epd__decode_stream(epd_decode_request_t *req, uint32_t n_produced, Epd__FinishReason finish);
/* The Abort that tells P to stop writing for `req` (its pid, on our link to
 * it), unless P is done with it. */
void epd__decode_abort_p(epd_decode_request_t *req, epd_status_t status, const char *reason);
/* Sends what a failed request still owes (req->owe), each once. */
void epd__decode_send_owed(epd_decode_request_t *req);
/* A RUNNING request's sequence came back for good: its end goes out
 * (tokens and finish, or the engine's error). */
void epd__decode_finish_run(epd_decode_srv_t *srv, epd_decode_request_t *req);
/* The KvReservation of req's prefill (its pid, prompt blocks, slot) on our
 * link to its prefill worker. */
epd_status_t epd__decode_send_reservation(epd_decode_srv_t *srv, const epd_decode_request_t *req);
/* A resume (rules 32-33): GenerateRequest{pid, prompt + the n_resume
 * generated tokens, resume_generated = n_resume, its sampling, us as its
 * decode worker, what is left of its deadline} to its prefill worker. */
epd_status_t epd__decode_send_resume(epd_decode_srv_t *srv, const epd_decode_request_t *req,
                                     uint64_t now_ns);

/* ---- epd_decode_admit.c ---- */
/* Admits a checked GenerateRequest `env` from `client` bound to `peer`
 * (the caller's reference becomes the request's on success): its memory,
 * its blocks (rule 3; KV on demand: rule 30), the request RESERVED in both
 * tables.  EPD_OK, or EPD_ERR_NO_CAPACITY / EPD_ERR_EXISTS /
 * EPD_ERR_NO_MEMORY with *why_p (nothing kept). */
epd_status_t epd__decode_admit(epd_decode_srv_t *srv, const Epd__Envelope *env,
                               const epd_sample_params_t *sp, epd_link_t *client, epd_peer_t *peer,
                               uint64_t t_recv, epd_decode_request_t **req_p, const char **why_p);
/* Is request `id` live here (a GenerateRequest with it is a duplicate)? */
int epd__decode_admit_live(const epd_decode_srv_t *srv, uint64_t id);
/* GenerateRequest `env` was refused here with `status` (`why`): its
 * prefill worker, when it can be named, hears it too (KvRefused), so that
 * it does not wait for a reservation. */
void epd__decode_admit_refused(epd_decode_srv_t *srv, const Epd__Envelope *env,
                               epd_status_t status, const char *why);

/* ---- epd_decode_kv.c ---- */
/* Blocks a request of n_prompt + max_tokens tokens takes at admission:
 * all of them up front (grows 0), else the prompt plus srv->headroom
 * tokens; a resume holding n_known tokens (prompt + generated) likewise. */
uint32_t epd__decode_kv_admit_blocks(const epd_decode_srv_t *srv, uint32_t n_known,
                                     uint32_t n_prompt, uint32_t max_tokens, int grows);
/* May a new request be admitted for n_blocks now (KV on demand: nothing
 * waits to grow or resume, and a watermark of 1% of the pool stays)? */
int epd__decode_kv_may_admit(const epd_decode_srv_t *srv, uint32_t n_blocks);
/* Grows a RUNNING request's blocks ahead of its produced tokens (up to
 * srv->headroom tokens of room when the pool has them) and publishes
 * them to its sequence.  0: its next step is covered; -1: the pool lacks
 * req->short_by blocks for it. */
int epd__decode_kv_grow(epd_decode_srv_t *srv, epd_decode_request_t *req);
/* The preemption victim (rule 31): the newest READY or RUNNING request
 * that grows and is not leaving already; NULL when none. */
epd_decode_request_t *epd__decode_kv_victim(epd_decode_srv_t *srv);
/* Marks req as waiting (or no longer) for the blocks of its next step,
 * kept in srv->n_hungry. */
void epd__decode_kv_hungry(epd_decode_srv_t *srv, epd_decode_request_t *req, int hungry);
/* Blocks the hungry requests lack, all together. */
uint64_t epd__decode_kv_short(const epd_decode_srv_t *srv);
/* The queue of PREEMPTED requests, oldest (first arrival) first. */
void epd__decode_kv_queue(epd_decode_srv_t *srv, epd_decode_request_t *req);
void epd__decode_kv_unqueue(epd_decode_srv_t *srv, epd_decode_request_t *req);
/* A fresh id for req's next prefill (63 random bits, not live here) and
 * req->pent re-keyed under it in srv->by_pid. */
void epd__decode_kv_new_pid(epd_decode_srv_t *srv, epd_decode_request_t *req);

/* ---- epd_decode_msg.c (the daemon's on_msg) ---- */
int epd__decode_on_msg(void *arg, epd_link_t *from, Epd__Envelope *env);

/* ---- epd_decode_req.c ---- */
/* The request table (after the pool, blocks and batch exist). */
epd_status_t epd__decode_reqs_init(epd_decode_srv_t *srv);
/* Frees every request (after epd_daemon_serve returned: the compute thread
 * is joined, the endpoints are closed). */
void epd__decode_reqs_cleanup(epd_decode_srv_t *srv);
/* A checked GenerateRequest from `from` (sampling parameters in *sp). */
void epd__decode_req_generate(epd_decode_srv_t *srv, epd_link_t *from, const Epd__Envelope *env,
                              const epd_sample_params_t *sp);
/* PrefillComplete / landed-or-not LayerDone; `bad` is the message layer's
 * verdict on its fields (EPD_OK, or the status with `why`): a bad one is
 * still its sender's word that no write of it is in flight (PrefillComplete)
 * but fails the request. */
void epd__decode_req_complete(epd_decode_srv_t *srv, epd_link_t *from, const Epd__Envelope *env,
                              epd_status_t bad, const char *why);
void epd__decode_req_layer_done(epd_decode_srv_t *srv, epd_link_t *from, const Epd__Envelope *env,
                                epd_status_t bad, const char *why);
void epd__decode_req_quiesced(epd_decode_srv_t *srv, epd_link_t *from, const Epd__Envelope *env);
/* An Abort (from the client or the prefill worker). */
void epd__decode_req_abort(epd_decode_srv_t *srv, epd_link_t *from, const Epd__Envelope *env);
/* An Error or KvRefused about request `id` (status, text: its fields). */
void epd__decode_req_failed_by(epd_decode_srv_t *srv, epd_link_t *from, const Epd__Envelope *env,
                               uint64_t id, int32_t status, const char *text);
/* The compute thread woke the loop (main.c's uv_async). */
void epd__decode_req_on_batch(epd_decode_srv_t *srv);
/* ---- epd_decode_lend.c: lending the KV checks (below the request layer) */
/* Layer `layer`'s own check (marked CHECKING, its sum recorded): lent now,
 * only the blocks no range check covered when the layer's running state
 * holds some, or after the range check that is out.  EPD_OK, or
 * EPD_ERR_NO_RESOURCE (the verifier's sizing broken: the request fails). */
epd_status_t epd__decode_lend_layer(epd_decode_srv_t *srv, epd_decode_request_t *req,
                                    uint32_t layer);
/* A landed LayerDone with `blocks` (checked by the message layer: an
 * attention layer, kind BYTES) of a RESERVED request: the blocks'
 * check lent now or after the one out.  EPD_OK (also when there is
 * nothing to check), or an error with *why_p: the request fails. */
epd_status_t epd__decode_lend_range_landed(epd_decode_srv_t *srv, epd_decode_request_t *req,
                                           const Epd__LayerDone *ld, const char **why_p);
/* A range check came back: EPD_OK (what waited on it is lent), or its
 * failure with *why_p. */
epd_status_t epd__decode_lend_range_back(epd_decode_srv_t *srv, epd_decode_request_t *req,
                                         const epd_decode_vjob_t *job, const char **why_p);
/* Frees the range states (a resume starts over; the request's end). */
void epd__decode_lend_reset(epd_decode_srv_t *srv, epd_decode_request_t *req);

/* A layer's check came back from the verifier thread (its callback). */
void epd__decode_req_on_verified(void *arg, epd_decode_vjob_t *job);
/* Callbacks of the daemon's ops, registered by main.c. */
void epd__decode_req_on_link_down(void *arg, epd_link_t *link, epd_status_t status);
void epd__decode_req_on_peer_dead(void *arg, epd_peer_t *peer, epd_status_t status,
                                  const char *why);
void epd__decode_req_on_peer_closed(void *arg, epd_peer_t *peer);
int epd__decode_req_on_pump(void *arg);
void epd__decode_req_on_tick(void *arg, uint64_t now_ns);


#endif
