#!/usr/bin/env bash
# A router killed mid-stream over ucx-shm leaves no worker busy-polling
# (#29).  Router, prefill, decode and an encoder on UCX shared memory
# (UCX_TLS=posix,cma,tcp); streaming completions run in a loop; the router
# is stopped (SIGSTOP, so its receive FIFO fills with the tokens decode
# keeps sending), then SIGKILLed.  (The sleeps here only give the FIFO
# time to fill; the checks are on CPU used and on states reached.)  Before the fix the sends left waiting
# for room in the dead router's FIFO kept UCX refusing to arm the workers'
# event fd for ever (an endpoint of UCP_ERR_HANDLING_MODE_NONE can neither
# fail nor be force-closed), and every worker that had sent to the router,
# the idle encoder too, polled at a full core until it was restarted.
# Now each worker's CPU (utime + stime from /proc/PID/stat) over the 5 s
# after the kill is under 5% of a core — a bound on CPU used, not on how
# fast anything happens.  A new router on the same control address then
# gets every worker back (re-registration) and answers a completion 200.
source "$(dirname "$0")/lib.sh"

export UCX_TLS=posix,cma,tcp
XF=(--transport ucx --expect-transport shm --peer-timeout-ms 3000)
mkmodel "$T/m" "${TINY_VISION_FLAGS[@]}"
start_router r1 --model "$T/m" --heartbeat-ms 500 --ready-without-encoder "${XF[@]}"
CTL=$r1_ADDR
start_daemon e encoder --model "$T/m" --worker-id encoder-0 --router "$CTL" "${XF[@]}"
start_daemon d decode --model "$T/m" --worker-id decode-0 --kv-blocks 1024 --state-slots 32 \
  --router "$CTL" "${XF[@]}"
start_daemon p prefill --model "$T/m" --worker-id prefill-0 --router "$CTL" "${XF[@]}"
for w in encoder-0 decode-0 prefill-0; do
  wait_router_state "$CTL" "$w" READY 20
done

note "streaming completions in a loop (8 clients), until the router is gone"
CLIENTS=()
for i in 1 2 3 4 5 6 7 8; do
  (
    for j in $(seq 1 100000); do
      curl -s -N --max-time 30 "$r1_HTTP/v1/completions" -H 'Content-Type: application/json' \
        -d '{"model":"m","prompt":"Streams while the router dies '"$i"'","max_tokens":1500,
             "stream":true,"temperature":0.9,"seed":'"$j"'}' >>"$T/stream$i.out" 2>/dev/null || break
    done
  ) &
  CLIENTS+=($!)
done
# tokens flowing through the router (bounded wait for a condition)
for i in $(seq 1 300); do
  n=$(cat "$T"/stream*.out 2>/dev/null | grep -c '^data: {' || true)
  [ "$n" -ge 200 ] && break
  sleep 0.1
done
[ "$n" -ge 200 ] || fail "the streams did not start ($n events)"

note "router stopped (its FIFO fills), then SIGKILLed"
kill -STOP "$r1_PID"
# 2 s of tokens from 8 streams fill its 256-message FIFO (the stuck state
# came in 3 of 3 runs this way, 1 of 3 with 4 streams and 1 s)
sleep 2
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
stop_daemon r1 KILL
t0=$(date +%s%N)
e0=$(ticks "$e_PID"); d0=$(ticks "$d_PID"); p0=$(ticks "$p_PID")
sleep 5
e1=$(ticks "$e_PID"); d1=$(ticks "$d_PID"); p1=$(ticks "$p_PID")
ms=$((($(date +%s%N) - t0) / 1000000))
for c in "${CLIENTS[@]}"; do
  kill "$c" 2>/dev/null || true
  wait "$c" 2>/dev/null || true
done
hz=$(getconf CLK_TCK)
for w in e:$((e1 - e0)) d:$((d1 - d0)) p:$((p1 - p0)); do
  name=${w%%:*} used=${w#*:}
  # per mille of one core over the window
  pm=$((used * 1000 * 1000 / hz / ms))
  note "$name: $used ticks of CPU in $ms ms = $((pm / 10)).$((pm % 10))% of a core"
  [ "$pm" -lt 50 ] || fail "worker $name used $((pm / 10)).$((pm % 10))% of a core in the $ms ms after the router died (bound 5%): busy-polling"
done

note "a new router on the same control address: the workers come back and serve"
start_router r2 --model "$T/m" --control-addr "$CTL" --heartbeat-ms 500 --ready-without-encoder \
  "${XF[@]}"
[ "$r2_ADDR" = "$CTL" ] || fail "router r2 is on $r2_ADDR, not $CTL"
for w in encoder-0 decode-0 prefill-0; do
  wait_router_state "$CTL" "$w" READY 20
done
printf 'After the router came back.' >"$T/p1"
router_client same "$r2_HTTP" "$T/m" "$BIN/epd-generate" --prompt-file "$T/p1" --max-tokens 12 \
  --temperature 0 --stream || fail "a completion through the new router"
finish_ok
