#!/usr/bin/env python3
"""A float64 forward pass of Hugging Face causal LMs, in numpy only.

The oracle of tests/models/test_hf_logits.sh: it reads a model folder as
Hugging Face publishes it (config.json, model.safetensors or
model.safetensors.index.json and its shards) and computes the logits the
published modeling code computes, in float64, for a list of token ids.  It
is written from transformers' modeling_llama.py, modeling_qwen2.py,
modeling_qwen3.py, modeling_qwen3_moe.py and modeling_rope_utils.py, and
from nothing of epd's C engine, so that the two can only agree by both
being right.

What it follows from the modeling code (eager attention, no cache tricks):
  - RMSNorm: x / sqrt(mean(x^2) + eps) * weight (weight multiplies, it is
    not 1 + weight);
  - rotate-half RoPE over head_dim (head_dim from config, else
    hidden/heads), inv_freq = 1 / theta^(2i/d), with rope_type llama3
    rescaling per _compute_llama3_parameters; "default" otherwise;
  - grouped-query attention: query head h reads key/value head
    h // (heads / kv_heads) (repeat_kv), scaled by head_dim^-0.5, causal;
  - Qwen2: q/k/v biases (o_proj has none); Llama: attention_bias and
    mlp_bias; Qwen3 and Qwen3-MoE: q_norm/k_norm (RMSNorm over head_dim,
    per head) on q and k before RoPE, attention_bias;
  - SwiGLU MLP: down(silu(gate(x)) * up(x));
  - Qwen3-MoE: softmax over the router's logits, top-k experts, the k
    weights renormalised when norm_topk_prob, the experts' SwiGLU outputs
    summed with those weights; dense layers where mlp_only_layers or
    decoder_sparse_step say so;
  - tie_word_embeddings: lm_head is embed_tokens (default false for these
    four architectures, as their config classes say).

It is strict the way a loader must be: a tensor the architecture does not
consume, a missing one, a shape that disagrees with the config, a dtype
other than F32/F16/BF16, a truncated file, sliding-window attention or a
rope_type other than default/llama3 stop it with an error.

Usage (also importable: load_model(), Model.forward(), Model.greedy()):
  hf_ref.py logits DIR IDS OUT      IDS "1,2,3": writes float64 [T][vocab]
  hf_ref.py greedy DIR IDS N        prints the greedy continuation as JSON
  hf_ref.py self-test               checks the reference against itself
"""

import json
import math
import os
import struct
import sys

import numpy as np

ARCHS = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4}


class RefError(Exception):
    """A folder the reference refuses (the message names what and where)."""


# ----------------------------------------------------------------------------
# safetensors: 8-byte little-endian header length, a JSON header of
# {name: {dtype, shape, data_offsets: [begin, end]}} (offsets from the end of
# the header), then the data.  Parsed here by hand, widened to float64.


def widen(raw, dtype, count):
    """raw bytes of `count` little-endian values of dtype -> float64 array."""
    if dtype == "BF16":
        # bfloat16 is the top half of a float32: shift into place
        u = np.frombuffer(raw, dtype="<u2", count=count).astype(np.uint32) << 16
        return u.view(np.float32).astype(np.float64)
    if dtype == "F16":
        return np.frombuffer(raw, dtype="<f2", count=count).astype(np.float64)
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4", count=count).astype(np.float64)
    raise RefError("dtype %s is not F32/F16/BF16" % dtype)


