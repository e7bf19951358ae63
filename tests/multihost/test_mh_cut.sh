#!/usr/bin/env bash
# Hosts cut off mid-request and healed (tests/multihost/lib.sh, ucx-tcp,
# round-robin so that every worker gets its share):
#   - prefill host p1 unplugged, then requests sent: the requests routed to
#     it (none had a first token: prefill makes it) are retried on p2, and
#     every answer equals epd-generate's; prefill-1 leaves READY;
#   - p1 plugged back: prefill-1 READY again (registered anew if the router
#     declared it DEAD) and serving;
#   - decode host d1 unplugged with long streams running on it (every one
#     past its first token, greedy and seeded): those streams migrate to
#     d2 (proto/README.md rule 37) and go on where they stopped, and every
#     one of the 6 finishes equal to epd-generate;
#   - d1 plugged back: decode-1 READY again and serving.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

note "six hosts, $MH_TR, round-robin"
mh_cluster "$MH_TR" --policy round-robin
G="$BIN/epd-generate"
metric() { mh_metric r "$r_HTTP" "$1"; }

note "p1 unplugged, then requests arrive: those sent to it are retried on p2 before their first token"
# cut first: the router still holds p1 READY until its heartbeats stop
# counting (--dead-after-ms), so round-robin sends it requests that cannot
# reach it, and they are retried once it is declared dead.  (Cutting while
# the load runs raced the load: with the prefix cache on, these short
# repeated prompts are prefilled in a millisecond, and every request p1 had
# taken could already be past its first token.)
r0=$(metric epd_router_retries_total)
n0=$(metric 'epd_router_worker_requests_total{worker="prefill-1",pool="prefill"}')
mh_cut p1
mh_client r load "$r_HTTP" "$T/m" "$G" --clients 4 --requests 40 --prompts 4 --max-tokens 8 \
  >"$T/load.out" 2>"$T/load.err" || fail "requests across the cut: $(cat "$T/load.err")"
cat "$T/load.out"
n=$(metric 'epd_router_worker_requests_total{worker="prefill-1",pool="prefill"}')
note "prefill-1 was sent $((${n:-0} - ${n0:-0})) requests after the cut"
r1=$(metric epd_router_retries_total)
[ "$r1" -gt "$r0" ] || fail "no request was retried ($r0 -> $r1)"
note "$((r1 - r0)) retries"
st=$(mh_state r "$r_ADDR" prefill-1)
[ "$st" != READY ] || mh_wait_state r "$r_ADDR" prefill-1 SUSPECT 10
mh_curl r "$r_HTTP/ready" | grep -q '"ready":true' || fail "/ready with prefill-2 alone"

note "p1 plugged back: prefill-1 READY and serving again"
mh_heal p1
mh_wait_state r "$r_ADDR" prefill-1 READY 30
n0=$(metric 'epd_router_worker_requests_total{worker="prefill-1",pool="prefill"}')
mh_client r load "$r_HTTP" "$T/m" "$G" --clients 2 --requests 8 --prompts 2 --max-tokens 8 ||
  fail "requests after p1 healed"
n1=$(metric 'epd_router_worker_requests_total{worker="prefill-1",pool="prefill"}')
[ "$n1" -gt "$n0" ] || fail "prefill-1 got no request after it healed ($n0 -> $n1)"

note "d1 unplugged with streams past their first token: they migrate"
printf 'Going away.' >"$T/long"
t0=$(metric epd_router_ttft_seconds_count)
m0=$(metric epd_router_migrations_total)
mh_client r multi "$r_HTTP" "$T/m" "$G" --count 6 --prompt-file "$T/long" --max-tokens 1800 --mixed \
  >"$T/multi.out" 2>"$T/multi.err" &
mpid=$!
PIDS+=("$mpid")
for i in $(seq 1 400); do
  n=$(metric 'epd_router_worker_in_flight{worker="decode-1",pool="decode"}')
  started=$(($(metric epd_router_ttft_seconds_count) - t0))
  [ "${n:-0}" -ge 1 ] && [ "$started" -ge 6 ] && break
  sleep 0.025
done
[ "${n:-0}" -ge 1 ] && [ "$started" -ge 6 ] ||
  fail "decode-1 never ran a started stream (in flight ${n:-0}, started $started of 6)"
mh_cut d1
note "d1 cut with $n streams on it"
wait "$mpid" || fail "the streaming clients: $(cat "$T/multi.err")"
cat "$T/multi.out"
n_ok=$(grep -c '^ok$' "$T/multi.out" || true)
[ "$n_ok" = 6 ] || fail "streams not ok (each equal to epd-generate) across the cut of d1"
m1=$(metric epd_router_migrations_total)
note "$((m1 - m0)) streams migrated"
# (at least one: the streams on decode-1 when polled may not all be running
# when the cut comes)
[ $((m1 - m0)) -ge 1 ] || fail "decode-1 ran $n streams but the router migrated none"
mh_wait_state r "$r_ADDR" decode-1 DEAD 20

note "d1 plugged back: decode-1 READY and serving again"
mh_heal d1
mh_wait_state r "$r_ADDR" decode-1 READY 30
n0=$(metric 'epd_router_worker_requests_total{worker="decode-1",pool="decode"}')
mh_client r load "$r_HTTP" "$T/m" "$G" --clients 2 --requests 8 --prompts 2 --max-tokens 8 ||
  fail "requests after d1 healed"
n1=$(metric 'epd_router_worker_requests_total{worker="decode-1",pool="decode"}')
[ "$n1" -gt "$n0" ] || fail "decode-1 got no request after it healed ($n0 -> $n1)"
mh_finish
