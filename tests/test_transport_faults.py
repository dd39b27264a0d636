"""A rank whose input cannot go through (NaN, inf, an unsupported dtype, a list, a wrong
shape, an overflow inside the codec): every rank raises the same error within seconds, no
rank's state changes, and the next step works (tests/mpi_faults.py; docs/transport.md,
"Errors and failures").

* p = 1: every case on ``MPI.COMM_SELF`` in this process;
* p = 2 and 4: one ``mpiexec`` launch per rank count and launcher, running every case, both
  ``python -m mpi4py`` and plain ``python`` (no abort hook: a rank that raised alone would
  leave the others in a collective for ever), with a hard timeout so a hang fails the test;
* ``--uncaught``: the faulty step's exception ends the job, non-zero, within seconds.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest

import mpi_faults  # tests/ is on sys.path (pytest puts it there)
from support.mpi import launch

MPI = pytest.importorskip("mpi4py.MPI")
from transport import Allreducer, RankError, RankTypeError  # noqa: E402
from codec.ops import first_nonfinite as nonfinite_at  # noqa: E402  (the transport checks inputs with it)

SCRIPT = mpi_faults.__file__
#: every rank must have raised within this many seconds of entering the faulty step
RAISE_S = 10.0
#: a launch that takes longer hung (each launch runs every case: about 5-15 s when it works)
LAUNCH_TIMEOUT_S = 90
SCHEMES = list(mpi_faults.SCHEMES)


def _mentions(scheme, fault, victims, p, msg):
    """What the error message must say: the failing ranks, the tensor and the reason."""
    if fault == "shape":
        return [f"rank {p - 1}", "'w'", "64, 33"] if p > 1 else ["'w'", "64, 33"]
    parts = [f"rank {v}" for v in sorted(set(victims)) if not (scheme == "none" and fault == "two" and v == victims[0] and p > 1)]
    parts.append(f"of {p} failed")
    reason = {"nan": "non-finite", "inf": "non-finite", "int32": "int32", "complex": "complex64", "list": "list",
              "two": "int32", "overflow": "non-finite"}[fault]
    parts.append(reason)
    if fault != "overflow":
        parts.append({"nan": "'w'", "inf": "'b'", "int32": "'w'", "complex": "'b'", "list": "'b'", "two": "'w'"}[fault])
    return parts


# ====================================================================== p = 1 on COMM_SELF
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the float16 overflow case
@pytest.mark.parametrize("case", list(mpi_faults.CASES))
def test_self(case):
    lines = []
    rec = mpi_faults.run_case(MPI.COMM_SELF, case, say=lines.append)
    assert not rec["failures"], "\n".join(lines + rec["failures"])
    scheme, fault = mpi_faults.CASES[case]
    if rec["raised"] is not None:
        name, msg = rec["raised"]
        for part in _mentions(scheme, fault, [0], 1, msg):
            assert part in msg, f"{msg!r} does not mention {part!r}"


def test_errors_are_value_or_type_errors():
    assert issubclass(RankError, ValueError) and issubclass(RankTypeError, RankError) and issubclass(RankTypeError, TypeError)
    red = Allreducer("gtopk(ratio=0.1)", MPI.COMM_SELF)
    with pytest.raises(RankError) as info:
        red.reduce({"x": np.array([1.0, np.nan], np.float32)})
    assert info.value.ranks == [0] and "non-finite" in info.value.reasons[0]
    assert isinstance(info.value.__cause__, ValueError)  # the rank's own error, chained
    with pytest.raises(TypeError, match="tensors"):
        red.reduce("not a dict")


@pytest.mark.parametrize("spec", ["topk(ratio=0.1)", "gtopk(ratio=0.1)", "powersgd(rank=1)", "qsgd(levels=4)"])
@pytest.mark.parametrize("shape", [(8, 6), (5,), ()], ids=["2d", "1d", "scalar"])
def test_a_non_finite_input_is_told_by_the_one_builder(spec, shape):
    """The transport's finiteness checks raise codec.errors.NonFiniteError (a ValueError), the
    one builder of the non-finite message: the tensor, the position, the scheme."""
    from codec.errors import NonFiniteError

    x = np.ones(shape, np.float32)
    x.reshape(-1)[-1] = np.inf
    red = Allreducer(spec, MPI.COMM_SELF)
    with pytest.raises(RankError) as info:
        red.reduce({"ok": np.ones(4, np.float32), "bad": x})
    cause = info.value.__cause__
    assert isinstance(cause, NonFiniteError) and isinstance(cause, ValueError)
    at = tuple(int(i) for i in np.unravel_index(x.size - 1, shape))
    assert f"tensors['bad']: non-finite value at position {at}; " in str(cause), str(cause)
    assert red.state_dict()["feedback"]["slots"] == []  # nothing was stored


def test_powersgd_overflow_in_p_is_a_non_finite_error():
    from codec.errors import NonFiniteError

    # finite, but M Q overflows float32: the key's start Q sums to -2.59 ("w"'s to -0.79, whose
    # M Q fits since the products are summed in float64: lowrank.project)
    x = np.full((20, 16), 3e38, np.float32)
    with pytest.raises(RankError) as info:
        Allreducer("powersgd(rank=1)", MPI.COMM_SELF).reduce({"b": x})
    cause = info.value.__cause__
    assert isinstance(cause, NonFiniteError) and "P = M Q" in str(cause) and "overflows float32" in str(cause)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_failed_handle_does_not_run_its_collectives_again():
    """An encode failure after the check raises from wait(); a second wait() raises it again."""
    red = Allreducer("gtopk(ratio=0.1)", MPI.COMM_SELF)
    x = {"h": np.full(40, 60000, np.float16)}
    red.reduce(x)
    h = red.ireduce(x)  # x + residual overflows float16 inside the codec
    with pytest.raises(RankError, match="encoding") as first:
        h.wait()
    with pytest.raises(RankError) as second:
        h.wait()
    assert second.value is first.value and h.test()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, "bfloat16"])
def test_nonfinite_at(dtype):
    from codec.dtypes import bfloat16

    dt = bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    a = np.linspace(-3, 3, 200_000).astype(dt)
    assert nonfinite_at(a) == -1 and nonfinite_at(a[:0]) == -1
    big = np.full(10, np.finfo(np.float32).max if dt == np.float32 else 1.0, dt)
    assert nonfinite_at(big) == -1  # the sum overflows, the values are finite
    for bad in (np.nan, np.inf, -np.inf):
        b = a.copy()
        b[123_457] = bad
        b[190_000] = bad
        assert nonfinite_at(b) == 123_457
        assert nonfinite_at(b.reshape(400, 500)) == 123_457


def test_dense_none_passes_nan_and_inf_on():
    """The chosen behaviour of ``none`` (docs/transport.md): NaN and inf are summed like any
    value, as MPI Allreduce and DDP do, so a loss-scaling check after the reduce sees them on
    every rank."""
    red = Allreducer("none", MPI.COMM_SELF)
    got = red.reduce({"a": np.array([1.0, np.nan, np.inf, -np.inf], np.float32)})["a"]
    assert got[0] == 1.0 and np.isnan(got[1]) and got[2] == np.inf and got[3] == -np.inf


# ====================================================================== p = 2, 4 under mpiexec
@functools.lru_cache(maxsize=None)
def _launch(p: int, launcher: str, *args: str, timeout: float = LAUNCH_TIMEOUT_S):
    """The launch (``returncode`` None when it hung: killed, process group and all)."""
    return launch(SCRIPT, p, *args, timeout=timeout, mpi4py=launcher == "mpi4py", env={"PYTHONWARNINGS": "ignore::RuntimeWarning"})


LINE = re.compile(r"^(RAISED|RETURNED) (\w+) rank (\d+)/(\d+) ([\d.]+)(?: (\w+) (.*))?$", re.M)


def _records(out, p):
    """case -> rank -> (kind, seconds, type, message)."""
    recs: dict = {}
    for kind, case, r, n, secs, typ, msg in LINE.findall(out):
        if int(n) == p:
            recs.setdefault(case, {})[int(r)] = (kind, float(secs), typ or None, msg or None)
    return recs


def check_case(case, run):
    scheme, fault = mpi_faults.CASES[case]
    p, out = run.ranks, run.output
    recs = _records(out, p).get(case, {})
    problems = run.fails(case)
    if "ERROR" in out:
        problems.append("a rank printed ERROR (an unexpected exception)")
    missing = sorted(set(range(p)) - set(recs))
    if missing:
        hang_note = f" (the launch hung and was killed after {run.seconds:.0f} s)" if run.hung else ""
        problems.append(f"no RAISED/RETURNED line from ranks {missing}{hang_note}")
    want = mpi_faults.expected(scheme, fault, p)
    kinds = {(k, t, m) for k, _, t, m in recs.values()}
    if len(kinds) > 1:
        problems.append(f"ranks ended differently: {sorted(kinds, key=str)}")
    for r, (kind, secs, typ, msg) in sorted(recs.items()):
        if (typ if kind == "RAISED" else None) != want:
            problems.append(f"rank {r}: {kind} {typ} {msg}, expected {want or 'a result'}")
        if secs > RAISE_S:
            problems.append(f"rank {r}: the faulty step took {secs:.1f} s > {RAISE_S} s")
    if want is not None and recs:
        msg = next(iter(recs.values()))[3]
        for part in _mentions(scheme, fault, mpi_faults.victims(fault, p), p, msg):
            if part not in msg:
                problems.append(f"the message {msg} does not mention {part!r}")
    ok = run.oks(case)
    if ok != set(range(p)) and not missing:
        problems.append(f"OK lines from ranks {sorted(ok)} only")
    return problems


@pytest.mark.parametrize("launcher", ["mpi4py", "plain"])
@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_launched(scheme, p, launcher):
    """Every fault of ``scheme`` on ``p`` ranks: every rank raises the same error (type and
    message) in under 10 s, its state unchanged, and the next step agrees with a twin reducer
    that never saw the faulty step."""
    run = _launch(p, launcher, "all")
    problems = []
    for case, (s, _) in mpi_faults.CASES.items():
        if s == scheme:
            problems += [f"{case}: {m}" for m in check_case(case, run)]
    assert not problems, run.report(problems[:30], tail=3000)
    assert run.returncode == 0, run.report([f"exit status {run.returncode}"], tail=3000)


@pytest.mark.parametrize("launcher", ["mpi4py", "plain"])
@pytest.mark.parametrize("case,p", [("gtopk_nan", 4), ("powersgd_int32", 2), ("gtopk_overflow", 2)])
def test_launched_uncaught_ends_the_job(case, p, launcher):
    """A script that does not catch the error: every rank raises it, and the job ends non-zero
    within seconds, with and without mpi4py's abort hook."""
    run = _launch(p, launcher, "--uncaught", case, timeout=60)
    assert not run.hung, run.report([f"hung: killed after {run.seconds:.0f} s"], tail=3000)
    assert run.returncode != 0, run.report(tail=3000)
    out = run.output
    recs = _records(out, p).get(case, {})
    # every rank reaches its own raise (test_launched shows it with the error caught), but here
    # the first rank to exit non-zero makes mpiexec kill the others, so under load some ranks
    # are killed before they print: only what did print is compared
    assert recs, out[-3000:]
    assert len({(t, m) for _, _, t, m in recs.values()}) == 1, out[-3000:]
    assert all(s < RAISE_S for _, s, _, _ in recs.values()), recs
