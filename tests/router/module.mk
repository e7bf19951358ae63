# tests/router/: unit tests of the router daemon's parts linked alone.
# router/epd_router_registry (states, policies) linked alone: the test
# stands in for the client's endpoint state.
$(eval $(call epd_test,test_epd_router_registry,tests/router/test_epd_router_registry.c router/epd_router_registry.c router/epd_router_hints.c,epd_daemon epd_kv epd_common))
$(test_epd_router_registry_OBJS): EPD_CPPFLAGS += -Irouter
# router/epd_router_metrics (the drain rate behind a 429's Retry-After, the
# rendering) linked with the registry alone, like the registry's test.
$(eval $(call epd_test,test_epd_router_metrics,tests/router/test_epd_router_metrics.c router/epd_router_metrics.c router/epd_router_registry.c router/epd_router_hints.c,epd_daemon epd_kv epd_common))
$(test_epd_router_metrics_OBJS): EPD_CPPFLAGS += -Irouter
