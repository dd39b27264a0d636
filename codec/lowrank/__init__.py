"""Low-rank gradient compression: the ``powersgd`` codec and Pufferfish's factorization helpers.

* :mod:`codec.lowrank.powersgd`: PowerSGD as a transform stage, and the kernels
  (``matrix_of``, ``initial_q``, ``orthogonalize``) the distributed version reuses.
* :func:`factorize` and :func:`plan` (:mod:`codec.lowrank.pufferfish`): Pufferfish (Wang,
  Agarwal, Papailiopoulos, MLSys'21) pre-factorizes layers so that gradients are small by
  construction; these helpers work on NumPy arrays and shapes, for any framework.
"""

from codec.lowrank.pufferfish import Factors, Plan, factorize, plan

__all__ = ["Factors", "Plan", "factorize", "plan"]
