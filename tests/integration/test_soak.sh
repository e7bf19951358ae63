#!/usr/bin/env bash
# `epd-bench soak` at 2,000 requests: a router, two prefill workers and a
# decode worker on the tiny ref model, under EPD_XPORT_FAULTS (the soak's
# default mix), workers stopped (SIGSTOP/SIGCONT) and killed and restarted,
# clients aborting: no request finishes with tokens other than
# epd-generate's, none hangs, no decode block is leaked (the soak's own exit
# status), and faults were injected; and no request was answered "no
# worker" (503) before the router's --no-worker-wait-ms (5 s): one that
# finds no usable pair waits for one.
source "$(dirname "$0")/lib.sh"

"$B/bin/epd-bench" soak --requests 2000 --clients 8 --chaos-ms 1500 --seed 3 >"$T/soak.out" 2>&1 ||
  { cat "$T/soak.out" >&2; fail "epd-bench soak failed"; }
sed 's/^/    /' "$T/soak.out" >&2
grep -qE '^  finished wrong +0$' "$T/soak.out" || fail "finished wrong is not 0"
grep -qE '^  blocks leaked +0 ' "$T/soak.out" || fail "blocks leaked is not 0"
grep -qE '^  hung \(> [0-9]+ s\) +0$' "$T/soak.out" || fail "hung is not 0"
n=$(sed -n 's/^  finished equal *\([0-9]*\)$/\1/p' "$T/soak.out")
[ "${n:-0}" -gt 0 ] || fail "no request finished equal to epd-generate"
n=$(sed -n 's/^  faults injected *\([0-9]*\) .*/\1/p' "$T/soak.out")
[ "${n:-0}" -gt 0 ] || fail "no fault injected"
grep -qE '^  503 before the wait +0 ' "$T/soak.out" || fail "503s came before the no-worker wait"
finish_ok
