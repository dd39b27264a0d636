"""How a spec's stages make one codec: checked, ordered and completed with its default
value stage (:func:`arrange`), named back by their non-default parameters
(:func:`non_default`), and the registered stages listed (:func:`list_codecs`).
:class:`codec.pipeline.Codec` runs what this module assembles."""

from __future__ import annotations

from codec.errors import CodecTypeError, CodecValueError
from codec.stage import KINDS, Stage, lookup, registered


def default_value(chooser) -> Stage:
    """The value stage a pipeline without one gets: the select or transform stage's
    ``default_value`` (a registered name, or a Value class private to the stage), else ``none``."""
    value = "none" if chooser is None else chooser.default_value
    return (value if isinstance(value, type) else lookup(value))()


def non_default(stage: Stage) -> dict:
    """The parameters of ``stage`` set to other than their defaults (what its spec names)."""
    defaults = {p.name: p.default for p in stage.params}
    return {k: v for k, v in stage.config.items() if v != defaults[k] and v is not None}


def arrange(stages, text):
    """``stages`` checked as one codec's pipeline and returned in order (a tuple): Stage
    instances, at most one of each kind but ``bytes``, no name twice, no transform beside a
    select stage, in the order transform/select -> value -> bytes; the value stage the
    select or transform stage chooses inserted when none is given.  ``text``: the spec
    they came from, which errors quote."""
    where = f"bad spec {text!r}" if text else "bad pipeline"
    seen = {}
    for s in stages:
        if not isinstance(s, Stage):
            raise CodecTypeError(f"{where}: {s!r} is not a stage")
        if s.kind != "bytes" and s.kind in seen:
            raise CodecValueError(f"{where}: two {s.kind} stages ({seen[s.kind].name!r} and {s.name!r}); a codec has at most one")
        if any(t.name == s.name for t in stages if t is not s):
            raise CodecValueError(f"{where}: stage {s.name!r} appears twice")
        seen.setdefault(s.kind, s)
    if "transform" in seen and "select" in seen:
        raise CodecValueError(
            f"{where}: {seen['transform'].name!r} (transform) chooses its own coefficients; "
            f"it cannot be combined with the select stage {seen['select'].name!r}"
        )
    order = [KINDS.index(s.kind) for s in stages]
    for a, b in zip(range(len(stages)), range(1, len(stages))):
        if order[b] < order[a]:
            raise CodecValueError(
                f"{where}: stage {stages[b].name!r} ({stages[b].kind}) must come before {stages[a].name!r} "
                f"({stages[a].kind}); the order is {' -> '.join(KINDS)}"
            )
    if "value" not in seen:
        value = default_value(seen.get("select") or seen.get("transform"))
        i = next((i for i, s in enumerate(stages) if s.kind == "bytes"), len(stages))
        stages = stages[:i] + [value] + stages[i:]
    return tuple(stages)


def list_codecs() -> list[dict]:
    """Every registered stage: id, kind, one-line doc, parameters with types and defaults."""
    return [
        {"id": name, "kind": cls.kind, "lossless": cls.lossless, "doc": cls.summary(), "params": [p.describe() for p in cls.params]}
        for name, cls in registered().items()
    ]
