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
endif
