"""The index family's CUDA twin (codec/kernels/cuda/index.py) against the CPU kernel and NumPy
references, in the simulator: one set's gaps and bitmaps (several chunks, sizes 0, 1, odd,
not a multiple of a chunk, sparse, dense and heavy-tailed sets, and the refusals), the many-set
kernels over edge-sized sets, and ``codec.decode`` of a sparse frame into a device array,
which reads its positions on the device."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

import codec
from codec.errors import CorruptFrameError
from codec.frame import SectionInfo, SectionKind
from codec.kernels import module
from codec.dtypes import readonly as ro
from codec.dtypes import on_device
from codec.pack import encode_indices, index_segments, section_table

K = module("index", "cuda")
CPU = module("index", "cpu")


def sets(seed=0):
    """``(positions, n)``: empty, one, the widest gap, sparse and dense random sets, a
    heavy-tailed top-k's, every element, over sizes around the twin's chunk."""
    rng = np.random.default_rng(seed)
    out = []
    for n in (0, 1, 7, 255, 256, 257, 2 * K.CHUNK * 8 + 13):
        for density in (0.0, 0.02, 0.5, 1.0):
            out.append((np.flatnonzero(rng.random(n) < density) if density < 1 else np.arange(n), n))
        if n:
            out.append((np.array([n - 1]), n))
            x = np.abs(rng.standard_t(2, n))
            out.append((np.sort(np.argsort(-x, kind="stable")[: max(1, n // 10)]), n))
    return [(p.astype(np.int64), n) for p, n in out]


def ref_gaps(idx):
    return np.diff(idx, prepend=-1) - 1


def test_gaps_round_trip_as_the_cpu():
    for idx, n in sets():
        gaps = cuda.to_device(np.full(idx.size, 7, np.uint64))
        assert K.delta_encode(cuda.to_device(idx) if idx.size else idx, gaps) == (ref_gaps(idx).max() if idx.size else 0), n
        want = np.empty(idx.size, np.uint64)
        CPU.delta_encode(ro(idx), want)  # (the CPU kernels' inputs read-only, as the stages pass them)
        assert np.array_equal(gaps.copy_to_host(), want)
        back = cuda.to_device(np.full(idx.size, -5, np.int64))
        assert K.delta_decode(gaps, n, back) is True
        assert np.array_equal(back.copy_to_host(), idx), n


def test_gaps_refused_as_the_cpu():
    idx = np.flatnonzero(np.random.default_rng(1).random(3000) < 0.3).astype(np.int64)  # several chunks
    for bad in (idx[::-1].copy(), np.concatenate([idx, idx[-1:]]), np.array([-1, 4], np.int64)):
        assert K.delta_encode(cuda.to_device(bad), cuda.device_array(bad.size, np.uint64)) == -1
    gaps = ref_gaps(idx).astype(np.uint64)
    for n in (int(idx[-1]), 1, 0):  # the last position reaches n; every one does
        assert K.delta_decode(gaps, n, np.empty(idx.size, np.int64)) is False
        assert CPU.delta_decode(ro(gaps), n, np.empty(idx.size, np.int64)) is False
    huge = gaps.copy()
    huge[K.CHUNK + 3] = np.uint64(2**63)  # one gap past any n, in a later chunk: no sum wraps
    assert K.delta_decode(huge, 10**9, np.empty(idx.size, np.int64)) is False
    many = np.full(4 * K.CHUNK, 2**40, np.uint64)  # each gap fits, their sum does not
    assert K.delta_decode(many, 2**41, np.empty(many.size, np.int64)) is False
    with pytest.raises(ValueError, match="n:"):
        K.delta_decode(gaps, 2**62, np.empty(idx.size, np.int64))


def test_bitmaps_as_the_cpu(monkeypatch):
    monkeypatch.setattr(K._cpu, "_BYTES", 2 * K.CHUNK)  # the CPU's chunks of bytes, shrunk: several
    for idx, n in sets(2):
        bitmap = cuda.to_device(np.full((n + 7) // 8, 0xA5, np.uint8))  # every byte written
        K.bitmap_encode(cuda.to_device(idx) if idx.size else idx, bitmap)
        m = np.zeros(n, np.uint8)
        m[idx] = 1
        got = bitmap.copy_to_host()
        assert got.tobytes() == np.packbits(m, bitorder="little").tobytes(), n
        counts = K.bitmap_count(bitmap)
        chunk = 2 * K.CHUNK * 8
        assert np.array_equal(counts, [np.count_nonzero(m[a : a + chunk]) for a in range(0, n, chunk)]), n
        starts = np.concatenate([[0], np.cumsum(counts[:-1])]).astype(np.int64)
        pos = cuda.to_device(np.full(idx.size, -1, np.int64))
        K.bitmap_decode(bitmap, starts, pos)
        assert np.array_equal(pos.copy_to_host(), idx), n


def test_bitmaps_outside_the_contract_as_the_cpu(monkeypatch):
    """Positions outside the bitmap are skipped, as the CPU's chunks never visit them, and a
    decode given fewer chunk starts than the bitmap has reads those chunks only."""
    monkeypatch.setattr(K._cpu, "_BYTES", K.CHUNK)
    idx = np.array([-3, 5, 9, 8 * 3 * K.CHUNK - 1, 8 * 3 * K.CHUNK + 4], np.int64)
    bitmap = cuda.to_device(np.full(3 * K.CHUNK, 0xA5, np.uint8))
    K.bitmap_encode(cuda.to_device(idx), bitmap)
    want = np.zeros(3 * K.CHUNK, np.uint8)
    want[0], want[1], want[-1] = 1 << 5, 1 << 1, 0x80
    assert np.array_equal(bitmap.copy_to_host(), want)
    pos = cuda.to_device(np.full(3, -1, np.int64))
    K.bitmap_decode(bitmap, np.array([0], np.int64), pos)  # the first chunk only
    assert pos.copy_to_host().tolist() == [5, 9, -1]


@pytest.mark.parametrize("n, idx", [(300, [0, 7, 9, 200]), (5000, [3, 4000]), (1 << 20, [5, 300000, (1 << 20) - 1]), ((1 << 41) + 9, [1, (1 << 40) + 5, 1 << 41])])
def test_every_gap_width_class_decodes_on_the_device(n, idx):
    """decode_indices(device=True) through every code dtype the gaps unpack into (uint8,
    uint16, uint32, uint64) gives the host's positions."""
    from codec.pack import decode_indices

    sec = encode_indices(np.array(idx), n)
    info = SectionInfo(int(sec.kind), 0, sec.bits, sec.count, sec.raw_len, sec.raw_len, 0)
    got = decode_indices(info, sec.data, n, device=True)
    assert not isinstance(got, np.ndarray) and np.array_equal(got.copy_to_host(), decode_indices(info, sec.data, n)), sec.bits


