#!/usr/bin/env bash
# Garbage over the transport: random bytes, truncated frames, bad checksums
# (no reply possible: the daemon's log must say so), valid frames naming the
# unknown request id 999999, absurd sizes (a reservation with 20000 block
# ids or block ids beyond the pool, max_tokens 2^31, token ids >= vocab),
# wrong epochs, a duplicate live id: each identifiable one gets an Error
# reply (epd-itest-raw checks them), nothing is written outside a
# reservation, and both daemons keep serving: a valid request afterwards
# equals colocated and decode's pool returns to full.
source "$(dirname "$0")/lib.sh"

mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"
start_daemon d decode --model "$T/m" --worker-id decode-g --lease-ms 2000 --kv-blocks 512 \
  --state-slots 32
start_daemon p prefill --model "$T/m" --worker-id prefill-g --lease-ms 2000
note "prefill $p_ADDR, decode $d_ADDR"
"$ITEST/epd-itest-raw" garbage --prefill "$p_ADDR" --decode "$d_ADDR" ||
  fail "a daemon answered garbage wrongly (lines above)"
kill -0 "$p_PID" && kill -0 "$d_PID" || fail "a daemon died"
for who in p d; do
  grep -Eqi "malformed|does not decode|bad magic|checksum|truncated|bad frame" "$T/$who.log" ||
    fail "$who logged nothing about the frames that do not decode"
  grep -Eqi "dropping a ([0-9]+-byte )?message" "$T/$who.log" ||
    fail "$who's transport logged nothing about the ~3 MB message"
done
printf 'Still serving after the garbage?' >"$T/short"
same_as_colocated "$T/m" "$p_ADDR" "$d_ADDR" "$T/short" 16
same_as_colocated "$T/m" "$p_ADDR" "$d_ADDR" "$T/short" 16 --temperature 0.8 --top-p 0.9 --seed 3
wait_blocks_free "$d_ADDR" 20
finish_ok
