# router/: the request-plane client library (epd_client: what epd-ctl uses
# now and the router daemon will use) and the epd-ctl tool.
ROUTER_CLIENT_SRCS := router/epd_client.c
$(eval $(call epd_lib,epd_router,$(ROUTER_CLIENT_SRCS)))
$(eval $(call epd_prog,epd-ctl,router/tools/epd_ctl.c,epd_router epd_xport epd_proto epd_engine epd_common))
$(call obj_of,$(ROUTER_CLIENT_SRCS) router/tools/epd_ctl.c): EPD_CPPFLAGS += -Irouter
