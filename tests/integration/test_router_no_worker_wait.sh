#!/usr/bin/env bash
# Faults cost latency, not errors (#29, --no-worker-wait-ms): a request
# that finds no usable prefill/decode pair waits in the router's queue for
# one instead of a 503 at once.
#  - the only prefill worker SIGSTOPped (SUSPECT at the router): a request
#    sent meanwhile waits (epd_router_no_worker_waits_total), and once the
#    worker is resumed it is answered 200 with epd-generate's text and an
#    epd-no-worker-wait-ms header;
#  - the only prefill worker killed: a request sent meanwhile waits, and is
#    answered 200 once a new prefill-0 registered;
#  - a router whose prefill worker is gone past --no-worker-wait-ms (1 s):
#    503 with Retry-After, after waiting at least that long (its header).
source "$(dirname "$0")/lib.sh"

mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"
G="$BIN/epd-generate"
start_router r --model "$T/m" --heartbeat-ms 100 --dead-after-ms 500 --no-worker-wait-ms 60000
start_daemon d decode --model "$T/m" --worker-id decode-0 --kv-blocks 512 --state-slots 32 \
  --router "$r_ADDR"
start_daemon p prefill --model "$T/m" --worker-id prefill-0 --router "$r_ADDR"
wait_router_state "$r_ADDR" decode-0 READY
wait_router_state "$r_ADDR" prefill-0 READY
H=$r_HTTP
printf 'A request that waits for its worker.' >"$T/prompt"
want=$("$G" --model "$T/m" --prompt "$(cat "$T/prompt")" --max-tokens 12 --temperature 0)

# send_one TAG: a non-streaming completion in the background, headers in
# $T/TAG.h, body in $T/TAG.b, curl's status line in $T/TAG.code
send_one() {
  curl -s -D "$T/$1.h" -o "$T/$1.b" -w '%{http_code}' --max-time 120 "$2/v1/completions" \
    -H 'Content-Type: application/json' \
    -d "{\"model\":\"m\",\"prompt\":\"$(cat "$T/prompt")\",\"max_tokens\":12,\"temperature\":0}" \
    >"$T/$1.code" &
  SENT_PID=$!
}

# wait_waits URL N: until epd_router_no_worker_waits_total reaches N
wait_waits() {
  local i n
  for i in $(seq 1 300); do
    n=$(router_metric "$1" epd_router_no_worker_waits_total)
    [ "${n:-0}" -ge "$2" ] && return 0
    sleep 0.1
  done
  fail "no request waited for a worker at $1 (epd_router_no_worker_waits_total ${n:-none})"
}

# served TAG: the background request was answered 200 with epd-generate's
# text and says it waited
served() {
  wait "$SENT_PID" || fail "$1: curl failed"
  [ "$(cat "$T/$1.code")" = 200 ] || fail "$1: HTTP $(cat "$T/$1.code"): $(cat "$T/$1.b")"
  got=$("$PYTHON3" -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"], end="")' "$T/$1.b")
  [ "$got" = "$want" ] || fail "$1: text '$got', epd-generate's '$want'"
  grep -qi '^epd-no-worker-wait-ms: [0-9]' "$T/$1.h" ||
    fail "$1: no epd-no-worker-wait-ms header: $(cat "$T/$1.h")"
  note "$1: 200 after waiting $(sed -n 's/^epd-no-worker-wait-ms: \([0-9]*\).*/\1/Ip' "$T/$1.h") ms"
}

note "the only prefill worker stopped: a request waits, and is served once it resumes"
kill -STOP "$p_PID"
wait_router_state "$r_ADDR" prefill-0 SUSPECT 20
send_one stopped "$H"
wait_waits "$H" 1
kill -CONT "$p_PID"
served stopped

note "the only prefill worker killed: a request waits, and is served by its restart"
stop_daemon p KILL
send_one killed "$H"
wait_waits "$H" 2
start_daemon p2 prefill --model "$T/m" --worker-id prefill-0 --router "$r_ADDR"
served killed
wait_blocks_free "$d_ADDR"

note "no prefill worker within --no-worker-wait-ms (1 s): 503 with Retry-After"
start_router r1 --model "$T/m" --heartbeat-ms 100 --dead-after-ms 500 --no-worker-wait-ms 1000
start_daemon d1 decode --model "$T/m" --worker-id decode-1 --kv-blocks 512 --state-slots 32 \
  --router "$r1_ADDR"
wait_router_state "$r1_ADDR" decode-1 READY
send_one gone "$r1_HTTP"
wait "$SENT_PID" || fail "gone: curl failed"
[ "$(cat "$T/gone.code")" = 503 ] || fail "gone: HTTP $(cat "$T/gone.code"), not 503"
grep -qi '^Retry-After: [0-9]' "$T/gone.h" || fail "gone: no Retry-After: $(cat "$T/gone.h")"
waited=$(sed -n 's/^epd-no-worker-wait-ms: \([0-9]*\).*/\1/Ip' "$T/gone.h")
# the router's own count of the wait: never answered before its bound
[ -n "$waited" ] && [ "$waited" -ge 1000 ] ||
  fail "gone: answered after waiting '${waited}' ms, not the 1000 ms bound"
n=$(router_metric "$r1_HTTP" epd_router_no_worker_timeouts_total)
[ "${n:-0}" = 1 ] || fail "epd_router_no_worker_timeouts_total is '${n}', not 1"
note "gone: 503 after $waited ms, $(grep -i '^Retry-After' "$T/gone.h" | tr -d '\r')"
finish_ok
