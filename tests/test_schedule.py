"""Schedules of numeric stage parameters (codec.schedule, Param(schedule=True, auto=True), Stage.at)."""

import json
import math
import pickle

import numpy as np
import pytest

import codec
from codec import schedule, testing
from codec.schedule import Schedule, build, exp, linear, step, warmup
from codec.spec import Call, parse, parse_value
from codec.stage import _REGISTRY, Bound, Param, Select, register


# ---------------------------------------------------------------- a test-only stage
class _SchedProbe(Select):
    """Test-only select stage: keep |x| >= value(step); at most `count` (schedulable int) unused."""

    name = "_sched_probe"
    params = (
        Param("value", float, 0.0, "magnitude threshold", low=0.0, schedule=True),
        Param("count", int, 10, "an integer schedulable parameter", low=1, high=100, schedule=True),
        Param("bin", int, None, "auto or a bin size", low=1, auto=True),
    )

    def select(self, values, ctx, sections, residual=None, out=None):
        from codec.ops import widen
        from codec.pack import encode_indices

        idx = np.flatnonzero(np.abs(widen(values)) >= self.at("value", ctx.step))
        sections.append(encode_indices(idx, values.size))
        return idx, values[idx]

    def bound(self, ctx):
        """Any count of the n elements may reach the threshold: one index section of at most
        the bitmap's bytes, and up to n values of the array's dtype."""
        from codec.pack import index_bound

        return Bound(1, index_bound(ctx.n, ctx.n, least=0), ctx.domain(ctx.n, ctx.dtype))

    def positions(self, reader, ctx):
        from codec.frame import SectionKind
        from codec.pack import decode_indices

        info, raw = reader.take((SectionKind.INDEX_DELTA, SectionKind.INDEX_BITMAP))
        return decode_indices(info, raw, ctx.n)


@pytest.fixture
def probe():
    """Register the probe for one test only (the conformance suite iterates the registry)."""
    register(_SchedProbe)
    try:
        yield _SchedProbe
    finally:
        _REGISTRY.pop(_SchedProbe.name, None)


def test_probe_is_not_left_registered():
    assert _SchedProbe.name not in codec.stage.registered()


# ---------------------------------------------------------------- values
@pytest.mark.parametrize(
    "s, steps_values",
    [
        (linear(1.0, 0.0, steps=10), [(0, 1.0), (1, 0.9), (5, 0.5), (10, 0.0), (11, 0.0), (10**9, 0.0)]),
        (linear(0, 8, steps=8, every=2), [(0, 0.0), (1, 0.0), (2, 2.0), (3, 2.0), (7, 6.0), (8, 8.0), (100, 8.0)]),
        # every need not divide steps: u = min(floor(t/every)*every, steps)/steps
        (linear(0, 10, steps=10, every=4), [(3, 0.0), (4, 4.0), (8, 8.0), (11, 8.0), (12, 10.0)]),
        (exp(1.0, 0.01, steps=2), [(0, 1.0), (1, 0.1), (2, 0.01), (3, 0.01)]),
        (exp(0.9, 0.5, steps=100, every=50), [(0, 0.9), (49, 0.9), (50, math.sqrt(0.9 * 0.5)), (100, 0.5)]),
        (warmup(0.001, 0.1, steps=2), [(0, 0.001), (1, 0.01), (2, 0.1), (7, 0.1)]),
        (step(0.1, 0.01, 0.001, every=3), [(0, 0.1), (2, 0.1), (3, 0.01), (5, 0.01), (6, 0.001), (1000, 0.001)]),
        (step(5, every=1), [(0, 5.0), (9, 5.0)]),
    ],
    ids=str,
)
def test_values_at_steps(s, steps_values):
    for t, want in steps_values:
        got = s(t)
        assert isinstance(got, float)
        assert got == pytest.approx(want, rel=1e-12, abs=1e-15), (str(s), t)


def test_endpoints_are_exact_and_values_stay_between_them():
    s = warmup(0.25, 0.001, steps=7)
    assert s(0) == 0.25 and s(7) == 0.001 and s(8) == 0.001
    for t in range(8):
        assert 0.001 <= s(t) <= 0.25
    lin = linear(0.1, 0.3, steps=3)
    assert lin(3) == 0.3 and all(0.1 <= lin(t) <= 0.3 for t in range(5))
    # monotone
    assert all(s(t) >= s(t + 1) for t in range(10))


