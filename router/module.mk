# router/: the request-plane client library (epd_client: what epd-ctl uses
# now and the router daemon will use) and the epd-ctl tool.
ROUTER_CLIENT_SRCS := router/epd_client.c
$(eval $(call epd_lib,epd_router,$(ROUTER_CLIENT_SRCS)))
$(eval $(call epd_prog,epd-ctl,router/tools/epd_ctl.c,epd_router epd_xport epd_proto epd_engine epd_common))
$(call obj_of,$(ROUTER_CLIENT_SRCS) router/tools/epd_ctl.c): EPD_CPPFLAGS += -Irouter
# The HTTP/1.1 server and the OpenAI API layer the router serves with
# (tested on their own; the router daemon is built on them).  Link it before
# epd_engine (epd_openai uses engine/epd_utf8) and epd_common.
ROUTER_API_SRCS := router/epd_http.c router/epd_openai.c
$(eval $(call epd_lib,epd_api,$(ROUTER_API_SRCS)))
$(call obj_of,$(ROUTER_API_SRCS)): EPD_CPPFLAGS += -Irouter
# The router daemon, epd-router: main.c (flags, loop, shutdown) plus the
# registry and policies, the HTTP/OpenAI request handling, the control
# plane handlers and the metrics.
ROUTER_DAEMON_SRCS := router/main.c router/epd_router_registry.c router/epd_router_api.c \
                      router/epd_router_rpc.c router/epd_router_metrics.c
$(eval $(call epd_prog,epd-router,$(ROUTER_DAEMON_SRCS),epd_api epd_router epd_xport epd_proto epd_engine epd_common))
$(call obj_of,$(ROUTER_DAEMON_SRCS)): EPD_CPPFLAGS += -Irouter
