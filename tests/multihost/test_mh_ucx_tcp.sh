#!/usr/bin/env bash
# The six-host cluster over UCX (UCX_TLS=tcp): see mh_equal.sh.
exec "$(dirname "$0")/mh_equal.sh" ucx-tcp
