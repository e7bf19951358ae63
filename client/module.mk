# client/: the request-plane client library (epd_client: what epd-router,
# epd-ctl, the benchmarks and the integration tests use to talk to
# workers) and the epd-ctl tool.  It stands beside daemon/, above proto/
# and transport/, and needs nothing of the daemon runtime (epd-ctl links no
# daemon).
CLIENT_SRCS := client/epd_client.c client/epd_client_req.c client/epd_client_health.c
$(eval $(call epd_lib,epd_client,$(CLIENT_SRCS)))
$(eval $(call epd_prog,epd-ctl,client/tools/epd_ctl.c client/tools/epd_ctl_control.c,epd_client epd_xport epd_proto epd_engine epd_common))
