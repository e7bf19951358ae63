# tests/transport/: the transport conformance suite, run against every
# compiled backend and transport configuration (see epd_test_confs[]).
$(eval $(call epd_test,test_transport_xport,tests/transport/test_xport_conformance.c,epd_xport epd_common))
