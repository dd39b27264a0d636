"""Many tensors in one call: ``Codec.encode_many`` (the format, v2, is :mod:`codec.manyframe`;
decoding it is :mod:`codec.manydecode`).

:func:`encode_step` is the many-tensor step's one owner: ``Codec.encode_many`` and
``ErrorFeedback.encode_many`` both call it (error feedback handing it its half of the step,
:class:`codec.feedback.runstep.ManyFeedback`), and it calls down into the runs
(:mod:`codec.runs`) and the codec's pipeline primitives.

Encoding runs every tensor's stages with its own context, except where a stage can code a
run of small tensors at once (:mod:`codec.runs`: an elementwise value stage, a quantizer's
``encode_run``, a select stage's ``select_segments``); either way the frame holds the bytes
per-tensor coding gives.
"""

from __future__ import annotations

import numpy as np

from codec import device, replay
from codec.dtypes import as_float_array, on_device
from codec.errors import CodecTypeError, CodecValueError
from codec.framebuffer import frame_out
from codec.manyframe import Layout
from codec.runs import RUNS, RunShape, elementwise_sections, feedback_shape, select_runs, transform_runs, value_runs
from codec.context import where
from codec.stage import Context, check_step
from codec.device import as_device_array, many_on_device


# -------------------------------------------------------------------- inputs
def many_items(tensors, argname: str = "tensors", skip_missing: bool = False) -> tuple:
    """``(names, values)`` of what ``encode_many`` takes, values as given: a dict name ->
    array; any iterable of ``(name, array)`` pairs (``((n, p.grad) for n, p in
    model.named_parameters())``), as a dict in its order (a name twice is a ValueError); or a
    sequence of arrays (names None).  ``skip_missing``: a None value (a parameter without a
    gradient) is left out; else it is a TypeError naming it."""
    if isinstance(tensors, dict):
        pairs = list(tensors.items())
    elif isinstance(tensors, (list, tuple)) or (hasattr(tensors, "__iter__") and not hasattr(tensors, "shape") and not isinstance(tensors, (str, bytes, bytearray, memoryview))):
        items = list(tensors)
        if not items and not isinstance(tensors, (list, tuple)):
            return (), []  # (no pairs: a model without parameters)
        if not (items and all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in items)):
            if not isinstance(tensors, (list, tuple)):
                raise CodecTypeError(f"{argname}: an iterable must give (name, array) pairs; got {type(items[0]).__name__ if items else 'nothing'}")
            kept = [(i, v) for i, v in enumerate(items) if not (skip_missing and v is None)]
            for i, v in kept:
                if v is None:
                    raise CodecTypeError(f"{argname}[{i}]: None (a parameter without a gradient?); pass skip_missing=True to leave such tensors out")
            return None, [v for _, v in kept]
        pairs = items
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise CodecValueError(f"{argname}: the name {k!r} appears twice")
            seen.add(k)
    else:
        raise CodecTypeError(f"{argname}: expected a dict of name -> array, (name, array) pairs or a list of arrays, got {type(tensors).__name__}")
    for k, v in pairs:
        if not isinstance(k, str):
            raise CodecTypeError(f"{argname}: names must be str, got {type(k).__name__} {k!r}")
        if v is None and not skip_missing:
            raise CodecTypeError(f"{argname}[{k!r}]: None (a parameter without a gradient?); pass skip_missing=True to leave such tensors out")
    pairs = [(k, v) for k, v in pairs if v is not None]
    return tuple(k for k, _ in pairs), [v for _, v in pairs]


def many_inputs(tensors, argname: str = "tensors", device: bool = False, skip_missing: bool = False):
    """``(names, arrays)`` of :func:`many_items` (names a tuple of str, or None for a
    sequence); each array through :func:`codec.dtypes.as_float_array`, or with ``device`` a
    device array viewed (:func:`codec.device.as_device_array`)."""
    names, values = many_items(tensors, argname, skip_missing)

    def one(v, name):
        if device and on_device(v):
            return as_device_array(v, name)
        return as_float_array(v, None, name)

    return names, [one(v, f"{argname}[{k!r}]") for k, v in zip(names if names is not None else range(len(values)), values)]


