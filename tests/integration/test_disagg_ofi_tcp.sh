#!/usr/bin/env bash
# Disaggregated equals colocated over ofi-tcp (see disagg_equals_colocated.sh).
exec "$(dirname "$0")/disagg_equals_colocated.sh" ofi-tcp
