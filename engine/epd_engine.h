/*
 * epd_engine.h — the model-execution interface.
 *
 * An engine is an ops table (epd_engine_ops_t) found by name among the
 * built-ins ("ref": a CPU transformer) or loaded from a shared object that
 * exports EPD_ENGINE_ENTRY_SYMBOL.  Daemons never call the ops directly: the
 * epd_engine_* functions below check every argument (block ids, slots,
 * positions, pool size, context limit) once, so an engine sees only valid
 * requests.
 *
 * KV memory belongs to the caller, never to the engine.  The engine only
 * describes its layout (epd_kv_layout_t); the caller allocates one pool
 * (typically inside memory registered with the transport), then passes, per
 * request, a block table (vLLM style: the same block ids for every attention
 * layer) and a recurrent-state slot (for the linear-attention layers).  The
 * pool of N blocks and M state slots is laid out as
 *
 *   attention part: [attn_layer][block][2: K,V][kv_head][tok][head_dim]  dtype
 *   linear part:    [linear_layer][slot][state_bytes]                     f32
 *
 * where attn_layer / linear_layer count only the layers of that kind (see
 * epd_kv_layout_t.kind_index), and the linear part starts right after the
 * attention part.  Two processes running the same model and block_tokens have
 * the same layout, so a prefill node can compute the offset of (layer, block)
 * inside a decode node's pool from the decode node's N and M alone
 * (epd_kv_block_offset / epd_kv_state_offset).
 *
 * Prefill reports each finished layer to a sink on the compute thread, in
 * layer order, exactly once per layer: that is where KV streaming starts.
 *
 * Threads: an engine instance belongs to one compute thread at a time (it
 * owns scratch buffers); different instances are independent.  The layout
 * and pool helpers are pure functions, any thread.
 */
#ifndef EPD_ENGINE_H
#define EPD_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "epd_status.h"

#define EPD_KV_MAX_LAYERS 256
#define EPD_ENGINE_MAX_EOS 8

typedef enum {
    EPD_LAYER_ATTENTION = 0, /* full (grouped-query) attention over paged KV blocks */
    EPD_LAYER_LINEAR = 1,    /* linear attention with a fixed-size recurrent state */
} epd_layer_kind_t;

typedef enum {
    EPD_DTYPE_F32 = 0,
    EPD_DTYPE_F16 = 1,
    EPD_DTYPE_BF16 = 2,
    EPD_DTYPE_FP8_E4M3 = 3, /* KV only (epd_kvq.h): OCP E4M3 with a scale per token and head */
    EPD_DTYPE_INT8 = 4,     /* KV only (epd_kvq.h): symmetric int8, scale per token and head */
} epd_dtype_t;

/* Bytes of one element of `dtype` (0 for an unknown value). */
size_t epd_dtype_size(epd_dtype_t dtype);
/* "F32", "F16", "BF16", "F8_E4M3", "I8" (static string; "?" for an unknown value). */
const char *epd_dtype_name(epd_dtype_t dtype);

/* The KV layout of an opened engine: plain data, copyable, identical in two
 * processes with the same model and block_tokens. */
typedef struct {
    uint32_t n_layers;
    uint32_t n_attn_layers;
    uint32_t n_linear_layers;
    uint8_t kind[EPD_KV_MAX_LAYERS];        /* epd_layer_kind_t of each layer */
    uint32_t kind_index[EPD_KV_MAX_LAYERS]; /* index of the layer among its kind */
    /* attention layers */
    epd_dtype_t dtype;     /* KV element type (F32 for ref) */
    uint32_t block_tokens; /* tokens per block */
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint64_t block_bytes; /* one block of one layer, K then V:
                           * 2 * n_kv_heads * block_tokens * head_dim * dtype size */
    /* linear layers */
    uint32_t n_state_heads;
    uint64_t state_bytes; /* one linear layer's recurrent state of one request */
    /* Per-layer KV dtypes (epd_kvq_layout_apply fills these; a layout that
     * leaves attn_block_bytes 0 is uniform: every attention layer holds
     * `dtype` in blocks of `block_bytes`).  With a per-layer map,
     * block_bytes is the largest layer's and dtype the first attention
     * layer's; `mixed` is nonzero when the layers differ. */
    uint8_t layer_dtype[EPD_KV_MAX_LAYERS];        /* epd_dtype_t of each layer's KV */
    uint64_t layer_block_bytes[EPD_KV_MAX_LAYERS]; /* one block of that layer */
    uint64_t layer_prefix[EPD_KV_MAX_LAYERS];      /* sum of layer_block_bytes of the
                                                    * attention layers before it */
    uint64_t attn_block_bytes;                     /* one block of every attention layer */
    int mixed;
} epd_kv_layout_t;

