#!/usr/bin/env bash
# deploy/slurm/epd-step.sh ROLE — one epd daemon as one task of a Slurm job
# step (run by srun from epd-cluster.sbatch / epd-cluster-het.sbatch; not
# for direct use).  ROLE: router, prefill, decode or encoder.
#
# Addresses: the daemon binds the IPv4 address of $EPD_IFACE on its node
# (the data plane too: UCX_NET_DEVICES / FI_PROVIDER's interface), so
# every host reaches it at that address.  The router writes its ready file
# into the job folder (a shared filesystem); the workers read the router's
# control address from there.  The daemon is exec'd: Slurm's signals
# (scancel: SIGTERM, then SIGKILL after KillWait) reach it directly.
set -euo pipefail
role=${1:?usage: epd-step.sh router|prefill|decode|encoder}
: "${EPD_BIN:?}" "${EPD_MODEL:?}" "${EPD_JOB_DIR:?}"
iface=${EPD_IFACE:-eth0}
ip=$(ip -4 -o addr show dev "$iface" 2>/dev/null | awk '{ sub(/\/.*/, "", $4); print $4; exit }')
if [ -z "$ip" ]; then
  echo "epd-step: no IPv4 address on $iface on $(hostname) (set EPD_IFACE)" >&2
  exit 1
fi
# EPD_UCX_* rather than UCX_*: sbatch hands the job the submitter's
# environment, whose UCX settings (a loopback-only UCX_NET_DEVICES=lo, say)
# are not the cluster's
export UCX_NET_DEVICES=${EPD_UCX_NET_DEVICES:-$iface}
export UCX_TLS=${EPD_UCX_TLS:-tcp}
export FI_PROVIDER=${EPD_FI_PROVIDER:-tcp}
node=${SLURMD_NODENAME:-$(hostname)}
common=(--model "$EPD_MODEL" --engine "${EPD_ENGINE:-ref}" --transport "${EPD_TRANSPORT:-ucx}"
        --cluster-secret-file "$EPD_JOB_DIR/cluster-secret")

if [ "$role" = router ]; then
  keys=(--allow-unauthenticated)
  if [ -n "${EPD_API_KEY_FILE:-}" ]; then
    keys=(--api-key-file "$EPD_API_KEY_FILE")
  fi
  exec "$EPD_BIN/epd-router" "${common[@]}" --worker-id "router-$node" \
    --listen "$ip:${EPD_HTTP_PORT:-8000}" --control-addr "$ip:${EPD_CONTROL_PORT:-7000}" \
    --ready-file "$EPD_JOB_DIR/router.ready" "${keys[@]}"
fi

# a worker: wait for the router (its ready file), then register with it
for _ in $(seq 1 600); do
  [ -s "$EPD_JOB_DIR/router.ready" ] && break
  sleep 0.1
done
ctl=$(sed -n 's/.*control=\([^ ]*\).*/\1/p' "$EPD_JOB_DIR/router.ready" 2>/dev/null || true)
if [ -z "$ctl" ]; then
  echo "epd-step: no router ready file in $EPD_JOB_DIR after 60 s" >&2
  exit 1
fi
id="$role-$node-${SLURM_STEP_ID:-0}-${SLURM_PROCID:-0}"
extra=()
case "$role" in
  decode) extra=(--kv-blocks "${EPD_DECODE_KV_BLOCKS:-4096}") ;;
  prefill | encoder) ;;
  *) echo "epd-step: unknown role '$role'" >&2; exit 2 ;;
esac
exec "$EPD_BIN/epd-$role" "${common[@]}" --worker-id "$id" --control-addr "$ip:0" \
  --router "$ctl" --ready-file "$EPD_JOB_DIR/$id.ready" "${extra[@]}"
