"""The gTop-k tree (transport/gtopk.py) and the two-round PowerSGD (transport/powersgd.py)
against independent serial simulations (tests/reference/schemes.py).

* unit tests of ``transport.gtopk.merge`` (against a dict-based merge, and symmetric bit for
  bit) and ``schedule`` (every rank covered, symmetric pairs, log2(p2) exchanges);
* p = 1: every case of tests/mpi_schemes.py on COMM_SELF in this process, plus cross-checks
  with the plain codec (one rank's gTop-k is its top-k frame, one rank's two-round PowerSGD
  is the codec's PowerSGD with error feedback) and the error paths;
* p = 2..6: tests/mpi_schemes.py under mpiexec (tests/support/mpi.py), one launch per p
  (cached, with a timeout), one test per case: every rank prints ``OK <case> rank r/p`` when
  its result (bitwise identical on every rank) and residuals match the simulation (bitwise for
  gTop-k, and for PowerSGD when p <= 2).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import codec
from codec.testing import assert_identical

import mpi_schemes  # tests/ is on sys.path (pytest puts it there)
from reference import schemes as ref
from reference.transport import BF16, F16, F32, F64
from support.mpi import launch

MPI = pytest.importorskip("mpi4py.MPI")
from transport import Allreducer  # noqa: E402
from transport.schemes.gtopk import merge, schedule  # noqa: E402

SCRIPT = mpi_schemes.__file__
GTOPK_CASES = ["gtopk", "gtopk_options", "gtopk_bytes", "gtopk_state"]
PSGD_CASES = ["powersgd", "powersgd_state", "powersgd_lowrank"]
ALL_CASES = GTOPK_CASES + PSGD_CASES
#: ranks -> cases run at that size (PowerSGD's tree-free rounds need no odd sizes beyond 3)
LAUNCHES = {2: ALL_CASES, 3: ALL_CASES, 4: ALL_CASES, 5: GTOPK_CASES[:3], 6: GTOPK_CASES[:3]}


# ====================================================================== merge
def _as_dict(pos, val):
    return {int(p): v for p, v in zip(pos.tolist(), val)}


def _pairs(draw, dtype, maxpos):
    pos = draw(st.lists(st.integers(0, maxpos), max_size=12, unique=True))
    pos.sort()
    # few distinct magnitudes (ties), both signs, zeros of both signs, a few arbitrary floats
    atoms = st.sampled_from([0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 1.5, -2.0, 2.0, 3.0, 1e-3])
    width = 32 if dtype == F32 else 64
    vals = draw(st.lists(st.one_of(atoms, st.floats(-8, 8, width=width)), min_size=len(pos), max_size=len(pos)))
    return np.array(pos, np.int64), np.array(vals, dtype)


@st.composite
def merge_inputs(draw):
    dtype = draw(st.sampled_from([F32, F64]))
    maxpos = draw(st.sampled_from([5, 20, 1000]))
    pa, va = _pairs(draw, dtype, maxpos)
    pb, vb = _pairs(draw, dtype, maxpos)
    k = draw(st.integers(1, len(pa) + len(pb) + 1))
    return pa, va, pb, vb, k


@settings(max_examples=300, deadline=None)
@given(merge_inputs())
def test_merge_matches_reference_and_is_symmetric(args):
    pa, va, pb, vb, k = args
    p1, v1 = merge(pa.copy(), va.copy(), pb.copy(), vb.copy(), k)
    p2, v2 = merge(pb.copy(), vb.copy(), pa.copy(), va.copy(), k)
    assert_identical(p1.astype(np.int64), p2.astype(np.int64), "positions of merge(a, b) vs merge(b, a)")
    assert_identical(v1, v2, "values of merge(a, b) vs merge(b, a)")
    want = ref.merge_pairs(_as_dict(pa, va), _as_dict(pb, vb), k)
    assert p1.tolist() == list(want), (p1.tolist(), list(want))
    assert_identical(v1, np.array(list(want.values()), va.dtype), "merge values vs reference")
    assert v1.dtype == va.dtype


def test_merge_examples():
    f = np.float32
    # equal positions sum; ties in magnitude go to the lower position; output sorted by position
    p, v = merge(np.array([1, 4, 7]), np.array([1.0, -2.0, 0.5], f), np.array([4, 5, 9]), np.array([3.0, -1.5, 1.5], f), 3)
    assert p.tolist() == [1, 5, 9] and v.tolist() == [1.0, -1.5, 1.5]  # 1.0 at 1 and at 4 (-2 + 3): 1 wins
    # a cancelled sum is a zero, not dropped while the union fits in k
    p, v = merge(np.array([2]), np.array([1.0], f), np.array([2, 3]), np.array([-1.0, 0.25], f), 2)
    assert p.tolist() == [2, 3] and v.tolist() == [0.0, 0.25]
    # all equal magnitudes: the k lowest positions
    p, v = merge(np.array([6, 8]), np.array([1.0, -1.0], f), np.array([0, 3]), np.array([-1.0, 1.0], f), 2)
    assert p.tolist() == [0, 3] and v.tolist() == [-1.0, 1.0]
    # empty sides
    p, v = merge(np.zeros(0, np.int64), np.zeros(0, f), np.array([5]), np.array([2.0], f), 1)
    assert p.tolist() == [5] and v.tolist() == [2.0]
    p, v = merge(np.zeros(0, np.int64), np.zeros(0, f), np.zeros(0, np.int64), np.zeros(0, f), 1)
    assert p.size == 0 and v.size == 0


def test_reference_tree_without_truncation_is_the_exact_sum():
    """Sanity of the reference itself: with k above every union, the tree is a plain sum."""
    rng = np.random.default_rng(0)
    for p in range(1, 8):
        local = [{int(q): np.float64(rng.integers(-4, 5)) for q in rng.choice(30, 6, replace=False)} for _ in range(p)]
        final = ref.gtopk_tree(local, 10**6)
        want: dict = {}
        for s in local:
            for q, v in s.items():
                want[q] = want.get(q, 0.0) + v
        for f in final:
            assert f == dict(sorted(want.items()))


# ====================================================================== schedule
@pytest.mark.parametrize("p", range(1, 10))
def test_schedule(p):
    p2 = 1 << (p.bit_length() - 1)
    log2 = p2.bit_length() - 1
    plans = {r: schedule(r, p) for r in range(p)}
    if p == 1:
        assert plans[0] == []
        return
    for r, plan in plans.items():
        assert plan, f"rank {r} of {p} takes no part"
        if r >= p2:  # an extra rank: hand over to r - p2, get the result back
            assert plan == [("send", r - p2)]
            assert plans[r - p2][0] == ("recv", r) and plans[r - p2][-1] == ("return", r)
            continue
        ex = [peer for op, peer in plan if op == "exchange"]
        assert len(ex) == log2, f"rank {r} of {p}: {len(ex)} exchanges, want {log2}"
        assert ex == [r ^ (1 << i) for i in range(log2)]
        for i, peer in enumerate(ex):  # symmetric: the peer exchanges with r in the same round
            assert [q for op, q in plans[peer] if op == "exchange"][i] == r
        extra = r + p2 < p
        assert plan[0] == (("recv", r + p2) if extra else ("exchange", r ^ 1))
        assert (plan[-1] == ("return", r + p2)) == extra
        assert len(plan) == log2 + 2 * extra
    # run the schedule on sets of contributors: every rank ends with every rank's contribution
    know = {r: {r} for r in range(p)}
    for r in range(p2, p):
        know[r - p2] |= know[r]
    for i in range(log2):
        know.update({r: know[r] | know[[q for op, q in plans[r] if op == "exchange"][i]] for r in range(p2)})
    for r in range(p2, p):
        know[r] = know[r - p2]
    assert all(k == set(range(p)) for k in know.values())


# ====================================================================== p = 1 on COMM_SELF
@pytest.mark.parametrize("case", ALL_CASES)
def test_self(case):
    failures = mpi_schemes.run_case(MPI.COMM_SELF, case)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("dtype", [F32, F64, F16, BF16], ids=["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("spec", ["ratio=0.05", "k=3"])
def test_self_gtopk_is_the_topk_codec(spec, dtype):
    """One rank: the result is its own error-feedback top-k frame, decoded."""
    red = Allreducer(f"gtopk({spec})", MPI.COMM_SELF)
    ef = codec.ErrorFeedback(f"topk({spec})")
    for step in range(3):
        x = ref.make_tensor(1, 0, step, "x", (11, 13), dtype, "shared")
        got = red.reduce({"x": x})["x"]
        want = codec.decode(ef.encode(x, ("x", 0)))
        assert_identical(got, want, f"step {step}")
        assert_identical(red.scheme.ef.residual(("x", 0)), ef.residual(("x", 0)), f"residual, step {step}")


@pytest.mark.parametrize("dtype", [F32, F64, F16, BF16], ids=["f32", "f64", "f16", "bf16"])
def test_self_powersgd_is_the_codec(dtype):
    """One rank: two-round PowerSGD is the codec's PowerSGD with error feedback (same Q
    draws, warm start, residual)."""
    spec = "powersgd(rank=2, seed=5)"
    red = Allreducer(spec, MPI.COMM_SELF)
    ef = codec.ErrorFeedback(spec)
    # the codec keeps a 16-bit tensor's residual in 16 bits, the transport in float32: the
    # two agree on the first step's result only
    for step in range(3 if dtype in (F32, F64) else 1):
        x = ref.make_tensor(2, 0, step, "x", (24, 5, 4), dtype, "randn")
        got = red.reduce({"x": x})["x"]
        want = codec.decode(ef.encode(x, "x"))
        assert_identical(got, want, f"step {step}")
        if dtype in (F32, F64):
            assert_identical(mpi_schemes.saved_slot(red, "x")["residual"], ef.residual("x"), f"residual, step {step}")


def test_gtopk_local_frame_carries_no_checksum():
    """gTop-k's local frame never leaves its rank: it carries no payload checksum, whatever
    the reducer's checksum option (the frames the allgather scheme sends keep theirs)."""
    for checksum in (True, False):
        assert Allreducer("gtopk(ratio=0.1)", MPI.COMM_SELF, checksum=checksum).scheme.codec.checksum is False
        assert Allreducer("topk(ratio=0.1)", MPI.COMM_SELF, checksum=checksum).scheme.codec.checksum is checksum


