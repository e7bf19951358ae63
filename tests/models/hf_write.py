#!/usr/bin/env python3
"""Writes a Hugging Face model folder with seeded random weights, in numpy.

A second writer beside epd-mkmodel, written from the published config
files and tensor names of Llama-3.2, Qwen2.5, Qwen3 and Qwen3-MoE: the
engine reading a folder this writes shows that it reads Hugging Face's
layout, not only mkmodel's (the config keys real checkpoints carry, such
as Qwen2.5's sliding_window beside use_sliding_window false; an eos list;
tensors in another order; shards split elsewhere).  hf_ref.py's self-test
uses it too.

  hf_write.py --arch llama|qwen2|qwen3|qwen3_moe --out DIR [--tokenizer DIR]
              [--seed N] [--shards N] [--tied] [--dtype bf16|f16|f32]
              [--layers N] [--hidden N] [--heads N] [--kv-heads N]
              [--head-dim N] [--intermediate N] [--experts N] [--top-k N]
              [--moe-intermediate N] [--vocab N]

Weights: embeddings N(0, 1), linear layers N(0, 1/fan_in) (activations keep
their scale through the layers, so attention is far from uniform and every
weight moves the logits), norms 1 + N(0, 0.2^2) and biases N(0, 0.1^2), so
that a norm or bias the engine skipped or misplaced shows in the logits.
"""

import argparse
import json
import os
import shutil
import struct

import numpy as np

VOCAB = {"llama": 128256, "qwen2": 151936, "qwen3": 151936, "qwen3_moe": 151936}
ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}
# the special ids of the real vocabularies (Llama-3.2-1B-Instruct, Qwen2.5/Qwen3)
IDS = {"llama": (128000, [128001, 128008, 128009]),
       "qwen2": (151643, [151645, 151643]),
       "qwen3": (151643, [151645, 151643]),
       "qwen3_moe": (151643, [151645, 151643])}


def to_dtype(a, dtype):
    """(bytes, safetensors dtype name) of float64 a, rounded to nearest even."""
    a32 = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "f32":
        return a32.astype("<f4").tobytes(), "F32"
    if dtype == "f16":
        return a32.astype("<f2").tobytes(), "F16"
    u = a32.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype("<u2").tobytes(), "BF16"


def write_safetensors(path, tensors, dtype):
    header, blobs, off = {}, [], 0
    for name, a in tensors:
        raw, dt = to_dtype(a, dtype)
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)  # the data starts 8-aligned, as HF writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    return off


