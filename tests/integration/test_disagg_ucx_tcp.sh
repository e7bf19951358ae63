#!/usr/bin/env bash
# Disaggregated equals colocated over ucx-tcp (see disagg_equals_colocated.sh).
exec "$(dirname "$0")/disagg_equals_colocated.sh" ucx-tcp
