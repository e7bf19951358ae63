#!/usr/bin/env bash
# Control plane through epd-ctl: health and status print the fields; Drain
# naming another worker is refused (NOT_FOUND); Drain of the worker itself
# makes Health say draining and new requests are refused with
# EPD_ERR_DRAINING; RegisterWorker is not a worker's to answer.
source "$(dirname "$0")/lib.sh"

mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"
start_daemon d decode --model "$T/m" --worker-id decode-x --kv-blocks 256 --state-slots 16
start_daemon p prefill --model "$T/m" --worker-id prefill-x
"$BIN/epd-ctl" health "$d_ADDR" >"$T/h.txt" || fail "health failed"
for f in serving draining worker role epoch transport data_plane_address_bytes layer_pattern \
         kv_block_tokens block_bytes kv_blocks_total max_context kv_blocks_free; do
  grep -q "^$f=" "$T/h.txt" || fail "health lacks $f: $(cat "$T/h.txt")"
done
[ "$(health_field "$d_ADDR" worker)" = decode-x ] || fail "worker id"
[ "$(health_field "$d_ADDR" serving)" = 1 ] || fail "not serving"
[ "$(health_field "$d_ADDR" layer_pattern)" = LLA ] || fail "layer pattern"
[ "$(health_field "$p_ADDR" layer_pattern)" = LLA ] || fail "prefill layer pattern"
[ "$(status_field "$d_ADDR" kv_blocks_total)" = 256 ] || fail "status kv_blocks_total"
[ "$(status_field "$d_ADDR" worker)" = decode-x ] || fail "status worker"
printf 'Before the drain.' >"$T/short"
same_as_colocated "$T/m" "$p_ADDR" "$d_ADDR" "$T/short" 8

! "$BIN/epd-ctl" drain "$d_ADDR" --worker-id someone-else 2>"$T/err" ||
  fail "drain of another worker id succeeded"
grep -q NOT_FOUND "$T/err" || fail "drain of another id: $(cat "$T/err")"
"$BIN/epd-ctl" drain "$d_ADDR" --worker-id decode-x || fail "drain failed"
[ "$(health_field "$d_ADDR" draining)" = 1 ] || fail "Health does not say draining"
rc=0
"$BIN/epd-ctl" submit --prefill "$p_ADDR" --decode "$d_ADDR" --model "$T/m" --prompt-file "$T/short" \
  --max-tokens 4 --tokens >/dev/null 2>"$T/err" || rc=$?
[ $rc = 1 ] || fail "submit to a draining decode: exit $rc"
grep -q DRAINING "$T/err" || fail "not refused with EPD_ERR_DRAINING: $(cat "$T/err")"
"$BIN/epd-ctl" drain "$p_ADDR" --worker-id prefill-x || fail "prefill drain failed"
[ "$(health_field "$p_ADDR" draining)" = 1 ] || fail "prefill Health does not say draining"
finish_ok
