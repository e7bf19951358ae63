#!/usr/bin/env bash
# An image's content hash is the cache key of its embeddings on the prefill
# worker: one request must not be able to plant embeddings under another
# image's hash (proto/README.md rule 16).  epd-itest-poison sends A's bytes
# inline named by B's hash: refused, and B's hash is then not cached; A
# under its own hash is served, and again from the cache with the same
# tokens.
source "$(dirname "$0")/lib.sh"

mkmodel "$T/m" "${TINY_VISION_FLAGS[@]}"
mkimage png "$T/a.png" 64 48 1
mkimage png "$T/b.png" 64 48 2
start_daemon d decode --model "$T/m" --worker-id decode-h --kv-blocks 512 --state-slots 32
start_daemon p prefill --model "$T/m" --worker-id prefill-h --embed-slots 8
"$ITEST/epd-itest-poison" --prefill "$p_ADDR" --decode "$d_ADDR" --model "$T/m" \
  --image "$T/a.png" --other "$T/b.png" || fail "an image's hash was not checked (see above)"
grep -q "content_hash is not the BLAKE2b-256" "$T/p.log" || fail "prefill did not say why it refused"
stop_daemon p TERM
[ "$STOP_RC" = 0 ] || fail "prefill exited $STOP_RC on SIGTERM"
stop_daemon d TERM
[ "$STOP_RC" = 0 ] || fail "decode exited $STOP_RC on SIGTERM"
finish_ok
