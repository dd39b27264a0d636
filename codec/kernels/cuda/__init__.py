"""CUDA twins of the kernel families (convert, rng, scatter, select so far): ``codec/kernels/cuda/<family>.py`` defines
every name of ``codec/kernels/cpu/<family>.py``'s ``__all__`` with the same arguments and the
same results, byte for byte, using :mod:`codec._cuda_jit`.  :func:`codec.kernels.backend`
picks a twin when an argument is a device array; a family without one raises TypeError.
docs/kernels.md, "Adding a CUDA twin".
"""
