# common/: status, allocation funnel, logging, config, clocks, queues, hashing, rng.
COMMON_SRCS := $(wildcard common/*.c)
$(eval $(call epd_lib,epd_common,$(COMMON_SRCS)))
