"""Quantizers (docs/codecs.md, "Quantizers (value stages)") against plain NumPy references.

Every quantizer is checked through the public API (``get_codec``, ``encode`` with
``key=``/``step=``, ``decode``, ``decode_add``, ``ErrorFeedback``, ``inspect``) against
``tests/reference/quant.py``: the decoded array must equal the reference bit for bit, the frame's
sections (codes, per-bucket scalars, per-block ints) must equal the reference's, and the
frame length must be the documented ``H + payload``.  Stages not registered yet are
skipped, not passed.
"""

from __future__ import annotations

import re

import numpy as np

from codec.frame import header_length
import pytest

import codec
from codec.testing import assert_identical as assert_same, diff_msg
from codec.dtypes import bfloat16
from codec.frame import SectionKind, parse_frame

from reference import quant as ref
from reference import sparse as sparse_ref

F16, BF16, F32, F64 = np.dtype(np.float16), np.dtype(bfloat16), np.dtype(np.float32), np.dtype(np.float64)
DTYPES = [F32, F64, F16, BF16]
DT_IDS = ["f32", "f64", "f16", "bf16"]
SIZES = [0, 1, 7, 511, 513, 1025, 4097]
BIG = 200_003  # crosses the kernels' 65,536-element chunks and the random stream's 2**16 period
KINDS = ["normal", "heavy"]


