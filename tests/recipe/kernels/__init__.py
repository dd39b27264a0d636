"""The recipe stage's kernels, laid out as ``codec.kernels`` is: ``<backend>/<family>.py``."""
