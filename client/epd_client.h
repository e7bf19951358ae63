/*
 * epd_client.h — the client side of the request plane (proto/README.md):
 * what epd-router, epd-ctl, the benchmarks and the integration tests use.
 *
 * A client is one transport worker (epd_xport_t) plus the requests it has
 * submitted.  It learns a worker (prefill or decode) from the worker's
 * control address with a gRPC Health call (role, worker id, epoch,
 * data-plane address, KV layout, capacity), connects to it over the
 * transport, and then, per request, sends the same GenerateRequest to the
 * chosen prefill and decode workers (step 2), sends Abort to both on
 * request (step 7), and turns what comes back into events:
 *
 *   TOKENS   a TokenChunk from the decode worker (index, ids, finish);
 *   ERROR    an Error (or Abort) from either worker, or a failure seen here:
 *            a client-side deadline (EPD_ERR_TIMEOUT), a worker's endpoint
 *            dying (EPD_ERR_PEER_DEAD), a malformed stream (a chunk out of
 *            order, more tokens than asked: EPD_ERR_MALFORMED);
 *   REFUSED  a KvRefused from the decode worker (no capacity).
 *
 * Every submitted request ends in exactly one terminal event (a chunk with
 * finish != NONE, an ERROR or a REFUSED) and nothing is delivered for it
 * afterwards: the request id is forgotten before the terminal callback
 * runs, and later messages naming it are dropped with a debug log line
 * ("unknown request id").  Every incoming frame is decoded and validated
 * (epd_msg_decode); a message is attributed by its Envelope.sender (worker
 * id and epoch), never by the endpoint it came in on: a message whose
 * sender is neither of the request's workers (another worker, an old
 * epoch) is dropped and logged.
 *
 * Threads: a client belongs to the thread that created it (a plain thread
 * driving it with epd_client_poll, or a libuv loop thread driving its xport
 * with epd_xport_uv and calling epd_client_tick from a timer).  Every
 * callback runs on that thread, from inside epd_client_poll /
 * epd_xport_progress / epd_client_tick; callbacks may call
 * epd_client_submit and epd_client_abort.  Nothing here takes a lock.
 * Only epd_client_health (a blocking gRPC call) may run on any thread.
 */
#ifndef EPD_CLIENT_H
#define EPD_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "epd_sample.h"
#include "epd_status.h"
#include "epd_xport.h"

typedef struct epd_client epd_client_t;
typedef struct epd_client_worker epd_client_worker_t;

#define EPD_CLIENT_NAME_MAX 128    /* worker ids, model names (with NUL) */
#define EPD_CLIENT_PATTERN_MAX 257 /* layer pattern: one char per layer + NUL */

/* Roles (values of epd.Role in epd_common.proto). */
#define EPD_CLIENT_ROLE_ENCODER 1
#define EPD_CLIENT_ROLE_PREFILL 2
#define EPD_CLIENT_ROLE_DECODE 3
#define EPD_CLIENT_ROLE_ROUTER 4
#define EPD_CLIENT_ROLE_TOOL 5

/* Finish reasons of a chunk (values of epd.FinishReason). */
#define EPD_CLIENT_FINISH_NONE 0
#define EPD_CLIENT_FINISH_LENGTH 1
#define EPD_CLIENT_FINISH_STOP 2
#define EPD_CLIENT_FINISH_ABORT 3
#define EPD_CLIENT_FINISH_ERROR 4

/* What a worker's Health answer says about it (plain data, copyable). */
typedef struct {
    char worker_id[EPD_CLIENT_NAME_MAX];
    int role; /* EPD_CLIENT_ROLE_* */
    char model[EPD_CLIENT_NAME_MAX];
    uint64_t epoch_start_ns;
    uint64_t epoch_nonce;
    char transport[16];                        /* "ucx", "ofi" */
    unsigned char address[EPD_XPORT_ADDR_MAX]; /* data-plane address blob */
    size_t address_len;
    int serving;
    int draining;
    /* KV layout (epd.KvLayout) */
    uint32_t n_layers;
    char layer_pattern[EPD_CLIENT_PATTERN_MAX];
    uint32_t block_tokens;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    int kv_dtype; /* epd.KvDtype */
    char kv_dtype_map[128]; /* KvLayout.kv_dtype_map, canonical ("int8", "0-3:bf16,4-7:fp8") */
    uint64_t block_bytes;
    uint64_t state_bytes;
    /* capacity (epd.Capacity) */
    uint32_t kv_blocks_total;
    uint32_t state_slots_total;
    uint32_t max_batch;
    uint32_t max_context;
    uint32_t embed_slots;      /* prefill: its embedding cache; encoder: images at once */
    uint32_t image_embeddings; /* 0: no vision */
    uint32_t embed_dim;
    /* decode: KV on demand, admission holds prompt + this many tokens and
     * the request grows (0: prompt + max_tokens reserved up front) */
    uint32_t kv_headroom_tokens;
    /* load (epd.Load) at the time of the call */
    uint32_t queue_depth;
    uint64_t queued_tokens;
    uint64_t router_queued_tokens; /* of those, its router's (epd.Load 20) */
    uint32_t kv_blocks_free;
    uint32_t state_slots_free;
    uint32_t running_requests;
} epd_client_worker_info_t;