def write_model(out, arch, tokenizer, seed=0, shards=1, tied=False, dtype="bf16",
                layers=2, hidden=64, heads=4, kv_heads=2, head_dim=None,
                intermediate=128, experts=4, top_k=2, moe_intermediate=32,
                vocab=None, attention_bias=False, mlp_bias=False, norm_topk=True,
                mlp_only_layers=None):
    rng = np.random.default_rng(seed)
    vocab = vocab or VOCAB[arch]
    hd = head_dim or hidden // heads
    bos, eos = IDS[arch]
    cfg = {
        "architectures": [ARCH[arch]], "model_type": arch,
        "hidden_size": hidden, "intermediate_size": intermediate,
        "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "vocab_size": vocab,
        "hidden_act": "silu", "attention_dropout": 0.0, "initializer_range": 0.02,
        "tie_word_embeddings": tied, "torch_dtype": {"bf16": "bfloat16", "f16": "float16",
                                                     "f32": "float32"}[dtype],
        "use_cache": True, "bos_token_id": bos, "eos_token_id": eos[0],
    }
    if arch == "llama":
        # Llama-3.2-1B's rope and norm settings
        cfg.update({"rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
                    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                    "attention_bias": attention_bias, "mlp_bias": mlp_bias, "head_dim": hd,
                    "pretraining_tp": 1, "eos_token_id": eos})
    elif arch == "qwen2":
        # Qwen2.5-0.5B-Instruct's: sliding_window set, use_sliding_window false
        cfg.update({"rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
                    "sliding_window": 32768, "use_sliding_window": False, "max_window_layers": 21})
        assert hd == hidden // heads, "qwen2 has no head_dim key"
    else:
        cfg.update({"rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
                    "head_dim": hd, "attention_bias": attention_bias, "rope_scaling": None,
                    "sliding_window": None, "use_sliding_window": False, "max_window_layers": layers})
    if arch == "qwen3_moe":
        cfg.update({"num_experts": experts, "num_experts_per_tok": top_k,
                    "moe_intermediate_size": moe_intermediate, "norm_topk_prob": norm_topk,
                    "decoder_sparse_step": 1, "mlp_only_layers": mlp_only_layers or [],
                    "output_router_logits": False, "router_aux_loss_coef": 0.001})

    def lin(o, i):
        return rng.standard_normal((o, i)) / np.sqrt(i)

    def norm(n):
        return 1.0 + 0.2 * rng.standard_normal(n)

    def bias(n):
        return 0.1 * rng.standard_normal(n)

    def mlp(p, inter):
        t = [(p + "gate_proj.weight", lin(inter, hidden)), (p + "up_proj.weight", lin(inter, hidden)),
             (p + "down_proj.weight", lin(hidden, inter))]
        if mlp_bias:
            t += [(p + "gate_proj.bias", bias(inter)), (p + "up_proj.bias", bias(inter)),
                  (p + "down_proj.bias", bias(hidden))]
        return t

    t = [("model.embed_tokens.weight", rng.standard_normal((vocab, hidden)))]
    qkv_bias = arch == "qwen2" or attention_bias
    for i in range(layers):
        p = "model.layers.%d." % i
        t += [(p + "input_layernorm.weight", norm(hidden)),
              (p + "self_attn.q_proj.weight", lin(heads * hd, hidden)),
              (p + "self_attn.k_proj.weight", lin(kv_heads * hd, hidden)),
              (p + "self_attn.v_proj.weight", lin(kv_heads * hd, hidden)),
              (p + "self_attn.o_proj.weight", lin(hidden, heads * hd))]
        if qkv_bias:
            t += [(p + "self_attn.q_proj.bias", bias(heads * hd)),
                  (p + "self_attn.k_proj.bias", bias(kv_heads * hd)),
                  (p + "self_attn.v_proj.bias", bias(kv_heads * hd))]
        if attention_bias and arch != "qwen2":
            t += [(p + "self_attn.o_proj.bias", bias(hidden))]
        if arch in ("qwen3", "qwen3_moe"):
            t += [(p + "self_attn.q_norm.weight", norm(hd)), (p + "self_attn.k_norm.weight", norm(hd))]
        t += [(p + "post_attention_layernorm.weight", norm(hidden))]
        if arch == "qwen3_moe" and i not in (mlp_only_layers or []):
            t += [(p + "mlp.gate.weight", lin(experts, hidden))]
            for e in range(experts):
                t += mlp(p + "mlp.experts.%d." % e, moe_intermediate)
        else:
            t += mlp(p + "mlp.", intermediate)
    t += [("model.norm.weight", norm(hidden))]
    if not tied:
        t += [("lm_head.weight", lin(vocab, hidden))]
    # the order real checkpoints use: sorted by name
    t.sort(key=lambda nt: nt[0])

    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": bos, "eos_token_id": eos, "do_sample": True,
                   "temperature": 0.7, "top_p": 0.8, "top_k": 20}, f, indent=2)
    if shards <= 1:
        write_safetensors(os.path.join(out, "model.safetensors"), t, dtype)
    else:
        wmap, total = {}, 0
        # split by count of tensors, not by layer, so a layer straddles shards
        per = -(-len(t) // shards)
        for s in range(shards):
            name = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
            part = t[s * per:(s + 1) * per]
            total += write_safetensors(os.path.join(out, name), part, dtype)
            for n, _ in part:
                wmap[n] = name
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2)
    if tokenizer:
        for fn in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tokenizer, fn), os.path.join(out, fn))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", required=True, choices=sorted(ARCH))
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int)
    ap.add_argument("--intermediate", type=int, default=128)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--moe-intermediate", type=int, default=32)
    ap.add_argument("--vocab", type=int)
    a = ap.parse_args()
    write_model(a.out, a.arch, a.tokenizer, seed=a.seed, shards=a.shards, tied=a.tied,
                dtype=a.dtype, layers=a.layers, hidden=a.hidden, heads=a.heads,
                kv_heads=a.kv_heads, head_dim=a.head_dim, intermediate=a.intermediate,
                experts=a.experts, top_k=a.top_k, moe_intermediate=a.moe_intermediate,
                vocab=a.vocab)


if __name__ == "__main__":
    main()
