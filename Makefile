# epd — one non-recursive GNU Makefile.
#
# Every folder contributes a module.mk that registers libraries, programs and
# tests through the three functions below.  Outputs go to $(BUILD) (build/ by
# default; build/san for the sanitizer build), binaries to $(BUILD)/bin.
#
#   make              build everything
#   make deps         install the Debian packages the project needs
#   make check        deps + build + every test, then the same tests built
#                     with ASan+UBSan (clang) in build/san
#   make run          start a local cluster (router + prefill + decode) on 127.0.0.1
#   make bench        run the benchmarks
#   make image        the container image localhost/epd:latest (podman, offline)
#   make fuzz         run every libFuzzer target (FUZZ_SECONDS each), report all findings
#   make clean        remove build/
#
# Knobs: CC=clang, V=1 (echo commands), SANITIZER=address,undefined|thread,
# BUILD=dir, EPD_WITH_OFI=0 (drop the libfabric backend), EPD_WITH_UCX=0.

.DEFAULT_GOAL := all
SHELL := /bin/bash

BUILD     ?= build
SANITIZER ?=
V         ?= 0
EPD_WITH_UCX ?= 1
EPD_WITH_OFI ?= 1

ifeq ($(V),1)
Q :=
else
Q := @
endif

# pkg-config names of every library the C code links.
PKGS := ucx libfabric libprotobuf-c grpc_unsecure gpr libuv jansson libxxhash openblas libsodium libzstd \
        spng libjpeg oniguruma icu-uc
TEST_PKGS := cmocka

PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lhttp_parser
TEST_CFLAGS := $(shell pkg-config --cflags $(TEST_PKGS) 2>/dev/null)
TEST_LIBS   := $(shell pkg-config --libs $(TEST_PKGS) 2>/dev/null)

WARN := -std=c11 -Wall -Wextra -Wshadow -Wstrict-prototypes -Werror
CFLAGS ?= -O2 -g
EPD_CPPFLAGS := -D_GNU_SOURCE $(PKG_CFLAGS) \
                -DEPD_WITH_UCX=$(EPD_WITH_UCX) -DEPD_WITH_OFI=$(EPD_WITH_OFI)

# The layers (DESIGN.md "Layers inside the tree"): each folder compiles with
# the include paths of what it may use and nothing above it, so an include
# that goes up a layer (or sideways into another daemon) fails to build.
#   common <- transport, engine <- api, kv, proto <- daemon, client
#          <- encoder, prefill, decode, router <- bench
# (api: the HTTP server and the OpenAI layer; kv: the KV that outlives a
# request, prefix keys, cache index and host/disk tier; client: the
# request-plane client and epd-ctl)
INC_common    := -Icommon
INC_transport := $(INC_common) -Itransport
INC_engine    := $(INC_common) -Iengine
INC_api       := $(INC_engine) -Iapi
INC_kv        := $(INC_engine) -Ikv
INC_proto     := $(INC_common) -Itransport -Iengine -Iproto -I$(BUILD)/gen
INC_daemon    := $(INC_proto) -Ikv -Idaemon
INC_client    := $(INC_proto) -Iclient
INC_encoder   := $(INC_daemon) -Iencoder
INC_prefill   := $(INC_daemon) -Iprefill
INC_decode    := $(INC_daemon) -Idecode
INC_router    := $(INC_daemon) -Iapi -Iclient -Irouter
# benchmarks and tests stand above everything (tests reach internals)
INC_all       := $(INC_daemon) -Iapi -Iclient -Iencoder -Iprefill -Idecode -Irouter
$(BUILD)/obj/common/%.o:    EPD_INC = $(INC_common)
$(BUILD)/obj/transport/%.o: EPD_INC = $(INC_transport)
$(BUILD)/obj/engine/%.o:    EPD_INC = $(INC_engine)
$(BUILD)/obj/proto/%.o:     EPD_INC = $(INC_proto)
$(BUILD)/obj/gen/%.o:       EPD_INC = $(INC_proto)
$(BUILD)/obj/daemon/%.o:    EPD_INC = $(INC_daemon)
$(BUILD)/obj/api/%.o:       EPD_INC = $(INC_api)
$(BUILD)/obj/kv/%.o:        EPD_INC = $(INC_kv)
$(BUILD)/obj/client/%.o:    EPD_INC = $(INC_client)
$(BUILD)/obj/encoder/%.o:   EPD_INC = $(INC_encoder)
$(BUILD)/obj/prefill/%.o:   EPD_INC = $(INC_prefill)
$(BUILD)/obj/decode/%.o:    EPD_INC = $(INC_decode)
$(BUILD)/obj/router/%.o:    EPD_INC = $(INC_router)
$(BUILD)/obj/bench/%.o:     EPD_INC = $(INC_all)
$(BUILD)/obj/tests/%.o:     EPD_INC = $(INC_all) -Itests/common
EPD_CFLAGS := $(WARN) $(CFLAGS) -pthread -fPIC -MMD -MP
# --as-needed: a program loads only the libraries it calls.  gcc here links
# that way by default and clang does not: without it every sanitizer-built
# program (epd-generate, epd-ctl, each test) loaded 83 libraries (UCX,
# libfabric and its providers, gRPC and absl): an ASan epd-generate took
# 0.35 s to start instead of 0.10 s, and the integration tests start it
# hundreds of times.
EPD_LDFLAGS := -pthread -rdynamic -Wl,--as-needed
EPD_LDLIBS := $(PKG_LIBS) -ldl -lm