/*
 * Parses a packed epd.HealthResponse (buf[0..len), borrowed) into *info_p
 * (caller's storage, written only on success).  Refuses (EPD_ERR_MALFORMED,
 * *why_p = a static string naming the problem when why_p is not NULL) an
 * answer that does not decode, lacks the worker identity or epoch, has an
 * empty or oversized worker id or data-plane address, or a role other than
 * prefill/decode.  Pure; any thread.
 */
epd_status_t epd_client_health_parse(const void *buf, size_t len, epd_client_worker_info_t *info_p,
                                     const char **why_p);

/*
 * Calls Health on `control_addr` ("127.0.0.1:PORT") and parses the answer
 * into *info_p.  Blocks for at most timeout_ms (never call it on a loop
 * thread).  Errors of epd_rpc_call (EPD_ERR_UNREACHABLE, EPD_ERR_TIMEOUT,
 * ...) or of epd_client_health_parse; the reason goes to err[0..err_cap)
 * when err is not NULL.  Any thread.
 */
epd_status_t epd_client_health(const char *control_addr, int timeout_ms,
                               epd_client_worker_info_t *info_p, char *err, size_t err_cap);

/* One event of one request; every pointer is borrowed for the callback. */
typedef enum {
    EPD_CLIENT_EV_TOKENS = 1,
    EPD_CLIENT_EV_ERROR = 2,
    EPD_CLIENT_EV_REFUSED = 3,
} epd_client_ev_kind_t;

/* Where a request's time to first token went (proto/README.md rule 38):
 * durations, each on the clock of the worker that measured it. */
typedef struct {
    uint64_t encode_ns;          /* prefill: received -> every image ready */
    uint64_t prefill_queue_ns;   /* prefill: -> the run started */
    uint64_t prefill_compute_ns; /* prefill: the run */
    uint64_t kv_tail_ns;         /* prefill: compute done -> PrefillComplete posted, plus
                                  * decode: PrefillComplete received -> the KV held */
    uint64_t handoff_ns;         /* decode: the KV held -> the first chunk posted */
    uint32_t cached_tokens;      /* prompt tokens prefill's prefix cache served */
} epd_client_phase_times_t;

#define EPD_CLIENT_LP_CHUNK_MAX 64 /* decode's EPD_DECODE_LP_CHUNK_MAX */

typedef struct {
    epd_client_ev_kind_t kind;
    uint64_t request_id;
    void *user;   /* the submit's user pointer */
    int terminal; /* 1: the request's last event */
    /* TOKENS */
    uint32_t index; /* position of tokens[0] among generated tokens */
    const uint32_t *tokens;
    uint32_t n_tokens;
    int finish; /* EPD_CLIENT_FINISH_* */
    /* TOKENS at index 0: the phase times its decode worker sent, NULL
     * when it sent none (an older worker, prefill only) */
    const epd_client_phase_times_t *times;
    /* TOKENS of a request that asked for logprobs (a chunk then holds at
     * most EPD_CLIENT_LP_CHUNK_MAX tokens, as decode sends them): one per token
     * (borrowed for the callback); NULL otherwise */
    const epd_sample_logprob_t *logprobs;
    /* ERROR, REFUSED */
    epd_status_t status;
    const char *message; /* never NULL */
    const char *from;    /* worker id that reported it, or "client" */
    const char *culprit; /* ERROR: the worker the reporter blames ("" when none) */
} epd_client_event_t;

typedef void (*epd_client_event_cb_t)(void *arg, const epd_client_event_t *ev);

typedef struct {
    /* transport */
    const char *backend;         /* "ucx" (default) or "ofi" */
    const char *expect;          /* NULL/"any", "shm", "tcp", "rdma" */
    const char *provider;        /* ofi provider hint, NULL = default */
    const char *bind_host;       /* ofi: the local address to bind (NULL: 127.0.0.1) */
    uint32_t peer_timeout_ms;    /* default 3000 */
    uint32_t connect_timeout_ms; /* default 3000 */
    size_t max_msg_size;         /* default 64 KiB */
    /* the cluster secret (NULL/0: none, loopback clusters only): every
     * endpoint authenticates both ends and names them (borrowed for
     * epd_client_create) */
    const void *secret;
    size_t secret_len;
    /* identity carried in every envelope's sender */
    const char *worker_id; /* default "ctl-<pid>" (copied) */
    int role;              /* EPD_CLIENT_ROLE_TOOL (default) or _ROUTER */
    /* the epoch (both 0, the default: a fresh one, see epd_client_create);
     * a daemon gives its own, so that its request plane and its control
     * plane speak as one incarnation */
    uint64_t epoch_start_ns;
    uint64_t epoch_nonce;
    /* control plane */
    int rpc_timeout_ms; /* Health calls of epd_client_add_worker; default 3000 */
    /* events */
    epd_client_event_cb_t event_cb; /* required */
    void *cb_arg;
} epd_client_config_t;

