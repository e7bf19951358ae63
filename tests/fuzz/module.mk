# tests/fuzz: libFuzzer targets, one per decoder of bytes from the network or
# a file.  Built and run by `make fuzz` (clang, in build/fuzz); not part of
# `make all` because they need -fsanitize=fuzzer.  Each target's seeds are
# committed in tests/fuzz/corpus/<target>/ and fed to it first.
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_NAMES := $(patsubst tests/fuzz/%.c,%,$(FUZZ_SRCS))
FUZZ_TARGETS := $(patsubst tests/fuzz/%.c,$(BUILD)/fuzz/%,$(FUZZ_SRCS))
FUZZ_LIBS := $(BUILD)/lib/libepd_api.a $(BUILD)/lib/libepd_proto.a $(BUILD)/lib/libepd_xport.a \
             $(BUILD)/lib/libepd_engine.a $(BUILD)/lib/libepd_common.a
# the transport core's target runs two workers on the in-process loopback
# backend of tests/transport
FUZZ_LOOP_OBJ := $(BUILD)/obj/tests/transport/epd_xport_loop.o
# named objects (not intermediates make deletes after a build, then fails
# to rebuild when only a header changed), after the generated headers
FUZZ_OBJS := $(patsubst tests/fuzz/%.c,$(BUILD)/obj/tests/fuzz/%.o,$(FUZZ_SRCS))
ALL_OBJS += $(FUZZ_OBJS)
$(BUILD)/obj/tests/fuzz/fuzz_epd_openai.o: EPD_CPPFLAGS += -Iapi
# the HTTP request path: bytes of one connection to a real server on
# loopback (its internals: -Iapi, epd_http_int.h)
$(BUILD)/obj/tests/fuzz/fuzz_epd_http.o: EPD_CPPFLAGS += -Iapi
$(BUILD)/obj/tests/fuzz/fuzz_epd_xport_frame.o \
$(BUILD)/obj/tests/fuzz-replay/fuzz_epd_xport_frame.o: EPD_CPPFLAGS += -Itests/transport
$(BUILD)/fuzz/fuzz_epd_xport_frame: $(FUZZ_LOOP_OBJ)
# the control-plane target runs the router's own handlers (with the
# registry; the client and daemon it calls are stubbed in the target;
# the prefix stats come from libepd_daemon, the prefix keys from libepd_kv)
FUZZ_ROUTER_OBJS := $(call obj_of,router/epd_router_rpc.c router/epd_router_registry.c \
                                  router/epd_router_hints.c) $(BUILD)/lib/libepd_daemon.a \
                    $(BUILD)/lib/libepd_kv.a
$(BUILD)/fuzz/fuzz_epd_control: $(FUZZ_ROUTER_OBJS)
# a worker's /metrics request heads (daemon/epd_metrics_http.c)
$(BUILD)/fuzz/fuzz_epd_metrics_http: $(BUILD)/lib/libepd_daemon.a
$(BUILD)/obj/tests/fuzz/fuzz_epd_metrics_http.o \
$(BUILD)/obj/tests/fuzz-replay/fuzz_epd_metrics_http.o: EPD_CPPFLAGS += -Idaemon
# the KV tier's files (kv/epd_kvtier.c)
$(BUILD)/fuzz/fuzz_epd_kvtier: $(BUILD)/lib/libepd_kv.a
$(BUILD)/obj/tests/fuzz/fuzz_epd_kvtier.o $(BUILD)/obj/tests/fuzz-replay/fuzz_epd_kvtier.o: EPD_CPPFLAGS += -Ikv

$(BUILD)/fuzz/%: $(BUILD)/obj/tests/fuzz/%.o $(FUZZ_LIBS)
	@mkdir -p $(@D)
	@$(if $(filter 1,$(V)),,echo "  LD      $@";)$(CC) $(EPD_LDFLAGS) -fsanitize=fuzzer -o $@ \
		-Wl,--start-group $^ -Wl,--end-group $(EPD_LDLIBS)

# Every target for FUZZ_SECONDS, even after one of them found something;
# then every finding is reported and the run fails naming each target that
# had one (tests/fuzz/fuzz_run.sh; what each target found is kept in
# $(BUILD)/findings/<target>/, its corpus in $(BUILD)/corpus/<target>/).
.PHONY: fuzz-run
fuzz-run: $(FUZZ_TARGETS)
	@tests/fuzz/fuzz_run.sh $(BUILD) $(FUZZ_SECONDS) tests/fuzz/corpus $(FUZZ_TARGETS)
# The runner itself, on tiny targets it builds (a planted crash in two of
# five must not stop the rest): part of `make check`, about 10 s.
ALL_TESTS += tests/fuzz/test_fuzz_run.sh

# The regression replay (part of `make all` and `make check`, no libFuzzer
# needed): every target's LLVMFuzzerTestOneInput over its seed corpus, from
# sources compiled a second time with the entry points renamed.
FUZZ_REPLAY_OBJS := $(patsubst %,$(BUILD)/obj/tests/fuzz-replay/%.o,$(FUZZ_NAMES))
FUZZ_REPLAY_MAIN := $(BUILD)/obj/tests/fuzz/epd_fuzz_replay.o
ALL_OBJS += $(FUZZ_REPLAY_OBJS) $(FUZZ_REPLAY_MAIN)
ALL_TESTS += $(BUILD)/tests/test_fuzz_replay
$(FUZZ_REPLAY_OBJS) $(FUZZ_REPLAY_MAIN): EPD_CPPFLAGS += -Iapi -Iclient -Irouter
$(FUZZ_REPLAY_MAIN): EPD_CPPFLAGS += '-DEPD_FUZZ_LIST=$(foreach n,$(FUZZ_NAMES),X($(n)))' \
                                     -DEPD_FUZZ_CORPUS='"$(CURDIR)/tests/fuzz/corpus"'
# the list is compiled in: a target added (a new fuzz_*.c) rebuilds it
$(FUZZ_REPLAY_MAIN): tests/fuzz/module.mk $(FUZZ_SRCS)

$(BUILD)/obj/tests/fuzz-replay/%.o: tests/fuzz/%.c
	@mkdir -p $(@D)
	@$(if $(filter 1,$(V)),,echo "  CC      $< (replay)";)$(CC) $(EPD_INC) $(EPD_CPPFLAGS) \
		$(EPD_CFLAGS) -DEPD_FUZZ_REPLAY -DLLVMFuzzerTestOneInput=$*_one \
		-DLLVMFuzzerInitialize=$*_init -c -o $@ $<

$(BUILD)/tests/test_fuzz_replay: $(FUZZ_REPLAY_MAIN) $(FUZZ_REPLAY_OBJS) $(FUZZ_LOOP_OBJ) \
                                 $(FUZZ_ROUTER_OBJS) $(FUZZ_LIBS)
	@mkdir -p $(@D)
	@$(if $(filter 1,$(V)),,echo "  LD      $@";)$(CC) $(EPD_LDFLAGS) -o $@ $^ $(EPD_LDLIBS)
