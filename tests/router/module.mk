# tests/router/: unit tests of the request-plane client (router/epd_client)
# against a scripted fake worker over a real loopback transport.
$(eval $(call epd_test,test_epd_client,tests/router/test_epd_client.c,epd_router epd_xport epd_proto epd_common))
$(test_epd_client_OBJS): EPD_CPPFLAGS += -Irouter
