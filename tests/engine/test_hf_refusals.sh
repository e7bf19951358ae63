#!/usr/bin/env bash
# A Hugging Face folder the engine cannot answer exactly is refused at open:
# non-zero exit, exactly one ERROR line naming the key or tensor, nothing
# served.  A good folder written by epd-mkmodel --arch is broken one way at
# a time (unknown architecture, rope_type "yarn", sliding window, a tensor
# the architecture does not consume, a missing tensor, a truncated shard, a
# missing shard, a wrong shape, an I32 tensor) and opened by epd-generate
# and by a daemon (epd-prefill with its usual flags; it must exit, never
# write its ready file).
source "$(dirname "$0")/../integration/lib.sh"

PY=$(command -v /usr/bin/python3 || command -v python3)
# st_edit FILE OP NAME [ARG]: rewrites a safetensors header in place (the
# data stays): add NAME (a copy of ARG's entry), drop NAME, shape NAME
# "a,b", dtype NAME DTYPE.
cat >"$T/st_edit.py" <<'PYEOF'
import json, struct, sys
path, op, name = sys.argv[1], sys.argv[2], sys.argv[3]
arg = sys.argv[4] if len(sys.argv) > 4 else None
with open(path, 'rb') as f:
    n = struct.unpack('<Q', f.read(8))[0]
    head = json.loads(f.read(n))
    data = f.read()
if op == 'add':
    head[name] = dict(head[arg])
elif op == 'drop':
    del head[name]
elif op == 'shape':
    head[name]['shape'] = [int(x) for x in arg.split(',')]
elif op == 'dtype':
    head[name]['dtype'] = arg
text = json.dumps(head).encode()
text += b' ' * (-len(text) % 8)
with open(path, 'wb') as f:
    f.write(struct.pack('<Q', len(text)) + text + data)
PYEOF
st_edit() { "$PY" "$T/st_edit.py" "$@" || fail "st_edit $*"; }

# fresh NAME ARCH [flags]: a good folder $T/NAME
fresh() {
  local name=$1 arch=$2
  shift 2
  rm -rf "${T:?}/$name"
  "$BIN/epd-mkmodel" --arch "$arch" --out "$T/$name" --vocab 300 "$@" >/dev/null ||
    fail "epd-mkmodel --arch $arch"
}

# refused NAME PATTERN: epd-generate and epd-prefill both refuse $T/NAME,
# each with one ERROR line, and that line matches PATTERN.
refused() {
  local dir="$T/$1" pat=$2 rc=0 n
  "$BIN/epd-generate" --model "$dir" --prompt-ids 1,2,3 --max-tokens 2 \
    >"$T/$1.gen.out" 2>"$T/$1.gen.err" || rc=$?
  [ "$rc" -ne 0 ] || fail "$1: epd-generate served (exit 0)"
  [ -s "$T/$1.gen.out" ] && fail "$1: epd-generate printed output: $(head -c 200 "$T/$1.gen.out")"
  n=$(grep -c ' ERROR ' "$T/$1.gen.err" || true)
  [ "$n" = 1 ] || { cat "$T/$1.gen.err"; fail "$1: epd-generate logged $n ERROR lines, want 1"; }
  grep ' ERROR ' "$T/$1.gen.err" | grep -Eq -- "$pat" ||
    { cat "$T/$1.gen.err"; fail "$1: the ERROR line does not match '$pat'"; }
  # the daemon, with its usual flags; bounded: if it served, it would not exit
  rc=0
  timeout 120 "$BIN/epd-prefill" --model "$dir" --engine ref --control-addr 127.0.0.1:0 \
    --ready-file "$T/$1.ready" --kv-blocks 64 >"$T/$1.prefill.log" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] || fail "$1: epd-prefill exited 0"
  [ "$rc" -ne 124 ] || fail "$1: epd-prefill kept running on a refused model"
  [ -e "$T/$1.ready" ] && fail "$1: epd-prefill wrote its ready file"
  grep ' ERROR ' "$T/$1.prefill.log" | grep -Eq -- "$pat" ||
    { cat "$T/$1.prefill.log"; fail "$1: epd-prefill's log has no ERROR line matching '$pat'"; }
  echo "refused $1: $(grep ' ERROR ' "$T/$1.gen.err" | sed 's/.* ERROR //')"
}

