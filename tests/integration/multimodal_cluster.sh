#!/usr/bin/env bash
# multimodal_cluster.sh CONF — encode -> prefill -> decode through the
# router (2 encoders, 2 prefill, 2 decode workers registered with
# --router), CONF ucx-shm or ofi-tcp:
#  - chat requests with images (PNG, JPEG, two in one message, streamed,
#    sampled) equal `epd-generate --image` token for token; the embeddings
#    travel from the encoders to the prefill workers as one-sided writes;
#  - a repeated image skips the encoder (a cache hit at the prefill worker
#    the router sends it to) and gives the same answer;
#  - concurrent clients over more images than a prefill worker caches
#    (eviction, and hints the prefill worker may disprove): all equal
#    epd-generate, and the image metrics add up;
#  - an image that passes the router's header check but does not decode
#    fails on its encoder: a 400;
#  - (ucx-shm) an encoder stopped and killed with requests waiting on it:
#    they are retried on a new encoder (encoder-1 is stopped first) and all
#    succeed, equal to
#    epd-generate; the dead encoder leaves READY.
source "$(dirname "$0")/lib.sh"

conf=${1:?usage: multimodal_cluster.sh ucx-shm|ofi-tcp}
case "$conf" in
  ucx-shm) export UCX_TLS=posix,cma,tcp; XFLAGS=(--transport ucx --expect-transport shm) ;;
  ofi-tcp) export FI_PROVIDER="tcp;ofi_rxm"
           XFLAGS=(--transport ofi --expect-transport tcp --provider "tcp;ofi_rxm") ;;
  *) fail "unknown configuration $conf" ;;
esac

mkmodel "$T/m" "${TINY_VISION_FLAGS[@]}"
for i in 0 1 2 3 4; do
  mkimage png "$T/i$i.png" $((40 + 7 * i)) $((30 + 5 * i)) $((10 + i))
done
mkimage jpeg "$T/j.jpg" 96 64 21
start_router r --model "$T/m" --heartbeat-ms 200 --dead-after-ms 1000 --peer-timeout-ms 1500 \
  "${XFLAGS[@]}"
for i in 0 1; do
  start_daemon "e$i" encoder --model "$T/m" --worker-id "encoder-$i" --router "$r_ADDR" \
    --peer-timeout-ms 1500 "${XFLAGS[@]}"
  start_daemon "d$i" decode --model "$T/m" --worker-id "decode-$i" --kv-blocks 512 \
    --state-slots 32 --router "$r_ADDR" --peer-timeout-ms 1500 "${XFLAGS[@]}"
  start_daemon "p$i" prefill --model "$T/m" --worker-id "prefill-$i" --router "$r_ADDR" \
    --embed-slots 3 --peer-timeout-ms 1500 "${XFLAGS[@]}"
done
for w in encoder-0 encoder-1 decode-0 decode-1 prefill-0 prefill-1; do
  wait_router_state "$r_ADDR" "$w" READY
done
[ "$(health_field "$e0_ADDR" role)" = encoder ] || fail "the encoder's Health role is not encoder"
G="$BIN/epd-generate"
H=$r_HTTP
metric() { router_metric "$H" "$1"; }

note "$conf: images through the encoders equal epd-generate --image"
router_client images "$H" "$T/m" "$G" --images "$T/i0.png" --text "What is <|image|> here?" \
  --max-tokens 12 || fail "one PNG"
router_client images "$H" "$T/m" "$G" --images "$T/j.jpg" --text "Describe it." \
  --max-tokens 12 --stream || fail "one JPEG, streamed"
router_client images "$H" "$T/m" "$G" --images "$T/i1.png,$T/i2.png" \
  --text "<|image|> or <|image|>?" --max-tokens 16 || fail "two images"
router_client images "$H" "$T/m" "$G" --images "$T/i3.png" --text "Sampled: <|image|>" \
  --max-tokens 12 --temperature 0.8 --seed 9 --stream || fail "sampled"