ifneq ($(SANITIZER),)
EPD_CFLAGS  += -fsanitize=$(SANITIZER) -fno-omit-frame-pointer -fno-sanitize-recover=all
EPD_LDFLAGS += -fsanitize=$(SANITIZER)
endif

ALL_LIBS :=
ALL_PROGS :=
ALL_TESTS :=
EXCLUSIVE_TESTS :=
ALL_OBJS :=
GEN_HDRS :=

obj_of = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

# $(call epd_lib,NAME,SOURCES) -> $(BUILD)/lib/libNAME.a
define epd_lib
$(1)_OBJS := $$(call obj_of,$(2))
ALL_OBJS += $$($(1)_OBJS)
ALL_LIBS += $(BUILD)/lib/lib$(1).a
$(BUILD)/lib/lib$(1).a: $$($(1)_OBJS)
	@mkdir -p $$(@D)
	@$(if $(filter 1,$(V)),,echo "  AR      $$@";)rm -f $$@ && $(AR) rcs $$@ $$^
endef

# $(call epd_prog,NAME,SOURCES,LIBS) -> $(BUILD)/bin/NAME
# LIBS: epd library names in dependency order (users first), e.g. "engine common".
define epd_prog
$(1)_OBJS := $$(call obj_of,$(2))
ALL_OBJS += $$($(1)_OBJS)
ALL_PROGS += $(BUILD)/bin/$(1)
$(BUILD)/bin/$(1): $$($(1)_OBJS) $$(foreach l,$(3),$(BUILD)/lib/lib$$(l).a)
	@mkdir -p $$(@D)
	@$(if $(filter 1,$(V)),,echo "  LD      $$@";)$(CC) $(EPD_LDFLAGS) -o $$@ $$($(1)_OBJS) \
		$$(foreach l,$(3),$(BUILD)/lib/lib$$(l).a) $(EPD_LDLIBS)
endef

# $(call epd_test,NAME,SOURCES,LIBS) -> $(BUILD)/tests/NAME (a cmocka program;
# tests/run.sh runs each in its own process under a timeout).
define epd_test
$(1)_OBJS := $$(call obj_of,$(2))
ALL_OBJS += $$($(1)_OBJS)
ALL_TESTS += $(BUILD)/tests/$(1)
$$($(1)_OBJS): EPD_CPPFLAGS += -Itests/common $(TEST_CFLAGS)
$(BUILD)/tests/$(1): $$($(1)_OBJS) $$(foreach l,$(3),$(BUILD)/lib/lib$$(l).a)
	@mkdir -p $$(@D)
	@$(if $(filter 1,$(V)),,echo "  LD      $$@";)$(CC) $(EPD_LDFLAGS) -o $$@ $$($(1)_OBJS) \
		$$(foreach l,$(3),$(BUILD)/lib/lib$$(l).a) $(TEST_LIBS) $(EPD_LDLIBS)
