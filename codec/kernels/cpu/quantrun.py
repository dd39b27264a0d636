"""A quantizer run's frame read in one call (Numba CPU, host only: a run is read from a
frame's payload, which is host bytes whatever the arrays it decodes into).

* ``run_read``: what :meth:`codec.stages.value.quantizer.Quantizer.read_planned` reads and
  checks before a run's codes are decoded, in one call instead of four: every tensor's
  per-block numbers (as ``pack.take_items`` reads them), whether each is finite, whether any
  codes section has padding bits set past its last item, and whether any code field exceeds
  what an encoder writes (as ``dequant.fields_within_segments`` tests it, in one parallel
  region over the run's (tensor, chunk) rows).

Every check is made whatever the others find, so the caller raises in the order a reader
of each tensor would (the numbers first, then the stage's own checks of them, then the
padding and the fields).  Results never depend on the thread count.
"""

from __future__ import annotations

import numpy as np

from codec._jit import jit, prange
from codec.kernels.cpu._codes import _over_row, _rows
from codec.kernels.cpu._common import task_span
from codec.kernels.cpu._bytes import _get
from codec.kernels.cpu.pack import _item

__all__ = ["run_read"]

#: :func:`run_read`'s flags
NONFINITE, PADDING, FIELD = 1, 2, 4


@jit(parallel=True)
def run_read(data, hoffs, hwidths, hstarts, head, last, used, dstarts, bits, starts, fmask, fshift, largest):
    """Tensor ``t``'s ``hstarts[t+1] - hstarts[t]`` items of ``hwidths[t]`` bytes from byte
    ``hoffs[t]`` of ``data`` (2: int16, 4: float32, 8: float64) into ``head`` as float64,
    exactly; returns the checks' flags: ``NONFINITE`` (1) a number read is NaN or inf,
    ``PADDING`` (2) ``data[last[j]] >> used[j]`` is not 0 for some ``j`` (or ``data`` is empty
    while ``last`` is not), ``FIELD`` (4) some code ``(c & fmask) >> fshift`` is above
    ``largest``, the codes of tensor ``t`` being ``starts[t+1] - starts[t]`` codes of ``bits``
    bits from byte ``dstarts[t]`` (``largest < 0``: not checked)."""
    flags = 0
    for t in range(hstarts.size - 1):
        w = hwidths[t]
        p = np.uint64(hoffs[t])
        for i in range(hstarts[t], hstarts[t + 1]):
            v = _item(_get(data, p, w), w)
            head[i] = v
            if not (v - v == 0):
                flags |= NONFINITE
            p += np.uint64(w)
    if last.size and not data.size:
        flags |= PADDING
    else:
        for j in range(last.size):
            if np.uint64(data[last[j]]) >> np.uint64(used[j]):
                flags |= PADDING
    if largest >= 0 and starts.size > 1 and starts[-1]:
        rows, done, tasks = _rows(starts)
        over = np.zeros(rows[-1], np.uint64)
        for task in prange(tasks):
            first, last = task_span(done, task, tasks)
            for r in range(first, last):
                over[r] = _over_row(data, dstarts, bits, starts, rows, r, fmask, fshift, largest)
        if over.any():
            flags |= FIELD
    return flags
