#!/usr/bin/env bash
# The router with one prefill and one decode worker registered over gRPC
# (RegisterWorker + Heartbeat): /v1/completions and /v1/chat/completions,
# streaming and not, greedy and sampled, answer exactly epd-generate's text
# for the same prompt and sampling settings; /v1/models, /health, Status
# and the pool table (epd-ctl workers) through epd-ctl; /metrics counts the
# KV bytes moved (sent by prefill = received and verified by decode);
# --trace on all three: the router's per-request spans use the request ids
# the workers trace; SIGTERM stops everything with exit 0.
source "$(dirname "$0")/lib.sh"

mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"
start_router r --model "$T/m" --heartbeat-ms 200 --trace "$T/r.trace.json"
start_daemon d decode --model "$T/m" --worker-id decode-0 --kv-blocks 512 --state-slots 32 \
  --router "$r_ADDR" --trace "$T/d.trace.json"
start_daemon p prefill --model "$T/m" --worker-id prefill-0 --router "$r_ADDR" \
  --trace "$T/p.trace.json"
wait_router_state "$r_ADDR" decode-0 READY
wait_router_state "$r_ADDR" prefill-0 READY
"$BIN/epd-ctl" status "$r_ADDR" | grep -q "worker=prefill-0 role=prefill" || fail "Status lacks prefill-0"
"$BIN/epd-ctl" workers "$r_ADDR" >"$T/workers" || fail "epd-ctl workers"
grep -q '^prefill pool: 1 READY' "$T/workers" || fail "epd-ctl workers: $(cat "$T/workers")"
grep -q '^decode pool: 1 READY' "$T/workers" || fail "epd-ctl workers: $(cat "$T/workers")"
grep -Eq '^  decode-0 +READY +0 +0 +0 +512/512 ' "$T/workers" || fail "epd-ctl workers: $(cat "$T/workers")"

note "GET /v1/models, /v1/models/ID, /health"
router_client raw "$r_HTTP" GET /v1/models >"$T/models"
[ "$(head -n 1 "$T/models")" = 200 ] || fail "/v1/models: $(cat "$T/models")"
grep -q '"id":"m"' "$T/models" || fail "/v1/models lacks the model: $(cat "$T/models")"
router_client raw "$r_HTTP" GET /v1/models/m >"$T/model"
[ "$(head -n 1 "$T/model")" = 200 ] && grep -q '"id":"m","object":"model"' "$T/model" ||
  fail "/v1/models/m: $(cat "$T/model")"
router_client raw "$r_HTTP" GET /v1/models/other >"$T/model"
[ "$(head -n 1 "$T/model")" = 404 ] && grep -q '"code":"model_not_found"' "$T/model" ||
  fail "/v1/models/other: $(cat "$T/model")"
router_client raw "$r_HTTP" GET /health >"$T/health"
grep -q '"prefill_ready":1,"decode_ready":1' "$T/health" || fail "/health: $(cat "$T/health")"

note "completions and chat, streaming and not, equal epd-generate"
printf 'The router sends this prompt to a prefill worker.' >"$T/p1"
prompt_of_len 300 5 >"$T/p2"
G="$BIN/epd-generate"
for pf in "$T/p1" "$T/p2"; do
  router_client same "$r_HTTP" "$T/m" "$G" --prompt-file "$pf" --max-tokens 24 --temperature 0 \
    --all-kinds || fail "greedy, $(basename "$pf")"
  router_client same "$r_HTTP" "$T/m" "$G" --prompt-file "$pf" --max-tokens 24 --temperature 0.9 \
    --top-p 0.9 --top-k 40 --seed 42 --all-kinds || fail "sampled, $(basename "$pf")"
done
# no seed: the router uses 0, as epd-generate does
router_client same "$r_HTTP" "$T/m" "$G" --prompt-file "$T/p1" --max-tokens 16 --stream ||
  fail "default sampling (temperature 1, seed 0)"
# a long generation in one stream
router_client same "$r_HTTP" "$T/m" "$G" --prompt-file "$T/p1" --max-tokens 400 --temperature 0 \
  --stream || fail "400 tokens streamed"
wait_blocks_free "$d_ADDR"

note "/metrics: the KV bytes prefill wrote equal the bytes decode received and verified"
# both come from the workers' heartbeats (every 200 ms here): wait until
# they agree and stop moving
prev=""
for i in $(seq 1 100); do
  sent=$(router_metric "$r_HTTP" epd_router_kv_bytes_sent_total)
  recv=$(router_metric "$r_HTTP" epd_router_kv_bytes_received_total)
  [ -n "$sent" ] && [ "$sent" -gt 0 ] && [ "$sent" = "$recv" ] && [ "$sent" = "$prev" ] && break
  prev=$sent
  sleep 0.2
done
[ -n "$sent" ] && [ "$sent" -gt 0 ] || fail "kv_bytes_sent_total=$sent"
[ "$sent" = "$recv" ] || fail "KV bytes sent $sent != received $recv"
w_sent=$(router_metric "$r_HTTP" 'epd_router_worker_kv_bytes_total{worker="prefill-0",pool="prefill",direction="sent"}')
w_recv=$(router_metric "$r_HTTP" 'epd_router_worker_kv_bytes_total{worker="decode-0",pool="decode",direction="received"}')
[ "$w_sent" = "$sent" ] && [ "$w_recv" = "$recv" ] ||
  fail "per-worker KV bytes $w_sent / $w_recv, totals $sent / $recv"
stop_daemon r TERM
[ "$STOP_RC" = 0 ] || fail "router exited $STOP_RC on SIGTERM"

note "--trace: the router's per-request spans carry the ids the workers trace"
stop_daemon p TERM
stop_daemon d TERM
"$PYTHON3" - "$T/r.trace.json" "$T/p.trace.json" "$T/d.trace.json" <<'PY' || fail "traces"
import json, sys
def events(path):
    return [e for e in json.load(open(path))["traceEvents"] if e.get("ph") in ("X", "i")]
r, p, d = (events(f) for f in sys.argv[1:4])
def ids(evs, name):
    return {e["args"]["req"] for e in evs if e["name"] == name and "req" in e.get("args", {})}
done = ids(r, "request")
assert len(done) >= 16, f"only {len(done)} finished requests in the router's trace"
for name in ("parse + tokenize", "choose + submit", "wait for first token", "TokenChunk received"):
    missing = done - ids(r, name)
    assert not missing, f"router: {len(missing)} requests without '{name}'"
for e in r:
    assert e["ts"] >= 0 and (e["ph"] != "X" or e["dur"] >= 0), e
# every request the router finished reached both workers under the same id
assert done <= ids(p, "GenerateRequest received"), "ids unknown to prefill"
assert done <= ids(d, "GenerateRequest received"), "ids unknown to decode"
# and each span sits inside its request's span
span = {e["args"]["req"]: (e["ts"], e["ts"] + e["dur"]) for e in r if e["name"] == "request"}
for e in r:
    q = e.get("args", {}).get("req")
    if q in span and e["name"] != "request":
        a, b = span[q]
        assert a - 1 <= e["ts"] <= b + 1, (e["name"], e["ts"], a, b)
print(f"router trace: {len(done)} requests, {len(r)} events")
PY
finish_ok
