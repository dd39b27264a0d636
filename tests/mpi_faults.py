"""A rank whose input cannot go through: every rank must raise the same error within seconds.

    mpiexec -n P python -m mpi4py tests/mpi_faults.py [--uncaught] CASE [CASE ...]   (or "all")
    mpiexec -n P python tests/mpi_faults.py ...                 (without mpi4py's abort hook)

tests/test_transport_faults.py launches it, and calls the same case functions on
``MPI.COMM_SELF`` in the pytest process.  A case is one scheme and one fault.  Each rank:

1. builds an Allreducer and a twin with the same arguments, and reduces one good step on
   both;
2. runs the faulty step: the victim ranks (the last rank; two ranks for ``two``) pass a bad
   input, the others a good one;
3. prints ``RAISED <case> rank r/p <seconds> <ExceptionType> <message>`` (one line; the
   message's newlines escaped) with the seconds the faulty ``reduce`` took on this rank, or
   ``RETURNED <case> rank r/p <seconds>`` when it returned (the dense scheme passes NaN on);
4. checks that the failed step changed no state (``state_dict`` before and after, bit for
   bit), then reduces another good step on the reducer and on its twin, which never saw the
   faulty step: the results must be equal, and equal on every rank;
5. the one MPI harness (tests/support/mpi.py) prints ``OK <case> rank r/p <seconds>s``, or
   ``FAIL <case> rank r/p: ...`` per failed check.

The pytest side checks that every rank raised the same type with the same message, in under
10 seconds.  A rank that raised alone would leave the others inside a collective: the launch
would hang, and the launcher's timeout fails it.

``--uncaught``: the faulty step's exception is not caught (a training script that does not
expect it): the job must end non-zero within seconds, under ``-m mpi4py`` (MPI_Abort) and
without it (every rank exits with the exception), after every rank printed its RAISED line.

Imports: tests/ is on sys.path (for ``reference`` and ``support``) and the launcher puts the
repository root on PYTHONPATH, as tests/support/mpi.py says.
"""

from __future__ import annotations

import copy
import sys
import time

import numpy as np

from reference.transport import digest
from support.mpi import Checks, main as harness_main, same_state, say
from transport import Allreducer

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)

#: scheme name -> spec
SCHEMES = {
    "gtopk": "gtopk(ratio=0.05)",
    "powersgd": "powersgd(rank=2)",
    "allgather": "topk(ratio=0.05)",
    "qsgd": "qsgd(levels=16)",
    "none": "none",
}
#: fault -> what every rank must raise (None: the step returns, on every rank)
FAULTS = {
    "nan": "RankError",
    "inf": "RankError",
    "int32": "RankTypeError",
    "complex": "RankTypeError",
    "list": "RankTypeError",  # a Python list where an array belongs
    "shape": "MismatchError",
    "two": "RankError",  # two ranks fail, for different reasons
    "overflow": "RankError",  # x + residual overflows float16 inside the codec: after the check
}
#: what the dense scheme does instead: NaN and inf go through (MPI Allreduce propagates them)
NONE_PASSES = ("nan", "inf")


def cases() -> dict:
    out = {}
    for scheme in SCHEMES:
        for fault in FAULTS:
            if fault == "overflow" and scheme not in ("gtopk", "allgather"):
                continue  # PowerSGD keeps float32 residuals; none has no codec
            out[f"{scheme}_{fault}"] = (scheme, fault)
    return out


CASES = cases()


def inputs(rank: int, step: int) -> dict:
    rng = np.random.default_rng([7, rank, step])
    return {
        "w": rng.standard_normal((64, 32)).astype(F32),  # PowerSGD compresses it
        "b": rng.standard_normal(16).astype(F32),  # passes through PowerSGD
        "h": rng.standard_normal(40).astype(F16),
    }


def victims(fault: str, p: int) -> list[int]:
    if fault == "two":
        return [0, p - 1] if p <= 2 else [1, p - 1]
    return [p - 1]


