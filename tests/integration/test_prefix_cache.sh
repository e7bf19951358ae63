#!/usr/bin/env bash
# The prefix cache (prefill/epd_prefill_cache.c, docs/prefix-cache.md):
# a hit gives exactly the tokens a miss gives — every answer here equals
# `epd-generate`'s, which computes the whole prompt — and the counters
# prove which path each request took:
#  - hybrid model (linear + attention), checkpoints every 4 blocks, replay
#    budget 48 tokens: a miss; the same prompt (hit at its last-block
#    checkpoint); hits at a checkpoint, past one (replay inside the budget)
#    and before the first one (replay from the empty state); greedy and
#    seeded; concurrent requests sharing a prefix;
#  - checkpoints only at each prompt's end, budget 32: a replay beyond the
#    budget cuts the hit back (recomputed), the next turn of a chat hits
#    its checkpoint;
#  - attention-only model: hits at any block, nothing replayed;
#  - a pool too small to keep everything: evictions, same answers;
#  - --no-prefix-cache: nothing cached;
#  - images (through the router, the prefill worker encodes): a long text,
#    an image, a question — other questions hit past the image, another
#    image at the same place does not.
source "$(dirname "$0")/lib.sh"

mkmodel "$T/hybrid" "${TINY_MODEL_FLAGS[@]}"
mkmodel "$T/attn" --layers 2 --dim 64 --heads 4 --kv-heads 2 --layer-pattern A --ffn 128 \
  --vocab 258 --vision 0 --max-context 2048 --seed 11
CTL_FLAGS=""

pf() { # NAME TEXT: a prompt file
  printf '%s' "$2" >"$T/$1"
}
# counter NAME [ADDR]: a prefill worker's prefix-cache counter (0 before any request)
counter() {
  local v
  v=$(health_field "${2:-$P}" "prefix_$1")
  echo "${v:-0}"
}
# expect_delta NAME WANT CMD...: runs CMD; the counter must grow by exactly WANT
expect_delta() {
  local name=$1 want=$2 before after
  shift 2
  before=$(counter "$name")
  "$@"
  after=$(counter "$name")
  [ $((after - before)) = "$want" ] || fail "prefix_$name grew by $((after - before)), want $want ($*)"
}

A=$(prompt_of_len 300 21)                   # BOS + 300 = 301 tokens: 18 full blocks
pf a "$A"
pf a_more "$A and then some more words for a second turn"
pf at192 "${A:0:191}: a question that shares 192 tokens"     # BOS + 191 = 12 blocks
pf past "${A:0:239}? another one sharing 15 blocks"            # hit 240: checkpoint 192, replay 48
pf before "${A:0:31}! shares only two blocks with the others"  # hit 32: no checkpoint, replay 32
pf past2 "${A:0:239}? and a different continuation"             # the same hit, seeded
pf near "${A:0:279}; shares 17 blocks"                         # hit 272: checkpoint 256, replay 16

start_daemon d decode --model "$T/hybrid" --worker-id decode-0 --kv-blocks 2048 --state-slots 64
start_daemon p prefill --model "$T/hybrid" --worker-id prefill-0 --kv-blocks 512 --state-slots 16 \
  --prefix-ckpt-every 4 --prefix-replay-tokens 48
P=$p_ADDR
D=$d_ADDR
grep -q "prefix cache on" "$T/p.log" || fail "the prefix cache is not on by default"

note "hybrid: a miss, then the same prompt again (a hit at its last block's checkpoint)"
expect_delta hit_tokens 0 same_as_colocated "$T/hybrid" "$P" "$D" "$T/a" 24
[ "$(counter computed_tokens)" = 301 ] || fail "the miss computed $(counter computed_tokens) tokens"
[ "$(counter checkpoints_taken)" = 5 ] || fail "checkpoints after 4, 8, 12, 16 and 18 blocks: $(counter checkpoints_taken)"
expect_delta hit_tokens 288 same_as_colocated "$T/hybrid" "$P" "$D" "$T/a" 24 --temperature 0.8 --top-p 0.9 --seed 7
[ "$(counter replayed_tokens)" = 0 ] || fail "a hit at a checkpoint replayed tokens"
[ "$(counter computed_tokens)" = 314 ] || fail "the hit computed $(( $(counter computed_tokens) - 301 )) tokens, want 13"

