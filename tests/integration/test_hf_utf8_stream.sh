#!/usr/bin/env bash
# UTF-8 characters split across generated ids, through a model folder's
# tokenizer.json: a byte-level tokenizer (GPT-2's byte map, one id per
# byte, <s> / </s> special) on a tiny ref model whose vocabulary is those
# 258 ids, so every character of two or more bytes the model emits is split
# across ids.  A seed whose epd-generate output holds such a character
# (checked here from its ids) is then asked of the router over ucx-shm,
# streamed and not: both texts equal epd-generate's byte for byte (the
# router's stream decoder, epd_tokenizer_stream_*, holds the first bytes
# until the character is whole; an SSE event with half a character would
# have become U+FFFD).  The folder's generation_config.json gives the
# default temperature, top_p and top_k of a request that omits them.
source "$(dirname "$0")/lib.sh"

export UCX_TLS=posix,cma,tcp
XF=(--transport ucx --expect-transport shm)
mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"
python3 - "$T/m/tokenizer.json" <<'EOF'
import json, sys
# GPT-2's byte -> unicode map (bytes_to_unicode)
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
m = dict(zip(bs, (chr(c) for c in cs)))
tok = {
    "model": {"type": "BPE", "vocab": {m[b]: b for b in range(256)}, "merges": []},
    "normalizer": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
    "decoder": {"type": "ByteLevel"},
    "added_tokens": [
        {"id": i, "content": c, "special": True, "normalized": False, "lstrip": False,
         "rstrip": False, "single_word": False} for i, c in ((256, "<s>"), (257, "</s>"))],
    "post_processor": {"type": "TemplateProcessing",
                       "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                  {"Sequence": {"id": "A", "type_id": 0}}],
                       "special_tokens": {"<s>": {"id": "<s>", "ids": [256], "tokens": ["<s>"]}}},
}
json.dump(tok, open(sys.argv[1], "w"))
EOF
# default sampling the router applies where a request gives none
printf '{"temperature": 1.2, "top_p": 0.9, "top_k": 50, "do_sample": true}\n' \
  >"$T/m/generation_config.json"
GEN_DEFAULTS=(--gen-top-p 0.9 --gen-top-k 50)
G="$BIN/epd-generate"
printf 'Ströme: ünïcödé → 流れ' >"$T/p"

note "a seed whose output has a character split across ids"
seed=
for s in $(seq 1 40); do
  ids=$("$G" --model "$T/m" --prompt "$(cat "$T/p")" --max-tokens 48 --temperature 1.5 --seed "$s" \
        --tokens) || fail "epd-generate --seed $s"
  if python3 -c '
import sys
b = bytes(int(x) for x in sys.argv[1].split() if int(x) < 256)
t = b.decode("utf-8", "replace")
sys.exit(0 if any(ord(c) > 127 and c != "\ufffd" for c in t) else 1)' "$ids"; then
    seed=$s
    break
  fi
done
[ -n "$seed" ] || fail "no seed of 1..40 gives a multibyte character"
note "seed $seed: $("$G" --model "$T/m" --prompt "$(cat "$T/p")" --max-tokens 48 --temperature 1.5 --seed "$seed")"

start_router r --model "$T/m" "${XF[@]}"
start_daemon d decode --model "$T/m" --worker-id decode-0 --kv-blocks 256 --state-slots 16 \
  --router "$r_ADDR" "${XF[@]}"
start_daemon p prefill --model "$T/m" --worker-id prefill-0 --router "$r_ADDR" "${XF[@]}"
wait_router_state "$r_ADDR" decode-0 READY 20
wait_router_state "$r_ADDR" prefill-0 READY 20

note "the router's text, streamed and not, equals epd-generate's"
for s in "" --stream; do
  router_client same "$r_HTTP" "$T/m" "$G" --prompt-file "$T/p" --max-tokens 48 \
    --temperature 1.5 --top-p 1 --top-k 0 --seed "$seed" $s || fail "completion $s differs"
done

note "generation_config.json's temperature, top_p and top_k where the request gives none"
grep -q "generation_config.json: a request without them samples with temperature 1.2, top_p 0.9, top_k 50" \
  "$T/r.log" || fail "the router did not say which defaults it applies"
router_client same "$r_HTTP" "$T/m" "$G" --prompt-file "$T/p" --max-tokens 24 --seed 5 \
  --gen-temperature 1.2 "${GEN_DEFAULTS[@]}" || fail "the folder's defaults were not applied"
router_client same "$r_HTTP" "$T/m" "$G" --prompt-file "$T/p" --max-tokens 24 --seed 5 \
  --temperature 0.7 "${GEN_DEFAULTS[@]}" --stream || fail "a request's temperature must win"
router_client same "$r_HTTP" "$T/m" "$G" --prompt-file "$T/p" --max-tokens 24 --temperature 0 ||
  fail "greedy (temperature 0) with the folder's defaults"
finish_ok
