#!/usr/bin/env bash
# KV-aware routing (policy prefix-affinity, docs/prefix-cache.md): the
# router sends a prompt to the prefill worker that holds most of it, by the
# KV hints the workers publish in their heartbeats and the prompts it sent
# them itself; every answer equals epd-generate's.
#  - a prompt and five follow-ups sharing its first 18 blocks, through the
#    router: all on one prefill worker, each a hit of 288 tokens there;
#  - eight prompts sent straight to the workers (epd-ctl, the router never
#    sees them), four to each; after a heartbeat, a follow-up of each
#    through the router lands on the worker that holds it (by chance: one
#    in 256), and the decode worker holding the first turn gets the second;
#  - load still counts: twelve cold prompts (no shared first block) spread
#    over both prefill workers (the holder-versus-queue trade is in
#    tests/router/test_epd_router_registry.c, where queues can be set);
#  - the router's hints of a worker (epd_router_worker_kv_hints) equal what
#    it holds: a restarted prefill-0 starts from none, and once it evicts
#    (a pool of 40 blocks) the router forgets the evicted blocks too; a
#    new router at the same address learns every block the workers hold
#    (they hint their whole caches again whenever the router's view of them
#    starts over).
source "$(dirname "$0")/lib.sh"

mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"
start_router r --model "$T/m" --heartbeat-ms 200 --policy prefix-affinity
# decode-side reuse is an up-front worker's (KV on demand keeps nothing)
start_daemon d0 decode --model "$T/m" --worker-id decode-0 --kv-blocks 1024 --state-slots 32 \
  --kv-reserve upfront --router "$r_ADDR"
start_daemon p0 prefill --model "$T/m" --worker-id prefill-0 --router "$r_ADDR"
start_daemon p1 prefill --model "$T/m" --worker-id prefill-1 --router "$r_ADDR"
for w in decode-0 prefill-0 prefill-1; do
  wait_router_state "$r_ADDR" "$w" READY
done
G="$BIN/epd-generate"
kvhints() { # WORKER: the KV blocks the router believes it holds
  local n
  n=$(router_metric "$r_HTTP" "epd_router_worker_kv_hints{worker=\"$1\",pool=\"prefill\"}")
  echo "${n:-none}"
}
queued() { # WORKER: the prompt tokens its last heartbeat said it had queued
  local n
  n=$(router_metric "$r_HTTP" "epd_router_worker_queued_tokens{worker=\"$1\"}")
  echo "${n:-none}"
}
# wait_hints_settle: until the router's hints of each prefill worker are
# exactly the blocks that worker's cache holds (heartbeats carry them), and
# its last heartbeat counts no queued prompt: a load snapshot may be taken
# after a prompt's blocks were cached but before the prompt left the queue
# (the hints are never newer than the load beside them, but can be as new),
# and a worker with another client's 201 queued tokens costs more than the
# 192 cached tokens it saves: the follow-up went to the other worker (1 run
# in 11 at load 5, "the follow-up of the newest prompt left prefill-0")
wait_hints_settle() {
  local i h0 h1 c0 c1 q0 q1
  for i in $(seq 1 300); do
    h0=$(kvhints prefill-0)
    h1=$(kvhints prefill-1)
    c0=$(health_field "$p0_ADDR" prefix_cached_blocks)
    c1=$(health_field "$p1_ADDR" prefix_cached_blocks)
    q0=$(queued prefill-0)
    q1=$(queued prefill-1)
    if [ "$h0" = "$c0" ] && [ "$h1" = "$c1" ] && [ "$q0" = 0 ] && [ "$q1" = 0 ]; then
      return 0
    fi
    sleep 0.1
  done
  fail "router hints $h0 / $h1, the workers hold $c0 / $c1 blocks, queued $q0 / $q1 after 300 polls"
}
count() { # WORKER: prefill requests the router sent it
  local n
  n=$(router_metric "$r_HTTP" "epd_router_worker_requests_total{worker=\"$1\",pool=\"prefill\"}")
  echo "${n:-0}"
}
hits() { # ADDR
  local v
  v=$(health_field "$1" prefix_hit_tokens)
  echo "${v:-0}"
}
same() { # PROMPT_FILE: through the router, equal to epd-generate
  router_client same "$r_HTTP" "$T/m" "$G" --prompt-file "$1" --max-tokens 6 >/dev/null ||
    fail "router answer for $(basename "$1") differs"
}

note "a prompt and five follow-ups: one prefill worker, every follow-up a hit"
A=$(prompt_of_len 300 31)
printf '%s' "$A" >"$T/a"
same "$T/a"
for i in 1 2 3 4 5; do
  printf '%s and follow-up %d' "$A" "$i" >"$T/a$i"
  same "$T/a$i"
done
c0=$(count prefill-0)
c1=$(count prefill-1)
{ [ "$c0" = 6 ] && [ "$c1" = 0 ]; } || { [ "$c0" = 0 ] && [ "$c1" = 6 ]; } ||
  fail "a shared prefix went to both prefill workers ($c0 and $c1)"
