"""The ``pairs`` family (codec/kernels/cpu/pairs.py, host only): a sparse frame of index
sections and raw values written from a selection's finds (``pair_payload``) and its header's
patterns and counts (``pair_head``), against NumPy references and the frame builder; the
reader, ``pair_sections``, is checked against the parser in tests/test_many_parse.py."""

from __future__ import annotations

import numpy as np
import pytest

from codec.kernels import module
from codec.layout import CHUNK
from codec.manyframe import Layout
from codec.manyframe.build import head_of
from codec.manyframe.parse import read_header
from codec.section import SectionKind

K = module("pairs")
BITMAP, DELTA, VALUES = int(SectionKind.INDEX_BITMAP), int(SectionKind.INDEX_DELTA), int(SectionKind.VALUES)


def index_section(idx: np.ndarray, n: int) -> tuple[int, int, int, bytes]:
    """NumPy's index section of the sorted set ``idx`` of ``n`` elements: (kind, bits, count,
    bytes), packed gaps minus one in the bit length of the largest (at least 1), LSB first,
    unless a bitmap takes fewer bytes."""
    gaps = np.diff(np.concatenate([[-1], idx])) - 1
    w = max(1, int(gaps.max()).bit_length()) if gaps.size else 1
    full = (n + 7) // 8
    if (idx.size * w + 7) // 8 > full:
        bits = np.zeros(8 * full, np.uint8)
        bits[idx] = 1
        return BITMAP, 1, n, np.packbits(bits, bitorder="little").tobytes()
    flat = ((gaps[:, None] >> np.arange(w)) & 1).astype(np.uint8).reshape(-1)
    return DELTA, w, idx.size, np.packbits(flat, bitorder="little").tobytes()


def finds(sizes, picks, rng, spare=3):
    """``find_segments``' arrays for these picks: each set at ``room[t]`` of ``pos`` with
    ``spare`` unused places after it (holding junk), and the counts."""
    room = np.concatenate([[0], np.cumsum([p.size + spare for p in picks])]).astype(np.int64)
    pos = rng.integers(-5, 5, int(room[-1])).astype(np.int64)
    for r, p in zip(room, picks):
        pos[r : r + p.size] = p
    return room, pos, np.array([p.size for p in picks], np.int64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=str)
def test_pair_payload_writes_each_tensors_index_section_then_its_values(dtype):
    """Sizes 0, 1, odd and past a chunk; no pairs, every element, sets whose gaps or bitmap
    is the smaller: each tensor's index section as NumPy packs it, then its values' bytes,
    and the table of both sections, in both compilations; a set that is not increasing, or
    one past its tensor, and too small an ``out`` are refused."""
    rng = np.random.default_rng(3)
    sizes = [0, 1, 9, 333, CHUNK + 1, 5, 64, 1000]
    picks = [np.empty(0, np.int64), np.array([0]), np.array([2, 3, 8]), np.sort(rng.choice(333, 300, replace=False)), np.sort(rng.choice(CHUNK + 1, 40, replace=False)), np.empty(0, np.int64), np.arange(64), np.array([999])]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    flat = rng.standard_t(2, int(starts[-1])).astype(dtype)
    room, pos, counts = finds(sizes, picks, rng)
    want, table = b"", []
    for n, p, s in zip(sizes, picks, starts):
        kind, bits, count, raw = index_section(p, n)
        want += raw + flat[s + p].tobytes()
        table.append((kind, bits, count, VALUES, 8 * flat.itemsize, p.size))
    assert {row[0] for row in table} == {BITMAP, DELTA}
    for twin in ("serial", "parallel"):
        out = np.full(len(want) + 9, 0xAB, np.uint8)
        tab = np.full((len(sizes), 6), -1, np.int64)
        assert getattr(K.pair_payload, twin)(flat, starts, pos, room, counts, out, tab) == len(want)
        assert out[: len(want)].tobytes() == want and tab.tolist() == [list(r) for r in table]
        assert getattr(K.pair_payload, twin)(flat, starts, pos, room, counts, out[: len(want) - 1], tab) == -1
        for bad in ([2, 8, 3], [2, 3, 9]):  # not increasing; past the tensor's 9 elements
            wrong = pos.copy()
            wrong[room[2] : room[2] + 3] = bad
            assert getattr(K.pair_payload, twin)(flat, starts, wrong, room, counts, out, tab) == -1


def _after_layout(spec: str, layout: Layout, tables) -> bytes:
    """What the frame builder writes after the layout for these sections."""
    head, _, _ = head_of(spec, layout, tables, 0)
    return head[read_header(memoryview(head + bytes(4))).table_end :]


def test_pair_head_writes_what_the_frame_builder_writes():
    """Random tables of two sections per tensor (a few patterns shared by many tensors,
    counts of 0, 1 and many, values counts equal to the index count or not, counts past a
    varint's byte): the builder's bytes after the layout; a kind of 16 or more and too small
    an ``out`` are refused."""
    rng = np.random.default_rng(8)
    for trial in range(60):
        count = int(rng.integers(0, 12))
        table = np.empty((count, 6), np.int64)
        for t in range(count):
            kind = int(rng.choice([BITMAP, DELTA]))
            bits = 1 if kind == BITMAP else int(rng.integers(1, 4))
            c0 = int(rng.choice([0, 1, 2, 300, int(rng.integers(0, 50))]))
            c1 = c0 if rng.random() < 0.7 else int(rng.choice([0, 1, 7, 200]))
            table[t] = (kind, bits, c0, VALUES, int(rng.choice([32, 64])), c1)
        layout = Layout(tuple((int(n),) for n in rng.integers(1, 9, count)), (np.dtype(np.float32),) * count)
        tables = tuple(((int(r[0]), int(r[1]), int(r[2])), (int(r[3]), int(r[4]), int(r[5]))) for r in table)
        want = _after_layout("topk(ratio=0.1)", layout, tables)
        out = np.zeros(12 + 25 * count, np.uint8)
        assert K.pair_head(table, out) == len(want) and out[: len(want)].tobytes() == want, trial
    assert K.pair_head(table, out[:-1]) == -1
    if count:
        table[0, 3] = 16
        assert K.pair_head(table, out) == -1
