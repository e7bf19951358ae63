#!/usr/bin/env bash
# Control plane through epd-ctl: health and status print the fields; a
# request over the context limit is refused with a clear error; Drain naming
# another worker is refused (NOT_FOUND); Drain of the worker itself makes
# Health say draining, the request running through it still finishes (and
# equals colocated), and new requests are refused with EPD_ERR_DRAINING.
source "$(dirname "$0")/lib.sh"

# slow enough per decode step that a 1500-token request is still running
# when the drain comes (~4 s colocated; no EOS before)
mkmodel "$T/m" --layers 6 --dim 256 --heads 8 --kv-heads 2 --layer-pattern LA --ffn 512 --vision 0 \
  --max-context 4096 --seed 3
start_daemon d decode --model "$T/m" --worker-id decode-x --kv-blocks 256 --state-slots 16
start_daemon p prefill --model "$T/m" --worker-id prefill-x
"$BIN/epd-ctl" health "$d_ADDR" >"$T/h.txt" || fail "health failed"
for f in serving draining worker role epoch transport data_plane_address_bytes layer_pattern \
         kv_block_tokens block_bytes kv_blocks_total max_context kv_blocks_free; do
  grep -q "^$f=" "$T/h.txt" || fail "health lacks $f: $(cat "$T/h.txt")"
done
[ "$(health_field "$d_ADDR" worker)" = decode-x ] || fail "worker id"
[ "$(health_field "$d_ADDR" serving)" = 1 ] || fail "not serving"
[ "$(health_field "$d_ADDR" layer_pattern)" = LALALA ] || fail "layer pattern"
[ "$(health_field "$p_ADDR" layer_pattern)" = LALALA ] || fail "prefill layer pattern"
[ "$(status_field "$d_ADDR" kv_blocks_total)" = 256 ] || fail "status kv_blocks_total"
[ "$(status_field "$d_ADDR" worker)" = decode-x ] || fail "status worker"
printf 'Before the drain.' >"$T/short"
same_as_colocated "$T/m" "$p_ADDR" "$d_ADDR" "$T/short" 8

rc=0
"$BIN/epd-ctl" submit --prefill "$p_ADDR" --decode "$d_ADDR" --model "$T/m" --prompt-file "$T/short" \
  --max-tokens 4090 --tokens >/dev/null 2>"$T/err" || rc=$?
[ $rc = 1 ] || fail "a request over the context limit: exit $rc"
grep -q TOO_LONG "$T/err" || fail "over the context limit: $(cat "$T/err")"

! "$BIN/epd-ctl" drain "$d_ADDR" --worker-id someone-else 2>"$T/err" ||
  fail "drain of another worker id succeeded"
grep -q NOT_FOUND "$T/err" || fail "drain of another id: $(cat "$T/err")"

note "drain while a request runs: it finishes"
want=$("$BIN/epd-generate" --model "$T/m" --prompt "$(cat "$T/short")" --max-tokens 1500 --tokens)
"$BIN/epd-ctl" submit --prefill "$p_ADDR" --decode "$d_ADDR" --model "$T/m" --prompt-file "$T/short" \
  --max-tokens 1500 --tokens --timeout-ms 60000 >"$T/long.out" 2>"$T/long.err" &
ctl=$!
PIDS+=("$ctl")
d_running() { [ "$(status_field "$d_ADDR" running_requests)" = 1 ]; }
wait_while_running "$ctl" 180 d_running || fail "the request never ran on decode-x"
"$BIN/epd-ctl" drain "$d_ADDR" --worker-id decode-x || fail "drain failed"
rc=0
wait "$ctl" || rc=$?
[ $rc = 0 ] || fail "the request running at the drain failed: $(cat "$T/long.err")"
[ "$(cat "$T/long.out")" = "$want" ] || fail "the request running at the drain differs from colocated"
[ "$(health_field "$d_ADDR" draining)" = 1 ] || fail "Health does not say draining"
rc=0
"$BIN/epd-ctl" submit --prefill "$p_ADDR" --decode "$d_ADDR" --model "$T/m" --prompt-file "$T/short" \
  --max-tokens 4 --tokens >/dev/null 2>"$T/err" || rc=$?
[ $rc = 1 ] || fail "submit to a draining decode: exit $rc"
grep -q DRAINING "$T/err" || fail "not refused with EPD_ERR_DRAINING: $(cat "$T/err")"
"$BIN/epd-ctl" drain "$p_ADDR" --worker-id prefill-x || fail "prefill drain failed"
[ "$(health_field "$p_ADDR" draining)" = 1 ] || fail "prefill Health does not say draining"
finish_ok
