/*
 * epd_ref_model.h — the `ref` model format: hyper-parameters (config.json)
 * and the list of tensors (model.safetensors), shared by the engine that
 * loads them, epd-mkmodel that writes them and the tests that read them, so
 * the three can never disagree on a name or a shape.
 *
 * config.json (Hugging Face style keys):
 *   model_type "epd-ref", vocab_size, hidden_size, num_hidden_layers,
 *   num_attention_heads, num_key_value_heads, head_dim, intermediate_size,
 *   layer_pattern ("LLA": layer i is pattern[i % len], L linear, A attention),
 *   max_position_embeddings, rope_theta, rms_norm_eps, bos_token_id,
 *   eos_token_id.
 *
 * Tensors (W is [out, in], y = W x):
 *   model.embed_tokens.weight                 [vocab, dim]
 *   model.layers.I.input_layernorm.weight     [dim]
 *   attention layer:  model.layers.I.self_attn.{q,k,v,o}_proj.weight
 *                     q [heads*hd, dim], k/v [kv_heads*hd, dim], o [dim, heads*hd]
 *   linear layer:     model.layers.I.linear_attn.{q,k,v,o}_proj.weight
 *                     q/k/v [heads*hd, dim], o [dim, heads*hd]
 *   model.layers.I.post_attention_layernorm.weight [dim]
 *   model.layers.I.mlp.{gate,up}_proj.weight  [ffn, dim], down [dim, ffn]
 *   model.norm.weight                         [dim]
 *   lm_head.weight                            [vocab, dim]
 *
 * The math (what the engine computes and the tests recompute in double):
 *   x = embed[tok]
 *   per layer: h = rmsnorm(x) * w_in;  x += mixer(h);
 *              h = rmsnorm(x) * w_post; x += down(silu(gate h) * up h)
 *   logits = lm_head (rmsnorm(x) * w_norm)
 *   attention mixer: q, k rotated by RoPE (pairs (i, i + hd/2), angle
 *     pos * theta^(-2i/hd)), causal softmax(q.k / sqrt(hd)) v, head h reads
 *     kv head h / (heads / kv_heads); o_proj.
 *   linear mixer (per head h, decayed linear attention with a normalizer):
 *     phi(u) = elu(u) + 1 (elementwise, positive)
 *     S_t = g_h S_{t-1} + phi(k_t)^T v_t      [hd][hd]
 *     z_t = g_h z_{t-1} + phi(k_t)            [hd]
 *     o_t = phi(q_t) S_t / (phi(q_t) . z_t + 1e-6)
 *     g_h = 1 - 2^-(5 + h)  (RetNet's per-head decays); o_proj.
 *   The recurrent state of one layer is S and z of every head, f32:
 *   [head][hd*hd + hd].
 */
#ifndef EPD_REF_MODEL_H
#define EPD_REF_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "epd_engine.h"
#include "epd_status.h"

#define EPD_REF_MAX_PATTERN 64
#define EPD_REF_BOS 256
#define EPD_REF_EOS 257
#define EPD_REF_MIN_VOCAB 258
#define EPD_REF_LINEAR_EPS 1e-6

typedef struct {
    uint32_t vocab;
    uint32_t dim;
    uint32_t n_layers;
    uint32_t n_heads;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint32_t ffn;
    uint32_t max_context;
    double rope_theta;
    double rms_eps;
    int32_t bos;
    int32_t eos;
    char pattern[EPD_REF_MAX_PATTERN + 1]; /* 'L' / 'A', repeated over the layers */
} epd_ref_hparams_t;

/* Kind of layer `layer` under hp->pattern. */
epd_layer_kind_t epd_ref_layer_kind(const epd_ref_hparams_t *hp, uint32_t layer);

/* Checks every field (ranges, divisibility, pattern letters, token ids
 * inside the vocabulary).  Logs the first problem; EPD_ERR_MALFORMED. */
epd_status_t epd_ref_hparams_check(const epd_ref_hparams_t *hp);

/* Reads and checks DIR/config.json.  EPD_ERR_NOT_FOUND, EPD_ERR_MALFORMED
 * (logged).  Caller's thread. */
epd_status_t epd_ref_hparams_load(const char *dir, epd_ref_hparams_t *hp_p);

/* Writes DIR/config.json.  EPD_ERR_IO (logged). */
epd_status_t epd_ref_hparams_save(const epd_ref_hparams_t *hp, const char *dir);

/* Initialisation kind of a tensor, for epd-mkmodel. */
typedef enum {
    EPD_REF_INIT_ONES = 0,   /* norm weights */
    EPD_REF_INIT_NORMAL = 1, /* N(0, 1/fan_in) matrices */
    EPD_REF_INIT_EMBED = 2,  /* N(0, 1) */
} epd_ref_init_t;

typedef struct {
    char name[96];
    uint32_t ndim;
    uint64_t shape[2];
    uint64_t n_elems;
    epd_ref_init_t init;
    uint32_t fan_in;
} epd_ref_tensor_spec_t;

/* Number of tensors of the model and the i-th one in canonical order
 * (embedding, then each layer's, then final norm, lm head). */
size_t epd_ref_tensor_count(const epd_ref_hparams_t *hp);
void epd_ref_tensor_spec(const epd_ref_hparams_t *hp, size_t i, epd_ref_tensor_spec_t *spec_p);

/* Per-head decay g_h of the linear layers. */
double epd_ref_linear_decay(uint32_t head);

#endif
