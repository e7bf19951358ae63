#!/usr/bin/env bash
# Installs the OpenAI Node SDK the OpenAI-surface tests drive the router
# with (package.json here, pinned by package-lock.json: openai 4.104.0,
# unmodified) into DIR (default build/node) unless that exact lockfile is
# installed there already.  Called by `make deps`, once, before any test
# runs: the tests only read DIR (two of them installing into one folder at
# once, as they did, could leave it half written).  Exit 0 when installed
# (or already there), 1 when npm is missing or cannot install (offline).
#   tests/integration/openai-sdk/deps.sh [DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-build/node}
if [ -f "$dir/installed.lock.json" ] && [ -d "$dir/node_modules" ] &&
   cmp -s "$dir/installed.lock.json" "$here/package-lock.json"; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "openai-sdk: npm is not installed" >&2
  exit 1
fi
mkdir -p "$dir"
rm -f "$dir/installed.lock.json"
cp "$here/package.json" "$here/package-lock.json" "$dir/"
echo "openai-sdk: npm ci into $dir"
timeout 600 npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error
# the stamp last: an interrupted install is redone next time
cp "$here/package-lock.json" "$dir/installed.lock.json"
