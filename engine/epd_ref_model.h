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
 *
 * The vision encoder (optional: a model without "vision_config" is text
 * only).  config.json:
 *   image_token_id (required with vision; 258 by default in epd-mkmodel)
 *   vision_config: { image_size, patch_size, hidden_size, num_hidden_layers,
 *     num_attention_heads, intermediate_size, layer_norm_eps (1e-6),
 *     spatial_merge_size (2), out_hidden_size (= the LM's hidden_size) }
 * With S = image_size, P = patch_size, g = S / P patches a side, N = g*g,
 * D = the vision hidden_size, m = spatial_merge_size, E = (g/m)^2 (the
 * image_embeddings of epd_engine_info_t), dim = the LM's hidden size.
 *
 * Tensors (after the language model's, in this order):
 *   visual.patch_embed.weight                    [D, P*P*3], .bias [D]
 *   visual.pos_embed.weight                      [N, D]
 *   visual.blocks.I.norm1.{weight,bias}          [D]
 *   visual.blocks.I.attn.{q,k,v,o}_proj.weight   [D, D], .bias [D]
 *   visual.blocks.I.norm2.{weight,bias}          [D]
 *   visual.blocks.I.mlp.fc1.weight [ffn, D], .bias [ffn]
 *   visual.blocks.I.mlp.fc2.weight [D, ffn], .bias [D]
 *   visual.post_layernorm.{weight,bias}          [D]
 *   visual.merger.mlp.0.weight [m*m*D, m*m*D], .bias [m*m*D]
 *   visual.merger.mlp.2.weight [dim, m*m*D],   .bias [dim]
 *
 * The math (y = W x + b for every linear map):
 *   resize: the W x H RGB8 image becomes S x S by bilinear interpolation
 *     with pixel centres at half-integers (align_corners = false): output
 *     x samples source sx = clamp((x + 0.5) W / S - 0.5, 0, W - 1) between
 *     floor(sx) and min(floor(sx) + 1, W - 1), same for y; no antialiasing.
 *     Then each value v (0..255) becomes v / 127.5 - 1, in [-1, 1].
 *   patches: patch n = py*g + px (raster order) is the P x P x 3 block at
 *     rows py*P.., columns px*P.., flattened [row][column][channel].
 *   h_n = patch_embed(patch_n) + pos_embed[n]
 *   per block: u = layernorm(h) * w1 + b1;  h += o_proj(attn(u));
 *              u = layernorm(h) * w2 + b2;  h += fc2(gelu(fc1 u))
 *     layernorm(x) = (x - mean x) / sqrt(var x + eps) (population variance)
 *     attn: heads of D / num_attention_heads, q k v projections, full
 *       (bidirectional) softmax(q.k / sqrt(head size)) v over the N patches
 *     gelu(u) = u / 2 * (1 + erf(u / sqrt 2))
 *   h = layernorm(h) * w_post + b_post
 *   merge (Qwen2-VL's patch merger): output j = my*(g/m) + mx concatenates
 *     h of the m x m patches (my*m + dy, mx*m + dx), dy major then dx:
 *     z_j [m*m*D]
 *   e_j = mlp.2(gelu(mlp.0 z_j)), [dim], f32: the embedding that replaces
 *     the token embedding of the image's j-th placeholder position.
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
#define EPD_REF_IMAGE_TOKEN 258 /* epd-mkmodel's image_token_id */

/* vision_config (see above); meaningful when has_vision. */
typedef struct {
    uint32_t image_size; /* S: square input side, pixels */
    uint32_t patch_size; /* P */
    uint32_t dim;        /* D: hidden_size */
    uint32_t n_layers;
    uint32_t n_heads;
    uint32_t ffn;   /* intermediate_size */
    uint32_t merge; /* m: spatial_merge_size */
    double ln_eps;  /* layer_norm_eps */
} epd_ref_vision_hparams_t;

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
    int has_vision;                        /* nonzero: config.json has vision_config */
    int32_t image_token;                   /* image_token_id; -1 without vision */
    epd_ref_vision_hparams_t vision;
} epd_ref_hparams_t;

/* Patches a side (S / P), patches (N), embeddings per image (E = (g/m)^2)
 * and the merged width (m*m*D) of a model with vision (hp checked).  Pure. */
uint32_t epd_ref_vision_grid(const epd_ref_hparams_t *hp);
uint32_t epd_ref_vision_patches(const epd_ref_hparams_t *hp);
uint32_t epd_ref_image_embeddings(const epd_ref_hparams_t *hp);
uint32_t epd_ref_vision_merged_dim(const epd_ref_hparams_t *hp);

/* Kind of layer `layer` under hp->pattern. */
epd_layer_kind_t epd_ref_layer_kind(const epd_ref_hparams_t *hp, uint32_t layer);

/* Checks every field (ranges, divisibility, pattern letters, token ids
 * inside the vocabulary; with vision also the vision_config: sizes, patch
 * grid divisible by the merge, image_token_id a distinct special id inside
 * the vocabulary).  Logs the first problem; EPD_ERR_MALFORMED.  Pure. */
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
    uint32_t fan_in; /* NORMAL: std 1/sqrt(fan_in); a bias (a layer norm's
                      * too) takes its map's fan-in, as PyTorch does */
} epd_ref_tensor_spec_t;

/* Number of tensors of the model and the i-th one in canonical order
 * (embedding, then each layer's, then final norm, lm head; then the vision
 * tensors in the order listed above). */
size_t epd_ref_tensor_count(const epd_ref_hparams_t *hp);
void epd_ref_tensor_spec(const epd_ref_hparams_t *hp, size_t i, epd_ref_tensor_spec_t *spec_p);

/* Tensors of the language model alone: the vision tensors start here. */
size_t epd_ref_lm_tensor_count(const epd_ref_hparams_t *hp);
/* Tensors per vision block. */
#define EPD_REF_VISION_PER_BLOCK 16

/* Per-head decay g_h of the linear layers. */
double epd_ref_linear_decay(uint32_t head);

#endif
