# tests/fuzz: libFuzzer targets, one per decoder of bytes from the network or
# a file.  Built and run by `make fuzz` (clang, in build/fuzz); not part of
# `make all` because they need -fsanitize=fuzzer.
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_TARGETS := $(patsubst tests/fuzz/%.c,$(BUILD)/fuzz/%,$(FUZZ_SRCS))
FUZZ_LIBS := $(BUILD)/lib/libepd_api.a $(BUILD)/lib/libepd_proto.a $(BUILD)/lib/libepd_engine.a \
             $(BUILD)/lib/libepd_common.a
$(BUILD)/obj/tests/fuzz/fuzz_epd_openai.o: EPD_CPPFLAGS += -Irouter

$(BUILD)/fuzz/%: $(BUILD)/obj/tests/fuzz/%.o $(FUZZ_LIBS)
	@mkdir -p $(@D)
	@$(if $(filter 1,$(V)),,echo "  LD      $@";)$(CC) $(EPD_LDFLAGS) -fsanitize=fuzzer -o $@ $^ $(EPD_LDLIBS)

.PHONY: fuzz-run
fuzz-run: $(FUZZ_TARGETS)
	@set -o pipefail; for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(BUILD)/corpus/$$(basename $$t); \
	  echo "fuzzing $$t for $(FUZZ_SECONDS)s"; \
	  $$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 $(BUILD)/corpus/$$(basename $$t) \
	    2>&1 | tail -n 4 || exit 1; \
	done
