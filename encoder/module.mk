# encoder/: the encoder daemon, epd-encoder (main.c plus its modules; see
# encoder/epd_encoder_int.h for who does what), on the daemon runtime, and
# epd-encoder-load, a client that drives one at a fixed concurrency
# (images/s, latency).
ENCODER_SRCS := $(wildcard encoder/*.c)
$(eval $(call epd_prog,epd-encoder,$(ENCODER_SRCS),epd_daemon epd_kv epd_xport epd_proto epd_engine epd_common))
$(eval $(call epd_prog,epd-encoder-load,encoder/tools/epd_encoder_load.c,epd_xport epd_proto epd_common))
