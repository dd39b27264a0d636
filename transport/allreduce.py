"""``Allreducer``: a compressed allreduce of many tensors per step over an MPI communicator.

    reducer = Allreducer("topk(ratio=0.001)+fp16", comm)       # every rank, same arguments
    grads = reducer.reduce({"w": gw, "b": gb})                  # identical on every rank

One step (the allgather scheme, any codec):

    check   Allgather int64      a hash of the step: same codec, options, names, shapes, dtypes
    encode  ONE many-tensor frame per rank holding every tensor (through ErrorFeedback)
    sizes   Allgather int64      every rank's frame length
    frames  Allgatherv bytes     every rank's frame, no padding
    decode  every rank's frame, in rank order, added into one accumulator per tensor (the
            caller's array with ``reduce(tensors, out=...)``); average divides once at the end

so every rank computes the same bits.  Three specs take another route (the scheme):
``none`` is MPI Allreduce of the dense arrays (the baseline); ``gtopk(...)`` is the gTop-k
tree; ``powersgd(...)`` is the two-round PowerSGD.  The schemes live in transport/schemes/,
one module each, and ``transport.schemes.SCHEMES`` is the one table from spec head to scheme;
this module holds what every scheme shares: the arguments, the config check, the handles and
the stats; transport/layout.py the structure of the input (dict or list, buckets, device arrays).
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from codec import threads
from codec.errors import CodecTypeError, CodecValueError
from transport.layout import Layout
from transport.errors import NO_DESC, OK, MismatchError, raise_failed, status_of
from transport.schemes import scheme_for
from transport.schemes.base import mpi
from transport.torchdist import is_process_group

__all__ = ["Allreducer", "Handle", "Stats"]

#: the default of a deprecated argument (None is a value a caller may pass, and is refused)
_UNSET = object()


@dataclass
class Stats:
    """What one call moved and where its time went (``Allreducer.stats``).

    ``bytes_sent``: the bytes this rank contributed to the collectives of the step (its
    message; for ``none`` the dense buffer; for gTop-k the sum over tree rounds; for PowerSGD
    P and Q).  ``bytes_received``: the bytes it had to receive (other ranks' messages, or the
    reduced buffer).  ``tensors``: per name, ``{"dense_bytes", "wire_bytes", "ratio"}`` with
    ``ratio = dense_bytes / wire_bytes`` (this rank's frame, headers included).  Times in
    seconds: ``encode_s`` (residual, selection, quantization, packing), ``communicate_s``
    (the collectives, including waiting for peers), ``decode_s`` (decoding and summing)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    encode_s: float = 0.0
    communicate_s: float = 0.0
    decode_s: float = 0.0
    tensors: dict = field(default_factory=dict)

    def add(self, other: "Stats") -> None:
        """Accumulate another call's numbers (tensors are replaced by the latest call's)."""
        for name in ("bytes_sent", "bytes_received", "encode_s", "communicate_s", "decode_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.tensors = other.tensors


class Handle:
    """A step in flight (from :meth:`Allreducer.ireduce`); ``wait()`` returns its result.

    ``wait()`` may be called more than once (the result is kept); it must be called on every
    rank, in the order the steps were started."""

    def __init__(self, reducer, pending, layout, stats):
        self._reducer, self._pending, self._layout = reducer, pending, layout
        self._stats = stats
        self._result = self._error = None

    def test(self) -> bool:
        """True when the communication of the first round has completed (never blocks)."""
        return self._result is not None or self._error is not None or self._pending.test()

    def wait(self):
        if self._error is not None:  # the step failed: its collectives are not run again
            raise self._error
        if self._result is None:
            t = time.perf_counter()
            try:
                arrays = self._pending.finish(self._stats, self._layout.targets)
            except BaseException as e:
                self._error, self._pending = e, None
                raise
            self._stats.communicate_s += time.perf_counter() - t - self._stats.decode_s
            self._result = self._layout.rebuild(arrays)
            self._reducer._record(self._stats)
            self._pending = None
        return self._result


class Allreducer:
    """Compressed allreduce of a dict (name -> array) or a list of arrays, over ``comm``.

    ``codec_or_spec``: a spec string, config dict or ``codec.Codec``; ``"none"`` runs MPI
    Allreduce, ``"gtopk(ratio=...)"`` the gTop-k tree, ``"powersgd(...)"`` the two-round
    PowerSGD; anything else the allgather scheme.  ``comm``: an mpi4py communicator (default
    ``COMM_WORLD``), or a ``torch.distributed`` process group (gloo: CPU tensors; through
    :class:`transport.torchdist.TorchComm`, which a caller may also pass itself).  ``average``: divide the sum by the number of ranks, once, at the end.
    ``error_feedback``: keep per-tensor residuals (``ErrorFeedback``) so what a frame drops is
    sent later.  ``vote``: for sign codecs, the result is the sign of the sum of signs
    (signSGD with majority vote: -1, 0 or +1; ``average`` does not apply).
    ``rank_streams``: stochastic stages draw from a stream keyed by (name, rank), so ranks
    round independently (default); False gives every rank the same stream (random-k then picks
    the same positions everywhere).  ``bucket_bytes`` (default 0: one frame per tensor):
    consecutive tensors of one dtype are fused into flat buckets of up to that many bytes,
    each coded as one tensor (fewer, larger frames: less per-frame overhead; a sparsifier then
    selects over the bucket, as DDP's bucket hooks do).  Device arrays
    (``__cuda_array_interface__``: CuPy, torch CUDA tensors, Numba) are coded on the device
    and only their frames cross to the host (transport/device.py; docs/transport.md, "Device
    arrays"); the results are device arrays.  ``cuda_aware`` is deprecated and does nothing
    (a DeprecationWarning; it goes in the next release): whether the MPI library takes
    device buffers is asked of the library.  ``checksum`` (default False): frames
    carry the codec's payload CRC-32C; MPI already guarantees the integrity of what it
    delivers, so the transport leaves it out (a ``crc32`` stage in the spec still adds its own).
    ``momentum`` (default 0): Deep Gradient Compression's momentum correction with
    momentum-factor masking, ``ErrorFeedback(momentum=)`` on every rank (the allgather of
    frames with error feedback only; the optimizer then runs without momentum of its own).
    Every rank must construct its Allreducer with the same arguments.
    """

    def __init__(
        self,
        codec_or_spec="none",
        comm=None,
        *,
        average: bool = True,
        error_feedback: bool = True,
        vote: bool = False,
        rank_streams: bool = True,
        cuda_aware=_UNSET,
        bucket_bytes: int = 0,
        checksum: bool = False,
        momentum: float = 0.0,
    ):
        flags = (("average", average), ("error_feedback", error_feedback), ("vote", vote), ("rank_streams", rank_streams), ("cuda_aware", cuda_aware), ("checksum", checksum))
        for name, v in flags:
            if not isinstance(v, (bool, np.bool_)) and v is not _UNSET:
                raise CodecTypeError(f"{name}: expected True or False, got {v!r}")
        if cuda_aware is not _UNSET:
            warnings.warn(
                "Allreducer(cuda_aware=...) is deprecated and does nothing: whether MPI takes device buffers is asked of the library; "
                "it will be removed in the next release",
                DeprecationWarning,
                stacklevel=2,
            )
        if comm is not None and is_process_group(comm):  # a torch.distributed group: through the adapter
            from transport.torchdist import TorchComm

            comm = TorchComm(comm)
        self.comm = mpi().COMM_WORLD if comm is None else comm
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.average, self.error_feedback, self.vote = bool(average), bool(error_feedback), bool(vote)
        self.rank_streams = bool(rank_streams)
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, (int, np.integer)) or bucket_bytes < 0:
            raise CodecValueError(f"bucket_bytes: expected an integer >= 0 (0: one frame per tensor), got {bucket_bytes!r}")
        self.bucket_bytes = int(bucket_bytes)
        self.checksum = bool(checksum)
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float, np.floating)) or not 0.0 <= momentum < 1.0:
            raise CodecValueError(f"momentum: expected a number in [0, 1) (DGC's momentum correction; 0: none), got {momentum!r}")
        self.momentum = float(momentum)
        #: how a step moves: transport.schemes.SCHEMES[head of the spec], or the allgather
        self.scheme = scheme_for(codec_or_spec, self)
        if self.momentum and not (self.scheme.takes_momentum and self.error_feedback):
            raise CodecValueError(
                f"momentum: DGC's momentum correction runs in the error feedback of the allgather of frames; {self.scheme.spec!r} "
                f"{'runs another scheme' if not self.scheme.takes_momentum else 'has error_feedback=False'} (leave momentum=0 and use the optimizer's momentum)"
            )
        #: the last call's numbers; ``totals`` sums every call's
        self.stats = Stats()
        self.totals = Stats()
        self.calls = 0
        self._placed = False  # reported this node's rank count to the thread budget

    @property
    def spec(self) -> str:
        return self.scheme.spec

    # ------------------------------------------------------------------ steps
    def reduce(self, tensors, out=None):
        """The reduced tensors: same structure (dict or list), shapes and dtypes as the input,
        bit-identical on every rank.  Collective: every rank calls it with the same names,
        shapes and dtypes, in the same order.

        ``out``: the arrays to write the result into, with the structure, shapes and dtypes
        of ``tensors`` (writeable, C-contiguous: host NumPy arrays for host tensors, device
        arrays for device tensors), e.g. the gradients
        themselves (``reduce(grads, out=grads)``): no result is allocated, and ``out`` is
        returned.  An input may be its own output: no scheme reads an input after
        ``ireduce`` returns.  If a step fails after its first collective, ``out`` may hold
        part of a result."""
        return self.ireduce(tensors, out).wait()

    def ireduce(self, tensors, out=None) -> Handle:
        """Start a step and return its :class:`Handle`; the frames are encoded and the
        communication posted (nonblocking), so computation can overlap it until ``wait()``.
        ``out`` as for :meth:`reduce`: the caller leaves those arrays alone until ``wait()``.

        Everything that can fail on one rank only (argument types, dtypes, a non-finite
        input the codec cannot send) is checked before the step's first collective, which
        carries every rank's status: if any rank failed, every rank raises the same
        :class:`RankError` and no rank's state (residuals, steps, warm-start Q) changes."""
        if not self._placed:  # the first step is collective: count the ranks sharing this node
            self._placed = True
            threads.set_local_ranks(node_ranks(self.comm))
        t0 = time.perf_counter()
        stats = Stats()
        layout = desc = prepared = failed = None
        try:
            layout = Layout(tensors, self.bucket_bytes, self.scheme.devices)
            layout.set_out(out)
            desc = self.describe(layout)
            prepared = self.scheme.prepare(layout.sent, layout.sent_keys)
        except Exception as e:  # told to every rank in the check, so none is left waiting
            failed = e
        self._check(desc, failed, stats)
        pending = self.scheme.start(prepared, stats)
        t1 = time.perf_counter()
        stats.encode_s = t1 - t0 - stats.communicate_s
        stats.tensors = {
            str(k): {"dense_bytes": a.nbytes, "wire_bytes": w, "ratio": (a.nbytes / w if w else float("inf"))}
            for k, a, w in zip(layout.sent_keys, layout.sent, pending.wire)
        }
        return Handle(self, pending, layout, stats)

    def _record(self, stats: Stats) -> None:
        self.stats = stats
        self.totals.add(stats)
        self.calls += 1

    # ------------------------------------------------------------------ config check
    def describe(self, layout) -> dict:
        """What every rank must agree on for a step (compared by hash before each step)."""
        return {
            "scheme": self.scheme.spec,
            "options": [self.average, self.error_feedback, self.vote, self.rank_streams, self.bucket_bytes, self.momentum],
            "ranks": self.size,
            "tensors": [[str(k), list(a.shape), a.dtype.name] for k, a in zip(layout.keys, layout.arrays)],
            "structure": layout.kind,
        }

    def _check(self, desc, failed, stats) -> None:
        """The step's first collective: one Allgather of (status, hash of ``desc``) per rank.

        If a rank failed before it could describe its step, or failed in ``prepare`` while
        every rank describes the same step, every rank raises the same :class:`RankError`;
        if the descriptions differ, every rank gathers them and raises the same
        MismatchError (a failure is then most likely a consequence of the mismatch)."""
        if failed is None:
            status = OK
        else:
            status = status_of(failed) | (NO_DESC if desc is None else 0)
        sig = 0
        if desc is not None:
            text = json.dumps(desc, sort_keys=True)
            sig = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)
        every = np.empty((self.size, 2), np.int64)
        t = time.perf_counter()
        self.comm.Allgather(np.array([status, sig], np.int64), every)
        stats.communicate_s += time.perf_counter() - t
        statuses, sigs = every[:, 0].tolist(), every[:, 1]
        if any(s & NO_DESC for s in statuses):
            raise_failed(self.comm, failed, "checking its arguments")
        if not np.all(sigs == sigs[0]):
            descs = self.comm.allgather(desc)
            raise MismatchError(_mismatch_message(descs)) from failed
        if any(statuses):
            raise_failed(self.comm, failed, "checking its input")

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        """This rank's per-tensor memory, one shape for every scheme (pickle-able, no
        communicator): ``{"scheme": spec, "rank": r, "size": p, "feedback": f}`` where ``f`` is
        the scheme's ``codec.ErrorFeedback.state_dict()`` (residuals when error feedback is on,
        steps, PowerSGD's warm-start Q), or None for ``none``, which keeps no memory."""
        ef = self.scheme.ef
        return {"scheme": self.scheme.spec, "rank": self.rank, "size": self.size, "feedback": None if ef is None else ef.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output, saved by this rank of a same-sized job with the
        same scheme and options.  The state is untrusted: it is checked whole before anything
        is replaced (``feedback`` by ``ErrorFeedback.load_state_dict``, which keeps the old
        memory on error); a ValueError names the field, and on error the reducer keeps its state."""
        if not isinstance(state, dict):
            raise CodecValueError(f"state: expected the dict Allreducer.state_dict() returns, got {type(state).__name__}")
        if set(state) != {"scheme", "rank", "size", "feedback"}:
            raise CodecValueError(f"state: expected the keys scheme, rank, size and feedback, got {sorted(map(str, state))}")
        if state["scheme"] != self.scheme.spec:
            raise CodecValueError(f"state: saved for {state['scheme']!r:.80}, this Allreducer runs {self.scheme.spec!r}")
        if (state["rank"], state["size"]) != (self.rank, self.size):
            raise CodecValueError(
                f"state: saved by rank {state['rank']!r:.20} of {state['size']!r:.20}, this is rank {self.rank} of {self.size}; "
                "residuals belong to the rank that made them"
            )
        ef, feedback = self.scheme.ef, state["feedback"]
        if ef is None:
            if feedback is not None:
                raise CodecValueError(f"state: feedback: {self.scheme.spec!r} keeps no per-tensor memory, so the state holds None, got {type(feedback).__name__}")
            return
        if feedback is None:
            raise CodecValueError(f"state: feedback: None, but {self.scheme.spec!r} keeps per-tensor memory (an ErrorFeedback state)")
        ef.load_state_dict(feedback)

    def __repr__(self):
        return f"Allreducer({self.scheme.spec!r}, rank {self.rank} of {self.size}, average={self.average}, error_feedback={self.error_feedback})"


def _mismatch_message(descs) -> str:
    base = descs[0]
    for r, d in enumerate(descs[1:], 1):
        if d == base:
            continue
        for what in ("scheme", "options", "ranks", "structure"):
            if d[what] != base[what]:
                return f"ranks disagree: rank 0 has {what} {base[what]!r}, rank {r} has {d[what]!r}; every rank must build the same Allreducer"
        a, b = base["tensors"], d["tensors"]
        if len(a) != len(b):
            return f"ranks disagree: rank 0 reduces {len(a)} tensors, rank {r} reduces {len(b)}; every rank must pass the same tensors"
        for ta, tb in zip(a, b):
            if ta != tb:
                return f"ranks disagree: rank 0 has tensor {ta[0]!r} as {ta[2]}{ta[1]}, rank {r} has {tb[0]!r} as {tb[2]}{tb[1]}"
    return "ranks disagree on the step's configuration"


def node_ranks(comm) -> int:
    """How many ranks of ``comm`` share this rank's node (a shared-memory split: collective),
    for the thread budget (codec/threads.py); the launcher's variables count the rest."""
    node = comm.Split_type(mpi(comm).COMM_TYPE_SHARED)
    try:
        return node.Get_size()
    finally:
        node.Free()