note "hybrid: the next turn of the conversation hits the whole first prompt"
expect_delta hit_tokens 288 same_as_colocated "$T/hybrid" "$P" "$D" "$T/a_more" 24
expect_delta replayed_tokens 0 same_as_colocated "$T/hybrid" "$P" "$D" "$T/a_more" 16 --temperature 0.7 --seed 3

note "hybrid: a hit exactly at a checkpoint (12 blocks)"
expect_delta hit_tokens 192 same_as_colocated "$T/hybrid" "$P" "$D" "$T/at192" 24
[ "$(counter replayed_tokens)" = 0 ] || fail "a hit at a checkpoint replayed tokens"

note "hybrid: hits past a checkpoint, replayed inside the budget (greedy and seeded)"
expect_delta replayed_tokens 48 same_as_colocated "$T/hybrid" "$P" "$D" "$T/past" 24
expect_delta replayed_tokens 48 same_as_colocated "$T/hybrid" "$P" "$D" "$T/past2" 24 --temperature 0.9 --top-k 40 --seed 11
expect_delta replayed_tokens 16 same_as_colocated "$T/hybrid" "$P" "$D" "$T/near" 24
[ "$(counter replay_cut)" = 0 ] || fail "a replay inside the budget was cut"

note "hybrid: a hit before the first checkpoint (replayed from the empty state)"
expect_delta replayed_tokens 32 same_as_colocated "$T/hybrid" "$P" "$D" "$T/before" 24
[ "$(counter checkpoints_restored)" -ge 4 ] || fail "checkpoints_restored=$(counter checkpoints_restored)"

note "hybrid: 8 concurrent requests sharing the first 12 blocks"
for i in 1 2 3 4 5 6 7 8; do
  pf "c$i" "${A:0:191} concurrent question number $i, asked at once"
done
jobs_=()
for i in 1 2 3 4 5 6 7 8; do
  same_as_colocated "$T/hybrid" "$P" "$D" "$T/c$i" 16 --temperature 0.5 --seed "$i" &
  jobs_+=($!)
done
for job in "${jobs_[@]}"; do
  wait "$job" || fail "a concurrent request differs from epd-generate"
done

note "checkpoints only at each prompt's end, replay budget 32"
start_daemon p2 prefill --model "$T/hybrid" --worker-id prefill-1 --kv-blocks 512 --state-slots 16 \
  --prefix-ckpt-every 0 --prefix-replay-tokens 32
P=$p2_ADDR
same_as_colocated "$T/hybrid" "$P" "$D" "$T/a" 20
[ "$(counter checkpoints_taken)" = 1 ] || fail "checkpoints_taken=$(counter checkpoints_taken), want 1"
note "a replay of 240 tokens is over the budget: the hit is cut back and recomputed"
expect_delta replay_cut 1 same_as_colocated "$T/hybrid" "$P" "$D" "$T/past" 20
[ "$(counter hit_tokens)" = 0 ] || fail "a cut hit counted $(counter hit_tokens) hit tokens"
note "the next turn hits the first prompt's end checkpoint"
expect_delta hit_tokens 288 same_as_colocated "$T/hybrid" "$P" "$D" "$T/a_more" 20 --temperature 0.6 --seed 2

note "attention-only model: hits at any block boundary, nothing replayed"
start_daemon ad decode --model "$T/attn" --worker-id decode-a --kv-blocks 1024 --state-slots 16
start_daemon ap prefill --model "$T/attn" --worker-id prefill-a --kv-blocks 256 --state-slots 8
P=$ap_ADDR
same_as_colocated "$T/attn" "$P" "$ad_ADDR" "$T/a" 20
expect_delta hit_tokens 240 same_as_colocated "$T/attn" "$P" "$ad_ADDR" "$T/past" 20 --temperature 0.8 --seed 4
expect_delta hit_tokens 272 same_as_colocated "$T/attn" "$P" "$ad_ADDR" "$T/near" 20
[ "$(counter replayed_tokens)" = 0 ] || fail "an attention-only model replayed tokens"