/* Fills `config` with the defaults above (event_cb NULL). */
void epd_client_config_init(epd_client_config_t *config);

/*
 * Creates a client (owned by the caller: epd_client_destroy) bound to the
 * calling thread, with the configured epoch or a fresh one (wall clock +
 * epd_rng_entropy).
 * `config` is borrowed for the call.  EPD_ERR_INVALID_PARAM without an
 * event callback; the transport's errors (EPD_ERR_CONFIG).
 */
epd_status_t epd_client_create(const epd_client_config_t *config, epd_client_t **client_p);

/* Closes every endpoint and forgets every request WITHOUT delivering
 * events (the caller is going away).  Owner thread.  NULL is a no-op. */
void epd_client_destroy(epd_client_t *client);

/* The client's transport (borrowed), to drive it from a libuv loop. */
epd_xport_t *epd_client_xport(epd_client_t *client);

/* The client's worker id and epoch (borrowed strings / values). */
const char *epd_client_id(const epd_client_t *client);
void epd_client_epoch(const epd_client_t *client, uint64_t *start_ns_p, uint64_t *nonce_p);

/*
 * Adds a worker learned by Health (info copied) and connects to its
 * data-plane address (asynchronously: sends queue behind the handshake;
 * a failed connect fails the worker's requests with EPD_ERR_PEER_DEAD).
 * *worker_p is owned by the client (freed by epd_client_destroy).
 * EPD_ERR_BAD_ADDRESS, EPD_ERR_NO_MEMORY.  Owner thread, non-blocking.
 */
epd_status_t epd_client_add_worker_info(epd_client_t *client, const epd_client_worker_info_t *info,
                                        epd_client_worker_t **worker_p);

/* epd_client_health + epd_client_add_worker_info.  Blocks on the Health
 * call (config.rpc_timeout_ms): for tools and tests, not loop threads. */
epd_status_t epd_client_add_worker(epd_client_t *client, const char *control_addr,
                                   epd_client_worker_t **worker_p);

/* The worker's Health information (borrowed, valid while the client is). */
const epd_client_worker_info_t *epd_client_worker_info(const epd_client_worker_t *worker);

/* EPD_OK while the worker's endpoint is usable; its failure otherwise. */
epd_status_t epd_client_worker_state(const epd_client_worker_t *worker);

/* What the client's endpoint to the worker really uses, into buf[0..len):
 * "CLASS: LANES" (class "shm", "tcp", "rdma" or "other"; the transport's
 * description of the lanes), "down: STATUS" once it failed.  Owner thread. */
void epd_client_worker_link(epd_client_worker_t *worker, char *buf, size_t len);

/* Images per request the client accepts (proto/README.md rule 13). */
#define EPD_CLIENT_MEDIA_MAX 8

/* One image of a multimodal request: where prefill gets its embeddings
 * (proto/README.md rule 13).  Borrowed for the submit call. */
typedef struct {
    const void *image; /* the encoded bytes (PNG / JPEG) */
    size_t image_len;
    const unsigned char *hash; /* BLAKE2b-256 of image (32 bytes) */
    uint32_t pos;              /* first placeholder position in the prompt */
    uint32_t n;                /* placeholders (the model's image_embeddings) */
    /* an encoder worker writes the embeddings (EncodeRequest to it); NULL:
     * the prefill worker has them cached (inline 0) or encodes the bytes
     * itself (inline 1) */
    epd_client_worker_t *encoder;
    int inline_data;
} epd_client_media_t;

