#!/usr/bin/env bash
# Several choices in one OpenAI answer through a real cluster (router, 1
# prefill, 1 decode, the tiny model) and the official OpenAI Node SDK
# (epd_openai_choices.cjs: n > 1 seeded seed + i == epd-generate, a batch
# of prompts in order == each prompt's own answer, echo, the hostile
# battery).  Then what the prefill worker's own counters show for n = 3:
# 3 requests, the 2 later choices each a prefix-cache hit of the whole
# prompt's full blocks (one prefill of the prompt, the other choices
# compute only its tail), also with two prefill workers (the later
# choices pinned to the first's); a client that goes away in the middle of a
# streamed n = 4 leaves no request and no KV block behind; the decode
# worker killed in the middle of a streamed n = 3 fails the whole stream
# (one error event, one [DONE]) and leaves no request behind; the router
# is healthy after.  Without node, or without the SDK installed (npm
# offline), the SDK part says SKIP and the rest still runs.
source "$(dirname "$0")/lib.sh"

NODE_DIR=${EPD_NODE_DIR:-build/node}
mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"
start_router r --model "$T/m" --heartbeat-ms 200
start_daemon d decode --model "$T/m" --worker-id decode-0 --kv-blocks 512 --state-slots 32 \
  --router "$r_ADDR"
start_daemon p prefill --model "$T/m" --worker-id prefill-0 --router "$r_ADDR"
wait_router_state "$r_ADDR" decode-0 READY
wait_router_state "$r_ADDR" prefill-0 READY

have_sdk=0
if command -v node >/dev/null 2>&1; then
  # make deps installs it (tests/integration/openai-sdk/deps.sh)
  [ -f "$NODE_DIR/node_modules/openai/package.json" ] && have_sdk=1
fi
if [ "$have_sdk" = 1 ]; then
  note "OpenAI Node SDK $(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' \
    "$NODE_DIR/node_modules/openai/package.json" | head -n 1), node $(node --version)"
  node "$(dirname "$0")/epd_openai_choices.cjs" "$NODE_DIR" "$r_HTTP/v1" m "$T/m" \
    "$BIN/epd-generate" || fail "the OpenAI Node SDK run above"
else
  echo "SKIP: the OpenAI Node SDK part (no node, or npm could not install openai)"
fi

note "n = 3: one prefill of the prompt, the 2 other choices prefix-cache hits"
# a prompt no request above sent: 1 + 90 bytes (BOS and the byte tokens)
LONGP=$(prompt_of_len 90 4)
q0=$(health_field "$p_ADDR" prefix_requests)
h0=$(health_field "$p_ADDR" prefix_hit_tokens)
L=$(curl -s --max-time 120 "$r_HTTP/v1/completions" -d "{\"model\": \"m\", \"prompt\": \"$LONGP\",
  \"max_tokens\": 6, \"temperature\": 0.8, \"seed\": 1, \"n\": 3}" |
  "$PYTHON3" -c 'import json, sys
b = json.load(sys.stdin)
assert [c["index"] for c in b["choices"]] == [0, 1, 2], b
print(b["usage"]["prompt_tokens"])') || fail "n=3 for the counters"
q1=$(health_field "$p_ADDR" prefix_requests)
h1=$(health_field "$p_ADDR" prefix_hit_tokens)
# the cache holds full blocks of 16 tokens and always computes the last one
want=$(( (L - 1) / 16 * 16 * 2 ))
note "  prompt $L tokens: prefill requests ${q0:-0} -> $q1, hit tokens ${h0:-0} -> $h1 (want +$want)"
[ $((q1 - ${q0:-0})) = 3 ] || fail "the prefill counted $((q1 - ${q0:-0})) requests, want 3"
[ $((h1 - ${h0:-0})) = "$want" ] || fail "the prefill hit $((h1 - ${h0:-0})) tokens, want $want"

note "a client gone in the middle of a streamed n = 4"
curl -s -N --max-time 120 "$r_HTTP/v1/completions" -d '{"model": "m", "prompt": "gone",
  "max_tokens": 1500, "ignore_eos": true, "n": 4, "stream": true}' >"$T/gone.out" 2>&1 &
cpid=$!
for i in $(seq 1 600); do
  grep -q '"index":3' "$T/gone.out" 2>/dev/null && break
  sleep 0.1
