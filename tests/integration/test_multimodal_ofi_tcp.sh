#!/usr/bin/env bash
# Multimodal encode -> prefill -> decode over ofi-tcp (see multimodal_cluster.sh).
exec "$(dirname "$0")/multimodal_cluster.sh" ofi-tcp
