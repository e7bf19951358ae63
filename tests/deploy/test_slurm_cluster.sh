#!/usr/bin/env bash
# deploy/slurm on a two-node Slurm (Debian's slurm-wlm 22.05 + munge) in
# network namespaces: slurmctld on h1 (10.79.0.11), slurmd n1 on h2 and n2
# on h3, a munged of the test's own (its key and socket in $T), every
# daemon in the foreground and stopped by PID.
#   1. sbatch -N 2 epd-cluster.sbatch (router on n1, 1 prefill + 1 decode
#      on n2): a completion through the router, from h1, equals
#      epd-generate's; scancel; then no process of the job is left
#      (nothing whose command line names the job's folder, no slurmstepd).
#   2. the same with epd-cluster-het.sbatch (a heterogeneous job: router
#      component on one node, pools on the other).
# Needs root, slurm-wlm and munge (make deps installs them): else SKIP.
source "$(dirname "$0")/../integration/lib.sh"
source "$(dirname "$0")/deploy_lib.sh"

deploy_need_netns
for c in slurmctld slurmd sbatch munged; do
  command -v "$c" >/dev/null 2>&1 || { echo "SKIP: $c is not installed (make deps installs slurm-wlm and munge)"; exit 0; }
done
# the daemons' paths must not be writable by others (munged checks)
chmod 700 "$T"
BIN=$(cd "$BIN" && pwd)
ROOT=$(pwd)

mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"
KEY=sk-slurm-$RANDOM$RANDOM
(umask 077 && printf '%s\n' "$KEY" >"$T/api-keys")

note "munged, slurmctld on h1, slurmd n1 on h2 and n2 on h3"
ns_create 3
(umask 077 && head -c 1024 /dev/urandom >"$T/munge.key")
munged --foreground --force --socket="$T/munge.sock" --key-file="$T/munge.key" \
  --log-file="$T/munged.log" --pid-file="$T/munged.pid" --seed-file="$T/munged.seed" \
  >"$T/munged.out" 2>&1 &
MUNGE_PID=$!
PIDS+=("$MUNGE_PID")
for i in $(seq 1 100); do [ -S "$T/munge.sock" ] && break; sleep 0.1; done
[ -S "$T/munge.sock" ] || fail "munged did not start: $(tail -n 5 "$T/munged.log")"

