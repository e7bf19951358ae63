# tests/common: one cmocka program per common/ source file.
$(eval $(call epd_test,test_epd_status,tests/common/test_epd_status.c,epd_common))
$(eval $(call epd_test,test_epd_alloc,tests/common/test_epd_alloc.c,epd_common))
$(eval $(call epd_test,test_epd_config,tests/common/test_epd_config.c,epd_common))
$(eval $(call epd_test,test_epd_queue,tests/common/test_epd_queue.c,epd_common))
$(eval $(call epd_test,test_epd_hash,tests/common/test_epd_hash.c,epd_common))
$(eval $(call epd_test,test_epd_rng,tests/common/test_epd_rng.c,epd_common))
$(eval $(call epd_test,test_epd_log,tests/common/test_epd_log.c,epd_common))
$(eval $(call epd_test,test_epd_trace,tests/common/test_epd_trace.c,epd_common))
