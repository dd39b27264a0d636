"""Random-k's positions (Numba CPU): the images of ``0..k-1`` under a keyed 4-round Feistel
permutation of ``[0, n)`` (docs/codecs.md, "randomk"), for one tensor or a many-tensor run,
in draw order or sorted.
Each position depends on its index and the stream alone, so results never depend on the
thread count.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from codec._jit import jit, prange
from codec.kernels.cpu._common import U, chunk_segments, chunks, feistel_half
from codec.kernels.cpu.rng import mix, stream
from codec.kernels.cpu.scatter import _put_pairs
from codec.layout import CHUNK

__all__ = ["random_positions", "random_positions_segments", "random_scatter_segments", "sorted_positions"]



#: a draw tabulates its four round functions (``2**half`` values each, the right half's every
#: value) when that is at most this many times the positions it draws, and reads them from the
#: table instead of hashing: ResNet-50's largest tensor (n = 2.36M, k = 23.6k, 2**11 values a
#: round) drew its positions in 0.14 ms instead of 0.62
TABLE_PER_POSITION = 2
#: a draw walks its positions this many at a time (:func:`_batch`)
BATCH = 1024
#: a draw sorts its positions through a bitmap of ``n`` bits when ``n`` is at most this many
#: times their number (a scan of ``n / 64`` words, linear), else with Numba's sort
BITMAP_PER_POSITION = 1024


@jit
def _round(strm, rnd, right, mask):
    """Round ``rnd``'s function of the right half ``right`` (uint64): the hashed key's low bits."""
    return mix(strm ^ (np.uint64(rnd) << np.uint64(48)) ^ right) & mask


@jit
def _hashed(v, strm, half, mask):
    """One pass of the 4-round Feistel permutation of ``[0, 2**(2*half))`` on ``v``, each
    round's function hashed (:func:`_round`)."""
    left = v >> half
    right = v & mask
    for rnd in range(4):
        left, right = right, left ^ _round(strm, rnd, right, mask)
    return (left << half) | right


@jit
def _permute(v, strm, half, mask, n):
    """The 4-round Feistel permutation of ``[0, 2**(2*half))``, cycle-walked into ``[0, n)``
    (:func:`_hashed` until the value falls there; the CUDA twin's draw, a thread a position)."""
    while True:
        v = _hashed(v, strm, half, mask)
        if v < n:
            return v


@jit
def _rounds(strm, half, mask):
    """The four round functions of every right half, ``tab[rnd, right]`` (uint32: a tabulated
    draw has ``half <= 31``)."""
    tab = np.empty((4, 1 << half), np.uint32)
    for rnd in range(4):
        for r in range(U(1) << half):
            tab[rnd, r] = np.uint32(_round(strm, rnd, r, mask))
    return tab


@jit
def _draw(out, lo, hi, strm, half, n):
    """``out[j] = perm(j)`` for ``lo <= j < hi`` (the permutation of :func:`_permute` on
    ``half``-bit halves, keyed by ``strm``, into ``[0, n)``; :func:`_batch`): through the
    tabulated round functions when they are few (:data:`TABLE_PER_POSITION`), the same
    values.  (Hashing every round in batches beat the table for every draw measured where
    the CPU multiplies 64-bit lanes, AVX-512: 25M elements, 250k positions 1.9 -> 1.4 ms; not
    on AVX2, 1.9 -> 3.1: the rule stays the table's.)"""
    mask = (np.uint64(1) << half) - np.uint64(1)
    few = np.int64(np.uint64(1) << half) > TABLE_PER_POSITION * (hi - lo)
    tab = np.empty((4, 0), np.uint32) if few else _rounds(strm, half, mask)
    _batch(out, lo, hi, tab, strm, half, mask, U(n))


@jit(inline="always")
def _pass(v, tab, strm, half, mask):
    """One pass of the 4-round permutation of ``v`` (in ``[0, 4**half)``): through the
    tabulated round functions ``tab`` (:func:`_rounds`), or :func:`_hashed` when ``tab`` is
    empty."""
    if tab.shape[1] == 0:
        return _hashed(v, strm, half, mask)
    m32 = np.uint32(mask)
    left32 = np.uint32(v >> half)
    right32 = np.uint32(v) & m32
    for rnd in range(4):
        left32, right32 = right32, left32 ^ tab[rnd, right32]
    return (np.uint64(left32) << half) | np.uint64(right32)