/* Bytes of one block of attention layer `layer` (0 for a layer that is not
 * attention).  K at the block's offset, V at + half of it.  Pure. */
uint64_t epd_kv_layer_block_bytes(const epd_kv_layout_t *layout, uint32_t layer);

/* Bytes of one block summed over every attention layer (what one block id
 * costs in a pool).  Pure. */
uint64_t epd_kv_block_set_bytes(const epd_kv_layout_t *layout);

/* Bytes of a pool of `n_blocks` blocks and `n_state_slots` slots; 0 when it
 * overflows. */
uint64_t epd_kv_pool_bytes(const epd_kv_layout_t *layout, uint32_t n_blocks,
                           uint32_t n_state_slots);

/* Offset of block `block` of attention layer `layer` (absolute layer index)
 * inside a pool of `n_blocks` blocks; K at the offset, V at + half the
 * layer's block bytes (epd_kv_layer_block_bytes).
 * EPD_ERR_OUT_OF_RANGE for a layer that is not attention or a block >= n_blocks. */
epd_status_t epd_kv_block_offset(const epd_kv_layout_t *layout, uint32_t n_blocks, uint32_t layer,
                                 uint32_t block, uint64_t *offset_p);

/* The attention layer and block whose bytes hold pool offset `off` (a pool
 * of `n_blocks` blocks); EPD_ERR_OUT_OF_RANGE past the attention part. */
epd_status_t epd_kv_block_at(const epd_kv_layout_t *layout, uint32_t n_blocks, uint64_t off,
                             uint32_t *layer_p, uint32_t *block_p);

/* Offset of state slot `slot` of linear layer `layer` (absolute index) inside
 * a pool of `n_blocks` blocks and `n_state_slots` slots. */
epd_status_t epd_kv_state_offset(const epd_kv_layout_t *layout, uint32_t n_blocks,
                                 uint32_t n_state_slots, uint32_t layer, uint32_t slot,
                                 uint64_t *offset_p);

/* A caller-owned KV pool (caller's storage; `base` is borrowed for as long as
 * the pool is used, 64-byte alignment recommended). */
typedef struct {
    void *base;
    uint64_t bytes; /* >= epd_kv_pool_bytes(layout, n_blocks, n_state_slots) */
    uint32_t n_blocks;
    uint32_t n_state_slots;
} epd_kv_pool_t;

/* One request's place in the pool.  block_table is borrowed for the call;
 * entry i holds the tokens [i*block_tokens, (i+1)*block_tokens) of every
 * attention layer.  A model without linear layers ignores state_slot. */
typedef struct {
    uint64_t req_id; /* log lines, and the KV stamps of engines that stamp (epd_kv_stamp.h) */
    const uint32_t *block_table;
    uint32_t n_blocks; /* entries in block_table */
    uint32_t state_slot;
    uint64_t stamp_tag; /* stamping engines: the decode incarnation the KV is for
                         * (epd_kv_stamp_tag of its epoch; 0: none) */
} epd_kv_seq_t;

/* How a layer's checksum is computed (proto/README.md rule 4): */
typedef enum {
    EPD_KV_SUM_BYTES = 0,   /* xxh3-64 (seed 0) of the bytes written, in write order */
    EPD_KV_SUM_STAMPED = 1, /* xxh3-64 (seed 0) of each unit's stamps (epd_kv_stamp.h) */
} epd_kv_sum_kind_t;

/* What one prefill call wrote into one layer; every pointer is borrowed for
 * the duration of the callback. */
typedef struct {
    uint64_t req_id;
    uint32_t layer; /* absolute layer index */
    epd_layer_kind_t kind;
    uint32_t tok_start; /* token positions written: [tok_start, tok_end) */
    uint32_t tok_end;
    /* attention layers: block_ids[0..n_blocks) are block_table[first_block ..];
     * the first and last may be partly written (only the token range above). */
    const uint32_t *block_ids;
    uint32_t first_block;
    uint32_t n_blocks;
    /* linear layers: the slot whose state is now final for tok_end tokens */
    uint32_t state_slot;
    /* the layer's checksum, when the prefill asked for them (want_sums) and
     * the engine computes them where the KV is (a device kernel); has_sum 0:
     * the caller hashes the bytes itself (EPD_KV_SUM_BYTES) */
    int has_sum;
    epd_kv_sum_kind_t sum_kind;
    uint64_t sum;
} epd_layer_done_t;