def test_self_gtopk_small_tensors_and_list_input():
    red = Allreducer("gtopk(ratio=0.001)", MPI.COMM_SELF)
    x = np.array([0.5, -3.0, 2.0], F32)
    out = red.reduce([x, np.zeros(0, F16)])
    assert isinstance(out, list) and out[1].shape == (0,) and out[1].dtype == F16
    assert out[0].tolist() == [0.0, -3.0, 0.0]  # k = 1
    assert red.stats.bytes_sent == 0  # one rank: no tree
    out = red.reduce([x, np.zeros(0, F16)])
    assert out[0].tolist() == [0.0, 0.0, 4.0]  # x + residual [0.5, 0, 2] = [1, -3, 4]


def test_self_ireduce():
    for spec in ("gtopk(ratio=0.1)", "powersgd(rank=1)"):
        red = Allreducer(spec, MPI.COMM_SELF)
        x = ref.make_inputs(9, 0, 0, [("w", (20, 16), F32, "randn"), ("b", (5,), F32, "randn")])
        h = red.ireduce(x)
        assert isinstance(h.test(), bool)
        if spec.startswith("gtopk"):
            assert h.test() is True  # nothing posted before wait(): a polling loop must not spin
        got = h.wait()
        assert h.wait() is got
        want = Allreducer(spec, MPI.COMM_SELF).reduce(x)
        for name in x:
            assert_identical(got[name], want[name], f"{spec} [{name}]")