# ====================================================================== helpers
def make(kind: str, n: int, dtype, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng([seed, KINDS.index(kind) if kind in KINDS else 99, n])
    if kind == "normal":
        v = rng.standard_normal(n)
    elif kind == "heavy":
        v = rng.standard_t(2, n) * 1e-3
    else:
        raise ValueError(kind)
    return v.astype(dtype)


def encode(c, x, key=None, step=0) -> bytes:
    if key is None and step == 0:
        return c.encode(x)
    return c.encode(x, key=key, step=step)


def section_bytes(frame: bytes, s) -> bytes:
    raw = bytes(frame[s.offset : s.offset + s.stored_len])
    if s.encoding:
        import zstandard

        raw = zstandard.ZstdDecompressor().decompress(raw, max_output_size=s.raw_len)
    return raw


def sections(frame: bytes) -> dict:
    """{SectionKind: (SectionInfo, raw bytes)} of the LAST section of each kind: the value stage
    writes after the select stage (randomk's ints section comes before rangefloat's)."""
    out = {}
    for s in parse_frame(frame).sections:
        out[s.kind] = (s, section_bytes(frame, s))
    return out


def frame_positions(frame: bytes):
    """Kept positions read from the index section (None when there is none)."""
    n = parse_frame(frame).n
    secs = sections(frame)
    if SectionKind.INDEX_BITMAP in secs:
        s, raw = secs[SectionKind.INDEX_BITMAP]
        return np.flatnonzero(np.unpackbits(np.frombuffer(raw, np.uint8), bitorder="little")[:n]).astype(np.int64)
    if SectionKind.INDEX_DELTA in secs:
        s, raw = secs[SectionKind.INDEX_DELTA]
        return np.cumsum(ref.unpack_bits(raw, s.bits, s.count) + 1) - 1
    return None


def _floats(raw: bytes, bits: int) -> np.ndarray:
    return np.frombuffer(raw, "<f4" if bits == 32 else "<f8").astype(np.float64)


def _ints(raw: bytes, bits: int) -> np.ndarray:
    return np.frombuffer(raw, {8: "<i1", 16: "<i2", 32: "<i4", 64: "<i8"}[bits]).astype(np.int64)


#: the value stage's own sections (besides the values), by stage name
EXTRA = {
    "rangefloat": {SectionKind.INTS},
    "fp8": set(),
    "qsgd": {SectionKind.SCALARS},
    "terngrad": {SectionKind.SCALARS},
    "sign": set(),
    "efsign": {SectionKind.SCALARS},
    "onebit": {SectionKind.SCALARS},
    "minmax": {SectionKind.SCALARS},
}


def value_kinds(vspec: str) -> set:
    name, p = ref.parse_spec(vspec)
    kinds = {SectionKind.VALUES} | EXTRA[name]
    if name == "fp8" and p.get("scale"):
        kinds.add(SectionKind.INTS)
    if name == "sign" and p.get("scale") == "l1":
        kinds.add(SectionKind.SCALARS)
    return kinds


def check_value_sections(vspec: str, frame: bytes, r: ref.Coded, what: str) -> list[str]:
    """The value stage's sections against the reference; returns the problems found."""
    errs = []
    secs = sections(frame)
    name, _ = ref.parse_spec(vspec)
    if SectionKind.VALUES not in secs:
        return [f"{what}: no values section"]
    s, raw = secs[SectionKind.VALUES]
    if r.values_bits is not None and s.bits != r.values_bits:
        errs.append(f"{what}: values section has {s.bits}-bit items, want {r.values_bits}")
    if r.values_count is not None and s.count != r.values_count:
        errs.append(f"{what}: values section has {s.count} items, want {r.values_count}")
    if raw != r.values:
        a, b = np.frombuffer(raw, np.uint8), np.frombuffer(r.values, np.uint8)
        m = min(a.size, b.size)
        first = int(np.flatnonzero(a[:m] != b[:m])[0]) if np.any(a[:m] != b[:m]) else m
        errs.append(f"{what}: values section bytes differ ({a.size} vs {b.size} bytes; first at byte {first})")
    if r.scalars is not None and r.scalars.size:
        if SectionKind.SCALARS not in secs:
            errs.append(f"{what}: no scalars section")
        else:
            s, raw = secs[SectionKind.SCALARS]
            if s.bits != r.scalars_bits:
                errs.append(f"{what}: scalars are {s.bits}-bit, want {r.scalars_bits}")
            else:
                got = _floats(raw, s.bits)
                want = r.scalars
                ok = got.size == want.size and np.array_equal(got, want)
                if not ok and name == "minmax" and got.size == want.size:  # (lo, hi) interleaved
                    nb = want.size // 2
                    ok = np.array_equal(got, np.stack([want[:nb], want[nb:]], axis=1).reshape(-1))
                if not ok:
                    errs.append(f"{what}: scalars {got[:4].tolist()}... != reference {want[:4].tolist()}...")
    if r.ints is not None and r.ints.size:
        if SectionKind.INTS not in secs:
            errs.append(f"{what}: no ints section")
        else:
            s, raw = secs[SectionKind.INTS]
            if s.bits != 16:
                errs.append(f"{what}: ints section is {s.bits}-bit, want int16")
            elif not np.array_equal(_ints(raw, 16), r.ints):
                errs.append(f"{what}: ints {_ints(raw, 16)[:4].tolist()} != reference {r.ints[:4].tolist()}")
    return errs


def check_dense(spec: str, x: np.ndarray, key=None, step=0, frame=None) -> list[str]:
    """A dense quantizer frame of ``x`` against the reference; returns the problems found."""
    c = codec.get_codec(spec)
    what = f"{spec} on {x.dtype}[{x.size}] key={key!r} step={step}"
    if frame is None:
        frame = encode(c, x, key, step)
    r = ref.code(spec, x, key=key, step=step)
    errs = []
    try:
        m = diff_msg(codec.decode(frame), r.decoded.reshape(x.shape), what)
    except Exception as e:  # noqa: BLE001 - a frame the encoder wrote must decode: report, go on
        m = f"{what}: decode raised {type(e).__name__}: {e}"
    if m:
        errs.append(m)
    info = codec.inspect(frame)
    H = info["header_bytes"]
    kinds = {getattr(SectionKind, s["kind"].upper()) for s in info["sections"]}
    want_kinds = value_kinds(spec)
    if kinds != want_kinds:
        errs.append(f"{what}: sections {sorted(k.name for k in kinds)}, want {sorted(k.name for k in want_kinds)}")
    want_h = header_length(x.ndim, len(c.spec), len(info["sections"]))  # 12 + 8*ndim + L + 28*S + 4 + 4
    if H != want_h:
        errs.append(f"{what}: header {H} bytes, formula {want_h}")
    if len(frame) != H + r.payload:
        errs.append(f"{what}: frame is {len(frame)} bytes, H + payload = {H} + {r.payload}")
    errs += check_value_sections(spec, frame, r, what)
    return errs


def report(errs: list[str]) -> None:
    assert not errs, f"{len(errs)} problem(s):\n" + "\n".join(errs[:12])


# ====================================================================== the references themselves
def test_ref_random_stream_is_the_literal_text():
    for seed, key, step in ((0, None, 0), (7, "layer.3", 12), ((1 << 63) - 1, 42, (1 << 62) + 5)):
        strm = ref.stream(seed, key, step)
        assert strm == ref.mix_int(ref.mix_int(ref.mix_int(seed) ^ ref.key_hash(key)) ^ step)
        vec = ref.random_bits(70_000, strm)
        for lo, hi in ((0, 300), (65_530, 65_545), (69_990, 70_000)):
            lit = ref.random_bits_scalar(hi, strm)[lo:] if hi <= 300 else None
            if lit is None:  # the literal text for i in [lo, hi)
                lit = []
                for i in range(lo, hi):
                    cc = ref.mix_int((strm + (i >> 16)) & ref.MASK64)
                    lit.append(ref.h32_int((cc % 2**32 + i % 2**16) % 2**32))
            assert vec[lo:hi].tolist() == lit
    assert ref.mix_int(0) == 0 and ref.mix_int(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF
    u = ref.uniforms(100_000, 0)
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    assert ref.key_hash(None) == sparse_ref.key_hash(None) and ref.key_hash("w") == sparse_ref.key_hash("w")


def test_ref_pack_and_directed_rounding():
    rng = np.random.default_rng(0)
    for bits in (1, 2, 3, 5, 8, 11, 16):
        codes = rng.integers(0, 1 << bits, 37)
        raw = ref.pack_bits(codes, bits)
        assert len(raw) == (37 * bits + 7) // 8
        assert ref.unpack_bits(raw, bits, 37).tolist() == codes.tolist()
    assert ref.pack_bits([1, 0, 1, 1], 1) == bytes([0b1101])
    v = np.concatenate([rng.standard_normal(1000), [0.0, 1e-46, -1e-46, 3.5e38, -3.5e38, 1e300, -1e300]])
    for dt in (F32, F16, BF16):
        up, dn = ref.round_dir(v, dt, True).astype(np.float64), ref.round_dir(v, dt, False).astype(np.float64)
        assert np.all(up >= v) and np.all(dn <= v)
        near = ref.round_to(v, dt).astype(np.float64)
        assert np.all((near == up) | (near == dn) | np.isinf(near))
    assert ref.round_dir(np.array([1e300]), F32, False)[0] == np.finfo(np.float32).max


def test_ref_rangefloat_by_hand_and_guarantee():
    # e4m3 at 8 bits: M = 3 -> T = 1, Emin = 1 - 16 + 2 = -13; 3.0 = (8 + 4) * 2**(-13 + 15 - 1 - 3)
    r = ref.rangefloat(np.array([1.0, 0.5, -3.0], np.float32), 8)
    assert r.ints.tolist() == [1] and r.wide.tolist() == [1.0, 0.5, -3.0]
    # 1.0: e' = 0, q = 8, code (0 + 13) * 8 + 8 = 112; 0.5: 12 * 8 + 8 = 104; -3.0: e' = 1, q = 12: 14 * 8 + 12 = 124, sign bit 7
    assert ref.unpack_bits(r.values, 8, 3).tolist() == [112, 104, 128 | 124]
    # M above the window's largest value (2 - 2**-3) * 2**1 = 3.75: T becomes 2
    assert ref.rangefloat(np.array([3.9], np.float32), 8).ints.tolist() == [2]
    # the document's guarantee, nearest rounding: |dec - v| <= 2**-(m+1) |v| inside the window
    rng = np.random.default_rng(3)
    v = rng.standard_t(2, 5000)
    for bits in (3, 4, 8, 12, 16):
        for e in sorted({1, min(5, bits // 2), min(8, bits - 1)}):
            r = ref.rangefloat(v, bits, e)
            m = bits - 1 - e
            T = int(r.ints[0])
            Emin = T - 2**e + 2
            a = np.abs(v)
            inside = (a >= 2.0**Emin) & (a < 2.0 ** (T + 1))
            assert np.all(np.abs(r.wide - v)[inside] <= 2.0 ** -(m + 1) * a[inside]), (bits, e)
            assert np.all(np.abs(r.wide) <= (2 - 2.0**-m) * 2.0**T)
    # stochastic rounding is unbiased
    x = np.array([0.3, -1.7, 2.2, 1e-3], np.float64)
    acc = np.zeros(4)
    for step in range(2000):
        acc += ref.rangefloat(x, 4, 2, rounding="stochastic", step=step).wide
    assert np.allclose(acc / 2000, x, rtol=0.05, atol=2e-3)


def test_ref_fp8_nearest_matches_ml_dtypes():
    import ml_dtypes

    rng = np.random.default_rng(4)
    for fmt, mlt, top in (("e4m3", ml_dtypes.float8_e4m3fn, 448.0), ("e5m2", ml_dtypes.float8_e5m2, 57344.0)):
        v = np.concatenate([rng.standard_normal(20_000) * s for s in (1e-4, 1e-2, 1, 30, top / 4)])
        v = v[np.abs(v) <= top]
        got = ref.fp8(v, fmt).wide
        want = v.astype(mlt).astype(np.float64)
        assert_same(got, want, fmt)
        # every code: decode(code) re-encodes to itself
        allv = np.arange(256, dtype=np.uint8).view(mlt).astype(np.float64)
        allv = allv[np.isfinite(allv)]
        assert_same(ref.fp8(allv, fmt).wide, allv, f"{fmt} codes")
        # saturation
        assert ref.fp8(np.array([1e6, -1e6, top * 1.06]), fmt).wide.tolist() == [top, -top, top]


def test_ref_stochastic_codecs_are_unbiased():
    x = np.array([0.3, -1.7, 2.2, 1e-3, 0.0, -0.05], np.float64)
    n = 3000
    for fn, tol in (
        (lambda s: ref.qsgd(x, 2, 4, step=s).wide, 0.06),
        (lambda s: ref.minmax(x, 2, 4, "stochastic", step=s).wide, 0.05),
        (lambda s: ref.terngrad(x, 0, step=s).wide, 0.08),
        (lambda s: ref.fp8(x * 100, "e5m2", rounding="stochastic", step=s).wide / 100, 0.05),
    ):
        acc = np.zeros(x.size)
        for s in range(n):
            acc += fn(s)
        assert np.all(np.abs(acc / n - x) <= tol), (acc / n, x)


# ====================================================================== every codec, dtype, size
MAIN_SPECS = [
    "rangefloat",
    "rangefloat(bits=4,block=7,rounding=stochastic,seed=5)",
    "rangefloat(bits=16,exp_bits=8,block=1000)",
    "fp8",
    "fp8(format=e5m2,scale=true,rounding=stochastic)",
    "fp8(scale=true)",
    "qsgd",
    "qsgd(levels=127,bucket=7,rounding=nearest)",
    "qsgd(levels=3,bucket=100000)",
    "terngrad",
    "sign",
    "sign(scale=l1)",
    "efsign",
    "onebit",
    "minmax",
    "minmax(bits=3,bucket=7,rounding=stochastic)",
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("spec", MAIN_SPECS)
def test_quantizer_matches_reference(spec, dtype, kind):
    errs = []
    for n in SIZES[1:] + [BIG]:
        errs += check_dense(spec, make(kind, n, dtype))
    report(errs)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_empty_input(dtype):
    """k = 0: no blocks, no buckets; the documented payload (terngrad's s, onebit's means,
    sign(l1)'s scale and fp8's scale are still sent)."""
    errs = []
    for spec in MAIN_SPECS:
        errs += check_dense(spec, np.zeros(0, dtype))
        errs += check_dense(spec, np.zeros((3, 0), dtype))
    report(errs)


def test_shapes_and_0d():
    """The frame keeps the shape; a 0-d array is one coded value."""
    for spec in MAIN_SPECS:
        for shape in ((), (3, 4, 5)):
            x = np.asarray(np.random.default_rng(1).standard_normal(shape)).astype(np.float32)
            report(check_dense(spec, x))


# ====================================================================== parameter corners
def _corner_run(specs, dtypes=DTYPES, sizes=(1, 7, 1025), kinds=("normal", "heavy")) -> None:
    errs = []
    for spec in specs:
        for dt in dtypes:
            for i, n in enumerate(sizes):
                errs += check_dense(spec, make(kinds[i % len(kinds)], n, dt, seed=11))
    report(errs)


def _rangefloat_specs(bits: int) -> list[str]:
    out = []
    for e in sorted({1, 2, min(5, bits // 2), min(8, bits - 1)}):
        for block in (0, 1, 7, 1000):
            for rounding in ("nearest", "stochastic"):
                out.append(f"rangefloat(bits={bits},exp_bits={e},block={block},rounding={rounding})")
    return out


@pytest.mark.parametrize("bits", range(3, 17))
def test_rangefloat_corners(bits):
    _corner_run(_rangefloat_specs(bits))


def test_rangefloat_auto_exp_bits():
    """``exp_bits=auto`` is ``min(5, bits // 2)``: the frame equals the explicit one's values."""
    x = make("heavy", 1025, F32)
    for bits in range(3, 17):
        e = min(5, bits // 2)
        a = codec.decode(codec.get_codec(f"rangefloat(bits={bits})").encode(x))
        b = codec.decode(codec.get_codec(f"rangefloat(bits={bits},exp_bits={e})").encode(x))
        assert_same(a, b, f"rangefloat(bits={bits}) vs exp_bits={e}")
    _corner_run([f"rangefloat(bits={b})" for b in range(3, 17)], sizes=(513,))


def test_fp8_corners():
    specs = [
        f"fp8(format={f},scale={s},rounding={r})"
        for f in ("e4m3", "e5m2")
        for s in ("false", "true")
        for r in ("nearest", "stochastic")
    ]
    _corner_run(specs, sizes=(1, 7, 511, 4097))


@pytest.mark.parametrize("levels", [1, 2, 16, 127])
def test_qsgd_corners(levels):
    specs = [
        f"qsgd(levels={levels},bucket={b},rounding={r})" for b in (1, 7, 512, 5000) for r in ("stochastic", "nearest")
    ]
    _corner_run(specs, sizes=(1, 7, 1025))


@pytest.mark.parametrize("bits", range(1, 9))
def test_minmax_corners(bits):
    specs = [f"minmax(bits={bits},bucket={b},rounding={r})" for b in (1, 7, 5000) for r in ("nearest", "stochastic")]
    _corner_run(specs, sizes=(1, 7, 1025))


def test_terngrad_sign_onebit_corners():
    specs = ["terngrad(clip=0)", "terngrad(clip=1)", "terngrad(clip=2.5,seed=9)", "sign", "sign(scale=l1)", "efsign", "onebit"]
    _corner_run(specs, sizes=(1, 2, 7, 1025))


# ====================================================================== special inputs
EDGE_SPECS = [
    "rangefloat",
    "rangefloat(bits=16,exp_bits=1,rounding=stochastic)",
    "rangefloat(bits=3,exp_bits=1)",
    "rangefloat(bits=5,exp_bits=4,rounding=stochastic,block=7)",
    "rangefloat(bits=16,exp_bits=8)",
    "fp8",
    "fp8(format=e5m2)",
    "fp8(scale=true)",
    "fp8(format=e5m2,scale=true,rounding=stochastic)",
    "qsgd",
    "qsgd(levels=1,bucket=1,rounding=nearest)",
    "qsgd(levels=3,bucket=7)",
    "terngrad",
    "terngrad(clip=0)",
    "sign",
    "efsign",
    "onebit",
    "minmax",
    "minmax(bits=1,bucket=1,rounding=stochastic)",
    "minmax(bits=5,bucket=7)",
]


def _special_inputs(dtype) -> dict:
    rng = np.random.default_rng(8)
    n = 100
    tiny = {F32: 1e-42, F64: 1e-300, F16: 6e-8, BF16: 1e-39}[dtype]
    huge = {F32: 1e38, F64: 1e300, F16: 3e4, BF16: 1e38}[dtype]
    signs = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    out = {
        "zeros": np.zeros(n),
        "signed-zeros": np.where(np.arange(n) % 3 == 0, -0.0, 0.0),
        "constant": np.full(n, 0.3),
        "negative-constant": np.full(n, -2.5),
        "one-nonzero": np.where(np.arange(n) == 37, -0.7, 0.0),
        "tiny": signs * tiny * (1 + (rng.random(n) < 0.5)),
        "huge": signs * huge * rng.random(n),
        "huge-constant": np.full(n, huge),
        "tiny-and-huge": np.where(np.arange(n) % 2, signs * huge * 0.5, signs * tiny),
        "subnormal-ladder": np.ldexp(signs, -np.arange(n) % 30 + {F32: -140, F64: -1065, F16: -20, BF16: -125}[dtype]),
    }
    # buckets (of 1, 7, 512, 1024) whose scalars fit float32 next to ones that do not
    out["mixed-buckets"] = np.where(np.arange(n) < 60, rng.standard_normal(n) * 1e-3, signs * huge * rng.random(n))
    if dtype == F64:
        out["float64-beyond-float32"] = signs * 1e300 * rng.random(n) + 1.0
        out["float64-deep-subnormal"] = signs * 1e-320
    return {k: v.astype(dtype) for k, v in out.items()}


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("spec", EDGE_SPECS)
def test_special_inputs(spec, dtype):
    errs = []
    for name, x in _special_inputs(dtype).items():
        errs += [f"[{name}] {e}" for e in check_dense(spec, x)]
    report(errs)


def test_signed_zeros_by_spec():
    """-0.0 takes the non-negative side (sign bit 0) except where the spec keeps it (rangefloat)."""
    x = np.array([1.0, -0.0, 0.0, -2.0], np.float32)
    assert np.signbit(codec.decode(codec.get_codec("rangefloat").encode(x))).tolist() == [False, True, False, True]
    for spec in ("sign", "onebit", "efsign"):
        frame = codec.get_codec(spec).encode(x)
        _, raw = sections(frame)[SectionKind.VALUES]
        assert raw[0] & 0xF == 0b1000, f"{spec}: sign bits {raw[0] & 0xF:04b}, want 1000 (-0.0 is positive)"
    d = codec.decode(codec.get_codec("sign").encode(x))
    assert d.tolist() == [1, 1, 1, -1]


def test_rangefloat_stochastic_below_the_smallest_subnormal():
    """Step 3: below the smallest subnormal, stochastic rounding goes up to it with probability
    q (no cut-off), so tiny values stay unbiased.  e4m3 window with T = 0: Emin = -14, smallest
    subnormal 2**-17.  The steps are chosen so that u_1 is close to 1."""
    c = codec.get_codec("rangefloat(rounding=stochastic)")
    # q = 1.5 * 2**-12: up to 2**-17 when u_1 >= 1 - q (u_1 = 0.99981 at step 2704)
    assert ref.uniforms(2, 0, "cut", 2704)[1] >= 1 - 1.5 * 2.0**-12
    x = np.array([1.0, 1.5 * 2.0**-29], np.float32)
    assert ref.rangefloat(x, rounding="stochastic", key="cut", step=2704).decoded.tolist() == [1.0, 2.0**-17]
    assert_same(codec.decode(encode(c, x, "cut", 2704)), np.array([1.0, 2.0**-17], np.float32), "q = 1.5 * 2**-12")
    # and to 0 when u_1 < 1 - q (step 0)
    assert ref.uniforms(2, 0, "cut", 0)[1] < 1 - 1.5 * 2.0**-12
    assert_same(codec.decode(encode(c, x, "cut", 0)), np.array([1.0, 0.0], np.float32), "q = 1.5 * 2**-12, step 0")
    # q = 1.5 * 2**-10: rounds up to 2**-17 when u_1 >= 1 - q (u_1 = 0.99921 at step 6720)
    assert ref.uniforms(2, 0, "cut", 6720)[1] >= 1 - 1.5 * 2.0**-10
    x = np.array([1.0, 1.5 * 2.0**-27], np.float32)
    assert_same(codec.decode(encode(c, x, "cut", 6720)), np.array([1.0, 2.0**-17], np.float32), "q = 1.5 * 2**-10")


def test_rangefloat_nearest_ties_to_even_with_no_mantissa_bits():
    """m = 0 (exp_bits = bits - 1): q = 1.5 is a tie between r = 1 and r = 2; ties go to the
    even integer r = 2 (step 3), i.e. up to the next binade."""
    for dt in DTYPES:
        x = np.array([1.0, 0.75, -0.375, 0.1875], dt)
        for spec in ("rangefloat(bits=3,exp_bits=2)", "rangefloat(bits=5,exp_bits=4)", "rangefloat(bits=9,exp_bits=8)"):
            want = np.array([1.0, 1.0, -0.5, 0.25], dt)
            assert_same(ref.code(spec, x).decoded, want, f"reference {spec}")
            assert_same(codec.decode(codec.get_codec(spec).encode(x)), want, f"{spec} on {np.dtype(dt)}")


@pytest.mark.parametrize("spec", EDGE_SPECS)
def test_nonfinite_input_raises_naming_the_position(spec):
    c = codec.get_codec(spec)
    for dt in DTYPES:
        for bad, where in ((((2, 3, np.nan), (3, 1, np.inf)), "(2, 3)"), (((0, 4, -np.inf),), "(0, 4)")):
            x = make("normal", 20, dt).reshape(4, 5)
            for i, j, v in bad:
                x[i, j] = v
            with pytest.raises(ValueError, match=r"^x:.*" + re.escape(where)):
                c.encode(x)
        x = np.zeros(7, dt)
        x[5] = np.nan
        with pytest.raises(ValueError, match=r"^x:.*" + re.escape("(5,)")):
            c.encode(x)


# ====================================================================== key, step, seed
STOCHASTIC_SPECS = [
    "rangefloat(rounding=stochastic)",
    "rangefloat(bits=5,block=100,rounding=stochastic,seed=3)",
    "fp8(rounding=stochastic)",
    "fp8(format=e5m2,scale=true,rounding=stochastic,seed=1)",
    "qsgd",
    "qsgd(levels=2,bucket=7,seed=12)",
    "terngrad",
    "terngrad(clip=0,seed=4)",
    "minmax(rounding=stochastic)",
    "minmax(bits=2,bucket=7,rounding=stochastic,seed=2)",
]


@pytest.mark.parametrize("spec", STOCHASTIC_SPECS)
def test_key_and_step_select_the_stream(spec):
    c = codec.get_codec(spec)
    x = make("normal", 1000, F32)
    f = encode(c, x, "layer.1", 5)
    assert encode(c, x, "layer.1", 5) == f, f"{spec}: same (seed, key, step) gave another frame"
    assert encode(c, x.copy(), "layer.1", 5) == f
    others = {
        "step 6": encode(c, x, "layer.1", 6),
        "key layer.2": encode(c, x, "layer.2", 5),
        "key None": encode(c, x, None, 5),
        "bare": c.encode(x),
    }
    name, p = ref.parse_spec(spec)
    p["seed"] = p.get("seed", 0) + 1
    other_seed = name + "(" + ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in p.items()) + ")"
    others["seed+1"] = encode(codec.get_codec(other_seed), x, "layer.1", 5)
    for what, g in others.items():
        assert codec.decode(g).tobytes() != codec.decode(f).tobytes(), f"{spec}: {what} gave the same values"
    assert c.encode(x) == encode(c, x, None, 0)
    errs = []
    for key, step in (("layer.1", 5), (7, 1), (None, 3), ("k", (1 << 62) - 1)):  # the largest step (codec.stage.MAX_STEP)
        for n in (7, 70_001):
            for dt in (F32, BF16):
                errs += check_dense(spec, make("heavy", n, dt), key=key, step=step)
    report(errs)


@pytest.mark.parametrize("spec", ["rangefloat", "fp8(scale=true)", "qsgd(rounding=nearest)", "sign", "efsign", "onebit", "minmax"])
def test_deterministic_codecs_ignore_key_and_step(spec):
    c = codec.get_codec(spec)
    x = make("heavy", 999, F64)
    f = c.encode(x)
    assert encode(c, x, "a", 3) == f and encode(c, x, 5, 0) == f


# ====================================================================== error feedback, decode_add
@pytest.mark.parametrize("spec", ["qsgd(levels=4,bucket=64)", "terngrad", "rangefloat(bits=6,rounding=stochastic)", "efsign", "onebit", "minmax(bits=2,rounding=stochastic)"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_error_feedback_steps_use_key_and_step(spec, dtype):
    """Under ErrorFeedback step t codes acc = x + residual with the key's step count t."""
    ef = codec.ErrorFeedback(codec.get_codec(spec))
    rng = np.random.default_rng(5)
    shape = (33, 31)
    for t in range(4):
        x = (rng.standard_normal(shape) * 0.1).astype(dtype)
        old = ef.residual("w").copy() if t else np.zeros(shape, dtype)
        acc = np.add(x, old, dtype=dtype)
        frame = ef.encode(x, key="w")
        r = ref.code(spec, acc.reshape(-1), key="w", step=t)
        assert_same(codec.decode(frame), r.decoded.reshape(shape), f"{spec} under ErrorFeedback, step {t}")
        want_res = ref.round_to(acc.reshape(-1).astype(np.float64) - r.decoded.astype(np.float64), dtype).reshape(shape)
        assert_same(ef.residual("w"), want_res, f"{spec}: residual after step {t}")
    assert ef.step("w") == 4


@pytest.mark.parametrize("spec", MAIN_SPECS)
def test_decode_add(spec):
    c = codec.get_codec(spec)
    for dt in DTYPES:
        x = make("heavy", 513, dt).reshape(27, 19)
        frame = c.encode(x)
        dec = codec.decode(frame)
        acc0 = np.random.default_rng(1).standard_normal(x.shape)
        acc = acc0.copy()
        assert c.decode_add(frame, acc) is acc
        assert_same(acc, acc0 + dec.astype(np.float64), f"{spec}: decode_add into float64 ({dt})")
        acc = acc0.copy()
        c.decode_add(frame, acc, subtract=True)
        assert_same(acc, acc0 - dec.astype(np.float64), f"{spec}: decode_add(subtract) into float64 ({dt})")
        if dt == F32:
            a32 = acc0.astype(np.float32)
            got = c.decode_add(frame, a32.copy())
            assert_same(got, a32 + dec, f"{spec}: decode_add into float32")


# ====================================================================== after a select stage
SELECTS = [
    "topk(ratio=0.1)",
    "adacomp",
    "threshold(value=0.5)",
    "randomk(ratio=0.1,seed=3)",
    "gaussiank(ratio=0.1)",
    "dgc(ratio=0.1)",
    "topk(k=1)",
]
AFTER = [
    "qsgd",
    "qsgd(levels=2,bucket=7,rounding=nearest)",
    "rangefloat(bits=8)",
    "rangefloat(bits=5,block=7,rounding=stochastic)",
    "fp8(scale=true)",
    "terngrad",
    "sign",
    "efsign",
    "onebit",
    "minmax(bits=4,bucket=7)",
]


@pytest.mark.parametrize("value", AFTER)
@pytest.mark.parametrize("select", SELECTS)
def test_after_select(select, value):
    """Positions are those of ``select+none``; the kept values are the reference on the kept
    values in position order; wire size = H + index bytes (or randomk's 24) + the value payload."""
    spec = f"{select}+{value}"
    c = codec.get_codec(spec)
    plain = codec.get_codec(f"{select}+none")
    errs = []
    for kind, shape, dt in (("heavy", (40, 51), F32), ("normal", (300,), F64), ("normal", (3, 5, 71), BF16), ("heavy", (1,), F16)):
        x = make(kind, int(np.prod(shape)), dt, seed=5).reshape(shape)
        for key, step in ((None, 0), ("t", 2)):
            what = f"{spec} on {dt}{list(shape)} key={key!r} step={step}"
            frame = encode(c, x, key, step)
            f0 = encode(plain, x, key, step)
            pos0 = frame_positions(f0)
            pos = frame_positions(frame)
            if select.startswith("randomk"):
                assert pos is None and pos0 is None
                pos = pos0 = sparse_ref.randomk_positions(x.size, sparse_ref.k_of(0.1, x.size), 3, key, step)
                ib = 24
            else:
                if pos is None or not np.array_equal(pos, pos0):
                    errs.append(f"{what}: index section differs from {select}+none")
                    continue
                idx = {k: v[1] for k, v in sections(frame).items() if k in (SectionKind.INDEX_BITMAP, SectionKind.INDEX_DELTA)}
                idx0 = {k: v[1] for k, v in sections(f0).items() if k in (SectionKind.INDEX_BITMAP, SectionKind.INDEX_DELTA)}
                if idx != idx0:
                    errs.append(f"{what}: index section bytes differ from {select}+none")
                ib = sparse_ref.index_bytes(pos, x.size)
            kept = np.asarray(x).reshape(-1)[pos]
            r = ref.code(value, kept, key=key, step=step)
            want = np.zeros(x.size, dt)
            want[pos] = r.decoded
            m = diff_msg(codec.decode(frame), want.reshape(shape), what)
            if m:
                errs.append(m)
            H = codec.inspect(frame)["header_bytes"]
            if len(frame) != H + ib + r.payload:
                errs.append(f"{what}: frame is {len(frame)} bytes, H + index + payload = {H} + {ib} + {r.payload}")
            errs += check_value_sections(value, frame, r, what)
            acc = np.linspace(-1, 1, x.size).reshape(shape)
            m = diff_msg(c.decode_add(frame, acc.copy()), acc + codec.decode(frame).astype(np.float64), f"{what}: decode_add")
            if m:
                errs.append(m)
    report(errs)


# ---------------------------------------------------------------------- QSGD's Elias coding
def _gamma(v: int) -> str:
    b = bin(v)[2:]
    return "0" * (len(b) - 1) + b


def _elias_reference(codes: np.ndarray, bucket: int, n: int) -> tuple[list[int], bytes]:
    """docs/codecs.md: per chunk of max(1, 65536 // bucket) buckets a stream padded to whole
    bytes; per bucket gamma(nnz+1), per non-zero gamma(zeros before it + 1), sign bit, gamma(level)."""
    per = max(1, 65536 // bucket)
    sizes, out = [], bytearray()
    for c0 in range(0, n, per * bucket):
        bits = []
        for b0 in range(c0, min(n, c0 + per * bucket), bucket):
            lv = [int(v) for v in codes[b0 : min(n, c0 + per * bucket, b0 + bucket)]]
            bits.append(_gamma(sum(1 for v in lv if v >> 1) + 1))
            run = 0
            for v in lv:
                if v >> 1 == 0:
                    run += 1
                    continue
                bits.append(_gamma(run + 1) + str(v & 1) + _gamma(v >> 1))
                run = 0
        s = "".join(bits)
        s += "0" * (-len(s) % 8)
        chunk = bytes(int(s[i : i + 8][::-1], 2) for i in range(0, len(s), 8))  # LSB-first
        sizes.append(len(chunk))
        out += chunk
    return sizes, bytes(out)


def _sections(frame):
    fr = parse_frame(frame)
    return [(s.kind_name, fr.raw(i).tobytes()) for i, s in enumerate(fr.sections)]


@pytest.mark.parametrize("levels,bucket,n", [(16, 512, 4097), (1, 7, 1000), (300, 512, 200_003), (4, 100_000, 200_003)])
@pytest.mark.parametrize("rounding", ["stochastic", "nearest"])
def test_qsgd_elias_matches_the_bit_stream_reference(levels, bucket, n, rounding):
    x = (np.random.default_rng(n).standard_t(2, n) * 1e-3).astype(np.float32)
    spec = f"qsgd(levels={levels},bucket={bucket},rounding={rounding})"
    packed = codec.get_codec(spec).encode(x, key="e", step=3)
    elias = codec.get_codec(spec[:-1] + ",coding=elias)").encode(x, key="e", step=3)
    ps, es = _sections(packed), _sections(elias)
    w = 1 + levels.bit_length()
    from codec.pack import unpack_bits

    codes = unpack_bits(np.frombuffer(ps[1][1], np.uint8), w, n)
    sizes, stream = _elias_reference(codes, bucket, n)
    assert es[0] == ps[0]  # the same norms
    assert [k for k, _ in es] == ["scalars", "ints", "values"]
    assert np.frombuffer(es[1][1], "<u8").tolist() == sizes
    assert es[2][1] == stream
    assert_same(codec.decode(elias), codec.decode(packed), spec)


def test_qsgd_elias_rejects_damaged_streams():
    x = (np.random.default_rng(5).standard_normal(3000)).astype(np.float32)
    frame = bytearray(codec.get_codec("qsgd(levels=4,coding=elias)").encode(x))
    fr = parse_frame(bytes(frame))
    values = fr.sections[2]
    seen = 0
    for pos in range(values.offset, values.offset + values.stored_len):
        for bit in range(8):
            buf = bytearray(frame)
            buf[pos] ^= 1 << bit
            try:
                y = codec.decode(bytes(buf))
            except codec.CorruptFrameError:
                seen += 1
                continue
            assert y.shape == x.shape and np.all(np.isfinite(y))  # a flip that still parses decodes to finite values
    assert seen > 0
    # chunk lengths that do not add up to the values section
    buf = bytearray(frame)
    ints = fr.sections[1]
    buf[ints.offset] ^= 1
    with pytest.raises(codec.CorruptFrameError):
        codec.decode(bytes(buf))
