#!/usr/bin/env python3
"""tests/engine/kvq_ref.py — an independent numpy reference of epd's KV
codecs (engine/epd_kvq.c), run by test_epd_engine_kvq on the file it writes.

The reference does not share the C's method: FP8 E4M3 rounds by searching
the 254 finite code values for the nearest (ties to the even code), BF16
picks the nearer of the two neighbours in float64 (ties to even), int8 is
numpy's rint in float32.  Exit 0 when every code and dequantized value
matches bit for bit, 1 with the first differences printed otherwise.

File (little-endian): u32 n; f32 x[n]; u8 fp8[n]; u16 bf16[n]; f32 inv;
i8 int8[n]; f32 fp8_decoded[256]; then u32 rows, u32 hd, u32 dtype (3 fp8, 4 int8), f32 in[rows][hd],
u8 codes[rows][hd], f32 scales[rows], f32 out[rows][hd]; then again for the
other dtype.
"""
import sys

import numpy as np


def fp8_table():
    vals = []
    for c in range(0x7F):  # 0x7F is NaN
        e, m = c >> 3, c & 7
        vals.append(m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(vals)


FP8 = fp8_table()


def fp8_encode(x):
    x = x.astype(np.float64)
    a = np.abs(x)
    sign = np.where(np.signbit(x), 0x80, 0).astype(np.uint8)
    fin = np.where(np.isfinite(a), a, 0.0)
    hi = np.clip(np.searchsorted(FP8, fin), 1, len(FP8) - 1)
    lo = hi - 1
    dlo = fin - FP8[lo]
    dhi = FP8[hi] - fin
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    pick = np.where(fin >= FP8[-1], len(FP8) - 1, pick)  # saturate to 448
    code = pick.astype(np.uint8)
    code = np.where(np.isinf(a), 0x7E, code)
    code = np.where(np.isnan(a), 0x7F, code)
    return (code | sign).astype(np.uint8)


def fp8_decode(c):
    c = c.astype(np.int64)
    mag = FP8[np.minimum(c & 0x7F, 0x7E)]
    v = np.where(c & 0x80, -mag, mag)
    v = np.where((c & 0x7F) == 0x7F, np.nan, v)
    return v.astype(np.float32)


def bf16_encode(x):
    u = x.view(np.uint32).astype(np.uint64)
    down = (u >> 16) << 16
    up = down + 0x10000
    f = x.astype(np.float64)
    vd = (down.astype(np.uint32)).view(np.float32).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        vu = (up.astype(np.uint32)).view(np.float32).astype(np.float64)
        dd = np.abs(f - vd)
        du = np.abs(vu - f)
    even = ((down >> 16) & 1) == 0
    pick = np.where(dd < du, down, np.where(du < dd, up, np.where(even, down, up)))
    # a value whose upper neighbour overflows to Inf: compare against 2^128
    big = ~np.isfinite(vu) & np.isfinite(f)
    lim = 2.0 ** 128
    dub = lim - np.abs(f)
    pick = np.where(big, np.where(dd < dub, down, np.where(dub < dd, up, np.where(even, down, up))), pick)
    pick = np.where(np.isinf(f), u, pick)
    code = (pick >> 16).astype(np.uint16)
    nan = np.isnan(f)
    code = np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), code)
    return code.astype(np.uint16)


def int8_encode(x, inv):
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.rint(x * np.float32(inv))
    q = np.clip(np.nan_to_num(q, nan=0.0, posinf=127, neginf=-127), -127, 127).astype(np.int8)
    return np.where(np.isnan(x), np.int8(-128), q).astype(np.int8)


def rows_check(rows, hd, dtype, xin, codes, scales, out):
    bad = 0
    for r in range(rows):
        x = xin[r]
        a = np.abs(x[np.isfinite(x)])
        amax = np.float32(a.max()) if a.size else np.float32(0)
        qmax = np.float32(127.0 if dtype == 4 else 448.0)
        s = np.float32(amax / qmax) if amax > 0 else np.float32(1.0)
        if not (np.isfinite(s) and s >= np.finfo(np.float32).tiny):
            s = np.float32(1.0)
        if scales[r].view(np.uint32) != s.view(np.uint32):
            print(f"dtype {dtype} row {r}: scale {scales[r]!r} want {s!r}")
            bad += 1
            continue
        if dtype == 4:
            want = int8_encode(x, np.float32(1.0) / s).view(np.uint8)
            deq = np.where(want.view(np.int8) == -128, np.float32(np.nan),
                           want.view(np.int8).astype(np.float32) * s)
        else:
            with np.errstate(invalid="ignore", over="ignore"):
                want = fp8_encode((x / s).astype(np.float32))
            deq = (fp8_decode(want) * s).astype(np.float32)
        if not np.array_equal(want, codes[r]):
            i = int(np.nonzero(want != codes[r])[0][0])
            print(f"dtype {dtype} row {r} elem {i}: x {x[i]!r} code {codes[r][i]:#x} want {want[i]:#x}")
            bad += 1
        same = (deq.view(np.uint32) == out[r].view(np.uint32)) | (np.isnan(deq) & np.isnan(out[r]))
        if not same.all():
            i = int(np.nonzero(~same)[0][0])
            print(f"dtype {dtype} row {r} elem {i}: dequantized {out[r][i]!r} want {deq[i]!r}")
            bad += 1
    return bad


def main():
    buf = open(sys.argv[1], "rb").read()
    off = 0

    def take(dt, n):
        nonlocal off
        a = np.frombuffer(buf, dtype=dt, count=n, offset=off)
        off += a.nbytes
        return a

    n = int(take("<u4", 1)[0])
    x = take("<f4", n)
    fp8 = take("u1", n)
    bf = take("<u2", n)
    inv = take("<f4", 1)[0]
    i8 = take("i1", n)
    dec = take("<f4", 256)
    bad = 0
    want_dec = fp8_decode(np.arange(256, dtype=np.uint8))
    same = (want_dec.view(np.uint32) == dec.view(np.uint32)) | (np.isnan(want_dec) & np.isnan(dec))
    if not same.all():
        i = int(np.nonzero(~same)[0][0])
        print(f"fp8 decode of code {i:#x}: {dec[i]!r} want {want_dec[i]!r}")
        bad += 1
    for name, want, got in (("fp8", fp8_encode(x), fp8), ("bf16", bf16_encode(x), bf),
                            ("int8", int8_encode(x, inv).view(np.int8), i8)):
        diff = np.nonzero(want != got)[0]
        if diff.size:
            i = int(diff[0])
            print(f"{name}: {diff.size} of {n} differ; first x={x[i]!r} ({x[i:i+1].view(np.uint32)[0]:#010x}) "
                  f"code {got[i]} want {want[i]}")
            bad += 1
    while off < len(buf):
        rows, hd, dtype = (int(v) for v in take("<u4", 3))
        xin = take("<f4", rows * hd).reshape(rows, hd)
        c = take("u1", rows * hd).reshape(rows, hd)
        sc = take("<f4", rows)
        out = take("<f4", rows * hd).reshape(rows, hd)
        bad += rows_check(rows, hd, dtype, xin, c, sc, out)
    print(f"kvq_ref: {n} values, {'ok' if bad == 0 else str(bad) + ' mismatches'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
