build/clang/obj/common/epd_config.o: common/epd_config.c \
  common/epd_config.h common/epd_status.h common/epd_alloc.h \
  common/epd_log.h

common/epd_config.h:

common/epd_status.h:

common/epd_alloc.h:

common/epd_log.h:
