#!/usr/bin/env bash
# A prompt that waits in a busy prefill worker's queue keeps its decode
# reservation (proto/README.md rule 9): the prefill worker sends the
# lease's keep-alive (LayerDone without `landed`) for every request whose
# reservation it holds, computing or still queued — before, only from
# its first posted layer on, so under load the requests at the back of
# the queue failed with 504 "prefill worker silent for the whole lease"
# (test_router_retry in a loaded sanitizer pass: 7 of 12).
#
# Sized by this machine, never timed: one request is measured first, the
# decode lease is set to twice that (at least 1 s), and 24 requests are
# queued at once, so the last waits 23 prefills: many leases.  Every answer must be 200 and
# equal epd-generate's.
source "$(dirname "$0")/lib.sh"

mkmodel "$T/m" --layers 6 --dim 256 --heads 8 --kv-heads 2 --layer-pattern LA --ffn 512 --vision 0 \
  --max-context 4096 --seed 3
prompt_of_len 1500 9 >"$T/long"
G="$BIN/epd-generate"

note "one request alone: how long a prefill takes here"
start_router r0 --model "$T/m" --heartbeat-ms 200
start_daemon d0 decode --model "$T/m" --worker-id decode-0 --kv-blocks 4096 --router "$r0_ADDR"
# one prompt for all: no prefix cache, each computes whole; the keep-alive goes out at the worker's tick (peer timeout / 8: 375 ms)
start_daemon p0 prefill --model "$T/m" --worker-id prefill-0 --no-prefix-cache \
  --router "$r0_ADDR"
for w in decode-0 prefill-0; do
  wait_router_state "$r0_ADDR" "$w" READY
done
# the prompt is letters, digits, spaces and .,; : JSON as it is
printf '{"model": "m", "prompt": "%s", "max_tokens": 1}' "$(cat "$T/long")" >"$T/one.json"
one_ms=0
for i in 1 2 3; do # the fastest of three
  t0=$(date +%s%N)
  code=$(curl -s --max-time 60 -o "$T/one.out" -w '%{http_code}' -H 'Content-Type: application/json' \
         --data-binary @"$T/one.json" "$r0_HTTP/v1/completions")
  t1=$(date +%s%N)
  [ "$code" = 200 ] || fail "one request: $code $(cat "$T/one.out")"
  ms=$(( (t1 - t0) / 1000000 ))
  one_ms=$(( one_ms == 0 || ms < one_ms ? ms : one_ms ))
done
lease=$(( one_ms * 2 > 1000 ? one_ms * 2 : 1000 ))
count=24 # the last waits 23 prefills: many leases
echo "one request: ${one_ms} ms; decode lease ${lease} ms; ${count} queued at once"
stop_daemon d0 TERM
stop_daemon p0 TERM
stop_daemon r0 TERM

note "$count requests queued on one prefill worker, decode lease $lease ms"
start_router r --model "$T/m" --heartbeat-ms 200
start_daemon d1 decode --model "$T/m" --worker-id decode-1 --kv-blocks 4096 --lease-ms "$lease" \
  --router "$r_ADDR"
start_daemon p1 prefill --model "$T/m" --worker-id prefill-1 --no-prefix-cache \
  --router "$r_ADDR"
for w in decode-1 prefill-1; do
  wait_router_state "$r_ADDR" "$w" READY
done
router_client multi "$r_HTTP" "$T/m" "$G" --count "$count" --prompt-file "$T/long" \
  --max-tokens 2 >"$T/multi.out" 2>"$T/multi.err" || fail "clients: $(cat "$T/multi.err")"
sort "$T/multi.out" | uniq -c
[ "$(grep -c '^ok$' "$T/multi.out")" = "$count" ] || fail "a queued request lost its reservation"
grep -q 'silent for the whole lease' "$T/d1.log" && fail "decode failed a lease"
wait_blocks_free "$d1_ADDR"
# prefill first: once decode-1 is gone first, prefill-1 (ASan, beside two
# CPU hogs) once did not finish its drain within stop_daemon's 10 s (exit
# 137 after "decode worker 'decode-1' is unreachable: failing its
# requests"; reported, not understood yet) — not what this test is about
stop_daemon p1 TERM
[ "$STOP_RC" = 0 ] || fail "prefill-1 exited $STOP_RC on SIGTERM"
finish_ok
