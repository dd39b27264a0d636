"""transport: the Allreducer against the serial reference (tests/reference/transport.py).

Serial tests run on ``MPI.COMM_SELF`` (one rank), and so does every case of
tests/mpi_transport.py (each a function of a communicator, in the one MPI harness of
tests/support/mpi.py); the launched tests run ``mpiexec -n P python -m mpi4py
tests/mpi_transport.py ...`` for P = 2, 3, 4 (every case of the script in one launch per P,
with a timeout) and check that each rank printed its OK line and no FAIL or ERROR line.
"""

from __future__ import annotations

import functools
import pickle

import numpy as np
import pytest

import codec
from codec import CodecError

import mpi_transport  # tests/ is on sys.path (pytest puts it there)
from reference.transport import BF16, F16, F32, F64, MIXED, SMALL, Reference, digest, items, make_inputs, same_bits
from support.mpi import launch

try:
    from mpi4py import MPI
except ImportError:  # pragma: no cover - mpi4py comes with the test extra
    MPI = None

needs_mpi = pytest.mark.skipif(MPI is None, reason="mpi4py is not installed (pip install -e '.[test]')")

SCRIPT = mpi_transport.__file__


def reducer(spec, **opts):
    from transport import Allreducer

    return Allreducer(spec, MPI.COMM_SELF, **opts)


def assert_same(got, want):
    assert type(got) is type(want)
    gk, ga = items(got)
    wk, wa = items(want)
    assert gk == wk
    for k, g, w in zip(gk, ga, wa):
        assert isinstance(g, np.ndarray), k
        assert (g.dtype, g.shape) == (w.dtype, w.shape), k
        assert same_bits(g, w), f"{k!r}: differs from the reference"


# ---------------------------------------------------------------------- serial: reference
CONFIGS = [
    ("topk(ratio=0.01)+fp16", {}),
    ("qsgd(levels=16)", {}),
    ("qsgd(levels=16)", {"rank_streams": False}),
    ("qsgd(levels=16)", {"error_feedback": False}),
    ("adacomp", {}),
    ("randomk(ratio=0.01)", {}),
    ("fp16", {}),
    ("bf16", {"average": False}),
    ("none+zstd", {}),
    ("sign", {"vote": True}),
    ("efsign", {"vote": True}),
]


