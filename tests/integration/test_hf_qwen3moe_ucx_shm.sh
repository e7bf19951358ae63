#!/usr/bin/env bash
# Hugging Face folders through the cluster over ucx-shm, part qwen3_moe (see hf_cluster.sh).
exec "$(dirname "$0")/hf_cluster.sh" ucx-shm qwen3_moe
