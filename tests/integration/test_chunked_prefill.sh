#!/usr/bin/env bash
# Chunked prefill (issue #25), on ref with an attention-only model (layer
# pattern A) and a hybrid one (LLA: the recurrent state carries across
# chunks), both tiny (dim 8) so that a prompt of more than 16k tokens runs
# in seconds:
#  - the prompt computed in chunks of 1000 (not a multiple of the 16-token
#    block) and of 2048 (ref's default) gives token for token what
#    epd-generate (one whole-prompt engine call: the unchunked run) gives,
#    greedy and seeded, prefill -> decode (the seeded run of each worker
#    resumes from its prefix cache: the checkpoints taken inside chunks);
#  - through a router cluster (chunks of 1000) the same, greedy and seeded;
#  - a request that needs more KV than the decode worker's whole pool is a
#    400 naming the limit (nothing reserved: decode's free blocks stay at
#    their total); one over the model's window is a 400 too;
#  - decode verifies each chunk's blocks as they land (LayerDone with
#    `blocks`, rule 4): its epd_decode_kv_range_checks_total and _bytes
#    grow with a chunked run; a prefill whose KV writes are corrupted on
#    the wire (EPD_XPORT_FAULTS=wcorrupt=1) has its request failed by such
#    a chunk check, before its layer's end, with nothing leaked;
#  - a prefix hit's blocks cross to decode (and are checked there) before
#    the rest of the prompt computes, chunked or not: an unchunked prefill
#    with a hit of 250 blocks and 4,000 tokens to compute (4 layers) makes
#    decode count block-range checks, and the answer equals epd-generate's;
#  - a prefill stopped (SIGSTOP) in the middle of a chunked run and resumed
#    (SIGCONT) finishes the request equal to epd-generate; one stopped
#    while its client goes away (the router's Abort waits for it) ends at
#    a chunk boundary; either way no block is leaked (decode's and
#    prefill's free blocks return to their start values).
source "$(dirname "$0")/lib.sh"

G="$BIN/epd-generate"
SEEDED=(--temperature 0.9 --top-p 0.95 --seed 11)
# 16,500 bytes: 16,501 tokens with BOS (a byte vocabulary)
prompt_of_len 16500 3 >"$T/long.txt"
# the decode pool: 1100 blocks = 17,600 tokens, enough for the prompt and
# a few hundred more, not for 2,000 more
D_BLOCKS=1100

# want MODEL FLAGS...: epd-generate's token ids for the long prompt
want() {
  local model=$1
  shift
  "$G" --model "$model" --prompt "$(cat "$T/long.txt")" --max-tokens 8 --tokens "$@" ||
    fail "epd-generate $*"
}

# got PREFILL_ADDR DECODE_ADDR MODEL FLAGS...: the ids through the two workers
got() {
  local p=$1 d=$2 model=$3
  shift 3
  "$BIN/epd-ctl" submit --prefill "$p" --decode "$d" --model "$model" \
    --prompt-file "$T/long.txt" --max-tokens 8 --tokens --timeout-ms 120000 "$@" ||
    fail "epd-ctl submit $*"
}

