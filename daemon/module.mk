# daemon/: the runtime every daemon shares (epd_daemon.h): loop, identity,
# transport driver and request-plane links and peers, control plane and
# registration (epd_registrar), signals, ready file, trace, tick and pump,
# the stop order; plus the compute hand-off (epd_handoff), tombstones and
# the early-message stash.  Below the four daemons, above proto/ and kv/
# (the KV that outlives a request).
DAEMON_SRCS := $(wildcard daemon/*.c)
$(eval $(call epd_lib,epd_daemon,$(DAEMON_SRCS)))