def joined(arrays) -> np.ndarray:
    """The flat concatenation of ``arrays`` (all of one dtype: ValueError naming ``tensors``
    otherwise), what a joint many-tensor frame codes (and AdaComp's run step reads beside
    ``acc``); device arrays lying end to end (views of one buffer) are read where they lie."""
    dts = {a.dtype for a in arrays}
    if len(dts) > 1:
        raise CodecValueError(f"tensors: joint=True codes the tensors as one array, so they must share a dtype, got {sorted(d.name for d in dts)}")
    if not arrays:
        return np.empty(0, np.float32)
    if on_device(arrays[0]):  # (device arrays all: many_on_device)

        whole = device.span(arrays)
        return whole if whole is not None else device.concat(arrays, device.empty(sum(a.size for a in arrays), arrays[0].dtype))
    return np.concatenate([a.reshape(-1) for a in arrays])


def many_keys(keys, count: int) -> list:
    """``keys`` as a list of ``count`` per-tensor keys (None: None for every tensor)."""
    if keys is None:
        return [None] * count
    if isinstance(keys, (str, bytes)) or not hasattr(keys, "__len__"):
        raise CodecTypeError(f"keys: expected one key per tensor (a list), got {type(keys).__name__}")
    if len(keys) != count:
        raise CodecValueError(f"keys: {len(keys)} keys for {count} tensors")
    return list(keys)


def hashable_key(key):
    try:
        hash(key)
    except TypeError:
        raise CodecTypeError(f"keys: a key must be hashable, got {type(key).__name__}") from None
    return key


# -------------------------------------------------------------------- encoding
def encode(c, tensors, *, keys=None, step: int = 0, layout: str = "table", joint: bool = False, out=None, skip_missing: bool = False) -> bytes:
    """``c.encode_many(tensors, ...)`` (:meth:`codec.Codec.encode_many`): replayed when its
    layout was framed before (:mod:`codec.replay`), else the general path."""
    step = check_step(step)
    plain = keys is None and not joint and out is None  # (what a replayed step is)
    if plain:
        frame = replay.encode(c, tensors, layout, step)
        if frame is not None:
            return frame
    names, arrays, lay, dest = prepared(c, tensors, out, skip_missing)
    if joint:
        flat = joined(arrays)
        return encode_step(c, [flat], lay, layout, dest, ctxs=[Context(flat.shape, flat.dtype, key=hashable_key(keys), step=step, name="tensors")], joint=True)
    keys = many_keys(keys, len(arrays))
    ctxs = [Context(a.shape, a.dtype, key=k, step=step, name=w) for a, k, w in zip(arrays, keys, where(names, len(arrays)))]
    frame = encode_step(c, arrays, lay, layout, dest, ctxs=ctxs)
    if plain:
        replay.learn_encode(c, tensors, layout, names, arrays, frame, step)
    return frame


def prepared(c, tensors, out, skip_missing: bool) -> tuple:
    """What a many-tensor encoding of ``tensors`` by the codec ``c`` starts from:
    ``(names, arrays, layout, dest)``, the arrays as the stages take them (device arrays:
    every stage checked to take them, else TypeError naming the tensor), their
    :class:`~codec.manyframe.Layout` and the frame's ``out`` buffer
    (:func:`codec.framebuffer.frame_out`)."""
    names, arrays = many_inputs(tensors, device=True, skip_missing=skip_missing)
    many_on_device(c.stages, arrays)
    return names, arrays, Layout.of(arrays, names), frame_out(out, arrays)


