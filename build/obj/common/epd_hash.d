build/obj/common/epd_hash.o: common/epd_hash.c common/epd_hash.h \
 common/epd_status.h common/epd_alloc.h
common/epd_hash.h:
common/epd_status.h:
common/epd_alloc.h:
