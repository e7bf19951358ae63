#!/usr/bin/env bash
# Overload, the way users expect it: 300 requests at once at a cluster whose
# decode pool holds a few of them.  The router admits what the pools hold,
# keeps a bounded queue (--max-queue, --queue-timeout-ms) and answers the
# rest 429 with Retry-After and OpenAI's rate-limit error body; nothing is
# a 5xx, and every 200 equals epd-generate's answer.  Once with decode KV
# on demand (the default), once with the up-front reservation
# (--kv-reserve upfront); no block is held at the end of either.  Then
# the prefill pool full instead of the decode pool: the same answers.
source "$(dirname "$0")/lib.sh"

G="$BIN/epd-generate"
mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"
# every client holds a connection from 127.0.0.1: no per-address cap
start_router r --model "$T/m" --heartbeat-ms 100 --max-queue 32 --queue-timeout-ms 5000 \
  --max-connections-per-addr 0
H=$r_HTTP
start_daemon p prefill --model "$T/m" --worker-id prefill-0 --router "$r_ADDR"
wait_router_state "$r_ADDR" prefill-0 READY

# burst MODE: a fresh decode worker (48 blocks) in MODE, 300 requests.
burst() {
  local mode=$1 name=d${1%%-*} out ok rej addr
  start_daemon "$name" decode --model "$T/m" --worker-id "decode-$mode" --kv-blocks 48 \
    --state-slots 64 --kv-reserve "$mode" --router "$r_ADDR"
  wait_router_state "$r_ADDR" "decode-$mode" READY
  note "$mode: 300 requests at once"
  out=$(router_client burst "$H" "$T/m" "$G" --count 300 --max-tokens 32 --long-every 7) ||
    fail "$mode: a request was neither 200 equal to epd-generate nor 429 with Retry-After"
  echo "$out"
  ok=$(sed -n 's/^ok \([0-9]*\) rejected \([0-9]*\)$/\1/p' <<<"$out")
  rej=$(sed -n 's/^ok \([0-9]*\) rejected \([0-9]*\)$/\2/p' <<<"$out")
  [ "${ok:-0}" -gt 0 ] || fail "$mode: no request served"
  # 300 at once against a queue of 32 and a pool of a few: the queue
  # overflows whatever the machine's speed (nothing is served before most
  # of the burst is in)
  [ "${rej:-0}" -gt 0 ] || fail "$mode: nothing answered 429"
  addr="${name}_ADDR"
  wait_blocks_free "${!addr}"
  stop_daemon "$name"
  [ "$STOP_RC" = 0 ] || fail "decode ($mode) exited $STOP_RC"
  wait_router_state "$r_ADDR" "decode-$mode" DEAD 10
}

burst on-demand
burst upfront

# the prefill pool full instead: a prefill worker with 2 state slots (2
# prompts at once) in place of the first, a roomy decode worker; the same
# answers (200 equal to epd-generate, or 429 with Retry-After), never a 5xx
note "prefill pool full: 300 requests at once"
stop_daemon p
[ "$STOP_RC" = 0 ] || fail "prefill exited $STOP_RC"
wait_router_state "$r_ADDR" prefill-0 DEAD 10
start_daemon ps prefill --model "$T/m" --worker-id prefill-small --state-slots 2 \
  --router "$r_ADDR"
start_daemon dbig decode --model "$T/m" --worker-id decode-big --kv-blocks 4096 \
  --state-slots 512 --router "$r_ADDR"
wait_router_state "$r_ADDR" prefill-small READY
wait_router_state "$r_ADDR" decode-big READY
r0=$(router_metric "$H" epd_router_capacity_retries_total)
out=$(router_client burst "$H" "$T/m" "$G" --count 300 --max-tokens 32 --long-every 7) ||
  fail "prefill full: a request was neither 200 equal to epd-generate nor 429 with Retry-After"
echo "$out"
r1=$(router_metric "$H" epd_router_capacity_retries_total)
echo "capacity retries during the prefill-full burst: $((r1 - r0))"
[ "$r1" -gt "$r0" ] || fail "the small prefill pool never refused for room"
wait_blocks_free "$dbig_ADDR"
for k in upstream timeout no_workers internal; do
  n=$(router_metric "$H" "epd_router_errors_total{kind=\"$k\"}")
  [ "${n:-0}" = 0 ] || fail "$n requests ended as $k"
done
n=$(router_metric "$H" 'epd_router_errors_total{kind="overloaded"}')
[ "${n:-0}" -gt 0 ] || fail "no 429 counted"
router_metric "$H" 'epd_router_rejected_total{reason="queue_full"}' | sed 's/^/queue_full /'
router_metric "$H" 'epd_router_rejected_total{reason="queue_timeout"}' | sed 's/^/queue_timeout /'
router_metric "$H" epd_router_capacity_retries_total | sed 's/^/capacity_retries /'
finish_ok
