"""The seed corpus of every target (:func:`seed_corpus`), generated from every codec and cached."""

from __future__ import annotations

import random
import warnings
from dataclasses import dataclass

import codec
from codec import container as _container
from codec.fuzzing.formats import dumps_state, join_many, layout_prefix
from codec.fuzzing.seeds import seed_arrays, seed_specs, select_value_pairs


@dataclass
class Seeds:
    """The seed corpus: per target a list of ``(label, input bytes)``; ``label`` is the spec
    of the codec that made it (what the per-codec counts of a run are keyed by)."""

    by_target: dict

    def of(self, target: str) -> list:
        return self.by_target[target]


def _encode_all(spec: str, arrays, feedback: bool):
    c = codec.get_codec(spec)
    frames = []
    for a in arrays:
        try:
            if feedback:
                ef = codec.ErrorFeedback(c)
                for step in range(2):
                    frames.append(ef.encode(a * (1 + step), key="k"))
            else:
                frames.append(c.encode(a, key="k", step=1))
        except (ValueError, TypeError):
            continue  # e.g. a codec that needs a 2-D array, or non-finite values refused
    return frames


def _many_seeds(specs, arrays) -> list:
    """Per codec, many-tensor frames of 1, 2 and 4 of the seed arrays (named and not, table
    and layout-hash form, with error feedback in one of them) and one joint frame, each
    behind its layout."""
    out = []
    rng = random.Random(2)
    for spec in specs:
        c = codec.get_codec(spec)
        for k, form, named in ((1, "table", True), (2, "hash", False), (4, "hash", True), (4, "table", False), (3, "joint", True)):
            pick = [arrays[rng.randrange(len(arrays))] for _ in range(k)]
            tensors = {f"t{i}": a for i, a in enumerate(pick)} if named else pick
            try:
                if form == "joint":  # the whole-model variant: one dtype, coded as one
                    same = [a for a in pick if a.dtype == pick[0].dtype]
                    tensors = {f"t{i}": a for i, a in enumerate(same)}
                    frame = c.encode_many(tensors, joint=True, step=1)
                elif k == 2:
                    ef = codec.ErrorFeedback(c)
                    ef.encode_many(tensors, layout=form)
                    frame = ef.encode_many(tensors, layout=form)
                else:
                    frame = c.encode_many(tensors, layout=form, step=1)
            except (ValueError, TypeError):
                continue  # a codec that refuses one of the arrays
            out.append((spec, join_many(layout_prefix(codec.Layout.of(tensors)), frame)))
    out.append(("-", join_many(layout_prefix(codec.Layout.of([])), codec.get_codec("none").encode_many([]))))
    return out


_SEED_CACHE: dict = {}


def seed_corpus(full: bool = True, specs=None) -> Seeds:
    """The seed corpus of every target, generated from every codec (deterministic)."""
    key = (full, tuple(specs) if specs else None)
    if key in _SEED_CACHE:
        return _SEED_CACHE[key]
    specs = list(specs) if specs else seed_specs()
    arrays = seed_arrays(full=full)
    frames = []  # (spec, frame)
    states = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for spec in specs:
            for fb in (False, True):
                for f in _encode_all(spec, arrays, fb):
                    frames.append((spec, f))
            for momentum in (0.0, 0.5):
                ef = codec.ErrorFeedback(spec, momentum=momentum)
                for i, a in enumerate(arrays[:: 3 if full else 2]):
                    try:
                        ef.encode(a, key=("t", i) if i % 2 else f"k{i}")
                    except (ValueError, TypeError):
                        pass
                states.append((spec, dumps_state({"codec": spec, "momentum": momentum, "state": ef.state_dict()})))
    by_spec: dict = {}
    for spec, f in frames:
        by_spec.setdefault(spec, []).append(f)
    containers = []
    rng = random.Random(1)
    names = ["", "w", "layer1.weight", "é/ü", "x" * 40]
    for spec, fs in by_spec.items():
        for k in (1, 2, 4):
            pick = [rng.choice(fs) for _ in range(k)]
            containers.append((spec, _container.pack_frames([(f"{names[i % len(names)]}{i}", f) for i, f in enumerate(pick)])))
    containers.append(("-", _container.pack_frames([])))
    spec_seeds = [(s, s.encode()) for s in specs]
    spec_seeds += [(s, s.encode()) for s in select_value_pairs() if s not in specs]
    for s in specs:  # canonical forms too (what frames carry)
        canon = codec.get_codec(s).spec
        if canon != s:
            spec_seeds.append((s, canon.encode()))
    out = Seeds({"frame": frames, "container": containers, "many": _many_seeds(specs, arrays), "spec": spec_seeds, "state": states})
    _SEED_CACHE[key] = out
    return out
