#!/usr/bin/env bash
# KV on demand (proto/README.md rules 30-33): a decode pool far too small
# for the requests it admits together.  Each request holds its prompt's
# blocks plus a small headroom and grows as it generates; when the pool runs
# dry the newest is preempted (its blocks freed), prefilled again by the
# prefill worker with prompt + generated tokens, and continues where it
# stopped.  Every answer — greedy, seeded and seeded with penalties
# (presence, frequency, repetition), streaming and not, completions
# and chat — equals epd-generate's (one uninterrupted stream, the same
# tokens); the router's /metrics count preemptions and recomputed tokens;
# no block is held at the end; clients that leave mid-burst leave no block
# held either.  Then the same with a model without linear layers (no state
# slot to rebuild).
source "$(dirname "$0")/lib.sh"

G="$BIN/epd-generate"

# run_cluster NAME MODEL_FLAGS...: the cluster on a new model; sets H, D.
run_cluster() {
  local name=$1
  shift
  mkmodel "$T/$name" "$@"
  start_router "r$name" --model "$T/$name" --heartbeat-ms 100 --queue-timeout-ms 120000
  local ra="r${name}_ADDR" rh="r${name}_HTTP"
  # 16 blocks of 16 tokens: a request of ~40-60 prompt tokens and 160 more
  # needs 13-14 of them at its end, so no two can finish side by side
  start_daemon "d$name" decode --model "$T/$name" --worker-id "decode-$name" --kv-blocks 16 \
    --state-slots 16 --kv-headroom-tokens 4 --router "${!ra}"
  start_daemon "p$name" prefill --model "$T/$name" --worker-id "prefill-$name" --router "${!ra}"
  wait_router_state "${!ra}" "decode-$name" READY
  wait_router_state "${!ra}" "prefill-$name" READY
  H=${!rh}
  local da="d${name}_ADDR"
  D=${!da}
}

# preempted_burst SAMPLING: 10 long requests at once; all must succeed,
# and the decode worker itself (its Status, not a heartbeat) counts
# preemptions during this very burst: these answers went through a resume.
preempted_burst() {
  local before after
  before=$(status_field "$D" preemptions)
  router_client burst "$H" "$T/$MODEL" "$G" --count 10 --max-tokens 160 --min-tokens 120 \
    --prompts 8 --sampling "$1" --no-429 || fail "a preempted request's answer ($1 sampling)"
  after=$(status_field "$D" preemptions)
  echo "decode preemptions during the $1 burst: $((after - before))"
  [ "${after:-0}" -gt "${before:-0}" ] || fail "no request was preempted in the $1 burst"
}

# metric_positive NAME: waits (heartbeats) until the router's counter > 0.
metric_positive() {
  local n i
  for i in $(seq 1 100); do
    n=$(router_metric "$H" "$1")
    [ "${n:-0}" -gt 0 ] && { echo "$1 $n"; return 0; }
    sleep 0.1
  done
  fail "$1 is ${n:-absent} after the burst"
}

# clients_leave: 10 long streams at once; once the decode worker has
# preempted one of them, every client disconnects (the client process is
# killed): the requests — running, preempted, or being prefilled again —
# are aborted, no block stays held, and the worker serves on.
clients_leave() {
  local before now i pid
  before=$(status_field "$D" preemptions)
  "$PYTHON3" "$(dirname "$0")/epd_router_client.py" burst "$H" "$T/$MODEL" "$G" --count 10 \
    --max-tokens 160 --min-tokens 120 --prompts 8 --sampling seeded --no-429 \
    >"$T/leave.out" 2>&1 &
  pid=$!
  for i in $(seq 1 600); do
    now=$(status_field "$D" preemptions)
    [ "${now:-0}" -gt "${before:-0}" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  [ "${now:-0}" -gt "${before:-0}" ] || fail "no preemption before the clients left"
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  wait_blocks_free "$D" 60
  n=$(status_field "$D" running_requests)
  [ "${n:-1}" = 0 ] || fail "decode still runs $n requests after every client left"
}

for MODEL in hybrid dense; do
  if [ "$MODEL" = hybrid ]; then
    run_cluster hybrid "${TINY_MODEL_FLAGS[@]}"
  else
    run_cluster dense --layers 3 --dim 64 --heads 4 --kv-heads 2 --layer-pattern A --ffn 128 \
      --vocab 258 --vision 0 --max-context 2048 --seed 9
  fi
  note "$MODEL: greedy requests preempted and resumed"
  preempted_burst greedy
  note "$MODEL: seeded requests preempted and resumed"
  preempted_burst seeded
  # the resume GenerateRequest carries the penalties (it once carried only
  # temperature, top-p, top-k and seed: the resumed token differed)
  note "$MODEL: seeded requests with penalties preempted and resumed"
  preempted_burst penalized
  if [ "$MODEL" = hybrid ]; then
    note "$MODEL: clients leave while their requests are preempted and resumed"
    clients_leave
    note "$MODEL: and the worker serves on"
    preempted_burst greedy
  fi
  metric_positive epd_router_decode_preemptions_total
  metric_positive epd_router_decode_recomputed_tokens_total
  n=$(router_metric "$H" 'epd_router_worker_preemptions_total{worker="decode-'"$MODEL"'"}')
  [ "${n:-0}" -gt 0 ] || fail "no preemption counted for decode-$MODEL"
  n=$(router_metric "$H" 'epd_router_errors_total{kind="upstream"}')
  [ "${n:-0}" = 0 ] || fail "$n requests failed upstream"
  wait_blocks_free "$D"
done
finish_ok
