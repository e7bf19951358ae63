#!/usr/bin/env bash
# Runs each test program in its own process under a timeout and prints one
# line per program, the output of the ones that fail, and a closing
# "N passed, N failed" line.  Exit status is nonzero when any failed.
#
#   EPD_TEST_TIMEOUT   seconds per program (default 300)
#   EPD_TEST_FILTER    only run programs whose path matches this regex
#   EPD_BUILD          the build folder the programs come from (for logs)
set -u

timeout_s=${EPD_TEST_TIMEOUT:-300}
build=${EPD_BUILD:-build}
logdir="$build/test-logs"
mkdir -p "$logdir"

passed=0
failed=0
failed_names=()

for t in "$@"; do
  if [ -n "${EPD_TEST_FILTER:-}" ] && ! [[ "$t" =~ $EPD_TEST_FILTER ]]; then
    continue
  fi
  name=$(basename "$t")
  log="$logdir/$name.log"
  start=$(date +%s.%N)
  # Each program runs in its own process group so a timeout kills every
  # daemon it started too.
  EPD_BUILD="$build" timeout -k 5 "$timeout_s" setsid "$t" >"$log" 2>&1 </dev/null
  rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [ $rc -eq 0 ]; then
    passed=$((passed + 1))
    printf 'PASS  %-40s %6ss\n' "$name" "$secs"
  else
    failed=$((failed + 1))
    failed_names+=("$name")
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      printf 'FAIL  %-40s timed out after %ss\n' "$name" "$timeout_s"
    else
      printf 'FAIL  %-40s exit %d\n' "$name" "$rc"
    fi
    echo "----- $log (last 60 lines) -----"
    tail -n 60 "$log"
    echo "-----"
  fi
done

if [ $failed -gt 0 ]; then
  echo "failed: ${failed_names[*]}"
fi
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
