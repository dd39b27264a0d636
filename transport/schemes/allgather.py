"""The allgather of frames: any codec (docs/transport.md, "Allgather of frames").

    encode  one frame per tensor (through ErrorFeedback), packed into ONE message (message.py)
    sizes   Allgather int64      every rank's message length (-1: this rank could not encode)
    frames  Iallgatherv bytes    every rank's message, no padding
    decode  decode_add of every rank's frame, in rank order, into one accumulator per tensor;
            average divides once at the end

so every rank performs the same operations on the same bytes and computes the same bits.

:class:`Framed` is the base of the schemes that code each tensor into a frame on every rank
(this one and gTop-k): it keeps every tensor's memory in one ``codec.ErrorFeedback``
(``self.ef``), with residuals when error feedback is on and the codec is lossy, without them
otherwise (then a slot holds the tensor's step and stage state only).  A frame's step is its
key's step: how many frames that tensor has made (docs/transport.md, "State").
"""

from __future__ import annotations

import time

import numpy as np

import codec
from codec.arrays import scatter_add, wide_dtype
from transport import message
from transport.errors import raise_failed
from transport.schemes.base import SIGN_CODECS, Scheme, check_finite, finish_sum, vote_error

__all__ = ["Allgather", "Framed"]


class Framed(Scheme):
    """A scheme that codes each tensor into a frame on every rank, through its
    ErrorFeedback (``self.ef``) keyed ``(name, rank)``, or ``name`` without ``rank_streams``:
    with residuals when the reducer has error feedback and the codec is lossy."""

    def __init__(self, codec_or_spec, reducer):
        super().__init__(codec_or_spec, reducer)
        c = self.codec
        self.ef = codec.ErrorFeedback(c, residuals=reducer.error_feedback and not c.lossless)

    def prepare(self, arrays, keys):
        """Checks every input before the first collective, changing nothing: finite where the
        codec needs it, and what the ErrorFeedback's encode would refuse (steps left, the shape
        and dtype of an existing residual)."""
        for a, k in zip(arrays, keys):
            if not self.codec.passes_nonfinite(a.shape):  # the codec would raise on NaN/inf
                check_finite(a, f"tensors[{k!r}]", self.spec)
            self.ef.check(self.key(k), a.shape, a.dtype, f"tensors[{k!r}]")
        return arrays, keys

    def key(self, name):
        return (name, self.reducer.rank) if self.reducer.rank_streams else name

    def encode(self, arrays, keys):
        """One frame per tensor, each at its key's step, which it advances."""
        return [self.ef.encode(a, self.key(k)) for a, k in zip(arrays, keys)]


class Allgather(Framed):
    """Any codec: one message per rank (message.py), sizes by Allgather, bytes by Allgatherv,
    decode_add of every rank's frames in rank order.  ``vote``: sign codecs only; the
    result is the sign of the sum."""

    def __init__(self, codec_or_spec, reducer):
        super().__init__(codec_or_spec, reducer)
        if reducer.vote and codec.parse_spec(self.spec)[0][0] not in SIGN_CODECS:
            raise vote_error(self.spec)

    def start(self, prepared, stats):
        arrays, keys = prepared
        comm = self.reducer.comm
        try:
            frames = self.encode(arrays, keys)
            failed = None
        except Exception as e:  # told to every rank through the sizes, so none is left waiting
            frames, failed = [], e
        msg = message.pack(frames)
        t = time.perf_counter()
        sizes = np.empty(self.reducer.size, np.int64)
        comm.Allgather(np.array([-1 if failed else msg.size], np.int64), sizes)
        if (sizes < 0).any():  # an encode failure the checks before the step did not foresee
            raise_failed(comm, failed, "encoding its tensors")
        displs = np.zeros_like(sizes)
        np.cumsum(sizes[:-1], out=displs[1:])
        recv = np.empty(int(sizes.sum()), np.uint8)
        req = comm.Iallgatherv(msg, [recv, (sizes.tolist(), displs.tolist())])
        stats.communicate_s += time.perf_counter() - t
        stats.bytes_sent = int(msg.size)
        stats.bytes_received = int(sizes.sum() - msg.size)
        return _AllgatherPending(self, arrays, recv, sizes, displs, req, [len(f) for f in frames])


class _AllgatherPending:
    def __init__(self, scheme, arrays, recv, sizes, displs, req, wire):
        self.scheme, self.arrays, self.recv, self.sizes, self.displs, self.req = scheme, arrays, recv, sizes, displs, req
        self.wire = wire

    def test(self):
        return self.req.Test()

    def finish(self, stats):
        self.req.Wait()
        t = time.perf_counter()
        red = self.scheme.reducer
        count = len(self.arrays)
        frames = [
            message.unpack(self.recv[d : d + s], count, r) for r, (d, s) in enumerate(zip(self.displs.tolist(), self.sizes.tolist()))
        ]
        c = self.scheme.codec
        out = []
        for i, a in enumerate(self.arrays):
            acc = np.zeros(a.shape, wide_dtype(a.dtype))
            touched = None
            if c.select is None:
                for r in range(red.size):
                    c.decode_add(frames[r][i], acc)
            else:  # each frame read once, as decode_add would; the sum is zero off the positions
                pairs = [c.decode_sparse(frames[r][i]) for r in range(red.size)]
                for pos, vals in pairs:
                    scatter_add(vals, pos, acc)
                touched = np.unique(np.concatenate([pos for pos, _ in pairs]))
            if red.vote:
                out.append(np.sign(acc).astype(a.dtype))
            else:
                out.append(finish_sum(acc, a.dtype, red.size, red.average, touched))
        stats.decode_s = time.perf_counter() - t
        return out
