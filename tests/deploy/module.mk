# tests/deploy/: the deployment recipes of deploy/ and what orchestrators
# read (metrics), each an executable shell test run by tests/run.sh.
# The metrics lint runs in both passes (it starts the daemons); the image,
# the manifests and Slurm test recipes, not code, so they run in the gcc
# pass of make check only.
ALL_TESTS += tests/deploy/test_metrics_promtool.sh
ifeq ($(SANITIZER),)
ALL_TESTS += tests/deploy/test_container_image.sh
ALL_TESTS += tests/deploy/test_k8s_manifests.sh
ALL_TESTS += tests/deploy/test_slurm_cluster.sh
# Run alone (tests/run.sh, EPD_TEST_EXCLUSIVE): the image and Slurm tests
# build namespaces on the fixed subnet 10.79.0.0/24 and start podman
# containers and Slurm's daemons.  The manifests test (node, promtool,
# files only) runs beside others.
EXCLUSIVE_TESTS += tests/deploy/test_container_image.sh \
                   tests/deploy/test_slurm_cluster.sh
endif
