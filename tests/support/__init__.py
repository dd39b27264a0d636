"""Test helpers shared by several test modules (importable as ``support`` from tests/: pytest
puts tests/ on sys.path, as running a script in tests/ does)."""
