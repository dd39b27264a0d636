"""codec/checksum.py: the payload CRC-32C on several threads equals the one-call CRC-32C.
codec/payloadcheck.py: a decode's :class:`~codec.payloadcheck.PayloadCheck` (the fp16/bf16
decoders and the quantizers' checksum the codes they read; the quantizers' also test their
fields) refuses exactly the damaged frames, and leaves a caller's ``out`` NaN when it does,
while the decodes that do not fuse it (small payloads, zstd frames, sparse codecs, every
``decode_add``) refuse before writing anything."""

from __future__ import annotations

import struct
import zlib

import crc32c as ref
import numpy as np
import pytest

import codec
from codec import checksum, threads
from codec.frame import parse_frame
from codec.payloadcheck import PayloadCheck


@pytest.mark.parametrize("seed", range(5))
def test_combine_is_the_crc_of_the_concatenation(seed):
    rng = np.random.default_rng(seed)
    for na, nb in [(0, 0), (0, 5), (5, 0), (1, 1), (3, 1000), (4096, 77), (int(rng.integers(1, 10**5)), int(rng.integers(1, 10**5)))]:
        a, b = rng.bytes(na), rng.bytes(nb)
        assert checksum.combine(ref.crc32c(a), ref.crc32c(b), nb) == ref.crc32c(a + b), (na, nb)


@pytest.mark.parametrize("count", [1, 2, 3, 8])
def test_parallel_crc_equals_one_call(monkeypatch, count):
    monkeypatch.setattr(threads, "budget", lambda: count)
    rng = np.random.default_rng(count)
    for n in (0, 1, checksum.PARALLEL_MIN - 1, checksum.PARALLEL_MIN, checksum.PARALLEL_MIN + 12_345, 3 * checksum.PARALLEL_MIN + 7):
        buf = rng.integers(0, 256, n, dtype=np.uint8)
        assert checksum.crc32c(buf) == ref.crc32c(buf), n
        assert checksum.crc32c(memoryview(buf)[1:]) == ref.crc32c(memoryview(buf)[1:]), n


def test_parts_folded_by_the_kernels_when_loaded(monkeypatch):
    """With the kernels loaded, parts from FOLD_MIN bytes are checksummed by their CRC where
    the CPU folds (``_crc.FOLD``), the package's below it or elsewhere: the package's value
    either way, from bytes, a bytearray and a slice, continued from any value."""
    from codec.kernels.cpu import _crc

    calls = []
    kernel = _crc.crc_bytes
    monkeypatch.setattr(_crc, "crc_bytes", lambda *a: calls.append(a[2]) or kernel(*a))
    monkeypatch.setattr(threads, "budget", lambda: 2)
    rng = np.random.default_rng(4)
    sizes = (checksum.FOLD_MIN - 1, checksum.FOLD_MIN, checksum.FOLD_MIN + 257, checksum.PARALLEL_MIN + 5)
    for n in sizes:
        data = rng.bytes(n)
        for buf in (data, bytearray(data), memoryview(data)[3:]):
            assert checksum.crc32c(buf, 0xC0FFEE) == ref.crc32c(buf, 0xC0FFEE), n
    if _crc.FOLD:  # every part of FOLD_MIN bytes or more, and only those
        assert calls and min(calls) >= checksum.FOLD_MIN and checksum.FOLD_MIN in calls, calls
    else:
        assert not calls


