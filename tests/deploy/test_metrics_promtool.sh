#!/usr/bin/env bash
# /metrics of every daemon passes `promtool check metrics` (Debian's
# prometheus package): a router, an encoder, a prefill and a decode worker
# on loopback with a cluster secret, after one text and one image request.
#
# Which daemon exposes what: the router serves /metrics on its HTTP port
# (its own series, plus each worker's last heartbeat republished as
# epd_router_worker_* labelled worker= and pool=); each worker given
# --metrics-addr serves its own /metrics (epd_<role>_*, labelled model=:
# its phases' histograms, queue, KV, cache).  Every sample of every daemon
# carries model="..." first.  The test checks: promtool
# passes every daemon's text with no parse error and no lint finding (exit
# 0, not 3), every worker has its per-worker series at the router, each
# worker's own families are there with the model label, a worker's
# metrics port answers 404 for another path, 405 for another method and
# 431 for an oversized head, idle sockets beyond its cap do not lock a
# scraper out, each worker's control port
# answers Health, every metric the Grafana dashboard
# (deploy/grafana/epd.json) queries exists in what the cluster serves, and
# every family served is documented in docs/metrics.md.
# A worker refuses a non-loopback --metrics-addr without a cluster secret.
# No promtool: SKIP (make deps installs prometheus).
source "$(dirname "$0")/../integration/lib.sh"

if ! command -v promtool >/dev/null 2>&1; then
  echo "SKIP: promtool is not installed (Debian package prometheus; make deps installs it)"
  exit 0
fi

mkmodel "$T/m" "${TINY_VISION_FLAGS[@]}"
note "--metrics-addr is bound like --control-addr: loopback only without a cluster secret"
for bad in "0.0.0.0:0|--metrics-addr is not a loopback address" "nonsense|metrics-addr"; do
  a=${bad%%|*} want=${bad#*|}
  if "$BIN/epd-decode" --model "$T/m" --control-addr 127.0.0.1:0 --metrics-addr "$a" \
       >"$T/bad.log" 2>&1; then
    fail "decode started with --metrics-addr $a and no secret"
  fi
  grep -q -- "$want" "$T/bad.log" || fail "--metrics-addr $a: $(tail -n 2 "$T/bad.log")"
done
(umask 077 && head -c 32 /dev/urandom >"$T/secret")
export EPD_CLUSTER_SECRET_FILE="$T/secret"
SEC=(--cluster-secret-file "$T/secret")
start_router r --model "$T/m" --heartbeat-ms 200 "${SEC[@]}"
M=(--metrics-addr 127.0.0.1:0)
start_daemon d decode --model "$T/m" --worker-id decode-0 --kv-blocks 512 --state-slots 32 \
  --router "$r_ADDR" "${SEC[@]}" "${M[@]}"
start_daemon p prefill --model "$T/m" --worker-id prefill-0 --router "$r_ADDR" "${SEC[@]}" "${M[@]}"
start_daemon e encoder --model "$T/m" --worker-id encoder-0 --router "$r_ADDR" "${SEC[@]}" "${M[@]}"
for w in decode-0 prefill-0 encoder-0; do
  wait_router_state "$r_ADDR" "$w" READY
done

note "one text and one image request (the series then carry non-zero values)"
printf 'Metrics after one request.' >"$T/p1"
router_client same "$r_HTTP" "$T/m" "$BIN/epd-generate" --prompt-file "$T/p1" --max-tokens 8 \
  --temperature 0 || fail "text request"
mkimage png "$T/a.png" 32 32 1
router_client images "$r_HTTP" "$T/m" "$BIN/epd-generate" --images "$T/a.png" \
  --text "What is <|image|> here?" --max-tokens 6 || fail "image request"

note "promtool check metrics on the router's /metrics"
curl -sf --max-time 10 "$r_HTTP/metrics" >"$T/router.prom" || fail "GET /metrics"
rc=0
promtool check metrics <"$T/router.prom" >"$T/promtool.out" 2>&1 || rc=$?
cat "$T/promtool.out"
[ $rc = 0 ] || fail "promtool check metrics exited $rc (1: parse error, 3: lint findings)"
echo "router /metrics: $(grep -vc '^#' "$T/router.prom") samples, $(grep -c '^# TYPE' "$T/router.prom") families: promtool ok"

note "promtool check metrics on each worker's own /metrics (--metrics-addr)"
for n in d p e; do
  maddr=$(sed -n 's/.* metrics=\([^ ]*\).*/\1/p' "$T/$n.ready")
  [ -n "$maddr" ] || fail "ready file of $n has no metrics=ADDR: $(cat "$T/$n.ready")"
  curl -sf --max-time 10 "http://$maddr/metrics" >"$T/$n.prom" || fail "GET http://$maddr/metrics"
  rc=0
  promtool check metrics <"$T/$n.prom" >"$T/promtool.$n" 2>&1 || rc=$?
  cat "$T/promtool.$n"
  [ $rc = 0 ] || fail "promtool check metrics on $n's /metrics exited $rc"
  echo "$n /metrics: $(grep -vc '^#' "$T/$n.prom") samples, $(grep -c '^# TYPE' "$T/$n.prom") families: promtool ok"
  code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 "http://$maddr/other")
  [ "$code" = 404 ] || fail "GET /other on $n's metrics port answered $code, not 404"
  code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 -X POST "http://$maddr/metrics")
  [ "$code" = 405 ] || fail "POST /metrics on $n's metrics port answered $code, not 405"
  code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 -H "X-Big: $(head -c 5000 /dev/zero | tr '\0' a)" \
    "http://$maddr/metrics")
  [ "$code" = 431 ] || fail "a 5 KB head on $n's metrics port answered $code, not 431"
