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
# test_bench_overhead_opts.sh: overhead's option table, both modes (no
# daemon; well under a second)
ALL_TESTS += tests/bench/test_bench_overhead_opts.sh
