"""Pufferfish's factorization helpers (Wang, Agarwal, Papailiopoulos, MLSys'21), on NumPy arrays.

Pufferfish trains a network whose large layers are stored as two low-rank factors, so their
gradients are small by construction and need no compression.  :func:`factorize` splits one
weight by a truncated SVD; :func:`plan` decides which layers of a model to split under the
paper's policy (first and last layers, biases, norms and small layers stay full rank) and
counts the parameters before and after.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from codec.errors import CodecTypeError, CodecValueError

#: layers with fewer weights than this stay full rank by default (factorizing them saves little)
MIN_SIZE = 4096


@dataclass(frozen=True)
class Factors:
    """The two factors of a weight: apply ``first`` then ``second``.

    Linear weight ``(out, in)``: ``first`` is ``(r, in)``, ``second`` is ``(out, r)``
    (``W ~ second @ first``).  Convolution ``(out, in, kh, kw)``: ``first`` is an
    ``(r, in, kh, kw)`` kernel (same stride and padding as the original), ``second`` an
    ``(out, r, 1, 1)`` kernel.  ``error`` is the relative Frobenius error of the product,
    ``sqrt(sum of the dropped s_i**2 / sum of all s_i**2)`` (0 for a zero weight).
    """

    first: np.ndarray
    second: np.ndarray
    rank: int
    error: float

    def product(self) -> np.ndarray:
        """``second @ first`` in the original weight's shape."""
        out, r = self.second.shape[0], self.rank
        w = self.second.reshape(out, r) @ self.first.reshape(r, -1)
        return w.reshape((out,) + self.first.shape[1:])


def _check_ratio(rank_ratio) -> None:
    if not (isinstance(rank_ratio, (int, float)) and 0 < rank_ratio <= 1):
        raise CodecValueError(f"rank_ratio: must be in (0, 1], got {rank_ratio!r}")


def _rank(out: int, cols: int, rank, rank_ratio: float) -> int:
    if rank is None:
        _check_ratio(rank_ratio)
        rank = max(1, math.floor(out * rank_ratio))
    elif isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
        raise CodecValueError(f"rank: must be an integer >= 1, got {rank!r}")
    return min(int(rank), out, cols)


def factorize(W, rank: int | None = None, rank_ratio: float = 0.25) -> Factors:
    """Split a 2-D (out x in) or 4-D convolution (out, in, kh, kw) weight into two low-rank
    factors by a truncated SVD: ``U, S, V^T = svd(W as out x in*kh*kw)``,
    ``U' = U sqrt(S)`` and ``V' = sqrt(S) V^T`` truncated to ``r = max(1, floor(out *
    rank_ratio))`` (or ``rank``; at most ``min(out, in*kh*kw)``).  Returns :class:`Factors`.
    float16/bfloat16 weights are factorized in float32; float32 and float64 in their own dtype."""
    W = np.asarray(W)
    if W.ndim not in (2, 4):
        raise CodecValueError(f"W: expected a 2-D (out, in) or 4-D (out, in, kh, kw) weight, got shape {W.shape}")
    if W.dtype.kind != "f" and W.dtype.name != "bfloat16":
        raise CodecTypeError(f"W: expected a float array, got {W.dtype}")
    if W.size == 0:
        raise CodecValueError(f"W: empty weight of shape {W.shape}")
    dt = W.dtype if W.dtype in (np.float32, np.float64) else np.dtype(np.float32)
    out = W.shape[0]
    mat = W.astype(dt).reshape(out, -1)
    r = _rank(out, mat.shape[1], rank, rank_ratio)
    u, s, vt = np.linalg.svd(mat, full_matrices=False)
    root = np.sqrt(s[:r])
    first = (root[:, None] * vt[:r]).astype(dt)
    second = (u[:, :r] * root).astype(dt)
    energy = float(np.sum(s.astype(np.float64) ** 2))
    error = math.sqrt(float(np.sum(s[r:].astype(np.float64) ** 2)) / energy) if energy > 0 else 0.0
    if W.ndim == 4:
        first = first.reshape((r,) + W.shape[1:])
        second = second.reshape(out, r, 1, 1)
    return Factors(first, second, r, error)


@dataclass(frozen=True)
class Layer:
    """One layer of a :class:`Plan`: ``rank`` is None when it stays full rank (``reason`` says why)."""

    name: str
    shape: tuple
    rank: int | None
    params: int
    params_after: int
    reason: str


@dataclass(frozen=True)
class Plan:
    """Which layers to factorize, and the parameter counts before and after."""

    layers: tuple

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def params_after(self) -> int:
        return sum(layer.params_after for layer in self.layers)

    @property
    def reduction(self) -> float:
        """``params / params_after`` (1.0 for an empty plan)."""
        return self.params / self.params_after if self.params_after else 1.0

    def factorized(self) -> dict:
        """``{name: rank}`` of the layers to factorize."""
        return {layer.name: layer.rank for layer in self.layers if layer.rank is not None}


def _count(flag, what: str) -> int:
    if isinstance(flag, bool):
        return int(flag)
    if isinstance(flag, (int, np.integer)) and flag >= 0:
        return int(flag)
    raise CodecValueError(f"{what}: expected true/false or a number of layers >= 0, got {flag!r}")


def plan(shapes, rank_ratio: float = 0.25, keep_first=True, keep_last=True, min_size: int = MIN_SIZE) -> Plan:
    """Pufferfish's policy over a model's parameter shapes (a dict name -> shape, or a list of
    shapes named by position, in the model's order).

    A weight layer is a 2-D or 4-D shape.  It stays full rank when it is among the first
    ``keep_first`` or the last ``keep_last`` weight layers (True means 1), when it has fewer
    than ``min_size`` weights, or when its factors would not be smaller; every other shape
    (biases, norms) stays as it is.  A factorized layer of shape (out, in, ...) with rank
    ``r = max(1, floor(out * rank_ratio))`` holds ``r * (in*kh*kw + out)`` parameters.
    """
    items = list(shapes.items()) if isinstance(shapes, dict) else [(str(i), s) for i, s in enumerate(shapes)]
    items = [(name, tuple(int(d) for d in (s.shape if hasattr(s, "shape") else s))) for name, s in items]
    _check_ratio(rank_ratio)
    first, last = _count(keep_first, "keep_first"), _count(keep_last, "keep_last")
    if isinstance(min_size, bool) or not isinstance(min_size, (int, np.integer)) or min_size < 0:
        raise CodecValueError(f"min_size: must be an integer >= 0, got {min_size!r}")
    weights = [i for i, (_, s) in enumerate(items) if len(s) in (2, 4)]
    kept = set(weights[:first]) | set(weights[max(0, len(weights) - last) :] if last else [])
    layers = []
    for i, (name, shape) in enumerate(items):
        size = math.prod(shape)
        rank, after, reason = None, size, ""
        if len(shape) not in (2, 4):
            reason = "not a 2-D or 4-D weight (bias, norm, ...)"
        elif i in kept:
            reason = "first layers stay full rank" if i in weights[:first] else "last layers stay full rank"
        elif size < min_size or size == 0:
            reason = f"fewer than min_size={min_size} weights" if size else "empty"
        else:
            out, cols = shape[0], size // shape[0]
            r = _rank(out, cols, None, rank_ratio)
            if r * (cols + out) >= size:
                reason = "the factors would not be smaller"
            else:
                rank, after, reason = r, r * (cols + out), "factorized"
        layers.append(Layer(name, shape, rank, size, after, reason))
    return Plan(tuple(layers))
