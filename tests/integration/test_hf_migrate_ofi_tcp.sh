#!/usr/bin/env bash
# Hugging Face folders through the cluster over ofi-tcp, part migrate (see hf_cluster.sh).
exec "$(dirname "$0")/hf_cluster.sh" ofi-tcp migrate
