#!/usr/bin/env bash
# Hugging Face folders through the cluster over ucx-shm, part qwen3 (see hf_cluster.sh).
exec "$(dirname "$0")/hf_cluster.sh" ucx-shm qwen3
