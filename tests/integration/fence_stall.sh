#!/usr/bin/env bash
# fence_stall.sh CONF — a writer stalled in the middle of its one-sided
# writes, declared dead by the worker whose memory it writes, and continued
# once that memory may belong to another request (proto/README.md rules
# 25-29, tests/integration/epd_itest_stall.c):
#  - kv: prefill A stops itself (SIGSTOP, fault point
#    prefill.pause_after_layer=0) after its first layer's writes; decode
#    declares it dead (--peer-timeout-ms); request B, through prefill B,
#    can only get A's blocks and state slot (the pool holds one request);
#    prefill A is continued and, before it hears anything, posts A's other
#    layers into them.  B, and two more requests, equal the colocated
#    result; decode's pool comes back to full;
#  - embed: encoder A stops itself before its embedding write (fault point
#    encoder.pause_before_write); the prefill worker (one embedding slot)
#    declares it dead; B's image, from encoder B, lands in that slot and is
#    cached; encoder A is continued and posts A's embeddings into the slot;
#    C sends B's image again as a cache hit.  B and C equal the colocated
#    result.
# Without the fence the late writes land in B's KV or B's cached image and
# B or C differ.  CONF: ucx-shm, ucx-tcp, ofi-tcp.
source "$(dirname "$0")/lib.sh"

conf=${1:?usage: fence_stall.sh ucx-shm|ucx-tcp|ofi-tcp [kv|embed]}
what=${2:-all}
case "$conf" in
  ucx-shm) export UCX_TLS=posix,cma,tcp; XFLAGS=(--transport ucx --expect-transport shm)
           CFLAGS=(--transport ucx) ;;
  ucx-tcp) export UCX_TLS=tcp; XFLAGS=(--transport ucx --expect-transport tcp)
           CFLAGS=(--transport ucx) ;;
  ofi-tcp) export FI_PROVIDER="tcp;ofi_rxm"
           XFLAGS=(--transport ofi --expect-transport tcp --provider "tcp;ofi_rxm")
           CFLAGS=(--transport ofi --provider "tcp;ofi_rxm") ;;
  *) fail "unknown configuration $conf" ;;
esac
# A peer silent this long is declared dead.  1000 ms declared live, busy
# peers dead on a loaded 2-core machine ("silent for 1107 ms", the client
# and all three daemons at once, before A ever stopped) with other test
# programs beside this one; 3000 ms still ends each stall in seconds.
PEER_MS=3000
COMMON=(--peer-timeout-ms $PEER_MS --lease-ms 20000 "${XFLAGS[@]}")

if [ "$what" = all ] || [ "$what" = kv ]; then
  # hybrid, so that a late write of a linear layer's state lands in the only
  # state slot; 1024 tokens of 16 per block = the whole decode pool
  mkmodel "$T/m" --layers 4 --dim 64 --heads 4 --kv-heads 2 --layer-pattern LALA --ffn 128 \
    --vocab 258 --vision 0 --max-context 2048 --seed 7
  start_daemon d decode --model "$T/m" --worker-id decode-f --kv-blocks 64 --state-slots 1 \
    "${COMMON[@]}"
  EPD_FAULT_POINTS=prefill.pause_after_layer=0 \
    start_daemon pa prefill --model "$T/m" --worker-id prefill-a "${COMMON[@]}"
  start_daemon pb prefill --model "$T/m" --worker-id prefill-b "${COMMON[@]}"
  note "$conf kv: decode $d_ADDR, prefill A $pa_ADDR (pid $pa_PID, stalls), prefill B $pb_ADDR"
  "$ITEST/epd-itest-stall" kv --decode "$d_ADDR" --prefill-a "$pa_ADDR" --prefill-b "$pb_ADDR" \
    --stalled-pid "$pa_PID" --model "$T/m" --peer-timeout-ms $PEER_MS --kv-tokens 1024 \
    "${CFLAGS[@]}" || fail "$conf kv: see the lines above"
  grep -q "fault point prefill.pause_after_layer" "$T/pa.log" || fail "prefill A never stalled"
  for n in d pa pb; do stop_daemon $n TERM; [ "$STOP_RC" = 0 ] || fail "$n exited $STOP_RC"; done
fi

if [ "$what" = all ] || [ "$what" = embed ]; then
  mkmodel "$T/v" "${TINY_VISION_FLAGS[@]}"
  mkimage png "$T/a.png" 40 30 1
  mkimage png "$T/b.png" 48 36 2
  start_daemon ed decode --model "$T/v" --worker-id decode-e --kv-blocks 512 --state-slots 16 \
    "${COMMON[@]}"
  start_daemon ep prefill --model "$T/v" --worker-id prefill-e --embed-slots 1 "${COMMON[@]}"
  EPD_FAULT_POINTS=encoder.pause_before_write=1 \
    start_daemon ea encoder --model "$T/v" --worker-id encoder-a "${COMMON[@]}"
  start_daemon eb encoder --model "$T/v" --worker-id encoder-b "${COMMON[@]}"
  note "$conf embed: prefill $ep_ADDR (1 slot), encoder A $ea_ADDR (pid $ea_PID, stalls)"
  "$ITEST/epd-itest-stall" embed --decode "$ed_ADDR" --prefill-a "$ep_ADDR" \
    --encoder-a "$ea_ADDR" --encoder-b "$eb_ADDR" --stalled-pid "$ea_PID" --model "$T/v" \
    --image-a "$T/a.png" --image-b "$T/b.png" --peer-timeout-ms $PEER_MS "${CFLAGS[@]}" ||
    fail "$conf embed: see the lines above"
  grep -q "fault point encoder.pause_before_write" "$T/ea.log" || fail "encoder A never stalled"
fi
finish_ok
