#!/usr/bin/env bash
# Hugging Face tokenizer folders through the cluster over ucx-shm (see hf_cluster.sh).
exec "$(dirname "$0")/hf_cluster.sh" ucx-shm
