# tests/bench: every epd-bench subcommand at a tiny size (issue #24): a
# benchmark that cannot run is a defect.  It asserts that each completes,
# prints its table rows, and that overhead's --tsv parses; never a time.
# About 45 s on the 2-core machine; in the gcc pass only (what the
# benchmarks drive is tested under the sanitizers by the other programs).
ifeq ($(SANITIZER),)
ALL_TESTS += tests/bench/test_bench_smoke.sh
endif
# test_bench_overhead_attach.sh: overhead --attach-* against two daemons
# on loopback (~2 s; the daemons' clock and trace answers, rule 39, under
# the sanitizers too; across hosts: tests/multihost/test_mh_overhead_attach.sh)
ALL_TESTS += tests/bench/test_bench_overhead_attach.sh
# a bench ended by SIGTERM or SIGINT stops the daemons it spawned (~5 s)
ALL_TESTS += tests/bench/test_bench_signal.sh
# bench/epd_bench_http.c (the blocking client that reads /metrics and
# sends fleet's requests) against a server thread on 127.0.0.1: an answer
# ends at its length or last chunk, statuses and failures map to their
# epd_status_t, the deadline holds
$(eval $(call epd_test,test_epd_bench_http,tests/bench/test_epd_bench_http.c bench/epd_bench_http.c,epd_common))
$(test_epd_bench_http_OBJS): EPD_CPPFLAGS += -Ibench
# bench/epd_bench_sse.c (serve's streaming client) on a libuv loop against
# a scripted server thread on 127.0.0.1: payloads, [DONE] and error
# events, keep-alive reuse, statuses, lost requests, each ended once
$(eval $(call epd_test,test_epd_bench_sse,tests/bench/test_epd_bench_sse.c bench/epd_bench_sse.c,epd_common))
$(test_epd_bench_sse_OBJS): EPD_CPPFLAGS += -Ibench
# test_bench_overhead_opts.sh: overhead's option table, both modes (no
# daemon; well under a second)
ALL_TESTS += tests/bench/test_bench_overhead_opts.sh
