"""The ``fft`` transform stage (docs/codecs.md, "Transform stages") against a plain NumPy/scipy reference.

Every check goes through the public API (``get_codec``, ``encode`` with ``step=``,
``decode``, ``decode_add``, ``ErrorFeedback``, ``parse_frame``) and compares with
``tests/reference/spectral.py``: the kept spectrum positions read from the frame's index section
and the kept ``re, im`` values (value stage ``none``) must equal the reference's bit for
bit, and so must the decoded array.  Properties: ``theta=0`` reproduces the input within FFT
rounding, the squared error equals the dropped coefficients' energy (Parseval), schedules
of ``theta`` keep what they say at every step.  The kernels of
the ``spectral`` family are checked directly, on every backend (the ``backend`` fixture): serial and parallel twins, thread
counts, ties at the cut, non-finite rows.
"""

from __future__ import annotations

import pickle
from fractions import Fraction

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import codec
from codec import testing
from codec.testing import assert_identical as assert_same
from codec.dtypes import bfloat16
from codec.frame import SectionKind, parse_frame
from codec.kernels import module
from codec.pack import decode_indices
from codec.testing import check_decode_add, check_error_feedback, sample_arrays

from reference import spectral as ref

F16, BF16, F32, F64 = np.dtype(np.float16), np.dtype(bfloat16), np.dtype(np.float32), np.dtype(np.float64)
DTYPES = [F32, F64, F16, BF16]
DT_IDS = ["f32", "f64", "f16", "bf16"]
BLOCKS = [1, 2, 3, 7, 8, 16, 4096, 0]
KEEPS = ["per_block", "global"]
#: random data, then arrays whose spectra hold many exactly equal magnitudes
KINDS = ["normal", "heavy", "zeros", "const", "delta", "periodic", "sym"]
THETAS = [0.9, 0.5, 0.0, 1.0, 0.37, 0.75]


# ====================================================================== helpers
def sizes(block: int) -> list[int]:
    base = block or 64  # block=0: one block of the whole array
    return sorted({0, 1, 2, 5, base - 1, base, base + 1, 3 * base + 5})


def make(kind: str, n: int, dtype, block: int = 0, seed: int = 0) -> np.ndarray:
    """Test data; the tie kinds are exact in every dtype (small integers and powers of two)."""
    rng = np.random.default_rng([seed, KINDS.index(kind), n, block])
    b = n if block == 0 or block >= n else block
    if kind == "normal":
        v = rng.standard_normal(n)
    elif kind == "heavy":
        v = rng.standard_t(2, n) * 1e-3
    elif kind == "zeros":  # every magnitude 0: all ties
        v = np.zeros(n)
    elif kind == "const":  # DC only; most magnitudes 0
        v = np.full(n, 1.5)
    elif kind == "delta":  # a power of two at every block start: every coefficient of a block has one magnitude
        v = np.zeros(n)
        if n:
            starts = np.arange(0, n, b)
            v[starts] = np.ldexp(rng.choice([-1.0, 1.0], starts.size), rng.integers(-2, 2, starts.size))
    elif kind == "periodic":  # period 4: spectra at DC, L/4, L/2 only (exactly, for L divisible by 4)
        v = np.resize([1.0, 0.0, -1.0, 0.0], n) + np.resize([0.5, 0.5, 0.5, 0.5], n)
    elif kind == "sym":  # small integers, symmetric blocks: real spectra with repeated magnitudes
        v = rng.integers(-2, 3, n).astype(np.float64)
        for s in range(0, n, max(b, 1)):
            row = v[s : s + b]
            row[1:] = (row[1:] + row[1:][::-1]) / 2
    else:
        raise ValueError(kind)
    return np.asarray(v).astype(dtype)


def spec_of(theta, block: int, keep: str = "per_block", value: str = "none") -> str:
    return f"fft(theta={theta!r},block={block},keep={keep})" + (f"+{value}" if value else "")


def frame_parts(frame: bytes, block: int):
    """(positions, values, frame) read from an ``fft(...)+none`` frame: the index section
    through the shared index coder (over the spectrum size), the values section raw."""
    fr = parse_frame(frame)
    assert len(fr.sections) == 2, f"sections {[s.kind_name for s in fr.sections]}"
    idx, vals = fr.sections
    assert idx.kind in (SectionKind.INDEX_DELTA, SectionKind.INDEX_BITMAP), idx.kind_name
    assert vals.kind == SectionKind.VALUES, vals.kind_name
    dt = ref.domain_dtype(fr.dtype)
    assert vals.bits == 8 * dt.itemsize, f"values section has {vals.bits}-bit items, want {8 * dt.itemsize}"
    pos = decode_indices(idx, fr.raw(0), ref.spectrum_size(fr.n, block))
    v = fr.raw(1).view(dt)
    assert vals.count == v.size == 2 * pos.size, f"{vals.count} values for {pos.size} positions"
    return pos, v, fr


def expected_kept(n: int, block: int, theta: float, keep: str) -> int:
    if keep == "global":
        return ref.kept_count(ref.spectrum_size(n, block), theta)
    return sum(ref.kept_count(c, theta) for _, c in ref.coefficients(n, block))


