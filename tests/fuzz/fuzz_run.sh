#!/usr/bin/env bash
# tests/fuzz/fuzz_run.sh — runs libFuzzer targets one after another, every
# one of them, and reports every finding at the end (`make fuzz`, through
# tests/fuzz/module.mk's fuzz-run).
#
#   fuzz_run.sh WORK SECONDS SEEDS TARGET...
#
# Each TARGET (a libFuzzer program) runs for SECONDS (-max_total_time) over
# WORK/corpus/<name> (what earlier runs found, kept and grown) and then its
# committed seeds, SEEDS/<name>, when that folder exists.  A target that
# crashes, leaks, times out or runs out of memory stops (libFuzzer stops at
# its first finding) but the targets after it still run: one finding must
# not hide the others.  Findings (libFuzzer's crash-*, leak-*, timeout-*,
# oom-* files) go to WORK/findings/<name>/, the whole output of each run to
# WORK/logs/<name>.log.
#
# Exit 0 when no target found anything; else 1, after a summary naming each
# target that did, its exit status, its new finding files and its log.  A
# target that exits non-zero without leaving a file (it could not start,
# say) is reported too.  A finding is replayed with `TARGET FILE`; it
# belongs in tests/fuzz/corpus/<name>/ once fixed (test_fuzz_replay runs it
# in `make check`).
set -u

if [ $# -lt 4 ]; then
  echo "usage: $0 WORK SECONDS SEEDS TARGET..." >&2
  exit 2
fi
work=$1
seconds=$2
seeds=$3
shift 3

found=()   # names of the targets with a finding
report=()  # one block of lines per finding
for t in "$@"; do
  n=$(basename "$t")
  corpus=$work/corpus/$n
  findings=$work/findings/$n
  log=$work/logs/$n.log
  mkdir -p "$corpus" "$findings" "$work/logs"
  # files older than this run's start are earlier findings, not this run's
  stamp=$work/logs/$n.start
  : >"$stamp"
  dirs=("$corpus")
  if [ -d "$seeds/$n" ]; then
    dirs+=("$seeds/$n")
  fi
  echo "fuzzing $n for ${seconds}s"
  "$t" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$findings/" \
    "${dirs[@]}" >"$log" 2>&1
  rc=$?
  tail -n 4 "$log"
  new=$(find "$findings" -type f -newer "$stamp" | sort)
  if [ "$rc" -ne 0 ] || [ -n "$new" ]; then
    found+=("$n")
    block="FINDING in $n: exit status $rc, log $log"
    if [ -n "$new" ]; then
      while IFS= read -r f; do
        block+=$'\n'"  $f"
      done <<<"$new"
    else
      block+=$'\n'"  (no finding file: see the log)"
    fi
    # libFuzzer's one-line cause (the sanitizer's SUMMARY, or its own
    # deadly signal / leak / timeout line), when there is one
    cause=$(grep -m 1 -E '^SUMMARY: |^==[0-9]+== ERROR: libFuzzer|ERROR: LeakSanitizer' "$log")
    if [ -n "$cause" ]; then
      block+=$'\n'"  $cause"
    fi
    report+=("$block")
    echo "$n: finding (exit $rc), going on with the next target"
  fi
done

echo
if [ ${#found[@]} -eq 0 ]; then
  echo "fuzz: $# targets, no findings"
  exit 0
fi
echo "fuzz: ${#found[@]} of $# targets found something: ${found[*]}"
for b in "${report[@]}"; do
  echo "$b"
done
exit 1
