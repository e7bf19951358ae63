/*
 * epd_hf_model.h — Hugging Face model folders (Llama-3, Qwen2/2.5, Qwen3,
 * Qwen3-MoE): the config.json schema and the exact list of tensors each
 * architecture consumes, shared by the writer (epd-mkmodel --arch), the
 * loader (epd_hf_load.c) and the tests, so they can never disagree on a
 * name or a shape.
 *
 * config.json keys read (Hugging Face's own):
 *   architectures [LlamaForCausalLM | Qwen2ForCausalLM | Qwen3ForCausalLM |
 *   Qwen3MoeForCausalLM], vocab_size, hidden_size, intermediate_size,
 *   num_hidden_layers, num_attention_heads, num_key_value_heads (default
 *   heads), head_dim (default hidden / heads), max_position_embeddings,
 *   rope_theta, rms_norm_eps, tie_word_embeddings, bos_token_id,
 *   eos_token_id (one or a list), rope_scaling (null or rope_type "llama3"
 *   with factor, low_freq_factor, high_freq_factor,
 *   original_max_position_embeddings; "default" is no scaling),
 *   use_sliding_window / sliding_window (refused when on), attention_bias
 *   (Llama: must be false), mlp_bias (must be false); Qwen3-MoE:
 *   num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob,
 *   decoder_sparse_step (must be 1), mlp_only_layers (must be empty).
 *   generation_config.json (optional): eos_token_id (one or a list),
 *   bos_token_id.
 *
 * Tensors (W is [out, in], y = W x; I a layer, E an expert):
 *   model.embed_tokens.weight                          [vocab, dim]
 *   model.layers.I.input_layernorm.weight              [dim]
 *   model.layers.I.self_attn.q_proj.weight             [heads*hd, dim]
 *   model.layers.I.self_attn.k_proj.weight / v_proj    [kv_heads*hd, dim]
 *   qwen2:      self_attn.{q,k,v}_proj.bias            [heads*hd] / [kv_heads*hd]
 *   model.layers.I.self_attn.o_proj.weight             [dim, heads*hd]
 *   qwen3(_moe): self_attn.q_norm.weight, k_norm.weight [hd]
 *   model.layers.I.post_attention_layernorm.weight     [dim]
 *   dense:      model.layers.I.mlp.{gate,up}_proj.weight [ffn, dim], down [dim, ffn]
 *   qwen3_moe:  model.layers.I.mlp.gate.weight         [experts, dim]
 *               model.layers.I.mlp.experts.E.{gate,up}_proj.weight [moe_ffn, dim],
 *               down_proj [dim, moe_ffn]
 *   model.norm.weight                                  [dim]
 *   lm_head.weight                                     [vocab, dim] (absent when tied)
 *
 * The math (transformers' modeling_{llama,qwen2,qwen3,qwen3_moe}.py):
 *   x = embed[tok]; per layer: h = rmsnorm(x) * w_in; x += o(attn(h));
 *   h = rmsnorm(x) * w_post; x += mlp(h); logits = lm_head(rmsnorm(x) * w_norm)
 *   rmsnorm(x) = x / sqrt(mean(x^2) + eps)
 *   attn: q = Wq h (+bq), k, v likewise; qwen3: q, k of each head
 *     rmsnorm'ed over hd with q_norm / k_norm before RoPE; rotate-half RoPE
 *     (pairs (i, i + hd/2)) with inv_freq_i = theta^(-2i/hd), llama3-scaled
 *     when rope_scaling says so (transformers' _compute_llama3_parameters);
 *     causal softmax(q.k / sqrt(hd)) v, query head h reads kv head
 *     h / (heads / kv_heads).
 *   dense mlp: down(silu(gate h) * up h)
 *   moe mlp: r = softmax(gate h) over experts (f32), the top k by r (ties:
 *     lower index first), weights r_e (divided by their sum when
 *     norm_topk_prob), sum over them of r_e * down_e(silu(gate_e h) * up_e h).
 */
#ifndef EPD_HF_MODEL_H
#define EPD_HF_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "epd_engine.h"
#include "epd_status.h"

#define EPD_HF_MAX_EXPERTS 1024
#define EPD_HF_MAX_SHARDS 4096

typedef enum {
    EPD_HF_LLAMA = 0,
    EPD_HF_QWEN2 = 1,
    EPD_HF_QWEN3 = 2,
    EPD_HF_QWEN3_MOE = 3,
} epd_hf_arch_t;

typedef struct {
    epd_hf_arch_t arch;
    uint32_t vocab;
    uint32_t dim;
    uint32_t n_layers;
    uint32_t n_heads;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint32_t ffn; /* intermediate_size (dense MLP) */
    uint32_t max_context;
    double rope_theta;
    double rms_eps;
    int tied; /* tie_word_embeddings: no lm_head.weight, the embedding is the head */
    int32_t bos;
    uint32_t n_eos;
    int32_t eos[EPD_ENGINE_MAX_EOS];
    /* rope_scaling of rope_type "llama3" (rope_llama3 nonzero) */
    int rope_llama3;
    double rs_factor;
    double rs_low_freq;
    double rs_high_freq;
    uint32_t rs_orig_max;
    /* Qwen3-MoE */
    uint32_t n_experts;
    uint32_t top_k;
    uint32_t moe_ffn;
    int norm_topk;
    epd_dtype_t dtype; /* torch_dtype (what the writer stores) */
} epd_hf_hparams_t;

