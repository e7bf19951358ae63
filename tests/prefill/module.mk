# tests/prefill/: unit tests of prefill/'s modules (cmocka), one program per
# module: the write plan (pure) and the compute thread's hand-offs.
$(eval $(call epd_test,test_epd_prefill_plan,tests/prefill/test_epd_prefill_plan.c prefill/epd_prefill_plan.c,epd_engine epd_common))
$(test_epd_prefill_plan_OBJS): EPD_CPPFLAGS += -Iprefill
$(eval $(call epd_test,test_epd_prefill_compute,tests/prefill/test_epd_prefill_compute.c prefill/epd_prefill_compute.c tests/engine/epd_test_engine_util.c,epd_daemon epd_kv epd_engine epd_common))
$(test_epd_prefill_compute_OBJS): EPD_CPPFLAGS += -Iprefill -Itests/engine

# The daemon itself, driven by a fake client and a fake decode worker over
# loopback UCX (runs $EPD_BUILD/bin/epd-prefill).
$(eval $(call epd_test,test_epd_prefill_daemon,tests/prefill/test_epd_prefill_daemon.c tests/engine/epd_test_engine_util.c,epd_xport epd_proto epd_engine epd_common))
$(test_epd_prefill_daemon_OBJS): EPD_CPPFLAGS += -Itests/engine
$(BUILD)/tests/test_epd_prefill_daemon: $(BUILD)/bin/epd-prefill
ALL_TESTS += tests/prefill/test_prefill_daemon_ofi.sh

# --trace end to end: epd-bench overhead on a tiny ref model, the traces
# parsed with jansson (structure only, no timing).
$(eval $(call epd_test,test_epd_prefill_trace,tests/prefill/test_epd_prefill_trace.c,epd_common))
$(BUILD)/tests/test_epd_prefill_trace: $(BUILD)/bin/epd-prefill $(BUILD)/bin/epd-decode $(BUILD)/bin/epd-bench $(BUILD)/bin/epd-mkmodel