/* Called on the compute thread as soon as layer `layer`'s KV (or recurrent
 * state) for the prefilled tokens is final in the pool (for `sim`: where the
 * modelled layer has produced it), once per layer, in
 * layer order, before the next layer starts.  Must not block for long (it
 * should post work to a transfer thread).  A status other than EPD_OK aborts
 * the prefill, which then returns that status. */
typedef epd_status_t (*epd_layer_done_cb_t)(void *ctx, uint32_t layer,
                                            const epd_layer_done_t *done);

typedef struct {
    epd_layer_done_cb_t cb; /* NULL: no callback */
    void *ctx;              /* borrowed, passed back */
} epd_engine_sink_t;

/* Opening parameters. */
typedef struct {
    const char *model_dir; /* borrowed during open: holds config.json + model.safetensors */
    uint32_t block_tokens; /* KV block size; 0 = 16 */
    uint32_t max_batch;    /* largest decode batch; 0 = 64 */
    uint32_t max_context;  /* 0 = the model's; otherwise min(this, the model's) */
    /* KV dtype map (epd_kvq_map_parse: "int8", "0-3:bf16,4-:fp8"); borrowed
     * during open; NULL = the engine's default (f32).  Engines that cannot
     * quantize refuse a non-f32 map with EPD_ERR_UNSUPPORTED. */
    const char *kv_dtype;
    /* nonzero: the caller only tokenizes (a router, epd-ctl): a Hugging
     * Face folder with a tokenizer.json is described from its config.json
     * and generation_config.json without the engine's open (no weight is
     * read); prefill, decode and encode_image then refuse
     * (EPD_ERR_UNSUPPORTED) and model_digest is zero.  Other folders open
     * in full as without it. */
    int tokenizer_only;
} epd_engine_config_t;

/* What a daemon needs to know about an opened engine. */
typedef struct {
    uint32_t vocab_size;
    int32_t bos_token;
    int32_t eos_token; /* the first of eos_tokens */
    /* every id that ends a generation (generation_config.json may list
     * several); an engine that leaves n_eos 0 gets {eos_token} */
    uint32_t n_eos;
    int32_t eos_tokens[EPD_ENGINE_MAX_EOS];
    uint32_t max_context; /* tokens: a sequence never grows past this */
    uint32_t max_batch;
    /* the vision encoder (0 / -1 when the engine has none) */
    uint32_t image_embeddings; /* embedding vectors one image becomes */
    uint32_t embed_dim;        /* floats per embedding vector (the LM's hidden size) */
    int32_t image_token;       /* placeholder token id, -1 without vision */
    uint32_t image_size;       /* the encoder's square input side, in pixels (informational) */
    /* bytes/s of the memory the engine's KV lives in, for work a device does
     * on it (a verification kernel); 0: the host CPU is the device (ref) */
    double device_mem_bw;
    epd_kv_layout_t kv;
    /* What the model's numbers depend on, digested (XXH3-128; ref: config.json
     * and model.safetensors, sim: sim.conf and its two profiles): two engines
     * with the same digest, name and KV layout write the same KV for the same
     * prompt, so a prefix cache may share (or persist) blocks between them. */
    uint8_t model_digest[16];
} epd_engine_info_t;

/* A decoded image, RGB8 [height][width][3] bytes, rows top to bottom, no
 * padding; the pixels are borrowed (epd_image_view() of epd_image.h makes
 * one from an epd_image_t). */
typedef struct {
    uint32_t width;
    uint32_t height;
    const uint8_t *rgb;
} epd_image_view_t;

/* One image's embeddings placed at prompt positions [pos, pos + n): rows
 * data[i * embed_dim ..] replace the token embedding of position pos + i. */
typedef struct {
    uint32_t pos;
    uint32_t n;
    const float *data; /* borrowed for the call: [n][embed_dim] f32 */
} epd_embed_span_t;

/* A checkpoint of the recurrent state (models with linear layers): after
 * the prefill passed position pos - 1, the engine copies every linear
 * layer's state, covering tokens [0, pos), to dst (caller's buffer of
 * [n_linear_layers][state_bytes], linear layers in kind_index order). */
typedef struct {
    uint32_t pos; /* in (start, start + n_tokens] */
    void *dst;    /* borrowed for the call */
} epd_state_ckpt_t;

