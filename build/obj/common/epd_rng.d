build/obj/common/epd_rng.o: common/epd_rng.c common/epd_rng.h \
 common/epd_time.h
common/epd_rng.h:
common/epd_time.h:
