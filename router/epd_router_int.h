/*
 * epd_router_int.h — the router daemon's shared state and who calls whom
 * among its files:
 *
 *   main.c                 flags -> config, the daemon runtime (daemon/),
 *                          the role's callbacks, the stop order
 *   epd_router_rpc.c       the control plane: RegisterWorker, Heartbeat,
 *                          Drain, Status, Health (through ops->on_rpc)
 *   epd_router_api.c       the HTTP intake: routes, a generation request
 *                          parsed, checked and tokenized
 *   epd_router_req.c       a request's life (its state, below, changes
 *                          there only): attempts, the client's events,
 *                          retries, migrations, aborts, deadlines
 *   epd_router_dispatch.c  an attempt's workers chosen and submitted
 *                          (called by epd_router_req.c)
 *   epd_router_answer.c    what the HTTP client sees: errors, the JSON
 *                          answer or the SSE stream, text and stop strings
 *   epd_router_group.c     an answer of several choices (n > 1, a batch of
 *                          prompts): the members' answers gathered
 *   epd_router_registry.c  workers, their states and the policies
 *   epd_router_metrics.c   counters, histograms, /metrics
 *
 * Calls go one way, down this order:
 *   main.c -> epd_router_rpc.c, epd_router_api.c, epd_router_req.c
 *   epd_router_api.c -> epd_router_req.c -> epd_router_dispatch.c,
 *                                           epd_router_answer.c ->
 *                                           epd_router_group.c
 *   (each of them) -> epd_router_registry.c, epd_router_metrics.c
 * and below all of them the libraries: the request-plane client
 * (epd_client*.c), the HTTP server (epd_http_*.c), the OpenAI layer
 * (epd_openai_*.c).  Upward only through callbacks registered at start-up:
 * the daemon's ops (main.c), the HTTP handler and each request's abort
 * callback, the client's event callback.
 *
 * One libuv loop thread, the daemon runtime's, owns everything here: the
 * registry, the HTTP server and its requests, the request-plane client
 * (its xport driven by the runtime; epd_client_tick from the runtime's
 * tick) and the gRPC handlers (run on this loop).  Nothing takes a lock.
 * The only work off the loop is forwarding Drain to a worker (a blocking
 * gRPC call, on libuv's thread pool).
 *
 * A generation request (epd_router_req_t) stands in one state
 * (epd_router_req_state_t); every transition is made by epd_router_req.c's
 * step function (one switch) from the facts events record — the HTTP side
 * finished (r->http NULL: answered by epd_router_answer.c, or the client
 * went away), tokens received (r->n_out) — and from the attempt's terminal
 * event, handed to the step as the client delivers it:
 *
 *   PARSED --queued--> WAITING --its turn, submit accepted--> SUBMITTED --first token--> STREAMING
 *     |                | |  ^                                   |  |  |                 |  |
 *     |                | |  +--failed before a token: again ----+  |  |                 |  |
 *     |                | |     now (another worker), or after a    |  |                 |  |
 *     |                | |     backoff (refused for room)          |  |                 |  |
 *     |                | +--no room: stays, in line (FIFO)         |  +--terminal event:+  |
 *     |                +--no room within the queue timeout (429),  |     answered --> DONE |
 *     |                   cannot submit (answered), client gone    |                       |
 *     |                   --> DONE                                 +--HTTP side finished:--+
 *     +--queue full: 429 --> DONE                                     Abort sent --> ABORTING
 *                                                  ABORTING --terminal event--> DONE
 *
 * DONE is freed at once; a request is DONE only once its HTTP side is
 * finished and no attempt of it is in flight.
 */
#ifndef EPD_ROUTER_INT_H
#define EPD_ROUTER_INT_H

#include <stdint.h>

#include <uv.h>

#include "epd_client.h"
#include "epd_daemon.h"
#include "epd_engine.h"
#include "epd_gen_config.h"
#include "epd_http.h"
#include "epd_openai.h"
#include "epd_router_metrics.h"
#include "epd_router_registry.h"
#include "epd_rng.h"
#include "epd_rpc.h"
#include "epd_chat.h"
#include "epd_tokenizer.h"
#include "epd_trace.h"

