# engine/: the engine interface, the `ref` CPU engine, the `sim` timing model
# (profiles in engine/profiles/), safetensors loader,
# sampling, UTF-8 repair, model writer; tools epd-mkmodel and epd-generate.
ENGINE_SRCS := $(wildcard engine/*.c)
$(eval $(call epd_lib,epd_engine,$(ENGINE_SRCS)))
# stb_image (compiled into epd_image.c) computes `NULL + 0` and calls
# memcpy(NULL, src, 0) on a PNG whose first IDAT chunk is empty (valid PNG;
# harmless, though undefined in C): not worth aborting a sanitizer build over.
ifneq ($(findstring undefined,$(SANITIZER)),)
$(BUILD)/obj/engine/epd_image.o: EPD_CFLAGS += -fno-sanitize=pointer-overflow,nonnull-attribute
endif
$(eval $(call epd_prog,epd-mkmodel,engine/tools/epd_mkmodel.c,epd_engine epd_common))
$(eval $(call epd_prog,epd-generate,engine/tools/epd_generate.c,epd_engine epd_common))