@needs_mpi
@pytest.mark.parametrize("spec,opts", CONFIGS, ids=[f"{s}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for s, o in CONFIGS])
def test_one_rank_matches_the_reference(spec, opts):
    red = reducer(spec, **opts)
    ref = Reference(spec, 1, **opts)
    for step in range(3):
        x = make_inputs(20, 0, step, SMALL)
        got = red.reduce(x)
        assert_same(got, ref.step([x]))
        # the stats name this rank's message and each tensor's share of it
        assert red.stats.bytes_sent == ref.message_bytes(0, x)
        assert red.stats.bytes_received == 0
        for (name, a), w in zip(x.items(), ref.wire(0, x)):
            t = red.stats.tensors[name]
            assert t["wire_bytes"] == w and t["dense_bytes"] == a.nbytes
        if ref.use_ef:
            for name in x:
                key = (name, 0) if opts.get("rank_streams", True) else name
                assert same_bits(red.scheme.ef.residual(key), ref.residual(0, name))
    assert red.calls == 3
    assert red.scheme.ef.residuals == ref.use_ef  # lossless codecs never use error feedback (no residuals)
    if spec.startswith(("sign", "efsign")):
        assert all(np.isin(a.astype(np.float64), (-1, 0, 1)).all() for a in got.values())


@needs_mpi
def test_reference_is_not_trivial():
    """The reference checks mean something: lossy codecs change the values, error feedback
    keeps residuals, and the stream depends on the key and the step."""
    x = make_inputs(21, 0, 0, SMALL)
    got = reducer("topk(ratio=0.01)+fp16").reduce(x)
    assert not same_bits(got["w32"], x["w32"]) and np.count_nonzero(got["w32"]) <= 20
    a = Reference("qsgd(levels=16)", 2, error_feedback=False)
    b = Reference("qsgd(levels=16)", 2, error_feedback=False, rank_streams=False)
    a.step([x, x])
    b.step([x, x])
    assert a.frames[0][2] != a.frames[1][2]  # rank in the key: the ranks round differently
    assert b.frames[0][2] == b.frames[1][2]  # no rank: the same stream
    a.step([x, x])
    assert a.frames[0][2] != codec.get_codec("qsgd(levels=16)").encode(x["w32"], key=("w32", 0), step=0)


@needs_mpi
def test_one_rank_none_is_the_input():
    """The dense baseline on one rank: the sum of one input, rounded back: the input's bits."""
    x = make_inputs(22, 0, 0, MIXED)
    x["f32_nan"] = np.array([np.nan, np.inf, -np.inf, -0.0, 1.0], np.float32)
    red = reducer("none")
    got = red.reduce(x)
    assert list(got) == list(x)
    for k in x:
        assert same_bits(got[k], x[k]), k
        assert got[k] is not x[k]
    # one buffer per accumulator dtype: 16-bit tensors travel as float32
    want = sum(a.size * (8 if a.dtype == F64 else 4) for a in x.values())
    assert red.stats.bytes_sent == want and red.stats.bytes_received == want
    assert {k: v["wire_bytes"] for k, v in red.stats.tensors.items()} == {k: a.nbytes for k, a in x.items()}


@needs_mpi
def test_lossless_allgather_keeps_nonfinite_bits():
    x = {"a": np.array([np.nan, np.inf, -np.inf, -0.0, 2.5], np.float32), "b": np.array([np.nan, -0.0], np.float64)}
    for spec in ("none+zstd", "none+crc32"):
        got = reducer(spec).reduce(x)
        assert_same(got, Reference(spec, 1).step([x]))
        # NaN and inf come through; -0.0 is added to the zeroed accumulator, so it is +0.0
        want = {k: np.where(v == 0, 0.0, v).astype(v.dtype) for k, v in x.items()}
        assert all(same_bits(got[k], want[k]) for k in x), spec


# ---------------------------------------------------------------------- serial: structure
@needs_mpi
@pytest.mark.parametrize("spec", ["topk(ratio=0.01)", "none", "fp16"])
def test_structure_and_dtypes_are_kept(spec):
    red = reducer(spec)
    names = ["zeta", "alpha", "mid", "empty", "scalar", "big64"]
    x = {
        "zeta": np.ones((3, 4), F16),
        "alpha": np.full(7, 0.5, BF16),
        "mid": np.arange(6, dtype=F32).reshape(2, 3) / 7,
        "empty": np.zeros((0, 5), F32),
        "scalar": np.array(2.0, F64),
        "big64": np.linspace(-1, 1, 1000),
    }
    got = red.reduce(x)
    assert type(got) is dict and list(got) == names
    for k in names:
        assert got[k].dtype == x[k].dtype and got[k].shape == x[k].shape, k
    as_list = red.reduce(list(x.values()))
    assert type(as_list) is list and [a.shape for a in as_list] == [a.shape for a in x.values()]
    assert [a.dtype for a in as_list] == [a.dtype for a in x.values()]
    as_tuple = red.reduce(tuple(x.values()))
    assert type(as_tuple) is tuple and len(as_tuple) == len(x)
    # a non-contiguous input is reduced as its values
    strided = {"t": np.arange(20, dtype=F32).reshape(4, 5).T}
    got = red.reduce(strided)["t"]
    assert got.shape == (5, 4)
    if spec == "none":
        assert np.array_equal(got, strided["t"])


@needs_mpi
@pytest.mark.parametrize("spec", ["topk(ratio=0.01)", "none", "qsgd(levels=16)"])
def test_empty_inputs(spec):
    red = reducer(spec)
    for empty in ({}, [], ()):
        got = red.reduce(empty)
        assert got == empty and type(got) is type(empty)
    # zero-element tensors alone, and among others
    x = {"a": np.zeros(0, F16), "b": np.zeros((4, 0), F64), "c": np.ones(3, F32)}
    got = red.reduce(x)
    assert [(a.dtype, a.shape) for a in got.values()] == [(a.dtype, a.shape) for a in x.values()]
    if spec == "none":
        assert got["c"].tolist() == [1.0, 1.0, 1.0]


# ---------------------------------------------------------------------- serial: stats, state, handles
@needs_mpi
def test_stats_and_totals():
    red = reducer("topk(ratio=0.01)+fp16")
    ref = Reference("topk(ratio=0.01)+fp16", 1)
    sent = 0
    for step in range(3):
        x = make_inputs(23, 0, step, SMALL)
        red.reduce(x)
        ref.step([x])
        st = red.stats
        message = ref.message(0, x)
        assert st.bytes_sent == len(message)
        assert abs(sum(t["wire_bytes"] for t in st.tensors.values()) - len(message)) <= len(x)  # shares, rounded
        sent += st.bytes_sent
        for (name, a), w in zip(x.items(), ref.wire(0, x)):
            t = st.tensors[name]
            assert t["wire_bytes"] == w
            assert t["dense_bytes"] == a.nbytes
            assert t["ratio"] == (a.nbytes / w if w else float("inf"))
        assert min(st.encode_s, st.communicate_s, st.decode_s) >= 0
    assert red.totals.bytes_sent == sent and red.totals.bytes_received == 0
    assert red.totals.encode_s >= red.stats.encode_s
    assert red.totals.tensors == red.stats.tensors
    assert red.calls == 3
    # a list names its tensors by position
    red.reduce([np.ones(4, F32), np.ones(2, F64)])
    assert set(red.stats.tensors) == {"0", "1"}


@needs_mpi
@pytest.mark.parametrize("spec,opts", [("topk(ratio=0.01)+fp16", {}), ("qsgd(levels=16)", {"error_feedback": False}), ("adacomp", {"rank_streams": False})])
def test_state_dict_round_trip_continues_identically(spec, opts):
    xs = [make_inputs(24, 0, s, SMALL) for s in range(5)]
    a = reducer(spec, **opts)
    for x in xs[:2]:
        a.reduce(x)
    saved = pickle.loads(pickle.dumps(a.state_dict()))
    assert saved["scheme"] == a.spec and saved["rank"] == 0 and saved["size"] == 1
    b = reducer(spec, **opts)
    b.load_state_dict(saved)
    fresh = reducer(spec, **opts)
    ref = Reference(spec, 1, **opts)
    for x in xs[:2]:
        ref.step([x])
    differs = False
    for x in xs[2:]:
        want = ref.step([x])
        ga, gb, gf = a.reduce(x), b.reduce(x), fresh.reduce(x)
        assert_same(ga, want)
        assert_same(gb, want)
        differs |= digest(gf) != digest(want)
    assert differs, "a reducer without the state gives the same results: the test proves nothing"
    with pytest.raises(ValueError, match="state"):
        reducer("fp16").load_state_dict(saved)
    with pytest.raises(ValueError, match="state"):
        reducer(spec, **opts).load_state_dict("not a state")
    for other in ({"rank": 1}, {"size": 2}):  # residuals belong to the rank that made them
        with pytest.raises(ValueError, match="rank"):
            reducer(spec, **opts).load_state_dict({**saved, **other})


@needs_mpi
@pytest.mark.parametrize("spec", ["topk(ratio=0.01)+fp16", "none"])
def test_ireduce_handles(spec):
    red = reducer(spec)
    ref = Reference(spec, 1)
    xa, xb = make_inputs(25, 0, 0, SMALL), make_inputs(25, 0, 1, SMALL)
    wa, wb = ref.step([xa]), ref.step([xb])
    ca, cb = {k: v.copy() for k, v in xa.items()}, {k: v.copy() for k, v in xb.items()}
    ha, hb = red.ireduce(ca), red.ireduce(cb)
    for v in list(ca.values()) + list(cb.values()):
        v[...] = 3  # the step was taken at ireduce
    assert red.calls == 0
    ra = ha.wait()
    assert ha.wait() is ra and ha.test()
    rb = hb.wait()
    assert hb.test() and red.calls == 2
    assert_same(ra, wa)
    assert_same(rb, wb)


@needs_mpi
@pytest.mark.parametrize("spec", ["topk(ratio=0.01)+fp16", "qsgd(levels=16)", "fp16"])
def test_allgather_steps_reuse_their_buffers(spec):
    """The allgather scheme's step writes its frame into, and receives the ranks' frames into,
    buffers kept from earlier steps (no fresh pages per step); two steps in flight hold
    different ones; every step's result stays the reference's."""
    red = reducer(spec)
    ref = Reference(spec, 1)
    results = []
    for step in range(2):
        x = make_inputs(25, 0, step, SMALL)
        results.append((red.reduce({k: v.copy() for k, v in x.items()}), ref.step([x])))
    kept = {id(b) for b in red.scheme.buffers.free}
    assert len(kept) == 2  # the frame's and the receive buffer, given back
    xa, xb = make_inputs(25, 0, 2, SMALL), make_inputs(25, 0, 3, SMALL)
    ha, hb = red.ireduce({k: v.copy() for k, v in xa.items()}), red.ireduce({k: v.copy() for k, v in xb.items()})
    held_a, held_b = ({id(b) for _, bufs in h._pending.gives for b in bufs} for h in (ha, hb))  # a step's buffers, per pool
    assert held_a and held_b and not held_a & held_b
    assert held_a == kept  # the first step in flight took the kept ones
    results += [(ha.wait(), ref.step([xa])), (hb.wait(), ref.step([xb]))]
    for got, want in results:
        assert_same(got, want)
    assert kept <= {id(b) for b in red.scheme.buffers.free} and len(red.scheme.buffers.free) <= red.scheme.buffers.KEEP
    before = {id(b) for b in red.scheme.buffers.free}

    def failing(arrays, keys, out=None):  # an encode failure the checks before the step did not foresee
        out(1000)  # after the allocator took a kept buffer
        raise RuntimeError("encode failed")

    red.scheme.encode = failing
    with pytest.raises(Exception, match="encode failed"):
        red.reduce(make_inputs(25, 0, 4, SMALL))
    assert {id(b) for b in red.scheme.buffers.free} == before  # the failed step gave its buffer back


# ---------------------------------------------------------------------- serial: arguments
@needs_mpi
@pytest.mark.parametrize("name", ["average", "error_feedback", "vote", "rank_streams", "cuda_aware"])
@pytest.mark.parametrize("bad", [1, 0, "yes", None])
def test_options_must_be_bool(name, bad):
    with pytest.raises(TypeError, match=name):
        reducer("sign", **{name: bad})
    reducer("sign", **{name: np.bool_(False)})


@needs_mpi
def test_momentum_is_dgc_momentum_correction_on_every_rank():
    """momentum=m: each rank's frames are ErrorFeedback(momentum=m)'s (on one rank, the
    average is that rank's decoded frame), step after step, and the state carries the
    velocity; schemes without it, or without error feedback, refuse it with why."""
    import codec

    rng = np.random.default_rng(5)
    red = reducer("dgc(ratio=0.1)", momentum=0.9)
    ef = codec.ErrorFeedback("dgc(ratio=0.1)", momentum=0.9)
    for step in range(3):
        g = rng.standard_normal((20, 30)).astype(np.float32)
        got = red.reduce({"w": g})["w"]
        want = codec.decode(ef.encode(g, key=("w", 0)))
        assert got.tobytes() == want.tobytes(), step
    assert red.state_dict()["feedback"]["momentum"] == 0.9
    for spec, opts in (("none", {}), ("powersgd(rank=2)", {}), ("gtopk(ratio=0.1)", {}), ("topk(ratio=0.1)", {"error_feedback": False})):
        with pytest.raises(ValueError, match="momentum: DGC's momentum correction"):
            reducer(spec, momentum=0.9, **opts)
    for bad in (1.0, -0.1, "0.9", True):
        with pytest.raises(ValueError, match=r"momentum: expected a number in \[0, 1\)"):
            reducer("topk(ratio=0.1)", momentum=bad)


@needs_mpi
def test_vote_needs_a_sign_codec():
    for spec in ("topk(ratio=0.01)", "fp16", "none", "qsgd(levels=4)"):
        with pytest.raises(ValueError, match="vote"):
            reducer(spec, vote=True)
    for spec in ("sign", "efsign", "onebit", "sign+zstd"):
        reducer(spec, vote=True)


@needs_mpi
@pytest.mark.parametrize("bad", [np.ones(3, F32), "w", None, 3.0, {"w"}, (x for x in [np.ones(2)])])
def test_tensors_must_be_a_dict_or_list(bad):
    with pytest.raises(TypeError, match="tensors"):
        reducer("fp16").reduce(bad)


@needs_mpi
@pytest.mark.parametrize("spec", ["fp16", "none"])
def test_integer_tensors_are_rejected(spec):
    red = reducer(spec)
    with pytest.raises(TypeError, match="'w'"):
        red.reduce({"a": np.ones(3, F32), "w": np.arange(4)})
    with pytest.raises(TypeError):
        red.reduce([np.ones(2, np.int32)])
    with pytest.raises(TypeError):
        red.reduce({"b": np.ones(2, bool)})
    # nothing was consumed: the next step is the first
    assert red.calls == 0
    red.reduce({"a": np.ones(3, F32)})
    assert red.calls == 1


@needs_mpi
def test_spec_and_errors():
    from transport import Allreducer, MismatchError

    assert issubclass(MismatchError, ValueError) and issubclass(MismatchError, CodecError)
    assert reducer("topk(ratio=0.01)+fp16").spec == "topk+fp16"
    red = Allreducer("fp16", MPI.COMM_SELF)
    assert (red.rank, red.size) == (0, 1) and "fp16" in repr(red)
    with pytest.raises(ValueError):
        reducer("no_such_codec")


@needs_mpi
def test_out_is_checked_before_the_step():
    red = reducer("topk(ratio=0.1)")
    x = {"a": np.ones(10, F32), "b": np.ones((2, 3), F64)}
    good = {k: np.empty_like(v) for k, v in x.items()}
    bad_cases = [
        ({"a": good["a"]}, ValueError, "names"),
        ([good["a"], good["b"]], ValueError, "names"),
        ({**good, "a": np.empty(11, F32)}, ValueError, r"out\['a'\]"),
        ({**good, "b": np.empty((2, 3), F32)}, ValueError, r"out\['b'\]"),
        ({**good, "a": np.empty(10, F32)[::1].view(np.matrix)}, TypeError, r"out\['a'\]"),
        ({**good, "a": np.empty(20, F32)[::2]}, ValueError, "C-contiguous"),
        ({**good, "a": [0.0] * 10}, TypeError, r"out\['a'\]"),
    ]
    ro = np.empty(10, F32)
    ro.flags.writeable = False
    bad_cases.append(({**good, "a": ro}, ValueError, "writeable"))
    for out, err, match in bad_cases:
        with pytest.raises(err, match=match):
            red.reduce(x, out=out)
    assert red.calls == 0 and red.scheme.ef.keys() == []  # nothing was consumed
    assert red.reduce(x, out=good) is good
    assert red.calls == 1


# ---------------------------------------------------------------------- the MPI cases, p = 1
@needs_mpi
@pytest.mark.parametrize("case", list(mpi_transport.CASES))
def test_self(case):
    """Every case of tests/mpi_transport.py on ``MPI.COMM_SELF`` in this process."""
    if mpi_transport.MIN_RANKS.get(case, 1) > 1:
        pytest.skip(f"{case} needs {mpi_transport.MIN_RANKS[case]} ranks (test_launched_exception_aborts_the_job runs it)")
    failures = mpi_transport.run_case(MPI.COMM_SELF, case)
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------- launched under mpiexec
CASES = mpi_transport.ALL
#: the cases each rank count runs, all in ONE launch per count (each launch pays the JIT load);
#: 3 is the non-power-of-two count
PLAN = {2: CASES, 3: ["codecs", "ef", "none", "out", "mismatch"], 4: CASES}


@functools.lru_cache(maxsize=None)
def launched(p: int, *cases: str, timeout: float = 120.0):
    """The launch of ``cases`` (default: PLAN[p]) on ``p`` ranks, run once per session; a hang
    is killed (the whole process group) and fails the test."""
    run = launch(SCRIPT, p, *(cases or PLAN[p]), timeout=timeout)
    if run.hung:
        pytest.fail(run.report([f"did not finish in {timeout} s (hung)"], tail=4000))
    return run


@needs_mpi
@pytest.mark.parametrize("p,case", [(p, c) for p, cases in PLAN.items() for c in cases], ids=lambda v: f"np{v}" if isinstance(v, int) else v)
def test_launched(p, case):
    run = launched(p)
    problems = run.problems(case)
    assert not problems, run.report(problems)
    assert run.returncode == 0 or case != PLAN[p][-1], run.report([f"exit status {run.returncode} after every case passed"])


@needs_mpi
def test_launched_exception_aborts_the_job():
    """Rank 1 raises while ranks 0 and 2 wait inside reduce: the job ends, non-zero, fast."""
    run = launched(3, "raise", timeout=120)
    assert run.returncode != 0, run.report(tail=4000)
    assert "rank 1 failed mid-step" in run.output, run.report(tail=4000)
    assert "UNREACHABLE" not in run.output
    assert run.seconds < 60, f"took {run.seconds:.0f} s to abort"


@needs_mpi
def test_launched_encoding_error_on_one_rank():
    """A rank whose input the codec rejects (inf into topk) raises ValueError; the other ranks
    must learn of it in the same step instead of going on into the sizes Allgather."""
    run = launched(2, "nonfinite", timeout=30)
    problems = run.problems("nonfinite")
    assert not problems and run.returncode == 0, run.report(problems)
