#!/usr/bin/env bash
# trust_cluster.sh CONF — the request plane of a cluster that runs with a
# cluster secret (--cluster-secret-file), attacked through its real
# interfaces by epd-itest-rogue (see its header): strangers with the wrong
# secret or none cannot complete a handshake with a worker; a member that
# forges the sender of WritesQuiesced, Abort, a newer epoch's LayerDone or
# a TokenChunk is refused by decode, prefill and the victim client; the
# victim's request still ends with the colocated tokens.  Then a prefill
# daemon started with the wrong secret cannot ship a request's KV to the
# decode worker: the request fails and decode names the refused handshake.
# CONF: ucx-shm, ucx-tcp, ofi-tcp (as disagg_equals_colocated.sh).
source "$(dirname "$0")/lib.sh"

conf=${1:?usage: trust_cluster.sh ucx-shm|ucx-tcp|ofi-tcp}
case "$conf" in
  ucx-shm) export UCX_TLS=posix,cma,tcp; XFLAGS=(--transport ucx --expect-transport shm); BK=ucx ;;
  ucx-tcp) export UCX_TLS=tcp; XFLAGS=(--transport ucx --expect-transport tcp); BK=ucx ;;
  ofi-tcp) export FI_PROVIDER="tcp;ofi_rxm"
           XFLAGS=(--transport ofi --expect-transport tcp --provider "tcp;ofi_rxm"); BK=ofi ;;
  *) fail "unknown configuration $conf" ;;
esac

( umask 077; head -c 32 /dev/urandom >"$T/secret"; head -c 32 /dev/urandom >"$T/wrong" )
# epd-ctl (and lib.sh's status helpers) read it when no flag is given
export EPD_CLUSTER_SECRET_FILE="$T/secret"
mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"
start_daemon d decode --model "$T/m" --worker-id decode-t "${XFLAGS[@]}" \
  --kv-blocks 512 --state-slots 32 --cluster-secret-file "$T/secret"
start_daemon p prefill --model "$T/m" --worker-id prefill-t "${XFLAGS[@]}" \
  --kv-blocks 256 --state-slots 16 --cluster-secret-file "$T/secret"

note "$conf: strangers and a forging member against prefill $p_ADDR and decode $d_ADDR"
"$ITEST/epd-itest-rogue" --backend "$BK" --prefill "$p_ADDR" --decode "$d_ADDR" --model "$T/m" \
  --secret-file "$T/secret" --wrong-secret-file "$T/wrong" || fail "the cluster trusted a rogue (see above)"
for what in "quiesced claims to come from 'prefill-t' but its endpoint is 'rogue-1''s" \
            "abort claims to come from 'victim' but its endpoint is 'rogue-1''s" \
            "layer_done claims to come from 'prefill-t' but its endpoint is 'rogue-1''s"; do
  grep -qF "$what" "$T/d.log" || fail "decode did not log: $what"
done
grep -qF "abort claims to come from 'victim' but its endpoint is 'rogue-1''s" "$T/p.log" ||
  fail "prefill did not log the forged Abort"

note "a prefill daemon with the wrong secret cannot write into decode"
start_daemon w prefill --model "$T/m" --worker-id prefill-w "${XFLAGS[@]}" \
  --kv-blocks 256 --state-slots 16 --cluster-secret-file "$T/wrong"
printf 'Hello, trusted world!' >"$T/short"
if "$BIN/epd-ctl" submit --prefill "$w_ADDR" --decode "$d_ADDR" --model "$T/m" \
     --prompt "$(cat "$T/short")" --max-tokens 8 --cluster-secret-file "$T/wrong" \
     --transport "$BK" >"$T/w.out" 2>&1; then
  fail "a request through the wrong-secret prefill succeeded: $(cat "$T/w.out")"
fi
note "refused: $(tail -n 1 "$T/w.out")"
wait_blocks_free "$d_ADDR" 20

stop_daemon w TERM
stop_daemon p TERM
[ "$STOP_RC" = 0 ] || fail "prefill exited $STOP_RC on SIGTERM"
stop_daemon d TERM
[ "$STOP_RC" = 0 ] || fail "decode exited $STOP_RC on SIGTERM"
finish_ok
