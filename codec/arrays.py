"""Array helpers for layers above the codec (the MPI transport): the codec's own rules for
dtypes, rounding, finiteness and sparse sums, so a transport computes the same bits as
``decode_add`` without reaching into codec internals.  docs/api.md, "For transports".

* :func:`as_float_array` — an input as a plain C-contiguous float ndarray (the rule
  ``Codec.encode`` applies to its ``x``);
* :func:`wide_dtype` — the accumulator dtype of a tensor dtype (float64 for float64, else float32);
* :func:`round_to` — round once, to nearest even, to a dtype (16-bit included);
* :func:`round_into` — the same, written into a caller's array;
* :func:`first_nonfinite` — flat position of the first NaN/inf, or -1 (no full-size temporary);
* :func:`scatter_add` — ``out[positions] += values``, each element rounded once, as
  ``decode_add`` of a sparse frame does;
* :func:`on_device` — True for arrays in GPU memory (``__cuda_array_interface__``);
* :func:`is_torch`, :func:`torch_view` — a torch tensor, and a CPU one's NumPy view to write
  into (bfloat16 included), as decoding's ``out=`` takes it.

Importing this module imports no Numba kernel: kernels load on the first call that needs one.
"""

from __future__ import annotations

import numpy as np

from codec.dtypes import as_float_array, is_torch, on_device, torch_view
from codec.modes import ADD, SET
from codec.ops import first_nonfinite, round_to, scatter, store, wide_dtype

__all__ = ["as_float_array", "first_nonfinite", "is_torch", "on_device", "round_into", "round_to", "scatter_add", "torch_view", "wide_dtype"]


def round_into(src: np.ndarray, out: np.ndarray) -> None:
    """``out[...] = src`` rounded once, to nearest even, to ``out``'s dtype (any supported
    float dtypes; ``out`` C-contiguous with ``src``'s element count): :func:`round_to`
    without the new array, for a result that goes into the caller's buffer."""
    store(src, out, SET)


def scatter_add(values, positions, out: np.ndarray) -> None:
    """``out.flat[positions] += values`` in place, each touched element rounded once to
    ``out``'s dtype: the sum ``Codec.decode_add`` forms for a sparse frame, so the pairs of
    ``codec.decode_sparse(frame)`` scatter-added into ``acc`` give ``decode_add(frame, acc)``'s
    bits.  ``positions``: unique integers in ``range(out.size)`` (repeats are not detected);
    ``out``: a C-contiguous float ndarray of any shape, indexed flat."""
    scatter(values, positions, out, ADD)