done
# 40 idle sockets (more than the listener's 32) and a half-closed client
# do not keep a scrape from its answer
"$PYTHON3" - "$(sed -n 's/.* metrics=\([^ ]*\).*/\1/p' "$T/d.ready")" <<'PY' || fail "metrics port under idle sockets"
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
idle = [socket.create_connection((host, int(port)), timeout=30) for _ in range(40)]
s = socket.create_connection((host, int(port)), timeout=30)
s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
s.shutdown(socket.SHUT_WR)
data = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    data += b
head = data.split(b"\r\n", 1)[0]
print("  after 40 idle sockets, a half-closed scrape:", head.decode(), len(data), "bytes")
sys.exit(0 if head.startswith(b"HTTP/1.1 200") and b"epd_decode_info" in data else 1)
PY
# each role's own families, with the model label (the folder's name: m)
grep -q '^epd_prefill_compute_seconds_count{model="m"} [1-9]' "$T/p.prom" ||
  fail "prefill: no epd_prefill_compute_seconds observation: $(grep compute_seconds_count "$T/p.prom")"
grep -q '^epd_prefill_queued_tokens{model="m"} ' "$T/p.prom" || fail "prefill: no queued_tokens"
grep -q '^epd_prefill_prefix_cache_hit_tokens_total{model="m"} ' "$T/p.prom" ||
  fail "prefill: no prefix_cache_hit_tokens_total"
grep -q '^epd_decode_step_seconds_count{model="m"} [1-9]' "$T/d.prom" || fail "decode: no step"
grep -q '^epd_decode_batch_size_count{model="m"} [1-9]' "$T/d.prom" || fail "decode: no batch size"
grep -q '^epd_decode_kv_blocks_used{model="m"} ' "$T/d.prom" || fail "decode: no kv_blocks_used"
# the pool in tokens: blocks x block tokens (512 x 16)
[ "$(epd_metric_value 'epd_decode_kv_tokens' <"$T/d.prom")" = 8192 ] ||
  fail "decode: kv_tokens is '$(epd_metric_value 'epd_decode_kv_tokens' <"$T/d.prom")', not 8192"
grep -q '^epd_decode_preemptions_total{model="m"} ' "$T/d.prom" || fail "decode: no preemptions"
grep -q '^epd_decode_verification_failures_total{model="m"} 0$' "$T/d.prom" ||
  fail "decode: no verification_failures_total 0"
grep -q '^epd_encoder_encode_seconds_count{model="m"} 1$' "$T/e.prom" ||
  fail "encoder: not one encode: $(grep encode_seconds_count "$T/e.prom")"
grep -q '^epd_encoder_queue_seconds_count{model="m"} 1$' "$T/e.prom" || fail "encoder: no queue"
grep -q '^epd_encoder_queue_depth{model="m"} ' "$T/e.prom" || fail "encoder: no queue_depth"

