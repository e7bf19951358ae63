# tests/engine/: unit tests of engine/ (cmocka), one program per file.
ENGINE_TEST_UTIL := tests/engine/epd_test_engine_util.c
$(eval $(call epd_test,test_epd_engine_ref,tests/engine/test_epd_ref.c $(ENGINE_TEST_UTIL),epd_engine epd_common))
# The Hugging Face engine (llama, qwen2, qwen3, qwen3_moe) against a double
# reference, split / batch invariance, shards.
$(eval $(call epd_test,test_epd_engine_hf,tests/engine/test_epd_hf.c $(ENGINE_TEST_UTIL),epd_engine epd_common))
# Every refusal of a broken HF folder: epd-generate and epd-prefill exit
# non-zero with one ERROR line naming the key or tensor.
ALL_TESTS += tests/engine/test_hf_refusals.sh
# epd-generate's --logits-out, --jsonl --logprobs, --prompt-ids and the eos
# list on HF folders.
ALL_TESTS += tests/engine/test_hf_generate.sh
$(eval $(call epd_test,test_epd_engine_utf8,tests/engine/test_epd_utf8.c,epd_engine epd_common))
# The tokenizer of a tokenizer.json (tests/tokenizer holds the oracle test).
$(eval $(call epd_test,test_epd_engine_tokenizer,tests/engine/test_epd_tokenizer.c,epd_engine epd_common))
# the built-in chat templates (engine/epd_chat.c); the oracles are tests/tokenizer's
$(eval $(call epd_test,test_epd_engine_chat,tests/engine/test_epd_chat.c,epd_engine epd_common))
$(eval $(call epd_test,test_epd_engine_sample,tests/engine/test_epd_sample.c,epd_engine epd_common))
$(eval $(call epd_test,test_epd_engine_safetensors,tests/engine/test_epd_safetensors.c $(ENGINE_TEST_UTIL),epd_engine epd_common))

# The dlopen test loads a tiny engine built as a shared object (outside
# $(BUILD)/tests so that test runners never try to execute it).
ENGINE_TOY_SO := $(BUILD)/lib/libepd_engine_toy.so
$(eval $(call epd_test,test_epd_engine_dlopen,tests/engine/test_epd_engine_dlopen.c,epd_engine epd_common))
$(test_epd_engine_dlopen_OBJS): EPD_CPPFLAGS += -DEPD_TEST_TOY_SO='"$(abspath $(ENGINE_TOY_SO))"'
$(BUILD)/tests/test_epd_engine_dlopen: $(ENGINE_TOY_SO)
$(ENGINE_TOY_SO): tests/engine/epd_engine_toy.c engine/epd_engine.h common/epd_alloc.h
	@mkdir -p $(@D)
	@$(if $(filter 1,$(V)),,echo "  SO      $@";)$(CC) $(INC_engine) $(EPD_CPPFLAGS) $(WARN) $(CFLAGS) -fPIC -shared \
		$(if $(SANITIZER),-fsanitize=$(SANITIZER) -fno-sanitize-recover=all) -o $@ $<

# epd-generate is exercised as a program (exit codes, stdout, stderr).
$(eval $(call epd_test,test_epd_engine_generate,tests/engine/test_epd_generate.c $(ENGINE_TEST_UTIL),epd_engine epd_common))
$(test_epd_engine_generate_OBJS): EPD_CPPFLAGS += -DEPD_TEST_BIN_DIR='"$(abspath $(BUILD))/bin"' \
	-DEPD_TEST_FUZZ_CORPUS='"$(abspath tests/fuzz/corpus)"'
$(BUILD)/tests/test_epd_engine_generate: $(BUILD)/bin/epd-generate

# The sim engine: reads the shipped profiles from engine/profiles and runs
# epd-generate --engine sim.
$(eval $(call epd_test,test_epd_engine_sim,tests/engine/test_epd_engine_sim.c $(ENGINE_TEST_UTIL),epd_engine epd_common))
$(test_epd_engine_sim_OBJS): EPD_CPPFLAGS += -DEPD_TEST_PROFILES='"$(abspath engine/profiles)"' \
	-DEPD_TEST_BIN_DIR='"$(abspath $(BUILD))/bin"'
$(BUILD)/tests/test_epd_engine_sim: $(BUILD)/bin/epd-generate
# sim with a per-layer KV dtype map: block bytes, scaled layouts, the
# timing's per-layer bytes, stamps of a mixed map.
$(eval $(call epd_test,test_epd_engine_sim_kvq,tests/engine/test_epd_sim_kvq.c $(ENGINE_TEST_UTIL),epd_engine epd_common))
$(test_epd_engine_sim_kvq_OBJS): EPD_CPPFLAGS += -DEPD_TEST_PROFILES='"$(abspath engine/profiles)"'

# Image decoding (stb_image_write and libjpeg make the files in the test;
# it decodes tests/fuzz's reproducers too).
$(eval $(call epd_test,test_epd_engine_image,tests/engine/test_epd_image.c,epd_engine epd_common))
$(test_epd_engine_image_OBJS): EPD_CPPFLAGS += -DEPD_TEST_FUZZ_CORPUS='"$(abspath tests/fuzz/corpus)"'
# stb_image_write's JPEG writer shifts negative ints (undefined, harmless):
# UBSan's shift check is off for the two tests that compile it in.
ifneq ($(findstring undefined,$(SANITIZER)),)
$(test_epd_engine_image_OBJS) $(test_epd_engine_generate_OBJS): EPD_CFLAGS += -fno-sanitize=shift
endif

# The vision encoder and multimodal prefill of `ref`.
$(eval $(call epd_test,test_epd_engine_ref_vision,tests/engine/test_epd_ref_vision.c $(ENGINE_TEST_UTIL),epd_engine epd_common))

# Stamped KV units (engine/epd_kv_stamp) on what the sim engine writes: the
# wrong writes they exist to catch.
$(eval $(call epd_test,test_epd_engine_kv_stamp,tests/engine/test_epd_kv_stamp.c $(ENGINE_TEST_UTIL),epd_engine epd_common))

# A model folder's tokenizer.json through the engine layer (any engine).
$(eval $(call epd_test,test_epd_engine_tok,tests/engine/test_epd_engine_tok.c $(ENGINE_TEST_UTIL),epd_engine epd_common))
# generation_config.json's default sampling
$(eval $(call epd_test,test_epd_engine_gen_config,tests/engine/test_epd_gen_config.c $(ENGINE_TEST_UTIL),epd_engine epd_common))
# Quantized KV codecs against a numpy reference (tests/engine/kvq_ref.py),
# dtype maps and mixed-map offsets.
$(eval $(call epd_test,test_epd_engine_kvq,tests/engine/test_epd_kvq.c $(ENGINE_TEST_UTIL),epd_engine epd_common))
$(test_epd_engine_kvq_OBJS): EPD_CPPFLAGS += -DEPD_TEST_PYTHON='"/usr/bin/python3"' \
	-DEPD_TEST_KVQ_REF='"$(abspath tests/engine/kvq_ref.py)"'