for pat in A LLA; do
  layers=1
  [ "$pat" = LLA ] && layers=3
  m="$T/m_$pat"
  mkmodel "$m" --layers "$layers" --dim 8 --heads 1 --kv-heads 1 --layer-pattern "$pat" \
    --ffn 16 --vision 0 --max-context 20000 --seed 3
  w_greedy=$(want "$m")
  w_seeded=$(want "$m" "${SEEDED[@]}")
  start_daemon "d_$pat" decode --model "$m" --worker-id "decode-$pat" --kv-blocks "$D_BLOCKS" \
    --state-slots 8 --metrics-addr 127.0.0.1:0
  daddr_var="d_${pat}_ADDR"
  daddr=${!daddr_var}
  dmet=$(sed -n 's/.* metrics=\([^ ]*\).*/http:\/\/\1/p' "$T/d_$pat.ready")
  [ -n "$dmet" ] || fail "no metrics= in the ready file of d_$pat"
  total=$(status_field "$daddr" kv_blocks_total)
  for chunk in 1000 2048; do
    name="p_${pat}_$chunk"
    start_daemon "$name" prefill --model "$m" --worker-id "prefill-$pat-$chunk" \
      --prefill-chunk-tokens "$chunk" --state-slots 8
    paddr_var="${name}_ADDR"
    paddr=${!paddr_var}
    note "$pat, chunks of $chunk: greedy and seeded"
    g=$(got "$paddr" "$daddr" "$m")
    [ "$g" = "$w_greedy" ] || fail "$pat chunk $chunk greedy: got '$g', want '$w_greedy'"
    g=$(got "$paddr" "$daddr" "$m" "${SEEDED[@]}")
    [ "$g" = "$w_seeded" ] || fail "$pat chunk $chunk seeded: got '$g', want '$w_seeded'"
    stop_daemon "$name" TERM
    [ "$STOP_RC" = 0 ] || fail "prefill $name exited $STOP_RC"
  done
  wait_blocks_free "$daddr"
  [ "$(status_field "$daddr" kv_blocks_free)" = "$total" ] || fail "decode blocks leaked"
  checks=$(router_metric "$dmet" epd_decode_kv_range_checks_total)
  bytes=$(router_metric "$dmet" epd_decode_kv_range_bytes_total)
  note "$pat: $checks chunk checks on decode, $bytes bytes verified as they landed"
  [ "${checks:-0}" -gt 0 ] && [ "${bytes:-0}" -gt 0 ] ||
    fail "$pat: decode checked no chunk as it landed (checks '$checks', bytes '$bytes')"

  note "$pat: every KV write corrupted on the wire: a chunk check fails the request"
  fails0=$(router_metric "$dmet" epd_decode_verification_failures_total)
  EPD_XPORT_FAULTS=wcorrupt=1,seed=1 start_daemon "c_$pat" prefill --model "$m" \
    --worker-id "prefill-$pat-corrupt" --prefill-chunk-tokens 1000 --state-slots 8 \
    --no-prefix-cache
  caddr_var="c_${pat}_ADDR"
  if out=$("$BIN/epd-ctl" submit --prefill "${!caddr_var}" --decode "$daddr" --model "$m" \
    --prompt-file "$T/long.txt" --max-tokens 8 --tokens --timeout-ms 120000 2>&1); then
    fail "$pat: a request with corrupted KV succeeded: $out"
  fi
  grep -qi "corrupt" <<<"$out" || fail "$pat: the error does not say the KV was corrupt: $out"
  grep -q "KV of layer [0-9]* from prefill-$pat-corrupt fails its check.*(a chunk check: the blocks landed so far)" \
    "$T/d_$pat.log" ||
    fail "$pat: no chunk check caught it: $(grep -m1 'fails its check' "$T/d_$pat.log")"
  [ "$(router_metric "$dmet" epd_decode_verification_failures_total)" = $((fails0 + 1)) ] ||
    fail "$pat: verification failures did not count it"
  wait_blocks_free "$daddr"
  [ "$(status_field "$daddr" kv_blocks_free)" = "$total" ] || fail "$pat: decode blocks leaked"
  stop_daemon "c_$pat" TERM
  [ "$STOP_RC" = 0 ] || fail "prefill c_$pat exited $STOP_RC"
  stop_daemon "d_$pat" TERM
  [ "$STOP_RC" = 0 ] || fail "decode d_$pat exited $STOP_RC"
done

note "a prefix hit crosses to decode before the rest computes (chunking off)"
# 4 layers, so that the 4,000 tokens after the hit take a while and every
# layer's end gives the hit's range another chance to go out
mh="$T/m_hit"
mkmodel "$mh" --layers 4 --dim 8 --heads 1 --kv-heads 1 --layer-pattern A --ffn 16 --vision 0 \
  --max-context 20000 --seed 5
head -c 8000 "$T/long.txt" >"$T/base.txt"
{ head -c 4000 "$T/long.txt"; prompt_of_len 4000 7; } >"$T/half.txt"
w_base=$("$G" --model "$mh" --prompt "$(cat "$T/base.txt")" --max-tokens 8 --tokens) ||
  fail "epd-generate, the base prompt"
w_half=$("$G" --model "$mh" --prompt "$(cat "$T/half.txt")" --max-tokens 8 --tokens) ||
  fail "epd-generate, the half-shared prompt"
start_daemon hd decode --model "$mh" --worker-id decode-hit --kv-blocks "$D_BLOCKS" \
  --metrics-addr 127.0.0.1:0
hmet=$(sed -n 's/.* metrics=\([^ ]*\).*/http:\/\/\1/p' "$T/hd.ready")
start_daemon hp prefill --model "$mh" --worker-id prefill-hit --prefill-chunk-tokens 0
# the base prompt fills prefill's prefix cache (no hit, no chunks)
g=$("$BIN/epd-ctl" submit --prefill "$hp_ADDR" --decode "$hd_ADDR" --model "$mh" \
  --prompt-file "$T/base.txt" --max-tokens 8 --tokens --timeout-ms 120000) ||
  fail "the base prompt"
[ "$g" = "$w_base" ] || fail "unchunked: got '$g', want '$w_base'"
c0=$(router_metric "$hmet" epd_decode_kv_range_checks_total)
g=$("$BIN/epd-ctl" submit --prefill "$hp_ADDR" --decode "$hd_ADDR" --model "$mh" \
  --prompt-file "$T/half.txt" --max-tokens 8 --tokens --timeout-ms 120000) ||
  fail "the half-shared prompt"
[ "$g" = "$w_half" ] || fail "a prefix hit: got '$g', want '$w_half'"
c1=$(router_metric "$hmet" epd_decode_kv_range_checks_total)
note "decode checked $((c1 - c0)) block ranges of the hit before the prompt's end"
[ "$c1" -gt "$c0" ] || fail "the hit's blocks did not cross ahead (checks $c0 -> $c1)"
for n in hp hd; do
  stop_daemon "$n" TERM
  [ "$STOP_RC" = 0 ] || fail "$n exited $STOP_RC"
done

note "sim engine (hybrid MoE profile, shrunk), chunks of 1000: decode --verify full and stamps"
profiles="$(cd "$(dirname "$0")/../../engine/profiles" && pwd)"
mkdir -p "$T/sim"
printf '%s\n' "model = $profiles/hybrid-moe-320b.profile" "accel = $profiles/h200.profile" \
  "devices = 8" "scale = 0.01" "mode = sleep" "seed = 3" "vocab = 512" >"$T/sim/sim.conf"
prompt_of_len 5000 5 >"$T/sim.txt"
start_daemon s_d decode --engine sim --model "$T/sim" --worker-id decode-sim --kv-blocks 512 \
  --state-slots 8 --verify full
start_daemon s_t decode --engine sim --model "$T/sim" --worker-id decode-sim-stamps \
  --kv-blocks 512 --state-slots 8 --verify stamps
start_daemon s_p prefill --engine sim --model "$T/sim" --worker-id prefill-sim --kv-blocks 512 \
  --state-slots 8 --prefill-chunk-tokens 1000 --no-prefix-cache
same_as_colocated "$T/sim" "$s_p_ADDR" "$s_d_ADDR" "$T/sim.txt" 8 --engine sim
same_as_colocated "$T/sim" "$s_p_ADDR" "$s_t_ADDR" "$T/sim.txt" 8 --engine sim --temperature 0.8 \
  --seed 4
for n in s_p s_d s_t; do
  stop_daemon "$n" TERM
  [ "$STOP_RC" = 0 ] || fail "$n exited $STOP_RC"
done

note "router cluster, hybrid model, chunks of 1000"
m="$T/m_LLA"
start_router r --model "$m" --heartbeat-ms 200 --dead-after-ms 5000
start_daemon d decode --model "$m" --worker-id decode-0 --kv-blocks "$D_BLOCKS" --state-slots 8 \
  --router "$r_ADDR"
start_daemon p prefill --model "$m" --worker-id prefill-0 --prefill-chunk-tokens 1000 \
  --no-prefix-cache --state-slots 8 --router "$r_ADDR"
wait_router_state "$r_ADDR" decode-0 READY
wait_router_state "$r_ADDR" prefill-0 READY
router_client same "$r_HTTP" "$m" "$G" --prompt-file "$T/long.txt" --max-tokens 8 ||
  fail "router, greedy"
router_client same "$r_HTTP" "$m" "$G" --prompt-file "$T/long.txt" --max-tokens 8 \
  --temperature 0.9 --top-p 0.95 --seed 11 || fail "router, seeded"
d_total=$(status_field "$d_ADDR" kv_blocks_total)
p_free0=$(status_field "$p_ADDR" kv_blocks_free)
wait_blocks_free "$d_ADDR"

note "admission: over decode's whole pool, over the window"
body=$("$PYTHON3" -c 'import json,sys; print(json.dumps({"model": sys.argv[1].rstrip("/").split("/")[-1], "prompt": open(sys.argv[2]).read(), "max_tokens": 2000}))' "$m" "$T/long.txt")
out=$(router_client raw "$r_HTTP" POST /v1/completions "$body")
[ "$(head -n 1 <<<"$out")" = 400 ] || fail "over decode's pool: $out"
grep -q "largest decode worker holds $((D_BLOCKS * 16)) tokens" <<<"$out" ||
  fail "the 400 does not name the limit: $out"
[ "$(status_field "$d_ADDR" kv_blocks_free)" = "$d_total" ] || fail "the refusal reserved blocks"
prompt_of_len 20001 4 >"$T/over.txt"
body=$("$PYTHON3" -c 'import json,sys; print(json.dumps({"model": sys.argv[1].rstrip("/").split("/")[-1], "prompt": open(sys.argv[2]).read(), "max_tokens": 4}))' "$m" "$T/over.txt")
out=$(router_client raw "$r_HTTP" POST /v1/completions "$body")
[ "$(head -n 1 <<<"$out")" = 400 ] || fail "over the window: $out"
grep -q "maximum context length is 20000" <<<"$out" || fail "the 400 does not name the window: $out"

# running P: the prefill worker has a request in flight
running() {
  [ "$(status_field "$p_ADDR" running_requests)" -ge 1 ] 2>/dev/null
}

note "SIGSTOP / SIGCONT of the prefill mid-run: the request completes, equal"
router_client same "$r_HTTP" "$m" "$G" --prompt-file "$T/long.txt" --max-tokens 8 \
  >"$T/stop.out" 2>&1 &
cpid=$!
wait_while_running "$cpid" 120 running || fail "the request never ran on the prefill worker"
kill -STOP "$p_PID"
kill -0 "$cpid" 2>/dev/null || { kill -CONT "$p_PID"; fail "the request ended before the stop"; }
kill -CONT "$p_PID"
wait "$cpid" || fail "after SIGSTOP/SIGCONT: $(cat "$T/stop.out")"
wait_blocks_free "$d_ADDR"

note "the client leaves while the prefill is stopped mid-run: it ends at a chunk boundary"
curl -s -N --max-time 120 "$r_HTTP/v1/completions" -H 'Content-Type: application/json' \
  -d "$("$PYTHON3" -c 'import json,sys; print(json.dumps({"model": sys.argv[1].rstrip("/").split("/")[-1], "prompt": open(sys.argv[2]).read(), "max_tokens": 8, "stream": True}))' "$m" "$T/long.txt")" \
  >/dev/null 2>&1 &
cpid=$!
wait_while_running "$cpid" 120 running || fail "the request never ran on the prefill worker"
kill -STOP "$p_PID"
kill "$cpid" 2>/dev/null || true
wait "$cpid" 2>/dev/null || true
kill -CONT "$p_PID"
# the request ends (aborted, or done just before the Abort came): nothing
# is left on the prefill worker, nothing leaked on either side
for i in $(seq 1 600); do
  [ "$(status_field "$p_ADDR" running_requests)" = 0 ] && break
  sleep 0.1
done
[ "$(status_field "$p_ADDR" running_requests)" = 0 ] || fail "the aborted request stays on prefill"
wait_blocks_free "$d_ADDR"
for i in $(seq 1 300); do
  [ "$(status_field "$p_ADDR" kv_blocks_free)" = "$p_free0" ] && break
  sleep 0.1
done
[ "$(status_field "$p_ADDR" kv_blocks_free)" = "$p_free0" ] ||
  fail "prefill blocks: $(status_field "$p_ADDR" kv_blocks_free), $p_free0 before"
router_client same "$r_HTTP" "$m" "$G" --prompt-file "$T/long.txt" --max-tokens 8 ||
  fail "a request after the abort"
finish_ok
