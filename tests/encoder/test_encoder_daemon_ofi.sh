#!/usr/bin/env bash
# The epd-encoder daemon test (test_epd_encoder_daemon) again, with the
# daemon and its fake client and prefill worker on libfabric (tcp;ofi_rxm).
set -euo pipefail
export EPD_ENCODER_TEST_BACKEND=ofi
export FI_PROVIDER="tcp;ofi_rxm"
exec "${EPD_BUILD:-build}/tests/test_epd_encoder_daemon"
