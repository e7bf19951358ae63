#!/usr/bin/env bash
# A partition between prefill host p1 and decode host d1 (nftables in p1:
# every packet from or to d1 dropped) while both still reach the router
# (tests/multihost/lib.sh, ucx-tcp, round-robin):
#   - every request is answered, equal to epd-generate's: a request sent to
#     the pair (prefill-1, decode-1) fails before its first token (prefill-1
#     cannot reach decode-1, or decode-1's reservation never reaches it) and
#     is retried around it; both workers stay READY (each serves the others);
#   - the router remembers the broken pair: once it failed, later requests
#     go to it only as the back-off's probes (500 ms doubling to 10 s);
#   - the partition healed, the pair serves again once the router tries it
#     (EPD_ROUTER_PAIR_BROKEN_MS later).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

note "six hosts, $MH_TR, round-robin"
mh_cluster "$MH_TR" --policy round-robin
G="$BIN/epd-generate"
metric() { mh_metric r "$r_HTTP" "$1"; }

note "p1 and d1 partitioned (nftables in p1); both reach the router"
mh_nft p1 "table inet mhpart {
  chain in { type filter hook input priority 0; policy accept; ip saddr $d1_IP drop; }
  chain out { type filter hook output priority 0; policy accept; ip daddr $d1_IP drop; }
}"
r0=$(metric epd_router_retries_total)
mh_client r load "$r_HTTP" "$T/m" "$G" --clients 4 --requests 32 --prompts 4 --max-tokens 8 ||
  fail "requests across the partition"
r1=$(metric epd_router_retries_total)
note "$((r1 - r0)) retries for 32 requests"
[ "$r1" -gt "$r0" ] || fail "no request met the partition (no retry)"
for w in prefill-1 decode-1; do
  [ "$(mh_state r "$r_ADDR" "$w")" = READY ] || fail "$w is $(mh_state r "$r_ADDR" "$w"), not READY"
done
note "once known, the broken pair gets only the back-off's probes"
served() { metric "epd_router_worker_requests_total{worker=\"$1\",pool=\"$2\"}"; }
p1a=$(served prefill-1 prefill)
d1a=$(served decode-1 decode)
mh_client r load "$r_HTTP" "$T/m" "$G" --clients 4 --requests 32 --prompts 4 --max-tokens 8 ||
  fail "requests across the known partition"
r2=$(metric epd_router_retries_total)
# the pair is avoided 500 ms after its first failure, twice as long after
# each failure in a row (up to 10 s), then probed by one request: a load
# of a few seconds meets at most a few probes; a router that forgot the
# pair would send it a quarter of the 32 (round-robin over 2 x 2)
[ $((r2 - r1)) -le 3 ] ||
  fail "$((r2 - r1)) more retries: the router sent requests to the broken pair again"
# routed around, not away: each serves the others (a peer's report sets a
# worker aside only until its next heartbeat, with --no-worker-wait-ms on)
[ "$(served prefill-1 prefill)" -gt "${p1a:-0}" ] || fail "prefill-1 served nothing: routed away"
[ "$(served decode-1 decode)" -gt "${d1a:-0}" ] || fail "decode-1 served nothing: routed away"

grep -q "routing around the pair" "$T/r.log" || fail "the router did not name the broken pair"
connected() { grep -c "connected to peer .*(worker 'decode-1'" "$T/p1.log" || true; }
[ "$(connected)" = 0 ] || fail "prefill-1 reached decode-1 through the partition"

note "healed: once the router tries the pair again, it serves"
mh_nft_flush p1
# the router keeps a broken pair aside for at most EPD_ROUTER_PAIR_BROKEN_MS
# (10 s); with decode-2 drained every request goes to decode-1, prefill-1's too
sleep 11
mh_ctl r drain "$r_ADDR" --worker-id decode-2 >/dev/null || fail "drain decode-2"
mh_client r load "$r_HTTP" "$T/m" "$G" --clients 4 --requests 24 --prompts 4 --max-tokens 8 ||
  fail "requests after the partition healed"
r3=$(metric epd_router_retries_total)
[ "$r3" = "$r2" ] || fail "$((r3 - r2)) retries after the partition healed"
[ "$(connected)" -ge 1 ] || fail "prefill-1 never served with decode-1 after the partition healed"
mh_finish
