"""Replayed steps: a many-tensor step of a layout the codec has framed before, without the
general path's per-tensor Python (issue 33, "small tensors at a few microseconds each").

A training loop calls ``encode_many`` and ``decode_many`` on the same tensors every step.
For an elementwise codec whose value stage codes a run where its tensors lie
(:attr:`codec.stage.Value.segmented`: fp16 and bf16), one section of codes per tensor, no
byte stage, everything in the frame but the codes and the payload's CRC-32C is the layout's:
the header, the table, each tensor's place in the payload; so is a quantizer's header
(:func:`reads_as_run`: each tensor's section counts and widths follow from its size).
:class:`~codec.replayplan.Replay` records that from a frame the general path made (``learn_encode``,
``learn_decode``); a later call that matches it is one kernel call over every tensor:

* ``encode`` (fp16, bf16): same codec, layout form, names (or count) and, per tensor, a
  plain C-contiguous aligned host ``ndarray`` (or contiguous CPU torch tensor) of the
  recorded shape and dtype; the codes written straight into a new frame from where each
  tensor lies (``encode_at``, checksummed as they are written), then the recorded header
  with the new CRCs.
* ``decode``: a ``bytes``/``bytearray`` frame of the recorded length whose header (every
  byte before the payload CRC) is the recorded one and whose header CRC holds, so parsing it
  would give the recorded frame again; fp16/bf16 codes decoded by ``write_at`` into the
  caller's arrays (checked as ``decode_many`` checks them) or new ones, the payload CRC-32C
  verified in the same pass (:class:`codec.payloadcheck.PayloadCheck`); a quantizer's run
  checked, read at once (``read_planned``) and written where each array lies
  (``write_segments``), its payload CRC-32C and code fields checked in that pass too.
* ``decode`` of a low-rank frame (PowerSGD with its values as they are, :func:`lowrank`:
  each tensor's values, or its matrix's ``r (n + m)`` coefficients): every matrix's ``P Q^T``
  formed with one ``expand_segments`` call, the other tensors' values copied; and its
  ``encode``: every matrix's power iteration in one ``power_segments`` call (:func:`codec.replaydecode.encode_lowrank`).
* ``decode`` of a keyed sparse frame (random-k with its values as they are, :func:`keyed`:
  a key and k values per tensor, k fixed by the size and step, so its header is the
  layout's too): every key checked at once (``keys_at``), then one kernel call draws every
  tensor's positions while it zeroes the arrays and writes the kept values at them
  (``scatter_keyed``).
* ``encode`` of a sparse codec, whose header changes with each step's index sections:
  random-k's keys and values (:func:`codec.replaydecode.encode_keyed`), or another select
  stage's run (:func:`codec.replaydecode.selected`: top-k, gaussian-k, DGC, AdaComp on
  tensors of a run's size) selected and coded at once, its header made for the step's
  sections (:func:`codec.replaydecode.encode_selected`).

A plan (what it holds, how it is learned and how it checks a call's arrays) is
:mod:`codec.replayplan`'s; how each of the last kinds is written is :mod:`codec.replaydecode`'s.

Nothing else changes: the frame is byte for byte the general path's (a plan is kept only if
its frame of the tensors it was learned from equals the general path's), and whatever a plan
does not match, or any error (a NaN under ``nonfinite=raise``, a damaged frame) falls back
to the general path, which raises as it always did.

An error-feedback step (``ErrorFeedback.encode_many``) of a codec whose frames are pairs
(:func:`codec.replaydecode.pairs` whose select stage finds a run's selections at once,
``find_segments``: top-k, gaussian-k, DGC with their values as they are), without momentum, whose tensors are all one run (:mod:`codec.feedback.runstep`),
replays its coding too (``encode_feedback``, learned by ``learn_feedback`` from the general
path's frame of the run's ``acc``): the frame written from the selection's finds in
``acc`` and the sent positions, where ``acc - decoded`` is +0.0
(:func:`codec.replaydecode.feedback_pairs`); the residuals are formed and kept as the
general path keeps them.  PowerSGD's error-feedback step (:func:`lowrank`, no momentum,
every tensor its own step) is replayed whole (``encode_lowrank_feedback``, the plan learned
by ``learn_lowrank_feedback`` from the general path's frame): every ``acc``, every matrix's
power iteration from its key's starting ``Q`` in one call, ``acc -= decoded``, then each
key's residual, ``Q`` and step installed (:func:`codec.replaydecode.feedback_lowrank`).
docs/api.md, "Replayed steps".
"""

from __future__ import annotations

from codec import manydecode, replaydecode
from codec.frame import element_limit
from codec.ops import remember
from codec.replaydecode import keyed, lowrank, pairs, reads_as_run, selected
from codec.replayplan import Replay, learned
from codec.stage import MAX_STEP