# ====================================================================== the reference itself
def test_reference_layout_and_top():
    """The reference's own layout rules and top-k (against a pure-Python sort), so the tests
    below compare with something that follows the documented rules."""
    assert ref.blocks(0, 8) == [] and ref.blocks(5, 0) == [(0, 5)] and ref.blocks(5, 8) == [(0, 5)] and ref.blocks(5, 5) == [(0, 5)]
    assert ref.blocks(17, 8) == [(0, 8), (8, 8), (16, 1)] and ref.blocks(16, 8) == [(0, 8), (8, 8)]
    assert ref.coefficients(17, 8) == [(0, 5), (5, 5), (10, 1)] and ref.spectrum_size(17, 8) == 11
    assert ref.spectrum_size(7, 0) == 4 and ref.spectrum_size(0, 0) == 0
    # 25M float32 at theta=0.9, block 4096: 6103 full blocks keep 205 each, the tail of 2112
    # elements (1057 coefficients) keeps 106 (docs/codecs.md's example says 212)
    assert expected_kept(25_000_000, 4096, 0.9, "per_block") == 6103 * 205 + 106 == 1_251_221
    assert ref.kept_count(10, 0.3) == 7 and ref.kept_count(10, 0.7) == 3 and ref.kept_count(100, 0.29) == 72
    w = ref.energy_weights(7, 4)  # blocks of 4 (c=3: 1/4, 2/4, 1/4) and 3 (c=2: 1/3, 2/3)
    assert np.array_equal(w, [0.25, 0.5, 0.25, 1 / 3, 2 / 3])
    rng = np.random.default_rng(5)
    for trial in range(50):
        c = int(rng.integers(0, 40))
        mag = rng.integers(0, 4, c).astype(np.float64) * (0.5 if trial % 2 else 1.0)
        for k in {0, c // 3, c // 2, c}:
            assert np.array_equal(ref.top(mag, k), ref.top_brute(mag, k)), (mag, k)


# ====================================================================== 1. positions and values
@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("keep", KEEPS)
def test_frame_matches_reference(keep, dtype, block):
    """Kept positions (the index section, over the spectrum) and values (``re, im`` in
    position order, bit-identical to scipy's rfft) for every size around the block, random
    and heavy-tailed data and arrays full of tied magnitudes, several theta."""
    i = 0
    for kind in KINDS:
        for n in sizes(block):
            x = make(kind, n, dtype, block)
            for theta in (0.9, THETAS[1 + i % (len(THETAS) - 1)]):
                i += 1
                frame = codec.get_codec(spec_of(theta, block, keep)).encode(x)
                pos, vals, fr = frame_parts(frame, block)
                want_pos, want_vals = ref.encode(x, theta, block, keep)
                what = f"{kind} n={n} theta={theta}"
                assert fr.dtype == dtype and fr.shape == (n,), what
                assert pos.size == expected_kept(n, block, theta, keep), f"{what}: kept {pos.size}"
                assert np.array_equal(pos, want_pos), f"{what}: positions {pos.tolist()[:20]}, want {want_pos.tolist()[:20]}"
                assert_same(vals, want_vals, f"{what}: kept values")


@pytest.mark.parametrize("keep", KEEPS)
def test_ties_go_to_the_lower_index(keep):
    """Rows of equal magnitudes keep their first coefficients; across blocks (global) the
    earlier block wins."""
    block, n = 16, 16 * 5 + 6
    x = np.zeros(n, np.float32)
    x[::block] = 1.0  # every block: all 9 (tail: 4) coefficients = 1 + 0j
    for theta in (0.5, 0.9, 0.1):
        pos, vals, _ = frame_parts(codec.get_codec(spec_of(theta, block, keep)).encode(x), block)
        if keep == "per_block":
            k, kt = ref.kept_count(9, theta), ref.kept_count(4, theta)
            want = np.concatenate([b * 9 + np.arange(k) for b in range(5)] + [45 + np.arange(kt)])
        else:
            want = np.arange(ref.kept_count(49, theta))
        assert np.array_equal(pos, want), f"theta={theta}: {pos.tolist()}"
        assert np.array_equal(vals, np.tile([1.0, 0.0], pos.size).astype(np.float32))


@pytest.mark.parametrize("keep", KEEPS)
def test_kept_count_is_a_float64_floor(keep):
    """``c - floor(theta*c)`` with ``theta*c`` rounded in float64, at products that land on or
    next to an integer (not exact decimals, not a float32 theta): 0.9*10 == 9.0,
    0.29*100 == 28.999999999999996 (floor 28), 0.57*100 == 56.99999999999999 (floor 56)."""
    cases = [  # (theta, block length L -> c = L//2 + 1, kept per block, kept of the two blocks' 2c)
        (0.9, 18, 1, 2), (0.7, 18, 3, 6), (0.3, 18, 7, 14), (0.6, 18, 4, 8), (0.1, 18, 9, 18),
        (0.29, 198, 72, 143), (0.57, 198, 44, 87), (0.58, 198, 43, 85), (0.15, 38, 17, 34), (0.35, 38, 13, 26),
    ]
    for theta, length, k, k_global in cases:
        x = make("normal", 2 * length, F32, seed=18)
        pos, _, _ = frame_parts(codec.get_codec(spec_of(theta, length, keep)).encode(x), length)
        want = 2 * k if keep == "per_block" else k_global
        assert pos.size == want, f"theta={theta} L={length}: kept {pos.size}, want {want}"


def test_multidimensional_input_is_flattened():
    x = make("normal", 3 * 5 * 7, F32).reshape(3, 5, 7)
    c = codec.get_codec(spec_of(0.6, 8, "global"))
    frame = c.encode(x)
    pos, vals, fr = frame_parts(frame, 8)
    want_pos, want_vals = ref.encode(x, 0.6, 8, "global")
    assert fr.shape == (3, 5, 7) and np.array_equal(pos, want_pos)
    assert_same(vals, want_vals, "values")
    assert_same(codec.decode(frame), ref.decode(want_pos, want_vals, x.size, 8, F32).reshape(3, 5, 7), "decoded")
    assert c.encode(np.asfortranarray(x)) == frame, "a Fortran-ordered copy encodes differently"


# ====================================================================== 2. decode
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("keep", KEEPS)
def test_decode_matches_reference(keep, dtype):
    """decode(frame), Codec.decode and decode(out=) equal the reference inverse bit for bit
    (zero spectrum, kept coefficients placed, scipy irfft per block, rounded to 16-bit frames)."""
    i = 0
    for block in BLOCKS:
        for n in sizes(block):
            for kind in ("normal", "heavy", "delta", "sym"):
                theta = THETAS[i % len(THETAS)]
                i += 1
                x = make(kind, n, dtype, block, seed=1)
                c = codec.get_codec(spec_of(theta, block, keep))
                frame = c.encode(x)
                pos, vals = ref.encode(x, theta, block, keep)
                want = ref.decode(pos, vals, n, block, dtype)
                what = f"block={block} {kind} n={n} theta={theta}"
                got = codec.decode(frame)
                assert_same(got, want, what)
                assert_same(c.decode(frame), want, what + " (Codec.decode)")
                out = np.full(n, 3, dtype)
                assert c.decode(frame, out=out) is out
                assert_same(out, want, what + " (out=)")


def test_decode_big_tensor():
    """100k float32 elements, default block 4096 (24 full blocks and a tail): positions,
    values and the decoded array against the reference."""
    n = 100_003
    x = make("heavy", n, F32, seed=3)
    c = codec.get_codec("fft(theta=0.8)+none")
    frame = c.encode(x)
    pos, vals, _ = frame_parts(frame, 4096)
    want_pos, want_vals = ref.encode(x, 0.8, 4096, "per_block")
    assert np.array_equal(pos, want_pos) and pos.size == 24 * (2049 - 1639) + (850 - 680)
    assert_same(vals, want_vals, "values")
    assert_same(codec.decode(frame), ref.decode(want_pos, want_vals, n, 4096, F32), "decoded")


def test_value_stage_codes_the_coefficients():
    """Any value stage codes the interleaved coefficients: fp16 rounds the reference values
    once; the default is rangefloat, whose decode stays close to the +none decode."""
    x = make("normal", 200, F32, seed=4)
    pos, vals = ref.encode(x, 0.5, 16, "per_block")
    fr = parse_frame(codec.get_codec(spec_of(0.5, 16, value="fp16")).encode(x))
    assert fr.sections[1].kind == SectionKind.VALUES and fr.sections[1].bits == 16
    assert np.array_equal(decode_indices(fr.sections[0], fr.raw(0), ref.spectrum_size(200, 16)), pos)
    assert_same(fr.raw(1).view(np.float16), vals.astype(np.float16), "fp16 values")
    dec = codec.decode(codec.get_codec(spec_of(0.5, 16, value="fp16")).encode(x))
    assert_same(dec, ref.decode(pos, vals.astype(np.float16).astype(np.float32), 200, 16, F32), "fp16 decode")
    c = codec.get_codec("fft(theta=0.5,block=16)")
    assert c.spec == "fft(theta=0.5,block=16)" and c.value.name == "rangefloat" and not c.lossless
    exact = ref.decode(pos, vals, 200, 16, F32)
    approx = codec.decode(c.encode(x))
    assert 0 < np.linalg.norm(approx - exact) <= 0.1 * np.linalg.norm(exact)


# ====================================================================== 3. theta = 0
@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
def test_theta_zero_reproduces_input(dtype):
    tol = 2e-6 if dtype == F32 else 1e-14
    for block in BLOCKS:
        for n in sizes(block):
            for kind in ("normal", "heavy"):
                x = make(kind, n, dtype, block, seed=5)
                frame = codec.get_codec(spec_of(0, block)).encode(x)
                pos, _, _ = frame_parts(frame, block)
                assert np.array_equal(pos, np.arange(ref.spectrum_size(n, block))), f"block={block} n={n}: not every coefficient kept"
                y = codec.decode(frame)
                err = np.linalg.norm(y.astype(np.float64) - x.astype(np.float64))
                assert err <= tol * np.linalg.norm(x.astype(np.float64)), f"block={block} {kind} n={n}: relative error {err / np.linalg.norm(x)}"


def test_theta_zero_big_and_theta_one_zeros():
    x = make("normal", 100_000, F32, seed=6)
    y = codec.decode(codec.get_codec("fft(theta=0)+none").encode(x))
    assert np.linalg.norm(y - x) <= 1e-6 * np.linalg.norm(x)
    for keep in KEEPS:
        frame = codec.get_codec(spec_of(1.0, 64, keep)).encode(x[:1000])
        pos, vals, _ = frame_parts(frame, 64)
        assert pos.size == 0 and vals.size == 0
        assert_same(codec.decode(frame), np.zeros(1000, np.float32), "theta=1 decodes to zeros")


# ====================================================================== 4. Parseval
def _parseval_check(x, theta, block, keep):
    frame = codec.get_codec(spec_of(theta, block, keep)).encode(x)
    pos, _, _ = frame_parts(frame, block)
    assert pos.size == expected_kept(x.size, block, theta, keep)
    y = codec.decode(frame)
    err2 = float(np.sum((x - y) ** 2))
    drop = ref.dropped_energy(x, pos, block)
    total = float(np.sum(x * x))
    assert abs(err2 - drop) <= 1e-11 * total + 1e-300, f"||x - decode||^2 = {err2}, dropped energy {drop} (||x||^2 = {total})"
    return err2, drop, total


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(0, 400),
    block=st.one_of(st.integers(0, 40), st.sampled_from([64, 127, 128, 4096])),
    theta=st.floats(0.0, 1.0),
    keep=st.sampled_from(KEEPS),
    seed=st.integers(0, 2**32 - 1),
    scale=st.sampled_from([1.0, 1e-3, 1e6]),
)
def test_parseval_dropped_energy(n, block, theta, keep, seed, scale):
    """With +none, ||x - decode||^2 is the energy of the dropped coefficients (float64 input)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * scale
    err2, drop, total = _parseval_check(x, theta, block, keep)
    if theta == 0:
        assert err2 <= 1e-20 * total + 1e-300


def test_parseval_big_and_selection_is_by_magnitude():
    """100k float64 elements in default blocks; and no swap of a kept with a dropped
    coefficient of the same block could have kept more magnitude."""
    x = make("heavy", 100_000, F64, seed=7)
    _parseval_check(x, 0.9, 4096, "per_block")
    x = make("normal", 300, F64, seed=8)
    frame = codec.get_codec(spec_of(0.7, 32)).encode(x)
    pos, _, _ = frame_parts(frame, 32)
    mag = ref.magnitudes(ref.spectrum(x, 32))
    for base, c in ref.coefficients(300, 32):
        inside = (pos >= base) & (pos < base + c)
        kept = np.zeros(c, bool)
        kept[pos[inside] - base] = True
        m = mag[base : base + c]
        assert kept.sum() == ref.kept_count(c, 0.7) and m[kept].min() >= m[~kept].max()


@pytest.mark.parametrize("block", [1, 2, 3, 8, 4096])
def test_float64_frames_with_many_kept_coefficients_decode(block):
    """A float64 frame sends 16 bytes per kept coefficient, and small blocks have up to one
    coefficient per element (block 1 and 2), so the values section can be ~16n bytes: every
    frame the encoder makes must decode (and error feedback, which decodes its own frame,
    must work)."""
    n = 300 if block < 4096 else 65 * 4096 + 100  # 16 bytes per coefficient, 2049 per 4096 elements
    x = make("normal", n, F64, seed=17)
    c = codec.get_codec(spec_of(0.0, block))
    frame = c.encode(x)
    want_pos, want_vals = ref.encode(x, 0.0, block, "per_block")
    assert_same(codec.decode(frame), ref.decode(want_pos, want_vals, n, block, F64), f"block={block} n={n}")
    ef = codec.ErrorFeedback(c)
    ef.encode(x, key="k")
    assert np.all(np.abs(np.array(ef.residual("k"))) <= 1e-12 * np.abs(x).max())


# ====================================================================== 5. schedules and error feedback
def exp_schedule(start, end, steps, t):
    u = min(t, steps) / steps
    return end if u == 1 else start * (end / start) ** u


@pytest.mark.parametrize("keep", KEEPS)
def test_scheduled_theta(keep):
    """Frames at step s keep what theta(s) says; they decode with the frame alone."""
    c = codec.get_codec(f"fft(theta=exp(0.9,0.5,steps=3),block=16,keep={keep})+none")
    x = make("normal", 16 * 6 + 9, F32, seed=9)
    counts = []
    for s in range(6):
        theta = exp_schedule(0.9, 0.5, 3, s)
        frame = c.encode(x, step=s)
        pos, vals, _ = frame_parts(frame, 16)
        want_pos, want_vals = ref.encode(x, theta, 16, keep)
        assert pos.size == expected_kept(x.size, 16, theta, keep), f"step {s}: kept {pos.size}"
        assert np.array_equal(pos, want_pos) and vals.tobytes() == want_vals.tobytes(), f"step {s}"
        assert_same(codec.decode(frame), ref.decode(want_pos, want_vals, x.size, 16, F32), f"step {s}: decoded")
        counts.append(pos.size)
    assert counts[0] < counts[1] < counts[2] < counts[3] == counts[4] == counts[5], counts
    assert c.encode(x) == c.encode(x, step=0) != c.encode(x, step=1)


@pytest.mark.parametrize("spec", ["fft(theta=exp(0.9,0.5,steps=3),block=8)+none", "fft(theta=0.6,block=5,keep=global)+none", "fft(theta=0.7,block=16)"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_error_feedback(spec, dtype):
    """decoded + new residual == x + old residual within 1 ulp for several steps; the
    scheduled theta follows the key's step count; the state survives state_dict and pickle."""
    c = codec.get_codec(spec)
    ef = codec.ErrorFeedback(c)
    rng = np.random.default_rng(10)
    shape = (7, 13)
    old = np.zeros(shape, dtype)
    for step in range(5):
        x = rng.standard_normal(shape).astype(dtype)
        acc = np.add(x, old, dtype=dtype)
        frame = ef.encode(x, key="w")
        dec = codec.decode(frame)
        new = np.array(ef.residual("w"))
        assert dec.shape == shape and new.dtype == dtype
        err = np.abs(dec.astype(np.float64) + new.astype(np.float64) - acc.astype(np.float64))
        bound = np.maximum(testing.ulp(acc), testing.ulp(new))
        assert np.all(err <= bound), f"step {step}: decoded + residual is {err.max()} from x + old residual"
        assert np.any(new != 0), f"step {step}: nothing dropped?"
        if c.value.name == "none":  # the frame is what encode(acc, step) makes
            assert frame == c.encode(acc, step=step), f"step {step}: the frame is not encode(x + residual, step)"
        old = new
    assert ef.step("w") == 5
    ef2 = codec.ErrorFeedback(spec)
    ef2.load_state_dict(ef.state_dict())
    ef3 = pickle.loads(pickle.dumps(ef))
    assert_same(np.array(ef2.residual("w")), old, "restored residual") and ef2.step("w") == 5
    x = rng.standard_normal(shape).astype(dtype)
    f1 = ef.encode(x, key="w")
    assert ef2.encode(x, key="w") == f1 == ef3.encode(x, key="w")
    assert_same(np.array(ef2.residual("w")), np.array(ef.residual("w")), "residual after a restored step")


