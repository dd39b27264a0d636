"""What every scheme shares: the :class:`Scheme` base and the pending-step protocol
(:class:`Pending`), the dense sum of flat parts (:class:`Sums`), the one division and
rounding at the end (:func:`finish_sum`) and the finiteness check (:func:`check_finite`).

A scheme never imports the Allreducer: it gets the reducer as an argument and reads its
options (``comm``, ``rank``, ``size``, ``average``, ``error_feedback``, ``vote``,
``rank_streams``, ``bucket_bytes``, ``checksum``) from it.  A scheme keeps its per-tensor
memory (residuals, steps, stage state such as PowerSGD's Q) in one ``codec.ErrorFeedback``,
``self.ef`` (None for a scheme without memory); the Allreducer's ``state_dict`` /
``load_state_dict`` save and check it, the same way for every scheme.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

import codec
from codec.arrays import first_nonfinite, round_into, round_to, wide_dtype
from codec.dtypes import on_device
from codec.errors import CodecValueError, NonFiniteError

__all__ = ["Pending", "SIGN_CODECS", "Scheme", "Sums", "check_finite", "finish_device", "finish_sum", "mpi", "vote_error"]

#: codecs whose reduction may be a majority vote (sign of the sum of signs)
SIGN_CODECS = ("sign", "efsign", "onebit")


def mpi(comm=None):
    """The MPI names a scheme uses with ``comm``: a communicator's own (``comm.MPI``: the
    torch.distributed adapter, transport/torchdist.py), else ``mpi4py.MPI``, imported on
    first use and never at module level: importing it initialises MPI, and ``import
    transport`` (the cost model, the message fuzzer, a reducer on torch.distributed) must
    work where mpi4py is absent or unwanted."""
    own = getattr(comm, "MPI", None)
    if own is not None:
        return own
    from mpi4py import MPI

    return MPI


def vote_error(spec: str) -> ValueError:
    """The error of ``vote=True`` with a codec that is not a sign codec."""
    return CodecValueError(f"vote: majority vote needs a sign codec ({', '.join(SIGN_CODECS)}), not {spec!r}")


class Pending(Protocol):
    """A step in flight, as :meth:`Scheme.start` returns it (``Handle`` drives it).

    ``wire``: this rank's wire bytes per sent tensor (its share of its message, headers
    included, or what the scheme sends for it).  ``test()``: True when the first round's
    communication has completed; never blocks.  ``finish(stats, out)``: completes the step
    (every remaining round), adds the bytes it moved to ``stats`` (a ``transport.Stats``),
    sets ``stats.decode_s``, and returns the reduced arrays, with the inputs' dtypes and
    shapes, in the sent order; ``out`` holds per sent tensor None or the caller's array (the
    tensor's dtype and shape, C-contiguous, possibly the input itself: no scheme reads its
    inputs after ``start``) that the result must be written into and returned as (the
    ``out=`` of ``Allreducer.reduce``).  It is called once, on every rank, in the order the
    steps were started."""

    wire: list

    def test(self) -> bool: ...

    def finish(self, stats, out) -> list: ...


class Scheme:
    """How a step moves.  ``prepare(arrays, keys)`` does every check and every piece of local
    work that can fail on one rank only, and changes no state; it runs before the step's
    first collective (the config check, which carries its success or failure to every rank).
    ``start(prepared, stats)`` then encodes and posts the first communication, returning a
    :class:`Pending` step whose ``finish(stats)`` completes it and returns the reduced arrays
    (the inputs' dtypes and shapes).

    ``Scheme(codec_or_spec, reducer)``: ``codec_or_spec`` as the Allreducer got it (a spec
    string, config dict or ``codec.Codec``).  :meth:`takes` lets a scheme decline a spec
    whose head names it (the default scheme then runs it).

    ``ef``: the scheme's per-tensor memory, a ``codec.ErrorFeedback`` (None: the scheme keeps
    none, as ``none``'s MPI Allreduce); :meth:`prepare` reads it and never changes it.

    ``devices``: the scheme takes device tensors as they are (its arrays, and ``out``, are
    then device arrays: transport/device.py); else the Allreducer hands it host copies."""

    ef = None
    devices = False
    #: whether the scheme runs DGC's momentum correction (``Allreducer(momentum=)``) in its ErrorFeedback
    takes_momentum = False

    def __init__(self, codec_or_spec, reducer, checksum: bool | None = None):
        """``checksum``: whether the scheme's frames carry their payload CRC-32C (default: the
        reducer's ``checksum``; a scheme whose frames never leave the rank passes False)."""
        self.reducer = reducer
        self.codec = codec.get_codec(codec_or_spec, checksum=reducer.checksum if checksum is None else checksum)
        self.spec = self.codec.spec

    @classmethod
    def takes(cls, stages) -> bool:
        """Whether this scheme runs the parsed spec ``stages`` (``[(name, params)]``) whose head
        names it in the table (transport/schemes/__init__.py)."""
        return True

    def prepare(self, arrays, keys):
        return arrays, keys

    def start(self, prepared, stats) -> Pending:
        raise NotImplementedError


def finish_sum(acc: np.ndarray, dtype, size: int, average: bool, touched=None, out=None) -> np.ndarray:
    """``acc / size`` when averaging (one division), rounded once to ``dtype``.

    ``touched``: sorted unique flat positions outside which ``acc`` is known to be zero (a
    sparse sum); only those are divided and rounded, so the untouched pages of a fresh
    ``np.zeros`` are never written.  ``out``: the caller's array of ``dtype`` (C-contiguous,
    ``acc``'s size, possibly ``acc`` itself) to write the result into and return, instead of a
    new array.  The result is the same bits either way."""
    if touched is not None:
        flat = acc.reshape(-1)
        part = finish_sum(flat[touched], dtype, size, average)
        if out is not None:
            if out is not acc:  # acc is zero off the positions; out may hold anything
                out.fill(0)
            out.reshape(-1)[touched] = part
            return out
        if acc.dtype == dtype:
            flat[touched] = part
            return acc
        res = np.zeros(acc.shape, dtype)
        res.reshape(-1)[touched] = part
        return res
    divide = average and size > 1
    if out is not None and out.dtype == acc.dtype:  # one pass straight into the caller's array
        if divide:
            np.divide(acc, acc.dtype.type(size), out=out.reshape(acc.shape))
        elif out is not acc:
            np.copyto(out.reshape(acc.shape), acc)
        return out
    if divide:
        np.divide(acc, acc.dtype.type(size), out=acc)
    if out is None:
        return acc if acc.dtype == dtype else round_to(acc, dtype)
    round_into(acc.reshape(-1), out.reshape(-1))
    return out


def finish_device(s, a, red, out=None):
    """A device tensor ``a``'s sum ``s`` (its slice of a summed buffer) finished as
    :func:`finish_sum` finishes it: on the device when the buffer is there (a CUDA-aware
    MPI), else on the host and copied up once into ``out`` (the caller's device array) or a
    new device array.  ``red``: the Allreducer (``size``, ``average``)."""
    from codec.device import to_device
    from transport import device

    if on_device(s):
        return device.finish_on_device(s.reshape(a.shape), a.dtype, red.size, red.average, out=out)
    res = finish_sum(s, a.dtype, red.size, red.average).reshape(a.shape)
    if out is None:
        return to_device(np.ascontiguousarray(res))
    if res.size:
        out.reshape(res.size).copy_to_device(np.ascontiguousarray(res).reshape(-1))
    return out


def check_finite(a: np.ndarray, where: str, who: str, why: str = "needs finite input") -> None:
    """``codec.errors.NonFiniteError`` (a ValueError) naming ``where`` (``tensors['w']``) and
    the position of ``a``'s first NaN or inf; nothing when ``a`` is finite."""
    bad = first_nonfinite(a)
    if bad >= 0:
        raise NonFiniteError(where, tuple(int(i) for i in np.unravel_index(bad, a.shape)), who, why)


class Sums:
    """MPI Allreduce (SUM, in place, nonblocking) of a list of flat parts: one buffer per
    accumulator dtype (``wide_dtype`` of each tensor's dtype), so a step costs one collective
    per dtype however many tensors it has.  Used by ``none`` and by both PowerSGD rounds."""

    def __init__(self, comm, arrays):
        self.comm = comm
        self.groups = {}
        for i, a in enumerate(arrays):
            self.groups.setdefault(wide_dtype(a.dtype), []).append(i)

    def start(self, parts, stats) -> "Sums":
        """Post the sums of ``parts`` (host arrays; or device arrays, gathered on the device
        for a CUDA-aware MPI, else into pinned host memory: transport/device.py)."""
        from transport import device

        MPI = mpi(self.comm)
        self.sizes = [p.size for p in parts]
        self.bufs, self.reqs = {}, []
        on_dev = bool(parts) and on_device(parts[0])
        for dt, idx in self.groups.items():
            if on_dev:
                buf = device.gathered([parts[i] for i in idx], dt, device.cuda_aware(self.comm))
            else:
                buf = np.concatenate([parts[i].reshape(-1) for i in idx], dtype=dt)
            self.bufs[dt] = buf
            self.reqs.append(self.comm.Iallreduce(MPI.IN_PLACE, buf))
            stats.bytes_sent += buf.nbytes
            stats.bytes_received += buf.nbytes
        return self

    def test(self) -> bool:
        return mpi(self.comm).Request.Testall(self.reqs)

    def wait(self) -> list[np.ndarray]:
        """The summed parts, flat, in the order they were given (views of the buffers)."""
        mpi(self.comm).Request.Waitall(self.reqs)
        out = [None] * len(self.sizes)
        for dt, idx in self.groups.items():
            at = 0
            for i in idx:
                out[i] = self.bufs[dt][at : at + self.sizes[i]]
                at += self.sizes[i]
        return out
