"""gTop-k sparse allreduce (Shi et al., ICDCS'19): a tree of pairwise merges instead of an
allgather, so a rank receives ``k`` pairs per round, ``log2(p)`` rounds, whatever ``p`` is.

Per step and tensor, every rank selects its local top-k with error feedback (the codec
``topk(...)`` plus any value stage: ``gtopk(ratio=0.001)+fp16`` sends fp16-rounded values'
selection) and decodes its own frame into ``k`` (position, value) pairs.  Then, for all
tensors at once (one message per round):

    fold     p not a power of two: rank q + P2 (P2 = largest power of two <= p) sends its
             pairs to rank q, which merges them in
    rounds   d = 1, 2, 4, ... < P2: rank q exchanges its pairs with rank q XOR d; both merge
    unfold   rank q sends the final pairs back to rank q + P2

``merge(a, b, k)``: the union of two pair sets, values summed where positions are equal,
then the ``k`` largest magnitudes kept (ties to the lower position).  The sum is commutative
and the selection depends only on the set, so both sides of an exchange compute the same
bits, and after the last round every rank holds the same ``k`` pairs (recursive doubling: the
paper's reduce-to-root plus broadcast, in half the rounds).  The result is those pairs
scattered into zeros (divided by ``p`` when averaging).  Pairs a rank selected whose position
is not in the final set go back into its residual, so they are sent later.

Every tree message starts with an int64 status: 0, or the reason code of a rank that could
not encode (a failure the checks before the step's first collective could not foresee); such
a rank sends the status alone.  The status spreads through the tree exactly as the pairs do,
so after the unfold every rank knows of the failure, and every rank raises the same
``RankError`` instead of waiting for a message that never comes.

Wire, per round: 8 bytes of status, then ``k`` positions (uint32, or int64 for tensors above 2**32 elements) and
``k`` values (float32; float64 for float64 tensors) per tensor.
"""

from __future__ import annotations

import time

import numpy as np

from codec.errors import CodecValueError
import codec
from codec.arrays import wide_dtype
from codec.device import empty
from codec.dtypes import on_device
from codec.modes import SET
from codec.ops import scatter
from transport.errors import raise_failed, status_of
from transport.schemes.allgather import Framed
from transport.schemes.base import finish_sum, mpi

__all__ = ["GTopK", "merge", "schedule"]


def merge(pa, va, pb, vb, k: int):
    """The ``k`` pairs of largest magnitude in the union of two pair sets (positions sorted
    and unique within each set), values summed at equal positions; sorted by position.
    ``merge(a, b) == merge(b, a)`` bit for bit."""
    pos = np.concatenate((pa, pb))
    val = np.concatenate((va, vb))
    order = np.argsort(pos, kind="stable")
    pos, val = pos[order], val[order]
    if pos.size > 1:
        dup = np.flatnonzero(pos[1:] == pos[:-1])  # each position appears at most twice
        val[dup] = val[dup] + val[dup + 1]
        keep = np.ones(pos.size, bool)
        keep[dup + 1] = False
        pos, val = pos[keep], val[keep]
    if pos.size <= k:
        return pos, val
    top = np.lexsort((pos, -np.abs(val)))[:k]  # magnitude descending, then lower position
    top.sort()
    return pos[top], val[top]


def schedule(rank: int, size: int) -> list[tuple[str, int]]:
    """This rank's part of the tree, in order: ``("recv", peer)`` merge a peer's pairs in,
    ``("send", peer)`` hand ours over and wait for the result, ``("exchange", peer)``
    swap and merge, ``("return", peer)`` send the final pairs back."""
    if size <= 1:
        return []
    p2 = 1 << (size.bit_length() - 1)
    if rank >= p2:
        return [("send", rank - p2)]
    steps = [("recv", rank + p2)] if rank + p2 < size else []
    d = 1
    while d < p2:
        steps.append(("exchange", rank ^ d))
        d <<= 1
    if rank + p2 < size:
        steps.append(("return", rank + p2))
    return steps


#: bytes of the status that starts every tree message
HEADER = 8


class _Pairs:
    """The pair sets of every tensor of a step, packed into one byte message (after the
    status) and back."""

    def __init__(self, arrays, ks):
        self.ks = ks
        self.pdt = [np.dtype(np.uint32) if a.size <= (1 << 32) else np.dtype(np.int64) for a in arrays]
        self.vdt = [wide_dtype(a.dtype) for a in arrays]
        self.nbytes = sum(k * (p.itemsize + v.itemsize) for k, p, v in zip(ks, self.pdt, self.vdt))

    def pack(self, sets) -> np.ndarray:
        msg = np.empty(HEADER + self.nbytes, np.uint8)
        msg[:HEADER] = 0
        at = HEADER
        for (pos, val), pdt, vdt in zip(sets, self.pdt, self.vdt):
            for arr, dt in ((pos, pdt), (val, vdt)):
                b = np.ascontiguousarray(arr, dt).view(np.uint8)
                msg[at : at + b.size] = b
                at += b.size
        return msg

    def unpack(self, msg):
        sets, at = [], HEADER
        for k, pdt, vdt in zip(self.ks, self.pdt, self.vdt):
            pos = msg[at : at + k * pdt.itemsize].view(pdt).astype(np.int64)
            at += k * pdt.itemsize
            val = msg[at : at + k * vdt.itemsize].view(vdt)  # a view: each round receives into a new buffer
            at += k * vdt.itemsize
            sets.append((pos, val))
        return sets


