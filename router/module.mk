# The router daemon, epd-router, on the daemon runtime (daemon/): main.c
# (flags, config, the role's callbacks) plus the HTTP intake and routes,
# the requests' attempts and events, their answers, the control plane
# handlers, the registry and policies, and the metrics (epd_router_int.h
# says who calls whom).
ROUTER_DAEMON_SRCS := router/main.c router/epd_router_api.c router/epd_router_req.c \
                      router/epd_router_dispatch.c \
                      router/epd_router_answer.c router/epd_router_rpc.c \
                      router/epd_router_registry.c router/epd_router_hints.c \
                      router/epd_router_metrics.c router/epd_router_tok.c \
                      router/epd_router_prompt.c router/epd_router_group.c
$(eval $(call epd_prog,epd-router,$(ROUTER_DAEMON_SRCS),epd_api epd_client epd_daemon epd_kv epd_xport epd_proto epd_engine epd_common))
$(call obj_of,$(ROUTER_DAEMON_SRCS)): EPD_CPPFLAGS += -Irouter
