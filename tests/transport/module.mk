# tests/transport/: the transport conformance suite, run against every
# compiled backend and transport configuration (see epd_test_confs[]), and
# the core's trust boundary and its fences (flush only where a write does not
# deliver on completion) on an in-process loopback backend.
$(eval $(call epd_test,test_transport_xport,tests/transport/test_xport_conformance.c,epd_xport epd_common))
$(eval $(call epd_test,test_transport_auth,tests/transport/test_xport_auth.c tests/transport/epd_xport_loop.c,epd_xport epd_common))
$(eval $(call epd_test,test_transport_fence,tests/transport/test_xport_fence.c tests/transport/epd_xport_loop.c,epd_xport epd_common))
