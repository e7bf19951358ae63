/*
 * epd_openai.h — the OpenAI API as the router speaks it: request parsing
 * and validation, and the JSON the official SDKs read back.
 *
 * Requests.  POST /v1/completions and POST /v1/chat/completions bodies are
 * first scanned against limits (epd_oai_limits_t: nesting depth, elements,
 * string length; one pass over the bytes, no recursion, before jansson
 * allocates anything), then parsed with jansson (duplicate keys refused)
 * into an epd_oai_request_t.
 * Every refusal fills an epd_oai_error_t: the HTTP status, the OpenAI error
 * type, a message naming the field, `param` (the field, or empty for
 * null) and `code` (empty for null; "model_not_found" for an unknown
 * model).  A JSON null counts as an absent optional field.
 *
 * Fields.  Nothing is silently ignored (epd_openai_fields.c holds the
 * table): every top-level key is implemented (below), accepted without
 * effect (user, metadata, store, service_tier, parallel_tool_calls,
 * prompt_cache_key, safety_identifier, request_id), accepted only at the
 * value that asks for nothing (presence_penalty 0, logit_bias {}, tools [],
 * response_format {"type": "text"}, ...; another value is a 400 with code
 * "unsupported_parameter" naming it), or refused whenever present (audio,
 * prediction, guided_*, ...).  An unknown key is a 400, "Unrecognized
 * request argument supplied: KEY", as OpenAI answers it (param: the key).
 *
 *   model              required string, one of the served models (else 404)
 *   prompt             (completions) required: a string, an array of token
 *                      ids (used as given, nothing added), or an array of
 *                      these: one is a single prompt, 2..EPD_OAI_MAX_BATCH
 *                      a batch (one choice per prompt and per n, in order)
 *   messages           (chat) required non-empty array of {role, content}:
 *                      role "system" | "user" | "assistant"; content a string
 *                      or an array of {"type": "text", "text": string} and
 *                      {"type": "image_url", "image_url": {"url": URL}} (or
 *                      "image_url": URL) parts, where URL must be a data: URL
 *                      "data:image/SUBTYPE;base64,DATA" (strict base64, with
 *                      or without padding); an http(s) URL is refused with a
 *                      clear 400 (this server does not fetch images); at
 *                      most EPD_OAI_MAX_IMAGES images
 *   max_tokens         integer ≥ 1 and ≤ the model's context (or
 *                      max_completion_tokens: both must then agree); default: completions 16, chat
 *                      "up to the context" (see epd_oai_check_length)
 *   temperature        number in [0, 2], default 1
 *   top_p              number in (0, 1], default 1
 *   top_k              (extension) integer ≥ -1; 0 and -1 mean off
 *   seed               integer
 *   n                  1..EPD_OAI_MAX_N choices per prompt (n x prompts at
 *                      most EPD_OAI_MAX_CHOICES); choice i is seeded seed + i
 *   echo               (completions) boolean: the prompt's text before each
 *                      choice's text; not with logprobs (400 naming echo)
 *   stream             boolean; stream_options.include_usage boolean (only
 *                      with stream true)
 *   stop               a string or an array of at most 4 non-empty strings,
 *                      kept as text (the router maps them)
 *   presence_penalty, frequency_penalty  numbers in [-2, 2], default 0
 *   repetition_penalty (extension, vLLM's) number in (0, 2], default 1
 *   logit_bias         object {"TOKEN_ID": number}: at most 300 entries,
 *                      ids < vocab, values clamped to [-100, 100]
 *   min_tokens         (extension) integer ≥ 0, ≤ the tokens to generate
 *   ignore_eos         (extension) boolean
 *   stop_token_ids     (extension) array of at most 64 token ids < vocab
 *   logprobs           completions: integer 0..20 (the token's logprob and
 *                      its K best); chat: boolean, with top_logprobs 0..20
 *   epd_encode         (extension) "auto" (default) or "local": the
 *                      prefill worker encodes the images itself even when
 *                      encoders are registered (benchmarks compare both)
 *   cache_salt         (extension, as vLLM's) a string of 1..256 bytes: the
 *                      request's prompt blocks are cached in a namespace of
 *                      their own, shared only with requests of the same salt
 *   add_generation_prompt (chat, extension as vLLM's) boolean, default true
 *   chat_template_kwargs  (chat, extension as vLLM's) an object; its
 *                      "enable_thinking" (boolean, default true) is Qwen3's
 *                      switch; other keys are ignored
 *
 * Chat template.  The router renders the messages with the model's own
 * template when its folder has one (engine/epd_chat.h: msgs below locate
 * each message's role and content).  Otherwise, and in `prompt` always
 * (documented, simple, model-agnostic): each message becomes
 * "<|ROLE|>\nCONTENT\n" in order (text parts of an array content are
 * concatenated), and the prompt ends with "<|assistant|>\n".  An image part
 * adds no text: it is recorded with the byte offset of the rendered prompt
 * where it stands, and the router puts the image's placeholder tokens there
 * (as epd-generate does for each "<|image|>" of its --prompt).
 *
 * Responses.  The encoders write JSON by hand (not jansson) into an
 * epd_oai_buf_t the caller reuses, so a stream allocates nothing once its
 * buffers have grown.  Generated text is raw bytes from a byte-level
 * model: it is repaired exactly as epd-generate repairs its output
 * (epd_utf8_repair: one U+FFFD per maximal invalid subsequence), and a
 * stream holds back an incomplete UTF-8 tail (epd_utf8_incomplete_tail) so
 * that no event splits a character; the concatenated text of a stream's
 * events therefore equals epd_utf8_repair of all its bytes at once.
 *
 * Streaming wire format, as the SDKs parse it: each event is
 * "data: {json}\n\n"; completions chunks have object "text_completion" and
 * choices[0].text; chat chunks have object "chat.completion.chunk" and
 * choices[0].delta (the first carries delta.role "assistant"); the last
 * choice chunk carries finish_reason; with include_usage every chunk has
 * "usage": null and one more chunk follows with "choices": [] and the usage;
 * then "data: [DONE]\n\n".
 *
 * Everything here is pure: any thread, no globals, allocation only
 * through the epd_malloc funnel (jansson's own parse tree aside).
 */
