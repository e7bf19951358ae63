# tests/daemon: the daemon runtime, unit by unit (cmocka), and as a whole
# through a minimal role on it (epd-daemon-testd, built into $(BUILD)/itest
# so that the test runner does not start it on its own) driven by
# test_epd_daemon over its request plane, gRPC, signals and ready file.
DAEMON_TEST_LIBS := epd_daemon epd_kv epd_xport epd_proto epd_engine epd_common
$(eval $(call epd_test,test_epd_registrar,tests/daemon/test_epd_registrar.c,$(DAEMON_TEST_LIBS)))
$(eval $(call epd_test,test_epd_daemon,tests/daemon/test_epd_daemon.c tests/engine/epd_test_engine_util.c,$(DAEMON_TEST_LIBS)))
$(test_epd_daemon_OBJS): EPD_CPPFLAGS += -Itests/engine
$(BUILD)/tests/test_epd_daemon: $(BUILD)/itest/epd-daemon-testd
$(eval $(call epd_test,test_epd_daemon_parts,tests/daemon/test_epd_daemon_parts.c,$(DAEMON_TEST_LIBS)))

EPD_TESTD_OBJS := $(call obj_of,tests/daemon/epd_daemon_testd.c)
ALL_OBJS += $(EPD_TESTD_OBJS)
ALL_PROGS += $(BUILD)/itest/epd-daemon-testd
$(BUILD)/itest/epd-daemon-testd: $(EPD_TESTD_OBJS) $(foreach l,$(DAEMON_TEST_LIBS),$(BUILD)/lib/lib$(l).a)
	@mkdir -p $(@D)
	@$(if $(filter 1,$(V)),,echo "  LD      $@";)$(CC) $(EPD_LDFLAGS) -o $@ $(EPD_TESTD_OBJS) \
		$(foreach l,$(DAEMON_TEST_LIBS),$(BUILD)/lib/lib$(l).a) $(EPD_LDLIBS)
