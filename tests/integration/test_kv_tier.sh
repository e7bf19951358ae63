#!/usr/bin/env bash
# The prefix cache's host and disk tier (kv/epd_kvtier.c,
# prefill/epd_prefill_tier.c, docs/prefix-cache.md "Host and disk tier"), for the
# hybrid model (LLA: checkpoints travel with their blocks) and an
# attention-only one.  Every answer equals `epd-generate`'s.  Per model:
#  1. a 40-block pool, a host tier of a few blocks, a disk directory with
#     --kv-disk-persist: prompts push the first one out of the pool and out
#     of the host tier (spilled to disk); asked again it is restored from
#     disk (counters) and its answer is exact;
#  2. the worker stopped (its files stay), a payload byte flipped in one of
#     the first prompt's files (one the log says it restored, deep in the
#     chain): restarted on the same directory, the blocks before it are
#     restored from disk, that one fails its checksum (counter, the log
#     names the file) and is computed instead: the answer is still exact;
#  3. stopped again, a foreign file (written by a worker of the other
#     model) and a truncated file of ours dropped in: restarted, both are
#     refused with a log line each (foreign: "written by another model or
#     KV layout"), the answer is still exact;
#  4. a 130-block pool and the default host tier: a 101-block prompt, then
#     another whose admission evicts 71 of the first one's blocks (more than
#     the loop copies itself): a copy thread copies them out (the log says
#     so) and no chunk of the second prompt writes one before, both answers
#     exact; the first prompt again hits all its 100 full blocks, 71 of them
#     restored from the host tier, and its answer is exact (had the second
#     run written over a block before its copy, this answer would differ).
source "$(dirname "$0")/lib.sh"

mkmodel "$T/hybrid" "${TINY_MODEL_FLAGS[@]}"
mkmodel "$T/attn" --layers 2 --dim 64 --heads 4 --kv-heads 2 --layer-pattern A --ffn 128 \
  --vocab 258 --vision 0 --max-context 2048 --seed 11

pf() { # NAME TEXT: a prompt file
  printf '%s' "$2" >"$T/$1"
}
counter() { # NAME ADDR: a prefix-cache counter of a prefill worker
  local v
  v=$(health_field "$2" "prefix_$1")
  echo "${v:-0}"
}
# counter_above NAME ADDR N: waits (30 s at most) until the counter is over
# N — the tier stores on a thread of its own, so its counters follow the
# evictions by a moment
counter_above() {
  local i
  for i in $(seq 1 300); do
    [ "$(counter "$1" "$2")" -gt "$3" ] && return 0
    sleep 0.1
  done
  return 1
}
for i in 1 2 3 4 5; do
  pf "p$i" "$(prompt_of_len 300 $((30 + i)))" # BOS + 300 = 301 tokens: 19 blocks, 18 full
done

note "bad tier flags are refused with a clear line"
out=$(timeout 60 "$BIN/epd-prefill" --model "$T/attn" --kv-disk-bytes 1000 2>&1) &&
  fail "--kv-disk-bytes without --kv-disk was accepted"
grep -q -- "--kv-disk-bytes and --kv-disk-persist need --kv-disk DIR" <<<"$out" ||
  fail "no clear line for --kv-disk-bytes without --kv-disk: $out"
touch "$T/plain"
out=$(timeout 60 "$BIN/epd-prefill" --model "$T/attn" --kv-disk "$T/plain/sub" 2>&1) &&
  fail "an unusable --kv-disk directory was accepted"
grep -q "kv tier: cannot create directory $T/plain/sub" <<<"$out" ||
  fail "no clear line for an unusable --kv-disk: $(tail -n 3 <<<"$out")"

start_daemon d decode --model "$T/hybrid" --worker-id decode-h --kv-blocks 1024 --state-slots 16
start_daemon da decode --model "$T/attn" --worker-id decode-a --kv-blocks 1024 --state-slots 16

# tier_prefill NAME MODEL DIR: a prefill worker with a 40-block pool, a
# host tier of about 4 blocks and a persistent disk tier in DIR
tier_prefill() {
  start_daemon "$1" prefill --model "$2" --worker-id "prefill-$1" --kv-blocks 40 --state-slots 4 \
    --kv-host-bytes 16384 --kv-disk "$3" --kv-disk-bytes 50000000 --kv-disk-persist \
    --log-level debug
}

