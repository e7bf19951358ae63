# deploy/slurm/epd-job.sh — the body of the epd sbatch scripts (sourced
# by epd-cluster.sbatch and epd-cluster-het.sbatch inside the job).
#
# epd_job_run "ROUTER_SRUN_ARGS" "WORKERS_SRUN_ARGS" WORKER_NODES: makes the job folder
# and a fresh cluster secret (0600) in it, starts the router as one job
# step, waits for it, starts each pool as a step of its own (EPD_PREFILL,
# EPD_DECODE, EPD_ENCODER tasks, spread cyclically over the worker nodes),
# waits until every worker is READY at the router, writes the endpoint to
# $EPD_JOB_DIR/endpoint and serves until the job is cancelled or reaches
# its time limit (Slurm then signals every step: SIGTERM, and SIGKILL after
# KillWait).

epd_die() {
  echo "epd-job: $*" >&2
  exit 1
}

epd_job_run() {
  local router_args=$1 worker_args=$2 worker_nodes=${3:-1}
  : "${EPD_MODEL:?EPD_MODEL: the model folder, on a filesystem every node sees}"
  export EPD_BIN=${EPD_BIN:-$SLURM_SUBMIT_DIR/build/bin}
  export EPD_JOB_DIR=${EPD_JOB_DIR:-$SLURM_SUBMIT_DIR/epd-job-$SLURM_JOB_ID}
  export EPD_MODEL EPD_IFACE=${EPD_IFACE:-eth0}
  local step="$EPD_SLURM_DIR/epd-step.sh"
  local prefill=${EPD_PREFILL:-1} decode=${EPD_DECODE:-1} encoder=${EPD_ENCODER:-0}
  local timeout_s=${EPD_START_TIMEOUT:-300}
  [ -x "$EPD_BIN/epd-router" ] || epd_die "no epd binaries in $EPD_BIN (set EPD_BIN)"
  [ "$prefill" -ge 1 ] && [ "$decode" -ge 1 ] || epd_die "EPD_PREFILL and EPD_DECODE must be >= 1"

  mkdir -p "$EPD_JOB_DIR"
  (umask 077 && head -c 32 /dev/urandom >"$EPD_JOB_DIR/cluster-secret")
  export EPD_CLUSTER_SECRET_FILE="$EPD_JOB_DIR/cluster-secret"
  trap 'echo "epd-job: signalled, stopping"; exit 0' TERM INT

  # shellcheck disable=SC2086
  srun $router_args --overlap --overcommit --job-name=epd-router --output="$EPD_JOB_DIR/router.log" \
    "$step" router &
  local i
  for ((i = 0; i < timeout_s * 10; i++)); do
    [ -s "$EPD_JOB_DIR/router.ready" ] && break
    sleep 0.1
  done
  [ -s "$EPD_JOB_DIR/router.ready" ] || epd_die "router not ready in ${timeout_s}s ($EPD_JOB_DIR/router.log)"
  local ctl http
  ctl=$(sed -n 's/.*control=\([^ ]*\).*/\1/p' "$EPD_JOB_DIR/router.ready")
  http=$(sed -n 's/.*http=\([^ ]*\).*/\1/p' "$EPD_JOB_DIR/router.ready")

  local role n
  for role in prefill decode encoder; do
    n=${!role}
    [ "$n" -gt 0 ] || continue
    # shellcheck disable=SC2086
    srun $worker_args --nodes=$((n < worker_nodes ? n : worker_nodes)) --ntasks="$n" --distribution=cyclic --overlap --overcommit --job-name="epd-$role" \
      --output="$EPD_JOB_DIR/$role-%t.log" "$step" "$role" &
  done
  local want=$((prefill + decode + encoder)) ready=0
  for ((i = 0; i < timeout_s * 10; i++)); do
    ready=$("$EPD_BIN/epd-ctl" status "$ctl" 2>/dev/null | grep -c 'state=READY' || true)
    [ "$ready" = "$want" ] && break
    sleep 0.1
  done
  [ "$ready" = "$want" ] || epd_die "$ready of $want workers READY after ${timeout_s}s (logs: $EPD_JOB_DIR)"
  echo "http://$http" >"$EPD_JOB_DIR/endpoint"
  echo "epd: router http://$http (control $ctl); $prefill prefill + $decode decode + $encoder encoder READY"
  "$EPD_BIN/epd-ctl" workers "$ctl" || true
  # serve until cancelled: Slurm signals the steps and this script
  wait
}
