# tests/router/: unit tests of the request-plane client (router/epd_client)
# against a scripted fake worker over a real loopback transport.
$(eval $(call epd_test,test_epd_client,tests/router/test_epd_client.c,epd_router epd_xport epd_proto epd_common))
$(test_epd_client_OBJS): EPD_CPPFLAGS += -Irouter
# router/epd_openai_*.c (request parsing, response and SSE encoding) and
# router/epd_http_*.c (a real server on loopback driven by raw sockets).
$(eval $(call epd_test,test_epd_openai,tests/router/test_epd_openai.c,epd_api epd_engine epd_common))
$(test_epd_openai_OBJS): EPD_CPPFLAGS += -Irouter
# several choices: prompt batches, n, echo, the multi-choice answer and stream
$(eval $(call epd_test,test_epd_openai_choices,tests/router/test_epd_openai_choices.c,epd_api epd_engine epd_common))
$(test_epd_openai_choices_OBJS): EPD_CPPFLAGS += -Irouter
$(eval $(call epd_test,test_epd_http,tests/router/test_epd_http.c,epd_api epd_engine epd_common))
$(test_epd_http_OBJS): EPD_CPPFLAGS += -Irouter
# router/epd_http_proxy.c: --trusted-proxies parsing and the X-Forwarded-For
# rule (the server's use of it is tested through the router:
# tests/integration/test_router_overload.sh).
$(eval $(call epd_test,test_epd_http_proxy,tests/router/test_epd_http_proxy.c,epd_api epd_engine epd_common))
$(test_epd_http_proxy_OBJS): EPD_CPPFLAGS += -Irouter
# router/epd_router_registry (states, policies) linked alone: the test
# stands in for the client's endpoint state.
$(eval $(call epd_test,test_epd_router_registry,tests/router/test_epd_router_registry.c router/epd_router_registry.c router/epd_router_hints.c,epd_daemon epd_common))
$(test_epd_router_registry_OBJS): EPD_CPPFLAGS += -Irouter
# router/epd_router_metrics (the drain rate behind a 429's Retry-After, the
# rendering) linked with the registry alone, like the registry's test.
$(eval $(call epd_test,test_epd_router_metrics,tests/router/test_epd_router_metrics.c router/epd_router_metrics.c router/epd_router_registry.c router/epd_router_hints.c,epd_daemon epd_common))
$(test_epd_router_metrics_OBJS): EPD_CPPFLAGS += -Irouter
