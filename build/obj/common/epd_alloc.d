build/obj/common/epd_alloc.o: common/epd_alloc.c common/epd_alloc.h
common/epd_alloc.h:
