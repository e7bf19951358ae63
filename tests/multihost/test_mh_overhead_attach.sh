#!/usr/bin/env bash
# epd-bench overhead --attach-* across hosts (tests/multihost/lib.sh): a
# prefill (host p) and a decode (host d) started here as an operator
# would (sim dense-70b, ucx over tcp, --trace), the link between them
# limited to 2 Gbit/s by tc tbf on p's eth0 (everything p sends: the KV
# crosses it), and the benchmark on a third host b, reaching both only over
# the bridge.  It checks, from the rows the benchmark prints (--tsv):
#   - a row per length, the TSV parses, every pair of arms answered;
#   - the clock offsets' bounds hold the truth: the three hosts are
#     namespaces of one machine and share one CLOCK_MONOTONIC, so each
#     daemon's true offset is 0 and must lie within its printed ±;
#   - B − A is never below the floor by more than the clocks' uncertainty
#     plus the statistical tolerance the row itself measured: the floor
#     must not exceed diff_hi_ms (the upper end of the 95% interval of the
#     paired median of B − A, computed from the measured pairs) +
#     clock_unc_us;
#     The prefill runs chunked (1000 tokens: 1024 and 4096 are 2 and 5
#     chunks, 128 one): the floor must take each chunk's KV from when that
#     chunk made it, at the speed the link moved it (it took the last
#     chunk's moments and a whole-request bandwidth before, and overshot
#     B − A by up to 60% at 32k tokens);
#   - `bound` says link where the rate limit is below the KV production
#     rate (the KV's bytes over A's compute time, both measured);
#   - the times travel on the request plane only: with another secret the
#     benchmark gets nothing (its endpoints are refused), and a daemon
#     without --trace is named as such.
# No time is judged: every comparison is between measured quantities.
# The table itself is printed first, for a human (and docs/benchmarks),
# with its --trace of one B request (both daemons, this host's clock).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

RATE_BITS=2000000000 # 2gbit
note "hosts p (prefill), d (decode), b (the benchmark); p's eth0 at 2 Gbit/s"
mh_switch
mh_host b 10
mh_host p 31
mh_host d 41
mh_secret
profiles="$(cd "$MH_DIR/../../engine/profiles" && pwd)"
mkdir -p "$T/sim"
printf '%s\n' "model = $profiles/dense-70b.profile" "accel = $profiles/h200.profile" \
  "devices = 4" "scale = 0.05" "mode = sleep" "seed = 1" "vocab = 4096" >"$T/sim/sim.conf"
W=(--engine sim --model "$T/sim" --transport ucx --expect-transport tcp --log-level warn)
mh_start dec d decode "${W[@]}" --worker-id decode-1 --trace "$T/d.json" --kv-blocks 1200
# the prefix cache off as the one-host mode runs it (the benchmark salts
# every request anyway: see docs/benchmarks/overhead.md)
mh_start pre p prefill "${W[@]}" --worker-id prefill-1 --trace "$T/p.json" --kv-blocks 1200 \
  --no-prefix-cache --prefill-chunk-tokens 1000
mh_in p tc qdisc add dev eth0 root tbf rate 2gbit burst 64kb latency 1s

OV=("$BIN/epd-bench" overhead --attach-prefill "$pre_ADDR" --attach-decode "$dec_ADDR"
    --cluster-secret-file "$T/cluster-secret" --lengths 128,1024,4096 --reps 6 --warmup 1)
note "the table (host b)"
mh_in b "${OV[@]}" --trace "$T/merged.json" >"$T/table.out" 2>"$T/table.err" ||
  { cat "$T/table.err"; fail "overhead --attach"; }
cat "$T/table.out"
"$PYTHON3" - "$T/merged.json" <<'PY' || fail "the merged trace (--trace) of one B request"
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
names = {(e["pid"], e["name"]) for e in ev}
for want in [(1, "KV write"), (1, "LayerDone sent"), (1, "PrefillComplete sent"), (2, "KV held")]:
    assert want in names, (want, sorted(names))
assert len({e["args"]["req"] for e in ev if e["ph"] != "M"}) == 1, "one request"
PY
note "the same, --tsv"
mh_in b "${OV[@]}" --tsv >"$T/ovh.tsv" 2>"$T/ovh.err" || { cat "$T/ovh.err"; fail "overhead --attach --tsv"; }
ol=$(mh_in p tc -s qdisc show dev eth0 | sed -n 's/.*overlimits \([0-9]*\).*/\1/p' | head -n 1)
[ "${ol:-0}" -ge 1 ] || fail "the tbf qdisc never held a packet back (overlimits ${ol:-0})"
note "tbf on p held packets back $ol times"

