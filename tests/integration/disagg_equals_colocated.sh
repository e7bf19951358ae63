#!/usr/bin/env bash
# disagg_equals_colocated.sh CONF — the cluster's output equals the
# colocated baseline token for token: `epd-ctl submit --tokens` through a
# prefill daemon and a decode daemon prints exactly what
# `epd-generate --tokens` prints, for a short prompt, a long one (~1.5k
# tokens), prompts ending exactly on and just past a KV block boundary
# (BOS + prompt = 16k and 16k+1 tokens), a hybrid model (linear + attention
# layers) and an attention-only one, greedy and seeded sampling; on ucx-shm
# also a linear-only model and the sim engine (a shrunk hybrid 320B profile;
# decode checking its stamped KV in full, and by its stamps alone).
# CONF: ucx-shm (UCX_TLS=posix,cma,tcp), ucx-tcp (UCX_TLS=tcp),
#       ofi-tcp (libfabric tcp;ofi_rxm).
source "$(dirname "$0")/lib.sh"

conf=${1:?usage: disagg_equals_colocated.sh ucx-shm|ucx-tcp|ofi-tcp}
case "$conf" in
  ucx-shm) export UCX_TLS=posix,cma,tcp; XFLAGS=(--transport ucx --expect-transport shm) ;;
  ucx-tcp) export UCX_TLS=tcp; XFLAGS=(--transport ucx --expect-transport tcp) ;;
  ofi-tcp) export FI_PROVIDER="tcp;ofi_rxm"
           XFLAGS=(--transport ofi --expect-transport tcp --provider "tcp;ofi_rxm") ;;
  *) fail "unknown configuration $conf" ;;
esac
CTL_FLAGS="${XFLAGS[*]}"
# the shell word-splits CTL_FLAGS: keep the provider out of it (it has a ';')
[ "$conf" = ofi-tcp ] && CTL_FLAGS="--transport ofi --expect-transport tcp"

run_pair() { # MODEL TAG: starts prefill TAG_p and decode TAG_d
  local model=$1 tag=$2
  start_daemon "${tag}_d" decode --model "$model" --worker-id "decode-$tag" "${XFLAGS[@]}" \
    --kv-blocks 1024 --state-slots 64 --block-tokens 16
  start_daemon "${tag}_p" prefill --model "$model" --worker-id "prefill-$tag" "${XFLAGS[@]}" \
    --kv-blocks 512 --state-slots 16 --block-tokens 16
}

mkmodel "$T/hybrid" "${TINY_MODEL_FLAGS[@]}"
run_pair "$T/hybrid" h
note "$conf: hybrid LLA model: prefill $h_p_ADDR, decode $h_d_ADDR"
[ "$(health_field "$h_p_ADDR" transport)" = "${XFLAGS[1]}" ] || fail "prefill serves another transport"
[ "$(health_field "$h_d_ADDR" role)" = decode ] || fail "decode daemon's Health role is not decode"
[ "$(health_field "$h_p_ADDR" role)" = prefill ] || fail "prefill daemon's Health role is not prefill"

printf 'Hello, disaggregated world!' >"$T/short"
prompt_of_len 1500 3 >"$T/long"
for k in 2 8; do
  prompt_of_len $((16 * k - 1)) $k >"$T/on$k"    # BOS + prompt = 16k tokens
  prompt_of_len $((16 * k)) $k >"$T/past$k"      # BOS + prompt = 16k + 1 tokens
done

note "short prompt, greedy"
same_as_colocated "$T/hybrid" "$h_p_ADDR" "$h_d_ADDR" "$T/short" 40
note "short prompt, seeded sampling (temperature 0.8, top-p 0.9)"
same_as_colocated "$T/hybrid" "$h_p_ADDR" "$h_d_ADDR" "$T/short" 40 --temperature 0.8 --top-p 0.9 --seed 1234
note "long prompt (1501 tokens), greedy"
same_as_colocated "$T/hybrid" "$h_p_ADDR" "$h_d_ADDR" "$T/long" 24
note "long prompt, seeded sampling with top-k"
same_as_colocated "$T/hybrid" "$h_p_ADDR" "$h_d_ADDR" "$T/long" 24 --temperature 0.8 --top-p 0.9 --top-k 40 --seed 99
# the full matrix on shared memory; the slower transports get the first size
BOUNDARY_KS="2 8"
[ "$conf" = ucx-shm ] || BOUNDARY_KS="2"
for k in $BOUNDARY_KS; do
  note "prompt on a block boundary (BOS + $((16 * k - 1)) bytes = $((16 * k)) tokens) and just past it"
  same_as_colocated "$T/hybrid" "$h_p_ADDR" "$h_d_ADDR" "$T/on$k" 20
  same_as_colocated "$T/hybrid" "$h_p_ADDR" "$h_d_ADDR" "$T/past$k" 20
  same_as_colocated "$T/hybrid" "$h_p_ADDR" "$h_d_ADDR" "$T/on$k" 20 --temperature 0.8 --top-p 0.9 --seed $k
