#!/usr/bin/env bash
# TTFT taken apart (proto/README.md rule 38), through a real cluster: a
# router, an encoder, a prefill and a decode worker on loopback serve text
# and image requests (one prompt twice, so the prefix cache serves part of
# it), and then:
#   - every phase of epd_router_ttft_phase_seconds{model,pool,phase} has
#     as many observations as epd_router_ttft_seconds, which equals the
#     requests served;
#   - the phases' sums add up to the TTFT sum (each request's phases sum
#     to its TTFT; the tolerance is the text format's 1 ns rounding per
#     printed sum), and no phase's sum exceeds it;
#   - the workers' durations reached the router intact: the router's
#     prefill_queue / prefill_compute / encode sums equal the prefill
#     worker's own histograms, kv_transfer equals prefill's + decode's KV
#     tail, first_token_handoff decode's hand-off (both ends' /metrics,
#     --metrics-addr), and the prefill, compute and KV phases are not 0;
#   - prompt tokens per request sum to epd_router_prompt_tokens_total and
#     the repeated prompt's cached tokens show in
#     epd_router_cached_tokens_total;
#   - the router's trace (--trace) holds each phase as a span ("ttft").
# Nothing here asserts a duration's size: only counts and sums that must
# agree whatever the machine's speed.
source "$(dirname "$0")/lib.sh"

mkmodel "$T/m" "${TINY_VISION_FLAGS[@]}"
M=(--metrics-addr 127.0.0.1:0)
start_router r --model "$T/m" --heartbeat-ms 200 --trace "$T/r.trace.json"
start_daemon d decode --model "$T/m" --worker-id decode-0 --kv-blocks 512 --state-slots 32 \
  --router "$r_ADDR" "${M[@]}"
start_daemon p prefill --model "$T/m" --worker-id prefill-0 --router "$r_ADDR" "${M[@]}"
start_daemon e encoder --model "$T/m" --worker-id encoder-0 --router "$r_ADDR" "${M[@]}"
for w in decode-0 prefill-0 encoder-0; do
  wait_router_state "$r_ADDR" "$w" READY
done
metrics_of() { sed -n 's/.* metrics=\([^ ]*\).*/http:\/\/\1/p' "$T/$1.ready"; }
p_M=$(metrics_of p)
d_M=$(metrics_of d)
[ -n "$p_M" ] && [ -n "$d_M" ] || fail "no metrics= in the ready files"

note "requests: text (one prompt twice: the second hits the prefix cache), streamed, images"
G="$BIN/epd-generate"
prompt_of_len 200 3 >"$T/long"
printf 'Where did the time to the first token go?' >"$T/short"
n=0
for pf in "$T/long" "$T/long" "$T/short"; do
  router_client same "$r_HTTP" "$T/m" "$G" --prompt-file "$pf" --max-tokens 6 --temperature 0 ||
    fail "text request $(basename "$pf")"
  n=$((n + 1))
done
router_client same "$r_HTTP" "$T/m" "$G" --prompt-file "$T/short" --max-tokens 5 --stream ||
  fail "streamed request"
n=$((n + 1))
router_client same "$r_HTTP" "$T/m" "$G" --prompt-file "$T/short" --max-tokens 1 ||
  fail "one-token request"
n=$((n + 1))
mkimage png "$T/a.png" 32 32 1
mkimage png "$T/b.png" 32 32 2
router_client images "$r_HTTP" "$T/m" "$G" --images "$T/a.png" --text "What is <|image|> here?" \
  --max-tokens 4 || fail "one-image request"
n=$((n + 1))
router_client images "$r_HTTP" "$T/m" "$G" --images "$T/a.png,$T/b.png" \
  --text "<|image|> and <|image|>: which?" --max-tokens 4 || fail "two-image request"
n=$((n + 1))

curl -sf --max-time 10 "$r_HTTP/metrics" >"$T/r.prom" || fail "GET the router's /metrics"
curl -sf --max-time 10 "$p_M/metrics" >"$T/p.prom" || fail "GET prefill's /metrics"
curl -sf --max-time 10 "$d_M/metrics" >"$T/d.prom" || fail "GET decode's /metrics"

note "phase counts equal the requests served; phase sums add up to the TTFT sum"
"$PYTHON3" - "$n" "$T/r.prom" "$T/p.prom" "$T/d.prom" <<'PY' || fail "TTFT phases"
import re, sys
n = int(sys.argv[1])
def load(path):
    out = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out
r, p, d = (load(f) for f in sys.argv[2:5])
phases = ["queue", "encode", "prefill_queue", "prefill_compute", "kv_transfer",
          "first_token_handoff", "messages"]
pools = {"queue": "router", "encode": "encoder", "prefill_queue": "prefill",
         "prefill_compute": "prefill", "kv_transfer": "decode",
         "first_token_handoff": "decode", "messages": "router"}
