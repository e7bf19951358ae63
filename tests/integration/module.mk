# tests/integration/: real daemons on 127.0.0.1.  Each test is an executable
# shell script (run by tests/run.sh in its own process group, under a
# timeout, with EPD_BUILD naming the build whose binaries it tests); the C
# helper programs they run are built into $(BUILD)/itest (not
# $(BUILD)/tests: the runner must not start them on their own).
ITEST_LIBS := epd_client epd_xport epd_proto epd_engine epd_common

# $(call epd_itest_prog,NAME,SOURCES) -> $(BUILD)/itest/NAME
define epd_itest_prog
$(1)_OBJS := $$(call obj_of,$(2))
ALL_OBJS += $$($(1)_OBJS)
ALL_PROGS += $(BUILD)/itest/$(1)
$$($(1)_OBJS): EPD_CPPFLAGS += -Iclient -Itests/integration
$(BUILD)/itest/$(1): $$($(1)_OBJS) $$(foreach l,$(ITEST_LIBS),$(BUILD)/lib/lib$$(l).a)
	@mkdir -p $$(@D)
	@$(if $(filter 1,$(V)),,echo "  LD      $$@";)$(CC) $(EPD_LDFLAGS) -o $$@ $$($(1)_OBJS) \
		$$(foreach l,$(ITEST_LIBS),$(BUILD)/lib/lib$$(l).a) $(EPD_LDLIBS)
endef

$(eval $(call epd_itest_prog,epd-itest-storm,tests/integration/epd_itest_storm.c tests/integration/epd_itest_colo.c tests/integration/epd_itest_status.c))
$(eval $(call epd_itest_prog,epd-itest-raw,tests/integration/epd_itest_raw.c))
# a writer stalled mid-write and continued after its memory may have been reused (the fence)
$(eval $(call epd_itest_prog,epd-itest-stall,tests/integration/epd_itest_stall.c tests/integration/epd_itest_colo.c tests/integration/epd_itest_status.c))
ALL_TESTS += tests/integration/test_fence_ucx_shm.sh \
             tests/integration/test_fence_ucx_tcp.sh \
             tests/integration/test_fence_ofi_tcp.sh
$(eval $(call epd_itest_prog,epd-itest-image,tests/integration/epd_itest_image.c))
# stb_image_write's JPEG writer shifts negative ints (undefined, harmless)
ifneq ($(findstring undefined,$(SANITIZER)),)
$(epd-itest-image_OBJS): EPD_CFLAGS += -fno-sanitize=shift
endif

ALL_TESTS += tests/integration/test_disagg_ucx_shm.sh \
             tests/integration/test_disagg_ucx_tcp.sh \
             tests/integration/test_disagg_ofi_tcp.sh \
             tests/integration/test_storm_aborts.sh \
             tests/integration/test_kill_prefill.sh \
             tests/integration/test_kill_decode.sh \
             tests/integration/test_garbage.sh \
             tests/integration/test_drain.sh \
             tests/integration/test_router_basic.sh \
             tests/integration/test_router_cluster.sh \
             tests/integration/test_router_failures.sh \
             tests/integration/test_router_policies.sh \
             tests/integration/test_router_retry.sh \
             tests/integration/test_prefill_queue_lease.sh \
             tests/integration/test_router_auth.sh \
             tests/integration/test_openai_sdk.sh \
             tests/integration/test_openai_surface.sh \
             tests/integration/test_openai_choices.sh \
             tests/integration/test_router_rejoin.sh \
             tests/integration/test_multimodal_local.sh \
             tests/integration/test_multimodal_ucx_shm.sh \
             tests/integration/test_multimodal_ofi_tcp.sh \
             tests/integration/test_prefix_cache.sh \
             tests/integration/test_kv_tier.sh \
             tests/integration/test_router_kv_aware.sh \
             tests/integration/test_ttft_phases.sh
# /v1/chat/completions through a model's own chat template (engine/epd_chat.c)
ALL_TESTS += tests/integration/test_router_chat_template.sh
# run alone (tests/run.sh, EPD_TEST_EXCLUSIVE): after SIGSTOPping encoder-0
# it has about a second (the router's --dead-after-ms 1000) for three
# Python clients to start and reach the router, or they are not retried
# ("no retry counted (0 -> 0)" twice with other programs beside it)
EXCLUSIVE_TESTS += tests/integration/test_multimodal_ucx_shm.sh
$(eval $(call epd_itest_prog,epd-itest-poison,tests/integration/epd_itest_poison.c))
ALL_TESTS += tests/integration/test_image_hash.sh
$(eval $(call epd_itest_prog,epd-itest-rogue,tests/integration/epd_itest_rogue.c tests/integration/epd_itest_colo.c))
# the control plane with a cluster secret: strangers, replays (epd-itest-ctlreplay)
$(eval $(call epd_itest_prog,epd-itest-ctlreplay,tests/integration/epd_itest_ctlreplay.c))
ALL_TESTS += tests/integration/test_control_auth.sh
# what a stranger can hold of a control port: idle floods under 256 fds,
# HTTP/2 rapid reset (proto/epd_rpc_guard.c; epd_rapid_reset.py)
ALL_TESTS += tests/integration/test_control_guard.sh
ALL_TESTS += tests/integration/test_trust_ucx_shm.sh \
             tests/integration/test_trust_ucx_tcp.sh \
             tests/integration/test_trust_ofi_tcp.sh