__all__ = ["Replay", "decode", "decode_many", "encode", "encode_feedback", "encode_lowrank_feedback", "learn_decode", "learn_encode", "learn_feedback", "learn_lowrank_feedback", "replayable"]

#: plans kept per codec (encoding) and in all (decoding); the oldest goes first
KEEP = 8
#: decoding plans by frame length (a frame's length and header bytes find its plan)
_DECODES: dict = {}
#: decoding plans of sparse codecs, most recent first: their frames' lengths and the header's
#: sections change with each step, so the header's bytes up to its layout find the plan
_PAIRS: tuple = ()


def replayable(c) -> bool:
    """Whether the codec ``c``'s many-tensor steps can be replayed: an elementwise value stage
    alone that codes a run where its tensors lie, and no byte stage; or a keyed select stage
    with its values as they are, unscaled (random-k: :func:`codec.replaydecode.encode_keyed`);
    or another select stage (:func:`codec.replaydecode.encode_selected`); or a low-rank
    transform with its values as they are (PowerSGD: :func:`codec.replaydecode.encode_lowrank`)."""
    return (c.elementwise and c.value.segmented and not c.post) or (keyed(c) and not getattr(c.select, "scale", False)) or selected(c) or lowrank(c)


def _encode_key(tensors, form):
    """The plan key of ``encode_many``'s ``tensors`` (the layout form, and the names or the
    count) and their values in order; ``(None, None)`` for another kind of input."""
    if type(tensors) is dict:
        return (form, tuple(tensors)), list(tensors.values())
    if type(tensors) in (list, tuple):
        return (form, len(tensors)), tensors
    return None, None


def encode(c, tensors, form: str, step: int = 0) -> bytes | None:
    """``c.encode_many(tensors, layout=form)`` replayed, or None (no plan, or the tensors do
    not match it: the general path runs)."""
    plans = c.__dict__.get("_replays")
    if not plans:
        return None
    key, values = _encode_key(tensors, form)
    entry = plans.get(key)
    if entry is None or entry[1] is None:
        return None
    return entry[1].encode(values, step)


def learn_encode(c, tensors, form: str, names, arrays, frame, step: int = 0) -> None:
    """After the general path framed ``tensors`` (a plain ``encode_many`` call; ``names``
    and ``arrays`` as it took them) into ``frame``: keep the plan of their layout (the latest
    layout under their names wins) when the codec's steps can be replayed and the plan gives
    the same bytes.  A list of ``(name, array)`` pairs is not learned: its key (the count)
    is a list of arrays' too, whose frame names nothing."""
    key, _ = _encode_key(tensors, form)
    if key is None or form != "table" or not replayable(c):  # (the hash form: its decoding needs the layout given)
        return
    if type(tensors) is not dict and names is not None:
        return
    plans = c.__dict__.setdefault("_replays", {})
    sig = tuple((a.shape, a.dtype) for a in arrays)
    if key in plans and plans[key][0] == sig:
        return
    plan = learned(c, frame)
    remember(plans, key, (sig, plan if plan is not None and plan.encode(arrays, step) == frame else None), KEEP)


def encode_feedback(c, lay, flat, ctxs):
    """An error-feedback step's coding replayed (:func:`codec.replaydecode.feedback_pairs`:
    ``(frame, sent positions)``) when the codec ``c`` has learned the plan of ``lay`` (every
    tensor in one run, ``flat`` their ``acc``, ``ctxs`` their contexts); else None."""
    plan = c.__dict__.get("_feedback_replays", {}).get(lay)
    return None if plan is None else replaydecode.feedback_pairs(plan, flat, ctxs)


def learn_feedback(c, lay, flat, ctxs, frame) -> None:
    """After the general path framed an error-feedback step of every tensor of ``lay`` in
    one run (``flat`` their ``acc``, before ``acc -= decoded``) into ``frame`` (table form,
    no ``out``, no momentum): keep the plan of ``lay`` when the codec's frames are pairs and
    the replayed coding gives the same bytes (else remember that it does not)."""
    if not pairs(c) or c.select.sees_gradient:
        return
    plans = c.__dict__.setdefault("_feedback_replays", {})
    if lay in plans:
        return
    plan = learned(c, frame)
    if plan is not None and (plan.pairs is None or plan.selected is None):
        plan = None
    if plan is not None:
        got = replaydecode.feedback_pairs(plan, flat, ctxs)
        plan = plan if got is not None and got[0] == frame else None
    remember(plans, lay, plan, KEEP)


