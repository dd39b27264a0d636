"""Spectral stages: ``fft`` (blocked real FFT sparsification, Wang et al., HPDC'20)."""
