# tests/deploy/deploy_lib.sh — helpers of the deployment tests (sourced
# after tests/integration/lib.sh, never run): "hosts" in network
# namespaces, and a completion compared with epd-generate's.
#
# Hosts: a bridge namespace $NS-sw (br0) and one namespace per host,
# $NS-h1..hN, each with eth0 on 10.79.0.0/24 (host i: 10.79.0.(10+i)) and
# no default route, so nothing leaves the namespaces.  The names hold the
# test's PID ($$), so runs side by side never meet; every namespace is
# removed on exit, also on failure (deploy_cleanup, chained before
# lib.sh's cleanup).  Processes run in a host with `nsenter --net=` (`ip
# netns exec` remounts /sys, which breaks podman and slurmd).

NS="epdd$$"
NS_HOSTS=0
DEPLOY_CLEANUPS=()

# deploy_on_exit CMD: runs CMD (a string, eval'd) at exit, before the
# namespaces go, newest first.
deploy_on_exit() {
  DEPLOY_CLEANUPS+=("$1")
}

deploy_cleanup() {
  local rc=$? i
  for ((i = ${#DEPLOY_CLEANUPS[@]} - 1; i >= 0; i--)); do
    (eval "${DEPLOY_CLEANUPS[$i]}") >/dev/null 2>&1 || true
  done
  for ((i = 1; i <= NS_HOSTS; i++)); do
    ip netns del "$NS-h$i" 2>/dev/null || true
  done
  ip netns del "$NS-sw" 2>/dev/null || true
  return $rc
}
trap 'deploy_cleanup; itest_cleanup' EXIT

# deploy_need_root: SKIP (exit 0) unless this can make network namespaces.
deploy_need_netns() {
  if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! command -v nsenter >/dev/null; then
    echo "SKIP: network namespaces need root, ip and nsenter"
    exit 0
  fi
  if ! ip netns add "$NS-probe" 2>/dev/null; then
    echo "SKIP: cannot create a network namespace here"
    exit 0
  fi
  ip netns del "$NS-probe"
}

# host_ip I: the address of host I
host_ip() {
  echo "10.79.0.$((10 + $1))"
}

# ns_create N: the bridge and hosts 1..N
ns_create() {
  local n=$1 i v
  ip netns add "$NS-sw"
  ip -n "$NS-sw" link add br0 type bridge
  ip -n "$NS-sw" link set br0 up
  ip -n "$NS-sw" link set lo up
  for ((i = 1; i <= n; i++)); do
    ip netns add "$NS-h$i"
    NS_HOSTS=$i
    v="e$$h$i"
    ip link add "$v" type veth peer name eth0 netns "$NS-h$i"
    ip link set "$v" netns "$NS-sw"
    ip -n "$NS-sw" link set "$v" master br0 up
    ip -n "$NS-h$i" addr add "$(host_ip "$i")/24" dev eth0
    ip -n "$NS-h$i" link set eth0 up
    ip -n "$NS-h$i" link set lo up
  done
  # the bridge forwards at once (no STP learning delay on a fresh port)
  for ((i = 1; i <= n; i++)); do
    local t
    for t in $(seq 1 50); do
      nsenter --net="/run/netns/$NS-h1" ping -c1 -W1 "$(host_ip "$i")" >/dev/null 2>&1 && break
      sleep 0.1
    done
  done
}

# on_host I CMD...: CMD in host I's network namespace
on_host() {
  local i=$1
  shift
  nsenter --net="/run/netns/$NS-h$i" "$@"
}

# completion_equals_generate HOST URL KEY MODEL_DIR PROMPT MAX: POST
# /v1/completions (greedy) from host HOST's namespace, with the bearer KEY
# (empty: none), and compare the text with epd-generate's for the same
# prompt on this machine.
completion_equals_generate() {
  local host=$1 url=$2 key=$3 model=$4 prompt=$5 max=$6
  local body hdr=() got want
  body=$(python3 -c 'import json,sys; print(json.dumps({"model": sys.argv[1], "prompt": sys.argv[2],
    "max_tokens": int(sys.argv[3]), "temperature": 0}))' "$(basename "$model")" "$prompt" "$max")
  [ -n "$key" ] && hdr=(-H "Authorization: Bearer $key")
  on_host "$host" curl -s --max-time 60 "${hdr[@]}" -H 'Content-Type: application/json' \
    -d "$body" -o "$T/completion.json" -w '%{http_code}' "$url/v1/completions" >"$T/completion.code" ||
    fail "curl $url/v1/completions from host $host"
  [ "$(cat "$T/completion.code")" = 200 ] ||
    fail "HTTP $(cat "$T/completion.code"): $(head -c 300 "$T/completion.json")"
  got=$(python3 -c 'import json,sys; sys.stdout.write(json.load(open(sys.argv[1]))["choices"][0]["text"])' \
        "$T/completion.json" | od -An -tx1 | tr -d ' \n')
  want=$("$BIN/epd-generate" --model "$model" --prompt "$prompt" --max-tokens "$max" --temperature 0 |
         head -c -1 | od -An -tx1 | tr -d ' \n')
  if [ "$got" != "$want" ]; then
    echo "epd-generate (hex): $want" >&2
    echo "router       (hex): $got" >&2
    fail "the completion differs from epd-generate's"
  fi
  echo "completion from host $host equals epd-generate ($((${#got} / 2)) bytes)"
}