def test_many_sets_as_the_cpu():
    """index_widths, index_write, index_counts and index_read over every set at once: the
    CPU kernels' widths, bytes, counts and positions (the sections written by
    codec.pack.index_segments on the host)."""
    pairs = sets(3)
    pos = np.concatenate([p for p, _ in pairs])
    starts = np.concatenate([[0], np.cumsum([p.size for p, _ in pairs])]).astype(np.int64)
    sizes = np.array([n for _, n in pairs], np.int64)
    widths = cuda.device_array(sizes.size, np.int64)
    K.index_widths(cuda.to_device(pos), starts, sizes, widths)
    want = np.empty(sizes.size, np.int64)
    CPU.index_widths(ro(pos), ro(starts), ro(sizes), want)
    assert np.array_equal(widths.copy_to_host(), want)
    bad = pos.copy()
    bad[starts[-2]] = sizes[-1]  # the last set's first position: past its tensor
    K.index_widths(cuda.to_device(bad), starts, sizes, widths)
    assert widths.copy_to_host()[-1] == -1
    run = index_segments(pos, starts, sizes)
    bitmap = np.array(run.kinds) == SectionKind.INDEX_BITMAP
    w = np.array(run.widths, np.int64)
    out = cuda.to_device(np.full(run.data.size, 0x5A, np.uint8))
    K.index_write(cuda.to_device(pos), starts, w, bitmap, run.offsets, out)
    assert out.copy_to_host().tobytes() == run.data.tobytes()
    found = cuda.device_array(sizes.size, np.int64)
    table = section_table([SectionInfo(k, 0, b, c, n, n, o) for k, b, c, n, o in zip(run.kinds, run.widths, run.counts, np.diff(run.offsets).tolist(), run.offsets.tolist())])
    K.index_counts(out, cuda.to_device(table), sizes, found)
    assert np.array_equal(found.copy_to_host(), np.diff(starts))
    damaged = table.copy()
    damaged[0, 4] += 1  # a length not its count's
    K.index_counts(out, cuda.to_device(damaged), sizes, found)
    want = np.empty(sizes.size, np.int64)
    CPU.index_counts(ro(run.data), ro(damaged), sizes, want)
    assert found.copy_to_host().tolist() == want.tolist() and want[0] == -1
    back = cuda.to_device(np.full(pos.size, -1, np.int64))
    flags = cuda.to_device(np.zeros(sizes.size, np.uint8))
    K.index_read(out, cuda.to_device(table), sizes, starts, back, flags)
    assert np.array_equal(back.copy_to_host(), pos) and not flags.copy_to_host().any()
    short = sizes.copy()
    short[-1] = pos[-1]  # the last set's last position reaches its (shrunk) size
    K.index_read(out, cuda.to_device(table), short, starts, back, flags)
    assert flags.copy_to_host().tolist() == [0] * (sizes.size - 1) + [1]
    dev_run = index_segments(cuda.to_device(pos), starts, sizes)  # device positions: the same sections, made there
    assert dev_run.data.tobytes() == run.data.tobytes() and (dev_run.kinds, dev_run.widths, dev_run.counts) == (run.kinds, run.widths, run.counts)
    tensors = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    absolute = cuda.device_array(pos.size, np.int64)
    K.absolute_positions(cuda.to_device(pos), starts, tensors, absolute)
    assert np.array_equal(absolute.copy_to_host(), pos + np.repeat(tensors[:-1], np.diff(starts)))


@pytest.mark.parametrize("case", range(len(sets(5))))
def test_one_set_encoded_on_the_device(case):
    """codec.pack.encode_indices of device positions: the host's section, byte for byte
    (gaps packed or the bitmap, whichever the host chooses), and its refusals."""
    idx, n = sets(5)[case]
    dev = encode_indices(cuda.to_device(idx), n)
    host = encode_indices(idx, n)
    assert (dev.kind, dev.bits, dev.count) == (host.kind, host.bits, host.count)
    assert on_device(dev.data) and bytes(dev.materialize()) == bytes(host.materialize())  # (left on the device until the frame is written)
    if idx.size:
        with pytest.raises(ValueError, match=r"idx: positions must lie in \[0, "):
            encode_indices(cuda.to_device(idx), int(idx[-1]))
    if idx.size > 1:
        with pytest.raises(ValueError, match="strictly increasing"):
            encode_indices(cuda.to_device(idx[::-1].copy()), n)


@pytest.mark.parametrize("spec", ["topk(ratio=0.02)", "threshold(value=0.3)"])  # gaps; a bitmap
def test_a_sparse_frame_decodes_its_positions_on_the_device(monkeypatch, spec):
    """codec.decode / decode_add into a device array read the frame's index section on the
    device: what crosses to it is the section's bytes and the kept values, not 8 bytes a
    position, and the arrays equal the host's decode."""
    x = np.random.default_rng(5).standard_normal(3000).astype(np.float32)
    c = codec.get_codec(spec)
    frame = c.encode(x)
    out = cuda.to_device(np.full(x.size, 9, np.float32))
    moved = []
    real = cuda.to_device
    monkeypatch.setattr(cuda, "to_device", lambda a, *r, **k: (moved.append(np.asarray(a).nbytes), real(a, *r, **k))[1])
    codec.decode(frame, out=out)
    want = codec.decode(frame)
    assert np.array_equal(out.copy_to_host(), want)
    kept = int(np.count_nonzero(want))
    assert sum(moved) < kept * 4 + kept * 2 + 64, moved  # values, and the section's bytes: under 2 bytes a position
    c.decode_add(frame, out)
    assert np.array_equal(out.copy_to_host(), want * 2)
    half = cuda.to_device(np.ones(x.size, np.float16))
    c.decode_add(frame, half)
    assert np.array_equal(half.copy_to_host(), (np.float32(1) + want).astype(np.float16))


