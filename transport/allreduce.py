"""``Allreducer``: a compressed allreduce of many tensors per step over an MPI communicator.

    reducer = Allreducer("topk(ratio=0.001)+fp16", comm)       # every rank, same arguments
    grads = reducer.reduce({"w": gw, "b": gb})                  # identical on every rank

One step (the allgather scheme, any codec):

    check   Allgather int64      a hash of the step: same codec, options, names, shapes, dtypes
    encode  one frame per tensor (through ErrorFeedback), packed into ONE message (message.py)
    sizes   Allgather int64      every rank's message length
    frames  Allgatherv bytes     every rank's message, no padding
    decode  decode_add of every rank's frame, in rank order, into one accumulator per tensor;
            average divides once at the end

so every rank computes the same bits.  Three specs take another route (the scheme):
``none`` is MPI Allreduce of the dense arrays (the baseline); ``gtopk(...)`` is the gTop-k
tree (transport.gtopk); ``powersgd(...)`` is the two-round PowerSGD (transport.powersgd).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field

import numpy as np

import codec
from codec import CodecError
from codec.dtypes import as_float_array
from codec.modes import ADD
from codec.stage import check_step
from codec.ops import first_nonfinite, scatter, wide_dtype
from codec.spec import parse as parse_spec
from transport import message, staging

__all__ = ["Allreducer", "Handle", "Stats", "MismatchError", "RankError", "RankTypeError"]

#: codecs whose reduction may be a majority vote (sign of the sum of signs)
SIGN_CODECS = ("sign", "efsign", "onebit")


class MismatchError(CodecError, ValueError):
    """Ranks called a collective step with different codecs, options or tensors."""


class RankError(CodecError, ValueError):
    """A step failed on one or more ranks (a non-finite input the codec cannot send, a bad
    argument): EVERY rank raises it, with the same message, naming the failing ranks and their
    reasons.  ``ranks``: the failing ranks; ``reasons``: rank -> ``"Type: message"``.  On the
    failing rank it is chained (``__cause__``) to the rank's own exception."""

    def __init__(self, message: str, ranks=(), reasons=None):
        super().__init__(message)
        self.ranks = list(ranks)
        self.reasons = dict(reasons or {})


class RankTypeError(RankError, TypeError):
    """:class:`RankError` whose first failing rank raised a TypeError (an unsupported dtype, an
    argument of the wrong type)."""


#: per-rank status carried by the step's first collective (docs/transport.md, "Errors and failures")
OK, FAIL_TYPE, FAIL_VALUE, FAIL_OTHER = 0, 1, 2, 3
#: or'ed into the status when the rank failed before it could describe its step
NO_DESC = 4
#: a reason longer than this is cut (it travels to every rank)
REASON_CHARS = 600


def status_of(exc: BaseException) -> int:
    """The reason code of an exception: FAIL_TYPE, FAIL_VALUE or FAIL_OTHER."""
    return FAIL_TYPE if isinstance(exc, TypeError) else FAIL_VALUE if isinstance(exc, ValueError) else FAIL_OTHER


