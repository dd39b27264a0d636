"""Phase 1 of a many-tensor decode (:mod:`codec.manydecode` writes what it reads): every tensor's sections checked and
compactly read before any output is allocated, a run of small tensors at once where its
stages can read one (the decoding half of :mod:`codec.runs`): an elementwise codec's values
as one section, a quantizer's ``read_run``, a sparse run's ``positions_segments`` and
``read_kept``, a segmented transform's ``read_segments``.  A run its stages refuse is read
tensor by tensor, which raises the error that names the tensor and section.
"""

from __future__ import annotations

import numpy as np

from codec import pack
from codec.errors import CorruptFrameError
from codec.frame import Frame, SectionInfo
from codec.manyframe import VERSION
from codec.runs import RUNS, RunShape, passing_runs, runs, segment_runs
from codec.stage import Context


def read_jobs(c, mf, only=None, shape: RunShape = RUNS, device: bool = False, whole_runs: bool = False, in_pass: bool = False) -> list:
    """The jobs of ``mf`` for the codec ``c``: ``(indices, ctx, payload)`` per tensor, or per run of
    small tensors an elementwise codec decodes at once (:func:`runs`), every section checked
    and compactly read (phase 1 for all tensors before any output is allocated).  ``only``:
    the jobs of these tensors alone (a set of indices; the others are not read); ``shape``:
    the select and quantizer runs' (as they were encoded); ``device``: the outputs are device
    arrays, so a tensor read alone reads a large index section there (``Context.device``);
    ``whole_runs``: the runs of an elementwise codec, of a value stage that reads runs
    (:func:`reads_runs`) or of a select stage that reads every tensor's positions at once
    (:func:`reads_positions`) are every consecutive tensor of one dtype, whatever its size
    (the decode writes them with :meth:`codec.stage.Value.write_segments`, or scatters
    their pairs with one ``scatter_segments`` call); ``in_pass``: the writes are given the
    frame's payload check, which tests what the value stage leaves to them
    (``Context.checked_in_pass``)."""
    lay = mf.layout
    if mf.joint:  # one job: the concatenation
        jobs = [(list(range(len(mf))), *c._read(mf.whole(), in_pass=in_pass))]
        mf.finish()
        return jobs
    segs = None if c.elementwise else segment_runs(list(zip(lay.sizes, lay.dtypes)), shape)
    known = _known_positions(c, mf, only, {i for g in segs if len(g) > 1 for i in g} if device and c.select is not None else None)
    by_value = reads_runs(c, mf)
    sparse_runs = any(k is not None for k in known)  # every tensor's positions (of only) read at once
    transform_runs = c.transform is not None and c.transform.segmented and isinstance(mf.payload, memoryview)
    passing = passing_runs(c, zip(lay.shapes, lay.sizes, lay.dtypes)) if isinstance(mf.payload, memoryview) else []
    if c.elementwise:
        groups = runs(zip(lay.sizes, lay.dtypes), *((1 << 62,) if whole_runs else ()))
    elif passing:  # a transform's pass-through runs: each one values section, as an elementwise codec's run
        alone = set(range(len(mf))) - {i for g in passing for i in g}
        groups = sorted(passing + [[i] for i in alone])
    elif (by_value or sparse_runs) and whole_runs:
        groups = runs(zip(lay.sizes, lay.dtypes), 1 << 62)
    elif by_value or sparse_runs or transform_runs:  # a zstd payload is decompressed section by section as the stages read it
        alone = set(range(len(mf))) - {i for g in segs for i in g}
        groups = sorted(segs + [[i] for i in alone])
    else:
        groups = [[i] for i in range(len(mf))]
    if only is not None:  # a run only partly asked for: its tensors asked for, each alone
        asked = []
        for g in groups:
            asked += [g] if all(i in only for i in g) else [[i] for i in g if i in only]
        groups = asked
    jobs = []
    for g in groups:
        if len(g) == 1:
            job = None
        elif sparse_runs:
            job = _sparse_run_job(c, mf, g, known)
        elif transform_runs:
            job = _transform_run_job(c, mf, g)
        else:
            job = _run_job(c, mf, g, by_value, device, in_pass)
        if job is None:  # alone, or a run whose tensors are not what the run expects
            jobs += [([i], *c._read(mf.tensor(i), known[i], device, in_pass)) for i in g]
        else:
            jobs.append(job)
    if only is None:
        mf.finish()
    return jobs


