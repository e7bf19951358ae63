build/clang/obj/common/epd_log.o: common/epd_log.c common/epd_log.h \
  common/epd_status.h common/epd_time.h

common/epd_log.h:

common/epd_status.h:

common/epd_time.h:
