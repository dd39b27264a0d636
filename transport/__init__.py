"""gradcodec's MPI transport: compressed allreduce over mpi4py.

>>> from transport import Allreducer                         # doctest: +SKIP
>>> reducer = Allreducer("topk(ratio=0.001)+fp16")           # COMM_WORLD by default
>>> grads = reducer.reduce({"w": gw, "b": gb})               # same bits on every rank

``Allreducer`` runs one of four schemes chosen by the spec: the allgather of frames (any
codec), MPI Allreduce (``none``), the gTop-k tree (``gtopk(ratio=...)``) and the two-round
PowerSGD (``powersgd(...)``); docs/transport.md.  This package sits above the codec's public
face and is the only one that imports mpi4py, on first use: ``import transport`` and the
cost model (``transport.costmodel``) work without MPI.
"""

from __future__ import annotations

__all__ = ["Allreducer", "Handle", "MismatchError", "RankError", "RankTypeError", "Stats"]


def __getattr__(name):
    if name in __all__:
        from transport import allreduce

        return getattr(allreduce, name)
    raise AttributeError(f"module 'transport' has no attribute {name!r}")
