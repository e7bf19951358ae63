#!/usr/bin/env bash
# `make bench`: every benchmark, one after the other, each printing its table.
set -euo pipefail
build=${1:-build}
bench="$build/bin/epd-bench"
for sub in $("$bench" --help | awk '/^  [a-z]/ { print $1 }'); do
  echo "===== epd-bench $sub ====="
  "$bench" "$sub"
  echo
done