run_model() { # MODEL_NAME DECODE_ADDR: steps 1 and 2
  local m=$1 dd=$2 dir="$T/tier-$1" a addr n files victim
  note "$m: prompts push the first out of the pool and the host tier"
  tier_prefill "${m}1" "$T/$m" "$dir"
  a="${m}1_ADDR"
  addr=${!a}
  grep -q "kv tier on" "$T/${m}1.log" || fail "$m: the tier is not on"
  for i in 1 2 3 4 5; do
    same_as_colocated "$T/$m" "$addr" "$dd" "$T/p$i" 12
  done
  [ "$(counter evictions "$addr")" -gt 18 ] || fail "$m: evictions=$(counter evictions "$addr")"
  counter_above tier_spilled "$addr" 0 || fail "$m: nothing spilled to disk"
  counter_above tier_disk_bytes "$addr" 0 || fail "$m: tier_disk_bytes=0"
  [ "$(counter tier_host_bytes "$addr")" -le 16384 ] || fail "$m: host tier over its bound"
  note "$m: the first prompt again: restored from disk, the same answer"
  n=$(counter hit_tokens "$addr")
  same_as_colocated "$T/$m" "$addr" "$dd" "$T/p1" 12
  [ "$(counter tier_restored_disk "$addr")" -gt 0 ] ||
    fail "$m: nothing restored from disk (restored_host=$(counter tier_restored_host "$addr"))"
  [ $(( $(counter hit_tokens "$addr") - n )) = 288 ] ||
    fail "$m: the restored prompt hit $(( $(counter hit_tokens "$addr") - n )) tokens, want 288"
  [ "$(counter tier_checksum_failures "$addr")" = 0 ] || fail "$m: checksum failures"
  same_as_colocated "$T/$m" "$addr" "$dd" "$T/p1" 12 --temperature 0.8 --seed 5
  stop_daemon "${m}1"
  [ "$STOP_RC" = 0 ] || fail "$m: prefill exited $STOP_RC"
  files=$(find "$dir" -maxdepth 1 -type f | wc -l)
  [ "$files" -gt 18 ] || fail "$m: $files files kept with --kv-disk-persist"

  note "$m: a flipped payload byte in a restored file: refused at restore, the answer exact"
  # the files the first worker restored for p1, in chain order: corrupt the 10th
  mapfile -t restored < <(sed -n 's/.*kv tier: restored \([^ ]*\)$/\1/p' "$T/${m}1.log")
  [ "${#restored[@]}" -ge 18 ] || fail "$m: ${#restored[@]} restored files logged"
  victim=${restored[9]}
  [ -f "$victim" ] || fail "$m: $victim is gone"
  python3 - "$victim" <<'EOF'
import sys
p = sys.argv[1]
b = bytearray(open(p, 'rb').read())
b[144 + (len(b) - 144) // 2] ^= 0x10  # a byte of the compressed payload
open(p, 'wb').write(bytes(b))
EOF
  tier_prefill "${m}2" "$T/$m" "$dir"
  a="${m}2_ADDR"
  addr=${!a}
  grep -q "kv tier: $dir: [1-9][0-9]* blocks of earlier runs" "$T/${m}2.log" ||
    fail "$m: the restarted worker indexed no files"
  same_as_colocated "$T/$m" "$addr" "$dd" "$T/p1" 12
  [ "$(counter tier_checksum_failures "$addr")" = 1 ] ||
    fail "$m: tier_checksum_failures=$(counter tier_checksum_failures "$addr"), want 1"
  [ "$(counter tier_restored_disk "$addr")" = 9 ] ||
    fail "$m: restored $(counter tier_restored_disk "$addr") blocks from disk after the restart, want 9"
  grep -q "kv tier: block in $victim fails its checksum" "$T/${m}2.log" ||
    fail "$m: no log line names the corrupt file"
  [ ! -e "$victim" ] || fail "$m: the corrupt file is still there"
  same_as_colocated "$T/$m" "$addr" "$dd" "$T/p2" 12 --temperature 0.7 --seed 3
  stop_daemon "${m}2"
}

run_refusals() { # MODEL_NAME DECODE_ADDR FOREIGN_FILE: step 3
  local m=$1 dd=$2 dir="$T/tier-$1" a addr trunc foreign
  note "$m: a foreign file and a truncated one are refused"
  mapfile -t restored < <(sed -n 's/.*kv tier: restored \([^ ]*\)$/\1/p' "$T/${m}1.log")
  foreign=$3
  cp "$foreign" "$dir/"
  trunc=${restored[3]}
  [ -f "$trunc" ] || fail "$m: $trunc is gone"
  truncate -s 100 "$trunc"
  tier_prefill "${m}3" "$T/$m" "$dir"
  a="${m}3_ADDR"
  addr=${!a}
  grep -q "kv tier: refusing file $dir/$(basename "$foreign"): written by another model or KV layout (left in place)" "$T/${m}3.log" ||
    fail "$m: no log line refuses the foreign file"
  grep -q "kv tier: refusing file $trunc: truncated" "$T/${m}3.log" ||
    fail "$m: no log line refuses the truncated file"
  same_as_colocated "$T/$m" "$addr" "$dd" "$T/p1" 12
  # (epd-ctl prints the counters once a request came)
  [ "$(counter tier_refused_files "$addr")" = 2 ] ||
    fail "$m: tier_refused_files=$(counter tier_refused_files "$addr"), want 2"
  [ "$(counter tier_restored_disk "$addr")" = 3 ] ||
    fail "$m: restored $(counter tier_restored_disk "$addr") blocks, want the 3 before the truncated one"
  [ -e "$dir/$(basename "$foreign")" ] || fail "$m: the foreign file was deleted"
  same_as_colocated "$T/$m" "$addr" "$dd" "$T/p3" 12 --temperature 0.6 --seed 9
  stop_daemon "${m}3"
}

run_large_eviction() { # MODEL_NAME DECODE_ADDR: step 4
  local m=$1 dd=$2 a addr n
  note "$m: an admission evicting 71 blocks: copied out off the loop, restored exact"
  pf "l1_$m" "$(prompt_of_len 1600 71)" # BOS + 1600: 101 blocks, 100 full
  pf "l2_$m" "$(prompt_of_len 1600 72)"
  start_daemon "${m}4" prefill --model "$T/$m" --worker-id "prefill-${m}4" --kv-blocks 130 \
    --state-slots 4 --log-level debug
  a="${m}4_ADDR"
  addr=${!a}
  same_as_colocated "$T/$m" "$addr" "$dd" "$T/l1_$m" 8
  same_as_colocated "$T/$m" "$addr" "$dd" "$T/l2_$m" 8
  [ "$(counter evictions "$addr")" = 71 ] || fail "$m: evictions=$(counter evictions "$addr")"
  n=$(counter hit_tokens "$addr")
  same_as_colocated "$T/$m" "$addr" "$dd" "$T/l1_$m" 8
  [ $(( $(counter hit_tokens "$addr") - n )) = 1600 ] ||
    fail "$m: the first prompt again hit $(( $(counter hit_tokens "$addr") - n )) tokens, want 1600"
  [ "$(counter tier_restored_host "$addr")" = 71 ] ||
    fail "$m: restored $(counter tier_restored_host "$addr") blocks from the host tier, want 71"
  [ "$(counter tier_checksum_failures "$addr")" = 0 ] || fail "$m: checksum failures"
  stop_daemon "${m}4"
  [ "$STOP_RC" = 0 ] || fail "$m: prefill exited $STOP_RC"
  grep -q "admission evicts 71 blocks: the copy thread copies them out" "$T/${m}4.log" ||
    fail "$m: the 71 evictions were not copied out by the copy thread (no log line)"
}

run_large_eviction attn "$da_ADDR"
run_large_eviction hybrid "$d_ADDR"

# each model's foreign file comes from the other's directory
run_model attn "$da_ADDR"
run_model hybrid "$d_ADDR"
f_attn=$(find "$T/tier-attn" -maxdepth 1 -type f -name '[0-9a-f]*' -print -quit)
f_hybrid=$(find "$T/tier-hybrid" -maxdepth 1 -type f -name '[0-9a-f]*' -print -quit)
[ -n "$f_attn" ] && [ -n "$f_hybrid" ] || fail "no files in the tier directories"
run_refusals attn "$da_ADDR" "$f_hybrid"
run_refusals hybrid "$d_ADDR" "$f_attn"
finish_ok
