"""``powersgd(rank=2, warm_start=true, min_compression_rate=2, seed=0)``: PowerSGD as a codec
(Vogels, Karimireddy, Jaggi, NeurIPS'19), with the rules of PyTorch's DDP hook.

A tensor of shape ``(n, ...)`` is the matrix ``M`` (``n x m``, ``m`` the product of the rest).
One power iteration: ``P = M Q``; ``P`` orthonormalised; ``Q = M^T P``.  The frame carries
``P`` (n x r) then ``Q`` (m x r), row-major, through the value stage (default ``none``); the
decoded array is ``P Q^T``.  ``Q`` starts from a Gaussian drawn from ``(seed, key)``, the
same on every rank, and with ``warm_start`` the next step of the same key starts from this
step's ``Q`` (kept in the ErrorFeedback state, so it survives ``state_dict`` and pickle).
Tensors with ``ndim <= 1``, and matrices where ``(n + m) * r * min_compression_rate`` is not
below ``n * m``, pass through uncompressed.

The functions here (:func:`matrix_of`, :func:`initial_q`, :func:`start_q`,
:func:`orthogonalize`) are what the distributed two-round version reuses: ``P = M Q``, allreduce ``P``,
orthogonalise, ``Q = M^T P``, allreduce ``Q``.
"""

from __future__ import annotations

import math

import numpy as np

from codec.errors import CodecValueError
from codec.modes import SET
from codec.params import Param, SEED
from codec.stage import Bound, Transform, register
from codec.streams import key_hash
from codec.device import host_copy, Memory
from codec.dtypes import on_device
from codec.kernels import backend, module
from codec.layout import LANES
from codec.ops import addresses, offsets, readonly, remember, WIDE, widen
from codec.stages.select.magnitude import raise_nonfinite

#: ``Q`` of the last step, per key, in ``ctx.state`` (ErrorFeedback's per-key state)
STATE_Q = "powersgd.q"

#: elements of the decoded array rounded to a 16-bit dtype or added into ``out`` at a time
#: (below ``codec._jit.PARALLEL_MIN``: serial kernels, no parallel region per chunk)
CHUNK = 1 << 16


def matrix_of(shape, rank: int, min_compression_rate: float):
    """``(n, m, r)`` of the matrix a tensor of ``shape`` is compressed as, or None when it
    passes through (ndim <= 1, or ``(n + m) * r * min_compression_rate >= n * m``); ``r`` is
    ``min(rank, n, m)``."""
    if len(shape) <= 1:
        return None
    n, m = int(shape[0]), math.prod(shape[1:])
    r = min(rank, n, m)
    if r == 0 or (n + m) * r * min_compression_rate >= n * m:
        return None
    return n, m, r


def initial_q(m: int, r: int, dtype, seed: int, key=None, step: int = 0) -> np.ndarray:
    """The ``m x r`` standard Gaussian ``Q`` drawn from ``(seed, key, step)`` (NumPy's PCG64
    seeded with that triple): identical on every rank and every run."""
    rng = np.random.Generator(np.random.PCG64([seed, key_hash(key), step]))
    return rng.standard_normal((m, r), dtype=np.dtype(dtype).type)


def start_q(last, m: int, r: int, dtype, seed: int, key=None, step: int = 0, warm_start: bool = True) -> np.ndarray:
    """The orthonormalised ``Q`` (m x r) a power iteration starts from; PyTorch's hook
    orthogonalises it too.

    With ``warm_start``, this is the key's last ``Q`` (``last``) when its shape and dtype fit,
    else :func:`initial_q` of ``(seed, key, 0)``.  Without it, the draw of ``(seed, key, step)``.
    A warm ``Q`` with a zero column (the last gradient was zero, or of lower rank) is replaced
    by the draw of ``(seed, key, step)``, since ``M Q`` would otherwise stay zero in that
    column for ever."""
    if not warm_start:
        return orthogonalize(initial_q(m, r, dtype, seed, key, step))
    if last is None or last.shape != (m, r) or last.dtype != dtype:
        return _first_q(m, r, np.dtype(dtype), seed, key).copy()
    q = orthogonalize(np.array(last, copy=True))
    if np.all(np.any(q != 0, axis=0)):
        return q
    return orthogonalize(initial_q(m, r, dtype, seed, key, step))