#define EPD_ROUTER_LOG "router"
#define EPD_ROUTER_JSON "application/json"
#define EPD_ROUTER_MAX_AVOID 8
/* A refusal for room is retried after an exponential backoff with jitter:
 * half of min(BASE << n, MAX) plus a random share of the other half. */
#define EPD_ROUTER_BACKOFF_BASE_MS 20
#define EPD_ROUTER_BACKOFF_MAX_MS 1000
/* Broken pairs: a prefill and a decode worker that both reach the router
 * but not each other (a partition between their hosts — or one of them
 * stopped a while: its peer's timeout fired first).  After a request
 * failed between them requests are routed around the pair for
 * EPD_ROUTER_PAIR_PROBE_MS, doubled for each failure in a row up to
 * EPD_ROUTER_PAIR_BROKEN_MS; then one request tries it again.  The pair is
 * forgotten as soon as a request gets a token through it (healed, or the
 * stopped worker resumed) or either worker is a new incarnation (a
 * restart): it is avoided only while it is seen broken. */
#define EPD_ROUTER_PAIRS_MAX 64
#define EPD_ROUTER_PAIR_PROBE_MS 500
#define EPD_ROUTER_PAIR_BROKEN_MS 10000

typedef struct {
    char prefill[EPD_CLIENT_NAME_MAX]; /* worker ids ("" : a free slot) */
    char decode[EPD_CLIENT_NAME_MAX];
    uint64_t p_registered_ns; /* the incarnations (epd_router_worker_t.registered_ns) */
    uint64_t d_registered_ns;
    uint64_t until_ns; /* monotonic */
    uint32_t strikes;  /* failures in a row: the avoidance's exponent */
} epd_router_pair_t;
/* Where an image's embeddings come from (epd_router_req_t.img_src). */
#define EPD_ROUTER_IMG_CACHE 0   /* the prefill worker's embedding cache */
#define EPD_ROUTER_IMG_ENCODER 1 /* an encoder worker */
#define EPD_ROUTER_IMG_INLINE 2  /* the prefill worker encodes it (no encoder pool) */

typedef struct epd_router epd_router_t;
typedef struct epd_router_req epd_router_req_t;

/* One answer of several choices (n > 1, a batch of prompts:
 * epd_router_group.c): its members are requests of their own, each
 * through the normal path (queue, attempts, retries), answering through
 * the group: the stream's chunks carry their choice's index, the full
 * answer waits for the last member.  Of the n choices of one prompt the
 * first (the leader) starts alone; the others start once it has its
 * first token, so the prompt's blocks are in the prefill worker's prefix
 * cache, pinned to that worker (r->pin_prefill; docs/api.md). */
typedef struct {
    char *text; /* owned: raw generated bytes */
    size_t len;
    char *echo; /* owned: the prompt's bytes (echo), or NULL */
    size_t echo_len;
    char *lp; /* owned: the logprobs JSON, or NULL */
    size_t lp_len;
    epd_oai_finish_t finish;
} epd_router_choice_res_t;

typedef struct epd_router_group {
    epd_http_req_t *http;   /* NULL once answered, failed, or the client is gone */
    epd_oai_request_t *oai; /* owned: every member borrows it */
    uint32_t n_members;     /* prompts x n, member i is choice index i */
    uint32_t n_choices;     /* n: members [p*n, p*n + n) share prompt p */
    epd_router_req_t **members;   /* [n_members] owned until started; NULL once freed */
    uint8_t *started;             /* [n_members] handed to epd__router_req_start */
    epd_router_choice_res_t *res; /* [n_members] the finished choices */
    uint32_t n_finished;
    uint32_t refs; /* members not yet freed, plus one while http is open */
    int stream_started;
    int64_t prompt_tokens, completion_tokens, cached_tokens; /* sums over the members */
} epd_router_group_t;

/* Where a generation request stands (the diagram above); changed by
 * epd_router_req.c's step function only. */
