"""Transform stages: map the flat array into another domain, keep what they send, and invert.

``fft`` (blocked real FFT sparsification) and ``powersgd`` (rank-r power iteration)."""

from codec.stages.transform import fft, powersgd  # noqa: F401  (register)
