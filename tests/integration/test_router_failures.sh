#!/usr/bin/env bash
# Failures through the router (2 prefill + 2 decode, registered with --router):
#  - every bad input gets its OpenAI error JSON and 4xx, and the router stays
#    healthy;
#  - a stop string ends the answer before it (finish_reason "stop");
#  - drain through the router (epd-ctl drain ROUTER --worker-id ID): DRAINING
#    in the registry, forwarded to the worker, no new requests go to it, the
#    rest keep being served;
#  - a client that disconnects mid-stream aborts its request on both workers;
#  - a decode worker killed mid-stream: its streams migrate (proto/README.md
#    rule 37) — they go on from the other decode worker where they stopped
#    and every one of the 8 (greedy and seeded) finishes equal to
#    epd-generate; new requests
#    succeed; the dead worker leaves READY;
#  - the killed worker restarted under the same id registers under its new
#    epoch (the old incarnation stays listed, DEAD) and takes traffic;
#  - a decode worker whose pool cannot hold the requests gets none of them:
#    the router checks every decode worker's blocks before it sends (all
#    succeed on the others, none is refused and retried);
#  - a worker drained through its own Drain RPC (epd-ctl drain WORKER) is
#    DRAINING in the registry after its next heartbeat and gets no request;
#    with every prefill worker draining a request gets 503.
source "$(dirname "$0")/lib.sh"

# slow enough per decode step that 1200-token streams are still running when
# the kill comes
mkmodel "$T/m" --layers 6 --dim 256 --heads 8 --kv-heads 2 --layer-pattern LA --ffn 512 --vision 0 \
  --max-context 4096 --seed 3
start_router r --model "$T/m" --heartbeat-ms 200 --dead-after-ms 1000 --max-body-bytes $((4 << 20))
for i in 0 1; do
  start_daemon "d$i" decode --model "$T/m" --worker-id "decode-$i" --kv-blocks 1024 \
    --state-slots 32 --router "$r_ADDR"
  start_daemon "p$i" prefill --model "$T/m" --worker-id "prefill-$i" --router "$r_ADDR"
done
for w in decode-0 decode-1 prefill-0 prefill-1; do
  wait_router_state "$r_ADDR" "$w" READY
done
G="$BIN/epd-generate"
H=$r_HTTP

note "bad inputs: 4xx with an OpenAI error, the router stays healthy"
head -c $((5 * 1024 * 1024)) /dev/zero | tr '\0' a >"$T/big"
prompt_of_len 5000 2 >"$T/toolong"
check_bad() { # STATUS METHOD PATH [BODY]
  local want=$1
  shift
  router_client raw "$H" "$@" >"$T/bad.out" || fail "client failed on $*"
  local got
  got=$(head -n 1 "$T/bad.out")
  [ "$got" = "$want" ] || fail "$1 $2 ${3:0:60}: HTTP $got, want $want: $(tail -n +2 "$T/bad.out" | head -c 300)"
  if [ "$want" != 413 ]; then
    grep -q '"error":{"message":' "$T/bad.out" || fail "$* : no OpenAI error JSON: $(cat "$T/bad.out")"
  fi
}
check_bad 400 POST /v1/completions '{'
check_bad 400 POST /v1/completions '[1,2]'
check_bad 404 POST /v1/completions '{"model":"nope","prompt":"x"}'
check_bad 400 POST /v1/completions '{"model":"m"}'
check_bad 400 POST /v1/completions '{"model":"m","prompt":"x","max_tokens":0}'
check_bad 400 POST /v1/completions '{"model":"m","prompt":"x","max_tokens":100000}'
check_bad 400 POST /v1/completions '{"model":"m","prompt":"x","temperature":5}'
check_bad 400 POST /v1/completions '{"model":"m","prompt":"x","top_p":0}'
check_bad 400 POST /v1/completions '{"model":"m","prompt":"x","n":17}'
check_bad 400 POST /v1/completions '{"model":"m","prompt":"x","stream":"yes"}'
check_bad 400 POST /v1/completions "{\"model\":\"m\",\"prompt\":\"$(cat "$T/toolong")\"}"
check_bad 400 POST /v1/chat/completions '{"model":"m","messages":[]}'
check_bad 400 POST /v1/chat/completions '{"model":"m","messages":[{"role":"robot","content":"x"}]}'
check_bad 400 POST /v1/chat/completions '{"model":"m","messages":[{"role":"user"}]}'
check_bad 405 GET /v1/completions
check_bad 405 POST /v1/models '{}'
check_bad 404 GET /v2/nothing
check_bad 413 POST /v1/completions "@$T/big"
router_client raw "$H" GET /health >"$T/health" || fail "/health after bad inputs"
[ "$(head -n 1 "$T/health")" = 200 ] || fail "/health after bad inputs: $(cat "$T/health")"
bad=$(router_metric "$H" 'epd_router_errors_total{kind="bad_request"}')
[ "$bad" -ge 16 ] || fail "errors_total{kind=bad_request}=$bad"
printf 'After the bad inputs.' >"$T/short"
router_client same "$H" "$T/m" "$G" --prompt-file "$T/short" --max-tokens 8 --temperature 0 \
  --all-kinds >/dev/null || fail "a good request after the bad ones"

