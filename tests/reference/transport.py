"""A serial reference for ``transport.Allreducer``: every rank simulated in one process.

Built on the codec's public API only (``get_codec``, ``ErrorFeedback``, ``Codec.encode``,
``Codec.decode_add``, ``codec.arrays.round_to``); nothing from ``transport`` is imported, so a
bug in the transport cannot hide in its own reference.  Importable as ``reference.transport``
from tests/ (tests/reference/__init__.py).

    ref = Reference("topk(ratio=0.01)+fp16", size=4)
    want = ref.step([inputs_of_rank_0, ..., inputs_of_rank_3])     # dicts (or lists) of arrays

What one step computes (the allgather scheme, docs in transport/schemes/allgather.py):

* every rank encodes every tensor: through its OWN ``ErrorFeedback`` (one per rank) with key
  ``(name, rank)`` (``rank_streams=True``) or ``name``; without error feedback (or for a
  lossless codec) ``codec.encode(x, key=..., step=<frames this key made before>)`` (the key's
  step: the index of the call when every call sends the same tensors);
* per tensor, ``acc = zeros(shape, float32 | float64 for float64 tensors)``, then
  ``decode_add`` of rank 0's frame, rank 1's, ... in rank order;
* ``average`` (and more than one rank): ``acc / size``, once; then rounded once to the
  tensor's dtype.  ``vote``: ``sign(acc)`` in the tensor's dtype, never averaged.

The module also makes deterministic per-rank inputs (:func:`make_inputs`) so every MPI rank
can compute the inputs of all ranks, and the reference, locally.
"""

from __future__ import annotations

import hashlib

import numpy as np

import codec
from codec.dtypes import bfloat16
from codec.arrays import round_to

F16 = np.dtype(np.float16)
BF16 = np.dtype(bfloat16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)

#: a layout used by several checks: every dtype, a 2-D tensor, a large one and an empty one
MIXED = (
    ("conv.weight", (16, 3, 3, 3), F16),
    ("fc.weight", (40, 50), BF16),
    ("big", (200_001,), F32),
    ("empty", (0,), F32),
    ("fc.bias", (50,), F64),
    ("scalar", (), F32),
)
#: a smaller layout for the many-configuration checks (still every dtype and an empty tensor)
SMALL = (
    ("w16", (12, 40), F16),
    ("wbf", (300,), BF16),
    ("w32", (2000,), F32),
    ("void", (0,), F64),
    ("w64", (3, 50), F64),
)


def acc_dtype(dtype) -> np.dtype:
    """The accumulator the reference sums a tensor of ``dtype`` in."""
    return F64 if np.dtype(dtype) == F64 else F32


def finish(acc: np.ndarray, dtype, p: int, average: bool) -> np.ndarray:
    """One division by ``p`` in the accumulator dtype (when averaging), one rounding."""
    acc = np.array(acc, copy=True)
    if average and p > 1:
        acc = acc / acc.dtype.type(p)
    return round_to(acc, np.dtype(dtype))


