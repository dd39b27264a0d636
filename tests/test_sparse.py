"""Select stages (docs/codecs.md, "Select stages (sparsifiers)") against plain NumPy references.

Every sparsifier is checked through the public API (``get_codec``, ``encode``, ``decode``,
``decode_add``, ``ErrorFeedback``, ``parse_frame``) against ``tests/reference/sparse.py``: the
decoded array must equal the reference's dense array bit for bit (value stage ``none``),
the kept positions read from the frame's index section must equal the reference's, and the
frame's kept count must match.  Stages not registered yet are skipped, not passed.
"""

from __future__ import annotations

import pickle
import struct

import numpy as np

from codec.frame import header_length
import pytest

import codec
from codec import testing
from codec.testing import assert_identical as assert_same
from codec.dtypes import bfloat16
from codec.frame import SectionKind, parse_frame

from reference import sparse as ref
from support.threads import same_across_threads

F16, BF16, F32, F64 = np.dtype(np.float16), np.dtype(bfloat16), np.dtype(np.float32), np.dtype(np.float64)
DTYPES = [F32, F64, F16, BF16]
DT_IDS = ["f32", "f64", "f16", "bf16"]


# ====================================================================== helpers
def _registered() -> set:
    return {c["id"] for c in codec.list_codecs()}


def need(spec: str) -> None:
    """Skip (not pass) when a stage of ``spec`` is not registered yet."""
    have = _registered()
    for part in spec.split("+"):
        name = part.split("(")[0].strip()
        if name not in have:
            pytest.skip(f"stage {name!r} is not registered yet")


def same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _section_bytes(frame: bytes, s) -> bytes:
    raw = bytes(frame[s.offset : s.offset + s.stored_len])
    if s.encoding:
        import zstandard

        raw = zstandard.ZstdDecompressor().decompress(raw, max_output_size=s.raw_len)
    assert len(raw) == s.raw_len
    return raw


def _unpack(raw: bytes, bits: int, count: int) -> np.ndarray:
    """``count`` LSB-first items of ``bits`` bits (as int64 / uint64 for 64-bit items)."""
    if count == 0:
        return np.zeros(0, np.int64)
    stream = np.unpackbits(np.frombuffer(raw, np.uint8), bitorder="little")[: count * bits].reshape(count, bits)
    if bits == 64:
        return np.frombuffer(raw, "<u8")[:count].copy()
    return (stream.astype(np.int64) << np.arange(bits, dtype=np.int64)).sum(axis=1)


def sections(frame: bytes) -> dict:
    """{kind: SectionInfo} of a frame (each kind at most once in a select codec's frame)."""
    fr = parse_frame(frame)
    out = {}
    for s in fr.sections:
        assert s.kind not in out, f"two sections of kind {s.kind_name}"
        out[s.kind] = s
    return out


def frame_positions(frame: bytes):
    """Kept positions read from the frame's index section (None when there is none)."""
    fr = parse_frame(frame)
    secs = sections(frame)
    if SectionKind.INDEX_BITMAP in secs:
        s = secs[SectionKind.INDEX_BITMAP]
        assert s.count == fr.n and s.bits == 1
        bits = np.unpackbits(np.frombuffer(_section_bytes(frame, s), np.uint8), bitorder="little")
        return np.flatnonzero(bits[: fr.n]).astype(np.int64)
    if SectionKind.INDEX_DELTA in secs:
        s = secs[SectionKind.INDEX_DELTA]
        gaps = _unpack(_section_bytes(frame, s), s.bits, s.count)
        return np.cumsum(gaps + 1) - 1
    return None


def kept_count(frame: bytes) -> int:
    """Items in the frame's values section (one per kept element)."""
    return sections(frame)[SectionKind.VALUES].count


def header_len(c, ndim: int, nsec: int) -> int:
    """12 + 8*ndim + L + 28*S + 4, + 4 for the payload CRC-32C every frame carries by default."""
    return header_length(ndim, len(c.spec), nsec)


# ---------------------------------------------------------------------- data
KINDS = ["normal", "heavy", "embedding", "ties", "zeros"]