/* One prefill call: tokens [start, start + n_tokens) of a request whose
 * tokens [0, start) are already in its blocks and state slot (chunked
 * prefill; start 0 resets the state slot).  The block table must cover
 * start + n_tokens tokens.
 *
 * Multimodal prompts: the prompt holds image_embeddings image_token ids per
 * image (epd_engine_tokenize_images), and `embeds` says which embedding rows
 * go there.  Spans are sorted by pos, do not overlap and lie inside the
 * prompt so far, [0, start + n_tokens); they may begin before this chunk
 * (only the rows inside it are used).  So a chunk of a chunked prefill
 * passes the spans that begin before its end, one straddling the end cut
 * there (n = start + n_tokens - pos); the next chunk passes it whole again.
 * Zero (NULL, 0) means text only. */
typedef struct {
    epd_kv_seq_t seq;
    const int32_t *tokens; /* borrowed: n_tokens ids */
    uint32_t n_tokens;
    uint32_t start;
    const epd_embed_span_t *embeds; /* borrowed for the call: n_embeds spans */
    uint32_t n_embeds;
    /* nonzero: report each layer's checksum in epd_layer_done_t where the
     * engine can compute it next to the KV (sim: a modelled device kernel) */
    int want_sums;
    /* Tail replay (a prefix cache restored the state slot from a checkpoint
     * at `start`): positions [start, replay_end) already hold their attention
     * KV in the blocks, which the engine reads and never writes; it runs them
     * only to rebuild the recurrent state (and the rows later positions
     * read).  0: none; else start < replay_end <= start + n_tokens. */
    uint32_t replay_end;
    /* State checkpoints to take during this call, sorted by pos, distinct
     * (models with linear layers only); NULL / 0: none. */
    const epd_state_ckpt_t *ckpts;
    uint32_t n_ckpts;
} epd_prefill_args_t;

/* One request of a decode step: appends the KV of `token` at position `pos`
 * (the number of tokens already cached) and yields the next logits. */
typedef struct {
    epd_kv_seq_t seq;
    uint32_t pos;
    int32_t token;
} epd_decode_req_t;

/* An engine's private state (each engine defines the struct). */
typedef struct epd_engine_impl epd_engine_impl_t;

/* 2: epd_engine_info_t's vision fields, epd_prefill_args_t.embeds, the
 * encode_image op.  3: epd_kv_seq_t.stamp_tag, epd_prefill_args_t.want_sums,
 * the checksum in epd_layer_done_t, epd_engine_info_t.device_mem_bw, and a
 * prefill owns the unused tail of its last block (see epd_engine_prefill).
 * 4: epd_engine_info_t.model_digest, epd_prefill_args_t.replay_end and
 * state checkpoints (prefix caching).  5: per-layer KV dtypes in
 * epd_kv_layout_t, epd_engine_config_t.kv_dtype. */
#define EPD_ENGINE_ABI_VERSION 5u

/* The ops table.  No NULL slots.  Called only through epd_engine_* (which
 * validates arguments), on the instance's compute thread. */
typedef struct {
    size_t size;          /* sizeof(epd_engine_ops_t) the engine was built with */
    uint32_t abi_version; /* EPD_ENGINE_ABI_VERSION */
    const char *name;
    epd_status_t (*open)(const epd_engine_config_t *config, epd_engine_impl_t **impl_p);
    void (*close)(epd_engine_impl_t *impl);
    void (*describe)(const epd_engine_impl_t *impl, epd_engine_info_t *info_p);
    epd_status_t (*tokenize)(const epd_engine_impl_t *impl, const char *text, size_t len,
                             int add_bos, int32_t *tokens, size_t cap, size_t *n_p);
    epd_status_t (*detokenize)(const epd_engine_impl_t *impl, const int32_t *tokens, size_t n,
                               char *buf, size_t cap, size_t *len_p);
    epd_status_t (*prefill)(epd_engine_impl_t *impl, const epd_kv_pool_t *pool,
                            const epd_prefill_args_t *args, const epd_engine_sink_t *sink,
                            float *logits);
    epd_status_t (*decode)(epd_engine_impl_t *impl, const epd_kv_pool_t *pool,
                           const epd_decode_req_t *reqs, uint32_t n_reqs, float *logits);
    void (*release)(epd_engine_impl_t *impl, const epd_kv_pool_t *pool, const epd_kv_seq_t *seq);
    /* writes [image_embeddings][embed_dim] f32 to out; an engine without
     * vision returns EPD_ERR_UNSUPPORTED */
    epd_status_t (*encode_image)(epd_engine_impl_t *impl, const epd_image_view_t *image,
                                 float *out);
} epd_engine_ops_t;

