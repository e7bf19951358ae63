#!/usr/bin/env bash
# Multimodal encode -> prefill -> decode over ucx-shm (see multimodal_cluster.sh).
exec "$(dirname "$0")/multimodal_cluster.sh" ucx-shm
