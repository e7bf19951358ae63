# engine/: the engine interface, the `ref` CPU engine, the `sim` timing model
# (profiles in engine/profiles/), safetensors loader,
# sampling, UTF-8 repair, model writer, the byte-level BPE tokenizer of a
# tokenizer.json; tools epd-mkmodel, epd-generate and epd-tokenize.
ENGINE_SRCS := $(wildcard engine/*.c)
$(eval $(call epd_lib,epd_engine,$(ENGINE_SRCS)))
# stb_image (compiled into epd_image.c) has undefined-but-harmless arithmetic
# on hostile files that fuzz_epd_image finds: `NULL + 0` and memcpy(NULL, src,
# 0) on a PNG whose first IDAT chunk is empty, shifts by 32 and of negative
# values in the JPEG bit reader.  UBSan's checks for those are off for this
# one object (ASan stays on: memory errors are still caught, and the ones
# stb 2.27 has are refused before it runs, see epd_image.c).
ifneq ($(findstring undefined,$(SANITIZER)),)
$(BUILD)/obj/engine/epd_image.o: EPD_CFLAGS += -fno-sanitize=pointer-overflow,nonnull-attribute,shift
endif
$(eval $(call epd_prog,epd-mkmodel,engine/tools/epd_mkmodel.c,epd_engine epd_common))
$(eval $(call epd_prog,epd-generate,engine/tools/epd_generate.c,epd_engine epd_common))
# epd-tokenize: a Hugging Face tokenizer.json as a line filter (tests/tokenizer)
$(eval $(call epd_prog,epd-tokenize,engine/tools/epd_tokenize.c,epd_engine epd_common))