note "a pool of 40 blocks: cached blocks are evicted for new prompts, answers unchanged"
pf b "$(prompt_of_len 300 22)"
pf c "$(prompt_of_len 300 23)"
start_daemon sp prefill --model "$T/hybrid" --worker-id prefill-s --kv-blocks 40 --state-slots 4 \
  --prefix-ckpt-every 4
P=$sp_ADDR
for f in a b past c a near b; do
  same_as_colocated "$T/hybrid" "$P" "$D" "$T/$f" 12
done
[ "$(counter evictions)" -gt 0 ] || fail "no eviction in a 40-block pool"
[ "$(counter cached_blocks)" -le 40 ] || fail "cached_blocks=$(counter cached_blocks) of 40"

note "decode-side reuse (--kv-reserve upfront): the next turn's prompt blocks decode kept are not written again"
# KV on demand (the default: decode-0 above) keeps nothing
grep -q "decode-side reuse off: KV on demand" "$T/d.log" || fail "decode-side reuse on under KV on demand"
[ "$(counter hit_tokens "$D")" = 0 ] && [ "$(counter cached_blocks "$D")" = 0 ] ||
  fail "an on-demand decode worker reused $(counter hit_tokens "$D") tokens"
start_daemon d2 decode --model "$T/hybrid" --worker-id decode-2 --kv-blocks 512 --state-slots 16 \
  --kv-reserve upfront
start_daemon d3 decode --model "$T/hybrid" --worker-id decode-3 --kv-blocks 512 --state-slots 16 \
  --kv-reserve upfront --no-prefix-cache
start_daemon p3 prefill --model "$T/hybrid" --worker-id prefill-3 --kv-blocks 512 --state-slots 16
sent() { health_field "$p3_ADDR" kv_bytes_sent; }
same_as_colocated "$T/hybrid" "$p3_ADDR" "$d2_ADDR" "$T/a" 12
same_as_colocated "$T/hybrid" "$p3_ADDR" "$d3_ADDR" "$T/a" 12
s0=$(sent)
same_as_colocated "$T/hybrid" "$p3_ADDR" "$d3_ADDR" "$T/a_more" 12 --temperature 0.7 --seed 5
s1=$(sent)
[ "$(counter hit_tokens "$d2_ADDR")" = 0 ] || fail "decode hit before the second turn"
same_as_colocated "$T/hybrid" "$p3_ADDR" "$d2_ADDR" "$T/a_more" 12 --temperature 0.7 --seed 5
s2=$(sent)
[ "$(counter hit_tokens "$d2_ADDR")" = 288 ] || fail "decode reused $(counter hit_tokens "$d2_ADDR") tokens, want 288"
[ $((s2 - s1)) -lt $((s1 - s0)) ] || fail "with decode-side reuse prefill wrote $((s2 - s1)) bytes, without $((s1 - s0))"
note "  KV bytes written for the second turn: $((s1 - s0)) without reuse, $((s2 - s1)) with"
d_rx=$(health_field "$d2_ADDR" kv_bytes_received)
p_tx=$(health_field "$p3_ADDR" kv_bytes_sent)
d3_rx=$(health_field "$d3_ADDR" kv_bytes_received)
[ $((d_rx + d3_rx)) = "$p_tx" ] || fail "bytes received by the decoders ($d_rx + $d3_rx) != sent ($p_tx)"
same_as_colocated "$T/hybrid" "$p3_ADDR" "$d2_ADDR" "$T/a_more" 12 # a third time: all of it

note "--no-prefix-cache: every prompt computed whole"
start_daemon np prefill --model "$T/hybrid" --worker-id prefill-n --kv-blocks 256 --state-slots 4 \
  --no-prefix-cache
same_as_colocated "$T/hybrid" "$np_ADDR" "$D" "$T/a" 12
same_as_colocated "$T/hybrid" "$np_ADDR" "$D" "$T/a" 12
[ -z "$(health_field "$np_ADDR" prefix_requests)" ] || fail "a prefill without a cache counts hits"
wait_blocks_free "$D" 20

