#!/usr/bin/env bash
# Writes the two files the base's secretGenerator reads, mode 0600, unless
# they exist: base/secrets/cluster-secret (32 random bytes) and
# base/secrets/api-keys (one fresh key, printed once).  They are ignored by
# git.  Rotate the cluster secret blue/green (docs/deploy/kubernetes.md).
#   deploy/k8s/make-secrets.sh [DIR]   (DIR: default base/secrets beside this)
set -euo pipefail
dir=${1:-$(cd "$(dirname "$0")" && pwd)/base/secrets}
mkdir -p "$dir"
umask 077
if [ ! -s "$dir/cluster-secret" ]; then
  head -c 32 /dev/urandom >"$dir/cluster-secret"
  echo "wrote $dir/cluster-secret"
fi
if [ ! -s "$dir/api-keys" ]; then
  key="sk-epd-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  printf '%s\n' "$key" >"$dir/api-keys"
  echo "wrote $dir/api-keys; the API key: $key"
fi
