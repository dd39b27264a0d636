"""The allgather of frames: any codec (docs/transport.md, "Allgather of frames").

    encode  ONE many-tensor frame per rank (format v2, layout-hash form) holding every tensor,
            each coded through the ErrorFeedback as if alone
    sizes   Allgather int64      every rank's frame length (-1: this rank could not encode)
    frames  Iallgatherv bytes    every rank's frame, no padding
    decode  each rank's frame parsed once and added, in rank order, into one accumulator per
            tensor (the caller's array with ``out=``); average divides once at the end

so every rank performs the same operations on the same bytes and computes the same bits.
The frame names its layout by hash only: the config check before the step has compared every
rank's names, shapes and dtypes, and decoding checks the hash again.

:class:`Framed` is the base of the schemes that code each tensor into a frame on every rank
(this one and gTop-k): it keeps every tensor's memory in one ``codec.ErrorFeedback``
(``self.ef``), with residuals when error feedback is on and the codec is lossy, without them
otherwise (then a slot holds the tensor's step and stage state only).  A tensor's step is its
key's step: how many frames that tensor has been coded into (docs/transport.md, "State").
"""

from __future__ import annotations

import time

import numpy as np

import codec
from codec.arrays import scatter_add, wide_dtype
from codec.device import clear, empty
from codec.dtypes import on_device
from codec.errors import CodecTypeError
from codec.frame import raw_length
from codec.manyframe import read_header
from codec.ops import offsets
from transport import device as devices
from transport.errors import raise_failed
from transport.schemes.base import SIGN_CODECS, Scheme, check_finite, finish_sum, vote_error

__all__ = ["Allgather", "Framed"]


