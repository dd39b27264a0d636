"""Spec strings: grammar, canonical form, and the errors a user sees."""

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

import codec
from codec.errors import CodecError, CodecTypeError, CodecValueError
from codec.spec import Call, SpecError, format_spec, format_stage, format_value, parse, parse_value


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
    "text, message",
    [
        ("", "empty; expected a stage name such as 'fp16'"),
        ("fp16(", "expected a parameter name at position 5, found the end"),
        ("fp16(=3)", "expected a parameter name at position 5, found '='"),
        ("fp16+", "expected a stage name at position 5, found the end"),
        ("(fp16)", "expected a stage name at position 0, found '('"),
        ("topk(ratio=)", "expected a value at position 11, found ')'"),
        ("topk(ratio=", "expected a value at position 11, found the end"),
        ("f(x=g(", "expected a value at position 6, found the end"),
        ("f(x=g(a=", "expected a value at position 8, found the end"),
        ("f(x=g(1", "expected ',' or ')' at position 7, found the end"),
        ("fp16(level=3", "expected ',' or ')' at position 12, found the end"),
        ("fp16(level=3 4)", "expected ',' or ')' at position 13, found '4'"),
        ("a(b=1,b=2)", "parameter 'b' given twice at position 6"),
        ("fp16 zstd", "expected '+' or the end at position 5, found 'zstd'"),
        ("  fp16  zstd", "expected '+' or the end at position 8, found 'zstd'"),
        ("fp16(level 3)", "expected '=' at position 11, found '3'"),
        ("fp16(level(3)", "expected '=' at position 10, found '('"),
        ("f(x=g(a=1,2))", "positional argument after keyword at position 10"),
        ("fp16#", "unexpected '#' at position 4"),
        ("a(b=1x)", "unexpected '1x)' at position 4"),
        # the unexpected text is shown up to 20 characters
        ("fp16 #abcdefghijklmnopqrstuvwxyz", "unexpected '#abcdefghijklmnopqrs' at position 5"),
    ],
)
def test_bad_syntax_names_the_token_and_its_position(text, message):
    with pytest.raises(SpecError, match=f"^{re.escape(f'bad spec {text!r}: {message}')}$"):
        parse(text)


def test_blank_spec_is_empty():
    with pytest.raises(SpecError, match=r"^bad spec '': empty; expected a stage name such as 'fp16'$"):
        parse("  \t")


def test_parse_value_refuses_what_follows_the_value():
    with pytest.raises(SpecError, match=r"^bad spec '1 2': expected the end of the value at position 2, found '2'$"):
        parse_value("1 2")
    with pytest.raises(SpecError, match=r"^bad spec '': expected a value at position 0, found the end$"):
        parse_value("")


def test_spec_errors_are_codec_errors_and_value_errors():
    with pytest.raises(SpecError) as e:
        parse("fp16(")
    assert isinstance(e.value, CodecError) and isinstance(e.value, ValueError)


@pytest.mark.parametrize("text, got", [(b"fp16", "bytes"), (None, "NoneType"), (["fp16"], "list")])
def test_only_text_is_parsed(text, got):
    with pytest.raises(CodecTypeError, match=f"^spec: expected a string, got {got}$"):
        parse(text)
    with pytest.raises(CodecTypeError, match=f"^spec value: expected a string, got {got}$"):
        parse_value(text)


def test_values_have_their_types():
    (name, p), = parse("a(b=1,c=+2,d=-3,e=1.,f=.5,g=1e3,h=-2.5E-3,i=007,j=TRUE,k=False,l=NONE,m=\"dq\",n=infinity,o=nanny)")
    assert name == "a"
    assert p == {"b": 1, "c": 2, "d": -3, "e": 1.0, "f": 0.5, "g": 1000.0, "h": -0.0025, "i": 7,
                 "j": True, "k": False, "l": None, "m": "dq", "n": "infinity", "o": "nanny"}
    assert [type(p[k]) for k in "bcdi"] == [int] * 4 and [type(p[k]) for k in "efgh"] == [float] * 4
    (_, q), = parse("a(i=inf,j=-inf,k=+inf,l=nan,m=-nan)")
    assert q["i"] == math.inf and q["j"] == -math.inf and q["k"] == math.inf
    assert math.isnan(q["l"]) and math.isnan(q["m"])