typedef enum {
    EPD_ROUTER_REQ_PARSED = 0, /* built by the intake (as epd_calloc left it), not listed */
    EPD_ROUTER_REQ_WAITING,    /* in the queue (rt->wait_*, by arrival), no attempt in
                                * flight: the next one is submitted on its turn (the
                                * queue's walk, when no room stopped an older one) */
    EPD_ROUTER_REQ_SUBMITTED,  /* an attempt in flight, no token yet: its prompt counts in
                                * pw->queued_tokens; a failure may be retried */
    EPD_ROUTER_REQ_STREAMING,  /* tokens arriving: a failure ends the request */
    EPD_ROUTER_REQ_ABORTING,   /* the HTTP side finished while an attempt is in flight:
                                * Abort sent, waiting for the attempt's terminal event */
    EPD_ROUTER_REQ_DONE,       /* HTTP side finished, no attempt in flight: freed at once */
} epd_router_req_state_t;

/* One HTTP generation request, from parse to its last client event (or
 * one choice of a group: r->group). */
struct epd_router_req {
    epd_router_t *rt;
    /* a member of a group (its http is the group's while both are open;
     * it borrows the group's oai), or NULL */
    epd_router_group_t *group;
    uint32_t choice; /* its index among the group's choices */
    /* a group's later choice: its leader's prefill worker id ("": none),
     * preferred by the dispatch while it has room */
    char pin_prefill[EPD_CLIENT_NAME_MAX];
    /* echo: the prompt's bytes before the text (owned), or NULL */
    char *echo;
    size_t echo_len;
    epd_router_req_state_t state;
    /* a fact the step reads: NULL once the HTTP side is finished — answered
     * (epd_router_answer.c) or the client gone (its abort callback) */
    epd_http_req_t *http;
    epd_oai_request_t *oai;
    uint32_t *prompt; /* token ids, BOS first */
    uint32_t n_prompt;
    /* prompt tokens the prefill worker's prefix cache served (its first
     * chunk's phase times; usage.prompt_tokens_details.cached_tokens) */
    uint32_t cached_tokens;
    /* logprobs (oai->want_logprobs): each generated token's id and
     * log-probabilities, [max_new] each (owned; allocated with its first
     * chunk); a stream reports [lps_sent, n_out) when it ends */
    uint32_t *lp_ids;
    epd_sample_logprob_t *lps;
    uint32_t lps_sent;
    uint32_t max_new;
    uint64_t seed;
    /* the attempt in flight (SUBMITTED, STREAMING, ABORTING): its
     * epd_client request id, its workers (referenced) */
    uint64_t client_id;
    epd_router_worker_t *pw;
    epd_router_worker_t *dw;
    epd_router_worker_t *avoid[EPD_ROUTER_MAX_AVOID]; /* failed on earlier attempts (not referenced:
                                                         compared only, or looked at once
                                                         found in the registry) */
    uint64_t avoid_ns[EPD_ROUTER_MAX_AVOID];           /* when each was added (monotonic) */
    /* images (chat): r->oai->images holds their bytes */
    uint32_t n_images;
    unsigned char (*img_hash)[32]; /* [n_images] BLAKE2b-256 */
    uint32_t *img_pos;             /* [n_images] first placeholder position */
    /* the attempt in flight: where each image's embeddings come from */
    epd_router_worker_t *img_enc[EPD_CLIENT_MEDIA_MAX]; /* the encoder (referenced) or NULL */
    uint8_t img_src[EPD_CLIENT_MEDIA_MAX];              /* EPD_ROUTER_IMG_* */
    uint32_t n_avoid;
    uint32_t attempts;
    /* overload: the queue and the backoff */
    uint64_t queue_deadline_ns; /* no room by then: 429 */
    uint64_t retry_at_ns;       /* refused for room: not before this */
    uint32_t room_refusals;     /* attempts refused for room (the backoff's exponent; they
                                 * do not count against --max-retries) */
    int turn;                   /* fact: the queue's walk lets it try now */
    /* no usable pair (--no-worker-wait-ms): it waits in line for one */
    uint64_t nw_start_ns; /* it first found no pair (0: never); the wait's bound counts
                           * from here, over every attempt */
    uint64_t nw_wait_ns;  /* how long it waited for a pair, once a pair took it */
    int nw_waiting;       /* its last try found no pair */
    /* no pool of a role could ever hold it (dispatch's EPD_ERR_OUT_OF_RANGE):
     * the role (EPD_CLIENT_ROLE_*), the tokens it needs there, the largest pool */
    int never_role;
    uint64_t never_need, never_limit;
    uint32_t dw_blocks;         /* the attempt's blocks in dw->kv_pending */
    uint64_t t_dispatch_ns;     /* the attempt was submitted */
    uint64_t t_sent_ns;         /* ...read from the clock right after (rule 38's queue end) */
    struct epd_router_req *wprev, *wnext; /* WAITING: the queue, oldest first */
    /* facts */
    int no_hints;       /* a cache hint failed once: no more cache-only images */
    uint32_t n_out;     /* tokens received, over every attempt */
    uint32_t n_base;    /* of those, received before the attempt in flight: it was
                         * migrated there (proto/README.md rule 37).  Its first token
                         * (n_out > n_base) ends SUBMITTED; until then its prompt
                         * (n_prompt + n_base tokens) counts in pw->queued_tokens */
    uint32_t *out;      /* [max_new] the token ids received (a migration's prompt tail) */
    uint32_t migrations; /* attempts that went on after another attempt's tokens */
    int stream_started; /* HTTP SSE headers sent (epd_router_answer.c): an error is then an
                         * event of the stream, not an HTTP status */
    uint64_t t_arrival_ns;
    uint64_t t_parsed_ns; /* body parsed and prompt tokenized (trace) */
    uint64_t t_submit_ns; /* the attempt in flight was submitted (trace) */
    uint64_t trace_id;    /* the newest attempt's id, kept after it ended (trace) */
    uint64_t t_last_ns;   /* last token chunk */
    uint64_t deadline_ns;
    char id[EPD_OAI_ID_MAX];
    int64_t created;
    epd_oai_stream_t stream;
    char *text; /* raw generated bytes */
    size_t text_len;
    size_t text_cap;
    size_t sent; /* bytes of text already handed to the stream encoder */
    /* a model folder with tokenizer.json: the ids' bytes go through this
     * stream decoder, which holds a UTF-8 character split across ids until
     * it is whole (at most 3 bytes), so r->text never ends in half a
     * character the next id completes; flushed at a finish by EOS or length */
    epd_tokenizer_stream_t detok;
    size_t max_stop_len;
    struct epd_router_req *prev, *next; /* all requests (listed from WAITING to DONE) */
};