class Framed(Scheme):
    """A scheme that codes a step's tensors into one many-tensor frame on every rank, through
    its ErrorFeedback (``self.ef``) keyed ``(name, rank)``, or ``name`` without
    ``rank_streams``: with residuals when the reducer has error feedback and the codec is lossy."""

    def __init__(self, codec_or_spec, reducer, checksum: bool | None = None):
        super().__init__(codec_or_spec, reducer, checksum)
        c = self.codec
        momentum = reducer.momentum if self.takes_momentum else 0.0
        self.ef = codec.ErrorFeedback(c, residuals=reducer.error_feedback and not c.lossless, momentum=momentum)

    def prepare(self, arrays, keys):
        """Checks every input before the first collective, changing nothing: finite where the
        codec needs it (a device tensor's NaN/inf is found by the encode itself, which the
        sizes' exchange then reports to every rank: its values never come to the host), and
        what the ErrorFeedback's encode would refuse (steps left, the shape and dtype of an
        existing residual)."""
        for a, k in zip(arrays, keys):
            if not on_device(a) and not self.codec.passes_nonfinite(a.shape):  # the codec would raise on NaN/inf
                check_finite(a, f"tensors[{k!r}]", self.spec)
            self.ef.check(self.key(k), a.shape, a.dtype, f"tensors[{k!r}]")
        return arrays, keys

    def key(self, name):
        return (name, self.reducer.rank) if self.reducer.rank_streams else name

    def encode(self, arrays, keys, out=None) -> bytes:
        """One many-tensor frame of every tensor, each at its key's step, which it advances
        (``out``: where to write it, as for ``codec.Codec.encode``)."""
        return self.ef.encode_many(arrays, keys=[self.key(k) for k in keys], layout="hash", out=out)

    @staticmethod
    def wire(frame) -> list[int]:
        """Each tensor's share of ``frame`` (this rank's own): its sections' bytes, with the
        header (and any compression of the payload) shared in proportion to them, adding up
        to the frame.  Read from the header alone: nothing is decompressed (of a device
        frame, only the header crosses)."""
        h = _header(frame)
        raw = [sum(raw_length(c, bits) for (_, bits), c in zip(pat, counts)) for pat, counts in h.per_tensor]
        total = sum(raw)
        if not total:
            return [len(frame) // max(1, len(raw))] * len(raw)
        return [round(r * len(frame) / total) for r in raw]


class Allgather(Framed):
    """Any codec: one frame per rank, sizes by Allgather, bytes by Allgatherv, every rank's
    frame added in rank order.  ``vote``: sign codecs only; the result is the sign of the sum.

    Device tensors are coded into a device frame (error feedback reads it back there); the
    frames travel from and into device buffers when MPI is CUDA-aware, else through pinned
    host buffers: this rank's frame copied down once, the others' frames read from where
    they arrived (their codes cross once, up), this rank's own from the device.  The ranks'
    frames are added into device accumulators and the sum finished there (transport/device.py)."""

    devices = True
    takes_momentum = True

    def __init__(self, codec_or_spec, reducer):
        super().__init__(codec_or_spec, reducer)
        self.buffers = devices.Buffers()  # what its steps send from and receive into, kept across steps
        self.pinned = self.on_device = None  # the same for device tensors: transport/device.py's pools, made on the first such step
        if reducer.vote and codec.parse_spec(self.spec)[0][0] not in SIGN_CODECS:
            raise vote_error(self.spec)

    def prepare(self, arrays, keys):
        if self.reducer.vote and any(on_device(a) for a in arrays):
            raise CodecTypeError("tensors: the majority vote (vote=True) takes host arrays; device tensors are summed (vote=False)")
        return super().prepare(arrays, keys)

    def _pools(self, device: bool):
        """``(where this rank's frame is written, where the frames travel)``: host buffers for
        host tensors; for device tensors a device buffer, travelling as it is when MPI is
        CUDA-aware, else through pinned host buffers (transport/device.py)."""
        if not device:
            return self.buffers, self.buffers
        if self.on_device is None:
            self.on_device = devices.OnDevice()
            self.pinned = self.on_device if devices.cuda_aware(self.reducer.comm) else devices.Pinned()
        return self.on_device, self.pinned

    def start(self, prepared, stats):
        arrays, keys = prepared
        comm = self.reducer.comm
        pool, wire_pool = self._pools(bool(arrays) and on_device(arrays[0]))
        held = []  # the step's buffers (its frame, the ranks' frames), handed back when it finishes
        sent = []  # and those of wire_pool, when it is another
        try:
            frame = self.encode(arrays, keys, out=pool.holder(held))
            failed = None
        except Exception as e:  # told to every rank through the sizes, so none is left waiting
            frame, failed = b"", e
        own = None  # this rank's device frame, read from the device when it is staged
        if not on_device(frame):
            msg = np.frombuffer(frame, np.uint8)
        elif wire_pool is pool:
            msg = frame
        else:  # staged: copied down once into a pinned buffer
            sent.append(wire_pool.take(frame.size))
            own, msg = frame, sent[-1][: frame.size]
            if frame.size:
                frame.copy_to_host(msg)
        t = time.perf_counter()
        sizes = np.empty(self.reducer.size, np.int64)
        comm.Allgather(np.array([-1 if failed else msg.size], np.int64), sizes)
        if (sizes < 0).any():  # an encode failure the checks before the step did not foresee
            pool.give(held)  # the step ends here: nothing refers to its buffers
            raise_failed(comm, failed, "encoding its tensors")
        displs = offsets(sizes[:-1])
        total = int(sizes.sum())
        sent.append(wire_pool.take(total))
        recv = sent[-1][:total]
        req = comm.Iallgatherv(msg, [recv, (sizes.tolist(), displs.tolist())])
        stats.communicate_s += time.perf_counter() - t
        stats.bytes_sent = int(msg.size)
        stats.bytes_received = total - int(msg.size)
        wire = self.wire(frame if own is None else msg)  # while the frames travel (a staged frame's header read from its host copy)
        gives = [(pool, held)] if wire_pool is pool else [(pool, held), (wire_pool, sent)]
        if wire_pool is pool:
            held += sent
        return _AllgatherPending(self, arrays, recv, sizes, displs, req, wire, gives, own)


def _header(frame):
    """The v2 header of this rank's ``frame`` (host bytes, or a device frame's first bytes
    copied, more while it reaches past them)."""
    if not on_device(frame):
        return read_header(memoryview(frame))
    from codec import devframe

    return devframe.head_read(frame, read_header)[0]


class _AllgatherPending:
    """``gives``: ``(pool, buffers)`` to hand back when the step ends; ``own``: this rank's
    device frame, read in place of its copy in ``recv`` (None: read every frame from ``recv``)."""

    def __init__(self, scheme, arrays, recv, sizes, displs, req, wire, gives, own=None):
        self.scheme, self.arrays, self.recv, self.sizes, self.displs, self.req = scheme, arrays, recv, sizes, displs, req
        self.wire, self.gives, self.own = wire, gives, own

    def test(self):
        return self.req.Test()

    def finish(self, stats, out):
        try:
            return self._finish(stats, out)
        finally:  # decoded or failed: the frames are no longer read
            for pool, bufs in self.gives:
                pool.give(bufs)
            self.recv, self.gives, self.own = None, [], None

    def _finish(self, stats, out):
        self.req.Wait()
        t = time.perf_counter()
        red = self.scheme.reducer
        c = self.scheme.codec
        lay = codec.Layout.of(self.arrays)  # what the frames' hash stands for (the names are the config check's)
        frames = [self.recv[d : d + s] for d, s in zip(self.displs.tolist(), self.sizes.tolist())]
        if self.own is not None:
            frames[red.rank] = self.own
        if self.arrays and on_device(self.arrays[0]):
            return self._finish_device(frames, lay, stats, out, t)
        # one accumulator per tensor: the caller's array when it has the accumulator dtype
        accs = []
        for a, o in zip(self.arrays, out):
            wide = wide_dtype(a.dtype)
            if o is not None and o.dtype == wide and not red.vote:
                o.fill(0)
                accs.append(o)
            else:
                accs.append(np.zeros(a.shape, wide))
        touched = [None] * len(self.arrays)
        if c.select is None:
            for r, f in enumerate(frames):
                _from_rank(r, c.decode_add_many, f, accs, layout=lay)
        else:  # each frame read once, as decode_add would; the sum is zero off the positions
            every = [_from_rank(r, c.decode_sparse_many, f, layout=lay) for r, f in enumerate(frames)]
            for i, acc in enumerate(accs):
                for pairs in every:
                    scatter_add(pairs[i][1], pairs[i][0], acc)
                touched[i] = _union([pairs[i][0] for pairs in every])
        res = []
        for a, acc, o, tch in zip(self.arrays, accs, out, touched):
            if red.vote:
                v = np.sign(acc).astype(a.dtype)
                res.append(v if o is None else _put(o, v))
            else:
                res.append(finish_sum(acc, a.dtype, red.size, red.average, tch, out=o))
        stats.decode_s = time.perf_counter() - t
        return res


    def _finish_device(self, frames, lay, stats, out, t):
        """Every rank's frame added in rank order into device accumulators (the caller's
        array when it has the accumulator dtype), the sum finished on the device: the host's
        bits (a sparse frame's values are added at its positions, in rank order, as the
        host's scatter-add does)."""
        red, c = self.scheme.reducer, self.scheme.codec
        accs = []
        for a, o in zip(self.arrays, out):
            wide = wide_dtype(a.dtype)
            if o is not None and np.dtype(o.dtype) == wide:
                accs.append(clear(o))
            else:
                accs.append(clear(empty(a.shape, wide)))
        for r, f in enumerate(frames):
            _from_rank(r, c.decode_add_many, f, accs, layout=lay)
        res = [devices.finish_on_device(acc, a.dtype, red.size, red.average, out=o) for a, acc, o in zip(self.arrays, accs, out)]
        stats.decode_s = time.perf_counter() - t
        return res


def _union(positions) -> np.ndarray:
    """The sorted union of sorted position arrays: a sort and a neighbour test (``np.unique``
    of NumPy 2 hashes first, measured 30x slower on 80,000 positions)."""
    s = np.sort(np.concatenate(positions))
    return s[np.concatenate(([True], s[1:] != s[:-1]))] if s.size else s


def _from_rank(rank: int, fn, *args, **kwargs):
    """``fn(*args)`` on rank ``rank``'s frame; a damaged frame's error names the rank."""
    try:
        return fn(*args, **kwargs)
    except codec.CorruptFrameError as e:
        raise codec.CorruptFrameError(f"frame from rank {rank}: {e}") from None


def _put(out: np.ndarray, values: np.ndarray) -> np.ndarray:
    out[...] = values
    return out
