#!/usr/bin/env bash
# Hugging Face tokenizer folders through the cluster over ofi-tcp (see hf_cluster.sh).
exec "$(dirname "$0")/hf_cluster.sh" ofi-tcp
