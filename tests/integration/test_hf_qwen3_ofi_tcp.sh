#!/usr/bin/env bash
# Hugging Face folders through the cluster over ofi-tcp, part qwen3 (see hf_cluster.sh).
exec "$(dirname "$0")/hf_cluster.sh" ofi-tcp qwen3
