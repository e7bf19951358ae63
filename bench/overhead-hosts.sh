#!/usr/bin/env bash
# bench/overhead-hosts.sh — `epd-bench overhead --attach-*` across hosts
# on one machine: a prefill (host p) and a decode (host d) in two network
# namespaces joined by a bridge, everything p sends (the KV) shaped by tc
# tbf on its eth0, the benchmark on a third (b).  For each engine profile
# the daemons start once, and the link's rate changes between runs (`tc
# qdisc replace`), so the rows of the rates come from the same daemons
# side by side.  Root; the namespaces are tests/multihost/lib.sh's (the
# harness of the cross-host tests: same names, same cleanup).  It measures
# and prints the tables; it judges nothing (the test is
# tests/multihost/test_mh_overhead_attach.sh).
#
#   bench/overhead-hosts.sh [RATES] [LENGTHS] [PROFILES]
#     RATES     tbf rates, comma-separated [2gbit,10gbit]
#     LENGTHS   prompt lengths [128,1024,4096,16384]
#     PROFILES  sim profiles (engine/profiles) [dense-70b,hybrid-moe-320b]
#   EPD_BENCH_REPS  repetitions per length [6]; EPD_BUILD as the tests'.
set -euo pipefail
RATES=${1:-2gbit,10gbit}
LENGTHS=${2:-128,1024,4096,16384}
PROFILES=${3:-dense-70b,hybrid-moe-320b}
REPS=${EPD_BENCH_REPS:-6}
. "$(dirname "$0")/../tests/multihost/lib.sh"
export EPD_LOG_LEVEL=warn

profiles="$(cd "$(dirname "$0")/../engine/profiles" && pwd)"
mh_switch
mh_host b 10
mh_host p 31
mh_host d 41
mh_secret
echo "# bench/overhead-hosts.sh $RATES $LENGTHS $PROFILES (reps $REPS), $(date -u +%FT%TZ)," \
  "load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs; sim in sleep mode, ucx over tcp"
n=0
for prof in ${PROFILES//,/ }; do
  n=$((n + 1))
  case "$prof" in
  dense-70b) scale=0.05 devices=4 ;;
  *) scale=0.1 devices=8 ;;
  esac
  mkdir -p "$T/sim-$prof"
  printf '%s\n' "model = $profiles/$prof.profile" "accel = $profiles/h200.profile" \
    "devices = $devices" "scale = $scale" "mode = sleep" "seed = 1" "vocab = 4096" \
    >"$T/sim-$prof/sim.conf"
  W=(--engine sim --model "$T/sim-$prof" --transport ucx --expect-transport tcp --log-level warn
     --kv-blocks 4096)
  mh_start "dec$n" d decode "${W[@]}" --worker-id "decode-$n" --trace "$T/d$n.json"
  mh_start "pre$n" p prefill "${W[@]}" --worker-id "prefill-$n" --trace "$T/p$n.json" \
    --no-prefix-cache
  pa="pre${n}_ADDR"
  da="dec${n}_ADDR"
  for rate in ${RATES//,/ }; do
    mh_in p tc qdisc replace dev eth0 root tbf rate "$rate" burst 256kb latency 1s
    echo
    echo "## $prof ($scale), p's eth0 at $rate"
    mh_in b "$BIN/epd-bench" overhead --attach-prefill "${!pa}" --attach-decode "${!da}" \
      --cluster-secret-file "$T/cluster-secret" --lengths "$LENGTHS" --reps "$REPS" --warmup 1 |
      grep -v '^#'
  done
  mh_in p tc qdisc del dev eth0 root
  mh_stop "pre$n" TERM
  mh_stop "dec$n" TERM
done
# the EXIT trap (lib.sh) deletes the namespaces and the temp dir
