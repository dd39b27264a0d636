"""tests/README.md's map from code to tests stays true: every module of codec/ and transport/
is covered by a row (its file, or a folder above it), every test file a row names exists, and
every test file appears in some row."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
ROW = re.compile(r"^\| (?:`(?P<code>[^`]+)`|(?P<label>[^|`]+?)) \| (?P<tests>[^|]+) \|$")


def rows() -> list[tuple[str | None, list[str]]]:
    out = []
    for line in (TESTS / "README.md").read_text().splitlines():
        m = ROW.match(line)
        if m and m["tests"].strip() != "tests":
            out.append((m["code"], [t.strip() for t in m["tests"].split(",")]))
    return out


def modules() -> list[str]:
    return sorted(
        str(p.relative_to(ROOT))
        for pkg in ("codec", "transport")
        for p in (ROOT / pkg).rglob("*.py")
        if "__pycache__" not in p.parts and p.name != "__main__.py"
    )


def test_the_map_has_rows():
    assert len(rows()) > 40


def test_every_module_has_a_row():
    codes = [c for c, _ in rows() if c]
    missing = [m for m in modules() if not any(m == c or (c.endswith("/") and m.startswith(c)) for c in codes)]
    assert not missing, f"modules with no row in tests/README.md: {missing}"


def test_every_named_code_path_exists():
    gone = [c for c, _ in rows() if c and not (ROOT / c).exists()]
    assert not gone, f"rows of tests/README.md name code that does not exist: {gone}"


def test_every_named_test_exists_and_every_test_is_named():
    named = {t for _, ts in rows() for t in ts}
    absent = sorted(t for t in named if not (TESTS / t).is_file())
    assert not absent, f"tests/README.md names test files that do not exist: {absent}"
    files = {p.name for p in TESTS.glob("test_*.py")} | {p.name for p in TESTS.glob("mpi_*.py")}
    unnamed = sorted(files - named - {"test_map.py"})
    assert not unnamed, f"test files tests/README.md does not map: {unnamed}"