#: the first ``Q`` of small matrices, by ``(m, r, dtype, seed, key hash)``: a codec that keeps no
#: state between steps (``encode_many`` without error feedback) starts every step from it, and
#: drawing it (a PCG64 seeded from the triple, then Gram-Schmidt) cost more than the step's
#: products: the sample's ``encode_many`` 0.56 -> 0.40 ms
_FIRST: dict = {}
#: the most items a kept first ``Q`` has, and the most kept
FIRST_ITEMS, FIRST_KEEP = 1 << 16, 512


def _first_q(m: int, r: int, dtype: np.dtype, seed: int, key) -> np.ndarray:
    """``orthogonalize(initial_q(m, r, dtype, seed, key, 0))``, kept for small matrices
    (:data:`FIRST_ITEMS`; by the key's hash) and read-only: the caller copies it."""
    at = (m, r, dtype, seed, key_hash(key))
    got = _FIRST.get(at)
    if got is None:
        got = orthogonalize(initial_q(m, r, dtype, seed, key, 0))
        got.flags.writeable = False
        if m * r <= FIRST_ITEMS:
            remember(_FIRST, at, got, FIRST_KEEP)
    return got


def orthogonalize(p: np.ndarray) -> np.ndarray:
    """Orthonormalise the columns of ``p`` (n x r, float32 or float64, on the host) in place
    and return it: Gram-Schmidt on a float64 copy, every dot product a sum in index order, so
    the result depends on nothing but ``p`` (no BLAS, no thread count, no device: the kernel
    ``lowrank.orthogonalize``).  The earlier columns are removed twice ("twice is enough":
    one pass leaves a dependent column's dot-product rounding, which grows with n, along the
    earlier column, and normalising it would send that column twice).  Epsilon guard: a
    column whose norm after that is 0 or at most 16 machine epsilons (of ``p``'s dtype) of
    its norm before becomes zero instead of amplified rounding noise, so ``P P^T`` stays a
    projection."""
    wide = np.array(p, np.float64, order="C")
    module("lowrank").orthogonalize(wide, tiny(p.dtype))
    p[...] = wide
    return p


def tiny(dtype) -> float:
    """:func:`orthogonalize`'s epsilon guard for ``dtype``: 16 of its machine epsilons."""
    return float(16 * np.finfo(dtype).eps)


def _where(mat):
    """Where ``mat`` lives (:class:`codec.device.Memory`): ``Q`` or ``P`` is put there."""
    return Memory(on_device(mat))


def project(mat, q) -> tuple[np.ndarray, int]:
    """``(M Q, how many entries of M are NaN or inf)``: ``M`` (n x m, float32/float64, on the
    host or the device), ``Q`` (m x r, host); the product on ``M``'s device in the fixed order
    of ``lowrank.project`` (lanes of ``codec.layout.LANES``), returned on the host in ``M``'s
    dtype (it is frame content).  ``M`` reaches the kernel read-only from every caller (the
    stage, the transport's two rounds): one compiled signature a dtype."""
    n = mat.shape[0]
    p = np.empty((n, q.shape[1]), mat.dtype)
    bad = backend("lowrank", mat).project(readonly(mat), _where(mat).put(np.ascontiguousarray(q.T, mat.dtype)), p, LANES)
    return p, int(bad)


def back_project(mat, p) -> np.ndarray:
    """``M^T P`` (m x r, host, ``M``'s dtype) in the fixed order of ``lowrank.back_project``,
    on ``M``'s device (``P``: a host array, put there, or already there)."""
    q = np.empty((mat.shape[1], p.shape[1]), mat.dtype)
    backend("lowrank", mat).back_project(readonly(mat), _there(mat, p), q)
    return q


def _there(where, a):
    """``a`` (a host array, or a device array already in place) where ``where`` lives, in
    ``where``'s dtype and C order."""
    return a if on_device(a) else _where(where).put(np.ascontiguousarray(a, where.dtype))


def expand(p, q, out, mode: int = SET) -> None:
    """``out (=|+=|-=) P Q^T`` (``mode``; ``out``: n x m, ``P``'s dtype, host or device), ``P
    Q^T`` in the fixed order of ``lowrank.expand`` (a chain of fused multiply-adds per
    element), on ``out``'s device:
    ``P`` (n x r; a host array, put there, or already there) and ``Q`` (m x r, a host array,
    put there transposed).  The decode of a frame's P and Q, and the two-round transport's
    ``P Q^T`` (its residual and its result): the same bits on the host and the device."""
    if out.size:
        backend("lowrank", out).expand(_there(out, p), _there(out, q.T), out, mode)