note "a good folder of each architecture answers"
for a in llama qwen2 qwen3 qwen3_moe; do
  fresh "good_$a" "$a"
  "$BIN/epd-generate" --model "$T/good_$a" --prompt-ids 1,2,3 --max-tokens 4 --tokens \
    >"$T/good_$a.out" 2>"$T/good_$a.err" || { cat "$T/good_$a.err"; fail "good $a refused"; }
  grep -Eq '^[0-9]+( [0-9]+)*$' "$T/good_$a.out" || fail "good $a: no ids: $(cat "$T/good_$a.out")"
done
fresh good_shards llama --shards 3
"$BIN/epd-generate" --model "$T/good_shards" --prompt-ids 1,2,3 --max-tokens 4 --tokens \
  >/dev/null 2>&1 || fail "a good sharded folder was refused"

note "refusals"
fresh arch qwen3
sed -i 's/"Qwen3ForCausalLM"/"GemmaForCausalLM"/' "$T/arch/config.json"
refused arch "key 'architectures': 'GemmaForCausalLM' is not supported"

fresh yarn llama
sed -i 's/"llama3"/"yarn"/' "$T/yarn/config.json"
refused yarn "key 'rope_scaling.rope_type' is 'yarn'"

fresh window qwen3
sed -i 's/"use_sliding_window": false/"use_sliding_window": true/' "$T/window/config.json"
refused window "key 'use_sliding_window'"

# Qwen2's biases under a Llama config: the issue's own example of a tensor
# that would load and answer wrong if it were ignored
fresh bias qwen2
sed -i 's/"Qwen2ForCausalLM"/"LlamaForCausalLM"/; s/"model_type": "qwen2"/"model_type": "llama"/' \
  "$T/bias/config.json"
refused bias "tensor 'model\.layers\.0\.self_attn\.[qkv]_proj\.bias' is not used by LlamaForCausalLM"

fresh extra qwen3
st_edit "$T/extra/model.safetensors" add "model.layers.0.mlp.extra_proj.weight" \
  "model.layers.0.mlp.up_proj.weight"
refused extra "tensor 'model\.layers\.0\.mlp\.extra_proj\.weight' is not used"

fresh missing qwen3_moe
st_edit "$T/missing/model.safetensors" drop "model.layers.1.mlp.experts.3.down_proj.weight"
refused missing "tensor 'model\.layers\.1\.mlp\.experts\.3\.down_proj\.weight' is missing"

fresh truncated llama --shards 3
truncate -s -4096 "$T/truncated/model-00003-of-00003.safetensors"
refused truncated "model-00003-of-00003\.safetensors: tensor '[^']+': data_offsets .* outside"

fresh noshard llama --shards 3
rm "$T/noshard/model-00002-of-00003.safetensors"
refused noshard "weight_map names shard 'model-00002-of-00003\.safetensors'"

fresh shape qwen2
st_edit "$T/shape/model.safetensors" shape "model.layers.1.self_attn.o_proj.weight" "32,128"
refused shape "tensor 'model\.layers\.1\.self_attn\.o_proj\.weight': shape \[32, 128\], config\.json wants \[64, 64\]"

fresh i32 qwen3
st_edit "$T/i32/model.safetensors" dtype "model.layers.0.self_attn.k_norm.weight" I32
refused i32 "tensor 'model\.layers\.0\.self_attn\.k_norm\.weight': unsupported dtype 'I32'"

echo "test_hf_refusals: all refused"
