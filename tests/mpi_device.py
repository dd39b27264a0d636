"""The transport with device tensors, on any number of ranks; tests/cuda/test_cuda_transport.py
runs it under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1), in process on ``COMM_SELF``
and under ``mpiexec -n 2`` and ``-n 4``:

    NUMBA_ENABLE_CUDASIM=1 mpiexec -n P python -m mpi4py tests/mpi_device.py CASE [CASE ...]

Every rank reduces the same tensors twice, as host arrays and as device arrays, through two
Allreducers of one spec, and the device results must be the host's bit for bit, step after
step (error feedback's residuals carry between steps), with ``out=`` device arrays and with
buckets too.  The ``crossing`` case counts the bytes that cross between host and device in a
device step (the simulator's copies): about the frames this rank sends and receives, never
the tensors.  The harness is tests/support/mpi.py.
"""

from __future__ import annotations

import sys

import numpy as np
from numba import cuda

from reference.transport import F16, F32, F64, make_inputs
from support import cudasim
from support.mpi import Checks, main as harness_main, run_case as harness_run_case
from transport import Allreducer

#: small tensors (the simulator runs a few thousand threads a second): float16, float32,
#: float64 (device arrays have no bfloat16), a 2-D one, an empty one
LAYOUT = (("w", (30, 7), F32), ("h", (40,), F16), ("void", (0,), F32), ("d", (3, 5), F64))
#: a codec of each scheme with a device path, dense and sparse, and one of each staged scheme
SPECS = ("fp16", "topk(ratio=0.2)", "minmax(bits=4,bucket=16)", "none", "gtopk(ratio=0.2)", "powersgd(rank=1)")


def _device(tensors: dict) -> dict:
    return {k: cuda.to_device(v) for k, v in tensors.items()}


def _host(tensors: dict) -> dict:
    return {k: v.copy_to_host() for k, v in tensors.items()}


def _same(ck, got: dict, want: dict, label: str) -> bool:
    return all(ck.same(got[k], want[k], f"{label}: {k}") for k in want)


def case_codecs(comm, ck, specs=SPECS):
    """Each spec, two steps: the device results are the host's."""
    for spec in specs:
        on_host, on_dev = Allreducer(spec, comm), Allreducer(spec, comm)
        for step in range(2):
            x = make_inputs(7, ck.rank, step, LAYOUT)
            want = on_host.reduce(x)
            got = on_dev.reduce(_device(x))
            if not all(not isinstance(v, np.ndarray) for v in got.values()):
                return ck.fail(f"{spec}: device tensors gave host results")
            _same(ck, _host(got), want, f"{spec} step {step}")


def case_out(comm, ck):
    """``out=`` device arrays (the gradients themselves), and buckets of several tensors
    (not for powersgd, which codes each matrix alone)."""
    for spec in ("fp16", "topk(ratio=0.2)", "none", "powersgd(rank=2)"):
        for bucket in (0,) if spec.startswith("powersgd") else (0, 1 << 12):
            on_host, on_dev = Allreducer(spec, comm, bucket_bytes=bucket), Allreducer(spec, comm, bucket_bytes=bucket)
            x = make_inputs(8, ck.rank, 0, LAYOUT)
            want = on_host.reduce(x)
            d = _device(x)
            got = on_dev.reduce(d, out=d)
            ck.true(got is d, f"{spec}: reduce(out=) must return out")
            _same(ck, _host(d), want, f"{spec} bucket_bytes={bucket}")


def case_crossing(comm, ck):
    """The bytes that cross between host and device in one device step are about the frames
    this rank sends and receives (Stats: bytes_sent + bytes_received), never the tensors:
    within 1.1x of them plus 1 KiB a frame (its header read, a selection's counts and cuts:
    constant per frame; ``none``'s frames are the dense tensors, down once and up once)."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    big = (("w", (30, 40), F32), ("v", (400,), F32))
    moved = []
    real_host, real_dev, real_to = FakeCUDAArray.copy_to_host, FakeCUDAArray.copy_to_device, cuda.to_device

    def to_host(self, *a, **k):
        moved.append(self._ary.nbytes)
        return real_host(self, *a, **k)

    def to_dev(self, ary, *a, **k):
        if isinstance(ary, np.ndarray):  # (a device-to-device copy crosses nothing)
            moved.append(ary.nbytes)
        return real_dev(self, ary, *a, **k)

    def new(ary, *a, **k):
        moved.append(np.asarray(ary).nbytes)
        return real_to(ary, *a, **k)

    for spec in ("fp16", "minmax(bits=8)", "topk(ratio=0.05)", "gtopk(ratio=0.05)", "none", "powersgd(rank=1)"):
        red = Allreducer(spec, comm)
        x = _device(make_inputs(9, ck.rank, 0, big))
        red.reduce(x)  # a first step (residuals and warm buffers made)
        moved.clear()
        FakeCUDAArray.copy_to_host, FakeCUDAArray.copy_to_device, cuda.to_device = to_host, to_dev, new
        try:
            red.reduce(x)
        finally:
            FakeCUDAArray.copy_to_host, FakeCUDAArray.copy_to_device, cuda.to_device = real_host, real_dev, real_to
        frames = red.stats.bytes_sent + red.stats.bytes_received
        dense = sum(v.nbytes for v in x.values())
        limit = 1.1 * frames + 1024 * ck.size  # (a frame's header read, counts and cuts: constant a frame)
        if spec != "none":
            ck.true(red.stats.bytes_sent < dense, f"{spec}: its frame ({red.stats.bytes_sent} bytes) is no smaller than the tensors ({dense})")
        ck.true(sum(moved) <= limit, f"{spec}: {sum(moved)} bytes crossed for {frames} bytes of frames (limit {limit:.0f}): {moved}")
        if ck.rank == 0:
            print(f"crossing {spec} ranks={ck.size}: {sum(moved)} bytes for frames of {frames} bytes, tensors {dense}", flush=True)


def case_schemes(comm, ck):
    """:func:`case_codecs` for one codec of each scheme with a device path (the 4-rank launch:
    gTop-k's tree folds and exchanges)."""
    case_codecs(comm, ck, ("fp16", "topk(ratio=0.2)", "none", "gtopk(ratio=0.2)"))


CASES = {"codecs": case_codecs, "schemes": case_schemes, "out": case_out, "crossing": case_crossing}


def run_case(comm, name: str) -> list[str]:
    return harness_run_case(CASES, comm, name, Checks)


if __name__ == "__main__":
    cudasim.apply()  # the simulator's small launches, as tests/cuda/conftest.py sets them
    sys.exit(harness_main(CASES, sys.argv[1:]))
