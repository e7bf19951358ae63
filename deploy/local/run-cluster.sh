#!/usr/bin/env bash
# `make run`: a local epd cluster on 127.0.0.1 — epd-router plus the
# encoder, prefill and decode pools of deploy/local/cluster.conf (1 + 1 + 1
# by default; encoders only for a model with a vision encoder), each worker
# registering with the router (--router).  Writes the default
# model to $BUILD/models/default when absent.  Prints the endpoint and a
# curl line, serves until Ctrl-C (or SIGTERM), then stops every daemon
# (SIGTERM, then SIGKILL after 10 s) and exits.
#
#   deploy/local/run-cluster.sh [BUILD] [CLUSTER_FILE]
#   env overrides: PORT, PREFILL, DECODE, ENCODER, POLICY, TRANSPORT, ENGINE, MODEL
#   (make run MODEL=DIR serves the folder DIR: epd-ref or Hugging Face)
#   API_KEY=KEY: the router takes it as its API key (a 0600 file in the
#   run's folder, --api-key-file): /v1 then needs 'Authorization: Bearer KEY'
# Every daemon gets --cluster-secret-file: 32 fresh random bytes in a 0600
# file of the run's folder, made for this run only (epd-ctl needs it too:
# the printed lines pass it).
set -euo pipefail
build=${1:-build}
conf=${2:-$(dirname "$0")/cluster.conf}
bin="$build/bin"

# the cluster file, under any environment overrides
declare -A env_over=()
for k in PREFILL DECODE ENCODER POLICY PORT TRANSPORT ENGINE MODEL DECODE_KV_BLOCKS \
         DECODE_STATE_SLOTS HEARTBEAT_MS; do
  if [ -n "${!k:-}" ]; then env_over[$k]=${!k}; fi
done
while IFS= read -r line || [ -n "$line" ]; do
  line=${line%%#*}
  [[ "$line" =~ ^[[:space:]]*$ ]] && continue
  if [[ ! "$line" =~ ^[[:space:]]*([A-Z_]+)=([^[:space:]]*)[[:space:]]*$ ]]; then
    echo "run-cluster: $conf: cannot parse: $line" >&2
    exit 1
  fi
  printf -v "${BASH_REMATCH[1]}" '%s' "${BASH_REMATCH[2]}"
done <"$conf"
for k in "${!env_over[@]}"; do printf -v "$k" '%s' "${env_over[$k]}"; done
MODEL=${MODEL:-$build/models/default}
ENCODER=${ENCODER:-0}
for k in PREFILL DECODE ENCODER PORT; do
  [[ "${!k}" =~ ^[0-9]+$ ]] || { echo "run-cluster: $k=${!k} is not a number" >&2; exit 1; }
done
[ "$PREFILL" -ge 1 ] && [ "$DECODE" -ge 1 ] || { echo "run-cluster: PREFILL and DECODE must be >= 1" >&2; exit 1; }

# MODEL=DIR (make run MODEL=DIR): the user's folder, served as it is — an
# epd-ref folder or a Hugging Face one (config.json, model.safetensors or
# model.safetensors.index.json and its shards, tokenizer.json,
# tokenizer_config.json, generation_config.json); never written here.
# Without MODEL the default model is written once to $build/models/default.
if [ "$MODEL" = "$build/models/default" ]; then
  if [ "$ENGINE" = ref ] && { [ ! -f "$MODEL/config.json" ] || [ ! -f "$MODEL/model.safetensors" ]; }; then
    echo "writing the default model to $MODEL"
    mkdir -p "$(dirname "$MODEL")"
    "$bin/epd-mkmodel" --out "$MODEL" >/dev/null
  fi
elif [ "$ENGINE" != sim ] && [ ! -f "$MODEL/config.json" ]; then
  echo "run-cluster: MODEL=$MODEL has no config.json (a model folder as Hugging Face publishes it, or one epd-mkmodel wrote)" >&2
  exit 1
fi

run=$(mktemp -d "${TMPDIR:-/tmp}/epd-cluster.XXXXXX")
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
export UCX_TLS=${UCX_TLS:-posix,cma,tcp}
pids=()
names=()

stop_all() {
  trap - EXIT INT TERM
  echo
  echo "stopping the cluster"
  # workers first (they deregister by going silent), the router last
  local i p
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[$i]}" 2>/dev/null || true
  done
  for i in $(seq 1 100); do
    local alive=0
    for p in "${pids[@]:-}"; do
      [ -n "$p" ] && kill -0 "$p" 2>/dev/null && alive=1
    done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for i in "${!pids[@]}"; do
    p=${pids[$i]}
    if kill -0 "$p" 2>/dev/null; then
      echo "  ${names[$i]} did not stop within 10 s: SIGKILL"
      kill -KILL "$p" 2>/dev/null || true
    fi
    local rc=0
    wait "$p" 2>/dev/null || rc=$?
    echo "  ${names[$i]} exited $rc"
  done
  echo "logs: $run"
}
trap stop_all EXIT
trap 'exit 0' INT TERM

