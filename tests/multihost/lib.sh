# tests/multihost/lib.sh — a cluster on many "hosts" of one machine
# (sourced, never run).
#
# Each host is a network namespace with one veth "eth0" on 10.77.0.0/24,
# plugged into a bridge in a switch namespace; nothing has a default route,
# so no packet leaves the machine.  Daemons run inside with
# `nsenter --net=/run/netns/NAME` (not `ip netns exec`, which remounts /sys),
# every member with the cluster secret, binding their control port on the
# wildcard and advertising their host's address (--advertise-addr), the data
# plane on eth0 (--data-addr).  Faults are made where a real cluster has
# them: a host's cable (`ip link set` on its switch port), nftables in a
# host (partition, random loss, TCP resets), tc on a host's eth0 (a slow
# link), a user-space delay relay (latency: this kernel has no netem).
#
# Names are unique to the run (epdmh<PID>-...), so runs in parallel do not
# meet; the EXIT trap kills every daemon by PID and deletes every namespace
# of the run, also on failure.
#
#   EPD_BUILD          build folder whose binaries are tested (default build)
#   EPD_MH_KEEP        1: keep the temp dir (logs) for a look afterwards
#   EPD_MH_TRANSPORT   ucx (default) or ofi: the transport of the fault tests
#
# Without root, namespaces or nftables the test prints SKIP and passes.
set -euo pipefail

B=${EPD_BUILD:-build}
BIN="$B/bin"
MH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ITEST_DIR="$MH_DIR/../integration"
PYTHON3=$(command -v /usr/bin/python3 || command -v python3)
# the transports find their devices from --data-addr: nothing inherited
unset UCX_NET_DEVICES UCX_TCP_AF_PRIO FI_PROVIDER
export UCX_TLS=${UCX_TLS:-tcp}
export EPD_LOG_LEVEL=${EPD_LOG_LEVEL:-info}

MH="epdmh$$"
MH_TR=${EPD_MH_TRANSPORT:-ucx}
MH_NET=10.77.0
MH_HOSTS=()
PIDS=()
DAEMONS=()
MH_NETNS_MADE=0

mh_skip() {
  echo "SKIP: $*"
  exit 0
}

for tool in ip nsenter nft tc curl; do
  command -v "$tool" >/dev/null 2>&1 || mh_skip "$tool is not installed (make deps)"
done
[ "$(id -u)" = 0 ] || mh_skip "network namespaces need root"

T=$(mktemp -d "${TMPDIR:-/tmp}/epd-mh.XXXXXX")