/* One request to submit; everything is borrowed for the call. */
typedef struct {
    const uint32_t *prompt; /* token ids (BOS included, as tokenize(add_bos=1)) */
    uint32_t n_prompt;
    float temperature; /* 0 = greedy */
    float top_p;       /* (0, 1]; 1 = off */
    uint32_t top_k;    /* 0 = off */
    uint64_t seed;
    uint32_t max_tokens;      /* >= 1 */
    const uint32_t *stop_ids; /* may be NULL */
    uint32_t n_stop_ids;
    /* logit adjustments (engine/epd_sample.h; SamplingParams 7..13): 0 /
     * NULL for none */
    float presence_penalty;
    float frequency_penalty;
    float repetition_penalty; /* 0 or 1: off */
    const uint32_t *bias_ids; /* [n_bias] */
    const float *bias_values; /* [n_bias] */
    uint32_t n_bias;
    uint32_t min_tokens;
    int ignore_eos;
    /* 0: none; 1 + k (k <= 20): every token's logprobs and its k best
     * alternatives come in the TOKENS events (SamplingParams.logprobs) */
    uint32_t logprobs;
    epd_client_worker_t *prefill; /* a worker of role PREFILL */
    epd_client_worker_t *decode;  /* a worker of role DECODE */
    uint32_t deadline_ms;         /* budget for the whole request (> 0) */
    void *user;                   /* passed back in every event */
    const epd_client_media_t *media; /* images, in prompt order (n_media <= EPD_CLIENT_MEDIA_MAX) */
    uint32_t n_media;
    /* the prefix cache namespace of a tenant (GenerateRequest.cache_salt,
     * at most 256 bytes); NULL / 0: the shared one */
    const void *cache_salt;
    size_t cache_salt_len;
    /* a migrated request (proto/README.md rule 37): the last
     * resume_generated tokens of prompt are tokens an earlier attempt
     * generated (and streamed); the stream goes on at that index, max_tokens
     * still counts from 0.  Below n_prompt and max_tokens, no media; 0: a
     * new request. */
    uint32_t resume_generated;
} epd_client_request_t;

/*
 * Sends the request's GenerateRequest to its decode worker and to its
 * prefill worker (the media only to prefill), an EncodeRequest to the
 * encoder of each image that names one, and starts its client-side
 * deadline.  An encoder's Error or endpoint failure ends the request like
 * the other workers' (terminal event with `from` = that encoder; Abort to
 * the rest).  On EPD_OK
 * *request_id_p (may be NULL) gets the id, and exactly one terminal event
 * will follow (possibly from inside a later call on this thread, never
 * from inside this one).  Errors (nothing delivered, nothing left
 * pending): EPD_ERR_INVALID_PARAM (empty prompt, max_tokens 0, wrong
 * roles, deadline 0), EPD_ERR_TOO_LONG (the message exceeds max_msg_size),
 * EPD_ERR_PEER_DEAD (a worker's endpoint failed), EPD_ERR_NO_RESOURCE
 * (transport backpressure: progress, then retry), EPD_ERR_NO_MEMORY.
 * Owner thread.
 */
epd_status_t epd_client_submit(epd_client_t *client, const epd_client_request_t *req,
                               uint64_t *request_id_p);

/*
 * Asks both workers to stop request `request_id` (Abort to each).  The
 * terminal event still comes from the workers (a chunk with finish ABORT
 * from the decode worker), or from the deadline.  From now on the request
 * ends as aborted whatever order the workers' answers cross in: an Error
 * (or Abort, or KvRefused) from any of its workers ends it as an ERROR
 * with status EPD_ERR_CANCELED and that worker's text, never with the
 * status the worker gave (NOT_FOUND, when our Abort reached it after it
 * let the request go); an Error or Abort from the prefill worker alone
 * does not end it (the decode worker gives the final answer).  A chunk that finished
 * normally before the Abort landed is still reported as it is.
 * EPD_ERR_NOT_FOUND when the request already ended (its terminal event
 * was delivered).  Sends refused by backpressure are retried by
 * epd_client_tick.  Owner thread.
 */
epd_status_t epd_client_abort(epd_client_t *client, uint64_t request_id);

/* Requests submitted and not yet ended. */
uint32_t epd_client_live(const epd_client_t *client);

/* Enforces deadlines (terminal EPD_ERR_TIMEOUT + Abort to both workers)
 * and retries pending aborts.  Call it at least every 50 ms when the xport
 * is driven elsewhere (epd_client_poll calls it).  Owner thread. */
void epd_client_tick(epd_client_t *client);

/* Progresses the transport (sleeping at most timeout_ms when idle, less
 * when a deadline is nearer) and ticks.  Returns the number of transport
 * events handled.  Owner thread. */
int epd_client_poll(epd_client_t *client, int timeout_ms);

/* Counters (any message dropped, and why). */
typedef struct {
    uint64_t bad_frames;     /* did not decode */
    uint64_t unknown_ids;    /* named no live request */
    uint64_t foreign_sender; /* sender not one of the request's workers */
    uint64_t unexpected;     /* a body the client never expects */
    uint64_t forged;         /* sender not its endpoint's authenticated identity */
} epd_client_stats_t;

void epd_client_stats(const epd_client_t *client, epd_client_stats_t *stats_p);

/* "LENGTH", "STOP", "ABORT", "ERROR", "NONE" (static; "?" for others). */
const char *epd_client_finish_name(int finish);

#endif
