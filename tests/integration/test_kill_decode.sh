#!/usr/bin/env bash
# Decode killed mid-transfer: the client gets a clear error, prefill keeps
# serving (Health serving, nothing left running), a decode restarted under
# the same worker id (new epoch) is accepted and a request through it
# equals colocated; the old decode incarnation's messages and requests
# naming it are refused (Error EPD_ERR_STALE_EPOCH + a log line).
source "$(dirname "$0")/lib.sh"

LEASE_MS=3000
PEER_MS=1500
mkmodel "$T/m" --layers 6 --dim 256 --heads 8 --kv-heads 2 --layer-pattern LA --ffn 512 --vision 0 \
  --max-context 4096 --seed 3
start_daemon d decode --model "$T/m" --worker-id decode-k --lease-ms $LEASE_MS \
  --peer-timeout-ms $PEER_MS --kv-blocks 1024 --state-slots 32
start_daemon p prefill --model "$T/m" --worker-id prefill-k --lease-ms $LEASE_MS \
  --peer-timeout-ms $PEER_MS
old_epoch=$(health_field "$d_ADDR" epoch)
note "prefill $p_ADDR, decode $d_ADDR (epoch $old_epoch)"

prompt_of_len 4000 6 >"$T/long"
"$BIN/epd-ctl" submit --prefill "$p_ADDR" --decode "$d_ADDR" --model "$T/m" --prompt-file "$T/long" \
  --max-tokens 8 --tokens --timeout-ms 60000 >"$T/ctl.out" 2>"$T/ctl.err" &
ctl=$!
PIDS+=("$ctl")
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
note "SIGKILL decode (prefill running_requests=$run, decode free $free/$total)"
t0=$(date +%s%N)
stop_daemon d KILL
rc=0
wait "$ctl" || rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
note "client ended after $ms ms with exit $rc: $(tail -n 1 "$T/ctl.err")"
[ $rc = 1 ] || fail "epd-ctl exit $rc after decode died (want 1): $(cat "$T/ctl.err")"
grep -q "epd-ctl: request failed" "$T/ctl.err" || fail "no clear error: $(cat "$T/ctl.err")"
[ $ms -le $((LEASE_MS + PEER_MS + 5000)) ] || fail "error came after $ms ms"

note "prefill keeps serving"
kill -0 "$p_PID" || fail "prefill died"
[ "$(health_field "$p_ADDR" serving)" = 1 ] || fail "prefill not serving"
for i in $(seq 1 200); do
  [ "$(health_field "$p_ADDR" running_requests)" = 0 ] && break
  sleep 0.1
done
[ "$(health_field "$p_ADDR" running_requests)" = 0 ] || fail "prefill still runs the dead decode's request"

note "restart decode under the same worker id"
start_daemon d decode --model "$T/m" --worker-id decode-k --lease-ms $LEASE_MS \
  --peer-timeout-ms $PEER_MS --kv-blocks 1024 --state-slots 32
new_epoch=$(health_field "$d_ADDR" epoch)
[ "$new_epoch" != "$old_epoch" ] || fail "restarted decode kept its epoch"
printf 'After the decode restart.' >"$T/short"
same_as_colocated "$T/m" "$p_ADDR" "$d_ADDR" "$T/short" 12

note "the old incarnation's messages are refused"
"$ITEST/epd-itest-raw" stale --target "$p_ADDR" --as-worker decode-k --epoch "$old_epoch" ||
  fail "prefill accepted the old decode epoch"
"$ITEST/epd-itest-raw" old-epoch --target "$d_ADDR" --epoch "$old_epoch" ||
  fail "decode accepted a request for its old epoch"
grep -qi "req=424242 .*epoch" "$T/p.log" || fail "prefill logged nothing about the stale WritesQuiesced"
grep -qi "req=8001 .*epoch" "$T/d.log" || fail "decode logged nothing about the request for its old epoch"
same_as_colocated "$T/m" "$p_ADDR" "$d_ADDR" "$T/short" 6
wait_blocks_free "$d_ADDR" 20
finish_ok
