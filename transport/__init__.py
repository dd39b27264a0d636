"""gradcodec's MPI transport (compressed allreduce over mpi4py).

The transport sits above the codec's public face (``import codec``) and is the only package
that imports mpi4py.  Its API (``Allreducer``, ``ireduce``, gTop-k, two-round PowerSGD) is
specified by the transport issue and lands there; this package exists so that the
distribution's import layout is fixed from the start.
"""

__all__: list[str] = []