note "images: a long text, an image, a question (the prefill worker encodes)"
mkmodel "$T/vis" "${TINY_VISION_FLAGS[@]}"
mkimage png "$T/i1.png" 40 30 1
mkimage png "$T/i2.png" 40 30 2
start_router r --model "$T/vis" --heartbeat-ms 200
start_daemon vd decode --model "$T/vis" --worker-id decode-v --kv-blocks 1024 --state-slots 16 \
  --router "$r_ADDR"
start_daemon vp prefill --model "$T/vis" --worker-id prefill-v --router "$r_ADDR" --embed-slots 8 \
  --prefix-ckpt-every 2
wait_router_state "$r_ADDR" decode-v READY
wait_router_state "$r_ADDR" prefill-v READY
P=$vp_ADDR
LONG=$(prompt_of_len 100 5)
G="$BIN/epd-generate"
router_client images "$r_HTTP" "$T/vis" "$G" --images "$T/i1.png" --max-tokens 10 \
  --text "$LONG <|image|> and after the image a first question?" || fail "image, first"
h0=$(counter hit_tokens)
router_client images "$r_HTTP" "$T/vis" "$G" --images "$T/i1.png" --max-tokens 10 \
  --text "$LONG <|image|> and after the image another thing entirely." --temperature 0.8 \
  --seed 9 || fail "image, second question"
h1=$(counter hit_tokens)
# BOS, "<|user|>\n" (9), 100 bytes, " ", the image at 111..114, then " and after
# the image a" in common: 137 tokens, 8 full blocks — past the image
[ $((h1 - h0)) = 128 ] || fail "the second question hit $((h1 - h0)) tokens, want 128 (past the image)"
router_client images "$r_HTTP" "$T/vis" "$G" --images "$T/i2.png" --max-tokens 10 \
  --text "$LONG <|image|> and after the image another thing entirely." --temperature 0.8 \
  --seed 9 || fail "another image at the same place"
h2=$(counter hit_tokens)
# the block holding position 111 (96..111) has another image: 6 blocks
[ $((h2 - h1)) = 96 ] || fail "another image at the same place hit $((h2 - h1)) tokens, want 96"

note "cache_salt: a tenant's blocks serve only the same salt; the router's /metrics count hits"
complete() { # SALT: the text of a greedy completion of $LONG with that salt
  curl -s --max-time 60 "$r_HTTP/v1/completions" -d "{\"model\": \"vis\", \"prompt\": \"$LONG salted\",
    \"max_tokens\": 8, \"temperature\": 0, \"cache_salt\": \"$1\"}" |
    "$PYTHON3" -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["text"])'
}
t1=$(complete tenant-1)
h3=$(counter hit_tokens)
t2=$(complete tenant-2)
h4=$(counter hit_tokens)
[ "$h4" = "$h3" ] || fail "another salt hit $((h4 - h3)) tokens"
t3=$(complete tenant-1)
h5=$(counter hit_tokens)
[ $((h5 - h4)) = 96 ] || fail "the same salt hit $((h5 - h4)) tokens, want 96"
[ "$t1" = "$t2" ] && [ "$t1" = "$t3" ] || fail "salted answers differ: '$t1' '$t2' '$t3'"
for i in $(seq 1 50); do # the heartbeat carries the counters
  [ "$(router_metric "$r_HTTP" epd_router_prefix_hit_tokens_total)" = "$h5" ] && break
  sleep 0.1
done
[ "$(router_metric "$r_HTTP" epd_router_prefix_hit_tokens_total)" = "$h5" ] ||
  fail "router: epd_router_prefix_hit_tokens_total=$(router_metric "$r_HTTP" epd_router_prefix_hit_tokens_total), the worker says $h5"
[ -n "$(router_metric "$r_HTTP" 'epd_router_worker_prefix_cached_blocks{worker="prefill-v"}')" ] ||
  fail "no per-worker cached blocks in /metrics"
finish_ok
