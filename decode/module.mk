# decode/: the decode daemon.  main.c is the loop thread (requests, peers,
# endpoints, control plane); epd_decode_blocks is the KV block/slot
# lifecycle, epd_decode_check the pure request and KV checks,
# epd_decode_batch the compute thread (continuous batching).
DECODE_LIB_SRCS := decode/epd_decode_blocks.c decode/epd_decode_check.c decode/epd_decode_batch.c
$(eval $(call epd_lib,epd_decode,$(DECODE_LIB_SRCS)))
$(eval $(call epd_prog,epd-decode,decode/main.c,epd_decode epd_daemon epd_xport epd_proto epd_engine epd_common))
