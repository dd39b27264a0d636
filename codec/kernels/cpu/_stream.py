"""Streaming stores (Numba CPU): a decode whose output is larger than the last-level cache
writes it past the cache.

An ordinary store first reads the cache line it writes (a "read for ownership"), so decoding
25.6M fp16 codes (51 MB) into float32 (102 MB) moves 255 MB, not 153.  A non-temporal store
(LLVM's ``!nontemporal``; ``vmovntps`` on x86-64) writes whole lines without reading them:
the same decode took 5.4 ms instead of 9.1 on this 2-core AMD EPYC (torch's ``copy_``:
9.2), while 4M values (16 MB out, within its 32 MB L3) took the same time either way and 1M
values took 0.20 ms against 0.11-0.14 (the output no longer in the cache for its reader).
So a decode streams only from :data:`STREAM_MIN` output values, and only in ``SET`` mode
(adding reads the line anyway).  A sparse decode's zeroing streams too, with its pairs in
the same stores (:func:`pairs_threads`' spans): glibc's ``memset`` streams only above a
share of the last-level cache per call, so zeroing ResNet-50's tensors one by one (the
largest 9.4 MB) took about 6 ms of top-k's 15 ms decode.

A streaming store needs its address aligned to the vector (:data:`ALIGN` bytes): the loops
write the items before the first aligned one with ordinary stores (:func:`head`), and end
each chunk with :func:`fence` (streaming stores are weakly ordered: the fence makes them
visible before the parallel region ends).  The bytes written are exactly the ordinary
loop's.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from codec import threads
from codec._jit import jit
from codec.kernels.cpu._common import chunk_segments, view_at
from codec.modes import SET

#: the fewest output values a SET decode streams (32 MiB of float32: above the L3 of this
#: machine's 32 MB; below it the output is better left in the cache for its reader)
STREAM_MIN = 1 << 23
#: the alignment (bytes) of a streamed vector store: eight float32 (half of eight float64)
ALIGN = 32
#: values per vector store
LANES = 8
#: the run elements a thread of :func:`pairs_threads` writes at a time (4 MB of float32)
ZERO_SPAN = 1 << 20
#: no positions (:func:`zero_for`'s zeroing alone)
_NO_PAIRS = np.empty(0, np.int64)
_NO_PAIRS.flags.writeable = False


def lanes_at(context, builder, aryty, ary, i, vecty):
    """A pointer to ``LANES`` items of the 1-D array ``ary`` from item ``i``, as ``vecty``."""
    a = context.make_array(aryty)(context, builder, ary)
    return builder.bitcast(builder.gep(a.data, [i]), vecty.as_pointer())


def store_nt(builder, value, ptr) -> None:
    """Store ``value`` at ``ptr`` (aligned to :data:`ALIGN`) without reading its line."""
    st = builder.store(value, ptr, align=ALIGN)
    st.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))


@intrinsic
def fence(typingctx):
    """A full memory fence (``mfence`` on x86-64): the streaming stores before it are visible
    to every thread after it."""

    def codegen(context, builder, sig, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.none(), codegen


@jit
def head(out):
    """How many items of ``out`` come before the first one whose address is aligned to
    :data:`ALIGN` bytes; -1 when ``out`` is not aligned to its own items (it is never
    streamed then)."""
    addr = out.ctypes.data
    if addr % out.itemsize:
        return -1
    return (ALIGN - addr % ALIGN) % ALIGN // out.itemsize


@intrinsic
def widen8_bf16(typingctx, src, i, dst):
    """``dst[i:i+8] = value(bfloat16 codes src[i:i+8])`` into float32/float64 ``dst`` with
    streaming stores (``&dst[i]`` aligned to :data:`ALIGN`): each code's bits are its float32's
    top half, exactly as ``_half.bf16_to_f32``."""
    if not (isinstance(src, types.Array) and src.dtype == types.uint16 and isinstance(dst, types.Array) and dst.dtype in (types.float32, types.float64) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        raw = builder.load(lanes_at(context, builder, sig.args[0], args[0], args[1], ir.VectorType(ir.IntType(16), LANES)), align=1)
        wide = ir.VectorType(ir.IntType(32), LANES)
        bits = builder.shl(builder.zext(raw, wide), ir.Constant(wide, [16] * LANES))
        v = builder.bitcast(bits, ir.VectorType(ir.FloatType(), LANES))
        vals = ir.VectorType(context.get_value_type(sig.args[2].dtype), LANES)
        if sig.args[2].dtype == types.float64:
            v = builder.fpext(v, vals)
        store_nt(builder, v, lanes_at(context, builder, sig.args[2], args[2], args[1], vals))
        return context.get_dummy_value()

    return types.none(src, i, dst), codegen


@intrinsic
def _zero8(typingctx, i, dst):
    """``dst[i:i+8] = 0`` with a streaming store (``&dst[i]`` aligned to :data:`ALIGN`)."""
    if not (isinstance(dst, types.Array) and dst.dtype in (types.float32, types.float64) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        vals = ir.VectorType(context.get_value_type(sig.args[1].dtype), LANES)
        store_nt(builder, ir.Constant(vals, None), lanes_at(context, builder, sig.args[1], args[1], args[0], vals))
        return context.get_dummy_value()

    return types.none(i, dst), codegen


@intrinsic
def _put8(typingctx, buf, i, dst):
    """``dst[i:i+8] = buf[:8]`` with a streaming store (``buf`` of ``dst``'s dtype; ``&dst[i]``
    aligned to :data:`ALIGN`)."""
    if not (isinstance(dst, types.Array) and dst.dtype in (types.float32, types.float64) and isinstance(buf, types.Array) and buf.dtype == dst.dtype and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        vals = ir.VectorType(context.get_value_type(sig.args[2].dtype), LANES)
        v = builder.load(lanes_at(context, builder, sig.args[0], args[0], context.get_constant(types.intp, 0), vals), align=1)
        store_nt(builder, v, lanes_at(context, builder, sig.args[2], args[2], args[1], vals))
        return context.get_dummy_value()

    return types.none(buf, i, dst), codegen


@jit
def pairs_span(values, idx, out, lo, hi, off, stream):
    """``out[lo:hi] = 0``, but ``values[i]`` at each ``idx[i] - off`` inside (``idx``
    increasing; none: the span zeroed), ``out`` float32/float64, 1-D.  With ``stream``, one
    pass of streaming stores: each aligned vector written whole, zeros or a vector formed with
    its values, so no line is read for a pair; the items before the span's first aligned
    vector and after its last (all of them in an array not aligned to its items, or without
    ``stream``) with ordinary stores, the pairs after the zeros (:func:`pairs_threads`)."""
    k = idx.size
    i = np.searchsorted(idx, lo + off)
    at = head(out)
    a = hi if at < 0 or not stream else max(lo, at)
    a = min(hi, a + (at - a) % LANES)  # the span's first item on a vector boundary
    out[lo:a] = 0
    while i < k and idx[i] - off < a:
        out[idx[i] - off] = values[i]
        i += 1
    m = a + (hi - a) // LANES * LANES
    vec = np.zeros(LANES, out.dtype)
    v = a
    while v < m:
        p = idx[i] - off if i < k else m
        stop = min(m, p - (p - a) % LANES)  # the vector that holds the next pair
        while v < stop:
            _zero8(v, out)
            v += LANES
        if v < m:
            vec[:] = 0
            while i < k and idx[i] - off < v + LANES:
                vec[idx[i] - off - v] = values[i]
                i += 1
            _put8(vec, v, out)
            v += LANES
    out[m:hi] = 0
    while i < k and idx[i] - off < hi:
        out[idx[i] - off] = values[i]
        i += 1
    fence()


@jit
def pairs_run_span(values, idx, kstarts, addrs, starts, like, lo, hi, run, stream):
    """Run positions ``lo:hi`` of :func:`pairs_threads`: each tensor's part (its array the one
    of ``like``'s dtype at ``addrs[t]``) zeroed, its pairs inside written (:func:`pairs_span`;
    ``idx`` run positions when ``run``, else the tensor's own)."""
    rows = chunk_segments(starts, lo, hi)
    for j in range(rows.shape[0]):
        t, a, b = rows[j, 0], rows[j, 1], rows[j, 2]
        s = starts[t]
        out = view_at(like, addrs[t], starts[t + 1] - s)
        k0, k1 = kstarts[t], kstarts[t + 1]
        pairs_span(values[k0:k1], idx[k0:k1], out, a - s, b - s, s if run else 0, stream)


