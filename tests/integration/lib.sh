# tests/integration/lib.sh — shared helpers of the integration tests
# (sourced, never run).  Real daemons on 127.0.0.1, started and stopped by
# the test by PID; every wait has a timeout; the temp dir and every daemon
# go away on exit, also on failure (trap).
#
#   EPD_BUILD        build folder whose binaries are tested (default build)
#   EPD_ITEST_KEEP   1: keep the temp dir (logs) for a look afterwards
set -euo pipefail

B=${EPD_BUILD:-build}
BIN="$B/bin"
ITEST="$B/itest"
export UCX_NET_DEVICES=lo
export UCX_TLS=${UCX_TLS:-posix,cma,tcp}
# the daemons' own logs go to files in $T; keep the tools quiet
export EPD_LOG_LEVEL=${EPD_LOG_LEVEL:-info}

T=$(mktemp -d "${TMPDIR:-/tmp}/epd-itest.XXXXXX")
PIDS=()
DAEMONS=()

itest_cleanup() {
  local rc=$?
  for p in "${PIDS[@]:-}"; do
    [ -n "$p" ] && kill -KILL "$p" 2>/dev/null || true
  done
  for p in "${PIDS[@]:-}"; do
    [ -n "$p" ] && wait "$p" 2>/dev/null || true
  done
  if [ $rc -ne 0 ]; then
    echo "----- daemon logs (last 25 lines each) -----"
    for f in "$T"/*.log; do
      [ -f "$f" ] || continue
      echo "== $f"
      tail -n 25 "$f"
    done
  fi
  if [ "${EPD_ITEST_KEEP:-0}" = 1 ]; then
    echo "kept $T"
  else
    rm -rf "$T"
  fi
  exit $rc
}
trap itest_cleanup EXIT
trap 'exit 130' INT TERM

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

note() {
  echo "== [${SECONDS}s] $*"
}

# mkmodel DIR [epd-mkmodel flags...]: a small model (tiny by default).
mkmodel() {
  local dir=$1
  shift
  "$BIN/epd-mkmodel" --out "$dir" "$@" >/dev/null
}

TINY_MODEL_FLAGS=(--layers 3 --dim 64 --heads 4 --kv-heads 2 --layer-pattern LLA --ffn 128
                  --vocab 258 --vision 0 --max-context 2048 --seed 7)
# the same language model with a small vision encoder: 32 x 32 input, 8 x 8
# patches, 2 x 2 merge -> 4 embeddings per image
TINY_VISION_FLAGS=(--layers 3 --dim 64 --heads 4 --kv-heads 2 --layer-pattern LLA --ffn 128
                   --vocab 259 --max-context 2048 --seed 7 --image-size 32 --patch-size 8
                   --vision-dim 32 --vision-layers 2 --vision-heads 2 --vision-ffn 64)

# mkimage KIND OUT [W H SEED]: a test image (tests/integration/epd_itest_image.c)
mkimage() {
  "$ITEST/epd-itest-image" "$@" || fail "epd-itest-image $*"
}

# start_daemon NAME prefill|decode [flags...]: starts build/bin/epd-NAME's
# role with a ready file $T/NAME.ready, log $T/NAME.log; sets NAME_PID and
# NAME_ADDR (the control address) once it serves (timeout 60 s: model load
# under ASan).
start_daemon() {
  local name=$1 role=$2
  shift 2
  rm -f "$T/$name.ready"
  # EPD_ITEST_NOFILE=N: the daemon runs with at most N file descriptors
  # (soft and hard: it cannot raise them)
  if [ -n "${EPD_ITEST_NOFILE:-}" ]; then
    sh -c 'ulimit -n "$0" && exec "$@"' "$EPD_ITEST_NOFILE" "$BIN/epd-$role" \
      --ready-file "$T/$name.ready" "$@" >>"$T/$name.log" 2>&1 &
  else
    "$BIN/epd-$role" --ready-file "$T/$name.ready" "$@" >>"$T/$name.log" 2>&1 &
  fi
  local pid=$!
  PIDS+=("$pid")
  local i
  for i in $(seq 1 600); do
    if [ -s "$T/$name.ready" ]; then
      break
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 20 "$T/$name.log" >&2 || true
      fail "$role daemon '$name' exited before it was ready"
    fi
    sleep 0.1
  done
  [ -s "$T/$name.ready" ] || fail "$role daemon '$name' not ready within 60 s"
  local line addr
  line=$(head -n 1 "$T/$name.ready")
  addr=$(sed -n 's/.*control=\([^ ]*\).*/\1/p' <<<"$line")
  [ -n "$addr" ] || fail "ready file of '$name' has no control=ADDR: $line"
  printf -v "${name}_PID" '%s' "$pid"
  printf -v "${name}_ADDR" '%s' "$addr"
  printf -v "${name}_STOPPED" '%s' 0
  DAEMONS+=("$name")
}