def raise_failed(comm, mine, when: str):
    """Every rank: gather every rank's (status, reason) (``comm.allgather``) and raise the same
    :class:`RankError` (``RankTypeError`` when the first failing rank's error was a TypeError).
    ``mine``: this rank's exception, or None.  Call it on every rank of ``comm``, once every
    rank knows that some rank failed."""
    reason = None
    if mine is not None:
        reason = f"{type(mine).__name__}: {mine}"
        if len(reason) > REASON_CHARS:
            reason = reason[: REASON_CHARS - 3] + "..."
    every = comm.allgather((OK if mine is None else status_of(mine), reason))
    bad = [r for r, (s, _) in enumerate(every) if s]
    if not bad:  # cannot happen: a caller saw a failure
        raise RankError(f"a rank reported a failure {when} but none gave a reason")
    head = f"rank {bad[0]}" if len(bad) == 1 else f"ranks {', '.join(map(str, bad))}"
    detail = "; ".join(f"rank {r}: {every[r][1]}" for r in bad)
    msg = f"{head} of {len(every)} failed {when}, so every rank raises this: {detail}"
    cls = RankTypeError if every[bad[0]][0] == FAIL_TYPE else RankError
    raise cls(msg, bad, {r: every[r][1] for r in bad}) from mine


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
                arrays = self._pending.finish(self._stats)
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
    ``COMM_WORLD``).  ``average``: divide the sum by the number of ranks, once, at the end.
    ``error_feedback``: keep per-tensor residuals (``ErrorFeedback``) so what a frame drops is
    sent later.  ``vote``: for sign codecs, the result is the sign of the sum of signs
    (signSGD with majority vote: -1, 0 or +1; ``average`` does not apply).
    ``rank_streams``: stochastic stages draw from a stream keyed by (name, rank), so ranks
    round independently (default); False gives every rank the same stream (random-k then picks
    the same positions everywhere).  ``bucket_bytes`` (default 0: one frame per tensor):
    consecutive tensors of one dtype are fused into flat buckets of up to that many bytes,
    each coded as one tensor (fewer, larger frames: less per-frame overhead; a sparsifier then
    selects over the bucket, as DDP's bucket hooks do).  ``cuda_aware``: the MPI accepts device buffers
    (``__cuda_array_interface__``); only the dense ``none`` scheme uses them today, every other
    path stages device arrays through host memory.  ``checksum`` (default False): frames
    carry the codec's payload CRC-32C; MPI already guarantees the integrity of what it
    delivers, so the transport leaves it out (a ``crc32`` stage in the spec still adds its own).
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
        cuda_aware: bool = False,
        bucket_bytes: int = 0,
        checksum: bool = False,
    ):
        for name, v in (("average", average), ("error_feedback", error_feedback), ("vote", vote), ("rank_streams", rank_streams), ("cuda_aware", cuda_aware), ("checksum", checksum)):
            if not isinstance(v, (bool, np.bool_)):
                raise TypeError(f"{name}: expected True or False, got {v!r}")
        if comm is None:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.average, self.error_feedback, self.vote = bool(average), bool(error_feedback), bool(vote)
        self.rank_streams, self.cuda_aware = bool(rank_streams), bool(cuda_aware)
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, (int, np.integer)) or bucket_bytes < 0:
            raise ValueError(f"bucket_bytes: expected an integer >= 0 (0: one frame per tensor), got {bucket_bytes!r}")
        self.bucket_bytes = int(bucket_bytes)
        self.checksum = bool(checksum)
        self.scheme = _scheme(codec_or_spec, self)
        if self.vote and self.scheme.codec.codec_id.split("+")[0] not in SIGN_CODECS:
            raise ValueError(f"vote: majority vote needs a sign codec ({', '.join(SIGN_CODECS)}), not {self.scheme.spec!r}")
        #: the last call's numbers; ``totals`` sums every call's
        self.stats = Stats()
        self.totals = Stats()
        self.calls = 0

    @property
    def spec(self) -> str:
        return self.scheme.spec

    # ------------------------------------------------------------------ steps
    def reduce(self, tensors):
        """The reduced tensors: same structure (dict or list), shapes and dtypes as the input,
        bit-identical on every rank.  Collective: every rank calls it with the same names,
        shapes and dtypes, in the same order."""
        return self.ireduce(tensors).wait()

    def ireduce(self, tensors) -> Handle:
        """Start a step and return its :class:`Handle`; the frames are encoded and the
        communication posted (nonblocking), so computation can overlap it until ``wait()``.

        Everything that can fail on one rank only (argument types, dtypes, a non-finite
        input the codec cannot send) is checked before the step's first collective, which
        carries every rank's status: if any rank failed, every rank raises the same
        :class:`RankError` and no rank's state (residuals, steps, warm-start Q) changes."""
        t0 = time.perf_counter()
        stats = Stats()
        layout = desc = prepared = failed = None
        try:
            layout = _Layout(tensors, self.bucket_bytes)
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
            "options": [self.average, self.error_feedback, self.vote, self.rank_streams, self.bucket_bytes],
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
        """Residuals and warm-start state (pickle-able, no communicator)."""
        return {"scheme": self.scheme.spec, "rank": self.rank, "size": self.size, "state": self.scheme.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output, saved by this rank of a same-sized job with the
        same scheme.  The state is checked whole before anything is replaced (a ValueError
        names the field); on error the reducer keeps its state."""
        if isinstance(state, dict) and set(state) != {"scheme", "rank", "size", "state"}:
            raise ValueError(f"state: expected the keys scheme, rank, size and state, got {sorted(map(str, state))}")
        if not isinstance(state, dict) or state.get("scheme") != self.scheme.spec:
            raise ValueError(f"state: saved for {state.get('scheme') if isinstance(state, dict) else state!r}, this Allreducer runs {self.scheme.spec!r}")
        if (state.get("rank"), state.get("size")) != (self.rank, self.size):
            raise ValueError(
                f"state: saved by rank {state.get('rank')} of {state.get('size')}, this is rank {self.rank} of {self.size}; "
                "residuals belong to the rank that made them"
            )
        self.scheme.load_state_dict(state["state"])

    def __repr__(self):
        return f"Allreducer({self.scheme.spec!r}, rank {self.rank} of {self.size}, average={self.average}, error_feedback={self.error_feedback})"


# ---------------------------------------------------------------------- structure
class _Layout:
    """A dict or list of tensors as (keys, host arrays) and back; with ``bucket_bytes``, the
    tensors are sent as buckets (``sent``, ``sent_keys``): runs of consecutive tensors of one
    dtype concatenated flat up to that many bytes (a larger tensor is a bucket of its own,
    unchanged).  A bucket of several tensors is keyed ``"first..last"`` by its tensors' names."""

    def __init__(self, tensors, bucket_bytes: int = 0):
        if isinstance(tensors, dict):
            self.kind, self.keys = "dict", list(tensors)
            items = list(tensors.values())
        elif isinstance(tensors, (list, tuple)):
            self.kind, self.keys = type(tensors).__name__, list(range(len(tensors)))
            items = list(tensors)
        else:
            raise TypeError(f"tensors: expected a dict of name -> array or a list of arrays, got {type(tensors).__name__}")
        self.devices = [staging.is_device(x) for x in items]
        self.arrays = [_plain(as_float_array(staging.to_host(x) if d else x, argname=f"tensors[{k!r}]")) for k, x, d in zip(self.keys, items, self.devices)]
        self.groups = _buckets(self.arrays, bucket_bytes) if bucket_bytes else [[i] for i in range(len(self.arrays))]
        self.sent, self.sent_keys = [], []
        for g in self.groups:
            if len(g) == 1:
                self.sent.append(self.arrays[g[0]])
                self.sent_keys.append(self.keys[g[0]])
            else:
                self.sent.append(np.concatenate([self.arrays[i].reshape(-1) for i in g]))
                self.sent_keys.append(f"{self.keys[g[0]]}..{self.keys[g[-1]]}")

    def rebuild(self, sent):
        arrays = [None] * len(self.arrays)
        for g, r in zip(self.groups, sent):
            at = 0
            for i in g:  # views of the bucket's result
                a = self.arrays[i]
                arrays[i] = r if len(g) == 1 else r[at : at + a.size].reshape(a.shape)
                at += a.size
        arrays = [staging.to_device(a) if d else a for a, d in zip(arrays, self.devices)]
        if self.kind == "dict":
            return dict(zip(self.keys, arrays))
        return arrays if self.kind == "list" else tuple(arrays)


def _plain(a: np.ndarray) -> np.ndarray:
    """A base-class, C-contiguous ndarray (an ``np.matrix`` or other subclass is viewed as one)."""
    if type(a) is not np.ndarray:
        a = a.view(np.ndarray)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _buckets(arrays, cap: int) -> list[list[int]]:
    """Indices of ``arrays`` grouped into runs of one dtype of at most ``cap`` bytes."""
    groups, size = [], 0
    for i, a in enumerate(arrays):
        if groups and a.dtype == arrays[groups[-1][-1]].dtype and size + a.nbytes <= cap:
            groups[-1].append(i)
            size += a.nbytes
        else:
            groups.append([i])
            size = a.nbytes
    return groups


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


# ---------------------------------------------------------------------- schemes
def finish_sum(acc: np.ndarray, dtype, size: int, average: bool, touched=None) -> np.ndarray:
    """``acc / size`` when averaging (one division), rounded once to ``dtype``.

    ``touched``: sorted unique flat positions outside which ``acc`` is known to be zero (a
    sparse sum); only those are divided and rounded, so the untouched pages of a fresh
    ``np.zeros`` are never written.  The result is the same bits either way."""
    from codec.ops import round_to

    if touched is not None:
        flat = acc.reshape(-1)
        part = finish_sum(flat[touched], dtype, size, average)
        if acc.dtype == dtype:
            flat[touched] = part
            return acc
        out = np.zeros(acc.shape, dtype)
        out.reshape(-1)[touched] = part
        return out
    if average and size > 1:
        np.divide(acc, acc.dtype.type(size), out=acc)
    return acc if acc.dtype == dtype else round_to(acc, dtype)


def _scheme(codec_or_spec, reducer):
    if isinstance(codec_or_spec, str):
        head = parse_spec(codec_or_spec)[0][0]
        if head == "gtopk":
            from transport.gtopk import GTopK

            return GTopK(codec_or_spec, reducer)
    c = codec.get_codec(codec_or_spec, checksum=reducer.checksum)
    if c.codec_id == "none":
        return Dense(c, reducer)
    if c.codec_id.split("+")[0] == "powersgd":
        from transport.powersgd import TwoRound

        return TwoRound(c, reducer)
    return Allgather(c, reducer)


class Scheme:
    """How a step moves.  ``prepare(arrays, keys)`` does every check and every piece of local
    work that can fail on one rank only, and changes no state; it runs before the step's
    first collective (the config check, which carries its success or failure to every rank).
    ``start(prepared, stats)`` then encodes and posts the first communication, returning a
    pending step whose ``finish(stats)`` completes it and returns the reduced arrays (the
    inputs' dtypes and shapes)."""

    def __init__(self, c, reducer):
        self.codec, self.reducer = c, reducer
        self.spec = c.spec

    def prepare(self, arrays, keys):
        return arrays, keys

    def state_dict(self):
        return None

    def load_state_dict(self, state):
        pass


def check_finite(a: np.ndarray, name, spec: str) -> None:
    """ValueError naming the tensor and the position of its first NaN or inf."""
    bad = first_nonfinite(a)
    if bad >= 0:
        at = tuple(int(i) for i in np.unravel_index(bad, a.shape)) if a.ndim > 1 else bad
        raise ValueError(f"tensors[{name!r}]: non-finite value ({a.reshape(-1)[bad]}) at position {at}; {spec} needs finite input")


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
        from mpi4py import MPI

        self.sizes = [p.size for p in parts]
        self.bufs, self.reqs = {}, []
        for dt, idx in self.groups.items():
            buf = np.concatenate([parts[i].reshape(-1) for i in idx], dtype=dt)
            self.bufs[dt] = buf
            self.reqs.append(self.comm.Iallreduce(MPI.IN_PLACE, buf))
            stats.bytes_sent += buf.nbytes
            stats.bytes_received += buf.nbytes
        return self

    def test(self) -> bool:
        from mpi4py import MPI

        return MPI.Request.Testall(self.reqs)

    def wait(self) -> list[np.ndarray]:
        """The summed parts, flat, in the order they were given (views of the buffers)."""
        from mpi4py import MPI

        MPI.Request.Waitall(self.reqs)
        out = [None] * len(self.sizes)
        for dt, idx in self.groups.items():
            at = 0
            for i in idx:
                out[i] = self.bufs[dt][at : at + self.sizes[i]]
                at += self.sizes[i]
        return out


class Dense(Scheme):
    """``none``: MPI Allreduce (SUM) of the dense arrays (:class:`Sums`)."""

    def start(self, prepared, stats):
        arrays, _ = prepared
        return _DensePending(self, arrays, Sums(self.reducer.comm, arrays).start(arrays, stats))


class _DensePending:
    def __init__(self, scheme, arrays, sums):
        self.scheme, self.arrays, self.sums = scheme, arrays, sums
        self.wire = [a.nbytes for a in arrays]

    def test(self):
        return self.sums.test()

    def finish(self, stats):
        summed = self.sums.wait()
        t = time.perf_counter()
        red = self.scheme.reducer
        # views of the reduced buffers (rounded copies for 16-bit tensors)
        out = [finish_sum(s, a.dtype, red.size, red.average).reshape(a.shape) for a, s in zip(self.arrays, summed)]
        stats.decode_s = time.perf_counter() - t
        return out


class Framed(Scheme):
    """A scheme that codes each tensor into a frame on every rank (through ErrorFeedback
    keyed ``(name, rank)``, or ``name`` without ``rank_streams``) and keeps the state of that."""

    def __init__(self, c, reducer):
        super().__init__(c, reducer)
        self.ef = codec.ErrorFeedback(c) if reducer.error_feedback and not c.lossless else None
        self.step = 0

    def prepare(self, arrays, keys):
        """Checks every input before the first collective, changing nothing: finite where the
        codec needs it, and the shape and dtype of an existing residual."""
        for a, k in zip(arrays, keys):
            if not self.codec.passes_nonfinite(a.shape):  # the codec would raise on NaN/inf
                check_finite(a, k, self.spec)
            if self.ef is not None:
                try:
                    r = self.ef.residual(self.key(k))
                except KeyError:
                    continue
                if r.shape != a.shape or r.dtype != a.dtype:
                    raise ValueError(f"tensors[{k!r}]: was {r.dtype}{list(r.shape)} in an earlier step, now {a.dtype}{list(a.shape)}; its residual does not fit")
        return arrays, keys

    def key(self, name):
        return (name, self.reducer.rank) if self.reducer.rank_streams else name

    def encode(self, arrays, keys):
        """One frame per tensor; advances the step."""
        step, self.step = self.step, self.step + 1
        if self.ef is not None:
            return [self.ef.encode(a, self.key(k)) for a, k in zip(arrays, keys)]
        return [self.codec.encode(a, key=self.key(k), step=step) for a, k in zip(arrays, keys)]

    def state_dict(self):
        return {"step": self.step, "ef": None if self.ef is None else self.ef.state_dict()}

    def load_state_dict(self, state):
        """Checks the whole state first (the step, and the ErrorFeedback's own check, which
        keeps the old state on error), then replaces it."""
        if not isinstance(state, dict) or set(state) != {"step", "ef"}:
            raise ValueError(f"state: state: expected a dict with 'step' and 'ef', got {state!r:.80}")
        step = check_step(state["step"], "state: state: step")
        if (state["ef"] is None) != (self.ef is None):
            raise ValueError(f"state: state: ef: saved {'without' if state['ef'] is None else 'with'} error feedback, this Allreducer runs {'without' if self.ef is None else 'with'} it")
        if self.ef is not None:
            self.ef.load_state_dict(state["ef"])
        self.step = step


class Allgather(Framed):
    """Any codec: one message per rank (message.py), sizes by Allgather, bytes by Allgatherv,
    decode_add of every rank's frames in rank order."""

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
                    scatter(vals, pos, acc, ADD)
                touched = np.unique(np.concatenate([pos for pos, _ in pairs]))
            if red.vote:
                out.append(np.sign(acc).astype(a.dtype))
            else:
                out.append(finish_sum(acc, a.dtype, red.size, red.average, touched))
        stats.decode_s = time.perf_counter() - t
        return out
