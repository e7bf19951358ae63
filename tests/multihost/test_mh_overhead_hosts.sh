#!/usr/bin/env bash
# bench/overhead-hosts.sh at a tiny size (a benchmark that cannot run is a
# defect): two link rates, one length, one repetition, dense-70b.  It must
# exit 0, print a table per rate with a row each, and leave no network
# namespace of its own behind.  No time is judged.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
note "bench/overhead-hosts.sh 2gbit,10gbit 128 dense-70b (1 repetition)"
EPD_BENCH_REPS=1 EPD_BUILD="$B" "$MH_DIR/../../bench/overhead-hosts.sh" 2gbit,10gbit 128 \
  dense-70b >"$T/out" 2>"$T/err" & bpid=$!
wait "$bpid" || { cat "$T/out" "$T/err"; fail "bench/overhead-hosts.sh exited nonzero"; }
cat "$T/out"
[ "$(grep -c '^## dense-70b (0.05), p.s eth0 at ' "$T/out")" = 2 ] || fail "not one table per rate"
[ "$(grep -c '^sim-dense-70b *ucx *128 ' "$T/out")" = 2 ] || fail "not one row per rate"
ip netns list | grep -q "^epdmh$bpid-" && fail "namespaces of the benchmark (epdmh$bpid-*) left"
mh_finish