def read_safetensors(path):
    """{name: float64 ndarray} of one safetensors file (every tensor)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise RefError("%s: shorter than its header length" % path)
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise RefError("%s: header of %d bytes past the end" % (path, n))
    header = json.loads(data[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        dt = e["dtype"]
        if dt not in DTYPE_BYTES:
            raise RefError("%s: %s: dtype %s is not F32/F16/BF16" % (path, name, dt))
        shape = [int(s) for s in e["shape"]]
        count = int(np.prod(shape)) if shape else 1
        b, end = (int(v) for v in e["data_offsets"])
        if end - b != count * DTYPE_BYTES[dt]:
            raise RefError("%s: %s: %d bytes for shape %s" % (path, name, end - b, shape))
        if base + end > len(data):
            raise RefError("%s: %s: data past the end of the file (truncated?)" % (path, name))
        out[name] = widen(data[base + b:base + end], dt, count).reshape(shape)
    return out


def load_tensors(folder):
    """Every tensor of the folder, single file or index + shards."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            wmap = json.load(f)["weight_map"]
        tensors = {}
        for shard in sorted(set(wmap.values())):
            part = read_safetensors(os.path.join(folder, shard))
            for name, t in part.items():
                if wmap.get(name) != shard:
                    raise RefError("%s: %s is not mapped to this shard" % (shard, name))
                tensors[name] = t
        missing = sorted(set(wmap) - set(tensors))
        if missing:
            raise RefError("index maps %s to a shard that lacks it" % missing[0])
        return tensors
    return read_safetensors(os.path.join(folder, "model.safetensors"))


def load_model(folder):
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    tensors = load_tensors(folder)
    m = Model(cfg, tensors)
    m.tensors = tensors  # the same arrays, for whoever wants them by name
    return m


# ----------------------------------------------------------------------------
# RoPE


def rope_params(cfg):
    """(theta, rope_scaling dict or None) from a v4 (rope_theta/rope_scaling)
    or v5 (rope_parameters) config."""
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict):
        return float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0))), rp
    return float(cfg.get("rope_theta", 10000.0)), cfg.get("rope_scaling")


def inv_freq_of(cfg, head_dim):
    """_compute_default_rope_parameters, then _compute_llama3_parameters when
    rope_type is llama3 (float64 here where transformers uses float32)."""
    theta, scaling = rope_params(cfg)
    if cfg.get("partial_rotary_factor", 1.0) != 1.0:
        raise RefError("partial_rotary_factor is not supported")
    dim = head_dim
    inv = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    rtype = "default"
    if scaling:
        rtype = scaling.get("rope_type", scaling.get("type", "default"))
    if rtype == "default":
        return inv
    if rtype != "llama3":
        raise RefError("rope_type %s is not supported" % rtype)
    factor = float(scaling["factor"])
    low_ff = float(scaling["low_freq_factor"])
    high_ff = float(scaling["high_freq_factor"])
    old_ctx = float(scaling["original_max_position_embeddings"])
    low_wl = old_ctx / low_ff
    high_wl = old_ctx / high_ff
    wavelen = 2 * math.pi / inv
    inv_l = np.where(wavelen > low_wl, inv / factor, inv)
    smooth = (old_ctx / wavelen - low_ff) / (high_ff - low_ff)
    smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
    medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
    return np.where(medium, smoothed, inv_l)


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


# ----------------------------------------------------------------------------


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    # x * sigmoid(x), written with tanh so that no exp overflows
    return x * 0.5 * (1.0 + np.tanh(0.5 * x))


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def log_softmax(row):
    m = np.max(row)
    return row - (m + math.log(np.sum(np.exp(row - m))))


class Cache:
    """Keys (after RoPE) and values of the positions seen, per layer."""

    def __init__(self, layers):
        self.k = [None] * layers
        self.v = [None] * layers
        self.n = 0


