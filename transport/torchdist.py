"""The transport on torch.distributed: :class:`TorchComm`, an mpi4py-shaped communicator over a
``torch.distributed`` process group, so ``Allreducer(spec, comm=process_group)`` runs every
scheme (the allgather of frames, ``none``'s dense sum, gTop-k's tree, the two-round
PowerSGD) on gloo (CPU tensors) and NCCL (CUDA tensors, frames on the device) as it does on
MPI.  docs/transport.md, "On torch.distributed".

It implements exactly what the transport calls of a communicator (``Get_rank``,
``Get_size``, the object ``allgather`` / ``allreduce``, ``Allgather``, ``Iallgatherv``,
``Iallreduce``, ``Send`` / ``Isend`` / ``Recv`` / ``Probe`` / ``Sendrecv``, ``Barrier``,
``Split_type``) and the names the schemes read off ``mpi4py.MPI`` (:data:`TorchComm.MPI`:
``IN_PLACE``, ``BYTE``, ``MAX``, ``Status``, ``Request.Testall`` / ``Waitall``,
``COMM_TYPE_SHARED``); torch is imported only when one is made.

What differs from MPI, and what it costs:

* **Where buffers live.** On gloo the collectives take CPU tensors: NumPy buffers are
  shared with them.  On NCCL they take CUDA tensors of the current device
  (``torch.cuda.set_device`` first, as for any NCCL job): the transport hands it device
  frames and sums as it does a CUDA-aware MPI (``device_buffers``), shared through
  ``__cuda_array_interface__``; the few host buffers (the step's check and sizes, gTop-k's
  merged pairs, PowerSGD's host factors) are copied up and back.
* **Variable-size frames** (``Iallgatherv``): ``all_gather`` takes equal sizes, so
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

from codec.dtypes import on_device

__all__ = ["TorchComm", "is_process_group"]


def is_process_group(comm) -> bool:
    """Whether ``comm`` is a ``torch.distributed`` process group (checked without importing torch)."""
    return type(comm).__module__.startswith("torch.") and type(comm).__name__ == "ProcessGroup"


def _nothing() -> None:
    pass


def _bytes(t):
    """Flat tensor ``t``'s bytes (a uint8 view, no copy)."""
    import torch

    return t.view(torch.uint8)


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
    (None: the default group), for :class:`transport.Allreducer`.

    Its collectives run on tensors of the group's device: the CPU on gloo, the current CUDA
    device on NCCL (:attr:`device_buffers`, so the transport hands it device frames as they
    are, as it does a CUDA-aware MPI).  A buffer already there is shared with the tensor,
    never copied: a NumPy array on the CPU, a device array (``__cuda_array_interface__``) on
    the GPU.  Any other buffer (the host messages of gTop-k's tree and PowerSGD's host
    factors on NCCL) is staged: copied to the device, and back once the call completes."""

    MPI = _MPI

    def __init__(self, group=None):
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.group = torch, dist, group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        nccl = str(dist.get_backend(group)).lower() == "nccl"
        #: where the collectives' tensors live (the current CUDA device on NCCL)
        self.device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        #: whether device frames go as they are (asked by transport.device.cuda_aware)
        self.device_buffers = nccl
        self._pending: dict = {}  # source -> the length Probe received, until Recv

    def _peer(self, rank: int) -> int:
        """The global rank of group rank ``rank`` (point-to-point calls take global ranks)."""
        return rank if self.group is None else self.dist.get_global_rank(self.group, rank)

    def _t(self, a):
        """``(tensor, back)``: the flat bytes-or-values of buffer ``a`` as a tensor on
        :attr:`device` (``a``'s own memory when it is there) and what copies the tensor back
        into ``a`` once a call wrote it (nothing when shared)."""
        torch = self.torch
        if on_device(a):
            t = torch.as_tensor(a, device=self.device if self.device.type == "cuda" else "cuda").reshape(-1)
            if t.device == self.device:
                return t, _nothing
            staged = t.to(self.device)
            return staged, lambda: t.copy_(staged)
        t = torch.from_numpy(np.ascontiguousarray(a).reshape(-1))
        if self.device.type == "cpu":
            return t, _nothing
        staged = t.to(self.device)
        return staged, lambda: t.copy_(staged)

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
    def Allgather(self, send, recv) -> None:
        """Equal-size pieces: ``recv`` holds every rank's ``send`` in rank order."""
        if not recv.size:
            return
        into, back = self._t(recv)
        self.dist.all_gather(list(into.chunk(self.size)), self._t(send)[0], group=self.group)
        back()

    def Iallgatherv(self, send, spec) -> _Request:
        """``recv[displs[r]:displs[r] + sizes[r]]`` = rank r's ``send`` (bytes): every piece
        padded to the largest, gathered, and unpadded when the request is waited on."""
        recv, (sizes, displs) = spec
        big = max(sizes) if sizes else 0
        if big == 0:
            return _Request()
        torch = self.torch
        mine = _bytes(self._t(send)[0])
        padded = torch.empty(big, dtype=torch.uint8, device=self.device)
        padded[: mine.numel()] = mine
        padded[mine.numel() :] = 0  # (only the padding zeroed: the frame's bytes written once)
        gathered = torch.empty(big * self.size, dtype=torch.uint8, device=self.device)
        work = self.dist.all_gather(list(gathered.chunk(self.size)), padded, group=self.group, async_op=True)
        into, back = self._t(recv)
        into = _bytes(into)

        def unpad():
            for r, (n, at) in enumerate(zip(sizes, displs)):
                into[at : at + n] = gathered[r * big : r * big + n]
            back()

        return _Request([work], unpad)

    def Iallreduce(self, send, recv) -> _Request:
        """The sum over the ranks of ``send`` into ``recv`` (float32/float64); ``send``
        ``MPI.IN_PLACE``: of ``recv`` itself, in place."""
        into, back = self._t(recv)
        if send is not _MPI.IN_PLACE:
            into.copy_(self._t(send)[0])
        work = self.dist.all_reduce(into, op=self.dist.ReduceOp.SUM, group=self.group, async_op=True)
        return _Request([work], back)

    def Allreduce(self, send, recv) -> None:
        self.Iallreduce(send, recv).Wait()

    # ------------------------------------------------------------------ point to point
    def _length(self, n: int):
        return self.torch.tensor([n], dtype=self.torch.int64, device=self.device)

    def Isend(self, buf, dest: int) -> _Request:
        t, back = self._t(buf)
        data = _bytes(t)
        peer = self._peer(dest)
        works = [self.dist.isend(self._length(data.numel()), peer, group=self.group)]
        if data.numel():  # (the caller may reuse its buffer before the send completes: a shared one is copied, a staged one is a copy already)
            works.append(self.dist.isend(data.clone() if back is _nothing else data, peer, group=self.group))
        return _Request(works)

    def Send(self, buf, dest: int) -> None:
        self.Isend(buf, dest).Wait()

    def Probe(self, source: int, status: _Status | None = None) -> None:
        """Receive the next message's length from ``source`` (its bytes follow in ``Recv``)."""
        n = self._length(0)
        self.dist.recv(n, self._peer(source), group=self.group)
        self._pending[source] = int(n.item())
        if status is not None:
            status.count = self._pending[source]

    def Recv(self, buf, source: int, status: _Status | None = None) -> None:
        if source not in self._pending:
            self.Probe(source)
        n = self._pending.pop(source)
        into, back = self._t(buf)
        flat = _bytes(into)
        if n > flat.numel():
            from transport.errors import RankError

            raise RankError(f"a {n}-byte message from rank {source} for a {flat.numel()}-byte buffer")
        if n:
            self.dist.recv(flat[:n], self._peer(source), group=self.group)
            back()
        if status is not None:
            status.count = n

    def Sendrecv(self, send, dest: int, recvbuf, source: int, status: _Status | None = None) -> None:
        req = self.Isend(send, dest)
        self.Recv(recvbuf, source, status)
        req.Wait()

    def __reduce__(self):
        raise pickle.PicklingError("a TorchComm holds a process group; pickle what uses it without it")