# bind / advertise / data addresses, grpc.health.v1, /ready, SIGTERM drains (#15)
ALL_TESTS += tests/integration/test_addresses.sh
# epd-bench fleet's simulated workers: READY at the router, DEAD once stopped (#15)
ALL_TESTS += tests/integration/test_fleet.sh
# run alone (tests/run.sh, EPD_TEST_EXCLUSIVE): 40 workers' heartbeats must
# keep all of them READY at the router for the whole test
EXCLUSIVE_TESTS += tests/integration/test_fleet.sh
# overload: the router's queue and 429s, decode KV on demand with preemption
ALL_TESTS += tests/integration/test_router_burst.sh \
             tests/integration/test_decode_preempt.sh
# overload that never answers 5xx (#24): a 300-burst from one address at the
# default per-address cap, 429 after the head past it, --trusted-proxies
ALL_TESTS += tests/integration/test_router_overload.sh
# faults below the daemons: EPD_XPORT_FAULTS (transport/epd_xport_faults.h)
ALL_TESTS += tests/integration/test_faults.sh
# a router killed mid-stream over ucx-shm: no worker busy-polls after it (#29)
ALL_TESTS += tests/integration/test_router_kill_ucx_shm.sh
# a request without a usable prefill/decode pair waits for one (--no-worker-wait-ms, #29)
ALL_TESTS += tests/integration/test_router_no_worker_wait.sh
# epd-bench soak at 2,000 requests (faults, stalls, kills, aborts); the gcc
# pass only: under the sanitizers it would take minutes
ifeq ($(SANITIZER),)
ALL_TESTS += tests/integration/test_soak.sh
# run alone (tests/run.sh, EPD_TEST_EXCLUSIVE): it loads the machine on
# purpose (8 clients, stalls, kills) and its "hung" counts a request that
# takes longer than a deadline
EXCLUSIVE_TESTS += tests/integration/test_soak.sh
endif
# model folders with Qwen3's tokenizer.json (random Qwen3 and Qwen3-MoE)
# through the router, prefill and decode: equal to epd-generate token for
# token, completions and chat, prefix hit and miss; streams migrated after
# their decode worker is killed (hf_cluster.sh CONF PART, one part each).
# 30-90 s each on the 2-core machine, 3-4x that under the sanitizers: the
# sanitizer pass runs the Qwen3 part over ucx-shm, the gcc pass all six.
ALL_TESTS += tests/integration/test_hf_qwen3_ucx_shm.sh
ifeq ($(SANITIZER),)
ALL_TESTS += tests/integration/test_hf_qwen3moe_ucx_shm.sh \
             tests/integration/test_hf_migrate_ucx_shm.sh \
             tests/integration/test_hf_qwen3_ofi_tcp.sh \
             tests/integration/test_hf_qwen3moe_ofi_tcp.sh \
             tests/integration/test_hf_migrate_ofi_tcp.sh
endif
# characters split across generated ids (a byte-level tokenizer.json):
# the router's streamed and whole texts equal epd-generate's
ALL_TESTS += tests/integration/test_hf_utf8_stream.sh
# make run MODEL=DIR (deploy/local/run-cluster.sh) on a folder with a
# tokenizer.json and generation_config.json; PORT=0; the folder untouched
ALL_TESTS += tests/integration/test_run_model.sh
# chunked prefill (issue #25): 16k-token prompts on ref, whole and in
# chunks, prefill -> decode and through a router; admission 400s; a
# SIGSTOP/SIGCONT and an abort mid-run
ALL_TESTS += tests/integration/test_chunked_prefill.sh
ALL_TESTS += tests/integration/test_chunked_stamped.sh
# what a worker sets up on its host: the KV pools committed at start
# (--kv-prefault), prefill's compute thread ahead for the CPU (--compute-nice)
ALL_TESTS += tests/integration/test_worker_host.sh
# a 100,001-token prompt (over a 64 KiB message) on sim: prefill -> decode
# and through a router equal epd-generate (messages sized for the window)
ALL_TESTS += tests/integration/test_long_prompt.sh
# --kv-dtype bf16/fp8/int8 and a mixed map through prefill + decode (ucx
# shm) on ref and a random Qwen3: disaggregated equals epd-generate
# --kv-dtype, prefix-cache hits; a mismatched map refused with its line.
ALL_TESTS += tests/integration/test_kv_dtype.sh