def test_a_forged_index_section_fails_on_the_device_before_out_changes():
    x = np.zeros(2000, np.float32)
    x[[5, 900, 1999]] = [1, 2, 3]
    sec = encode_indices(np.array([5, 900, 1999]), 2000)
    assert sec.kind == SectionKind.INDEX_DELTA
    frame = bytearray(codec.get_codec("topk(k=3)", checksum=False).encode(x))
    at = bytes(frame).index(bytes(sec.data))
    forged = bytes(encode_indices(np.array([5, 900, 2000]), 2001).data)  # the same width: the last gap one longer
    assert len(forged) == len(sec.data) and forged != bytes(sec.data)
    frame[at : at + len(forged)] = forged
    out = cuda.to_device(np.full(2000, 4, np.float32))
    with pytest.raises(CorruptFrameError, match="beyond"):
        codec.decode(bytes(frame), out=out)
    assert (out.copy_to_host() == 4).all()


@pytest.mark.parametrize("spec", ["topk(ratio=0.05)", "dgc(ratio=0.05)+fp16"])
def test_a_many_tensor_frame_reads_a_lone_tensors_positions_on_the_device(monkeypatch, spec):
    """decode_many / decode_add_many into device arrays: a tensor read alone (here a float64
    one among float32 ones) reads its index section on the device, the runs' positions are
    read at once on the host (whatever the threshold) and cross as int64, and a small
    section of a tensor read alone is read on the host too; every array is the host's."""
    import codec.pack

    rng = np.random.default_rng(6)
    host = [rng.standard_normal(40).astype(np.float32), rng.standard_normal(9).astype(np.float32),
            rng.standard_normal(60).astype(np.float32), rng.standard_t(2, 3000)]
    c = codec.get_codec(spec)
    frame = c.encode_many(host)
    pairs = codec.decode_sparse_many(frame)
    alone, run = pairs[3][0].size, sum(p.size for p, _ in pairs[:3])
    outs = [cuda.device_array(a.size, a.dtype) for a in host]
    moved = []
    real = cuda.to_device
    monkeypatch.setattr(cuda, "to_device", lambda a, *r, **k: (moved.append((np.asarray(a).dtype, np.asarray(a).size)), real(a, *r, **k))[1])
    codec.decode_many(frame, out=outs)
    assert sum(n for t, n in moved if t == np.int64) == run and alone > run, moved  # the run's, per tensor; not the lone one's
    monkeypatch.setattr(codec.pack, "DEVICE_SECTION", 1 << 20)  # the lone one's section: small
    moved.clear()
    codec.decode_many(frame, out=outs)
    assert sum(n for t, n in moved if t == np.int64) == run + alone, moved
    for o, w in zip(outs, codec.decode_many(frame)):
        assert np.array_equal(o.copy_to_host(), w)
    base = [rng.standard_normal(a.size).astype(np.float32) for a in host]
    acc = [cuda.to_device(b) for b in base]
    c.decode_add_many(frame, acc, subtract=True)
    c.decode_add_many(frame, base, subtract=True)
    for a, b in zip(acc, base):
        assert np.array_equal(a.copy_to_host(), b)


def test_a_small_section_is_read_on_the_host(monkeypatch):
    """Below codec.pack.DEVICE_SECTION bytes a decode into a device array reads the section
    on the host (launches cost more than the bytes) and copies the positions: the same array."""
    import codec.pack

    x = np.random.default_rng(7).standard_normal(3000).astype(np.float32)
    c = codec.get_codec("topk(ratio=0.02)")
    frame = c.encode(x)
    out = cuda.to_device(np.zeros(x.size, np.float32))
    for limit, positions in ((1 << 20, True), (0, False)):
        monkeypatch.setattr(codec.pack, "DEVICE_SECTION", limit)
        moved = []
        real = cuda.to_device
        monkeypatch.setattr(cuda, "to_device", lambda a, *r, **k: (moved.append(np.asarray(a).dtype), real(a, *r, **k))[1])
        c.decode(frame, out=out)
        monkeypatch.setattr(cuda, "to_device", real)
        assert (np.dtype(np.int64) in moved) is positions, (limit, moved)
        assert np.array_equal(out.copy_to_host(), c.decode(frame))
