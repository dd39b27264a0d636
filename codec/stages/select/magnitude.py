"""What the magnitude sparsifiers share (their stage bases are in codec/stages/select/base.py):
``k`` from a ratio, and :class:`Magnitudes`, which
finds the elements of ``acc`` at or above a cut in one pass (fused with ``x + residual``
under error feedback) and answers exact questions about the top of ``|acc|`` from them.

The cut comes from a strided sample, chosen so that the candidates are somewhat more than
a rule needs (20% and four binomial standard deviations); every rule is then applied exactly (float64 comparisons, ties to the
lower index) to the candidates.  If the sample misjudged, the cut is lowered and the kernel
runs again on the formed ``acc``: the result never depends on the sample, only the time.
"""

from __future__ import annotations

import math

import numpy as np

from codec.device import host_copy, Memory
from codec.dtypes import on_device
from codec.errors import NonFiniteError
from codec.ops import add, first_nonfinite, offsets, readonly, WIDE, widen
from codec.kernels import backend
from codec.layout import CHUNK, chunks, LANES, sample_rank
from codec.pack import index_segments

#: elements sampled to choose a cut (all of them below this size)
SAMPLE = 1 << 16
#: elements sampled where the sample only guides the cut (no moments are taken from it: top-k's,
#: threshold's candidates), from tensors of up to 8 * SAMPLE elements: at least this many,
#: or an eighth of the tensor.  A tensor of 32,768 elements (the sample's fc1) took its
#: exact k-th largest of all of them in float64 (three 256 KB buffers: conversion, magnitudes,
#: np.partition's copy, each an mmap and its page faults once glibc's threshold sits below
#: them; 260-830 us a top-k encode), where 4,096 values leave ~700 candidates
GUIDE = 1 << 12
#: values per run of the line sample (:meth:`Magnitudes._line_sample`): a 64-byte line of float32
LINE = 16


def k_of(ratio: float, n: int) -> int:
    """``max(1, floor(ratio * n))`` capped at ``n``; 0 for an empty array."""
    return 0 if n == 0 else min(n, max(1, math.floor(ratio * n)))


def ks_of(ratio: float, sizes: np.ndarray) -> np.ndarray:
    """:func:`k_of` of each of ``sizes`` (int64, below 2**53): the same float64 product."""
    return np.minimum(np.maximum(np.floor(ratio * sizes), 1), sizes).astype(np.int64)  # (0 stays 0: the cap)


def collect(run, nchunk: int, cap: int, vdtype=None, device: bool = False):
    """Positions found by a chunked kernel, in increasing order (and their values when
    ``vdtype`` is given), where the kernel's buffers live.

    ``run(chunks, buf, vals, counts)`` fills row ``c - chunks[0]`` of ``buf`` (and ``vals``) with
    chunk ``c``'s first ``buf.shape[1]`` finds and ``counts[c]`` with how many it found.  A
    chunk that found more than ``cap`` runs again alone into a row of the exact size.
    ``device``: the buffers are device arrays (the kernel is the CUDA twin); the rows are
    gathered there and stay there: only the counts (8 bytes per chunk of ``CHUNK`` values)
    come to the host.
    """
    mem = Memory(device)
    want = vdtype is not None
    vdt = np.dtype(vdtype or np.float32)
    buf = mem.empty((nchunk, cap), np.int64)
    vals = mem.empty((nchunk, cap) if want else (0, 0), vdt)
    counts = mem.zeros(nchunk, np.int64)
    run(np.array([0, nchunk], np.int64), buf, vals, counts)
    found = mem.host(counts)
    if nchunk == 1 and found[0] <= cap:  # one chunk (a small tensor): its row is the answer
        m = int(found[0])
        return buf[0, :m], (vals[0, :m] if want else None)
    starts = offsets(found[:-1])
    total = int(found.sum())
    out = mem.empty(total, np.int64)
    vout = mem.empty(total if want else 0, vdt)
    backend("select", buf).gather_rows(buf, vals, mem.put(np.minimum(found, cap)), mem.put(starts), out, vout)
    for c in np.flatnonzero(found > cap):  # rare: an overfull chunk runs again into an exact row
        m, s = int(found[c]), int(starts[c])
        row, vrow = mem.empty((1, m), np.int64), mem.empty((1, m) if want else (0, 0), vdt)
        run(np.array([c, c + 1], np.int64), row, vrow, counts)
        _place(out[s : s + m], row[0], mem.device)
        if want:
            _place(vout[s : s + m], vrow[0], mem.device)
    return out, (vout if want else None)


def _place(dst, src, device: bool) -> None:
    """``dst[...] = src`` (host arrays, or device arrays copied on the device)."""
    if device:
        dst.copy_to_device(src)
    else:
        dst[...] = src


def segment_room(caps):
    """Room for a segmented selection kernel whose tensor ``t`` finds at most ``caps[t]``
    positions: ``(room, pos, counts, bad)``, tensor t writing from ``pos[room[t]]`` (``room``
    holds ``len(caps) + 1`` offsets), its count and NaN/inf flag into ``counts[t]``, ``bad[t]``."""
    room = offsets(caps)
    return room, np.empty(int(room[-1]), np.int64), np.zeros(len(caps), np.int64), np.zeros(len(caps), np.int64)


def segments_picked(flat, starts, room, pos, counts, values=None):
    """:meth:`codec.stage.Select.select_segments`' answer from a segmented kernel's finds
    (tensor t's ``counts[t]`` sorted positions from ``pos[room[t]]``; ``pos``, ``values`` and
    ``flat`` host or device arrays, ``room`` and ``counts`` host ones): the positions packed,
    their starts, the kept values (``values`` at the finds' places, else gathered from
    ``flat``) and every tensor's index section at once; None when the index coder cannot
    take them at once (each tensor then selects alone).  Device finds stay on the device:
    the positions and values there, the index sections' bytes come back."""
    mem = Memory(on_device(pos))
    at, picked, kstarts = _packed(room, pos, counts, mem)
    total = int(kstarts[-1])
    index = index_segments(picked, kstarts, starts[1:] - starts[:-1])
    if index is None:
        return None
    if values is not None:
        return picked, kstarts, values[:total] if at is None else mem.gather(values, at), index
    return picked, kstarts, mem.gather(flat, _in_run(picked, kstarts, starts, mem)), index


def run_positions(starts, room, pos, counts):
    """The positions a segmented kernel found (its finds, as :func:`segments_picked` takes
    them) counted from the run's first element, in increasing order (host arrays)."""
    mem = Memory(False)
    _, picked, kstarts = _packed(room, pos, counts, mem)
    return _in_run(picked, kstarts, starts, mem)


def _packed(room, pos, counts, mem):
    """``(at, picked, kstarts)``: the finds' positions packed (``picked``, tensor t's from
    ``kstarts[t]``), taken from ``pos`` at ``at`` (None: ``pos`` holds them packed already,
    every tensor having filled its room, as top-k's do)."""
    kstarts = offsets(counts)
    total = int(kstarts[-1])
    if np.array_equal(room[:-1], kstarts[:-1]):
        return None, pos[:total], kstarts
    at = mem.put(np.arange(total) + np.repeat(room[:-1] - kstarts[:-1], counts))
    return at, mem.gather(pos, at), kstarts


def _in_run(picked, kstarts, starts, mem):
    """Packed per-tensor positions (``picked``, tensor t's from ``kstarts[t]``) as positions in
    the run of tensors starting at ``starts``, where they lie (one ``absolute_positions`` call)."""
    where = mem.empty(picked.size, np.int64)
    backend("index", picked).absolute_positions(picked, mem.put(kstarts), mem.put(np.ascontiguousarray(starts, np.int64)), where)
    return where


def raise_nonfinite(acc: np.ndarray, ctx, name: str) -> None:
    raise NonFiniteError(ctx.name, ctx.where(first_nonfinite(host_copy(acc) if on_device(acc) else acc)), name)


