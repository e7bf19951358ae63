#!/usr/bin/env bash
# epd-bench overhead --attach-* against a prefill and a decode started here
# (loopback, no root: tests/multihost/test_mh_overhead_attach.sh runs it
# across hosts): the rows print and their --tsv parses; every pair of arms
# has its times (fetched from the recorders over the request plane, many
# fetches per daemon); both daemons share this host's clock, so each
# printed offset's bound must hold the true offset, 0; a recorder that
# fills up is named, and the rows keep what it holds.  No time is judged.
source "$(dirname "$0")/../integration/lib.sh"
BENCH="$BIN/epd-bench"
export UCX_TLS=tcp

profiles="$(cd "$(dirname "$0")/../../engine/profiles" && pwd)"
mkdir -p "$T/sim"
printf '%s\n' "model = $profiles/dense-70b.profile" "accel = $profiles/h200.profile" \
  "devices = 4" "scale = 0.05" "mode = sleep" "seed = 1" "vocab = 4096" >"$T/sim/sim.conf"
(umask 077 && head -c 32 /dev/urandom >"$T/secret")
W=(--engine sim --model "$T/sim" --transport ucx --cluster-secret-file "$T/secret"
   --kv-blocks 400 --log-level warn)
start_daemon dec decode "${W[@]}" --worker-id decode-1 --trace "$T/d.json"
start_daemon pre prefill "${W[@]}" --worker-id prefill-1 --trace "$T/p.json" --no-prefix-cache

note "overhead --attach, 128 and 1024 tokens, --tsv, --trace"
"$BENCH" overhead --attach-prefill "$pre_ADDR" --attach-decode "$dec_ADDR" \
  --cluster-secret-file "$T/secret" --lengths 128,1024 --reps 6 --tsv \
  --trace "$T/merged.json" --trace-length 1024 \
  >"$T/ovh.tsv" 2>"$T/ovh.err" || { cat "$T/ovh.err"; fail "overhead --attach"; }
grep -v '^#' "$T/ovh.tsv"
# --trace FILE (an option both modes take): one B request of 1,024 tokens,
# both daemons' events on this host's clock
grep -q "^# trace of request [0-9]* (1024 tokens, prefill + transfer) -> $T/merged.json" \
  "$T/ovh.tsv" || { cat "$T/ovh.tsv"; fail "no trace line"; }
"$PYTHON3" - "$T/merged.json" <<'PY' || fail "the merged trace (above)"
import json, sys
evs = json.load(open(sys.argv[1]))["traceEvents"]
pids = {e["pid"] for e in evs if e.get("ph") != "M"}
assert pids == {1, 2}, ("events of prefill (1) and decode (2)", pids)
reqs = {e["args"]["req"] for e in evs if e.get("ph") != "M"}
assert len(reqs) == 1, ("one request", reqs)
print("merged trace: %d events of request %d from both daemons" % (len(evs), reqs.pop()))
PY
"$PYTHON3" - "$T/ovh.tsv" <<'PY' || fail "the attach rows (above)"
import sys
lines = [l.rstrip("\n") for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")]
head = lines[0].split("\t")
assert head[:6] == ["p_off_us", "p_unc_us", "d_off_us", "d_unc_us", "clock_unc_us", "kv_mb"], head
assert {"engine", "xport", "tokens", "ovh_pct", "floor_ms", "bound"} <= set(head), head
rows = [dict(zip(head, l.split("\t"))) for l in lines[1:]]
assert [r["tokens"] for r in rows] == ["128", "1024"], rows
for r in rows:
    assert len(r) == len(head), r
    assert r["pairs"] == "6", ("every pair has its times", r)
    assert r["xport"] == "ucx", r
    for w in ("p", "d"):
        off, unc = float(r[w + "_off_us"]), float(r[w + "_unc_us"])
        assert unc > 0 and abs(off) <= unc + 0.05, (w, "one clock: 0 within the bound", off, unc)
    assert abs(float(r["clock_unc_us"]) - float(r["p_unc_us"]) - float(r["d_unc_us"])) < 0.15, r
PY

note "a decode whose recorder holds 1,024 events: named, the rows keep what it holds"
start_daemon dec2 decode "${W[@]}" --worker-id decode-2 --trace "$T/d2.json" --trace-events 1024
"$BENCH" overhead --attach-prefill "$pre_ADDR" --attach-decode "$dec2_ADDR" \
  --cluster-secret-file "$T/secret" --lengths 128 --reps 6 --tsv \
  >"$T/full.tsv" 2>"$T/full.err" || { cat "$T/full.err"; fail "overhead --attach, a full recorder"; }
grep -q "decode's trace recorder is full" "$T/full.err" || { cat "$T/full.err"; fail "not named"; }
pairs=$(awk -F'\t' '/^#/ { next } !n++ { for (i = 1; i <= NF; i++) h[i] = $i; next }
                    { for (i = 1; i <= NF; i++) if (h[i] == "pairs") print $i }' "$T/full.tsv")
[ -n "$pairs" ] && [ "$pairs" -lt 6 ] || fail "a full recorder and still $pairs pairs"
echo "a full recorder: $pairs of 6 pairs, and: $(grep -m1 'recorder is full' "$T/full.err")"
finish_ok
