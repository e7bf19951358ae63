# engine/: the engine interface, the `ref` CPU engine, the `sim` timing model
# (profiles in engine/profiles/), safetensors loader,
# sampling, UTF-8 repair, model writer, the byte-level BPE tokenizer of a
# tokenizer.json; tools epd-mkmodel, epd-generate and epd-tokenize.
ENGINE_SRCS := $(wildcard engine/*.c)
$(eval $(call epd_lib,epd_engine,$(ENGINE_SRCS)))
$(eval $(call epd_prog,epd-mkmodel,engine/tools/epd_mkmodel.c,epd_engine epd_common))
$(eval $(call epd_prog,epd-generate,engine/tools/epd_generate.c,epd_engine epd_common))
# epd-tokenize: a Hugging Face tokenizer.json as a line filter (tests/tokenizer)
$(eval $(call epd_prog,epd-tokenize,engine/tools/epd_tokenize.c,epd_engine epd_common))
