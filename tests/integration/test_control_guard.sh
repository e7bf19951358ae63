#!/usr/bin/env bash
# What a stranger (no cluster secret) can hold of a control port
# (proto/epd_rpc_guard.c), the router run with 256 file descriptors:
#  - 1,000 idle TCP connections to the router's control port from eight
#    addresses: those past the caps are closed at once (per address, then
#    the oldest unauthenticated one for each newer), the router never runs
#    out of descriptors, a completion through it still answers 200 and a
#    new member's call (epd-ctl workers) gets through while the flood is
#    held; once the flood closes, new control connections are served; a
#    client that half-closes after its call gets the whole answer; an
#    idle connection is closed by the deadline (--control-auth-timeout-ms);
#  - with its descriptor limit lowered below the cap (prlimit), 200 idle
#    connections make accept fail (EMFILE): the router sheds the oldest
#    unauthenticated connection, a member's call gets through, and once
#    the flood closes it accepts and serves as before (gRPC's own listener
#    never accepted again after one EMFILE);
#  - HTTP/2 rapid reset: 100,000 HEADERS+RST_STREAM pairs against the
#    router's and a decode worker's control ports leave each one's resident
#    memory within 96 MB of where it was (Debian's gRPC 1.51 alone: +1.3 GB
#    for the router, measured), and the cluster serving; the same on a
#    member's connection (a daemon without a secret, one call first), which
#    only the reset limit closes.
source "$(dirname "$0")/lib.sh"

( umask 077
  head -c 32 /dev/urandom | base64 >"$T/secret" )
S=(--cluster-secret-file "$T/secret")
# epd-ctl (wait_router_state, workers) reads the secret from here
export EPD_CLUSTER_SECRET_FILE="$T/secret"
CTL="$BIN/epd-ctl"
# ASan keeps freed memory in quarantine (256 MB by default), which would
# count as resident here: a small one keeps the bound about live memory
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=16"
RSS_BOUND_KB=$((96 * 1024))
NOFILE=256

rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
nfds() { ls "/proc/$1/fd" | wc -l; }
complete() {
  local out code
  out=$(curl -s --max-time 60 -w '\n%{http_code}' "$r_HTTP/v1/completions" \
    -H 'Content-Type: application/json' \
    -d '{"model":"m","prompt":"The guard keeps the door.","max_tokens":8,"temperature":0}') ||
    fail "curl to the router failed"
  code=$(tail -n 1 <<<"$out")
  [ "$code" = 200 ] && grep -q '"text":' <<<"$out" || fail "completion: HTTP $code: $out"
}

mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"
EPD_ITEST_NOFILE=$NOFILE start_router r --model "$T/m" --heartbeat-ms 200 "${S[@]}" \
  --control-auth-timeout-ms 8000 --control-max-conns-per-addr 16
[ "$(awk '/^Max open files/ { print $4 }' "/proc/$r_PID/limits")" = $NOFILE ] ||
  fail "the router runs with $(grep 'open files' "/proc/$r_PID/limits")"
start_daemon d decode --model "$T/m" --worker-id decode-0 --kv-blocks 256 --state-slots 16 \
  --router "$r_ADDR" "${S[@]}"
start_daemon p prefill --model "$T/m" --worker-id prefill-0 --router "$r_ADDR" "${S[@]}"
wait_router_state "$r_ADDR" decode-0 READY
wait_router_state "$r_ADDR" prefill-0 READY
complete
cap=$(sed -n 's/.*control port: up to \([0-9]*\) connections.*/\1/p' "$T/r.log" | head -n 1)
[ -n "$cap" ] && [ "$cap" -lt $((NOFILE / 3)) ] || fail "control connection cap '$cap'"
note "control cap $cap connections at $NOFILE descriptors; router fds $(nfds "$r_PID")"