def make_array(seed: int, rank: int, step: int, index: int, shape, dtype) -> np.ndarray:
    """A deterministic input: normal values, a per-rank scale, a few exact zeros."""
    rng = np.random.default_rng([seed, rank, step, index])
    n = int(np.prod(shape, dtype=np.int64))
    x = rng.standard_normal(n) * (0.5 + rank) * 10.0 ** rng.integers(-2, 2)
    if n:
        x[rng.integers(0, n, size=max(1, n // 50))] = 0.0
    if np.dtype(dtype) == BF16:
        x = x.astype(np.float32).astype(BF16)
    else:
        x = x.astype(dtype)
    return x.reshape(shape)


def make_inputs(seed: int, rank: int, step: int, layout=MIXED, kind: str = "dict"):
    """The tensors rank ``rank`` passes at ``step``: a dict name -> array (``kind="dict"``), or
    a list / tuple of the arrays in layout order."""
    arrays = [make_array(seed, rank, step, i, shape, dtype) for i, (_, shape, dtype) in enumerate(layout)]
    if kind == "dict":
        return {name: a for (name, _, _), a in zip(layout, arrays)}
    return arrays if kind == "list" else tuple(arrays)


def items(tensors):
    """(keys, arrays) of a dict / list / tuple of tensors, as the transport names them."""
    if isinstance(tensors, dict):
        return list(tensors), list(tensors.values())
    return list(range(len(tensors))), list(tensors)


def rebuild(like, arrays):
    if isinstance(like, dict):
        return dict(zip(like, arrays))
    return list(arrays) if isinstance(like, list) else tuple(arrays)


class Reference:
    """Every rank's encoder, and the reduction, for one Allreducer configuration."""

    def __init__(self, spec, size: int, *, average=True, error_feedback=True, vote=False, rank_streams=True, checksum=False):
        self.codec = codec.get_codec(spec, checksum=checksum)  # the Allreducer's default: no payload checksum
        self.size = int(size)
        self.average, self.vote, self.rank_streams = average, vote, rank_streams
        self.use_ef = bool(error_feedback) and not self.codec.lossless
        #: one ErrorFeedback per simulated rank (None without error feedback)
        self.efs = [codec.ErrorFeedback(self.codec) for _ in range(self.size)] if self.use_ef else None
        self.calls = 0
        #: (rank, key) -> frames made under that key without error feedback
        self.steps: dict = {}
        #: the frames of the last step, frames[rank][tensor index]
        self.frames = None

    def key(self, name, rank):
        return (name, rank) if self.rank_streams else name

    def encode(self, rank: int, tensors) -> list[bytes]:
        keys, arrays = items(tensors)
        if self.use_ef:
            return [self.efs[rank].encode(a, key=self.key(k, rank)) for k, a in zip(keys, arrays)]
        frames = []
        for k, a in zip(keys, arrays):
            step = self.steps.get((rank, self.key(k, rank)), 0)
            frames.append(self.codec.encode(a, key=self.key(k, rank), step=step))
            self.steps[(rank, self.key(k, rank))] = step + 1
        return frames

    def step(self, per_rank):
        """The reduced result every rank must get, for ``per_rank[r]`` = rank r's tensors."""
        assert len(per_rank) == self.size
        self.frames = [self.encode(r, t) for r, t in enumerate(per_rank)]
        self.calls += 1
        _, arrays = items(per_rank[0])
        out = []
        for i, a in enumerate(arrays):
            acc = np.zeros(a.shape, acc_dtype(a.dtype))
            for r in range(self.size):
                self.codec.decode_add(self.frames[r][i], acc)
            if self.vote:
                out.append(np.sign(acc).astype(a.dtype))
                continue
            out.append(finish(acc, a.dtype, self.size, self.average))
        return rebuild(per_rank[0], out)

    def residual(self, rank: int, name) -> np.ndarray:
        return self.efs[rank].residual(self.key(name, rank))

    def message(self, rank: int, tensors) -> bytes:
        """Rank ``rank``'s message in the last step: the many-tensor frame (layout-hash form)
        holding the sections of its single-tensor frames, assembled here from them."""
        from codec.frame import Section, parse_frame

        sections = []
        for f in self.frames[rank]:
            fr = parse_frame(f)
            sections.append([Section(s.kind, s.bits, s.count, data=fr.raw(i)) for i, s in enumerate(fr.sections)])
        _, arrays = items(tensors)
        layout = codec.Layout(tuple(a.shape for a in arrays), tuple(a.dtype for a in arrays))
        return self.codec.frame_many(sections, layout, "hash")

    def message_bytes(self, rank: int, tensors) -> int:
        """The length of rank ``rank``'s message in the last step."""
        return len(self.message(rank, tensors))

    def wire(self, rank: int, tensors) -> list[int]:
        """Each tensor's share of rank ``rank``'s message: its sections' raw bytes, the rest
        of the message shared in proportion to them."""
        raw = [sum(s.raw_len for s in parse_frame_sections(f)) for f in self.frames[rank]]
        total, size = sum(raw), self.message_bytes(rank, tensors)
        return [round(r * size / total) for r in raw] if total else [size // max(1, len(raw))] * len(raw)


def parse_frame_sections(frame) -> list:
    from codec.frame import parse_frame

    return parse_frame(frame).sections


#: (one ulp at 1.0, the smallest subnormal) of each dtype
_ULP = {F16: (2.0**-10, 2.0**-24), BF16: (2.0**-7, 2.0**-133), F32: (2.0**-23, 2.0**-149), F64: (2.0**-52, 2.0**-1074)}


def dense_reference(per_rank, *, average=True):
    """``none`` (MPI Allreduce, the library's summation order): per tensor ``(exact, bound)``,
    the exact mean (or sum) in float64 of the inputs, and a bound on what summing in the
    accumulator dtype in any order, dividing, and rounding once to the tensor's dtype may add."""
    size = len(per_rank)
    cols = [items(t)[1] for t in per_rank]
    out = []
    for i, a in enumerate(cols[0]):
        xs = np.stack([c[i].astype(np.float32).astype(np.float64) if c[i].dtype == BF16 else c[i].astype(np.float64) for c in cols])
        div = size if average and size > 1 else 1
        exact, mag = xs.sum(axis=0) / div, np.abs(xs).sum(axis=0) / div
        acc_ulp = _ULP[acc_dtype(a.dtype)][0]
        summed = size * acc_ulp * mag  # (size - 1) additions and a division, each within half an ulp
        out_ulp, tiny = _ULP[np.dtype(a.dtype)]
        out.append((exact, summed + out_ulp * (np.abs(exact) + summed) + tiny))
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Shape, dtype and every byte equal (NaN-safe: compares the bytes, not the values)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def digest(tensors) -> str:
    """A hash of a result's keys, dtypes, shapes and bytes (to compare across ranks)."""
    h = hashlib.blake2b(digest_size=16)
    keys, arrays = items(tensors)
    h.update(type(tensors).__name__.encode())
    for k, a in zip(keys, arrays):
        h.update(repr((k, a.dtype.name, a.shape)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()
