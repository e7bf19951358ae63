#!/usr/bin/env bash
# The epd-prefill daemon test (test_epd_prefill_daemon) again, with the
# daemon and its fake client and decode on libfabric (tcp;ofi_rxm).
set -euo pipefail
export EPD_PREFILL_TEST_BACKEND=ofi
export FI_PROVIDER="tcp;ofi_rxm"
exec "${EPD_BUILD:-build}/tests/test_epd_prefill_daemon"
