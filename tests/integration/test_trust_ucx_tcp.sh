#!/usr/bin/env bash
# The request plane under a cluster secret over ucx-tcp (see trust_cluster.sh).
exec "$(dirname "$0")/trust_cluster.sh" ucx-tcp
