#!/usr/bin/env bash
# A cluster across six hosts (tests/multihost/lib.sh) over TRANSPORT
# (ucx-tcp or ofi-tcp), every member with the cluster secret, control ports
# bound on the wildcard and advertised as the host's address:
#   - the router's /ready is 200 (prefill, decode and, the model having
#     vision, an encoder READY); every control port answers the standard
#     grpc.health.v1 Check SERVING, without the secret too;
#   - `epd-ctl workers` shows every worker at its host's address and tcp
#     links (the router's to it, its own to its peers);
#   - answers equal epd-generate's: every API kind, 24 requests from 6
#     concurrent clients over both prefill and both decode workers, and
#     chat requests with images encoded on the encoder's host;
#   - SIGTERM drains a decode worker: its stream finishes (equal), the
#     worker says NOT_SERVING meanwhile, then exits 0; the cluster serves on.
set -euo pipefail
conf=${1:?usage: mh_equal.sh ucx-tcp|ofi-tcp}
case "$conf" in
ucx-tcp) tr=ucx ;;
ofi-tcp) tr=ofi ;;
*) echo "unknown configuration $conf" >&2; exit 2 ;;
esac
. "$(dirname "$0")/lib.sh"

note "six hosts, $conf"
mh_cluster "$tr"
G="$BIN/epd-generate"

note "/ready, grpc.health.v1 Check on every control port"
mh_curl r "$r_HTTP/ready" | grep -q '"ready":true' || fail "/ready: $(mh_curl r "$r_HTTP/ready")"
for w in r e1 p1 p2 d1 d2; do
  a="${w}_ADDR"
  [ "$(mh_ctl r probe "${!a}")" = SERVING ] || fail "probe $w at ${!a}"
  # a kubelet has no secret: the probe needs none, Status does
  [ "$(EPD_CLUSTER_SECRET_FILE= mh_ctl r probe "${!a}")" = SERVING ] || fail "probe $w unsigned"
done
if EPD_CLUSTER_SECRET_FILE= mh_ctl r status "$p1_ADDR" >/dev/null 2>&1; then
  fail "Status answered without the cluster secret"
fi
mh_ctl r probe "$p1_ADDR" --service prefill >/dev/null || fail "probe --service prefill"
if mh_ctl r probe "$p1_ADDR" --service decode >/dev/null 2>&1; then
  fail "a prefill worker answered for the service 'decode'"
fi

note "answers equal epd-generate's"
printf 'Across the hosts: the KV cache moves from one namespace to another.' >"$T/p1"
mh_client r same "$r_HTTP" "$T/m" "$G" --prompt-file "$T/p1" --max-tokens 24 --all-kinds \
  --temperature 0.7 --seed 5 || fail "every API kind"
mh_client r load "$r_HTTP" "$T/m" "$G" --clients 6 --requests 24 --prompts 4 --max-tokens 12 ||
  fail "24 requests from 6 clients"
"$B/itest/epd-itest-image" png "$T/i1.png" 32 32 3 || fail "epd-itest-image"
"$B/itest/epd-itest-image" jpeg "$T/i2.jpg" 40 24 4 || fail "epd-itest-image"
mh_client r images "$r_HTTP" "$T/m" "$G" --images "$T/i1.png,$T/i2.jpg" \
  --text "Two hosts <|image|> and <|image|>?" --max-tokens 12 --temperature 0 ||
  fail "chat with two images"
enc=$(mh_metric r "$r_HTTP" epd_router_images_encoded_total)
[ "${enc:-0}" -ge 2 ] || fail "the encoder on e1 encoded ${enc:-0} images"
for wp in prefill-1:prefill prefill-2:prefill decode-1:decode decode-2:decode; do
  n=$(mh_metric r "$r_HTTP" "epd_router_worker_requests_total{worker=\"${wp%%:*}\",pool=\"${wp##*:}\"}")
  [ "${n:-0}" -ge 1 ] || fail "${wp%%:*} served no request"
done

note "epd-ctl workers: addresses and what each link uses"
# PEER_LINKS is what a worker's last heartbeat said (one every 500 ms, of
# a load snapshot up to 100 ms old): a prefill worker's links to decode
# opened with the requests above may be newer than that.  On a fast
# machine they were, every time ("no prefill worker reports tcp links",
# 4 of 4 runs on an idle machine, issue #30): wait for a heartbeat that
# carries them, bounded.
for i in $(seq 1 100); do
  mh_ctl r workers "$r_ADDR" >"$T/workers" || fail "epd-ctl workers"
  grep -Eq '^  prefill-[12] .* tcp +tcp=[0-9]+' "$T/workers" && break
  sleep 0.1
done
cat "$T/workers"
for w in p1 p2 d1 d2 e1; do
  ipv="${w}_IP"
  grep -Eq " ${!ipv//./\\.}:[0-9]+ +tcp " "$T/workers" || fail "workers: $w not at ${!ipv} over tcp"
done
grep -Eq '^  prefill-[12] .* tcp +tcp=[0-9]+' "$T/workers" ||
  fail "no prefill worker reports tcp links to its decode peers after 10 s of heartbeats"
mh_ctl r health "$d1_ADDR" | grep -qx "data_address=$d1_IP" || fail "Health of d1: data_address"
mh_ctl r health "$d1_ADDR" | grep -qx "control_address=$d1_ADDR" ||
  fail "Health of d1: control_address"

note "SIGTERM drains decode-2: its running stream finishes, then it exits 0"
printf 'Going away.' >"$T/long"
mh_client r multi "$r_HTTP" "$T/m" "$G" --count 4 --prompt-file "$T/long" --max-tokens 1500 \
  >"$T/multi.out" 2>"$T/multi.err" &
mpid=$!
PIDS+=("$mpid")
for i in $(seq 1 300); do
  n=$(mh_metric r "$r_HTTP" 'epd_router_worker_in_flight{worker="decode-2",pool="decode"}')
  [ "${n:-0}" -ge 1 ] && break
  sleep 0.05
done
[ "${n:-0}" -ge 1 ] || fail "decode-2 never ran a stream"
kill -TERM "$d2_PID"
st=$(mh_ctl r probe "$d2_ADDR" || true)
[ "$st" = NOT_SERVING ] || echo "note: the probe said '$st' (the drain may have ended already)"
wait "$mpid" || fail "streaming clients: $(cat "$T/multi.err")"
[ "$(grep -c '^ok$' "$T/multi.out")" = 4 ] || fail "streams during the drain: $(cat "$T/multi.out")"
mh_wait_exit d2 40
[ "$STOP_RC" = 0 ] || fail "decode-2 exited $STOP_RC after its drain"
grep -q 'SIGTERM: draining' "$T/d2.log" || fail "decode-2 did not drain on SIGTERM"
grep -q 'drained: nothing left running' "$T/d2.log" || fail "decode-2 stopped before its drain ended"
mh_client r same "$r_HTTP" "$T/m" "$G" --prompt-file "$T/p1" --max-tokens 12 --temperature 0 ||
  fail "a request after decode-2 left"
mh_finish