def test_dgc_warmup_densities():
    """DGC: density 25% -> 6.25% -> 1.56% -> 0.4% -> 0.1% over four epochs (E steps each)."""
    E = 391
    s = warmup(0.25, 0.001, steps=4 * E, every=E)
    epochs = [s(e * E + j) for e in range(5) for j in (0, E // 2, E - 1)]
    got = [s(e * E) for e in range(5)]
    assert got == pytest.approx([0.25, 0.0628717, 0.0158114, 0.00397635, 0.001], rel=1e-5)
    assert epochs[0:3] == [0.25] * 3  # constant within an epoch
    sparsity = [round(100 * (1 - d), 1) for d in got]
    assert sparsity == [75.0, 93.7, 98.4, 99.6, 99.9]
    assert s(100 * E) == 0.001


def test_step_argument_checks():
    s = linear(0, 1, steps=2)
    assert s(np.int64(1)) == 0.5
    for bad in (-1, 1.5, True, "1", None):
        with pytest.raises(ValueError, match="step must be an integer >= 0"):
            s(bad)


# ---------------------------------------------------------------- text and constructors
@pytest.mark.parametrize(
    "text, canonical",
    [
        ("warmup(0.25,0.001,steps=1000)", "warmup(0.25,0.001,steps=1000)"),
        ("warmup( 0.25 , 0.001 , steps = 1000 , every = 1 )", "warmup(0.25,0.001,steps=1000)"),
        ("warmup(start=0.25,end=0.001,steps=1000)", "warmup(0.25,0.001,steps=1000)"),
        ("warmup(0.25,end=0.001,every=10,steps=1000)", "warmup(0.25,0.001,steps=1000,every=10)"),
        ("linear(1,0,steps=10)", "linear(1.0,0.0,steps=10)"),
        ("linear(-1,2.5e-3,steps=1e3)", "linear(-1.0,0.0025,steps=1000)"),
        ("exp(0.9,0.5,steps=100,every=5)", "exp(0.9,0.5,steps=100,every=5)"),
        ("step(0.1,0.01,0.001,every=1000)", "step(0.1,0.01,0.001,every=1000)"),
        ("step(1,every=1)", "step(1.0,every=1)"),
    ],
)
def test_canonical_text_round_trips(text, canonical):
    s = build(parse_value(text))
    assert isinstance(s, Schedule) and isinstance(s, Call)
    assert str(s) == canonical and repr(s) == canonical
    back = build(parse_value(str(s)))
    assert back == s and hash(back) == hash(s) and str(back) == canonical
    assert schedule.parse(text) == s


def test_python_constructors_equal_parsed_ones():
    assert warmup(0.25, 0.001, steps=1000) == schedule.parse("warmup(0.25,0.001,steps=1000)")
    assert warmup(0.25, 0.001, steps=1000, every=1) == warmup(0.25, 0.001, steps=1000)
    assert linear(1, 0, steps=10) == schedule.parse("linear(1.0,0.0,steps=10.0)")
    assert exp(0.9, 0.5, steps=100, every=5) == schedule.parse("exp(0.9,0.5,steps=100,every=5)")
    assert step(0.1, 0.01, every=3) == schedule.parse("step(0.1,0.01,every=3)")
    assert Schedule("warmup", (0.25, 0.001), (("steps", 1000),)) == warmup(0.25, 0.001, steps=1000)
    # the name is kept: warmup and exp compute the same values but are different spec text
    w, e = warmup(0.25, 0.001, steps=10), exp(0.25, 0.001, steps=10)
    assert [w(t) for t in range(12)] == [e(t) for t in range(12)]
    assert w != e and str(w).startswith("warmup(")
    # a Schedule is not equal to the raw Call the parser produced
    assert parse_value("warmup(0.25,0.001,steps=1000)") != warmup(0.25, 0.001, steps=1000)
    assert build(w) is w


def test_fields_by_name():
    s = warmup(0.25, 0.001, steps=1000, every=10)
    assert (s.form, s.values, s.steps, s.every) == ("warmup", (0.25, 0.001), 1000, 10)
    assert s.points() == (("start", 0.25), ("end", 0.001))
    t = step(3, 2, 1, every=5)
    assert (t.values, t.steps, t.every) == ((3.0, 2.0, 1.0), None, 5)
    assert t.points() == (("v0", 3.0), ("v1", 2.0), ("v2", 1.0))


def test_schedule_pickles_and_hashes():
    s = warmup(0.25, 0.001, steps=1000, every=10)
    back = pickle.loads(pickle.dumps(s))
    assert back == s and hash(back) == hash(s) and str(back) == str(s) and back(20) == s(20)
    assert len({s, back, warmup(0.25, 0.001, steps=1000, every=10)}) == 1
    with pytest.raises(Exception):
        s.name = "exp"  # frozen


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("cosine(1,0,steps=10)", ["unknown schedule 'cosine'", "exp, linear, step, warmup"]),
        ("warmup(0.25,0.001)", ["schedule warmup", "missing steps="]),
        ("warmup(0.25,steps=10)", ["schedule warmup", "missing end"]),
        ("warmup(0.25,0.001,1000)", ["schedule warmup", "takes 2 positional values", "by name"]),
        ("warmup(0.25,0.001,steps=10,stpes=3)", ["schedule warmup", "unknown argument 'stpes'"]),
        ("warmup(0.25,0.001,steps=10,steps=20)", ["schedule warmup", "'steps' given twice"]),
        ("warmup(0.25,start=0.1,end=1,steps=10)", ["schedule warmup", "start given twice"]),
        ("warmup(0.25,0.001,steps=0)", ["schedule warmup", "steps must be an integer >= 1", "0"]),
        ("linear(0.25,0.001,steps=10,every=0)", ["schedule linear", "every must be an integer >= 1"]),
        ("linear(0.25,0.001,steps=10.5)", ["schedule linear", "steps must be an integer >= 1", "10.5"]),
        ("linear(0.25,0.001,steps=true)", ["schedule linear", "steps must be an integer"]),
        ("linear(0.25,word,steps=10)", ["schedule linear", "end must be a number", "'word'"]),
        ("linear(0.25,inf,steps=10)", ["schedule linear", "end must be finite"]),
        ("linear(0.25,warmup(1,2,steps=1),steps=10)", ["schedule linear", "end must be a number"]),
        ("exp(0.25,0,steps=10)", ["schedule exp", "must be > 0", "linear"]),
        ("warmup(-0.25,0.1,steps=10)", ["schedule warmup", "must be > 0"]),
        ("step(every=10)", ["schedule step", "at least one value"]),
        ("step(0.1,0.2)", ["schedule step", "missing every="]),
        ("step(0.1,0.2,every=2,steps=3)", ["schedule step", "unknown argument 'steps'"]),
        ("step(0.1,'x',every=2)", ["schedule step", "v1", "must be a number"]),
    ],
)
def test_bad_schedules_say_why(text, fragments):
    with pytest.raises(ValueError) as e:
        schedule.parse(text)
    for f in fragments:
        assert f in str(e.value), (f, str(e.value))