#ifndef EPD_OPENAI_H
#define EPD_OPENAI_H

#include <stddef.h>
#include <stdint.h>

#include "epd_status.h"

typedef enum {
    EPD_OAI_COMPLETION = 0, /* POST /v1/completions */
    EPD_OAI_CHAT,           /* POST /v1/chat/completions */
} epd_oai_kind_t;

typedef enum {
    EPD_OAI_FINISH_STOP = 0, /* EOS or a stop string */
    EPD_OAI_FINISH_LENGTH,   /* max_tokens or the context */
} epd_oai_finish_t;

#define EPD_OAI_MAX_STOP 4
#define EPD_OAI_MAX_IMAGES 64 /* parse limit; the router sets its own, lower */

/* One image of a chat request, decoded from its data: URL. */
typedef struct {
    unsigned char *data;  /* owned: the encoded image bytes (base64 decoded) */
    size_t len;
    size_t prompt_offset; /* where its placeholders go: a byte offset into prompt */
    uint32_t message;     /* messages[message].content[part] (error messages) */
    uint32_t part;
} epd_oai_image_t;

/* One chat message: byte ranges of the request's prompt. */
typedef struct {
    size_t role_off, role_len;
    size_t content_off, content_len;
} epd_oai_msg_t;

/* One prompt of a completions batch: text, or token ids (ids != NULL). */
typedef struct {
    char *text; /* owned, NUL terminated ("" for ids) */
    size_t len;
    uint32_t *ids; /* owned [n_ids], or NULL */
    size_t n_ids;
} epd_oai_prompt_t;

#define EPD_OAI_MAX_N 16       /* choices per prompt ("n") */
#define EPD_OAI_MAX_BATCH 64   /* prompts in one completions request */
#define EPD_OAI_MAX_CHOICES 64 /* n x prompts */