def test_parse_value():
    assert parse_value("0.5") == 0.5 and type(parse_value("3")) is int
    assert parse_value(" auto ") == "auto"
    assert parse_value("none") is None and parse_value("True") is True
    assert parse_value("warmup(0.25,0.001,steps=1000)") == Call("warmup", (0.25, 0.001), (("steps", 1000),))


def test_empty_parentheses():
    assert parse("fp16()") == [("fp16", {})]
    assert parse("a(b=g())") == [("a", {"b": Call("g")})]
    assert format_spec(parse("a(b=g())")) == "a(b=g())"


def test_canonical_text_of_every_kind_of_value():
    """The canonical text stored in frames: booleans, none, NaN and the infinities by name,
    a string as a name when it can be one and quoted when it cannot."""
    params = {"b": True, "c": False, "d": None, "e": math.nan, "f": math.inf, "g": -math.inf, "h": 3, "i": -7,
              "j": 0.5, "k": -0.0, "l": 1e-07, "m": "word", "n": "two words", "o": "none", "p": "True", "q": "inf",
              "r": "NaN", "s": "", "t": "1", "u": "it's", "v": 'say "hi"'}
    text = format_spec([("a", params), ("zstd", {})])
    assert text == ("a(b=true,c=false,d=none,e=nan,f=inf,g=-inf,h=3,i=-7,j=0.5,k=-0.0,l=1e-07,m=word,n='two words',"
                    "o='none',p='True',q='inf',r='NaN',s='',t='1',u=\"it's\",v='say \"hi\"')+zstd")
    (name, back), zstd = parse(text)
    assert name == "a" and zstd == ("zstd", {}) and list(back) == list(params)
    assert math.isnan(back.pop("e")) and math.isnan(params.pop("e"))
    assert back == params
    assert all(type(back[k]) is type(params[k]) for k in params)
    assert format_value(True) == "true" and format_value(False) == "false" and format_value(None) == "none"
    assert format_value(math.nan) == "nan" and format_value(math.inf) == "inf" and format_value(-math.inf) == "-inf"
    assert format_value(0) == "0" and format_value(0.0) == "0.0"


def test_a_string_holding_both_quotes_has_no_spec_text():
    """format_value("it's") gave 'it's', which does not parse back: a text with one kind of
    quote now goes between the other kind, and one with both is refused."""
    assert parse(format_spec(parse("a(b=\"it's\")"))) == [("a", {"b": "it's"})]
    both = "a'b" + '"c'
    with pytest.raises(CodecValueError, match=f"^cannot put {re.escape(repr(both))} in a spec string: it holds both kinds of quote$"):
        format_value(both)


@pytest.mark.parametrize("value, shown", [([1], r"\[1\]"), (1j, r"1j"), (b"x", r"b'x'")])
def test_values_with_no_spec_text_are_refused(value, shown):
    with pytest.raises(CodecTypeError, match=f"^cannot put {shown} in a spec string$"):
        format_value(value)


def test_call_text():
    assert str(Call("warmup", (0.25, 0.001), (("steps", 1000),))) == "warmup(0.25,0.001,steps=1000)"
    c = Call("f", (True, None, "two words", -math.inf), (("k", Call("g", (1,))), ("m", False)))
    assert str(c) == format_value(c) == "f(true,none,'two words',-inf,k=g(1),m=false)"
    assert parse_value(str(c)) == c
    assert format_stage("fp16", {}) == "fp16" and format_stage("a", {"b": c}) == f"a(b={c})"


