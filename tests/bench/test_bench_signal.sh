#!/usr/bin/env bash
# A benchmark ended by a signal leaves no daemon behind: `epd-bench serve`
# (its own cluster: router, prefill, decode) gets SIGTERM once the cluster
# is up, and every process it spawned is gone within 15 s.  Before, the
# daemons went on running, reparented, after their bench had died (a
# `timeout` or a kill of the bench alone): found by hand after several
# interrupted runs.
source "$(dirname "$0")/../integration/lib.sh"

# running = not gone and not a zombie waiting for whoever adopted it
alive() {
  local state
  state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | awk '{ print $1 }') || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

for sig in TERM INT; do
  "$BIN/epd-bench" serve --duration 120 --rate 2 --warmup 0 --prompt-len 16:32 --output-len 2:4 \
    --phases router >"$T/serve-$sig.out" 2>&1 &
  bench=$!
  PIDS+=("$bench")
  for _ in $(seq 1 600); do
    grep -q "cluster up" "$T/serve-$sig.out" && break
    alive "$bench" || { cat "$T/serve-$sig.out"; fail "the bench exited before its cluster was up"; }
    sleep 0.1
  done
  grep -q "cluster up" "$T/serve-$sig.out" || fail "no 'cluster up' from the bench within 60 s"
  kids=$(pgrep -P "$bench" | tr '\n' ' ')
  n=$(wc -w <<<"$kids")
  note "SIG$sig: the bench (pid $bench) has $n children: $kids"
  [ "$n" -ge 3 ] || fail "want the router, prefill and decode among its children, got '$kids'"
  PIDS+=($kids)
  kill -"$sig" "$bench"
  rc=0
  wait "$bench" || rc=$?
  [ "$rc" -ne 0 ] || fail "the bench exited 0 after SIG$sig"
  for _ in $(seq 1 150); do
    left=""
    for k in $kids; do
      alive "$k" && left="$left $k"
    done
    [ -z "$left" ] && break
    sleep 0.1
  done
  [ -z "$left" ] || fail "SIG$sig to the bench: its children$left still run 15 s later"
  note "SIG$sig: every child gone"
  # what it left is its temp folder (named in its first line), nothing else
  tmp=$(sed -n 's/.*(\(\/[^)]*epd-serve[^)]*\)).*/\1/p' "$T/serve-$sig.out" | head -n 1)
  [ -n "$tmp" ] && rm -rf "$tmp"
done
echo PASS
