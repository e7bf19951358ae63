#!/usr/bin/env bash
# Slow and distant links between the prefill and decode hosts
# (tests/multihost/lib.sh, ucx-tcp):
#   - everything p1 sends limited to 8 Mbit/s (tc tbf on p1's eth0): the KV
#     of a 1,500-token prompt takes a good part of a second to cross;
#   - p2 <-> d1 and p2 <-> d2 25 ms more each way (a user-space delay relay
#     in each of those hosts: every connection one opens to the other),
#     50 ms round trips;
# so every request crosses one of them; every answer equals epd-generate's
# (every API kind, and 24 requests from 4 clients), the KV really crossed
# the shaped qdisc (its overlimits) and the relays (their byte counts).
# The same kinds of links are what tests/multihost/overhead_link.sh runs
# the overhead benchmark across.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

note "six hosts, $MH_TR"
mh_cluster "$MH_TR" --policy round-robin
G="$BIN/epd-generate"
awk 'BEGIN { for (i = 0; i < 28; i++) printf "Across a slow link, sentence %d of the prompt. ", i }' \
  >"$T/long"
printf 'A short prompt over a distant link.' >"$T/short"

note "p1 at 8 Mbit/s (tc tbf on its eth0); p2 <-> d1, d2: 25 ms each way (delay relays)"
mh_in p1 tc qdisc add dev eth0 root tbf rate 8mbit burst 16kb latency 2s
mh_delay p2d p2 "{ $d1_IP, $d2_IP }" 25
mh_delay d1p d1 "$p2_IP" 25
mh_delay d2p d2 "$p2_IP" 25

t0=$SECONDS
mh_client r same "$r_HTTP" "$T/m" "$G" --prompt-file "$T/long" --max-tokens 16 --all-kinds \
  --temperature 0.6 --seed 3 || fail "a long prompt, every API kind"
mh_client r same "$r_HTTP" "$T/m" "$G" --prompt-file "$T/short" --max-tokens 32 --all-kinds \
  --temperature 0 || fail "a short prompt, every API kind"
mh_client r load "$r_HTTP" "$T/m" "$G" --clients 4 --requests 24 --prompts 4 --max-tokens 12 ||
  fail "24 requests from 4 clients"
note "32 requests in $((SECONDS - t0)) s"
ol=$(mh_in p1 tc -s qdisc show dev eth0 | sed -n 's/.*overlimits \([0-9]*\).*/\1/p' | head -n 1)
[ "${ol:-0}" -ge 1 ] || fail "the tbf qdisc never held a packet back (overlimits ${ol:-0})"
note "tbf on p1 held packets back $ol times"
# (a connection carries both directions, and which side opens it is the
# library's choice: UCX shares one between two workers that talk both
# ways, libfabric's rxm may connect from the decode side)
c=0
for r in p2d d1p d2p; do
  echo "relay $r: $(cat "$T/$r.stats")"
  c=$((c + $(sed -n 's/.*connections=\([0-9]*\).*/\1/p' "$T/$r.stats")))
done
[ "$c" -ge 2 ] || fail "the relays carried $c connections, not one per decode host at least"
for w in prefill-1 prefill-2 decode-1 decode-2; do
  n=$(mh_metric r "$r_HTTP" "epd_router_worker_requests_total{worker=\"$w\",pool=\"${w%-*}\"}")
  [ "${n:-0}" -ge 4 ] || fail "$w served ${n:-0} requests"
done
[ "$(mh_metric r "$r_HTTP" epd_router_retries_total)" = 0 ] || fail "requests were retried"
mh_finish
