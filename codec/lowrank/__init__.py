"""Low-rank helpers that are not stages: Pufferfish's factorization.

* :func:`factorize` and :func:`plan` (:mod:`codec.lowrank.pufferfish`): Pufferfish (Wang,
  Agarwal, Papailiopoulos, MLSys'21) pre-factorizes layers so that gradients are small by
  construction; these helpers work on NumPy arrays and shapes, for any framework.
* :mod:`codec.lowrank.powersgd` re-exports the PowerSGD functions (``matrix_of``,
  ``initial_q``, ``start_q``, ``orthogonalize``); the ``powersgd`` stage itself is a transform
  and lives in :mod:`codec.stages.transform.powersgd`.

The Pufferfish helpers load on first use (``codec.lowrank.plan``), so they add nothing to
``import codec``.
"""

__all__ = ["Factors", "Plan", "factorize", "plan"]


def __getattr__(name):
    if name in __all__:
        from codec.lowrank import pufferfish

        return getattr(pufferfish, name)
    raise AttributeError(f"module 'codec.lowrank' has no attribute {name!r}")