class Magnitudes:
    """The array a sparsifier selects from, ``acc``, and exact answers about its top.

    ``Magnitudes(values)`` selects from ``values``; ``Magnitudes(x, residual, out)`` from
    ``acc = x + residual``, written into ``out`` during the first pass.  ``sums=True`` also
    gathers the float64 mean and standard deviation of ``acc`` in that pass.
    """

    def __init__(self, values, ctx, name, residual=None, out=None, sums=False):
        self.ctx, self.name, self.n = ctx, name, values.size
        self._mem = Memory(on_device(values))  # a device array: the passes run its CUDA twins
        wide = values.dtype in WIDE
        self._x = readonly(values)
        self._r = None  # the residual when the first pass forms acc (float32/float64 under error feedback)
        if residual is None:
            self.acc = values
        elif wide:
            self.acc, self._r = out, readonly(residual)
        else:  # 16-bit: form acc in its own dtype, select from the exact float32 widening

            self.acc = out
            add(values, residual, out)
        self._src = self._x if wide else readonly(widen(self.acc))
        self._want_sums = sums
        self._sample = None
        self._shift = 0.0
        self.mean = self.std = None
        self.cut = None  # the cut of the current candidates
        self.idx = self.vals = self.mag = None  # candidates: positions, values, float64 magnitudes
        self._picked = None  # (positions, mask) of the last answer taken from the candidates

    # ------------------------------------------------------------------ the pass
    def acc_sample(self, stride: int):
        """``acc[::stride]`` in float64 (formed from ``x`` and the residual before the pass),
        where ``acc`` lives: a device array's sample stays on the device, and cuts are taken
        from it there (:meth:`kth`, :meth:`count_in_sample`), 8 bytes crossing each."""
        if self._r is not None and self.cut is None:
            x, r = self._x, self._r
        else:
            x, r = self._src, self._src[:0]
        part = self._mem.empty(-(-self.n // stride), np.float64)
        backend("select", x).strided_sample(x, r, stride, part)
        return part

    def kth(self, sample, k: int) -> float:
        """The ``k``-th largest of ``|sample|`` (a sample of this array: host or device)."""
        return backend("select", sample).kth_largest(sample, k)

    def count_in_sample(self, sample, cut: float) -> int:
        """How many of ``|sample|`` are at least ``cut``."""
        return backend("select", sample).count_at_least(sample, cut)

    def sample(self):
        """The (signed) sample cuts are chosen from, cached, where ``acc`` lives:
        ``acc_sample(max(1, n // SAMPLE))`` when moments are taken from it; where it only
        guides the pass, ``max(GUIDE, n // 8)`` values up to SAMPLE (:data:`GUIDE`), taken
        as runs of one cache line (:meth:`_line_sample`) when they do not hold every value.  With moments (Gaussian-k), the shift
        of the variance sums is the sample's mean in lanes (``select.lane_means``), taken
        where the sample lives."""
        if self._sample is None:
            stride = max(1, self.n // (SAMPLE if self._want_sums else min(SAMPLE, max(GUIDE, self.n // 8))))
            if not self._want_sums and stride >= 2:
                self._sample = self._line_sample(stride)
                return self._sample
            signed = self.acc_sample(stride)
            if self._want_sums and signed.size:  # the shift of the variance sums
                self._shift = _mean(signed)
            self._sample = signed
        return self._sample

    def _line_sample(self, stride: int):
        """``acc`` at ``n // stride`` values taken ``LINE`` at a time (one 64-byte line of
        float32), the runs spread evenly over the array: the same sample size as the strided
        sample's, from a ``LINE``-th of the cache lines it reads.  The cut it gives changes how
        many candidates the pass collects, never the selection (a short cut is retried)."""
        runs = max(1, self.n // (stride * LINE))
        out = self._mem.empty((runs, LINE), np.float64)
        if self._r is not None and self.cut is None:
            backend("select", self._x).line_sample(self._x, self._r, self.n // runs, out)
        else:
            backend("select", self._src).line_sample(self._src, self._src[:0], self.n // runs, out)
        return out.reshape(out.size)

    def _scan(self, cut: float) -> None:
        n = self.n
        src, dt = self._src, self._src.dtype
        kern = backend("select", src)
        nchunk = chunks(n)
        mem = self._mem
        empty = mem.empty(0, dt)
        form = self._r is not None and self.cut is None
        x, r, acc = (src, self._r, self.acc) if form else (src, readonly(empty), empty)  # (r read-only either way: one signature)
        sums = mem.zeros((nchunk if self._want_sums and self.mean is None else 0, 2), np.float64)
        if sums.shape[0]:
            self.sample()  # sets the shift
        bad = mem.zeros(nchunk, np.int64)
        cutv = dt.type(cut)
        if nchunk <= 1:
            cap = n
        else:  # room for twice the sample's estimate per chunk; a fuller chunk runs again
            expect = self.count_in_sample(self.sample(), cut) * (n / self.sample().size)
            cap = int(min(CHUNK, 2 * expect / nchunk + 64))

        shift = self._shift if sums.shape[0] else 0.0  # the sample's mean: no cancellation in the variance

        def run(chunks, buf, vals, counts):
            kern.candidates(x, r, acc, cutv, chunks, buf, vals, counts, bad, sums, shift, LANES)

        idx, vals = collect(run, nchunk, cap, dt, mem.device)
        if form:
            self._src = readonly(self.acc)
        bad, sums = mem.host(bad), mem.host(sums)
        if bad.any():
            raise_nonfinite(self.acc, self.ctx, self.name)
        if sums.shape[0]:
            s, q = sums.sum(0) / n
            self.mean = shift + s
            self.std = math.sqrt(max(0.0, q - s * s))
        self.cut = cut
        self.idx, self.vals = idx, vals

    def _ensure(self, cut: float) -> None:
        """Candidates at or above ``cut`` (a value of the source dtype, > 0)."""
        if not self.n:
            self.candidates(0)
        elif self.cut is None or cut < self.cut:
            self._scan(cut)

    def _sample_cut(self, need: int) -> float:
        """A cut with, by the sample, ``need`` elements above it plus a margin of 20% and
        four binomial standard deviations (exact when the sample is the whole array)."""
        sample = self.sample()
        cut = self.kth(sample, sample_rank(need, sample.size, self.n))
        return self._tiny if cut == 0 else cut

    @property
    def _tiny(self) -> float:
        """The smallest positive value of the source dtype: a cut that keeps the non-zeros."""
        return float(np.finfo(self._src.dtype).smallest_subnormal)

    # ------------------------------------------------------------------ exact answers
    # Every answer is a count (8 bytes from a device) or the top of the candidates, found by
    # the ``select`` family's ``topk_segments`` where the candidates live: on a device the
    # positions and values stay there, and the index and value stages code them there.
    def candidates(self, need: int) -> None:
        """Make sure the candidates hold at least ``need`` elements (or every non-zero).
        ``need = 0`` just runs the pass (forms ``acc``, checks it is finite)."""
        if self.n == 0:
            self.idx, self.cut = np.empty(0, np.int64), math.inf
            self.vals = np.empty(0, self._src.dtype)
            self.mean = self.std = 0.0
            return
        if self.cut is None:
            self._scan(self._sample_cut(need) if need > 0 else math.inf)
        if self.idx.size < need and self.cut > self._tiny:
            self._scan(self._tiny)

    def count_candidates(self, t: float, strict: bool = False) -> int:
        """How many candidates have ``|acc_i| >= t`` (``> t`` when ``strict``): every element
        that does when ``t`` is at least :attr:`cut`."""
        if not self.idx.size:
            return 0
        if strict:
            t = float(np.nextafter(t, math.inf))  # |v| > t exactly when |v| >= the next float64
        return backend("select", self.vals).count_at_least(self.vals, t)

    def count_at_least(self, t: float) -> int:
        """``#{i : |acc_i| >= t}`` exactly."""
        if t <= 0:
            self.candidates(0)
            return self.n
        self._ensure(_round_down(t, self._src.dtype, self._tiny))
        return self.count_candidates(t)

    def at_least(self, t: float, strict: bool = False):
        """Sorted positions with ``|acc_i| >= t`` (``> t`` when ``strict``): the top of the
        candidates, as many as reach ``t`` (no tie crosses ``t``)."""
        if t <= 0 and not strict:
            self.candidates(0)
            idx = self._mem.arange(self.n)
            self._picked = (idx, None)
            return idx
        self._ensure(_round_down(t, self._src.dtype, self._tiny) if t > 0 else self._tiny)
        return self.top(self.count_candidates(t, strict))

    def top(self, k: int):
        """Sorted positions of the ``k`` largest magnitudes, ties to the lower index (int64,
        where ``acc`` lives)."""
        if k <= 0:
            return np.empty(0, np.int64)
        self.candidates(k)
        if self.idx.size < k:  # fewer non-zeros than k: every non-zero and the first zeros, from the whole array
            idx = self._top_of(self._src, k)
            self._picked = (idx, None)
            return idx
        sel = self._top_of(self.vals, k)
        idx = self._mem.gather(self.idx, sel)
        self._picked = (idx, sel)
        return idx

    def _top_of(self, values, k: int):
        """Sorted positions in ``values`` of its ``k`` largest magnitudes (``topk_segments`` of
        one segment: a radix select and an ordered compaction on a device)."""
        mem = self._mem
        out, bad = mem.empty(k, np.int64), mem.zeros(1, np.int64)  # (finite: the pass checked)
        spans = mem.put(np.array([0, values.size], np.int64))
        backend("select", values).topk_segments(readonly(values), spans, mem.put(np.array([k], np.int64)), spans[:1], out, bad)
        return out

    def values(self, idx):
        """``acc[idx]``, where ``acc`` lives: from the candidates when ``idx`` is the last
        answer taken from them (no gather from the large array), else gathered from ``acc``."""
        mem = self._mem
        if self._picked is not None and self._picked[0] is idx and self._picked[1] is not None:
            sel = self._picked[1]
            if not mem.device:
                return self.vals[sel].astype(self.acc.dtype, copy=False)  # exact: widened values
            if self.vals.dtype == self.acc.dtype:
                return mem.gather(self.vals, sel)
        return mem.gather(self.acc.reshape(self.acc.size), idx)


def _mean(sample) -> float:
    """The mean of ``sample`` (host or device) in the kernels' lanes (``select.lane_means``)."""
    out = np.zeros(1)
    backend("select", sample).lane_means(sample, np.array([0, sample.size], np.int64), LANES, out)
    return float(out[0])


def _round_down(t: float, dtype, tiny: float) -> float:
    """The largest value of ``dtype`` that is <= ``t`` (at least ``tiny``): as a cut it keeps
    every element with ``|acc| >= t``."""
    v = dtype.type(t)
    if float(v) > t:
        v = np.nextafter(v, dtype.type(0))
    return max(float(v), tiny)
