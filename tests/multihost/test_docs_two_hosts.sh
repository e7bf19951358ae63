#!/usr/bin/env bash
# docs/deploy/two-hosts.md, run as written: every code block the page marks
# `<!-- tested: HOST -->` runs, in page order, from the repository root, on
# host A (10.0.0.1) or B (10.0.0.2) — two network namespaces joined by a
# switch (lib.sh) — each with its own HOME, so nothing is shared but what
# the page says to copy.  The `both` block is the environment every other
# block starts from.  The test itself only does what the page leaves to a
# person: the scp of the model folder and the secret (a cp here).  Then:
#   - the ask block's completion text equals epd-generate's text (printed
#     by the same block), and epd-ctl listed a READY prefill and decode;
#   - the stop blocks stop every daemon the page started (SIGTERM, exit
#     within 40 s).
set -euo pipefail
# shellcheck source=tests/multihost/lib.sh
. "$(cd "$(dirname "$0")" && pwd)/lib.sh"
ROOT=$(cd "$MH_DIR/../.." && pwd)
DOC="$ROOT/docs/deploy/two-hosts.md"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# the page's daemons are not lib.sh's: whatever still runs in the two
# namespaces is killed before lib.sh deletes them (also on failure)
docs_cleanup() {
  local h
  for h in A B; do
    ip netns pids "$MH-$h" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
  done
  mh_cleanup
}
trap docs_cleanup EXIT

# the page's own addresses: namespaces make them private to this run
MH_NET=10.0.0
mh_switch
mh_host A 1
mh_host B 2
[ "$A_IP" = 10.0.0.1 ] && [ "$B_IP" = 10.0.0.2 ] || fail "the namespaces did not get the page's addresses"
mkdir -p "$T/A" "$T/B"
unset UCX_TLS EPD_CLUSTER_SECRET_FILE

# blocks: $T/blocks/NN.HOST.sh in page order
mkdir -p "$T/blocks"
awk -v dir="$T/blocks" '
  /^<!-- tested: [A-Za-z]+ -->$/ { host = $3; want = 1; next }
  want && /^```sh$/ { n++; file = sprintf("%s/%02d.%s.sh", dir, n, host); inblk = 1; want = 0; next }
  inblk && /^```$/ { inblk = 0; close(file); next }
  inblk { print > file; next }
  { if ($0 != "") want = 0 }
' "$DOC"
mapfile -t blocks < <(ls "$T/blocks")
[ "${#blocks[@]}" -ge 6 ] || fail "docs/deploy/two-hosts.md has ${#blocks[@]} tested blocks, expected 6 or more"
both=$(ls "$T/blocks" | grep '\.both\.sh$' | head -1)
[ -n "$both" ] || fail "no 'both' block"

# run_block FILE HOST: the block on HOST, its output to $T/out.NN
run_block() {
  local f=$1 host=$2 out
  out="$T/out.${f%%.*}"
  echo "== block $f on host $host"
  (cd "$ROOT" && nsenter --net="/run/netns/$MH-$host" -- env HOME="$T/$host" \
    bash -euo pipefail -c ". '$T/blocks/$both'; . '$T/blocks/$f'") >"$out" 2>&1 ||
    { cat "$out"; fail "block $f on host $host exited non-zero"; }
  cat "$out"
}

copied=0
ask_out=
for f in "${blocks[@]}"; do
  host=${f#*.}; host=${host%.sh}
  [ "$host" = both ] && continue
  if [ "$host" = B ] && [ "$copied" = 0 ]; then
    # what the page's scp line does
    cp -r "$T/A/epd-model" "$T/B/epd-model"
    cp -p "$T/A/epd-cluster-secret" "$T/B/epd-cluster-secret"
    copied=1
  fi
  run_block "$f" "$host"
  grep -q '"choices"' "$T/out.${f%%.*}" && ask_out="$T/out.${f%%.*}"
done

[ -n "$ask_out" ] || fail "no block printed a completion"
"$PYTHON3" - "$ask_out" <<'PY' || fail "the completion does not equal epd-generate's text"
import json, sys
lines = open(sys.argv[1], encoding="utf-8", errors="surrogateescape").read().split("\n")
i = next(k for k, l in enumerate(lines) if l.startswith("{") and '"choices"' in l)
doc, end = json.JSONDecoder().raw_decode(lines[i])
text = doc["choices"][0]["text"]
rest = "\n".join([lines[i][end:]] + lines[i + 1:]).strip("\n")
workers = "\n".join(lines[:i])
assert "prefill" in workers and "decode" in workers and "READY" in workers, workers
print("completion text:", repr(text))
print("epd-generate:   ", repr(rest))
assert text == rest, (text, rest)
PY

# every daemon the page started has stopped (the stop blocks ran above)
for h in A B; do
  for r in "$T/$h"/epd-*.ready; do
    pid=$(sed -n 's/.*pid=\([0-9]*\).*/\1/p' "$r")
    for i in $(seq 1 400); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && fail "$(basename "$r" .ready) (pid $pid) still runs 40 s after the stop block"
  done
done
echo PASS
