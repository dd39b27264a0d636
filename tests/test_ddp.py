"""The DDP communication hook (transport/ddp.py) on gloo: tests/torch_ddp.py in 2 and 4
processes spawned from here (a timeout kills them), on NCCL where a GPU is (skipped
otherwise), and the state's checks in this process."""

from __future__ import annotations

import functools
import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from codec.errors import CodecError  # noqa: E402
from transport.ddp import GradcodecState  # noqa: E402

TESTS = Path(__file__).resolve().parent
SCRIPT = TESTS / "torch_ddp.py"
#: processes -> the cases each launch runs
LAUNCHES = {2: ["hook", "warmup", "train", "checkpoint"], 4: ["hook"]}
ONE_THREAD = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@functools.lru_cache(maxsize=None)
def _launch(p: int) -> tuple:
    """The cases of ``LAUNCHES[p]`` in one job of ``p`` processes (run once)."""
    return _run(p, tuple(LAUNCHES[p]))


def _run(p: int, cases: tuple, env: dict | None = None, timeout: float = 300) -> tuple:
    """Start ``p`` processes of the script running ``cases``; ``(exit codes, output)`` (None
    codes: killed at the timeout)."""
    port = _free_port()
    base = dict(os.environ, **ONE_THREAD, **(env or {}), WORLD_SIZE=str(p), MASTER_PORT=str(port))
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH")]))
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), *cases], env=dict(base, RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(p)]
    end, codes, out = time.monotonic() + timeout, [], []
    for proc in procs:
        try:
            text, _ = proc.communicate(timeout=max(1.0, end - time.monotonic()))
            codes.append(proc.returncode)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            text, _ = proc.communicate()
            codes.append(None)
        out.append(text)
    return tuple(codes), "\n".join(out)


def test_a_checkpoint_restored_in_new_processes(tmp_path):
    """One job saves (model, optimizer, hook state and the next steps' gradients), a second job
    of new processes restores and must reproduce those gradients bit for bit."""
    for case in ("save", "restore"):
        codes, out = _run(2, (case,), {"GRADCODEC_CKPT_DIR": str(tmp_path)})
        assert codes == (0, 0) and all(f"OK {case} rank {r}/2" in out for r in range(2)), f"{case}: exit codes {codes}\n{out[-4000:]}"


@pytest.mark.parametrize("p,case", [(p, c) for p, cases in LAUNCHES.items() for c in cases])
def test_hook_on_gloo(p, case):
    codes, out = _launch(p)
    oks = {r for r in range(p) if f"OK {case} rank {r}/{p}" in out}
    problems = [ln for ln in out.splitlines() if ln.startswith((f"FAIL {case} ", "ERROR"))]
    assert oks == set(range(p)) and not problems, f"exit codes {codes}; " + "\n".join(problems[:30]) + "\n---\n" + out[-4000:]


@pytest.mark.skipif(not torch.cuda.is_available() or not torch.distributed.is_nccl_available(), reason="NCCL needs a CUDA GPU")
def test_hook_on_nccl():
    """The hook's device path (frames on the GPU, NCCL's collectives): one process a GPU, up to
    two (a job of one on a machine of one GPU still runs every device path)."""
    p = min(2, torch.cuda.device_count())
    codes, out = _run(p, ("hook", "train"), {"GRADCODEC_DDP_BACKEND": "nccl"})
    for case in ("hook", "train"):
        oks = {r for r in range(p) if f"OK {case} rank {r}/{p}" in out}
        assert oks == set(range(p)), f"{case}: exit codes {codes}\n{out[-4000:]}"


def test_the_state_refuses_inconsistent_arguments():
    with pytest.raises(CodecError, match="start_iter: expected an int >= 0"):
        GradcodecState(None, "fp16", start_iter=-1)
    with pytest.raises(CodecError, match="flat: powersgd compresses each parameter"):
        GradcodecState(None, "powersgd(rank=2)", flat=True)
    with pytest.raises(CodecError, match="error_feedback: expected True or False"):
        GradcodecState(None, "fp16", error_feedback=1)
    with pytest.raises(CodecError, match="spec: expected a spec string"):
        GradcodecState(None, 3)


def test_the_state_pickles_without_its_group():
    model = torch.nn.Linear(3, 2)
    state = GradcodecState(object(), "topk(ratio=0.5)", start_iter=3, model=model)  # (no group is up here: the reducer waits)
    state.iter = 5
    back = pickle.loads(pickle.dumps(state))
    assert (back.spec, back.start_iter, back.iter, back.process_group, back.flat) == ("topk(ratio=0.5)", 3, 5, None, False)
    assert back.bind(model).key(model.weight) == "weight"