struct epd_router {
    epd_daemon_t *d; /* the runtime (loop, identity, control plane, signals) */
    uv_loop_t *loop; /* the daemon's */
    /* flags */
    const char *model_dir;
    const char *transport; /* "ucx" or "ofi" */
    char model_name[EPD_CLIENT_NAME_MAX];
    uint32_t heartbeat_ms;
    uint32_t dead_after_ms;
    uint32_t max_retries;
    uint32_t request_timeout_ms;
    uint32_t max_queue;        /* requests WAITING at most (beyond: 429) */
    uint32_t queue_timeout_ms; /* a request without room this long after its arrival: 429 */
    uint32_t no_worker_wait_ms; /* a request without a usable pair waits this long: 503 after */
    uint32_t max_images;      /* per request */
    uint64_t max_image_bytes; /* encoded, per image */
    uint64_t max_image_pixels;
    epd_oai_limits_t json_limits; /* a request body's JSON */
    epd_http_keys_t *keys;        /* --api-key-file (owned by main.c's run), NULL: none */
    epd_http_proxies_t *proxies;  /* --trusted-proxies (owned by main.c's run), NULL: none */
    /* a prompt of more bytes cannot fit in the context whatever its tokens
     * (max_context x the most bytes one token spells): refused before it
     * is tokenized; 0: no bound known */
    uint64_t max_prompt_bytes;
    int ready_without_encoder; /* --ready-without-encoder: /ready needs no encoder */
    /* state */
    epd_msg_epoch_t epoch; /* the daemon's: Health, RegisterResponse, ids */
    epd_engine_t *engine;  /* tokenizer only */
    epd_gen_defaults_t gen_defaults; /* the folder's generation_config.json sampling */
    const epd_engine_info_t *info;
    /* the model's chat template (tokenizer_config.json, or --chat-template);
     * NULL: chat requests keep the plain "<|role|>" rendering (a folder
     * without tokenizer.json, or without a chat_template) */
    epd_chat_template_t *chat;
    epd_chat_prompt_t chat_prompt; /* a request's rendering (scratch) */
    epd_chat_message_t *chat_msgs; /* [chat_msgs_cap] (scratch) */
    size_t chat_msgs_cap;
    /* KV-aware routing: the model's prefix-cache namespace (unsalted),
     * compared with the workers' (RegisterRequest.prefix_root) */
    epd_prefix_hash_t prefix_plain;
    uint64_t *probe_hints; /* [max_context / block_tokens]: a request's hints (scratch) */
    epd_router_registry_t reg;
    epd_client_t *client;
    /* until its last close callback ran after the stop (config.closed):
     * then NULL, and the runtime may stop the transport */
    epd_http_server_t *http;
    epd_router_req_t *reqs; /* every live request */
    uint32_t n_reqs;
    epd_router_req_t *wait_head, *wait_tail; /* WAITING, oldest first */
    uint32_t n_waiting;
    int queue_stalled; /* the walk's last turn found no room */
    /* the walk is running (a dispatch can fail other attempts at once —
     * a worker found dead — whose events would walk the queue again from
     * inside it and give the request being dispatched a second turn, a
     * second attempt, and a second removal from the queue): a nested walk
     * only asks the running one to start over */
    int queue_walking;
    int queue_again;
    int queue_kick; /* requests joined the queue inside an event: walk it after */
    epd_router_drain_t drain; /* how fast the queue drains: a 429's Retry-After */
    epd_rng_t rng;     /* backoff jitter */
    uint64_t id_counter;
    int stopping;
    uint32_t drains_in_flight;
    epd_router_pair_t broken[EPD_ROUTER_PAIRS_MAX]; /* see EPD_ROUTER_PAIR_BROKEN_MS */
    epd_router_metrics_t m;
    epd_oai_buf_t out; /* scratch for encoders */
    int32_t *tok_scratch;
    size_t tok_scratch_cap;
    uint32_t *mig_prompt; /* scratch: a migrated attempt's prompt, for its submit */
    size_t mig_prompt_cap;
    char *detok_scratch;
    size_t detok_scratch_cap;
    /* --trace (the daemon's recorder, NULL when off): per-request spans on
     * the loop thread, keyed by the request id the workers see (the
     * attempt's epd_client id), so the router's trace merges with the
     * prefill and decode daemons' */
    epd_trace_t *trace;
};