def encode_lowrank_feedback(c, tensors, keys, slots: dict):
    """An error-feedback step of PowerSGD (:func:`lowrank`) replayed
    (:func:`codec.replaydecode.feedback_lowrank`) before anything else is checked or formed,
    as :func:`encode` replays a codec's own step: ``tensors`` and ``keys`` as
    ``ErrorFeedback.encode_many`` takes them (keys None: the names, or the positions), and
    ``slots`` its slots by key.  When the codec ``c`` has learned the plan of these names
    (:func:`learn_lowrank_feedback`), the arrays are what it was learned from and every key
    has a slot of its tensor's shape and dtype with steps left: ``(frame, slots, accs,
    states)``, the caller installing each slot's new residual and stage state; else None (the
    general path takes the step, and raises what it raises)."""
    plans = c.__dict__.get("_lowrank_feedback")
    if not plans:
        return None
    key, values = _encode_key(tensors, "table")
    plan = plans.get(key)
    if plan is None:
        return None
    try:
        if keys is None:
            keys = key[1] if type(tensors) is dict else range(len(values))
        elif type(keys) not in (list, tuple) or len(keys) != len(values) or len(set(keys)) != len(keys):
            return None
        got = [slots.get(k) for k in keys]
    except TypeError:  # (an unhashable key: the general path names it)
        return None
    dt = plan.dtype
    for s, shape in zip(got, plan.shapes):
        if s is None or s.step > MAX_STEP or s.shape != shape or s.dtype != dt:
            return None
    done = replaydecode.feedback_lowrank(plan, values, got)
    return None if done is None else (done[0], got, done[1], done[2])


def learn_lowrank_feedback(c, lay, frame) -> None:
    """After the general path took an error-feedback step of PowerSGD (:func:`lowrank`; every
    tensor its own step, table form, no ``out``, no momentum) into ``frame``: keep the plan
    of ``lay`` (its frames' header and where each tensor's values, ``P`` and ``Q`` lie) under
    its names (or count), as :func:`encode_lowrank_feedback` looks it up."""
    if not lowrank(c):
        return
    plans = c.__dict__.setdefault("_lowrank_feedback", {})
    key = ("table", lay.names if lay.names is not None else len(lay))
    known = plans.get(key)
    if key not in plans or (known is not None and (known.shapes != tuple(lay.shapes) or known.dtype != lay.dtypes[0])):
        plan = learned(c, frame)
        remember(plans, key, plan if plan is not None and plan.matrices is not None else None, KEEP)


def decode_many(frame, out, parsed, *, codec=None, layout=None, max_elements=None, like=None):
    """``decode_many(frame, out)`` for both entry points (``codec.decode_many``,
    ``Codec.decode_many``, whose ``codec`` the frame must be): replayed when a learned header
    matches (no ``layout`` given), else ``parsed()`` (the codec and the parsed frame, checked
    as the caller checks them) decoded by the general path (:func:`codec.manydecode.decode`)
    and its header learned."""
    if layout is None:
        got = decode(frame, out, codec, like, max_elements)
        if got is not None:
            return got
    c, mf = parsed()
    got = manydecode.decode(c, mf, out, like=like)
    learn_decode(c, frame, mf)
    return got


def decode(frame, out, codec=None, like=None, max_elements=None):
    """``decode_many(frame, out)`` replayed, or None (the general path runs).  ``codec``: the
    codec the caller expects made the frame (``Codec.decode_many``)."""
    if like is not None or type(frame) not in (bytes, bytearray):
        return None
    plan = _found(frame)
    if plan is None:
        return None
    if codec is not None and codec is not plan.codec and codec.spec != plan.codec.spec:  # (another codec decodes through the general path, as it did)
        return None
    if max_elements is not None and plan.count > element_limit(max_elements):  # (a bad limit: ValueError naming it, as the general path raises)
        return None
    if plan.pairs is None and not plan.header_holds(frame):  # (a sparse frame's header is read, and its CRC checked, as it is decoded)
        return None
    return plan.decode(frame, out)


def _found(frame):
    """The decoding plan whose header bytes start ``frame``, or None: among the plans of its
    length, then the sparse codecs' (their prefix ends with the layout)."""
    for plan in _DECODES.get(len(frame), ()):
        if frame.startswith(plan.prefix):
            return plan
    for plan in _PAIRS:
        if frame.startswith(plan.prefix):
            return plan
    return None


def learn_decode(c, frame, mf) -> None:
    """After the general path decoded ``frame`` (parsed: ``mf``, made by the codec ``c``):
    keep the plan of its header when its tensors can be replayed."""
    global _PAIRS
    if type(frame) not in (bytes, bytearray) or not (replayable(c) or reads_as_run(c) or keyed(c) or lowrank(c)):
        return
    if selected(c):  # a sparse codec: a plan of pairs (found by the layout's header bytes), or none
        if not pairs(c) or any(frame.startswith(p.prefix) for p in _PAIRS):
            return
        plan = learned(c, frame, mf)
        if plan is not None and plan.pairs is not None:
            _PAIRS = (plan, *_PAIRS[: KEEP - 1])
        return
    plans = _DECODES.get(len(frame), [])
    if any(frame.startswith(p.prefix) for p in plans):
        return
    plan = learned(c, frame, mf)
    if plan is not None:
        remember(_DECODES, len(frame), [*plans, plan][-KEEP:], KEEP)