def encode_step(c, arrays, lay, form: str, dest, *, ctxs=None, feedback=None, joint: bool = False) -> bytes:
    """The many-tensor step, the one place it runs: :meth:`codec.Codec.encode_many` and
    :meth:`codec.feedback.ErrorFeedback.encode_many` both call it.  Every tensor of
    ``arrays`` (with ``joint``, their one flat concatenation) is coded, small tensors in runs
    (:func:`sections`), into one frame of ``lay`` (``form``, ``dest`` as
    :meth:`codec.Codec.frame_many` takes them); returns the frame.

    ``ctxs``: each tensor's context, for a codec alone.  ``feedback``: error feedback's half
    of the step (:class:`codec.feedback.runstep.ManyFeedback`), which gives the contexts
    (``plan``): without residuals the codec's own runs code the tensors; with them the runs
    of :func:`codec.runs.feedback_runs` take their step together from their ``acc``
    (``accumulate``), every other tensor its own (``alone``), and once the frame is built
    ``finish`` completes the step and changes the slots.  A step whose plan was learned is
    replayed (:mod:`codec.replay`: a run of a codec whose frames are pairs); PowerSGD's
    steps, every tensor on its own, are learned here (``learn_lowrank_feedback``) and
    replayed before the step's inputs are formed
    (:meth:`~codec.feedback.ErrorFeedback.encode_many`, ``replay.encode_lowrank_feedback``)."""
    groups = None
    plain = form == "table" and dest is None and not joint  # (a step a replay may take)
    if feedback is not None:
        groups, ctxs = feedback.plan(c, arrays, joint)
    if groups is None:  # the codec's own runs: nothing fed back
        secs, pieces, ran = ([c.sections(arrays[0].reshape(-1), ctxs[0])], None, set()) if joint else sections(c, arrays, ctxs)
    elif groups:  # runs take their step together, every other tensor its own
        inputs, flats, gradients = feedback.accumulate(c, groups)
        whole = plain and len(groups) == 1 and len(groups[0]) == len(arrays) and feedback.replayable(flats.values())
        got = replay.encode_feedback(c, lay, flats[0], ctxs) if whole else None
        if got is not None:  # (every tensor one run of a codec whose frames are pairs: codec.replay)
            frame, feedback.sent[0] = got
            feedback.finish(c, frame, lay, groups, set(groups[0]), ctxs, joint)
            return frame
        secs, pieces, ran = sections(c, inputs, ctxs, feedback.alone, feedback_shape(c, arrays), flats, gradients)
    else:  # every tensor its own step (PowerSGD's is replayed before it gets here: ErrorFeedback.encode_many)
        secs, pieces, ran = [feedback.alone(i) for i in range(len(arrays))], None, set()
    frame = c.frame_many(secs, lay, form, pieces=pieces, joint=joint, out=dest)
    if feedback is not None:
        if groups and whole and ran == set(groups[0]):
            replay.learn_feedback(c, lay, flats[0], ctxs, frame)
        elif groups is not None and not groups and plain and feedback.replayable(arrays):
            replay.learn_lowrank_feedback(c, lay, frame)
        feedback.finish(c, frame, lay, groups, ran, ctxs, joint)
    return frame


def sections(c, arrays, ctxs, alone=None, shape: RunShape = RUNS, flats: dict | None = None, gradients: dict | None = None):
    """The sections of every tensor (``ctxs[i]`` its context: key, step, state, the name
    errors give it), with the runs an elementwise value stage, a segmented select stage or a
    value stage's :meth:`codec.stage.Value.encode_run` codes at once; ``alone(i)`` gives the
    sections of a tensor no run codes (default: ``c.sections`` of it); ``shape``: the select
    and quantizer runs'; ``flats``: the runs whose concatenation the caller formed
    (``{first index: flat}``); ``gradients``: the runs' gradients, for a select stage that
    sees them (:func:`codec.runs.select_runs`).  Device arrays (all of them) take the same runs: a select
    stage without a segmented twin declines its runs, whose tensors then select alone.
    Returns ``(sections, pieces, ran)`` (``pieces`` for
    ``Codec.frame_many``; ``ran``: the indices of the tensors runs coded)."""
    if alone is None:
        alone = lambda i: c.sections(arrays[i].reshape(-1), ctxs[i])  # noqa: E731
    if c.elementwise:
        return elementwise_sections(c, arrays, ctxs, alone, flats)
    out = [None] * len(arrays)
    coded = {}
    if c.select is not None:
        coded = select_runs(c, arrays, ctxs, out, shape, flats, gradients)
    elif c.transform is not None:
        coded = transform_runs(c, arrays, ctxs, out, shape, flats)
    else:
        coded = value_runs(c, arrays, ctxs, out, shape, flats)
    ran = {i for i, secs in enumerate(out) if secs is not None}
    for i in range(len(arrays)):
        if out[i] is None:
            out[i] = alone(i)
    if not coded:
        return out, None, ran
    pieces, skip = [], 0
    for i, secs in enumerate(out):
        if i in coded:
            pieces.append(coded[i][1])
            skip = coded[i][0]
        elif skip:
            skip -= 1
        else:
            pieces += secs
    return out, pieces, ran
