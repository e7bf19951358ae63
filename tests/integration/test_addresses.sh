#!/usr/bin/env bash
# Bind, advertise and data addresses, and the health an orchestrator sees,
# on one host (the cluster across hosts: tests/multihost/):
#  - refused at start, with the reason: a wildcard control bind without
#    --advertise-addr, a wildcard advertised or data address, a data
#    address that is not this host's, --advertise-addr HOST:PORT, and
#    without a cluster secret any address that is not loopback;
#  - with a secret: 0.0.0.0 / [::] bound, 127.0.0.1 / ::1 / a name
#    advertised — the ready line, Health and the router's registry say the
#    advertised (numeric) address;
#  - grpc.health.v1 Check SERVING without the secret, NOT_SERVING while a
#    worker drains, unknown services NOT_FOUND;
#  - the router's /ready: 503 without a READY prefill worker (and says
#    why), 200 with a prefill and a decode worker (a vision model, but
#    --ready-without-encoder); SIGTERM drains the router: a running
#    stream finishes, new requests and /ready get 503, then exit 0;
#  - --drain-grace-ms 0: SIGTERM stops at once.
source "$(dirname "$0")/lib.sh"

(umask 077 && head -c 32 /dev/urandom >"$T/secret")
S=(--cluster-secret-file "$T/secret")
export EPD_CLUSTER_SECRET_FILE="$T/secret"
mkmodel "$T/m" "${TINY_VISION_FLAGS[@]}" # greedy "Going away." runs 2,000 tokens

# refused NAME WHY FLAGS...: the prefill daemon must exit 1 at start, its log naming WHY
refused() {
  local name=$1 why=$2
  shift 2
  local rc=0
  timeout 30 "$BIN/epd-prefill" --model "$T/m" "$@" >"$T/$name.log" 2>&1 || rc=$?
  [ $rc = 1 ] || fail "$name: exit $rc, want 1 ($(tail -n 3 "$T/$name.log"))"
  grep -q -- "$why" "$T/$name.log" || fail "$name: the log does not say '$why': $(tail -n 3 "$T/$name.log")"
}

note "refused at start"
refused wild "give --advertise-addr" --control-addr 0.0.0.0:0 "${S[@]}"
refused wild6 "give --advertise-addr" --control-addr '[::]:0' "${S[@]}"
refused advwild "is a wildcard" --advertise-addr 0.0.0.0 "${S[@]}"
refused datawild "is a wildcard" --data-addr :: "${S[@]}"
refused datafar "not an address of this host" --data-addr 192.0.2.254 "${S[@]}"
refused advfar "not an address of this host" --advertise-addr 192.0.2.254 "${S[@]}"
refused port "not HOST:PORT" --advertise-addr 127.0.0.1:7000 "${S[@]}"
refused nosecret "without --cluster-secret-file" --control-addr 0.0.0.0:0 --advertise-addr 127.0.0.1
refused nosecret2 "without --cluster-secret-file" --advertise-addr 192.0.2.254 --data-addr 127.0.0.1

note "wildcard binds, advertised addresses (IPv4, IPv6, a name)"
start_router r --model "$T/m" --control-addr 0.0.0.0:0 --advertise-addr 127.0.0.1 "${S[@]}" \
  --ready-without-encoder
[[ $r_ADDR == 127.0.0.1:* ]] || fail "router advertises $r_ADDR"
grep -q 'control bound on 0.0.0.0:0, advertised as 127.0.0.1' "$T/r.log" || fail "router log"
start_daemon d decode --model "$T/m" --worker-id decode-0 --router "$r_ADDR" \
  --control-addr '[::]:0' --advertise-addr ::1 --data-addr 127.0.0.1 "${S[@]}"
[[ $d_ADDR == \[::1\]:* ]] || fail "decode advertises $d_ADDR"
start_daemon p prefill --model "$T/m" --worker-id prefill-0 --router "$r_ADDR" \
  --control-addr 0.0.0.0:0 --advertise-addr localhost "${S[@]}"
[[ $p_ADDR == 127.0.0.1:* || $p_ADDR == \[::1\]:* ]] || fail "prefill advertises $p_ADDR (a name)"
wait_router_state "$r_ADDR" decode-0 READY
wait_router_state "$r_ADDR" prefill-0 READY
"$BIN/epd-ctl" health "$d_ADDR" | grep -qxF "control_address=$d_ADDR" || fail "Health of decode"
"$BIN/epd-ctl" health "$d_ADDR" | grep -qxF "data_address=127.0.0.1" || fail "Health of decode (data)"
"$BIN/epd-ctl" status "$r_ADDR" | grep "worker=decode-0 " | grep -qF "control_address=$d_ADDR" ||
  fail "the router's registry: $("$BIN/epd-ctl" status "$r_ADDR")"
"$BIN/epd-ctl" workers "$r_ADDR" >"$T/workers"
grep -Eq "^  decode-0 .* \[::1\]:[0-9]+ +(shm|tcp) " "$T/workers" || fail "workers: $(cat "$T/workers")"

