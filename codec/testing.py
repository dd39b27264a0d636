"""Conformance checks every codec must pass (ours and third parties').

Modelled on numcodecs' ``check_encode_decode`` / ``check_config`` /
``check_backwards_compatibility``: import this module in a test suite and call
:func:`check_codec` (or the individual checks) with a codec and a few arrays.  Each check
raises ``AssertionError`` with a sentence saying what broke.

    from codec.testing import check_codec, sample_arrays
    for arr in sample_arrays():
        check_codec("fp16", arr)
"""

from __future__ import annotations

import json
import pickle
import struct
import tracemalloc
import zlib
from pathlib import Path

import numpy as np

import codec as _codec
from codec.dtypes import bfloat16
from codec.errors import CorruptFrameError
from codec.frame import FIXED_SIZE, SECTION_SIZE, parse_frame
from codec.ops import round_to

__all__ = [
    "sample_arrays",
    "ulp",
    "diff_msg",
    "assert_identical",
    "check_codec",
    "check_encode_decode",
    "check_decode_out",
    "check_decode_add",
    "check_config",
    "check_error_feedback",
    "check_malformed",
    "check_fixture",
    "write_fixture",
    "PIPELINES",
]

DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), bfloat16)


#: pipelines that combine stages, which the conformance suite (tests/test_conformance.py) runs
#: besides every registered stage id on its own, and the fuzzer seeds its corpus from
PIPELINES = (
    "fp16+zstd",
    "bf16+crc32",
    "none+zstd(level=1)+crc32",
    "threshold(value=0.5)",
    "threshold(value=0.5)+fp16+zstd",
    "threshold(value=0.001)+bf16",
    "fp16(nonfinite=keep)",
    "topk(ratio=0.1)",
    "topk(k=3)+fp16+zstd",
    "gaussiank(ratio=0.05)",
    "gaussiank(ratio=0.05,exact=true)+bf16",
    "dgc(ratio=0.05,sample=0.5)",
    "randomk(ratio=0.1,seed=3,scale=true)",
    "randomk(ratio=0.3)+fp16",
    "adacomp(bin=7)",
    "adacomp+none",
    "adacomp+fp16+crc32",
    "topk(ratio=warmup(0.5,0.01,steps=2))",
    "rangefloat(bits=5,block=7,rounding=stochastic)",
    "rangefloat(bits=16,exp_bits=8)+zstd",
    "rangefloat(bits=3,exp_bits=1)",
    "fp8(format=e5m2,scale=true)",
    "fp8(scale=true,rounding=stochastic)",
    "qsgd(levels=3,bucket=7,rounding=nearest)+crc32",
    "qsgd(levels=300)+zstd",
    "minmax(bits=3,bucket=7,rounding=stochastic)",
    "minmax(bits=1,bucket=1)",
    "terngrad(clip=0)",
    "sign(scale=l1)",
    "topk(ratio=0.1)+qsgd",
    "topk(k=3)+rangefloat(bits=6)",
    "adacomp+rangefloat",
    "gaussiank(ratio=0.05)+minmax(bits=4)",
    "randomk(ratio=0.3)+terngrad",
    "threshold(value=0.5)+onebit",
    "qsgd(coding=elias)",
    "topk(ratio=0.1)+qsgd(levels=4,bucket=7,coding=elias)+zstd",
    "fft(theta=0)+none",
    "fft(theta=0.5,block=8)+none",
    "fft(theta=0.3,block=0)+fp16",
    "fft(theta=0.7,block=16,keep=global)+none+zstd",
    "fft(theta=exp(0.9,0.5,steps=3),block=7)+crc32",
    "fft(block=5)+qsgd(bucket=4)",
    "powersgd(rank=1)",
    "powersgd(rank=3,min_compression_rate=0)+bf16",
    "powersgd(warm_start=false,min_compression_rate=1)+rangefloat+zstd",
)


def sample_arrays(seed: int = 0) -> list[np.ndarray]:
    """Edge-case and real-looking arrays: empty, 0-d, one element, odd sizes, heavy tails, every dtype."""
    rng = np.random.default_rng(seed)
    heavy = (rng.standard_t(2, size=(17, 31)) * 1e-3).astype(np.float32)
    base = [
        np.zeros((0,), np.float32),
        np.array(0.75, np.float32),
        np.array([-2.5], np.float32),
        rng.standard_normal(1001).astype(np.float32),
        heavy,
        (rng.standard_normal((3, 4, 5, 7)) * 0.01).astype(np.float32),
        np.zeros(64, np.float32),
    ]
    out = list(base)
    for dt in DTYPES[1:]:
        out.append(heavy.astype(dt))
        out.append(base[3][:77].astype(dt))
    return out


def _get(codec):
    return _codec.get_codec(codec)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality (NaN payloads and signed zeros included)."""
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def diff_msg(got, want, what: str) -> str | None:
    """None when ``got`` and ``want`` are identical arrays (shape, dtype and every bit: NaN
    payload aside, signed zeros count); else a message naming ``what``, how many elements
    differ and the first few of them."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{what}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}"
    if got.tobytes() == want.tobytes():
        return None
    g = got.reshape(-1).astype(np.float64)
    w = want.reshape(-1).astype(np.float64)
    bad = np.flatnonzero(~(((g == w) & (np.signbit(g) == np.signbit(w))) | (np.isnan(g) & np.isnan(w))))
    return (
        f"{what}: {bad.size} of {g.size} elements differ; first at {bad[:5].tolist()}: "
        f"got {g[bad[:5]].tolist()}, want {w[bad[:5]].tolist()}"
    )


def assert_identical(got, want, what: str = "array") -> None:
    """Raise AssertionError with :func:`diff_msg`'s message unless the arrays are identical."""
    msg = diff_msg(got, want, what)
    assert msg is None, msg


_MANT = {"float16": (10, -14), "bfloat16": (7, -126), "float32": (23, -126), "float64": (52, -1022)}


def ulp(x: np.ndarray) -> np.ndarray:
    """One unit in the last place of each element of ``x`` in its own dtype (as float64)."""
    mant, emin = _MANT[x.dtype.name]
    mag = np.abs(x.astype(np.float64))
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
    e = np.where(mag > 0, np.maximum(e, emin), emin)
    return np.ldexp(1.0, (e - mant).astype(np.int64))


def check_encode_decode(codec, arr: np.ndarray) -> bytes:
    """Encode from every buffer type, decode from every buffer type; returns the frame.

    Frames must be byte-identical whatever the input's container; decoded arrays have the
    input's dtype and shape; a lossless codec reproduces the input bit for bit.
    """
    c = _get(codec)
    frame = c.encode(arr)
    assert isinstance(frame, bytes), f"{c}: encode must return bytes, got {type(frame).__name__}"
    raw = arr.reshape(-1).view(np.uint8).tobytes() if arr.dtype == bfloat16 else arr.tobytes()
    flat = _codec.decode(c.encode(arr.reshape(-1)))  # a raw buffer is a 1-D array (AdaComp's bins depend on ndim)
    for other in (bytes(raw), bytearray(raw), memoryview(raw)):
        f2 = c.encode(other, dtype=arr.dtype)
        decoded = _codec.decode(f2)
        assert decoded.dtype == arr.dtype and decoded.size == arr.size, f"{c}: buffer input decoded wrongly"
        assert _same(decoded, flat), f"{c}: {type(other).__name__} input gave another result"
    if arr.dtype != bfloat16:
        assert c.encode(memoryview(arr)) == frame, f"{c}: memoryview input gave another frame"
    assert c.encode(arr.copy()) == frame, f"{c}: encoding is not deterministic"
    ref = _codec.decode(frame)
    for buf in (frame, bytearray(frame), memoryview(frame), np.frombuffer(frame, np.uint8)):
        y = c.decode(buf)
        assert _same(y, ref), f"{c}: decoding from {type(buf).__name__} differs"
    assert ref.shape == arr.shape and ref.dtype == arr.dtype, f"{c}: decoded {ref.dtype}{ref.shape}, input {arr.dtype}{arr.shape}"
    if c.lossless:
        assert _same(ref, arr), f"{c}: lossless codec changed the data"
    return frame


def check_decode_out(codec, arr: np.ndarray) -> None:
    """decode(frame, out=y) fills y; a wrong size or dtype raises ValueError naming out."""
    c = _get(codec)
    frame = c.encode(arr)
    ref = c.decode(frame)
    out = np.full(arr.shape, 7, arr.dtype)
    res = c.decode(frame, out=out)
    assert res is out and _same(out, ref), f"{c}: decode(out=) result differs from decode()"
    bad_size = np.empty(arr.size + 1, arr.dtype)
    other = np.float64 if arr.dtype != np.float64 else np.float32
    for bad in (bad_size, np.empty(arr.shape, other)):
        try:
            c.decode(frame, out=bad)
        except ValueError as e:
            assert "out" in str(e), f"{c}: error for a bad out does not name it: {e}"
        else:
            raise AssertionError(f"{c}: decode into a wrong out ({bad.dtype}{bad.shape}) did not raise ValueError")


