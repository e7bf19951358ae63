#!/usr/bin/env bash
# /metrics of the daemons passes `promtool check metrics` (Debian's
# prometheus package): a router, an encoder, a prefill and a decode worker
# on loopback with a cluster secret, after one text and one image request.
#
# Which daemon exposes what: only the router serves HTTP, so only it has a
# /metrics (Prometheus text).  The workers serve no HTTP at all: their load
# (queue depth, queued prompt tokens, running requests, free KV blocks, KV
# bytes moved) reaches Prometheus through the router, which republishes
# each worker's last heartbeat as epd_router_worker_* series labelled
# worker= and pool=; a worker's own view is its gRPC Status / Health
# (epd-ctl status|health ADDR).  The test checks both: promtool passes the
# router's text with no parse error and no lint finding (exit 0, not 3),
# every worker has its per-worker series there, and each worker's control
# port answers Health.  No promtool: SKIP (make deps installs prometheus).
source "$(dirname "$0")/../integration/lib.sh"

if ! command -v promtool >/dev/null 2>&1; then
  echo "SKIP: promtool is not installed (Debian package prometheus; make deps installs it)"
  exit 0
fi

mkmodel "$T/m" "${TINY_VISION_FLAGS[@]}"
(umask 077 && head -c 32 /dev/urandom >"$T/secret")
export EPD_CLUSTER_SECRET_FILE="$T/secret"
SEC=(--cluster-secret-file "$T/secret")
start_router r --model "$T/m" --heartbeat-ms 200 "${SEC[@]}"
start_daemon d decode --model "$T/m" --worker-id decode-0 --kv-blocks 512 --state-slots 32 \
  --router "$r_ADDR" "${SEC[@]}"
start_daemon p prefill --model "$T/m" --worker-id prefill-0 --router "$r_ADDR" "${SEC[@]}"
start_daemon e encoder --model "$T/m" --worker-id encoder-0 --router "$r_ADDR" "${SEC[@]}"
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

note "every worker's heartbeat series in the router's /metrics; Health on each control port"
for w in decode-0:decode prefill-0:prefill encoder-0:encoder; do
  id=${w%%:*} pool=${w#*:}
  grep -q "^epd_router_worker_queue_depth{worker=\"$id\",pool=\"$pool\"} " "$T/router.prom" ||
    fail "no epd_router_worker_queue_depth series for $id"
done
# the autoscalers' signals (deploy/k8s/prometheus/rules.yaml)
grep -q '^epd_router_worker_kv_blocks_free{worker="decode-0"} ' "$T/router.prom" ||
  fail "no epd_router_worker_kv_blocks_free for decode-0"
grep -q '^epd_router_worker_kv_blocks{worker="decode-0"} 512$' "$T/router.prom" ||
  fail "no epd_router_worker_kv_blocks 512 for decode-0"
grep -q '^epd_router_worker_queued_tokens{worker="prefill-0"} ' "$T/router.prom" ||
  fail "no epd_router_worker_queued_tokens for prefill-0"
for n in d p e; do
  a="${n}_ADDR"
  "$BIN/epd-ctl" health "${!a}" >"$T/health.$n" || fail "epd-ctl health ${!a}"
  grep -q '^serving=1' "$T/health.$n" || fail "health of ${!a}: $(cat "$T/health.$n")"
done
finish_ok
