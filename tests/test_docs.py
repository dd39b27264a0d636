"""The docs' examples are the code's output: every ``$ command`` of docs/cli.md runs, in order,
in one scratch directory, and every line the docs show under it must appear in what it
printed, in that order (a line ``...`` skips any lines; a line with ``...`` in it matches a
printed line that starts with the text before the ``...``, e.g. a table row whose speeds
are left out; runs of blanks compare equal).  The README's Python example runs as it is
written, and so do docs/api.md's Python blocks, given the arrays they name.

Commands that start with ``gradcodec`` and use no shell syntax run in this process
(``codec.cli.main``); the rest run in bash with this interpreter's directory first on PATH."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from codec.cli import main

ROOT = Path(__file__).resolve().parent.parent
SHELL = re.compile(r"[;|&<>`$]")


def blocks(path: Path) -> list[tuple[int, list[str], str]]:
    """``(first line number, lines, language)`` of every fenced block of ``path``."""
    out, cur, lang, start = [], None, "", 0
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            if cur is None:
                cur, lang, start = [], line[3:].strip(), i + 1
            else:
                out.append((start, cur, lang))
                cur = None
        elif cur is not None:
            cur.append(line)
    return out


def examples(path: Path) -> list[tuple[str, list[str], int]]:
    """``(command, the lines shown under it, line number)`` of every ``$ `` line of ``path``'s
    plain blocks, in order; a command whose quotes are still open goes on over the next lines."""
    out = []
    for start, lines, lang in blocks(path):
        if lang:
            continue
        i = 0
        while i < len(lines):
            if not lines[i].startswith("$ "):
                i += 1
                continue
            at, cmd = start + i, lines[i][2:]
            while _open_quote(cmd) and i + 1 < len(lines):
                i += 1
                cmd += "\n" + lines[i]
            i += 1
            shown = []
            while i < len(lines) and not lines[i].startswith("$ "):
                shown.append(lines[i])
                i += 1
            out.append((cmd, shown, at))
    return out


def _open_quote(cmd: str) -> bool:
    try:
        shlex.split(cmd)
    except ValueError:
        return True
    return False


def run(cmd: str, cwd: Path) -> str:
    """What ``cmd`` prints (stdout then stderr), run in ``cwd``."""
    if cmd.startswith("gradcodec") and not SHELL.search(cmd):
        out, err = io.StringIO(), io.StringIO()
        here = os.getcwd()
        os.chdir(cwd)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                main(shlex.split(cmd)[1:])
        finally:
            os.chdir(here)
        return out.getvalue() + err.getvalue()
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    p = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return p.stdout + p.stderr


def mismatch(shown: list[str], printed: str) -> str | None:
    """The first shown line that is not in ``printed`` (in order), or None; runs of blanks
    compare equal (a table's column widths follow its widest cell)."""
    got = [" ".join(line.split()) for line in printed.splitlines()]
    at = 0
    for line in shown:
        want = " ".join(line.split())
        if not want or want == "...":
            continue
        prefix = " ".join(want[: want.index("...")].split()) if "..." in want else None
        for j in range(at, len(got)):
            if (got[j].startswith(prefix) if prefix is not None else got[j] == want):
                at = j + 1
                break
        else:
            return line
    return None


def test_cli_md_examples_are_the_output(tmp_path):
    """docs/cli.md: every example, its byte counts, ratios, errors and messages included."""
    cases = examples(ROOT / "docs" / "cli.md")
    assert len(cases) >= 15
    for cmd, shown, at in cases:
        printed = run(cmd, tmp_path)
        bad = mismatch(shown, printed)
        assert bad is None, f"docs/cli.md:{at}: `{cmd}`\nshows: {bad!r}\nprinted:\n{printed}"


def test_the_examples_are_checked_as_written():
    """The matching itself: order, elision and prefixes."""
    printed = "a 1\nrow 5 0.3 0.2\nb 2\n"
    assert mismatch(["a 1", "...", "b 2"], printed) is None
    assert mismatch(["row 5 ...", "b 2"], printed) is None
    assert mismatch(["b 2", "a 1"], printed) == "a 1"
    assert mismatch(["row 6 ..."], printed) == "row 6 ..."


def test_the_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    """The README's first Python block (the library in one screen) runs as written; the
    later ones need ranks (MPI) or a DDP model."""
    monkeypatch.chdir(tmp_path)
    start, lines, _ = next(b for b in blocks(ROOT / "README.md") if b[2] == "python")
    exec(compile("\n".join(lines), f"README.md:{start}", "exec"), {})
    assert capsys.readouterr().out.strip()


#: what docs/api.md's Python blocks take as given (their arguments), by block
API_GIVEN = [
    """
import numpy as np
x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
buf = bytearray(1 << 16)
acc = np.zeros_like(x)
gw, gb = x, x[0].copy()
grads = {"w": gw.copy(), "b": gb.copy()}
accs = {"w": np.zeros_like(gw), "b": np.zeros_like(gb)}
key, values = "layer1.weight", np.ones(x.shape, np.float32)
""",
    "import codec\nstages = codec.parse_spec('topk(ratio=0.01)+fp16')\n",
    """
import numpy as np, zarr
from codec.storage.zarr3 import GradcodecZarr
store = zarr.storage.MemoryStore()
grads = np.random.default_rng(1).standard_normal((1000, 512)).astype(np.float32)
""",
]


def test_the_api_md_python_blocks_run(tmp_path, monkeypatch):
    """docs/api.md's Python blocks run as written, given the arrays they name (API_GIVEN)."""
    import pytest

    pytest.importorskip("zarr")
    monkeypatch.chdir(tmp_path)
    found = [(start, lines) for start, lines, lang in blocks(ROOT / "docs" / "api.md") if lang == "python"]
    assert len(found) == len(API_GIVEN), "docs/api.md's Python blocks changed: give each its arrays in API_GIVEN"
    for (start, lines), given in zip(found, API_GIVEN):
        ns: dict = {}
        exec(given, ns)
        exec(compile("\n".join(lines), f"docs/api.md:{start}", "exec"), ns)
