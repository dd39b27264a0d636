"""Compile every CUDA twin kernel for a real GPU (PTX for an H200, sm_90) on a machine without
one, with the argument types its launches have: catches what the simulator cannot (typing
of device functions, tuple returns, libdevice calls, shared-memory arrays, dtype
promotions), since the simulator runs the kernels as Python.

    python scripts/cuda_compile_check.py record SIGS.json -- <pytest args>   # in the simulator
    python scripts/cuda_compile_check.py compile SIGS.json [--cc 9.0]       # NVVM, no GPU

``record`` runs pytest (``NUMBA_ENABLE_CUDASIM=1``; default ``tests/cuda``) and writes every
distinct (module, kernel, argument types) it launched: the twins' kernels, and the tests' own
kernels (which reach device functions no twin kernel calls, as the rng family's).  ``compile`` compiles each of them
with ``numba.cuda.compile_ptx`` (it needs NVVM and NVRTC: ``pip install nvidia-nvvm
nvidia-cuda-nvrtc nvidia-cuda-nvcc``) and exits 1 listing every kernel that does not compile,
and every kernel of ``codec`` whose PTX holds a fused multiply-add (``fma.rn.f32`` /
``fma.rn.f64``): NVVM contracts ``a * b + c`` by default, the CPU rounds the product first,
and every twin promises the CPU's results bit for bit (a twin lists the kernels whose fused
multiply-adds are their rule in its ``FUSED``: PowerSGD's decode).
"""

from __future__ import annotations

import importlib
import json
import re
import os
import subprocess
import sys
import time


def _record_plugin_source(path: str) -> str:
    return f'''
import atexit, json
import numba
from numba.cuda.simulator import kernel

_seen = set()
_call = kernel.FakeCUDAKernel.__call__


def _type(a):
    t = getattr(a, "_numba_type_", None)
    t = t if t is not None else numba.typeof(a)
    if isinstance(t, numba.types.Array):
        return ["array", str(t.dtype), t.ndim, t.layout]
    return ["scalar", str(t)]


def _recording(self, *args):
    if not self._device:
        where = self.fn.__module__ if self.fn.__module__.startswith("codec.") else self.fn.__code__.co_filename
        _seen.add(json.dumps([where, self.fn.__name__, [_type(a) for a in args]]))
    return _call(self, *args)


kernel.FakeCUDAKernel.__call__ = _recording
atexit.register(lambda: json.dump([json.loads(s) for s in sorted(_seen)], open({path!r}, "w"), indent=0))
'''


def record(path: str, pytest_args: list[str]) -> int:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "_record_launches.py"), "w") as f:
            f.write(_record_plugin_source(os.path.abspath(path)))
        env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=os.pathsep.join([tmp, os.environ.get("PYTHONPATH", "")]))
        cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "_record_launches", "-p", "no:cacheprovider", *(pytest_args or ["tests/cuda"])]
        return subprocess.call(cmd, env=env)


def compile_all(path: str, cc: tuple[int, int]) -> int:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        raise SystemExit("compile: run without NUMBA_ENABLE_CUDASIM (it compiles for the real target)")
    from numba import cuda, types
    from numba.cuda import compiler, dispatcher

    class Device:  # no GPU here: device functions compile for ``cc`` as a kernel does
        compute_capability = cc

    dispatcher.get_current_device = compiler.get_current_device = lambda: Device()

    def numba_type(t):
        if t[0] == "array":
            return types.Array(_scalar(types, t[1]), t[2], t[3])
        return _scalar(types, t[1])

    sigs = json.load(open(path))
    failed = []
    t0 = time.perf_counter()
    for module, name, args in sigs:
        try:  # every failure is reported (an unreachable kernel, a type this script cannot name, a compile error)
            kern = getattr(_module(module), name)
            sig = tuple(numba_type(t) for t in args)
            ptx, _ = cuda.compile_ptx(kern.py_func, sig, cc=cc)
            fused = sorted(set(re.findall(r"\bfma\.\w+\.f\d+", ptx)))
            if module.startswith("codec.") and fused and name not in getattr(_module(module), "FUSED", ()):
                raise ArithmeticError(f"{', '.join(fused)}: a fused multiply-add rounds once where the CPU rounds the product first (write it with _common.mul / mul32)")
        except Exception as e:
            failed.append((module, name, args, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
    print(f"{len(sigs) - len(failed)} of {len(sigs)} kernel signatures compiled for sm_{cc[0]}{cc[1]} in {time.perf_counter() - t0:.1f} s")
    for module, name, sig, why in failed:
        print(f"FAILED {module}.{name} {sig}\n    {why}")
    return 1 if failed else 0


def _module(where: str):
    """The module a recorded kernel lives in: a ``codec`` module by name, a test's (whose
    kernels drive device functions, as the rng twins') by file."""
    if not where.endswith(".py"):
        return importlib.import_module(where)
    from importlib import util

    name = "_compiled_" + os.path.splitext(os.path.basename(where))[0]
    if name not in sys.modules:
        spec = util.spec_from_file_location(name, where)
        sys.modules[name] = mod = util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    return sys.modules[name]


def _scalar(types, name: str):
    """The Numba scalar type printed as ``name`` (``bool`` is ``types.boolean``)."""
    return types.boolean if name == "bool" else getattr(types, name)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("record", "compile"):
        print(__doc__)
        return 2
    if argv[0] == "record":
        rest = argv[2:]
        return record(argv[1], rest[1:] if rest[:1] == ["--"] else rest)
    cc = (9, 0)
    if "--cc" in argv:
        major, minor = argv[argv.index("--cc") + 1].split(".")
        cc = (int(major), int(minor))
    return compile_all(argv[1], cc)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