typedef struct {
    epd_oai_kind_t kind;
    char *model;        /* owned */
    char *prompt;       /* owned, NUL terminated; chat: the rendered template */
    size_t prompt_len;  /* bytes (prompts may hold no NUL: jansson refuses \u0000) */
    /* completions: a prompt of token ids (owned [n_prompt_ids], used as
     * given: nothing added), or NULL for a text prompt (prompt is then "") */
    uint32_t *prompt_ids;
    size_t n_prompt_ids;
    int64_t max_tokens; /* ≥ 1 when has_max_tokens */
    int has_max_tokens; /* 0: completions default 16 / chat up to the context */
    double temperature;
    double top_p;
    int64_t top_k; /* 0: off */
    /* nonzero: the request gave the value (else it holds the API default,
     * which a model folder's generation_config.json may replace) */
    int has_temperature;
    int has_top_p;
    int has_top_k;
    int64_t seed;
    int has_seed;
    int stream;
    int include_usage;
    char *stop[EPD_OAI_MAX_STOP]; /* owned, NUL terminated, non-empty */
    size_t n_stop;
    epd_oai_image_t *images; /* owned [n_images], in prompt order (chat only) */
    size_t n_images;
    int encode_local; /* extension "epd_encode": "local": no encoder pool for its images */
    char *cache_salt; /* owned; NULL: none ("cache_salt", as vLLM's) */
    /* logit adjustments (engine/epd_sample.h: vLLM's formulas), parsed by
     * epd_openai_fields.c; ids checked against the vocabulary by
     * epd_oai_check_sampling */
    double presence_penalty;   /* [-2, 2], default 0 */
    double frequency_penalty;  /* [-2, 2], default 0 */
    double repetition_penalty; /* (0, 2], default 1 */
    uint32_t *bias_ids;        /* owned [n_bias] (logit_bias keys) */
    float *bias_values;        /* owned [n_bias], each in [-100, 100] */
    size_t n_bias;
    int64_t min_tokens; /* ≥ 0 */
    int ignore_eos;
    uint32_t *stop_token_ids; /* owned [n_stop_token_ids] */
    size_t n_stop_token_ids;
    /* logprobs: completions "logprobs": K, chat "logprobs": true with
     * "top_logprobs": K (K <= 20) */
    int want_logprobs;
    uint32_t top_logprobs;
    /* chat: message i's role and content as byte ranges of prompt (the
     * plain rendering holds both verbatim), for a model's own template;
     * owned [n_msgs] */
    epd_oai_msg_t *msgs;
    size_t n_msgs;
    int add_generation_prompt; /* chat; default 1 */
    /* completions: a batch of 2.. prompts (owned [n_batch]), or NULL for one
     * prompt (prompt / prompt_ids above) */
    epd_oai_prompt_t *batch;
    size_t n_batch;
    uint32_t n; /* choices per prompt, 1..EPD_OAI_MAX_N */
    int echo;   /* completions: the prompt's text before each choice's */
    int enable_thinking;       /* chat_template_kwargs.enable_thinking; default 1 */
} epd_oai_request_t;

typedef struct {
    int http_status; /* 400, 404, 413, 500, ... */
    char type[32];   /* "invalid_request_error", "server_error" */
    char message[256];
    char param[64]; /* the field, e.g. "messages[2].content"; "" → null */
    char code[32];  /* "" → null */
} epd_oai_error_t;

/* A growable output buffer, reused across encodes (never shrinks).
 * Initialize with memset 0 or EPD_OAI_BUF_INIT; release with
 * epd_oai_buf_cleanup.  The encoders append; data is NUL terminated after
 * a successful encode. */
typedef struct {
    char *data; /* owned */
    size_t len;
    size_t cap;
} epd_oai_buf_t;

#define EPD_OAI_BUF_INIT                                                                           \
    {                                                                                              \
        NULL, 0, 0                                                                                 \
    }

/* Drops the contents (keeps the memory). */
void epd_oai_buf_reset(epd_oai_buf_t *buf);
/* Frees the memory; the buffer is empty and reusable afterwards. */
void epd_oai_buf_cleanup(epd_oai_buf_t *buf);

/* Fills *err (caller's storage): status, type, message (printf format),
 * param (NULL → null) and code (NULL → null).  Any thread. */
