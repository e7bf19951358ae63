#!/usr/bin/env bash
# Workers and a router that goes away (proto/epd_registrar): a prefill and
# a decode worker started before their router keep retrying and register
# once it is up; when the router is killed and a new one starts on the same
# control address, its first heartbeats answer known=false and both
# workers register again (READY within a few heartbeats, not after gRPC's
# reconnect backoff) and serve through the new router; a worker whose
# router is gone still stops promptly on SIGTERM.
source "$(dirname "$0")/lib.sh"

mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"

# a control port that was free a moment ago: start a router on :0, note it, stop it
start_router r0 --model "$T/m"
CTL=$r0_ADDR
stop_daemon r0 TERM

note "workers first: they retry every second, and are not ready until accepted"
start_unjoined d decode --model "$T/m" --worker-id decode-0 --kv-blocks 512 --state-slots 32 \
  --router "$CTL"
start_unjoined p prefill --model "$T/m" --worker-id prefill-0 --router "$CTL"
sleep 1.5
[ ! -e "$T/d.ready" ] && [ ! -e "$T/p.ready" ] || fail "a worker no router accepted is ready"
grep -q "registration with the router $CTL failed" "$T/d.log" ||
  fail "decode does not say its registration failed: $(tail -n 3 "$T/d.log")"

start_router r1 --model "$T/m" --control-addr "$CTL" --heartbeat-ms 100
[ "$r1_ADDR" = "$CTL" ] || fail "router r1 is on $r1_ADDR, not $CTL"
wait_router_state "$CTL" decode-0 READY 5
wait_router_state "$CTL" prefill-0 READY 5
wait_ready d
wait_ready p
printf 'Before the router restarts.' >"$T/p1"
router_client same "$r1_HTTP" "$T/m" "$BIN/epd-generate" --prompt-file "$T/p1" --max-tokens 12 \
  --temperature 0 --stream || fail "a request through the first router"

note "the router is killed; a new one takes its control address"
stop_daemon r1 KILL
sleep 0.5
start_router r2 --model "$T/m" --control-addr "$CTL" --heartbeat-ms 100
t0=$(date +%s%N)
wait_router_state "$CTL" decode-0 READY 5
wait_router_state "$CTL" prefill-0 READY 5
note "both READY at the new router after $((($(date +%s%N) - t0) / 1000000)) ms"
grep -q "does not know this worker: registering again" "$T/p.log" ||
  fail "prefill did not register again on known=false"
router_client same "$r2_HTTP" "$T/m" "$BIN/epd-generate" --prompt-file "$T/p1" --max-tokens 12 \
  --temperature 0 --stream || fail "a request through the new router"
wait_blocks_free "$d_ADDR"

note "router gone: SIGTERM still stops a worker at once"
stop_daemon r2 KILL
sleep 0.3
t0=$(date +%s%N)
stop_daemon p TERM
ms=$((($(date +%s%N) - t0) / 1000000))
[ "$STOP_RC" = 0 ] || fail "prefill exited $STOP_RC on SIGTERM"
# stop_daemon polls every 100 ms; under ASan the exit itself takes longer
[ "$ms" -lt 3000 ] || fail "prefill took $ms ms to stop with its router gone"
note "prefill stopped in $ms ms"
finish_ok
