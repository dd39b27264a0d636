"""The jit wrappers and the kernel lookup.

* ``codec._jit``: project options, and serial/parallel twins that agree bit for bit;
* ``codec._cuda_jit``: imports no ``numba.cuda`` until used, and its kernels run under the
  CUDA simulator (skipped where Numba's CUDA target is not installed);
* ``codec.kernels``: families discovered from ``codec/kernels/cpu/``, each one's ``__all__``
  exactly its public kernels, ``backend``/``module`` (``package=`` included) and their errors.
"""

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import codec.kernels
from codec import _cuda_jit, _jit
from codec.kernels import backend, families, module

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "codec" / "kernels" / "cpu"


def test_fastmath_is_refused():
    with pytest.raises(ValueError, match="fastmath"):
        _jit.jit(fastmath=True)


def test_parallel_kernels_pick_by_size_and_both_twins_agree():
    convert, pack, scatter = (module(f, "cpu") for f in ("convert", "pack", "scatter"))  # twins are the CPU wrapper's
    n = _jit.PARALLEL_MIN + 12_345
    rng = np.random.default_rng(0)
    x = (rng.standard_t(2, n) * 1e-3).astype(np.float32)
    runs = []
    for twin in ("serial", "parallel"):
        codes = np.empty(n, np.uint16)
        bad = getattr(convert.narrow_codes, twin)(x, codes, False, 3)  # (count, the codes' CRC-32C)
        dec = np.empty(n, np.float64)
        getattr(convert.half_decode, twin)(codes, dec, 0, False)
        packed = np.zeros((n * 11 + 7) // 8, np.uint8)
        getattr(pack._pack, twin)(codes.view(np.uint8), 2, 11, packed)
        idx = np.flatnonzero(np.abs(x) > 1e-3)
        out = np.ones(n, np.float32)
        getattr(scatter.gather, twin)(x, idx, out[: idx.size])
        runs.append((bad, codes.tobytes(), dec.tobytes(), packed.tobytes(), out.tobytes()))
    assert runs[0] == runs[1]


@_jit.jit(parallel=True)
def _scaled(x, out, by=2.0):
    for i in _jit.prange(out.size):
        out[i] = x[i] * by


def test_a_left_out_default_is_filled_in_before_numba_types_the_call():
    """A parallel kernel called with and without a defaulted argument compiles once: the
    wrapper passes the default (Numba types a left-out argument ``omitted``, a signature of
    its own); the twins themselves are plain dispatchers."""
    x = np.arange(5.0)
    out, again = np.empty(5), np.empty(5)
    _scaled(x, out)
    _scaled(x, again, 2.0)
    assert np.array_equal(out, 2 * x) and np.array_equal(again, out)
    assert len(_scaled.serial.signatures) == 1, _scaled.serial.signatures
    assert _scaled.complete((x, out)) == (x, out, 2.0)
    assert _scaled.complete((x, out, 3.0)) == (x, out, 3.0)


def test_a_kernel_names_its_work_when_its_first_argument_is_not_it():
    """The twin is picked by the first argument's size, or by ``work(*args)``: PowerSGD's
    decode gets a matrix's few coefficients first and writes the whole matrix, so it counts
    its output (a 2048 x 4608 decode at rank 4 ran on one thread); ``work`` without
    ``parallel`` is refused."""
    lowrank = module("lowrank", "cpu")
    p, qt, out = np.empty((3, 2), np.float32), np.empty((2, 5), np.float32), np.empty((3, 5), np.float32)
    assert lowrank.expand.items(p, qt, out) == 15
    ns, ms = np.array([3, 4], np.int64), np.array([5, 6], np.int64)
    assert lowrank.expand_segments.items(np.empty(4), None, ns, ms, None, None, None) == 39
    assert lowrank.power_segments.items(np.empty(4), None, None, None, ns, ms) == 39
    assert module("convert", "cpu").half_decode.items(np.empty(7, np.uint16), None) == 7
    with pytest.raises(ValueError, match="parallel"):
        _jit.jit(work=len)


@pytest.mark.parametrize("user", [None, "2"])
def test_numba_optimises_at_max_unless_the_user_chose(user):
    """``codec._jit`` sets ``NUMBA_OPT=max`` (a kernel's helpers optimised before they are
    linked in, so a kernel compiled in this process runs as fast as one loaded from the
    cache), even where Numba was imported first, and leaves a user's own level alone."""
    script = textwrap.dedent(
        """
        import os
        import numba
        numba.get_num_threads()  # (Numba imported and started before codec)
        import codec._jit
        from numba.core.registry import cpu_target
        cg = cpu_target.target_context.codegen()
        print(os.environ['NUMBA_OPT'], numba.core.config.OPT.is_opt_max, cg._loopvect)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_OPT"}
    if user is not None:
        env["NUMBA_OPT"] = user
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=True).stdout.split()
    assert out == (["max", "True", "True"] if user is None else ["2", "False", "False"])


# ---------------------------------------------------------------- codec._cuda_jit
def test_cuda_fastmath_is_refused():
    with pytest.raises(ValueError, match="fastmath"):
        _cuda_jit.jit(fastmath=True)


def test_importing_the_cuda_wrapper_imports_no_numba_cuda():
    code = "import sys, codec._cuda_jit; print([m for m in sys.modules if m.split('.')[0] == 'numba'])"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert r.stdout.strip() == "[]", r.stdout


CUDA_KERNEL = """
from codec._cuda_jit import jit, numba_cuda

cuda = numba_cuda()


@jit(device=True)
def twice(v):
    return 2 * v


@jit
def twice_plus_one(a, out):
    i = cuda.grid(1)
    if i < a.size:
        out[i] = twice(a[i]) + 1
"""

CUDA_RUN = """
import sys
try:
    import numba.cuda  # noqa: F401
except ImportError:
    print("no numba.cuda")
    sys.exit(0)
import numpy as np
import tiny
a = np.arange(70, dtype=np.float32)
out = np.zeros_like(a)
tiny.twice_plus_one[3, 32](a, out)  # three blocks, the last one partly idle
print("ok" if np.array_equal(out, 2 * a + 1) else f"wrong: {out}")
"""


def test_cuda_wrapper_kernel_runs_under_the_simulator(tmp_path):
    (tmp_path / "tiny.py").write_text(CUDA_KERNEL)
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    r = subprocess.run([sys.executable, "-c", CUDA_RUN], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    if r.stdout.strip() == "no numba.cuda":
        pytest.skip("Numba's CUDA target (numba-cuda) is not installed")
    assert r.stdout.strip() == "ok", r.stdout


# ---------------------------------------------------------------- codec.kernels lookup
def public_defs(path: Path) -> tuple[set, list | None]:
    """Public top-level functions of a kernel file and its ``__all__`` (None when absent)."""
    tree = ast.parse(path.read_text())
    defs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
    alls = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in n.targets)]
    return defs, (alls[0] if alls else None)


def test_families_are_the_public_cpu_files():
    files = sorted(p.stem for p in CPU.glob("*.py") if not p.stem.startswith("_"))
    assert families() == tuple(files) == families("codec.kernels")
    assert "quant" not in files and {"quantize", "bucket", "dequant", "elias"} <= set(files)


@pytest.mark.parametrize("family", families())
def test_every_family_declares_exactly_its_kernels(family):
    """``__all__`` is the contract a CUDA twin meets: every public function, nothing else."""
    defs, names = public_defs(CPU / f"{family}.py")
    assert names is not None, f"codec/kernels/cpu/{family}.py has no __all__"
    assert len(names) == len(set(names)) and set(names) == defs, (family, sorted(defs ^ set(names)))
    mod = module(family)
    assert all(callable(getattr(mod, name)) for name in names)


def test_lookup_errors():
    with pytest.raises(ValueError, match="no kernel family 'nope'; families: adacomp, bucket, convert"):
        backend("nope", np.zeros(3))
    with pytest.raises(ValueError, match="device: must be one of"):
        module("pack", "gpu")
    with pytest.raises(TypeError, match="no CUDA kernels for 'int8'"):  # (the recipe's kernel has no twin)
        module("int8", "cuda", package="recipe.kernels")


class FakeDeviceArray:
    """What dispatch looks at: a ``__cuda_array_interface__`` on something not a NumPy array."""

    __cuda_array_interface__ = {"shape": (3,), "typestr": "<f4", "data": (0, False), "version": 3}


def test_backend_picks_by_where_the_arrays_live():
    assert backend("scatter", np.zeros(3), np.zeros(2, np.int64)) is module("scatter", "cpu")
    assert backend("rng") is module("rng")
    with pytest.raises(TypeError, match="no CUDA kernels for 'int8'"):  # a family without a twin
        backend("int8", np.zeros(3), FakeDeviceArray(), package="recipe.kernels")


def test_kernels_outside_the_library(tmp_path, monkeypatch):
    """``package=``: ``<package>.cpu.<family>`` found by the same rules (a test-only stage's kernel)."""
    cpu = tmp_path / "outside" / "kernels" / "cpu"
    cpu.mkdir(parents=True)
    for d in (cpu.parents[1], cpu.parent, cpu):
        (d / "__init__.py").write_text("")
    (cpu / "_helpers.py").write_text("")
    (cpu / "twice.py").write_text(textwrap.dedent('''
        __all__ = ["twice"]


        def twice(x):
            return 2 * x
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    pkg = "outside.kernels"
    assert families(pkg) == ("twice",)
    kern = backend("twice", np.ones(2), package=pkg)
    assert kern is module("twice", package=pkg) and kern.__name__ == "outside.kernels.cpu.twice"
    assert kern.twice(np.ones(2)).tolist() == [2.0, 2.0]
    with pytest.raises(ValueError, match="no kernel family 'thrice' in outside.kernels; families: twice"):
        backend("thrice", np.ones(2), package=pkg)
    with pytest.raises(TypeError, match="no CUDA kernels for 'twice'"):
        backend("twice", FakeDeviceArray(), package=pkg)
