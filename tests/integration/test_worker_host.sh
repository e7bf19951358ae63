#!/usr/bin/env bash
# What a worker sets up on its host at start.
#
# --kv-prefault (the default): prefill and decode commit their KV pools at
# start, before they say they are ready, as a device allocates its KV cache
# up front.  Without it each fresh page was committed by the first write
# into it: on prefill's compute thread, inside a request's time (perf:
# clear_page_erms under the sim's first writes of a block, 37% of the
# compute thread's samples in a long-mixed epd-bench serve run; 1k prompts'
# compute 3.4 -> 11-16 ms while they walked fresh blocks).
#  - each daemon's resident memory at ready holds its whole pool with the
#    default, and not without (--no-kv-prefault);
#  - a request through the prefaulted pair equals epd-generate.
#
# --compute-nice (default -10): prefill's compute thread runs ahead of its
# loop and tier threads for the CPU (a late wake-up ends every chunk late:
# a 1M-token prompt in 128 chunks, B's compute over A's by 3.9 ms on
# average at 0, 2.4 at -10, epd-bench overhead); that thread alone.
source "$(dirname "$0")/lib.sh"

# 4 attention layers of 4 heads x 64 in bf16: 16 KiB a layer's block, 64
# KiB a block: 4,096 blocks are a 256 MiB pool
mkdir -p "$T/sim"
printf '%s\n' "name = prefault" "n_layers = 4" "layer_pattern = A" "hidden = 2048" "n_heads = 16" \
  "n_kv_heads = 4" "head_dim = 64" "kv_dtype = BF16" "state_bytes = 0" "active_params = 1.0e9" \
  "total_params = 1.0e9" "weight_bytes = 2" "vocab = 258" "max_context = 8192" \
  >"$T/sim/m.profile"
printf '%s\n' "name = h200" "flops = 5.94e14" "mem_bw = 4.08e12" "hbm_bytes = 141e9" \
  >"$T/sim/a.profile"
printf '%s\n' "model = $T/sim/m.profile" "accel = $T/sim/a.profile" "scale = 1" "devices = 1" \
  "mode = sleep" "seed = 1" >"$T/sim/sim.conf"
M="$T/sim"
POOL_MIB=256

# resident MiB of a process (anonymous, file and shared pages: the decode
# pool is a transport's shared segment)
rss_mib() {
  awk '/^VmRSS:/ { printf "%d", $2 / 1024 }' "/proc/$1/status"
}

# nice value of PID's thread named NAME (stat field 19)
thread_nice() {
  local t
  for t in /proc/"$1"/task/*; do
    if [ "$(cat "$t/comm")" = "$2" ]; then
      sed 's/.*) //' "$t/stat" | awk '{ print $17 }'
      return
    fi
  done
  fail "no thread '$2' in process $1"
}

for mode in prefault none; do
  flag=()
  pflag=()
  [ "$mode" = none ] && flag=(--no-kv-prefault) && pflag=(--compute-nice 0)
  start_daemon d decode --engine sim --model "$M" --worker-id "decode-$mode" --kv-blocks 4096 \
    --state-slots 8 "${flag[@]}"
  start_daemon p prefill --engine sim --model "$M" --worker-id "prefill-$mode" --kv-blocks 4096 \
    --state-slots 8 "${flag[@]}" "${pflag[@]}"
  for n in d p; do
    pid_var="${n}_PID"
    r=$(rss_mib "${!pid_var}")
    note "$mode: $n resident at ready: $r MiB (pool $POOL_MIB MiB)"
    if [ "$mode" = prefault ]; then
      [ "$r" -ge "$POOL_MIB" ] || fail "$n: $r MiB resident with --kv-prefault, under the pool"
    else
      [ "$r" -lt $((POOL_MIB / 2)) ] ||
        fail "$n: $r MiB resident with --no-kv-prefault: the pool was committed anyway"
    fi
  done
  if [ "$(id -u)" = 0 ]; then
    want=-10
    [ "$mode" = none ] && want=0
    n=$(thread_nice "$p_PID" "prefill compute")
    note "$mode: prefill's compute thread at nice $n"
    [ "$n" = "$want" ] || fail "prefill's compute thread at nice $n, not $want"
    n=$(thread_nice "$p_PID" "epd-prefill")
    [ "$n" = 0 ] || fail "prefill's loop thread at nice $n, not 0"
  fi
  if [ "$mode" = prefault ]; then
    grep -q "KV pool: $POOL_MIB MiB committed" "$T/p.log" "$T/d.log" ||
      fail "no 'KV pool: $POOL_MIB MiB committed' line in the logs"
    prompt_of_len 3000 7 >"$T/prompt.txt"
    same_as_colocated "$M" "$p_ADDR" "$d_ADDR" "$T/prompt.txt" 8 --engine sim
    same_as_colocated "$M" "$p_ADDR" "$d_ADDR" "$T/prompt.txt" 8 --engine sim --temperature 0.8 \
      --seed 5
    wait_blocks_free "$d_ADDR"
  fi
  for n in p d; do
    stop_daemon "$n" TERM
    [ "$STOP_RC" = 0 ] || fail "$mode: $n exited $STOP_RC"
  done
done
finish_ok
