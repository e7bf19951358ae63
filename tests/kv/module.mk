# tests/kv: the KV that outlives a request, unit by unit (cmocka): the
# prefix cache's index (kv/epd_kvcache) and its host/disk tier
# (kv/epd_kvtier; its file decoder is also a fuzz target, tests/fuzz).
KV_TEST_LIBS := epd_kv epd_engine epd_common
$(eval $(call epd_test,test_epd_kvcache,tests/kv/test_epd_kvcache.c,$(KV_TEST_LIBS)))
$(eval $(call epd_test,test_epd_kvtier,tests/kv/test_epd_kvtier.c,$(KV_TEST_LIBS)))
