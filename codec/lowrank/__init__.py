"""Low-rank gradient compression: the ``powersgd`` codec and Pufferfish's factorization helpers.

* :mod:`codec.lowrank.powersgd`: PowerSGD as a transform stage, and the kernels
  (``matrix_of``, ``initial_q``, ``start_q``, ``orthogonalize``) the distributed version reuses.
* :func:`factorize` and :func:`plan` (:mod:`codec.lowrank.pufferfish`): Pufferfish (Wang,
  Agarwal, Papailiopoulos, MLSys'21) pre-factorizes layers so that gradients are small by
  construction; these helpers work on NumPy arrays and shapes, for any framework.

``import codec`` registers ``powersgd`` through this package; the Pufferfish helpers load on
first use (``codec.lowrank.plan``), so they add nothing to that import.
"""

__all__ = ["Factors", "Plan", "factorize", "plan"]


def __getattr__(name):
    if name in __all__:
        from codec.lowrank import pufferfish

        return getattr(pufferfish, name)
    raise AttributeError(f"module 'codec.lowrank' has no attribute {name!r}")
