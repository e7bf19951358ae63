#!/usr/bin/env bash
# Prefill killed mid-transfer (SIGKILL while a long prompt is being
# prefilled and streamed): the client gets a terminal error for the request
# within decode's lease (+ peer timeout); decode's KV blocks all return to
# the free pool; a prefill restarted under the same worker id (new epoch) is
# accepted and a request through it equals colocated; messages carrying the
# old incarnation's epoch are refused (Error EPD_ERR_STALE_EPOCH + a log
# line).
source "$(dirname "$0")/lib.sh"

LEASE_MS=3000
PEER_MS=1500
# big enough that a 4000-token prefill takes a while (~1-2 s; more under ASan)
mkmodel "$T/m" --layers 6 --dim 256 --heads 8 --kv-heads 2 --layer-pattern LA --ffn 512 --vision 0 \
  --max-context 4096 --seed 3
start_daemon d decode --model "$T/m" --worker-id decode-k --lease-ms $LEASE_MS \
  --peer-timeout-ms $PEER_MS --kv-blocks 1024 --state-slots 32
start_daemon p prefill --model "$T/m" --worker-id prefill-k --lease-ms $LEASE_MS \
  --peer-timeout-ms $PEER_MS
old_epoch=$(health_field "$p_ADDR" epoch)
note "prefill $p_ADDR (epoch $old_epoch), decode $d_ADDR"

prompt_of_len 4000 5 >"$T/long"
"$BIN/epd-ctl" submit --prefill "$p_ADDR" --decode "$d_ADDR" --model "$T/m" --prompt-file "$T/long" \
  --max-tokens 8 --tokens --timeout-ms 60000 >"$T/ctl.out" 2>"$T/ctl.err" &
ctl=$!
PIDS+=("$ctl")
# wait until prefill is working on it and decode has reserved its blocks:
# from then on prefill streams each finished layer into them
for i in $(seq 1 200); do
  kill -0 "$ctl" 2>/dev/null || break
  run=$(health_field "$p_ADDR" running_requests)
  free=$(status_field "$d_ADDR" kv_blocks_free)
  total=$(status_field "$d_ADDR" kv_blocks_total)
  if [ "${run:-0}" -ge 1 ] && [ "${free:-0}" != "${total:-0}" ]; then
    break
  fi
  sleep 0.05
done

kill -0 "$ctl" 2>/dev/null || fail "the request ended before the kill: $(cat "$T/ctl.out" "$T/ctl.err")"
note "SIGKILL prefill (running_requests=$run, decode free $free/$total)"
t0=$(date +%s%N)
stop_daemon p KILL
rc=0
wait "$ctl" || rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
note "client ended after $ms ms with exit $rc: $(tail -n 1 "$T/ctl.err")"
[ $rc = 1 ] || fail "epd-ctl exit $rc after the prefill died (want 1): $(cat "$T/ctl.err")"
grep -q "epd-ctl: request failed" "$T/ctl.err" || fail "no clear error: $(cat "$T/ctl.err")"
[ $ms -le $((LEASE_MS + PEER_MS + 5000)) ] || fail "error came after $ms ms (lease $LEASE_MS + peer $PEER_MS)"
wait_blocks_free "$d_ADDR" 20
kill -0 "$d_PID" || fail "decode died"

note "restart prefill under the same worker id"
start_daemon p prefill --model "$T/m" --worker-id prefill-k --lease-ms $LEASE_MS \
  --peer-timeout-ms $PEER_MS
new_epoch=$(health_field "$p_ADDR" epoch)
[ "$new_epoch" != "$old_epoch" ] || fail "restarted prefill kept its epoch $old_epoch"
printf 'After the restart.' >"$T/short"
same_as_colocated "$T/m" "$p_ADDR" "$d_ADDR" "$T/short" 12
wait_blocks_free "$d_ADDR" 20

note "the old incarnation's messages are refused"
"$ITEST/epd-itest-raw" stale --target "$d_ADDR" --as-worker prefill-k --epoch "$old_epoch" ||
  fail "decode accepted the old prefill epoch"
"$ITEST/epd-itest-raw" old-epoch --target "$p_ADDR" --epoch "$old_epoch" ||
  fail "prefill accepted a request for its old epoch"
grep -qi "req=424242 .*epoch" "$T/d.log" || fail "decode logged nothing about the stale WritesQuiesced"
grep -qi "req=424243 .*epoch" "$T/d.log" || fail "decode logged nothing about the stale LayerDone"
grep -qi "req=8001 .*epoch" "$T/p.log" || fail "prefill logged nothing about the request for its old epoch"
same_as_colocated "$T/m" "$p_ADDR" "$d_ADDR" "$T/short" 6
finish_ok