def spoil(x: dict, fault: str, rank: int, p: int) -> dict:
    """The bad input of a victim rank."""
    x = {k: v.copy() for k, v in x.items()}
    if fault == "nan":
        x["w"][3, 4] = np.nan
    elif fault == "inf":
        x["b"][2] = -np.inf
    elif fault == "int32":
        x["w"] = x["w"].astype(np.int32)
    elif fault == "complex":
        x["b"] = x["b"].astype(np.complex64)
    elif fault == "list":
        x["b"] = x["b"].tolist()
    elif fault == "shape":
        x["w"] = np.zeros((64, 33), F32)
    elif fault == "two":  # the first victim sends NaN, the other an int32 tensor
        if rank == victims(fault, p)[0] and p > 1:
            x["h"][5] = np.nan
        else:
            x["w"] = x["w"].astype(np.int32)
    elif fault == "overflow":
        x["h"][:] = 60000.0  # finite; the residual holds 60000 after the first such step
    return x


def expected(scheme: str, fault: str, p: int):
    """The exception type every rank must raise (None: the step returns on every rank)."""
    if scheme == "none" and fault in NONE_PASSES:
        return None
    if fault == "two" and (scheme == "none" or p == 1):  # none sends the NaN; one rank: int32 only
        return "RankTypeError"
    if fault == "shape" and p == 1:  # no other rank to disagree with: a tensor changed its shape
        return None if scheme in ("powersgd", "none") else "RankError"  # PowerSGD starts it over
    return FAULTS[fault]


def run_case(comm, name: str, uncaught: bool = False, say=say) -> dict:
    """Run one case on ``comm``; returns this rank's record:
    ``{"raised": (type name, message) or None, "seconds", "result", "failures": [...]}``;
    ``say`` writes its RAISED / RETURNED line."""
    scheme, fault = CASES[name]
    spec = SCHEMES[scheme]
    rank, p = comm.Get_rank(), comm.Get_size()
    tag = f"{name} rank {rank}/{p}"
    ck = Checks(comm, name)
    red, twin = Allreducer(spec, comm), Allreducer(spec, comm)
    good = inputs(rank, 0)
    if fault == "overflow":  # every element 60000: a float16 residual of 60000 for the victim
        good = spoil(good, fault, rank, p) if rank in victims(fault, p) else good
    red.reduce(good)
    twin.reduce(good)
    before = copy.deepcopy(red.state_dict())
    x = inputs(rank, 1)
    if rank in victims(fault, p):
        x = spoil(x, fault, rank, p)
    raised, result = None, None
    t = time.perf_counter()
    try:
        result = red.reduce(x)
    except Exception as e:  # noqa: BLE001 - the type is the check
        seconds = time.perf_counter() - t
        raised = (type(e).__name__, str(e))
        say(f"RAISED {tag} {seconds:.3f} {raised[0]} {raised[1]!r}")
        if uncaught:
            raise
    else:
        seconds = time.perf_counter() - t
        say(f"RETURNED {tag} {seconds:.3f}")
    want = expected(scheme, fault, p)
    if (raised and raised[0]) != want:
        ck.fail(f"expected {want or 'no exception'}, got {raised}")
    if want is None and result is not None and fault in NONE_PASSES:  # NaN / inf reach every rank at the victim's position
        spot = result["w"][3, 4] if fault == "nan" else result["b"][2]
        ok = np.isnan(spot) if fault == "nan" else np.isneginf(spot)
        if not ok:
            ck.fail(f"the dense sum holds {spot!r} where the victim sent {fault}")
        ck.agree(result, "the dense result")
    # no state changed (an encode failure after the check is the documented exception)
    if fault != "overflow" and want is not None and not same_state(before, red.state_dict()):
        ck.fail("the failed step changed this rank's state")
    # the ranks are still in step, and the reducer goes on as if the step never happened
    nxt = inputs(rank, 2)
    if fault == "overflow":
        nxt["h"][:] = 0
    if fault == "shape" and want is None:
        nxt["w"] = np.zeros((64, 33), F32)  # the victim's residual still holds 60000: a small step goes through
    got = red.reduce(nxt)
    if fault != "overflow" and (want is not None):
        ref = twin.reduce(nxt)
        if digest(got) != digest(ref):
            ck.fail("the step after the failure differs from a reducer that never saw it")
    ck.agree(got, "the step after the failure")
    return {"raised": raised, "seconds": seconds, "result": result, "failures": ck.failures}


def main(argv) -> int:
    """``--uncaught``: the faulty step's exception propagates (no ERROR line, no ``Abort``)."""
    uncaught = "--uncaught" in argv
    return harness_main(CASES, [a for a in argv if a != "--uncaught"], run=lambda comm, name: run_case(comm, name, uncaught)["failures"],
                        abort=not uncaught, usage="[--uncaught] CASE [CASE ...]")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
