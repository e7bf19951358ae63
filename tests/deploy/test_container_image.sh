#!/usr/bin/env bash
# The container image (deploy/container): built offline by the same script
# as `make image`, into a podman store of the test's own (vfs, in $T), then
# smoke-tested across three "hosts" in network namespaces — router on h1,
# prefill on h2, decode on h3, each a container of the image run with
# `--network ns:/run/netns/...` — with the cluster secret and an API key
# mounted as 0600 files: one completion through the router equals
# epd-generate's (greedy, the model mounted read-only at /models); the
# k8s preStop command (epd-ctl drain --self --wait-ms) run in the prefill
# container drains it (DRAINING at the router).  Every
# container and namespace is removed on exit, also on failure.
# Needs root, podman and runc (make deps installs them): else SKIP.
source "$(dirname "$0")/../integration/lib.sh"
source "$(dirname "$0")/deploy_lib.sh"

deploy_need_netns
for c in podman runc; do
  command -v "$c" >/dev/null 2>&1 || { echo "SKIP: $c is not installed (make deps installs it)"; exit 0; }
done

# a store of our own: nothing of the machine's images is touched, and
# removing $T removes it (vfs: plain folders, no mounts left behind)
PODMAN=(podman --root "$T/store" --runroot "$T/runroot" --storage-driver vfs --cgroup-manager cgroupfs
        --events-backend file)
RUN=(run -d --runtime runc --ulimit nofile=20000:20000 --ulimit nproc=32768:32768
     --read-only --cap-drop ALL --security-opt no-new-privileges)
TAG=localhost/epd:test-$$
CONTAINERS=()
deploy_on_exit 'for c in "${CONTAINERS[@]:-}"; do [ -n "$c" ] && "${PODMAN[@]}" rm -f -t 0 "$c"; done'

note "build the image (deploy/container/build.sh, offline: --pull=never --network none)"
EPD_PODMAN="${PODMAN[*]}" ./deploy/container/build.sh "$B" "$TAG" >"$T/build.log" 2>&1 ||
  { tail -n 20 "$T/build.log"; fail "image build"; }
grep '^image:' "$T/build.log"
"${PODMAN[@]}" image inspect "$TAG" --format 'size {{.Size}} bytes, {{len .RootFS.Layers}} layer(s)'

mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"
mkdir -p "$T/secrets" "$T/ready"
(umask 077 && head -c 32 /dev/urandom >"$T/secrets/cluster-secret")
KEY=sk-image-$RANDOM$RANDOM
(umask 077 && printf '%s\n' "$KEY" >"$T/secrets/api-keys")
export EPD_CLUSTER_SECRET_FILE="$T/secrets/cluster-secret"

ns_create 3
RIP=$(host_ip 1)
MOUNTS=(-v "$T/m:/models/m:ro" -v "$T/secrets/cluster-secret:/run/secrets/epd/cluster-secret:ro"
        -v "$T/ready:/ready")
ENVS=(-e UCX_TLS=tcp -e UCX_NET_DEVICES=eth0)

# ctr NAME HOST CMD...: a container of the image in host HOST's namespace
ctr() {
  local name=$1 host=$2
  shift 2
  "${PODMAN[@]}" "${RUN[@]}" --name "$name-$$" --network "ns:/run/netns/$NS-h$host" \
    "${MOUNTS[@]}" "${ENVS[@]}" "$@" >/dev/null || fail "podman run $name"
  CONTAINERS+=("$name-$$")
}

# wait_file PATH NAME: a ready file, or the container's log and fail (60 s)
wait_ready() {
  local f=$1 name=$2 i
  for i in $(seq 1 600); do
    [ -s "$f" ] && { echo "$name: $(head -n 1 "$f")"; return 0; }
    if [ "$("${PODMAN[@]}" inspect -f '{{.State.Running}}' "$name-$$" 2>/dev/null)" != true ]; then
      "${PODMAN[@]}" logs "$name-$$" 2>&1 | tail -n 20
      fail "container $name exited before it was ready"
    fi
    sleep 0.1
  done
  "${PODMAN[@]}" logs "$name-$$" 2>&1 | tail -n 20
  fail "container $name not ready within 60 s"
}

note "router on h1 ($RIP), prefill on h2, decode on h3: containers of $TAG"
ctr router 1 -v "$T/secrets/api-keys:/run/secrets/epd/api-keys:ro" "$TAG" \
  epd-router --model /models/m --listen "$RIP:8000" --control-addr "$RIP:7000" \
  --cluster-secret-file /run/secrets/epd/cluster-secret --api-key-file /run/secrets/epd/api-keys \
  --heartbeat-ms 200 --ready-file /ready/router
wait_ready "$T/ready/router" router
ctr prefill 2 "$TAG" epd-prefill --model /models/m --worker-id prefill-0 \
  --control-addr "$(host_ip 2):7001" --router "$RIP:7000" \
  --cluster-secret-file /run/secrets/epd/cluster-secret --ready-file /ready/prefill
ctr decode 3 "$TAG" epd-decode --model /models/m --worker-id decode-0 --kv-blocks 512 \
  --state-slots 32 --control-addr "$(host_ip 3):7002" --router "$RIP:7000" \
  --cluster-secret-file /run/secrets/epd/cluster-secret --ready-file /ready/decode
wait_ready "$T/ready/prefill" prefill
wait_ready "$T/ready/decode" decode

note "both workers READY at the router (epd-ctl from h1, signed with the secret)"
ok=0
for i in $(seq 1 200); do
  n=$(on_host 1 "$BIN/epd-ctl" status "$RIP:7000" 2>/dev/null | grep -c 'state=READY' || true)
  [ "$n" = 2 ] && { ok=1; break; }
  sleep 0.1
done
[ $ok = 1 ] || { on_host 1 "$BIN/epd-ctl" status "$RIP:7000" >&2 || true; fail "workers not READY"; }
on_host 1 "$BIN/epd-ctl" workers "$RIP:7000"

note "a completion through the router, from h1, equals epd-generate"
completion_equals_generate 1 "http://$RIP:8000" "$KEY" "$T/m" "Containers on three hosts" 12
code=$(on_host 1 curl -s -o /dev/null -w '%{http_code}' --max-time 10 "http://$RIP:8000/v1/models")
[ "$code" = 401 ] || fail "/v1/models without the key: HTTP $code, want 401"

note "the preStop hook of deploy/k8s: epd-ctl drain --self --wait-ms inside the prefill container"
"${PODMAN[@]}" exec "prefill-$$" epd-ctl drain "$(host_ip 2):7001" --self --wait-ms 10000 \
  --cluster-secret-file /run/secrets/epd/cluster-secret || fail "epd-ctl drain --self in the container"
ok=0
for i in $(seq 1 100); do
  on_host 1 "$BIN/epd-ctl" status "$RIP:7000" | grep -q '^worker=prefill-0 .*state=DRAINING' &&
    { ok=1; break; }
  sleep 0.1
done
[ $ok = 1 ] || fail "prefill-0 not DRAINING at the router after drain --self"

note "SIGTERM (podman stop): every container exits 0"
for c in decode prefill router; do
  "${PODMAN[@]}" stop -t 10 "$c-$$" >/dev/null
  rc=$("${PODMAN[@]}" inspect -f '{{.State.ExitCode}}' "$c-$$")
  [ "$rc" = 0 ] || { "${PODMAN[@]}" logs "$c-$$" 2>&1 | tail -n 20; fail "$c exited $rc on SIGTERM"; }
done
echo PASS