/* ---- epd_router_rpc.c ---- */
/* The router's side of epd.Control (ops->on_rpc, arg = the router): it
 * answers every method itself (never EPD_DAEMON_RPC_PASS). */
int epd__router_on_rpc(void *arg, const char *method, const void *req, size_t req_len,
                       void **resp_p, size_t *resp_len_p, char *err, size_t err_cap);

/* ---- epd_router_api.c ---- */
/* HTTP handler (epd_http_handler_cb_t), arg = the router. */
void epd__router_on_http(epd_http_req_t *req, void *arg);

/* ---- epd_router_req.c ---- */
/* Takes a parsed, tokenized request `r` (PARSED, as epd_calloc left it;
 * owned from here: it frees it): lists it, hears of its client going away,
 * and submits its first attempt (or answers why it cannot). */
void epd__router_req_start(epd_router_t *rt, epd_router_req_t *r, uint64_t now_ns);
/* Steps `r` after a fact of it changed outside its events (a group's
 * client gone: r->http NULL); frees it when it is done. */
void epd__router_req_poke(epd_router_t *rt, epd_router_req_t *r, uint64_t now_ns);
/* Request-plane events (epd_client_event_cb_t), arg = the router. */
void epd__router_on_event(void *arg, const epd_client_event_t *ev);
/* Registry upkeep, and WAITING requests submitted again (or failed past
 * their deadline). */