mh_cleanup() {
  local rc=$?
  local p h
  trap - EXIT
  for p in "${PIDS[@]:-}"; do
    [ -n "$p" ] && kill -KILL "$p" 2>/dev/null || true
  done
  for p in "${PIDS[@]:-}"; do
    [ -n "$p" ] && wait "$p" 2>/dev/null || true
  done
  if [ "$MH_NETNS_MADE" = 1 ]; then
    for h in "${MH_HOSTS[@]:-}"; do
      [ -n "$h" ] && ip netns del "$MH-$h" 2>/dev/null || true
    done
    ip netns del "$MH-sw" 2>/dev/null || true
  fi
  if [ $rc -ne 0 ]; then
    echo "----- daemon logs (last 25 lines each) -----"
    for f in "$T"/*.log; do
      [ -f "$f" ] || continue
      echo "== $f"
      tail -n 25 "$f"
    done
  fi
  if [ "${EPD_MH_KEEP:-0}" = 1 ]; then
    echo "kept $T"
  else
    rm -rf "$T"
  fi
  exit $rc
}
trap mh_cleanup EXIT
trap 'exit 130' INT TERM

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

note() {
  echo "== [${SECONDS}s] $*"
}

# ------------------------------------------------------------ the network

# mh_switch: the switch namespace and its bridge (once).
mh_switch() {
  MH_NETNS_MADE=1
  ip netns add "$MH-sw" || mh_skip "cannot create a network namespace"
  ip -n "$MH-sw" link add br0 type bridge
  ip -n "$MH-sw" link set br0 up
  ip -n "$MH-sw" link set lo up
}

# mh_host NAME OCTET: a host namespace NAME with eth0 = 10.77.0.OCTET/24 on
# the switch (its port there is p-NAME), lo up, no default route.  Sets
# NAME_IP.
mh_host() {
  local name=$1 octet=$2
  MH_HOSTS+=("$name")
  ip netns add "$MH-$name"
  ip -n "$MH-sw" link add "p-$name" type veth peer name eth0 netns "$MH-$name"
  ip -n "$MH-sw" link set "p-$name" master br0 up
  ip -n "$MH-$name" link set lo up
  ip -n "$MH-$name" addr add "$MH_NET.$octet/24" dev eth0
  ip -n "$MH-$name" link set eth0 up
  printf -v "${name}_IP" '%s' "$MH_NET.$octet"
}

# mh_in HOST CMD...: runs CMD in HOST's network namespace.
mh_in() {
  local host=$1
  shift
  nsenter --net="/run/netns/$MH-$host" -- "$@"
}

# mh_cut HOST / mh_heal HOST: unplug / plug back HOST's cable (its switch
# port goes down: packets to and from it are lost, connects time out).
mh_cut() { ip -n "$MH-sw" link set "p-$1" down; }
mh_heal() { ip -n "$MH-sw" link set "p-$1" up; }

# mh_nft HOST RULES: nftables rules (nft -f syntax) loaded in HOST.
mh_nft() {
  local host=$1 rules=$2
  printf '%s\n' "$rules" | mh_in "$host" nft -f - || fail "nft in $host: $rules"
}

# mh_nft_flush HOST: removes every table the tests added in HOST.
mh_nft_flush() { mh_in "$1" nft flush ruleset; }

# ------------------------------------------------------------ the cluster

# the cluster secret every member and epd-ctl share
mh_secret() {
  (umask 077 && head -c 32 /dev/urandom >"$T/cluster-secret")
  export EPD_CLUSTER_SECRET_FILE="$T/cluster-secret"
}

# mh_start NAME HOST ROLE [flags...]: starts build/bin/epd-ROLE in HOST's
# namespace, control port on the wildcard advertised as HOST's address,
# data plane on HOST's eth0, with the cluster secret; ready file
# $T/NAME.ready, log $T/NAME.log.  Sets NAME_PID, NAME_ADDR (the advertised
# control address) once it serves (timeout 60 s).
mh_start() {
  local name=$1 host=$2 role=$3
  shift 3
  local ipvar="${host}_IP"
  local ip=${!ipvar}
  rm -f "$T/$name.ready"
  nsenter --net="/run/netns/$MH-$host" -- "$BIN/epd-$role" --ready-file "$T/$name.ready" \
    --control-addr 0.0.0.0:0 --advertise-addr "$ip" --data-addr "$ip" \
    --cluster-secret-file "$T/cluster-secret" "$@" >>"$T/$name.log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  local i
  for i in $(seq 1 600); do
    [ -s "$T/$name.ready" ] && break
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 20 "$T/$name.log" >&2 || true
      fail "$role daemon '$name' on $host exited before it was ready"
    fi
    sleep 0.1
  done
  [ -s "$T/$name.ready" ] || fail "$role daemon '$name' on $host not ready within 60 s"
  local line addr
  line=$(head -n 1 "$T/$name.ready")
  addr=$(sed -n 's/.*control=\([^ ]*\).*/\1/p' <<<"$line")
  [ -n "$addr" ] || fail "ready file of '$name' has no control=ADDR: $line"
  printf -v "${name}_PID" '%s' "$pid"
  printf -v "${name}_ADDR" '%s' "$addr"
  printf -v "${name}_HOST" '%s' "$host"
  DAEMONS+=("$name")
}

# mh_start_router NAME HOST [flags...]: the router, HTTP on the wildcard
# (clients on its host: no API key needed... but the address is not
# loopback, so --allow-unauthenticated); sets NAME_HTTP.
mh_start_router() {
  local name=$1 host=$2
  shift 2
  mh_start "$name" "$host" router --listen 0.0.0.0:0 --allow-unauthenticated "$@"
  local http
  http=$(sed -n 's/.*http=\([^ ]*\).*/\1/p' "$T/$name.ready")
  [ -n "$http" ] || fail "ready file of router '$name' has no http=ADDR"
  printf -v "${name}_HTTP" 'http://%s' "$http"
}

