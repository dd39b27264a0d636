"""gradcodec's MPI transport: compressed allreduce over mpi4py.

>>> from transport import Allreducer                         # doctest: +SKIP
>>> reducer = Allreducer("topk(ratio=0.001)+fp16")           # COMM_WORLD by default
>>> grads = reducer.reduce({"w": gw, "b": gb})               # same bits on every rank

``Allreducer`` runs one of four schemes chosen by the spec's head in one table
(``transport.schemes.SCHEMES``): the allgather of frames (any codec), MPI Allreduce
(``none``), the gTop-k tree (``gtopk(ratio=...)``) and the two-round PowerSGD
(``powersgd(...)``); docs/transport.md.  This package sits above the codec's public face
(``codec``, ``codec.arrays``, ``codec.manyframe``, ``codec.lowrank.powersgd``) and is the only one that imports
mpi4py, on first use: ``import transport`` and the cost model (``transport.costmodel``) work
without MPI.

Layout: allreduce.py (Allreducer, Handle, Stats), errors.py (MismatchError, RankError,
RankTypeError, the status codes), schemes/ (one module per scheme, the table; a rank's
message is one many-tensor frame, codec/manyframe/), layout.py (the input's structure),
device.py (device arrays),
costmodel.py, bench.py.
"""

from __future__ import annotations

__all__ = ["Allreducer", "Handle", "MismatchError", "RankError", "RankTypeError", "Stats"]

#: where each public name lives
_HOME = {
    "Allreducer": "transport.allreduce",
    "Handle": "transport.allreduce",
    "Stats": "transport.allreduce",
    "MismatchError": "transport.errors",
    "RankError": "transport.errors",
    "RankTypeError": "transport.errors",
}


def __getattr__(name):
    # Lazy on purpose (PEP 562): ``python -m transport.bench`` imports this package first and
    # must set its thread variables before NumPy loads its BLAS, and ``transport.costmodel``
    # needs neither NumPy's BLAS nor the codec; the names load on first access.
    if name in _HOME:
        import importlib

        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'transport' has no attribute {name!r}")
