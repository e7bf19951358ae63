# tests/decode: unit tests of decode/ (cmocka), one program per module.
# The check and batch tests open the ref engine on a tiny model written by
# the engine tests' helpers.
DECODE_TEST_UTIL := tests/engine/epd_test_engine_util.c
$(eval $(call epd_test,test_epd_decode_blocks,tests/decode/test_epd_decode_blocks.c,epd_decode epd_common))
$(eval $(call epd_test,test_epd_decode_check,tests/decode/test_epd_decode_check.c $(DECODE_TEST_UTIL),epd_decode epd_proto epd_engine epd_common))
$(eval $(call epd_test,test_epd_decode_batch,tests/decode/test_epd_decode_batch.c $(DECODE_TEST_UTIL),epd_decode epd_engine epd_common))
$(test_epd_decode_blocks_OBJS) $(test_epd_decode_check_OBJS) $(test_epd_decode_batch_OBJS): EPD_CPPFLAGS += -Idecode -Itests/engine
# The daemon test runs $EPD_BUILD/bin/epd-decode and plays its client and
# a scripted prefill worker over loopback UCX.
$(eval $(call epd_test,test_epd_decode_daemon,tests/decode/test_epd_decode_daemon.c $(DECODE_TEST_UTIL),epd_xport epd_proto epd_engine epd_common))
$(test_epd_decode_daemon_OBJS): EPD_CPPFLAGS += -Itests/engine
$(BUILD)/tests/test_epd_decode_daemon: $(BUILD)/bin/epd-decode
