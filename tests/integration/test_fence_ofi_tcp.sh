#!/usr/bin/env bash
# The fence against a stalled writer over ofi-tcp (see fence_stall.sh).
exec "$(dirname "$0")/fence_stall.sh" ofi-tcp
