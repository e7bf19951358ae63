build/obj/common/epd_status.o: common/epd_status.c common/epd_status.h
common/epd_status.h:
