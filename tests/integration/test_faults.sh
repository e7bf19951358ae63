#!/usr/bin/env bash
# Faults below the daemons (EPD_XPORT_FAULTS, transport/epd_xport_faults.h):
# a router, a prefill and a decode worker over ucx-tcp with a cluster
# secret, restarted under each kind of fault in turn (request-plane
# messages dropped, delayed, duplicated, reordered, corrupted; the loop
# stalled; write completions lost or late; write bytes flipped).  Every
# request ends within a bound either equal to epd-generate or with a clean
# error (never different tokens, never a hang); decode's blocks are all
# free at the end; the workers' logs count the faults they injected, and
# decode's /metrics counts the KV verification failures its log reports.
source "$(dirname "$0")/lib.sh"

export UCX_TLS=tcp
XFLAGS=(--transport ucx --expect-transport tcp)
( umask 077; head -c 32 /dev/urandom >"$T/secret" )
export EPD_CLUSTER_SECRET_FILE="$T/secret"
mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"
G="$BIN/epd-generate"

# kind, EPD_XPORT_FAULTS, the counters of which at least one must be > 0
runs=(
  "drop|drop=0.02,seed=1|msg-drop write-comp-drop"
  "delay|delay=40:0.1,seed=2|msg-delay write-comp-delay"
  "dup|dup=0.03,seed=3|msg-dup"
  "reorder|reorder=0.03,seed=4|msg-reorder"
  "corrupt|corrupt=0.02,seed=5|msg-corrupt write-corrupt"
  "stall|stall=300:0.02,seed=6|stall"
  "all|drop=0.005,delay=20:0.02,dup=0.005,reorder=0.005,corrupt=0.005,stall=100:0.005,seed=7|msg-drop msg-delay msg-dup msg-reorder msg-corrupt stall write-corrupt"
)
for run in "${runs[@]}"; do
  IFS='|' read -r kind spec counters <<<"$run"
  # EPD_FAULT_KINDS="drop all": only those (to look at one kind)
  [ -z "${EPD_FAULT_KINDS:-}" ] || [[ " $EPD_FAULT_KINDS " == *" $kind "* ]] || continue
  note "$kind: EPD_XPORT_FAULTS=$spec"
  start_router "r$kind" --model "$T/m" --heartbeat-ms 200 --dead-after-ms 1500 \
    --cluster-secret-file "$T/secret"
  rv="r${kind}_ADDR"; rh="r${kind}_HTTP"
  EPD_XPORT_FAULTS=$spec start_daemon "d$kind" decode --model "$T/m" --worker-id "decode-$kind" \
    "${XFLAGS[@]}" --kv-blocks 512 --state-slots 32 --peer-timeout-ms 1000 \
    --cluster-secret-file "$T/secret" --router "${!rv}" --metrics-addr 127.0.0.1:0
  # two prefill workers: the router routes around a pair whose link broke
  for i in 0 1; do
    EPD_XPORT_FAULTS=$spec start_daemon "p$i$kind" prefill --model "$T/m" \
      --worker-id "prefill-$i-$kind" "${XFLAGS[@]}" --kv-blocks 256 --state-slots 16 \
      --peer-timeout-ms 1000 --cluster-secret-file "$T/secret" --router "${!rv}"
  done
  for w in "decode-$kind" "prefill-0-$kind" "prefill-1-$kind"; do
    wait_router_state "${!rv}" "$w" READY 10
  done
  dv="d${kind}_ADDR"
  # batches of 48 until a fault of the kind was injected (a loaded machine
  # may answer a whole batch 503 before any message carried one), 4 at most
  hit=0
  for batch in 1 2 3 4; do
    out=$(router_client faulty "${!rh}" "$T/m" "$G" --clients 4 --requests 48 --prompts 6 \
            --max-tokens 16 --timeout 60) || fail "$kind: $out"
    note "$kind: batch $batch: $out"
    wait_blocks_free "${!dv}" 30
    for c in $counters; do
      if grep -h "xport faults injected" "$T/d$kind.log" "$T/p0$kind.log" "$T/p1$kind.log" |
           grep -q " $c=[1-9]"; then
        hit=1
      fi
    done
    [ "$hit" = 0 ] || break
  done
  [ "$hit" = 1 ] || fail "$kind: no fault of kinds '$counters' injected (see $T/d$kind.log)"
  grep -h "xport faults injected" "$T/d$kind.log" "$T/p0$kind.log" "$T/p1$kind.log" | tail -n 2 | sed 's/^/    /' >&2
  grep -q "EPD_XPORT_FAULTS armed" "$T/d$kind.log" || fail "$kind: decode did not log what is armed"
  if [ "$kind" = corrupt ]; then
    # refused, never delivered: a frame by its MAC, KV bytes by their checksum
    grep -qE "fails its MAC|does not match its checksum" "$T/d$kind.log" "$T/p0$kind.log" \
      "$T/p1$kind.log" || fail "corrupt: no refusal of a corrupted frame or write logged"
  fi
  # decode's /metrics counts each request its KV checks failed, as its log does
  dm=$(sed -n 's/.* metrics=\([^ ]*\).*/\1/p' "$T/d$kind.ready")
  vf=$(curl -s --max-time 10 "http://$dm/metrics" |
         awk '$1 ~ /^epd_decode_verification_failures_total/ { print $2 }')
  vl=$(grep -cE "KV of layer [0-9]+ from .* (does not match its checksum|fails its check)" \
         "$T/d$kind.log" || true)
  [ -n "$vf" ] && [ "$vf" = "$vl" ] ||
    fail "$kind: epd_decode_verification_failures_total '$vf', $vl failures logged"
  note "$kind: $vf KV verification failures, counted in /metrics as logged"
  # every worker lived through it and stops cleanly
  for n in "p0$kind" "p1$kind" "d$kind" "r$kind"; do
    stop_daemon "$n" TERM
    [ "$STOP_RC" = 0 ] || fail "$kind: $n exited $STOP_RC on SIGTERM (see $T/$n.log)"
  done
done

note "a malformed EPD_XPORT_FAULTS stops a worker at start"
if EPD_XPORT_FAULTS=drop=2 "$BIN/epd-decode" --model "$T/m" "${XFLAGS[@]}" \
     --control-addr 127.0.0.1:0 >"$T/bad.log" 2>&1; then
  fail "decode started with EPD_XPORT_FAULTS=drop=2"
fi
grep -q "EPD_XPORT_FAULTS: bad entry" "$T/bad.log" || fail "no reason logged: $(tail -n 3 "$T/bad.log")"
finish_ok