class Model:
    def __init__(self, cfg, tensors):
        arch = (cfg.get("architectures") or ["?"])[0]
        if arch not in ARCHS:
            raise RefError("architecture %s is not supported" % arch)
        self.kind = kind = ARCHS[arch]
        self.cfg = cfg
        self.hidden = H = int(cfg["hidden_size"])
        self.layers = int(cfg["num_hidden_layers"])
        self.heads = int(cfg["num_attention_heads"])
        self.kv_heads = int(cfg.get("num_key_value_heads") or self.heads)
        # Qwen3Config defaults head_dim to 128; the others derive it
        hd = cfg.get("head_dim")
        if hd is None:
            hd = 128 if kind in ("qwen3", "qwen3_moe") else H // self.heads
        self.head_dim = hd = int(hd)
        self.vocab = int(cfg["vocab_size"])
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        if self.heads % self.kv_heads:
            raise RefError("num_attention_heads %% num_key_value_heads != 0")
        if cfg.get("hidden_act", "silu") != "silu":
            raise RefError("hidden_act %s is not silu" % cfg.get("hidden_act"))
        if kind in ("qwen2", "qwen3", "qwen3_moe") and cfg.get("use_sliding_window"):
            raise RefError("use_sliding_window is not supported")
        if kind == "llama" and cfg.get("sliding_window"):
            raise RefError("sliding_window is not supported")
        self.inv_freq = inv_freq_of(cfg, hd)
        self.tied = bool(cfg.get("tie_word_embeddings", False))

        left = dict(tensors)

        def take(name, shape):
            if name not in left:
                raise RefError("tensor %s is missing" % name)
            t = left.pop(name)
            if list(t.shape) != list(shape):
                raise RefError("tensor %s has shape %s, config says %s"
                               % (name, list(t.shape), list(shape)))
            return t

        if kind == "qwen2":
            qkv_bias, o_bias = True, False
        elif kind == "llama":
            qkv_bias = o_bias = bool(cfg.get("attention_bias", False))
        else:
            qkv_bias = o_bias = bool(cfg.get("attention_bias", False))
        mlp_bias = kind == "llama" and bool(cfg.get("mlp_bias", False))
        qk_norm = kind in ("qwen3", "qwen3_moe")
        nq, nkv = self.heads * hd, self.kv_heads * hd

        def linear(prefix, out_dim, in_dim, bias):
            w = take(prefix + ".weight", [out_dim, in_dim])
            b = take(prefix + ".bias", [out_dim]) if bias else None
            return (w, b)

        def mlp(prefix, inter):
            return {
                "gate": linear(prefix + ".gate_proj", inter, H, mlp_bias),
                "up": linear(prefix + ".up_proj", inter, H, mlp_bias),
                "down": linear(prefix + ".down_proj", H, inter, mlp_bias),
            }

        self.embed = take("model.embed_tokens.weight", [self.vocab, H])
        self.L = []
        for i in range(self.layers):
            p = "model.layers.%d." % i
            L = {
                "in_norm": take(p + "input_layernorm.weight", [H]),
                "post_norm": take(p + "post_attention_layernorm.weight", [H]),
                "q": linear(p + "self_attn.q_proj", nq, H, qkv_bias),
                "k": linear(p + "self_attn.k_proj", nkv, H, qkv_bias),
                "v": linear(p + "self_attn.v_proj", nkv, H, qkv_bias),
                "o": linear(p + "self_attn.o_proj", H, nq, o_bias),
            }
            if qk_norm:
                L["q_norm"] = take(p + "self_attn.q_norm.weight", [hd])
                L["k_norm"] = take(p + "self_attn.k_norm.weight", [hd])
            sparse = False
            if kind == "qwen3_moe":
                ne = int(cfg.get("num_experts", 0))
                step = int(cfg.get("decoder_sparse_step", 1))
                sparse = (i not in (cfg.get("mlp_only_layers") or [])
                          and ne > 0 and (i + 1) % step == 0)
            if sparse:
                ne = int(cfg["num_experts"])
                inter = int(cfg["moe_intermediate_size"])
                L["router"] = take(p + "mlp.gate.weight", [ne, H])
                L["experts"] = [mlp(p + "mlp.experts.%d" % e, inter) for e in range(ne)]
                L["top_k"] = int(cfg["num_experts_per_tok"])
                L["norm_topk"] = bool(cfg.get("norm_topk_prob", False))
                if not 0 < L["top_k"] <= ne:
                    raise RefError("num_experts_per_tok %d of %d experts" % (L["top_k"], ne))
            else:
                L["mlp"] = mlp(p + "mlp", int(cfg["intermediate_size"]))
            self.L.append(L)
        self.norm = take("model.norm.weight", [H])
        if self.tied:
            self.lm_head = self.embed
            if "lm_head.weight" in left:
                # transformers ties it to the embedding whatever the file says
                extra = left.pop("lm_head.weight")
                if extra.shape != self.embed.shape or not np.array_equal(extra, self.embed):
                    raise RefError("tied embeddings but lm_head.weight differs")
        else:
            self.lm_head = take("lm_head.weight", [self.vocab, H])
        if left:
            raise RefError("tensor %s is not consumed by %s" % (sorted(left)[0], arch))

    # --- pieces ---------------------------------------------------------

    @staticmethod
    def _lin(x, wb):
        w, b = wb
        y = x @ w.T
        return y if b is None else y + b

    def _mlp(self, m, x):
        return self._lin(silu(self._lin(x, m["gate"])) * self._lin(x, m["up"]), m["down"])

    def _moe(self, L, x):
        probs = softmax(x @ L["router"].T, axis=-1)  # [T, E]
        k = L["top_k"]
        # torch.topk: the k largest, largest first (ties are measure-zero
        # with random weights)
        top = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
        w = np.take_along_axis(probs, top, axis=-1)
        if L["norm_topk"]:
            w = w / np.sum(w, axis=-1, keepdims=True)
        out = np.zeros_like(x)
        for e, ex in enumerate(L["experts"]):
            rows, slot = np.nonzero(top == e)
            if rows.size:
                out[rows] += w[rows, slot][:, None] * self._mlp(ex, x[rows])
        return out

    def rope(self, positions):
        f = np.outer(positions.astype(np.float64), self.inv_freq)  # [T, d/2]
        emb = np.concatenate([f, f], axis=-1)
        return np.cos(emb), np.sin(emb)

    def _attn(self, i, L, x, cache, pos):
        T = x.shape[0]
        hd, nh, nkv = self.head_dim, self.heads, self.kv_heads
        q = self._lin(x, L["q"]).reshape(T, nh, hd)
        k = self._lin(x, L["k"]).reshape(T, nkv, hd)
        v = self._lin(x, L["v"]).reshape(T, nkv, hd)
        if "q_norm" in L:
            q = rmsnorm(q, L["q_norm"], self.eps)
            k = rmsnorm(k, L["k_norm"], self.eps)
        cos, sin = self.rope(pos)
        cos, sin = cos[:, None, :], sin[:, None, :]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if cache.k[i] is not None:
            k = np.concatenate([cache.k[i], k], axis=0)
            v = np.concatenate([cache.v[i], v], axis=0)
        cache.k[i], cache.v[i] = k, v
        S = k.shape[0]
        rep = nh // nkv
        qg = q.reshape(T, nkv, rep, hd)  # head h = g * rep + r reads kv head g
        scores = np.einsum("tgrd,sgd->grts", qg, k) * (hd ** -0.5)
        # causal: query at absolute position pos[t] sees keys 0..pos[t]
        mask = np.arange(S)[None, :] > pos[:, None]
        scores = np.where(mask[None, None], -np.inf, scores)
        p = softmax(scores, axis=-1)
        out = np.einsum("grts,sgd->tgrd", p, v).reshape(T, nh * hd)
        return self._lin(out, L["o"])

    # --- the model ------------------------------------------------------

    def new_cache(self):
        return Cache(self.layers)

    def hidden_states(self, ids, cache):
        """Final-norm hidden states [T, H] of ids appended to cache."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab):
            raise RefError("token id out of range 0..%d" % (self.vocab - 1))
        pos = np.arange(cache.n, cache.n + ids.size)
        x = self.embed[ids]
        for i, L in enumerate(self.L):
            x = x + self._attn(i, L, rmsnorm(x, L["in_norm"], self.eps), cache, pos)
            h = rmsnorm(x, L["post_norm"], self.eps)
            x = x + (self._moe(L, h) if "router" in L else self._mlp(L["mlp"], h))
        cache.n += ids.size
        return rmsnorm(x, self.norm, self.eps)

    def forward(self, ids, cache=None):
        """Logits [T, vocab]: row t after ids[0..t] (and what cache holds)."""
        if cache is None:
            cache = self.new_cache()
        return self.hidden_states(ids, cache) @ self.lm_head.T

    def greedy(self, ids, n, eos=(), last_row=None):
        """Greedy continuation of ids: a list of (id, top-2 gap, logprob row
        (float64 [vocab]), max |logit| of the row) per step; stops after an
        eos id.
        last_row: the prompt's last logits row if already computed (then the
        prompt still runs through, for its cache)."""
        return self.greedy_many([ids], n, eos, None if last_row is None else [last_row])[0]

    def greedy_many(self, prompts, n, eos=(), last_rows=None):
        """greedy() of several prompts at once: each step's lm_head product
        is one matrix product over the prompts still going (the lm_head is
        the cost: 151936 x hidden float64 read once a step, not once a
        prompt a step).  Each prompt has its own cache; nothing mixes."""
        caches = [self.new_cache() for _ in prompts]
        hs = [self.hidden_states(ids, c)[-1] for ids, c in zip(prompts, caches)]
        if last_rows is None:
            rows = np.stack(hs) @ self.lm_head.T
        else:
            rows = np.stack(last_rows)
        steps = [[] for _ in prompts]
        live = list(range(len(prompts)))
        for s in range(n):
            nxt = []
            for j, p in enumerate(live):
                row = rows[j]
                top2 = np.argpartition(-row, 1)[:2]
                a, b = sorted(top2, key=lambda k: (-row[k], k))
                tok = int(a)
                steps[p].append((tok, float(row[a] - row[b]), log_softmax(row),
                                 float(np.max(np.abs(row)))))
                if tok not in eos:
                    nxt.append(p)
            live = nxt
            if s == n - 1 or not live:
                break
            h = np.stack([self.hidden_states([steps[p][-1][0]], caches[p])[-1] for p in live])
            rows = h @ self.lm_head.T
        return steps


# ----------------------------------------------------------------------------
# self-test: the vectorised reference against slow, literal versions


def naive_logits(m, ids):
    """Per position, per head loops: RoPE as pairwise 2-D rotations of
    (x[j], x[j + d/2]) by pos * inv_freq[j], attention as explicit dot
    products over the past, the MoE as a dense sum over all experts with
    zero weights outside the top k.  Shares only the weights with Model."""
    hd, nh, nkv = m.head_dim, m.heads, m.kv_heads
    half = hd // 2

    def rot(vec, p):
        out = np.empty_like(vec)
        for j in range(half):
            c, s = math.cos(p * m.inv_freq[j]), math.sin(p * m.inv_freq[j])
            x1, x2 = vec[j], vec[j + half]
            out[j] = x1 * c - x2 * s
            out[j + half] = x2 * c + x1 * s
        return out

    def norm(vec, w):
        return vec / math.sqrt(sum(float(t) * float(t) for t in vec) / vec.size + m.eps) * w

    def lin(vec, wb):
        w, b = wb
        y = np.array([float(np.dot(w[r], vec)) for r in range(w.shape[0])])
        return y if b is None else y + b

    def mlp(mm, vec):
        g = lin(vec, mm["gate"])
        g = g / (1.0 + np.exp(-g))
        return lin(g * lin(vec, mm["up"]), mm["down"])

    xs = [m.embed[t].copy() for t in ids]
    for L in m.L:
        keys, vals, new = [], [], []
        for p, x in enumerate(xs):
            h = norm(x, L["in_norm"])
            q = lin(h, L["q"]).reshape(nh, hd)
            k = lin(h, L["k"]).reshape(nkv, hd)
            v = lin(h, L["v"]).reshape(nkv, hd)
            if "q_norm" in L:
                q = np.array([norm(q[j], L["q_norm"]) for j in range(nh)])
                k = np.array([norm(k[j], L["k_norm"]) for j in range(nkv)])
            q = np.array([rot(q[j], p) for j in range(nh)])
            keys.append(np.array([rot(k[j], p) for j in range(nkv)]))
            vals.append(v)
            out = []
            for j in range(nh):
                g = j // (nh // nkv)
                sc = [float(np.dot(q[j], keys[s][g])) / math.sqrt(hd) for s in range(p + 1)]
                mx = max(sc)
                e = [math.exp(c - mx) for c in sc]
                z = sum(e)
                out.append(sum(e[s] / z * vals[s][g] for s in range(p + 1)))
            x2 = x + lin(np.concatenate(out), L["o"])
            h2 = norm(x2, L["post_norm"])
            if "router" in L:
                logits = L["router"] @ h2
                pr = np.exp(logits - logits.max())
                pr /= pr.sum()
                order = sorted(range(pr.size), key=lambda e_: -pr[e_])[:L["top_k"]]
                wsum = sum(pr[e_] for e_ in order) if L["norm_topk"] else 1.0
                y = np.zeros_like(h2)
                for e_ in range(pr.size):
                    we = pr[e_] / wsum if e_ in order else 0.0
                    y = y + we * mlp(L["experts"][e_], h2)
            else:
                y = mlp(L["mlp"], h2)
            new.append(x2 + y)
        xs = new
    return np.array([m.lm_head @ norm(x, m.norm) for x in xs])


def self_test():
    """Returns (passed, failed) after printing one line per check."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import tempfile

    import hf_write

    results = [0, 0]

    def check(ok, what):
        print("%s: %s" % ("PASS" if ok else "FAIL", what))
        results[0 if ok else 1] += 1

    def rel(a, b):
        return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))

    # widening: known bit patterns
    bf = struct.pack("<4H", 0x3F80, 0xC000, 0x3E20, 0x0001)
    check(list(widen(bf, "BF16", 4)) == [1.0, -2.0, 0.15625, 2.0 ** -133],
          "BF16 bits 3f80 c000 3e20 0001 -> 1, -2, 0.15625, 2^-133")
    f16 = struct.pack("<3H", 0x3C00, 0xC200, 0x0001)
    check(list(widen(f16, "F16", 3)) == [1.0, -3.0, 2.0 ** -24], "F16 bits -> 1, -3, 2^-24")

    # llama3 rope: the three bands of _compute_llama3_parameters
    cfg = {"rope_theta": 500000.0, "rope_scaling": {
        "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    base = 1.0 / 500000.0 ** (np.arange(0, 16, 2) / 16.0)
    got = inv_freq_of(cfg, 16)
    wl = 2 * math.pi / base
    hi, lo = wl < 2048, wl > 8192
    mid = ~hi & ~lo
    sm = (8192 / wl[mid] - 1.0) / 3.0
    want_mid = (1 - sm) * base[mid] / 32 + sm * base[mid]
    check(hi.any() and lo.any() and mid.any()
          and np.allclose(got[hi], base[hi], rtol=1e-15, atol=0)
          and np.allclose(got[lo], base[lo] / 32, rtol=1e-15, atol=0)
          and np.allclose(got[mid], want_mid, rtol=1e-15, atol=0),
          "llama3 rope: high band kept, low band / factor, middle interpolated")
    v5 = {"rope_parameters": dict(cfg["rope_scaling"], rope_theta=500000.0)}
    check(np.array_equal(inv_freq_of(v5, 16), got), "rope_parameters (v5 config) = rope_scaling (v4)")

    with tempfile.TemporaryDirectory() as tmp:
        tok = None  # no tokenizer files needed here
        shapes = dict(layers=2, hidden=32, heads=4, kv_heads=2, intermediate=48, vocab=300)
        cases = [
            ("llama", dict(tied=True)),
            ("llama", dict(tied=False, attention_bias=True, mlp_bias=True)),
            ("qwen2", dict(tied=False)),
            ("qwen3", dict(tied=False, head_dim=16)),
            ("qwen3_moe", dict(tied=False, head_dim=16, experts=4, top_k=2, moe_intermediate=24)),
            ("qwen3_moe", dict(tied=True, head_dim=16, experts=4, top_k=2, moe_intermediate=24,
                               norm_topk=False, mlp_only_layers=[0])),
        ]
        ids = [3, 17, 250, 4, 99, 3, 7, 123, 42]
        for n, (arch, extra) in enumerate(cases):
            out = os.path.join(tmp, "m%d" % n)
            kw = dict(shapes)
            kw.update(extra)
            hf_write.write_model(out, arch, tok, seed=100 + n, shards=1 + n % 3, **kw)
            m = load_model(out)
            full = m.forward(ids)
            slow = naive_logits(m, ids)
            check(rel(full, slow) < 1e-12, "%s %s: vectorised = per-position loops (rel %.1e)"
                  % (arch, extra, rel(full, slow)))
            c = m.new_cache()
            inc = np.concatenate([m.forward(ids[:4], c)] + [m.forward([t], c) for t in ids[4:]])
            check(rel(inc, full) < 1e-12, "%s: prefill of 4 + one at a time = one prefill" % arch)
            steps = m.greedy(ids, 5)
            seq = list(ids)
            ok = True
            for tok_, gap, lp, mx in steps:
                r = m.forward(seq)[-1]
                ok = ok and tok_ == int(np.argmax(r)) and rel(lp, log_softmax(r)) < 1e-12
                seq.append(tok_)
            check(ok and len(steps) == 5, "%s: greedy with a cache = argmax of full reruns" % arch)
            many = m.greedy_many([ids, ids[:3], ids[2:7]], 5)
            ok = [t[0] for t in many[0]] == [t[0] for t in steps]
            for k, p in enumerate([ids[:3], ids[2:7]]):
                one = m.greedy(p, 5)
                ok = ok and [t[0] for t in many[k + 1]] == [t[0] for t in one] and all(
                    rel(a[2], b[2]) < 1e-12 for a, b in zip(many[k + 1], one))
            check(ok, "%s: greedy of 3 prompts at once = each alone" % arch)

        # MoE with top-k = every expert, renormalised: the dense softmax sum
        out = os.path.join(tmp, "moe_all")
        hf_write.write_model(out, "qwen3_moe", None, seed=7, shards=1, head_dim=16, experts=4,
                             top_k=4, moe_intermediate=24, **shapes)
        m = load_model(out)
        L = m.L[0]
        x = np.random.default_rng(1).standard_normal((5, shapes["hidden"]))
        pr = softmax(x @ L["router"].T)
        dense = sum(pr[:, e:e + 1] * m._mlp(L["experts"][e], x) for e in range(4))
        check(rel(m._moe(L, x), dense) < 1e-13, "MoE top-k = all experts = dense softmax-weighted sum")

        # the strictness of a loader
        base_dir = os.path.join(tmp, "m2")
        for what, edit in [
            ("a tensor the architecture does not consume",
             lambda c, t: t.__setitem__("model.layers.0.self_attn.o_proj.bias", np.zeros(32))),
            ("a missing tensor", lambda c, t: t.pop("model.norm.weight")),
            ("a shape that disagrees", lambda c, t: c.__setitem__("intermediate_size", 40)),
            ("rope_type yarn", lambda c, t: c.__setitem__(
                "rope_scaling", {"rope_type": "yarn", "factor": 4.0})),
            ("sliding window", lambda c, t: c.__setitem__("use_sliding_window", True)),
            ("an unknown architecture", lambda c, t: c.__setitem__("architectures", ["GPT2LMHeadModel"])),
        ]:
            with open(os.path.join(base_dir, "config.json")) as f:
                c = json.load(f)
            t = load_tensors(base_dir)
            edit(c, t)
            try:
                Model(c, t)
                check(False, "refuses %s" % what)
            except RefError as e:
                check(True, "refuses %s (%s)" % (what, e))
        trunc = os.path.join(tmp, "trunc.safetensors")
        with open(os.path.join(tmp, "m0", "model.safetensors"), "rb") as f:
            data = f.read()
        with open(trunc, "wb") as f:
            f.write(data[:-10])
        try:
            read_safetensors(trunc)
            check(False, "refuses a truncated file")
        except RefError as e:
            check(True, "refuses a truncated file (%s)" % e)
    return results


def parse_ids(s):
    return [int(t) for t in s.split(",") if t]


def main(argv):
    if len(argv) >= 2 and argv[1] == "self-test":
        p, f = self_test()
        print("%d passed, %d failed" % (p, f))
        return 1 if f else 0
    if len(argv) == 5 and argv[1] == "logits":
        load_model(argv[2]).forward(parse_ids(argv[3])).astype("<f8").tofile(argv[4])
        return 0
    if len(argv) == 5 and argv[1] == "greedy":
        steps = load_model(argv[2]).greedy(parse_ids(argv[3]), int(argv[4]))
        print(json.dumps([{"id": t, "gap": g, "logprob": float(lp[t])} for t, g, lp, _ in steps]))
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except RefError as e:
        sys.stderr.write("hf_ref: %s\n" % e)
        sys.exit(1)
