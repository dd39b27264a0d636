"""Spec strings: the text form of a codec pipeline.

Grammar (whitespace between tokens is ignored)::

    spec     := stage ("+" stage)*
    stage    := NAME [ "(" [ arg ("," arg)* ] ")" ]
    arg      := NAME "=" value
    value    := NUMBER | "true" | "false" | "none" | NAME | STRING | call
    call     := NAME "(" [ item ("," item)* ] ")"          e.g. warmup(0.25, 0.001, steps=1000)
    item     := value | NAME "=" value
    NAME     := [A-Za-z_][A-Za-z0-9_]*
    NUMBER   := a Python int or float literal, optionally signed (1, -2, 0.001, 1e-3)
    STRING   := '...' or "..." without escapes

``parse`` returns ``[(name, {param: value})]``; ``format_spec`` is its inverse and produces
the canonical text stored in frames.  Which names and parameters exist is the registry's
business (``codec.stage``), not the parser's.  A ``call`` value is returned as a :class:`Call`;
a stage parameter declared ``schedule=True`` turns it into a :class:`codec.schedule.Schedule`
(``linear``, ``exp``, ``warmup``, ``step``: see docs/spec.md, "Schedules"), which is a ``Call``
too and formats back to the same canonical text.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from codec.errors import CodecTypeError, CodecValueError

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<number>[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|inf|nan)(?![A-Za-z_0-9]))
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<string>'[^']*'|"[^"]*")
      | (?P<punct>[+(),=])
    )""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class Call:
    """A nested call value such as ``warmup(0.25, 0.001, steps=1000)``."""

    name: str
    args: tuple = ()
    kwargs: tuple = field(default=())  # tuple of (key, value) pairs, in order

    def __str__(self) -> str:
        items = [format_value(a) for a in self.args] + [f"{k}={format_value(v)}" for k, v in self.kwargs]
        return f"{self.name}({','.join(items)})"


class SpecError(CodecValueError):
    """A spec string that does not parse (docs/spec.md); a ``ValueError`` too."""


#: the longest spec text parsed (characters); a frame's spec field holds 4,096 bytes, and the
#: parser's time grows with the text (a 500,000-character spec took 1.9 s)
MAX_TEXT = 65536


def _bounded(text: str, what: str) -> str:
    if len(text) > MAX_TEXT:
        raise SpecError(f"bad {what} {text[:40]!r}...: {len(text)} characters, more than the {MAX_TEXT} a spec may have")
    return text


def _tokens(text: str):
    pos = 0
    out = []
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            rest = text[pos:].lstrip()
            raise SpecError(f"bad spec {text!r}: unexpected {rest.rstrip()[:20]!r} at position {len(text) - len(rest)}")
        kind = m.lastgroup
        out.append((kind, m.group(kind), m.start(kind)))
        pos = m.end()
    out.append(("end", "", len(text)))
    return out


#: how deeply call values may nest (a schedule is one level: ``warmup(0.25,0.001,steps=1000)``);
#: deeper text is refused before the parser, the formatter or a schedule could recurse on it
MAX_DEPTH = 8
#: the most digits an integer literal may have (no parameter bound needs more than 20)
MAX_DIGITS = 1000


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.toks = _tokens(text)
        self.i = 0
        self.depth = 0

    def peek(self):
        return self.toks[self.i]

    def take(self, kind=None, value=None, what=None):
        tok = self.toks[self.i]
        if (kind and tok[0] != kind) or (value and tok[1] != value):
            found = repr(tok[1]) if tok[0] != "end" else "the end"
            raise SpecError(f"bad spec {self.text!r}: expected {what or value or kind} at position {tok[2]}, found {found}")
        self.i += 1
        return tok

    def is_punct(self, ch):
        tok = self.peek()
        return tok[0] == "punct" and tok[1] == ch

    def spec(self):
        stages = [self.stage()]
        while self.is_punct("+"):
            self.take()
            stages.append(self.stage())
        self.take("end", what="'+' or the end")
        return stages

    def stage(self):
        name = self.take("name", what="a stage name")[1]
        params = {}
        if self.is_punct("("):
            self.take()
            if not self.is_punct(")"):
                while True:
                    key_tok = self.take("name", what="a parameter name")
                    key = key_tok[1]
                    if key in params:
                        raise SpecError(f"bad spec {self.text!r}: parameter {key!r} given twice at position {key_tok[2]}")
                    self.take("punct", "=", what="'='")
                    params[key] = self.value()
                    if not self.is_punct(","):
                        break
                    self.take()
            self.take("punct", ")", what="',' or ')'")
        return name, params

    def value(self):
        kind, text, pos = self.peek()
        if kind == "number":
            self.take()
            if re.fullmatch(r"[+-]?\d+", text):
                if len(text.lstrip("+-")) > MAX_DIGITS:  # (int() refuses 4,300 digits with a plain ValueError)
                    raise SpecError(f"bad spec {self.text[:80]!r}: an integer of {len(text.lstrip('+-'))} digits at position {pos}; at most {MAX_DIGITS}")
                return int(text)
            return float(text)
        if kind == "string":
            self.take()
            return text[1:-1]
        if kind == "name":
            self.take()
            if self.is_punct("("):
                return self.call(text)
            low = text.lower()
            return {"true": True, "false": False, "none": None}.get(low, text)
        raise SpecError(f"bad spec {self.text!r}: expected a value at position {pos}, found {repr(text) if text else 'the end'}")

    def call(self, name):
        tok = self.take("punct", "(")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise SpecError(f"bad spec {self.text[:80]!r}: call values nest more than {MAX_DEPTH} deep at position {tok[2]}")
        args, kwargs = [], []
        if not self.is_punct(")"):
            while True:
                tok = self.peek()
                nxt = self.toks[min(self.i + 1, len(self.toks) - 1)]
                if tok[0] == "name" and nxt[0] == "punct" and nxt[1] == "=":
                    self.take()
                    self.take()
                    kwargs.append((tok[1], self.value()))
                else:
                    if kwargs:
                        raise SpecError(f"bad spec {self.text!r}: positional argument after keyword at position {tok[2]}")
                    args.append(self.value())
                if not self.is_punct(","):
                    break
                self.take()
        self.take("punct", ")", what="',' or ')'")
        self.depth -= 1
        return Call(name, tuple(args), tuple(kwargs))


def parse(text: str) -> list[tuple[str, dict]]:
    """Parse a spec string into ``[(stage_name, params)]``; raises ValueError on bad syntax."""
    if not isinstance(text, str):
        raise CodecTypeError(f"spec: expected a string, got {type(text).__name__}")
    if not _bounded(text, "spec").strip():
        raise SpecError("bad spec '': empty; expected a stage name such as 'fp16'")
    return _Parser(text).spec()


def parse_value(text: str):
    """Parse one parameter value (``"0.5"``, ``"auto"``, ``"warmup(0.25,0.001,steps=1000)"``)
    as it would appear after ``name=`` in a spec; raises ValueError on bad syntax."""
    if not isinstance(text, str):
        raise CodecTypeError(f"spec value: expected a string, got {type(text).__name__}")
    p = _Parser(_bounded(text, "spec value"))
    v = p.value()
    p.take("end", what="the end of the value")
    return v


def format_value(v) -> str:
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "none"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, Call):
        return str(v)
    if isinstance(v, str):
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v) and v.lower() not in ("true", "false", "none", "inf", "nan"):
            return v
        # STRING has no escapes: a text holding one kind of quote goes between the other kind
        if "'" not in v:
            return f"'{v}'"
        if '"' not in v:
            return f'"{v}"'
        raise CodecValueError(f"cannot put {v!r} in a spec string: it holds both kinds of quote")
    raise CodecTypeError(f"cannot put {v!r} in a spec string")


def format_stage(name: str, params: dict) -> str:
    if not params:
        return name
    return f"{name}(" + ",".join(f"{k}={format_value(v)}" for k, v in params.items()) + ")"


def format_spec(stages) -> str:
    """Inverse of :func:`parse`."""
    return "+".join(format_stage(n, p) for n, p in stages)
