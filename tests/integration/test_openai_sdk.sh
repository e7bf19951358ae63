#!/usr/bin/env bash
# The official OpenAI Node SDK (npm package `openai`) with base_url pointed
# at epd-router (1 prefill + 1 decode registered with --router), the
# router holding an API key (--api-key-file) and the SDK given it as
# apiKey: models, chat and completions, non-streaming and streaming, equal
# epd-generate's text, with the sampling fields (penalties, logit_bias,
# repetition_penalty, min_tokens) too; a refused field (tools,
# response_format, top_logprobs 1000, n 17, an unknown key) is the SDK's
# BadRequestError naming it; chat logprobs come one per token; a bad request becomes the SDK's APIError with a 4xx,
# a wrong key its AuthenticationError (401, invalid_api_key).  The SDK
# (openai 4.104.0, pinned in tests/integration/openai-sdk/) is installed
# into build/node by make deps; without it (offline) the test says SKIP.
source "$(dirname "$0")/lib.sh"

NODE_DIR=${EPD_NODE_DIR:-build/node}
if ! command -v node >/dev/null 2>&1; then
  echo "SKIP: node is not installed (the OpenAI Node SDK test needs Node >= 18)"
  exit 0
fi
if [ ! -f "$NODE_DIR/node_modules/openai/package.json" ]; then
  # make deps installs it (tests/integration/openai-sdk/deps.sh)
  echo "SKIP: the OpenAI Node SDK is not installed in $NODE_DIR (make deps; offline?)"
  exit 0
fi
note "OpenAI Node SDK $(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' \
  "$NODE_DIR/node_modules/openai/package.json" | head -n 1), node $(node --version)"

mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"
KEY=sk-sdk-$RANDOM$RANDOM
(umask 077 && printf '%s\n' "$KEY" >"$T/keys")
start_router r --model "$T/m" --heartbeat-ms 200 --api-key-file "$T/keys"
start_daemon d decode --model "$T/m" --worker-id decode-0 --kv-blocks 512 --state-slots 32 \
  --router "$r_ADDR"
start_daemon p prefill --model "$T/m" --worker-id prefill-0 --router "$r_ADDR"
wait_router_state "$r_ADDR" decode-0 READY
wait_router_state "$r_ADDR" prefill-0 READY

node "$(dirname "$0")/epd_openai_sdk.cjs" "$NODE_DIR" "$r_HTTP/v1" m "$T/m" "$BIN/epd-generate" \
  "$KEY" ||
  fail "the OpenAI Node SDK run above"
wait_blocks_free "$d_ADDR"
finish_ok