enc0=$(metric epd_router_images_encoded_total)
[ "$enc0" = 5 ] || fail "images_encoded_total=$enc0, want 5 (every image by an encoder)"
[ "$(metric epd_router_images_local_total)" = 0 ] || fail "an image was encoded by prefill"
n0=$(metric 'epd_router_worker_requests_total{worker="encoder-0",pool="encoder"}')
n1=$(metric 'epd_router_worker_requests_total{worker="encoder-1",pool="encoder"}')
[ "${n0:-0}" -gt 0 ] && [ "${n1:-0}" -gt 0 ] || fail "encoders took $n0 and $n1 images"

note "the same image again: a cache hit, no encoder, the same answer"
hits0=$(metric epd_router_image_cache_hits_total)
router_client images "$H" "$T/m" "$G" --images "$T/i0.png" --text "What is <|image|> here?" \
  --max-tokens 12 || fail "cache hit"
[ "$(metric epd_router_image_cache_hits_total)" = $((hits0 + 1)) ] || fail "not a cache hit"
[ "$(metric epd_router_images_encoded_total)" = "$enc0" ] || fail "the cached image was encoded"

note "concurrent clients over six images, three cached per prefill worker"
router_client imgload "$H" "$T/m" "$G" \
  --images "$T/i0.png,$T/i1.png,$T/i2.png,$T/i3.png,$T/i4.png,$T/j.jpg" --clients 4 \
  --requests 36 --max-tokens 6 || fail "image load"
imgs=$(metric epd_router_images_total)
sum=$(($(metric epd_router_image_cache_hits_total) + $(metric epd_router_images_encoded_total) + \
       $(metric epd_router_images_local_total)))
[ "$imgs" = "$sum" ] || fail "images_total $imgs != hits + encoded + local = $sum"
echo "images $imgs: hits $(metric epd_router_image_cache_hits_total), encoded" \
     "$(metric epd_router_images_encoded_total), stale hints $(metric epd_router_image_cache_stale_total)"

note "an image that does not decode: its encoder fails it, a 400"
head -c 700 "$T/i4.png" >"$T/cut.png"
router_client images "$H" "$T/m" "$G" --images "$T/cut.png" --text "<|image|>" --max-tokens 4 \
  --expect-error 400 || fail "truncated PNG"

if [ "$conf" = ucx-shm ]; then
  note "encoder-0 stopped, then killed, with requests waiting on it: retried on encoder-2"
  stop_daemon e1 TERM
  wait_router_state "$r_ADDR" encoder-1 DEAD 10
  kill -STOP "$e0_PID"
  r0=$(metric epd_router_retries_total)
  # fresh images (no cache hit): they go to encoder-0, the only encoder
  for i in 0 1 2; do
    mkimage png "$T/k$i.png" 50 50 $((40 + i))
    router_client images "$H" "$T/m" "$G" --images "$T/k$i.png" --text "Stuck <|image|>?" \
      --max-tokens 6 >"$T/k$i.out" 2>&1 &
    PIDS+=($!)
    kpids[$i]=$!
  done
  sleep 0.5
  start_daemon e2 encoder --model "$T/m" --worker-id encoder-2 --router "$r_ADDR" \
    --peer-timeout-ms 1500 "${XFLAGS[@]}"
  wait_router_state "$r_ADDR" encoder-2 READY
  stop_daemon e0 KILL
  for i in 0 1 2; do
    wait "${kpids[$i]}" || fail "request $i after the encoder died: $(cat "$T/k$i.out")"
  done
  r1=$(metric epd_router_retries_total)
  [ "$r1" -gt "$r0" ] || fail "no retry counted ($r0 -> $r1)"
  st=$(router_state "$r_ADDR" encoder-0)
  [ "$st" = DEAD ] || [ "$st" = SUSPECT ] || fail "killed encoder-0 is $st"
  router_client images "$H" "$T/m" "$G" --images "$T/i2.png,$T/j.jpg" \
    --text "After: <|image|> <|image|>" --max-tokens 8 || fail "requests after the kill"
fi
for i in 0 1; do
  wait_blocks_free "$(eval echo \$d${i}_ADDR)"
done
finish_ok
