"""The transport on torch.distributed: :class:`TorchComm`, an mpi4py-shaped communicator over a
``torch.distributed`` process group, so ``Allreducer(spec, comm=process_group)`` runs every
scheme (the allgather of frames, ``none``'s dense sum, gTop-k's tree, the two-round
PowerSGD) on gloo (CPU tensors) as it does on MPI.  docs/transport.md, "On torch.distributed".

It implements exactly what the transport calls of a communicator (``Get_rank``,
``Get_size``, the object ``allgather`` / ``allreduce``, ``Allgather``, ``Iallgatherv``,
``Iallreduce``, ``Send`` / ``Isend`` / ``Recv`` / ``Probe`` / ``Sendrecv``, ``Barrier``,
``Split_type``) and the names the schemes read off ``mpi4py.MPI`` (:data:`TorchComm.MPI`:
``IN_PLACE``, ``BYTE``, ``MAX``, ``Status``, ``Request.Testall`` / ``Waitall``,
``COMM_TYPE_SHARED``); torch is imported only when one is made.

What differs from MPI, and what it costs:

* **Variable-size frames** (``Iallgatherv``): gloo's ``all_gather`` takes equal sizes, so
  each rank's frame is padded to the step's largest (the sizes are exchanged first, as the
  allgather scheme does anyway) and the padding is dropped on arrival: a step moves
  ``p * max(frame)`` bytes a rank instead of ``sum(frames)``: equal for the dense codecs
  (their frames have one size), a few percent for a sparsifier (its frames differ by their
  index coding).  ``Stats.bytes_received`` counts the frames, not the padding.
* **Point to point** (gTop-k's tree): ``torch.distributed`` has no probe, so every message
  goes as its length (one int64) and then its bytes; ``Probe`` receives the length.
* **Nonblocking** calls return a request over torch's ``Work``; the padded allgather
  copies its frames out when waited on.
"""

from __future__ import annotations

import os
import pickle
from types import SimpleNamespace

import numpy as np

__all__ = ["TorchComm", "is_process_group"]


def is_process_group(comm) -> bool:
    """Whether ``comm`` is a ``torch.distributed`` process group (checked without importing torch)."""
    return type(comm).__module__.startswith("torch.") and type(comm).__name__ == "ProcessGroup"


class _Status:
    """``MPI.Status``: the byte count of the last message received into it."""

    def __init__(self):
        self.count = 0

    def Get_count(self, datatype=None) -> int:
        return self.count


class _Request:
    """``MPI.Request`` over torch ``Work`` objects, with an action run once they complete."""

    def __init__(self, works=(), then=None):
        self.works, self.then, self.done = list(works), then, False

    def Test(self) -> bool:
        if self.done:
            return True
        if all(w.is_completed() for w in self.works):
            self.Wait()
        return self.done

    def Wait(self) -> None:
        if self.done:
            return
        for w in self.works:
            w.wait()
        if self.then is not None:
            self.then()
        self.done = True

    @staticmethod
    def Testall(reqs) -> bool:
        return all(r.Test() for r in reqs)

    @staticmethod
    def Waitall(reqs) -> None:
        for r in reqs:
            r.Wait()


class _Node:
    """``Split_type(COMM_TYPE_SHARED)``: the ranks on this node, as the launcher counts them
    (torchrun's ``LOCAL_WORLD_SIZE``; else every rank of the group)."""

    def __init__(self, size: int):
        self.size = size

    def Get_size(self) -> int:
        return self.size

    def Free(self) -> None:
        pass


#: the names the schemes read off ``mpi4py.MPI`` (transport.schemes.base.mpi)
_MPI = SimpleNamespace(IN_PLACE=object(), BYTE="byte", MAX=max, SUM=sum, Status=_Status, Request=_Request, COMM_TYPE_SHARED="shared")