def reads_runs(c, mf) -> bool:
    """Whether the value stage of ``c`` (alone in its codec, not elementwise) reads the runs of
    ``mf`` (:meth:`codec.stage.Value.read_run`, which may still refuse a run): the frame's
    payload is not compressed (a zstd payload is decompressed section by section as the
    stages read it)."""
    return c.transform is None and c.select is None and not c.elementwise and isinstance(mf.payload, memoryview)


def reads_positions(c, mf) -> bool:
    """Whether the select stage of ``c`` (with no transform) reads every tensor's positions
    of ``mf`` at once (:meth:`codec.stage.Select.positions_segments`, which may still
    refuse): the frame's payload is not compressed."""
    return c.select is not None and c.transform is None and isinstance(mf.payload, memoryview)


def _run_job(c, mf, run, value_runs, device: bool = False, in_pass: bool = False):
    """The job ``(run, ctx, payload)`` of a run of tensors read at once, or None (each is read
    alone): an elementwise codec's one section over the run (:func:`_values_frame`; with
    ``device``, a device frame's codes stay there), or what the value stage's
    :meth:`codec.stage.Value.read_run` reads."""
    lay = mf.layout
    if not value_runs:
        fr = _values_frame(mf, [mf.tensor_sections[i] for i in run], [lay.sizes[i] for i in run], lay.dtypes[run[0]])
        return None if fr is None else (run, *c._read(fr, device=device, in_pass=in_pass))
    sizes = [lay.sizes[i] for i in run]
    dtype = lay.dtypes[run[0]]
    payload = _or_alone(c.value.read_run, np.frombuffer(mf.payload, np.uint8), [mf.tensor_sections[i] for i in run], sizes, dtype, in_pass)
    return None if payload is None else (run, Context((sum(sizes),), dtype, name="tensors"), payload)


def _or_alone(read, *args):
    """``read(*args)`` (a stage's run reader), or None when it refuses the run: its tensors
    are then read alone, which raises the error that names the tensor and section."""
    try:
        return read(*args)
    except CorruptFrameError:
        return None


def _sparse_run_job(c, mf, run, known):
    """The job of a run of a sparse frame whose positions were read at once (``known``): the
    value stage reads every tensor's value sections (all but the select stage's first) at
    once (:meth:`codec.stage.Value.read_kept`), the positions counted from the run's first
    element (as a joint frame's); None (each tensor read alone) when it cannot."""
    lay = mf.layout
    ks = [known[i].size for i in run]
    if any(not mf.tensor_sections[i] for i in run):
        return None
    dtype, values = lay.dtypes[run[0]], [mf.tensor_sections[i][1:] for i in run]
    if c.value.elementwise:  # the run's values sections read as one
        fr = _values_frame(mf, values, ks, dtype)
        payload = None if fr is None else _or_alone(_read_values, c.value, fr, dtype)
    else:
        payload = _or_alone(c.value.read_kept, np.frombuffer(mf.payload, np.uint8), values, ks, dtype)
    if payload is None:
        return None
    ctx = Context((int(lay.starts[run[-1] + 1] - lay.starts[run[0]]),), lay.dtypes[run[0]], name="tensors")
    ctx.positions = np.concatenate([known[i] for i in run]) + np.repeat(lay.starts[run] - lay.starts[run[0]], ks)
    return run, ctx, payload


