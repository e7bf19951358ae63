#!/usr/bin/env bash
# A prompt longer than a 64 KiB request-plane message (issue #25): a
# GenerateRequest carries the whole prompt, and every end of the request
# plane (router, prefill, decode, epd-ctl) used to cap a message at 64 KiB,
# so a prompt of more than about 30k tokens was refused ("the prompt does
# not fit in one request-plane message", 400; epd-ctl: "input longer than
# the configured limit") although the model's window holds 1M tokens.  Each
# end now sizes its messages for the model's window (epd_msg_cap_for_context).
#  - sim (the hybrid MoE profile, window 1,048,576, scale 0.01), a
#    100,001-token prompt (about 100 KB of varints): prefill -> decode with
#    epd-ctl submit equals epd-generate token for token, in sim's default
#    chunks (8192 tokens);
#  - the same prompt through a router cluster: 200, text equal to
#    epd-generate's; no block left held at decode afterwards.
source "$(dirname "$0")/lib.sh"

profiles="$(cd "$(dirname "$0")/../../engine/profiles" && pwd)"
mkdir -p "$T/sim"
printf '%s\n' "model = $profiles/hybrid-moe-320b.profile" "accel = $profiles/h200.profile" \
  "devices = 8" "scale = 0.01" "mode = sleep" "seed = 3" "vocab = 512" >"$T/sim/sim.conf"
# 100,000 bytes: 100,001 tokens with BOS (a byte vocabulary)
prompt_of_len 100000 9 >"$T/long.txt"
# 6,251 blocks of 16 tokens for the prompt, room for the output
BLOCKS=7000

note "prefill -> decode (epd-ctl submit), 100,001 tokens"
start_daemon d decode --engine sim --model "$T/sim" --worker-id decode-0 --kv-blocks "$BLOCKS" \
  --state-slots 8
start_daemon p prefill --engine sim --model "$T/sim" --worker-id prefill-0 --kv-blocks "$BLOCKS" \
  --state-slots 8 --no-prefix-cache
same_as_colocated "$T/sim" "$p_ADDR" "$d_ADDR" "$T/long.txt" 4 --engine sim
same_as_colocated "$T/sim" "$p_ADDR" "$d_ADDR" "$T/long.txt" 4 --engine sim --temperature 0.8 \
  --seed 4
for n in p d; do
  stop_daemon "$n" TERM
  [ "$STOP_RC" = 0 ] || fail "$n exited $STOP_RC"
done

note "through a router cluster"
# the router's client runs epd-generate for the expected text: with sim's
printf '#!/bin/sh\nexec "%s" --engine sim "$@"\n' "$BIN/epd-generate" >"$T/gen-sim"
chmod +x "$T/gen-sim"
start_router r --model "$T/sim" --engine sim --heartbeat-ms 200 --dead-after-ms 5000
start_daemon d decode --engine sim --model "$T/sim" --worker-id decode-0 --kv-blocks "$BLOCKS" \
  --state-slots 8 --router "$r_ADDR"
start_daemon p prefill --engine sim --model "$T/sim" --worker-id prefill-0 --kv-blocks "$BLOCKS" \
  --state-slots 8 --no-prefix-cache --router "$r_ADDR"
wait_router_state "$r_ADDR" decode-0 READY
wait_router_state "$r_ADDR" prefill-0 READY
router_client same "$r_HTTP" "$T/sim" "$T/gen-sim" --prompt-file "$T/long.txt" --max-tokens 4 ||
  fail "router, 100,001 tokens"
wait_blocks_free "$d_ADDR"
for n in p d r; do
  stop_daemon "$n" TERM
  [ "$STOP_RC" = 0 ] || fail "$n exited $STOP_RC"
done
finish_ok
