#!/usr/bin/env bash
# A loopback cluster — router, 2 prefill, 2 decode, registered with --router:
# 64 concurrent HTTP clients (keep-alive; completions and chat, streaming and
# not, sampled) all complete and every answer equals epd-generate's; both
# workers of each pool take traffic; /metrics counts it all.  Then a prefill
# and a decode worker started later join (READY within a heartbeat) and take
# new traffic.  A worker whose heartbeats stop (SIGSTOP) is SUSPECT and gets
# no new requests, and takes traffic again once it heartbeats (SIGCONT).
source "$(dirname "$0")/lib.sh"

mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"
start_router r --model "$T/m" --heartbeat-ms 200 --dead-after-ms 600
for i in 0 1; do
  start_daemon "d$i" decode --model "$T/m" --worker-id "decode-$i" --kv-blocks 1024 \
    --state-slots 64 --router "$r_ADDR"
  start_daemon "p$i" prefill --model "$T/m" --worker-id "prefill-$i" --router "$r_ADDR"
done
for w in decode-0 decode-1 prefill-0 prefill-1; do
  wait_router_state "$r_ADDR" "$w" READY
done
G="$BIN/epd-generate"

note "64 concurrent clients, 512 requests"
router_client load "$r_HTTP" "$T/m" "$G" --clients 64 --requests 512 --prompts 4 --max-tokens 12 ||
  fail "concurrent load"
for w in decode-0 decode-1; do
  n=$(router_metric "$r_HTTP" "epd_router_worker_requests_total{worker=\"$w\",pool=\"decode\"}")
  [ "${n:-0}" -gt 50 ] || fail "$w took ${n:-0} of 512 requests"
done
for w in prefill-0 prefill-1; do
  n=$(router_metric "$r_HTTP" "epd_router_worker_requests_total{worker=\"$w\",pool=\"prefill\"}")
  [ "${n:-0}" -gt 50 ] || fail "$w took ${n:-0} of 512 requests"
done
ok=$(router_metric "$r_HTTP" epd_router_requests_ok_total)
[ "$ok" = 512 ] || fail "epd_router_requests_ok_total=$ok, want 512"
n=$(router_metric "$r_HTTP" epd_router_ttft_seconds_count)
[ "$n" = 512 ] || fail "epd_router_ttft_seconds_count=$n"
[ "$(router_metric "$r_HTTP" epd_router_requests_in_flight)" = 0 ] || fail "requests left in flight"
[ "$(router_metric "$r_HTTP" 'epd_router_workers{pool="decode",state="READY"}')" = 2 ] ||
  fail "metrics: 2 READY decode workers"
wait_blocks_free "$d0_ADDR"
wait_blocks_free "$d1_ADDR"

note "late-joining workers take traffic"
start_daemon d2 decode --model "$T/m" --worker-id decode-2 --kv-blocks 1024 --state-slots 64 \
  --router "$r_ADDR"
start_daemon p2 prefill --model "$T/m" --worker-id prefill-2 --router "$r_ADDR"
wait_router_state "$r_ADDR" decode-2 READY 5
wait_router_state "$r_ADDR" prefill-2 READY 5
router_client load "$r_HTTP" "$T/m" "$G" --clients 8 --requests 48 --prompts 2 --max-tokens 8 ||
  fail "load after the join"
for w in decode-2 prefill-2; do
  pool=${w%-*}
  n=$(router_metric "$r_HTTP" "epd_router_worker_requests_total{worker=\"$w\",pool=\"$pool\"}")
  # least-load: how many depends on how fast each worker serves (under the
  # sanitizers on a loaded machine a new worker took 5 of 48); that it is
  # chosen at all is what joining late must give
  [ "${n:-0}" -ge 1 ] || fail "late $w took ${n:-0} of 48 requests"
done
wait_blocks_free "$d2_ADDR"

note "a worker whose heartbeats stop is SUSPECT and gets no new requests; back when they resume"
kill -STOP "$p2_PID"
for i in $(seq 1 400); do # at most 20 s of 0.05 s sleeps (and the calls)
  st=$(router_state "$r_ADDR" prefill-2)
  [ "$st" = SUSPECT ] || [ "$st" = DEAD ] && break
  sleep 0.05
done
[ "$st" = SUSPECT ] || [ "$st" = DEAD ] || { kill -CONT "$p2_PID"; fail "stopped prefill-2 is $st"; }
before=$(router_metric "$r_HTTP" 'epd_router_worker_requests_total{worker="prefill-2",pool="prefill"}')
rc=0
router_client load "$r_HTTP" "$T/m" "$G" --clients 4 --requests 8 --prompts 2 --max-tokens 4 || rc=$?
after=$(router_metric "$r_HTTP" 'epd_router_worker_requests_total{worker="prefill-2",pool="prefill"}')
kill -CONT "$p2_PID"
[ $rc = 0 ] || fail "requests while prefill-2 was silent"
# (an empty series: its endpoint timed out meanwhile and it is DEAD, unlisted)
[ -z "$after" ] || [ "${before:-0}" = "$after" ] ||
  fail "silent prefill-2 got requests (${before:-0} -> $after)"
wait_router_state "$r_ADDR" prefill-2 READY 10
# (it may be a new registry entry: DEAD meanwhile, it registered again)
back=$(router_metric "$r_HTTP" 'epd_router_worker_requests_total{worker="prefill-2",pool="prefill"}')
router_client load "$r_HTTP" "$T/m" "$G" --clients 8 --requests 48 --prompts 2 --max-tokens 4 ||
  fail "requests after prefill-2 came back"
after2=$(router_metric "$r_HTTP" 'epd_router_worker_requests_total{worker="prefill-2",pool="prefill"}')
[ "${after2:-0}" -gt "${back:-0}" ] || fail "prefill-2 back but takes no requests"
finish_ok
