"""The stage contract (codec/stage/): one base class per kind, required hooks checked when
a stage class is defined, the registry, and the shared parameters (codec/params.py)."""

from __future__ import annotations

import pytest

import codec
from codec import params
from codec.params import Param
from codec.stage import KINDS, Bytes, Select, Stage, Transform, Value, register, registered


@pytest.mark.parametrize(
    "base, hooks",
    [
        (Transform, {"forward", "read", "inverse", "bound"}),
        (Select, {"select", "positions", "bound"}),
        (Value, {"encode", "read", "write", "bound"}),
        (Bytes, {"frame_options"}),
    ],
)
def test_a_stage_missing_a_required_hook_fails_when_defined(base, hooks):
    assert set(base.__abstractmethods__) == hooks and base.kind in KINDS
    for missing in sorted(hooks):
        body = {h: (lambda self, *a, **k: None) for h in hooks if h != missing}
        with pytest.raises(TypeError, match=f"does not define {missing}"):
            type("Incomplete", (base,), {"name": "_incomplete", **body})
    type("Complete", (base,), {"name": "_complete", **{h: (lambda self, *a, **k: None) for h in hooks}})


def test_an_abstract_helper_base_may_leave_hooks_open_but_its_stages_may_not():
    from codec.stages.value.quantizer import Quantizer

    with pytest.raises(TypeError, match="does not define bound, quantize, read"):
        type("NoQuantize", (Quantizer,), {"name": "_nq"})


def test_a_named_stage_must_derive_from_its_kinds_base():
    with pytest.raises(TypeError, match="derive from the base of its kind"):
        type("Bare", (Stage,), {"name": "_bare", "kind": "value"})
    with pytest.raises(TypeError):
        register(int)


def test_every_registered_stage_derives_from_its_kinds_base():
    bases = {"transform": Transform, "select": Select, "value": Value, "bytes": Bytes}
    for name, cls in registered().items():
        assert issubclass(cls, bases[cls.kind]), name


def test_the_pipeline_reads_typed_hooks():
    """Optional hooks have a typed default on the base: nothing is looked up with getattr."""
    assert Select.fuses_feedback is False and Select.scales_values is False and Select.default_value == "none"
    assert Transform.default_value == "none"
    assert Value.encode_feedback(codec.get_codec("none").value, None, None, None, []) is None
    c = codec.get_codec("adacomp")
    assert c.value.name == "adacomp.signs" and isinstance(c.value, Value)


def test_stage_folders_tell_the_kind():
    for name, cls in registered().items():
        assert cls.__module__.startswith(f"codec.stages.{cls.kind}."), (name, cls.__module__)


# -------------------------------------------------------------------- shared parameters
def test_open_lower_bound():
    p = Param("x", float, 0.5, "doc", low=0.0, low_open=True, high=1.0)
    assert p.convert(1e-300, "s") == 1e-300
    with pytest.raises(ValueError, match=r"s: parameter x must be > 0.0, got 0.0"):
        p.convert(0.0, "s")
    assert p.describe()["min_open"] is True
    closed = Param("x", float, 0.5, "doc", low=0.0)
    assert closed.convert(0.0, "s") == 0.0 and "min_open" not in closed.describe()


@pytest.mark.parametrize("spec", ["topk", "gaussiank", "dgc", "randomk"])
def test_every_ratio_is_the_shared_parameter(spec):
    r = next(p for p in codec.stage.lookup(spec).params if p.name == "ratio")
    assert (r.low, r.low_open, r.high, r.schedule) == (0.0, True, 1.0, True)
    with pytest.raises(ValueError, match=rf"{spec}: parameter ratio must be > 0.0, got 0.0"):
        codec.get_codec(f"{spec}(ratio=0)")
    with pytest.raises(ValueError, match=rf"{spec}: parameter ratio must be > 0.0, got 0.0 \(end of linear"):
        codec.get_codec(f"{spec}(ratio=linear(0.5,0,steps=10))")


def test_shared_parameters_are_one_object():
    seeds = {id(p) for cls in registered().values() for p in cls.params if p.name == "seed"}
    nonfinite = {id(p) for cls in registered().values() for p in cls.params if p.name == "nonfinite"}
    assert seeds == {id(params.SEED)} and nonfinite == {id(params.NONFINITE)}
    roundings = {p for cls in registered().values() for p in cls.params if p.name == "rounding"}
    assert {p.choices for p in roundings} == {("nearest", "stochastic")}