note "stop strings"
router_client stop "$H" "$T/m" "$G" --prompt-file "$T/short" --max-tokens 64 || fail "stop string"

note "drain prefill-1 through the router"
"$BIN/epd-ctl" drain "$r_ADDR" --worker-id prefill-1 >/dev/null || fail "drain through the router"
! "$BIN/epd-ctl" drain "$r_ADDR" --worker-id nobody 2>/dev/null || fail "drain of an unknown worker"
wait_router_state "$r_ADDR" prefill-1 DRAINING 5
for i in $(seq 1 50); do
  [ "$(health_field "$p1_ADDR" draining)" = 1 ] && break
  sleep 0.1
done
[ "$(health_field "$p1_ADDR" draining)" = 1 ] || fail "the drain did not reach prefill-1"
before=$(router_metric "$H" 'epd_router_worker_requests_total{worker="prefill-1",pool="prefill"}')
router_client load "$H" "$T/m" "$G" --clients 8 --requests 32 --prompts 2 --max-tokens 6 ||
  fail "requests while prefill-1 drains"
after=$(router_metric "$H" 'epd_router_worker_requests_total{worker="prefill-1",pool="prefill"}')
[ "$before" = "$after" ] || fail "drained prefill-1 got requests ($before -> $after)"

note "a client that disconnects mid-stream aborts its request on both workers"
gone0=$(router_metric "$H" 'epd_router_errors_total{kind="client_gone"}')
rc=0
curl -sN --max-time 1 "$H/v1/completions" -o "$T/gone.out" \
  -d '{"model":"m","prompt":"Going away.","max_tokens":3000,"stream":true,"temperature":0}' || rc=$?
[ $rc = 28 ] || fail "the 3000-token stream ended before the client left (curl exit $rc)"
grep -q '^data: {' "$T/gone.out" || fail "no token streamed before the client left"
# 3000 tokens take several seconds; the abort frees the blocks at once
wait_blocks_free "$d0_ADDR" 3
wait_blocks_free "$d1_ADDR" 3
gone1=$(router_metric "$H" 'epd_router_errors_total{kind="client_gone"}')
[ "$gone1" -gt "$gone0" ] || fail "client_gone not counted ($gone0 -> $gone1)"
[ "$(router_metric "$H" epd_router_requests_in_flight)" = 0 ] || fail "the request stayed in flight"

note "decode-0 killed mid-stream: its streams migrate"
ttft0=$(router_metric "$H" epd_router_ttft_seconds_count)
mig0=$(router_metric "$H" epd_router_migrations_total)
router_client multi "$H" "$T/m" "$G" --count 8 --prompt-file "$T/short" --max-tokens 1200 --mixed \
  >"$T/multi.out" 2>"$T/multi.err" &
mpid=$!
PIDS+=("$mpid")
# every stream has its first token out (so none is a plain retry) and
# decode-0 runs some of them
d0_running() {
  n=$(router_metric "$H" 'epd_router_worker_in_flight{worker="decode-0",pool="decode"}')
  started=$(($(router_metric "$H" epd_router_ttft_seconds_count) - ttft0))
  [ "${n:-0}" -ge 2 ] && [ "$started" -ge 8 ]
}
wait_while_running "$mpid" 180 d0_running ||
  fail "decode-0 never had 2 of 8 started streams (in flight ${n:-0}, started $started)"
d0_epoch=$("$BIN/epd-ctl" status "$r_ADDR" | awk '$1 == "worker=decode-0"' | tr ' ' '\n' |
  sed -n 's/^epoch=//p' | head -n 1)
[ -n "$d0_epoch" ] || fail "no epoch for decode-0 in the router's Status"
stop_daemon d0 KILL
wait "$mpid" || fail "the streaming clients failed: $(cat "$T/multi.err")"
cat "$T/multi.out"
n_ok=$(grep -c '^ok$' "$T/multi.out" || true)
[ "$n_ok" = 8 ] || fail "streams not ok (each equal to epd-generate) after the kill: $(cat "$T/multi.out")"
mig1=$(router_metric "$H" epd_router_migrations_total)
note "$((mig1 - mig0)) streams migrated"
# (at least one: the streams on decode-0 when polled may not all be running
# when the kill comes)
[ $((mig1 - mig0)) -ge 1 ] || fail "decode-0 ran $n streams but the router migrated none"
grep -q "migrating, the stream goes on from token" "$T/r.log" ||
  fail "no migration in the router's log"
router_client load "$H" "$T/m" "$G" --clients 8 --requests 32 --prompts 2 --max-tokens 6 ||
  fail "new requests after the kill"
st=$(router_state "$r_ADDR" decode-0)
# DEAD or SUSPECT; or already forgotten (the registry drops a DEAD worker
# 30 s after its death: the load above took that long under ASan)
[ "$st" = DEAD ] || [ "$st" = SUSPECT ] || [ -z "$st" ] ||
  fail "killed decode-0 is $st in the router"

note "decode-0 restarted: registers under its new epoch and takes traffic"
start_daemon d0b decode --model "$T/m" --worker-id decode-0 --kv-blocks 1024 --state-slots 32 \
  --router "$r_ADDR"
wait_router_state "$r_ADDR" decode-0 READY 5
router_client load "$H" "$T/m" "$G" --clients 4 --requests 16 --prompts 2 --max-tokens 6 ||
  fail "requests after decode-0 restarted"
n=$(router_metric "$H" 'epd_router_worker_requests_total{worker="decode-0",pool="decode"}')
[ "${n:-0}" -gt 0 ] || fail "restarted decode-0 takes no requests"
# the new incarnation is the only READY decode-0, under another epoch than
# the killed one; the old one is DEAD until the registry forgets it (30 s
# after its death: on a loaded machine that may already have happened)
"$BIN/epd-ctl" status "$r_ADDR" >"$T/st.out"
awk '$1 == "worker=decode-0"' "$T/st.out" >"$T/d0.lines"
[ "$(grep -c 'state=READY' "$T/d0.lines")" = 1 ] ||
  fail "Status should list exactly one READY decode-0: $(cat "$T/st.out")"
! grep -v 'state=READY' "$T/d0.lines" | grep -qv 'state=DEAD' ||
  fail "the killed decode-0 is neither DEAD nor forgotten: $(cat "$T/st.out")"
new_epoch=$(grep 'state=READY' "$T/d0.lines" | tr ' ' '\n' | sed -n 's/^epoch=//p')
[ -n "$new_epoch" ] && [ "$new_epoch" != "$d0_epoch" ] ||
  fail "decode-0 READY under its old epoch $d0_epoch: $(cat "$T/st.out")"

note "a decode worker whose pool cannot hold the requests: never chosen"
start_daemon d3 decode --model "$T/m" --worker-id decode-3 --kv-blocks 8 --state-slots 8 \
  --router "$r_ADDR"
wait_router_state "$r_ADDR" decode-3 READY 5
r0=$(router_metric "$H" epd_router_capacity_retries_total)
router_client load "$H" "$T/m" "$G" --clients 4 --requests 16 --prompts 2 --max-tokens 200 ||
  fail "requests with a decode worker too small for them"
r1=$(router_metric "$H" epd_router_capacity_retries_total)
[ "$r1" = "$r0" ] || fail "requests refused for room and retried ($r0 -> $r1)"
n=$(router_metric "$H" 'epd_router_worker_requests_total{worker="decode-3",pool="decode"}')
[ "${n:-0}" = 0 ] || fail "decode-3 (8 blocks) got $n requests of 200 tokens"
wait_blocks_free "$d0b_ADDR"
wait_blocks_free "$d1_ADDR"
wait_blocks_free "$d3_ADDR"

note "drain prefill-0 through its own Drain RPC: the router sees it in a heartbeat"
"$BIN/epd-ctl" drain "$p0_ADDR" --worker-id prefill-0 >/dev/null || fail "drain of prefill-0 itself"
wait_router_state "$r_ADDR" prefill-0 DRAINING 5
before0=$(router_metric "$H" 'epd_router_worker_requests_total{worker="prefill-0",pool="prefill"}')
# both prefill workers drain: nothing can take a prompt now
code=$(curl -s -o "$T/nop.out" -w '%{http_code}' --max-time 10 "$H/v1/completions" \
  -d '{"model":"m","prompt":"Nobody prefills this.","max_tokens":4}')
[ "$code" = 503 ] || fail "with every prefill worker draining: HTTP $code $(cat "$T/nop.out")"
after0=$(router_metric "$H" 'epd_router_worker_requests_total{worker="prefill-0",pool="prefill"}')
[ "$before0" = "$after0" ] || fail "self-drained prefill-0 got requests ($before0 -> $after0)"
finish_ok