def check_encode_out(codec, arr: np.ndarray, steps: int = 2) -> None:
    """encode(x, out=buf) writes the very frame encode(x) returns at the start of ``buf`` and
    returns a memoryview of it; so do ``encode_many`` and ErrorFeedback's ``encode`` (its
    residuals identical step by step).  A buffer one byte too small raises ValueError naming
    out, writes nothing and changes no residual or step; a read-only or non-buffer ``out``
    raises TypeError, one overlapping the input ValueError."""
    c = _get(codec)
    frame = c.encode(arr)
    buf = bytearray(len(frame) + 64)
    got = c.encode(arr, out=buf)
    assert isinstance(got, memoryview) and got.obj is not None, f"{c}: encode(out=) must return a memoryview of out"
    assert bytes(got) == frame and bytes(buf[: len(frame)]) == frame, f"{c}: encode(out=) wrote another frame"
    assert _same(c.decode(got), c.decode(frame)), f"{c}: the frame in out decodes differently"
    many = c.encode_many({"a": arr, "b": arr.reshape(-1)[:3].copy()})
    into = np.zeros(len(many), np.uint8)
    assert bytes(c.encode_many({"a": arr, "b": arr.reshape(-1)[:3].copy()}, out=into)) == many, f"{c}: encode_many(out=) differs"
    ef, ef_out = _codec.ErrorFeedback(c), _codec.ErrorFeedback(c)
    for step in range(steps):
        x = arr if step == 0 else (arr.astype(np.float64) * 0.5).astype(arr.dtype)
        want = ef.encode(x, key="k")
        small = bytearray(b"\x07" * (len(want) - 1))
        try:
            ef_out.encode(x, key="k", out=small)
        except ValueError as e:
            assert "out" in str(e), f"{c}: a too-small out's error does not name it: {e}"
        else:
            raise AssertionError(f"{c}: a frame larger than out did not raise ValueError")
        assert small == bytearray(b"\x07" * (len(want) - 1)), f"{c}: a too-small out was written"
        assert ef_out.step("k") == step, f"{c}: a failed encode(out=) advanced the step"
        assert bytes(ef_out.encode(x, key="k", out=bytearray(len(want) + 64))) == want, f"{c}: ErrorFeedback.encode(out=) differs at step {step}"
        r, r_out = ef.residual("k"), ef_out.residual("k")
        assert (r is None) == (r_out is None) and (r is None or _same(r, r_out)), f"{c}: residuals differ at step {step}"
    for bad, err in ((bytes(len(frame)), TypeError), (3, TypeError)):
        try:
            c.encode(arr, out=bad)
        except err as e:
            assert "out" in str(e), f"{c}: error for out={type(bad).__name__} does not name it: {e}"
        else:
            raise AssertionError(f"{c}: encode(out={type(bad).__name__}) did not raise {err.__name__}")
    if arr.size and arr.dtype != bfloat16:
        try:
            c.encode(arr, out=arr.reshape(-1).view(np.uint8))
        except ValueError as e:
            assert "out" in str(e), f"{c}: error for an out overlapping x does not name it: {e}"
        else:
            raise AssertionError(f"{c}: an out overlapping x did not raise ValueError")


def check_decode_add(codec, arr: np.ndarray, seed: int = 1) -> None:
    """decode_add(frame, acc) equals acc + decode(frame) (and subtract=True its difference)."""
    c = _get(codec)
    frame = c.encode(arr)
    dec = c.decode(frame)
    rng = np.random.default_rng(seed)
    for acc_dtype in (np.dtype(np.float32), np.dtype(np.float64), arr.dtype):
        acc0 = rng.standard_normal(arr.shape).astype(acc_dtype)
        for subtract in (False, True):
            acc = acc0.copy()
            res = c.decode_add(frame, acc, subtract=subtract)
            assert res is acc, f"{c}: decode_add must return out"
            # the exact sum rounded once
            d = dec.astype(np.float64)
            want = _sum_rounded_once(acc0.astype(np.float64), -d if subtract else d, acc_dtype)
            assert _same(acc, want), f"{c}: decode_add into {acc_dtype} (subtract={subtract}) != acc + decode"