done
note "one token only (the prefill's first token is the whole answer)"
same_as_colocated "$T/hybrid" "$h_p_ADDR" "$h_d_ADDR" "$T/past2" 1

note "text mode (streamed, UTF-8 repaired across chunks) prints what epd-generate prints"
TEXT_SPECS=("short 30" "on2 200" "long 120")
[ "$conf" = ucx-shm ] || TEXT_SPECS=("on2 200")
for spec in "${TEXT_SPECS[@]}"; do
  set -- $spec
  epd-generate-text() { "$BIN/epd-generate" --model "$T/hybrid" --prompt "$(cat "$T/$1")" --max-tokens "$2" "${@:3}" | od -An -tx1; }
  want=$(epd-generate-text "$1" "$2" --temperature 0.9 --seed 77)
  got=$("$BIN/epd-ctl" submit --prefill "$h_p_ADDR" --decode "$h_d_ADDR" --model "$T/hybrid" \
        --prompt "$(cat "$T/$1")" --max-tokens "$2" --temperature 0.9 --seed 77 $CTL_FLAGS | od -An -tx1)
  [ "$want" = "$got" ] || fail "text output differs for prompt $1 (bytes: colocated / disaggregated):
$want
$got"
done

wait_blocks_free "$h_d_ADDR" 20

if [ "$conf" = ucx-shm ]; then
  note "attention-only model"
  mkmodel "$T/attn" --layers 2 --dim 64 --heads 4 --kv-heads 2 --layer-pattern A --ffn 128 \
    --max-context 2048 --seed 11
  run_pair "$T/attn" a
  same_as_colocated "$T/attn" "$a_p_ADDR" "$a_d_ADDR" "$T/on2" 24
  same_as_colocated "$T/attn" "$a_p_ADDR" "$a_d_ADDR" "$T/long" 16 --temperature 0.8 --top-p 0.9 --seed 5
  note "linear-only model"
  mkmodel "$T/lin" --layers 2 --dim 64 --heads 4 --kv-heads 2 --layer-pattern L --ffn 128 \
    --max-context 2048 --seed 12
  run_pair "$T/lin" l
  same_as_colocated "$T/lin" "$l_p_ADDR" "$l_d_ADDR" "$T/past2" 24
  note "sim engine (hybrid 320B MoE profile on 8 x H200, shrunk): same tokens as epd-generate --engine sim"
  profiles="$(cd "$(dirname "$0")/../../engine/profiles" && pwd)"
  mkdir -p "$T/sim"
  printf '%s\n' "model = $profiles/hybrid-moe-320b.profile" "accel = $profiles/h200.profile" \
    "devices = 8" "scale = 0.01" "mode = sleep" "seed = 3" "vocab = 512" >"$T/sim/sim.conf"
  # --verify full: every byte of the stamped KV hashed too (the default,
  # stamps, is exercised by the second decode worker below)
  start_daemon s_d decode --engine sim --model "$T/sim" --worker-id decode-sim "${XFLAGS[@]}" \
    --kv-blocks 256 --state-slots 16 --block-tokens 16 --verify full
  start_daemon s_p prefill --engine sim --model "$T/sim" --worker-id prefill-sim "${XFLAGS[@]}" \
    --kv-blocks 128 --state-slots 8 --block-tokens 16
  same_as_colocated "$T/sim" "$s_p_ADDR" "$s_d_ADDR" "$T/long" 16 --engine sim
  same_as_colocated "$T/sim" "$s_p_ADDR" "$s_d_ADDR" "$T/past2" 16 --engine sim --temperature 0.8 --seed 4
  note "sim engine, decode checking the stamps only (--verify stamps, the default)"
  start_daemon t_d decode --engine sim --model "$T/sim" --worker-id decode-sim-stamps "${XFLAGS[@]}" \
    --kv-blocks 256 --state-slots 16 --block-tokens 16 --verify stamps
  same_as_colocated "$T/sim" "$s_p_ADDR" "$t_d_ADDR" "$T/long" 16 --engine sim
  # that prompt came from prefill's prefix cache (blocks stamped for the
  # first request and decode-sim: sent with BYTES checksums, never STAMPED)
  [ "$(health_field "$s_p_ADDR" prefix_hit_tokens)" -gt 0 ] ||
    fail "the sim prefill worker's prefix cache never hit"
  same_as_colocated "$T/sim" "$s_p_ADDR" "$t_d_ADDR" "$T/on2" 16 --engine sim --temperature 0.8 --seed 6
fi

note "SIGTERM stops both daemons cleanly (exit 0)"
stop_daemon h_p TERM
[ "$STOP_RC" = 0 ] || fail "prefill exited $STOP_RC on SIGTERM"
stop_daemon h_d TERM
[ "$STOP_RC" = 0 ] || fail "decode exited $STOP_RC on SIGTERM"
finish_ok