def _transform_run_job(c, mf, run):
    """The job of a run of a transform's frame read at once: the transform's sections
    (:attr:`codec.stage.Transform.segmented`'s ``read_segments``) and the value stage's
    (as :func:`_sparse_run_job` reads them), so that one inverse writes the run's
    concatenation; None (each tensor read alone) when it cannot."""
    lay = mf.layout
    secs = [mf.tensor_sections[i] for i in run]
    if any(not s for s in secs):
        return None
    data, dtype = np.frombuffer(mf.payload, np.uint8), lay.dtypes[run[0]]
    got = _or_alone(c.transform.read_segments, data, [s[0] for s in secs], [lay.sizes[i] for i in run], dtype)
    if got is None:
        return None
    tpay, counts = got
    vdtype = c.transform.domain_dtype(dtype)
    vctx = Context((sum(counts),), vdtype, name="tensors")
    if c.value.elementwise:
        fr = _values_frame(mf, [s[1:] for s in secs], counts, vdtype)
        vpay = None if fr is None else _or_alone(_read_values, c.value, fr, vdtype)
    else:
        vpay = _or_alone(c.value.read_kept, data, [s[1:] for s in secs], counts, vdtype)
    if vpay is None:
        return None
    return run, Context((int(lay.starts[run[-1] + 1] - lay.starts[run[0]]),), dtype, name="tensors"), (tpay, vctx, vpay)


def _read_values(value, fr, dtype):
    """What the value stage reads of the one-section frame ``fr`` (:func:`_values_frame`)."""
    rd = fr.reader()
    payload = value.read(rd, Context(fr.shape, dtype), fr.n)
    rd.done()
    return payload


def _known_positions(c, mf, only=None, in_runs=None) -> list:
    """Per tensor, its positions when the codec's select stage reads every tensor's (or those
    of ``only``) at once (:meth:`codec.stage.Select.positions_segments`); else None for each
    (each tensor's positions are then read, and refused, by the stage itself).  ``in_runs``
    (decoding into device arrays): the tensors of runs; any other whose first section has
    ``codec.pack.DEVICE_SECTION`` bytes or more is left to its own read, on the device."""
    none = [None] * len(mf)
    if not reads_positions(c, mf):
        return none  # (a zstd payload is decompressed section by section as the stages read it)
    secs, sizes = mf.tensor_sections, mf.layout.sizes
    idx = range(len(mf)) if only is None else sorted(only)
    if in_runs is not None:
        idx = [i for i in idx if i in in_runs or not secs[i] or secs[i][0].raw_len < pack.DEVICE_SECTION]
    if not idx:
        return none
    got = _or_alone(c.select.positions_segments, np.frombuffer(mf.payload, np.uint8), [secs[i] for i in idx], [sizes[i] for i in idx], c.value)
    if got is None:
        return none
    for i, pos in zip(idx, got):
        none[i] = pos
    return none


def _values_frame(mf, sections, counts, dtype):
    """One v1-shaped frame holding a run's values sections as one, when ``sections[t]`` (tensor
    t's) is exactly one section of ``counts[t]`` items, all of the first one's kind and width,
    a whole number of bytes per item: over the payload itself when they lie end to end (an
    elementwise run's codes), else over a copy gathering them (a sparse run's kept values);
    None otherwise (each tensor is then read, and refused, on its own)."""
    first = sections[0][0] if sections and len(sections[0]) == 1 else None
    if first is None or first.bits % 8:
        return None
    for secs, n in zip(sections, counts):
        if len(secs) != 1 or (secs[0].kind, secs[0].bits, secs[0].count) != (first.kind, first.bits, n):
            return None
    total = sum(counts)
    raw = sum(secs[0].raw_len for secs in sections)
    if all(b[0].offset == a[0].offset + a[0].raw_len for a, b in zip(sections, sections[1:])):
        payload, at = mf.payload, first.offset
    else:
        data = np.frombuffer(mf.payload, np.uint8)
        payload, at = memoryview(np.concatenate([data[s[0].offset : s[0].offset + s[0].raw_len] for s in sections])), 0
    info = SectionInfo(first.kind, first.encoding, first.bits, total, raw, raw, at)
    return Frame(payload, VERSION, mf.flags, dtype, (total,), mf.spec, [info], 0)
