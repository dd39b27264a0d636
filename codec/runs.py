"""Runs: consecutive small tensors of a many-tensor call coded at once (the encoding half of
:mod:`codec.many`; its decoding reads the same runs back).

A run is grouped by :func:`runs` (elementwise codecs: at most RUN_ELEMENTS elements
together) or :func:`segment_runs` (select and quantizer stages: float32/float64 tensors of at
most ``RunShape.each`` elements each, ``RunShape.total`` together), concatenated into one
reused buffer (:func:`concatenated`), and coded by one kernel call of the stage that offers
it: an elementwise value stage (:func:`elementwise_sections`), a quantizer's
``Value.encode_run`` (:func:`value_runs`), a select stage's ``select_segments`` and the value
stage's ``encode_kept`` (:func:`select_runs`), a transform stage's ``forward_segments`` and the
value stage's ``encode_kept`` (:func:`transform_runs`).  Either way the frame holds exactly the bytes
that coding each tensor alone gives.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from codec.dtypes import on_device
from codec.errors import NonFiniteError
from codec.frame import Section, SectionKind
from codec.manyframe import Entry
from codec.ops import offsets, scratch
from codec.stage import Context
from codec.device import concat, empty, span
from codec.kernels import backend


#: the most elements of one run (:func:`runs`): a run is coded through one buffer of this
#: size at most, which stays in cache and is recycled by the allocator (a larger one would
#: be page-faulted afresh on every call); a larger tensor runs alone
RUN_ELEMENTS = 1 << 16


def runs(tensors, total: int = RUN_ELEMENTS, each: int | None = None) -> list[list[int]]:
    """Indices of ``tensors`` (``(size, dtype)`` pairs) grouped into maximal runs of
    consecutive tensors of one dtype holding at most ``total`` elements together (default
    :data:`RUN_ELEMENTS`), each of at most ``each`` (default ``total``); a tensor beyond
    either is a run of its own."""
    each = total if each is None else each
    out: list[list[int]] = []
    prev, count = None, 0  # the dtype and size of the run being extended (None: closed)
    for i, (size, dtype) in enumerate(tensors):
        if prev is not None and dtype == prev and size <= each and count + size <= total:
            out[-1].append(i)
            count += size
        else:
            out.append([i])
            prev, count = (dtype, size) if size <= each else (None, 0)
    return out


#: a select stage's runs (:meth:`codec.stage.Select.select_segments`): tensors of at most
#: RUN_ELEMENTS elements, up to this many together, so one kernel call spans enough data to
#: run on every thread (its scratch buffer is reused from call to call)
SEGMENT_ELEMENTS = 1 << 20
#: the fewest elements whose many-tensor call an elementwise codec codes in one pass where the
#: tensors lie (:meth:`codec.stage.Value.encode_segments`, ``write_segments``): below them
#: the kernels run serially (``codec._jit.PARALLEL_MIN``) and a run's buffer costs less than
#: reading the arrays' addresses
SEGMENTED_MIN = 1 << 17


@dataclass(frozen=True)
class RunShape:
    """Which consecutive float32/float64 tensors a select or quantizer run holds: each of at
    most ``each`` elements, at least ``least`` of them, at most ``total`` together."""

    each: int = RUN_ELEMENTS
    least: int = 2
    total: int = SEGMENT_ELEMENTS


#: the runs of encode_many and decode_many
RUNS = RunShape()
#: a quantizer's error-feedback runs (:func:`feedback_runs`): a larger tensor's fused step
#: (one pass over memory) costs less than its share of a run's generic step (three), and a
#: run of a few tensors pays more fixed cost than their fused steps (ResNet-50's pairs of
#: norm tensors between convolutions ran 18.9 -> 21.3 ms a step as runs).  A select stage's
#: runs are :data:`SELECT_FEEDBACK_RUNS`
FEEDBACK_RUNS = RunShape(1 << 14, 8)
#: a select stage's error-feedback runs on the host (AdaComp's aside): encode_many's tensors, any number
#: of them together, so a whole model of small tensors is one run whose ``acc`` is one
#: buffer (the residuals' own) and whose coding is replayed (:func:`codec.replay.encode_feedback`);
#: a tensor's own sparse step costs ~150-200 us of Python whatever its size (the sample's 8
#: tensors: top-k 3.7 ms a step, each alone)
SELECT_FEEDBACK_RUNS = RunShape(RUN_ELEMENTS, 2, 1 << 26)


def concatenated(arrays, groups, given: dict | None = None) -> list:
    """Per group of several tensors, their flat concatenation (None for a group of one), each
    in its own slice of one reused buffer per dtype (``codec.ops.scratch``), all alive at once;
    for device arrays, of one new device buffer per dtype.  ``given``: the groups whose flat
    concatenation the caller formed already (``{first index: flat}``, error feedback's
    ``acc``: :mod:`codec.feedback.runstep`), taken as they are."""
    given = dict(given or {})
    dev = bool(arrays) and on_device(arrays[0])  # device arrays (all of them: codec.device.many_on_device)
    if dev:  # a run whose tensors lie end to end (views of one buffer) is read where it is

        for g in groups:
            whole = None if len(g) == 1 or g[0] in given else span([arrays[i] for i in g])
            if whole is not None:
                given[g[0]] = whole
    need: dict = {}
    for g in groups:
        if len(g) > 1 and g[0] not in given:
            dt = arrays[g[0]].dtype
            need[dt] = need.get(dt, 0) + sum(arrays[i].size for i in g)
    room = {dt: empty(n, dt) if dev else scratch(n, dt) for dt, n in need.items()}
    used = dict.fromkeys(room, 0)
    out = []
    for g in groups:
        if len(g) == 1 or g[0] in given:
            out.append(given.get(g[0]))
            continue
        dt, n = arrays[g[0]].dtype, sum(arrays[i].size for i in g)
        flat = room[dt][used[dt] : used[dt] + n]
        used[dt] += n
        if dev:
            concat([arrays[i] for i in g], flat)
        else:
            np.concatenate([arrays[i].reshape(-1) for i in g], out=flat)
        out.append(flat)
    return out


def segment_runs(tensors, shape: RunShape = RUNS) -> list[list[int]]:
    """The runs (:class:`RunShape`) of the tensors (``(size, dtype)`` pairs) that a segmented
    kernel codes at once."""
    return [g for g in runs(tensors, shape.total, shape.each) if len(g) >= shape.least and tensors[g[0]][1] in (np.float32, np.float64)]


def feedback_runs(c, arrays) -> list[list[int]]:
    """The runs of tensors whose error-feedback step a run of the codec ``c`` takes (``acc``
    formed first, coded in the run, then ``acc -= decoded`` at once): the segmented runs of
    a select or quantizer stage; an elementwise codec's runs (:func:`runs`) for device
    arrays only (on the host its fused per-tensor step, one pass, is faster than a run's
    three; on the device a tensor's step costs launches and copies of its own).  None for a
    transform that is not :attr:`codec.stage.Transform.segmented`.  A select stage that sees
    the gradient itself (:attr:`codec.stage.Select.sees_gradient`) is handed the run's
    gradients beside ``acc`` (:func:`select_runs`' ``gradients``)."""
    if c.transform is not None and not c.transform.segmented:
        return []
    sizes = [(a.size, a.dtype) for a in arrays]
    if c.elementwise:
        if arrays and on_device(arrays[0]):
            return [g for g in runs(sizes) if len(g) > 1]
        least, mean = HOST_ELEMENTWISE_RUNS
        return [g for g in runs(sizes) if len(g) >= least and sum(sizes[i][0] for i in g) <= mean * len(g)]
    return segment_runs(sizes, feedback_shape(c, arrays))


def feedback_shape(c, arrays) -> RunShape:
    """The shape of the runs that take the error-feedback step of the codec ``c`` over
    ``arrays`` (a step's tensors, host or device arrays all) together: the one rule that
    :func:`feedback_runs`, the step that codes them and the one that subtracts them ask.
    :data:`FEEDBACK_RUNS` for a quantizer, for a select stage that sees the gradient itself
    (AdaComp) and for device arrays (a run's selection there crosses a few arrays of its
    own: two tensors as a run crossed more bytes than as two steps, tests/mpi_device.py's
    "crossing"); :data:`SELECT_FEEDBACK_RUNS` for another select stage on the host."""
    if c.select is None or c.select.sees_gradient or (len(arrays) and on_device(arrays[0])):
        return FEEDBACK_RUNS
    return SELECT_FEEDBACK_RUNS


#: which runs of an elementwise codec take their error-feedback step together on the host
#: (:func:`feedback_runs`): at least this many tensors of at most this many elements on
#: average.  Below it a tensor's fused step (one pass) is mostly Python; above it the fused
#: step costs less than its share of a run's three passes (200 float32 tensors, fp16, µs a
#: tensor, fused -> run: 64 elements 31-54 -> 13-23, 1,000 33-51 -> 17-32, 4,000 45-61 ->
#: 28-55, 8,000 44-63 -> 48-52; docs/benchmarks.md)
HOST_ELEMENTWISE_RUNS = (8, 4096)


def value_runs(c, arrays, ctxs, out, shape: RunShape = RUNS, flats: dict | None = None) -> dict:
    """Code every run of small float32/float64 tensors that the value stage codes at once
    (:meth:`codec.stage.Value.encode_run`): ``out[i]`` its table entries, and per run
    ``{first index: (members after the first, payload piece)}``; the others stay None.
    ``flats``: runs already concatenated (:func:`concatenated`)."""
    groups = segment_runs([(a.size, a.dtype) for a in arrays], shape)
    coded = {}
    for g, flat in zip(groups, concatenated(arrays, groups, flats)):
        got = c.value.encode_run(flat, offsets([arrays[i].size for i in g]), [ctxs[i] for i in g])
        if got is None:
            continue
        table, piece = got
        for i, entries in zip(g, table):
            out[i] = entries
        coded[g[0]] = (len(g) - 1, piece)
    return coded


def select_runs(c, arrays, ctxs, out, shape: RunShape = RUNS, flats: dict | None = None, gradients: dict | None = None) -> dict:
    """Code every run of small float32/float64 tensors that the select stage selects in at
    once (:meth:`codec.stage.Select.select_segments`), as :func:`value_runs` does: with an
    elementwise value stage, the run's kept values are coded at once too and the run is one
    payload piece (``{first index: (members after the first, piece)}``); else each tensor's
    values are coded on their own (``out[i]`` its sections).  The others stay None.
    ``flats``: runs already concatenated (:func:`concatenated`); ``gradients``: under error
    feedback, for a stage that :attr:`codec.stage.Select.sees_gradient`, each run's gradients
    concatenated (``{first index: flat}``; the run's ``flat`` is ``acc``)."""
    groups = segment_runs([(a.size, a.dtype) for a in arrays], shape)
    coded = {}
    for g, flat in zip(groups, concatenated(arrays, groups, flats)):
        members = [ctxs[i] for i in g]
        starts = offsets([arrays[i].size for i in g])
        if gradients:
            picked = c.select.select_segments(flat, starts, members, gradient=gradients[g[0]])
        else:
            picked = c.select.select_segments(flat, starts, members)
        if picked is None:
            continue
        pos, kstarts, values, index = picked
        o = kstarts.tolist()
        for t, ctx in enumerate(members):  # what Codec.selected records
            ctx.positions, ctx.kept = pos[o[t] : o[t + 1]], values[o[t] : o[t + 1]]
        _kept(c, g, arrays, ctxs, members, values, kstarts, index, out, coded)
    return coded


def passing_runs(c, tensors) -> list[list[int]]:
    """The runs of consecutive tensors (``(shape, size, dtype)`` triples) that the codec
    ``c``'s transform passes through uncoded (:meth:`codec.stage.Transform.passes`) and its
    elementwise value stage codes at once, grouped as an elementwise codec's runs
    (:func:`runs`); none for a segmented transform (its own runs) or another value stage.
    ``encode_many`` codes each such run as one values section, and ``decode_many`` reads it
    as one: PowerSGD's vectors between its matrices."""
    t = c.transform
    if t is None or t.segmented or not c.value.elementwise:
        return []
    return [g for g in runs([(size if t.passes(shape) else 1 << 62, dt) for shape, size, dt in tensors]) if len(g) > 1]


def transform_runs(c, arrays, ctxs, out, shape: RunShape = RUNS, flats: dict | None = None) -> dict:
    """Code every run of small float32/float64 tensors that the transform stage transforms
    at once (:meth:`codec.stage.Transform.forward_segments`: fft), as :func:`select_runs`
    does: the run's coefficients are coded at once when the value stage can
    (:meth:`codec.stage.Value.encode_kept`), else each tensor's on its own.  A transform that
    is not segmented has its pass-through runs coded at once (:func:`passing_runs`)."""
    if not c.transform.segmented:
        return _passing_sections(c, arrays, ctxs, out)
    groups = segment_runs([(a.size, a.dtype) for a in arrays], shape)
    coded = {}
    for g, flat in zip(groups, concatenated(arrays, groups, flats)):
        got = c.transform.forward_segments(flat, offsets([arrays[i].size for i in g]), [ctxs[i] for i in g])
        if got is None:
            continue
        vstarts, values, index = got
        vctxs = [ctxs[i].domain(int(n), values.dtype) for i, n in zip(g, np.diff(vstarts).tolist())]
        _kept(c, g, arrays, ctxs, vctxs, values, vstarts, index, out, coded)
    return coded


def _passing_sections(c, arrays, ctxs, out) -> dict:
    """Each run of :func:`passing_runs` coded at once by the value stage (one section of the
    run's values, which an elementwise stage makes exactly as it makes each tensor's):
    ``out[i]`` its table entries, and per run ``{first index: (members after the first,
    piece)}``; the others stay None."""
    groups = passing_runs(c, [(a.shape, a.size, a.dtype) for a in arrays])
    coded = {}
    for g, flat in zip(groups, concatenated(arrays, groups)):
        secs: list = []
        c.value.encode(flat, Context(flat.shape, flat.dtype, name="tensors"), secs)
        (piece,) = secs
        for i in g:
            out[i] = [Entry(piece.kind, piece.bits, arrays[i].size)]
        coded[g[0]] = (len(g) - 1, _exact_errors(c, piece, [(arrays[i], ctxs[i]) for i in g]))
    return coded


def _kept(c, g, arrays, ctxs, vctxs, values, vstarts, index, out, coded) -> None:
    """A sparse run's table entries (``out[i]``) and payload piece (``coded``): tensor t of
    the run ``g`` has the first section ``index``'s t-th and the values
    ``values[vstarts[t]:vstarts[t+1]]`` (the value stage's context ``vctxs[t]``), coded at
    once when the value stage can (:meth:`codec.stage.Value.encode_kept`), else one by one."""
    kept = c.value.encode_kept(values, vstarts, vctxs)
    if kept is not None:
        table, piece = sparse_piece(index, *kept)
        for i, entries in zip(g, table):
            out[i] = entries
        coded[g[0]] = (len(g) - 1, _exact_errors(c, piece, [(arrays[i], ctxs[i]) for i in g]))
        return
    o = vstarts.tolist()
    for t, (i, vctx, sec) in enumerate(zip(g, vctxs, index.sections())):
        secs = [sec]
        c.value.encode(values[o[t] : o[t + 1]], vctx, secs)
        out[i] = secs


def sparse_piece(index, table, vsec, vstarts):
    """A sparse run's table entries and one payload piece: each tensor's first section (from
    ``index``, a :class:`codec.frame.SectionRun`) then its value sections, which the value
    stage coded at once (:meth:`codec.stage.Value.encode_kept`: ``table``, the section
    ``vsec`` holding every tensor's bytes, tensor t's from ``vstarts[t]``)."""
    entries = [[Entry(k, w, n), *rest] for k, w, n, rest in zip(index.kinds, index.widths, index.counts, table)]

    def fill(out):
        codes = np.frombuffer(vsec.materialize(), np.uint8)
        backend("pack", out).interleave(index.data, index.offsets, codes, vstarts, out)

    return entries, Section(SectionKind.VALUES, 8, int(index.offsets[-1] + vstarts[-1]), fill=fill)


def elementwise_sections(c, arrays, ctxs, alone, flats: dict | None = None):
    """The table sections, payload pieces and run members of an elementwise codec's
    many-tensor frame: one piece per run of small same-dtype tensors (:func:`runs`), coded
    at once; a tensor alone through ``alone(i)``.  ``flats``: runs already concatenated
    (:func:`concatenated`).  A value stage that codes a run where its tensors lie
    (:attr:`codec.stage.Value.segmented`) takes every consecutive host tensor of one dtype
    as one run, with no buffer, from :data:`SEGMENTED_MIN` elements of float32/float64
    tensors."""
    where = (
        flats is None
        and c.value.segmented
        and sum(a.size for a in arrays) >= SEGMENTED_MIN
        and not any(on_device(a) or a.dtype not in (np.float32, np.float64) for a in arrays)
    )
    groups = runs([(a.size, a.dtype) for a in arrays], *((1 << 62,) if where else ()))
    if flats is not None:  # error feedback's runs (its acc formed); every other tensor takes its own step
        groups = [h for g in groups for h in ([g] if g[0] in flats else [[i] for i in g])]
    table, pieces, ran = [], [], set()
    for g, flat in zip(groups, [None] * len(groups) if where else concatenated(arrays, groups, flats)):
        if len(g) == 1 and flat is None:
            secs = alone(g[0])
            table.append(secs)
            pieces += secs
            continue
        if flat is None:  # the run coded where its tensors lie
            members = [arrays[i].reshape(-1) for i in g]
            n = sum(a.size for a in members)
            (piece,) = c.value.encode_segments(members, Context((n,), members[0].dtype, name="tensors"), [])
        else:
            (piece,) = c.sections(flat, Context(flat.shape, flat.dtype, name="tensors"))
        table += [[Entry(piece.kind, piece.bits, arrays[i].size)] for i in g]
        pieces.append(_exact_errors(c, piece, [(arrays[i], ctxs[i]) for i in g]))
        ran.update(g)
    return table, pieces, ran


def _exact_errors(c, piece, members):
    """``piece`` (the codes of a run), whose error on a bad value (NaN under
    ``nonfinite=raise``) is raised again by the tensor that holds it, named as
    ``encode_many`` names it (``members``: each tensor and its context)."""
    if piece.fill is None:
        return piece

    def fill(out, *crc):
        try:
            return piece.fill(out, *crc)
        except NonFiniteError:
            for a, ctx in members:
                for sec in c.sections(a.reshape(-1), Context(a.shape, a.dtype, key=ctx.key, step=ctx.step, name=ctx.name)):
                    sec.materialize()
            raise

    return Section(piece.kind, piece.bits, piece.count, fill=fill, fill_crc=piece.fill_crc, late=piece.late, device=piece.device)