# start NAME READY_FILE CMD...: starts a daemon, waits for its ready file
start() {
  local name=$1 ready=$2
  shift 2
  # its own session: a Ctrl-C reaches this script only, which then stops
  # the daemons in order (a second signal during a daemon's shutdown would
  # kill it)
  setsid "$@" --ready-file "$ready" >"$run/$name.log" 2>&1 </dev/null &
  pids+=($!)
  names+=("$name")
  local i
  for i in $(seq 1 600); do
    [ -s "$ready" ] && return 0
    if ! kill -0 "${pids[-1]}" 2>/dev/null; then
      echo "run-cluster: $name exited before it was ready:" >&2
      tail -n 20 "$run/$name.log" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "run-cluster: $name not ready within 60 s" >&2
  exit 1
}

# the cluster secret: members prove it to each other on every endpoint and
# control call; made fresh for each run, readable by this user only
(umask 077 && head -c 32 /dev/urandom >"$run/cluster-secret")
sec=(--cluster-secret-file "$run/cluster-secret")
key_flags=()
auth_hdr=""
if [ -n "${API_KEY:-}" ]; then
  # the key never goes on a command line (ps would show it): a file only
  # the user can read, in the run's own folder
  (umask 077 && printf '%s\n' "$API_KEY" >"$run/api-keys")
  key_flags=(--api-key-file "$run/api-keys")
  auth_hdr=" -H \"Authorization: Bearer \$API_KEY\""
fi
start router "$run/router.ready" "$bin/epd-router" --model "$MODEL" --engine "$ENGINE" \
  --listen "127.0.0.1:$PORT" --control-addr 127.0.0.1:0 --policy "$POLICY" \
  --transport "$TRANSPORT" --heartbeat-ms "$HEARTBEAT_MS" "${sec[@]}" \
  ${key_flags[@]+"${key_flags[@]}"}
ctl=$(sed -n 's/.*control=\([^ ]*\).*/\1/p' "$run/router.ready")
# the HTTP address the router bound (PORT=0: an ephemeral port)
http=$(sed -n 's/.*http=\([^ ]*\).*/\1/p' "$run/router.ready")
for i in $(seq 0 $((PREFILL - 1))); do
  start "prefill-$i" "$run/prefill-$i.ready" "$bin/epd-prefill" --model "$MODEL" --engine "$ENGINE" \
    --worker-id "prefill-$i" --transport "$TRANSPORT" --router "$ctl" "${sec[@]}"
done
for i in $(seq 0 $((DECODE - 1))); do
  start "decode-$i" "$run/decode-$i.ready" "$bin/epd-decode" --model "$MODEL" --engine "$ENGINE" \
    --worker-id "decode-$i" --transport "$TRANSPORT" --router "$ctl" "${sec[@]}" \
    --kv-blocks "$DECODE_KV_BLOCKS" --state-slots "$DECODE_STATE_SLOTS"
done
# encoders: only a model with a vision encoder has images to encode
vision=0
if [ "$ENGINE" = ref ] && grep -q '"vision_config"' "$MODEL/config.json" 2>/dev/null; then
  vision=1
else
  ENCODER=0
fi
for i in $(seq 0 $((ENCODER - 1))); do
  start "encoder-$i" "$run/encoder-$i.ready" "$bin/epd-encoder" --model "$MODEL" \
    --engine "$ENGINE" --worker-id "encoder-$i" --transport "$TRANSPORT" --router "$ctl" "${sec[@]}"
done
# every worker READY in the router's registry
want=$((PREFILL + DECODE + ENCODER))
for i in $(seq 1 100); do
  n=$("$bin/epd-ctl" status "$ctl" "${sec[@]}" 2>/dev/null | grep -c 'state=READY' || true)
  [ "$n" = "$want" ] && break
  sleep 0.1
done
[ "$n" = "$want" ] || { echo "run-cluster: only $n of $want workers registered" >&2; exit 1; }

name=$(basename "$MODEL")
cat <<INFO

epd cluster up: router + $ENCODER encoder + $PREFILL prefill + $DECODE decode ($POLICY, $TRANSPORT), model '$name'
  endpoint:  http://$http/v1   (OpenAI API; GET /health, /metrics)${API_KEY:+
  API key:   required on /v1 (the API_KEY given to make run; export it where you curl)}
  try:       curl -s http://$http/v1/completions$auth_hdr -H 'Content-Type: application/json' \\
               -d '{"model": "$name", "prompt": "The disaggregated cluster", "max_tokens": 32, "temperature": 0}'
INFO
if [ "$vision" = 1 ]; then
  cat <<INFO
  an image:  IMG=\$(base64 -w0 picture.png); curl -s http://$http/v1/chat/completions$auth_hdr \\
               -H 'Content-Type: application/json' -d '{"model": "$name", "max_tokens": 32, "messages":
               [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
               {"type": "image_url", "image_url": {"url": "data:image/png;base64,'\$IMG'"}}]}]}'
INFO
fi
cat <<INFO
  workers:   $bin/epd-ctl workers $ctl --cluster-secret-file $run/cluster-secret
  logs:      $run
Ctrl-C stops every daemon.
INFO
# serve until a signal (the INT/TERM trap exits; EXIT stops the daemons),
# or until the router itself goes away
while kill -0 "${pids[0]}" 2>/dev/null; do
  sleep 0.5
done
echo "run-cluster: the router exited" >&2
exit 1
