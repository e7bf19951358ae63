# tests/proto: round trips, truncation, corruption and fault injection of
# the request-plane frames and the control-plane messages.
$(eval $(call epd_test,test_epd_msg,tests/proto/test_epd_msg.c,epd_proto epd_common))
$(eval $(call epd_test,test_epd_rpc,tests/proto/test_epd_rpc.c,epd_proto epd_common))
$(eval $(call epd_test,test_epd_layout,tests/proto/test_epd_layout.c,epd_proto epd_engine epd_common))
$(eval $(call epd_test,test_epd_rpc_h2scan,tests/proto/test_epd_rpc_h2scan.c,epd_proto epd_common))