done
grep -q '"index":3' "$T/gone.out" || fail "the streamed n=4 never sent choice 3"
kill "$cpid" 2>/dev/null || true
wait "$cpid" 2>/dev/null || true
for i in $(seq 1 600); do
  inflight=$(curl -s "$r_HTTP/health" | "$PYTHON3" -c 'import json, sys
print(json.load(sys.stdin)["requests_in_flight"])')
  [ "$inflight" = 0 ] && break
  sleep 0.1
done
[ "$inflight" = 0 ] || fail "$inflight requests still in flight after the client left"
wait_blocks_free "$d_ADDR"

st=$(curl -s -o /dev/null -w '%{http_code}' "$r_HTTP/health")
[ "$st" = 200 ] || fail "router /health $st after the battery"
curl -s --max-time 60 "$r_HTTP/v1/completions" \
  -d '{"model": "m", "prompt": "still here", "max_tokens": 3}' | grep -q '"text_completion"' ||
  fail "a plain request after the battery"

note "two fresh prefill workers: the later choices are pinned to the first's (its cache)"
# a cluster of its own: with both prefill workers idle and equally used the
# policy (least-load, ties to the one that served fewer) would spread the
# choices over both; the pin keeps them where the prompt is cached
start_router r2 --model "$T/m" --heartbeat-ms 200
start_daemon d2 decode --model "$T/m" --worker-id decode-b --kv-blocks 512 --state-slots 32 \
  --router "$r2_ADDR"
start_daemon pa prefill --model "$T/m" --worker-id prefill-a --router "$r2_ADDR"
start_daemon pb prefill --model "$T/m" --worker-id prefill-b --router "$r2_ADDR"
for w in decode-b prefill-a prefill-b; do
  wait_router_state "$r2_ADDR" "$w" READY
done
for k in 1 2 3; do
  P2=$(prompt_of_len 90 $((10 + k)))
  a0=$(health_field "$pa_ADDR" prefix_requests); a0=${a0:-0}
  b0=$(health_field "$pb_ADDR" prefix_requests); b0=${b0:-0}
  ha0=$(health_field "$pa_ADDR" prefix_hit_tokens); ha0=${ha0:-0}
  hb0=$(health_field "$pb_ADDR" prefix_hit_tokens); hb0=${hb0:-0}
  curl -s --max-time 120 "$r2_HTTP/v1/completions" -d "{\"model\": \"m\", \"prompt\": \"$P2\",
    \"max_tokens\": 4, \"temperature\": 0.8, \"n\": 4}" | grep -q '"index":3' ||
    fail "n=4 with two prefill workers"
  a1=$(health_field "$pa_ADDR" prefix_requests); a1=${a1:-0}
  b1=$(health_field "$pb_ADDR" prefix_requests); b1=${b1:-0}
  ha1=$(health_field "$pa_ADDR" prefix_hit_tokens); ha1=${ha1:-0}
  hb1=$(health_field "$pb_ADDR" prefix_hit_tokens); hb1=${hb1:-0}
  note "  n=4 #$k: prefill-a +$((a1 - a0)) requests +$((ha1 - ha0)) hit, prefill-b +$((b1 - b0)) requests +$((hb1 - hb0)) hit"
  { [ $((a1 - a0)) = 4 ] && [ $((b1 - b0)) = 0 ] && [ $((ha1 - ha0)) = 240 ]; } ||
    { [ $((b1 - b0)) = 4 ] && [ $((a1 - a0)) = 0 ] && [ $((hb1 - hb0)) = 240 ]; } ||
    fail "the 4 choices were not all on one prefill worker with 3 x 80 hit tokens"
done

note "the decode worker killed in the middle of a streamed n = 3: the whole stream fails"
curl -s -N --max-time 120 "$r_HTTP/v1/completions" -d '{"model": "m", "prompt": "dies",
  "max_tokens": 1500, "ignore_eos": true, "n": 3, "stream": true}' >"$T/dies.out" 2>&1 &
cpid=$!
for i in $(seq 1 600); do
  grep -q '"index":2' "$T/dies.out" 2>/dev/null && break
  sleep 0.1
done
grep -q '"index":2' "$T/dies.out" || fail "the streamed n=3 never sent choice 2"
stop_daemon d KILL
wait "$cpid" || fail "curl of the stream whose decode died: rc $?"
grep -q '^data: {"error"' "$T/dies.out" || fail "no error event: $(tail -c 300 "$T/dies.out")"
[ "$(tail -c 14 "$T/dies.out")" = "data: [DONE]" ] ||
  fail "the failed stream does not end with one [DONE]: $(tail -c 200 "$T/dies.out")"
[ "$(grep -c '\[DONE\]' "$T/dies.out")" = 1 ] || fail "more than one [DONE]"
note "  $(grep '^data: {"error"' "$T/dies.out" | head -c 160)"
for i in $(seq 1 600); do
  inflight=$(curl -s "$r_HTTP/health" | "$PYTHON3" -c 'import json, sys
print(json.load(sys.stdin)["requests_in_flight"])')
  [ "$inflight" = 0 ] && break
  sleep 0.1
done
[ "$inflight" = 0 ] || fail "$inflight requests still in flight after the failed group"
st=$(curl -s -o /dev/null -w '%{http_code}' "$r_HTTP/health")
[ "$st" = 200 ] || fail "router /health $st after the failed group"
finish_ok
