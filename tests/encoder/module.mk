# tests/encoder/: unit test of the compute thread (encoder/epd_encoder_compute.c
# on a real loop and the tiny vision model), and the encoder daemon,
# epd-encoder, driven by a fake client, a fake prefill worker and a fake
# router over loopback UCX (runs $EPD_BUILD/bin/epd-encoder); the same over
# libfabric from the .sh.
$(eval $(call epd_test,test_epd_encoder_compute,tests/encoder/test_epd_encoder_compute.c encoder/epd_encoder_compute.c tests/engine/epd_test_engine_util.c,epd_daemon epd_kv epd_engine epd_common))
$(test_epd_encoder_compute_OBJS): EPD_CPPFLAGS += -Itests/engine
$(eval $(call epd_test,test_epd_encoder_daemon,tests/encoder/test_epd_encoder_daemon.c tests/engine/epd_test_engine_util.c,epd_xport epd_proto epd_engine epd_common))
$(test_epd_encoder_daemon_OBJS): EPD_CPPFLAGS += -Itests/engine
$(BUILD)/tests/test_epd_encoder_daemon: $(BUILD)/bin/epd-encoder
ALL_TESTS += tests/encoder/test_encoder_daemon_ofi.sh
