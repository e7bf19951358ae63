#!/usr/bin/env bash
# Random loss and TCP resets on the prefill <-> decode traffic of decode
# host d1 (nftables numgen in d1, packets to and from both prefill hosts:
# between workers there is only the transport — KV writes and request-plane
# messages — the control plane goes to the router, untouched)
# (tests/multihost/lib.sh, ucx-tcp):
#   - 5% of those packets dropped each way: every streamed answer equals
#     epd-generate's, or ends with a clean error (an HTTP error JSON, or an
#     error event in the stream) — never different text, never a broken
#     stream;
#   - 1% of the packets from the prefill hosts answered with a TCP reset
#     (reject with tcp reset): the same;
#   - the rules gone: every worker READY again and every request served.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

note "six hosts, $MH_TR"
mh_cluster "$MH_TR" --policy round-robin
G="$BIN/epd-generate"
# a long prompt: more KV per request, more packets for the faults to hit
awk 'BEGIN { for (i = 0; i < 28; i++) printf "Lossy links between the prefill and decode hosts %d. ", i }' >"$T/p"

# hits TABLE: packets the table's rules matched (their counters)
hits() {
  mh_in d1 nft list table inet "$1" | awk '/counter packets/ { for (i = 1; i < NF; i++)
    if ($i == "packets") n += $(i + 1) } END { print n + 0 }'
}

# judge NAME: the results of `multi` in $T/NAME.out are ok or clean errors
judge() {
  local name=$1 ok err
  cat "$T/$name.out"
  if grep -Ev '^(ok|error [0-9]+ .*)$' "$T/$name.out" | grep -q .; then
    fail "$name: an answer that is neither equal nor a clean error"
  fi
  grep -q '^error [0-9]* *$' "$T/$name.out" && fail "$name: an error without a message"
  ok=$(grep -c '^ok$' "$T/$name.out" || true)
  err=$(grep -c '^error ' "$T/$name.out" || true)
  note "$name: $ok equal, $err clean errors"
  [ "$ok" -ge 1 ] || fail "$name: nothing got through"
}

note "5% loss each way between d1 and the prefill hosts"
mh_nft d1 "table inet mhloss {
  chain in { type filter hook input priority 0; policy accept;
    ip saddr { $p1_IP, $p2_IP } numgen random mod 100 < 5 counter drop; }
  chain out { type filter hook output priority 0; policy accept;
    ip daddr { $p1_IP, $p2_IP } numgen random mod 100 < 5 counter drop; }
}"
mh_client r multi "$r_HTTP" "$T/m" "$G" --count 24 --prompt-file "$T/p" --max-tokens 64 \
  >"$T/loss.out" || fail "multi under loss"
judge loss
n=$(hits mhloss)
note "$n packets dropped"
[ "$n" -ge 1 ] || fail "the loss rules dropped nothing"
mh_nft_flush d1

note "1% of the packets from the prefill hosts reset (TCP RST)"
mh_nft d1 "table inet mhrst {
  chain in { type filter hook input priority 0; policy accept;
    ip saddr { $p1_IP, $p2_IP } meta l4proto tcp numgen random mod 100 < 1
      counter reject with tcp reset; }
}"
mh_client r multi "$r_HTTP" "$T/m" "$G" --count 24 --prompt-file "$T/p" --max-tokens 64 \
  >"$T/reset.out" || fail "multi under resets"
judge reset
n=$(hits mhrst)
note "$n packets answered with a reset"
[ "$n" -ge 1 ] || fail "the reset rule reset nothing"
mh_nft_flush d1

note "the rules gone: every worker READY, every request served"
for w in prefill-1 prefill-2 decode-1 decode-2; do
  mh_wait_state r "$r_ADDR" "$w" READY 30
done
mh_client r load "$r_HTTP" "$T/m" "$G" --clients 4 --requests 24 --prompts 4 --max-tokens 8 ||
  fail "requests once the links are clean"
mh_finish
