#!/usr/bin/env bash
# Overload that never answers 5xx (issue #24): every client behind one
# gateway shares one address.  300 requests at once from 127.0.0.1 at a
# router with the default connection flags and a decode pool that holds a
# few of them: every answer is 200 equal to epd-generate's or 429 with
# Retry-After, never a 5xx, a reset or a broken pipe (before: 503 "too
# many connections from your address" and broken pipes past the cap of
# 256).  The same burst against a cap of 64: the connections past it get
# a complete 429 with Retry-After once their head is read, never a reset.
# --trusted-proxies: from a trusted peer the cap counts the address
# X-Forwarded-For names (two forwarded addresses over one peer: one capped,
# the other not; the proxy's own address never capped); from an untrusted
# peer the header is ignored; a 429 whose client still sends a 2 MiB body
# arrives whole (the body is drained); a bad CIDR stops the router at
# start with the reason.
source "$(dirname "$0")/lib.sh"

G="$BIN/epd-generate"
mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"

note "bad --trusted-proxies: refused at start"
for bad in "10.0.0.1/8|did you mean 10.0.0.0/8" "300.1.1.1|not an IPv4 or IPv6 address" \
  "fd00::/129|must be 0 to 128" "10.0.0.0/8,|an empty entry"; do
  flag=${bad%%|*}
  want=${bad#*|}
  rc=0
  "$BIN/epd-router" --model "$T/m" --listen 127.0.0.1:0 --control-addr 127.0.0.1:0 \
    --trusted-proxies "$flag" >"$T/bad.log" 2>&1 || rc=$?
  [ "$rc" != 0 ] || fail "--trusted-proxies '$flag' accepted"
  grep -qF -- "$want" "$T/bad.log" && grep -qF -- "--trusted-proxies '$flag'" "$T/bad.log" ||
    fail "--trusted-proxies '$flag': no clear reason: $(cat "$T/bad.log")"
  echo "refused: $(grep -F -- --trusted-proxies "$T/bad.log" | tail -1)"
done

# the router with default connection flags (only the registry's heartbeat
# is quicker); a decode pool of 48 blocks holds a few requests at once
start_router r --model "$T/m" --heartbeat-ms 100
H=$r_HTTP
start_daemon p prefill --model "$T/m" --worker-id prefill-0 --router "$r_ADDR"
start_daemon d decode --model "$T/m" --worker-id decode-0 --kv-blocks 48 --state-slots 64 \
  --router "$r_ADDR"
wait_router_state "$r_ADDR" prefill-0 READY
wait_router_state "$r_ADDR" decode-0 READY

note "300 requests at once from one address, default flags"
out=$(router_client burst "$H" "$T/m" "$G" --count 300 --max-tokens 32 --long-every 7) ||
  fail "defaults: a request was neither 200 equal to epd-generate nor 429 with Retry-After"
echo "$out"
ok=$(sed -n 's/^ok \([0-9]*\) rejected \([0-9]*\)$/\1/p' <<<"$out")
[ "${ok:-0}" -gt 0 ] || fail "defaults: no request served"
n=$(router_metric "$H" 'epd_router_http_refused_total{limit="per_address"}')
[ "${n:-0}" = 0 ] || fail "defaults: $n connections of a 300-burst refused per address"
for k in upstream timeout no_workers internal; do
  n=$(router_metric "$H" "epd_router_errors_total{kind=\"$k\"}")
  [ "${n:-0}" = 0 ] || fail "$n requests ended as $k"
done
wait_blocks_free "$d_ADDR"

note "the same burst against --max-connections-per-addr 64: 429 after the head"
start_router c --model "$T/m" --heartbeat-ms 100 --max-connections-per-addr 64
start_daemon p2 prefill --model "$T/m" --worker-id prefill-c --router "$c_ADDR"
start_daemon d2 decode --model "$T/m" --worker-id decode-c --kv-blocks 48 --state-slots 64 \
  --router "$c_ADDR"
wait_router_state "$c_ADDR" prefill-c READY
wait_router_state "$c_ADDR" decode-c READY
out=$(router_client burst "$c_HTTP" "$T/m" "$G" --count 300 --max-tokens 32 --long-every 7) ||
  fail "cap 64: a request was neither 200 equal to epd-generate nor 429 with Retry-After"
echo "$out"
rej=$(sed -n 's/^ok \([0-9]*\) rejected \([0-9]*\)$/\2/p' <<<"$out")
n=$(router_metric "$c_HTTP" 'epd_router_http_refused_total{limit="per_address"}')
echo "refused per address: $n"
# 300 connections open before any sends: more than 64 at once whatever the
# machine's speed
[ "${n:-0}" -gt 0 ] && [ "${rej:-0}" -ge "$n" ] || fail "cap 64: $n refused per address, $rej 429s"
wait_blocks_free "$d2_ADDR"
stop_daemon c
[ "$STOP_RC" = 0 ] || fail "router c exited $STOP_RC"

note "--trusted-proxies: the cap per forwarded address"
start_router t --model "$T/m" --heartbeat-ms 100 --max-connections-per-addr 2 \
  --trusted-proxies "127.0.0.2/32, 10.9.0.0/16,fd00::/8"
grep -q "X-Forwarded-For names the client" "$T/t.log" || fail "no log line for --trusted-proxies"
start_daemon p3 prefill --model "$T/m" --worker-id prefill-t --router "$t_ADDR"
start_daemon d3 decode --model "$T/m" --worker-id decode-t --kv-blocks 256 --router "$t_ADDR"
wait_router_state "$t_ADDR" prefill-t READY
wait_router_state "$t_ADDR" decode-t READY
"$PYTHON3" - "$t_HTTP" "$T/m" "$G" <<'PY' || fail "trusted proxies"
import json, socket, subprocess, sys, threading, time, urllib.parse
url, model, gen = sys.argv[1:4]
u = urllib.parse.urlparse(url)
PROMPT = "forwarded for"
want = subprocess.run([gen, "--model", model, "--prompt", PROMPT, "--max-tokens", "8",
                       "--temperature", "0"], stdout=subprocess.PIPE, check=True).stdout[:-1]
BODY = json.dumps({"model": "m", "prompt": PROMPT, "max_tokens": 8, "temperature": 0}).encode()

def connect(src):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((src, 0))
    s.settimeout(60)
    s.connect((u.hostname, u.port))
    return s

def head(xff, length):
    h = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if xff is not None:
        h += "X-Forwarded-For: %s\r\n" % xff
    return (h + "Content-Length: %d\r\n\r\n" % length).encode()

def response(s):
    """(status, headers dict lower-case, body) of one response read whole"""
    data = b""
    while b"\r\n\r\n" not in data:
        got = s.recv(65536)
        assert got, ("closed before a response", data)
        data += got
    h, rest = data.split(b"\r\n\r\n", 1)
    lines = h.decode().split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {l.split(":", 1)[0].lower(): l.split(":", 1)[1].strip() for l in lines[1:]}
    n = int(hdrs["content-length"])
    while len(rest) < n:
        got = s.recv(65536)
        assert got, ("closed inside the body", status, rest)
        rest += got
    return status, hdrs, rest[:n]

def ask(src, xff):
    s = connect(src)
    s.sendall(head(xff, len(BODY)) + BODY)
    r = response(s)
    s.close()
    return r

def served(src, xff, what):
    st, h, b = ask(src, xff)
    assert st == 200, (what, st, b)
    text = json.loads(b)["choices"][0]["text"].encode()
    assert text == want, (what, text, want)
    print("200 (equals epd-generate): %s" % what)

def capped(src, xff, what):
    st, h, b = ask(src, xff)
    assert st == 429, (what, st, b)
    assert int(h.get("retry-after", "0")) >= 1, (what, h)
    assert h.get("connection", "").lower() == "close", (what, h)
    err = json.loads(b)["error"]
    assert err["code"] == "rate_limit_exceeded" and "your address" in err["message"], (what, err)
    print("429 with Retry-After: %s" % what)

def hold(src, xff):
    """a connection whose head is in and whose body is not: it holds its
    address's count (the head is complete) until closed"""
    s = connect(src)
    s.sendall(head(xff, len(BODY)))
    return s

def capped_poll(holders, src, xff, what):
    """holds a connection for each (src, xff) of holders, then asks from
    src with xff until the answer is 429: the router counts a head once it
    has read it, so the first tries may see the held ones still in flight
    (and are served); returns the held connections"""
    held = [hold(a, x) for a, x in holders]
    deadline = time.time() + 60
    while True:
        st, h, b = ask(src, xff)
        if st == 429:
            break
        assert st == 200 and time.time() < deadline, (what, st, b)
    capped(src, xff, what)
    return held

# two requests of 198.51.100.1 held through the trusted proxy 127.0.0.2
# (a held connection holds its count until its body comes, 30 s at most:
# the checks that need them are made at once)
held = capped_poll([("127.0.0.2", "198.51.100.1"), ("127.0.0.2", "10.9.9.9, 198.51.100.1")],
                   "127.0.0.2", "198.51.100.1", "a third of 198.51.100.1 via the trusted proxy")
capped("127.0.0.2", "203.0.113.5, 198.51.100.1, 10.9.0.7",
       "198.51.100.1 behind two trusted hops (recursive; the client's own entry ignored)")
served("127.0.0.2", "198.51.100.2", "198.51.100.2 over the same proxy, not capped")
served("127.0.0.2", None, "the proxy itself (no X-Forwarded-For), not capped")
for x in held:
    x.close()

# from an untrusted peer the header is ignored: 127.0.0.1 is counted
held = capped_poll([("127.0.0.1", "198.51.100.7"), ("127.0.0.1", "198.51.100.8")],
                   "127.0.0.1", "198.51.100.9",
                   "untrusted 127.0.0.1 at its cap, whatever it forwards")
served("127.0.0.2", "198.51.100.7", "198.51.100.7 via the proxy: the untrusted claim charged "
       "nothing")

# a 429 whose client is still sending a 2 MiB body: the answer arrives
# whole and the body is drained, never a reset or a broken pipe
s = connect("127.0.0.1")
big = b"x" * (2 << 20)
sent = []
def send_all():
    try:
        s.sendall(head(None, len(big)) + big)
        sent.append("ok")
    except OSError as e:
        sent.append(repr(e))
t = threading.Thread(target=send_all)
t.start()
st, h, b = response(s)
t.join()
assert sent == ["ok"], sent
assert st == 429 and int(h["retry-after"]) >= 1, (st, h, b)
s.shutdown(socket.SHUT_WR)
s.settimeout(30)
rest = s.recv(65536)
assert rest == b"", rest  # the router's clean end of the stream
s.close()
print("429 whole while the client sent 2 MiB; its body drained, no reset")

# the held ones go: the counts are given back, both served again
for x in held:
    x.close()
for src, xff in (("127.0.0.1", None), ("127.0.0.2", "198.51.100.1")):
    deadline = time.time() + 60
    while True:
        st, h, b = ask(src, xff)
        if st == 200:
            break
        assert st == 429 and time.time() < deadline, (st, b)
        time.sleep(0.05)
    served(src, xff, "%s (%s) again once its connections closed" % (src, xff))
PY
n=$(router_metric "$t_HTTP" 'epd_router_http_refused_total{limit="per_address"}')
echo "refused per address: $n"
[ "${n:-0}" -ge 4 ] || fail "per-address refusals counted: $n"
finish_ok
