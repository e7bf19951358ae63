# tests/multihost/: the cluster on six "hosts" (network namespaces on one
# machine: lib.sh) with cut cables, partitions, loss, resets, slow and
# distant links.  Root only (SKIP otherwise).  About 80 s in all on the
# 2-core development machine, so they run in the gcc pass of make check
# only, not again under the sanitizers (run them there by hand:
# EPD_BUILD=build/san tests/multihost/test_mh_cut.sh).
ifeq ($(SANITIZER),)
ALL_TESTS += tests/multihost/test_mh_ucx_tcp.sh \
             tests/multihost/test_mh_ofi_tcp.sh \
             tests/multihost/test_mh_cut.sh \
             tests/multihost/test_mh_partition.sh \
             tests/multihost/test_mh_loss.sh \
             tests/multihost/test_mh_slow.sh \
             tests/multihost/test_docs_two_hosts.sh \
             tests/multihost/test_mh_overhead_attach.sh \
             tests/multihost/test_mh_overhead_hosts.sh
# test_mh_overhead_hosts.sh runs bench/overhead-hosts.sh at a tiny size
# (three hosts of its own, ~5 s, no time judged): beside other tests too.
# test_mh_overhead_attach.sh runs epd-bench overhead --attach-* across three
# hosts of its own (~15 s, 10 of them a connect with another secret timing
# out) and judges only measured quantities against each other (no time):
# it runs beside other tests too.
# test_docs_two_hosts.sh runs docs/deploy/two-hosts.md's blocks as written
# on two hosts of its own (no timing judged): it runs beside other tests.
# Run alone (tests/run.sh, EPD_TEST_EXCLUSIVE): each builds six namespaces
# on the fixed subnet 10.77.0.0/24 with host-side veths, shapes links with
# tc and cuts them with nft, and judges failover by deadlines of seconds
# (cut, partition, loss) and the delays it measures (slow).
EXCLUSIVE_TESTS += tests/multihost/test_mh_ucx_tcp.sh \
                   tests/multihost/test_mh_ofi_tcp.sh \
                   tests/multihost/test_mh_cut.sh \
                   tests/multihost/test_mh_partition.sh \
                   tests/multihost/test_mh_loss.sh \
                   tests/multihost/test_mh_slow.sh
endif
