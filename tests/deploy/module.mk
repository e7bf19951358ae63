# tests/deploy/: the deployment recipes of deploy/ and what orchestrators
# read (metrics), each an executable shell test run by tests/run.sh.
ALL_TESTS += tests/deploy/test_metrics_promtool.sh
ALL_TESTS += tests/deploy/test_container_image.sh
ALL_TESTS += tests/deploy/test_k8s_manifests.sh
ALL_TESTS += tests/deploy/test_slurm_cluster.sh