/* "LlamaForCausalLM", ... and "llama", "qwen2", "qwen3", "qwen3_moe". */
const char *epd_hf_arch_class(epd_hf_arch_t arch);
const char *epd_hf_arch_type(epd_hf_arch_t arch);
/* By model_type name ("llama", ...) or class name; -1 when unknown. */
int epd_hf_arch_parse(const char *name);

/* Nonzero when DIR/config.json names one of the architectures above in
 * "architectures" (or is not epd-ref and names any architecture: the HF
 * loader then refuses it with a clear line).  Pure read, no logging. */
int epd_hf_is_hf_folder(const char *dir);

/* Range checks (divisibility, ids inside the vocabulary, MoE sizes).  Logs
 * the first problem naming the key; EPD_ERR_MALFORMED. */
epd_status_t epd_hf_hparams_check(const epd_hf_hparams_t *hp);

/* Reads DIR/config.json (+ generation_config.json for eos ids).  Refuses
 * (one log line naming the key) an unknown architecture or rope_type,
 * sliding window, biases Llama does not have, MoE layouts other than every
 * layer sparse.  EPD_ERR_NOT_FOUND, EPD_ERR_MALFORMED, EPD_ERR_UNSUPPORTED. */
epd_status_t epd_hf_hparams_load(const char *dir, epd_hf_hparams_t *hp_p);

/* Writes DIR/config.json and DIR/generation_config.json.  EPD_ERR_IO. */
epd_status_t epd_hf_hparams_save(const epd_hf_hparams_t *hp, const char *dir);

/* What a tensor is, for the loader. */
typedef enum {
    EPD_HF_T_EMBED = 0,
    EPD_HF_T_IN_NORM,
    EPD_HF_T_Q,
    EPD_HF_T_Q_BIAS,
    EPD_HF_T_K,
    EPD_HF_T_K_BIAS,
    EPD_HF_T_V,
    EPD_HF_T_V_BIAS,
    EPD_HF_T_O,
    EPD_HF_T_Q_NORM,
    EPD_HF_T_K_NORM,
    EPD_HF_T_POST_NORM,
    EPD_HF_T_GATE, /* dense gate_proj */
    EPD_HF_T_UP,
    EPD_HF_T_DOWN,
    EPD_HF_T_ROUTER, /* mlp.gate (MoE) */
    EPD_HF_T_X_GATE, /* expert gate_proj */
    EPD_HF_T_X_UP,
    EPD_HF_T_X_DOWN,
    EPD_HF_T_FINAL_NORM,
    EPD_HF_T_LM_HEAD,
} epd_hf_role_t;

/* Initialisation kind (epd-mkmodel). */
typedef enum {
    EPD_HF_INIT_NORM = 0,   /* 1 + N(0, 0.1^2): norm weights, not all ones so they matter */
    EPD_HF_INIT_NORMAL = 1, /* N(0, 1/fan_in) matrices */
    EPD_HF_INIT_EMBED = 2,  /* N(0, 1) */
    EPD_HF_INIT_BIAS = 3,   /* N(0, 0.1^2) */
} epd_hf_init_t;

typedef struct {
    char name[128];
    epd_hf_role_t role;
    uint32_t layer;  /* layer tensors */
    uint32_t expert; /* expert tensors */
    uint32_t ndim;
    uint64_t shape[2];
    uint64_t n_elems;
    epd_hf_init_t init;
    uint32_t fan_in;
} epd_hf_tensor_spec_t;

/* Number of tensors the architecture consumes and the i-th in canonical
 * order (embedding, each layer's, final norm, lm_head unless tied). */
size_t epd_hf_tensor_count(const epd_hf_hparams_t *hp);
void epd_hf_tensor_spec(const epd_hf_hparams_t *hp, size_t i, epd_hf_tensor_spec_t *spec_p);

/* ---- the writer (epd-mkmodel --arch; epd_hf_mkmodel.c) ---- */

typedef struct {
    epd_hf_hparams_t hp; /* vocab, bos and eos come from the tokenizer when one is given */
    uint64_t seed;
    uint32_t shards; /* 0 or 1: model.safetensors; N: N shards + index */
} epd_hf_mkmodel_params_t;

/* Small test-model defaults for `arch`: 2 layers, hidden 64, 4 heads, 2 kv
 * heads, head_dim 16 (qwen3 / qwen3_moe: 32, so head_dim != hidden/heads),
 * intermediate 128, MoE 8 experts, top 2, moe_intermediate 32,
 * norm_topk_prob 1; llama: llama3 rope_scaling (factor 32, low 1, high 4,
 * original 8192), max_position 131072; qwen: 40960; BF16, seed 1, vocab 512
 * (replaced by the tokenizer's id count when one is given).  Pure. */
void epd_hf_mkmodel_defaults(epd_hf_arch_t arch, epd_hf_mkmodel_params_t *p);

/* Writes config.json, generation_config.json, the weights (one file or
 * shards + model.safetensors.index.json) into `out` (created, one level),
 * and copies tokenizer.json / tokenizer_config.json from tokenizer_dir
 * (NULL: none; then hp's vocab / bos / eos are used as given).  The same
 * parameters always give the same weights, however many shards.
 * EPD_ERR_MALFORMED, EPD_ERR_IO, EPD_ERR_NO_MEMORY (logged).  Blocking. */
epd_status_t epd_hf_mkmodel_write(const epd_hf_mkmodel_params_t *p, const char *tokenizer_dir,
                                  const char *out);

#endif
