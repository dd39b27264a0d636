"""The transport on torch.distributed (transport/torchdist.py): the MPI transport's own
equivalence cases (tests/mpi_transport.py, tests/mpi_schemes.py) run with the communicator
swapped for a :class:`~transport.torchdist.TorchComm` over gloo: in this process on a group of
one (as the MPI cases run on ``COMM_SELF``), and under ``mpiexec`` on 2 and 4 ranks, where MPI
only finds the ranks and every collective of the cases' reducers goes through gloo."""

from __future__ import annotations

import functools
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mpi4py")

import mpi_schemes  # noqa: E402
import mpi_transport  # noqa: E402
from support.mpi import TORCH_BACKEND_ENV, TORCH_ENV, launch, torch_comm  # noqa: E402

import transport  # noqa: E402
from transport.torchdist import TorchComm, is_process_group  # noqa: E402

#: (script, ranks) -> the cases each launch runs: every transport case at 2 ranks (its
#: "all"), the schemes at 4 (gTop-k's tree folds; PowerSGD's rounds)
LAUNCHES = {
    (mpi_transport, 2): mpi_transport.ALL,
    (mpi_schemes, 4): list(mpi_schemes.CASES),
}


@pytest.fixture(scope="module")
def group_of_one():
    """A gloo group of this process alone (the torch counterpart of ``COMM_SELF``)."""
    import torch.distributed as dist

    comm = torch_comm(None)
    yield comm
    dist.destroy_process_group()


@pytest.mark.parametrize("case", ["codecs", "structure", "ef", "none", "out"])
def test_cases_on_a_group_of_one(group_of_one, case):
    assert not mpi_transport.run_case(group_of_one, case)


@pytest.mark.parametrize("case", ["gtopk", "powersgd"])
def test_scheme_cases_on_a_group_of_one(group_of_one, case):
    assert not mpi_schemes.run_case(group_of_one, case)


def test_a_process_group_is_taken_as_it_is(group_of_one):
    import torch.distributed as dist

    pg = dist.group.WORLD
    assert is_process_group(pg) and not is_process_group(group_of_one)
    red = transport.Allreducer("topk(ratio=0.5)", comm=pg)
    assert isinstance(red.comm, TorchComm)
    grads = {"w": torch.randn(6, 5), "b": torch.randn(5)}
    out = {k: torch.empty_like(v) for k, v in grads.items()}
    assert red.reduce(grads, out=out) is out
    with pytest.raises(pickle.PicklingError):
        pickle.dumps(red.comm)


@functools.lru_cache(maxsize=None)
def _launch(script, p: int):
    return launch(script.__file__, p, *LAUNCHES[(script, p)], timeout=240, env={TORCH_ENV: "1"})


@pytest.mark.parametrize("script,p,case", [(s, p, c) for (s, p), cases in LAUNCHES.items() for c in cases], ids=lambda v: getattr(v, "__name__", v))
def test_cases_on_gloo_under_mpiexec(script, p, case):
    run = _launch(script, p)
    problems = run.problems(case)
    assert not problems, run.report(problems)


def test_variable_frames_cost_the_padding(group_of_one):
    """Iallgatherv pads every rank's frame to the largest: what arrives is the frames."""
    comm = group_of_one
    msg = np.arange(7, dtype=np.uint8)
    recv = np.zeros(7, np.uint8)
    comm.Iallgatherv(msg, [recv, ([7], [0])]).Wait()
    assert np.array_equal(recv, msg)


@pytest.mark.skipif(not torch.cuda.is_available() or not torch.distributed.is_nccl_available(), reason="NCCL needs a CUDA GPU")
def test_device_cases_on_nccl():
    """tests/mpi_device.py's cases (device tensors, every scheme, against the host's bits) on
    NCCL, frames on the GPU: one rank a GPU, up to two."""
    import mpi_device

    p = min(2, torch.cuda.device_count())
    cases = ["codecs", "out", "schemes"]
    run = launch(mpi_device.__file__, p, *cases, timeout=600, env={TORCH_ENV: "1", TORCH_BACKEND_ENV: "nccl"})
    problems = [x for c in cases for x in run.problems(c)]
    assert not problems, run.report(problems)
