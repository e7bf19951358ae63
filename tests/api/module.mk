# tests/api/: api/epd_openai_*.c (request parsing, response and SSE
# encoding) and api/epd_http_*.c (a real server on loopback driven by raw
# sockets).
$(eval $(call epd_test,test_epd_openai,tests/api/test_epd_openai.c,epd_api epd_engine epd_common))
# several choices: prompt batches, n, echo, the multi-choice answer and stream
$(eval $(call epd_test,test_epd_openai_choices,tests/api/test_epd_openai_choices.c,epd_api epd_engine epd_common))
$(eval $(call epd_test,test_epd_http,tests/api/test_epd_http.c,epd_api epd_engine epd_common))
# api/epd_http_proxy.c: --trusted-proxies parsing and the X-Forwarded-For
# rule (the server's use of it is tested through the router:
# tests/integration/test_router_overload.sh).
$(eval $(call epd_test,test_epd_http_proxy,tests/api/test_epd_http_proxy.c,epd_api epd_engine epd_common))
