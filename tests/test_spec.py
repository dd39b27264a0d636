"""Spec strings: grammar, canonical form, and the errors a user sees."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

import codec
from codec.spec import Call, format_spec, parse


@pytest.mark.parametrize(
    "text, want",
    [
        ("fp16", [("fp16", {})]),
        (" topk ( ratio = 0.001 ) + zstd ", [("topk", {"ratio": 0.001}), ("zstd", {})]),
        ("a(b=1,c=-2.5e-3,d=true,e=false,f=none,g=word,h='two words')",
         [("a", {"b": 1, "c": -0.0025, "d": True, "e": False, "f": None, "g": "word", "h": "two words"})]),
        ("topk(ratio=warmup(0.25,0.001,steps=1000))",
         [("topk", {"ratio": Call("warmup", (0.25, 0.001), (("steps", 1000),))})]),
    ],
)
def test_parse(text, want):
    assert parse(text) == want
    assert parse(format_spec(want)) == want


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "empty"),
        ("fp16(", "parameter name"),
        ("fp16+", "stage name"),
        ("topk(ratio=)", "expected a value at position 11"),
        ("a(b=1,b=2)", "given twice"),
        ("fp16 zstd", "'zstd'"),
        ("fp16(level 3)", "'='"),
        ("f(x=g(a=1,2))", "positional argument after keyword"),
        ("fp16#", "'#'"),
    ],
)
def test_bad_syntax_names_the_token(text, fragment):
    with pytest.raises(ValueError, match="bad spec") as e:
        parse(text)
    assert fragment in str(e.value)


def test_unknown_stage_lists_valid_choices():
    with pytest.raises(codec.UnknownCodecError) as e:
        codec.get_codec("fp17")
    assert "'fp17'" in str(e.value) and "fp16" in str(e.value) and "zstd" in str(e.value)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("fp16(bits=3)", "unknown parameter 'bits'"),
        ("zstd(level=99)", "level must be <= 22"),
        ("zstd(level=1.5)", "must be an integer"),
        ("fp16(nonfinite=ignore)", "must be one of ['raise', 'keep']"),
        ("threshold(value=-1)", "must be >= 0"),
        ("threshold(value=nan)", "must be finite"),
        ("fp16+bf16", "two value stages"),
        ("zstd+fp16", "must come before"),
        ("zstd+zstd", "appears twice"),
    ],
)
def test_bad_parameters_and_order(text, fragment):
    with pytest.raises(ValueError) as e:
        codec.get_codec(text)
    assert fragment in str(e.value)


def test_canonical_spec_drops_defaults_and_implicit_value_stage():
    assert codec.get_codec("fp16(nonfinite=raise)").spec == "fp16"
    assert codec.get_codec("zstd").spec == "none+zstd"
    assert codec.get_codec("threshold(value=0.5)+none").spec == "threshold(value=0.5)"
    assert codec.get_codec("threshold(value=0.5)+fp16+zstd(level=1)").spec == "threshold(value=0.5)+fp16+zstd(level=1)"


_names = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True).filter(lambda s: s not in ("true", "false", "none", "inf", "nan"))
_values = st.one_of(
    st.integers(-10**12, 10**12),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
    _names,
)


@given(st.lists(st.tuples(_names, st.dictionaries(_names, _values, max_size=3)), min_size=1, max_size=4))
def test_format_parse_round_trip(stages):
    assert parse(format_spec(stages)) == stages


def test_call_values_nest_at_most_max_depth():
    """A value nested 300 calls deep raised RecursionError (parsing, or formatting the error
    when no schedule was allowed there); found by the fuzzer."""
    from codec.spec import MAX_DEPTH, SpecError, parse

    ok = "f(" * MAX_DEPTH + "1" + ")" * MAX_DEPTH
    assert parse(f"topk(ratio={ok})")[0][0] == "topk"
    for depth in (MAX_DEPTH + 1, 300, 5000):
        deep = "f(" * depth + "1" + ")" * depth
        with pytest.raises(SpecError, match="nest more than"):
            parse(f"topk(ratio={deep})")
        with pytest.raises(ValueError):
            codec.get_codec(f"fp16(nonfinite={deep})")


def test_schedule_value_beyond_float64_is_a_value_error():
    """A schedule point given as a 400-digit integer raised OverflowError; found by the fuzzer."""
    with pytest.raises(ValueError, match="finite"):
        codec.get_codec("topk(ratio=warmup(1" + "0" * 400 + ",0.01,steps=10))")
