# prefill/: the prefill daemon, epd-prefill (main.c plus its modules; see
# prefill/epd_prefill_int.h for who does what).
PREFILL_SRCS := $(wildcard prefill/*.c)
$(eval $(call epd_prog,epd-prefill,$(PREFILL_SRCS),epd_daemon epd_xport epd_proto epd_engine epd_common))
