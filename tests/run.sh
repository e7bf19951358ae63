#!/usr/bin/env bash
# Runs each test program in its own process session under a timeout, up to
# EPD_TEST_JOBS of them at once, and prints one line per program as it
# finishes (PASS/FAIL and its seconds), the last 60 lines of the output of
# the ones that fail, and a closing "N passed, N failed" line.  Exit status
# is nonzero when any failed.
#
#   EPD_TEST_JOBS       programs run at once (default 3; 1 runs them one by
#                       one in the order given, as before)
#   EPD_TEST_EXCLUSIVE  names (basenames) of the programs that must run
#                       alone: nothing else of this runner runs beside them.
#                       The Makefile passes the EXCLUSIVE_TESTS of the
#                       module.mk files (each listed there with its reason);
#                       run by hand, pass it yourself or use EPD_TEST_JOBS=1
#   EPD_TEST_TIMEOUT    seconds per program (default 300); a shell test
#                       that needs more at any load says so in its own
#                       header, `# epd-test-timeout: N` (the larger wins)
#   EPD_TEST_FILTER     only run programs whose path matches this regex
#   EPD_TEST_STRESS     1: a CPU hog (a busy shell loop, nice 0) on every
#                       core for the whole run, so a submission can be
#                       checked on a saturated machine as well as an idle
#                       one (`EPD_TEST_STRESS=1 make check`); a test that
#                       passes only at one speed tests the machine
#   EPD_BUILD           the build folder the programs come from (for logs)
#
# Which programs run alone: those that take a fixed, machine-wide name or
# device (network namespaces of tests/multihost, podman, Slurm's daemons,
# tc/nft), those that load the machine on purpose or measure (the soak, the
# fleet), and any that proved sensitive to a neighbour (the reason is in
# the comment beside it in its module.mk).  Everything else must pass with
# any others beside it: every server binds an ephemeral port, every temp
# file lives in a mktemp -d folder; a test that fails only beside others is
# a bug in it to understand, never something to retry.
#
# Order: the shared programs first, longest first (seconds of the last run
# of this build, $build/test-logs/NAME.secs, else tests/test_seconds.txt,
# else unknown: first), so the short ones fill the gaps at the end; then the
# exclusive ones, one by one, once nothing else runs.  With EPD_TEST_JOBS=1
# every program runs alone, in the order given.
set -u

timeout_s=${EPD_TEST_TIMEOUT:-300}
# limit_of PATH: the seconds PATH may run: timeout_s, or its own header's
# `# epd-test-timeout: N` when larger
limit_of() {
  local n=""
  case $1 in
    *.sh) n=$(sed -n 's/^# epd-test-timeout: \([0-9][0-9]*\)$/\1/p' "$1" 2>/dev/null | head -1) ;;
  esac
  if [ -n "$n" ] && [ "$n" -gt "$timeout_s" ]; then echo "$n"; else echo "$timeout_s"; fi
}
jobs=${EPD_TEST_JOBS:-3}
build=${EPD_BUILD:-build}
logdir="$build/test-logs"
mkdir -p "$logdir"
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: EPD_TEST_JOBS=$jobs: not a count" >&2; exit 2; }

declare -A exclusive=()
for n in ${EPD_TEST_EXCLUSIVE:-}; do
  exclusive[$n]=1
done

