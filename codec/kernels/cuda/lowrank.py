"""CUDA twin of ``codec/kernels/cpu/lowrank.py``: PowerSGD's products on the device, in the CPU
kernels' fixed order, so a frame made from a device gradient equals the host's byte for byte.

* ``project`` (``P = M Q``): one block per row of ``M`` (grid-stride over rows), each thread
  one or more of the ``width`` column lanes, each lane adding its terms in order of ``j``;
  thread 0 then adds the lanes in order and the tail, for one column of ``Q`` at a time.
  The non-finite entries of ``M`` are counted in the same pass (an atomic add per block).
* ``back_project`` (``Q = M^T P``): one thread per column of ``M`` (adjacent threads read
  adjacent columns: every row is read coalesced), adding its rows in order, up to
  ``RANKS`` columns of ``P`` per pass over ``M`` (``M`` is read ``ceil(r / RANKS)`` times).
* ``expand`` (the decoder's ``P Q^T``): one thread per element, the CPU kernel's chain of
  fused multiply-adds (``cuda.fma``; in the simulator, whose ``fma`` rounds twice, an exact
  one: :func:`_fma`).  Its kernels (one a dtype) are the ones whose PTX holds ``fma`` on purpose (``FUSED``).
* ``orthogonalize``: ``P`` is ``n x r`` and frame content, so the stage runs it on the host
  (the CPU kernel, one order for both); this twin copies a device ``P`` there and back.

Products are float64, rounded on their own (``_common.mul``: NVVM would fuse them into the
sums, the CPU does not); each result is rounded once to the output's dtype.
"""

from __future__ import annotations

import numpy as np

from codec._cuda_jit import jit, numba_cuda
from codec.kernels.cpu import lowrank as _cpu
from codec.dtypes import on_device
from codec.modes import SET, SUB
from codec.kernels.cuda._common import MAX_WIDTH, Results, check_width, dev, launch, mul, mul32, per_unit, views_at

cuda = numba_cuda()

__all__ = list(_cpu.__all__)

#: columns of ``P`` one pass of ``back_project`` accumulates (thread-local float64)
RANKS = 8


@jit
def _project(m, qt, p, width, bad):
    lanes = cuda.shared.array(MAX_WIDTH, np.float64)
    t = cuda.threadIdx.x
    n, mm = m.shape
    r = qt.shape[0]
    rows = mm // width
    for i in range(cuda.blockIdx.x, n, cuda.gridDim.x):
        k = 0
        for col in range(t, width, cuda.blockDim.x):
            for row in range(rows):
                v = m[i, row * width + col]
                k += not (v - v == 0)
        if t == 0:
            for j in range(rows * width, mm):
                v = m[i, j]
                k += not (v - v == 0)
        if k:
            cuda.atomic.add(bad, 0, k)
        for c in range(r):
            for col in range(t, width, cuda.blockDim.x):
                s = 0.0
                for row in range(rows):
                    j = row * width + col
                    s += mul(np.float64(m[i, j]), np.float64(qt[c, j]))
                lanes[col] = s
            cuda.syncthreads()
            if t == 0:
                s = 0.0
                for col in range(width):
                    s += lanes[col]
                for j in range(rows * width, mm):
                    s += mul(np.float64(m[i, j]), np.float64(qt[c, j]))
                p[i, c] = s
            cuda.syncthreads()


def project(m, qt, p, width):
    """``p[i, c] = sum_j m[i, j] * qt[c, j]`` in ``width`` column lanes (see the CPU kernel);
    returns how many entries of ``m`` are NaN or infinite."""
    check_width(width)
    out = Results()
    pd = out(p)
    bad = cuda.to_device(np.zeros(1, np.int64))
    if m.shape[0] and qt.shape[0]:
        _project[per_unit(m.shape[0])](m, dev(qt), pd, width, bad)
    out.done()
    return int(bad.copy_to_host()[0])


@jit
def _back_project(m, p, q):
    n, mm = m.shape
    r = p.shape[1]
    acc = cuda.local.array(RANKS, np.float64)
    for j in range(cuda.grid(1), mm, cuda.gridsize(1)):
        for c0 in range(0, r, RANKS):
            w = min(RANKS, r - c0)
            for c in range(w):
                acc[c] = 0.0
            for i in range(n):
                v = np.float64(m[i, j])
                for c in range(w):
                    acc[c] += mul(v, np.float64(p[i, c0 + c]))
            for c in range(w):
                q[j, c0 + c] = acc[c]


def back_project(m, p, q):
    """``q[j, c] = sum_i m[i, j] * p[i, c]``, the terms in order of ``i`` (see the CPU kernel)."""
    out = Results()
    qd = out(q)
    if m.shape[1] and p.shape[1]:
        _back_project[launch(m.shape[1])](m, dev(p), qd)
    out.done()


def orthogonalize(p, tiny):
    """The CPU kernel's Gram-Schmidt, on the host (``P`` is frame content: see the module)."""
    if on_device(p):
        host = p.copy_to_host()
        _cpu.orthogonalize(host, tiny)
        p.copy_to_device(host)
    else:
        _cpu.orthogonalize(p, tiny)