note "1,000 idle connections to the router's control port, from 127.0.0.2-9"
port=${r_ADDR##*:}
rm -f "$T/flood.go" "$T/flood.held"
"$PYTHON3" - "$port" "$T/flood.held" "$T/flood.go" "$cap" >"$T/flood.out" 2>&1 <<'PY' &
import os, select, socket, sys, time
port, held_file, go_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
socks = []
for i in range(1000):
    s = socket.socket()
    s.bind(("127.0.0.%d" % (2 + i // 125), 0))  # 125 from each in turn
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    socks.append(s)
# the server closes those past the caps (per address, or the oldest
# unauthenticated for each newer): wait until what is left open fits the
# cap (argv[4]), or 60 s
cap = int(sys.argv[4])
deadline = time.time() + 60
open_ = set(socks)
while time.time() < deadline and len(open_) > cap:
    r, _, _ = select.select(list(open_), [], [], 0.2)
    for s in r:
        try:
            data = s.recv(1)
        except OSError:
            data = b""
        if not data:
            open_.discard(s)
print("connected=1000 still_open=%d closed_by_server=%d" % (len(open_), 1000 - len(open_)))
sys.stdout.flush()
open(held_file, "w").write("%d\n" % len(open_))
while not os.path.exists(go_file) and time.time() < deadline + 120:
    time.sleep(0.1)
for s in socks:
    s.close()
PY
flood_pid=$!
for i in $(seq 1 1200); do
  [ -s "$T/flood.held" ] && break
  kill -0 "$flood_pid" 2>/dev/null || fail "the flood client died: $(cat "$T/flood.out")"
  sleep 0.1
done
[ -s "$T/flood.held" ] || fail "the flood client did not report"
held=$(cat "$T/flood.held")
note "$(cat "$T/flood.out"); router fds $(nfds "$r_PID") of $NOFILE"
[ "$held" -le "$cap" ] || fail "$held idle connections held open, over the cap $cap"
[ "$(nfds "$r_PID")" -lt $NOFILE ] || fail "the router is out of descriptors"
note "while the flood is held: a completion, and a member's new control connection"
complete
"$CTL" workers "$r_ADDR" "${S[@]}" >"$T/workers" || fail "epd-ctl workers during the flood"
grep -q '^decode pool: 1 READY' "$T/workers" || fail "decode pool: $(cat "$T/workers")"
grep -q 'control: refused .*--control-max-conns-per-addr' "$T/r.log" ||
  fail "the router did not log the per-address refusals"
grep -q 'control: .*connections open (--control-max-conns): closed' "$T/r.log" ||
  fail "the router did not log shedding the oldest unauthenticated connection"
touch "$T/flood.go"
wait "$flood_pid" || fail "the flood client failed: $(cat "$T/flood.out")"

note "after the flood: new control connections are served"
for i in $(seq 1 100); do
  "$CTL" workers "$r_ADDR" "${S[@]}" >"$T/workers" 2>/dev/null && break
  sleep 0.1
done
grep -q '^decode pool: 1 READY' "$T/workers" || fail "after the flood: $(cat "$T/workers")"
[ "$(EPD_CLUSTER_SECRET_FILE= "$CTL" probe "$r_ADDR")" = SERVING ] || fail "probe after the flood"
complete

note "a client that half-closes after its call still gets the whole answer"
"$PYTHON3" - "$port" <<'PY' || fail "half-close: the answer was cut"
import socket, struct, sys
def frame(t, f, sid, p=b""):
    return struct.pack(">BHBBI", len(p) >> 16, len(p) & 0xFFFF, t, f, sid) + p
def lit(n, v):
    return bytes([0x10, len(n)]) + n + bytes([len(v)]) + v
hdrs = b"".join(lit(n, v) for n, v in [(b":method", b"POST"), (b":scheme", b"http"),
    (b":path", b"/epd.Control/Health"), (b":authority", b"x"),
    (b"content-type", b"application/grpc"), (b"te", b"trailers")])
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=60)
s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0) + frame(1, 4, 1, hdrs) +
          frame(0, 1, 1, b"\0\0\0\0\0"))
s.shutdown(socket.SHUT_WR)
buf = b""
while True:
    d = s.recv(65536)
    if not d:
        break
    buf += d
end = False
while len(buf) >= 9:
    n = (buf[0] << 16) | (buf[1] << 8) | buf[2]
    t, f, sid = buf[3], buf[4], struct.unpack(">I", buf[5:9])[0] & 0x7FFFFFFF
    end = end or (t == 1 and f & 1 and sid == 1)
    buf = buf[9 + n:]
assert end, "no trailers for the call before EOF"
PY

note "an idle connection is closed by the deadline"
"$PYTHON3" - "$port" <<'PY' || fail "an idle connection was not closed by the router"
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=120)
s.settimeout(120)  # the deadline is 8 s; a loaded machine gets the rest
assert s.recv(1) == b"", "bytes from the router"
PY
grep -q 'control: closed .*no HTTP/2 preface within 8000 ms' "$T/r.log" ||
  fail "the router did not log the deadline"

