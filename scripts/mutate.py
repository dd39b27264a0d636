"""Mutation testing of one module against its mapped tests (issue 28); not run in CI (too slow).

    .venv/bin/python scripts/mutate.py MODULE_PATH [--tests TESTFILE ...] [--jobs N]
        [--sample N] [--seed S] [--lines A-B] [--json OUT] [--survivors] [--no-fork]

    .venv/bin/python scripts/mutate.py codec/spec.py
    .venv/bin/python scripts/mutate.py codec/kernels/cpu/index.py --sample 40 --seed 1 --jobs 2

Needs ``coverage`` and ``pytest-cov`` (a tool dependency, not part of the ``test`` extra; CI
does not run this): ``.venv/bin/pip install coverage pytest-cov``.

What it does:

- The tests: by default the test files that tests/README.md's table "Where the tests of a
  module are" maps to MODULE_PATH (its own row, else the row of the deepest folder holding it),
  **without** ``test_cuda_simulator.py`` (the CUDA simulator run takes minutes; the output says
  when it was left out) and without the ``mpi_*.py`` scripts (run by their ``test_*.py``).
  ``--tests`` names the files instead.
- The mutants (a small AST mutator, stdlib only): comparisons flipped (``<``/``>=``,
  ``<=``/``>``, ``==``/``!=``, ``is``/``is not``, ``in``/``not in``) and moved at the
  boundary (``<``/``<=``, ``>``/``>=``); arithmetic and bitwise operators swapped (``+``/``-``,
  ``*``/``//``, ``/`` to ``*``, ``<<``/``>>``, ``&``/``|``, ``^`` to ``|``, ``%`` to ``//``),
  also in augmented assignments; integer constants moved by one (``n+1`` and ``n-1``) and
  ``True``/``False`` swapped; ``and``/``or`` swapped; ``not x`` to ``x``; a ``raise`` replaced
  by ``pass``; ``return expr`` replaced by ``return None``.  Left alone: docstrings and every
  string, type annotations, decorators (``@jit(parallel=True)`` is not behaviour under test),
  ``if __name__ == "__main__":`` blocks, and any line carrying ``# pragma: no mutate``.
- Each mutant has a stable id, ``L<line>:<column> <what>``, e.g. ``L123:8 Lt->GtE`` (the
  operator's own position; columns count from 0, as Python's do), stable while the module's
  text does not change.
- Equivalent mutants (no test can tell them from the module: ``x * 1`` for ``x // 1``) are
  read from the table under "## Equivalent mutants" in tests/README.md
  (``| module | mutant | why it is equivalent |``); they are left out of the score.
  Score = killed / (all - equivalent).
- How a mutant is run: the repository (codec/, transport/, tests/, docs/, scripts/, examples/,
  pyproject.toml, README.md) is copied once per worker into a temporary folder with its
  modification times kept (so Numba's on-disk caches in ``__pycache__`` stay valid); the
  mutant is ``ast.unparse`` of the mutated module written over the copy's file, and
  ``python -m pytest -x -q -p no:cacheprovider <tests>`` runs with the copy as working
  folder and first on ``PYTHONPATH`` (checked: the copy's ``codec`` is the one imported).
  Killed: pytest exits non-zero or runs past the timeout (3 times the baseline run plus 30 s);
  survived: it exits 0.  The original file is put back after each mutant.
- Speed: the mapped tests first run once under coverage with a context per test, which tells
  the test ids that execute each line; a mutant runs only those of its statement's lines
  (all the mapped tests for lines run at import or collection time, and for lines inside
  Numba-jitted functions, which coverage cannot see).  A mutant on a line no test executes is
  counted as survived ("not covered").  Before any mutant, the module as ``ast.unparse``
  writes it, unmutated, must pass the selected tests (else exit 2).  Each worker keeps a
  "fork server" in its copy: a Python that has imported NumPy, Numba (its compiler started),
  pytest and the other heavy third-party modules, and nothing of the project; every run is a
  child forked from it that calls ``pytest.main`` (about 3 times faster than a fresh Python
  on this project); ``--no-fork`` starts a fresh Python for every run instead.
- Ctrl-C stops the runs and removes the copies.
- ``--jobs N`` workers (default 1), ``--sample N --seed S`` a deterministic random sample of
  the mutants (big kernel files), ``--lines A-B`` only the mutants on those lines (handy while
  writing tests), ``--json OUT`` every mutant and its result, ``--survivors`` reruns only the
  mutants that survived in the ``--json`` file of an earlier run of the same module text and
  merges the results into it (the summary is then the whole module's).

Output: one line per survivor (id, the original line, the mutated text), then
``codec/spec.py: K of M non-equivalent mutants killed (P%), E equivalent left out, S survived, T s``.
Exit status 0, unless the baseline run fails (2, with a one-line reason) or the arguments are
wrong (2).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPIED = ["codec", "transport", "tests", "docs", "scripts", "examples", "pyproject.toml", "README.md"]
SLOW_TESTS = {"test_cuda_simulator.py": "the CUDA simulator run takes minutes"}
JIT_DECORATORS = {"jit", "njit", "vectorize", "guvectorize", "generated_jit", "stencil", "cfunc"}
PRAGMA = "# pragma: no mutate"

# ---------------------------------------------------------------------------------- mutants

_CMP_FLIP = {ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.LtE: ast.Gt, ast.Gt: ast.LtE, ast.Eq: ast.NotEq,
             ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
_CMP_EDGE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
_BIN_SWAP = {ast.Add: [ast.Sub], ast.Sub: [ast.Add], ast.Mult: [ast.FloorDiv], ast.FloorDiv: [ast.Mult],
             ast.Div: [ast.Mult], ast.LShift: [ast.RShift], ast.RShift: [ast.LShift], ast.BitAnd: [ast.BitOr],
             ast.BitOr: [ast.BitAnd], ast.BitXor: [ast.BitOr], ast.Mod: [ast.FloorDiv]}
_SYMBOL = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
           ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in", ast.Add: "+", ast.Sub: "-",
           ast.Mult: "*", ast.FloorDiv: "//", ast.Div: "/", ast.LShift: "<<", ast.RShift: ">>",
           ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.Mod: "%", ast.And: "and", ast.Or: "or"}


@dataclass
class Mutant:
    id: str
    line: int  # the line of the id (where the operator or constant is)
    stmt_lines: tuple  # the lines whose coverage selects the tests
    walk: int  # index of the node in ast.walk(ast.parse(source))
    kind: str  # cmp, bin, aug, const, boolop, not, raise, return
    arg: object  # cmp: (op index, new op name); bin/aug: new op name; const: new value
    original: str = ""
    mutated: str = ""
    jitted: bool = False
    result: str = ""  # killed, survived, not covered, timeout, equivalent, invalid
    seconds: float = 0.0
    tests: int = 0  # how many test ids ran it (-1: the whole test files)


def _is_jit_decorator(d) -> bool:
    if isinstance(d, ast.Call):
        d = d.func
    if isinstance(d, ast.Name):
        return d.id in JIT_DECORATORS
    if isinstance(d, ast.Attribute):
        return d.attr in JIT_DECORATORS
    return False


def _is_main_guard(node) -> bool:
    t = node.test
    return (isinstance(node, ast.If) and isinstance(t, ast.Compare) and isinstance(t.left, ast.Name)
            and t.left.id == "__name__")


class _Finder:
    """Walks a module and lists its mutants (in ast.walk order, each with a unique id)."""

    def __init__(self, source: str):
        self.source = source
        self.lines = source.splitlines()
        self.blines = [ln.encode() for ln in self.lines]
        self.tree = ast.parse(source)
        self.nodes = list(ast.walk(self.tree))
        self.index = {id(n): i for i, n in enumerate(self.nodes)}
        self.skip: set[int] = set()  # ids of nodes not to mutate (and their subtrees)
        self.stmt_of: dict[int, ast.stmt] = {}
        self.jitted: set[int] = set()
        self.pragma = {i + 1 for i, ln in enumerate(self.lines) if PRAGMA in ln}
        self._mark(self.tree, None, False, False)

    def _mark(self, node, stmt, skipped, jitted):
        if isinstance(node, ast.stmt):
            stmt = node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            jitted = jitted or any(_is_jit_decorator(d) for d in node.decorator_list)
        if skipped:
            self.skip.add(id(node))
        self.stmt_of[id(node)] = stmt
        if jitted:
            self.jitted.add(id(node))
        # the parts never mutated
        quiet = set()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            quiet.update(id(d) for d in node.decorator_list)
            if getattr(node, "returns", None) is not None:
                quiet.add(id(node.returns))
        if isinstance(node, ast.arg) and node.annotation is not None:
            quiet.add(id(node.annotation))
        if isinstance(node, ast.AnnAssign):
            quiet.add(id(node.annotation))
        if isinstance(node, ast.FormattedValue) and node.format_spec is not None:
            quiet.add(id(node.format_spec))
        if isinstance(node, ast.If) and _is_main_guard(node):
            skipped = True
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                quiet.add(id(first))
        for child in ast.iter_child_nodes(node):
            self._mark(child, stmt, skipped or id(child) in quiet, jitted)

    # positions -------------------------------------------------------------------------
    def _after(self, line: int, col: int):
        """The first (line, col) at or after (line, col) that is not space, a bracket, a line
        continuation or a comment: where an operator between two operands starts."""
        while line <= len(self.blines):
            b = self.blines[line - 1]
            while col < len(b) and b[col:col + 1] in (b" ", b"\t", b"(", b")", b"\\"):
                col += 1
            if col < len(b) and b[col:col + 1] != b"#":
                return line, col
            line, col = line + 1, 0
        return None

    def _op_pos(self, left, right):
        pos = self._after(left.end_lineno, left.end_col_offset)
        if pos is None or (pos[0], pos[1]) > (right.lineno, right.col_offset):
            return left.end_lineno, left.end_col_offset
        return pos

    def _splice(self, line: int, col: int, old: str, new: str) -> str:
        b = self.blines[line - 1]
        if b[col:col + len(old.encode())] != old.encode():
            return ""
        return (b[:col] + new.encode() + b[col + len(old.encode()):]).decode().strip()

    # the list --------------------------------------------------------------------------
    def mutants(self) -> list[Mutant]:
        out: list[Mutant] = []
        seen: dict[str, int] = {}

        def add(node, line, col, what, kind, arg, spliced, end_node=None):
            if line in self.pragma:
                return
            base = f"L{line}:{col} {what}"
            n = seen.get(base, 0)
            seen[base] = n + 1
            mid = base if n == 0 else f"{base}#{n + 1}"
            # the lines whose tests run the mutant: its statement's first line to the mutated
            # node's last (a compound statement's header only; a simple statement whole)
            stmt = self.stmt_of[id(node)] or node
            last = (end_node or node).end_lineno or line
            lines = tuple(range(min(stmt.lineno, line), max(last, line) + 1))
            m = Mutant(mid, line, lines, self.index[id(node)], kind, arg,
                       original=self.lines[line - 1].strip(), jitted=id(node) in self.jitted)
            m.mutated = spliced or ""
            out.append(m)

        for node in self.nodes:
            if id(node) in self.skip:
                continue
            if isinstance(node, ast.Compare):
                left = node.left
                for i, (op, right) in enumerate(zip(node.ops, node.comparators)):
                    line, col = self._op_pos(left, right)
                    sym = _SYMBOL[type(op)]
                    for new in [_CMP_FLIP.get(type(op)), _CMP_EDGE.get(type(op))]:
                        if new is None:
                            continue
                        what = f"{type(op).__name__}->{new.__name__}"
                        add(node, line, col, what, "cmp", (i, new.__name__), self._splice(line, col, sym, _SYMBOL[new]))
                    left = right
            elif isinstance(node, (ast.BinOp, ast.AugAssign)):
                ops = _BIN_SWAP.get(type(node.op), [])
                if not ops:
                    continue
                if isinstance(node, ast.BinOp):
                    line, col = self._op_pos(node.left, node.right)
                else:
                    line, col = self._op_pos(node.target, node.value)
                sym = _SYMBOL[type(node.op)] + ("=" if isinstance(node, ast.AugAssign) else "")
                for new in ops:
                    nsym = _SYMBOL[new] + ("=" if isinstance(node, ast.AugAssign) else "")
                    what = f"{type(node.op).__name__}->{new.__name__}"
                    add(node, line, col, what, "bin" if isinstance(node, ast.BinOp) else "aug", new.__name__,
                        self._splice(line, col, sym, nsym))
            elif isinstance(node, ast.Constant) and type(node.value) in (int, bool):
                text = ast.get_source_segment(self.source, node) or repr(node.value)
                if node.value is True or node.value is False:
                    news = [not node.value]
                else:
                    news = [node.value + 1, node.value - 1]
                for new in news:
                    what = f"{node.value}->{new}"
                    sp = self._splice(node.lineno, node.col_offset, text, repr(new)) if node.lineno == node.end_lineno else ""
                    add(node, node.lineno, node.col_offset, what, "const", new, sp)
            elif isinstance(node, ast.BoolOp):
                line, col = self._op_pos(node.values[0], node.values[1])
                old, new = (ast.And, ast.Or) if isinstance(node.op, ast.And) else (ast.Or, ast.And)
                sp = self._splice(line, col, _SYMBOL[old], _SYMBOL[new])
                if len(node.values) > 2:
                    sp = ""
                add(node, line, col, f"{old.__name__}->{new.__name__}", "boolop", new.__name__, sp)
            elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
                sp = ""
                if node.lineno == node.end_lineno:
                    seg = ast.get_source_segment(self.source, node) or ""
                    inner = ast.get_source_segment(self.source, node.operand) or ""
                    sp = self._splice(node.lineno, node.col_offset, seg, inner) if seg else ""
                add(node, node.lineno, node.col_offset, "Not->Id", "not", None, sp)
            elif isinstance(node, ast.Raise):
                add(node, node.lineno, node.col_offset, "raise->pass", "raise", None, "pass")
            elif isinstance(node, ast.Return):
                if node.value is None or (isinstance(node.value, ast.Constant) and node.value.value is None):
                    continue
                add(node, node.lineno, node.col_offset, "return->None", "return", None, "return None",
                    end_node=node.value)
        return out


def apply(source: str, m: Mutant) -> tuple[str, str]:
    """The module text with mutant ``m`` applied, and the mutated statement's text."""
    tree = ast.parse(source)
    nodes = list(ast.walk(tree))
    node = nodes[m.walk]
    parents = {}
    for p in nodes:
        for f, v in ast.iter_fields(p):
            if isinstance(v, list):
                for i, c in enumerate(v):
                    if isinstance(c, ast.AST):
                        parents[id(c)] = (p, f, i)
            elif isinstance(v, ast.AST):
                parents[id(v)] = (p, f, None)

    def replace(old, new):
        p, f, i = parents[id(old)]
        ast.copy_location(new, old)
        if i is None:
            setattr(p, f, new)
        else:
            getattr(p, f)[i] = new
        return new

    shown = node
    if m.kind == "cmp":
        i, new = m.arg
        node.ops[i] = getattr(ast, new)()
    elif m.kind in ("bin", "aug"):
        node.op = getattr(ast, m.arg)()
    elif m.kind == "const":
        node.value = m.arg
    elif m.kind == "boolop":
        node.op = getattr(ast, m.arg)()
    elif m.kind == "not":
        shown = replace(node, node.operand)
    elif m.kind == "raise":
        shown = replace(node, ast.Pass())
    elif m.kind == "return":
        node.value = ast.Constant(None)
    else:  # pragma: no cover
        raise ValueError(m.kind)
    ast.fix_missing_locations(tree)
    return ast.unparse(tree), ast.unparse(shown)


# ------------------------------------------------------------------------------- the tests


def mapped_tests(module: str) -> list[str]:
    """The test files tests/README.md maps ``module`` to (its row, else its deepest folder's)."""
    text = (ROOT / "tests" / "README.md").read_text()
    text = text.split("## Where the tests of a module are", 1)[-1]
    text = re.split(r"\n## ", text, maxsplit=1)[0]  # that section only
    rows = {}
    for ln in text.splitlines():
        m = re.match(r"\|\s*`([^`]+)`\s*\|\s*([^|]+)\|", ln)
        if m:
            rows[m.group(1)] = [t.strip() for t in m.group(2).split(",") if t.strip()]
    if module in rows:
        return rows[module]
    best = None
    for key in rows:
        if key.endswith("/") and module.startswith(key) and (best is None or len(key) > len(best)):
            best = key
    return rows[best] if best else []


def equivalents(module: str) -> dict[str, str]:
    text = (ROOT / "tests" / "README.md").read_text()
    part = text.split("## Equivalent mutants", 1)
    out = {}
    if len(part) < 2:
        return out
    body = re.split(r"\n## ", part[1], maxsplit=1)[0]
    for ln in body.splitlines():
        cells = [c.strip().strip("`").strip() for c in ln.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] == module:
            out[cells[1]] = cells[2]
    return out


