"""The PowerSGD functions, at the path docs/api.md has always given them; the stage and the
functions live in :mod:`codec.stages.transform.powersgd`."""

from codec.stages.transform.powersgd import STATE_Q, back_project, expand, initial_q, matrix_of, orthogonalize, project, start_q  # noqa: F401

__all__ = ["STATE_Q", "back_project", "expand", "initial_q", "matrix_of", "orthogonalize", "project", "start_q"]