note "out of descriptors: the listener sheds and accepts again"
# the soft limit lowered under the running router (its cap was sized at
# start): 200 idle connections now exhaust its descriptors
low=$(($(nfds "$r_PID") + 30))
prlimit --pid "$r_PID" --nofile="$low:" || fail "prlimit"
rm -f "$T/flood.go" "$T/flood.held"
"$PYTHON3" - "$port" "$T/flood.held" "$T/flood.go" >"$T/flood2.out" 2>&1 <<'PY' &
import os, socket, sys, time
port, held_file, go_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
socks = []
for i in range(200):
    s = socket.socket()
    s.bind(("127.0.0.%d" % (20 + i % 20), 0))
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    socks.append(s)
open(held_file, "w").write("200\n")
deadline = time.time() + 120
while not os.path.exists(go_file) and time.time() < deadline:
    time.sleep(0.1)
for s in socks:
    s.close()
PY
flood_pid=$!
for i in $(seq 1 600); do
  grep -qi 'control: accept: too many open files' "$T/r.log" && break
  sleep 0.1
done
grep -qi 'control: accept: too many open files' "$T/r.log" ||
  fail "the router never ran out of descriptors (limit $low, fds $(nfds "$r_PID"))"
note "EMFILE reached at $(nfds "$r_PID") fds (limit $low); a member's call while it lasts"
ok=0
for i in $(seq 1 100); do
  if "$CTL" workers "$r_ADDR" "${S[@]}" >"$T/workers" 2>/dev/null; then ok=1; break; fi
  sleep 0.1
done
[ $ok = 1 ] || fail "no member's call got through while out of descriptors"
touch "$T/flood.go"
wait "$flood_pid" || fail "the flood client failed: $(cat "$T/flood2.out")"
prlimit --pid "$r_PID" --nofile="$NOFILE:" || fail "prlimit back"
for i in $(seq 1 100); do
  "$CTL" workers "$r_ADDR" "${S[@]}" >"$T/workers" 2>/dev/null && break
  sleep 0.1
done
grep -q '^decode pool: 1 READY' "$T/workers" || fail "after EMFILE: $(cat "$T/workers")"
complete

note "HTTP/2 rapid reset: 100,000 streams at the router and at decode"
for who in r d; do
  pidv="${who}_PID"
  addrv="${who}_ADDR"
  before=$(rss_kb "${!pidv}")
  fds_before=$(nfds "${!pidv}")
  "$PYTHON3" "$(dirname "$0")/epd_rapid_reset.py" "${!addrv}" 100000 --batch 100 >"$T/rr.$who" ||
    fail "rapid reset against $who: $(cat "$T/rr.$who")"
  after=$(rss_kb "${!pidv}")
  note "$who: $(cat "$T/rr.$who"); VmRSS ${before} -> ${after} kB; fds $fds_before -> $(nfds "${!pidv}")"
  [ $((after - before)) -lt $RSS_BOUND_KB ] ||
    fail "$who grew $(((after - before) / 1024)) MB under rapid reset (bound $((RSS_BOUND_KB / 1024)) MB)"
  grep -q 'control: closed .*streams and none of its calls authenticated' "$T/$who.log" ||
    fail "$who did not log closing the reset flood"
done

note "rapid reset on a member's connection: a daemon without a secret, a call first"
# without a cluster secret any call makes a connection a member's: then
# only --control-max-resets bounds it (200 in 10 s by default)
start_daemon q decode --model "$T/m" --worker-id decode-q --kv-blocks 64 --state-slots 8
before=$(rss_kb "$q_PID")
"$PYTHON3" "$(dirname "$0")/epd_rapid_reset.py" "$q_ADDR" 100000 --call-first >"$T/rr.q" ||
  fail "rapid reset after a call: $(cat "$T/rr.q")"
after=$(rss_kb "$q_PID")
note "q: $(cat "$T/rr.q"); VmRSS ${before} -> ${after} kB"
[ $((after - before)) -lt $RSS_BOUND_KB ] ||
  fail "q grew $(((after - before) / 1024)) MB under rapid reset (bound $((RSS_BOUND_KB / 1024)) MB)"
grep -q 'control: closed .*over 200 stream resets within 10 s' "$T/q.log" ||
  fail "q did not log closing the member's reset flood"
[ "$("$CTL" probe "$q_ADDR")" = SERVING ] || fail "q after the reset flood"

complete
wait_router_state "$r_ADDR" decode-0 READY
wait_router_state "$r_ADDR" prefill-0 READY
finish_ok