@pytest.mark.parametrize("spec", ["powersgd+fp16", "powersgd(rank=2)+zstd", "powersgd+bf16"])
def test_powersgd_rejects_stages(spec):
    with pytest.raises(ValueError, match="codec_or_spec"):
        Allreducer(spec, MPI.COMM_SELF)


@pytest.mark.parametrize("spec", ["powersgd", "gtopk(ratio=0.01)"])
def test_vote_rejected(spec):
    with pytest.raises(ValueError, match="vote"):
        Allreducer(spec, MPI.COMM_SELF, vote=True)


@pytest.mark.parametrize("shape", [(16, 12), (7,)], ids=["compressed", "passthrough"])
def test_powersgd_nan_names_the_tensor(shape):
    red = Allreducer("powersgd(rank=2)", MPI.COMM_SELF)
    x = np.ones(shape, F32)
    x.reshape(-1)[3] = np.nan
    with pytest.raises(ValueError, match="layer7"):
        red.reduce({"fine": np.ones((16, 12), F32), "layer7": x})


# ====================================================================== p >= 2 under mpiexec
@functools.lru_cache(maxsize=None)
def _launch(p: int):
    return launch(SCRIPT, p, *LAUNCHES[p], timeout=120)


@pytest.mark.parametrize("p,case", [(p, c) for p, cases in LAUNCHES.items() for c in cases])
def test_mpi(p, case):
    run = _launch(p)
    problems = run.problems(case)
    assert not problems, run.report(problems)


@pytest.mark.parametrize("p", list(LAUNCHES))
def test_mpi_exit_status(p):
    run = _launch(p)
    assert run.returncode == 0, run.report()