note "every sample of every daemon carries the model label first (model=\"m\", the folder's name)"
for n in router d p e; do
  grep -v '^#' "$T/$n.prom" | grep -v '^[a-zA-Z_:][a-zA-Z0-9_:]*{model="m"[,}]' >"$T/unlabelled.$n" || true
  [ ! -s "$T/unlabelled.$n" ] ||
    fail "$n: $(wc -l <"$T/unlabelled.$n") samples without model=\"m\" first: $(head -n 3 "$T/unlabelled.$n")"
done
grep -q '^epd_router_ttft_seconds_count{model="m"} 2$' "$T/router.prom" ||
  fail "router: not two TTFT observations: $(grep '^epd_router_ttft_seconds_count' "$T/router.prom")"
grep -q '^epd_router_requests_ok_total{model="m"} 2$' "$T/router.prom" ||
  fail "router: not two requests ok: $(grep '^epd_router_requests_ok_total' "$T/router.prom")"
# the tests' reader (router_metric) names series without the model label
[ "$(epd_metric_value 'epd_router_worker_kv_blocks{worker="decode-0"}' <"$T/router.prom")" = 512 ] ||
  fail "epd_metric_value does not find epd_router_worker_kv_blocks{worker=\"decode-0\"} 512"
[ "$(epd_metric_value 'epd_router_requests_ok_total' <"$T/router.prom")" = 2 ] ||
  fail "epd_metric_value does not find epd_router_requests_ok_total 2"
[ -z "$(epd_metric_value 'epd_router_requests_ok_total{model="other"}' <"$T/router.prom")" ] ||
  fail "epd_metric_value matched another model's series"

note "every metric the Grafana dashboard queries is served by this cluster"
cat "$T/router.prom" "$T/d.prom" "$T/p.prom" "$T/e.prom" |
  awk '!/^#/ { n = $1; sub(/\{.*/, "", n); print n } /^# TYPE/ { print $3 }' | sort -u >"$T/names"
"$PYTHON3" "$(dirname "$0")/epd_dashboard_names.py" "$(dirname "$0")/../../deploy/grafana/epd.json" \
  "$T/names" || fail "the dashboard queries metrics nobody serves"

note "every family served is documented in docs/metrics.md"
grep '^# TYPE' "$T/router.prom" "$T/d.prom" "$T/p.prom" "$T/e.prom" | awk '{ print $3 }' | sort -u |
  while read -r fam; do
    grep -q "\`$fam\`" "$(dirname "$0")/../../docs/metrics.md" || echo "$fam"
  done >"$T/undocumented"
[ ! -s "$T/undocumented" ] || fail "not in docs/metrics.md: $(tr '\n' ' ' <"$T/undocumented")"

note "every worker's heartbeat series in the router's /metrics; Health on each control port"
for w in decode-0:decode prefill-0:prefill encoder-0:encoder; do
  id=${w%%:*} pool=${w#*:}
  grep -q "^epd_router_worker_queue_depth{model=\"m\",worker=\"$id\",pool=\"$pool\"} " "$T/router.prom" ||
    fail "no epd_router_worker_queue_depth series for $id"
done
# the autoscalers' signals (deploy/k8s/prometheus/rules.yaml)
grep -q '^epd_router_worker_kv_blocks_free{model="m",worker="decode-0"} ' "$T/router.prom" ||
  fail "no epd_router_worker_kv_blocks_free for decode-0"
grep -q '^epd_router_worker_kv_blocks{model="m",worker="decode-0"} 512$' "$T/router.prom" ||
  fail "no epd_router_worker_kv_blocks 512 for decode-0"
grep -q '^epd_router_worker_queued_tokens{model="m",worker="prefill-0"} ' "$T/router.prom" ||
  fail "no epd_router_worker_queued_tokens for prefill-0"
for n in d p e; do
  a="${n}_ADDR"
  "$BIN/epd-ctl" health "${!a}" >"$T/health.$n" || fail "epd-ctl health ${!a}"
  grep -q '^serving=1' "$T/health.$n" || fail "health of ${!a}: $(cat "$T/health.$n")"
done
finish_ok