def pairs_threads(values, idx, kstarts, addrs, starts, like, run) -> None:
    """Every array of a run zeroed with its pairs written (SET): tensor ``t``'s pairs are
    ``values[kstarts[t]:kstarts[t+1]]`` at the positions ``idx[...]`` (run positions when
    ``run``, else its own; increasing; none: the arrays zeroed), its array the one of
    ``like``'s dtype at ``addrs[t]``.  On the budget's threads (``codec.threads.each``, which
    never spins or waits at a barrier), a span of :data:`ZERO_SPAN` run positions at a time
    (:func:`pairs_run_span`), with streaming stores from ``STREAM_MIN`` elements in all, so a
    whole model's outputs do not evict each other.  Zeroing first and writing the pairs after
    read every pair's line back in: one 25M float32 array, 250k pairs, 2.14-2.39 -> 1.72-1.92
    ms (three alternating rounds); zeroing ResNet-50's 102 MB of outputs took 4.0-4.2 ms on
    one thread, 2.1-2.5 ms on two (docs/benchmarks.md)."""
    first, last = int(starts[0]), int(starts[-1])
    stream = last - first >= STREAM_MIN
    span = max(LANES, ZERO_SPAN - ZERO_SPAN % LANES)  # (whole vectors: a span's streamed vectors stay its own)
    threads.each(-(-(last - first) // span), lambda j, _: pairs_run_span(values, idx, kstarts, addrs, starts, like, first + j * span, min(last, first + (j + 1) * span), run, stream))


@jit
def zero_arrays(addrs, starts, like):
    """Every array of a small run zeroed with ordinary stores (at most :data:`ZERO_SPAN`
    elements, below ``STREAM_MIN``: the run stays in the cache for its reader): tensor
    ``t``'s is the one of ``starts[t+1] - starts[t]`` items of ``like``'s dtype at the
    address ``addrs[t]``.  A larger run is :func:`pairs_threads`'."""
    for t in range(addrs.size):
        view_at(like, addrs[t], starts[t + 1] - starts[t])[:] = 0


def spread(starts) -> bool:
    """Whether a run (tensor offsets ``starts``) is zeroed on the budget's threads
    (:func:`pairs_threads`): more than :data:`ZERO_SPAN` elements.  A smaller run is zeroed
    by the decoding kernel itself, on the calling thread (:func:`zero_arrays`, or
    ``out[:] = 0`` for one array): a call fewer for a small model's decode."""
    return int(starts[-1] - starts[0]) > ZERO_SPAN


def zero_for(mode, addrs, starts, like) -> bool:
    """The zeroing a ``mode`` write of sparse values into a run needs (SET only), for pairs
    written after it (positions that do not increase, which :func:`pairs_threads` cannot take
    with the zeros): a large run (:func:`spread`) is zeroed now, on the budget's threads
    (:func:`pairs_threads` with no pairs); returns True when the caller's kernel is to zero
    the run itself (SET, a small run)."""
    if mode != SET:
        return False
    if not spread(starts):
        return True
    pairs_threads(like[:0], _NO_PAIRS, np.zeros(starts.size, np.int64), addrs, starts, like, False)
    return False
