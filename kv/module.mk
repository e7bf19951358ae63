# kv/: KV that outlives a request — the chain hashes of a prompt's blocks
# (epd_prefix: the prefix caches' keys and the router's hints), the index
# of a worker's prefix cache (epd_kvcache) and the host/disk tier below it
# (epd_kvtier).  Uses common/ and engine/ only; below daemon/ and the
# daemons, beside api/ and proto/.
KV_SRCS := $(wildcard kv/*.c)
$(eval $(call epd_lib,epd_kv,$(KV_SRCS)))