class TorchComm:
    """An mpi4py-shaped communicator over the ``torch.distributed`` process group ``group``
    (None: the default group), for :class:`transport.Allreducer`.  Buffers are NumPy arrays
    (the transport's frames and sums), shared with torch tensors, never copied to cross."""

    MPI = _MPI

    def __init__(self, group=None):
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.group = torch, dist, group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)

    def _peer(self, rank: int) -> int:
        """The global rank of group rank ``rank`` (point-to-point calls take global ranks)."""
        return rank if self.group is None else self.dist.get_global_rank(self.group, rank)

    def _t(self, a):
        return self.torch.from_numpy(np.ascontiguousarray(a).reshape(-1))

    # ------------------------------------------------------------------ who
    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.size

    def Split_type(self, kind):
        return _Node(int(os.environ.get("LOCAL_WORLD_SIZE", self.size)))

    def Barrier(self) -> None:
        self.dist.barrier(group=self.group)

    # ------------------------------------------------------------------ objects
    def allgather(self, obj) -> list:
        out = [None] * self.size
        self.dist.all_gather_object(out, obj, group=self.group)
        return out

    def allreduce(self, obj, op=None):
        got = self.allgather(obj)
        return (op or sum)(got)

    def bcast(self, obj, root: int = 0):
        box = [obj]
        self.dist.broadcast_object_list(box, src=self._peer(root), group=self.group)
        return box[0]

    # ------------------------------------------------------------------ buffers
    def Allgather(self, send: np.ndarray, recv: np.ndarray) -> None:
        """Equal-size pieces: ``recv`` holds every rank's ``send`` in rank order."""
        if recv.size:
            self.dist.all_gather(list(self._t(recv).chunk(self.size)), self._t(send), group=self.group)

    def Iallgatherv(self, send: np.ndarray, spec) -> _Request:
        """``recv[displs[r]:displs[r] + sizes[r]]`` = rank r's ``send`` (bytes): every piece
        padded to the largest, gathered, and unpadded when the request is waited on."""
        recv, (sizes, displs) = spec
        big = max(sizes) if sizes else 0
        padded = np.zeros(big, np.uint8)
        padded[: send.size] = send.reshape(-1).view(np.uint8)
        gathered = np.empty(big * self.size, np.uint8)
        if big == 0:
            return _Request()
        chunks = list(self.torch.from_numpy(gathered).chunk(self.size))
        work = self.dist.all_gather(chunks, self.torch.from_numpy(padded), group=self.group, async_op=True)

        def unpad():
            flat = recv.reshape(-1).view(np.uint8)
            for r, (n, at) in enumerate(zip(sizes, displs)):
                flat[at : at + n] = gathered[r * big : r * big + n]

        return _Request([work], unpad)

    def Iallreduce(self, send, recv: np.ndarray) -> _Request:
        """The sum over the ranks of ``send`` into ``recv`` (float32/float64); ``send``
        ``MPI.IN_PLACE``: of ``recv`` itself, in place."""
        if send is not _MPI.IN_PLACE:
            np.copyto(recv, np.asarray(send).reshape(recv.shape))
        work = self.dist.all_reduce(self._t(recv), op=self.dist.ReduceOp.SUM, group=self.group, async_op=True)
        return _Request([work])

    def Allreduce(self, send, recv: np.ndarray) -> None:
        self.Iallreduce(send, recv).Wait()

    # ------------------------------------------------------------------ point to point
    def _length(self, n: int):
        return self.torch.tensor([n], dtype=self.torch.int64)

    def Isend(self, buf: np.ndarray, dest: int) -> _Request:
        data = np.ascontiguousarray(buf).reshape(-1).view(np.uint8)
        peer = self._peer(dest)
        works = [self.dist.isend(self._length(data.size), peer, group=self.group)]
        if data.size:
            works.append(self.dist.isend(self.torch.from_numpy(data.copy()), peer, group=self.group))
        return _Request(works)

    def Send(self, buf: np.ndarray, dest: int) -> None:
        self.Isend(buf, dest).Wait()

    def Probe(self, source: int, status: _Status | None = None) -> None:
        """Receive the next message's length from ``source`` (its bytes follow in ``Recv``)."""
        n = self._length(0)
        self.dist.recv(n, self._peer(source), group=self.group)
        self._pending = getattr(self, "_pending", {})
        self._pending[source] = int(n.item())
        if status is not None:
            status.count = self._pending[source]

    def Recv(self, buf: np.ndarray, source: int, status: _Status | None = None) -> None:
        pending = getattr(self, "_pending", {})
        if source not in pending:
            self.Probe(source)
        n = self._pending.pop(source)
        flat = buf.reshape(-1).view(np.uint8)
        if n > flat.size:
            from transport.errors import RankError

            raise RankError(f"a {n}-byte message from rank {source} for a {flat.size}-byte buffer")
        if n:
            self.dist.recv(self.torch.from_numpy(flat[:n]), self._peer(source), group=self.group)
        if status is not None:
            status.count = n

    def Sendrecv(self, send: np.ndarray, dest: int, recvbuf: np.ndarray, source: int, status: _Status | None = None) -> None:
        req = self.Isend(send, dest)
        self.Recv(recvbuf, source, status)
        req.Wait()

    def __reduce__(self):
        raise pickle.PicklingError("a TorchComm holds a process group; pickle what uses it without it")
