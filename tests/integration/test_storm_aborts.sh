#!/usr/bin/env bash
# 200 concurrent requests through one prefill and one decode daemon, with
# aborts at random moments (right behind the request, after a random delay,
# mid-decode, after the end): every request ends in exactly one terminal
# event, every request that was not aborted equals its colocated result (and
# an aborted one's tokens are a prefix of it: no request sees another's
# KV), the decode pool returns to full, both daemons keep answering Health
# (epd-itest-storm checks all of it; see tests/integration/epd_itest_storm.c).
source "$(dirname "$0")/lib.sh"

mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"
start_daemon d decode --model "$T/m" --worker-id decode-s --kv-blocks 4096 --state-slots 256
# prefill holds local blocks and a state slot for every request it queues
start_daemon p prefill --model "$T/m" --worker-id prefill-s --kv-blocks 8192 --state-slots 256
note "prefill $p_ADDR, decode $d_ADDR"
"$ITEST/epd-itest-storm" --prefill "$p_ADDR" --decode "$d_ADDR" --model "$T/m" --requests 200 \
  --seed "${EPD_ITEST_SEED:-20261129}" --timeout-s 150 || fail "storm: see the lines above"
kill -0 "$p_PID" && kill -0 "$d_PID" || fail "a daemon died"
stop_daemon p TERM
[ "$STOP_RC" = 0 ] || fail "prefill exited $STOP_RC on SIGTERM"
stop_daemon d TERM
[ "$STOP_RC" = 0 ] || fail "decode exited $STOP_RC on SIGTERM"
finish_ok
