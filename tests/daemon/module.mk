# tests/daemon: unit tests of the daemon runtime (cmocka).
DAEMON_TEST_LIBS := epd_daemon epd_xport epd_proto epd_engine epd_common
$(eval $(call epd_test,test_epd_registrar,tests/daemon/test_epd_registrar.c,$(DAEMON_TEST_LIBS)))