@jit
def _batch(out, lo, hi, tab, strm, half, mask, n):
    """:func:`_draw`'s walk, :data:`BATCH` positions at a time: a pass of the permutation
    (:func:`_pass`) over every position of the batch still outside ``[0, n)``, then each
    one's value written (the last pass's write stands) and those still outside kept, in
    order, for the next pass.  No branch depends on a value, so the passes of a batch's
    positions overlap (their table reads, or their hashes, which vectorise); walking each
    position on its own waits on a mispredicted branch every walk.  One thread, a new
    stream each call: 25M elements, 250k positions (tabulated) 4.3 -> 1.9 ms (four positions
    in flight before, one at a time 8.3); 2.36M elements, 23.6k positions 0.28 -> 0.10 ms;
    25M elements, 4,000 positions (hashed) 0.19 -> 0.02 ms (0.05 compiled for AVX2)."""
    idx = np.empty(BATCH, np.int64)
    v = np.empty(BATCH, np.uint64)
    for b0 in range(lo, hi, BATCH):
        m = min(hi, b0 + BATCH) - b0
        for t in range(m):
            idx[t] = b0 + t
            v[t] = U(b0 + t)
        while m:
            for t in range(m):
                v[t] = _pass(v[t], tab, strm, half, mask)
            k = 0
            for t in range(m):  # (branch-free: every value written, the walkers moved up)
                vt, it = v[t], idx[t]
                out[it] = np.int64(vt)
                idx[k] = it
                v[k] = vt
                k += vt >= n
            m = k


@intrinsic
def _cttz(typingctx, word):
    """The trailing zero bits of a uint64, 64 for 0 (LLVM's ``llvm.cttz``: ``tzcnt``)."""
    if word != types.uint64:
        return None

    def codegen(context, builder, sig, args):
        i64, i1 = ir.IntType(64), ir.IntType(1)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64, i1]), "llvm.cttz.i64")
        return builder.call(fn, [args[0], ir.Constant(i1, 0)])

    return types.uint64(word), codegen


@intrinsic
def _popcount(typingctx, word):
    """The set bits of a uint64 (LLVM's ``llvm.ctpop``: ``popcnt``), as int64."""
    if word != types.uint64:
        return None

    def codegen(context, builder, sig, args):
        i64 = ir.IntType(64)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64]), "llvm.ctpop.i64")
        return builder.call(fn, [args[0]])

    return types.int64(word), codegen


@jit
def _sort(out, n):
    """``out`` (distinct positions in ``[0, n)``) in increasing order: marked in a bitmap of
    ``n`` bits and read back in order when that is short (:data:`BITMAP_PER_POSITION`), else
    Numba's sort."""
    if n > BITMAP_PER_POSITION * out.size:
        out.sort()
        return
    bits = np.zeros((n + 63) >> 6, np.uint64)
    for p in out:
        bits[U(p) >> U(6)] |= U(1) << (U(p) & U(63))
    k = 0
    last = out.size - 2  # two slots written per word unconditionally while both are free
    for w in range(bits.size):
        b = bits[w]
        base = w << 6
        if k <= last:  # branch-free for up to two bits a word (97% of words at 1% kept)
            out[k] = base + np.int64(_cttz(b))
            c = _popcount(b)
            b &= b - U(1)
            out[k + 1] = base + np.int64(_cttz(b))
            b &= b - U(1)
            k += c
            while b:
                out[k - c + 2] = base + np.int64(_cttz(b))
                c -= 1
                b &= b - U(1)
        else:
            while b:
                out[k] = base + np.int64(_cttz(b))
                k += 1
                b &= b - U(1)