def _sum_rounded_once(a: np.ndarray, b: np.ndarray, dtype) -> np.ndarray:
    """``a + b`` (float64 arrays) rounded once to ``dtype``: the float64 sum, made round-to-odd
    with its exact error (TwoSum), then rounded, so no double rounding can land on a tie
    (a float64 frame's decoded values can sit a rounding error away from float32 values)."""
    s = np.atleast_1d(a + b)
    if np.dtype(dtype) == np.float64:
        return s.reshape(np.shape(a))
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    even = (s.view(np.int64) & 1) == 0
    fix = (err != 0) & even
    s[fix] = np.nextafter(s[fix], np.where(err[fix] > 0, np.inf, -np.inf))
    return round_to(s.reshape(np.shape(a)), dtype)


def check_config(codec) -> None:
    """get_config is flat JSON with an id; get_codec(config) == codec; repr, hash, pickle round trip."""
    c = _get(codec)
    cfg = c.get_config()
    assert isinstance(cfg.get("id"), str), f"{c}: config has no string id"
    assert all(not isinstance(v, (dict, list)) for v in cfg.values()), f"{c}: config is not flat: {cfg}"
    back = _codec.get_codec(json.loads(json.dumps(cfg)))
    assert back == c and hash(back) == hash(c), f"{c}: config round trip gave {back}"
    assert _codec.get_codec(c.spec) == c, f"{c}: spec round trip differs"
    assert pickle.loads(pickle.dumps(c)) == c, f"{c}: pickle round trip differs"
    assert c.spec in repr(c), f"{c}: repr does not show the spec"


def check_error_feedback(codec, arr: np.ndarray, steps: int = 3, seed: int = 2) -> None:
    """decoded + new residual == x + old residual: exactly when values are coded exactly,
    within one ulp (of acc or of the residual, whichever is larger) elementwise otherwise; residual state survives state_dict and pickle."""
    c = _get(codec)
    ef = _codec.ErrorFeedback(c)
    rng = np.random.default_rng(seed)
    exact = c.value.lossless and c.transform is None and not (c.select is not None and c.select.scales_values)
    for step in range(steps):
        x = (arr.astype(np.float64) * (1 + 0.1 * rng.standard_normal(arr.shape))).astype(arr.dtype)
        old = ef.residual("k").copy() if step else np.zeros_like(arr)
        acc = np.add(x, old, dtype=arr.dtype)
        frame = ef.encode(x, key="k")
        dec = _codec.decode(frame)
        new = ef.residual("k")
        total = dec.astype(np.float64) + new.astype(np.float64)
        err = np.abs(total - acc.astype(np.float64))
        if exact:
            assert not np.any(err), f"{c}: step {step}: decoded + residual != acc (max error {err.max()})"
        else:
            # the residual is acc - decoded rounded once: off by at most half an ulp of itself
            # (a scale larger than |acc|, as AdaComp's, makes it larger than acc)
            bound = np.maximum(ulp(acc), ulp(np.asarray(new)))
            assert np.all(err <= bound), f"{c}: step {step}: decoded + residual is {err.max()} from acc (> 1 ulp)"
    assert ef.step("k") == steps
    state = ef.state_dict()
    ef2 = _codec.ErrorFeedback(c)
    ef2.load_state_dict(state)
    ef3 = pickle.loads(pickle.dumps(ef))
    x = arr.copy()
    f1 = ef.encode(x, key="k")
    assert ef2.encode(x, key="k") == f1 and ef3.encode(x, key="k") == f1, f"{c}: restored ErrorFeedback encodes differently"
    if arr.ndim:
        try:
            ef.encode(np.zeros(arr.size + 1, arr.dtype), key="k")
        except ValueError as e:
            assert "k" in str(e)
        else:
            raise AssertionError(f"{c}: a key whose shape changed did not raise ValueError")


def _fix_crc(buf: bytearray, header_len: int) -> None:
    buf[header_len - 4 : header_len] = struct.pack("<I", zlib.crc32(bytes(buf[: header_len - 4])))


def _expect_corrupt(c, buf, what: str, limit: int) -> None:
    tracemalloc.start()
    try:
        try:
            _codec.decode(bytes(buf))
        except CorruptFrameError:
            pass
        except Exception as e:  # noqa: BLE001 - the point is to catch anything else
            raise AssertionError(f"{c}: {what}: raised {type(e).__name__}: {e}, not CorruptFrameError") from None
        else:
            raise AssertionError(f"{c}: {what}: decoded without error")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= limit, f"{c}: {what}: allocated {peak} bytes before failing (limit {limit})"