@pytest.mark.parametrize("spec", ["fft(theta=0.5,block=8)+none", "fft(theta=0.7,block=16,keep=global)+none+zstd", "fft(theta=exp(0.9,0.5,steps=3),block=7)"])
def test_error_feedback_conformance(spec):
    for arr in sample_arrays()[3:6] + sample_arrays()[-2:]:
        check_error_feedback(spec, arr)


# ====================================================================== 6. errors
@pytest.mark.parametrize("keep", KEEPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_nonfinite_input_raises(keep, dtype):
    c = codec.get_codec(spec_of(0.5, 8, keep))
    for bad, where in ((np.nan, 13), (np.inf, 0), (-np.inf, 39)):
        x = make("normal", 40, dtype).reshape(5, 8)
        x.reshape(-1)[where] = bad
        x.reshape(-1)[where + 1 :: 7] = bad  # later ones too: the first is named
        with pytest.raises(ValueError, match=r"^x: .*non-finite") as e:
            c.encode(x)
        assert f"position {tuple(int(i) for i in np.unravel_index(where, (5, 8)))}" in str(e.value), str(e.value)
    ef = codec.ErrorFeedback(c)
    ef.encode(make("normal", 40, dtype), key="k")
    before = np.array(ef.residual("k"))
    x = make("normal", 40, dtype)
    x[17] = np.nan
    with pytest.raises(ValueError, match="x"):
        ef.encode(x, key="k")
    assert_same(np.array(ef.residual("k")), before, "residual after a failed step") and ef.step("k") == 1


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("keep", KEEPS)
def test_large_finite_input_encodes(keep, dtype):
    """Only non-finite input (or a spectrum that itself overflows) is an error: large finite
    values whose magnitudes re*re + im*im are finite in float64 encode like any others.
    float32: coefficients up to ~1e24 (magnitudes ~1e48, beyond float32's range but not
    float64's); float64: coefficients ~1e102."""
    scale = 1e20 if dtype == F32 else 1e100
    x = (make("normal", 3 * 64 + 5, F64, seed=16) * scale).astype(dtype)
    c = codec.get_codec(spec_of(0.5, 64, keep))
    frame = c.encode(x)
    pos, vals, _ = frame_parts(frame, 64)
    want_pos, want_vals = ref.encode(x, 0.5, 64, keep)
    assert np.array_equal(pos, want_pos)
    assert_same(vals, want_vals, "values")
    assert_same(codec.decode(frame), ref.decode(want_pos, want_vals, x.size, 64, dtype), "decoded")


def test_spectrum_overflow_raises():
    """Finite float32 input whose float32 spectrum overflows raises ValueError naming x."""
    x = np.full(16, 3e38, np.float32)
    for keep in KEEPS:
        with pytest.raises(ValueError, match="^x: "):
            codec.get_codec(spec_of(0.5, 16, keep)).encode(x)


@pytest.mark.parametrize(
    "spec",
    ["fft(theta=1.5)", "fft(theta=-0.1)", "fft(theta=nan)", "fft(block=-1)", "fft(keep=foo)", "fft(theta=exp(0.9,1.5,steps=3))", "fft(width=3)"],
)
def test_bad_params_raise(spec):
    with pytest.raises(ValueError, match="fft"):
        codec.get_codec(spec)


@pytest.mark.parametrize("spec", ["fft+topk", "topk+fft", "fft(theta=0.5)+randk+none", "fft+powersgd"])
def test_fft_with_a_select_stage_raises(spec):
    with pytest.raises(ValueError, match="fft"):
        codec.get_codec(spec)


def test_defaults_and_config():
    c = codec.get_codec("fft")
    t = c.transform
    assert (t.theta, t.block, t.keep) == (0.9, 4096, "per_block") and c.value.name == "rangefloat"
    assert c.select is None and not c.lossless
    for spec in ("fft(theta=0.3,block=7,keep=global)+none", "fft(theta=exp(0.9,0.5,steps=3))"):
        c = codec.get_codec(spec)
        assert codec.get_codec(c.get_config()) == c and pickle.loads(pickle.dumps(c)) == c


# ====================================================================== 7. kernels
def _readonly(a):
    a = np.ascontiguousarray(a).view()
    a.flags.writeable = False
    return a


def _kernel_rows(dtype, rows, c, seed):
    """A (rows, 2c) float view of a spectrum with hard rows: heavy tails, ties at every cut,
    magnitudes that round to one float32 (one histogram bin) but differ, zeros, subnormals."""
    rng = np.random.default_rng(seed)
    spec = np.empty((rows, 2 * c), dtype)
    for b in range(rows):
        kind = b % 8
        if kind == 0:
            row = rng.standard_normal(2 * c)
        elif kind == 1:
            row = rng.standard_t(2, 2 * c) * 1e-3
        elif kind == 2:  # all equal
            row = np.tile([0.5, -0.5], c)
        elif kind == 3:  # few distinct magnitudes, many ties
            row = rng.integers(-2, 3, 2 * c).astype(np.float64)
        elif kind == 4:  # one histogram bin, distinct float64 magnitudes (float64 rows), with ties
            row = np.zeros(2 * c)
            row[0::2] = 1.0 + rng.integers(0, 4, c) * (2.0**-40 if dtype == np.float64 else 2.0**-20)
        elif kind == 5:
            row = np.zeros(2 * c)
        elif kind == 6:  # tiny and huge together (subnormal magnitudes in float32 rounding)
            row = rng.standard_normal(2 * c) * np.where(rng.random(2 * c) < 0.5, 1e-30, 1e10)
        else:  # negative zeros and exact powers of two
            row = np.ldexp(rng.choice([-1.0, 1.0], 2 * c), rng.integers(-3, 3, 2 * c)) * (rng.random(2 * c) < 0.7)
            row[rng.random(2 * c) < 0.2] = -0.0
        spec[b] = row
    return spec


def _block_top(fn, spec, k, base):
    rows, c = spec.shape[0], spec.shape[1] // 2
    pos = np.full(rows * k, -7, np.int64)
    vals = np.full(2 * rows * k, -7, spec.dtype)
    bad = np.zeros(rows, np.uint8)
    fn(_readonly(spec), k, base, pos, vals, bad)
    return pos, vals, bad


def _ref_block_top(spec, k, base):
    rows, c = spec.shape[0], spec.shape[1] // 2
    pos, vals = [], []
    for b in range(rows):
        pairs = spec[b].reshape(c, 2)
        m = pairs[:, 0].astype(np.float64) ** 2 + pairs[:, 1].astype(np.float64) ** 2
        p = ref.top(m, k)
        pos.append(base + b * c + p)
        vals.append(pairs[p].reshape(-1))
    return np.concatenate(pos).astype(np.int64), np.concatenate(vals).astype(spec.dtype)


@pytest.fixture
def K(backend):
    """The ``spectral`` family's kernels on ``backend``."""
    return module("spectral", backend)


def forms(fn):
    """The ways to call kernel ``fn``: its serial and parallel twins and the size dispatch
    (the CPU jit wrapper's), or ``fn`` alone on a backend without twins."""
    return (fn.serial, fn.parallel, fn) if hasattr(fn, "serial") else (fn,)


def twins(fn):
    """The serial and parallel twins of ``fn`` (the CPU jit wrapper's), or ``fn`` alone."""
    return (fn.serial, fn.parallel) if hasattr(fn, "serial") else (fn,)


@pytest.fixture
def threads():
    """Run with numba's thread count set; restored afterwards."""
    before = numba.get_num_threads()
    yield lambda t: numba.set_num_threads(min(t, numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(before)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_block_top_kernel(K, dtype, threads):
    """block_top against the reference per row (ties at the cut, one-bin rows, k=0, k=c),
    serial == parallel twin, 1 thread == 2 threads."""
    for rows, c in ((16, 33), (9, 1), (8, 2), (17, 129), (203, 12)):  # 203 rows: several rows per chunk of work
        spec = _kernel_rows(dtype, rows, c, seed=rows * c)
        for k in sorted({0, 1, c // 4, c // 2, c - 1, c}):
            want_pos, want_vals = _ref_block_top(spec, k, 1000)
            results = []
            for t in (1, 2):
                threads(t)
                for fn in forms(K.block_top):
                    results.append(_block_top(fn, spec, k, 1000))
            for pos, vals, bad in results:
                assert not bad.any()
                assert np.array_equal(pos, want_pos), f"rows={rows} c={c} k={k}: {pos[:12]}, want {want_pos[:12]}"
                assert_same(vals, want_vals, f"rows={rows} c={c} k={k} values")


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_kernels_flag_nonfinite_rows(K, dtype, threads):
    for rows in (6, 150):  # 150: bad rows between good ones in one chunk of work
        c = 10
        spec = _kernel_rows(dtype, rows, c, seed=3)
        spec[1, 4] = np.nan
        spec[3, 2 * c - 1] = np.inf
        spec[4, 0] = -np.inf
        spec[rows - 2, 7] = np.nan
        flags = np.zeros(rows, np.uint8)
        flags[[1, 3, 4, rows - 2]] = 1
        good = np.flatnonzero(flags == 0)
        want_pos, want_vals = _ref_block_top(spec, 4, 0)
        for t in (1, 2):
            threads(t)
            for fn in twins(K.block_top):
                pos, vals, bad = _block_top(fn, spec, 4, 0)
                assert np.array_equal(bad, flags), f"rows={rows}: bad {np.flatnonzero(bad).tolist()}"
                for b in good:  # good rows are still right
                    assert np.array_equal(pos[4 * b : 4 * b + 4], want_pos[4 * b : 4 * b + 4]), f"rows={rows} row {b}"
                    assert_same(vals[8 * b : 8 * b + 8], want_vals[8 * b : 8 * b + 8], f"rows={rows} row {b}")
                for b in np.flatnonzero(flags):  # bad rows: output untouched
                    assert np.all(pos[4 * b : 4 * b + 4] == -7)
            for fn in twins(K.magnitudes):
                mag = np.full(rows * c, -1.0)
                bad = np.zeros(rows, np.uint8)
                fn(_readonly(spec), mag, bad)
                assert np.array_equal(bad, flags)
        for k in (0, c):  # k = 0 and k = c still flag
            _, _, bad = _block_top(twins(K.block_top)[0], spec, k, 0)
            assert np.array_equal(bad, flags), f"k={k}"
    if dtype == np.float64:  # a finite coefficient whose square overflows float64
        spec = _kernel_rows(dtype, 2, 4, seed=4)
        spec[0, 1] = 1e200
        assert _block_top(twins(K.block_top)[0], spec, 2, 0)[2].tolist() == [1, 0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_magnitudes_kernel(K, dtype, threads):
    rows, c = 24, 37
    spec = _kernel_rows(dtype, rows, c, seed=11)
    pairs = spec.reshape(rows * c, 2)
    want = pairs[:, 0].astype(np.float64) ** 2 + pairs[:, 1].astype(np.float64) ** 2
    for t in (1, 2):
        threads(t)
        for fn in forms(K.magnitudes):
            mag = np.full(rows * c, -1.0)
            bad = np.zeros(rows, np.uint8)
            fn(_readonly(spec), mag, bad)
            assert not bad.any()
            assert_same(mag, want, f"magnitudes ({t} threads)")


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_place_kernel(K, dtype, threads):
    """place scatters sorted positions (of a spectrum starting at ``base``) into zeroed rows."""
    rng = np.random.default_rng(12)
    rows, c, base = 11, 9, 57
    total = base + rows * c + 20
    pos = np.sort(rng.choice(np.arange(total), 60, replace=False)).astype(np.int64)
    vals = rng.standard_normal(2 * pos.size).astype(dtype)
    vals[:6] = [-0.0, 0.0, np.nan, 1e-45 if dtype == np.float32 else 5e-324, -1.0, 2.0]
    want = np.zeros((rows, 2 * c), dtype)
    for i, p in enumerate(pos):
        j = p - base
        if 0 <= j < rows * c:
            want[j // c, 2 * (j % c) : 2 * (j % c) + 2] = vals[2 * i : 2 * i + 2]
    for t in (1, 2):
        threads(t)
        for fn in forms(K.place):
            out = np.full((rows, 2 * c), 5, dtype)
            fn(out, base, _readonly(pos), _readonly(vals))
            assert_same(out, want, f"place ({t} threads)")
    out = np.full((rows, 2 * c), 5, dtype)
    K.place(out, base, _readonly(np.empty(0, np.int64)), _readonly(np.empty(0, dtype)))
    assert not out.any()


#: rows of several lengths in one call (``in at, length, rows, in step, out at, out step``):
#: powers of two and others, a one-value row, rows spaced apart in and out
ROW_PARTS = ((3, 16, 4, 16, 0, 18), (70, 37, 2, 40, 80, 40), (200, 1, 3, 1, 200, 2), (210, 12, 1, 12, 300, 14), (230, 8, 2, 9, 320, 10))


def check_rows(K, dtype, parts=ROW_PARTS):
    """``rfft_rows`` and ``irfft_rows`` of ``K`` write each part's rows exactly as ``K.rfft``
    and ``K.irfft`` of the part alone give them, and nothing between the rows."""
    from codec.device import host_copy, to_device
    from codec.dtypes import on_device

    rng = np.random.default_rng(15)
    inv_size = max(p[0] + p[2] * p[3] for p in parts)
    fwd_size = max(p[4] + p[2] * p[5] for p in parts)
    x = rng.standard_t(3, inv_size).astype(dtype)
    spec = rng.standard_normal(fwd_size).astype(dtype)
    put = to_device if K.__name__.endswith("cuda.spectral") else (lambda a: a)
    for hermitian in (0, 1):
        src = spec if hermitian else x
        # the inverse reads half spectra at the forward's in positions: a part's rows as 2c floats from in at
        use = [(o, n, r, so, i, si) for i, n, r, si, o, so in parts] if hermitian else list(parts)
        out = put(np.full(inv_size if hermitian else fwd_size, np.nan, dtype))
        (K.irfft_rows if hermitian else K.rfft_rows)(put(src), np.array(use, np.int64), out)
        got = host_copy(out) if on_device(out) else out
        want = np.full(got.size, np.nan, dtype)
        for i0, length, rows, istep, o0, ostep in use:
            c = length // 2 + 1
            width = 2 * c if hermitian else length
            block = np.stack([src[i0 + r * istep : i0 + r * istep + width] for r in range(rows)])
            done = K.irfft(put(block), length) if hermitian else K.rfft(put(block))
            done = host_copy(done) if on_device(done) else done
            for r in range(rows):
                want[o0 + r * ostep : o0 + r * ostep + done.shape[1]] = done[r]
        assert_same(got, want, f"{'irfft' if hermitian else 'rfft'}_rows")


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_rows_kernels(K, dtype):
    check_rows(K, dtype)


def test_frame_does_not_depend_on_thread_count(threads):
    """The whole encode at the parallel size (spectrum >= PARALLEL_MIN) with 1 and 2 threads."""
    from codec._jit import PARALLEL_MIN

    n = 2 * PARALLEL_MIN + 4096 * 3 + 11
    x = make("heavy", n, F32, seed=13)
    frames = []
    for t in (1, 2):
        threads(t)
        for keep in KEEPS:
            frames.append(codec.get_codec(spec_of(0.9, 4096, keep)).encode(x))
    assert frames[0] == frames[2] and frames[1] == frames[3]
    pos, vals, _ = frame_parts(frames[0], 4096)
    want_pos, want_vals = ref.encode(x, 0.9, 4096, "per_block")
    assert np.array_equal(pos, want_pos) and vals.tobytes() == want_vals.tobytes()


# ====================================================================== 8. decode_add
@pytest.mark.parametrize(
    "spec",
    ["fft(theta=0)+none", "fft(theta=0.5,block=8)+none", "fft(theta=0.3,block=0)+fp16", "fft(theta=0.7,block=16,keep=global)+none+zstd", "fft(block=5)"],
)
def test_decode_add_conformance(spec):
    for arr in sample_arrays():
        check_decode_add(spec, arr)


@pytest.mark.parametrize("frame_dtype", DTYPES, ids=DT_IDS)
def test_decode_add_rounds_once(frame_dtype, exact_round):
    """acc (float16 / bfloat16 / float32 / float64) +- decode(frame), rounded once, computed
    exactly with fractions."""
    x = make("normal", 97, frame_dtype, seed=14) * frame_dtype.type(3)
    c = codec.get_codec(spec_of(0.6, 16, "per_block"))
    frame = c.encode(x)
    dec = codec.decode(frame).astype(np.float64)
    rng = np.random.default_rng(15)
    for acc_dtype in DTYPES:
        acc0 = (rng.standard_normal(97) * 2.0 ** rng.integers(-8, 8, 97)).astype(acc_dtype)
        for subtract in (False, True):
            acc = acc0.copy()
            assert c.decode_add(frame, acc, subtract=subtract) is acc
            s = -1 if subtract else 1
            exact = [Fraction(float(a)) + s * Fraction(float(d)) for a, d in zip(acc0.astype(np.float64), dec)]
            if acc_dtype == F64:
                want = np.array([float(q) for q in exact], np.float64)  # correctly rounded
            else:
                want = np.array([exact_round(q, acc_dtype) for q in exact], np.float64).astype(acc_dtype)
            assert_same(acc, want, f"{frame_dtype} frame into {acc_dtype} acc (subtract={subtract})")


@pytest.mark.parametrize("dt", [F32, F64, F16], ids=["f32", "f64", "f16"])
def test_the_host_inverse_in_chunks_of_rows_is_the_whole_inverse(dt, monkeypatch):
    """The host inverse runs chunks of about ``CHUNK`` output elements of whole blocks on the
    thread budget's threads, in any order: a decode (per-block and global top) and error
    feedback's ``acc -= decoded`` give the same bits for chunks of one block, of a few and
    odd counts of blocks, and of the whole tensor, on one thread and on two (pocketfft's
    answer for a row does not depend on the rows beside it); the frames and a NaN's name do
    not depend on them either."""
    from codec import threads
    from codec.stages.transform import fftinverse as F

    rng = np.random.default_rng(11)
    x = (rng.standard_t(3, 64 * 77 + 9) * 1e-2).astype(dt)
    specs = ("fft(block=64)", "fft(block=64,theta=0.5,keep=global)")
    got = {}
    for chunk, budget in ((10**9, 1), (1, 1), (1, 2), (64 * 3 + 5, 2), (64 * 10, 2)):
        monkeypatch.setattr(F, "CHUNK", chunk)
        monkeypatch.setattr(threads, "budget", lambda: budget)
        frames = [codec.get_codec(spec).encode(x) for spec in specs]
        ef = codec.ErrorFeedback("fft(block=64)")
        for step in range(3):
            ef.encode(np.roll(x, step), key="w")
        got[chunk, budget] = (frames, [codec.decode(f) for f in frames], pickle.dumps(ef.state_dict()))
        bad = x.copy()
        bad[-70] = np.nan
        with pytest.raises(ValueError, match=str(x.size - 70)):
            codec.get_codec(specs[0]).encode(bad)
    whole = got[10**9, 1]
    for how, (frames, decoded, state) in got.items():
        assert frames == whole[0], how
        for a, b in zip(decoded, whole[1]):
            assert_same(a, b, f"chunk, threads {how}")
        assert state == whole[2], how
