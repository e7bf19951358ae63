#!/usr/bin/env bash
# The request plane under a cluster secret over ofi-tcp (see trust_cluster.sh).
exec "$(dirname "$0")/trust_cluster.sh" ofi-tcp