def check_malformed(codec, arr: np.ndarray, n_random: int = 10_000, seed: int = 3) -> None:
    """Truncations, header bit flips, random bytes, lying length fields and a forged zstd
    content size all raise CorruptFrameError, allocating no more than 4x the input size."""
    import zstandard  # noqa: F401  (imported before measuring: a first import is not the decoder's allocation)

    c = _get(codec)
    frame = c.encode(arr)
    limit = 4 * max(arr.nbytes, len(frame)) + (64 << 10)
    fr = parse_frame(frame)
    hl = fr.header_len
    for cut in range(len(frame)):
        _expect_corrupt(c, frame[:cut], f"frame truncated to {cut} bytes", limit)
    for bit in range(hl * 8):
        buf = bytearray(frame)
        buf[bit // 8] ^= 1 << (bit % 8)
        _expect_corrupt(c, buf, f"header bit {bit} flipped", limit)
    rng = np.random.default_rng(seed)
    for i in range(n_random):
        size = int(rng.integers(0, 2 * len(frame) + 64))
        junk = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        if i % 2:  # half of them past the magic check
            junk = frame[: min(len(frame), int(rng.integers(4, hl + 1)))] + junk
        try:
            _codec.decode(junk)
        except CorruptFrameError:
            continue
        except Exception as e:  # noqa: BLE001
            raise AssertionError(f"{c}: random bytes #{i}: raised {type(e).__name__}: {e}") from None
        raise AssertionError(f"{c}: random bytes #{i} decoded")
    # lying length fields, header CRC recomputed so the lie reaches the length checks
    table = FIXED_SIZE + 8 * len(fr.shape) + len(fr.spec.encode())
    for i in range(len(fr.sections)):
        base = table + SECTION_SIZE * i
        for field_off, name in ((4, "count"), (12, "raw length"), (20, "stored length")):
            for delta in (1, -1, 1 << 40):
                buf = bytearray(frame)
                (v,) = struct.unpack_from("<Q", buf, base + field_off)
                struct.pack_into("<Q", buf, base + field_off, (v + delta) % (1 << 64))
                _fix_crc(buf, hl)
                _expect_corrupt(c, buf, f"section {i} {name} off by {delta}", limit)
    # a zstd section that claims 2**40 bytes of content
    if fr.sections:
        # magic, descriptor (8-byte content size, not single-segment), window byte, size, empty last block
        forged = bytes([0x28, 0xB5, 0x2F, 0xFD, 0xC0, 0x58]) + struct.pack("<Q", 1 << 40) + b"\x01\x00\x00"
        s0 = fr.sections[0]
        buf = bytearray(frame[:hl]) + forged + bytearray(frame[s0.offset + s0.stored_len :])
        base = table
        struct.pack_into("<B", buf, base + 1, 1)
        struct.pack_into("<Q", buf, base + 20, len(forged))
        _fix_crc(buf, hl)
        if buf[5] & 1:  # payload checksum present: make it match so the zstd check is reached
            pos = hl - 8
            buf[pos : pos + 4] = struct.pack("<I", zlib.crc32(bytes(buf[hl:])))
            _fix_crc(buf, hl)
        _expect_corrupt(c, buf, "zstd section forging a 2**40-byte content size", limit)


def write_fixture(directory, name: str, codec, arr: np.ndarray) -> None:
    """Freeze ``codec``'s frame of ``arr`` as NAME.frame plus the decoded array NAME.npy."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    frame = _get(codec).encode(arr)
    (directory / f"{name}.frame").write_bytes(frame)
    dec = _codec.decode(frame)
    np.save(directory / f"{name}.npy", dec.view(np.uint16) if dec.dtype == bfloat16 else dec)
    (directory / f"{name}.json").write_text(json.dumps({"spec": _get(codec).spec, "dtype": dec.dtype.name}) + "\n")


def check_fixture(directory, name: str) -> None:
    """A frozen frame (from an older version) still decodes to the stored array, bit for bit."""
    directory = Path(directory)
    meta = json.loads((directory / f"{name}.json").read_text())
    frame = (directory / f"{name}.frame").read_bytes()
    want = np.load(directory / f"{name}.npy")
    if meta["dtype"] == "bfloat16":
        want = want.view(bfloat16)
    got = _codec.decode(frame)
    assert _same(got, want), f"fixture {name} ({meta['spec']}): decodes differently than when it was frozen"


def check_codec(codec, arr: np.ndarray, *, n_random: int = 1000) -> None:
    """Every check above on one array."""
    check_encode_decode(codec, arr)
    check_decode_out(codec, arr)
    check_encode_out(codec, arr)
    check_decode_add(codec, arr)
    check_config(codec)
    check_error_feedback(codec, arr)
    check_malformed(codec, arr, n_random=n_random)