endef

# Each folder registers its pieces.  Order matters only for readability.
MODULES := common proto transport engine api kv daemon client encoder prefill decode router bench tests
-include $(foreach m,$(MODULES),$(wildcard $(m)/module.mk))

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(@D)
	@$(if $(filter 1,$(V)),,echo "  CC      $<";)$(CC) $(EPD_INC) $(EPD_CPPFLAGS) $(EPD_CFLAGS) -c -o $@ $<

# Generated headers must exist before anything compiles (they may be included
# from any module); -MMD takes over after the first build.
$(ALL_OBJS): | $(GEN_HDRS)

-include $(ALL_OBJS:.o=.d)

.PHONY: all deps check test run bench clean san-test fuzz image

# Builds use every core.  Tests run EPD_TEST_JOBS programs at once
# (tests/run.sh; default 3), each in its own session with its own daemons
# on ephemeral ports; the EXCLUSIVE_TESTS of the module.mk files (fixed
# network names, podman, Slurm, the soak...) run alone, each with its reason
# beside it.
NPROC := $(shell nproc 2>/dev/null || echo 2)

all: $(ALL_LIBS) $(ALL_PROGS) $(ALL_TESTS)

deps:
	@./deploy/deps.sh
	@./tests/deploy/k8s_node_deps.sh build/k8s-node || \
		echo "deps: the npm packages of the k8s manifest check are not installed (offline?)"
	@./tests/tokenizer/deps.sh build/tokenizer-node || \
		echo "deps: the npm packages of the tokenizer oracle test are not installed (offline?)"
	@./tests/integration/openai-sdk/deps.sh build/node || \
		echo "deps: the OpenAI Node SDK of the OpenAI-surface tests is not installed (offline?)"

# Every test: unit (cmocka) and integration, each in its own process with a
# timeout; then the same suite built with ASan + UBSan by clang.
test: all
	@EPD_BUILD=$(BUILD) EPD_TEST_EXCLUSIVE="$(notdir $(EXCLUSIVE_TESTS))" \
		./tests/run.sh $(ALL_TESTS)

SAN_CC ?= clang
san-test:
	@$(MAKE) --no-print-directory BUILD=build/san CC=$(SAN_CC) \
		SANITIZER=address,undefined CFLAGS="-O1 -g" test

check: deps
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@$(MAKE) --no-print-directory test
	@$(MAKE) --no-print-directory -j$(NPROC) BUILD=build/san CC=$(SAN_CC) \
		SANITIZER=address,undefined CFLAGS="-O1 -g" all
	@$(MAKE) --no-print-directory san-test

# libFuzzer targets of tests/fuzz, each run for FUZZ_SECONDS.
FUZZ_SECONDS ?= 30
fuzz:
	@$(MAKE) --no-print-directory BUILD=build/fuzz CC=clang \
		SANITIZER=fuzzer-no-link,address,undefined CFLAGS="-O1 -g" FUZZ_SECONDS=$(FUZZ_SECONDS) fuzz-run

# Like check, run installs what is missing first, then builds in a second
# make: the package flags (pkg-config) are read when a make starts, so the
# build must start after the packages exist.
run: deps
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@./deploy/local/run-cluster.sh $(BUILD)

bench: all
	@./bench/run.sh $(BUILD)

# deploy/container: FROM scratch + the binaries and the libraries they load
# (IMAGE=name:tag to choose the tag)
IMAGE ?= localhost/epd:latest
image: all
	@./deploy/container/build.sh $(BUILD) $(IMAGE)

clean:
	rm -rf build
