# tests/engine/: unit tests of engine/ (cmocka), one program per file.
ENGINE_TEST_UTIL := tests/engine/epd_test_engine_util.c
$(eval $(call epd_test,test_epd_engine_ref,tests/engine/test_epd_ref.c $(ENGINE_TEST_UTIL),epd_engine epd_common))