def test_python_constructor_errors():
    with pytest.raises(ValueError, match="schedule warmup: steps must be an integer >= 1"):
        warmup(0.25, 0.001, steps=-5)
    with pytest.raises(TypeError):
        warmup(0.25, 0.001)  # steps is a required keyword
    with pytest.raises(ValueError, match="schedule exp: start and end must be > 0"):
        exp(0.0, 1.0, steps=3)
    with pytest.raises(ValueError, match="expected a schedule"):
        build(0.5)
    with pytest.raises(ValueError, match="expected a schedule"):
        schedule.parse("0.5")
    with pytest.raises(ValueError, match="bad spec"):
        schedule.parse("warmup(0.25,")
    for text in ("_x(a=warmup(0.25,", "_x(a=warmup(", "_x(a=warmup(0.25"):  # a truncated call is a syntax error
        with pytest.raises(ValueError, match="bad spec"):
            parse(text)


# ---------------------------------------------------------------- Param.convert
P = Param("ratio", float, 0.01, "fraction kept", low=0.0, high=1.0, schedule=True)
PI = Param("n", int, 10, "an int", low=1, high=100, schedule=True)


def test_param_accepts_schedule_in_every_spelling():
    s = warmup(0.25, 0.001, steps=1000)
    for v in (s, parse_value(str(s)), str(s), " warmup(0.25, 0.001, steps=1000, every=1) "):
        got = P.convert(v, "topk")
        assert got == s and isinstance(got, Schedule)
    assert P.convert(0.5, "topk") == 0.5 and isinstance(P.convert(1, "topk"), float)
    assert PI.convert(linear(1, 100, steps=10), "x") == linear(1, 100, steps=10)
    assert PI.convert(7.0, "x") == 7 and isinstance(PI.convert(7.0, "x"), int)


