#!/usr/bin/env bash
# Installs the npm packages the Kubernetes manifest check needs into
# DIR (default build/k8s-node) unless they are there: kubernetes-models
# (schemas of the built-in kinds), @kubernetes-models/keda (KEDA's CRD
# schemas), yaml.  Called by `make deps` and by
# tests/deploy/test_k8s_manifests.sh; after the first run the check works
# offline.  Exit 0 when installed (or already there), 1 when npm is
# missing or cannot install (offline).
#   tests/deploy/k8s_node_deps.sh [DIR]
set -euo pipefail
dir=${1:-build/k8s-node}
pkgs=(kubernetes-models@5.1.0 @kubernetes-models/keda@2.0.0 yaml@2.9.1)
if [ -f "$dir/node_modules/kubernetes-models/package.json" ] &&
   [ -f "$dir/node_modules/@kubernetes-models/keda/package.json" ] &&
   [ -f "$dir/node_modules/yaml/package.json" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "k8s-node: npm is not installed" >&2
  exit 1
fi
mkdir -p "$dir"
echo "k8s-node: npm install ${pkgs[*]} into $dir"
timeout 300 npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "${pkgs[@]}"