void epd__router_tick(epd_router_t *rt, uint64_t now_ns);
/* Frees every request without answering (shutdown, after the client is
 * destroyed). */
void epd__router_reqs_free_all(epd_router_t *rt);

/* ---- epd_router_dispatch.c (called by epd_router_req.c only) ---- */
/* Submits an attempt of r to a prefill and a decode worker chosen by the
 * policy among those with room.  EPD_OK; EPD_ERR_UNREACHABLE (no eligible
 * worker), EPD_ERR_NO_CAPACITY (workers, but none with room now: the
 * request waits), EPD_ERR_NO_RESOURCE (transport backpressure: it waits
 * too), EPD_ERR_TIMEOUT, EPD_ERR_TOO_LONG, EPD_ERR_NO_MEMORY (a migrated
 * attempt's prompt), other submit errors. */
epd_status_t epd__router_dispatch(epd_router_t *rt, epd_router_req_t *r, uint64_t now_ns);
/* Prefill p and decode d failed each other while the router reaches both:
 * requests go around the pair a while (EPD_ROUTER_PAIR_PROBE_MS, doubling
 * for each failure in a row). */
void epd__router_pair_break(epd_router_t *rt, const epd_router_worker_t *p,
                            const epd_router_worker_t *d, uint64_t now_ns);
/* A request got a token through p and d: the pair is not broken (any
 * memory of it is dropped). */
void epd__router_pair_ok(epd_router_t *rt, const epd_router_worker_t *p,
                         const epd_router_worker_t *d);

/* ---- epd_router_answer.c ---- */
/* The HTTP side of a request only: it records facts (r->http NULL once
 * answered, r->stream_started) and never changes r->state. */
/* An OpenAI error JSON with its status (rt->out as scratch); finishes
 * `http`. */
void epd__router_respond_error(epd_router_t *rt, epd_http_req_t *http, const epd_oai_error_t *err);

/* ---- epd_router_group.c: a request of several choices (loop thread) ---- */
/* A group for oai (owned from here, also on failure) of n_members
 * members, http borrowed until answered.  NULL: out of memory. */
epd_router_group_t *epd__router_group_new(epd_http_req_t *http, epd_oai_request_t *oai,
                                          uint32_t n_members);
/* Drops a reference (a member freed, or the HTTP side finished); frees
 * the group and any member never started at the last. */
void epd__router_group_unref(epd_router_group_t *g);
/* A member's generation finished well: its choice recorded with its
 * logprobs JSON lp[0..lp_len) (borrowed; NULL: none) (its chunk with
 * finish_reason sent when streaming); the answer, or the stream's end,
 * once it is the last.  r->http NULL afterwards. */
void epd__router_group_finish(epd_router_t *rt, epd_router_req_t *r, epd_oai_finish_t finish,
                              const char *lp, size_t lp_len);
/* A member failed: the whole answer fails with err (an error answer, or
 * an error event in the stream); every member's http NULL, so the others
 * stop at their next step.  Counted by the caller. */
void epd__router_group_fail(epd_router_t *rt, epd_router_req_t *r, const epd_oai_error_t *err);
/* A member's SSE stream: its own encoder state (its index), the HTTP
 * stream started by the first.  0, or -1 out of memory. */
int epd__router_group_stream_start(epd_router_t *rt, epd_router_req_t *r);
/* Frees a member never started (the intake's failures). */
void epd__router_req_discard(epd_router_req_t *r);


/* ---- epd_router_tok.c: POST /tokenize, POST /detokenize (vLLM's
 * shapes), GET /version; loop thread ---- */