h=$(($(hits "$p0_ADDR") + $(hits "$p1_ADDR")))
# BOS + 300 bytes: 18 full blocks shared with the first prompt; the
# follow-ups share " and follow-up " too: 19 blocks from the second on
[ "$h" = $((288 + 4 * 304)) ] || fail "follow-ups hit $h tokens, want $((288 + 4 * 304))"

note "prompts the router never saw: their follow-ups go where their blocks are"
for i in 1 2 3 4 5 6 7 8; do
  prompt_of_len 200 $((40 + i)) >"$T/b$i"
  w=$(( i % 2 ))
  addr_var="p${w}_ADDR"
  same_as_colocated "$T/m" "${!addr_var}" "$d0_ADDR" "$T/b$i" 4
done
wait_hints_settle
before0=$(count prefill-0)
before1=$(count prefill-1)
for i in 1 2 3 4 5 6 7 8; do
  printf '%s, asked again' "$(cat "$T/b$i")" >"$T/b${i}x"
  w=$(( i % 2 ))
  b0=$(count prefill-0)
  same "$T/b${i}x"
  if [ "$w" = 0 ]; then
    [ "$(count prefill-0)" = $((b0 + 1)) ] || fail "follow-up $i did not go to prefill-0, which holds it"
  else
    [ "$(count prefill-0)" = "$b0" ] || fail "follow-up $i did not go to prefill-1, which holds it"
  fi
done
[ $(( $(count prefill-0) - before0 )) = 4 ] && [ $(( $(count prefill-1) - before1 )) = 4 ] ||
  fail "follow-ups: $(( $(count prefill-0) - before0 )) / $(( $(count prefill-1) - before1 ))"
dh=$(health_field "$d0_ADDR" prefix_hit_tokens)
[ "${dh:-0}" -gt 0 ] || fail "the decode worker reused nothing"

note "load: cold prompts spread over both prefill workers"
before0=$(count prefill-0)
before1=$(count prefill-1)
for i in $(seq 1 12); do
  prompt_of_len 100 $((70 + i)) >"$T/c$i"
  same "$T/c$i"
done
n0=$(( $(count prefill-0) - before0 ))
n1=$(( $(count prefill-1) - before1 ))
[ $((n0 + n1)) = 12 ] && [ "$n0" -gt 0 ] && [ "$n1" -gt 0 ] ||
  fail "twelve cold prompts: $n0 on prefill-0, $n1 on prefill-1"

note "restart: the router forgets the old incarnation's blocks"
wait_hints_settle
[ "$(kvhints prefill-0)" -gt 0 ] || fail "prefill-0 holds nothing before its restart"
stop_daemon p0 KILL
start_daemon p0b prefill --model "$T/m" --worker-id prefill-0 --kv-blocks 40 --router "$r_ADDR"
p0_ADDR=$p0b_ADDR
for i in $(seq 1 300); do
  [ "$(kvhints prefill-0)" = 0 ] && break
  sleep 0.1
done
[ "$(kvhints prefill-0)" = 0 ] || fail "the restarted prefill-0 has $(kvhints prefill-0) hints"
wait_router_state "$r_ADDR" prefill-0 READY

note "eviction: the router forgets what a worker evicted"
# straight to prefill-0 (40 blocks): six prompts of 12 full blocks each
for i in 1 2 3 4 5 6; do
  prompt_of_len 200 $((90 + i)) >"$T/e$i"
  same_as_colocated "$T/m" "$p0_ADDR" "$d0_ADDR" "$T/e$i" 4
done
wait_hints_settle
ev=$(health_field "$p0_ADDR" prefix_evictions)
[ "${ev:-0}" -gt 0 ] || fail "prefill-0 evicted nothing"
h0=$(kvhints prefill-0)
[ "$h0" -gt 0 ] && [ "$h0" -le 40 ] || fail "the router believes prefill-0 holds $h0 blocks"
# the newest prompt's blocks are still there: its follow-up goes to prefill-0
b0=$(count prefill-0)
printf '%s, asked again' "$(cat "$T/e6")" >"$T/e6x"
same "$T/e6x"
[ "$(count prefill-0)" = $((b0 + 1)) ] || fail "the follow-up of the newest prompt left prefill-0"

note "a new router at the same address: the workers hint every block they hold again"
# the new router's hints start empty; the workers re-register (heartbeats:
# unknown) and resend their whole caches, as they do after any heartbeat
# whose hints were lost (a slow router: 'Deadline Exceeded').  Before, the
# router learnt only later events: hints 0 / 0 against 39 / 94 blocks.
ctl=${r_ADDR}
stop_daemon r
start_daemon r2 router --model "$T/m" --listen 127.0.0.1:0 --control-addr "$ctl" \
  --heartbeat-ms 200 --policy prefix-affinity
http=$(sed -n 's/.*http=\([^ ]*\).*/\1/p' "$T/r2.ready")
r_HTTP="http://$http"
r_ADDR=$r2_ADDR
for w in decode-0 prefill-0 prefill-1; do
  wait_router_state "$r_ADDR" "$w" READY
done
[ "$(health_field "$p0_ADDR" prefix_cached_blocks)" -gt 0 ] || fail "prefill-0 holds nothing"
wait_hints_settle
echo "new router: hints $(kvhints prefill-0) / $(kvhints prefill-1)"
finish_ok
