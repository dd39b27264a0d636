"""The targets: their names, each one's mutator and oracle (:data:`MUTATORS`, :data:`CHECKS`),
and the entry points that dispatch on a target: :func:`mutate`, :func:`check`,
:func:`known_labels`, :func:`target_function`.
"""

from __future__ import annotations

import random
import tracemalloc
import warnings
from pathlib import Path

import numpy as np

from codec.fuzzing.findings import Finding, Outcome, _Calls
from codec.fuzzing.mutators.container import mutate_container
from codec.fuzzing.mutators.frame import mutate_frame
from codec.fuzzing.mutators.many import mutate_many
from codec.fuzzing.mutators.spec import mutate_spec
from codec.fuzzing.mutators.state import mutate_state
from codec.fuzzing.oracles.container import check_container
from codec.fuzzing.oracles.frame import check_frame
from codec.fuzzing.oracles.many import check_many
from codec.fuzzing.oracles.spec import check_spec
from codec.fuzzing.oracles.state import check_state


#: the targets, one per parser that meets untrusted input
TARGETS = ["frame", "container", "many", "spec", "state"]


MUTATORS = {
    "frame": mutate_frame,
    "container": mutate_container,
    "many": mutate_many,
    "spec": mutate_spec,
    "state": mutate_state,
}


def mutate(target: str, rng: random.Random, data: bytes, other: bytes | None = None) -> bytes:
    """One mutation of ``data`` (an input of ``target``); ``other`` is a second input to splice."""
    return MUTATORS[target](rng, data, other)


CHECKS = {
    "frame": check_frame,
    "container": check_container,
    "many": check_many,
    "spec": check_spec,
    "state": check_state,
}


def check(target: str, data: bytes, *, track_memory: bool = True, extras: bool = True) -> Outcome:
    """Run one input through ``target`` and classify the outcome (see :class:`Outcome`).

    Memory is measured with tracemalloc when ``track_memory`` (started and stopped here if
    it is not running); ``extras`` adds the frame target's checks of odd ``out`` arguments."""
    started = False
    if track_memory and not tracemalloc.is_tracing():
        tracemalloc.start()
        started = True
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            calls = _Calls(track_memory)
            return CHECKS[target](data, calls, **({"extras": extras} if target == "frame" else {}))
    except Finding as f:
        return Outcome("finding", f.label, f.detail)
    finally:
        if started:
            tracemalloc.stop()


def known_labels(corpus_dir, target: str) -> set:
    """The finding classes the regression corpus ``corpus_dir/<target>/`` still shows."""
    d = Path(corpus_dir) / target
    out = set()
    for p in sorted(d.iterdir()) if d.is_dir() else ():
        if p.is_file() and p.suffix != ".md":
            o = check(target, p.read_bytes())
            if o.finding:
                out.add(o.label)
    return out


def target_function(target: str, track_memory: bool = False, ignore=frozenset()):
    """``f(data: bytes)`` raising :class:`Finding` on an outcome outside the promise (for
    atheris); finding classes in ``ignore`` (known ones, see :func:`known_labels`) pass."""

    def one(data: bytes) -> None:
        out = check(target, bytes(data), track_memory=track_memory)
        if out.finding and out.label not in ignore:
            raise Finding(out.label, out.detail)

    return one