HOST=$(hostname)
NCPU=$(nproc)
mkdir -p "$T/state" "$T/spool"
cat >"$T/slurm.conf" <<EOF
ClusterName=epdtest$$
SlurmctldHost=$HOST($(host_ip 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$T/munge.sock
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool/%n
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd-%n.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
KillWait=5
MinJobAge=2
InactiveLimit=0
NodeName=n1 NodeAddr=$(host_ip 2) NodeHostname=$HOST CPUs=$NCPU State=UNKNOWN
NodeName=n2 NodeAddr=$(host_ip 3) NodeHostname=$HOST CPUs=$NCPU State=UNKNOWN
PartitionName=epd Nodes=n1,n2 Default=YES MaxTime=30 State=UP
EOF
printf 'CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n' >"$T/cgroup.conf"
export SLURM_CONF="$T/slurm.conf"

# nsenter itself (not a function: $! must be the daemon's PID) execs it
nsenter --net="/run/netns/$NS-h1" slurmctld -D -i -f "$T/slurm.conf" >"$T/slurmctld.out" 2>&1 &
PIDS+=($!)
nsenter --net="/run/netns/$NS-h2" slurmd -D -N n1 -f "$T/slurm.conf" >"$T/slurmd-n1.out" 2>&1 &
PIDS+=($!)
nsenter --net="/run/netns/$NS-h3" slurmd -D -N n2 -f "$T/slurm.conf" >"$T/slurmd-n2.out" 2>&1 &
PIDS+=($!)

# our_stepds: PIDs of the slurmstepd processes of this test's slurmd (they
# carry SLURM_CONF=$T/slurm.conf in their environment); a slurmstepd
# outlives a slurmd that is killed
our_stepds() {
  local p
  for p in $(pgrep -x slurmstepd 2>/dev/null || true); do
    tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qxF "SLURM_CONF=$T/slurm.conf" && echo "$p"
  done
  return 0
}
# on exit (also on failure): jobs cancelled, their steps given 10 s, then killed
deploy_on_exit 'for i in $(seq 1 100); do [ -z "$(our_stepds)" ] && break; sleep 0.1; done; for p in $(our_stepds); do kill -KILL "$p"; done'

ok=0
for i in $(seq 1 300); do
  if [ "$(on_host 1 sinfo -h -N -o '%N %T' 2>/dev/null | grep -c ' idle$')" = 2 ]; then ok=1; break; fi
  sleep 0.1
done
on_host 1 sinfo -N || true
[ $ok = 1 ] || fail "the two nodes are not idle after 30 s (logs: slurmctld.log, slurmd-n*.log)"

# job_state JOBID: its state, empty once slurmctld forgot it
job_state() {
  on_host 1 squeue -h -j "$1" -o %T 2>/dev/null | head -n 1 || true
}

# run_job NAME SBATCH_FILE [sbatch args]: submits the recipe, waits for its
# endpoint, checks one completion, scancels it, and checks that nothing of
# it is left
run_job() {
  local name=$1 script=$2
  shift 2
  local dir="$T/$name" jobid i endpoint
  mkdir -p "$dir"
  # sbatch hands the job this environment: no loopback-only UCX settings
  jobid=$(on_host 1 env -u UCX_NET_DEVICES -u UCX_TLS EPD_MODEL="$T/m" EPD_BIN="$BIN" EPD_SLURM_DIR="$ROOT/deploy/slurm" \
    EPD_JOB_DIR="$dir" EPD_API_KEY_FILE="$T/api-keys" EPD_PREFILL=1 EPD_DECODE=1 \
    EPD_IFACE=eth0 EPD_START_TIMEOUT=90 \
    sbatch --parsable --chdir="$ROOT" --output="$dir/job.out" "$@" "$ROOT/$script") ||
    fail "sbatch $script"
  jobid=${jobid%%;*}
  echo "$name: job $jobid"
  # (bounded: a scancel without a slurmctld retries for minutes)
  deploy_on_exit "timeout 5 nsenter --net=/run/netns/$NS-h1 scancel $jobid"
  for i in $(seq 1 1200); do
    [ -s "$dir/endpoint" ] && break
    case "$(job_state "$jobid")" in
      "" | FAILED | CANCELLED | COMPLETED | TIMEOUT | NODE_FAIL)
        cat "$dir/job.out" 2>/dev/null | tail -n 20
        fail "$name: job $jobid ended before serving" ;;
    esac
    sleep 0.1
  done
  [ -s "$dir/endpoint" ] || { tail -n 20 "$dir/job.out"; fail "$name: no endpoint after 120 s"; }
  endpoint=$(cat "$dir/endpoint")
  grep -E '^  (prefill|decode)-' "$dir/job.out" || true
  on_host 1 squeue -j "$jobid" -s -o '%.12i %.12j %N' || true
  # the router on one node, the workers on another
  local rnode
  rnode=$(sed -n 's/.*worker=router-\([^ ]*\).*/\1/p' "$dir/router.ready")
  ls "$dir"/prefill-*.ready "$dir"/decode-*.ready >/dev/null || fail "$name: no worker ready files"
  if ls "$dir"/prefill-"$rnode"-*.ready "$dir"/decode-"$rnode"-*.ready >/dev/null 2>&1; then
    fail "$name: a worker runs on the router's node $rnode"
  fi
  echo "$name: router on $rnode at $endpoint, workers on the other node"
  completion_equals_generate 1 "$endpoint" "$KEY" "$T/m" "A job on two Slurm nodes" 12

  note "$name: scancel $jobid: every process of the job goes"
  on_host 1 scancel "$jobid"
  for i in $(seq 1 300); do
    [ -z "$(job_state "$jobid")" ] && break
    sleep 0.1
  done
  [ -z "$(job_state "$jobid")" ] || fail "$name: job $jobid still '$(job_state "$jobid")' 30 s after scancel"
  local left=""
  for i in $(seq 1 100); do
    left=$(ps -eo pid=,args= | grep -F "$dir" | grep -v grep || true)
    for p in $(our_stepds); do left+="$p slurmstepd of job $jobid"$'\n'; done
    [ -z "$left" ] && break
    sleep 0.1
  done
  [ -z "$left" ] || fail "$name: processes left after scancel:
$left"
  echo "$name: cancelled, no process left"
}

note "1. epd-cluster.sbatch over two nodes"
run_job plain deploy/slurm/epd-cluster.sbatch -N 2
note "2. epd-cluster-het.sbatch: a heterogeneous job"
run_job het deploy/slurm/epd-cluster-het.sbatch

note "stop slurmd, slurmctld, munged"
for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
  kill -TERM "${PIDS[$i]}" 2>/dev/null || true
done
for p in "${PIDS[@]}"; do
  for i in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$p" 2>/dev/null || true
  wait "$p" 2>/dev/null || true
done
left=$(ps -eo pid=,args= | grep -F "$T" | grep -v grep || true)
[ -z "$left" ] || fail "processes left: $left"
echo PASS