def ph(stat, name):
    return r['epd_router_ttft_phase_seconds_%s{model="m",pool="%s",phase="%s"}' % (stat, pools[name], name)]
bad = []
ttft_n, ttft_s = r['epd_router_ttft_seconds_count{model="m"}'], r['epd_router_ttft_seconds_sum{model="m"}']
if ttft_n != n:
    bad.append("ttft count %d != %d requests served" % (ttft_n, n))
total = 0.0
for name in phases:
    c, s = ph("count", name), ph("sum", name)
    print("  %-20s count %d  sum %.9f s" % (name, c, s))
    if c != ttft_n:
        bad.append("phase %s: count %d != ttft count %d" % (name, c, ttft_n))
    if s > ttft_s + 1e-9 * n:
        bad.append("phase %s: sum %.9f > ttft sum %.9f" % (name, s, ttft_s))
    total += s
# each printed sum is rounded to 1 ns; per request the phases sum exactly
eps = 1e-9 * (len(phases) + 1) + 1e-12 * n
print("  phases sum %.9f s, ttft sum %.9f s, difference %.3g s (tolerance %.3g)" %
      (total, ttft_s, total - ttft_s, eps))
if abs(total - ttft_s) > eps:
    bad.append("phases sum %.9f != ttft sum %.9f" % (total, ttft_s))
for name in ("prefill_compute", "kv_transfer", "encode"):
    if ph("sum", name) <= 0:
        bad.append("phase %s: sum 0 (its durations never reached the router)" % name)
def close(a, b, what):
    print("  %-44s router %.9f  workers %.9f" % (what, a, b))
    if abs(a - b) > 1e-8:
        bad.append("%s: router %.9f != workers %.9f" % (what, a, b))
close(ph("sum", "prefill_compute"), p['epd_prefill_compute_seconds_sum{model="m"}'],
      "prefill_compute = prefill's compute")
close(ph("sum", "prefill_queue"), p['epd_prefill_queue_seconds_sum{model="m"}'],
      "prefill_queue = prefill's queue")
close(ph("sum", "encode"), p['epd_prefill_encode_seconds_sum{model="m"}'],
      "encode = prefill's encode wait")
close(ph("sum", "kv_transfer"),
      p['epd_prefill_kv_tail_seconds_sum{model="m"}'] + d['epd_decode_kv_tail_seconds_sum{model="m"}'],
      "kv_transfer = prefill's + decode's KV tail")
close(ph("sum", "first_token_handoff"), d['epd_decode_handoff_seconds_sum{model="m"}'],
      "first_token_handoff = decode's hand-off")
for w, key in ((p, 'epd_prefill_compute_seconds_count{model="m"}'),
               (d, 'epd_decode_kv_tail_seconds_count{model="m"}')):
    if w[key] != n:
        bad.append("%s = %d, not %d" % (key, w[key], n))
pt = r['epd_router_request_prompt_tokens_sum{model="m"}']
if pt != r['epd_router_prompt_tokens_total{model="m"}'] or r['epd_router_request_prompt_tokens_count{model="m"}'] != n:
    bad.append("prompt tokens per request sum %d != epd_router_prompt_tokens_total %d" %
               (pt, r['epd_router_prompt_tokens_total{model="m"}']))
cached = r['epd_router_cached_tokens_total{model="m"}']
print("  prompt tokens %d, cached %d" % (pt, cached))
if cached <= 0 or cached != r['epd_router_request_cached_tokens_sum{model="m"}']:
    bad.append("cached tokens %d (the repeated prompt should hit the prefix cache)" % cached)
if cached != p['epd_prefill_cached_tokens_sum{model="m"}']:
    bad.append("router cached %d != prefill's %d" % (cached, p['epd_prefill_cached_tokens_sum{model="m"}']))
if r['epd_router_phase_times_missing_total{model="m"}'] != 0:
    bad.append("first tokens without phase times")
for b in bad:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
PY

note "the router's trace holds the phases as spans"
stop_daemon r TERM
[ "$STOP_RC" = 0 ] || fail "router exited $STOP_RC on SIGTERM"
"$PYTHON3" - "$T/r.trace.json" "$n" <<'PY' || fail "trace spans"
import json, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
names = {}
for e in ev:
    if e.get("cat") == "ttft" and e.get("ph") == "X":
        names[e["name"]] = names.get(e["name"], 0) + 1
print("  ttft spans:", names)
n = int(sys.argv[2])
for want in ("prefill compute (workers' time)", "KV transfer tail (workers' time)",
             "messages (the rest)"):
    if names.get(want, 0) != n:
        print("FAIL: %d '%s' spans, want %d" % (names.get(want, 0), want, n))
        sys.exit(1)
if names.get("encode (workers' time)", 0) != 2:
    print("FAIL: %d encode spans, want 2 (the image requests)" % names.get("encode (workers' time)", 0))
    sys.exit(1)
PY
finish_ok