void epd__router_tokenize_http(epd_router_t *rt, epd_http_req_t *http);
void epd__router_detokenize_http(epd_router_t *rt, epd_http_req_t *http);
void epd__router_version_http(epd_router_t *rt, epd_http_req_t *http);

/* ---- epd_router_prompt.c: a request's prompt as ids in rt->tok_scratch;
 * loop thread.  Each returns 0, or -1 (out of memory; the ones taking err
 * fill it) ---- */
/* text[0..len) through the model's tokenizer, BOS added as epd-generate
 * does */
int epd__router_tokenize(epd_router_t *rt, const char *text, size_t len, size_t *n_p);
/* a prompt of token ids, checked against the vocabulary and the context
 * (-1 with *err filled), copied as tokenizing would */
int epd__router_prompt_ids(epd_router_t *rt, const epd_oai_request_t *oai, size_t *n_p,
                           epd_oai_error_t *err);
/* the messages through the model's chat template into segments (rt->chat),
 * *len_p the rendered length; then their ids */
int epd__router_render_chat(epd_router_t *rt, const epd_oai_request_t *oai, size_t *len_p);
int epd__router_tokenize_chat(epd_router_t *rt, size_t *n_p);
/* a prompt with images: each image's placeholder tokens where it stands,
 * img_pos[k] its first */
int epd__router_tokenize_images(epd_router_t *rt, const epd_oai_request_t *oai,
                                uint32_t *img_pos, size_t *n_p);
/* a chat request without images tokenized exactly as /v1/chat/completions
 * tokenizes it (the model's own template when it has one); -1 for images */
int epd__router_tokenize_chat_request(epd_router_t *rt, const epd_oai_request_t *oai, size_t *n_p);

void epd__router_respond_simple_error(epd_router_t *rt, epd_http_req_t *http, int status,
                                      const char *msg);
/* Ends the HTTP side of `r` with an error (counted as `kind`): an HTTP
 * error answer before the stream started, an error event after; `fmt`
 * takes the two strings a and b.  r->http is NULL afterwards (a no-op but
 * for the count when it already was). */
void epd__router_fail_http(epd_router_t *rt, epd_router_req_t *r, epd_router_err_kind_t kind,
                           int http_status, const char *fmt, const char *a, const char *b);
/* Ends the HTTP side of `r` (no token went out) with 429 Too Many Requests,
 * `Retry-After` and OpenAI's rate-limit error body ("type": "requests",
 * "code": "rate_limit_exceeded"), the message saying `why` (counted as
 * EPD_ROUTER_ERR_OVERLOADED).  r->http is NULL afterwards. */
void epd__router_fail_overloaded(epd_router_t *rt, epd_router_req_t *r, const char *why);
/* Ends the HTTP side of `r` with 503 "no prefill or decode worker is
 * available", `Retry-After` and, when it waited for a pair,
 * `epd-no-worker-wait-ms` (an error event instead when its stream started:
 * a migrated attempt).  Counted as EPD_ROUTER_ERR_NO_WORKERS.  r->http is
 * NULL afterwards. */
void epd__router_fail_no_workers(epd_router_t *rt, epd_router_req_t *r, uint64_t now_ns);
/* The generation finished well (EOS, max_tokens or a stop string): the
 * JSON answer, or the rest of the stream and its end.  r->http is NULL
 * afterwards (a no-op when it already was). */
void epd__router_finish_ok(epd_router_t *rt, epd_router_req_t *r, epd_oai_finish_t finish);
/* Detokenizes ids[0..n) onto r->text: 0, or -1 out of memory. */
int epd__router_text_append(epd_router_t *rt, epd_router_req_t *r, const uint32_t *ids, uint32_t n);
/* The bytes the stream decoder still holds (an incomplete character at
 * the end of the generation) appended to r->text.  0, or -1 out of
 * memory. */
int epd__router_text_flush(epd_router_t *rt, epd_router_req_t *r);
/* After new text: 1 when a stop string ends the generation (the text cut
 * before it); 0 after streaming what can no longer be part of a match;
 * -1 out of memory. */
int epd__router_after_text(epd_router_t *rt, epd_router_req_t *r);

#endif