def test_ten_sibling_call_values():
    """Sibling calls do not add up to a nesting depth: ten of them, as parameters and as one
    call's arguments, parse."""
    text = "s(" + ",".join(f"p{i}=f({i})" for i in range(10)) + ")"
    want = [("s", {f"p{i}": Call("f", (i,)) for i in range(10)})]
    assert parse(text) == want and format_spec(want) == text
    inner = "s(p=f(" + ",".join(f"g({i},k=h({i}))" for i in range(10)) + "))"
    (_, p), = parse(inner)
    assert p["p"] == Call("f", tuple(Call("g", (i,), (("k", Call("h", (i,))),)) for i in range(10)))
    assert format_spec(parse(inner)) == inner


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
        with pytest.raises(SpecError, match=f"call values nest more than {MAX_DEPTH} deep at position "):
            codec.get_codec(f"fp16(nonfinite={deep})")


def test_call_values_nest_eight_deep():
    """The depth is counted along one chain of calls: eight deep parses, nine does not, and
    a call closed before does not count (the message shows the text's first 80 characters)."""
    assert parse("a(b=" + "f(" * 8 + "1" + ")" * 8 + ")")[0][1]["b"].name == "f"
    text = "topk(ratio=" + "abcdefghij(" * 9 + "1" + ")" * 10
    with pytest.raises(SpecError, match=f"^{re.escape(f'bad spec {text[:80]!r}: call values nest more than 8 deep at position 109')}$"):
        parse(text)
    # g(1) is closed before the chain of h: h nests eight deep below f, nine in all
    closed = "a(b=f(g(1)," + "h(" * 7 + "1" + ")" * 7 + "))"
    assert parse(closed)[0][1]["b"].args[0] == Call("g", (1,))
    deeper = "a(b=f(g(1)," + "h(" * 8 + "1" + ")" * 8 + "))"
    with pytest.raises(SpecError, match=r"call values nest more than 8 deep at position 26$"):
        parse(deeper)


def test_schedule_value_beyond_float64_is_a_value_error():
    """A schedule point given as a 400-digit integer raised OverflowError; found by the fuzzer."""
    with pytest.raises(ValueError, match="finite"):
        codec.get_codec("topk(ratio=warmup(1" + "0" * 400 + ",0.01,steps=10))")


def test_long_texts_and_huge_integers_are_spec_errors():
    """A 900 KB spec took the parser 10 s (found by the long fuzz run of issue 28) and an
    integer of 4,300 digits or more raised Python's plain ValueError from int(): a spec holds
    at most MAX_TEXT characters and an integer at most MAX_DIGITS digits, both SpecErrors."""
    from codec.spec import MAX_DIGITS, MAX_TEXT, SpecError, parse, parse_value

    assert (MAX_TEXT, MAX_DIGITS) == (65536, 1000)
    longest = "fp16" + " " * (MAX_TEXT - 4)
    assert parse(longest) == [("fp16", {})]
    with pytest.raises(SpecError, match=rf"^bad spec 'fp16 {' ' * 35}'\.\.\.: 65537 characters, more than the 65536 a spec may have$"):
        parse(longest + " ")
    with pytest.raises(SpecError, match=r"^bad spec value '1{40}'\.\.\.: 65537 characters"):
        parse_value("1" * (MAX_TEXT + 1))
    assert parse_value("9" * MAX_DIGITS) == int("9" * MAX_DIGITS)
    assert parse_value("-" + "9" * MAX_DIGITS) == -int("9" * MAX_DIGITS)
    for text in ("9" * (MAX_DIGITS + 1), "+" + "9" * 5000):
        with pytest.raises(SpecError, match=rf"an integer of {len(text.lstrip('+'))} digits at position 0; at most 1000$"):
            parse_value(text)
    with pytest.raises(SpecError, match=r"an integer of 4301 digits at position 11; at most 1000"):
        codec.get_codec("topk(ratio=" + "1" * 4301 + ")")
    text = "topk(ratio=" + "1" * 1001 + ")"
    with pytest.raises(SpecError) as info:
        parse(text)
    assert str(info.value) == f"bad spec {text[:80]!r}: an integer of 1001 digits at position 11; at most 1000"