/* A shared-object engine exports this symbol: a function of type
 * epd_engine_entry_fn_t returning its (static) ops table. */
#define EPD_ENGINE_ENTRY_SYMBOL "epd_engine_entry"
typedef const epd_engine_ops_t *(*epd_engine_entry_fn_t)(void);

/* An opened engine (opaque). */
typedef struct epd_engine epd_engine_t;
/* A Hugging Face tokenizer (epd_tokenizer.h). */
typedef struct epd_tokenizer epd_tokenizer_t;

/* Nonzero when `token` is one of info's eos ids.  Pure. */
int epd_engine_is_eos(const epd_engine_info_t *info, int32_t token);

/* The built-in ops table called `name`, or NULL. */
const epd_engine_ops_t *epd_engine_builtin(const char *name);

/*
 * Opens engine `name`: a built-in name ("ref"), or a path to a shared object
 * (anything containing '/' or ending in ".so") exporting
 * EPD_ENGINE_ENTRY_SYMBOL.  `config` is borrowed for the call.  On success
 * *engine_p is owned by the caller (epd_engine_close).  Errors:
 * EPD_ERR_NOT_FOUND (no such engine or model files), EPD_ERR_UNSUPPORTED (a
 * shared object with a bad ops table), EPD_ERR_MALFORMED (bad model files),
 * EPD_ERR_NO_MEMORY, EPD_ERR_INVALID_PARAM; each logged once with its cause.
 * Blocking (reads the model): never on a loop thread.
 */
epd_status_t epd_engine_open(const char *name, const epd_engine_config_t *config,
                             epd_engine_t **engine_p);

/* Closes the engine (and unloads its shared object); NULL is a no-op. */
void epd_engine_close(epd_engine_t *engine);

/* The engine's description; the pointer stays valid until close.  Any thread. */
const epd_engine_info_t *epd_engine_info(const epd_engine_t *engine);

/* The model folder's tokenizer (tokenizer.json, loaded by epd_engine_open;
 * borrowed until close), or NULL when the folder has none and the engine's
 * own byte tokenizer is used.  Encoding with it directly must not race
 * epd_engine_tokenize on the same engine (one thread at a time); decoding
 * and the stream functions only read it. */
const epd_tokenizer_t *epd_engine_tokenizer(const epd_engine_t *engine);

/* The ops table name ("ref"). */
const char *epd_engine_name(const epd_engine_t *engine);

/* Checks that `pool` is large enough for the engine's layout, and that
 * base is non-NULL.  EPD_ERR_INVALID_PARAM otherwise. */
epd_status_t epd_engine_check_pool(const epd_engine_t *engine, const epd_kv_pool_t *pool);

/* Text to token ids (optionally with BOS first), into tokens[0..cap);
 * *n_p = count (written on success only).  EPD_ERR_TOO_LONG when cap is too
 * small.  When the model folder has a tokenizer.json, it does the work for
 * every engine (add_bos: its post-processor, EPD_TOKENIZE_ADD_SPECIAL, as
 * vLLM applies for /v1/completions); else the engine's own tokenizer.  Any
 * thread (calls are serialized on the tokenizer's scratch). */
epd_status_t epd_engine_tokenize(const epd_engine_t *engine, const char *text, size_t len,
                                 int add_bos, int32_t *tokens, size_t cap, size_t *n_p);

/* Token ids to raw bytes (special tokens produce nothing; the bytes may be
 * invalid UTF-8: see epd_utf8.h).  With a tokenizer.json, its bytes, and
 * ids of the vocabulary it names no token for give nothing.
 * EPD_ERR_TOO_LONG when cap is too small, EPD_ERR_OUT_OF_RANGE for an id
 * outside the vocabulary.  Any thread. */
epd_status_t epd_engine_detokenize(const epd_engine_t *engine, const int32_t *tokens, size_t n,
                                   char *buf, size_t cap, size_t *len_p);

/* The literal that epd_engine_tokenize_images replaces with one image's
 * placeholder tokens. */
#define EPD_IMAGE_MARKER "<|image|>"

