# prefill/: the prefill daemon, epd-prefill, on the daemon runtime (main.c
# plus its role's files; see prefill/epd_prefill_int.h for who does what).
PREFILL_SRCS := $(wildcard prefill/*.c)
$(eval $(call epd_prog,epd-prefill,$(PREFILL_SRCS),epd_daemon epd_kv epd_xport epd_proto epd_engine epd_common))
