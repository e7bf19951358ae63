#!/usr/bin/env bash
# epd-bench overhead's options, both modes from one table
# (bench/epd_bench_overhead_opts.c): an option takes effect only in the
# modes it names (the one-host mode refuses the attach mode's, the attach
# mode the daemons' flags), each mode's --help is its own, and a bad value
# is named with exit 2 in either; a length over an engine's window is
# refused up front.  No daemon is started: every case stops at parsing (or,
# for the accepted ones, at the missing cluster secret).
source "$(dirname "$0")/../integration/lib.sh"
BENCH="$BIN/epd-bench"

# expect RC PATTERN ARGS...: exit status RC and PATTERN in stdout+stderr
expect() {
  local want=$1 pat=$2 rc=0
  shift 2
  "$BENCH" overhead "$@" >"$T/out" 2>&1 || rc=$?
  [ "$rc" = "$want" ] || { cat "$T/out"; fail "overhead $*: exit $rc, not $want"; }
  grep -q -- "$pat" "$T/out" || { cat "$T/out"; fail "overhead $*: no '$pat'"; }
  echo "overhead $*: exit $rc, $(grep -m1 -- "$pat" "$T/out")"
}
ATT=(--attach-prefill 127.0.0.1:1 --attach-decode 127.0.0.1:2)

note "each mode's --help"
expect 0 '^usage: epd-bench overhead \[options\]' --help
expect 0 '--probes N' "${ATT[@]}" --help

note "the attach mode's options refused by the one-host mode"
for o in --probes --data-addr --cluster-secret-file; do
  expect 2 "unknown option $o" "$o" 1
done

note "the daemons' flags refused by the attach mode"
for o in --engines --transports --groups --kv-dtype --verify --scale --ref-lengths; do
  expect 2 "$o is not an option of the attach mode" "${ATT[@]}" "$o" x
done

note "options of both modes: parsed in each (a bad value named, a good one taken)"
expect 2 "bad value for --reps: '0'" --reps 0
expect 2 "bad value for --reps: '0'" "${ATT[@]}" --reps 0
expect 2 "bad value for --lengths: '1,0'" "${ATT[@]}" --lengths 1,0
expect 2 "bad value for --probes: '0'" "${ATT[@]}" --probes 0
expect 2 "attach mode needs --attach-prefill, --attach-decode and --cluster-secret-file" \
  "${ATT[@]}" --lengths 1k,2k --reps 3 --warmup 0 --no-zero --tsv --no-cpu --trace "$T/t.json" \
  --trace-length 1024 --probes 4 --data-addr 127.0.0.1
expect 1 "cluster secret $T/none" "${ATT[@]}" --cluster-secret-file "$T/none"

note "a length over an engine's window refused before anything starts (dense-70b: 131,072)"
expect 2 "131072 tokens (+ 2 output) is over dense-70b's window of 131072 tokens: give it at most 131070" \
  --engines hybrid-320b,dense-70b --lengths 65536,131072 --no-cpu
expect 2 "40000 tokens (+ 2 output) is over ref's window of 40000 tokens" \
  --engines ref --ref-lengths 128,40000 --no-cpu
finish_ok