# start_unjoined NAME ROLE [flags...]: starts a worker given --router that
# the router has not accepted (yet): it writes no ready file (a worker is
# ready once the router lists it), so wait for its log line that says so
# instead; sets NAME_PID and NAME_ADDR like start_daemon.  wait_ready NAME
# then waits for the ready file.
start_unjoined() {
  local name=$1 role=$2
  shift 2
  rm -f "$T/$name.ready"
  # the log exists before the loop below reads it: the background job opens
  # it in its own time ("sed: can't read p.log", exit 2 under set -e, once
  # in a loaded make check)
  : >>"$T/$name.log"
  "$BIN/epd-$role" --ready-file "$T/$name.ready" "$@" >>"$T/$name.log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  local i addr=
  for i in $(seq 1 600); do
    addr=$(sed -n 's/.*control plane at \([^ ;]*\); not ready until the router.*/\1/p' \
      "$T/$name.log" | head -n 1)
    [ -n "$addr" ] && break
    [ -s "$T/$name.ready" ] && break
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 20 "$T/$name.log" >&2 || true
      fail "$role daemon '$name' exited before it served"
    fi
    sleep 0.1
  done
  [ -n "$addr" ] || fail "$role daemon '$name' did not say it waits for its router within 60 s"
  printf -v "${name}_PID" '%s' "$pid"
  printf -v "${name}_ADDR" '%s' "$addr"
  printf -v "${name}_STOPPED" '%s' 0
  DAEMONS+=("$name")
}

# wait_ready NAME [SECONDS]: until NAME's ready file is written (its router
# accepted it).
wait_ready() {
  local name=$1 secs=${2:-30} i
  for i in $(seq 1 $((secs * 10))); do
    [ -s "$T/$name.ready" ] && return 0
    sleep 0.1
  done
  fail "daemon '$name' not ready after ${secs}s: $(tail -n 3 "$T/$name.log")"
}

# stop_daemon NAME [SIGNAL]: kills by PID and reaps (default SIGTERM, then
# SIGKILL after 10 s).  Returns the daemon's exit status in STOP_RC.  The
# only way a test may end a daemon: finish_ok fails on any other that is gone.
stop_daemon() {
  local name=$1 sig=${2:-TERM}
  local pidvar="${name}_PID"
  local pid=${!pidvar}
  printf -v "${name}_STOPPED" '%s' 1
  kill -"$sig" "$pid" 2>/dev/null || true
  local i
  for i in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  STOP_RC=0
  wait "$pid" 2>/dev/null || STOP_RC=$?
}

# finish_ok: the end of a passing test.  Every daemon still running gets
# SIGTERM and must exit 0 (sanitizer builds: leak checks run then), and
# every other must have been stopped by the test (stop_daemon); no
# daemon log may hold a sanitizer report (also those of daemons killed or
# restarted during the test).
finish_ok() {
  local name pidvar
  local stopvar rc
  for name in "${DAEMONS[@]:-}"; do
    [ -n "$name" ] || continue
    pidvar="${name}_PID"
    stopvar="${name}_STOPPED"
    if kill -0 "${!pidvar}" 2>/dev/null; then
      stop_daemon "$name" TERM
      [ "$STOP_RC" = 0 ] || fail "daemon '$name' exited $STOP_RC on SIGTERM"
    elif [ "${!stopvar}" != 1 ]; then
      # gone although the test never stopped it: a crash that retries on
      # other workers hid from the test's own checks
      rc=0
      wait "${!pidvar}" 2>/dev/null || rc=$?
      fail "daemon '$name' died during the test (status $rc; log $T/$name.log)"
    fi
  done
  if grep -El "ERROR: (Address|Leak)Sanitizer|runtime error:|ThreadSanitizer" "$T"/*.log 2>/dev/null; then
    fail "sanitizer reports in the daemon logs above"
  fi
  echo PASS
}

# status_field ADDR FIELD: FIELD's value in `epd-ctl status ADDR` (first worker).
status_field() {
  "$BIN/epd-ctl" status "$1" | head -n 1 | tr ' ' '\n' | sed -n "s/^$2=//p"
}

health_field() {
  "$BIN/epd-ctl" health "$1" | sed -n "s/^$2=//p"
}

# wait_blocks_free ADDR [SECONDS]: until the decode worker's kv_blocks_free
# equals kv_blocks_total (quarantine releases are asynchronous).
wait_blocks_free() {
  local addr=$1 secs=${2:-20} free total i
  for i in $(seq 1 $((secs * 10))); do
    free=$(status_field "$addr" kv_blocks_free)
    total=$(status_field "$addr" kv_blocks_total)
    if [ -n "$free" ] && [ "$free" = "$total" ]; then
      return 0
    fi
    sleep 0.1
  done
  "$BIN/epd-ctl" status "$addr" >&2 || true
  fail "decode at $addr: kv_blocks_free=$free of $total after ${secs}s"
}

# prompt_of_len N [SEED]: N printable ASCII bytes (no newline), deterministic.
prompt_of_len() {
  local n=$1 seed=${2:-1}
  awk -v n="$n" -v s="$seed" 'BEGIN {
    srand(s); chars = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ.,;0123456789";
    out = ""; for (i = 0; i < n; i++) out = out substr(chars, int(rand() * length(chars)) + 1, 1);
    printf "%s", out }'
}

# same_as_colocated MODEL PREFILL_ADDR DECODE_ADDR PROMPT_FILE MAX [flags]:
# epd-ctl submit --tokens through the two workers must print exactly what
# epd-generate --tokens prints for the same prompt and sampling flags
# (GEN_FLAGS: flags for epd-generate alone, such as --kv-dtype).
same_as_colocated() {
  local model=$1 p=$2 d=$3 pf=$4 max=$5
  shift 5
  local want got
  want=$("$BIN/epd-generate" --model "$model" --prompt "$(cat "$pf")" --max-tokens "$max" \
         --tokens ${GEN_FLAGS:-} "$@") || fail "epd-generate failed"
  got=$("$BIN/epd-ctl" submit --prefill "$p" --decode "$d" --model "$model" --prompt-file "$pf" \
        --max-tokens "$max" --tokens --timeout-ms 60000 ${CTL_FLAGS:-} "$@") ||
    fail "epd-ctl submit failed (prompt $(wc -c <"$pf") bytes, max $max, flags: $*)"
  if [ "$want" != "$got" ]; then
    echo "colocated:     $want" >&2
    echo "disaggregated: $got" >&2
    fail "disaggregated output differs (prompt $(wc -c <"$pf") bytes, max $max, flags: $*)"
  fi
}

# ----- router helpers -----

# start_router NAME [epd-router flags...]: starts build/bin/epd-router on
# ephemeral ports (HTTP and control) like start_daemon; also sets NAME_HTTP
# (http://127.0.0.1:PORT).  NAME_ADDR is the router's control address.
start_router() {
  local name=$1
  shift
  start_daemon "$name" router --listen 127.0.0.1:0 --control-addr 127.0.0.1:0 "$@"
  local http
  http=$(sed -n 's/.*http=\([^ ]*\).*/\1/p' "$T/$name.ready")
  [ -n "$http" ] || fail "ready file of router '$name' has no http=ADDR"
  printf -v "${name}_HTTP" 'http://%s' "$http"
}