void epd_oai_error_set(epd_oai_error_t *err, int http_status, const char *param, const char *code,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* What a request body's JSON may hold, checked before it is parsed. */
typedef struct {
    uint32_t max_depth;      /* arrays and objects nested (the body's object is 1) */
    uint64_t max_elements;   /* array elements plus object members, all together */
    size_t max_string_bytes; /* one string (or key) as sent, escapes included */
} epd_oai_limits_t;

#define EPD_OAI_MAX_DEPTH 64
#define EPD_OAI_MAX_ELEMENTS 100000
#define EPD_OAI_MAX_STRING_BYTES ((size_t)16 << 20)

/* Fills `limits` with the defaults above.  Any thread. */
void epd_oai_limits_init(epd_oai_limits_t *limits);

/* Scans body[0..len) (borrowed) against `limits` without parsing it: O(len)
 * time, O(1) memory.  It judges only what the limits name (whether the JSON
 * is valid is the parser's business).  EPD_OK, or EPD_ERR_INVALID_PARAM with
 * *err filled: 400 naming the limit, code "json_too_deep",
 * "json_too_many_elements" or "json_string_too_long".  Any thread. */
epd_status_t epd_oai_json_check(const void *body, size_t len, const epd_oai_limits_t *limits,
                                epd_oai_error_t *err);

/* Parses and validates a request body body[0..len) (borrowed) of `kind`,
 * held to `limits` (borrowed; NULL: the defaults, see epd_oai_limits_init);
 * otherwise as epd_oai_request_parse. */
epd_status_t epd_oai_request_parse_limited(epd_oai_kind_t kind, const void *body, size_t len,
                                           const char *const *models, size_t n_models,
                                           int64_t max_context, const epd_oai_limits_t *limits,
                                           epd_oai_request_t **req_p, epd_oai_error_t *err);

/* Parses and validates a request body body[0..len) (borrowed) of `kind`,
 * under the default limits.
 * `models[0..n_models)` (borrowed) are the served model names;
 * `max_context` (tokens, ≥ 1) bounds max_tokens.  EPD_OK: *req_p is the
 * caller's (epd_oai_request_destroy).  EPD_ERR_INVALID_PARAM: *err filled
 * (4xx; *req_p untouched).  EPD_ERR_NO_MEMORY: *err filled (500).  Any
 * thread. */
epd_status_t epd_oai_request_parse(epd_oai_kind_t kind, const void *body, size_t len,
                                   const char *const *models, size_t n_models, int64_t max_context,
                                   epd_oai_request_t **req_p, epd_oai_error_t *err);

/* Frees a parsed request; NULL is a no-op. */
void epd_oai_request_destroy(epd_oai_request_t *req);

/* The check the router makes once it has tokenized the prompt:
 * prompt_tokens (≥ 0, BOS included) plus the completion must fit in
 * max_context.  EPD_OK: *max_new_p = the tokens to generate (the request's
 * max_tokens; without one, completions 16 clamped to the room left and chat
 * all the room left).  EPD_ERR_INVALID_PARAM: *err filled (400, param
 * "max_tokens" when the request set it, else "prompt"/"messages").  Any
 * thread. */
epd_status_t epd_oai_check_length(const epd_oai_request_t *req, int64_t prompt_tokens,
                                  int64_t max_context, int64_t *max_new_p, epd_oai_error_t *err);

/* The checks of the sampling fields that need the model: logit_bias and
 * stop_token_ids ids below `vocab`, min_tokens at most max_new (the
 * tokens epd_oai_check_length allows).  EPD_OK, or EPD_ERR_INVALID_PARAM
 * with *err filled (400 naming the field).  Any thread. */
epd_status_t epd_oai_check_sampling(const epd_oai_request_t *req, uint32_t vocab, int64_t max_new,
                                    epd_oai_error_t *err);

/* Appends the error JSON {"error": {"message", "type", "param", "code"}}.
 * EPD_OK or EPD_ERR_NO_MEMORY (buf unchanged in length). */
epd_status_t epd_oai_error_encode(const epd_oai_error_t *err, epd_oai_buf_t *out);

/* Writes "cmpl-<16 hex>" (completions) or "chatcmpl-<16 hex>" (chat) from
 * `nonce` into id[0..EPD_OAI_ID_MAX). */
#define EPD_OAI_ID_MAX 32
void epd_oai_make_id(epd_oai_kind_t kind, uint64_t nonce, char id[EPD_OAI_ID_MAX]);

/* Appends a non-streaming response: object "text_completion" (choices[0].
 * text) or "chat.completion" (choices[0].message {role: assistant,
 * content}), with finish_reason and usage {prompt_tokens,
 * completion_tokens, total_tokens, and prompt_tokens_details
 * {cached_tokens} when cached_tokens >= 0 (-1: unknown, left out)}.  text[0..len) (borrowed) is the
 * raw generated bytes, repaired here.  `id` and `model` borrowed.  EPD_OK or EPD_ERR_NO_MEMORY. Any
 * thread. */
epd_status_t epd_oai_response_encode(epd_oai_kind_t kind, const char *id, const char *model,
                                     int64_t created, const void *text, size_t len,
                                     epd_oai_finish_t finish, int64_t prompt_tokens,
                                     int64_t completion_tokens, int64_t cached_tokens,
                                     epd_oai_buf_t *out);

/* Appends the GET /v1/models answer: {"object": "list", "data": [{id,
 * object: "model", created, owned_by: "epd", max_model_len (vLLM's: the
 * context in tokens; left out when max_model_len <= 0)}...]}.  EPD_OK or
 * EPD_ERR_NO_MEMORY. */
epd_status_t epd_oai_models_encode(const char *const *models, size_t n_models, int64_t created,
                                   int64_t max_model_len, epd_oai_buf_t *out);

/* One generated token's log-probabilities for an answer: its raw bytes
 * (borrowed; may be invalid UTF-8) and those of its n_top (<= 20) best
 * alternatives. */
#define EPD_OAI_MAX_TOP_LOGPROBS 20
typedef struct {
    const char *bytes;
    size_t len;
    double logprob;
    uint32_t n_top;
    const char *top_bytes[EPD_OAI_MAX_TOP_LOGPROBS];
    size_t top_len[EPD_OAI_MAX_TOP_LOGPROBS];
    double top_logprob[EPD_OAI_MAX_TOP_LOGPROBS];
} epd_oai_token_lp_t;

/* Appends the "logprobs" object of toks[0..n) (borrowed) in `kind`'s
 * shape (epd_openai_logprobs.c): completions {tokens, token_logprobs,
 * top_logprobs, text_offset}, chat {content: [{token, logprob, bytes,
 * top_logprobs}], refusal}.  EPD_OK or EPD_ERR_NO_MEMORY (nothing
 * appended).  Any thread. */
epd_status_t epd_oai_logprobs_encode(epd_oai_kind_t kind, const epd_oai_token_lp_t *toks, size_t n,
                                     epd_oai_buf_t *out);

/* Replaces the first "logprobs":null of buf->data[from..) (an encoded
 * answer or chunk: its only structural one) by frag[0..frag_len) (a JSON
 * value, borrowed).  EPD_OK, EPD_ERR_NOT_FOUND, EPD_ERR_NO_MEMORY (buf
 * unchanged). */
epd_status_t epd_oai_splice_logprobs(epd_oai_buf_t *buf, size_t from, const char *frag,
                                     size_t frag_len);

/* The state of one streamed answer (caller's storage). */
typedef struct {
    epd_oai_kind_t kind;
    char id[EPD_OAI_ID_MAX];
    char *model; /* owned copy */
    int64_t created;
    int include_usage;
    int role_sent; /* chat: delta.role went out */
    int finished;
    uint32_t index;        /* the choice's "index" in every chunk (0 unless set) */
    int member;            /* one choice of several: finish writes its finish chunk
                            * only (epd_oai_stream_trailer ends the stream) */
    unsigned char tail[4]; /* held-back incomplete UTF-8 sequence */
    size_t tail_len;
    epd_oai_buf_t scratch; /* joined and repaired text */
} epd_oai_stream_t;

/* Prepares `stream` (caller's storage) for one answer; `id` and `model`
 * are copied.  EPD_OK, EPD_ERR_INVALID_PARAM (NULL or overlong id),
 * EPD_ERR_NO_MEMORY.  Release with epd_oai_stream_cleanup. */
epd_status_t epd_oai_stream_init(epd_oai_stream_t *stream, epd_oai_kind_t kind, const char *id,
                                 const char *model, int64_t created, int include_usage);

/* Frees what init allocated; safe on a zeroed stream. */
void epd_oai_stream_cleanup(epd_oai_stream_t *stream);

/* Appends the SSE event for the next generated bytes[0..len) (borrowed):
 * the held-back tail plus these bytes, minus a new incomplete tail,
 * repaired.  Nothing is appended when no complete character is ready.
 * EPD_OK, EPD_ERR_INVALID_PARAM (stream finished), EPD_ERR_NO_MEMORY (the
 * stream's state is then unchanged). */
epd_status_t epd_oai_stream_text(epd_oai_stream_t *stream, const void *bytes, size_t len,
                                 epd_oai_buf_t *out);

/* Appends the end of the stream: the held-back tail repaired (an event,
 * when there is one), the chunk with finish_reason, the usage chunk when
 * include_usage, and "data: [DONE]\n\n".  EPD_OK, EPD_ERR_INVALID_PARAM
 * (already finished), EPD_ERR_NO_MEMORY. */
epd_status_t epd_oai_stream_finish(epd_oai_stream_t *stream, epd_oai_finish_t finish,
                                   int64_t prompt_tokens, int64_t completion_tokens,
                                   int64_t cached_tokens, epd_oai_buf_t *out);

/* The end of a stream of several choices (each a `member` stream, each
 * finished): the usage chunk when include_usage (`stream` gives its id,
 * model and created), then "data: [DONE]\n\n".  EPD_OK or
 * EPD_ERR_NO_MEMORY (nothing appended). */
epd_status_t epd_oai_stream_trailer(const epd_oai_stream_t *stream, int64_t prompt_tokens,
                                    int64_t completion_tokens, int64_t cached_tokens,
                                    epd_oai_buf_t *out);

/* One choice of an answer of several (n > 1, a batch of prompts). */
typedef struct {
    const void *prefix; /* echo: the prompt's bytes before the text (borrowed), or NULL */
    size_t prefix_len;
    const void *text; /* raw generated bytes (borrowed), repaired with the prefix */
    size_t len;
    epd_oai_finish_t finish;
    const char *logprobs; /* a JSON value (epd_oai_logprobs_encode's), or NULL: null */
    size_t logprobs_len;
} epd_oai_choice_t;

/* Appends a non-streaming answer of choices[0..n) (borrowed), "index" i
 * for choices[i], usage as given (the sums over the choices).  EPD_OK,
 * EPD_ERR_INVALID_PARAM, EPD_ERR_NO_MEMORY (nothing appended).  Any
 * thread. */
epd_status_t epd_oai_response_encode_choices(epd_oai_kind_t kind, const char *id,
                                             const char *model, int64_t created,
                                             const epd_oai_choice_t *choices, size_t n,
                                             int64_t prompt_tokens, int64_t completion_tokens,
                                             int64_t cached_tokens, epd_oai_buf_t *out);

/* Appends a chunk event with no text whose choice carries the logprobs
 * object frag[0..frag_len) (borrowed: epd_oai_logprobs_encode's output):
 * how a stream reports the log-probabilities of the tokens whose text it
 * sent.  EPD_OK, EPD_ERR_INVALID_PARAM (finished), EPD_ERR_NO_MEMORY. */
epd_status_t epd_oai_stream_logprobs(epd_oai_stream_t *stream, const char *frag, size_t frag_len,
                                     epd_oai_buf_t *out);

/* Appends a failure in the middle of a stream as the SDKs read it: an
 * event "data: {"error": {...}}\n\n" and then "data: [DONE]\n\n"; the
 * stream counts as finished.  EPD_OK or EPD_ERR_NO_MEMORY. */
epd_status_t epd_oai_stream_error(epd_oai_stream_t *stream, const epd_oai_error_t *err,
                                  epd_oai_buf_t *out);

#endif