/*
 * Tokenizes a multimodal prompt into tokens[0..cap): BOS, then the text,
 * where each occurrence of EPD_IMAGE_MARKER becomes image_embeddings
 * image_token ids, image k's first placeholder at image_pos[k] (caller's
 * array of n_images; may be NULL when n_images is 0).  A text without any
 * marker gets the n_images images' placeholders right after BOS, in order.
 * *n_p = count.  EPD_ERR_INVALID_PARAM when the text has markers but not
 * exactly n_images of them; EPD_ERR_UNSUPPORTED for n_images > 0 on an
 * engine without vision; EPD_ERR_TOO_LONG when cap is too small.  *n_p is
 * written only on success (tokens and image_pos may be partly written on
 * failure).  Any thread (pure).
 */
epd_status_t epd_engine_tokenize_images(const epd_engine_t *engine, const char *text, size_t len,
                                        uint32_t n_images, int32_t *tokens, size_t cap,
                                        size_t *n_p, uint32_t *image_pos);

/*
 * Runs one image through the engine's vision encoder and writes its
 * image_embeddings x embed_dim floats to `out` (caller's buffer of
 * [image_embeddings][embed_dim] f32): the rows an epd_embed_span_t then
 * places at the image's placeholder positions.  `image` and its pixels are
 * borrowed for the call; any size is accepted (the engine resizes).
 * EPD_ERR_UNSUPPORTED when the engine has no vision encoder,
 * EPD_ERR_INVALID_PARAM for NULL pointers or an empty image,
 * EPD_ERR_NO_MEMORY.  Compute thread (as prefill: it uses the instance);
 * synchronous.
 */
epd_status_t epd_engine_encode_image(epd_engine_t *engine, const epd_image_view_t *image,
                                     float *out);

/*
 * Runs tokens [start, start+n_tokens) of one request through the model,
 * writing their KV into the request's blocks of `pool` (and its recurrent
 * state into its slot), calling `sink` (may be NULL) after each layer, and
 * writes the vocab_size logits of the last position to `logits` (caller's
 * buffer).  Positions covered by args->embeds take the span's row instead of
 * their token's embedding.  The positions of the chunk's last block past
 * its end hold no other request's KV when it returns (ref zeroes them, sim
 * keeps a block template there): the whole block may be sent elsewhere.  EPD_ERR_TOO_LONG (logged) when start+n_tokens
 * exceeds max_context; EPD_ERR_INVALID_PARAM for an empty chunk, a bad token
 * id, a block table too short or naming blocks outside the pool, a slot
 * outside the pool, spans unsorted, overlapping, empty, without data or
 * reaching past start + n_tokens, a placeholder token in the chunk that no
 * span covers or a covered position of the chunk that does not hold the
 * placeholder, a replay_end outside (start, start + n_tokens], checkpoints
 * unsorted, outside (start, start + n_tokens], without dst or on a model
 * without linear layers; EPD_ERR_UNSUPPORTED for spans on an engine without
 * vision; the sink's status when it aborts.  Nothing is written when an
 * argument is refused.  Compute thread; synchronous.
 *
 * Split invariance (what a prefix cache relies on): the KV and state an
 * engine writes for position p, and the logits of the last position, depend
 * only on the tokens (and embeddings) of [0, p], bit for bit — never on how
 * the prompt was cut into calls, nor on replay.  `ref` guarantees it by
 * running every matrix product on row tiles of a fixed size aligned to
 * absolute positions (engine/README.md); `sim`'s bytes are a function of
 * the prefix hash.
 */
epd_status_t epd_engine_prefill(epd_engine_t *engine, const epd_kv_pool_t *pool,
                                const epd_prefill_args_t *args, const epd_engine_sink_t *sink,
                                float *logits);

/*
 * One decode step for n_reqs (1..max_batch) requests of any lengths: each
 * appends its token's KV at its position and gets its next-token logits in
 * logits[i*vocab_size ..] (caller's buffer of n_reqs*vocab_size floats).
 * Two requests of one batch must not share a block being written or a state
 * slot.  Errors as prefill (EPD_ERR_TOO_LONG when pos reaches max_context);
 * nothing is written when an argument is refused.  Compute thread.
 */
epd_status_t epd_engine_decode(epd_engine_t *engine, const epd_kv_pool_t *pool,
                               const epd_decode_req_t *reqs, uint32_t n_reqs, float *logits);

/* Tells the engine a request is finished: any per-request state the engine
 * keeps is dropped (ref keeps none beyond the pool; it clears the state
 * slot).  The caller then owns the blocks and slot again.  Compute thread. */
void epd_engine_release(epd_engine_t *engine, const epd_kv_pool_t *pool, const epd_kv_seq_t *seq);

#endif