# router_state ROUTER_ADDR WORKER: the worker's state in the router's Status
# (its newest incarnation), empty when unknown.
router_state() {
  "$BIN/epd-ctl" status "$1" | awk -v w="worker=$2" '$1 == w { s = $0 } END { print s }' |
    tr ' ' '\n' | sed -n 's/^state=//p'
}

# wait_router_state ROUTER_ADDR WORKER STATE [SECONDS]
wait_router_state() {
  local addr=$1 worker=$2 want=$3 secs=${4:-20} got i
  for i in $(seq 1 $((secs * 10))); do
    got=$(router_state "$addr" "$worker")
    [ "$got" = "$want" ] && return 0
    sleep 0.1
  done
  "$BIN/epd-ctl" status "$addr" >&2 || true
  fail "router at $addr: worker $worker is '$got', not $want after ${secs}s"
}

# router_client ARGS...: tests/integration/epd_router_client.py
PYTHON3=$(command -v /usr/bin/python3 || command -v python3)
router_client() {
  "$PYTHON3" "$(dirname "${BASH_SOURCE[0]}")/epd_router_client.py" "$@"
}

# wait_while_running PID SECONDS CMD...: runs CMD (a condition) every
# 0.05 s until it succeeds (0), or until PID — the client that makes it
# true — has exited, or SECONDS pass (1).  For conditions a client brings
# about only once it is under way: the Python client first runs
# epd-generate for its expected answers (with --mixed, for up to 50 seeds),
# which under the sanitizers beside a CPU hog took longer than the fixed
# 400 polls test_router_failures once allowed ("started 0").  The bound
# is about a hung client, not about speed.
wait_while_running() {
  local pid=$1 secs=$2 end
  shift 2
  end=$((SECONDS + secs))
  while [ "$SECONDS" -lt "$end" ]; do
    "$@" && return 0
    kill -0 "$pid" 2>/dev/null || { "$@"; return; }
    sleep 0.05
  done
  return 1
}

# router_metric HTTP_URL SERIES: the value of one series of the router's
# /metrics, e.g. 'epd_router_worker_requests_total{worker="decode-0",pool="decode"}'
# (empty when absent).  Every router series carries model="..." first; a
# SERIES without it names the series of whatever model the router serves
# (epd_metric_value.awk), one with it must match exactly.
router_metric() {
  curl -s --max-time 10 "$1/metrics" | epd_metric_value "$2"
}

# epd_metric_value SERIES: on stdin a Prometheus text, on stdout the value
# of SERIES (empty when absent; epd_metric_value.awk says how the model
# label is matched).
epd_metric_value() {
  awk -v s="$1" -f "$(dirname "${BASH_SOURCE[0]}")/epd_metric_value.awk"
}