@pytest.mark.parametrize(
    "value, fragments",
    [
        (warmup(2.0, 0.001, steps=10), ["topk: parameter ratio must be <= 1.0", "got 2.0", "start of warmup(2.0,0.001,steps=10)"]),
        ("linear(0.5,-0.1,steps=10)", ["topk: parameter ratio must be >= 0.0", "got -0.1", "end of linear(0.5,-0.1,steps=10)"]),
        ("step(0.5,1.5,0.1,every=2)", ["topk: parameter ratio must be <= 1.0", "v1 of step("]),
        ("warmup(0.25,0.001)", ["topk: parameter ratio: schedule warmup: missing steps="]),
        ("cosine(1,0,steps=3)", ["topk: parameter ratio: unknown schedule 'cosine'"]),
        ("word", ["topk: parameter ratio must be a number or a schedule such as warmup(", "'word'"]),
        ("warmup(0.25,", ["topk: parameter ratio must be a number or a schedule", "bad spec"]),
        ("0.5", ["topk: parameter ratio must be a number or a schedule", "'0.5'"]),
        (True, ["topk: parameter ratio must be a number or a schedule"]),
        (1.5, ["topk: parameter ratio must be <= 1.0, got 1.5"]),
    ],
)
def test_param_rejects_bad_values(value, fragments):
    with pytest.raises(ValueError) as e:
        P.convert(value, "topk")
    for f in fragments:
        assert f in str(e.value), (f, str(e.value))


def test_unschedulable_param_rejects_schedules():
    plain = Param("level", int, 3, "zstd level", low=1, high=22)
    with pytest.raises(ValueError, match=r"zstd: parameter level is not schedulable: it takes an integer, got warmup\(1.0,2.0,steps=3\)"):
        plain.convert(warmup(1, 2, steps=3), "zstd")
    with pytest.raises(ValueError, match=r"is not schedulable: it takes an integer, got warmup\(1,2\)"):
        plain.convert(parse_value("warmup(1,2)"), "zstd")
    with pytest.raises(ValueError, match="must be an integer, got 'linear"):
        plain.convert("linear(1,2,steps=3)", "zstd")
    with pytest.raises(ValueError, match="schedule=True needs an int or float"):
        Param("mode", str, "a", "doc", choices=("a", "b"), schedule=True)


def test_auto_param():
    p = Param("bin", int, None, "bin size or auto", low=1, auto=True)
    assert p.convert("auto", "adacomp") is None
    assert p.convert(None, "adacomp") is None
    assert p.convert(500, "adacomp") == 500
    with pytest.raises(ValueError, match="adacomp: parameter bin must be an integer or auto, got 'often'"):
        p.convert("often", "adacomp")
    with pytest.raises(ValueError, match="must be >= 1"):
        p.convert(0, "adacomp")
    with pytest.raises(ValueError, match="auto=True needs default None"):
        Param("bin", int, 500, "doc", auto=True)
    assert p.describe()["auto"] is True and "schedule" not in p.describe()
    assert P.describe()["schedule"] is True and "auto" not in P.describe()


# ---------------------------------------------------------------- stages and codecs
def test_describe_marks_schedulable_params(probe):
    (entry,) = [c for c in codec.list_codecs() if c["id"] == "_sched_probe"]
    by_name = {p["name"]: p for p in entry["params"]}
    assert by_name["value"]["schedule"] is True and by_name["count"]["schedule"] is True
    assert by_name["bin"]["auto"] is True and "schedule" not in by_name["bin"]


def test_stage_at(probe):
    st = probe(value=linear(1.0, 0.0, steps=4), count="step(1,2.5,3.5,every=2)")
    assert [st.at("value", t) for t in range(6)] == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    assert [st.at("count", t) for t in range(7)] == [1, 1, 3, 3, 4, 4, 4]  # int params round, halves up
    assert all(isinstance(st.at("count", t), int) for t in range(7))
    assert st.at("value") == 1.0  # default step 0
    const = probe(value=0.25)
    assert const.at("value", 0) == const.at("value", 10**6) == 0.25
    assert const.at("bin", 3) is None
    with pytest.raises(KeyError):
        const.at("nope", 0)


SPECS = [
    "_sched_probe(value=warmup(0.25,0.001,steps=1000))",
    "_sched_probe(value=linear(1.0,0.0,steps=10,every=2),count=step(1.0,2.0,every=5))+fp16+zstd",
    "_sched_probe(value=step(0.5,0.1,every=3),bin=7)",
]