def make(kind: str, shape, dtype, seed: int = 0) -> np.ndarray:
    """normal; heavy-tailed (Student-t, 2 dof); embedding-like (most rows exactly zero);
    ties (few distinct magnitudes, many equal); all zeros."""
    rng = np.random.default_rng([seed, KINDS.index(kind) if kind in KINDS else 99, int(np.prod(shape))])
    n = int(np.prod(shape, dtype=np.int64))
    if kind == "normal":
        v = rng.standard_normal(n) * 0.01
    elif kind == "heavy":
        v = rng.standard_t(2, n) * 1e-3
    elif kind == "embedding":  # rows of the last axis (of 8 for 0-d and 1-d), 10% of them live
        width = shape[-1] if len(shape) >= 2 and shape[-1] else 8
        rows = -(-n // width)
        live = rng.random(rows) < 0.1
        v = (rng.standard_normal((rows, width)) * 0.01 * live[:, None]).reshape(-1)[:n]
    elif kind == "ties":
        v = rng.integers(-3, 4, n) * 0.25
    elif kind == "zeros":
        v = np.zeros(n)
    else:
        raise ValueError(kind)
    return np.asarray(v, np.float64).astype(dtype).reshape(shape)


# ---------------------------------------------------------------------- cases
# name -> (spec, reference(acc, key, step) -> (positions, values))
def _adacomp_ref(L=None):
    return lambda a, key=None, step=0: ref.adacomp(a, None, L)[:2]


CASES = {
    "topk-ratio": ("topk(ratio=0.05)", lambda a, key=None, step=0: ref.topk(a, ref.k_of(0.05, a.size))),
    "topk-k": ("topk(k=10)", lambda a, key=None, step=0: ref.topk(a, 10)),
    "gaussiank": ("gaussiank(ratio=0.05)", lambda a, key=None, step=0: ref.gaussiank(a, 0.05)),
    "gaussiank-exact": ("gaussiank(ratio=0.05,exact=true)", lambda a, key=None, step=0: ref.gaussiank(a, 0.05, exact=True)),
    "dgc": ("dgc(ratio=0.05,sample=0.01)", lambda a, key=None, step=0: ref.dgc(a, 0.05, 0.01)),
    "randomk": ("randomk(ratio=0.05,seed=3)", lambda a, key=None, step=0: ref.randomk(a, 0.05, 3, key, step)),
    "randomk-scale": ("randomk(ratio=0.05,scale=true)", lambda a, key=None, step=0: ref.randomk(a, 0.05, 0, key, step, scale=True)),
    "adacomp": ("adacomp", _adacomp_ref()),
    "adacomp-bin50": ("adacomp(bin=50)", _adacomp_ref(50)),
    "threshold": ("threshold(value=0.01)", lambda a, key=None, step=0: ref.threshold(a, 0.01)),
}
SHAPES = [(0,), (1,), (), (7,), (49,), (51,), (7, 7, 1), (3, 17, 1), (499,), (501,), (10, 33), (2, 3, 4, 5)]
SHAPE_IDS = ["x".join(map(str, s)) or "0d" for s in SHAPES]


def check_against(spec: str, x: np.ndarray, pos, vals, *, value: str = "none", what: str = "") -> bytes:
    """encode(x) decodes to the reference's dense array, with the reference's positions and count."""
    c = codec.get_codec(spec)
    frame = c.encode(x)
    want = ref.dense(pos, ref.code_values(vals, value, x.dtype), x.shape, x.dtype)
    what = what or f"{spec} on {x.dtype}{list(x.shape)}"
    assert_same(codec.decode(frame), want, what)
    assert kept_count(frame) == len(pos), f"{what}: frame keeps {kept_count(frame)}, reference {len(pos)}"
    got_pos = frame_positions(frame)
    if got_pos is not None:
        assert np.array_equal(got_pos, pos), f"{what}: index section positions differ from the reference"
    return frame


# ====================================================================== the references themselves
def test_ref_topk_equals_brute_force():
    rng = np.random.default_rng(0)
    for trial in range(300):
        n = int(rng.integers(0, 50))
        x = (rng.integers(-3, 4, n) * 0.5 if trial % 2 else rng.standard_normal(n)).astype(np.float32)
        k = int(rng.integers(0, n + 2))
        assert np.array_equal(ref.topk(x, k)[0], ref.topk_brute(x, k)[0])
    # ties go to the lower index
    assert ref.topk(np.array([1, -1, 1, 1, -1, 0.5], np.float32), 2)[0].tolist() == [0, 1]


def test_ref_gaussiank_exact_is_topk_and_count_is_clamped():
    rng = np.random.default_rng(1)
    for n in (1, 2, 3, 7, 100, 1001, 30_000):
        x = rng.standard_t(2, n).astype(np.float32)
        for ratio in (0.001, 0.01, 0.1, 0.5, 1.0):
            k = ref.k_of(ratio, n)
            assert np.array_equal(ref.gaussiank(x, ratio, exact=True)[0], ref.topk(x, k)[0])
            lo, hi = ref.gaussiank_bounds(k)
            kp = ref.gaussiank(x, ratio)[0].size
            assert lo <= kp <= hi or kp == n
    assert ref.gaussiank_bounds(1) == (1, 1) and ref.gaussiank_bounds(3) == (2, 4) and ref.gaussiank_bounds(100) == (67, 133)
    # inside the clamp, gaussiank is exactly {|acc| > t}
    x = rng.standard_normal(200_000)
    t = ref.gaussiank_threshold(x, 0.01)
    assert np.array_equal(ref.gaussiank(x, 0.01)[0], np.flatnonzero(np.abs(x) > t))


def test_ref_k_of():
    assert ref.k_of(0.01, 0) == 0 and ref.k_of(0.01, 1) == 1 and ref.k_of(0.01, 99) == 1
    assert ref.k_of(0.01, 1000) == 10 and ref.k_of(1.0, 7) == 7 and ref.k_of(0.3, 10) == 3


def test_ref_randomk_vectorised_equals_the_literal_text():
    for n in (1, 2, 3, 4, 5, 16, 17, 1000, 4097):
        for k in sorted({1, n // 3 + 1, n}):
            for key in (None, "a", 3, ("t", 1)):
                a = ref.randomk_positions(n, k, 7, key, 2)
                assert np.array_equal(a, ref.randomk_positions_scalar(n, k, 7, key, 2))
                assert np.unique(a).size == k and a.min() >= 0 and a.max() < n
        assert np.array_equal(ref.randomk_positions(n, n, 0, None, 0), np.arange(n))  # a permutation
    # SplitMix64's finaliser: known values (mix(0) == 0; mix of the first SplitMix64 state)
    assert ref.mix_int(0) == 0
    assert ref.mix_int(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF
    assert ref.key_hash(7) == ref.key_hash("7") and ref.key_hash(None) == ref.key_hash("")
    assert ref.key_hash(("a", 1)) == ref.key_hash("('a', 1)")


def test_ref_dgc_loop_and_adacomp_by_hand():
    tr = []
    x = np.zeros(100_000)
    x[::24] = 1.0  # the strided sample sees only ones; the rest is tiny
    x[1::24] = 1e-9
    pos, _ = ref.dgc(x, 0.1, 0.01, trace=tr)
    assert len(tr) == 11 and pos.size == np.count_nonzero(x == 1.0)
    # AdaComp: G = dW, H = 2 dW; bins of 3
    dW = np.array([0.1, -0.5, 0.2, 0.0, 0.3, -0.3])
    pos, vals, R = ref.adacomp(dW, None, 3)
    s = (0.5 + 0.3) / 2
    assert pos.tolist() == [1, 4, 5] and vals.tolist() == [-s, s, -s]
    assert R.tolist() == [0.1, -0.5 + s, 0.2, 0.0, 0.3 - s, -0.3 + s]
    a = np.abs(np.random.default_rng(0).standard_normal(1003))
    for L in (1, 7, 50, 1002, 1003, 5000):
        assert np.array_equal(ref._bin_max(a, L), ref._bin_max_loop(a, L))


# ====================================================================== every codec, every dtype, every shape
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", list(CASES))
def test_select_matches_reference(case, dtype, kind, shape):
    spec, fn = CASES[case]
    need(spec)
    x = make(kind, shape, dtype)
    pos, vals = fn(x)
    frame = check_against(spec, x, pos, vals)
    c = codec.get_codec(spec)
    assert c.encode(x.copy()) == frame, f"{spec}: encoding is not deterministic"
    # decode_add scatters the kept values into an accumulator
    acc = np.linspace(-1, 1, x.size).reshape(x.shape)
    want = acc + codec.decode(frame).astype(np.float64)
    assert_same(c.decode_add(frame, acc), want, f"{spec}: decode_add")


VALUE_STAGES = ["+fp16", "+bf16", "+zstd", "+fp16+zstd", "+none"]


@pytest.mark.parametrize("suffix", VALUE_STAGES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", ["topk-ratio", "gaussiank", "dgc", "randomk", "randomk-scale", "adacomp", "threshold"])
def test_value_stages_after_select(case, dtype, suffix):
    spec, fn = CASES[case]
    spec = spec + suffix
    need(spec)
    value = "fp16" if "fp16" in suffix else "bf16" if "bf16" in suffix else "none"
    for kind, shape in (("heavy", (40, 51)), ("embedding", (300,)), ("normal", (4, 5, 6))):
        x = make(kind, shape, dtype, seed=5)
        if case.startswith("adacomp"):
            # an explicit value stage codes the kept G themselves; +zstd alone keeps the sign bits
            explicit = suffix.split("+")[1] in ("fp16", "bf16", "none")
            L = ref.adacomp_bin(shape)
            pos, vals, _ = ref.adacomp(x, None, L, value=value if explicit else "sign")
            check_against(spec, x, pos, vals, what=f"{spec} on {kind} {dtype}")
        else:
            pos, vals = fn(x)
            check_against(spec, x, pos, vals, value=value, what=f"{spec} on {kind} {dtype}")


# ====================================================================== ties, zeros, non-finite
def test_ties_go_to_the_lower_index():
    x = np.array([1, -1, 1, 1, -1, 0.5, -1], np.float32)
    for spec in ("topk(k=2)", "gaussiank(ratio=0.3,exact=true)"):
        need(spec)
        dec = codec.decode(codec.get_codec(spec).encode(x))
        assert dec.tolist() == [1, -1, 0, 0, 0, 0, 0], spec
    # dgc: the count (all 100) exceeds 1.3k, so it falls back to the exact top-k: the first 10
    need("dgc")
    y = np.where(np.arange(100) % 2, -1.0, 1.0).astype(np.float32)
    dec = codec.decode(codec.get_codec("dgc(ratio=0.1)").encode(y))
    assert np.flatnonzero(dec).tolist() == list(range(10))
    # gaussiank with all magnitudes equal keeps a prefix of length in [ceil(2k/3), floor(4k/3)]
    need("gaussiank")
    f = codec.get_codec("gaussiank(ratio=0.1)").encode(y)
    kp = kept_count(f)
    assert 7 <= kp <= 13 and np.flatnonzero(codec.decode(f)).tolist() == list(range(kp))
    # 16-bit input: ties are judged on the widened values (two float16 codes that widen equal)
    need("topk")
    h = np.array([0.5, -0.25, -0.5, 0.5, 0.25], np.float16)
    assert codec.decode(codec.get_codec("topk(k=2)").encode(h)).tolist() == [0.5, 0, -0.5, 0, 0]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_all_zero_input(dtype):
    x = np.zeros((20, 50), dtype)
    n = x.size
    k = ref.k_of(0.05, n)
    expect = {
        "topk(ratio=0.05)": k,  # the first k indices (ties to the lower index)
        "gaussiank(ratio=0.05)": (2 * k + 2) // 3,  # mu = sigma = t = 0, c = 0: clamped up
        "gaussiank(ratio=0.05,exact=true)": k,
        "dgc(ratio=0.05)": k,  # thr = 0 counts all n > 1.3k: exact top-k
        "randomk(ratio=0.05)": k,
        "adacomp": 0,  # an all-zero bin sends nothing
        "threshold(value=0.01)": 0,
        "threshold": n,  # value 0 keeps every element
    }
    for spec, count in expect.items():
        need(spec)
        frame = codec.get_codec(spec).encode(x)
        assert kept_count(frame) == count, f"{spec}: kept {kept_count(frame)}, want {count}"
        assert_same(codec.decode(frame), x, spec)
        pos = frame_positions(frame)
        if pos is not None and not spec.startswith("randomk") and spec != "threshold":
            assert pos.tolist() == list(range(count)), f"{spec}: kept zeros must be the lowest indices"


NONFINITE_SPECS = [
    "topk(ratio=0.1)",
    "topk(k=3)",
    "gaussiank(ratio=0.1)",
    "gaussiank(ratio=0.1,exact=true)",
    "dgc(ratio=0.1)",
    "adacomp",
    "adacomp+fp16",
    "threshold(value=0.5)",
    "topk(ratio=0.1)+fp16",
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("spec", NONFINITE_SPECS)
def test_nonfinite_input_raises_naming_the_first_position(spec, dtype):
    need(spec)
    c = codec.get_codec(spec)
    for bad, where in (((2, 3, np.nan), (3, 1, np.inf)), "(2, 3)"), (((0, 4, -np.inf),), "(0, 4)"):
        x = make("normal", (4, 5), dtype)
        for i, j, v in bad:
            x[i, j] = v
        with pytest.raises(ValueError, match=re_escape(where)):
            c.encode(x)
        ef = codec.ErrorFeedback(c)
        good = make("heavy", (4, 5), dtype)
        ef.encode(good, key="w")
        before = ef.residual("w").copy()
        with pytest.raises(ValueError, match=re_escape(where)):
            ef.encode(x, key="w")
        assert same(ef.residual("w"), before) and ef.step("w") == 1, f"{spec}: a failed step changed the state"
    # 1-d positions are named as 1-tuples
    x = np.zeros(7, dtype)
    x[5] = np.inf
    with pytest.raises(ValueError, match=re_escape("(5,)")):
        c.encode(x)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_randomk_nonfinite_kept_values_raise(dtype):
    """randomk's selection ignores the values; the codec table says it raises on non-finite
    *kept* values, naming the first (the common rule says the first non-finite in acc)."""
    need("randomk")
    c = codec.get_codec("randomk(ratio=0.2)")
    shape = (4, 5)
    for key, step, prior in ((None, 0, 0), ("w", 1, 1)):
        kept = ref.randomk_positions(20, 4, 0, key, step)
        x = make("normal", shape, dtype)
        x.reshape(-1)[kept[1]] = np.nan
        x.reshape(-1)[kept[2]] = np.inf
        where = str(tuple(int(v) for v in np.unravel_index(int(kept[1]), shape)))
        if key is None:
            with pytest.raises(ValueError, match=re_escape(where)):
                c.encode(x)
        else:
            ef = codec.ErrorFeedback(c)
            ef.encode(make("heavy", shape, dtype), key=key)
            before = ef.residual(key).copy()
            with pytest.raises(ValueError, match=re_escape(where)):
                ef.encode(x, key=key)
            assert same(ef.residual(key), before) and ef.step(key) == prior


def re_escape(s: str) -> str:
    import re

    return re.escape(s)


def test_magnitudes_are_compared_in_float64():
    """|acc| in float64 against a float64 threshold: float32(0.1) > 0.1 > float16(0.1)."""
    need("threshold")
    assert float(np.float32(0.1)) > 0.1 > float(np.float16(0.1))
    below = float(np.nextafter(np.float32(0.1), np.float32(0)))
    x = np.array([0.1, below, -0.1, 0.2], np.float32)
    assert codec.decode(codec.get_codec("threshold(value=0.1)").encode(x)).tolist() == [x[0], 0, x[2], x[3]]
    for dt in (F16, BF16):
        y = np.array([0.1, -0.1, 0.2], dt)  # both 16-bit 0.1s lie below 0.1
        want = [0, 0, float(y[2])] if float(y[0]) < 0.1 else [float(v) for v in y]
        assert codec.decode(codec.get_codec("threshold(value=0.1)").encode(y)).astype(np.float64).tolist() == want
    # float64 arrays: the comparison is exact at the last bit
    z = np.array([0.1, np.nextafter(0.1, 0), np.nextafter(0.1, 1)])
    assert np.flatnonzero(codec.decode(codec.get_codec("threshold(value=0.1)").encode(z))).tolist() == [0, 2]


# ====================================================================== gaussiank's count guarantee
def _pathological(n):
    rng = np.random.default_rng(11)
    out = {"all-equal": np.full(n, 0.5), "all-equal-negative": np.full(n, -3.0), "zeros": np.zeros(n)}
    v = rng.standard_normal(n)
    v[n // 3] = 1e30
    out["one-huge-outlier"] = v
    v = np.zeros(n)
    v[rng.choice(n, n // 100, replace=False)] = rng.standard_normal(n // 100)
    out["99%-zeros"] = v
    out["two-values"] = np.where(rng.random(n) < 0.5, 1.0, -2.0)
    out["heavy-t1"] = rng.standard_cauchy(n)
    out["heavy-t2"] = rng.standard_t(2, n) * 1e-3
    v = np.abs(rng.standard_normal(n)) + 100.0  # big mean, tiny relative spread
    out["offset"] = v
    return out


@pytest.mark.parametrize("ratio", [0.001, 0.01, 0.1, 0.5, 1.0])
@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
def test_gaussiank_count_is_always_within_bounds(ratio, dtype):
    need("gaussiank")
    c = codec.get_codec(f"gaussiank(ratio={ratio})")
    for n in (3, 1000, 70_001):
        k = ref.k_of(ratio, n)
        lo, hi = ref.gaussiank_bounds(k)
        for name, v in _pathological(n).items():
            x = v.astype(dtype)
            frame = c.encode(x)
            kp = kept_count(frame)
            assert min(lo, n) <= kp <= min(hi, n), f"{name} n={n}: kept {kp}, outside [{lo}, {hi}] (k={k})"
            # whatever the count, the kept set is the top-k' (ties to the lower index)
            pos, vals = ref.topk(x, kp)
            assert np.array_equal(frame_positions(frame), pos), f"{name} n={n}: kept set is not the top-{kp}"
            assert_same(codec.decode(frame), ref.dense(pos, vals, x.shape, x.dtype), f"{name} n={n}")
            if name.startswith(("heavy", "one-huge", "99%", "two-values")):
                assert kp == ref.gaussiank_count(x, ratio), f"{name} n={n}: count {kp}, reference {ref.gaussiank_count(x, ratio)}"


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_gaussiank_on_heavy_tails_matches_reference(dtype):
    need("gaussiank")
    x = make("heavy", (300, 337), dtype, seed=3)
    for ratio in (0.001, 0.003, 0.01, 0.05, 0.2):
        pos, vals = ref.gaussiank(x, ratio)
        lo, hi = ref.gaussiank_bounds(ref.k_of(ratio, x.size))
        assert lo <= pos.size <= hi
        check_against(f"gaussiank(ratio={ratio})", x, pos, vals)


@pytest.mark.parametrize("offset, spread", [(100.0, 1e-4), (1e3, 1e-4), (1e4, 1e-3)])
def test_gaussiank_sigma_is_accurate_when_the_mean_dominates(offset, spread):
    """sigma = std(acc), population, float64: a one-pass E[x^2] - E[x]^2 loses every digit when
    |mean| >> std.  The reference count is stable under a 1e-12 relative change of t, so any
    accurate mean/std (any summation order) gives it."""
    need("gaussiank")
    rng = np.random.default_rng(0)
    x = offset + rng.exponential(1.0, 100_000) * spread  # float64, skewed: c lands inside the clamp
    t = ref.gaussiank_threshold(x, 0.05)
    counts = {int(np.count_nonzero(np.abs(x) > t * (1 + e))) for e in (-1e-12, 0.0, 1e-12)}
    assert len(counts) == 1
    pos, vals = ref.gaussiank(x, 0.05)
    lo, hi = ref.gaussiank_bounds(5000)
    assert lo < pos.size < hi  # the count is the rule's, not the clamp's
    check_against("gaussiank(ratio=0.05)", x, pos, vals, what=f"gaussiank on {offset} + {spread} * Exp(1)")


# ====================================================================== dgc's loop
def test_dgc_sample_loop_and_fallbacks():
    need("dgc")
    n = 100_000
    rng = np.random.default_rng(4)
    scenarios = {}
    # sampled positions (every 24th: m = 4096, s = 24) see a heavier tail than the rest:
    # several 0.8x retries, then the exact top-k fallback
    x = rng.uniform(0, 0.3, n)
    x[::24] = rng.uniform(0, 1, x[::24].size)
    scenarios["retries-then-topk"] = (x * np.where(rng.random(n) < 0.5, -1, 1), 0.05, 0.01)
    # the sample sees only ones, the rest is tiny: all 10 retries, then keep the short set
    x = np.full(n, 1e-9)
    x[::24] = 1.0
    scenarios["ten-retries"] = (x, 0.1, 0.01)
    # a count within [0.8k, 1.3k] at once
    scenarios["normal"] = (rng.standard_normal(n), 0.01, 0.01)
    scenarios["heavy"] = (rng.standard_t(2, n), 0.01, 0.05)
    # embedding-like: thr = 0 counts everything: exact top-k
    scenarios["mostly-zero"] = (make("embedding", (n,), np.float64), 0.3, 0.01)
    # a sample of the whole array (n <= m)
    scenarios["small"] = (rng.standard_t(2, 3000), 0.01, 0.01)
    scenarios["stride-9"] = (rng.standard_t(2, n + 7), 0.01, 0.1)  # m = 10,001, s = 9
    seen = set()
    for name, (v, ratio, sample) in scenarios.items():
        for dtype in (F32, F64):
            x = v.astype(dtype)
            trace = []
            pos, vals = ref.dgc(x, ratio, sample, trace=trace)
            seen.add((name, len(trace)))
            check_against(f"dgc(ratio={ratio},sample={sample})", x, pos, vals, what=f"dgc {name} {dtype}")
    # the scenarios exercise what they claim
    lens = dict(seen)
    assert lens["ten-retries"] == 11 and lens["retries-then-topk"] >= 3


@pytest.mark.parametrize("ties, kept", [(13, 52), (14, 40)], ids=["c=1.3k", "c=1.3k+1"])
def test_dgc_upper_bound_is_strict(ties, kept):
    """n <= 4096: the sample is the whole array; thr = the 40th magnitude; c = 39 + ties."""
    need("dgc")
    x = np.full(4000, 1e-3)
    x[100:139] = 10.0  # 39 big ones
    x[1000 : 1000 + ties] = -5.0  # ties at the 40th magnitude: c = 39 + ties, k = 40
    trace = []
    pos, vals = ref.dgc(x, 0.01, 0.01, trace=trace)
    assert trace == [(5.0, 39 + ties)] and pos.size == kept
    check_against("dgc(ratio=0.01)", x, pos, vals, what=f"dgc with c = {39 + ties}, k = 40")


@pytest.mark.parametrize("q, kept, counts", [(24, 65, 2), (23, 64, 11)], ids=["c>=0.8k", "c<0.8k"])
def test_dgc_lower_bound_and_retry_arithmetic(q, kept, counts):
    """n = 8192: the sample is every 2nd element; k = 81 (0.8k = 64.8); thr = 10, then 0.8 * 10 = 8.0 exactly."""
    need("dgc")
    x = np.full(8192, 1e-3)
    x[0:82:2] = 10.0  # 41 sampled big ones: thr = 10 (ks = 41), c = 41 < 64.8
    x[1001 : 1001 + 2 * q : 2] = 8.0  # q unsampled ones that count after one retry (>= 8.0)
    trace = []
    pos, vals = ref.dgc(x, 0.01, 0.01, trace=trace)
    assert len(trace) == counts and pos.size == kept and trace[1] == (8.0, 41 + q)
    check_against("dgc(ratio=0.01)", x, pos, vals, what=f"dgc with q = {q}")


# ====================================================================== randomk
def _ints(frame):
    s = sections(frame)[SectionKind.INTS]
    assert s.count == 3 and s.bits == 64, f"ints section: {s.count} x {s.bits} bits"
    return [int(v) for v in _unpack(_section_bytes(frame, s), 64, 3)]


def test_randomk_frame_carries_seed_step_and_key_not_positions():
    need("randomk")
    x = make("heavy", (100, 37), F32)
    c = codec.get_codec("randomk(ratio=0.02,seed=12345)")
    frame = c.encode(x)
    kinds = {s.kind for s in parse_frame(frame).sections}
    assert kinds == {SectionKind.INTS, SectionKind.VALUES}, f"sections {kinds}: no index section expected"
    assert _ints(frame) == [12345, 0, ref.key_hash(None)]
    assert c.encode(x) == frame
    ef = codec.ErrorFeedback(c)
    for step in range(3):
        f = ef.encode(x, key="layer1.weight")
        assert _ints(f) == [12345, step, ref.key_hash("layer1.weight")]
    # wire size: H + 24 + value payload
    k = ref.k_of(0.02, x.size)
    assert len(frame) == header_len(c, 2, 2) + 24 + 4 * k


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 65, 1000, 4097, 100_003])
def test_randomk_positions_follow_the_generator(n):
    need("randomk")
    x = np.arange(1, n + 1, dtype=np.float64)  # no zeros: positions = nonzeros of the decoded array
    sets = {}
    for seed in (0, 1, 2**63 - 1):
        for key in (None, "a", "b", 7, ("t", 1)):
            ef = codec.ErrorFeedback(f"randomk(ratio=0.3,seed={seed})")
            for step in range(3):
                frame = ef.encode(x, key=key)
                got = np.flatnonzero(codec.decode(frame))
                want = ref.randomk_positions(n, ref.k_of(0.3, n), seed, key, step)
                assert np.array_equal(got, want), f"n={n} seed={seed} key={key!r} step={step}"
                sets[(seed, repr(key), step)] = tuple(got.tolist())
    if n >= 64:  # different seeds, keys and steps draw different sets
        assert len(set(sets.values())) == len(sets)
    # bare encode: key None, step 0
    f = codec.get_codec("randomk(ratio=0.3)").encode(x)
    assert np.array_equal(np.flatnonzero(codec.decode(f)), ref.randomk_positions(n, ref.k_of(0.3, n), 0, None, 0))


def test_randomk_scale_multiplies_by_n_over_k():
    need("randomk")
    for dtype in DTYPES:
        x = make("heavy", (333,), dtype)
        n, k = 333, ref.k_of(0.1, 333)
        pos = ref.randomk_positions(n, k, 0, None, 0)
        dec = codec.decode(codec.get_codec("randomk(ratio=0.1,scale=true)").encode(x))
        want = ref.round_to(x.astype(np.float64)[pos] * (n / k), dtype)
        assert_same(dec.reshape(-1)[pos], want, f"scaled values {dtype}")
        assert not np.any(np.delete(dec.reshape(-1).astype(np.float64), pos))


def test_randomk_scale_is_rounded_once_to_bfloat16():
    """n = 51, k = 5: 1.40625 * float64(51/5) = 14.343749999999998 (float64), just below the bfloat16
    midpoint 14.34375: rounded once it is 14.3125; through float32 it becomes the midpoint
    and ties to even (14.375)."""
    need("randomk")
    x = np.full(51, 1.40625, bfloat16)
    assert 1.40625 * (51 / 5) < 14.34375
    pos, vals = ref.randomk(x, 0.1, scale=True)
    assert vals.astype(np.float64).tolist() == [14.3125] * 5
    check_against("randomk(ratio=0.1,scale=true)", x, pos, vals)


# ====================================================================== adacomp
def test_adacomp_bin_auto_follows_ndim():
    need("adacomp")
    for shape, L in (((10, 10, 10), 50), ((1000,), 500), ((25, 40), 500), ((2, 5, 10, 10), 50), ((), 500)):
        x = make("heavy", shape, F32, seed=8)
        pos, vals, _ = ref.adacomp(x, None, L)
        check_against("adacomp", x, pos, vals, what=f"adacomp auto bin on {shape}")
        if x.size >= 1000:  # the other bin length gives another set: the check discriminates
            other = ref.adacomp(x, None, 550 - L)[0]
            assert not np.array_equal(other, pos)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_adacomp_sections_hold_scale_and_sign_bits(dtype):
    need("adacomp")
    x = make("heavy", (8, 9, 10), dtype, seed=9)
    frame = codec.get_codec("adacomp").encode(x)
    secs = sections(frame)
    assert len(secs) == 3 and SectionKind.SCALARS in secs and SectionKind.VALUES in secs, f"sections {sorted(secs)}"
    assert (SectionKind.INDEX_DELTA in secs) != (SectionKind.INDEX_BITMAP in secs)
    sc = secs[SectionKind.SCALARS]
    assert sc.count == 1 and sc.bits == 64
    (s,) = struct.unpack("<d", _section_bytes(frame, sc))
    assert s == float(ref.adacomp_scale(x, 50))
    pos, vals, _ = ref.adacomp(x, None, 50)
    v = secs[SectionKind.VALUES]
    assert v.bits == 1 and v.count == pos.size
    signs = _unpack(_section_bytes(frame, v), 1, v.count)
    assert signs.tolist() == np.signbit(x.reshape(-1)[pos].astype(np.float64)).astype(int).tolist()
    k = pos.size
    assert len(frame) == header_len(codec.get_codec("adacomp"), 3, 3) + ref.index_bytes(pos, x.size) + 8 + (k + 7) // 8


def test_adacomp_scale_is_rounded_once_to_bfloat16():
    """bin=1, G = [3, 3/256, 2**-24]: s = (3 + 3/256 + 2**-24) / 3 lies just above the bfloat16
    midpoint 1 + 2**-8, so it rounds up to 1 + 2**-7; through float32 first it would land on
    the midpoint and tie to even (1.0)."""
    need("adacomp")
    x = np.array([3.0, 3 / 256, 2.0**-24]).astype(bfloat16)
    pos, vals, _ = ref.adacomp(x, None, 1)
    assert vals.astype(np.float64).tolist() == [1.0078125] * 3
    frame = check_against("adacomp(bin=1)", x, pos, vals)
    (s,) = struct.unpack("<d", _section_bytes(frame, sections(frame)[SectionKind.SCALARS]))
    assert s == 1.0078125
    # float16: the same rule (1 + 2**-11 is the midpoint there)
    h = np.array([3.0, 3 / 2048, 2.0**-24], np.float16)
    pos, vals, _ = ref.adacomp(h, None, 1)
    assert vals.astype(np.float64).tolist() == [1 + 2**-10] * 3
    check_against("adacomp(bin=1)", h, pos, vals)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("spec, value", [("adacomp", "sign"), ("adacomp+none", "none"), ("adacomp+fp16", "fp16"), ("adacomp(bin=7)", "sign")])
@pytest.mark.parametrize("shape", [(6, 7, 8), (1001,), (499,), (51,)], ids=["3d", "1001", "499", "51"])
def test_adacomp_under_error_feedback_matches_reference(spec, value, shape, dtype):
    need(spec)
    L = 7 if "bin=7" in spec else ref.adacomp_bin(shape)
    ef = codec.ErrorFeedback(spec)
    R = np.zeros(shape, dtype)
    rng = np.random.default_rng(10)
    for step in range(20):
        dW = (rng.standard_t(2, shape) * 1e-2 * (0.5 + rng.random())).astype(dtype)
        if step % 7 == 3:
            dW.reshape(-1)[::5] = 0  # exact zeros in the gradient
        pos, vals, R_new = ref.adacomp(dW, R, L, value=value)
        frame = ef.encode(dW, key="conv")
        what = f"{spec} {dtype}{list(shape)} step {step}"
        assert_same(codec.decode(frame), ref.dense(pos, vals, shape, dtype), what + " decoded")
        assert_same(ef.residual("conv"), R_new, what + " residue")
        R = R_new


# ====================================================================== error feedback invariant, 20 steps
EF_CASES = ["topk-ratio", "topk-k", "gaussiank", "gaussiank-exact", "dgc", "randomk", "randomk-scale", "threshold"]


@pytest.mark.parametrize("suffix", ["", "+fp16", "+bf16"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", EF_CASES)
def test_error_feedback_matches_reference_loop(case, dtype, suffix):
    spec, fn = CASES[case]
    spec += suffix
    need(spec)
    value = suffix[1:] or "none"
    shape = (40, 53)
    ef = codec.ErrorFeedback(spec)
    r = np.zeros(shape, dtype)
    rng = np.random.default_rng(12)
    # with scale=true a kept element leaves acc * (1 - n/k) = -19 acc behind: it diverges, so few steps
    steps = 4 if "scale" in spec else 20
    for step in range(steps):
        x = (rng.standard_t(2, shape) * 1e-2).astype(dtype)
        acc = np.add(x, r, dtype=dtype)
        pos, vals = fn(acc, key="w", step=step)
        dec_want = ref.dense(pos, ref.code_values(vals, value, dtype), shape, dtype)
        r_want = np.subtract(acc, dec_want, dtype=dtype)
        frame = ef.encode(x, key="w")
        what = f"{spec} {dtype} step {step}"
        dec = codec.decode(frame)
        assert_same(dec, dec_want, what + " decoded")
        new = ef.residual("w")
        err = np.abs(dec.astype(np.float64) + new.astype(np.float64) - acc.astype(np.float64))
        if "scale" in spec:
            pass  # acc - acc*n/k is rounded: only the exact rounding below holds
        elif value == "none":
            assert not err.any(), f"{what}: decoded + residual != x + old residual"
            assert not np.any(new.reshape(-1)[pos]), f"{what}: residual not zero at kept positions"
        else:
            assert np.all(err <= testing.ulp(acc)), f"{what}: decoded + residual is {err.max()} from acc"
        assert_same(new, r_want, what + " residual (acc - decoded, rounded once)")
        r = r_want
    assert ef.step("w") == steps


# ====================================================================== schedules
def _warmup(start, end, steps, t, every=1):
    """docs/spec.md "Schedules": u = min(floor(t/every)*every, steps)/steps; start*(end/start)**u, end exactly at u = 1."""
    u = min((t // every) * every, steps) / steps
    return end if u >= 1 else start * (end / start) ** u


@pytest.mark.parametrize(
    "spec",
    ["topk(ratio=warmup(0.25,0.001,steps=4))", "gaussiank(ratio=warmup(0.25,0.001,steps=4),exact=true)",
     "randomk(ratio=warmup(0.25,0.001,steps=4),seed=5)", "dgc(ratio=warmup(0.25,0.001,steps=4))"],
)
def test_warmup_schedule_under_error_feedback(spec):
    need(spec)
    schedule = pytest.importorskip("codec.schedule")
    c = codec.get_codec(spec)
    sched = schedule.warmup(0.25, 0.001, steps=4)
    n = 10_007
    ef = codec.ErrorFeedback(c)
    rng = np.random.default_rng(17)
    r = np.zeros(n, np.float32)
    for step in range(6):
        ratio = _warmup(0.25, 0.001, 4, step)
        assert sched(step) == ratio, f"schedule value at step {step}: {sched(step)} != {ratio}"
        x = (rng.standard_t(2, n) * 1e-3).astype(np.float32)
        acc = x + r
        if spec.startswith("randomk"):
            pos, vals = ref.randomk(acc, ratio, 5, "w", step)
        elif spec.startswith("dgc"):
            pos, vals = ref.dgc(acc, ratio, 0.01)
        else:
            pos, vals = ref.topk(acc, ref.k_of(ratio, n))
            assert pos.size == ref.k_of(ratio, n)
        frame = ef.encode(x, key="w")
        what = f"{spec} step {step} (ratio {ratio})"
        assert kept_count(frame) == pos.size, f"{what}: kept {kept_count(frame)}, want {pos.size}"
        want = ref.dense(pos, vals, (n,), np.float32)
        assert_same(codec.decode(frame), want, what)
        r = acc - want
    assert ratio == 0.001
    # a bare encode uses step 0
    assert kept_count(c.encode(np.ones(n, np.float32))) == ref.k_of(0.25, n)


def test_threshold_step_schedule():
    schedule = pytest.importorskip("codec.schedule")  # noqa: F841
    x = np.linspace(-1, 1, 201).astype(np.float32)
    # the kept set at each step follows the value of the schedule at that step
    ef = codec.ErrorFeedback("threshold(value=step(0.5,0.1,0.01,every=2))")
    r = np.zeros_like(x)
    for t in range(8):
        value = (0.5, 0.1, 0.01)[min(t // 2, 2)]
        acc = x + r
        pos, vals = ref.threshold(acc, value)
        frame = ef.encode(x, key="k")
        want = ref.dense(pos, vals, x.shape, x.dtype)
        assert_same(codec.decode(frame), want, f"threshold schedule step {t}")
        r = acc - want


# ====================================================================== momentum
MOMENTUM_SPECS = {
    "topk(ratio=0.1)": lambda a, step: ref.topk(a, ref.k_of(0.1, a.size)),
    "gaussiank(ratio=0.1)": lambda a, step: ref.gaussiank(a, 0.1),
    "dgc(ratio=0.1)": lambda a, step: ref.dgc(a, 0.1, 0.01),
    "threshold(value=0.02)": lambda a, step: ref.threshold(a, 0.02),
    "randomk(ratio=0.1)": lambda a, step: ref.randomk(a, 0.1, 0, "m", step),
    "adacomp": "adacomp",  # the codec gets dW = u and R = residual
    "fp16": None,  # dense: everything is sent, u is zeroed everywhere
}


def momentum_update(u, g, m, dtype):
    """u = m*u + g in the array's dtype: NumPy's arithmetic for float16/32/64 (m rounded to
    the dtype, each operation rounded once), the same for bfloat16.  (The docs do not say
    in which precision u is formed; this is the natural reading.)"""
    mm = np.array(m).astype(dtype)
    return np.add(np.multiply(u, mm, dtype=dtype), g, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("spec", list(MOMENTUM_SPECS))
def test_momentum_correction_and_masking(spec, dtype):
    need(spec)
    ef = codec.ErrorFeedback(spec, momentum=0.9)
    fn = MOMENTUM_SPECS[spec]
    shape = (30, 41)
    u = np.zeros(shape, dtype)
    r = np.zeros(shape, dtype)
    rng = np.random.default_rng(13)
    for step in range(10):
        g = (rng.standard_normal(shape) * 1e-2).astype(dtype)
        u = momentum_update(u, g, 0.9, dtype)
        mask = np.zeros(u.size, bool)
        if fn == "adacomp":
            pos, vals, r_next = ref.adacomp(u, r, 500)
            dec_want = ref.dense(pos, vals, shape, dtype)
            mask[pos] = True
        else:
            acc = np.add(r, u, dtype=dtype)
            if fn is None:
                dec_want = ref.code_values(acc, "fp16", dtype).reshape(shape)
                mask[:] = True
            else:
                pos, vals = fn(acc, step)
                dec_want = ref.dense(pos, vals, shape, dtype)
                mask[pos] = True
            r_next = np.subtract(acc, dec_want, dtype=dtype)
        frame = ef.encode(g, key="m")
        what = f"{spec} momentum step {step}"
        assert_same(codec.decode(frame), dec_want, what + " decoded")
        assert_same(ef.residual("m"), r_next, what + " residual")
        r = r_next
        u.reshape(-1)[mask] = 0


def test_momentum_state_survives_checkpoints_and_errors():
    need("topk")
    rng = np.random.default_rng(20)
    xs = [(rng.standard_normal(500) * 1e-2).astype(np.float32) for _ in range(8)]
    full = codec.ErrorFeedback("topk(ratio=0.05)", momentum=0.9)
    want = [full.encode(x, key="p") for x in xs]
    ef = codec.ErrorFeedback("topk(ratio=0.05)", momentum=0.9)
    for x in xs[:4]:
        ef.encode(x, key="p")
    restored = codec.ErrorFeedback("topk(ratio=0.05)", momentum=0.9)
    restored.load_state_dict(pickle.loads(pickle.dumps(ef.state_dict())))
    clone = pickle.loads(pickle.dumps(ef))
    bad = xs[4].copy()
    bad[7] = np.nan
    with pytest.raises(ValueError, match=re_escape("(7,)")):
        ef.encode(bad, key="p")  # a failed step changes neither residual nor momentum
    for i, x in enumerate(xs[4:], 4):
        assert restored.encode(x, key="p") == want[i], f"restored step {i}"
        assert clone.encode(x, key="p") == want[i], f"pickled step {i}"
        assert ef.encode(x, key="p") == want[i], f"after a failed step, step {i}"
    # momentum 0 is plain error feedback
    plain, zero = codec.ErrorFeedback("topk(ratio=0.05)"), codec.ErrorFeedback("topk(ratio=0.05)", momentum=0.0)
    assert [plain.encode(x, key=1) for x in xs] == [zero.encode(x, key=1) for x in xs]
    for bad_m in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match="momentum"):
            codec.ErrorFeedback("topk", momentum=bad_m)


# ====================================================================== determinism across thread counts
def test_frames_and_residuals_do_not_depend_on_thread_count():
    runs = [
        ("topk(ratio=0.01)", "float32"),
        ("gaussiank(ratio=0.01)", "float32"),
        ("adacomp", "float32"),
        ("dgc(ratio=0.01)", "float32"),
        ("randomk(ratio=0.01)", "float32"),
        ("topk(ratio=0.001)", "float64"),
        ("gaussiank(ratio=0.01)", "bfloat16"),
        ("adacomp", "float16"),
    ]
    runs = [(s, d) for s, d in runs if _ok(s)]
    if not runs:
        pytest.skip("no sparsifier registered yet")
    script = (
        "import hashlib, sys, numpy as np, codec\n"
        "from codec.dtypes import bfloat16\n"
        "h = hashlib.sha256()\n"
        f"for spec, dt in {runs!r}:\n"
        "    rng = np.random.default_rng(5)\n"
        "    ef = codec.ErrorFeedback(spec)\n"
        "    for step in range(3):\n"
        "        x = (rng.standard_t(2, 300_000) * 1e-3).astype(bfloat16 if dt == 'bfloat16' else dt)\n"
        "        h.update(ef.encode(x, key='w'))\n"
        "        h.update(ef.residual('w').tobytes())\n"
        "sys.stdout.write(h.hexdigest())\n"
    )
    digest = same_across_threads(script)  # equal under NUMBA_NUM_THREADS=1 and 2 (asserted there)
    assert len(digest) == 64, f"no SHA-256 digest of the frames and residuals ({runs}): {digest[:200]!r}"


def _ok(spec) -> bool:
    return all(p.split("(")[0] in _registered() for p in spec.split("+"))


# ====================================================================== wire size
WIRE_CASES = ["topk-ratio", "topk-k", "gaussiank", "dgc", "threshold", "randomk", "randomk-scale", "adacomp"]


@pytest.mark.parametrize("value", ["none", "fp16", "bf16"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", WIRE_CASES)
def test_wire_size_formula(case, dtype, value):
    spec, fn = CASES[case]
    if value != "none" or case == "adacomp":  # (adacomp's default sign-bit values: the next test)
        spec += "+" + value
    need(spec)
    c = codec.get_codec(spec)
    for kind, shape in (("heavy", (0,)), ("heavy", (1,)), ("heavy", (64, 65)), ("embedding", (5000,)), ("normal", (3, 4, 5))):
        x = make(kind, shape, dtype, seed=14)
        frame = c.encode(x)
        n = x.size
        if case == "adacomp":
            pos = ref.adacomp(x, None, ref.adacomp_bin(shape))[0]
            k = pos.size
            if value == "none":  # explicit value stages: index + values
                payload, nsec = ref.index_bytes(pos, n) + k * dtype.itemsize, 2
            elif value in ("fp16", "bf16"):
                payload, nsec = ref.index_bytes(pos, n) + 2 * k, 2
        else:
            pos, _ = fn(x)
            k = pos.size
            vbytes = dtype.itemsize if value == "none" else 2
            if case.startswith("randomk"):
                payload, nsec = 24 + k * vbytes, 2
            else:
                payload, nsec = ref.index_bytes(pos, n) + k * vbytes, 2
        want = header_len(c, x.ndim, nsec) + payload
        assert len(frame) == want, f"{spec} on {kind}{list(shape)} {dtype}: {len(frame)} bytes, formula {want} (k={k})"


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_wire_size_adacomp_default_values(dtype):
    need("adacomp")
    c = codec.get_codec("adacomp")
    for kind, shape in (("heavy", (0,)), ("heavy", (1,)), ("heavy", (64, 65)), ("embedding", (5000,)), ("normal", (3, 4, 5))):
        x = make(kind, shape, dtype, seed=14)
        pos = ref.adacomp(x, None, ref.adacomp_bin(shape))[0]
        k = pos.size
        want = header_len(c, x.ndim, 3) + ref.index_bytes(pos, x.size) + 8 + (k + 7) // 8
        assert len(c.encode(x)) == want, f"adacomp {kind}{list(shape)} {dtype}"


# ====================================================================== parameters
@pytest.mark.parametrize(
    "spec",
    [
        "topk(ratio=0.1,k=5)",
        "topk(ratio=0)",
        "topk(ratio=1.5)",
        "gaussiank(ratio=0)",
        "gaussiank(ratio=2)",
        "dgc(ratio=0)",
        "dgc(sample=0)",
        "dgc(sample=1.5)",
        "randomk(ratio=0)",
        "randomk(seed=-1)",
        f"randomk(seed={2**63})",
        "adacomp(bin=0)",
        "threshold(value=-1)",
    ],
)
def test_bad_parameters_raise_value_error(spec):
    need(spec)
    with pytest.raises(ValueError):
        codec.get_codec(spec)


@pytest.mark.parametrize(
    "spec, canonical",
    [
        ("topk(ratio=0.01)", "topk"),
        ("gaussiank(ratio=0.01,exact=false)", "gaussiank"),
        ("dgc(ratio=0.01,sample=0.01)", "dgc"),
        ("randomk(ratio=0.01,seed=0,scale=false)", "randomk"),
        ("adacomp(bin=auto)", "adacomp"),
        ("threshold(value=0.0)", "threshold"),
    ],
)
def test_defaults_are_dropped_from_the_canonical_spec(spec, canonical):
    need(spec)
    assert codec.get_codec(spec).spec == canonical
    assert codec.get_codec(spec) == codec.get_codec(canonical)


def test_default_ratio_and_k_clipping():
    need("topk")
    x = make("normal", (1000,), F32)
    assert kept_count(codec.get_codec("topk").encode(x)) == 10  # ratio 0.01 by default
    assert kept_count(codec.get_codec("topk(k=2000)").encode(x)) == 1000  # k clipped to n
    assert codec.get_codec("adacomp+none").spec == "adacomp+none"  # an explicit value stage stays


# ====================================================================== big arrays (a handful; seconds, not minutes)
BIG = 10**6 + 3


@pytest.fixture(scope="module")
def big_heavy():
    return (np.random.default_rng(15).standard_t(2, BIG) * 1e-3).astype(np.float32)


@pytest.mark.parametrize(
    "spec, fn",
    [
        ("topk(ratio=0.001)", lambda a: ref.topk(a, ref.k_of(0.001, a.size))),
        ("gaussiank(ratio=0.01)", lambda a: ref.gaussiank(a, 0.01)),
        ("dgc(ratio=0.001)", lambda a: ref.dgc(a, 0.001, 0.01)),
        ("randomk(ratio=0.01,seed=9)", lambda a: ref.randomk(a, 0.01, 9)),
        ("adacomp", lambda a: ref.adacomp(a)[:2]),
    ],
    ids=["topk", "gaussiank", "dgc", "randomk", "adacomp"],
)
def test_big_array(spec, fn, big_heavy):
    need(spec)
    pos, vals = fn(big_heavy)
    check_against(spec, big_heavy, pos, vals, what=f"{spec} on {BIG} float32")


def test_big_array_float64_and_bf16_topk():
    need("topk")
    x = (np.random.default_rng(16).standard_normal(BIG)).astype(np.float64)
    x[::1000] = 4.5  # 1001 ties across the whole array, above all but a few normal values
    pos, vals = ref.topk(x, 500)
    assert np.count_nonzero(vals == 4.5) > 400
    check_against("topk(k=500)", x, pos, vals)
    b = x.astype(bfloat16)
    pos, vals = ref.topk(b, 5000)
    check_against("topk(k=5000)", b, pos, vals)


def _adversarial(kind: str) -> np.ndarray:
    """Arrays that a strided sample of |acc| misjudges (stride n // 65536 = 15 here)."""
    rng = np.random.default_rng(18)
    x = rng.standard_normal(BIG) * 1e-3
    if kind == "hidden-spikes":  # 30,000 large values in one chunk, none at a multiple of 15
        idx = np.arange(200_000, 232_000)
        idx = idx[idx % 15 != 0][:30_000]
        x[idx] = rng.uniform(1, 2, idx.size) * np.sign(rng.standard_normal(idx.size))
    elif kind == "sampled-spikes":  # the sample sees only spikes, the rest is small
        x[::15] = rng.uniform(1, 2, x[::15].size)
    elif kind == "tied":  # a third of the array ties at the top magnitude
        x = rng.integers(-1, 2, BIG) * 0.5
    return x.astype(np.float32)


@pytest.mark.parametrize("kind", ["hidden-spikes", "sampled-spikes", "tied"])
def test_big_arrays_the_sample_misjudges(kind):
    x = _adversarial(kind)
    cases = [
        ("topk(ratio=0.001)", lambda a: ref.topk(a, ref.k_of(0.001, a.size))),
        ("topk(ratio=0.05)", lambda a: ref.topk(a, ref.k_of(0.05, a.size))),
        ("gaussiank(ratio=0.01)", lambda a: ref.gaussiank(a, 0.01)),
        ("dgc(ratio=0.01)", lambda a: ref.dgc(a, 0.01, 0.01)),
        ("threshold(value=0.9)", lambda a: ref.threshold(a, 0.9)),
    ]
    for spec, fn in cases:
        need(spec)
        pos, vals = fn(x)
        check_against(spec, x, pos, vals, what=f"{spec} on {kind}")


def test_big_adacomp_bins():
    need("adacomp")
    x = (np.random.default_rng(19).standard_t(2, BIG) * 1e-3).astype(np.float32)
    for spec, shape, L in (("adacomp", (1, 1, BIG), 50), ("adacomp(bin=7)", (BIG,), 7), ("adacomp(bin=65537)", (BIG,), 65537)):
        pos, vals, _ = ref.adacomp(x.reshape(shape), None, L)
        check_against(spec, x.reshape(shape), pos, vals, what=f"{spec} on {shape}")


@pytest.mark.parametrize(
    "spec",
    ["topk(ratio=0.01)", "gaussiank(ratio=0.01)", "dgc(ratio=0.01)", "adacomp", "threshold(value=0.9)"],
)
def test_big_error_feedback_on_data_the_sample_misjudges(spec):
    """Three steps of 10**6+3 elements under ErrorFeedback (acc formed inside the selection
    pass, chunks that overflow their room and run again) against the reference loop."""
    need(spec)
    steps = [_adversarial("tied"), _adversarial("hidden-spikes"), _adversarial("sampled-spikes")]
    ef = codec.ErrorFeedback(spec)
    r = np.zeros(BIG, np.float32)
    for step, x in enumerate(steps):
        if spec == "adacomp":
            pos, vals, r_next = ref.adacomp(x, r, 500)
            want = ref.dense(pos, vals, x.shape, x.dtype)
        else:
            acc = x + r
            name, _, arg = spec.partition("(")
            val = float(arg.split("=")[1].rstrip(")"))
            pos, vals = {"topk": lambda a: ref.topk(a, ref.k_of(val, a.size)), "gaussiank": lambda a: ref.gaussiank(a, val),
                         "dgc": lambda a: ref.dgc(a, val, 0.01), "threshold": lambda a: ref.threshold(a, val)}[name](acc)
            want = ref.dense(pos, vals, x.shape, x.dtype)
            r_next = acc - want
        frame = ef.encode(x, key="big")
        assert_same(codec.decode(frame), want, f"{spec} step {step} decoded")
        assert_same(ef.residual("big"), r_next, f"{spec} step {step} residual")
        r = r_next