# ------------------------------------------------------------------------------- the runs


class Worker:
    def __init__(self, base: Path, n: int, module: str):
        self.dir = base / f"w{n}"
        self.dir.mkdir()
        for name in COPIED:
            src = ROOT / name
            if src.is_dir():
                shutil.copytree(src, self.dir / name, copy_function=shutil.copy2, symlinks=True,
                                ignore=shutil.ignore_patterns(".pytest_cache", ".hypothesis"))
            elif src.exists():
                shutil.copy2(src, self.dir / name)
        self.target = self.dir / module
        self.original = ROOT / module
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = str(self.dir) + (os.pathsep + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else "")
        self.env.pop("PYTEST_ADDOPTS", None)
        self.stamp = int(os.stat(self.original).st_mtime) + 10_000
        self.dependents: list[Path] = []

    def _forget_bytecode(self):
        cache = self.target.parent / "__pycache__"
        for p in cache.glob(self.target.stem + ".cpython-*.pyc"):
            p.unlink(missing_ok=True)
        for dep in self.dependents:  # Numba caches do not see a change in an imported module
            for p in list((dep.parent / "__pycache__").glob(dep.stem + ".*.nb[ic]")):
                p.unlink(missing_ok=True)

    def write(self, text: str):
        self.target.write_text(text)
        self.stamp += 1  # a new mtime for every mutant: no stale .pyc or Numba index can match
        os.utime(self.target, (self.stamp, self.stamp))
        self._forget_bytecode()

    def restore(self):
        shutil.copy2(self.original, self.target)
        self._forget_bytecode()

    def pytest(self, args: list[str], timeout: float | None, extra: list[str] = ()):
        """``python -m pytest -x -q -n 0 -p no:cacheprovider`` (one process) with ``args`` in
        the copy: (exit status, or None past ``timeout``; its output; seconds).  Through the
        fork server when it runs (not for ``extra`` options such as coverage's)."""
        if self.server is not None and not extra:
            got = self._served(args, timeout)
            if got is not None:
                return got
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider", *extra, *args]
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=self.dir, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.child = proc.pid
        try:
            out, _ = proc.communicate(timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            rc = None
        self.child = None
        return rc, out.decode(errors="replace"), time.monotonic() - t0

    # the fork server: a process of the copy that has imported the heavy third-party modules
    # (NumPy, Numba with its compiler started, pytest, hypothesis...) but nothing of the
    # project, and forks a child per run that runs pytest.main: each run skips those imports
    server = None
    child = None

    def start_server(self) -> bool:
        self.server = subprocess.Popen([sys.executable, "-c", _SERVER], cwd=self.dir, env=self.env, stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        if self.server.stdout.readline().strip() != "ready":
            self.stop_server()
            return False
        return True

    def stop_server(self):
        if self.server is not None:
            self.server.kill()
            self.server.wait()
            self.server = None

    def _served(self, args, timeout):
        log = self.dir.parent / f"{self.dir.name}.log"
        try:
            # the server imported pytest's plugins (hypothesis, pytest_timeout) before pytest could mark them for
            # assertion rewriting: that warning is the server's, not the run's
            quiet = ["-W", "ignore::pytest.PytestAssertRewriteWarning"]
            self.server.stdin.write(json.dumps({"args": ["-x", "-q", "-n", "0", "-p", "no:cacheprovider", *quiet, *args], "timeout": timeout,
                                                "log": str(log)}) + "\n")
            self.server.stdin.flush()
            reply = self.server.stdout.readline()
        except (BrokenPipeError, OSError):
            reply = ""
        if not reply:  # the server died: plain runs from now on
            self.stop_server()
            return None
        r = json.loads(reply)
        out = log.read_text(errors="replace") if log.exists() else ""
        return r["rc"], out, r["secs"]

    def kill(self):
        """Stop whatever runs now (on an interrupt)."""
        pidfile = self.dir.parent / f"{self.dir.name}.log.pid"
        for pid in [self.child] + ([int(pidfile.read_text() or 0)] if pidfile.exists() else []):
            if pid:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self.stop_server()


_SERVER = r"""
import json, os, signal, sys, time
for name in ("numpy", "numba", "llvmlite.binding", "scipy", "scipy.linalg", "zstandard", "ml_dtypes", "crc32c",
             "hypothesis", "hypothesis.strategies", "rich", "safetensors", "pytest", "_pytest.python", "pytest_timeout"):
    try:
        __import__(name)
    except Exception:
        pass
try:  # start Numba's compiler (LLVM) once, without starting any thread
    import numba
    numba.njit(lambda x: x + 1)(1)
except Exception:
    pass
assert not any(m == "codec" or m.startswith(("codec.", "transport")) for m in sys.modules), "the server imported the project"
import pytest
sys.stdout.write("ready\n")
sys.stdout.flush()
for line in sys.stdin:
    if not line.strip():
        continue
    req = json.loads(line)
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            rc = pytest.main(req["args"])
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(int(rc))
        except BaseException:
            import traceback
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(99)
    with open(req["log"] + ".pid", "w") as f:
        f.write(str(pid))
    deadline = None if req["timeout"] is None else t0 + req["timeout"]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
            break
        if deadline is not None and time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            rc = None
            break
        time.sleep(0.02)
    try:  # what the run left in its session (a subprocess of a test)
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    os.remove(req["log"] + ".pid")
    sys.stdout.write(json.dumps({"rc": rc, "secs": time.monotonic() - t0}) + "\n")
    sys.stdout.flush()
"""


def _dependents(worker: Worker, module: str) -> list[Path]:
    """Files of the copy holding Numba-jitted code that import ``module``: their on-disk
    caches would keep the original's compiled code, so they are dropped before each run."""
    dotted = module[:-3].replace("/", ".")
    pkg, _, stem = dotted.rpartition(".")
    pat = re.compile(rf"(from\s+{re.escape(dotted)}\s+import|import\s+{re.escape(dotted)}\b|from\s+{re.escape(pkg)}\s+import\s+[^\n]*\b{stem}\b|from\s+\.{stem}\s+import)")
    out = []
    for p in (worker.dir / "codec").rglob("*.py"):
        if p == worker.target:
            continue
        text = p.read_text(errors="replace")
        if pat.search(text) and re.search(r"@(\w+\.)*(jit|njit)\b", text):
            out.append(p)
    return out


def _reason(output: str) -> str:
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith(("FAILED", "ERROR")):
            return ln[:200]
    return (lines[-1] if lines else "no output")[:200]


def coverage_map(worker: Worker, module: str, files: list[str], base: Path):
    """{line: set of test ids} from one run of ``files`` under coverage, a context per test."""
    rc_file = base / "coveragerc"
    data_file = base / "coverage.data"
    rc_file.write_text(f"[run]\ninclude = {worker.target}\ndata_file = {data_file}\n")
    rc, out, secs = worker.pytest(files, None, ["--cov", f"--cov-config={rc_file}", "--cov-context=test",
                                                "--cov-report="])
    if rc != 0:
        return None, out, secs
    import coverage

    data = coverage.CoverageData(basename=str(data_file))
    data.read()
    target = str(worker.target.resolve())
    by_line: dict[int, set] = {}
    for f in data.measured_files():
        if str(Path(f).resolve()) != target:
            continue
        for line, contexts in data.contexts_by_lineno(f).items():
            s = by_line.setdefault(line, set())
            for c in contexts:
                s.add(c.rsplit("|", 1)[0] if c else "")
    return by_line, out, secs


class _Nothing(Exception):
    """No mutant to run (all equivalent, or none left by --survivors): no copy, no baseline."""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See the module docstring (scripts/mutate.py) and docs/robustness.md, 'Mutation testing'.")
    ap.add_argument("module", help="e.g. codec/spec.py")
    ap.add_argument("--tests", nargs="+", help="test files (default: those tests/README.md maps the module to)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--sample", type=int, help="run a random sample of N mutants")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lines", help="only the mutants on lines A-B")
    ap.add_argument("--json", help="write every mutant and its result here")
    ap.add_argument("--no-fork", action="store_true",
                    help="start a fresh Python for every run (default: fork it from a server that has imported NumPy, Numba, pytest)")
    ap.add_argument("--survivors", action="store_true",
                    help="rerun only the survivors recorded in the --json file by an earlier run, and merge")
    a = ap.parse_args(argv)
    t_start = time.monotonic()

    path = Path(a.module).resolve() if Path(a.module).exists() else ROOT / a.module
    try:
        module = path.relative_to(ROOT).as_posix()
    except ValueError:
        print(f"mutate: {a.module} is not inside {ROOT}", file=sys.stderr)
        return 2
    if not path.is_file() or not module.endswith(".py"):
        print(f"mutate: no such module {module}", file=sys.stderr)
        return 2
    source = path.read_text()
    digest = hashlib.sha256(source.encode()).hexdigest()

    notes = []
    if a.tests:
        files = [t if "/" in t else f"tests/{t}" for t in a.tests]
    else:
        names = mapped_tests(module)
        files = []
        for t in names:
            if t in SLOW_TESTS:
                notes.append(f"left out {t} ({SLOW_TESTS[t]}; name it with --tests to include it)")
            elif t.startswith("test_"):
                files.append(f"tests/{t}")
        if not files:
            print(f"mutate: tests/README.md maps no test file to {module}; name them with --tests", file=sys.stderr)
            return 2
    for f in files:
        if not (ROOT / f).exists():
            print(f"mutate: no such test file {f}", file=sys.stderr)
            return 2

    mutants = _Finder(source).mutants()
    total_found = len(mutants)
    if a.lines:
        lo, _, hi = a.lines.partition("-")
        lo, hi = int(lo), int(hi or lo)
        mutants = [m for m in mutants if lo <= m.line <= hi]
    if a.sample and a.sample < len(mutants):
        mutants = sorted(random.Random(a.seed).sample(mutants, a.sample), key=lambda m: m.walk)
    equiv = equivalents(module)
    known = {m.id for m in _Finder(source).mutants()}
    stale = sorted(set(equiv) - known)
    if stale:
        notes.append(f"tests/README.md lists equivalent mutants that {module} no longer has: {', '.join(stale)}")

    previous = {}
    if a.survivors:
        if not a.json or not Path(a.json).exists():
            print("mutate: --survivors needs the --json file of an earlier run", file=sys.stderr)
            return 2
        prev = json.loads(Path(a.json).read_text())
        if prev.get("sha256") != digest or prev.get("module") != module:
            print(f"mutate: {a.json} was written for another text of {module}; run without --survivors", file=sys.stderr)
            return 2
        previous = {m["id"]: m for m in prev["mutants"]}
        again = ("survived", "not covered", "invalid", None)  # and an equivalent one the table no longer lists
        mutants = [m for m in mutants if previous.get(m.id, {}).get("result") in again
                   or (previous[m.id]["result"] == "equivalent" and m.id not in equiv)]

    for m in mutants:
        if m.id in equiv:
            m.result = "equivalent"
        try:
            text, shown = apply(source, m)
            compile(text, module, "exec")
            m._text = text
            if not m.mutated:
                m.mutated = shown.strip().splitlines()[0] if shown.strip() else shown
        except (SyntaxError, ValueError, RecursionError) as e:
            m.result = m.result or "invalid"
            m.mutated = f"(does not compile: {e})"
    todo = [m for m in mutants if not m.result]

    print(f"mutate: {module}: {total_found} mutants, {len(mutants)} selected, {len(todo)} to run, tests: {' '.join(files)}")
    for n in notes:
        print(f"mutate: {n}")
    sys.stdout.flush()

    base = Path(tempfile.mkdtemp(prefix="mutate-"))
    workers: list[Worker] = []
    try:
        if not todo:
            raise _Nothing
        jobs = max(1, min(a.jobs, len(todo) or 1))
        workers = [Worker(base, i, module) for i in range(jobs)]
        w0 = workers[0]
        check = subprocess.run([sys.executable, "-c", "import codec; print(codec.__file__)"], cwd=w0.dir, env=w0.env,
                               capture_output=True, text=True)
        imported = check.stdout.strip()
        print(f"mutate: the copy's codec is imported: {imported}")
        if not imported.startswith(str(w0.dir)):
            print(f"mutate: baseline failed: the tests would import {imported or check.stderr.strip()[-200:]}, not the copy")
            return 2
        deps = _dependents(w0, module) if (_Finder(source).jitted) else []
        if deps:
            print(f"mutate: Numba caches dropped before each run (they import {module}): "
                  + ", ".join(str(p.relative_to(w0.dir)) for p in deps))
        for w in workers:
            w.dependents = [w.dir / p.relative_to(w0.dir) for p in deps]

        by_line, out, secs = coverage_map(w0, module, files, base)
        if by_line is None:
            print(f"mutate: baseline failed: the tests fail on the unmutated module ({_reason(out)})")
            return 2
        print(f"mutate: baseline under coverage {secs:.1f} s, {sum(1 for v in by_line.values() if v - {''})} lines run by tests")

        def selection(m: Mutant):
            if m.jitted:
                return list(files)
            ids = set()
            for ln in m.stmt_lines:
                ids |= by_line.get(ln, set())
            if "" in ids:  # run at import or collection time: every test may depend on it
                return list(files)
            return sorted(ids)

        for m in todo:
            sel = selection(m)
            if not sel:
                m.result = "not covered"
            m._sel = sel
        runnable = [m for m in todo if not m.result]

        if not a.no_fork:
            started = [w.start_server() for w in workers]
            if not all(started):
                print("mutate: the fork server did not start; each run starts its own Python")
        # the module as ast.unparse writes it, unmutated, must pass every selected test
        everything = sorted({t for m in runnable for t in m._sel}) or list(files)
        if any("::" not in t for t in everything):
            everything = list(files)
        w0.write(ast.unparse(ast.parse(source)))
        rc, out, null_secs = w0.pytest(everything, None)
        w0.restore()
        if rc == 4 and any("::" in t for t in everything):  # a test id pytest cannot select: select functions
            notes.append("test ids with parameters could not be selected; whole functions run instead")
            for m in runnable:
                m._sel = sorted({re.sub(r"\[.*$", "", t) for t in m._sel})
            everything = sorted({t for m in runnable for t in m._sel})
            w0.write(ast.unparse(ast.parse(source)))
            rc, out, null_secs = w0.pytest(everything, None)
            w0.restore()
        if rc != 0:
            print(f"mutate: baseline failed: the module as ast.unparse writes it fails its tests ({_reason(out)})")
            return 2
        timeout = 3 * null_secs + 30
        print(f"mutate: baseline {null_secs:.1f} s; a mutant is killed after {timeout:.0f} s")
        sys.stdout.flush()

        q: queue.Queue = queue.Queue()
        for m in runnable:
            q.put(m)
        lock = threading.Lock()
        done = [0]

        stop = threading.Event()

        def work(w: Worker):
            while not stop.is_set():
                try:
                    m = q.get_nowait()
                except queue.Empty:
                    return
                w.write(m._text)
                rc, out, secs = w.pytest(m._sel, timeout)
                w.restore()
                if stop.is_set():
                    return
                m.seconds = round(secs, 2)
                m.tests = -1 if all("::" not in t for t in m._sel) else len(m._sel)  # -1: whole files
                m.result = "timeout" if rc is None else ("survived" if rc == 0 else "killed")
                with lock:
                    done[0] += 1
                    which = "all the tests" if m.tests < 0 else f"{m.tests} test{'s' if m.tests > 1 else ''}"
                    print(f"  [{done[0]}/{len(runnable)}] {m.id}: {m.result} ({secs:.1f} s, {which})",
                          file=sys.stderr, flush=True)

        threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in workers]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.5)
        except KeyboardInterrupt:
            stop.set()
            for w in workers:
                w.kill()
            print("mutate: interrupted", file=sys.stderr)
            return 130
    except _Nothing:
        pass
    finally:
        for w in workers:
            w.kill()
        shutil.rmtree(base, ignore_errors=True)

    # merge with an earlier run (--survivors), then score
    results = {m.id: m for m in mutants}
    rows = []
    if previous:
        for mid, pm in previous.items():
            rows.append(asdict(results[mid]) if mid in results else pm)
    else:
        rows = [asdict(m) for m in mutants]
    for r in rows:  # the table may have changed since the earlier run
        if r["id"] in equiv:
            r["result"] = "equivalent"
        elif r["result"] == "equivalent":
            r["result"] = "survived"
    rows.sort(key=lambda r: (r["line"], r["walk"]))
    for r in rows:
        if r["result"] in ("survived", "not covered"):
            tag = " (not covered)" if r["result"] == "not covered" else ""
            print(f"{r['id']}{tag}: {r['original']}  ->  {r['mutated']}")
    n_equiv = sum(r["result"] == "equivalent" for r in rows)
    n_invalid = sum(r["result"] == "invalid" for r in rows)
    killed = sum(r["result"] in ("killed", "timeout") for r in rows)
    survived = sum(r["result"] in ("survived", "not covered") for r in rows)
    uncovered = sum(r["result"] == "not covered" for r in rows)
    total = len(rows) - n_equiv - n_invalid
    elapsed = time.monotonic() - t_start
    pct = 100.0 * killed / total if total else 100.0
    scope = ""
    if a.sample or a.lines:
        scope = f" (of {'a sample' if a.sample else 'lines ' + a.lines}; seed {a.seed})" if a.sample else f" (lines {a.lines})"
    extra = f", {uncovered} of them not covered" if uncovered else ""
    extra += f", {n_invalid} not compilable left out" if n_invalid else ""
    print(f"{module}: {killed} of {total} non-equivalent mutants killed ({pct:.1f}%){scope}, {n_equiv} equivalent left out, "
          f"{survived} survived{extra}, {elapsed:.0f} s")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "module": module, "sha256": digest, "tests": files, "notes": notes, "killed": killed,
            "non_equivalent": total, "equivalent": n_equiv, "survived": survived, "percent": round(pct, 1),
            "seconds": round(elapsed, 1), "sample": a.sample, "seed": a.seed, "lines": a.lines,
            "mutants": [{k: v for k, v in r.items()} for r in rows]}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