class GTopK(Framed):
    """``gtopk(ratio=... | k=...)[+value stage][+zstd]``: local top-k with error feedback, then
    the merge tree of :func:`schedule`.  Device tensors are selected on the device (their
    residuals live there); the pairs cross once, down, and the global pairs once, up, into
    the device results (zeroed there by the scatter)."""

    devices = True

    def __init__(self, spec, reducer):
        stages = codec.parse_spec(spec)
        local = codec.format_spec([("topk", stages[0][1])] + list(stages[1:]))
        super().__init__(local, reducer, checksum=False)  # its frame never leaves this rank
        self.spec = codec.format_spec([("gtopk", stages[0][1])] + codec.parse_spec(self.codec.spec)[1:])
        if reducer.vote:
            raise CodecValueError("vote: majority vote needs a sign codec, not gtopk")

    def start(self, prepared, stats):
        arrays, keys = prepared
        try:
            frame = self.encode(arrays, keys)
            sets = self.codec.decode_sparse_many(frame, layout=codec.Layout.of(arrays))  # values in wide_dtype: the wire's
            wire = self.wire(frame)
        except Exception as e:  # travels in the tree's status, so no rank waits for our pairs
            return _TreePending(self, arrays, keys, None, [0] * len(arrays), failed=e)
        return _TreePending(self, arrays, keys, sets, wire)


def _status(msg) -> int:
    return int(np.frombuffer(msg[:HEADER], "<i8")[0])


class _TreePending:
    def __init__(self, scheme, arrays, keys, sets, wire, failed=None):
        self.scheme, self.arrays, self.keys, self.local = scheme, arrays, keys, sets
        self.wire, self.failed = wire, failed
        self.pairs = None if sets is None else _Pairs(arrays, [p.size for p, _ in sets])

    def test(self):
        return True  # nothing is posted before wait(), which runs the whole tree

    def _recv(self, comm, peer, known: bool):
        """A message from ``peer``: the full size when this rank knows it, else probed (a rank
        that could not encode does not know ``k``)."""
        MPI = mpi(comm)
        if known:
            buf = np.empty(HEADER + self.pairs.nbytes, np.uint8)
            st = MPI.Status()
            comm.Recv(buf, source=peer, status=st)
        else:
            st = MPI.Status()
            comm.Probe(source=peer, status=st)
            buf = np.empty(st.Get_count(MPI.BYTE), np.uint8)
            comm.Recv(buf, source=peer)
            return buf
        return buf[: st.Get_count(MPI.BYTE)]

    def finish(self, stats, out):
        red = self.scheme.reducer
        comm = red.comm
        MPI = mpi(comm)
        known = self.pairs is not None
        ks = self.pairs.ks if known else None
        sets = None if self.local is None else list(self.local)
        status = 0 if self.failed is None else status_of(self.failed)  # ours, or one we heard of
        merge_s = 0.0
        for op, peer in schedule(red.rank, red.size):
            if op != "recv":
                mine = self.pairs.pack(sets) if status == 0 else np.array([status], "<i8").view(np.uint8)
                stats.bytes_sent += mine.size
            if op == "return":  # the final pairs back to the rank folded into this one
                comm.Send(mine, dest=peer)
                continue
            if op == "exchange":
                if known:
                    theirs = np.empty(HEADER + self.pairs.nbytes, np.uint8)
                    st = MPI.Status()
                    comm.Sendrecv(mine, dest=peer, recvbuf=theirs, source=peer, status=st)
                    theirs = theirs[: st.Get_count(MPI.BYTE)]
                else:
                    req = comm.Isend(mine, dest=peer)
                    theirs = self._recv(comm, peer, False)
                    req.Wait()
            elif op == "recv":
                theirs = self._recv(comm, peer, known)
            else:  # "send": hand our pairs over, then receive the final ones
                comm.Send(mine, dest=peer)
                theirs = self._recv(comm, peer, known)
            stats.bytes_received += theirs.size
            status = status or _status(theirs)
            if status:
                continue
            if op == "send":
                sets = self.pairs.unpack(theirs)
                continue
            m0 = time.perf_counter()
            sets = [merge(pa, va, pb, vb, k) for (pa, va), (pb, vb), k in zip(sets, self.pairs.unpack(theirs), ks)]
            merge_s += time.perf_counter() - m0
        if status:  # every rank knows by now: the status travelled with the pairs
            raise_failed(comm, self.failed, "encoding its tensors")
        t1 = time.perf_counter()
        res_all = []
        for a, key, (lpos, lval), (gpos, gval), o in zip(self.arrays, self.keys, self.local, sets, out):
            if on_device(a):  # the global pairs' one copy up; the rest of the result zeroed there
                res = empty(a.shape, a.dtype) if o is None else o
                scatter(finish_sum(gval, a.dtype, red.size, red.average), gpos, res, SET)
            else:
                res = np.zeros(a.shape, a.dtype) if o is None else o
                if o is not None:
                    res.fill(0)
                res.reshape(-1)[gpos] = finish_sum(gval, a.dtype, red.size, red.average)
            res_all.append(res)
            if self.scheme.ef.residuals and lpos.size:
                missed = ~np.isin(lpos, gpos, assume_unique=True)
                if missed.any():
                    self.scheme.ef.add_residual(self.scheme.key(key), lval[missed], lpos[missed])
        stats.decode_s = merge_s + time.perf_counter() - t1
        return res_all
