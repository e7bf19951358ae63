#!/usr/bin/env bash
# Multimodal chat through the router with no encoder pool: each image goes
# inline to the prefill worker, which decodes and encodes it itself
# (proto/README.md rule 15), and the answers equal `epd-generate --image`:
#  - one PNG, one JPEG, two images in one message, streaming and not;
#  - the same image again is a cache hit (no encode) with the same answer;
#  - concurrent clients over a few images, also more at once than the
#    prefill worker has embedding slots for (requests wait for a slot);
#  - bad images and image URLs get a 400 with an OpenAI error, and the
#    router and workers keep serving; a JPEG without quantization tables
#    gets the same 400 each time.
source "$(dirname "$0")/lib.sh"

mkmodel "$T/m" "${TINY_VISION_FLAGS[@]}"
mkimage png "$T/a.png" 64 48 1
mkimage jpeg "$T/b.jpg" 80 60 2
mkimage png "$T/c.png" 17 33 3
start_router r --model "$T/m" --heartbeat-ms 200
start_daemon d decode --model "$T/m" --worker-id decode-0 --kv-blocks 512 --state-slots 32 \
  --router "$r_ADDR"
start_daemon p prefill --model "$T/m" --worker-id prefill-0 --router "$r_ADDR" --embed-slots 8
wait_router_state "$r_ADDR" decode-0 READY
wait_router_state "$r_ADDR" prefill-0 READY
G="$BIN/epd-generate"
H=$r_HTTP

note "images equal epd-generate --image"
router_client images "$H" "$T/m" "$G" --images "$T/a.png" --text "What is <|image|> here?" \
  --max-tokens 12 || fail "one PNG"
router_client images "$H" "$T/m" "$G" --images "$T/b.jpg" --text "Describe this." \
  --max-tokens 12 --stream || fail "one JPEG, streamed, image first"
router_client images "$H" "$T/m" "$G" --images "$T/a.png,$T/c.png" \
  --text "Compare <|image|> with <|image|>, please." --max-tokens 16 --stream ||
  fail "two images"
router_client images "$H" "$T/m" "$G" --images "$T/c.png" --text "Sampled <|image|>." \
  --max-tokens 12 --temperature 0.9 --seed 5 || fail "sampled"
local0=$(router_metric "$H" epd_router_images_local_total)
[ "$local0" -ge 3 ] || fail "images_local_total=$local0 (nothing encoded by prefill?)"

note "the same image again: from the prefill worker's cache, same answer"
hits0=$(router_metric "$H" epd_router_image_cache_hits_total)
router_client images "$H" "$T/m" "$G" --images "$T/a.png" --text "What is <|image|> here?" \
  --max-tokens 12 || fail "cache hit"
hits1=$(router_metric "$H" epd_router_image_cache_hits_total)
[ "$hits1" = $((hits0 + 1)) ] || fail "cache hits $hits0 -> $hits1"
[ "$(router_metric "$H" epd_router_images_local_total)" = "$local0" ] ||
  fail "the cached image was encoded again"

note "concurrent clients over three images"
router_client imgload "$H" "$T/m" "$G" --images "$T/a.png,$T/b.jpg,$T/c.png" --clients 4 \
  --requests 24 --max-tokens 6 || fail "image load"

note "bad images and image URLs: 400 with an OpenAI error"
mkimage bomb "$T/bomb.png"
mkimage text "$T/notimage.png"
NOQUANT=$(dirname "$0")/../fuzz/corpus/fuzz_epd_image/noquant-uninit.jpg
"$PYTHON3" - "$T" "$NOQUANT" <<'PY' || fail "writing the bad bodies"
import base64, json, sys
t = sys.argv[1]
def body(parts):
    return json.dumps({"model": "m", "max_tokens": 4,
                       "messages": [{"role": "user", "content": parts}]})
def img(url):
    return {"type": "image_url", "image_url": {"url": url}}
def b64(path):
    return base64.b64encode(open(path, "rb").read()).decode()
good = "data:image/png;base64," + b64(t + "/a.png")
bodies = {
    "b64": body([img("data:image/png;base64,@@not*base64@@")]),
    "notimage": body([img("data:image/png;base64," + b64(t + "/notimage.png"))]),
    "bomb": body([img("data:image/png;base64," + b64(t + "/bomb.png"))]),
    "many": body([img(good)] * 9),
    "remote": body([img("https://example.com/cat.png")]),
    "mime": body([img("data:text/plain;base64," + b64(t + "/a.png"))]),
    "nourl": body([{"type": "image_url", "image_url": {}}]),
    "truncated": body([img("data:image/png;base64," + b64(t + "/a.png")[:400])]),
    # fuzz_epd_image's JPEG without quantization tables (stb_image decoded
    # it from whatever the heap held: different answers to one request)
    "noquant": body([img("data:image/jpeg;base64," + b64(sys.argv[2]))]),
}
for k, v in bodies.items():
    open("%s/bad-%s.json" % (t, k), "w").write(v)
PY
check_bad() { # NAME WANT_STATUS WORDS
  router_client raw "$H" POST /v1/chat/completions "@$T/bad-$1.json" >"$T/bad-$1.out"
  [ "$(head -n 1 "$T/bad-$1.out")" = "$2" ] || fail "$1: $(head -c 400 "$T/bad-$1.out")"
  grep -q '"error":{"message":' "$T/bad-$1.out" || fail "$1: no OpenAI error: $(cat "$T/bad-$1.out")"
  grep -qi "$3" "$T/bad-$1.out" || fail "$1: the message does not say '$3': $(cat "$T/bad-$1.out")"
}
check_bad b64 400 "not valid base64"
check_bad notimage 400 "not a PNG or JPEG"
check_bad bomb 400 "60000 x 60000 pixels"
check_bad many 400 "at most 8"
check_bad remote 400 "does not fetch images"
check_bad mime 400 "base64 data: URL of an image"
check_bad nourl 400 "image_url.url"
check_bad truncated 400 "image"
# the header parses (the router passes it on), the decoder refuses it: the
# same 400 every time
for i in 1 2 3; do
  check_bad noquant 400 "does not decode"
  msg=$(tail -n +2 "$T/bad-noquant.out")
  [ "$i" = 1 ] && first=$msg
  [ "$msg" = "$first" ] || fail "noquant: answer $i differs: $msg / $first"
done
router_client images "$H" "$T/m" "$G" --images "$T/c.png" --text "Still fine? <|image|>" \
  --max-tokens 8 || fail "a good image after the bad ones"

note "more images at once than the prefill worker holds: requests wait for slots"
# prefill-0 drained at the router; prefill-1 caches 2 images while 6
# clients send 1 or 2 of 6 images each: without waiting, most would fail
# with 'every embedding slot is in use'
"$BIN/epd-ctl" drain "$r_ADDR" --worker-id prefill-0 >/dev/null || fail "drain prefill-0"
wait_router_state "$r_ADDR" prefill-0 DRAINING
start_daemon p1 prefill --model "$T/m" --worker-id prefill-1 --router "$r_ADDR" --embed-slots 2
wait_router_state "$r_ADDR" prefill-1 READY
for i in 4 5 6 7; do
  mkimage png "$T/s$i.png" $((20 + i)) $((40 - i)) "$i"
done
router_client imgload "$H" "$T/m" "$G" \
  --images "$T/a.png,$T/b.jpg,$T/s4.png,$T/s5.png,$T/s6.png,$T/s7.png" --clients 6 \
  --requests 36 --max-tokens 4 || fail "image load on 2 slots"
wait_blocks_free "$d_ADDR"
finish_ok