@register
class PowerSGD(Transform):
    """Rank-r PowerSGD: one warm-started power iteration, P (n x r) and Q (m x r) sent (Vogels et al. 2019)."""

    name = "powersgd"
    default_value = "none"
    lowrank = True
    #: the products run where the gradient lives (the ``lowrank`` twins); ``Q``, ``P`` and its
    #: orthogonalisation are frame content, on the host
    devices = frozenset({"cpu", "cuda"})
    params = (
        Param("rank", int, 2, "rank r of the approximation P Q^T (capped at min(n, m))", low=1, high=1 << 20),
        Param("warm_start", bool, True, "start each step's power iteration from the key's last Q"),
        Param(
            "min_compression_rate",
            float,
            2.0,
            "compress only when n*m > this times (n + m)*r; smaller tensors pass through",
            low=0.0,
        ),
        SEED,
    )

    def matrix(self, shape):
        return matrix_of(shape, self.rank, self.min_compression_rate)

    def check_state(self, state, shape, dtype):
        """A loaded warm-start ``Q`` (``STATE_Q``) must be what :meth:`forward` stores: only
        with ``warm_start`` and for a tensor that is compressed, of shape ``m x r`` (its matrix
        view ``n x m``, ``r = min(rank, n, m)``) and the domain dtype (float64 for float64
        tensors, else float32), finite.  Returned as a fresh C-contiguous array."""
        clean = {}
        for name, q in state.items():
            if name != STATE_Q:
                raise CodecValueError(f"{name}: unknown field; powersgd keeps only {STATE_Q!r}")
            if not self.warm_start:
                raise CodecValueError(f"{name}: powersgd(warm_start=false) keeps no Q")
            plan = self.matrix(shape)
            if plan is None:
                raise CodecValueError(f"{name}: a {np.dtype(dtype)}{list(shape)} tensor passes through powersgd uncompressed, so it has no Q")
            n, m, r = plan
            want = self.domain_dtype(dtype)
            if not isinstance(q, np.ndarray) or isinstance(q, np.ma.MaskedArray):
                what = "a masked array" if isinstance(q, np.ma.MaskedArray) else type(q).__name__
                raise CodecValueError(f"{name}: expected a NumPy array, got {what}")
            if q.dtype.kind != "f" or q.dtype.newbyteorder("=") != want or q.shape != (m, r):
                raise CodecValueError(
                    f"{name}: expected {want}[{m}, {r}] (m x r for the {n} x {m} matrix view, rank {r}), "
                    f"got {q.dtype}{list(q.shape)}"
                )
            out = np.empty((m, r), want)
            out[...] = q.view(np.ndarray)
            if not np.isfinite(out).all():
                raise CodecValueError(f"{name}: non-finite value in Q; powersgd needs a finite Q")
            clean[name] = out
        return clean

    def passes(self, shape):
        """Vectors, and matrices too small to gain (``min_compression_rate``), pass through."""
        return self.matrix(shape) is None

    def passes_nonfinite(self, shape):
        """A tensor powersgd compresses must be finite; one that passes through meets only
        the value stage."""
        return self.passes(shape)

    def bound(self, ctx):
        """No sections of its own; the value stage codes ``r (n + m)`` coefficients of the
        domain's dtype (P then Q), or the tensor itself where it passes through."""
        plan = self.matrix(ctx.shape)
        if plan is None:
            return Bound(0, 0, ctx.domain(ctx.n, ctx.dtype))
        n, m, r = plan
        return Bound(0, 0, ctx.domain(r * (n + m), self.domain_dtype(ctx.dtype)))

    def forward(self, flat, ctx, sections):
        plan = self.matrix(ctx.shape)
        if plan is None:
            return flat
        n, m, r = plan
        mat = widen(flat).reshape(n, m)
        dt = np.dtype(mat.dtype)
        q = start_q(ctx.state.get(STATE_Q), m, r, dt, self.seed, ctx.key, ctx.step, self.warm_start)
        p, bad = project(mat, q)
        if bad:  # counted in the product's pass: NaN would spread through every value

            raise_nonfinite(host_copy(flat) if on_device(flat) else flat, ctx, self.name)
        p = orthogonalize(p)
        q = back_project(mat, p)
        if self.warm_start:
            ctx.state[STATE_Q] = q
        return np.concatenate((p.reshape(-1), q.reshape(-1)))

    def read(self, reader, ctx):
        plan = self.matrix(ctx.shape)
        if plan is None:
            return (None, ctx.dtype), ctx.domain(ctx.n, ctx.dtype)
        n, m, r = plan
        return (plan, ctx.dtype), ctx.domain(r * (n + m), self.domain_dtype(ctx.dtype))

    def inverse(self, payload, values, out, mode):
        """``P Q^T`` into ``out``, in the fixed order of ``lowrank.expand`` (a chain of fused
        multiply-adds per element: what OpenBLAS's kernels computed for earlier versions), on
        ``out``'s device (``P`` and ``Q``, frame content, laid out on the host and moved there).  Stored as is into a
        float32/float64 ``out`` of the domain's dtype (added or subtracted in the same pass
        for a float32/float64 frame: error feedback's ``acc -= decoded``), else formed once in the domain's dtype
        where ``out`` lives and rounded to a 16-bit frame's dtype and stored or added
        ``CHUNK`` elements at a time (:meth:`emit`)."""
        plan, dtype = payload
        flat = out.reshape(out.size)
        if plan is None:
            _emit_chunked(self, values, flat, mode, dtype)
            return
        n, m, r = plan
        mem = _where(out)
        values = mem.host(values)  # (P and Q laid out on the host: r(n + m) values, frame content)
        p, q = values[: n * r].reshape(n, r), values[n * r :].reshape(m, r)
        if flat.dtype == values.dtype and (mode == SET or np.dtype(dtype) in WIDE):  # stored, added or subtracted in one pass
            expand(p, q, flat.reshape(n, m), mode)
            return
        y = mem.empty((n, m), values.dtype)
        expand(p, q, y)
        _emit_chunked(self, y.reshape(n * m), flat, mode, dtype)

    def inverse_segments(self, value, payloads, outs, mode):
        """Every matrix's ``P Q^T`` in one ``lowrank.expand_segments`` call, each into its own
        array (by address), bit for bit what :meth:`inverse` writes: with SET into host
        arrays of the coefficients' dtype, every tensor a compressed matrix; else False."""
        if mode != SET or not outs or on_device(*outs) or any(plan is None for (plan, _), _, _ in payloads):
            return False
        dt = self.domain_dtype(payloads[0][1].dtype)
        if any(o.dtype != dt or vctx.dtype != dt for o, (_, vctx, _) in zip(outs, payloads)):
            return False
        vstarts = offsets([vctx.n for _, vctx, _ in payloads])
        if value.name == "none":  # the coefficients as the frame holds them: gathered at once
            values = np.concatenate([vpay for _, _, vpay in payloads])
        else:
            values = np.empty(int(vstarts[-1]), dt)
            for (_, vctx, vpay), lo, hi in zip(payloads, vstarts[:-1].tolist(), vstarts[1:].tolist()):
                value.write(vpay, values[lo:hi], SET)
        ns, ms, rs = (np.array(col, np.int64) for col in zip(*(plan for (plan, _), _, _ in payloads)))
        addrs = addresses(outs)
        backend("lowrank", outs[0]).expand_segments(readonly(values), *map(readonly, (vstarts, ns, ms, rs, addrs)), outs[0])  # (read-only, as every caller: one signature)
        return True


def _emit_chunked(stage, y, out, mode, dtype) -> None:
    """``stage.emit`` of flat ``y`` into flat ``out``, ``CHUNK`` elements at a time when a
    16-bit frame or output makes it allocate (the rounded codes, the widened source); in one
    call, parallel and allocating nothing, when both are float32/float64.  Rounding and
    adding are elementwise: the result is the unchunked one."""
    if np.dtype(dtype) in WIDE and out.dtype in WIDE:
        stage.emit(y, out, mode, dtype)
        return
    for i in range(0, y.size, CHUNK):
        stage.emit(y[i : i + CHUNK], out[i : i + CHUNK], mode, dtype)
