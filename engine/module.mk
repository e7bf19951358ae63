# engine/: the engine interface, the `ref` CPU engine, the `sim` timing model
# (profiles in engine/profiles/), safetensors loader,
# sampling, UTF-8 repair, model writer; tools epd-mkmodel and epd-generate.
ENGINE_SRCS := $(wildcard engine/*.c)
$(eval $(call epd_lib,epd_engine,$(ENGINE_SRCS)))
$(eval $(call epd_prog,epd-mkmodel,engine/tools/epd_mkmodel.c,epd_engine epd_common))
$(eval $(call epd_prog,epd-generate,engine/tools/epd_generate.c,epd_engine epd_common))
