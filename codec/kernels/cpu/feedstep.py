"""Error feedback's per-tensor passes of a replayed many-tensor step, every tensor in one call
(Numba CPU, host only: a replayed step takes host arrays, :mod:`codec.replaydecode`, so this
family has no CUDA twin).  Each tensor ``t`` is an array of ``like``'s dtype (float32 or
float64) at an address (``_common.view_at``; the caller keeps the arrays alive), of
``starts[t+1] - starts[t]`` items: a call costs one kernel call, not one per tensor (the
bundled sample's PowerSGD step made three calls for each of its eight tensors).

* ``add_segments``: every tensor's ``acc = x + residual``, each element as ``convert.add``
  forms it, in pieces cut at the run's chunks (so one parallel pass for a whole model).
* ``pass_segments``: the tensors a frame carries as they are (PowerSGD's 1-D and small
  tensors): each ``acc`` copied into its place in the frame's values, then ``acc -=`` what
  was copied (``acc - acc``: zero, or NaN where ``acc`` is not finite), what error
  feedback's ``acc -= decoded`` gives them.
* ``warm_starts``: PowerSGD's starting ``Q`` of every matrix from its key's last ``Q``:
  orthonormalised as ``powersgd.start_q`` does (``lowrank.orthogonalize`` on a float64 copy,
  rounded back), laid out transposed as ``lowrank.power_segments`` takes them, and flagged
  where a column came out zero (the stage then draws that matrix's ``Q``).

Results never depend on the thread count (each element's value is its own).
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit, prange
from codec.kernels.cpu._common import U, run_pieces, view_at
from codec.kernels.cpu.lowrank import orthogonalize

__all__ = ["add_segments", "pass_segments", "warm_starts"]


def _run_work(*args):
    """The run's items (``starts[-1]``; ``starts`` the fourth argument): the serial/parallel
    choice."""
    return int(args[3][-1]) if args[3].size else 0


@jit(parallel=True, work=_run_work)
def add_segments(xs, rs, accs, starts, like):
    """``acc = x + residual`` of every tensor: the arrays at ``accs[t]`` from those at
    ``xs[t]`` and ``rs[t]``, each element ``x[i] + r[i]`` rounded once in the dtype (what
    ``convert.add`` writes), in pieces cut at the run's chunks (``_common.run_pieces``)."""
    rows = run_pieces(starts)
    for k in prange(rows.shape[0]):
        t, a, b = rows[k, 0], rows[k, 1], rows[k, 2]
        s, size = starts[t], starts[t + 1] - starts[t]
        x, r, o = view_at(like, xs[t], size), view_at(like, rs[t], size), view_at(like, accs[t], size)
        for i in range(U(a - s), U(b - s)):
            o[i] = x[i] + r[i]


@jit(parallel=True, work=_run_work)
def pass_segments(values, vstarts, accs, starts, like):
    """The tensors a frame carries as they are: the array at ``accs[t]`` copied to
    ``values[vstarts[t]:]`` (the frame's values, in ``like``'s dtype), then that array minus
    what was copied (``acc - acc``, each element as ``convert.combine`` with SUB gives it),
    in pieces cut at the run's chunks."""
    rows = run_pieces(starts)
    for k in prange(rows.shape[0]):
        t, a, b = rows[k, 0], rows[k, 1], rows[k, 2]
        s, v = starts[t], vstarts[t]
        o = view_at(like, accs[t], starts[t + 1] - s)
        for i in range(a - s, b - s):
            values[v + i] = o[i]
            o[i] -= values[v + i]


@jit
def warm_starts(qs, like, ms, rs, qts, qstarts, tiny):
    """Each matrix's starting ``Q`` from its last one: the ``ms[t] x rs[t]`` array (row-major,
    ``like``'s dtype) at address ``qs[t]`` (0: none, ``qts`` left as it is there), widened to
    float64, orthonormalised (``lowrank.orthogonalize`` with ``tiny``), rounded to ``qts``'s
    dtype and written transposed (``rs[t] x ms[t]``) at ``qts[qstarts[t]:]``.  Returns per
    matrix 1 where a column of what was written is all zero (``start_q`` then draws the
    matrix's ``Q`` instead), else 0."""
    count = ms.size
    zero = np.zeros(count, np.int8)
    for t in range(count):
        if qs[t] == 0:
            continue
        m, r = ms[t], rs[t]
        q = view_at(like, qs[t], m * r)
        wide = np.empty((m, r))
        for j in range(m):
            for c in range(r):
                wide[j, c] = q[j * r + c]
        orthogonalize(wide, tiny)
        base = qstarts[t]
        for c in range(r):
            nonzero = False
            for j in range(m):
                qts[base + c * m + j] = wide[j, c]
                nonzero = nonzero or qts[base + c * m + j] != 0
            if not nonzero:
                zero[t] = 1
    return zero
