"""Plain-NumPy references of every kernel and codec, one module per family of stages.

Each module restates the numbered semantics of docs/codecs.md literally, favouring the
obviously correct over the fast (no Numba); the tests compare the codecs against them bit
for bit.  Importable as ``reference`` from tests/ (pytest puts tests/ on sys.path), e.g.
``from reference import sparse as ref``.

This package imports nothing itself: import the module you need.
"""