#: the kernels whose fused multiply-adds are their rule (scripts/cuda_compile_check.py
#: refuses an ``fma`` instruction in any other kernel of codec)
FUSED = ("_expand64", "_expand32")


def _simulated() -> bool:
    from numba import config

    return bool(config.ENABLE_CUDASIM)


if _simulated():
    from fractions import Fraction

    @jit(device=True)
    def _fma(a, b, c):
        """``a * b + c`` rounded once to ``a``'s dtype, exactly (the simulator's ``cuda.fma``
        computes ``a * b + c`` in Python floats: two roundings)."""
        exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
        t = type(a)
        f = t(float(exact))  # within one unit of the answer: pick the nearest neighbour, ties to even
        best = f
        for g in (np.nextafter(f, t(-np.inf)), np.nextafter(f, t(np.inf))):
            d, e = abs(Fraction(float(g)) - exact), abs(Fraction(float(best)) - exact)
            if d < e or (d == e and int(np.array(g).view(f"u{np.dtype(t).itemsize}")) % 2 == 0):
                best = g
        return best

else:

    @jit(device=True)
    def _fma(a, b, c):
        return cuda.fma(a, b, c)


def _expander(product, name: str):
    """The ``expand`` kernel ``name`` whose first term is ``product`` (``mul`` for float64,
    ``mul32`` for float32): rounded on its own, so NVVM cannot fuse a rank-1 ``P Q^T`` into
    ``out``'s sum or difference, which the CPU rounds twice."""

    def kernel(p, qt, out, mode):
        n, r = p.shape
        m = qt.shape[1]
        for e in range(cuda.grid(1), n * m, cuda.gridsize(1)):
            i = e // m
            j = e - i * m
            acc = product(p[i, 0], qt[0, j])
            for c in range(1, r):
                acc = _fma(p[i, c], qt[c, j], acc)
            if mode == SET:
                out[i, j] = acc
            elif mode == SUB:
                out[i, j] -= acc
            else:
                out[i, j] += acc

    kernel.__name__ = kernel.__qualname__ = name  # (what the compile check finds it by)
    return jit(kernel)


_expand64, _expand32 = _expander(mul, "_expand64"), _expander(mul32, "_expand32")


def expand(p, qt, out, mode=SET):
    """``out (=|+=|-=) P Q^T`` (``qt``: ``Q`` transposed), each element of ``P Q^T`` the CPU
    kernel's chain of fused multiply-adds (a thread per element: adjacent threads read
    adjacent columns of ``qt``)."""
    if out.size and p.shape[1]:
        (_expand64 if np.dtype(out.dtype) == np.float64 else _expand32)[launch(out.size)](dev(p), dev(qt), out, mode)


def expand_segments(values, vstarts, ns, ms, rs, addrs, like, mode=SET):
    """:func:`expand` of many matrices (see the CPU kernel), matrix ``t`` stored into, added to
    or subtracted from (``mode``) the device array of ``like``'s dtype at device address
    ``addrs[t]``, one launch per matrix (``P`` and ``Q`` taken from the host ``values``).
    Needs a real device: the simulator cannot view an address (CodecTypeError)."""
    sizes = np.zeros(len(ns) + 1, np.int64)
    np.cumsum(np.asarray(ns, np.int64) * np.asarray(ms, np.int64), out=sizes[1:])
    for t, _, _, out in views_at(addrs, sizes, like):
        n, m, r, v = int(ns[t]), int(ms[t]), int(rs[t]), int(vstarts[t])
        p, q = values[v : v + n * r].reshape(n, r), values[v + n * r : v + (n + m) * r].reshape(m, r)
        expand(p, np.ascontiguousarray(q.T), out.reshape(n, m), mode)


def power_segments(values, addrs, like, firsts, ns, ms, rs, qts, qstarts, width, tiny):
    """:func:`power_segments` of the CPU kernel for device matrices (matrix ``t`` the device
    array of ``like``'s dtype at device address ``addrs[t]``), one matrix at a time through
    this module's ``project`` and ``back_project`` and the host's ``orthogonalize``, ``P``
    and ``Q`` written to the host ``values``.  Needs a real device: the simulator cannot view
    an address (CodecTypeError)."""
    sizes = np.zeros(len(ns) + 1, np.int64)
    np.cumsum(np.asarray(ns, np.int64) * np.asarray(ms, np.int64), out=sizes[1:])
    bad = 0
    for t, _, _, mat in views_at(addrs, sizes, like):
        n, m, r, v = int(ns[t]), int(ms[t]), int(rs[t]), int(firsts[t])
        mat = mat.reshape(n, m)
        p = values[v : v + n * r].reshape(n, r)
        k = project(mat, qts[qstarts[t] : qstarts[t] + r * m].reshape(r, m), p, width)
        bad += k
        if k:
            continue
        wide = np.array(p, np.float64)
        _cpu.orthogonalize(wide, tiny)
        p[...] = wide
        back_project(mat, p, values[v + n * r : v + (n + m) * r].reshape(m, r))
    return bad