# mh_stop NAME [SIGNAL]: signals by PID and reaps (SIGTERM drains: up to
# 40 s, then SIGKILL).  STOP_RC is the exit status.
mh_stop() {
  local name=$1 sig=${2:-TERM}
  local pidvar="${name}_PID"
  local pid=${!pidvar}
  kill -"$sig" "$pid" 2>/dev/null || true
  local i
  for i in $(seq 1 400); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  STOP_RC=0
  wait "$pid" 2>/dev/null || STOP_RC=$?
  printf -v "${name}_STOPPED" '%s' 1
}

# mh_wait_exit NAME [SECONDS]: until the daemon exits by itself (after a
# drain); STOP_RC is its exit status.  Fails if it is still running.
mh_wait_exit() {
  local name=$1 secs=${2:-40}
  local pidvar="${name}_PID"
  local pid=${!pidvar} i
  for i in $(seq 1 $((secs * 10))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$pid" 2>/dev/null && fail "daemon '$name' still running after ${secs}s"
  STOP_RC=0
  wait "$pid" 2>/dev/null || STOP_RC=$?
  printf -v "${name}_STOPPED" '%s' 1
}

# mh_finish: every daemon still running gets SIGTERM and must exit 0; no
# sanitizer report in any log.
mh_finish() {
  local name pidvar stopvar
  for name in "${DAEMONS[@]:-}"; do
    [ -n "$name" ] || continue
    pidvar="${name}_PID"
    stopvar="${name}_STOPPED"
    if kill -0 "${!pidvar}" 2>/dev/null; then
      mh_stop "$name" TERM
      [ "$STOP_RC" = 0 ] || fail "daemon '$name' exited $STOP_RC on SIGTERM"
    elif [ "${!stopvar:-0}" != 1 ]; then
      fail "daemon '$name' died during the test (log $T/$name.log)"
    fi
  done
  if grep -El "ERROR: (Address|Leak)Sanitizer|runtime error:" "$T"/*.log 2>/dev/null; then
    fail "sanitizer reports in the daemon logs above"
  fi
  echo PASS
}

# ------------------------------------------------------------ clients

# The tools run on a host too (there is no route from the machine itself).
# mh_ctl HOST ARGS...: epd-ctl on HOST (signed with the cluster secret).
mh_ctl() {
  local host=$1
  shift
  mh_in "$host" "$BIN/epd-ctl" "$@"
}

# mh_client HOST ARGS...: tests/integration/epd_router_client.py on HOST.
mh_client() {
  local host=$1
  shift
  mh_in "$host" "$PYTHON3" "$ITEST_DIR/epd_router_client.py" "$@"
}

# mh_curl HOST ARGS...: curl on HOST (bounded).
mh_curl() {
  local host=$1
  shift
  mh_in "$host" curl -s --max-time 30 "$@"
}

# mh_metric HOST URL SERIES: one series of the router's /metrics (SERIES
# without the model label matches the series with it: epd_metric_value.awk).
mh_metric() {
  mh_curl "$1" "$2/metrics" | awk -v s="$3" -f "$ITEST_DIR/epd_metric_value.awk"
}

# mh_state HOST ROUTER_ADDR WORKER: the worker's state at the router.
mh_state() {
  mh_ctl "$1" status "$2" | awk -v w="worker=$3" '$1 == w { s = $0 } END { print s }' |
    tr ' ' '\n' | sed -n 's/^state=//p'
}

# mh_wait_state HOST ROUTER_ADDR WORKER STATE [SECONDS]
mh_wait_state() {
  local host=$1 addr=$2 worker=$3 want=$4 secs=${5:-30} got i
  for i in $(seq 1 $((secs * 5))); do
    got=$(mh_state "$host" "$addr" "$worker")
    [ "$got" = "$want" ] && return 0
    sleep 0.2
  done
  mh_ctl "$host" status "$addr" >&2 || true
  fail "router at $addr: worker $worker is '$got', not $want after ${secs}s"
}

# mh_wait_ready HOST HTTP [SECONDS]: until the router's /ready answers 200.
mh_wait_ready() {
  local host=$1 http=$2 secs=${3:-60} code i
  for i in $(seq 1 $((secs * 5))); do
    code=$(mh_curl "$host" -o /dev/null -w '%{http_code}' "$http/ready" || true)
    [ "$code" = 200 ] && return 0
    sleep 0.2
  done
  mh_curl "$host" "$http/ready" >&2 || true
  fail "the router's /ready is $code, not 200, after ${secs}s"
}

# mkmodel DIR [epd-mkmodel flags...]
mkmodel() {
  local dir=$1
  shift
  "$BIN/epd-mkmodel" --out "$dir" "$@" >/dev/null
}

# the model of the integration tests with a small vision encoder
TINY_VISION_FLAGS=(--layers 3 --dim 64 --heads 4 --kv-heads 2 --layer-pattern LLA --ffn 128
                   --vocab 259 --max-context 2048 --seed 7 --image-size 32 --patch-size 8
                   --vision-dim 32 --vision-layers 2 --vision-heads 2 --vision-ffn 64)

# mh_cluster TRANSPORT [epd-router flags...]: the switch; hosts r (the
# router, and the clients), e1 (an encoder), p1 p2 (prefill), d1 d2
# (decode); the vision model $T/m; every daemon on TRANSPORT expecting tcp
# lanes (--expect-transport tcp: a link that would use anything else fails
# loudly); waits until the router's /ready says 200.  Worker ids
# encoder-1, prefill-1, prefill-2, decode-1, decode-2; peers declared dead
# after 1.5 s of silence (the faults below are seen quickly).
MH_WORKER_FLAGS=()
mh_cluster() {
  local tr=$1
  shift
  mh_switch
  mh_host r 10
  mh_host e1 20
  mh_host p1 31
  mh_host p2 32
  mh_host d1 41
  mh_host d2 42
  mh_secret
  mkmodel "$T/m" "${TINY_VISION_FLAGS[@]}"
  MH_WORKER_FLAGS=(--model "$T/m" --transport "$tr" --expect-transport tcp
                   --peer-timeout-ms 1500 --connect-timeout-ms 1500)
  mh_start_router r r "${MH_WORKER_FLAGS[@]}" "$@"
  local w=(--router "$r_ADDR" "${MH_WORKER_FLAGS[@]}")
  mh_start e1 e1 encoder "${w[@]}" --worker-id encoder-1
  mh_start p1 p1 prefill "${w[@]}" --worker-id prefill-1
  mh_start p2 p2 prefill "${w[@]}" --worker-id prefill-2
  mh_start d1 d1 decode "${w[@]}" --worker-id decode-1
  mh_start d2 d2 decode "${w[@]}" --worker-id decode-2
  mh_wait_ready r "$r_HTTP"
}

# mh_delay NAME HOST PEER_IP DELAY_MS: every TCP connection HOST opens to
# PEER_IP goes through a delay relay (epd_mh_delay.py) in HOST: DELAY_MS
# more each way.  nftables in HOST redirects them (nat output, table
# mhdelay_NAME) to the relay on 127.0.0.1; the relay's own connections are
# marked and pass.  Its stats ("connections=N bytes=B") are kept in
# $T/NAME.stats.
mh_delay() {
  local name=$1 host=$2 peer=$3 ms=$4 port i
  # nsenter itself, not the mh_in function: a function run with & is a
  # subshell, and its PID (killed at cleanup) is not the relay's
  nsenter --net="/run/netns/$MH-$host" -- "$PYTHON3" "$MH_DIR/epd_mh_delay.py" \
    --listen 127.0.0.1:0 --delay-ms "$ms" --mark 0x4d --ready-file "$T/$name.relay" --stats-file "$T/$name.stats" \
    >>"$T/$name.log" 2>&1 &
  PIDS+=("$!")
  printf -v "${name}_PID" '%s' "$!"
  for i in $(seq 1 100); do
    [ -s "$T/$name.relay" ] && break
    sleep 0.1
  done
  port=$(sed -n 's/^port=//p' "$T/$name.relay" 2>/dev/null)
  [ -n "$port" ] || fail "the delay relay $name did not start: $(cat "$T/$name.log")"
  mh_nft "$host" "table ip mhdelay_$name {
  chain out { type nat hook output priority -100; policy accept;
    meta mark != 0x4d ip daddr $peer meta l4proto tcp redirect to :$port; }
}"
}

