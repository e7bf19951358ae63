build/clang/obj/common/epd_queue.o: common/epd_queue.c common/epd_queue.h \
  common/epd_status.h common/epd_alloc.h

common/epd_queue.h:

common/epd_status.h:

common/epd_alloc.h:
