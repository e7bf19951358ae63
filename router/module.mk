# router/: the request-plane client library (epd_client: what epd-router,
# epd-ctl, the benchmarks and the integration tests use) and the epd-ctl
# tool.  The client stands below the daemon runtime's users but needs none
# of it (epd-ctl links no daemon).
ROUTER_CLIENT_SRCS := router/epd_client.c router/epd_client_req.c router/epd_client_health.c
$(eval $(call epd_lib,epd_router,$(ROUTER_CLIENT_SRCS)))
$(eval $(call epd_prog,epd-ctl,router/tools/epd_ctl.c router/tools/epd_ctl_control.c,epd_router epd_xport epd_proto epd_engine epd_common))
$(call obj_of,$(ROUTER_CLIENT_SRCS) router/tools/epd_ctl.c router/tools/epd_ctl_control.c): EPD_CPPFLAGS += -Irouter
# The HTTP/1.1 server and the OpenAI API layer the router serves with
# (tested on their own; the router daemon is built on them).  Link it before
# epd_engine (epd_openai uses engine/epd_utf8) and epd_common.
ROUTER_API_SRCS := router/epd_http_conn.c router/epd_http_server.c router/epd_http_respond.c \
                   router/epd_http_auth.c router/epd_http_proxy.c \
                   router/epd_openai_json.c router/epd_openai_scan.c router/epd_openai_parse.c \
                   router/epd_openai_encode.c router/epd_openai_fields.c \
                   router/epd_openai_logprobs.c
$(eval $(call epd_lib,epd_api,$(ROUTER_API_SRCS)))
$(call obj_of,$(ROUTER_API_SRCS)): EPD_CPPFLAGS += -Irouter
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
$(eval $(call epd_prog,epd-router,$(ROUTER_DAEMON_SRCS),epd_api epd_router epd_daemon epd_xport epd_proto epd_engine epd_common))
$(call obj_of,$(ROUTER_DAEMON_SRCS)): EPD_CPPFLAGS += -Irouter