def test_large_frames_carry_the_crc_of_their_payload(monkeypatch):
    monkeypatch.setattr(threads, "budget", lambda: 2)
    x = np.random.default_rng(0).standard_normal(checksum.PARALLEL_MIN // 2 + 999).astype(np.float32)
    for frame in (codec.get_codec("fp16").encode(x), codec.get_codec("fp16").encode_many([x, x[:5]])):
        if codec.inspect(frame)["format_version"] == 1:
            fr = parse_frame(frame)
            assert fr.checksum == "crc32c"
        mv = memoryview(frame)
        hl = codec.inspect(frame)["header_bytes"]
        crc_at = hl - 8
        assert int.from_bytes(mv[crc_at : crc_at + 4], "little") == ref.crc32c(mv[hl:])
        bad = bytearray(frame)
        bad[-3] ^= 1
        with pytest.raises(codec.CorruptFrameError, match="payload checksum"):
            (codec.decode if codec.inspect(frame)["format_version"] == 1 else codec.decode_many)(bytes(bad))


def test_a_forked_child_checksums_on_its_own_threads(monkeypatch):
    """Threads do not survive fork(): a child checksums a large buffer on threads of its own
    (a pool kept across calls would leave it waiting forever on threads that do not exist)."""
    import os

    monkeypatch.setattr(threads, "budget", lambda: 2)
    buf = np.random.default_rng(9).integers(0, 256, checksum.PARALLEL_MIN + 1, dtype=np.uint8)
    want = ref.crc32c(buf)
    assert checksum.crc32c(buf) == want  # (the parent's parts on two threads)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        os._exit(0 if checksum.crc32c(buf) == want else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_the_checksum_does_not_load_numba():
    """Asking the thread budget for a large payload's checksum must not import Numba (the
    lossless codec and inspect need no kernel)."""
    import subprocess
    import sys

    script = (
        "import sys, numpy as np, codec\n"
        "f = codec.get_codec('none').encode(np.ones(3_000_000, np.float32))\n"
        "codec.inspect(f); codec.frame.parse_frame(f)\n"
        "assert 'numba' not in sys.modules, 'numba was imported'\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


def test_a_payload_check_joins_what_was_noted_and_checksums_the_rest():
    rng = np.random.default_rng(3)
    payload = rng.integers(0, 256, 100_003, dtype=np.uint8)
    want = ref.crc32c(payload)
    pieces = [(0, 10), (10, 5000), (7000, 7001), (7001, 100_003)]
    for noted in ([], pieces, pieces[1:3], pieces + pieces[:2]):  # none, all, some (gaps), some twice
        check = PayloadCheck(memoryview(payload), want)
        for lo, hi in noted:
            check.note(payload[lo:hi], ref.crc32c(payload[lo:hi]))
        check.note(payload[5:9], -1)  # (a kernel that formed none)
        check.note(np.zeros(8, np.uint8), 12345)  # (not the payload: ignored)
        check.verify()
    check = PayloadCheck(memoryview(payload), want)
    check.note(payload[:10], ref.crc32c(payload[:10]) ^ 1)  # a piece whose bytes changed
    out = np.ones(4, np.float32)
    with pytest.raises(codec.CorruptFrameError, match=r"^payload checksum mismatch: the section data is damaged$"):
        check.verify((out, None))
    assert np.isnan(out).all()
    PayloadCheck(memoryview(b""), 0).verify()


def _damaged(frame) -> bytes:
    b = bytearray(frame)
    b[-3] ^= 0x10  # a code's byte: the header still holds
    return bytes(b)


@pytest.mark.parametrize("spec", ["fp16", "bf16"])
def test_a_fused_decode_refuses_a_damaged_payload_and_leaves_out_nan(spec):
    from codec.frame import CHECK_IN_PASS_MIN

    rng = np.random.default_rng(1)
    n = CHECK_IN_PASS_MIN // 2 + 70_001  # a payload checked in the decode's pass
    x = (rng.standard_t(3, n) * 1e-2).astype(np.float32)
    tensors = {"a": x[:5], "b": x[5:60_000].reshape(-1, 5), "c": np.empty(0, np.float32), "d": x[60_000:].astype(np.float64)}
    c = codec.get_codec(spec)
    for frame, decode, fresh in (
        (c.encode(x), lambda f, out: codec.decode(f, out=out), lambda: np.ones_like(x)),
        (c.encode(x), lambda f, out: c.decode(f, out=out), lambda: np.ones_like(x)),
        (c.encode_many(tensors), lambda f, out: codec.decode_many(f, out=out), lambda: {k: np.ones_like(v) for k, v in tensors.items()}),
        (c.encode_many(tensors), lambda f, out: c.decode_many(f, out=out), lambda: {k: np.ones_like(v) for k, v in tensors.items()}),
    ):
        out = fresh()
        decode(frame, out)  # a sound frame: decoded, checked in the same pass
        for got, want in zip(out.values() if isinstance(out, dict) else [out], (tensors.values() if isinstance(out, dict) else [x])):
            assert np.array_equal(got, want.astype(c.value.dtype).astype(want.dtype))
        with pytest.raises(codec.CorruptFrameError, match=r"^payload checksum mismatch: the section data is damaged$"):
            decode(_damaged(frame), out)
        for got in out.values() if isinstance(out, dict) else [out]:
            assert np.isnan(got).all()  # never the damaged frame's values
        with pytest.raises(codec.CorruptFrameError, match=r"^payload checksum mismatch"):
            decode(_damaged(frame), None)


#: what a decode says of a code no encoder writes (a tensor's, or the first such of a run's)
FIELD_REFUSED = r"^values section: a code field of \d+, no encoder writes more than \d+$"


def _header_len(frame) -> int:
    """The header length of a frame of either format (the payload follows it)."""
    return codec.inspect(frame)["header_bytes"]


def _forged(frame, at: int) -> bytes:
    """``frame`` with its payload's byte ``at`` (from the end) set to 0xFF and both CRCs made
    right again: what only a forger sends, and only the decoder's range check refuses."""
    hl = _header_len(frame)
    b = bytearray(frame)
    b[-at] = 0xFF
    b[hl - 8 : hl - 4] = struct.pack("<I", ref.crc32c(bytes(b[hl:])))
    b[hl - 4 : hl] = struct.pack("<I", zlib.crc32(bytes(b[: hl - 4])))
    return bytes(b)


@pytest.mark.parametrize("spec", ["qsgd", "fp8", "minmax(bits=4)"])
def test_a_quantizer_checks_its_codes_in_the_pass_that_decodes_them(spec):
    """A quantizer's large frame decoded into ``out`` is checksummed, and its code fields
    tested, in the pass that decodes it (``dequantize_checked``): a sound frame gives what a
    decode checked before writing gives (``decode_add`` into zeros); a damaged one, and a
    forged one (a code beyond qsgd's levels or fp8's largest magnitude, both CRCs right),
    leave ``out`` NaN and raise what the check before writing raises, which ``decode_add``
    still makes first (its accumulator keeps its sum).  The same for a run of tensors
    (``dequantize_segments_checked``) through ``decode_many``, its general path and its
    replayed one, against ``decode_add_many``."""
    from codec.frame import CHECK_IN_PASS_MIN

    rng = np.random.default_rng(4)
    x = rng.standard_t(3, 2 * CHECK_IN_PASS_MIN + 3).astype(np.float32)  # a payload of over 1 MiB: checked in the pass
    c = codec.get_codec(spec)
    frame = c.encode(x)
    out = np.full_like(x, 7.0)
    c.decode(frame, out=out)
    assert np.array_equal(out, c.decode_add(frame, np.zeros_like(x)))
    bad = [(_damaged(frame), r"^payload checksum mismatch: the section data is damaged$")]
    if spec != "minmax(bits=4)":  # (every 4-bit code is one minmax writes)
        bad.append((_forged(frame, 1000), FIELD_REFUSED))
    for frame, message in bad:
        out = np.full_like(x, 7.0)
        with pytest.raises(codec.CorruptFrameError, match=message):
            c.decode(frame, out=out)
        assert np.isnan(out).all()
        acc = np.full_like(x, 7.0)
        with pytest.raises(codec.CorruptFrameError, match=message):
            c.decode_add(frame, acc)
        assert (acc == 7.0).all()

    tensors = {"a": x[5:], "b": x[:5], "c": x[:0]}  # (a run of tensors: read at once, decoded by one kernel)
    many = c.encode_many(tensors)
    bad = [(_damaged(many), r"^payload checksum mismatch: the section data is damaged$")]
    if spec != "minmax(bits=4)":
        bad.append((_forged(many, 1000), FIELD_REFUSED))
    for _ in range(2):  # the general path, then the replayed one (codec.replay: a plan learned from the sound frame)
        outs = {k: np.full_like(v, 7.0) for k, v in tensors.items()}
        c.decode_many(many, out=outs)
        assert all(np.array_equal(outs[k], c.decode_add_many(many, {k: np.zeros_like(v) for k, v in tensors.items()})[k]) for k in tensors)
        for frame, message in bad:
            with pytest.raises(codec.CorruptFrameError, match=message):
                c.decode_many(frame, out=outs)
            assert all(np.isnan(v).all() for v in outs.values())
            acc = {k: np.full_like(v, 7.0) for k, v in tensors.items()}
            with pytest.raises(codec.CorruptFrameError, match=message):
                codec.decode_add_many(frame, acc)
            assert all((v == 7.0).all() for v in acc.values())


def test_a_damaged_frame_is_named_so_whatever_its_damage_broke_first():
    """A frame checked in the decoding pass whose damage also breaks what reading checks
    first (a qsgd bucket's norm made negative) is refused for its checksum, as a frame
    checked before reading is (``codec.payloadcheck.reading``)."""
    from codec.frame import CHECK_IN_PASS_MIN

    x = np.random.default_rng(5).standard_normal(2 * CHECK_IN_PASS_MIN).astype(np.float32)
    c = codec.get_codec("qsgd")
    for frame, decode in ((c.encode(x), lambda f: c.decode(f, out=np.empty_like(x))), (c.encode_many({"a": x}), lambda f: c.decode_many(f, out={"a": np.empty_like(x)}))):
        b = bytearray(frame)
        b[_header_len(frame) + 3] ^= 0x80  # the first norm's sign bit (its scalars come first)
        with pytest.raises(codec.CorruptFrameError, match=r"^payload checksum mismatch"):
            decode(bytes(b))


@pytest.mark.parametrize("spec", ["none", "qsgd", "topk(ratio=0.1)", "fp16+zstd", "fp16"])
def test_what_is_not_checked_in_the_pass_is_checked_before_writing(spec):
    """A decode that does not checksum its codes as it reads them (a sparse codec, ``none``,
    a payload under ``CHECK_IN_PASS_MIN`` bytes: qsgd's here), a zstd frame, and every
    ``decode_add`` (an accumulator must keep its sum) refuse a damaged frame before writing:
    their ``out`` is untouched."""
    rng = np.random.default_rng(2)
    tensors = {"a": rng.standard_normal(3000).astype(np.float32), "b": rng.standard_normal(40).astype(np.float32)}
    c = codec.get_codec(spec)
    frame, many = c.encode(tensors["a"]), c.encode_many(tensors)
    calls = [lambda out: codec.decode_add_many(_damaged(many), out), lambda out: c.decode_add(_damaged(frame), out["a"])]
    if spec != "fp16":
        calls += [lambda out: codec.decode(_damaged(frame), out=out["a"]), lambda out: codec.decode_many(_damaged(many), out=out)]
    for call in calls:
        out = {k: np.full_like(v, 7.0) for k, v in tensors.items()}
        with pytest.raises(codec.CorruptFrameError):
            call(out)
        assert all((v == 7.0).all() for v in out.values())


@pytest.mark.parametrize("spec", ["fp16", "bf16", "none"])
def test_a_many_tensor_decode_writes_each_run_where_its_tensors_lie(spec):
    """Into given arrays, an elementwise codec decodes every consecutive tensor of one dtype in
    one pass (``write_segments``): the same values as each tensor decoded alone, for
    ``decode_many``, ``decode_add_many`` and ``subtract=True``, across dtypes, empty tensors and
    16-bit tensors (these through the per-run buffer)."""
    from codec.dtypes import bfloat16

    rng = np.random.default_rng(4)
    sizes = [(3,), (0,), (70_000,), (5, 7), (1,), (0,), (200_001,), (2,), (9,), (4,)]
    dts = [np.float32] * 5 + [np.float64, np.float64, np.float16, bfloat16, np.float32]
    tensors = {f"t{i}": (rng.standard_t(3, s) * 1e-2).astype(d) for i, (s, d) in enumerate(zip(sizes, dts))}
    c = codec.get_codec(spec)
    frame = c.encode_many(tensors)
    alone = {k: codec.decode(c.encode(v)) for k, v in tensors.items()}
    out = {k: np.full_like(v, 5) for k, v in tensors.items()}
    assert codec.decode_many(frame, out=out) is out
    acc = {k: np.full_like(v, 0.25) for k, v in tensors.items()}
    codec.decode_add_many(frame, acc)
    sub = {k: np.full_like(v, 0.25) for k, v in tensors.items()}
    codec.decode_add_many(frame, sub, subtract=True)
    for k, v in tensors.items():
        assert np.array_equal(out[k], alone[k]) and out[k].dtype == v.dtype
        want = np.full_like(v, 0.25)
        c.decode_add(c.encode(v), want)
        assert np.array_equal(acc[k], want), k
        want = np.full_like(v, 0.25)
        c.decode_add(c.encode(v), want, subtract=True)
        assert np.array_equal(sub[k], want), k
