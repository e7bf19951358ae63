#!/usr/bin/env bash
# The six-host cluster over libfabric (tcp;ofi_rxm): see mh_equal.sh.
exec "$(dirname "$0")/mh_equal.sh" ofi-tcp
