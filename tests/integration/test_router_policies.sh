#!/usr/bin/env bash
# Router policies over 2 prefill + 2 decode workers (registered with
# --router):
#  - round-robin: 8 requests one after another put exactly 4 on each worker;
#  - the router restarts on the same control address with prefix-affinity:
#    the workers register again (their heartbeats hear known=false), and
#    requests sharing a prompt all go to one prefill worker, while a
#    different prompt may go elsewhere; every answer equals epd-generate's.
#    Each request waits until the router's view settled (settle.sh): its
#    KV hints of each prefill worker equal that worker's cached blocks and
#    no heartbeat counts a queued prompt.  Without that, a heartbeat taken
#    while the previous prompt was still queued made its worker cost more
#    than the cached blocks saved, and a prompt moved (ASan pass of a
#    clean-clone make check: "one prompt went to both prefill workers (3
#    and 3)").
source "$(dirname "$0")/lib.sh"

mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"
start_router r1 --model "$T/m" --heartbeat-ms 200 --policy round-robin
for i in 0 1; do
  start_daemon "d$i" decode --model "$T/m" --worker-id "decode-$i" --kv-blocks 512 \
    --state-slots 32 --router "$r1_ADDR"
  start_daemon "p$i" prefill --model "$T/m" --worker-id "prefill-$i" --router "$r1_ADDR"
done
for w in decode-0 decode-1 prefill-0 prefill-1; do
  wait_router_state "$r1_ADDR" "$w" READY
done
G="$BIN/epd-generate"
count() { # HTTP WORKER POOL
  local n
  n=$(router_metric "$1" "epd_router_worker_requests_total{worker=\"$2\",pool=\"$3\"}")
  echo "${n:-0}"
}

note "round-robin"
router_client load "$r1_HTTP" "$T/m" "$G" --clients 1 --requests 8 --prompts 2 --max-tokens 6 ||
  fail "round-robin requests"
for w in decode-0 decode-1; do
  [ "$(count "$r1_HTTP" $w decode)" = 4 ] || fail "round-robin: $w took $(count "$r1_HTTP" $w decode) of 8"
done
for w in prefill-0 prefill-1; do
  [ "$(count "$r1_HTTP" $w prefill)" = 4 ] || fail "round-robin: $w took $(count "$r1_HTTP" $w prefill) of 8"
done

note "router restart on the same control address, prefix-affinity"
stop_daemon r1 TERM
[ "$STOP_RC" = 0 ] || fail "router exited $STOP_RC on SIGTERM"
start_router r2 --model "$T/m" --heartbeat-ms 200 --policy prefix-affinity --control-addr "$r1_ADDR"
for w in decode-0 decode-1 prefill-0 prefill-1; do
  wait_router_state "$r2_ADDR" "$w" READY 10
done
cat >"$T/settle.sh" <<SETTLE
#!/usr/bin/env bash
# waits (30 s at most) until the router's hints of each prefill worker are
# the blocks its cache holds and no heartbeat counts a queued prompt
series() { curl -s --max-time 5 "$r2_HTTP/metrics" | awk -v s="\$1" -f "$(cd "$(dirname "$0")" && pwd)/epd_metric_value.awk"; }
cached() { "$(cd "$BIN" && pwd)/epd-ctl" health "\$1" | sed -n 's/^prefix_cached_blocks=//p'; }
for i in \$(seq 1 300); do
  ok=1
  for w in 0 1; do
    a=\$([ \$w = 0 ] && echo "$p0_ADDR" || echo "$p1_ADDR")
    h=\$(series "epd_router_worker_kv_hints{worker=\"prefill-\$w\",pool=\"prefill\"}")
    q=\$(series "epd_router_worker_queued_tokens{worker=\"prefill-\$w\"}")
    [ -n "\$h" ] && [ "\$h" = "\$(cached "\$a")" ] && [ "\$q" = 0 ] || ok=0
  done
  [ \$ok = 1 ] && exit 0
  sleep 0.1
done
echo "settle.sh: the router's view of the prefill workers did not settle in 30 s" >&2
exit 1
SETTLE
S=(--before-each "bash $T/settle.sh")
router_client load "$r2_HTTP" "$T/m" "$G" --clients 1 --requests 6 --prompts 1 --max-tokens 6 \
  "${S[@]}" ||
  fail "prefix-affinity requests, one prompt"
a=$(count "$r2_HTTP" prefill-0 prefill)
b=$(count "$r2_HTTP" prefill-1 prefill)
{ [ "$a" = 6 ] && [ "$b" = 0 ]; } || { [ "$a" = 0 ] && [ "$b" = 6 ]; } ||
  fail "prefix-affinity: one prompt went to both prefill workers ($a and $b)"
# 8 prompts, as completions and as chat (16 distinct first blocks): some go
# to each worker, and the same ones again the second time
router_client load "$r2_HTTP" "$T/m" "$G" --clients 1 --requests 16 --prompts 8 --max-tokens 6 \
  "${S[@]}" || fail "prefix-affinity requests, 8 prompts"
a1=$(count "$r2_HTTP" prefill-0 prefill)
b1=$(count "$r2_HTTP" prefill-1 prefill)
router_client load "$r2_HTTP" "$T/m" "$G" --clients 1 --requests 16 --prompts 8 --max-tokens 6 \
  "${S[@]}" || fail "prefix-affinity requests, 8 prompts again"
a2=$(count "$r2_HTTP" prefill-0 prefill)
b2=$(count "$r2_HTTP" prefill-1 prefill)
[ $((a2 + b2)) = 38 ] || fail "prefix-affinity: $a2 + $b2 requests counted, want 38"
[ $((a1 - a)) -gt 0 ] && [ $((b1 - b)) -gt 0 ] ||
  fail "prefix-affinity: 16 prompts all went to one worker ($a -> $a1, $b -> $b1)"
[ $((a2 - a1)) = $((a1 - a)) ] ||
  fail "prefix-affinity: the same prompts went elsewhere the second time ($a, $a1, $a2)"
finish_ok