# seconds a program took last time: this build's log, else the checked-in list
declare -A hint=()
if [ -r "$(dirname "$0")/test_seconds.txt" ]; then
  while read -r n s; do
    [[ "$n" =~ ^# ]] || [ -z "$n" ] || hint[$n]=$s
  done <"$(dirname "$0")/test_seconds.txt"
fi
seconds_of() { # NAME -> seconds, 99999 when unknown (start those first)
  local s
  if [ -s "$logdir/$1.secs" ] && read -r s <"$logdir/$1.secs"; then
    echo "$s"
  else
    echo "${hint[$1]:-99999}"
  fi
}

shared=()
alone=()
for t in "$@"; do
  if [ -n "${EPD_TEST_FILTER:-}" ] && ! [[ "$t" =~ $EPD_TEST_FILTER ]]; then
    continue
  fi
  if [ "$jobs" -gt 1 ] && [ -n "${exclusive[$(basename "$t")]:-}" ]; then
    alone+=("$t")
  else
    shared+=("$t")
  fi
done
if [ "$jobs" -gt 1 ] && [ ${#shared[@]} -gt 0 ]; then
  mapfile -t shared < <(for t in "${shared[@]}"; do
                          printf '%s\t%s\n' "$(seconds_of "$(basename "$t")")" "$t"
                        done | sort -t $'\t' -k1,1nr -s | cut -f2-)
fi

# run_one PATH: runs one program (in the background: a subshell of its own)
# and leaves its exit status in $logdir/NAME.rc and its seconds in NAME.secs.
run_one() {
  local t=$1 name log start pidfile rc pgid live secs
  name=$(basename "$t")
  log="$logdir/$name.log"
  start=$(date +%s.%N)
  # Each program runs in a session of its own (setsid: its pid is the
  # session's process group).  timeout signals only the program; whatever it
  # leaves behind in that group — daemons of a program that was killed, or
  # that died without stopping them — is killed here, by that group's id.
  pidfile="$logdir/$name.pid"
  EPD_BUILD="$build" timeout -k 5 "$(limit_of "$t")" \
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
  echo "$secs" >"$logdir/$name.secs"
  echo "$rc" >"$logdir/$name.rc"
}

passed=0
failed=0
failed_names=()
declare -A running=() # background pid -> program path

# report PATH: the line (and for a failure, the log's tail) of a program
# that ended; only the main shell prints, so lines never interleave.
report() {
  local t=$1 name log rc secs
  name=$(basename "$t")
  log="$logdir/$name.log"
  rc=$(cat "$logdir/$name.rc" 2>/dev/null || echo 1) # no status: the runner itself failed
  secs=$(cat "$logdir/$name.secs" 2>/dev/null || echo "?")
  rm -f "$logdir/$name.rc"
  if [ "$rc" -eq 0 ]; then
    passed=$((passed + 1))
    printf 'PASS  %-40s %6ss\n' "$name" "$secs"
  else
    failed=$((failed + 1))
    failed_names+=("$name")
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      printf 'FAIL  %-40s timed out after %ss\n' "$name" "$(limit_of "$t")"
    else
      printf 'FAIL  %-40s exit %d\n' "$name" "$rc"
    fi
    echo "----- $log (last 60 lines) -----"
    tail -n 60 "$log"
    echo "-----"
  fi
}

start() {
  local t=$1 name
  name=$(basename "$t")
  rm -f "$logdir/$name.rc" "$logdir/$name.pid"
  run_one "$t" &
  running[$!]=$t
}

# reap: waits for one running program to end and reports it
reap() {
  local pid p
  while :; do
    pid=
    wait -n -p pid
    # wait -n also returns when a signal arrives; only a pid ends a program
    if [ -n "$pid" ] && [ -n "${running[$pid]:-}" ]; then
      report "${running[$pid]}"
      unset "running[$pid]"
      return
    fi
    # no job left to wait for (never expected): report the ones gone
    if [ -z "$pid" ]; then
      for p in "${!running[@]}"; do
        if ! kill -0 "$p" 2>/dev/null; then
          report "${running[$p]}"
          unset "running[$p]"
          return
        fi
      done
    fi
  done
}

# Ctrl-C or a TERM: stop the programs running now (each its whole group)
stop_all() {
  local p t name
  for p in "${!running[@]}"; do
    t=${running[$p]}
    name=$(basename "$t")
    if [ -s "$logdir/$name.pid" ]; then
      kill -KILL -- "-$(cat "$logdir/$name.pid")" 2>/dev/null || true
    fi
    kill -TERM "$p" 2>/dev/null || true
  done
  echo "run.sh: interrupted"
  exit 130
}
trap stop_all INT TERM

# EPD_TEST_STRESS=1: one hog per core.  Disowned, so `wait -n` above never
# reports one; bounded by timeout in case this runner is killed outright.
hogs=()
stop_hogs() {
  [ ${#hogs[@]} -eq 0 ] || kill -TERM "${hogs[@]}" 2>/dev/null || true
}
if [ "${EPD_TEST_STRESS:-0}" = 1 ]; then
  for _ in $(seq 1 "$(nproc 2>/dev/null || echo 2)"); do
    timeout 14400 bash -c 'while :; do :; done' </dev/null >/dev/null 2>&1 &
    hogs+=("$!")
    disown "$!"
  done
  echo "run.sh: EPD_TEST_STRESS=1: ${#hogs[@]} CPU hogs beside the tests (pids ${hogs[*]})"
fi
trap stop_hogs EXIT

for t in "${shared[@]}"; do
  while [ ${#running[@]} -ge "$jobs" ]; do
    reap
  done
  start "$t"
done
while [ ${#running[@]} -gt 0 ]; do
  reap
done
for t in "${alone[@]}"; do
  start "$t"
  reap
done

if [ $failed -gt 0 ]; then
  echo "failed: ${failed_names[*]}"
fi
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
