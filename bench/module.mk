# bench/: epd-bench, one subcommand per bench/epd_bench_<name>.c.
# BENCH_LIBS lists the epd libraries it links, users first.
BENCH_SRCS := $(wildcard bench/*.c)
BENCH_LIBS := epd_client epd_daemon epd_kv epd_xport epd_proto epd_engine epd_common
$(eval $(call epd_prog,epd-bench,$(BENCH_SRCS),$(BENCH_LIBS)))
$(call obj_of,$(BENCH_SRCS)): EPD_CPPFLAGS += -Iclient -Idaemon
# stb_image_write (the multimodal mix's PNGs) shifts negative ints in its
# JPEG writer (undefined, harmless; unused here): UBSan's shift check off
ifneq ($(findstring undefined,$(SANITIZER)),)
$(BUILD)/obj/bench/epd_bench_serve_load.o: EPD_CFLAGS += -fno-sanitize=shift
endif
