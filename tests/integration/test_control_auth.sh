#!/usr/bin/env bash
# The control plane of a cluster with a secret (--cluster-secret-file on the
# router and every worker; epd_rpc.h, "Authentication"):
#  - members register, heartbeat and are listed by `epd-ctl workers` given
#    the secret; a worker with the wrong secret file, or none, never is (its
#    RegisterWorker is refused UNAUTHENTICATED, it keeps trying) and never
#    says it is ready (no ready file, grpc.health.v1 NOT_SERVING, the reason
#    in its log);
#  - without the secret `epd-ctl` gets Health only: workers, status and
#    drain are refused (exit 1, a clear message), nothing drains;
#  - a stranger's RegisterWorker under a live worker's id with a new epoch
#    (which used to mark the real worker DEAD and take its traffic) is
#    refused and the worker stays READY under its own epoch;
#  - a captured RegisterWorker and a captured Drain, resent byte for byte
#    with their metadata, are refused as replays (the originals went
#    through); the Drain the router forwards to the worker is signed and
#    obeyed;
#  - the cluster serves a request through the router all along.
source "$(dirname "$0")/lib.sh"

( umask 077
  head -c 32 /dev/urandom | base64 >"$T/secret"
  head -c 32 /dev/urandom | base64 >"$T/wrong" )
S=(--cluster-secret-file "$T/secret")
unset EPD_CLUSTER_SECRET_FILE
CTL="$BIN/epd-ctl"
REPLAY="$ITEST/epd-itest-ctlreplay"

# state_of ROUTER WORKER: the worker's state in the router's Status (given the secret)
state_of() {
  "$CTL" status "$1" "${S[@]}" | awk -v w="worker=$2" '$1 == w { s = $0 } END { print s }' |
    tr ' ' '\n' | sed -n 's/^state=//p'
}
epoch_of() {
  "$CTL" status "$1" "${S[@]}" | awk -v w="worker=$2" '$1 == w { s = $0 } END { print s }' |
    tr ' ' '\n' | sed -n 's/^epoch=//p'
}
wait_state() {
  local addr=$1 worker=$2 want=$3 secs=${4:-20} got i
  for i in $(seq 1 $((secs * 10))); do
    got=$(state_of "$addr" "$worker")
    [ "$got" = "$want" ] && return 0
    sleep 0.1
  done
  "$CTL" status "$addr" "${S[@]}" >&2 || true
  fail "router at $addr: worker $worker is '$got', not $want after ${secs}s"
}
# complete HTTP: one completion through the router, HTTP 200 with text
complete() {
  local out code
  out=$(curl -s --max-time 60 -w '\n%{http_code}' "$r_HTTP/v1/completions" \
    -H 'Content-Type: application/json' \
    -d '{"model":"m","prompt":"The cluster keeps serving.","max_tokens":8,"temperature":0}') ||
    fail "curl to the router failed"
  code=$(tail -n 1 <<<"$out")
  [ "$code" = 200 ] && grep -q '"text":' <<<"$out" || fail "completion: HTTP $code: $out"
}

mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"
start_router r --model "$T/m" --heartbeat-ms 200 "${S[@]}"
start_daemon d decode --model "$T/m" --worker-id decode-0 --kv-blocks 256 --state-slots 16 \
  --router "$r_ADDR" "${S[@]}"
start_daemon e decode --model "$T/m" --worker-id decode-1 --kv-blocks 256 --state-slots 16 \
  --router "$r_ADDR" "${S[@]}"
start_daemon p prefill --model "$T/m" --worker-id prefill-0 --router "$r_ADDR" "${S[@]}"
wait_state "$r_ADDR" decode-0 READY
wait_state "$r_ADDR" decode-1 READY
wait_state "$r_ADDR" prefill-0 READY
complete

note "a worker with the wrong secret, and one with none, are never listed"
start_unjoined w decode --model "$T/m" --worker-id decode-wrong --kv-blocks 256 --state-slots 16 \
  --router "$r_ADDR" --cluster-secret-file "$T/wrong"
start_unjoined n decode --model "$T/m" --worker-id decode-none --kv-blocks 256 --state-slots 16 \
  --router "$r_ADDR"
for i in $(seq 1 100); do
  # both have tried at least twice (one try a second)
  [ "$(grep -c 'refused /epd.Control/RegisterWorker' "$T/r.log")" -ge 4 ] && break
  sleep 0.1
done
"$CTL" workers "$r_ADDR" "${S[@]}" >"$T/workers" || fail "epd-ctl workers with the secret"
grep -q '^decode pool: 2 READY' "$T/workers" || fail "decode pool: $(cat "$T/workers")"
! grep -q 'decode-wrong\|decode-none' "$T/workers" || fail "a stranger is listed: $(cat "$T/workers")"
! "$CTL" status "$r_ADDR" "${S[@]}" | grep -q 'decode-wrong\|decode-none' ||
  fail "a stranger is in the router's Status"
grep -q 'refused /epd.Control/RegisterWorker .*MAC does not verify' "$T/r.log" ||
  fail "the router did not log the wrong secret's refusal"
grep -q 'refused /epd.Control/RegisterWorker .*no x-epd-auth metadata' "$T/r.log" ||
  fail "the router did not log the missing secret's refusal"
grep -q 'registration with the router .* failed: authentication failed' "$T/w.log" ||
  fail "the wrong-secret worker does not say why it is not registered"
grep -q 'registration with the router .* failed: authentication failed' "$T/n.log" ||
  fail "the secret-less worker does not say why it is not registered"
note "neither is ready: no ready file, grpc.health.v1 NOT_SERVING, said once"
for x in w n; do
  [ ! -e "$T/$x.ready" ] || fail "worker $x, never accepted, wrote its ready file"
  a="${x}_ADDR"
  got=$(EPD_CLUSTER_SECRET_FILE= "$CTL" probe "${!a}" || true)
  [ "$got" = NOT_SERVING ] || fail "worker $x, never accepted, probes '$got'"
  [ "$(grep -c 'not ready until the router' "$T/$x.log")" = 1 ] ||
    fail "worker $x does not say once why it is not ready: $(grep -c 'not ready until' "$T/$x.log")"
done
[ "$(EPD_CLUSTER_SECRET_FILE= "$CTL" probe "$d_ADDR")" = SERVING ] || fail "a member's probe"

note "without the secret epd-ctl gets Health only"
"$CTL" health "$r_ADDR" >/dev/null || fail "Health without the secret"
"$CTL" health "$d_ADDR" >/dev/null || fail "a worker's Health without the secret"
for cmd in workers status; do
  rc=0
  "$CTL" "$cmd" "$r_ADDR" >"$T/out" 2>"$T/err" || rc=$?
  [ $rc = 1 ] || fail "epd-ctl $cmd without the secret: exit $rc"
  grep -q 'EPD_ERR_AUTH' "$T/err" && grep -q 'pass --cluster-secret-file' "$T/err" ||
    fail "epd-ctl $cmd without the secret: $(cat "$T/err")"
  [ ! -s "$T/out" ] || fail "epd-ctl $cmd without the secret printed: $(cat "$T/out")"
done
rc=0
"$CTL" drain "$r_ADDR" --worker-id decode-0 2>"$T/err" || rc=$?
[ $rc = 1 ] && grep -q 'EPD_ERR_AUTH' "$T/err" || fail "drain without the secret: exit $rc $(cat "$T/err")"
rc=0
"$CTL" drain "$d_ADDR" --worker-id decode-0 2>"$T/err" || rc=$?
[ $rc = 1 ] && grep -q 'EPD_ERR_AUTH' "$T/err" || fail "drain of the worker itself without the secret"
rc=0
"$CTL" drain "$r_ADDR" --worker-id decode-0 --cluster-secret-file "$T/wrong" 2>"$T/err" || rc=$?
[ $rc = 1 ] && grep -q 'refused this cluster secret' "$T/err" || fail "drain with the wrong secret"
[ "$(health_field "$d_ADDR" draining)" = 0 ] || fail "decode-0 drains after refused drains"
[ "$(state_of "$r_ADDR" decode-0)" = READY ] || fail "decode-0 is not READY after refused drains"

note "a stranger's new epoch under decode-0's id is refused"
epoch=$(epoch_of "$r_ADDR" decode-0)
[ -n "$epoch" ] || fail "no epoch for decode-0"
"$REPLAY" register "$r_ADDR" "$d_ADDR" --new-epoch >"$T/hijack" || fail "epd-itest-ctlreplay"
cat "$T/hijack"
grep -q '^first: EPD_ERR_AUTH' "$T/hijack" || fail "the stranger's RegisterWorker was not refused"
"$REPLAY" register "$r_ADDR" "$d_ADDR" --new-epoch --secret-file "$T/wrong" >"$T/hijack" ||
  fail "epd-itest-ctlreplay"
grep -q '^first: EPD_ERR_AUTH' "$T/hijack" || fail "RegisterWorker under the wrong secret"
sleep 0.5
[ "$(state_of "$r_ADDR" decode-0)" = READY ] || fail "decode-0 is not READY after the hijack"
[ "$(epoch_of "$r_ADDR" decode-0)" = "$epoch" ] || fail "decode-0's epoch changed"
! "$CTL" status "$r_ADDR" "${S[@]}" | grep -q 'worker=decode-0 .*state=DEAD' ||
  fail "an incarnation of decode-0 is DEAD"
complete

note "a captured RegisterWorker, replayed, is refused"
"$REPLAY" register "$r_ADDR" "$d_ADDR" --secret-file "$T/secret" >"$T/reg" || fail "epd-itest-ctlreplay"
cat "$T/reg"
grep -q '^sent: v1:[0-9]*:[0-9a-f]\{32\}:[0-9a-f]\{64\}$' "$T/reg" || fail "no metadata captured"
grep -q '^first: EPD_OK accepted=1' "$T/reg" || fail "the member's RegisterWorker was not accepted"
grep -q '^replay: EPD_ERR_AUTH .*replayed' "$T/reg" || fail "the replayed RegisterWorker was not refused"

note "a captured Drain, replayed, is refused; the original drained decode-1 (forwarded, signed)"
"$REPLAY" drain "$r_ADDR" decode-1 --secret-file "$T/secret" >"$T/drain" || fail "epd-itest-ctlreplay"
cat "$T/drain"
grep -q '^first: EPD_OK ok=1' "$T/drain" || fail "the member's Drain failed"
grep -q '^replay: EPD_ERR_AUTH .*replayed' "$T/drain" || fail "the replayed Drain was not refused"
wait_state "$r_ADDR" decode-1 DRAINING
for i in $(seq 1 300); do
  [ "$(health_field "$e_ADDR" draining)" = 1 ] && break
  sleep 0.1
done
[ "$(health_field "$e_ADDR" draining)" = 1 ] || fail "decode-1 did not get the router's Drain"
grep -q "worker 'decode-1' at .* is draining" "$T/r.log" || fail "the forwarded Drain failed"
[ "$(state_of "$r_ADDR" decode-0)" = READY ] || fail "decode-0 is not READY"

note "epd-ctl with the secret drains; the cluster still serves"
"$CTL" drain "$e_ADDR" --worker-id decode-1 "${S[@]}" >/dev/null || fail "drain with the secret"
complete
"$CTL" workers "$r_ADDR" "${S[@]}" >"$T/workers" || fail "epd-ctl workers with the secret"
grep -q '^decode pool: 1 READY, 1 DRAINING' "$T/workers" || fail "decode pool: $(cat "$T/workers")"
! grep -q 'decode-wrong\|decode-none' "$T/workers" || fail "a stranger is listed: $(cat "$T/workers")"
finish_ok
