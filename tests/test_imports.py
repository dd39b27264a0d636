"""The import graph of codec/ and transport/: no cycle (imports inside functions included),
layers respected (codec never imports transport or mpi4py; stages never import a kernel
backend module), and ``import codec`` stays cheap."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("codec", "transport")


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module of ours that ``name`` imports, at any depth of its code (functions too).
    ``from pkg import x`` counts as importing ``pkg.x`` when that is a module, else ``pkg``."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                found.add(a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            for a in node.names:
                sub = f"{mod}.{a.name}"
                found.add(sub if sub in known else mod)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in g:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    found = cycles(graph())
    assert not found, "import cycles (imports inside functions count):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_codec_never_imports_transport_or_mpi4py():
    mods = modules()
    bad = []
    for name, path in mods.items():
        if not name.startswith("codec"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [(name, n) for n in names if n.split(".")[0] in ("transport", "mpi4py")]
    assert not bad, f"codec imports transport/mpi4py: {bad}"


def test_stages_reach_kernels_only_through_the_backend():
    g = graph()
    bad = [(m, d) for m, deps in g.items() if m.startswith("codec.stages") for d in deps if d.startswith("codec.kernels.cpu")]
    assert not bad, f"stage modules importing a backend module directly: {bad}"


def test_import_codec_is_cheap():
    code = (
        "import sys, codec\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('numba', 'llvmlite', 'transport', 'mpi4py', 'scipy', 'torch', 'zstandard')"
        " or m.startswith('codec.kernels.cpu') or m in ('codec.fuzzing', 'codec.cli', 'codec.io', 'codec.testing')]\n"
        "print(heavy)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert r.stdout.strip() == "[]", r.stdout
