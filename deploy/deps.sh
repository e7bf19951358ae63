#!/usr/bin/env bash
# Installs the Debian packages epd needs to build, test and benchmark.
# Idempotent: when everything is present it only runs dpkg-query (about a
# second). `apt-get update` runs only when something is missing.
set -euo pipefail

PACKAGES=(
  build-essential pkg-config clang libclang-rt-14-dev
  libucx-dev ucx-utils            # UCX: data plane backend + ucx_perftest reference
  libfabric-dev libfabric-bin     # libfabric: data plane backend + fi_pingpong reference
  libprotobuf-c-dev protobuf-c-compiler   # request/control plane messages
  libgrpc-dev                     # control plane (gRPC core C API)
  libuv1-dev                      # event loops
  libhttp-parser-dev              # HTTP/1.1 parsing (router; no .pc file: -lhttp_parser)
  libjansson-dev                  # JSON: model config, safetensors headers
  libxxhash-dev                   # checksums and hashing
  libzstd-dev                     # the prefix cache's host/disk KV tier (zstd compression)
  libopenblas-dev                 # ref engine matrix products
  libspng-dev                     # PNG decoding (vision encoder input; engine/epd_image.c)
  libjpeg62-turbo-dev             # JPEG decoding, libjpeg-turbo's libjpeg API (engine/epd_image.c)
  libstb-dev                      # stb_image_write: writes test images (never parses input)
  libsodium-dev                   # BLAKE2b-256 content hashes of images (the embedding cache key)
  libonig-dev                     # tokenizer: Oniguruma, the regex engine of HF tokenizers' Split patterns
  libicu-dev                      # tokenizer: NFC/NFKC normalization (ICU)
  python3-jinja2                  # chat-template oracle: Jinja as transformers renders it (tests/tokenizer)
  libcmocka-dev                   # unit tests
  python3 curl procps iproute2    # integration test helpers
  python3-numpy                   # tests/models: the float64 forward-pass oracle (hf_ref.py)
  nftables util-linux             # tests/multihost: nft (faults), nsenter (hosts)
  prometheus                      # promtool: /metrics lint, the autoscalers' PromQL (tests/deploy)
  nodejs                          # deploy/k8s render + schema check (npm packages cached in build/)
  podman buildah runc catatonit   # deploy/container: image built offline, smoke-tested in namespaces
  slurm-wlm munge                 # deploy/slurm: sbatch recipes tested on a two-node Slurm
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

# npm: Debian's nodejs leaves it to the npm package, other builds of
# nodejs (NodeSource's) bundle it and conflict with that package
if ! command -v npm >/dev/null 2>&1 && ! printf '%s\n' "${missing[@]:-}" | grep -qx nodejs; then
  missing+=(npm)
fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
if ! command -v npm >/dev/null 2>&1; then
  $SUDO apt-get install -y -qq --no-install-recommends npm
fi
