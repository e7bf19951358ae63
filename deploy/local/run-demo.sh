#!/usr/bin/env bash
# `make run` (for now): the colocated demo.  Writes the default model to
# build/models/default if it is absent, then generates from a prompt in one
# process with the ref engine — the baseline the disaggregated cluster must
# reproduce token for token.  PROMPT=... and MAX_TOKENS=... override.
set -euo pipefail
build=${1:-build}
model="$build/models/default"
prompt=${PROMPT:-"The disaggregated cluster splits every request into"}
max_tokens=${MAX_TOKENS:-64}

if [ ! -f "$model/config.json" ] || [ ! -f "$model/model.safetensors" ]; then
  echo "writing the default model to $model"
  "$build/bin/epd-mkmodel" --out "$model"
fi
echo "prompt: $prompt"
echo "----- colocated generation (ref engine, greedy) -----"
"$build/bin/epd-generate" --model "$model" --prompt "$prompt" --max-tokens "$max_tokens"
echo
echo "-----"
echo "(the model has seeded random weights: the text is arbitrary bytes, but it is"
echo " reproducible, which is what the cluster's equality tests rely on)"