@jit(parallel=True)
def random_positions(out, seed, khash, step, half, n):
    """``out[j] = perm(j)``: distinct positions in ``[0, n)`` (n >= 2) drawn by the stream
    ``mix(mix(mix(seed) ^ khash) ^ step)`` (all uint64), through a Feistel permutation of
    ``[0, 4**half)`` (``4**half >= n``)."""
    strm = stream(seed, khash, step)
    k = out.size
    for c in prange(chunks(k)):
        _draw(out, c * CHUNK, min(k, (c + 1) * CHUNK), strm, half, n)


@jit(parallel=True)
def random_positions_segments(out, kstarts, sizes, seeds, khashes, steps):
    """:func:`random_positions` of many tensors at once, each sorted: segment ``s`` draws
    ``kstarts[s+1] - kstarts[s]`` distinct positions in ``[0, sizes[s])`` from its own stream
    (``seeds``, ``khashes``, ``steps``: uint64) into ``out[kstarts[s]:kstarts[s+1]]``, in
    increasing order; exactly ``codec.stages.select.randomk.positions`` per tensor.  ``out``
    comes first: the thread pool is woken by the number of positions drawn.

    Two parallel passes: the draw in chunks of ``out`` (cut by its length alone; a chunk
    crossing segments draws each one's share, so one large tensor is drawn by every thread),
    then each segment's sort (:func:`_sort`).  Drawing and sorting each segment on one thread
    left a whole model's largest tensors to one thread: ResNet-50's decode ran 11.6 -> 21.4
    ms that way."""
    for c in prange(chunks(out.size)):
        _draw_chunk(out, kstarts, sizes, seeds, khashes, steps, c)
    for s in prange(sizes.size):
        _sort_segment(out, kstarts, sizes, s)


@jit
def _draw_chunk(out, kstarts, sizes, seeds, khashes, steps, c):
    """Chunk ``c`` (``CHUNK`` positions of ``out``) of the draw of
    :func:`random_positions_segments`: each segment it crosses draws its share there."""
    lo = c * CHUNK
    rows = chunk_segments(kstarts, lo, min(out.size, lo + CHUNK))
    for j in range(rows.shape[0]):
        s, a, b = rows[j, 0], rows[j, 1], rows[j, 2]
        n = sizes[s]
        seg = out[kstarts[s] : kstarts[s + 1]]
        if n == 1:
            seg[a - kstarts[s] : b - kstarts[s]] = 0
        else:
            _draw(seg, a - kstarts[s], b - kstarts[s], stream(seeds[s], khashes[s], steps[s]), np.uint64(feistel_half(n)), n)


@jit
def _sort_segment(out, kstarts, sizes, s):
    """Segment ``s`` of a run's drawn positions (``out[kstarts[s]:kstarts[s+1]]``, of
    ``sizes[s]`` elements) in increasing order (:func:`_sort`)."""
    if kstarts[s + 1] - kstarts[s] > 1:
        _sort(out[kstarts[s] : kstarts[s + 1]], sizes[s])


def random_scatter_segments(values, kstarts, sizes, seeds, khashes, steps, addrs, starts, like, mode):
    """Random-k's many-tensor decode: tensor ``t``'s positions drawn and sorted by
    :func:`random_positions_segments` (``kstarts``, ``sizes``, ``seeds``, ``khashes``,
    ``steps``), and its kept values ``values[kstarts[t]:kstarts[t+1]]`` written at them
    (``mode``: SET, ADD, SUB) into the array of ``starts[t+1] - starts[t]`` items of
    ``like``'s dtype at the address ``addrs[t]`` (``starts``: the run's tensor offsets; the
    caller keeps the arrays alive) by the scatter family's ``_put_pairs``, the rest of it
    zeroed with SET (a large run's on the budget's threads, in the same pass as its pairs:
    ``_stream.pairs_threads``; nothing spinning, no barrier)."""
    pos = np.empty(values.size, np.int64)
    random_positions_segments(pos, kstarts, sizes, seeds, khashes, steps)
    _put_pairs(values, pos, kstarts, addrs, starts, like, mode, False)


def sorted_positions(out, seed, khash, step, half, n):
    """:func:`random_positions`, in increasing order: the kept positions as a frame codes them
    (sorted as the CUDA twin does, through a bitmap, when ``n`` is not much larger)."""
    random_positions(out, seed, khash, step, half, n)
    _sort(out, n)
