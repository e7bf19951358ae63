# tests/engine/: unit tests of engine/ (cmocka), one program per file.
ENGINE_TEST_UTIL := tests/engine/epd_test_engine_util.c
$(eval $(call epd_test,test_epd_engine_ref,tests/engine/test_epd_ref.c $(ENGINE_TEST_UTIL),epd_engine epd_common))
$(eval $(call epd_test,test_epd_engine_utf8,tests/engine/test_epd_utf8.c,epd_engine epd_common))
$(eval $(call epd_test,test_epd_engine_sample,tests/engine/test_epd_sample.c,epd_engine epd_common))
$(eval $(call epd_test,test_epd_engine_safetensors,tests/engine/test_epd_safetensors.c $(ENGINE_TEST_UTIL),epd_engine epd_common))
