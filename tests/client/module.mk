# tests/client/: unit tests of the request-plane client (client/epd_client)
# against a scripted fake worker over a real loopback transport.
$(eval $(call epd_test,test_epd_client,tests/client/test_epd_client.c,epd_client epd_xport epd_proto epd_common))