"$PYTHON3" - "$T/ovh.tsv" "$RATE_BITS" <<'PY' || fail "the cross-host rows (above)"
import math, sys
lines = [l.rstrip("\n") for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")]
rate = int(sys.argv[2]) / 8.0  # bytes/s
head = lines[0].split("\t")
rows = [dict(zip(head, l.split("\t"))) for l in lines[1:]]
for c in ("p_off_us", "p_unc_us", "d_off_us", "d_unc_us", "clock_unc_us", "kv_mb", "engine",
          "tokens", "pairs", "diff_ms", "diff_hi_ms", "floor_ms", "bound", "a_compute_ms"):
    assert c in head, (c, head)
assert [r["tokens"] for r in rows] == ["128", "1024", "4096"], rows
bad = []
for r in rows:
    assert len(r) == len(head), r
    f = {k: float(v) for k, v in r.items() if k not in ("engine", "xport", "bound", "kv_dtype")}
    t = r["tokens"]
    print(f"{t:>5} tokens: B-A {f['diff_ms']:.3f} ms [.., {f['diff_hi_ms']:.3f}], floor "
          f"{f['floor_ms']:.3f} ms, clocks ±{f['clock_unc_us']:.1f} us (p {f['p_off_us']:+.1f} "
          f"±{f['p_unc_us']:.1f}, d {f['d_off_us']:+.1f} ±{f['d_unc_us']:.1f}), KV "
          f"{f['kv_mb']:.2f} MB in A's compute {f['a_compute_ms']:.3f} ms -> "
          f"{f['kv_mb'] * 1e6 / (f['a_compute_ms'] / 1e3) / 1e9:.2f} GB/s vs the link "
          f"{rate / 1e9:.2f} GB/s: bound {r['bound']}")
    if f["pairs"] < 6:
        bad.append(f"{t}: {f['pairs']:.0f} pairs, not 6 (requests without times)")
    # one clock for all three hosts: the truth (0) inside each bound (the
    # offsets are printed to 0.1 us: half of that as rounding)
    for w in ("p", "d"):
        if abs(f[f"{w}_off_us"]) > f[f"{w}_unc_us"] + 0.05:
            bad.append(f"{t}: {w}'s offset {f[w + '_off_us']} us outside its ±{f[w + '_unc_us']}")
    if not math.isfinite(f["floor_ms"]) or not math.isfinite(f["diff_hi_ms"]):
        bad.append(f"{t}: no floor or no interval")
    elif f["floor_ms"] > f["diff_hi_ms"] + f["clock_unc_us"] / 1e3:
        bad.append(f"{t}: the floor {f['floor_ms']} ms above B-A's 95% interval "
                   f"(.. {f['diff_hi_ms']} ms) + the clocks' ±{f['clock_unc_us']} us")
    production = f["kv_mb"] * 1e6 / (f["a_compute_ms"] / 1e3)
    if rate < production and r["bound"] != "link":
        bad.append(f"{t}: the link ({rate:.3g} B/s) is below KV production ({production:.3g} "
                   f"B/s) but bound says {r['bound']}")
assert not bad, bad
PY

note "another secret: no endpoint, no clock, no trace"
(umask 077 && head -c 32 /dev/urandom >"$T/other-secret")
if mh_in b "$BIN/epd-bench" overhead --attach-prefill "$pre_ADDR" --attach-decode "$dec_ADDR" \
  --cluster-secret-file "$T/other-secret" --lengths 128 --reps 1 >"$T/other.out" 2>"$T/other.err"; then
  fail "the benchmark ran with another cluster secret"
fi
grep -q "connecting to the daemons failed" "$T/other.err" || { cat "$T/other.err"; fail "not refused at connect"; }
grep -q "^sim " "$T/other.out" && fail "rows printed with another secret"

note "a prefill without --trace is named"
mh_start pre2 p prefill "${W[@]}" --worker-id prefill-2 --kv-blocks 400 --no-prefix-cache
if mh_in b "$BIN/epd-bench" overhead --attach-prefill "$pre2_ADDR" --attach-decode "$dec_ADDR" \
  --cluster-secret-file "$T/cluster-secret" --lengths 128 --reps 1 >"$T/nt.out" 2>"$T/nt.err"; then
  fail "the benchmark ran against a prefill without --trace"
fi
grep -q "prefill at $pre2_ADDR runs without --trace" "$T/nt.err" || { cat "$T/nt.err"; fail "not named"; }
mh_finish
