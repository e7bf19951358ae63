build/clang/obj/common/epd_time.o: common/epd_time.c common/epd_time.h

common/epd_time.h:
