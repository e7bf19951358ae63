#!/usr/bin/env bash
# overhead_link.sh — the overhead benchmark (epd-bench overhead) across a
# slow or distant link, on this machine.  A recipe, not a test: run by hand
# (root), it prints the benchmark's table.
#
#   tests/multihost/overhead_link.sh [--rate RATE] [--delay-ms MS] [--mtu N]
#                                    [-- epd-bench overhead flags...]
#
# epd-bench overhead starts its prefill and decode daemons on one host and
# talks to them over loopback; here that host is a network namespace of its
# own whose loopback is made into the link: `--rate` shapes it with tc tbf
# (e.g. 10gbit, 1gbit, 100mbit), `--delay-ms` sends every TCP connection on
# it through tests/multihost/epd_mh_delay.py (MS more each way: this kernel
# has no netem), `--mtu` sets lo's MTU (default 9000, a datacenter NIC's
# jumbo frames; tbf's burst is sized from it).  Every byte prefill writes
# to decode crosses the link; so do the benchmark's own small messages and
# control calls (latency added to those shows in `resv`, not in `tail`).
# Shared memory would bypass loopback: use --transports ucx-tcp,ofi-tcp
# (the default here).  Without --rate and --delay-ms it is the plain
# loopback run, for comparison.
#
# Example (dense profile, 1k and 4k tokens, 1 Gbit/s with 1 ms each way):
#   tests/multihost/overhead_link.sh --rate 1gbit --delay-ms 1 -- \
#     --engines dense-70b --lengths 1024,4096 --reps 6
#
#   EPD_BUILD   build folder (default build)
set -euo pipefail
B=${EPD_BUILD:-build}
BIN="$B/bin"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rate=""
delay=""
mtu=9000
while [ $# -gt 0 ]; do
  case "$1" in
  --rate) rate=$2; shift 2 ;;
  --delay-ms) delay=$2; shift 2 ;;
  --mtu) mtu=$2; shift 2 ;;
  --) shift; break ;;
  -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
  *) echo "overhead_link.sh: unknown flag $1 (bench flags go after --)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "overhead_link.sh: needs root (a network namespace)" >&2; exit 1; }
[ -x "$BIN/epd-bench" ] || { echo "overhead_link.sh: build first ($BIN/epd-bench)" >&2; exit 1; }

NS="epdovh$$"
relay_pid=""
T=$(mktemp -d "${TMPDIR:-/tmp}/epd-ovh.XXXXXX")
# each step on its own: under set -e a failing one would skip the rest
cleanup() {
  if [ -n "$relay_pid" ]; then
    kill -KILL "$relay_pid" 2>/dev/null || true
    wait "$relay_pid" 2>/dev/null || true
  fi
  ip netns del "$NS" 2>/dev/null || true
  rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
in_ns() { nsenter --net="/run/netns/$NS" -- "$@"; }

ip netns add "$NS"
ip -n "$NS" link set lo mtu "$mtu"
ip -n "$NS" link set lo up
what="loopback, MTU $mtu"
if [ -n "$rate" ]; then
  # a burst of a few frames: smaller than one frame drops it
  in_ns tc qdisc add dev lo root tbf rate "$rate" burst $((mtu * 4)) latency 1s
  what="$what, tbf $rate"
fi
if [ -n "$delay" ]; then
  # nsenter itself (it execs the relay), not a subshell: $! is the relay
  nsenter --net="/run/netns/$NS" -- python3 "$HERE/epd_mh_delay.py" --listen 127.0.0.1:0 \
    --delay-ms "$delay" --mark 0x4d --ready-file "$T/relay" --stats-file "$T/relay.stats" &
  relay_pid=$!
  for _ in $(seq 1 100); do [ -s "$T/relay" ] && break; sleep 0.1; done
  port=$(sed -n 's/^port=//p' "$T/relay")
  [ -n "$port" ] || { echo "overhead_link.sh: the delay relay did not start" >&2; exit 1; }
  # (nft refuses "...; } }" on one line: each closing brace on its own)
  printf 'table ip ovh {\n  chain out { type nat hook output priority -100; policy accept;
    meta mark != 0x4d ip daddr 127.0.0.0/8 tcp dport != %s redirect to :%s; }\n}\n' \
    "$port" "$port" | in_ns nft -f -
  what="$what, +$delay ms each way"
fi
echo "overhead_link.sh: the link is $what"
[ $# -gt 0 ] || set -- --engines dense-70b --lengths 1024,4096 --reps 6
case " $* " in *" --transports "*) ;; *) set -- --transports ucx-tcp,ofi-tcp "$@" ;; esac
in_ns "$BIN/epd-bench" overhead "$@"
[ -z "$delay" ] || echo "overhead_link.sh: relay $(cat "$T/relay.stats")"