@pytest.mark.parametrize("text", SPECS)
def test_codec_spec_and_config_round_trip(probe, text):
    c = codec.get_codec(text)
    assert c.spec == text  # canonical already
    cfg = c.get_config()
    assert all(isinstance(v, (str, int, float, bool)) for v in cfg.values())
    back = codec.get_codec(json.loads(json.dumps(cfg)))
    assert back == c and hash(back) == hash(c)
    assert codec.get_codec(c.get_config()) == codec.get_codec(text)
    assert codec.get_codec(c.spec) == c
    assert pickle.loads(pickle.dumps(c)) == c
    assert pickle.loads(pickle.dumps(c.stages[0])) == c.stages[0]
    assert hash(c.stages[0]) == hash(pickle.loads(pickle.dumps(c.stages[0])))
    assert c.spec in repr(c) and str(c.stages[0]).startswith("_sched_probe(")
    testing.check_config(c)


def test_spellings_give_one_canonical_codec(probe):
    want = codec.get_codec("_sched_probe(value=warmup(0.25,0.001,steps=1000))")
    for other in (
        codec.get_codec("_sched_probe", value=warmup(0.25, 0.001, steps=1000)),
        codec.get_codec("_sched_probe", value="warmup(0.25, 0.001, steps=1000, every=1)"),
        codec.get_codec(" _sched_probe ( value = warmup ( start=0.25 , end=1e-3 , steps=1000 ) , bin=auto )"),
        codec.get_codec({"id": "_sched_probe", "value": "warmup(0.25,0.001,steps=1000)", "bin": "auto"}),
    ):
        assert other == want and other.spec == want.spec and hash(other) == hash(want)
    assert codec.get_codec("_sched_probe(value=warmup(0.25,0.001,steps=1000))") != codec.get_codec(
        "_sched_probe(value=exp(0.25,0.001,steps=1000))"
    )


def test_auto_in_a_spec_is_the_default(probe):
    assert codec.get_codec("_sched_probe(bin=auto)") == codec.get_codec("_sched_probe")
    assert codec.get_codec("_sched_probe(bin=auto)").spec == "_sched_probe"
    assert codec.get_codec("_sched_probe(bin=none)") == codec.get_codec("_sched_probe")
    assert "bin" not in codec.get_codec("_sched_probe(bin=auto)").get_config()
    assert codec.get_codec("_sched_probe(bin=5)").get_config()["bin"] == 5


def test_bad_schedule_in_a_spec_names_stage_and_param(probe):
    with pytest.raises(ValueError, match=r"_sched_probe: parameter value must be >= 0.0, got -1.0 \(start of linear"):
        codec.get_codec("_sched_probe(value=linear(-1,1,steps=10))")
    with pytest.raises(ValueError, match="_sched_probe: parameter count must be <= 100"):
        codec.get_codec("_sched_probe(count=step(1,200,every=5))")
    with pytest.raises(ValueError, match="_sched_probe: parameter value: schedule warmup: missing steps="):
        codec.get_codec("_sched_probe(value=warmup(1,2))")
    with pytest.raises(ValueError, match="_sched_probe: parameter value: unknown schedule 'cosine'"):
        codec.get_codec({"id": "_sched_probe", "value": "cosine(1,0,steps=3)"})


def test_bare_encode_is_step_0_and_error_feedback_passes_the_step(probe):
    x = np.linspace(-1, 1, 201)
    c = codec.get_codec("_sched_probe(value=step(0.95,0.5,0.0,every=1))")
    kept = lambda frame: int(np.count_nonzero(codec.decode(frame)))  # noqa: E731
    assert kept(c.encode(x)) == kept(c.encode(x)) == int(np.count_nonzero(np.abs(x) >= 0.95))
    ef = codec.ErrorFeedback(c)
    counts, total = [], np.zeros_like(x)
    for t in range(4):
        assert ef.step("k") == t
        frame = ef.encode(np.zeros_like(x) if t else x, key="k")
        dec = codec.decode(frame)  # no schedule needed to decode: positions are in the frame
        total += dec
        counts.append(int(np.count_nonzero(dec)))
    # step 0 keeps |x| >= 0.95; step 1 the residual's |r| >= 0.5; step 2 (value 0) all the rest
    assert counts[0] == int(np.count_nonzero(np.abs(x) >= 0.95))
    assert counts[1] == int(np.count_nonzero((np.abs(x) >= 0.5) & (np.abs(x) < 0.95)))
    assert counts[2] == int(np.count_nonzero(np.abs(x) < 0.5)) - 1  # x has one exact zero
    assert counts[3] == 0
    assert np.array_equal(total, x)  # values are sent exactly, so the frames add up to x
