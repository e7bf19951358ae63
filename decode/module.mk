# decode/: the decode daemon, epd-decode (main.c plus its modules; see
# decode/epd_decode_int.h for who does what), on the daemon runtime.  The
# role parts below the request layer — epd_decode_blocks (the KV block /
# slot lifecycle), epd_decode_check (the pure checks and the KV
# verification), epd_decode_batch (the compute thread: continuous
# batching), epd_decode_verify (the verifier thread) — are a library of their own, which their unit tests link.
DECODE_LIB_SRCS := decode/epd_decode_blocks.c decode/epd_decode_check.c decode/epd_decode_batch.c \
                   decode/epd_decode_verify.c
DECODE_SRCS := decode/main.c decode/epd_decode_msg.c decode/epd_decode_req.c decode/epd_decode_fence.c \
               decode/epd_decode_admit.c decode/epd_decode_send.c decode/epd_decode_kv.c \
               decode/epd_decode_cache.c decode/epd_decode_metrics.c decode/epd_decode_lend.c
$(eval $(call epd_lib,epd_decode,$(DECODE_LIB_SRCS)))
$(eval $(call epd_prog,epd-decode,$(DECODE_SRCS),epd_decode epd_daemon epd_kv epd_xport epd_proto epd_engine epd_common))
