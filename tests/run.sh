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
  # Each program runs in a session of its own (setsid: its pid is the
  # session's process group).  timeout signals only the program; whatever it
  # leaves behind in that group — daemons of a program that was killed, or
  # that died without stopping them — is killed here, by that group's id.
  pidfile="$logdir/$name.pid"
  rm -f "$pidfile"
  EPD_BUILD="$build" timeout -k 5 "$timeout_s" \
    setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' epd-test "$pidfile" "$t" \
    >"$log" 2>&1 </dev/null
  rc=$?
  if [ -s "$pidfile" ]; then
    pgid=$(cat "$pidfile")
    # a daemon signalled as the program ended may still be on its way out;
    # zombies (waiting for init to reap them) do not count
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      live=$(ps -o stat= -g "$pgid" 2>/dev/null | grep -vc '^Z')
      [ "$live" -gt 0 ] || break
      sleep 0.1
    done
    if [ "$live" -gt 0 ]; then
      echo "run.sh: processes of $name still running after it ended: killed" >>"$log"
      ps -o pid=,args= -g "$pgid" >>"$log" 2>/dev/null || true
      kill -KILL -- "-$pgid" 2>/dev/null || true
      [ $rc -eq 0 ] && rc=1 # a test must stop what it starts
    fi
    rm -f "$pidfile"
  fi
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