note "grpc.health.v1 Check"
for a in "$r_ADDR" "$d_ADDR" "$p_ADDR"; do
  [ "$(EPD_CLUSTER_SECRET_FILE= "$BIN/epd-ctl" probe "$a")" = SERVING ] || fail "probe $a"
done
[ "$("$BIN/epd-ctl" probe "$r_ADDR" --service router)" = SERVING ] || fail "probe --service router"
rc=0
"$BIN/epd-ctl" probe "$d_ADDR" --service nope >"$T/probe" 2>&1 || rc=$?
[ $rc = 1 ] && grep -q NOT_FOUND "$T/probe" || fail "unknown service: $(cat "$T/probe")"

note "/ready"
router_client raw "$r_HTTP" GET /ready >"$T/ready"
[ "$(head -n 1 "$T/ready")" = 200 ] && grep -q '"ready":true' "$T/ready" || fail "/ready: $(cat "$T/ready")"
"$BIN/epd-ctl" drain "$r_ADDR" --worker-id prefill-0 >/dev/null || fail "drain prefill-0"
router_client raw "$r_HTTP" GET /ready >"$T/ready"
[ "$(head -n 1 "$T/ready")" = 503 ] && grep -q 'no READY prefill worker' "$T/ready" ||
  fail "/ready with prefill-0 draining: $(cat "$T/ready")"
for i in $(seq 1 50); do
  [ "$(EPD_CLUSTER_SECRET_FILE= "$BIN/epd-ctl" probe "$p_ADDR" || true)" = NOT_SERVING ] && break
  sleep 0.1
done
[ "$(EPD_CLUSTER_SECRET_FILE= "$BIN/epd-ctl" probe "$p_ADDR" || true)" = NOT_SERVING ] ||
  fail "a draining worker's probe still says SERVING"
start_daemon p2 prefill --model "$T/m" --worker-id prefill-1 --router "$r_ADDR" "${S[@]}"
wait_router_state "$r_ADDR" prefill-1 READY
router_client raw "$r_HTTP" GET /ready >"$T/ready"
[ "$(head -n 1 "$T/ready")" = 200 ] || fail "/ready with prefill-1: $(cat "$T/ready")"

note "SIGTERM drains the router: the running stream finishes, new requests get 503"
printf 'Going away.' >"$T/long"
router_client multi "$r_HTTP" "$T/m" "$BIN/epd-generate" --count 1 --prompt-file "$T/long" \
  --max-tokens 1800 >"$T/multi.out" 2>"$T/multi.err" &
mpid=$!
PIDS+=("$mpid")
one_in_flight() { [ "$(router_metric "$r_HTTP" epd_router_requests_in_flight)" = 1 ]; }
wait_while_running "$mpid" 180 one_in_flight || fail "the stream never started"
kill -TERM "$r_PID"
for i in $(seq 1 50); do
  router_client raw "$r_HTTP" GET /ready >"$T/ready" 2>/dev/null || true
  [ "$(head -n 1 "$T/ready")" = 503 ] && break
  sleep 0.05
done
if [ "$(head -n 1 "$T/ready")" = 503 ]; then
  grep -q draining "$T/ready" || fail "/ready of a draining router: $(cat "$T/ready")"
  router_client raw "$r_HTTP" POST /v1/completions '{"model":"m","prompt":"x","max_tokens":2}' \
    >"$T/new" 2>/dev/null || true
  # 503 while the router drains; no answer only when the stream finished
  # in between and the router, drained, has exited (then there is no one
  # to answer: the drain is over)
  if [ "$(head -n 1 "$T/new")" != 503 ]; then
    sleep 0.5
    kill -0 "$r_PID" 2>/dev/null &&
      fail "a new request while the router drains: $(head -c 300 "$T/new")"
    grep -q 'drained: nothing left running' "$T/r.log" ||
      fail "no answer to a new request, and the router did not drain: $(head -c 300 "$T/new")"
    echo "note: the stream ended and the router exited before the new request"
  fi
else
  echo "note: the stream ended before the drain could be seen"
fi
wait "$mpid" || fail "the stream: $(cat "$T/multi.err")"
[ "$(cat "$T/multi.out")" = ok ] || fail "the stream during the router's drain: $(cat "$T/multi.out")"
for i in $(seq 1 300); do
  kill -0 "$r_PID" 2>/dev/null || break
  sleep 0.1
done
stop_daemon r TERM
[ "$STOP_RC" = 0 ] || fail "router exited $STOP_RC after its drain"
grep -q 'drained: nothing left running' "$T/r.log" || fail "the router did not drain"

note "--drain-grace-ms 0: SIGTERM stops at once"
start_daemon q decode --model "$T/m" --drain-grace-ms 0 "${S[@]}"
stop_daemon q TERM
[ "$STOP_RC" = 0 ] || fail "exit $STOP_RC"
grep -q 'SIGTERM: draining' "$T/q.log" && fail "drained with --drain-grace-ms 0"
finish_ok
