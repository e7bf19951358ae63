# proto/: .proto schemas; protoc-c generates C into $(BUILD)/gen at build
# time (never committed).  libepd_proto = generated code + request-plane
# framing (epd_msg) + the control plane's gRPC server and client (epd_rpc).
PROTO_FILES := $(wildcard proto/*.proto)
PROTO_GEN_C := $(patsubst proto/%.proto,$(BUILD)/gen/%.pb-c.c,$(PROTO_FILES))
PROTO_GEN_H := $(PROTO_GEN_C:.c=.h)
GEN_HDRS += $(PROTO_GEN_H)

# One protoc-c run produces both files; the grouped target says so.
$(BUILD)/gen/%.pb-c.c $(BUILD)/gen/%.pb-c.h &: proto/%.proto
	@mkdir -p $(@D)
	@$(if $(filter 1,$(V)),,echo "  PROTOC  $<";)protoc-c --proto_path=proto --c_out=$(BUILD)/gen $<

# Generated sources compile from $(BUILD)/gen.
$(BUILD)/obj/gen/%.o: $(BUILD)/gen/%.c | $(GEN_HDRS)
	@mkdir -p $(@D)
	@$(if $(filter 1,$(V)),,echo "  CC      $<";)$(CC) $(EPD_INC) $(EPD_CPPFLAGS) $(EPD_CFLAGS) -c -o $@ $<

PROTO_OBJS := $(patsubst $(BUILD)/gen/%.c,$(BUILD)/obj/gen/%.o,$(PROTO_GEN_C)) \
              $(call obj_of,proto/epd_msg.c proto/epd_msg_sample.c proto/epd_msg_logprob.c proto/epd_rpc.c proto/epd_rpc_auth.c proto/epd_rpc_client.c proto/epd_rpc_frame.c proto/epd_rpc_guard.c proto/epd_rpc_h2scan.c proto/epd_layout.c)
ALL_OBJS += $(PROTO_OBJS)
ALL_LIBS += $(BUILD)/lib/libepd_proto.a
$(BUILD)/lib/libepd_proto.a: $(PROTO_OBJS)
	@mkdir -p $(@D)
	@$(if $(filter 1,$(V)),,echo "  AR      $@";)rm -f $@ && $(AR) rcs $@ $^

# Keep generated files: make would delete them as intermediates.
.SECONDARY: $(PROTO_GEN_C) $(PROTO_GEN_H)
