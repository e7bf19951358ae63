#!/usr/bin/env bash
# epd-bench fleet's simulated workers are what the router sees of real ones
# (bench/epd_bench_fleet.c --attach): against a router with a cluster
# secret and one real prefill worker, a fleet of 40 registers — each its
# own worker id and epoch, signed with the secret — and every one is READY
# in the router's Status and in `epd-ctl workers`, with a live request-plane
# endpoint (its link); once the fleet stops (SIGTERM), every one of them
# leaves READY (DEAD: their endpoints closed) while the real worker stays
# READY.  The measurement itself is `epd-bench fleet`, not a test.
source "$(dirname "$0")/lib.sh"

N=40
( umask 077; head -c 32 /dev/urandom >"$T/secret" )
export EPD_CLUSTER_SECRET_FILE="$T/secret"
mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"
start_router r --model "$T/m" --cluster-secret-file "$T/secret"
start_daemon p prefill --model "$T/m" --worker-id prefill-0 --router "$r_ADDR" \
  --cluster-secret-file "$T/secret"
wait_router_state "$r_ADDR" prefill-0 READY 20

note "a fleet of $N simulated workers"
"$BIN/epd-bench" fleet --attach "$r_ADDR" --like "$p_ADDR" --secret-file "$T/secret" \
  --sizes "$N" --hold 120 >"$T/fleet.out" 2>"$T/fleet.log" &
fleet_pid=$!
PIDS+=("$fleet_pid")

# sim_states: "STATE COUNT" lines for the sim-* workers in the router's Status
sim_states() {
  "$BIN/epd-ctl" status "$r_ADDR" | awk '$1 ~ /^worker=sim-/ {
      for (i = 2; i <= NF; i++) if ($i ~ /^state=/) n[substr($i, 7)]++ }
    END { for (s in n) print s, n[s] }'
}
ready=0
for _ in $(seq 1 300); do
  kill -0 "$fleet_pid" 2>/dev/null || fail "the fleet exited early: $(tail -n 5 "$T/fleet.log")"
  ready=$(sim_states | awk '$1 == "READY" { print $2 }')
  [ "${ready:-0}" -ge "$N" ] && break
  sleep 0.1
done
[ "${ready:-0}" -eq "$N" ] || fail "$N simulated workers registered, ${ready:-0} READY after 30 s: $(sim_states)"
"$BIN/epd-ctl" workers "$r_ADDR" >"$T/workers"
listed=$(awk '$1 ~ /^sim-/ && $2 == "READY"' "$T/workers" | wc -l)
[ "$listed" -eq "$N" ] || fail "epd-ctl workers lists $listed READY sim-* workers, not $N: $(head -n 5 "$T/workers")"
down=$(awk '$1 ~ /^sim-/ && / down/' "$T/workers" | wc -l)
[ "$down" -eq 0 ] || fail "$down sim-* workers have no live endpoint: $(grep ' down' "$T/workers" | head -n 3)"
[ "$(router_state "$r_ADDR" prefill-0)" = READY ] || fail "prefill-0 left READY"

note "the fleet stops: its workers leave READY"
kill -TERM "$fleet_pid"
rc=0
wait "$fleet_pid" || rc=$?
[ "$rc" -eq 0 ] || fail "the fleet exited $rc: $(tail -n 5 "$T/fleet.log")"
grep -q 'fleet: stopped (signal)' "$T/fleet.out" || fail "the fleet did not stop on SIGTERM: $(cat "$T/fleet.out")"
left=""
for _ in $(seq 1 200); do
  left=$(sim_states | awk '$1 != "DEAD" { n += $2 } END { print n + 0 }')
  [ "$left" -eq 0 ] && break
  sleep 0.1
done
[ "$left" -eq 0 ] || fail "$left simulated workers not DEAD 20 s after the fleet stopped: $(sim_states)"
[ "$(router_state "$r_ADDR" prefill-0)" = READY ] || fail "prefill-0 left READY with the fleet"
note "$N READY while the fleet ran, every one DEAD after it stopped; prefill-0 READY"
finish_ok
